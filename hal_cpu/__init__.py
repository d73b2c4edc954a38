"""The IREE CPU executable ABI on top of :mod:`elfloader`: executable
libraries (query, exports, imports, workgroup dispatch), executable plugins
and the plugin manager.

On top of this runtime, one subpackage per job, none imported here:
:mod:`hal_cpu.programs` (whole programs: the compiler driver, host modules,
the VM :mod:`hal_cpu.programs.vm`), :mod:`hal_cpu.testing` (the test
harness and pytest plugin), :mod:`hal_cpu.buildtools` (zig, runtime and
sample builds) and :mod:`hal_cpu.cli` (``hal-cpu``).

Importing the package imports none of its modules: each public name is
imported on first use (``hal_cpu.Executable`` imports
:mod:`hal_cpu.library`), so ``hal-cpu --help`` and a leaf that needs one
module do not pay for numpy and the rest."""

import importlib
from typing import TYPE_CHECKING

# Public name -> the module of this package defining it. Importing the
# package imports none of them (numpy among their imports): each is
# imported on first use of one of its names (PEP 562), so that a command
# line or a leaf that needs one of them does not pay for the rest.
_EXPORTS = {
    "arrays": ("AlignmentCopyWarning", "PerformanceWarning", "asarray", "empty",
               "full", "zeros"),
    "errors": ("BindingOverrunError", "BindingUnderrunError", "CallTimeoutError",
               "DispatchError", "DispatchTimeoutError", "ExportNotFoundError",
               "HalCpuError", "LibraryError", "LocalMemoryOverrunError",
               "NativeCrashError", "OverrunError", "PluginError", "PluginSpecError",
               "PluginStatusError", "UnresolvedImportError"),
    "library": ("Executable", "Export"),
}
_WHERE = {name: module for module, names in _EXPORTS.items() for name in names}

if TYPE_CHECKING:
    from . import abi
    from .arrays import AlignmentCopyWarning, PerformanceWarning, asarray, empty, full, zeros
    from .errors import (
        BindingOverrunError,
        BindingUnderrunError,
        CallTimeoutError,
        DispatchError,
        DispatchTimeoutError,
        ExportNotFoundError,
        HalCpuError,
        LibraryError,
        LocalMemoryOverrunError,
        NativeCrashError,
        OverrunError,
        PluginError,
        PluginSpecError,
        PluginStatusError,
        UnresolvedImportError,
    )
    from .library import Executable, Export


def __getattr__(name: str):
    module = _WHERE.get(name)
    if module is not None:
        value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
        globals()[name] = value
        return value
    if not name.startswith("__"):
        # a submodule (``hal_cpu.abi``, ``hal_cpu.library``...) as an attribute
        try:
            return importlib.import_module(f"{__name__}.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"{__name__}.{name}":
                raise
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_WHERE) | {"abi"})


def get_include() -> str:
    """Directory holding the C headers of IREE's executable plugin ABI
    (version 0x1) for writing plugins: ``iree/hal/local/executable_plugin.h``
    (IREE's header path and names, so plugins written for IREE build
    unmodified) and ``plugin_abi.h`` (that header and this project's
    helpers). Pass it as ``-I`` to the compiler (as ``numpy.get_include()``
    is used); ``hal-cpu build-plugin`` does."""
    import os
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "include")


__all__ = ["Executable", "Export", "abi", "empty", "zeros", "full", "asarray",
           "PerformanceWarning", "AlignmentCopyWarning", "HalCpuError", "LibraryError",
           "ExportNotFoundError", "DispatchError", "DispatchTimeoutError",
           "UnresolvedImportError", "NativeCrashError", "OverrunError",
           "BindingOverrunError", "BindingUnderrunError", "CallTimeoutError",
           "LocalMemoryOverrunError", "get_include",
           "PluginError", "PluginStatusError", "PluginSpecError"]
