"""Guarded memory under emulation: every binding and every worker's local
memory ends at a guard page, with canary bytes between the end and the
page. Real kernels (the bundled samples) given undersized bindings on all
six architectures report which binding, how far past its end, the exact
data address and the worker's workgroup."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import elfloader
import hal_cpu
from elfloader.backend.emulated import EmulatedBackend
from elfloader.diagnose import Region, describe_address
from fatelf import arches
from hal_cpu import BindingOverrunError, Executable, LocalMemoryOverrunError
from hal_cpu.dispatch import DispatchLayout

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_emulated_backend import LOAD, STORE, u32  # noqa: E402

from conftest import emulation_engines  # noqa: E402

#: Every test here runs on both engines (qemu where installed).
pytestmark = pytest.mark.parametrize("each_engine", emulation_engines(),
                                     indirect=True)


@pytest.fixture(autouse=True)
def _engine(each_engine):
    return each_engine


ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ROOT / "hal_cpu" / "samples"
MANIFEST = json.loads((SAMPLES / "manifest.json").read_text())
ARCHES = list(arches.RUNTIME_ARCHES)
FLOAT = 4


def sample(kernel: str, arch: str) -> tuple[Path, str, tuple[int, int, int]]:
    """Path, export name and workgroup count of a bundled sample."""
    k = MANIFEST["kernels"][kernel]
    per = k["per_arch"][arch]
    return SAMPLES / per["file"], k["export"], tuple(per["workgroup_count"])


def digits(arch: str) -> int:
    return 2 * arches.lookup(arch).pointer_size


@pytest.fixture(scope="module", params=ARCHES)
def mul_add(request):
    path, export, grid = sample("mul_add", request.param)
    with Executable(path, backend="emulated") as exe:
        yield exe, export, grid


@pytest.fixture
def inputs():
    rng = np.random.default_rng(7)
    a = rng.uniform(1, 2, 5003).astype(np.float32)
    b = rng.uniform(1, 2, 5003).astype(np.float32)
    return a, b, a * b + a


def test_correct_sizes_pass_and_reuse_ranges(mul_add, inputs):
    exe, export, grid = mul_add
    a, b, want = inputs
    out = np.zeros(5003, np.float32)
    exe.dispatch(export, grid, [a, b, out], workers=1)
    np.testing.assert_allclose(out, want, rtol=1e-6)
    mapped = exe.backend.mapped_bytes
    for _ in range(3):
        out[:] = 0
        exe.dispatch(export, grid, [a, b, out], workers=1)
        np.testing.assert_allclose(out, want, rtol=1e-6)
    assert exe.backend.mapped_bytes == mapped     # the ranges are reused


def test_output_one_byte_short_hits_the_canary(mul_add, inputs):
    """20011 bytes for 5003 floats: the kernel's last store changes the
    first canary byte; seen when the dispatch ends."""
    exe, export, grid = mul_add
    a, b, want = inputs
    out = np.zeros(5003 * FLOAT - 1, np.uint8)
    with pytest.raises(BindingOverrunError) as info:
        exe.dispatch(export, grid, [a, b, out], workers=1)
    err = info.value
    assert isinstance(err, elfloader.EmulationError)
    assert isinstance(err, hal_cpu.HalCpuError)
    assert (err.binding, err.offset, err.length) == (2, 20011, 20011)
    assert (err.name, err.field, err.value) == (exe.path, "bindings[2]", 20011)
    assert err.export == export and err.fault.kind == "overrun" and err.fault.pc is None
    assert err.workgroup is None and err.worker is None
    text = str(err)
    assert text.startswith(f"{exe.path}: bindings[2]: export {export} wrote "
                           "past the end of binding 2")
    assert "binding 2 at offset 20011 of 20011 bytes (1 past the end)" in text
    # What fits was still copied back.
    np.testing.assert_allclose(out[:20008].view(np.float32), want[:5002],
                               rtol=1e-6)
    # The next, correct dispatch is clean (the canary is written again).
    good = np.zeros(5003, np.float32)
    exe.dispatch(export, grid, [a, b, good], workers=1)
    np.testing.assert_allclose(good, want, rtol=1e-6)


@pytest.mark.parametrize("count, offset, note", [
    (4000, 16000, "1 past the end, guard page"),     # guard page at the end
    (3001, 12032, "29 past the end, guard page"),    # canary, then the page
])
def test_output_much_too_small_reaches_the_guard_page(mul_add, inputs, count,
                                                      offset, note):
    exe, export, grid = mul_add
    a, b, _ = inputs
    out = np.zeros(count, np.float32)
    with pytest.raises(BindingOverrunError) as info:
        exe.dispatch(export, grid, [a, b, out], workers=1)
    err = info.value
    arch = exe.arch.name
    length = count * FLOAT
    assert (err.binding, err.offset, err.length) == (2, offset, length)
    assert (err.name, err.field, err.value) == (exe.path, "bindings[2]", offset)
    assert err.fault.kind == "write_unmapped" and err.fault.pc is not None
    report = err.report
    assert report.data_address == err.fault.address
    assert report.data_description == (
        f"binding 2 at offset {offset} of {length} bytes ({note})")
    text = str(err)
    first = text.splitlines()[0]
    assert first.startswith(f"{exe.path}: {arch}: export {export}, workgroup (")
    assert "write to unmapped memory" in first
    addr = f"0x{err.fault.address:0{digits(arch)}x}"
    assert first.endswith(f"at {addr}")
    assert f"  data address: {addr} (binding 2 at offset {offset} of " \
           f"{length} bytes ({note}))" in text
    assert f"  pc:           0x{err.fault.pc:0{digits(arch)}x} " in text
    assert f"{export}+0x" in text
    instruction = next(line for line in text.splitlines()
                       if line.startswith("  instruction:"))
    assert "(unreadable)" not in instruction
    assert "(cannot decode" not in instruction


@pytest.mark.parametrize("index", [0, 1])
def test_input_much_too_small_reaches_the_guard_page(mul_add, inputs, index):
    """3000 floats (12000 bytes): 32 canary bytes, then the guard page at
    offset 12032; the read there stops the CPU."""
    exe, export, grid = mul_add
    a, b, _ = inputs
    bindings = [a, b, np.zeros(5003, np.float32)]
    bindings[index] = bindings[index][:3000].copy()
    with pytest.raises(BindingOverrunError) as info:
        exe.dispatch(export, grid, bindings, workers=1)
    err = info.value
    assert (err.binding, err.offset, err.length) == (index, 12032, 12000)
    assert err.field == f"bindings[{index}]"
    assert err.fault.kind == "read_unmapped"
    assert "read from unmapped memory" in str(err).splitlines()[0]
    assert (f"binding {index} at offset 12032 of 12000 bytes "
            "(33 past the end, guard page)") in str(err)


@pytest.mark.parametrize("arch", ARCHES)
def test_matmul_output_short_by_one_row(arch):
    path, export, grid = sample("matmul", arch)
    rng = np.random.default_rng(3)
    lhs = rng.uniform(1, 2, (13, 17)).astype(np.float32)
    rhs = rng.uniform(1, 2, (17, 11)).astype(np.float32)
    with Executable(path, backend="emulated") as exe:
        out = np.zeros((13, 11), np.float32)
        exe.dispatch(export, grid, [lhs, rhs, out], workers=1)
        np.testing.assert_allclose(out, lhs @ rhs, rtol=1e-5)
        short = np.zeros((12, 11), np.float32)     # 528 bytes: 48 canary bytes
        with pytest.raises(BindingOverrunError) as info:
            exe.dispatch(export, grid, [lhs, rhs, short], workers=1)
    err = info.value
    assert err.binding == 2 and err.length == 528
    assert 528 <= err.offset < 576 and err.fault.kind in ("overrun", "write_unmapped")
    assert f"binding 2 at offset {err.offset} of 528 bytes" in str(err)
    np.testing.assert_allclose(short, (lhs @ rhs)[:12], rtol=1e-5)


# --- several workers ---------------------------------------------------------------
@pytest.mark.parametrize("arch", ARCHES)
def test_fault_in_worker_1_names_its_workgroup(arch):
    """sum_last reads row x (516 bytes) in workgroup x. Given 16 rows and a
    64-wide grid, workgroups 16 and up read the guard page. Worker 0 runs
    the first chunks, then sleeps in its progress report while worker 1
    takes the next ones and faults at workgroup 16: the report names
    worker 1's workgroup, and worker 0 runs no further chunk. (When the
    host descheduled worker 0 long enough for worker 1 to take the chunks
    up to 16, worker 0 faults first, at its own workgroup; the dispatch is
    then tried again.)"""
    path, export, _ = sample("sum_last", arch)
    rows, grid = 16, 64
    data = np.random.default_rng(5).uniform(1, 2, (rows, 129)).astype(np.float32)
    with Executable(path, backend="emulated") as exe:
        for _ in range(5):
            reports = []

            def progress(done, total):
                reports.append(done)
                if len(reports) == 2:
                    time.sleep(1.0)

            with pytest.raises(BindingOverrunError) as info:
                exe.dispatch(export, (grid, 1, 1),
                             [data, np.zeros(grid, np.float32)],
                             workers=2, progress=progress)
            err = info.value
            # The workgroup named is the one whose row read faulted.
            row = err.workgroup[0]
            assert err.workgroup == (row, 0, 0) and row >= rows
            assert err.offset == row * 516 and err.binding == 0
            assert f"export {export}, workgroup ({row}, 0, 0): read from " \
                   "unmapped memory" in str(err)
            if err.worker == 1:
                break
        assert err.worker == 1
        assert err.workgroup == (rows, 0, 0)
        assert (err.offset, err.length) == (rows * 516, rows * 516)
        # The failure stopped worker 0: in the chunk it was running, or
        # after its sleep, before it took another.
        assert len(reports) <= 2
        # The executable still dispatches correctly afterwards.
        full = np.ones((9, 129), np.float32)
        out = np.zeros(9, np.float32)
        exe.dispatch(export, (9, 1, 1), [full, out], workers=2)
        np.testing.assert_allclose(out, 129.0)


# --- local memory ----------------------------------------------------------------
@pytest.fixture(params=ARCHES)
def backend(request):
    be = EmulatedBackend(elfloader.arch.by_name(request.param))
    yield be
    be.close()


def test_guarded_allocation_canary_and_guard(backend):
    """No bundled sample uses local memory: the guarded allocation the
    dispatch layout gives each worker, driven by guest stores."""
    store, load = (backend.place_code(t[backend.arch.name]) for t in (STORE, LOAD))
    addr, check = backend.alloc_guarded(100)
    assert addr % 64 == 0 and backend.read(addr, 100) == bytes(100)
    backend.call(store, addr + 96)            # the last 4 bytes: fine
    check()
    backend.call(store, addr + 100)           # 4 bytes past the end
    with pytest.raises(elfloader.GuardError) as info:
        check()
    err = info.value
    assert (err.address, err.size, err.offset, err.last_offset) == (
        addr, 100, 100, 103)
    assert err.fault.address == addr + 100
    check()                                   # the canary was written again
    guard = addr + 128                        # 100 bytes + 28 canary bytes
    for function, kind in ((store, "write_unmapped"), (load, "read_unmapped")):
        with pytest.raises(elfloader.EmulationError) as info:
            backend.call(function, guard + 8)
        assert info.value.fault.kind == kind
        assert info.value.fault.address == guard + 8
        assert info.value.fault.page == guard
    assert backend.guard_page(guard + 8) == (guard, addr)
    assert backend.guard_page(addr) is None
    backend.release(addr)
    assert backend.guard_page(guard + 8) is None


def test_local_memory_of_each_worker_is_guarded(backend):
    store = backend.place_code(STORE[backend.arch.name])
    layout = DispatchLayout(backend, 1, 0, 2, 100)
    try:
        first, second = layout.local_memory
        backend.call(store, first + 96)
        layout.check_local("k", "kernel.so")
        backend.call(store, second + 101)
        with pytest.raises(LocalMemoryOverrunError) as info:
            layout.check_local("k", "kernel.so")
        err = info.value
        assert (err.worker, err.offset, err.length) == (1, 101, 100)
        assert (err.name, err.field, err.value) == ("kernel.so", "local_memory",
                                                    101)
        assert "local memory at offset 101 of 100 bytes (2 past the end)" \
            in str(err)
        layout.check_local("k", "kernel.so")
    finally:
        layout.close()
    # Whole pages of local memory: the guard page follows at once.
    layout = DispatchLayout(backend, 1, 0, 1, 4096)
    try:
        assert layout.local_checks == []
        local = layout.local_memory[0]
        backend.call(store, local + 4092)
        with pytest.raises(elfloader.EmulationError) as info:
            backend.call(store, local + 4096)
        assert info.value.fault.address == local + 4096
        assert backend.guard_page(local + 4096) == (local + 4096, local)
    finally:
        layout.close()


# --- descriptions ----------------------------------------------------------------
def test_describe_guard_page():
    regions = [Region("binding 0", 0x10040, 0x0FB0),
               Region("guard page", 0x11000, 0x1000, offsets=False, guard=True)]
    assert describe_address(0x11000, regions) == (
        "binding 0 at offset 4032 of 4016 bytes (17 past the end, guard page)")
    assert describe_address(0x10FF4, regions) == (
        "binding 0 at offset 4020 of 4016 bytes (5 past the end)")
    # Far from any buffer, the guard page names itself.
    far = [Region("guard page", 0x90000, 0x1000, offsets=False, guard=True)]
    assert describe_address(0x90010, far) == "guard page"


@pytest.mark.parametrize("arch", ARCHES)
def test_exact_address_of_a_store_to_read_only_memory(arch):
    with EmulatedBackend(elfloader.arch.by_name(arch)) as be:
        store = be.place_code(STORE[arch])
        page = be.reserve(4096)
        be.protect(page, 4096, elfloader.backend.PROT_READ)
        with pytest.raises(elfloader.EmulationError) as info:
            be.call(store, page + 0x7C4)
        err = info.value
        assert err.fault.kind == "write_protected"
        assert (err.fault.page, err.fault.address) == (page, page + 0x7C4)
        # unicorn sees the access's size; a signal under qemu-user does not.
        assert err.fault.size == (4 if be.engine == "unicorn" else None)
        assert f"at {page + 0x7C4:#x}," in str(err)
        # The trap entry is gone after the fault: the CPU goes on as usual.
        data = be.reserve(4096)
        be.call(store, data)
        assert be.read(data, 4) == u32(data)


def _le(*words: int) -> bytes:
    return b"".join(w.to_bytes(4, "little") for w in words)


# kernel(environment, dispatch_state, workgroup_state): store at
# workgroup_state->local_memory + 4096 (one page past the end of one page of
# local memory), return 0. local_memory is at offset 16 of the state.
LOCAL_OVERRUN = {
    "x86_64": bytes.fromhex("488b4210" "898000100000" "31c0" "c3"),
    "x86_32": bytes.fromhex("8b44240c" "8b4010" "898000100000" "31c0" "c3"),
    "aarch64": _le(0xF9400848, 0xB9100108, 0x52800000, 0xD65F03C0),
    "arm32": _le(0xE5923010, 0xE2833A01, 0xE5833000, 0xE3A00000, 0xE12FFF1E),
    "riscv64": _le(0x01063783, 0x000012B7, 0x005787B3, 0x00F7A023, 0x00000513,
                   0x00008067),
    "riscv32": _le(0x01062783, 0x000012B7, 0x005787B3, 0x00F7A023, 0x00000513,
                   0x00008067),
}


@pytest.mark.parametrize("arch", ARCHES)
def test_local_memory_guard_page_fault_report(arch):
    """An export declaring one page of local memory that stores one page
    past its start (a kernel placed by hand in the sample's backend, as the
    samples use no local memory): a LocalMemoryOverrunError with the fault
    report."""
    import dataclasses
    path, export, _ = sample("sum_last", arch)
    with Executable(path, backend="emulated") as exe:
        kernel = exe.backend.place_code(LOCAL_OVERRUN[arch])
        bad = dataclasses.replace(exe.exports[0], address=kernel,
                                  local_memory_pages=1)
        exe.exports[0] = bad
        exe._export_cache = {0: bad, bad.name: bad}
        with pytest.raises(LocalMemoryOverrunError) as info:
            exe.dispatch(0, (1, 1, 1), [np.ones((9, 129), np.float32),
                                        np.zeros(9, np.float32)], workers=1)
    err = info.value
    assert isinstance(err, elfloader.EmulationError)
    assert (err.worker, err.offset, err.length) == (0, 4096, 4096)
    assert (err.name, err.field, err.value) == (exe.path, "local_memory", 4096)
    assert err.fault.kind == "write_unmapped" and err.fault.pc is not None
    text = str(err)
    assert text.splitlines()[0].startswith(
        f"{exe.path}: {arch}: export {export}, workgroup (0, 0, 0): write to "
        "unmapped memory")
    assert (f"  data address: 0x{err.fault.address:0{digits(arch)}x} (local "
            "memory at offset 4096 of 4096 bytes (1 past the end, guard page))"
            ) in text
    store = {"x86_64": 4, "x86_32": 7, "aarch64": 4, "arm32": 8,
             "riscv64": 12, "riscv32": 12}[arch]
    assert f"  pc:           0x{kernel + store:0{digits(arch)}x} (no symbol)" \
        in text


# kernel(...): store 1 MiB below the stack pointer (past the bottom of the
# 1 MiB stack, into the guard page below it), return 0.
STACK_OVERRUN = {
    "x86_64": bytes.fromhex("8984240000f0ff" "31c0" "c3"),
    "x86_32": bytes.fromhex("8984240000f0ff" "31c0" "c3"),
    "aarch64": _le(0xD14403E8, 0xB9000108, 0x52800000, 0xD65F03C0),
    "arm32": _le(0xE24D3601, 0xE5833000, 0xE3A00000, 0xE12FFF1E),
    "riscv64": _le(0x001002B7, 0x405107B3, 0x00F7A023, 0x00000513, 0x00008067),
    "riscv32": _le(0x001002B7, 0x405107B3, 0x00F7A023, 0x00000513, 0x00008067),
}


@pytest.mark.parametrize("arch", ARCHES)
def test_stack_overflow_reaches_the_guard_page(arch):
    import dataclasses
    path, export, _ = sample("sum_last", arch)
    with Executable(path, backend="emulated") as exe:
        be = exe.backend
        kernel = be.place_code(STACK_OVERRUN[arch])
        bad = dataclasses.replace(exe.exports[0], address=kernel)
        exe.exports[0] = bad
        exe._export_cache = {0: bad, bad.name: bad}
        with pytest.raises(elfloader.EmulationError) as info:
            exe.dispatch(0, (1, 1, 1), [np.ones((9, 129), np.float32),
                                        np.zeros(9, np.float32)], workers=1)
        start, size = be.stacks()[0]
        err = info.value
        assert not isinstance(err, hal_cpu.OverrunError)
        below = start - err.fault.address
        assert 0 < below <= be.page_size
        assert be.guard_page(err.fault.address) == (start - be.page_size, start)
        assert (f"(the stack at offset {-below} of {size} bytes ({below} before "
                "the start, guard page))") in str(err)


@pytest.mark.parametrize("arch", ARCHES)
@pytest.mark.parametrize("nbytes", [4096, 432])
def test_access_below_a_binding_reaches_a_guard(arch, nbytes):
    """The pages below a binding's first page are a guard: a read before
    the start that leaves that page faults, attributed to the binding."""
    with EmulatedBackend(elfloader.arch.by_name(arch)) as be:
        load = be.place_code(LOAD[arch])
        address, finish = be.map_array(np.zeros(nbytes, np.uint8))
        below = address - address % be.page_size - 8
        with pytest.raises(elfloader.EmulationError) as info:
            be.call(load, below)
        assert info.value.fault.address == below
        assert be.guard_page(below) == (below - below % be.page_size + 0, address)
        finish()
        # Released, the guard no longer names the range.
        assert be.guard_page(below) is None
