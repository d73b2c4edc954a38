"""Canary bytes between a guarded range and its guard pages, shared
by both engines (the bytes live in guest memory, which the host reads).
The placement and the canary rule are :mod:`elfloader.backend.guarded`'s;
this module turns a changed canary into the error."""

from __future__ import annotations

import ctypes

from ...errors import GuardError
from ..guarded import ALIGN, CANARY, canary_below, canary_changed

#: Alignment of guarded ranges (bindings), bytes (:data:`..guarded.ALIGN`).
BINDING_ALIGN = ALIGN
_string_at = ctypes.string_at


def guard_error(host: int, address: int, size: int, tail: int,
                what: str, below: int = 0) -> GuardError:
    """The error for a guarded range of ``size`` bytes at guest ``address``
    (host ``host``) whose ``tail`` canary bytes after it changed, or,
    when ``below`` is given and those are intact, whose ``below`` canary
    bytes before it (:func:`..guarded.canary_below`) changed: then the
    error's offsets are negative."""
    if below and not canary_changed(host, size, tail):
        got, want = _string_at(host - below, below), canary_below(below)
        diff = [i - below for i in range(below) if got[i] != want[i]]
        return GuardError(f"guest code wrote before the start of the "
                          f"{size}-byte {what} at {address:#x}: byte "
                          f"{diff[0]} changed ({-diff[0]} before the start)",
                          field=what, value=address, address=address,
                          size=size, offset=diff[0], last_offset=diff[-1])
    got = _string_at(host + size, tail)
    first = next(i for i in range(tail) if got[i] != CANARY[i])
    last = max(i for i in range(tail) if got[i] != CANARY[i])
    return GuardError(f"guest code wrote past the end of the {size}-byte "
                      f"{what} at {address:#x}: byte {size + first} changed "
                      f"({first + 1} past the end)", field=what,
                      value=address, address=address, size=size,
                      offset=size + first, last_offset=size + last)
