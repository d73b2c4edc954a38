"""``hal-cpu inspect`` and ``hal-cpu run``: one executable library or
plugin file (ELF, FatELF, or an executable embedded in a ``.vmfb``).

``inspect`` shows what the file exports and imports, its query run
emulated without its initializers (a system library plugin is read, not
loaded, unless asked); ``run`` dispatches one export over a workgroup grid,
natively in a child process or emulated, and can repeat it to time it.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

import elfloader
from fatelf import arches
from fatelf.errors import PortableKernelError
from fatelf.text import for_terminal, one_line, printable

from ..buffers import format_buffer_view, parse_binding
from ..errors import HalCpuError
from .options import (
    INSPECT_TIMEOUT,
    KILL_GRACE,
    MAX_SECONDS,
    add_workbench_flags,
    emulation_options,
    workbench_wanted,
)
from .options import Progress as _Progress
from .options import add_cpu_flags as _add_cpu_flags
from .options import add_native_flag as _add_native_flag
from .options import arch as _arch
from .options import confinement as _confinement
from .options import load_limit as _load_limit
from .options import positive as _positive
from .options import runs_natively as _runs_natively
from .options import seconds as _seconds

__all__ = ["COMMANDS", "MAX_REPETITIONS", "backend_description", "cmd_inspect",
           "cmd_run", "describe"]


def _triple(text: str) -> tuple[int, int, int]:
    parts = text.replace(" ", "").split(",")
    if len(parts) != 3 or not all(p.isdigit() for p in parts):
        raise argparse.ArgumentTypeError(f"expected three counts X,Y,Z, got {text!r}")
    vals = (int(parts[0]), int(parts[1]), int(parts[2]))
    for axis, v, limit in zip("xyz", vals, (1 << 32, 1 << 32, 1 << 16)):
        if v >= limit:
            raise argparse.ArgumentTypeError(f"{axis} = {v} is not below {limit}")
    return vals


def _u32(text: str) -> int:
    try:
        v = int(text, 0)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if not 0 <= v < 1 << 32:
        raise argparse.ArgumentTypeError(f"{text} does not fit uint32")
    return v


#: Most repetitions --benchmark_min_time runs (the time of each is kept:
#: 8 bytes apiece).
MAX_REPETITIONS = 10_000_000


def _min_time(text: str) -> tuple[float, int]:
    """``--benchmark_min_time``: ``0.5`` or ``0.5s`` (seconds) or ``100x``
    (repetitions), as (seconds, repetitions), the other one 0."""
    if text.endswith("x"):
        count = text[:-1]
        if not count.isdigit() or not 1 <= int(count) <= MAX_REPETITIONS:
            raise argparse.ArgumentTypeError(
                f"{text!r} is not a repetition count Nx with 1 <= N <= "
                f"{MAX_REPETITIONS}")
        return 0.0, int(count)
    try:
        v = float(text[:-1] if text.endswith("s") else text)
    except ValueError:
        v = -1
    if not 0 < v <= MAX_SECONDS:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a time in seconds in (0, {MAX_SECONDS:g}] "
            "(0.5 or 0.5s) nor a repetition count (100x)")
    return v, 0


def _output(text: str) -> tuple[int, str]:
    index, sep, path = text.partition("=")
    if not sep or not index.isdigit() or not path.startswith("@"):
        raise argparse.ArgumentTypeError(
            f"expected BINDING_INDEX=@file.npy, got {text!r}")
    return int(index), path[1:]



def _add_target_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--backend", choices=elfloader.backend.KINDS, default="auto",
                   help="native (host architecture only), emulated, or auto "
                        "(native when the file matches the host; default)")
    p.add_argument("--arch", type=_arch, metavar="ARCH",
                   help="architecture the file must be for / to select from "
                        "a FatELF bundle: " + ", ".join(arches.RUNTIME_ARCHES)
                        + " or an alias (amd64, i686, arm64, armhf, rv64...)")
    p.add_argument("--executable_plugin", action="append", default=[],
                   metavar="SPEC", help="plugin resolving imports: path.sos, "
                   "embedded:path, a system library path, with optional "
                   "?key=value&... load parameters (repeatable)")
    _add_cpu_flags(p)



def _inspect_parser(sub) -> None:
    p = sub.add_parser(
        "inspect", help="show an executable library or plugin without "
        "running its code on this CPU",
        description="Show an executable library, a plugin or the executables "
        "embedded in a compiled module (.vmfb). The query functions run "
        "emulated, without the file's initializers: nothing of the file "
        "runs on this CPU. A system library plugin (linked against the "
        "platform's libraries, which only the platform's loader can run) is "
        "read, not loaded: its architecture, DT_NEEDED, DT_SONAME and "
        "exports are shown and none of its code runs, unless "
        "--run_sandboxed or --run_native says otherwise; the same holds "
        "for system libraries given with --executable_plugin.")
    p.add_argument("file", help="executable or plugin: ELF (.so), FatELF "
                   "(.sos), or a compiled IREE module (.vmfb)")
    p.add_argument("--resolve", action="append", default=[], metavar="NAME",
                   help="for a plugin: import names to resolve (repeatable)")
    p.add_argument("--timeout", type=_seconds, default=None, metavar="S",
                   help=f"limit on each emulated call (and on a system "
                   f"library's child process), default {INSPECT_TIMEOUT:g} s")
    how = p.add_mutually_exclusive_group()
    how.add_argument("--run_sandboxed", action="store_true",
                     help="also load system libraries and run their query "
                     "(and --resolve) natively in a child process confined "
                     "as an emulator's agent is: a system-call filter "
                     "refuses making, changing or removing files, starting "
                     "programs, sockets, signals to other processes and "
                     "ptrace; Landlock lets it read only the platform's "
                     "libraries, Python's and this runtime's modules and "
                     "the library's directory")
    how.add_argument("--run_native", action="store_true",
                     help="also load system libraries and run their query "
                     "(and --resolve) natively in a child process with "
                     "your rights, unconfined: their constructors and "
                     "query can do anything you can")
    _add_target_flags(p)


def _run_parser(sub) -> None:
    p = sub.add_parser(
        "run", help="dispatch one export over a workgroup grid",
        description="Dispatch one export over a workgroup grid. A native "
        "dispatch runs in a child process, confined unless --run_native: "
        "the kernel and its plugins cannot create or write files, open "
        "sockets or start processes (such an attempt fails with EPERM). If "
        "the kernel crashes, one line names the signal and the export, "
        "then the same dispatch runs emulated and its fault report (pc, "
        "symbol, instruction, data address) follows.",
        epilog="Exit status: 0 success, 1 error (one line on stderr) or a "
        "kernel that crashed natively, 2 usage error, 130 interrupted.")
    p.add_argument("file", help="executable library: ELF (.so), FatELF "
                   "(.sos), or a compiled IREE module (.vmfb; see --executable)")
    p.add_argument("--executable", metavar="NAME",
                   help="for a .vmfb: the embedded executable to run (as "
                   "hal-cpu inspect lists them; needed when it embeds several)")
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--function", help="export name")
    which.add_argument("--entry_point", type=int, help="export ordinal")
    p.add_argument("--workgroup_count", type=_triple, default=(1, 1, 1),
                   metavar="X,Y,Z", help="workgroups along x, y, z (default "
                   "1,1,1); `hal-cpu plan` or the host program gives the "
                   "count a dispatch needs")
    p.add_argument("--binding", action="append", default=[], metavar="SPEC",
                   help="4xf32=1,2,3,4 | 4xf32=0 | 2x8xi32 | @file.npy | "
                        "4xf32=@raw.bin (repeatable, in binding order)")
    p.add_argument("--constant", action="append", default=[], type=_u32,
                   metavar="U32", help="push constant (repeatable)")
    p.add_argument("--output", action="append", default=[], type=_output,
                   metavar="I=@file.npy", help="save binding I after the "
                   "dispatch (repeatable)")
    p.add_argument("--print_bindings", default="all", metavar="all|none|I,J",
                   help="which bindings to print after the dispatch (default all)")
    p.add_argument("--workers", type=_positive, default=None,
                   help="host threads running workgroups (native backend; "
                        "default: the CPUs this process may use)")
    p.add_argument("--timeout", type=_seconds, default=None, metavar="S",
                   help="bound the whole command to S seconds: loading (each "
                   "guest call of the executable's and plugins' initializers, "
                   "queries and loads), the dispatch and its repetitions; an "
                   "isolated native run is killed past it. Default: no limit "
                   "on the dispatch, 60 s on each guest call while loading "
                   "(emulated)")
    p.add_argument("--benchmark_repetitions", type=_positive, default=None,
                   metavar="N", help="after a first (untimed) dispatch, "
                   "dispatch N times and print the time per dispatch (min, "
                   "median and mean)")
    p.add_argument("--benchmark_min_time", type=_min_time, default=None,
                   metavar="S|Ss|Nx", help="as --benchmark_repetitions, "
                   "repeating until S seconds have passed (0.5 or 0.5s), or N "
                   "times (100x); with --benchmark_repetitions both must be "
                   f"met (at most {MAX_REPETITIONS:.0e} repetitions)")
    p.add_argument("--no_progress", action="store_true",
                   help="no progress bar for long dispatches")
    p.add_argument("--verbose", action="store_true",
                   help="say which backend, architecture and workers ran")
    p.add_argument("--isolate", action="store_true", default=None,
                   help="run the dispatch in a child process, so that a "
                   "kernel crashing natively is reported instead of ending "
                   "hal-cpu (default: on when the dispatch runs natively)")
    p.add_argument("--no_isolate", dest="isolate", action="store_false",
                   help="run the dispatch in this process, even natively: "
                   "then native code runs with your rights, unconfined, as "
                   "with --run_native")
    _add_native_flag(p)
    p.add_argument("--no_diagnose", dest="diagnose", action="store_false",
                   help="after a native crash, do not run the dispatch again "
                   "emulated to show the faulting instruction")
    add_workbench_flags(p)
    _add_target_flags(p)


def _plugins(args, arch_hint, backend=None):
    if not args.executable_plugin:
        return None
    from ..plugins import PluginManager
    return PluginManager.from_specs(args.executable_plugin, arch=arch_hint,
                                    backend=backend or args.backend,
                                    timeout=_load_limit(args),
                                    **emulation_options(args))


def cmd_inspect(args) -> int:
    from .. import abi
    from ..plugins import inspect_plugin
    from ..programs.vm import vmfb
    limit = args.timeout or INSPECT_TIMEOUT
    if vmfb.is_module_file(args.file):
        print(_describe_module(args, limit))
        return 0
    try:
        image = elfloader.read_image(args.file, arch=args.arch)
    except elfloader.UnsupportedElfError as exc:
        if exc.field != "DT_NEEDED":
            raise
        # Linked against system libraries: only a system plugin can be
        # that. Only the platform's loader can run it, natively: read
        # unless asked, and then loaded in a child process.
        print(_describe_system_library(args, limit))
        return 0
    if abi.PLUGIN_QUERY in image.exports:
        print(inspect_plugin(args.file, arch=image.arch, backend="emulated",
                             resolve=args.resolve, timeout=limit))
        return 0
    print(_describe_executable(args, image, limit))
    return 0


def _system_run(args) -> str:
    """How ``inspect`` runs a system library's code: "" (not at all),
    "sandboxed" or "native"."""
    return ("native" if getattr(args, "run_native", False) else
            "sandboxed" if getattr(args, "run_sandboxed", False) else "")


def _describe_system_library(args, limit: float) -> str:
    """What a system library's file says; with --run_sandboxed or
    --run_native, then what its query answers, run in a child process."""
    from ..plugins import describe_system_library, inspect_plugin
    text = describe_system_library(args.file)
    how = _system_run(args)
    if not how:
        return (text + "\nquery:        not run: nothing of the file ran "
                "(--run_sandboxed runs it in a confined child process, "
                "--run_native unconfined)")
    answer = _isolated(lambda note: inspect_plugin(
        args.file, resolve=args.resolve, system=True), args.file, limit,
        [args.file] if how == "sandboxed" else None)
    said = ("ran the plugin's query natively in a confined child process "
            "(--run_sandboxed)" if how == "sandboxed" else
            "ran the plugin's query natively (--run_native)")
    lines = [line for line in answer.splitlines()
             if not line.startswith("file:")]
    return "\n".join([text, f"query:        {said}"]
                     + ["  " + line for line in lines])


def _describe_executable(args, image, limit: float) -> str:
    """``describe`` of an executable: the query runs emulated, without the
    file's initializers and under ``limit`` seconds per call, so inspecting
    never runs the file's code on this CPU."""
    from ..library import Executable
    with Executable(image, backend="emulated", initialize=False,
                    bind_imports=False, timeout=limit) as exe:
        providers = _providers(args, image.arch, exe.imports, limit)
        return describe(exe, providers)


def _describe_module(args, limit: float) -> str:
    """The executables embedded in a ``.vmfb``, each described."""
    from ..programs.vm import vmfb, vmvx
    found = vmfb.executables(args.file)
    lines = [f"file:         {args.file}",
             f"module:       compiled IREE module (.vmfb), {len(found)} "
             f"embedded executable{'s' if len(found) != 1 else ''} (run one "
             "with hal-cpu run --executable=NAME)"]
    for entry in found:
        data, label = vmfb.read_executable(args.file, entry.name)
        lines.append(f"executable:   {printable(entry.name, 300)} ({entry.size} bytes)")
        if vmvx.is_vmvx(data):          # VM bytecode, not an ELF
            lines += ["  " + line for line in vmvx.describe(data, label).splitlines()]
            continue
        image = elfloader.read_image(data, arch=args.arch, name=label)
        lines += ["  " + line for line in
                  _describe_executable(args, image, limit).splitlines()]
    return "\n".join(lines)


def _isolated(fn, name: str, limit: float, sandbox_for=None):
    """``fn(note)`` in a child process (where fork exists), bounded by
    ``limit`` seconds; a crash becomes :class:`NativeCrashError`. With
    ``sandbox_for`` (the system libraries it loads), the child is confined
    first (:func:`hal_cpu.plugins.sandbox_for`)."""
    confine = None
    if sandbox_for is not None:
        from ..plugins import sandbox_for as confinement
        confine = confinement(sandbox_for)
    elif not hasattr(os, "fork"):
        return fn(lambda _text: None)
    from ..isolate import run_in_child
    return run_in_child(fn, name=name, what="the library's code",
                        timeout=limit + KILL_GRACE, confine=confine)


def _providers(args, arch, names,
               limit: float = 0) -> dict[str, str | None] | None:
    """Import name -> the plugin that resolves it ('' when none does), or
    None when no plugins were given. Embedded plugins run emulated; when a
    system library is among them, everything runs in a child process,
    confined with --run_sandboxed, unconfined with --run_native, and not
    at all otherwise (then each name maps to None)."""
    if not args.executable_plugin:
        return None
    from ..plugins import PluginManager, PluginSpec

    def resolve(_note=None, backend="emulated"):
        with PluginManager.from_specs(args.executable_plugin, arch=arch,
                                      backend=backend, timeout=limit) as manager:
            return {name: getattr(manager.provider(name), "name", "")
                    for name in names}

    specs = [PluginSpec(s) for s in args.executable_plugin]
    if all(spec.kind == "embedded" for spec in specs):
        return resolve()
    how = _system_run(args)
    if not how:
        return {name: None for name in names}
    return _isolated(lambda note: resolve(note, "native"), args.file, limit,
                     [spec.path for spec in specs if spec.kind == "system"]
                     if how == "sandboxed" else None)


def describe(exe, providers: dict[str, str | None] | None = None) -> str:
    """Human-readable summary of an :class:`Executable`; ``providers`` maps
    import names to the plugin resolving them."""
    lines = [
        f"file:         {one_line(exe.path)}",
        f"architecture: {exe.arch.name} ({exe.arch.elf_class}-bit, "
        f"{exe.backend.kind})",
        f"library:      {printable(exe.name, 200)} (version {exe.version:#x}, features "
        f"{exe.features:#x}, sanitizer {exe.sanitizer})",
        f"constants:    {exe.constant_count}",
        f"imports:      {len(exe.imports)}",
    ]
    for i, n in enumerate(exe.imports):
        note = "  (optional)" if n.startswith("?") else ""
        if providers is not None:
            who = providers.get(n, "")
            note += (f"  resolved by {printable(who, 200)}" if who else "  UNRESOLVED"
                     if who is not None else "  not resolved: a system "
                     "library plugin runs only with --run_sandboxed or "
                     "--run_native")
        lines.append(f"  [{i}] {printable(n, 200)}{note}")
    lines.append(f"exports:      {len(exe.exports)}")
    for e in exe.exports:
        lines.append(f"  [{e.ordinal}] {e.label}"
                     + (f"  tag={printable(e.tag, 200)}" if e.tag else ""))
        lines.append(f"      workgroup_size={'x'.join(map(str, e.workgroup_size))} "
                     f"constants={e.constant_count} bindings={e.binding_count} "
                     f"local_memory_pages={e.local_memory_pages} "
                     f"flags={e.flags:#x} parameters={e.parameter_count}")
    return "\n".join(lines)

def _print_selection(text: str, count: int) -> list[int]:
    if text == "all":
        return list(range(count))
    if text == "none":
        return []
    try:
        picked = [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        picked = [-1]
    bad = [i for i in picked if not 0 <= i < count]
    if bad or not picked:
        raise HalCpuError(f"{text!r} is not all, none or binding indices below "
                          f"{count}", field="--print_bindings", value=text)
    return picked


def backend_description(backend) -> str:
    """``native`` or ``emulated, qemu (qemu-aarch64 -cpu max,...)``."""
    describe = getattr(backend, "describe", None)
    return f"{backend.kind}, {describe()}" if describe else backend.kind


def _dispatch(args, image, export, arrays, note=None):
    """Load ``image`` with the plugins, run the dispatch (and the benchmark
    repetitions); returns (times, where, export label, path), ``times`` the
    seconds of each repetition (an array of float64)."""
    from ..errors import DispatchTimeoutError
    from ..library import Executable
    note = note or (lambda _text: None)
    deadline = time.monotonic() + args.timeout if args.timeout else None

    def left() -> float | None:
        # What remains of --timeout, which bounds the whole command.
        if deadline is None:
            return None
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise DispatchTimeoutError(
                f"the time limit of {args.timeout:g} s passed", name=args.file,
                field="timeout", value=args.timeout)
        return remaining

    note("while loading the executable and its plugins")
    plugins = _plugins(args, image.arch)
    with Executable(image, backend=args.backend, plugins=plugins,
                    timeout=_load_limit(args),
                    **({} if plugins else emulation_options(args))) as exe:
        label = exe.export(export).label
        note(f"in export {label}")
        from ..interrupt import run_interruptible
        stopped: list[bool] = []

        def stop():
            # Ctrl-C stops the emulated CPUs at once (not after the call),
            # and the repetitions after the one running.
            stopped.append(True)
            exe.backend.stop_workers(256)
        progress = _Progress(not args.no_progress)
        try:
            run_interruptible(
                lambda: exe.dispatch(export, args.workgroup_count, arrays,
                                     args.constant, workers=args.workers,
                                     timeout=left(), progress=progress),
                stop)
        finally:
            progress.close()
        seconds, count = getattr(args, "benchmark_min_time", None) or (0.0, 0)
        count = max(count, args.benchmark_repetitions or 0)
        times = np.empty(0)
        if count or seconds:
            left()
            times = run_interruptible(
                lambda: _repeat(exe, export, args, arrays, count, seconds,
                                deadline, stopped), stop)
        where = (f"{exe.arch.name}, {backend_description(exe.backend)}, "
                 f"workers={exe.last_workers}")
        return times, where, label, exe.path


def _repeat(exe, export, args, arrays, count: int, seconds: float,
            deadline: float | None, stopped: list) -> np.ndarray:
    """Dispatch at least ``count`` times and for at least ``seconds`` (at
    most ``max(count, MAX_REPETITIONS)`` times when ``seconds`` is given),
    each call
    as the Python API makes it; returns the seconds of each repetition.

    Between repetitions the loop checks for ``stopped`` (Ctrl-C) and the
    ``deadline`` (``time.monotonic()``) of --timeout, which also bounds each
    dispatch; a progress bar, if any, counts the whole run.

    Raises:
        DispatchTimeoutError: the deadline passed.
        KeyboardInterrupt: ``stopped`` was set.
    """
    from array import array

    from ..errors import DispatchTimeoutError
    clock = time.perf_counter
    dispatch, wc, consts = exe.dispatch, args.workgroup_count, args.constant
    workers = args.workers
    limit = max(count, MAX_REPETITIONS) if seconds else max(count, 1)
    unit = "dispatch" if not seconds else "ms"
    progress = _Progress(not args.no_progress, unit)
    stamps = array("d")
    add = stamps.append
    start = t = clock()
    add(t)
    # Every end is on the perf_counter clock.
    until = start + seconds
    report = start + 0.1 if progress.enabled else float("inf")
    ends = (start + (deadline - time.monotonic()) if deadline is not None
            else float("inf"))
    n = 0
    try:
        while True:
            if deadline is None:
                dispatch(export, wc, arrays, consts, workers=workers)
            else:
                dispatch(export, wc, arrays, consts, workers=workers,
                         timeout=max(ends - t, 1e-6))
            t = clock()
            add(t)
            n += 1
            if stopped:
                raise KeyboardInterrupt
            if (n >= count and t >= until) or n >= limit:
                break
            if t >= ends:
                raise DispatchTimeoutError(
                    f"the time limit of {args.timeout:g} s passed after {n} "
                    "repetitions", name=args.file, field="timeout",
                    value=args.timeout)
            if t >= report:
                report = t + 0.1
                if seconds:
                    progress(int((t - start) * 1e3), int(seconds * 1e3))
                else:
                    progress(n, count)
    finally:
        progress.close()
    return np.diff(np.frombuffer(stamps, np.float64))


def _diagnose(args, image, export) -> None:
    """Run the dispatch once more, emulated, and print where it faults."""
    from ..library import Executable
    print(f"hal-cpu: running the dispatch again emulated ({image.arch.name}) "
          "to find the fault:", file=sys.stderr)
    try:
        arrays = [parse_binding(s) for s in args.binding]
        plugins = None
        if args.executable_plugin:
            from ..plugins import PluginManager
            plugins = PluginManager.from_specs(args.executable_plugin,
                                               arch=image.arch,
                                               backend="emulated",
                                               timeout=_load_limit(args),
                                               **emulation_options(args))
        with Executable(image, backend="emulated", plugins=plugins,
                        timeout=_load_limit(args),
                        **({} if plugins else emulation_options(args))) as exe:
            exe.dispatch(export, args.workgroup_count, arrays, args.constant,
                         workers=args.workers, timeout=args.timeout)
    except elfloader.EmulationError as exc:
        print(for_terminal(str(exc if exc.name else exc.with_name(args.file)),
                           "hal-cpu"), file=sys.stderr)
    except PortableKernelError as exc:
        print(for_terminal(f"hal-cpu: the emulated run stopped without a CPU "
                           f"fault: {exc}", "hal-cpu"),
              file=sys.stderr)
    else:
        print("hal-cpu: the emulated run finished without a fault (the crash "
              "depends on something the emulation does not reproduce, such "
              "as the host's CPU features or timing)", file=sys.stderr)


def _plugin_paths(args) -> list[str]:
    """The files ``--executable_plugin`` names (what a confined child reads
    to load them)."""
    from ..plugins import PluginSpec
    return [PluginSpec(spec).path for spec in args.executable_plugin]


def _checked_answer(answer, name: str):
    """A child's ``(times, where, label, path)`` as plain data checked:
    times a float64 array.

    Raises:
        HalCpuError: the answer has another shape (``field`` ``child``).
    """
    if (not isinstance(answer, tuple) or len(answer) != 4
            or not isinstance(answer[0], list)
            or not all(isinstance(t, float) for t in answer[0])
            or not all(isinstance(v, str) for v in answer[1:])):
        raise HalCpuError("the child process running the dispatch sent an "
                          "answer of another shape", name=name, field="child",
                          value=type(answer).__name__)
    times, where, label, path = answer
    return np.asarray(times, np.float64), where, label, path


def cmd_run(args) -> int:
    from ..errors import NativeCrashError
    from ..isolate import run_in_child, shared_array
    arrays = [parse_binding(s) for s in args.binding]
    shown = _print_selection(args.print_bindings, len(arrays))
    for i, path in args.output:
        if not 0 <= i < len(arrays):
            raise HalCpuError(f"no binding {i} ({len(arrays)} bindings)",
                              field="--output", value=i)
        directory = os.path.dirname(os.path.abspath(path))
        if not os.path.isdir(directory) or not os.access(directory, os.W_OK):
            raise HalCpuError(f"cannot write {path}: {directory} is not a "
                              "writable directory", field="--output", value=path)
    # Read and verified once: the plugins need its architecture first.
    from ..programs.vm import vmfb
    if vmfb.is_module_file(args.file):
        data, label = vmfb.read_executable(args.file, args.executable)
        image = elfloader.read_image(data, arch=args.arch, name=label)
    elif args.executable is not None:
        raise HalCpuError("--executable picks an executable of a compiled "
                          "module (.vmfb); this file is not one",
                          name=args.file, field="--executable",
                          value=args.executable)
    else:
        image = elfloader.read_image(args.file, arch=args.arch)
    export = args.function if args.function is not None else args.entry_point
    if workbench_wanted(args):
        from ..workbench import commands as workbench
        # Emulated on qemu, in this process; bindings given as a shape only
        # have no contents (their reads before any write are reported).
        workbench.prepare(args)
        with workbench.session(args, [i for i, spec in enumerate(args.binding)
                                      if "=" not in spec
                                      and not spec.startswith("@")]) as wb:
            times, where, label, path = _dispatch(args, image, export, arrays)
        for i, path in args.output:
            np.save(path, arrays[i])
        for i in shown:
            print(f"binding[{i}]: {format_buffer_view(arrays[i])}")
        return workbench.finish(args, wb)
    native = _runs_natively(args.backend, image.arch, emulation_options(args))
    isolate = args.isolate if args.isolate is not None else native
    if isolate and hasattr(os, "fork"):
        # The child writes the results into memory the two processes share;
        # natively it is confined (unless --run_native) and sends plain data.
        confine = (_confinement(args, [args.file] + _plugin_paths(args))
                   if native else None)
        arrays = [shared_array(a) for a in arrays]

        def child(note):
            times, where, label, path = _dispatch(args, image, export, arrays,
                                                  note)
            return [float(t) for t in times], str(where), str(label), str(path)
        try:
            answer = run_in_child(child, name=args.file, confine=confine,
                                  timeout=args.timeout and args.timeout + KILL_GRACE)
            times, where, label, path = _checked_answer(answer, args.file)
        except NativeCrashError as exc:
            print(for_terminal(f"hal-cpu: error: {exc}", "hal-cpu"), file=sys.stderr)
            if native and args.diagnose:
                _diagnose(args, image, export)
            return 1
    else:
        times, where, label, path = _dispatch(args, image, export, arrays)
    if args.verbose:
        print(f"hal-cpu: ran {label} of {path} ({where})", file=sys.stderr)
    for i, path in args.output:
        np.save(path, arrays[i])
    for i in shown:
        print(f"binding[{i}]: {format_buffer_view(arrays[i])}")
    if len(times):
        times = np.sort(times)
        print(f"dispatch time ({where}, {len(times)} repetitions): "
              f"min {times[0] * 1e6:.2f} us, median "
              f"{times[len(times) // 2] * 1e6:.2f} us, mean "
              f"{times.mean() * 1e6:.2f} us")
    return 0


#: Subcommand -> (add its parser to the ``hal-cpu`` subparsers, run it).
COMMANDS = {"inspect": (_inspect_parser, cmd_inspect), "run": (_run_parser, cmd_run)}
