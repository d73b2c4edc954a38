"""64-byte-aligned numpy arrays: bindings a native dispatch uses in place.

Every binding a kernel sees is 64-byte aligned, as IREE's heap buffers are
(``IREE_HAL_HEAP_BUFFER_ALIGNMENT``): compiled kernels may use aligned
vector loads and stores. numpy's own arrays are only 16-byte aligned (large
ones sit 16 bytes past a 64-byte boundary, where glibc's ``malloc`` puts
them), so :meth:`hal_cpu.Executable.dispatch` copies such an array into
aligned memory and back on every dispatch. The functions here make arrays
whose data starts on a 64-byte boundary; natively a dispatch then hands the
kernel the array's own memory.
"""

from __future__ import annotations

import ctypes
import mmap
import sys
import threading
import weakref
from typing import Callable

import numpy as np

from elfloader.backend.guarded import ALIGN, CANARY_PREFIX, RangePool, layout

_PAGE = mmap.PAGESIZE
_memmove = ctypes.memmove

#: Alignment of every binding a kernel sees, in bytes: the backends' guarded
#: range alignment (IREE's buffer alignment).
BINDING_ALIGNMENT = ALIGN
#: A binding larger than this (bytes) that a dispatch must copy because it
#: is misaligned raises :class:`AlignmentCopyWarning` (once per export).
COPY_WARN_BYTES = 1 << 20


class PerformanceWarning(UserWarning):
    """Something runs correctly but slower than it needs to."""


class AlignmentCopyWarning(PerformanceWarning):
    """A large binding is copied on every dispatch because its data is not
    64-byte aligned (make it with :func:`empty`, :func:`zeros`,
    :func:`full` or :func:`asarray`)."""


def empty(shape, dtype=np.float32) -> np.ndarray:
    """An uninitialized C-contiguous array whose data starts on a 64-byte
    boundary (unless it has no elements: then there is no data).

    Args:
        shape: int or tuple of ints (elements per dimension).
        dtype: any numpy dtype (default float32).

    Returns:
        A writable ``numpy.ndarray`` of ``shape`` and ``dtype``; its memory
        is a numpy byte buffer it keeps alive (``.base``).

    Raises:
        ValueError, TypeError: as :func:`numpy.empty` for a bad shape or
            dtype; MemoryError when it does not fit.
    """
    dtype = np.dtype(dtype)
    shape = (shape,) if isinstance(shape, (int, np.integer)) else tuple(shape)
    count = 1
    for d in shape:
        d = int(d)
        if d < 0:
            raise ValueError(f"negative dimension {d} in shape {shape}")
        count *= d
    nbytes = count * dtype.itemsize
    raw = np.empty(nbytes + BINDING_ALIGNMENT, np.uint8)
    skip = -raw.ctypes.data % BINDING_ALIGNMENT
    return raw[skip:skip + nbytes].view(dtype).reshape(shape)


def zeros(shape, dtype=np.float32) -> np.ndarray:
    """Like :func:`empty`, filled with zeros."""
    out = empty(shape, dtype)
    out[...] = 0
    return out


def full(shape, fill_value, dtype=None) -> np.ndarray:
    """Like :func:`empty`, filled with ``fill_value``; ``dtype`` defaults
    to the one numpy infers for ``fill_value`` (as :func:`numpy.full`)."""
    if dtype is None:
        dtype = np.asarray(fill_value).dtype
    out = empty(shape, dtype)
    out[...] = fill_value
    return out


def asarray(data, dtype=None) -> np.ndarray:
    """``data`` as a C-contiguous 64-byte-aligned array: ``data`` itself
    when it already is one (with that dtype), else an aligned copy.

    Args:
        data: an array, nested sequence or anything :func:`numpy.asarray`
            accepts.
        dtype: wanted dtype (default: the data's own).

    Returns:
        A C-contiguous ``numpy.ndarray`` whose data starts on a 64-byte
        boundary; writable unless ``data`` is returned as it is.
    """
    array = np.asarray(data, dtype=dtype)
    if (array.flags.c_contiguous
            and array.__array_interface__["data"][0] % BINDING_ALIGNMENT == 0):
        return array
    out = empty(array.shape, array.dtype)
    out[...] = array
    return out


def is_aligned(array: np.ndarray) -> bool:
    """Whether ``array``'s data starts on a 64-byte boundary."""
    return array.__array_interface__["data"][0] % BINDING_ALIGNMENT == 0


class _Reservation:
    """The owner of one guarded reservation: the arrays over its range
    keep it alive (as their ``base``); when it goes, the reservation
    returns to the pool."""

    __slots__ = ("__array_interface__", "__weakref__")
    __array_interface__: dict


#: Bytes of released guarded reservations kept for reuse (per process).
GUARDED_POOL_BYTES = 64 << 20
_guard_lock = threading.Lock()
_guard_pool = RangePool(GUARDED_POOL_BYTES)
#: weak reference to a live reservation's owner -> (base, total, on_free)
_guard_live: dict = {}


def _guard_give_back(ref) -> None:
    base, total, on_free = _guard_live.pop(ref)
    with _guard_lock:
        kept = _guard_pool.give(base, total)
    if not kept:
        from elfloader.backend.native import unmap
        unmap(base, total)
    if on_free is not None:
        on_free()


def guarded_bytes(size: int, on_free: Callable[[], None] | None = None
                  ) -> np.ndarray:
    """``size`` uninitialized bytes of host memory (a writable uint8
    array) that a native kernel may bind in place and cannot read or
    write far past: 64-byte aligned (:data:`BINDING_ALIGNMENT`), placed
    as every binding (:func:`elfloader.backend.guarded.layout`: fewer
    than 64 bytes of canary, then an inaccessible guard page; a guard
    page also lies below the first page), so that a kernel running off
    the end of the buffer faults (SIGSEGV) instead of reading or writing
    other memory of the process.

    Reservations are pooled by size class (:class:`RangePool`, up to
    :data:`GUARDED_POOL_BYTES` kept): a new one costs an ``mmap`` and two
    ``mprotect`` calls, a reused one none.

    Args:
        size: bytes (0 or more).
        on_free: called once when the memory is given back (the last
            array over it is gone), e.g. to uncount it from a budget.

    Returns:
        A uint8 ``numpy.ndarray`` of ``size`` elements; every view of it
        keeps the reservation alive.

    Raises:
        elfloader.BackendError: the host has no memory for it (``mmap``
            failed).
    """
    page = _PAGE
    start, guard, total = layout(size, page, BINDING_ALIGNMENT, 0, True)
    with _guard_lock:
        base = _guard_pool.take(total)
    if base is None:
        from elfloader.backend.native import map_guarded
        base = map_guarded(total, (0, guard))
    address = base + start
    tail = guard - start - size
    if tail:
        _memmove(address + size, CANARY_PREFIX[tail], tail)
    owner = _Reservation()
    owner.__array_interface__ = {"shape": (size,), "typestr": "|u1",
                                 "data": (address, False), "version": 3}
    _guard_live[weakref.ref(owner, _guard_give_back)] = (base, total, on_free)
    return np.asarray(owner)


class GuardedStore:
    """Guarded storage for one owner (a program's ``hal`` module), made for
    allocations repeated call after call: the storage of
    :func:`guarded_bytes` (64-byte aligned, ending fewer than 64 bytes
    before an inaccessible guard page), but each reservation is kept by
    the store for the owner's life and handed out again, without a system
    call, once no array over it is left (the store sees that from the
    reference count of the reservation's own array, with no callback when
    a buffer is dropped).

    Every reservation the store maps is counted in ``memory`` (a
    :class:`hal_cpu.programs.vm.refs.MemoryBudget`-like object with ``charge(n,
    what)``, ``uncharge(n)`` and a ``reclaimers`` list) until it is
    unmapped; when a charge fails, the store unmaps the reservations no
    array uses (``reclaimers``) and the charge is tried again.

    Attributes:
        entries: reservation size -> ``[array, base, total, pages]`` per
            reservation (``array``: a uint8 array over the pages between
            its guard pages).
    """

    __slots__ = ("memory", "entries", "_lock", "_layouts", "_closed")

    def __init__(self, memory):
        self.memory = memory
        self.entries: dict[int, list[list]] = {}
        self._lock = threading.Lock()
        self._layouts: dict[int, tuple[int, int, int, int, bytes | None]] = {}
        self._closed = False
        memory.reclaimers.append(self.reclaim)

    def take(self, size: int, what: str,
             data: bytes | None = None) -> tuple[np.ndarray, int]:
        """``size`` uninitialized bytes (a writable uint8 array) and their
        address; with ``data`` (exactly ``size`` bytes), those bytes
        written into them (through the store's own view of the
        reservation: fewer steps than a write through the array).

        Raises:
            whatever ``memory.charge`` raises past the limit (after
            reclaiming); elfloader.BackendError: ``mmap`` failed.
        """
        lay = self._layouts.get(size)
        if lay is None:
            if len(self._layouts) > 4096:
                self._layouts.clear()
            start, guard, total = layout(size, _PAGE, BINDING_ALIGNMENT, 0, True)
            off = start - _PAGE
            tail = guard - start - size
            # (per size: where the bytes start and end in the reservation's
            # array, the canary that follows them up to the guard page)
            lay = self._layouts[size] = (off, off + size, total, guard - _PAGE,
                                         CANARY_PREFIX[tail] if tail else None)
        off, end, total, pages, canary = lay
        getrefcount = sys.getrefcount
        lock = self._lock
        lock.acquire()      # (not a with statement: fewer steps per call)
        try:
            entries = self.entries.get(total)
            if entries:
                for entry in entries:
                    # (referenced by the entry and the call's argument only:
                    # no array over it is left)
                    if getrefcount(entry[0]) == 2:
                        if canary is not None:
                            entry[4][end:end + len(canary)] = canary
                        if data is not None:
                            entry[4][off:end] = data
                        return entry[0][off:end], entry[1] + _PAGE + off
        finally:
            lock.release()
        self.memory.charge(pages, what)
        try:
            from elfloader.backend.native import map_guarded
            base = map_guarded(total, (0, pages + _PAGE))
        except BaseException:
            self.memory.uncharge(pages)
            raise
        owner = _Reservation()
        owner.__array_interface__ = {"shape": (pages,), "typestr": "|u1",
                                     "data": (base + _PAGE, False), "version": 3}
        # [array over the pages, base, total, pages, a writable memoryview
        # over the same pages (its own array: not a reference to the first,
        # whose count says whether an array over the reservation is left)]
        entry = [np.asarray(owner), base, total, pages,
                 np.asarray(owner).data]
        with self._lock:
            self.entries.setdefault(total, []).append(entry)
            if canary is not None:
                entry[4][end:end + len(canary)] = canary
            if data is not None:
                entry[4][off:end] = data
            return entry[0][off:end], base + _PAGE + off

    def reclaim(self) -> None:
        """Unmap the reservations no array uses (and uncount them)."""
        from elfloader.backend.native import unmap
        getrefcount = sys.getrefcount
        with self._lock:
            for total, entries in list(self.entries.items()):
                keep = []
                for entry in entries:
                    if getrefcount(entry[0]) == 2:
                        unmap(entry[1], total)
                        self.memory.uncharge(entry[3])
                    else:
                        keep.append(entry)
                self.entries[total] = keep

    def close(self) -> None:
        """Unmap the reservations no array uses; each other one is unmapped
        when the last array over it goes."""
        if self._closed:
            return
        self._closed = True
        self.reclaim()
        from elfloader.backend.native import unmap
        with self._lock:
            for total, entries in self.entries.items():
                for entry in entries:
                    weakref.finalize(entry[0], unmap, entry[1], total)
            self.entries = {}
        try:
            self.memory.reclaimers.remove(self.reclaim)
        except ValueError:
            pass


def guarded_pages(size: int) -> int:
    """Bytes of memory (between its guard pages) a :func:`guarded_bytes`
    array of ``size`` bytes takes: what a memory budget counts for it."""
    start, guard, total = layout(size, _PAGE, BINDING_ALIGNMENT, 0, True)
    return guard - _PAGE


def default_memory_limit() -> int:
    """Half of this machine's physical memory, in bytes: the default bound
    on the buffers one program run may hold (``--memory_limit``)."""
    import os
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // 2
    except (ValueError, OSError, AttributeError):
        return 4 << 30


def fill_pattern(target: np.ndarray, pattern: bytes) -> None:
    """Fill the contiguous uint8 array ``target`` in place with ``pattern``
    repeated (any length; 1, 2, 4 and 8 bytes without a temporary of the
    target's size)."""
    n, size = len(pattern), target.size
    if n == 0 or size == 0:
        return
    if n == 1:
        target.fill(pattern[0])
        return
    whole = size - size % n
    dt = {2: np.uint16, 4: np.uint32, 8: np.uint64}.get(n)
    if dt is not None:
        target[:whole].view(dt).fill(np.frombuffer(pattern, dt)[0])
    else:
        step = max(n, (1 << 20) // n * n)
        block = np.frombuffer(pattern * (step // n), np.uint8)
        for at in range(0, whole, step):
            chunk = target[at:min(at + step, whole)]
            chunk[:] = block[:chunk.size]
    target[whole:] = np.frombuffer(pattern, np.uint8)[:size - whole]
