"""Shared timing helpers for the benchmark scripts in ``bench/``.

* :func:`interleave` runs several measurements in rounds: every round runs
  each case once, in an order rotated by one each round, so that slow
  drifts of a shared machine (other processes, frequency changes) spread
  over all cases instead of favouring the one measured first.
* :class:`Stats` keeps the samples of one case and gives min and median.
* :func:`wall` and :func:`run_process` build measurements;
  :func:`table`, :func:`fmt_time` and :func:`ratio` print the results.
* :func:`add_common_args` adds the ``--rounds`` / ``--quick`` options every
  script takes (``bench/run_all.py`` passes ``--quick``).
* :func:`children_cpu` and :func:`pid_cpu` read CPU time (seconds) of
  finished child processes and of a running process: on a shared machine
  the CPU time of an emulator is steadier than its wall time, which
  includes waiting for a core.

A measurement is a callable taking no arguments and returning seconds (or
None when it could not run this round); the helpers never decide what
counts as fast enough.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Callable, Iterable, Mapping, Sequence

Measure = Callable[[], "float | None"]


@dataclass
class Stats:
    """Samples (seconds) of one case."""

    name: str
    samples: list[float] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return bool(self.samples)

    @property
    def min(self) -> float:
        return min(self.samples)

    @property
    def median(self) -> float:
        return statistics.median(self.samples)


def interleave(cases: Mapping[str, Measure], rounds: int, *, warmup: int = 0,
               progress: bool = False) -> dict[str, Stats]:
    """Run every case once per round, rotating the order each round.

    Args:
        cases: name -> measurement (returns seconds, or None to skip).
        rounds: number of rounds (samples per case).
        warmup: rounds run first and discarded.
        progress: print a dot per round on stderr.

    Returns:
        name -> :class:`Stats`, in the order of ``cases``.
    """
    names = list(cases)
    stats = {n: Stats(n) for n in names}
    for r in range(warmup + rounds):
        k = r % len(names) if names else 0
        for name in names[k:] + names[:k]:
            value = cases[name]()
            if r >= warmup and value is not None:
                stats[name].samples.append(float(value))
        if progress:
            print(".", end="", file=sys.stderr, flush=True)
    if progress:
        print(file=sys.stderr)
    return stats


def wall(function: Callable[[], object]) -> Measure:
    """A measurement of one call of ``function`` (``perf_counter``)."""
    def measure() -> float:
        start = time.perf_counter()
        function()
        return time.perf_counter() - start
    return measure


def run_process(argv: Sequence[str], *, env: Mapping[str, str] | None = None,
                check_rc: int | None = 0) -> float:
    """Wall time of one run of ``argv`` (start to exit), output discarded.

    Raises:
        RuntimeError: the exit status differs from ``check_rc`` (unless None).
    """
    start = time.perf_counter()
    proc = subprocess.run(list(argv), stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, env=env)
    elapsed = time.perf_counter() - start
    if check_rc is not None and proc.returncode != check_rc:
        raise RuntimeError(f"{' '.join(map(str, argv))}: exit status "
                           f"{proc.returncode} (expected {check_rc})\n"
                           f"{proc.stderr.decode(errors='replace')}")
    return elapsed


def children_cpu() -> float:
    """User + system CPU seconds of this process's children that have
    exited and been waited for (``getrusage(RUSAGE_CHILDREN)``); the
    difference around a ``subprocess.run`` is that run's CPU time."""
    import resource
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def pid_cpu(pid: int) -> float:
    """CPU seconds process ``pid`` has run so far, all its threads
    (``/proc/PID/task/*/schedstat``, nanoseconds; Linux only).

    Raises:
        OSError: no such process, or no ``/proc``.
    """
    total = 0
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/schedstat") as f:
                total += int(f.read().split()[0])
        except FileNotFoundError:      # the thread ended meanwhile
            pass
    return total * 1e-9


def fmt_time(seconds: float | None) -> str:
    """``812 ns``, ``12.3 us``, ``4.56 ms``, ``1.23 s``; ``-`` for None."""
    if seconds is None:
        return "-"
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if seconds >= scale:
            value = seconds / scale
            break
    else:
        unit, value = "ns", seconds / 1e-9
    decimals = 2 if value < 10 else 1 if value < 100 else 0
    return f"{value:.{decimals}f} {unit}"


def ratio(value: float | None, peer: float | None) -> str:
    """``value / peer`` as ``3.2x`` (``-`` when either is missing)."""
    if value is None or not peer:
        return "-"
    r = value / peer
    return f"{r:.2f}x" if r < 10 else f"{r:.1f}x" if r < 100 else f"{r:.0f}x"


def table(headers: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    """A plain text table, columns left-aligned, first row the headers."""
    body = [[str(c) for c in row] for row in rows]
    widths = [max([len(h)] + [len(r[i]) for r in body]) for i, h in enumerate(headers)]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip()

    out = [line(headers), line(["-" * w for w in widths])]
    out += [line(r) for r in body]
    return "\n".join(out)


def stats_cells(s: Stats | None, peer: Stats | None) -> list[str]:
    """min, median and median ratio to ``peer`` (min ratio in brackets)."""
    if s is None or not s.ok:
        return ["-", "-", "-"]
    if peer is None or not peer.ok:
        return [fmt_time(s.min), fmt_time(s.median), "-"]
    return [fmt_time(s.min), fmt_time(s.median),
            f"{ratio(s.median, peer.median)} (min {ratio(s.min, peer.min)})"]


def machine_line() -> str:
    """One line naming the machine and interpreter, printed above tables."""
    load = ""
    if hasattr(os, "getloadavg"):
        load = f", load {os.getloadavg()[0]:.2f}"
    return (f"machine: {platform.machine()}, {os.cpu_count()} cpus{load}, "
            f"python {platform.python_version()}")


def add_common_args(parser: argparse.ArgumentParser, rounds: int,
                    quick_rounds: int) -> None:
    """``--rounds N`` (default ``rounds``) and ``--quick`` (``quick_rounds``
    rounds and whatever smaller sizes the script picks)."""
    parser.add_argument("--rounds", type=int, default=None,
                        help=f"interleaved rounds (default {rounds}, "
                             f"--quick: {quick_rounds})")
    parser.add_argument("--quick", action="store_true",
                        help="short run with small defaults")
    parser.set_defaults(_rounds_default=(rounds, quick_rounds))


def rounds_of(args: argparse.Namespace) -> int:
    """Rounds asked for on the command line, or the (quick) default."""
    full, quick = args._rounds_default
    return args.rounds if args.rounds is not None else (quick if args.quick else full)
