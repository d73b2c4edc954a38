"""``hal-cpu demo``: run the bundled sample executables on every
architecture and check them against numpy.

The samples in ``hal_cpu/samples`` were compiled by ``iree-compile`` from our
own MLIR (``build_samples.py`` there); ``manifest.json`` gives each kernel's
export, bindings and per-architecture workgroup count.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np

import elfloader

from .library import Executable

SAMPLES = Path(__file__).resolve().parent / "samples"

#: reference key in the manifest -> numpy function of the inputs (float32
#: arrays in ``input_index`` order; the result is float32). ``build_samples.py``
#: checks the samples against these same functions.
REFERENCES = {
    "mul_add": lambda a, b: a * b + a,
    "matmul": lambda a, b: a @ b,
    "sum_last": lambda x: x.sum(axis=-1, dtype=np.float32),
}
TOLERANCE = 1e-3


def load_manifest() -> dict:
    return json.loads((SAMPLES / "manifest.json").read_text())


def run_sample(kernel: dict, arch: str, backend: str, seed: int = 0):
    """Run one sample; returns (max abs error, seconds per dispatch)."""
    rng = np.random.default_rng(seed)
    inputs, outputs = [], []
    arrays = []
    for b in kernel["bindings"]:
        if b["role"] == "input":
            arr = rng.standard_normal(b["shape"]).astype(b["dtype"])
            inputs.append(arr)
        else:
            arr = np.zeros(b["shape"], b["dtype"])
            outputs.append(arr)
        arrays.append(arr)
    entry = kernel["per_arch"][arch]
    with Executable(SAMPLES / entry["file"], arch=arch, backend=backend) as exe:
        start = time.perf_counter()
        exe.dispatch(kernel["export"], entry["workgroup_count"], arrays,
                     entry["constants"])
        seconds = time.perf_counter() - start
    expected = REFERENCES[kernel["reference"]](*inputs)
    error = float(np.max(np.abs(outputs[0] - expected)))
    return error, seconds


def run_demo(arches=None) -> int:
    """Print the demo table; returns 0 when every output matches numpy."""
    manifest = load_manifest()
    host = elfloader.arch.host()
    rows = []
    for arch in arches or manifest["arches"]:
        backends = ["emulated"]
        if host is not None and arch == host.name:
            backends = ["native", "emulated"]
        for backend in backends:
            for name, kernel in manifest["kernels"].items():
                error, seconds = run_sample(kernel, arch, backend)
                rows.append((arch, backend, name, error, seconds))
    header = ("architecture", "backend", "kernel", "max abs error", "time")
    lines = [f"{header[0]:<13} {header[1]:<9} {header[2]:<9} {header[3]:>13} "
             f"{header[4]:>10}"]
    failed = 0
    for arch, backend, name, error, seconds in rows:
        ok = error <= TOLERANCE
        failed += not ok
        lines.append(f"{arch:<13} {backend:<9} {name:<9} {error:>13.2e} "
                     f"{seconds * 1e3:>8.2f}ms{'' if ok else '  MISMATCH'}")
    print("\n".join(lines))
    print(f"{len(rows) - failed} of {len(rows)} sample dispatches match numpy "
          f"(tolerance {TOLERANCE:g})")
    return 1 if failed else 0
