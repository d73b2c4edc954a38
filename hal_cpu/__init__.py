"""The IREE CPU executable ABI on top of :mod:`elfloader`: executable
libraries (query, exports, imports, workgroup dispatch), executable plugins
and the plugin manager.

On top of this runtime, one subpackage per job, none imported here:
:mod:`hal_cpu.programs` (whole programs: the compiler driver, host modules,
the VM :mod:`hal_cpu.programs.vm`), :mod:`hal_cpu.testing` (the test
harness and pytest plugin), :mod:`hal_cpu.buildtools` (zig, runtime and
sample builds) and :mod:`hal_cpu.cli` (``hal-cpu``)."""

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


def get_include() -> str:
    """Directory holding ``plugin_abi.h``, the C header of IREE's executable
    plugin ABI (version 0x1) for writing plugins: pass it as ``-I`` to the
    compiler (as ``numpy.get_include()`` is used)."""
    import os
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "include")


__all__ = ["Executable", "Export", "abi", "empty", "zeros", "full", "asarray",
           "PerformanceWarning", "AlignmentCopyWarning", "HalCpuError", "LibraryError",
           "ExportNotFoundError", "DispatchError", "DispatchTimeoutError",
           "UnresolvedImportError", "NativeCrashError", "OverrunError",
           "BindingOverrunError", "BindingUnderrunError", "CallTimeoutError",
           "LocalMemoryOverrunError", "get_include",
           "PluginError", "PluginStatusError", "PluginSpecError"]
