"""The same benchmarks on two revisions of the library, as ratios after/before.

Usage: python bench/before_after.py [--quick] [--rounds R] [--seconds S]
           [--batches B] [--before REV] [--after REV] [--only TEXT ...]
           [--list]

For a change that should leave the figures where they were (a
restructuring, a move of code between modules), one run measures both
trees under the same load and prints, per case, min and median of each
and the ratio after/before (above 1: the after tree is slower).

* "before" is a git revision (default ``183d637``), checked out once with
  ``git worktree add --detach /tmp/bench-before-<rev> <rev>`` and reused
  by later runs (the script never commits in it and never removes it:
  ``git worktree remove`` it when done);
* "after" is the working tree holding this script (uncommitted changes
  included) or, with ``--after REV``, a worktree
  ``/tmp/bench-after-<rev>`` made the same way.

Cases (what ``bench/dispatch.py``, ``bench/vm_programs.py`` and
``bench/startup.py`` measure, on the bundled samples of the before tree,
so both trees run the same bytes):

* ``<kernel> native``: ``Executable.dispatch`` of the samples (``matmul``
  13x17 @ 17x11, ``mul_add`` 5003 f32, ``sum_last`` 9x129) on the host
  build, ``workers=1``, manifest grid and constants, 64-byte aligned
  arrays (inputs 1, outputs 0): mean per call of a batch;
* ``<kernel> <engine> <arch>``: the same on the emulated backend, qemu
  engine on x86_64, aarch64 and riscv64, unicorn engine on aarch64 and
  riscv64;
* ``query call <where>``: one guest crossing and nothing else: the
  sample's ``iree_hal_executable_library_query(6, NULL)`` (it returns the
  library header without reading its environment) through
  ``elfloader.load(...).backend.function(address, 2)``, natively and on
  each emulated engine and architecture above;
* ``mlp <where>``: ``bench/programs/mlp.mlir`` compiled for the host and
  for aarch64, loaded with ``hal_cpu.programs.vm.load_program(..., workers=1)``,
  ``predict`` on a 4x16 f32 array of ones: natively and emulated aarch64
  on both engines (skipped without ``iree-compile``);
* ``startup --version``, ``startup run mul_add``: a whole
  ``python -P -m hal_cpu --version`` process and of ``hal-cpu run`` on the
  host's ``mul_add`` sample (the command ``bench/startup.py`` times),
  with ``.pyc`` files (``PYTHONDONTWRITEBYTECODE`` removed; Python 3.11+).

Every measurement runs in a child process of the tree's own packages: the
current interpreter with ``PYTHONPATH=<tree>`` and the tree first on
``sys.path``; each child checks that ``hal_cpu``, ``elfloader`` and
``fatelf`` come from its tree (the virtual environment's editable install
points at the working tree) and refuses to measure otherwise. A child
runs one group of cases sharing a backend configuration (native, or one
engine and architecture), one after another, each with its own loaded
executable, module or program. The timing code (``bench/_timing.py``,
``bench/dispatch.py``'s helpers) is this directory's for both trees.

Before the rounds, one child per group on the before tree picks each
case's call count (a batch of about S seconds) and one on the after tree
runs the same counts; both are discarded (warm-up, ``.pyc`` files
written). Each round then runs every group once per tree, before and after
alternating in order from round to round (ABBA), the groups in an order
rotated by one per round; every child warms each case up (a quarter of its
count), then times ``--batches`` batches and reports the fastest one's mean
per call (a batch stretched by other work on a shared machine drops out).

Two tables give min and median over the rounds and the ratios after/before
of both: wall time, and CPU time per call (the child's threads, which
include the unicorn engine, plus its qemu-user processes, read before and
after each batch; for a start-up case, the process and the children it
waited for). On a busy machine wall time includes waiting for a core;
CPU time does not, so it is the steadier of the two there, though other
work still slows it through shared caches.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import _timing as T

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
PROGRAM = BENCH / "programs" / "mlp.mlir"
KERNELS = ("matmul", "mul_add", "sum_last")
QUERY = "iree_hal_executable_library_query"
#: emulated configurations: (engine, architecture)
EMULATED = (("qemu", "x86_64"), ("qemu", "aarch64"), ("qemu", "riscv64"),
            ("unicorn", "aarch64"), ("unicorn", "riscv64"))
MLP_INPUT = (4, 16)
CHILD_TIMEOUT = 900
PACKAGES = ("hal_cpu", "elfloader", "fatelf")


# --- trees ----------------------------------------------------------------------
def git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(ROOT), *args], check=True,
                          capture_output=True, text=True).stdout.strip()


def worktree(rev: str, role: str) -> tuple[Path, str]:
    """A detached worktree of ``rev`` at ``/tmp/bench-<role>-<short sha>``,
    made unless already there (then its HEAD must be ``rev``)."""
    sha = git("rev-parse", "--verify", f"{rev}^{{commit}}")
    short = git("rev-parse", "--short", sha)
    path = Path(f"/tmp/bench-{role}-{short}")
    if path.exists():
        head = subprocess.run(["git", "-C", str(path), "rev-parse", "HEAD"],
                              capture_output=True, text=True).stdout.strip()
        if head != sha:
            raise SystemExit(f"{path} exists and is not a checkout of {short} "
                             f"(HEAD {head or 'unknown'}): remove it or pick "
                             f"another revision")
    else:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach",
                        str(path), sha], check=True, capture_output=True)
    return path, short


def describe_working_tree() -> str:
    changed = git("status", "--porcelain", "--untracked-files=no").splitlines()
    return (f"working tree {ROOT} at {git('rev-parse', '--short', 'HEAD')}"
            f" + {len(changed)} changed tracked files")


def tree_env(tree: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(tree)
    # as users run: modules from .pyc files (the warm-up writes them)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


# --- children -------------------------------------------------------------------
def run_child(tree: Path, spec: dict) -> dict:
    """Run this script's child mode on ``tree``; its JSON answer."""
    spec = dict(spec, tree=str(tree))
    proc = subprocess.run([sys.executable, str(Path(__file__).resolve()),
                           "--child", json.dumps(spec)],
                          capture_output=True, text=True, env=tree_env(tree),
                          timeout=CHILD_TIMEOUT)
    lines = proc.stdout.strip().splitlines()
    if proc.returncode or not lines:
        raise RuntimeError(f"child on {tree} ({spec.get('group')}): exit status "
                           f"{proc.returncode}\n{proc.stderr[-3000:]}")
    return json.loads(lines[-1])


def check_tree(tree: Path) -> None:
    """Import the packages in a fresh ``python -P`` with ``tree``'s
    environment (as the start-up cases run) and check where they come from."""
    code = ("import json, " + ", ".join(PACKAGES) + "; print(json.dumps(["
            + ", ".join(f"{p}.__file__" for p in PACKAGES) + "]))")
    proc = subprocess.run([sys.executable, "-P", "-c", code], capture_output=True,
                          text=True, env=tree_env(tree))
    if proc.returncode:
        raise SystemExit(f"the packages of {tree} do not import:\n{proc.stderr[-3000:]}")
    for path in json.loads(proc.stdout):
        if not Path(path).resolve().is_relative_to(tree.resolve()):
            raise SystemExit(f"a child with PYTHONPATH={tree} imported {path}")


def child_main(spec: dict) -> int:
    """Measure the cases of one group with the packages of ``spec["tree"]``;
    print one JSON line: seconds per call, call counts, errors."""
    tree = Path(spec["tree"]).resolve()
    sys.path.insert(0, str(tree))
    sys.path.insert(1, str(BENCH))
    import importlib
    for name in PACKAGES:
        where = Path(importlib.import_module(name).__file__ or "").resolve()
        if not where.is_relative_to(tree):
            print(f"{name} imported from {where}, not from {tree}", file=sys.stderr)
            return 2
    import dispatch as D

    group = spec["group"]
    counts = spec.get("counts") or {}
    seconds = spec["seconds"]
    times: dict[str, list[float]] = {}
    found: dict[str, int] = {}
    errors: dict[str, str] = {}
    for case in spec["cases"]:
        name = case["name"]
        try:
            call, close = open_case(case, group, spec, D)
            try:
                if name in counts:
                    count = counts[name]
                    D.batched(call, max(1, count // 4))()
                else:
                    count = D.calls_for(call, seconds)
                found[name] = count
                runs = [timed_batch(call, count) for _ in range(spec["batches"])]
                times[name] = [min(w for w, _ in runs), min(c for _, c in runs)]
            finally:
                close()
        except Exception as e:
            errors[name] = f"{type(e).__name__}: {e}"
    print(json.dumps({"times": times, "counts": found, "errors": errors}))
    return 0


def descendants(pid: int) -> list[int]:
    """Process ids of the live descendants of ``pid`` (Linux
    ``/proc/PID/task/TID/children``; none where that is missing)."""
    found: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                kids = [int(k) for k in f.read().split()]
        except OSError:
            continue
        for kid in kids:
            found += [kid, *descendants(kid)]
    return found


def cpu_seconds(children: list[int]) -> float:
    """CPU seconds so far of this process (every thread: the unicorn engine
    runs here) and of ``children`` (qemu-user processes of the qemu engine,
    idle between calls, so their scheduler counts are current)."""
    total = time.process_time()
    for pid in children:
        try:
            total += T.pid_cpu(pid)
        except OSError:                # it exited meanwhile
            pass
    return total


def timed_batch(call, count: int) -> tuple[float, float]:
    """(wall, CPU) seconds per call over ``count`` back-to-back calls; the
    CPU time is read outside the timed loop."""
    children = descendants(os.getpid())
    cpu = cpu_seconds(children)
    start = time.perf_counter()
    for _ in range(count):
        call()
    wall = time.perf_counter() - start
    cpu = cpu_seconds(children) - cpu
    return wall / count, cpu / count


def check_engine(backend, engine: str | None) -> None:
    """Refuse to measure an emulated backend running another engine than
    the one asked for (``EmulatedBackend.engine`` names it)."""
    if engine is not None and getattr(backend, "engine", engine) != engine:
        raise RuntimeError(f"asked for the {engine} engine, got {backend.engine}")


def open_case(case: dict, group: dict, spec: dict, D):
    """(call, close) for one case: ``call()`` runs one measured call."""
    import numpy as np

    import elfloader
    from fatelf.arches import host
    from hal_cpu import Executable
    samples = Path(spec["samples"])
    manifest = json.loads((samples / "manifest.json").read_text())
    native = group["engine"] is None
    info = host()
    if native and info is None:
        raise RuntimeError("no native backend on this machine")
    arch = info.name if native and info is not None else group["arch"]
    backend = "native" if native else "emulated"
    options = {} if native else {"engine": group["engine"]}
    kind = case["kind"]
    if kind == "dispatch":
        kernel = manifest["kernels"][case["kernel"]]
        entry = kernel["per_arch"][arch]
        exe = Executable(samples / entry["file"], backend=backend, **options)
        check_engine(exe.backend, group["engine"])
        # as bench/dispatch.py: the ordinal natively, the name emulated
        export = exe.export(kernel["export"]).ordinal if native else kernel["export"]
        call = D.dispatcher(exe, export, entry["workgroup_count"],
                            D.sample_arrays(kernel), entry["constants"], workers=1)
        return call, exe.close
    if kind == "query":
        entry = manifest["kernels"]["mul_add"]["per_arch"][arch]
        module = elfloader.load(samples / entry["file"], backend=backend, **options)
        check_engine(module.backend, group["engine"])
        function = module.backend.function(module.lookup(QUERY), 2)
        if not function(6, 0):
            raise RuntimeError(f"{QUERY}(6, NULL) returned NULL")

        def close_module() -> None:
            module.close()
            module.backend.close()
        return (lambda: function(6, 0)), close_module
    if kind == "mlp":
        from hal_cpu.programs.vm import load_program
        program = load_program(spec["vmfb"][arch], backend=backend, workers=1,
                               **options)
        predict = program.function("predict")
        x = np.ones(MLP_INPUT, np.float32)
        return (lambda: predict(x)), program.close
    raise ValueError(f"unknown case kind {kind!r}")


def setup_main(spec: dict) -> int:
    """With the before tree's packages: the host architecture, the
    ``hal-cpu run`` arguments of the host's ``mul_add`` sample and, if asked,
    the MLP compiled for the host and aarch64. One JSON line."""
    tree = Path(spec["tree"]).resolve()
    sys.path.insert(0, str(tree))
    sys.path.insert(1, str(BENCH))
    import startup as S

    from fatelf.arches import host
    info = host()
    name = info.name if info is not None and info.runtime else None
    out: dict = {"host": name, "run": None, "vmfb": {}, "errors": {}}
    samples = Path(spec["samples"])
    manifest = json.loads((samples / "manifest.json").read_text())
    kernel = manifest["kernels"]["mul_add"]
    if name is not None and name in kernel["per_arch"]:
        S.SAMPLES = samples          # the before tree's samples, not this tree's
        out["run"] = S.hal_cpu_argv(kernel, name)
    if spec["mlp"]:
        try:
            from hal_cpu.programs import compile_program
            for arch in {a for a in (name, "aarch64") if a}:
                out["vmfb"][arch] = str(compile_program(PROGRAM, arch).vmfb)
        except Exception as e:
            out["errors"]["mlp"] = f"{type(e).__name__}: {e}"
    print(json.dumps(out))
    return 0


# --- cases ----------------------------------------------------------------------
def groups_of() -> list[dict]:
    """Every group and its cases, names unfiltered."""
    out = []
    for engine, arch in [(None, "native"), *EMULATED]:
        where = arch if engine is None else f"{engine} {arch}"
        cases = [{"name": f"{k} {where}", "kind": "dispatch", "kernel": k}
                 for k in KERNELS]
        cases.append({"name": f"query call {where}", "kind": "query"})
        if arch in ("native", "aarch64"):
            cases.append({"name": f"mlp {where}", "kind": "mlp"})
        out.append({"group": {"engine": engine, "arch": arch, "label": where},
                    "cases": cases})
    return out


STARTUP = ("startup --version", "startup run mul_add")
#: what each child and start-up measurement reports, in this order
METRICS = ("wall", "cpu")


def names_of(units: list[dict | str]) -> list[str]:
    """Case names of groups and start-up cases, in order."""
    return [name for u in units
            for name in ([u] if isinstance(u, str) else [c["name"] for c in u["cases"]])]


def selected(name: str, only: list[str] | None) -> bool:
    return not only or any(text in name for text in only)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    T.add_common_args(parser, rounds=7, quick_rounds=3)
    parser.add_argument("--seconds", type=float, default=None,
                        help="length of each timed batch (default 0.25, "
                             "--quick: 0.05)")
    parser.add_argument("--batches", type=int, default=3,
                        help="timed batches per case in each child, the "
                             "fastest kept (default 3)")
    parser.add_argument("--before", default="183d637",
                        help="revision measured as before (default 183d637)")
    parser.add_argument("--after", default=None,
                        help="revision measured as after (default: the "
                             "working tree)")
    parser.add_argument("--only", action="append",
                        help="cases whose name contains TEXT (repeatable)")
    parser.add_argument("--list", action="store_true", help="list the cases")
    args = parser.parse_args()
    rounds = T.rounds_of(args)
    seconds = args.seconds or (0.05 if args.quick else 0.25)

    groups = []
    for g in groups_of():
        cases = [c for c in g["cases"] if selected(c["name"], args.only)]
        if cases:
            groups.append(dict(g, cases=cases))
    startup = [n for n in STARTUP if selected(n, args.only)]
    if args.list:
        for g in groups:
            for c in g["cases"]:
                print(c["name"])
        for n in startup:
            print(n)
        return 0
    if startup and sys.version_info < (3, 11):
        print("start-up cases skipped: they need python -P (3.11+)", file=sys.stderr)
        startup = []
    if not groups and not startup:
        raise SystemExit(f"no case matches --only {args.only}")

    before, before_rev = worktree(args.before, "before")
    if args.after is None:
        after, after_label = ROOT, describe_working_tree()
    else:
        after, after_rev = worktree(args.after, "after")
        after_label = f"{after_rev} ({after})"
    trees = {"before": before, "after": after}
    for tree in trees.values():
        check_tree(tree)
    load_before = os.getloadavg()[0]
    start = time.perf_counter()

    samples = before / "hal_cpu" / "samples"
    wants_mlp = any(c["kind"] == "mlp" for g in groups for c in g["cases"])
    setup = json.loads(subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), "--setup",
         json.dumps({"tree": str(before), "samples": str(samples), "mlp": wants_mlp})],
        capture_output=True, text=True, env=tree_env(before),
        check=True).stdout.strip().splitlines()[-1])
    problems: dict[str, str] = {}
    if setup["host"] is None:         # no native backend on this machine
        groups = [g for g in groups if g["group"]["engine"] is not None]
        startup = []
    for g in groups:
        missing = [c for c in g["cases"] if c["kind"] == "mlp"
                   and (setup["host"] if g["group"]["engine"] is None
                        else g["group"]["arch"]) not in setup["vmfb"]]
        for c in missing:
            problems[c["name"]] = setup["errors"].get("mlp", "no .vmfb")
        g["cases"] = [c for c in g["cases"] if c not in missing]
    groups = [g for g in groups if g["cases"]]

    common = {"samples": str(samples), "seconds": seconds, "vmfb": setup["vmfb"],
              "batches": max(1, args.batches)}
    counts: dict[str, dict[str, int]] = {}
    argv: dict[str, list[str]] = {"startup --version": ["--version"],
                                  "startup run mul_add": setup["run"] or []}

    def note(side: str, name: str, text: str) -> None:
        """Keep the first failure of a case on a side (its first line)."""
        first = text.strip().splitlines()[0] if text.strip() else "failed"
        problems.setdefault(f"{name} ({side})", first[:300])

    def measure(unit: dict | str, side: str) -> dict[str, list[float]]:
        """One child (a group) or process (a start-up case) on one tree:
        [wall, CPU] seconds by case name; failures noted, not raised."""
        tree = trees[side]
        if isinstance(unit, str):
            command = [sys.executable, "-P", "-m", "hal_cpu", *argv[unit]]
            try:
                cpu = T.children_cpu()
                wall = T.run_process(command, env=tree_env(tree))
                return {unit: [wall, T.children_cpu() - cpu]}
            except RuntimeError as e:
                note(side, unit, str(e).strip().splitlines()[-1])
                return {}
        label = unit["group"]["label"]
        spec = dict(common, group=unit["group"], cases=unit["cases"],
                    counts=counts.get(label))
        try:
            answer = run_child(tree, spec)
        except (RuntimeError, subprocess.TimeoutExpired) as e:
            for c in unit["cases"]:
                note(side, c["name"], str(e).strip().splitlines()[-1])
            return {}
        for name, text in answer["errors"].items():
            note(side, name, text)
        if label not in counts and answer["counts"]:
            counts[label] = answer["counts"]
        return answer["times"]

    # calibration (before) and warm-up (after), both discarded
    units: list[dict | str] = [*groups, *startup]
    for unit in units:
        for side in trees:
            measure(unit, side)
    print(".", end="", file=sys.stderr, flush=True)

    stats = {(name, side, metric): T.Stats(name) for name in names_of(units)
             for side in trees for metric in METRICS}
    for r in range(rounds):
        k = r % len(units)
        for unit in units[k:] + units[:k]:
            for side in ("before", "after") if r % 2 == 0 else ("after", "before"):
                for name, values in measure(unit, side).items():
                    for metric, value in zip(METRICS, values):
                        stats[name, side, metric].samples.append(value)
        print(".", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)

    print(T.machine_line())
    print(f"before: {before_rev} ({before}); after: {after_label}")
    print(f"{rounds} rounds (ABBA), {common['batches']} batches of ~{seconds:g} s "
          f"per case and child; load average "
          f"{load_before:.2f} before, {os.getloadavg()[0]:.2f} after; "
          f"{time.perf_counter() - start:.0f} s")
    print("per call: the fastest of a child's batches, one child per group, "
          "tree and round; startup: one whole process; ratio above 1: after "
          "is slower")
    for metric, title in (("wall", "wall time"),
                          ("cpu", "CPU time (the process and its qemu-user "
                                  "children; startup: the process and its "
                                  "children)")):
        print(f"\n{title}")
        rows = []
        for name in names_of(units):
            b, a = stats[name, "before", metric], stats[name, "after", metric]
            cells = [name]
            for s in (b, a):
                cells += [T.fmt_time(s.min), T.fmt_time(s.median)] if s.ok else ["-", "-"]
            if a.ok and b.ok:
                cells += [T.ratio(a.median, b.median), T.ratio(a.min, b.min)]
            else:
                cells += ["-", "-"]
            rows.append(cells)
        print(T.table(["case", "before min", "before median", "after min",
                       "after median", "after/before median", "min"], rows))
    if problems:
        print()
    for name, text in problems.items():
        print(f"{name}: {text}")
    return 1 if problems else 0


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] in ("--child", "--setup"):
        mode = child_main if sys.argv[1] == "--child" else setup_main
        sys.exit(mode(json.loads(sys.argv[2])))
    sys.exit(main())
