"""Plans: the dispatches and transfers one call of a function submits.

:func:`plan_program` runs the host program (:mod:`hal_cpu.iree.machine`) on
a device that records each dispatch, fill and copy instead of running it,
for concrete input shapes and scalars. That works for programs whose steps
do not depend on computed data; a program whose host code reads a result
(``hal.buffer.load`` of a dispatch's output, feeding a workgroup count, a
branch or a loop) has no plan without running, and planning it raises
:class:`~hal_cpu.iree.device.DataDependenceError` naming the op that wanted
the data. :func:`hal_cpu.iree.run_program` runs any program and returns the
trace of what ran, in the same step types.

How data flows through a plan
-----------------------------
Function arguments of tensor type arrive as buffer views whose storage is
``BindingRef(kind='input', ref=N, ...)`` (N = argument index, the caller's
array in C order). Results and intermediates live in allocations of the
program (``hal.device.queue.alloca``; ``kind='buffer'``, ``ref`` = the SSA
name without ``%``; :attr:`ProgramPlan.buffers` gives each one's size);
constant data the module carries lives in ``kind='constant'`` storage whose
bytes :attr:`ProgramPlan.constants` holds. One allocation often holds several
values, e.g. a program returning a matmul and its row sums binds one
allocation twice with the offsets baked into the kernel. After the last
step each result is a range of some storage (:attr:`ProgramPlan.results`).
:func:`plan_dispatches` refuses programs that also transfer data, so that a
caller cannot silently skip a transfer.
"""

from __future__ import annotations

import os
from typing import Any, Sequence, Union

from .compiler import Compiled
from .errors import EvaluationError
from .steps import BindingRef, CopyStep, Dispatch, FillStep, ProgramPlan, ResultRef, step_refs

__all__ = [
    "BindingRef", "Dispatch", "FillStep", "CopyStep", "ResultRef", "ProgramPlan",
    "plan_program", "plan_dispatches",
]


def plan_program(compiled: Union[Compiled, str, os.PathLike], inputs: Sequence[Any],
                 function: str | None = None, *, modules=None) -> ProgramPlan:
    """The steps one call of a public function submits, for concrete inputs,
    without running any.

    Args:
        compiled: a :class:`~hal_cpu.iree.Compiled`, or the path of a
            ``.hal.mlir`` file (then :attr:`Dispatch.so_path` values are
            placeholders).
        inputs: one per function argument: numpy arrays (any object with
            ``shape`` and ``dtype``) for tensor arguments, Python or numpy
            scalars for scalar ones. Only shapes, dtypes and scalar values are
            read, unless the host code reads an input's data.
        function: the public function; may be omitted when there is one.
        modules: host modules the program imports (see
            :func:`hal_cpu.iree.run_program`).

    Returns:
        The :class:`ProgramPlan`.

    Raises:
        ValueError: no such public function, wrong number of inputs, or an
            input whose shape or dtype the program's own checks
            (``hal.buffer_view.assert``) reject.
        TypeError: an array where a scalar is expected or the reverse, or a
            float for an integer argument.
        DataDependenceError: the steps depend on computed data (names the
            op that reads it and its source location).
        EvaluationError: an op the interpreter cannot run, and the rest of
            :func:`hal_cpu.iree.run_program`'s errors.
    """
    from .device import BufferView, DataDependenceError, Device
    from .host_modules import ModuleRegistry
    from .machine import Machine
    from .program import input_values, open_program, select_function, so_for
    from .scalars import element_dtype
    program, comp = open_program(compiled)
    function = select_function(program, function)
    registry = modules if isinstance(modules, ModuleRegistry) else ModuleRegistry(modules or ())
    device = Device(None, so_for(comp), execute=False)
    m = Machine(program, device, registry, comp.variant if comp else None)
    args = input_values(program, function, inputs)
    m.initialize()
    outs = m.call(function, args)
    fn = program.functions[function]
    results = []
    for k, (v, ty) in enumerate(zip(outs, fn.result_types)):
        if not isinstance(v, BufferView):
            raise DataDependenceError(f"result {k} of @{function} is a {ty} scalar, "
                                      "which only a run computes", path=program.path)
        dt = element_dtype(v.element_type)
        if dt is None:
            raise EvaluationError(f"result {k} has element type {v.element_type}, which "
                                  "numpy cannot hold", path=program.path)
        b = v.buffer
        results.append(ResultRef(BindingRef(b.storage.kind, b.storage.ref, b.offset, b.length),
                                 v.shape, dt))
    # (a constant's ref is its name)
    used = {str(r.ref) for s in device.trace for r in step_refs(s) if r.kind == "constant"}
    used |= {str(r.storage.ref) for r in results if r.storage.kind == "constant"}
    constants = {name: device.constants[name].array for name in used}
    return ProgramPlan(function, list(device.trace), dict(device.allocations), results,
                       constants)


def plan_dispatches(compiled: Union[Compiled, str, os.PathLike], inputs: Sequence[Any],
                    function: str | None = None) -> list[Dispatch]:
    """The dispatches of ``compiled`` for ``inputs``, in execution order
    (arguments as :func:`plan_program`).

    Raises:
        EvaluationError: the program also performs buffer transfers (use
            :func:`plan_program` and :func:`hal_cpu.iree.run_plan` for those),
            or as :func:`plan_program`.
        ValueError, TypeError: as :func:`plan_program`.
    """
    plan = plan_program(compiled, inputs, function)
    others = [s for s in plan.steps if not isinstance(s, Dispatch)]
    if others:
        raise EvaluationError(f"@{plan.function} also performs transfers {others}; "
                              "use plan_program()")
    return plan.dispatches
