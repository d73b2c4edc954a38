"""Whole programs from ``.vmfb``: a loaded program's call against IREE's
tools, and the ``run-module`` process against ``iree-run-module``.

Usage: python bench/vm_programs.py [--quick] [--rounds R] [--seconds S]
           [--no-emulated]

The program is ``bench/programs/mlp.mlir`` (matmul 4x16 by 16x8, add,
relu, softmax: three dispatches), compiled by the pinned ``iree-compile``
for this machine and for aarch64. Cases:

* ``iree-benchmark-module --device=local-sync --function=predict`` (the
  peer): its ``real_time`` per call, ``--benchmark_min_time=S``;
* ``hal_cpu.programs.vm.load_program(vmfb, workers=1)``: the program loaded once,
  then ``predict`` called in a batch lasting about S seconds (the count is
  fixed before the rounds): mean per call, natively;
* the same on the aarch64 build, emulated (qemu engine where installed);
* ``iree.runtime`` (IREE's Python runtime, ``local-sync``): the same
  program loaded once in a ``SystemContext``, ``predict`` called from
  Python and its result read as a numpy array (``to_host()``), as ours
  returns one: mean per call of a batch;
* ``hal-cpu benchmark-module`` on the host build: its median per call
  (the command runs natively in a confined child, one fork per command:
  only the calls are counted); and with ``--replay``: the call's recorded
  dispatches replayed without the VM (one crossing for both), its results
  checked once against a call's;
* a 512x512 f32 matmul (``bench/programs/matmul512.mlir``, inputs of
  ones) through ``hal-cpu benchmark-module --device=local-sync
  --workers=1`` against ``iree-benchmark-module --device=local-sync``
  (one thread on both), per call;
* processes: ``hal-cpu run-module mlp.vmfb`` (cached program, native) and
  ``iree-run-module`` on the same file: wall time from spawn to exit. The
  Python processes run as users run them, with ``.pyc`` files: without
  ``PYTHONDONTWRITEBYTECODE`` (removed from their environment, so the first,
  untimed run writes any missing ``.pyc``), else each start would compile
  the package's modules from source.

Each round runs every case once, in an order rotated by one per round
(``bench/_timing.py``); the tables give min and median over the rounds,
and the targets are printed as target vs measured (medians).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import _timing as T  # noqa: E402

PROGRAM = Path(__file__).resolve().parent / "programs" / "mlp.mlir"
INPUT = "4x16xf32=1"
MATMUL = Path(__file__).resolve().parent / "programs" / "matmul512.mlir"
MATMUL_INPUTS = ["512x512xf32=1", "512x512xf32=1"]


def _iree_tool(name: str) -> str | None:
    here = Path(sys.executable).parent / name
    return str(here) if here.exists() else shutil.which(name)


def iree_benchmark(tool: str, vmfb: Path, seconds: float,
                   function: str = "predict", inputs=(INPUT,)):
    """A measurement: iree-benchmark-module's real_time per call."""
    pattern = re.compile(rf"^BM_{function}/\S*real_time\s+([\d.]+)\s+(ns|us|ms|s)\b",
                         re.M)
    scale = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0}

    def measure():
        out = subprocess.run([tool, f"--module={vmfb}", "--device=local-sync",
                              f"--function={function}",
                              *[f"--input={i}" for i in inputs],
                              f"--benchmark_min_time={seconds}s"],
                             capture_output=True, text=True)
        m = pattern.search(out.stdout)
        if not m:
            raise RuntimeError(f"iree-benchmark-module printed no time:\n{out.stdout}{out.stderr}")
        return float(m.group(1)) * scale[m.group(2)]
    return measure


def batch(fn, seconds: float):
    """A measurement: mean time per ``fn()`` over a fixed count of calls
    (chosen so one batch lasts about ``seconds``)."""
    fn()
    t0 = time.perf_counter()
    n = 0
    while time.perf_counter() - t0 < seconds / 4:
        fn()
        n += 1
    per = (time.perf_counter() - t0) / max(n, 1)
    count = max(3, int(seconds / max(per, 1e-9)))

    def measure():
        start = time.perf_counter()
        for _ in range(count):
            fn()
        return (time.perf_counter() - start) / count
    return measure


def cli_benchmark(vmfb: Path, seconds: float, function: str = "predict",
                  inputs=(INPUT,), extra=()):
    """A measurement: the median per call ``hal-cpu benchmark-module``
    prints."""
    pattern = re.compile(r"median ([\d.]+) (us|ms|s)\b")
    scale = {"us": 1e-6, "ms": 1e-3, "s": 1.0}

    def measure():
        out = subprocess.run([sys.executable, "-m", "hal_cpu", "benchmark-module",
                              f"--module={vmfb}", f"--function={function}",
                              *[f"--input={i}" for i in inputs], "--device=local-sync",
                              *extra, f"--benchmark_min_time={seconds}s"],
                             capture_output=True, text=True)
        m = pattern.search(out.stdout)
        if not m:
            raise RuntimeError(f"benchmark-module printed no time:\n{out.stdout}{out.stderr}")
        return float(m.group(1)) * scale[m.group(2)]
    return measure


def iree_runtime_call(vmfb: Path, x: np.ndarray, seconds: float):
    """A measurement: ``iree.runtime``'s call of ``predict`` from Python
    (``local-sync``), its result read as a numpy array; None without the
    package."""
    try:
        import iree.runtime as rt
    except ImportError:
        return None
    ctx = rt.SystemContext(config=rt.Config("local-sync"))
    ctx.add_vm_module(rt.VmModule.copy_buffer(ctx.instance, vmfb.read_bytes()))
    fn = ctx.modules.module["predict"]
    return batch(lambda: fn(x).to_host(), seconds)


def user_env() -> dict[str, str]:
    """This environment without ``PYTHONDONTWRITEBYTECODE``: a command's
    start-up as users see it, modules loaded from ``.pyc`` files."""
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    T.add_common_args(parser, rounds=5, quick_rounds=2)
    parser.add_argument("--seconds", type=float, default=None,
                        help="length of each batch (default 0.5, --quick 0.2)")
    parser.add_argument("--no-emulated", action="store_true")
    parser.add_argument("--no-matmul", action="store_true",
                        help="leave out the 512x512 matmul cases")
    args = parser.parse_args()
    rounds = T.rounds_of(args)
    seconds = args.seconds or (0.2 if args.quick else 0.5)

    from fatelf import arches
    from hal_cpu.programs import compile_program
    from hal_cpu.programs.vm import load_program

    host = arches.host_arch()
    host_vmfb = compile_program(PROGRAM, host).vmfb
    x = np.ones((4, 16), np.float32)
    cases = {}
    peer = _iree_tool("iree-benchmark-module")
    if peer:
        cases["iree-benchmark-module"] = iree_benchmark(peer, host_vmfb, seconds)
    native = load_program(host_vmfb, workers=1)
    predict = native.function("predict")
    cases["load_program, native"] = batch(lambda: predict(x), seconds)
    peer_call = iree_runtime_call(host_vmfb, x, seconds)
    if peer_call is not None:
        cases["iree.runtime call"] = peer_call
    emulated = None
    if not args.no_emulated:
        emu_vmfb = compile_program(PROGRAM, "aarch64").vmfb
        emulated = load_program(emu_vmfb, backend="emulated", workers=1)
        epredict = emulated.function("predict")
        want = predict(x)[0]
        got = epredict(x)[0]
        if not np.allclose(got, want, atol=1e-6):
            raise SystemExit("the emulated aarch64 result differs from the native one")
        cases["load_program, aarch64 emulated"] = batch(lambda: epredict(x), seconds)
    cases["hal-cpu benchmark-module"] = cli_benchmark(host_vmfb, seconds)
    cases["hal-cpu benchmark-module --replay"] = cli_benchmark(
        host_vmfb, seconds, extra=("--replay",))
    if not args.no_matmul:
        matmul_vmfb = compile_program(MATMUL, host).vmfb
        if peer:
            cases["matmul512: iree-benchmark-module"] = iree_benchmark(
                peer, matmul_vmfb, seconds, "matmul512", MATMUL_INPUTS)
        cases["matmul512: hal-cpu benchmark-module"] = cli_benchmark(
            matmul_vmfb, seconds, "matmul512", MATMUL_INPUTS, ("--workers=1",))
    run_module = [sys.executable, "-m", "hal_cpu", "run-module", str(host_vmfb),
                  "--function=predict", f"--input={INPUT}"]
    env = user_env()
    cases["hal-cpu run-module (process)"] = lambda: T.run_process(run_module, env=env)
    peer_run = _iree_tool("iree-run-module")
    if peer_run:
        cases["iree-run-module (process)"] = lambda: T.run_process(
            [peer_run, f"--module={host_vmfb}", "--device=local-sync",
             "--function=predict", f"--input={INPUT}"])
    T.run_process(run_module, env=env)   # the first run fills caches (.pyc too)
    stats = T.interleave(cases, rounds, warmup=1, progress=True)
    native.close()
    if emulated is not None:
        emulated.close()
    print(T.machine_line())
    print(f"program: {PROGRAM.name} (matmul, add, relu, softmax), {rounds} rounds, "
          f"batches of ~{seconds:g} s")
    peer_stats = stats.get("iree-benchmark-module")
    peers = {"iree-benchmark-module", "iree-run-module (process)", "iree.runtime call",
             "matmul512: iree-benchmark-module"}
    rows = []
    for name, s in stats.items():
        ref = (stats.get("iree-run-module (process)") if "process" in name
               else stats.get("matmul512: iree-benchmark-module") if "matmul512" in name
               else peer_stats)
        rows.append([name, *T.stats_cells(s, ref if name not in peers else None)])
    print(T.table(["case", "min", "median", "ratio to IREE's peer (median)"], rows))
    print()

    def med(name):
        s = stats.get(name)
        return s.median if s is not None and s.ok else None
    targets = []
    ours, theirs = med("load_program, native"), med("iree-benchmark-module")
    if ours and theirs:
        r = ours / theirs
        targets.append(["loaded MLP call, native", "<= 5x iree-benchmark-module",
                        f"{r:.2f}x ({T.fmt_time(ours)} vs {T.fmt_time(theirs)})",
                        "yes" if r <= 5 else "no"])
    e = med("load_program, aarch64 emulated")
    if e:
        targets.append(["loaded MLP call, aarch64 emulated", "<= 0.3 ms",
                        T.fmt_time(e), "yes" if e <= 0.3e-3 else "no"])
    py = med("iree.runtime call")
    if ours and py:
        r = ours / py
        targets.append(["loaded MLP call from Python, native", "<= 1.0x iree.runtime's call",
                        f"{r:.2f}x ({T.fmt_time(ours)} vs {T.fmt_time(py)})",
                        "yes" if r <= 1.0 else "no"])
    c = med("hal-cpu benchmark-module")
    if c and ours:
        targets.append(["benchmark-module per call", "~ the API's per call",
                        f"{c / ours:.2f}x the API", "-"])
    if c and theirs:
        r = c / theirs
        targets.append(["benchmark-module per call (MLP)", "<= 1.5x iree-benchmark-module",
                        f"{r:.2f}x ({T.fmt_time(c)} vs {T.fmt_time(theirs)})",
                        "yes" if r <= 1.5 else "no"])
    c = med("hal-cpu benchmark-module --replay")
    if c and theirs:
        r = c / theirs
        targets.append(["benchmark-module --replay per call (MLP)",
                        "<= 1.5x iree-benchmark-module",
                        f"{r:.2f}x ({T.fmt_time(c)} vs {T.fmt_time(theirs)})",
                        "yes" if r <= 1.5 else "no"])
    mo, mt = (med("matmul512: hal-cpu benchmark-module"),
              med("matmul512: iree-benchmark-module"))
    if mo and mt:
        r = mo / mt
        targets.append(["512x512 f32 matmul, benchmark-module local-sync, one thread",
                        "<= 1.05x iree-benchmark-module local-sync",
                        f"{r:.2f}x ({T.fmt_time(mo)} vs {T.fmt_time(mt)})",
                        "yes" if r <= 1.05 else "no"])
    p = med("hal-cpu run-module (process)")
    if p:
        targets.append(["run-module process, cached program", "<= 0.15 s",
                        T.fmt_time(p), "yes" if p <= 0.15 else "no"])
    print(T.table(["target", "goal", "measured (median)", "met"], targets))
    return 0


if __name__ == "__main__":
    sys.exit(main())
