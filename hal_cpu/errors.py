"""Error types raised by :mod:`hal_cpu`; all derive from :class:`HalCpuError`."""

from __future__ import annotations


class HalCpuError(Exception):
    """Base class of every :mod:`hal_cpu` error.

    Attributes:
        name: the file or object concerned; field: what was checked;
        value: the offending value.
    """

    def __init__(self, message: str, *, name: str | None = None,
                 field: str | None = None, value=None):
        self.name, self.field, self.value = name, field, value
        parts = [p for p in (name, field) if p] + [message]
        super().__init__(": ".join(parts))


class LibraryError(HalCpuError):
    """The executable library could not be queried or its tables are bad
    (NULL from the query, unsupported version, pointers outside the image)."""


class ExportNotFoundError(HalCpuError):
    """No export with that name or ordinal."""


class DispatchError(HalCpuError):
    """A dispatch was refused (too few bindings or constants, bad workgroup
    count) or a workgroup returned non-zero."""


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


class PluginSpecError(PluginError):
    """A malformed plugin spec string (``path.sos?key=value``...)."""
