"""A tiny assembler for the six architectures: just what the ``code``
target plants in a kernel's code to make Linux system calls.

A :class:`Program` is a straight sequence: registers loaded with constants
or with the address of data carried right after the code (found
pc-relatively, so the sequence works wherever it lands), small arrays of
pointers and integers built on the stack (``argv``, ``socketcall``
arguments), the system-call instruction, and a return. Every instruction
has a fixed length, so one pass lays the code out and a second resolves
the data addresses.

Registers are named by their role (:class:`Regs`): ``arg0``..``arg5``,
``nr`` (the system-call number, as :attr:`elfloader.arch.Arch.syscalls`
names it), ``ret`` (the result), ``scratch``.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass


@dataclass(frozen=True)
class Regs:
    args: tuple
    nr: int
    ret: int
    scratch: int


def _w(*words: int) -> bytes:
    return struct.pack("<%dI" % len(words), *(w & 0xFFFFFFFF for w in words))


class Asm:
    """Encodings of one architecture (subclasses)."""
    name = "?"
    ptr = 8
    regs: Regs
    align = 4           # of the data labels (and of the code for fixed widths)
    adr_len = 0

    def li(self, reg: int, value: int) -> bytes:
        raise NotImplementedError

    def adr(self, reg: int, delta: int) -> bytes:
        """``reg`` = address of this instruction + ``delta``."""
        raise NotImplementedError

    def sub_sp(self, n: int) -> bytes:
        raise NotImplementedError

    def add_sp(self, n: int) -> bytes:
        raise NotImplementedError

    def store_sp(self, reg: int, off: int) -> bytes:
        raise NotImplementedError

    def mov_sp(self, reg: int) -> bytes:
        raise NotImplementedError

    def mov(self, rd: int, rs: int) -> bytes:
        raise NotImplementedError

    def syscall(self) -> bytes:
        raise NotImplementedError

    def ret(self) -> bytes:
        raise NotImplementedError

    def loop(self) -> bytes:
        """A branch to itself."""
        raise NotImplementedError


# --- x86 -------------------------------------------------------------------------
class X86_64(Asm):
    name, ptr, align, adr_len = "x86_64", 8, 4, 7
    # rdi rsi rdx r10 r8 r9; rax; rax; r11
    regs = Regs((7, 6, 2, 10, 8, 9), 0, 0, 11)

    def li(self, reg, value):
        value &= (1 << 64) - 1
        if value < 1 << 32:     # mov r32, imm32 (zero-extends)
            return (b"\x41" if reg >= 8 else b"") + bytes([0xB8 + (reg & 7)]) + \
                struct.pack("<I", value)
        return bytes([0x48 | (reg >= 8), 0xB8 + (reg & 7)]) + struct.pack("<Q", value)

    def adr(self, reg, delta):  # lea reg, [rip + disp32]
        return bytes([0x48 | ((reg >= 8) << 2), 0x8D, ((reg & 7) << 3) | 5]) + \
            struct.pack("<i", delta - 7)

    def sub_sp(self, n):
        return bytes([0x48, 0x83, 0xEC, n])

    def add_sp(self, n):
        return bytes([0x48, 0x83, 0xC4, n])

    def store_sp(self, reg, off):  # mov [rsp+off], reg
        return bytes([0x48 | ((reg >= 8) << 2), 0x89, 0x44 | ((reg & 7) << 3), 0x24, off])

    def mov_sp(self, reg):  # mov reg, rsp
        return bytes([0x48 | (reg >= 8), 0x89, 0xE0 | (reg & 7)])

    def mov(self, rd, rs):
        return bytes([0x48 | (rd >= 8) | ((rs >= 8) << 2), 0x89,
                      0xC0 | ((rs & 7) << 3) | (rd & 7)])

    def syscall(self):
        return b"\x0f\x05"

    def ret(self):
        return b"\xc3"

    def loop(self):
        return b"\xeb\xfe"

    def call_reg(self, reg):  # call reg
        return (b"\x41" if reg >= 8 else b"") + bytes([0xFF, 0xD0 | (reg & 7)])


class X86_32(Asm):
    name, ptr, align, adr_len = "x86_32", 4, 4, 12
    # ebx ecx edx esi edi ebp; eax; eax; edx is free before the arguments
    regs = Regs((3, 1, 2, 6, 7, 5), 0, 0, 2)

    def li(self, reg, value):
        return bytes([0xB8 + reg]) + struct.pack("<I", value & 0xFFFFFFFF)

    def adr(self, reg, delta):  # call +0; pop reg; add reg, imm32
        return b"\xe8\x00\x00\x00\x00" + bytes([0x58 + reg, 0x81, 0xC0 + reg]) + \
            struct.pack("<i", delta - 5)

    def sub_sp(self, n):
        return bytes([0x83, 0xEC, n])

    def add_sp(self, n):
        return bytes([0x83, 0xC4, n])

    def store_sp(self, reg, off):  # mov [esp+off], reg
        return bytes([0x89, 0x44 | (reg << 3), 0x24, off])

    def mov_sp(self, reg):
        return bytes([0x89, 0xE0 | reg])

    def mov(self, rd, rs):
        return bytes([0x89, 0xC0 | (rs << 3) | rd])

    def syscall(self):
        return b"\xcd\x80"

    def ret(self):
        return b"\xc3"

    def loop(self):
        return b"\xeb\xfe"


# --- arm -------------------------------------------------------------------------
class AArch64(Asm):
    name, ptr, align, adr_len = "aarch64", 8, 4, 4
    regs = Regs((0, 1, 2, 3, 4, 5), 8, 0, 9)

    def li(self, reg, value):
        value &= (1 << 64) - 1
        inv = ~value & ((1 << 64) - 1)
        if inv < 1 << 16:                       # movn
            return _w(0x92800000 | inv << 5 | reg)
        out, first = [], True
        for hw in range(4):
            chunk = (value >> (16 * hw)) & 0xFFFF
            if chunk or (hw == 0 and value == 0):
                out.append((0xD2800000 if first else 0xF2800000) | hw << 21 |
                           chunk << 5 | reg)
                first = False
        return _w(*out)

    def adr(self, reg, delta):
        return _w(0x10000000 | (delta & 3) << 29 | ((delta >> 2) & 0x7FFFF) << 5 | reg)

    def sub_sp(self, n):
        return _w(0xD1000000 | n << 10 | 31 << 5 | 31)

    def add_sp(self, n):
        return _w(0x91000000 | n << 10 | 31 << 5 | 31)

    def store_sp(self, reg, off):  # str reg, [sp, #off]
        return _w(0xF9000000 | (off // 8) << 10 | 31 << 5 | reg)

    def mov_sp(self, reg):  # add reg, sp, #0
        return _w(0x91000000 | 31 << 5 | reg)

    def mov(self, rd, rs):  # orr rd, xzr, rs
        return _w(0xAA0003E0 | rs << 16 | rd)

    def syscall(self):
        return _w(0xD4000001)

    def ret(self):
        return _w(0xD65F03C0)

    def loop(self):
        return _w(0x14000000)


class Arm32(Asm):
    """A32 (ARM state) encodings; the number goes in r7 (EABI)."""
    name, ptr, align, adr_len = "arm32", 4, 4, 4
    regs = Regs((0, 1, 2, 3, 4, 5), 7, 0, 12)

    def li(self, reg, value):
        value &= 0xFFFFFFFF
        lo, hi = value & 0xFFFF, value >> 16
        out = [0xE3000000 | (lo >> 12) << 16 | reg << 12 | (lo & 0xFFF)]   # movw
        if hi:
            out.append(0xE3400000 | (hi >> 12) << 16 | reg << 12 | (hi & 0xFFF))  # movt
        return _w(*out)

    def adr(self, reg, delta):  # add reg, pc, #(delta - 8); pc reads 8 ahead
        off = delta - 8
        assert 0 <= off <= 1020 and off % 4 == 0, off
        return _w(0xE28F0F00 | reg << 12 | (off >> 2))

    def sub_sp(self, n):
        return _w(0xE24DD000 | n)

    def add_sp(self, n):
        return _w(0xE28DD000 | n)

    def store_sp(self, reg, off):
        return _w(0xE58D0000 | reg << 12 | off)

    def mov_sp(self, reg):
        return _w(0xE1A0000D | reg << 12)

    def mov(self, rd, rs):
        return _w(0xE1A00000 | rd << 12 | rs)

    def syscall(self, imm: int = 0):
        return _w(0xEF000000 | (imm & 0xFFFFFF))

    def ret(self):
        return _w(0xE12FFF1E)

    def loop(self):
        return _w(0xEAFFFFFE)


# --- riscv -----------------------------------------------------------------------
def _i(imm, rs1, f3, rd, op):
    return (imm & 0xFFF) << 20 | rs1 << 15 | f3 << 12 | rd << 7 | op


class RiscV(Asm):
    name, ptr, align, adr_len = "riscv64", 8, 4, 8
    regs = Regs((10, 11, 12, 13, 14, 15), 17, 10, 5)

    def __init__(self, ptr: int = 8):
        self.ptr = ptr
        self.name = "riscv64" if ptr == 8 else "riscv32"

    def li(self, reg, value):
        if self.ptr == 4:
            value &= 0xFFFFFFFF
            if value >= 1 << 31:
                value -= 1 << 32
        else:
            value &= (1 << 64) - 1
            if value >= 1 << 63:
                value -= 1 << 64
        if self.ptr == 8 and not -(1 << 31) <= value < (1 << 31) - 0x800:
            # rv64: the upper bits first, then shift in the low 12
            lo = ((value & 0xFFF) ^ 0x800) - 0x800
            return self.li(reg, (value - lo) >> 12) + _w(_i(12, reg, 1, reg, 0x13)) + \
                (_w(_i(lo, reg, 0, reg, 0x13)) if lo else b"")
        if -2048 <= value < 2048:
            return _w(_i(value, 0, 0, reg, 0x13))
        hi = ((value + 0x800) >> 12) & 0xFFFFF
        lo = value - (((value + 0x800) >> 12) << 12)
        return _w(hi << 12 | reg << 7 | 0x37, _i(lo, reg, 0, reg, 0x13))

    def adr(self, reg, delta):  # auipc reg, hi; addi reg, reg, lo
        hi = ((delta + 0x800) >> 12) & 0xFFFFF
        lo = delta - (((delta + 0x800) >> 12) << 12)
        return _w(hi << 12 | reg << 7 | 0x17, _i(lo, reg, 0, reg, 0x13))

    def sub_sp(self, n):
        return _w(_i(-n, 2, 0, 2, 0x13))

    def add_sp(self, n):
        return _w(_i(n, 2, 0, 2, 0x13))

    def store_sp(self, reg, off):  # sd / sw reg, off(sp)
        f3 = 3 if self.ptr == 8 else 2
        return _w((off >> 5) << 25 | reg << 20 | 2 << 15 | f3 << 12 | (off & 31) << 7 | 0x23)

    def mov_sp(self, reg):
        return _w(_i(0, 2, 0, reg, 0x13))

    def mov(self, rd, rs):
        return _w(_i(0, rs, 0, rd, 0x13))

    def syscall(self):
        return _w(0x00000073)

    def ret(self):
        return _w(0x00008067)

    def loop(self):
        return _w(0x0000006F)


ASSEMBLERS = {"x86_64": X86_64(), "x86_32": X86_32(), "aarch64": AArch64(),
              "arm32": Arm32(), "riscv64": RiscV(8), "riscv32": RiscV(4)}


# --- programs --------------------------------------------------------------------
class Program:
    """A planted sequence: code, then the data it points at."""

    #: Bytes of stack each :meth:`array` or :meth:`buffer` takes.
    FRAME = 64

    def __init__(self, asm: Asm):
        self.asm = asm
        self.code: list = []        # bytes, or (length, fn(pc, labels) -> bytes)
        self.data: list = []        # (label, bytes)
        self.stack = 0

    @property
    def r(self) -> Regs:
        return self.asm.regs

    def arg(self, i: int) -> int:
        return self.r.args[i]

    def emit(self, raw: bytes) -> "Program":
        self.code.append(raw)
        return self

    def li(self, reg: int, value: int) -> "Program":
        return self.emit(self.asm.li(reg, value))

    def adr(self, reg: int, label: str) -> "Program":
        asm = self.asm
        self.code.append((asm.adr_len, lambda pc, labels: asm.adr(reg, labels[label] - pc)))
        return self

    def string(self, label: str, raw: bytes) -> str:
        self.data.append((label, raw))
        return label

    def _frame(self) -> None:
        self.emit(self.asm.sub_sp(self.FRAME))
        self.stack += self.FRAME

    def array(self, reg: int, items) -> "Program":
        """``reg`` = address of an array of pointer-sized items built on the
        stack: ``("ptr", label)``, ``("int", value)`` or ``("ret",)`` (the
        last system call's result)."""
        asm, ps = self.asm, self.asm.ptr
        self._frame()
        for i, item in enumerate(items):
            if item[0] == "ret":
                self.emit(asm.store_sp(self.r.ret, i * ps))
                continue
            if item[0] == "ptr":
                self.adr(self.r.scratch, item[1])
            else:
                self.li(self.r.scratch, item[1])
            self.emit(asm.store_sp(self.r.scratch, i * ps))
        return self.emit(asm.mov_sp(reg))

    def buffer(self, reg: int) -> "Program":
        """``reg`` = address of :attr:`FRAME` bytes of stack."""
        self._frame()
        return self.emit(self.asm.mov_sp(reg))

    def ret_to(self, reg: int) -> "Program":
        """Copy the last result to ``reg``."""
        if reg != self.r.ret:
            self.emit(self.asm.mov(reg, self.r.ret))
        return self

    def syscall(self, number: int | None = None) -> "Program":
        if number is not None:
            self.li(self.r.nr, number)
        return self.emit(self.asm.syscall())

    def ret(self) -> "Program":
        """Give the stack back and return to the caller."""
        while self.stack:
            self.emit(self.asm.add_sp(self.FRAME))
            self.stack -= self.FRAME
        return self.emit(self.asm.ret())

    def assemble(self) -> bytes:
        size = sum(len(c) if isinstance(c, bytes) else c[0] for c in self.code)
        a = self.asm.align
        at = -(-size // a) * a
        labels, blobs = {}, []
        for label, raw in self.data:
            labels[label] = at
            blobs.append((at, raw))
            at += -(-len(raw) // a) * a
        out = bytearray()
        for c in self.code:
            out += c if isinstance(c, bytes) else c[1](len(out), labels)
        assert len(out) == size
        out += b"\0" * (-len(out) % a)
        for at, raw in blobs:
            out += b"\0" * (at - len(out)) + raw
        return bytes(out)


# --- a loop over descriptors -------------------------------------------------------
def _rel8(delta: int) -> bytes:
    assert -128 <= delta < 128, delta
    return bytes([delta & 0xFF])


def _b_type(off: int, rs1: int, rs2: int, f3: int) -> int:
    imm = off & 0x1FFF
    return (((imm >> 12) & 1) << 31 | ((imm >> 5) & 0x3F) << 25 | rs2 << 20 | rs1 << 15 |
            f3 << 12 | ((imm >> 1) & 0xF) << 8 | ((imm >> 11) & 1) << 7 | 0x63)


def dup_over_read_ends(arch: str, lo: int, hi: int, nr_write: int, nr_dup3: int) -> bytes:
    """Code that, for each descriptor ``lo <= k < hi`` that refuses a
    zero-byte ``write(k, sp, 0)`` (a pipe's read end, or none), makes ``k``
    a copy of descriptor 0 with ``dup3(0, k, 0)``: the guest agent's
    request pipe becomes ``/dev/null`` while its reply pipe, its memory
    file and stdout/stderr stay. The counter lives in a register the
    system calls keep (r12, edi, x19, r6, s2)."""
    assert 0 <= lo < hi < 128
    if arch == "x86_64":
        dup = b"\x31\xff" + b"\x4c\x89\xe6" + b"\x31\xd2" + b"\xb8" + \
            struct.pack("<I", nr_dup3) + b"\x0f\x05"
        body = (b"\x4c\x89\xe7" + b"\x48\x89\xe6" + b"\x31\xd2" + b"\xb8" +
                struct.pack("<I", nr_write) + b"\x0f\x05" + b"\x48\x85\xc0" +
                b"\x79" + _rel8(len(dup)) + dup + b"\x49\xff\xc4" + b"\x49\x83\xfc" +
                bytes([hi]))
        return b"\x41\xbc" + struct.pack("<I", lo) + body + b"\x7c" + _rel8(-(len(body) + 2))
    if arch == "x86_32":
        dup = b"\x31\xdb" + b"\x89\xf9" + b"\x31\xd2" + b"\xb8" + \
            struct.pack("<I", nr_dup3) + b"\xcd\x80"
        body = (b"\x89\xfb" + b"\x89\xe1" + b"\x31\xd2" + b"\xb8" + struct.pack("<I", nr_write) +
                b"\xcd\x80" + b"\x85\xc0" + b"\x79" + _rel8(len(dup)) + dup + b"\x47" +
                b"\x83\xff" + bytes([hi]))
        return b"\xbf" + struct.pack("<I", lo) + body + b"\x7c" + _rel8(-(len(body) + 2))
    if arch == "aarch64":
        a = AArch64()
        dup = [0xD2800000, 0xAA1303E1, 0xD2800002, 0xD2800008 | nr_dup3 << 5, 0xD4000001]
        body = [0xAA1303E0, 0x910003E1, 0xD2800002, 0xD2800008 | nr_write << 5, 0xD4000001,
                0xB6F80000 | (len(dup) + 1) << 5] + dup + [0x91000673, 0xF100027F | hi << 10]
        back = -(len(body)) & 0x7FFFF
        return a.li(19, lo) + _w(*body, 0x54000000 | back << 5 | 0xB)
    if arch == "arm32":
        a = Arm32()
        dup = [0xE3000000, 0xE1A01006, 0xE3002000] + \
            [struct.unpack("<I", a.li(7, nr_dup3))[0], 0xEF000000]
        body = [0xE1A00006, 0xE1A0100D, 0xE3002000,
                struct.unpack("<I", a.li(7, nr_write))[0], 0xEF000000, 0xE3500000,
                0xAA000000 | (len(dup) - 1)] + dup + [0xE2866001, 0xE3560000 | hi]
        back = (-(len(body) + 2)) & 0xFFFFFF     # to the loop's start, from pc + 8
        return a.li(6, lo) + _w(*body, 0xBA000000 | back)
    if arch in ("riscv64", "riscv32"):
        dup = [_i(0, 0, 0, 10, 0x13), _i(0, 18, 0, 11, 0x13), _i(0, 0, 0, 12, 0x13),
               _i(nr_dup3, 0, 0, 17, 0x13), 0x00000073]
        body = [_i(0, 18, 0, 10, 0x13), _i(0, 2, 0, 11, 0x13), _i(0, 0, 0, 12, 0x13),
                _i(nr_write, 0, 0, 17, 0x13), 0x00000073,
                _b_type(4 * (len(dup) + 1), 10, 0, 5)] + dup + \
            [_i(1, 18, 0, 18, 0x13), _i(hi, 0, 0, 5, 0x13)]
        loop = _b_type(-4 * len(body), 18, 5, 4)
        return _w(_i(lo, 0, 0, 18, 0x13), *body, loop)
    raise ValueError(arch)
