"""Native dispatches in a child process: ``hal-cpu run`` reports a kernel
that crashes natively (one line naming the signal and the export), reruns
it emulated to show the fault, and otherwise prints what it printed in
process; :func:`hal_cpu.isolate.run_in_child` carries results and typed
errors back."""

from __future__ import annotations

import faulthandler
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import elfloader
from hal_cpu import Executable
from hal_cpu.errors import ExportNotFoundError, HalCpuError, NativeCrashError, PluginStatusError
from hal_cpu.isolate import run_in_child, shared_array

from conftest import default_sigint

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ROOT / "hal_cpu" / "samples"
HOST = elfloader.arch.host()
EXPORT = "mul_add_dispatch_0_elementwise_5003_f32"
BINDINGS = ["--binding=5003xf32=1.5", "--binding=5003xf32=2",
            "--binding=5003xf32"]


def _le(*words: int) -> bytes:
    return b"".join(w.to_bytes(4, "little") for w in words)


#: host architecture -> machine code that stores to address 0 (SIGSEGV)
#: and an undefined instruction (SIGILL), with what the emulated fault
#: report shows for each.
CRASHES = {
    "x86_64": {
        "SIGSEGV": (bytes.fromhex("c70425000000002a000000"),
                    "mov dword ptr [0], 0x2a"),
        "SIGILL": (bytes.fromhex("0f0b"), "ud2"),
    },
    "aarch64": {
        "SIGSEGV": (_le(0xD2800008, 0xB9000108), "str w8, [x8]"),
        "SIGILL": (_le(0x00000000), "udf"),
    },
}

needs_host = pytest.mark.skipif(
    HOST is None or HOST.name not in CRASHES,
    reason="needs an x86_64 or aarch64 host to run the sample natively")


def hal_cpu(*args):
    return subprocess.run([sys.executable, "-m", "hal_cpu", *map(str, args)],
                          capture_output=True, text=True, cwd=ROOT)


def _patched(tmp_path: Path, where: str, code: bytes, name: str) -> Path:
    """The host's mul_add sample with ``code`` written over the start of
    ``where``: the export (its address comes from the library query, run
    emulated) or the library query itself."""
    source = SAMPLES / f"mul_add_{HOST.name}.so"
    image = elfloader.read_image(source)
    if where == "export":
        with Executable(source, backend="emulated") as exe:
            vaddr = exe.export(EXPORT).address - exe.module.base
    else:
        vaddr = image.exports["iree_hal_executable_library_query"]
    seg = image.segment_at(vaddr, len(code))
    offset = seg.offset + vaddr - seg.vaddr
    data = bytearray(source.read_bytes())
    data[offset:offset + len(code)] = code
    path = tmp_path / name
    path.write_bytes(bytes(data))
    return path


@needs_host
@pytest.mark.parametrize("sig", ["SIGSEGV", "SIGILL"])
def test_native_crash_is_named_and_diagnosed(tmp_path, sig):
    code, instruction = CRASHES[HOST.name][sig]
    so = _patched(tmp_path, "export", code, f"crash_{sig}.so")
    proc = hal_cpu("run", so, "--entry_point=0", "--workgroup_count=2,1,1",
                   *BINDINGS)
    assert proc.returncode == 1, proc.stderr
    assert proc.stdout == ""
    lines = proc.stderr.splitlines()
    assert lines[0] == (f"hal-cpu: error: {so}: the kernel crashed natively "
                        f"({sig}) in export {EXPORT}")
    assert lines[1] == (f"hal-cpu: running the dispatch again emulated "
                        f"({HOST.name}) to find the fault:")
    report = "\n".join(lines[2:])
    assert f"export {EXPORT}, workgroup (0, 0, 0)" in lines[2]
    assert "pc:           0x" in report and EXPORT in report
    assert f"instruction:  {instruction}" in report
    if sig == "SIGSEGV":
        assert "write to unmapped memory" in lines[2]
        assert "unmapped (null pointer)" in report
    else:
        assert "invalid instruction" in lines[2]
    assert "Traceback" not in proc.stderr

    quiet = hal_cpu("run", so, "--entry_point=0", "--workgroup_count=2,1,1",
                    *BINDINGS, "--no-diagnose")
    assert quiet.returncode == 1
    assert quiet.stderr.splitlines() == lines[:1]


@needs_host
def test_crash_while_loading_is_placed(tmp_path):
    code, instruction = CRASHES[HOST.name]["SIGSEGV"]
    so = _patched(tmp_path, "query", code, "crash_query.so")
    proc = hal_cpu("run", so, "--entry_point=0", *BINDINGS)
    assert proc.returncode == 1
    lines = proc.stderr.splitlines()
    assert lines[0] == (f"hal-cpu: error: {so}: the kernel crashed natively "
                        "(SIGSEGV) while loading the executable and its plugins")
    # The emulated load stops on the same store.
    assert lines[2].startswith(f"{so}: ")
    assert "library function iree_hal_executable_library_query" in lines[2]
    assert "write to unmapped memory" in lines[2]
    assert lines[2].endswith("at 0x0000000000000000")
    assert any(line.startswith("  instruction:") for line in lines[3:])
    assert "Traceback" not in proc.stderr


@needs_host
def test_without_isolation_the_crash_ends_the_process(tmp_path):
    """What the child process protects against: in process, the signal ends
    the interpreter and nothing is reported."""
    code, _ = CRASHES[HOST.name]["SIGSEGV"]
    so = _patched(tmp_path, "export", code, "crash.so")
    proc = hal_cpu("run", so, "--entry_point=0", *BINDINGS, "--no-isolate")
    assert proc.returncode == -signal.SIGSEGV
    assert "crashed natively" not in proc.stderr


@needs_host
def test_isolated_output_is_what_in_process_prints(tmp_path):
    sample = SAMPLES / f"mul_add_{HOST.name}.so"
    outs = {}
    for flag in ("--isolate", "--no-isolate"):
        npy = tmp_path / f"c{flag}.npy"
        proc = hal_cpu("run", sample, f"--function={EXPORT}",
                       "--workgroup_count=2,1,1", *BINDINGS,
                       f"--output=2=@{npy}", "--verbose", flag)
        assert proc.returncode == 0, proc.stderr
        outs[flag] = proc
        np.testing.assert_array_equal(np.load(npy),
                                      np.full(5003, 1.5 * 2 + 1.5, np.float32))
    assert outs["--isolate"].stdout == outs["--no-isolate"].stdout
    assert outs["--isolate"].stdout.splitlines()[2].startswith(
        "binding[2]: 5003xf32=4.5 4.5 4.5")
    assert outs["--isolate"].stderr == outs["--no-isolate"].stderr
    assert "native" in outs["--isolate"].stderr
    # Benchmark repetitions run in the child too.
    proc = hal_cpu("run", sample, "--entry_point=0", "--workgroup_count=2,1,1",
                   *BINDINGS, "--print_bindings=none",
                   "--benchmark_repetitions=20")
    assert proc.returncode == 0
    assert "native, workers=" in proc.stdout and "20 repetitions" in proc.stdout


def test_isolated_emulated_run_and_errors_from_the_child(tmp_path):
    """--isolate also runs an emulated dispatch in a child; errors raised
    there reach the user as the same one line."""
    sample = SAMPLES / "mul_add_riscv32.so"
    args = ("run", sample, "--entry_point=0", "--workgroup_count=2,1,1",
            *BINDINGS)
    child, here = hal_cpu(*args, "--isolate"), hal_cpu(*args)
    assert child.returncode == here.returncode == 0
    assert child.stdout == here.stdout
    bad = hal_cpu("run", sample, "--function=nope", "--isolate")
    assert bad.returncode == 1
    assert bad.stderr.strip().splitlines() == [
        f"hal-cpu: error: {sample}: export: no export 'nope'; exports: {EXPORT}"]


# --- the mechanism --------------------------------------------------------------
def test_run_in_child_returns_results_and_shares_arrays():
    shared = shared_array(np.arange(10, dtype=np.float32))
    assert shared.ctypes.data % 4096 == 0

    def work(note):
        note("in the child")
        shared[:] *= 2
        return os.getpid(), {"ok": [1, 2]}

    pid, value = run_in_child(work)
    assert pid != os.getpid() and value == {"ok": [1, 2]}
    np.testing.assert_array_equal(shared, np.arange(10, dtype=np.float32) * 2)
    assert shared_array(np.zeros((0, 3), np.int8)).shape == (0, 3)


def test_run_in_child_raises_typed_errors():
    def missing(note):
        with Executable(SAMPLES / "mul_add_riscv64.so") as exe:
            exe.export("nope")

    with pytest.raises(ExportNotFoundError) as info:
        run_in_child(missing)
    assert (info.value.field, info.value.value) == ("export", "nope")
    assert info.value.name.endswith("mul_add_riscv64.so")

    def status(note):
        PluginStatusError.check(5, "resolve", "p.sos")

    # An error whose constructor takes required keywords does not pickle
    # back as itself: it arrives as a HalCpuError with the same message.
    with pytest.raises(HalCpuError, match=r"^p\.sos: resolve: resolve "
                       r"returned NOT_FOUND \(5\)$"):
        run_in_child(status)


@pytest.mark.parametrize("how,name", [
    (lambda: os.kill(os.getpid(), signal.SIGSEGV), "SIGSEGV"),
    (os.abort, "SIGABRT"),
    (lambda: os._exit(3), "exit status 3"),
])
def test_run_in_child_names_how_the_child_died(how, name):
    def work(note):
        note("in step two")
        faulthandler.disable()      # pytest's, inherited: no dump on stderr
        how()

    with pytest.raises(NativeCrashError) as info:
        run_in_child(work, name="k.so")
    err = info.value
    assert str(err) == f"k.so: the kernel crashed natively ({name}) in step two"
    assert (err.name, err.field, err.value, err.stage) == (
        "k.so", "signal", name, "in step two")
    assert err.signal == (None if name.startswith("exit") else
                          getattr(signal, name))


def test_child_start_up_is_a_fork():
    """A round trip costs a fork (milliseconds), not a new interpreter that
    imports numpy again (hundreds of milliseconds)."""
    run_in_child(lambda note: None)
    start = time.perf_counter()
    for _ in range(10):
        assert run_in_child(lambda note: 7) == 7
    per_call = (time.perf_counter() - start) / 10
    assert per_call < 0.1, per_call


@needs_host
def test_interrupt_ends_the_child_too():
    """Ctrl-C (SIGINT to hal-cpu alone, or to its process group as a
    terminal sends it) ends the run with status 130 and leaves no child."""
    cmd = [sys.executable, "-m", "hal_cpu", "run",
           SAMPLES / f"mul_add_{HOST.name}.so", "--entry_point=0",
           "--workgroup_count=2,1,1", *BINDINGS, "--print_bindings=none",
           "--benchmark_repetitions=100000000"]

    for target in ("hal-cpu", "group"):
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True,
                                start_new_session=True,
                                preexec_fn=default_sigint)
        children: list[str] = []
        deadline = time.monotonic() + 30
        while not children and time.monotonic() < deadline:
            time.sleep(0.1)
            children = subprocess.run(["ps", "--ppid", str(proc.pid), "-o",
                                       "pid="], capture_output=True,
                                      text=True).stdout.split()
        assert children, "the dispatch did not start in a child"
        time.sleep(0.3)
        if target == "group":
            os.killpg(proc.pid, signal.SIGINT)
        else:
            proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
        assert proc.returncode == 130, err
        assert err == "hal-cpu: interrupted\n"
        for pid in children:               # reaped: gone, not a zombie
            assert not Path(f"/proc/{pid}").exists(), target
