"""A function's VM bytecode to a list of instructions.

:func:`decode` reads the bytes of one function (``FunctionDescriptor``'s
range of the module's bytecode) into :class:`Instruction` records, checking
every opcode, every field's bytes, register ordinals against the
function's register counts (when given) and every branch target (it must be
a block marker of the function). Anything wrong raises
:class:`BytecodeError` naming the function, the byte offset and the value.
"""

from __future__ import annotations

import struct
from typing import NoReturn

from . import isa
from .refs import VmError

__all__ = ["Instruction", "BytecodeError", "decode"]


class BytecodeError(VmError):
    """A function's bytecode is malformed: an unknown opcode, a truncated
    field, a register outside the function's register file, a branch to
    something not a block.

    Also an op whose operands have types it cannot take when it runs (a
    ref register read as an integer, a float where an integer is needed:
    what IREE's verifier refuses), found by the translator at load time
    or, for what only the running values show, when the op runs.

    Attributes:
        function: the function's name (printable); offset: byte offset
        within the function's bytecode of the instruction (or field)
        concerned; value: the offending value; op: the op's name
        (``vm.add.i32``) when known, else None.
    """

    def __init__(self, message: str, *, function: str = "?", offset: int = 0,
                 value=None, op: str | None = None):
        self.function, self.offset, self.op = function, offset, op
        what = f"{op}: " if op else ""
        super().__init__(f"{what}{message} (at bytecode offset 0x{offset:X})",
                         name=function, field=f"bytecode+0x{offset:X}",
                         value=value)


class Instruction:
    """One decoded instruction.

    Attributes:
        offset: byte offset of its first byte (the prefix byte of an
            extension op) within the function's bytecode.
        end: offset just past it.
        op: its :class:`~hal_cpu.programs.vm.isa.OpInfo`.
        args: the field values in ``op.fields`` order: ints for registers
            (ref registers keep their :data:`~hal_cpu.programs.vm.isa.REF_BIT` /
            :data:`~hal_cpu.programs.vm.isa.MOVE_BIT` bits), immediates and ordinals;
            ``str`` for strings; a tuple of ints for ``regs`` and
            ``sizes``; a tuple of
            (source, destination) pairs for ``remap``; a tuple of
            (target, remap) for ``cases``.
    """

    __slots__ = ("offset", "end", "op", "args")

    def __init__(self, offset: int, end: int, op: isa.OpInfo, args: tuple):
        self.offset, self.end, self.op, self.args = offset, end, op, args

    @property
    def name(self) -> str:
        """``vm.<mnemonic>``, as IREE's disassembly prints it."""
        return self.op.full_name

    def __repr__(self) -> str:
        return f"<{self.offset:08X} {self.name} {self.args!r}>"


_U16 = struct.Struct("<H").unpack_from
_U32 = struct.Struct("<I").unpack_from
_I32 = struct.Struct("<i").unpack_from
_I64 = struct.Struct("<q").unpack_from
_F32 = struct.Struct("<f").unpack_from
_F64 = struct.Struct("<d").unpack_from
_SCALARS = {"c_i32": (_I32, 4), "c_i64": (_I64, 8), "c_f32": (_F32, 4),
            "c_f64": (_F64, 8), "func": (_U32, 4), "global": (_U32, 4),
            "rodata": (_U32, 4), "type": (_U32, 4), "target": (_U32, 4),
            "u16": (_U16, 2)}
_WIDE = frozenset(("i64", "f64"))


def decode(bytecode, *, function: str = "?", i32_count: int | None = None,
           ref_count: int | None = None) -> list[Instruction]:
    """Decode one function's bytecode.

    Args:
        bytecode: the function's bytes (``bytes``, ``bytearray`` or
            ``memoryview``), offset 0 being its first block marker.
        function: its name, for errors.
        i32_count, ref_count: the function's register counts; when given,
            every register ordinal is checked against them.

    Returns:
        The instructions in order (block markers included, as
        ``vm.block``).

    Raises:
        BytecodeError: the bytes are not a valid function body.
    """
    data = bytes(bytecode)
    n = len(data)
    out: list[Instruction] = []
    pc = 0

    current: list = [None]      # the op being decoded, for messages

    def fail(msg: str, at: int, value: object = None) -> NoReturn:
        raise BytecodeError(msg, function=function, offset=at, value=value,
                            op=current[0])

    def need(at, size, what):
        if at + size > n:
            fail(f"truncated {what}: needs {size} bytes, "
                 f"{max(n - at, 0)} left", at, n)

    def check_reg(kind, reg, at):
        if kind == "ref" or (kind == "any" and reg & isa.REF_BIT):
            if not reg & isa.REF_BIT:
                fail(f"ref register operand 0x{reg:04X} lacks the ref bit", at, reg)
            if ref_count is not None and (reg & isa.REF_MASK) >= ref_count:
                fail(f"ref register {reg & isa.REF_MASK} outside the "
                     f"function's {ref_count} ref registers", at, reg)
        else:
            if reg & isa.REF_BIT:
                fail(f"{kind} register operand 0x{reg:04X} has the ref bit", at, reg)
            top = reg + (2 if kind in _WIDE else 1)
            if i32_count is not None and top > i32_count:
                fail(f"{kind} register {reg} outside the function's "
                     f"{i32_count} 32-bit registers", at, reg)

    def reg_list(at):
        at += at & 1
        need(at, 2, "register list count")
        count = _U16(data, at)[0]
        need(at + 2, 2 * count, "register list")
        regs = struct.unpack_from(f"<{count}H", data, at + 2)
        for r in regs:
            check_reg("any", r, at)
        return regs, at + 2 + 2 * count

    def remap_list(at):
        at += at & 1
        need(at, 2, "branch operand count")
        count = _U16(data, at)[0]
        need(at + 2, 4 * count, "branch operands")
        flat = struct.unpack_from(f"<{2 * count}H", data, at + 2)
        pairs = tuple(zip(flat[0::2], flat[1::2]))
        for s, d in pairs:
            check_reg("any", s, at)
            check_reg("any", d, at)
            if (s ^ d) & isa.REF_BIT:
                fail(f"branch operand moves register 0x{s:04X} to a register "
                     f"of the other kind 0x{d:04X}", at, d)
        return pairs, at + 2 + 4 * count

    targets: list[tuple[int, int]] = []   # (target, instruction offset)
    ops_core = isa.OPS[isa.CORE]
    while pc < n:
        start = pc
        opcode = data[pc]
        pc += 1
        table = ops_core
        ext = isa.PREFIXES.get(opcode)
        if ext is not None:
            need(pc, 1, f"{ext} opcode after its prefix")
            table = isa.OPS[ext]
            opcode = data[pc]
            pc += 1
        op = table.get(opcode)
        current[0] = None
        if op is None:
            fail(f"unknown {'core' if ext is None else ext} opcode 0x{opcode:02X}",
                 start, opcode)
        current[0] = op.full_name
        args = []
        for field in op.fields:
            kind = field.kind
            if kind in isa.REGISTER_KINDS:
                need(pc, 2, f"{field.name} register of vm.{op.name}")
                reg = _U16(data, pc)[0]
                check_reg(kind, reg, pc)
                args.append(reg)
                pc += 2
            elif kind in _SCALARS:
                unpack, size = _SCALARS[kind]
                need(pc, size, f"{field.name} of vm.{op.name}")
                value = unpack(data, pc)[0]
                if kind == "target":
                    targets.append((value, start))
                args.append(value)
                pc += size
            elif kind == "str":
                need(pc, 2, f"string length of vm.{op.name}")
                length = _U16(data, pc)[0]
                need(pc + 2, length, f"string of vm.{op.name}")
                args.append(data[pc + 2:pc + 2 + length].decode("utf-8", "replace"))
                pc += 2 + length
            elif kind == "regs":
                regs, pc = reg_list(pc)
                args.append(regs)
            elif kind == "sizes":
                at = pc + (pc & 1)
                need(at, 2, "segment size count")
                count = _U16(data, at)[0]
                need(at + 2, 2 * count, "segment sizes")
                args.append(struct.unpack_from(f"<{count}H", data, at + 2))
                pc = at + 2 + 2 * count
            elif kind == "remap":
                pairs, pc = remap_list(pc)
                args.append(pairs)
            elif kind == "cases":
                cases = []
                for _ in range(args[-1]):
                    need(pc, 4, f"case target of vm.{op.name}")
                    target = _U32(data, pc)[0]
                    targets.append((target, start))
                    pairs, pc = remap_list(pc + 4)
                    cases.append((target, pairs))
                args.append(tuple(cases))
            else:  # pragma: no cover - the table has no other kinds
                raise AssertionError(kind)
        out.append(Instruction(start, pc, op, tuple(args)))

    current[0] = None
    blocks = {ins.offset for ins in out if ins.op.opset == isa.CORE
              and ins.op.opcode == isa.BLOCK_OPCODE}
    for target, at in targets:
        if target not in blocks:
            fail(f"branch target 0x{target:X} is not a block of the function",
                 at, target)
    if out and not (out[0].op.opset == isa.CORE
                    and out[0].op.opcode == isa.BLOCK_OPCODE):
        fail("the function does not start with a block marker", 0, out[0].op.name)
    return out
