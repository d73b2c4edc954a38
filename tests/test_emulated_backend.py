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
    assert err.fault == kind
    assert err.fault_page == page
    assert words in str(err)
    if kind.startswith("fetch"):
        assert err.pc == function
    # The backend stays usable after a fault.
    cpu.call(store, data)
    assert cpu.read(data, 4) == u32(data)


def test_protection_changes_apply_to_pages_already_used(cpu):
    store, load = code(cpu, STORE), code(cpu, LOAD)
    data = cpu.reserve(2 * PAGE)
    cpu.call(store, data)
    cpu.protect(data, PAGE, PROT_READ)
    assert fault_of(cpu, store, data).fault == "write_protected"
    assert cpu.call(load, data) & 0xFFFFFFFF == data & 0xFFFFFFFF
    cpu.call(store, data + PAGE)            # the other page stays writable
    cpu.protect(data, PAGE, PROT_READ | PROT_WRITE)
    cpu.call(store, data + 4)
    assert cpu.read(data + 4, 4) == u32(data + 4)
    cpu.protect(data, PAGE, PROT_READ | PROT_EXEC)
    assert fault_of(cpu, store, data).fault == "write_protected"
    cpu.release(data)
    assert fault_of(cpu, load, data).fault == "read_unmapped"
    assert fault_of(cpu, store, data + PAGE).fault == "write_unmapped"


def test_code_page_is_not_writable_by_guest(cpu):
    store = code(cpu, STORE)
    assert fault_of(cpu, store, store).fault == "write_protected"


def test_writable_executable_refused(cpu):
    data = cpu.reserve(PAGE)
    with pytest.raises(elfloader.BackendError, match="writable and executable"):
        cpu.protect(data, PAGE, PROT_READ | PROT_WRITE | PROT_EXEC)
