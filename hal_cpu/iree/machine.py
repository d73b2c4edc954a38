"""The interpreter: runs a host program's functions op by op.

A :class:`Machine` holds one instance of a program: its globals, the
:class:`~hal_cpu.iree.device.Device` it submits work to, and the host modules
its imports resolve to. :meth:`Machine.initialize` runs the module's
initializers (globals, devices, executables, constant buffers, memoized
command buffers); :meth:`Machine.call` runs a function.

Each function is prepared once per program: every op is looked up in the op
table (:data:`hal_cpu.iree.optable.OPS`, one handler per op name) and
becomes a closure over its operand and result slots. An op with no handler,
or a form of it the handler does not take, becomes a closure that raises
:class:`UnsupportedOpError` when it is reached, naming the op and where it
came from in the user's source.
"""

from __future__ import annotations

from time import monotonic as _monotonic
from typing import Any, Sequence

from fatelf.errors import PortableKernelError

from .control import BR, RET
from .device import Device
from .errors import EvaluationError
from .reader import Function, OpInfo, Program

__all__ = ["Machine", "UnsupportedOpError", "BR", "RET"]


class UnsupportedOpError(EvaluationError):
    """The host program reached an op the interpreter cannot run (no
    handler, or a form its handler does not take)."""


class _Prepared:
    __slots__ = ("function", "blocks")

    def __init__(self, function: Function, blocks):
        self.function, self.blocks = function, blocks


def _unsupported(op: OpInfo, why: str):
    def run(m, r):
        raise UnsupportedOpError(f"cannot run op '{op.name}' ({why}) in @{op.function}: "
                                 f"{op.text()}", op=op.name)
    return run


def prepare(function: Function) -> _Prepared:
    """Closures for every op of ``function`` (see the module docstring)."""
    from .optable import OPS
    blocks = []
    for b in function.blocks:
        steps = []
        for op in b.ops:
            build = OPS.get(op.name)
            if build is None:
                fn = _unsupported(op, "the interpreter has no handler for it")
            else:
                try:
                    fn = build(op)
                except EvaluationError as e:
                    fn = _raiser(_at(e, op))
                except Exception as e:      # an attribute of a form not foreseen
                    fn = _unsupported(op, f"{type(e).__name__}: {e}")
                if fn is None:
                    fn = _unsupported(op, "this form of it is not supported")
            steps.append((fn, op))
        blocks.append((b.args, steps))
    return _Prepared(function, blocks)


def _at(err: EvaluationError, op: OpInfo) -> EvaluationError:
    """``err`` located at ``op`` where its location was unknown."""
    return err.located(op.where.path, op.name, op.where.line or None)


def _raiser(err):
    def run(m, r):
        raise err
    return run


def prepared(program: Program, function: Function) -> _Prepared:
    """:func:`prepare`, cached on the program."""
    cache = program.__dict__.setdefault("_prepared", {})
    p = cache.get(id(function))
    if p is None:
        p = cache[id(function)] = prepare(function)
    return p


class Machine:
    """One instance of a program.

    Args:
        program: from :func:`hal_cpu.iree.reader.load_program`.
        device: where dispatches and transfers go.
        modules: a :class:`hal_cpu.iree.host_modules.ModuleRegistry` (the
            ``check`` module is built in).
        variant: the executable variant this device runs
            (``embedded_elf_<arch>``), for ``hal.device.query`` and
            ``hal.executable.create``.
        max_ops: ops one call may run before it is stopped (a guard against
            programs that never end).

    Raises:
        HostModuleError: (on construction) a required import that no module
            provides, before anything runs.
    """

    def __init__(self, program: Program, device: Device, modules=None,
                 variant: str | None = None, max_ops: int = 200_000_000):
        from .host_modules import ModuleRegistry
        self.program, self.device = program, device
        self.modules = modules if modules is not None else ModuleRegistry()
        self.variant = variant
        self.max_ops = max_ops
        #: ``time.monotonic()`` value past which host code stops (between
        #: two blocks), or None
        self.deadline: float | None = None
        self.time_limit: float | None = None
        self.globals: dict[str, Any] = {}
        self.ops_run = 0
        self.imports = self.modules.link(program)

    # -- globals -------------------------------------------------------------
    def initialize(self) -> None:
        """Give globals their initial values, then run the initializers in
        module order."""
        from .ops_control import global_initial_value
        for g in self.program.globals.values():
            if g.initial is not None:
                self.globals[g.name] = global_initial_value(g)
        for init in self.program.initializers:
            self.run(init, [])

    # -- calls ---------------------------------------------------------------
    def call(self, name: str, args: Sequence[Any]) -> list:
        """Run function ``@name`` of the program with interpreter values."""
        fn = self.program.functions.get(name)
        if fn is None:
            raise EvaluationError(f"no function @{name}")
        return self.run(fn, list(args))

    def run(self, function: Function, args: list) -> list:
        """Run ``function``; returns its results."""
        code = prepared(self.program, function)
        if len(args) != len(function.blocks[0].args):
            raise EvaluationError(f"@{function.name} called with {len(args)} arguments, "
                                  f"takes {len(function.blocks[0].args)}")
        r: list = [None] * function.nslots
        slots, steps = code.blocks[0]
        for s, v in zip(slots, args):
            r[s] = v
        budget = self.max_ops
        deadline = self.deadline
        op = None
        try:
            while True:
                budget -= len(steps)
                if budget < 0:
                    raise EvaluationError(f"@{function.name} ran {self.max_ops} ops "
                                          "without returning (an endless loop?)")
                if deadline is not None and _monotonic() > deadline:
                    from .errors import ProgramTimeoutError
                    raise ProgramTimeoutError(
                        f"the time limit of {self.time_limit:g} s passed in "
                        f"@{function.name} (a loop of the program's host code)")
                out = None
                for fn, op in steps:
                    out = fn(self, r)
                    if out is not None:
                        break
                if out is None:
                    raise EvaluationError(f"a block of @{function.name} has no terminator")
                if out[0] == RET:
                    self.ops_run += self.max_ops - budget
                    return out[1]
                slots, steps = code.blocks[out[1]]
                for s, v in zip(slots, out[2]):
                    r[s] = v
        except EvaluationError as e:
            if op is None:
                raise
            raise _at(e, op).with_traceback(e.__traceback__) from None
        except (ArithmeticError, ValueError, TypeError, KeyError, IndexError) as e:
            # a value of the wrong kind reached a handler (e.g. a buffer where
            # an integer belongs): name the op instead of a traceback
            if op is None or isinstance(e, PortableKernelError):
                raise
            err = EvaluationError(f"'{op.name}' failed in @{op.function}: "
                                  f"{type(e).__name__}: {e}", op=op.name)
            raise _at(err, op) from e
