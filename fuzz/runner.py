"""Running cases in child processes and classifying what happened.

Each case runs in a process of its own, forked from this one (the modules
are already imported, so a case costs a fork, not an interpreter start).
At most ``jobs`` children run at once. A child limits its address space
(``RLIMIT_AS``), reports its stages through a pipe (see :mod:`fuzz.child`)
and is killed after a wall-clock limit. The parent reads the pipe, reaps the
child with ``wait4`` (exit status and resource usage: peak RSS and CPU time)
and classifies the case:

* ``accepted``: the file loaded (and ran) fine;
* ``typed``: a :class:`fatelf.PortableKernelError` subclass (class and field
  recorded);
* ``escape``: any other Python exception (type, message, traceback);
* ``crash``: the child died of a signal (or exited without a result); the
  stage, whether a guest call was running (and was not calling back into
  the host), the guest address and the Python frame of the crash are
  recorded. A native crash is *in guest code* (``acceptable``) when it
  happened inside a call of the file's code in one of
  :data:`fuzz.child.GUEST_STAGES`: code the verifier cannot judge, running
  on the real CPU (see also :func:`fuzz.cli.triage`);
* ``hang``: killed at the wall-clock limit (the stacks dumped shortly
  before are recorded); in guest code under the same rule as crashes;
* ``blowup``: MemoryError, or peak RSS or CPU time above the limits;
* ``killed`` (target ``code`` with ``kill_host_after``): the child
  killed itself mid-run on purpose, as a crashing program would;
* ``breach`` (target ``code``): the case reached the host: a canary of
  :class:`fuzz.code.Canary` changed (a file made, changed or removed, a
  connection accepted, the ``sleep`` process signalled or traced, a
  process left behind). The outcome the child reported is kept as
  ``was``.
"""

from __future__ import annotations

import json
import os
import re
import select
import signal
import time
from dataclasses import dataclass, field

from .child import GUEST_STAGES, child_main

_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+) in (?P<func>\S+)')


@dataclass
class Running:
    pid: int
    fd: int
    case: dict
    start: float
    deadline: float
    buf: bytearray = field(default_factory=bytearray)
    killed: bool = False
    eof: bool = False


@dataclass
class Trace:
    """What a child said before it ended."""
    stage: str = "start"
    guest_depth: int = 0
    callback_depth: int = 0
    guest_calls: int = 0
    guest_address: str | None = None
    modules: list = field(default_factory=list)
    agents: list = field(default_factory=list)
    self_killed: str | None = None
    notes: list = field(default_factory=list)
    dump: list = field(default_factory=list)
    result: dict | None = None
    harness_error: str | None = None


def parse_events(raw: bytes) -> Trace:
    t = Trace()
    for line in raw.decode("utf-8", "replace").splitlines():
        kind, _, rest = line.partition(" ")
        if kind == "S":
            t.stage = rest
        elif kind == "G+":
            t.guest_depth += 1
            t.guest_calls += 1
            t.guest_address = rest
        elif kind == "G-":
            t.guest_depth = max(0, t.guest_depth - 1)
        elif kind == "C+":
            t.callback_depth += 1
        elif kind == "C-":
            t.callback_depth = max(0, t.callback_depth - 1)
        elif kind == "M":
            lo, hi, name = (rest.split(" ", 2) + ["", ""])[:3]
            t.modules.append((lo, hi, name))
        elif kind == "N":
            t.notes.append(rest)
        elif kind == "K":
            t.self_killed = rest or "?"
        elif kind == "P":
            try:
                t.agents.append(int(rest))
            except ValueError:
                t.dump.append(line)
        elif kind == "R":
            try:
                t.result = json.loads(rest)
            except ValueError:
                t.dump.append(line)
        elif kind == "X":
            t.harness_error = rest.replace("\\n", "\n")
        else:
            t.dump.append(line)
    return t


def _relpath(path: str) -> str:
    cwd = os.getcwd()
    return os.path.relpath(path, cwd) if path.startswith(cwd) else path


def dump_frames(dump: list[str], limit: int = 8) -> list[str]:
    """Frames of the first thread in a faulthandler dump, innermost first."""
    frames, started = [], False
    for line in dump:
        if line.startswith(("Current thread", "Thread 0x")):
            if started and frames:
                break
            started = True
            continue
        m = _FRAME.match(line)
        if m and started:
            frames.append(f"{_relpath(m['file'])}:{m['line']} in {m['func']}")
    return frames[:limit]


def _module_of(address: str | None, modules) -> str | None:
    if not address:
        return None
    a = int(address, 16)
    for lo, hi, name in reversed(modules):
        if int(lo, 16) <= a < int(hi, 16):
            return f"{name}+{a - int(lo, 16):#x}"
    return None


def classify(case: dict, status: int, rusage, trace: Trace, killed: bool,
             opts: dict, elapsed: float) -> dict:
    """The outcome record of a finished child."""
    maxrss_kb = rusage.ru_maxrss
    cpu = rusage.ru_utime + rusage.ru_stime
    top = trace.stage.split("/", 1)[0]
    in_guest = trace.guest_depth > 0 and trace.callback_depth == 0
    # Native code of the file, running on this CPU, where no verifier can
    # judge it: a crash or endless loop there is the file's own doing.
    in_native_guest = bool(case["backend"] == "native" and in_guest and top in GUEST_STAGES)
    base = {"id": case["id"], "target": case["target"], "backend": case["backend"],
            "arch": case["arch"], "seed": case["seed"], "mutations": case["mutations"],
            "maxrss_mb": round(maxrss_kb / 1024, 1), "cpu_s": round(cpu, 3),
            "wall_s": round(elapsed, 3)}
    for k in ("engine", "kill_host_after"):
        if case.get(k):
            base[k] = case[k]
    if trace.notes:
        base["notes"] = trace.notes
    delay = case.get("kill_host_after")
    if (delay and not killed and trace.result is None and os.WIFSIGNALED(status)
            and os.WTERMSIG(status) == signal.SIGKILL
            and (trace.self_killed or elapsed >= delay)):
        # it killed itself on purpose mid-run (what matters is what its
        # guest code left behind: see the canaries)
        rec = {**base, "outcome": "killed", "stage": trace.self_killed or trace.stage,
               "guest_calls": trace.guest_calls}
        if not trace.self_killed:
            rec["note"] = "SIGKILL at its kill time without its own word for it"
        return rec
    if (killed and trace.result is None) or os.WIFSIGNALED(status) or trace.result is None:
        hang = killed and trace.result is None
        sig = os.WTERMSIG(status) if os.WIFSIGNALED(status) and not hang else None
        rec = {**base, "outcome": "hang" if hang else "crash", "stage": trace.stage,
               "in_guest": in_guest, "in_callback": trace.callback_depth > 0,
               "guest_calls": trace.guest_calls,
               "guest_address": trace.guest_address if trace.guest_depth else None,
               "guest_location": _module_of(trace.guest_address, trace.modules)
               if trace.guest_depth else None,
               "frames": dump_frames(trace.dump), "acceptable": in_native_guest}
        if in_native_guest:
            rec["attribution"] = "in a native call of the file's code"
        if not hang:
            rec["signal"] = signal.Signals(sig).name if sig else None
            rec["exit_status"] = os.WEXITSTATUS(status) if os.WIFEXITED(status) else None
        if trace.harness_error:
            rec["harness_error"] = trace.harness_error
        return rec
    rec = {**base, **trace.result}
    rec.pop("maxrss_kb", None)
    if rec["outcome"] in ("accepted", "typed"):
        reasons = []
        if maxrss_kb > opts["rss_limit_mb"] * 1024:
            reasons.append(f"peak RSS {maxrss_kb / 1024:.0f} MiB > "
                           f"{opts['rss_limit_mb']} MiB")
        if cpu > opts["cpu_limit"]:
            reasons.append(f"CPU time {cpu:.1f} s > {opts['cpu_limit']} s")
        if reasons:
            rec["was"] = rec["outcome"]
            rec["outcome"] = "blowup"
            rec["reason"] = "; ".join(reasons)
    return rec


def _spawn(case: dict, data: bytes, opts: dict, others: list[int]) -> Running:
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        try:
            os.close(r)
            for fd in others:
                try:
                    os.close(fd)
                except OSError:
                    pass
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            child_main(case, data, w, opts)
        finally:
            os._exit(71)
    os.close(w)
    now = time.monotonic()
    return Running(pid, r, case, now, now + opts["timeout"])


def _agents(raw: bytes) -> list[int]:
    return [int(line[2:]) for line in raw.split(b"\n")
            if line.startswith(b"P ") and line[2:].isdigit()]


def check_host(hooks, run: Running, rec: dict, trace: Trace,
               running: dict[int, Running]) -> None:
    """Let ``hooks.check`` look at the host after ``run`` ended; a change
    makes the case a ``breach``."""
    others = {r.case["id"]: r.pid for r in running.values()}
    all_agents = set(trace.agents)
    for r in running.values():
        all_agents.update(_agents(bytes(r.buf)))
    found = hooks.check(run.case, trace.agents, others, all_agents)
    if trace.agents:
        rec["agents"] = len(trace.agents)
    if found:
        rec["was"] = rec["outcome"]
        rec["outcome"] = "breach"
        rec["breaches"] = found


def run_cases(items, jobs: int, on_result, hooks=None) -> None:
    """Run ``items`` (an iterator of ``(case, data)``; each case carries its
    child options under ``_opts``) with at most ``jobs`` children at once;
    ``on_result(record, data)`` gets each outcome. ``hooks`` (optional,
    for cases with a ``canary``): ``prepare(case)`` before a case starts,
    ``check(case, agents, running, all_agents)`` after it ended, returning
    what it changed on the host (see :class:`fuzz.code.Canary`)."""
    items = iter(items)
    running: dict[int, Running] = {}
    exhausted = False
    try:
        while running or not exhausted:
            while not exhausted and len(running) < jobs:
                try:
                    case, data = next(items)
                except StopIteration:
                    exhausted = True
                    break
                if hooks is not None and case.get("canary"):
                    hooks.prepare(case)
                run = _spawn(case, data, case["_opts"], [r.fd for r in running.values()])
                run.data = data
                running[run.fd] = run
            if not running:
                break
            now = time.monotonic()
            wait = max(0.0, min(r.deadline for r in running.values()) - now)
            ready, _, _ = select.select(list(running), [], [], min(wait, 1.0))
            for fd in ready:
                run = running[fd]
                chunk = os.read(fd, 65536)
                if chunk:
                    run.buf += chunk
                else:
                    run.eof = True
            now = time.monotonic()
            for run in list(running.values()):
                if not run.eof and not run.killed and now >= run.deadline:
                    run.killed = True
                    try:
                        os.kill(run.pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                if run.eof:
                    _, status, rusage = os.wait4(run.pid, 0)
                    os.close(run.fd)
                    del running[run.fd]
                    trace = parse_events(bytes(run.buf))
                    rec = classify(run.case, status, rusage, trace, run.killed,
                                   run.case["_opts"], now - run.start)
                    if hooks is not None and run.case.get("canary"):
                        check_host(hooks, run, rec, trace, running)
                    on_result(rec, run.data)
    finally:
        for run in running.values():
            try:
                os.kill(run.pid, signal.SIGKILL)
                os.waitpid(run.pid, 0)
            except (ProcessLookupError, ChildProcessError):
                pass
            os.close(run.fd)


def run_one(case: dict, data: bytes, hooks=None) -> dict:
    """Run one case (with its ``_opts``) in a child; its outcome record."""
    out = []
    run_cases(iter([(case, data)]), 1, lambda rec, _: out.append(rec), hooks)
    return out[0]
