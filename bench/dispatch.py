"""Per-dispatch time of the same executable and bindings through our native
backend and through IREE's ``iree-benchmark-executable`` (the peer), plus our
emulated backends as a ratio to our native one.

Usage: python bench/dispatch.py [--kernel matmul|mul_add|sum_last] [--seconds S]

Uses the bundled samples (hal_cpu/samples), whose kernels are the same MLIR
compiled for every architecture.
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import subprocess
import time

import numpy as np

from fatelf import arches
from hal_cpu import Executable
from hal_cpu.buffers import dtype_name
from hal_cpu.demo import SAMPLES, load_manifest


def bindings(kernel):
    rng = np.random.default_rng(0)
    return [rng.standard_normal(b["shape"]).astype(b["dtype"]) if b["role"] == "input"
            else np.zeros(b["shape"], b["dtype"]) for b in kernel["bindings"]]


def time_ours(kernel, arch, backend, seconds) -> float:
    """Mean seconds per dispatch (executable loaded once)."""
    entry = kernel["per_arch"][arch]
    arrays = bindings(kernel)
    with Executable(SAMPLES / entry["file"], arch=arch, backend=backend) as exe:
        args = (kernel["export"], entry["workgroup_count"], arrays, entry["constants"])
        exe.dispatch(*args)  # warm up
        n, start = 0, time.perf_counter()
        while True:
            exe.dispatch(*args)
            n += 1
            elapsed = time.perf_counter() - start
            if elapsed >= seconds:
                return elapsed / n


def time_iree(kernel, seconds) -> float | None:
    """Seconds per dispatch reported by iree-benchmark-executable."""
    tool = shutil.which("iree-benchmark-executable")
    if tool is None:
        return None
    host = arches.host()
    entry = kernel["per_arch"][host.name]
    specs = [f"--binding={'x'.join(map(str, b['shape']))}x"
             f"{dtype_name(np.dtype(b['dtype']))}=1" for b in kernel["bindings"]]
    wc = ",".join(map(str, entry["workgroup_count"]))
    out = subprocess.run(
        [tool, "--device=local-sync", f"--executable_format={host.iree_format}",
         f"--executable_file={SAMPLES / entry['file']}", "--entry_point=0",
         f"--workgroup_count={wc}", *specs, *[f"--constant={c}" for c in entry["constants"]],
         "--benchmark_format=json", f"--benchmark_min_time={seconds}s"],
        capture_output=True, text=True, check=True).stdout
    bench = json.loads(out)["benchmarks"][0]
    assert bench["time_unit"] == "ns"
    return bench["real_time"] * 1e-9


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kernel", default="matmul",
                        choices=sorted(load_manifest()["kernels"]))
    parser.add_argument("--seconds", type=float, default=1.0)
    args = parser.parse_args()
    kernel = load_manifest()["kernels"][args.kernel]
    print(f"machine: {platform.machine()}, {platform.processor() or 'cpu'}, "
          f"python {platform.python_version()}")
    print(f"kernel: {args.kernel} ({kernel['description']})")
    native = time_ours(kernel, "x86_64", "native", args.seconds)
    iree = time_iree(kernel, args.seconds)
    print(f"{'runner':<34} {'per dispatch':>14} {'ratio':>14}")
    if iree:
        print(f"{'iree-benchmark-executable x86_64':<34} {iree * 1e6:>11.2f} us "
              f"{'1.00 (peer)':>14}")
        print(f"{'hal_cpu native x86_64':<34} {native * 1e6:>11.2f} us "
              f"{native / iree:>10.1f}x iree")
    else:
        print(f"{'hal_cpu native x86_64':<34} {native * 1e6:>11.2f} us")
    for arch in ("x86_64", "aarch64", "riscv64"):
        t = time_ours(kernel, arch, "emulated", args.seconds)
        print(f"{'hal_cpu emulated ' + arch:<34} {t * 1e6:>11.2f} us "
              f"{t / native:>8.1f}x native")


if __name__ == "__main__":
    main()
