"""The public prepared dispatch (``Executable.prepare`` ->
``PreparedDispatch``): checked once, run many times on arrays, buffers or
(address, length) pairs, natively in place and emulated through guarded
guest ranges it keeps; the errors of bad arguments, overruns and a closed
executable."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import elfloader
import hal_cpu
from hal_cpu import (
    BindingOverrunError,
    DispatchError,
    Executable,
    LibraryError,
)
from hal_cpu.dispatch_policy import PreparedDispatch
from hal_cpu.errors import ExportNotFoundError

from conftest import ROOT, emulation_engines

SAMPLES = ROOT / "hal_cpu" / "samples"
HOST = elfloader.arch.host()
ROWS, COLS = 9, 129
GRID = (ROWS, 1, 1)


def _sample(arch: str):
    path = SAMPLES / f"sum_last_{arch}.so"
    if not path.exists():
        pytest.skip(f"no bundled sample for {arch}")
    return path


@pytest.fixture
def native():
    if HOST is None:
        pytest.skip("no native backend for this host")
    with Executable(_sample(HOST.name), backend="native") as exe:
        yield exe


@pytest.fixture(params=emulation_engines())
def emulated(request):
    with Executable(_sample("aarch64"), backend="emulated",
                    engine=request.param) as exe:
        yield exe


def _arrays(scale: float = 1.0):
    x = hal_cpu.asarray(np.arange(ROWS * COLS, dtype=np.float32)
                        .reshape(ROWS, COLS) / 100 * scale)
    return x, hal_cpu.zeros(ROWS, np.float32)


def _pairs(*arrays):
    return [(a.ctypes.data, a.nbytes) for a in arrays]


def _check(x, out):
    np.testing.assert_allclose(out, x.sum(axis=1), rtol=1e-5)


def _prepare(exe, **kw) -> PreparedDispatch:
    x, out = _arrays()
    return exe.prepare(0, GRID, (), [x.nbytes, out.nbytes], **kw)


def test_native_runs_again_on_new_bindings_in_place(native):
    prepared = _prepare(native, workers=1)
    assert isinstance(prepared, PreparedDispatch)
    assert prepared.total == ROWS and prepared.binding_count == 2
    for i in range(4):
        x, out = _arrays(i + 1)
        if i % 2:
            prepared.run([x, out])
        else:
            pointers, lengths = zip(*_pairs(x, out))
            prepared.run_addresses(list(pointers), list(lengths))
        _check(x, out)
    # pairs through run, and lengths taken from prepare
    x, out = _arrays(5)
    prepared.run(_pairs(x, out))
    _check(x, out)
    x, out = _arrays(6)
    prepared.run_addresses([x.ctypes.data, out.ctypes.data])
    _check(x, out)
    assert native.last_workers == 1
    assert prepared.guarded_ranges == []          # (natively none)


def test_native_copies_what_it_cannot_use_in_place(native):
    prepared = native.prepare(0, GRID, (), 2)
    x, _ = _arrays()
    plain = np.zeros(ROWS + 1, np.float32)[1:]     # not 64-byte aligned
    assert plain.ctypes.data % 64
    prepared.run([x, plain])
    _check(x, plain)
    raw = bytearray(ROWS * 4)
    prepared.run([x.tobytes(), raw])
    _check(x, np.frombuffer(raw, np.float32))
    # a read-only output is never written
    out = hal_cpu.zeros(ROWS, np.float32)
    out.flags.writeable = False
    prepared.run([x, out])
    assert not out.any()


def test_native_time_limit_progress_and_workers(native):
    rows = 4096
    x = hal_cpu.asarray(np.ones((rows, COLS), np.float32))
    out = hal_cpu.zeros(rows, np.float32)
    seen = []
    prepared = native.prepare(0, (rows, 1, 1), (), [x.nbytes, out.nbytes],
                              workers=2)
    prepared.run([x, out], timeout=30, progress=lambda d, t: seen.append((d, t)))
    np.testing.assert_allclose(out, COLS)
    # (worker 0 reports the workgroups done when it ends a chunk)
    assert seen and all(0 < d <= t == rows for d, t in seen)
    out[:] = 0
    prepared.run_addresses([x.ctypes.data, out.ctypes.data], timeout=30)
    np.testing.assert_allclose(out, COLS)
    assert native.last_workers == 2


def test_native_threads_share_one_prepared_dispatch(native):
    prepared = _prepare(native, workers=1)
    errors = []

    def work(scale):
        try:
            for _ in range(200):
                x, out = _arrays(scale)
                prepared.run_addresses([x.ctypes.data, out.ctypes.data])
                _check(x, out)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
    threads = [threading.Thread(target=work, args=(s,)) for s in (1, 2, 3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors


def test_bad_arguments(native):
    x, out = _arrays()
    with pytest.raises(ExportNotFoundError):
        native.prepare("nope", GRID, (), 2)
    with pytest.raises(DispatchError) as info:
        native.prepare(0, (9.0, 1, 1), (), 2)
    assert info.value.field == "workgroup_count"
    with pytest.raises(DispatchError) as info:
        native.prepare(0, GRID, (), 1)                 # fewer than declared
    assert info.value.field == "bindings" and info.value.value == 1
    for bad in ([-1, 4], ["a", 4], 2.0):
        with pytest.raises(DispatchError) as info:
            native.prepare(0, GRID, (), bad)
        assert info.value.field == "bindings"
    with pytest.raises(DispatchError) as info:
        native.prepare(0, GRID, (2 ** 32,), 2)
    assert info.value.field == "constants[0]"
    with pytest.raises(DispatchError) as info:
        native.prepare(0, GRID, (), 2, workers=0)
    assert info.value.field == "workers"
    prepared = native.prepare(0, GRID, (), 2)
    with pytest.raises(DispatchError) as info:
        prepared.run([x])
    assert info.value.field == "bindings"
    with pytest.raises(DispatchError) as info:
        prepared.run([(x.ctypes.data, -4), (out.ctypes.data, out.nbytes)])
    assert info.value.field == "bindings[0]"
    with pytest.raises(DispatchError) as info:
        prepared.run_addresses([x.ctypes.data, out.ctypes.data])
    assert info.value.field == "lengths"              # none given, none kept
    with pytest.raises(DispatchError):
        prepared.run([x, out[::2]])                     # strided
    with pytest.raises(DispatchError):
        prepared.run([x, out], timeout=-1)
    prepared.run([x, out])
    _check(x, out)


def test_closed_executable(native):
    prepared = _prepare(native)
    x, out = _arrays()
    prepared.run([x, out])
    native.close()
    with pytest.raises(LibraryError):
        prepared.run([x, out])
    with pytest.raises(LibraryError):
        prepared.run_addresses([x.ctypes.data, out.ctypes.data])
    with pytest.raises(LibraryError):
        native.prepare(0, GRID, (), 2)


def test_empty_grid_runs_nothing(native):
    x, out = _arrays()
    out[:] = 7
    native.prepare(0, (0, 1, 1), (), 2).run([x, out])
    assert (out == 7).all()


def test_emulated_keeps_its_guarded_ranges(emulated):
    prepared = _prepare(emulated, workers=1)
    x, out = _arrays()
    prepared.run_addresses([x.ctypes.data, out.ctypes.data])
    _check(x, out)
    ranges = prepared.guarded_ranges
    assert len(ranges) == 2 and all(r % 64 == 0 for r in ranges)
    for scale in (2, 3):
        x, out = _arrays(scale)
        prepared.run_addresses([x.ctypes.data, out.ctypes.data])
        _check(x, out)
        assert prepared.guarded_ranges == ranges        # the same ranges
    # arrays and pairs through run, and a read-only binding not copied back
    x, out = _arrays(4)
    prepared.run([x, out])
    _check(x, out)
    x, out = _arrays(5)
    prepared.run(_pairs(x, out))
    _check(x, out)
    out[:] = 0
    prepared.run_addresses([x.ctypes.data, out.ctypes.data],
                           writable=[False, False])
    assert not out.any()
    # other lengths than prepared: copies made for the run
    big = hal_cpu.zeros(ROWS + 16, np.float32)
    prepared.run_addresses([x.ctypes.data, big.ctypes.data],
                           [x.nbytes, big.nbytes])
    _check(x, big[:ROWS])
    assert prepared.guarded_ranges == ranges
    prepared.close()
    assert prepared.guarded_ranges == []
    prepared.run_addresses([x.ctypes.data, out.ctypes.data])
    _check(x, out)
    assert len(prepared.guarded_ranges) == 2


def test_emulated_overrun_is_reported(emulated):
    x, _ = _arrays()
    # the kernel writes 9 floats into a binding of 8
    short = hal_cpu.zeros(ROWS - 1, np.float32)
    prepared = emulated.prepare(0, GRID, (), [x.nbytes, short.nbytes])
    with pytest.raises(BindingOverrunError) as info:
        prepared.run_addresses([x.ctypes.data, short.ctypes.data])
    assert info.value.name == emulated.path
    with pytest.raises(BindingOverrunError):
        prepared.run([x, short])
    # and the next good run is not disturbed
    x, out = _arrays()
    good = emulated.prepare(0, GRID, (), [x.nbytes, out.nbytes])
    good.run_addresses([x.ctypes.data, out.ctypes.data])
    _check(x, out)


def test_emulated_close_frees_the_ranges(emulated):
    prepared = _prepare(emulated)
    x, out = _arrays()
    prepared.run_addresses([x.ctypes.data, out.ctypes.data])
    assert prepared.guarded_ranges
    emulated.close()
    with pytest.raises(LibraryError):
        prepared.run_addresses([x.ctypes.data, out.ctypes.data])
