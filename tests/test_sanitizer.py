"""The workbench's kernel sanitizer (hal_cpu.workbench, the qemu engine's
TCG plugin): bugs planted in tests/plugins/planted_bugs.c are each reported
with kind, binding, bytes, workgroups and source line, on four
architectures; the correct kernel reports nothing."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import requires

PLUGINS = Path(__file__).parent / "plugins"
SOURCE = PLUGINS / "planted_bugs.c"
ARCHES = ("aarch64", "riscv64", "arm32", "x86_64")
N = 18            # floats per binding: 72 bytes, not a multiple of 64
GRID = (5, 1, 1)  # workgroup x covers elements [4x, 4x + 4)


def _line(marker: str) -> int:
    """The source line holding ``/* marker */``."""
    for i, text in enumerate(SOURCE.read_text().splitlines(), 1):
        if f"/* {marker} */" in text:
            return i
    raise AssertionError(marker)


def _build(tmp_path_factory, stem: str, cpu=None) -> Path:
    pytest.importorskip("ziglang")
    import fatelf
    from hal_cpu.buildtools import zig as zigbuild
    work = tmp_path_factory.mktemp(stem)
    arches = ARCHES if cpu is None else ("aarch64",)
    objects = [zigbuild.build_freestanding(
        "planted_bugs.c", arch, cwd=PLUGINS, work_dir=work, cpu=cpu,
        exports=["iree_hal_executable_library_query"], debug=True)
        for arch in arches]
    path = work / f"{stem}.sos"
    path.write_bytes(fatelf.join(objects, names=[f"planted_{a}.so"
                                                 for a in arches]))
    return path


@pytest.fixture(scope="module")
def planted(tmp_path_factory) -> Path:
    """planted_bugs.c for ARCHES, built with DWARF, as a FatELF bundle."""
    return _build(tmp_path_factory, "planted_bugs")


def sanitize(library: Path, arch: str, case: int, n: int = N, **options):
    """Dispatch case ``case`` under the sanitizer (binding 2 given no
    contents); returns the one report."""
    from hal_cpu import Executable, workbench
    with workbench.Session(sanitize=True, uninitialized={2}) as wb:
        with Executable(library, arch=arch, backend="emulated",
                        engine="qemu", timeout=60, **options) as exe:
            exe.dispatch("planted", GRID,
                         [np.arange(n, dtype=np.float32),
                          np.zeros(n, np.float32), np.zeros(n, np.float32)],
                         [case], workers=1)
    assert len(wb.reports) == 1
    return wb.reports[0]


def _check_line(finding, marker: str) -> None:
    assert finding.source == f"planted_bugs.c:{_line(marker)}", finding.text()
    assert finding.symbol and finding.symbol.startswith("plant_"), finding.text()


@requires("qemu-user")
@pytest.mark.parametrize("arch", ARCHES)
def test_correct_kernel_reports_nothing(planted, arch):
    report = sanitize(planted, arch, 0)
    assert report.sanitized and report.findings == [] and report.clean
    assert "nothing found" in report.text()


@requires("qemu-user")
@pytest.mark.parametrize("arch", ARCHES)
def test_race_between_workgroups(planted, arch):
    report = sanitize(planted, arch, 1)
    races = [f for f in report.findings if f.kind == "race"]
    assert races and {f.kind for f in report.findings} == {"race"}
    # every workgroup after the first writes out[0] after the one before it
    assert sorted(tuple(f.workgroups[0]) for f in races) == [
        (x, 0, 0) for x in range(1, GRID[0])]
    for f in races:
        assert (f.binding, f.start, f.end, f.access) == (1, 0, 4, "write")
        x = f.workgroups[0][0]
        assert tuple(f.workgroups[1]) == (x - 1, 0, 0)
        _check_line(f, "RACE")


@requires("qemu-user")
@pytest.mark.parametrize("arch", ARCHES)
def test_order_dependence(planted, arch):
    report = sanitize(planted, arch, 2)
    assert {f.kind for f in report.findings} == {"order"}
    got = sorted((f.workgroups[0][0], f.workgroups[1][0], f.start, f.end)
                 for f in report.findings)
    # workgroup x reads element 4x - 1, which workgroup x - 1 wrote
    assert got == [(x, x - 1, 16 * x - 4, 16 * x) for x in range(1, GRID[0])]
    for f in report.findings:
        assert f.binding == 1 and f.access == "read"
        _check_line(f, "ORDER")


@requires("qemu-user")
@pytest.mark.parametrize("arch", ARCHES)
def test_unwritten_tail(planted, arch):
    report = sanitize(planted, arch, 3)
    assert [(f.kind, f.binding, f.start, f.end) for f in report.findings] == [
        ("never written", 1, 4 * (N - 2), 4 * N)]
    assert "never written: binding 1 bytes [64, 72)" in report.text()


@requires("qemu-user")
@pytest.mark.parametrize("arch", ARCHES)
def test_uninitialized_read(planted, arch):
    report = sanitize(planted, arch, 4)
    assert {f.kind for f in report.findings} == {"uninitialized"}
    spans = sorted((f.workgroups[0][0], f.start, f.end) for f in report.findings)
    assert spans == [(x, 16 * x, min(16 * x + 16, 4 * N))
                     for x in range(GRID[0])]
    for f in report.findings:
        assert f.binding == 2 and f.access == "read"
        _check_line(f, "UNINITIALIZED")


@requires("qemu-user")
@pytest.mark.parametrize("arch", ARCHES)
def test_read_one_element_past_a_binding(planted, arch):
    report = sanitize(planted, arch, 5)
    assert [(f.kind, f.binding, f.start, f.end, tuple(f.workgroups[0]),
             f.access) for f in report.findings] == [
        ("outside", 0, 4 * N, 4 * N + 4, (GRID[0] - 1, 0, 0), "read")]
    _check_line(report.findings[0], "ONE_PAST")


@requires("qemu-user")
def test_unicorn_is_refused_with_a_typed_error(planted):
    from hal_cpu import Executable, workbench
    with workbench.Session(sanitize=True) as wb:
        with Executable(planted, arch="riscv64", backend="emulated",
                        engine="unicorn", timeout=60) as exe:
            with pytest.raises(workbench.WorkbenchError,
                               match="not supported on the unicorn engine"):
                exe.dispatch("planted", GRID, [np.zeros(N, np.float32)] * 3,
                             [0], workers=1)
    assert wb.reports == []


@requires("qemu-user")
def test_several_workers_are_refused(planted):
    from hal_cpu import Executable, workbench
    with workbench.Session(sanitize=True) as wb:
        with Executable(planted, arch="riscv64", backend="emulated",
                        engine="qemu", timeout=60) as exe:
            with pytest.raises(workbench.WorkbenchError, match="one worker"):
                exe.dispatch("planted", GRID, [np.zeros(N, np.float32)] * 3,
                             [0], workers=2)
    assert wb.reports == []


@requires("qemu-user")
def test_sve_contiguous_accesses_are_said_unseen(tmp_path_factory):
    """qemu 7.2's plugins see no SVE contiguous load or store: the report
    says so instead of a clean bill."""
    library = _build(tmp_path_factory, "planted_sve", cpu="sve")
    report = sanitize(library, "aarch64", 7, n=1000, cpu="sve")
    assert report.unseen == 2 and not report.clean   # one LD1W, one ST1W
    assert "cannot see" in report.text()


def _hal_cpu(*args, cwd) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hal_cpu", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=300)


@requires("qemu-user")
def test_cli_run_sanitize(planted, tmp_path):
    common = ["run", str(planted), "--arch", "riscv64", "--function",
              "planted", "--workgroup_count", "5,1,1",
              "--binding", f"{N}xf32=1", "--binding", f"{N}xf32=0",
              "--binding", f"{N}xf32", "--sanitize"]
    bad = _hal_cpu(*common, "--constant", "4", cwd=tmp_path)
    assert bad.returncode == 1, bad.stderr
    line = _line("UNINITIALIZED")
    assert re.search(r"uninitialized: binding 2 bytes \[0, 16\) \(read\) by "
                     rf"workgroup \(0, 0, 0\) at pc 0x[0-9a-f]+ "
                     rf"plant_uninitialized\+0x[0-9a-f]+ \(planted_bugs.c:{line}\)",
                     bad.stdout), bad.stdout
    good = _hal_cpu(*common, "--constant", "0", cwd=tmp_path)
    assert good.returncode == 0, good.stderr
    assert "sanitizer: nothing found in planted grid (5, 1, 1)" in good.stdout


@requires("qemu-user")
def test_cli_refuses_unicorn(planted, tmp_path):
    got = _hal_cpu("run", str(planted), "--arch", "riscv64", "--function",
                   "planted", "--binding", "4xf32", "--binding", "4xf32",
                   "--binding", "4xf32", "--constant", "0", "--sanitize",
                   "--engine", "unicorn", cwd=tmp_path)
    assert got.returncode == 1
    assert "not supported on the unicorn engine" in got.stderr
    assert "Traceback" not in got.stderr


INNER_TESTS = '''
import numpy as np
import pytest

@pytest.mark.parametrize("case", [0, 2])
def test_planted(hal_executable, case):
    exe = hal_executable({library!r})
    out = np.zeros(18, np.float32)
    exe.dispatch("planted", (5, 1, 1), [np.ones(18, np.float32), out,
                                        np.zeros(18, np.float32)], [case])
'''


@requires("qemu-user")
def test_pytest_plugin_sanitize_and_counts(planted, tmp_path):
    """--hal-sanitize fails the test whose dispatch has a bug, with the
    report as its message; --hal-count-instructions writes the counts."""
    tests = tmp_path / "test_inner.py"
    tests.write_text(INNER_TESTS.format(library=str(planted)))
    counts = tmp_path / "counts.json"
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q",
         "--rootdir", str(tmp_path), str(tests), "--hal-arch=riscv64",
         "--hal-sanitize", f"--hal-count-instructions={counts}"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    assert "1 failed, 1 passed" in out, out
    assert re.search(r"FindingsError: .*sanitizer: 4 finding\(s\) in planted grid "
                     r"\(5, 1, 1\)\n\s+order: binding 1 bytes \[12, 16\) "
                     r"\(read\) by workgroup \(1, 0, 0\) after workgroup "
                     r"\(0, 0, 0\)", out), out
    data = json.loads(counts.read_text())
    assert len(data) == 2
    for reports in data.values():
        assert len(reports) == 1 and reports[0]["arch"] == "riscv64"
        assert len(reports[0]["workgroups"]) == 5


@requires("qemu-user")
def test_outside_only_checks_bounds_alone(planted):
    """Session(outside_only=True) reports the read past a binding and
    nothing of the shadow (the race goes unreported)."""
    from hal_cpu import Executable, workbench
    with workbench.Session(sanitize=True, outside_only=True) as wb:
        with Executable(planted, arch="aarch64", backend="emulated",
                        engine="qemu", timeout=60) as exe:
            for case in (1, 5):
                exe.dispatch("planted", GRID,
                             [np.ones(N, np.float32), np.zeros(N, np.float32),
                              np.zeros(N, np.float32)], [case], workers=1)
    race, past = wb.reports
    assert race.findings == []
    assert [(f.kind, f.binding, f.start, f.end) for f in past.findings] == [
        ("outside", 0, 4 * N, 4 * N + 4)]


PROGRAMS = Path(__file__).parent / "programs"


@requires("qemu-user")
def test_run_module_sanitize_and_count(tmp_path):
    """run-module: every dispatch of the program reported (a reduction's
    output binding is its buffer's 64 bytes, the padding past its 28
    written bytes is no finding); the counts of both dispatches as JSON."""
    counts = tmp_path / "counts.json"
    got = _hal_cpu("run-module", str(PROGRAMS / "softmax.mlir"), "--arch",
                   "riscv64", "--input", "7x33xf32=1", "--sanitize",
                   f"--count_instructions={counts}", cwd=tmp_path)
    assert got.returncode == 0, got.stderr
    assert got.stdout.count("sanitizer: nothing found in softmax_dispatch_") == 2
    data = json.loads(counts.read_text())
    assert len(data) == 2 and all(d["arch"] == "riscv64" for d in data)
    assert all(d["total"] == sum(w[3] for w in d["workgroups"]) > 0
               for d in data)


@requires("qemu-user")
def test_run_module_reports_an_iree_kernel_reading_past_a_binding(tmp_path):
    """iree-compile's x86_64 layer norm reads the 4 bytes after its 67-float
    gamma and beta bindings (IREE's buffers are padded to 64 bytes): an
    outside finding per workgroup, and the command fails."""
    got = _hal_cpu("run-module", str(PROGRAMS / "layer_norm.mlir"), "--arch",
                   "x86_64", "--input", "5x67xf32=1", "--input", "67xf32=1",
                   "--input", "67xf32=0", "--sanitize", cwd=tmp_path)
    assert got.returncode == 1
    assert re.search(r"outside: binding 2 bytes \[268, 272\) \(read\) by "
                     r"workgroup \(0, 0, 0\)", got.stdout), got.stdout
    assert "the sanitizer found" in got.stderr
    assert "Traceback" not in got.stderr
