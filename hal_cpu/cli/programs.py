"""What the program commands (``run-module``, ``check-module``,
``benchmark-module``, ``plan``) share: their flags, compiling MLIR
(:func:`compile_for`, cached by content), inputs (:func:`vm_inputs`), host
modules, linking compiled modules (:func:`vm_program`: every program runs
on the VM, :mod:`hal_cpu.programs.vm`), the ``--timeout`` watchdog
(:func:`by_path`, :func:`watchdog`), and the child
process native dispatches run in (:func:`native_child`), confined unless
``--run_native``, with the results crossing back as plain data
(:func:`plain_arrays`, :func:`arrays_from_plain`).

A host module (``--module x.py``) is Python the user trusts, but it runs in
the same process as the program's kernels: when they run natively, the
host modules are imported and created in the child *before* it is
confined (so their imports and set-up may read files as usual), and their
functions then run confined with the kernels (printing works; writing
files or reaching the network needs ``--run_native``).

Inputs are spelled as IREE's ``--input``: ``2x3xf32=1,2,3,4,5,6``,
``4xi32=7`` (splat), ``@file.npy``, ``4xf32=@raw.bin``; a scalar argument
takes a plain number (``1.5``) or ``TYPE=value``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from fatelf import arches
from fatelf.text import printable

from ..buffers import parse_binding
from ..errors import HalCpuError
from ..programs.vm.vmfb import check_source
from .options import (
    KILL_GRACE,
    add_isolate_flag,
    add_native_flag,
    add_workbench_flags,
    confinement,
    emulation_options,
    load_limit,
    workbench_wanted,
)
from .options import arch as arch_type

__all__ = ["ModuleError", "PIPED", "REFUSED_FLAGS", "STDIN", "StatusFailure",
           "add_program_flags", "add_refused_flags",
           "arrays_from_plain", "by_path", "cache_dir_of", "compile_for", "is_stdin",
           "load_hosts", "module_source", "native_child", "plain_arrays", "read_stdin",
           "split_modules", "status_errors", "vm_arch", "vm_files", "vm_inputs",
           "vm_program", "watchdog", "workers_of"]


class ModuleError(HalCpuError):
    """A ``run-module`` or ``plan`` command line the program cannot take:
    unknown function, wrong number or shape of inputs, a bad ``--output``
    spec, a program file that cannot be read or compiled. ``name`` is the
    program file, ``field`` the flag, ``value`` the offending value."""


# ---------------------------------------------------------------------------
# command line

def _arch_or_all(text: str) -> str:
    return "all" if text.strip().lower() == "all" else arch_type(text)


def add_program_flags(p: argparse.ArgumentParser, all_arches: bool,
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
        add_workbench_flags(p)
    else:
        p.add_argument("--module", action="append", default=[], metavar="SPEC",
                       help="a host module the program imports: path.py[@create_fn]"
                       "[?key=value&...] (create_fn(max_version, params), default "
                       "create_module) or an installed entry point of group "
                       "hal_cpu.host_modules; later ones win (repeatable)")
    add_native_flag(p)
    add_isolate_flag(p)
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


# ---------------------------------------------------------------------------
# IREE's tools' flags this runtime refuses

_GPU = "no GPU driver: this runtime runs IREE's local CPU device only"
_CAPTURE = "no HAL capture, profiling or replay in this runtime"
_TOPOLOGY = ("the task system's topology is not modelled; --workers sets the "
             "host threads a dispatch runs on")
_COMPARE = ("results are not compared with expected values here; "
            "run-module --compare compares them with IREE's runtime")

#: The flags ``iree-run-module`` and ``iree-benchmark-module`` (IREE 3.13,
#: as their ``--help`` lists them, with Google Benchmark's) take that the
#: program commands do not, and why: each is refused with one line
#: (:func:`add_refused_flags`) rather than an argparse usage dump.
REFUSED_FLAGS: dict[str, str] = {
    **{f"--cuda_{k}": _GPU for k in (
        "allow_inline_execution", "async_allocations", "default_index",
        "default_index_from_mpi", "tracing", "use_streams")},
    **{f"--hip_{k}": _GPU for k in (
        "allow_inline_execution", "async_allocations", "async_caching",
        "default_index", "dylib_path", "tracing", "use_streams")},
    **{f"--vulkan_{k}": _GPU for k in (
        "buffer_device_addresses", "cached_bda_replay_instances",
        "cached_bda_replay_publication_bytes", "debug_utils", "debug_verbosity",
        "dedicated_compute_queue", "dispatch_abi", "libvulkan_search_path",
        "retained_cached_bda_replay_instances", "robust_buffer_access",
        "sparse_binding", "sparse_residency", "tracing", "validation_layers")},
    **{f"--device_{k}": _CAPTURE for k in (
        "capture_file", "capture_label", "capture_tool", "profiling_counter",
        "profiling_filter_command_buffer", "profiling_filter_command_index",
        "profiling_filter_function", "profiling_filter_physical_device",
        "profiling_filter_queue", "profiling_flush_interval_ms",
        "profiling_mode", "profiling_output", "replay_file_policy",
        "replay_file_validation", "replay_output")},
    "--agents_md": _CAPTURE,
    **{f"--task_{k}": _TOPOLOGY for k in (
        "topology_cpu_ids", "topology_distribution", "topology_favor",
        "topology_max_group_count", "topology_mode", "topology_nodes",
        "topology_performance_level", "topology_snapshot",
        "worker_local_memory", "worker_spin_us", "worker_stack_size")},
    "--dump_task_topologies": _TOPOLOGY,
    "--device_allocator": "buffers come from this runtime's own allocator",
    "--device_lead_allocator": "buffers come from this runtime's own allocator",
    "--dump_devices": "the devices are local-sync and local-task (--device)",
    "--list_devices": "the devices are local-sync and local-task (--device)",
    "--list_drivers": "the driver is local (local-sync, local-task)",
    "--print_device_statistics": "no device statistics; --print_statistics "
                                 "prints the buffer memory",
    **{f"--{k}": _COMPARE for k in (
        "equality_mode", "expected_bf16_threshold", "expected_f16_threshold",
        "expected_f32_threshold", "expected_f64_threshold", "expected_output",
        "expected_rtol")},
    "--flagfile": "pass the flags on the command line",
    "--instrument_file": "no dispatch instrumentation in this runtime",
    "--module_mode": "modules are read (mapped) as they are",
    "--parameters": "parameter archives (.irpa, .gguf, .safetensors) are not "
                    "read by this runtime",
    "--parameter_mode": "parameter archives are not read by this runtime",
    "--trace_execution": "no VM execution trace; hal-cpu plan --trace "
                         "lists the dispatches",
    # iree-benchmark-module's own
    "--batch_size": "one call per iteration",
    "--batch_concurrency": "one call per iteration",
    "--dispatch_statistics": "no per-dispatch statistics",
    "--enable_output_processing": "benchmark calls keep no outputs; "
                                  "run-module prints and writes them",
    # Google Benchmark's
    **{f"--benchmark_{k}": "not offered by hal-cpu's benchmark loop" for k in (
        "min_warmup_time", "dry_run", "enable_random_interleaving", "color",
        "counters_tabular", "context")},
    "--v": "no benchmark library logging",
}


def add_refused_flags(p: argparse.ArgumentParser, command: str) -> None:
    """Register every flag of :data:`REFUSED_FLAGS` that ``p`` lacks, so
    that giving one ends ``hal-cpu <command>`` with one line
    (``hal-cpu run-module: flag --X is not supported (why)``, exit status
    2), hidden from ``--help``."""
    known = set(getattr(p, "long_options", ()))
    for flag, why in REFUSED_FLAGS.items():
        if flag in known:
            continue
        p.add_argument(flag, nargs="?", action=_Refuse, help=argparse.SUPPRESS,
                       why=why, command=command)


class _Refuse(argparse.Action):
    """The action of a refused IREE flag: one line on stderr, exit 2."""

    def __init__(self, option_strings, dest, why: str = "", command: str = "",
                 **kw):
        kw.pop("nargs", None)
        super().__init__(option_strings, argparse.SUPPRESS, nargs="?",
                         default=argparse.SUPPRESS, **kw)
        self.why, self.command = why, command

    def __call__(self, parser, namespace, values, option_string=None):
        print(f"hal-cpu {self.command}: flag {self.option_strings[0]} is not "
              f"supported ({self.why})", file=sys.stderr)
        raise SystemExit(2)


# ---------------------------------------------------------------------------
# compiling, inputs, running

def cache_dir_of(args) -> str | None:
    """Where compiled programs are kept: ``--cache_dir``, else
    ``$PKR_COMPILE_CACHE``, else None (the user cache directory)."""
    return args.cache_dir or os.environ.get("PKR_COMPILE_CACHE") or None


def compile_for(program: str, arch: str, cache_dir: str | None = None,
                extra_flags: Sequence[str] = (), cpu: str | None = None,
                timeout: float | None = None):
    """:func:`hal_cpu.programs.compile_program` for the command line.

    Raises:
        ModuleError: the program file is missing or unreadable.
        hal_cpu.programs.IreeToolError: ``iree-compile`` missing or another
            version (one line).
        hal_cpu.programs.CompileError: the compiler's first error line (the
            full diagnostics are on the exception's ``diagnostics``).
    """
    from ..programs import CompileError, compile_program
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
        err.diagnostics = text  # type: ignore[attr-defined]
        raise err from None
    except OSError as exc:
        raise ModuleError(f"cannot read or compile it: {exc.strerror or exc}",
                          name=program, field="program", value=program) from None


def _scalar(spec: str, ty: str, index: int, program: str):
    from ..programs.scalars import float_dtype, int_width
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


# ---------------------------------------------------------------------------
# compiled modules (.vmfb; MLIR compiled first): the VM

def _is_host_spec(spec: str) -> bool:
    """Whether a ``--module`` value names a Python host module (a ``.py``
    file, with ``@create_fn`` / ``?params``) or an installed entry point,
    rather than a program file."""
    if spec == "-":
        return False        # standard input
    path = spec.partition("?")[0].partition("@")[0]
    if path.endswith(".py"):
        return True
    return not os.path.exists(path) and "/" not in path and "." not in path


def split_modules(args) -> tuple[list[str], list[str]]:
    """``(program files in link order, host module specs)`` from the
    positional program, ``--module`` and ``--host_module``."""
    if workbench_wanted(args):
        from ..workbench import commands as workbench
        workbench.prepare(args)     # emulated on qemu, in this process
    programs: list[str] = []
    hosts: list[str] = []
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


class StatusFailure(HalCpuError):
    """A program's function failed with an IREE status (``vm.fail``, a
    ``hal`` op, a host function): printed as IREE's tools print a status,
    ``<file>: CODE; message`` (e.g. ``x.vmfb: UNKNOWN; Forced failure;
    while invoking native function custom.error``). ``field`` is the
    code's name, ``value`` its number."""

    def __init__(self, code: int, message: str, *, name: str | None = None):
        from ..programs.vm.refs import STATUS_NAMES
        code_name = STATUS_NAMES.get(code, f"status {code}")
        super().__init__(message, name=name, field=code_name, value=code)
        self.code = code
        self.args = (f"{name + ': ' if name else ''}{code_name}; {message}",)


@contextlib.contextmanager
def status_errors(label: str):
    """Within: a status error of the program (in this process a
    :class:`hal_cpu.programs.StatusError`; from a child process the
    :class:`HalCpuError` carrying its code's name and number) becomes a
    :class:`StatusFailure` naming the program file (``label`` when the
    error names none, or names ``<memory>``)."""
    from ..programs.vm.refs import STATUS_NAMES, StatusError
    try:
        yield
    except HalCpuError as exc:
        status = isinstance(exc, StatusError) or (
            type(exc) is HalCpuError and isinstance(exc.value, int)
            and not isinstance(exc.value, bool)
            and STATUS_NAMES.get(exc.value) == exc.field)
        if not status or isinstance(exc, StatusFailure):
            if exc.name in (None, "<memory>"):
                raise exc.with_name(label) from None
            raise
        message = exc.message
        location = getattr(exc, "location", None)
        if location and not message.startswith(location):
            message = f"{location}: {message}"
        name = exc.name if exc.name not in (None, "<memory>") else label
        raise StatusFailure(int(exc.value), message, name=name) from None


def by_path(args, vm: Callable[..., int]) -> int:
    """Run a program command under :func:`watchdog`: ``vm(args, files,
    hosts, arch)`` with the program files as compiled modules
    (:func:`vm_files`: MLIR compiled first, cached) and ``hosts`` the host
    module specs (:func:`split_modules`). Every program runs on the VM
    (:mod:`hal_cpu.programs.vm`)."""
    programs, hosts = split_modules(args)
    with watchdog(args, programs[-1]):
        files, arch = vm_files(args, programs)
        with status_errors(SOURCES.get(files[-1], files[-1])):
            return vm(args, files, hosts, arch)


#: compiled module (``.vmfb`` path) -> the MLIR file it was compiled from
#: (:func:`vm_files`): errors name the user's file
SOURCES: dict[str, str] = {}


def workers_of(args) -> int | None:
    """Host threads a compiled module's dispatches run on: ``--workers``,
    else 1 for ``--device=local-sync``, else None (the CPUs this process may
    use)."""
    device = getattr(args, "device", None)
    if device not in (None, "local-task", "local-sync", "local"):
        raise ModuleError("this runtime runs on the local CPU: use local-task "
                          "or local-sync", field="--device", value=device)
    if getattr(args, "workers", None) is not None:
        return args.workers
    return 1 if device == "local-sync" else None


#: How a module read from standard input is named in errors and output.
STDIN = "<stdin>"

#: The bytes of a module read from standard input (:func:`read_stdin`),
#: by the name that stands for it in the file lists (:data:`STDIN`).
PIPED: dict[str, bytes] = {}

_STDIN_PATHS = ("/dev/stdin", "/dev/fd/0", "/proc/self/fd/0")


def is_stdin(spec: str) -> bool:
    """Whether a program given on the command line is standard input:
    ``-``, or ``/dev/stdin`` (``/dev/fd/0``, ``/proc/self/fd/0``) when it
    is not a regular file (a pipe or a terminal; a file redirected with
    ``<`` is read as the file it is)."""
    if spec == "-":
        return True
    if spec not in _STDIN_PATHS:
        return False
    import stat
    try:
        return not stat.S_ISREG(os.fstat(0).st_mode)
    except OSError:
        return True


def read_stdin(limit: int | None = None) -> bytes:
    """All of standard input, read once, bounded as an input file is: at
    most :data:`hal_cpu.programs.vm.module_def.MAX_MODULE_BYTES` (a
    compiled module) or :data:`hal_cpu.programs.vm.vmfb.MAX_SOURCE_BYTES`
    (MLIR), whichever is larger, unless ``limit`` says fewer.

    Raises:
        ModuleFileError: standard input is a terminal, closed, empty, or
            longer than the limit (``name`` ``<stdin>``, ``field``
            ``program``, ``value`` the bytes read).
    """
    from ..programs.vm.module_def import MAX_MODULE_BYTES
    from ..programs.vm.vmfb import MAX_SOURCE_BYTES, ModuleFileError
    if limit is None:
        limit = max(MAX_MODULE_BYTES, MAX_SOURCE_BYTES)
    try:
        if os.isatty(0):
            raise ModuleFileError("standard input is a terminal: pipe a module "
                                  "into it (iree-compile x.mlir -o - | hal-cpu "
                                  "run-module --module=- ...)", name=STDIN,
                                  field="program", value="-")
        chunks, total = [], 0
        while True:
            chunk = os.read(0, 1 << 20)
            if not chunk:
                break
            total += len(chunk)
            if total > limit:
                raise ModuleFileError(f"it is more than the {limit} bytes a "
                                      "program may have", name=STDIN,
                                      field="program", value=total)
            chunks.append(chunk)
    except OSError as exc:
        raise ModuleFileError(f"cannot read standard input: "
                              f"{exc.strerror or exc}", name=STDIN,
                              field="program", value="-") from None
    if not total:
        raise ModuleFileError("standard input is empty: no module", name=STDIN,
                              field="program", value=0)
    return b"".join(chunks)


def _piped(arch: str | None, args) -> tuple[str, str | None]:
    """Standard input as a program: a compiled module (kept in
    :data:`PIPED`, named :data:`STDIN`) or MLIR (written to a private
    temporary file and compiled as any, its errors naming ``<stdin>``);
    ``(file, arch)``."""
    from ..programs.vm.module_def import MAX_MODULE_BYTES
    from ..programs.vm.vmfb import MAX_SOURCE_BYTES, ModuleFileError
    if STDIN in PIPED or STDIN in SOURCES.values():
        raise ModuleFileError("standard input is given twice (- or "
                              "/dev/stdin): a command reads it once",
                              name=STDIN, field="program", value="-")
    data = read_stdin()
    if data[:4] == b"PK\x03\x04" or data[4:8] == b"IREE":
        if len(data) > MAX_MODULE_BYTES:
            raise ModuleFileError(f"it is {len(data)} bytes, more than the "
                                  f"{MAX_MODULE_BYTES} bytes a module may have",
                                  name=STDIN, field="program", value=len(data))
        PIPED[STDIN] = data
        return STDIN, arch
    if len(data) > MAX_SOURCE_BYTES:
        raise ModuleFileError(f"it is {len(data)} bytes, more than the "
                              f"{MAX_SOURCE_BYTES} bytes a program may have",
                              name=STDIN, field="program", value=len(data))
    import atexit
    import shutil
    import tempfile
    folder = tempfile.mkdtemp(prefix="hal-cpu-stdin-")
    atexit.register(shutil.rmtree, folder, True)
    path = os.path.join(folder, "stdin.mlir")
    with open(path, "wb") as f:
        f.write(data)
    try:
        check_source(path)
        compiled = compile_for(path, arch or arches.host_arch(),
                               cache_dir_of(args),
                               getattr(args, "compile_flag", []),
                               getattr(args, "cpu", None),
                               getattr(args, "timeout", None))
    except HalCpuError as exc:
        err = exc.with_name(STDIN)
        err.message = exc.message.replace(path, STDIN)
        err.args = (": ".join([STDIN, *([exc.field] if exc.field else []),
                               err.message]),)
        if hasattr(exc, "diagnostics"):
            err.diagnostics = exc.diagnostics.replace(path, STDIN)
        raise err from None
    SOURCES[str(compiled.vmfb)] = STDIN
    return str(compiled.vmfb), arch or compiled.arch


def module_source(file: str):
    """What :func:`hal_cpu.programs.vm.module_def.read_module` reads for a
    file of :func:`vm_files`: its path, or the bytes piped in."""
    return PIPED.get(file, file)


def vm_files(args, programs: Sequence[str]) -> tuple[list[str], str | None]:
    """The ``.vmfb`` files to link (MLIR programs compiled first, for
    ``--arch`` or this machine) and the architecture asked for. A program
    ``-`` (or ``/dev/stdin`` on a pipe) is read from standard input
    (:func:`read_stdin`): a compiled module is kept in memory and named
    ``<stdin>`` (:func:`module_source`), MLIR is compiled."""
    from ..programs.vm import vmfb
    arch = args.arch
    files = []
    for p in programs:
        if is_stdin(p):
            file, arch = _piped(arch, args)
            files.append(file)
            continue
        if vmfb.is_module_file(p):
            # given as is: errors name it (not an MLIR file an earlier
            # command of this process compiled it from)
            SOURCES.pop(str(p), None)
            files.append(p)
            continue
        check_source(p)
        compiled = compile_for(p, arch or arches.host_arch(), cache_dir_of(args),
                               getattr(args, "compile_flag", []),
                               getattr(args, "cpu", None), getattr(args, "timeout", None))
        files.append(str(compiled.vmfb))
        SOURCES[str(compiled.vmfb)] = p
        arch = arch or compiled.arch
    return files, arch


def load_hosts(hosts: Sequence[str]) -> list:
    """The host modules ``hosts`` (specs) names, loaded in order."""
    if not hosts:
        return []
    from ..programs.host_modules import load_module_spec
    return [load_module_spec(s) for s in hosts]


def vm_arch(files: Sequence[str], arch: str | None) -> tuple[list, str]:
    """The modules of ``files`` read (verified, nothing run) and the
    architecture their executables run as: ``arch``, else the last
    module's, else this machine's."""
    from ..programs.vm.module_def import read_module
    from ..programs.vm.program import module_arch
    modules = [read_module(module_source(f), name=SOURCES.get(f, f))
               for f in files]
    if arch is None:
        arch = module_arch(modules[-1]) or arches.host_arch()
    return modules, arch


@contextlib.contextmanager
def vm_program(args, files: Sequence[str], hosts: Sequence[str], arch: str | None,
               trace: list | None = None, modules: list | None = None,
               host_modules: list | None = None, backend: str | None = None,
               record=None):
    """Load and link the modules (``modules``: those of ``files`` already
    read; ``host_modules``: those of ``hosts`` already loaded); closes them
    on exit. ``backend`` overrides ``--backend``; ``record``: a
    :class:`hal_cpu.programs.vm.plan.Recording` (the program's dispatches are
    recorded, not run)."""
    from ..programs.vm import load_program
    from ..programs.vm.module_def import read_module
    from ..programs.vm.program import module_arch
    if host_modules is None:
        host_modules = load_hosts(hosts)
    if modules is None:
        modules = [read_module(module_source(f), name=SOURCES.get(f, f))
                   for f in files]
    if arch is None:
        arch = module_arch(modules[-1]) or arches.host_arch()
    emulation = emulation_options(args)
    backend = backend or getattr(args, "backend", None) or "auto"
    with contextlib.ExitStack() as stack:
        plugins = None
        if args.executable_plugin or emulation:
            from ..plugins import PluginManager
            plugins = stack.enter_context(PluginManager.from_specs(
                args.executable_plugin, arch=arch, backend=backend,
                timeout=load_limit(args), **emulation))
        program = stack.enter_context(load_program(
            modules, arch=arch, backend=backend, record=record,
            plugins=plugins, workers=workers_of(args), host_modules=host_modules,
            timeout=getattr(args, "timeout", None), trace=trace,
            memory_limit=getattr(args, "memory_limit", None)))
        yield program


def vm_inputs(fn, specs: Sequence[str], label: str) -> list:
    """A function's arguments from ``--input`` specs, by its calling
    convention: numpy arrays for refs, ints / floats for scalars."""
    if len(specs) != len(fn.arg_types):
        raise ModuleError(f"@{printable(fn.name, 200)} takes {len(fn.arg_types)} inputs "
                          f"({printable(fn.declaration or fn.cconv)}); {len(specs)} "
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
            raise ModuleError(f"argument {i} of @{printable(fn.name, 200)} has type "
                                  f"{printable(ty, 200)}, which "
                              "--input cannot give", name=label, field="--input",
                              value=spec)
    return values


def _host_paths(hosts: Sequence[str]) -> list[str]:
    """The files of host module specs (``path.py[@fn][?...]``)."""
    paths = []
    for spec in hosts:
        path = spec.partition("?")[0].partition("@")[0]
        if path.endswith(".py"):
            paths.append(os.path.dirname(os.path.abspath(path)))
    return paths


def native_child(args, label: str, arch: str | None, fn: Callable, *,
                 read: Sequence = (), prepare: Callable[[], object] | None = None,
                 hosts: Sequence[str] = (), timeout: float | None = -1.0,
                 keep: tuple[int, ...] = ()):
    """``fn(note)``, where a program command runs: when its dispatches run
    natively (``arch`` on this CPU under ``--backend``/``--engine``...),
    in a child process, so that a crashing kernel ends the child, not
    ``hal-cpu`` (:class:`hal_cpu.errors.NativeCrashError` reaches the
    caller), confined unless ``--run_native``
    (:func:`hal_cpu.isolate.confinement`: the child may read ``read``, the
    plugins, the host modules' folders, the ``--input`` files, Python and
    this runtime; it cannot
    create or write files, open sockets or start processes) and then sending
    back plain data only; else in this process. ``prepare()`` runs first
    (in the child before it is confined: e.g. loading host modules).
    ``timeout``: seconds after which the child is killed (default: just
    after :func:`watchdog` would end the command; None: never). ``keep``:
    descriptors opened for the child to write (output files).

    Raises:
        NativeCrashError: the child died (``hal-cpu`` reports it).
        HalCpuError: an error in the confined child (message, name, field,
            value kept), or a machine that cannot confine it.
    """
    import elfloader

    from .options import runs_natively
    native = arch is not None and runs_natively(
        getattr(args, "backend", "auto"), elfloader.arch.by_name(arch),
        emulation_options(args))
    if workbench_wanted(args):
        from ..workbench import commands as workbench
        # --sanitize / --count_instructions: emulated, here, watched
        if prepare is not None:
            prepare()
        return workbench.run_watched(args, lambda: fn(lambda _text: None))
    if (not native or not hasattr(os, "fork")
            or getattr(args, "isolate", True) is False):
        # (--no_isolate: in this process, unconfined)
        if prepare is not None:
            prepare()
        return fn(lambda _text: None)
    from ..isolate import run_in_child
    paths = [os.fspath(p) for p in read if os.fspath(p) not in PIPED]
    plugin_specs = getattr(args, "executable_plugin", None) or []
    if plugin_specs:
        from ..plugins import PluginSpec
        paths += [PluginSpec(s).path for s in plugin_specs]
    paths += _host_paths(hosts)
    # --input files (@file.npy, 4xf32=@raw.bin), read in the child
    paths += [spec.partition("@")[2] for spec in getattr(args, "input", [])
              if "@" in spec]
    confine = confinement(args, paths, prepare, keep)
    work = fn
    if confine is None and prepare is not None:
        def work(note):
            prepare()
            return fn(note)
    if timeout == -1.0:
        # Past the watchdog's limit (which ends hal-cpu, and with it the
        # child, saying what could not be stopped), as a backstop.
        limit = getattr(args, "timeout", None)
        timeout = limit + 2 * KILL_GRACE + 1.0 if limit else None
    # What the program's Python side prints (host modules, check-module's
    # lines) reaches this process's streams as it is printed.
    return run_in_child(work, name=label, confine=confine, timeout=timeout,
                        forward=True)


def plain_arrays(values: Sequence) -> list:
    """Arrays as plain data a confined child may send: ``(IREE element
    type, shape, bytes)`` per array, None for anything else."""
    from ..buffers import dtype_name
    out: list = []
    for v in values:
        if isinstance(v, (np.ndarray, np.generic)):
            a = np.ascontiguousarray(v)
            out.append((dtype_name(a.dtype), list(a.shape), a.tobytes()))
        else:
            out.append(None)
    return out


def arrays_from_plain(items, label: str) -> list:
    """What :func:`plain_arrays` made, checked (a list of None or
    ``(element type, shape, bytes)`` whose element type is one IREE names
    and whose bytes fill the shape exactly) and made arrays again.

    Raises:
        ModuleError: an item of another shape (``field`` ``child``).
    """
    from ..buffers import DTYPES

    def bad(what):
        return ModuleError(f"the child process sent a result that is not "
                           f"an array ({what})", name=label, field="child",
                           value=what)
    if not isinstance(items, list):
        raise bad(type(items).__name__)
    out: list = []
    for item in items:
        if item is None:
            out.append(None)
            continue
        if (not isinstance(item, tuple) or len(item) != 3
                or not isinstance(item[0], str) or not isinstance(item[1], list)
                or not isinstance(item[2], bytes)
                or not all(isinstance(d, int) and 0 <= d < 1 << 48
                           for d in item[1])):
            raise bad("shape")
        name, shape, data = item
        if name not in DTYPES:
            raise bad(f"element type {name[:32]!r}")
        dtype = np.dtype(DTYPES[name])
        if int(np.prod(shape, dtype=object)) * dtype.itemsize != len(data):
            raise bad("size")
        out.append(np.frombuffer(data, dtype).reshape(shape).copy())
    return out


@contextlib.contextmanager
def watchdog(args, label: str):
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
