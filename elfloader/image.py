"""A verified ELF image: every header, table and address checked, nothing
mapped and nothing run.

:class:`ElfImage` reads the bytes of one ELF shared object and verifies, in
the order of IREE's ``runtime/src/iree/hal/local/elf/elf_module.c``, the ELF
header, the program headers and PT_LOAD segments, then parses PT_DYNAMIC:
the dynamic symbol table (sized from ``DT_HASH`` or ``DT_GNU_HASH``), the
string table, the relocation tables the architecture uses, the initializer
and finalizer lists. Every address it hands out (exports, initializers,
finalizers, relocation places) has been shown to lie in a segment with the
permission it will be used with. Looking at a file therefore never maps it
or runs its code; :class:`elfloader.ElfModule` loads a verified image.

An entry of ``DT_INIT_ARRAY`` or ``DT_FINI_ARRAY`` is the word the array
holds *after relocation*: on RELA architectures the file holds 0 there and
the address is the addend of an ``R_*_RELATIVE`` relocation. The image
applies the relocations that touch the array, with the architecture's
formulas, at two load biases: an entry that follows the bias is the
function at that image address, verified like every other address before
anything is mapped; the loader calls exactly that address.
"""

from __future__ import annotations

from dataclasses import dataclass

from fatelf.cstruct import pack_array, unpack_array

from . import arch as arch_registry
from .arch import Arch
from .elf import (
    CLASSES,
    DT,
    ELF_MAGIC,
    ELFDATA2LSB,
    ELFDATA2MSB,
    ET_DYN,
    EV_CURRENT,
    PF_R,
    PF_X,
    PT_DYNAMIC,
    PT_GNU_RELRO,
    PT_LOAD,
    SHN_UNDEF,
    STB_GLOBAL,
    STB_WEAK,
    elf_hash_nchain,
    flags_str,
    gnu_hash_symbol_count,
)
from .errors import ElfFormatError, RelocationError, UndefinedSymbolError, UnsupportedElfError

#: Largest virtual address range an image may span, in bytes.
MAX_IMAGE_SIZE = 1 << 30
#: Most relocations, symbols and pointer-array entries an image may have.
MAX_TABLE_ENTRIES = 1 << 22
PAGE = 4096


@dataclass(frozen=True)
class Segment:
    """A PT_LOAD program header (addresses are the file's, unbiased).

    Attributes:
        index: program header index; vaddr, memsz, offset, filesz: bytes;
        flags: ``PF_R | PF_W | PF_X`` bits; align: ``p_align``.
    """
    index: int
    vaddr: int
    memsz: int
    offset: int
    filesz: int
    flags: int
    align: int

    @property
    def end(self) -> int:
        return self.vaddr + self.memsz


@dataclass(frozen=True)
class RelocationEntry:
    """One relocation of the image, decoded.

    Attributes:
        where: table and index for messages, e.g. ``DT_RELA[3]``.
        offset: place (unbiased vaddr); type: relocation type number;
        symbol: symbol index (0: none); addend: explicit addend (RELA) or
            None (REL: read at the place).
    """
    where: str
    offset: int
    type: int
    symbol: int
    addend: int | None


@dataclass(frozen=True)
class InitFunction:
    """An initializer or finalizer the loader calls.

    Attributes:
        where: the dynamic entry it comes from: ``DT_INIT``,
            ``DT_INIT_ARRAY[i]``, ``DT_FINI_ARRAY[i]`` or ``DT_FINI``
            (``i`` the slot's index in the array).
        vaddr: the function (unbiased vaddr, in an executable segment):
            the entry's value after relocation, less the load bias.
        slot: unbiased vaddr of the array slot holding the entry, or None
            for ``DT_INIT`` and ``DT_FINI``.
    """
    where: str
    vaddr: int
    slot: int | None = None


class ElfImage:
    """A verified, not yet loaded, ELF shared object.

    Args:
        data: the ELF bytes (not a FatELF: select a record first).
        name: file name used in error messages.

    Attributes:
        arch: the :class:`~elfloader.arch.Arch` the image is built for.
        cls: struct layouts for its class.
        ehdr: the ELF header fields; phdrs: every program header.
        segments: PT_LOAD segments.
        vaddr_min, vaddr_max: page-aligned virtual address range.
        align: alignment the load address needs (largest ``p_align``, at
            least 4 KiB) so page-relative code (aarch64 ADRP) stays valid.
        dynamic: ``d_tag -> [d_val, ...]`` of PT_DYNAMIC.
        symbols: dynamic symbols (dicts of ``Elf_Sym`` fields plus ``name``).
        exports: defined GLOBAL/WEAK symbol name -> unbiased vaddr.
        unreferenced_undefined: undefined symbol names no relocation uses.
        relocations: every :class:`RelocationEntry` to apply, in order.
        initializers, finalizers: the :class:`InitFunction` objects to
            call, in call order (``DT_INIT`` then ``DT_INIT_ARRAY``;
            ``DT_FINI_ARRAY`` reversed then ``DT_FINI``), each in an
            executable segment; array entries that are 0 or all ones after
            relocation are terminators, skipped.
        relro: (vaddr, memsz) ranges made read-only after relocation.

    Raises:
        ElfFormatError: malformed header, tables or ranges.
        UnsupportedElfError: wrong class, byte order, type or machine, or
            dependencies on other libraries (``DT_NEEDED``).
        UndefinedSymbolError: a relocation binds an undefined symbol, of
            any relocation type (also one the loader does not apply, such
            as a static ``R_ARM_CALL``); the message and ``value`` name it.
        RelocationError: a relocation of an unknown type, naming a symbol
            that does not exist, or placed outside writable image memory.
        ElfFormatError: also an initializer or finalizer, after relocation,
            outside every executable segment or not an address of the image
            (``field`` ``DT_INIT``, ``DT_INIT_ARRAY[i]``...; ``value`` the
            address).
    """

    def __init__(self, data: bytes, name: str = "<memory>"):
        self.data = bytes(data)
        self.name = name
        self._verify_ehdr()
        self._verify_phdrs()
        self._parse_dynamic()
        self._parse_relocations()
        self._check_imports()
        self._parse_init_fini()

    def _err(self, cls, message, field, value=None):
        return cls(message, name=self.name, field=field, value=value)

    # --- memory of the image, by unbiased vaddr ------------------------------
    def segment_at(self, vaddr: int, size: int = 1) -> Segment | None:
        """The PT_LOAD segment holding ``[vaddr, vaddr + size)``, or None."""
        for seg in self.segments:
            if seg.vaddr <= vaddr and vaddr + size <= seg.end:
                return seg
        return None

    def require(self, vaddr: int, size: int, flags: int, field: str) -> Segment:
        """Check that ``size`` bytes at ``vaddr`` lie in one segment whose
        ``p_flags`` include ``flags`` (``PF_R``, ``PF_X``...).

        Raises:
            ElfFormatError: naming ``field`` and the address.
        """
        seg = self.segment_at(vaddr, max(size, 1))
        if seg is None:
            raise self._err(ElfFormatError, f"{vaddr:#x}+{size:#x} lies in no "
                            "PT_LOAD segment", field, vaddr)
        if seg.flags & flags != flags:
            need = flags_str(flags).replace("-", "")
            raise self._err(ElfFormatError, f"{vaddr:#x} lies in segment "
                            f"{seg.index} ({flags_str(seg.flags)}), which is not "
                            f"{need}", field, vaddr)
        return seg

    def read(self, vaddr: int, size: int, field: str) -> bytes:
        """``size`` bytes the image holds at ``vaddr`` once loaded (zero past
        ``p_filesz``), from one readable segment.

        Raises:
            ElfFormatError: the range is not inside one readable segment.
        """
        if size < 0 or size > MAX_IMAGE_SIZE:
            raise self._err(ElfFormatError, f"size {size:#x} out of range",
                            field, size)
        seg = self.require(vaddr, size, PF_R, field)
        start = vaddr - seg.vaddr
        in_file = max(0, min(size, seg.filesz - start))
        data = self.data[seg.offset + start:seg.offset + start + in_file]
        return data + bytes(size - in_file)

    # --- headers -----------------------------------------------------------
    def _verify_ehdr(self) -> None:
        data = self.data
        if len(data) < 16:
            raise self._err(ElfFormatError, f"file is {len(data)} bytes, too "
                            "short for an ELF identification", "e_ident", len(data))
        if data[:4] != ELF_MAGIC:
            raise self._err(ElfFormatError, f"magic {data[:4]!r} is not "
                            "\\x7fELF", "e_ident[EI_MAG]", data[:4])
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
        eh = self.ehdr = cls.layout("ehdr").unpack(data)
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
                            ("e_phentsize", cls.size("phdr"))):
            if eh[field] != want:
                raise self._err(ElfFormatError, f"{eh[field]} does not match "
                                f"the {cls.bits}-bit entry size {want}", field,
                                eh[field])
        if eh["e_shnum"] and eh["e_shentsize"] != cls.size("shdr"):
            raise self._err(ElfFormatError, f"{eh['e_shentsize']} does not "
                            f"match the {cls.bits}-bit entry size "
                            f"{cls.size('shdr')}", "e_shentsize", eh["e_shentsize"])
        start, count = eh["e_phoff"], eh["e_phnum"]
        if start == 0 or count == 0 or start + count * eh["e_phentsize"] > len(data):
            raise self._err(ElfFormatError, f"program header table at {start:#x} "
                            f"with {count} entries is missing or outside the "
                            f"{len(data)}-byte file", "e_phoff", start)

    def _verify_phdrs(self) -> None:
        cls, eh, size = self.cls, self.ehdr, len(self.data)
        self.phdrs = cls.layout("phdr").unpack_array(self.data, eh["e_phoff"],
                                                     eh["e_phnum"])
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
            if align > MAX_IMAGE_SIZE:
                raise self._err(ElfFormatError, f"alignment {align:#x} exceeds "
                                f"the {MAX_IMAGE_SIZE:#x}-byte image limit",
                                field + ".p_align", align)
            if ph["p_memsz"] > MAX_IMAGE_SIZE or ph["p_vaddr"] > MAX_IMAGE_SIZE:
                raise self._err(ElfFormatError, f"segment at {ph['p_vaddr']:#x} "
                                f"of {ph['p_memsz']:#x} bytes exceeds the "
                                f"{MAX_IMAGE_SIZE:#x}-byte image limit",
                                field + ".p_memsz", ph["p_memsz"])
            segs.append(Segment(i, ph["p_vaddr"], ph["p_memsz"], ph["p_offset"],
                                ph["p_filesz"], ph["p_flags"], align))
        if not segs:
            raise self._err(ElfFormatError, "no PT_LOAD segment", "e_phnum",
                            eh["e_phnum"])
        ordered = sorted(segs, key=lambda s: s.vaddr)
        for a, b in zip(ordered, ordered[1:]):
            if a.end > b.vaddr:
                raise self._err(ElfFormatError, f"PT_LOAD segments "
                                f"{a.vaddr:#x}+{a.memsz:#x} and {b.vaddr:#x} "
                                "overlap", f"phdr[{b.index}].p_vaddr", b.vaddr)
        self.segments = segs
        lo = min(s.vaddr & ~(max(s.align, 1) - 1) for s in segs)
        hi = max(s.end for s in segs)
        self.align = max([PAGE] + [s.align for s in segs])
        self.vaddr_min = lo & ~(PAGE - 1)
        self.vaddr_max = -(-hi // PAGE) * PAGE
        if self.vaddr_max - self.vaddr_min > MAX_IMAGE_SIZE:
            raise self._err(ElfFormatError, f"segments span "
                            f"{self.vaddr_max - self.vaddr_min:#x} bytes, more "
                            f"than the {MAX_IMAGE_SIZE:#x}-byte limit",
                            "p_vaddr", self.vaddr_max)
        self.relro = [(ph["p_vaddr"], ph["p_memsz"]) for ph in self.phdrs
                      if ph["p_type"] == PT_GNU_RELRO]

    @property
    def size(self) -> int:
        """Bytes of address space the image spans once loaded."""
        return self.vaddr_max - self.vaddr_min

    # --- dynamic section ----------------------------------------------------
    def _get(self, tag: str):
        return self.dynamic.get(DT[tag], [None])[0]

    def _parse_dynamic(self) -> None:
        cls = self.cls
        ph = next((p for p in self.phdrs if p["p_type"] == PT_DYNAMIC), None)
        if ph is None or ph["p_filesz"] < cls.size("dyn"):
            raise self._err(ElfFormatError, "no PT_DYNAMIC segment", "PT_DYNAMIC")
        count = min(ph["p_filesz"], ph["p_memsz"]) // cls.size("dyn")
        raw = self.read(ph["p_vaddr"], count * cls.size("dyn"), "PT_DYNAMIC")
        dyn: dict[int, list[int]] = {}
        for entry in cls.layout("dyn").unpack_array(raw, 0, count):
            if entry["d_tag"] == DT["NULL"]:
                break
            dyn.setdefault(entry["d_tag"], []).append(entry["d_val"])
        self.dynamic = dyn
        get = self._get
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
        self._strtab = self.read(strtab, strsz, "DT_STRTAB")
        read = lambda vaddr, size: self.read(vaddr, size, "DT_HASH")  # noqa: E731
        if get("HASH"):
            count = elf_hash_nchain(read, get("HASH"))
        elif get("GNU_HASH"):
            read = lambda vaddr, size: self.read(vaddr, size, "DT_GNU_HASH")  # noqa: E731
            count = gnu_hash_symbol_count(read, get("GNU_HASH"), cls.word)
        else:
            raise self._err(ElfFormatError, "neither DT_HASH nor DT_GNU_HASH: "
                            "cannot size the dynamic symbol table", "PT_DYNAMIC")
        if count > MAX_TABLE_ENTRIES:
            raise self._err(ElfFormatError, f"{count} symbols exceed the limit "
                            f"of {MAX_TABLE_ENTRIES}", "DT_HASH", count)
        layout = cls.layout("sym")
        raw = self.read(symtab, count * layout.size, "DT_SYMTAB")
        self.symbols = layout.unpack_array(raw, 0, count)
        for i, s in enumerate(self.symbols):
            s["name"] = self.string(s["st_name"], f"dynsym[{i}].st_name") if i else ""
        self.exports: dict[str, int] = {}
        for i, s in enumerate(self.symbols):
            if (i and s["st_shndx"] != SHN_UNDEF and s["name"]
                    and s["st_info"] >> 4 in (STB_GLOBAL, STB_WEAK)):
                self.exports.setdefault(s["name"], s["st_value"])

    def string(self, index: int, field: str) -> str:
        """The NUL-terminated string at ``index`` of the dynamic string table.

        Raises:
            ElfFormatError: index past ``DT_STRSZ`` or no terminator.
        """
        if index >= len(self._strtab):
            raise self._err(ElfFormatError, f"string offset {index:#x} beyond "
                            f"DT_STRSZ {len(self._strtab):#x}", field, index)
        end = self._strtab.find(b"\0", index)
        if end < 0:
            raise self._err(ElfFormatError, "unterminated string", field, index)
        return self._strtab[index:end].decode("utf-8", "replace")

    def relocation_value(self, r: RelocationEntry, bias: int,
                         place: bytes) -> int:
        """The value relocation ``r`` computes with load bias ``bias``, by
        its formula in the architecture's table, before it is fitted to
        its place: S is the symbol's address (0 without one), A the addend
        (REL: the word ``place`` holds, the place's bytes before this
        relocation), P the place's address, B the bias."""
        arch = self.arch
        rel = arch.relocations[r.type]
        S = ((bias + self.symbols[r.symbol]["st_value"]) & arch.word_mask
             if r.symbol else 0)
        if r.addend is None:
            A = unpack_array("u32" if rel.size == 4 else "u64",
                             arch.pointer_size, place, 0, 1)[0]
        else:
            A = r.addend
        return rel.formula(S, A, bias + r.offset, bias)

    def _parse_relocations(self) -> None:
        arch, cls = self.arch, self.cls
        kind = arch.rel_tags
        want = kind.upper()
        other = "REL" if want == "RELA" else "RELA"
        if self.dynamic.get(DT[other]):
            raise self._err(UnsupportedElfError, f"{arch.name} uses DT_{want} "
                            f"relocations, found DT_{other}", "DT_" + other,
                            self.dynamic[DT[other]][0])
        tables = []
        if self._get(want):
            tables.append((want, self._get(want), self._get(want + "SZ") or 0))
        if self._get("JMPREL"):
            pltrel = self._get("PLTREL")
            if pltrel != DT[want]:
                raise self._err(UnsupportedElfError, f"{pltrel} is not DT_{want} "
                                f"({DT[want]})", "DT_PLTREL", pltrel)
            tables.append(("JMPREL", self._get("JMPREL"), self._get("PLTRELSZ") or 0))
        layout = cls.layout(kind)
        self.relocations: list[RelocationEntry] = []
        for tag, vaddr, nbytes in tables:
            if nbytes % layout.size:
                raise self._err(ElfFormatError, f"{nbytes} is not a multiple of "
                                f"the {layout.size}-byte entry", f"DT_{tag}SZ", nbytes)
            count = nbytes // layout.size
            if len(self.relocations) + count > MAX_TABLE_ENTRIES:
                raise self._err(ElfFormatError, f"{count} relocations exceed "
                                f"the limit of {MAX_TABLE_ENTRIES}", f"DT_{tag}SZ",
                                nbytes)
            raw = self.read(vaddr, nbytes, "DT_" + tag)
            for i, r in enumerate(layout.unpack_array(raw, 0, count)):
                rtype = cls.r_type(r["r_info"])
                if rtype == 0:
                    continue
                where = f"DT_{tag}[{i}]"
                rel = arch.relocations.get(rtype)
                sym = cls.r_sym(r["r_info"])
                if rel is None:
                    # a call or reference through a symbol nothing defines
                    # is named as such, whatever its relocation type
                    name = self._undefined_name(sym)
                    if name:
                        raise self._err(UndefinedSymbolError, "the image "
                                        f"refers to undefined symbol {name} "
                                        f"(relocation type {rtype}, which "
                                        f"the {arch.name} loader does not "
                                        "apply either); embedded ELFs must "
                                        "be self-contained", where + ".r_info",
                                        [name])
                    raise self._err(RelocationError, f"unknown {arch.name} "
                                    f"relocation type {rtype}", where + ".r_info",
                                    rtype)
                if sym >= len(self.symbols):
                    raise self._err(RelocationError, f"{rel.name} names "
                                    f"symbol {sym} of {len(self.symbols)}",
                                    where + ".r_info", sym)
                if self.segment_at(r["r_offset"], rel.size) is None:
                    raise self._err(RelocationError, f"{rel.name} at "
                                    f"{r['r_offset']:#x} lies in no PT_LOAD "
                                    "segment", where + ".r_offset", r["r_offset"])
                self.relocations.append(RelocationEntry(
                    where, r["r_offset"], rtype, sym, r.get("r_addend")))

    def _undefined_name(self, sym: int) -> str:
        """The name of dynamic symbol ``sym`` when it is undefined, else ""."""
        if 0 < sym < len(self.symbols):
            s = self.symbols[sym]
            if s["st_shndx"] == SHN_UNDEF:
                return s["name"] or f"#{sym}"
        return ""

    def _check_imports(self) -> None:
        """Reject undefined symbols that a relocation binds to: embedded ELFs
        must be self-contained. An undefined symbol nothing refers to (armv7
        objects name the EHABI personality ``__aeabi_unwind_cpp_pr0`` that
        way) binds to nothing; it is kept in :attr:`unreferenced_undefined`."""
        referenced = {r.symbol for r in self.relocations}
        undefined = {i: s["name"] for i, s in enumerate(self.symbols)
                     if i and s["st_shndx"] == SHN_UNDEF and s["name"]}
        imported = [n for i, n in undefined.items() if i in referenced]
        # a relocation through an undefined symbol without a name is
        # refused too (its value would be 0 or the bare addend)
        imported += [f"#{i}" for i in sorted(referenced) if i and i not in undefined
                     and self.symbols[i]["st_shndx"] == SHN_UNDEF]
        if imported:
            raise self._err(UndefinedSymbolError, "the image imports undefined "
                            f"symbols {', '.join(imported)}; embedded ELFs must "
                            "be self-contained", "dynsym", imported)
        self.unreferenced_undefined = sorted(undefined.values())

    # --- initializers and finalizers --------------------------------------------
    #: Two load biases the array entries are relocated with: an entry that
    #: moves with the bias is an address of the image (the value at bias 0).
    _BIASES = (0, 0x5555_5555_5555_5000)

    def _loaded_bytes(self, vaddr: int, size: int) -> bytearray:
        """The ``size`` bytes at ``vaddr`` as copied in before relocation:
        file bytes of the segments, zero elsewhere."""
        out = bytearray(size)
        for seg in self.segments:
            lo, hi = max(vaddr, seg.vaddr), min(vaddr + size, seg.vaddr + seg.filesz)
            if lo < hi:
                start = seg.offset + lo - seg.vaddr
                out[lo - vaddr:hi - vaddr] = self.data[start:start + hi - lo]
        return out

    def _relocated_words(self, vaddr: int, count: int, bias: int) -> list[int]:
        """The ``count`` words at ``vaddr`` after the relocations that touch
        them are applied, in the loader's order, with load bias ``bias``
        (each value truncated to its place)."""
        arch, word = self.arch, self.cls.word
        end = vaddr + count * word
        sizes = ((r, arch.relocations[r.type].size) for r in self.relocations)
        rows = [(r, n) for r, n in sizes if r.offset < end and vaddr < r.offset + n]
        lo = min([vaddr] + [r.offset for r, _ in rows])
        hi = max([end] + [r.offset + n for r, n in rows])
        buf = self._loaded_bytes(lo, hi - lo)
        for r, n in rows:
            at = r.offset - lo
            value = self.relocation_value(r, bias, bytes(buf[at:at + n]))
            buf[at:at + n] = pack_array("u32" if n == 4 else "u64",
                                        arch.pointer_size, [value])
        return unpack_array("ptr", word, buf, vaddr - lo, count)

    def _pointer_array(self, tag: str) -> list[InitFunction]:
        """The functions of ``DT_<tag>`` (``INIT_ARRAY`` or ``FINI_ARRAY``)
        in array order, each entry's value after relocation, verified."""
        addr, size = self._get(tag), self._get(tag + "SZ") or 0
        if not addr or not size:
            return []
        word, mask = self.cls.word, self.arch.word_mask
        if size % word or size // word > MAX_TABLE_ENTRIES:
            raise self._err(ElfFormatError, f"{size} is not a whole number of "
                            f"{word}-byte entries (at most {MAX_TABLE_ENTRIES})",
                            f"DT_{tag}SZ", size)
        self.require(addr, size, PF_R, "DT_" + tag)
        count = size // word
        b0, b1 = (b & mask for b in self._BIASES)
        at0 = self._relocated_words(addr, count, b0)
        at1 = self._relocated_words(addr, count, b1)
        out = []
        for i, (v0, v1) in enumerate(zip(at0, at1)):
            where = f"DT_{tag}[{i}]"
            if v0 == v1:
                if v0 in (0, mask):
                    continue    # a terminator: skipped
                raise self._err(ElfFormatError, f"{v0:#x} is an absolute "
                                "address (no relocation moves it with the load "
                                "address): it lies in no PT_LOAD segment of the "
                                "loaded image", where, v0)
            vaddr = (v0 - b0) & mask
            if (v1 - b1) & mask != vaddr:
                raise self._err(ElfFormatError, f"{v0:#x} is not an address of "
                                f"the image: its relocations make it {v1:#x} "
                                f"at load bias {b1:#x}", where, v0)
            self.require(vaddr, 1, PF_X, where)
            out.append(InitFunction(where, vaddr, addr + i * word))
        return out

    def _single(self, tag: str) -> list[InitFunction]:
        """``DT_INIT`` or ``DT_FINI`` (an address the loader biases), verified."""
        vaddr = self._get(tag)
        if not vaddr:
            return []
        self.require(vaddr, 1, PF_X, "DT_" + tag)
        return [InitFunction("DT_" + tag, vaddr)]

    def _parse_init_fini(self) -> None:
        self.initializers: list[InitFunction] = (
            self._single("INIT") + self._pointer_array("INIT_ARRAY"))
        self.finalizers: list[InitFunction] = (
            list(reversed(self._pointer_array("FINI_ARRAY")))
            + self._single("FINI"))

    def __repr__(self):
        return f"<ElfImage {self.name} {self.arch.name}>"
