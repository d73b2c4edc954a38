"""The VM's own ref types and its status error.

``!vm.buffer`` is :class:`VmBuffer` (read-only data of the module, or a
buffer a program made); ``!vm.list`` is :class:`VmList`. A ``vm.fail`` (or
an import that fails) raises :class:`VmStatusError`.
"""

from __future__ import annotations

import threading

from fatelf.text import one_line

from ...errors import HalCpuError

__all__ = ["VmBuffer", "VmList", "VmStatusError", "VmError", "MemoryBudget"]


class VmError(HalCpuError):
    """Base of errors of VM modules: reading, linking or running one."""


class VmStatusError(VmError):
    """A VM function failed with an IREE status (``vm.fail``, a failing
    import): ``code`` is the status code (``iree_status_code_t``:
    3 INVALID_ARGUMENT, 5 NOT_FOUND, 9 FAILED_PRECONDITION, 13 INTERNAL...),
    ``message`` its text, ``location`` the ``file:line:column`` of the op
    when the module has debug information (else None). Both are the
    program's text, kept as shown: on one bounded line, control characters
    escaped (:func:`fatelf.text.one_line`, which leaves text escaped
    already as it is, so a message passed on is not escaped twice)."""

    def __init__(self, code: int, message: str, location: str | None = None, *,
                 name: str | None = None):
        location = one_line(location, 300) if location else location
        message = one_line(message)
        self.code, self.location = code, location
        at = f"{location}: " if location else ""
        super().__init__(f"{at}{message}", name=name,
                         field=STATUS_NAMES.get(code, f"status {code}"), value=code)
        self.message = message

    def set_location(self, location: str | None) -> None:
        """Give the error the location of the op that raised it."""
        VmStatusError.__init__(self, self.code, self.message, location, name=self.name)

    def with_name(self, name: str):
        """A copy of this error about file ``name``."""
        err = type(self).__new__(type(self))
        err.__dict__.update(self.__dict__)
        VmStatusError.__init__(err, self.code, self.message, self.location, name=name)
        return err


#: ``iree_status_code_t`` names (iree/base/status.h).
STATUS_NAMES = {1: "CANCELLED", 2: "UNKNOWN", 3: "INVALID_ARGUMENT",
                4: "DEADLINE_EXCEEDED", 5: "NOT_FOUND", 6: "ALREADY_EXISTS",
                7: "PERMISSION_DENIED", 8: "RESOURCE_EXHAUSTED",
                9: "FAILED_PRECONDITION", 10: "ABORTED", 11: "OUT_OF_RANGE",
                12: "UNIMPLEMENTED", 13: "INTERNAL", 14: "UNAVAILABLE",
                15: "DATA_LOSS", 16: "UNAUTHENTICATED", 17: "DEFERRED",
                18: "INCOMPATIBLE"}


#: ``iree_status_code_t`` RESOURCE_EXHAUSTED: what a request past the
#: memory limit fails with.
RESOURCE_EXHAUSTED = 8


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
