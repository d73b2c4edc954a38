"""The programs of ``tests/programs``: inputs and numpy references.

Each ``<name>.mlir`` there documents its public function; ``PROGRAMS`` gives
the function, an input maker and the numpy result for each. The programs are
compiled and planned with :mod:`hal_cpu.iree`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

PROGRAMS_DIR = Path(__file__).resolve().parent / "programs"


@dataclass(frozen=True)
class ProgramSpec:
    """One program of ``tests/programs`` with its inputs and numpy reference.

    Attributes:
        name: file stem in ``tests/programs``.
        function: its public function.
        make_inputs: ``make_inputs(rng, **params)`` -> list of inputs
            (arrays and Python scalars, in argument order).
        numpy_reference: ``numpy_reference(inputs)`` -> list of expected
            outputs (same shapes and dtypes as the program's results).
        num_dispatches: dispatches one call performs.
    """

    name: str
    function: str
    make_inputs: Callable[..., list]
    numpy_reference: Callable[[Sequence[Any]], list]
    num_dispatches: int = 1

    @property
    def path(self) -> Path:
        return PROGRAMS_DIR / f"{self.name}.mlir"


def _f32(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


PROGRAMS: dict[str, ProgramSpec] = {
    "mul_add": ProgramSpec(
        "mul_add", "mul_add",
        lambda rng: [_f32(rng, 10007), _f32(rng, 10007)],
        lambda i: [i[0] * i[1] + i[0]]),
    "matmul": ProgramSpec(
        "matmul", "matmul",
        lambda rng: [_f32(rng, 37, 53), _f32(rng, 53, 29)],
        lambda i: [i[0] @ i[1]]),
    "sum_last": ProgramSpec(
        "sum_last", "sum_last",
        lambda rng: [_f32(rng, 33, 257)],
        lambda i: [i[0].sum(axis=-1, dtype=np.float32)]),
    "scale_dyn": ProgramSpec(
        "scale_dyn", "scale_dyn",
        lambda rng, n=1000, s=1.75: [_f32(rng, n), float(s)],
        lambda i: [i[0] * np.float32(i[1]) + i[0]]),
    "add_i32": ProgramSpec(
        "add_i32", "add_i32",
        lambda rng: [rng.integers(-2**31, 2**31, 513, dtype=np.int64).astype(np.int32),
                     rng.integers(-2**31, 2**31, 513, dtype=np.int64).astype(np.int32)],
        lambda i: [((i[0].astype(np.int64) + i[1]) * 3 - i[0]).astype(np.int32)]),
    "mm_rowsum": ProgramSpec(
        "mm_rowsum", "mm_rowsum",
        lambda rng: [_f32(rng, 37, 53), _f32(rng, 53, 29)],
        lambda i: [np.tanh(i[0] @ i[1]).sum(axis=-1, dtype=np.float32), i[0] @ i[1]],
        num_dispatches=2),
}
