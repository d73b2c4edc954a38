"""``hal-cpu debug``: one dispatch under gdb.

``hal-cpu debug [--gdb_batch FILE | --gdb_command] [--gdb PATH] run
ARGS...`` takes ``run``'s arguments as they are (``ARGS`` parsed by
``run``'s own parser) and runs that dispatch emulated on the qemu engine,
worker 0's agent under qemu-user's gdb stub, then ``gdb-multiarch`` stopped
at the export (:mod:`hal_cpu.workbench.debug`). When gdb lets the
dispatch go on, it completes and its bindings are printed and saved as
``run`` does. Time limits are off; one worker. ``hal-cpu debug ...
run-module ARGS...`` runs the program as ``run-module`` does (emulated,
qemu, one worker), its first dispatch under gdb.
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

import elfloader

from ..buffers import format_buffer_view, parse_binding
from ..errors import HalCpuError
from .options import emulation_options

__all__ = ["COMMANDS", "cmd_debug"]

#: The commands whose dispatch ``debug`` runs (``run-module``: the
#: program's first dispatch).
DEBUGGED = ("run", "run-module")


def _debug_parser(sub) -> None:
    p = sub.add_parser(
        "debug", help="run one dispatch under gdb (qemu-user's gdb stub)",
        description="Run the dispatch `hal-cpu run ARGS...` would run "
        "(or the first dispatch of `hal-cpu run-module ARGS...`), "
        "emulated on the qemu engine under qemu-user's gdb stub, and "
        "gdb-multiarch connected to it with the executable's and plugins' "
        "symbols and DWARF at their load addresses, stopped at the export's "
        "first instruction. When gdb continues (or detaches) the dispatch "
        "completes and its bindings are printed as run prints them. The "
        "guest agent's sandbox may serve its one UNIX socket, in a private "
        "folder of this session, and nothing more; time limits are off and "
        "one worker runs.",
        epilog="Example: hal-cpu debug --gdb_batch steps.gdb run "
        "kernel.so --function f --binding 4xf32=1 --binding 4xf32=0. "
        "Exit status: 0 success, 1 error (one line on stderr) or gdb "
        "ended with an error, 2 usage error.")
    how = p.add_mutually_exclusive_group()
    how.add_argument("--gdb_batch", metavar="FILE",
                     help="run gdb in batch mode: after the set-up (stopped "
                     "at the export) it runs FILE's commands and exits; "
                     "end FILE with delete and continue (or detach)")
    how.add_argument("--gdb_command", action="store_true",
                     help="print the gdb command line on stdout instead of "
                     "starting gdb, then wait for it (run it in another "
                     "terminal)")
    p.add_argument("--gdb", metavar="PATH", default=None,
                   help="the gdb to run (default gdb-multiarch)")
    p.add_argument("debugged", choices=DEBUGGED, metavar="COMMAND",
                   help="the command whose dispatch runs under gdb: run, "
                   "or run-module (its first dispatch)")
    p.add_argument("args", nargs=argparse.REMAINDER, metavar="ARGS",
                   help="its arguments, as it takes them")


def _refuse(run, name: str | None) -> None:
    """Refuse ``run``'s options that debugging cannot honour."""
    from ..workbench.debug import DebugError
    if run.backend == "native":
        raise DebugError("a native dispatch cannot run under gdb: debug runs "
                         "it emulated under qemu-user's gdb stub (leave "
                         "--backend out, or say emulated)", name=name,
                         field="--backend", value="native")
    engine = run.engine or os.environ.get("PKR_ENGINE") or "qemu"
    if engine not in ("auto", "qemu"):
        raise DebugError(f"the {engine} engine has no gdb stub: debug needs "
                         "the qemu engine (--engine qemu)", name=name,
                         field="--engine", value=engine)
    if run.workers not in (None, 1):
        raise DebugError("debug runs one worker (one gdb stub per guest "
                         "agent)", name=name, field="--workers",
                         value=run.workers)
    for flag, value in (("--timeout", run.timeout),
                        ("--benchmark_repetitions",
                         getattr(run, "benchmark_repetitions", None)),
                        ("--benchmark_min_time",
                         getattr(run, "benchmark_min_time", None))):
        if value is not None:
            raise DebugError(f"{flag} does not apply under gdb (no time "
                             "limits, one dispatch)", name=name, field=flag,
                             value=value)


def _shown(text: str, count: int) -> list[int]:
    """Binding indices of ``--print_bindings`` (``all``, ``none``, ``I,J``).

    Raises:
        HalCpuError: another text, or an index out of range.
    """
    if text == "all":
        return list(range(count))
    if text == "none":
        return []
    try:
        picked = [int(t) for t in text.split(",")]
    except ValueError:
        picked = []
    if not picked or not all(0 <= i < count for i in picked):
        raise HalCpuError(f"{text!r} is not all, none or binding indices "
                          f"below {count}", field="--print_bindings",
                          value=text)
    return picked


def _image(run):
    """The executable ``run.file`` names, read and verified."""
    from ..programs.vm import vmfb
    if vmfb.is_module_file(run.file):
        data, label = vmfb.read_executable(run.file, run.executable)
        return elfloader.read_image(data, arch=run.arch, name=label)
    if run.executable is not None:
        raise HalCpuError("--executable picks an executable of a compiled "
                          "module (.vmfb); this file is not one",
                          name=run.file, field="--executable",
                          value=run.executable)
    return elfloader.read_image(run.file, arch=run.arch)


def cmd_debug(args) -> int:
    from ..library import Executable
    from ..workbench.debug import GDB, DebugError, Debugger, find_gdb
    from . import build_parser
    run = build_parser(args.debugged).parse_args([args.debugged, *args.args])
    _refuse(run, getattr(run, "file", None) or getattr(run, "program", None))
    if args.gdb_batch is not None and not os.path.isfile(args.gdb_batch):
        raise DebugError("no such gdb script (a file of gdb commands)",
                         name=args.gdb_batch, field="--gdb_batch",
                         value=args.gdb_batch)
    gdb = (args.gdb or GDB) if args.gdb_command else find_gdb(args.gdb)
    if args.debugged == "run-module":
        return _debug_program(args, gdb)
    arrays = [parse_binding(s) for s in run.binding]
    shown = _shown(run.print_bindings, len(arrays))
    for i, path in run.output:
        if not 0 <= i < len(arrays):
            raise HalCpuError(f"no binding {i} ({len(arrays)} bindings)",
                              field="--output", value=i)
    image = _image(run)
    export = run.function if run.function is not None else run.entry_point
    options = {**emulation_options(run), "engine": "qemu"}
    plugins = None
    if run.executable_plugin:
        from ..plugins import PluginManager
        plugins = PluginManager.from_specs(run.executable_plugin,
                                           arch=image.arch,
                                           backend="emulated", timeout=0,
                                           **options)
    debugger = None
    try:
        with Executable(image, backend="emulated", plugins=plugins, timeout=0,
                        **({} if plugins else options)) as exe:
            debugger = Debugger(exe, export, gdb=gdb, batch=args.gdb_batch,
                                command_only=args.gdb_command)
            with debugger:
                exe.dispatch(export, run.workgroup_count, arrays,
                             run.constant, workers=1)
            where = (f"{exe.arch.name}, {exe.backend.describe()}, "
                     f"export {debugger.label}")
    finally:
        # Closing the backend (the plugins' one, with plugins) ends the
        # agent gdb continues, and so gdb's session, also after a fault
        # (whose report follows gdb's transcript).
        if plugins is not None:
            plugins.close()
        status = debugger.wait() if debugger is not None else 0
    if run.verbose:
        print(f"hal-cpu: ran {debugger.label} of {run.file} under gdb "
              f"({where})", file=sys.stderr)
    for i, path in run.output:
        np.save(path, arrays[i])
    for i in shown:
        print(f"binding[{i}]: {format_buffer_view(arrays[i])}")
    if status:
        print(f"hal-cpu: error: gdb ended with status {status} (the dispatch "
              "completed)", file=sys.stderr)
        return 1
    return 0


def _debug_program(args, gdb: str) -> int:
    """``run-module ARGS`` with its first dispatch under gdb, on one worker
    of the qemu engine; its exit status (1 also when gdb failed)."""
    from ..workbench.debug import ProgramDebugger
    from . import main
    debugger = ProgramDebugger(gdb=gdb, batch=args.gdb_batch,
                               command_only=args.gdb_command)
    try:
        with debugger:
            code = main(["run-module", *args.args, "--backend=emulated",
                         "--engine=qemu", "--workers=1"])
    finally:
        status = debugger.wait()
    if debugger.space is None:
        print("hal-cpu: the program ran no dispatch: nothing was debugged",
              file=sys.stderr)
    if status and not code:
        print(f"hal-cpu: error: gdb ended with status {status}",
              file=sys.stderr)
        return 1
    return code


#: Subcommand -> (add its parser to the ``hal-cpu`` subparsers, run it).
COMMANDS = {"debug": (_debug_parser, cmd_debug)}
