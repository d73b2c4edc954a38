"""Parsing HAL-level IR, the host program ``iree-compile --compile-to=hal``
prints.

The parser reads the generic shape of MLIR text, not IREE's grammar: a
module's ``util.func`` functions (arguments, blocks, one op per statement),
``util.initializer`` regions, ``util.global`` declarations and ``#alias = ...``
attribute aliases. Every op keeps its 1-based line in the file so that
errors can point at it. Op operands stay text; :mod:`hal_cpu.iree.plan` reads
the ones it evaluates.

Also here: the scalar types of the IR (``i1``..``i64``, ``index``,
``f16``/``f32``/``f64``) and affine maps (``affine_map<(d0)[s0] -> (...)>``,
MLIR's affine expression grammar: ``+ - * floordiv ceildiv mod``).
"""

from __future__ import annotations

import functools
import re
import struct
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .errors import EvaluationError

__all__ = [
    "Op", "Block", "Function", "Module", "parse_module", "load_module",
    "eval_affine_map", "DTYPES", "SSA", "SSA_RE",
]

#: An SSA value name, e.g. ``%c0``, ``%buffer_0``, ``%0#1``.
SSA = r"%[\w$.\-]+(?:#\d+)?"
SSA_RE = re.compile(SSA)

#: IR element type -> numpy scalar type.
DTYPES = {
    "f16": np.float16, "f32": np.float32, "f64": np.float64,
    "i8": np.int8, "i16": np.int16, "i32": np.int32, "i64": np.int64,
    "si8": np.int8, "si16": np.int16, "si32": np.int32, "si64": np.int64,
    "ui8": np.uint8, "ui16": np.uint16, "ui32": np.uint32, "ui64": np.uint64,
    "i1": np.bool_,
}


@dataclass
class Op:
    """One op statement.

    Attributes:
        results: SSA names it defines (``%0:2`` becomes ``%0#0``, ``%0#1``).
        name: op name, e.g. ``hal.command_buffer.dispatch``.
        rest: the statement text after the op name.
        text: the whole statement (several lines for a multi-line op).
        line: 1-based line of the statement's start in the file (0 when the
            text was parsed without a position).
    """

    results: list[str]
    name: str
    rest: str
    text: str
    line: int = 0


@dataclass
class Block:
    """A basic block: label (``^bb1``; ``^entry`` for an unlabelled entry
    block), argument SSA names and ops."""

    label: str
    args: list[str]
    ops: list[Op] = field(default_factory=list)


@dataclass
class Function:
    """A ``util.func`` (or ``util.initializer``, named ``<initializer>``).

    Attributes:
        args: (SSA name, type text) per argument.
        line: 1-based line of the header.
    """

    name: str
    args: list[tuple[str, str]]
    blocks: list[Block]
    line: int = 0


@dataclass
class Module:
    """A parsed HAL-level module.

    Attributes:
        funcs: every ``util.func`` with a body, by name (without ``@``).
        public: names of the public ones, in order of appearance.
        initializers: the ``util.initializer`` regions, in order.
        global_inits: ``util.global`` name -> initial value text.
        global_types: ``util.global`` name -> type text.
        global_lines: ``util.global`` name -> 1-based line.
        aliases: ``#alias`` -> attribute text.
        path: the file parsed, or None.
    """

    funcs: dict[str, Function]
    public: list[str]
    initializers: list[Function]
    global_inits: dict[str, str]
    global_types: dict[str, str]
    global_lines: dict[str, int]
    aliases: dict[str, str]
    path: Path | None = None


# ---------------------------------------------------------------------------
# Text scanning
# ---------------------------------------------------------------------------

def _line_of(text: str, index: int) -> int:
    return text.count("\n", 0, index) + 1


def scan_blocks(text: str, start: int) -> int:
    """Index just past the bracket matching the one at ``text[start]``
    (``( [ {``; string literals skipped).

    Raises:
        EvaluationError: unbalanced brackets.
    """
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
    raise EvaluationError("unbalanced brackets in HAL IR", line=_line_of(text, start))


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


def split_statements(body: str, first_line: int = 1) -> list[tuple[int, str]]:
    """Split a region body into ``(line, statement)`` pairs: a statement ends
    at a newline outside brackets and strings; ``//`` comments are dropped.
    ``first_line`` is the line number of ``body[0]``."""
    stmts: list[tuple[int, str]] = []
    cur: list[str] = []
    depth, in_str = 0, False
    line, start = first_line, None

    def flush():
        s = _strip_comment("".join(cur)).strip()
        if s:
            stmts.append((start, s))

    i, n = 0, len(body)
    while i < n:
        c = body[i]
        if start is None and not c.isspace():
            start = line
        if c == "\n":
            line += 1
        if in_str:
            cur.append(c)
            if c == "\\" and i + 1 < n:
                cur.append(body[i + 1])
                line += body[i + 1] == "\n"
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
            flush()
            cur, start = [], None
        else:
            cur.append(c)
        i += 1
    flush()
    return stmts


def split_top_level(s: str, sep: str = ",") -> list[str]:
    """Split ``s`` at ``sep`` outside brackets (``( [ { <``) and strings."""
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


# ---------------------------------------------------------------------------
# Ops, regions, modules
# ---------------------------------------------------------------------------

_OP_RE = re.compile(
    r"^(?:(?P<res>%[\w$.\-]+(?::\d+)?(?:\s*,\s*%[\w$.\-]+(?::\d+)?)*)\s*=\s*)?"
    r"\"?(?P<name>[A-Za-z_][\w$]*(?:\.[\w$]+)+)\"?(?P<rest>.*)$", re.S)


def parse_op(stmt: str, line: int = 0) -> Op:
    """Parse one statement into an :class:`Op`.

    Raises:
        EvaluationError: not of the form ``[%r, ... =] dialect.op ...``.
    """
    m = _OP_RE.match(stmt)
    if not m:
        raise EvaluationError(f"cannot parse statement: {stmt[:200]}", line=line or None)
    results = []
    if m.group("res"):
        for r in m.group("res").split(","):
            r = r.strip()
            if ":" in r:
                base, cnt = r.split(":")
                results += [f"{base}#{k}" for k in range(int(cnt))]
            else:
                results.append(r)
    return Op(results, m.group("name"), m.group("rest"), stmt, line)


def parse_region(body: str, first_line: int = 1) -> list[Block]:
    """Parse a region body into blocks (``first_line``: line of ``body[0]``).

    Raises:
        EvaluationError: a statement or block label cannot be parsed.
    """
    blocks = [Block("^entry", [])]
    for line, stmt in split_statements(body, first_line):
        if stmt.startswith("^"):
            m = re.match(r"^(\^[\w$.\-]+)(?:\((.*)\))?\s*:$", stmt, re.S)
            if not m:
                raise EvaluationError(f"cannot parse block label: {stmt}", line=line)
            args = SSA_RE.findall(m.group(2) or "")
            if not blocks[-1].ops and blocks[-1].label == "^entry":
                blocks[-1] = Block(m.group(1), args)
            else:
                blocks.append(Block(m.group(1), args))
        else:
            blocks[-1].ops.append(parse_op(stmt, line))
    return blocks


def _skip_string(text: str, i: int) -> int:
    i += 1
    while i < len(text) and text[i] != '"':
        i += 2 if text[i] == "\\" else 1
    return i + 1


def parse_module(text: str, path: str | Path | None = None) -> Module:
    """Parse HAL-level IR text.

    Args:
        text: the IR (as ``iree-compile --compile-to=hal`` prints it).
        path: the file it came from, for error messages.

    Raises:
        EvaluationError: text the parser cannot split into functions, blocks
            and ops; the error carries the line (and ``path``).
    """
    try:
        return _parse_module(text, Path(path) if path is not None else None)
    except EvaluationError as e:
        raise e.located(path) from None


def _parse_module(text: str, path: Path | None) -> Module:
    funcs: dict[str, Function] = {}
    public: list[str] = []
    inits: list[Function] = []
    aliases = {m.group(1): m.group(2).strip() for m in
               re.finditer(r"^(#[\w$.\-]+)\s*=\s*(.*)$", text, re.M)}
    global_inits, global_types, global_lines = {}, {}, {}
    for m in re.finditer(r"^\s*util\.global\s+(?:private|public)?\s*(?:mutable\s+)?"
                         r"@([\w$.\-]+)\s*(?:=\s*([^:]+?))?\s*:\s*(.+)$", text, re.M):
        global_types[m.group(1)] = m.group(3).strip()
        global_lines[m.group(1)] = _line_of(text, m.start(1))
        if m.group(2):
            global_inits[m.group(1)] = m.group(2).strip()

    for m in re.finditer(r"^\s*util\.func\s+(public|private)\s+@([\w$.\-]+)\(", text, re.M):
        vis, name = m.group(1), m.group(2)
        header_line = _line_of(text, m.start(2))
        open_paren = m.end() - 1
        close = scan_blocks(text, open_paren)
        args = []
        for a in split_top_level(text[open_paren + 1:close - 1]):
            if not a:
                continue
            am = re.match(r"^(%[\w$.\-]+)\s*:\s*(.*?)(?:\s*\{.*\})?$", a, re.S)
            if not am:
                raise EvaluationError(f"cannot parse argument {a!r} of @{name}",
                                      line=header_line)
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
                i = scan_blocks(text, i)
                continue
            if c == '"':
                i = _skip_string(text, i)
                continue
            i += 1
        if body_start is None:
            continue          # declaration without body
        end = scan_blocks(text, body_start)
        funcs[name] = Function(name, args, parse_region(
            text[body_start + 1:end - 1], _line_of(text, body_start + 1)), header_line)
        if vis == "public":
            public.append(name)

    for m in re.finditer(r"^\s*util\.initializer\s*\{\s*$", text, re.M):
        start = text.index("{", m.start())
        end = scan_blocks(text, start)
        inits.append(Function("<initializer>", [], parse_region(
            text[start + 1:end - 1], _line_of(text, start + 1)),
            _line_of(text, m.start())))
    return Module(funcs, public, inits, global_inits, global_types, global_lines,
                  aliases, path)


@functools.lru_cache(maxsize=32)
def _load_module(path: str, mtime_ns: int) -> Module:
    return parse_module(Path(path).read_text(), path)


def load_module(path: str | Path) -> Module:
    """Parse a ``.hal.mlir`` file (cached by path and modification time).

    Raises:
        EvaluationError: as :func:`parse_module`.
        OSError: the file cannot be read.
    """
    path = Path(path).resolve()
    return _load_module(str(path), path.stat().st_mtime_ns)


# ---------------------------------------------------------------------------
# Scalar types
# ---------------------------------------------------------------------------

def int_width(ty: str) -> int | None:
    """Bit width of integer type ``ty`` (``index`` is 64), else None."""
    ty = ty.strip()
    if ty == "index":
        return 64
    m = re.fullmatch(r"i(\d+)", ty)
    return int(m.group(1)) if m else None


def float_fmt(ty: str) -> str | None:
    """``struct`` format of float type ``ty`` (``e``, ``f``, ``d``), else None."""
    return {"f16": "e", "f32": "f", "f64": "d"}.get(ty.strip())


def wrap(v: int, w: int) -> int:
    """``v`` modulo 2**w (the unsigned w-bit value)."""
    return v & ((1 << w) - 1)


def signed(v: int, w: int) -> int:
    """``v`` as a signed w-bit value."""
    v = wrap(v, w)
    return v - (1 << w) if w and v >> (w - 1) else v


def round_float(v: float, ty: str) -> float:
    """``v`` rounded to float type ``ty``.

    Raises:
        EvaluationError: ``ty`` is not f16, f32 or f64.
    """
    fmt = float_fmt(ty)
    if fmt is None:
        raise EvaluationError(f"unsupported float type {ty}")
    return struct.unpack("<" + fmt, struct.pack("<" + fmt, v))[0]


# ---------------------------------------------------------------------------
# Affine maps
# ---------------------------------------------------------------------------

def eval_affine_map(map_text: str, dims: list[int], syms: list[int]) -> list[int]:
    """Evaluate the results of an affine map for integer dims and symbols.

    Args:
        map_text: the map without ``affine_map<...>``, e.g.
            ``(d0)[s0] -> (d0 floordiv 8, s0 mod 3)``.

    Raises:
        EvaluationError: the map cannot be parsed or the operand counts differ.
    """
    m = re.fullmatch(r"\s*\(([^)]*)\)\s*(?:\[([^\]]*)\])?\s*->\s*\((.*)\)\s*", map_text, re.S)
    if not m:
        raise EvaluationError(f"cannot parse affine map {map_text!r}")
    dnames = [d.strip() for d in m.group(1).split(",") if d.strip()]
    snames = [s.strip() for s in (m.group(2) or "").split(",") if s.strip()]
    if len(dnames) != len(dims) or len(snames) != len(syms):
        raise EvaluationError(f"affine map {map_text!r} applied to {len(dims)} dims, "
                              f"{len(syms)} symbols")
    env = dict(zip(dnames, dims)) | dict(zip(snames, syms))
    return [_AffineParser(e, env).parse() for e in split_top_level(m.group(3))]


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
