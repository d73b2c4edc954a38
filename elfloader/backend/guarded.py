"""Guarded ranges: memory guest code may overrun, placed so that an
overrun is caught, on every backend.

One layout, one placement rule and one canary rule serve every guarded
range: the bindings of a dispatch and workgroup-local memory
(``map_array`` and ``alloc_guarded`` of the emulated backend, and the
ranges a recorded dispatch of a ``.vmfb`` program keeps for its life) and
the test arrays of :mod:`hal_cpu.testing.guarded`::

    | guard page(s) | gap below | range | gap above | guard page |
      no access       canary              canary      no access

Placement (:func:`layout`): the range ends ``tail - size`` bytes before
the upper guard page, ``tail`` being ``size + slack`` rounded up to the
range's alignment ``align``. Its start is then ``align``-aligned (guard
pages are page-aligned) and the gap above holds fewer than ``align +
slack`` bytes; everything in the reservation below the page holding the
start is guard.

* Test arrays are *strict* by default: ``align`` is the dtype's own
  alignment, so an array ends flush against its guard page (its size is a
  multiple of that alignment) and a read of one element past the end
  faults, whatever the vector length of the code reading it. ``slack``
  keeps room for loads qemu-user makes wider than their operand.
* Bindings and local memory take ``align`` :data:`ALIGN` (64): IREE
  aligns its buffers so and kernels may rely on it, so they cannot be
  strict. Up to 63 bytes of canary lie between their end and the guard
  page. A test array placed with ``align=64`` (``padded=True``) is placed
  exactly as a binding of its size.

Canaries (:func:`canary`): byte ``j`` of a gap is ``0x5C + 0x47 * j +
salt`` (mod 256), a byte 0x00 or 0xFF (what an overrun most often writes)
replaced by itself XOR 0x5A.

* Backend ranges use salt 0: the gap above a range of ``size`` bytes
  holds the first ``tail`` bytes of :data:`CANARY`, written when the range
  is handed out and compared (:func:`canary_changed`) when the dispatch
  finishes or the memory is checked, with no per-call computation. Below
  the start, the pages before the range's first page are guard, and the
  gap between that page's start and the range holds
  :func:`canary_below` of its size (made once per size), written when a
  binding is handed out and compared when it is finished
  (:func:`canary_below_changed`): a kernel writing before its binding's
  start is caught there, one reaching the page below faults.
* Test arrays are salted by the gap's address (:func:`salt_at`): they live
  across many calls and the code under test reads one and writes another,
  so a byte read past one array and written past another must still
  differ from the second one's canary. Both gaps are compared
  (:meth:`GuardedRange.changed`).

Natively the backend's own bindings and local memory are not guarded (a
fault on a guard page ends the whole process, and the native dispatch runs
in it); natively the test arrays are :class:`GuardedRange` reservations
all the same, used by calls that run in a child process.
"""

from __future__ import annotations

import ctypes
import functools

from .base import PROT_NONE, PROT_READ, PROT_WRITE, Backend

#: Alignment of a backend's guarded ranges (bindings, local memory), bytes:
#: IREE's buffer alignment.
ALIGN = 64

_string_at = ctypes.string_at


def canary(size: int, salt: int = 0) -> bytes:
    """The ``size`` canary bytes of a gap with ``salt`` (0 to 255): no
    byte is 0x00 or 0xFF."""
    return bytes(b ^ 0x5A if b in (0x00, 0xFF) else b
                 for b in ((0x5C + 0x47 * j + salt) & 0xFF for j in range(size)))


#: The canary after a backend's guarded range (salt 0): its first ``tail``
#: bytes follow a range ending ``tail`` bytes before its guard page.
CANARY = canary(ALIGN)
#: ``CANARY[:n]`` for every ``n`` from 0 to :data:`ALIGN`.
CANARY_PREFIX = [CANARY[:n] for n in range(ALIGN + 1)]


@functools.lru_cache(maxsize=None)
def canary_below(size: int) -> bytes:
    """The canary (salt 0) of the ``size``-byte gap below a backend's
    guarded range, between the start of the page holding the range's
    start and the range (``canary(size)``, made once per size)."""
    return canary(size)


def canary_below_changed(host: int, size: int) -> bool:
    """Whether the ``size`` canary bytes before host address ``host`` (a
    range's start) differ from :func:`canary_below`."""
    return bool(size) and _string_at(host - size, size) != canary_below(size)


def salt_at(address: int) -> int:
    """The salt of a test array's gap starting at guest ``address``: it
    differs between gaps of different pages and offsets."""
    return (0x3B * address + 0x95 * (address >> 12)) & 0xFF


def canary_changed(host: int, size: int, tail: int) -> bool:
    """Whether the ``tail`` canary bytes (salt 0) after ``size`` bytes at
    host address ``host`` differ from :data:`CANARY`."""
    return bool(tail) and _string_at(host + size, tail) != CANARY_PREFIX[tail]


def differ(got: bytes, expected: bytes) -> tuple[int, int] | None:
    """Offsets of the first and last byte where ``got`` differs from
    ``expected``, or None when they are equal."""
    if got == expected:
        return None
    diff = [i for i in range(len(got)) if got[i] != expected[i]]
    return diff[0], diff[-1]


def layout(size: int, page: int, align: int = ALIGN, slack: int = 0,
           pooled: bool = False) -> tuple[int, int, int]:
    """Where a guarded range of ``size`` bytes lies in its reservation:
    ``(offset of its start, offset of the upper guard page, size of the
    reservation)``; the lower guard page is at offset 0.

    The range starts ``tail`` bytes before the upper guard page, ``tail``
    being ``size + slack`` rounded up to ``align`` (a power of two up to a
    page). The pages between the guards are as many as ``tail`` needs;
    ``pooled`` (ranges kept for reuse by ranges of other sizes) takes at
    least one and, past four, rounds them up to a size class at most a
    quarter larger, so that a released range serves many sizes.
    """
    tail = -(-(size + slack) // align) * align
    pages = -(-tail // page)
    if pooled:
        if pages > 4:
            step = 1 << (pages.bit_length() - 3)
            pages = -(-pages // step) * step
        elif not pages:
            pages = 1
    guard = (pages + 1) * page
    return guard - tail, guard, guard + page


class GuardedRange:
    """A range between two guard pages in a reservation of its own, built
    from the calls every backend has (``reserve``, ``protect``, ``read``,
    ``write``), canaries salted by address in both gaps (see the module
    docstring). The caller writes the range's contents.

    Attributes:
        backend: the backend holding it.
        base, span: the reservation (starting with the lower guard page).
        address, size: the range.
        body: ``(start, end)`` of the memory between the guard pages.
    """

    __slots__ = ("backend", "base", "span", "address", "size", "body")

    def __init__(self, backend: Backend, size: int, align: int = ALIGN,
                 slack: int = 0):
        page = backend.page_size
        start, guard, span = layout(size, page, align, slack)
        base = backend.reserve(span)
        try:
            backend.protect(base, page, PROT_NONE)
            backend.protect(base + guard, page, PROT_NONE)
        except BaseException:
            backend.release(base)
            raise
        self.backend = backend
        self.base, self.span = base, span
        self.address, self.size = base + start, size
        self.body = (base + page, base + guard)

    def gaps(self) -> tuple[tuple[int, int], tuple[int, int]]:
        """``(start, end)`` of the gap below the range and of the gap
        above it (either may be empty)."""
        return ((self.body[0], self.address),
                (self.address + self.size, self.body[1]))

    def write_canaries(self) -> None:
        """Write the canary of both gaps."""
        for start, end in self.gaps():
            if start < end:
                self.backend.write(start, canary(end - start, salt_at(start)))

    def changed(self) -> list[tuple[int, int]]:
        """Canary bytes changed since they were written (or last checked),
        restored as they are found: ``(first, last)`` offsets from the
        range's start of the first and last changed byte, per changed gap
        (negative below the start, ``size`` or more above the end), the
        gap below first."""
        found = []
        for start, end in self.gaps():
            if start >= end:
                continue
            expected = canary(end - start, salt_at(start))
            where = differ(self.backend.read(start, end - start), expected)
            if where is not None:
                found.append((start + where[0] - self.address,
                              start + where[1] - self.address))
                self.backend.write(start, expected)
        return found

    def release(self) -> None:
        """Free the reservation (its guard pages made read/write again
        first, as a backend may reuse released pages)."""
        page = self.backend.page_size
        for guard in (self.base, self.body[1]):
            self.backend.protect(guard, page, PROT_READ | PROT_WRITE)
        self.backend.release(self.base)


class RangePool:
    """Released guarded reservations kept for reuse by later ranges of the
    same reservation size (:func:`layout` with ``pooled``), up to
    ``limit`` bytes in all. Bookkeeping only: the backend maps, protects
    and unmaps, holding its own lock around every call.

    Attributes:
        free: reservation size -> addresses of the kept reservations.
        kept: bytes kept.
        limit: most bytes kept.
    """

    __slots__ = ("free", "kept", "limit")

    def __init__(self, limit: int):
        self.free: dict[int, list[int]] = {}
        self.kept = 0
        self.limit = limit

    def take(self, total: int) -> int | None:
        """A kept reservation of ``total`` bytes, no longer kept, or None."""
        free = self.free.get(total)
        if not free:
            return None
        self.kept -= total
        return free.pop()

    def give(self, base: int, total: int) -> bool:
        """Keep reservation ``base`` of ``total`` bytes; False (not kept:
        the caller unmaps it) when that would pass :attr:`limit`."""
        if self.kept + total > self.limit:
            return False
        self.free.setdefault(total, []).append(base)
        self.kept += total
        return True

    def discard(self, base: int, total: int) -> None:
        """Stop keeping reservation ``base`` of ``total`` bytes, if kept
        (it is being unmapped)."""
        free = self.free.get(total)
        if free and base in free:
            free.remove(base)
            self.kept -= total

    def clear(self) -> None:
        """Keep nothing (the backend is closed)."""
        self.free.clear()
        self.kept = 0
