"""Command line: ``python -m fuzz`` runs a fuzz campaign, ``python -m fuzz
--replay FILE`` runs one saved case again."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent
DEFAULT_OUT = HERE / "out"
GIB = 1 << 30


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m fuzz",
        description="Fuzz the loaders with field-aware mutations of the repository's "
                    "own ELF, plugin and FatELF files; every case runs in a child "
                    "process and is classified as accepted, typed (a "
                    "PortableKernelError), escape (another exception), crash "
                    "(signal), hang (wall-clock limit) or blowup (memory/CPU); "
                    "crashes and hangs of the file's own code running natively "
                    "are counted apart, as crash(guest) and hang(guest). Exit "
                    "status 1 when any other crash or hang, escape or blowup "
                    "happened.")
    p.add_argument("--cases", type=int, default=200,
                   help="cases per backend, spread round-robin over the targets "
                        "(default 200)")
    p.add_argument("--seed", type=int, default=1, help="run seed (default 1)")
    p.add_argument("--backend", choices=("native", "emulated", "both"), default="both",
                   help="backends to fuzz (default both)")
    p.add_argument("--target", choices=("elf", "fatelf", "plugin", "threads", "files",
                                        "code", "vmfb", "program", "mlir", "vmfb-run", "names",
                                        "all"),
                   default="all",
                   help="inputs: IREE executables, FatELF bundles, plugins, "
                        "executables dispatched from threads while closed "
                        "(threads), executables given as FIFOs, directories, "
                        "devices or huge sparse files (files), or all (default all); "
                        "code: executables whose dispatched export has hostile "
                        "machine code (planted system calls aimed at canaries, "
                        "random instructions), emulated only, never part of all; "
                        "vmfb: compiled modules (.vmfb) read by the VM module reader, "
                        "on one backend (no code runs), never part of all; "
                        "program: compiled modules with mutated bytecode loaded and "
                        "called, with host modules that raise, return the wrong "
                        "thing or never return, never part of all; mlir: mutated "
                        "MLIR program text compiled and run by the interpreter, "
                        "never part of all; vmfb-run: compiled programs with "
                        "mutated bytecode, descriptors, names, read-only data and "
                        "dispatch/allocation constants, run with canaries around "
                        "their inputs (x86_64 natively, aarch64 and riscv64 "
                        "emulated), never part of all; names: function, import and "
                        "export names replaced, run and printed by hal-cpu's "
                        "commands, never part of all")
    p.add_argument("--kill-host", type=float, default=0.0, metavar="FRACTION",
                   help="code target: the fraction of cases whose child process kills "
                        "itself (SIGKILL) 0.05-1 s into the run, as a crashing program "
                        "would; nothing the guest code started may outlive it (counted "
                        "as killed; default 0)")
    p.add_argument("--engine", choices=("auto", "qemu", "unicorn"), default="auto",
                   help="emulation engine of the emulated backend (sets PKR_ENGINE "
                        "for the children; default auto: PKR_ENGINE if set, else "
                        "qemu-user where its sandbox can be made, else unicorn)")
    p.add_argument("--jobs", type=int, default=2, help="children at once (default 2)")
    p.add_argument("--report", type=Path, help="write the JSON report here")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT,
                   help="directory for saved problem cases (default fuzz/out)")
    p.add_argument("--timeout", type=float, default=20.0,
                   help="wall-clock seconds per case before it counts as a hang "
                        "(default 20)")
    p.add_argument("--cpu-limit", type=float, default=10.0,
                   help="CPU seconds above which a finished case is a blowup (default 10)")
    p.add_argument("--rss-limit-mb", type=int, default=1024,
                   help="peak RSS above which a finished case is a blowup (default 1024)")
    p.add_argument("--native-as-gb", type=float, default=4.0,
                   help="RLIMIT_AS of native children, GiB (default 4)")
    p.add_argument("--emulated-as-gb", type=float, default=8.0,
                   help="RLIMIT_AS of emulated children, GiB; a unicorn engine "
                        "reserves about 1 GiB (default 8; 0: none)")
    p.add_argument("--emulated-call-timeout", type=float, default=2.0,
                   help="timeout= given to emulated backends: seconds per guest call "
                        "(default 2)")
    p.add_argument("--dispatch-timeout", type=float, default=5.0,
                   help="timeout= given to Executable.dispatch (default 5)")
    p.add_argument("--no-confine", action="store_true",
                   help="vmfb-run and names targets: run native cases without "
                        "confining their child process (confine_native)")
    p.add_argument("--no-minimize", action="store_true",
                   help="do not reduce problem cases to fewer byte operations")
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    p.add_argument("--replay", type=Path, metavar="FILE",
                   help="run a saved case (its .bin or .json) again and print the "
                        "outcome; with --backend native|emulated, on that backend")
    p.add_argument("--control", action="store_true",
                   help="code target's positive control: run each planted call aimed at "
                        "a canary with qemu-user *without* the sandbox (six "
                        "architectures) and check that the canaries see it; exit "
                        "status 1 when one is not seen")
    p.add_argument("--inline", action="store_true",
                   help="with --replay: run in this process (a crash kills it; for "
                        "debuggers)")
    return p


def child_opts(args, backend: str) -> dict:
    limit = args.native_as_gb if backend == "native" else args.emulated_as_gb
    return {"timeout": args.timeout, "cpu_limit": args.cpu_limit,
            "rss_limit_mb": args.rss_limit_mb,
            "address_space": int(limit * GIB) if limit else None,
            "emulated_call_timeout": args.emulated_call_timeout,
            "dispatch_timeout": args.dispatch_timeout,
            "confine": not getattr(args, "no_confine", False)}


def case_opts(base: dict, case: dict, manifest: dict) -> dict:
    from .corpus import dispatch_spec
    opts = dict(base)
    if case["target"] in ("elf", "threads", "files", "code"):
        opts["dispatch"] = dispatch_spec(manifest, case["kernel"], case["arch"])
    return opts


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if args.replay:
        return replay(args)
    if args.control:
        from .code import run_control
        results = run_control()
        missed = [f"{a}/{c}" for a, calls in results.items() for c, seen in calls.items()
                  if not seen]
        total = sum(len(calls) for calls in results.values())
        print(f"\n{total - len(missed)} of {total} planted calls changed a canary when "
              f"run without the sandbox" + (f"; not seen: {missed}" if missed else ""))
        if args.report:
            args.report.parent.mkdir(parents=True, exist_ok=True)
            args.report.write_text(json.dumps(results, indent=1) + "\n")
        return 1 if missed or not total else 0
    from . import corpus as corpus_mod
    from .child import preload
    t0 = time.monotonic()
    targets = corpus_mod.TARGETS if args.target == "all" else (args.target,)
    backends = corpus_mod.BACKENDS if args.backend == "both" else (args.backend,)
    if "code" in targets:
        if args.backend == "native":
            print("fuzz: the code target runs only on the emulated backend (on the "
                  "native one the hostile code would run on this host)", file=sys.stderr)
            return 2
        backends = ("emulated",)
    if targets == ("vmfb",) and args.backend == "both":
        backends = ("native",)      # no code of the file runs: one backend is enough
    if args.engine != "auto":
        os.environ["PKR_ENGINE"] = args.engine      # the children inherit it
    source = _source_state()   # the code the children run: imported now
    preload()
    corpus = corpus_mod.Corpus()
    opts = {b: child_opts(args, b) for b in backends}
    canary = None
    if "code" in targets:
        from .code import Canary
        canary = Canary()
    try:
        return _campaign(args, argv, t0, source, corpus, targets, backends, opts, canary)
    finally:
        if canary is not None:
            canary.close()


def _campaign(args, argv, t0, source, corpus, targets, backends, opts, canary) -> int:
    from . import corpus as corpus_mod
    from . import report
    from .child import engine_of
    from .runner import run_cases
    total = args.cases * len(backends)
    cases_dir = args.out / "cases"
    records: list[dict] = []
    progress_every = max(1, total // 20)

    def items():
        for backend in backends:
            for i in range(args.cases):
                case = corpus_mod.make_case(corpus, args.seed, backend, i, targets,
                                            env=canary.env if canary else None,
                                            kill_host=args.kill_host)
                if case["target"] == "code":
                    case["engine"] = engine_of(case["arch"])
                data = corpus_mod.case_data(corpus, case)
                yield dict(case, _opts=case_opts(opts[backend], case, corpus.manifest)), data

    cases_by_id: dict[str, dict] = {}

    def on_result(rec, data):
        records.append(rec)
        # Every problem case (and native guest crash) is saved for replay
        # as soon as it is known.
        if report.is_problem(rec) or report.is_guest(rec):
            rec["saved"] = str(save_case(cases_dir, cases_by_id[rec["id"]], rec, data))
        if not args.quiet and len(records) % progress_every == 0:
            n = Counter(report.column(r) for r in records)
            print(f"fuzz: {len(records)}/{total} cases, {time.monotonic() - t0:.0f} s: "
                  + ", ".join(f"{k} {n[k]}" for k in report.COLUMNS if n[k]),
                  file=sys.stderr)

    def with_opts():
        for case, data in items():
            cases_by_id[case["id"]] = case
            yield case, data

    run_cases(with_opts(), args.jobs, on_result, hooks=canary)
    elapsed = time.monotonic() - t0
    records.sort(key=lambda r: r["id"])
    for rec in records:
        if triage(rec, cases_by_id[rec["id"]], args, corpus):
            save_case(cases_dir, cases_by_id[rec["id"]], rec,
                      Path(rec["saved"]).read_bytes())

    compared = compare_emulated(records, cases_by_id, args, corpus)
    confirmed = confirm_reported(records, cases_by_id, corpus)
    elapsed = time.monotonic() - t0

    problems, guest = report.group_problems(records)
    minimized = {}
    if not args.no_minimize:
        for key, recs in problems.items():
            first = recs[0]
            m = minimize(corpus, cases_by_id[first["id"]], first, cases_dir, hooks=canary)
            if m is not None:
                minimized[key] = m
    summary = report.counts(records)
    out = {
        "command": " ".join(["python -m fuzz"] + (argv if argv is not None else sys.argv[1:])),
        "source": source,
        "config": {"cases_per_backend": args.cases, "seed": args.seed,
                   "backends": list(backends), "targets": list(targets), "jobs": args.jobs,
                   "engine": os.environ.get("PKR_ENGINE") or "auto",
                   "limits": {b: {k: v for k, v in o.items() if k != "dispatch"}
                              for b, o in opts.items()}},
        "elapsed_s": round(elapsed, 1),
        "compared_emulated": compared,
        "confirmed_cli": confirmed,
        "summary": summary,
        "problem_count": sum(len(v) for v in problems.values()),
        "problems": [_problem_entry(key, recs, minimized.get(key))
                     for key, recs in problems.items()],
        "guest_code_failures": [dict(_problem_entry(key, recs, None),
                                mutators=report.mutator_kinds(recs))
                                for key, recs in guest.items()],
        "typed": report.typed_breakdown(records),
        "faults": report.fault_breakdown(records),
        "stages": report.stage_breakdown(records),
        "cases": [_compact(r) for r in sorted(records, key=lambda r: r["id"])],
    }
    print(report.table(summary))
    print(f"\n{len(records)} cases in {elapsed:.0f} s (seed {args.seed}, jobs {args.jobs})")
    if compared:
        print(f"{compared} native case(s) whose functions all returned were run again "
              f"emulated (guarded buffers); "
              f"{sum(1 for r in records if r.get('was') and r['outcome'] == 'range')} "
              f"stopped there at an access outside a binding's range (range)")
    if confirmed:
        print(f"{confirmed} native crash(es) in the file's code run again with hal-cpu "
              f"run-module: {sum(1 for r in records if r.get('reported'))} reported as an "
              f"error (fault(reported))")
    faults = out["faults"]
    for key, f in faults.items():
        if f["syscall"]:
            print(f"{key}: {f['syscall']} case(s) ended in a 'syscall' fault; most seen: "
                  + ", ".join(f"{n} {c}" for n, c in list(f["syscall_names"].items())[:12]))
        if f.get("breach_kinds"):
            print(f"{key}: breaches: {f['breach_kinds']}")
    if guest:
        print(f"\nnative crashes and hangs of guest code (the file's own code, run on "
              f"this CPU): {sum(len(v) for v in guest.values())} in {len(guest)} kinds")
        for key, recs in sorted(guest.items(), key=lambda kv: [str(k) for k in kv[0]]):
            kinds = report.mutator_kinds(recs)
            what = "hang" if key[0] == "hang(guest)" else key[1]
            when = ("in a call of it" if key[3] == "during" else
                    "after it ran (clean on the emulated backend)")
            print(f"  {len(recs):5d} x {what} in stage {key[2]}, {when} (mutations: "
                  + ", ".join(f"{k} {n}" for k, n in kinds.items()) + ")")
    if problems:
        print(f"\n{len(problems)} distinct problems:")
        for key, recs in problems.items():
            print(f"\n[{len(recs)} case(s)] " + report.describe(recs[0]))
            m = minimized.get(key)
            if m:
                print(f"    minimized: {'; '.join(m['mutations'])}\n"
                      f"    replay: python -m fuzz --replay {m['saved']}")
    else:
        print("no escapes, no crashes or hangs outside guest code, no blow-ups"
              + (", no breaches of the canaries" if canary else ""))
    if any(r.get("saved") for r in records):
        print(f"\nsaved cases: {cases_dir}")
    if args.report:
        args.report.parent.mkdir(parents=True, exist_ok=True)
        args.report.write_text(json.dumps(out, indent=1, default=str) + "\n")
        print(f"report: {args.report}")
    return 1 if problems else 0


def _source_state() -> dict:
    """The commit fuzzed and the files that differ from it."""
    import subprocess
    root = HERE.parent

    def git(*a):
        try:
            return subprocess.run(["git", *a], cwd=root, capture_output=True, text=True,
                                  timeout=10).stdout.rstrip("\n")
        except (OSError, subprocess.SubprocessError):
            return ""
    return {"commit": git("rev-parse", "HEAD").strip(),
            "modified": [line[3:] for line in git("status", "--porcelain",
                                                  "--untracked-files=no").splitlines()]}


def _compact(rec: dict) -> dict:
    from .report import column
    out = {k: rec.get(k) for k in ("id", "arch", "seed", "outcome", "stage")}
    out["column"] = column(rec)
    if rec.get("error"):
        out["error"] = rec["error"]["type"].rsplit(".", 1)[-1]
        out["field"] = rec["error"].get("field")
        for k in ("fault", "syscall", "syscall_name", "status"):
            if k in rec["error"]:
                out[k] = rec["error"][k]
    for k in ("engine", "breaches", "was", "note", "kill_host_after"):
        if k in rec:
            out[k] = rec[k]
    if rec.get("target") in ("vmfb-run", "names"):
        # the bounds' margins: wall time, CPU time and peak RSS of each case
        out.update({k: rec.get(k) for k in ("wall_s", "cpu_s", "maxrss_mb")})
    if rec.get("target") == "code":
        out["mutations"] = rec.get("mutations")
    if rec["outcome"] not in ("accepted", "typed"):
        out["mutations"] = rec.get("mutations")
    if rec["outcome"] in ("crash", "hang"):
        out.update({k: rec.get(k) for k in ("backend", "signal", "in_guest", "guest_calls",
                                            "guest_location", "attribution")})
        if rec.get("emulated_replay"):
            out["emulated_replay"] = rec["emulated_replay"]["outcome"]
    return out


def _problem_entry(key, recs, minimized) -> dict:
    first = recs[0]
    entry = {"key": [str(k) for k in key], "count": len(recs),
             "backends": sorted({r["backend"] for r in recs}),
             "arches": sorted({r["arch"] for r in recs}),
             "cases": [r["id"] for r in recs[:20]], "first": first}
    if minimized:
        entry["minimized"] = minimized
    return entry


def save_case(directory: Path, case: dict, rec: dict, data: bytes) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    stem = directory / f"{case['id']}-{rec['outcome']}"
    stem.with_suffix(".bin").write_bytes(data)
    meta = {"case": {k: v for k, v in case.items() if k != "_opts"},
            "opts": case["_opts"], "result": {k: v for k, v in rec.items() if k != "saved"}}
    stem.with_suffix(".json").write_text(json.dumps(meta, indent=1, default=str) + "\n")
    return stem.with_suffix(".bin")


def triage(rec: dict, case: dict, args, corpus) -> bool:
    """Attribute a native crash or hang in host code to the file's code
    when that code ran natively before it: the same file is run on the
    emulated backend, where guest code cannot touch host memory; when it is
    accepted or refused with a typed error there, the native failure came
    from memory the guest code corrupted. Returns True when ``rec`` changed."""
    from . import report
    from .runner import run_one
    if (rec["backend"] != "native" or report.column(rec) not in ("crash(host)", "hang")
            or not rec.get("guest_calls") or rec.get("in_callback")):
        return False
    emu = dict(case, backend="emulated",
               _opts=case_opts(child_opts(args, "emulated"), case, corpus.manifest))
    r = run_one(emu, Path(rec["saved"]).read_bytes())
    rec["emulated_replay"] = {"outcome": report.column(r), "stage": r.get("stage"),
                              "error": (r.get("error") or {}).get("message")}
    if r["outcome"] in ("accepted", "typed"):
        rec["acceptable"] = True
        rec["attribution"] = (f"host code failed after {rec['guest_calls']} native "
                              f"call(s) of the file's code; the same file on the emulated "
                              f"backend: {r['outcome']} at {r.get('stage')}"
                              + (f" ({r['error']['message']})" if r.get("error") else ""))
        return True
    return False


#: Errors of an emulated run that mean an access outside a buffer.
OVERRUN_ERRORS = ("GuardError", "OverrunError", "BindingOverrunError",
                  "BindingUnderrunError", "LocalMemoryOverrunError")
#: Fault kinds of a read outside mapped or readable memory.
READ_FAULTS = ("read_unmapped", "read_protected", "access_unmapped", "access_protected")


def emulated_overrun(rec: dict) -> str | None:
    """What an emulated run's outcome says of a read outside a buffer (a
    guard page hit or another read of unmapped or protected memory), or
    None (a write outside a buffer, caught there, is not a read returned)."""
    err = rec.get("error") or {}
    cls = (err.get("type") or "").rsplit(".", 1)[-1]
    fault = err.get("fault")
    if fault in READ_FAULTS or (fault is None and cls in OVERRUN_ERRORS):
        return f"{cls}: {(err.get('message') or '')[:300]}"
    return None


def compare_emulated(records: list, cases_by_id: dict, args, corpus) -> int:
    """``vmfb-run`` and ``names``: each native case whose every function
    returned runs again on the emulated backend (same file, same
    architecture, guarded buffers); where that run stops at an access
    outside a binding's range, the native kernel read past the range its
    dispatch bound: the native case becomes ``range`` (``emulated_replay``
    says why). Natively every buffer ends before a guard page, so such a
    read stays inside the program's own buffer (a read past the buffer
    faults); the canary check of the results (``oob``) would show
    anything from outside it."""
    from .runner import run_cases
    todo = [r for r in records if r["target"] in ("vmfb-run", "names")
            and r["backend"] == "native" and r["outcome"] == "accepted"
            and cases_by_id[r["id"]].get("kind") != "plugin"]
    if not todo:
        return 0
    by_id = {r["id"]: r for r in todo}
    emu_opts = child_opts(args, "emulated")

    def items():
        for r in todo:
            case = cases_by_id[r["id"]]
            yield (dict(case, backend="emulated", _opts=emu_opts),
                   corpus_data(corpus, case))

    def done(emu, _data):
        rec = by_id[emu["id"]]
        rec["emulated_replay"] = {"outcome": emu["outcome"], "stage": emu.get("stage"),
                                  "error": (emu.get("error") or {}).get("message"),
                                  "fault": (emu.get("error") or {}).get("fault")}
        why = emulated_overrun(emu)
        if why:
            rec.update(was=rec["outcome"], outcome="range", error={
                "type": "fuzz.vmrun.OutOfRangeRead",
                "message": f"returned natively; on the emulated backend: {why}",
                "field": None, "value": None, "traceback": []})
            case = cases_by_id[rec["id"]]
            rec["saved"] = str(save_case(args.out / "cases", case, rec,
                                         corpus_data(corpus, case)))
    run_cases(items(), args.jobs, done)
    return len(todo)


def reported_error(results: list) -> str | None:
    """The error line with which ``hal-cpu run-module`` reported a fault,
    from its runs' ``(status, stderr)``: every run ended with status 0 or
    1, a failed one's stderr starts with one ``hal-cpu: error:`` line
    (lines after it are the diagnosis: where the emulated rerun found the
    fault) and holds no traceback; None otherwise, or when none failed."""
    first = None
    for status, err in results:
        if status == 0:
            continue
        lines = err.strip().splitlines()
        if status != 1 or not lines or not lines[0].startswith("hal-cpu: error:") \
                or "Traceback (most recent call last)" in err:
            return None
        first = first or lines[0][:400]
    return first


def confirm_reported(records: list, cases_by_id: dict, corpus) -> int:
    """``vmfb-run`` and ``names``: each native crash in the file's own code
    runs again as a user runs the file, ``hal-cpu run-module FILE
    --function=F --input=...`` for every public function (the command runs
    native code in a confined child of its own). When the command reports
    the fault as an error (:func:`reported_error`), the case counts as
    ``fault(reported)`` (``reported`` holds the error line). Returns the
    number of cases run again."""
    from .vmrun import cli_inputs
    todo = [r for r in records if r["target"] in ("vmfb-run", "names")
            and r["backend"] == "native" and r["outcome"] == "crash" and r.get("acceptable")
            and cases_by_id[r["id"]].get("kind") != "plugin"]
    for rec in todo:
        results = cli_inputs(corpus_data(corpus, cases_by_id[rec["id"]]))
        rec["cli"] = [f"status {st}: {err.strip()[-600:]}" for st, err in results]
        line = reported_error(results)
        if line:
            rec["reported"] = line
    return len(todo)


def corpus_data(corpus, case: dict) -> bytes:
    from .corpus import case_data
    return case_data(corpus, case)


def minimize(corpus, case: dict, rec: dict, directory: Path, budget: int = 48,
             seconds: float = 90.0, hooks=None):
    """Fewest byte operations of ``case`` reproducing the same problem
    (ddmin over the operations, at most ``budget`` child runs and about
    ``seconds``); None when the case has a single operation or nothing
    smaller reproduces it."""
    from . import mutate
    from .report import problem_key
    from .runner import run_one
    ops = mutate.ops_from_json(case["ops"])
    if len(ops) <= 1:
        return None
    seed_data = corpus.seed(case["seed"]).data
    want = problem_key(rec)
    # which mutation each op came from
    owner = [i for i, n in enumerate(case.get("groups", [len(ops)])) for _ in range(n)]
    runs = 0

    def test(idx):
        nonlocal runs
        runs += 1
        sub = [ops[i] for i in idx]
        c = dict(case, ops=mutate.ops_to_json(sub),
                 mutations=sorted({case["mutations"][owner[i]] for i in idx}))
        r = run_one(c, mutate.apply(seed_data, sub), hooks)
        return problem_key(r) == want, c, r

    current = list(range(len(ops)))
    best = None
    n = 2
    stop = time.monotonic() + seconds
    budget_left = lambda: runs < budget and time.monotonic() < stop  # noqa: E731
    while len(current) > 1 and budget_left():
        chunk = max(1, len(current) // n)
        reduced = False
        for start in range(0, len(current), chunk):
            if not budget_left():
                break
            complement = current[:start] + current[start + chunk:]
            if not complement:
                continue
            ok, c, r = test(complement)
            if ok:
                current, best = complement, (c, r)
                n = max(n - 1, 2)
                reduced = True
                break
        if not reduced:
            if n >= len(current):
                break
            n = min(len(current), 2 * n)
    if best is None:
        return None
    c, r = best
    c = dict(c, id=case["id"] + "-min")
    path = save_case(directory, c, r, mutate.apply(seed_data, mutate.ops_from_json(c["ops"])))
    return {"mutations": c["mutations"], "ops": c["ops"], "saved": str(path),
            "outcome": r["outcome"]}


def replay(args) -> int:
    from .runner import run_one
    path = args.replay
    meta_path = path.with_suffix(".json")
    bin_path = path.with_suffix(".bin")
    meta = json.loads(meta_path.read_text())
    case, opts = meta["case"], meta["opts"]
    data = bin_path.read_bytes()
    if args.backend != "both" and args.backend != case["backend"]:
        from .corpus import load_manifest
        case = dict(case, backend=args.backend)
        opts = case_opts(child_opts(args, args.backend), case, load_manifest())
    print(f"case {case['id']}: {case['target']} on {case['backend']} ({case['arch']}), "
          f"seed {case['seed']}")
    for m in case.get("mutations", []):
        print(f"  mutation: {m}")
    if "result" in meta:
        print(f"recorded: {meta['result'].get('outcome')} at {meta['result'].get('stage')}")
    canary = None
    if case.get("target") == "code":
        if case["backend"] != "emulated":
            print("fuzz: the code target runs only on the emulated backend", file=sys.stderr)
            return 2
        if args.engine != "auto":
            os.environ["PKR_ENGINE"] = args.engine
        # new canaries (directory, port, process): the planted code is
        # planned again against them
        from .child import preload
        from .code import Canary
        from .corpus import Corpus, case_data, replan
        preload()
        corpus = Corpus()
        canary = Canary()
        case = replan(corpus, dict(case, id=case["id"]), canary.env(case.get("index", 0)))
        data = case_data(corpus, case)
        print(f"  canaries: {case['canary']}")
    try:
        if args.inline:
            from .child import Reporter, instrument, run
            rep = Reporter(os.dup(2))
            instrument(rep)
            if canary is not None:
                canary.prepare(case)
            rec = run(case, data, rep, opts)
            if canary is not None:
                found = canary.check(case, [], {}, set())
                if found:
                    rec.update(was=rec["outcome"], outcome="breach", breaches=found)
        else:
            rec = run_one(dict(case, _opts=opts), data, canary)
            if (case.get("target") in ("vmfb-run", "names") and case["backend"] == "native"
                    and rec["outcome"] == "accepted"):
                # as the campaign does: the same file on the emulated backend
                emu = run_one(dict(case, backend="emulated",
                                   _opts=child_opts(args, "emulated")), data)
                why = emulated_overrun(emu)
                print(f"  emulated: {emu['outcome']} at {emu.get('stage')}"
                      + (f" ({why})" if why else ""))
                if why:
                    rec.update(was="accepted", outcome="range", error={
                        "type": "fuzz.vmrun.OutOfRangeRead",
                        "message": f"returned natively; on the emulated backend: {why}",
                        "field": None, "value": None, "traceback": []})
            if (case.get("target") in ("vmfb-run", "names") and case["backend"] == "native"
                    and rec["outcome"] == "crash" and rec.get("acceptable")):
                # as the campaign does: the file run by hal-cpu run-module
                from .vmrun import cli_inputs
                results = cli_inputs(data)
                for st, err in results:
                    print(f"  hal-cpu run-module: status {st}: {err.strip()[-600:]}")
                line = reported_error(results)
                if line:
                    rec["reported"] = line
    finally:
        if canary is not None:
            canary.close()
    from .report import column, describe
    rec.setdefault("id", case["id"])
    for k in ("backend", "arch", "seed", "target", "mutations"):
        rec.setdefault(k, case.get(k))
    for b in rec.get("breaches", []):
        print(f"  breach: {b}")
    print(f"now: {column(rec)} at {rec.get('stage')}"
          + (f" (peak RSS {rec['maxrss_mb']} MiB, CPU {rec['cpu_s']} s)"
             if "maxrss_mb" in rec else ""))
    if rec["outcome"] not in ("accepted",):
        print(describe(rec))
    err = rec.get("error")
    if err:
        print(f"error: {err['type']}: {err['message']}")
        if err.get("fault"):
            print(f"fault: {err['fault']}"
                  + (f", system call {err.get('syscall_name')} ({err.get('syscall')})"
                     if err["fault"] == "syscall" else ""))
        for f in err.get("traceback", []):
            print(f"  at {f}")
    return 0
