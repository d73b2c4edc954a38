"""The device the interpreted host program talks to: buffers, buffer views,
command buffers, and the queue that runs (or records) dispatches, fills and
copies.

Execution is synchronous: a queue operation runs when the host program
submits it, in submission order, so fences are always signalled and waits
return at once. Every operation is also appended to :attr:`Device.trace` as a
:class:`~hal_cpu.iree.steps.Dispatch`, :class:`~hal_cpu.iree.steps.FillStep` or
:class:`~hal_cpu.iree.steps.CopyStep` whose byte ranges name the storage they
touch (``input N``, ``buffer NAME``, ``constant NAME``).

Every byte range the device keeps (inputs, allocations, constants) starts
on a 64-byte boundary, as IREE's buffers do, so a native dispatch binds it
in place (:mod:`hal_cpu.arrays`) instead of copying it in and out.

A *planning* device (``execute=False``) records the same steps without
running any: storage written by a step holds data nobody computed, and a
host read of it raises :class:`DataDependenceError` naming the op that
wanted the data.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from ..arrays import empty as _aligned_empty
from ..arrays import full as _aligned_full
from .errors import EvaluationError
from .steps import BindingRef, CopyStep, Dispatch, FillStep


def _aligned_copy(data) -> np.ndarray:
    """``data``'s bytes in a new 64-byte-aligned uint8 array."""
    flat = np.frombuffer(np.ascontiguousarray(data).tobytes(), np.uint8)
    out = _aligned_empty(flat.size, np.uint8)
    out[:] = flat
    return out

__all__ = ["MemoryLimitError", "Storage", "Buffer", "BufferView", "CommandBuffer", "FunctionRef",
           "Executable", "HostBuffer", "Handle", "Device", "DataDependenceError"]


class DataDependenceError(EvaluationError):
    """The host program reads device data while being planned: its steps
    depend on results, so it has no plan without running (use
    ``hal-cpu run-module``, or ``hal-cpu plan --trace`` for the steps of an
    actual run)."""


class MemoryLimitError(EvaluationError):
    """An allocation of a program run would pass its memory limit
    (:attr:`Device.memory_limit`); nothing was allocated."""


class Storage:
    """Bytes a buffer lives in: a function input, an allocation of the
    program, or a constant of the module.

    Attributes:
        kind: ``"input"``, ``"buffer"`` or ``"constant"`` (as
            :attr:`BindingRef.kind`).
        ref: argument index, or the allocation's / constant's name.
        size: bytes.
        written: (planning only) a recorded step wrote here.
    """

    __slots__ = ("kind", "ref", "size", "_array", "_make", "written")

    def __init__(self, kind: str, ref, size: int, array: np.ndarray | None = None,
                 make: Callable[[], np.ndarray] | None = None):
        self.kind, self.ref, self.size = kind, ref, size
        self._array, self._make, self.written = array, make, False

    @property
    def array(self) -> np.ndarray:
        """The bytes (uint8, writable, 64-byte aligned), made on first use."""
        if self._array is None:
            self._array = (self._make() if self._make
                           else _aligned_full(self.size, 0, np.uint8))
            self._make = None
        return self._array

    def __repr__(self) -> str:
        return f"<{self.kind} {self.ref} ({self.size} bytes)>"


@dataclass(frozen=True)
class Buffer:
    """A ``!hal.buffer``: ``length`` bytes of ``storage`` from ``offset``."""

    storage: Storage
    offset: int
    length: int

    def ref(self, offset: int, length: int) -> BindingRef:
        """The :class:`BindingRef` of ``length`` bytes from ``offset`` in
        this buffer."""
        return BindingRef(self.storage.kind, self.storage.ref, self.offset + offset, length)


@dataclass(frozen=True)
class BufferView:
    """A ``!hal.buffer_view``: a buffer with shape and element type (IREE's
    name, e.g. ``f32``) and encoding."""

    buffer: Buffer
    shape: tuple[int, ...]
    element_type: str
    encoding: int = 0


@dataclass(frozen=True)
class Executable:
    """A ``!hal.executable``: the ``hal.executable`` symbol and its variant."""

    name: str
    variant: str


@dataclass(frozen=True)
class FunctionRef:
    """An export of an executable (``hal.executable.lookup.function``)."""

    executable: str
    variant: str
    export: str


@dataclass
class CommandBuffer:
    """A ``!hal.command_buffer``: recorded commands, each a tuple; binding
    references are a :class:`Buffer` or an ``int`` slot of the binding table
    given at submission."""

    commands: list = field(default_factory=list)


@dataclass(frozen=True)
class Handle:
    """An object of the HAL the interpreter needs no state for (device,
    allocator, fence, file...): ``what`` names it."""

    what: str
    data: Any = None


class HostBuffer:
    """A ``!util.buffer``: host bytes (a writable uint8 array)."""

    __slots__ = ("data",)

    def __init__(self, data: np.ndarray):
        self.data = data

    def __repr__(self) -> str:
        return f"<util.buffer {self.data.size} bytes>"


RunDispatch = Callable[[Dispatch, list[np.ndarray]], None]


class Device:
    """Runs or records what the host program submits.

    Args:
        run_dispatch: ``run_dispatch(dispatch, bindings)`` runs every
            workgroup of a :class:`Dispatch` over one writable uint8 array
            per binding (as :class:`hal_cpu.iree.PlanRunner`); None on a
            planning device.
        so_for: ``so_for(executable, variant) -> Path`` of the embedded ELF.
        execute: False: record steps only (planning).
        fill_byte: initial byte of the program's allocations.

    Attributes:
        trace: every step so far, in order.
        allocations: name -> size of every ``queue.alloca`` /
            ``allocator.allocate`` so far.
        constants: name -> storage of the module's constant buffers.
    """

    def __init__(self, run_dispatch: RunDispatch | None,
                 so_for: Callable[[str, str], Path], *, execute: bool = True,
                 fill_byte: int = 0, memory_limit: int | None = None):
        self.run_dispatch, self.so_for = run_dispatch, so_for
        self.execute, self.fill_byte = execute, fill_byte
        if memory_limit is None:
            from ..arrays import default_memory_limit
            memory_limit = default_memory_limit()
        #: bytes of allocations a run may make (checked before each; a plan
        #: makes none)
        self.memory_limit = memory_limit
        self.allocated = 0
        self.trace: list = []
        self.allocations: dict[str, int] = {}
        self.constants: dict[str, Storage] = {}

    # -- storage -------------------------------------------------------------
    def _unique(self, names: dict, base: str) -> str:
        name, k = base, 1
        while name in names:
            k += 1
            name = f"{base}.{k}"
        return name

    def allocate(self, size: int, base_name: str) -> Buffer:
        """A new zero-filled (``fill_byte``) allocation named after the SSA
        value that holds it."""
        if size < 0:
            raise EvaluationError(f"allocation of {size} bytes")
        if self.execute:
            if self.allocated + size > self.memory_limit:
                raise MemoryLimitError(
                    f"an allocation of {size} bytes would take the program's "
                    f"buffers past its memory limit of {self.memory_limit} bytes "
                    f"({self.allocated} allocated); raise it with --memory_limit "
                    "or run_program(memory_limit=)")
            self.allocated += size
        name = self._unique(self.allocations, base_name)
        self.allocations[name] = size
        fill = self.fill_byte
        storage = Storage("buffer", name, size,
                          make=lambda: _aligned_full(size, fill, np.uint8))
        return Buffer(storage, 0, size)

    def constant(self, data: np.ndarray, base_name: str) -> Buffer:
        """A buffer over host bytes the module carries (``hal.allocator.import``
        of a ``util.buffer.constant``): shares ``data`` when it starts on a
        64-byte boundary, else holds an aligned copy."""
        name = self._unique(self.constants, base_name)
        if data.size and data.__array_interface__["data"][0] % 64:
            data = _aligned_copy(data)
        storage = Storage("constant", name, data.size, array=data)
        self.constants[name] = storage
        return Buffer(storage, 0, data.size)

    @staticmethod
    def input(index: int, array) -> BufferView:
        """The buffer view of function input ``index`` (a numpy array; its
        bytes are copied on first use, so kernels never write the caller's
        array)."""
        from ..buffers import dtype_name
        arr = array
        nbytes = int(np.prod(arr.shape, dtype=np.int64)) * np.dtype(arr.dtype).itemsize
        storage = Storage("input", index, nbytes,
                          make=lambda: _aligned_copy(arr))
        return BufferView(Buffer(storage, 0, nbytes), tuple(int(d) for d in arr.shape),
                          dtype_name(arr.dtype))

    def view(self, buf: Buffer, offset: int, length: int, what: str) -> np.ndarray:
        """Writable uint8 array of ``length`` bytes at ``offset`` of ``buf``.

        Raises:
            EvaluationError: the range lies outside the buffer.
        """
        if offset < 0 or length < 0 or offset + length > buf.length:
            raise EvaluationError(f"{what}: bytes [{offset}, {offset + length}) lie "
                                  f"outside the {buf.length}-byte buffer ({buf.storage})")
        start = buf.offset + offset
        return buf.storage.array[start:start + length]

    # -- host access -----------------------------------------------------------
    def read(self, buf: Buffer, offset: int, length: int, what: str) -> bytes:
        """Bytes the host reads from device memory.

        Raises:
            DataDependenceError: planning, and a recorded step wrote there.
            EvaluationError: outside the buffer.
        """
        if not self.execute and buf.storage.written:
            raise DataDependenceError(
                f"{what} reads {buf.storage}, which a dispatch or transfer writes: "
                "the program's steps depend on computed data and have no plan "
                "without running it")
        return self.view(buf, offset, length, what).tobytes()

    def write(self, buf: Buffer, offset: int, data: bytes, what: str) -> None:
        """Host bytes written into device memory."""
        self.view(buf, offset, len(data), what)[:] = np.frombuffer(data, np.uint8)

    # -- queue -----------------------------------------------------------------
    def dispatch(self, fn: FunctionRef, workgroups: tuple[int, int, int],
                 constants: list[int], bindings: list[tuple[Buffer, int, int]]) -> None:
        """Run one dispatch (each binding: buffer, offset, length)."""
        for b, off, n in bindings:
            if off < 0 or n < 0 or off + n > b.length:
                raise EvaluationError(f"binding [{off}, {off + n}) lies outside its "
                                      f"{b.length}-byte buffer ({b.storage})")
        step = Dispatch(self.so_for(fn.executable, fn.variant), fn.export,
                        workgroups, list(constants),
                        [b.ref(off, n) for b, off, n in bindings],
                        executable=fn.executable, variant=fn.variant)
        self.trace.append(step)
        if not self.execute:
            for b, _, _ in bindings:
                if b.storage.kind != "input":
                    b.storage.written = True
            return
        assert self.run_dispatch is not None, "a device that executes runs dispatches"
        self.run_dispatch(step, [self.view(b, off, n, "binding") for b, off, n in bindings])

    def fill(self, buf: Buffer, offset: int, length: int, pattern: bytes) -> None:
        """Fill a range with a 1-, 2-, 4- or 8-byte pattern repeated."""
        self.trace.append(FillStep(buf.ref(offset, length), pattern))
        if not self.execute:
            buf.storage.written = True
            return
        from ..arrays import fill_pattern
        fill_pattern(self.view(buf, offset, length, "fill target"), pattern)

    def copy(self, src: Buffer, src_offset: int, dst: Buffer, dst_offset: int,
             length: int) -> None:
        """Copy ``length`` bytes between buffers."""
        self.trace.append(CopyStep(src.ref(src_offset, length), dst.ref(dst_offset, length)))
        if not self.execute:
            dst.storage.written = True
            return
        data = self.view(src, src_offset, length, "copy source").copy()
        self.view(dst, dst_offset, length, "copy target")[:] = data

    def submit(self, cb: CommandBuffer, table: list[tuple[Buffer, int, int]] | None) -> None:
        """Run a command buffer's commands, resolving binding-table slots
        against ``table`` (``queue.execute.indirect``)."""
        def resolve(ref, off: int, length: int) -> tuple[Buffer, int, int]:
            if isinstance(ref, int):
                if table is None or ref >= len(table):
                    raise EvaluationError(
                        f"binding table slot {ref} used but the command buffer was "
                        f"submitted with {len(table) if table else 0} slots")
                buf, toff, tlen = table[ref]
                if length == 0xFFFFFFFFFFFFFFFF:      # IREE_HAL_WHOLE_BUFFER
                    length = tlen - off
                return buf, toff + off, length
            if length == 0xFFFFFFFFFFFFFFFF:
                length = ref.length - off
            return ref, off, length

        for cmd in cb.commands:
            kind = cmd[0]
            if kind == "dispatch":
                _, fn, wg, consts, binds = cmd
                self.dispatch(fn, wg, consts, [resolve(r, o, n) for r, o, n in binds])
            elif kind == "fill":
                _, ref, off, n, pattern = cmd
                buf, off, n = resolve(ref, off, n)
                self.fill(buf, off, n, pattern)
            else:
                _, sref, soff, dref, doff, n = cmd
                sbuf, soff, _ = resolve(sref, soff, n)
                dbuf, doff, _ = resolve(dref, doff, n)
                self.copy(sbuf, soff, dbuf, doff, n)
