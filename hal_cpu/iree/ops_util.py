"""Handlers for host data of the ``util`` dialect: byte buffers
(``!util.buffer``: constants the module carries, strings, host scratch) and
lists (``!util.list``).

:func:`attribute_bytes` gives the bytes of a constant attribute as IREE lays
them out: dense elements in row-major order, a ``#util.composite`` as its
parts one after another, a string as its bytes.
"""

from __future__ import annotations

import re

import numpy as np

from .device import HostBuffer
from .errors import EvaluationError
from .scalars import element_dtype, element_name, pack_scalar, scalar_size, unpack_scalar

__all__ = ["UTIL_OPS", "attribute_bytes"]


def _ir():
    from iree.compiler import ir
    return ir


def _split_top_level(text: str) -> list[str]:
    """Split at commas outside brackets and strings."""
    parts, depth, cur, in_str, i = [], 0, [], False, 0
    while i < len(text):
        c = text[i]
        if in_str:
            cur.append(c)
            if c == "\\" and i + 1 < len(text):
                cur.append(text[i + 1])
                i += 1
            elif c == '"':
                in_str = False
        elif c == '"':
            in_str = True
            cur.append(c)
        elif c in "([{<":
            depth += 1
            cur.append(c)
        elif c in ")]}>" and not (c == ">" and cur and cur[-1] == "-"):
            depth -= 1
            cur.append(c)
        elif c == "," and depth == 0:
            parts.append("".join(cur).strip())
            cur = []
        else:
            cur.append(c)
        i += 1
    if "".join(cur).strip():
        parts.append("".join(cur).strip())
    return parts


def _dense_bytes(attr) -> bytes:
    ir = _ir()
    shaped = ir.ShapedType(attr.type)
    ety = element_name(str(shaped.element_type))
    count = int(np.prod(shaped.shape, dtype=np.int64)) if shaped.rank else 1
    try:
        arr = np.array(attr)
        if arr.dtype == np.bool_ or arr.dtype.kind in "iuf":
            if attr.is_splat and arr.size != count:
                arr = np.full(count, arr.reshape(-1)[0], arr.dtype)
            return arr.astype(arr.dtype.newbyteorder("<")).tobytes()
    except (TypeError, ValueError):
        pass
    # numpy and the bindings hold no sub-byte integers, bf16 or 8-bit
    # floats: take the printed literal's hex bytes, or read the same literal
    # as i8 / f32 and convert
    text = str(attr)
    literal, _, type_text = text.rpartition(":")
    body = literal.strip()[len("dense<"):-1].strip()
    sub_byte = ety[:1] == "i" and ety[1:].isdigit() and int(ety[1:]) < 8
    if body.startswith('"0x'):
        return bytes.fromhex(body[3:-1])
    wide_type = "i8" if sub_byte else "f32"
    wide = ir.Attribute.parse(f"{literal}: {type_text.strip()[:-len(ety) - 1]}{wide_type}>",
                              attr.context)
    values = np.array(wide).reshape(-1)
    if values.size != count:
        values = np.full(count, values[0])
    if sub_byte:
        # packed low bits first, as IREE packs them
        bits = int(ety[1:])
        acc = 0
        for k, v in enumerate(values.tolist()):
            acc |= (int(v) & ((1 << bits) - 1)) << (k * bits)
        return acc.to_bytes(-(-count * bits // 8), "little")
    dt = element_dtype(ety)
    if dt is None or dt.kind == "c":
        raise EvaluationError(f"constant of element type {ety} is not supported: "
                              f"{text[:100]}")
    return values.astype(dt).tobytes()


_NUMBER = re.compile(r"[-+]?(?:\d+\.?\d*(?:[eE][-+]?\d+)?|inf|nan)")


def _complex_bytes(text: str) -> bytes:
    """Dense ``complex<f32|f64>`` elements: the bindings cannot even hold
    such an attribute, so its printed literal (pairs, a splat pair, or hex
    bytes) is read."""
    literal, _, type_text = text.rpartition(":")
    body = literal.strip()[len("dense<"):-1].strip()
    part = np.float64 if "complex<f64>" in type_text else np.float32
    dims = re.findall(r"(\d+)x", type_text.strip())
    count = int(np.prod([int(d) for d in dims], dtype=np.int64)) if dims else 1
    if body.startswith('"0x'):
        data = bytes.fromhex(body[3:-1])
        if len(data) == 2 * np.dtype(part).itemsize:
            data *= count
        return data
    values = [float(v) for v in _NUMBER.findall(body)]
    if len(values) == 2:
        values *= count
    if len(values) != 2 * count:
        raise EvaluationError(f"cannot read complex constant {text[:100]}")
    return np.array(values, part).tobytes()


def _is_complex(text: str) -> bool:
    return text.startswith("dense<") and "complex<" in text.rpartition(":")[2]


def attribute_bytes(attr) -> bytes:
    """Bytes of a constant attribute (see the module docstring).

    Raises:
        EvaluationError: an attribute kind the interpreter does not lay out.
    """
    ir = _ir()
    if isinstance(attr, ir.StringAttr):
        return attr.value_bytes
    text = str(attr)
    if isinstance(attr, ir.DenseElementsAttr):
        return _dense_bytes(attr)
    if text.startswith("#util.composite<"):
        body = text[len("#util.composite<"):-1]
        size_text, _, rest = body.partition(",")
        total = int(size_text.strip().split("x")[0])
        rest = rest.strip()
        if not (rest.startswith("[") and rest.endswith("]")):
            raise EvaluationError(f"cannot read {text[:100]}")
        data = b"".join(_complex_bytes(p) if _is_complex(p) else
                        attribute_bytes(ir.Attribute.parse(p, attr.context))
                        for p in _split_top_level(rest[1:-1]))
        if len(data) != total:
            raise EvaluationError(f"#util.composite of {total} bytes holds {len(data)}")
        return data
    raise EvaluationError(f"constant attribute not supported: {text[:100]}")


def _host(value, what: str) -> HostBuffer:
    if not isinstance(value, HostBuffer):
        raise EvaluationError(f"{what} is {value!r}, not a util.buffer")
    return value


def _range(buf: HostBuffer, off: int, n: int, what: str) -> np.ndarray:
    if off < 0 or n < 0 or off + n > buf.data.size:
        raise EvaluationError(f"{what}: [{off}, {off + n}) outside a "
                              f"{buf.data.size}-byte util.buffer")
    return buf.data[off:off + n]


def _buffer_constant(op):
    data = np.frombuffer(attribute_bytes(op.attr("value")), np.uint8).copy()
    data.flags.writeable = False
    (out,) = op.results

    def run(m, r):
        r[out] = HostBuffer(data)
    return run


def _buffer_alloc(op):
    (size,), (out,) = op.operands[:1], op.results

    def run(m, r):
        r[out] = HostBuffer(np.zeros(r[size], np.uint8))
    return run


def _buffer_size(op):
    (src,), (out,) = op.operands, op.results

    def run(m, r):
        r[out] = _host(r[src], "util.buffer.size operand").data.size
    return run


def _buffer_subspan(op):
    v = op.view
    src, off, n = op.slot(v.source), op.slot(v.source_offset), op.slot(v.result_size)
    (out,) = op.results

    def run(m, r):
        r[out] = HostBuffer(_range(_host(r[src], "subspan source"), r[off], r[n], "subspan"))
    return run


def _buffer_load(op):
    v = op.view
    src, off = op.slot(v.source), op.slot(v.source_offset)
    (out,) = op.results
    ty = op.result_types[0]
    size = scalar_size(ty)

    def run(m, r):
        r[out] = unpack_scalar(_range(_host(r[src], "load source"), r[off], size,
                                      "util.buffer.load").tobytes(), ty)
    return run


def _buffer_store(op):
    v = op.view
    val, dst, off = op.slot(v.source), op.slot(v.target), op.slot(v.target_offset)
    ty = str(v.source.type)

    def run(m, r):
        data = pack_scalar(r[val], ty)
        _range(_host(r[dst], "store target"), r[off], len(data),
               "util.buffer.store")[:] = np.frombuffer(data, np.uint8)
    return run


def _buffer_copy(op):
    v = op.view
    src, soff = op.slot(v.source), op.slot(v.source_offset)
    dst, doff, n = op.slot(v.target), op.slot(v.target_offset), op.slot(v.length)

    def run(m, r):
        data = _range(_host(r[src], "copy source"), r[soff], r[n], "util.buffer.copy").copy()
        _range(_host(r[dst], "copy target"), r[doff], r[n], "util.buffer.copy")[:] = data
    return run


def _buffer_fill(op):
    v = op.view
    pat, dst, off, n = (op.slot(v.pattern), op.slot(v.target), op.slot(v.target_offset),
                        op.slot(v.length))
    ty = str(v.pattern.type)

    def run(m, r):
        p = pack_scalar(r[pat], ty)
        t = _range(_host(r[dst], "fill target"), r[off], r[n], "util.buffer.fill")
        t[:] = np.frombuffer(p * (-(-t.size // len(p))), np.uint8)[:t.size]
    return run


def _buffer_compare(op):
    v = op.view
    a, aoff = op.slot(v.lhs), op.slot(v.lhs_offset)
    b, boff, n = op.slot(v.rhs), op.slot(v.rhs_offset), op.slot(v.length)
    (out,) = op.results

    def run(m, r):
        x = _range(_host(r[a], "compare lhs"), r[aoff], r[n], "util.buffer.compare")
        y = _range(_host(r[b], "compare rhs"), r[boff], r[n], "util.buffer.compare")
        r[out] = int(bool(np.array_equal(x, y)))
    return run


# -- lists ---------------------------------------------------------------------

def _list_create(op):
    (out,) = op.results

    def run(m, r):
        r[out] = []
    return run


def _list_size(op):
    (lst,), (out,) = op.operands, op.results

    def run(m, r):
        r[out] = len(r[lst])
    return run


def _list_resize(op):
    lst, n = op.operands

    def run(m, r):
        items, size = r[lst], r[n]
        del items[size:]
        items.extend([None] * (size - len(items)))
    return run


def _list_get(op):
    (lst, idx), (out,) = op.operands, op.results

    def run(m, r):
        items, i = r[lst], r[idx]
        if i >= len(items):
            raise EvaluationError(f"util.list.get of item {i} of a {len(items)}-item list")
        r[out] = items[i]
    return run


def _list_set(op):
    lst, idx, val = op.operands

    def run(m, r):
        items, i = r[lst], r[idx]
        if i >= len(items):
            raise EvaluationError(f"util.list.set of item {i} of a {len(items)}-item list")
        items[i] = r[val]
    return run


def _list_construct(op):
    ins, (out,) = op.operands, op.results

    def run(m, r):
        r[out] = [r[i] for i in ins]
    return run


UTIL_OPS = {
    "util.buffer.constant": _buffer_constant,
    "util.buffer.alloc": _buffer_alloc,
    "util.buffer.size": _buffer_size,
    "util.buffer.subspan": _buffer_subspan,
    "util.buffer.load": _buffer_load,
    "util.buffer.store": _buffer_store,
    "util.buffer.copy": _buffer_copy,
    "util.buffer.fill": _buffer_fill,
    "util.buffer.compare": _buffer_compare,
    "util.list.create": _list_create,
    "util.list.size": _list_size,
    "util.list.resize": _list_resize,
    "util.list.get": _list_get,
    "util.list.set": _list_set,
    "util.list.construct": _list_construct,
}
