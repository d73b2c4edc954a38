"""The IREE CPU executable ABI on top of :mod:`elfloader`: executable
libraries (query, exports, imports, workgroup dispatch), executable plugins
and the plugin manager."""

from . import abi
from .arrays import (AlignmentCopyWarning, PerformanceWarning, asarray, empty,
                     full, zeros)
from .errors import (BindingOverrunError, DispatchError, DispatchTimeoutError,
                     ExportNotFoundError, HalCpuError, LibraryError,
                     LocalMemoryOverrunError, NativeCrashError, OverrunError,
                     PluginError, PluginSpecError, PluginStatusError,
                     UnresolvedImportError)
from .library import Executable, Export

__all__ = ["Executable", "Export", "abi", "empty", "zeros", "full", "asarray",
           "PerformanceWarning", "AlignmentCopyWarning", "HalCpuError", "LibraryError",
           "ExportNotFoundError", "DispatchError", "DispatchTimeoutError",
           "UnresolvedImportError", "NativeCrashError", "OverrunError",
           "BindingOverrunError", "LocalMemoryOverrunError",
           "PluginError", "PluginStatusError", "PluginSpecError"]
