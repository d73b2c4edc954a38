"""Programs as IREE runs them: host code that reads device data, host
modules shaped like IREE's custom-module samples (in Python), and test
programs with IREE's check ops through ``hal-cpu check-module``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from fatelf import arches
from hal_cpu.cli import main
from hal_cpu.programs import HostModule, ModuleRegistry, compile_program, export
from hal_cpu.programs.vm import load_program

from conftest import ROOT

PROGRAMS = ROOT / "tests" / "programs"
HOST_CODE = PROGRAMS / "host_code.mlir"
MODULES = PROGRAMS / "host_modules"
CUSTOM = MODULES / "custom_string.py"
CHECKS = sorted((PROGRAMS / "check").glob("*.mlir"))
IREE_RUN_MODULE = Path(sys.executable).parent / "iree-run-module"
IS_X86_64 = arches.host_arch() == "x86_64"



def run_program(compiled, function, modules):
    """Call ``function`` (no arguments) of ``compiled`` on the VM with the
    host ``modules`` (a list, or a ModuleRegistry's)."""
    modules = getattr(modules, "modules", modules)
    with load_program(compiled, host_modules=[m for m in modules
                                              if m.name != "check"]) as program:
        return program.function(function)()

def cli(capsys, *args):
    """(exit status, stdout, stderr) of ``hal-cpu ARGS`` in this process."""
    rc = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return rc, out, err


# ---------------------------------------------------------------------------
# host code that reads device data

HOST_CASES = [
    ("double_until", ["--input=f32=3", "--input=100"],
     "result[0]: hal.buffer_view\nf32=192\n"),
    ("third_of_square", ["--input=4xi32=1,2,-7,4"], "result[0]: i32=49\n"),
    ("iota_of_sum", ["--input=3xi32=2,3,4"],
     "result[0]: hal.buffer_view\n9xf32=0 1 2 3 4 5 6 7 8\n"),
]


@pytest.mark.parametrize("arch", ["x86_64", "aarch64", "riscv64"])
@pytest.mark.parametrize("function,inputs,want", HOST_CASES, ids=[c[0] for c in HOST_CASES])
def test_host_code_reading_results(compile_cache, capsys, arch, function, inputs, want):
    """A loop on a tensor value, a returned tensor.extract, and a dispatch
    whose size comes from data print what iree-run-module prints."""
    rc, out, err = cli(capsys, "run-module", HOST_CODE, f"--cache_dir={compile_cache}",
                       f"--function={function}", f"--arch={arch}", *inputs)
    assert rc == 0, err
    assert out == f"EXEC @{function}\n{want}"


@pytest.mark.skipif(not IS_X86_64, reason="x86_64 host only")
@pytest.mark.parametrize("function,inputs,want", HOST_CASES, ids=[c[0] for c in HOST_CASES])
def test_host_code_matches_iree_run_module(compile_cache, capsys, function, inputs, want):
    comp = compile_program(HOST_CODE, "x86_64", compile_cache)
    proc = subprocess.run([str(IREE_RUN_MODULE), "--device=local-sync",
                           f"--module={comp.vmfb}", f"--function={function}", *inputs],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == f"EXEC @{function}\n{want}"


def test_plan_names_the_value_that_needs_data(compile_cache, capsys):
    rc, out, err = cli(capsys, "plan", HOST_CODE, f"--cache_dir={compile_cache}",
                       "--function=third_of_square", "--input=4xi32=1,2,-7,4")
    assert rc == 1 and out == "" and len(err.splitlines()) == 1
    # a record-only run of the VM: the host read of a dispatch's result is
    # refused, naming the program, the op and the buffer (iree-compile
    # 3.13 keeps source locations of the module initializer only)
    assert err.startswith(f"hal-cpu: error: {HOST_CODE}: "), err
    assert "FAILED_PRECONDITION" in err and "hal.buffer.load reads buffer" in err
    assert "--trace" in err
    rc, out, err = cli(capsys, "plan", HOST_CODE, f"--cache_dir={compile_cache}",
                       "--function=iota_of_sum", "--input=3xi32=2,3,4", "--trace",
                       "--arch=riscv64")
    assert rc == 0, err
    dispatches = [ln for ln in out.splitlines() if ln.startswith("step ") and "dispatch" in ln]
    assert len(dispatches) == 2
    assert "  workgroups:  " in out


def test_rank0_npy_input(compile_cache, capsys, tmp_path):
    """A 0-d .npy input, as iree-run-module takes it."""
    np.save(tmp_path / "x.npy", np.array(3, np.float32))
    rc, out, err = cli(capsys, "run-module", HOST_CODE, f"--cache_dir={compile_cache}",
                       "--function=double_until", f"--input=@{tmp_path / 'x.npy'}",
                       "--input=50")
    assert rc == 0, err
    assert out == "EXEC @double_until\nresult[0]: hal.buffer_view\nf32=96\n"


def test_python_api_runs_host_code(compile_cache):
    comp = compile_program(HOST_CODE, "aarch64", compile_cache)
    trace: list = []
    with load_program(comp, trace=trace) as program:
        fn = program.function("iota_of_sum")
        (r,) = fn(np.array([5, 1, 1], np.int32))
        assert fn.result_types == ["r"]
    np.testing.assert_array_equal(r, np.arange(7, dtype=np.float32))
    assert len(trace) == 2      # the dispatches the call ran


# ---------------------------------------------------------------------------
# host modules: the custom-module samples

def test_basic_sample_with_fallback(compile_cache, capsys):
    """The module lacks the optional string.dprint: the program's vm.fallback
    function runs; string.length's vm.signature gives the module an i64."""
    rc, out, err = cli(capsys, "run-module", MODULES / "basic.mlir",
                       f"--cache_dir={compile_cache}", f"--module={CUSTOM}")
    assert rc == 0, err
    assert out == ("EXEC @main\nCREATE hello\nPRINT hello\nLENGTH hello = 5\n"
                   "CREATE debug\nCREATE optimized\nPRINT optimized\n")


def test_basic_sample_host_only_with_the_optional_import(compile_cache, capsys):
    """Compiled as the sample compiles it (host-only); a module that provides
    string.dprint is called instead of the fallback."""
    rc, out, err = cli(capsys, "run-module", MODULES / "basic.mlir",
                       f"--cache_dir={compile_cache}",
                       "--compile-flag=--iree-execution-model=host-only",
                       f"--module={CUSTOM}@create_custom_module?debug=1")
    assert rc == 0, err
    assert out == ("EXEC @main\nCREATE hello\nPRINT hello\nLENGTH hello = 5\n"
                   "CREATE debug\nPRINT debug\n")


@pytest.mark.parametrize("arch", ["x86_64", "riscv64"])
def test_static_sample_passes_a_tensor(compile_cache, capsys, arch):
    rc, out, err = cli(capsys, "run-module", MODULES / "static.mlir",
                       f"--cache_dir={compile_cache}", f"--module={CUSTOM}", f"--arch={arch}")
    assert rc == 0, err
    assert out == "EXEC @main\nCREATE 5xi8=0 1 2 3 4\nPRINT 5xi8=0 1 2 3 4\n"


def test_dynamic_sample_parameters_version_and_errors(compile_cache, capsys):
    prog = MODULES / "dynamic.mlir"
    rc, out, err = cli(capsys, "run-module", prog, f"--cache_dir={compile_cache}",
                       "--function=main", f"--module={CUSTOM}@create_custom_module?prefix=%3E%20")
    assert rc == 0, err
    assert out == "EXEC @main\nCREATE > 5xi8=0 1 2 3 4\nPRINT > 5xi8=0 1 2 3 4\n"
    # a creation function refusing this runtime's version
    rc, out, err = cli(capsys, "run-module", prog, f"--cache_dir={compile_cache}",
                       "--function=main", f"--module={CUSTOM}@create_v0_module")
    assert rc == 1 and out == "" and len(err.splitlines()) == 1
    assert "refused to create the module: unsupported runtime version 1" in err
    # the module's function fails: one line naming it and the user's line
    rc, out, err = cli(capsys, "run-module", prog, f"--cache_dir={compile_cache}",
                       "--function=error", f"--module={CUSTOM}@create_custom_module")
    assert rc == 1 and out == "EXEC @error\n" and len(err.splitlines()) == 1
    assert (f"{prog}: UNKNOWN; Forced failure; while invoking native function "
            "custom.error") in err
    # no module: a typed error naming the import before anything runs
    rc, out, err = cli(capsys, "run-module", prog, f"--cache_dir={compile_cache}",
                       "--function=main")
    assert rc == 1 and out == "" and len(err.splitlines()) == 1
    assert "the program needs module 'custom'" in err and "not registered" in err
    # no such file / creation function
    for spec, words in ((MODULES / "none.py", "no such file"),
                        (f"{CUSTOM}@nope", "has no creation function nope()")):
        rc, out, err = cli(capsys, "run-module", prog, f"--cache_dir={compile_cache}",
                           "--function=main", f"--module={spec}")
        assert rc == 1 and words in err and len(err.splitlines()) == 1


def test_newest_registration_wins_and_types_are_checked(compile_cache, capsys):
    """Two modules named custom: the later one answers; a result of the wrong
    class for !custom.string is a typed error."""
    sys.path.insert(0, str(MODULES))
    try:
        import custom_string
    finally:
        sys.path.remove(str(MODULES))
    seen = []

    class Shouting(HostModule):
        name = "custom"
        types = {"custom.string": custom_string.CustomString}

        @export("string.print")
        def string_print(self, s):
            seen.append(s.value.upper())

    comp = compile_program(MODULES / "static.mlir", arches.host_arch(), compile_cache)
    registry = ModuleRegistry([custom_string.CustomModule(), Shouting()])
    run_program(comp, "main", registry)
    assert seen == ["5XI8=0 1 2 3 4"]
    capsys.readouterr()

    class Wrong(HostModule):
        name = "custom"
        types = {"custom.string": custom_string.CustomString}

        @export("string.from_tensor")
        def from_tensor(self, t):
            return "not a CustomString"

    from hal_cpu.programs import HostCallError
    # (the VM's wording: a ref result must be of a type the module declares)
    with pytest.raises(HostCallError, match="from_tensor is 'not a CustomString' "
                       r"\(str\): not a numpy array, bytes, or an object of a type "
                       "the module declares"):
        run_program(comp, "main", [custom_string.CustomModule(), Wrong()])


# ---------------------------------------------------------------------------
# the check module

# generic arm32 cannot link f16 conversions (__aeabi_h2f) and generic i686
# used to leave the fmaf libcall of exp/tanh without a body (see test_defaults_32bit.py)
@pytest.mark.parametrize("arch", ["x86_64", "aarch64", "riscv64", "riscv32"])
def test_check_programs_pass(compile_cache, capsys, arch):
    """Our check-style test programs (elementwise, reductions, matmul, conv,
    pad, gather, scatter, sort, dynamic shapes, i8/i64/i4, complex) pass on
    x86_64 and three emulated architectures."""
    for path in CHECKS:
        if path.name == "failing.mlir":
            continue
        rc, out, err = cli(capsys, "check-module", path, f"--cache_dir={compile_cache}",
                           f"--arch={arch}")
        lines = out.splitlines()
        assert rc == 0, out + err
        assert lines[-1].endswith(f"functions passed ({arch})")
        n = int(lines[-1].split()[0])
        assert n >= 2 and lines[-1].startswith(f"{n} of {n} ")
        assert all(ln.startswith("PASS @") for ln in lines[:-1])


def test_check_failures_are_reported_as_iree_reports_them(compile_cache, capsys):
    rc, out, err = cli(capsys, "check-module", PROGRAMS / "check" / "failing.mlir",
                       f"--cache_dir={compile_cache}")
    assert rc == 1
    assert out == (
        "FAIL @wrong_sum\n"
        "    Expected near equality of these values. Contents does not match to "
        "tolerance parameters atol=0.0001, rtol=0. The first failure occurs at index 1 "
        "as the lhs value 4 differs from the rhs value 4.5 by 5.000e-01.\n"
        "      lhs:\n        2xf32=2 4\n      rhs:\n        2xf32=2 4.5\n"
        "PASS @right_sum\n"
        "FAIL @wrong_ints\n"
        "    Expected 0 to be nonzero.\n"
        "    Expected equality of these values. Contents does not match.\n"
        "      lhs:\n        3xi32=1 4 9\n      rhs:\n        3xi32=1 4 10\n"
        f"1 of 3 functions passed ({arches.host_arch()})\n")


def test_failed_registrations_leave_the_registry_as_it_was(compile_cache, capsys):
    """A module refused by ``register`` (functions not a mapping, a function
    that is not callable, no name, types that are not classes) never enters
    the registry: a valid registration afterwards links and runs."""
    from hal_cpu.programs import HostModuleError, load_module_spec
    registry = ModuleRegistry()
    before = list(registry.modules)

    class NotAMapping:
        name = "custom"
        functions = ["string.create"]

    for bad in (NotAMapping(), HostModule("custom", {"string.print": 3}),
                HostModule("", {}), HostModule("custom", {}, types={"custom.string": 1})):
        with pytest.raises(HostModuleError):
            registry.register(bad)
        assert registry.modules == before
    registry.register(load_module_spec(str(CUSTOM)))
    comp = compile_program(MODULES / "basic.mlir", arches.host_arch(), compile_cache)
    run_program(comp, "main", registry)
    assert "PRINT hello" in capsys.readouterr().out
