"""ELF structures described once as data, for ELFCLASS32 and ELFCLASS64.

Layouts and constants from the System V gABI (``elf.h``), the same facts
IREE's ``runtime/src/iree/hal/local/elf/elf_types.h`` records. Fields whose
width follows the class (``Elf_Addr``, ``Elf_Off``, ``Elf_Xword``) are
described as pointer-sized (``ptr``/``sptr`` of :mod:`fatelf.cstruct`) and
laid out with the class's word size; ``Elf_Phdr`` and ``Elf_Sym`` order their
fields differently in the two classes, so each has two descriptions. Only
little-endian images are read. The ``e_ident`` constants come from
:mod:`fatelf.elf`, which reads the same header for FatELF records.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from fatelf.cstruct import CStruct, Layout
from fatelf.elf import (
    EI_CLASS,
    EI_DATA,
    ELF_CLASSES,
    ELF_MAGIC,
    ELFCLASS32,
    ELFCLASS64,
    ELFDATA2LSB,
    ELFDATA2MSB,
)

_GABI = "System V gABI, elf.h"

EV_CURRENT = 1
ET_DYN = 3
PT_LOAD, PT_DYNAMIC = 1, 2
PT_GNU_RELRO = 0x6474E552
PF_X, PF_W, PF_R = 1, 2, 4
SHN_UNDEF = 0
SHT_NOBITS = 8
SHT_SYMTAB, SHT_STRTAB = 2, 3
STB_GLOBAL, STB_WEAK = 1, 2
STT_FUNC = 2

DT = dict(
    NULL=0, NEEDED=1, PLTRELSZ=2, HASH=4, STRTAB=5, SYMTAB=6, RELA=7,
    RELASZ=8, RELAENT=9, STRSZ=10, SYMENT=11, INIT=12, FINI=13, REL=17,
    RELSZ=18, RELENT=19, PLTREL=20, JMPREL=23, INIT_ARRAY=25, FINI_ARRAY=26,
    INIT_ARRAYSZ=27, FINI_ARRAYSZ=28, GNU_HASH=0x6FFFFEF5,
)

EHDR = CStruct("Elf_Ehdr", [
    ("e_ident", ("u8", 16)), ("e_type", "u16"), ("e_machine", "u16"),
    ("e_version", "u32"), ("e_entry", "ptr"), ("e_phoff", "ptr"),
    ("e_shoff", "ptr"), ("e_flags", "u32"), ("e_ehsize", "u16"),
    ("e_phentsize", "u16"), ("e_phnum", "u16"), ("e_shentsize", "u16"),
    ("e_shnum", "u16"), ("e_shstrndx", "u16")], _GABI)
PHDR32 = CStruct("Elf32_Phdr", [
    ("p_type", "u32"), ("p_offset", "u32"), ("p_vaddr", "u32"),
    ("p_paddr", "u32"), ("p_filesz", "u32"), ("p_memsz", "u32"),
    ("p_flags", "u32"), ("p_align", "u32")], _GABI)
PHDR64 = CStruct("Elf64_Phdr", [
    ("p_type", "u32"), ("p_flags", "u32"), ("p_offset", "u64"),
    ("p_vaddr", "u64"), ("p_paddr", "u64"), ("p_filesz", "u64"),
    ("p_memsz", "u64"), ("p_align", "u64")], _GABI)
SHDR = CStruct("Elf_Shdr", [
    ("sh_name", "u32"), ("sh_type", "u32"), ("sh_flags", "ptr"),
    ("sh_addr", "ptr"), ("sh_offset", "ptr"), ("sh_size", "ptr"),
    ("sh_link", "u32"), ("sh_info", "u32"), ("sh_addralign", "ptr"),
    ("sh_entsize", "ptr")], _GABI)
SYM32 = CStruct("Elf32_Sym", [
    ("st_name", "u32"), ("st_value", "u32"), ("st_size", "u32"),
    ("st_info", "u8"), ("st_other", "u8"), ("st_shndx", "u16")], _GABI)
SYM64 = CStruct("Elf64_Sym", [
    ("st_name", "u32"), ("st_info", "u8"), ("st_other", "u8"),
    ("st_shndx", "u16"), ("st_value", "u64"), ("st_size", "u64")], _GABI)
DYN = CStruct("Elf_Dyn", [("d_tag", "sptr"), ("d_val", "ptr")], _GABI)
REL = CStruct("Elf_Rel", [("r_offset", "ptr"), ("r_info", "ptr")], _GABI)
RELA = CStruct("Elf_Rela", [("r_offset", "ptr"), ("r_info", "ptr"),
                            ("r_addend", "sptr")], _GABI)


def flags_str(p_flags: int) -> str:
    """``p_flags`` as ``rwx`` letters with ``-`` for each bit not set."""
    return "".join(c if p_flags & b else "-" for c, b in
                   (("r", PF_R), ("w", PF_W), ("x", PF_X)))


@dataclass(frozen=True)
class ElfClass:
    """The struct layouts of one ELF class (32 or 64 bits).

    Attributes:
        bits: 32 or 64; word: 4 or 8 (bytes of an address).
        ehdr, phdr, shdr, sym, dyn, rel, rela: :class:`fatelf.cstruct.Layout`.
    """

    bits: int

    @property
    def word(self) -> int:
        return self.bits // 8

    def layout(self, kind: str) -> Layout:
        found = _LAYOUTS.get((self.bits, kind))
        if found is None:
            struct_ = {"ehdr": EHDR, "shdr": SHDR, "dyn": DYN, "rel": REL,
                       "rela": RELA, "phdr": PHDR32 if self.bits == 32 else PHDR64,
                       "sym": SYM32 if self.bits == 32 else SYM64}[kind]
            found = _LAYOUTS[self.bits, kind] = struct_.layout(self.word)
        return found

    def size(self, kind: str) -> int:
        return self.layout(kind).size

    def r_sym(self, info: int) -> int:
        return info >> 8 if self.bits == 32 else info >> 32

    def r_type(self, info: int) -> int:
        return info & 0xFF if self.bits == 32 else info & 0xFFFFFFFF


#: (bits, kind) -> layout, filled as :meth:`ElfClass.layout` is asked
_LAYOUTS: dict[tuple[int, str], Layout] = {}
CLASSES = {ELFCLASS32: ElfClass(32), ELFCLASS64: ElfClass(64)}


def elf_hash_nchain(read, vaddr: int) -> int:
    """Symbol count from a ``DT_HASH`` table (its ``nchain`` word);
    ``read(vaddr, size)`` returns image bytes."""
    return struct.unpack("<I", read(vaddr + 4, 4))[0]


def gnu_hash_symbol_count(read, vaddr: int, word: int) -> int:
    """Symbol count from a ``DT_GNU_HASH`` table: one past the highest
    symbol index any bucket chain reaches; ``read(vaddr, size)`` returns
    image bytes (and raises for ranges outside the image)."""
    nbuckets, symoffset, bloom_size, _ = struct.unpack("<4I", read(vaddr, 16))
    buckets_at = vaddr + 16 + bloom_size * word
    buckets = struct.unpack("<%dI" % nbuckets, read(buckets_at, 4 * nbuckets))
    chains_at = buckets_at + 4 * nbuckets
    last = max(buckets, default=0)
    if last < symoffset:
        return symoffset
    while True:
        (h,) = struct.unpack("<I", read(chains_at + 4 * (last - symoffset), 4))
        last += 1
        if h & 1:
            return last


__all__ = ["ELF_MAGIC", "EI_CLASS", "EI_DATA", "ELF_CLASSES", "ELFCLASS32",
           "ELFCLASS64", "ELFDATA2LSB", "ELFDATA2MSB", "EV_CURRENT", "ET_DYN",
           "PT_LOAD", "PT_DYNAMIC", "PT_GNU_RELRO", "PF_X", "PF_W", "PF_R",
           "SHN_UNDEF", "STB_GLOBAL", "STB_WEAK", "DT", "CLASSES", "ElfClass"]


def file_extent(data) -> int:
    """How many leading bytes of ``data`` (bytes-like) an ELF's own headers
    say it uses: the ELF header, the program and section header tables and
    every segment's and (non-NOBITS) section's file bytes, clamped to
    ``len(data)``. A table that does not fit in ``data`` is not followed
    (the loader reports it). For data that is not a little-endian ELF:
    the first 64 bytes (enough for the loader to say what is wrong)."""
    n = len(data)
    if (n < 16 or bytes(data[:4]) != b"\x7fELF" or data[4] not in CLASSES
            or data[5] != 1):
        return min(n, 64)
    cls = CLASSES[data[4]]
    end = cls.size("ehdr")
    if n < end:
        return n
    eh = cls.layout("ehdr").unpack(data)
    for table, count, kind in (("e_phoff", "e_phnum", "phdr"),
                               ("e_shoff", "e_shnum", "shdr")):
        at, number = eh[table], eh[count]
        size = cls.size(kind)
        if not number or at + number * size > n:
            continue
        end = max(end, at + number * size)
        for entry in cls.layout(kind).unpack_array(data, at, number):
            if kind == "phdr":
                end = max(end, entry["p_offset"] + entry["p_filesz"])
            elif entry["sh_type"] != SHT_NOBITS:
                end = max(end, entry["sh_offset"] + entry["sh_size"])
    return min(end, n)
