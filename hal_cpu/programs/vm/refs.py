"""The VM's own ref types and its status error.

``!vm.buffer`` is :class:`VmBuffer` (read-only data of the module, or a
buffer a program made); ``!vm.list`` is :class:`VmList`. A ``vm.fail`` (or
an import that fails) raises :class:`StatusError` (``VmStatusError``, its
earlier name, is the same class).
"""

from __future__ import annotations

import threading

from ..host_api import StatusCode, StatusError, VmError

__all__ = ["VmBuffer", "VmList", "StatusError", "StatusCode", "VmStatusError", "VmError",
           "MemoryBudget"]


#: The VM's status error is the public :class:`hal_cpu.programs.StatusError`
#: (defined in the leaf :mod:`hal_cpu.programs.host_api`, which host modules
#: import); ``VmStatusError`` is its earlier name.
VmStatusError = StatusError

#: ``iree_status_code_t`` names (iree/base/status.h), by value.
STATUS_NAMES = {int(c): c.name for c in StatusCode if c}


#: ``iree_status_code_t`` RESOURCE_EXHAUSTED: what a request past the
#: memory limit fails with.
RESOURCE_EXHAUSTED = int(StatusCode.RESOURCE_EXHAUSTED)


class MemoryBudget:
    """The one memory limit of a program: every allocation the VM makes
    for it (HAL buffers, VM buffers, lists and their elements,
    copies of read-only data, host-module results) is counted here before
    it is made, and uncounted when it is freed.

    Args:
        limit: bytes the program may hold at once (a positive int).

    Attributes:
        limit: the limit, bytes; live: bytes counted now (storage kept
            for reuse included, until a reclaimer frees it).
    """

    __slots__ = ("limit", "live", "reclaimers", "_lock")

    def __init__(self, limit: int):
        self.limit = limit
        self.live = 0
        #: callables that free memory kept for reuse (counted, but not in
        #: use), called before a charge past the limit is refused
        self.reclaimers: list = []
        self._lock = threading.Lock()

    def charge(self, nbytes: int, what: str) -> None:
        """Count ``nbytes`` more.

        Raises:
            VmStatusError: RESOURCE_EXHAUSTED, naming ``what`` and the size,
                when they would take the live bytes past :attr:`limit`
                (nothing is counted then).
        """
        if self.live + nbytes > self.limit and nbytes <= self.limit:
            for reclaim in list(self.reclaimers):
                reclaim()
        with self._lock:
            live = self.live
            if nbytes < 0 or live + nbytes > self.limit:
                raise VmStatusError(RESOURCE_EXHAUSTED, (
                    f"{what}: {nbytes} bytes would take the program's buffers "
                    f"past its memory limit of {self.limit} bytes ({live} in "
                    "use); raise it with --memory_limit or "
                    "load_program(memory_limit=)"))
            self.live = live + nbytes

    def uncharge(self, nbytes: int) -> None:
        """Count ``nbytes`` fewer (they were freed)."""
        with self._lock:
            self.live -= nbytes


class VmBuffer:
    """A ``!vm.buffer``: bytes with a read-only flag.

    Attributes:
        data: a ``memoryview`` of the bytes (format ``B``).
        readonly: True for module read-only data.
        name: what the buffer is, for messages (e.g. ``rodata[4]``).
        guarded: see below.
    """

    __slots__ = ("data", "readonly", "name", "guarded", "__weakref__")

    #: the VM type name (``vm.cast.any.ref`` checks it)
    vm_type = "!vm.buffer"

    def __init__(self, data, readonly: bool = False, name: str = "buffer"):
        mv = memoryview(data)
        self.data = mv.cast("B") if mv.format != "B" or mv.ndim != 1 else mv
        self.readonly = readonly or self.data.readonly
        self.name = name
        #: the bytes are :func:`hal_cpu.arrays.guarded_bytes` storage of
        #: their own (a buffer the program allocated), which the ``hal``
        #: module may import in place
        self.guarded = False

    def __len__(self) -> int:
        return len(self.data)

    def bytes(self) -> bytes:
        """A copy of the contents."""
        return self.data.tobytes()

    def __repr__(self) -> str:
        return f"<vm.buffer {self.name} ({len(self.data)} bytes)>"


class VmList(list):
    """A ``!vm.list``: a Python list of values (ints, floats, refs or None)
    with the list's element type name (e.g. ``?``, ``i32``,
    ``!hal.buffer_view``) in :attr:`element_type`."""

    __slots__ = ("element_type", "charged", "__weakref__")

    #: the VM type name (``vm.cast.any.ref`` checks it)
    vm_type = "!vm.list"

    def __init__(self, element_type: str = "?", items=()):
        super().__init__(items)
        self.element_type = element_type
        #: ``[bytes]`` counted against a :class:`MemoryBudget` for its
        #: slots (a list made by the program), or None
        self.charged: list | None = None
