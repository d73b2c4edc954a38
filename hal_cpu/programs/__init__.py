"""The program path: whole IREE programs compiled and run on the VM.

``iree-compile`` (``llvm-cpu`` backend) turns a program into a ``.vmfb``
module that carries embedded-ELF HAL executables; the VM,
:mod:`hal_cpu.programs.vm`, runs it (a ``.vmfb``, or MLIR compiled here
first) over the ABI runtime (:mod:`hal_cpu`):

    >>> from hal_cpu.programs import compile_program, vm          # doctest: +SKIP
    >>> c = compile_program("matmul.mlir", "arm64")               # doctest: +SKIP
    >>> with vm.load_program(c) as program:                       # doctest: +SKIP
    ...     (out,) = program("matmul", a, b)
    >>> plan = vm.plan_program(c, [a, b])      # steps only       # doctest: +SKIP

* :mod:`~hal_cpu.programs.vm`: the VM (the ``.vmfb`` reader, bytecode, the
  ``hal`` module, plans);
* :mod:`~hal_cpu.programs.compiler`: finding the supported ``iree-compile``
  (:data:`SUPPORTED_VERSION`, package ``iree-base-compiler``; install with
  ``pip install 'portable-kernel-runtime[iree]'``) and compiling, cached by
  content hash;
* :mod:`~hal_cpu.programs.host_modules`: host modules a program imports
  (:class:`HostModule`, :func:`export` and IREE's statuses,
  :class:`StatusError` with a :class:`StatusCode`, in the leaf
  :mod:`~hal_cpu.programs.host_api`; the guide is ``docs/host-modules.md``);
  :mod:`~hal_cpu.programs.check`: the ``check`` module;
* :mod:`~hal_cpu.programs.scalars`: IREE's element type codes and scalar
  types;
* :mod:`~hal_cpu.programs.reference`: IREE's runtime as the reference
  (:func:`reference_run`).

Architecture names and aliases, and the compiler flags for each, come from
``fatelf.arches``. Importing this package does not import IREE's Python
packages; the functions that need them do.
"""

from typing import TYPE_CHECKING

from fatelf.lazy import lazy_attributes

# Public name -> the submodule defining it. Importing this package imports
# none of them: each is imported on first use of one of its names
# (PEP 562), so that a caller needing one leaf (``hal_cpu.programs.vm`` reading
# ``check`` or ``host_modules``) does not pay for the compiler driver.
_EXPORTS = {
    "compiler": ("BASE_FLAGS", "INSTALL_HINT", "SUPPORTED_VERSION", "Compiled",
                 "compile_many", "compile_program", "default_cache_dir",
                 "find_iree_compile", "iree_compile_version", "target_flags",
                 "variant_name"),
    "check": ("CheckModule",),
    "errors": ("CompileError", "EvaluationError", "IreeToolError"),
    "host_api": ("HOST_MODULE_ABI_VERSION", "HostCallError", "HostModule",
                 "HostModuleError", "RawTensor", "StatusCode", "StatusError",
                 "export"),
    "host_modules": ("ModuleRegistry", "load_module_spec"),
    "reference": ("reference_run",),
}
_SUBMODULES = frozenset({
    "check", "compiler", "errors", "host_api", "host_modules", "reference",
    "scalars", "vm"})


if TYPE_CHECKING:  # for type checkers and the API reference; not imported at run time
    from .check import CheckModule
    from .compiler import (
        BASE_FLAGS,
        INSTALL_HINT,
        SUPPORTED_VERSION,
        Compiled,
        compile_many,
        compile_program,
        default_cache_dir,
        find_iree_compile,
        iree_compile_version,
        target_flags,
        variant_name,
    )
    from .errors import CompileError, EvaluationError, IreeToolError
    from .host_api import (
        HOST_MODULE_ABI_VERSION,
        HostCallError,
        HostModule,
        HostModuleError,
        RawTensor,
        StatusCode,
        StatusError,
        export,
    )
    from .host_modules import ModuleRegistry, load_module_spec
    from .reference import reference_run


__getattr__, __dir__ = lazy_attributes(__name__, _EXPORTS, submodules=_SUBMODULES)


__all__ = [
    "SUPPORTED_VERSION", "INSTALL_HINT", "BASE_FLAGS",
    "Compiled", "compile_program", "compile_many", "find_iree_compile",
    "iree_compile_version", "default_cache_dir", "target_flags", "variant_name",
    "IreeToolError", "CompileError", "EvaluationError",
    "HostModule", "export", "ModuleRegistry", "HostModuleError", "HostCallError",
    "RawTensor", "load_module_spec", "HOST_MODULE_ABI_VERSION", "CheckModule",
    "StatusCode", "StatusError", "reference_run",
]
