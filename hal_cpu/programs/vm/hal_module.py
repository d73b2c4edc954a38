"""The ``hal`` module of a VM program, over :mod:`hal_cpu`'s executables.

A ``.vmfb`` compiled for the llvm-cpu backend imports its device work from
the module named ``hal`` (names and calling conventions of
``runtime/src/iree/modules/hal/exports.inl``; module version
:data:`HAL_MODULE_VERSION`). :class:`HalModule` serves those imports as
Python callables, as IREE's local CPU device (``local-task``) behaves:

* buffers live in host memory, 64-byte aligned (:mod:`hal_cpu.arrays`), so a
  native dispatch binds them in place; the program's executables
  (``hal.executable.create`` of ``embedded-elf-<arch>`` data) are loaded
  with :class:`hal_cpu.Executable` (natively or emulated, with executable
  plugins resolving their imports), one per read-only data buffer;
* a command buffer records its commands as prepared callables (a dispatch
  keeps its export, grid, constants and binding references, checked once);
  a queue submission resolves the binding table to addresses and runs the
  commands in order on the calling thread. A recorded dispatch is a
  :class:`hal_cpu.dispatch_policy.PreparedDispatch` (the engine
  :meth:`hal_cpu.Executable.dispatch` runs too), made once per export,
  grid, constants and binding lengths and run on the table's addresses:
  natively on the buffers' storage in place (a small grid in one crossing,
  only the binding pointers rewritten), emulated on guarded guest ranges
  it keeps (copied in, canaries checked, writable bindings copied back);
* every buffer's storage is 64-byte aligned and ends before an
  inaccessible guard page (:func:`hal_cpu.arrays.guarded_bytes`; fewer
  than 64 bytes of canary between), so a native kernel running past a
  buffer faults instead of returning other memory as a result; storage
  given back by ``queue.dealloca`` serves the next allocation of its size,
  and released reservations are pooled by size class; read-only data a
  program imports is copied once (kernels may write imports in place);
  every allocation counts against the program's memory limit
  (:class:`~hal_cpu.programs.vm.refs.MemoryBudget`, shared with the VM's own
  buffers and lists) before it is made;
* every queue operation runs when its wait fence is reached (at once for
  the usual already-signalled or null fence; otherwise when the program
  signals that fence) and then signals its signal fence, so
  ``hal.fence.await`` returns at once; a fence that failed makes the await
  fail with its status, as in IREE.

Failures are :class:`~hal_cpu.programs.vm.refs.VmStatusError` with IREE's status
codes (:data:`INVALID_ARGUMENT` for a null or mistyped ref and for a
function input of the wrong shape or element type, :data:`OUT_OF_RANGE` for
a byte range outside its buffer...); the errors of loading and running an
executable (:class:`hal_cpu.HalCpuError`, :mod:`elfloader` errors) pass
through unchanged.
"""

from __future__ import annotations

import fnmatch
import sys
import weakref
from typing import Any, Callable

import numpy as np

import elfloader
from fatelf import arches

from ... import arrays as _arrays
from ...arrays import default_memory_limit
from ...buffers import DTYPES, ML_DTYPE_NAMES, LazyTable, dtype_name
from ...dispatch_policy import DispatchBatch, PreparedDispatch, check_timeout, host_workers
from ...errors import DispatchError
from .refs import MemoryBudget, VmBuffer, VmStatusError

__all__ = ["HalModule", "HAL_MODULE_VERSION", "Device", "Allocator", "Buffer",
           "BufferView", "CommandBuffer", "Executable", "Fence", "File"]

#: The ``hal`` module's version (IREE's ``IREE_HAL_MODULE_VERSION_LATEST``,
#: 0.7); a program imports ``hal`` with a minimum version.
HAL_MODULE_VERSION = 7

# iree_status_code_t
OK = 0
INVALID_ARGUMENT = 3
DEADLINE_EXCEEDED = 4
NOT_FOUND = 5
PERMISSION_DENIED = 7
RESOURCE_EXHAUSTED = 8
FAILED_PRECONDITION = 9
OUT_OF_RANGE = 11
UNIMPLEMENTED = 12
INTERNAL = 13
DEFERRED = 17
STATUS_CODE_MASK = 0x1F

#: IREE_HAL_WHOLE_BUFFER as the VM passes it (an i64 of all ones).
WHOLE = -1

#: ``IREE_HAL_COMMAND_BUFFER_MODE_ONE_SHOT``: the command buffer is
#: submitted once.
MODE_ONE_SHOT = 1 << 0

# iree_hal_memory_type_t bits
MEMORY_TYPE_OPTIMAL = 1 << 0
#: What every buffer of a CPU device is: host visible, coherent, cached and
#: local, and device visible and local (one memory).
MEMORY_TYPE_CPU = (1 << 1) | (1 << 2) | (1 << 3) | (1 << 6) | (1 << 4) | (1 << 5)
# iree_hal_buffer_usage_t bits
USAGE_TRANSFER = 0x3
USAGE_DISPATCH_STORAGE = 0xC00
USAGE_SHARING_IMMUTABLE = 1 << 19
USAGE_MAPPING = (1 << 24) | (1 << 25) | (1 << 27)
#: The usage every host buffer of a CPU device allows besides what was
#: asked for: transfers, dispatch storage and mapping.
USAGE_CPU = USAGE_TRANSFER | USAGE_DISPATCH_STORAGE | USAGE_MAPPING
# iree_hal_encoding_type_t
ENCODING_OPAQUE = 0
ENCODING_DENSE_ROW_MAJOR = 1
# iree_hal_memory_access_t
ACCESS_READ = 1

#: The device's identifier, matched against ``hal.device.id`` patterns.
DEVICE_ID = "local-task"


def _id_matches(pattern: str) -> bool:
    """Whether :data:`DEVICE_ID` matches ``pattern`` (``fnmatch`` rules); a
    plain name or a ``prefix*`` is compared without compiling a regular
    expression (a tenth of a millisecond of a process's first load)."""
    if not any(c in pattern for c in "*?["):
        return pattern == DEVICE_ID
    head = pattern[:-1]
    if pattern[-1] == "*" and not any(c in head for c in "*?["):
        return DEVICE_ID.startswith(head)
    return fnmatch.fnmatchcase(DEVICE_ID, pattern)


#: Largest allocation a program may make, in bytes.
MAX_ALLOCATION = 1 << 40
#: Prepared dispatches an executable keeps for its recorded commands
#: (distinct export, grid, constants and binding lengths); past it they
#: are released and the next commands prepare theirs afresh.
MAX_PREPARED = 1024

#: Command buffers of one module holding a dispatch batch at once (each
#: batch holds a dispatch layout per dispatch); others run their dispatches
#: one by one.
MAX_BATCHES = 256
#: Results up to this many bytes are copied out to the caller; larger
#: ones are handed over without a copy.
SLAB_CHUNK_MAX = 1 << 14

_STATUS_NAMES = {
    0: "OK", 1: "CANCELLED", 2: "UNKNOWN", 3: "INVALID_ARGUMENT",
    4: "DEADLINE_EXCEEDED", 5: "NOT_FOUND", 6: "ALREADY_EXISTS",
    7: "PERMISSION_DENIED", 8: "RESOURCE_EXHAUSTED", 9: "FAILED_PRECONDITION",
    10: "ABORTED", 11: "OUT_OF_RANGE", 12: "UNIMPLEMENTED", 13: "INTERNAL",
    14: "UNAVAILABLE", 15: "DATA_LOSS", 16: "UNAUTHENTICATED", 17: "DEFERRED",
    18: "INCOMPATIBLE"}

#: CPU feature keys of the ``hal.cpu`` query category per architecture
#: (IREE's ``cpu_feature_bits.inl``: the LLVM feature names).
CPU_FEATURE_KEYS = {
    "aarch64": ("fp-armv8", "lse", "lse128", "fullfp16", "fp16fml", "dotprod",
                "i8mm", "bf16", "sve", "sve2", "sve2p1", "sve2-bitperm",
                "f32mm", "f64mm", "sme", "sme2", "sme2p1", "sme-f16f16",
                "sme-f64f64", "sme-i16i64"),
    "x86_64": ("sse3", "ssse3", "sse4.1", "sse4.2", "sse4a", "avx", "fma",
               "fma4", "xop", "f16c", "avx2", "avx512f", "avx512cd",
               "avx512vl", "avx512dq", "avx512bw", "avx512ifma", "avx512vbmi",
               "avx512vpopcntdq", "avx512vnni", "avx512vbmi2", "avx512bitalg",
               "avx512bf16", "avx512fp16", "amx-tile", "amx-int8", "amx-bf16"),
    "riscv64": ("v", "zvfhmin", "zvfh", "zvfbfwma", "xsmtvdot", "zvl256b",
                "zvl1024b", "zvl4096b"),
}


def _element_tables():
    from ..scalars import ELEMENT_CODES
    codes = dict(ELEMENT_CODES)

    def dtypes_of(names):
        out = {}
        for name in names:
            t = DTYPES.get(name)
            if t is not None:
                out[codes[name]] = np.dtype(t)
        return out
    # the ml_dtypes types (bf16, fp8...) added on first lookup of one
    later = [n for n in codes if n in ML_DTYPE_NAMES]
    return codes, LazyTable(dtypes_of(n for n in codes if n not in ML_DTYPE_NAMES),
                            [codes[n] for n in later], lambda: dtypes_of(later))


#: IREE element type name -> ``iree_hal_element_type_t``, and
#: ``iree_hal_element_type_t`` -> numpy dtype (where numpy has one).
ELEMENT_CODES, ELEMENT_DTYPES = _element_tables()
ELEMENT_NAMES = {v: k for k, v in ELEMENT_CODES.items()}


def _check_span(what: str, label: str, offset: int, length: int, total: int,
                noun: str) -> None:
    """Raises OUT_OF_RANGE naming ``what`` unless ``[offset, offset +
    length)`` lies in ``total`` bytes (``noun``: what holds them)."""
    if offset < 0 or length < 0 or offset + length > total:
        raise _status(OUT_OF_RANGE, f"{what}: {label} [{offset}, "
                      f"{offset + length}) lies outside the {total}-byte {noun}")


def _status(code: int, message: str) -> VmStatusError:
    return VmStatusError(code, message)


def _type_name(value) -> str:
    if value is None:
        return "null"
    return getattr(type(value), "vm_type", None) or type(value).__name__


def _bad_ref(value, cls, what: str) -> VmStatusError:
    """The error of a ref argument that is null or of another type."""
    return _status(INVALID_ARGUMENT, f"{what}: expected a {cls.vm_type}, got "
                                     f"{_type_name(value)}")


def _string(buf, what: str) -> str:
    if type(buf) is not VmBuffer:
        raise _bad_ref(buf, VmBuffer, what)
    return bytes(buf.data).decode("utf-8", "replace")


def _u32(v: int) -> int:
    return v & 0xFFFFFFFF


def _element_type_name(code: int) -> str:
    name = ELEMENT_NAMES.get(code)
    return name if name is not None else f"{code:08X}"


def _format_shape(shape) -> str:
    return "x".join(str(d) for d in shape)


# ---------------------------------------------------------------------------
# ref types

class Device:
    """A ``!hal.device``: the one local CPU device of a :class:`HalModule`."""

    __slots__ = ("module", "allocator")
    vm_type = "!hal.device"

    def __init__(self, module: "HalModule"):
        self.module = module
        self.allocator = Allocator(self)

    def __repr__(self) -> str:
        return f"<hal.device {DEVICE_ID} ({self.module.arch.name})>"


class Allocator:
    """A ``!hal.allocator``: the device's (host memory)."""

    __slots__ = ("device",)
    vm_type = "!hal.allocator"

    def __init__(self, device: Device):
        self.device = device

    def __repr__(self) -> str:
        return "<hal.allocator>"


class Buffer:
    """A ``!hal.buffer``: ``length`` bytes of host memory.

    Attributes:
        array: a uint8 numpy array of exactly the buffer's bytes (read-only
            for a buffer imported from read-only data).
        address: host address of its first byte.
        length: bytes.
        memory_type, usage: ``iree_hal_memory_type_t`` and
            ``iree_hal_buffer_usage_t`` bits the buffer has.
        root: the buffer owning the allocation (itself, unless a subspan).
        owners: (root) the allocation's preserve count.
        pooled: (root) the allocation came from ``queue.alloca`` and goes
            back to the module's pool on ``queue.dealloca``, or when the
            buffer object goes (see below).
        home: (pooled root) ``[pool]``: the module's pool (size -> free
            ``(array, address)`` list), ``[None]`` once the module is
            closed; None for any other buffer.

    A pooled root buffer dropped without ``queue.dealloca`` (a result the
    program hands to its caller, who drops it: IREE's allocator takes the
    storage back when the buffer's reference count reaches zero) gives its
    storage back to the pool as it goes, but only when nothing else can
    reach the storage: ``array`` referenced by this buffer alone, and the
    reservation's own array (``array.base``, every numpy view over the
    storage refers to it) by the store and ``array`` alone.
    """

    __slots__ = ("array", "address", "length", "memory_type", "usage", "parent",
                 "owners", "pooled", "home")
    vm_type = "!hal.buffer"

    def __init__(self, array: np.ndarray, address: int, memory_type: int,
                 usage: int, root: "Buffer | None" = None, pooled: bool = False):
        self.array = array
        self.address = address
        self.length = array.size
        self.memory_type = memory_type
        self.usage = usage
        # (None for a root: a buffer referring to itself would be a cycle,
        # freed only by the garbage collector, keeping its storage from the
        # pool until then)
        self.parent = root
        self.owners = 1
        self.pooled = pooled
        self.home: list | None = None

    def __del__(self, _refs=sys.getrefcount) -> None:
        if self.pooled:
            home = self.home
            if home is None:
                return
            pool = home[0]
            array = self.array
            # (array: this slot, the local and the argument; its base: the
            # store's entry, array's base pointer, the local and the
            # argument)
            if pool is None or _refs(array) != 3:
                return
            base = array.base
            if base is None or _refs(base) != 4:
                return
            self.pooled = False
            free = pool.get(self.length)
            if free is None:
                free = pool.setdefault(self.length, [])
            if len(free) < 4:
                free.append((array, self.address))

    @property
    def root(self) -> "Buffer":
        """The buffer owning the allocation (itself, unless a subspan)."""
        parent = self.parent
        return self if parent is None else parent

    def subspan(self, offset: int, length: int) -> "Buffer":
        """``length`` bytes from ``offset`` (checked by the caller)."""
        return Buffer(self.array[offset:offset + length], self.address + offset,
                      self.memory_type, self.usage, self.root)

    def __repr__(self) -> str:
        return f"<hal.buffer {self.length} bytes at {self.address:#x}>"


class BufferView:
    """A ``!hal.buffer_view``: a buffer with a shape, an element type
    (``iree_hal_element_type_t``) and an encoding type.

    ``dims`` holds the shape as the VM passes it (a tuple of 1-tuples);
    :attr:`shape` is the plain tuple."""

    __slots__ = ("buffer", "dims", "element_type", "encoding_type")
    vm_type = "!hal.buffer_view"

    def __init__(self, buffer: Buffer, dims: tuple, element_type: int,
                 encoding_type: int = ENCODING_DENSE_ROW_MAJOR):
        self.buffer = buffer
        self.dims = dims
        self.element_type = element_type
        self.encoding_type = encoding_type

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(d for (d,) in self.dims)

    def __repr__(self) -> str:
        return (f"<hal.buffer_view {_format_shape(self.shape)}x"
                f"{_element_type_name(self.element_type)}>")


class File:
    """A ``!hal.file`` over host memory (``hal.ex.file.from_memory``)."""

    __slots__ = ("array", "source")
    vm_type = "!hal.file"

    def __init__(self, array: np.ndarray, source):
        self.array, self.source = array, source

    def __repr__(self) -> str:
        return f"<hal.file {self.array.size} bytes>"


class Fence:
    """A ``!hal.fence``: a set of timepoints, reached when all are.

    A fence made by ``hal.fence.create`` is one timepoint (``parts`` is
    None): ``code`` is None while pending, 0 once signalled, a status code
    once failed (with ``message``); queue operations waiting on it sit in
    ``waiters`` until then. A joined fence lists its pending timepoints in
    ``parts``."""

    __slots__ = ("parts", "code", "message", "waiters")
    vm_type = "!hal.fence"

    def __init__(self, parts: tuple | None = None, code: int | None = None):
        self.parts = parts
        self.code = code
        self.message = ""
        self.waiters = None

    def __repr__(self) -> str:
        state = _fence_state(self)
        what = ("signalled" if state == 0 else "pending" if state is None
                else f"failed ({_STATUS_NAMES.get(state[0], state[0])})")
        return f"<hal.fence {what}>"


def _fence_state(fence: Fence):
    """0: reached; None: pending; (code, message): failed."""
    parts = fence.parts
    if parts is None:
        code = fence.code
        if code is None or code == 0:
            return code
        return code, fence.message
    pending = False
    for p in parts:
        code = p.code
        if code is None:
            pending = True
        elif code:
            return code, p.message
    return None if pending else 0


class CommandBuffer:
    """A ``!hal.command_buffer``: recorded commands, each a callable run
    with the submission's resolved binding table (None without one).

    Attributes:
        commands: the prepared commands, in order.
        need: binding-table slot -> bytes its commands reach (offset +
            length), checked against the table at submission.
        binding_capacity: slots the program said it would use.
        finalized: ``hal.command_buffer.finalize`` was called.
    """

    __slots__ = ("commands", "need", "binding_capacity", "finalized", "mode",
                 "categories", "steps", "batch", "batch_of", "__weakref__")
    vm_type = "!hal.command_buffer"

    def __init__(self, mode: int, categories: int, binding_capacity: int):
        self.commands: list[Callable] = []
        #: the commands as data, for a record-only submission
        #: (:attr:`HalModule.record`): ``("fill", ref, pattern)``,
        #: ``("update", ref, data)``, ``("copy", src, dst)``,
        #: ``("dispatch", executable, ordinal, grid, constants, refs)``,
        #: ``("indirect", executable, ordinal, counts, constants, refs)``
        self.steps: list[tuple] = []
        self.need: dict[int, int] = {}
        self.binding_capacity = binding_capacity
        self.finalized = False
        self.mode, self.categories = mode, categories
        #: the commands as one :class:`hal_cpu.dispatch_policy.DispatchBatch`
        #: (every one a native dispatch), made at the second submission
        #: (see :func:`batch_of`), or None
        self.batch: DispatchBatch | None = None
        #: how many commands :attr:`batch` was made for (-1: none seen; -2
        #: submitted once)
        self.batch_of = -1

    def __repr__(self) -> str:
        return f"<hal.command_buffer {len(self.commands)} commands>"


def batch_of(cb: CommandBuffer, live: list[int]) -> DispatchBatch | None:
    """The batch of ``cb``'s commands, made when every command is a native
    dispatch that can run in one (the ``batch_item`` of
    :meth:`Executable.dispatch_command`'s callables), else None: at the
    first submission of a finalized reusable command buffer, at the
    second submission of the same commands of any other (a one-shot
    command buffer, submitted once, never pays for it). ``live`` counts
    the batches the module's command buffers hold: at most
    :data:`MAX_BATCHES` (each holds dispatch layouts of its own)."""
    n = len(cb.commands)
    if cb.batch_of == n:
        return cb.batch
    if cb.batch is not None:
        cb.batch.close()    # (its finalizer counts it out)
        cb.batch = None
    if cb.batch_of != -2 - n and (cb.mode & MODE_ONE_SHOT or not cb.finalized):
        cb.batch_of = -2 - n            # (seen once with n commands)
        return None
    cb.batch_of = n
    items = []
    for cmd in cb.commands:
        item = getattr(cmd, "batch_item", None)
        if item is None:
            return None
        items.append(item)
    if not items or live[0] >= MAX_BATCHES:
        return None
    try:
        batch = cb.batch = DispatchBatch(items)
    except DispatchError:
        return None         # (e.g. executables on several backends)
    live[0] += 1
    weakref.finalize(cb, _drop_batch, batch, live)
    return batch


def _drop_batch(batch: DispatchBatch, live: list[int]) -> None:
    batch.close()
    live[0] -= 1


class _Table:
    """A submission's binding table, resolved: ``entries`` as the program
    gave them (buffer, offset, length), and per slot the length (lengths of
    :data:`WHOLE` resolved; -1 for a null buffer) and the host address of
    the slot's first byte."""

    __slots__ = ("entries", "lens", "addrs")

    def __init__(self, entries, lens, addrs):
        self.entries, self.lens, self.addrs = entries, lens, addrs


def _resolve(table: _Table | None, ref) -> tuple[Buffer, int, int]:
    """(buffer, offset, length) of a recorded buffer reference ``(slot,
    buffer or None, offset, length)``."""
    slot, buf, off, length = ref
    if buf is not None:
        return buf, off, length
    assert table is not None        # (a reference to a slot of the table)
    buf, base, _ = table.entries[slot]
    if length == WHOLE:
        length = table.lens[slot] - off
    return buf, base + off, length


class DispatchRecord:
    """A dispatch a traced program ran (:attr:`HalModule.trace`).

    Attributes:
        executable: the :class:`Executable`; ordinal: the export's ordinal;
        grid: workgroup count (x, y, z); constants: uint32 values;
        bindings: ``(buffer, offset, length)`` per binding, offsets in
            bytes from the start of ``buffer``'s storage.
    """

    __slots__ = ("executable", "ordinal", "grid", "constants", "bindings")

    def __init__(self, executable, ordinal, grid, constants, bindings):
        self.executable, self.ordinal, self.grid = executable, ordinal, grid
        self.constants, self.bindings = constants, bindings


def _traced(trace: list, cmd: Callable, executable, ordinal: int, grid, consts,
            refs) -> Callable:
    """``cmd`` appending a :class:`DispatchRecord` to ``trace`` each run."""
    def run(table):
        bindings = []
        for ref in refs:
            buf, off, n = _resolve(table, ref)
            bindings.append((buf, off, n))
        trace.append(DispatchRecord(executable, ordinal, grid, tuple(consts),
                                    bindings))
        cmd(table)
    return run


class Executable:
    """A ``!hal.executable``: a loaded :class:`hal_cpu.Executable` and the
    prepared dispatches (:class:`hal_cpu.dispatch_policy.PreparedDispatch`)
    of its recorded commands."""

    __slots__ = ("library", "format", "native", "closed", "names", "module",
                 "source", "prepared")
    vm_type = "!hal.executable"

    def __init__(self, module: "HalModule", library, fmt: str, source):
        self.module = module
        self.library = library
        self.format = fmt
        self.source = source
        self.native = getattr(library.backend, "kind", "") == "native"
        self.closed = False
        self.names = {e.name: e.ordinal for e in library.exports if e.name}
        #: (ordinal, grid, constants, lengths) -> the prepared dispatch
        #: the commands recorded with them share
        self.prepared: dict[tuple, PreparedDispatch] = {}

    def __repr__(self) -> str:
        return f"<hal.executable {self.library.name} ({self.format})>"

    @property
    def guarded(self) -> list[int]:
        """Guest addresses of the guarded binding ranges its recorded
        dispatches hold (emulated backends; freed on close)."""
        return [g for p in self.prepared.values() for g in p.guarded_ranges]

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.prepared = {}
        # (frees the layouts and guarded ranges once no dispatch runs)
        self.library.close()

    def dispatch_command(self, ordinal: int, grid: tuple[int, int, int],
                         constants: list[int], refs: list[tuple]) -> Callable:
        """A recorded dispatch as a callable of the resolved binding table,
        run by one :class:`~hal_cpu.dispatch_policy.PreparedDispatch`
        (made here: export, grid, constants and binding lengths checked
        once): natively on the buffers' storage in place (64-byte aligned),
        emulated through guarded guest ranges kept for the command's life.

        ``refs`` are ``(slot, buffer or None, offset, length)``; a null
        buffer reads the slot of the table (length :data:`WHOLE`: the rest
        of the slot's range)."""
        lib = self.library
        module = self.module
        x, y, z = grid
        if x * y * z == 0:
            return lambda table: None
        dynamic = any(r[3] == WHOLE and r[1] is None for r in refs)
        lengths = [r[3] for r in refs]
        key = (ordinal, grid, tuple(constants), None if dynamic else tuple(lengths))
        prepared = self.prepared.get(key)
        if prepared is None:
            prepared = lib.prepare(ordinal, grid, constants,
                                   len(refs) if dynamic else lengths,
                                   workers=module.workers)
            if len(self.prepared) >= MAX_PREPARED:
                # (commands recorded with the ones dropped keep theirs)
                for old in self.prepared.values():
                    old.close()
                self.prepared.clear()
            self.prepared[key] = prepared
        run_addresses = prepared.run_addresses
        me = self
        spec = tuple((r[0], r[2]) if r[1] is None else (-1, r[1].address + r[2])
                     for r in refs)
        if self.native and not dynamic:
            if all(r[1] is None for r in refs):
                fast = prepared.runner()

                def run_from_table(table: _Table) -> None:
                    # (the common case: every binding from the table)
                    if me.closed:
                        _unloaded()
                    a = table.addrs
                    if module.timeout:
                        run_addresses([a[s] + o for s, o in spec], lengths,
                                      timeout=module.timeout)
                    else:
                        fast([a[s] + o for s, o in spec])
                if prepared.batchable:
                    run_from_table.batch_item = (prepared, spec)  # type: ignore[attr-defined]
                return run_from_table

            def run_native(table: _Table | None) -> None:
                if me.closed:
                    _unloaded()
                a = table.addrs if table is not None else ()
                run_addresses([o if s < 0 else a[s] + o for s, o in spec],
                              lengths, timeout=module.timeout)
            if prepared.batchable:
                run_native.batch_item = (prepared, spec)  # type: ignore[attr-defined]
            return run_native
        fixed = tuple(r[1] for r in refs)

        def run(table: _Table | None) -> None:
            if me.closed:
                _unloaded()
            pointers, sizes, writable = [], [], []
            for (s, o), buf, length in zip(spec, fixed, lengths):
                if s < 0:
                    pointers.append(o)
                    writable.append(buf.array.flags.writeable)
                else:
                    assert table is not None   # (a slot of the table)
                    pointers.append(table.addrs[s] + o)
                    writable.append(table.entries[s][0].array.flags.writeable)
                    if length == WHOLE:
                        length = table.lens[s] - o
                sizes.append(length)
            run_addresses(pointers, sizes, writable=writable,
                          timeout=module.timeout)
        return run


def _unloaded() -> None:
    raise _status(FAILED_PRECONDITION, "the executable was unloaded (the HAL "
                  "module is closed)")


# ---------------------------------------------------------------------------
# the module

class HalModule:
    """The ``hal`` module's exports for one program instance.

    Args:
        arch: architecture of the executables (name or alias, e.g.
            ``x86_64``, ``arm64``); ``hal.executable.create`` accepts the
            ``embedded-elf-<arch>`` format only, and device queries answer
            for it.
        backend: ``"auto"``, ``"native"`` or ``"emulated"`` (as
            :class:`hal_cpu.Executable`).
        engine, cpu: emulation engine and CPU profile (as
            :class:`hal_cpu.Executable`); ``cpu`` also gives the
            ``hal.cpu`` feature answers its compiler flags name.
        plugins: a :class:`hal_cpu.PluginManager` resolving the executables'
            imports (its backend runs them).
        workers: host threads per dispatch (None: :class:`hal_cpu.Executable`'s
            default: one for small grids).
        fill_byte: initial value of every byte the program allocates.
        memory_limit: bytes of buffers the program may hold at once
            (allocations, inputs, copies of imported data); default
            :func:`default_memory_limit`. A request past it is a
            ``VmStatusError`` (RESOURCE_EXHAUSTED) naming the op and the
            size, before anything is allocated.

    Attributes:
        name: ``"hal"``; version: :data:`HAL_MODULE_VERSION`.
        exports: ``"hal.<export>"`` -> (calling convention, callable).
        device: the ``!hal.device`` (``hal.devices.get(0)``).
        timeout: seconds each dispatch may take (None: no limit); settable.

    Use as a context manager, or call :meth:`close`.
    """

    name = "hal"
    version = HAL_MODULE_VERSION

    def __init__(self, *, arch: str, backend: str = "auto",
                 engine: str | None = None, cpu: str | None = None,
                 plugins=None, workers: int | None = None, fill_byte: int = 0,
                 memory_limit: int | None = None):
        self.arch = arches.lookup(arch, runtime=True)
        self.backend, self.engine, self.cpu = backend, engine, cpu
        self.plugins = plugins
        if workers is not None and (isinstance(workers, bool)
                                    or not isinstance(workers, int) or workers < 1):
            raise ValueError(f"{workers!r} is not a positive number of workers")
        self.workers = workers
        if not isinstance(fill_byte, int) or not 0 <= fill_byte <= 255:
            raise ValueError(f"fill_byte {fill_byte!r} is not a byte value")
        self.fill_byte = fill_byte
        self._timeout: float | None = None
        self.device = Device(self)
        self.format = self.arch.iree_format
        self._executables: dict[tuple, tuple[VmBuffer, Executable]] = {}
        self._pool: dict[int, list[tuple[np.ndarray, int]]] = {}
        # (what a pooled buffer gives its storage back to as it goes: see
        # Buffer; [None] once closed)
        self._home: list = [self._pool]
        # (batches the command buffers hold: see batch_of)
        self._batches = [0]
        # (dtype, shape) of inputs and (dims, element type) of results seen
        self._inputs: dict[tuple, tuple] = {}
        self._outputs: dict[tuple, tuple] = {}
        if memory_limit is None:
            memory_limit = default_memory_limit()
        if isinstance(memory_limit, bool) or not isinstance(memory_limit, int) \
                or memory_limit <= 0:
            raise ValueError(f"memory_limit {memory_limit!r} is not a positive "
                             "number of bytes")
        self.memory_limit = memory_limit
        #: the program's one memory limit (every VM allocation counts)
        self.memory = MemoryBudget(memory_limit)
        # buffers' storage, ending before guard pages, reused once free
        self._store = _arrays.GuardedStore(self.memory)
        self._features = self._cpu_features()
        self._closed = False
        #: a list to append a :class:`DispatchRecord` to for every dispatch
        #: run (set before the program records its command buffers), or None
        self.trace: list | None = None
        #: a :class:`hal_cpu.programs.vm.plan.Recording`: submitted commands and
        #: queue fills and copies are recorded there, not run, and a host
        #: read of a buffer they write is refused; or None (run them)
        self.record = None
        self.exports: dict[str, tuple[str, Callable]] = {
            "hal." + name: (cconv, getattr(self, name.replace(".", "_")))
            for name, cconv in _EXPORTS}

    @property
    def timeout(self) -> float | None:
        """Seconds each dispatch may take (None or 0: no limit)."""
        return self._timeout

    @timeout.setter
    def timeout(self, value: float | None) -> None:
        check_timeout(value, "timeout", None)
        self._timeout = value or None

    # -- host side -----------------------------------------------------------
    def wrap_input(self, array) -> BufferView:
        """A function input (numpy array) as a ``!hal.buffer_view``, its bytes
        copied once into new 64-byte-aligned storage (kernels never see the
        caller's array)."""
        if type(array) is not np.ndarray:
            array = np.asarray(array)
        key = (array.dtype, array.shape)
        info = self._inputs.get(key)
        if info is None:
            info = self._input_info(array, key)
        code, nbytes, dims = info
        # (a small input: its bytes in C order, written by the store, one
        # short copy more but fewer steps than a cast view)
        small = array.tobytes() if nbytes <= 4096 else None
        try:
            storage, address = self._store.take(nbytes, "an input", small)
        except (MemoryError, elfloader.ElfError):
            raise _status(RESOURCE_EXHAUSTED, f"an input: {nbytes} bytes: the "
                          "host has no memory for them") from None
        if small is None:
            try:
                storage.data[:] = memoryview(array).cast("B")
            except (TypeError, ValueError, NotImplementedError):
                # (not C-contiguous, 0-d, or a dtype without a buffer format)
                np.copyto(storage.view(array.dtype).reshape(array.shape), array,
                          casting="no")
        return BufferView(Buffer(storage, address, MEMORY_TYPE_CPU, USAGE_CPU),
                          dims, code, ENCODING_DENSE_ROW_MAJOR)

    def _input_info(self, array: np.ndarray, key) -> tuple:
        name = dtype_name(array.dtype)
        if name[:1] == "i" and name != "i1":
            name = "s" + name       # signed, as IREE's Python binding has it
        code = ELEMENT_CODES.get(name)
        if code is None:
            raise _status(INVALID_ARGUMENT, f"dtype {array.dtype} has no HAL "
                          "element type")
        info = (code, array.nbytes, tuple((int(d),) for d in array.shape))
        if len(self._inputs) >= 1024:
            self._inputs.clear()
        self._inputs[key] = info
        return info

    def to_numpy(self, view) -> np.ndarray:
        """A numpy array of ``view``'s shape and element type holding its
        data: a copy for small results, the buffer's own storage (handed
        over: the module never reuses it) for large ones.

        Raises:
            VmStatusError: not a buffer view; an element type numpy has no
                dtype for; a buffer shorter than the shape says.
        """
        if type(view) is not BufferView:
            raise _bad_ref(view, BufferView, "to_numpy")
        key = (view.dims, view.element_type)
        info = self._outputs.get(key)
        if info is None:
            info = self._output_info(view, key)
        shape, dtype, nbytes = info
        buf = view.buffer
        if self.record is not None:
            self.record.read(buf, "a host read of a buffer view")
        if nbytes > buf.length:
            raise _status(OUT_OF_RANGE, f"buffer view {_format_shape(shape)}x"
                          f"{_element_type_name(view.element_type)} needs "
                          f"{nbytes} bytes; its buffer has {buf.length}")
        if nbytes > SLAB_CHUNK_MAX and buf.root.length > SLAB_CHUNK_MAX:
            # a large result is handed over without a copy: its storage
            # leaves the module (never pooled for reuse again) and lives as
            # long as the array
            buf.root.pooled = False
            return _as_array(shape, dtype, buf)
        try:
            return np.ndarray(shape, dtype, buf.array).copy()
        except (TypeError, ValueError):
            return _as_array(shape, dtype, buf).copy()  # (raises its OUT_OF_RANGE)

    def _output_info(self, view: BufferView, key) -> tuple:
        dtype = ELEMENT_DTYPES.get(view.element_type)
        if dtype is None:
            raise _status(UNIMPLEMENTED, "no numpy dtype for element type "
                          f"{_element_type_name(view.element_type)}")
        shape = view.shape
        count = 1
        for d in shape:
            if d < 0:
                raise _status(INVALID_ARGUMENT, f"buffer view dimension {d} is "
                              "negative")
            count *= d
        info = (shape, dtype, count * dtype.itemsize)
        if len(self._outputs) >= 1024:
            self._outputs.clear()
        self._outputs[key] = info
        return info

    def close(self) -> None:
        """Unload every executable (closing again does nothing)."""
        if self._closed:
            return
        self._closed = True
        entries, self._executables = self._executables, {}
        for _, exe in entries.values():
            exe.close()
        self._home[0] = None
        self._pool.clear()
        self._store.close()

    def __enter__(self) -> "HalModule":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"<HalModule {self.arch.name} backend={self.backend} "
                f"executables={len(self._executables)}>")

    # -- helpers ---------------------------------------------------------------
    def _cpu_features(self) -> dict[str, int]:
        keys = CPU_FEATURE_KEYS.get(self.arch.name, ())
        answers = dict.fromkeys(keys, 0)
        if self.cpu is not None:
            try:
                profile = arches.profile(self.arch.name, self.cpu)
            except Exception:  # noqa: BLE001 - Executable reports bad profiles
                profile = None
            for flag in getattr(profile, "iree_flags", ()):
                if flag.startswith("--iree-llvmcpu-target-cpu-features="):
                    for f in flag.split("=", 1)[1].split(","):
                        if f.startswith("+") and f[1:] in answers:
                            answers[f[1:]] = 1
        return answers

    def _pooled(self, size: int):
        """A pooled ``(array, address)`` of ``size`` bytes, taken from the
        pool, or None. (The free list is looked at before popping: an empty
        one, as for a buffer the program hands to its caller on every call,
        costs no exception.)"""
        free = self._pool.get(size)
        if free:
            try:
                return free.pop()
            except IndexError:      # (another thread took it)
                pass
        return None

    def _allocate(self, size: int, memory_type: int, usage: int,
                  pooled: bool, what: str = "hal.allocator.allocate") -> Buffer:
        if size < 0:
            raise _status(INVALID_ARGUMENT, f"{what}: allocation of {size} bytes")
        taken = self._pooled(size)
        if taken is None:
            try:
                taken = self._store.take(size, what)
            except (MemoryError, elfloader.ElfError):
                raise _status(RESOURCE_EXHAUSTED, f"{what}: {size} bytes: the "
                              "host has no memory for them") from None
        array, address = taken
        array.fill(self.fill_byte)
        return Buffer(array, address, (memory_type & 0xFFFFFFFE) | MEMORY_TYPE_CPU,
                      (usage & 0xFFFFFFFF) | USAGE_CPU, None, pooled)

    def _charge(self, nbytes: int, what: str) -> None:
        """Count ``nbytes`` against :attr:`memory_limit`, or raise."""
        self.memory.charge(nbytes, what)

    def _uncharge(self, nbytes: int) -> None:
        self.memory.uncharge(nbytes)

    def _new_storage(self, size: int, what: str = "allocation") -> tuple[np.ndarray, int]:
        """Uninitialized 64-byte-aligned bytes and their address, counted
        against the memory limit: storage of the module's
        :class:`hal_cpu.arrays.GuardedStore`, ending before an inaccessible
        guard page (fewer than 64 bytes of canary between), so that a
        kernel bound to it natively faults rather than reading or writing
        past it; a reservation no buffer uses any more serves the next
        allocation of its size class without a system call.

        Raises:
            VmStatusError: RESOURCE_EXHAUSTED past the memory limit, or when
                the host has no memory for it.
        """
        if size < 0:
            raise _status(INVALID_ARGUMENT, f"{what}: allocation of {size} bytes")
        try:
            return self._store.take(size, what)
        except (MemoryError, elfloader.ElfError):
            raise _status(RESOURCE_EXHAUSTED, f"{what}: {size} bytes: the "
                          "host has no memory for them") from None

    def _release(self, buf: Buffer) -> None:
        root = buf.root
        if root.pooled and root is buf:
            root.pooled = False
            free = self._pool.setdefault(root.length, [])
            if len(free) < 4:
                free.append((root.array, root.address))

    def _queue(self, wait, signal, fn: Callable, *args) -> None:
        """Run ``fn(*args)`` once ``wait`` is reached, then signal
        ``signal``; failures of ``wait`` pass to ``signal``."""
        if wait is not None and not (type(wait) is Fence and wait.parts is None
                                     and wait.code == 0):
            if type(wait) is not Fence:
                raise _bad_ref(wait, Fence, "wait fence")
            state = _fence_state(wait)
            if state is None:
                op = [False, wait, signal, fn, args]
                for p in (wait,) if wait.parts is None else wait.parts:
                    if p.code is None:
                        if p.waiters is None:
                            p.waiters = []
                        p.waiters.append(op)
                return
            if state != 0:
                _fail_fence(signal, *state)
                return
        if signal is not None and type(signal) is not Fence:
            raise _bad_ref(signal, Fence, "signal fence")
        try:
            fn(*args)
        except VmStatusError as exc:
            _fail_fence(signal, exc.code, exc.message)
            raise
        except BaseException as exc:
            _fail_fence(signal, INTERNAL, str(exc))
            raise
        if signal is not None:
            _signal_fence(signal)

    @staticmethod
    def _check_range(buf: Buffer, offset: int, length: int, what: str) -> int:
        """``length`` (:data:`WHOLE`: the rest of ``buf``) after checking
        ``[offset, offset + length)`` lies in ``buf``."""
        if length == WHOLE:
            length = buf.length - offset
        _check_span(what, "byte range", offset, length, buf.length, "buffer")
        return length

    # -- devices ---------------------------------------------------------------
    def devices_count(self) -> int:
        return 1

    def devices_get(self, index: int):
        return self.device if index == 0 else None

    def device_allocator(self, device) -> Allocator:
        if type(device) is not Device:
            raise _bad_ref(device, Device, "hal.device.allocator")
        return device.allocator

    def device_query_i64(self, device, category, key) -> tuple[int, int]:
        if type(device) is not Device:
            raise _bad_ref(device, Device, "hal.device.query.i64")
        cat = _string(category, "hal.device.query.i64 category")
        k = _string(key, "hal.device.query.i64 key")
        if cat == "hal.device.id":
            return 1, int(_id_matches(k))
        if cat == "hal.executable.format":
            return 1, int(k.startswith(self.format) or k == "vmvx-bytecode-fb")
        if cat == "hal.device" and k == "concurrency":
            return 1, 1
        if cat == "hal.dispatch" and k == "concurrency":
            return 1, self.workers or host_workers()
        if cat == "hal.cpu" and k in self._features:
            return 1, self._features[k]
        return 0, 0

    def allocator_select(self, memory_types: int, usage: int, flags: int,
                         pairs) -> tuple:
        if not pairs:
            raise _status(INVALID_ARGUMENT, "at least one device/queue affinity "
                          "pair must be provided")
        device, affinity = pairs[0]
        if type(device) is not Device:
            raise _bad_ref(device, Device, "hal.allocator.select")
        return device, affinity

    # -- allocation ------------------------------------------------------------
    def allocator_allocate(self, allocator, affinity: int, memory_types: int,
                           usage: int, size: int) -> Buffer:
        if type(allocator) is not Allocator:
            raise _bad_ref(allocator, Allocator, "hal.allocator.allocate")
        return self._allocate(size, memory_types, usage, False,
                              "hal.allocator.allocate")

    def allocator_import(self, allocator, try_: int, affinity: int,
                         memory_types: int, usage: int, source, offset: int,
                         length: int):
        if type(allocator) is not Allocator:
            raise _bad_ref(allocator, Allocator, "hal.allocator.import")
        if type(source) is not VmBuffer:
            raise _bad_ref(source, VmBuffer, "hal.allocator.import source")
        total = len(source.data)
        if length == WHOLE:
            length = total
        if length < 0 or offset < 0 or offset + length > total:
            raise _status(INVALID_ARGUMENT, f"byte range out of bounds (requested "
                          f"{offset}-{offset + length - 1} of available {total})")
        usage = _u32(usage)
        if source.readonly and not usage & USAGE_SHARING_IMMUTABLE:
            raise _status(PERMISSION_DENIED, "source buffer is immutable and can "
                          "only be imported for constant usage")
        array = np.frombuffer(source.data, np.uint8, length, offset)
        if source.readonly:
            # Kernels may write an imported constant in place (iree-compile
            # sorts an unfoldable constant where it lies): the module's data
            # must not change (nor fault, when mapped read-only), so the
            # buffer is a private aligned copy.
            array, address = self._new_storage(length, "hal.allocator.import")
            array[:] = np.frombuffer(source.data, np.uint8, length, offset)
        elif source.guarded and not array.ctypes.data % _arrays.BINDING_ALIGNMENT:
            # (a buffer the program allocated: its storage ends before a
            # guard page, so a native kernel may bind it in place)
            address = array.ctypes.data
        else:
            # Kernels bind buffers in place natively, and only aligned
            # storage that ends before a guard page may be bound: a
            # try-import fails (the program copies into an allocation), an
            # import copies.
            if try_:
                return None
            copy, address = self._new_storage(length, "hal.allocator.import")
            copy[:] = array
            array = copy
        memory = (_u32(memory_types) & ~MEMORY_TYPE_OPTIMAL) | MEMORY_TYPE_CPU
        buf = Buffer(array, address, memory, usage | USAGE_CPU)
        if self.record is not None:
            self.record.load(buf)     # (the module's data: a constant)
        return buf

    def ex_file_from_memory(self, device, affinity: int, access: int, buffer,
                            offset: int, length: int, flags: int) -> File:
        if type(device) is not Device:
            raise _bad_ref(device, Device, "hal.ex.file.from_memory")
        if type(buffer) is not VmBuffer:
            raise _bad_ref(buffer, VmBuffer, "hal.ex.file.from_memory buffer")
        if _u32(access) & ~ACCESS_READ:
            raise _status(PERMISSION_DENIED, "only read-only memory can be "
                          "accessed via a file handle (today)")
        _check_span("hal.ex.file.from_memory", "file range", offset, length,
                    len(buffer.data), "buffer")
        return File(np.frombuffer(buffer.data, np.uint8, length, offset), buffer)

    # -- buffers ----------------------------------------------------------------
    def buffer_assert(self, buffer, message, allocator, minimum_length: int,
                      memory_types: int, usage: int) -> None:
        if type(buffer) is not Buffer:
            raise _bad_ref(buffer, Buffer, _string(message, "message")
                           if type(message) is VmBuffer else "hal.buffer.assert")
        if type(message) is not VmBuffer:
            raise _bad_ref(message, VmBuffer, "hal.buffer.assert message")
        if buffer.length < minimum_length:
            raise _status(INVALID_ARGUMENT, f"{_string(message, '')} buffer byte "
                          f"length {buffer.length} less than expected minimum "
                          f"{minimum_length}")
        memory_types &= 0xFFFFFFFF
        if buffer.memory_type & memory_types != memory_types:
            raise _status(PERMISSION_DENIED, f"{_string(message, '')} buffer "
                          "memory type is not compatible; buffer has "
                          f"{buffer.memory_type:08X}, operation requires "
                          f"{memory_types:08X}")
        usage &= 0xFFFFFFFF
        if buffer.usage & usage != usage:
            raise _status(PERMISSION_DENIED, f"{_string(message, '')} requested "
                          "usage was not specified when the buffer was allocated; "
                          f"buffer allows {buffer.usage:08X}, operation requires "
                          f"{usage:08X}")
        if type(allocator) is not Allocator:
            raise _bad_ref(allocator, Allocator, "hal.buffer.assert allocator")

    def buffer_subspan(self, buffer, offset: int, length: int) -> Buffer:
        if type(buffer) is not Buffer:
            raise _bad_ref(buffer, Buffer, "hal.buffer.subspan")
        length = self._check_range(buffer, offset, length,
                                   "invalid subspan of an existing buffer")
        return buffer.subspan(offset, length)

    def buffer_length(self, buffer) -> int:
        if type(buffer) is not Buffer:
            raise _bad_ref(buffer, Buffer, "hal.buffer.length")
        return buffer.length

    def buffer_load(self, buffer, offset: int, length: int) -> int:
        if type(buffer) is not Buffer:
            raise _bad_ref(buffer, Buffer, "hal.buffer.load")
        if not 0 <= length <= 4:
            raise _status(INVALID_ARGUMENT, f"load length byte count {length} "
                          "exceeds max")
        self._check_range(buffer, offset, length, "hal.buffer.load")
        if self.record is not None:
            self.record.read(buffer, "hal.buffer.load")
        v = int.from_bytes(buffer.array[offset:offset + length].tobytes(),
                           "little")
        return v - (1 << 32) if v >> 31 else v

    def buffer_store(self, value: int, buffer, offset: int, length: int) -> None:
        if type(buffer) is not Buffer:
            raise _bad_ref(buffer, Buffer, "hal.buffer.store")
        if not 0 <= length <= 4:
            raise _status(INVALID_ARGUMENT, f"store length byte count {length} "
                          "exceeds max")
        if offset < 0 or offset + length > buffer.length:
            raise _status(OUT_OF_RANGE, f"store out of bounds (target_offset="
                          f"{offset}, length={length} into max {buffer.length})")
        if not buffer.array.flags.writeable:
            raise _status(PERMISSION_DENIED, "store into a read-only buffer")
        data = (value & 0xFFFFFFFF).to_bytes(4, "little")[:length]
        buffer.array[offset:offset + length] = np.frombuffer(data, np.uint8)

    def buffer_allocation_preserve(self, buffer) -> None:
        if type(buffer) is not Buffer:
            raise _bad_ref(buffer, Buffer, "hal.buffer.allocation.preserve")
        buffer.root.owners += 1

    def buffer_allocation_discard(self, buffer) -> int:
        if type(buffer) is not Buffer:
            raise _bad_ref(buffer, Buffer, "hal.buffer.allocation.discard")
        root = buffer.root
        if root.owners > 0:
            root.owners -= 1
        return int(root.owners == 0)

    def buffer_allocation_is_terminal(self, buffer) -> int:
        if type(buffer) is not Buffer:
            raise _bad_ref(buffer, Buffer, "hal.buffer.allocation.is_terminal")
        return int(buffer.root.owners == 1)

    # -- buffer views -------------------------------------------------------------
    def buffer_view_create(self, buffer, offset: int, length: int,
                           element_type: int, encoding_type: int,
                           dims) -> BufferView:
        if type(buffer) is not Buffer:
            raise _bad_ref(buffer, Buffer, "hal.buffer_view.create")
        if offset != 0 or length != buffer.length:
            length = self._check_range(buffer, offset, length, "invalid subspan "
                                       "of an existing buffer")
            buffer = buffer.subspan(offset, length)
        return BufferView(buffer, dims, element_type & 0xFFFFFFFF,
                          encoding_type & 0xFFFFFFFF)

    def buffer_view_assert(self, view, message, element_type: int,
                           encoding_type: int, dims) -> None:
        if type(view) is not BufferView:
            what = (_string(message, "message") if type(message) is VmBuffer
                    else "hal.buffer_view.assert")
            raise _bad_ref(view, BufferView, what)
        if (view.dims == dims and view.element_type == element_type
                and (view.encoding_type == encoding_type
                     or view.encoding_type == ENCODING_OPAQUE)):
            return
        self._view_mismatch(view, _string(message, "message"),
                            _u32(element_type), _u32(encoding_type),
                            tuple(d for (d,) in dims))

    @staticmethod
    def _view_mismatch(view: BufferView, message: str, element_type: int,
                       encoding_type: int, shape: tuple) -> None:
        have_enc = view.encoding_type
        if have_enc != ENCODING_OPAQUE and have_enc != encoding_type:
            raise _status(INVALID_ARGUMENT, f"{message} encoding mismatch; "
                          f"expected {encoding_type:08X} but have {have_enc:08X}")
        have_type = view.element_type
        if not _types_compatible(have_type, element_type):
            raise _status(INVALID_ARGUMENT, f"{message} element type mismatch; "
                          f"expected {_element_type_name(element_type)} "
                          f"({element_type:08X}) but have "
                          f"{_element_type_name(have_type)} ({have_type:08X})")
        have = view.shape
        text = None
        if len(have) != len(shape):
            text = (f"{message} shape rank mismatch; expected {len(shape)}"
                    f"{' (scalar)' if not shape else ''} but have {len(have)}"
                    f"{' (scalar)' if not have else ''}")
        else:
            for i, (a, b) in enumerate(zip(have, shape)):
                if a != b:
                    text = (f"{message} shape dimension {i} mismatch; "
                            f"expected {b} but have {a}")
                    break
        if text is not None:
            raise _status(INVALID_ARGUMENT, f"{text}; expected shape "
                          f"`{_format_shape(shape)}`, actual shape "
                          f"`{_format_shape(have)}`")

    def buffer_view_buffer(self, view) -> Buffer:
        if type(view) is not BufferView:
            raise _bad_ref(view, BufferView, "hal.buffer_view.buffer")
        return view.buffer

    def buffer_view_element_type(self, view) -> int:
        if type(view) is not BufferView:
            raise _bad_ref(view, BufferView, "hal.buffer_view.element_type")
        t = view.element_type
        return t - (1 << 32) if t >> 31 else t

    def buffer_view_encoding_type(self, view) -> int:
        if type(view) is not BufferView:
            raise _bad_ref(view, BufferView, "hal.buffer_view.encoding_type")
        t = view.encoding_type
        return t - (1 << 32) if t >> 31 else t

    def buffer_view_rank(self, view) -> int:
        if type(view) is not BufferView:
            raise _bad_ref(view, BufferView, "hal.buffer_view.rank")
        return len(view.dims)

    def buffer_view_dim(self, view, index: int) -> int:
        if type(view) is not BufferView:
            raise _bad_ref(view, BufferView, "hal.buffer_view.dim")
        if not 0 <= index < len(view.dims):
            raise _status(OUT_OF_RANGE, f"dimension {index} of a rank-"
                          f"{len(view.dims)} buffer view")
        return view.dims[index][0]

    def buffer_view_trace(self, key, views) -> None:
        _string(key, "hal.buffer_view.trace key")
        for (v,) in views:
            if type(v) is not BufferView:
                raise _bad_ref(v, BufferView, "hal.buffer_view.trace")

    # -- executables --------------------------------------------------------------
    def executable_create(self, device, affinity: int, fmt, data,
                          constants) -> Executable:
        if type(device) is not Device:
            raise _bad_ref(device, Device, "hal.executable.create")
        format_str = _string(fmt, "hal.executable.create format")
        if type(data) is not VmBuffer:
            raise _bad_ref(data, VmBuffer, "hal.executable.create data")
        consts = b""
        if constants is not None:
            if type(constants) is not VmBuffer:
                raise _bad_ref(constants, VmBuffer, "hal.executable.create "
                               "constants")
            consts = constants.bytes()
            if len(consts) % 4:
                raise _status(INVALID_ARGUMENT, "constant buffer data must "
                              "contain 4-byte elements but data length is "
                              f"{len(consts)}")
        if self._closed:
            raise _status(FAILED_PRECONDITION, "the HAL module is closed")
        key = (id(data), consts)
        entry = self._executables.get(key)
        if entry is not None and entry[0] is data:
            return entry[1]
        if format_str == "vmvx-bytecode-fb":     # VM bytecode: run on this VM
            from .vmvx import load_executable
            exe = Executable(self, load_executable(data, consts, memory=self.memory),
                             format_str, data)
            self._executables[key] = (data, exe)
            return exe
        if not format_str.startswith(self.format):
            raise _status(NOT_FOUND, "no executable loader registered for the "
                          f"given executable format '{format_str}' (this "
                          f"device loads {self.format})")
        from ...library import Executable as Library
        kwargs: dict[str, Any] = {k: v for k, v in (("engine", self.engine),
                                                    ("cpu", self.cpu))
                                  if v is not None}
        library = Library(data.bytes(), backend=self.backend, arch=self.arch.name,
                          plugins=self.plugins, **kwargs)
        try:
            self._set_constants(library, consts)
        except BaseException:
            library.close()
            raise
        exe = Executable(self, library, format_str, data)
        self._executables[key] = (data, exe)
        return exe

    @staticmethod
    def _set_constants(library, consts: bytes) -> None:
        """Write executable-level constants where the library reads them."""
        count = len(consts) // 4
        if not count and not library.constant_count:
            return
        if count != library.constant_count:
            raise _status(INVALID_ARGUMENT, f"executable declares "
                          f"{library.constant_count} constants, {count} given")
        from ... import abi
        be = library.backend
        env = abi.ENVIRONMENT.layout(*be.arch.c_abi)
        fields = env.unpack(be.read(library.environment, env.size))
        be.write(fields["constants"], consts)

    def executable_lookup_function(self, executable, name) -> int:
        if type(executable) is not Executable:
            raise _bad_ref(executable, Executable,
                           "hal.executable.lookup.function")
        text = _string(name, "hal.executable.lookup.function name")
        ordinal = executable.names.get(text)
        if ordinal is None:
            raise _status(NOT_FOUND, f"export '{text}' not found in executable "
                          f"{executable.library.name}; exports: "
                          + ", ".join(e.label for e in executable.library.exports))
        return ordinal

    # -- command buffers ------------------------------------------------------------
    def command_buffer_create(self, device, modes: int, categories: int,
                              affinity: int, binding_capacity: int) -> CommandBuffer:
        if type(device) is not Device:
            raise _bad_ref(device, Device, "hal.command_buffer.create")
        if binding_capacity < 0:
            raise _status(INVALID_ARGUMENT, f"binding capacity {binding_capacity}")
        return CommandBuffer(_u32(modes), _u32(categories), binding_capacity)

    @staticmethod
    def _recording(cb, what: str) -> CommandBuffer:
        if type(cb) is not CommandBuffer:
            raise _bad_ref(cb, CommandBuffer, what)
        if cb.finalized:
            raise _status(FAILED_PRECONDITION, f"{what}: the command buffer "
                          "was finalized")
        return cb

    def command_buffer_finalize(self, cb) -> None:
        self._recording(cb, "hal.command_buffer.finalize").finalized = True

    def command_buffer_begin_debug_group(self, cb, label) -> None:
        self._recording(cb, "hal.command_buffer.begin_debug_group")
        _string(label, "hal.command_buffer.begin_debug_group label")

    def command_buffer_end_debug_group(self, cb) -> None:
        self._recording(cb, "hal.command_buffer.end_debug_group")

    def command_buffer_execution_barrier(self, cb, source_stage: int,
                                         target_stage: int, flags: int) -> None:
        # Commands run one after another: every barrier holds already.
        self._recording(cb, "hal.command_buffer.execution_barrier")

    def command_buffer_advise_buffer(self, cb, buffer, flags: int, arg0: int,
                                     arg1: int, slot: int) -> None:
        self._recording(cb, "hal.command_buffer.advise_buffer")
        if buffer is not None and type(buffer) is not Buffer:
            raise _bad_ref(buffer, Buffer, "hal.command_buffer.advise_buffer")

    def _ref(self, cb: CommandBuffer, buffer, slot: int, offset: int,
             length: int, what: str) -> tuple:
        """A buffer reference of a command: ``(slot, buffer or None, offset,
        length)``, checked against the buffer (or noted as what the slot
        must hold)."""
        if buffer is None:
            if slot < 0 or 0 < cb.binding_capacity <= slot:
                raise _status(OUT_OF_RANGE, f"{what}: binding table slot {slot} "
                              f"outside the command buffer's capacity of "
                              f"{cb.binding_capacity}")
            if offset < 0 or (length < 0 and length != WHOLE):
                raise _status(OUT_OF_RANGE, f"{what}: byte range [{offset}, "
                              f"{offset + length}) of binding table slot {slot}")
            reach = offset + (length if length != WHOLE else 0)
            if cb.need.get(slot, -1) < reach:
                cb.need[slot] = reach
            return slot, None, offset, length
        if type(buffer) is not Buffer:
            raise _bad_ref(buffer, Buffer, what)
        length = self._check_range(buffer, offset, length, what)
        return slot, buffer, offset, length

    def command_buffer_fill_buffer(self, cb, target, offset: int, length: int,
                                   slot: int, pattern: int, pattern_length: int,
                                   flags: int) -> None:
        what = "hal.command_buffer.fill_buffer"
        self._recording(cb, what)
        if pattern_length not in (1, 2, 4, 8):
            raise _status(INVALID_ARGUMENT, f"fill pattern length "
                          f"{pattern_length} is not 1, 2, 4 or 8")
        ref = self._ref(cb, target, slot, offset, length, what)
        value = _pattern(pattern, pattern_length)
        cb.commands.append(lambda table: _fill(*_resolve(table, ref), value))
        cb.steps.append(("fill", ref, value))

    def command_buffer_update_buffer(self, cb, source, source_offset: int,
                                     target, target_offset: int, length: int,
                                     slot: int, flags: int) -> None:
        what = "hal.command_buffer.update_buffer"
        self._recording(cb, what)
        if type(source) is not VmBuffer:
            raise _bad_ref(source, VmBuffer, what)
        if length == WHOLE:
            length = len(source.data) - source_offset
        if (source_offset < 0 or length < 0
                or source_offset + length > len(source.data)):
            raise _status(OUT_OF_RANGE, f"{what}: source range [{source_offset}, "
                          f"{source_offset + length}) outside the "
                          f"{len(source.data)}-byte buffer")
        data = np.frombuffer(source.data[source_offset:source_offset + length]
                             .tobytes(), np.uint8)
        ref = self._ref(cb, target, slot, target_offset, length, what)
        cb.commands.append(lambda table: _write(*_resolve(table, ref), data))
        cb.steps.append(("update", ref, data))

    def command_buffer_copy_buffer(self, cb, source_slot: int, target_slot: int,
                                   source, source_offset: int, target,
                                   target_offset: int, length: int,
                                   flags: int) -> None:
        what = "hal.command_buffer.copy_buffer"
        self._recording(cb, what)
        src = self._ref(cb, source, source_slot, source_offset, length, what)
        dst = self._ref(cb, target, target_slot, target_offset, length, what)
        cb.commands.append(lambda table: _copy(_resolve(table, src),
                                               _resolve(table, dst)))
        cb.steps.append(("copy", src, dst))

    def _dispatch_args(self, cb, executable, ordinal: int, constants, bindings,
                       what: str):
        self._recording(cb, what)
        if type(executable) is not Executable:
            raise _bad_ref(executable, Executable, what)
        lib = executable.library
        if not 0 <= ordinal < len(lib.exports):
            raise _status(OUT_OF_RANGE, f"{what}: export ordinal {ordinal} of an "
                          f"executable with {len(lib.exports)} exports")
        export = lib.exports[ordinal]
        consts = [c & 0xFFFFFFFF for (c,) in constants]
        if len(consts) < export.constant_count:
            raise _status(INVALID_ARGUMENT, f"{what}: export {export.label} "
                          f"declares {export.constant_count} constants, "
                          f"{len(consts)} given")
        if len(bindings) < export.binding_count:
            raise _status(INVALID_ARGUMENT, f"{what}: export {export.label} "
                          f"declares {export.binding_count} bindings, "
                          f"{len(bindings)} given")
        refs = [self._ref(cb, buf, slot, off, n, f"{what} binding {i}")
                for i, (_, slot, buf, off, n) in enumerate(bindings)]
        return consts, refs

    def command_buffer_dispatch(self, cb, executable, ordinal: int, x: int,
                                y: int, z: int, flags: int, constants,
                                bindings) -> None:
        what = "hal.command_buffer.dispatch"
        consts, refs = self._dispatch_args(cb, executable, ordinal, constants,
                                           bindings, what)
        grid = (_u32(x), _u32(y), _u32(z))
        if grid[2] >= 1 << 16:
            raise _status(OUT_OF_RANGE, f"{what}: workgroup count z = {grid[2]} "
                          "exceeds 65535")
        cmd = executable.dispatch_command(ordinal, grid, consts, refs)
        if self.trace is not None:
            cmd = _traced(self.trace, cmd, executable, ordinal, grid, consts, refs)
        cb.commands.append(cmd)
        cb.steps.append(("dispatch", executable, ordinal, grid, consts, refs))

    def command_buffer_dispatch_indirect(self, cb, executable, ordinal: int,
                                         workgroups_slot: int, workgroups_buffer,
                                         workgroups_offset: int, flags: int,
                                         constants, bindings) -> None:
        what = "hal.command_buffer.dispatch.indirect"
        consts, refs = self._dispatch_args(cb, executable, ordinal, constants,
                                           bindings, what)
        counts = self._ref(cb, workgroups_buffer, workgroups_slot,
                           workgroups_offset, 12, what + " workgroup count")
        commands: dict[tuple, Callable] = {}

        def run(table):
            buf, off, _ = _resolve(table, counts)
            grid = tuple(int(v) for v in buf.array[off:off + 12].view(np.uint32))
            if grid[2] >= 1 << 16:
                raise _status(OUT_OF_RANGE, f"{what}: workgroup count z = "
                              f"{grid[2]} exceeds 65535")
            cmd = commands.get(grid)
            if cmd is None:
                if len(commands) > 64:
                    commands.clear()
                cmd = commands[grid] = executable.dispatch_command(
                    ordinal, grid, consts, refs)
            cmd(table)
        cb.commands.append(run)
        cb.steps.append(("indirect", executable, ordinal, counts, consts, refs))

    # -- queue ----------------------------------------------------------------------
    def device_queue_alloca(self, device, affinity: int, wait, signal, pool: int,
                            memory_types: int, usage: int, size: int,
                            flags: int) -> Buffer:
        if type(device) is not Device:
            raise _bad_ref(device, Device, "hal.device.queue.alloca")
        if pool:
            raise _status(UNIMPLEMENTED, "VM queue allocation pools are not "
                          "supported")
        buf = self._allocate(size, memory_types, usage, True,
                             "hal.device.queue.alloca")
        buf.home = self._home
        if wait is None and signal is not None and type(signal) is Fence \
                and signal.parts is None and signal.code is None \
                and signal.waiters is None:
            signal.code = 0         # (the usual case, without _queue's checks)
        else:
            self._queue(wait, signal, _nothing)
        return buf

    def device_queue_dealloca(self, device, affinity: int, wait, signal, buffer,
                              flags: int) -> None:
        if type(device) is not Device:
            raise _bad_ref(device, Device, "hal.device.queue.dealloca")
        if type(buffer) is not Buffer:
            raise _bad_ref(buffer, Buffer, "hal.device.queue.dealloca")
        if (type(wait) is Fence and wait.parts is None and wait.code == 0
                and type(signal) is Fence and signal.parts is None
                and signal.code is None and signal.waiters is None):
            # (the usual case, without _queue's checks: a reached wait, a
            # fresh signal nothing waits on; the buffer back to the pool as
            # _release does)
            if buffer.pooled and buffer.parent is None:
                buffer.pooled = False
                free = self._pool.setdefault(buffer.length, [])
                if len(free) < 4:
                    free.append((buffer.array, buffer.address))
            signal.code = 0
            return
        self._queue(wait, signal, self._release, buffer)

    def device_queue_fill(self, device, affinity: int, wait, signal, target,
                          offset: int, length: int, pattern: int,
                          pattern_length: int, flags: int) -> None:
        what = "hal.device.queue.fill"
        if type(device) is not Device:
            raise _bad_ref(device, Device, what)
        if type(target) is not Buffer:
            raise _bad_ref(target, Buffer, what)
        if pattern_length not in (1, 2, 4, 8):
            raise _status(INVALID_ARGUMENT, f"fill pattern length "
                          f"{pattern_length} is not 1, 2, 4 or 8")
        length = self._check_range(target, offset, length, what)
        if self.record is not None:
            self._queue(wait, signal, self.record.fill, target, offset, length,
                        _pattern(pattern, pattern_length))
            return
        self._queue(wait, signal, _fill, target, offset, length,
                    _pattern(pattern, pattern_length))

    def device_queue_update(self, device, affinity: int, wait, signal, source,
                            source_offset: int, target, target_offset: int,
                            length: int, flags: int) -> None:
        what = "hal.device.queue.update"
        if type(device) is not Device:
            raise _bad_ref(device, Device, what)
        if type(source) is not VmBuffer:
            raise _bad_ref(source, VmBuffer, what)
        if type(target) is not Buffer:
            raise _bad_ref(target, Buffer, what)
        _check_span(what, "source range", source_offset, length,
                    len(source.data), "buffer")
        length = self._check_range(target, target_offset, length, what)
        data = np.frombuffer(source.data, np.uint8, length, source_offset)
        self._queue(wait, signal, _write, target, target_offset, length, data)
        if self.record is not None:
            self.record.load(target)

    def device_queue_copy(self, device, affinity: int, wait, signal, source,
                          source_offset: int, target, target_offset: int,
                          length: int, flags: int) -> None:
        what = "hal.device.queue.copy"
        if type(device) is not Device:
            raise _bad_ref(device, Device, what)
        if type(source) is not Buffer:
            raise _bad_ref(source, Buffer, what + " source")
        if type(target) is not Buffer:
            raise _bad_ref(target, Buffer, what + " target")
        n = self._check_range(source, source_offset, length, what + " source")
        self._check_range(target, target_offset, n, what + " target")
        self._queue(wait, signal, _copy if self.record is None else self.record.copy,
                    (source, source_offset, n), (target, target_offset, n))

    def device_queue_read(self, device, affinity: int, wait, signal, source,
                          source_offset: int, target, target_offset: int,
                          length: int, flags: int) -> None:
        what = "hal.device.queue.read"
        if type(device) is not Device:
            raise _bad_ref(device, Device, what)
        if type(source) is not File:
            raise _bad_ref(source, File, what)
        if type(target) is not Buffer:
            raise _bad_ref(target, Buffer, what)
        _check_span(what, "file range", source_offset, length,
                    source.array.size, "file")
        length = self._check_range(target, target_offset, length, what)
        data = source.array[source_offset:source_offset + length]
        self._queue(wait, signal, _write, target, target_offset, length, data)
        if self.record is not None:
            self.record.load(target)

    def device_queue_write(self, device, affinity: int, wait, signal, source,
                           source_offset: int, target, target_offset: int,
                           length: int, flags: int) -> None:
        what = "hal.device.queue.write"
        if type(device) is not Device:
            raise _bad_ref(device, Device, what)
        if type(target) is not File:
            raise _bad_ref(target, File, what)
        raise _status(PERMISSION_DENIED, f"{what}: files made from memory are "
                      "read-only")

    def device_queue_barrier(self, device, affinity: int, wait, signal,
                             flags: int) -> None:
        if type(device) is not Device:
            raise _bad_ref(device, Device, "hal.device.queue.barrier")
        self._queue(wait, signal, _nothing)

    def device_queue_execute(self, device, affinity: int, wait, signal, cb,
                             flags: int) -> None:
        what = "hal.device.queue.execute"
        if type(device) is not Device:
            raise _bad_ref(device, Device, what)
        if type(cb) is not CommandBuffer:
            raise _bad_ref(cb, CommandBuffer, what)
        if cb.need:
            raise _status(INVALID_ARGUMENT, f"{what}: the command buffer reads "
                          f"binding table slots {sorted(cb.need)} and was "
                          "submitted without a binding table")
        if self.record is not None:
            self._queue(wait, signal, _record, self.record, cb.steps, None)
            return
        self._queue(wait, signal, _execute, cb.commands, None)

    def device_queue_execute_indirect(self, device, affinity: int, wait, signal,
                                      cb, flags: int, table) -> None:
        what = "hal.device.queue.execute.indirect"
        if type(device) is not Device:
            raise _bad_ref(device, Device, what)
        if type(cb) is not CommandBuffer:
            raise _bad_ref(cb, CommandBuffer, what)
        lens: list[int] = []
        addrs: list[int] = []
        for buf, off, n in table:
            if type(buf) is Buffer:
                total = buf.length
                if n == WHOLE:
                    n = total - off
                if off < 0 or n < 0 or off + n > total:
                    self._table_error(what, table, len(lens))
                lens.append(n)
                addrs.append(buf.address + off)
            elif buf is None:
                lens.append(-1)
                addrs.append(0)
            else:
                self._table_error(what, table, len(lens))
        self._submit_indirect(device, wait, signal, cb, table, lens, addrs)

    def _submit_indirect(self, device, wait, signal, cb, table, lens: list,
                         addrs: list) -> None:
        """``hal.device.queue.execute.indirect`` once its binding ``table`` is
        checked (each entry a null buffer or a byte range inside its buffer):
        ``lens`` the bytes of each slot (-1: null), ``addrs`` the host
        address of each slot's first byte. Checks the device, the command
        buffer and the slots it reads; what a call of the import does after
        its table loop, and what its inline form (a table of buffers whose
        ranges the call site checked) runs."""
        what = "hal.device.queue.execute.indirect"
        if type(device) is not Device:
            raise _bad_ref(device, Device, what)
        if type(cb) is not CommandBuffer:
            raise _bad_ref(cb, CommandBuffer, what)
        count = len(lens)
        for slot, reach in cb.need.items():
            if slot >= count or lens[slot] < reach:
                self._slot_error(what, slot, reach, count, lens)
        if self.record is not None:
            self._queue(wait, signal, _record, self.record, cb.steps,
                       _Table(table, lens, addrs))
            return
        if (wait is None or (type(wait) is Fence and wait.parts is None
                             and wait.code == 0)) and type(signal) is Fence:
            # (the usual case, without _queue's checks)
            batch = (cb.batch if cb.batch_of == len(cb.commands)
                     else batch_of(cb, self._batches))
            try:
                if batch is None or self._timeout or not batch.run(addrs):
                    tab = _Table(table, lens, addrs)
                    for cmd in cb.commands:
                        cmd(tab)
            except VmStatusError as exc:
                _fail_fence(signal, exc.code, exc.message)
                raise
            except BaseException as exc:
                _fail_fence(signal, INTERNAL, str(exc))
                raise
            if signal.parts is None and signal.code is None and signal.waiters is None:
                signal.code = 0     # (_signal_fence's usual case: nothing waits)
            else:
                _signal_fence(signal)
            return
        self._queue(wait, signal, _execute, cb.commands, _Table(table, lens, addrs))

    @staticmethod
    def _table_error(what: str, table, i: int) -> None:
        buf, off, n = table[i]
        if type(buf) is not Buffer:
            raise _bad_ref(buf, Buffer, f"{what} binding table slot {i}")
        total = buf.length
        if n == WHOLE:
            n = total - off
        raise _status(OUT_OF_RANGE, f"{what}: binding table slot {i}: byte range "
                      f"[{off}, {off + n}) lies outside the {total}-byte buffer")

    @staticmethod
    def _slot_error(what: str, slot: int, reach: int, count: int, lens) -> None:
        if slot >= count:
            raise _status(INVALID_ARGUMENT, f"{what}: the command buffer reads "
                          f"binding table slot {slot}; the table has {count} "
                          "slots")
        if lens[slot] < 0:
            raise _status(INVALID_ARGUMENT, f"{what}: binding table slot {slot} "
                          "is null and the command buffer reads it")
        raise _status(OUT_OF_RANGE, f"{what}: the command buffer reads "
                      f"{reach} bytes of binding table slot {slot}, which holds "
                      f"{lens[slot]}")

    def device_queue_flush(self, device, affinity: int) -> None:
        if type(device) is not Device:
            raise _bad_ref(device, Device, "hal.device.queue.flush")

    # -- fences ------------------------------------------------------------------------
    def fence_create(self, device, flags: int) -> Fence:
        if type(device) is not Device:
            raise _bad_ref(device, Device, "hal.fence.create")
        return Fence()

    def fence_join(self, flags: int, fences):
        for (f,) in fences:
            if type(f) is not Fence or f.parts is not None or f.code != 0:
                break
        else:
            # (every one a reached timepoint: the usual case)
            return Fence(None, 0) if fences else None
        parts = []
        any_fence = False
        for (f,) in fences:
            if f is None:
                continue
            if type(f) is not Fence:
                raise _bad_ref(f, Fence, "hal.fence.join")
            any_fence = True
            for p in (f,) if f.parts is None else f.parts:
                if p.code != 0 and p not in parts:
                    parts.append(p)
        if not any_fence:
            return None             # (a null fence is reached)
        if not parts:
            return Fence(None, 0)
        if len(parts) == 1 and parts[0].code is None:
            return parts[0]
        return Fence(tuple(parts))

    def fence_query(self, fence) -> int:
        if type(fence) is not Fence:
            raise _bad_ref(fence, Fence, "hal.fence.query")
        state = _fence_state(fence)
        if state is None:
            return DEFERRED
        return state if state == 0 else state[0]

    def fence_signal(self, fence) -> None:
        if type(fence) is not Fence:
            raise _bad_ref(fence, Fence, "hal.fence.signal")
        _signal_fence(fence)

    def fence_fail(self, fence, status: int) -> None:
        if type(fence) is not Fence:
            raise _bad_ref(fence, Fence, "hal.fence.fail")
        code = status & STATUS_CODE_MASK
        _fail_fence(fence, code, f"the program failed the fence with status "
                    f"{_STATUS_NAMES.get(code, code)}")

    def fence_await(self, timeout_millis: int, flags: int, fences) -> int:
        for (f,) in fences:
            if f is None:
                continue
            if type(f) is not Fence:
                raise _bad_ref(f, Fence, "hal.fence.await")
            if f.parts is None and f.code == 0:
                continue
            state = _fence_state(f)
            if state == 0:
                continue
            if state is not None:
                code, message = state
                raise _status(code, message or "a fence awaited failed with "
                              f"status {_STATUS_NAMES.get(code, code)}")
            if timeout_millis == -1:
                raise _status(DEADLINE_EXCEEDED, "hal.fence.await waits without "
                              "a time limit for a fence nothing left to run will "
                              "signal (every submitted operation has run)")
            return DEADLINE_EXCEEDED
        return OK


def _nothing() -> None:
    pass


def _execute(commands: list, table) -> None:
    for cmd in commands:
        cmd(table)


def _record(record, steps: list, table) -> None:
    """A submission recorded, not run (:attr:`HalModule.record`): each of a
    command buffer's ``steps`` (:attr:`CommandBuffer.steps`) resolved
    against the binding table and given to ``record``."""
    for step in steps:
        kind = step[0]
        if kind == "dispatch":
            _, exe, ordinal, grid, consts, refs = step
            record.dispatch(exe, ordinal, grid, consts,
                            [_resolve(table, r) for r in refs])
        elif kind == "indirect":
            _, exe, ordinal, counts, consts, refs = step
            buf, off, _ = _resolve(table, counts)
            record.read(buf, "hal.command_buffer.dispatch.indirect")
            grid = tuple(int(v) for v in buf.array[off:off + 12].view(np.uint32))
            record.dispatch(exe, ordinal, grid, consts,
                            [_resolve(table, r) for r in refs])
        elif kind == "fill":
            record.fill(*_resolve(table, step[1]), step[2])
        elif kind == "copy":
            record.copy(_resolve(table, step[1]), _resolve(table, step[2]))
        else:                   # update: host data, written now
            buf, off, n = _resolve(table, step[1])
            _write(buf, off, n, step[2])
            record.load(buf)


def _pattern(pattern: int, length: int) -> bytes:
    """A fill pattern's ``length`` low bytes, little endian."""
    return (pattern & ((1 << (8 * length)) - 1)).to_bytes(length, "little")


def _as_array(shape, dtype, buf: Buffer) -> np.ndarray:
    """``buf``'s bytes as an array of ``shape`` and ``dtype`` (no copy)."""
    try:
        return np.ndarray(shape, dtype, buf.array)
    except (TypeError, ValueError) as exc:
        raise _status(OUT_OF_RANGE, f"a buffer view of shape {shape} and dtype "
                      f"{dtype} does not fit its {buf.length}-byte buffer: {exc}") from None


def _fill(buf: Buffer, offset: int, length: int, pattern: bytes) -> None:
    _arrays.fill_pattern(buf.array[offset:offset + length], pattern)


def _write(buf: Buffer, offset: int, length: int, data) -> None:
    buf.array[offset:offset + length] = data


def _copy(src: tuple, dst: tuple) -> None:
    sbuf, soff, n = src
    dbuf, doff, _ = dst
    dbuf.array[doff:doff + n] = sbuf.array[soff:soff + n]


def _signal_fence(fence: Fence) -> None:
    for p in (fence,) if fence.parts is None else fence.parts:
        if p.code is None:
            p.code = 0
            waiters, p.waiters = p.waiters, None
            if waiters:
                for op in waiters:
                    _wake(op)


def _fail_fence(fence, code: int, message: str) -> None:
    if fence is None or type(fence) is not Fence:
        return
    for p in (fence,) if fence.parts is None else fence.parts:
        if p.code is None:
            p.code, p.message = code or INTERNAL, message
            waiters, p.waiters = p.waiters, None
            if waiters:
                for op in waiters:
                    _wake(op)


def _wake(op: list) -> None:
    """Run a deferred queue operation ``[done, wait, signal, fn, args]`` if
    its wait fence is now reached (or pass its failure on)."""
    if op[0]:
        return
    _, wait, signal, fn, args = op
    state = _fence_state(wait)
    if state is None:
        return
    op[0] = True
    if state != 0:
        _fail_fence(signal, *state)
        return
    try:
        fn(*args)
    except VmStatusError as exc:
        _fail_fence(signal, exc.code, exc.message)
        raise
    except BaseException as exc:
        _fail_fence(signal, INTERNAL, str(exc))
        raise
    if signal is not None:
        _signal_fence(signal)


def _types_compatible(have: int, want: int) -> bool:
    """IREE's rule: an opaque actual type matches anything, integers of one
    width match each other, anything else must be equal."""
    if have == want:
        return True
    numerical = have >> 24
    if numerical == 0:
        return True
    return (numerical & 0xF0 == 0x10 and numerical != 0x13
            and (want >> 24) & 0xF0 == 0x10 and (want >> 24) != 0x13
            and have & 0xFF == want & 0xFF)


#: (export name, calling convention) of every export served; the method
#: serving ``a.b.c`` is ``a_b_c``.
_EXPORTS = (
    ("allocator.allocate", "0rIiiI_r"),
    ("allocator.import", "0riIiirII_r"),
    ("allocator.select", "0iiICrID_rI"),
    ("buffer.allocation.discard", "0r_i"),
    ("buffer.allocation.is_terminal", "0r_i"),
    ("buffer.allocation.preserve", "0r_v"),
    ("buffer.assert", "0rrrIii_v"),
    ("buffer.length", "0r_I"),
    ("buffer.load", "0rIi_i"),
    ("buffer.store", "0irIi_v"),
    ("buffer.subspan", "0rII_r"),
    ("buffer_view.assert", "0rriiCID_v"),
    ("buffer_view.buffer", "0r_r"),
    ("buffer_view.create", "0rIIiiCID_r"),
    ("buffer_view.dim", "0ri_I"),
    ("buffer_view.element_type", "0r_i"),
    ("buffer_view.encoding_type", "0r_i"),
    ("buffer_view.rank", "0r_i"),
    ("buffer_view.trace", "0rCrD_v"),
    ("command_buffer.advise_buffer", "0rrIIIi_v"),
    ("command_buffer.begin_debug_group", "0rr_v"),
    ("command_buffer.copy_buffer", "0riirIrIII_v"),
    ("command_buffer.create", "0riiIi_r"),
    ("command_buffer.dispatch", "0rrIiiiICiDCiirIID_v"),
    ("command_buffer.dispatch.indirect", "0rrIirIICiDCiirIID_v"),
    ("command_buffer.end_debug_group", "0r_v"),
    ("command_buffer.execution_barrier", "0riiI_v"),
    ("command_buffer.fill_buffer", "0rrIIiIiI_v"),
    ("command_buffer.finalize", "0r_v"),
    ("command_buffer.update_buffer", "0rrIrIIiI_v"),
    ("device.allocator", "0r_r"),
    ("device.query.i64", "0rrr_iI"),
    ("device.queue.alloca", "0rIrrIiiII_r"),
    ("device.queue.barrier", "0rIrrI_v"),
    ("device.queue.copy", "0rIrrrIrIII_v"),
    ("device.queue.dealloca", "0rIrrrI_v"),
    ("device.queue.execute", "0rIrrrI_v"),
    ("device.queue.execute.indirect", "0rIrrrICrIID_v"),
    ("device.queue.fill", "0rIrrrIIIiI_v"),
    ("device.queue.flush", "0rI_v"),
    ("device.queue.read", "0rIrrrIrIII_v"),
    ("device.queue.update", "0rIrrrIrIII_v"),
    ("device.queue.write", "0rIrrrIrIII_v"),
    ("devices.count", "0v_i"),
    ("devices.get", "0i_r"),
    ("ex.file.from_memory", "0rIirIIi_r"),
    ("executable.create", "0rIrrr_r"),
    ("executable.lookup.function", "0rr_I"),
    ("fence.await", "0iICrD_i"),
    ("fence.create", "0rI_r"),
    ("fence.fail", "0ri_v"),
    ("fence.join", "0ICrD_r"),
    ("fence.query", "0r_i"),
    ("fence.signal", "0r_v"),
)


# What a translated VM function may run in place of a call of some imports
# (:mod:`hal_cpu.programs.vm.translate` reads ``vm_inline`` of an import):
# a Python expression doing what the import does in its usual case, with
# the same checks, and calling the import itself (``{imp}``) in every
# other case, so that each error is the import's own. ``{a<i>}`` is the
# call's i-th operand, ``{a<i>_<j>_<k>}`` element k of tuple j of a
# variadic operand, ``{Name}`` one of the objects listed with the text; a
# third item gives the tuple count of variadic operands the text is for.
# Each saves a Python call per VM call of the import.
_INLINE: dict[str, tuple] = {
    "fence_create": (
        "({Fence}() if type({a0}) is {Device} else {imp}({a0}, {a1}))",
        {"Fence": Fence, "Device": Device}),
    "device_allocator": (
        "({a0}.allocator if type({a0}) is {Device} else {imp}({a0}))",
        {"Device": Device}),
    "buffer_view_buffer": (
        "({a0}.buffer if type({a0}) is {BufferView} else {imp}({a0}))",
        {"BufferView": BufferView}),
    "buffer_view_assert": (
        "(None if type({a0}) is {BufferView} and {a0}.dims == {a4} "
        "and {a0}.element_type == {a2} and ({a0}.encoding_type == {a3} "
        "or {a0}.encoding_type == {OPAQUE}) "
        "else {imp}({a0}, {a1}, {a2}, {a3}, {a4}))",
        {"BufferView": BufferView, "OPAQUE": ENCODING_OPAQUE}),
    "buffer_assert": (
        "(None if type({a0}) is {Buffer} and type({a1}) is {VmBuffer} "
        "and type({a2}) is {Allocator} and {a0}.length >= {a3} "
        "and ({a0}.memory_type & {a4} & 0xFFFFFFFF) == ({a4} & 0xFFFFFFFF) "
        "and ({a0}.usage & {a5} & 0xFFFFFFFF) == ({a5} & 0xFFFFFFFF) "
        "else {imp}({a0}, {a1}, {a2}, {a3}, {a4}, {a5}))",
        {"Buffer": Buffer, "VmBuffer": VmBuffer, "Allocator": Allocator}),
    "buffer_view_create": (
        "({BufferView}({a0}, {a5}, {a3} & 0xFFFFFFFF, {a4} & 0xFFFFFFFF) "
        "if type({a0}) is {Buffer} and {a1} == 0 and {a2} == {a0}.length "
        "else {imp}({a0}, {a1}, {a2}, {a3}, {a4}, {a5}))",
        {"BufferView": BufferView, "Buffer": Buffer}),
}


def _reached(x: str) -> str:
    # (a fence operand a call passes, reached: _fence_state's 0 for a
    # single timepoint)
    return f"(type({x}) is {{Fence}} and {x}.parts is None and {x}.code == 0)"


# fence.await and fence.join of 1 to 4 fences, each reached (or null, for
# await): OK, and a new reached fence
_INLINE["fence_await"] = tuple(
    ("(0 if " + " and ".join(f"({{a2_{j}_0}} is None or {_reached(f'{{a2_{j}_0}}')})"
                             for j in range(n))
     + " else {imp}({a0}, {a1}, {a2}))", {"Fence": Fence}, {2: n})
    for n in range(1, 5))
_INLINE["fence_join"] = tuple(
    ("({Fence}(None, 0) if " + " and ".join(_reached(f"{{a1_{j}_0}}") for j in range(n))
     + " else {imp}({a0}, {a1}))", {"Fence": Fence}, {1: n})
    for n in range(1, 5))


def _indirect_inline(n: int) -> tuple:
    # queue.execute.indirect of a table of n buffers, each byte range
    # (no WHOLE length) inside its buffer: the table loop written out,
    # then what the import does after it (_submit_indirect); a null, a
    # non-buffer, a WHOLE length or a range outside goes to the import
    ok = " and ".join(
        f"type({{a6_{j}_0}}) is {{Buffer}} and {{a6_{j}_1}} >= 0 and {{a6_{j}_2}} >= 0 "
        f"and {{a6_{j}_1}} + {{a6_{j}_2}} <= {{a6_{j}_0}}.length" for j in range(n))
    lens = ", ".join(f"{{a6_{j}_2}}" for j in range(n))
    addrs = ", ".join(f"{{a6_{j}_0}}.address + {{a6_{j}_1}}" for j in range(n))
    return ("({Submit}({imp}.__self__, {a0}, {a2}, {a3}, {a4}, {a6}, "
            f"[{lens}], [{addrs}]) if {ok} "
            "else {imp}({a0}, {a1}, {a2}, {a3}, {a4}, {a5}, {a6}))",
            {"Submit": HalModule._submit_indirect,  # noqa: SLF001 - its own class
             "Buffer": Buffer}, {6: n})


_INLINE["device_queue_execute_indirect"] = tuple(_indirect_inline(n) for n in range(1, 9))
for _name, _inline in _INLINE.items():
    getattr(HalModule, _name).vm_inline = _inline
del _name, _inline
