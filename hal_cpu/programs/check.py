"""The built-in ``check`` host module: the ``check.expect_*`` ops of IREE's
test programs, judged as IREE's check module (``iree/modules/check``)
judges them.

* ``expect_true(i32)`` / ``expect_false(i32)``: nonzero / zero.
* ``expect_all_true(tensor)``: every element nonzero (8..64-bit integers,
  f32, f64).
* ``expect_eq(lhs, rhs)``: same element type, same shape, same bytes.
* ``expect_almost_eq(lhs, rhs, atol, rtol)``: same element type and shape,
  and per element ``lhs == rhs``, or both NaN, or ``rhs`` finite and
  ``|lhs - rhs| <= atol + rtol * |rhs|`` (floats only: f16, bf16, f32, f64
  and the 8-bit floats, compared in f32, or f64 for f64). The compiler's
  default tolerances are ``atol=1e-4``, ``rtol=0``.
* ``expect_eq_const`` / ``expect_almost_eq_const`` reach the runtime as the
  two above, with the constant as ``rhs``.

A failed expectation does not stop the function (as a gtest ``EXPECT``): it
is appended to :attr:`CheckModule.failures` with IREE's message.
"""

from __future__ import annotations

import math

import numpy as np

from fatelf.text import printable

from ..buffers import format_buffer_view
from .host_api import HostCallError, HostModule, RawTensor, export

__all__ = ["CheckModule"]

_ALL_TRUE_KINDS = {"i", "u", "b"}


def _type_name(x) -> str:
    if isinstance(x, RawTensor):
        return x.element_type
    from ..buffers import dtype_name
    return dtype_name(x.dtype)


def _shape(x) -> tuple:
    return tuple(x.shape)


def _bytes(x) -> bytes:
    return x.data if isinstance(x, RawTensor) else np.ascontiguousarray(x).tobytes()


def _text(x) -> str:
    if isinstance(x, RawTensor):
        # the element type is the program's text: shown escaped
        return ("x".join([str(d) for d in x.shape] + [printable(x.element_type, 80)])
                + "=" + x.data.hex().upper())
    return format_buffer_view(x, 1024)


def _g(v: float) -> str:
    """A double as C++ ``ostream <<`` prints it (6 significant digits)."""
    if v != v:
        return "nan" if not math.copysign(1.0, v) < 0 else "-nan"
    if math.isinf(v):
        return "inf" if v > 0 else "-inf"
    return "%g" % v


class CheckModule(HostModule):
    """The ``check`` module. :attr:`failures` collects the messages of failed
    expectations (cleared by :meth:`take_failures`)."""

    name = "check"

    def __init__(self):
        super().__init__()
        self.failures: list[str] = []

    def take_failures(self) -> list[str]:
        """The failures so far, and forget them."""
        out, self.failures = self.failures, []
        return out

    @export("expect_true")
    def expect_true(self, operand: int) -> None:
        if not operand:
            self.failures.append(f"Expected {operand} to be nonzero.")

    @export("expect_false")
    def expect_false(self, operand: int) -> None:
        if operand:
            self.failures.append(f"Expected {operand} to be zero.")

    @export("expect_all_true")
    def expect_all_true(self, operand) -> None:
        name = _type_name(operand)
        if isinstance(operand, RawTensor) or not (
                operand.dtype.kind in "iu" and operand.dtype.itemsize >= 1
                or name in ("f32", "f64")) or name == "i1":
            raise HostCallError(f"unsupported element type {printable(name, 80)}")
        flat = operand.reshape(-1)
        bad = np.flatnonzero(flat == 0)
        if bad.size:
            self.failures.append(f"Expected all elements to be nonzero; element {bad[0]} "
                                 f"is {flat[bad[0]]}.\n  operand:\n    {_text(operand)}")

    @export("expect_eq")
    def expect_eq(self, lhs, rhs) -> None:
        types_eq = _type_name(lhs) == _type_name(rhs)
        shape_eq = _shape(lhs) == _shape(rhs)
        contents_eq = _bytes(lhs) == _bytes(rhs)
        if types_eq and shape_eq and contents_eq:
            return
        msg = "Expected equality of these values."
        if not types_eq:
            msg += " Element types do not match."
        if not shape_eq:
            msg += " Shapes do not match."
        if not contents_eq:
            msg += " Contents does not match."
        self.failures.append(f"{msg}\n  lhs:\n    {_text(lhs)}\n  rhs:\n    {_text(rhs)}")

    @export("expect_almost_eq")
    def expect_almost_eq(self, lhs, rhs, atol: float = 1e-4, rtol: float = 0.0) -> None:
        types_eq = _type_name(lhs) == _type_name(rhs)
        shape_eq = _shape(lhs) == _shape(rhs)
        close = True
        where: tuple[int, float, float] | None = None
        if types_eq and shape_eq:
            if isinstance(lhs, RawTensor) or lhs.dtype.kind != "f" and \
                    _type_name(lhs) not in ("bf16",) and not _type_name(lhs).startswith("f8"):
                raise HostCallError(f"unsupported element type "
                                    f"{printable(_type_name(lhs), 80)}")
            arith = np.float64 if lhs.dtype == np.float64 else np.float32
            a = lhs.reshape(-1).astype(arith).astype(np.float64)
            b = rhs.reshape(-1).astype(arith).astype(np.float64)
            atol64, rtol64 = float(np.float32(atol)), float(np.float32(rtol))
            with np.errstate(invalid="ignore", over="ignore"):
                ok = (a == b) | (np.isnan(a) & np.isnan(b)) | (
                    np.isfinite(b) & (np.abs(a - b) <= atol64 + rtol64 * np.abs(b)))
            bad = np.flatnonzero(~ok)
            if bad.size:
                close, where = False, (int(bad[0]), float(a[bad[0]]), float(b[bad[0]]))
        if types_eq and shape_eq and close:
            return
        msg = "Expected near equality of these values."
        if not types_eq:
            msg += " Element types do not match."
        if not shape_eq:
            msg += " Shapes do not match."
        if where is not None:
            i, x, y = where
            msg += (f" Contents does not match to tolerance parameters atol={_g(atol)}, "
                    f"rtol={_g(rtol)}. The first failure occurs at index {i} as the lhs "
                    f"value {_g(x)} differs from the rhs value {_g(y)} by {y - x:.3e}.")
        self.failures.append(f"{msg}\n  lhs:\n    {_text(lhs)}\n  rhs:\n    {_text(rhs)}")
