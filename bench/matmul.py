"""A 512x512x512 float32 matmul through our native backend (one worker and
all workers) against ``iree-benchmark-executable`` with IREE's single-thread
and multi-thread devices, plus our emulated backend.

Usage: python bench/matmul.py [--quick] [--rounds R] [--seconds S]
           [--emulated-rounds R] [--no-emulated] [--no-host-build]

The program is ``bench/programs/matmul512.mlir`` (``lhs @ rhs`` on a
zero-filled init: one dispatch, 64 workgroups), compiled with
``hal_cpu.programs.compile_program`` (cached by content hash):

* for x86_64 with the table's flags (``fatelf.arches``: generic CPU), and
  with ``--iree-llvmcpu-target-cpu=host`` added (this machine's vector
  units);
* for aarch64 and riscv64 with the table's (generic) flags, for the
  emulated backend.

``hal_cpu.programs.vm.plan_program`` (a record-only call on the VM) gives the
export, workgroup count and bindings. For each
x86_64 build the native cases are, on the same file, export, workgroup
count and binding contents (inputs all 1.0, output 0):

* ``iree-benchmark-executable --device=local-sync`` (IREE's runtime, one
  thread) and ``--device=local-task`` (IREE's task system, its default
  topology: one worker per physical core): ``real_time`` per dispatch,
  ``--benchmark_min_time=S``;
* ours: ``Executable(..., backend="native").dispatch(...)`` with
  ``workers=1`` and with the default (every CPU this process may use),
  mean per call over a batch of calls lasting about S seconds. The bindings
  are numpy arrays at 64-byte aligned addresses, used in place.

The emulated cases (x86_64, aarch64, riscv64 generic builds) time one
dispatch per round with ``workers=1`` and with the default, in rounds of
their own (``--emulated-rounds``; each dispatch takes seconds); they are
given as a ratio to our native ``workers=1`` time on the generic x86_64
build, and ``workers=1`` over ``workers=default`` per architecture. Every
label of ours says how many workers the dispatch ran
(``Executable.last_workers``), and column ``cpu/wall`` gives the process
CPU time over the wall time of its samples: about how many threads were
busy at once (other processes on the machine take their share too).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import _timing as T
import numpy as np
from dispatch import (
    IreeBenchmark,
    aligned_array,
    batched,
    binding_spec,
    calls_for,
    dispatcher,
    find_tool,
    loadavg,
    versions,
)

import fatelf.arches as A
from hal_cpu import Executable
from hal_cpu import programs as iree
from hal_cpu.dispatch_policy import host_workers
from hal_cpu.programs.vm import plan_program

HERE = Path(__file__).resolve().parent
PROGRAM = HERE / "programs" / "matmul512.mlir"
N = 512
EMULATED = ("x86_64", "aarch64", "riscv64")
HOST_CPU = "--iree-llvmcpu-target-cpu=host"


def plan_for(arch: str, extra_flags=()):
    compiled = iree.compile_program(PROGRAM, arch, extra_flags=extra_flags)
    shape = np.empty((N, N), np.float32)
    (dispatch,) = plan_program(compiled, [shape, shape]).dispatches
    return dispatch


def arrays() -> list[np.ndarray]:
    return [aligned_array((N, N), np.float32, 1.0), aligned_array((N, N), np.float32, 1.0),
            aligned_array((N, N), np.float32, 0.0)]


#: case name -> ``Executable.last_workers`` after its latest sample.
RAN: dict[str, int] = {}
#: case name -> process CPU time / wall time of each sample.
CPU: dict[str, list[float]] = {}


def ran_workers(exe: Executable, key: str, measure: T.Measure) -> T.Measure:
    """``measure``, noting in :data:`RAN` how many workers the dispatch used
    and in :data:`CPU` the process CPU time over the wall time of the sample
    (about the number of threads busy at once)."""
    def wrapped():
        wall0, cpu0 = time.perf_counter(), time.process_time()
        seconds = measure()
        wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
        RAN[key] = exe.last_workers
        CPU.setdefault(key, []).append(cpu / wall if wall else 0.0)
        return seconds
    return wrapped


def cpu_cell(key: str) -> str:
    """Median process CPU time / wall time of a case of ours, e.g. ``1.96``
    (empty for IREE's, which run in another process)."""
    values = CPU.get(key)
    return f"{statistics.median(values):.2f}" if values else ""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    T.add_common_args(parser, rounds=7, quick_rounds=3)
    parser.add_argument("--seconds", type=float, default=None,
                        help="length of each native and IREE sample (default "
                             "0.5, --quick: 0.2)")
    parser.add_argument("--emulated-rounds", type=int, default=None,
                        help="rounds of the emulated cases (default 2, "
                             "--quick: 1)")
    parser.add_argument("--no-emulated", action="store_true",
                        help="skip the emulated backends")
    parser.add_argument("--no-host-build", action="store_true",
                        help=f"skip the x86_64 build with {HOST_CPU}")
    args = parser.parse_args()
    rounds = T.rounds_of(args)
    emu_rounds = args.emulated_rounds or (1 if args.quick else 2)
    seconds = args.seconds or (0.2 if args.quick else 0.5)
    load_before = loadavg()
    host = A.host()
    x86 = A.lookup("x86_64")
    all_workers = host_workers()

    builds = {"generic": ()}
    if not args.no_host_build:
        builds["host"] = (HOST_CPU,)
    native_cases: dict[str, T.Measure] = {}
    emu_cases: dict[str, T.Measure] = {}
    labels: dict[str, str] = {}
    opened: list[Executable] = []
    specs = [binding_spec((N, N), np.float32, v) for v in (1, 1, 0)]
    grid = None
    peer = "generic ours workers=1"
    try:
        if host is not None and host.name == "x86_64":
            for build, flags in builds.items():
                d = plan_for("x86_64", flags)
                grid = d.workgroup_count
                exe = Executable(d.so_path, backend="native")
                opened.append(exe)
                ordinal = exe.export(d.export_name).ordinal
                if find_tool("iree-benchmark-executable"):
                    for device in ("local-sync", "local-task"):
                        key = f"{build} iree {device}"
                        native_cases[key] = IreeBenchmark(
                            d.so_path, x86.iree_format, ordinal, d.workgroup_count,
                            specs, d.constants, device=device, min_time=seconds)
                        labels[key] = f"iree-benchmark-executable --device={device}"
                data = arrays()
                for workers in (1, None):
                    key = f"{build} ours workers={workers or 'default'}"
                    call = dispatcher(exe, ordinal, d.workgroup_count, data,
                                      d.constants, workers)
                    native_cases[key] = ran_workers(
                        exe, key, batched(call, calls_for(call, seconds)))
                    labels[key] = f"ours native workers={workers or 'default'}"
                expected = np.full((N, N), float(N), np.float32)
                if not np.array_equal(data[2], expected):
                    raise RuntimeError(f"{build} build: wrong matmul result")
        else:
            print("host is not x86_64: native and IREE cases skipped")
        if not args.no_emulated:
            for arch in EMULATED:
                d = plan_for(arch)
                exe = Executable(d.so_path, backend="emulated")
                opened.append(exe)
                data = arrays()
                for workers in (1, None):
                    key = f"emulated {arch} workers={workers or 'default'}"
                    call = dispatcher(exe, d.export_name, d.workgroup_count, data,
                                      d.constants, workers)
                    if workers == 1:
                        call()  # warm-up (translation), and a check of the result
                        expected = np.full((N, N), float(N), np.float32)
                        if not np.array_equal(data[2], expected):
                            raise RuntimeError(f"emulated {arch}: wrong matmul result")
                    emu_cases[key] = ran_workers(exe, key, T.wall(call))
                    labels[key] = f"ours emulated {arch} workers={workers or 'default'}"
        stats = T.interleave(native_cases, rounds, progress=True)
        stats.update(T.interleave(emu_cases, emu_rounds, progress=True))
        for key, count in RAN.items():
            labels[key] += f" ({count} ran)"
    finally:
        for exe in opened:
            exe.close()

    print(T.machine_line())
    print(f"{versions()}; load average before {load_before}, after {loadavg()}")
    print(f"{PROGRAM.relative_to(HERE.parent)}: {N}x{N}x{N} f32 matmul, grid {grid}; "
          f"{all_workers} CPUs for workers=default")
    print(f"native and IREE: {rounds} rounds of about {seconds:g} s per case; "
          f"emulated: {emu_rounds} rounds of one dispatch")
    for build in builds:
        sync = stats.get(f"{build} iree local-sync")
        rows = [[labels[k], *T.stats_cells(s, sync), cpu_cell(k)]
                for k, s in stats.items() if k.startswith(build + " ")]
        if not rows:
            continue
        flags = " ".join(x86.iree_flags + builds[build])
        print(f"\nx86_64 {build} build ({flags}; the last --iree-llvmcpu-target-cpu "
              f"applies); per dispatch, ratio to iree local-sync")
        print(T.table(["runner", "min", "median", "ratio (median)", "cpu/wall"],
                      rows))
    rows = [[labels[k], *T.stats_cells(s, stats.get(peer)), cpu_cell(k)]
            for k, s in stats.items() if k.startswith("emulated ")]
    if rows:
        print("\nemulated, generic builds; per dispatch, ratio to ours native "
              "workers=1 on the generic x86_64 build")
        print(T.table(["runner", "min", "median", "ratio (median)", "cpu/wall"],
                      rows))
        for arch in EMULATED:
            one = stats.get(f"emulated {arch} workers=1")
            dflt = stats.get(f"emulated {arch} workers=default")
            if one and dflt and one.ok and dflt.ok:
                print(f"  {arch}: workers=1 / workers=default = "
                      f"{T.ratio(one.median, dflt.median)} (median), "
                      f"{T.ratio(one.min, dflt.min)} (min)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
