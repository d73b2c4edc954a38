"""IREE VM bytecode modules (``.vmfb``) as programs: read, link, run.

A ``.vmfb`` from ``iree-compile`` is a stored ZIP whose first member,
``module.fb``, is a size-prefixed FlatBuffer (file identifier ``IREE``;
schema facts from IREE's ``runtime/src/iree/schemas/bytecode_module_def.fbs``)
holding the module's types, imports, exports, functions (VM bytecode,
version 17.0: ``runtime/src/iree/vm/bytecode/isa/isa.json``), read-only
data (the embedded executables among them) and globals. This package runs
such a module as IREE's VM does, with the HAL module's imports served by
:mod:`hal_cpu` (executables run natively or emulated) and host modules
linked by name.

Parts, one job each:

* :mod:`~hal_cpu.programs.vm.module_def`: the FlatBuffer, read and verified into
  plain records (:class:`~hal_cpu.programs.vm.module_def.ModuleDef`); every offset,
  count and length is checked against the file before use.
* :mod:`~hal_cpu.programs.vm.isa`: the bytecode's opcodes and operand encodings, as
  data; :mod:`~hal_cpu.programs.vm.decode`: bytes to instructions.
* :mod:`~hal_cpu.programs.vm.translate`: a function's instructions to one Python
  function, built once per function at load (no per-op dispatch at run
  time).
* :mod:`~hal_cpu.programs.vm.refs`: the VM's own ref types (``!vm.buffer``,
  ``!vm.list``) and the status error ``vm.fail`` raises.
* :mod:`~hal_cpu.programs.vm.hal_module`: the ``hal`` module's exports
  (``runtime/src/iree/modules/hal/exports.inl``: names and calling
  conventions) over :mod:`hal_cpu`'s executables.
* :mod:`~hal_cpu.programs.vm.program`: linking modules and calling functions
  (:func:`load_program`: a ``.vmfb``, or MLIR compiled first).
* :mod:`~hal_cpu.programs.vm.plan`: a record-only call: the steps a call submits
  (:mod:`~hal_cpu.programs.vm.steps`: dispatches, fills, copies as data), not run
  (:func:`plan_program`; :class:`DataDependenceError` when the host program
  reads what a step computes); :mod:`~hal_cpu.programs.vm.run`: running a plan's
  steps (:func:`run_plan`; dispatches through :class:`PlanRunner`, which
  calls :meth:`hal_cpu.Executable.dispatch`, or a caller's kernels).

The calling convention inside this package (one for bytecode functions,
imports, the HAL module and host modules):

* values: ``i`` (i32) and ``I`` (i64) are Python ints in the signed range
  of their width; ``f``/``F`` Python floats (f32 values already rounded to
  f32); ``r`` any Python object or None (a null ref).
* a function with calling convention ``0<args>_<results>`` is called as
  ``fn(*args)``; a variadic segment ``C<types>D`` is passed as one
  argument, a tuple of tuples (one per element, in ``<types>`` order; a
  one-type segment still gives 1-tuples); results: ``v`` -> None, one
  result -> the value, several -> a tuple.
"""

from typing import TYPE_CHECKING

from fatelf.lazy import lazy_attributes

# Public name -> the module of this package defining it, imported when the
# name is first read (PEP 562): reading a .vmfb's header (``.vmfb``) or
# running a program does not import the planner, the plan runner and
# their records.
_EXPORTS = {
    "plan": ("DataDependenceError", "Recording", "plan_program"),
    "program": ("Function", "LinkError", "Program", "load_program"),
    "refs": ("VmBuffer", "VmError", "VmList", "VmStatusError"),
    "run": ("PlanRunner", "run_plan"),
    "steps": ("BindingRef", "CopyStep", "Dispatch", "FillStep", "ProgramPlan",
              "ResultRef"),
}

if TYPE_CHECKING:
    from .plan import DataDependenceError, Recording, plan_program
    from .program import Function, LinkError, Program, load_program
    from .refs import VmBuffer, VmError, VmList, VmStatusError
    from .run import PlanRunner, run_plan
    from .steps import (
        BindingRef,
        CopyStep,
        Dispatch,
        FillStep,
        ProgramPlan,
        ResultRef,
    )

__getattr__, __dir__ = lazy_attributes(__name__, _EXPORTS)

__all__ = ["load_program", "Program", "Function", "LinkError", "VmError",
           "VmStatusError", "VmBuffer", "VmList", "plan_program", "Recording",
           "DataDependenceError", "BindingRef", "CopyStep", "Dispatch",
           "FillStep", "ProgramPlan", "ResultRef", "PlanRunner", "run_plan"]
