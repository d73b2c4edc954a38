"""Error types raised by :mod:`hal_cpu`; all derive from :class:`HalCpuError`,
itself a :class:`fatelf.PortableKernelError` (the project's one base class:
``name``, ``field``, ``value``)."""

from __future__ import annotations

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
