"""Dispatch through the runtime support library's workgroup loop: grids of
every shape, failures in the middle of a grid, several workers, long grids
and Ctrl-C."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from hal_cpu import DispatchError, Executable
from hal_cpu import dispatch as dispatch_mod
from hal_cpu.plugins import PluginManager
from hal_cpu.programs import compile_program
from hal_cpu.programs.vm import plan_program

from conftest import ROOT, SIMPLE_MUL, default_sigint, process_memory
from program_specs import PROGRAMS

EXAMPLE = ROOT / "sample_plugins" / "standalone_example.mlir"
SAMPLES = ROOT / "hal_cpu" / "samples"


@pytest.fixture
def eager_threads(monkeypatch):
    """Start worker threads from the first workgroup on, so that small test
    grids really run on several threads."""
    monkeypatch.setattr(dispatch_mod, "THREAD_SECONDS", 0.0)
    monkeypatch.setitem(dispatch_mod.FIRST_CHUNK, "native", 1)
    monkeypatch.setitem(dispatch_mod.FIRST_CHUNK, "emulated", 1)


def _run_program(compiled, name, arch, backend, workers, rng):
    spec = PROGRAMS[name]
    c = compiled(name, arch)
    inputs = spec.make_inputs(rng)
    plan = plan_program(c, inputs)
    outs = []
    for d in plan.dispatches:
        with Executable(d.so_path, backend=backend) as exe:
            arrays = []
            for b in d.bindings:
                if b.kind == "input":
                    arrays.append(np.ascontiguousarray(inputs[b.ref]))
                else:
                    arrays.append(np.zeros(b.length, np.uint8))
            exe.dispatch(d.export_name, d.workgroup_count, arrays, d.constants,
                         workers=workers)
            outs.append([a.copy() for a in arrays])
    return outs


@pytest.mark.parametrize("arch,backend", [("x86_64", "native"),
                                          ("riscv64", "emulated"),
                                          ("arm32", "emulated")])
@pytest.mark.parametrize("name", ["matmul", "mul_add", "sum_last", "add_i32"])
def test_workers_give_bit_identical_results(compiled, name, arch, backend,
                                            eager_threads):
    """workers=2 (threads from the first workgroup; under emulation each
    with its own CPU) equals workers=1 bit for bit; single-dispatch programs
    write disjoint outputs."""
    one = _run_program(compiled, name, arch, backend, 1,
                       np.random.default_rng(3))
    two = _run_program(compiled, name, arch, backend, 2,
                       np.random.default_rng(3))
    for a, b in zip(one, two):
        for x, y in zip(a, b):
            assert x.tobytes() == y.tobytes()


@pytest.mark.parametrize("backend", ["native", "emulated"])
def test_grid_shapes(backend):
    """Empty, single and non-cubic grids of a real kernel: sum_last's 9 rows
    are covered by 9x1x1, and by 3x3x1 / 1x3x3 grids only when the kernel
    reads workgroup ids the same way (it uses x alone): ids past x=2 are not
    reached, so those rows stay zero."""
    path = SAMPLES / "sum_last_x86_64.so"
    x = np.random.default_rng(0).standard_normal((9, 129)).astype(np.float32)
    with Executable(path, backend=backend) as exe:
        out = np.zeros(9, np.float32)
        exe.dispatch(0, (0, 1, 1), [x, out])
        exe.dispatch(0, (5, 0, 3), [x, out])
        assert not out.any()
        exe.dispatch(0, (1, 1, 1), [x, out])
        np.testing.assert_allclose(out[0], x[0].sum(), rtol=1e-5)
        assert not out[1:].any()
        exe.dispatch(0, (9, 1, 1), [x, out])
        np.testing.assert_allclose(out, x.sum(axis=1), rtol=1e-5)
        # a 3x2x2 grid: x ids 0..2 in every (y, z) -> rows 0..2 written
        out[:] = 0
        exe.dispatch(0, (3, 2, 2), [x, out])
        np.testing.assert_allclose(out[:3], x[:3].sum(axis=1), rtol=1e-5)
        assert not out[3:].any()


@pytest.mark.parametrize("arch,workers", [("x86_64", 1), ("x86_64", 2),
                                          ("riscv64", 1), ("arm32", 1)])
def test_failing_workgroup_in_the_middle(compile_cache, arch, workers,
                                         eager_threads):
    """A workgroup whose import returns non-zero stops the dispatch; the
    error names it, and no workgroup after it (in order) ran with
    workers=1."""
    n = 64 * 20
    a = np.ones(n, np.float32)
    b = np.full(n, 2, np.float32)
    calls = []

    def mul(params, context):
        tid = params.struct(SIMPLE_MUL)["tid"]
        calls.append(tid)
        return 7 if tid == 11 else 0

    comp = compile_program(EXAMPLE, arch, compile_cache)
    with PluginManager(arch) as plugins:
        plugins.register_python({"simple_mul_workgroup": mul})
        # (the plan loads the executables: their imports must resolve)
        plan = plan_program(comp, [a, b], "mixed_invocation", plugins=plugins)
        d = plan.dispatches[0]          # @mul: one workgroup per 64 elements
        assert d.export_name == "mul" and d.workgroup_count == (20, 1, 1)
        with Executable(d.so_path, plugins=plugins) as exe:
            arrays = [np.zeros(bd.length, np.uint8) if bd.kind != "input"
                      else (a, b)[bd.ref] for bd in d.bindings]
            with pytest.raises(DispatchError) as info:
                exe.dispatch(d.export_name, d.workgroup_count, arrays,
                             d.constants, workers=workers)
    assert info.value.field == "workgroup_id"
    assert info.value.value == (11, 0, 0), str(info.value)
    assert "(11, 0, 0)" in str(info.value)
    if workers == 1:
        assert max(calls) == 11


def test_ten_million_workgroups_natively_with_flat_memory():
    """10**7 workgroups of a trivial kernel (machine code returning 0) run
    through the loop natively without memory growing with the grid."""
    from elfloader.backend.native import NativeBackend
    be = NativeBackend()
    try:
        if be.arch.name != "x86_64":
            pytest.skip("the trivial kernel is x86_64 machine code")
        fn = be.place_code(bytes.fromhex("31c0c3"))   # xor eax, eax; ret
        env = be.alloc(256, 64)
        layout = dispatch_mod.DispatchLayout(be, 0, 0, 1, 0)
        total = 10 ** 7
        grid = (10 ** 5, 10, 10)

        def rss():
            return process_memory()["VmRSS"]
        layout.write((1, 1, 1), grid, 1, [], [], [], total)
        before = rss()
        t0 = time.perf_counter()
        dispatch_mod.run_grid(be, layout, fn, env, total, label="trivial",
                              path="<test>", grid=grid)
        elapsed = time.perf_counter() - t0
        grown = rss() - before
        assert grown < 10 << 20, grown
        assert elapsed < 60
    finally:
        be.close()


def test_ctrl_c_stops_a_long_emulated_grid():
    """SIGINT during a long emulated dispatch: one line, exit status 130,
    within a second."""
    so = SAMPLES / "mul_add_riscv64.so"
    proc = subprocess.Popen(
        [sys.executable, "-m", "hal_cpu", "run", str(so), "--entry_point=0",
         "--workgroup_count=4000000000,1,1", "--binding=5003xf32=1",
         "--binding=5003xf32=2", "--binding=5003xf32", "--no-progress"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"}, preexec_fn=default_sigint)
    time.sleep(3.0)
    assert proc.poll() is None, proc.communicate()
    t0 = time.monotonic()
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=30)
    assert time.monotonic() - t0 < 1.0 + 0.5
    assert proc.returncode == 130, (out, err)
    assert err.strip() == "hal-cpu: interrupted"

