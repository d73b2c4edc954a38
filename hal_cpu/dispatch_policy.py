"""How an executable runs its dispatches: the argument checks, how many
workers, and the one dispatch engine, :class:`PreparedDispatch`.

:class:`DispatchPolicy` is the part of :class:`hal_cpu.Executable` that
decides, per dispatch:

* whether its arguments are valid (the grid, workgroup size, binding and
  constant counts, the constants, the workers argument);
* whether it repeats a small native dispatch validated before (same export,
  grid, workers argument and constants object; bindings used in place),
  which then runs with the least Python per call (the binding addresses
  checked, one write, one crossing);
* with the default worker count, whether the grid is shared between host
  threads: only when the export's pace (seconds per workgroup measured in
  its earlier dispatches) says it takes longer than
  :data:`hal_cpu.dispatch.SHARE_SECONDS` on one;
* with a time limit or progress reports, the time limit of each guest call
  (``Backend.time_limit``) and the deadline between chunks.

:class:`PreparedDispatch` is a dispatch checked once and run many times
(:meth:`hal_cpu.Executable.prepare`): :meth:`hal_cpu.Executable.dispatch`
runs one (and keeps it for the repeat path), and so does every dispatch a
``.vmfb`` program's command buffers replay (:mod:`hal_cpu.programs.vm.hal_module`).

The layouts, the workgroup loop and :func:`~hal_cpu.dispatch.run_grid` are
:mod:`hal_cpu.dispatch`'s; the bindings' mapping is
:mod:`hal_cpu.bindings`'.
"""

from __future__ import annotations

import ctypes
import os
import struct
import threading
import time
import weakref
from typing import Any, Callable, Sequence

import numpy as np

import elfloader
from elfloader import Backend, as_int32

from . import abi, runtime
from .arrays import BINDING_ALIGNMENT
from .bindings import finish, map_bindings
from .dispatch import (
    CHUNK_SECONDS,
    FIRST_CHUNK,
    SHARE_SECONDS,
    DispatchLayout,
    check_return,
    cpu_leases,
    run_grid,
)
from .errors import DispatchError, LibraryError

_memmove = ctypes.memmove
#: Workgroups a native one-worker grid runs in one crossing.
FIRST_CHUNK_NATIVE = FIRST_CHUNK["native"]
_get_ident = threading.get_ident
_perf_counter = time.perf_counter
_ndarray = np.ndarray
_from_buffer = ctypes.c_char.from_buffer
_addressof = ctypes.addressof

#: Called as ``WATCH(prepared, layout, pointers, lengths)`` before every
#: run of the general path (None: nobody watches); returns None or a
#: callable run once the grid ran without a fault. Set by
#: ``hal_cpu.workbench`` while a session is open.
WATCH: Callable[..., Callable[[], None] | None] | None = None

#: Largest time limit accepted, in seconds (a day).
MAX_TIMEOUT = 86400.0


def check_timeout(value, field: str, path: str | None, error=None) -> float:
    """``value`` as seconds: None or 0 (no limit) gives 0.0, else a finite
    number in (0, :data:`MAX_TIMEOUT`].

    Raises:
        DispatchError (or ``error``): anything else (negative, inf, nan, a
            string...)."""
    if value is None:
        return 0.0
    try:
        ok = (not isinstance(value, (bool, str, bytes))
              and 0 <= float(value) <= MAX_TIMEOUT)
    except (TypeError, ValueError, OverflowError):
        ok = False
    if not ok:
        raise (error or DispatchError)(
            f"{value!r} is not a time limit in seconds (0 or None: no limit; "
            f"at most {MAX_TIMEOUT:g})", name=path, field=field, value=value)
    return float(value)


def host_workers() -> int:
    """The CPUs this process may use."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def check_triple(values, field: str, path: str, limit_xy: int,
                 low: int) -> tuple[int, int, int]:
    """Three integers (x, y, z) with low <= x, y < limit_xy, low <= z < 2**16.

    Raises:
        DispatchError: not three integers, or one out of range."""
    if type(values) is tuple and len(values) == 3:
        x, y, z = values
        if (type(x) is int and type(y) is int and type(z) is int and
                low <= x < limit_xy and low <= y < limit_xy and low <= z < 65536):
            return values
    try:
        vals = tuple(values)
        ok = len(vals) == 3 and all(isinstance(v, (int, np.integer))
                                    and not isinstance(v, bool) for v in vals)
    except TypeError:
        ok = False
    if not ok:
        raise DispatchError(f"{values!r} is not three integers (x, y, z)",
                            name=path, field=field, value=values)
    for axis, v, limit in zip("xyz", vals, (limit_xy, limit_xy, 1 << 16)):
        if not low <= v < limit:
            raise DispatchError(f"{axis} = {v} is outside [{low}, {limit})",
                                name=path, field=f"{field}.{axis}", value=int(v))
    x, y, z = (int(v) for v in vals)
    return x, y, z


def check_constants(constants, exp: Any, path: str) -> list[int]:
    """The push constants of a dispatch of ``exp`` as a list of ints.

    Raises:
        DispatchError: fewer than the export declares, too many, or one
            not a uint32."""
    consts = list(constants)
    if not exp.constant_count <= len(consts) <= abi.MAX_CONSTANT_COUNT:
        raise DispatchError(f"export {exp.label} declares {exp.constant_count} "
                            f"constants (at most {abi.MAX_CONSTANT_COUNT}), "
                            f"{len(consts)} given", name=path, field="constants",
                            value=len(consts))
    if all(type(c) is int and 0 <= c < 1 << 32 for c in consts):
        return consts
    for i, c in enumerate(consts):
        if isinstance(c, bool) or not isinstance(c, (int, np.integer)) \
                or not 0 <= c < 1 << 32:
            raise DispatchError(f"{c!r} is not a uint32 (pass float constants "
                                "as their bit pattern)", name=path,
                                field=f"constants[{i}]", value=c)
    return [int(c) for c in consts]


def check_workers(workers, total: int, path: str, default: int) -> int:
    """The worker count of a dispatch of ``total`` workgroups: ``workers``
    (``default`` when None) capped at the grid and at 255.

    Raises:
        DispatchError: ``workers`` is not a positive int."""
    if workers is None:
        workers = default
    elif isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise DispatchError(f"{workers!r} is not a positive number of workers",
                            name=path, field="workers", value=workers)
    return max(1, min(workers, total, 255))


def is_int_triple(values: Sequence) -> bool:
    """Whether the three values are ints (not bools, floats, numpy ints)."""
    x, y, z = values
    return type(x) is int and type(y) is int and type(z) is int


class DispatchPolicy:
    """The dispatch policy of an executable library (the base of
    :class:`hal_cpu.Executable`): the paces of its exports, the dispatches
    it may repeat, the worker count of each dispatch.

    The executable provides its backend, file name, environment, layout
    pools and the bookkeeping of its running dispatches (declared below);
    :meth:`_init_policy` starts the policy's own state."""

    backend: Backend
    path: str
    last_workers: int
    #: thread ids of the dispatches running now (one entry per dispatch)
    running: list[int]
    #: whether the executable was closed (no dispatch may start)
    closed: bool
    # export ordinal, bindings, constants, workers -> layouts not in use
    _layouts: dict[tuple, list[DispatchLayout]]

    @property
    def environment(self) -> int:
        """Address of the executable's environment in its backend."""
        raise NotImplementedError

    def release_if_idle(self) -> None:
        """After :meth:`close`: free the executable once no dispatch runs
        (the last dispatch to end calls it)."""
        raise NotImplementedError

    def _init_policy(self, kind: str) -> None:
        """Start with no pace and no dispatch to repeat, for a backend of
        ``kind``."""
        # export key -> PreparedDispatch: a validated small native dispatch
        # to repeat
        self._quick: dict[Any, PreparedDispatch] = {}
        # (export key, grid, constants, binding count, workers) ->
        # PreparedDispatch of the general path, checked once (ints only)
        self.prepared_calls: dict[tuple, PreparedDispatch] = {}
        #: export ordinal -> seconds per workgroup in its last dispatch with
        #: the default workers (decides whether the next one shares)
        self.pace: dict[int, float] = {}
        # export ordinal -> seconds per workgroup measured in its last
        # one-worker dispatch with the default workers: the pace kept is
        # the smaller of the last two such, so that one dispatch slowed
        # down from outside (the thread preempted, a garbage collection)
        # does not make the next one share a small grid. (A repeated
        # dispatch notes its pace only when it or the one before it took
        # longer than SHARE_SECONDS.)
        self._timed: dict[int, float] = {}
        #: host threads a grid worth sharing is shared between
        self.default_workers = self._default_workers = host_workers()
        #: workgroups of a worker's first chunk (a one-worker grid up to
        #: this size runs in one crossing)
        self.first_chunk = FIRST_CHUNK.get(kind, 1)
        #: export ordinals already warned about copying an unaligned binding
        self.copy_warned: set[int] = set()

    def layout_pool(self, key: tuple[int, int, int, int]) -> list[DispatchLayout]:
        """The layouts not in use of ``key`` (export ordinal, bindings,
        constants, workers); freed when the executable closes."""
        pool = self._layouts.get(key)
        if pool is None:
            pool = self._layouts[key] = []
        return pool

    def _check_dispatch(self, exp: Any, workgroup_count, workgroup_size,
                        n: int, constants
                        ) -> tuple[tuple[int, int, int], tuple[int, int, int],
                                   Sequence[int], int]:
        """The checked arguments of a dispatch of ``exp`` with ``n``
        bindings: ``(grid, workgroup size, constants, workgroup total)``,
        the workgroup size ``exp``'s unless overridden.

        Raises:
            DispatchError: a count out of range, fewer bindings or
                constants than the export declares, a constant not a
                uint32, more workgroups than a dispatch can run."""
        path = self.path
        wc = check_triple(workgroup_count, "workgroup_count", path, 1 << 32, 0)
        wsize = (check_triple(workgroup_size, "workgroup_size", path, 1 << 32, 1)
                 if workgroup_size is not None else exp.workgroup_size)
        if type(n) is not int or n < exp.binding_count or n > abi.MAX_BINDING_COUNT:
            raise DispatchError(f"export {exp.label} declares {exp.binding_count} "
                                f"bindings (at most {abi.MAX_BINDING_COUNT}), "
                                f"{n!r} given", name=path, field="bindings",
                                value=n)
        consts = (constants if not constants and not exp.constant_count
                  else check_constants(constants, exp, path))
        total = wc[0] * wc[1] * wc[2]
        if total > runtime.MAX_END:
            raise DispatchError(f"{total} workgroups exceed the 2**64 - 1 a "
                                "dispatch can run", name=path,
                                field="workgroup_count", value=wc)
        return wc, wsize, consts, total

    def note_pace(self, ordinal: int, pace: float) -> None:
        """Keep ``pace`` (seconds per workgroup of a one-worker dispatch
        with the default workers): the export's pace becomes the smaller of
        it and the one measured before."""
        last = self._timed.get(ordinal, pace)
        self._timed[ordinal] = pace
        self.pace[ordinal] = min(pace, last)

    def _repeat(self, q: "PreparedDispatch", bindings) -> bool:
        """Run ``q`` (a dispatch :meth:`hal_cpu.Executable.dispatch`
        validated and ran in one crossing, natively, bindings in place)
        again on ``bindings`` by its short path
        (:meth:`PreparedDispatch.repeat`); False: not taken, nothing
        done."""
        return q.repeat(bindings)


def _pairs(bindings: Sequence, path: str) -> tuple[list[int], list[int]]:
    """(address, length) pairs as pointers and lengths.

    Raises:
        DispatchError: a pair not of two non-negative ints."""
    pointers, lengths = [], []
    for i, b in enumerate(bindings):
        if (type(b) is not tuple or len(b) != 2 or type(b[0]) is not int
                or type(b[1]) is not int or b[0] < 0 or b[1] < 0
                or b[0] + b[1] >= 1 << 64):
            raise DispatchError(f"{b!r} is not an (address, length) pair of "
                                "non-negative ints", name=path,
                                field=f"bindings[{i}]", value=b)
        pointers.append(b[0])
        lengths.append(b[1])
    return pointers, lengths


def _host_arrays(pointers: Sequence[int], lengths: Sequence[int],
                 writable: Sequence[bool] | None) -> list[np.ndarray]:
    """Host memory ranges as uint8 arrays (read-only where ``writable``
    says so). Ranges that overlap are views of one array over their
    union, so that :func:`hal_cpu.bindings.shared_ranges` maps them as one
    range (copied in and back once: two copies of one range would each be
    copied back, the later one undoing what the kernel wrote through the
    other)."""
    unions: list[list[int]] = []        # [start, end] of overlapping spans
    for p, n in sorted((p, n) for p, n in zip(pointers, lengths) if n):
        if unions and p < unions[-1][1]:
            unions[-1][1] = max(unions[-1][1], p + n)
        else:
            unions.append([p, p + n])
    bases = [(start, np.frombuffer(memoryview(
        (ctypes.c_uint8 * (end - start)).from_address(start)), np.uint8))
        for start, end in unions]
    arrays = []
    for i, (p, n) in enumerate(zip(pointers, lengths)):
        if n:
            start, base = next(b for b in bases if b[0] <= p < b[0] + b[1].nbytes)
            a = base[p - start:p - start + n]
        else:
            a = np.zeros(0, np.uint8)
        if writable is not None and not writable[i]:
            a.flags.writeable = False
        arrays.append(a)
    return arrays


class PreparedDispatch:
    """A dispatch of one export with its grid, constants and binding count
    checked once, run many times on different bindings
    (:meth:`hal_cpu.Executable.prepare`).

    It owns the mechanism of a dispatch: the dispatch layouts of its
    export (dispatch state, constants, binding pointer and length arrays,
    per-worker workgroup states: ``iree_hal_executable_dispatch_state_v0_t``
    and ``iree_hal_executable_workgroup_state_v0_t`` of
    iree/hal/local/executable_library.h, v0.6), taken from the
    executable's pool per run (several threads may run it at once); under
    emulation a lease of CPUs per run and, for :meth:`run_addresses`,
    one guarded guest range per binding kept for its life (64-byte
    aligned, a canary and a guard page after it); the translation of
    emulated faults into reports and of writes past a binding or local
    memory into :class:`~hal_cpu.BindingOverrunError` /
    :class:`~hal_cpu.LocalMemoryOverrunError`; the check of every
    workgroup's return status; the worker count (the default decided by
    the export's pace, as :meth:`hal_cpu.Executable.dispatch` does).

    Natively a grid of at most :data:`hal_cpu.dispatch.FIRST_CHUNK`
    (256) workgroups on one worker runs in one crossing into the
    workgroup loop, rewriting only the binding pointers and lengths of a
    layout it wrote last; larger grids run in chunks
    (:func:`hal_cpu.dispatch.run_grid`).

    Attributes:
        executable: the :class:`hal_cpu.Executable`; export: its
            :class:`hal_cpu.Export`.
        wc: the grid (x, y, z) in workgroups; wsize: the workgroup size;
        total: workgroups per run; consts: the uint32 push constants;
        binding_count: bindings per run; lengths: the byte lengths given
            to :meth:`hal_cpu.Executable.prepare` (None: a count only).
        workers_arg: the ``workers`` asked for (None: the default).
    """

    __slots__ = ("executable", "export", "backend", "path", "ordinal", "label",
                 "address", "wc", "wsize", "consts", "constant_count", "total",
                 "binding_count", "lengths", "workers_arg", "grid_arg",
                 "constants_arg", "shares", "slow", "native", "leases",
                 "_running", "_pools", "_fast_pool", "_ranges", "_range_lock",
                 "_local", "_short", "_pace", "__weakref__")

    def __init__(self, executable: Any, export: Any, wc: tuple[int, int, int],
                 wsize: tuple[int, int, int], consts: Sequence[int], total: int,
                 binding_count: int, lengths: Sequence[int] | None,
                 workers_arg: int | None):
        self.executable = executable
        self.export = export
        self.backend: Backend = executable.backend
        self.path: str = executable.path
        self.ordinal, self.label, self.address = (export.ordinal, export.label,
                                                  export.address)
        self.wc, self.wsize, self.consts, self.total = wc, wsize, consts, total
        self.constant_count = len(consts)
        self.binding_count = binding_count
        self.lengths = list(lengths) if lengths is not None else None
        self.workers_arg = workers_arg
        # (what Executable.dispatch's repeat path compares)
        self.grid_arg: Any = None
        self.constants_arg: Any = None
        self.native = self.backend.kind == "native"
        self.leases = cpu_leases(self.backend)
        # Default workers on a grid that could be shared: the export's pace
        # decides per run.
        self.shares = (workers_arg is None and total > 1
                       and executable.default_workers > 1)
        self.slow = True        # (the next short run notes its pace)
        self._running: list[int] = executable.running
        self._pools: dict[int, list[DispatchLayout]] = {}
        self._fast_pool = executable.layout_pool(self._key(1))
        # guarded guest ranges of run_addresses (emulated): [(guest, host
        # address of its bytes, canary check or None)]
        self._ranges: list[tuple[int, int, Callable[[], None] | None]] | None = None
        self._range_lock = threading.Lock()
        self._local = export.local_memory_size
        # seconds per workgroup of its last one-worker run (None: unknown):
        # a grid known to take under CHUNK_SECONDS runs in one crossing
        self._pace: float | None = None
        # one worker, one crossing, natively: the short path
        self._short = (self._make_short() if self.native and 0 < total
                       <= FIRST_CHUNK_NATIVE and not (
                           workers_arg is not None and workers_arg > 1
                           and total > 1) else None)

    def __repr__(self) -> str:
        return (f"<PreparedDispatch {self.label} of {self.path} grid={self.wc} "
                f"bindings={self.binding_count}>")

    def _key(self, workers: int) -> tuple[int, int, int, int]:
        return (self.ordinal, self.binding_count, self.constant_count, workers)

    # --- the worker count -------------------------------------------------
    def _workers(self) -> tuple[int, bool]:
        """(workers, timed) of the next run: ``timed`` when the default
        chose one worker for a grid that could be shared (its pace is
        measured)."""
        total = self.total
        w = self.workers_arg
        if w is not None:
            return min(w, total, 255), False
        if not self.shares:
            return 1, False
        exe = self.executable
        pace = exe.pace.get(self.ordinal)
        if (pace * total > SHARE_SECONDS if pace is not None
                else total > exe.first_chunk):
            return min(exe.default_workers, total, 255), False
        return 1, True

    # --- runs ---------------------------------------------------------------
    def run(self, bindings: Sequence, *, timeout: float | None = None,
            progress: Callable[[int, int], None] | None = None) -> None:
        """Run every workgroup of the grid on ``bindings``.

        Args:
            bindings: ``binding_count`` bindings, each a C-contiguous numpy
                array or a buffer (mapped as
                :meth:`hal_cpu.Executable.dispatch` maps them: natively an
                aligned writable array in place, else a 64-byte aligned
                copy, copied back when writable), or all of them
                ``(address, length)`` pairs of host memory in bytes (as
                :meth:`run_addresses`).
            timeout: seconds after which no further workgroup starts
                (None or 0: none; at most :data:`MAX_TIMEOUT`).
            progress: called as ``progress(done, total)`` (workgroups)
                after each chunk.

        Raises:
            DispatchError: not ``binding_count`` bindings, a binding
                neither array, buffer nor pair, or a workgroup returned
                non-zero (the message names the export and workgroup).
            DispatchTimeoutError: ``timeout`` passed.
            LibraryError: the executable was closed.
            BindingOverrunError, LocalMemoryOverrunError: under emulation,
                the kernel wrote past a binding's or its local memory's
                end.
            elfloader.EmulationError: the emulated CPU faulted (the message
                is a fault report).
            elfloader.BackendError: the backend was closed.
        """
        if len(bindings) != self.binding_count:
            raise DispatchError(f"prepared dispatch of {self.label} takes "
                                f"{self.binding_count} bindings, "
                                f"{len(bindings)} given", name=self.path,
                                field="bindings", value=len(bindings))
        if bindings and type(bindings[0]) is tuple:
            pointers, lengths = _pairs(bindings, self.path)
            if progress is None:
                self.run_addresses(pointers, lengths, timeout=timeout)
                return
            bindings = _host_arrays(pointers, lengths, None)
        if not timeout and progress is None and self.native and self.repeat(bindings):
            return
        self.run_mapped(bindings, timeout, progress)

    def run_mapped(self, bindings: Sequence, timeout: float | None,
                   progress: Callable[[int, int], None] | None) -> bool:
        """:meth:`run` by the general path: every binding mapped by
        :func:`hal_cpu.bindings.map_bindings`. Returns whether no binding
        was copied (natively: all used in place)."""
        exe = self.executable
        state: list = [None, None, None]

        def mapper():
            pointers, lengths, finishers = map_bindings(
                self.backend, bindings, self.native, self.export,
                exe.copy_warned, self.path)
            state[:] = pointers, lengths, finishers
            return pointers, lengths

        def after(ran: bool) -> None:
            pointers, lengths, finishers = state
            if finishers is not None:
                finish(finishers, ran, exe, self.export, pointers, lengths)
        self._execute(mapper, after, timeout, progress)
        return state[2] is None

    def run_addresses(self, pointers: Sequence[int],
                      lengths: Sequence[int] | None = None, *,
                      writable: Sequence[bool] | None = None,
                      timeout: float | None = None) -> None:
        """Run every workgroup of the grid on bindings given as host
        addresses (the hot path of replayed command buffers).

        Natively the kernel reads and writes the memory at ``pointers``
        in place: every range must be mapped, writable where the kernel
        writes, and (as IREE allocates) 64-byte aligned; nothing checks
        this. Emulated, each range is copied into the guarded guest range
        this object keeps for its binding (made at the first run; lengths
        other than :attr:`lengths`, an empty or overlapping range go
        through copies made per run), and copied back when ``writable``
        says so.

        Args:
            pointers: host address of each binding's first byte.
            lengths: bytes of each binding (None: :attr:`lengths`).
            writable: per binding, whether it is copied back after an
                emulated run (None: all).
            timeout: as for :meth:`run`.

        Raises:
            As :meth:`run`.
        """
        if lengths is None:
            lengths = self.lengths
            if lengths is None:
                raise DispatchError("no binding lengths: prepare with "
                                    "lengths or pass them", name=self.path,
                                    field="lengths", value=None)
        if self.native:
            short = self._short
            if (timeout or short is None or self.backend.timeout_us
                    or not short(pointers, lengths)):
                self._execute(lambda: (pointers, lengths), None, timeout, None)
            return
        if (self.lengths is not None and list(lengths) == self.lengths
                and all(lengths) and not _overlap(pointers, lengths)
                and self._range_lock.acquire(False)):
            try:
                self._run_guarded(pointers, lengths, writable, timeout)
            finally:
                self._range_lock.release()
            return
        self.run_mapped(_host_arrays(pointers, lengths, writable), timeout, None)

    def runner(self) -> Callable[[Sequence[int]], None]:
        """:meth:`run_addresses` with the lengths given to
        :meth:`hal_cpu.Executable.prepare`, no time limit and every
        binding writable, as a function of the pointers alone: natively
        the short path itself (one crossing, nothing else called) when
        the grid allows it. For callers that replay one dispatch many
        times (the VM's command buffers).

        Raises:
            DispatchError: no lengths were given to ``prepare``.
        """
        lengths = self.lengths
        if lengths is None:
            raise DispatchError("no binding lengths: prepare with lengths",
                                name=self.path, field="lengths", value=None)
        short, backend, run_addresses = self._short, self.backend, self.run_addresses
        if short is None:
            return lambda pointers: run_addresses(pointers, lengths)

        def run(pointers: Sequence[int]) -> None:
            if backend.timeout_us or not short(pointers, lengths):
                run_addresses(pointers, lengths)
        return run

    @property
    def batchable(self) -> bool:
        """Whether it can run in a :class:`DispatchBatch`: native, with
        binding lengths, its grid in one crossing on one worker (the short
        path of :meth:`runner`)."""
        return self._short is not None and self.lengths is not None

    # --- the native short path ---------------------------------------------
    def repeat(self, bindings: Sequence) -> bool:
        """The short path of a native run on arrays: every binding a numpy
        array the native backend uses in place (writable, C-contiguous,
        not empty, 64-byte aligned: checked each call). Returns False
        (nothing done) when it does not apply, for :meth:`run_mapped`."""
        short = self._short
        if short is None or self.backend.timeout_us:
            return False
        pointers, lengths = [], []
        for a in bindings:
            if type(a) is not _ndarray:
                return False
            try:
                # Writable, C-contiguous and not empty (as map_array checks).
                address = _addressof(_from_buffer(a))  # type: ignore[arg-type]
            except (TypeError, ValueError):
                return False
            if address % BINDING_ALIGNMENT:
                return False
            pointers.append(address)
            lengths.append(a.nbytes)
        return short(pointers, lengths)

    def _make_short(self) -> Callable[[Sequence[int], Sequence[int]], bool]:
        """The short path as one function with everything it reads bound:
        the layout from the pool, the binding pointers and lengths
        rewritten (:meth:`DispatchLayout.write_again`), one crossing, the
        return and local-memory checks; with the default workers, the
        pace noted when it may change whether the next run shares."""
        exe = self.executable
        running = self._running
        add, drop = running.append, running.remove
        pool = self._fast_pool
        pop, put = pool.pop, pool.append
        total, wc, label, path = self.total, self.wc, self.label, self.path
        ordinal, shares = self.ordinal, self.shares
        pace_of = exe.pace.get
        ident = _get_ident
        owner = self

        def short(pointers: Sequence[int], lengths: Sequence[int]) -> bool:
            if shares:
                pace = pace_of(ordinal)
                if pace is not None and pace * total > SHARE_SECONDS:
                    return False
            me = ident()
            add(me)
            try:
                if exe.closed:
                    raise LibraryError("the executable is closed", name=path,
                                       field="dispatch", value=label)
                try:
                    layout = pop()
                except IndexError:
                    layout = owner._new_layout(1)
                try:
                    exe.last_workers = 1
                    if shares:
                        started = _perf_counter()
                    layout.write_again(owner, pointers, lengths)
                    ret = layout.loops[0]()
                    if ret:
                        check_return(layout, ret, total, wc, label, path)
                    if layout.local_checks:
                        layout.check_local(label, path)
                    if shares:
                        # Only a slow dispatch, or the first fast one after
                        # it, can change whether the next one shares: the
                        # pace is noted then (in between, the pace noted
                        # last is a fast one).
                        elapsed = _perf_counter() - started
                        if elapsed > SHARE_SECONDS or owner.slow:
                            owner.slow = elapsed > SHARE_SECONDS
                            exe.note_pace(ordinal, elapsed / total)
                finally:
                    put(layout)
            finally:
                drop(me)
                if exe.closed:
                    exe.release_if_idle()
            return True
        return short

    def take_layout(self) -> DispatchLayout:
        """A one-worker dispatch layout of this dispatch's export, the
        caller's until :meth:`give_layout` (from the executable's pool, or
        made)."""
        try:
            return self._fast_pool.pop()
        except IndexError:
            return self._new_layout(1)

    def give_layout(self, layout: DispatchLayout) -> None:
        """Return a layout of :meth:`take_layout` to the pool."""
        self._fast_pool.append(layout)

    def _new_layout(self, workers: int) -> DispatchLayout:
        layout = DispatchLayout(self.backend, self.binding_count,
                                self.constant_count, workers, self._local)
        layout.calls(self.address, self.executable.environment)
        return layout

    # --- the general path ---------------------------------------------------
    def _execute(self, mapper: Callable[[], tuple[Sequence[int], Sequence[int]]],
                 after: Callable[[bool], None] | None, timeout, progress) -> None:
        """One run: take a layout (and, emulated, CPUs), map the bindings
        (``mapper`` gives the pointers and lengths the kernel sees), write
        the layout, run the grid, translate faults; ``after(ran)`` undoes
        the mapping before the layout goes back."""
        exe = self.executable
        total = self.total
        if not total:
            if exe.closed:
                raise LibraryError("the executable is closed", name=self.path,
                                   field="dispatch", value=self.label)
            return      # an empty grid runs nothing, as in IREE
        if timeout:
            timeout = check_timeout(timeout, "timeout", self.path)
        workers, timed = self._workers()
        exe.last_workers = workers
        me = _get_ident()
        running = self._running
        running.append(me)
        layout = first_cpu = None
        pointers: Sequence[int] = ()
        lengths: Sequence[int] = ()
        ran = False
        pool = self._pools.get(workers)
        if pool is None:
            pool = self._pools[workers] = exe.layout_pool(self._key(workers))
        try:
            if exe.closed:
                raise LibraryError("the executable is closed", name=self.path,
                                   field="dispatch", value=self.label)
            try:
                layout = pool.pop()
            except IndexError:
                layout = self._new_layout(workers)
            leases = self.leases
            if leases is not None:
                # Emulated: this dispatch's workers get CPUs of their own.
                first_cpu = leases.take(workers)
                layout.calls(self.address, exe.environment, first_cpu)
            pointers, lengths = mapper()
            # An observer of emulated dispatches (the workbench's sanitizer
            # and instruction counts) sees the laid-out run before it starts.
            watched = WATCH(self, layout, pointers, lengths) if WATCH else None
            started = _perf_counter()
            if workers == 1 and not progress:
                layout.write_again(self, pointers, lengths)
            else:
                layout.write(self.wsize, self.wc, workers, self.consts, pointers,
                             lengths, total)
            try:
                if timeout or progress is not None or self.backend.timeout_us:
                    # (the emulated backend may carry a per-call limit)
                    deadline = time.monotonic() + timeout if timeout else None
                    with self.backend.time_limit(timeout or 0):
                        run_grid(self.backend, layout, self.address,
                                 exe.environment, total, label=self.label,
                                 path=self.path, grid=self.wc,
                                 deadline=deadline, progress=progress)
                elif total <= layout.whole or (
                        workers == 1 and self._pace is not None
                        and self._pace * total <= CHUNK_SECONDS):
                    # (run_grid, minus its set-up, for one crossing: a
                    # small grid, or one its last run says is quick)
                    layout.run_whole(total, self.wc, self.label, self.path)
                else:
                    run_grid(self.backend, layout, self.address, exe.environment,
                             total, label=self.label, path=self.path,
                             grid=self.wc)
            except elfloader.EmulationError as exc:
                from .faults import dispatch_fault
                raise dispatch_fault(exc, exe, self.export, pointers, lengths,
                                     layout) from None
            ran = True
            if watched is not None:
                watched()
            if workers == 1:
                self._pace = (_perf_counter() - started) / total
                if timed:
                    exe.note_pace(self.ordinal, self._pace)
            elif layout.per_workgroup is not None and workers > 1:
                exe.pace[self.ordinal] = layout.per_workgroup
        finally:
            try:
                if after is not None:
                    after(ran)
            finally:
                if first_cpu is not None and self.leases is not None:
                    self.leases.give(first_cpu, workers)
                running.remove(me)
                if layout is not None:
                    pool.append(layout)
                if exe.closed:
                    exe.release_if_idle()

    # --- emulated: guarded ranges of their own ------------------------------
    def _run_guarded(self, pointers: Sequence[int], lengths: Sequence[int],
                     writable: Sequence[bool] | None, timeout) -> None:
        """An emulated run on this object's guarded guest ranges: the
        host bytes copied in, the grid run, the writable ones copied back,
        every canary checked. A one-worker grid known (by its last run) to
        take under :data:`hal_cpu.dispatch.CHUNK_SECONDS` crosses once
        with nothing else around it; any other goes through the general
        path."""
        guarded = self._ranges or self._make_ranges()
        guest = [g for g, _, _ in guarded]
        overrun: list = []
        total = self.total
        pace = self._pace
        if (timeout or self.backend.timeout_us or not total
                or (total > 1 and (pace is None or pace * total > CHUNK_SECONDS))
                or self._workers()[0] != 1):
            def mapper():
                for (_, host, _), src, length in zip(guarded, pointers, lengths):
                    _memmove(host, src, length)
                return guest, lengths

            def after(ran: bool) -> None:
                if ran:
                    self._copy_back(guarded, pointers, lengths, writable, overrun)
            self._execute(mapper, after, timeout, None)
        else:
            self._run_once(guarded, guest, pointers, lengths, writable, overrun)
        if overrun:
            from .faults import binding_overrun
            raise binding_overrun(overrun[0], self.executable, self.export,
                                  guest, lengths) from None

    @staticmethod
    def _copy_back(guarded, pointers: Sequence[int], lengths: Sequence[int],
                   writable: Sequence[bool] | None, overrun: list) -> None:
        """Copy the writable bindings back from their guest ranges and
        check every canary (a changed one appended to ``overrun``)."""
        for i, ((_, host, check), dst, length) in enumerate(
                zip(guarded, pointers, lengths)):
            if writable is None or writable[i]:
                _memmove(dst, host, length)
            if check is not None:
                try:
                    check()
                except elfloader.GuardError as exc:
                    overrun.append(exc)

    def _run_once(self, guarded, guest: list[int], pointers: Sequence[int],
                  lengths: Sequence[int], writable: Sequence[bool] | None,
                  overrun: list) -> None:
        """The emulated short path: one worker, one crossing."""
        exe = self.executable
        total = self.total
        me = _get_ident()
        running = self._running
        running.append(me)
        pool = self._fast_pool
        layout = None
        try:
            if exe.closed:
                raise LibraryError("the executable is closed", name=self.path,
                                   field="dispatch", value=self.label)
            try:
                layout = pool.pop()
            except IndexError:
                layout = self._new_layout(1)
            exe.last_workers = 1
            leases = self.leases
            assert leases is not None      # (emulated)
            first = leases.take(1)
            ran = False
            try:
                loop = layout.calls(self.address, exe.environment, first)[0]
                for (_, host, _), src, length in zip(guarded, pointers, lengths):
                    _memmove(host, src, length)
                layout.write_again(self, guest, lengths)
                ran = True
                started = _perf_counter()
                try:
                    ret = loop()
                except elfloader.EmulationError as exc:
                    from .faults import dispatch_fault
                    raise dispatch_fault(exc, exe, self.export, guest, lengths,
                                         layout) from None
                self._pace = (_perf_counter() - started) / total
            finally:
                leases.give(first, 1)
                if ran:
                    self._copy_back(guarded, pointers, lengths, writable, overrun)
            if overrun:
                return
            if ret:
                check_return(layout, ret, total, self.wc, self.label, self.path)
            if layout.local_checks:
                layout.check_local(self.label, self.path)
        finally:
            running.remove(me)
            if layout is not None:
                pool.append(layout)
            if exe.closed:
                exe.release_if_idle()

    def _make_ranges(self) -> list[tuple[int, int, Callable[[], None] | None]]:
        backend = self.backend
        if self.executable.closed:
            raise LibraryError("the executable is closed", name=self.path,
                               field="dispatch", value=self.label)
        made: list[tuple[int, int, Callable[[], None] | None]] = []
        try:
            for length in self.lengths or ():
                address, check = backend.alloc_guarded(length)
                made.append((address, 0, check))
                view = backend.view(address, length)
                assert view is not None      # (emulated memory has views)
                host = np.frombuffer(view, np.uint8).ctypes.data
                view.release()
                made[-1] = (address, host, check)
        except BaseException:
            for address, _, _ in made:
                backend.release(address)
            raise
        self.executable.keep_allocations([g for g, _, _ in made])
        self._ranges = made
        return made

    @property
    def guarded_ranges(self) -> list[int]:
        """Guest addresses of the guarded ranges this object holds, one per
        binding (emulated; none natively or before the first
        :meth:`run_addresses`)."""
        return [g for g, _, _ in self._ranges or ()]

    def close(self) -> None:
        """Free the guarded guest ranges (emulated); runs after this make
        new ones. Closing the executable frees them too."""
        with self._range_lock:
            ranges, self._ranges = self._ranges, None
            if ranges and not self.executable.closed and not self.backend.closed:
                self.executable.free_allocations([g for g, _, _ in ranges])


#: ``hal_cpu_batch_t`` of the runtime library (``workgroup_loop.c``):
#: fixed-width fields only, the same offsets on every target.
BATCH_HEADER = struct.Struct("<QQIIIi")
#: ``hal_cpu_batch_dispatch_t``: one record per dispatch.
BATCH_RECORD = struct.Struct("<QQQQQQQII")
#: ``hal_cpu_batch_source_t``: (table slot or :data:`NO_SLOT`, offset).
BATCH_SOURCE = struct.Struct("<QQ")
#: The slot of a source whose offset is the address itself.
NO_SLOT = (1 << 64) - 1
#: ``failed`` of the batch header when no dispatch stopped it.
NO_DISPATCH = (1 << 32) - 1

_BATCH_FUNCTIONS: "weakref.WeakKeyDictionary[Backend, int]" = weakref.WeakKeyDictionary()
_BATCH_LOCK = threading.Lock()


def batch_function(backend: Backend) -> int:
    """Address of ``hal_cpu_dispatch_batch`` (:data:`hal_cpu.runtime.BATCH_SYMBOL`)
    in ``backend``, loading the runtime support bundle for it the first
    time (the library lives as long as the backend)."""
    with _BATCH_LOCK:
        address = _BATCH_FUNCTIONS.get(backend)
        if address is None:
            module = elfloader.load(runtime.BUNDLE, backend=backend)
            address = _BATCH_FUNCTIONS[backend] = module.lookup(runtime.BATCH_SYMBOL)
        return address


class DispatchBatch:
    """Native prepared dispatches run in order as one submission, in one
    crossing into the runtime library's ``hal_cpu_dispatch_batch``
    (``hal_cpu/runtime/workgroup_loop.c``): a command buffer replayed many
    times on different binding tables (the VM's
    ``hal.device.queue.execute.indirect``).

    Each dispatch keeps a dispatch layout of its own for the batch's life
    (dispatch state, constants and binding lengths written once); a run
    writes the table's slot addresses into the batch block (one write) and
    crosses once: the library writes each dispatch's binding pointers
    (``table[slot] + offset``), resets its range to the whole grid and
    runs its workgroup loop, each dispatch finishing before the next starts
    (the barriers of the command buffer hold). Every check of
    :meth:`PreparedDispatch.run_addresses` stays: the executables open,
    each workgroup's return status (a failure names the dispatch's export
    and workgroup; later dispatches do not run), local memory canaries.

    Args:
        items: per dispatch ``(prepared, sources)``: a native
            :class:`PreparedDispatch` with lengths whose grid runs in one
            crossing on one worker (:attr:`PreparedDispatch.batchable`);
            ``sources`` one ``(slot, offset)`` per binding: the binding's
            host address is ``table[slot] + offset``, or ``offset`` itself
            for a negative slot.

    Raises:
        DispatchError: a dispatch that cannot be batched, sources of
            another count or a slot past 2**32.
    """

    __slots__ = ("items", "slots", "_lock", "_execs", "slow", "_shares",
                 "_call", "_view", "_table", "_block", "_backend", "_header",
                 "_local", "_packed")

    def __init__(self, items: Sequence[tuple["PreparedDispatch",
                                             Sequence[tuple[int, int]]]]):
        checked = []
        for prepared, sources in items:
            if not prepared.batchable:
                raise DispatchError(f"dispatch {prepared.label} cannot run in a "
                                    "batch (emulated, no binding lengths, "
                                    "several workers or a grid over one "
                                    "crossing)", name=prepared.path,
                                    field="batch", value=prepared.wc)
            sources = tuple((int(s), int(o)) for s, o in sources)
            if len(sources) != prepared.binding_count:
                raise DispatchError(f"dispatch {prepared.label} takes "
                                    f"{prepared.binding_count} bindings, "
                                    f"{len(sources)} sources given",
                                    name=prepared.path, field="sources",
                                    value=len(sources))
            for s, o in sources:
                if s >= 1 << 32 or not 0 <= o < 1 << 64:
                    raise DispatchError(f"dispatch {prepared.label}: binding "
                                        f"source ({s}, {o}) out of range",
                                        name=prepared.path, field="sources",
                                        value=(s, o))
            checked.append((prepared, sources))
        if not checked:
            raise DispatchError("a batch of no dispatches", name=None,
                                field="batch", value=0)
        backend = checked[0][0].backend
        if any(p.backend is not backend for p, _ in checked):
            raise DispatchError("a batch's dispatches run on one backend",
                                name=checked[0][0].path, field="batch",
                                value=len(checked))
        #: slots of the table each run reads (one past the highest)
        self.slots = max((s + 1 for _, src in checked for s, _ in src), default=0)
        function = batch_function(backend)
        n = len(checked)
        bindings = sum(len(src) for _, src in checked)
        records_at = BATCH_HEADER.size
        table_at = records_at + BATCH_RECORD.size * n
        sources_at = table_at + 8 * self.slots
        size = sources_at + BATCH_SOURCE.size * bindings
        block = backend.alloc(max(size, 64), 64)
        made: list = []
        try:
            for prepared, sources in checked:
                layout = prepared.take_layout()
                made.append((prepared, layout))
                layout.write_again(prepared, [0] * prepared.binding_count,
                                   prepared.lengths or ())
            data = bytearray(size)
            BATCH_HEADER.pack_into(data, 0, block + records_at, block + table_at,
                                   n, self.slots, NO_DISPATCH, 0)
            at = sources_at
            for k, ((prepared, layout), (_, sources)) in enumerate(zip(made, checked)):
                BATCH_RECORD.pack_into(
                    data, records_at + BATCH_RECORD.size * k, prepared.address,
                    prepared.executable.environment, layout.state,
                    layout.workgroup_states[0], layout.ranges[0], block + at,
                    prepared.total, len(sources), 0)
                for s, o in sources:
                    BATCH_SOURCE.pack_into(data, at, NO_SLOT if s < 0 else s, o)
                    at += BATCH_SOURCE.size
            backend.write(block, bytes(data))
        except BaseException:
            for prepared, layout in made:
                prepared.give_layout(layout)
            backend.release(block)
            raise
        self._backend, self._block = backend, block
        self._view = backend.view(block + table_at, 8 * self.slots) if self.slots else None
        self._table = struct.Struct(f"<{self.slots}Q")
        # (the table last written to the block, which the runtime only
        # reads: a run on the same addresses writes nothing)
        self._packed: Sequence[int] | None = None
        self._header = block
        self._call = backend.bound_calls(function, [(block,)])[0]
        self.items = [(prepared, layout) for prepared, layout in made]
        # (the dispatches with local memory canaries to check after a run)
        self._local = [(p, lay) for p, lay in made if lay.local_checks]
        self._lock = threading.Lock()
        execs: list = []
        for prepared, _ in made:
            if prepared.executable not in execs:
                execs.append(prepared.executable)
        self._execs = execs
        self._shares = [p for p, _ in made if p.shares]
        #: the last run took longer than SHARE_SECONDS: the next one goes
        #: dispatch by dispatch (each export's pace noted)
        self.slow = False

    def run(self, table: Sequence[int]) -> bool:
        """Run every dispatch in order on the bindings ``table`` gives
        (host address of each slot's first byte; at least :attr:`slots`
        entries). Returns False, having run nothing, when the batch does
        not apply now (another thread runs it, a backend time limit, an
        executable closed, a dispatch whose export's pace says its grid is
        shared between threads, or the last run was slow): the caller
        then runs the dispatches one by one.

        Raises:
            DispatchError: a workgroup returned non-zero (the message names
                the export and the workgroup; later dispatches did not
                run), or the library refused the batch.
            LocalMemoryOverrunError: see :meth:`PreparedDispatch.run`.
        """
        if self.slow:
            self.slow = False       # (one run dispatch by dispatch)
            return False
        lock = self._lock
        if not lock.acquire(False):
            return False
        try:
            execs = self._execs
            for exe in execs:
                if exe.closed or exe.backend.timeout_us:
                    return False
            shares = self._shares
            if shares:
                for p in shares:
                    pace = p.executable.pace.get(p.ordinal)
                    if pace is not None and pace * p.total > SHARE_SECONDS:
                        return False
            if not self.items or self._backend.closed:
                return False
            slots = self.slots
            given = len(table)
            if given < slots:
                raise DispatchError(f"the batch reads {slots} table slots; "
                                    f"{given} given", name=None,
                                    field="table", value=given)
            me = _get_ident()
            for exe in execs:
                exe.running.append(me)
            try:
                if self._view is not None:
                    if given != slots:
                        table = table[:slots]
                    if type(table) is not list or table != self._packed:
                        self._packed = None
                        self._table.pack_into(self._view, 0, *table)
                        if type(table) is list:
                            self._packed = table[:]
                if shares:
                    started = _perf_counter()
                    ret = self._call()
                    if _perf_counter() - started > SHARE_SECONDS:
                        self.slow = True
                else:
                    ret = self._call()
                if ret:
                    self._failed(ret)
                if self._local:
                    for prepared, layout in self._local:
                        layout.check_local(prepared.label, prepared.path)
            finally:
                for exe in execs:
                    exe.running.remove(me)
                    exe.last_workers = 1
                    if exe.closed:
                        exe.release_if_idle()
            return True
        finally:
            lock.release()

    def _failed(self, ret: int) -> None:
        """Raise for the non-zero return ``ret`` of a run."""
        header = BATCH_HEADER.unpack(self._backend.read(self._header,
                                                        BATCH_HEADER.size))
        failed = header[4]
        if failed >= len(self.items):
            raise DispatchError("the runtime library refused the dispatch "
                                f"batch (status {as_int32(ret)})", name=None,
                                field="batch", value=len(self.items))
        prepared, layout = self.items[failed]
        check_return(layout, ret, prepared.total, prepared.wc, prepared.label,
                     prepared.path)

    def close(self) -> None:
        """Give the layouts back to their dispatches' pools and free the
        batch block (runs after this return False)."""
        with self._lock:
            items, self.items = self.items, []
            self._local = []
            for prepared, layout in items:
                prepared.give_layout(layout)
            if items and not self._backend.closed:
                if self._view is not None:
                    self._view.release()
                    self._view = None
                self._backend.release(self._block)


def _overlap(pointers: Sequence[int], lengths: Sequence[int]) -> bool:
    """Whether two of the ranges overlap."""
    if len(pointers) < 2:
        return False
    spans = sorted(zip(pointers, lengths))
    return any(spans[i][0] + spans[i][1] > spans[i + 1][0]
               for i in range(len(spans) - 1))
