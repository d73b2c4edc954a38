"""Loading one ELF shared object into a backend.

The steps and checks follow IREE's platform-agnostic loader
(``runtime/src/iree/hal/local/elf/elf_module.c``): verify the headers, map
the PT_LOAD segments (zero-filled past ``p_filesz``), parse PT_DYNAMIC,
reject undefined symbols, apply relocations from the architecture's table,
set each page's final protection, run initializers, and look exports up in
the dynamic symbol table. The image is assembled and relocated in host
memory and copied into the backend once, so both backends share every step.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from . import arch as arch_registry
from .arch import Arch
from .backend import PROT_EXEC, PROT_NONE, PROT_READ, PROT_WRITE, Backend
from .elf import (CLASSES, DT, ELF_MAGIC, ELFDATA2LSB, ELFDATA2MSB, ET_DYN,
                  EV_CURRENT, PF_R, PF_W, PF_X, PT_DYNAMIC, PT_GNU_RELRO,
                  PT_LOAD, SHN_UNDEF, STB_GLOBAL, STB_WEAK,
                  elf_hash_nchain, gnu_hash_symbol_count)
from .errors import (ElfFormatError, RelocationError,
                     SymbolNotFoundError, UndefinedSymbolError,
                     UnsupportedElfError)

#: Largest virtual address range an image may span, in bytes.
MAX_IMAGE_SIZE = 1 << 30
_PAGE = 4096


@dataclass(frozen=True)
class Segment:
    """A PT_LOAD program header (addresses are the file's, unbiased)."""
    vaddr: int
    memsz: int
    offset: int
    filesz: int
    flags: int
    align: int


class ElfImage:
    """A verified, not yet loaded, ELF shared object.

    Args:
        data: the ELF bytes (not a FatELF: select a record first).
        name: file name used in error messages.

    Attributes:
        arch: the :class:`~elfloader.arch.Arch` the image is built for.
        cls: struct layouts for its class.
        segments: PT_LOAD segments.
        vaddr_min, vaddr_max: page-aligned virtual address range.
        align: alignment the load address needs (largest ``p_align``, at
            least 4 KiB) so page-relative code (aarch64 ADRP) stays valid.

    Raises:
        ElfFormatError: malformed header, tables or ranges.
        UnsupportedElfError: wrong class, byte order, type or machine.
    """

    def __init__(self, data: bytes, name: str = "<memory>"):
        self.data = memoryview(data).cast("B") if not isinstance(data, bytes) else data
        self.name = name
        self._verify_ehdr()
        self._verify_phdrs()

    def _err(self, cls, message, field, value=None):
        return cls(message, name=self.name, field=field, value=value)

    def _verify_ehdr(self) -> None:
        data = self.data
        if len(data) < 16:
            raise self._err(ElfFormatError, f"file is {len(data)} bytes, too "
                            "short for an ELF identification", "e_ident", len(data))
        if bytes(data[:4]) != ELF_MAGIC:
            raise self._err(ElfFormatError, f"magic {bytes(data[:4])!r} is not "
                            "\\x7fELF", "e_ident[EI_MAG]", bytes(data[:4]))
        ei_class, ei_data = data[4], data[5]
        if ei_class not in CLASSES:
            raise self._err(UnsupportedElfError, f"class {ei_class} is neither "
                            "ELFCLASS32 (1) nor ELFCLASS64 (2)",
                            "e_ident[EI_CLASS]", ei_class)
        if ei_data != ELFDATA2LSB:
            what = "big-endian" if ei_data == ELFDATA2MSB else f"unknown ({ei_data})"
            raise self._err(UnsupportedElfError, f"byte order is {what}; only "
                            "little-endian ELFs are supported",
                            "e_ident[EI_DATA]", ei_data)
        cls = self.cls = CLASSES[ei_class]
        if len(data) < cls.size("ehdr"):
            raise self._err(ElfFormatError, f"file is {len(data)} bytes, "
                            f"smaller than the {cls.size('ehdr')}-byte ELF header",
                            "e_ehsize", len(data))
        eh = self.ehdr = cls.unpack("ehdr", data)
        if eh["e_version"] != EV_CURRENT:
            raise self._err(UnsupportedElfError, f"version {eh['e_version']} "
                            "unsupported; expected 1", "e_version", eh["e_version"])
        if eh["e_type"] != ET_DYN:
            raise self._err(UnsupportedElfError, f"type {eh['e_type']} is not "
                            "ET_DYN (3); only shared objects can be loaded",
                            "e_type", eh["e_type"])
        arch = arch_registry.by_elf(eh["e_machine"], cls.bits)
        if arch is None:
            raise self._err(UnsupportedElfError, f"{eh['e_machine']:#06x} "
                            f"({cls.bits}-bit) is not a supported architecture; "
                            f"supported: {', '.join(arch_registry.names())}",
                            "e_machine", eh["e_machine"])
        self.arch: Arch = arch
        for field, want in (("e_ehsize", cls.size("ehdr")),
                            ("e_phentsize", cls.size("phdr")),
                            ("e_shentsize", cls.shdr_size)):
            if eh[field] != want:
                raise self._err(ElfFormatError, f"{eh[field]} does not match "
                                f"the {cls.bits}-bit entry size {want}", field,
                                eh[field])
        for table, off, num, ent in (("program header table", "e_phoff",
                                      "e_phnum", "e_phentsize"),
                                     ("section header table", "e_shoff",
                                      "e_shnum", "e_shentsize")):
            start, count = eh[off], eh[num]
            if start == 0 or count == 0 or start + count * eh[ent] > len(data):
                raise self._err(ElfFormatError, f"{table} at {start:#x} with "
                                f"{count} entries is missing or outside the "
                                f"{len(data)}-byte file", off, start)

    def _verify_phdrs(self) -> None:
        cls, eh, size = self.cls, self.ehdr, len(self.data)
        self.phdrs = cls.unpack_all("phdr", self.data, eh["e_phoff"], eh["e_phnum"])
        segs = []
        for i, ph in enumerate(self.phdrs):
            if ph["p_type"] != PT_LOAD:
                continue
            field = f"phdr[{i}]"
            if ph["p_offset"] + ph["p_filesz"] > size:
                raise self._err(ElfFormatError, f"segment file range "
                                f"{ph['p_offset']:#x}-{ph['p_offset'] + ph['p_filesz']:#x} "
                                f"lies outside the {size:#x}-byte file",
                                field + ".p_offset", ph["p_offset"])
            if ph["p_filesz"] > ph["p_memsz"]:
                raise self._err(ElfFormatError, f"p_filesz {ph['p_filesz']:#x} "
                                f"exceeds p_memsz {ph['p_memsz']:#x}",
                                field + ".p_filesz", ph["p_filesz"])
            align = ph["p_align"]
            if align > 1 and (align & (align - 1)):
                raise self._err(ElfFormatError, f"alignment {align:#x} is not "
                                "a power of two", field + ".p_align", align)
            if ph["p_memsz"] > MAX_IMAGE_SIZE or ph["p_vaddr"] > MAX_IMAGE_SIZE:
                raise self._err(ElfFormatError, f"segment at {ph['p_vaddr']:#x} "
                                f"of {ph['p_memsz']:#x} bytes exceeds the "
                                f"{MAX_IMAGE_SIZE:#x}-byte image limit",
                                field + ".p_memsz", ph["p_memsz"])
            segs.append(Segment(ph["p_vaddr"], ph["p_memsz"], ph["p_offset"],
                                ph["p_filesz"], ph["p_flags"], align))
        if not segs:
            raise self._err(ElfFormatError, "no PT_LOAD segment", "e_phnum",
                            eh["e_phnum"])
        ordered = sorted(segs, key=lambda s: s.vaddr)
        for a, b in zip(ordered, ordered[1:]):
            if a.vaddr + a.memsz > b.vaddr:
                raise self._err(ElfFormatError, f"PT_LOAD segments "
                                f"{a.vaddr:#x}+{a.memsz:#x} and {b.vaddr:#x} "
                                "overlap", "p_vaddr", b.vaddr)
        self.segments = segs
        lo = min(s.vaddr & ~(max(s.align, 1) - 1) for s in segs)
        hi = max(s.vaddr + s.memsz for s in segs)
        self.align = max([_PAGE] + [s.align for s in segs])
        self.vaddr_min = lo & ~(_PAGE - 1)
        self.vaddr_max = -(-hi // _PAGE) * _PAGE
        if self.vaddr_max - self.vaddr_min > MAX_IMAGE_SIZE:
            raise self._err(ElfFormatError, f"segments span "
                            f"{self.vaddr_max - self.vaddr_min:#x} bytes, more "
                            f"than the {MAX_IMAGE_SIZE:#x}-byte limit",
                            "p_vaddr", self.vaddr_max)


class ElfModule:
    """An ELF shared object loaded into a backend.

    Args:
        image: a verified :class:`ElfImage`.
        backend: where to load it; its architecture must match the image's.

    Attributes:
        base: address the image's virtual address 0 maps to (load bias).
        exports: exported (GLOBAL/WEAK, defined) symbol name -> address.
        unreferenced_undefined: undefined symbols no relocation uses.

    Raises:
        ElfError subclasses for every malformed or unsupported input; on any
        failure nothing stays mapped in the backend.
    """

    def __init__(self, image: ElfImage, backend: Backend):
        if backend.arch is not image.arch:
            from .errors import ArchitectureMismatchError
            raise ArchitectureMismatchError(
                f"image is {image.arch.name} but the {backend.kind} backend "
                f"runs {backend.arch.name}", name=image.name, field="e_machine",
                value=image.arch.name)
        self.image = image
        self.name = image.name
        self.arch = image.arch
        self.backend = backend
        self._fini: list[int] = []
        size = -(-(image.vaddr_max - image.vaddr_min) // backend.page_size) \
            * backend.page_size
        self._reservation = backend.reserve(size, image.align)
        self.size = size
        self.base = self._reservation - image.vaddr_min
        try:
            self._load()
        except BaseException:
            backend.release(self._reservation)
            self._reservation = None
            raise

    # --- helpers ----------------------------------------------------------
    def _err(self, cls, message, field, value=None):
        return cls(message, name=self.name, field=field, value=value)

    def _offset(self, vaddr: int, size: int, field: str) -> int:
        """Offset in the image buffer of ``size`` bytes at file vaddr."""
        img = self.image
        if vaddr < img.vaddr_min or vaddr + size > img.vaddr_max or size < 0:
            raise self._err(ElfFormatError, f"range {vaddr:#x}+{size:#x} lies "
                            f"outside the image {img.vaddr_min:#x}-"
                            f"{img.vaddr_max:#x}", field, vaddr)
        return vaddr - img.vaddr_min

    def _string(self, index: int, field: str) -> str:
        if index >= self._strsz:
            raise self._err(ElfFormatError, f"string offset {index:#x} beyond "
                            f"DT_STRSZ {self._strsz:#x}", field, index)
        start = self._strtab + index
        end = self._buf.find(b"\0", start, self._strtab + self._strsz)
        if end < 0:
            raise self._err(ElfFormatError, "unterminated string", field, index)
        return self._buf[start:end].decode("utf-8", "replace")

    # --- steps ------------------------------------------------------------
    def _load(self) -> None:
        img = self.image
        buf = self._buf = bytearray(self.size)
        for seg in img.segments:
            if seg.filesz:
                off = seg.vaddr - img.vaddr_min
                buf[off:off + seg.filesz] = img.data[seg.offset:seg.offset + seg.filesz]
        dyn = self._parse_dynamic()
        tables = self._reloc_tables(dyn)
        self._check_imports(tables)
        self._relocate(tables)
        self.backend.write(self._reservation, buf)
        self._protect()
        self.exports = self._collect_exports()
        init = self._initializers(dyn)
        self._fini = self._finalizers(dyn)
        del self._buf
        for address in init:
            self.backend.call(address)

    def _parse_dynamic(self) -> dict[int, list[int]]:
        img, cls = self.image, self.image.cls
        ph = next((p for p in img.phdrs if p["p_type"] == PT_DYNAMIC), None)
        if ph is None or ph["p_filesz"] < cls.size("dyn"):
            raise self._err(ElfFormatError, "no PT_DYNAMIC segment", "PT_DYNAMIC")
        off = self._offset(ph["p_vaddr"], ph["p_filesz"], "PT_DYNAMIC")
        dyn: dict[int, list[int]] = {}
        for entry in cls.unpack_all("dyn", self._buf, off,
                                    ph["p_filesz"] // cls.size("dyn")):
            if entry["d_tag"] == DT["NULL"]:
                break
            dyn.setdefault(entry["d_tag"], []).append(entry["d_val"])
        self._dyn = dyn
        get = lambda tag: dyn.get(DT[tag], [None])[0]  # noqa: E731
        if DT["NEEDED"] in dyn:
            raise self._err(UnsupportedElfError, "the image depends on other "
                            "libraries (DT_NEEDED); embedded ELFs must be "
                            "self-contained", "DT_NEEDED", dyn[DT["NEEDED"]])
        for tag, kind in (("SYMENT", "sym"), ("RELENT", "rel"), ("RELAENT", "rela")):
            val = get(tag)
            if val is not None and val != cls.size(kind):
                raise self._err(ElfFormatError, f"{val} does not match the "
                                f"{cls.bits}-bit entry size {cls.size(kind)}",
                                "DT_" + tag, val)
        strtab, strsz, symtab = get("STRTAB"), get("STRSZ"), get("SYMTAB")
        if not strtab or not strsz or not symtab:
            raise self._err(ElfFormatError, "missing DT_STRTAB, DT_STRSZ or "
                            "DT_SYMTAB", "PT_DYNAMIC")
        self._strtab = self._offset(strtab, strsz, "DT_STRTAB")
        self._strsz = strsz
        if get("HASH"):
            count = elf_hash_nchain(self._buf, self._offset(get("HASH"), 8, "DT_HASH"))
        elif get("GNU_HASH"):
            try:
                count = gnu_hash_symbol_count(
                    self._buf, self._offset(get("GNU_HASH"), 16, "DT_GNU_HASH"),
                    cls.word)
            except struct.error:
                raise self._err(ElfFormatError, "table runs past the image",
                                "DT_GNU_HASH", get("GNU_HASH")) from None
        else:
            raise self._err(ElfFormatError, "neither DT_HASH nor DT_GNU_HASH: "
                            "cannot size the dynamic symbol table", "PT_DYNAMIC")
        symsize = cls.size("sym")
        if count * symsize > self.size:
            raise self._err(ElfFormatError, f"{count} symbols do not fit in the "
                            "image", "DT_HASH", count)
        symoff = self._offset(symtab, count * symsize, "DT_SYMTAB")
        self._syms = cls.unpack_all("sym", self._buf, symoff, count)
        return dyn

    def _check_imports(self, tables) -> None:
        """Reject undefined symbols that a relocation binds to: embedded ELFs
        must be self-contained. An undefined symbol nothing refers to (armv7
        objects name the EHABI personality ``__aeabi_unwind_cpp_pr0`` that
        way) binds to nothing; it is kept in :attr:`unreferenced_undefined`."""
        cls, kind = self.image.cls, self.arch.rel_tags
        referenced = set()
        for _, off, count in tables:
            for r in cls.unpack_all(kind, self._buf, off, count):
                referenced.add(cls.r_sym(r["r_info"]))
        undefined = {i: self._string(s["st_name"], f"dynsym[{i}].st_name")
                     for i, s in enumerate(self._syms)
                     if i and s["st_shndx"] == SHN_UNDEF and s["st_name"]}
        imported = [n for i, n in undefined.items() if i in referenced]
        if imported:
            raise self._err(UndefinedSymbolError, "the image imports undefined "
                            f"symbols {', '.join(imported)}; embedded ELFs must "
                            "be self-contained", "dynsym", imported)
        self.unreferenced_undefined = sorted(undefined.values())

    def _reloc_tables(self, dyn) -> list[tuple[str, int, int]]:
        """(kind, image offset, count) of each relocation table to apply."""
        arch, cls = self.arch, self.image.cls
        want = arch.rel_tags.upper()
        other = "REL" if want == "RELA" else "RELA"
        if dyn.get(DT[other]):
            raise self._err(UnsupportedElfError, f"{arch.name} uses DT_{want} "
                            f"relocations, found DT_{other}", "DT_" + other,
                            dyn[DT[other]][0])
        tables = []
        get = lambda tag: dyn.get(DT[tag], [None])[0]  # noqa: E731
        entsize = cls.size(arch.rel_tags)
        if get(want):
            tables.append((want, get(want), get(want + "SZ") or 0))
        if get("JMPREL"):
            pltrel = get("PLTREL")
            if pltrel != DT[want]:
                raise self._err(UnsupportedElfError, f"{pltrel} is not DT_{want} "
                                f"({DT[want]})", "DT_PLTREL", pltrel)
            tables.append(("JMPREL", get("JMPREL"), get("PLTRELSZ") or 0))
        out = []
        for tag, vaddr, nbytes in tables:
            if nbytes % entsize:
                raise self._err(ElfFormatError, f"{nbytes} is not a multiple of "
                                f"the {entsize}-byte entry", f"DT_{tag}SZ", nbytes)
            out.append((tag, self._offset(vaddr, nbytes, "DT_" + tag),
                        nbytes // entsize))
        return out

    def _relocate(self, tables) -> None:
        arch, cls, buf = self.arch, self.image.cls, self._buf
        vmin, B = self.image.vaddr_min, self.base
        kind = arch.rel_tags
        mask = arch.word_mask
        for tag, off, count in tables:
            for i, r in enumerate(cls.unpack_all(kind, buf, off, count)):
                rtype = cls.r_type(r["r_info"])
                if rtype == 0:
                    continue
                where = f"DT_{tag}[{i}]"
                rel = arch.relocations.get(rtype)
                if rel is None:
                    raise self._err(RelocationError, f"unknown {arch.name} "
                                    f"relocation type {rtype}", where + ".r_info",
                                    rtype)
                sym = cls.r_sym(r["r_info"])
                S = 0
                if sym:
                    if sym >= len(self._syms):
                        raise self._err(RelocationError, f"{rel.name} names "
                                        f"symbol {sym} of {len(self._syms)}",
                                        where + ".r_info", sym)
                    S = (B + self._syms[sym]["st_value"]) & mask
                place = r["r_offset"] - vmin
                if r["r_offset"] < vmin or place + rel.size > len(buf):
                    raise self._err(RelocationError, f"{rel.name} at "
                                    f"{r['r_offset']:#x} lies outside the image "
                                    f"{vmin:#x}-{self.image.vaddr_max:#x}",
                                    where + ".r_offset", r["r_offset"])
                fmt = "<Q" if rel.size == 8 else "<I"
                if kind == "rela":
                    A = r["r_addend"]
                else:
                    A = struct.unpack_from(fmt, buf, place)[0]
                value = rel.formula(S, A, B + r["r_offset"], B)
                self._store(buf, place, rel, value, where)

    def _store(self, buf, place, rel, value, where) -> None:
        bits = 8 * rel.size
        if rel.check == "signed":
            v = value if value < (1 << 63) else value - (1 << 64)
            if not -(1 << (bits - 1)) <= v < (1 << (bits - 1)):
                raise self._err(RelocationError, f"{rel.name} value {value:#x} "
                                f"does not fit a signed {bits}-bit place",
                                where, value)
        elif rel.check == "unsigned" and not 0 <= value < (1 << bits):
            raise self._err(RelocationError, f"{rel.name} value {value:#x} "
                            f"does not fit an unsigned {bits}-bit place",
                            where, value)
        struct.pack_into("<Q" if bits == 64 else "<I", buf, place,
                         value & ((1 << bits) - 1))

    def _protect(self) -> None:
        """Final protection of every page: the union of the segments on it,
        read-only under PT_GNU_RELRO, nothing where no segment lies."""
        img, page = self.image, self.backend.page_size
        npages = self.size // page
        prot = [PROT_NONE] * npages
        vmin = img.vaddr_min

        def pages(vaddr, memsz):
            first = (vaddr - vmin) // page
            last = -(-(vaddr + memsz - vmin) // page)
            return range(first, min(last, npages))

        for seg in img.segments:
            p = PROT_NONE
            if seg.flags & PF_R:
                p |= PROT_READ
            if seg.flags & PF_W:
                p |= PROT_WRITE | PROT_READ
            if seg.flags & PF_X:
                p |= PROT_EXEC | PROT_READ
            for n in pages(seg.vaddr, seg.memsz):
                prot[n] |= p
                if prot[n] & PROT_WRITE and prot[n] & PROT_EXEC:
                    raise self._err(UnsupportedElfError, "a page would be both "
                                    "writable and executable (segment at "
                                    f"{seg.vaddr:#x})", "p_flags", seg.flags)
        for ph in img.phdrs:
            if ph["p_type"] == PT_GNU_RELRO:
                for n in pages(ph["p_vaddr"], ph["p_memsz"]):
                    prot[n] &= ~PROT_WRITE
        start = 0
        for n in range(1, npages + 1):
            if n == npages or prot[n] != prot[start]:
                self.backend.protect(self._reservation + start * page,
                                     (n - start) * page, prot[start])
                start = n

    def _collect_exports(self) -> dict[str, int]:
        exports = {}
        for i, s in enumerate(self._syms):
            bind = s["st_info"] >> 4
            if i == 0 or s["st_shndx"] == SHN_UNDEF or not s["st_name"]:
                continue
            if bind in (STB_GLOBAL, STB_WEAK):
                name = self._string(s["st_name"], f"dynsym[{i}].st_name")
                exports.setdefault(name, (self.base + s["st_value"]) & self.arch.word_mask)
        return exports

    def _pointer_array(self, dyn, tag: str) -> list[int]:
        cls = self.image.cls
        addr, size = dyn.get(DT[tag], [None])[0], dyn.get(DT[tag + "SZ"], [0])[0]
        if not addr or not size:
            return []
        off = self._offset(addr, size, "DT_" + tag)
        fmt = "<%d%s" % (size // cls.word, "Q" if cls.word == 8 else "I")
        return [p for p in struct.unpack_from(fmt, self._buf, off)
                if p not in (0, self.arch.word_mask)]

    def _initializers(self, dyn) -> list[int]:
        out = []
        if dyn.get(DT["INIT"]):
            out.append(self.base + dyn[DT["INIT"]][0])
        return out + self._pointer_array(dyn, "INIT_ARRAY")

    def _finalizers(self, dyn) -> list[int]:
        out = list(reversed(self._pointer_array(dyn, "FINI_ARRAY")))
        if dyn.get(DT["FINI"]):
            out.append(self.base + dyn[DT["FINI"]][0])
        return out

    # --- public -----------------------------------------------------------
    def lookup(self, symbol: str) -> int:
        """Address of exported ``symbol``.

        Raises:
            SymbolNotFoundError: not exported by this image.
        """
        try:
            return self.exports[symbol]
        except KeyError:
            raise self._err(SymbolNotFoundError, f"exported symbol {symbol!r} "
                            "not found", "dynsym", symbol) from None

    def close(self) -> None:
        """Run finalizers (DT_FINI_ARRAY in reverse, then DT_FINI) and unmap."""
        if self._reservation is None:
            return
        try:
            for address in self._fini:
                self.backend.call(address)
        finally:
            self.backend.release(self._reservation)
            self._reservation = None

    @property
    def loaded(self) -> bool:
        return self._reservation is not None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        return (f"<ElfModule {self.name} {self.arch.name} at {self.base:#x} "
                f"({self.backend.kind})>")
