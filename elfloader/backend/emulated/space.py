"""An emulated address space: guest memory, its page map, guarded ranges
and calls, on either engine (:mod:`.engine`).

Guest memory is host memory: every reservation is host memory the engine
can run guest code on (unicorn maps anonymous ``mmap`` memory into its
CPUs; qemu-user's agent maps the backend's ``memfd``), so reads, writes
and bindings are plain copies in this process, and several CPUs
(:meth:`EmulatedBackend.fork_cpu`) share one address space, each with its
own registers and stack, running calls concurrently from threads.
Addresses are handed out by a page allocator inside the engine's arena.

Arrays handed to guest code (:meth:`EmulatedBackend.map_array`) and
:meth:`EmulatedBackend.alloc_guarded` memory each end at a guard page, a
page of the reservation the page map leaves out: the range starts 64-byte
aligned, at most 63 bytes before the guard page, and those bytes hold a
canary that is compared when the range is finished (the placement and
canary rule of :mod:`elfloader.backend.guarded`, the error of
:mod:`.guarded`). A
write of even one byte past the end is reported (:class:`GuardError`), and
a read or write reaching the guard page stops the CPU with its exact
address. Each CPU's stack has a guard page below it.

Changes to the memory map (reserve, protect, release) are recorded in a
log that each CPU applies before its next call; with an engine whose
changes are cheap (unicorn), CPUs that are not running (and the CPU whose
Python callback made the change) apply it at once. Host memory of a
released range is freed once no CPU can still reach it.
"""

from __future__ import annotations

import bisect
import ctypes
import os
import threading
import weakref
from typing import Callable

import numpy as np

from ...arch import Arch
from ...errors import BackendError, EngineError
from ..base import PROT_EXEC, PROT_READ, PROT_WRITE, Backend, prot_str
from ..guarded import CANARY, RangePool, canary_below, canary_below_changed, canary_changed, layout
from . import choice
from . import engine as engines
from .engine import STACK_SIZE
from .guarded import guard_error
from .state import SpaceState

_HEAP_CHUNK = 1 << 20       # small allocations come from 1 MiB chunks
_HEAP_LIMIT = 256 << 10     # larger ones get their own mapping
_HEAP_GRAIN = 64
_POOL_LIMIT = 512 << 20     # bytes of released binding ranges kept for reuse
_CALLBACK_SLOTS = 256

_memmove = ctypes.memmove
_memset = ctypes.memset
_string_at = ctypes.string_at


#: Emulated address spaces alive in this process.
_SPACES: "weakref.WeakSet[EmulatedBackend]" = weakref.WeakSet()
#: Per forking thread: the space locks it holds across a fork() and the
#: spaces whose lock it could not take. (Two threads may fork at once:
#: os.fork() in one, subprocess with a preexec_fn, which runs these hooks
#: too, in another, as when a CPU's guest agent starts.)
_FORKING = threading.local()
#: Seconds fork() waits for a space's lock that another thread holds. That
#: thread may itself be forking and waiting for a lock this one holds, so
#: an endless wait could deadlock both.
FORK_LOCK_WAIT = 1.0


def _before_fork() -> None:
    # A space's lock held by another thread at the moment of fork() would
    # stay held in the child forever: hold every one across the fork, so
    # the child starts with them free and each space in a consistent state.
    # A lock not taken in time: that space is closed in the child.
    held: list = []
    skipped: list[EmulatedBackend] = []
    _FORKING.held, _FORKING.skipped = held, skipped
    for space in list(_SPACES):
        if not space.closed:
            lock = space.state.lock
            if lock.acquire(timeout=FORK_LOCK_WAIT):
                held.append(lock)
            else:
                skipped.append(space)


def _release_fork_locks() -> list:
    held = getattr(_FORKING, "held", [])
    skipped = getattr(_FORKING, "skipped", [])
    _FORKING.held, _FORKING.skipped = [], []
    while held:
        held.pop().release()
    return skipped


def _after_fork_in_parent() -> None:
    _release_fork_locks()


def _after_fork_in_child() -> None:
    for space in _release_fork_locks():
        space.abandon_in_child()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_in_parent,
                        after_in_child=_after_fork_in_child)


def _open_engine(arch: Arch, engine: str, cpu: str | None,
                 vlen: int | None) -> engines.Engine:
    """The engine for a new address space; see :func:`.choice.choose`.
    (Each engine module is imported when it is chosen: only then does
    unicorn load.)"""
    profile, vlen = choice.resolve_profile(arch, cpu, vlen)
    program = choice.qemu_program(arch)
    if choice.decide(arch, engine, profile, program) == "qemu":
        from .qemu_engine import QemuEngine
        return QemuEngine(arch, profile, vlen or (None if profile
                                                  else choice.default_vlen(arch)),
                          program)
    if vlen is not None and profile is None:
        raise EngineError("unicorn models no scalable vectors: --vlen needs "
                          "the qemu engine", field="vlen", value=vlen)
    from .unicorn_engine import UnicornEngine
    return UnicornEngine(arch, profile, None)


class EmulatedBackend(Backend):
    """Runs code of ``arch`` on emulated CPUs: qemu-user (through a guest
    agent) or unicorn.

    Args:
        arch: the guest architecture.
        timeout: optional limit for one call, in seconds (0: none). A call
            that runs past it raises :class:`EmulationError`.
        engine: ``"auto"`` (qemu-user where ``qemu-<arch>`` is installed,
            else unicorn), ``"qemu"`` or ``"unicorn"``.
        cpu: a CPU profile name of ``arch`` (:func:`fatelf.arches.profile`,
            e.g. ``"rv64gcv"``, ``"x86-64-v3"``, ``"sve"``); None for the
            most capable CPU the engine models.
        vlen: vector length in bits for profiles with scalable vectors
            (RVV VLEN, SVE VL); None for the profile's default.

    Raises:
        EngineError: the engine cannot run the profile, or qemu-user is
            missing when asked for.

    Attributes:
        cpu: the backend's own CPU (the one :meth:`call` uses); more come
            from :meth:`fork_cpu` / :meth:`cpus`.
        engine: the engine's name, ``"qemu"`` or ``"unicorn"``.
        profile: the :class:`fatelf.arches.Profile` the CPUs model (None:
            the engine's most capable model).
        timeout_us: the call limit in microseconds (0: none), read at the
            start of every call on every CPU.
        state: what the CPUs share with the space: page map, reservations,
            memory-map log, callbacks, CPUs, lock
            (:class:`~.state.SpaceState`).
    """

    kind = "emulated"

    def __init__(self, arch: Arch, timeout: float = 0.0, engine: str = "auto",
                 cpu: str | None = None, vlen: int | None = None):
        self.arch = arch
        self.timeout_us = int(timeout * 1e6)
        self._engine = _open_engine(arch, engine, cpu, vlen)
        self.engine = self._engine.name
        self.profile = self._engine.profile
        self.vlen = self._engine.vlen
        self.state: SpaceState[engines.Cpu] = SpaceState(self._engine.eager_sync)
        # The state's lock, page map, reservations and log, under the names
        # the space's own code uses.
        self._lock = self.state.lock
        self._pages = self.state.pages
        self._regions = self.state.regions
        self._record = self.state.record
        self._closed = False
        # (starts, regions) sorted by address, replaced as a whole on every
        # change: read/write look addresses up without the lock.
        self._index: tuple[list[int], list[engines.Region]] = ([], [])
        self._free: list[tuple[int, int]] = [self._engine.arena]
        self._heap_free: list[tuple[int, int]] = []   # (address, size)
        self._heap_live: dict[int, int] = {}          # address -> size
        self._heap_chunks: set[int] = set()
        # released guarded reservations kept for reuse
        self._pool = RangePool(_POOL_LIMIT)
        # guard page (after or below) -> start of the live guarded range
        self._guards: dict[int, int] = {}
        # guarded reservation -> offset of its range's first mapped page
        self._lead: dict[int, int] = {}
        # alloc_guarded address -> (reservation, its size, guard page)
        self._guarded: dict[int, tuple[int, int, int]] = {}
        try:
            self.cpu = self._engine.new_cpu(self)
        except BaseException:
            self._engine.close()
            raise
        self.state.cpus.append(self.cpu)
        _SPACES.add(self)
        # Guest code assumes at least 4 KiB pages (aarch64 ADRP, for one).
        self.page_size = max(4096, self.cpu.page_size)
        try:
            stack = self._reserve_stack()
            self.state.slots = self._engine.setup(self, _CALLBACK_SLOTS)
            self.cpu.start(stack)
        except BaseException:
            self.close()
            raise

    def describe(self) -> str:
        """The engine and the CPU model, e.g. ``qemu (qemu-riscv64 -cpu
        rv64,v=true,vlen=256,...)`` or ``unicorn (most capable model)``."""
        return self._engine.describe()

    @property
    def uc(self):
        """The unicorn engine of the backend's own CPU (None once closed, or
        on the qemu engine)."""
        return getattr(self.cpu, "uc", None)

    # --- CPUs -------------------------------------------------------------
    def fork_cpu(self) -> engines.Cpu:
        """A new CPU sharing this backend's memory, callbacks and time
        limit, with its own registers, stack and translated code. It can
        run :meth:`engine.Cpu.call` on another thread while other CPUs
        run theirs. Close it with :meth:`engine.Cpu.close` (the backend's
        :meth:`close` closes all of them)."""
        self._check_open("fork_cpu", 0)
        cpu = self._engine.new_cpu(self)
        with self._lock:
            self.state.cpus.append(cpu)
            try:
                cpu.map_all()
                stack = self._reserve_stack()
                cpu.start(stack)
            except BaseException:
                self.state.cpus.remove(cpu)
                cpu.close_engine()
                raise
        return cpu

    def _reserve_stack(self) -> int:
        """A stack of :data:`STACK_SIZE` bytes with a guard page below it
        (stacks grow down: an overflow stops the CPU instead of writing
        into the reservation before it). Returns the stack's lowest
        address; its reservation starts one page below."""
        page = self.page_size
        with self._lock:
            base = self._reserve(STACK_SIZE + page, 0,
                                 (page, STACK_SIZE + page))
            self._guards[base] = base + page
        return base + page

    def release_stack(self, stack: int) -> None:
        """Free a stack from :meth:`_reserve_stack` (a closed CPU's)."""
        with self._lock:
            self._guards.pop(stack - self.page_size, None)
            self.release(stack - self.page_size)

    def stacks(self) -> list[tuple[int, int]]:
        """``(lowest address, size in bytes)`` of each CPU's stack, in the
        order of :meth:`cpus` (worker 0's first); a guard page lies below
        each (:meth:`guard_page`)."""
        with self._lock:
            return [(c.stack, STACK_SIZE) for c in self.state.cpus
                    if c.stack is not None]

    def cpus(self, n: int) -> list[engines.Cpu]:
        """``n`` CPUs for ``n`` workers: the backend's own first, then
        forked ones, made on first use and kept (closed with the backend),
        so repeated dispatches reuse their translated code."""
        self._check_open("cpus", n)
        with self._lock:
            while len(self.state.cpus) < n:
                self.fork_cpu()
            return self.state.cpus[:n]

    # --- memory -----------------------------------------------------------
    def _take(self, size: int, align: int) -> int:
        for i, (start, end) in enumerate(self._free):
            first = (start + align - 1) & ~(align - 1)
            if end - first >= size:
                del self._free[i]
                if first + size < end:
                    self._free.insert(i, (first + size, end))
                if start < first:
                    self._free.insert(i, (start, first))
                return first
        raise BackendError(f"emulated address space exhausted ({size:#x} bytes "
                           f"wanted)", field="reserve", value=size)

    def _give_back(self, start: int, size: int) -> None:
        self._free.append((start, start + size))
        self._free.sort()
        merged: list[tuple[int, int]] = []
        for s, e in self._free:
            if merged and merged[-1][1] == s:
                merged[-1] = (merged[-1][0], e)
            else:
                merged.append((s, e))
        self._free = merged

    def _check_open(self, what: str, address) -> None:
        if self._closed:
            raise BackendError("the emulated backend is closed", field=what,
                               value=address)
        if getattr(self._engine, "forked", False):
            raise BackendError("this emulated address space belongs to the "
                               "parent process (qemu engine): after fork(), "
                               "load the file again in the child", field=what,
                               value=address)

    def reserve(self, size: int, align: int = 0) -> int:
        self._check_open("reserve", size)
        size = max(self.page_size, -(-size // self.page_size) * self.page_size)
        with self._lock:
            return self._reserve(size, align, (0, size))

    def _reserve(self, size: int, align: int, usable: tuple[int, int]) -> int:
        """Map ``size`` bytes (whole pages) of which those at offsets
        ``usable`` (``[lo, hi)``) are read/write; the rest stay out of the
        page map, so the TLB fill refuses them (guard pages). Called with
        the lock held."""
        addr = self._take(size, max(align, self.page_size))
        try:
            region = self._engine.region(addr, size)
        except (OSError, ValueError, OverflowError) as exc:
            self._give_back(addr, size)
            raise BackendError(f"cannot map {size:#x} bytes: {exc}",
                               field="reserve", value=size) from None
        self._regions[addr] = region
        self._reindex()
        self._pages.set(addr + usable[0], addr + usable[1],
                        PROT_READ | PROT_WRITE)
        self._record("map", addr, size, region.host)
        return addr

    def _unmap(self, region: engines.Region) -> None:
        """Take ``region`` out of the address space; its host memory is
        freed once every CPU has unmapped it (at once when the engine's
        CPUs share it with the host, :attr:`engine.Engine.defer_free`).
        Called with the lock held."""
        addr, size = region.address, region.size
        self._lead.pop(addr, None)
        del self._regions[addr]
        self._reindex()
        self._pages.set(addr, addr + size, None)
        if self._engine.defer_free:
            self.state.dead.append((self.state.gen + 1, region))
        else:
            region.free()
        self._record("unmap", addr, size)
        self._give_back(addr, size)

    def _heap_take(self, size: int) -> int:
        """A small block from the allocation chunks (not zeroed)."""
        size = max(_HEAP_GRAIN, -(-size // _HEAP_GRAIN) * _HEAP_GRAIN)
        for i, (addr, free) in enumerate(self._heap_free):
            if free >= size:
                if free == size:
                    del self._heap_free[i]
                else:
                    self._heap_free[i] = (addr + size, free - size)
                break
        else:
            addr = self.reserve(_HEAP_CHUNK)
            self._heap_chunks.add(addr)
            self._heap_free.append((addr + size, _HEAP_CHUNK - size))
        self._heap_live[addr] = size
        return addr

    def alloc(self, size: int, align: int = 16) -> int:
        # Small blocks come from long-lived chunks: mapping and unmapping
        # guest memory is slow and makes unicorn drop its translated code.
        self._check_open("alloc", size)
        if size > _HEAP_LIMIT or align > _HEAP_GRAIN:
            return self.reserve(max(size, 1), align)
        with self._lock:
            addr = self._heap_take(size)
            _memset(self._host(addr, self._heap_live[addr]), 0,
                    self._heap_live[addr])
        return addr

    def _heap_release(self, address: int) -> None:
        size = self._heap_live.pop(address)
        blocks = sorted(self._heap_free + [(address, size)])
        merged = [blocks[0]]
        for a, s in blocks[1:]:
            last_a, last_s = merged[-1]
            if last_a + last_s == a:
                merged[-1] = (last_a, last_s + s)
            else:
                merged.append((a, s))
        self._heap_free = merged

    def release(self, address: int) -> None:
        """Free memory (a no-op once the backend is closed: everything is
        free then)."""
        with self._lock:
            if self._closed:
                return
            if address in self._heap_live:
                self._heap_release(address)
                return
            guarded = self._guarded.pop(address, None)
            if guarded is not None:
                self._close_guarded(*guarded)
                return
            region = self._regions.get(address)
            if region is None or address in self._heap_chunks:
                return
            self._pool.discard(address, region.size)   # (if kept for reuse)
            self._unmap(region)

    def _reindex(self) -> None:
        regions = sorted(self._regions.values(), key=lambda r: r.address)
        self._index = ([r.address for r in regions], regions)

    def _host(self, address: int, size: int) -> int:
        """Host address of guest ``[address, address + size)``, which must
        lie in one reservation; else raise :class:`BackendError`."""
        starts, regions = self._index
        i = bisect.bisect_right(starts, address) - 1
        if i >= 0:
            region = regions[i]
            offset = address - region.address
            if offset + size <= region.size:
                return region.host + offset
        raise BackendError(f"{size} bytes at {address:#x} are not mapped",
                           field="address", value=address)

    def _pieces(self, address: int, size: int, what: str):
        """``(host address, length)`` pieces covering guest ``[address,
        address + size)`` across adjacent reservations."""
        pieces = []
        at, end = address, address + size
        starts, regions = self._index
        while at < end:
            i = bisect.bisect_right(starts, at) - 1
            region = regions[i] if i >= 0 else None
            if region is None or at >= region.address + region.size:
                raise BackendError(f"cannot {what} {size} bytes at {address:#x}: "
                                   f"{at:#x} is not mapped", field=what,
                                   value=address)
            n = min(end, region.address + region.size) - at
            pieces.append((region.host + at - region.address, n))
            at += n
        return pieces

    def read(self, address: int, size: int) -> bytes:
        self._check_open("read", address)
        if size <= 0:
            return b""
        try:
            return _string_at(self._host(address, size), size)
        except BackendError:
            return b"".join(_string_at(h, n)
                            for h, n in self._pieces(address, size, "read"))

    def write(self, address: int, data) -> None:
        self._check_open("write", address)
        src: bytes | int
        if isinstance(data, bytes):
            src, size = data, len(data)
        else:   # any buffer, without a copy
            view = np.frombuffer(data, np.uint8)
            src, size = view.ctypes.data, view.size
        if not size:
            return
        try:
            _memmove(self._host(address, size), src, size)
        except BackendError:
            done = 0
            # (ctypes passes bytes as a pointer to their buffer; typeshed's
            # cast takes no bytes)
            at = ctypes.cast(src, ctypes.c_void_p).value  # type: ignore[arg-type]
            assert at is not None   # the buffer of size > 0 bytes
            for h, n in self._pieces(address, size, "write"):
                _memmove(h, at + done, n)
                done += n
        if self._pages.any_exec(address, address + size):
            # Code written over code: drop what the CPUs translated from it.
            with self._lock:
                self._record("invalidate", address, size)

    def view(self, address: int, size: int) -> memoryview:
        """A writable ``memoryview`` of guest ``[address, address + size)``
        (one reservation, from :meth:`alloc` or :meth:`alloc_guarded`): the
        host bytes the guest reads and writes. Valid until the memory is
        released or the backend closed; for data only (writes through it
        do not drop code the CPUs translated).

        Raises:
            BackendError: the range is not mapped in one reservation, or
                the backend is closed."""
        self._check_open("view", address)
        host = self._host(address, size)
        return memoryview((ctypes.c_char * size).from_address(host)).cast("B")

    def protect(self, address: int, size: int, prot: int) -> None:
        if prot & PROT_WRITE and prot & PROT_EXEC:
            raise BackendError("refusing a writable and executable mapping",
                               field="protect", value=prot_str(prot))
        self._check_open("protect", address)
        if address % self.page_size or size % self.page_size or size <= 0:
            raise BackendError(f"cannot protect {size:#x} bytes at "
                               f"{address:#x}: not whole pages",
                               field="protect", value=address)
        with self._lock:
            if not self._pages.covers(address, address + size):
                raise BackendError(f"cannot protect {size:#x} bytes at "
                                   f"{address:#x}: not mapped",
                                   field="protect", value=address)
            self._pages.set(address, address + size, prot)
            self._record("protect", address, size, prot)

    # --- arrays -----------------------------------------------------------
    def _open_guarded(self, size: int):
        """Take a guarded range of ``size`` bytes placed by
        :func:`..guarded.layout` (64-byte aligned, pooled size classes): a
        reservation of a guard page, pages for the range, then a guard
        page, the range ending at most 63 bytes before the upper guard,
        those bytes holding the canary. The pages below the range's first
        page are left out of the page map, so an access below it faults
        too; the bytes of that page before the range hold
        :func:`..guarded.canary_below`. The reservation comes from the pool
        of released ones of the same size when there is one. Returns
        ``(address, host address, reservation, its size, guard page,
        canary length, canary length below, fresh)``
        (``fresh``: newly mapped, so the range reads as zeros); give it
        back with :meth:`_close_guarded`."""
        page = self.page_size
        start, guard_at, total = layout(size, page, pooled=True)
        first = start - start % page                 # range's first page
        with self._lock:
            base = self._pool.take(total)
            if base is not None:
                fresh = False
                if self._lead.get(base) != first:
                    # Another span of the class: move the lower boundary.
                    self._pages.set(base, base + first, None)
                    self._pages.set(base + first, base + guard_at,
                                    PROT_READ | PROT_WRITE)
                    # (each change with its protection: 0 below the range)
                    if first:
                        self._record("protect", base, first, 0)
                    self._record("protect", base + first, guard_at - first,
                                 PROT_READ | PROT_WRITE)
            else:
                base = self._reserve(total, 0, (first, guard_at))
                fresh = True
            self._lead[base] = first
            addr, guard = base + start, base + guard_at
            self._guards[base + first - page] = addr
            self._guards[guard] = addr
            host = self._regions[base].host + start
        tail = guard_at - start - size
        if tail:
            _memmove(host + size, CANARY, tail)
        below = start - first
        if below:
            _memmove(host - below, canary_below(below), below)
        return addr, host, base, total, guard, tail, below, fresh

    def _close_guarded(self, base: int, total: int, guard: int) -> None:
        """Give back a range from :meth:`_open_guarded` (for reuse by a
        range of the same size class). Called with the lock held."""
        self._guards.pop(guard, None)
        self._guards.pop(base + self._lead.get(base, self.page_size)
                         - self.page_size, None)
        if not self._pool.give(base, total):    # (past _POOL_LIMIT)
            self._unmap(self._regions[base])

    def guard_page(self, address: int) -> tuple[int, int] | None:
        """``(guard page, start of the range it guards)`` when ``address``
        lies in the guard page after or below a live range from
        :meth:`map_array` or :meth:`alloc_guarded` (below: an address
        before the start), or in the one below a CPU's stack
        (:meth:`stacks`), else None."""
        page = address - address % self.page_size
        start = self._guards.get(page)
        return None if start is None else (page, start)

    def map_array(self, array: np.ndarray):
        """Copy a C-contiguous array into guest memory: 64-byte aligned,
        ending at most 63 bytes before a guard page, the bytes between
        holding a canary. ``finish()`` copies the array back unless it is
        read-only, compares the canary and returns the range for reuse by
        later bindings of the same size class.

        ``finish()`` raises :class:`GuardError` (after copying back) when
        the guest changed a canary byte: it wrote past the array's end, or
        before its start (then the error's offsets are negative)."""
        if not array.flags.c_contiguous:
            raise BackendError("arrays must be C-contiguous", field="binding",
                               value=array.shape)
        self._check_open("binding", array.shape)
        nbytes = array.nbytes
        addr, host, base, total, guard, tail, below, _ = self._open_guarded(
            nbytes)
        region = self._regions[base]
        data = array.ctypes.data if nbytes else 0
        if nbytes:
            _memmove(host, data, nbytes)
        done = False

        def finish():
            nonlocal done
            if done:
                return
            done = True
            with self._lock:
                # Nothing to copy from once the range is gone (backend
                # closed, or the address released by hand).
                if self._closed or self._regions.get(base) is not region:
                    return
                changed = (canary_changed(host, nbytes, tail)
                           or canary_below_changed(host, below))
                if nbytes and array.flags.writeable:
                    _memmove(data, host, nbytes)
                if changed:
                    err = guard_error(host, addr, nbytes, tail, "binding",
                                      below)
                self._close_guarded(base, total, guard)
            if changed:
                raise err

        return addr, finish

    def alloc_guarded(self, size: int):
        """``size`` zeroed read/write bytes, 64-byte aligned, ending at most
        63 bytes before a guard page (the TLB fill refuses it: a read or
        write reaching it stops the CPU with its exact address), the bytes
        between holding a canary.

        Returns ``(address, check)``: ``check()`` raises
        :class:`GuardError` when a canary byte changed since the allocation
        or the last check (and writes the canary again); ``check`` is None
        when ``size`` is a multiple of 64 (the guard page follows at once).
        Free with :meth:`release`."""
        self._check_open("alloc_guarded", size)
        size = max(size, 0)
        addr, host, base, total, guard, tail, _, fresh = self._open_guarded(
            size)
        with self._lock:
            self._guarded[addr] = (base, total, guard)
        if not fresh:   # (new pages are zeros: large local memory costs
            _memset(host, 0, size)   # nothing until the kernel touches it)
        if not tail:
            return addr, None

        def check():
            with self._lock:
                if self._guarded.get(addr, (None,))[0] != base:
                    return
                if not canary_changed(host, size, tail):
                    return
                err = guard_error(host, addr, size, tail, "range")
                _memmove(host + size, CANARY, tail)
            raise err

        return addr, check

    # --- calls ------------------------------------------------------------
    def call(self, address: int, *args: int) -> int:
        if self._closed:
            raise BackendError("the emulated backend is closed", field="call",
                               value=address)
        return self.cpu.call(address, *args)

    def function(self, address: int, nargs: int) -> Callable[..., int]:
        call = self.cpu.call
        return lambda *args: call(address, *args)

    def worker_functions(self, address: int, nargs: int,
                         workers: int) -> list[Callable[..., int]]:
        """One callable per worker, each on its own CPU (:meth:`cpus`), so
        the workers' calls run at the same time."""
        return [(lambda call: lambda *args: call(address, *args))(cpu.call)
                for cpu in self.cpus(max(1, workers))]

    def stop_workers(self, workers: int) -> None:
        """Stop the calls running on the first ``workers`` CPUs
        (:meth:`engine.Cpu.stop`)."""
        with self._lock:
            cpus = self.state.cpus[:workers]
        for cpu in cpus:
            cpu.stop()

    def callback(self, function: Callable[..., int], nargs: int) -> int:
        self._check_open("callback", 0)
        callbacks, slots = self.state.callbacks, self.state.slots
        with self._lock:
            if len(callbacks) >= len(slots):
                raise BackendError("too many callbacks", field="callback",
                                   value=len(callbacks))
            addr = slots[len(callbacks)]
            callbacks[addr] = (function, nargs)
        return addr

    # --- lifetime -----------------------------------------------------------
    def abandon_in_child(self) -> None:
        """In a forked child, for a space whose lock another thread of the
        parent held through the fork (its state may be half changed): new
        locks, and the space closed, so any use raises
        :class:`BackendError` and nothing waits on a lock no thread here
        will release. Its memory is left to the child's exit."""
        self.state.lock = self._lock = threading.RLock()
        self._closed = self.state.closed = True

    def close(self) -> None:
        """Free every CPU (unicorn engine and translation buffer) and all
        guest memory now, not when the garbage collector finds them. Any
        later use raises :class:`BackendError` (:meth:`release` does
        nothing)."""
        with self._lock:
            if self._closed:
                return
            state = self.state
            running = [c for c in state.cpus if c.thread is not None
                       and c.thread != threading.get_ident()]
            if running:
                raise BackendError("cannot close the backend while a CPU runs "
                                   "a call", field="close", value=len(running))
            self._closed = state.closed = True
            for cpu in state.cpus:
                cpu.close_engine()
            state.cpus.clear()
            for region in self._regions.values():
                region.free()
            for _, region in state.dead:
                region.free()
            self._regions.clear()
            self._index = ([], [])
            state.dead.clear()
            state.log.clear()
            self._pages.clear()
            self._heap_live.clear()
            self._heap_free.clear()
            self._heap_chunks.clear()
            self._pool.clear()
            self._guards.clear()
            self._lead.clear()
            self._guarded.clear()
            state.callbacks.clear()
            self._engine.close()

    @property
    def mapped_bytes(self) -> int:
        """Bytes currently held: mappings plus live small allocations, not
        counting the free space of allocation chunks nor binding ranges kept
        for reuse (for leak checks)."""
        with self._lock:
            chunks = len(self._heap_chunks) * _HEAP_CHUNK
            return (sum(r.size for r in self._regions.values()) - chunks
                    - self._pool.kept + sum(self._heap_live.values()))
