"""``hal-cpu run-module``, ``hal-cpu check-module`` and ``hal-cpu
benchmark-module``: call the functions of a compiled IREE module
(``.vmfb``) or of an MLIR program (compiled to one with
:func:`hal_cpu.programs.compile_program`, cached), both run by :mod:`hal_cpu.programs.vm`,
dispatches and transfers through this
runtime, natively or emulated; host modules given with ``--module``.

``run-module`` prints the results as ``iree-run-module`` prints them::

    EXEC @matmul
    result[0]: hal.buffer_view
    2x2xf32=[1 2][3 4]

``check-module`` runs every public function of a test program (IREE's
``check.expect_*`` ops) as ``iree-check-module`` does: a line per function,
exit status 1 when any expectation fails. ``benchmark-module`` times calls
of a function of a program loaded once, as ``iree-benchmark-module`` does.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from typing import Sequence

import numpy as np

import elfloader
from fatelf import arches
from fatelf.text import for_terminal, printable

from ..buffers import format_buffer_view
from .options import (
    add_cpu_flags,
    add_isolate_flag,
    add_native_flag,
    emulation_options,
    positive,
    runs_natively,
    seconds,
)
from .options import arch as arch_type
from .programs import (
    PIPED,
    SOURCES,
    STDIN,
    ModuleError,
    add_program_flags,
    add_refused_flags,
    arrays_from_plain,
    by_path,
    cache_dir_of,
    compile_for,
    is_stdin,
    load_hosts,
    native_child,
    plain_arrays,
    split_modules,
    status_errors,
    vm_arch,
    vm_files,
    vm_inputs,
    vm_program,
    watchdog,
    workers_of,
)

__all__ = ["COMMANDS", "cmd_benchmark_module", "cmd_check_module", "cmd_run_module",
           "format_result"]


# ---------------------------------------------------------------------------
# command line

def _run_module_parser(sub) -> None:
    p = sub.add_parser("run-module", help="run a compiled IREE module (.vmfb) "
                       "or an MLIR program (compiled first) through this "
                       "runtime on any architecture and print the results as "
                       "iree-run-module does")
    add_program_flags(p, all_arches=False, modules=True)
    p.add_argument("--backend", choices=elfloader.backend.KINDS, default="auto",
                   help="native (host architecture only), emulated, or auto "
                   "(native when --arch is the host's; default)")
    p.add_argument("--executable_plugin", action="append", default=[],
                   metavar="SPEC", help="plugin resolving the executables' "
                   "imports: path.sos, embedded:path, a system library path, "
                   "with optional ?key=value&... load parameters (repeatable)")
    p.add_argument("--output", action="append", default=[], type=_output_spec,
                   metavar="SPEC", help="one per result, as iree-run-module: "
                   "'' skip, '-' print, @file.npy write, +file.npy append, "
                   "@file.bin / +file.bin raw bytes (default: print all)")
    p.add_argument("--output_max_element_count", type=_count, default=1024,
                   metavar="N", help="print at most N elements of each result "
                   "(default 1024)")
    p.add_argument("--compare", action="store_true",
                   help="also run the program with IREE's own runtime on this "
                   "machine and print the max abs error of each result")
    p.add_argument("--workers", type=positive, default=None,
                   help="host threads running workgroups (default: the CPUs "
                   "this process may use)")
    p.add_argument("--timeout", type=seconds, default=None, metavar="S",
                   help="stop when the dispatches have run S seconds in all")
    p.add_argument("--no_progress", action="store_true",
                   help="no progress bar for long runs")
    _add_memory_limit(p)
    _add_statistics(p)
    add_cpu_flags(p)
    _add_iree_only(p, "run-module")


def _check_module_parser(sub) -> None:
    p = sub.add_parser("check-module", help="run every public function of a "
                       "test program with IREE's check ops, as iree-check-module "
                       "does, on any architecture")
    p.add_argument("program", nargs="?", default=None,
                   help="test program: a compiled module (.vmfb) or MLIR "
                   "(functions without arguments calling check.expect_*); "
                   "may also be given as the last --module")
    p.add_argument("--function", action="append", default=[],
                   help="run only this function (repeatable; default: all public ones)")
    p.add_argument("--cache_dir", metavar="DIR", help="where compiled programs "
                   "are kept (as run-module)")
    p.add_argument("--compile_flag", action="append", default=[], metavar="FLAG",
                   help="an extra iree-compile flag (repeatable)")
    p.add_argument("--module", action="append", default=[], metavar="FILE",
                   help="a module (.vmfb or MLIR; the last one is tested) or a "
                   "Python host module (.py), as run-module (repeatable)")
    p.add_argument("--host_module", action="append", default=[], metavar="SPEC",
                   help="a Python host module the program imports (as run-module)")
    p.add_argument("--device", default=None, metavar="URI",
                   help="local-task or local-sync, as IREE's tools")
    p.add_argument("--arch", type=arch_type, metavar="ARCH",
                   help="architecture to compile for and run (default: this machine's)")
    p.add_argument("--backend", choices=elfloader.backend.KINDS, default="auto",
                   help="native, emulated, or auto (default)")
    p.add_argument("--executable_plugin", action="append", default=[], metavar="SPEC",
                   help="plugin resolving the executables' imports (repeatable)")
    p.add_argument("--workers", type=positive, default=None,
                   help="host threads running workgroups")
    p.add_argument("--timeout", type=seconds, default=None, metavar="S",
                   help="each function may run S seconds (host code and "
                   "dispatches); the command ends past the limit")
    _add_memory_limit(p)
    _add_statistics(p)
    add_native_flag(p)
    add_isolate_flag(p)
    add_cpu_flags(p)
    _add_iree_only(p, "check-module")


def _benchmark_module_parser(sub) -> None:
    from . import gbench  # here: run-module does not import it
    p = sub.add_parser("benchmark-module", help="time calls of a function of "
                       "a compiled module (.vmfb) or MLIR program loaded once, "
                       "as iree-benchmark-module does, on any architecture")
    add_program_flags(p, all_arches=False, modules=True)
    p.add_argument("--backend", choices=elfloader.backend.KINDS, default="auto",
                   help="native, emulated, or auto (default)")
    p.add_argument("--executable_plugin", action="append", default=[],
                   metavar="SPEC", help="plugin resolving the executables' "
                   "imports (repeatable)")
    p.add_argument("--workers", type=positive, default=None,
                   help="host threads running workgroups")
    p.add_argument("--benchmark_repetitions", type=positive, default=None,
                   metavar="N", help="without --benchmark_format: time N "
                   "calls (default: as many as --benchmark_min_time allows); "
                   "with it, as Google Benchmark: N repetitions of "
                   "--benchmark_min_time each, then their mean, median, "
                   "stddev and cv")
    _add_memory_limit(p)
    _add_statistics(p)
    p.add_argument("--replay", action="store_true",
                   help="time the call's recorded dispatches, fills and copies "
                   "replayed on the same buffers without the VM (its native "
                   "dispatches in one crossing); a call with no replay (data "
                   "dependent steps, host modules) is timed as without it")
    p.add_argument("--benchmark_min_time", type=_min_time, default=None,
                   metavar="T", help="call for at least T seconds (0.5, 0.5s) "
                   "or exactly N times (100x); default 0.5s")
    p.add_argument("--benchmark_format", choices=gbench.FORMATS, default=None,
                   help="print the report as iree-benchmark-module does, in "
                   "Google Benchmark's console table, JSON or CSV (default: "
                   "hal-cpu's summary: min / median / mean per call)")
    p.add_argument("--benchmark_out", metavar="FILE", default=None,
                   help="also write the report to FILE, in "
                   "--benchmark_out_format")
    p.add_argument("--benchmark_out_format", choices=gbench.FORMATS,
                   default="json", help="the format of --benchmark_out "
                   "(default json)")
    p.add_argument("--benchmark_time_unit", choices=tuple(gbench.TIME_UNITS),
                   default="ms", help="the unit of real_time and cpu_time "
                   "(default ms, as iree-benchmark-module)")
    for flag in ("--benchmark_report_aggregates_only",
                 "--benchmark_display_aggregates_only"):
        p.add_argument(flag, type=_flag_bool, nargs="?", const=True,
                       default=False, metavar="true|false",
                       help="with repetitions, report only the aggregates")
    p.add_argument("--benchmark_list_tests", type=_flag_bool, nargs="?",
                   const=True, default=False, metavar="true|false",
                   help="print the benchmark's name and run nothing")
    p.add_argument("--benchmark_filter", metavar="REGEX", default=None,
                   help="run the benchmark only if its name matches REGEX")
    p.add_argument("--timeout", type=seconds, default=None, metavar="S",
                   help="stop after S seconds in all")
    add_cpu_flags(p)
    for flag, why in (("--output", "benchmark calls keep no outputs; "
                       "run-module prints and writes them"),
                      ("--output_max_element_count", "benchmark calls keep no "
                       "outputs")):
        p.add_argument(flag, nargs="?", action="store", help=argparse.SUPPRESS,
                       dest="refused_" + flag[2:], type=_refuse("benchmark-module",
                                                                flag, why))
    _add_iree_only(p, "benchmark-module")


def _add_iree_only(p, command: str) -> None:
    """IREE's flags a program command takes as IREE's tools do
    (``--task_topology_group_count``: the host threads, as ``--workers``;
    ``--task_abort_on_failure``: a failure ends the call anyway), and one
    line refusing each other one (:func:`add_refused_flags`)."""
    p.add_argument("--task_topology_group_count", type=positive, dest="workers",
                   default=None, metavar="N", help="as --workers (IREE's name)")
    p.add_argument("--task_abort_on_failure", type=_flag_bool, nargs="?",
                   const=True, default=False, metavar="true|false",
                   help="accepted: a failure ends the call and the command")
    add_refused_flags(p, command)


def _refuse(command: str, flag: str, why: str):
    def refuse(_text: str):
        print(f"hal-cpu {command}: flag {flag} is not supported ({why})",
              file=sys.stderr)
        raise SystemExit(2)
    return refuse


def _flag_bool(text: str) -> bool:
    """A boolean flag's value as IREE's and Google Benchmark's flags take
    it: true/false, 1/0, yes/no."""
    t = text.strip().lower()
    if t in ("true", "1", "yes", "on"):
        return True
    if t in ("false", "0", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false; got {text!r}")


def _output_spec(text: str) -> str:
    if text in ("", "-") or (text[:1] in "@+" and len(text) > 1):
        return text
    raise argparse.ArgumentTypeError(
        f"expected '' (skip), '-' (print), @file.npy / +file.npy (write / "
        f"append), or @file.bin / +file.bin (raw bytes); got {text!r}")


def _count(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r} is not a count")
    return int(text)


def _byte_count(text: str) -> int:
    """``--memory_limit``: bytes, with an optional K, M, G or T suffix
    (powers of 1024)."""
    t = text.strip().upper().removesuffix("B").removesuffix("I")
    scale = 1
    if t[-1:] in ("K", "M", "G", "T"):
        scale = 1 << (10 * ("KMGT".index(t[-1]) + 1))
        t = t[:-1]
    try:
        value = int(float(t) * scale)
    except (ValueError, OverflowError):
        value = 0
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a number of bytes (4096, 512M, "
                                         f"2G); got {text!r}")
    return value


def _add_statistics(p) -> None:
    p.add_argument("--print_statistics", type=_flag_bool, nargs="?",
                   const=True, default=False, metavar="true|false",
                   help="after the run, print the device and the bytes of "
                   "buffers the program holds and may hold (on stderr; "
                   "IREE's allocator prints peak/allocated/freed, which "
                   "this runtime does not count)")


def _add_memory_limit(p) -> None:
    p.add_argument("--memory_limit", type=_byte_count, default=None,
                   metavar="BYTES", help="bytes of buffers a compiled module "
                   "(.vmfb) may hold at once (512M, 2G; default: half the "
                   "physical memory)")


def _min_time(text: str):
    """``--benchmark_min_time``: seconds (``0.5``, ``0.5s``) -> float, or an
    iteration count (``100x``) -> int."""
    t = text.strip()
    try:
        if t.endswith("x"):
            n = int(t[:-1])
            if n > 0:
                return n
        else:
            v = float(t[:-1] if t.endswith("s") else t)
            if v > 0 and v == v and v != float("inf"):
                return v
    except ValueError:
        pass
    raise argparse.ArgumentTypeError(f"expected seconds (0.5, 0.5s) or a count "
                                     f"(100x); got {text!r}")


# ---------------------------------------------------------------------------
# run-module

def _check_outputs(specs: Sequence[str], program: str) -> None:
    for spec in specs:
        if spec[:1] in "@+":
            path = spec[1:]
            directory = os.path.dirname(os.path.abspath(path))
            if not os.path.isdir(directory) or not os.access(directory, os.W_OK):
                raise ModuleError(f"cannot write {path}: {directory} is not a "
                                  "writable directory", name=program,
                                  field="--output", value=spec)


class _Outputs:
    """The ``--output`` files, opened by ``hal-cpu`` before the program
    runs (``@``: created or truncated, ``+``: appended), so that a confined
    child, which may not open a file for writing, writes them through the
    descriptors it keeps. A file this command created is removed again if
    the command fails."""

    def __init__(self, specs: Sequence[str], program: str):
        self.fds: dict[int, int] = {}
        self.created: list[str] = []
        try:
            for i, spec in enumerate(specs):
                if spec[:1] not in ("@", "+"):
                    continue
                path = spec[1:]
                existed = os.path.exists(path)
                flags = os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC | (
                    os.O_TRUNC if spec[0] == "@" else os.O_APPEND)
                try:
                    self.fds[i] = os.open(path, flags, 0o666)
                except OSError as exc:
                    raise ModuleError(f"cannot write {path}: "
                                      f"{exc.strerror or exc}", name=program,
                                      field="--output", value=spec) from None
                if not existed:
                    self.created.append(path)
        except BaseException:
            self.close(failed=True)
            raise

    def close(self, failed: bool) -> None:
        for fd in self.fds.values():
            os.close(fd)
        self.fds = {}
        if failed:
            for path in self.created:
                with contextlib.suppress(OSError):
                    os.unlink(path)

    def __enter__(self) -> "_Outputs":
        return self

    def __exit__(self, kind, *_exc) -> None:
        self.close(failed=kind is not None)


def _results_text(args, function: str, results, types, announced: bool,
                  outputs: "_Outputs | None" = None) -> str:
    """What ``run-module`` prints of a call's results (``EXEC @f`` unless
    ``announced``, then each result, or the ``--output`` specs' ``-``
    ones), writing the ``--output`` files on the way (through the
    descriptors of ``outputs``). Called in the process that holds the
    results (a child for a native run), so large results never travel
    between processes; only the printed text does."""
    limit = args.output_max_element_count
    text = [] if announced else [f"EXEC @{printable(function, 200)}"]
    if args.output:
        for i, (spec, array) in enumerate(zip(args.output, results)):
            if spec == "-":
                text += ["hal.buffer_view", format_buffer_view(array, limit)]
            elif spec and outputs is not None and i in outputs.fds:
                path = spec[1:]
                with os.fdopen(outputs.fds[i], "wb", closefd=False) as f:
                    if path.endswith(".npy"):
                        np.save(f, array)
                    else:
                        f.write(np.ascontiguousarray(array).tobytes())
    else:
        for i, (value, ty) in enumerate(zip(results, types)):
            text.append(f"result[{i}]: {format_result(value, ty, limit)}")
    return "\n".join(text)


def _max_abs_error(got: np.ndarray, want: np.ndarray) -> str:
    if got.size == want.size == 1 and (got.ndim == 0 or want.ndim == 0):
        # a scalar result: however each side holds it
        got, want = got.reshape(()), want.reshape(())
    if got.shape != want.shape:
        return f"shape {'x'.join(map(str, want.shape))} != ours"
    if got.size == 0:
        return "0"
    if got.dtype.kind in "iub" and want.dtype.kind in "iub":
        return str(int(np.max(np.abs(got.astype(object) - want.astype(object)))))
    diff = np.abs(got.astype(np.float64) - want.astype(np.float64))
    return "%G" % float(np.max(diff))


def format_result(value, ty: str, max_elements: int = 1024) -> str:
    """A result as ``iree-run-module`` prints it after ``result[i]: ``:
    ``hal.buffer_view`` and the buffer view on the next line for a tensor,
    ``i32=6`` / ``f32=1.5`` for a scalar (``i1`` as ``i32``), the type name
    for a host module's object."""
    if isinstance(value, np.ndarray):
        return "hal.buffer_view\n" + format_buffer_view(value, max_elements)
    if isinstance(value, np.generic):
        return format_buffer_view(np.asarray(value), max_elements)
    return printable(ty.lstrip("!"), 200)     # the program's type name


def _check_failures(failures: Sequence[str], function: str, program: str) -> None:
    """``run-module``'s end when a call of ``function`` failed ``check``
    expectations (on either path): each on a line of stderr, then a
    :class:`ModuleError` counting them."""
    if failures:
        for text in failures:
            print(for_terminal(f"check failed: {text}", "hal-cpu"), file=sys.stderr)
        raise ModuleError(f"{len(failures)} check expectation(s) failed in "
                          f"@{function}", name=program, field="check",
                          value=len(failures))


def cmd_run_module(args) -> int:
    """``hal-cpu run-module``: see the module docstring."""
    return by_path(args, _vm_run_module)


def _checked(answer, label: str) -> tuple:
    """A child's ``(function, check failures, printed text, results)``,
    checked to be plain data of that shape.

    Raises:
        ModuleError: another shape (``field`` ``child``).
    """
    if (not isinstance(answer, tuple) or len(answer) != 4
            or not isinstance(answer[0], str)
            or not isinstance(answer[1], list)
            or not all(isinstance(f, str) for f in answer[1])
            or not isinstance(answer[2], str)):
        raise ModuleError("the child process running the program sent an "
                          "answer of another shape", name=label,
                          field="child", value=type(answer).__name__)
    return answer


def _diagnose_plan(run, arch: str, program: str) -> None:
    """Run the program again emulated and print where it faults."""
    from fatelf.errors import PortableKernelError
    print(f"hal-cpu: running the program again emulated ({arch}) to find "
          "the fault:", file=sys.stderr)
    try:
        run(lambda _text: None, "emulated")
    except elfloader.EmulationError as exc:
        print(for_terminal(str(exc if exc.name else exc.with_name(program)),
                           "hal-cpu"), file=sys.stderr)
    except PortableKernelError as exc:
        print(for_terminal(f"hal-cpu: the emulated run stopped without a CPU "
                           f"fault: {exc}", "hal-cpu"),
              file=sys.stderr)
    else:
        print("hal-cpu: the emulated run finished without a fault",
              file=sys.stderr)


def _compare(args, program: str, function: str, inputs: list,
             results: list, hosts: Sequence[str] = ()) -> None:
    """``--compare``: run the program with IREE's own runtime on this
    machine and print the max abs error of each result it returns (MLIR is
    compiled for this machine; a ``.vmfb`` must hold this machine's
    executables); when IREE cannot run the program (a host module it has
    no native counterpart of, a plugin it cannot load, no host build...),
    one line says so and why. Never fails the command: our run already
    succeeded."""
    from fatelf.errors import PortableKernelError

    from ..programs import reference_run
    from ..programs.vm import vmfb
    host = arches.host_arch()

    def cannot(why: str) -> None:
        print(f"compare: IREE's runtime cannot run @{printable(function, 200)} "
              f"here: {why}; nothing compared")

    try:
        if is_stdin(program) and STDIN in PIPED:
            # the module piped in: IREE's runtime reads it from a file
            import tempfile
            tmp = tempfile.NamedTemporaryFile(prefix="hal-cpu-stdin-",
                                              suffix=".vmfb")
            tmp.write(PIPED[STDIN])
            tmp.flush()
            program = tmp.name
        elif is_stdin(program):
            program = next((v for v, s in SOURCES.items() if s == STDIN), program)
        if vmfb.is_module_file(program):
            _, arch = vm_arch([program], None)
            if arch != host:
                cannot(f"the module holds {arch} executables, not {host} ones "
                       "(pass the MLIR source to compare)")
                return
            path = program
        else:
            path = compile_for(program, host, cache_dir_of(args),
                               args.compile_flag).vmfb
        want = reference_run(path, function, inputs,
                             executable_plugins=args.executable_plugin)
    except PortableKernelError as exc:
        cannot(_first_line(exc.message if hasattr(exc, "message") else str(exc)))
        return
    except Exception as exc:  # noqa: BLE001 - IREE's runtime raises anything
        # IREE's status text: "where: CODE; what" -> what
        why = _first_line(str(exc)).rpartition("; ")[2] or type(exc).__name__
        if hosts:
            why += " (host modules given with --module run in hal-cpu only)"
        cannot(why)
        return
    if not results:
        print(f"compare: @{function} returns nothing to compare (IREE runtime, {host})")
        return
    for i, g in enumerate(results):
        w = want[i] if i < len(want) else None
        if w is None:
            print(f"compare: result[{i}]: not compared (IREE's runtime "
                  f"returned {len(want)} results)")
        elif not isinstance(g, (np.ndarray, np.generic)):
            print(f"compare: result[{i}]: not compared (a host module's "
                  "object, not data)")
        else:
            print(f"compare: result[{i}]: max abs error "
                  f"{_max_abs_error(np.asarray(g), np.asarray(w))} (IREE runtime, {host})")


def _first_line(text: str) -> str:
    lines = [ln.strip() for ln in str(text).strip().splitlines() if ln.strip()]
    return lines[0] if lines else ""


def _vm_result_type(value) -> str:
    return "hal.buffer_view" if isinstance(value, np.ndarray) else type(value).__name__


class ExportNotes(list):
    """A ``trace`` list for :func:`hal_cpu.programs.vm.load_program` that keeps no
    record: it calls ``note("in export <name>")`` when the program is
    about to dispatch an export other than the last one (in a child
    process, the place a native crash names)."""

    def __init__(self, note):
        super().__init__()
        self.note, self.last = note, None

    def append(self, record) -> None:
        key = (id(record.executable), record.ordinal)
        if key != self.last:
            self.last = key
            exports = record.executable.library.exports
            export = exports[record.ordinal] if record.ordinal < len(exports) else None
            self.note(f"in export {getattr(export, 'name', None) or record.ordinal}")


def _vm_run_module(args, files, hosts, arch) -> int:
    label = SOURCES.get(files[-1], files[-1])
    _check_outputs(args.output, label)
    modules, arch = vm_arch(files, arch)
    loaded: list = []

    def run(note, backend=None):
        # the native run says which export it dispatches: a crash names it
        notes = None if backend else ExportNotes(note)
        with vm_program(args, files, hosts, arch, modules=modules,
                        host_modules=loaded, backend=backend,
                        trace=notes) as program:
            fn = program.function(args.function)
            inputs = vm_inputs(fn, args.input, label)
            if args.output and len(args.output) != len(fn.result_types):
                raise ModuleError(f"{len(args.output)} --output given; @{fn.name} "
                                  f"has {len(fn.result_types)} results", name=label,
                                  field="--output", value=len(args.output))
            if backend is None:
                # ahead of what host modules and plugins print while the
                # call runs, as iree-run-module prints it (flushed)
                print(f"EXEC @{printable(fn.name, 200)}", flush=True)
            try:
                results = fn(*inputs)
            except (ValueError, TypeError) as exc:
                raise ModuleError(str(exc), name=label, field="--input",
                                  value=None) from None
            from ..isolate import flush_c_streams
            flush_c_streams()       # a plugin's printf before the results
            _statistics(args, program)
            failures = program.take_failures()
            text = _results_text(args, fn.name, results,
                                 [_vm_result_type(v) for v in results], True,
                                 outputs)
            sent = (plain_arrays(results), _plain_inputs(inputs)) \
                if args.compare else []
            return fn.name, [str(f) for f in failures], text, sent

    # Native dispatches run in a child process (confined unless
    # --run_native) whether or not --arch was given: a crashing kernel ends
    # the child, not hal-cpu; the crash is then located by an emulated run.
    # Host modules load in the child before it is confined.
    from ..errors import NativeCrashError
    with _Outputs(args.output, label) as outputs:
        try:
            answer = native_child(args, label, arch, run, read=files,
                                  hosts=hosts, keep=tuple(outputs.fds.values()),
                                  prepare=lambda: loaded.extend(load_hosts(hosts)))
        except NativeCrashError as exc:
            print(for_terminal(f"hal-cpu: error: {exc}", "hal-cpu"), file=sys.stderr)
            outputs.close(failed=True)
            if hosts and not loaded:
                loaded.extend(load_hosts(hosts))
            _diagnose_plan(run, arch, label)
            return 1
    name, failures, text, sent = _checked(answer, label)
    if text:
        print(text)
    _check_failures(failures, name, label)
    if args.compare:
        results, inputs = _compared(sent, label)
        _compare(args, split_modules(args)[0][-1], name, inputs, results, hosts)
    return 0


def _plain_inputs(values) -> list:
    """A call's arguments as plain data: arrays as :func:`plain_arrays`
    gives them, scalars as ``("scalar", int or float)``."""
    arrays = plain_arrays(values)
    return [("scalar", v if isinstance(v, (int, float)) else float(v))
            if a is None else a for a, v in zip(arrays, values)]


def _compared(sent, label: str) -> tuple[list, list]:
    """``(results, inputs)`` of a run that ``--compare`` compares, from the
    plain data the (child) run sent, checked.

    Raises:
        ModuleError: data of another shape (``field`` ``child``).
    """
    if not isinstance(sent, tuple) or len(sent) != 2 or not isinstance(sent[1], list):
        raise ModuleError("the child process running the program sent an "
                          "answer of another shape", name=label, field="child",
                          value=type(sent).__name__)
    results = arrays_from_plain(sent[0], label)
    scalars = {i: v[1] for i, v in enumerate(sent[1])
               if isinstance(v, tuple) and len(v) == 2 and v[0] == "scalar"
               and isinstance(v[1], (int, float)) and not isinstance(v[1], bool)}
    arrays = arrays_from_plain([None if i in scalars else v
                                for i, v in enumerate(sent[1])], label)
    return results, [scalars.get(i, a) for i, a in enumerate(arrays)]


# ---------------------------------------------------------------------------
# check-module

def cmd_check_module(args) -> int:
    """``hal-cpu check-module``: every public function (or those named), one
    line each: ``PASS @f`` or ``FAIL @f`` followed by IREE's messages for the
    failed expectations, indented; exit status 1 when any function fails."""
    return by_path(args, _vm_check_module)


def _verdict(function: str, messages: Sequence[str]) -> bool:
    """Print ``PASS @function``, or ``FAIL @function`` followed by
    ``messages`` (IREE's for the failed expectations, or the error that
    ended the call), indented; whether it failed."""
    if messages:
        print(f"FAIL @{printable(function, 200)}")
        for text in messages:
            print("    " + for_terminal(text).replace("\n", "\n    "))
        return True
    print(f"PASS @{printable(function, 200)}")
    return False


def _passed(count: int, failed: int, arch: str) -> int:
    """Print how many of ``count`` functions passed on ``arch``; the exit
    status (1 when any failed)."""
    print(f"{count - failed} of {count} functions passed ({arch})")
    return 1 if failed else 0


def _status(answer, label: str) -> int:
    """A child's exit status (0 or 1), checked.

    Raises:
        ModuleError: anything else (``field`` ``child``).
    """
    if answer not in (0, 1) or isinstance(answer, bool):
        raise ModuleError("the child process running the program sent an "
                          "answer of another shape", name=label, field="child",
                          value=type(answer).__name__)
    return int(answer)


def _crashed(exc) -> int:
    """``check-module``'s and ``benchmark-module``'s end when the child
    running the program died: one line, exit status 1."""
    sys.stdout.flush()
    print(for_terminal(f"hal-cpu: error: {exc}", "hal-cpu"), file=sys.stderr)
    return 1


def _vm_check_module(args, files, hosts, arch) -> int:
    from ..programs import EvaluationError
    from ..programs.vm.refs import VmError
    label = SOURCES.get(files[-1], files[-1])
    modules, arch = vm_arch(files, arch)
    loaded: list = []

    def run(_note) -> int:
        failed = 0
        with vm_program(args, files, hosts, arch, modules=modules,
                        host_modules=loaded) as program:
            names = [f.lstrip("@") for f in args.function] or list(program.functions)
            fns = [program.function(f) for f in names]
            for fn in fns:
                if fn.arg_types:
                    print(f"SKIP @{printable(fn.name, 200)} (takes arguments)")
                    continue
                try:
                    fn()
                    messages = program.take_failures()
                except (VmError, EvaluationError) as exc:
                    program.take_failures()
                    messages = [f"error: {exc}"]
                failed += _verdict(fn.name, messages)
            sys.stdout.flush()
            _statistics(args, program)
            return _passed(len(fns), failed, program.arch)

    from ..errors import NativeCrashError
    try:
        return _status(native_child(
            args, label, arch, run, read=files, hosts=hosts, timeout=None,
            prepare=lambda: loaded.extend(load_hosts(hosts))), label)
    except NativeCrashError as exc:
        return _crashed(exc)


# ---------------------------------------------------------------------------
# benchmark-module

def _replayed(fn, inputs, label: str):
    """``--replay``: (callable, its arguments, a note for the report) of
    the call replayed without the VM, its results checked once against a
    call's; the function itself when the call has no replay."""
    import numpy as np

    from ..programs.vm.replay import NoReplayError, record_replay
    try:
        replay = record_replay(fn, inputs)
    except NoReplayError as exc:
        return fn, inputs, f", not replayed: {exc.message}"
    want = [r for r in fn(*inputs) if isinstance(r, np.ndarray)]
    replay.run()
    got = replay.results()
    if len(got) != len(want) or not all(
            g.shape == w.shape and g.tobytes() == w.tobytes()
            for g, w in zip(got, want)):
        raise ModuleError("the replayed call's results differ from the call's",
                          name=label, field="--replay", value=fn.name)
    return replay.run, (), (f", replayed: {replay.dispatches} dispatches in "
                            f"{replay.crossings} crossings")


def cmd_benchmark_module(args) -> int:
    """``hal-cpu benchmark-module``: load the program once, call the function
    repeatedly and print min / median / mean per call, as
    ``iree-benchmark-module`` measures (the first call is a warm-up and not
    counted); with ``--benchmark_format``, Google Benchmark's report
    (:mod:`hal_cpu.cli.gbench`) of ``--benchmark_repetitions`` repetitions
    (default 1) of ``--benchmark_min_time`` each."""
    import re
    import time
    programs, hosts = split_modules(args)
    gb = args.benchmark_format is not None or args.benchmark_out is not None
    files, arch = vm_files(args, programs)
    label = SOURCES.get(files[-1], files[-1])
    min_time = args.benchmark_min_time
    reps = args.benchmark_repetitions
    if gb:
        count, min_time = (min_time, None) if isinstance(min_time, int) else (None, min_time)
        if count is None and min_time is None:
            min_time = 0.5
        rounds = reps or 1
    else:
        count, rounds = None, 1
        if isinstance(min_time, int):
            reps, min_time = min_time, None
        if reps is None and min_time is None:
            min_time = 0.5
    deadline = time.monotonic() + args.timeout if args.timeout else None
    modules, arch = vm_arch(files, arch)
    loaded: list = []

    def measure(fn, inputs) -> list:
        """Google Benchmark's repetitions: ``[(iterations, real, cpu)]``."""
        perf, cpu_clock = time.perf_counter, time.process_time
        out = []
        for _ in range(rounds):
            n, r0, c0 = 0, perf(), cpu_clock()
            while True:
                fn(*inputs)
                n += 1
                now = perf()
                if count is not None:
                    if n >= count:
                        break
                elif now - r0 >= min_time:
                    break
                if deadline is not None and time.monotonic() > deadline:
                    break
            out.append((n, now - r0, cpu_clock() - c0))
        return out

    def run(_note):
        # The whole benchmark runs in one child (natively): the
        # confinement is paid once, not per call.
        with vm_program(args, files, hosts, arch, modules=modules,
                        host_modules=loaded) as program:
            fn = program.function(args.function)
            name = fn.name
            inputs = vm_inputs(fn, args.input, label)
            bench_name = f"BM_{fn.name}/process_time/real_time"
            if args.benchmark_list_tests:
                return str(fn.name), [], "list"
            if (args.benchmark_filter is not None
                    and not re.search(args.benchmark_filter, bench_name)):
                return str(fn.name), [], "filtered"
            fn(*inputs)
            replayed = ""
            if args.replay:
                fn, inputs, replayed = _replayed(fn, inputs, label)
            else:
                # as iree-benchmark-module calls: the inputs made buffer
                # views once, each call's results released unread; each
                # call still runs the whole function with its checks
                fn, inputs = fn.prepared_call(*inputs)
                fn(*inputs)
            if gb:
                measured = measure(fn, inputs)
                _statistics(args, program)
                return str(name), measured, "gbench"
            times: list[float] = []
            perf = time.perf_counter
            start = perf()
            while True:
                t0 = perf()
                fn(*inputs)
                t1 = perf()
                times.append(t1 - t0)
                if reps is not None and len(times) >= reps:
                    break
                if min_time is not None and t1 - start >= min_time and reps is None:
                    break
                if deadline is not None and time.monotonic() > deadline:
                    break
            native = runs_natively(args.backend,
                                   elfloader.arch.by_name(program.arch),
                                   emulation_options(args))
            where = (f"{program.arch}, {'native' if native else 'emulated'}, "
                     f"workers={workers_of(args) or 'auto'}{replayed}")
            _statistics(args, program)
            return str(name), times, where

    if args.benchmark_filter is not None:
        try:
            re.compile(args.benchmark_filter)
        except re.error as exc:
            raise ModuleError(f"not a regular expression: {exc}", name=label,
                              field="--benchmark_filter",
                              value=args.benchmark_filter) from None
    from ..errors import NativeCrashError
    with watchdog(args, label), status_errors(label):
        try:
            answer = native_child(args, label, arch, run, read=files,
                                  hosts=hosts,
                                  prepare=lambda: loaded.extend(load_hosts(hosts)))
        except NativeCrashError as exc:
            return _crashed(exc)
    if (not isinstance(answer, tuple) or len(answer) != 3
            or not isinstance(answer[0], str) or not isinstance(answer[2], str)
            or not isinstance(answer[1], list)):
        raise ModuleError("the child process running the benchmark sent an "
                          "answer of another shape", name=label, field="child",
                          value=type(answer).__name__)
    name, times, where = answer
    if where == "list":
        print(f"BM_{printable(name, 200)}/process_time/real_time")
        return 0
    if where == "filtered":
        print(f"Failed to match any benchmarks against regex: "
              f"{printable(args.benchmark_filter, 200)}", file=sys.stderr)
        return 1
    if where == "gbench":
        return _gbench_report(args, name, times, label)
    if not times or not all(isinstance(t, float) for t in times):
        raise ModuleError("the child process running the benchmark sent an "
                          "answer of another shape", name=label, field="child",
                          value=type(answer).__name__)
    times.sort()
    n = len(times)
    mean = sum(times) / n
    print(f"BM_{printable(name, 200)} ({where}): {n} calls")
    print(f"  per call: min {times[0] * 1e6:.2f} us, median "
          f"{times[n // 2] * 1e6:.2f} us, mean {mean * 1e6:.2f} us")
    return 0


def _statistics(args, program) -> None:
    """``--print_statistics``: what this runtime can say of a program's
    memory after its calls (on stderr, as IREE's tools print their
    allocator's statistics): the device, the bytes of buffers live and the
    limit. IREE's peak/allocated/freed figures are not kept here."""
    if not getattr(args, "print_statistics", False):
        return
    memory = getattr(program.hal, "memory", None)
    live = getattr(memory, "live", 0)
    limit = getattr(memory, "limit", 0)
    device = getattr(args, "device", None) or "local-task"
    print(f"Device: {device}\n[[ hal-cpu buffer memory ]]\n"
          f"  live: {live}B / limit: {limit}B ({program.arch}, "
          f"{len(program.modules)} module(s))", file=sys.stderr, flush=True)


def _package_version() -> str:
    try:
        from importlib.metadata import version
        return version("portable-kernel-runtime")
    except Exception:  # noqa: BLE001 - not installed as a distribution
        return "unknown"


def _gbench_report(args, name: str, measured: list, label: str) -> int:
    """Print (and with ``--benchmark_out`` write) Google Benchmark's report
    of the repetitions a child measured (checked plain data)."""
    from . import gbench
    if not measured or not all(
            isinstance(m, tuple) and len(m) == 3 and isinstance(m[0], int)
            and isinstance(m[1], float) and isinstance(m[2], float)
            for m in measured):
        raise ModuleError("the child process running the benchmark sent an "
                          "answer of another shape", name=label, field="child",
                          value="repetitions")
    unit = args.benchmark_time_unit
    reps = [gbench.Repetition(*m) for m in measured]
    only = bool(args.benchmark_report_aggregates_only)
    rows = gbench.runs(printable(name, 200), reps, unit, only)
    shown = gbench.runs(printable(name, 200), reps, unit,
                        only or bool(args.benchmark_display_aggregates_only))
    ctx = gbench.context(sys.argv[0], _package_version())
    fmt = args.benchmark_format or "console"
    if fmt == "json":
        sys.stdout.write(gbench.json_report(shown, ctx, unit))
    elif fmt == "csv":
        gbench.csv(shown, ctx, unit)
    else:
        gbench.console(shown, ctx, unit)
    sys.stdout.flush()
    if args.benchmark_out:
        import io
        buf = io.StringIO()
        if args.benchmark_out_format == "json":
            buf.write(gbench.json_report(rows, ctx, unit))
        elif args.benchmark_out_format == "csv":
            gbench.csv(rows, ctx, unit, out=buf, err=io.StringIO())
        else:
            gbench.console(rows, ctx, unit, out=buf, err=io.StringIO())
        try:
            with open(args.benchmark_out, "w") as f:
                f.write(buf.getvalue())
        except OSError as exc:
            raise ModuleError(f"cannot write it: {exc.strerror or exc}",
                              name=args.benchmark_out, field="--benchmark_out",
                              value=args.benchmark_out) from None
    return 0


#: Subcommand -> (add its parser to the ``hal-cpu`` subparsers, run it).
COMMANDS = {"run-module": (_run_module_parser, cmd_run_module),
            "check-module": (_check_module_parser, cmd_check_module),
            "benchmark-module": (_benchmark_module_parser, cmd_benchmark_module)}
