"""Evaluating HAL-level IR into a plan of dispatches and transfers.

IREE's host program (the public function of the module, in HAL-level IR)
computes, for the shapes and scalars it is called with, which executable
exports to dispatch with which workgroup counts, push constants and buffer
bindings. :func:`plan_program` evaluates that function for concrete inputs
and records what it would submit to the device.

How data flows through a plan
-----------------------------
Function arguments of tensor type arrive as ``!hal.buffer_view`` values; their
storage is ``BindingRef(kind='input', ref=N, ...)`` (N = argument index, the
caller's array in C order). Results and intermediates live in *transient
buffers* allocated with ``hal.device.queue.alloca`` (``kind='buffer'``, ``ref``
= the SSA name without ``%``; :attr:`ProgramPlan.buffers` gives each one's
size). One allocation often holds several values: e.g. a program returning a
matmul and its row sums uses one transient buffer for both, and the second
dispatch binds the same buffer twice with the offsets baked into the kernel.
After the last step, each result is a ``hal.buffer_view.create`` over a range
of a transient buffer (or, when a function returns an argument unchanged, the
input itself); :attr:`ProgramPlan.results` records those ranges with shape and
dtype.

Besides dispatches the host program may record transfers (``fill_buffer``,
``copy_buffer``, ``queue.fill``, ``queue.copy``); :attr:`ProgramPlan.steps`
keeps them in order with the dispatches and :func:`hal_cpu.iree.run_plan`
performs them with numpy. :func:`plan_dispatches` refuses programs that
contain transfers, so that a caller cannot silently skip one.

What the evaluator does not model
---------------------------------
Integer and float scalar arithmetic (``arith``, ``affine``, ``util.align``),
control flow (``cf.br``, ``cf.cond_br``), calls, globals, memoized command
buffers and the buffer, buffer-view and command-buffer ops are evaluated. An
op it does not know yields an unknown value; where the plan needs that value
(a workgroup count, a constant, a binding, a branch condition, a result) the
plan fails with :class:`EvaluationError` naming the op and its line. An
unknown op without results, or any unknown ``hal.command_buffer.*`` /
``hal.device.queue.*`` op, fails at once (it could record work the plan would
miss), except the ops of :data:`NO_EFFECT_OPS`.
"""

from __future__ import annotations

import os
import re
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence, Union

import numpy as np

from .compiler import Compiled
from .errors import EvaluationError
from .hal_ir import (DTYPES, SSA, SSA_RE, Block, Function, Module, Op,
                     eval_affine_map, float_fmt, int_width, load_module,
                     round_float, signed, split_top_level, wrap)

__all__ = [
    "BindingRef", "Dispatch", "FillStep", "CopyStep", "ResultRef", "ProgramPlan",
    "plan_program", "plan_dispatches", "NO_EFFECT_OPS",
]

#: Ops the evaluator skips: they check statuses, sizes or device identity, or
#: order work that the plan runs in submission order anyway.
NO_EFFECT_OPS = frozenset({
    "util.status.check_ok",
    "hal.buffer.assert",
    "hal.buffer_view.trace",
    "hal.command_buffer.execution_barrier",
    "hal.command_buffer.finalize",
    "hal.command_buffer.begin_debug_group",
    "hal.command_buffer.end_debug_group",
    "hal.device.queue.barrier",
    "hal.device.queue.flush",
    "hal.fence.signal",
    "hal.fence.fail",
})

_RECORDING_PREFIXES = ("hal.command_buffer.", "hal.device.queue.")


# ---------------------------------------------------------------------------
# Plan data types
# ---------------------------------------------------------------------------

@dataclass(frozen=True)
class BindingRef:
    """A byte range of a function input or of a buffer the program allocates.

    Attributes:
        kind: ``"input"`` (``ref`` = argument index; the bytes of that array
            in C order) or ``"buffer"`` (``ref`` = transient buffer name, a
            key of :attr:`ProgramPlan.buffers`).
        ref: argument index or buffer name.
        offset: first byte.
        length: size in bytes.
    """

    kind: str
    ref: Union[int, str]
    offset: int
    length: int


@dataclass(frozen=True)
class Dispatch:
    """One workgroup dispatch.

    Attributes:
        so_path: the embedded-ELF executable (for a plan made from a bare
            ``.hal.mlir`` path, a placeholder ``<executable>_<variant>.so``).
        export_name: the export to call.
        workgroup_count: (x, y, z) workgroups.
        constants: push constants, each a uint32 as a Python int.
        bindings: one byte range per binding, in binding order.
        executable: the ``hal.executable`` symbol.
        variant: the executable variant (``embedded_elf_<arch>``).
    """

    so_path: Path
    export_name: str
    workgroup_count: tuple[int, int, int]
    constants: list[int]
    bindings: list[BindingRef]
    executable: str = ""
    variant: str = ""


@dataclass(frozen=True)
class FillStep:
    """Fill ``target`` with ``pattern`` (1, 2, 4 or 8 bytes, little-endian)
    repeated."""

    target: BindingRef
    pattern: bytes


@dataclass(frozen=True)
class CopyStep:
    """Copy ``source`` into ``target`` (same length)."""

    source: BindingRef
    target: BindingRef


@dataclass(frozen=True)
class ResultRef:
    """Where a function result lives after the last step: ``storage`` bytes
    viewed as ``dtype`` with ``shape`` (C order)."""

    storage: BindingRef
    shape: tuple[int, ...]
    dtype: np.dtype


@dataclass
class ProgramPlan:
    """What one call of a public function submits to the device.

    Attributes:
        function: the function name (without ``@``).
        steps: dispatches and transfers in execution order.
        buffers: transient buffers, name -> size in bytes.
        results: one :class:`ResultRef` per function result, in order.
    """

    function: str
    steps: list[Union[Dispatch, FillStep, CopyStep]]
    buffers: dict[str, int]
    results: list[ResultRef]

    @property
    def dispatches(self) -> list[Dispatch]:
        """The :class:`Dispatch` steps, in order."""
        return [s for s in self.steps if isinstance(s, Dispatch)]


# ---------------------------------------------------------------------------
# Values
# ---------------------------------------------------------------------------

@dataclass(frozen=True)
class _Unknown:
    """Value of an op the evaluator does not model (``op`` None: an SSA name
    that is not defined). Using it where the plan needs a value is an error
    naming the op and its line."""

    op: str | None
    text: str
    line: int = 0

    def error(self, what: str, use_line: int | None = None) -> EvaluationError:
        at = f" at line {use_line}" if use_line else ""
        if self.op is None:
            return EvaluationError(f"{what}{at} uses {self.text}, which is not defined",
                                   line=self.line or None)
        return EvaluationError(f"cannot evaluate op '{self.op}'; {what}{at} depends on "
                               f"it: {self.text[:300]}", op=self.op, line=self.line or None)


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


# ---------------------------------------------------------------------------
# The evaluator
# ---------------------------------------------------------------------------

_CMPI = {
    "eq": lambda a, b, w: a == b, "ne": lambda a, b, w: a != b,
    "slt": lambda a, b, w: signed(a, w) < signed(b, w),
    "sle": lambda a, b, w: signed(a, w) <= signed(b, w),
    "sgt": lambda a, b, w: signed(a, w) > signed(b, w),
    "sge": lambda a, b, w: signed(a, w) >= signed(b, w),
    "ult": lambda a, b, w: a < b, "ule": lambda a, b, w: a <= b,
    "ugt": lambda a, b, w: a > b, "uge": lambda a, b, w: a >= b,
}


def _tdiv(a: int, b: int) -> int:
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b >= 0) else -q


class _Evaluator:
    """Runs the host program's functions on Python values: ints (the
    unsigned bits of integers), floats, and the private value classes above
    for buffers, views, functions and command buffers. Records dispatches and
    transfers in ``steps`` and transient allocations in ``buffers``."""

    MAX_STEPS = 1_000_000

    def __init__(self, module: Module, compiled: Compiled | None):
        self.m = module
        self.compiled = compiled
        self.globals: dict[str, Any] = {}
        self.buffers: dict[str, int] = {}
        self.steps: list = []
        self.inputs: list = []
        self.steps_left = self.MAX_STEPS
        self.current: Op | None = None

    # -- helpers -----------------------------------------------------------
    def need(self, env: dict, name: str, what: str) -> Any:
        if name not in env:
            raise EvaluationError(f"{what}: SSA value {name} is not defined")
        v = env[name]
        if isinstance(v, _Unknown):
            raise v.error(f"{what} ({name})", self.current.line if self.current else None)
        return v

    def need_int(self, env, name, what) -> int:
        v = self.need(env, name, what)
        if not isinstance(v, int):
            raise EvaluationError(f"{what}: {name} is not an integer ({v!r})")
        return int(v)

    # -- functions ---------------------------------------------------------
    def call(self, func: Function, args: list) -> list:
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
                    raise EvaluationError("evaluation step limit exceeded (infinite loop?)",
                                          line=op.line or None, path=self.m.path)
                self.current = op
                try:
                    if op.name in ("util.return", "func.return"):
                        return [env.get(r, _Unknown(None, r, op.line))
                                for r in SSA_RE.findall(op.rest.split(":")[0])]
                    if op.name == "cf.br":
                        block = self._branch(op, op.rest, env, blocks)
                        break
                    if op.name == "cf.cond_br":
                        cm = re.match(r"\s*(" + SSA + r")\s*,\s*(.*)$", op.rest, re.S)
                        cond = self.need(env, cm.group(1), "cf.cond_br condition")
                        targets = split_top_level(cm.group(2))
                        block = self._branch(op, targets[0] if cond else targets[1], env,
                                             blocks)
                        break
                    self.exec_op(op, env)
                except EvaluationError as e:
                    if e.line is None or e.path is None:
                        raise e.located(self.m.path, op.name, op.line or None) \
                            .with_traceback(e.__traceback__) from None
                    raise
            else:
                raise EvaluationError(f"block {block.label} of @{func.name} has no terminator",
                                      line=func.line or None, path=self.m.path)

    def _branch(self, op: Op, text: str, env, blocks) -> Block:
        m = re.match(r"\s*(\^[\w$.\-]+)(?:\((.*)\))?", text, re.S)
        if m is None or m.group(1) not in blocks:
            raise EvaluationError(f"branch to an unknown block: {text[:100]}")
        target = blocks[m.group(1)]
        vals = [env.get(v, _Unknown(None, v, op.line)) for v in
                SSA_RE.findall((m.group(2) or "").split(":")[0])]
        for a, v in zip(target.args, vals):
            env[a] = v
        return target

    def load_global(self, name: str) -> Any:
        if name in self.globals:
            return self.globals[name]
        ty = self.m.global_types.get(name, "")
        if name in self.m.global_inits:
            val = self._constant(self.m.global_inits[name] + " : " + ty,
                                 f"util.global @{name} = {self.m.global_inits[name]}",
                                 self.m.global_lines.get(name, 0))
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
    def _constant(self, text: str, where: str, line: int) -> Any:
        m = re.fullmatch(r"\s*(.*?)\s*(?::\s*(\S+))?\s*", text, re.S)
        lit, ty = m.group(1), (m.group(2) or "")
        if lit in ("true", "false") and not ty:
            return 1 if lit == "true" else 0
        w = int_width(ty)
        if w is not None and re.fullmatch(r"-?(0x[0-9a-fA-F]+|\d+)", lit):
            return wrap(int(lit, 0), w)
        fmt = float_fmt(ty)
        if fmt is not None:
            if lit.startswith("0x"):
                bits = int(lit, 16)
                return struct.unpack("<" + fmt, bits.to_bytes(struct.calcsize(fmt), "little"))[0]
            try:
                return round_float(float(lit), ty)
            except ValueError:
                pass
        return _Unknown("arith.constant", where, line)

    def exec_op(self, op: Op, env: dict) -> None:
        name = op.name
        handler = getattr(self, "op_" + name.replace(".", "_"), None)
        if handler is not None:
            vals = handler(op, env)
        elif name.startswith("arith.") and name[6:] in _ARITH_BINARY:
            vals = self._arith_binary(op, env)
        elif name in NO_EFFECT_OPS:
            vals = None
        elif not op.results or name.startswith(_RECORDING_PREFIXES):
            # an op that records work or has effects the plan would miss
            raise EvaluationError(f"cannot evaluate op '{name}': {op.text[:200]}",
                                  op=name, line=op.line or None)
        else:
            vals = None
        if vals is None:
            vals = [_Unknown(name, op.text, op.line)] * len(op.results)
        elif not isinstance(vals, list):
            vals = [vals]
        if len(vals) != len(op.results):
            raise EvaluationError(f"'{name}' produced {len(vals)} values for "
                                  f"{len(op.results)} results: {op.text[:200]}")
        for r, v in zip(op.results, vals):
            env[r] = v

    @staticmethod
    def _operands(op: Op) -> list[str]:
        head = op.rest.rsplit(" : ", 1)[0] if " : " in op.rest else op.rest
        head = re.sub(r"overflow<[^>]*>", "", head)
        return SSA_RE.findall(head)

    @staticmethod
    def _type(op: Op) -> str:
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
        w = int_width(ty)
        kind = op.name[6:]
        if w is None:
            if kind in _FLOAT_BINARY and float_fmt(ty):
                return round_float(_FLOAT_BINARY[kind](a, b), ty)
            return _Unknown(op.name, op.text, op.line)
        sa, sb = signed(a, w), signed(b, w)
        ua, ub = wrap(a, w), wrap(b, w)
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
            return _Unknown(op.name, op.text, op.line)
        return wrap(r(), w)

    def op_arith_constant(self, op, env):
        return self._constant(op.rest, op.text, op.line)

    def op_arith_cmpi(self, op, env):
        pm = re.match(r"\s*(\w+)\s*,", op.rest)
        pred = pm.group(1)
        vals = self._args(op, env)
        if vals is None:
            return self._poison_from(op, env)
        w = int_width(self._type(op))
        if pred not in _CMPI or w is None:
            return _Unknown(op.name, op.text, op.line)
        return int(_CMPI[pred](wrap(vals[0], w), wrap(vals[1], w), w))

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
        m = re.match(r"\s*(" + SSA + r")\s*:\s*(\S+)\s+to\s+(\S+)", op.rest)
        if not m:
            raise EvaluationError(f"cannot parse cast: {op.text}")
        v = env.get(m.group(1))
        if isinstance(v, _Unknown):
            return v
        if v is None:
            raise EvaluationError(f"'{op.name}': SSA value {m.group(1)} is not defined")
        return fn(v, m.group(2), m.group(3))

    def op_arith_index_cast(self, op, env):
        return self._cast(op, env, lambda v, s, d: wrap(signed(v, int_width(s)), int_width(d)))

    def op_arith_index_castui(self, op, env):
        return self._cast(op, env, lambda v, s, d: wrap(wrap(v, int_width(s)), int_width(d)))

    op_arith_extui = op_arith_index_castui
    op_arith_trunci = op_arith_index_castui
    op_arith_extsi = op_arith_index_cast

    def op_arith_bitcast(self, op, env):
        def f(v, s, d):
            if float_fmt(s) and int_width(d):
                fmt = float_fmt(s)
                return int.from_bytes(struct.pack("<" + fmt, v), "little")
            if int_width(s) and float_fmt(d):
                fmt = float_fmt(d)
                return struct.unpack("<" + fmt, wrap(v, int_width(s)).to_bytes(
                    struct.calcsize(fmt), "little"))[0]
            if int_width(s) and int_width(d):
                return v
            return _Unknown(op.name, op.text, op.line)
        return self._cast(op, env, f)

    def op_arith_sitofp(self, op, env):
        return self._cast(op, env, lambda v, s, d: round_float(float(signed(v, int_width(s))), d))

    def op_arith_uitofp(self, op, env):
        return self._cast(op, env, lambda v, s, d: round_float(float(v), d))

    def op_arith_fptosi(self, op, env):
        return self._cast(op, env, lambda v, s, d: wrap(int(v), int_width(d)))

    op_arith_fptoui = op_arith_fptosi

    def op_arith_extf(self, op, env):
        return self._cast(op, env, lambda v, s, d: round_float(v, d))

    op_arith_truncf = op_arith_extf

    def _affine(self, op, env):
        rest = op.rest.strip()
        if rest.startswith("#"):
            am = re.match(r"(#[\w$.\-]+)", rest)
            alias = self.m.aliases.get(am.group(1), "")
            rest = rest[am.end():]
            mm = re.fullmatch(r"affine_map<(.*)>", alias.strip(), re.S)
            if not mm:
                return _Unknown(op.name, op.text, op.line)
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
            return _Unknown(op.name, op.text, op.line)
        am = re.match(r"\s*\(([^)]*)\)\s*(?:\[([^\]]*)\])?", rest)
        dims, syms = SSA_RE.findall(am.group(1)), SSA_RE.findall(am.group(2) or "")
        vals = []
        for n in dims + syms:
            v = env.get(n)
            if isinstance(v, _Unknown):
                return v
            vals.append(signed(v, 64))
        res = eval_affine_map(map_text, vals[:len(dims)], vals[len(dims):])
        return res

    def op_affine_apply(self, op, env):
        r = self._affine(op, env)
        return r if isinstance(r, _Unknown) else wrap(r[0], 64)

    def op_affine_min(self, op, env):
        r = self._affine(op, env)
        return r if isinstance(r, _Unknown) else wrap(min(r), 64)

    def op_affine_max(self, op, env):
        r = self._affine(op, env)
        return r if isinstance(r, _Unknown) else wrap(max(r), 64)

    # util
    def op_util_null(self, op, env):
        return _Opaque("null")

    def op_util_global_load(self, op, env):
        m = re.search(r"@([\w$.\-]+)", op.rest)
        return self.load_global(m.group(1))

    def op_util_global_store(self, op, env):
        m = re.match(r"\s*(" + SSA + r")\s*,\s*@([\w$.\-]+)", op.rest)
        self.globals[m.group(2)] = env.get(m.group(1))
        return []

    def op_util_call(self, op, env):
        m = re.match(r"\s*@([\w$.\-]+)\((.*?)\)\s*:", op.rest, re.S)
        callee = self.m.funcs.get(m.group(1))
        if callee is None:
            return None
        args = [env.get(a) for a in SSA_RE.findall(m.group(2))]
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
        m = re.match(r"<(" + SSA + r")\s*:[^>]*>\[(\d+)\]", op.rest)
        idx = self._input_index(env, m.group(1), op.name)
        shape = np.shape(self.inputs[idx])
        return wrap(shape[int(m.group(2))], 64)

    def op_hal_buffer_view_dims(self, op, env):
        m = re.match(r"<(" + SSA + r")", op.rest)
        idx = self._input_index(env, m.group(1), op.name)
        return [wrap(d, 64) for d in np.shape(self.inputs[idx])]

    def op_hal_buffer_view_rank(self, op, env):
        m = re.match(r"<(" + SSA + r")", op.rest)
        return np.ndim(self.inputs[self._input_index(env, m.group(1), op.name)])

    def op_hal_buffer_view_buffer(self, op, env):
        m = re.match(r"<(" + SSA + r")", op.rest)
        v = self.need(env, m.group(1), op.name)
        if isinstance(v, _InputView):
            return _Buffer("input", v.index)
        if isinstance(v, _View):
            return _Buffer(v.buffer.kind, v.buffer.ref, v.buffer.base + v.offset)
        return None

    def op_hal_buffer_view_assert(self, op, env):
        m = re.match(r"<(" + SSA + r")", op.rest)
        v = env.get(m.group(1))
        if not isinstance(v, _InputView):
            return []
        arr = self.inputs[v.index]
        msg = re.search(r'message\("([^"]*)"\)', op.rest)
        sm = re.search(r"shape\(\[(.*?)\]\)", op.rest)
        if sm:
            want = []
            for n in SSA_RE.findall(sm.group(1)):
                d = env.get(n)
                want.append(None if isinstance(d, _Unknown) else signed(d, 64))
            got = list(np.shape(arr))
            if len(want) != len(got) or any(w is not None and w != g for w, g in zip(want, got)):
                raise ValueError(f"{msg.group(1) if msg else 'input'}: expected shape "
                                 f"{want}, got {got}")
        tm = re.search(r"type\((" + SSA + r")\)", op.rest)
        if tm:
            et = env.get(tm.group(1))
            if isinstance(et, _ElementType) and et.name in DTYPES:
                if np.asarray(arr).dtype != np.dtype(DTYPES[et.name]):
                    raise ValueError(f"{msg.group(1) if msg else 'input'}: expected "
                                     f"element type {et.name}, got {np.asarray(arr).dtype}")
        return []

    def op_hal_buffer_view_create(self, op, env):
        m = re.match(r"\s*buffer\((" + SSA + r")[^)]*\)\[(" + SSA + r")\s*,\s*(" + SSA + r")\]",
                     op.rest)
        buf = self.need(env, m.group(1), op.name)
        off = self.need_int(env, m.group(2), op.name)
        ln = self.need_int(env, m.group(3), op.name)
        sm = re.search(r"shape\(\[(.*?)\]\)", op.rest)
        shape = tuple(signed(self.need_int(env, n, op.name), 64)
                      for n in SSA_RE.findall(sm.group(1)))
        tm = re.search(r"type\((" + SSA + r")\)", op.rest)
        et = self.need(env, tm.group(1), op.name)
        if not isinstance(buf, _Buffer):
            raise EvaluationError(f"{op.name}: buffer {m.group(1)} has unknown origin ({buf!r})")
        return _View(buf, off, ln, shape, et.name if isinstance(et, _ElementType) else "?")

    def op_hal_buffer_subspan(self, op, env):
        m = re.match(r"<(" + SSA + r")[^>]*>\[(" + SSA + r")\s*,\s*(" + SSA + r")\]", op.rest)
        buf = self.need(env, m.group(1), op.name)
        off = self.need_int(env, m.group(2), op.name)
        if not isinstance(buf, _Buffer):
            return None
        return _Buffer(buf.kind, buf.ref, buf.base + off)

    def _alloc(self, op, env):
        m = re.search(r"!hal\.buffer\{(" + SSA + r")\}\s*$", op.rest)
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
        m = re.match(r"<(" + SSA + r")", op.rest)
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
        fm = re.search(r"target\([^)]*\)\[(" + SSA + r")\]", op.rest)
        fn = self.need(env, fm.group(1), what + " function")
        if not isinstance(fn, _FunctionRef):
            raise EvaluationError(f"{what}: function {fm.group(1)} not from "
                                  f"hal.executable.lookup.function ({fn!r})")
        wm = re.search(r"workgroups\(\[(.*?)\]\)", op.rest, re.S)
        wg = tuple(signed(self.need_int(env, n, "workgroup count"), 64)
                   for n in SSA_RE.findall(wm.group(1)))
        cm = re.search(r"constants\(\[(.*?)\]\)", op.rest, re.S)
        consts = [self.need_int(env, n, "push constant") & 0xFFFFFFFF
                  for n in (SSA_RE.findall(cm.group(1)) if cm else [])]
        bm = re.search(r"bindings\(\[(.*)\]\)", op.rest, re.S)
        binds = []
        for b in re.finditer(r"\((" + SSA + r")\s*:\s*([^)]*)\)\[(" + SSA + r")\s*,\s*("
                             + SSA + r")\]", bm.group(1) if bm else ""):
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
        m = re.search(r"target\((" + SSA + r")\s*:\s*([^)]*)\)\[(" + SSA + r")\s*,\s*("
                      + SSA + r")\]\s*pattern\((" + SSA + r")\s*:\s*(\w+)\)", op.rest)
        ref = self._ref(env, m.group(1), m.group(2), op.name)
        w = int_width(m.group(6))
        pat = self.need_int(env, m.group(5), op.name)
        cb.commands.append(("fill", ref, self.need_int(env, m.group(3), op.name),
                            self.need_int(env, m.group(4), op.name),
                            wrap(pat, w).to_bytes(w // 8, "little")))
        return []

    def op_hal_command_buffer_copy_buffer(self, op, env):
        cb = self._cmd(op, env)
        m = re.search(r"source\((" + SSA + r")\s*:\s*([^)]*)\)\[(" + SSA + r")\]\s*"
                      r"target\((" + SSA + r")\s*:\s*([^)]*)\)\[(" + SSA + r")\]\s*"
                      r"length\((" + SSA + r")\)", op.rest)
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
        for name in SSA_RE.findall(m.group(1)):
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
        for b in re.finditer(r"\((" + SSA + r")\s*:\s*[^)]*\)\[(" + SSA + r")\s*,\s*("
                             + SSA + r")\]", bm.group(1)):
            buf = self.need(env, b.group(1), "binding table entry")
            table.append((buf, self.need_int(env, b.group(2), "binding table offset"),
                          self.need_int(env, b.group(3), "binding table length")))
        return self._submit(op, env, table)

    def op_hal_device_queue_fill(self, op, env):
        m = re.search(r"target\((" + SSA + r")\s*:[^)]*\)\[(" + SSA + r")\]\s*length\(("
                      + SSA + r")\)\s*pattern\((" + SSA + r")\s*:\s*(\w+)\)", op.rest)
        if not m:
            raise EvaluationError(f"cannot parse {op.text[:200]}")
        buf = self.need(env, m.group(1), op.name)
        w = int_width(m.group(5))
        pat = wrap(self.need_int(env, m.group(4), op.name), w).to_bytes(w // 8, "little")
        self.steps.append(FillStep(self._binding(("buf", buf), self.need_int(env, m.group(2), op.name),
                                                 self.need_int(env, m.group(3), op.name), None), pat))
        return []

    def op_hal_device_queue_copy(self, op, env):
        m = re.search(r"source\((" + SSA + r")\s*:[^)]*\)\[(" + SSA + r")\]\s*"
                      r"target\((" + SSA + r")\s*:[^)]*\)\[(" + SSA + r")\]\s*"
                      r"length\((" + SSA + r")\)", op.rest)
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
    w = int_width(ty)
    if w is not None:
        if isinstance(v, (float, np.floating)):
            raise TypeError(f"argument {index} has type {ty}; got float {v!r}")
        return wrap(int(v), w)
    if float_fmt(ty):
        return round_float(float(v), ty)
    raise EvaluationError(f"argument {index} has unsupported type {ty}")


def plan_program(compiled: Union[Compiled, str, os.PathLike], inputs: Sequence[Any],
                 function: str | None = None) -> ProgramPlan:
    """Evaluate a public function of the HAL-level IR for concrete inputs.

    Args:
        compiled: a :class:`~hal_cpu.iree.Compiled`, or the path of a
            ``.hal.mlir`` file (then :attr:`Dispatch.so_path` values are
            placeholders).
        inputs: one per function argument: numpy arrays (any object with
            ``shape`` and ``dtype``) for tensor arguments, Python or numpy
            scalars for scalar ones. Only shapes, dtypes and scalar values are
            read, so a broadcast view can stand in for a huge array.
        function: the public function; may be omitted when there is one.

    Returns:
        The :class:`ProgramPlan`.

    Raises:
        ValueError: no such public function, wrong number of inputs, or an
            input whose shape or dtype the program's own checks
            (``hal.buffer_view.assert``) reject.
        TypeError: an array where a scalar is expected or the reverse, or a
            float for an integer argument.
        EvaluationError: the IR needs something the evaluator cannot compute
            (names the op and its line).
    """
    if isinstance(compiled, Compiled):
        module, comp = load_module(compiled.hal_mlir), compiled
    else:
        module, comp = load_module(Path(compiled)), None
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
            if hasattr(v, "shape") and np.ndim(v) != 0:
                raise TypeError(f"argument {i} has type {ty}; pass a scalar")
            args.append(_scalar_value(v, ty, i))
    rets = ev.call(func, args)

    results = []
    for k, r in enumerate(rets):
        if isinstance(r, _InputView):
            arr = np.asarray(inputs[r.index])
            results.append(ResultRef(BindingRef("input", r.index, 0, arr.nbytes),
                                     tuple(arr.shape), arr.dtype))
        elif isinstance(r, _View):
            if r.etype not in DTYPES:
                raise EvaluationError(f"result {k} has unsupported element type {r.etype}",
                                      path=module.path)
            results.append(ResultRef(BindingRef(r.buffer.kind, r.buffer.ref,
                                                r.buffer.base + r.offset, r.length),
                                     r.shape, np.dtype(DTYPES[r.etype])))
        elif isinstance(r, _Unknown):
            raise r.error(f"result {k} of @{function}").located(module.path)
        else:
            raise EvaluationError(f"result {k} of @{function} is not a tensor ({r!r})",
                                  path=module.path)
    return ProgramPlan(function, ev.steps, dict(ev.buffers), results)


def plan_dispatches(compiled: Union[Compiled, str, os.PathLike], inputs: Sequence[Any],
                    function: str | None = None) -> list[Dispatch]:
    """The dispatches of ``compiled`` for ``inputs``, in execution order
    (arguments as :func:`plan_program`).

    Raises:
        EvaluationError: the program also performs buffer transfers (use
            :func:`plan_program` and :func:`hal_cpu.iree.run_plan` for those),
            or as :func:`plan_program`.
        ValueError, TypeError: as :func:`plan_program`.
    """
    plan = plan_program(compiled, inputs, function)
    others = [s for s in plan.steps if not isinstance(s, Dispatch)]
    if others:
        raise EvaluationError(f"@{plan.function} also performs transfers {others}; "
                              "use plan_program()")
    return plan.dispatches
