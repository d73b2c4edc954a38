"""Runs iree_tools plans through our runtime."""

from __future__ import annotations

from hal_cpu import Executable


class PlanRunner:
    """run_dispatch callback for iree_tools.run_plan that keeps one
    Executable per .so for the whole plan."""

    def __init__(self, backend="auto", arch=None, plugins=None):
        self.backend, self.arch, self.plugins = backend, arch, plugins
        self.executables: dict = {}
        self.calls = 0

    def __call__(self, dispatch, bindings):
        exe = self.executables.get(dispatch.so_path)
        if exe is None:
            exe = self.executables[dispatch.so_path] = Executable(
                dispatch.so_path, backend=self.backend, arch=self.arch,
                plugins=self.plugins)
        exe.dispatch(dispatch.export_name, dispatch.workgroup_count, bindings,
                     dispatch.constants)
        self.calls += 1

    def close(self):
        for exe in self.executables.values():
            exe.close()
        self.executables.clear()
