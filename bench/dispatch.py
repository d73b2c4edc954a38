"""Per-dispatch time of the bundled sample executables through our native
backend and through IREE's ``iree-benchmark-executable`` (the peer), plus
our emulated backends as a ratio to our native one.

Usage: python bench/dispatch.py [--quick] [--rounds R] [--seconds S]
           [--kernel matmul|mul_add|sum_last ...] [--no-emulated]
           [--run-command | --no-run-command]

The samples (``hal_cpu/samples``, listed in its ``manifest.json``) are the
same MLIR compiled for every architecture. For each kernel the cases are:

* ``iree-benchmark-executable --device=local-sync`` (IREE's runtime, one
  thread) on the host build, with the manifest's workgroup count, bindings
  (inputs filled with 1, outputs with 0) and constants: its ``real_time``
  per dispatch, ``--benchmark_min_time=S``;
* ``hal_cpu.Executable(..., backend="native").dispatch(..., workers=1)`` on
  the same file with the same workgroup count, constants and binding
  contents: the mean per call over a batch of calls lasting about S
  seconds (the call count is fixed per case before the rounds);
* the emulated backend on the x86_64, aarch64 and riscv64 builds, the same
  way, as a ratio to our native figure.

A last table compares ``hal-cpu run FILE --benchmark_repetitions=N`` (the
README's ``sum_last`` command, one process per round, N the call count of
the API case) with ``Executable.dispatch`` called N times in a loop on the
same file, grid and bindings with the default worker count: the run's mean,
median and min per repetition against the API's mean per call (target: at
most 1.2x). ``--run-command`` runs only this comparison.

Our bindings are numpy arrays placed at 64-byte aligned addresses, so the
native backend uses them in place (no copy). Each round runs every case
once, in an order rotated by one per round (``bench/_timing.py``); the
tables give min and median over the rounds.

The helpers here (aligned arrays, binding specs, the
``iree-benchmark-executable`` measurement, batched calls) are also used by
``bench/grid_sweep.py`` and ``bench/matmul.py``.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import sysconfig
import time
from pathlib import Path
from typing import Callable, Sequence

import _timing as T
import numpy as np

import fatelf.arches as A
from hal_cpu import Executable
from hal_cpu.buffers import dtype_name

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ROOT / "hal_cpu" / "samples"
EMULATED = ("x86_64", "aarch64", "riscv64")


# --- shared helpers -----------------------------------------------------------
def aligned_array(shape: Sequence[int], dtype, fill=0, align: int = 64) -> np.ndarray:
    """A C-contiguous array whose data starts at a multiple of ``align``
    bytes: a view at an offset into a larger uint8 buffer."""
    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    raw = np.empty(nbytes + align, np.uint8)
    start = (-raw.ctypes.data) % align
    out = raw[start:start + nbytes].view(dtype).reshape(tuple(shape))
    out[...] = fill
    assert out.ctypes.data % align == 0 and out.flags.c_contiguous
    return out


def binding_spec(shape: Sequence[int], dtype, fill) -> str:
    """IREE binding flag value, e.g. ``131072x16xf32=1``."""
    dims = "x".join(str(d) for d in shape)
    return f"{dims}x{dtype_name(np.dtype(dtype))}={fill}" if dims else \
        f"{dtype_name(np.dtype(dtype))}={fill}"


def find_tool(name: str) -> str | None:
    """``name`` on PATH or in this interpreter's scripts directory."""
    found = shutil.which(name)
    if found:
        return found
    scripts = sysconfig.get_path("scripts")
    candidate = Path(scripts) / name if scripts else None
    return str(candidate) if candidate is not None and candidate.is_file() else None


_UNITS = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0}


def benchmark_args(iree_format: str, so: Path, entry_point: int,
                   workgroup_count: Sequence[int], bindings: Sequence[str],
                   constants: Sequence[int] = ()) -> list[str]:
    """``iree-benchmark-executable`` flags for one dispatch, JSON output."""
    return [f"--executable_format={iree_format}", f"--executable_file={so}",
            f"--entry_point={entry_point}",
            "--workgroup_count=" + ",".join(map(str, workgroup_count)),
            *[f"--binding={b}" for b in bindings],
            *[f"--constant={c}" for c in constants], "--benchmark_format=json"]


def run_benchmark(argv: Sequence[str]) -> tuple[float, float]:
    """Run an ``iree-benchmark-executable`` command (``--benchmark_format=
    json``); its first benchmark's (real time, CPU time) per iteration, in
    seconds."""
    proc = subprocess.run(argv, capture_output=True, text=True)
    if proc.returncode:
        raise RuntimeError(f"{' '.join(map(str, argv))}: exit status "
                           f"{proc.returncode}\n{proc.stderr[-2000:]}")
    bench = json.loads(proc.stdout)["benchmarks"][0]
    scale = _UNITS[bench["time_unit"]]
    return bench["real_time"] * scale, bench["cpu_time"] * scale


class IreeBenchmark:
    """One ``iree-benchmark-executable`` run per call: its ``real_time`` per
    dispatch in seconds (Google Benchmark counts the ``--batch_size``
    dispatches of each iteration as separate iterations)."""

    def __init__(self, so: Path, iree_format: str, entry_point: int,
                 workgroup_count: Sequence[int], bindings: Sequence[str],
                 constants: Sequence[int] = (), *, device: str = "local-sync",
                 min_time: float = 0.2, extra: Sequence[str] = ()):
        tool = find_tool("iree-benchmark-executable")
        if tool is None:
            raise FileNotFoundError("iree-benchmark-executable not found "
                                    "(pip install iree-base-runtime)")
        self.argv = [tool, f"--device={device}",
                     *benchmark_args(iree_format, so, entry_point,
                                     workgroup_count, bindings, constants),
                     f"--benchmark_min_time={min_time}s", *extra]

    def __call__(self) -> float:
        return run_benchmark(self.argv)[0]


def calls_for(call: Callable[[], object], seconds: float, *, at_most: int = 1 << 20) -> int:
    """How many calls of ``call`` last about ``seconds`` (at least 1); runs
    ``call`` a few times to find out (which also warms it up)."""
    call()
    n = 1
    while n < at_most:
        start = time.perf_counter()
        for _ in range(n):
            call()
        elapsed = time.perf_counter() - start
        if elapsed >= seconds / 4:
            return max(1, min(at_most, round(n * seconds / elapsed)))
        n *= 4
    return at_most


def batched(call: Callable[[], object], calls: int) -> T.Measure:
    """Measurement: mean seconds per call over ``calls`` back-to-back calls."""
    def measure() -> float:
        start = time.perf_counter()
        for _ in range(calls):
            call()
        return (time.perf_counter() - start) / calls
    return measure


def dispatcher(exe: Executable, export, workgroup_count, arrays, constants,
               workers: int | None) -> Callable[[], None]:
    """A no-argument function running one dispatch."""
    dispatch = exe.dispatch
    wc, consts = tuple(workgroup_count), list(constants)
    return lambda: dispatch(export, wc, arrays, consts, workers=workers)


def versions() -> str:
    """numpy, unicorn and IREE runtime versions, one line."""
    import importlib.metadata as md
    found = []
    for dist in ("numpy", "unicorn", "iree-base-runtime", "iree-base-compiler"):
        try:
            found.append(f"{dist} {md.version(dist)}")
        except md.PackageNotFoundError:
            found.append(f"{dist} -")
    return ", ".join(found)


def loadavg() -> str:
    """``/proc/loadavg`` (1, 5, 15 minute load), or ``?``."""
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "?"


# --- hal-cpu run --benchmark_repetitions -------------------------------------
#: the README's timing command
RUN_ARGS = ["--entry_point=0", "--workgroup_count=9,1,1", "--binding=9x129xf32=1",
            "--binding=9xf32", "--print_bindings=none"]
_RUN_LINE = re.compile(r"dispatch time \(.*, (\d+) repetitions\): min ([\d.]+) us, "
                       r"median ([\d.]+) us, mean ([\d.]+) us")


class RunRepetitions:
    """One ``hal-cpu run FILE --benchmark_repetitions=N`` process per call:
    its mean per repetition in seconds (its min and median are kept in
    ``mins``/``medians``)."""

    def __init__(self, so: Path, args: Sequence[str], repetitions: int):
        self.argv = [sys.executable, "-m", "hal_cpu", "run", str(so), *args,
                     f"--benchmark_repetitions={repetitions}"]
        self.mins: list[float] = []
        self.medians: list[float] = []

    def __call__(self) -> float:
        proc = subprocess.run(self.argv, capture_output=True, text=True, cwd=ROOT)
        match = _RUN_LINE.search(proc.stdout)
        if proc.returncode or not match:
            raise RuntimeError(f"{' '.join(self.argv)}: exit status "
                               f"{proc.returncode}\n{proc.stderr[-2000:]}")
        self.mins.append(float(match[2]) * 1e-6)
        self.medians.append(float(match[3]) * 1e-6)
        return float(match[4]) * 1e-6


def run_command_section(rounds: int, seconds: float, native: str) -> None:
    """``hal-cpu run --benchmark_repetitions`` per repetition against
    ``Executable.dispatch`` called in a loop (same file, grid, bindings,
    default workers); target: at most 1.2x."""
    import hal_cpu
    so = SAMPLES / f"sum_last_{native}.so"
    exe = Executable(so, backend="native")
    arrays = [hal_cpu.full((9, 129), 1, np.float32), hal_cpu.zeros(9, np.float32)]
    call = dispatcher(exe, 0, (9, 1, 1), arrays, (), workers=None)
    calls = calls_for(call, seconds)
    run = RunRepetitions(so, RUN_ARGS, calls)
    cases = {"api": batched(call, calls), "run": run}
    try:
        stats = T.interleave(cases, rounds, progress=True)
    finally:
        exe.close()
    print(f"\nhal-cpu run --benchmark_repetitions={calls} (sum_last, "
          f"{native}, workgroups [9, 1, 1]) against Executable.dispatch in a "
          f"loop; target: run at most 1.2x the API; load average after "
          f"{loadavg()}")
    api = stats["api"]
    mean = stats["run"]
    median = T.Stats("run median", run.medians)
    low = T.Stats("run min", run.mins)
    table = [["Executable.dispatch (mean of a batch)",
              *T.stats_cells(api, None), ""],
             ["run: mean per repetition", *T.stats_cells(mean, api), "API"],
             ["run: median per repetition", *T.stats_cells(median, api), "API"],
             ["run: min per repetition", *T.stats_cells(low, api), "API"]]
    print(T.table(["runner", "min", "median", "ratio (median)", "to"], table))
    met = mean.median <= 1.2 * api.median
    print(f"target run <= 1.2x API: measured {mean.median / api.median:.2f}x "
          f"(mean per repetition, medians over rounds; min "
          f"{mean.min / api.min:.2f}x): {'met' if met else 'NOT met'}")


# --- this benchmark -----------------------------------------------------------
def sample_arrays(kernel: dict) -> list[np.ndarray]:
    """Aligned arrays for the manifest's bindings: inputs 1, outputs 0."""
    return [aligned_array(b["shape"], b["dtype"], 1 if b["role"] == "input" else 0)
            for b in kernel["bindings"]]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    T.add_common_args(parser, rounds=7, quick_rounds=3)
    manifest = json.loads((SAMPLES / "manifest.json").read_text())
    names = sorted(manifest["kernels"])
    parser.add_argument("--kernel", action="append", choices=names,
                        help="kernel to run (repeatable; default: all)")
    parser.add_argument("--seconds", type=float, default=None,
                        help="length of each sample (default 0.3, --quick: 0.1)")
    parser.add_argument("--no-emulated", action="store_true",
                        help="skip the emulated backends")
    parser.add_argument("--run-command", action="store_true",
                        help="only: hal-cpu run --benchmark_repetitions "
                        "against Executable.dispatch (sum_last)")
    parser.add_argument("--no-run-command", action="store_true",
                        help="skip the hal-cpu run --benchmark_repetitions "
                        "comparison")
    args = parser.parse_args()
    rounds = T.rounds_of(args)
    seconds = args.seconds or (0.1 if args.quick else 0.3)
    host = A.host()
    native = host.name if host is not None and host.runtime else None
    load_before = loadavg()
    if args.run_command:
        if native is None:
            raise SystemExit("--run-command needs a host the native backend "
                             "runs on")
        run_command_section(rounds, seconds, native)
        return 0

    cases: dict[str, T.Measure] = {}
    rows_of: dict[str, list[tuple[str, str, str]]] = {}
    opened: list[Executable] = []
    for name in args.kernel or names:
        kernel = manifest["kernels"][name]
        rows = rows_of[name] = []
        arrays = sample_arrays(kernel)
        if native and native in kernel["per_arch"]:
            entry = kernel["per_arch"][native]
            exe = Executable(SAMPLES / entry["file"], backend="native")
            opened.append(exe)
            ordinal = exe.export(kernel["export"]).ordinal
            if find_tool("iree-benchmark-executable"):
                specs = [binding_spec(b["shape"], b["dtype"],
                                      1 if b["role"] == "input" else 0)
                         for b in kernel["bindings"]]
                key = f"{name} iree"
                cases[key] = IreeBenchmark(SAMPLES / entry["file"], host.iree_format,
                                           ordinal, entry["workgroup_count"], specs,
                                           entry["constants"], min_time=seconds)
                rows.append((key, f"iree-benchmark-executable local-sync {native}", "iree"))
            call = dispatcher(exe, ordinal, entry["workgroup_count"], arrays,
                              entry["constants"], workers=1)
            key = f"{name} native"
            cases[key] = batched(call, calls_for(call, seconds))
            rows.append((key, f"hal_cpu native {native}, workers=1", "iree"))
        if not args.no_emulated:
            for arch in EMULATED:
                entry = kernel["per_arch"][arch]
                exe = Executable(SAMPLES / entry["file"], backend="emulated")
                opened.append(exe)
                call = dispatcher(exe, kernel["export"], entry["workgroup_count"],
                                  arrays, entry["constants"], workers=1)
                key = f"{name} emulated {arch}"
                cases[key] = batched(call, calls_for(call, seconds))
                rows.append((key, f"hal_cpu emulated {arch}", "native"))
    try:
        stats = T.interleave(cases, rounds, progress=True)
    finally:
        for exe in opened:
            exe.close()

    print(T.machine_line())
    print(f"{versions()}; {rounds} rounds of about {seconds:g} s per case; "
          f"load average before {load_before}, after {loadavg()}")
    print("per dispatch; ours: mean of a batch of Executable.dispatch calls; "
          "iree: real_time of iree-benchmark-executable")
    for name, rows in rows_of.items():
        kernel = manifest["kernels"][name]
        wc = kernel["per_arch"].get(native or "x86_64", {}).get("workgroup_count")
        print(f"\n{name}: {kernel['description']}; workgroups {wc}")
        table = []
        for key, label, peer in rows:
            peer_stats = stats.get(f"{name} {peer}")
            table.append([label, *T.stats_cells(stats[key], peer_stats),
                          peer if peer_stats is not None else ""])
        print(T.table(["runner", "min", "median", "ratio (median)", "to"], table))
    if native and not args.no_run_command:
        run_command_section(rounds, seconds, native)
    return 0


if __name__ == "__main__":
    sys.exit(main())
