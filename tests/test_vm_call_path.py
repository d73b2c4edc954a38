"""The per-call path of a loaded program (``Function.__call__``, the hal
module's input and result conversion, queue allocations, the guarded
store): storage reused call after call holds each call's own bytes, an
allocation with no free buffer of its size is filled as any other, and a
failing call raises the same typed error with and without a time limit.

References: numpy (the MLP's math), the module's own ``fill_byte``."""

from __future__ import annotations

import numpy as np
import pytest

from fatelf import arches
from hal_cpu.arrays import GuardedStore
from hal_cpu.programs import compile_program
from hal_cpu.programs.vm import VmError, load_program
from hal_cpu.programs.vm.hal_module import HalModule
from hal_cpu.programs.vm.program import InputMismatchError
from hal_cpu.programs.vm.refs import MemoryBudget

from conftest import ROOT

MLP = ROOT / "bench" / "programs" / "mlp.mlir"
HOST = arches.host_arch()
ANY = -1
DEVICE_LOCAL, DISPATCH_TRANSFER = 0x30, 0x3003


def mlp_reference(x: np.ndarray) -> np.ndarray:
    """``bench/programs/mlp.mlir`` in numpy: x @ 0.05 + 0.1, max with 0.1,
    softmax over the last axis."""
    z = np.maximum(x.astype(np.float64) @ np.full((16, 8), 0.05) + 0.1, 0.1)
    e = np.exp(z - z.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


@pytest.fixture(scope="module")
def mlp(compile_cache):
    with load_program(compile_program(MLP, HOST, compile_cache).vmfb,
                      workers=1) as prog:
        yield prog


def test_each_call_computes_on_its_own_input(mlp):
    """Twenty calls with different inputs (C-ordered, a transposed view, a
    strided slice) each return the reference of their own input, and an
    earlier call's result is not changed by later calls (the input and
    result storage is reused from call to call)."""
    predict = mlp.function("predict")
    rng = np.random.default_rng(7)
    kept = []
    for i in range(20):
        if i % 3 == 0:
            x = rng.standard_normal((4, 16), np.float32)
        elif i % 3 == 1:
            x = rng.standard_normal((16, 4), np.float32).T      # not C-ordered
        else:
            x = rng.standard_normal((8, 16), np.float32)[::2]   # strided
        (got,) = predict(x)
        assert got.shape == (4, 8) and got.dtype == np.float32
        np.testing.assert_allclose(got, mlp_reference(x), rtol=1e-5, atol=1e-6)
        kept.append((x.copy(), got))
    for x, got in kept:
        np.testing.assert_allclose(got, mlp_reference(x), rtol=1e-5, atol=1e-6)


def test_failing_calls_raise_the_same_error_with_and_without_a_time_limit(mlp):
    """An input the function's own check rejects is an InputMismatchError
    naming the function and the shapes, whether or not a time limit is
    set; a wrong argument count a TypeError; the next call runs."""
    predict = mlp.function("predict")
    x = np.ones((4, 16), np.float32)
    messages = []
    for timeout in (None, 30.0, None):
        mlp.timeout = timeout
        with pytest.raises(InputMismatchError) as err:
            predict(np.ones((3, 16), np.float32))
        assert err.value.name is not None
        messages.append(err.value.message)
        with pytest.raises(TypeError, match="takes 1 arguments"):
            predict(x, x)
        np.testing.assert_allclose(predict(x)[0], mlp_reference(x), rtol=1e-5,
                                   atol=1e-6)
    mlp.timeout = None
    assert messages[0] == messages[1] == messages[2]
    assert "@predict" in messages[0] and "[4, 16]" in messages[0]


def test_a_closed_program_refuses_calls(compile_cache):
    prog = load_program(compile_program(MLP, HOST, compile_cache).vmfb, workers=1)
    predict = prog.function("predict")
    prog.close()
    with pytest.raises(VmError, match="closed"):
        predict(np.ones((4, 16), np.float32))


@pytest.mark.parametrize("shape", [(4, 16), (3, 700)])       # small, > 4096 bytes
def test_reused_input_storage_holds_the_new_input(shape):
    """An input's storage, reused once the previous input's view is gone,
    holds the new input's bytes (small inputs are written by the store,
    large ones through a view), and a view of the old one is not changed."""
    with HalModule(arch=HOST) as hal:
        a = np.arange(np.prod(shape), dtype=np.float32).reshape(shape)
        view = hal.wrap_input(a)
        address = view.buffer.address
        del view
        b = -a
        view = hal.wrap_input(b)
        assert view.buffer.address == address          # (the same storage)
        np.testing.assert_array_equal(hal.to_numpy(view), b)
        held = hal.wrap_input(a)                        # (other storage)
        assert held.buffer.address != view.buffer.address
        np.testing.assert_array_equal(hal.to_numpy(held), a)
        np.testing.assert_array_equal(hal.to_numpy(view), b)


def test_guarded_store_writes_the_data_it_is_given():
    """``take(size, what, data)``: the bytes are written into the storage,
    on a new reservation and on a reused one; a ``data`` of the wrong
    length is refused (ValueError) and the reservation stays usable."""
    store = GuardedStore(MemoryBudget(1 << 24))
    try:
        first = bytes(range(100))
        arr, address = store.take(100, "test", first)
        assert arr.tobytes() == first and address % 64 == 0
        del arr
        second = bytes(range(100, 200))
        arr, again = store.take(100, "test", second)
        assert again == address and arr.tobytes() == second
        del arr
        with pytest.raises(ValueError):
            store.take(100, "test", b"short")
        arr, again = store.take(100, "test")
        assert again == address and arr.size == 100
    finally:
        store.close()


def test_queue_allocations_are_filled_with_or_without_a_free_buffer():
    """``queue.alloca`` of a size with no free buffer (none deallocated
    yet), and of one whose buffer went back to the pool, both give
    storage filled with the module's fill byte."""
    with HalModule(arch=HOST, fill_byte=0xAB) as hal:
        e = {k[4:]: fn for k, (_, fn) in hal.exports.items()}
        dev = hal.device

        def alloca():
            done = e["fence.create"](dev, 0)
            buf = e["device.queue.alloca"](dev, ANY, None, done, 0, DEVICE_LOCAL,
                                           DISPATCH_TRANSFER, 96, 0)
            assert e["fence.query"](done) == 0
            return buf
        a, b = alloca(), alloca()                   # (no free buffer: both new)
        assert a.address != b.address
        for buf in (a, b):
            assert buf.array.tolist() == [0xAB] * 96
        a.array[:] = 1
        reached = e["fence.join"](0, ())
        done = e["fence.create"](dev, 0)
        e["device.queue.dealloca"](dev, ANY, reached, done, a, 0)
        address = a.address
        del a
        c = alloca()                                # (the freed one, refilled)
        assert c.address == address
        assert c.array.tolist() == [0xAB] * 96
