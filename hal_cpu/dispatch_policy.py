"""How an executable runs its dispatches: the argument checks, how many
workers, the repeat fast path and time-limited runs.

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

The layouts, the workgroup loop and :func:`~hal_cpu.dispatch.run_grid` are
:mod:`hal_cpu.dispatch`'s; the bindings' mapping is
:mod:`hal_cpu.bindings`'.
"""

from __future__ import annotations

import ctypes
import os
import threading
import time
from typing import Any, Callable, Sequence

import numpy as np

import elfloader
from elfloader import Backend

from . import abi, runtime
from .arrays import BINDING_ALIGNMENT
from .dispatch import FIRST_CHUNK, SHARE_SECONDS, DispatchLayout, check_return, run_grid
from .errors import DispatchError

_get_ident = threading.get_ident
_perf_counter = time.perf_counter
_ndarray = np.ndarray
_from_buffer = ctypes.c_char.from_buffer
_addressof = ctypes.addressof

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


def is_int_triple(values: tuple) -> bool:
    """Whether the three values are ints (not bools, floats, numpy ints)."""
    x, y, z = values
    return type(x) is int and type(y) is int and type(z) is int


class Repeat:
    """What :meth:`hal_cpu.Executable.dispatch` validated for a small native
    dispatch, to repeat it (:meth:`DispatchPolicy._repeat`)."""

    __slots__ = ("grid", "workers_arg", "n", "key", "ordinal",
                 "label", "constants", "constant_count", "consts", "wc",
                 "wsize", "total", "shares", "pool", "slow")

    grid: tuple
    workers_arg: int | None
    n: int
    key: tuple[int, int, int, int]
    ordinal: int
    label: str
    constants: Any
    constant_count: int
    consts: Sequence[int]
    wc: tuple[int, int, int]
    wsize: tuple[int, int, int]
    total: int
    shares: bool
    pool: list[DispatchLayout]
    slow: bool


class DispatchPolicy:
    """The dispatch policy of an executable library (the base of
    :class:`hal_cpu.Executable`): the paces of its exports, the dispatches
    it may repeat, the worker count of each dispatch, and runs under a time
    limit.

    The executable provides its backend, file name, environment, layout
    pools and the bookkeeping of its running dispatches (declared below);
    :meth:`_init_policy` starts the policy's own state."""

    backend: Backend
    path: str
    last_workers: int
    _env: int
    # export ordinal, bindings, constants, workers -> layouts not in use
    _layouts: dict[tuple, list[DispatchLayout]]
    _running: list[int]            # thread ids of running dispatches
    _closed: bool

    def _end_dispatch(self, me: int, key, layout: DispatchLayout | None,
                      counted: bool = True) -> None:
        """Stop counting the dispatch of thread ``me`` (the executable's
        bookkeeping: the last one to end after a close frees it)."""
        raise NotImplementedError

    def _init_policy(self, kind: str) -> None:
        """Start with no pace and no dispatch to repeat, for a backend of
        ``kind``."""
        # export key -> Repeat: a validated small native dispatch to repeat
        self._quick: dict[Any, Repeat] = {}
        # export ordinal -> seconds per workgroup in its last dispatch with
        # the default workers (decides whether the next one shares)
        self._pace: dict[int, float] = {}
        # export ordinal -> seconds per workgroup measured in its last
        # one-worker dispatch with the default workers: the pace kept is
        # the smaller of the last two such, so that one dispatch slowed
        # down from outside (the thread preempted, a garbage collection)
        # does not make the next one share a small grid. (A repeated
        # dispatch, _repeat, notes its pace only when it or the one before
        # it took longer than SHARE_SECONDS.)
        self._timed: dict[int, float] = {}
        self._default_workers = host_workers()
        self._first_chunk = FIRST_CHUNK.get(kind, 1)

    def _check_dispatch(self, exp: Any, workgroup_count, workgroup_size,
                        n: int, constants, workers
                        ) -> tuple[tuple[int, int, int], tuple[int, int, int],
                                   Sequence[int], int, int, bool]:
        """The checked arguments of a dispatch of ``exp`` with ``n``
        bindings: ``(grid, workgroup size, constants, workgroup total,
        workers, timed)``, the workgroup size ``exp``'s unless overridden;
        for an empty grid (total 0, nothing to run) the workers are 0 and
        unchecked. ``timed``: the pace of the dispatch is to be measured
        (one worker chosen by default for a grid that could be shared).

        Raises:
            DispatchError: a count out of range, fewer bindings or
                constants than the export declares, a constant not a
                uint32, more workgroups than a dispatch can run, ``workers``
                not a positive int."""
        path = self.path
        wc = check_triple(workgroup_count, "workgroup_count", path, 1 << 32, 0)
        wsize = (check_triple(workgroup_size, "workgroup_size", path, 1 << 32, 1)
                 if workgroup_size is not None else exp.workgroup_size)
        if n < exp.binding_count or n > abi.MAX_BINDING_COUNT:
            raise DispatchError(f"export {exp.label} declares {exp.binding_count} "
                                f"bindings (at most {abi.MAX_BINDING_COUNT}), "
                                f"{n} given", name=path, field="bindings",
                                value=n)
        consts = (constants if not constants and not exp.constant_count
                  else check_constants(constants, exp, path))
        total = wc[0] * wc[1] * wc[2]
        if total == 0:
            return wc, wsize, consts, 0, 0, False
        if total > runtime.MAX_END:
            raise DispatchError(f"{total} workgroups exceed the 2**64 - 1 a "
                                "dispatch can run", name=path,
                                field="workgroup_count", value=wc)
        if workers is None:
            # Default: one worker unless the grid takes long enough (by the
            # export's pace in earlier dispatches) to pay for sharing it.
            if total > 1 and self._default_workers > 1:
                pace = self._pace.get(exp.ordinal)
                if (pace * total > SHARE_SECONDS if pace is not None
                        else total > self._first_chunk):
                    workers = min(self._default_workers, total, 255)
                    return wc, wsize, consts, total, workers, False
                return wc, wsize, consts, total, 1, True
            return wc, wsize, consts, total, 1, False
        if type(workers) is int and workers > 0:
            return wc, wsize, consts, total, min(workers, total, 255), False
        workers = check_workers(workers, total, path, self._default_workers)
        return wc, wsize, consts, total, workers, False

    def _note_pace(self, ordinal: int, pace: float) -> None:
        """Keep ``pace`` (seconds per workgroup of a one-worker dispatch
        with the default workers): the export's pace becomes the smaller of
        it and the one measured before."""
        last = self._timed.get(ordinal, pace)
        self._timed[ordinal] = pace
        self._pace[ordinal] = min(pace, last)

    def _remember(self, export, exp: Any, grid: tuple, wc, total: int,
                  key, constants, consts, timed: bool, workers_arg) -> None:
        """Keep what a small native dispatch that ran in place validated,
        for :meth:`_repeat` (one per export key: the last grid)."""
        q = Repeat()
        q.grid, q.workers_arg = grid, workers_arg
        q.n, q.key, q.ordinal, q.label = key[1], key, exp.ordinal, exp.label
        q.constants = constants if consts else None
        q.constant_count, q.consts = len(consts), consts
        q.wc, q.wsize, q.total = wc, exp.workgroup_size, total
        # (the pool of layouts for the key; an executable's pools live as
        # long as it is open)
        q.pool = self._layouts.setdefault(key, [])
        # Default workers on a grid that could be shared: the export's pace
        # decides, as in dispatch().
        q.shares = workers_arg is None and total > 1 and self._default_workers > 1
        q.slow = True      # (the next repeat notes its pace)
        assert not q.shares or timed
        self._quick[export] = q

    def _repeat(self, q: Repeat, bindings) -> bool:
        """Run a dispatch with the export, grid (the same tuple, or an equal
        tuple of ints), workers argument and constants object of ``q`` (a
        dispatch :meth:`hal_cpu.Executable.dispatch` validated and ran in
        one crossing, natively, bindings in place) when it is exactly that
        again: every binding a numpy array the native backend uses in
        place (writable, C-contiguous, not empty, at a 64-byte aligned
        address: checked for each call), the layout pool not empty, the
        default worker count still 1. Returns False (nothing done) when it
        is not, for the general path to run it."""
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
        if self.backend._closed:  # type: ignore[attr-defined]
            return False
        shares = q.shares
        if shares:
            pace = self._pace.get(q.ordinal)
            if pace is not None and pace * q.total > SHARE_SECONDS:
                return False
        me = _get_ident()
        self._running.append(me)
        if self._closed:
            self._end_dispatch(me, q.key, None)
            return False
        pool = q.pool
        try:
            layout = pool.pop()
        except IndexError:
            self._end_dispatch(me, q.key, None)
            return False
        try:
            self.last_workers = 1
            if shares:
                started = _perf_counter()
            layout.write_again(q, pointers, lengths)
            ret = layout.loops[0]()
            if ret:
                check_return(layout, ret, q.total, q.wc, q.label, self.path)
            if layout.local_checks:
                layout.check_local(q.label, self.path)
            if shares:
                # Only a slow dispatch, or the first fast one after it, can
                # change whether the next one shares: the pace is noted
                # then (in between, the pace noted last is a fast one).
                elapsed = _perf_counter() - started
                if elapsed > SHARE_SECONDS or q.slow:
                    q.slow = elapsed > SHARE_SECONDS
                    self._note_pace(q.ordinal, elapsed / q.total)
        finally:
            self._running.remove(me)
            pool.append(layout)
            if self._closed:
                self._end_dispatch(me, q.key, None, False)
        return True

    def _run_limited(self, layout: DispatchLayout, exp: Any, total: int,
                     wc: tuple[int, int, int], timeout,
                     progress: Callable[[int, int], None] | None,
                     pointers: list[int], lengths: list[int]) -> None:
        """run_grid with a time limit (``timeout`` seconds, or none) on every
        guest call and between chunks, and progress reports."""
        timeout = check_timeout(timeout, "timeout", self.path)
        deadline = time.monotonic() + timeout if timeout else None
        with self.backend.time_limit(timeout or 0):
            try:
                run_grid(self.backend, layout, exp.address, self._env, total,
                         label=exp.label, path=self.path, grid=wc,
                         deadline=deadline, progress=progress)
            except elfloader.EmulationError as exc:
                raise self._fault(exc, exp, pointers, lengths, layout) from None

    def _fault(self, exc: elfloader.EmulationError, exp: Any,
               pointers: list[int], lengths: list[int],
               layout: DispatchLayout) -> BaseException:
        """The error a fault of the emulated CPU in a dispatch of ``exp``
        becomes: its report (:func:`hal_cpu.faults.dispatch_fault`)."""
        from .faults import dispatch_fault
        return dispatch_fault(exc, self, exp, pointers, lengths, layout)
