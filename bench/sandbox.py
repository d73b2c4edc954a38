"""What the qemu engine's sandbox costs: per dispatch and per agent start.

Usage: python bench/sandbox.py [--quick] [--rounds R] [--seconds S]
           [--arch A ...]

Every guest agent of the qemu engine starts confined
(``elfloader/backend/emulated/sandbox.py``: seccomp filter, Landlock, a
network namespace, resource limits). The peer here is the same engine with
agents started the way they were before the sandbox existed (a plain
``subprocess.Popen`` of qemu-user, same pipes, same memory file, only
the descriptors renumbered as the engine expects): this
script swaps ``sandbox.spawn`` for that while it opens the peer's
executables, and only here.

Cases, per architecture (default x86_64, aarch64, riscv64), on the bundled
``mul_add`` sample (one workgroup: the smallest dispatch, where a fixed
cost shows most):

* ``dispatch``: mean time per ``Executable.dispatch`` over a batch of
  calls lasting about S seconds (the call count is fixed before the
  rounds);
* ``start``: a new executable opened and dispatched once, then closed
  (agent start, filter, Landlock and namespace included).

Rounds interleave sandboxed and unsandboxed cases in a rotating order
(``bench/_timing.py``); the tables give min and median and the ratio
sandboxed / unsandboxed.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import _timing as T  # noqa: E402
from dispatch import batched, calls_for, loadavg, sample_arrays  # noqa: E402

from elfloader.backend.emulated import sandbox  # noqa: E402
from hal_cpu import Executable  # noqa: E402

SAMPLES = ROOT / "hal_cpu" / "samples"


def _plain_spawn(argv, fds, stderr):
    """An agent with no confinement at all: only its descriptors moved to
    the numbers the engine gave them (as the sandbox does)."""
    def renumber():
        for number, fd in fds.items():
            os.dup2(fd, number, inheritable=True)
    return subprocess.Popen(argv, stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=stderr,
                            start_new_session=True, preexec_fn=renumber,
                            close_fds=False)   # (it would close the copies)


@contextlib.contextmanager
def unsandboxed():
    saved = sandbox.spawn
    sandbox.spawn = _plain_spawn
    try:
        yield
    finally:
        sandbox.spawn = saved


def opener(path: Path, kernel: dict, arch: str, confined: bool):
    """A function opening ``path`` on the qemu engine and dispatching it
    once; returns the executable and the dispatch call."""
    entry = kernel["per_arch"][arch]
    arrays = sample_arrays(kernel)

    def open_one():
        with (contextlib.nullcontext() if confined else unsandboxed()):
            exe = Executable(path, backend="emulated", engine="qemu")
            ordinal = exe.export(kernel["export"]).ordinal

            def call():
                return exe.dispatch(ordinal, tuple(entry["workgroup_count"]),
                                    arrays, list(entry["constants"]), workers=1)

            call()
        return exe, call
    return open_one


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    T.add_common_args(parser, rounds=7, quick_rounds=3)
    parser.add_argument("--arch", action="append",
                        help="architecture (repeatable; default x86_64, "
                        "aarch64, riscv64)")
    parser.add_argument("--seconds", type=float, default=None,
                        help="length of each dispatch sample (default 0.3, "
                        "--quick: 0.1)")
    args = parser.parse_args()
    rounds = T.rounds_of(args)
    seconds = args.seconds or (0.1 if args.quick else 0.3)
    sandbox.require()
    manifest = json.loads((SAMPLES / "manifest.json").read_text())
    kernel = manifest["kernels"]["mul_add"]
    arches = args.arch or ["x86_64", "aarch64", "riscv64"]
    print(T.machine_line())
    print(f"sandbox layers here: {sandbox.status()}; load {loadavg()}")

    cases: dict[str, T.Measure] = {}
    opened = []
    for arch in arches:
        path = SAMPLES / kernel["per_arch"][arch]["file"]
        for confined in (True, False):
            tag = "sandboxed" if confined else "unsandboxed"
            open_one = opener(path, kernel, arch, confined)
            exe, call = open_one()
            opened.append(exe)
            cases[f"{arch} dispatch {tag}"] = batched(call, calls_for(call, seconds))

            def start(open_one=open_one) -> float:
                t0 = time.perf_counter()
                exe, _ = open_one()
                elapsed = time.perf_counter() - t0
                exe.close()
                return elapsed
            cases[f"{arch} start {tag}"] = start

    stats = T.interleave(cases, rounds, warmup=1, progress=True)
    for exe in opened:
        exe.close()
    rows = []
    for arch in arches:
        for what in ("dispatch", "start"):
            mine = stats[f"{arch} {what} sandboxed"]
            peer = stats[f"{arch} {what} unsandboxed"]
            rows.append([arch, what, *T.stats_cells(peer, None)[:2],
                         *T.stats_cells(mine, peer)])
    print(T.table(["arch", "case", "unsandboxed min", "median",
                   "sandboxed min", "median", "sandboxed / unsandboxed"],
                  rows))
    print(f"rounds {rounds}; load after {loadavg()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
