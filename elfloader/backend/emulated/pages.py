"""The page map of an emulated address space: the protection of every
mapped page, the one truth both engines enforce (unicorn through its TLB
fill, qemu-user through the agent's ``mprotect``)."""

from __future__ import annotations

import bisect

from ..base import PROT_EXEC


class PageMap:
    """Protection of every mapped page: sorted, non-overlapping
    ``(start, end, prot)`` ranges, looked up by bisection.

    :attr:`state` is ``(starts, ranges)``, replaced as a whole on every
    change, so a reader on another thread sees one consistent version."""

    def __init__(self):
        self.state: tuple[list[int], list[tuple[int, int, int]]] = ([], [])

    def clear(self) -> None:
        """Unmap every page."""
        self.state = ([], [])

    def set(self, start: int, end: int, prot: int | None) -> None:
        """Give ``[start, end)`` protection ``prot`` (None: unmapped)."""
        out = []
        for s, e, p in self.state[1]:
            if e <= start or s >= end:
                out.append((s, e, p))
                continue
            if s < start:
                out.append((s, start, p))
            if e > end:
                out.append((end, e, p))
        if prot is not None:
            out.append((start, end, prot))
        out.sort()
        self.state = ([r[0] for r in out], out)

    def lookup(self, address: int) -> int | None:
        """Protection of the page holding ``address``, None if unmapped."""
        return lookup(self.state, address)

    def covers(self, start: int, end: int) -> bool:
        """Whether every byte of ``[start, end)`` is mapped."""
        starts, ranges = self.state
        i = bisect.bisect_right(starts, start) - 1
        at = start
        while at < end:
            if i < 0 or i >= len(ranges):
                return False
            s, e, _ = ranges[i]
            if not s <= at < e:
                return False
            at = e
            i += 1
        return True

    def any_exec(self, start: int, end: int) -> bool:
        """Whether any page of ``[start, end)`` is executable."""
        starts, ranges = self.state
        i = max(0, bisect.bisect_right(starts, start) - 1)
        for s, e, p in ranges[i:]:
            if s >= end:
                break
            if e > start and p & PROT_EXEC:
                return True
        return False


def lookup(state, address: int) -> int | None:
    """Protection of ``address`` in a :attr:`PageMap.state`."""
    starts, ranges = state
    i = bisect.bisect_right(starts, address) - 1
    if i >= 0:
        s, e, p = ranges[i]
        if address < e:
            return p
    return None

