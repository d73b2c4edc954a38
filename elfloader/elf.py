"""ELF structures described once as data, for ELFCLASS32 and ELFCLASS64.

Layouts and constants from the System V gABI (``elf.h``), the same facts
IREE's ``runtime/src/iree/hal/local/elf/elf_types.h`` records. Only little
endian images are read.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import NamedTuple

ELF_MAGIC = b"\x7fELF"
ELFCLASS32, ELFCLASS64 = 1, 2
ELFDATA2LSB, ELFDATA2MSB = 1, 2
EV_CURRENT = 1
ET_DYN = 3

PT_LOAD, PT_DYNAMIC = 1, 2
PT_GNU_RELRO = 0x6474E552
PF_X, PF_W, PF_R = 1, 2, 4
SHN_UNDEF = 0
STB_GLOBAL, STB_WEAK = 1, 2

DT = dict(
    NULL=0, NEEDED=1, PLTRELSZ=2, HASH=4, STRTAB=5, SYMTAB=6, RELA=7,
    RELASZ=8, RELAENT=9, STRSZ=10, SYMENT=11, INIT=12, FINI=13, REL=17,
    RELSZ=18, RELENT=19, PLTREL=20, JMPREL=23, INIT_ARRAY=25, FINI_ARRAY=26,
    INIT_ARRAYSZ=27, FINI_ARRAYSZ=28, GNU_HASH=0x6FFFFEF5,
)


class Field(NamedTuple):
    name: str
    fmt: str


def _layout(fields: list[tuple[str, str]]):
    fmt = "<" + "".join(f for _, f in fields)
    return [n for n, _ in fields], struct.Struct(fmt)


# (field name, struct code) for each class; "A" marks an address-sized field.
_EHDR = [("e_ident", "16s"), ("e_type", "H"), ("e_machine", "H"),
         ("e_version", "I"), ("e_entry", "A"), ("e_phoff", "A"),
         ("e_shoff", "A"), ("e_flags", "I"), ("e_ehsize", "H"),
         ("e_phentsize", "H"), ("e_phnum", "H"), ("e_shentsize", "H"),
         ("e_shnum", "H"), ("e_shstrndx", "H")]
_PHDR = {
    32: [("p_type", "I"), ("p_offset", "I"), ("p_vaddr", "I"),
         ("p_paddr", "I"), ("p_filesz", "I"), ("p_memsz", "I"),
         ("p_flags", "I"), ("p_align", "I")],
    64: [("p_type", "I"), ("p_flags", "I"), ("p_offset", "Q"),
         ("p_vaddr", "Q"), ("p_paddr", "Q"), ("p_filesz", "Q"),
         ("p_memsz", "Q"), ("p_align", "Q")],
}
_SYM = {
    32: [("st_name", "I"), ("st_value", "I"), ("st_size", "I"),
         ("st_info", "B"), ("st_other", "B"), ("st_shndx", "H")],
    64: [("st_name", "I"), ("st_info", "B"), ("st_other", "B"),
         ("st_shndx", "H"), ("st_value", "Q"), ("st_size", "Q")],
}
_DYN = [("d_tag", "a"), ("d_val", "A")]      # "a": signed address-sized
_REL = [("r_offset", "A"), ("r_info", "A")]
_RELA = [("r_offset", "A"), ("r_info", "A"), ("r_addend", "a")]
_SHDR_SIZE = {32: 40, 64: 64}


def _sized(fields, bits):
    a, s = ("I", "i") if bits == 32 else ("Q", "q")
    return [(n, f.replace("A", a).replace("a", s)) for n, f in fields]


@dataclass(frozen=True)
class ElfClass:
    """The struct layouts of one ELF class (32 or 64 bits)."""

    bits: int

    def __post_init__(self):
        for key, fields in (("ehdr", _sized(_EHDR, self.bits)),
                            ("phdr", _PHDR[self.bits]),
                            ("sym", _SYM[self.bits]),
                            ("dyn", _sized(_DYN, self.bits)),
                            ("rel", _sized(_REL, self.bits)),
                            ("rela", _sized(_RELA, self.bits))):
            object.__setattr__(self, key, _layout(fields))

    @property
    def shdr_size(self) -> int:
        return _SHDR_SIZE[self.bits]

    @property
    def word(self) -> int:
        return self.bits // 8

    def r_sym(self, info: int) -> int:
        return info >> 8 if self.bits == 32 else info >> 32

    def r_type(self, info: int) -> int:
        return info & 0xFF if self.bits == 32 else info & 0xFFFFFFFF

    def unpack(self, kind: str, data, offset: int = 0) -> dict:
        names, st = getattr(self, kind)
        return dict(zip(names, st.unpack_from(data, offset)))

    def unpack_all(self, kind: str, data, offset: int, count: int) -> list[dict]:
        names, st = getattr(self, kind)
        return [dict(zip(names, v)) for v in
                st.iter_unpack(bytes(data[offset:offset + count * st.size]))]

    def size(self, kind: str) -> int:
        return getattr(self, kind)[1].size


CLASSES = {ELFCLASS32: ElfClass(32), ELFCLASS64: ElfClass(64)}


def elf_hash_nchain(image, offset: int) -> int:
    """Symbol count from a ``DT_HASH`` table (its ``nchain`` word)."""
    return struct.unpack_from("<I", image, offset + 4)[0]


def gnu_hash_symbol_count(image, offset: int, word: int) -> int:
    """Symbol count from a ``DT_GNU_HASH`` table: one past the highest
    symbol index any bucket chain reaches."""
    nbuckets, symoffset, bloom_size, _ = struct.unpack_from("<4I", image, offset)
    buckets_off = offset + 16 + bloom_size * word
    buckets = struct.unpack_from("<%dI" % nbuckets, image, buckets_off)
    chains_off = buckets_off + 4 * nbuckets
    last = max(buckets, default=0)
    if last < symoffset:
        return symoffset
    while True:
        (h,) = struct.unpack_from("<I", image, chains_off + 4 * (last - symoffset))
        last += 1
        if h & 1:
            return last
