"""Summaries of a run: the outcome table, distinct problems, the JSON report."""

from __future__ import annotations

import re
from collections import Counter, defaultdict

#: Table columns, in order.
COLUMNS = ("accepted", "typed", "escape", "crash(guest)", "crash(host)", "hang(guest)",
           "hang", "blowup")
PROJECT_DIRS = ("elfloader/", "hal_cpu/", "fatelf/")


def column(rec: dict) -> str:
    """Table column of a case: crashes and hangs split into those inside
    the file's own native code (``(guest)``) and the others."""
    if rec["outcome"] == "crash":
        return "crash(guest)" if rec.get("acceptable") else "crash(host)"
    if rec["outcome"] == "hang":
        return "hang(guest)" if rec.get("acceptable") else "hang"
    return rec["outcome"]


def is_problem(rec: dict) -> bool:
    """Escapes, blow-ups, and crashes and hangs outside guest code."""
    return column(rec) in ("escape", "crash(host)", "hang", "blowup")


def is_guest(rec: dict) -> bool:
    return column(rec) in ("crash(guest)", "hang(guest)")


def counts(records) -> dict:
    """{target: {backend: {column: n}}} with every column present."""
    out: dict = {}
    for rec in records:
        row = out.setdefault(rec["target"], {}).setdefault(
            rec["backend"], {c: 0 for c in COLUMNS})
        row[column(rec)] += 1
    return {t: {b: out[t][b] for b in sorted(out[t])} for t in sorted(out)}


def table(summary: dict) -> str:
    head = ["target", "backend", "cases", *COLUMNS]
    rows = []
    total = Counter()
    for target, per in summary.items():
        for backend, c in per.items():
            n = sum(c.values())
            rows.append([target, backend, str(n), *(str(c[k]) for k in COLUMNS)])
            total.update(c)
            total["cases"] += n
    rows.append(["total", "", str(total["cases"]), *(str(total[k]) for k in COLUMNS)])
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
    if col == "crash(host)":
        frame = (rec.get("frames") or [None])[0]
        return ("crash(host)", rec["backend"], rec.get("signal"), rec.get("stage"), frame)
    if col == "hang":
        frame = (rec.get("frames") or [None])[0]
        return ("hang", rec["backend"], stage, rec.get("in_guest"), frame)
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
    lines = [f"{col}: {rec['id']} ({rec['backend']}, {rec['arch']}, seed {rec['seed']}), "
             f"stage {rec.get('stage')}"]
    for m in rec.get("mutations", []):
        lines.append(f"    mutation: {m}")
    if col == "escape":
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
    elif col == "blowup":
        lines.append(f"    {rec.get('reason')} (peak RSS {rec.get('maxrss_mb')} MiB, "
                     f"CPU {rec.get('cpu_s')} s, was {rec.get('was', '-')})")
    if rec.get("saved"):
        lines.append(f"    replay: python -m fuzz --replay {rec['saved']}")
    return "\n".join(lines)
