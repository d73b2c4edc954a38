"""A call recorded once and replayed without the VM
(:mod:`hal_cpu.programs.vm.replay`, ``hal-cpu benchmark-module --replay``):
the same results as the call, native dispatches in one crossing, and the
calls that have no replay refused with the reason."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from fatelf import arches
from hal_cpu.programs import compile_program
from hal_cpu.programs.vm import VmError, load_program
from hal_cpu.programs.vm.replay import NoReplayError, record_replay

from conftest import ROOT

HOST = arches.host()
MLP = ROOT / "bench" / "programs" / "mlp.mlir"
HOST_CODE = ROOT / "tests" / "programs" / "host_code.mlir"
CHECK = ROOT / "tests" / "programs" / "check" / "elementwise.mlir"

pytestmark = pytest.mark.skipif(HOST is None or HOST.name != "x86_64",
                                reason="replays x86_64 kernels natively")


def test_replay_gives_the_call_s_results_in_one_crossing():
    vmfb = compile_program(MLP, "x86_64").vmfb
    rng = np.random.default_rng(5)
    x = rng.standard_normal((4, 16)).astype(np.float32)
    with load_program(vmfb, workers=1) as program:
        predict = program.function("predict")
        want = predict(x)[0]
        replay = record_replay(predict, [x])
        try:
            assert (replay.dispatches, replay.crossings) == (2, 1)
            for _ in range(3):
                replay.run()
                (got,) = replay.results()
                assert got.dtype == want.dtype and got.shape == want.shape
                np.testing.assert_array_equal(got, want)
            # the program still calls as before, its batch included
            np.testing.assert_array_equal(predict(x)[0], want)
        finally:
            replay.close()
    with pytest.raises(VmError, match="the program is closed"):
        replay.run()


def test_replay_of_host_code_reading_device_data_is_refused():
    vmfb = compile_program(HOST_CODE, "x86_64").vmfb
    with load_program(vmfb, workers=1) as program:
        fn = program.function("third_of_square")
        with pytest.raises(NoReplayError) as e:
            record_replay(fn, [np.arange(4, dtype=np.int32)])
        assert e.value.field == "replay"
        # the program is left as it was: a call runs
        assert int(fn(np.arange(4, dtype=np.int32))[0]) == 4


def test_replay_of_a_program_importing_a_host_module_is_refused():
    vmfb = compile_program(CHECK, "x86_64").vmfb
    with load_program(vmfb, workers=1) as program:
        name = next(iter(program.functions))
        fn = program.function(name)
        with pytest.raises(NoReplayError) as e:
            record_replay(fn, [])
        assert "check" in e.value.message


def _bench(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hal_cpu", "benchmark-module",
                           *map(str, args), "--benchmark_min_time=5x"],
                          capture_output=True, text=True, timeout=300)


def test_benchmark_module_replay_says_what_it_timed():
    vmfb = compile_program(MLP, "x86_64").vmfb
    out = _bench(f"--module={vmfb}", "--function=predict", "--input=4x16xf32=1",
                 "--replay")
    assert out.returncode == 0, out.stderr
    assert "replayed: 2 dispatches in 1 crossings" in out.stdout
    assert "5 calls" in out.stdout
    host = compile_program(HOST_CODE, "x86_64").vmfb
    out = _bench(f"--module={host}", "--function=third_of_square",
                 "--input=4xi32=1,2,3,4", "--replay")
    assert out.returncode == 0, out.stderr
    assert "not replayed:" in out.stdout and "5 calls" in out.stdout


def test_replay_runs_a_fill_again():
    vmfb = compile_program(ROOT / "tests" / "programs" / "limits.mlir", "x86_64").vmfb
    with load_program(vmfb, workers=1) as program:
        fn = program.function("sized")
        want = fn(1000)[0]
        replay = record_replay(fn, [1000])
        assert [s[0] for s in replay.steps] == ["fill"]
        view = replay.results()
        replay.run()
        (got,) = replay.results()
        np.testing.assert_array_equal(got, want)
        assert view[0].shape == (1000,)
        replay.close()
