"""One program path: a test program in the shape of IREE's generated math
suite (``tests/e2e/math``: several ``check.expect_almost_eq_const`` with
``atol``/``rtol`` on f32 and f16 libm ops) passes through ``hal-cpu
check-module`` from MLIR and from the ``.vmfb`` alike, on three
architectures; and ``plan`` is a record-only call of the VM
(:mod:`hal_cpu.programs.vm.plan`): its steps without running them, and a host read
of what a recorded dispatch computes refused with
:class:`hal_cpu.programs.vm.DataDependenceError`."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from hal_cpu.cli import main
from hal_cpu.programs import compile_program
from hal_cpu.programs.vm import DataDependenceError, Dispatch, load_program, plan_program

ROOT = Path(__file__).resolve().parent.parent
PROGRAMS = ROOT / "tests" / "programs"
MATH = PROGRAMS / "math_checks" / "almost_eq.mlir"
PASSING = ["exp_f32", "sqrt_f16", "tanh_f16"]


def cli(capsys, *argv) -> tuple[int, str, str]:
    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.mark.parametrize("arch", ["x86_64", "aarch64", "riscv64"])
def test_almost_eq_checks_pass_from_mlir_and_vmfb(compile_cache, capsys, arch):
    """The same lines from the MLIR file and from its compiled module; a
    function outside the tolerance fails with IREE's message."""
    compiled = compile_program(MATH, arch, compile_cache)
    outputs = []
    for program in (MATH, compiled.vmfb):
        rc, out, err = cli(capsys, "check-module", program, f"--arch={arch}",
                           f"--cache_dir={compile_cache}",
                           *[f"--function={f}" for f in PASSING])
        assert rc == 0, err
        assert out.splitlines() == [f"PASS @{f}" for f in PASSING] + [
            f"3 of 3 functions passed ({arch})"]
        rc, out, err = cli(capsys, "check-module", program, f"--arch={arch}",
                           f"--cache_dir={compile_cache}")
        assert rc == 1, err
        outputs.append(out)
        assert out.splitlines()[3] == "FAIL @wrong_f32"
        assert "atol=0.001, rtol=0.001" in out and "by 5.000e-01" in out
        assert out.splitlines()[-1] == f"3 of 4 functions passed ({arch})"
    assert outputs[0] == outputs[1]


def test_load_program_takes_mlir(compile_cache):
    """hal_cpu.programs.vm.load_program compiles MLIR for arch= first (cached)."""
    with load_program(PROGRAMS / "mm_rowsum.mlir", arch="aarch64",
                      cache_dir=compile_cache) as program:
        assert program.arch == "aarch64"
        a = np.ones((37, 53), np.float32)
        b = np.full((53, 29), 0.5, np.float32)
        rowsum, product = program("mm_rowsum", a, b)
    np.testing.assert_allclose(product, a @ b, rtol=1e-5)
    np.testing.assert_allclose(rowsum, np.tanh(a @ b).sum(axis=1), rtol=1e-5)


def test_plan_records_without_running(compile_cache):
    """The plan of mm_rowsum: two dispatches, the second reading the
    buffer the first writes, results in that buffer; nothing ran."""
    a = np.ones((37, 53), np.float32)
    b = np.ones((53, 29), np.float32)
    plan = plan_program(PROGRAMS / "mm_rowsum.mlir", [a, b], arch="riscv64",
                        cache_dir=compile_cache)
    assert plan.function == "mm_rowsum"
    first, second = plan.dispatches
    assert all(isinstance(d, Dispatch) and d.so_path.is_file()
               for d in plan.dispatches)
    assert [(r.kind, r.ref) for r in first.bindings[:2]] == [("input", 0), ("input", 1)]
    assert first.bindings[0].length == a.nbytes
    written = first.bindings[2]
    assert written.kind == "buffer" and plan.buffers[written.ref] >= 37 * 29 * 4
    assert {(r.kind, r.ref) for r in second.bindings} == {(written.kind, written.ref)}
    assert [r.shape for r in plan.results] == [(37,), (37, 29)]
    assert all(r.storage.ref == written.ref for r in plan.results)


def test_host_read_of_recorded_data_is_a_data_dependence(compile_cache, capsys):
    """third_of_square reads back what a dispatch computes: no plan without
    running; the error names the program, the op and the buffer; --trace
    prints the steps of an actual run instead."""
    host_code = PROGRAMS / "host_code.mlir"
    with pytest.raises(DataDependenceError) as e:
        plan_program(host_code, [np.array([1, 2, -7, 4], np.int32)],
                     "third_of_square", arch="x86_64", cache_dir=compile_cache)
    assert e.value.field == "FAILED_PRECONDITION" and e.value.name
    assert "hal.buffer.load reads buffer" in e.value.message
    rc, out, err = cli(capsys, "plan", host_code, f"--cache_dir={compile_cache}",
                       "--function=third_of_square", "--input=4xi32=1,2,-7,4",
                       "--trace", "--arch=aarch64")
    assert rc == 0, err
    assert sum(1 for ln in out.splitlines()
               if ln.startswith("step ") and ln.endswith("dispatch")) >= 1
