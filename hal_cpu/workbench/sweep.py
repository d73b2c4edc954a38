"""Instruction counts of one command across the vector lengths of a CPU
profile (SVE ``sve-default-vector-length``, RVV ``vlen``): a table and,
with matplotlib (the ``plot`` extra), a plot.

``hal-cpu profiles --sweep PROFILE [--plot FILE.png] -- COMMAND ...`` runs
``hal-cpu COMMAND ... --cpu PROFILE --vlen V --count_instructions=F`` once
per vector length of the profile and reads the counts back.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import tempfile
from typing import Callable, Sequence

from fatelf import arches

from .report import WorkbenchError

#: Commands a sweep may run (those that take --count_instructions).
COMMANDS = ("run", "run-module", "benchmark-module")


def sweep(profile: str, command: Sequence[str],
          run: Callable[[list[str]], int],
          vlens: Sequence[int] | None = None) -> list[tuple[int, list[dict]]]:
    """Run ``command`` (a ``hal-cpu`` command line, without ``hal-cpu``)
    through ``run`` once per vector length of ``profile``; returns
    ``(vector length in bits, [counts JSON of each dispatch])`` rows in
    increasing vector length.

    Raises:
        WorkbenchError: an unknown or fixed-width profile, a command that
            is not one of :data:`COMMANDS`, or a run that failed.
    """
    found = [p for p in arches.PROFILES if p.name == profile]
    if not found:
        raise WorkbenchError(f"unknown CPU profile {profile!r} (hal-cpu "
                             "profiles lists them)", field="--sweep",
                             value=profile)
    if not found[0].vlens:
        raise WorkbenchError(f"{profile} has no scalable vectors to sweep",
                             field="--sweep", value=profile)
    if not command or command[0] not in COMMANDS:
        raise WorkbenchError("--sweep needs a command after --: one of "
                             + ", ".join(COMMANDS), field="--sweep",
                             value=command[0] if command else None)
    rows = []
    with tempfile.TemporaryDirectory(prefix="hal_cpu_sweep_") as tmp:
        for vlen in sorted(vlens or found[0].vlens):
            out = os.path.join(tmp, f"counts_{vlen}.json")
            argv = [*command, "--cpu", profile, "--vlen", str(vlen),
                    f"--count_instructions={out}"]
            if not any(a == "--arch" or a.startswith("--arch=")
                       for a in command):
                argv += ["--arch", found[0].arch]
            said = io.StringIO()
            with contextlib.redirect_stdout(said):
                status = run(argv)
            if status != 0 or not os.path.exists(out):
                raise WorkbenchError(
                    f"the command failed at vector length {vlen} (exit status "
                    f"{status})", field="--sweep", value=vlen)
            with open(out) as f:
                data = json.load(f)
            rows.append((vlen, data if isinstance(data, list) else [data]))
    return rows


def table(rows: list[tuple[int, list[dict]]]) -> str:
    """Vector length, total instructions and each dispatch's total."""
    width = max((len(r[1]) for r in rows), default=0)
    head = ["vector length (bits)", "instructions"] + [
        f"dispatch {i}" for i in range(width)] * (width > 1)
    body = [[str(v), str(sum(d["total"] for d in ds))]
            + ([str(d["total"]) for d in ds] if width > 1 else [])
            for v, ds in rows]
    widths = [max(len(h), *(len(b[i]) for b in body)) for i, h in enumerate(head)]
    lines = ["  ".join(c.rjust(w) for c, w in zip(line, widths))
             for line in [head] + body]
    return "\n".join(lines)


def plot(rows: list[tuple[int, list[dict]]], path: str, title: str) -> None:
    """Write a PNG of instructions per vector length to ``path``.

    Raises:
        WorkbenchError: matplotlib is not installed (``pip install
            'portable-kernel-runtime[plot]'``) or the file cannot be written.
    """
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise WorkbenchError("a plot needs matplotlib: pip install "
                             "matplotlib (the project's 'plot' extra)",
                             field="--plot", value=path) from None
    xs = [v for v, _ in rows]
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(xs, [sum(d["total"] for d in ds) for _, ds in rows], marker="o")
    ax.set_xscale("log", base=2)
    ax.set_xticks(xs, [str(v) for v in xs])
    ax.set_xlabel("vector length (bits)")
    ax.set_ylabel("instructions (kernel code)")
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    try:
        fig.savefig(path, dpi=100)
    except OSError as exc:
        raise WorkbenchError(f"cannot write the plot: {exc.strerror}",
                             name=path, field="--plot", value=path) from None
    finally:
        plt.close(fig)
