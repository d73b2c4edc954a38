"""The pytest fixtures as a plugin author meets them: a plugin with the usual
bugs (tests/plugins/buggy_plugin.c, built with zig and -g) is tested in an
inner pytest session; each bug must fail its own test on every
architecture with the right report, the correct import must pass, and the
session must end by itself with exit status 1."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from fatelf import arches

from conftest import default_sigint

ROOT = Path(__file__).resolve().parent.parent
SOURCE = ROOT / "tests" / "plugins" / "buggy_plugin.c"
ARCHES = list(arches.RUNTIME_ARCHES)
HOST = arches.host_arch()

INNER_TESTS = '''
import numpy as np
import pytest
from fatelf.cstruct import CStruct

SOS = {sos!r}
#: buggy_plugin.c, scale_params_t
PARAMS = CStruct("scale_params_t", [("src", "ptr"), ("dst", "ptr"),
                                    ("n", "size"), ("scale", "f32")])
N = 100


def call(hal_plugin, name, padded=None, src_padded=None):
    plugin = hal_plugin(SOS)
    src = plugin.array(np.arange(N, dtype=np.float32),
                       padded=padded if src_padded is None else src_padded)
    dst = plugin.zeros(N, np.float32, padded=padded)
    status = plugin.call(name, PARAMS, dict(src=src, dst=dst, n=N, scale=2.0))
    return plugin, dst, status


def test_correct(hal_plugin):
    plugin, dst, status = call(hal_plugin, "scale_ok")
    assert status == 0
    np.testing.assert_array_equal(plugin.read(dst), np.arange(N) * 2.0)


def test_overrun_write(hal_plugin):
    # dst ends flush against its guard page: the write of dst[n] faults
    # (src padded: its read of src[n], which comes first, goes unseen).
    call(hal_plugin, "scale_overrun", src_padded=True)


def test_overrun_read_before_write(hal_plugin):
    # Both flush: the read of src[n] faults before dst[n] is written.
    call(hal_plugin, "scale_overrun")


def test_overrun_write_padded(hal_plugin):
    # padded: dst[n] lands in the canary, found when the call returns.
    call(hal_plugin, "scale_overrun", padded=True)


def test_overrun_read(hal_plugin):
    call(hal_plugin, "sum_overrun")


def test_overrun_read_unnoticed_when_padded(hal_plugin):
    # With IREE's 64-byte placement the read lands in the canary bytes.
    assert call(hal_plugin, "sum_overrun", padded=True)[2] == 0


def test_underrun_write(hal_plugin):
    call(hal_plugin, "scale_underrun")


def test_null_write(hal_plugin):
    call(hal_plugin, "null_write")


@pytest.mark.hal_timeout(1)
def test_endless_loop(hal_plugin):
    call(hal_plugin, "spin")


def test_correct_after_the_others(hal_plugin):
    plugin, dst, status = call(hal_plugin, "scale_ok")
    assert status == 0 and np.asarray(dst)[-1] == 2.0 * (N - 1)
'''


@pytest.fixture(scope="module")
def buggy_sos(tmp_path_factory) -> Path:
    """buggy_plugin.c for the six architectures with -g, as a .sos."""
    pytest.importorskip("ziglang")
    from hal_cpu.buildtools import zig as zigbuild
    out = tmp_path_factory.mktemp("buggy") / "buggy.sos"
    out.write_bytes(zigbuild.build_plugin([SOURCE], "all", debug=True))
    return out


def inner_session(tmp_path: Path, sos: Path, *args: str, timeout: float = 300):
    """Run the inner tests; returns (exit status, {test id: (outcome,
    message)}) from its JUnit XML."""
    tests = tmp_path / "test_buggy_plugin.py"
    tests.write_text(INNER_TESTS.format(sos=str(sos)))
    xml = tmp_path / "out.xml"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)
                       if p]))
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q",
         f"--junitxml={xml}", "--rootdir", str(tmp_path), str(tests), *args],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=timeout)
    results = {}
    for case in ET.parse(xml).iter("testcase"):
        failure = case.find("failure")
        if failure is None:
            results[case.get("name")] = ("passed", "")
        else:
            results[case.get("name")] = ("failed", failure.text or "")
    return proc.returncode, results, proc.stdout + proc.stderr


#: Tests of INNER_TESTS, one run each per architecture.
INNER_COUNT = 10
#: The overrun line of a report (unicorn knows the access size, qemu not).
_OVERRUN = (r"  overrun:      {array} \(float32\[100\], 400 bytes\): the "
            r"(4-byte )?access reached element 100, 1 float past the end")


def _emulated_report(lines: list[str], native: bool) -> list[str]:
    """The emulated fault report of a failure: natively, the report of the
    call run again emulated after the native crash (its first line checked
    here: the signal, the import and its symbol)."""
    if not native:
        return lines
    assert lines[0].startswith("NativeCrashError: ") and "SIGSEGV" in lines[0]
    assert lines[1].startswith("ran the call again emulated (")
    return lines[2:]


def _check_bug_reports(results: dict, arch: str, native: bool) -> None:
    digits = 2 * arches.lookup(arch).pointer_size
    file = f"buggy.sos[{arch}]: {arch}: "
    passed = [f"test_correct[{arch}]", f"test_correct_after_the_others[{arch}]",
              f"test_overrun_read_unnoticed_when_padded[{arch}]"]
    for name in passed:
        assert results[name] == ("passed", ""), (name, results[name])

    # dst flush against its guard page: the write of dst[n] faults
    outcome, text = results[f"test_overrun_write[{arch}]"]
    assert outcome == "failed"
    lines = text.splitlines()
    if native:
        assert "in import scale_overrun (scale_overrun)" in lines[0]
    lines = _emulated_report(lines, native)
    assert lines[0].startswith("BindingOverrunError: ") and file in lines[0]
    assert "import scale_overrun: write to " in lines[0]
    assert "scale_range+0x" in lines[1]
    assert "(dst at offset 400 of 400 bytes (1 past the end, guard page))" in text
    overrun = next(l for l in lines if l.startswith("  overrun:"))
    assert re.fullmatch(_OVERRUN.format(array="dst"), overrun), overrun
    source = next(l for l in lines if l.startswith("  source:"))
    assert "buggy_plugin.c:30" in source or "no line information" in source
    assert "Traceback" not in text and "elfloader/backend" not in text

    # both flush: the read of src[n] comes first
    outcome, text = results[f"test_overrun_read_before_write[{arch}]"]
    assert outcome == "failed"
    lines = _emulated_report(text.splitlines(), native)
    assert lines[0].startswith("BindingOverrunError: ")
    assert "import scale_overrun: read from unreadable memory" in lines[0]
    assert "(src at offset 400 of 400 bytes (1 past the end, guard page))" in text

    # padded: the write lands in the canary, found after the call
    outcome, text = results[f"test_overrun_write_padded[{arch}]"]
    assert outcome == "failed"
    first = text.splitlines()[0]
    assert first.startswith("BindingOverrunError: ") and file in first
    assert ("import scale_overrun wrote outside dst (float32[100], 400 bytes "
            "at 0x") in first
    assert ("4 bytes changed from offset 400 (1 past the end, element 100 of "
            "100; 1 float past the end); seen after the call") in first
    assert "Traceback" not in text and "elfloader/backend" not in text

    outcome, text = results[f"test_underrun_write[{arch}]"]
    assert outcome == "failed"
    first = text.splitlines()[0]
    assert first.startswith("BindingUnderrunError: ") and file in first
    assert "import scale_underrun wrote outside dst" in first
    assert ("4 bytes changed from offset -4 (4 bytes before the start, element "
            "-1; 1 float before the start)") in first

    outcome, text = results[f"test_overrun_read[{arch}]"]
    assert outcome == "failed"
    lines = text.splitlines()
    if native:
        assert "in import sum_overrun (sum_overrun)" in lines[0]
    lines = _emulated_report(lines, native)
    assert lines[0].startswith("BindingOverrunError: ")
    assert file + "import sum_overrun: read from unreadable memory" in lines[0]
    assert lines[1].startswith("  pc:           0x") and "sum_range+0x" in lines[1]
    assert "(src at offset 400 of 400 bytes (1 past the end, guard page))" in text
    overrun = next(l for l in lines if l.startswith("  overrun:"))
    assert re.fullmatch(_OVERRUN.format(array="src"), overrun), overrun
    source = next(l for l in lines if l.startswith("  source:"))
    assert "buggy_plugin.c:37" in source

    outcome, text = results[f"test_null_write[{arch}]"]
    assert outcome == "failed"
    lines = text.splitlines()
    if native:
        assert lines[0].startswith("NativeCrashError: ") and f"buggy.sos[{arch}]" in lines[0]
        assert lines[0].endswith(": the plugin crashed natively (SIGSEGV) in "
                                 "import null_write (null_write)")
    lines = _emulated_report(lines, native)
    assert lines[0].startswith("EmulationError: ") and file in lines[0]
    assert "import null_write: write to unmapped memory" in lines[0]
    assert lines[0].endswith(f"at 0x{0:0{digits}x}")
    # a static function: named from .symtab, with its source line
    assert "scale_range+0x" in lines[1]
    assert "(unmapped (null pointer))" in text
    source = next(l for l in lines if l.startswith("  source:"))
    assert "buggy_plugin.c:30" in source

    outcome, text = results[f"test_endless_loop[{arch}]"]
    assert outcome == "failed"
    lines = text.splitlines()
    assert lines[0].startswith("CallTimeoutError: ") and "spin" in lines[0]
    if native:
        assert "time limit of 1 s" in lines[0] and "in import spin (spin)" in lines[0]
        assert lines[0].count("in import spin") == 1
    else:
        assert file + "import spin: still running at the time limit of 1 s" in lines[0]
        assert "spin+0x" in lines[1]
        assert "buggy_plugin.c:" in text


def test_every_bug_fails_its_own_test_on_six_architectures(tmp_path, buggy_sos):
    status, results, output = inner_session(tmp_path, buggy_sos)
    assert status == 1, output
    assert len(results) == INNER_COUNT * len(ARCHES), output
    for arch in ARCHES:
        _check_bug_reports(results, arch, native=False)


@pytest.mark.skipif(HOST is None, reason="no native architecture")
def test_every_bug_fails_its_own_test_natively(tmp_path, buggy_sos):
    status, results, output = inner_session(tmp_path, buggy_sos,
                                            "--hal-backend=native",
                                            "--hal-arch=host")
    assert status == 1, output
    assert len(results) == INNER_COUNT, output
    _check_bug_reports(results, HOST, native=True)
    assert "Fatal Python error" not in output


def test_padded_arrays_option_lets_the_read_through(tmp_path, buggy_sos):
    """--hal-padded-arrays: IREE's 64-byte placement, where a read of one
    element past the end lands in the canary bytes and goes unseen."""
    status, results, output = inner_session(
        tmp_path, buggy_sos, "--hal-padded-arrays", "--hal-arch=riscv32",
        "-k", "test_overrun_read or test_overrun_write_padded")
    assert status == 1, output
    assert results["test_overrun_read[riscv32]"] == ("passed", ""), output
    outcome, text = results["test_overrun_write_padded[riscv32]"]
    assert outcome == "failed" and "seen after the call" in text


def test_strict_bounds_option_names_the_default(tmp_path, buggy_sos):
    status, results, output = inner_session(
        tmp_path, buggy_sos, "--hal-strict-bounds", "--hal-arch=riscv32",
        "-k", "test_overrun_read")
    assert status == 1, output
    outcome, text = results["test_overrun_read[riscv32]"]
    assert outcome == "failed" and text.startswith("BindingOverrunError: ")
    assert results["test_overrun_read_unnoticed_when_padded[riscv32]"] == (
        "passed", "")


def test_ctrl_c_stops_an_emulated_call_at_once(tmp_path, buggy_sos):
    """An endless loop with no time limit: SIGINT ends the pytest session
    promptly (the emulator is stopped), with pytest's interrupted status."""
    tests = tmp_path / "test_spin.py"
    tests.write_text(INNER_TESTS.format(sos=str(buggy_sos)) + textwrap.dedent('''
        def test_endless_loop_without_a_limit(hal_plugin):
            call(hal_plugin, "spin")
        '''))
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q",
         "--rootdir", str(tmp_path), str(tests), "-k", "without_a_limit",
         "--hal-arch=aarch64", "--hal-timeout=0"],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True, preexec_fn=default_sigint)
    try:
        time.sleep(4)           # loaded and looping by now
        assert proc.poll() is None, proc.stdout.read()
        start = time.monotonic()
        proc.send_signal(signal.SIGINT)
        output, _ = proc.communicate(timeout=30)
        assert time.monotonic() - start < 10
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 2, output
    assert "KeyboardInterrupt" in output


def test_fixtures_are_listed_with_docstrings(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    (tmp_path / "test_nothing.py").write_text("def test_x(): pass\n")
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--fixtures",
         "--rootdir", str(tmp_path), str(tmp_path)], cwd=tmp_path, env=env,
        capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    text = proc.stdout
    for name in ("hal_arch", "hal_cpu", "hal_vlen", "hal_backend", "hal_engine",
                 "hal_timeout", "hal_plugin", "hal_executable", "hal_target"):
        assert f"\n{name}" in text, name
        block = text.split(f"\n{name}", 1)[1].split("\n\n", 1)[0]
        assert "no docstring available" not in block, name
        assert len(block.splitlines()) >= 2, name


def test_fixtures_work_under_xdist(tmp_path, buggy_sos):
    pytest.importorskip("xdist")
    status, results, output = inner_session(tmp_path, buggy_sos, "-n", "2",
                                            "--hal-arch=riscv64,x86_32")
    assert status == 1, output
    assert len(results) == 2 * INNER_COUNT, output
    for arch in ("riscv64", "x86_32"):
        _check_bug_reports(results, arch, native=False)
