"""Every CPU profile of the architecture table, on the qemu engine: IREE
executables compiled for the profile (vector code for the vector ISAs:
AVX2+FMA, SVE/SVE2, RVV, Zve32f, NEON) run emulated and match numpy, at
every vector length the profile lists; and the engine choice."""

from __future__ import annotations

import os

import numpy as np
import pytest

import elfloader
from elfloader.backend.emulated import choice
from fatelf import arches
from hal_cpu.plugins import PluginManager
from hal_cpu.programs.vm import PlanRunner, plan_program, run_plan

from program_specs import PROFILE_PROGRAMS

ON_CI = os.environ.get("CI", "").lower() == "true"


def _need_qemu(arch: str) -> None:
    if choice.qemu_program(arch) is None:
        if ON_CI:
            pytest.fail(f"{choice.QEMU_PROGRAMS[arch]} is missing on CI")
        pytest.skip(f"{choice.QEMU_PROGRAMS[arch]} is not installed")


CASES = [pytest.param(p.arch, p.name, v, id=f"{p.arch}-{p.name}" + (f"-{v}" if v else ""))
         for p in arches.PROFILES for v in (sorted(p.vlens) or [None])]


def _check(outs, expected, program):
    assert len(outs) == len(expected)
    for got, want in zip(outs, expected):
        assert got.shape == want.shape and got.dtype == want.dtype, program
        if want.dtype.kind == "f":
            np.testing.assert_allclose(got, want, rtol=3e-5, atol=3e-4,
                                       err_msg=program)
        else:
            np.testing.assert_array_equal(got, want, err_msg=program)


#: Profiles for which iree-compile 3.13 leaves the fmaf libcall of exp
#: unresolved (the profile's note says so): exp stops with a typed error.
NO_FMA = {(p.arch, p.name) for p in arches.PROFILES if "fmaf" in p.note}
USES_EXP = {"exp_reduce", "softmax"}


@pytest.mark.parametrize("arch,cpu,vlen", CASES)
def test_profile_runs_iree_kernels(compiled, arch, cpu, vlen):
    """matmul (odd sizes), exp reduction, integer ops and softmax, compiled
    for the profile, run on the qemu engine modelling that CPU (and vector
    length) and match numpy."""
    _need_qemu(arch)
    rng = np.random.default_rng(7)
    with PluginManager(arch, "emulated", engine="qemu", cpu=cpu,
                       vlen=vlen) as machine:
        be = machine.backend
        assert be.engine == "qemu" and be.profile.name == cpu
        if vlen:
            assert be.vlen == vlen and f"vector length {vlen} bits" in be.describe()
        with PlanRunner(backend="emulated", arch=arch, plugins=machine) as runner:
            for program, spec in PROFILE_PROGRAMS.items():
                inputs = spec.make_inputs(rng)
                plan = plan_program(compiled(program, arch, cpu), inputs,
                                    plugins=machine)
                if (arch, cpu) in NO_FMA and program in USES_EXP:
                    with pytest.raises(elfloader.EmulationError):
                        run_plan(plan, inputs, runner)
                    continue
                outs = run_plan(plan, inputs, runner)
                _check(outs, spec.numpy_reference(inputs), program)


@pytest.mark.parametrize("arch,cpu", [("x86_64", "x86-64-v3"),
                                      ("riscv64", "rv64gcv"),
                                      ("aarch64", "sve")])
def test_vector_code_faults_on_a_profile_without_it(compiled, arch, cpu):
    """A profile narrows the CPU: code for a vector ISA the profile lacks
    stops at its first vector instruction, as on the real chip."""
    _need_qemu(arch)
    narrow = {"x86_64": "x86-64", "riscv64": "rv64gc", "aarch64": "armv8-a"}[arch]
    comp = compiled("exp_reduce", arch, cpu)
    spec = PROFILE_PROGRAMS["exp_reduce"]
    inputs = spec.make_inputs(np.random.default_rng(1))
    plan = plan_program(comp, inputs)
    with PluginManager(arch, "emulated", engine="qemu", cpu=narrow) as machine:
        with PlanRunner(backend="emulated", arch=arch, plugins=machine) as runner:
            with pytest.raises(elfloader.EmulationError) as info:
                run_plan(plan, inputs, runner)
    assert info.value.fault.kind == "invalid_instruction", str(info.value)
    assert "invalid instruction" in str(info.value)


def test_engine_choice(monkeypatch):
    """auto picks qemu where installed, else unicorn; a profile unicorn
    cannot run, without qemu-user, is a typed error that says how to
    install it."""
    x86 = elfloader.arch.by_name("x86_64")
    monkeypatch.delenv(choice.ENGINE_ENV, raising=False)
    if choice.qemu_program("x86_64"):
        assert choice.choose(x86) == "qemu"
    monkeypatch.setenv(choice.QEMU_DIR_ENV, "/nonexistent")
    monkeypatch.setenv("PATH", "/nonexistent")
    assert choice.choose(x86) == "unicorn"
    assert choice.choose(x86, cpu="x86-64-v2") == "unicorn"
    with pytest.raises(elfloader.EngineError, match="apt-get install qemu-user"):
        choice.choose(x86, cpu="x86-64-v3")
    with pytest.raises(elfloader.EngineError, match="qemu-x86_64"):
        choice.choose(x86, engine="qemu")
    with pytest.raises(elfloader.EngineError, match="unknown CPU profile"):
        choice.choose(x86, cpu="pentium9")
    with pytest.raises(elfloader.EngineError, match="not one of"):
        choice.resolve_profile(elfloader.arch.by_name("riscv64"), "rv64gcv", 100)
    with pytest.raises(elfloader.EngineError, match="no scalable vectors"):
        choice.resolve_profile(x86, "x86-64-v3", 256)
