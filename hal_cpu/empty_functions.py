"""Calls into functions of no code in an executable library.

iree-compile 3.13 links musl's math functions into the executables it
builds for 32-bit targets (x86_32, arm32, riscv32) as bitcode it built for
wasm32, in which ``fmaf``, ``floor`` and ``round`` have no body: each
becomes a function of zero bytes, and a call to it runs whatever the linker
placed next (another function, the padding between functions: on x86 an
``int3``, or the bytes past the end of ``.text``). The names are gone from
the linked library (its local symbols are discarded), but the function's
frame description in ``.eh_frame`` remains: an FDE whose address range is
empty. A library built that way is refused when it loads
(:class:`EmptyFunctionError`), naming the exports that call it and how to
compile the program so that it links (:func:`hal_cpu.programs.compile_program`
links these executables with the runtime's libm,
``hal_cpu/buildtools/libm_link.py``).

:func:`find_empty_calls` reads the FDEs with pyelftools and finds the direct
calls (and tail jumps) to an empty function's address in the executable
segments: x86 ``call``/``jmp rel32``, ARM ``bl``/``b``, RISC-V ``jal`` and
``auipc``+``jalr`` pairs, decoded with numpy over the whole segment at once.
"""

from __future__ import annotations

import io
from dataclasses import dataclass

import numpy as np

from .errors import LibraryError

#: What :class:`EmptyFunctionError` tells the user to do.
HOW_TO_LINK = (
    "compile the program with hal-cpu (run-module, check-module and "
    "benchmark-module compile MLIR; hal_cpu.programs.compile_program), which "
    "links 32-bit executables with hal_cpu's libm, or give iree-compile the "
    "flag of hal_cpu.programs.compiler.libm_linker_flags(arch) "
    "(--iree-llvmcpu-embedded-linker-path=...)")

#: The functions iree-compile 3.13 leaves with no body for 32-bit targets.
KNOWN_EMPTY = ("fmaf", "floor", "round")


class EmptyFunctionError(LibraryError):
    """The library calls a function of no code (``field`` ``"call"``,
    ``value`` the function's address in the file, as hex)."""


@dataclass(frozen=True)
class EmptyCall:
    """A direct call or jump to a function of no code.

    Attributes:
        target: the empty function's address (the file's, unbiased).
        site: the call instruction's address (the file's), or None when
            no call site was found (the FDE alone shows the function).
        caller: address where the function holding the call starts (its
            FDE's), or None.
    """

    target: int
    site: int | None
    caller: int | None


def _unwind_facts(image) -> tuple[list[tuple[int, int]], list[int], list[int]]:
    """What the unwind tables and section headers tell of functions:
    ``(fdes, exidx_starts, code_ends)``: ``(start, length)`` of every FDE
    of ``.eh_frame``; the function starts of ARM's ``.ARM.exidx`` entries
    (sorted, as the table is); the end address of every executable
    section. Empty lists when the file has none or pyelftools cannot read
    it (the check is then not made)."""
    from elftools.elf.elffile import ELFFile

    fdes: list[tuple[int, int]] = []
    exidx: list[int] = []
    ends: list[int] = []
    starts: set[int] = set()
    try:
        elf = ELFFile(io.BytesIO(image.data))
        for sec in elf.iter_sections():
            if sec["sh_flags"] & 0x4 and sec["sh_type"] == "SHT_PROGBITS":  # SHF_EXECINSTR
                ends.append(int(sec["sh_addr"] + sec["sh_size"]))
                starts.add(int(sec["sh_addr"]))
            elif sec.name == ".ARM.exidx" and sec["sh_type"] != "SHT_NOBITS":
                words = np.frombuffer(sec.data()[:sec["sh_size"] // 8 * 8], "<u4")
                at = sec["sh_addr"] + 8 * np.arange(len(words) // 2, dtype=np.int64)
                exidx = [int(a) & 0xFFFFFFFF for a in
                         at + _sext(words[0::2].astype(np.int64) & 0x7FFFFFFF, 31)]
    except Exception:   # noqa: BLE001 - pyelftools on damaged tables raises anything
        return [], [], []
    try:
        eh = elf.get_section_by_name(".eh_frame")
        quick = (_quick_fdes(eh.data(), int(eh["sh_addr"]))
                 if eh is not None and eh["sh_type"] != "SHT_NOBITS" else [])
        if quick is not None:
            fdes = quick
        elif eh is not None:
            dwarf = elf.get_dwarf_info(relocate_dwarf_sections=False)
            if dwarf.has_EH_CFI():
                for entry in dwarf.EH_CFI_entries():
                    header = getattr(entry, "header", None)
                    if header is not None and "initial_location" in header:
                        fdes.append((int(header["initial_location"]),
                                     int(header["address_range"])))
    except Exception:   # noqa: BLE001 - a damaged .eh_frame: the sections still tell
        fdes = []
    # an end where more code starts (another section, a described
    # function) is a call target like any other
    starts |= {start for start, length in fdes if length}
    return fdes, exidx, [e for e in ends if e not in starts]


def _quick_fdes(data: bytes, addr: int) -> list[tuple[int, int]] | None:
    """``(start, length)`` of the FDEs of an ``.eh_frame`` at ``addr`` whose
    every CIE says ``zR`` with pointers as 4-byte pc-relative signed values
    (``DW_EH_PE_pcrel | DW_EH_PE_sdata4``, what LLVM writes for these
    targets); None for any other layout (pyelftools reads it then)."""
    out: list[tuple[int, int]] = []
    at, n = 0, len(data)
    while at + 4 <= n:
        length = int.from_bytes(data[at:at + 4], "little")
        if length == 0:
            break                                   # terminator
        if length == 0xFFFFFFFF or at + 4 + length > n or length < 8:
            return None
        body = at + 4
        cie_ptr = int.from_bytes(data[body:body + 4], "little")
        if cie_ptr == 0:                            # a CIE
            aug_at = body + 5                       # after id and version
            end = data.find(b"\0", aug_at, body + length)
            if end < 0 or data[aug_at:end] != b"zR":
                return None
            # code and data alignment, return register (ULEB/SLEB, short),
            # augmentation length, then the FDE pointer encoding
            k = end + 1
            for _ in range(4):
                while k < body + length and data[k] & 0x80:
                    k += 1
                k += 1
            if k >= body + length or data[k] != 0x1B:
                return None
        else:
            start = int.from_bytes(data[body + 4:body + 8], "little", signed=True)
            size = int.from_bytes(data[body + 8:body + 12], "little")
            out.append(((addr + body + 4 + start) & 0xFFFFFFFFFFFFFFFF, size))
        at = body + length
    return out


def _sext(v: np.ndarray, bits: int) -> np.ndarray:
    v = v.astype(np.int64) & ((1 << bits) - 1)
    return np.where(v >= 1 << (bits - 1), v - (1 << bits), v)


def _call_targets(arch: str, code: bytes, vaddr: int) -> tuple[np.ndarray, np.ndarray]:
    """``(sites, targets)`` of the direct calls and jumps of ``code``
    (loaded at ``vaddr``), both int64 arrays of the file's addresses."""
    buf = np.frombuffer(code, np.uint8)
    n = len(buf)
    if arch == "x86_32" or arch == "x86_64":
        if n < 5:
            return np.empty(0, np.int64), np.empty(0, np.int64)
        pos = np.nonzero((buf[:n - 4] == 0xE8) | (buf[:n - 4] == 0xE9))[0]
        rel = (buf[pos + 1].astype(np.int64) | buf[pos + 2].astype(np.int64) << 8
               | buf[pos + 3].astype(np.int64) << 16 | buf[pos + 4].astype(np.int64) << 24)
        return vaddr + pos, vaddr + pos + 5 + _sext(rel, 32)
    if arch == "arm32":
        words = np.frombuffer(code[:n - n % 4], "<u4").astype(np.int64)
        pos = np.nonzero(((words >> 25) & 0x7) == 0x5)[0]      # B, BL (and BLX imm)
        pos = pos[(words[pos] >> 28) != 0xF]
        sites = vaddr + 4 * pos
        return sites, sites + 8 + (_sext(words[pos] & 0xFFFFFF, 24) << 2)
    if arch in ("riscv32", "riscv64"):
        if n < 4:
            return np.empty(0, np.int64), np.empty(0, np.int64)
        # every 2-byte offset (compressed code aligns 4-byte ones to 2); the
        # pair's second instruction read past the end as zeros
        lo = np.frombuffer(code[:n - n % 2] + bytes(8), "<u2").astype(np.int64)
        m = n // 2 - 1
        first = lo[:m] | lo[1:m + 1] << 16
        second = lo[2:m + 2] | lo[3:m + 3] << 16
        offs = 2 * np.arange(m, dtype=np.int64)
        # jal rd, imm
        jal = np.nonzero((first & 0x7F) == 0x6F)[0]
        w = first[jal]
        imm = (((w >> 31) & 1) << 20 | ((w >> 12) & 0xFF) << 12
               | ((w >> 20) & 1) << 11 | ((w >> 21) & 0x3FF) << 1)
        jal_t = vaddr + offs[jal] + _sext(imm, 21)
        # auipc rd, hi; jalr rd2, lo(rd)
        au = np.nonzero(((first & 0x7F) == 0x17) & ((second & 0x7F) == 0x67)
                        & (((second >> 12) & 0x7) == 0)
                        & (((first >> 7) & 0x1F) == ((second >> 15) & 0x1F)))[0]
        hi = _sext(first[au] >> 12, 20) << 12
        au_t = vaddr + offs[au] + hi + _sext(second[au] >> 20, 12)
        return (np.concatenate([vaddr + offs[jal], vaddr + offs[au]]),
                np.concatenate([jal_t, au_t]))
    return np.empty(0, np.int64), np.empty(0, np.int64)


def find_empty_calls(image) -> list[EmptyCall]:
    """The calls of ``image`` (an :class:`elfloader.image.ElfImage`) into
    functions of no code: one :class:`EmptyCall` per call site, and one with
    ``site=None`` for an empty function (an FDE of no length) that no
    decoded call reaches. ``[]`` for a library without such calls.

    A function of no code is where an FDE of ``.eh_frame`` has no length, or
    where two entries of ARM's ``.ARM.exidx`` start (the second function
    starts where the first does); and any call to the end of an executable
    section calls nothing (the linker's last unwind entry marks it on ARM).
    """
    fdes, exidx, ends = _unwind_facts(image)
    empty = sorted({start for start, length in fdes if length == 0})
    doubled = sorted({a for a, b in zip(exidx, exidx[1:]) if a == b})
    if not empty and not doubled and not ends:
        return []
    wanted = np.array(sorted(set(empty) | set(doubled) | set(ends)), np.int64)
    if fdes:
        ranges = sorted((s, s + ln) for s, ln in fdes if ln > 0)
    else:
        # ARM: each entry's function reaches to the next entry's start
        starts_ = sorted(set(exidx))
        ranges = list(zip(starts_, starts_[1:] + [max(ends, default=0)]))
    starts = np.array([r[0] for r in ranges], np.int64)
    stops = np.array([r[1] for r in ranges], np.int64)
    out: list[EmptyCall] = []
    found: set[int] = set()
    for seg in image.segments:
        if not seg.flags & 0x1 or not seg.filesz:        # PF_X
            continue
        code = image.data[seg.offset:seg.offset + seg.filesz]
        sites, targets = _call_targets(image.arch.name, code, seg.vaddr)
        for i in np.nonzero(np.isin(targets, wanted))[0]:
            site, target = int(sites[i]), int(targets[i])
            k = int(np.searchsorted(starts, site, "right")) - 1
            if not len(starts):      # no unwind table tells the functions
                out.append(EmptyCall(target, site, None))
                found.add(target)
                continue
            if k < 0 or site >= stops[k]:
                continue        # bytes outside every function: not code
            out.append(EmptyCall(target, site, int(starts[k])))
            found.add(target)
    out += [EmptyCall(t, None, None) for t in empty if t not in found]
    return out


def check_library(library) -> None:
    """Refuse a loaded :class:`hal_cpu.library.Executable` whose code calls
    a function of no code.

    Raises:
        EmptyFunctionError: naming the library's file (``name``; a library
            read from memory is ``<memory>``, which the program commands
            replace with the ``.vmfb`` path), the exports that make the
            calls, the function's address (``value``) and how to compile
            the program so that it links.
    """
    module = library.module
    image = module.image
    if image.arch.elf_class != 32:
        return
    calls = find_empty_calls(image)
    if not calls:
        return
    by_address = {e.address - module.base: e for e in library.exports}
    callers = []
    for c in calls:
        export = by_address.get(c.caller) if c.caller is not None else None
        what = (f"export {export.label}" if export is not None
                else f"the function at {c.caller:#x}" if c.caller is not None else None)
        if what and what not in callers:
            callers.append(what)
    target = calls[0].target
    where = (", ".join(callers[:4]) + (f" and {len(callers) - 4} more"
                                       if len(callers) > 4 else "")
             if callers else "its code")
    raise EmptyFunctionError(
        f"{where} call{'s' if len(callers) == 1 else ''} a function of no code at "
        f"{target:#x} ({image.arch.name}): iree-compile 3.13 leaves "
        f"{', '.join(KNOWN_EMPTY)} without a body in executables for 32-bit "
        f"targets (musl's wasm32 bitcode), so the call would run whatever "
        f"follows; {HOW_TO_LINK}",
        name=library.path, field="call", value=f"{target:#x}")
