"""Process start-up of ``hal-cpu run`` against ``iree-run-module``.

Usage: python bench/startup.py [--quick] [--rounds R] [--kernel K]

Both commands run the sample kernel (default ``mul_add``: a * b + a over
5003 float32 values) once on inputs of ones and twos and print the result:

* ``hal-cpu run hal_cpu/samples/<kernel>_<host>.so --entry_point=0
  --workgroup_count=X,Y,Z --binding=...`` (workgroup count, bindings and
  constants from ``hal_cpu/samples/manifest.json``; inputs ``=1``, ``=2``...,
  outputs ``=0``), with the default backend (native on the host) and with
  ``--backend=emulated``;
* the peer, ``iree-run-module --device=local-sync`` (IREE's runtime, one
  thread like ours) on a ``.vmfb`` compiled here from
  ``hal_cpu/samples/samples_<kernel>.mlir`` with ``iree-compile
  --iree-hal-target-device=local
  --iree-hal-local-target-device-backends=llvm-cpu`` and the host's target
  flags from ``fatelf.arches``, with the same inputs (``--input=...``).

For scale, the table also has ``python -c pass`` (interpreter start-up) and
``python -c "import hal_cpu.cli"``. Every figure is the wall time of a whole
process (spawn to exit, output discarded); each round runs every command
once, in an order rotated by one per round; min and median, and the ratio to
iree-run-module. The processes run without ``PYTHONDONTWRITEBYTECODE``, as
users run them: modules load from ``.pyc`` files (the discarded warm-up
round writes any that are missing).

Below the table: whether ``hal-cpu run`` (native backend) imported
``unicorn``, checked in a child process through ``sys.modules``, and the
costliest imports of that command (``python -X importtime``).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import _timing as T
import numpy as np

import fatelf.arches as A
from hal_cpu.buffers import dtype_name

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ROOT / "hal_cpu" / "samples"


def hal_cpu_argv(kernel: dict, host: str) -> list[str]:
    """``run`` arguments for the host build of ``kernel``."""
    entry = kernel["per_arch"][host]
    argv = ["run", str(SAMPLES / entry["file"]), "--entry_point=0",
            "--workgroup_count=" + ",".join(map(str, entry["workgroup_count"]))]
    for b in kernel["bindings"]:
        argv.append(f"--binding={shape_type(b)}={fill_value(b)}")
    argv += [f"--constant={c}" for c in entry["constants"]]
    return argv


def shape_type(binding: dict) -> str:
    """``5003xf32``: shape and IREE element type of a manifest binding."""
    return ("x".join(map(str, binding["shape"])) + "x"
            + dtype_name(np.dtype(binding["dtype"])))


def fill_value(binding: dict) -> int:
    return binding["input_index"] + 1 if binding["role"] == "input" else 0


def iree_inputs(kernel: dict) -> list[str]:
    ins = sorted((b for b in kernel["bindings"] if b["role"] == "input"),
                 key=lambda b: b["input_index"])
    return [f"--input={shape_type(b)}={fill_value(b)}" for b in ins]


def compile_vmfb(kernel: dict, host: str, out: Path) -> Path:
    vmfb = out / f"{kernel['reference']}_{host}.vmfb"
    subprocess.run([shutil.which("iree-compile"), str(SAMPLES / kernel["source"]),
                    "--iree-hal-target-device=local",
                    "--iree-hal-local-target-device-backends=llvm-cpu",
                    *A.lookup(host).iree_flags, "-o", str(vmfb)],
                   check=True, capture_output=True)
    return vmfb


def hal_cpu_command() -> list[str]:
    script = Path(sys.executable).parent / "hal-cpu"
    return [str(script)] if script.exists() else [sys.executable, "-m", "hal_cpu.cli"]


def imports_unicorn(argv: list[str]) -> bool:
    code = ("import contextlib, io, sys, hal_cpu.cli\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n"
            f"    rc = hal_cpu.cli.main({argv!r})\n"
            "print(rc, 'unicorn' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True,
                         text=True, check=True).stdout.split()
    if out[0] != "0":
        raise RuntimeError(f"hal-cpu {' '.join(argv)} exited with {out[0]}")
    return out[1] == "True"


def top_imports(argv: list[str], count: int = 8) -> list[tuple[str, int]]:
    """The most expensive packages and modules without a dot in their name
    (cumulative microseconds, at any import depth) of the command."""
    err = subprocess.run([sys.executable, "-X", "importtime", "-m", "hal_cpu.cli",
                          *argv], capture_output=True, text=True).stderr
    found = {}
    for line in err.splitlines():
        m = re.match(r"import time:\s+\d+ \|\s+(\d+) \|\s+(\S+)$", line)
        if m and "." not in m.group(2):
            found[m.group(2)] = int(m.group(1))
    return sorted(found.items(), key=lambda x: -x[1])[:count]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    T.add_common_args(parser, rounds=15, quick_rounds=5)
    manifest = json.loads((SAMPLES / "manifest.json").read_text())
    parser.add_argument("--kernel", default="mul_add", choices=sorted(manifest["kernels"]))
    args = parser.parse_args()
    rounds = T.rounds_of(args)
    kernel = manifest["kernels"][args.kernel]
    info = A.host()
    if info is None or info.name not in kernel["per_arch"]:
        print(f"no {args.kernel} sample for this host; nothing to run")
        return 0
    host = info.name
    argv = hal_cpu_argv(kernel, host)
    hal = hal_cpu_command()
    env = dict(os.environ)
    # as users run: modules from .pyc files (the warm-up round writes them)
    env.pop("PYTHONDONTWRITEBYTECODE", None)

    cases: dict[str, T.Measure] = {}
    peer = None
    tmp = Path(tempfile.mkdtemp(prefix="bench_startup_"))
    try:
        iree = shutil.which("iree-run-module")
        if iree and shutil.which("iree-compile"):
            vmfb = compile_vmfb(kernel, host, tmp)
            peer = "iree-run-module --device=local-sync"
            iree_argv = [iree, "--device=local-sync", f"--module={vmfb}",
                         f"--function={kernel['reference']}", *iree_inputs(kernel)]
            cases[peer] = lambda: T.run_process(iree_argv, env=env)
        else:
            print("iree-run-module / iree-compile not found (pip install "
                  "iree-base-runtime iree-base-compiler): no peer")
        cases["hal-cpu run"] = lambda: T.run_process([*hal, *argv], env=env)
        cases["hal-cpu run --backend=emulated"] = lambda: T.run_process(
            [*hal, *argv, "--backend=emulated"], env=env)
        cases["python -c pass"] = lambda: T.run_process(
            [sys.executable, "-c", "pass"], env=env)
        cases["python -c 'import hal_cpu.cli'"] = lambda: T.run_process(
            [sys.executable, "-c", "import hal_cpu.cli"], env=env)
        stats = T.interleave(cases, rounds, warmup=1)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    unicorn = imports_unicorn(argv)
    imports = top_imports(argv)

    print(T.machine_line())
    print(f"kernel {args.kernel}: {kernel['description']}; {rounds} rounds")
    print("hal-cpu " + " ".join(argv).replace(str(ROOT) + os.sep, ""))
    rows = [[name, *T.stats_cells(s, stats.get(peer) if peer else None)]
            for name, s in stats.items()]
    print(T.table(["process", "min", "median", "ratio to iree-run-module (median)"],
                  rows))
    print(f"hal-cpu run (native) imported unicorn: {'yes' if unicorn else 'no'}")
    print("costliest imports of hal-cpu run (python -X importtime, cumulative, "
          "nested ones included in their parents): "
          + ", ".join(f"{n} {us / 1000:.1f} ms" for n, us in imports))
    return 0


if __name__ == "__main__":
    sys.exit(main())
