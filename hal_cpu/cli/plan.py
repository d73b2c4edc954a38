"""``hal-cpu plan``: the steps one call of a program submits.

For an MLIR program or a compiled module (``.vmfb``), the steps are
recorded by a record-only call on the VM without running them
(executables, exports, workgroup counts, constants, bindings, transfers),
with a ``hal-cpu run`` command line per dispatch; from MLIR the
executables can be saved (``.so``, or one FatELF ``.sos`` per executable
with ``--arch=all``). A program whose steps depend on computed data has no
plan, and ``--trace`` prints the steps of an actual run instead. A traced run on this machine's CPU
runs in a child process, confined unless ``--run_native``
(:func:`hal_cpu.cli.programs.native_child`); its steps come back as plain
data and are checked before they are printed or saved.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Sequence

import numpy as np

from fatelf import arches
from fatelf.text import printable

from ..buffers import BindingSpecError
from ..programs.vm.vmfb import check_source
from .options import INSPECT_TIMEOUT, positive
from .programs import (
    ModuleError,
    add_program_flags,
    cache_dir_of,
    compile_for,
    load_hosts,
    native_child,
    status_errors,
    vm_arch,
    vm_inputs,
    vm_program,
)

__all__ = ["COMMANDS", "cmd_plan", "format_plan"]


def _plan_parser(sub) -> None:
    p = sub.add_parser("plan", help="compile an MLIR program and print the "
                       "dispatches and transfers one call performs, with a "
                       "hal-cpu run command line per dispatch")
    add_program_flags(p, all_arches=True)
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
                   "(emulated unless --arch is this machine's; natively in a "
                   "confined child process unless --run_native) and print the "
                   "steps it actually ran; for programs whose steps depend on "
                   "data")
    p.add_argument("--executable_plugin", action="append", default=[],
                   metavar="SPEC", help="plugin resolving the executables' imports, "
                   "for --trace and on every printed run line (as run-module; "
                   "repeatable)")


def _where(b) -> str:
    what = {"input": "input", "constant": "constant"}.get(b.kind, "buffer")
    return f"{what} {b.ref} [{b.offset}, {b.offset + b.length}) ({b.length} bytes)"


def _ordinals(so_path: Path) -> dict[str, int]:
    """Export name -> ordinal, read from the library under emulation without
    running its initializers (as ``hal-cpu inspect`` does)."""
    import elfloader

    from ..library import Executable
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
            from ..buffers import dtype_name
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
             f"function:  @{printable(plan.function, 200)}",
             f"arch:      {compiled.arch}"]
    for i, v in enumerate(inputs):
        if hasattr(v, "shape"):
            shape = "x".join([str(d) for d in v.shape] + [_type_name(v.dtype)])
            lines.append(f"input {i}:   {shape} ({v.nbytes} bytes)")
        else:
            lines.append(f"input {i}:   scalar {v!r}")
    for name, size in plan.buffers.items():
        lines.append(f"buffer {printable(name, 200)}: {size} bytes "
                     "(allocated by the program)")
    constants = getattr(plan, "constants", None) or {}
    for name, data in constants.items():
        lines.append(f"constant {printable(name, 200)}: {np.asarray(data).size} bytes (carried "
                     "by the module)")
    if data_dir is None:
        hal = getattr(compiled, "hal_mlir", None)
        data_dir = Path(hal).parent / "constants" if hal is not None else None
    known = _Bytes(data_dir)
    ordinals: dict[Path, dict[str, int]] = {}
    written: list = []     # the byte ranges earlier steps may have written
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
                      f"  export:      {printable(step.export_name, 200)} (ordinal {ordinal})",
                      f"  workgroups:  {wc}",
                      "  constants:   " + (" ".join(str(c) for c in step.constants)
                                           if step.constants else "none")]
            for j, b in enumerate(step.bindings):
                notes = []
                if b.kind == "buffer" and any(
                        (w.kind, w.ref) == (b.kind, b.ref) and w.offset < b.offset + b.length
                        and b.offset < w.offset + w.length for w in written):
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
            # A dispatch may write its transient buffers' ranges (the
            # executable does not say which bindings it only reads); it
            # never writes the function's inputs nor the module's
            # constants, which IREE passes read-only.
            written.extend(b for b in step.bindings if b.kind == "buffer")
        elif kind == "FillStep":
            pattern = int.from_bytes(step.pattern, "little")
            width = 2 * len(step.pattern) + 2
            lines.append(f"step {k}: fill {_where(step.target)} with the "
                         f"{len(step.pattern)}-byte pattern {pattern:#0{width}x}")
            written.append(step.target)
        else:
            lines.append(f"step {k}: copy {_where(step.source)} to {_where(step.target)}")
            written.append(step.target)
    for i, r in enumerate(plan.results):
        shape = "x".join([str(d) for d in r.shape] + [_type_name(r.dtype)])
        lines.append(f"result {i}:  {shape} in {_where(r.storage)}")
    return "\n".join(lines)


def _type_name(dtype) -> str:
    from ..buffers import dtype_name
    try:
        return dtype_name(dtype)
    except BindingSpecError:
        return str(dtype)


def cmd_plan(args) -> int:
    """``hal-cpu plan``: see the module docstring. A program's failure
    with a status reads as IREE prints one (``FILE: CODE; message``)."""
    with status_errors(args.program):
        return _plan(args)


def _plan(args) -> int:
    from ..programs.vm import vmfb
    program = args.program
    if vmfb.is_module_file(program):
        if args.trace or args.arch == "all" or args.save_dir:
            return _vm_plan(args, program)
        # a record-only call, as for MLIR
        _, arch = vm_arch([program], args.arch)
        _check_cpu(args, arch)
        compiled = ModuleFile(program, arch, cache_dir_of(args))
        _, inputs, plan = _steps(args, compiled, program, list(args.module), [])
        print(format_plan(plan, compiled, inputs, args.input, {},
                          run_flags=_run_flags(args)))
        return 0
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
    hosts = list(args.module)
    loaded: list = []
    for arch in targets:
        _check_cpu(args, arch)
        compiled = compile_for(program, arch, cache_dir_of(args), args.compile_flag,
                               getattr(args, "cpu", None), getattr(args, "timeout", None))
        plans.append(_steps(args, compiled, program, hosts, loaded))

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
        elfloader.EngineError: as :func:`elfloader.backend.emulated.choice.resolve_profile`.
    """
    if args.cpu is None and args.vlen is None:
        return
    import elfloader
    from elfloader.backend.emulated.choice import resolve_profile
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


def _steps(args, compiled, program: str, hosts: list, loaded: list) -> tuple:
    """``(compiled, inputs, plan)``: the steps one call submits, recorded on
    the VM without running them (executables loaded emulated, to read
    their exports; a host read of computed data is a
    :class:`hal_cpu.programs.vm.DataDependenceError` naming the op's line), or with
    ``--trace`` those of an actual run: natively in a child process
    (confined unless ``--run_native``) whose steps come back as plain data,
    checked (:func:`_plan_from_plain`).

    Raises:
        DataDependenceError: the steps depend on computed data.
        NativeCrashError: a kernel ended the child.
        ModuleError: inputs the function cannot take; the child sent steps
            of another shape.
    """
    from ..programs.vm.plan import DataDependenceError, Recording, compiled_files, record_call
    files = compiled_files(compiled)

    def run(_note):
        if hosts and not loaded:
            loaded.extend(load_hosts(hosts))
        record = Recording(files)
        trace: list | None = [] if args.trace else None
        with vm_program(args, [str(compiled.vmfb)], hosts, compiled.arch, trace,
                        host_modules=loaded, record=None if args.trace else record,
                        backend=None if args.trace else "emulated") as prog:
            fn = prog.function(args.function)
            inputs = vm_inputs(fn, args.input, program)
            try:
                plan = record_call(fn, inputs, record, trace)
            except DataDependenceError as exc:
                raise DataDependenceError(
                    exc.message + "; hal-cpu plan --trace prints the steps of "
                    "an actual run", exc.location, name=program) from None
            except (ValueError, TypeError) as exc:
                raise ModuleError(str(exc), name=program, field="--input",
                                  value=None) from None
        return (_plain_plan(plan.function, plan.steps, plan.buffers,
                            plan.constants, plan.results),
                [str(t) for t in fn.arg_types])

    if args.trace:
        answer = native_child(args, program, compiled.arch, run, hosts=hosts,
                              read=[program, Path(compiled.vmfb).parent])
    else:
        answer = run(None)
    if (not isinstance(answer, tuple) or len(answer) != 2
            or not isinstance(answer[1], list)
            or not all(t in ("i", "I", "f", "F", "r") for t in answer[1])):
        raise ModuleError("the child process tracing the program sent an "
                          "answer of another shape", name=program, field="child",
                          value=type(answer).__name__)
    data, types = answer
    plan = _plan_from_plain(data, compiled, program)
    inputs = vm_inputs(_Signature(plan.function, types), args.input, program)
    return compiled, inputs, plan


class _Signature:
    """What :func:`hal_cpu.cli.programs.vm_inputs` reads of a function."""

    def __init__(self, name: str, arg_types: list):
        self.name, self.arg_types = name, arg_types
        self.declaration, self.cconv = None, "".join(arg_types)


def _plain_ref(b) -> tuple:
    return (str(b.kind), b.ref if isinstance(b.ref, int) else str(b.ref),
            int(b.offset), int(b.length))


def _plain_plan(function: str, steps, buffers, constants, results=()) -> tuple:
    """A plan's steps as plain data (what a confined child sends)."""
    out: list = []
    for step in steps:
        kind = type(step).__name__
        if kind == "Dispatch":
            out.append(("dispatch", str(step.so_path), str(step.export_name),
                        [int(n) for n in step.workgroup_count],
                        [int(c) for c in step.constants],
                        [_plain_ref(b) for b in step.bindings],
                        str(step.executable), str(step.variant)))
        elif kind == "FillStep":
            out.append(("fill", _plain_ref(step.target), bytes(step.pattern)))
        else:
            out.append(("copy", _plain_ref(step.source), _plain_ref(step.target)))
    return (str(function), out, [(str(k), int(v)) for k, v in buffers.items()],
            [(str(k), np.asarray(v, np.uint8).tobytes())
             for k, v in constants.items()],
            [(_plain_ref(r.storage), [int(d) for d in r.shape], _type_name(r.dtype))
             for r in results])


def _plan_from_plain(data, compiled, program: str):
    """:func:`_plain_plan`'s data checked and made a
    :class:`hal_cpu.programs.vm.ProgramPlan`: every value of its type, counts and
    offsets non-negative, every executable one the compile wrote.

    Raises:
        ModuleError: anything else (``field`` ``child``).
    """
    from ..buffers import DTYPES
    from ..programs.vm.steps import BindingRef, CopyStep, Dispatch, FillStep, ProgramPlan, ResultRef

    def bad(what: str):
        return ModuleError("the child process tracing the program sent "
                           f"steps of another shape ({what})", name=program,
                           field="child", value=what)

    def count(v) -> int:
        if not isinstance(v, int) or isinstance(v, bool) or not 0 <= v < 1 << 64:
            raise bad("count")
        return v

    def ref(t) -> BindingRef:
        if (not isinstance(t, tuple) or len(t) != 4
                or t[0] not in ("input", "buffer", "constant")
                or not isinstance(t[1], (int, str))):
            raise bad("binding")
        return BindingRef(t[0], t[1], count(t[2]), count(t[3]))

    executables = {str(p): Path(p) for p in compiled.so_files}
    if (not isinstance(data, tuple) or len(data) != 5
            or not isinstance(data[0], str)
            or not all(isinstance(x, list) for x in data[1:])):
        raise bad("plan")
    function, raw, buffers, constants, plain_results = data
    steps: list = []
    for item in raw:
        if not isinstance(item, tuple) or not item:
            raise bad("step")
        if item[0] == "dispatch" and len(item) == 8:
            _, so, export, wc, consts, refs, exe, variant = item
            if (so not in executables or not isinstance(export, str)
                    or not isinstance(wc, list) or len(wc) != 3
                    or not isinstance(consts, list) or not isinstance(refs, list)
                    or not isinstance(exe, str) or not isinstance(variant, str)):
                raise bad("dispatch")
            steps.append(Dispatch(executables[so], export,
                                  (count(wc[0]), count(wc[1]), count(wc[2])),
                                  [count(c) for c in consts],
                                  [ref(b) for b in refs], exe, variant))
        elif (item[0] == "fill" and len(item) == 3
              and isinstance(item[2], bytes) and len(item[2]) in (1, 2, 4, 8)):
            steps.append(FillStep(ref(item[1]), item[2]))
        elif item[0] == "copy" and len(item) == 3:
            steps.append(CopyStep(ref(item[1]), ref(item[2])))
        else:
            raise bad("step")
    sizes: dict[str, int] = {}
    for pair in buffers:
        if not (isinstance(pair, tuple) and len(pair) == 2
                and isinstance(pair[0], str)):
            raise bad("buffer")
        sizes[pair[0]] = count(pair[1])
    stored: dict[str, np.ndarray] = {}
    for pair in constants:
        if not (isinstance(pair, tuple) and len(pair) == 2
                and isinstance(pair[0], str) and isinstance(pair[1], bytes)):
            raise bad("constant")
        stored[pair[0]] = np.frombuffer(pair[1], np.uint8).copy()
    results: list = []
    for item in plain_results:
        if not (isinstance(item, tuple) and len(item) == 3
                and isinstance(item[1], list) and item[2] in DTYPES):
            raise bad("result")
        results.append(ResultRef(ref(item[0]), tuple(count(d) for d in item[1]),
                                 np.dtype(DTYPES[item[2]])))
    return ProgramPlan(function, steps, sizes, results, stored)


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


class ModuleFile:
    """A compiled module given as is, as :func:`_steps` and
    :func:`format_plan` read a compiled program: the ``.vmfb`` (``vmfb``,
    ``source``), its architecture, and its executables written once (by
    content) under the compile cache's ``executables`` folder, named as
    their members (``so_files``), where the ``run:`` lines find them.

    Raises:
        hal_cpu.programs.vm.vmfb.ModuleFileError: an unreadable archive or member.
    """

    def __init__(self, path: str, arch: str, cache_dir: str | None):
        import hashlib
        import os

        from ..programs.compiler import default_cache_dir
        from ..programs.vm import vmfb
        self.vmfb = self.source = Path(path)
        self.arch = arch
        self.variant = f"embedded_elf_{arch}"
        root = Path(cache_dir or default_cache_dir()) / "executables"
        self.so_files: list[Path] = []
        digest = hashlib.sha256()
        for member in vmfb.executables(path):
            data, _ = vmfb.read_executable(path, member.member)
            digest.update(data)
            folder = root / hashlib.sha256(data).hexdigest()[:16]
            folder.mkdir(parents=True, exist_ok=True)
            so = folder / member.member
            if not so.is_file() or so.stat().st_size != len(data):
                tmp = folder / f".{member.member}.{os.getpid()}.tmp"
                tmp.write_bytes(data)
                os.replace(tmp, so)
            self.so_files.append(so)
        #: (only its folder is used: the bytes of constants the run lines bind)
        self.hal_mlir = root / digest.hexdigest()[:16] / "module.hal.mlir"


def _vm_plan(args, path: str) -> int:
    """``plan --trace`` of a compiled module: the steps of a traced run
    (the dispatches of replayed command buffers)."""
    from ..programs.vm import vmfb as _vmfb
    from ..programs.vm.module_def import read_module
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
    modules, arch = vm_arch([path], args.arch)
    loaded: list = []

    def traced(_note) -> str:
        with vm_program(args, [path], hosts, arch, trace, modules=modules,
                        host_modules=loaded) as program:
            fn = program.function(args.function)
            values = vm_inputs(fn, args.input, path)
            hal = program.hal
            wrapped = [hal.wrap_input(v) if isinstance(v, np.ndarray) else v
                       for v in values]
            names = {}
            for i, w in enumerate(wrapped):
                if hasattr(w, "buffer"):
                    names[id(w.buffer.root)] = (f"input {i}", args.input[i])
            del trace[:]
            fn(*wrapped)
            lines = [f"@{printable(fn.name, 200)} ({program.arch}): {len(trace)} dispatches "
                     "(the steps of a run: a compiled module replays recorded "
                     "command buffers)"]
            for n, rec in enumerate(trace):
                exe = rec.executable
                export = exe.library.exports[rec.ordinal]
                member = _member_of(exe, members, mdef)
                lines.append(f"dispatch {n}: "
                             f"{printable(export.name, 200) if export.name else rec.ordinal} "
                             f"(export {rec.ordinal} of "
                             f"{printable(member or exe.library.name, 200)})")
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
        return "\n".join(lines)

    # Natively the traced run is in a child process, confined unless
    # --run_native; only the text crosses back.
    text = native_child(args, path, arch, traced, read=[path], hosts=hosts,
                        prepare=lambda: loaded.extend(load_hosts(hosts)))
    if not isinstance(text, str):
        raise ModuleError("the child process tracing the program sent an "
                          "answer of another shape", name=path, field="child",
                          value=type(text).__name__)
    print(text)
    return 0


def _member_of(exe, members, mdef) -> str | None:
    """The ``.vmfb`` member holding ``exe``'s ELF (by its bytes), or None."""
    source = getattr(exe, "source", None)
    data = (source.bytes() if source is not None and hasattr(source, "bytes")
            else None)
    if data is None:
        return None
    for m in members:
        if m.size == len(data):
            return m.name
    return None


#: Subcommand -> (add its parser to the ``hal-cpu`` subparsers, run it).
COMMANDS = {"plan": (_plan_parser, cmd_plan)}
