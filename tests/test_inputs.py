"""Every input path is bounded: FIFOs, devices, directories, huge sparse
files, lying .npy headers, out-of-range numbers, compiled modules where
source is needed, files whose code never returns or crashes. Each case
ends with one line on stderr, exit status 1 (2 for usage errors), no
traceback, within 5 s and under 1 GiB of memory."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import elfloader
from hal_cpu.plugins import PluginManager

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ROOT / "hal_cpu" / "samples"
PREBUILT = ROOT / "sample_plugins" / "prebuilt"
HOST = elfloader.arch.host()
SECONDS = 5.0
MAX_RSS = 1 << 30
SAMPLE = SAMPLES / "sum_last_x86_64.so"
RUN = ["run", SAMPLE, "--entry_point=0", "--workgroup_count=9,1,1"]
OK_BINDINGS = ["--binding=9x129xf32=1", "--binding=9xf32"]
#: x86_64 code: a store to address 0 (SIGSEGV natively) and a loop forever.
CRASH = bytes.fromhex("c70425000000002a000000")
LOOP = bytes.fromhex("ebfe")
x86_64_host = pytest.mark.skipif(HOST is None or HOST.name != "x86_64",
                                 reason="the crafted files are x86_64 code")


def bounded(*args, address_space: int | None = None):
    """Run ``hal-cpu ARGS``; returns (exit status, stdout, stderr, seconds,
    peak RSS in bytes). Killed (and failed) past twice :data:`SECONDS`."""
    out_path = f"/tmp/.hal_cpu_inputs_{os.getpid()}"
    with open(out_path + ".out", "w+") as out, open(out_path + ".err", "w+") as err:
        def limit():
            if address_space:
                resource.setrlimit(resource.RLIMIT_AS,
                                   (address_space, address_space))
        start = time.monotonic()
        proc = subprocess.Popen([sys.executable, "-m", "hal_cpu", *map(str, args)],
                                stdout=out, stderr=err, cwd=ROOT,
                                preexec_fn=limit)
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if time.monotonic() - start > 2 * SECONDS:
                proc.kill()
                os.wait4(proc.pid, 0)
                pytest.fail(f"hal-cpu {args} still ran after {2 * SECONDS} s")
            time.sleep(0.01)
        seconds = time.monotonic() - start
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        result = (proc.returncode, out.read(), err.read(), seconds,
                  usage.ru_maxrss * 1024)
    for suffix in (".out", ".err"):
        os.unlink(out_path + suffix)
    return result


def check(args, status=1, words=(), report=False, **kw) -> str:
    """Run hal-cpu; the error is one line (``report``: a fault report, one
    line then indented detail lines)."""
    rc, _, err, seconds, rss = bounded(*args, **kw)
    assert rc == status, (args, err)
    assert "Traceback" not in err, err
    if status == 2:     # usage errors: argparse's usage, then one line
        err = err.strip().splitlines()[-1] + "\n"
    lines = err.strip().splitlines()
    if report:
        assert lines and all(line.startswith("  ") for line in lines[1:]), err
    else:
        assert len(lines) == 1, err
    assert seconds < SECONDS, (args, seconds)
    assert rss < MAX_RSS, (args, rss)
    for w in words:
        assert w in err, (w, err)
    return err


@pytest.fixture(scope="module")
def odd(tmp_path_factory):
    """A FIFO, a directory, an 8 GiB sparse file of zeros, an 8 GiB sparse
    file that starts with a real executable, a .npy whose 193 bytes claim
    100000x100000 floats, a compiled module."""
    d = tmp_path_factory.mktemp("odd")
    os.mkfifo(d / "fifo")
    (d / "dir").mkdir()
    with open(d / "sparse.so", "wb") as f:
        f.truncate(8 << 30)
    with open(d / "sparse_elf.so", "wb") as f:
        f.write(SAMPLE.read_bytes())
        f.truncate(8 << 30)
    header = np.lib.format.header_data_from_array_1_0(np.zeros(1, np.float32))
    header["shape"] = (100000, 100000)
    with open(d / "huge.npy", "wb") as f:
        np.lib.format.write_array_header_1_0(f, header)
        f.write(b"\0" * (193 - f.tell()))
    assert (d / "huge.npy").stat().st_size == 193
    return d


@pytest.fixture(scope="module")
def vmfb(compile_cache):
    """The bundled mul_add sample (5003 floats, 2 workgroups) compiled."""
    from hal_cpu.programs import compile_program
    return compile_program(SAMPLES / "samples_mul_add.mlir", "x86_64",
                           compile_cache).vmfb


NOT_REGULAR = [("fifo", "a FIFO"), ("dir", "a directory"),
               ("/dev/zero", "a character device")]


def _path(odd, which):
    return which if which.startswith("/") else odd / which


@pytest.mark.parametrize("which,what", NOT_REGULAR)
def test_non_regular_files_for_every_verb(odd, which, what):
    path = _path(odd, which)
    for args in (["inspect", path], ["run", path, "--entry_point=0"],
                 ["run-module", path], ["plan", path],
                 RUN + [f"--binding=@{path}", "--binding=9xf32"],
                 RUN + [f"--binding=9x129xf32=@{path}", "--binding=9xf32"],
                 RUN + OK_BINDINGS + [f"--executable_plugin={path}"],
                 RUN + OK_BINDINGS + [f"--executable_plugin=embedded:{path}"],
                 ["run-module", SAMPLES / "samples_sum_last.mlir",
                  f"--input=@{path}"]):
        check(args, words=[what])


def test_huge_sparse_files_are_not_read_whole(odd):
    for verb in (["inspect"], ["run", "--entry_point=0"]):
        check([verb[0], odd / "sparse.so", *verb[1:]], words=["magic"])
    # A real executable at the start: only what its headers reach is read.
    rc, out, err, seconds, rss = bounded("inspect", odd / "sparse_elf.so")
    assert rc == 0 and "sum_last" in out, err
    assert seconds < SECONDS and rss < MAX_RSS


def test_npy_header_is_checked_against_the_file(odd):
    check(RUN + [f"--binding=@{odd / 'huge.npy'}", "--binding=9xf32"],
          words=["header claims"])


@pytest.mark.parametrize("value", ["inf", "nan", "-1", "1e400"])
def test_timeout_out_of_range_is_a_usage_error(value):
    for verb in (RUN + OK_BINDINGS, ["inspect", SAMPLE],
                 ["run-module", SAMPLES / "samples_sum_last.mlir"]):
        check(verb + [f"--timeout={value}"], status=2, words=["--timeout"])


@x86_64_host
def test_large_binding_under_a_memory_limit():
    check(RUN + ["--binding=4294967296xi8", "--binding=9xf32"],
          words=["not enough memory"], address_space=2560 << 20)


def test_vmfb_where_source_is_needed(vmfb):
    check(["plan", vmfb, "--save_dir=/nonexistent"], words=["MLIR source"])
    # run-module takes the .vmfb itself: a missing input is one line
    check(["run-module", vmfb], words=["takes 2 inputs", "0 --input given"])


def test_vmfb_inspect_and_run(vmfb, tmp_path):
    rc, out, err, _, _ = bounded("inspect", vmfb)
    assert rc == 0, err
    assert "1 embedded executable" in out and "mul_add_dispatch_0" in out
    name = out.split("executable:   ")[1].split()[0]
    n = 5003
    out_file = tmp_path / "c.npy"
    rc, out, err, _, _ = bounded(
        "run", vmfb, f"--executable={name}", "--entry_point=0",
        "--workgroup_count=2,1,1", f"--binding={n}xf32=1.5",
        f"--binding={n}xf32=2", f"--binding={n}xf32",
        f"--output=2=@{out_file}", "--print_bindings=none")
    assert rc == 0, err
    assert (np.load(out_file) == 4.5).all()
    check(["run", vmfb, "--executable=nothing", "--entry_point=0"],
          words=["no executable 'nothing'", name])


def _patched(tmp_path, source: Path, vaddr: int, code: bytes, name: str) -> Path:
    image = elfloader.read_image(source)
    seg = image.segment_at(vaddr, len(code))
    data = bytearray(source.read_bytes())
    at = seg.offset + vaddr - seg.vaddr
    data[at:at + len(code)] = code
    path = tmp_path / name
    path.write_bytes(bytes(data))
    return path


def _query_patched(tmp_path, code, name):
    source = SAMPLES / "sum_last_x86_64.so"
    vaddr = elfloader.read_image(source).exports["iree_hal_executable_library_query"]
    return _patched(tmp_path, source, vaddr, code, name)


@x86_64_host
@pytest.mark.parametrize("backend", ["native", "emulated"])
def test_timeout_bounds_a_query_that_never_returns(tmp_path, backend):
    so = _query_patched(tmp_path, LOOP, "loop.so")
    start = time.monotonic()
    err = check(["run", so, "--entry_point=0", "--timeout=1",
                 f"--backend={backend}"] + OK_BINDINGS[:0],
                report=backend == "emulated")
    assert time.monotonic() - start < 4
    assert "limit" in err


@x86_64_host
def test_inspect_runs_nothing_natively(tmp_path):
    """A query that crashes natively is emulated by inspect: a fault report,
    not a crash (executable and plugin alike); one that never returns
    stops at the limit."""
    check(["inspect", _query_patched(tmp_path, CRASH, "crash.so")],
          words=["write to unmapped memory", "instruction:"], report=True)
    check(["inspect", _query_patched(tmp_path, LOOP, "loop.so"),
           "--timeout=1"], words=["limit"], report=True)
    plugin = PREBUILT / "standalone_x86_64.so"
    vaddr = elfloader.read_image(plugin).exports["iree_hal_executable_plugin_query"]
    crash = _patched(tmp_path, plugin, vaddr, CRASH, "crash_plugin.so")
    check(["inspect", crash], words=["write to unmapped memory",
                                     "plugin function"], report=True)


@x86_64_host
def test_run_module_isolates_a_crashing_plugin(tmp_path, compiled):
    """run-module runs native dispatches in a child: a plugin import that
    crashes gives the one-line crash message, then the emulated report."""
    plugin = PREBUILT / "standalone_x86_64.so"
    with PluginManager("x86_64", "emulated") as manager:
        registered = manager.register_embedded(plugin)
        (fn,), _ = manager.resolve(["simple_mul_workgroup"])
        vaddr = fn - registered.module.base
    crash = _patched(tmp_path, plugin, vaddr, CRASH, "crash_plugin.so")
    program = ROOT / "sample_plugins" / "standalone_example.mlir"
    rc, out, err, seconds, rss = bounded(
        "run-module", program, "--arch=x86_64", f"--executable_plugin=embedded:{crash}",
        "--input=8xf32=1", "--input=8xf32=2")
    lines = err.splitlines()
    assert rc == 1 and "Traceback" not in err, err
    assert "crashed natively (SIGSEGV) in export" in lines[0], err
    assert "running the program again emulated" in lines[1]
    assert "write to unmapped memory" in err
    assert rss < MAX_RSS
