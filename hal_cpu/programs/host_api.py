"""What a host module is made of: :class:`HostModule` and :func:`export`,
the values it may take and return besides numbers and arrays
(:class:`RawTensor`), its errors, IREE's statuses (:class:`StatusCode`,
:class:`StatusError`, the error a host function raises to fail with a
status, as an IREE C module returns one) and :data:`HOST_MODULE_ABI_VERSION`.

A leaf: the built-in ``check`` module (:mod:`hal_cpu.programs.check`) builds on
it, and :mod:`hal_cpu.programs.host_modules` (loading, registering and linking
modules) offers every name here too.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Callable, Mapping

from fatelf.text import one_line

from ..errors import HalCpuError
from .errors import EvaluationError

__all__ = ["HOST_MODULE_ABI_VERSION", "HostCallError", "HostModule", "HostModuleError",
           "RawTensor", "StatusCode", "StatusError", "VmError", "export"]

#: The version of this interface a module creation function receives; it
#: changes when the calling convention changes.
HOST_MODULE_ABI_VERSION = 1


class StatusCode(enum.IntEnum):
    """IREE's status codes, ``iree_status_code_t`` of
    ``runtime/src/iree/base/status.h`` (the values are IREE's; the names
    print as IREE prints them, ``INVALID_ARGUMENT``)."""

    OK = 0
    CANCELLED = 1
    UNKNOWN = 2
    INVALID_ARGUMENT = 3
    DEADLINE_EXCEEDED = 4
    NOT_FOUND = 5
    ALREADY_EXISTS = 6
    PERMISSION_DENIED = 7
    RESOURCE_EXHAUSTED = 8
    FAILED_PRECONDITION = 9
    ABORTED = 10
    OUT_OF_RANGE = 11
    UNIMPLEMENTED = 12
    INTERNAL = 13
    UNAVAILABLE = 14
    DATA_LOSS = 15
    UNAUTHENTICATED = 16
    DEFERRED = 17
    INCOMPATIBLE = 18


def status_name(code: int) -> str:
    """IREE's name of status ``code`` (``NOT_FOUND`` for 5), or ``status N``
    for a value ``iree_status_code_t`` does not define."""
    try:
        return StatusCode(code).name
    except ValueError:
        return f"status {code}"


class VmError(HalCpuError):
    """Base of errors of VM modules: reading, linking or running one."""


class StatusError(VmError):
    """A function of a program failed with an IREE status: ``vm.fail``, an
    op of the ``hal`` module, or a host function that raised it (what an
    IREE C/C++ module does by returning a status).

    Args:
        code: a :class:`StatusCode` (or its int value).
        message: what went wrong, in words.
        location: the ``file:line:column`` of the op that failed, when the
            module's debug information has it (the VM fills it in).
        name: the program file (the VM fills it in).

    Attributes:
        code: the :class:`StatusCode` (an int for a value IREE does not
            define); message: the text; location: as above, or None.
            Both texts are kept as shown: on one bounded line, control
            characters escaped (:func:`fatelf.text.one_line`, which leaves
            escaped text as it is, so a message passed on is not escaped
            twice).

    ``str()`` reads as IREE prints a status, ``CODE; message``
    (``INVALID_ARGUMENT; model.mlir:4:10: the input must be positive``, the
    op's location first when known); ``name`` is the program file, and
    ``field`` the code's name, ``value`` its number.
    """

    def __init__(self, code: int, message: str, location: str | None = None, *,
                 name: str | None = None):
        location = one_line(location, 300) if location else location
        message = one_line(str(message))
        try:
            code = StatusCode(code)
        except ValueError:
            code = int(code)
        self.code, self.location = code, location
        at = f"{location}: " if location else ""
        super().__init__(f"{at}{message}", name=name, field=status_name(code),
                         value=int(code))
        self.message = message

    def __str__(self) -> str:
        at = f"{self.location}: " if self.location else ""
        return f"{status_name(self.code)}; {at}{self.message}"

    def set_location(self, location: str | None) -> None:
        """Give the error the location of the op that raised it."""
        StatusError.__init__(self, self.code, self.message, location, name=self.name)

    def with_name(self, name: str):
        """A copy of this error about file ``name``."""
        err = type(self).__new__(type(self))
        err.__dict__.update(self.__dict__)
        StatusError.__init__(err, self.code, self.message, self.location, name=name)
        return err


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
