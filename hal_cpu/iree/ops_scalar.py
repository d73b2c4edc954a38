"""Handlers for the host program's scalar ops: ``arith``, ``affine`` and the
``util`` ops that compute on or pass through values.

Each handler takes the :class:`~hal_cpu.iree.reader.OpInfo` once, when a
function is prepared, and returns ``run(machine, regs)``, which reads its
operands from the register file ``regs`` and writes its results there.
Integers are their unsigned bits, floats are rounded to their type (see
:mod:`hal_cpu.iree.scalars`).
"""

from __future__ import annotations

import math

from .errors import EvaluationError
from .scalars import bits_float, float_bits, float_dtype, int_width, round_float, signed, wrap

__all__ = ["SCALAR_OPS"]


def _tdiv(a: int, b: int) -> int:
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b >= 0) else -q


def _zero_check(b: int):
    if b == 0:
        raise EvaluationError("integer division by zero")


_INT_BINARY = {
    "arith.addi": lambda a, b, w: a + b,
    "arith.subi": lambda a, b, w: a - b,
    "arith.muli": lambda a, b, w: a * b,
    "arith.divui": lambda a, b, w: (_zero_check(b), a // b)[1],
    "arith.divsi": lambda a, b, w: (_zero_check(b), _tdiv(signed(a, w), signed(b, w)))[1],
    "arith.ceildivui": lambda a, b, w: (_zero_check(b), -((-a) // b))[1],
    "arith.ceildivsi": lambda a, b, w: (_zero_check(b), -((-signed(a, w)) // signed(b, w)))[1],
    "arith.floordivsi": lambda a, b, w: (_zero_check(b), signed(a, w) // signed(b, w))[1],
    "arith.remui": lambda a, b, w: (_zero_check(b), a % b)[1],
    "arith.remsi": lambda a, b, w: (_zero_check(b), signed(a, w) - signed(b, w) * _tdiv(
        signed(a, w), signed(b, w)))[1],
    "arith.andi": lambda a, b, w: a & b,
    "arith.ori": lambda a, b, w: a | b,
    "arith.xori": lambda a, b, w: a ^ b,
    "arith.shli": lambda a, b, w: a << b if b < w else 0,
    "arith.shrui": lambda a, b, w: a >> b if b < w else 0,
    "arith.shrsi": lambda a, b, w: signed(a, w) >> min(b, w - 1),
    "arith.maxsi": lambda a, b, w: max(signed(a, w), signed(b, w)),
    "arith.minsi": lambda a, b, w: min(signed(a, w), signed(b, w)),
    "arith.maxui": lambda a, b, w: max(a, b),
    "arith.minui": lambda a, b, w: min(a, b),
}


def _fdiv(a: float, b: float) -> float:
    try:
        return a / b
    except ZeroDivisionError:
        if a != a or a == 0:
            return math.nan
        return math.copysign(math.inf, a) * math.copysign(1.0, b)


def _nan_max(a, b, pick):
    if a != a or b != b:
        return math.nan
    return pick(a, b)


_FLOAT_BINARY = {
    "arith.addf": lambda a, b: a + b,
    "arith.subf": lambda a, b: a - b,
    "arith.mulf": lambda a, b: a * b,
    "arith.divf": _fdiv,
    "arith.remf": lambda a, b: math.fmod(a, b) if b != 0 else math.nan,
    "arith.maximumf": lambda a, b: _nan_max(a, b, max),
    "arith.minimumf": lambda a, b: _nan_max(a, b, min),
    "arith.maxnumf": lambda a, b: b if a != a else a if b != b else max(a, b),
    "arith.minnumf": lambda a, b: b if a != a else a if b != b else min(a, b),
}

# arith.cmpi / arith.cmpf predicates, by their enum value
_CMPI = [
    lambda a, b, w: a == b, lambda a, b, w: a != b,
    lambda a, b, w: signed(a, w) < signed(b, w), lambda a, b, w: signed(a, w) <= signed(b, w),
    lambda a, b, w: signed(a, w) > signed(b, w), lambda a, b, w: signed(a, w) >= signed(b, w),
    lambda a, b, w: a < b, lambda a, b, w: a <= b, lambda a, b, w: a > b, lambda a, b, w: a >= b,
]


def _unordered(a, b):
    return a != a or b != b


_CMPF = [
    lambda a, b: False,
    lambda a, b: not _unordered(a, b) and a == b,
    lambda a, b: not _unordered(a, b) and a > b,
    lambda a, b: not _unordered(a, b) and a >= b,
    lambda a, b: not _unordered(a, b) and a < b,
    lambda a, b: not _unordered(a, b) and a <= b,
    lambda a, b: not _unordered(a, b) and a != b,
    lambda a, b: not _unordered(a, b),
    lambda a, b: _unordered(a, b) or a == b,
    lambda a, b: _unordered(a, b) or a > b,
    lambda a, b: _unordered(a, b) or a >= b,
    lambda a, b: _unordered(a, b) or a < b,
    lambda a, b: _unordered(a, b) or a <= b,
    lambda a, b: _unordered(a, b) or a != b,
    lambda a, b: _unordered(a, b),
    lambda a, b: True,
]


def _predicate(op) -> int:
    from iree.compiler import ir
    return ir.IntegerAttr(op.attr("predicate")).value


def _binary(op):
    (a, b), (out,) = op.operands, op.results
    ty = op.result_types[0]
    w = int_width(ty)
    if w is not None:
        return _int_binary(op.name, a, b, out, w)
    f = _FLOAT_BINARY.get(op.name)
    if f is None or float_dtype(ty) is None:
        return None

    def run(m, r):
        r[out] = round_float(f(r[a], r[b]), ty)
    return run


def _int_binary(name, a, b, out, w):
    f = _INT_BINARY.get(name)
    if f is None:
        return None

    def run(m, r):
        r[out] = wrap(f(r[a], r[b], w), w)
    return run


def _cmpi(op):
    (a, b), (out,) = op.operands, op.results
    w = int_width(op.operand_types[0])
    pred = _CMPI[_predicate(op)]
    if w is None:
        return None

    def run(m, r):
        r[out] = int(pred(r[a], r[b], w))
    return run


def _cmpf(op):
    (a, b), (out,) = op.operands, op.results
    pred = _CMPF[_predicate(op)]

    def run(m, r):
        r[out] = int(pred(r[a], r[b]))
    return run


def _select(op):
    (c, a, b), (out,) = op.operands, op.results

    def run(m, r):
        r[out] = r[a] if r[c] else r[b]
    return run


def _constant(op):
    from iree.compiler import ir
    attr = op.attr("value")
    (out,) = op.results
    ty = op.result_types[0]
    w = int_width(ty)
    value: int | float
    if w is not None and isinstance(attr, (ir.IntegerAttr, ir.BoolAttr)):
        value = wrap(int(attr.value), w)
    elif float_dtype(ty) is not None and isinstance(attr, ir.FloatAttr):
        value = round_float(attr.value, ty)
    else:
        return None

    def run(m, r):
        r[out] = value
    return run


def _cast(convert):
    def build(op):
        (a,), (out,) = op.operands, op.results
        src, dst = op.operand_types[0], op.result_types[0]
        f = convert(src, dst)
        if f is None:
            return None

        def run(m, r):
            r[out] = f(r[a])
        return run
    return build


def _int_to_int(keep_sign: bool):
    def convert(src, dst):
        ws, wd = int_width(src), int_width(dst)
        if ws is None or wd is None:
            return None
        if keep_sign:
            return lambda v: wrap(signed(v, ws), wd)
        return lambda v: wrap(v, wd)
    return convert


def _to_float(is_signed: bool):
    def convert(src, dst):
        ws = int_width(src)
        if ws is None or float_dtype(dst) is None:
            return None
        if is_signed:
            return lambda v: round_float(float(signed(v, ws)), dst)
        return lambda v: round_float(float(v), dst)
    return convert


def _from_float(src, dst):
    wd = int_width(dst)
    if wd is None or float_dtype(src) is None:
        return None

    def f(v):
        if v != v or v in (math.inf, -math.inf):
            raise EvaluationError(f"{v} does not convert to {dst}")
        return wrap(int(v), wd)
    return f


def _float_to_float(src, dst):
    if float_dtype(src) is None or float_dtype(dst) is None:
        return None
    return lambda v: round_float(v, dst)


def _bitcast(src, dst):
    ws, wd = int_width(src), int_width(dst)
    if ws is not None and wd is not None:
        return lambda v: v
    if float_dtype(src) is not None and wd is not None:
        return lambda v: float_bits(v, src)
    if ws is not None and float_dtype(dst) is not None:
        return lambda v: bits_float(v, dst)
    return None


def _negf(op):
    (a,), (out,) = op.operands, op.results

    def run(m, r):
        r[out] = -r[a]
    return run


def _passthrough(op):
    """Ops that only constrain the compiler (``util.optimization_barrier``,
    ``util.assume.int``...): results are the operands."""
    ins, outs = op.operands, op.results
    pairs = list(zip(outs, ins))

    def run(m, r):
        for o, i in pairs:
            r[o] = r[i]
    return run


def _align(op):
    (v, a), (out,) = op.operands, op.results
    w = int_width(op.result_types[0]) or 64

    def run(m, r):
        align = r[a]
        if align == 0:
            raise EvaluationError("util.align to 0")
        r[out] = wrap(-(-r[v] // align) * align, w)
    return run


def _cmp_ref(equal: bool):
    def build(op):
        (a, b), (out,) = op.operands, op.results

        def run(m, r):
            x, y = r[a], r[b]
            same = x is y or (x is None and y is None) or (
                not hasattr(x, "__array__") and x == y)
            r[out] = int(same == equal)
        return run
    return build


def _null(op):
    (out,) = op.results

    def run(m, r):
        r[out] = None
    return run


def _switch(op):
    """``util.switch``: ``values[index]``, else the default."""
    idx, default, *values = op.operands
    (out,) = op.results

    def run(m, r):
        i = r[idx]
        r[out] = r[values[i]] if i < len(values) else r[default]
    return run


# -- affine maps -------------------------------------------------------------

def _affine_expr(e, n_dims: int):
    """A closure ``f(vals) -> int`` for an MLIR affine expression (dims
    first, then symbols, in ``vals``)."""
    kind = type(e).__name__
    if kind == "AffineConstantExpr":
        c = e.value
        return lambda v: c
    if kind == "AffineDimExpr":
        p = e.position
        return lambda v: v[p]
    if kind == "AffineSymbolExpr":
        p = n_dims + e.position
        return lambda v: v[p]
    lhs, rhs = _affine_expr(e.lhs, n_dims), _affine_expr(e.rhs, n_dims)
    if kind == "AffineAddExpr":
        return lambda v: lhs(v) + rhs(v)
    if kind == "AffineMulExpr":
        return lambda v: lhs(v) * rhs(v)
    if kind == "AffineModExpr":
        return lambda v: lhs(v) % rhs(v)
    if kind == "AffineFloorDivExpr":
        return lambda v: lhs(v) // rhs(v)
    if kind == "AffineCeilDivExpr":
        return lambda v: -((-lhs(v)) // rhs(v))
    raise EvaluationError(f"unknown affine expression {e}")


def _affine(reduce):
    def build(op):
        from iree.compiler import ir
        amap = ir.AffineMapAttr(op.attr("map")).value
        exprs = [_affine_expr(e, amap.n_dims) for e in amap.results]
        ins, (out,) = op.operands, op.results

        def run(m, r):
            vals = [signed(r[i], 64) for i in ins]
            r[out] = wrap(reduce([f(vals) for f in exprs]), 64)
        return run
    return build


SCALAR_OPS = {
    **{name: _binary for name in list(_INT_BINARY) + list(_FLOAT_BINARY)},
    "arith.cmpi": _cmpi,
    "arith.cmpf": _cmpf,
    "arith.select": _select,
    "arith.constant": _constant,
    "arith.index_cast": _cast(_int_to_int(True)),
    "arith.extsi": _cast(_int_to_int(True)),
    "arith.index_castui": _cast(_int_to_int(False)),
    "arith.extui": _cast(_int_to_int(False)),
    "arith.trunci": _cast(_int_to_int(False)),
    "arith.sitofp": _cast(_to_float(True)),
    "arith.uitofp": _cast(_to_float(False)),
    "arith.fptosi": _cast(_from_float),
    "arith.fptoui": _cast(_from_float),
    "arith.extf": _cast(_float_to_float),
    "arith.truncf": _cast(_float_to_float),
    "arith.bitcast": _cast(_bitcast),
    "arith.negf": _negf,
    "affine.apply": _affine(lambda xs: xs[0]),
    "affine.min": _affine(min),
    "affine.max": _affine(max),
    "util.optimization_barrier": _passthrough,
    "util.assume.int": _passthrough,
    "util.cast": _passthrough,
    "util.numeric.optional_narrow": _passthrough,
    "util.align": _align,
    "util.cmp.eq": _cmp_ref(True),
    "util.cmp.ne": _cmp_ref(False),
    "util.null": _null,
    "util.switch": _switch,
}
