"""The emulated backend: typed faults on every architecture, stores into
data pages, protection changes, bindings, lifetime."""

from __future__ import annotations

import gc
from pathlib import Path

import numpy as np
import pytest

import elfloader
from elfloader.backend import PROT_EXEC, PROT_NONE, PROT_READ, PROT_WRITE
from elfloader.backend.emulated import EmulatedBackend

from conftest import (
    emulation_engines,  # noqa: E402
    process_memory,
)

#: Every test here runs on both engines (qemu where installed).
pytestmark = pytest.mark.parametrize("each_engine", emulation_engines(),
                                     indirect=True)


@pytest.fixture(autouse=True)
def _engine(each_engine):
    return each_engine


ARCHES = ["x86_64", "x86_32", "aarch64", "arm32", "riscv64", "riscv32"]
PREBUILT = Path(__file__).resolve().parent.parent / "sample_plugins" / "prebuilt"
UNMAPPED = 0x7000_0000
PAGE = 4096


def _le(*words: int) -> bytes:
    return b"".join(w.to_bytes(4, "little") for w in words)


# store(p): *(uint32_t *)p = (uint32_t)p
STORE = {
    "x86_64": bytes.fromhex("893f" "c3"),
    "x86_32": bytes.fromhex("8b442404" "8900" "c3"),
    "aarch64": _le(0xB9000000, 0xD65F03C0),
    "arm32": _le(0xE5800000, 0xE12FFF1E),
    "riscv64": _le(0x00A52023, 0x00008067),
    "riscv32": _le(0x00A52023, 0x00008067),
}
# load(p): return *(uint32_t *)p
LOAD = {
    "x86_64": bytes.fromhex("8b07" "c3"),
    "x86_32": bytes.fromhex("8b442404" "8b00" "c3"),
    "aarch64": _le(0xB9400000, 0xD65F03C0),
    "arm32": _le(0xE5900000, 0xE12FFF1E),
    "riscv64": _le(0x00052503, 0x00008067),
    "riscv32": _le(0x00052503, 0x00008067),
}
# pages(p, n): for n pages from p, store the page's address at its start
_RISCV_PAGES = _le(0x00A52023, 0x000012B7, 0x00550533, 0xFFF58593, 0xFE0598E3,
                   0x00008067)
PAGES = {
    "x86_64": bytes.fromhex("893f" "4881c700100000" "ffce" "75f3" "c3"),
    "x86_32": bytes.fromhex("8b442404" "8b4c2408" "8900" "0500100000" "49"
                            "75f6" "c3"),
    "aarch64": _le(0xB9000000, 0x91400400, 0x71000421, 0x54FFFFA1, 0xD65F03C0),
    "arm32": _le(0xE5800000, 0xE2800A01, 0xE2511001, 0x1AFFFFFB, 0xE12FFF1E),
    "riscv64": _RISCV_PAGES,
    "riscv32": _RISCV_PAGES,
}


def u32(value: int) -> bytes:
    return (value & 0xFFFFFFFF).to_bytes(4, "little")


@pytest.fixture(params=ARCHES)
def cpu(request):
    backend = EmulatedBackend(elfloader.arch.by_name(request.param))
    yield backend
    backend.close()


def code(backend, table):
    return backend.place_code(table[backend.arch.name])


def fault_of(backend, function, *args) -> elfloader.EmulationError:
    with pytest.raises(elfloader.EmulationError) as info:
        backend.call(function, *args)
    return info.value


def test_stores_and_loads_on_data_pages(cpu):
    store, load = code(cpu, STORE), code(cpu, LOAD)
    data = cpu.reserve(2 * PAGE)
    for address in (data, data + 12, data + PAGE + 4):
        cpu.call(store, address)
        assert cpu.read(address, 4) == u32(address)
        assert cpu.call(load, address) & 0xFFFFFFFF == address & 0xFFFFFFFF
    small = cpu.alloc(8)
    cpu.call(store, small)
    assert cpu.read(small, 4) == u32(small)


def test_stores_across_many_pages(cpu):
    """One call touching more pages than the TLB holds, several times:
    every store lands (the TLB is refilled and resized on the way)."""
    pages = code(cpu, PAGES)
    n = 1500
    data = cpu.reserve(n * PAGE)
    for _ in range(4):
        cpu.call(pages, data, n)
    got = np.frombuffer(cpu.read(data, n * PAGE), np.uint32).reshape(n, -1)[:, 0]
    want = (data + PAGE * np.arange(n)) & 0xFFFFFFFF
    np.testing.assert_array_equal(got, want)


FAULTS = ["write_protected", "read_protected", "write_unmapped",
          "read_unmapped", "fetch_protected", "fetch_unmapped"]


@pytest.mark.parametrize("kind", FAULTS)
def test_fault_is_typed(cpu, kind):
    store, load = code(cpu, STORE), code(cpu, LOAD)
    data = cpu.reserve(PAGE)
    readonly = cpu.reserve(PAGE)
    cpu.protect(readonly, PAGE, PROT_READ)
    noaccess = cpu.reserve(PAGE)
    cpu.protect(noaccess, PAGE, PROT_NONE)
    function, args, page, words = {
        "write_protected": (store, [readonly + 8], readonly, "read-only"),
        "read_protected": (load, [noaccess + 8], noaccess, "unreadable"),
        "write_unmapped": (store, [UNMAPPED + 8], UNMAPPED, "write to unmapped"),
        "read_unmapped": (load, [UNMAPPED + 8], UNMAPPED, "read from unmapped"),
        "fetch_protected": (data, [], data, "non-executable"),
        "fetch_unmapped": (UNMAPPED, [], UNMAPPED, "fetch from unmapped"),
    }[kind]
    err = fault_of(cpu, function, *args)
    assert err.fault.kind == kind
    assert err.fault.page == page
    assert words in str(err)
    if kind.startswith("fetch"):
        assert err.fault.pc == function
    # The backend stays usable after a fault.
    cpu.call(store, data)
    assert cpu.read(data, 4) == u32(data)


def test_protection_changes_apply_to_pages_already_used(cpu):
    store, load = code(cpu, STORE), code(cpu, LOAD)
    data = cpu.reserve(2 * PAGE)
    cpu.call(store, data)
    cpu.protect(data, PAGE, PROT_READ)
    assert fault_of(cpu, store, data).fault.kind == "write_protected"
    assert cpu.call(load, data) & 0xFFFFFFFF == data & 0xFFFFFFFF
    cpu.call(store, data + PAGE)            # the other page stays writable
    cpu.protect(data, PAGE, PROT_READ | PROT_WRITE)
    cpu.call(store, data + 4)
    assert cpu.read(data + 4, 4) == u32(data + 4)
    cpu.protect(data, PAGE, PROT_READ | PROT_EXEC)
    assert fault_of(cpu, store, data).fault.kind == "write_protected"
    cpu.release(data)
    assert fault_of(cpu, load, data).fault.kind == "read_unmapped"
    assert fault_of(cpu, store, data + PAGE).fault.kind == "write_unmapped"


def test_code_page_is_not_writable_by_guest(cpu):
    store = code(cpu, STORE)
    assert fault_of(cpu, store, store).fault.kind == "write_protected"


def test_writable_executable_refused(cpu):
    data = cpu.reserve(PAGE)
    with pytest.raises(elfloader.BackendError, match="writable and executable"):
        cpu.protect(data, PAGE, PROT_READ | PROT_WRITE | PROT_EXEC)


# --- bindings -------------------------------------------------------------------
@pytest.mark.parametrize("nbytes", [0, 4, 100, 4096, 300 << 10, 1 << 20, 5 << 20])
def test_binding_round_trip(cpu, nbytes):
    store = code(cpu, STORE)
    array = np.arange(nbytes, dtype=np.uint8) ^ 0x5A
    frozen = array.copy()
    frozen.flags.writeable = False
    before = frozen.copy()
    addr, finish = cpu.map_array(array)
    raddr, rfinish = cpu.map_array(frozen)
    assert addr % 64 == 0 and raddr % 64 == 0
    assert cpu.read(addr, nbytes) == array.tobytes()
    if nbytes >= 4:
        cpu.call(store, addr)
        cpu.call(store, raddr)      # the guest may scribble on its copy
    finish()
    rfinish()
    finish()                        # a second finish does nothing
    want = before.copy()
    if nbytes >= 4:
        want[:4] = np.frombuffer(u32(addr), np.uint8)
    np.testing.assert_array_equal(array, want)
    np.testing.assert_array_equal(frozen, before)


def test_binding_ranges_are_reused(cpu):
    base = cpu.mapped_bytes
    big = np.ones(3 << 20, np.uint8)
    addr, finish = cpu.map_array(big)
    assert cpu.mapped_bytes >= big.nbytes
    finish()
    assert cpu.mapped_bytes == base
    again, finish = cpu.map_array(np.zeros(3 << 20, np.uint8))
    assert again == addr            # same range: nothing mapped anew
    assert cpu.read(again, 8) == bytes(8)
    finish()
    small, finish = cpu.map_array(np.ones(1000, np.float32))
    assert small % 64 == 0
    finish()
    assert cpu.mapped_bytes == base


def test_binding_refuses_non_contiguous(cpu):
    with pytest.raises(elfloader.BackendError, match="C-contiguous"):
        cpu.map_array(np.zeros((4, 4), np.float32)[:, 1])


# --- lifetime ---------------------------------------------------------------------
@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs /proc")
def test_load_close_cycles_keep_memory_flat():
    so = PREBUILT / "standalone_x86_64.so"

    def cycle():
        module = elfloader.load(so, backend="emulated")
        backend = module.backend
        backend.call(module.lookup("iree_hal_executable_plugin_query"), 1, 0)
        data, finish = backend.map_array(np.ones(1 << 18, np.float32))
        finish()
        module.close()
        backend.close()

    for _ in range(10):
        cycle()
    gc.collect()
    before = process_memory()
    for _ in range(300):
        cycle()
    gc.collect()
    after = process_memory()
    assert after["VmRSS"] - before["VmRSS"] < 50 << 20, (before, after)
    assert after["VmSize"] - before["VmSize"] < 2 << 30, (before, after)


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs /proc")
def test_close_frees_the_engine_at_once():
    backend = EmulatedBackend(elfloader.arch.by_name("aarch64"))
    backend.call(code(backend, LOAD), backend.reserve(PAGE))
    open_size = process_memory()["VmSize"]
    backend.close()
    # The translation buffer (hundreds of MiB of address space) is gone
    # without waiting for the garbage collector.
    assert open_size - process_memory()["VmSize"] > 64 << 20


def test_use_after_close_raises():
    backend = EmulatedBackend(elfloader.arch.by_name("riscv64"))
    store = code(backend, STORE)
    data = backend.reserve(PAGE)
    fork = backend.fork_cpu()
    backend.close()
    backend.close()                  # twice is fine
    backend.release(data)            # nothing left to free: no error
    assert backend.uc is None
    for use in (lambda: backend.call(store, data),
                lambda: fork.call(store, data),
                lambda: backend.read(data, 4),
                lambda: backend.write(data, b"x"),
                lambda: backend.reserve(PAGE),
                lambda: backend.alloc(16),
                lambda: backend.protect(data, PAGE, PROT_READ),
                lambda: backend.place_code(STORE["riscv64"]),
                lambda: backend.map_array(np.zeros(4)),
                lambda: backend.callback(lambda: 0, 0),
                lambda: backend.fork_cpu(),
                lambda: backend.cpus(2)):
        with pytest.raises(elfloader.BackendError, match="closed"):
            use()


# --- several CPUs -----------------------------------------------------------------
def test_forked_cpu_shares_memory_and_protections(cpu):
    store, load = code(cpu, STORE), code(cpu, LOAD)
    before = cpu.reserve(PAGE)
    fork = cpu.fork_cpu()
    after = cpu.reserve(PAGE)          # mapped after the fork
    fork.call(store, before)
    fork.call(store, after + 8)
    assert cpu.read(before, 4) == u32(before)
    assert cpu.read(after + 8, 4) == u32(after + 8)
    cpu.write(after, u32(0x1234))
    assert fork.call(load, after) & 0xFFFFFFFF == 0x1234
    cpu.protect(after, PAGE, PROT_READ)
    assert fault_of(fork, store, after).fault.kind == "write_protected"
    cpu.release(after)
    assert fault_of(fork, load, after).fault.kind == "read_unmapped"
    assert cpu.call(load, before) & 0xFFFFFFFF == before & 0xFFFFFFFF
    fork.close()
    fork.close()
    with pytest.raises(elfloader.BackendError, match="closed"):
        fork.call(load, before)
    assert cpu.cpus(1) == [cpu.cpu]


def test_cpus_run_calls_from_threads(cpu):
    import threading
    pages = code(cpu, PAGES)
    cpus = cpu.cpus(3)
    assert cpus[0] is cpu.cpu and len(set(map(id, cpus))) == 3
    assert cpu.cpus(3) == cpus          # kept for the next dispatch
    n = 64
    buffers = [cpu.reserve(n * PAGE) for _ in cpus]
    readonly = cpu.reserve(PAGE)
    cpu.protect(readonly, PAGE, PROT_READ)
    errors = []

    def work(i):
        try:
            for _ in range(20):
                cpus[i].call(pages, buffers[i], n)
            with pytest.raises(elfloader.EmulationError):
                cpus[i].call(pages, readonly, 1)
            cpus[i].call(pages, buffers[i], n)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    for buf in buffers:
        got = np.frombuffer(cpu.read(buf, n * PAGE), np.uint32).reshape(n, -1)[:, 0]
        np.testing.assert_array_equal(got, (buf + PAGE * np.arange(n)) & 0xFFFFFFFF)


def test_callback_on_forked_cpu_maps_memory_for_the_guest():
    """A Python callback reached from a forked CPU reserves fresh memory;
    the guest stores into it right after the callback returns."""
    backend = EmulatedBackend(elfloader.arch.by_name("x86_64"))
    try:
        # f(cb, x): p = cb(x); *(uint32_t *)p = (uint32_t)p; return p
        f = backend.place_code(bytes.fromhex(
            "4883ec08" "4889f8" "4889f7" "ffd0" "4883c408" "8900" "c3"))
        made = []

        def fresh(x):
            address = backend.reserve(PAGE) + x
            made.append(address)
            return address

        cb = backend.callback(fresh, 1)
        fork = backend.fork_cpu()
        got = fork.call(f, cb, 24)
        assert got == made[0]
        assert backend.read(got, 4) == u32(got)

        def reenter(x):
            return backend.call(f, cb, x)

        with pytest.raises(elfloader.BackendError, match="call back"):
            fork.call(f, backend.callback(reenter, 1), 0)
    finally:
        backend.close()


SPIN = {   # for (;;);
    "x86_64": bytes.fromhex("ebfe"), "x86_32": bytes.fromhex("ebfe"),
    "aarch64": _le(0x14000000), "arm32": _le(0xEAFFFFFE),
    "riscv64": _le(0x0000006F), "riscv32": _le(0x0000006F),
}


def test_stop_ends_a_call_running_on_another_thread(cpu):
    import threading
    import time
    spin = code(cpu, SPIN)
    fork = cpu.fork_cpu()
    outcome = []

    def work():
        try:
            fork.call(spin)
        except elfloader.EmulationError as exc:
            outcome.append(exc)

    thread = threading.Thread(target=work)
    thread.start()
    deadline = time.monotonic() + 10
    while fork.thread is None and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.05)
    fork.stop()
    thread.join(10)
    assert not thread.is_alive()
    assert outcome and outcome[0].fault.kind == "stopped"
    cpu.cpu.stop()                  # idle: nothing happens
    store = code(cpu, STORE)        # both CPUs still work
    data = cpu.reserve(PAGE)
    fork.call(store, data)
    cpu.call(store, data + 4)
    assert cpu.read(data, 8) == u32(data) + u32(data + 4)


def test_worker_functions_run_on_separate_cpus(cpu):
    import threading
    pages = code(cpu, PAGES)
    functions = cpu.worker_functions(pages, 2, 3)
    assert len(functions) == 3 and len(cpu.cpus(3)) == 3
    n = 16
    buffers = [cpu.reserve(n * PAGE) for _ in functions]
    threads = [threading.Thread(target=f, args=(b, n))
               for f, b in zip(functions, buffers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for buf in buffers:
        assert cpu.read(buf + (n - 1) * PAGE, 4) == u32(buf + (n - 1) * PAGE)
    assert cpu.function(code(cpu, LOAD), 1)(buffers[0]) & 0xFFFFFFFF \
        == buffers[0] & 0xFFFFFFFF
