"""One clear boundary per layer, checked on the source.

* No import cycle among the modules of ``fatelf``, ``elfloader`` and
  ``hal_cpu``. Every import counts: at module level, inside functions and
  under ``if TYPE_CHECKING:``; relative imports are resolved; ``from pkg
  import name`` where ``name`` is a submodule imports that submodule, and
  otherwise imports ``pkg`` itself (its ``__init__``), also from one of
  ``pkg``'s own submodules.
* No file reaches into another file's private names: an attribute access
  ``x._name`` where ``x`` is not ``self``, ``cls`` or ``super()`` and
  ``_name`` (not a dunder) is defined nowhere in the same file, and ``from m
  import _name`` of another module's private name. A third-party package's
  private name used for want of a public API is listed, with the reason,
  in :data:`THIRD_PARTY_PRIVATE`.

Both checks read the files with :mod:`ast`; nothing is imported. Each
finding belongs to a part of the packages (the longest prefix in
:data:`PARTS` of the module it is in; a cycle belongs to the part of every
module on it), and each part is one test, so a part with findings fails on
its own and lists them.
"""

from __future__ import annotations

import ast
import functools
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("fatelf", "elfloader", "hal_cpu")

# The parts of the packages, each checked by its own test.
PARTS = (
    "fatelf",
    "elfloader",
    "elfloader.backend.emulated",
    "hal_cpu",
    "hal_cpu.programs",
    "hal_cpu.programs.vm",
)

# Parts with findings still to clean up: the test of such a part is an
# expected failure (strict: once the part is clean, it fails, and its entry
# here goes).
DIRTY: dict[str, str] = {
}

# Underscore names that are documented public API of the standard library:
# namedtuple methods, enum's sunder names, ctypes' structure and type
# attributes, ``sys._getframe``, ``os._exit``.
PUBLIC_UNDERSCORE = frozenset({
    "_asdict", "_fields", "_field_defaults", "_make", "_replace",
    "_missing_", "_name_", "_value_", "_generate_next_value_", "_ignore_",
    "_fields_", "_pack_", "_anonymous_", "_type_", "_length_", "_objects",
    "_b_base_", "_b_needsfree_", "_as_parameter_",
    "_getframe", "_exit",
})

# Private names of third-party packages that have no public equivalent:
# (module, the expression as written) -> why it is used.
THIRD_PARTY_PRIVATE: dict[tuple[str, str], str] = {
    ("elfloader.backend.emulated.unicorn_arch", "uc._uch"):
        "unicorn's engine handle (uc_engine *): the Python binding has no public "
        "accessor, and a hook whose callback is a native function (not a Python "
        "callable, which Uc.hook_add requires) is added with uclib.uc_hook_add "
        "on the handle",
    ("elfloader.backend.emulated.unicorn_engine", "uc._callbacks"):
        "the Uc object's table of hook callbacks: cleared when a CPU closes, "
        "since the callbacks hold the CPU (a reference cycle) and once the "
        "engine is released Uc.hook_del can no longer be called",
}


def _modules() -> dict[str, Path]:
    """Dotted module name -> source file, for every module of the packages."""
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


MODULES = _modules()


def part_of(module: str) -> str:
    return max((p for p in PARTS if module == p or module.startswith(p + ".")),
               key=len)


def _is_package(module: str) -> bool:
    return MODULES[module].name == "__init__.py"


def _resolve(module: str, node: ast.ImportFrom) -> str:
    """The absolute module name an ``ImportFrom`` in ``module`` names."""
    if not node.level:
        return node.module or ""
    base = module.split(".")
    if not _is_package(module):
        base.pop()
    if node.level > 1:
        base = base[:len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


@functools.lru_cache(maxsize=None)
def _tree(module: str) -> ast.Module:
    return ast.parse(MODULES[module].read_text(), str(MODULES[module]))


@functools.lru_cache(maxsize=None)
def import_edges() -> dict[str, dict[str, int]]:
    """module -> {imported project module: line of the first such import}."""
    edges: dict[str, dict[str, int]] = {}
    for module in MODULES:
        out: dict[str, int] = {}
        for node in ast.walk(_tree(module)):
            targets = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                source = _resolve(module, node)
                for a in node.names:
                    sub = f"{source}.{a.name}"
                    targets.append(sub if sub in MODULES else source)
            for target in targets:
                if target in MODULES and target != module:
                    out.setdefault(target, node.lineno)
        edges[module] = out
    return edges


def import_cycles() -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    edges = import_edges()
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def describe_cycle(component: list[str]) -> str:
    edges = import_edges()
    members = set(component)
    lines = [f"import cycle among {', '.join(component)}:"]
    for m in component:
        for target, line in sorted(edges[m].items()):
            if target in members:
                rel = MODULES[m].relative_to(ROOT)
                lines.append(f"  {rel}:{line}: {m} -> {target}")
    return "\n".join(lines)


def _defined_names(tree: ast.Module) -> set[str]:
    """Every name a file defines: functions, classes, assignments and
    annotated fields at any level, attributes it stores, ``__slots__``."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            names.add(node.id)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, (ast.Store, ast.Del)):
            names.add(node.attr)
        elif isinstance(node, ast.alias):
            names.add((node.asname or node.name).split(".")[0])
        elif isinstance(node, ast.keyword) and node.arg:
            names.add(node.arg)
        elif isinstance(node, ast.Assign):
            for t in node.targets:
                if isinstance(t, ast.Name) and t.id == "__slots__":
                    for c in ast.walk(node.value):
                        if isinstance(c, ast.Constant) and isinstance(c.value, str):
                            names.add(c.value)
    return names


def _private(name: str) -> bool:
    return (name.startswith("_") and not (name.startswith("__") and name.endswith("__"))
            and name not in PUBLIC_UNDERSCORE)


def _own(value: ast.expr) -> bool:
    """``self``, ``cls`` or ``super()``."""
    if isinstance(value, ast.Name):
        return value.id in ("self", "cls")
    return (isinstance(value, ast.Call) and isinstance(value.func, ast.Name)
            and value.func.id == "super")


def private_accesses(module: str) -> list[str]:
    """Accesses in ``module`` to private names another file defines."""
    tree = _tree(module)
    defined = _defined_names(tree)
    rel = MODULES[module].relative_to(ROOT)
    found = []
    for node in sorted(ast.walk(tree), key=lambda n: getattr(n, "lineno", 0)):
        if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load):
            if (_private(node.attr) and not _own(node.value)
                    and node.attr not in defined
                    and (module, ast.unparse(node)) not in THIRD_PARTY_PRIVATE):
                found.append(f"{rel}:{node.lineno}: {ast.unparse(node)}")
        elif isinstance(node, ast.ImportFrom) and node.module != "__future__":
            for a in node.names:
                if _private(a.name):
                    found.append(f"{rel}:{node.lineno}: from "
                                 f"{'.' * node.level}{node.module or ''} import {a.name}")
    return found


def findings() -> dict[str, list[str]]:
    """part -> the cycles and private accesses found in it."""
    by_part: dict[str, list[str]] = defaultdict(list)
    for component in import_cycles():
        for part in sorted({part_of(m) for m in component}):
            by_part[part].append(describe_cycle(component))
    for module in MODULES:
        for access in private_accesses(module):
            by_part[part_of(module)].append(f"private access {access}")
    return by_part


_FINDINGS = findings()


@pytest.mark.parametrize("part", [
    pytest.param(p, marks=pytest.mark.xfail(strict=True, reason=DIRTY[p]))
    if p in DIRTY else p for p in PARTS])
def test_part_has_no_cycles_and_no_private_access(part: str) -> None:
    problems = _FINDINGS.get(part, [])
    assert not problems, "\n".join(problems)


def test_third_party_private_names_are_still_used() -> None:
    """Every entry of :data:`THIRD_PARTY_PRIVATE` names an access that is
    still in its module (a stale entry would allow a new one unseen)."""
    for module, expression in THIRD_PARTY_PRIVATE:
        used = {ast.unparse(node) for node in ast.walk(_tree(module))
                if isinstance(node, ast.Attribute)}
        assert expression in used, (module, expression)


def test_checks_see_what_they_should() -> None:
    """The resolution the checks rest on: relative imports, submodules named
    in ``from pkg import name``, imports inside functions."""
    edges = import_edges()
    assert "hal_cpu.errors" in edges["hal_cpu.programs.errors"]
    assert "hal_cpu.runtime" in edges["hal_cpu.programs.compiler"]
    assert "fatelf.arches" in edges["hal_cpu.programs.compiler"]
    assert all(part_of(m) in PARTS for m in MODULES)
    assert set(PARTS) <= {part_of(m) for m in MODULES}
