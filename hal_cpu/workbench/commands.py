"""What the workbench's command-line flags do in ``hal-cpu run``,
``run-module`` and ``benchmark-module``: ``--sanitize`` and
``--count_instructions[=FILE.json]`` (the flags themselves are defined by
:func:`hal_cpu.cli.options.add_workbench_flags`, so that building a parser
does not import the workbench)."""

from __future__ import annotations

import sys
from typing import Any, Callable, Iterable

from .report import FindingsError, WorkbenchError, write_counts
from .session import Session

#: Exit status when the sanitizer found something.
FOUND = 1
#: Exit status when nothing was found but some accesses were not seen
#: (SVE contiguous loads and stores under qemu 7.2).
UNSEEN = 3


def prepare(args: Any) -> None:
    """Make ``args`` run emulated on qemu (one worker under the sanitizer,
    in this process, without benchmark repetitions).

    Raises:
        WorkbenchError: ``--backend native`` or ``--engine unicorn``.
    """
    if getattr(args, "backend", "auto") == "native":
        raise WorkbenchError("--sanitize and --count_instructions run "
                             "emulated: drop --backend native",
                             field="--backend", value="native")
    if getattr(args, "engine", None) == "unicorn":
        raise WorkbenchError("--sanitize and --count_instructions are not "
                             "supported on the unicorn engine: use --engine "
                             "qemu", field="--engine", value="unicorn")
    if hasattr(args, "backend"):
        args.backend = "emulated"
    args.engine = "qemu"
    if getattr(args, "sanitize", False):
        if getattr(args, "workers", None) not in (None, 1):
            raise WorkbenchError("the sanitizer runs one worker: drop "
                                 "--workers", field="--workers",
                                 value=args.workers)
        if hasattr(args, "workers"):
            args.workers = 1
    if hasattr(args, "isolate"):
        args.isolate = False
    if getattr(args, "command", None) == "benchmark-module":
        # one pass: the warm-up call and one timed call, whose dispatches
        # repeat the warm-up's (finish reports the first half)
        args.benchmark_repetitions, args.benchmark_min_time = 1, None
    else:
        for name in ("benchmark_repetitions", "benchmark_min_time"):
            if getattr(args, name, None):
                setattr(args, name, None)


def session(args: Any, uninitialized: Iterable[int] = (),
            padded: bool = False) -> Session:
    """The session the command line asks for (``uninitialized``: binding
    ordinals given no contents; ``padded``: a program's bindings, which may
    end in their buffer's alignment padding)."""
    return Session(sanitize=bool(getattr(args, "sanitize", False)),
                   count=getattr(args, "count_instructions", None) is not None,
                   uninitialized=set(uninitialized), padded=padded)


def finish(args: Any, wb: Session, out=None) -> int:
    """Print the reports of ``wb`` (to ``out``, default stdout), write the
    counts file; returns the exit status (0, :data:`FOUND` or
    :data:`UNSEEN`).

    Raises:
        WorkbenchError: the counts file cannot be written.
    """
    out = out or sys.stdout
    path = getattr(args, "count_instructions", None)
    if getattr(args, "command", None) == "benchmark-module":
        wb.reports = wb.reports[:len(wb.reports) // 2]
    for report in wb.reports:
        text = report.text()
        if path not in (None, "-"):
            text = "\n".join(line for line in text.splitlines()
                             if not line.startswith("instructions:"))
        if text:
            print(text, file=out)
    if path == "-":
        for report in wb.reports:
            if report.counts is not None:
                print(_count_table(report), file=out)
    elif path is not None:
        write_counts(path, wb.reports)
    if any(r.findings or r.lost for r in wb.reports):
        return FOUND
    if any(r.unseen for r in wb.reports):
        return UNSEEN
    return 0


def run_watched(args: Any, fn: Callable[[], Any]) -> Any:
    """``fn()`` (a program command's call) under the session the command
    line asks for; prints the reports and returns what ``fn`` returned.

    Raises:
        FindingsError: the sanitizer found something, or SVE contiguous
            accesses went unseen.
    """
    with session(args, padded=True) as wb:
        answer = fn()
    status = finish(args, wb)
    if status:
        found = sum(len(r.findings) for r in wb.reports)
        raise FindingsError(
            f"the sanitizer found {found} problem(s) in the program's "
            "dispatches" if status == FOUND else "the sanitizer could not see "
            "every access (SVE contiguous loads/stores)",
            field="--sanitize", value=found)
    return answer


def _count_table(report) -> str:
    """Per-workgroup counts, at most 16 lines."""
    rows = sorted(report.counts.items(), key=lambda kv: kv[0][::-1])
    lines = [f"  workgroup {k}: {v}" for k, v in rows[:16]]
    if len(rows) > 16:
        lines.append(f"  ... {len(rows) - 16} more workgroups")
    return "\n".join(lines)
