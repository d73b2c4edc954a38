"""``hal-cpu run-module``, ``hal-cpu plan`` and ``hal-cpu check-module``:
whole MLIR programs.

``run-module`` compiles a program for an architecture with
:func:`hal_cpu.iree.compile_program` (cached), runs its host program with
:func:`hal_cpu.iree.run_program` (dispatches and transfers through this
runtime, natively or emulated, when the program submits them; host modules
given with ``--module``) and prints the results as ``iree-run-module``
prints them::

    EXEC @matmul
    result[0]: hal.buffer_view
    2x2xf32=[1 2][3 4]

``plan`` prints the steps one call submits (executables, exports, workgroup
counts, constants, bindings, transfers) with a ``hal-cpu run`` command line
per dispatch, and can save the executables (``.so``, or one FatELF ``.sos``
per executable with ``--arch=all``); a program whose steps depend on
computed data has no plan, and ``--trace`` prints the steps of an actual
run instead.

``check-module`` runs every public function of a test program (IREE's
``check.expect_*`` ops) as ``iree-check-module`` does: a line per function,
exit status 1 when any expectation fails.

Inputs are spelled as IREE's ``--input``: ``2x3xf32=1,2,3,4,5,6``,
``4xi32=7`` (splat), ``@file.npy``, ``4xf32=@raw.bin``; a scalar argument
takes a plain number (``1.5``) or ``TYPE=value``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shlex
import sys
from pathlib import Path
from typing import Sequence

import numpy as np

from fatelf import arches

from .buffers import BindingSpecError, format_buffer_view, parse_binding
from .cli_options import (
    INSPECT_TIMEOUT,
    KILL_GRACE,
    Progress,
    add_cpu_flags,
    emulation_options,
    load_limit,
    positive,
    runs_natively,
    seconds,
)
from .cli_options import arch as arch_type
from .errors import HalCpuError
from .interrupt import run_interruptible
from .vmfb import check_source

__all__ = ["ModuleError", "add_parsers", "cmd_run_module", "cmd_plan",
           "cmd_benchmark_module",
           "cmd_check_module", "parse_inputs", "format_plan", "format_result"]


class ModuleError(HalCpuError):
    """A ``run-module`` or ``plan`` command line the program cannot take:
    unknown function, wrong number or shape of inputs, a bad ``--output``
    spec, a program file that cannot be read or compiled. ``name`` is the
    program file, ``field`` the flag, ``value`` the offending value."""


# ---------------------------------------------------------------------------
# command line

def _arch_or_all(text: str) -> str:
    return "all" if text.strip().lower() == "all" else arch_type(text)


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


def _program_flags(p: argparse.ArgumentParser, all_arches: bool,
                   modules: bool = False) -> None:
    if modules:
        p.add_argument("program", nargs="?", default=None,
                       help="the program: a compiled IREE module (.vmfb) or "
                       "MLIR (any input iree-compile accepts); may also be "
                       "given as the last --module")
    else:
        p.add_argument("program", help="MLIR program (any input iree-compile accepts)")
    p.add_argument("--function", help="public function to call (may be omitted "
                   "when the program has one)")
    p.add_argument("--input", action="append", default=[], metavar="SPEC",
                   help="one per function argument, in order: 2x3xf32=1,2,3,4,5,6 "
                   "| 4xi32=7 (splat) | 2x8xi32 (zeros) | @file.npy | "
                   "4xf32=@raw.bin | a scalar: 1.5 or f32=1.5")
    p.add_argument("--cache_dir", metavar="DIR", help="where compiled programs "
                   "are kept (default: $PKR_COMPILE_CACHE, else the user cache "
                   "directory); a program is compiled once per architecture")
    p.add_argument("--compile_flag", action="append", default=[], metavar="FLAG",
                   help="an extra iree-compile flag, e.g. "
                   "--compile_flag=--iree-execution-model=host-only (repeatable)")
    if modules:
        p.add_argument("--module", action="append", default=[], metavar="FILE",
                       help="a module, as iree-run-module takes it: a compiled "
                       "module (.vmfb) or MLIR; modules link in order and the "
                       "last one's function runs; a Python host module "
                       "(.py) is also accepted here (repeatable)")
        p.add_argument("--host_module", action="append", default=[],
                       metavar="SPEC",
                       help="a Python host module the program imports: "
                       "path.py[@create_fn][?key=value&...] (create_fn("
                       "max_version, params), default create_module) or an "
                       "installed entry point of group hal_cpu.host_modules; "
                       "later ones win (repeatable)")
        p.add_argument("--device", default=None, metavar="URI",
                       help="local-task (default: several host threads per "
                       "dispatch) or local-sync (one), as IREE's tools")
    else:
        p.add_argument("--module", action="append", default=[], metavar="SPEC",
                       help="a host module the program imports: path.py[@create_fn]"
                       "[?key=value&...] (create_fn(max_version, params), default "
                       "create_module) or an installed entry point of group "
                       "hal_cpu.host_modules; later ones win (repeatable)")
    if all_arches:
        p.add_argument("--arch", type=_arch_or_all, metavar="ARCH",
                       help="architecture to compile for: "
                       + ", ".join(arches.RUNTIME_ARCHES) + ", an alias, or all "
                       "(plan for each; --save_dir writes FatELF bundles); "
                       "default: this machine's")
    else:
        p.add_argument("--arch", type=arch_type, metavar="ARCH",
                       help="architecture to compile for and run: "
                       + ", ".join(arches.RUNTIME_ARCHES) + " or an alias "
                       "(amd64, arm64, rv32...); default: this machine's")


def add_parsers(sub) -> None:
    """Register ``run-module``, ``plan`` and ``check-module`` on the
    ``hal-cpu`` subparsers."""
    import elfloader

    p = sub.add_parser("run-module", help="run a compiled IREE module (.vmfb) "
                       "or an MLIR program (compiled first) through this "
                       "runtime on any architecture and print the results as "
                       "iree-run-module does")
    _program_flags(p, all_arches=False, modules=True)
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
    add_cpu_flags(p)

    p = sub.add_parser("plan", help="compile an MLIR program and print the "
                       "dispatches and transfers one call performs, with a "
                       "hal-cpu run command line per dispatch")
    _program_flags(p, all_arches=True)
    p.add_argument("--save_dir", metavar="DIR", help="write the executables "
                   "there: <executable>_<arch>.so, or <executable>.sos (FatELF, "
                   "all six architectures) with --arch=all; and the constant "
                   "buffers the printed run lines bind")
    p.add_argument("--cpu", metavar="PROFILE", default=None,
                   help="compile for this CPU profile of the architecture "
                   "(hal-cpu profiles lists them); --trace runs emulated on "
                   "it and the printed run lines name it")
    p.add_argument("--vlen", type=positive, metavar="BITS", default=None,
                   help="vector length of a scalable --cpu profile (SVE VL, "
                   "RVV VLEN), e.g. 128, 256, 512: --trace runs at it and "
                   "the printed run lines name it")
    p.add_argument("--engine", choices=("auto", "qemu", "unicorn"),
                   default=None, help="emulation engine of --trace and of "
                   "the printed run lines (default auto)")
    p.add_argument("--trace", action="store_true", help="run the program "
                   "(emulated unless --arch is this machine's) and print the steps "
                   "it actually ran; for programs whose steps depend on data")
    p.add_argument("--executable_plugin", action="append", default=[],
                   metavar="SPEC", help="plugin resolving the executables' imports, "
                   "for --trace and on every printed run line (as run-module; "
                   "repeatable)")

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
    add_cpu_flags(p)

    p = sub.add_parser("benchmark-module", help="time calls of a function of "
                       "a compiled module (.vmfb) or MLIR program loaded once, "
                       "as iree-benchmark-module does, on any architecture")
    _program_flags(p, all_arches=False, modules=True)
    p.add_argument("--backend", choices=elfloader.backend.KINDS, default="auto",
                   help="native, emulated, or auto (default)")
    p.add_argument("--executable_plugin", action="append", default=[],
                   metavar="SPEC", help="plugin resolving the executables' "
                   "imports (repeatable)")
    p.add_argument("--workers", type=positive, default=None,
                   help="host threads running workgroups")
    p.add_argument("--benchmark_repetitions", type=positive, default=None,
                   metavar="N", help="time N calls (default: as many as "
                   "--benchmark_min_time allows)")
    _add_memory_limit(p)
    p.add_argument("--benchmark_min_time", type=_min_time, default=None,
                   metavar="T", help="call for at least T seconds (0.5, 0.5s) "
                   "or exactly N times (100x); default 0.5s")
    p.add_argument("--timeout", type=seconds, default=None, metavar="S",
                   help="stop after S seconds in all")
    add_cpu_flags(p)


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
# compiling, inputs, planning

def _cache_dir(args) -> str | None:
    return args.cache_dir or os.environ.get("PKR_COMPILE_CACHE") or None


def compile_for(program: str, arch: str, cache_dir: str | None = None,
                extra_flags: Sequence[str] = (), cpu: str | None = None,
                timeout: float | None = None):
    """:func:`hal_cpu.iree.compile_program` for the command line.

    Raises:
        ModuleError: the program file is missing or unreadable.
        hal_cpu.iree.IreeToolError: ``iree-compile`` missing or another
            version (one line).
        hal_cpu.iree.CompileError: the compiler's first error line (the
            full diagnostics are on the exception's ``diagnostics``).
    """
    from .iree import CompileError, compile_program
    path = Path(program)
    if not path.is_file():
        raise ModuleError("no such file", name=program, field="program", value=program)
    try:
        return compile_program(path, arch, cache_dir, extra_flags=list(extra_flags),
                               cpu=cpu, timeout=timeout)
    except CompileError as exc:
        if exc.message.startswith("iree-compile did not finish"):
            raise CompileError(f"{exc.message} compiling for {arch}", name=program,
                               field="iree-compile", value=exc.value) from None
        text = str(exc)
        lines = [ln.strip() for ln in text.splitlines()]
        first = next((ln for ln in lines if "error:" in ln), lines[-1] if lines else text)
        err = CompileError(f"iree-compile failed for {arch}: {first}", name=program,
                           field="iree-compile", value=exc.value)
        err.diagnostics = text
        raise err from None
    except OSError as exc:
        raise ModuleError(f"cannot read or compile it: {exc.strerror or exc}",
                          name=program, field="program", value=program) from None


def _pick_function(compiled, name: str | None, program: str) -> str:
    if name is None:
        if len(compiled.functions) != 1:
            raise ModuleError(f"has public functions {', '.join(compiled.functions) or 'none'}; "
                              "name one with --function", name=program,
                              field="--function", value=None)
        return compiled.functions[0]
    name = name.lstrip("@")
    if name not in compiled.functions:
        raise ModuleError(f"no public function @{name}; have "
                          f"{', '.join('@' + f for f in compiled.functions) or 'none'}",
                          name=program, field="--function", value=name)
    return name


def _scalar(spec: str, ty: str, index: int, program: str):
    from .iree.scalars import float_dtype, int_width
    text = spec
    head, sep, body = spec.partition("=")
    if sep:
        if head.strip() != ty:
            raise ModuleError(f"argument {index} is a {ty} scalar; {spec!r} names "
                              f"{head.strip()!r}", name=program, field="--input", value=spec)
        text = body
    try:
        if int_width(ty) is not None:
            return int(text.strip(), 0)
        if float_dtype(ty) is not None:
            return float(text)
    except ValueError:
        pass
    raise ModuleError(f"argument {index} is a {ty} scalar; {spec!r} is not one",
                      name=program, field="--input", value=spec)


def parse_inputs(compiled, function: str, specs: Sequence[str],
                 program: str | None = None) -> list:
    """The function's arguments from ``--input`` specs: numpy arrays for
    tensor arguments (:func:`hal_cpu.buffers.parse_binding`), Python ints or
    floats for scalar ones.

    Raises:
        ModuleError: wrong number of specs, or a scalar spec that is not a
            number of the argument's type.
        BindingSpecError: a tensor spec that cannot be parsed.
    """
    from .iree import load_program
    program = program or str(compiled.source)
    arg_types = load_program(compiled.hal_mlir).functions[function].arg_types
    if len(specs) != len(arg_types):
        kinds = ", ".join("tensor" if t.startswith("!hal.buffer_view") else t
                          for t in arg_types)
        raise ModuleError(f"@{function} takes {len(arg_types)} inputs ({kinds}); "
                          f"{len(specs)} --input given", name=program,
                          field="--input", value=len(specs))
    values = []
    for i, (ty, spec) in enumerate(zip(arg_types, specs)):
        if ty.startswith("!hal.buffer_view"):
            values.append(parse_binding(spec))
        else:
            values.append(_scalar(spec, ty.strip(), i, program))
    return values


def _plan(compiled, inputs, function: str, program: str, modules=None):
    from .iree import DataDependenceError, plan_program
    try:
        return plan_program(compiled, inputs, function, modules=modules)
    except DataDependenceError as exc:
        exc.detail += "; hal-cpu plan --trace prints the steps of an actual run"
        raise exc.located() from None
    except (ValueError, TypeError) as exc:
        raise ModuleError(str(exc), name=program, field="--input",
                          value=None) from None


def _modules(specs: Sequence[str]):
    """A :class:`hal_cpu.iree.ModuleRegistry` with the ``--module`` specs
    loaded in order."""
    from .iree import ModuleRegistry, load_module_spec
    return ModuleRegistry([load_module_spec(s) for s in specs])


def _run(compiled, inputs, function: str, program: str, runner, modules,
         memory_limit: int | None = None, timeout: float | None = None):
    from .iree import EvaluationError, run_program
    try:
        return run_program(compiled, inputs, function, runner, modules=modules,
                           memory_limit=memory_limit, timeout=timeout)
    except EvaluationError:
        raise
    except (ValueError, TypeError) as exc:
        raise ModuleError(str(exc), name=program, field="--input",
                          value=None) from None


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


def _results_text(args, function: str, results, types, announced: bool) -> str:
    """What ``run-module`` prints of a call's results (``EXEC @f`` unless
    ``announced``, then each result, or the ``--output`` specs' ``-``
    ones), writing the ``--output`` files on the way. Called in the process
    that holds the results (a child for a native run), so large results
    never travel between processes; only the printed text does."""
    limit = args.output_max_element_count
    text = [] if announced else [f"EXEC @{function}"]
    if args.output:
        for spec, array in zip(args.output, results):
            if spec == "-":
                text += ["hal.buffer_view", format_buffer_view(array, limit)]
            elif spec:
                path, mode = spec[1:], ("wb" if spec[0] == "@" else "ab")
                with open(path, mode) as f:
                    if path.endswith(".npy"):
                        np.save(f, array)
                    else:
                        f.write(np.ascontiguousarray(array).tobytes())
    else:
        for i, (value, ty) in enumerate(zip(results, types)):
            text.append(f"result[{i}]: {format_result(value, ty, limit)}")
    return "\n".join(text)


def _max_abs_error(got: np.ndarray, want: np.ndarray) -> str:
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
    return ty.lstrip("!")


def _runner_stack(stack, args, arch: str, note=None, backend: str | None = None,
                  progress=None):
    """A ``run_dispatch`` callback for :func:`hal_cpu.iree.run_program`: a
    :class:`hal_cpu.iree.PlanRunner` (and the plugins, or the emulated
    machine of ``--engine``/``--cpu``/``--vlen``) entered on ``stack``.
    ``note(text)`` hears where the run is (as :func:`hal_cpu.isolate.run_in_child`
    takes it); ``backend`` overrides ``--backend``."""
    from .iree import PlanRunner
    note = note or (lambda _text: None)
    backend = backend or getattr(args, "backend", "auto")
    plugins = None
    emulation = emulation_options(args)
    if args.executable_plugin or emulation:
        # Executables and plugins share the plugins' machine (and with it the
        # engine and CPU profile).
        from .plugins import PluginManager
        note("while loading the plugins")
        plugins = stack.enter_context(PluginManager.from_specs(
            args.executable_plugin, arch=arch, backend=backend,
            timeout=load_limit(args), **emulation))
    runner = stack.enter_context(PlanRunner(
        backend=backend, arch=arch, plugins=plugins,
        workers=getattr(args, "workers", None), timeout=getattr(args, "timeout", None),
        progress=progress))

    def stop():
        # Ctrl-C stops the emulated CPUs of every executable at once.
        for exe in list(runner.executables.values()):
            exe.backend.stop_workers(256)

    def dispatch(step, bindings):
        note(f"in export {step.export_name}")
        # The interpreter stays on this thread, where Ctrl-C interrupts it
        # between ops; a dispatch runs where Ctrl-C can stop its CPUs.
        run_interruptible(lambda: runner(step, bindings), stop)
    return dispatch


def _sendable(run, announced: bool):
    """``(run, announced)`` with the results a child process may not be able
    to send back (interpreter objects such as a returned ``!hal.buffer``)
    replaced by None; :func:`format_result` prints those by their type
    alone."""
    run.results = [v if isinstance(v, (np.ndarray, np.generic)) else None
                   for v in run.results]
    run.constants = {}      # only plans print them; a module's may be large
    return run, announced


def _check_failures(run, program: str) -> None:
    if run.check_failures:
        for text in run.check_failures:
            print(f"check failed: {text}", file=sys.stderr)
        raise ModuleError(f"{len(run.check_failures)} check expectation(s) failed in "
                          f"@{run.function}", name=program, field="check",
                          value=len(run.check_failures))


def cmd_run_module(args) -> int:
    """``hal-cpu run-module``: see the module docstring."""
    from . import vmfb
    programs, hosts = _split_modules(args)
    with _watchdog(args, programs[-1]):
        if any(vmfb.is_module_file(p) for p in programs) or len(programs) > 1:
            files, arch = _vm_files(args, programs)
            return _vm_run_module(args, files, hosts, arch)
        return _mlir_run_module(args, programs[0], hosts)


def _mlir_run_module(args, program: str, hosts: list[str]) -> int:
    args.program = program
    args.module = hosts
    check_source(program)
    arch = args.arch or arches.host_arch()
    compiled = compile_for(program, arch, _cache_dir(args), args.compile_flag,
                           getattr(args, "cpu", None), getattr(args, "timeout", None))
    function = _pick_function(compiled, args.function, program)
    inputs = parse_inputs(compiled, function, args.input, program)
    modules = _modules(args.module)
    from .iree import load_program
    n_results = len(load_program(compiled.hal_mlir).functions[function].result_types)
    if args.output and len(args.output) != n_results:
        raise ModuleError(f"{len(args.output)} --output given; @{function} has "
                          f"{n_results} results", name=program,
                          field="--output", value=len(args.output))
    _check_outputs(args.output, program)

    def run(note, backend=args.backend):
        progress = Progress(not args.no_progress)
        announced = []

        def announce():
            # the header goes ahead of what host modules print
            progress.close()
            print(f"EXEC @{function}", flush=True)
            announced.append(True)
        modules.before_first_call = announce
        try:
            with contextlib.ExitStack() as stack:
                dispatch = _runner_stack(stack, args, arch, note, backend, progress)
                done = _run(compiled, inputs, function, program, dispatch, modules,
                            getattr(args, "memory_limit", None),
                            getattr(args, "timeout", None))
        finally:
            progress.close()
        return done, bool(announced)

    def finish(done, announced):
        text = _results_text(args, function, done.results, done.result_types,
                             announced)
        if not args.compare:        # (only --compare needs them afterwards)
            done.results = [None] * len(done.results)
        return done, text

    import elfloader
    if (runs_natively(args.backend, elfloader.arch.by_name(arch),
                       emulation_options(args))
            and hasattr(os, "fork") and not args.module):
        # As hal-cpu run: native kernels run in a child process, so a crash
        # is reported (then located by an emulated run) instead of ending
        # hal-cpu; --timeout bounds the child. A program with --module runs
        # in process, without that isolation: a host module is arbitrary
        # Python (its threads do not survive fork(), what it prints goes to
        # this process's sys.stdout, its objects among the results need not
        # pickle).
        from .errors import NativeCrashError
        from .isolate import run_in_child
        try:
            done, text = run_in_child(
                lambda note: _sendable(*finish(*run(note))), name=program,
                timeout=args.timeout and args.timeout + KILL_GRACE)
        except NativeCrashError as exc:
            print(f"hal-cpu: error: {exc}", file=sys.stderr)
            _diagnose_plan(run, arch, program)
            return 1
    else:
        done, text = finish(*run(lambda _text: None))
    if text:
        print(text)
    _check_failures(done, program)
    if args.compare:
        _compare(args, program, function, inputs, done.results)
    return 0


def _diagnose_plan(run, arch: str, program: str) -> None:
    """Run the program again emulated and print where it faults."""
    import elfloader
    from fatelf.errors import PortableKernelError
    print(f"hal-cpu: running the program again emulated ({arch}) to find "
          "the fault:", file=sys.stderr)
    try:
        run(lambda _text: None, "emulated")
    except elfloader.EmulationError as exc:
        print(exc if exc.name else exc.with_name(program), file=sys.stderr)
    except PortableKernelError as exc:
        print(f"hal-cpu: the emulated run stopped without a CPU fault: {exc}",
              file=sys.stderr)
    else:
        print("hal-cpu: the emulated run finished without a fault",
              file=sys.stderr)


def _compare(args, program: str, function: str, inputs: list,
             results: list) -> None:
    """``--compare``: run the program with IREE's own runtime on this
    machine and print the max abs error of each result it returns; when
    IREE cannot run the program (a host module it has no native
    counterpart of, a plugin it cannot load, no host build...), one line
    says so and why. Never fails the command: our run already succeeded."""
    from fatelf.errors import PortableKernelError

    from .iree import reference_run
    host = arches.host_arch()

    def cannot(why: str) -> None:
        print(f"compare: IREE's runtime cannot run @{function} here: {why}; "
              "nothing compared")

    try:
        host_compiled = compile_for(program, host, _cache_dir(args),
                                    args.compile_flag)
        want = reference_run(host_compiled.vmfb, function, inputs,
                             executable_plugins=args.executable_plugin)
    except PortableKernelError as exc:
        cannot(_first_line(exc.message if hasattr(exc, "message") else str(exc)))
        return
    except Exception as exc:  # noqa: BLE001 - IREE's runtime raises anything
        # IREE's status text: "where: CODE; what" -> what
        why = _first_line(str(exc)).rpartition("; ")[2] or type(exc).__name__
        if args.module:
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


# ---------------------------------------------------------------------------
# plan

def _where(b) -> str:
    what = {"input": "input", "constant": "constant"}.get(b.kind, "buffer")
    return f"{what} {b.ref} [{b.offset}, {b.offset + b.length}) ({b.length} bytes)"


def _ordinals(so_path: Path) -> dict[str, int]:
    """Export name -> ordinal, read from the library under emulation without
    running its initializers (as ``hal-cpu inspect`` does)."""
    import elfloader

    from .library import Executable
    image = elfloader.read_image(so_path)
    with Executable(image, backend="emulated", initialize=False,
                    bind_imports=False, timeout=INSPECT_TIMEOUT) as exe:
        return {e.name: e.ordinal for e in exe.exports if e.name is not None}


#: Known bytes of a binding (a constant, part of an input) up to this many
#: are written into the ``run:`` line; more go to a file it names.
INLINE_BYTES = 64


class _Bytes:
    """Where the ``run:`` lines of a plan find bytes known before running
    (constants, slices of inputs): ``directory`` receives files for those
    over :data:`INLINE_BYTES` (created on first use)."""

    def __init__(self, directory: Path | None):
        self.directory = directory

    def spec(self, data: np.ndarray, name: str) -> str:
        data = np.ascontiguousarray(data, np.uint8).reshape(-1)
        values = data.view(np.int8)
        if data.size <= INLINE_BYTES or self.directory is None:
            return f"{data.size}xi8=" + ",".join(str(int(v)) for v in values)
        safe = "".join(c if c.isalnum() or c in "._-" else "_" for c in name)
        path = self.directory / f"{safe}.bin"
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            if not (path.is_file() and path.read_bytes() == data.tobytes()):
                path.write_bytes(data.tobytes())
        except OSError:
            return f"{data.size}xi8=" + ",".join(str(int(v)) for v in values)
        return f"{data.size}xi8=@{path}"


def _typed(b, results) -> str | None:
    """``37x29xf32`` for a binding that is exactly a result's range,
    ``{n}xf32`` for one holding only results of one element type (one
    allocation holding several results); None otherwise."""
    inside = [r for r in results
              if (r.storage.kind, r.storage.ref) == (b.kind, b.ref)
              and b.offset <= r.storage.offset
              and r.storage.offset + r.storage.length <= b.offset + b.length]
    try:
        for r in inside:
            if r.storage == b:
                return "x".join([str(d) for d in r.shape] + [_type_name(r.dtype)])
        kinds = {np.dtype(r.dtype) for r in inside}
        if len(kinds) == 1:
            (dtype,) = kinds
            from .buffers import dtype_name
            if dtype.itemsize and b.length % dtype.itemsize == 0:
                return f"{b.length // dtype.itemsize}x{dtype_name(dtype)}"
    except BindingSpecError:
        pass
    return None


def _binding_spec(b, inputs: list, input_specs: Sequence[str], results,
                  constants=None, known: "_Bytes | None" = None) -> str:
    """A ``hal-cpu run --binding`` spec for binding ``b``: the input's own
    spec when it is a whole input; the bytes themselves (inline, or a file
    of ``known``) for a constant or part of an input; zeros typed as the
    results it holds (``37x29xf32``) for a result's range; else
    zero-filled bytes (a buffer the program computes)."""
    if (b.kind == "input" and b.offset == 0
            and b.length == getattr(inputs[b.ref], "nbytes", -1)):
        return input_specs[b.ref]
    known = known or _Bytes(None)
    if b.kind == "constant" and constants and b.ref in constants:
        data = np.asarray(constants[b.ref], np.uint8).reshape(-1)
        return known.spec(data[b.offset:b.offset + b.length],
                          f"constant_{b.ref}_{b.offset}_{b.length}")
    if b.kind == "input" and hasattr(inputs[b.ref], "shape"):
        data = np.ascontiguousarray(inputs[b.ref]).reshape(-1).view(np.uint8)
        return known.spec(data[b.offset:b.offset + b.length],
                          f"input_{b.ref}_{b.offset}_{b.length}")
    return _typed(b, results) or f"{b.length}xi8"


def format_plan(plan, compiled, inputs: list, input_specs: Sequence[str],
                so_paths: dict | None = None, run_flags: Sequence[str] = (),
                data_dir: Path | None = None) -> str:
    """Text of ``hal-cpu plan``: the buffers, each step, the results.

    ``so_paths`` maps a dispatch's ``so_path`` to the file (and ``--arch``)
    the printed ``hal-cpu run`` command should name, e.g. a saved copy;
    ``run_flags`` go on every ``run:`` line (plugins, CPU profile);
    ``data_dir`` receives the bytes of constants the lines bind (default:
    a ``constants`` directory beside the compiled program).
    """
    lines = [f"program:   {compiled.source}",
             f"function:  @{plan.function}",
             f"arch:      {compiled.arch}"]
    for i, v in enumerate(inputs):
        if hasattr(v, "shape"):
            shape = "x".join([str(d) for d in v.shape] + [_type_name(v.dtype)])
            lines.append(f"input {i}:   {shape} ({v.nbytes} bytes)")
        else:
            lines.append(f"input {i}:   scalar {v!r}")
    for name, size in plan.buffers.items():
        lines.append(f"buffer {name}: {size} bytes (allocated by the program)")
    constants = getattr(plan, "constants", None) or {}
    for name, data in constants.items():
        lines.append(f"constant {name}: {np.asarray(data).size} bytes (carried "
                     "by the module)")
    if data_dir is None:
        hal = getattr(compiled, "hal_mlir", None)
        data_dir = Path(hal).parent / "constants" if hal is not None else None
    known = _Bytes(data_dir)
    ordinals: dict[Path, dict[str, int]] = {}
    written: set = set()
    for k, step in enumerate(plan.steps):
        kind = type(step).__name__
        if kind == "Dispatch":
            if step.so_path not in ordinals:
                ordinals[step.so_path] = _ordinals(step.so_path)
            ordinal = ordinals[step.so_path].get(step.export_name, "?")
            so, arch_flag = (so_paths or {}).get(step.so_path, (step.so_path, None))
            wc = ",".join(map(str, step.workgroup_count))
            lines += [f"step {k}: dispatch",
                      f"  executable:  {so}",
                      f"  export:      {step.export_name} (ordinal {ordinal})",
                      f"  workgroups:  {wc}",
                      "  constants:   " + (" ".join(str(c) for c in step.constants)
                                           if step.constants else "none")]
            for j, b in enumerate(step.bindings):
                notes = []
                if (b.kind, b.ref) in written:
                    notes.append("written by an earlier step")
                same = [i for i, o in enumerate(step.bindings[:j])
                        if (o.kind, o.ref) == (b.kind, b.ref)
                        and o.offset < b.offset + b.length and b.offset < o.offset + o.length]
                if same:
                    notes.append("overlaps binding " + ", ".join(map(str, same)))
                note = f" ({'; '.join(notes)})" if notes else ""
                lines.append(f"  binding {j}:   {_where(b)}{note}")
            cmd = ["hal-cpu", "run", str(so), f"--function={step.export_name}",
                   f"--workgroup_count={wc}"]
            if arch_flag:
                cmd.append(f"--arch={arch_flag}")
            cmd += list(run_flags)
            cmd += [f"--constant={c}" for c in step.constants]
            cmd += ["--binding=" + _binding_spec(b, inputs, input_specs, plan.results,
                                                 constants, known)
                    for b in step.bindings]
            lines.append("  run:         " + " ".join(shlex.quote(c) for c in cmd))
            written.update((b.kind, b.ref) for b in step.bindings)
        elif kind == "FillStep":
            pattern = int.from_bytes(step.pattern, "little")
            width = 2 * len(step.pattern) + 2
            lines.append(f"step {k}: fill {_where(step.target)} with the "
                         f"{len(step.pattern)}-byte pattern {pattern:#0{width}x}")
            written.add((step.target.kind, step.target.ref))
        else:
            lines.append(f"step {k}: copy {_where(step.source)} to {_where(step.target)}")
            written.add((step.target.kind, step.target.ref))
    for i, r in enumerate(plan.results):
        shape = "x".join([str(d) for d in r.shape] + [_type_name(r.dtype)])
        lines.append(f"result {i}:  {shape} in {_where(r.storage)}")
    return "\n".join(lines)


def _type_name(dtype) -> str:
    from .buffers import dtype_name
    try:
        return dtype_name(dtype)
    except BindingSpecError:
        return str(dtype)


def cmd_plan(args) -> int:
    """``hal-cpu plan``: see the module docstring."""
    from . import vmfb
    program = args.program
    if vmfb.is_module_file(program):
        return _vm_plan(args, program)
    check_source(program)
    targets = (list(arches.RUNTIME_ARCHES) if args.arch == "all"
               else [args.arch or arches.host_arch()])
    save = Path(args.save_dir) if args.save_dir else None
    if save is not None:
        try:
            save.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ModuleError(f"cannot create it: {exc.strerror or exc}",
                              name=str(save), field="--save_dir", value=str(save)) from None
    plans = []
    modules = _modules(args.module)
    for arch in targets:
        _check_cpu(args, arch)
        compiled = compile_for(program, arch, _cache_dir(args), args.compile_flag,
                               getattr(args, "cpu", None), getattr(args, "timeout", None))
        function = _pick_function(compiled, args.function, program)
        inputs = parse_inputs(compiled, function, args.input, program)
        if args.trace:
            plans.append((compiled, inputs, _trace(args, compiled, inputs, function,
                                                   program, modules)))
        else:
            plans.append((compiled, inputs, _plan(compiled, inputs, function, program,
                                                  modules)))

    so_paths: dict[Path, tuple[Path, str | None]] = {}
    if save is not None:
        so_paths = _save(plans, save, bundle=args.arch == "all")
    for n, (compiled, inputs, plan) in enumerate(plans):
        if n:
            print()
        print(format_plan(plan, compiled, inputs, args.input, so_paths,
                          run_flags=_run_flags(args),
                          data_dir=save / "constants" if save is not None else None))
    if save is not None:
        for path in sorted({p for p, _ in so_paths.values()}):
            print(f"saved: {path}")
    return 0


def _check_cpu(args, arch: str) -> None:
    """That ``--cpu`` and ``--vlen`` suit ``arch`` (a profile of it, a
    vector length the profile takes), before anything compiles.

    Raises:
        elfloader.EngineError: as :func:`elfloader.backend.emulated.engine.resolve_profile`.
    """
    if args.cpu is None and args.vlen is None:
        return
    import elfloader
    from elfloader.backend.emulated.engine import resolve_profile
    resolve_profile(elfloader.arch.by_name(arch), args.cpu, args.vlen)


def _run_flags(args) -> list[str]:
    """``hal-cpu run`` flags every ``run:`` line of a plan carries: the
    plugins, and the CPU the plan was made for."""
    flags = [f"--executable_plugin={spec}" for spec in args.executable_plugin]
    if args.cpu:
        flags.append(f"--cpu={args.cpu}")
    if args.vlen:
        flags.append(f"--vlen={args.vlen}")
    if args.engine:
        flags.append(f"--engine={args.engine}")
    return flags


def _trace(args, compiled, inputs, function: str, program: str, modules):
    """The steps an actual run performed, as a plan (its results are the
    ranges the run returned, where it returned buffer views)."""
    from .iree import ProgramPlan
    with contextlib.ExitStack() as stack:
        dispatch = _runner_stack(stack, args, compiled.arch)
        run = _run(compiled, inputs, function, program, dispatch, modules)
    return ProgramPlan(function, run.trace, run.allocations, [],
                       dict(getattr(run, "constants", {}) or {}))


def cmd_check_module(args) -> int:
    """``hal-cpu check-module``: every public function (or those named), one
    line each: ``PASS @f`` or ``FAIL @f`` followed by IREE's messages for the
    failed expectations, indented; exit status 1 when any function fails."""
    from . import vmfb
    programs, hosts = _split_modules(args)
    with _watchdog(args, programs[-1]):
        if any(vmfb.is_module_file(p) for p in programs) or len(programs) > 1:
            files, arch = _vm_files(args, programs)
            return _vm_check_module(args, files, hosts, arch)
        return _mlir_check_module(args, programs[0], hosts)


def _mlir_check_module(args, program: str, hosts: list[str]) -> int:
    from .iree import EvaluationError, load_program
    args.program = program
    args.module = hosts
    check_source(program)
    arch = args.arch or arches.host_arch()
    compiled = compile_for(program, arch, _cache_dir(args), args.compile_flag,
                           getattr(args, "cpu", None), getattr(args, "timeout", None))
    functions = [f.lstrip("@") for f in args.function] or list(compiled.functions)
    for f in functions:
        _pick_function(compiled, f, program)
    ir = load_program(compiled.hal_mlir)
    failed = 0
    with contextlib.ExitStack() as stack:
        dispatch = _runner_stack(stack, args, arch)
        for f in functions:
            if ir.functions[f].arg_types:
                print(f"SKIP @{f} (takes arguments)")
                continue
            modules = _modules(args.module)
            try:
                run = _run(compiled, [], f, program, dispatch, modules,
                           getattr(args, "memory_limit", None),
                           getattr(args, "timeout", None))
                messages = run.check_failures
            except EvaluationError as exc:
                messages = [f"error: {exc}"]
            if messages:
                failed += 1
                print(f"FAIL @{f}")
                for text in messages:
                    print("    " + text.replace("\n", "\n    "))
            else:
                print(f"PASS @{f}")
    print(f"{len(functions) - failed} of {len(functions)} functions passed ({arch})")
    return 1 if failed else 0


def _save(plans, directory: Path, bundle: bool) -> dict:
    """Write each executable a plan dispatches; returns ``so_path -> (saved
    file, --arch for it or None)``."""
    import fatelf
    by_exe: dict[str, list[tuple[str, Path]]] = {}
    for compiled, _, plan in plans:
        for d in plan.dispatches:
            entry = (compiled.arch, d.so_path)
            lst = by_exe.setdefault(d.executable, [])
            if entry not in lst:
                lst.append(entry)
    out: dict[Path, tuple[Path, str | None]] = {}
    for exe, entries in by_exe.items():
        if bundle:
            target = directory / f"{exe}.sos"
            target.write_bytes(fatelf.join([so.read_bytes() for _, so in entries],
                                           names=[str(so) for _, so in entries]))
            for arch, so in entries:
                out[so] = (target, arch)
        else:
            for arch, so in entries:
                target = directory / f"{exe}_{arch}.so"
                target.write_bytes(so.read_bytes())
                out[so] = (target, None)
    return out


# ---------------------------------------------------------------------------
# compiled modules (.vmfb): the VM path

def _is_host_spec(spec: str) -> bool:
    """Whether a ``--module`` value names a Python host module (a ``.py``
    file, with ``@create_fn`` / ``?params``) or an installed entry point,
    rather than a program file."""
    path = spec.partition("?")[0].partition("@")[0]
    if path.endswith(".py"):
        return True
    return not os.path.exists(path) and "/" not in path and "." not in path


def _split_modules(args) -> tuple[list[str], list[str]]:
    """``(program files in link order, host module specs)`` from the
    positional program, ``--module`` and ``--host_module``."""
    programs, hosts = [], []
    for spec in getattr(args, "module", []) or []:
        (hosts if _is_host_spec(spec) else programs).append(spec)
    hosts += getattr(args, "host_module", []) or []
    if args.program is not None:
        programs.append(args.program)
    if not programs:
        # a usage error, as argparse reports a missing argument
        print(f"usage: hal-cpu {args.command} [program] [--module=FILE ...] ...\n"
              f"hal-cpu {args.command}: error: no program: pass a .vmfb or "
              "MLIR file, or --module=FILE", file=sys.stderr)
        raise SystemExit(2)
    return programs, hosts


def _workers(args) -> int | None:
    device = getattr(args, "device", None)
    if device not in (None, "local-task", "local-sync", "local"):
        raise ModuleError("this runtime runs on the local CPU: use local-task "
                          "or local-sync", field="--device", value=device)
    if getattr(args, "workers", None) is not None:
        return args.workers
    return 1 if device == "local-sync" else None


def _vm_files(args, programs: Sequence[str]) -> tuple[list[str], str | None]:
    """The ``.vmfb`` files to link (MLIR programs compiled first, for
    ``--arch`` or this machine) and the architecture asked for."""
    from . import vmfb
    arch = args.arch
    files = []
    for p in programs:
        if vmfb.is_module_file(p):
            files.append(p)
            continue
        check_source(p)
        compiled = compile_for(p, arch or arches.host_arch(), _cache_dir(args),
                               getattr(args, "compile_flag", []),
                               getattr(args, "cpu", None), getattr(args, "timeout", None))
        files.append(str(compiled.vmfb))
        arch = arch or compiled.arch
    return files, arch


@contextlib.contextmanager
def _vm_program(args, files: Sequence[str], hosts: Sequence[str], arch: str | None,
                trace: list | None = None):
    """Load and link the modules; closes them on exit."""
    from .vm import load_program
    from .vm.module_def import read_module
    from .vm.program import module_arch
    host_modules = []
    if hosts:
        from .iree.host_modules import load_module_spec
        host_modules = [load_module_spec(s) for s in hosts]
    files = [read_module(f, name=f) for f in files]
    if arch is None:
        arch = module_arch(files[-1]) or arches.host_arch()
    emulation = emulation_options(args)
    with contextlib.ExitStack() as stack:
        plugins = None
        if args.executable_plugin or emulation:
            from .plugins import PluginManager
            plugins = stack.enter_context(PluginManager.from_specs(
                args.executable_plugin, arch=arch,
                backend=getattr(args, "backend", "auto"),
                timeout=load_limit(args), **emulation))
        program = stack.enter_context(load_program(
            files, arch=arch, backend=getattr(args, "backend", "auto"),
            plugins=plugins, workers=_workers(args), host_modules=host_modules,
            timeout=getattr(args, "timeout", None), trace=trace,
            memory_limit=getattr(args, "memory_limit", None)))
        yield program


def _vm_inputs(fn, specs: Sequence[str], label: str) -> list:
    """A function's arguments from ``--input`` specs, by its calling
    convention: numpy arrays for refs, ints / floats for scalars."""
    if len(specs) != len(fn.arg_types):
        raise ModuleError(f"@{fn.name} takes {len(fn.arg_types)} inputs "
                          f"({fn.declaration or fn.cconv}); {len(specs)} "
                          "--input given", name=label, field="--input",
                          value=len(specs))
    values = []
    names = {"i": "i32", "I": "i64", "f": "f32", "F": "f64"}
    for i, (ty, spec) in enumerate(zip(fn.arg_types, specs)):
        if ty == "r":
            values.append(parse_binding(spec))
        elif ty in names:
            values.append(_scalar(spec, names[ty], i, label))
        else:
            raise ModuleError(f"argument {i} of @{fn.name} has type {ty}, which "
                              "--input cannot give", name=label, field="--input",
                              value=spec)
    return values


@contextlib.contextmanager
def _watchdog(args, label: str):
    """``--timeout`` bounds the whole command: the program's own limits stop
    host code at a backward branch and dispatches at their limit; past the
    limit plus a grace period (code that cannot be stopped from inside,
    such as a Python host module's), one line on stderr and exit status 1."""
    limit = getattr(args, "timeout", None)
    if not limit:
        yield
        return
    import threading

    def fire():
        try:
            sys.stdout.flush()
        except Exception:  # noqa: BLE001 - ending anyway
            pass
        os.write(2, (f"hal-cpu: error: {label}: timeout: the time limit of "
                     f"{limit:g} s passed and the running code could not be "
                     "stopped from inside (a host module's Python code, or a "
                     "native call); ending the command\n").encode())
        os._exit(1)
    timer = threading.Timer(limit + KILL_GRACE + 1.0, fire)
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()


def _vm_result_type(value) -> str:
    return "hal.buffer_view" if isinstance(value, np.ndarray) else type(value).__name__


def _vm_run_module(args, files, hosts, arch) -> int:
    label = files[-1]
    _check_outputs(args.output, label)

    def run(_note):
        with _vm_program(args, files, hosts, arch) as program:
            fn = program.function(args.function)
            inputs = _vm_inputs(fn, args.input, label)
            if args.output and len(args.output) != len(fn.result_types):
                raise ModuleError(f"{len(args.output)} --output given; @{fn.name} "
                                  f"has {len(fn.result_types)} results", name=label,
                                  field="--output", value=len(args.output))
            if hosts:
                # (ahead of what host modules print)
                print(f"EXEC @{fn.name}", flush=True)
            results = fn(*inputs)
            failures = program.take_failures()
            text = _results_text(args, fn.name, results,
                                 [_vm_result_type(v) for v in results], bool(hosts))
            return fn.name, failures, text

    import elfloader
    native = arch is not None and runs_natively(
        args.backend, elfloader.arch.by_name(arch), emulation_options(args))
    if native and not hosts and hasattr(os, "fork"):
        from .isolate import run_in_child
        name, failures, text = run_in_child(
            run, name=label, timeout=args.timeout and args.timeout + KILL_GRACE)
    else:
        name, failures, text = run(None)
    if text:
        print(text)
    if failures:
        for text in failures:
            print(f"check failed: {text}", file=sys.stderr)
        raise ModuleError(f"{len(failures)} check expectation(s) failed in "
                          f"@{name}", name=label, field="check", value=len(failures))
    return 0


def _vm_check_module(args, files, hosts, arch) -> int:
    from .iree import EvaluationError
    from .vm.refs import VmError
    failed = 0
    with _vm_program(args, files, hosts, arch) as program:
        names = [f.lstrip("@") for f in args.function] or list(program.functions)
        fns = [program.function(f) for f in names]
        for fn in fns:
            if fn.arg_types:
                print(f"SKIP @{fn.name} (takes arguments)")
                continue
            try:
                fn()
                messages = program.take_failures()
            except (VmError, EvaluationError) as exc:
                program.take_failures()
                messages = [f"error: {exc}"]
            if messages:
                failed += 1
                print(f"FAIL @{fn.name}")
                for text in messages:
                    print("    " + text.replace("\n", "\n    "))
            else:
                print(f"PASS @{fn.name}")
        print(f"{len(fns) - failed} of {len(fns)} functions passed ({program.arch})")
    return 1 if failed else 0


def cmd_benchmark_module(args) -> int:
    """``hal-cpu benchmark-module``: load the program once, call the function
    repeatedly and print min / median / mean per call, as
    ``iree-benchmark-module`` measures (the first call is a warm-up and not
    counted)."""
    import time
    programs, hosts = _split_modules(args)
    files, arch = _vm_files(args, programs)
    label = files[-1]
    min_time = args.benchmark_min_time
    reps = args.benchmark_repetitions
    if isinstance(min_time, int):
        reps, min_time = min_time, None
    if reps is None and min_time is None:
        min_time = 0.5
    deadline = time.monotonic() + args.timeout if args.timeout else None
    with _watchdog(args, label), _vm_program(args, files, hosts, arch) as program:
        fn = program.function(args.function)
        inputs = _vm_inputs(fn, args.input, label)
        fn(*inputs)
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
        import elfloader
        native = runs_natively(args.backend, elfloader.arch.by_name(program.arch),
                                emulation_options(args))
        where = (f"{program.arch}, {'native' if native else 'emulated'}, "
                 f"workers={_workers(args) or 'auto'}")
    times.sort()
    n = len(times)
    mean = sum(times) / n
    print(f"BM_{fn.name} ({where}): {n} calls")
    print(f"  per call: min {times[0] * 1e6:.2f} us, median "
          f"{times[n // 2] * 1e6:.2f} us, mean {mean * 1e6:.2f} us")
    return 0


def _vm_plan(args, path: str) -> int:
    """``plan`` of a compiled module: its bytecode records command buffers
    that are replayed with binding tables at run time, so the steps of a
    call are those of a traced run (as ``plan --trace``)."""
    from . import vmfb as _vmfb
    from .vm.module_def import read_module
    if args.arch == "all" or args.save_dir:
        flag = "--arch=all" if args.arch == "all" else "--save_dir"
        raise ModuleError(f"{flag} needs the MLIR source (a compiled module "
                          "holds the executables of one architecture)",
                          name=path, field=flag.split("=")[0], value=args.arch
                          if args.arch == "all" else args.save_dir)
    trace: list = []
    hosts = list(args.module)
    mdef = read_module(path, name=path)
    members = _vmfb.executables(path)
    with _vm_program(args, [path], hosts, args.arch, trace) as program:
        fn = program.function(args.function)
        values = _vm_inputs(fn, args.input, path)
        hal = program.hal
        wrapped = [hal.wrap_input(v) if isinstance(v, np.ndarray) else v
                   for v in values]
        names = {}
        for i, w in enumerate(wrapped):
            if hasattr(w, "buffer"):
                names[id(w.buffer.root)] = (f"input {i}", args.input[i])
        del trace[:]
        fn(*wrapped)
        lines = [f"@{fn.name} ({program.arch}): {len(trace)} dispatches "
                 "(the steps of a run: a compiled module replays recorded "
                 "command buffers)"]
        for n, rec in enumerate(trace):
            exe = rec.executable
            export = exe.library.exports[rec.ordinal]
            member = _member_of(exe, members, mdef)
            lines.append(f"dispatch {n}: {export.name or rec.ordinal} "
                         f"(export {rec.ordinal} of {member or exe.library.name})")
            lines.append(f"  workgroups:  {','.join(map(str, rec.grid))}")
            if rec.constants:
                lines.append("  constants:   " + " ".join(str(c) for c in rec.constants))
            run = ["hal-cpu", "run", path]
            if member and len(members) > 1:
                run.append(f"--executable={member}")
            run += [f"--entry_point={rec.ordinal}",
                    f"--workgroup_count={','.join(map(str, rec.grid))}"]
            if program.arch != arches.host_arch():
                run.append(f"--arch={program.arch}")
            for k, (buf, off, length) in enumerate(rec.bindings):
                root = buf.root
                start = buf.address + off - root.address
                label, spec = names.get(id(root), (None, None))
                if label is None:
                    label = f"buffer {len(names)}"
                    names[id(root)] = (label, None)
                lines.append(f"  binding {k}:   {label} [{start}, {start + length}) "
                             f"({length} bytes)")
                whole = spec is not None and start == 0 and length == root.length
                run.append(f"--binding={spec if whole else f'{length}xi8'}")
            for c in rec.constants:
                run.append(f"--constant={c}")
            lines.append("  run:         " + shlex.join(run))
    print("\n".join(lines))
    return 0


def _member_of(exe, members, mdef) -> str | None:
    """The ``.vmfb`` member holding ``exe``'s ELF (by its bytes), or None."""
    source = getattr(exe, "source", None)
    data = source.bytes() if hasattr(source, "bytes") else None
    if data is None:
        return None
    for m in members:
        if m.size == len(data):
            return m.name
    return None
