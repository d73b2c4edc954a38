"""The programs of ``tests/programs``: inputs and numpy references.

Each ``<name>.mlir`` there documents its public function; ``PROGRAMS`` gives
the function, an input maker and the numpy result for each. The programs are
compiled with :func:`hal_cpu.programs.compile_program` and planned and run on the
VM (:mod:`hal_cpu.programs.vm`).
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


def _conv2d_nhwc_hwcf(x, w):
    kh, kw = w.shape[:2]
    oh, ow = x.shape[1] - kh + 1, x.shape[2] - kw + 1
    out = np.zeros((x.shape[0], oh, ow, w.shape[3]), np.float64)
    for i in range(kh):
        for j in range(kw):
            out += np.einsum("nhwc,cf->nhwf", x[:, i:i + oh, j:j + ow, :], w[i, j])
    return out.astype(np.float32)


def _softmax(x):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return (e / e.sum(axis=-1, keepdims=True)).astype(np.float32)


def _layer_norm(x, gamma, beta, eps=1e-5):
    mean = x.mean(axis=-1, keepdims=True, dtype=np.float64)
    var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
    return ((x - mean) / np.sqrt(var + eps) * gamma + beta).astype(np.float32)


def _int_ops(a, b, c):
    a64 = a.astype(np.int64)
    r0 = ((a64 >> 3) ^ (b.astype(np.int64) * 7)) + np.maximum(a64, -5) - np.fmod(a64, 13)
    with np.errstate(over="ignore"):
        r1 = c * a64 + b.view(np.uint8).astype(np.int64)
    return [r0.astype(np.int32), r1]


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

#: Programs ``hal-cpu run-module`` is accepted on: every architecture, and
#: byte-identical output with ``iree-run-module`` on the host.
ACCEPTANCE: dict[str, ProgramSpec] = {
    "conv2d": ProgramSpec(
        "conv2d", "conv2d",
        lambda rng: [_f32(rng, 1, 9, 11, 3), _f32(rng, 3, 3, 3, 5)],
        lambda i: [_conv2d_nhwc_hwcf(*i)]),
    "softmax": ProgramSpec(
        "softmax", "softmax",
        lambda rng: [_f32(rng, 7, 33) * 3],
        lambda i: [_softmax(i[0])]),
    "layer_norm": ProgramSpec(
        "layer_norm", "layer_norm",
        lambda rng: [_f32(rng, 5, 67) * 2 + 1, _f32(rng, 67), _f32(rng, 67)],
        lambda i: [_layer_norm(*i)]),
    "argmax": ProgramSpec(
        "argmax", "argmax",
        lambda rng: [_f32(rng, 9, 41)],
        lambda i: [i[0].argmax(axis=-1).astype(np.int32)]),
    "transpose": ProgramSpec(
        "transpose", "transpose",
        lambda rng: [_f32(rng, 6, 7, 5)],
        lambda i: [np.ascontiguousarray(i[0].transpose(2, 0, 1))]),
    "gather": ProgramSpec(
        "gather", "gather",
        lambda rng: [_f32(rng, 50, 8), rng.integers(0, 50, 17).astype(np.int32)],
        lambda i: [i[0][i[1]]]),
    "int_ops": ProgramSpec(
        "int_ops", "int_ops",
        lambda rng: [rng.integers(-2**31, 2**31, 129, dtype=np.int64).astype(np.int32),
                     rng.integers(-128, 128, 129).astype(np.int8),
                     rng.integers(-2**63, 2**63 - 1, 129, dtype=np.int64)],
        lambda i: _int_ops(*i)),
    "matmul_dyn": ProgramSpec(
        "matmul_dyn", "matmul_dyn",
        lambda rng, m=19, k=23, n=13: [_f32(rng, m, k), _f32(rng, k, n)],
        lambda i: [i[0] @ i[1]]),
    "rowsum_dyn": ProgramSpec(
        "rowsum_dyn", "rowsum_dyn",
        lambda rng, m=21, n=45: [_f32(rng, m, n)],
        lambda i: [i[0].sum(axis=-1, dtype=np.float32)]),
}

#: Programs every CPU profile is tested with (vector code for the vector
#: profiles): odd-sized matmul, an exp reduction, integer ops, softmax.
PROFILE_PROGRAMS: dict[str, ProgramSpec] = {
    "matmul": PROGRAMS["matmul"],
    "exp_reduce": ProgramSpec(
        "exp_reduce", "exp_reduce",
        lambda rng: [_f32(rng, 9, 37)],
        lambda i: [np.exp(i[0].astype(np.float64)).sum(axis=-1).astype(np.float32)]),
    "int_ops": ACCEPTANCE["int_ops"],
    "softmax": ACCEPTANCE["softmax"],
}

#: Every program of ``tests/programs`` by name.
ALL_PROGRAMS: dict[str, ProgramSpec] = {**PROGRAMS, **ACCEPTANCE,
                                         **PROFILE_PROGRAMS}
