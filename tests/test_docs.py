"""The documentation as tested documents: README.md and every page of the
site (``docs/**/*.md``) run their examples as written.

Convention (also what a page author needs to know):

* Blocks fenced as ```` ```sh ```` run in bash, blocks fenced as
  ```` ```python ```` run in Python; other fences (```` ```text ````,
  ```` ```c ````, a bare ```` ``` ````) are shown only. Fences start at the
  beginning of a line.
* A block with a title naming a file of the repository (```` ```python
  title="sample_plugins/tutorial/test_scale_plugin.py" ````) is an excerpt
  of that file, which the test suite runs: it is checked to be a verbatim
  excerpt (each of its blank-line separated chunks is in the file) and not
  run.
* Shell: a block runs in one bash process from the repository root (so
  ``cd`` carries over to the next command of the same block), blocks in page
  order; every command must exit 0. A command ending in the comment
  ``# exit status N`` must exit N instead. Commands are split at top-level
  ``&&``; installation (``pip install ...``) and the whole test suite
  (``python -m pytest`` without a path) are not run, the other parts of the
  same line are.
* Python: the blocks of a page run in one interpreter from the repository
  root, in page order, sharing their names (a later block may use what an
  earlier one imported).
* An example that needs the qemu engine (``--engine=qemu`` or
  ``--hal-engine=qemu``, ``--vlen``, a ``--cpu``/``--hal-cpu`` profile
  unicorn cannot run, ``engine="qemu"`` in Python: ``conftest.needs_qemu``)
  or gdb-multiarch (``hal-cpu debug``: ``conftest.system_packages``) runs
  in a test of its own marked ``requires(...)`` with those packages:
  skipped, with the reason, on a machine without them (failed under
  ``CI=true``).
* ``hal-cpu``, ``fatelf`` and ``python`` are this checkout's (the running
  interpreter with the repository first on ``PYTHONPATH``), and ``/tmp/`` in
  an example is replaced by a fresh temporary directory, so runs never
  share files.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from conftest import needs_qemu, requires, system_packages

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = ROOT / "docs"
FENCE = re.compile(r"^```(\w*)(.*)$")
TITLE = re.compile(r'title="([^"]+)"')
EXPECT = re.compile(r"#\s*exit status (\d+)\s*$")


def doc_files() -> list[Path]:
    """README.md and the site's pages, in a stable order."""
    return [README] + sorted(DOCS.rglob("*.md"))


def _rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


@dataclass
class Block:
    """One fenced block: its language, its ``title=`` (or None), its first
    line number (1-based, the fence's) and its lines."""

    kind: str
    title: str | None
    line: int
    lines: list[str]

    @property
    def text(self) -> str:
        return "\n".join(self.lines) + "\n"


def blocks(text: str) -> list[Block]:
    """The fenced blocks of a Markdown text, in order."""
    out: list[Block] = []
    current: Block | None = None
    for number, line in enumerate(text.splitlines(), 1):
        m = FENCE.match(line)
        if m and current is None:
            title = TITLE.search(m.group(2))
            current = Block(m.group(1), title.group(1) if title else None, number, [])
            continue
        if m and current is not None and not m.group(1) and not m.group(2).strip():
            out.append(current)
            current = None
            continue
        if current is not None:
            current.lines.append(line)
    return out


def commands_of(lines: list[str]) -> list[str]:
    """Logical lines of a shell block (continuation lines joined,
    comment-only and blank lines dropped)."""
    commands, pending = [], ""
    for line in lines:
        pending += line
        if pending.endswith("\\"):
            pending = pending[:-1] + " "
            continue
        if pending.strip() and not pending.strip().startswith("#"):
            commands.append(pending.strip())
        pending = ""
    return commands


def sh_blocks(text: str) -> list[list[str]]:
    """The ```sh blocks of ``text`` (untitled), each as its logical lines."""
    return [commands_of(b.lines) for b in blocks(text) if b.kind == "sh" and not b.title]


def python_blocks(text: str) -> list[Block]:
    """The ```python blocks of ``text`` that run (untitled)."""
    return [b for b in blocks(text) if b.kind == "python" and not b.title]


def python_needs_qemu(code: str) -> bool:
    """Whether a Python example runs only on the qemu engine."""
    return bool(re.search(r"""engine\s*=\s*["']qemu["']""", code)) or needs_qemu(code)


def _comment_start(command: str) -> int:
    """Index of a trailing ``# comment`` outside quotes, or len(command)."""
    quote = None
    for i, ch in enumerate(command):
        if quote:
            if ch == quote:
                quote = None
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or command[i - 1].isspace()):
            return i
    return len(command)


def runnable(command: str) -> tuple[str, int] | None:
    """(shell text, expected exit status) for one documented command, or None
    when nothing of it is to be run (see the module docstring)."""
    cut = _comment_start(command)
    comment, body = command[cut:], command[:cut].strip()
    m = EXPECT.search(comment)
    status = int(m.group(1)) if m else 0
    parts = [p.strip() for p in body.split("&&")]
    keep = [p for p in parts if not p.startswith("pip install")
            and not re.fullmatch(r"python -m pytest( -\S+( [^-\s]\S*)?)*", p)]
    if not keep:
        return None
    return " && ".join(keep), status


def qemu_sandbox_missing() -> str | None:
    """Why the qemu engine's sandbox cannot be made here, or None."""
    from elfloader.backend.emulated import sandbox
    status = sandbox.status()
    return None if status["seccomp"] else status["problem"]


def _skip_without_sandbox(what: str) -> None:
    missing = qemu_sandbox_missing()
    if missing and os.environ.get("CI") != "true":
        pytest.skip(f"{what} for the qemu engine: {missing}")


def _tools(bin_dir: Path) -> None:
    """hal-cpu, fatelf and python for this checkout, in ``bin_dir``."""
    for name, target in (("hal-cpu", "-m hal_cpu"), ("fatelf", "-m fatelf"),
                         ("python", ""), ("python3", "")):
        path = bin_dir / name
        path.write_text(f'#!/bin/sh\nexec "{sys.executable}" {target} "$@"\n')
        path.chmod(0o755)


def _environment(tmp_path: Path) -> dict[str, str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _tools(bin_dir)
    # (the docs' engine is auto: not $PKR_ENGINE of a whole-suite run)
    env = {k: v for k, v in os.environ.items() if k != "PKR_ENGINE"}
    return dict(env, PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
                PYTHONPATH=os.pathsep.join(
                    [str(ROOT)] + [p for p in os.environ.get("PYTHONPATH", "")
                                   .split(os.pathsep) if p]),
                PYTEST_ADDOPTS="-p no:cacheprovider")


def _shell_params() -> list:
    """(page, half) for each page with commands: the portable half, and the
    half of the commands needing system packages, marked ``requires(...)``."""
    out = []
    for path in doc_files():
        commands = [c for block in sh_blocks(path.read_text()) for c in block
                    if runnable(c)]
        if any(not system_packages(c) for c in commands):
            out.append(pytest.param(path, False, id=f"{_rel(path)}-portable"))
        needed = {p for c in commands for p in system_packages(c)}
        if needed:
            out.append(pytest.param(path, True, id=f"{_rel(path)}-qemu",
                                    marks=[requires(*sorted(needed, reverse=True))]))
    return out


def _python_params() -> list:
    out = []
    for path in doc_files():
        found = python_blocks(path.read_text())
        if found:
            qemu = any(python_needs_qemu(b.text) for b in found)
            out.append(pytest.param(path, id=_rel(path),
                                    marks=[requires("qemu-user")] if qemu else []))
    return out


def _excerpt_params() -> list:
    return [pytest.param(path, id=_rel(path)) for path in doc_files()
            if any(b.title for b in blocks(path.read_text()))]


# --- the conventions ------------------------------------------------------------
def test_docs_blocks_are_found():
    commands = [c for path in doc_files() for block in sh_blocks(path.read_text())
                for c in block]
    assert any(c.startswith("hal-cpu run ") for c in commands)
    assert any(c.startswith("fatelf join ") for c in commands)
    assert any("hal-cpu demo" in c for c in sh_blocks(README.read_text())[0])
    assert any(python_blocks(p.read_text()) for p in doc_files())
    assert runnable("pip install -e . && hal-cpu demo   # six arches") == (
        "hal-cpu demo", 0)
    assert runnable("pip install -e '.[test]' && python -m pytest -q") is None
    assert runnable("pip install -e '.[test]' && python -m pytest -q -n auto") is None
    assert runnable("hal-cpu run x.so  # exit status 1") == ("hal-cpu run x.so", 1)
    assert sh_blocks("```sh\na \\\n  b\n# note\n\nc # d\n```\n```python\nx\n```"
                     ) == [["a    b", "c # d"]]
    parsed = blocks('```python title="a/b.py"\nx = 1\n```\n```python\ny\n```\n')
    assert [(b.kind, b.title, b.line, b.lines) for b in parsed] == [
        ("python", "a/b.py", 1, ["x = 1"]), ("python", None, 4, ["y"])]


def test_docs_qemu_examples_are_found():
    assert needs_qemu("hal-cpu run-module x.mlir --arch=riscv64 --cpu=rv64gcv "
                      "--vlen=512")
    assert needs_qemu("hal-cpu run k.so --cpu=sve --vlen=256")
    assert needs_qemu("hal-cpu run k.so --engine=qemu")
    assert needs_qemu("python -m pytest t --hal-engine=qemu --hal-cpu='sve:vl=128'")
    assert needs_qemu("python -m pytest t --hal-cpu=aarch64/sve:vl=128,2048")
    assert not needs_qemu("hal-cpu run k.so --cpu=sve --engine=unicorn")
    assert not needs_qemu("hal-cpu run k.so --arch=aarch64 --backend=emulated")
    assert not needs_qemu("hal-cpu run k.so --cpu=x86-64-v2")
    assert system_packages("hal-cpu debug run k.so --entry_point 0") == (
        "qemu-user", "gdb-multiarch")
    assert system_packages("hal-cpu debug run k.so --engine unicorn  # exit status 1") == ()
    assert system_packages("hal-cpu run k.so --engine=qemu") == ("qemu-user",)
    assert python_needs_qemu('Executable("k.so", engine="qemu")')
    assert any(needs_qemu(c) for path in doc_files()
               for block in sh_blocks(path.read_text()) for c in block)


# --- the examples -----------------------------------------------------------------
@pytest.mark.parametrize("path,qemu", _shell_params())
def test_docs_shell_examples_run(tmp_path, path, qemu):
    if qemu:
        _skip_without_sandbox(f"{_rel(path)} commands")
    env = _environment(tmp_path)
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    ran = 0
    for number, block in enumerate(sh_blocks(path.read_text())):
        script = ["set -u"]
        for command in block:
            job = runnable(command)
            if job is None or bool(system_packages(command)) != qemu:
                continue
            text, status = job
            text = text.replace("/tmp/", f"{scratch}/")
            script.append(f"{text}\nrc=$?\nif [ $rc -ne {status} ]; then "
                          f'echo "exit status $rc, not {status}:" '
                          f"{shlex.quote(text)} >&2; exit 1; fi")
            ran += 1
        if len(script) == 1:
            continue
        proc = subprocess.run(["bash", "-c", "\n".join(script)], cwd=ROOT,
                              env=env, capture_output=True, text=True,
                              timeout=600)
        assert proc.returncode == 0, (f"{_rel(path)} sh block {number + 1}:\n"
                                      f"{proc.stderr}\n{proc.stdout[-2000:]}")
    assert ran >= 1


#: Runs a page's Python blocks in one namespace; a failure names the page,
#: the block's line and the traceback.
_PYTHON_RUNNER = """
import json, sys, traceback
page, found = json.loads(sys.stdin.read())
namespace = {"__name__": "__main__"}
for line, code in found:
    try:
        exec(compile(code, f"{page}:{line}", "exec"), namespace)
    except BaseException:
        print(f"{page}: python block at line {line}:", file=sys.stderr)
        traceback.print_exc()
        sys.exit(1)
"""


@pytest.mark.parametrize("path", _python_params())
def test_docs_python_examples_run(tmp_path, path):
    found = python_blocks(path.read_text())
    if any(python_needs_qemu(b.text) for b in found):
        _skip_without_sandbox(f"{_rel(path)} Python examples")
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    payload = [_rel(path), [(b.line, b.text.replace("/tmp/", f"{scratch}/"))
                            for b in found]]
    proc = subprocess.run([sys.executable, "-c", _PYTHON_RUNNER], cwd=ROOT,
                          env=_environment(tmp_path), input=json.dumps(payload),
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]


@pytest.mark.parametrize("path", _excerpt_params())
def test_docs_excerpts_are_the_tested_code(path):
    """A titled block is a verbatim excerpt of the file its title names."""
    for block in blocks(path.read_text()):
        if not block.title:
            continue
        source = ROOT / block.title
        assert source.is_file(), f"{_rel(path)}:{block.line}: no file {block.title}"
        text = source.read_text()
        for chunk in block.text.strip().split("\n\n"):
            assert chunk in text, (f"{_rel(path)}:{block.line}: not in "
                                   f"{block.title}:\n{chunk}")


def test_tutorial_excerpts_name_the_files_the_suite_runs():
    titles = {b.title for path in doc_files() for b in blocks(path.read_text()) if b.title}
    assert {"sample_plugins/tutorial/scale_plugin.c",
            "sample_plugins/tutorial/test_scale_plugin.py"} <= titles


def test_site_builds_strict(tmp_path):
    """``mkdocs build --strict``: every page in the nav, every link resolves,
    the API pages render (the ``docs`` extra)."""
    pytest.importorskip("mkdocs")
    pytest.importorskip("mkdocstrings")
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict",
                           "-d", str(tmp_path / "site")], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert (tmp_path / "site" / "api" / "hal_cpu" / "index.html").is_file()
