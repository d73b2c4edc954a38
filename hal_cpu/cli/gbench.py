"""``benchmark-module``'s reports in Google Benchmark's formats, as
``iree-benchmark-module`` prints them (``--benchmark_format=console|json|csv``):
the same benchmark name (``BM_<function>/process_time/real_time``), the
same fields (``name``, ``run_name``, ``run_type``, ``repetitions``,
``repetition_index``, ``threads``, ``iterations``, ``real_time``,
``cpu_time``, ``time_unit``, ``items_per_second``; aggregates ``mean``,
``median``, ``stddev``, ``cv`` with ``aggregate_name`` and
``aggregate_unit``) and the same layout, from the timings a run measured
(:class:`Repetition`). The layout is Google Benchmark's (its
``console_reporter.cc``, ``json_reporter.cc``, ``csv_reporter.cc``),
written anew here; ``context`` holds what this machine tells
(``/proc``, ``/sys``), ``library_version`` names hal-cpu.

A leaf of the command line: only :mod:`hal_cpu.cli.modules` imports it.
"""

from __future__ import annotations

import math
import os
import socket
import statistics
import sys
import time
from dataclasses import dataclass
from typing import Sequence

__all__ = ["FORMATS", "TIME_UNITS", "Repetition", "Run", "console",
           "context", "csv", "json_report", "runs"]

#: ``--benchmark_format`` values.
FORMATS = ("console", "json", "csv")
#: ``--benchmark_time_unit`` -> seconds per unit.
TIME_UNITS = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0}


@dataclass(frozen=True)
class Repetition:
    """One repetition of a benchmark: ``iterations`` calls taking
    ``real`` seconds of wall-clock time and ``cpu`` seconds of this
    process's CPU time (all its threads, as ``process_time`` measures)."""

    iterations: int
    real: float
    cpu: float


@dataclass(frozen=True)
class Run:
    """A row of the report: an iteration row (``aggregate`` None) or an
    aggregate (``mean``, ``median``, ``stddev``, ``cv``). ``real_time``,
    ``cpu_time`` in the report's unit per iteration (for ``cv`` a
    fraction); ``items_per_second`` calls per second."""

    name: str
    run_name: str
    repetitions: int
    repetition_index: int | None
    iterations: int
    real_time: float
    cpu_time: float
    items_per_second: float
    aggregate: str | None = None


def runs(function: str, reps: Sequence[Repetition], unit: str = "ms",
         aggregates_only: bool = False) -> list[Run]:
    """The rows of a report of ``reps`` of ``@function``: one per
    repetition, then (for more than one) the mean, median, standard
    deviation (of the sample) and coefficient of variation of each
    figure over the repetitions, as Google Benchmark computes them;
    ``aggregates_only``: the aggregates alone."""
    name = f"BM_{function}/process_time/real_time"
    scale = TIME_UNITS[unit]
    rows = []
    for i, r in enumerate(reps):
        n = max(r.iterations, 1)
        rows.append(Run(name, name, len(reps), i, r.iterations,
                        r.real / n / scale, r.cpu / n / scale,
                        r.iterations / r.real if r.real > 0 else 0.0))
    if len(rows) < 2:
        return rows
    out = [] if aggregates_only else list(rows)

    def stat(kind: str, values: list[float]) -> float:
        if kind == "mean":
            return statistics.fmean(values)
        if kind == "median":
            return statistics.median(values)
        sd = statistics.stdev(values)
        if kind == "stddev":
            return sd
        mean = statistics.fmean(values)
        return sd / mean if mean else 0.0
    for kind in ("mean", "median", "stddev", "cv"):
        out.append(Run(f"{name}_{kind}", name, len(rows), None, len(rows),
                       stat(kind, [r.real_time for r in rows]),
                       stat(kind, [r.cpu_time for r in rows]),
                       stat(kind, [r.items_per_second for r in rows]), kind))
    return out


# ---------------------------------------------------------------------------
# the context: this machine

def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def _mhz() -> int:
    text = _read("/proc/cpuinfo") or ""
    for line in text.splitlines():
        if line.lower().startswith("cpu mhz"):
            try:
                return int(float(line.partition(":")[2]))
            except ValueError:
                break
    return 0


def _caches() -> list[dict]:
    out: list[dict] = []
    base = "/sys/devices/system/cpu/cpu0/cache"
    try:
        names = sorted(n for n in os.listdir(base) if n.startswith("index"))
    except OSError:
        return out
    for n in names:
        kind = _read(f"{base}/{n}/type")
        level = _read(f"{base}/{n}/level")
        size = _read(f"{base}/{n}/size")
        shared = _read(f"{base}/{n}/shared_cpu_list") or ""
        if not (kind and level and size):
            continue
        scale = {"K": 1024, "M": 1 << 20, "G": 1 << 30}.get(size[-1:], 1)
        try:
            nbytes = int(size.rstrip("KMG")) * scale
        except ValueError:
            continue
        sharing = 0
        for part in shared.split(","):
            lo, _, hi = part.partition("-")
            if lo.strip().isdigit():
                sharing += (int(hi) - int(lo) + 1) if hi.strip().isdigit() else 1
        out.append({"type": kind, "level": int(level), "size": nbytes,
                    "num_sharing": sharing or 1})
    return out


def context(executable: str, version: str) -> dict:
    """What Google Benchmark's ``context`` says, of this machine: date,
    host name, the program run, CPUs and their clock (MHz), whether
    frequency scaling and ASLR are on, the caches of CPU 0, the load
    average; ``library_version`` is ``hal-cpu <version>``."""
    governor = _read("/sys/devices/system/cpu/cpu0/cpufreq/scaling_governor")
    aslr = _read("/proc/sys/kernel/randomize_va_space")
    try:
        load = list(os.getloadavg())
    except OSError:
        load = []
    return {
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime())[:-2]
        + ":" + time.strftime("%z")[-2:],
        "host_name": socket.gethostname(),
        "executable": executable,
        "num_cpus": os.cpu_count() or 1,
        "mhz_per_cpu": _mhz(),
        "cpu_scaling_enabled": governor not in (None, "performance"),
        "aslr_enabled": aslr not in (None, "0"),
        "caches": _caches(),
        "load_avg": load,
        "library_version": f"hal-cpu {version}",
        "library_build_type": "release",
        "json_schema_version": 1,
    }


def _context_lines(ctx: dict) -> list[str]:
    """The context as Google Benchmark writes it ahead of a console or CSV
    report (on stderr)."""
    lines = [ctx["date"], f"Running {ctx['executable']}",
             f"Run on ({ctx['num_cpus']} X {ctx['mhz_per_cpu']} MHz CPU "
             f"{'s' if ctx['num_cpus'] > 1 else ''})"]
    if ctx["caches"]:
        lines.append("CPU Caches:")
        for c in ctx["caches"]:
            text = f"{c['size'] // 1024} KiB"
            count = (ctx["num_cpus"] // c["num_sharing"]) if c["num_sharing"] else 1
            lines.append(f"  L{c['level']} {c['type']} {text} (x{max(count, 1)})")
    if ctx["load_avg"]:
        lines.append("Load Average: " + ", ".join(f"{v:.2f}" for v in ctx["load_avg"]))
    if ctx["cpu_scaling_enabled"]:
        lines.append("***WARNING*** CPU scaling is enabled, the benchmark real "
                     "time measurements may be noisy and will incur extra "
                     "overhead.")
    if ctx["aslr_enabled"]:
        lines.append("***WARNING*** ASLR is enabled, the results may have "
                     "unreproducible noise in them.")
    return lines


# ---------------------------------------------------------------------------
# the formats

def _time(value: float) -> str:
    """A time column of the console table (13 characters with the unit)."""
    if value < 1.0:
        return f"{value:10.3f}"
    if value < 10.0:
        return f"{value:10.2f}"
    if value < 100.0:
        return f"{value:10.1f}"
    if value > 9999999999:
        return f"{value:1.4e}"
    return f"{value:10.0f}"


def _human(value: float) -> str:
    """A counter as the console table shows it (SI prefixes: 124.26k)."""
    for prefix in ("", "k", "M", "G", "T", "P"):
        if abs(value) < 1000 * 1.1 or prefix == "P":
            return f"{value:.5g}{prefix}"
        value /= 1000
    return f"{value:.5g}"


def console(rows: Sequence[Run], ctx: dict, unit: str, out=None, err=None) -> None:
    """Google Benchmark's console table on ``out`` (the context on
    ``err``)."""
    out = out or sys.stdout
    err = err or sys.stderr
    err.write("\n".join(_context_lines(ctx)) + "\n")
    err.flush()
    width = max([len("Benchmark")] + [len(r.name) for r in rows])
    head = f"{'Benchmark':<{width}} {'Time':>13} {'CPU':>15} {'Iterations':>12} UserCounters..."
    lines = ["-" * len(head), head, "-" * len(head)]
    for r in rows:
        if r.aggregate == "cv":
            times = f"{r.real_time * 100:10.2f} %    {r.cpu_time * 100:10.2f} %    "
        else:
            times = f"{_time(r.real_time)} {unit:<4} {_time(r.cpu_time)} {unit:<4} "
        counter = (f"{r.items_per_second * 100:.2f}%" if r.aggregate == "cv"
                   else f"{_human(r.items_per_second)}/s")
        lines.append(f"{r.name:<{width}} {times}{r.iterations:10d} "
                     f"items_per_second={counter}")
    out.write("\n".join(lines) + "\n")


def _number(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    return f"{value:.16e}"


def _string(text: str) -> str:
    import json
    return json.dumps(text)


def json_report(rows: Sequence[Run], ctx: dict, unit: str) -> str:
    """The report as Google Benchmark's JSON (``context`` and
    ``benchmarks``), in its layout: two-space indentation, one field a
    line, numbers in full precision (``%.16e``)."""
    c = [f'    "{k}": {_string(v) if isinstance(v, str) else _number(v)}'
         for k, v in ctx.items() if k not in ("caches", "load_avg",
                                             "library_version",
                                             "library_build_type",
                                             "json_schema_version")]
    caches = ",\n".join(
        "      {\n" + ",\n".join(
            f'        "{k}": {_string(v) if isinstance(v, str) else _number(v)}'
            for k, v in cache.items()) + "\n      }" for cache in ctx["caches"])
    c.append('    "caches": [\n' + caches + "\n    ]" if caches else '    "caches": [\n    ]')
    c.append('    "load_avg": [' + ",".join(f"{v:g}" for v in ctx["load_avg"]) + "]")
    c.append(f'    "library_version": {_string(ctx["library_version"])}')
    c.append(f'    "library_build_type": {_string(ctx["library_build_type"])}')
    c.append(f'    "json_schema_version": {ctx["json_schema_version"]}')
    entries = []
    for r in rows:
        fields: list[tuple[str, object]] = [
            ("name", r.name), ("family_index", 0), ("per_family_instance_index", 0),
            ("run_name", r.run_name),
            ("run_type", "aggregate" if r.aggregate else "iteration"),
            ("repetitions", r.repetitions)]
        if r.aggregate is None:
            fields.append(("repetition_index", r.repetition_index or 0))
        fields.append(("threads", 1))
        if r.aggregate is not None:
            fields += [("aggregate_name", r.aggregate),
                       ("aggregate_unit", "percentage" if r.aggregate == "cv"
                        else "time")]
        fields += [("iterations", r.iterations), ("real_time", float(r.real_time)),
                   ("cpu_time", float(r.cpu_time)), ("time_unit", unit),
                   ("items_per_second", float(r.items_per_second))]
        entries.append("    {\n" + ",\n".join(
            f'      "{k}": {_string(v) if isinstance(v, str) else _number(v)}'
            for k, v in fields) + "\n    }")
    return ("{\n  \"context\": {\n" + ",\n".join(c) + "\n  },\n  \"benchmarks\": [\n"
            + ",\n".join(entries) + "\n  ]\n}\n")


def _g(value: float) -> str:
    """A number as C++'s default stream output writes it (6 significant
    digits, as ``%g``)."""
    return f"{value:g}"


def csv(rows: Sequence[Run], ctx: dict, unit: str, out=None, err=None) -> None:
    """Google Benchmark's CSV on ``out`` (the context on ``err``)."""
    out = out or sys.stdout
    err = err or sys.stderr
    err.write("\n".join(_context_lines(ctx)) + "\n")
    err.flush()
    lines = ["name,iterations,real_time,cpu_time,time_unit,bytes_per_second,"
             "items_per_second,label,error_occurred,error_message"]
    for r in rows:
        name = r.name.replace('"', '""')
        lines.append(f'"{name}",{r.iterations},{_g(r.real_time)},{_g(r.cpu_time)},'
                     f"{unit},,{_g(r.items_per_second)},,,")
    out.write("\n".join(lines) + "\n")
