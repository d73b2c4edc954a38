"""Fault reports for code that faulted in a loaded image, as a debugger prints them.

The emulated backend knows the facts of a fault (the pc, what kind of access
failed and at which address, which export or import was running and for which
workgroup); this module turns them into text:

* :class:`Symbolizer` names an address of a loaded image ``symbol+0x1c``
  from the dynamic symbols, the static ``.symtab`` and DWARF subprograms, and
  finds its ``file:line`` in the DWARF line tables;
* :func:`disassemble` prints the instruction at an address (capstone, with
  the decoding facts of :attr:`elfloader.arch.Arch.disassembly`), or says
  that it cannot decode it and shows its bytes;
* :class:`Region` and :func:`describe_address` say which buffer, stack or
  segment a data address belongs to, or how far past its end it lies;
* :class:`FaultReport` holds all of it and formats a multi-line report,
  which :func:`fault_report` assembles from a symbolizer and a memory reader.

Everything here reads files and memory the caller hands in and never raises
on malformed input: a garbled section table, ``.symtab`` or DWARF yields no
symbol or line, unreadable code yields ``(unreadable)``. This module does
not depend on the emulator.
"""

from __future__ import annotations

import bisect
import io
import os
import re
import threading
from dataclasses import dataclass
from typing import Callable, Iterable, Mapping, Sequence

from fatelf.cstruct import CStruct
from fatelf.text import one_line

from . import arch as _arch_registry
from .arch import Disassembly
from .elf import SHN_UNDEF, SHT_STRTAB, SHT_SYMTAB, flags_str
from .errors import EmulationError, FaultReport
from .image import MAX_TABLE_ENTRIES, ElfImage

STT_NOTYPE, STT_OBJECT, STT_FUNC, STT_SECTION, STT_FILE = 0, 1, 2, 3, 4
SHN_LORESERVE, SHN_XINDEX = 0xFF00, 0xFFFF
SHF_COMPRESSED = 0x800

#: Header of an ``SHF_COMPRESSED`` section (System V gABI, elf.h).
CHDR32 = CStruct("Elf32_Chdr", [("ch_type", "u32"), ("ch_size", "u32"),
                                ("ch_addralign", "u32")], "System V gABI, elf.h")
CHDR64 = CStruct("Elf64_Chdr", [("ch_type", "u32"), ("ch_reserved", "u32"),
                                ("ch_size", "u64"), ("ch_addralign", "u64")],
                 "System V gABI, elf.h")

#: Most bytes of DWARF (all ``.debug_*`` sections, decompressed) read from
#: one image; an image with more gives no DWARF names or lines.
MAX_DWARF_BYTES = 64 << 20

#: A data address this many bytes or fewer before the start or past the end
#: of a region, and in no region, is described relative to that region.
NEAR_BYTES = 4096

#: Bytes :func:`fault_report` reads at the pc for :func:`disassemble`
#: (the longest x86 instruction is 15 bytes).
CODE_BYTES = 16

#: The ``source`` row's note for code of an image without DWARF line
#: rows.
NO_LINE_TABLE = "built without -g; build with -g for source lines"

#: Fault kinds (:attr:`elfloader.errors.Fault.kind`) for which
#: the CPU stopped on an instruction it could not run rather than on a data
#: access; their reported pc may lie after that instruction.
INSTRUCTION_FAULTS = frozenset({"invalid_instruction", "exception"})


# --- symbols and source lines ---------------------------------------------------

@dataclass(frozen=True)
class _Sym:
    start: int          # unbiased vaddr
    size: int           # bytes; 0: unknown
    name: str
    rank: int           # lower wins among symbols holding the same address


def _cstr(table: bytes, index: int) -> str | None:
    if not 0 <= index < len(table):
        return None
    end = table.find(b"\0", index)
    if end < 0:
        return None
    return table[index:end].decode("utf-8", "replace")


def _rank(info: int, source: int) -> int:
    """Order of preference of a symbol: typed (FUNC, OBJECT) before NOTYPE,
    GLOBAL/WEAK before LOCAL, then the table it came from."""
    typed = 0 if info & 0xF in (STT_FUNC, STT_OBJECT) else 1
    local = 0 if info >> 4 else 1
    return typed * 4 + local * 2 + source


def section_symbols(image: ElfImage) -> list[dict]:
    """The symbols of every ``SHT_SYMTAB`` section of ``image`` (the static
    ``.symtab``), read through the section header table.

    Every offset, size, count and string index is checked against the file;
    a section table, symbol table or string table that does not fit yields
    no symbols from it (never an exception).

    Returns:
        ``Elf_Sym`` field dicts plus ``name`` (index 0 and nameless symbols
        left out), in table order; ``[]`` when the file has no section
        headers or they are malformed.
    """
    try:
        return _section_symbols(image)
    except Exception:  # noqa: BLE001 - malformed input must not escape
        return []


def _section_headers(image: ElfImage) -> list[dict]:
    """Every section header of ``image`` (``[]`` when there are none, or the
    table does not lie inside the file); counts from section 0's
    ``sh_size`` when ``e_shnum`` is 0 (extended numbering)."""
    data, eh = image.data, image.ehdr
    shdr = image.cls.layout("shdr")
    shoff, shnum = eh["e_shoff"], eh["e_shnum"]
    if not shoff or eh["e_shentsize"] != shdr.size:
        return []
    if shoff + shdr.size > len(data):
        return []
    if shnum == 0:
        shnum = shdr.unpack(data, shoff)["sh_size"]
    if shnum > MAX_TABLE_ENTRIES or shoff + shnum * shdr.size > len(data):
        return []
    return shdr.unpack_array(data, shoff, shnum)


def _in_file(image: ElfImage, sec: dict) -> bool:
    return sec["sh_offset"] + sec["sh_size"] <= len(image.data)


def _section_symbols(image: ElfImage) -> list[dict]:
    data = image.data
    sections = _section_headers(image)
    sym = image.cls.layout("sym")
    out: list[dict] = []
    for sec in sections:
        if sec["sh_type"] != SHT_SYMTAB or sec["sh_entsize"] != sym.size:
            continue
        if not _in_file(image, sec) or not 0 < sec["sh_link"] < len(sections):
            continue
        strsec = sections[sec["sh_link"]]
        if strsec["sh_type"] != SHT_STRTAB or not _in_file(image, strsec):
            continue
        strtab = data[strsec["sh_offset"]:strsec["sh_offset"] + strsec["sh_size"]]
        count = min(sec["sh_size"] // sym.size, MAX_TABLE_ENTRIES)
        for i, s in enumerate(sym.unpack_array(data, sec["sh_offset"], count)):
            name = _cstr(strtab, s["st_name"]) if i else None
            if name:
                s["name"] = name
                out.append(s)
    return out


def _dwarf_within_limit(image: ElfImage) -> bool:
    """Whether the DWARF sections lie inside the file and, decompressed,
    total at most :data:`MAX_DWARF_BYTES` (a check made before pyelftools
    inflates ``SHF_COMPRESSED`` sections)."""
    sections = _section_headers(image)
    if not sections:
        return False
    index = image.ehdr["e_shstrndx"]
    if index == SHN_XINDEX:
        index = sections[0]["sh_link"]
    if not 0 < index < len(sections) or not _in_file(image, sections[index]):
        return False
    names = sections[index]
    strtab = image.data[names["sh_offset"]:names["sh_offset"] + names["sh_size"]]
    chdr = (CHDR32 if image.cls.bits == 32 else CHDR64).layout(image.cls.word)
    total = 0
    for sec in sections:
        name = _cstr(strtab, sec["sh_name"]) or ""
        if not name.startswith((".debug", ".zdebug")):
            continue
        if not _in_file(image, sec):
            return False
        size = sec["sh_size"]
        if sec["sh_flags"] & SHF_COMPRESSED:
            if size < chdr.size:
                return False
            size = chdr.unpack(image.data, sec["sh_offset"])["ch_size"]
        elif name.startswith(".zdebug"):
            if size < 12:
                return False
            size = int.from_bytes(image.data[sec["sh_offset"] + 4:
                                             sec["sh_offset"] + 12], "big")
        total += size
    return total <= MAX_DWARF_BYTES


def _usable(s: dict) -> bool:
    shndx = s.get("st_shndx", 1)
    return (bool(s.get("name")) and shndx != SHN_UNDEF
            and not SHN_LORESERVE <= shndx
            and s["st_info"] & 0xF not in (STT_SECTION, STT_FILE)
            and not s["name"].startswith("$"))  # Arm/RISC-V mapping symbols


class Symbolizer:
    """Names addresses of one image loaded at ``base``.

    Args:
        image: the verified image.
        base: its load bias (:attr:`elfloader.ElfModule.base`): the address
            virtual address 0 of the file maps to.
        entry_points: more function entry points whose sizes are unknown,
            name -> loaded address (e.g. an executable library's export
            table); on arm32 bit 0 (Thumb) is ignored.

    Symbols come from the dynamic symbol table, every ``SHT_SYMTAB``
    section (see :func:`section_symbols`), DWARF ``DW_TAG_subprogram``
    entries (read on first need) and ``entry_points``. Reading DWARF is
    lazy, cached and thread-safe; malformed DWARF gives no names or lines.
    """

    def __init__(self, image: ElfImage, base: int,
                 entry_points: Mapping[str, int] | None = None):
        self.image = image
        self.base = base
        self._mask = image.arch.word_mask
        thumb = image.arch.disassembly.thumb_modes is not None
        seen: set[tuple[str, int]] = set()
        sized: list[_Sym] = []
        unsized: list[_Sym] = []
        tables = ((0, image.symbols), (1, section_symbols(image)))
        for source, table in tables:
            for s in table:
                if not _usable(s):
                    continue
                value = s["st_value"]
                if thumb and s["st_info"] & 0xF == STT_FUNC:
                    value &= ~1
                if (s["name"], value) in seen or image.segment_at(value) is None:
                    continue
                seen.add((s["name"], value))
                sym = _Sym(value, s["st_size"], s["name"],
                           _rank(s["st_info"], source))
                (sized if sym.size else unsized).append(sym)
        for name, address in (entry_points or {}).items():
            value = (address - base) & self._mask
            if thumb:
                value &= ~1
            if (name, value) not in seen and image.segment_at(value) is not None:
                seen.add((name, value))
                unsized.append(_Sym(value, 0, name, 8))
        self._sized = sorted(sized, key=lambda s: s.start)
        self._unsized = sorted(unsized, key=lambda s: (s.start, s.rank))
        self._lock = threading.Lock()
        self._dwarf_done = False
        self._dwarf_funcs: list[_Sym] = []
        self._lines: list[tuple[int, int, str, int]] = []
        self._line_starts: list[int] = []

    # -- addresses ------------------------------------------------------------
    def vaddr(self, address: int) -> int | None:
        """The file's virtual address of loaded ``address``, or None when it
        lies in no PT_LOAD segment of the image."""
        v = (address - self.base) & self._mask
        return v if self.image.segment_at(v) is not None else None

    def contains(self, address: int) -> bool:
        """Whether loaded ``address`` lies in a PT_LOAD segment of the image."""
        return self.vaddr(address) is not None

    # -- symbols --------------------------------------------------------------
    def lookup(self, address: int) -> tuple[str, int] | None:
        """``(symbol name, offset in bytes)`` of loaded ``address``.

        A symbol with a size holding the address wins (typed over untyped,
        global over local, then the smallest); then a DWARF subprogram
        holding it; then the nearest sizeless symbol (or entry point) at or
        below it in the same segment, unless a sized symbol starts between
        them.

        Returns:
            None when the address is outside the image or no symbol covers it.
        """
        v = self.vaddr(address)
        if v is None:
            return None
        hits = [s for s in self._sized if s.start <= v < s.start + s.size]
        if not hits:
            self._load_dwarf()
            hits = [s for s in self._dwarf_funcs if s.start <= v < s.start + s.size]
        if hits:
            best = min(hits, key=lambda s: (s.rank, s.size, s.start))
            return best.name, v - best.start
        seg = self.image.segment_at(v)
        if seg is None:
            return None
        below = [s for s in self._sized + self._dwarf_funcs
                 if seg.vaddr <= s.start <= v]
        last_sized = max((s.start for s in below), default=-1)
        near = [s for s in self._unsized if seg.vaddr <= s.start <= v
                and s.start >= last_sized]
        if not near:
            return None
        top = max(s.start for s in near)
        best = min((s for s in near if s.start == top), key=lambda s: s.rank)
        return best.name, v - best.start

    def symbolize(self, address: int) -> str | None:
        """``name`` or ``name+0x1c`` for loaded ``address`` (offset in bytes,
        hexadecimal), or None (see :meth:`lookup`). The name is the file's
        text, shown on one bounded line (control characters escaped:
        :func:`fatelf.text.one_line`); :meth:`lookup` gives it as it is."""
        hit = self.lookup(address)
        if hit is None:
            return None
        name, offset = hit
        name = one_line(name, 200)
        return f"{name}+{offset:#x}" if offset else name

    # -- DWARF ----------------------------------------------------------------
    def source_line(self, address: int) -> str | None:
        """``file:line`` of the instruction at loaded ``address`` from the
        DWARF line tables.

        Returns:
            None when the image has no DWARF, it is malformed, no row covers
            the address or the row has line 0 (no source location); the
            file name (the DWARF's text) on one line, control characters
            escaped.
        """
        v = self.vaddr(address)
        if v is None:
            return None
        self._load_dwarf()
        i = bisect.bisect_right(self._line_starts, v) - 1
        if i < 0:
            return None
        start, end, file, line = self._lines[i]
        if not start <= v < end or not line:
            return None
        return f"{one_line(file, 300)}:{line}"

    def has_line_table(self) -> bool:
        """Whether the image has DWARF line rows (a ``-g`` build)."""
        self._load_dwarf()
        return bool(self._lines)

    def _load_dwarf(self) -> None:
        if self._dwarf_done:
            return
        with self._lock:
            if self._dwarf_done:
                return
            funcs: list[_Sym] = []
            lines: list[tuple[int, int, str, int]] = []
            try:
                _read_dwarf(self.image, funcs, lines)
            except Exception:  # noqa: BLE001 - malformed DWARF gives nothing
                funcs, lines = [], []
            seen = {(s.name, s.start) for s in self._sized}
            self._dwarf_funcs = [s for s in funcs if (s.name, s.start) not in seen
                                 and self.image.segment_at(s.start) is not None]
            lines.sort()
            self._lines = lines
            self._line_starts = [r[0] for r in lines]
            self._dwarf_done = True

    def __repr__(self):
        return f"<Symbolizer {self.image.name} at {self.base:#x}>"


def _dwarf_address(dwarf, cu, attr) -> int:
    """The address an ``DW_AT_low_pc``/``high_pc`` attribute holds (indexed
    ``DW_FORM_addrx*`` forms are looked up in ``.debug_addr``)."""
    if attr.form.startswith("DW_FORM_addrx"):
        return dwarf.get_addr(cu, attr.value)
    return attr.value


def _read_dwarf(image: ElfImage, funcs: list, lines: list) -> None:
    """Fill ``funcs`` with DWARF subprograms and ``lines`` with
    ``(start, end, file, line)`` rows of every line program (pyelftools;
    any exception it raises propagates)."""
    from elftools.elf.elffile import ELFFile

    if not _dwarf_within_limit(image):
        return
    elf = ELFFile(io.BytesIO(image.data))
    if not elf.has_dwarf_info():
        return
    dwarf = elf.get_dwarf_info(relocate_dwarf_sections=False)
    for cu in dwarf.iter_CUs():
        for die in cu.iter_DIEs():
            if die.tag != "DW_TAG_subprogram":
                continue
            attrs = die.attributes
            low, high = attrs.get("DW_AT_low_pc"), attrs.get("DW_AT_high_pc")
            name = attrs.get("DW_AT_name") or attrs.get("DW_AT_linkage_name")
            if low is None or high is None or name is None:
                continue
            start = _dwarf_address(dwarf, cu, low)
            if high.form == "DW_FORM_addr" or high.form.startswith("DW_FORM_addrx"):
                end = _dwarf_address(dwarf, cu, high)
            else:
                end = start + high.value
            if isinstance(name.value, bytes) and end > start:
                funcs.append(_Sym(start, end - start,
                                  name.value.decode("utf-8", "replace"), 0))
        program = dwarf.line_program_for_CU(cu)
        if program is None:
            continue
        version = program.header["version"]
        files = program["file_entry"]
        dirs = program["include_directory"]

        def file_name(index: int) -> str:
            k = index if version >= 5 else index - 1
            if not 0 <= k < len(files):
                return "?"
            entry = files[k]
            name = entry.name.decode("utf-8", "replace")
            d = entry.dir_index if version >= 5 else entry.dir_index - 1
            if os.path.isabs(name) or not 0 <= d < len(dirs):
                return name
            return os.path.join(dirs[d].decode("utf-8", "replace"), name)

        prev = None
        for entry in program.get_entries():
            state = entry.state
            if state is None:
                continue
            if prev is not None and state.address > prev.address:
                lines.append((prev.address, state.address,
                              file_name(prev.file), prev.line))
            prev = None if state.end_sequence else state


# --- disassembly ---------------------------------------------------------------

def _facts(arch_name: str) -> Disassembly:
    try:
        return _arch_registry.by_name(arch_name).disassembly
    except Exception:  # noqa: BLE001 - reported as ValueError
        raise ValueError(f"no disassembler for architecture {arch_name!r}; "
                         f"known: {', '.join(_arch_registry.names())}") from None


def instruction_length(arch_name: str, code: bytes, address: int) -> int | None:
    """Length in bytes of the instruction starting with ``code``, from the
    encoding rules of :attr:`Disassembly.lengths` alone (no decoder).

    Returns:
        None when the instruction set is variable-length (x86: only a
        decoder knows), the encoding is longer than any the disassembler
        handles, or ``code`` holds fewer than 2 bytes.

    Raises:
        ValueError: ``arch_name`` names no supported architecture.
    """
    facts = _facts(arch_name)
    thumb = facts.thumb_modes is not None and address & 1
    rows = facts.thumb_lengths if thumb else facts.lengths
    if len(code) < 2:
        return None
    unit = int.from_bytes(code[:2], "little")
    length = next((n for mask, match, n in rows if unit & mask == match),
                  facts.default_length)
    return length or None


def _decode(facts: Disassembly, code: bytes, address: int):
    """``(text, size)`` of the first instruction capstone decodes from
    ``code``, or None (no decode, or capstone missing)."""
    try:
        import capstone
    except ImportError:
        return None
    names = facts.capstone_modes
    if facts.thumb_modes is not None and address & 1:
        names, address = facts.thumb_modes, address & ~1
    arch = next((getattr(capstone, n) for n in
                 (facts.capstone_arch, *facts.capstone_arch_aliases)
                 if hasattr(capstone, n)), None)
    if arch is None:
        return None
    mode = 0
    for m in names:
        mode |= getattr(capstone, m)
    for m in facts.optional_modes:
        mode |= getattr(capstone, m, 0)
    try:
        md = capstone.Cs(arch, mode)
        for insn in md.disasm(bytes(code), address & 0xFFFFFFFFFFFFFFFF, 1):
            text = f"{insn.mnemonic} {insn.op_str}".strip()
            for pattern, replacement in facts.text_fixes:
                text = re.sub(pattern, replacement, text)
            return text, insn.size
    except capstone.CsError:
        return None
    return None


def extension(arch_name: str, code: bytes) -> str | None:
    """The ISA extension an instruction's encoding belongs to, from
    :attr:`Disassembly.extensions` (e.g. ``RVV (vector extension)``), or
    None when no row matches or ``code`` is shorter than 4 bytes."""
    if len(code) < 4:
        return None
    word = int.from_bytes(code[:4], "little")
    return next((name for mask, match, name in _facts(arch_name).extensions
                 if word & mask == match), None)


def disassemble(arch_name: str, code: bytes, address: int) -> str:
    """The instruction at ``address`` as ``"mnemonic operands"``.

    Args:
        arch_name: architecture name (``aarch64``, ``x86_32``... or an alias
            of the architecture table).
        code: bytes of guest memory starting at the instruction (up to 15
            for x86, 4 elsewhere are used).
        address: the instruction's address, used for pc-relative operands.
            On arm32, bit 0 set selects the Thumb instruction set and the
            instruction is at ``address & ~1``.

    Returns:
        The instruction text. ``"(unreadable)"`` when ``code`` is empty or
        shorter than the instruction. RVV decodes with capstone 6
        (``vsetvli a4, a2, e32, m2, ta, ma``). When the bytes do not decode
        (an encoding the disassembler does not know, e.g. RVV with
        capstone 5, or not an instruction), or decode to an instruction
        whose length contradicts the encoding rules of the architecture,
        the text says so and shows the instruction's bytes with the ISA
        extension their encoding belongs to, never another instruction:
        ``"(cannot decode: 57 77 16 0d; RVV (vector extension))"``.

    Raises:
        ValueError: ``arch_name`` names no supported architecture.
    """
    facts = _facts(arch_name)
    if not code:
        return "(unreadable)"
    code = bytes(code)
    length = instruction_length(arch_name, code, address)
    if length is not None and len(code) < length:
        return "(unreadable)"
    decoded = _decode(facts, code, address)
    if decoded is not None and (length is None or decoded[1] == length):
        return decoded[0]
    shown = code[:length] if length else code[:min(len(code), 8)]
    ext = extension(arch_name, code)
    what = "cannot decode" if decoded is not None or _has_capstone() \
        else "no disassembler"
    return f"({what}: {shown.hex(' ')}" + (f"; {ext})" if ext else ")")


def _has_capstone() -> bool:
    try:
        import capstone  # noqa: F401
    except ImportError:
        return False
    return True


def faulting_instruction(arch_name: str, read: Callable[[int, int], bytes],
                         pc: int, function_start: int | None
                         ) -> tuple[int, str] | None:
    """For a CPU that stopped on an instruction it could not run: the
    instruction just before ``pc``, when that one does not decode or its
    encoding belongs to an ISA extension (:func:`extension`, e.g. RVV) and
    the instruction at ``pc`` decodes and belongs to none (an emulator may
    report the pc after the instruction it refused).

    The instruction before ``pc`` is found from the encoding rules: ``pc``
    minus the fixed length, or by walking instruction lengths from
    ``function_start`` (the start of the function holding ``pc``, or None)
    for compressed and variable-length sets; when that walk does not land
    on ``pc`` nothing is claimed.

    Returns:
        ``(address, text)`` of that instruction, or None.
    """
    facts = _facts(arch_name)
    thumb = facts.thumb_modes is not None and pc & 1
    at = pc & ~1 if thumb else pc

    def code_at(address: int) -> bytes:
        try:
            return bytes(read(address, CODE_BYTES))
        except Exception:  # noqa: BLE001 - unreadable memory
            return b""

    here = code_at(at)
    if (not here or disassemble(arch_name, here, pc).startswith("(")
            or extension(arch_name, here) is not None):
        return None
    rows = facts.thumb_lengths if thumb else facts.lengths
    prev = None
    if not rows and facts.default_length:
        prev = at - facts.default_length
    elif function_start is not None and function_start < at:
        walk = function_start & ~1 if thumb else function_start
        while walk < at:
            code = code_at(walk)
            size = instruction_length(arch_name, code, walk | thumb)
            if size is None:
                decoded = _decode(facts, code, walk | thumb)
                size = decoded[1] if decoded else None
            if not size:
                return None
            prev, walk = walk, walk + size
        if walk != at:
            return None
    if prev is None:
        return None
    code = code_at(prev)
    text = disassemble(arch_name, code, prev | thumb)
    if not text.startswith("(cannot decode") and extension(arch_name, code) is None:
        return None
    return prev, text


# --- data addresses ------------------------------------------------------------

@dataclass(frozen=True)
class Region:
    """A named range of guest memory a data address may fall in.

    Attributes:
        name: how the report names it, e.g. ``binding 2``, ``the stack``.
        start: first address; size: length in bytes.
        offsets: describe addresses as ``at offset N of SIZE bytes`` (False:
            the name alone, for the stack or an image segment).
        guard: a guard page (inaccessible memory placed after a buffer): an
            address in it is described from the buffer it follows when
            there is one near, with ``guard page`` added.
    """

    name: str
    start: int
    size: int
    offsets: bool = True
    guard: bool = False

    @property
    def end(self) -> int:
        return self.start + self.size


def segment_regions(image: ElfImage, base: int) -> list[Region]:
    """One :class:`Region` per PT_LOAD segment of ``image`` loaded at load
    bias ``base``, named ``segment 1 (rw-) of kernel.so`` (the file's base
    name), without offsets."""
    file = os.path.basename(image.name) or image.name
    return [Region(f"segment {s.index} ({flags_str(s.flags)}) of {file}",
                   base + s.vaddr, s.memsz, offsets=False)
            for s in image.segments]


def joined_names(names: Sequence[str]) -> str:
    """``a``, ``a and b``, ``a, b and c``: names in order, repeats left out."""
    names = list(dict.fromkeys(names))
    if len(names) < 2:
        return "".join(names)
    return ", ".join(names[:-1]) + " and " + names[-1]


def _merged(regions: Iterable[Region]) -> list[Region]:
    """``regions`` with those of one range and kind (one array passed as
    two bindings or two params fields) made one, named by all of them
    (``binding 0 and binding 2``), in first-seen order."""
    out: list[Region] = []
    names: dict[tuple, list[str]] = {}
    for r in regions:
        key = (r.start, r.size, r.offsets, r.guard)
        if key in names:
            names[key].append(r.name)
            continue
        names[key] = [r.name]
        out.append(r)
    return [Region(joined_names(names[(r.start, r.size, r.offsets, r.guard)]),
                   r.start, r.size, r.offsets, r.guard)
            if len(names[(r.start, r.size, r.offsets, r.guard)]) > 1 else r
            for r in out]


def describe_address(address: int, regions: Iterable[Region]) -> str:
    """Which region a data address belongs to.

    The smallest region holding ``address`` names it (``local memory at
    offset 12 of 4096 bytes``, or the bare name for regions without
    offsets); regions of one range (one array bound twice) are named
    together (``binding 0 and binding 1 at offset 4 of 400 bytes``). An
    address in no region but at most :data:`NEAR_BYTES` bytes
    outside one with offsets is described from the nearest
    (``binding 2 at offset 4096 of 4096 bytes (1 past the end)``: the
    count is 1 for the first byte after the region; ``(4 before the
    start)``), with ``, guard page`` in the parentheses when a guard region
    (:attr:`Region.guard`) holds it. An address only a guard region holds
    is named by it. Otherwise ``unmapped``, with ``(null pointer)`` or
    ``(N bytes past a null pointer)`` below :data:`NEAR_BYTES`.

    Args:
        address: the guest address; regions: :class:`Region` objects.
    """
    regions = _merged(regions)
    guards = [r for r in regions if r.guard and r.start <= address < r.end]
    regions = [r for r in regions if not r.guard]
    holding = [r for r in regions if r.start <= address < r.end]
    if holding:
        r = min(holding, key=lambda r: r.size)
        if not r.offsets:
            return one_line(r.name, 200)
        return f"{one_line(r.name, 200)} at offset {address - r.start} of {r.size} bytes"
    best = None
    for r in regions:
        if not r.offsets:
            continue
        if r.end <= address <= r.end + NEAR_BYTES - 1:
            dist, note = address - r.end, f"{address - r.end + 1} past the end"
        elif r.start - NEAR_BYTES <= address < r.start:
            dist, note = r.start - address, f"{r.start - address} before the start"
        else:
            continue
        if best is None or dist < best[0]:
            best = (dist, r, note)
    if best is not None:
        _, r, note = best
        if guards:
            note += ", guard page"
        return (f"{one_line(r.name, 200)} at offset {address - r.start} of {r.size} bytes "
                f"({note})")
    if guards:
        return one_line(min(guards, key=lambda r: r.size).name, 200)
    if address == 0:
        return "unmapped (null pointer)"
    if 0 < address < NEAR_BYTES:
        return f"unmapped ({address} bytes past a null pointer)"
    return "unmapped"


# --- the report ----------------------------------------------------------------

# FaultReport lives in errors (EmulationError.report holds one) and is
# named here too, with the functions that build it.


def time_limit_kind(seconds: float) -> str:
    """A report's kind for a call stopped at its time limit of ``seconds``."""
    return (f"still running at the time limit of {seconds:g} s (stopped; an "
            "endless loop?)")


def engine_of(backend) -> str | None:
    """The emulator and CPU model of an emulated backend, for reports
    (None for the native backend)."""
    return backend.describe() if backend.kind == "emulated" else None


def data_address(exc: BaseException) -> int | None:
    """The exact address of the access a backend error refused, else its
    page, else None (:attr:`Fault.data_address` of an
    :class:`EmulationError`'s fault; None for any other error)."""
    fault = exc.fault if isinstance(exc, EmulationError) else None
    return fault.data_address if fault is not None else None


def fault_report(*, file: str, arch: str, kind: str, pc: int,
                 symbolizers: Sequence[Symbolizer] = (),
                 read: Callable[[int, int], bytes] | None = None,
                 function: str | None = None, function_kind: str = "export",
                 workgroup: tuple[int, int, int] | None = None,
                 data_address: int | None = None,
                 regions: Iterable[Region] = (), thumb: bool = False,
                 instruction_fault: bool = False,
                 caller: str | None = None,
                 engine: str | None = None) -> FaultReport:
    """Assemble a :class:`FaultReport` from the facts of a fault.

    Args:
        file, arch, kind, function, function_kind, workgroup, data_address,
        caller: as in :class:`FaultReport`.
        pc: address of the faulting instruction (without the Thumb bit).
        symbolizers: the loaded images; the first that holds the pc names
            it and gives its source line.
        read: ``read(address, size) -> bytes`` of guest memory for the
            instruction; anything it raises counts as unreadable memory.
        regions: known data regions for :func:`describe_address`; each
            symbolizer's segments are added after them.
        thumb: the CPU runs Thumb code (arm32).
        instruction_fault: the CPU stopped on an instruction it could not
            run (:data:`INSTRUCTION_FAULTS`), not on a data access. When the
            instruction at ``pc`` decodes but the one before it does not
            (:func:`faulting_instruction`), the report is about that one,
            with a note giving the pc the CPU reported.

    The report's ``module`` names the image holding the pc when it is not
    ``file`` (its base name).

    Never raises for unreadable memory or malformed debug information.
    """
    holder = next((sym for sym in symbolizers if sym.contains(pc)), None)
    note = None
    if instruction_fault and read is not None and holder is not None:
        try:
            hit = holder.lookup(pc)
            start = pc - hit[1] if hit else None
            found = faulting_instruction(arch, read, pc | 1 if thumb else pc,
                                         start)
        except ValueError:
            found = None
        if found is not None:
            note = (f"the CPU reported pc {pc:#x}, after this instruction "
                    "it could not run")
            pc = found[0]
    symbol = source = source_note = None
    if holder is not None:
        symbol, source = holder.symbolize(pc), holder.source_line(pc)
        if source is None and not holder.has_line_table():
            source_note = NO_LINE_TABLE
    instruction = None
    if read is not None:
        try:
            code = bytes(read(pc, CODE_BYTES))
        except Exception:  # noqa: BLE001 - any failure: memory is unreadable
            code = b""
        try:
            instruction = disassemble(arch, code, pc | 1 if thumb else pc)
        except ValueError:
            instruction = None
    module = None
    if holder is not None:
        owner = os.path.basename(holder.image.name or "")
        if owner and owner != os.path.basename(file or ""):
            module = owner
    description = None
    if data_address is not None:
        regions = list(regions)
        for sym in symbolizers:
            regions += segment_regions(sym.image, sym.base)
        description = describe_address(data_address, regions)
    return FaultReport(file=file, arch=arch, kind=kind, pc=pc, function=function,
                       function_kind=function_kind, workgroup=workgroup,
                       symbol=symbol, source=source, instruction=instruction,
                       data_address=data_address, data_description=description,
                       note=note, module=module, caller=caller, engine=engine,
                       source_note=source_note)


__all__ = ["Symbolizer", "section_symbols", "disassemble", "Region",
           "segment_regions", "describe_address", "FaultReport",
           "fault_report", "instruction_length", "extension",
           "faulting_instruction", "INSTRUCTION_FAULTS", "NEAR_BYTES",
           "time_limit_kind", "engine_of", "data_address",
           "CODE_BYTES", "NO_LINE_TABLE", "joined_names"]
