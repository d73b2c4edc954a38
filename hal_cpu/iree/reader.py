"""Reading HAL-level IR with IREE's own MLIR bindings.

``iree-compile --compile-to=hal`` (or the ``hal`` compilation phase) prints
the host program as MLIR: ``util.func`` functions and ``util.initializer``
regions whose blocks hold ``arith``, ``cf``, ``util``, ``hal`` and ``check``
ops, ``util.global`` declarations, and declarations of imported functions
(``util.func private @custom.string.print(...)`` without a body). This module
parses that text with ``iree.compiler.ir`` (package ``iree-base-compiler``,
the pinned :data:`~hal_cpu.iree.SUPPORTED_VERSION`), which gives typed op
views (``CommandBufferDispatchOp.workgroup_x``...), and turns it into plain
Python records for the interpreter: every SSA value becomes a slot number in
its function's register file, every block an index, every op an
:class:`OpInfo` with its user-facing location (:class:`Where`).

Locations: a program compiled by :func:`hal_cpu.iree.compile_program`
carries its MLIR locations (``--mlir-print-debuginfo``), so an op points at
the line of the user's source it came from; IR without locations points at
its own file and line.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .compiler import INSTALL_HINT, SUPPORTED_VERSION
from .errors import EvaluationError, IreeToolError

__all__ = ["Where", "OpInfo", "Block", "Function", "Import", "Global", "Program",
           "load_program", "parse_program"]

_LOC_RE = re.compile(r'"((?:[^"\\]|\\.)*)":(\d+):(\d+)')


@dataclass(frozen=True)
class Where:
    """A source location: ``path`` (the user's file, or the IR file), 1-based
    ``line`` and ``column``; ``line`` 0 when unknown."""

    path: str
    line: int = 0
    column: int = 0

    def __str__(self) -> str:
        return f"{self.path}:{self.line}:{self.column}" if self.line else self.path


def _where(location, fallback: Where) -> Where:
    """The first file location inside an MLIR location (the callee of a
    call site, the first of a fused location), else ``fallback``."""
    m = _LOC_RE.search(str(location))
    if m is None:
        return fallback
    path = m.group(1)
    if path == "-":
        path = fallback.path
    return Where(path, int(m.group(2)), int(m.group(3)))


@dataclass
class OpInfo:
    """One op of a function, as the interpreter's handlers see it.

    Attributes:
        name: the op name, e.g. ``hal.command_buffer.dispatch``.
        view: the typed op view from ``iree.compiler.ir`` (attributes and
            named operands are read from it).
        operands, results: slot numbers of the op's operands and results.
        operand_types, result_types: their MLIR types as text.
        result_names: SSA names of the results (e.g. ``%transient_buffer``).
        successors: block indices of the op's successor blocks.
        where: the user-facing location.
        function: name of the enclosing function.
        slot: maps an ``ir.Value`` of the function to its slot number.
    """

    name: str
    view: Any
    operands: tuple[int, ...]
    operand_types: tuple[str, ...]
    results: tuple[int, ...]
    result_types: tuple[str, ...]
    result_names: tuple[str, ...]
    successors: tuple[int, ...]
    where: Where
    function: str
    slot: Any = field(repr=False, default=None)

    def attr(self, name: str):
        """The op's attribute ``name`` (an ``ir.Attribute``), or None."""
        attrs = self.view.operation.attributes
        return attrs[name] if name in attrs else None

    def text(self, limit: int = 200) -> str:
        """The op as MLIR text (its first ``limit`` characters), for messages."""
        s = self.view.operation.get_asm(enable_debug_info=False, assume_verified=True)
        s = " ".join(s.split())
        return s if len(s) <= limit else s[:limit] + "..."


@dataclass
class Block:
    """A basic block: slot numbers of its arguments and its ops."""

    args: tuple[int, ...]
    ops: list[OpInfo]


@dataclass
class Function:
    """A ``util.func`` with a body, or a ``util.initializer`` (named
    ``<initializer N>``).

    Attributes:
        arg_types, result_types: MLIR types as text.
        nslots: size of the register file.
        public: exported by the module.
        where: location of the function.
    """

    name: str
    arg_types: tuple[str, ...]
    result_types: tuple[str, ...]
    blocks: list[Block]
    nslots: int
    public: bool
    where: Where


@dataclass(frozen=True)
class Import:
    """A function declared without a body: a host module's function, e.g.
    ``@custom.string.print``.

    Attributes:
        name: the full name (``custom.string.print``).
        module: the module part (``custom``).
        function: the function part (``string.print``).
        arg_types, result_types: the declared types (MLIR text).
        signature: ``vm.signature`` as (argument types, result types), or
            None; it fixes the types the host module sees (e.g. ``i64`` for
            an ``index`` result).
        fallback: ``vm.fallback``: a function of the program called when no
            module provides this one (such an import is optional), or None.
    """

    name: str
    module: str
    function: str
    arg_types: tuple[str, ...]
    result_types: tuple[str, ...]
    signature: tuple[tuple[str, ...], tuple[str, ...]] | None
    fallback: str | None
    where: Where


@dataclass(frozen=True)
class Global:
    """A ``util.global``: its type and initial value (an ``ir.Attribute``,
    or None)."""

    name: str
    type: str
    initial: Any
    where: Where


@dataclass
class Program:
    """A parsed HAL-level module.

    Attributes:
        functions: every function with a body, by name (without ``@``).
        public: names of the public functions, in order.
        initializers: the ``util.initializer`` regions, in module order.
        imports: functions declared without a body, by full name.
        globals: ``util.global`` declarations by name.
        path: the IR file.
        module: the parsed ``ir.Module`` (keeps the op views alive).
    """

    functions: dict[str, Function]
    public: list[str]
    initializers: list[Function]
    imports: dict[str, Import]
    globals: dict[str, Global]
    path: Path | None
    module: Any = None


# ---------------------------------------------------------------------------

def _ir():
    try:
        from iree.compiler import ir
    except ImportError as e:
        raise IreeToolError(f"cannot import it ({e}); iree-base-compiler=="
                            f"{SUPPORTED_VERSION} is needed: {INSTALL_HINT}",
                            name="iree.compiler.ir") from None
    return ir


def _types_of(function_type) -> tuple[tuple[str, ...], tuple[str, ...]]:
    return (tuple(str(t) for t in function_type.inputs),
            tuple(str(t) for t in function_type.results))


def _signature(attr) -> tuple[tuple[str, ...], tuple[str, ...]] | None:
    if attr is None:
        return None
    ir = _ir()
    ft = ir.FunctionType(ir.TypeAttr(attr).value)
    strip = re.compile(r"^!vm\.ref<(.*)>$")
    ins, outs = _types_of(ft)
    return (tuple(strip.sub(r"\1", t) for t in ins),
            tuple(strip.sub(r"\1", t) for t in outs))


def _read_function(op, name: str, public: bool, file_where: Where) -> Function:
    ir = _ir()
    state = ir.AsmState(op.operation)
    slots: dict[str, int] = {}

    def slot(value) -> int:
        key = value.get_name(state)
        n = slots.get(key)
        if n is None:
            n = slots[key] = len(slots)
        return n

    region = op.regions[0]
    blocks_ir = list(region.blocks)

    # blocks have no stable Python identity: number them by their position
    def index_of(block) -> int:
        for i, b in enumerate(blocks_ir):
            if b == block:
                return i
        raise EvaluationError("branch to a block outside its function")

    blocks: list[Block] = []
    fn_where = _where(op.location, file_where)
    for b in blocks_ir:
        args = tuple(slot(a) for a in b.arguments)
        ops = []
        for o in b.operations:
            operation = o.operation
            ops.append(OpInfo(
                name=operation.name, view=o,
                operands=tuple(slot(v) for v in operation.operands),
                operand_types=tuple(str(v.type) for v in operation.operands),
                results=tuple(slot(v) for v in operation.results),
                result_types=tuple(str(v.type) for v in operation.results),
                result_names=tuple(v.get_name(state) for v in operation.results),
                successors=tuple(index_of(s) for s in operation.successors),
                where=_where(operation.location, fn_where), function=name,
                slot=slot))
        blocks.append(Block(args, ops))
    if "function_type" in op.operation.attributes:
        ft = ir.FunctionType(ir.TypeAttr(op.operation.attributes["function_type"]).value)
        arg_types, result_types = _types_of(ft)
    else:
        arg_types, result_types = (), ()
    return Function(name, arg_types, result_types, blocks, len(slots), public, fn_where)


def parse_program(text: str, path: str | Path | None = None) -> Program:
    """Parse HAL-level IR text.

    Args:
        text: the module (as ``iree-compile --compile-to=hal`` prints it).
        path: the file it came from (for locations and messages).

    Raises:
        EvaluationError: MLIR cannot parse the text (MLIR's first diagnostic,
            with its line).
        IreeToolError: ``iree.compiler`` cannot be imported.
    """
    ir = _ir()
    ctx = ir.Context()
    # No thread pool: a program read before fork() (run-module runs native
    # dispatches in a child) is still usable in the child, where the pool's
    # threads do not exist.
    ctx.enable_multithreading(False)
    # a host module's own types (!custom.string) belong to no registered dialect
    ctx.allow_unregistered_dialects = True
    file_where = Where(str(path) if path else "<ir>")
    try:
        module = ir.Module.parse(text, ctx)
    except ir.MLIRError as e:
        diags = getattr(e, "error_diagnostics", None) or []
        where, msg = file_where, str(e).strip().splitlines()[-1]
        if diags:
            where = _where(diags[0].location, file_where)
            msg = diags[0].message.strip()
        raise EvaluationError(f"MLIR cannot parse it: {msg}", line=where.line or None,
                              path=path) from None
    return _read_module(module, Path(path) if path else None, file_where)


def _read_module(module, path: Path | None, file_where: Where) -> Program:
    ir = _ir()
    functions: dict[str, Function] = {}
    public: list[str] = []
    inits: list[Function] = []
    imports: dict[str, Import] = {}
    globals_: dict[str, Global] = {}
    body = module.body
    # a module of modules (e.g. a named module): descend into the only one
    ops = list(body.operations)
    if len(ops) == 1 and ops[0].operation.name == "builtin.module":
        ops = list(ops[0].regions[0].blocks[0].operations)
    for op in ops:
        name = op.operation.name
        attrs = op.operation.attributes
        if name == "util.func":
            fname = ir.StringAttr(attrs["sym_name"]).value
            vis = ir.StringAttr(attrs["sym_visibility"]).value \
                if "sym_visibility" in attrs else "public"
            where = _where(op.location, file_where)
            if len(op.regions[0].blocks) == 0:
                ins, outs = _types_of(ir.FunctionType(ir.TypeAttr(attrs["function_type"]).value))
                mod, _, fn = fname.partition(".")
                fallback = (ir.FlatSymbolRefAttr(attrs["vm.fallback"]).value
                            if "vm.fallback" in attrs else None)
                imports[fname] = Import(fname, mod, fn, ins, outs,
                                        _signature(attrs["vm.signature"]
                                                   if "vm.signature" in attrs else None),
                                        fallback, where)
                continue
            functions[fname] = _read_function(op, fname, vis == "public", file_where)
            if vis == "public":
                public.append(fname)
        elif name == "util.initializer":
            inits.append(_read_function(op, f"<initializer {len(inits)}>", False,
                                        file_where))
        elif name == "util.global":
            gname = ir.StringAttr(attrs["sym_name"]).value
            gtype = str(ir.TypeAttr(attrs["type"]).value)
            globals_[gname] = Global(gname, gtype, attrs["initial_value"]
                                     if "initial_value" in attrs else None,
                                     _where(op.location, file_where))
    return Program(functions, public, inits, imports, globals_, path, module)


@functools.lru_cache(maxsize=16)
def _load(path: str, mtime_ns: int) -> Program:
    return parse_program(Path(path).read_text(), path)


def load_program(path: str | Path) -> Program:
    """Parse a ``.hal.mlir`` file (cached by path and modification time).

    Raises:
        EvaluationError: as :func:`parse_program`.
        OSError: the file cannot be read.
    """
    path = Path(path).resolve()
    return _load(str(path), path.stat().st_mtime_ns)
