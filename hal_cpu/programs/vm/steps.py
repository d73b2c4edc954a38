"""The steps of a program's call as data: the dispatches, fills and copies
it submits (:class:`Dispatch`, :class:`FillStep`, :class:`CopyStep`), the
byte ranges they touch (:class:`BindingRef`), where results live
(:class:`ResultRef`) and a whole plan (:class:`ProgramPlan`).

A record-only run of a program (:mod:`hal_cpu.programs.vm.plan`) returns them and
``hal-cpu plan`` prints them; this module imports neither.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Union

import numpy as np

__all__ = ["BindingRef", "Dispatch", "FillStep", "CopyStep", "ResultRef", "ProgramPlan",
           "step_refs"]


@dataclass(frozen=True)
class BindingRef:
    """A byte range of a function input or of a buffer the program allocates.

    Attributes:
        kind: ``"input"`` (``ref`` = argument index; the bytes of that array
            in C order), ``"buffer"`` (``ref`` = transient buffer name, a
            key of :attr:`ProgramPlan.buffers`) or ``"constant"`` (``ref`` =
            a key of :attr:`ProgramPlan.constants`).
        ref: argument index or buffer name.
        offset: first byte.
        length: size in bytes.
    """

    kind: str
    ref: Union[int, str]
    offset: int
    length: int


@dataclass(frozen=True)
class Dispatch:
    """One workgroup dispatch.

    Attributes:
        so_path: the embedded-ELF executable (for a plan made from a bare
            ``.hal.mlir`` path, a placeholder ``<executable>_<variant>.so``).
        export_name: the export to call.
        workgroup_count: (x, y, z) workgroups.
        constants: push constants, each a uint32 as a Python int.
        bindings: one byte range per binding, in binding order.
        executable: the ``hal.executable`` symbol.
        variant: the executable variant (``embedded_elf_<arch>``).
    """

    so_path: Path
    export_name: str
    workgroup_count: tuple[int, int, int]
    constants: list[int]
    bindings: list[BindingRef]
    executable: str = ""
    variant: str = ""


@dataclass(frozen=True)
class FillStep:
    """Fill ``target`` with ``pattern`` (1, 2, 4 or 8 bytes, little-endian)
    repeated."""

    target: BindingRef
    pattern: bytes


@dataclass(frozen=True)
class CopyStep:
    """Copy ``source`` into ``target`` (same length)."""

    source: BindingRef
    target: BindingRef


@dataclass(frozen=True)
class ResultRef:
    """Where a function result lives after the last step: ``storage`` bytes
    viewed as ``dtype`` with ``shape`` (C order)."""

    storage: BindingRef
    shape: tuple[int, ...]
    dtype: np.dtype


@dataclass
class ProgramPlan:
    """What one call of a public function submits to the device.

    Attributes:
        function: the function name (without ``@``).
        steps: dispatches and transfers in execution order.
        buffers: transient buffers, name -> size in bytes.
        results: one :class:`ResultRef` per function result, in order.
        constants: constant storage the steps or results use, name -> its
            bytes (uint8 array).
    """

    function: str
    steps: list[Union[Dispatch, FillStep, CopyStep]]
    buffers: dict[str, int]
    results: list[ResultRef]
    constants: dict[str, np.ndarray] = field(default_factory=dict)

    @property
    def dispatches(self) -> list[Dispatch]:
        """The :class:`Dispatch` steps, in order."""
        return [s for s in self.steps if isinstance(s, Dispatch)]


def step_refs(step) -> list[BindingRef]:
    """The byte ranges a step touches: a dispatch's bindings, a fill's
    target, a copy's source and target."""
    if isinstance(step, Dispatch):
        return list(step.bindings)
    if isinstance(step, FillStep):
        return [step.target]
    return [step.source, step.target]
