"""A dispatch repeated with the same export, grid object, workers and
constants takes a shorter path natively (``Executable._repeat``); every
check of its bindings still applies, and what changed is seen."""

from __future__ import annotations

import numpy as np
import pytest

import elfloader
import hal_cpu
from hal_cpu import DispatchError, Executable, LibraryError
from hal_cpu.errors import ExportNotFoundError
from hal_cpu.plugins import PluginManager
from hal_cpu.programs import compile_program
from hal_cpu.programs.vm import plan_program

from conftest import ROOT, SIMPLE_MUL

SAMPLES = ROOT / "hal_cpu" / "samples"
HOST = elfloader.arch.host()
EXAMPLE = ROOT / "sample_plugins" / "standalone_example.mlir"


@pytest.fixture
def exe():
    path = SAMPLES / f"sum_last_{HOST.name}.so" if HOST is not None else None
    if path is None or not path.exists():
        pytest.skip("no bundled sample for this host")
    with Executable(path, backend="native") as e:
        yield e


def _arrays():
    x = hal_cpu.asarray(np.arange(9 * 129, dtype=np.float32).reshape(9, 129)
                        / 100)
    return x, hal_cpu.zeros(9, np.float32)


def _expected(x):
    return x.sum(axis=1)


def _repeats(exe, monkeypatch) -> list[bool]:
    """Record what every _repeat call returned."""
    seen = []
    original = Executable._repeat

    def spy(self, q, bindings):
        try:
            done = original(self, q, bindings)
        except Exception:
            seen.append("raised")
            raise
        seen.append(done)
        return done
    monkeypatch.setattr(Executable, "_repeat", spy)
    return seen


def test_repeated_dispatch_takes_the_short_path(exe, monkeypatch):
    seen = _repeats(exe, monkeypatch)
    x, out = _arrays()
    grid = (9, 1, 1)
    for i in range(5):
        out[:] = 0
        x[0, 0] = i
        exe.dispatch(0, grid, [x, out])
        np.testing.assert_allclose(out, _expected(x), rtol=1e-5)
    assert seen == [True] * 4
    assert exe.last_workers == 1


def test_an_equal_grid_tuple_takes_the_short_path(exe, monkeypatch):
    seen = _repeats(exe, monkeypatch)
    x, out = _arrays()
    n = 9
    for _ in range(3):
        out[:] = 0
        exe.dispatch(0, (n, 1, 1), [x, out])
        np.testing.assert_allclose(out, _expected(x), rtol=1e-5)
    assert seen == [True, True]
    for grid in ((9.0, 1, 1), (True, 1, 1), [9, 1, 1], (np.int64(9), 1, 1)):
        out[:] = 0
        if type(grid[0]) in (float, bool):
            with pytest.raises(DispatchError):
                exe.dispatch(0, grid, [x, out])
        else:
            exe.dispatch(0, grid, [x, out])
            np.testing.assert_allclose(out, _expected(x), rtol=1e-5)
    assert seen == [True, True]


def test_new_arrays_and_contents_are_seen(exe, monkeypatch):
    seen = _repeats(exe, monkeypatch)
    grid = (9, 1, 1)
    x, out = _arrays()
    exe.dispatch(0, grid, [x, out])
    for _ in range(3):
        x2, out2 = _arrays()
        x2 *= 3
        exe.dispatch(0, grid, [x2, out2])
        np.testing.assert_allclose(out2, _expected(x2), rtol=1e-5)
    np.testing.assert_allclose(out, _expected(x), rtol=1e-5)
    assert seen == [True] * 3
    # The same list, an element replaced.
    bindings = [x, out]
    exe.dispatch(0, grid, bindings)
    out3 = hal_cpu.zeros(9, np.float32)
    bindings[1] = out3
    exe.dispatch(0, grid, bindings)
    np.testing.assert_allclose(out3, _expected(x), rtol=1e-5)


def test_read_only_and_unaligned_bindings_leave_the_short_path(exe, monkeypatch):
    seen = _repeats(exe, monkeypatch)
    grid = (9, 1, 1)
    x, out = _arrays()
    exe.dispatch(0, grid, [x, out])
    exe.dispatch(0, grid, [x, out])
    assert seen == [True]
    # An output made read-only is never written.
    out[:] = 0
    out.flags.writeable = False
    exe.dispatch(0, grid, [x, out])
    assert not out.any() and seen[-1] is False
    out.flags.writeable = True
    # A plain (unaligned) array is copied in and out.
    plain = np.zeros(10, np.float32)[1:]
    assert plain.ctypes.data % 64
    exe.dispatch(0, grid, [x, plain])
    np.testing.assert_allclose(plain, _expected(x), rtol=1e-5)
    assert seen[-1] is False
    # bytes and a bytearray of the right size.
    raw = bytearray(36)
    exe.dispatch(0, grid, [x, raw])
    np.testing.assert_allclose(np.frombuffer(raw, np.float32), _expected(x),
                               rtol=1e-5)
    exe.dispatch(0, grid, [x.tobytes(), out])
    np.testing.assert_allclose(out, _expected(x), rtol=1e-5)
    # And back on the short path.
    exe.dispatch(0, grid, [x, out])
    exe.dispatch(0, grid, [x, out])
    assert seen[-1] is True


def test_bad_arguments_are_still_refused(exe):
    grid = (9, 1, 1)
    x, out = _arrays()
    exe.dispatch(0, grid, [x, out])
    exe.dispatch(0, grid, [x, out])
    with pytest.raises(DispatchError):
        exe.dispatch(0, grid, [x])                          # too few bindings
    with pytest.raises(DispatchError):
        exe.dispatch(0, grid, [x, out[::2]])                # strided
    with pytest.raises(DispatchError):
        exe.dispatch(0, (9.0, 1, 1), [x, out])              # not integers
    with pytest.raises(DispatchError):
        exe.dispatch(0, (True, 1, 1), [x, out])
    with pytest.raises(ExportNotFoundError):
        exe.dispatch(0.0, grid, [x, out])
    with pytest.raises(ExportNotFoundError):
        exe.dispatch(5, grid, [x, out])
    with pytest.raises(DispatchError):
        exe.dispatch(0, grid, [x, out], (2 ** 32,))         # not a uint32
    with pytest.raises(DispatchError):
        exe.dispatch(0, grid, [x, out], workers=0)
    out[:] = 0
    exe.dispatch(0, grid, [x, out])
    np.testing.assert_allclose(out, _expected(x), rtol=1e-5)
    exe.close()
    with pytest.raises(LibraryError):
        exe.dispatch(0, grid, [x, out])


def test_grids_sharing_a_layout_each_write_their_state(exe, monkeypatch):
    """The export by ordinal with one grid, by name with another: each
    dispatch runs its own grid, also when both alternate on one layout."""
    seen = _repeats(exe, monkeypatch)
    name = exe.exports[0].name
    x, out = _arrays()
    full, part = (9, 1, 1), (4, 1, 1)
    for _ in range(3):
        out[:] = 0
        exe.dispatch(0, full, [x, out])
        np.testing.assert_allclose(out, _expected(x), rtol=1e-5)
        out[:] = 0
        exe.dispatch(name, part, [x, out])
        np.testing.assert_allclose(out[:4], _expected(x)[:4], rtol=1e-5)
        assert not out[4:].any()
    assert seen == [True] * 4
    out[:] = 0
    exe.dispatch(0, full, [x, out], workers=1)      # a new record for 0
    np.testing.assert_allclose(out, _expected(x), rtol=1e-5)
    assert len(seen) == 4


def test_closed_backend_raises(exe):
    """The backend closed under the executable: an error, not a write into
    memory that is gone."""
    grid = (9, 1, 1)
    x, out = _arrays()
    exe.dispatch(0, grid, [x, out])
    exe.dispatch(0, grid, [x, out])
    exe.backend.close()
    with pytest.raises(elfloader.BackendError):
        exe.dispatch(0, grid, [x, out])


@pytest.mark.skipif(HOST is None or HOST.name != "x86_64",
                    reason="native x86_64 plugin callbacks")
def test_python_imports_on_the_short_path(compile_cache, monkeypatch):
    """A kernel calling Python imports: a failing workgroup and an
    exception raised by the import reach the caller of a repeated
    dispatch."""
    n = 64 * 20
    a = hal_cpu.full(n, 1, np.float32)
    b = hal_cpu.full(n, 2, np.float32)
    fail = []

    def mul(params, context):
        tid = params.struct(SIMPLE_MUL)["tid"]
        if fail and tid == 11:
            if fail[0] == "raise":
                raise RuntimeError("from the import")
            return 7
        return 0

    comp = compile_program(EXAMPLE, "x86_64", compile_cache)
    with PluginManager("x86_64") as plugins:
        plugins.register_python({"simple_mul_workgroup": mul})
        # (the plan loads the executables: their imports must resolve)
        plan = plan_program(comp, [a, b], "mixed_invocation", plugins=plugins)
        d = plan.dispatches[0]
        grid = tuple(d.workgroup_count)
        consts = tuple(d.constants)
        with Executable(d.so_path, plugins=plugins) as exe:
            seen = _repeats(exe, monkeypatch)
            arrays = [hal_cpu.zeros(bd.length, np.uint8) if bd.kind != "input"
                      else (a, b)[bd.ref] for bd in d.bindings]
            for _ in range(3):
                exe.dispatch(d.export_name, grid, arrays, consts, workers=1)
            fail.append(7)
            with pytest.raises(DispatchError) as info:
                exe.dispatch(d.export_name, grid, arrays, consts, workers=1)
            assert info.value.value == (11, 0, 0)
            fail[0] = "raise"
            with pytest.raises(RuntimeError, match="from the import"):
                exe.dispatch(d.export_name, grid, arrays, consts, workers=1)
            fail.clear()
            exe.dispatch(d.export_name, grid, arrays, consts, workers=1)
    assert seen == [True, True, "raised", "raised", True]


def test_one_slow_dispatch_does_not_share_the_next(exe, monkeypatch):
    """Default workers: a small grid is shared after two slow dispatches in
    a row (each over SHARE_SECONDS), not after one."""
    if exe._default_workers < 2:
        pytest.skip("one CPU")
    from hal_cpu import dispatch, dispatch_policy
    now, step = [0.0], [1e-6]

    def clock():
        now[0] += step[0] / 2      # two readings per dispatch
        return now[0]
    # (the first dispatch is timed by the general path, the repeats by the
    # fast one: both PreparedDispatch's)
    monkeypatch.setattr(dispatch_policy, "_perf_counter", clock)
    x, out = _arrays()
    grid = (9, 1, 1)

    def run(seconds):
        step[0] = seconds
        out[:] = 0
        exe.dispatch(0, grid, [x, out])
        np.testing.assert_allclose(out, _expected(x), rtol=1e-5)
        return exe.last_workers
    slow = 10 * dispatch.SHARE_SECONDS
    assert [run(1e-6) for _ in range(3)] == [1, 1, 1]
    assert run(slow) == 1
    assert run(1e-6) == 1            # one slow dispatch: still one worker
    assert [run(1e-6) for _ in range(3)] == [1, 1, 1]
    assert run(slow) == 1
    assert run(slow) == 1
    assert run(1e-6) == 2            # after two in a row: shared
