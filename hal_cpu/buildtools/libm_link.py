"""The linker iree-compile runs for 32-bit targets: ``iree-lld`` plus our libm.

    python libm_link.py LLD LIBM_OBJECT [--redirect=NAME=TARGET ...] [lld arguments...]

iree-compile 3.13 links musl's math functions into every embedded ELF as
bitcode it built for wasm32 (for every 32-bit target). In that bitcode
``fmaf``, ``floor`` and ``round`` have no body (it is ``unreachable``): each
becomes a local function of zero bytes in its own section of the object
iree-compile hands to the linker, and a call to it runs whatever the linker
places next (or the bytes past the end of ``.text``). Functions LLVM calls
that the bitcode lacks (``fmaxf``, ``fminf``, ``truncf``...) make the link
fail with "undefined symbol".

iree-compile runs this script in place of ``iree-lld``
(``--iree-llvmcpu-embedded-linker-path``, see
:func:`hal_cpu.programs.compiler.libm_linker_flags`). For each relocatable
object of ``LIBM_OBJECT``'s machine it is given, it points every relocation
in code or data that names such an empty function (by its symbol or its
section's symbol) at a new undefined symbol of the same name, and every one
that names a local function ``NAME`` of a ``--redirect`` at a new undefined
symbol ``TARGET`` (a replacement with another calling convention); then it
runs ``iree-lld`` with the same arguments plus ``LIBM_OBJECT``
(``hal_cpu/runtime/libm.c`` built for the target, from ``libm.sos``), which
defines those functions. An empty function that is called but that the
object does not define fails the link with a message naming it. On RISC-V
``LIBM_OBJECT`` (built for ilp32, integer registers) is given the float-ABI
flag of the objects it joins: iree-compile's rv32 code calls its support
functions with floats in integer registers (``--iree-llvmcpu-target-abi=
ilp32``) but marks its objects single-float when the CPU has ``+f``, and
``ld.lld`` refuses to join objects of different flags. Objects of
another machine (iree-compile also links, with the same linker, the code it
evaluates at compile time on the host) are linked as they are. Only the
standard library is used: this runs once per linked executable.
"""

from __future__ import annotations

import os
import struct
import subprocess
import sys
import tempfile

ELF_MAGIC = b"\x7fELF"
ET_REL = 1
SHT_PROGBITS, SHT_SYMTAB, SHT_RELA, SHT_REL = 1, 2, 4, 9
SHF_ALLOC = 0x2
STT_NOTYPE, STT_FUNC, STT_SECTION = 0, 2, 3
STB_LOCAL, STB_GLOBAL = 0, 1
STV_HIDDEN = 2
SHN_UNDEF, SHN_LORESERVE = 0, 0xFF00
EM_RISCV = 243
EF_RISCV_FLOAT_ABI = 0x6


class LinkError(Exception):
    """An object this script cannot repair; the message says why."""


class Obj:
    """A little-endian ELF relocatable object: section headers and symbols."""

    def __init__(self, data: bytes, name: str):
        self.name = name
        self.data = bytearray(data)
        if data[:4] != ELF_MAGIC or data[5] != 1:
            raise LinkError(f"{name}: not a little-endian ELF file")
        self.bits = {1: 32, 2: 64}[data[4]]
        b32 = self.bits == 32
        self.type, self.machine = struct.unpack_from("<HH", data, 16)
        self.flags_at = 36 if b32 else 48
        self.flags, = struct.unpack_from("<I", data, self.flags_at)
        if b32:
            shoff, = struct.unpack_from("<I", data, 32)
            shentsize, shnum = struct.unpack_from("<HH", data, 46)
            self.shdr_fmt = "<IIIIIIIIII"
            self.sym_fmt, self.sym_size = "<IIIBBH", 16
        else:
            shoff, = struct.unpack_from("<Q", data, 40)
            shentsize, shnum = struct.unpack_from("<HH", data, 58)
            self.shdr_fmt = "<IIQQQQIIQQ"
            self.sym_fmt, self.sym_size = "<IBBHQQ", 24
        self.shoff, self.shentsize = shoff, shentsize
        self.sections = [list(struct.unpack_from(self.shdr_fmt, data, shoff + i * shentsize))
                         for i in range(shnum)]
        symtabs = [i for i, s in enumerate(self.sections) if s[1] == SHT_SYMTAB]
        if len(symtabs) != 1:
            raise LinkError(f"{name}: {len(symtabs)} symbol tables, expected one")
        self.symtab = symtabs[0]
        sh = self.sections[self.symtab]
        self.strtab = self.sections[sh[6]]
        off, size = sh[4], sh[5]
        self.symbols = [self._sym(off + i * self.sym_size)
                        for i in range(size // self.sym_size)]

    def _sym(self, at: int) -> dict:
        v = struct.unpack_from(self.sym_fmt, self.data, at)
        if self.bits == 32:
            name, value, size, info, other, shndx = v
        else:
            name, info, other, shndx, value, size = v
        return {"name": name, "value": value, "size": size, "info": info,
                "other": other, "shndx": shndx}

    def pack_sym(self, s: dict) -> bytes:
        if self.bits == 32:
            return struct.pack(self.sym_fmt, s["name"], s["value"], s["size"],
                               s["info"], s["other"], s["shndx"])
        return struct.pack(self.sym_fmt, s["name"], s["info"], s["other"],
                           s["shndx"], s["value"], s["size"])

    def section_name(self, index: int) -> str:
        """The name of section ``index`` (``""`` when unreadable)."""
        shstrndx, = struct.unpack_from("<H", self.data, 50 if self.bits == 32 else 62)
        if shstrndx >= len(self.sections):
            return ""
        start = self.sections[shstrndx][4] + self.sections[index][0]
        end = self.data.find(b"\0", start)
        return self.data[start:end].decode("utf-8", "replace") if end >= 0 else ""

    def string(self, index: int) -> str:
        start = self.strtab[4] + index
        end = self.data.index(b"\0", start)
        return self.data[start:end].decode("utf-8", "replace")

    def defined_globals(self) -> set[str]:
        return {self.string(s["name"]) for s in self.symbols[1:]
                if s["info"] >> 4 != STB_LOCAL
                and SHN_UNDEF < s["shndx"] < SHN_LORESERVE}

    def empty_functions(self) -> dict[int, tuple[str, int]]:
        """Symbol index -> (function name, its st_name) for every symbol that
        stands for a function of zero bytes: a FUNC symbol in an empty
        section, and that section's own symbol."""
        by_section: dict[int, tuple[str, int]] = {}
        for s in self.symbols[1:]:
            shndx = s["shndx"]
            if (s["info"] & 0xF == STT_FUNC and SHN_UNDEF < shndx < SHN_LORESERVE
                    and shndx < len(self.sections)
                    and self.sections[shndx][1] == SHT_PROGBITS
                    and self.sections[shndx][5] == 0):
                by_section.setdefault(shndx, (self.string(s["name"]), s["name"]))
        out = {}
        for i, s in enumerate(self.symbols):
            if i and s["shndx"] in by_section and s["info"] & 0xF in (STT_FUNC, STT_SECTION):
                out[i] = by_section[s["shndx"]]
        return out

    def relocations(self):
        """(section index, entry offset, entry size, RELA?) of every
        relocation of allocated sections against this symbol table."""
        for i, s in enumerate(self.sections):
            if s[1] not in (SHT_REL, SHT_RELA) or s[6] != self.symtab:
                continue
            target = s[7]
            if target >= len(self.sections) or not self.sections[target][2] & SHF_ALLOC:
                continue    # debug information: left as it is
            if self.section_name(target) == ".eh_frame":
                # the empty function's frame description keeps naming it:
                # the linker drops both (nothing else keeps it), rather
                # than leave an FDE of no length at the replacement
                continue
            entsize = s[9] or ((8 if s[1] == SHT_REL else 12) if self.bits == 32
                               else (16 if s[1] == SHT_REL else 24))
            for at in range(s[4], s[4] + s[5] - entsize + 1, entsize):
                yield i, at

    def r_sym(self, at: int) -> int:
        if self.bits == 32:
            return struct.unpack_from("<I", self.data, at + 4)[0] >> 8
        return struct.unpack_from("<Q", self.data, at + 8)[0] >> 32

    def set_r_sym(self, at: int, sym: int) -> None:
        if self.bits == 32:
            (info,) = struct.unpack_from("<I", self.data, at + 4)
            struct.pack_into("<I", self.data, at + 4, (sym << 8) | (info & 0xFF))
        else:
            (info,) = struct.unpack_from("<Q", self.data, at + 8)
            struct.pack_into("<Q", self.data, at + 8, (sym << 32) | (info & 0xFFFFFFFF))


def redirect_empty_functions(data: bytes, name: str, provided: set[str],
                             redirects: dict[str, str] | None = None
                             ) -> tuple[bytes, list[str]]:
    """``data`` with each relocation against an empty function pointed at a
    new undefined (hidden, global) symbol of the same name, and each one
    against a defined local function ``NAME`` of ``redirects`` at a new
    undefined symbol ``redirects[NAME]``; returns the bytes and the names
    of the new symbols (none: the bytes unchanged).

    Raises:
        LinkError: a relocation names an empty function not in ``provided``.
    """
    obj = Obj(data, name)
    if obj.type != ET_REL:
        return data, []
    targets = {i: (fname, fname) for i, (fname, _) in obj.empty_functions().items()}
    for i, s in enumerate(obj.symbols):
        if (i and s["info"] & 0xF == STT_FUNC and s["info"] >> 4 == STB_LOCAL
                and i not in targets):
            fname = obj.string(s["name"])
            if redirects and fname in redirects:
                targets[i] = (fname, redirects[fname])
    if not targets:
        return data, []
    new_index: dict[str, int] = {}
    new_syms: list[bytes] = []
    new_strings = bytearray()
    strtab_size = obj.strtab[5]
    for _, at in obj.relocations():
        sym = obj.r_sym(at)
        if sym not in targets:
            continue
        fname, target = targets[sym]
        if target not in provided:
            raise LinkError(
                f"{name}: the code calls {fname}, which iree-compile's libm "
                f"for this target defines with no body (a call would run "
                f"whatever code follows it), and hal_cpu's libm does not "
                f"provide it" if fname == target else
                f"{name}: {target}, the replacement of {fname}, is not in "
                f"hal_cpu's libm")
        if target not in new_index:
            new_index[target] = len(obj.symbols) + len(new_syms)
            new_syms.append(obj.pack_sym({
                "name": strtab_size + len(new_strings), "value": 0, "size": 0,
                "info": (STB_GLOBAL << 4) | STT_NOTYPE, "other": STV_HIDDEN,
                "shndx": SHN_UNDEF}))
            new_strings += target.encode() + b"\0"
        obj.set_r_sym(at, new_index[target])
    if not new_syms:
        return data, []
    align = 8 if obj.bits == 64 else 4
    # the symbol and string tables, grown, move to the end of the file
    for index, extra in ((obj.symtab, b"".join(new_syms)),
                         (obj.sections[obj.symtab][6], bytes(new_strings))):
        sh = obj.sections[index]
        table = bytes(obj.data[sh[4]:sh[4] + sh[5]]) + extra
        obj.data += bytes(-len(obj.data) % align)
        sh[4], sh[5] = len(obj.data), len(table)
        obj.data += table
        struct.pack_into(obj.shdr_fmt, obj.data, obj.shoff + index * obj.shentsize, *sh)
    return bytes(obj.data), sorted(new_index)


def _is_relocatable(path: str) -> bool:
    try:
        with open(path, "rb") as f:
            head = f.read(18)
    except OSError:
        return False
    return (len(head) == 18 and head[:4] == ELF_MAGIC and head[5] == 1
            and struct.unpack_from("<H", head, 16)[0] == ET_REL)


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print("usage: libm_link.py LLD LIBM_OBJECT [--redirect=NAME=TARGET ...] "
              "[lld arguments...]", file=sys.stderr)
        return 2
    lld, libm, args = argv[0], argv[1], list(argv[2:])
    redirects = {}
    while args and args[0].startswith("--redirect="):
        fname, _, target = args.pop(0)[len("--redirect="):].partition("=")
        redirects[fname] = target
    with open(libm, "rb") as f:
        lib = Obj(f.read(), libm)
    provided = lib.defined_globals()
    with tempfile.TemporaryDirectory(prefix="hal_cpu_libm_link_") as tmp:
        out, ours, float_abi = [], False, None
        for i, arg in enumerate(args):
            if arg.startswith("-") or not _is_relocatable(arg):
                out.append(arg)
                continue
            with open(arg, "rb") as f:
                data = f.read()
            obj = Obj(data, arg)
            if (obj.machine, obj.bits) != (lib.machine, lib.bits):
                out.append(arg)     # code for another machine: as it is
                continue
            ours = True
            float_abi = obj.flags & EF_RISCV_FLOAT_ABI
            try:
                fixed, names = redirect_empty_functions(data, arg, provided, redirects)
            except LinkError as exc:
                print(f"error: {exc}", file=sys.stderr)
                return 1
            if names:
                arg = os.path.join(tmp, f"{i}_{os.path.basename(arg)}")
                with open(arg, "wb") as f:
                    f.write(fixed)
            out.append(arg)
        if (ours and lib.machine == EM_RISCV and float_abi is not None
                and lib.flags & EF_RISCV_FLOAT_ABI != float_abi):
            flagged = bytearray(lib.data)
            struct.pack_into("<I", flagged, lib.flags_at,
                             (lib.flags & ~EF_RISCV_FLOAT_ABI) | float_abi)
            libm = os.path.join(tmp, "libm.o")
            with open(libm, "wb") as f:
                f.write(flagged)
        return subprocess.run([lld, *out, *([libm] if ours else [])]).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
