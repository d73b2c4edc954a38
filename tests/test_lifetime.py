"""hal_cpu.Executable over many load/dispatch/close cycles: memory stays
flat, natively and emulated; a closed executable refuses every use with a
LibraryError."""

from __future__ import annotations

import gc
import json
from pathlib import Path

import numpy as np
import pytest

import elfloader
from hal_cpu import Executable, LibraryError

from conftest import process_memory

SAMPLES = Path(__file__).resolve().parent.parent / "hal_cpu" / "samples"
MANIFEST = json.loads((SAMPLES / "manifest.json").read_text())
KERNEL = MANIFEST["kernels"]["mul_add"]
HOST = elfloader.arch.host()
BACKENDS = [pytest.param("emulated", "riscv64", id="emulated-riscv64"),
            pytest.param("native", HOST.name if HOST else None, id="native",
                         marks=pytest.mark.skipif(
                             HOST is None or HOST.name not in KERNEL["per_arch"],
                             reason="no sample for this host"))]
CYCLES = 300
#: Growth allowed over CYCLES cycles after the warm-up.
MAX_RSS_GROWTH = 20 << 20
MAX_VMSIZE_GROWTH = 1 << 30


def _arrays():
    a = np.full(5003, 1.5, np.float32)
    b = np.full(5003, 2.0, np.float32)
    return [a, b, np.zeros(5003, np.float32)]


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs /proc")
@pytest.mark.parametrize("backend,arch", BACKENDS)
def test_load_dispatch_close_cycles_keep_memory_flat(backend, arch):
    entry = KERNEL["per_arch"][arch]
    path = SAMPLES / entry["file"]
    arrays = _arrays()

    def cycle():
        with Executable(path, backend=backend) as exe:
            arrays[2][:] = 0
            exe.dispatch(KERNEL["export"], entry["workgroup_count"], arrays,
                         workers=2)
        assert arrays[2][-1] == 4.5

    for _ in range(20):
        cycle()
    gc.collect()
    before = process_memory()
    for _ in range(CYCLES):
        cycle()
    gc.collect()
    after = process_memory()
    grew = {k: after[k] - before[k] for k in after}
    assert grew["VmRSS"] < MAX_RSS_GROWTH, (before, after)
    assert grew["VmSize"] < MAX_VMSIZE_GROWTH, (before, after)


@pytest.mark.parametrize("backend,arch", BACKENDS)
def test_closed_executable_refuses_every_use(backend, arch):
    entry = KERNEL["per_arch"][arch]
    exe = Executable(SAMPLES / entry["file"], backend=backend)
    exe.close()
    exe.close()                       # closing twice does nothing
    assert "closed" in repr(exe)
    assert exe.exports[0].name == KERNEL["export"]   # metadata stays
    uses = {
        "dispatch": lambda: exe.dispatch(KERNEL["export"],
                                         entry["workgroup_count"], _arrays()),
        "dispatch by ordinal": lambda: exe.dispatch(0, (1, 1, 1), _arrays()),
        "export": lambda: exe.export(KERNEL["export"]),
        "export by ordinal": lambda: exe.export(0),
        "with": lambda: exe.__enter__(),
    }
    for what, use in uses.items():
        with pytest.raises(LibraryError, match="the executable is closed") as info:
            use()
        assert info.value.name == exe.path, what
        assert info.value.field in ("dispatch", "export", "enter"), what
