"""Arrays placed in guest memory between two guard pages, for tests that
must catch every out-of-bounds access of the code under test.

Each array gets its own reservation, built from the :class:`~elfloader.
Backend` calls every backend has (``reserve`` and ``protect``), so it works
the same natively and emulated::

    | guard page | gap below | array | gap above | guard page |
      PROT_NONE    canary            canary        PROT_NONE

* By default the array starts 64-byte aligned (as IREE aligns its heap
  buffers) and ends at most 63 bytes before the upper guard page.
* Strict placement (``strict=True``) puts the array's end flush against
  the upper guard page, its start aligned only as its dtype needs
  (``dtype.alignment``): even a one-element read past the end touches the
  guard page.
* Any access to a guard page faults (emulated: the CPU stops with the
  exact address; native: the process gets SIGSEGV). A write into a gap
  (between an array and a guard page) changes its canary, which
  :meth:`GuardedArrays.check` finds after the call.

:class:`GuestArray` is what a test holds: it stands for the array's guest
address wherever an integer is expected (``__index__``), and reads back
as a numpy array (``numpy()``, ``np.asarray``).
"""

from __future__ import annotations

import numpy as np

from elfloader.backend import PROT_NONE, PROT_READ, PROT_WRITE
from elfloader.diagnose import Region

from .memory import GuestMemory

#: Default alignment of an array's start, bytes (IREE's heap buffers).
ALIGNMENT = 64
#: Start of the byte pattern of the gaps between arrays and guard pages;
#: each array's pattern also depends on its address, so that bytes copied
#: from one array's gap into another's (a read overrun feeding a write
#: overrun) still differ.
CANARY_SEED = 0xA7
#: Byte ``empty()`` arrays are filled with, so that reads of elements the
#: code never wrote stand out.
POISON = 0xCD


def _canary(size: int, at: int) -> bytes:
    """The canary of ``size`` bytes starting at guest address ``at``: no
    byte is 0x00 or 0xFF (the bytes an overrun most often writes, which
    would otherwise go unseen where the pattern has them)."""
    return bytes(b ^ 0x5A if b in (0x00, 0xFF) else b
                 for b in ((CANARY_SEED + 0x3B * i + 0x95 * (at >> 12)) & 0xFF
                           for i in range(at, at + size)))


class GuestArray:
    """An array in guest memory, placed by :class:`GuardedArrays`.

    Passing it where an integer is expected (a params struct field, a call
    argument) gives its address; ``numpy()`` or ``np.asarray(a)`` gives a
    copy of its current contents with its dtype and shape.

    Attributes:
        name: how reports name it (``x`` or the params field it was passed
            as, else ``array N``).
        address: guest address of element 0.
        dtype, shape: numpy dtype and shape; nbytes: size in bytes.
        strict: placed flush against the upper guard page.
        index: order of placement among the arrays of its owner (from 0).
    """

    def __init__(self, owner: "GuardedArrays", name: str | None, index: int,
                 dtype, shape, address: int, base: int, span: int,
                 strict: bool, explicit_name: bool):
        self._owner = owner
        self.name = name or f"array {index}"
        self.index = index
        self.dtype = np.dtype(dtype)
        self.shape = tuple(shape)
        self.nbytes = self.dtype.itemsize * int(np.prod(self.shape, dtype=np.int64))
        self.address = address
        self.strict = strict
        self.explicit_name = explicit_name
        page = owner.page_size
        #: reservation start (the lower guard page) and size in bytes
        self.base, self.span = base, span
        self.body = (base + page, base + span - page)   # between the guards

    @property
    def size(self) -> int:
        """Number of elements."""
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def end(self) -> int:
        """First address past the array."""
        return self.address + self.nbytes

    def numpy(self) -> np.ndarray:
        """A copy of the array's current contents in guest memory."""
        return self._owner.memory.numpy(self.address, self.dtype, self.shape)

    def __array__(self, dtype=None, copy=None):
        data = self.numpy()
        return data if dtype is None else data.astype(dtype)

    def __index__(self) -> int:
        return self.address

    def __int__(self) -> int:
        return self.address

    def __len__(self) -> int:
        return self.shape[0] if self.shape else 1

    def __repr__(self):
        return (f"<GuestArray {self.name} {self.dtype}{list(self.shape)} at "
                f"{self.address:#x}{' strict' if self.strict else ''}>")


class GuardedArrays:
    """The arrays one test placed in one backend's memory.

    Args:
        memory: the guest memory (its backend reserves and protects).
        strict: default placement of new arrays (see the module docstring).
    """

    def __init__(self, memory: GuestMemory, strict: bool = False):
        self.memory = memory
        self.backend = memory.backend
        self.page_size = self.backend.page_size
        self.strict = strict
        self.arrays: list[GuestArray] = []
        self._count = 0

    def place(self, data: np.ndarray | None, *, dtype=None, shape=(),
              name: str | None = None, strict: bool | None = None,
              fill: int | None = None) -> GuestArray:
        """Put an array in guest memory between two guard pages.

        Args:
            data: the values (any array-like; copied, C order), or None for
                an array of ``dtype`` and ``shape`` filled with byte
                ``fill`` (0 when None).
            name: how reports name it.
            strict: flush against the upper guard page (default: this
                object's ``strict``).

        Raises:
            elfloader.BackendError: the backend cannot map the memory.
        """
        strict = self.strict if strict is None else strict
        if data is not None:
            data = np.ascontiguousarray(data)
            dtype, shape = data.dtype, data.shape
        dtype = np.dtype(dtype)
        nbytes = dtype.itemsize * int(np.prod(shape, dtype=np.int64))
        page = self.page_size
        align = max(1, dtype.alignment) if strict else ALIGNMENT
        # bytes from the array's start to the upper guard page
        tail = -(-nbytes // align) * align
        body = -(-tail // page) * page
        span = body + 2 * page
        base = self.backend.reserve(span)
        try:
            self.backend.protect(base, page, PROT_NONE)
            self.backend.protect(base + span - page, page, PROT_NONE)
        except BaseException:
            self.backend.release(base)
            raise
        upper = base + span - page
        address = upper - tail
        array = GuestArray(self, name, self._count, dtype, shape, address,
                           base, span, strict, explicit_name=name is not None)
        self._count += 1
        low, high = address - array.body[0], upper - array.end
        if data is not None and nbytes:
            self.memory.write(address, data)
        elif nbytes and fill:
            self.backend.write(address, bytes([fill]) * nbytes)
        if low:
            self.backend.write(array.body[0], _canary(low, array.body[0]))
        if high:
            self.backend.write(array.end, _canary(high, array.end))
        self.arrays.append(array)
        return array

    def write(self, array: GuestArray, values) -> None:
        """Copy ``values`` (broadcast to the array's shape, cast to its
        dtype) into ``array``."""
        data = np.broadcast_to(np.asarray(values, dtype=array.dtype), array.shape)
        self.memory.write(array.address, np.ascontiguousarray(data))

    def changed(self) -> list[tuple[GuestArray, int, int]]:
        """Canary bytes changed since the arrays were placed (or last
        checked), restored as they are found.

        Returns:
            ``(array, first, last)`` per array with a changed gap: offsets
            in bytes from the array's start of the first and last changed
            byte (negative below the start, ``nbytes`` or more above the
            end), below-the-start gaps first.
        """
        found = []
        for array in self.arrays:
            for start, end in ((array.body[0], array.address),
                               (array.end, array.body[1])):
                if start >= end:
                    continue
                expected = _canary(end - start, start)
                got = self.backend.read(start, end - start)
                if got == expected:
                    continue
                diff = [i for i in range(len(got)) if got[i] != expected[i]]
                found.append((array, start + diff[0] - array.address,
                              start + diff[-1] - array.address))
                self.backend.write(start, expected)
        return found

    def near(self, address: int) -> tuple[GuestArray, int] | None:
        """``(array, offset from its start)`` when ``address`` lies in one
        of an array's guard pages or gaps (not in the array itself)."""
        for array in self.arrays:
            if (array.base <= address < array.base + array.span
                    and not array.address <= address < array.end):
                return array, address - array.address
        return None

    def regions(self, names: dict | None = None) -> list[Region]:
        """:class:`~elfloader.diagnose.Region` objects for fault reports:
        each array (named by ``names[array]`` when given, else its name)
        and its two guard pages."""
        out = []
        page = self.page_size
        for array in self.arrays:
            name = (names or {}).get(array, array.name)
            out.append(Region(name, array.address, array.nbytes))
            out.append(Region(f"guard page below {name}", array.base, page,
                              offsets=False, guard=True))
            out.append(Region(f"guard page after {name}", array.body[1], page,
                              offsets=False, guard=True))
        return out

    def snapshot(self) -> list[tuple[int, bytes]]:
        """``(address, bytes)`` of every array's memory between its guard
        pages (array and gaps), to carry a child process's writes back."""
        return [(a.body[0], self.backend.read(a.body[0], a.body[1] - a.body[0]))
                for a in self.arrays]

    def restore(self, snapshot: list[tuple[int, bytes]]) -> None:
        """Write back what :meth:`snapshot` returned."""
        for address, data in snapshot:
            self.backend.write(address, data)

    def release(self, array: GuestArray) -> None:
        """Free one array's memory (its guard pages made read/write again
        first, as a backend may reuse released pages)."""
        if array in self.arrays:
            self.arrays.remove(array)
            page = self.page_size
            for guard in (array.base, array.body[1]):
                self.backend.protect(guard, page, PROT_READ | PROT_WRITE)
            self.backend.release(array.base)

    def close(self) -> None:
        """Free every array."""
        while self.arrays:
            self.release(self.arrays[-1])
