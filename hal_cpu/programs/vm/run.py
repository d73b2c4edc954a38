"""Running a plan (:func:`hal_cpu.programs.vm.plan_program`'s steps): buffers and
transfers with numpy, dispatches through :meth:`hal_cpu.Executable.dispatch`
(or any callback).

A plan is data: a caller may run its dispatches with its own kernels
(numpy stand-ins, a thread pool, a checker between steps) or through this
runtime's executables (:class:`PlanRunner`). A program's own calls run on
the VM (:func:`hal_cpu.programs.vm.load_program`); this runs what a record-only call
listed, in the same order.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from ...arrays import empty as aligned_empty
from ...arrays import fill_pattern
from ...arrays import full as aligned_full
from ...errors import DispatchTimeoutError
from .refs import VmError
from .steps import BindingRef, Dispatch, FillStep, ProgramPlan

__all__ = ["PlanRunner", "run_plan"]

#: ``run_dispatch(dispatch, bindings)``: runs every workgroup of ``dispatch``
#: over ``bindings`` (one writable uint8 array per binding).
RunDispatch = Callable[[Dispatch, list[np.ndarray]], None]


class PlanRunner:
    """A ``run_dispatch`` callback for :func:`run_plan` that dispatches with
    :class:`hal_cpu.Executable`, keeping one loaded executable per ``.so``
    until :meth:`close`.

    Args:
        backend: ``"auto"``, ``"native"`` or ``"emulated"`` (as
            :class:`hal_cpu.Executable`).
        arch: architecture (name or alias) of the executables, or None to
            take it from each ELF.
        plugins: a :class:`hal_cpu.plugins.PluginManager` resolving imports,
            or None.
        workers: host threads per dispatch (as
            :meth:`hal_cpu.Executable.dispatch`; default: the CPUs this
            process may use).
        timeout: seconds all dispatches of this runner may take together,
            counted from its first dispatch; None: no limit.
        progress: ``progress(done, total)`` in workgroups, summed over the
            dispatches run so far; ``total`` is ``total_workgroups`` when
            given, else the workgroups of the dispatches so far.
        total_workgroups: workgroups of every dispatch to come (e.g. the sum
            over a plan's dispatches), for ``progress``.

    Attributes:
        calls: dispatches run so far.
        workgroups_done: workgroups of the dispatches run so far.
        executables: ``so_path`` -> loaded :class:`hal_cpu.Executable`.

    Use as a context manager, or call :meth:`close`. Errors of loading and
    dispatching (:class:`hal_cpu.HalCpuError`, :class:`elfloader` errors)
    propagate unchanged; :class:`hal_cpu.errors.DispatchTimeoutError` when
    ``timeout`` has passed.
    """

    def __init__(self, backend: str = "auto", arch: str | None = None, plugins=None,
                 *, workers: int | None = None, timeout: float | None = None,
                 progress: Callable[[int, int], None] | None = None,
                 total_workgroups: int | None = None):
        self.backend, self.arch, self.plugins = backend, arch, plugins
        self.workers, self.timeout, self.progress = workers, timeout, progress
        self.total_workgroups = total_workgroups
        self.executables: dict[Path, Any] = {}
        self.calls = 0
        self.workgroups_done = 0
        self._deadline: float | None = None

    def __call__(self, dispatch: Dispatch, bindings: list[np.ndarray]) -> None:
        from ...library import Executable

        exe = self.executables.get(dispatch.so_path)
        if exe is None:
            exe = self.executables[dispatch.so_path] = Executable(
                dispatch.so_path, backend=self.backend, arch=self.arch,
                plugins=self.plugins)
        kwargs: dict[str, Any] = {}
        if self.workers is not None:
            kwargs["workers"] = self.workers
        if self.timeout is not None:
            now = time.monotonic()
            if self._deadline is None:
                self._deadline = now + self.timeout
            left = self._deadline - now
            if left <= 0:
                raise DispatchTimeoutError(
                    f"the time limit of {self.timeout:g} s passed before "
                    f"dispatch {self.calls} ({dispatch.export_name})",
                    name=str(dispatch.so_path), field="timeout", value=self.timeout)
            kwargs["timeout"] = left
        if self.progress is not None:
            before, report = self.workgroups_done, self.progress

            def progress(done: int, total: int) -> None:
                report(before + done, self.total_workgroups or before + total)
            kwargs["progress"] = progress
        exe.dispatch(dispatch.export_name, dispatch.workgroup_count, bindings,
                     dispatch.constants, **kwargs)
        x, y, z = dispatch.workgroup_count
        self.workgroups_done += x * y * z
        self.calls += 1

    def close(self) -> None:
        """Unload every executable."""
        for exe in self.executables.values():
            exe.close()
        self.executables.clear()

    def __enter__(self) -> "PlanRunner":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def run_plan(plan: ProgramPlan, inputs: Sequence[Any],
             run_dispatch: RunDispatch | None = None, *, fill_byte: int = 0,
             backend: str = "auto", arch: str | None = None,
             plugins=None) -> list[np.ndarray]:
    """Execute a plan: allocate its buffers, run each step, return the results.

    Args:
        plan: from :func:`hal_cpu.programs.vm.plan_program` for the same ``inputs``.
        inputs: the arrays and scalars the plan was made for. Input arrays are
            copied first, so kernels cannot modify the caller's arrays.
        run_dispatch: ``run_dispatch(dispatch, bindings)`` receives each
            :class:`Dispatch` and one writable uint8 numpy view per binding
            (exactly ``offset:offset+length`` of the underlying buffer) and
            must run every workgroup. Default: a :class:`PlanRunner` with
            ``backend``, ``arch`` and ``plugins``, closed on return.
        fill_byte: initial value of every byte of the transient buffers.

    Returns:
        One new numpy array per function result, with the plan's shapes and
        dtypes.

    Raises:
        hal_cpu.programs.vm.VmError: a binding lies outside its buffer (``field``
            ``binding``, ``value`` the step's byte range).
        Whatever ``run_dispatch`` raises.
    """
    if run_dispatch is None:
        with PlanRunner(backend=backend, arch=arch, plugins=plugins) as runner:
            return run_plan(plan, inputs, runner, fill_byte=fill_byte)

    # 64-byte-aligned storage (as IREE's heap buffers are): bindings at
    # aligned offsets are used in place by a native dispatch.
    storage: dict[tuple[str, Any], np.ndarray] = {}
    for i, v in enumerate(inputs):
        if hasattr(v, "shape"):
            data = np.ascontiguousarray(v)
            copy = storage[("input", i)] = aligned_empty(data.nbytes, np.uint8)
            copy[:] = data.reshape(-1).view(np.uint8)
    for name, size in plan.buffers.items():
        storage[("buffer", name)] = aligned_full(size, fill_byte, np.uint8)
    for name, data in plan.constants.items():
        data = np.asarray(data, np.uint8).reshape(-1)
        copy = storage[("constant", name)] = aligned_empty(data.nbytes, np.uint8)
        copy[:] = data

    def view(b: BindingRef) -> np.ndarray:
        buf = storage[(b.kind, b.ref)]
        if b.offset < 0 or b.offset + b.length > buf.size:
            raise VmError(f"binding {b} outside its buffer of {buf.size} bytes",
                          name=plan.function, field="binding",
                          value=(b.offset, b.length))
        return buf[b.offset:b.offset + b.length]

    for step in plan.steps:
        if isinstance(step, Dispatch):
            run_dispatch(step, [view(b) for b in step.bindings])
        elif isinstance(step, FillStep):
            t = view(step.target)
            fill_pattern(t, step.pattern)
        else:
            view(step.target)[:] = view(step.source).copy()

    return [view(r.storage).view(r.dtype).reshape(r.shape).copy() for r in plan.results]
