"""Emulated guests and bindings stay within their bounds.

The guest is ``tests/plugins/guest_bounds.c``, an executable library built
here with zig, whose export ``bounds_dispatch`` picks a case by its first
push constant (see the C file):

* a 32-bit guest (x86_32, arm32, riscv32) that maps and touches 1.25 GiB
  under qemu-user: qemu-user reserves a 32-bit guest's whole 4 GiB address
  space up front, so the sandbox's ``RLIMIT_AS`` never saw the guest's
  ``mmap`` (it reached 1.3 GiB resident); now the call ends with an
  ``EmulationError`` of kind ``memory_limit`` and the agent's resident size
  stays near its start plus ``MEMORY_LIMIT``. On unicorn the guest's own
  ``mmap`` is a ``syscall`` fault;
* a forged ``rt_sigreturn`` on x86_64 trips an assertion of qemu-user: one
  error line of kind ``emulator_aborted``, qemu-user's stderr escaped behind
  a label;
* a kernel writing a few bytes before its binding's start (the canary
  below it) or reading into the guard page below, on both engines: a
  ``BindingUnderrunError`` naming the binding and the negative offset;
* ``hal-cpu run`` with a raw binding file whose size is not the
  binding's, small or a sparse 8 GiB file: a typed error naming the file.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import elfloader
from elfloader.backend.emulated import sandbox
from fatelf import PortableKernelError

ROOT = Path(__file__).resolve().parent.parent
PLUGINS = ROOT / "tests" / "plugins"
ARCHES = ["x86_64", "x86_32", "arm32", "riscv32"]
BITS32 = ["x86_32", "arm32", "riscv32"]
MAP, SIGRETURN, READ_BELOW, WRITE_BELOW = 1, 2, 3, 4
#: MiB the 32-bit guest maps and touches: more than MEMORY_LIMIT.
TOUCH_MIB = 1280
#: How far, bytes, the agent's resident size may pass its bound before the
#: engine sees it (it checks every 50 ms while a call runs).
POLL_SLACK = 128 << 20


def _have_qemu() -> bool:
    from elfloader.backend.emulated.choice import qemu_program
    return bool(qemu_program("x86_64")) and bool(qemu_program("arm32"))


QEMU = pytest.mark.skipif(not _have_qemu() and os.environ.get("CI") != "true",
                          reason="qemu-user is not installed")


@pytest.fixture(scope="module")
def library(tmp_path_factory) -> Path:
    """guest_bounds.c for ARCHES, as a FatELF bundle."""
    pytest.importorskip("ziglang")
    import fatelf
    from hal_cpu.buildtools import zig as zigbuild
    work = tmp_path_factory.mktemp("guest_bounds")
    objects = [zigbuild.build_freestanding(
        "guest_bounds.c", arch, cwd=PLUGINS, work_dir=work,
        exports=["iree_hal_executable_library_query"], debug=True)
        for arch in ARCHES]
    path = work / "guest_bounds.sos"
    path.write_bytes(fatelf.join(objects, names=[f"guest_bounds_{a}.so"
                                                 for a in ARCHES]))
    return path


def _agents() -> list[int]:
    """This process's qemu-user children."""
    me = f"PPid:\t{os.getpid()}\n"
    out = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/status") as f:
                status = f.read()
        except OSError:
            continue
        if status.startswith("Name:\tqemu-") and me in status:
            out.append(int(pid))
    return out


def _kib(pid: int, key: str) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def dispatch(library: Path, arch: str, engine: str, constants,
             watch: dict | None = None):
    """Run ``bounds_dispatch`` once with a 256-byte binding; returns the
    typed error (or None). ``watch``: filled with each agent's start
    ``RssAnon`` and peak ``VmHWM`` while the call ran."""
    from hal_cpu import Executable
    done = threading.Event()

    def poll():
        while not done.is_set():
            for pid in _agents():
                hwm, anon = _kib(pid, "VmHWM"), _kib(pid, "RssAnon")
                if hwm is None or anon is None:
                    continue
                start, peak = watch.get(pid, (anon, 0))
                watch[pid] = (start, max(peak, hwm))
            time.sleep(0.02)

    with Executable(library, arch=arch, backend="emulated", engine=engine,
                    timeout=60) as exe:
        thread = None
        if watch is not None:
            for pid in _agents():
                watch[pid] = (_kib(pid, "RssAnon") or 0, 0)
            thread = threading.Thread(target=poll, daemon=True)
            thread.start()
        try:
            exe.dispatch("bounds_dispatch", (1, 1, 1),
                         [np.zeros(256, np.uint8)], list(constants),
                         timeout=60)
        except PortableKernelError as exc:
            return exc
        finally:
            done.set()
            if thread is not None:
                thread.join()
    return None


# --- memory of 32-bit guests ------------------------------------------------------
@QEMU
@pytest.mark.parametrize("arch", BITS32)
@pytest.mark.parametrize("piece", [0, 64], ids=["one-mmap", "64-mib-pieces"])
def test_32bit_guest_memory_is_bounded(library, arch, piece):
    watch: dict = {}
    err = dispatch(library, arch, "qemu", (MAP, TOUCH_MIB, piece), watch)
    assert isinstance(err, elfloader.EmulationError), repr(err)
    assert err.fault is not None and err.fault.kind == "memory_limit", str(err)
    assert "more than the sandbox allows" in str(err)
    assert watch, "no agent seen"
    assert max(peak for _, peak in watch.values()) > 512 << 20, \
        f"the {arch} guest touched less than 512 MiB: {watch}"
    for pid, (start, peak) in watch.items():
        assert peak < start + sandbox.MEMORY_LIMIT + POLL_SLACK + (64 << 20), \
            f"agent {pid} of {arch} reached {peak >> 20} MiB resident"


@pytest.mark.parametrize("arch", ["x86_32", "arm32"])
def test_unicorn_refuses_a_guest_mmap(library, arch):
    err = dispatch(library, arch, "unicorn", (MAP, TOUCH_MIB, 0))
    assert isinstance(err, elfloader.EmulationError), repr(err)
    assert err.fault is not None and err.fault.kind == "syscall", str(err)
    assert "mmap" in str(err)


# --- qemu-user aborting ------------------------------------------------------------
@QEMU
def test_forged_sigreturn_is_one_error_line(library):
    err = dispatch(library, "x86_64", "qemu", (SIGRETURN, 0, 0))
    assert isinstance(err, elfloader.EmulationError), repr(err)
    assert err.fault is not None and err.fault.kind == "emulator_aborted", str(err)
    lines = str(err).splitlines()
    assert "the emulator aborted" in lines[0]
    label = "  guest agent stderr| "
    rest = [line for line in lines[1:] if not line.startswith(label)]
    assert rest == [], str(err)
    assert len(set(lines[1:])) == len(lines[1:]), str(err)
    assert all(ch.isprintable() for line in lines for ch in line)


# --- underruns of a binding --------------------------------------------------------
ENGINES = [pytest.param("qemu", marks=QEMU), "unicorn"]


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("arch", ["x86_64", "arm32"])
@pytest.mark.parametrize("offset", [1, 8, 64])
def test_write_before_the_binding_is_reported(library, engine, arch, offset):
    from hal_cpu.errors import BindingUnderrunError
    err = dispatch(library, arch, engine, (WRITE_BELOW, offset, 0))
    assert isinstance(err, BindingUnderrunError), repr(err)
    assert err.binding == 0 and err.field == "bindings[0]"
    assert err.offset == -offset and err.value == -offset
    assert "before the start of binding 0" in str(err)


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("case", [READ_BELOW, WRITE_BELOW])
def test_access_into_the_page_below_is_reported(library, engine, case):
    from hal_cpu.errors import BindingUnderrunError
    err = dispatch(library, "x86_64", engine, (case, 4000, 0))
    assert isinstance(err, BindingUnderrunError), repr(err)
    assert err.binding == 0 and err.offset == -4000


@pytest.mark.parametrize("engine", ENGINES)
def test_a_kernel_within_its_binding_runs(library, engine):
    assert dispatch(library, "x86_64", engine, (0, 0, 0)) is None
    # The canary below is written again for the next binding of the class.
    assert dispatch(library, "x86_64", engine, (READ_BELOW, 8, 0)) is None


# --- raw binding files -------------------------------------------------------------
def _run(tmp_path: Path, binding: str) -> subprocess.CompletedProcess:
    sample = ROOT / "hal_cpu" / "samples" / "matmul_x86_64.so"
    return subprocess.run(
        [sys.executable, "-m", "hal_cpu", "run", str(sample),
         "--entry_point=0", "--workgroup_count=1,1,1", f"--binding={binding}",
         "--backend=emulated", "--print_bindings=none"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("size", [100, 8 << 30], ids=["small", "sparse-8GiB"])
def test_raw_binding_file_of_the_wrong_size_is_refused(tmp_path, size):
    from hal_cpu.buffers import BindingSpecError, parse_binding
    path = tmp_path / "data.bin"
    with open(path, "wb") as f:
        f.truncate(size)
    with pytest.raises(BindingSpecError) as info:
        parse_binding(f"37xi32=@{path}")
    assert info.value.name == str(path)
    assert info.value.field == "binding" and info.value.value == size
    proc = _run(tmp_path, f"37xi32=@{path}")
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(errors) == 1, proc.stderr
    assert str(path) in errors[0] and f"has {size} bytes" in errors[0], errors[0]
    assert "148 bytes" in errors[0]


def test_raw_binding_file_of_the_right_size_is_read(tmp_path):
    from hal_cpu.buffers import parse_binding
    path = tmp_path / "data.bin"
    path.write_bytes(np.arange(37, dtype="<i4").tobytes())
    assert (parse_binding(f"37xi32=@{path}") == np.arange(37)).all()
