"""A VM bytecode function to one Python function.

:func:`translate` decodes a function's bytecode and writes it out as the
source of a single Python function, compiled once with :func:`compile`:
registers are local variables (``i<n>`` for the 32-bit register file, one
local per value: an ``i64``/``f64`` lives in the local of its even
register; ``r<n>`` for refs), each op is a line or two of Python, and a
function with branches becomes ``while True:`` over a block number with one
``if _b == <k>:`` section per block (a branch to a later block falls
through to it; only a branch back to the same or an earlier block goes
round the loop). A function without branches stays straight-line code.
Calling the result runs no per-op dispatch at all.

Calling convention (see :mod:`hal_cpu.programs.vm`): the translated function takes
its arguments as the function's ``cconv`` lists them and returns None, one
value or a tuple. Imports are called the same way; a variadic segment is
passed as a tuple of tuples.

What the ops do follows IREE's bytecode interpreter (``dispatch.c``,
``ops.h``): 32/64-bit integer arithmetic wraps; shift amounts are taken
modulo the width; f32 results are rounded to f32 (values stay Python
floats); float to integer casts round half away from zero; f64 to 32-bit
integer casts go through f32 as IREE's do. Where IREE's C code is
undefined (integer division by zero), a :class:`VmStatusError` is raised
(INVALID_ARGUMENT); ``INT_MIN / -1`` wraps to ``INT_MIN`` (remainder 0).
Branch operands are one parallel copy (all sources read before any
destination is written), except that a scratch register the list itself
fills (the compiler's temporary for breaking a cycle of copies) passes on
the value it was given.

A status error raised while a translated function runs (a failing op, an
import's error) gets the location (``file:line:col`` from
:attr:`Env.locate`) of the op that raised it when it has none.

Backward branches check :data:`BACKEDGE_HOOK`: when its one element is set
to a callable, it is called at every backward branch (a place to enforce
a time limit); unset, the check costs one list lookup and compare.

:func:`translate_module` translates a whole module (what linking calls)
and keeps the result on disk, in the private cache folder
``vm-translations``: per module and link, each function's ``marshal``'d
code object with what rebinds its constants, keyed by the module's
bytecode and signatures, which imports resolved, the translator's source
and the Python version (:func:`translator_version`). Loading the same
program again reads that file instead of decoding, generating and
compiling (``PKR_VM_CACHE=0`` turns the cache off).
"""

from __future__ import annotations

import ctypes
import hashlib
import marshal
import math
import os
import struct
import sys
import weakref
from typing import Callable, NoReturn

from elfloader.errors import BackendError
from fatelf.text import printable

from ... import arrays as _arrays
from ...arrays import default_memory_limit
from . import decode as _decode_module
from . import isa
from .decode import BytecodeError, Instruction, decode
from .refs import MemoryBudget, VmBuffer, VmError, VmList, VmStatusError

__all__ = ["Env", "translate", "translate_module", "translator_version",
           "UnsupportedOpError", "BACKEDGE_HOOK", "parse_cconv"]

#: ``[None]`` or ``[callable]``: called at every backward branch of every
#: translated function (e.g. to check a deadline and raise)
BACKEDGE_HOOK: list = [None]

# iree_status_code_t values used here
INVALID_ARGUMENT, NOT_FOUND, OUT_OF_RANGE, PERMISSION_DENIED = 3, 5, 11, 7
FAILED_PRECONDITION, RESOURCE_EXHAUSTED = 9, 8

#: Bytes counted against the memory limit per slot of a ``!vm.list``.
LIST_SLOT_BYTES = 8


class UnsupportedOpError(VmError):
    """The translator cannot run an op of the function (raised when the
    function is translated, never silently skipped).

    Attributes:
        op: the op's name (``vm.buffer.hash``); offset: its bytecode offset;
        location: its source location when the module has debug info.
    """

    def __init__(self, message: str, *, op: str, function: str, offset: int,
                 location: str | None = None):
        self.op, self.offset, self.location = op, offset, location
        at = f" at {location}" if location else ""
        super().__init__(f"{op} (bytecode offset 0x{offset:X}{at}): {message}",
                         name=function, field=op, value=offset)


class Env:
    """What translated functions see; built by the linker.

    Attributes:
        imports: import ordinal -> callable (the package's calling
            convention), or None for an unresolved optional import
            (``vm.import.resolved`` gives 0, a call raises
            :class:`VmStatusError` NOT_FOUND). Read when a function is
            translated: fill it first.
        functions: internal function ordinal -> translated callable; looked
            up at each call, so it may be filled after translation.
        rodata: read-only data ordinal -> :class:`VmBuffer`.
        global_bytes: the globals' bytes (``vm.global.*.i32/i64/f32/f64``).
        global_refs: the ref globals.
        types: the module's type table (names, e.g. ``!hal.buffer``).
        locate: (function ordinal, bytecode offset) -> ``file:line:col`` or
            None.
        import_cconvs: import ordinal -> calling convention string (needed
            by ``vm.call.variadic``; when absent, a callable's ``cconv``
            attribute is used).
        import_names: import ordinal -> name, for messages.
        function_cconvs: internal function ordinal -> calling convention
            (calls are checked against it when known).
        memory: the program's :class:`~hal_cpu.programs.vm.refs.MemoryBudget`:
            ``vm.buffer.alloc``/``clone`` and ``vm.list.resize`` count
            their bytes against it before allocating (default: a budget of
            :func:`hal_cpu.arrays.default_memory_limit`).
    """

    def __init__(self, *, imports=(), functions=None, rodata=(),
                 global_bytes=None, global_refs=None, types=(),
                 locate: Callable[[int, int], str | None] | None = None,
                 import_cconvs=(), import_names=(),
                 memory: MemoryBudget | None = None):
        self.imports = list(imports)
        self.functions = [] if functions is None else functions
        self.rodata = list(rodata)
        self.global_bytes = bytearray() if global_bytes is None else global_bytes
        self.global_refs = [] if global_refs is None else global_refs
        self.types = list(types)
        self.locate = locate or (lambda ordinal, offset: None)
        self.import_cconvs = list(import_cconvs)
        self.import_names = list(import_names)
        self.function_cconvs: list = []
        self.memory = MemoryBudget(default_memory_limit()) if memory is None else memory

    @classmethod
    def for_module(cls, module, **kw) -> "Env":
        """An Env with the rodata, globals, types, debug locations and
        import signatures of a :class:`~hal_cpu.programs.vm.module_def.ModuleDef`;
        ``imports``/``functions`` from ``kw`` (default: none resolved)."""
        rodata = [VmBuffer(module.rodata_bytes(i), readonly=True, name=f"rodata[{i}]")
                  for i in range(len(module.rodata))]
        debug = module.debug
        locate = ((lambda o, off: debug.location(o, off, nearest=True))
                  if debug is not None else None)
        kw.setdefault("imports", [None] * len(module.imports))
        env = cls(rodata=rodata, global_bytes=bytearray(module.global_bytes),
                  global_refs=[None] * module.global_refs, types=module.types,
                  locate=locate, import_cconvs=[i.cconv for i in module.imports],
                  import_names=[i.name for i in module.imports], **kw)
        env.function_cconvs = [f.cconv for f in module.functions]
        return env


# ---------------------------------------------------------------------------
# calling conventions

def _split_types(s: str, what: str) -> list:
    """``"iIC rID v"`` -> ['i', 'I', ('r', 'I'), ...]; ``v`` dropped."""
    out: list[str | tuple[str, ...]] = []
    i = 0
    while i < len(s):
        c = s[i]
        if c == "C":
            j = s.find("D", i)
            if j < 0:
                raise ValueError(f"unterminated variadic segment in {what}")
            out.append(tuple(s[i + 1:j]))
            i = j + 1
            continue
        if c not in "v":
            if c not in "iIfFr":
                raise ValueError(f"unknown type {c!r} in {what}")
            out.append(c)
        i += 1
    return out


def parse_cconv(cconv: str) -> tuple[list, list]:
    """A calling convention string (``0rIC iD_r``) -> (arguments, results),
    each a list of type characters (``i I f F r``) or tuples (a variadic
    segment's element types)."""
    if not cconv.startswith("0") or "_" not in cconv:
        raise ValueError(f"calling convention {cconv!r} is not 0<args>_<results>")
    args, _, results = cconv[1:].partition("_")
    return _split_types(args, cconv), _split_types(results, cconv)


# ---------------------------------------------------------------------------
# runtime helpers (globals of the generated functions)

_M32, _M64 = 0xFFFFFFFF, 0xFFFFFFFFFFFFFFFF
_S_I8, _S_U8 = struct.Struct("<b"), struct.Struct("<B")
_S_I16, _S_U16 = struct.Struct("<h"), struct.Struct("<H")
_S_I32, _S_U32 = struct.Struct("<i"), struct.Struct("<I")
_S_I64, _S_U64 = struct.Struct("<q"), struct.Struct("<Q")
_S_F32, _S_F64 = struct.Struct("<f"), struct.Struct("<d")
_pf, _uf = _S_F32.pack, _S_F32.unpack
_INF, _NAN = math.inf, math.nan


def _status(code, message):
    return VmStatusError(code, message)


def _r32(x: float) -> float:
    """``x`` rounded to f32 (overflow -> signed infinity)."""
    try:
        return _uf(_pf(x))[0]
    except OverflowError:
        return math.copysign(_INF, x)


def _fdiv(a: float, b: float) -> float:
    try:
        return a / b
    except ZeroDivisionError:
        if a != a or a == 0:
            return _NAN
        return math.copysign(_INF, a) * math.copysign(1.0, b)


def _wrap32(x: int) -> int:
    return ((x + 0x80000000) & _M32) - 0x80000000


def _wrap64(x: int) -> int:
    return ((x + 0x8000000000000000) & _M64) - 0x8000000000000000


def _cdiv(a: int, b: int, bits: int) -> int:
    """C signed division (truncating); wraps INT_MIN / -1."""
    if b == 0:
        raise _status(INVALID_ARGUMENT, "integer division by zero")
    q = abs(a) // abs(b)
    if (a < 0) != (b < 0):
        q = -q
    return _wrap32(q) if bits == 32 else _wrap64(q)


def _crem(a: int, b: int, bits: int) -> int:
    """C signed remainder (sign of the dividend)."""
    if b == 0:
        raise _status(INVALID_ARGUMENT, "integer remainder by zero")
    r = abs(a) % abs(b)
    return -r if a < 0 else r


def _udiv(a: int, b: int, bits: int) -> int:
    m = _M32 if bits == 32 else _M64
    if b & m == 0:
        raise _status(INVALID_ARGUMENT, "integer division by zero")
    q = (a & m) // (b & m)
    return _wrap32(q) if bits == 32 else _wrap64(q)


def _urem(a: int, b: int, bits: int) -> int:
    m = _M32 if bits == 32 else _M64
    if b & m == 0:
        raise _status(INVALID_ARGUMENT, "integer remainder by zero")
    r = (a & m) % (b & m)
    return _wrap32(r) if bits == 32 else _wrap64(r)


def _round_away(x: float) -> float:
    """C ``round``: half away from zero (float in, float out)."""
    if x != x or x in (_INF, -_INF):
        return x
    t = float(math.trunc(x))
    if abs(x - t) >= 0.5:
        t += math.copysign(1.0, x)
    return math.copysign(t, x) if t == 0 else t


def _round_even(x: float) -> float:
    """Half to even the way IREE's runtime computes it: round half away,
    then step a halfway odd result back toward zero (so -0.5 gives +0.0)."""
    r = _round_away(x)
    if r == r and abs(x - r) == 0.5 and math.fmod(r, 2.0) != 0:
        r = r - 1.0 if r > 0 else r + 1.0
    return r


def _ceil(x: float) -> float:
    if x != x or x in (_INF, -_INF):
        return x
    r = float(math.ceil(x))
    return math.copysign(r, x) if r == 0 else r


def _floor(x: float) -> float:
    if x != x or x in (_INF, -_INF):
        return x
    r = float(math.floor(x))
    return math.copysign(r, x) if r == 0 else r


_I64_MIN = -0x8000000000000000


def _lround64(x: float) -> int:
    """C ``llround``/``lround`` (64-bit long): NaN and out of range give
    INT64_MIN as x86-64 does."""
    r = _round_away(x)
    if r != r or not -9.223372036854775808e18 <= r < 9.223372036854775808e18:
        return _I64_MIN
    return int(r)


def _f2i32(x: float) -> int:
    """``(int32_t)lroundf(x)`` (also ``(uint32_t)llroundf``)."""
    return _wrap32(_lround64(x))


def _f2u64(x: float) -> int:
    """``(uint64_t)roundf(x)``/``round(x)`` as x86-64 converts, as i64 bits."""
    r = _round_away(x)
    if r != r:
        return _I64_MIN
    if r < 9.223372036854775808e18:
        return int(r) if r >= -9.223372036854775808e18 else _I64_MIN
    if r < 1.8446744073709552e19:
        return _wrap64(int(r))
    return 0


def _int_to_f32(v: int) -> float:
    """An integer correctly rounded (to nearest even) to f32."""
    a = abs(v)
    n = a.bit_length()
    if n <= 24:
        return float(v)
    shift = n - 24
    q, rem = a >> shift, a & ((1 << shift) - 1)
    half = 1 << (shift - 1)
    if rem > half or (rem == half and q & 1):
        q += 1
    r = _r32(math.ldexp(float(q), shift)) if n < 1000 else _INF
    return -r if v < 0 else r


def _bits_f32(v: int) -> float:
    return _uf(_S_I32.pack(v))[0]


def _f32_bits(x: float) -> int:
    return _S_I32.unpack(_pf(x))[0]


def _bits_f64(v: int) -> float:
    return _S_F64.unpack(_S_I64.pack(v))[0]


def _f64_bits(x: float) -> int:
    return _S_I64.unpack(_S_F64.pack(x))[0]


def _fma32(a, b, c):
    return _r32(_r32(a * b) + c)


# libm for the transcendental ops (the functions IREE's runtime calls)
def _load_libm():
    # The usual sonames before ctypes.util.find_library, which runs
    # ``ldconfig -p`` (a child process) on Linux.
    for soname in ("libm.so.6", "libm.dylib", "find"):
        name: str | None = soname
        if soname == "find":
            from ctypes.util import find_library
            name = find_library("m")
        if not name:
            continue
        try:
            return ctypes.CDLL(name)
        except OSError:
            continue
    return None


_LIBM = _load_libm()


def _libm_fn(name: str, nargs: int, f32: bool, fallback):
    if _LIBM is not None and hasattr(_LIBM, name):
        fn = getattr(_LIBM, name)
        t = ctypes.c_float if f32 else ctypes.c_double
        fn.restype, fn.argtypes = t, [t] * nargs
        return fn

    def slow(*args):
        try:
            r = fallback(*args)
        except (ValueError, ZeroDivisionError):
            r = _NAN
        except OverflowError:
            r = _INF
        return _r32(r) if f32 else r
    return slow


_MATH = {  # mnemonic stem -> (libm name (f64), python fallback, arg count)
    "atan": ("atan", math.atan, 1), "atan2": ("atan2", math.atan2, 2),
    "cos": ("cos", math.cos, 1), "sin": ("sin", math.sin, 1),
    "exp": ("exp", math.exp, 1), "exp2": ("exp2", lambda x: 2.0 ** x, 1),
    "expm1": ("expm1", math.expm1, 1), "log": ("log", math.log, 1),
    "log10": ("log10", math.log10, 1), "log1p": ("log1p", math.log1p, 1),
    "log2": ("log2", math.log2, 1), "pow": ("pow", math.pow, 2),
    "sqrt": ("sqrt", math.sqrt, 1), "tanh": ("tanh", math.tanh, 1),
    "erf": ("erf", math.erf, 1), "rem": ("remainder", math.remainder, 2),
}
_MATH_FNS = {}
for _stem, (_c, _py, _n) in _MATH.items():
    _MATH_FNS[_stem + ".f64"] = _libm_fn(_c, _n, False, _py)
    _MATH_FNS[_stem + ".f32"] = _libm_fn(_c + "f", _n, True, _py)


def _rsqrt64(x):
    s = _MATH_FNS["sqrt.f64"](x)
    return _fdiv(1.0, s)


def _rsqrt32(x):
    return _r32(_fdiv(1.0, _MATH_FNS["sqrt.f32"](x)))


# buffers

def _buf(b, what):
    if type(b) is not VmBuffer:
        if b is None:
            raise _status(INVALID_ARGUMENT, f"{what} is null")
        raise _status(INVALID_ARGUMENT, f"{what} is a "
                      f"{getattr(type(b), 'vm_type', type(b).__name__)}, not a "
                      "!vm.buffer")
    return b.data


def _range(d, byte_off, nbytes, size):
    if byte_off < 0 or nbytes < 0 or byte_off + nbytes > len(d):
        raise _status(OUT_OF_RANGE, f"out-of-bounds access detected (offset={byte_off}, "
                      f"length={nbytes}, alignment={size}, buffer length={len(d)})")


def _make_load(st: struct.Struct, size: int):
    unpack = st.unpack_from

    def load(b, off):
        d = _buf(b, "source_buffer")
        o = off * size
        if off < 0 or o + size > len(d):
            _range(d, o, size, size)
        return unpack(d, o)[0]
    return load


def _writable(b, what):
    d = _buf(b, what)
    if b.readonly:
        raise _status(PERMISSION_DENIED, "buffer is read-only and cannot be mapped for mutation")
    return d


def _make_store(st: struct.Struct, size: int, mask: int | None):
    pack = st.pack_into

    def store(b, off, v):
        d = _writable(b, "target_buffer")
        o = off * size
        if off < 0 or o + size > len(d):
            _range(d, o, size, size)
        pack(d, o, v & mask if mask is not None else v)
    return store


def _make_fill(st: struct.Struct, size: int, mask: int | None):
    def fill(b, off, n, v):
        d = _writable(b, "buffer")
        o, nb = off * size, n * size
        _range(d, o, nb, size)
        d[o:o + nb] = st.pack(v & mask if mask is not None else v) * n
    return fill


_BUF_LOAD = {
    "buffer.load.i8.u": _make_load(_S_U8, 1), "buffer.load.i8.s": _make_load(_S_I8, 1),
    "buffer.load.i16.u": _make_load(_S_U16, 2), "buffer.load.i16.s": _make_load(_S_I16, 2),
    "buffer.load.i32": _make_load(_S_I32, 4), "buffer.load.i64": _make_load(_S_I64, 8),
    "buffer.load.f32": _make_load(_S_F32, 4), "buffer.load.f64": _make_load(_S_F64, 8),
}
_BUF_STORE = {
    "buffer.store.i8": _make_store(_S_U8, 1, 0xFF),
    "buffer.store.i16": _make_store(_S_U16, 2, 0xFFFF),
    "buffer.store.i32": _make_store(_S_I32, 4, None),
    "buffer.store.i64": _make_store(_S_I64, 8, None),
    "buffer.store.f32": _make_store(_S_F32, 4, None),
    "buffer.store.f64": _make_store(_S_F64, 8, None),
}
_BUF_FILL = {
    "buffer.fill.i8": _make_fill(_S_U8, 1, 0xFF),
    "buffer.fill.i16": _make_fill(_S_U16, 2, 0xFFFF),
    "buffer.fill.i32": _make_fill(_S_I32, 4, None),
    "buffer.fill.i64": _make_fill(_S_I64, 8, None),
    "buffer.fill.f32": _make_fill(_S_F32, 4, None),
    "buffer.fill.f64": _make_fill(_S_F64, 8, None),
}


# id of a weak reference to a counted VM buffer or list -> (the reference,
# its budget, its bytes holder); by id, as a list has no hash
_COUNTED: dict = {}


def _uncount(ref) -> None:
    _, memory, held = _COUNTED.pop(id(ref))
    memory.uncharge(held[0])


def _counted(obj, memory: MemoryBudget, held: list):
    """Keep ``held[0]`` bytes of ``obj`` counted in ``memory`` until it
    goes."""
    ref = weakref.ref(obj, _uncount)
    _COUNTED[id(ref)] = (ref, memory, held)
    return obj


def _new_bytes(length: int, memory: MemoryBudget, what: str) -> VmBuffer:
    """A zeroed ``!vm.buffer`` of ``length`` bytes, counted against the
    memory limit before it is made; its storage ends before a guard page
    (:func:`hal_cpu.arrays.guarded_bytes`), so the ``hal`` module may
    import it in place for a native dispatch."""
    pages = _arrays.guarded_pages(length)
    memory.charge(pages, what)
    try:
        array = _arrays.guarded_bytes(length, lambda: memory.uncharge(pages))
    except (MemoryError, BackendError):
        memory.uncharge(pages)
        raise _status(RESOURCE_EXHAUSTED, f"{what}: {length} bytes: the host "
                      "has no memory for them") from None
    array.fill(0)
    buf = VmBuffer(array, readonly=False, name="vm.buffer")
    buf.guarded = True
    return buf


def _buffer_alloc(length, alignment, memory):
    if length < 0:
        raise _status(OUT_OF_RANGE, f"buffer length {length} is negative")
    return _new_bytes(length, memory, "vm.buffer.alloc")


def _buffer_clone(src, off, length, alignment, memory):
    d = _buf(src, "source")
    _range(d, off, length, 1)
    buf = _new_bytes(length, memory, "vm.buffer.clone")
    buf.data[:] = d[off:off + length]
    return buf


def _buffer_length(b):
    return len(_buf(b, "buffer"))


def _buffer_copy(src, soff, dst, doff, length):
    s = _buf(src, "source_buffer")
    d = _writable(dst, "target_buffer")
    _range(s, soff, length, 1)
    _range(d, doff, length, 1)
    d[doff:doff + length] = s[soff:soff + length].tobytes()


def _buffer_compare(lhs, loff, rhs, roff, length):
    a = _buf(lhs, "lhs_buffer")
    b = _buf(rhs, "rhs_buffer")
    _range(a, loff, length, 1)
    _range(b, roff, length, 1)
    return 1 if a[loff:loff + length] == b[roff:roff + length] else 0


def _sipround(v0, v1, v2, v3):
    m = _M64
    v0 = (v0 + v1) & m
    v1 = ((v1 << 13) | (v1 >> 51)) & m
    v1 ^= v0
    v0 = ((v0 << 32) | (v0 >> 32)) & m
    v2 = (v2 + v3) & m
    v3 = ((v3 << 16) | (v3 >> 48)) & m
    v3 ^= v2
    v0 = (v0 + v3) & m
    v3 = ((v3 << 21) | (v3 >> 43)) & m
    v3 ^= v0
    v2 = (v2 + v1) & m
    v1 = ((v1 << 17) | (v1 >> 47)) & m
    v1 ^= v2
    v2 = ((v2 << 32) | (v2 >> 32)) & m
    return v0, v1, v2, v3


def _buffer_hash(b, off, length):
    """SipHash-2-4 of the bytes, key 00 01 .. 0f, as a signed i64 (the
    hash ``vm.buffer.hash`` gives)."""
    d = _buf(b, "source_buffer")
    _range(d, off, length, 1)
    data = d[off:off + length].tobytes()
    k0, k1 = 0x0706050403020100, 0x0F0E0D0C0B0A0908
    v0, v1 = 0x736F6D6570736575 ^ k0, 0x646F72616E646F6D ^ k1
    v2, v3 = 0x6C7967656E657261 ^ k0, 0x7465646279746573 ^ k1
    full = len(data) - len(data) % 8
    for i in range(0, full, 8):
        m = int.from_bytes(data[i:i + 8], "little")
        v3 ^= m
        v0, v1, v2, v3 = _sipround(*_sipround(v0, v1, v2, v3))
        v0 ^= m
    last = ((len(data) & 0xFF) << 56) | int.from_bytes(data[full:], "little")
    v3 ^= last
    v0, v1, v2, v3 = _sipround(*_sipround(v0, v1, v2, v3))
    v0 ^= last
    v2 ^= 0xFF
    for _ in range(4):
        v0, v1, v2, v3 = _sipround(v0, v1, v2, v3)
    return _wrap64(v0 ^ v1 ^ v2 ^ v3)


# lists

_LIST_DEFAULTS = {"i8": 0, "i16": 0, "i32": 0, "i64": 0, "f32": 0.0, "f64": 0.0}


def _list(l):
    if type(l) is not VmList:
        if l is None:
            raise _status(INVALID_ARGUMENT, "list is null")
        raise _status(INVALID_ARGUMENT, f"list is a "
                      f"{getattr(type(l), 'vm_type', type(l).__name__)}, not a "
                      "!vm.list")
    return l


def _list_index(l, i):
    if not 0 <= i < len(l):
        raise _status(OUT_OF_RANGE, f"index {i & _M32} out of bounds ({len(l)})")


def _list_alloc(type_name, capacity):
    return VmList(type_name)


def _list_resize(l, n, memory):
    _list(l)
    n &= _M32
    if n < len(l):
        del l[n:]
        return
    held = l.charged
    need = n * LIST_SLOT_BYTES
    if held is None or held[0] < need:
        more = need - (held[0] if held is not None else 0)
        memory.charge(more, "vm.list.resize")
        if held is None:
            held = l.charged = [0]
            _counted(l, memory, held)
        held[0] += more
    try:
        l.extend([_LIST_DEFAULTS.get(l.element_type)] * (n - len(l)))
    except MemoryError:
        raise _status(RESOURCE_EXHAUSTED, f"vm.list.resize: {n} elements: the "
                      "host has no memory for them") from None


def _list_get_int(l, i, bits):
    _list_index(_list(l), i)
    v = l[i]
    if isinstance(v, float) or not isinstance(v, int):
        raise _status(FAILED_PRECONDITION, f"list element {i} is not an integer: {v!r}")
    return _wrap32(v) if bits == 32 else _wrap64(v)


def _list_get_float(l, i, bits):
    _list_index(_list(l), i)
    v = l[i]
    if not isinstance(v, (int, float)):
        raise _status(FAILED_PRECONDITION, f"list element {i} is not a number: {v!r}")
    return _r32(float(v)) if bits == 32 else float(v)


def _list_set(l, i, v):
    _list_index(_list(l), i)
    l[i] = v


def _list_get_ref(l, i, type_name):
    _list_index(_list(l), i)
    v = l[i]
    if v is not None and isinstance(v, (int, float)):
        return None
    if v is not None and not _type_ok(v, type_name):
        return None
    return v


# refs

_ANY_TYPES = frozenset(("?", "!vm.ref<?>", "!vm.opaque", "opaque"))


def _type_ok(obj, type_name) -> bool:
    """Whether ``obj`` is of the VM type ``type_name`` (lenient: objects
    without a ``vm_type`` attribute pass)."""
    if obj is None or type_name is None or type_name in _ANY_TYPES:
        return True
    have = getattr(obj, "vm_type", None)
    if have is None:
        return True
    return (have == type_name or type_name.startswith(have + "<")
            or have.startswith(type_name + "<"))


def _cast_ref(obj, type_name):
    if not _type_ok(obj, type_name):
        raise _status(INVALID_ARGUMENT, f"ref of type {getattr(obj, 'vm_type', '?')} "
                      f"cannot be cast to {type_name}")
    return obj


def _global_index(refs, i):
    if not 0 <= i < len(refs):
        raise _status(OUT_OF_RANGE, f"ref global {i} out of range ({len(refs)})")
    return i


def _global_offset(gb, off, size):
    off &= _M32
    if off + size > len(gb):
        raise _status(OUT_OF_RANGE, f"global byte_offset out of range: {off} "
                      f"(rwdata={len(gb)})")
    return off


def _print(name, *values):
    # the name is the program's text: one escaped line, never one of ours
    print(f"vm.print {printable(name, 200)}: " + " ".join(repr(v) for v in values),
          file=sys.stderr)


def _inline_of(fn) -> list | None:
    """An import's ``vm_inline`` as a list of alternatives ``(text, objects,
    counts)``: a Python expression a call of the import may be translated
    to (``{imp}``: the import, ``{a<i>}``: the call's i-th operand as
    written, ``{a<i>_<j>_<k>}``: element k of tuple j of a variadic operand
    i, ``{<key>}``: ``objects[key]``) when each variadic operand ``i`` of
    ``counts`` holds ``counts[i]`` tuples; the expression must behave as
    the call does (the import's module vouches for that). ``vm_inline`` is
    one ``(text, objects[, counts])`` or a tuple of them. None without one
    (or one of another shape)."""
    inline = getattr(fn, "vm_inline", None)
    if type(inline) is not tuple or not inline:
        return None
    alternatives = inline if type(inline[0]) is tuple else (inline,)
    out = []
    for alt in alternatives:
        if type(alt) is not tuple or len(alt) not in (2, 3):
            return None
        text, objects = alt[0], alt[1]
        counts = alt[2] if len(alt) == 3 else {}
        if (type(text) is not str or type(objects) is not dict or type(counts) is not dict
                or not all(type(k) is str and k.isidentifier() for k in objects)
                or not all(type(k) is int and type(v) is int for k, v in counts.items())):
            return None
        out.append((text, objects, counts))
    return out


def _inline_key(fn):
    """What of an import's ``vm_inline`` the generated code depends on."""
    inline = _inline_of(fn)
    if inline is None:
        return None
    return tuple((text, tuple(sorted(objects)), tuple(sorted(counts.items())))
                 for text, objects, counts in inline)


def _variadic_names(arg: str):
    """A variadic operand as the translator writes it (``((r1, i2, ), )``)
    -> its tuples' elements as written (``[["r1", "i2"]]``), or None for
    another operand."""
    import ast
    try:
        node = ast.parse(arg, mode="eval").body
    except SyntaxError:
        return None
    if type(node) is not ast.Tuple:
        return None
    out = []
    for t in node.elts:
        if type(t) is not ast.Tuple:
            return None
        names = []
        for x in t.elts:
            if type(x) is ast.Name:
                names.append(x.id)
            elif type(x) is ast.Constant and x.value is None:
                names.append("None")
            else:
                return None
        out.append(names)
    return out


def _unresolved(name, ordinal):
    def call(*args):
        raise _status(NOT_FOUND, f"optional import `{name}` (ordinal {ordinal}) not resolved")
    return call


def _annotate(err: VmStatusError, code, lines: dict, locate, ordinal: int) -> None:
    """Give ``err`` the location of the op of ``code`` (a translated
    function's code object) it passed through, when it has none."""
    if err.location is not None:
        return
    tb = err.__traceback__
    while tb is not None and tb.tb_frame.f_code is not code:
        tb = tb.tb_next
    if tb is None:
        return
    offset = lines.get(tb.tb_lineno)
    if offset is None:
        return
    loc = locate(ordinal, offset)
    if loc is not None:
        err.set_location(loc)


#: What Python raises when an op's operands are not of the types the op
#: takes (a ref read as an integer, a float as an index...), or when the
#: host cannot hold a value.
_OPERAND_ERRORS = (TypeError, ValueError, IndexError, KeyError, OverflowError,
                   AttributeError, ZeroDivisionError, struct.error, MemoryError)


def _op_at(code, lines: dict, exc: BaseException) -> int | None:
    """The bytecode offset of the op of ``code`` (a translated function's
    code object) that ``exc`` passed through, or None."""
    tb = exc.__traceback__
    at = None
    while tb is not None:
        if tb.tb_frame.f_code is code:
            at = lines.get(tb.tb_lineno, at)
        tb = tb.tb_next
    return at


def _operand_failure(exc: BaseException, code, lines: dict, ops: dict,
                     qual: str, locate, ordinal: int) -> VmError:
    """The typed error of a Python error ``exc`` raised while an op of a
    translated function ran: :class:`VmStatusError` RESOURCE_EXHAUSTED for
    a host out of memory, else a :class:`BytecodeError` naming the
    function, the op and its offset."""
    offset = _op_at(code, lines, exc)
    op = ops.get(offset, "vm.?") if offset is not None else "vm.?"
    text = printable(f"{type(exc).__name__}: {exc}", 200)
    if isinstance(exc, MemoryError):
        err = VmStatusError(RESOURCE_EXHAUSTED, f"{op}: the host has no memory "
                            f"for a value of the program ({text})")
        if offset is not None:
            err.set_location(locate(ordinal, offset))
        return err
    return BytecodeError(f"operands of types the op cannot take ({text})",
                         function=qual, offset=offset or 0, op=op, value=text)


_HELPERS = {
    "_r32": _r32, "_uf": _uf, "_pf": _pf, "_fdiv": _fdiv, "_wrap32": _wrap32,
    "_wrap64": _wrap64, "_cdiv": _cdiv, "_crem": _crem, "_udiv": _udiv,
    "_urem": _urem, "_round_away": _round_away, "_round_even": _round_even,
    "_ceil": _ceil, "_floor": _floor, "_lround64": _lround64, "_f2i32": _f2i32,
    "_f2u64": _f2u64, "_int_to_f32": _int_to_f32, "_bits_f32": _bits_f32,
    "_f32_bits": _f32_bits, "_bits_f64": _bits_f64, "_f64_bits": _f64_bits,
    "_fma32": _fma32, "_rsqrt64": _rsqrt64, "_rsqrt32": _rsqrt32,
    "_buffer_alloc": _buffer_alloc, "_buffer_clone": _buffer_clone,
    "_buffer_length": _buffer_length, "_buffer_copy": _buffer_copy,
    "_buffer_compare": _buffer_compare, "_buffer_hash": _buffer_hash, "_list": _list,
    "_list_alloc": _list_alloc,
    "_list_resize": _list_resize, "_list_get_int": _list_get_int,
    "_list_get_float": _list_get_float, "_list_set": _list_set,
    "_list_get_ref": _list_get_ref, "_cast_ref": _cast_ref,
    "_global_index": _global_index, "_global_offset": _global_offset,
    "_print": _print, "_status": _status, "_VmStatusError": VmStatusError,
    "_OPERAND_ERRORS": _OPERAND_ERRORS,
    "_INF": _INF, "_NAN": _NAN, "_BH": BACKEDGE_HOOK,
    "_ld_i32": _S_I32.unpack_from, "_ld_i64": _S_I64.unpack_from,
    "_ld_f32": _S_F32.unpack_from, "_ld_f64": _S_F64.unpack_from,
    "_st_i32": _S_I32.pack_into, "_st_i64": _S_I64.pack_into,
    "_st_f32": _S_F32.pack_into, "_st_f64": _S_F64.pack_into,
}
for _name, _fn in list(_BUF_LOAD.items()) + list(_BUF_STORE.items()) + list(_BUF_FILL.items()):
    _HELPERS["_" + _name.replace(".", "_")] = _fn
for _name, _fn in _MATH_FNS.items():
    _HELPERS["_m_" + _name.replace(".", "_")] = _fn


# ---------------------------------------------------------------------------
# code generation

_TERMINATORS = frozenset(("br", "cond_br", "br_table", "return", "fail", "yield",
                          "break", "cond_break", "call.yieldable",
                          "call.variadic.yieldable"))
_W32 = ("if not -2147483648 <= {d} <= 2147483647: "
        "{d} = ((({d}) + 2147483648) & 4294967295) - 2147483648")
_W64 = ("if not -9223372036854775808 <= {d} <= 9223372036854775807: "
        "{d} = ((({d}) + 9223372036854775808) & 18446744073709551615) - 9223372036854775808")


def _flit(x: float) -> str:
    if x != x:
        return "_NAN"
    if x in (_INF, -_INF):
        return "_INF" if x > 0 else "(-_INF)"
    return repr(x)


class _Gen:
    def __init__(self, function, instrs: list[Instruction], env: Env, module_name: str):
        self.fn = function
        self.fname = function.name
        self.qual = printable(f"{module_name}.{function.name}", 120)
        self.instrs = instrs
        self.env = env
        self.module_name = module_name
        self.ns: dict = dict(_HELPERS)
        self.ns.update({"_fns": env.functions, "_gb": env.global_bytes,
                        "_grefs": env.global_refs, "_mem": env.memory})
        self.lines: list[str] = []
        self.line_offsets: dict[int, int] = {}   # source line -> bytecode offset
        self.consts = 0
        #: (name, origin) of every constant bound in ``ns`` (see :meth:`const`)
        self.recipe: list[tuple] = []
        self.cacheable = True
        self.cur: Instruction | None = None
        # blocks: marker offset -> index
        self.block_index = {ins.offset: k for k, ins in enumerate(
            i for i in instrs if i.op.opset == isa.CORE and i.op.opcode == isa.BLOCK_OPCODE)}
        self.looping = any(i.op.name in ("br", "cond_br", "br_table", "yield", "break",
                                         "cond_break", "call.yieldable",
                                         "call.variadic.yieldable")
                           for i in instrs)

    # -- helpers
    def where(self, ins: Instruction) -> str | None:
        try:
            return self.env.locate(self.fn.ordinal, ins.offset)
        except Exception:
            return None

    def unsupported(self, ins: Instruction, why: str) -> NoReturn:
        raise UnsupportedOpError(printable(why), op=ins.name, function=self.qual,
                                 offset=ins.offset, location=self.where(ins))

    def bad(self, ins: Instruction, why: str, value=None) -> NoReturn:
        raise BytecodeError(printable(why), function=self.qual, op=ins.name,
                            offset=ins.offset, value=value)

    def const(self, value, prefix="_k", origin: tuple | None = None) -> str:
        """A name bound to ``value`` in the function's namespace. ``origin``
        says how to bind it again from an :class:`Env` alone (``("ro", i)``:
        rodata ``i``; ``("imp", i)``: import ``i``; ``("unres", name, i)``:
        an unresolved import), for the cache of translations; None: the
        value itself, when :mod:`marshal` can store it (else the function
        is not cached)."""
        name = f"{prefix}{self.consts}"
        self.consts += 1
        self.ns[name] = value
        if origin is None:
            try:
                marshal.dumps(value)
                origin = ("val", value)
            except ValueError:
                self.cacheable = False
        self.recipe.append((name, origin))
        return name

    def emit(self, indent: int, text: str):
        for line in text.split("\n"):
            self.lines.append("    " * indent + line)
            if self.cur is not None:
                self.line_offsets[len(self.lines)] = self.cur.offset

    @staticmethod
    def reg(r: int) -> str:
        return f"r{r & isa.REF_MASK}" if r & isa.REF_BIT else f"i{r}"

    def type_name(self, ins, t: int):
        types = self.env.types
        if not 0 <= t < len(types):
            return None  # IREE maps unknown type ids to the first entry: lenient
        return types[t]

    # -- structure
    def params(self) -> list[str]:
        cconv = self.fn.cconv or "0v_v"
        try:
            args, _ = parse_cconv(cconv)
        except ValueError as e:
            raise BytecodeError(printable(str(e)), function=self.qual,
                                offset=0, value=cconv) from None
        names, ni, nr = [], 0, 0
        for a in args:
            if isinstance(a, tuple):
                raise UnsupportedOpError("variadic arguments of an internal function",
                                         op="vm.func", function=self.qual, offset=0)
            if a == "r":
                names.append(f"r{nr}")
                nr += 1
            elif a in "IF":
                ni += ni & 1
                names.append(f"i{ni}")
                ni += 2
            else:
                names.append(f"i{ni}")
                ni += 1
        return names

    def source(self, pyname: str) -> str:
        params = self.params()
        # A caller may pass operands the callee's signature no longer lists
        # (iree-compile drops an unused argument of a vm.fallback function
        # but not the call's operand); they are not read.
        self.emit(0, f"def {pyname}({', '.join(params + ['*_unused'])}):")
        blocks = self.split_blocks()
        # registers some path reads before writing (the high halves of
        # 64-bit values that branch operands copy word by word, or bytecode
        # that reads a register it never wrote) start as 0 / None
        init = sorted(self._read_before_written(blocks, set(params)))
        self.scratch = self._scratch_registers(set(params))
        self.emit(1, "try:")
        if init:
            ints = [n for n in init if n[0] == "i"]
            refs = [n for n in init if n[0] == "r"]
            if ints:
                self.emit(2, " = ".join(ints) + " = 0")
            if refs:
                self.emit(2, " = ".join(refs) + " = None")
        self.nblocks = len(blocks)
        if self.looping:
            self.emit(2, "_b = 0")
            self.emit(2, "while True:")
            for k, block in enumerate(blocks):
                self.cur = None
                self.emit(3, f"if _b == {k}:")
                self.block(block, k, len(blocks), 4)
        else:
            for k, block in enumerate(blocks):
                self.block(block, k, len(blocks), 2)
        self.cur = None
        self.emit(1, "except _VmStatusError as _e:")
        self.emit(2, "_annotate(_e)")
        self.emit(2, "raise")
        # an op given values of types it cannot take (what only the running
        # values show): a typed error naming the op and its offset
        self.emit(1, "except _OPERAND_ERRORS as _e:")
        self.emit(2, "raise _operand_error(_e) from None")
        return "\n".join(self.lines) + "\n"

    def _scratch_registers(self, params: set) -> set:
        """Registers named only by branch operand lists."""
        named, ordinary = set(), set(params)
        for ins in self.instrs:
            for f, a in zip(ins.op.fields, ins.args):
                if f.kind in isa.REGISTER_KINDS:
                    ordinary.add(self.reg(a))
                    if f.kind in ("i64", "f64"):
                        ordinary.add(f"i{a + 1}")
                elif f.kind == "regs":
                    ordinary.update(self.reg(r) for r in a)
                elif f.kind in ("remap", "cases"):
                    pairs = a if f.kind == "remap" else [p for _, ps in a for p in ps]
                    for s, d in pairs:
                        named.add(self.reg(s))
                        named.add(self.reg(d))
        return named - ordinary

    def _edges(self, block: list[Instruction], k: int, nblocks: int):
        """(successor block, branch operand pairs) of a block."""
        index, edges = self.block_index, []
        for ins in block:
            name, a = ins.op.name, ins.args
            if name in ("br", "yield", "break"):
                edges.append((index[a[0]], a[1]))
            elif name == "cond_break":
                edges.append((index[a[1]], a[2]))
            elif name == "cond_br":
                edges += [(index[a[1]], a[2]), (index[a[3]], a[4])]
            elif name == "br_table":
                edges.append((index[a[1]], a[2]))
                edges += [(index[t], pairs) for t, pairs in a[4]]
            elif name in ("call.yieldable", "call.variadic.yieldable"):
                edges.append((index[a[-2]], ()))
            elif name == "fail" and k + 1 < nblocks:
                edges.append((k + 1, ()))
            if name in _TERMINATORS:
                return edges
        if k + 1 < nblocks:
            edges.append((k + 1, ()))
        return edges

    def _read_before_written(self, blocks, params: set) -> set:
        """Locals that some path from the entry reads before it writes them
        (forward must-be-written analysis over the blocks)."""
        R, n = self.reg, len(blocks)
        early, defined, edges = [], [], []
        for k, block in enumerate(blocks):
            seen: set[str] = set()
            first: set[str] = set()
            for ins in block:
                for f, a in zip(ins.op.fields, ins.args):
                    if not f.write and (f.kind in isa.REGISTER_KINDS or f.kind == "regs"):
                        for r in (a if f.kind == "regs" else (a,)):
                            if R(r) not in seen:
                                first.add(R(r))
                for f, a in zip(ins.op.fields, ins.args):
                    if f.write and (f.kind in isa.REGISTER_KINDS or f.kind == "regs"):
                        seen.update(R(r) for r in (a if f.kind == "regs" else (a,)))
                if ins.op.name in _TERMINATORS:
                    break
            out = self._edges(block, k, n)
            for _, pairs in out:
                first.update(R(s) for s, _ in pairs if R(s) not in seen)
            early.append(first)
            defined.append(seen)
            edges.append(out)
        entry: list = [None] * n
        entry[0] = set(params)
        changed = True
        while changed:
            changed = False
            for k in range(n):
                if entry[k] is None:
                    continue
                base = entry[k] | defined[k]
                for succ, pairs in edges[k]:
                    out = base | {R(d) for _, d in pairs}
                    new = out if entry[succ] is None else entry[succ] & out
                    if new != entry[succ]:
                        entry[succ] = new
                        changed = True
        need = set()
        for k in range(n):
            if entry[k] is not None:
                need |= early[k] - entry[k]
        return need

    def split_blocks(self) -> list[list[Instruction]]:
        blocks: list[list[Instruction]] = []
        for ins in self.instrs:
            if ins.op.opset == isa.CORE and ins.op.opcode == isa.BLOCK_OPCODE:
                blocks.append([])
            elif not blocks:
                self.bad(ins, "code before the first block marker")
            else:
                blocks[-1].append(ins)
        if not blocks:
            raise BytecodeError("the function has no code",
                                function=self.qual, offset=0)
        return blocks

    def block(self, block: list[Instruction], k: int, nblocks: int, ind: int):
        ended = False
        for ins in block:
            self.cur = ins
            ended = self.op(ins, k, ind)
        if not ended:
            if k + 1 >= nblocks:
                at = block[-1] if block else self.instrs[-1]
                self.bad(at, "the last block does not end in a terminator")
            # falls into the next block
            if self.looping:
                self.cur = block[-1] if block else self.cur
                self.emit(ind, f"_b = {k + 1}")
        if not block and not ended and not self.looping:
            self.emit(ind, "pass")

    def jump(self, target: int, pairs, k: int, ind: int):
        """Branch operands, then go to the block at ``target``.

        The operands are one parallel copy: every source is read before any
        destination is written. A scratch register (one that only branch
        operand lists name: the compiler's temporary for breaking a cycle
        of copies) written earlier in the list passes on what it was given.
        """
        srcs: list = []
        dsts: list = []
        given: dict = {}
        for s, d in pairs:
            ds, ss = self.reg(d), self.reg(s)
            ss = given.get(ss, ss)
            if ds in self.scratch:
                given[ds] = ss
            if ds != ss:
                srcs.append(ss)
                dsts.append(ds)
        if len(dsts) == 1:
            self.emit(ind, f"{dsts[0]} = {srcs[0]}")
        elif dsts:
            self.emit(ind, f"{', '.join(dsts)} = {', '.join(srcs)}")
        dest = self.block_index[target]
        if not self.looping:  # pragma: no cover - looping is set for any branch
            raise AssertionError("branch in a straight-line function")
        self.emit(ind, f"_b = {dest}")
        if dest <= k:
            self.emit(ind, "if _BH[0] is not None: _BH[0]()")
            self.emit(ind, "continue")

    # -- ops: returns True when the op ends the block
    def op(self, ins: Instruction, k: int, ind: int) -> bool:
        name = ins.op.name
        a = ins.args
        R = self.reg
        e = lambda text: self.emit(ind, text)  # noqa: E731
        stem, _, t = name.rpartition(".")
        if ins.op.opset != isa.CORE:
            return self.float_op(ins, ind)

        # constants
        if name in ("const.i32.zero", "const.i64.zero"):
            e(f"{R(a[0])} = 0")
        elif name in ("const.i32", "const.i64"):
            e(f"{R(a[1])} = {a[0]}")
        elif name == "const.ref.zero":
            e(f"{R(a[0])} = None")
        elif name == "const.ref.rodata":
            if not 0 <= a[0] < len(self.env.rodata):
                self.bad(ins, f"rodata ordinal {a[0]} out of range", a[0])
            e(f"{R(a[1])} = {self.const(self.env.rodata[a[0]], '_ro', ('ro', a[0]))}")
        # globals
        elif name.startswith("global."):
            self.global_op(ins, ind)
        # integer arithmetic
        elif name in ("add.i32", "sub.i32", "mul.i32", "add.i64", "sub.i64", "mul.i64"):
            sym = {"add": "+", "sub": "-", "mul": "*"}[name[:3]]
            d = R(a[2])
            e(f"{d} = {R(a[0])} {sym} {R(a[1])}")
            e((_W32 if t == "i32" else _W64).format(d=d))
        elif name in ("fma.i32", "fma.i64"):
            d = R(a[3])
            e(f"{d} = {R(a[0])} * {R(a[1])} + {R(a[2])}")
            e((_W32 if t == "i32" else _W64).format(d=d))
        elif stem in ("div.i32", "div.i64", "rem.i32", "rem.i64"):
            bits = 32 if "i32" in name else 64
            fn = {("div", "s"): "_cdiv", ("div", "u"): "_udiv", ("rem", "s"): "_crem",
                  ("rem", "u"): "_urem"}[(name[:3], t)]
            x, y = R(a[0]), R(a[1])
            # non-negative operands (the common case) divide the same every way
            sym = "//" if name.startswith("div") else "%"
            e(f"{R(a[2])} = {x} {sym} {y} if {x} >= 0 < {y} else {fn}({x}, {y}, {bits})")
        elif name in ("not.i32", "not.i64"):
            e(f"{R(a[1])} = ~{R(a[0])}")
        elif name[:4] in ("and.", "or.i", "xor.") and t in ("i32", "i64"):
            sym = {"and": "&", "or": "|", "xor": "^"}[name.split(".")[0]]
            e(f"{R(a[2])} = {R(a[0])} {sym} {R(a[1])}")
        elif name in ("shl.i32", "shl.i64"):
            d = R(a[2])
            w = 31 if t == "i32" else 63
            e(f"{d} = {R(a[0])} << ({R(a[1])} & {w})")
            e((_W32 if t == "i32" else _W64).format(d=d))
        elif name in ("shr.i32.s", "shr.i64.s"):
            w = 31 if "i32" in name else 63
            e(f"{R(a[2])} = {R(a[0])} >> ({R(a[1])} & {w})")
        elif name in ("shr.i32.u", "shr.i64.u"):
            d = R(a[2])
            if "i32" in name:
                e(f"{d} = ({R(a[0])} & 4294967295) >> ({R(a[1])} & 31)")
                e(f"if {d} > 2147483647: {d} -= 4294967296")
            else:
                e(f"{d} = ({R(a[0])} & 18446744073709551615) >> ({R(a[1])} & 63)")
                e(f"if {d} > 9223372036854775807: {d} -= 18446744073709551616")
        elif name in ("abs.i32", "abs.i64"):
            d = R(a[1])
            e(f"{d} = abs({R(a[0])})")
            e((_W32 if t == "i32" else _W64).format(d=d))
        elif stem in ("min.i32", "max.i32", "min.i64", "max.i64"):
            x, y, d = R(a[0]), R(a[1]), R(a[2])
            if t == "s":
                xs, ys = x, y
            else:
                m = "4294967295" if "i32" in name else "18446744073709551615"
                xs, ys = f"({x} & {m})", f"({y} & {m})"
            if name.startswith("min"):
                e(f"{d} = {y} if {ys} < {xs} else {x}")
            else:
                e(f"{d} = {y} if {xs} < {ys} else {x}")
        elif name in ("ctlz.i32", "ctlz.i64"):
            w, m = (32, "4294967295") if t == "i32" else (64, "18446744073709551615")
            e(f"{R(a[1])} = {w} - ({R(a[0])} & {m}).bit_length()")
        # width conversions
        elif name == "trunc.i32.i8" or name == "ext.i8.i32.u":
            e(f"{R(a[1])} = {R(a[0])} & 255")
        elif name == "trunc.i32.i16" or name == "ext.i16.i32.u":
            e(f"{R(a[1])} = {R(a[0])} & 65535")
        elif name == "ext.i8.i32.s":
            e(f"{R(a[1])} = (({R(a[0])} & 255) ^ 128) - 128")
        elif name == "ext.i16.i32.s":
            e(f"{R(a[1])} = (({R(a[0])} & 65535) ^ 32768) - 32768")
        elif name == "trunc.i64.i32":
            e(f"{R(a[1])} = (({R(a[0])} & 4294967295) ^ 2147483648) - 2147483648")
        elif name == "ext.i32.i64.s":
            e(f"{R(a[1])} = {R(a[0])}")
        elif name == "ext.i32.i64.u":
            e(f"{R(a[1])} = {R(a[0])} & 4294967295")
        # comparisons
        elif name.startswith("cmp."):
            self.cmp_op(ins, ind)
        # select / switch
        elif name in ("select.i32", "select.i64"):
            e(f"{R(a[3])} = {R(a[1])} if {R(a[0])} else {R(a[2])}")
        elif name == "select.ref":
            tn = self.type_name(ins, a[1])
            e(f"{R(a[4])} = _cast_ref({R(a[2])} if {R(a[0])} else {R(a[3])}, {tn!r})")
        elif name in ("switch.i32", "switch.i64", "switch.ref"):
            bank = "r" if name == "switch.ref" else "i"
            self.check_banks(ins, a[-2], [bank] * len(a[-2]), "value")
            if name == "switch.ref":
                self.switch(e, a[0], a[2], a[3], a[4])
            else:
                self.switch(e, *a)
        # refs
        elif name == "assign.ref":
            e(f"{R(a[1])} = {R(a[0])}")
        elif name == "cast.any.ref":
            e(f"{R(a[2])} = _cast_ref({R(a[0])}, {self.type_name(ins, a[1])!r})")
        elif name == "discard.refs":
            regs = [R(r) for r in a[0] if r & isa.REF_BIT]
            if regs:
                e(" = ".join(regs) + " = None")
        # buffers
        elif name.startswith("buffer."):
            self.buffer_op(ins, ind)
        # lists
        elif name.startswith("list."):
            self.list_op(ins, ind)
        # calls and control flow
        elif name in ("call", "call.variadic", "call.yieldable", "call.variadic.yieldable"):
            self.call_op(ins, ind)
            if name.endswith("yieldable"):
                self.jump(a[-2], (), k, ind)
                return True
        elif name == "return":
            self.check_banks(ins, a[0], self.results(), "result")
            regs = [R(r) for r in a[0]]
            if not regs:
                e("return None")
            elif len(regs) == 1:
                e(f"return {regs[0]}")
            else:
                e("return (" + ", ".join(regs) + ")")
            return True
        elif name == "fail":
            # a zero status is no failure: execution goes on into the next block
            msg = self.const(a[1])
            e(f"if {R(a[0])}: raise _status({R(a[0])} & 4294967295, {msg})")
            if k + 1 >= self.nblocks:
                e("raise _status(13, 'vm.fail with status 0 ran off the end of the function')")
            elif self.looping:
                e(f"_b = {k + 1}")
            return True
        elif name in ("br", "yield", "break"):
            self.jump(a[0], a[1], k, ind)
            return True
        elif name == "cond_break":
            self.jump(a[1], a[2], k, ind)
            return True
        elif name == "cond_br":
            e(f"if {R(a[0])}:")
            self.jump(a[1], a[2], k, ind + 1)
            e("else:")
            self.jump(a[3], a[4], k, ind + 1)
            return True
        elif name == "br_table":
            x = R(a[0])
            cases = a[4]
            for n, (target, pairs) in enumerate(cases):
                e(f"{'if' if n == 0 else 'elif'} {x} == {n}:")
                self.jump(target, pairs, k, ind + 1)
            if cases:
                e("else:")
                self.jump(a[1], a[2], k, ind + 1)
            else:
                self.jump(a[1], a[2], k, ind)
            return True
        elif name == "import.resolved":
            ordinal = a[0] & ~isa.IMPORT_BIT
            if not a[0] & isa.IMPORT_BIT or ordinal >= len(self.env.imports):
                self.bad(ins, f"vm.import.resolved of a function that is not an import: "
                              f"0x{a[0]:08X}", a[0])
            e(f"{R(a[1])} = {0 if self.env.imports[ordinal] is None else 1}")
        elif name == "trace":
            pass
        elif name == "print":
            args = "".join(", " + R(r) for r in a[1])
            e(f"_print({a[0]!r}{args})")
        else:
            self.unsupported(ins, "not supported by the translator")
        return False

    def global_op(self, ins: Instruction, ind: int):
        name, a, R = ins.op.name, ins.args, self.reg
        e = lambda text: self.emit(ind, text)  # noqa: E731
        t = name.rpartition(".")[2]
        size = {"i32": 4, "i64": 8, "f32": 4, "f64": 8}.get(t)
        if t == "ref":
            n = len(self.env.global_refs)
            if ".indirect." in name:
                idx = f"_global_index(_grefs, {R(a[0])})"
            else:
                if not 0 <= a[0] < n:
                    self.bad(ins, f"ref global {a[0]} out of range ({n})", a[0])
                idx = str(a[0])
            if name.startswith("global.load"):
                e(f"{R(a[2])} = _grefs[{idx}]")
            else:
                e(f"_grefs[{idx}] = {R(a[2])}")
            return
        if ".indirect." in name:
            off = f"_global_offset(_gb, {R(a[0])}, {size})"
        else:
            if a[0] + size > len(self.env.global_bytes):
                self.bad(ins, f"global byte offset {a[0]} + {size} past the "
                              f"{len(self.env.global_bytes)} bytes of globals", a[0])
            off = str(a[0])
        if name.startswith("global.load"):
            e(f"{R(a[1])} = _ld_{t}(_gb, {off})[0]")
        else:
            e(f"_st_{t}(_gb, {off}, {R(a[1])})")

    def cmp_op(self, ins: Instruction, ind: int):
        name, a, R = ins.op.name, ins.args, self.reg
        e = lambda text: self.emit(ind, text)  # noqa: E731
        parts = name.split(".")  # cmp, eq, i32[, s]
        rel, t = parts[1], parts[2]
        if rel == "nz":
            x = R(a[0])
            cond = f"{x} is not None" if t == "ref" else x
            e(f"{R(a[1])} = 1 if {cond} else 0")
            return
        if rel == "nan":
            x = R(a[0])
            e(f"{R(a[1])} = 1 if {x} != {x} else 0")
            return
        x, y, d = R(a[0]), R(a[1]), R(a[2])
        if t == "ref":
            e(f"{d} = 1 if {x} {'is' if rel == 'eq' else 'is not'} {y} else 0")
            return
        if t in ("i32", "i64") and len(parts) > 3 and parts[3] == "u":
            m = "4294967295" if t == "i32" else "18446744073709551615"
            x, y = f"({x} & {m})", f"({y} & {m})"
        sym = {"eq": "==", "ne": "!=", "lt": "<", "lte": "<="}[rel]
        cond = f"{x} {sym} {y}"
        if t in ("f32", "f64") and parts[3] == "u" and rel != "ne":
            cond = f"{x} != {x} or {y} != {y} or {cond}"
        e(f"{d} = 1 if {cond} else 0")

    def buffer_op(self, ins: Instruction, ind: int):
        name, a, R = ins.op.name, ins.args, self.reg
        e = lambda text: self.emit(ind, text)  # noqa: E731
        fn = "_" + name.replace(".", "_")
        if name in _BUF_LOAD:
            e(f"{R(a[2])} = {fn}({R(a[0])}, {R(a[1])})")
        elif name in _BUF_STORE:
            e(f"{fn}({R(a[0])}, {R(a[1])}, {R(a[2])})")
        elif name in _BUF_FILL:
            e(f"{fn}({R(a[0])}, {R(a[1])}, {R(a[2])}, {R(a[3])})")
        elif name == "buffer.alloc":
            e(f"{R(a[2])} = _buffer_alloc({R(a[0])}, {R(a[1])}, _mem)")
        elif name == "buffer.clone":
            e(f"{R(a[4])} = _buffer_clone({R(a[0])}, {R(a[1])}, {R(a[2])}, {R(a[3])}, _mem)")
        elif name == "buffer.length":
            e(f"{R(a[1])} = _buffer_length({R(a[0])})")
        elif name == "buffer.copy":
            e(f"_buffer_copy({', '.join(R(x) for x in a)})")
        elif name == "buffer.compare":
            e(f"{R(a[5])} = _buffer_compare({', '.join(R(x) for x in a[:5])})")
        elif name == "buffer.hash":
            e(f"{R(a[3])} = _buffer_hash({R(a[0])}, {R(a[1])}, {R(a[2])})")
        else:
            self.unsupported(ins, "not supported by the translator")

    def list_op(self, ins: Instruction, ind: int):
        name, a, R = ins.op.name, ins.args, self.reg
        e = lambda text: self.emit(ind, text)  # noqa: E731
        if name == "list.alloc":
            e(f"{R(a[2])} = _list_alloc({self.type_name(ins, a[0])!r}, {R(a[1])})")
        elif name == "list.reserve":
            e(f"_list({R(a[0])})")
        elif name == "list.size":
            e(f"{R(a[1])} = len(_list({R(a[0])}))")
        elif name == "list.resize":
            e(f"_list_resize({R(a[0])}, {R(a[1])}, _mem)")
        elif name in ("list.get.i32", "list.get.i64"):
            e(f"{R(a[2])} = _list_get_int({R(a[0])}, {R(a[1])}, {name[-2:]})")
        elif name in ("list.get.f32", "list.get.f64"):
            e(f"{R(a[2])} = _list_get_float({R(a[0])}, {R(a[1])}, {name[-2:]})")
        elif name == "list.get.ref":
            e(f"{R(a[3])} = _list_get_ref({R(a[0])}, {R(a[1])}, "
              f"{self.type_name(ins, a[2])!r})")
        elif name.startswith("list.set."):
            e(f"_list_set({R(a[0])}, {R(a[1])}, {R(a[2])})")
        else:
            self.unsupported(ins, "not supported by the translator")

    def call_op(self, ins: Instruction, ind: int):
        name, a, R = ins.op.name, ins.args, self.reg
        callee = a[0]
        variadic = "variadic" in name
        segments = a[1] if variadic else None
        operands = a[2] if variadic else a[1]
        results = a[-1]
        if callee & isa.IMPORT_BIT:
            ordinal = callee & ~isa.IMPORT_BIT
            if ordinal >= len(self.env.imports):
                self.bad(ins, f"import ordinal {ordinal} out of range "
                              f"({len(self.env.imports)} imports)", callee)
            fn = self.env.imports[ordinal]
            iname = (self.env.import_names[ordinal]
                     if ordinal < len(self.env.import_names) else f"import[{ordinal}]")
            inline = None
            if fn is None:
                target = self.const(_unresolved(iname, ordinal), "_imp",
                                    ("unres", iname, ordinal))
            else:
                target = self.const(fn, "_imp", ("imp", ordinal))
                inline = _inline_of(fn)
        else:
            if variadic:
                self.unsupported(ins, "variadic calls of internal functions")
            if self.env.functions and callee >= len(self.env.functions):
                self.bad(ins, f"function ordinal {callee} out of range "
                              f"({len(self.env.functions)} functions)", callee)
            target = f"_fns[{callee}]"
            iname = None
            inline = None
        if variadic:
            args = self.variadic_args(ins, callee & ~isa.IMPORT_BIT, iname, segments, operands)
        else:
            self.check_call(ins, callee, iname, operands, results)
            args = [R(r) for r in operands]
        call = f"{target}({', '.join(args)})"
        if inline is not None and len(results) <= 1:
            call = self.inline_call(inline, target, args, callee & ~isa.IMPORT_BIT) or call
        if not results:
            self.emit(ind, call)
        elif len(results) == 1:
            self.emit(ind, f"{R(results[0])} = {call}")
        else:
            self.emit(ind, ", ".join(R(r) for r in results) + f" = {call}")

    def inline_call(self, inline: list, target: str, args: list, ordinal: int):
        """The expression an import's ``vm_inline`` gives for a call with
        operands ``args`` (the first alternative that fits, see
        :func:`_inline_of`), or None when none fits the call. The import
        itself is ``target``; each object is bound as a constant rebound
        from the import (``("inl", ordinal, alternative, key)``)."""
        subs = {f"a{i}": a for i, a in enumerate(args)}
        subs["imp"] = target
        counts_of = {}
        for i, a in enumerate(args):
            names = _variadic_names(a) if a.startswith("(") else None
            if names is not None:
                counts_of[i] = len(names)
                for j, tup in enumerate(names):
                    for k, x in enumerate(tup):
                        subs[f"a{i}_{j}_{k}"] = x
        for n, (text, objects, counts) in enumerate(inline):
            if any(counts_of.get(i) != c for i, c in counts.items()):
                continue
            try:
                text.format(**{**subs, **{k: "_" for k in objects}})
            except (KeyError, IndexError, ValueError):
                continue
            mine = dict(subs)
            for key, value in objects.items():
                mine[key] = self.const(value, "_inl", ("inl", ordinal, n, key))
            return text.format(**mine)
        return None

    def switch(self, e, idx, dflt, vals, d) -> None:
        """``d = vals[idx]`` when ``idx`` is in range, else ``dflt`` (the
        ``vm.switch.*`` ops of every register bank)."""
        R, x = self.reg, self.reg(idx)
        if vals:
            tup = "(" + "".join(R(v) + ", " for v in vals) + ")"
            e(f"{R(d)} = {tup}[{x}] if 0 <= {x} < {len(vals)} else {R(dflt)}")
        else:
            e(f"{R(d)} = {R(dflt)}")

    def check_call(self, ins, callee: int, iname, operands, results) -> None:
        """A non-variadic call's operands and results against the callee's
        calling convention: count and register bank of each (as IREE's
        verifier; a caller may pass operands an internal function's
        signature no longer lists)."""
        env = self.env
        if callee & isa.IMPORT_BIT:
            ordinal = callee & ~isa.IMPORT_BIT
            cconvs = env.import_cconvs
            what = f"import {iname}"
        else:
            ordinal, cconvs = callee, getattr(env, "function_cconvs", [])
            what = f"function {ordinal}"
        cconv = cconvs[ordinal] if ordinal < len(cconvs) else None
        if cconv is None:
            return
        try:
            want, give = parse_cconv(cconv)
        except ValueError as err:
            self.bad(ins, f"{what}: {err}", cconv)
        if any(isinstance(t, tuple) for t in want):
            self.bad(ins, f"a non-variadic call of {what}, whose calling convention "
                          f"{cconv} is variadic", cconv)
        internal = not callee & isa.IMPORT_BIT
        if (len(operands) < len(want) if internal else len(operands) != len(want)) \
                or len(results) != len(give):
            self.bad(ins, f"the call passes {len(operands)} operands and takes "
                          f"{len(results)} results; {what} has calling convention "
                          f"{cconv}", cconv)
        for regs, types in ((operands, want), (results, give)):
            for r, t in zip(regs, types):
                if bool(r & isa.REF_BIT) != (t == "r"):
                    self.bad(ins, f"register {self.reg(r)} given for a {t} of {what} "
                                  f"({cconv})", r)

    def results(self) -> list:
        """The function's result types (``i I f F r``) from its calling
        convention."""
        cached = getattr(self, "_results", None)
        if cached is None:
            try:
                _, cached = parse_cconv(self.fn.cconv or "0v_v")
            except ValueError as e:
                raise BytecodeError(printable(str(e)), function=self.qual,
                                    offset=0, value=printable(self.fn.cconv)) from None
            self._results = cached
        return cached

    def check_banks(self, ins, regs, types, what: str) -> None:
        """Each register of ``regs`` in the bank of its type (``r``: the ref
        registers; ``i I f F``: the 32-bit registers), and as many registers
        as types, as IREE's verifier checks a register list against a
        calling convention (``BytecodeError`` naming the op and offset)."""
        if len(regs) != len(types):
            self.bad(ins, f"{len(regs)} registers given for {len(types)} "
                          f"{what}s", len(regs))
        for r, t in zip(regs, types):
            if bool(r & isa.REF_BIT) != (t == "r"):
                kind = "a ref" if t == "r" else "an integer or float"
                self.bad(ins, f"register {self.reg(r)} given for {what} of type "
                              f"{t} ({kind} is needed)", r)

    def variadic_args(self, ins, ordinal, iname, segments, operands) -> list[str]:
        env, R = self.env, self.reg
        cconv = env.import_cconvs[ordinal] if ordinal < len(env.import_cconvs) else None
        if cconv is None:
            cconv = getattr(env.imports[ordinal], "cconv", None)
        if cconv is None:
            self.unsupported(ins, f"no calling convention known for variadic import {iname}")
        try:
            items, give = parse_cconv(cconv)
        except ValueError as err:
            self.bad(ins, f"import {iname}: {err}", cconv)
        results = ins.args[-1]
        if len(results) != len(give):
            self.bad(ins, f"the call takes {len(results)} results; import {iname} "
                          f"has calling convention {cconv}", cconv)
        self.check_banks(ins, results, give, f"result of {iname}")
        if len(items) != len(segments):
            self.bad(ins, f"{len(segments)} segment sizes for the {len(items)} arguments "
                          f"of {iname} ({cconv})", len(segments))
        regs = [R(r) for r in operands]
        pos, out = 0, []
        for item, size in zip(items, segments):
            if not isinstance(item, tuple):
                if size not in (0xFFFF, 1):
                    self.bad(ins, f"segment size {size} for the non-variadic argument "
                                  f"of {iname}", size)
                self.check_banks(ins, operands[pos:pos + 1], [item],
                                 f"argument of {iname}")
                out.append(regs[pos] if pos < len(regs) else "None")
                pos += 1
                continue
            count = 1 if size == 0xFFFF else size
            width = len(item)
            tuples = []
            for _ in range(count):
                self.check_banks(ins, operands[pos:pos + width], item,
                                 f"argument of {iname}")
                tuples.append("(" + "".join(x + ", " for x in regs[pos:pos + width]) + ")")
                pos += width
            out.append("(" + "".join(x + ", " for x in tuples) + ")")
        if pos != len(regs):
            self.bad(ins, f"{len(regs)} operands for segments {list(segments)} of "
                          f"{iname} ({cconv})", len(regs))
        return out

    def float_op(self, ins: Instruction, ind: int) -> bool:
        name, a, R = ins.op.name, ins.args, self.reg
        e = lambda text: self.emit(ind, text)  # noqa: E731
        parts = name.split(".")
        f32 = ins.op.opset == isa.EXT_F32
        t = "f32" if f32 else "f64"
        rnd = (lambda x: f"_r32({x})") if f32 else (lambda x: x)
        op = parts[0]
        if name.startswith("global."):
            self.global_op(ins, ind)
        elif name == f"const.{t}.zero":
            e(f"{R(a[0])} = 0.0")
        elif name == f"const.{t}":
            e(f"{R(a[1])} = {_flit(a[0])}")
        elif op == "list":
            self.list_op(ins, ind)
        elif op == "buffer":
            self.buffer_op(ins, ind)
        elif op == "select":
            e(f"{R(a[3])} = {R(a[1])} if {R(a[0])} else {R(a[2])}")
        elif op == "switch":
            self.check_banks(ins, a[2], ["f"] * len(a[2]), "value")
            self.switch(e, *a)
        elif op == "cmp":
            self.cmp_op(ins, ind)
        elif op in ("add", "sub", "mul") and len(parts) == 2:
            sym = {"add": "+", "sub": "-", "mul": "*"}[op]
            d = R(a[2])
            expr = f"{R(a[0])} {sym} {R(a[1])}"
            if f32:
                e(f"try: {d} = _uf(_pf({expr}))[0]\nexcept OverflowError: {d} = _r32({expr})")
            else:
                e(f"{d} = {expr}")
        elif op == "div":
            e(f"{R(a[2])} = {rnd(f'_fdiv({R(a[0])}, {R(a[1])})')}")
        elif op == "rem":
            e(f"{R(a[2])} = _m_rem_{t}({R(a[0])}, {R(a[1])})")
        elif op == "fma":
            if f32:
                e(f"{R(a[3])} = _fma32({R(a[0])}, {R(a[1])}, {R(a[2])})")
            else:
                e(f"{R(a[3])} = {R(a[0])} * {R(a[1])} + {R(a[2])}")
        elif op == "abs":
            e(f"{R(a[1])} = abs({R(a[0])})")
        elif op == "neg":
            e(f"{R(a[1])} = -{R(a[0])}")
        elif op in ("ceil", "floor"):
            e(f"{R(a[1])} = _{op}({R(a[0])})")
        elif op == "round":
            fn = "_round_even" if name.endswith(".even") else "_round_away"
            e(f"{R(a[1])} = {fn}({R(a[0])})")
        elif op in ("min", "max"):
            x, y, d = R(a[0]), R(a[1]), R(a[2])
            if op == "min":
                e(f"{d} = {y} if {y} < {x} else {x}")
            else:
                e(f"{d} = {y} if {x} < {y} else {x}")
        elif op == "rsqrt":
            e(f"{R(a[1])} = _rsqrt{t[1:]}({R(a[0])})")
        elif f"{op}.{t}" in _MATH_FNS and len(parts) == 2:
            n = _MATH[op][2]
            args = ", ".join(R(x) for x in a[:n])
            e(f"{R(a[n])} = _m_{op}_{t}({args})")
        elif name in ("cast.si32.f32", "cast.si32.f64"):
            e(f"{R(a[1])} = {rnd(f'float({R(a[0])})')}")
        elif name in ("cast.ui32.f32", "cast.ui32.f64"):
            e(f"{R(a[1])} = {rnd(f'float({R(a[0])} & 4294967295)')}")
        elif name == "cast.si64.f32":
            e(f"{R(a[1])} = _int_to_f32({R(a[0])})")
        elif name == "cast.ui64.f32":
            e(f"{R(a[1])} = _int_to_f32({R(a[0])} & 18446744073709551615)")
        elif name == "cast.si64.f64":
            e(f"{R(a[1])} = float({R(a[0])})")
        elif name == "cast.ui64.f64":
            e(f"{R(a[1])} = float({R(a[0])} & 18446744073709551615)")
        elif name in ("cast.f32.si32", "cast.f32.ui32"):
            e(f"{R(a[1])} = _f2i32({R(a[0])})")
        elif name in ("cast.f64.si32", "cast.f64.ui32"):
            e(f"{R(a[1])} = _f2i32(_r32({R(a[0])}))")
        elif name in ("cast.f32.si64", "cast.f64.si64", "cast.f64.ui64"):
            e(f"{R(a[1])} = _lround64({R(a[0])})")
        elif name == "cast.f32.ui64":
            e(f"{R(a[1])} = _f2u64({R(a[0])})")
        elif name == "bitcast.i32.f32":
            e(f"{R(a[1])} = _bits_f32({R(a[0])})")
        elif name == "bitcast.f32.i32":
            e(f"{R(a[1])} = _f32_bits({R(a[0])})")
        elif name == "bitcast.i64.f64":
            e(f"{R(a[1])} = _bits_f64({R(a[0])})")
        elif name == "bitcast.f64.i64":
            e(f"{R(a[1])} = _f64_bits({R(a[0])})")
        elif name == "trunc.f64.f32":
            e(f"{R(a[1])} = _r32({R(a[0])})")
        elif name == "ext.f32.f64":
            e(f"{R(a[1])} = {R(a[0])}")
        else:
            self.unsupported(ins, "not supported by the translator")
        return False


def _pyname(ordinal: int) -> str:
    """The Python name of translated function ``ordinal``: made of the
    ordinal only (the module's names are data, never source text, so no
    name can fail to be an identifier or become another one under
    Python's NFKC normalization)."""
    return f"vm_f{ordinal}"


def translate(function, bytecode, env: Env, *, module_name: str = "module") -> Callable:
    """Translate one function.

    Args:
        function: its :class:`~hal_cpu.programs.vm.module_def.FunctionDef` (``ordinal``,
            ``name``, ``cconv``, ``i32_register_count``,
            ``ref_register_count`` are used).
        bytecode: its bytes (``ModuleDef.function_bytecode(ordinal)``).
        env: what the function sees (:class:`Env`).
        module_name: for names and messages.

    Returns:
        A Python function taking the function's arguments and returning its
        results (see :mod:`hal_cpu.programs.vm`). Its generated source is in its
        ``vm_source`` attribute.

    Raises:
        BytecodeError: malformed bytecode.
        UnsupportedOpError: an op the translator cannot run.
    """
    return _bind(_generate(function, bytecode, env, module_name), env)


def _generate(function, bytecode, env: Env, module_name: str) -> dict:
    """What :func:`_bind` needs to make the Python function of one VM
    function: its code object, source, line -> bytecode offset map, op
    names by offset, and how to bind its constants (``recipe``: None when
    a constant cannot be bound again from an :class:`Env`), plus the
    namespace of this translation (``ns``, not cached)."""
    qual = printable(f"{module_name}.{function.name}", 120)
    instrs = decode(bytecode, function=qual, i32_count=function.i32_register_count,
                    ref_count=function.ref_register_count)
    gen = _Gen(function, instrs, env, module_name)
    pyname = _pyname(function.ordinal)
    src = gen.source(pyname)
    code = compile(src, f"<vm function {function.ordinal}>", "exec")
    return {"ordinal": function.ordinal, "qual": qual, "pyname": pyname,
            "code": code, "src": src, "lines": gen.line_offsets,
            "ops": {ins.offset: ins.name for ins in instrs},
            "recipe": gen.recipe if gen.cacheable else None, "ns": gen.ns}


def _bind(t: dict, env: Env) -> Callable:
    """The Python function of a translation (:func:`_generate`, or one read
    from the cache, whose namespace is built from ``env`` and the recipe)."""
    ns = t.get("ns")
    if ns is None:
        ns = dict(_HELPERS)
        ns.update({"_fns": env.functions, "_gb": env.global_bytes,
                   "_grefs": env.global_refs, "_mem": env.memory})
        for name, origin in t["recipe"]:
            kind = origin[0]
            if kind == "val":
                ns[name] = origin[1]
            elif kind == "ro":
                ns[name] = env.rodata[origin[1]]
            elif kind == "imp":
                ns[name] = env.imports[origin[1]]
            elif kind == "inl":
                inline = _inline_of(env.imports[origin[1]])
                if inline is None:
                    raise KeyError(origin[3])
                ns[name] = inline[origin[2]][1][origin[3]]
            else:
                ns[name] = _unresolved(origin[1], origin[2])
    qual, ordinal = t["qual"], t["ordinal"]
    lines, ops = t["lines"], t["ops"]
    locate = env.locate
    holder: dict = {}

    def annotate(err):
        _annotate(err, holder["code"], lines, locate, ordinal)

    def operand_error(exc):
        return _operand_failure(exc, holder["code"], lines, ops, qual, locate,
                                ordinal)

    ns["_annotate"] = annotate
    ns["_operand_error"] = operand_error
    #: the function's name as messages show it (read by the time limit)
    ns["_vm_name"] = qual
    exec(t["code"], ns)
    fn = ns[t["pyname"]]
    holder["code"] = fn.__code__
    fn.vm_source = t["src"]
    fn.vm_name = qual
    return fn


# ---------------------------------------------------------------------------
# translations cached on disk, by content

#: The folder of cached translations in the runtime's private cache
#: (:func:`fatelf.private_dirs.cache_folder`).
CACHE_FOLDER = "vm-translations"

#: The layout of a cache file (changes when :func:`translate_module`'s
#: record changes).
_CACHE_FORMAT = 1

_translator_digest: list = []


def translator_version() -> str:
    """A digest of what generated code depends on: the translator's own
    source (this file, the opcode table and the decoder: each file's size
    and modification time in nanoseconds, what Python's own check of a
    ``.pyc`` against its source compares, so the key changes whenever the
    code that runs may have; reading and hashing the 110 KB of source
    cost a fifth of a millisecond of a process's first load) and the
    Python that compiled it (``marshal``'d code objects are specific to
    one Python version)."""
    if not _translator_digest:
        h = hashlib.sha256(f"{_CACHE_FORMAT}:{sys.implementation.cache_tag}:"
                           f"{sys.version}".encode())
        for path in (__file__, isa.__file__, _decode_module.__file__):
            try:
                st = os.stat(path)
                h.update(f"{path}:{st.st_size}:{st.st_mtime_ns};".encode())
            except (OSError, TypeError):
                h.update(b"?")
        _translator_digest.append(h.hexdigest()[:32])
    return _translator_digest[0]


def _module_key(mdef, env: Env, module_name: str) -> str:
    """The cache key of a module's translations: a digest of the translator
    (:func:`translator_version`) and of everything of the module the
    generated code depends on: its bytecode, its functions' signatures and
    register counts, its types, imports (names, calling conventions and
    which are resolved: ``vm.import.resolved`` is translated to a
    constant), the numbers of its read-only segments and globals. Not the
    contents of its read-only data (referenced, never copied into code)."""
    h = hashlib.sha256(translator_version().encode())
    h.update(bytes(mdef.bytecode))
    meta = (module_name, tuple(env.types), tuple(env.import_names),
            tuple(env.import_cconvs),
            tuple(fn is not None for fn in env.imports),
            tuple(getattr(fn, "cconv", None) for fn in env.imports),
            tuple(_inline_key(fn) for fn in env.imports),
            tuple((f.ordinal, f.name, f.cconv, f.i32_register_count,
                   f.ref_register_count, f.bytecode_offset, f.bytecode_length)
                  for f in mdef.functions),
            len(env.rodata), len(env.global_bytes), len(env.global_refs))
    h.update(repr(meta).encode())
    return h.hexdigest()


#: cache home -> the cache folder checked in it (see :func:`_cache_dir`)
_cache_dirs: dict = {}


def _cache_dir():
    """The cache folder, or None (``PKR_VM_CACHE=0``, or it cannot be made
    private: translations are then not kept).

    The whole chain of folders is checked once per process and cache home
    (:func:`fatelf.private_dirs.cache_folder`, a tenth of a millisecond
    of every load); later loads check the folder itself only
    (:func:`fatelf.private_dirs.is_private`: this user's directory, not a
    symlink, that nobody else can read or write). Its
    parents were private when checked, so only this user can have
    replaced them since."""
    if os.environ.get("PKR_VM_CACHE", "1") == "0":
        return None
    from fatelf import private_dirs
    # (what user_cache_home reads, without building its path)
    key = (os.environ.get("XDG_CACHE_HOME"), os.environ.get("HOME"))
    folder = _cache_dirs.get(key)
    if folder is not None:
        try:
            if private_dirs.is_private(os.lstat(folder), directory=True):
                return folder
        except OSError:
            pass
    try:
        folder = private_dirs.cache_folder(CACHE_FOLDER)
    except (OSError, private_dirs.UnsafePathError):
        return None
    folder = os.fspath(folder)
    _cache_dirs[key] = folder
    return folder


def _read_cached(path, count: int) -> list | None:
    """The records of a cache file, or None (missing, not this user's
    private file, unreadable, or not a record of ``count`` functions)."""
    from fatelf import private_dirs
    try:
        private_dirs.check_private_file(path)
        with open(path, "rb") as f:
            # one read, then loads: marshal.load on a file reads object by
            # object (a call into the file per object: ten times slower)
            data = marshal.loads(f.read())
    except (OSError, EOFError, ValueError, TypeError, private_dirs.UnsafePathError):
        return None
    if (not isinstance(data, tuple) or len(data) != 2 or data[0] != _CACHE_FORMAT
            or not isinstance(data[1], list) or len(data[1]) != count):
        return None
    keys = {"ordinal", "qual", "pyname", "code", "src", "lines", "ops", "recipe"}
    for t in data[1]:
        if not isinstance(t, dict) or set(t) != keys or not isinstance(t["recipe"], list):
            return None
    return data[1]


#: cache file -> (its lstat signature when read, its records): a file read
#: in this process is not read again while it is unchanged
_read_files: dict = {}
_READ_FILES_COUNT = 32


def _signature(path):
    """What identifies a cache file's version (device, inode, size, change
    time), or None: missing, or not a regular file of this user that
    nobody else can write (then it is read, and refused, as before)."""
    from fatelf import private_dirs
    try:
        st = os.lstat(path)
    except OSError:
        return None
    if not private_dirs.is_private(st, directory=False):
        return None
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def _remembered(path, count: int) -> list | None:
    """:func:`_read_cached`, once per version of the file in this process."""
    before = _signature(path)
    hit = _read_files.get(path)
    if before is not None and hit is not None and hit[0] == before:
        return hit[1] if len(hit[1]) == count else None
    records = _read_cached(path, count)
    if records is not None and before is not None and _signature(path) == before:
        _read_files.pop(path, None)
        while len(_read_files) >= _READ_FILES_COUNT:
            del _read_files[next(iter(_read_files))]
        _read_files[path] = (before, records)
    return records


def _write_cached(path, records: list) -> None:
    """Write a cache file atomically (a private temporary file renamed);
    a failure leaves no file and is not an error."""
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "wb") as f:
            marshal.dump((_CACHE_FORMAT, records), f)
        os.replace(tmp, path)
    except (OSError, ValueError):
        try:
            os.unlink(tmp)
        except OSError:
            pass


def translate_module(mdef, env: Env, *, module_name: str | None = None,
                     cache: bool = True) -> list[Callable]:
    """Translate every function of module ``mdef`` into ``env.functions``
    (:func:`translate` each), reusing the translations cached on disk for
    the same module, translator and link (:func:`_module_key`), and
    caching new ones.

    The cache: one file per module and link under the private cache folder
    ``vm-translations`` (:func:`fatelf.private_dirs.cache_folder`; a file
    is used only when it is this user's and nobody else can write it):
    each function's ``marshal``'d code object, generated source, line and
    op maps, and how to bind its constants (rodata, imports) from ``env``
    again. ``PKR_VM_CACHE=0`` turns it off; a file that cannot be read or
    written is ignored.

    Args:
        mdef: the :class:`~hal_cpu.programs.vm.module_def.ModuleDef`.
        env: its :class:`Env` (imports resolved: which are is part of the key).
        module_name: for names and messages (default ``mdef.name``).
        cache: use the cache.

    Returns:
        ``env.functions``, filled.

    Raises:
        BytecodeError, UnsupportedOpError: as :func:`translate`.
    """
    name = mdef.name if module_name is None else module_name
    functions = list(mdef.functions)
    if len(env.functions) < len(functions):
        env.functions.extend([None] * (len(functions) - len(env.functions)))
    folder = _cache_dir() if cache and functions else None
    path = None
    if folder is not None:
        path = os.path.join(folder, _module_key(mdef, env, name) + ".marshal")
        records = _remembered(path, len(functions))
        if records is not None:
            try:
                for t in records:
                    env.functions[t["ordinal"]] = _bind(t, env)
                return env.functions
            except (KeyError, IndexError, TypeError, ValueError):
                pass  # a record that does not fit: translate again
    made = [_generate(f, mdef.function_bytecode(f.ordinal), env, name) for f in functions]
    for t in made:
        env.functions[t["ordinal"]] = _bind(t, env)
    if path is not None and all(t["recipe"] is not None for t in made):
        _write_cached(path, [{k: v for k, v in t.items() if k != "ns"} for t in made])
    return env.functions
