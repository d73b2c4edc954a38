"""One call of a program recorded once and replayed without the VM: the
dispatches, fills and copies the call submits, run again on the same
buffers (``hal-cpu benchmark-module --replay``).

A record-only call (:mod:`hal_cpu.programs.vm.plan`) runs the program's
host code once on the VM with the ``hal`` module recording, not running,
what it submits; :func:`record_replay` keeps those steps with the host
addresses of the buffers they touch (the call's own buffers, kept alive).
:meth:`Replay.run` then runs them in order: consecutive native dispatches
in one crossing (:class:`hal_cpu.dispatch_policy.DispatchBatch`), the
others through :meth:`hal_cpu.dispatch_policy.PreparedDispatch.run_addresses`
(every check of a dispatch kept), fills and copies by the host. This is
the work one call of the function does on the device, without the host
program around it (allocations, fences, the VM's bytecode): a call whose
steps depend on computed data, that calls a host module, reads a buffer
a step writes or writes host data into one has no replay
(:class:`NoReplayError`).

    >>> replay = record_replay(program.function("predict"), [x])   # doctest: +SKIP
    >>> replay.run()                                               # doctest: +SKIP
    >>> replay.results()[0]                                        # doctest: +SKIP
"""

from __future__ import annotations

import ctypes
from typing import Sequence

import numpy as np

from ...dispatch_policy import DispatchBatch
from ...errors import DispatchError
from .hal_module import ELEMENT_DTYPES, BufferView
from .plan import Recording
from .refs import VmError

__all__ = ["NoReplayError", "Replay", "record_replay"]

_memmove = ctypes.memmove
_memset = ctypes.memset


class NoReplayError(VmError):
    """The call cannot be replayed without the VM (the message says why)."""


class _Capture(Recording):
    """A recording that also keeps each step with host addresses."""

    def __init__(self):
        Recording.__init__(self, lambda executable: ("", "", ""))
        #: ("dispatch", executable, ordinal, grid, constants,
        #: [(address, length)]), ("fill", address, length, pattern),
        #: ("copy", source address, target address, length)
        self.captured: list[tuple] = []
        self.loaded_roots: list = []
        self.written_roots: list = []
        #: every buffer a step addresses (kept alive by the replay)
        self.roots: list = []

    def dispatch(self, executable, ordinal, grid, constants, bindings) -> None:
        Recording.dispatch(self, executable, ordinal, grid, constants, bindings)
        self.captured.append(("dispatch", executable, int(ordinal),
                              tuple(int(g) for g in grid),
                              [int(c) & 0xFFFFFFFF for c in constants],
                              [(b.address + off, int(n)) for b, off, n in bindings]))
        self.written_roots += [b.root for b, _, _ in bindings]
        self.roots += [b.root for b, _, _ in bindings]

    def fill(self, buffer, offset, length, pattern) -> None:
        Recording.fill(self, buffer, offset, length, pattern)
        self.captured.append(("fill", buffer.address + offset, int(length),
                              bytes(pattern)))
        self.written_roots.append(buffer.root)
        self.roots.append(buffer.root)

    def copy(self, source, target) -> None:
        Recording.copy(self, source, target)
        (sb, so, sn), (tb, to, tn) = source, target
        self.captured.append(("copy", sb.address + so, tb.address + to,
                              int(min(sn, tn))))
        self.written_roots.append(tb.root)
        self.roots += [sb.root, tb.root]

    def load(self, buffer) -> None:
        Recording.load(self, buffer)
        self.loaded_roots.append(buffer.root)


class Replay:
    """The steps of one recorded call, runnable again (see the module).

    Attributes:
        steps: the steps in order: ``("batch", DispatchBatch)``,
            ``("dispatch", PreparedDispatch, pointers, lengths)``,
            ``("fill", address, length, pattern)``,
            ``("copy", source, target, length)``.
        dispatches: dispatches per run.
        crossings: crossings into dispatches per run (a batch counts once).
    """

    def __init__(self, steps: list, keep: list, results: list, program):
        self.steps = steps
        self._keep = keep               # (the buffers the steps address)
        self._results = results
        self._program = program
        self.dispatches = sum(len(s[1].items) if s[0] == "batch" else
                              1 if s[0] == "dispatch" else 0 for s in steps)
        self.crossings = sum(1 for s in steps if s[0] in ("batch", "dispatch"))

    def run(self) -> None:
        """Run the steps once.

        Raises:
            VmError: the program was closed.
            DispatchError (and the other errors of
                :meth:`hal_cpu.dispatch_policy.PreparedDispatch.run`): a
                dispatch failed.
        """
        if self._program.closed:
            raise VmError("the program is closed", name=self._program.label,
                          field="replay", value=None)
        for step in self.steps:
            kind = step[0]
            if kind == "batch":
                batch = step[1]
                if not batch.run(step[2]):
                    for prepared, pointers, lengths in step[3]:
                        prepared.run_addresses(pointers, lengths)
            elif kind == "dispatch":
                step[1].run_addresses(step[2], step[3])
            elif kind == "fill":
                _, address, length, pattern = step
                if len(pattern) == 1:
                    _memset(address, pattern[0], length)
                else:
                    data = (pattern * (length // len(pattern) + 1))[:length]
                    _memmove(address, data, length)
            else:
                _, source, target, length = step
                _memmove(target, source, length)

    def results(self) -> list[np.ndarray]:
        """The call's buffer view results as numpy arrays (copies), as
        the last run left them."""
        out = []
        for view in self._results:
            dtype = ELEMENT_DTYPES.get(view.element_type, np.dtype(np.uint8))
            shape = view.shape
            count = int(np.prod(shape, dtype=np.int64)) if shape else 1
            data = view.buffer.array[:count * dtype.itemsize]
            out.append(np.frombuffer(data.tobytes(), dtype).reshape(shape))
        return out

    def close(self) -> None:
        """Give the batches' layouts back."""
        for step in self.steps:
            if step[0] == "batch":
                step[1].close()
        self.steps = []


def record_replay(fn, inputs: Sequence) -> Replay:
    """Record one call of ``fn`` (a :class:`hal_cpu.programs.vm.Function`
    of a loaded program) on ``inputs`` without running its steps, and
    prepare them to run again.

    Raises:
        NoReplayError: the program imports host modules, the call reads
            data a step computes, writes host data into a buffer a step
            writes, or returns no buffer view.
        TypeError: inputs the function cannot take.
    """
    from .plan import DataDependenceError
    program = fn.program
    hal = program.hal
    foreign = sorted({i.name.split(".")[0] for m in program.modules
                      for i in m.imports} - {"hal"}
                     - {m.name for m in program.modules})
    if foreign:
        raise NoReplayError("a program importing host modules "
                            f"({', '.join(foreign)}) has no replay",
                            name=program.label, field="replay", value=fn.name)
    capture = _Capture()
    hal.record = capture
    try:
        args: list = []
        for v, ty in zip(inputs, fn.arg_types):
            if ty == "r" and isinstance(v, np.ndarray):
                view = hal.wrap_input(v)
                capture.name_input(view.buffer, len(args))
                args.append(view)
            else:
                args.append(v)
        try:
            out = fn.call_vm(*args)
        except DataDependenceError as exc:
            raise NoReplayError(f"the call has no replay: {exc.message}",
                                name=program.label, field="replay",
                                value=fn.name) from None
    finally:
        hal.record = None
    outs = out if isinstance(out, tuple) else (out,)
    views = [v for v in outs if type(v) is BufferView]
    if not views:
        raise NoReplayError("the call returns no buffer view", name=program.label,
                            field="replay", value=fn.name)
    written = {id(r) for r in capture.written_roots}
    if any(id(r) in written for r in capture.loaded_roots):
        raise NoReplayError("the call writes host data into a buffer a step "
                            "writes", name=program.label, field="replay",
                            value=fn.name)
    steps: list = []
    pending: list = []          # (prepared, pointers, lengths) of a batch

    def flush() -> None:
        if not pending:
            return
        items = [(p, [(-1, a) for a in ptrs]) for p, ptrs, _ in pending]
        try:
            batch = DispatchBatch(items)
        except DispatchError:
            steps.extend(("dispatch", p, ptrs, lens) for p, ptrs, lens in pending)
        else:
            steps.append(("batch", batch, [], list(pending)))
        pending.clear()

    workers = getattr(hal, "workers", None)
    for step in capture.captured:
        if step[0] == "dispatch":
            _, exe, ordinal, grid, consts, bindings = step
            if grid[0] * grid[1] * grid[2] == 0:
                continue
            lengths = [n for _, n in bindings]
            prepared = exe.library.prepare(ordinal, grid, consts, lengths,
                                           workers=workers)
            pointers = [a for a, _ in bindings]
            if prepared.batchable:
                pending.append((prepared, pointers, lengths))
            else:
                flush()
                steps.append(("dispatch", prepared, pointers, lengths))
        else:
            if step[0] == "fill" and not step[3]:
                raise NoReplayError("a fill without a pattern", name=program.label,
                                    field="replay", value=fn.name)
            flush()
            steps.append(step)
    flush()
    keep = capture.roots + [v.buffer for v in views] + [
        a for a in args if isinstance(a, BufferView)]
    return Replay(steps, keep, views, program)
