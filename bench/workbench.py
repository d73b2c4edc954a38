"""The workbench's cost: a dispatch counted (instruction counts) and a
dispatch sanitized, against the same dispatch plainly emulated, on the
qemu engine, in the same run.

Usage: python bench/workbench.py [--quick] [--rounds R] [--arch A,B]

For each architecture (default aarch64, riscv64, x86_64), each bundled
sample (``hal_cpu/samples``: matmul, mul_add; one dispatch) and two
programs of ``bench/programs`` (matmul256, conv3x3; a call on the VM,
tens of milliseconds emulated, where the engine's cost shows rather than
the per-dispatch set-up), three copies are loaded on the qemu engine:
plainly, under a counting session and under a sanitizer session (each its
own agents; the last two load the TCG plugin). Every round calls each once
(``workers=1``, interleaved, rotated).
A fourth copy runs the sanitizer's check of accesses outside bindings
alone (``outside_only``). Ratios are to the plain emulated call (targets:
counting at most 1.2x, sanitizer at most 2.5x; the outside check alone
would run on every emulated dispatch by default at most 1.3x).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _timing import (  # noqa: E402
    add_common_args,
    fmt_time,
    interleave,
    machine_line,
    ratio,
    rounds_of,
    table,
    wall,
)

from hal_cpu import Executable, samples, workbench  # noqa: E402

SAMPLES = ("matmul", "mul_add")
#: MLIR programs of bench/programs run on the VM (every dispatch watched):
#: name -> the inputs' shapes.
PROGRAMS = {"matmul256": [(256, 256), (256, 256)],
            "conv3x3": [(1, 34, 34, 32), (3, 3, 32, 32)]}
ROOT = Path(__file__).resolve().parent.parent


def _bindings(kernel: dict) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    return [rng.standard_normal(b["length"] // 4).astype(np.float32)
            for b in kernel["bindings"]]


def _sample(arch: str, name: str, manifest: dict):
    """(label, load(), call(loaded)) of a bundled sample's one dispatch."""
    kernel = manifest["kernels"][name]
    info = kernel["per_arch"][arch]
    path = str(samples.HERE / info["file"])
    grid = tuple(info["workgroup_count"])
    arrays = _bindings(kernel)

    def load():
        return Executable(path, arch=arch, backend="emulated", engine="qemu",
                          timeout=120)

    def call(exe):
        exe.dispatch(kernel["export"], grid, arrays, info["constants"],
                     workers=1)
    return f"sample {name} {grid}", load, call


def _program(arch: str, name: str):
    """(label, load(), call(loaded)) of a tests/programs program's call."""
    from hal_cpu.programs.vm import load_program
    rng = np.random.default_rng(0)
    inputs = [rng.standard_normal(s).astype(np.float32) for s in PROGRAMS[name]]
    path = ROOT / "bench" / "programs" / f"{name}.mlir"

    def load():
        return load_program([str(path)], arch=arch, backend="emulated",
                            engine="qemu", workers=1, timeout=120)

    def call(program):
        program.function(name)(*inputs)
    return f"program {name}", load, call


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_args(parser, rounds=15, quick_rounds=4)
    parser.add_argument("--arch", default="aarch64,riscv64,x86_64")
    args = parser.parse_args(argv)
    rounds = rounds_of(args)
    manifest = json.loads((samples.HERE / "manifest.json").read_text())
    print(machine_line())
    print(f"{rounds} interleaved rounds, one call each, workers=1, qemu "
          "engine; ratios to the plain emulated call")
    rows = []
    for arch in args.arch.split(","):
        cases = [_sample(arch, n, manifest) for n in SAMPLES]
        cases += [_program(arch, n) for n in PROGRAMS]
        for label, load, call in cases:
            counting = workbench.Session(count=True)
            sanitizing = workbench.Session(sanitize=True)
            bounding = workbench.Session(sanitize=True, outside_only=True)
            plain = load()
            with counting:
                counted = load()
            with sanitizing:
                sanitized = load()
            with bounding:
                bounded = load()

            def measure(obj, session=None):
                def go():
                    if session is None:
                        call(obj)
                        return
                    with session:
                        call(obj)
                return wall(go)
            stats = interleave({
                "plain": measure(plain),
                "count": measure(counted, counting),
                "sanitize": measure(sanitized, sanitizing),
                "outside": measure(bounded, bounding),
            }, rounds, warmup=1)
            base = stats["plain"]
            last = len(counting.reports) // (rounds + 1)
            found = sum(len(r.findings) for r in sanitizing.reports[-last:])
            rows.append([
                arch, label, fmt_time(base.min), fmt_time(base.median),
                ratio(stats["count"].min, base.min),
                ratio(stats["count"].median, base.median),
                ratio(stats["sanitize"].min, base.min),
                ratio(stats["sanitize"].median, base.median),
                ratio(stats["outside"].min, base.min),
                ratio(stats["outside"].median, base.median),
                str(sum(r.total or 0 for r in counting.reports[-last:])),
                str(found)])
            for obj in (plain, counted, sanitized, bounded):
                obj.close()
    print(table(["arch", "case", "plain min", "plain median", "count min",
                 "count med", "sanitize min", "sanitize med", "outside min",
                 "outside med", "instructions", "findings"], rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
