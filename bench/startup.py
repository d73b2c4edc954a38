"""Start-up of ``hal-cpu`` against IREE's tools: ``--help``, ``run`` of a
sample kernel, ``run-module`` of a cached ``.vmfb``, and ``load_program``
against ``iree.runtime``'s load of the same file.

Usage: python bench/startup.py [--quick] [--rounds R] [--kernel K] [--load-only]

Targets, printed as target vs measured at the end (medians of wall time
and of CPU time, user + system, of the whole process tree: the machine is
shared, and CPU time is the steadier of the two):

* ``hal-cpu --help`` <= 2x ``iree-run-module --help``;
* ``hal-cpu run-module mlp.vmfb --function=predict`` (``bench/programs/mlp.mlir``
  compiled here for this machine, native) <= 2x ``iree-run-module
  --device=local-sync`` on the same file;
* ``hal_cpu.programs.vm.load_program(mlp.vmfb)`` <= 2x ``iree.runtime``'s
  load of the same file, both in this process, after one untimed load
  each, doing the same work: from the file's path to a function ready to
  call. Ours: ``load_program(path)`` (the file mapped, its module verified
  and read, the HAL module and the executables linked, the bytecode
  translated or its cached translation read, ``__init`` run) and
  ``program.function("predict")``; closed after. IREE's: a new
  ``local-sync`` device (``get_driver("local-sync").create_default_device()``:
  our load makes its own), ``VmModule.mmap(instance, path)`` (the file
  mapped, its FlatBuffer verified), ``create_hal_module``, a ``VmContext``
  of the two (IREE runs ``__init`` and creates the executables there) and
  ``lookup_function("predict")``; released after. The ``VmInstance`` is
  made once, as our process-wide state (imports) is. Our repeated load
  reuses, by content, the verified module, the verified ELF images and the
  translation kept in memory, so this row mostly measures that reuse;
* the same, but the first load of the file in a fresh process, the same
  goal (<= 2x): every round starts one child process per side (in the
  round's rotated order) that imports everything first (ours:
  ``hal_cpu.programs.vm`` and every module a load of the file imports, as
  listed once by a probe child; IREE's: ``iree.runtime``, then its
  ``VmInstance`` and ``local-sync`` driver, as above), then times exactly
  one load, as above, of a copy of the file at a new path no process has
  loaded (page cache warm; our on-disk translation cache is warm too, as
  after any first run: it is keyed by the module's content). The child
  prints the wall time and the CPU time (``time.process_time``) of that
  load; the table gives both, min and median, and their ratios. On a
  shared machine the CPU ratio is the steadier: a load of a few
  milliseconds is preempted far more often than one of half a millisecond.

``--load-only`` runs only the two ``load_program`` rows.

``iree-run-module`` is the command pip's ``iree-base-runtime`` installs next
to this Python (a Python launcher that runs IREE's binary, as IREE's pip
users run it); IREE's binary alone is in the table too, for scale.

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

For scale, the table also has ``python -c pass`` (interpreter start-up),
``python -c "import numpy"`` (with ``OPENBLAS_NUM_THREADS=1``, as ``hal-cpu``
starts numpy: the VM's buffers are numpy arrays, so a run imports it) and
``python -c "import hal_cpu.cli"``; the run of the sample kernel is measured
as before: Every figure is the wall time of a whole
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
MLP = ROOT / "bench" / "programs" / "mlp.mlir"
MLP_INPUT = "4x16xf32=1"


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


def iree_tool(name: str) -> str | None:
    """IREE's command ``name`` as pip installs it next to this Python, else
    on ``PATH``."""
    here = Path(sys.executable).parent / name
    return str(here) if here.exists() else shutil.which(name)


def iree_binary(name: str) -> str | None:
    """IREE's own executable ``name`` inside ``iree-base-runtime``, or None."""
    try:
        import iree._runtime_libs as libs
    except ImportError:
        return None
    path = Path(libs.__file__).parent / name
    return str(path) if path.exists() else None


def compile_mlp(out: Path, host: str) -> Path | None:
    compiler = iree_tool("iree-compile")
    if compiler is None:
        return None
    vmfb = out / f"mlp_{host}.vmfb"
    subprocess.run([compiler, str(MLP), "--iree-hal-target-device=local",
                    "--iree-hal-local-target-device-backends=llvm-cpu",
                    *A.lookup(host).iree_flags, "-o", str(vmfb)],
                   check=True, capture_output=True)
    return vmfb


class ProcessCase:
    """A process measurement: wall time returned, CPU time (user + system
    of the process and its children) kept in :attr:`cpu`."""

    def __init__(self, argv: list[str], env: dict, cpu: T.Stats):
        self.argv, self.env, self.cpu = argv, env, cpu

    def __call__(self) -> float:
        before = T.children_cpu()
        elapsed = T.run_process(self.argv, env=self.env)
        self.cpu.samples.append(T.children_cpu() - before)
        return elapsed


def load_cases(vmfb: Path) -> dict[str, T.Measure]:
    """``load_program`` and ``iree.runtime``'s load of ``vmfb``, in this
    process (each loaded once, untimed, first)."""
    from hal_cpu.programs.vm import load_program

    cases: dict[str, T.Measure] = {}

    def ours():
        program = load_program(str(vmfb))
        program.function("predict")
        program.close()
    ours()
    cases["load_program(mlp.vmfb)"] = T.wall(ours)
    try:
        import iree.runtime as rt
    except ImportError:
        return cases
    instance = rt.VmInstance()
    driver = rt.get_driver("local-sync")

    def theirs():
        device = driver.create_default_device()
        module = rt.VmModule.mmap(instance, str(vmfb))
        hal = rt.create_hal_module(instance, device)
        context = rt.VmContext(instance, modules=[hal, module])
        if module.lookup_function("predict") is None:
            raise RuntimeError("IREE's runtime finds no @predict")
        del context
    theirs()
    cases["iree.runtime load (mlp.vmfb)"] = T.wall(theirs)
    return cases


# The child of a first-load measurement: argv[1] "ours" or "iree", argv[2]
# the file (a copy at a path no process has loaded), argv[3] the modules to
# import first (comma-separated; ours only). Prints the seconds of the load,
# wall and CPU (user + system of the process, time.process_time).
FIRST_LOAD_CHILD = """
import importlib, sys, time
side, path, modules = sys.argv[1], sys.argv[2], sys.argv[3]
if side == "ours":
    from hal_cpu.programs.vm import load_program
    for name in filter(None, modules.split(",")):
        try:
            importlib.import_module(name)
        except Exception:
            pass
    start, cpu = time.perf_counter(), time.process_time()
    program = load_program(path)
    program.function("predict")
    elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
    program.close()
else:
    import iree.runtime as rt
    instance = rt.VmInstance()
    driver = rt.get_driver("local-sync")
    start, cpu = time.perf_counter(), time.process_time()
    device = driver.create_default_device()
    module = rt.VmModule.mmap(instance, path)
    hal = rt.create_hal_module(instance, device)
    context = rt.VmContext(instance, modules=[hal, module])
    if module.lookup_function("predict") is None:
        raise SystemExit("IREE's runtime finds no @predict")
    elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
    del context
print(repr(elapsed), repr(cpu))
"""

# What a load imports beyond hal_cpu.programs.vm, listed by a probe child.
PROBE_CHILD = """
import sys
from hal_cpu.programs.vm import load_program
program = load_program(sys.argv[1])
program.function("predict")
program.close()
print(",".join(sorted(n for n in sys.modules if n != "__main__")))
"""


def load_path_modules(vmfb: Path, env: dict) -> str:
    """The modules a fresh process holds after one ``load_program`` of
    ``vmfb`` (comma-separated), for the first-load children to import."""
    return subprocess.run([sys.executable, "-c", PROBE_CHILD, str(vmfb)], env=env,
                          capture_output=True, text=True, check=True).stdout.strip()


class FirstLoad:
    """One fresh child process per call: it imports the load path, then
    times exactly one load of a new copy of ``vmfb`` (wall seconds
    returned, CPU seconds of the load kept in :attr:`cpu`)."""

    def __init__(self, side: str, vmfb: Path, tmp: Path, modules: str, env: dict,
                 cpu: T.Stats):
        self.side, self.vmfb, self.tmp, self.modules, self.env = side, vmfb, tmp, modules, env
        self.cpu = cpu
        self.count = 0

    def __call__(self) -> float:
        self.count += 1
        copy = self.tmp / f"first_{self.side}_{self.count}_{self.vmfb.name}"
        shutil.copyfile(self.vmfb, copy)
        try:
            out = subprocess.run([sys.executable, "-c", FIRST_LOAD_CHILD, self.side,
                                  str(copy), self.modules], env=self.env,
                                 capture_output=True, text=True)
        finally:
            copy.unlink(missing_ok=True)
        if out.returncode != 0:
            raise RuntimeError(f"first load ({self.side}): exit status "
                               f"{out.returncode}\n{out.stderr}")
        wall, cpu = map(float, out.stdout.split()[-2:])
        self.cpu.samples.append(cpu)
        return wall


def first_load_cases(vmfb: Path, tmp: Path, env: dict,
                     cpu: dict[str, T.Stats]) -> dict[str, T.Measure]:
    """First load of ``vmfb`` in a fresh process, ours and IREE's (their CPU
    time in ``cpu``)."""
    cases: dict[str, T.Measure] = {}
    modules = load_path_modules(vmfb, env)
    name = "first load_program(mlp.vmfb)"
    cpu[name] = T.Stats(name)
    cases[name] = FirstLoad("ours", vmfb, tmp, modules, env, cpu[name])
    try:
        import iree.runtime  # noqa: F401
    except ImportError:
        return cases
    name = "first iree.runtime load (mlp.vmfb)"
    cpu[name] = T.Stats(name)
    cases[name] = FirstLoad("iree", vmfb, tmp, "", env, cpu[name])
    return cases


def target_rows(stats: dict[str, T.Stats], cpu: dict[str, T.Stats]) -> list[list[str]]:
    """Target vs measured, by median (min in brackets)."""
    rows = []
    for what, ours, theirs in (
            ("hal-cpu --help", "hal-cpu --help", "iree-run-module --help"),
            ("hal-cpu run-module mlp.vmfb", "hal-cpu run-module mlp.vmfb",
             "iree-run-module mlp.vmfb"),
            ("load_program, again", "load_program(mlp.vmfb)",
             "iree.runtime load (mlp.vmfb)"),
            ("load_program, first in a process", "first load_program(mlp.vmfb)",
             "first iree.runtime load (mlp.vmfb)")):
        a, b = stats.get(ours), stats.get(theirs)
        if a is None or b is None or not a.ok or not b.ok:
            rows.append([what, f"<= 2x {theirs}", "-", "-", "-"])
            continue
        wall = f"{a.median / b.median:.2f}x (min {a.min / b.min:.2f}x)"
        ca, cb = cpu.get(ours), cpu.get(theirs)
        cpu_ratio = (f"{ca.median / cb.median:.2f}x (min {ca.min / cb.min:.2f}x)"
                     if ca and cb and ca.ok and cb.ok and cb.median > 0 and cb.min > 0
                     else "-")
        ok = a.median <= 2 * b.median
        rows.append([what, f"<= 2x {theirs}", wall, cpu_ratio,
                     "met" if ok else "not met"])
    return rows


def process_cases(process, hal: list[str], iree: str | None, binary: str | None,
                  mlp: Path | None, kernel: dict, host: str, argv: list[str],
                  tmp: Path) -> None:
    """Register the whole-process cases through ``process(name, argv)``."""
    process("hal-cpu --help", [*hal, "--help"])
    if iree:
        process("iree-run-module --help", [iree, "--help"])
    if binary:
        process("IREE's binary iree-run-module --help", [binary, "--help"])
    if mlp is not None:
        # cached: the first (untimed) round compiles nothing, translates
        # and caches; the rounds read the cache
        process("hal-cpu run-module mlp.vmfb",
                [*hal, "run-module", str(mlp), "--function=predict", f"--input={MLP_INPUT}"])
        if iree:
            process("iree-run-module mlp.vmfb",
                    [iree, "--device=local-sync", f"--module={mlp}",
                     "--function=predict", f"--input={MLP_INPUT}"])
    if iree and shutil.which("iree-compile"):
        vmfb = compile_vmfb(kernel, host, tmp)
        process("iree-run-module --device=local-sync",
                [iree, "--device=local-sync", f"--module={vmfb}",
                 f"--function={kernel['reference']}", *iree_inputs(kernel)])
    else:
        print("iree-run-module / iree-compile not found (pip install "
              "iree-base-runtime iree-base-compiler): no peer")
    process("hal-cpu run", [*hal, *argv])
    process("hal-cpu run --backend=emulated", [*hal, *argv, "--backend=emulated"])
    process("python -c pass", [sys.executable, "-c", "pass"])
    process("python -c 'import numpy'", [sys.executable, "-c", "import numpy"],
            {"OPENBLAS_NUM_THREADS": "1"})
    process("python -c 'import hal_cpu.cli'", [sys.executable, "-c", "import hal_cpu.cli"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    T.add_common_args(parser, rounds=15, quick_rounds=5)
    manifest = json.loads((SAMPLES / "manifest.json").read_text())
    parser.add_argument("--kernel", default="mul_add", choices=sorted(manifest["kernels"]))
    parser.add_argument("--load-only", action="store_true",
                        help="only the load_program rows (again, and first in a process)")
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
    cpu: dict[str, T.Stats] = {}

    def process(name: str, command: list[str], extra: dict | None = None) -> None:
        cpu[name] = T.Stats(name)
        cases[name] = ProcessCase(command, dict(env, **(extra or {})), cpu[name])

    peer = None
    tmp = Path(tempfile.mkdtemp(prefix="bench_startup_"))
    try:
        iree = iree_tool("iree-run-module")
        binary = iree_binary("iree-run-module")
        mlp = compile_mlp(tmp, host)
        if not args.load_only:
            process_cases(process, hal, iree, binary, mlp, kernel, host, argv, tmp)
            peer = "iree-run-module --device=local-sync"
            peer = peer if peer in cases else None
        if mlp is not None:
            cases.update(load_cases(mlp))
            cases.update(first_load_cases(mlp, tmp, env, cpu))
        stats = T.interleave(cases, rounds, warmup=1)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    for s in cpu.values():      # the warm-up round is not counted
        del s.samples[:len(s.samples) - len(stats[s.name].samples)]
    unicorn = imports = None
    if not args.load_only:
        unicorn = imports_unicorn(argv)
        imports = top_imports(argv)

    print(T.machine_line())
    print(f"kernel {args.kernel}: {kernel['description']}; {rounds} rounds")
    print("hal-cpu " + " ".join(argv).replace(str(ROOT) + os.sep, ""))
    rows = [[name, *T.stats_cells(s, stats.get(peer) if peer else None),
             T.fmt_time(cpu[name].median) if name in cpu and cpu[name].ok else "-"]
            for name, s in stats.items()]
    print(T.table(["process / call", "min", "median",
                   "ratio to iree-run-module (median)", "CPU (median)"], rows))
    print(T.table(["target", "", "measured: wall", "CPU", ""],
                  target_rows(stats, cpu)))
    if imports is None:
        return 0
    print(f"hal-cpu run (native) imported unicorn: {'yes' if unicorn else 'no'}")
    print("costliest imports of hal-cpu run (python -X importtime, cumulative, "
          "nested ones included in their parents): "
          + ", ".join(f"{n} {us / 1000:.1f} ms" for n, us in imports))
    return 0


if __name__ == "__main__":
    sys.exit(main())
