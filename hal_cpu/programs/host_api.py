"""What a host module is made of: :class:`HostModule` and :func:`export`,
the values it may take and return besides numbers and arrays
(:class:`RawTensor`), its errors, and :data:`HOST_MODULE_ABI_VERSION`.

A leaf: the built-in ``check`` module (:mod:`hal_cpu.programs.check`) builds on
it, and :mod:`hal_cpu.programs.host_modules` (loading, registering and linking
modules) offers every name here too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping

from ..errors import HalCpuError
from .errors import EvaluationError

__all__ = ["HOST_MODULE_ABI_VERSION", "HostCallError", "HostModule", "HostModuleError",
           "RawTensor", "export"]

#: The version of this interface a module creation function receives; it
#: changes when the calling convention changes.
HOST_MODULE_ABI_VERSION = 1


class HostModuleError(HalCpuError):
    """A host module cannot be loaded or linked: a spec that names no file or
    function, a creation function that refuses the version, a required
    import that no module provides, a reference type no module declares."""


class HostCallError(EvaluationError):
    """A host function raised, or returned values of the wrong kind; the
    message names the import and the original error."""


@dataclass(frozen=True)
class RawTensor:
    """A buffer view whose element type numpy lacks (e.g. ``i4``): its
    ``shape``, IREE ``element_type`` name and packed ``data`` bytes."""

    shape: tuple[int, ...]
    element_type: str
    data: bytes


def export(name: str):
    """Mark a method of a :class:`HostModule` subclass as the module's
    function ``name`` (e.g. ``"string.create"``)."""
    def mark(fn):
        fn.host_export = name
        return fn
    return mark


class HostModule:
    """A module of host functions.

    Args:
        name: the module name programs import from (``custom`` for
            ``@custom.string.print``); subclasses may set it as a class
            attribute.
        functions: function name -> callable, besides methods marked with
            :func:`export`.
        types: reference type name (``custom.string``, without ``!``) ->
            the Python class its values have.
        version: the module's own version (informational).
    """

    name: str = ""
    types: Mapping[str, type] = {}
    version: int = 0

    def __init__(self, name: str | None = None,
                 functions: Mapping[str, Callable] | None = None,
                 types: Mapping[str, type] | None = None, version: int | None = None):
        if name is not None:
            self.name = name
        if types is not None:
            self.types = dict(types)
        if version is not None:
            self.version = version
        found = {}
        for attr in dir(type(self)):
            fn = getattr(type(self), attr, None)
            if callable(fn) and hasattr(fn, "host_export"):
                found[fn.host_export] = getattr(self, attr)
        self.functions: dict[str, Callable] = {**found, **(functions or {})}

    def __repr__(self) -> str:
        return f"<host module {self.name!r}: {', '.join(sorted(self.functions))}>"
