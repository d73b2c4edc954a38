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


def _indirect_world(hal):
    """A finalized command buffer filling slot 0 bytes [0, 64) with 0x11
    and slot 1 bytes [8, 40) with 0x22; buffers of 128 and 64 bytes."""
    e = {k[4:]: fn for k, (_, fn) in hal.exports.items()}
    dev = hal.device
    cb = e["command_buffer.create"](dev, 0, 0, ANY, 2)
    e["command_buffer.fill_buffer"](cb, None, 0, 64, 0, 0x11, 1, 0)
    e["command_buffer.fill_buffer"](cb, None, 8, 32, 1, 0x22, 1, 0)
    e["command_buffer.finalize"](cb)
    a, b = _alloca(hal, 128), _alloca(hal, 64)
    a.array[:] = 0
    b.array[:] = 0
    return dev, cb, a, b


def test_execute_indirect_inline_behaves_as_its_import():
    """The inline form of ``queue.execute.indirect`` (a table of buffers
    checked at the call site) gives what a call of the import gives, for
    usual and hostile tables, devices, command buffers and fences: the
    same result or error (type, status code, message), the same bytes
    written and the same signal fence state."""
    from test_vm_inline import _inline_function, _outcome, _same

    from hal_cpu.programs.vm.hal_module import Fence

    def cases(dev, cb, a, b):
        view = object()
        tables = [((a, 0, 128), (b, 0, 64)), ((a, 0, -1), (b, 0, -1)),
                  ((a, 64, 64), (b, 0, 64)), ((a, 100, 64), (b, 0, 64)),
                  ((a, -1, 10), (b, 0, 64)), ((a, 0, -5), (b, 0, 64)),
                  ((None, 0, 0), (b, 0, 64)), ((a, 0, 32), (b, 0, 64)),
                  ((a, 0, 128),), ((view, 0, 1), (b, 0, 64)),
                  ((a, 0, 128), (b, 8, 32)), ((a, 0, 128), (b, 9, 32)),
                  ((a, 0, 128), (b, 0, 64), (a, 0, 8))]
        out = [(dev, ANY, None, Fence(), cb, 0, t) for t in tables]
        good = tables[0]
        failed = Fence(None, 13)
        failed.message = "failed before"
        out += [(None, ANY, None, Fence(), cb, 0, good),
                (dev, ANY, None, Fence(), a, 0, good),
                (dev, ANY, Fence(None, 0), Fence(), cb, 0, good),
                (dev, ANY, Fence(), Fence(), cb, 0, good),
                (dev, ANY, failed, Fence(), cb, 0, good),
                (dev, ANY, None, None, cb, 0, good),
                (dev, ANY, None, view, cb, 0, good),
                (dev, ANY, view, Fence(), cb, 0, good)]
        return out

    with HalModule(arch=HOST) as h1, HalModule(arch=HOST) as h2:
        w1, w2 = _indirect_world(h1), _indirect_world(h2)
        n = len(cases(*w1))
        inlined = raised = 0
        for i in range(n):
            args1, args2 = cases(*w1)[i], cases(*w2)[i]
            want = _outcome(h1.device_queue_execute_indirect, args1)
            inline = _inline_function("device_queue_execute_indirect", h2, args2)
            if inline is None:
                got = _outcome(h2.device_queue_execute_indirect, args2)
            else:
                inlined += 1
                got = _outcome(inline, args2)
            raised += want[0] == "raise"
            assert _same(want, got), (i, want, got)
            for x, y in zip(w1[2:], w2[2:]):
                assert x.array.tobytes() == y.array.tobytes(), i
            s1, s2 = args1[3], args2[3]
            if type(s1) is Fence:
                assert (s1.code, s1.message) == (s2.code, s2.message), i
            if i == 0:      # (the usual call ran its commands)
                assert w2[2].array[:65].tolist() == [0x11] * 64 + [0]
                assert w2[3].array[7:41].tolist() == [0] + [0x22] * 32 + [0]
            for x in w1[2:] + w2[2:]:
                x.array[:] = 0
        assert inlined == n and raised >= 8
