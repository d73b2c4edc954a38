"""Real programs compiled by iree-compile, dispatched by our runtime and
checked against numpy (and, for x86_64, against IREE's own runtime)."""

from __future__ import annotations

import numpy as np
import pytest

import elfloader
from fatelf.arches import RUNTIME_ARCHES
from hal_cpu.programs import reference_run
from hal_cpu.programs.vm import PlanRunner, plan_program, run_plan

from program_specs import PROGRAMS as SPECS

ARCHES = list(RUNTIME_ARCHES)
PROGRAMS = ["mul_add", "matmul", "sum_last", "scale_dyn", "add_i32", "mm_rowsum"]

# Programs expected to stop with a typed error instead of a result: none
# (x86_32 and arm32 link the runtime's libm, so tanh's fmaf libcall has a
# body; see tests/test_defaults_32bit.py).
BROKEN: set = set()


def run_program(compiled, name, arch, backend, rng, **params):
    spec = SPECS[name]
    inputs = spec.make_inputs(rng, **params)
    comp = compiled(name, arch)
    plan = plan_program(comp, inputs)
    with PlanRunner(backend=backend, arch=arch) as runner:
        outs = run_plan(plan, inputs, runner)
    assert runner.calls == len(plan.dispatches)
    return inputs, outs, spec.numpy_reference(inputs), plan


def check(outs, expected):
    assert len(outs) == len(expected)
    for got, want in zip(outs, expected):
        assert got.shape == want.shape and got.dtype == want.dtype
        if want.dtype.kind == "f":
            np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-4)
        else:
            np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("arch", ARCHES)
@pytest.mark.parametrize("name", PROGRAMS)
def test_program_matches_numpy(compiled, rng, name, arch):
    if (name, arch) in BROKEN:
        with pytest.raises(elfloader.EmulationError, match="outside|unmapped|non-executable"):
            run_program(compiled, name, arch, "auto", rng)
        return
    _, outs, expected, _ = run_program(compiled, name, arch, "auto", rng)
    check(outs, expected)


@pytest.mark.parametrize("arch", ["x86_64", "riscv64", "arm32"])
@pytest.mark.parametrize("n", [0, 1, 999, 5000])
def test_dynamic_shape_constants(compiled, rng, n, arch):
    """The dynamic-shape dispatch takes its size and scalar as constants;
    the workgroup count follows the size as the HAL IR computes it."""
    inputs, outs, expected, plan = run_program(compiled, "scale_dyn", arch,
                                               "auto", rng, n=n, s=-0.5)
    (d,) = plan.dispatches
    assert d.constants[1] == n and d.workgroup_count[0] == -(-n // 4096)
    check(outs, expected)


@pytest.mark.parametrize("name", PROGRAMS)
def test_x86_64_native_and_emulated_agree_bit_for_bit(compiled, name):
    _, native, _, _ = run_program(compiled, name, "x86_64", "native",
                                  np.random.default_rng(7))
    _, emulated, _, _ = run_program(compiled, name, "x86_64", "emulated",
                                    np.random.default_rng(7))
    for a, b in zip(native, emulated):
        assert a.tobytes() == b.tobytes()


@pytest.mark.parametrize("name", PROGRAMS)
def test_x86_64_matches_iree_run_module(compiled, name):
    inputs, outs, _, _ = run_program(compiled, name, "x86_64", "native",
                                     np.random.default_rng(3))
    ref = reference_run(compiled(name, "x86_64").vmfb, SPECS[name].function, inputs)
    assert len(ref) == len(outs)
    for got, want in zip(outs, ref):
        assert got.shape == want.shape
        assert got.tobytes() == np.ascontiguousarray(want).tobytes()


@pytest.mark.parametrize("name", ["matmul", "sum_last"])
def test_x86_64_matches_iree_run_module_cli(compiled, tmp_path, name):
    """The same comparison through the iree-run-module command itself."""
    import subprocess
    inputs, outs, _, _ = run_program(compiled, name, "x86_64", "native",
                                     np.random.default_rng(4))
    args = []
    for i, x in enumerate(inputs):
        np.save(tmp_path / f"in{i}.npy", x)
        args.append(f"--input=@{tmp_path / f'in{i}.npy'}")
    proc = subprocess.run(
        ["iree-run-module", "--device=local-sync",
         f"--module={compiled(name, 'x86_64').vmfb}",
         f"--function={SPECS[name].function}", *args,
         f"--output=@{tmp_path / 'out.npy'}"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert np.load(tmp_path / "out.npy").tobytes() == outs[0].tobytes()
