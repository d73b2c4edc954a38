"""Compiled modules (``.vmfb``) as programs: ``hal-cpu run-module``,
``check-module`` and ``benchmark-module`` take them as IREE's tools do, and
:func:`hal_cpu.programs.vm.load_program` loads once and calls many.

The references are IREE's own tools (``iree-run-module`` output byte for
byte), the MLIR path's output for the custom-module samples, and numpy."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from fatelf import arches
from hal_cpu.cli import main
from hal_cpu.programs import compile_program
from hal_cpu.programs.vm import LinkError, VmError, load_program

from conftest import PREBUILT, ROOT
from program_specs import ALL_PROGRAMS

PROGRAMS = ROOT / "tests" / "programs"
CHECKS = sorted((PROGRAMS / "check").glob("*.mlir"))
MODULES = PROGRAMS / "host_modules"
CUSTOM = MODULES / "custom_string.py"
MLP = ROOT / "bench" / "programs" / "mlp.mlir"
IREE_RUN_MODULE = Path(sys.executable).parent / "iree-run-module"
HOST = arches.host_arch()


def cli(capsys, *args):
    rc = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return rc, out, err


def vmfb(path, arch, cache, *flags):
    return compile_program(path, arch, cache, extra_flags=list(flags)).vmfb


def iree_run_module(module, function, flags) -> str:
    proc = subprocess.run([str(IREE_RUN_MODULE), "--device=local-sync",
                           f"--module={module}", f"--function={function}", *flags],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


# ---------------------------------------------------------------------------
# check-module on .vmfb

@pytest.mark.parametrize("arch", ["x86_64", "aarch64", "riscv64", "riscv32"])
def test_check_programs_pass_from_vmfb(compile_cache, capsys, arch):
    """The check-style programs, compiled to .vmfb, pass through
    ``check-module x.vmfb`` (natively on the host, emulated elsewhere) as
    they pass from MLIR."""
    for path in CHECKS:
        if path.name == "failing.mlir":
            continue
        module = vmfb(path, arch, compile_cache)
        rc, out, err = cli(capsys, "check-module", module)
        lines = out.splitlines()
        assert rc == 0, f"{path.name}: {out}{err}"
        assert lines[-1].endswith(f"functions passed ({arch})"), out
        n = int(lines[-1].split()[0])
        assert n >= 2 and lines[-1].startswith(f"{n} of {n} ")
        assert all(ln.startswith("PASS @") for ln in lines[:-1]), out


def test_check_failures_from_vmfb_read_as_from_mlir(compile_cache, capsys):
    src = PROGRAMS / "check" / "failing.mlir"
    rc, want, _ = cli(capsys, "check-module", src, f"--cache_dir={compile_cache}")
    assert rc == 1
    rc, got, _ = cli(capsys, "check-module", f"--module={vmfb(src, HOST, compile_cache)}")
    assert rc == 1
    assert got == want


# ---------------------------------------------------------------------------
# run-module on .vmfb: as iree-run-module prints

@pytest.mark.skipif(HOST != "x86_64", reason="x86_64 host only")
@pytest.mark.parametrize("name", ["matmul", "softmax", "int_ops", "mm_rowsum"])
def test_run_module_prints_what_iree_prints(compile_cache, capsys, tmp_path, name):
    spec = ALL_PROGRAMS[name]
    inputs = spec.make_inputs(np.random.default_rng(3))
    flags = []
    for i, x in enumerate(inputs):
        if isinstance(x, np.ndarray):
            np.save(tmp_path / f"in{i}.npy", x)
            flags.append(f"--input=@{tmp_path / f'in{i}.npy'}")
        else:
            flags.append(f"--input={x}")
    module = vmfb(spec.path, HOST, compile_cache)
    rc, ours, err = cli(capsys, "run-module", f"--module={module}",
                        f"--function={spec.function}", "--device=local-task", *flags)
    assert rc == 0, err
    assert ours == iree_run_module(module, spec.function, flags)


@pytest.mark.parametrize("arch", ["aarch64", "riscv64", "riscv32"])
def test_cross_compiled_vmfb_runs_emulated_without_arch(compile_cache, capsys,
                                                       tmp_path, arch):
    """The architecture comes from the module: a .vmfb for another CPU runs
    emulated on this one without --arch."""
    spec = ALL_PROGRAMS["matmul"]
    a, b = spec.make_inputs(np.random.default_rng(4))
    np.save(tmp_path / "a.npy", a)
    np.save(tmp_path / "b.npy", b)
    module = vmfb(spec.path, arch, compile_cache)
    rc, out, err = cli(capsys, "run-module", module, "--function=matmul",
                       f"--input=@{tmp_path / 'a.npy'}", f"--input=@{tmp_path / 'b.npy'}",
                       f"--output=@{tmp_path / 'r.npy'}")
    assert rc == 0, err
    np.testing.assert_allclose(np.load(tmp_path / "r.npy"), a @ b, rtol=1e-4, atol=1e-4)


def test_several_modules_last_one_runs(compile_cache, capsys):
    """``--module`` repeats as in IREE's tools; the last module's function
    runs, and an MLIR file among them is compiled first."""
    first = vmfb(ALL_PROGRAMS["matmul"].path, HOST, compile_cache)
    rc, out, err = cli(capsys, "run-module", f"--module={first}",
                       f"--module={MLP}", f"--cache_dir={compile_cache}",
                       "--function=predict", "--input=4x16xf32=1")
    assert rc == 0, err
    assert out.startswith("EXEC @predict\nresult[0]: hal.buffer_view\n4x8xf32=[0.125 ")


# ---------------------------------------------------------------------------
# host modules and plugins from .vmfb

def test_custom_module_samples_from_vmfb(compile_cache, capsys):
    """The custom-module samples print from .vmfb what they print from MLIR;
    ``--module=x.py`` still means a host module."""
    cases = [("basic.mlir", "main", f"{CUSTOM}", ()),
             ("basic.mlir", "main", f"{CUSTOM}@create_custom_module?debug=1",
              ("--iree-execution-model=host-only",)),
             ("static.mlir", "main", f"{CUSTOM}", ()),
             ("dynamic.mlir", "main", f"{CUSTOM}@create_custom_module?prefix=%3E%20", ())]
    for name, function, spec, flags in cases:
        src = MODULES / name
        rc, want, err = cli(capsys, "run-module", src, f"--cache_dir={compile_cache}",
                            f"--function={function}", f"--module={spec}",
                            *[f"--compile_flag={f}" for f in flags])
        assert rc == 0, err
        module = vmfb(src, HOST, compile_cache, *flags)
        rc, got, err = cli(capsys, "run-module", f"--module={module}",
                           f"--function={function}", f"--host_module={spec}")
        assert rc == 0, err
        assert got == want, name
        rc, got2, err = cli(capsys, "run-module", f"--module={spec}",
                            f"--module={module}", f"--function={function}")
        assert rc == 0, err
        assert got2 == want


def test_missing_host_module_is_one_line_naming_the_import(compile_cache, capsys):
    module = vmfb(MODULES / "basic.mlir", HOST, compile_cache)
    rc, out, err = cli(capsys, "run-module", module, "--function=main")
    assert rc == 1 and out == "" and len(err.splitlines()) == 1
    assert "custom" in err and module.name in err


@pytest.mark.parametrize("arch", ["x86_64", "aarch64", "riscv32"])
def test_plugin_sample_from_vmfb(compile_cache, capsys, tmp_path, arch):
    """IREE's custom_dispatch plugin sample (our copy) from .vmfb, the
    simple_mul import resolved by the prebuilt plugin bundle."""
    src = ROOT / "sample_plugins" / "standalone_example.mlir"
    module = vmfb(src, arch, compile_cache)
    flags = ["--input=70xf32=1.5", "--input=70xf32=-3",
             f"--executable_plugin={PREBUILT / 'standalone.sos'}"]
    rc, ours, err = cli(capsys, "run-module", module, "--function=mixed_invocation",
                        *flags)
    assert rc == 0, err
    assert "70xf32=-7.5 -7.5" in ours
    if arch == HOST == "x86_64":
        assert ours == iree_run_module(module, "mixed_invocation", flags)


# ---------------------------------------------------------------------------
# the Python API: load once, call many

def test_load_once_call_many_threads(compile_cache):
    module = vmfb(MLP, HOST, compile_cache)
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal((4, 16)).astype(np.float32) for _ in range(8)]
    with load_program(module) as prog:
        predict = prog.function("predict")
        want = [predict(x)[0] for x in xs]
        for x, w in zip(xs, want):
            e = np.exp(np.maximum(x @ np.full((16, 8), 0.05, np.float32) + 0.1, 0.1))
            np.testing.assert_allclose(w, e / e.sum(1, keepdims=True), rtol=1e-5)
        errors = []

        def worker(k):
            try:
                for i in range(50):
                    j = (i + k) % len(xs)
                    np.testing.assert_array_equal(predict(xs[j])[0], want[j])
            except Exception as e:  # noqa: BLE001 - reported below
                errors.append(e)
        threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors, errors
        assert list(prog.functions) == ["predict"]
        with pytest.raises(VmError, match="no public function @nope"):
            prog.function("nope")
        with pytest.raises(TypeError, match="takes 1 arguments"):
            predict()
    with pytest.raises(VmError, match="closed"):
        predict(xs[0])


def test_emulated_program_matches_native(compile_cache):
    spec = ALL_PROGRAMS["softmax"]
    (x,) = spec.make_inputs(np.random.default_rng(1))
    with load_program(vmfb(spec.path, "aarch64", compile_cache)) as prog:
        assert prog.arch == "aarch64"
        (got,) = prog(spec.function, x)
    np.testing.assert_allclose(got, spec.numpy_reference([x])[0], rtol=1e-5, atol=1e-6)


def test_link_errors_are_typed(compile_cache):
    module = vmfb(MODULES / "basic.mlir", HOST, compile_cache)
    with pytest.raises(LinkError, match="custom"):
        load_program(module)


# ---------------------------------------------------------------------------
# benchmark-module

def test_benchmark_module_prints_per_call_times(compile_cache, capsys):
    module = vmfb(MLP, HOST, compile_cache)
    rc, out, err = cli(capsys, "benchmark-module", f"--module={module}",
                       "--function=predict", "--input=4x16xf32=1",
                       "--benchmark_repetitions=20", "--device=local-sync")
    assert rc == 0, err
    lines = out.splitlines()
    assert lines[0].startswith("BM_predict (") and lines[0].endswith(": 20 calls")
    assert "min " in lines[1] and "median " in lines[1] and "mean " in lines[1]
    rc, out, err = cli(capsys, "benchmark-module", f"--module={module}",
                       "--function=predict", "--input=4x16xf32=1",
                       "--benchmark_min_time=40x")
    assert rc == 0, err
    assert out.splitlines()[0].endswith(": 40 calls")
    rc, out, err = cli(capsys, "benchmark-module", f"--module={module}",
                       "--function=predict", "--input=4x16xf32=1",
                       "--device=cuda")
    assert rc == 1 and "--device" in err


# ---------------------------------------------------------------------------
# time limits

LIMITS = PROGRAMS / "limits.mlir"


def _hal_cpu(*args, timeout=60):
    return subprocess.run([sys.executable, "-m", "hal_cpu", *map(str, args)],
                          capture_output=True, text=True, timeout=timeout)


def test_timeout_stops_a_host_loop(compile_cache):
    """--timeout (and load_program(timeout=)) stops host code that never
    ends at its next backward branch: one line naming the function."""
    import time as _time
    module = vmfb(LIMITS, HOST, compile_cache)
    start = _time.monotonic()
    proc = _hal_cpu("run-module", module, "--function=spin", "--input=5", "--timeout=1")
    took = _time.monotonic() - start
    assert proc.returncode == 1 and took < 1 + 2 + 1.5, (took, proc.stderr)
    assert proc.stderr.count("\n") == 1
    assert "the time limit of 1 s passed in @spin" in proc.stderr
    from hal_cpu.programs.vm.program import ProgramTimeoutError
    with load_program(module, timeout=0.5) as prog:
        assert prog("spin", -1) == [np.int32(-1)]
        with pytest.raises(ProgramTimeoutError, match="@spin") as info:
            prog("spin", 5)
        assert info.value.seconds == 0.5
        prog.timeout = None
        assert prog("spin", -1) == [np.int32(-1)]


def test_timeout_ends_a_host_module_that_never_returns(compile_cache, tmp_path):
    """A Python host module cannot be stopped from inside: the command still
    ends within the limit plus its grace, and says so."""
    import time as _time
    stuck = tmp_path / "stuck.py"
    stuck.write_text(
        "from hal_cpu.programs import HostModule\n"
        "class S:\n"
        "    def __init__(self, b): self.b = b\n"
        "def create_module(version, params):\n"
        "    def create(b):\n"
        "        while True:\n"
        "            pass\n"
        "    return HostModule('custom', {'string.create': create, "
        "'string.print': print, 'string.length': len},\n"
        "                      types={'custom.string': S})\n")
    module = vmfb(MODULES / "basic.mlir", HOST, compile_cache)
    start = _time.monotonic()
    proc = _hal_cpu("run-module", module, f"--host_module={stuck}", "--timeout=1")
    took = _time.monotonic() - start
    assert proc.returncode == 1 and took < 1 + 2 + 1.5, (took, proc.stderr)
    assert proc.stdout == "EXEC @main\n"
    assert "could not be stopped from inside" in proc.stderr
    assert len(proc.stderr.splitlines()) == 1


# ---------------------------------------------------------------------------
# plan of a .vmfb: a record-only call, or with --trace the steps of a run

def test_plan_of_vmfb_records_the_steps_without_running(compile_cache, capsys):
    """Without --trace, plan of a .vmfb prints the record-only plan that
    plan of its MLIR prints (same steps, buffers and results)."""
    module = vmfb(ALL_PROGRAMS["mm_rowsum"].path, "riscv64", compile_cache)
    args = ["--input=37x53xf32=1", "--input=53x29xf32=2"]
    rc, out, err = cli(capsys, "plan", module, *args)
    assert rc == 0, err
    rc, src, err = cli(capsys, "plan", ALL_PROGRAMS["mm_rowsum"].path, "--arch=riscv64",
                       f"--cache_dir={compile_cache}", *args)
    assert rc == 0, err
    assert out.startswith(f"program:   {module}\nfunction:  @mm_rowsum\n")

    def steps(text):
        return [ln for ln in text.splitlines()
                if ln.startswith(("step ", "  export:", "  workgroups:", "  binding ",
                                  "buffer ", "result "))]
    assert steps(out) == steps(src) and len([s for s in steps(out)
                                             if s.startswith("step ")]) == 2


def test_plan_of_vmfb_lists_the_dispatches_and_their_run_lines(compile_cache, capsys,
                                                              tmp_path):
    import shlex
    module = vmfb(ALL_PROGRAMS["matmul"].path, "riscv64", compile_cache)
    rc, out, err = cli(capsys, "plan", module, "--input=37x53xf32=1",
                       "--input=53x29xf32=2", "--trace")
    assert rc == 0, err
    lines = out.splitlines()
    assert lines[0].startswith("@matmul (riscv64): 1 dispatches")
    assert "binding 0:   input 0 [0, 7844) (7844 bytes)" in out
    (run,) = [ln.split("run:", 1)[1].strip() for ln in lines
              if ln.strip().startswith("run:")]
    argv = shlex.split(run)[1:] + [f"--output=2=@{tmp_path / 'c.npy'}",
                                   "--print_bindings=none"]
    rc, out, err = cli(capsys, *argv)
    assert rc == 0, err
    got = np.load(tmp_path / "c.npy").view(np.float32).reshape(37, 29)
    np.testing.assert_allclose(got, np.full((37, 29), 106, np.float32))


def test_program_text_that_is_not_utf8_is_one_line(capsys, tmp_path):
    bad = tmp_path / "bad.mlir"
    bad.write_bytes(b"func.func @f(%a: i32) -> i32 {\n  // caf\xe9\n  return %a : i32\n}\n")
    for verb in ("run-module", "check-module", "plan", "benchmark-module"):
        rc, out, err = cli(capsys, verb, bad,
                           *(["--input=3"] if verb != "check-module" else []))
        assert rc == 1 and out == "", (verb, out)
        assert err.strip() == (f"hal-cpu: error: {bad}: program: byte 39 (line 2) is "
                               "not UTF-8 text (bytes e9); MLIR programs are UTF-8"), verb


def test_host_module_that_is_not_a_module_names_the_spec(compile_cache, capsys, tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("class M:\n    name = 'custom'\n    functions = [1, 2]\n"
                   "def create_module(version, params):\n    return M()\n")
    module = vmfb(MODULES / "basic.mlir", HOST, compile_cache)
    rc, out, err = cli(capsys, "run-module", module, f"--host_module={bad}")
    assert rc == 1 and out == ""
    assert err.strip() == (f"hal-cpu: error: {bad}: functions: module 'custom': "
                           "functions is a list ([1, 2]), not a mapping of function "
                           "names to callables")


# ---------------------------------------------------------------------------
# memory bounds

def _peak_kib(argv) -> int:
    """Peak resident memory (KiB) of the process tree of ``hal-cpu argv``."""
    probe = ("import resource, subprocess, sys\n"
             "r = subprocess.run([sys.executable, '-m', 'hal_cpu', *sys.argv[1:]],"
             " capture_output=True, text=True)\n"
             "assert r.returncode == 0, r.stderr\n"
             "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n")
    out = subprocess.run([sys.executable, "-c", probe, *map(str, argv)],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return int(out.stdout.split()[-1])


def test_memory_limit_and_a_buffer_allocated_once(compile_cache, capsys):
    module = vmfb(LIMITS, HOST, compile_cache)
    # past the limit: one line naming the op and the size, nothing allocated
    rc, out, err = cli(capsys, "run-module", module, "--function=sized",
                       f"--input={1 << 40}")
    assert rc == 1 and len(err.splitlines()) == 1
    assert ("RESOURCE_EXHAUSTED; hal.device.queue.alloca: 4398046511104 bytes would "
            "take the program's buffers past its memory limit") in err
    rc, out, err = cli(capsys, "run-module", module, "--function=sized", "--input=5000",
                       "--memory_limit=16K")
    assert rc == 1 and "memory limit of 16384 bytes" in err
    rc, out, err = cli(capsys, "run-module", module, "--function=sized", "--input=5",
                       "--memory_limit=16M")
    assert rc == 0 and "5xf32=1.5 1.5 1.5 1.5 1.5" in out
    # a 256 MiB result is allocated once: the peak grows by less than 1.2x it
    n = 64 << 20
    small = _peak_kib(["run-module", module, "--function=sized", "--input=1", "--output="])
    big = _peak_kib(["run-module", module, "--function=sized", f"--input={n}", "--output="])
    assert big - small < 1.2 * (4 * n) / 1024, (small, big)


def test_fuzz_slice_program(tmp_path):
    """A short run of ``python -m fuzz --target program``: mutated programs
    loaded and called end in a result or a typed error, within the time
    and memory bounds."""
    import json
    import os
    report = tmp_path / "report.json"
    proc = subprocess.run(
        [sys.executable, "-m", "fuzz", "--target", "program", "--backend", "native",
         "--cases", "40", "--seed", "5", "--jobs", "2", "--report", str(report),
         "--out", str(tmp_path / "cases"), "--quiet", "--no-minimize"],
        cwd=ROOT, env=dict(os.environ, OPENBLAS_NUM_THREADS="1"), capture_output=True,
        text=True, timeout=600)
    assert report.exists(), proc.stdout + proc.stderr
    out = json.loads(report.read_text())
    row = out["summary"]["program"]["native"]
    assert sum(row.values()) == 40
    assert row["accepted"] + row["typed"] == 40, row
    assert out["problem_count"] == 0 and proc.returncode == 0, proc.stdout


def test_memory_limit_on_the_mlir_path(compile_cache, capsys):
    """MLIR runs on the VM with the same bound: one line naming the MLIR
    file, the op (``hal.device.queue.alloca``), the size and the function;
    a large result allocated once. No source line: iree-compile 3.13's
    ``.vmfb`` debug database holds one function's source map only, so the
    VM names the file, function and op, not the line."""
    rc, out, err = cli(capsys, "run-module", LIMITS, f"--cache_dir={compile_cache}",
                       "--function=sized", f"--input={1 << 40}")
    assert rc == 1 and len(err.splitlines()) == 1
    assert err.startswith(f"hal-cpu: error: {LIMITS}: RESOURCE_EXHAUSTED; "
                          "hal.device.queue.alloca: 4398046511104 bytes would take the "
                          "program's buffers past its memory limit"), err
    assert err.rstrip().endswith("(in @sized)"), err
    rc, out, err = cli(capsys, "run-module", LIMITS, f"--cache_dir={compile_cache}",
                       "--function=sized", "--input=3000", "--memory_limit=4K")
    assert rc == 1 and "memory limit of 4096 bytes" in err
    n = 64 << 20
    base = ["run-module", LIMITS, f"--cache_dir={compile_cache}", "--function=sized",
            "--output="]
    small = _peak_kib(base + ["--input=1"])
    big = _peak_kib(base + [f"--input={n}"])
    assert big - small < 1.2 * (4 * n) / 1024, (small, big)


def test_timeout_stops_a_host_loop_on_the_mlir_path(compile_cache):
    """--timeout stops a host loop of an MLIR program run on the VM: one
    line naming the file and the function (no source line: see the memory
    limit test)."""
    import time as _time
    compile_program(LIMITS, HOST, compile_cache)    # (the command's time is the run's)
    start = _time.monotonic()
    proc = _hal_cpu("run-module", LIMITS, f"--cache_dir={compile_cache}",
                    "--function=spin", "--input=5", "--timeout=3")
    took = _time.monotonic() - start
    assert proc.returncode == 1 and took < 3 + 2 + 3, (took, proc.stderr)
    # the VM names the file and the function whose loop it stopped, not a
    # source line: iree-compile 3.13's .vmfb debug database holds one
    # function's source map only
    assert proc.stderr.strip() == (
        f"hal-cpu: error: {LIMITS}: timeout: the time limit of 3 s passed in "
        "@spin (a loop of the program's host code)"), proc.stderr


def test_a_compile_that_never_ends_is_stopped(tmp_path):
    """iree-compile loops on a recursive host function: --timeout stops it
    (and the compiler process it started) with one line."""
    import time as _time
    rec = tmp_path / "rec.mlir"
    rec.write_text("func.func @r(%n: i32) -> i32 {\n  %c1 = arith.constant 1 : i32\n"
                   "  %m = arith.addi %n, %c1 : i32\n"
                   "  %r = func.call @r(%m) : (i32) -> i32\n  return %r : i32\n}\n")
    start = _time.monotonic()
    proc = _hal_cpu("run-module", rec, "--input=1", "--timeout=2",
                    f"--cache_dir={tmp_path / 'cache'}")
    took = _time.monotonic() - start
    assert proc.returncode == 1 and took < 2 + 2 + 3, (took, proc.stderr)
    assert proc.stderr.strip() == (f"hal-cpu: error: {rec}: iree-compile: iree-compile "
                                   "did not finish within 2 s (stopped) compiling for "
                                   f"{HOST}")
    import os
    left = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if str(rec).encode() in f.read():
                    left.append(pid)
        except OSError:
            pass
    assert not left, "a compiler process outlived the command"
