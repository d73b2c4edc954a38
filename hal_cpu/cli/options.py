"""Options and helpers the ``hal-cpu`` commands share: argument types
(:func:`positive`, :func:`seconds`, :func:`arch`), the emulated CPU's flags
(:func:`add_cpu_flags`, :func:`emulation_options`), time limits
(:data:`KILL_GRACE`, :data:`MAX_SECONDS`, :data:`INSPECT_TIMEOUT`,
:func:`load_limit`), whether a run is native (:func:`runs_natively`) and the
progress bar (:class:`Progress`), and how a native run is confined
(:func:`add_native_flag`, :func:`confinement`) or not run in a child at
all (:func:`add_isolate_flag`).

A leaf of the command line: every module of subcommands
(:mod:`hal_cpu.cli.executables`, :mod:`~hal_cpu.cli.modules`,
:mod:`~hal_cpu.cli.plan`, :mod:`~hal_cpu.cli.tools`) imports it, and none
imports another's.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

import elfloader
from fatelf import arches
from fatelf.errors import PortableKernelError

__all__ = ["INSPECT_TIMEOUT", "KILL_GRACE", "MAX_SECONDS", "NATIVE_HELP",
           "NO_ISOLATE_HELP", "Progress", "add_cpu_flags", "add_isolate_flag",
           "add_native_flag", "add_workbench_flags", "arch", "confinement",
           "emulation_options", "load_limit", "positive", "runs_natively",
           "seconds", "workbench_wanted"]

#: Seconds past --timeout after which an isolated child is killed (it
#: normally stops itself at the limit with a typed error first).
KILL_GRACE = 1.0
#: Largest --timeout accepted (a day); "inf" and "nan" are usage errors.
MAX_SECONDS = 86400.0
#: Seconds each guest call may run under emulation for ``inspect`` (and
#: the whole of it for a system library), unless --timeout says otherwise.
INSPECT_TIMEOUT = 5.0


def add_workbench_flags(p: argparse.ArgumentParser) -> None:
    """Add the workbench's ``--sanitize`` and ``--count_instructions`` to
    parser ``p`` (``run``, ``run-module``, ``benchmark-module``). Defined
    here, not in :mod:`hal_cpu.workbench`, so that building a parser does
    not import the workbench: :mod:`hal_cpu.workbench.commands` is imported
    only when :func:`workbench_wanted` says a command line asks for it."""
    p.add_argument(
        "--sanitize", action="store_true",
        help="run emulated (qemu engine, one worker) and report per dispatch "
        "races between workgroups, reads of bytes another workgroup writes "
        "(order dependence), output bytes no workgroup writes, reads of "
        "uninitialized bytes and accesses outside bindings, with workgroups, "
        "pc, symbol and source line; exit status 1 when anything was found, "
        "3 when SVE contiguous loads/stores ran (qemu 7.2 cannot see them)")
    p.add_argument(
        "--count_instructions", nargs="?", const="-", default=None,
        metavar="FILE.json",
        help="run emulated (qemu engine) and count the instructions of the "
        "kernel's own code per dispatch and workgroup (deterministic); print "
        "them, or write them as JSON to FILE.json")


def workbench_wanted(args: Any) -> bool:
    """Whether the command line asks for the workbench (``--sanitize`` or
    ``--count_instructions``)."""
    return bool(getattr(args, "sanitize", False)
                or getattr(args, "count_instructions", None) is not None)


def positive(text: str) -> int:
    """Argument type: an integer of at least 1."""
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive integer")
    return int(text)


def seconds(text: str) -> float:
    """Argument type: a number of seconds in (0, :data:`MAX_SECONDS`]."""
    try:
        v = float(text)
    except ValueError:
        v = -1
    if not 0 < v <= MAX_SECONDS:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a number of seconds in (0, {MAX_SECONDS:g}]")
    return v


def arch(text: str) -> str:
    """Argument type: an architecture the runtime runs, by name or alias;
    its name."""
    try:
        return arches.lookup(text, runtime=True).name
    except PortableKernelError as exc:
        raise argparse.ArgumentTypeError(exc.message) from None


def add_cpu_flags(p: argparse.ArgumentParser) -> None:
    """``--engine``, ``--cpu`` and ``--vlen``: what the emulated CPU is."""
    p.add_argument("--engine", choices=("auto", "qemu", "unicorn"),
                   default=None, help="emulation engine: qemu (qemu-user; "
                   "AVX2/FMA, SVE, RVV), unicorn (in process; no vector "
                   "extensions beyond SSE/NEON), or auto (qemu where "
                   "installed; default)")
    p.add_argument("--cpu", metavar="PROFILE", default=None,
                   help="CPU profile the emulated CPU models, e.g. x86-64-v3, "
                   "sve, rv64gcv (hal-cpu profiles lists them); selects "
                   "emulation. Default: the engine's most capable model")
    p.add_argument("--vlen", type=positive, metavar="BITS", default=None,
                   help="vector length of a scalable profile (SVE VL, RVV "
                   "VLEN), e.g. 128, 256, 512")


def emulation_options(args) -> dict:
    """``engine``/``cpu``/``vlen`` keyword arguments given on the command
    line (none: the defaults)."""
    return {k: getattr(args, k, None) for k in ("engine", "cpu", "vlen")
            if getattr(args, k, None) is not None}


def load_limit(args) -> float:
    """Seconds each guest call may run while loading: ``--timeout`` when
    given, else the library's default (:data:`hal_cpu.library.LOAD_TIMEOUT`)."""
    from ..library import LOAD_TIMEOUT
    return getattr(args, "timeout", None) or LOAD_TIMEOUT


def runs_natively(backend: str, arch, emulation: dict | None = None) -> bool:
    """Whether ``--backend=backend`` runs a file for ``arch`` on this CPU
    (``emulation``: the ``--engine``/``--cpu``/``--vlen`` given, which
    select emulation under ``auto``)."""
    host = elfloader.arch.host()
    return backend == "native" or (backend == "auto" and host is not None
                                   and arch is host and not emulation)


#: What ``--run_native`` says in every command's help.
NATIVE_HELP = ("run native code (kernels, plugins) with your rights, "
               "unconfined: by default it runs in a child process confined "
               "as an emulator's agent is (no file created or written, no "
               "socket, no process or program started; it may allocate, "
               "read the clock, run threads and print to stdout and "
               "stderr)")


def add_native_flag(p: argparse.ArgumentParser) -> None:
    """``--run_native`` (alias ``--no_sandbox``): native code runs
    unconfined (see :data:`NATIVE_HELP`)."""
    p.add_argument("--run_native", action="store_true", help=NATIVE_HELP)
    p.add_argument("--no_sandbox", dest="run_native", action="store_true",
                   help="the same as --run_native")


#: What ``--no_isolate`` says in the program commands' help.
NO_ISOLATE_HELP = ("run the program in hal-cpu itself, not in a child "
                   "process: native code runs with your rights, unconfined "
                   "(as with --run_native), and a kernel that crashes ends "
                   "hal-cpu (no report, no emulated re-run), as in "
                   "iree-run-module")


def add_isolate_flag(p: argparse.ArgumentParser) -> None:
    """``--no_isolate`` of the program commands (``run-module``,
    ``check-module``, ``benchmark-module``, ``plan``): no child process
    (``args.isolate`` False; see :data:`NO_ISOLATE_HELP`). It implies
    ``--run_native``."""
    p.add_argument("--no_isolate", dest="isolate", action="store_false",
                   default=True, help=NO_ISOLATE_HELP)


def confinement(args, read=(), prepare=None, keep: tuple[int, ...] = ()):
    """The ``confine`` of a child running native code for the command
    ``args``: :func:`hal_cpu.isolate.confinement` reading also ``read``
    (files or directories), keeping descriptors ``keep`` open (and
    calling ``prepare()`` first), or None with ``--run_native``.

    Raises:
        HalCpuError: this machine cannot confine a child (``field``
            ``sandbox``; the message names ``--run_native``).
    """
    if getattr(args, "run_native", False):
        return None
    from ..isolate import confinement as make
    return make(read, prepare=prepare, keep=keep)


class Progress:
    """A tqdm bar on stderr (when it is a terminal) for dispatches that run
    longer than about a second."""

    def __init__(self, enabled: bool, unit: str = "wg"):
        self.enabled = enabled and sys.stderr.isatty()
        self.start = time.monotonic()
        self.bar: Any = None
        self.unit = unit

    def __call__(self, done: int, total: int) -> None:
        if not self.enabled:
            return
        if self.bar is None:
            if time.monotonic() - self.start < 1.0:
                return
            from tqdm import tqdm
            self.bar = tqdm(total=total, unit=self.unit, file=sys.stderr,
                            leave=False)
        self.bar.update(done - self.bar.n)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
