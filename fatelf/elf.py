"""Reading the few ELF header fields a FatELF record mirrors.

ELF header layout (System V gABI, "ELF header"): ``e_ident[16]`` holds the
magic ``7F 'E' 'L' 'F'`` at 0..3, ``EI_CLASS`` at 4 (1 = ELFCLASS32,
2 = ELFCLASS64), ``EI_DATA`` at 5 (1 = ELFDATA2LSB, 2 = ELFDATA2MSB),
``EI_OSABI`` at 7 and ``EI_ABIVERSION`` at 8.  ``e_type`` (u16) follows at
16 and ``e_machine`` (u16) at 18, both in the byte order ``EI_DATA`` names.
The whole header is 52 bytes for ELFCLASS32 and 64 bytes for ELFCLASS64.
"""

from __future__ import annotations

from typing import NamedTuple

ELF_MAGIC = b"\x7fELF"
EI_CLASS, EI_DATA, EI_OSABI, EI_ABIVERSION = 4, 5, 7, 8
E_MACHINE_OFFSET = 18

#: EI_CLASS value -> word size in bits.
ELF_CLASSES = {1: 32, 2: 64}
#: EI_DATA value -> byte order.
ELF_DATAS = {1: "little", 2: "big"}
#: word size in bits -> size of the ELF header.
EHDR_SIZES = {32: 52, 64: 64}


class ElfTarget(NamedTuple):
    """The target an ELF header describes, in the units of ``Record``."""

    machine: int
    osabi: int
    osabi_version: int
    word_size: int  # 32 or 64
    byte_order: str  # 'little' or 'big'


def describe_start(data: bytes) -> str:
    """Hex of the first (up to) four bytes, for error messages."""
    head = bytes(data[:4])
    return head.hex(" ") if head else "nothing (empty)"


def elf_target(data: bytes, where: str, error: type[Exception]) -> ElfTarget:
    """Read the target of the ELF image ``data``.

    ``where`` prefixes every message (e.g. ``"a.so"`` or
    ``"b.sos: record 1: payload"``); failures raise ``error``.
    """
    if len(data) < 16 or bytes(data[:4]) != ELF_MAGIC:
        raise error(f"{where}: not an ELF file (starts with {describe_start(data)}, "
                    f"expected 7f 45 4c 46)")
    ei_class = data[EI_CLASS]
    ei_data = data[EI_DATA]
    if ei_class not in ELF_CLASSES:
        raise error(f"{where}: EI_CLASS {ei_class} is neither 1 (ELFCLASS32) "
                    f"nor 2 (ELFCLASS64)")
    if ei_data not in ELF_DATAS:
        raise error(f"{where}: EI_DATA {ei_data} is neither 1 (ELFDATA2LSB) "
                    f"nor 2 (ELFDATA2MSB)")
    word_size = ELF_CLASSES[ei_class]
    byte_order = ELF_DATAS[ei_data]
    need = EHDR_SIZES[word_size]
    if len(data) < need:
        raise error(f"{where}: size {len(data):#x} is smaller than the {need}-byte "
                    f"ELF{word_size} header")
    machine = int.from_bytes(data[E_MACHINE_OFFSET:E_MACHINE_OFFSET + 2], byte_order)
    return ElfTarget(machine, data[EI_OSABI], data[EI_ABIVERSION], word_size, byte_order)
