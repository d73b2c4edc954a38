"""Canary bytes between a guarded range's end and its guard page, shared
by both engines (the bytes live in guest memory, which the host reads)."""

from __future__ import annotations

import ctypes

from ...errors import GuardError

#: Alignment of guarded ranges (bindings), bytes.
BINDING_ALIGN = 64
#: Bytes written between the end of a guarded range and its guard page, and
#: compared when the range is finished (at most ``BINDING_ALIGN - 1``).
#: None is 0x00 or 0xFF, the bytes an overrun most often writes.
CANARY = bytes(b ^ 0x5A if b in (0x00, 0xFF) else b
               for b in ((0x5C + 0x47 * i) & 0xFF for i in range(BINDING_ALIGN)))
_CANARY_PREFIX = [CANARY[:n] for n in range(BINDING_ALIGN + 1)]
_string_at = ctypes.string_at


def canary_changed(host: int, size: int, tail: int) -> bool:
    """Whether the ``tail`` canary bytes after ``size`` bytes at host
    address ``host`` differ from :data:`CANARY`."""
    return bool(tail) and _string_at(host + size, tail) != _CANARY_PREFIX[tail]


def guard_error(host: int, address: int, size: int, tail: int,
                what: str) -> GuardError:
    """The error for a guarded range of ``size`` bytes at guest ``address``
    (host ``host``) whose ``tail`` canary bytes changed."""
    got = _string_at(host + size, tail)
    first = next(i for i in range(tail) if got[i] != CANARY[i])
    last = max(i for i in range(tail) if got[i] != CANARY[i])
    err = GuardError(f"guest code wrote past the end of the {size}-byte "
                     f"{what} at {address:#x}: byte {size + first} changed "
                     f"({first + 1} past the end)", field=what,
                     value=address)
    err.address, err.size = address, size
    err.offset, err.last_offset = size + first, size + last
    err.fault, err.fault_page, err.pc = "overrun", None, None
    err.fault_address, err.access_size = address + size + first, None
    return err
