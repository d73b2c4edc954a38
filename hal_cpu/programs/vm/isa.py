"""The VM bytecode's instruction set (version 17.0), as data.

Every instruction is an opcode byte followed by its fields in a fixed order;
the ops of the extension sets (``ExtF32``, ``ExtF64``) follow a prefix byte
of the core set (``0xE0``, ``0xE1``) that names the set. Each op here is an
:class:`OpInfo`: its opcode set, opcode, mnemonic (the name after ``vm.``)
and its fields, each a :class:`Field` of one of the kinds below.

Field kinds and their bytes (all little endian):

* register operands and results, 2 bytes each: ``i32``, ``i64``, ``f32``,
  ``f64`` index the 32-bit register file (an ``i64``/``f64`` value takes the
  even register named and the one after it); ``ref`` indexes the ref
  registers with bit 15 (:data:`REF_BIT`) set and bit 14 (:data:`MOVE_BIT`)
  set when the op may take the value (its last use).
* immediates: ``c_i32``/``c_f32`` 4 bytes, ``c_i64``/``c_f64`` 8 bytes,
  ``u16`` 2 bytes; ``func`` (a function ordinal, bit 31 set for an import),
  ``global`` (a byte offset into the globals, or a ref global ordinal),
  ``rodata`` (a read-only data ordinal), ``type`` (a type table ordinal),
  ``target`` (the byte offset of the target block's marker): 4 bytes each;
  ``str``: a 2-byte length and that many bytes of UTF-8.
* lists, each aligned to 2 bytes (one zero byte of padding when the list
  would start at an odd offset) and led by a 2-byte count: ``regs`` (that
  many registers), ``sizes`` (that many 2-byte numbers: the segment
  sizes of a variadic call, 0xFFFF for an argument that is not a
  variadic segment), ``remap`` (that many source/destination register pairs,
  a 64-bit value moved as its two halves), ``cases`` (a branch table: the
  count is the preceding ``u16`` field; each case a ``target`` and a
  ``remap``).

``BLOCK`` (core opcode 121) is a one-byte marker that starts every block;
branch targets point at it.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Field", "OpInfo", "CORE", "EXT_F32", "EXT_F64", "PREFIXES",
           "OPS", "BY_NAME", "REF_BIT", "MOVE_BIT", "REF_MASK",
           "IMPORT_BIT", "BLOCK_OPCODE", "BYTECODE_VERSION", "FIELD_SIZES"]

BYTECODE_VERSION = (17, 0)

REF_BIT = 0x8000
MOVE_BIT = 0x4000
REF_MASK = 0x3FFF
I32_MASK = 0x7FFF
IMPORT_BIT = 0x80000000
BLOCK_OPCODE = 121

CORE, EXT_F32, EXT_F64 = "core", "ext_f32", "ext_f64"
#: prefix opcode (in the core set) -> the extension set it selects
PREFIXES = {0xE0: EXT_F32, 0xE1: EXT_F64}

#: bytes of the fixed-size field kinds
FIELD_SIZES = {"i32": 2, "i64": 2, "f32": 2, "f64": 2, "ref": 2,
               "c_i32": 4, "c_f32": 4, "c_i64": 8, "c_f64": 8, "u16": 2,
               "func": 4, "global": 4, "rodata": 4, "type": 4, "target": 4}
REGISTER_KINDS = frozenset(("i32", "i64", "f32", "f64", "ref"))


@dataclass(frozen=True)
class Field:
    """One field of an instruction: ``name``, ``kind`` (see the module
    docstring) and ``write`` (True for a result register)."""
    name: str
    kind: str
    write: bool = False


@dataclass(frozen=True)
class OpInfo:
    """One op: ``opset`` (``core``, ``ext_f32``, ``ext_f64``), ``opcode``
    (within its set), ``name`` (the mnemonic, e.g. ``add.i32``; the
    disassembly prints ``vm.<name>``), ``fields`` in byte order."""
    opset: str
    opcode: int
    name: str
    fields: tuple[Field, ...]

    @property
    def full_name(self) -> str:
        return "vm." + self.name


def _f(spec: str) -> tuple[Field, ...]:
    """Fields from ``"kind name, kind >name, ..."`` (``>`` marks a result)."""
    out = []
    for part in spec.split(","):
        part = part.strip()
        if not part:
            continue
        kind, name = part.split()
        write = name.startswith(">")
        out.append(Field(name.lstrip(">"), kind, write))
    return tuple(out)


# operand shapes, by the bank ``t`` of their values
def _unary(t): return _f(f"{t} operand, {t} >result")
def _binary(t): return _f(f"{t} lhs, {t} rhs, {t} >result")
def _ternary(t): return _f(f"{t} a, {t} b, {t} c, {t} >result")
def _shift(t): return _f(f"{t} operand, i32 amount, {t} >result")
def _cmp1(t): return _f(f"{t} operand, i32 >result")
def _cmp2(t): return _f(f"{t} lhs, {t} rhs, i32 >result")
def _conv(a, b): return _f(f"{a} operand, {b} >result")
def _gload(t): return _f(f"global offset, {t} >result")
def _gstore(t): return _f(f"global offset, {t} value")
def _gload_ind(t): return _f(f"i32 offset, {t} >result")
def _gstore_ind(t): return _f(f"i32 offset, {t} value")
def _const(t): return _f(f"c_{t} value, {t} >result")
def _zero(t): return _f(f"{t} >result")
def _lget(t): return _f(f"ref list, i32 index, {t} >result")
def _lset(t): return _f(f"ref list, i32 index, {t} value")
def _bload(t): return _f(f"ref buffer, i64 offset, {t} >result")
def _bstore(t): return _f(f"ref buffer, i64 offset, {t} value")
def _bfill(t): return _f(f"ref buffer, i64 offset, i64 length, {t} value")
def _select(t): return _f(f"i32 condition, {t} true_value, {t} false_value, {t} >result")
def _switch(t): return _f(f"i32 index, {t} default, regs values, {t} >result")


_BRANCH = _f("target dest, remap operands")
_CALL = _f("func callee, regs operands, regs >results")
_CALL_V = _f("func callee, sizes segments, regs operands, regs >results")
_CALL_Y = _f("func callee, regs operands, target dest, regs >results")
_CALL_VY = _f("func callee, sizes segments, regs operands, target dest, regs >results")
_TRACE = _f("str name, regs operands")

# (opcode, mnemonic, fields) of the core set
_CORE_OPS = [
    (0, "global.load.i32", _gload("i32")),
    (1, "global.store.i32", _gstore("i32")),
    (2, "global.load.indirect.i32", _gload_ind("i32")),
    (3, "global.store.indirect.i32", _gstore_ind("i32")),
    (4, "global.load.i64", _gload("i64")),
    (5, "global.store.i64", _gstore("i64")),
    (6, "global.load.indirect.i64", _gload_ind("i64")),
    (7, "global.store.indirect.i64", _gstore_ind("i64")),
    (8, "global.load.ref", _f("global ordinal, type type, ref >result")),
    (9, "global.store.ref", _f("global ordinal, type type, ref value")),
    (10, "global.load.indirect.ref", _f("i32 ordinal, type type, ref >result")),
    (11, "global.store.indirect.ref", _f("i32 ordinal, type type, ref value")),
    (12, "const.i32.zero", _zero("i32")),
    (13, "const.i32", _const("i32")),
    (14, "const.i64.zero", _zero("i64")),
    (15, "const.i64", _const("i64")),
    (16, "const.ref.zero", _zero("ref")),
    (17, "const.ref.rodata", _f("rodata ordinal, ref >result")),
    (18, "list.alloc", _f("type element_type, i32 capacity, ref >result")),
    (19, "list.reserve", _f("ref list, i32 capacity")),
    (20, "list.size", _f("ref list, i32 >result")),
    (21, "list.resize", _f("ref list, i32 size")),
    (22, "list.get.i32", _lget("i32")),
    (23, "list.set.i32", _lset("i32")),
    (24, "list.get.i64", _lget("i64")),
    (25, "list.set.i64", _lset("i64")),
    (26, "list.get.ref", _f("ref list, i32 index, type type, ref >result")),
    (27, "list.set.ref", _lset("ref")),
    (28, "select.i32", _select("i32")),
    (29, "select.i64", _select("i64")),
    (30, "select.ref", _f("i32 condition, type type, ref true_value, "
                          "ref false_value, ref >result")),
    (31, "switch.i32", _switch("i32")),
    (32, "switch.i64", _switch("i64")),
    (33, "switch.ref", _f("i32 index, type type, ref default, regs values, "
                          "ref >result")),
    (34, "add.i32", _binary("i32")),
    (35, "sub.i32", _binary("i32")),
    (36, "mul.i32", _binary("i32")),
    (37, "div.i32.s", _binary("i32")),
    (38, "div.i32.u", _binary("i32")),
    (39, "rem.i32.s", _binary("i32")),
    (40, "rem.i32.u", _binary("i32")),
    (41, "fma.i32", _ternary("i32")),
    (42, "add.i64", _binary("i64")),
    (43, "sub.i64", _binary("i64")),
    (44, "mul.i64", _binary("i64")),
    (45, "div.i64.s", _binary("i64")),
    (46, "div.i64.u", _binary("i64")),
    (47, "rem.i64.s", _binary("i64")),
    (48, "rem.i64.u", _binary("i64")),
    (49, "fma.i64", _ternary("i64")),
    (50, "not.i32", _unary("i32")),
    (51, "and.i32", _binary("i32")),
    (52, "or.i32", _binary("i32")),
    (53, "xor.i32", _binary("i32")),
    (54, "not.i64", _unary("i64")),
    (55, "and.i64", _binary("i64")),
    (56, "or.i64", _binary("i64")),
    (57, "xor.i64", _binary("i64")),
    (58, "shl.i32", _shift("i32")),
    (59, "shr.i32.s", _shift("i32")),
    (60, "shr.i32.u", _shift("i32")),
    (61, "shl.i64", _shift("i64")),
    (62, "shr.i64.s", _shift("i64")),
    (63, "shr.i64.u", _shift("i64")),
    (64, "trunc.i32.i8", _unary("i32")),
    (65, "trunc.i32.i16", _unary("i32")),
    (66, "trunc.i64.i32", _conv("i64", "i32")),
    (67, "ext.i8.i32.s", _unary("i32")),
    (68, "ext.i8.i32.u", _unary("i32")),
    (69, "ext.i16.i32.s", _unary("i32")),
    (70, "ext.i16.i32.u", _unary("i32")),
    (71, "ext.i32.i64.s", _conv("i32", "i64")),
    (72, "ext.i32.i64.u", _conv("i32", "i64")),
    (73, "cmp.eq.i32", _cmp2("i32")),
    (74, "cmp.ne.i32", _cmp2("i32")),
    (75, "cmp.lt.i32.s", _cmp2("i32")),
    (76, "cmp.lt.i32.u", _cmp2("i32")),
    (77, "cmp.nz.i32", _cmp1("i32")),
    (78, "cmp.eq.i64", _cmp2("i64")),
    (79, "cmp.ne.i64", _cmp2("i64")),
    (80, "cmp.lt.i64.s", _cmp2("i64")),
    (81, "cmp.lt.i64.u", _cmp2("i64")),
    (82, "cmp.nz.i64", _cmp1("i64")),
    (83, "cmp.eq.ref", _cmp2("ref")),
    (84, "cmp.ne.ref", _cmp2("ref")),
    (85, "cmp.nz.ref", _cmp1("ref")),
    (86, "br", _BRANCH),
    (87, "cond_br", _f("i32 condition, target true_dest, remap true_operands, "
                       "target false_dest, remap false_operands")),
    (88, "call", _CALL),
    (89, "call.variadic", _CALL_V),
    (90, "return", _f("regs operands")),
    (91, "fail", _f("i32 status, str message")),
    (92, "import.resolved", _f("func callee, i32 >result")),
    (93, "yield", _BRANCH),
    (94, "trace", _TRACE),
    (95, "print", _TRACE),
    (96, "cond_break", _f("i32 condition, target dest, remap operands")),
    (97, "break", _BRANCH),
    (98, "buffer.load.i8.u", _bload("i32")),
    (99, "buffer.load.i8.s", _bload("i32")),
    (100, "buffer.load.i16.u", _bload("i32")),
    (101, "buffer.load.i16.s", _bload("i32")),
    (102, "buffer.load.i32", _bload("i32")),
    (103, "buffer.load.i64", _bload("i64")),
    (104, "buffer.store.i8", _bstore("i32")),
    (105, "buffer.store.i16", _bstore("i32")),
    (106, "buffer.store.i32", _bstore("i32")),
    (107, "buffer.store.i64", _bstore("i64")),
    (108, "buffer.alloc", _f("i64 length, i32 alignment, ref >result")),
    (109, "buffer.clone", _f("ref source, i64 offset, i64 length, "
                             "i32 alignment, ref >result")),
    (110, "buffer.length", _f("ref buffer, i64 >result")),
    (111, "buffer.copy", _f("ref source, i64 source_offset, ref target, "
                            "i64 target_offset, i64 length")),
    (112, "buffer.compare", _f("ref lhs, i64 lhs_offset, ref rhs, "
                               "i64 rhs_offset, i64 length, i32 >result")),
    (113, "buffer.fill.i8", _bfill("i32")),
    (114, "buffer.fill.i16", _bfill("i32")),
    (115, "buffer.fill.i32", _bfill("i32")),
    (116, "buffer.fill.i64", _bfill("i64")),
    (117, "ctlz.i32", _unary("i32")),
    (118, "ctlz.i64", _unary("i64")),
    (119, "abs.i32", _unary("i32")),
    (120, "abs.i64", _unary("i64")),
    (121, "block", ()),
    (122, "min.i32.s", _binary("i32")),
    (123, "min.i32.u", _binary("i32")),
    (124, "max.i32.s", _binary("i32")),
    (125, "max.i32.u", _binary("i32")),
    (126, "min.i64.s", _binary("i64")),
    (127, "min.i64.u", _binary("i64")),
    (128, "max.i64.s", _binary("i64")),
    (129, "max.i64.u", _binary("i64")),
    (130, "cast.any.ref", _f("ref operand, type type, ref >result")),
    (131, "br_table", _f("i32 index, target default_dest, remap default_operands, "
                         "u16 count, cases cases")),
    (132, "buffer.hash", _f("ref buffer, i64 offset, i64 length, i64 >result")),
    (133, "discard.refs", _f("regs refs")),
    (134, "assign.ref", _f("ref source, ref >result")),
    (135, "call.yieldable", _CALL_Y),
    (136, "call.variadic.yieldable", _CALL_VY),
]


def _float_ops(t: str, extra: list) -> list:
    """The ops the two float extension sets share, in their common order
    (opcodes 0-19), then ``extra`` (opcode, mnemonic, fields) entries."""
    common = [
        (0, f"global.load.{t}", _gload(t)),
        (1, f"global.store.{t}", _gstore(t)),
        (2, f"global.load.indirect.{t}", _gload_ind(t)),
        (3, f"global.store.indirect.{t}", _gstore_ind(t)),
        (4, f"const.{t}.zero", _zero(t)),
        (5, f"const.{t}", _const(t)),
        (6, f"list.get.{t}", _lget(t)),
        (7, f"list.set.{t}", _lset(t)),
        (8, f"select.{t}", _select(t)),
        (9, f"switch.{t}", _switch(t)),
        (10, f"add.{t}", _binary(t)),
        (11, f"sub.{t}", _binary(t)),
        (12, f"mul.{t}", _binary(t)),
        (13, f"div.{t}", _binary(t)),
        (14, f"rem.{t}", _binary(t)),
        (15, f"fma.{t}", _ternary(t)),
        (16, f"abs.{t}", _unary(t)),
        (17, f"neg.{t}", _unary(t)),
        (18, f"ceil.{t}", _unary(t)),
        (19, f"floor.{t}", _unary(t)),
    ]
    return common + extra


def _math_ops(t: str, first: int) -> list:
    """atan .. erf, then the comparisons, buffer ops, round/min/max."""
    u, b = _unary(t), _binary(t)
    names = [("atan", u), ("atan2", b), ("cos", u), ("sin", u), ("exp", u),
             ("exp2", u), ("expm1", u), ("log", u), ("log10", u), ("log1p", u),
             ("log2", u), ("pow", b), ("rsqrt", u), ("sqrt", u), ("tanh", u),
             ("erf", u)]
    out = [(first + i, f"{n}.{t}", fl) for i, (n, fl) in enumerate(names)]
    n = first + len(names)
    for cmp in ("eq", "ne", "lt", "lte"):
        out.append((n, f"cmp.{cmp}.{t}.o", _cmp2(t)))
        out.append((n + 1, f"cmp.{cmp}.{t}.u", _cmp2(t)))
        n += 2
    out += [(n, f"cmp.nan.{t}", _cmp1(t)),
            (n + 1, f"buffer.load.{t}", _bload(t)),
            (n + 2, f"buffer.store.{t}", _bstore(t)),
            (n + 3, f"buffer.fill.{t}", _bfill(t)),
            (n + 4, f"round.{t}", u),
            (n + 5, f"min.{t}", b),
            (n + 6, f"max.{t}", b),
            (n + 7, f"round.{t}.even", u)]
    return out


_EXT_F32_OPS = _float_ops("f32", [
    (20, "cast.si32.f32", _conv("i32", "f32")),
    (21, "cast.ui32.f32", _conv("i32", "f32")),
    (22, "cast.f32.si32", _conv("f32", "i32")),
    (23, "cast.f32.ui32", _conv("f32", "i32")),
    (24, "bitcast.i32.f32", _conv("i32", "f32")),
    (25, "bitcast.f32.i32", _conv("f32", "i32")),
]) + _math_ops("f32", 26) + [
    (58, "cast.f32.si64", _conv("f32", "i64")),
    (59, "cast.f32.ui64", _conv("f32", "i64")),
    (60, "cast.si64.f32", _conv("i64", "f32")),
    (61, "cast.ui64.f32", _conv("i64", "f32")),
]

_EXT_F64_OPS = _float_ops("f64", [
    (20, "trunc.f64.f32", _conv("f64", "f32")),
    (21, "ext.f32.f64", _conv("f32", "f64")),
    (22, "cast.si32.f64", _conv("i32", "f64")),
    (23, "cast.ui32.f64", _conv("i32", "f64")),
    (24, "cast.f64.si32", _conv("f64", "i32")),
    (25, "cast.f64.ui32", _conv("f64", "i32")),
    (26, "cast.si64.f64", _conv("i64", "f64")),
    (27, "cast.ui64.f64", _conv("i64", "f64")),
    (28, "cast.f64.si64", _conv("f64", "i64")),
    (29, "cast.f64.ui64", _conv("f64", "i64")),
    (30, "bitcast.i64.f64", _conv("i64", "f64")),
    (31, "bitcast.f64.i64", _conv("f64", "i64")),
]) + _math_ops("f64", 32)


def _table(opset: str, entries: list) -> dict[int, OpInfo]:
    table: dict[int, OpInfo] = {}
    for opcode, name, fields in entries:
        assert opcode not in table and 0 <= opcode < 256, (opset, opcode)
        table[opcode] = OpInfo(opset, opcode, name, fields)
    return table


#: opcode set -> {opcode: OpInfo}
OPS: dict[str, dict[int, OpInfo]] = {
    CORE: _table(CORE, _CORE_OPS),
    EXT_F32: _table(EXT_F32, _EXT_F32_OPS),
    EXT_F64: _table(EXT_F64, _EXT_F64_OPS),
}
assert not set(PREFIXES) & set(OPS[CORE])

#: mnemonic -> OpInfo
BY_NAME: dict[str, OpInfo] = {op.name: op for t in OPS.values() for op in t.values()}
assert len(BY_NAME) == sum(len(t) for t in OPS.values())
