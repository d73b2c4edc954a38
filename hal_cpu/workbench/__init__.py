"""The kernel author's workbench: a kernel sanitizer and deterministic
instruction counts of emulated dispatches (qemu engine; a TCG plugin of
the project's own, :mod:`elfloader.backend.emulated.tcg_plugin`).

```python
from hal_cpu import workbench
with workbench.Session(sanitize=True, count=True) as wb:
    exe = hal_cpu.load("kernels.so", backend="emulated", engine="qemu")
    exe.dispatch("add", (4, 1, 1), [a, b, out], workers=1)
print(wb.reports[0].text())
```

A session must be open when the executable is loaded (its engine's agents
then load the plugin) and while it dispatches; see
:class:`~hal_cpu.workbench.session.Session`.
"""

from .report import (
    KINDS,
    DispatchReport,
    Finding,
    FindingsError,
    WorkbenchError,
    write_counts,
)
from .session import Session

__all__ = ["KINDS", "DispatchReport", "Finding", "FindingsError", "Session",
           "WorkbenchError", "write_counts"]
