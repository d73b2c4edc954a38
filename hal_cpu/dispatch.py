"""Running a dispatch: cached layouts and the workgroup loop in machine code.

A dispatch of an export over a 3-D grid needs, in the backend's memory, the
dispatch state, the constants, the binding pointer and length arrays
(iree/hal/local/executable_library.h, v0.6) and, per worker, a workgroup
state, local memory and the range of the runtime support library's
workgroup loop (:mod:`hal_cpu.runtime`). :class:`DispatchLayout` lays all
of them out in one block (local memory apart, each worker's ending at a
guard page where the backend has them), built once per export, binding
count, constant count and worker count; a dispatch only rewrites what
changed (one write). An executable keeps a pool of layouts per export
and takes one per dispatch, so dispatches on several threads at once each
write their own block; under emulation each also takes its own CPUs
(:class:`CpuLeases`).

:func:`run_grid` crosses into the backend once per chunk of workgroups:
chunks grow until one takes about :data:`CHUNK_SECONDS`, so Ctrl-C, a time
limit and progress reports stay responsive while the per-workgroup cost is
the kernel's own. With several workers (native backend), each host thread
runs the loop on chunks it takes from a shared counter, with the GIL
released; a failing workgroup raises the stop flag the others check, and
an emulated fault also stops the other workers' CPUs.
"""

from __future__ import annotations

import functools
import os
import queue
import struct
import threading
import time
import weakref
from typing import Any, Callable, Sequence

import elfloader
from elfloader import Backend, as_int32
from fatelf.cstruct import pack_array, scalar_code

from . import abi, runtime
from .errors import DispatchError, DispatchTimeoutError, LocalMemoryOverrunError

#: Target duration of one crossing into the backend, in seconds.
CHUNK_SECONDS = 0.05
#: Worker threads start only when the rest of a grid would take longer.
THREAD_SECONDS = 0.0005
#: With the default worker count a grid is shared between threads only
#: when it would take longer than this on one (waking helper threads costs
#: 0.1-3 ms on a busy machine).
SHARE_SECONDS = 0.002
#: Workgroups in a worker's first chunk, per backend kind.
FIRST_CHUNK = {"native": 256, "emulated": 1}

_LOOPS: "weakref.WeakKeyDictionary[Backend, int]" = weakref.WeakKeyDictionary()
_LOOPS_LOCK = threading.Lock()


def loop_function(backend: Backend) -> int:
    """Address of the workgroup loop in ``backend``, loading the runtime
    support bundle (:data:`hal_cpu.runtime.BUNDLE`) the first time; the
    loaded library lives as long as the backend."""
    with _LOOPS_LOCK:
        address = _LOOPS.get(backend)
        if address is None:
            module = elfloader.load(runtime.BUNDLE, backend=backend)
            address = _LOOPS[backend] = module.lookup(runtime.LOOP_SYMBOL)
        return address


class CpuLeases:
    """Which of an emulated backend's CPUs (``backend.cpus``) dispatches
    are using: a dispatch on ``workers`` workers leases a run of that many
    CPUs no other dispatch runs on, the lowest free one first (so a lone
    dispatch always runs on CPUs 0..workers-1 and reuses their translated
    code). Natively every host thread is a CPU and nothing is leased.

    After ``fork()`` the child gets a fresh lock; leases held by other
    threads of the parent stay taken (those threads do not exist in the
    child, and the CPUs they ran on may still look busy there)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._busy: list[bool] = []

    def take(self, workers: int) -> int:
        """The first of ``workers`` consecutive free CPUs, now taken."""
        with self._lock:
            busy, run = self._busy, 0
            for i, taken in enumerate(busy):
                run = 0 if taken else run + 1
                if run == workers:
                    first = i - workers + 1
                    break
            else:
                first = len(busy) - run
                busy.extend([False] * (first + workers - len(busy)))
            busy[first:first + workers] = [True] * workers
            return first

    def give(self, first: int, workers: int) -> None:
        with self._lock:
            self._busy[first:first + workers] = [False] * workers

    def after_fork(self) -> None:
        self._lock = threading.Lock()


_LEASES: "weakref.WeakKeyDictionary[Backend, CpuLeases]" = (
    weakref.WeakKeyDictionary())


def cpu_leases(backend: Backend) -> CpuLeases | None:
    """The :class:`CpuLeases` of ``backend``; None for the native backend
    (nothing to lease)."""
    if backend.kind == "native":
        return None
    with _LOOPS_LOCK:
        leases = _LEASES.get(backend)
        if leases is None:
            leases = _LEASES[backend] = CpuLeases()
        return leases


def _after_fork_in_child() -> None:
    # A lock held by a thread that does not exist in the child would never
    # be released.
    global _LOOPS_LOCK
    _LOOPS_LOCK = threading.Lock()
    for leases in list(_LEASES.values()):
        leases.after_fork()


if hasattr(os, "register_at_fork"):
    # (the emulated backends hold their own locks across fork())
    os.register_at_fork(after_in_child=_after_fork_in_child)


_NO_INDEX = runtime.NO_INDEX


def _up(value: int, align: int) -> int:
    return -(-value // align) * align


class DispatchLayout:
    """One block of backend memory for dispatches of one export.

    Args:
        backend: where the block lives.
        binding_count, constant_count: sizes of the arrays.
        workers: how many workgroup states (one per worker).
        local_memory_size: bytes of local memory per worker.

    Attributes:
        block: the block's address; state: the dispatch state's address;
        workgroup_states, ranges: per-worker addresses; stop: address of the
        uint32 stop flag.
    """

    def __init__(self, backend: Backend, binding_count: int, constant_count: int,
                 workers: int, local_memory_size: int):
        self.backend = backend
        ps = backend.pointer_size
        key = backend.arch.c_abi
        state = abi.DISPATCH_STATE.layout(*key)
        wg = abi.WORKGROUP_STATE.layout(*key)
        rng = runtime.WORKGROUP_RANGE.layout(*key)
        self.binding_count, self.constant_count = binding_count, constant_count
        self.workers = workers
        # Rewritten on every dispatch, in one write: state, constants,
        # pointers, lengths and worker 0's range.
        consts_at = _up(state.size, 8)
        ptrs_at = _up(consts_at + 4 * constant_count, ps)
        lens_at = ptrs_at + ps * binding_count
        range0_at = _up(lens_at + ps * binding_count, 8)
        head = _up(range0_at + rng.size, 64)
        word = scalar_code("ptr", ps)
        pad = lambda n: "x" * n  # noqa: E731
        self._head = struct.Struct(
            state.format + pad(consts_at - state.size) + "I" * constant_count
            + pad(ptrs_at - consts_at - 4 * constant_count)
            + word * (2 * binding_count)
            + pad(range0_at - lens_at - ps * binding_count) + rng.format[1:])
        # The head from the binding pointers on (what write_again writes).
        self._tail = struct.Struct(
            state.format[0] + word * (2 * binding_count)
            + pad(range0_at - lens_at - ps * binding_count) + rng.format[1:])
        assert (state.format[0] in "<>=!"
                and self._tail.size == self._head.size - ptrs_at)
        self._ptrs_at = ptrs_at
        #: what the last write_again wrote the dispatch state and constants
        #: for (None: write() wrote them since)
        self.written: Any = None
        self._trailer: tuple[int, ...] = ()
        per = _up(wg.size, 64) + _up(rng.size, 64)
        total = head + per * workers + 64
        self.block = backend.alloc(total, 64)
        b = self.block
        self.state, self.consts, self.ptrs, self.lens = (
            b, b + consts_at, b + ptrs_at, b + lens_at)
        self.workgroup_states, self.ranges = [], []
        # Each worker's local memory ends at a guard page where the backend
        # can put one (backend.alloc_guarded).
        self.local_memory: list[int] = []
        self.local_checks: list[tuple[int, Callable[[], None]]] = []
        self.local_memory_size = local_memory_size
        for w in range(workers):
            at = b + head + per * w
            wg_at = at
            range_at = b + range0_at if w == 0 else at + _up(wg.size, 64)
            local = 0
            if local_memory_size:
                local, check = backend.alloc_guarded(local_memory_size)
                self.local_memory.append(local)
                if check is not None:
                    self.local_checks.append((w, check))
            backend.write(wg_at, wg.pack(
                processor_id=w, local_memory=local,
                local_memory_size=local_memory_size))
            self.workgroup_states.append(wg_at)
            self.ranges.append(range_at)
        self.stop = b + head + per * workers
        self._range = rng
        self._range_struct = struct.Struct(rng.format)
        assert rng.names == ["begin", "end", "failed_index", "stop", "status",
                             "reserved"]
        # write() packs the state fields in this order, without names.
        assert state.names == [
            "workgroup_size_x", "workgroup_size_y", "workgroup_size_z",
            "constant_count", "workgroup_count_x", "workgroup_count_y",
            "workgroup_count_z", "max_concurrency", "binding_count",
            "constants", "binding_ptrs", "binding_lengths"], state.names
        self._zero = bytes(4)
        self._stopped = True
        #: seconds per workgroup in worker 0's last chunk (None: not run)
        self.per_workgroup: float | None = None
        #: grids of at most this many workgroups run in one crossing
        self.whole = FIRST_CHUNK.get(backend.kind, 1) if workers == 1 else 0
        # Natively the head is packed straight into the block; elsewhere
        # into a buffer then written.
        self._view = backend.view(b, head)
        self._target: Any = (self._view if self._view is not None
                             else bytearray(self._head.size))
        #: the workgroup loop as one no-argument callable per worker, bound
        #: to the export, environment and first CPU in ``bound`` (see
        #: :meth:`calls`)
        self.loops: list[Callable[[], int]] = []
        self.bound: tuple[int, int, int] | None = None
        self._bound_calls: dict[tuple[int, int, int], list] = {}
        #: the first of the backend's CPUs this layout's workers run on
        #: (emulated; leased per dispatch from :func:`cpu_leases`)
        self.first_cpu = 0

    def calls(self, function: int, environment: int,
              first_cpu: int = 0) -> list[Callable[[], int]]:
        """The workgroup loop of each worker, bound to its arguments (the
        dispatch function, the environment, the dispatch state, the worker's
        workgroup state and range) and, under emulation, to the CPUs
        ``first_cpu .. first_cpu + workers - 1``; built once per set."""
        key = (function, environment, first_cpu)
        if self.bound != key:
            loops = self._bound_calls.get(key)
            if loops is None:
                loop = loop_function(self.backend)
                args: list[tuple[int, ...]] = [
                    (function, environment, self.state, wg, rng)
                    for wg, rng in zip(self.workgroup_states, self.ranges)]
                if first_cpu == 0:
                    loops = self.backend.bound_calls(loop, args)
                else:
                    fns = self.backend.worker_functions(
                        loop, len(args[0]), first_cpu + self.workers)
                    loops = [functools.partial(f, *a) for f, a
                             in zip(fns[first_cpu:], args)]
                self._bound_calls[key] = loops
            self.loops, self.bound, self.first_cpu = loops, key, first_cpu
        return self.loops

    def stop_cpus(self) -> None:
        """Stop the emulated CPUs this layout's workers run on (see
        :meth:`elfloader.Backend.stop_workers`)."""
        backend, first = self.backend, self.first_cpu
        if first == 0:
            backend.stop_workers(self.workers)
            return
        cpus = getattr(backend, "cpus", None)
        if cpus is not None:
            for cpu in cpus(first + self.workers)[first:]:
                cpu.stop()

    def write(self, workgroup_size, workgroup_count, max_concurrency,
              constants: Sequence[int], pointers: Sequence[int],
              lengths: Sequence[int], end: int = 0) -> None:
        """Write the dispatch state and arrays for one dispatch, and worker
        0's range as ``[0, end)`` (one write)."""
        sx, sy, sz = workgroup_size
        cx, cy, cz = workgroup_count
        self.written = None
        if self._view is not None:
            self._check_open()
        self._head.pack_into(
            self._target, 0, sx, sy, sz, self.constant_count, cx, cy, cz,
            max_concurrency, self.binding_count, self.consts, self.ptrs,
            self.lens, *constants, *pointers, *lengths,
            0, end, runtime.NO_INDEX, self.stop, 0, 0)
        if self._view is None:
            self.backend.write(self.block, self._target)
        if self._stopped:
            self.backend.write(self.stop, self._zero)
            self._stopped = False

    def write_again(self, owner: Any, pointers: Sequence[int],
                    lengths: Sequence[int]) -> None:
        """:meth:`write` for one worker of a dispatch described by
        ``owner`` (its ``wsize``, ``wc``, ``consts`` and ``total``, worker
        0's range being ``[0, total)``): when the last write was this
        method's for the same ``owner`` (and the block is packed in place,
        no stop flag raised), only the binding pointers and lengths and
        worker 0's range are written: the dispatch state and constants in
        the block are ``owner``'s already."""
        if self.written is owner and not self._stopped:
            if self.backend.closed:
                self._check_open()
            self._tail.pack_into(self._view,  # type: ignore[arg-type]
                                 self._ptrs_at, *pointers, *lengths,
                                 *self._trailer)
            return
        self.write(owner.wsize, owner.wc, 1, owner.consts, pointers, lengths,
                   owner.total)
        if self._view is not None:
            self.written = owner
            # worker 0's range [0, total) after the binding arrays
            self._trailer = (0, owner.total, _NO_INDEX, self.stop, 0, 0)

    def _check_open(self) -> None:
        """Raise before writing through the view of a closed backend's
        memory (gone with it)."""
        if self.backend.closed:
            raise elfloader.BackendError(
                "the backend of the dispatch layout is closed",
                field="dispatch", value=self.block)

    def write_range(self, worker: int, begin: int, end: int) -> None:
        self.backend.write(self.ranges[worker], self._range_struct.pack(
            begin, end, runtime.NO_INDEX, self.stop, 0, 0))

    def read_range(self, worker: int) -> dict:
        return self._range.unpack(self.backend.read(self.ranges[worker],
                                                    self._range.size))

    def raise_stop(self) -> None:
        self._stopped = True
        self.backend.write(self.stop, pack_array("u32", 4, [1]))

    def run_whole(self, total: int, grid, label: str, path: str) -> None:
        """Run the grid ``[0, total)`` in one crossing on worker 0
        (``total <= whole``; :meth:`write` set worker 0's range, and the
        loop is bound by :meth:`calls`).

        Raises:
            DispatchError: a workgroup returned non-zero.
            LocalMemoryOverrunError: a workgroup wrote past its local memory.
        """
        ret = self.loops[0]()
        if ret:
            check_return(self, ret, total, grid, label, path)
        if self.local_checks:
            self.check_local(label, path)

    def check_local(self, label: str, path: str) -> None:
        """Raise when guest code wrote past the end of a worker's local
        memory since the last check (backends with canaries only).

        Raises:
            LocalMemoryOverrunError: names the worker and the offset."""
        for worker, check in self.local_checks:
            try:
                check()
            except elfloader.GuardError as exc:
                raise LocalMemoryOverrunError(
                    f"export {label} wrote past the end of the local memory "
                    f"of worker {worker}: local memory at offset {exc.offset} "
                    f"of {exc.size} bytes ({exc.offset - exc.size + 1} past "
                    "the end)", name=path, field="local_memory",
                    value=exc.offset, worker=worker, export=label,
                    what="local memory", offset=exc.offset,
                    length=exc.size) from None

    def close(self) -> None:
        self.loops, self.bound, self._bound_calls = [], None, {}
        if self._view is not None:
            self._target = None
            self._view.release()
            self._view = None
        self.backend.release(self.block)
        for local in self.local_memory:
            self.backend.release(local)
        self.local_memory = []


class HelperThreads:
    """Host threads kept for the helper workers of dispatches (worker 0 is
    the calling thread): starting a thread costs 0.1-3 ms on a busy
    machine, more than a chunk of work, so threads stay and wait for the
    next job. A thread is added whenever a job finds none idle."""

    def __init__(self):
        self._reset()
        if hasattr(os, "register_at_fork"):
            # A forked child has none of the parent's threads.
            os.register_at_fork(after_in_child=self._reset)

    def _reset(self) -> None:
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._idle = 0
        self.count = 0

    def submit(self, fn: Callable[[int], None], worker: int,
               done: threading.Semaphore) -> None:
        """Run ``fn(worker)`` on a helper thread, then release ``done``
        (also when ``fn`` raises; ``fn`` reports its own errors)."""
        with self._lock:
            if self._idle:
                self._idle -= 1
            else:
                self.count += 1
                threading.Thread(target=self._serve, args=(self._jobs,),
                                 name=f"hal_cpu worker {self.count}",
                                 daemon=True).start()
        self._jobs.put((fn, worker, done))

    def _serve(self, jobs: queue.SimpleQueue) -> None:
        while True:
            fn, worker, done = jobs.get()
            try:
                fn(worker)
            except BaseException:  # noqa: BLE001 - fn keeps its own errors
                pass
            finally:
                with self._lock:
                    self._idle += 1
                done.release()


#: The helper threads of every dispatch in this process.
HELPERS = HelperThreads()


class _Chunks:
    """Hands out [begin, end) chunks of linear workgroup ids to workers."""

    def __init__(self, total: int, workers: int = 1):
        self.total, self.next, self.done = total, 0, 0
        # Guided: with several workers a chunk is at most a 1/(2 * workers)
        # share of what is left, so the workers finish close together.
        self.share = 2 * workers if workers > 1 else 0
        self.lock = threading.Lock()

    def take(self, size: int) -> tuple[int, int] | None:
        with self.lock:
            begin = self.next
            left = self.total - begin
            if left <= 0:
                return None
            if self.share:
                size = min(size, left // self.share)
            self.next = begin + max(1, min(size, left))
            return begin, self.next

    def finished(self, n: int) -> int:
        with self.lock:
            self.done += n
            return self.done


def _failed_workgroup(layout: DispatchLayout, worker: int, ret: int, span,
                      grid, path: str, stoppable: bool = True
                      ) -> tuple[int, int] | None:
    """What a non-OK return ``ret`` of the loop on ``worker`` means:
    (failed linear id, status) for a failing workgroup, None when the
    worker was stopped (and ``stoppable``).

    Raises:
        DispatchError: the loop refused the range ``span``.
    """
    r = layout.read_range(worker)
    if r["status"]:
        return r["failed_index"], r["status"]
    if ret == runtime.LOOP_STOPPED and stoppable:
        return None
    raise DispatchError(f"workgroup loop refused the range [{span[0]}, "
                        f"{span[1]}): {runtime.return_name(ret)}", name=path,
                        field="workgroup_count", value=grid)


def run_grid(backend: Backend, layout: DispatchLayout, fn: int, environment: int,
             total: int, *, label: str, path: str,
             grid: tuple[int, int, int], deadline: float | None = None,
             progress: Callable[[int, int], None] | None = None) -> None:
    """Run linear workgroup ids ``0 <= i < total`` through the loop, on
    ``layout.workers`` workers.

    Raises:
        DispatchError: a workgroup returned non-zero (the lowest failing id
            among those run is reported, with its (x, y, z)).
        DispatchTimeoutError: ``deadline`` (``time.monotonic()``) passed.
        KeyboardInterrupt: propagated after the workers stopped.
        LocalMemoryOverrunError: a workgroup wrote past the end of its
            local memory (backends with canaries).
        elfloader.EmulationError: the emulated CPU faulted; its ``worker``
            attribute is the worker that faulted. The first failure stops
            the other workers (between workgroups; emulated CPUs at once).
    """
    workers = layout.workers
    loops = layout.calls(fn, environment, layout.first_cpu)
    first = FIRST_CHUNK.get(backend.kind, 1)
    if workers > 1:
        # Small enough that the other workers find work left to share.
        first = max(1, min(first, total // (4 * workers)))
    elif layout.per_workgroup:
        # One worker repeating a dispatch: the last one's pace sizes the
        # first chunk (a grid that takes under CHUNK_SECONDS at that pace
        # runs in one crossing).
        first = max(first, int(CHUNK_SECONDS / layout.per_workgroup))
    if total <= layout.whole:
        layout.run_whole(total, grid, label, path)
        if progress is not None:
            progress(total, total)
        return
    chunks = _Chunks(total, workers)
    failures: list[tuple[int, int]] = []
    errors: list[BaseException] = []
    helpers_done = threading.Semaphore(0)
    helpers: list[int] = []

    def start_helpers(seconds_left: float) -> None:
        # Helpers only pay off when the rest of the grid takes a while.
        if workers > 1 and not helpers and seconds_left > THREAD_SECONDS:
            helpers.append(workers - 1)
            for w in range(1, workers):
                HELPERS.submit(work, w, helpers_done)

    def work(w: int) -> None:
        size = first
        try:
            while not failures and not errors:
                span = chunks.take(size)
                if span is None:
                    return
                begin, end = span
                layout.write_range(w, begin, end)
                t0 = time.perf_counter()
                ret = as_int32(loops[w]())
                elapsed = time.perf_counter() - t0
                if ret != runtime.LOOP_OK:
                    failed = _failed_workgroup(layout, w, ret, span, grid, path)
                    if failed is not None:
                        failures.append(failed)
                        layout.raise_stop()
                    return
                done = chunks.finished(end - begin)
                if progress is not None and w == 0:
                    progress(done, total)
                if deadline is not None and time.monotonic() > deadline:
                    raise DispatchTimeoutError(
                        f"export {label} ran past its time limit after {done} "
                        f"of {total} workgroups", name=path, field="timeout",
                        value=done)
                per = elapsed / (end - begin)
                if w == 0:
                    layout.per_workgroup = per
                    start_helpers(per * (total - done))
                size = max(size, min(size * 4, int(CHUNK_SECONDS / per) if per
                                     else size * 4))
        except BaseException as exc:  # noqa: BLE001 - re-raised below
            if isinstance(exc, elfloader.EmulationError):
                # whose workgroup state the report reads
                exc = exc.on_worker(w)
            errors.append(exc)
            layout.raise_stop()
            if (isinstance(exc, elfloader.EmulationError)
                    and (exc.fault is None or exc.fault.kind != "stopped")
                    and workers > 1):
                # A fault ends the dispatch: the other CPUs need not finish
                # the workgroups they run.
                layout.stop_cpus()

    if layout.per_workgroup is not None:
        # A repeated dispatch: the last one's pace says whether to share.
        start_helpers(layout.per_workgroup * total)
    try:
        work(0)
    finally:
        for _ in range(helpers[0] if helpers else 0):
            while True:
                try:
                    helpers_done.acquire()
                    break
                except KeyboardInterrupt as exc:
                    errors.append(exc)
                    layout.raise_stop()
    if failures:
        index, status = min(failures)
        _raise_failure(index, status, grid, label, path)
    if errors:
        raise errors[0]
    if layout.local_checks:
        layout.check_local(label, path)


def check_return(layout: DispatchLayout, ret: int, total: int, grid,
                 label: str, path: str) -> None:
    """Raise for a non-zero return ``ret`` of worker 0's loop over the whole
    grid ``[0, total)`` (one crossing).

    Raises:
        DispatchError: a workgroup returned non-zero, or the loop refused
            the range.
    """
    ret = as_int32(ret)
    if ret != runtime.LOOP_OK:
        failed = _failed_workgroup(layout, 0, ret, (0, total), grid, path,
                                   stoppable=False)
        assert failed is not None      # (not stoppable: a failure or a raise)
        _raise_failure(*failed, grid, label, path)


def _raise_failure(index: int, status: int, grid, label: str, path: str):
    x = index % grid[0]
    y = index // grid[0] % grid[1]
    z = index // (grid[0] * grid[1])
    raise DispatchError(f"export {label} returned {status} in workgroup "
                        f"({x}, {y}, {z})", name=path, field="workgroup_id",
                        value=(x, y, z))
