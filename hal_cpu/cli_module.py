"""``hal-cpu run-module`` and ``hal-cpu plan``: whole MLIR programs.

``run-module`` compiles a program for an architecture with
:func:`hal_cpu.iree.compile_program` (cached), evaluates its host program
into a plan (:func:`hal_cpu.iree.plan_program`), runs every dispatch and
transfer through this runtime (natively or emulated) and prints the results
as ``iree-run-module`` prints them::

    EXEC @matmul
    result[0]: hal.buffer_view
    2x2xf32=[1 2][3 4]

``plan`` prints the steps of that plan (executables, exports, workgroup
counts, constants, bindings, transfers) with a ``hal-cpu run`` command line
per dispatch, and can save the executables (``.so``, or one FatELF ``.sos``
per executable with ``--arch=all``).

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
from .cli import KILL_GRACE, _load_limit, _runs_natively, emulation_options
from .interrupt import run_interruptible
from .errors import HalCpuError
from .vmfb import check_source

__all__ = ["ModuleError", "add_parsers", "cmd_run_module", "cmd_plan",
           "parse_inputs", "format_plan"]


class ModuleError(HalCpuError):
    """A ``run-module`` or ``plan`` command line the program cannot take:
    unknown function, wrong number or shape of inputs, a bad ``--output``
    spec, a program file that cannot be read or compiled. ``name`` is the
    program file, ``field`` the flag, ``value`` the offending value."""


# ---------------------------------------------------------------------------
# command line

def _arch_or_all(text: str) -> str:
    from .cli import _arch
    return "all" if text.strip().lower() == "all" else _arch(text)


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


def _program_flags(p: argparse.ArgumentParser, all_arches: bool) -> None:
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
    if all_arches:
        p.add_argument("--arch", type=_arch_or_all, metavar="ARCH",
                       help="architecture to compile for: "
                       + ", ".join(arches.RUNTIME_ARCHES) + ", an alias, or all "
                       "(plan for each; --save-dir writes FatELF bundles); "
                       "default: this machine's")
    else:
        from .cli import _arch
        p.add_argument("--arch", type=_arch, metavar="ARCH",
                       help="architecture to compile for and run: "
                       + ", ".join(arches.RUNTIME_ARCHES) + " or an alias "
                       "(amd64, arm64, rv32...); default: this machine's")


def add_parsers(sub) -> None:
    """Register ``run-module`` and ``plan`` on the ``hal-cpu`` subparsers."""
    from .cli import _add_cpu_flags, _positive, _seconds
    import elfloader

    p = sub.add_parser("run-module", help="compile an MLIR program, run it "
                       "through this runtime on any architecture and print the "
                       "results as iree-run-module does")
    _program_flags(p, all_arches=False)
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
    p.add_argument("--workers", type=_positive, default=None,
                   help="host threads running workgroups (default: the CPUs "
                   "this process may use)")
    p.add_argument("--timeout", type=_seconds, default=None, metavar="S",
                   help="stop when the dispatches have run S seconds in all")
    p.add_argument("--no-progress", action="store_true",
                   help="no progress bar for long runs")
    _add_cpu_flags(p)

    p = sub.add_parser("plan", help="compile an MLIR program and print the "
                       "dispatches and transfers one call performs, with a "
                       "hal-cpu run command line per dispatch")
    _program_flags(p, all_arches=True)
    p.add_argument("--save-dir", metavar="DIR", help="write the executables "
                   "there: <executable>_<arch>.so, or <executable>.sos (FatELF, "
                   "all six architectures) with --arch=all")
    p.add_argument("--cpu", metavar="PROFILE", default=None,
                   help="compile for this CPU profile of the architecture "
                   "(hal-cpu profiles lists them)")


# ---------------------------------------------------------------------------
# compiling, inputs, planning

def _cache_dir(args) -> str | None:
    return args.cache_dir or os.environ.get("PKR_COMPILE_CACHE") or None


def compile_for(program: str, arch: str, cache_dir: str | None = None,
                cpu: str | None = None):
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
        return compile_program(path, arch, cache_dir, cpu=cpu)
    except CompileError as exc:
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
    from .iree.hal_ir import float_fmt, int_width
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
        if float_fmt(ty):
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
    from .iree import load_module
    program = program or str(compiled.source)
    func = load_module(compiled.hal_mlir).funcs[function]
    if len(specs) != len(func.args):
        kinds = ", ".join("tensor" if t.startswith("!hal.buffer_view") else t
                          for _, t in func.args)
        raise ModuleError(f"@{function} takes {len(func.args)} inputs ({kinds}); "
                          f"{len(specs)} --input given", name=program,
                          field="--input", value=len(specs))
    values = []
    for i, ((_, ty), spec) in enumerate(zip(func.args, specs)):
        if ty.startswith("!hal.buffer_view"):
            values.append(parse_binding(spec))
        else:
            values.append(_scalar(spec, ty.strip(), i, program))
    return values


def _plan(compiled, inputs, function: str, program: str):
    from .iree import plan_program
    try:
        return plan_program(compiled, inputs, function)
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


def _write_output(spec: str, array: np.ndarray, max_elements: int) -> None:
    if spec == "":
        return
    if spec == "-":
        print("hal.buffer_view")
        print(format_buffer_view(array, max_elements))
        return
    path, mode = spec[1:], ("wb" if spec[0] == "@" else "ab")
    with open(path, mode) as f:
        if path.endswith(".npy"):
            np.save(f, array)
        else:
            f.write(np.ascontiguousarray(array).tobytes())


def _max_abs_error(got: np.ndarray, want: np.ndarray) -> str:
    if got.shape != want.shape:
        return f"shape {'x'.join(map(str, want.shape))} != ours"
    if got.size == 0:
        return "0"
    if got.dtype.kind in "iub" and want.dtype.kind in "iub":
        return str(int(np.max(np.abs(got.astype(object) - want.astype(object)))))
    diff = np.abs(got.astype(np.float64) - want.astype(np.float64))
    return "%G" % float(np.max(diff))


def cmd_run_module(args) -> int:
    """``hal-cpu run-module``: see the module docstring."""
    from .cli import _Progress
    from .iree import PlanRunner, run_plan
    program = args.program
    check_source(program)
    arch = args.arch or arches.host_arch()
    compiled = compile_for(program, arch, _cache_dir(args), getattr(args, "cpu", None))
    function = _pick_function(compiled, args.function, program)
    inputs = parse_inputs(compiled, function, args.input, program)
    plan = _plan(compiled, inputs, function, program)
    if args.output and len(args.output) != len(plan.results):
        raise ModuleError(f"{len(args.output)} --output given; @{function} has "
                          f"{len(plan.results)} results", name=program,
                          field="--output", value=len(args.output))
    _check_outputs(args.output, program)
    total = sum(int(np.prod(d.workgroup_count)) for d in plan.dispatches)

    def run(note, backend=args.backend):
        progress = _Progress(not args.no_progress)
        with contextlib.ExitStack() as stack:
            plugins = None
            emulation = emulation_options(args)
            if args.executable_plugin or emulation:
                # Executables and plugins share the plugins' machine (and
                # with it the engine and CPU profile).
                from .plugins import PluginManager
                note("while loading the plugins")
                plugins = stack.enter_context(PluginManager.from_specs(
                    args.executable_plugin, arch=arch, backend=backend,
                    timeout=_load_limit(args), **emulation))
            runner = stack.enter_context(PlanRunner(
                backend=backend, arch=arch, plugins=plugins, workers=args.workers,
                timeout=args.timeout, progress=progress, total_workgroups=total))

            def dispatch(step, bindings):
                note(f"in export {step.export_name}")
                runner(step, bindings)

            def stop():
                # Ctrl-C stops the emulated CPUs of every executable at once.
                for exe in list(runner.executables.values()):
                    exe.backend.stop_workers(256)
            try:
                return run_interruptible(
                    lambda: run_plan(plan, inputs, dispatch), stop)
            finally:
                progress.close()

    import elfloader
    if (_runs_natively(args.backend, elfloader.arch.by_name(arch),
                       emulation_options(args))
            and hasattr(os, "fork")):
        # As hal-cpu run: native kernels run in a child process, so a crash
        # is reported (then located by an emulated run) instead of ending
        # hal-cpu; --timeout bounds the child.
        from .errors import NativeCrashError
        from .isolate import run_in_child
        try:
            results = run_in_child(run, name=program, timeout=args.timeout
                                   and args.timeout + KILL_GRACE)
        except NativeCrashError as exc:
            print(f"hal-cpu: error: {exc}", file=sys.stderr)
            _diagnose_plan(run, arch, program)
            return 1
    else:
        results = run(lambda _text: None)
    print(f"EXEC @{function}")
    limit = args.output_max_element_count
    if args.output:
        for spec, array in zip(args.output, results):
            _write_output(spec, array, limit)
    else:
        for i, array in enumerate(results):
            print(f"result[{i}]: hal.buffer_view")
            print(format_buffer_view(array, limit))
    if args.compare:
        _compare(args, program, function, inputs, results)
    return 0


def _diagnose_plan(run, arch: str, program: str) -> None:
    """Run the plan again emulated and print where it faults."""
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
             results: list[np.ndarray]) -> None:
    from .iree import reference_run
    host = arches.host_arch()
    host_compiled = compile_for(program, host, _cache_dir(args))
    try:
        want = reference_run(host_compiled.vmfb, function, inputs,
                             executable_plugins=args.executable_plugin)
    except (RuntimeError, ValueError, TypeError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ModuleError(f"IREE's runtime failed: {first}", name=program,
                          field="--compare", value=function) from None
    for i, (g, w) in enumerate(zip(results, want)):
        print(f"compare: result[{i}]: max abs error {_max_abs_error(g, w)} "
              f"(IREE runtime, {host})")


# ---------------------------------------------------------------------------
# plan

def _where(b) -> str:
    what = f"input {b.ref}" if b.kind == "input" else f"buffer {b.ref}"
    return f"{what} [{b.offset}, {b.offset + b.length}) ({b.length} bytes)"


def _ordinals(so_path: Path) -> dict[str, int]:
    """Export name -> ordinal, read from the library under emulation without
    running its initializers (as ``hal-cpu inspect`` does)."""
    import elfloader
    from .cli import INSPECT_TIMEOUT
    from .library import Executable
    image = elfloader.read_image(so_path)
    with Executable(image, backend="emulated", initialize=False,
                    bind_imports=False, timeout=INSPECT_TIMEOUT) as exe:
        return {e.name: e.ordinal for e in exe.exports if e.name is not None}


def _binding_spec(b, inputs: list, input_specs: Sequence[str], results) -> str:
    """A ``hal-cpu run --binding`` spec for binding ``b``: the input's own
    spec when it is a whole input, a zero-filled array shaped like the
    result when it is exactly a result's range, else zero-filled bytes."""
    if (b.kind == "input" and b.offset == 0
            and b.length == getattr(inputs[b.ref], "nbytes", -1)):
        return input_specs[b.ref]
    for r in results:
        if r.storage == b:
            try:
                return "x".join([str(d) for d in r.shape] + [_type_name(r.dtype)])
            except BindingSpecError:
                break
    return f"{b.length}xi8"


def format_plan(plan, compiled, inputs: list, input_specs: Sequence[str],
                so_paths: dict | None = None) -> str:
    """Text of ``hal-cpu plan``: the buffers, each step, the results.

    ``so_paths`` maps a dispatch's ``so_path`` to the file (and ``--arch``)
    the printed ``hal-cpu run`` command should name, e.g. a saved copy.
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
            cmd += [f"--constant={c}" for c in step.constants]
            cmd += [f"--binding={_binding_spec(b, inputs, input_specs, plan.results)}"
                    for b in step.bindings]
            lines.append("  run:         " + " ".join(shlex.quote(c) for c in cmd))
            written.update((b.kind, b.ref) for b in step.bindings)
        elif kind == "FillStep":
            pattern = int.from_bytes(step.pattern, "little")
            lines.append(f"step {k}: fill {_where(step.target)} with the "
                         f"{len(step.pattern)}-byte pattern {pattern:#0{2 * len(step.pattern) + 2}x}")
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
    program = args.program
    check_source(program)
    targets = (list(arches.RUNTIME_ARCHES) if args.arch == "all"
               else [args.arch or arches.host_arch()])
    save = Path(args.save_dir) if args.save_dir else None
    if save is not None:
        try:
            save.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ModuleError(f"cannot create it: {exc.strerror or exc}",
                              name=str(save), field="--save-dir", value=str(save)) from None
    plans = []
    for arch in targets:
        compiled = compile_for(program, arch, _cache_dir(args), getattr(args, "cpu", None))
        function = _pick_function(compiled, args.function, program)
        inputs = parse_inputs(compiled, function, args.input, program)
        plans.append((compiled, inputs, _plan(compiled, inputs, function, program)))

    so_paths: dict[Path, tuple[Path, str | None]] = {}
    if save is not None:
        so_paths = _save(plans, save, bundle=args.arch == "all")
    for n, (compiled, inputs, plan) in enumerate(plans):
        if n:
            print()
        print(format_plan(plan, compiled, inputs, args.input, so_paths))
    if save is not None:
        for path in sorted({p for p, _ in so_paths.values()}):
            print(f"saved: {path}")
    return 0


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
