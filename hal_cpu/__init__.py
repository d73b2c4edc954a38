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

from typing import TYPE_CHECKING

from fatelf.lazy import lazy_attributes

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


__getattr__, __dir__ = lazy_attributes(__name__, _EXPORTS)


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
