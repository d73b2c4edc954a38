"""Scalar and element types of HAL-level IR.

Host code computes on integers of 1..64 bits (``index`` is 64) and on
floats (``f16``, ``bf16``, ``f32``, ``f64``). The interpreter keeps an integer
as its unsigned bits (a Python int in ``[0, 2**w)``) and a float as a Python
float already rounded to its type, so every op result is exact for its type.

Element types of buffer views use IREE's names (``f32``, ``i8``, ``ui16``,
``bf16``, ``f8E4M3FN``, ``cf64`` for ``complex<f32>``...): the one table is
:data:`hal_cpu.buffers.DTYPES`, which the command line also uses.
"""

from __future__ import annotations

import numpy as np

from ..buffers import DTYPES, LazyTable

__all__ = ["int_width", "float_dtype", "wrap", "signed", "round_float",
           "element_dtype", "element_name", "DTYPES"]

_FLOATS = LazyTable({"f16": np.float16, "f32": np.float32, "f64": np.float64},
                    ("bf16",), lambda: ({"bf16": DTYPES["bf16"]}
                                        if "bf16" in DTYPES else {}))


def int_width(ty: str) -> int | None:
    """Bit width of the integer type ``ty`` (``i1``..``i64``; ``index`` is
    64), else None."""
    if ty == "index":
        return 64
    if ty[:1] == "i" and ty[1:].isdigit():
        return int(ty[1:])
    return None


def float_dtype(ty: str):
    """numpy scalar type of the float type ``ty`` (f16, bf16, f32, f64), else
    None."""
    return _FLOATS.get(ty)


def wrap(v: int, w: int) -> int:
    """``v`` modulo ``2**w`` (the unsigned w-bit value)."""
    return v & ((1 << w) - 1)


def signed(v: int, w: int) -> int:
    """``v`` as a signed w-bit value."""
    v &= (1 << w) - 1
    return v - (1 << w) if w and v >> (w - 1) else v


def round_float(v: float, ty: str) -> float:
    """``v`` rounded to the float type ``ty`` (f64 unchanged)."""
    if ty == "f64":
        return float(v)
    return float(_FLOATS[ty](v))


def float_bits(v: float, ty: str) -> int:
    """The bits of ``v`` as float type ``ty``, as an unsigned int."""
    return int(np.array(v, _FLOATS[ty]).view(f"u{np.dtype(_FLOATS[ty]).itemsize}"))


def bits_float(bits: int, ty: str) -> float:
    """The float of type ``ty`` whose bits are ``bits``."""
    dt = np.dtype(_FLOATS[ty])
    return float(np.array(bits, f"u{dt.itemsize}").view(dt))


#: MLIR element type spelling -> IREE element type name, where they differ.
_MLIR_NAMES = {"complex<f32>": "cf64", "complex<f64>": "cf128"}


def element_name(mlir_type: str) -> str:
    """IREE's element type name for an MLIR element type (``complex<f32>``
    is ``cf64``); others keep their spelling."""
    return _MLIR_NAMES.get(mlir_type, mlir_type)


def _code(numerical: int, bits: int) -> int:
    return (numerical << 24) | bits


#: IREE element type name -> ``iree_hal_element_type_t`` value (numerical
#: type << 24 | bit count), as ``hal.element_type<...>`` evaluates.
ELEMENT_CODES = {
    "i1": _code(0x13, 8),
    **{f"i{b}": _code(0x10, b) for b in (4, 8, 16, 32, 64)},
    **{f"si{b}": _code(0x11, b) for b in (4, 8, 16, 32, 64)},
    **{f"ui{b}": _code(0x12, b) for b in (4, 8, 16, 32, 64)},
    "f16": _code(0x21, 16), "f32": _code(0x21, 32), "f64": _code(0x21, 64),
    "bf16": _code(0x22, 16), "cf64": _code(0x23, 64), "cf128": _code(0x23, 128),
    "f8E5M2": _code(0x24, 8), "f8E4M3FN": _code(0x25, 8),
    "f8E5M2FNUZ": _code(0x26, 8), "f8E4M3FNUZ": _code(0x27, 8),
    "f8E8M0FNU": _code(0x28, 8),
}
ELEMENT_NAMES = {v: k for k, v in ELEMENT_CODES.items()}


def element_bits(name: str) -> int:
    """Bits of one element of IREE element type ``name``."""
    code = ELEMENT_CODES.get(name)
    if code is not None:
        return code & 0xFF
    dt = element_dtype(name)
    return dt.itemsize * 8 if dt is not None else 0


def element_dtype(name: str):
    """numpy dtype of IREE element type ``name``, or None when numpy has no
    such type (e.g. ``i4``)."""
    t = DTYPES.get(name)
    return np.dtype(t) if t is not None else None


def pack_scalar(value, ty: str) -> bytes:
    """Little-endian bytes of a scalar of IR type ``ty`` (an int as its
    unsigned bits, a float rounded to ``ty``)."""
    w = int_width(ty)
    if w is not None:
        return wrap(int(value), w).to_bytes(max(1, (w + 7) // 8), "little")
    return np.array(value, _FLOATS[ty]).tobytes()


def unpack_scalar(data: bytes, ty: str):
    """The interpreter's value of type ``ty`` stored in ``data``."""
    w = int_width(ty)
    if w is not None:
        return wrap(int.from_bytes(data[:max(1, (w + 7) // 8)], "little"), w)
    return float(np.frombuffer(data, _FLOATS[ty], 1)[0])


def scalar_size(ty: str) -> int:
    """Bytes of a scalar of type ``ty``."""
    w = int_width(ty)
    if w is not None:
        return max(1, (w + 7) // 8)
    return np.dtype(_FLOATS[ty]).itemsize

