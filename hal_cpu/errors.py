"""Error types raised by :mod:`hal_cpu`; all derive from :class:`HalCpuError`,
itself a :class:`fatelf.PortableKernelError` (the project's one base class:
``name``, ``field``, ``value``)."""

from __future__ import annotations

from elfloader.errors import EmulationError, Fault
from fatelf.errors import PortableKernelError

from . import abi


class HalCpuError(PortableKernelError):
    """Base class of every :mod:`hal_cpu` error.

    Attributes:
        name: the file or object concerned; field: what was checked;
        value: the offending value.
    """


class LibraryError(HalCpuError):
    """The executable library could not be queried or its tables are bad
    (NULL from the query, unsupported version, pointers outside the image)."""


class ExportNotFoundError(HalCpuError):
    """No export with that name or ordinal."""


class DispatchError(HalCpuError):
    """A dispatch was refused (too few bindings or constants, bad workgroup
    count) or a workgroup returned non-zero."""


class DispatchTimeoutError(DispatchError):
    """A dispatch ran past its time limit (``timeout=``); the workgroups
    not yet run were not run."""


class UnresolvedImportError(HalCpuError):
    """Required imports of an executable that no plugin provides.

    Attributes:
        missing: the unresolved import names; searched: plugin names searched.
    """

    def __init__(self, message, *, missing=(), searched=(), **kw):
        super().__init__(message, **kw)
        self.missing = list(missing)
        self.searched = list(searched)


class PluginError(HalCpuError):
    """A plugin could not be loaded, queried or used."""


class PluginStatusError(PluginError):
    """A plugin function returned a non-OK status.

    Attributes:
        code: the status code (0-31); code_name: e.g. ``NOT_FOUND``.
    """

    def __init__(self, message, *, code: int, code_name: str, **kw):
        super().__init__(message, **kw)
        self.code = code
        self.code_name = code_name

    @classmethod
    def check(cls, status: int, what: str, name: str, detail: str = "") -> None:
        """Raise for a non-OK plugin status (``status & 0x1F``).

        Args:
            status: the value the plugin function returned.
            what: the function, e.g. ``load`` or ``resolve``.
            name: the plugin (file or name).
            detail: appended to the message (e.g. the load parameters).
        """
        code = status & abi.PLUGIN_STATUS_CODE_MASK
        if code:
            code_name = abi.status_name(code)
            raise cls(f"{what} returned {code_name} ({code}){detail}", name=name,
                      field=what, value=code, code=code, code_name=code_name)


class PluginSpecError(PluginError):
    """A malformed plugin spec string (``path.sos?key=value``...)."""


class NativeCrashError(HalCpuError):
    """Native code ended the child process it ran in (``hal-cpu run``
    isolates native dispatches) by a signal, or the child exited without an
    answer.

    Attributes:
        signal: the signal number (e.g. 11 for SIGSEGV), or None when the
            child exited; value: its name (``SIGSEGV``) or ``exit status N``;
        stage: where the child was, e.g. ``in export mul_add`` or
            ``while loading`` ('' when unknown); field: ``signal`` (not
            repeated in the message, which reads ``file: what crashed``).
    """

    def __init__(self, message, *, signal: int | None = None, stage: str = "",
                 **kw):
        super().__init__(message, **kw)
        self.field = "signal"
        self.signal = signal
        self.stage = stage


class OverrunError(HalCpuError, EmulationError):
    """Guest code read or wrote outside memory it was given: for an
    emulated dispatch, past the end of a binding or local memory (a write
    into the canary bytes after the end, seen when the dispatch ends, or a
    read or write reaching the guard page after them, where the CPU stops
    at the instruction); for an import called by the pytest fixtures,
    outside a guest array on either side (:mod:`hal_cpu.testing.guarded`).

    Also an :class:`elfloader.EmulationError`, taking its keyword
    arguments: ``fault`` (an :class:`elfloader.Fault`: ``kind``
    ``"overrun"`` for a canary write, else the kind of the refused access;
    ``pc`` None for a canary write; ``address`` the first byte outside the
    memory that was accessed; None when not known), ``report`` (for a
    guard-page fault, the :class:`elfloader.diagnose.FaultReport`) and
    ``worker`` (the worker whose CPU faulted, or None when not known).

    Attributes:
        export: the export's label (None for an import called directly);
        import_name: the import called directly, or None; what: e.g.
        ``binding 2`` or the array's name; offset: offset in bytes from the
        start of the memory of the first byte accessed outside it
        (``length`` or more past the end, negative before the start);
        length: the memory's size in bytes; workgroup: ``(x, y, z)`` of the
        faulting workgroup, or None when not known (canary writes).
    """

    def __init__(self, message: str, *, export: str | None = None,
                 what: str | None = None, offset: int | None = None,
                 length: int | None = None,
                 workgroup: tuple[int, int, int] | None = None,
                 import_name: str | None = None, **kw) -> None:
        super().__init__(message, **kw)
        self.export, self.what = export, what
        self.import_name = import_name
        self.offset, self.length = offset, length
        self.workgroup = workgroup


class BindingOverrunError(OverrunError):
    """An emulated dispatch accessed memory past the end of a binding.

    Attributes:
        binding: the binding's index (``field`` is ``bindings[N]``), or
            None when no binding starts at the overrun range.
    """

    def __init__(self, message: str, *, binding: int | None, **kw) -> None:
        super().__init__(message, **kw)
        self.binding = binding


class BindingUnderrunError(OverrunError):
    """Guest code accessed memory before the start of an array it was
    given (a guard page or canary bytes below it).

    Attributes:
        binding: the array's index (order of placement), or None when
            no binding starts at the range.
    """

    def __init__(self, message: str, *, binding: int | None, **kw) -> None:
        super().__init__(message, **kw)
        self.binding = binding


class CallTimeoutError(HalCpuError, EmulationError):
    """A guest call ran past its time limit and was stopped (emulated) or
    its child process killed (native).

    Also an :class:`elfloader.EmulationError`, taking its keyword
    arguments: ``fault`` (an :class:`elfloader.Fault` of kind
    ``"timeout"``, whose ``pc`` is where the CPU was, or None; by default
    one that knows nothing more), ``report`` (the
    :class:`elfloader.diagnose.FaultReport` of where the CPU was
    (emulated), or None) and ``worker``.

    Attributes:
        seconds: the limit; function: the import or export that was
        called.
    """

    def __init__(self, message: str, *, seconds: float,
                 function: str | None = None, fault: Fault | None = None,
                 **kw) -> None:
        super().__init__(message, fault=fault if fault is not None
                         else Fault("timeout"), **kw)
        self.seconds, self.function = seconds, function


class LocalMemoryOverrunError(OverrunError):
    """An emulated dispatch accessed memory past the end of a worker's
    workgroup-local memory.

    Attributes:
        worker: the worker whose local memory it was.
    """

    def __init__(self, message: str, *, worker: int, **kw) -> None:
        super().__init__(message, worker=worker, **kw)
