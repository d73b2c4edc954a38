"""``hal-cpu run-module`` and ``hal-cpu plan`` on real programs: the printed
results match ``iree-run-module`` byte for byte on x86_64, every
architecture agrees with numpy, plans reproduce dispatches with ``hal-cpu
run``, and bad command lines end in one line on stderr."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import fatelf
from fatelf import arches
from hal_cpu import Executable
from hal_cpu.cli import main
from hal_cpu.programs import compile_many
from hal_cpu.programs.vm import plan_program

from conftest import PREBUILT, ROOT
from program_specs import ACCEPTANCE, ALL_PROGRAMS

ARCHES = list(arches.RUNTIME_ARCHES)
NAMES = ["matmul"] + list(ACCEPTANCE)

# Programs expected to stop with a typed emulation error: none (x86_32 and
# arm32 link the runtime's libm, so exp's fmaf libcall has a body; see
# tests/test_defaults_32bit.py).
BROKEN_RUN: set = set()
NO_COMPILE: set = set()

IREE_RUN_MODULE = Path(sys.executable).parent / "iree-run-module"


@pytest.fixture(scope="module")
def programs(compile_cache):
    """Every acceptance program compiled for every architecture at once."""
    jobs = [(ALL_PROGRAMS[n].path, a) for n in NAMES for a in ARCHES
            if (n, a) not in NO_COMPILE]
    jobs.append((ROOT / "sample_plugins" / "standalone_example.mlir", arches.host_arch()))
    compile_many(jobs, compile_cache, max_workers=2)
    return compile_cache


def cli(capsys, *args):
    """(exit status, stdout, stderr) of ``hal-cpu ARGS`` run in this process."""
    rc = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return rc, out, err


def save_inputs(name, directory: Path, seed=5) -> tuple[list, list[str]]:
    """Random inputs of program ``name`` as .npy files -> (arrays, --input flags)."""
    inputs = ALL_PROGRAMS[name].make_inputs(np.random.default_rng(seed))
    flags = []
    for i, x in enumerate(inputs):
        np.save(directory / f"in{i}.npy", x)
        flags.append(f"--input=@{directory / f'in{i}.npy'}")
    return inputs, flags


def _compiled(cache, stem: str, name: str):
    """The compiled file ``name`` of program directory ``stem`` in cache
    ``cache`` (directories are ``<stem>-<content hash>``)."""
    found = sorted(cache.glob(f"{stem}-*/{name}")) + sorted(cache.glob(f"{stem}/{name}"))
    found = [p for p in found if p.parent.name == stem
             or p.parent.name.removeprefix(stem + "-").isalnum()]
    assert found, f"no {stem}*/{name} in {cache}"
    return max(found, key=lambda p: p.stat().st_mtime_ns)


def iree_run_module(vmfb, function, flags, *extra) -> str:
    proc = subprocess.run([str(IREE_RUN_MODULE), "--device=local-sync",
                           f"--module={vmfb}", f"--function={function}",
                           *flags, *extra], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


# ---------------------------------------------------------------------------
# the acceptance programs

@pytest.mark.skipif(arches.host_arch() != "x86_64", reason="x86_64 host only")
@pytest.mark.parametrize("name", NAMES)
def test_prints_what_iree_run_module_prints(programs, capsys, tmp_path, name):
    spec = ALL_PROGRAMS[name]
    _, flags = save_inputs(name, tmp_path)
    rc, ours, err = cli(capsys, "run-module", spec.path, f"--cache_dir={programs}",
                        "--arch=x86_64", "--backend=native", *flags)
    assert rc == 0, err
    vmfb = _compiled(programs, f"{name}-x86_64", f"{name}.vmfb")
    assert ours == iree_run_module(vmfb, spec.function, flags)
    assert ours.startswith(f"EXEC @{spec.function}\nresult[0]: hal.buffer_view\n")


@pytest.mark.parametrize("arch", ARCHES)
@pytest.mark.parametrize("name", NAMES)
def test_every_arch_emulated_matches_numpy(programs, capsys, tmp_path, name, arch):
    spec = ALL_PROGRAMS[name]
    inputs, flags = save_inputs(name, tmp_path, seed=9)
    want = spec.numpy_reference(inputs)
    outs = [tmp_path / f"out{i}.npy" for i in range(len(want))]
    rc, out, err = cli(capsys, "run-module", spec.path, f"--cache_dir={programs}",
                       f"--arch={arch}", "--backend=emulated", "--no-progress",
                       *flags, *[f"--output=@{p}" for p in outs])
    if (name, arch) in NO_COMPILE:
        assert rc == 1 and len(err.splitlines()) == 1
        assert "iree-compile failed for arm32" in err and "__aeabi_idiv" in err
        return
    if (name, arch) in BROKEN_RUN:
        # a fault report: the error line, then where the guest stopped
        assert rc == 1 and err.startswith("hal-cpu: error: ") and out == ""
        assert re.search("unmapped|non-executable|outside", err.splitlines()[0]), err
        return
    assert rc == 0, err
    assert out == f"EXEC @{spec.function}\n"     # results went to the files
    for path, w in zip(outs, want):
        got = np.load(path)
        assert got.shape == w.shape and got.dtype == w.dtype
        if w.dtype.kind == "f":
            np.testing.assert_allclose(got, w, rtol=2e-5, atol=2e-5)
        else:
            np.testing.assert_array_equal(got, w)


@pytest.mark.parametrize("arch", ["aarch64", "riscv32"])
def test_dynamic_shapes_follow_the_inputs(programs, capsys, tmp_path, arch):
    """One compiled program, several shapes: the plan's constants and
    workgroup counts come from the inputs."""
    spec = ALL_PROGRAMS["rowsum_dyn"]
    for m, n in ((1, 1), (3, 200), (70, 9)):
        x = np.random.default_rng(m).standard_normal((m, n)).astype(np.float32)
        np.save(tmp_path / "x.npy", x)
        rc, out, err = cli(capsys, "run-module", spec.path, f"--cache_dir={programs}",
                           f"--arch={arch}", f"--input=@{tmp_path / 'x.npy'}",
                           f"--output=@{tmp_path / 'r.npy'}")
        assert rc == 0, err
        np.testing.assert_allclose(np.load(tmp_path / "r.npy"), x.sum(axis=1),
                                   rtol=1e-5, atol=1e-5)


def test_overlapping_bindings_keep_every_result(programs):
    """int_ops writes both results through two bindings of one buffer; with
    that buffer unaligned each binding is copied, and neither copy-back may
    undo the other's writes."""
    spec = ALL_PROGRAMS["int_ops"]
    inputs = spec.make_inputs(np.random.default_rng(1))
    from hal_cpu.programs import compile_program
    comp = compile_program(spec.path, arches.host_arch(), programs)
    plan = plan_program(comp, inputs)
    (d,) = plan.dispatches
    ((_, size),) = plan.buffers.items()
    raw = np.zeros(size + 65, np.uint8)
    start = (1 - raw.ctypes.data) % 64       # 1 byte past a 64-byte boundary
    buf = raw[start:start + size]
    assert buf.ctypes.data % 64 == 1
    args = [np.frombuffer(np.ascontiguousarray(x).tobytes(), np.uint8).copy() for x in inputs]
    with Executable(d.so_path) as exe:
        exe.dispatch(d.export_name, d.workgroup_count, args + [buf, buf], d.constants)
    for r, w in zip(plan.results, spec.numpy_reference(inputs)):
        got = buf[r.storage.offset:r.storage.offset + r.storage.length].view(r.dtype)
        np.testing.assert_array_equal(got, w)


# ---------------------------------------------------------------------------
# plugins, --compare, --output

@pytest.mark.parametrize("arch", ARCHES)
def test_plugin_sample_on_every_arch(compile_cache, capsys, tmp_path, arch):
    """IREE's custom_dispatch plugin sample (our copy) with the simple_mul
    import resolved by the prebuilt plugin bundle."""
    a = np.arange(100, dtype=np.float32) - 30
    b = np.linspace(-2, 2, 100, dtype=np.float32)
    np.save(tmp_path / "a.npy", a)
    np.save(tmp_path / "b.npy", b)
    rc, out, err = cli(capsys, "run-module", ROOT / "sample_plugins" / "standalone_example.mlir",
                       f"--cache_dir={compile_cache}", f"--arch={arch}",
                       "--function=mixed_invocation",
                       f"--input=@{tmp_path / 'a.npy'}", f"--input=@{tmp_path / 'b.npy'}",
                       f"--executable_plugin={PREBUILT / 'standalone.sos'}",
                       f"--output=@{tmp_path / 'r.npy'}")
    assert rc == 0, err
    np.testing.assert_allclose(np.load(tmp_path / "r.npy"), a * b + b, rtol=1e-6)


@pytest.mark.skipif(arches.host_arch() != "x86_64", reason="x86_64 host only")
def test_plugin_sample_prints_what_iree_prints(programs, capsys):
    src = ROOT / "sample_plugins" / "standalone_example.mlir"
    flags = ["--input=70xf32=1.5", "--input=70xf32=-3",
             f"--executable_plugin={PREBUILT / 'standalone.sos'}"]
    rc, ours, err = cli(capsys, "run-module", src, f"--cache_dir={programs}",
                        "--function=mixed_invocation", *flags)
    assert rc == 0, err
    vmfb = _compiled(programs, "standalone_example-x86_64",
                     "standalone_example.vmfb")
    assert ours == iree_run_module(vmfb, "mixed_invocation", flags)
    assert "70xf32=-7.5 -7.5" in ours


def test_compare_prints_the_error_per_result(programs, capsys, tmp_path):
    _, flags = save_inputs("int_ops", tmp_path)
    rc, out, err = cli(capsys, "run-module", ALL_PROGRAMS["int_ops"].path,
                       f"--cache_dir={programs}", "--arch=riscv64", "--compare", *flags)
    assert rc == 0, err
    host = arches.host_arch()
    assert out.splitlines()[-2:] == [
        f"compare: result[0]: max abs error 0 (IREE runtime, {host})",
        f"compare: result[1]: max abs error 0 (IREE runtime, {host})"]
    _, flags = save_inputs("layer_norm", tmp_path)
    rc, out, err = cli(capsys, "run-module", ALL_PROGRAMS["layer_norm"].path,
                       f"--cache_dir={programs}", "--arch=arm32", "--compare", *flags)
    assert rc == 0, err
    (line,) = [ln for ln in out.splitlines() if ln.startswith("compare:")]
    m = re.fullmatch(r"compare: result\[0\]: max abs error (\S+) \(IREE runtime, \w+\)", line)
    assert m and float(m.group(1)) < 1e-5


def test_output_specs(programs, capsys, tmp_path):
    """'' skips a result, '-' prints it without its index, @ writes, +
    appends, .bin holds raw bytes; as iree-run-module."""
    inputs, flags = save_inputs("int_ops", tmp_path)
    r0, r1 = ALL_PROGRAMS["int_ops"].numpy_reference(inputs)
    npy, raw = tmp_path / "o.npy", tmp_path / "o.bin"
    rc, out, err = cli(capsys, "run-module", ALL_PROGRAMS["int_ops"].path,
                       f"--cache_dir={programs}", *flags, "--output=-", f"--output=@{npy}",
                       "--output_max_element_count=3")
    assert rc == 0, err
    assert out == f"EXEC @int_ops\nhal.buffer_view\n129xi32={r0[0]} {r0[1]} {r0[2]}...\n"
    np.testing.assert_array_equal(np.load(npy), r1)
    rc, out, err = cli(capsys, "run-module", ALL_PROGRAMS["int_ops"].path,
                       f"--cache_dir={programs}", *flags, f"--output=+{npy}", f"--output=@{raw}")
    assert rc == 0 and out == "EXEC @int_ops\n"
    with open(npy, "rb") as f:
        np.testing.assert_array_equal(np.load(f), r1)
        np.testing.assert_array_equal(np.load(f), r0)
    assert raw.read_bytes() == r1.tobytes()
    rc, out, err = cli(capsys, "run-module", ALL_PROGRAMS["int_ops"].path,
                       f"--cache_dir={programs}", *flags, "--output=-")
    assert rc == 1 and err == ("hal-cpu: error: " + str(ALL_PROGRAMS["int_ops"].path)
                               + ": --output: 1 --output given; @int_ops has 2 results\n")


# ---------------------------------------------------------------------------
# plan

def test_plan_lists_steps_and_reproduces_a_dispatch(programs, capsys, tmp_path):
    inputs, flags = save_inputs("mm_rowsum", tmp_path)
    rc, out, err = cli(capsys, "plan", ALL_PROGRAMS["mm_rowsum"].path,
                       f"--cache_dir={programs}", "--arch=x86_64", *flags)
    assert rc == 0, err
    plan = plan_program(compile_many([(ALL_PROGRAMS["mm_rowsum"].path, "x86_64")],
                                     programs)[0], inputs)
    d0, d1 = plan.dispatches
    (buf, size), = plan.buffers.items()
    assert f"buffer {buf}: {size} bytes (allocated by the program)" in out
    assert f"  export:      {d0.export_name} (ordinal 0)" in out
    assert f"  export:      {d1.export_name} (ordinal 1)" in out
    assert f"  workgroups:  {','.join(map(str, d0.workgroup_count))}" in out
    assert "  binding 0:   input 0 [0, 7844) (7844 bytes)" in out
    assert (f"  binding 1:   buffer {buf} [0, {size}) ({size} bytes) "
            "(written by an earlier step; overlaps binding 0)") in out
    assert "result 0:  37xf32 in buffer" in out and "result 1:  37x29xf32" in out
    # the first dispatch's command line computes the matmul
    run = [ln.split("run:", 1)[1] for ln in out.splitlines() if ln.startswith("  run:")]
    assert len(run) == 2
    argv = shlex.split(run[0])
    assert argv[:2] == ["hal-cpu", "run"]
    rc, out, err = cli(capsys, *argv[1:], "--print_bindings=none",
                       f"--output=2=@{tmp_path / 'c.npy'}")
    assert rc == 0, err
    # the binding holding both results is bound as float32
    c = np.load(tmp_path / "c.npy")
    assert c.dtype == np.float32
    c = c[:37 * 29].reshape(37, 29)
    np.testing.assert_allclose(c, inputs[0] @ inputs[1], rtol=1e-4, atol=1e-4)


def test_plan_transfers_are_described(programs, capsys, tmp_path):
    src = tmp_path / "xfer.mlir"
    src.write_text("""
func.func @xfer(%a: tensor<100xf32>) -> (tensor<200xf32>, tensor<100xf32>) {
  %c = arith.constant dense<1.5> : tensor<100xf32>
  %cat = tensor.concat dim(0) %a, %a : (tensor<100xf32>, tensor<100xf32>) -> tensor<200xf32>
  return %cat, %c : tensor<200xf32>, tensor<100xf32>
}
""")
    rc, out, err = cli(capsys, "plan", src, f"--cache_dir={programs}", "--input=100xf32=2")
    assert rc == 0, err
    assert re.search(r"^step \d+: copy input 0 \[0, 400\) \(400 bytes\) to buffer ", out, re.M)
    assert re.search(r"^step \d+: fill buffer .* with the 4-byte pattern 0x3fc00000$", out, re.M)
    rc, out, err = cli(capsys, "run-module", src, f"--cache_dir={programs}",
                       "--input=100xf32=2", "--arch=riscv64")
    assert rc == 0, err
    assert out == ("EXEC @xfer\nresult[0]: hal.buffer_view\n200xf32=" + " ".join(["2"] * 200)
                   + "\nresult[1]: hal.buffer_view\n100xf32=" + " ".join(["1.5"] * 100) + "\n")


def test_plan_save_dir_writes_loadable_executables(programs, capsys, tmp_path):
    inputs, flags = save_inputs("matmul", tmp_path)
    rc, out, err = cli(capsys, "plan", ALL_PROGRAMS["matmul"].path, f"--cache_dir={programs}",
                       "--arch=aarch64", f"--save-dir={tmp_path / 'one'}", *flags)
    assert rc == 0, err
    so = tmp_path / "one" / "matmul_dispatch_0_aarch64.so"
    assert f"saved: {so}" in out and f"  executable:  {so}" in out
    with Executable(so, backend="emulated") as exe:
        assert exe.arch.name == "aarch64"
        assert [e.name for e in exe.exports] == ["matmul_dispatch_0_matmul_37x29x53_f32"]

    rc, out, err = cli(capsys, "plan", ALL_PROGRAMS["matmul"].path, f"--cache_dir={programs}",
                       "--arch=all", f"--save-dir={tmp_path / 'all'}", *flags)
    assert rc == 0, err
    sos = tmp_path / "all" / "matmul_dispatch_0.sos"
    bundle = fatelf.read(sos)
    assert len(bundle.records) == 6
    assert out.count("step 0: dispatch") == 6 and f"saved: {sos}" in out
    # the riscv32 command line runs from the bundle
    runs = [shlex.split(ln.split("run:", 1)[1]) for ln in out.splitlines()
            if ln.startswith("  run:")]
    (rv32,) = [r for r in runs if "--arch=riscv32" in r]
    assert rv32[2] == str(sos)
    rc, out, err = cli(capsys, *rv32[1:], f"--output=2=@{tmp_path / 'c.npy'}",
                       "--print_bindings=none")
    assert rc == 0, err
    c = np.load(tmp_path / "c.npy").view(np.float32).reshape(37, 29)
    np.testing.assert_allclose(c, inputs[0] @ inputs[1], rtol=1e-4, atol=1e-4)


# ---------------------------------------------------------------------------
# errors: one line on stderr, exit 1; usage errors exit 2

PICK = """func.func @pick(%x: tensor<8xf32>, %s: f32) -> tensor<8xf32> {
  %zero = arith.constant 0.0 : f32
  %p = arith.cmpf ogt, %s, %zero : f32
  %r = scf.if %p -> tensor<8xf32> {
    %a = arith.addf %x, %x : tensor<8xf32>
    scf.yield %a : tensor<8xf32>
  } else {
    %m = arith.mulf %x, %x : tensor<8xf32>
    scf.yield %m : tensor<8xf32>
  }
  return %r : tensor<8xf32>
}
"""


def test_host_code_branching_on_a_float_runs(compile_cache, capsys, tmp_path):
    """The host program branches on a float compare of a scalar argument:
    both branches run as iree-run-module runs them."""
    src = tmp_path / "pick.mlir"
    src.write_text(PICK)
    for s, want in (("1.5", "6"), ("-1", "9")):
        rc, out, err = cli(capsys, "run-module", src, f"--cache_dir={compile_cache}",
                           "--input=8xf32=3", f"--input={s}", "--arch=aarch64")
        assert rc == 0, err
        assert out == "EXEC @pick\nresult[0]: hal.buffer_view\n8xf32=" + " ".join([want] * 8) + "\n"


MATH_EXP = """func.func @f(%x: tensor<4xf32>, %s: f32) -> tensor<4xf32> {
  %e = math.exp %s : f32
  %init = tensor.empty() : tensor<4xf32>
  %r = linalg.generic {indexing_maps = [affine_map<(d0) -> (d0)>, affine_map<(d0) -> (d0)>],
                       iterator_types = ["parallel"]}
      ins(%x : tensor<4xf32>) outs(%init : tensor<4xf32>) {
  ^bb0(%a: f32, %o: f32):
    %m = arith.mulf %a, %e : f32
    linalg.yield %m : f32
  } -> tensor<4xf32>
  return %r : tensor<4xf32>
}
"""


def test_scalar_math_in_host_code_runs(compile_cache, capsys, tmp_path):
    """Scalar math in host code (``math.exp`` of a scalar argument) is
    lowered by ``iree-compile`` to VM ops the VM runs: run-module computes
    it and plan records the one dispatch with exp(1.5) as its push constant
    (the f32's bits)."""
    src = tmp_path / "mexp.mlir"
    src.write_text(MATH_EXP)
    rc, out, err = cli(capsys, "run-module", src, f"--cache_dir={compile_cache}",
                       "--input=4xf32=3", "--input=1.5")
    assert rc == 0, err
    want = np.float32(3) * np.exp(np.float32(1.5))
    assert out.splitlines()[2] == "4xf32=" + " ".join([f"{want:g}"] * 4)
    rc, out, err = cli(capsys, "plan", src, f"--cache_dir={compile_cache}",
                       "--input=4xf32=3", "--input=1.5")
    assert rc == 0, err
    bits = int(np.array(np.exp(np.float32(1.5)), np.float32).view(np.uint32))
    assert f"  constants:   {bits}\n" in out
    assert "step 0: dispatch" in out and "step 1" not in out


@pytest.mark.parametrize("args,words", [
    (["--input=37x53xf32=1", "--input=53x30xf32=1"], ["input1", "[53, 29]", "[53, 30]"]),
    (["--input=37x53xf32=1"], ["takes 2 inputs", "1 --input given"]),
    (["--input=37x53xf32=1", "--input=53x29xq9=1"], ["unknown element type"]),
    (["--input=37x53xf32=1", "--input=@/nonexistent/b.npy"], ["cannot read"]),
    (["--function=nope", "--input=1xf32"], ["no public function @nope", "@matmul"]),
    (["--input=37x53xf32=1", "--input=53x29xf32=1", "--output=@/nonexistent/x.npy"],
     ["not a writable directory"]),
])
def test_bad_inputs_are_one_line(programs, capsys, args, words):
    rc, out, err = cli(capsys, "run-module", ALL_PROGRAMS["matmul"].path,
                       f"--cache_dir={programs}", *args)
    # (a shape the function's own check refuses fails once it runs, after
    # EXEC @matmul, as in iree-run-module)
    assert rc == 1 and out in ("", "EXEC @matmul\n") and len(err.splitlines()) == 1, err
    for w in words:
        assert w in err


def test_scalar_inputs(programs, capsys):
    path = ALL_PROGRAMS["scale_dyn"].path
    rc, out, err = cli(capsys, "run-module", path, f"--cache_dir={programs}",
                       "--input=4xf32=1,2,3,-4", "--input=f32=0.5", "--arch=x86_32")
    assert rc == 0, err
    assert out == "EXEC @scale_dyn\nresult[0]: hal.buffer_view\n4xf32=1.5 3 4.5 -6\n"
    rc, out, err = cli(capsys, "run-module", path, f"--cache_dir={programs}",
                       "--input=4xf32=1", "--input=abc")
    assert rc == 1 and "argument 1 is a f32 scalar" in err and len(err.splitlines()) == 1


def test_missing_file_and_compile_errors_are_one_line(programs, capsys, tmp_path):
    rc, out, err = cli(capsys, "run-module", tmp_path / "none.mlir", "--input=1xf32")
    assert rc == 1 and "no such file" in err.lower() and len(err.splitlines()) == 1
    bad = tmp_path / "bad.mlir"
    bad.write_text("func.func @f(%a: tensor<4xf32>) -> tensor<4xf32> {\n"
                   "  return %b : tensor<4xf32>\n}\n")
    rc, out, err = cli(capsys, "plan", bad, f"--cache_dir={tmp_path}", "--input=4xf32")
    assert rc == 1 and len(err.splitlines()) == 1
    assert "iree-compile failed" in err and "bad.mlir:2" in err


def test_missing_compiler_is_one_line(capsys, tmp_path, monkeypatch):
    import sysconfig
    empty = tmp_path / "empty"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    monkeypatch.setattr(sysconfig, "get_path", lambda name, *a, **k: str(empty))
    rc, out, err = cli(capsys, "run-module", ALL_PROGRAMS["matmul"].path,
                       f"--cache_dir={tmp_path}", "--input=1xf32")
    assert rc == 1 and len(err.splitlines()) == 1
    assert "iree-compile" in err and "3.13.0" in err and "pip install" in err


@pytest.mark.parametrize("args", [
    ["run-module"],
    ["run-module", "x.mlir", "--output_max_element_count=lots"],
    ["run-module", "x.mlir", "--arch=s390x"],
    ["run-module", "x.mlir", "--output=x.npy"],
    ["plan", "x.mlir", "--arch=nope"],
])
def test_usage_errors_exit_2(capsys, args):
    with pytest.raises(SystemExit) as info:
        main(args)
    assert info.value.code == 2
    assert "usage: hal-cpu" in capsys.readouterr().err


def test_help_documents_every_flag():
    import argparse

    from hal_cpu.cli import build_parser
    sub = next(a for a in build_parser()._actions
               if isinstance(a, argparse._SubParsersAction))
    for cmd in ("run-module", "plan"):
        actions = [a for a in sub.choices[cmd]._actions if a.dest != "help"]
        assert {"program", "function", "input", "arch"} <= {a.dest for a in actions}
        for action in actions:
            assert action.help and len(action.help) > 10, (cmd, action.dest)
