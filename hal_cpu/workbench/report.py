"""What the workbench found in one dispatch: findings of the sanitizer and
instruction counts, as data and as text."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from ..errors import HalCpuError


class WorkbenchError(HalCpuError):
    """The workbench cannot watch a dispatch: native or unicorn backend,
    several workers under the sanitizer, bindings too large for the
    shadow, a grid too large for per-workgroup counts, or a bad option."""


class FindingsError(WorkbenchError):
    """The sanitizer found something in a dispatch (or could not see every
    access of it); the message is the report."""


#: Kinds of findings, in plain words, in the order reports list them.
KINDS = {
    "race": "race: two workgroups write the same bytes",
    "order": "order: a workgroup reads bytes another workgroup writes in "
             "the same dispatch (the result depends on their order)",
    "never written": "never written: no workgroup writes these bytes of an "
                     "output binding",
    "uninitialized": "uninitialized: a workgroup reads bytes nobody wrote "
                     "(the binding was given no contents)",
    "outside": "outside: an access outside every binding (within a "
               "binding's guarded range)",
}


@dataclass
class Finding:
    """One finding of the sanitizer.

    Attributes:
        kind: one of :data:`KINDS` (``"race"``, ``"order"``, ``"never
            written"``, ``"uninitialized"``, ``"outside"``).
        binding: the binding's ordinal.
        start, end: byte range ``[start, end)`` relative to the binding's
            first byte (negative or past its length for ``"outside"``).
        workgroups: ``(x, y, z)`` of the workgroup that made the access
            and, for races and order dependences, the other one (None when
            several did); empty for ``"never written"``.
        pc: the access's instruction address (None for ``"never written"``),
            ``symbol`` (``name+0x1c``) and ``source`` (``file:line`` from the
            DWARF line tables) where known; ``access``: ``"read"`` or
            ``"write"`` where known.
    """

    kind: str
    binding: int
    start: int
    end: int
    workgroups: list = field(default_factory=list)
    pc: int | None = None
    symbol: str | None = None
    source: str | None = None
    access: str | None = None

    def text(self) -> str:
        """One line: kind, binding, bytes, workgroups, pc, symbol, line."""
        out = (f"{self.kind}: binding {self.binding} bytes "
               f"[{self.start}, {self.end})")
        if self.access:
            out += f" ({self.access})"
        if self.workgroups:
            wgs = [("several" if w is None else "(%d, %d, %d)" % tuple(w))
                   for w in self.workgroups]
            out += " by workgroup " + wgs[0]
            if len(wgs) > 1:
                out += (" after workgroup " if self.kind != "race"
                        else " and workgroup ") + wgs[1]
        if self.pc is not None:
            out += f" at pc {self.pc:#x}"
            if self.symbol:
                out += f" {self.symbol}"
            if self.source:
                out += f" ({self.source})"
        return out


@dataclass
class DispatchReport:
    """The workbench's report of one dispatch.

    Attributes:
        export: the export's label; grid: workgroup counts ``(x, y, z)``.
        findings: sanitizer findings (empty: clean, or not sanitized).
        sanitized: whether the sanitizer watched the dispatch.
        unseen: SVE contiguous loads and stores the dispatch ran, whose
            accesses qemu 7.2's plugins do not see (0: every access seen).
        lost: events the plugin dropped (its table was full).
        counts: instructions of the kernel's own code per workgroup (a
            ``{(x, y, z): count}`` dict) or None when not counted;
            ``total`` their sum.
        arch, profile, vector_length: the emulated CPU (vector length in
            bits, or None).
    """

    export: str
    grid: tuple
    arch: str
    profile: str | None
    vector_length: int | None
    sanitized: bool = False
    findings: list = field(default_factory=list)
    unseen: int = 0
    lost: int = 0
    counts: dict | None = None

    @property
    def total(self) -> int | None:
        return None if self.counts is None else sum(self.counts.values())

    @property
    def clean(self) -> bool:
        """No finding and every access seen."""
        return not self.findings and not self.unseen and not self.lost

    def counts_json(self) -> dict:
        """``{"total": N, "workgroups": [[x, y, z, count], ...], "arch",
        "profile", "vector_length"}`` (workgroups x fastest)."""
        counts = self.counts or {}
        return {"total": self.total or 0,
                "workgroups": [[*k, v] for k, v in sorted(
                    counts.items(), key=lambda kv: kv[0][::-1])],
                "arch": self.arch, "profile": self.profile,
                "vector_length": self.vector_length}

    def text(self) -> str:
        """The report as lines of text."""
        lines = []
        head = f"{self.export} grid {tuple(self.grid)}"
        if self.sanitized:
            if self.findings:
                lines.append(f"sanitizer: {len(self.findings)} finding(s) in "
                             f"{head}")
                lines += ["  " + f.text() for f in self.findings]
            elif not self.unseen:
                lines.append(f"sanitizer: nothing found in {head}")
            if self.unseen:
                lines.append(
                    f"sanitizer: {self.unseen} SVE contiguous load/store "
                    f"instruction(s) ran in {head} whose memory accesses "
                    "qemu 7.2's plugins cannot see: those accesses were not "
                    "checked (the report is not a clean bill)")
            if self.lost:
                lines.append(f"sanitizer: {self.lost} more event(s) were not "
                             "recorded (table full)")
        if self.counts is not None:
            vl = (f", vector length {self.vector_length} bits"
                  if self.vector_length else "")
            lines.append(f"instructions: {self.total} in {head} "
                         f"({self.arch}, {self.profile or 'default CPU'}{vl}; "
                         f"{len(self.counts)} workgroups)")
        return "\n".join(lines)


def write_counts(path: str, reports: list) -> None:
    """Write the counts of ``reports`` as JSON to ``path``: one report's
    :meth:`DispatchReport.counts_json`, or a list of them for several.

    Raises:
        WorkbenchError: the file cannot be written.
    """
    data = [r.counts_json() for r in reports if r.counts is not None]
    try:
        with open(path, "w") as f:
            json.dump(data[0] if len(data) == 1 else data, f, indent=1)
            f.write("\n")
    except OSError as exc:
        raise WorkbenchError(f"cannot write instruction counts: "
                             f"{exc.strerror}", name=path,
                             field="count_instructions", value=path) from None
