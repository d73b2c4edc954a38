"""Compile MLIR with ``iree-compile``, run its host program with
:mod:`hal_cpu`, and compare with IREE's own runtime.

``iree-compile`` (``llvm-cpu`` backend) turns a program into a ``.vmfb``
module that carries embedded-ELF HAL executables; the host program in that
module computes, for each call, which exports to dispatch with which
workgroup counts, push constants and buffers, reads results back, branches
and calls host modules. This package interprets that host program (its
HAL-level IR) without IREE's runtime:

    >>> from hal_cpu import iree                                  # doctest: +SKIP
    >>> c = iree.compile_program("matmul.mlir", "arm64")          # doctest: +SKIP
    >>> run = iree.run_program(c, [a, b])                         # doctest: +SKIP
    >>> (out,) = run.results                                      # doctest: +SKIP
    >>> plan = iree.plan_program(c, [a, b])    # steps only       # doctest: +SKIP

* :mod:`~hal_cpu.iree.compiler`: finding the supported ``iree-compile``
  (:data:`SUPPORTED_VERSION`, package ``iree-base-compiler``; install with
  ``pip install 'portable-kernel-runtime[iree]'``) and compiling, cached by
  content hash;
* :mod:`~hal_cpu.iree.reader`: reading the HAL-level IR with IREE's MLIR
  bindings (``iree.compiler.ir``);
* :mod:`~hal_cpu.iree.machine` and :mod:`~hal_cpu.iree.optable` (handlers in
  ``ops_scalar``, ``ops_control``, ``ops_util``, ``ops_hal``; the
  terminators' tags in ``control``): the interpreter;
  :mod:`~hal_cpu.iree.device`: buffers and the queue;
* :mod:`~hal_cpu.iree.program`: running a function (:func:`run_program`);
* :mod:`~hal_cpu.iree.host_modules`: host modules a program imports
  (:class:`HostModule` and :func:`export` in the leaf
  :mod:`~hal_cpu.iree.host_api`); :mod:`~hal_cpu.iree.check`: the ``check``
  module;
* :mod:`~hal_cpu.iree.steps`: dispatches, fills, copies and plans as data;
  :mod:`~hal_cpu.iree.plan`: the steps of a call without running them
  (:func:`plan_program`); :mod:`~hal_cpu.iree.run`: running a plan
  (:func:`run_plan`, :class:`PlanRunner`);
* :mod:`~hal_cpu.iree.reference`: IREE's runtime as the reference
  (:func:`reference_run`).

Architecture names and aliases, and the compiler flags for each, come from
``fatelf.arches``. Importing this package does not import IREE's Python
packages; the functions that need them do.
"""

import importlib

# Public name -> the submodule defining it. Importing this package imports
# none of them: each is imported on first use of one of its names
# (PEP 562), so that a caller needing one leaf (``hal_cpu.vm`` reading
# ``check`` or ``host_modules``) does not pay for the compiler driver, the
# MLIR reader and the interpreter.
_EXPORTS = {
    "compiler": ("BASE_FLAGS", "INSTALL_HINT", "SUPPORTED_VERSION", "Compiled",
                 "compile_many", "compile_program", "default_cache_dir",
                 "find_iree_compile", "iree_compile_version", "target_flags",
                 "variant_name"),
    "check": ("CheckModule",),
    "device": ("DataDependenceError",),
    "errors": ("CompileError", "EvaluationError", "IreeToolError"),
    "host_api": ("HOST_MODULE_ABI_VERSION", "HostCallError", "HostModule",
                 "HostModuleError", "RawTensor", "export"),
    "host_modules": ("ModuleRegistry", "load_module_spec"),
    "machine": ("UnsupportedOpError",),
    "ops_control": ("ProgramStatusError",),
    "plan": ("plan_dispatches", "plan_program"),
    "program": ("ProgramRun", "run_program"),
    "reader": ("Program", "load_program", "parse_program"),
    "reference": ("reference_run",),
    "run": ("PlanRunner", "run_plan"),
    "steps": ("BindingRef", "CopyStep", "Dispatch", "FillStep", "ProgramPlan",
              "ResultRef"),
}
_WHERE = {name: module for module, names in _EXPORTS.items() for name in names}
_SUBMODULES = frozenset({
    "check", "compiler", "control", "device", "errors", "host_api", "host_modules",
    "machine", "ops_control", "ops_hal", "ops_scalar", "ops_util", "optable", "plan",
    "program", "reader", "reference", "run", "scalars", "steps"})


def __getattr__(name: str):
    module = _WHERE.get(name)
    if module is not None:
        return getattr(importlib.import_module(f"{__name__}.{module}"), name)
    if name in _SUBMODULES:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_WHERE) | _SUBMODULES)


__all__ = [
    "SUPPORTED_VERSION", "INSTALL_HINT", "BASE_FLAGS",
    "Compiled", "compile_program", "compile_many", "find_iree_compile",
    "iree_compile_version", "default_cache_dir", "target_flags", "variant_name",
    "IreeToolError", "CompileError", "EvaluationError", "UnsupportedOpError",
    "DataDependenceError", "ProgramStatusError",
    "Program", "parse_program", "load_program",
    "ProgramRun", "run_program",
    "HostModule", "export", "ModuleRegistry", "HostModuleError", "HostCallError",
    "RawTensor", "load_module_spec", "HOST_MODULE_ABI_VERSION", "CheckModule",
    "BindingRef", "Dispatch", "FillStep", "CopyStep", "ResultRef", "ProgramPlan",
    "plan_program", "plan_dispatches",
    "PlanRunner", "run_plan", "reference_run",
]
