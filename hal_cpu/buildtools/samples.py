#!/usr/bin/env python3
"""Build the sample HAL executables bundled with hal_cpu for ``hal-cpu demo``.

Run from the repository root with the package installed with its IREE extra
(``pip install -e '.[iree]'``: the supported ``iree-compile`` and IREE's
runtime)::

    python -m hal_cpu.buildtools.samples

For every ``samples_<kernel>.mlir`` listed in KERNELS and every architecture
the runtime runs (``fatelf.arches.RUNTIME_ARCHES``) it compiles the program
with iree-compile (llvm-cpu backend, embedded ELF, no debug info), checks
that the host program performs exactly one dispatch and nothing else, and
writes

* ``hal_cpu/samples/<kernel>_<arch>.so``: the embedded-ELF HAL executable;
* ``hal_cpu/samples/manifest.json``: how to call each one (see below).

Dispatch parameters (export name, workgroup count, push constants, bindings)
come from a record-only call on the VM (:func:`hal_cpu.programs.vm.plan_program`).  Before
writing anything the script also runs each program with IREE's own runtime
on the host and checks it against the numpy function named by the kernel's
``reference`` key (``hal_cpu.samples.REFERENCES``, the functions ``hal-cpu demo``
checks with), so the keys in the manifest are known to be right.

manifest.json::

    {
      "format": 1,
      "generator": "hal_cpu/buildtools/samples.py",
      "iree_compile_version": "...",
      "arches": ["x86_64", ...],          # arches every kernel was built for
      "kernels": {
        "<kernel>": {
          "source": "samples_<kernel>.mlir",
          "description": "...",
          "reference": "<key>",            # mul_add | matmul | sum_last
          "export": "<export name>",       # same on every arch
          "bindings": [                    # in binding order
            {"role": "input", "input_index": 0, "shape": [..], "dtype": "float32",
             "offset": 0, "length": <bytes>},
            {"role": "output", "output_index": 0, "shape": [..], "dtype": "float32",
             "offset": 0, "length": <bytes>}
          ],
          "per_arch": {
            "<arch>": {"file": "<kernel>_<arch>.so", "workgroup_count": [x, y, z],
                       "constants": [uint32, ...], "size": <bytes>, "sha256": "..."}
          }
        }
      }
    }

Reference keys (inputs in ``input_index`` order)::

    mul_add:  out = a * b + a
    matmul:   out = a @ b
    sum_last: out = x.sum(axis=-1), accumulated in float32

Workgroup counts depend on the target's tile sizes, so they are per arch.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import shutil
import sys
from pathlib import Path
from typing import Any

import numpy as np

from fatelf import arches
from hal_cpu.programs import (
    Compiled,
    IreeToolError,
    compile_program,
    iree_compile_version,
    reference_run,
)
from hal_cpu.programs.vm import plan_program
from hal_cpu.samples import REFERENCES

# the samples' folder: their MLIR sources, the built kernels and manifest.json
HERE = Path(__file__).resolve().parent.parent / "samples"

KERNELS = {
    "mul_add": {"source": "samples_mul_add.mlir", "reference": "mul_add",
                "description": "elementwise a * b + a over 5003 float32 values"},
    "matmul": {"source": "samples_matmul.mlir", "reference": "matmul",
               "description": "float32 matrix product 13x17 @ 17x11"},
    "sum_last": {"source": "samples_sum_last.mlir", "reference": "sum_last",
                 "description": "float32 sum over the last axis of a 9x129 matrix"},
}

#: extra iree-compile flags: no DWARF keeps the files small and free of
#: build-machine paths
EXTRA_FLAGS = ["--iree-llvmcpu-debug-symbols=false"]

_NP_DTYPES = {"f32": "float32", "f64": "float64", "f16": "float16", "i8": "int8",
              "i16": "int16", "i32": "int32", "i64": "int64"}


def input_types(mlir: Path, function: str) -> list[tuple[tuple[int, ...], str]]:
    """(shape, numpy dtype name) of each tensor argument of @function."""
    m = re.search(r"func\.func @" + re.escape(function) + r"\((.*?)\)\s*->", mlir.read_text(), re.S)
    if not m:
        raise SystemExit(f"{mlir.name}: no func.func @{function}")
    out = []
    for t in re.findall(r"%\w+\s*:\s*tensor<([^>]*)>", m.group(1)):
        *dims, et = t.split("x")
        if et not in _NP_DTYPES or not all(d.isdigit() for d in dims):
            raise SystemExit(f"{mlir.name}: unsupported argument type tensor<{t}>")
        out.append((tuple(int(d) for d in dims), _NP_DTYPES[et]))
    return out


def dump_json(obj) -> str:
    """JSON with two-space indents but short lists of numbers on one line."""
    text = json.dumps(obj, indent=2)
    return re.sub(r"\[\s+([-\d.,\s]*?)\s+\]",
                  lambda m: "[" + ", ".join(x.strip() for x in m.group(1).split(",")) + "]",
                  text) + "\n"


def describe(kernel: str, c, shapes) -> tuple[dict, dict]:
    """(arch-independent description, per-arch entry) of one compiled kernel."""
    inputs = [np.zeros(s, dtype=d) for s, d in shapes]
    plan = plan_program(c, inputs)
    if len(plan.steps) != 1 or not plan.dispatches:
        raise SystemExit(f"{kernel}/{c.arch}: expected exactly one dispatch, got {plan.steps}")
    (d,) = plan.dispatches
    bindings = []
    for b in d.bindings:
        if b.kind == "input":
            arr = inputs[int(b.ref)]
            if (b.offset, b.length) != (0, arr.nbytes):
                raise SystemExit(f"{kernel}/{c.arch}: input binding {b} is not the whole input")
            bindings.append({"role": "input", "input_index": b.ref, "shape": list(arr.shape),
                             "dtype": str(arr.dtype), "offset": 0, "length": arr.nbytes})
            continue
        hits = [k for k, r in enumerate(plan.results) if r.storage == b]
        if len(hits) != 1:
            raise SystemExit(f"{kernel}/{c.arch}: binding {b} is not exactly one result "
                             f"({plan.results})")
        r = plan.results[hits[0]]
        bindings.append({"role": "output", "output_index": hits[0], "shape": list(r.shape),
                         "dtype": str(r.dtype), "offset": 0, "length": b.length})
    common = {"export": d.export_name, "bindings": bindings}
    data = d.so_path.read_bytes()
    per_arch = {"file": f"{kernel}_{c.arch}.so", "workgroup_count": list(d.workgroup_count),
                "constants": list(d.constants), "size": len(data),
                "sha256": hashlib.sha256(data).hexdigest()}
    return common, per_arch


def verify_reference(kernel: str, info: dict, c, shapes) -> None:
    """Run the host build with IREE's runtime and compare with the numpy key."""
    rng = np.random.default_rng(0)
    inputs = [rng.standard_normal(s).astype(d) for s, d in shapes]
    (got,) = reference_run(c.vmfb, c.function, inputs)
    want = REFERENCES[info["reference"]](*inputs)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4,
                               err_msg=f"{kernel}: reference key {info['reference']!r}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m hal_cpu.buildtools.samples",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=HERE,
                    help="output directory (default: %(default)s)")
    ap.add_argument("--arch", action="append",
                    help="build only these arches (name or alias; repeatable; "
                         f"default: {', '.join(arches.RUNTIME_ARCHES)})")
    ap.add_argument("--build-dir", type=Path,
                    help="keep iree-compile outputs here (cached; default: the user "
                         "cache directory, hal_cpu.programs.default_cache_dir())")
    ap.add_argument("--no-verify", action="store_true",
                    help="skip running the host build with IREE's runtime")
    args = ap.parse_args(argv)
    try:
        targets = tuple(dict.fromkeys(arches.lookup(a, runtime=True).name
                                      for a in args.arch or arches.RUNTIME_ARCHES))
    except arches.FatElfSelectError as e:
        ap.error(str(e))
    try:
        version = iree_compile_version()
    except IreeToolError as e:
        print(f"hal_cpu.buildtools.samples: {e}", file=sys.stderr)
        return 2

    build = args.build_dir
    jobs = [(HERE / info["source"], arch) for info in KERNELS.values() for arch in targets]
    failures: dict[tuple[str, str], str] = {}
    compiled: dict[tuple[str, str], Compiled] = {}

    from concurrent.futures import ThreadPoolExecutor

    def build_one(job):
        src, arch = job
        try:
            return job, compile_program(src, arch, build, extra_flags=EXTRA_FLAGS), None
        except Exception as e:  # noqa: BLE001 - reported below
            return job, None, str(e)

    with ThreadPoolExecutor() as pool:
        for (src, arch), c, err in pool.map(build_one, jobs):
            kernel = next(k for k, v in KERNELS.items() if v["source"] == src.name)
            if err:
                failures[(kernel, arch)] = err
            else:
                compiled[(kernel, arch)] = c

    manifest: dict[str, Any] = {"format": 1, "generator": "hal_cpu/buildtools/samples.py",
                "iree_compile_version": version,
                "arches": [a for a in targets
                           if all((k, a) not in failures for k in KERNELS)],
                "kernels": {}}
    host_info = arches.host()
    host = host_info.name if host_info else None
    args.out.mkdir(parents=True, exist_ok=True)
    for kernel, info in KERNELS.items():
        src = HERE / info["source"]
        entry: dict = {"source": info["source"], "description": info["description"],
                 "reference": info["reference"], "export": None, "bindings": None,
                 "per_arch": {}}
        for arch in targets:
            c = compiled.get((kernel, arch))
            if c is None:
                continue
            shapes = input_types(src, c.function)
            common, per_arch = describe(kernel, c, shapes)
            for key in ("export", "bindings"):
                if entry[key] is None:
                    entry[key] = common[key]
                elif entry[key] != common[key]:
                    raise SystemExit(f"{kernel}: {key} differs on {arch}: "
                                     f"{common[key]} vs {entry[key]}")
            shutil.copyfile(c.so_files[0], args.out / per_arch["file"])
            entry["per_arch"][arch] = per_arch
            if arch == host and not args.no_verify:
                verify_reference(kernel, info, c, shapes)
        manifest["kernels"][kernel] = entry

    # drop stale binaries of kernels/arches that are no longer built
    wanted = {p["file"] for e in manifest["kernels"].values() for p in e["per_arch"].values()}
    if args.out.resolve() == HERE and not args.arch:
        for old in HERE.glob("*.so"):
            if old.name not in wanted:
                old.unlink()

    (args.out / "manifest.json").write_text(dump_json(manifest))
    for (kernel, arch), err in sorted(failures.items()):
        print(f"FAILED {kernel} for {arch}:\n{err}", file=sys.stderr)
    built = sum(len(e["per_arch"]) for e in manifest["kernels"].values())
    print(f"wrote {built} executables and manifest.json to {args.out}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
