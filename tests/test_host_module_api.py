"""Host modules as a documented API: the example of docs/host-modules.md
runs as written; a host function's ``StatusError`` reaches the caller with
IREE's code and prints as IREE's ``CODE; message``; an installed entry-point
module is registered by itself for a program importing its name; a missing
module's error says how to give it. Every program is compiled by the pinned
``iree-compile``."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import hal_cpu
from hal_cpu.programs import HostModule, StatusCode, StatusError, export
from hal_cpu.programs.vm import LinkError, VmStatusError, load_program

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "host-modules.md"

#: A program importing two functions of module ``counter`` and, optionally,
#: a third one with a fallback of its own.
PROGRAM = """
module @counting {
  func.func private @counter.add(i64) -> i64
  func.func private @counter.check(i64)
  func.func private @counter.label() -> i64 attributes {vm.fallback = @no_label}
  func.func private @no_label() -> i64 {
    %c = arith.constant -1 : i64
    %label = util.optimization_barrier %c : i64
    return %label : i64
  }
  func.func @step(%n: i64) -> (i64, i64) {
    %total = call @counter.add(%n) : (i64) -> i64
    call @counter.check(%total) : (i64) -> ()
    %label = call @counter.label() : () -> i64
    return %total, %label : i64, i64
  }
}
"""

#: The module, as an installed package would ship it.
MODULE = '''
from hal_cpu.programs import HostModule, StatusCode, StatusError, export


class Counter(HostModule):
    name = "counter"

    def __init__(self, limit):
        super().__init__()
        self.total, self.limit = 0, limit

    @export("add")
    def add(self, n):
        self.total += n
        return self.total

    @export("check")
    def check(self, total):
        if total > self.limit:
            raise StatusError(StatusCode.OUT_OF_RANGE,
                              f"total {total} is past the limit {self.limit}")


def create_module(max_version, params):
    return Counter(int(params.get("limit", "10")))
'''


def python_blocks(text: str) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", text, re.M | re.S)


def run(args, env_path: Path | None = None, cwd: Path | None = None):
    """``args`` in a fresh process, ``env_path`` (if any) and the checkout
    first on ``PYTHONPATH``."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        ([str(env_path)] if env_path else []) + [str(ROOT)])
    return subprocess.run(args, capture_output=True, text=True, timeout=300,
                          env=env, cwd=cwd)


@pytest.fixture(scope="module")
def program_source(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("counting") / "counting.mlir"
    path.write_text(PROGRAM)
    return path


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """A folder that, on ``PYTHONPATH``, installs module ``counter`` as an
    entry point of group hal_cpu.host_modules (a real distribution's
    metadata, found by importlib.metadata)."""
    site = tmp_path_factory.mktemp("site")
    (site / "counter_module.py").write_text(MODULE)
    info = site / "counter_module-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: counter-module\n"
                                   "Version: 1.0\n")
    (info / "entry_points.txt").write_text(
        "[hal_cpu.host_modules]\ncounter = counter_module:create_module\n")
    return site


def test_docs_example_runs(tmp_path):
    """The page's Python example, as written, in a fresh interpreter."""
    blocks = python_blocks(DOC.read_text())
    assert blocks, "docs/host-modules.md has no Python example"
    for i, block in enumerate(blocks):
        script = tmp_path / f"block{i}.py"
        script.write_text(block)
        proc = run([sys.executable, str(script)], cwd=ROOT)
        assert proc.returncode == 0, proc.stderr
    assert "INVALID_ARGUMENT; " in proc.stdout


def test_status_codes_are_iree_s():
    """The codes are those of IREE's plugin header's status enum
    (the same iree_status_code_t values) and name themselves as IREE does."""
    header = (Path(hal_cpu.get_include()) / "iree" / "hal" / "local" /
              "executable_plugin.h").read_text()
    declared = {name: int(value) for name, value in re.findall(
        r"IREE_HAL_EXECUTABLE_PLUGIN_STATUS_([A-Z_]+) = (\d+),", header)}
    assert declared == {c.name: int(c) for c in StatusCode if c.name in declared}
    assert len(declared) >= 17
    err = StatusError(5, "no such thing")
    assert err.code is StatusCode.NOT_FOUND and str(err) == "NOT_FOUND; no such thing"
    assert (err.field, err.value) == ("NOT_FOUND", 5)
    assert VmStatusError is StatusError
    assert str(StatusError(99, "odd")) == "status 99; odd"


def test_status_error_of_a_host_function(program_source, tmp_path):
    """OUT_OF_RANGE from the module reaches the caller as that status,
    naming the program; calls before it ran; the optional import fell back."""
    class Counter(HostModule):
        name = "counter"

        def __init__(self):
            super().__init__()
            self.total = 0

        @export("add")
        def add(self, n):
            self.total += n
            return self.total

        @export("check")
        def check(self, total):
            if total > 10:
                raise StatusError(StatusCode.OUT_OF_RANGE, f"total {total} is past 10")

    with load_program(program_source, host_modules=[Counter()],
                      cache_dir=str(tmp_path)) as program:
        assert [int(v) for v in program("step", 4)] == [4, -1]
        with pytest.raises(StatusError) as info:
            program("step", 7)
    err = info.value
    assert err.code == StatusCode.OUT_OF_RANGE
    assert str(err).startswith("OUT_OF_RANGE; ") and str(err).endswith("total 11 is past 10")
    assert err.name and "counting" in err.name


def test_installed_module_is_registered_by_itself(program_source, installed, tmp_path):
    """No --module/--host_module: the entry point named as the imported
    module is found and registered (with the CLI and from Python); a given
    module still wins over it. (The CLI runs unconfined: a confined native
    run reads only Python's own folders, and this test's package lies in a
    temporary one.)"""
    proc = run([sys.executable, "-m", "hal_cpu", "run-module", str(program_source),
                "--function=step", "--input=i64=3", f"--cache_dir={tmp_path}",
                "--run_native"], env_path=installed)
    assert proc.returncode == 0, proc.stderr
    assert "i64=3" in proc.stdout and "i64=-1" in proc.stdout
    proc = run([sys.executable, "-m", "hal_cpu", "run-module", str(program_source),
                "--function=step", "--input=i64=30", f"--cache_dir={tmp_path}",
                "--run_native"], env_path=installed)
    assert proc.returncode == 1
    assert "OUT_OF_RANGE; " in proc.stderr and "past the limit 10" in proc.stderr
    script = textwrap.dedent(f"""
        from hal_cpu.programs import HostModule, export
        from hal_cpu.programs.vm import load_program

        class Labelled(HostModule):
            name = "counter"
            @export("add")
            def add(self, n):
                return n * 100
            @export("check")
            def check(self, total):
                pass
            @export("label")
            def label(self):
                return 7

        with load_program({str(program_source)!r}, cache_dir={str(tmp_path)!r}) as p:
            print("installed", [int(v) for v in p("step", 2)])
        with load_program({str(program_source)!r}, cache_dir={str(tmp_path)!r},
                          host_modules=[Labelled()]) as p:
            print("given", [int(v) for v in p("step", 2)])
    """)
    proc = run([sys.executable, "-c", script], env_path=installed)
    assert proc.returncode == 0, proc.stderr
    assert "installed [2, -1]" in proc.stdout and "given [200, 7]" in proc.stdout


def test_missing_module_says_how_to_give_it(program_source, tmp_path):
    """Without the entry point installed and no module given: a LinkError
    before anything runs, suggesting --host_module=NAME and --module=FILE.py."""
    with pytest.raises(LinkError) as info:
        load_program(program_source, cache_dir=str(tmp_path))
    message = str(info.value)
    assert "'counter'" in message
    assert "--host_module=counter" in message and "--module=FILE.py" in message
    proc = run([sys.executable, "-m", "hal_cpu", "run-module", str(program_source),
                "--function=step", "--input=i64=3", f"--cache_dir={tmp_path}"])
    assert proc.returncode == 1 and "--host_module=counter" in proc.stderr
    assert "Traceback" not in proc.stderr
