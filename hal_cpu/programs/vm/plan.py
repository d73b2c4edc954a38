"""The steps of one call of a program without running them: a record-only
run of the VM.

The program runs on the VM as usual (its bytecode, host modules, the
``hal`` module's buffers and queue), but the ``hal`` module is given a
:class:`Recording` (:attr:`hal_cpu.programs.vm.hal_module.HalModule.record`): every
command buffer it submits and every queue fill or copy becomes a step
(:class:`~hal_cpu.programs.vm.steps.Dispatch`, :class:`~hal_cpu.programs.vm.steps.FillStep`,
:class:`~hal_cpu.programs.vm.steps.CopyStep`) instead of running, and the buffers it
writes hold data nobody computed: a host read of one (``hal.buffer.load``,
a buffer view handed to the ``check`` module or a host module, an indirect
dispatch's workgroup count) raises :class:`DataDependenceError` naming the
op's source line. Such a program has no plan without running
(``hal-cpu plan --trace`` prints the steps of an actual run).

    >>> from hal_cpu.programs.vm.plan import plan_program                    # doctest: +SKIP
    >>> plan = plan_program("matmul.mlir", [a, b], arch="arm64")    # doctest: +SKIP
    >>> plan.dispatches[0].workgroup_count                          # doctest: +SKIP
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Sequence

import numpy as np

from fatelf import arches

from .hal_module import ELEMENT_DTYPES, FAILED_PRECONDITION
from .refs import VmStatusError
from .steps import BindingRef, CopyStep, Dispatch, FillStep, ProgramPlan, ResultRef

__all__ = ["DataDependenceError", "Recording", "compiled_files", "plan_program",
           "record_call"]


class DataDependenceError(VmStatusError):
    """A host read, while a call is only recorded, of a buffer a recorded
    (not executed) dispatch, fill or copy writes: the program's steps
    depend on computed data and it has no plan without running.
    ``location`` is the ``file:line:column`` of the op that read (when the
    module has debug information); status FAILED_PRECONDITION."""

    def __init__(self, message: str, location: str | None = None, *,
                 name: str | None = None):
        VmStatusError.__init__(self, FAILED_PRECONDITION, message, location,
                               name=name)


class Recording:
    """What a record-only call submits, as steps (give it to
    :func:`hal_cpu.programs.vm.load_program` as ``record=``, or use
    :func:`plan_program`).

    Args:
        executables: a function from the ``!hal.executable`` of a dispatch
            to ``(path of its ELF file, executable name, variant)``; default
            :meth:`executable_file`.

    Attributes:
        steps: the steps, in submission order.
        buffers: buffer name -> size in bytes (buffers the program
            allocates that a step touches).
        constants: constant name -> bytes (buffers over the module's
            read-only data that a step touches).
    """

    def __init__(self, executables=None):
        self.steps: list = []
        self.buffers: dict[str, int] = {}
        self.constants: dict[str, np.ndarray] = {}
        self._names: dict[int, tuple[str, int | str]] = {}
        self._keep: list = []          # (the roots named: ids stay unique)
        self._written: set[int] = set()
        self._loaded: set[int] = set()
        self._executables = executables or self.executable_file

    # -- naming ------------------------------------------------------------------
    def name_input(self, buffer, index: int) -> None:
        """Name ``buffer`` (a function input's) ``input`` ``index``."""
        root = buffer.root
        self._names[id(root)] = ("input", index)
        self._keep.append(root)

    def ref(self, buffer, offset: int, length: int) -> BindingRef:
        """The :class:`BindingRef` of ``length`` bytes at ``offset`` of
        ``buffer`` (offsets from its allocation's start)."""
        root = buffer.root
        name: tuple[str, int | str] | None = self._names.get(id(root))
        if name is None:
            if (not root.array.flags.writeable
                    or (id(root) in self._loaded and id(root) not in self._written)):
                key = f"constant_{len(self.constants)}"
                self.constants[key] = np.array(root.array, np.uint8)
                name = ("constant", key)
            else:
                key = f"buffer_{len(self.buffers)}"
                self.buffers[key] = int(root.length)
                name = ("buffer", key)
            self._names[id(root)] = name
            self._keep.append(root)
        start = buffer.address - root.address + offset
        return BindingRef(name[0], name[1], int(start), int(length))

    def _write(self, buffer) -> None:
        root = buffer.root
        if self._names.get(id(root), ("",))[0] != "input":
            self._written.add(id(root))
            self._keep.append(root)

    # -- what the hal module calls ---------------------------------------------------
    def load(self, buffer) -> None:
        """The host wrote data of the module into ``buffer`` (a queue read
        or update): until a step writes it, its bytes are a constant."""
        root = buffer.root
        self._loaded.add(id(root))
        self._keep.append(root)

    def read(self, buffer, what: str) -> None:
        """A host read of ``buffer``'s bytes by op ``what``.

        Raises:
            DataDependenceError: a recorded step writes the buffer.
        """
        if id(buffer.root) in self._written:
            name = self.ref(buffer, 0, buffer.length)
            raise DataDependenceError(
                f"{what} reads {name.kind} {name.ref}, which a recorded dispatch "
                "or transfer writes: the program's steps depend on computed "
                "data and have no plan without running it")

    def dispatch(self, executable, ordinal: int, grid, constants,
                 bindings) -> None:
        """A dispatch of export ``ordinal`` of ``executable`` over ``grid``
        with ``bindings`` (``(buffer, offset, length)`` each), recorded."""
        path, name, variant = self._executables(executable)
        export = executable.library.exports[ordinal]
        refs = [self.ref(b, off, n) for b, off, n in bindings]
        x, y, z = (int(g) for g in grid)
        self.steps.append(Dispatch(path, export.name or str(ordinal), (x, y, z),
                                   [int(c) for c in constants], refs, name, variant))
        for b, _, _ in bindings:
            self._write(b)

    def fill(self, buffer, offset: int, length: int, pattern: bytes) -> None:
        """A fill, recorded (not run)."""
        self.steps.append(FillStep(self.ref(buffer, offset, length), bytes(pattern)))
        self._write(buffer)

    def copy(self, source: tuple, target: tuple) -> None:
        """A copy of ``source`` to ``target`` (``(buffer, offset, length)``
        each), recorded (not run)."""
        self.steps.append(CopyStep(self.ref(*source), self.ref(*target)))
        self._write(target[0])

    def result(self, view) -> ResultRef:
        """Where a returned buffer view lives."""
        dtype = ELEMENT_DTYPES.get(view.element_type)
        shape = tuple(int(d) for d in view.shape)
        count = int(np.prod(shape, dtype=object)) if shape else 1
        nbytes = count * (dtype.itemsize if dtype is not None else 1)
        return ResultRef(self.ref(view.buffer, 0, min(nbytes, view.buffer.length)),
                         shape, np.dtype(dtype if dtype is not None else np.uint8))

    @staticmethod
    def executable_file(executable) -> tuple[Path, str, str]:
        """The ELF of ``executable`` written once (by content) into the
        compile cache's ``executables`` folder, its name and variant."""
        from ..compiler import default_cache_dir
        data = executable.source.bytes()
        digest = hashlib.sha256(data).hexdigest()[:16]
        folder = Path(default_cache_dir()) / "executables"
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"{digest}.so"
        if not path.is_file() or path.stat().st_size != len(data):
            tmp = folder / f".{digest}.{os.getpid()}.tmp"
            tmp.write_bytes(data)
            os.replace(tmp, path)
        return path, executable.library.name or digest, str(executable.format)


def compiled_files(compiled):
    """A :class:`Recording` ``executables`` function naming the ELF files
    ``iree-compile`` dumped for ``compiled`` (a
    :class:`hal_cpu.programs.Compiled`), matched by content."""
    by_bytes = {}
    for p in compiled.so_files:
        by_bytes[Path(p).read_bytes()] = Path(p)
    variant = getattr(compiled, "variant", "")

    def files(executable):
        path = by_bytes.get(executable.source.bytes())
        if path is None:
            return Recording.executable_file(executable)
        stem = path.name[:-3]
        name = stem[:-len(variant) - 1] if variant and stem.endswith("_" + variant) else stem
        name = name.split("_", 1)[1] if name.startswith("module_") else name
        return path, name, variant
    return files


def plan_program(program, inputs: Sequence, function: str | None = None, *,
                 arch: str | None = None, host_modules: Sequence = (),
                 backend: str = "emulated", plugins=None,
                 cache_dir: str | None = None,
                 compile_flags: Sequence[str] = (),
                 memory_limit: int | None = None) -> ProgramPlan:
    """The steps one call of ``function`` submits, without running them.

    Args:
        program: an MLIR file (compiled first for ``arch``, cached), a
            ``.vmfb`` file, or a :class:`hal_cpu.programs.Compiled`.
        inputs: one value per argument (numpy arrays for tensors, ints and
            floats for scalars); only their shapes, types and (for what the
            host program reads) values matter.
        function: the public function (may be omitted when there is one).
        arch: the architecture (default: the module's, else this machine's).
        host_modules: Python host modules the program imports.
        backend: where the executables are loaded (to read their exports;
            nothing is dispatched): ``emulated`` by default.
        plugins: a :class:`hal_cpu.PluginManager` resolving the
            executables' imports.
        cache_dir, compile_flags: as :func:`hal_cpu.programs.compile_program`.
        memory_limit: bytes of buffers (inputs included) the call may hold,
            as :func:`hal_cpu.programs.vm.load_program`'s.

    Returns:
        A :class:`~hal_cpu.programs.vm.steps.ProgramPlan`: steps, the buffers and
        constants they touch, where the results live.

    Raises:
        DataDependenceError: the host program reads data a step computes
            (names the op's source line).
        VmError: the program cannot be read, linked or called (as
            :func:`hal_cpu.programs.vm.load_program`); TypeError: inputs the function
            cannot take.
    """
    from .program import load_program
    files = None
    if hasattr(program, "so_files") and hasattr(program, "vmfb"):
        files = compiled_files(program)
        arch = arch or program.arch
        program = program.vmfb
    elif not _is_module(program):
        from ..compiler import compile_program
        compiled = compile_program(Path(program), arch or arches.host_arch(),
                                   cache_dir, extra_flags=list(compile_flags))
        files = compiled_files(compiled)
        arch = arch or compiled.arch
        program = compiled.vmfb
    record = Recording(files)
    with load_program(program, arch=arch, backend=backend, plugins=plugins,
                      host_modules=host_modules, record=record,
                      memory_limit=memory_limit) as prog:
        return record_call(prog.function(function), inputs, record)


def record_call(fn, inputs: Sequence, record: Recording,
                trace: list | None = None) -> ProgramPlan:
    """One call of ``fn`` (a :class:`hal_cpu.programs.vm.Function` of a program
    loaded with ``record=record``) as a plan. With ``trace`` (the list a
    program loaded with ``trace=`` and without ``record`` fills) the call
    runs and the plan holds the dispatches it ran.

    Raises:
        DataDependenceError: as :func:`plan_program`.
        TypeError: inputs the function cannot take.
    """
    hal = fn.program.hal
    if len(inputs) != len(fn.arg_types):
        raise TypeError(f"@{fn.name} takes {len(fn.arg_types)} arguments "
                        f"({fn.declaration or fn.cconv}); got {len(inputs)}")
    args = []
    for i, (v, ty) in enumerate(zip(inputs, fn.arg_types)):
        if ty == "r" and isinstance(v, np.ndarray):
            view = hal.wrap_input(v)
            record.name_input(view.buffer, i)
            args.append(view)
        else:
            args.append(v)
    if trace is not None:
        del trace[:]
    out = fn.call_vm(*args)
    if len(fn.result_types) == 1:
        out = (out,)
    elif out is None:
        out = ()
    if trace is not None:
        for rec in trace:
            record.dispatch(rec.executable, rec.ordinal, rec.grid, rec.constants,
                            rec.bindings)
    results = [record.result(v) for v in out
               if getattr(v, "vm_type", None) == "!hal.buffer_view"]
    return ProgramPlan(fn.name, list(record.steps), dict(record.buffers),
                       results, dict(record.constants))


def _is_module(path) -> bool:
    from . import vmfb
    return isinstance(path, (bytes, bytearray)) or vmfb.is_module_file(os.fspath(path))
