"""A workbench session: engines made while it is open load the TCG plugin;
every dispatch of the general path is watched (:data:`WATCH
<hal_cpu.dispatch_policy.WATCH>`) and reported."""

from __future__ import annotations

import threading
from typing import Any, Callable, Iterable

import numpy as np

import elfloader
from elfloader.backend.emulated import tcg_plugin as tp
from elfloader.diagnose import Symbolizer

from .. import dispatch_policy, runtime
from ..dispatch import loop_function
from .report import DispatchReport, Finding, WorkbenchError

_PF_X = 1
_loop_ranges: dict[str, tuple[int, int]] = {}
_lock = threading.Lock()


def _loop_span(arch: str) -> tuple[int, int]:
    """Executable bytes of the runtime support library, relative to its
    workgroup loop's symbol (``(start, end)``)."""
    with _lock:
        span = _loop_ranges.get(arch)
        if span is None:
            image = elfloader.read_image(str(runtime.BUNDLE), arch=arch)
            sym = next(s for s in image.symbols
                       if s.get("name") == runtime.LOOP_SYMBOL)
            value = sym["st_value"] & ~1
            segs = [s for s in image.segments if s.flags & _PF_X]
            span = _loop_ranges[arch] = (min(s.vaddr for s in segs) - value,
                                         max(s.end for s in segs) - value)
        return span


def _modules(exe: Any) -> list:
    """The executable's module and its plugins' modules."""
    plugins = getattr(getattr(exe, "plugins", None), "plugins", ())
    return [exe.module] + [p.module for p in plugins if hasattr(p, "module")]


def _linear_to_xyz(ids: np.ndarray, grid) -> np.ndarray:
    cx, cy = int(grid[0]), int(grid[1])
    ids = ids.astype(np.uint64)
    return np.stack([ids % cx, (ids // cx) % cy, ids // (cx * cy)], axis=-1)


class Session:
    """Watch emulated dispatches: the sanitizer, instruction counts or both.

    Args:
        sanitize: check each dispatch for races between workgroups, order
            dependences, never-written output bytes, reads of uninitialized
            bytes and accesses outside bindings (runs one worker).
        count: count each workgroup's instructions in the kernel's own code
            (executable and plugins, not the runtime's workgroup loop).
        uninitialized: binding ordinals given no contents (their bytes read
            before any workgroup writes them are reported), or a callable
            ``uninitialized(prepared)`` returning them per dispatch.
        on_report: called with each :class:`DispatchReport` as it is made.
        outside_only: with ``sanitize``, check accesses outside bindings
            alone (no shadow of binding bytes: no races, order
            dependences, never-written or uninitialized bytes).
        padded: bindings may end in alignment padding, as a program's
            buffers do (a binding of a whole buffer is the buffer's
            allocation, a multiple of 64 bytes): unwritten bytes in the
            last 64 bytes of such a binding, up to its end, are not
            "never written".

    Attributes:
        reports: every dispatch's :class:`DispatchReport`, in order.

    Executables must be loaded while the session is open (their engine
    loads the plugin then) on the qemu engine; a dispatch on another
    backend raises :class:`WorkbenchError` (the unicorn engine: not
    supported).
    """

    def __init__(self, sanitize: bool = False, count: bool = False,
                 uninitialized: Iterable[int] | Callable[[Any], Iterable[int]]
                 = (), on_report: Callable[[DispatchReport], None] | None = None,
                 outside_only: bool = False, padded: bool = False):
        if not sanitize and not count:
            raise WorkbenchError("a workbench session needs sanitize or count",
                                 field="mode", value=None)
        self.sanitize, self.count = sanitize, count
        self.outside_only = bool(sanitize and outside_only)
        self.padded = padded
        self.mode = (tp.MODE_SANITIZE if sanitize else 0) | (
            tp.MODE_COUNT if count else 0) | (
            tp.MODE_OUTSIDE_ONLY if self.outside_only else 0)
        self.uninitialized = uninitialized
        self.on_report = on_report
        self.reports: list[DispatchReport] = []
        self._request: Any = None
        self._before: Any = None
        self._symbolizers: dict[int, list[Symbolizer]] = {}

    def __enter__(self) -> "Session":
        self._request = tp.request(self.mode)
        self._request.__enter__()
        self._before = dispatch_policy.WATCH
        dispatch_policy.WATCH = self.watch
        return self

    def __exit__(self, *exc) -> None:
        dispatch_policy.WATCH = self._before
        self._request.__exit__(*exc)

    # --- one dispatch ---------------------------------------------------------
    def watch(self, prepared: Any, layout: Any, pointers, lengths):
        """Set the plugin's control words for the run of ``prepared`` laid
        out in ``layout`` on bindings ``pointers``/``lengths``; returns the
        callable that makes the report after the run.

        Raises:
            WorkbenchError: see the class.
        """
        backend = prepared.backend
        path = prepared.path
        results = tp.results_of(backend)
        if results is None:
            if getattr(backend, "kind", "") != "emulated":
                why = ("the workbench watches emulated dispatches only: run "
                       "with the emulated backend on the qemu engine")
            elif getattr(backend, "engine", "") != "qemu":
                why = (f"not supported on the {backend.engine} engine: its "
                       "memory and instruction hooks are not wired to the "
                       "workbench; use the qemu engine")
            else:
                why = ("the executable was loaded before the workbench "
                       "session opened: load it inside the session")
            raise WorkbenchError(why, name=path, field="engine",
                                 value=getattr(backend, "engine", "native"))
        if self.sanitize and layout.workers != 1:
            raise WorkbenchError(
                f"the sanitizer runs one worker, not {layout.workers}: "
                "dispatch with workers=1", name=path, field="workers",
                value=layout.workers)
        wc = tuple(int(v) for v in prepared.wc)
        total = int(prepared.total)
        if self.count and total > tp.COUNTS_CAP:
            raise WorkbenchError(
                f"a grid of {total} workgroups: instruction counts keep at "
                f"most {tp.COUNTS_CAP}", name=path, field="grid", value=wc)
        exe = prepared.executable
        w = results.words
        w[tp.W_ACTIVE] = 0
        # Code: the kernel's own (executable and plugins), and the loop's.
        ranges = []
        for module in _modules(exe):
            for seg in module.image.segments:
                if seg.flags & _PF_X:
                    ranges.append((module.base + seg.vaddr,
                                   module.base + seg.end))
        ranges = ranges[:tp.MAX_KERNEL]
        w[tp.W_N_KERNEL] = len(ranges)
        for i, (lo, hi) in enumerate(ranges):
            w[tp.W_KERNEL + 2 * i], w[tp.W_KERNEL + 2 * i + 1] = lo, hi
        loop = loop_function(backend) & ~1
        lo, hi = _loop_span(backend.arch.name)
        w[tp.W_LOOP_LO], w[tp.W_LOOP_HI] = loop + lo, loop + hi
        states = list(layout.workgroup_states)[:tp.MAX_STATES]
        w[tp.W_N_STATES] = len(states)
        w[tp.W_STATES:tp.W_STATES + len(states)] = states
        w[tp.W_CX], w[tp.W_CY], w[tp.W_CZ] = wc
        results.counts(min(total, tp.COUNTS_CAP))[:] = 0
        w[tp.W_EVENTS_N] = w[tp.W_EVENTS_LOST] = w[tp.W_UNSEEN] = 0
        # Bindings: their bytes, guarded ranges (page-rounded) and shadows.
        shadows: list[tuple[int, int]] = []
        if self.sanitize:
            uninit = self.uninitialized
            uninit = set(uninit(prepared) if callable(uninit) else uninit)
            page = backend.page_size
            at = results.shadow_off
            count = min(len(pointers), tp.MAX_BINDINGS)
            need = sum(int(n) for n in lengths[:count])
            if need > tp.SHADOW_CAP:
                raise WorkbenchError(
                    f"{need} bytes of bindings: the sanitizer shadows at most "
                    f"{tp.SHADOW_CAP}", name=path, field="bindings", value=need)
            for i in range(count):
                base, n = int(pointers[i]), int(lengths[i])
                row = tp.W_BINDINGS + tp.BINDING_WORDS * i
                w[row:row + tp.BINDING_WORDS] = (
                    base, n, base - base % page, -(-(base + n) // page) * page,
                    at, tp.FLAG_UNINITIALIZED if i in uninit else 0)
                if not self.outside_only:
                    results.shadow(at, n)[:] = 0
                    shadows.append((at, n))
                at += 8 * n
            w[tp.W_N_BINDINGS] = count
        else:
            w[tp.W_N_BINDINGS] = 0
        w[tp.W_GENERATION] += 1
        w[tp.W_ACTIVE] = 1

        def finish() -> None:
            w[tp.W_ACTIVE] = 0
            self._report(prepared, backend, results, wc, total, shadows,
                         min(len(pointers), tp.MAX_BINDINGS))

        return finish

    def _report(self, prepared, backend, results, wc, total, shadows,
                bindings: int) -> None:
        profile = backend.profile
        vlen = backend.vlen or (profile.vlens[0] if profile is not None
                                and profile.vlens else None)
        report = DispatchReport(
            export=prepared.label, grid=wc, arch=backend.arch.name,
            profile=profile.name if profile is not None else None,
            vector_length=vlen, sanitized=self.sanitize)
        if self.count:
            n = min(total, tp.COUNTS_CAP)
            counts = results.counts(n)
            xyz = _linear_to_xyz(np.arange(n), wc)
            report.counts = {tuple(int(v) for v in k): int(c)
                             for k, c in zip(xyz.tolist(), counts.tolist())}
        if self.sanitize:
            report.findings = self._findings(prepared, results, wc, shadows,
                                             bindings)
            report.unseen = int(results.words[tp.W_UNSEEN])
            report.lost = int(results.words[tp.W_EVENTS_LOST])
        self.reports.append(report)
        if self.on_report is not None:
            self.on_report(report)

    def _findings(self, prepared, results, wc, shadows,
                  bindings: int) -> list[Finding]:
        exe = prepared.executable
        syms = self._symbolizers.get(id(exe))
        if syms is None:
            entries = {e.label: e.address for e in exe.exports}
            syms = self._symbolizers[id(exe)] = [
                Symbolizer(m.image, m.base, entries if i == 0 else None)
                for i, m in enumerate(_modules(exe))]
        events = results.events().astype(np.int64)
        mask = (1 << 64) - 1
        where: dict[int, tuple] = {}

        def place(pc: int) -> tuple:
            # (symbol, source line) of pc; accesses of one source line
            # (an unrolled loop's copies) make one finding
            got = where.get(pc)
            if got is None:
                holder = next((s for s in syms if s.contains(pc)), None)
                got = where[pc] = ((holder.symbolize(pc), holder.source_line(pc))
                                   if holder else (None, None))
            return got

        merged: dict[tuple, list] = {}
        total = wc[0] * wc[1] * wc[2]
        for kind, binding, offset, size, wg, other, pc, store in events.tolist():
            # (the plugin shares its process with guest code: what does not
            # fit this dispatch is not a finding of it)
            if (kind not in tp.EVENT_KINDS or not 0 <= binding < bindings
                    or not 0 <= wg < total or not 0 <= other <= total
                    or not 0 < size <= 1 << 32 or abs(offset) > 1 << 48):
                continue
            pc &= mask
            symbol, source = place(pc)
            key = (tp.EVENT_KINDS.get(kind, "?"), binding, wg, other, store,
                   source if source else pc)
            entry = merged.setdefault(key, [pc, symbol, source, []])
            if pc < entry[0]:
                entry[:3] = pc, symbol, source
            entry[3].append([offset, offset + size])
        out: list[Finding] = []
        for (kind, binding, wg, other, store, _), (pc, symbol, source,
                                                    spans) in merged.items():
            wgs: list = [_xyz(wg, wc)]
            if kind in ("race", "order"):
                wgs.append(_xyz(other - 1, wc) if other > 0 else None)
            for start, end in _joined(spans):
                out.append(Finding(kind, binding, start, end, list(wgs), pc,
                                   symbol, source, "write" if store else "read"))
        for i, (at, n) in enumerate(shadows):
            written = results.shadow(at, n)[0] != 0
            if not written.any() or written.all():
                continue
            edges = np.flatnonzero(np.diff(np.concatenate(
                ([1], written.astype(np.int8), [1]))))
            for start, end in zip(edges[0::2].tolist(), edges[1::2].tolist()):
                if (self.padded and end == n and n % 64 == 0
                        and start > n - 64):
                    continue    # the allocation's padding
                out.append(Finding("never written", i, start, end))
        order = {k: j for j, k in enumerate(
            ("race", "order", "never written", "uninitialized", "outside"))}
        out.sort(key=lambda f: (order.get(f.kind, 9), f.binding, f.start))
        return out


def _xyz(linear: int, wc) -> tuple[int, int, int]:
    cx, cy = wc[0], wc[1]
    return (linear % cx, (linear // cx) % cy, linear // (cx * cy))


def _joined(spans: list[list[int]]) -> list[tuple[int, int]]:
    """Byte spans sorted and joined where they touch or overlap."""
    out: list[list[int]] = []
    for s, e in sorted(spans):
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return [(s, e) for s, e in out]
