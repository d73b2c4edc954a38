"""Running a compiled program's public function through the interpreter.

:func:`run_program` executes the host program as IREE's runtime would:
initializers first, then the function, op by op; dispatches, fills and
copies run when the program submits them, so host code can read results
(``tensor.extract``, loops on data, workgroup counts computed from data) and
call host modules. :func:`hal_cpu.iree.plan_program` runs the same
interpreter on a device that records instead of executing.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence, Union

import numpy as np

from .compiler import Compiled
from .device import BufferView, Device
from .errors import EvaluationError
from .machine import Machine
from .reader import Program, load_program
from .scalars import element_dtype, float_dtype, int_width, round_float, signed, wrap
from .steps import step_refs

__all__ = ["ProgramRun", "run_program", "open_program", "input_values", "select_function",
           "so_for"]


@dataclass
class ProgramRun:
    """What one call of a public function did.

    Attributes:
        function: the function name.
        results: one per function result: a numpy array for a tensor, a
            numpy scalar of the result's type for a scalar (``i1`` as
            ``int32``, as IREE's VM returns it), a host module's object for
            its reference types.
        result_types: the results' IR types (``!hal.buffer_view``, ``i32``...).
        trace: the dispatches and transfers run, in order
            (:class:`~hal_cpu.iree.steps.Dispatch`, ``FillStep``, ``CopyStep``).
        allocations: name -> bytes of every allocation the program made.
        check_failures: messages of failed ``check.expect_*`` ops.
        ops: ops the interpreter ran (initializers included).
        constants: name -> bytes (uint8 array) of each constant buffer of
            the module that a step of :attr:`trace` touched, as the run
            left it.
    """

    function: str
    results: list
    result_types: list[str]
    trace: list = field(default_factory=list)
    allocations: dict[str, int] = field(default_factory=dict)
    check_failures: list[str] = field(default_factory=list)
    ops: int = 0
    constants: dict = field(default_factory=dict)


def open_program(compiled: Union[Compiled, str, os.PathLike]) -> tuple[Program, Compiled | None]:
    """The parsed HAL-level IR of ``compiled`` (a :class:`Compiled` or the
    path of a ``.hal.mlir`` file)."""
    if isinstance(compiled, Compiled):
        return load_program(compiled.hal_mlir), compiled
    return load_program(Path(compiled)), None


def select_function(program: Program, function: str | None) -> str:
    """``function``, or the only public function.

    Raises:
        ValueError: no such public function, or several and none named.
    """
    if function is None:
        if len(program.public) != 1:
            raise ValueError(f"module has public functions {program.public}; name one")
        return program.public[0]
    function = function.lstrip("@")
    if function not in program.public:
        raise ValueError(f"no public function @{function}; have {program.public}")
    return function


def input_values(program: Program, function: str, inputs: Sequence[Any]) -> list:
    """Interpreter values for a function's arguments: a buffer view per
    tensor (numpy array), the wrapped bits or rounded float per scalar.

    Raises:
        ValueError: wrong number of inputs.
        TypeError: an array where a scalar is expected or the reverse, a float
            for an integer argument.
        EvaluationError: an argument type the interpreter does not take.
    """
    fn = program.functions[function]
    if len(inputs) != len(fn.arg_types):
        raise ValueError(f"@{function} takes {len(fn.arg_types)} arguments, got {len(inputs)}")
    values: list = []
    for i, (ty, v) in enumerate(zip(fn.arg_types, inputs)):
        if ty == "!hal.buffer_view":
            if not hasattr(v, "shape"):
                raise TypeError(f"argument {i} is a tensor; pass a numpy array")
            values.append(Device.input(i, v))
            continue
        if hasattr(v, "shape") and np.ndim(v) != 0:
            raise TypeError(f"argument {i} has type {ty}; pass a scalar")
        w = int_width(ty)
        if w is not None:
            if isinstance(v, (float, np.floating)):
                raise TypeError(f"argument {i} has type {ty}; got float {v!r}")
            values.append(wrap(int(v), w))
        elif float_dtype(ty) is not None:
            values.append(round_float(float(v), ty))
        else:
            raise EvaluationError(f"argument {i} has type {ty}, which the interpreter "
                                  "does not take")
    return values


def so_for(comp: Compiled | None):
    """``so_for(executable, variant)``: the embedded-ELF file of an
    executable variant of ``comp``; without one (a bare ``.hal.mlir``), a
    placeholder path ``<executable>_<variant>.so``."""
    if comp is None:
        return lambda exe, variant: Path(f"{exe}_{variant}.so")
    return comp.so_for


def _host_result(m: Machine, value, ty: str):
    if ty == "!hal.buffer_view":
        if not isinstance(value, BufferView):
            raise EvaluationError(f"a result of type {ty} is {value!r}")
        dt = element_dtype(value.element_type)
        if dt is None:
            raise EvaluationError(f"a result has element type {value.element_type}, "
                                  "which numpy cannot hold")
        count = int(np.prod(value.shape, dtype=np.int64))
        buf = value.buffer
        if buf.storage.kind == "buffer" and count * dt.itemsize > (1 << 20):
            # a large allocation of this run is handed over, not copied
            view = m.device.view(buf, 0, buf.length, "a result")
            return np.frombuffer(view, dt, count).reshape(value.shape)
        data = m.device.read(buf, 0, buf.length, "a result")
        return np.frombuffer(data, dt, count).reshape(value.shape).copy()
    w = int_width(ty)
    if w is not None:
        if w == 1:
            return np.int32(value)
        return np.dtype(f"i{max(1, w // 8)}").type(signed(value, w))
    dt = float_dtype(ty)
    if dt is not None:
        return dt(value)
    return value


def run_program(compiled: Union[Compiled, str, os.PathLike], inputs: Sequence[Any],
                function: str | None = None, run_dispatch=None, *, modules=None,
                backend: str = "auto", arch: str | None = None, plugins=None,
                fill_byte: int = 0, max_ops: int = 200_000_000,
                memory_limit: int | None = None,
                timeout: float | None = None) -> ProgramRun:
    """Run a public function of a compiled program.

    Args:
        compiled: a :class:`~hal_cpu.iree.Compiled`, or a ``.hal.mlir``
            path (then dispatches name placeholder ``.so`` files and need a
            ``run_dispatch`` that does not load them).
        inputs: one per argument: numpy arrays for tensors, Python or numpy
            scalars for scalars.
        function: the public function; may be omitted when there is one.
        run_dispatch: ``run_dispatch(dispatch, bindings)`` runs every
            workgroup of a dispatch over one writable uint8 array per
            binding; default: a :class:`~hal_cpu.iree.PlanRunner` with
            ``backend``, ``arch`` and ``plugins``, closed on return.
        modules: host modules (a sequence, or a
            :class:`~hal_cpu.iree.ModuleRegistry`); the ``check`` module is
            built in.
        fill_byte: initial value of every byte the program allocates.
        max_ops: ops one function call may run (a guard against endless
            loops).
        memory_limit: bytes the run's allocations may take in all (default
            :func:`hal_cpu.arrays.default_memory_limit`); past it,
            :class:`~hal_cpu.iree.device.MemoryLimitError` naming the op and
            its line, before anything is allocated.
        timeout: seconds the host code may run (initializers and the
            function); past it, :class:`~hal_cpu.iree.errors.ProgramTimeoutError`
            naming the function, the op and its line, raised between two
            blocks (a call into a Python host module is not interrupted).
            Dispatches are bounded by ``run_dispatch`` (a
            :class:`~hal_cpu.iree.PlanRunner`'s ``timeout``).

    Returns:
        A :class:`ProgramRun`.

    Raises:
        ValueError, TypeError: as :func:`input_values`, or an input that the
            program's own checks reject (``hal.buffer_view.assert``).
        EvaluationError: an op the interpreter cannot run, a failed status
            of the program, a host module error (subclasses name the op and
            the user's source location).
        Whatever ``run_dispatch`` raises.
    """
    if run_dispatch is None:
        from .run import PlanRunner
        with PlanRunner(backend=backend, arch=arch, plugins=plugins) as runner:
            return run_program(compiled, inputs, function, runner, modules=modules,
                               fill_byte=fill_byte, max_ops=max_ops,
                               memory_limit=memory_limit, timeout=timeout)
    from .host_modules import ModuleRegistry
    program, comp = open_program(compiled)
    function = select_function(program, function)
    registry = modules if isinstance(modules, ModuleRegistry) else ModuleRegistry(modules or ())
    device = Device(run_dispatch, so_for(comp), fill_byte=fill_byte,
                    memory_limit=memory_limit)
    m = Machine(program, device, registry, comp.variant if comp else None, max_ops=max_ops)
    args = input_values(program, function, inputs)
    if timeout is not None:
        import time
        m.time_limit, m.deadline = timeout, time.monotonic() + timeout
    m.initialize()
    outs = m.call(function, args)
    fn = program.functions[function]
    results = [_host_result(m, v, t) for v, t in zip(outs, fn.result_types)]
    check = registry.module("check")
    failures = check.take_failures() if hasattr(check, "take_failures") else []
    used = {r.ref for step in device.trace for r in step_refs(step)
            if r.kind == "constant"}
    return ProgramRun(function, results, list(fn.result_types), list(device.trace),
                      dict(device.allocations), failures, m.ops_run,
                      {name: device.constants[name].array for name in used
                       if name in device.constants})
