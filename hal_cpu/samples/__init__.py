"""The bundled sample kernels: ``*.so`` HAL executables for six
architectures compiled by ``iree-compile`` from the ``samples_*.mlir`` here
(:mod:`hal_cpu.buildtools.samples` builds them), ``manifest.json`` (each
kernel's export, bindings, per-architecture workgroup count and reference),
and ``standalone.sos``, the sample plugin bundle. ``hal-cpu demo`` runs
them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import numpy as np

#: This folder: the samples' files.
HERE = Path(__file__).resolve().parent

#: reference key in the manifest -> numpy function of the inputs (float32
#: arrays in ``input_index`` order; the result is float32). ``hal-cpu demo``
#: and :mod:`hal_cpu.buildtools.samples` check the samples against them.
REFERENCES: dict[str, Callable[..., np.ndarray]] = {
    "mul_add": lambda a, b: a * b + a,
    "matmul": lambda a, b: a @ b,
    "sum_last": lambda x: x.sum(axis=-1, dtype=np.float32),
}
