"""Compile MLIR with ``iree-compile``, plan its dispatches from the HAL-level
IR, run them with :mod:`hal_cpu`, and compare with IREE's own runtime.

``iree-compile`` (``llvm-cpu`` backend) turns a program into a ``.vmfb``
module that carries embedded-ELF HAL executables; the host program in that
module computes, for each call, which exports to dispatch with which
workgroup counts, push constants and buffers. This package replays that host
program without IREE's runtime:

    >>> from hal_cpu import iree                                  # doctest: +SKIP
    >>> c = iree.compile_program("matmul.mlir", "arm64")          # doctest: +SKIP
    >>> plan = iree.plan_program(c, [a, b])                       # doctest: +SKIP
    >>> (out,) = iree.run_plan(plan, [a, b])                      # doctest: +SKIP

* :mod:`~hal_cpu.iree.compiler`: finding the supported ``iree-compile``
  (:data:`SUPPORTED_VERSION`, package ``iree-base-compiler``; install with
  ``pip install 'portable-kernel-runtime[iree]'``) and compiling, cached by
  content hash;
* :mod:`~hal_cpu.iree.hal_ir`: parsing the HAL-level IR;
* :mod:`~hal_cpu.iree.plan`: evaluating it into a :class:`ProgramPlan` of
  dispatches and transfers;
* :mod:`~hal_cpu.iree.run`: running a plan (:func:`run_plan`,
  :class:`PlanRunner`);
* :mod:`~hal_cpu.iree.reference`: IREE's runtime as the reference
  (:func:`reference_run`).

Architecture names and aliases, and the compiler flags for each, come from
``fatelf.arches``. Importing this package does not import IREE's Python
packages; the functions that need them do.
"""

from .compiler import (BASE_FLAGS, INSTALL_HINT, SUPPORTED_VERSION, Compiled,
                       compile_many, compile_program, default_cache_dir,
                       find_iree_compile, iree_compile_version, target_flags,
                       variant_name)
from .errors import CompileError, EvaluationError, IreeToolError
from .hal_ir import Module, load_module, parse_module
from .plan import (NO_EFFECT_OPS, BindingRef, CopyStep, Dispatch, FillStep,
                   ProgramPlan, ResultRef, plan_dispatches, plan_program)
from .reference import reference_run
from .run import PlanRunner, run_plan

__all__ = [
    "SUPPORTED_VERSION", "INSTALL_HINT", "BASE_FLAGS",
    "Compiled", "compile_program", "compile_many", "find_iree_compile",
    "iree_compile_version", "default_cache_dir", "target_flags", "variant_name",
    "IreeToolError", "CompileError", "EvaluationError",
    "Module", "parse_module", "load_module",
    "BindingRef", "Dispatch", "FillStep", "CopyStep", "ResultRef", "ProgramPlan",
    "NO_EFFECT_OPS", "plan_program", "plan_dispatches",
    "PlanRunner", "run_plan", "reference_run",
]
