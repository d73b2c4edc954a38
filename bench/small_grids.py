"""Small grids and plain numpy arrays: the Python API's default path on the
bundled samples (2-9 workgroups), against IREE's tools and IREE's Python
runtime calling the same program.

Usage: python bench/small_grids.py [--quick] [--rounds R] [--seconds S]
           [--no-busy] [--no-quiet]

For each bundled sample (``hal_cpu/samples``, host build) the cases are:

* ``Executable.dispatch`` with the default worker count and with
  ``workers=1``, bindings made by ``hal_cpu.zeros``/``full`` (64-byte
  aligned: used in place), and with the default worker count on plain
  numpy arrays (``np.ones``/``np.zeros``: 16 bytes past a 64-byte
  boundary, copied in and out);
* ``iree-benchmark-executable`` on the same file, ``--device=local-sync``
  and ``--device=local-task`` (its ``real_time`` per dispatch);
* ``iree.runtime`` (``local-sync``) calling the sample's public function
  from Python, the program compiled from the sample's MLIR for this host
  (a call includes IREE's copies of the arguments and the result).

One more pair measures the copy of a large plain binding: ``mul_add`` over
an 8 MiB first binding (the kernel reads its first 5003 floats), plain vs
aligned.

Every case runs twice: on a quiet machine, and while another process spins
on one core (``--no-busy``/``--no-quiet`` skip a pass). Ratios are to our
``workers=1`` for our own rows and to ``iree.runtime`` for the default row
(the target: default at most 1.1x of ``workers=1``, at most 0.6x of
``iree.runtime``).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
import warnings
from pathlib import Path

import _timing as T
import numpy as np
from dispatch import IreeBenchmark, batched, binding_spec, calls_for, find_tool, loadavg, versions

import fatelf.arches as A
import hal_cpu
from hal_cpu import Executable

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ROOT / "hal_cpu" / "samples"
BIG_BYTES = 8 << 20


def _arrays(kernel: dict, make) -> list[np.ndarray]:
    return [make(b["shape"], np.dtype(b["dtype"]), 1 if b["role"] == "input" else 0)
            for b in kernel["bindings"]]


def _aligned(shape, dtype, fill):
    return hal_cpu.full(shape, fill, dtype)


def _plain(shape, dtype, fill):
    return np.full(shape, fill, dtype)


def _iree_python(name: str, kernel: dict, host: str):
    """A no-argument call of the sample's function through iree.runtime,
    or None when IREE's compiler or runtime is missing."""
    try:
        import iree.runtime as rt

        from hal_cpu.programs import compile_program
        compiled = compile_program(SAMPLES / kernel["source"], host)
    except Exception as exc:  # noqa: BLE001 - the peer is optional
        print(f"(no iree.runtime peer for {name}: {exc})", file=sys.stderr)
        return None
    module = rt.load_vm_flatbuffer_file(str(compiled.vmfb), driver="local-sync")
    function = module[compiled.function]
    inputs = [np.ones(b["shape"], np.dtype(b["dtype"]))
              for b in kernel["bindings"] if b["role"] == "input"]
    inputs = sorted(zip([b.get("input_index", 0) for b in kernel["bindings"]
                         if b["role"] == "input"], range(len(inputs)), inputs))
    args = [a for _, _, a in inputs]
    return lambda: function(*args)


def build_cases(seconds: float) -> tuple[dict, list]:
    manifest = json.loads((SAMPLES / "manifest.json").read_text())
    host = A.host()
    if host is None or not host.runtime:
        raise SystemExit("this benchmark needs a host the native backend runs on")
    cases: dict[str, T.Measure] = {}
    rows: list[tuple[str, str, list[tuple[str, str, str]]]] = []
    opened = []
    have_iree = find_tool("iree-benchmark-executable") is not None
    for name in sorted(manifest["kernels"]):
        kernel = manifest["kernels"][name]
        entry = kernel["per_arch"].get(host.name)
        if entry is None:
            continue
        exe = Executable(SAMPLES / entry["file"], backend="native")
        opened.append(exe)
        wc, consts = tuple(entry["workgroup_count"]), list(entry["constants"])
        ordinal = exe.export(kernel["export"]).ordinal
        mine = []
        for label, workers, make in (("default workers", None, _aligned),
                                     ("workers=1", 1, _aligned),
                                     ("default workers, plain numpy", None, _plain)):
            arrays = _arrays(kernel, make)

            def call(arrays=arrays, workers=workers):
                exe.dispatch(ordinal, wc, arrays, consts, workers=workers)
            key = f"{name} {label}"
            cases[key] = batched(call, calls_for(call, seconds))
            mine.append((key, f"hal_cpu {label}", f"{name} workers=1"))
        mine[0] = (mine[0][0], mine[0][1], f"{name} workers=1")
        peer_rows = []
        if have_iree:
            specs = [binding_spec(b["shape"], b["dtype"],
                                  1 if b["role"] == "input" else 0)
                     for b in kernel["bindings"]]
            for device in ("local-sync", "local-task"):
                key = f"{name} iree {device}"
                cases[key] = IreeBenchmark(SAMPLES / entry["file"], host.iree_format,
                                           ordinal, wc, specs, consts,
                                           device=device, min_time=seconds)
                peer_rows.append((key, f"iree-benchmark-executable {device}",
                                  f"{name} workers=1"))
        py = _iree_python(name, kernel, host.name)
        if py is not None:
            key = f"{name} iree.runtime"
            cases[key] = batched(py, calls_for(py, seconds))
            peer_rows.append((key, "iree.runtime from Python (local-sync)",
                              f"{name} workers=1"))
            mine.insert(1, (mine[0][0], "hal_cpu default workers / iree.runtime",
                            key))
        rows.append((name, f"{kernel['description']}; workgroups {list(wc)}",
                     mine + peer_rows))
        if name == "mul_add":
            n = BIG_BYTES // 4
            for label, first in (("plain", np.ones(n + 1, np.float32)[1:]),
                                 ("aligned", hal_cpu.full(n, 1, np.float32))):
                arrays = [first, hal_cpu.full(5003, 1, np.float32),
                          hal_cpu.zeros(5003, np.float32)]

                def call(arrays=arrays):
                    exe.dispatch(ordinal, wc, arrays, consts)
                key = f"big {label}"
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    cases[key] = batched(call, calls_for(call, seconds))
            rows.append(("big", f"mul_add with an {BIG_BYTES >> 20} MiB first "
                         "binding, default workers",
                         [("big plain", "plain numpy array (copied)", "big aligned"),
                          ("big aligned", "hal_cpu.full (in place)", "big aligned")]))
    return cases, rows, opened


def _quietly(call):
    def run():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return call()
    return run


def report(title: str, stats: dict, rows: list) -> None:
    print(f"\n=== {title}")
    for name, description, lines in rows:
        print(f"\n{name}: {description}")
        table = []
        for key, label, peer in lines:
            table.append([label, *T.stats_cells(stats.get(key), stats.get(peer)),
                          peer.split(" ", 1)[1] if peer != key else ""])
        print(T.table(["runner", "min", "median", "ratio (median)", "to"], table))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    T.add_common_args(parser, rounds=7, quick_rounds=3)
    parser.add_argument("--seconds", type=float, default=None,
                        help="length of each sample (default 0.3, --quick: 0.1)")
    parser.add_argument("--no-busy", action="store_true",
                        help="skip the pass with another core busy")
    parser.add_argument("--no-quiet", action="store_true",
                        help="skip the pass on a quiet machine")
    args = parser.parse_args()
    rounds = T.rounds_of(args)
    seconds = args.seconds or (0.1 if args.quick else 0.3)
    cases, rows, opened = build_cases(seconds)
    cases = {k: _quietly(v) for k, v in cases.items()}
    print(T.machine_line())
    print(f"{versions()}; {rounds} rounds of about {seconds:g} s per case")
    print("per dispatch; ours: mean of a batch of Executable.dispatch calls; "
          "iree-benchmark-executable: real_time; iree.runtime: mean per call")
    try:
        if not args.no_quiet:
            before = loadavg()
            stats = T.interleave(cases, rounds, progress=True)
            report(f"quiet (load average before {before}, after {loadavg()})",
                   stats, rows)
        if not args.no_busy:
            spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
            try:
                time.sleep(0.5)
                stats = T.interleave(cases, rounds, progress=True)
                after = loadavg()
            finally:
                spinner.kill()
                spinner.wait()
            report(f"another core busy (a spinning process; load average "
                   f"after {after})", stats, rows)
    finally:
        for exe in opened:
            exe.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
