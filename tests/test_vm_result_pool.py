"""hal_cpu.programs.vm.hal_module: a ``queue.alloca`` buffer dropped
without ``queue.dealloca`` (a result a caller drops) gives its storage back
to the module's pool, and only when nothing can reach the storage any
more; a dispatch batch rerun on the same binding addresses."""

from __future__ import annotations

import gc
from pathlib import Path

import numpy as np

from fatelf import arches
from hal_cpu.programs import compile_program
from hal_cpu.programs.vm import load_program
from hal_cpu.programs.vm.hal_module import HalModule

HOST = arches.host_arch()
ANY = -1
DEVICE_LOCAL = 48
DISPATCH_TRANSFER = 3075
MLP = Path(__file__).resolve().parents[1] / "bench" / "programs" / "mlp.mlir"


def _alloca(hal, size=96):
    e = {k[4:]: fn for k, (_, fn) in hal.exports.items()}
    done = e["fence.create"](hal.device, 0)
    buf = e["device.queue.alloca"](hal.device, ANY, None, done, 0, DEVICE_LOCAL,
                                   DISPATCH_TRANSFER, size, 0)
    assert e["fence.query"](done) == 0
    return buf


def test_a_dropped_result_buffer_is_reused_refilled():
    with HalModule(arch=HOST, fill_byte=0xAB) as hal:
        a = _alloca(hal)
        address = a.address
        a.array[:] = 7
        del a
        b = _alloca(hal)
        assert b.address == address
        assert b.array.tolist() == [0xAB] * 96


def test_storage_still_reachable_is_never_reused():
    """A numpy view, a memoryview or an array made over the buffer's
    storage keeps the storage out of the pool: the next allocation gets
    other storage and the view keeps its bytes."""
    with HalModule(arch=HOST, fill_byte=0xAB) as hal:
        makers = [lambda b: b.array[10:20], lambda b: memoryview(b.array),
                  lambda b: np.frombuffer(memoryview(b.array), np.uint8),
                  lambda b: b.array.view(np.uint32)]
        for make in makers:
            a = _alloca(hal)
            a.array[:] = 5
            address = a.address
            view = make(a)
            del a
            gc.collect()
            b = _alloca(hal)
            assert b.address != address
            assert bytes(view)[:4] == b"\x05\x05\x05\x05"
            del view, b


def test_a_deallocated_buffer_is_pooled_once():
    """``queue.dealloca`` already pooled the storage: the buffer object
    going gives nothing back a second time (two allocations never share
    storage)."""
    with HalModule(arch=HOST) as hal:
        e = {k[4:]: fn for k, (_, fn) in hal.exports.items()}
        a = _alloca(hal)
        reached = e["fence.join"](0, ())
        done = e["fence.create"](hal.device, 0)
        e["device.queue.dealloca"](hal.device, ANY, reached, done, a, 0)
        del a
        b, c = _alloca(hal), _alloca(hal)
        assert b.address != c.address


def test_buffers_dropped_after_close_are_not_pooled():
    hal = HalModule(arch=HOST)
    a = _alloca(hal)
    hal.close()
    del a
    assert hal._pool == {}


def test_program_results_dropped_reuse_storage_and_stay_correct(compile_cache):
    """Calls whose results are dropped reuse the result's storage (one
    address call after call); a result kept as an array is not
    overwritten by later calls; each result equals a fresh one."""
    vmfb = compile_program(MLP, HOST, compile_cache).vmfb
    with load_program(vmfb, workers=1) as program:
        fn = program.function("predict")
        x = np.arange(64, dtype=np.float32).reshape(4, 16) / 64
        call, args = fn.prepared_call(x)
        addresses = set()
        for _ in range(5):
            view = call(*args)          # (the program's one result)
            addresses.add(view.buffer.address)
            del view
        assert len(addresses) == 1
        first = fn(x)
        kept = np.array(first, copy=True)
        for _ in range(3):
            again = fn(x * 2)
        assert np.array_equal(first, kept)
        assert np.allclose(fn(x * 2), again)
