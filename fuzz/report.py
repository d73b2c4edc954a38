"""Summaries of a run: the outcome table, distinct problems, the JSON report."""

from __future__ import annotations

import re
from collections import Counter, defaultdict

#: Table columns, in order.
COLUMNS = ("accepted", "typed", "escape", "oob", "range", "fault(reported)", "crash(guest)",
           "crash(host)", "hang(guest)", "hang", "blowup", "breach", "killed")
#: Columns of the ``code`` target only, left out of a table where all are 0.
CODE_COLUMNS = ("breach", "killed")
#: Columns shown only for the targets that can fill them (or when not 0):
#: ``oob``, a result holding bytes from outside its input buffers;
#: ``range``, a native result of a kernel that read past the range its
#: dispatch bound but inside the program's own buffer (the same file
#: emulated stops at the binding's end).
TARGET_COLUMNS = {"breach": ("code",), "killed": ("code",), "oob": ("vmfb-run", "names"),
                  "range": ("vmfb-run", "names"),
                  "fault(reported)": ("vmfb-run", "names")}
PROJECT_DIRS = ("elfloader/", "hal_cpu/", "fatelf/")


def column(rec: dict) -> str:
    """Table column of a case: crashes and hangs split into those inside
    the file's own native code (``(guest)``) and the others."""
    if rec["outcome"] == "crash":
        if rec.get("acceptable") and rec.get("reported"):
            # a native crash of the file's code that hal-cpu run-module,
            # running the same file, reported as an error
            return "fault(reported)"
        return "crash(guest)" if rec.get("acceptable") else "crash(host)"
    if rec["outcome"] == "hang":
        return "hang(guest)" if rec.get("acceptable") else "hang"
    return rec["outcome"]


def is_problem(rec: dict) -> bool:
    """Escapes, blow-ups, breaches of the canaries, and crashes and hangs
    outside guest code."""
    return column(rec) in ("escape", "oob", "crash(host)", "hang", "blowup", "breach")


def is_guest(rec: dict) -> bool:
    return column(rec) in ("crash(guest)", "hang(guest)")


def counts(records) -> dict:
    """{target: {backend: {column: n}}} with every column present."""
    out: dict = {}
    for rec in records:
        row = out.setdefault(rec["target"], {}).setdefault(
            backend_label(rec), {c: 0 for c in COLUMNS})
        row[column(rec)] += 1
    return {t: {b: out[t][b] for b in sorted(out[t])} for t in sorted(out)}


def backend_label(rec: dict) -> str:
    """The backend, with the engine for ``code`` cases (``emulated/qemu``)."""
    if rec.get("target") == "code" and rec.get("engine"):
        return f"{rec['backend']}/{rec['engine']}"
    return rec["backend"]


_CALLED = re.compile(r"system call (.+?)(?: \(|$)")


def syscall_label(err: dict) -> str:
    """The name of the system call a ``syscall`` fault reports; without a
    name its number, or the report's own words (``creating a process``)."""
    if err.get("syscall_name"):
        return err["syscall_name"]
    if err.get("syscall") is not None:
        return f"#{err['syscall']}"
    m = _CALLED.search(err.get("message") or "")
    return f"({m.group(1)})" if m else "(unknown)"


def fault_breakdown(records) -> dict:
    """Per target and backend (with engine): cases ending in each kind of
    emulated fault, those ending in a ``syscall`` fault and the system
    calls' names, most seen first, and the kinds of breaches."""
    out: dict = {}
    for rec in records:
        err = rec.get("error") or {}
        key = f"{rec['target']}/{backend_label(rec)}"
        row = out.setdefault(key, {"faults": Counter(), "syscall": 0,
                                   "syscall_names": Counter(), "breach_kinds": Counter()})
        if err.get("fault"):
            row["faults"][err["fault"]] += 1
        if err.get("fault") == "syscall":
            row["syscall"] += 1
            row["syscall_names"][syscall_label(err)] += 1
        for b in rec.get("breaches", []):
            row["breach_kinds"][b.split(":", 1)[0]] += 1
    return {k: {"faults": dict(v["faults"].most_common()), "syscall": v["syscall"],
                "syscall_names": dict(v["syscall_names"].most_common()),
                "breach_kinds": dict(v["breach_kinds"].most_common())}
            for k, v in sorted(out.items())}


def table(summary: dict) -> str:
    cols = [k for k in COLUMNS if k not in TARGET_COLUMNS
            or any(t in summary for t in TARGET_COLUMNS[k]) or any(
                c.get(k) for per in summary.values() for c in per.values())]
    head = ["target", "backend", "cases", *cols]
    rows = []
    total = Counter()
    for target, per in summary.items():
        for backend, c in per.items():
            n = sum(c.values())
            rows.append([target, backend, str(n), *(str(c[k]) for k in cols)])
            total.update(c)
            total["cases"] += n
    rows.append(["total", "", str(total["cases"]), *(str(total[k]) for k in cols)])
    widths = [max(len(r[i]) for r in rows + [head]) for i in range(len(head))]
    fmt = lambda r: "  ".join(v.ljust(w) if i < 2 else v.rjust(w)  # noqa: E731
                              for i, (v, w) in enumerate(zip(r, widths)))
    lines = [fmt(head), fmt(["-" * w for w in widths])]
    lines += [fmt(r) for r in rows[:-1]] + [fmt(["-" * w for w in widths]), fmt(rows[-1])]
    return "\n".join(lines)


def _project_frame(frames) -> str | None:
    """Innermost frame in the project's packages (frames are outermost
    first for tracebacks)."""
    for f in reversed(frames or []):
        if f.startswith(PROJECT_DIRS) or any("/" + d in f for d in PROJECT_DIRS):
            return f
    return frames[-1] if frames else None


def problem_key(rec: dict) -> tuple:
    """What makes two problem cases the same problem."""
    col = column(rec)
    stage = (rec.get("stage") or "").split("/")[0]
    if col == "escape":
        err = rec.get("error", {})
        return ("escape", err.get("type"), _project_frame(err.get("traceback")))
    if col == "oob":
        return ("oob", rec["backend"], rec.get("stage"))
    if col == "crash(host)":
        frame = (rec.get("frames") or [None])[0]
        return ("crash(host)", rec["backend"], rec.get("signal"), rec.get("stage"), frame)
    if col == "hang":
        frame = (rec.get("frames") or [None])[0]
        return ("hang", rec["backend"], stage, rec.get("in_guest"), frame)
    if col == "breach":
        kinds = tuple(sorted({b.split(":", 1)[0] for b in rec.get("breaches", [])}))
        return ("breach", backend_label(rec), kinds)
    if col == "blowup":
        reason = rec.get("reason", "")
        kind = ("MemoryError" if "MemoryError" in reason else
                "rss" if "RSS" in reason else "cpu" if "CPU" in reason else reason)
        return ("blowup", rec["backend"], kind, stage)
    if col in ("crash(guest)", "hang(guest)"):
        return (col, rec.get("signal"), rec.get("stage"),
                "after" if rec.get("emulated_replay") else "during")
    return (col,)


def mutator_kinds(records) -> dict:
    """How often each mutator took part in ``records``: ``phdr``,
    ``symbol``, ``payload/code``..."""
    c = Counter()
    for rec in records:
        kinds = set()
        for m in rec.get("mutations", []):
            head = m.split(":", 1)[0]
            if head == "payload":
                head = "payload/" + m.split("/", 1)[1].split(":", 1)[0]
            kinds.add(head)
        c.update(kinds)
    return dict(sorted(c.items(), key=lambda kv: (-kv[1], kv[0])))


def typed_breakdown(records) -> dict:
    by_class = defaultdict(Counter)
    by_field = Counter()
    for rec in records:
        if rec["outcome"] != "typed":
            continue
        err = rec.get("error", {})
        cls = err.get("type", "?").rsplit(".", 1)[-1]
        by_class[f"{rec['target']}/{rec['backend']}"][cls] += 1
        fld = re.sub(r"\d+", "N", str(err.get("field")))
        by_field[f"{cls}: {fld}"] += 1
    return {"by_class": {k: dict(sorted(v.items())) for k, v in sorted(by_class.items())},
            "by_field": dict(by_field.most_common(40))}


def stage_breakdown(records) -> dict:
    """Where accepted and typed cases stopped, per target and backend."""
    out = defaultdict(Counter)
    for rec in records:
        out[f"{rec['target']}/{rec['backend']}/{rec['outcome']}"][
            (rec.get("stage") or "?").split("/")[0]] += 1
    return {k: dict(sorted(v.items())) for k, v in sorted(out.items())}


def group_problems(records) -> tuple[dict, dict]:
    """Distinct problems and distinct guest crashes: key -> list of records
    (in case order)."""
    problems, guest = defaultdict(list), defaultdict(list)
    for rec in sorted(records, key=lambda r: r["id"]):
        if is_problem(rec):
            problems[problem_key(rec)].append(rec)
        elif is_guest(rec):
            guest[problem_key(rec)].append(rec)
    return problems, guest


def describe(rec: dict) -> str:
    """One paragraph about a problem case."""
    col = column(rec)
    lines = [f"{col}: {rec['id']} ({backend_label(rec)}, {rec['arch']}, seed {rec['seed']}), "
             f"stage {rec.get('stage')}"]
    for m in rec.get("mutations", []):
        lines.append(f"    mutation: {m}")
    if col in ("escape", "oob"):
        err = rec["error"]
        lines.append(f"    {err['type']}: {err['message']}")
        for f in err.get("traceback", [])[-4:]:
            lines.append(f"      at {f}")
    elif col in ("crash(host)", "crash(guest)", "hang", "hang(guest)"):
        lines.append(f"    signal {rec.get('signal')}, in guest call: {rec.get('in_guest')}"
                     f" ({rec.get('guest_location') or rec.get('guest_address')}), "
                     f"guest calls before: {rec.get('guest_calls')}")
        if rec.get("attribution"):
            lines.append(f"    attributed to guest code: {rec['attribution']}")
        for f in rec.get("frames", [])[:4]:
            lines.append(f"      at {f}")
        if rec.get("harness_error"):
            lines.append("    harness: " + rec["harness_error"].strip().splitlines()[-1])
    elif col == "breach":
        for b in rec.get("breaches", []):
            lines.append(f"    {b}")
        lines.append(f"    the child's own outcome: {rec.get('was')}"
                     + (f" ({rec['error']['type']}: {rec['error']['message'][:200]})"
                        if rec.get("error") else ""))
    elif col == "blowup":
        lines.append(f"    {rec.get('reason')} (peak RSS {rec.get('maxrss_mb')} MiB, "
                     f"CPU {rec.get('cpu_s')} s, was {rec.get('was', '-')})")
    if rec.get("saved"):
        lines.append(f"    replay: python -m fuzz --replay {rec['saved']}")
    return "\n".join(lines)
