"""The pytest plugin's options as a new user meets them, each in an inner
pytest session: a mistake is one usage error line before collection;
``--hal-cpu`` profiles apply to their own architecture while the others run
at their defaults; ``--hal-engine`` picks the engine; a native crash
(``--hal-backend=native``) is run again emulated and fails its test with
the emulated report."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from elfloader.backend.emulated import choice
from fatelf import arches

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ROOT / "hal_cpu" / "samples"
STANDALONE = SAMPLES / "standalone.sos"
HOST = arches.host_arch()
ON_CI = os.environ.get("CI", "").lower() == "true"

#: Exit status of a pytest usage error.
USAGE_ERROR = 4


def pytest_in(tmp_path: Path, tests: str, *args: str, env: dict | None = None,
              timeout: float = 300) -> subprocess.CompletedProcess:
    """Run pytest on ``tests`` (the text of a test module, written to
    ``tmp_path``) with ``args``; the module leaves ``collected.txt`` when
    pytest imports it."""
    marker = tmp_path / "collected.txt"
    (tmp_path / "test_inner.py").write_text(
        f"open({str(marker)!r}, 'w').close()\n" + tests)
    # The inner session's engine is the test's to choose: not $PKR_ENGINE
    # of the outer run (a whole suite may run on one engine).
    environ = {k: v for k, v in os.environ.items() if k != "PKR_ENGINE"}
    environ = dict(environ, PYTHONPATH=os.pathsep.join(
        [str(ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)
                       if p]), **(env or {}))
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q",
         "--rootdir", str(tmp_path), str(tmp_path / "test_inner.py"), *args],
        cwd=tmp_path, env=environ, capture_output=True, text=True,
        timeout=timeout)


RECORD = '''
import json

def test_target(hal_arch, hal_cpu, hal_vlen, hal_engine, request):
    with open({out!r}, "a") as f:
        f.write(json.dumps([request.node.callspec.id, hal_arch, hal_cpu,
                            hal_vlen, hal_engine]) + "\\n")
'''

#: (arguments, what the one error line says)
BAD_OPTIONS = [
    (["--hal-cpu=nosuch"], "--hal-cpu: unknown CPU profile 'nosuch'; known: "),
    (["--hal-cpu=sve:vl=100"],
     "--hal-cpu: sve cannot run at a vector length of 100 bits; its lengths: "
     "128, 256, 512, 1024, 2048"),
    (["--hal-cpu=rv64gcv:vlen=128,4096"],
     "--hal-cpu: rv64gcv cannot run at a vector length of 4096 bits; its "
     "lengths: 128, 256, 512, 1024"),
    (["--hal-cpu=x86-64-v3:vlen=256"],
     "--hal-cpu: x86-64-v3 has no scalable vectors: a vector length (in "
     "'x86-64-v3:vlen=256') does not apply"),
    (["--hal-cpu=sve:vlen=wide"],
     "--hal-cpu: 'sve:vlen=wide' is not [ARCH/]PROFILE[:vlen=N,M,...]"),
    (["--hal-cpu=mips/sve"], "--hal-cpu: unsupported architecture 'mips'"),
    (["--hal-arch=riscv32", "--hal-cpu=sve"],
     "--hal-cpu: sve is a CPU profile of aarch64, which --hal-arch=riscv32 "
     "does not select"),
    (["--hal-arch=sparc"], "--hal-arch: unknown architecture 'sparc'"),
    (["--hal-arch=,"], "--hal-arch=',' names no architecture"),
    (["--hal-engine=unicorn", "--hal-cpu=rv64gcv:vlen=512"],
     "--hal-engine=unicorn --hal-cpu=rv64gcv: unicorn cannot run CPU profile "
     "rv64gcv"),
    (["--hal-engine=turbo"],
     "argument --hal-engine: invalid choice: 'turbo'"),
    (["--hal-timeout=-1"],
     "--hal-timeout=-1: a time limit is a number of seconds, 0 or more"),
    (["--hal-padded-arrays", "--hal-strict-bounds"],
     "--hal-padded-arrays and --hal-strict-bounds contradict each other"),
]
if HOST is not None:
    BAD_OPTIONS.append(
        (["--hal-backend=native", f"--hal-cpu={arches.DEFAULT_PROFILES[HOST]}"],
         f"--hal-cpu={arches.DEFAULT_PROFILES[HOST]}: with --hal-backend=native, "
         f"{HOST} code runs on this machine's own CPU, which a CPU profile "
         "cannot change"))


@pytest.mark.parametrize("args,expected", BAD_OPTIONS,
                         ids=[" ".join(a) for a, _ in BAD_OPTIONS])
def test_a_bad_option_is_one_usage_error_before_collection(tmp_path, args,
                                                           expected):
    proc = pytest_in(tmp_path, RECORD.format(out=str(tmp_path / "ran.jsonl")),
                     *args, timeout=120)
    assert proc.returncode == USAGE_ERROR, proc.stdout + proc.stderr
    assert not (tmp_path / "collected.txt").exists(), "collection ran"
    assert "Traceback" not in proc.stderr + proc.stdout
    assert "INTERNALERROR" not in proc.stderr + proc.stdout
    errors = [l for l in proc.stderr.splitlines() if l.startswith("ERROR:")]
    assert len(errors) == 1, proc.stderr
    assert expected in proc.stderr, proc.stderr
    if not expected.startswith("argument"):
        # this plugin's own errors: the whole message on the one line
        assert proc.stderr.strip().splitlines() == [errors[0]], proc.stderr
        assert errors[0].startswith("ERROR: " + expected.split(" ", 1)[0])


@pytest.mark.requires("qemu-user")  # an SVE/RVV profile runs on qemu only
def test_good_options_pass_the_check(tmp_path):
    out = tmp_path / "ran.jsonl"
    proc = pytest_in(tmp_path, RECORD.format(out=str(out)),
                     "--hal-arch=aarch64", "--hal-cpu=aarch64/sve:vl=128,2048",
                     "--hal-cpu=armv8-a", "--hal-strict-bounds",
                     "--hal-timeout=0", timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = [json.loads(l) for l in out.read_text().splitlines()]
    assert [r[0] for r in rows] == ["aarch64-sve-vlen128", "aarch64-sve-vlen2048",
                                    "aarch64-armv8-a"]


@pytest.mark.requires("qemu-user")  # an SVE/RVV profile runs on qemu only
def test_a_profile_keeps_the_other_architectures(tmp_path):
    """--hal-arch=all --hal-cpu=rv64gcv:vlen=128,256: riscv64 at both
    vector lengths, the other five architectures at their defaults."""
    out = tmp_path / "ran.jsonl"
    tests = RECORD.format(out=str(out))
    listed = pytest_in(tmp_path, tests, "--co", "--hal-arch=all",
                       "--hal-cpu=rv64gcv:vlen=128,256", timeout=120)
    assert listed.returncode == 0, listed.stdout + listed.stderr
    expected = ["x86_64", "aarch64", "riscv64-rv64gcv-vlen128",
                "riscv64-rv64gcv-vlen256", "x86_32", "arm32", "riscv32"]
    ids = [l.split("[", 1)[1].rstrip("]") for l in listed.stdout.splitlines()
           if l.startswith("test_inner.py::")]
    assert ids == expected, listed.stdout

    proc = pytest_in(tmp_path, tests, "--hal-arch=all",
                     "--hal-cpu=rv64gcv:vlen=128,256", timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = {r[0]: r[1:] for r in map(json.loads, out.read_text().splitlines())}
    assert list(rows) == expected
    for arch in arches.RUNTIME_ARCHES:
        if arch != "riscv64":
            assert rows[arch] == [arch, None, None, "auto"]
    assert rows["riscv64-rv64gcv-vlen128"] == ["riscv64", "rv64gcv", 128, "auto"]
    assert rows["riscv64-rv64gcv-vlen256"] == ["riscv64", "rv64gcv", 256, "auto"]


ENGINE_TESTS = '''
def test_engine(hal_plugin, hal_engine):
    plugin = hal_plugin({sos!r})
    assert hal_engine == {engine!r}
    described = plugin.backend.describe()
    assert described.startswith({engine!r} + " ("), described
'''


@pytest.mark.parametrize("engine", ["unicorn", "qemu"])
def test_engine_option_picks_the_engine(tmp_path, engine):
    if engine == "qemu":
        missing = [choice.QEMU_PROGRAMS[a] for a in ("aarch64", "riscv32")
                   if choice.qemu_program(a) is None]
        if missing:
            if ON_CI:
                pytest.fail(f"{', '.join(missing)} missing on CI")
            pytest.skip(f"{', '.join(missing)} not installed")
    # --hal-engine wins over $PKR_ENGINE (which picks for auto)
    other = "qemu" if engine == "unicorn" else "unicorn"
    proc = pytest_in(tmp_path, ENGINE_TESTS.format(sos=str(STANDALONE),
                                                   engine=engine),
                     f"--hal-engine={engine}", "--hal-arch=aarch64,riscv32",
                     env={"PKR_ENGINE": other})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "2 passed" in proc.stdout


def test_auto_engine_follows_pkr_engine(tmp_path):
    tests = ENGINE_TESTS.format(sos=str(STANDALONE), engine="auto")
    tests = tests.replace("""startswith('auto' + " (")""",
                          """startswith("unicorn (")""")
    proc = pytest_in(tmp_path, tests, "--hal-arch=riscv32",
                     env={"PKR_ENGINE": "unicorn"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "1 passed" in proc.stdout


# --- a native crash, run again emulated ----------------------------------------

DISPATCH_TESTS = '''
import numpy as np

def test_dispatch(hal_executable):
    exe = hal_executable({so!r})
    a = np.full(5003, 1.5, np.float32)
    b = np.full(5003, 2.0, np.float32)
    exe.dispatch({export!r}, (2, 1, 1), [a, b, np.zeros(5003, np.float32)])
'''


def test_native_dispatch_crash_is_run_again_emulated(tmp_path):
    """hal_executable with --hal-backend=native: a kernel that crashes in
    the child process fails its test with the crash, then the report of
    the dispatch run again emulated (instruction, null pointer)."""
    from test_isolate import CRASHES, EXPORT, _patched
    if HOST not in CRASHES:
        pytest.skip("needs an x86_64 or aarch64 host to run the sample natively")
    code, instruction = CRASHES[HOST]["SIGSEGV"]
    so = _patched(tmp_path, "export", code, "crash.so")
    xml = tmp_path / "out.xml"
    proc = pytest_in(tmp_path, DISPATCH_TESTS.format(so=str(so), export=EXPORT),
                     "--hal-backend=native", "--hal-arch=host",
                     f"--junitxml={xml}")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    import xml.etree.ElementTree as ET
    failure = next(ET.parse(xml).iter("failure")).text
    lines = failure.splitlines()
    assert lines[0] == (f"NativeCrashError: {so}: the kernel crashed natively "
                        f"(SIGSEGV) in export {EXPORT}")
    assert lines[1] == f"ran the dispatch again emulated ({HOST}) to find the fault:"
    assert lines[2].startswith("EmulationError: ")
    assert "write to unmapped memory" in lines[2]
    assert f"export {EXPORT}, workgroup (0, 0, 0)" in lines[2]
    assert f"  instruction:  {instruction}" in lines
    assert "unmapped (null pointer)" in failure
    assert any(l.startswith("  source:") for l in lines)
    assert "Traceback" not in failure
