"""Helpers for tests that need real HAL executables compiled by ``iree-compile``.

The project loads IREE "embedded ELF" HAL executables (the shared objects that
``iree-compile`` embeds into a ``.vmfb`` for the ``llvm-cpu`` backend) and runs
their workgroups itself.  To exercise it on real code the tests need:

* the executables themselves (``compile_program`` dumps them next to the vmfb),
* for every dispatch the host program performs, the export name, the
  workgroup count, the push constants and the buffer bindings.  IREE computes
  those in the host-side VM code; ``compile_program`` also writes the
  HAL-level IR (``--compile-to=hal``) and ``plan_program`` / ``plan_dispatches``
  evaluate the public function of that IR for concrete inputs,
* a peer to compare with: ``reference_run`` runs the vmfb with IREE's own
  runtime (``iree.runtime``, ``local-sync`` driver).  Only a vmfb compiled for
  the host architecture (``host_arch()``) can run there; for the other
  architectures compile the same program for the host as well and compare
  against that.

How data flows through a plan
-----------------------------
Function arguments of tensor type arrive as ``!hal.buffer_view`` values; their
storage is ``BindingRef(kind='input', ref=N, ...)`` (N = argument index, the
caller's array in C order).  Results and intermediates live in *transient
buffers* allocated with ``hal.device.queue.alloca`` (``kind='buffer'``, ``ref``
= the SSA name without ``%``; ``ProgramPlan.buffers`` gives each one's size).
A single allocation often holds several values: e.g. a program returning a
matmul and its row sums uses one transient buffer for both and the second
dispatch binds the same buffer twice, with the offsets baked into the kernel.
After the last dispatch, each result is a ``hal.buffer_view.create`` over a
range of a transient buffer (or, when a function returns an argument
unchanged, the input itself); ``ProgramPlan.results`` records those ranges
with shape and dtype.  For the single-dispatch programs in ``tests/programs``
the result is the last binding of the dispatch.

Besides dispatches the host code may record transfers (``fill_buffer``,
``copy_buffer``); ``ProgramPlan.steps`` keeps them in order with the dispatches
and ``run_plan`` performs them with numpy.  ``plan_dispatches`` refuses programs
that contain transfers so that a test cannot silently skip one.

Every function here is pure apart from writing into the ``out_dir`` passed to
``compile_program`` (which doubles as a cache: a directory whose stamp matches
the source, flags and compiler version is reused).
"""

from __future__ import annotations

import functools
import hashlib
import os
import platform
import re
import shutil
import struct
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence, Union

import numpy as np

__all__ = [
    "PROGRAMS_DIR", "ARCHES", "TRIPLES", "BASE_FLAGS", "VARIANT_NAMES",
    "ProgramSpec", "PROGRAMS",
    "Compiled", "compile_program", "compile_many", "host_arch", "iree_compile_version",
    "EvaluationError", "BindingRef", "Dispatch", "FillStep", "CopyStep",
    "ResultRef", "ProgramPlan", "plan_program", "plan_dispatches",
    "run_plan", "reference_run",
]

PROGRAMS_DIR = Path(__file__).resolve().parent / "programs"

ARCHES = ("x86_64", "aarch64", "riscv64", "x86_32", "arm32", "riscv32")

#: iree-compile flags selecting each target architecture.
TRIPLES: dict[str, list[str]] = {
    "x86_64": ["--iree-llvmcpu-target-triple=x86_64-pc-linux-elf",
               "--iree-llvmcpu-target-cpu=generic"],
    "aarch64": ["--iree-llvmcpu-target-triple=aarch64-pc-linux-elf",
                "--iree-llvmcpu-target-cpu=generic"],
    "riscv64": ["--iree-llvmcpu-target-triple=riscv64-pc-linux-elf",
                "--iree-llvmcpu-target-cpu=generic-rv64",
                "--iree-llvmcpu-target-cpu-features=+m,+a,+f,+d,+c",
                "--iree-llvmcpu-target-abi=lp64d"],
    "x86_32": ["--iree-llvmcpu-target-triple=i686-pc-linux-elf",
               "--iree-llvmcpu-target-cpu=generic"],
    "arm32": ["--iree-llvmcpu-target-triple=armv7a-pc-linux-elf",
              "--iree-llvmcpu-target-cpu=generic",
              "--iree-llvmcpu-target-float-abi=hard"],
    "riscv32": ["--iree-llvmcpu-target-triple=riscv32-pc-linux-elf",
                "--iree-llvmcpu-target-cpu=generic-rv32",
                "--iree-llvmcpu-target-cpu-features=+m,+f",
                "--iree-llvmcpu-target-abi=ilp32"],
}

#: Flags common to every compile: the local device with the llvm-cpu backend.
BASE_FLAGS: list[str] = [
    "--iree-hal-target-device=local",
    "--iree-hal-local-target-device-backends=llvm-cpu",
]

#: Name IREE gives the executable variant (and the suffix of the dumped file
#: ``module_<executable>_<variant>.so``) for each architecture.
VARIANT_NAMES: dict[str, str] = {
    "x86_64": "embedded_elf_x86_64",
    "aarch64": "embedded_elf_arm_64",
    "riscv64": "embedded_elf_riscv_64",
    "x86_32": "embedded_elf_x86_32",
    "arm32": "embedded_elf_arm_32",
    "riscv32": "embedded_elf_riscv_32",
}


def host_arch() -> str:
    """The architecture name (a key of TRIPLES) of the machine running Python."""
    m = platform.machine().lower()
    table = {"x86_64": "x86_64", "amd64": "x86_64", "aarch64": "aarch64",
             "arm64": "aarch64", "riscv64": "riscv64", "i386": "x86_32",
             "i686": "x86_32", "armv7l": "arm32", "riscv32": "riscv32"}
    if m not in table:
        raise RuntimeError(f"unsupported host machine {m!r}")
    return table[m]


# ---------------------------------------------------------------------------
# The test programs
# ---------------------------------------------------------------------------

@dataclass(frozen=True)
class ProgramSpec:
    """One program of tests/programs with its inputs and numpy reference."""

    name: str
    function: str
    #: make_inputs(rng, **params) -> list of inputs (arrays / python scalars)
    make_inputs: Callable[..., list]
    #: numpy_reference(inputs) -> list of expected outputs
    numpy_reference: Callable[[Sequence[Any]], list]
    #: single-dispatch programs whose outputs are exactly the last binding(s)
    num_dispatches: int = 1

    @property
    def path(self) -> Path:
        return PROGRAMS_DIR / f"{self.name}.mlir"


def _f32(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


PROGRAMS: dict[str, ProgramSpec] = {
    "mul_add": ProgramSpec(
        "mul_add", "mul_add",
        lambda rng: [_f32(rng, 10007), _f32(rng, 10007)],
        lambda i: [i[0] * i[1] + i[0]]),
    "matmul": ProgramSpec(
        "matmul", "matmul",
        lambda rng: [_f32(rng, 37, 53), _f32(rng, 53, 29)],
        lambda i: [i[0] @ i[1]]),
    "sum_last": ProgramSpec(
        "sum_last", "sum_last",
        lambda rng: [_f32(rng, 33, 257)],
        lambda i: [i[0].sum(axis=-1, dtype=np.float32)]),
    "scale_dyn": ProgramSpec(
        "scale_dyn", "scale_dyn",
        lambda rng, n=1000, s=1.75: [_f32(rng, n), float(s)],
        lambda i: [i[0] * np.float32(i[1]) + i[0]]),
    "add_i32": ProgramSpec(
        "add_i32", "add_i32",
        lambda rng: [rng.integers(-2**31, 2**31, 513, dtype=np.int64).astype(np.int32),
                     rng.integers(-2**31, 2**31, 513, dtype=np.int64).astype(np.int32)],
        lambda i: [((i[0].astype(np.int64) + i[1]) * 3 - i[0]).astype(np.int32)]),
    "mm_rowsum": ProgramSpec(
        "mm_rowsum", "mm_rowsum",
        lambda rng: [_f32(rng, 37, 53), _f32(rng, 53, 29)],
        lambda i: [np.tanh(i[0] @ i[1]).sum(axis=-1, dtype=np.float32), i[0] @ i[1]],
        num_dispatches=2),
}


# ---------------------------------------------------------------------------
# Compiling
# ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Compiled:
    """Outputs of compile_program for one (program, architecture)."""

    source: Path
    arch: str
    vmfb: Path
    hal_mlir: Path
    #: every embedded ELF that iree-compile dumped (one per hal.executable;
    #: none for a program without dispatches)
    so_files: tuple[Path, ...]
    #: public function names of the module, in order of appearance
    functions: tuple[str, ...]

    @property
    def function(self) -> str:
        """The single public function (error if the module has several)."""
        if len(self.functions) != 1:
            raise ValueError(f"{self.source.name} has public functions "
                             f"{list(self.functions)}; name one")
        return self.functions[0]

    @property
    def variant(self) -> str:
        return VARIANT_NAMES[self.arch]

    def so_for(self, executable: str, variant: str | None = None) -> Path:
        """The dumped .so of hal.executable @executable (variant @variant).

        iree-compile names dumps ``<module>_<executable>_<variant>.so`` where
        <module> is the MLIR module name, ``module`` for an unnamed module.
        """
        variant = variant or self.variant
        exact = f"module_{executable}_{variant}.so"
        for p in self.so_files:
            if p.name == exact:
                return p
        hits = [p for p in self.so_files if p.name.endswith(f"_{executable}_{variant}.so")]
        if len(hits) != 1:
            raise FileNotFoundError(
                f"no unique dumped binary for executable {executable!r} variant "
                f"{variant!r} among {[p.name for p in self.so_files]}")
        return hits[0]


def _iree_compile() -> str:
    exe = shutil.which("iree-compile")
    if exe is None:
        raise FileNotFoundError("iree-compile not found on PATH "
                                "(pip install iree-base-compiler)")
    return exe


@functools.lru_cache(maxsize=None)
def iree_compile_version() -> str:
    out = subprocess.run([_iree_compile(), "--version"], capture_output=True,
                         text=True, check=True)
    return (out.stdout + out.stderr).strip()


def _run_compile(args: list[str]) -> None:
    proc = subprocess.run(args, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"iree-compile failed ({proc.returncode}):\n"
                           f"$ {' '.join(args)}\n{proc.stderr}")


def _public_functions(hal_text: str) -> tuple[str, ...]:
    return tuple(re.findall(r"^\s*util\.func public @([\w$.-]+)\(", hal_text, re.M))


def compile_program(mlir_path: Union[str, os.PathLike], arch: str,
                    out_dir: Union[str, os.PathLike], *,
                    extra_flags: Sequence[str] = ()) -> Compiled:
    """Compile an MLIR program for ``arch`` into ``out_dir/<stem>-<arch>/``.

    Produces ``<stem>.vmfb``, ``binaries/*.so`` (the embedded ELFs, via
    ``--iree-hal-dump-executable-binaries-to``) and ``<stem>.hal.mlir`` (the
    host-side IR, identical to ``--compile-to=hal`` output; taken from the same
    run's ``--dump-compilation-phases-to`` output, falling back to a second
    ``--compile-to=hal`` run if that phase is missing).  The result
    directory carries a stamp (hash of source text, flags and compiler
    version); a matching directory is reused, so passing a session-wide cache
    directory makes repeated calls cheap.
    """
    mlir_path = Path(mlir_path).resolve()
    if arch not in TRIPLES:
        raise ValueError(f"unknown arch {arch!r}; expected one of {list(TRIPLES)}")
    flags = BASE_FLAGS + TRIPLES[arch] + list(extra_flags)
    key = hashlib.sha256("\0".join(
        [mlir_path.read_text(), *flags, iree_compile_version()]).encode()).hexdigest()
    out_dir = Path(out_dir)
    dest = out_dir / f"{mlir_path.stem}-{arch}"
    stamp = dest / "stamp.txt"
    vmfb = dest / f"{mlir_path.stem}.vmfb"
    hal = dest / f"{mlir_path.stem}.hal.mlir"
    dump = dest / "binaries"

    if not (stamp.is_file() and stamp.read_text() == key and vmfb.is_file()
            and hal.is_file()):
        out_dir.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}-", dir=out_dir))
        try:
            tdump = tmp / "binaries"
            tdump.mkdir()
            phases = tmp / "phases"
            # One run gives the vmfb, the dumped ELFs and (as a compilation
            # phase) the HAL-level IR of that very compile.
            _run_compile([_iree_compile(), str(mlir_path), "-o", str(tmp / vmfb.name),
                          *flags, f"--iree-hal-dump-executable-binaries-to={tdump}",
                          f"--dump-compilation-phases-to={phases}"])
            hal_phase = sorted(phases.glob("*.hal.mlir"))
            if len(hal_phase) == 1:
                os.replace(hal_phase[0], tmp / hal.name)
            else:
                _run_compile([_iree_compile(), str(mlir_path), "--compile-to=hal",
                              "-o", str(tmp / hal.name), *flags])
            shutil.rmtree(phases, ignore_errors=True)
            (tmp / "stamp.txt").write_text(key)
            if dest.exists():
                shutil.rmtree(dest)
            try:
                os.replace(tmp, dest)
            except OSError:
                # another process won the race; use its result
                if not (dest / "stamp.txt").is_file():
                    raise
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)

    so_files = tuple(sorted(dump.glob("*.so")))
    return Compiled(source=mlir_path, arch=arch, vmfb=vmfb, hal_mlir=hal,
                    so_files=so_files, functions=_public_functions(hal.read_text()))


def compile_many(jobs: Iterable[tuple[Union[str, os.PathLike], str]],
                 out_dir: Union[str, os.PathLike], *, max_workers: int | None = None,
                 extra_flags: Sequence[str] = ()) -> list[Compiled]:
    """compile_program for several (mlir_path, arch) pairs, in parallel."""
    from concurrent.futures import ThreadPoolExecutor

    jobs = list(jobs)
    with ThreadPoolExecutor(max_workers or os.cpu_count() or 2) as pool:
        return list(pool.map(lambda j: compile_program(j[0], j[1], out_dir,
                                                       extra_flags=extra_flags), jobs))


# ---------------------------------------------------------------------------
# Plan data types
# ---------------------------------------------------------------------------

class EvaluationError(RuntimeError):
    """The HAL-level IR needs something the evaluator cannot compute."""


@dataclass(frozen=True)
class BindingRef:
    """A byte range of a function input (kind='input', ref=argument index)
    or of a buffer the program allocates (kind='buffer', ref=SSA name)."""

    kind: str
    ref: Union[int, str]
    offset: int
    length: int


@dataclass(frozen=True)
class Dispatch:
    so_path: Path
    export_name: str
    workgroup_count: tuple[int, int, int]
    constants: list[int]          # push constants as uint32
    bindings: list[BindingRef]
    executable: str = ""          # hal.executable symbol
    variant: str = ""             # hal.executable.binary / variant symbol


@dataclass(frozen=True)
class FillStep:
    target: BindingRef
    pattern: bytes                # repeated over target


@dataclass(frozen=True)
class CopyStep:
    source: BindingRef
    target: BindingRef


@dataclass(frozen=True)
class ResultRef:
    storage: BindingRef
    shape: tuple[int, ...]
    dtype: np.dtype


@dataclass
class ProgramPlan:
    function: str
    #: dispatches and transfers in execution order
    steps: list[Union[Dispatch, FillStep, CopyStep]]
    #: transient buffers: SSA name -> size in bytes
    buffers: dict[str, int]
    results: list[ResultRef]

    @property
    def dispatches(self) -> list[Dispatch]:
        return [s for s in self.steps if isinstance(s, Dispatch)]


# ---------------------------------------------------------------------------
# Parsing the HAL-level IR
# ---------------------------------------------------------------------------

_SSA = r"%[\w$.\-]+(?:#\d+)?"
_SSA_RE = re.compile(_SSA)


def _scan_blocks(text: str, start: int) -> int:
    """Return the index just past the '}' matching the '{' at text[start]."""
    depth = 0
    i, n = start, len(text)
    while i < n:
        c = text[i]
        if c == '"':
            i += 1
            while i < n and text[i] != '"':
                i += 2 if text[i] == "\\" else 1
        elif c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    raise EvaluationError("unbalanced braces in HAL IR")


def _strip_comment(line: str) -> str:
    in_str = False
    i = 0
    while i < len(line):
        c = line[i]
        if in_str:
            if c == "\\":
                i += 1
            elif c == '"':
                in_str = False
        elif c == '"':
            in_str = True
        elif line.startswith("//", i):
            return line[:i]
        i += 1
    return line


def _split_statements(body: str) -> list[str]:
    """Split a region body into statements (newline at bracket depth 0)."""
    stmts, cur, depth, in_str = [], [], 0, False
    i, n = 0, len(body)
    while i < n:
        c = body[i]
        if in_str:
            cur.append(c)
            if c == "\\" and i + 1 < n:
                cur.append(body[i + 1])
                i += 1
            elif c == '"':
                in_str = False
        elif c == '"':
            in_str = True
            cur.append(c)
        elif c in "([{":
            depth += 1
            cur.append(c)
        elif c in ")]}":
            depth -= 1
            cur.append(c)
        elif c == "\n" and depth <= 0:
            s = _strip_comment("".join(cur)).strip()
            if s:
                stmts.append(s)
            cur = []
        else:
            cur.append(c)
        i += 1
    s = _strip_comment("".join(cur)).strip()
    if s:
        stmts.append(s)
    return stmts


@dataclass
class _Op:
    results: list[str]
    name: str
    rest: str       # text after the op name
    text: str       # whole statement


@dataclass
class _Block:
    label: str
    args: list[str]
    ops: list[_Op] = field(default_factory=list)


@dataclass
class _Func:
    name: str
    args: list[tuple[str, str]]   # (ssa name, type)
    blocks: list[_Block]


_OP_RE = re.compile(
    r"^(?:(?P<res>%[\w$.\-]+(?::\d+)?(?:\s*,\s*%[\w$.\-]+(?::\d+)?)*)\s*=\s*)?"
    r"\"?(?P<name>[A-Za-z_][\w$]*(?:\.[\w$]+)+)\"?(?P<rest>.*)$", re.S)


def _parse_op(stmt: str) -> _Op:
    m = _OP_RE.match(stmt)
    if not m:
        raise EvaluationError(f"cannot parse statement: {stmt[:200]}")
    results = []
    if m.group("res"):
        for r in m.group("res").split(","):
            r = r.strip()
            if ":" in r:
                base, cnt = r.split(":")
                results += [f"{base}#{k}" for k in range(int(cnt))]
            else:
                results.append(r)
    return _Op(results, m.group("name"), m.group("rest"), stmt)


def _parse_region(body: str) -> list[_Block]:
    blocks = [_Block("^entry", [])]
    for stmt in _split_statements(body):
        if stmt.startswith("^"):
            m = re.match(r"^(\^[\w$.\-]+)(?:\((.*)\))?\s*:$", stmt, re.S)
            if not m:
                raise EvaluationError(f"cannot parse block label: {stmt}")
            args = _SSA_RE.findall(m.group(2) or "")
            if not blocks[-1].ops and blocks[-1].label == "^entry":
                blocks[-1] = _Block(m.group(1), args)
            else:
                blocks.append(_Block(m.group(1), args))
        else:
            blocks[-1].ops.append(_parse_op(stmt))
    return blocks


def _split_top_level(s: str, sep: str = ",") -> list[str]:
    parts, depth, cur, in_str = [], 0, [], False
    for c in s:
        if in_str:
            cur.append(c)
            if c == '"':
                in_str = False
            continue
        if c == '"':
            in_str = True
        elif c in "([{<":
            depth += 1
        elif c in ")]}>":
            depth -= 1
        if c == sep and depth == 0:
            parts.append("".join(cur).strip())
            cur = []
        else:
            cur.append(c)
    if "".join(cur).strip():
        parts.append("".join(cur).strip())
    return parts


@dataclass
class _Module:
    funcs: dict[str, _Func]
    public: list[str]
    initializers: list[_Func]
    global_inits: dict[str, str]        # @name -> initial value text
    global_types: dict[str, str]
    aliases: dict[str, str]             # #alias -> text


def _parse_module(text: str) -> _Module:
    funcs: dict[str, _Func] = {}
    public: list[str] = []
    inits: list[_Func] = []
    aliases = {m.group(1): m.group(2).strip() for m in
               re.finditer(r"^(#[\w$.\-]+)\s*=\s*(.*)$", text, re.M)}
    global_inits, global_types = {}, {}
    for m in re.finditer(r"^\s*util\.global\s+(?:private|public)?\s*(?:mutable\s+)?"
                         r"@([\w$.\-]+)\s*(?:=\s*([^:]+?))?\s*:\s*(.+)$", text, re.M):
        global_types[m.group(1)] = m.group(3).strip()
        if m.group(2):
            global_inits[m.group(1)] = m.group(2).strip()

    for m in re.finditer(r"^\s*util\.func\s+(public|private)\s+@([\w$.\-]+)\(", text, re.M):
        vis, name = m.group(1), m.group(2)
        # argument list
        open_paren = m.end() - 1
        close = _scan_blocks(text, open_paren)
        argtext = text[open_paren + 1:close - 1]
        args = []
        for a in _split_top_level(argtext):
            if not a:
                continue
            am = re.match(r"^(%[\w$.\-]+)\s*:\s*(.*?)(?:\s*\{.*\})?$", a, re.S)
            if not am:
                raise EvaluationError(f"cannot parse argument {a!r} of @{name}")
            args.append((am.group(1), am.group(2).strip()))
        # body: the '{' on the header line that ends the line (an attribute
        # dictionary such as `attributes {...}` is skipped as a whole)
        i = close
        body_start = None
        while i < len(text) and text[i] != "\n":
            c = text[i]
            if c == "{":
                eol = text.find("\n", i)
                if text[i + 1:eol if eol >= 0 else len(text)].strip() == "":
                    body_start = i
                    break
                i = _scan_blocks(text, i)
                continue
            if c == '"':
                i += 1
                while i < len(text) and text[i] != '"':
                    i += 2 if text[i] == "\\" else 1
            i += 1
        if body_start is None:
            continue          # declaration without body
        end = _scan_blocks(text, body_start)
        funcs[name] = _Func(name, args, _parse_region(text[body_start + 1:end - 1]))
        if vis == "public":
            public.append(name)

    for m in re.finditer(r"^\s*util\.initializer\s*\{\s*$", text, re.M):
        start = text.index("{", m.start())
        end = _scan_blocks(text, start)
        inits.append(_Func("<initializer>", [], _parse_region(text[start + 1:end - 1])))
    return _Module(funcs, public, inits, global_inits, global_types, aliases)


@functools.lru_cache(maxsize=32)
def _load_module(path: str, mtime_ns: int) -> _Module:
    return _parse_module(Path(path).read_text())


def _module_for(path: Path) -> _Module:
    path = Path(path).resolve()
    return _load_module(str(path), path.stat().st_mtime_ns)


# ---------------------------------------------------------------------------
# Values
# ---------------------------------------------------------------------------

@dataclass(frozen=True)
class _Unknown:
    """Result of an op the evaluator does not model."""

    op: str
    text: str


@dataclass(frozen=True)
class _Opaque:
    what: str


@dataclass(frozen=True)
class _InputView:
    index: int


@dataclass(frozen=True)
class _Buffer:
    kind: str                 # 'input' | 'buffer'
    ref: Union[int, str]
    base: int = 0


@dataclass(frozen=True)
class _ElementType:
    name: str


@dataclass(frozen=True)
class _FunctionRef:
    executable: str
    variant: str
    export: str


@dataclass
class _CommandBuffer:
    commands: list = field(default_factory=list)


@dataclass(frozen=True)
class _View:
    buffer: _Buffer
    offset: int
    length: int
    shape: tuple[int, ...]
    etype: str


_DTYPES = {
    "f16": np.float16, "f32": np.float32, "f64": np.float64,
    "i8": np.int8, "i16": np.int16, "i32": np.int32, "i64": np.int64,
    "si8": np.int8, "si16": np.int16, "si32": np.int32, "si64": np.int64,
    "ui8": np.uint8, "ui16": np.uint16, "ui32": np.uint32, "ui64": np.uint64,
    "i1": np.bool_,
}


def _int_width(ty: str) -> int | None:
    ty = ty.strip()
    if ty == "index":
        return 64
    m = re.fullmatch(r"i(\d+)", ty)
    return int(m.group(1)) if m else None


def _float_fmt(ty: str) -> str | None:
    return {"f16": "e", "f32": "f", "f64": "d"}.get(ty.strip())


def _wrap(v: int, w: int) -> int:
    return v & ((1 << w) - 1)


def _signed(v: int, w: int) -> int:
    v = _wrap(v, w)
    return v - (1 << w) if w and v >> (w - 1) else v


def _round_float(v: float, ty: str) -> float:
    fmt = _float_fmt(ty)
    if fmt is None:
        raise EvaluationError(f"unsupported float type {ty}")
    return struct.unpack("<" + fmt, struct.pack("<" + fmt, v))[0]


# ---------------------------------------------------------------------------
# Affine maps
# ---------------------------------------------------------------------------

def _eval_affine(map_text: str, dims: list[int], syms: list[int]) -> list[int]:
    m = re.fullmatch(r"\s*\(([^)]*)\)\s*(?:\[([^\]]*)\])?\s*->\s*\((.*)\)\s*", map_text, re.S)
    if not m:
        raise EvaluationError(f"cannot parse affine map {map_text!r}")
    dnames = [d.strip() for d in m.group(1).split(",") if d.strip()]
    snames = [s.strip() for s in (m.group(2) or "").split(",") if s.strip()]
    if len(dnames) != len(dims) or len(snames) != len(syms):
        raise EvaluationError(f"affine map {map_text!r} applied to {len(dims)} dims, "
                              f"{len(syms)} symbols")
    env = dict(zip(dnames, dims)) | dict(zip(snames, syms))
    return [_AffineParser(e, env).parse() for e in _split_top_level(m.group(3))]


class _AffineParser:
    _TOK = re.compile(r"\s*(floordiv|ceildiv|mod|[A-Za-z_]\w*|\d+|[-+*()])")

    def __init__(self, text: str, env: dict[str, int]):
        self.toks, pos = [], 0
        text = text.strip()
        while pos < len(text):
            m = self._TOK.match(text, pos)
            if not m:
                raise EvaluationError(f"cannot parse affine expression {text!r}")
            self.toks.append(m.group(1))
            pos = m.end()
        self.i, self.env, self.text = 0, env, text

    def _peek(self):
        return self.toks[self.i] if self.i < len(self.toks) else None

    def _next(self):
        t = self._peek()
        self.i += 1
        return t

    def parse(self) -> int:
        v = self._sum()
        if self._peek() is not None:
            raise EvaluationError(f"trailing tokens in affine expression {self.text!r}")
        return v

    def _sum(self) -> int:
        v = self._prod()
        while self._peek() in ("+", "-"):
            op = self._next()
            r = self._prod()
            v = v + r if op == "+" else v - r
        return v

    def _prod(self) -> int:
        v = self._unary()
        while self._peek() in ("*", "floordiv", "ceildiv", "mod"):
            op = self._next()
            r = self._unary()
            if op == "*":
                v = v * r
            elif op == "floordiv":
                v = v // r
            elif op == "ceildiv":
                v = -((-v) // r)
            else:
                v = v % r if r > 0 else v - r * (v // r)
        return v

    def _unary(self) -> int:
        t = self._next()
        if t == "-":
            return -self._unary()
        if t == "(":
            v = self._sum()
            if self._next() != ")":
                raise EvaluationError(f"unbalanced parentheses in {self.text!r}")
            return v
        if t is not None and t.isdigit():
            return int(t)
        if t in self.env:
            return self.env[t]
        raise EvaluationError(f"unexpected token {t!r} in affine expression {self.text!r}")


# ---------------------------------------------------------------------------
# The evaluator
# ---------------------------------------------------------------------------

_CMPI = {
    "eq": lambda a, b, w: a == b, "ne": lambda a, b, w: a != b,
    "slt": lambda a, b, w: _signed(a, w) < _signed(b, w),
    "sle": lambda a, b, w: _signed(a, w) <= _signed(b, w),
    "sgt": lambda a, b, w: _signed(a, w) > _signed(b, w),
    "sge": lambda a, b, w: _signed(a, w) >= _signed(b, w),
    "ult": lambda a, b, w: a < b, "ule": lambda a, b, w: a <= b,
    "ugt": lambda a, b, w: a > b, "uge": lambda a, b, w: a >= b,
}


def _tdiv(a: int, b: int) -> int:
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b >= 0) else -q


class _Evaluator:
    MAX_STEPS = 1_000_000

    def __init__(self, module: _Module, compiled: Compiled | None):
        self.m = module
        self.compiled = compiled
        self.globals: dict[str, Any] = {}
        self.buffers: dict[str, int] = {}
        self.steps: list = []
        self.inputs: list = []
        self.steps_left = self.MAX_STEPS

    # -- helpers -----------------------------------------------------------
    def need(self, env: dict, name: str, what: str) -> Any:
        if name not in env:
            raise EvaluationError(f"{what}: SSA value {name} is not defined")
        v = env[name]
        if isinstance(v, _Unknown):
            raise EvaluationError(
                f"{what} depends on {name}, produced by unsupported op "
                f"'{v.op}': {v.text[:300]}")
        return v

    def need_int(self, env, name, what) -> int:
        v = self.need(env, name, what)
        if not isinstance(v, int):
            raise EvaluationError(f"{what}: {name} is not an integer ({v!r})")
        return int(v)

    # -- functions ---------------------------------------------------------
    def call(self, func: _Func, args: list) -> list:
        env: dict[str, Any] = {}
        if len(args) != len(func.args):
            raise EvaluationError(f"@{func.name} called with {len(args)} args, "
                                  f"expects {len(func.args)}")
        for (name, _), v in zip(func.args, args):
            env[name] = v
        blocks = {b.label: b for b in func.blocks}
        block = func.blocks[0]
        while True:
            for op in block.ops:
                self.steps_left -= 1
                if self.steps_left < 0:
                    raise EvaluationError("evaluation step limit exceeded (infinite loop?)")
                if op.name in ("util.return", "func.return"):
                    return [env.get(r, _Unknown("?", r)) for r in _SSA_RE.findall(op.rest.split(":")[0])]
                if op.name == "cf.br":
                    block = self._branch(op.rest, env, blocks)
                    break
                if op.name == "cf.cond_br":
                    cm = re.match(r"\s*(" + _SSA + r")\s*,\s*(.*)$", op.rest, re.S)
                    cond = self.need(env, cm.group(1), "cf.cond_br condition")
                    targets = _split_top_level(cm.group(2))
                    block = self._branch(targets[0] if cond else targets[1], env, blocks)
                    break
                self.exec_op(op, env)
            else:
                raise EvaluationError(f"block {block.label} of @{func.name} has no terminator")

    def _branch(self, text: str, env, blocks) -> _Block:
        m = re.match(r"\s*(\^[\w$.\-]+)(?:\((.*)\))?", text, re.S)
        target = blocks[m.group(1)]
        vals = [env.get(v, _Unknown("?", v)) for v in
                _SSA_RE.findall((m.group(2) or "").split(":")[0])]
        for a, v in zip(target.args, vals):
            env[a] = v
        return target

    def load_global(self, name: str) -> Any:
        if name in self.globals:
            return self.globals[name]
        ty = self.m.global_types.get(name, "")
        if name in self.m.global_inits:
            val = self._constant(self.m.global_inits[name] + " : " + ty, f"@{name}")
            self.globals[name] = val
            return val
        if "!hal.command_buffer" in ty:
            # memoized command buffer: run the initializer that stores it
            for init in self.m.initializers:
                if any(op.name == "util.global.store" and f"@{name}" in op.rest
                       for b in init.blocks for op in b.ops):
                    self.call(init, [])
                    break
            if name not in self.globals:
                raise EvaluationError(f"no initializer stores command buffer @{name}")
            return self.globals[name]
        return _Opaque(f"global @{name}")

    # -- ops ---------------------------------------------------------------
    def _constant(self, text: str, where: str) -> Any:
        m = re.fullmatch(r"\s*(.*?)\s*(?::\s*(\S+))?\s*", text, re.S)
        lit, ty = m.group(1), (m.group(2) or "")
        if lit in ("true", "false") and not ty:
            return 1 if lit == "true" else 0
        w = _int_width(ty)
        if w is not None and re.fullmatch(r"-?(0x[0-9a-fA-F]+|\d+)", lit):
            return _wrap(int(lit, 0), w)
        fmt = _float_fmt(ty)
        if fmt is not None:
            if lit.startswith("0x"):
                bits = int(lit, 16)
                return struct.unpack("<" + fmt, bits.to_bytes(struct.calcsize(fmt), "little"))[0]
            try:
                return _round_float(float(lit), ty)
            except ValueError:
                pass
        return _Unknown("arith.constant", f"{where}: {text}")

    def exec_op(self, op: _Op, env: dict) -> None:
        name = op.name
        handler = getattr(self, "op_" + name.replace(".", "_"), None)
        if handler is None:
            if name.startswith("arith.") and name[6:] in _ARITH_BINARY:
                vals = self._arith_binary(op, env)
            else:
                vals = None
        else:
            vals = handler(op, env)
        if vals is None:
            vals = [_Unknown(name, op.text)] * len(op.results)
        elif not isinstance(vals, list):
            vals = [vals]
        if len(vals) != len(op.results):
            raise EvaluationError(f"'{name}' produced {len(vals)} values for "
                                  f"{len(op.results)} results: {op.text[:200]}")
        for r, v in zip(op.results, vals):
            env[r] = v

    @staticmethod
    def _operands(op: _Op) -> list[str]:
        head = op.rest.rsplit(" : ", 1)[0] if " : " in op.rest else op.rest
        head = re.sub(r"overflow<[^>]*>", "", head)
        return _SSA_RE.findall(head)

    @staticmethod
    def _type(op: _Op) -> str:
        if " : " not in op.rest:
            raise EvaluationError(f"no type on '{op.name}': {op.text[:200]}")
        return op.rest.rsplit(" : ", 1)[1].strip()

    def _args(self, op, env):
        """Operand values, or None when any is unknown (result becomes unknown)."""
        vals = []
        for n in self._operands(op):
            if n not in env:
                raise EvaluationError(f"'{op.name}': SSA value {n} is not defined")
            v = env[n]
            if isinstance(v, _Unknown):
                return None
            vals.append(v)
        return vals

    def _poison_from(self, op, env):
        for n in self._operands(op):
            if isinstance(env.get(n), _Unknown):
                return env[n]
        return None

    def _arith_binary(self, op, env):
        vals = self._args(op, env)
        if vals is None:
            return self._poison_from(op, env)
        ty = self._type(op)
        a, b = vals
        w = _int_width(ty)
        kind = op.name[6:]
        if w is None:
            if kind in _FLOAT_BINARY and _float_fmt(ty):
                return _round_float(_FLOAT_BINARY[kind](a, b), ty)
            return _Unknown(op.name, op.text)
        sa, sb = _signed(a, w), _signed(b, w)
        ua, ub = _wrap(a, w), _wrap(b, w)
        if kind in ("divsi", "divui", "ceildivsi", "ceildivui", "floordivsi",
                    "remsi", "remui") and ub == 0:
            raise EvaluationError(f"division by zero in {op.text}")
        r = {
            "addi": lambda: ua + ub, "subi": lambda: ua - ub, "muli": lambda: ua * ub,
            "divsi": lambda: _tdiv(sa, sb), "divui": lambda: ua // ub,
            "ceildivsi": lambda: -((-sa) // sb),
            "ceildivui": lambda: -((-ua) // ub),
            "floordivsi": lambda: sa // sb,
            "remsi": lambda: sa - sb * _tdiv(sa, sb), "remui": lambda: ua % ub,
            "andi": lambda: ua & ub, "ori": lambda: ua | ub, "xori": lambda: ua ^ ub,
            "shli": lambda: ua << ub if ub < w else 0,
            "shrui": lambda: ua >> ub if ub < w else 0,
            "shrsi": lambda: sa >> min(ub, w - 1),
            "maxsi": lambda: max(sa, sb), "minsi": lambda: min(sa, sb),
            "maxui": lambda: max(ua, ub), "minui": lambda: min(ua, ub),
        }.get(kind)
        if r is None:
            return _Unknown(op.name, op.text)
        return _wrap(r(), w)

    def op_arith_constant(self, op, env):
        return self._constant(op.rest, op.text)

    def op_arith_cmpi(self, op, env):
        pm = re.match(r"\s*(\w+)\s*,", op.rest)
        pred = pm.group(1)
        vals = self._args(op, env)
        if vals is None:
            return self._poison_from(op, env)
        w = _int_width(self._type(op))
        if pred not in _CMPI or w is None:
            return _Unknown(op.name, op.text)
        return int(_CMPI[pred](_wrap(vals[0], w), _wrap(vals[1], w), w))

    def op_util_align(self, op, env):
        """``util.align %v, %a``: %v rounded up to a multiple of %a."""
        vals = self._args(op, env)
        if vals is None:
            return self._poison_from(op, env)
        value, align = vals
        return -(-value // align) * align

    def op_arith_select(self, op, env):
        names = self._operands(op)
        c = env.get(names[0])
        if isinstance(c, _Unknown):
            return c
        chosen = env.get(names[1] if c else names[2])
        return chosen

    def _cast(self, op, env, fn):
        m = re.match(r"\s*(" + _SSA + r")\s*:\s*(\S+)\s+to\s+(\S+)", op.rest)
        if not m:
            raise EvaluationError(f"cannot parse cast: {op.text}")
        v = env.get(m.group(1))
        if isinstance(v, _Unknown):
            return v
        if v is None:
            raise EvaluationError(f"'{op.name}': SSA value {m.group(1)} is not defined")
        return fn(v, m.group(2), m.group(3))

    def op_arith_index_cast(self, op, env):
        return self._cast(op, env, lambda v, s, d: _wrap(_signed(v, _int_width(s)), _int_width(d)))

    def op_arith_index_castui(self, op, env):
        return self._cast(op, env, lambda v, s, d: _wrap(_wrap(v, _int_width(s)), _int_width(d)))

    op_arith_extui = op_arith_index_castui
    op_arith_trunci = op_arith_index_castui
    op_arith_extsi = op_arith_index_cast

    def op_arith_bitcast(self, op, env):
        def f(v, s, d):
            if _float_fmt(s) and _int_width(d):
                fmt = _float_fmt(s)
                return int.from_bytes(struct.pack("<" + fmt, v), "little")
            if _int_width(s) and _float_fmt(d):
                fmt = _float_fmt(d)
                return struct.unpack("<" + fmt, _wrap(v, _int_width(s)).to_bytes(
                    struct.calcsize(fmt), "little"))[0]
            if _int_width(s) and _int_width(d):
                return v
            return _Unknown(op.name, op.text)
        return self._cast(op, env, f)

    def op_arith_sitofp(self, op, env):
        return self._cast(op, env, lambda v, s, d: _round_float(float(_signed(v, _int_width(s))), d))

    def op_arith_uitofp(self, op, env):
        return self._cast(op, env, lambda v, s, d: _round_float(float(v), d))

    def op_arith_fptosi(self, op, env):
        return self._cast(op, env, lambda v, s, d: _wrap(int(v), _int_width(d)))

    op_arith_fptoui = op_arith_fptosi

    def op_arith_extf(self, op, env):
        return self._cast(op, env, lambda v, s, d: _round_float(v, d))

    op_arith_truncf = op_arith_extf

    def _affine(self, op, env):
        rest = op.rest.strip()
        if rest.startswith("#"):
            am = re.match(r"(#[\w$.\-]+)", rest)
            alias = self.m.aliases.get(am.group(1), "")
            rest = rest[am.end():]
            mm = re.fullmatch(r"affine_map<(.*)>", alias.strip(), re.S)
            if not mm:
                return _Unknown(op.name, op.text)
            map_text = mm.group(1)
        elif rest.startswith("affine_map<"):
            depth, i = 0, len("affine_map")
            while True:
                c = rest[i]
                if c == "<":
                    depth += 1
                elif c == ">" and rest[i - 1] != "-":
                    depth -= 1
                    if depth == 0:
                        break
                i += 1
            map_text = rest[len("affine_map<"):i]
            rest = rest[i + 1:]
        else:
            return _Unknown(op.name, op.text)
        am = re.match(r"\s*\(([^)]*)\)\s*(?:\[([^\]]*)\])?", rest)
        dims, syms = _SSA_RE.findall(am.group(1)), _SSA_RE.findall(am.group(2) or "")
        vals = []
        for n in dims + syms:
            v = env.get(n)
            if isinstance(v, _Unknown):
                return v
            vals.append(_signed(v, 64))
        res = _eval_affine(map_text, vals[:len(dims)], vals[len(dims):])
        return res

    def op_affine_apply(self, op, env):
        r = self._affine(op, env)
        return r if isinstance(r, _Unknown) else _wrap(r[0], 64)

    def op_affine_min(self, op, env):
        r = self._affine(op, env)
        return r if isinstance(r, _Unknown) else _wrap(min(r), 64)

    def op_affine_max(self, op, env):
        r = self._affine(op, env)
        return r if isinstance(r, _Unknown) else _wrap(max(r), 64)

    # util
    def op_util_null(self, op, env):
        return _Opaque("null")

    def op_util_global_load(self, op, env):
        m = re.search(r"@([\w$.\-]+)", op.rest)
        return self.load_global(m.group(1))

    def op_util_global_store(self, op, env):
        m = re.match(r"\s*(" + _SSA + r")\s*,\s*@([\w$.\-]+)", op.rest)
        self.globals[m.group(2)] = env.get(m.group(1))
        return []

    def op_util_call(self, op, env):
        m = re.match(r"\s*@([\w$.\-]+)\((.*?)\)\s*:", op.rest, re.S)
        callee = self.m.funcs.get(m.group(1))
        if callee is None:
            return None
        args = [env.get(a) for a in _SSA_RE.findall(m.group(2))]
        return self.call(callee, args)

    # hal: values
    def op_hal_element_type(self, op, env):
        m = re.match(r"<(\w+)>", op.rest)
        return _ElementType(m.group(1))

    def _input_index(self, env, name, what) -> int:
        v = self.need(env, name, what)
        if not isinstance(v, _InputView):
            raise EvaluationError(f"{what}: {name} is not a function input ({v!r})")
        return v.index

    def op_hal_buffer_view_dim(self, op, env):
        m = re.match(r"<(" + _SSA + r")\s*:[^>]*>\[(\d+)\]", op.rest)
        idx = self._input_index(env, m.group(1), op.name)
        shape = np.shape(self.inputs[idx])
        return _wrap(shape[int(m.group(2))], 64)

    def op_hal_buffer_view_dims(self, op, env):
        m = re.match(r"<(" + _SSA + r")", op.rest)
        idx = self._input_index(env, m.group(1), op.name)
        return [_wrap(d, 64) for d in np.shape(self.inputs[idx])]

    def op_hal_buffer_view_rank(self, op, env):
        m = re.match(r"<(" + _SSA + r")", op.rest)
        return np.ndim(self.inputs[self._input_index(env, m.group(1), op.name)])

    def op_hal_buffer_view_buffer(self, op, env):
        m = re.match(r"<(" + _SSA + r")", op.rest)
        v = self.need(env, m.group(1), op.name)
        if isinstance(v, _InputView):
            return _Buffer("input", v.index)
        if isinstance(v, _View):
            return _Buffer(v.buffer.kind, v.buffer.ref, v.buffer.base + v.offset)
        return None

    def op_hal_buffer_view_assert(self, op, env):
        m = re.match(r"<(" + _SSA + r")", op.rest)
        v = env.get(m.group(1))
        if not isinstance(v, _InputView):
            return []
        arr = self.inputs[v.index]
        msg = re.search(r'message\("([^"]*)"\)', op.rest)
        sm = re.search(r"shape\(\[(.*?)\]\)", op.rest)
        if sm:
            want = []
            for n in _SSA_RE.findall(sm.group(1)):
                d = env.get(n)
                want.append(None if isinstance(d, _Unknown) else _signed(d, 64))
            got = list(np.shape(arr))
            if len(want) != len(got) or any(w is not None and w != g for w, g in zip(want, got)):
                raise ValueError(f"{msg.group(1) if msg else 'input'}: expected shape "
                                 f"{want}, got {got}")
        tm = re.search(r"type\((" + _SSA + r")\)", op.rest)
        if tm:
            et = env.get(tm.group(1))
            if isinstance(et, _ElementType) and et.name in _DTYPES:
                if np.asarray(arr).dtype != np.dtype(_DTYPES[et.name]):
                    raise ValueError(f"{msg.group(1) if msg else 'input'}: expected "
                                     f"element type {et.name}, got {np.asarray(arr).dtype}")
        return []

    def op_hal_buffer_view_create(self, op, env):
        m = re.match(r"\s*buffer\((" + _SSA + r")[^)]*\)\[(" + _SSA + r")\s*,\s*(" + _SSA + r")\]",
                     op.rest)
        buf = self.need(env, m.group(1), op.name)
        off = self.need_int(env, m.group(2), op.name)
        ln = self.need_int(env, m.group(3), op.name)
        sm = re.search(r"shape\(\[(.*?)\]\)", op.rest)
        shape = tuple(_signed(self.need_int(env, n, op.name), 64)
                      for n in _SSA_RE.findall(sm.group(1)))
        tm = re.search(r"type\((" + _SSA + r")\)", op.rest)
        et = self.need(env, tm.group(1), op.name)
        if not isinstance(buf, _Buffer):
            raise EvaluationError(f"{op.name}: buffer {m.group(1)} has unknown origin ({buf!r})")
        return _View(buf, off, ln, shape, et.name if isinstance(et, _ElementType) else "?")

    def op_hal_buffer_subspan(self, op, env):
        m = re.match(r"<(" + _SSA + r")[^>]*>\[(" + _SSA + r")\s*,\s*(" + _SSA + r")\]", op.rest)
        buf = self.need(env, m.group(1), op.name)
        off = self.need_int(env, m.group(2), op.name)
        if not isinstance(buf, _Buffer):
            return None
        return _Buffer(buf.kind, buf.ref, buf.base + off)

    def _alloc(self, op, env):
        m = re.search(r"!hal\.buffer\{(" + _SSA + r")\}\s*$", op.rest)
        if not m:
            return None
        size = self.need_int(env, m.group(1), f"size of {op.results[0]}")
        base = op.results[0].lstrip("%")
        name, k = base, 1
        while name in self.buffers:
            k += 1
            name = f"{base}.{k}"
        self.buffers[name] = size
        return _Buffer("buffer", name)

    op_hal_device_queue_alloca = _alloc
    op_hal_allocator_allocate = _alloc

    def op_hal_executable_lookup_function(self, op, env):
        m = re.search(r"function\(@([\w$.\-]+)::@([\w$.\-]+)::@([\w$.\-]+)\)", op.rest)
        if not m:
            return None
        return _FunctionRef(*m.groups())

    # hal: command buffers
    def op_hal_command_buffer_create(self, op, env):
        return _CommandBuffer()

    def _cmd(self, op, env) -> _CommandBuffer:
        m = re.match(r"<(" + _SSA + r")", op.rest)
        cb = self.need(env, m.group(1), op.name)
        if not isinstance(cb, _CommandBuffer):
            raise EvaluationError(f"{op.name}: {m.group(1)} is not a command buffer")
        return cb

    def _ref(self, env, ref: str, ty: str, what: str):
        """A binding reference: ('slot', n) or ('buf', _Buffer)."""
        if ty.strip() == "index":
            return ("slot", self.need_int(env, ref, what))
        buf = self.need(env, ref, what)
        if not isinstance(buf, _Buffer):
            raise EvaluationError(f"{what}: buffer {ref} has unknown origin ({buf!r})")
        return ("buf", buf)

    def op_hal_command_buffer_dispatch(self, op, env):
        cb = self._cmd(op, env)
        what = f"dispatch ({op.text[:80]}...)"
        fm = re.search(r"target\([^)]*\)\[(" + _SSA + r")\]", op.rest)
        fn = self.need(env, fm.group(1), what + " function")
        if not isinstance(fn, _FunctionRef):
            raise EvaluationError(f"{what}: function {fm.group(1)} not from "
                                  f"hal.executable.lookup.function ({fn!r})")
        wm = re.search(r"workgroups\(\[(.*?)\]\)", op.rest, re.S)
        wg = tuple(_signed(self.need_int(env, n, "workgroup count"), 64)
                   for n in _SSA_RE.findall(wm.group(1)))
        cm = re.search(r"constants\(\[(.*?)\]\)", op.rest, re.S)
        consts = [self.need_int(env, n, "push constant") & 0xFFFFFFFF
                  for n in (_SSA_RE.findall(cm.group(1)) if cm else [])]
        bm = re.search(r"bindings\(\[(.*)\]\)", op.rest, re.S)
        binds = []
        for b in re.finditer(r"\((" + _SSA + r")\s*:\s*([^)]*)\)\[(" + _SSA + r")\s*,\s*("
                             + _SSA + r")\]", bm.group(1) if bm else ""):
            binds.append((self._ref(env, b.group(1), b.group(2), "binding"),
                          self.need_int(env, b.group(3), "binding offset"),
                          self.need_int(env, b.group(4), "binding length")))
        cb.commands.append(("dispatch", fn, wg, consts, binds))
        return []

    def op_hal_command_buffer_dispatch_indirect(self, op, env):
        raise EvaluationError("indirect dispatch (hal.command_buffer.dispatch.indirect) "
                              "is not supported: the workgroup count lives in a buffer")

    def op_hal_command_buffer_fill_buffer(self, op, env):
        cb = self._cmd(op, env)
        m = re.search(r"target\((" + _SSA + r")\s*:\s*([^)]*)\)\[(" + _SSA + r")\s*,\s*("
                      + _SSA + r")\]\s*pattern\((" + _SSA + r")\s*:\s*(\w+)\)", op.rest)
        ref = self._ref(env, m.group(1), m.group(2), op.name)
        w = _int_width(m.group(6))
        pat = self.need_int(env, m.group(5), op.name)
        cb.commands.append(("fill", ref, self.need_int(env, m.group(3), op.name),
                            self.need_int(env, m.group(4), op.name),
                            _wrap(pat, w).to_bytes(w // 8, "little")))
        return []

    def op_hal_command_buffer_copy_buffer(self, op, env):
        cb = self._cmd(op, env)
        m = re.search(r"source\((" + _SSA + r")\s*:\s*([^)]*)\)\[(" + _SSA + r")\]\s*"
                      r"target\((" + _SSA + r")\s*:\s*([^)]*)\)\[(" + _SSA + r")\]\s*"
                      r"length\((" + _SSA + r")\)", op.rest)
        cb.commands.append((
            "copy", self._ref(env, m.group(1), m.group(2), op.name),
            self.need_int(env, m.group(3), op.name),
            self._ref(env, m.group(4), m.group(5), op.name),
            self.need_int(env, m.group(6), op.name),
            self.need_int(env, m.group(7), op.name)))
        return []

    def op_hal_command_buffer_update_buffer(self, op, env):
        raise EvaluationError("hal.command_buffer.update_buffer is not supported")

    def op_hal_command_buffer_collective(self, op, env):
        raise EvaluationError("hal.command_buffer.collective is not supported")

    def _submit(self, op, env, table: list | None):
        m = re.search(r"commands\(\[?(.*?)\]?\)", op.rest, re.S)
        for name in _SSA_RE.findall(m.group(1)):
            cb = self.need(env, name, f"{op.name} commands")
            if not isinstance(cb, _CommandBuffer):
                raise EvaluationError(f"{op.name}: {name} is not a command buffer ({cb!r})")
            for cmd in cb.commands:
                self.steps.append(self._resolve(cmd, table))
        return []

    def _binding(self, ref, off: int, length: int, table) -> BindingRef:
        kind, r = ref
        if kind == "slot":
            if table is None or r >= len(table):
                raise EvaluationError(f"binding table slot {r} used but the command "
                                      f"buffer was submitted with {table and len(table)} slots")
            buf, toff, tlen = table[r]
            if length == 0xFFFFFFFFFFFFFFFF:
                length = tlen - off
            off += toff
        else:
            buf = r
        if not isinstance(buf, _Buffer):
            raise EvaluationError(f"binding refers to a buffer of unknown origin ({buf!r})")
        return BindingRef(buf.kind, buf.ref, buf.base + off, length)

    def _resolve(self, cmd, table):
        if cmd[0] == "dispatch":
            _, fn, wg, consts, binds = cmd
            if len(wg) != 3:
                raise EvaluationError(f"workgroup count {wg} is not 3-D")
            so = (self.compiled.so_for(fn.executable, fn.variant)
                  if self.compiled is not None else Path(f"{fn.executable}_{fn.variant}.so"))
            return Dispatch(so, fn.export, wg, list(consts),
                            [self._binding(r, o, n, table) for r, o, n in binds],
                            executable=fn.executable, variant=fn.variant)
        if cmd[0] == "fill":
            _, ref, off, n, pat = cmd
            return FillStep(self._binding(ref, off, n, table), pat)
        _, sref, soff, dref, doff, n = cmd
        return CopyStep(self._binding(sref, soff, n, table), self._binding(dref, doff, n, table))

    def op_hal_device_queue_execute(self, op, env):
        return self._submit(op, env, None)

    def op_hal_device_queue_execute_indirect(self, op, env):
        bm = re.search(r"bindings\(\[(.*)\]\)", op.rest, re.S)
        table = []
        for b in re.finditer(r"\((" + _SSA + r")\s*:\s*[^)]*\)\[(" + _SSA + r")\s*,\s*("
                             + _SSA + r")\]", bm.group(1)):
            buf = self.need(env, b.group(1), "binding table entry")
            table.append((buf, self.need_int(env, b.group(2), "binding table offset"),
                          self.need_int(env, b.group(3), "binding table length")))
        return self._submit(op, env, table)

    def op_hal_device_queue_fill(self, op, env):
        m = re.search(r"target\((" + _SSA + r")\s*:[^)]*\)\[(" + _SSA + r")\]\s*length\(("
                      + _SSA + r")\)\s*pattern\((" + _SSA + r")\s*:\s*(\w+)\)", op.rest)
        if not m:
            raise EvaluationError(f"cannot parse {op.text[:200]}")
        buf = self.need(env, m.group(1), op.name)
        w = _int_width(m.group(5))
        pat = _wrap(self.need_int(env, m.group(4), op.name), w).to_bytes(w // 8, "little")
        self.steps.append(FillStep(self._binding(("buf", buf), self.need_int(env, m.group(2), op.name),
                                                 self.need_int(env, m.group(3), op.name), None), pat))
        return []

    def op_hal_device_queue_copy(self, op, env):
        m = re.search(r"source\((" + _SSA + r")\s*:[^)]*\)\[(" + _SSA + r")\]\s*"
                      r"target\((" + _SSA + r")\s*:[^)]*\)\[(" + _SSA + r")\]\s*"
                      r"length\((" + _SSA + r")\)", op.rest)
        if not m:
            raise EvaluationError(f"cannot parse {op.text[:200]}")
        n = self.need_int(env, m.group(5), op.name)
        self.steps.append(CopyStep(
            self._binding(("buf", self.need(env, m.group(1), op.name)),
                          self.need_int(env, m.group(2), op.name), n, None),
            self._binding(("buf", self.need(env, m.group(3), op.name)),
                          self.need_int(env, m.group(4), op.name), n, None)))
        return []

    def op_hal_device_queue_update(self, op, env):
        raise EvaluationError("hal.device.queue.update is not supported")

    def op_hal_device_queue_read(self, op, env):
        raise EvaluationError("hal.device.queue.read (parameter/file loads) is not supported")

    def op_hal_device_queue_dispatch(self, op, env):
        raise EvaluationError("hal.device.queue.dispatch is not supported")

    def op_hal_device_queue_dealloca(self, op, env):
        return []


_ARITH_BINARY = {
    "addi", "subi", "muli", "divsi", "divui", "ceildivsi", "ceildivui", "floordivsi",
    "remsi", "remui", "andi", "ori", "xori", "shli", "shrui", "shrsi",
    "maxsi", "minsi", "maxui", "minui", "addf", "subf", "mulf", "divf",
}

_FLOAT_BINARY = {
    "addf": lambda a, b: a + b, "subf": lambda a, b: a - b,
    "mulf": lambda a, b: a * b, "divf": lambda a, b: a / b,
}


# ---------------------------------------------------------------------------
# Public planning API
# ---------------------------------------------------------------------------

def _scalar_value(v: Any, ty: str, index: int) -> Any:
    w = _int_width(ty)
    if w is not None:
        if isinstance(v, (float, np.floating)):
            raise TypeError(f"argument {index} has type {ty}; got float {v!r}")
        return _wrap(int(v), w)
    if _float_fmt(ty):
        return _round_float(float(v), ty)
    raise EvaluationError(f"argument {index} has unsupported type {ty}")


def plan_program(compiled: Union[Compiled, str, os.PathLike], inputs: Sequence[Any],
                 function: str | None = None) -> ProgramPlan:
    """Evaluate the public function of the HAL-level IR for concrete inputs.

    ``compiled`` is a Compiled or the path of a ``.hal.mlir`` file (then the
    Dispatch.so_path values are placeholders).  ``inputs`` follow the function
    signature: numpy arrays for tensor arguments, python/numpy scalars for
    scalar ones.  Only shapes, dtypes and scalar values are used.
    """
    if isinstance(compiled, Compiled):
        module, comp = _module_for(compiled.hal_mlir), compiled
    else:
        module, comp = _module_for(Path(compiled)), None
    if function is None:
        if len(module.public) != 1:
            raise ValueError(f"module has public functions {module.public}; name one")
        function = module.public[0]
    func = module.funcs.get(function)
    if func is None or function not in module.public:
        raise ValueError(f"no public function @{function}; have {module.public}")
    if len(inputs) != len(func.args):
        raise ValueError(f"@{function} takes {len(func.args)} arguments, got {len(inputs)}")

    ev = _Evaluator(module, comp)
    ev.inputs = list(inputs)
    args = []
    for i, ((_, ty), v) in enumerate(zip(func.args, inputs)):
        if ty.startswith("!hal.buffer_view"):
            if not hasattr(v, "shape"):
                raise TypeError(f"argument {i} is a tensor; pass a numpy array")
            args.append(_InputView(i))
        else:
            args.append(_scalar_value(v, ty, i))
    rets = ev.call(func, args)

    results = []
    for k, r in enumerate(rets):
        if isinstance(r, _InputView):
            arr = np.asarray(inputs[r.index])
            results.append(ResultRef(BindingRef("input", r.index, 0, arr.nbytes),
                                     tuple(arr.shape), arr.dtype))
        elif isinstance(r, _View):
            if r.etype not in _DTYPES:
                raise EvaluationError(f"result {k} has unsupported element type {r.etype}")
            results.append(ResultRef(BindingRef(r.buffer.kind, r.buffer.ref,
                                                r.buffer.base + r.offset, r.length),
                                     r.shape, np.dtype(_DTYPES[r.etype])))
        elif isinstance(r, _Unknown):
            raise EvaluationError(f"result {k} comes from unsupported op '{r.op}': {r.text[:200]}")
        else:
            raise EvaluationError(f"result {k} is not a tensor ({r!r})")
    return ProgramPlan(function, ev.steps, dict(ev.buffers), results)


def plan_dispatches(compiled: Union[Compiled, str, os.PathLike], inputs: Sequence[Any],
                    function: str | None = None) -> list[Dispatch]:
    """The dispatches of ``compiled`` for ``inputs``, in execution order.

    Raises EvaluationError if the program also performs buffer transfers
    (use plan_program / run_plan for those).
    """
    plan = plan_program(compiled, inputs, function)
    others = [s for s in plan.steps if not isinstance(s, Dispatch)]
    if others:
        raise EvaluationError(f"@{plan.function} also performs transfers {others}; "
                              "use plan_program()")
    return plan.dispatches


# ---------------------------------------------------------------------------
# Running a plan with a caller-provided dispatch function
# ---------------------------------------------------------------------------

def run_plan(plan: ProgramPlan, inputs: Sequence[Any],
             run_dispatch: Callable[[Dispatch, list[np.ndarray]], None], *,
             fill_byte: int = 0) -> list[np.ndarray]:
    """Execute a plan: allocate buffers, run each step, return the results.

    ``run_dispatch(dispatch, bindings)`` receives the dispatch and one writable
    uint8 numpy view per binding (exactly ``offset:offset+length`` of the
    underlying buffer) and must run every workgroup.  Input tensors are copied
    first, so kernels cannot modify the caller's arrays.  Transient buffers
    start filled with ``fill_byte``.
    """
    storage: dict[tuple[str, Any], np.ndarray] = {}
    for i, v in enumerate(inputs):
        if hasattr(v, "shape"):
            storage[("input", i)] = np.frombuffer(
                np.ascontiguousarray(v).tobytes(), dtype=np.uint8).copy()
    for name, size in plan.buffers.items():
        storage[("buffer", name)] = np.full(size, fill_byte, dtype=np.uint8)

    def view(b: BindingRef) -> np.ndarray:
        buf = storage[(b.kind, b.ref)]
        if b.offset < 0 or b.offset + b.length > buf.size:
            raise EvaluationError(f"binding {b} outside its buffer of {buf.size} bytes")
        return buf[b.offset:b.offset + b.length]

    for step in plan.steps:
        if isinstance(step, Dispatch):
            run_dispatch(step, [view(b) for b in step.bindings])
        elif isinstance(step, FillStep):
            t = view(step.target)
            reps = -(-t.size // len(step.pattern))
            t[:] = np.frombuffer(step.pattern * reps, dtype=np.uint8)[:t.size]
        else:
            view(step.target)[:] = view(step.source).copy()

    return [view(r.storage).view(r.dtype).reshape(r.shape).copy() for r in plan.results]


# ---------------------------------------------------------------------------
# IREE's own runtime as the reference
# ---------------------------------------------------------------------------

def reference_run(vmfb: Union[str, os.PathLike], function: str, inputs: Sequence[Any],
                  driver: str = "local-sync") -> list[np.ndarray]:
    """Run ``function`` of ``vmfb`` with IREE's runtime; results as numpy arrays.

    The vmfb must target the host architecture (see host_arch()).
    """
    import iree.runtime as rt

    module = rt.load_vm_flatbuffer_file(str(vmfb), driver=driver)
    args = []
    for v in inputs:
        if isinstance(v, np.ndarray):
            args.append(np.ascontiguousarray(v))
        elif isinstance(v, np.generic):
            args.append(v.item())
        else:
            args.append(v)
    out = module[function](*args)
    if not isinstance(out, (tuple, list)):
        out = (out,)
    return [np.array(o.to_host() if hasattr(o, "to_host") else o) for o in out]
