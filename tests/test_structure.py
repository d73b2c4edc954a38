"""The one structure rule no tool checks, checked on the source.

The others are checked by well-kept tools (CONTRIBUTING.md, "Structure
rules"): the layers, the boundaries between ``hal_cpu``'s jobs and import
cycles by ``lint-imports`` (import-linter, contracts in ``pyproject.toml``),
private attributes of other objects (``x._name``) by ruff's ``SLF001``.

Left here: no file of ``fatelf``, ``elfloader`` and ``hal_cpu`` imports
another module's private name (``from m import _name``; ruff's rule for it,
``PLC2701``, is a preview rule). The files are read with :mod:`ast`;
nothing is imported.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("fatelf", "elfloader", "hal_cpu")

# Underscore names that are documented public API of the standard library
# (``sys._getframe``, ``os._exit``, namedtuple methods, enum's sunder names).
PUBLIC_UNDERSCORE = frozenset({
    "_asdict", "_fields", "_field_defaults", "_make", "_replace",
    "_missing_", "_name_", "_value_", "_generate_next_value_", "_ignore_",
    "_getframe", "_exit",
})

FILES = sorted(p for package in PACKAGES for p in (ROOT / package).rglob("*.py"))


def _private(name: str) -> bool:
    return (name.startswith("_") and not (name.startswith("__") and name.endswith("__"))
            and name not in PUBLIC_UNDERSCORE)


def private_imports(path: Path, root: Path = ROOT) -> list[str]:
    """``from m import _name`` statements in the file at ``path``, each as
    ``file:line: statement`` (the file relative to ``root``)."""
    tree = ast.parse(path.read_text(), str(path))
    rel = path.relative_to(root)
    return [f"{rel}:{node.lineno}: from {'.' * node.level}{node.module or ''} import {a.name}"
            for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom) and node.module != "__future__"
            for a in node.names if _private(a.name)]


@pytest.mark.parametrize("package", PACKAGES)
def test_no_private_name_imported(package: str) -> None:
    found = [line for path in FILES if path.relative_to(ROOT).parts[0] == package
             for line in private_imports(path)]
    assert not found, "\n".join(found)


def test_check_sees_a_private_import(tmp_path: Path) -> None:
    """The check finds what it should, relative or absolute."""
    assert ROOT / "hal_cpu" / "programs" / "vm" / "program.py" in FILES
    src = tmp_path / "m.py"
    src.write_text("from .errors import _hidden\nfrom os import _exit\n"
                   "from hal_cpu.library import Executable\n")
    found = [line.split(": ", 1)[1] for line in private_imports(src, tmp_path)]
    assert found == ["from .errors import _hidden"]
