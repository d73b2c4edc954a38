"""Binding specs and buffer-view text, spelled as IREE's tools spell them.

Specs (``--binding=``, ``--input=``): ``4xf32=1,2,3,4`` (values, comma or
space separated), ``4xf32=0`` (splat), ``2x8xi32`` (zero filled),
``@file.npy`` (a numpy file, via :func:`numpy.load`) and ``4xf32=@file.bin``
(raw little-endian bytes: the file's size must be the binding's). Output is IREE's buffer-view form:
``4xf32=100 400 900 1600``, ``2x2xi32=[1 2][3 4]``.
"""

from __future__ import annotations

import os
import re
import threading

import numpy as np

from fatelf.files import open_regular

from .errors import HalCpuError

_FILL_LOCK = threading.RLock()


class LazyTable(dict):
    """A dict some of whose entries (keys in ``later``) come from ``load()``
    on first need: a lookup of one of those keys, or anything that lists
    the entries (iteration, ``len``, ``items``...). Used for the element
    types that need :mod:`ml_dtypes`, so that importing it (a noticeable
    part of a short command's start) waits for a program that uses one."""

    def __init__(self, entries, later=(), load=dict):
        super().__init__(entries)
        self._later = frozenset(later)
        self._load = load

    def fill(self) -> bool:
        """Add the deferred entries; False when they were already added."""
        with _FILL_LOCK:
            load = self._load
            if load is None:
                return False
            for k, v in load().items():
                dict.__setitem__(self, k, v)
            self._load = None
            return True

    def _need(self, key) -> None:
        if self._load is not None and key in self._later:
            self.fill()

    def __getitem__(self, key):
        self._need(key)
        return dict.__getitem__(self, key)

    def __contains__(self, key):
        self._need(key)
        return dict.__contains__(self, key)

    def get(self, key, default=None):
        self._need(key)
        return dict.get(self, key, default)


def _listing(name: str):
    """A :class:`LazyTable` method that first adds the deferred entries."""
    base = getattr(dict, name)

    def method(self, *args, **kwargs):
        if self._load is not None:
            self.fill()
        return base(self, *args, **kwargs)
    method.__name__ = method.__qualname__ = name
    return method


for _m in ("__iter__", "__len__", "__repr__", "__eq__", "__ne__",
           "__reversed__", "__or__", "__ror__", "keys", "values", "items",
           "copy", "pop", "popitem", "setdefault", "update"):
    setattr(LazyTable, _m, _listing(_m))
del _m


_NUMPY_DTYPES: dict[str, type] = {
    "i1": np.bool_, "i8": np.int8, "i16": np.int16, "i32": np.int32,
    "i64": np.int64, "si8": np.int8, "si16": np.int16, "si32": np.int32,
    "si64": np.int64, "ui8": np.uint8, "ui16": np.uint16, "ui32": np.uint32,
    "ui64": np.uint64, "f16": np.float16, "f32": np.float32, "f64": np.float64,
    # IREE names complex element types by their total width: cf64 is
    # complex<f32>, cf128 complex<f64>.
    "cf64": np.complex64, "cf128": np.complex128,
}
# bf16 and the 8-bit floats IREE's buffer views print, through ml_dtypes
# (imported on first use of one of them).
_ML_DTYPES = (("bf16", "bfloat16"), ("f8E4M3FN", "float8_e4m3fn"),
              ("f8E5M2", "float8_e5m2"), ("f8E4M3FNUZ", "float8_e4m3fnuz"),
              ("f8E5M2FNUZ", "float8_e5m2fnuz"),
              ("f8E4M3B11FNUZ", "float8_e4m3b11fnuz"),
              ("f8E4M3", "float8_e4m3"), ("f8E3M4", "float8_e3m4"),
              ("f6E2M3FN", "float6_e2m3fn"), ("f6E3M2FN", "float6_e3m2fn"),
              ("f4E2M1FN", "float4_e2m1fn"), ("f8E8M0FNU", "float8_e8m0fnu"))
#: Element type names whose numpy types come from ml_dtypes.
ML_DTYPE_NAMES = frozenset(name for name, _ in _ML_DTYPES)


def _load_ml_dtypes() -> dict:
    out: dict[str, type] = {}
    try:
        import ml_dtypes
    except ImportError:
        return out
    for name, attr in _ML_DTYPES:
        t = getattr(ml_dtypes, attr, None)
        if t is not None:
            out[name] = t
    return out


def _add_ml_names() -> dict:
    more = _load_ml_dtypes()
    for k, v in reversed(list(more.items())):
        _NAMES[np.dtype(v)] = k
    return more


DTYPES = LazyTable(_NUMPY_DTYPES, ML_DTYPE_NAMES, _add_ml_names)
_NAMES = {np.dtype(v): k for k, v in reversed(list(dict.items(DTYPES)))}
_SHAPE = re.compile(r"^((?:\d+x)*)([a-zA-Z]+\d+[A-Za-z0-9]*)$")
#: Largest binding a spec may create, in bytes.
MAX_SPEC_BYTES = 1 << 34


class BindingSpecError(HalCpuError):
    """A binding/input spec string that cannot be parsed."""


def dtype_name(dtype) -> str:
    """IREE element type name of a numpy dtype (``f32``, ``ui8``...)."""
    try:
        return _NAMES[np.dtype(dtype)]
    except (KeyError, TypeError):
        # perhaps a type of ml_dtypes (or its name) before those are added
        if DTYPES.fill():
            return dtype_name(dtype)
    raise BindingSpecError(f"dtype {np.dtype(dtype)} has no IREE element "
                           "type", field="dtype", value=str(dtype)) from None


def parse_binding(spec: str) -> np.ndarray:
    """Array for one binding spec (see the module docstring).

    Raises:
        BindingSpecError: unknown element type, wrong value count, unreadable
            file, a raw file whose size in bytes is not the binding's (then
            ``name`` is the file, ``field`` ``"binding"``, ``value`` its
            size), not enough memory for the array; the message quotes the
            spec.
    """
    try:
        return _parse_binding(spec)
    except MemoryError:
        raise BindingSpecError("not enough memory for the array", name=repr(spec),
                               field="binding", value=spec) from None


def _parse_binding(spec: str) -> np.ndarray:
    def fail(msg, value=spec):
        return BindingSpecError(msg, name=repr(spec), field="binding", value=value)

    if spec.startswith("@"):
        path = spec[1:]
        arr = _load_npy(path, fail)
        if not isinstance(arr, np.ndarray) or arr.dtype.hasobject:
            raise fail(f"cannot read {path}: not a single numeric array")
        try:
            dtype_name(arr.dtype)
        except BindingSpecError:
            raise fail(f"{path} holds {arr.dtype}, which has no IREE element "
                       "type") from None
        # np.ascontiguousarray would make a 0-d array 1-d
        return arr.copy(order="C")
    head, sep, body = spec.partition("=")
    m = _SHAPE.match(head.strip())
    if not m:
        raise fail("expected SHAPExTYPE[=VALUES], e.g. 4xf32=1,2,3,4")
    dims = [int(d) for d in m.group(1).split("x") if d]
    if m.group(2) not in DTYPES:
        raise fail(f"unknown element type {m.group(2)!r}; known: "
                   f"{', '.join(DTYPES)}", m.group(2))
    dtype = np.dtype(DTYPES[m.group(2)])
    count = 1
    for d in dims:
        count *= d
    if count * dtype.itemsize > MAX_SPEC_BYTES:
        raise fail(f"{count} elements of {m.group(2)} are more than the "
                   f"{MAX_SPEC_BYTES >> 30} GiB a binding spec may create",
                   count)
    if not sep or not body.strip():
        return np.zeros(dims, dtype)
    body = body.strip()
    if body.startswith("@"):
        path, need = body[1:], count * dtype.itemsize
        fd, size = open_regular(path, _file_error(fail, path), field="binding")
        with os.fdopen(fd, "rb") as f:
            if size != need:
                # A raw file is the binding's bytes, no more and no less (a
                # sparse file may claim gigabytes at no cost).
                raise BindingSpecError(
                    f"binding {spec!r}: {path} has {size} bytes; "
                    f"{head.strip()} is {need} bytes", name=path,
                    field="binding", value=size)
            out = np.empty(dims, dtype)
            try:
                got = f.readinto(out.reshape(-1).data.cast("B")) if need else 0
            except OSError as exc:
                raise fail(f"cannot read {path}: {exc.strerror or exc}") from None
            if got != need:
                raise fail(f"{path} has {got} bytes, {need} needed")
        return out
    tokens = [t for t in re.split(r"[\s,\[\]]+", body) if t]
    try:
        values = np.array([_parse_value(t, dtype) for t in tokens], dtype)
    except (ValueError, OverflowError) as exc:
        raise fail(f"bad value: {exc}") from None
    if values.size == 1:
        return np.full(dims, values[0], dtype)
    if values.size != count:
        raise fail(f"{values.size} values given for {count} elements")
    return values.reshape(dims)


def _file_error(fail, path: str):
    """An error class for :func:`fatelf.files.open_regular` that raises
    the spec's :class:`BindingSpecError` with the reason."""
    def error(message, **_):
        return fail(f"cannot read {path}: {message}")
    return error


def _load_npy(path: str, fail) -> np.ndarray:
    """The array of a ``.npy`` file, its header checked against the file's
    size before anything is allocated (numpy's own header parser).

    Raises:
        BindingSpecError: not a regular file, not a ``.npy`` file, pickled
            objects, a header claiming more data than the file holds or more
            than :data:`MAX_SPEC_BYTES`.
    """
    fd, size = open_regular(path, _file_error(fail, path), field="binding")
    with os.fdopen(fd, "rb") as f:
        try:
            version = np.lib.format.read_magic(f)
            read_header = (np.lib.format.read_array_header_1_0
                           if version == (1, 0)
                           else np.lib.format.read_array_header_2_0)
            shape, _, dtype = read_header(f)
        except (ValueError, EOFError, OSError, SyntaxError) as exc:
            raise fail(f"cannot read {path}: it is not a .npy file "
                       f"({str(exc).splitlines()[0] if str(exc) else 'bad header'})"
                       ) from None
        if dtype.hasobject:
            raise fail(f"cannot read {path}: it holds Python objects "
                       "(pickled), which are not loaded")
        count = 1
        for d in shape:
            count *= d
        need, have = count * dtype.itemsize, size - f.tell()
        if need > MAX_SPEC_BYTES:
            raise fail(f"cannot read {path}: its header claims {need} bytes, "
                       f"more than the {MAX_SPEC_BYTES >> 30} GiB a binding may "
                       "have", need)
        if need > have:
            raise fail(f"cannot read {path}: its header claims {need} bytes of "
                       f"data ({'x'.join(map(str, shape)) or 'scalar'} "
                       f"{dtype}) but the file holds {max(have, 0)}", need)
        f.seek(0)
        try:
            return np.load(f, allow_pickle=False)
        except (ValueError, EOFError, OSError) as exc:
            raise fail(f"cannot read {path}: {exc}") from None


def _parse_value(token: str, dtype: np.dtype):
    if dtype.kind == "b":
        word = token.lower()
        if word not in ("0", "1", "true", "false"):
            raise ValueError(f"{token!r} is not an i1 value (0, 1, true, false)")
        return word in ("1", "true")
    if dtype.kind in "iu":
        value = int(token, 0)
        info = np.iinfo(dtype)
        if not info.min <= value <= info.max:
            raise ValueError(f"{value} does not fit {dtype}")
        return value
    return float(token)


def _fmt_float(v: float) -> str:
    # C's "%G", as IREE prints floats (f16 and bf16 widened first); glibc
    # spells a NaN with its sign bit set "-NAN".
    if v != v:
        return "-NAN" if np.signbit(v) else "NAN"
    return "%G" % v


def format_buffer_view(array: np.ndarray, max_elements: int = 1024) -> str:
    """IREE's text form of an array, as ``iree-run-module`` prints it:
    ``4xf32=1 2 3 4``, ``2x2xi32=[1 2][3 4]``, ``2x1x2xf32=[[1 2]][[3 4]]``,
    ``f32=2.5`` for rank 0.

    Floats print as C's ``%G`` (``2.5E-07``, ``INF``, ``-NAN``), integers in
    decimal (signless integers as signed), i1 as 0/1, complex numbers as
    the hex digits of their bytes in memory order (as IREE does). Only the first
    ``max_elements`` elements print; the row where they run out ends in
    ``...`` and every later row prints as ``[...]`` (IREE's
    ``--output_max_element_count``).

    Raises:
        BindingSpecError: the dtype has no IREE element type.
    """
    prefix = "x".join([str(d) for d in array.shape] + [dtype_name(array.dtype)])
    flat = array.reshape(-1)
    kind = array.dtype.kind
    if kind == "b":
        cells = ["1" if v else "0" for v in flat[:max_elements].tolist()]
    elif kind in "iu":
        cells = [str(v) for v in flat[:max_elements].tolist()]
    elif kind == "c":
        # IREE prints complex elements as the hex of their bytes in memory
        cells = [v.tobytes().hex().upper() for v in flat[:max_elements]]
    else:
        cells = [_fmt_float(v) for v in flat[:max_elements].astype(np.float64).tolist()]
    budget = [max_elements]
    shape = array.shape or (1,)

    def leaf(start: int, length: int) -> str:
        count = min(budget[0], length)
        budget[0] -= count
        text = " ".join(cells[start:start + count])
        return text + "..." if count < length else text

    def nest(level: int, start: int) -> str:
        if level == len(shape) - 1:
            return leaf(start, shape[level])
        step = int(np.prod(shape[level + 1:], dtype=np.int64))
        return "".join("[" + nest(level + 1, start + i * step) + "]"
                       for i in range(shape[level]))
    return f"{prefix}={nest(0, 0)}"
