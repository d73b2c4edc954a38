"""VMVX executables: dispatches compiled to VM bytecode, run on this VM.

``iree-compile --iree-hal-target-backends=vmvx`` compiles each dispatch
into a VM bytecode module (format ``vmvx-bytecode-fb``; the executable's
data is a ``.vmfb``-like ZIP whose ``module.fb`` holds it). Each exported
function is one workgroup of a dispatch, with the calling convention of
IREE's VMVX loader (``runtime/src/iree/hal/local/loaders/
vmvx_module_loader.c``)::

    fn(local_memory: !vm.buffer, constants: !vm.buffer,
       bindings: !vm.list<!vm.buffer>,
       workgroup_id_x, _y, _z, workgroup_size_x, _y, _z,
       workgroup_count_x, _y, _z[, processor_id])        # all i32

(``0rrriiiiiiiii_v``; the newer loader's ``0rrriiiiiiiiii_v`` adds the
processor id). Plain code indexes the bindings with ``vm.buffer.load``
and ``vm.buffer.store`` (checked by the VM against each binding's
length); with ``--iree-vmvx-enable-microkernels`` it calls the ``vmvx``
module's ops, implemented here with numpy over strided views of the
binding bytes (:data:`OPS`; names, calling conventions and semantics of
IREE's ``runtime/src/iree/modules/vmvx/exports.inl`` and ``module.c`` and
the ukernels they call). Every operand's byte span (offset, strides and
sizes in elements, as IREE's ``MAP_BUFFER_2D`` computes it) is checked
against its buffer before any byte is read or written.

:func:`load_executable` gives the object the ``hal`` module wraps as a
``!hal.executable`` (:class:`VmvxLibrary`); :func:`describe` the text
``hal-cpu inspect`` prints for one.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from fatelf.text import printable

from .refs import VmBuffer, VmList, VmStatusError

__all__ = ["VMVX_FORMAT", "ENTRY_CCONVS", "OPS", "VmvxError",
           "VmvxAccessError", "VmvxLibrary", "VmvxExport", "load_executable",
           "is_vmvx", "describe"]

#: The executable format string of VMVX executables.
VMVX_FORMAT = "vmvx-bytecode-fb"
#: Most local memory an export may ask for, bytes: IREE keeps it as a
#: 16-bit count of 4096-byte pages.
MAX_LOCAL_MEMORY = 0xFFFF * 4096
#: Calling conventions of a workgroup function: without and with the
#: trailing processor id.
ENTRY_CCONVS = ("0rrriiiiiiiii_v", "0rrriiiiiiiiii_v")

INVALID_ARGUMENT, NOT_FOUND, PERMISSION_DENIED, OUT_OF_RANGE = 3, 5, 7, 11
_LIMIT32 = 1 << 32


class VmvxError(VmStatusError):
    """A VMVX executable that cannot be loaded or an op whose operands are
    invalid (INVALID_ARGUMENT): ``field`` names the executable member or
    the op's operand, ``value`` the offending value."""

    def __init__(self, code: int, message: str, *, field: str, value,
                 name: str | None = None, location: str | None = None):
        super().__init__(code, message, location, name=name)
        self.field, self.value = field, value

    def with_name(self, name: str):
        err = super().with_name(name)
        err.field, err.value = self.field, self.value
        return err

    def set_location(self, location: str | None) -> None:
        field, value = self.field, self.value
        super().set_location(location)
        self.field, self.value = field, value


class VmvxAccessError(VmvxError):
    """An op's operand reaching outside its buffer (OUT_OF_RANGE), or a
    write to a read-only buffer (PERMISSION_DENIED): ``field`` is
    ``vmvx.<op> <operand>``, ``value`` the ``(start, end)`` byte span."""


# ---------------------------------------------------------------------------
# operands

def _bytes_of(buf, op: str, operand: str) -> np.ndarray:
    if type(buf) is not VmBuffer:
        raise VmvxError(INVALID_ARGUMENT, f"vmvx.{op}: operand {operand} is "
                        f"{type(buf).__name__ if buf is not None else 'null'}, "
                        "not a !vm.buffer", field=f"vmvx.{op} {operand}",
                        value=None)
    return np.frombuffer(buf.data, np.uint8)


def _view(buf, dtype, offset: int, strides: tuple, sizes: tuple, op: str,
          operand: str, write: bool, span: tuple | None = None) -> np.ndarray:
    """``buf``'s elements at ``offset`` (elements) with ``strides`` and
    ``sizes`` (elements, outermost first) as a numpy view, after checking
    the byte span IREE maps for it: ``span`` ``(size0, size1, stride0,
    stride1)`` (default: the first two of ``sizes``/``strides``)."""
    dtype = np.dtype(dtype)
    es = dtype.itemsize
    what = f"vmvx.{op} {operand}"
    s0, s1, t0, t1 = span if span is not None else (*sizes[:2], *strides[:2])
    for v in (offset, s0, s1, t0, t1, *sizes, *strides):
        if v < 0 or v >= _LIMIT32:
            raise VmvxError(INVALID_ARGUMENT, f"{what}: buffer overflow "
                            f"(offset {offset}, sizes {tuple(sizes)}, strides "
                            f"{tuple(strides)})", field=what, value=v)
    data = _bytes_of(buf, op, operand)
    start = offset * es
    if any(s == 0 for s in sizes) or s0 == 0 or s1 == 0:
        if start > len(data):
            raise VmvxAccessError(OUT_OF_RANGE, f"{what}: offset {start} lies "
                                  f"past the {len(data)}-byte buffer "
                                  f"{printable(buf.name)}", field=what,
                                  value=(start, start))
        return np.empty(sizes, dtype)
    end = start + ((s0 - 1) * t0 + (s1 - 1) * t1 + 1) * es
    if end > len(data):
        raise VmvxAccessError(OUT_OF_RANGE, f"{what}: bytes [{start}, {end}) "
                              f"lie outside the {len(data)}-byte buffer "
                              f"{printable(buf.name)}", field=what,
                              value=(start, end))
    if write and (buf.readonly or not data.flags.writeable):
        raise VmvxAccessError(PERMISSION_DENIED, f"{what}: buffer "
                              f"{printable(buf.name)} is read-only", field=what,
                              value=(start, end))
    # the bound above covers every element of the view (all strides >= 0)
    last = start + sum((n - 1) * t for n, t in zip(sizes, strides)) * es + es
    if last > end:
        raise VmvxAccessError(OUT_OF_RANGE, f"{what}: bytes [{start}, {last}) "
                              f"reach past the operand's mapped span [{start}, "
                              f"{end})", field=what, value=(start, last))
    return np.ndarray(tuple(sizes), dtype, data, start,
                      tuple(t * es for t in strides))


def _view2d(buf, dtype, offset, stride0, stride1, size0, size1, op, operand,
            write=False):
    """:func:`_view` of a 2-D operand; the common case (a non-empty view
    inside its buffer) is checked here without building the error's
    context."""
    if (type(buf) is VmBuffer and 0 <= offset < _LIMIT32 and 0 < size0 < _LIMIT32
            and 0 < size1 < _LIMIT32 and 0 <= stride0 < _LIMIT32
            and 0 <= stride1 < _LIMIT32 and not (write and buf.readonly)):
        es = dtype.itemsize
        start = offset * es
        if start + ((size0 - 1) * stride0 + (size1 - 1) * stride1 + 1) * es \
                <= len(buf.data):
            return np.ndarray((size0, size1), dtype, buf.data, start,
                              (stride0 * es, stride1 * es))
    return _view(buf, dtype, offset, (stride0, stride1), (size0, size1), op,
                 operand, write)


# ---------------------------------------------------------------------------
# element-wise ops (x32: 32-bit elements; IREE's iree_uk_x32b/x32u_2d)

def _clz32(v: np.ndarray) -> np.ndarray:
    v = v.astype(np.uint32)
    n = np.zeros(v.shape, np.uint32)
    for shift in (16, 8, 4, 2, 1):
        empty = (v >> np.uint32(32 - shift)) == 0
        n += np.where(empty, np.uint32(shift), np.uint32(0))
        v = np.where(empty, v << np.uint32(shift), v)
    return n + (v == 0).astype(np.uint32)


def _int_div(a, b, signed: bool):
    if np.any(b == 0):
        raise VmvxError(INVALID_ARGUMENT, "integer division by zero",
                        field="vmvx.div rhs", value=0)
    if not signed:
        return a // b
    a64, b64 = a.astype(np.int64), b.astype(np.int64)
    q = np.abs(a64) // np.abs(b64) * (np.sign(a64) * np.sign(b64))
    return q.astype(np.int32)        # (INT_MIN / -1 wraps to INT_MIN)


def _shift(r):
    return r & np.uint32(31)


_F, _U, _S = np.dtype(np.float32), np.dtype(np.uint32), np.dtype(np.int32)
#: binary op name -> (element dtype, function of (lhs, rhs) -> result)
_BINARY: dict[str, tuple] = {
    "add.2d.f32": (_F, np.add), "sub.2d.f32": (_F, np.subtract),
    "mul.2d.f32": (_F, np.multiply), "div.2d.f32": (_F, np.divide),
    "add.2d.i32": (_U, np.add), "sub.2d.i32": (_U, np.subtract),
    "mul.2d.i32": (_U, np.multiply),
    "and.2d.i32": (_U, np.bitwise_and), "or.2d.i32": (_U, np.bitwise_or),
    "xor.2d.i32": (_U, np.bitwise_xor),
    "divs.2d.i32": (_S, lambda a, b: _int_div(a, b, True)),
    "divu.2d.i32": (_U, lambda a, b: _int_div(a, b, False)),
    "shl.2d.i32": (_U, lambda a, b: a << _shift(b)),
    "shrs.2d.i32": (_S, lambda a, b: a >> (b & 31)),
    "shru.2d.i32": (_U, lambda a, b: a >> _shift(b)),
}
#: unary op name -> (element dtype, function)
_UNARY: dict[str, tuple] = {
    "abs.2d.f32": (_F, np.abs), "neg.2d.f32": (_F, np.negative),
    "ceil.2d.f32": (_F, np.ceil), "floor.2d.f32": (_F, np.floor),
    "exp.2d.f32": (_F, np.exp), "log.2d.f32": (_F, np.log),
    "rsqrt.2d.f32": (_F, lambda x: np.float32(1) / np.sqrt(x)),
    "ctlz.2d.i32": (_U, _clz32),
}
#: copy op name -> element dtype
_COPY = {"copy.2d.x8": np.dtype(np.uint8), "copy.2d.x16": np.dtype(np.uint16),
         "copy.2d.x32": _U, "copy.2d.x64": np.dtype(np.uint64)}


def _binary(name: str, dtype, fn) -> Callable:
    def op(lhs, lo, ls0, ls1, rhs, ro, rs0, rs1, out, oo, os0, os1, n0, n1):
        a = _view2d(lhs, dtype, lo, ls0, ls1, n0, n1, name, "lhs")
        b = _view2d(rhs, dtype, ro, rs0, rs1, n0, n1, name, "rhs")
        o = _view2d(out, dtype, oo, os0, os1, n0, n1, name, "out", True)
        o[...] = fn(a, b)
    op.__name__ = "vmvx." + name
    return op


def _unary(name: str, dtype, fn) -> Callable:
    def op(inp, io, is0, is1, out, oo, os0, os1, n0, n1):
        a = _view2d(inp, dtype, io, is0, is1, n0, n1, name, "in")
        o = _view2d(out, dtype, oo, os0, os1, n0, n1, name, "out", True)
        o[...] = fn(a)
    op.__name__ = "vmvx." + name
    return op


def _copy(name: str, dtype) -> Callable:
    def op(inp, io, is0, is1, out, oo, os0, os1, n0, n1):
        a = _view2d(inp, dtype, io, is0, is1, n0, n1, name, "in")
        o = _view2d(out, dtype, oo, os0, os1, n0, n1, name, "out", True)
        o[...] = a
    op.__name__ = "vmvx." + name
    return op


def _fill_x32(value, out, offset, row_stride, n0, n1):
    o = _view2d(out, _S, offset, row_stride, 1, n0, n1, "fill.2d.x32",
                "out", True)
    o[...] = np.int32(value)


# ---------------------------------------------------------------------------
# mmt4d, pack, unpack (IREE's ukernels; flags of builtins/ukernel/
# exported_bits.h)

MMT4D_TYPES: dict[int, Any] = {0x01: (_F, _F), 0x02: (np.dtype(np.int8), _S)}
MMT4D_ACCUMULATE = 0x100
PACK_TYPES: dict[int, Any] = {0x01: _U, 0x02: np.dtype(np.uint8), 0x03: _U}
UNPACK_TYPES: dict[int, Any] = {0x01: _U, 0x03: _U}
TRANSPOSE_INNER, TRANSPOSE_OUTER = 0x100, 0x200


def _nonneg(op: str, **values) -> None:
    for k, v in values.items():
        if v < 0 or v >= _LIMIT32:
            raise VmvxError(INVALID_ARGUMENT, f"vmvx.{op}: {k} = {v}",
                            field=f"vmvx.{op} {k}", value=v)


def _mmt4d(lhs, lo, ls, rhs, ro, rs, out, oo, os_, m, n, k, m0, n0, k0, flags):
    flags &= 0xFFFFFFFF
    types = MMT4D_TYPES.get(flags & 0xFF)
    if types is None:
        raise VmvxError(INVALID_ARGUMENT, f"vmvx.mmt4d: unhandled flags "
                        f"{flags:#x}", field="vmvx.mmt4d flags", value=flags)
    _nonneg("mmt4d", m=m, n=n, k=k, m0=m0, n0=n0, k0=k0)
    tin, tout = types
    a = _view(lhs, tin, lo, (ls, m0 * k0, k0, 1), (m, k, m0, k0), "mmt4d",
              "lhs", False, (m, k * m0 * k0, ls, 1))
    b = _view(rhs, tin, ro, (rs, n0 * k0, k0, 1), (n, k, n0, k0), "mmt4d",
              "rhs", False, (n, k * n0 * k0, rs, 1))
    o = _view(out, tout, oo, (os_, m0 * n0, n0, 1), (m, n, m0, n0), "mmt4d",
              "out", True, (m, n * m0 * n0, os_, 1))
    if o.size == 0:
        return
    with np.errstate(all="ignore"):
        acc = np.einsum("mkac,nkbc->mnab", a.astype(tout), b.astype(tout),
                        dtype=tout)
        if flags & MMT4D_ACCUMULATE:
            acc = acc + o
    o[...] = acc


def _pack(inp, io, is0, is1, out, oo, os0, os1, in0, in1, out0, out1, out2,
          out3, padding, flags):
    flags &= 0xFFFFFFFF
    dtype = PACK_TYPES.get(flags & 0xFF)
    if dtype is None:
        raise VmvxError(INVALID_ARGUMENT, f"vmvx.pack: unhandled flags "
                        f"{flags:#x}", field="vmvx.pack flags", value=flags)
    _nonneg("pack", in_size0=in0, in_size1=in1, out_size0=out0,
            out_size1=out1, out_size2=out2, out_size3=out3)
    if os1 != out2 * out3:
        raise VmvxError(INVALID_ARGUMENT, f"vmvx.pack: out_stride1 {os1} is "
                        f"not out_size2 * out_size3 = {out2 * out3}",
                        field="vmvx.pack out_stride1", value=os1)
    o = _view(out, dtype, oo, (os0, os1, out3, 1), (out0, out1, out2, out3),
              "pack", "out", True, (out0, out1 * out2 * out3, os0, 1))
    a = _view2d(inp, dtype, io, is0, is1, in0, in1, "pack", "in")
    if o.size == 0:
        return
    outer0, outer1, t0, t1 = out0, out1, out2, out3
    if flags & TRANSPOSE_OUTER:
        outer0, outer1 = outer1, outer0
    if flags & TRANSPOSE_INNER:
        t0, t1 = t1, t0
    if outer0 * t0 < in0 or outer1 * t1 < in1:
        raise VmvxError(INVALID_ARGUMENT, f"vmvx.pack: {outer0}x{outer1} tiles "
                        f"of {t0}x{t1} do not cover the {in0}x{in1} input",
                        field="vmvx.pack out_size", value=(out0, out1, out2, out3))
    pad = np.array(padding & ((1 << (8 * dtype.itemsize)) - 1), dtype)
    full = np.full((outer0 * t0, outer1 * t1), pad, dtype)
    full[:in0, :in1] = a
    tiles = full.reshape(outer0, t0, outer1, t1).transpose(0, 2, 1, 3)
    if flags & TRANSPOSE_INNER:
        tiles = tiles.transpose(0, 1, 3, 2)
    if flags & TRANSPOSE_OUTER:
        tiles = tiles.transpose(1, 0, 2, 3)
    o[...] = tiles


def _unpack(inp, io, is0, is1, out, oo, os0, os1, in0, in1, in2, in3, out0,
            out1, flags):
    flags &= 0xFFFFFFFF
    dtype = UNPACK_TYPES.get(flags & 0xFF)
    if dtype is None:
        raise VmvxError(INVALID_ARGUMENT, f"vmvx.unpack: unhandled flags "
                        f"{flags:#x}", field="vmvx.unpack flags", value=flags)
    _nonneg("unpack", in_size0=in0, in_size1=in1, in_size2=in2, in_size3=in3,
            out_size0=out0, out_size1=out1)
    if is1 != in2 * in3:
        raise VmvxError(INVALID_ARGUMENT, f"vmvx.unpack: in_stride1 {is1} is "
                        f"not in_size2 * in_size3 = {in2 * in3}",
                        field="vmvx.unpack in_stride1", value=is1)
    a = _view(inp, dtype, io, (is0, is1, in3, 1), (in0, in1, in2, in3),
              "unpack", "in", False, (in0, in1 * in2 * in3, is0, 1))
    o = _view2d(out, dtype, oo, os0, os1, out0, out1, "unpack", "out", True)
    if o.size == 0:
        return
    tiles = a
    if flags & TRANSPOSE_OUTER:
        tiles = tiles.transpose(1, 0, 2, 3)
    if flags & TRANSPOSE_INNER:
        tiles = tiles.transpose(0, 1, 3, 2)
    outer0, outer1, t0, t1 = tiles.shape
    if outer0 * t0 < out0 or outer1 * t1 < out1:
        raise VmvxError(INVALID_ARGUMENT, f"vmvx.unpack: {outer0}x{outer1} "
                        f"tiles of {t0}x{t1} do not cover the {out0}x{out1} "
                        "output", field="vmvx.unpack in_size",
                        value=(in0, in1, in2, in3))
    full = tiles.transpose(0, 2, 1, 3).reshape(outer0 * t0, outer1 * t1)
    o[...] = full[:out0, :out1]


def _query_tile_sizes_2d(size0, size1, flags):
    # The generic tile sizes of IREE's ukernel query (M=8, K=4, N=8); the
    # operand role is the low byte of the flags.
    role = flags & 0xFF
    sizes = {1: (8, 4), 2: (8, 4), 3: (8, 8)}.get(role)
    if sizes is None:
        raise VmvxError(INVALID_ARGUMENT, f"vmvx.query_tile_sizes.2d: operand "
                        f"role {role}", field="vmvx.query_tile_sizes.2d flags",
                        value=flags & 0xFFFFFFFF)
    return sizes


def _ops() -> dict[str, tuple[str, Callable]]:
    ops: dict[str, tuple[str, Callable]] = {}
    for name, (dt, fn) in _BINARY.items():
        ops[name] = ("0rIIIrIIIrIIIII_v", _binary(name, dt, fn))
    for name, (dt, fn) in _UNARY.items():
        ops[name] = ("0rIIIrIIIII_v", _unary(name, dt, fn))
    for name, dt in _COPY.items():
        ops[name] = ("0rIIIrIIIII_v", _copy(name, dt))
    ops["fill.2d.x32"] = ("0irIIII_v", _fill_x32)
    ops["mmt4d"] = ("0rIIrIIrIIIIIiiii_v", _mmt4d)
    ops["pack"] = ("0rIIIrIIIIIIIIIIi_v", _pack)
    ops["unpack"] = ("0rIIIrIIIIIIIIIi_v", _unpack)
    ops["query_tile_sizes.2d"] = ("0IIi_II", _query_tile_sizes_2d)
    return ops


#: The ``vmvx`` module's exports: name (without ``vmvx.``) ->
#: (calling convention, callable).
OPS: dict[str, tuple[str, Callable]] = _ops()


# ---------------------------------------------------------------------------
# executables

@dataclass(frozen=True)
class VmvxExport:
    """One exported workgroup function, described as
    :class:`hal_cpu.library.Export` describes an ELF one (what the ``hal``
    module and ``hal-cpu inspect`` read)."""

    ordinal: int
    name: str
    function: int
    cconv: str
    binding_count: int
    local_memory: int
    constant_count: int = 0
    workgroup_size: tuple = (1, 1, 1)
    tag: str = ""
    flags: int = 0
    parameter_count: int = 0

    @property
    def label(self) -> str:
        return f"{self.name} (#{self.ordinal})"

    @property
    def local_memory_pages(self) -> int:
        return self.local_memory // 4096


class _Backend:
    """What the ``hal`` module asks of a library's backend."""
    kind = "vmvx"


def is_vmvx(data) -> bool:
    """Whether executable bytes look like a VMVX module (a ZIP, or a bare
    FlatBuffer with the ``IREE`` identifier)."""
    head = bytes(memoryview(data)[:12])
    return head.startswith(b"PK\x03\x04") or head[8:12] == b"IREE"


def _int_attr(attrs: dict, key: str, what: str, label: str) -> int:
    text = (attrs or {}).get(key)
    if text is None:
        return 0
    try:
        value = int(text)
    except ValueError:
        value = -1
    if not 0 <= value < _LIMIT32:
        raise VmvxError(INVALID_ARGUMENT, f"export {printable(what)}: attribute "
                        f"{key} = {printable(text)!r} is not a count",
                        field=f"{key}", value=printable(text), name=label)
    return value


def _read(data, label: str):
    from .module_def import read_module
    return read_module(bytes(data), name=label)


def _exports(mdef, label: str) -> list[VmvxExport]:
    out: list[VmvxExport] = []
    for e in mdef.exports:
        if e.name.startswith("__"):
            continue
        f = mdef.functions[e.function]
        cconv = e.cconv or f.cconv
        if cconv not in ENTRY_CCONVS:
            raise VmvxError(INVALID_ARGUMENT, "executable entry point "
                            f"{printable(e.name)} does not match the expected "
                            f"calling convention; expected '{ENTRY_CCONVS[0]}' "
                            f"but got '{printable(cconv)}'", field="cconv",
                            value=printable(cconv), name=label)
        attrs = {**(f.attrs or {}), **(e.attrs or {})}
        local = _int_attr(attrs, "local_memory", e.name, label)
        if local > MAX_LOCAL_MEMORY:
            raise VmvxError(INVALID_ARGUMENT, f"export {printable(e.name)} asks "
                            f"for {local} bytes of local memory, more than the "
                            f"{MAX_LOCAL_MEMORY} a dispatch can have",
                            field="local_memory", value=local, name=label)
        out.append(VmvxExport(len(out), e.name, e.function, cconv,
                              _int_attr(attrs, "binding_count", e.name, label),
                              local))
    return out


class VmvxLibrary:
    """A loaded VMVX executable: its bytecode module linked against
    :data:`OPS` and translated once; what :class:`hal_cpu.programs.vm.
    hal_module.Executable` wraps (``exports``, ``prepare``, ``close``).

    Args:
        data: the executable's bytes (a ``.vmfb``-like ZIP or a bare
            ``module.fb``).
        constants: executable-level constants, little-endian u32 bytes;
            given to the module's ``__set_constants``.
        memory: the program's :class:`~hal_cpu.programs.vm.refs.MemoryBudget`.
        label: name for messages.

    Raises:
        hal_cpu.programs.vm.module_def.ModuleFormatError: not a module.
        VmvxError: an import the ``vmvx`` module does not provide
            (NOT_FOUND) or one with another calling convention, an export
            with another calling convention, constants given to a module
            without ``__set_constants`` or missing (INVALID_ARGUMENT).
    """

    backend = _Backend()

    def __init__(self, data, constants: bytes = b"", *, memory=None,
                 label: str = "<vmvx executable>"):
        from . import translate as tr
        self.path = label
        self.mdef = mdef = _read(data, label)
        self.name = mdef.name
        self.exports = _exports(mdef, label)
        env = tr.Env.for_module(mdef, imports=[self._link(i, label)
                                               for i in mdef.imports],
                                functions=[None] * len(mdef.functions),
                                memory=memory)
        for f in mdef.functions:
            env.functions[f.ordinal] = tr.translate(
                f, mdef.function_bytecode(f.ordinal), env, module_name=mdef.name)
        self.env = env
        self.closed = False
        self.constant_count = len(constants) // 4
        names = {e.name: e for e in mdef.exports}
        if "__init" in names:
            env.functions[names["__init"].function]()
        setter = names.get("__set_constants")
        if setter is None and constants:
            raise VmvxError(INVALID_ARGUMENT, "executable has no executable-"
                            f"level constants but {len(constants) // 4} "
                            "constants were provided", field="constants",
                            value=len(constants) // 4, name=label)
        if setter is not None:
            if not constants:
                raise VmvxError(INVALID_ARGUMENT, "executable requires "
                                "executable-level constants but none were "
                                "provided", field="constants", value=0,
                                name=label)
            env.functions[setter.function](
                VmBuffer(bytes(constants), readonly=True, name="constants"))

    @staticmethod
    def _link(imp, label: str):
        module, _, fname = imp.name.partition(".")
        found = OPS.get(fname) if module == "vmvx" else None
        if found is None:
            if imp.optional:
                return None
            raise VmvxError(NOT_FOUND, f"the VMVX executable imports "
                            f"@{printable(imp.name)}, which the vmvx module "
                            "does not provide", name=label, field="import",
                            value=printable(imp.name))
        cconv, fn = found
        if cconv != imp.cconv:
            raise VmvxError(INVALID_ARGUMENT, f"import @{printable(imp.name)} has "
                            f"calling convention {printable(imp.cconv)}, but "
                            f"module 'vmvx' exports it as {cconv}", name=label,
                            field=f"import {printable(imp.name)}",
                            value=printable(imp.cconv))
        return fn

    def __repr__(self) -> str:
        return f"<vmvx executable {printable(self.name)}: {len(self.exports)} exports>"

    def function(self, ordinal: int) -> Callable:
        """The translated workgroup function of export ``ordinal``."""
        return self.env.functions[self.exports[ordinal].function]

    def prepare(self, ordinal: int, grid, constants, lengths, *,
                workers: int | None = None) -> "PreparedVmvx":
        """A dispatch of export ``ordinal`` over ``grid`` (x, y, z) with
        ``constants`` (u32 values). ``lengths`` (the recorded binding
        lengths, or their count) is accepted for the ``hal`` module's
        interface: each run takes the lengths of the bindings it is given,
        and every access is checked against them. ``workers`` is accepted
        and ignored (workgroups run one after another on the calling
        thread)."""
        if not 0 <= ordinal < len(self.exports):
            raise VmvxError(OUT_OF_RANGE, f"export ordinal {ordinal} of an "
                            f"executable with {len(self.exports)} exports",
                            field="ordinal", value=ordinal, name=self.path)
        return PreparedVmvx(self, self.exports[ordinal], tuple(grid),
                            [c & 0xFFFFFFFF for c in constants])

    def close(self) -> None:
        self.closed = True


class PreparedVmvx:
    """One recorded dispatch of a :class:`VmvxLibrary` export: runs the
    export's function once per workgroup, x fastest, on VM buffers over
    the bindings' host memory."""

    guarded_ranges: list = []

    def __init__(self, library: VmvxLibrary, export: VmvxExport, grid: tuple,
                 constants: list[int]):
        self.library, self.export, self.grid = library, export, grid
        self.constants = VmBuffer(np.asarray(constants, "<u4").tobytes(),
                                  readonly=True, name="constants")
        self.extra = (0,) if len(export.cconv) == len(ENTRY_CCONVS[1]) else ()
        self.fn = library.function(export.ordinal)

    def runner(self) -> Callable:
        return lambda pointers: self.run_addresses(pointers, None)

    def run_buffers(self, buffers: list[VmBuffer]) -> None:
        """Run every workgroup on ``buffers`` (one :class:`VmBuffer` per
        binding)."""
        if self.library.closed:
            raise VmvxError(9, "the executable was unloaded", field="executable",
                            value=self.library.name)
        gx, gy, gz = self.grid
        if len(buffers) < self.export.binding_count:
            raise VmvxError(INVALID_ARGUMENT, f"export {self.export.label} "
                            f"declares {self.export.binding_count} bindings, "
                            f"{len(buffers)} given", field="bindings",
                            value=len(buffers))
        bindings = VmList("!vm.buffer", buffers)
        size = self.export.local_memory
        memory = self.library.env.memory
        if size:
            memory.charge(size, f"local memory of {self.export.label}")
        try:
            local = VmBuffer(bytearray(size), name="local memory")
            fn, consts, extra = self.fn, self.constants, self.extra
            # (float ops give IEEE results, as C does, without numpy's warnings)
            with np.errstate(all="ignore"):
                for z in range(gz):
                    for y in range(gy):
                        for x in range(gx):
                            fn(local, consts, bindings, x, y, z, 1, 1, 1, gx,
                               gy, gz, *extra)
        finally:
            if size:
                memory.uncharge(size)

    def run_addresses(self, pointers, sizes, *, writable=None,
                      timeout: float | None = None) -> None:
        """Run on host memory: binding ``i`` is ``sizes[i]`` bytes at
        address ``pointers[i]`` (the ``hal`` module's own buffers, whose
        ranges it checked), read-only where ``writable[i]`` is false.
        ``timeout`` is the program's: its deadline stops the bytecode at a
        backward branch."""
        if sizes is None:
            raise VmvxError(INVALID_ARGUMENT, "binding lengths are needed",
                            field="bindings", value=None)
        buffers = []
        for i, (p, n) in enumerate(zip(pointers, sizes)):
            if n < 0:
                raise VmvxError(OUT_OF_RANGE, f"binding {i}: length {n}",
                                field=f"binding {i}", value=n)
            mem = (ctypes.c_ubyte * n).from_address(p) if n else bytearray()
            ro = writable is not None and not writable[i]
            buffers.append(VmBuffer(mem, readonly=ro, name=f"binding {i}"))
        self.run_buffers(buffers)

    def close(self) -> None:
        pass


def load_executable(data, constants: bytes = b"", *, memory=None,
                    label: str | None = None) -> VmvxLibrary:
    """Load a ``vmvx-bytecode-fb`` executable (see :class:`VmvxLibrary`);
    ``data`` is bytes or a :class:`~hal_cpu.programs.vm.refs.VmBuffer`.

    ``label`` is the file the executable came from, named by the errors
    (:class:`VmvxLibrary` lists them); None for an executable a program
    creates: the errors then name no file (the program names its own)
    and a module that cannot be read is a :class:`VmvxError`
    (INVALID_ARGUMENT) like the others, a status of ``hal.executable.create``.
    """
    from .module_def import ModuleFormatError
    if isinstance(data, VmBuffer):
        data = data.bytes()
    if label is not None:
        return VmvxLibrary(data, constants, memory=memory, label=label)
    unnamed = "<vmvx executable>"
    try:
        return VmvxLibrary(data, constants, memory=memory, label=unnamed)
    except ModuleFormatError as exc:
        raise VmvxError(INVALID_ARGUMENT, "the vmvx executable is not a VM "
                        f"module: {exc.message}",
                        field=f"vmvx executable {exc.field}",
                        value=exc.value) from None
    except VmvxError as exc:
        if exc.name != unnamed:
            raise
        raise exc.with_name(None) from None  # type: ignore[arg-type]


def describe(data, label: str) -> str:
    """What ``hal-cpu inspect`` prints for a VMVX executable: module, the
    ``vmvx`` ops it imports and its exports (bindings, local memory,
    calling convention). Nothing of it runs.

    Raises:
        hal_cpu.programs.vm.module_def.ModuleFormatError: not a module.
        VmvxError: an export of another calling convention.
    """
    mdef = _read(data, label)
    exports = _exports(mdef, label)
    lines = [f"format:       {VMVX_FORMAT} (VM bytecode, runs on this VM on "
             "any host)",
             f"module:       {printable(mdef.name, 200)} (version {mdef.version})",
             f"imports:      {len(mdef.imports)}"]
    for i, imp in enumerate(mdef.imports):
        _, _, fname = imp.name.partition(".")
        known = imp.name.startswith("vmvx.") and fname in OPS
        lines.append(f"  [{i}] {printable(imp.name, 200)} {printable(imp.cconv)}"
                     + ("" if known else "  UNRESOLVED"))
    lines.append(f"exports:      {len(exports)}")
    for e in exports:
        lines.append(f"  [{e.ordinal}] {printable(e.name, 200)}")
        lines.append(f"      bindings={e.binding_count} local_memory="
                     f"{e.local_memory} cconv={e.cconv}")
    return "\n".join(lines)
