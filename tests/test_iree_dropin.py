"""``hal-cpu run-module`` / ``benchmark-module`` / ``check-module`` as a
drop-in for IREE's ``iree-run-module`` / ``iree-benchmark-module``:
modules piped on standard input, async-external (coarse-fences)
functions, the order of what a printing plugin and the tool print, IREE's
flags (Google Benchmark's report formats, the flags refused in one line),
and IREE's status lines. Each case runs programs and a plugin of our own
(``tests/programs/dropin/``, ``tests/plugins/printing_plugin.c``) and
compares stdout with IREE's own tools installed here; CHECK lines are
checked with ``filecheck`` (FileCheck's Python clone)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from fatelf import arches
from hal_cpu.cli import main
from hal_cpu.programs import compile_program
from hal_cpu.programs.vm import load_program

from conftest import ROOT

DROPIN = ROOT / "tests" / "programs" / "dropin"
HOST_MODULES = ROOT / "tests" / "programs" / "host_modules"
BIN = Path(sys.executable).parent
IREE_RUN_MODULE = BIN / "iree-run-module"
IREE_BENCHMARK_MODULE = BIN / "iree-benchmark-module"
HOST = arches.host_arch()

pytestmark = pytest.mark.skipif(
    HOST != "x86_64" or not IREE_RUN_MODULE.exists(),
    reason="compares with IREE's x86_64 runtime tools (iree-base-runtime)")


def hal_cpu(*args, stdin=None, input=None, check=False) -> subprocess.CompletedProcess:
    """``hal-cpu ARGS`` in a process of its own, stdout a pipe (as a shell
    pipeline sees it)."""
    return subprocess.run([sys.executable, "-m", "hal_cpu", *map(str, args)],
                          stdin=stdin, input=input, capture_output=True,
                          cwd=ROOT, timeout=300, check=check)


def iree(tool: Path, *args, stdin=None, input=None) -> subprocess.CompletedProcess:
    return subprocess.run([str(tool), *map(str, args)], stdin=stdin, input=input,
                          capture_output=True, timeout=300)


def filecheck(check_file: Path, text: bytes, prefix: str | None = None) -> None:
    """FileCheck's verdict on ``text`` against the CHECK lines of
    ``check_file`` (PyPI ``filecheck``)."""
    exe = shutil.which("filecheck") or str(BIN / "filecheck")
    cmd = [exe, str(check_file)] + ([f"--check-prefix={prefix}"] if prefix else [])
    proc = subprocess.run(cmd, input=text, capture_output=True, timeout=60)
    assert proc.returncode == 0, (proc.stdout + proc.stderr).decode()


@pytest.fixture(scope="module")
def mul_add(compile_cache) -> Path:
    """async_mul_add.mlir compiled as a synchronous function."""
    return compile_program(DROPIN / "async_mul_add.mlir", HOST, compile_cache).vmfb


@pytest.fixture(scope="module")
def async_vmfb(compile_cache) -> Path:
    return compile_program(DROPIN / "async_mul_add.mlir", HOST, compile_cache,
                           extra_flags=["--iree-execution-model=async-external"]).vmfb


@pytest.fixture(scope="module")
def printing_plugin(tmp_path_factory) -> Path:
    """tests/plugins/printing_plugin.c built as a host shared library."""
    out = tmp_path_factory.mktemp("plugin") / "printing_plugin.so"
    flags = ["-std=c11", "-shared", "-fPIC", "-O2", f"-I{ROOT / 'sample_plugins'}",
             f"-I{ROOT / 'hal_cpu' / 'include'}",
             str(ROOT / "tests" / "plugins" / "printing_plugin.c"), "-o", str(out)]
    if shutil.which("cc"):
        cmd = ["cc", *flags]
    else:
        cmd = [sys.executable, "-m", "ziglang", "cc", "-target", "x86_64-linux-gnu",
               *flags]
    subprocess.run(cmd, check=True, capture_output=True, timeout=300)
    return out


@pytest.fixture(scope="module")
def system_vmfb(compile_cache) -> Path:
    return compile_program(ROOT / "sample_plugins" / "system_example.mlir", HOST,
                           compile_cache).vmfb


MUL_ADD_INPUTS = ["--function=mul_add", "--input=4xf32=1,2,3,4", "--input=4xf32=2"]


# ---------------------------------------------------------------------------
# piped modules

@pytest.mark.parametrize("spelling", [["--module=-"], ["-"], ["/dev/stdin"]],
                         ids=["module-dash", "positional-dash", "dev-stdin-fifo"])
def test_piped_module_prints_as_iree_run_module(mul_add, spelling):
    data = mul_add.read_bytes()
    want = iree(IREE_RUN_MODULE, "--module=-", "--device=local-sync",
                *MUL_ADD_INPUTS, input=data)
    assert want.returncode == 0, want.stderr
    # input=...: a pipe, so /dev/stdin is a FIFO
    got = hal_cpu("run-module", *spelling, "--device=local-sync",
                  *MUL_ADD_INPUTS, input=data)
    assert got.returncode == 0, got.stderr
    assert got.stdout == want.stdout


def test_piped_mlir_is_compiled(compile_cache):
    source = (DROPIN / "async_mul_add.mlir").read_bytes()
    got = hal_cpu("run-module", "--module=-", f"--cache_dir={compile_cache}",
                  *MUL_ADD_INPUTS, input=source)
    assert got.returncode == 0, got.stderr
    assert got.stdout.startswith(b"EXEC @mul_add\nresult[0]: hal.buffer_view\n")


@pytest.mark.parametrize("data,words", [
    (b"", b"<stdin>: program: standard input is empty"),
    (b"PK\x03\x04" + bytes(60), b"<stdin>: "),
], ids=["empty", "truncated-module"])
def test_piped_input_errors_name_stdin(data, words):
    got = hal_cpu("run-module", "--module=-", "--function=f", input=data)
    assert got.returncode == 1 and got.stdout == b""
    assert len(got.stderr.splitlines()) == 1, got.stderr
    assert got.stderr.startswith(b"hal-cpu: error: " + words), got.stderr


def test_piped_input_is_bounded():
    """Standard input past the limit is a typed error naming <stdin>, the
    field and the bytes read (the limit lowered to see it)."""
    code = ("from hal_cpu.cli.programs import read_stdin\n"
            "from hal_cpu.errors import HalCpuError\n"
            "try:\n    read_stdin(limit=1000)\n"
            "except HalCpuError as e:\n    print(e.name, e.field, e.value)\n")
    proc = subprocess.run([sys.executable, "-c", code], input=bytes(5000),
                          capture_output=True, timeout=60)
    assert proc.stdout.split() == [b"<stdin>", b"program", str(min(
        5000, 1 << 20)).encode()], proc.stderr


def test_piped_module_in_benchmark_and_check(mul_add, compile_cache):
    got = hal_cpu("benchmark-module", "--module=-", *MUL_ADD_INPUTS,
                  "--benchmark_min_time=3x", input=mul_add.read_bytes())
    assert got.returncode == 0, got.stderr
    assert got.stdout.startswith(b"BM_mul_add (")


# ---------------------------------------------------------------------------
# async-external (coarse-fences) functions

def test_async_function_runs_as_iree_run_module(async_vmfb):
    args = ["--function=mul_add", "--input=4xf32=1,2,3,4", "--input=4xf32=2"]
    want = iree(IREE_RUN_MODULE, f"--module={async_vmfb}", *args)
    assert want.returncode == 0, want.stderr
    assert b"4xf32=4 6 8 10" in want.stdout
    got = hal_cpu("run-module", f"--module={async_vmfb}", *args)
    assert got.returncode == 0, got.stderr
    assert got.stdout == want.stdout
    filecheck(DROPIN / "async_mul_add.mlir", got.stdout)


def test_async_function_in_benchmark_and_python(async_vmfb):
    got = hal_cpu("benchmark-module", f"--module={async_vmfb}", "--function=mul_add",
                  "--input=4xf32=1,2,3,4", "--input=4xf32=2",
                  "--benchmark_min_time=5x")
    assert got.returncode == 0, got.stderr
    assert got.stdout.splitlines()[0].endswith(b": 5 calls")
    with load_program(async_vmfb) as program:
        fn = program.function("mul_add")
        assert fn.model == "coarse-fences" and fn.arg_types == ["r", "r"]
        (out,) = fn(np.arange(4, dtype=np.float32), np.full(4, 2, np.float32))
    np.testing.assert_array_equal(out, [2, 4, 6, 8])


def test_async_check_module(compile_cache):
    vmfb = compile_program(DROPIN / "async_check.mlir", HOST, compile_cache,
                           extra_flags=["--iree-execution-model=async-external"]).vmfb
    got = hal_cpu("check-module", vmfb)
    assert got.returncode == 0, got.stdout + got.stderr
    filecheck(DROPIN / "async_check.mlir", got.stdout)


# ---------------------------------------------------------------------------
# output order: a plugin that prints

def _system_args(plugin: Path) -> list[str]:
    return ["--device=local-sync", "--function=mixed_invocation",
            "--input=8xf32=2", "--input=8xf32=4", f"--executable_plugin={plugin}"]


@pytest.mark.parametrize("flags", [[], ["--no_isolate"], ["--run_native"]],
                         ids=["confined-child", "no-isolate", "run-native"])
def test_plugin_lines_come_between_exec_and_results(system_vmfb, printing_plugin,
                                                   flags):
    args = _system_args(printing_plugin)
    want = iree(IREE_RUN_MODULE, f"--module={system_vmfb}", *args)
    assert want.returncode == 0, want.stderr
    got = hal_cpu("run-module", f"--module={system_vmfb}", *args, *flags)
    assert got.returncode == 0, got.stderr
    assert got.stdout == want.stdout        # byte for byte, on a pipe
    filecheck(DROPIN / "printing_plugin.check", got.stdout)


def _on_terminal(argv: list[str]) -> bytes:
    """What ``argv`` writes to stdout when stdout is a terminal (a
    pseudo-terminal's lines, newline translation undone)."""
    import pty
    import select
    master, slave = pty.openpty()
    proc = subprocess.Popen(argv, stdout=slave, stderr=subprocess.DEVNULL,
                            cwd=ROOT)
    os.close(slave)
    out = b""
    while True:
        ready, _, _ = select.select([master], [], [], 120)
        if not ready:
            break
        try:
            chunk = os.read(master, 1 << 16)
        except OSError:         # EIO: the child closed the terminal
            break
        if not chunk:
            break
        out += chunk
    os.close(master)
    assert proc.wait(timeout=120) == 0
    return out.replace(b"\r\n", b"\n")


def test_plugin_lines_in_order_on_a_terminal(system_vmfb, printing_plugin):
    args = [f"--module={system_vmfb}", *_system_args(printing_plugin)]
    want = _on_terminal([str(IREE_RUN_MODULE), *args])
    got = _on_terminal([sys.executable, "-m", "hal_cpu", "run-module", *args])
    assert got == want
    filecheck(DROPIN / "printing_plugin.check", got)


def test_plugin_lines_from_a_piped_module(system_vmfb, printing_plugin):
    args = _system_args(printing_plugin)
    data = system_vmfb.read_bytes()
    want = iree(IREE_RUN_MODULE, "--module=-", *args, input=data)
    got = hal_cpu("run-module", "--module=-", *args, input=data)
    assert got.returncode == 0, got.stderr
    assert got.stdout == want.stdout


# ---------------------------------------------------------------------------
# IREE's flags

def _help_flags(tool: Path) -> set[str]:
    import re
    text = iree(tool, "--help").stdout.decode(errors="replace")
    flags = set(re.findall(r"^(?:# )?(--[A-Za-z0-9_]+)", text, re.M))
    flags |= set(re.findall(r"\[(--benchmark_[a-z_]+)=", text))
    return flags - {"--help"}


def _parser(command: str):
    from hal_cpu.cli import build_parser
    parser = build_parser(command)
    return parser._subparsers._group_actions[0].choices[command]  # noqa: SLF001


@pytest.mark.parametrize("command,tool", [("run-module", IREE_RUN_MODULE),
                                          ("benchmark-module", IREE_BENCHMARK_MODULE)])
def test_every_iree_flag_is_taken_or_refused_in_one_line(command, tool, capsys):
    """Every flag the installed IREE tool's --help lists is an option of
    ours: one we take, or one refused with one line and exit status 2."""
    flags = _help_flags(tool)
    assert len(flags) > 40
    known = set(_parser(command).long_options)
    assert not flags - known, sorted(flags - known)
    from hal_cpu.cli.programs import REFUSED_FLAGS
    for flag in sorted(flags & set(REFUSED_FLAGS)):
        with pytest.raises(SystemExit) as stop:
            main([command, "x.vmfb", f"{flag}=1"])
        assert stop.value.code == 2
        out, err = capsys.readouterr()
        assert out == "" and len(err.splitlines()) == 1, err
        assert err.startswith(f"hal-cpu {command}: flag {flag} is not supported (")


def _bench(tool_args, fmt, *extra):
    return tool_args + [f"--benchmark_format={fmt}", "--benchmark_min_time=5x", *extra]


def test_benchmark_json_has_google_benchmarks_fields(mul_add):
    args = _bench([f"--module={mul_add}", "--device=local-sync", *MUL_ADD_INPUTS],
                  "json", "--benchmark_repetitions=3")
    want = iree(IREE_BENCHMARK_MODULE, *args)
    assert want.returncode == 0, want.stderr
    got = hal_cpu("benchmark-module", *args)
    assert got.returncode == 0, got.stderr
    w, g = json.loads(want.stdout), json.loads(got.stdout)
    assert list(g) == list(w) == ["context", "benchmarks"]
    assert list(g["context"]) == list(w["context"])
    for key in ("host_name", "num_cpus", "mhz_per_cpu", "aslr_enabled",
                "cpu_scaling_enabled", "caches", "json_schema_version"):
        assert g["context"][key] == w["context"][key], key
    assert [list(b) for b in g["benchmarks"]] == [list(b) for b in w["benchmarks"]]
    for gb, wb in zip(g["benchmarks"], w["benchmarks"]):
        for key in ("name", "run_name", "run_type", "repetitions", "threads",
                    "time_unit", "aggregate_name", "aggregate_unit",
                    "family_index", "per_family_instance_index",
                    "repetition_index"):
            assert gb.get(key) == wb.get(key), key
        if gb["run_type"] == "iteration":
            assert gb["iterations"] == wb["iterations"] == 5
            assert gb["real_time"] > 0 and gb["cpu_time"] > 0
            assert gb["items_per_second"] == pytest.approx(
                1e3 / gb["real_time"], rel=1e-9)


def test_benchmark_console_and_csv_layout(mul_add):
    base = [f"--module={mul_add}", "--device=local-sync", *MUL_ADD_INPUTS]
    for fmt in ("console", "csv"):
        want = iree(IREE_BENCHMARK_MODULE, *_bench(base, fmt))
        got = hal_cpu("benchmark-module", *_bench(base, fmt))
        assert got.returncode == 0, got.stderr
        w, g = want.stdout.decode().splitlines(), got.stdout.decode().splitlines()
        assert len(g) == len(w)
        if fmt == "csv":
            assert g[0] == w[0]
            assert g[1].split(",")[0] == w[1].split(",")[0]
            assert g[1].split(",")[1] == w[1].split(",")[1] == "5"
            assert g[1].split(",")[4:6] == w[1].split(",")[4:6] == ["ms", ""]
        else:
            assert g[:3] == w[:3]           # the rules and the header
            assert g[3].split()[0] == w[3].split()[0]
            assert g[3].split()[2] == w[3].split()[2] == "ms"
            assert g[3].split()[5] == w[3].split()[5] == "5"
        # the context goes to stderr, as Google Benchmark writes it
        assert got.stderr.decode().splitlines()[2] == want.stderr.decode().splitlines()[2]


def test_benchmark_out_and_statistics(mul_add, tmp_path):
    out = tmp_path / "report.json"
    got = hal_cpu("benchmark-module", f"--module={mul_add}", *MUL_ADD_INPUTS,
                  "--benchmark_format=console", f"--benchmark_out={out}",
                  "--benchmark_min_time=3x", "--print_statistics")
    assert got.returncode == 0, got.stderr
    report = json.loads(out.read_text())
    assert report["benchmarks"][0]["iterations"] == 3
    assert b"Device: " in got.stderr and b"live: " in got.stderr
    got = hal_cpu("run-module", f"--module={mul_add}", *MUL_ADD_INPUTS,
                  "--print_statistics", "--task_topology_group_count=1")
    assert got.returncode == 0, got.stderr
    assert b"[[ hal-cpu buffer memory ]]" in got.stderr


# ---------------------------------------------------------------------------
# IREE's error shape

def test_status_failure_prints_code_and_message(compile_cache):
    vmfb = compile_program(DROPIN / "assert_positive.mlir", HOST, compile_cache).vmfb
    want = iree(IREE_RUN_MODULE, f"--module={vmfb}", "--input=-3")
    assert want.returncode != 0
    assert b"FAILED_PRECONDITION; " in want.stderr and b"x must be positive" in want.stderr
    got = hal_cpu("run-module", f"--module={vmfb}", "--input=-3")
    assert got.returncode == 1 and got.stdout == want.stdout == b"EXEC @f\n"
    assert len(got.stderr.splitlines()) == 1
    line = got.stderr.decode()
    assert line.startswith(f"hal-cpu: error: {vmfb}: FAILED_PRECONDITION; ")
    assert line.rstrip().endswith("x must be positive")


def test_host_module_failure_is_a_status(compile_cache):
    vmfb = compile_program(HOST_MODULES / "dynamic.mlir", HOST, compile_cache).vmfb
    got = hal_cpu("run-module", f"--module={HOST_MODULES / 'custom_string.py'}",
                  "--module=-", "--function=error", input=vmfb.read_bytes())
    assert got.returncode == 1 and got.stdout == b"EXEC @error\n"
    assert got.stderr.decode() == ("hal-cpu: error: <stdin>: UNKNOWN; Forced failure; "
                                   "while invoking native function custom.error\n")


def test_errors_of_embedded_executables_name_the_vmfb(system_vmfb):
    got = hal_cpu("run-module", f"--module={system_vmfb}", "--function=mixed_invocation",
                  "--input=8xf32=1", "--input=8xf32=1")
    assert got.returncode == 1
    assert got.stderr.startswith(f"hal-cpu: error: {system_vmfb}: ".encode()), got.stderr
    assert b"<memory>" not in got.stderr


def test_plan_does_not_call_inputs_written(compile_cache):
    got = hal_cpu("plan", DROPIN / "two_reads.mlir", f"--cache_dir={compile_cache}",
                  "--input=4x8xf32=1")
    assert got.returncode == 0, got.stderr
    text = got.stdout.decode()
    assert text.count("step ") == 2 and "input 0 [0, 128)" in text
    for line in text.splitlines():
        if "input 0" in line:
            assert "written by an earlier step" not in line, line
    # the reduction's result, read by the second dispatch, was written
    assert "buffer_0 [0, 16) (16 bytes) (written by an earlier step)" in text


def test_no_isolate_is_accepted_by_the_program_commands(mul_add):
    for command in ("run-module", "check-module", "benchmark-module"):
        extra = (MUL_ADD_INPUTS + ["--benchmark_min_time=2x"]
                 if command == "benchmark-module" else
                 MUL_ADD_INPUTS if command == "run-module" else [])
        got = hal_cpu(command, f"--module={mul_add}", *extra, "--no_isolate")
        assert b"unrecognized" not in got.stderr, got.stderr
        assert got.returncode in (0, 1), got.stderr
    assert os.path.exists(mul_add)
