"""Errors raised by :mod:`hal_cpu.programs`; all derive from
:class:`hal_cpu.HalCpuError`."""

from __future__ import annotations

from pathlib import Path

from ..errors import HalCpuError


class IreeToolError(HalCpuError):
    """An IREE tool is missing, has an unsupported version, or cannot run.

    Raised for ``iree-compile`` (package ``iree-base-compiler``) and for
    IREE's Python runtime (``iree.runtime``, package ``iree-base-runtime``).
    ``name`` is the tool or its path, ``field`` what was checked (e.g.
    ``version``), ``value`` the version found, if any.
    """


class CompileError(IreeToolError):
    """``iree-compile`` exited with an error; the message ends with the
    command line and the compiler's diagnostics (several lines)."""


class EvaluationError(HalCpuError):
    """The host program cannot be read or run: MLIR cannot parse the IR, an
    op has no handler, a value has the wrong kind, the program fails.

    Attributes:
        op: name of the IR op concerned (e.g. ``math.exp``), or None.
        line: 1-based line of that op in ``path``, or None.
        path: the user's source file the op came from (programs compiled by
            :func:`~hal_cpu.programs.compile_program` keep their locations), else
            the IR file; None when unknown.
        detail: the message without the location prefix.

    The message reads ``<path>: line <n>: <what is wrong>``.
    """

    def __init__(self, message: str, *, op: str | None = None,
                 line: int | None = None, path=None):
        path = Path(path) if path else None
        self.op, self.line, self.path, self.detail = op, line, path, message
        super().__init__(message, name=str(path) if path else None,
                         field=f"line {line}" if line else None, value=op)

    def located(self, path=None, op: str | None = None,
                line: int | None = None) -> "EvaluationError":
        """A copy of this error, of its type and with its attributes, with
        the location filled in where it was unknown and the message built
        again from :attr:`detail`."""
        err = type(self).__new__(type(self))
        err.__dict__.update(self.__dict__)
        EvaluationError.__init__(err, self.detail, op=self.op or op,
                                 line=self.line or line, path=self.path or path)
        err.__cause__ = self.__cause__
        return err


class ProgramTimeoutError(EvaluationError):
    """A program's host code ran past its time limit
    (``run_program(timeout=)``, ``--timeout``): stopped between two blocks
    of the function named in the message, at the op and line given."""
