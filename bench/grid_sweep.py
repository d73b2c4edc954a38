"""Dispatch cost against grid size: fixed cost and per-workgroup slope of
our native and emulated backends and of IREE's ``iree-benchmark-executable``.

Usage: python bench/grid_sweep.py [--quick] [--rounds R] [--seconds S]
           [--emulated-rounds R] [--grid X ...] [--no-emulated]
           [--engine qemu,unicorn] [--no-speedup]

The kernel is ``bench/programs/rowsum.mlir`` (row sums of a 131072x16
float32 matrix), compiled with ``hal_cpu.programs.compile_program`` for x86_64
(generic CPU, flags from ``fatelf.arches``; cached by content hash) and, for
the emulated cases, for aarch64 and riscv64. ``hal_cpu.programs.vm.plan_program`` gives the
export, the bindings and the natural workgroup count (4096 workgroups of 32
rows each). Each case dispatches a grid of X workgroups, (X, 1, 1), for X in
1, 16, 256, 4096: a workgroup past X is not run, so smaller grids compute
only the first X * 32 row sums (enough for timing; grids larger than the
natural one would write past the output, as IREE's kernels do not check).

* ``iree-benchmark-executable --device=local-sync`` (IREE's runtime, one
  thread; default ``--batch_size``: 64 dispatches per submission) on the
  x86_64 file, ``--workgroup_count=X,1,1``, inputs filled with 1: its
  ``real_time`` per dispatch, ``--benchmark_min_time=S``;
* ours natively: ``Executable(..., backend="native").dispatch(export,
  (X, 1, 1), bindings, workers=1)``, mean per call over a batch of calls
  lasting about S seconds; the bindings are numpy arrays at 64-byte aligned
  addresses (filled with 1 / 0), used in place;
* ours emulated (x86_64, aarch64, riscv64 builds) on each engine of
  ``--engine`` (default both: ``qemu``, qemu-user running our guest agent,
  with its most capable CPU model; ``unicorn``, in process): one call per
  round, in rounds of their own (``--emulated-rounds``). Emulated
  dispatches copy the 8.5 MB of bindings into guest memory and back, which
  is in the fixed cost.

A dispatch function that returns 0 at once (a few bytes of machine code
per architecture, ``TRIVIAL``) is also run emulated on grids of 1 and 4096
workgroups through ``hal_cpu.dispatch.run_grid``: the difference per
workgroup is the emulated per-workgroup overhead without kernel work
(per engine and architecture).

Emulated speed-up with two workers, per engine and architecture: a
256x256x256 f32 matmul (``programs/matmul256.mlir``, 16 workgroups,
generic build, inputs 0.1) dispatched with ``workers=1`` and ``workers=2``
(``Executable.last_workers`` must say 2), one dispatch per round, in the
emulated rounds; the table gives ``workers=1`` / ``workers=2``, min and
median (``--no-speedup`` skips it). With the qemu engine each worker is an
agent process of its own. Column ``cpu/wall`` is the CPU time of this
process and the agents over the wall time of the two-worker samples:
below 2 means the second core was not free all the time.

For each runner a least-squares line t = fixed + slope * X through the
medians (and through the minima) of the grid sizes gives the fixed cost and
the per-workgroup slope; the slope includes the kernel's own work (32 rows
of 16 floats per workgroup), so for the emulated backend it is an upper
bound on the per-workgroup overhead.
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
from hal_cpu.programs.vm import plan_program

HERE = Path(__file__).resolve().parent
PROGRAM = HERE / "programs" / "rowsum.mlir"
SHAPE = (131072, 16)
GRIDS = (1, 16, 256, 4096)
EMULATED = ("x86_64", "aarch64", "riscv64")
ENGINES = ("qemu", "unicorn")
MATMUL = HERE / "programs" / "matmul256.mlir"
MATMUL_N = 256


def fit(xs, ys) -> tuple[float, float]:
    """Least-squares (fixed, slope) of ys = fixed + slope * xs."""
    slope, fixed = np.polyfit(np.asarray(xs, float), np.asarray(ys, float), 1)
    return float(fixed), float(slope)


def fmt_signed(seconds: float) -> str:
    """:func:`_timing.fmt_time` that keeps a minus sign (a fitted fixed
    cost can come out below zero)."""
    return "-" + T.fmt_time(-seconds) if seconds < 0 else T.fmt_time(seconds)


def short(runner: str | None) -> str:
    """``iree`` or ``native``: the peer column of the tables."""
    if runner is None:
        return ""
    return "iree" if runner.startswith("iree") else "native"


def plan_for(arch: str):
    """(compiled, dispatch) of the row-sum program for ``arch``."""
    compiled = iree.compile_program(PROGRAM, arch)
    plan = plan_program(compiled, [np.empty(SHAPE, np.float32)])
    (dispatch,) = plan.dispatches
    return compiled, dispatch


#: A dispatch function that returns 0 at once (machine code per
#: architecture): the workgroup loop's own cost under emulation.
TRIVIAL = {
    "x86_64": bytes.fromhex("31c0c3"),              # xor eax, eax; ret
    "aarch64": bytes.fromhex("00008052c0035fd6"),   # mov w0, #0; ret
    "riscv64": bytes.fromhex("1305000067800000"),   # li a0, 0; ret
}
#: Grid of the trivial kernel: the slope is (t(N) - t(1)) / (N - 1).
TRIVIAL_GRID = 4096


def trivial_cases(arch: str, engine: str):
    """(backend, {grid: measure}) for the trivial kernel on the emulated
    backend of ``arch`` on ``engine``, run by
    :func:`hal_cpu.dispatch.run_grid` like any export (workers=1)."""
    import elfloader
    from elfloader.backend.emulated import EmulatedBackend
    from hal_cpu import dispatch as D
    be = EmulatedBackend(elfloader.arch.by_name(arch), engine=engine)
    fn = be.place_code(TRIVIAL[arch])
    env = be.alloc(256, 64)
    layout = D.DispatchLayout(be, 0, 0, 1, 0)
    cases = {}
    for g in (1, TRIVIAL_GRID):
        def call(g=g):
            layout.write((1, 1, 1), (g, 1, 1), 1, [], [], [], g)
            D.run_grid(be, layout, fn, env, g, label="trivial", path="<trivial>",
                       grid=(g, 1, 1))
        call()
        cases[g] = T.wall(call)
    return be, cases


def speedup_cases(arch: str, engine: str):
    """(executable, {workers: measure}) for the 256^3 matmul on ``engine``
    with one and two workers; checks the result once."""
    compiled = iree.compile_program(MATMUL, arch)
    shape = np.empty((MATMUL_N, MATMUL_N), np.float32)
    (d,) = plan_program(compiled, [shape, shape]).dispatches
    exe = Executable(d.so_path, backend="emulated", engine=engine)
    data = [aligned_array(shape.shape, np.float32, v) for v in (0.1, 0.1, 0)]
    cases = {}
    for workers in (1, 2):
        call = dispatcher(exe, d.export_name, d.workgroup_count, data,
                          d.constants, workers)
        call()      # warm-up: translation, and each worker's CPU started
        if exe.last_workers != workers:
            raise RuntimeError(f"{engine} {arch}: workers={workers} ran "
                               f"{exe.last_workers} workers")
        expected = np.float32(0.1) * np.float32(0.1) * MATMUL_N
        if not np.allclose(data[2], expected, rtol=1e-4):
            raise RuntimeError(f"{engine} {arch}: wrong matmul result")
        cases[workers] = busy(exe, T.wall(call), BUSY.setdefault(
            (engine, arch, workers), []))
    return exe, cases


#: (engine, arch, workers) -> CPU time over wall time of each sample.
BUSY: dict[tuple[str, str, int], list[float]] = {}


def busy(exe: Executable, measure: T.Measure, out: list[float]) -> T.Measure:
    """``measure``, appending to ``out`` the CPU time of this process and
    of the qemu engine's agents over the wall time of each sample: about
    how many cores the dispatch had busy (other work on a shared machine
    takes its share)."""
    from emulator_vs_qemu import engine_cpu

    def wrapped():
        cpu0 = time.process_time() + engine_cpu(exe.backend)
        wall0 = time.perf_counter()
        seconds = measure()
        wall = time.perf_counter() - wall0
        cpu = time.process_time() + engine_cpu(exe.backend) - cpu0
        out.append(cpu / wall if wall else 0.0)
        return seconds
    return wrapped


def engine_list(text: str) -> list[str]:
    """``qemu,unicorn`` -> ``["qemu", "unicorn"]`` (argparse type)."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names or any(n not in ENGINES for n in names):
        raise argparse.ArgumentTypeError(
            f"engines are a comma-separated list of {', '.join(ENGINES)}")
    return list(dict.fromkeys(names))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    T.add_common_args(parser, rounds=7, quick_rounds=3)
    parser.add_argument("--seconds", type=float, default=None,
                        help="length of each native and IREE sample (default "
                             "0.3, --quick: 0.1)")
    parser.add_argument("--emulated-rounds", type=int, default=None,
                        help="rounds of the emulated cases (default 5, "
                             "--quick: 2)")
    parser.add_argument("--grid", type=int, action="append",
                        help="workgroup count X of a case (repeatable; default "
                             "1 16 256 4096)")
    parser.add_argument("--no-emulated", action="store_true",
                        help="skip the emulated backends")
    parser.add_argument("--engine", type=engine_list, default=list(ENGINES),
                        help="emulation engines, comma-separated (default "
                             "qemu,unicorn)")
    parser.add_argument("--no-speedup", action="store_true",
                        help="skip the emulated workers=2 / workers=1 matmul")
    args = parser.parse_args()
    rounds = T.rounds_of(args)
    emu_rounds = args.emulated_rounds or (2 if args.quick else 5)
    seconds = args.seconds or (0.1 if args.quick else 0.3)
    grids = tuple(sorted(set(args.grid or GRIDS)))
    load_before = loadavg()

    host = A.host()
    x86 = A.lookup("x86_64")
    compiled, dispatch = plan_for("x86_64")
    natural = dispatch.workgroup_count
    if any(g > natural[0] for g in grids) or natural[1:] != (1, 1):
        parser.error(f"the planned grid is {natural}; grids must be (X, 1, 1) "
                     f"with X <= {natural[0]}")
    x = aligned_array(SHAPE, np.float32, 1)
    y = aligned_array(SHAPE[:1], np.float32, 0)
    lengths = [b.length for b in dispatch.bindings]
    assert lengths == [x.nbytes, y.nbytes], lengths
    specs = [binding_spec(SHAPE, np.float32, 1), binding_spec(SHAPE[:1], np.float32, 0)]

    native_cases: dict[str, T.Measure] = {}
    opened: list[Executable] = []
    runners = []
    if host is not None and host.name == "x86_64":
        exe = Executable(dispatch.so_path, backend="native")
        opened.append(exe)
        ordinal = exe.export(dispatch.export_name).ordinal
        if find_tool("iree-benchmark-executable"):
            runners.append("iree-benchmark-executable local-sync")
            for g in grids:
                native_cases[f"{runners[-1]} {g}"] = IreeBenchmark(
                    dispatch.so_path, x86.iree_format, ordinal, (g, 1, 1), specs,
                    dispatch.constants, min_time=seconds)
        runners.append("ours native workers=1")
        for g in grids:
            call = dispatcher(exe, ordinal, (g, 1, 1), [x, y], dispatch.constants, 1)
            native_cases[f"{runners[-1]} {g}"] = batched(call, calls_for(call, seconds))
    else:
        print("host is not x86_64: native and IREE cases skipped")

    emu_cases: dict[str, T.Measure] = {}
    trivial_backends = []
    engines = [] if args.no_emulated else args.engine
    described: dict[tuple[str, str], str] = {}
    for engine in engines:
        for arch in EMULATED:
            be, cases = trivial_cases(arch, engine)
            trivial_backends.append(be)
            described[engine, arch] = be.describe()
            for g, m in cases.items():
                emu_cases[f"trivial {engine} {arch} {g}"] = m
        for arch in EMULATED:
            _, d = plan_for(arch)
            if d.workgroup_count != natural:
                print(f"{arch}: planned grid {d.workgroup_count} differs from "
                      f"x86_64's {natural}")
            exe = Executable(d.so_path, backend="emulated", engine=engine)
            opened.append(exe)
            runners.append(f"ours emulated {engine} {arch}")
            for g in grids:
                call = dispatcher(exe, d.export_name, (g, 1, 1), [x, y], d.constants, 1)
                call()  # warm-up: translation of the kernel's code
                emu_cases[f"{runners[-1]} {g}"] = T.wall(call)
        if not args.no_speedup:
            for arch in EMULATED:
                exe, cases = speedup_cases(arch, engine)
                opened.append(exe)
                for w, m in cases.items():
                    emu_cases[f"matmul {engine} {arch} workers={w}"] = m

    try:
        stats = T.interleave(native_cases, rounds, progress=True)
        stats.update(T.interleave(emu_cases, emu_rounds, progress=True))
    finally:
        for exe in opened:
            exe.close()
        for be in trivial_backends:
            be.close()

    print(T.machine_line())
    print(f"{versions()}; load average before {load_before}, after {loadavg()}")
    print(f"kernel: {PROGRAM.relative_to(HERE.parent)}, export "
          f"{dispatch.export_name}, planned grid {natural}; x86_64 generic CPU")
    print(f"native and IREE: {rounds} rounds of about {seconds:g} s per case; "
          f"emulated: {emu_rounds} rounds of one call")
    iree_name = next((r for r in runners if r.startswith("iree")), None)
    native_name = next((r for r in runners if "native" in r), None)

    def peer_of(runner: str) -> str | None:
        """Native figures are compared with IREE's, emulated ones with ours
        natively."""
        if runner.startswith("iree"):
            return None
        return native_name if "emulated" in runner else iree_name

    rows = []
    for g in grids:
        for r in runners:
            peer = peer_of(r)
            other = stats.get(f"{peer} {g}") if peer else None
            rows.append([g, r, *T.stats_cells(stats[f"{r} {g}"], other),
                         short(peer) if other is not None else ""])
    print("\nper dispatch; ratio to the runner in the last column (same grid)")
    print(T.table(["workgroups", "runner", "min", "median", "ratio (median)", "to"],
                  rows))

    fits = {}
    for r in runners:
        ss = [stats[f"{r} {g}"] for g in grids]
        if len(grids) >= 2 and all(s.ok for s in ss):
            fits[r] = (fit(grids, [s.median for s in ss]), fit(grids, [s.min for s in ss]))
    rows = []
    for r, ((fixed, slope), (fixed_min, slope_min)) in fits.items():
        ratio = ratio_min = to = "-"
        peer = peer_of(r)
        if peer in fits:
            ratio = T.ratio(slope, fits[peer][0][1])
            ratio_min = T.ratio(slope_min, fits[peer][1][1])
            to = short(peer)
        rows.append([r, fmt_signed(fixed), fmt_signed(slope), ratio,
                     fmt_signed(fixed_min), fmt_signed(slope_min), ratio_min, to])
    print("\nleast squares t = fixed + slope * workgroups over "
          + ", ".join(map(str, grids)) + " workgroups (through the medians; "
          "through the minima)")
    print(T.table(["runner", "fixed", "slope", "slope ratio", "fixed (min)",
                   "slope (min)", "slope ratio (min)", "to"], rows))

    if trivial_backends:
        rows = []
        for engine in engines:
            for arch in EMULATED:
                one, many = (stats[f"trivial {engine} {arch} {g}"]
                             for g in (1, TRIVIAL_GRID))
                if one.ok and many.ok:
                    per = [(m - o) / (TRIVIAL_GRID - 1) for m, o in
                           ((many.median, one.median), (many.min, one.min))]
                    rows.append([engine, arch, T.fmt_time(one.median),
                                 T.fmt_time(many.median), fmt_signed(per[0]),
                                 fmt_signed(per[1])])
        print(f"\nemulated per-workgroup overhead: a dispatch function that "
              f"returns 0 at once, grids of 1 and {TRIVIAL_GRID} workgroups "
              "(workers=1); overhead = (t(N) - t(1)) / (N - 1)")
        print(T.table(["engine", "arch", "1 workgroup", f"{TRIVIAL_GRID} workgroups",
                       "overhead (median)", "overhead (min)"], rows))
        for (engine, arch), text in described.items():
            print(f"  {engine} {arch}: {text}")
    rows = []
    for engine in engines:
        for arch in EMULATED:
            one = stats.get(f"matmul {engine} {arch} workers=1")
            two = stats.get(f"matmul {engine} {arch} workers=2")
            if one and two and one.ok and two.ok:
                rows.append([engine, arch, T.fmt_time(one.median),
                             T.fmt_time(two.median),
                             T.ratio(one.median, two.median),
                             T.ratio(one.min, two.min),
                             f"{statistics.median(BUSY[engine, arch, 2]):.2f}"])
    if rows:
        print(f"\nemulated speed-up with two workers: {MATMUL.name} "
              f"({MATMUL_N}^3 f32, 16 workgroups, generic builds), one "
              f"dispatch per sample; speed-up = workers=1 / workers=2")
        print(T.table(["engine", "arch", "workers=1 (median)",
                       "workers=2 (median)", "speed-up (median)",
                       "speed-up (min)", "cpu/wall (workers=2)"], rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
