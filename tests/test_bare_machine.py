"""A machine without the system packages (qemu-user, gdb-multiarch) passes
the test command: what needs them is skipped with the reason, through
``@pytest.mark.requires`` (tests/conftest.py) and the rule that adds it to
tests parametrized with the qemu engine or a command that needs it.

Each check runs representative tests in an inner pytest session whose
``PATH`` lacks the packages' programs (a folder of links to everything on
``PATH`` but them); ``.ci/run`` runs the whole suite that way too.
"""

from __future__ import annotations

import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from conftest import ROOT, SYSTEM_PACKAGES, needs_qemu

#: Programs a bare machine lacks: qemu-user's and gdb-multiarch.
HIDDEN_PREFIXES = ("qemu-", "gdb-multiarch")

#: Representative tests: a hand-marked one, one parametrized with the
#: engine (its unicorn half runs), an indirect fixture parameter, and a
#: docs example that names --hal-engine=qemu.
QEMU_TESTS = [
    "tests/test_plugin_options.py::test_good_options_pass_the_check",
    "tests/test_emulated_backend.py::test_use_after_close_raises[qemu]",
    "tests/test_prepared_dispatch.py::test_emulated_close_frees_the_ranges[qemu]",
    "tests/test_docs.py::test_docs_shell_examples_run[docs/plugins.md-qemu]",
]
PORTABLE_TESTS = ["tests/test_emulated_backend.py::test_use_after_close_raises[unicorn]"]


def bare_path(folder: Path) -> str:
    """This PATH without the programs of HIDDEN_PREFIXES: a folder holding
    some is replaced by a folder (under ``folder``) of links to its other
    programs; the others stay (a python linked from elsewhere would not
    find its virtual environment)."""
    folder.mkdir(parents=True, exist_ok=True)
    out = []
    for number, directory in enumerate(os.environ.get("PATH", "").split(os.pathsep)):
        if not directory or not os.path.isdir(directory):
            continue
        entries = list(os.scandir(directory))
        if not any(e.name.startswith(HIDDEN_PREFIXES) for e in entries):
            out.append(directory)
            continue
        links = folder / str(number)
        links.mkdir()
        for entry in entries:
            if (not entry.name.startswith(HIDDEN_PREFIXES) and not entry.is_dir()
                    and os.access(entry.path, os.X_OK)):
                (links / entry.name).symlink_to(entry.path)
        out.append(str(links))
    return os.pathsep.join(out)


def run_inner(tmp_path: Path, nodes: list[str], *, bare: bool, ci: bool,
              extra: str | None = None) -> dict[str, tuple[str, str]]:
    """Run ``nodes`` in an inner pytest session; node id -> (outcome,
    message) from its JUnit report (outcome: passed, skipped, failed)."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("CI", "PKR_QEMU_DIR", "PKR_ENGINE", "PYTEST_XDIST_WORKER",
                        "PYTEST_ADDOPTS")}
    if ci:
        env["CI"] = "true"
    if bare:
        env["PATH"] = bare_path(tmp_path / "bin")
    report = tmp_path / "report.xml"
    args = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q",
            "-p", "no:xdist", f"--junitxml={report}", *nodes]
    if extra:
        args.append(extra)
    proc = subprocess.run(args, cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=600)
    assert report.exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
    out = {}
    for case in ET.parse(report).iter("testcase"):
        node = case.get("classname", "").replace(".", "/") + ".py::" + case.get("name", "")
        outcome, message = "passed", ""
        for kind in ("skipped", "failure", "error"):
            found = case.find(kind)
            if found is not None:
                outcome = "skipped" if kind == "skipped" else "failed"
                message = (found.get("message") or "") + (found.text or "")
        out[node] = (outcome, message)
    return out


def test_the_table_names_the_packages():
    assert {"qemu-user", "gdb-multiarch"} <= set(SYSTEM_PACKAGES)
    assert needs_qemu("python -m pytest t --hal-engine=qemu")


def test_a_bare_path_lacks_the_packages(tmp_path):
    path = bare_path(tmp_path / "bin")
    names = [n for d in path.split(os.pathsep) for n in os.listdir(d)]
    assert not [n for n in names if n.startswith(HIDDEN_PREFIXES)]
    assert "bash" in names
    # the interpreter found by name is this one (its virtual environment)
    found = subprocess.run(["python", "-c", "import sys; print(sys.prefix)"],
                           env=dict(os.environ, PATH=path), capture_output=True,
                           text=True).stdout.strip()
    assert found == sys.prefix


def test_a_bare_machine_skips_what_needs_qemu_with_the_reason(tmp_path):
    results = run_inner(tmp_path, QEMU_TESTS + PORTABLE_TESTS, bare=True, ci=False)
    assert len(results) == len(QEMU_TESTS + PORTABLE_TESTS), results
    for node, (outcome, message) in results.items():
        if node.endswith("[unicorn]"):
            assert outcome == "passed", (node, message)
        else:
            assert outcome == "skipped", (node, outcome, message)
            assert "requires qemu-user" in message, (node, message)


def test_ci_fails_rather_than_skips_without_qemu(tmp_path):
    results = run_inner(tmp_path, QEMU_TESTS[1:2], bare=True, ci=True)
    [(outcome, message)] = results.values()
    assert outcome == "failed" and "CI=true" in message, message


@pytest.mark.requires("qemu-user")
def test_with_qemu_the_marked_tests_run(tmp_path):
    results = run_inner(tmp_path, QEMU_TESTS[:3], bare=False, ci=True)
    assert {node: r[0] for node, r in results.items()} == dict.fromkeys(
        results, "passed"), results


def test_an_unknown_package_is_a_usage_error(tmp_path):
    inner = tmp_path / "test_unknown.py"
    inner.write_text("import pytest\n\n@pytest.mark.requires('no-such-package')\n"
                     "def test_x():\n    pass\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "tests"), str(ROOT)]))
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider",
                           "-q", "-p", "no:xdist", "-p", "conftest", str(inner)],
                          cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    assert "no-such-package" in proc.stdout + proc.stderr, proc.stdout + proc.stderr
    assert "unknown system package" in proc.stdout + proc.stderr
    assert proc.returncode != 0
