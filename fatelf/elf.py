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

from .errors import FatElfInputError, PortableKernelError

ELF_MAGIC = b"\x7fELF"
EI_CLASS, EI_DATA, EI_OSABI, EI_ABIVERSION = 4, 5, 7, 8
EI_NIDENT = 16
E_MACHINE_OFFSET = 18

ELFCLASS32 = 1
ELFCLASS64 = 2
ELFDATA2LSB = 1
ELFDATA2MSB = 2

#: EI_CLASS value -> word size in bits.
ELF_CLASSES = {ELFCLASS32: 32, ELFCLASS64: 64}
#: EI_DATA value -> byte order.
ELF_DATAS = {ELFDATA2LSB: "little", ELFDATA2MSB: "big"}
#: word size in bits -> size of the ELF header.
EHDR_SIZES = {32: 52, 64: 64}


class ElfTarget(NamedTuple):
    """The target an ELF header describes, in the units of ``Record``."""

    machine: int
    osabi: int
    osabi_version: int
    word_size: int  # 32 or 64
    byte_order: str  # 'little' or 'big'


def field_path(*parts: str) -> str:
    """The non-empty ``parts`` joined with dots: ``field_path("record 1",
    "payload", "e_ident[EI_CLASS]")`` is ``record 1.payload.e_ident[EI_CLASS]``."""
    return ".".join(p for p in parts if p)


def describe_start(data: bytes | bytearray | memoryview) -> str:
    """Hex of the first (up to) four bytes, for error messages."""
    head = bytes(data[:4])
    return head.hex(" ") if head else "nothing (empty)"


def elf_target(data: bytes | bytearray | memoryview, name: str = "<memory>",
               error: type[PortableKernelError] = FatElfInputError, *,
               field: str = "") -> ElfTarget:
    """Read the target of the ELF image ``data``.

    Args:
        data: the ELF image (bytes-like).
        name: the file the image comes from; becomes the error's ``name``.
        error: the :class:`~fatelf.errors.PortableKernelError` subclass to
            raise.
        field: where the image sits inside ``name`` (e.g. ``record 1.payload``
            or ``elf[2]``); prefixes the error's ``field``.

    Raises:
        error: (:class:`~fatelf.errors.FatElfInputError` by default) when
            ``data`` lacks the ELF magic (field ``e_ident[EI_MAG]``), is
            shorter than ``e_ident`` or than the ELF header its class needs
            (field ``size``), or has an unknown ``EI_CLASS`` or ``EI_DATA``
            (fields ``e_ident[EI_CLASS]``, ``e_ident[EI_DATA]``).
    """
    if bytes(data[:4]) != ELF_MAGIC:
        raise error(f"not an ELF file (starts with {describe_start(data)}, "
                    f"expected 7f 45 4c 46)", name=name,
                    field=field_path(field, "e_ident[EI_MAG]"), value=bytes(data[:4]))
    if len(data) < EI_NIDENT:
        raise error(f"{len(data):#x} is smaller than the {EI_NIDENT}-byte e_ident",
                    name=name, field=field_path(field, "size"), value=len(data))
    ei_class = data[EI_CLASS]
    ei_data = data[EI_DATA]
    if ei_class not in ELF_CLASSES:
        raise error(f"{ei_class} is neither 1 (ELFCLASS32) nor 2 (ELFCLASS64)",
                    name=name, field=field_path(field, "e_ident[EI_CLASS]"), value=ei_class)
    if ei_data not in ELF_DATAS:
        raise error(f"{ei_data} is neither 1 (ELFDATA2LSB) nor 2 (ELFDATA2MSB)",
                    name=name, field=field_path(field, "e_ident[EI_DATA]"), value=ei_data)
    word_size = ELF_CLASSES[ei_class]
    byte_order = ELF_DATAS[ei_data]
    need = EHDR_SIZES[word_size]
    if len(data) < need:
        raise error(f"{len(data):#x} is smaller than the {need}-byte ELF{word_size} header",
                    name=name, field=field_path(field, "size"), value=len(data))
    machine = int.from_bytes(data[E_MACHINE_OFFSET:E_MACHINE_OFFSET + 2],
                             "little" if byte_order == "little" else "big")
    return ElfTarget(machine, data[EI_OSABI], data[EI_ABIVERSION], word_size, byte_order)
