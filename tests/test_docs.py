"""README.md as a tested document: its shell examples run as written.

Convention (also what a README author needs to know):

* Only blocks fenced as ```` ```sh ```` are executed; other fences
  (```` ```python ````, ```` ```text ````, a bare ```` ``` ````) are shown
  only.
* A block runs in one bash process from the repository root (so ``cd``
  carries over to the next command of the same block), blocks in README
  order; every command must exit 0.
* A command ending in the comment ``# exit status N`` must exit N instead.
* Commands are split at top-level ``&&``; installation (``pip install ...``)
  and the whole test suite (``python -m pytest`` without a path) are not
  run, the other parts of the same line are.
* A command that needs the qemu engine (``--engine=qemu``, ``--vlen``, or
  a ``--cpu`` profile unicorn cannot run) runs in a test of its own, which
  is skipped, with the reason, on a machine without qemu-user or its
  sandbox (not with ``CI=true``, where that is a failure).
* ``hal-cpu``, ``fatelf`` and ``python`` are this checkout's (the running
  interpreter with the repository first on ``PYTHONPATH``), and ``/tmp/`` in
  a command is replaced by a fresh temporary directory, so runs never
  share files.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
FENCE = re.compile(r"^```(\S*)\s*$")
EXPECT = re.compile(r"#\s*exit status (\d+)\s*$")


def sh_blocks(text: str) -> list[list[str]]:
    """The ```sh blocks of ``text``, each as its logical lines (continuation
    lines joined, comment-only and blank lines dropped)."""
    blocks, current, kind = [], None, None
    for line in text.splitlines():
        m = FENCE.match(line)
        if m and current is None:
            kind, current = m.group(1), []
            continue
        if m and current is not None and not m.group(1):
            if kind == "sh":
                blocks.append(current)
            current = None
            continue
        if current is not None:
            current.append(line)
    out = []
    for lines in blocks:
        commands, pending = [], ""
        for line in lines:
            pending += line
            if pending.endswith("\\"):
                pending = pending[:-1] + " "
                continue
            if pending.strip() and not pending.strip().startswith("#"):
                commands.append(pending.strip())
            pending = ""
        out.append(commands)
    return out


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
    """(shell text, expected exit status) for one README command, or None
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


def needs_qemu(command: str) -> bool:
    """Whether a README command runs only on the qemu engine (see the
    module docstring)."""
    from fatelf import arches
    if "--engine=qemu" in command or "--vlen" in command:
        return True
    for name in re.findall(r"--cpu[= ](\S+)", command):
        if any(p.name == name.lower() and not p.unicorn
               for p in arches.PROFILES):
            return True
    return False


def qemu_engine_missing() -> str | None:
    """Why the qemu engine cannot run here, or None when it can."""
    import elfloader
    from elfloader.backend.emulated import qemu_program, sandbox
    if not all(qemu_program(a) for a in elfloader.arch.ARCHES):
        return "qemu-user is not installed"
    if not sandbox.status()["seccomp"]:
        return sandbox.status()["problem"]
    return None


def _tools(bin_dir: Path) -> None:
    """hal-cpu, fatelf and python for this checkout, in ``bin_dir``."""
    for name, target in (("hal-cpu", "-m hal_cpu"), ("fatelf", "-m fatelf"),
                         ("python", ""), ("python3", "")):
        path = bin_dir / name
        path.write_text(f'#!/bin/sh\nexec "{sys.executable}" {target} "$@"\n')
        path.chmod(0o755)


def test_readme_blocks_are_found():
    blocks = sh_blocks(README.read_text())
    commands = [c for block in blocks for c in block]
    assert len(blocks) >= 4
    assert any(c.startswith("hal-cpu run ") for c in commands)
    assert any(c.startswith("fatelf join ") for c in commands)
    assert runnable("pip install -e . && hal-cpu demo   # six arches") == (
        "hal-cpu demo", 0)
    assert runnable("pip install -e '.[test]' && python -m pytest -q") is None
    assert runnable("pip install -e '.[test]' && python -m pytest -q -n auto") is None
    assert runnable("hal-cpu run x.so  # exit status 1") == ("hal-cpu run x.so", 1)
    assert sh_blocks("```sh\na \\\n  b\n# note\n\nc # d\n```\n```python\nx\n```"
                     ) == [["a    b", "c # d"]]


def test_readme_qemu_commands_are_found():
    assert needs_qemu("hal-cpu run-module x.mlir --arch=riscv64 --cpu=rv64gcv "
                      "--vlen=512")
    assert needs_qemu("hal-cpu run k.so --cpu=sve --vlen=256")
    assert needs_qemu("hal-cpu run k.so --engine=qemu")
    assert not needs_qemu("hal-cpu run k.so --arch=aarch64 --backend=emulated")
    assert any(needs_qemu(c) for block in sh_blocks(README.read_text())
               for c in block)


@pytest.mark.parametrize("qemu", [False, True], ids=["portable", "qemu"])
def test_readme_shell_examples_run(tmp_path, qemu):
    if qemu:
        missing = qemu_engine_missing()
        if missing and os.environ.get("CI") != "true":
            pytest.skip(f"README commands for the qemu engine: {missing}")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _tools(bin_dir)
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    # (the README's engine is auto: not $PKR_ENGINE of a whole-suite run)
    env = {k: v for k, v in os.environ.items() if k != "PKR_ENGINE"}
    env = dict(env, PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
               PYTHONPATH=os.pathsep.join(
                   [str(ROOT)] + [p for p in os.environ.get("PYTHONPATH", "")
                                  .split(os.pathsep) if p]),
               PYTEST_ADDOPTS="-p no:cacheprovider")
    ran = 0
    for number, block in enumerate(sh_blocks(README.read_text())):
        script = ["set -u"]
        for command in block:
            job = runnable(command)
            if job is None or needs_qemu(command) != qemu:
                continue
            text, status = job
            text = text.replace("/tmp/", f"{scratch}/")
            script.append(f"{text}\nrc=$?\nif [ $rc -ne {status} ]; then "
                          f'echo "exit status $rc, not {status}:" '
                          f"{shlex.quote(text)} >&2; exit 1; fi")
            ran += 1
        proc = subprocess.run(["bash", "-c", "\n".join(script)], cwd=ROOT,
                              env=env, capture_output=True, text=True,
                              timeout=300)
        assert proc.returncode == 0, (f"README sh block {number + 1}:\n"
                                      f"{proc.stderr}\n{proc.stdout[-2000:]}")
    assert ran >= (1 if qemu else 10)


def test_readme_plugin_testing_example_is_the_tested_code():
    """The C and Python blocks of "Testing your plugin on six
    architectures" are the files the test suite runs (verbatim excerpts)."""
    text = README.read_text()
    section = text.split("## Testing your plugin on six architectures", 1)[1]
    section = section.split("\n## ", 1)[0]
    blocks = re.findall(r"^```(c|python)\n(.*?)^```", section, re.M | re.S)
    files = {"c": ROOT / "sample_plugins" / "tutorial" / "scale_plugin.c",
             "python": ROOT / "sample_plugins" / "tutorial" / "test_scale_plugin.py"}
    assert sorted(kind for kind, _ in blocks) == ["c", "python"]
    for kind, body in blocks:
        source = files[kind].read_text()
        for chunk in body.strip().split("\n\n"):
            assert chunk in source, (kind, chunk)
