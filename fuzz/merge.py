"""``python -m fuzz.merge REPORT.json...``: one table from several runs.

A long campaign is best run as several runs of other ``--seed`` values
(each writes its report when it ends, so a campaign stopped early keeps
the runs it finished). This adds their tables up, lists the distinct
problems over all of them (the same grouping as one run's, with the
number of cases and the first case of each) and the time taken and rate.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter, defaultdict
from pathlib import Path

from . import report


def merge(paths: list[Path]) -> dict:
    """The summed summary, problems and times of the reports at ``paths``."""
    summary: dict = {}
    problems: dict = defaultdict(list)
    elapsed, compared = 0.0, 0
    commits: Counter = Counter()
    peaks: dict = {}
    for path in paths:
        rep = json.loads(path.read_text())
        elapsed += rep.get("elapsed_s", 0.0)
        compared += rep.get("compared_emulated", 0) or 0
        commits[rep.get("source", {}).get("commit", "?")[:10]] += 1
        for target, per in rep["summary"].items():
            for backend, row in per.items():
                dst = summary.setdefault(target, {}).setdefault(
                    backend, {c: 0 for c in report.COLUMNS})
                for k, v in row.items():
                    dst[k] = dst.get(k, 0) + v
        for c in rep.get("cases", []):
            for k in ("wall_s", "cpu_s", "maxrss_mb"):
                if c.get(k) is not None:
                    peaks[k] = max(peaks.get(k, 0.0), c[k])
        for p in rep.get("problems", []):
            key = json.dumps(p.get("key"), default=str)
            problems[key].append((path.name, p))
    return {"summary": summary, "problems": problems, "elapsed_s": elapsed,
            "commits": dict(commits), "compared_emulated": compared,
            "runs": len(paths), "peaks": peaks}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m fuzz.merge", description=__doc__)
    p.add_argument("reports", nargs="+", type=Path)
    args = p.parse_args(argv)
    m = merge(args.reports)
    cases = sum(sum(row.values()) for per in m["summary"].values() for row in per.values())
    print(report.table(m["summary"]))
    rate = cases / m["elapsed_s"] if m["elapsed_s"] else 0.0
    print(f"\n{cases} cases in {m['runs']} runs, {m['elapsed_s']:.0f} s "
          f"({rate:.2f} cases/s); native cases run again emulated: "
          f"{m['compared_emulated']}; commits: {m['commits']}")
    if m["peaks"]:
        print("largest per case: " + ", ".join(f"{k} {v}" for k, v in m["peaks"].items()))
    if m["problems"]:
        print(f"\n{len(m['problems'])} distinct problems:")
        for key, found in sorted(m["problems"].items(), key=lambda kv: -sum(
                p.get("count", 1) for _, p in kv[1])):
            n = sum(p.get("count", 1) for _, p in found)
            name, first = found[0]
            print(f"\n[{n} case(s) in {len(found)} run(s)] {key}")
            for line in report.describe(first["first"]).splitlines()[:9]:
                print(f"    {line}")
            print(f"    first in {name}")
    return 1 if m["problems"] else 0


if __name__ == "__main__":
    sys.exit(main())
