"""Tests of :mod:`hal_cpu.iree`: compiling the test programs with
iree-compile, evaluating the HAL-level IR into dispatch plans, running plans,
and IREE's runtime as the reference."""

from __future__ import annotations

import os
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import hal_cpu.iree as it
from fatelf import arches

from program_specs import PROGRAMS

TEST_ARCHES = ("x86_64", "aarch64", "riscv64")
HOST = arches.host_arch()


def e_machine(arch: str) -> int:
    return arches.lookup(arch).machine


@pytest.fixture(scope="module")
def all_compiled(compile_cache):
    """Every program compiled for TEST_ARCHES (in parallel), keyed by (name, arch)."""
    keys = [(n, a) for n in PROGRAMS for a in dict.fromkeys(TEST_ARCHES + (HOST,))]
    done = it.compile_many([(PROGRAMS[n].path, a) for n, a in keys], compile_cache)
    return dict(zip(keys, done))


def _f32_bits(x: float) -> int:
    return struct.unpack("<I", struct.pack("<f", x))[0]


# ---------------------------------------------------------------------------
# compiling

def test_target_flags_cover_all_runtime_arches():
    assert len(arches.RUNTIME_ARCHES) == 6
    for arch in arches.RUNTIME_ARCHES:
        flags = it.target_flags(arch)
        assert flags[:len(it.BASE_FLAGS)] == it.BASE_FLAGS
        assert sum(f.startswith("--iree-llvmcpu-target-triple=") for f in flags) == 1
        assert it.variant_name(arch).startswith("embedded_elf_")
    assert it.target_flags("arm64") == it.target_flags("aarch64")
    assert it.variant_name("arm64") == "embedded_elf_arm_64"
    with pytest.raises(arches.FatElfSelectError, match="s390x"):
        it.target_flags("s390x")


def test_programs_have_documented_public_function():
    for spec in PROGRAMS.values():
        text = spec.path.read_text()
        assert f"Public function: @{spec.function}(" in text
        assert f"func.func @{spec.function}(" in text


@pytest.mark.parametrize("arch", TEST_ARCHES)
@pytest.mark.parametrize("name", list(PROGRAMS))
def test_program_compiles(all_compiled, name, arch):
    c = all_compiled[(name, arch)]
    spec = PROGRAMS[name]
    assert c.vmfb.is_file() and c.hal_mlir.is_file()
    assert c.functions == (spec.function,)
    assert len(c.so_files) == 1          # one hal.executable per program
    so = c.so_files[0]
    head = so.read_bytes()[:20]
    assert head[:4] == b"\x7fELF"
    assert head[4] == (2 if arch in ("x86_64", "aarch64", "riscv64") else 1)
    assert int.from_bytes(head[18:20], "little") == e_machine(arch)
    assert so.name.endswith(f"_{it.variant_name(arch)}.so")

    inputs = spec.make_inputs(np.random.default_rng(0))
    ds = it.plan_dispatches(c, inputs)
    assert len(ds) == spec.num_dispatches
    for d in ds:
        assert d.so_path == so
        assert d.variant == it.variant_name(arch)
        assert d.export_name.encode() in so.read_bytes()
        assert len(d.workgroup_count) == 3 and all(n >= 1 for n in d.workgroup_count)
        assert all(0 <= k < 2**32 for k in d.constants)


def test_compile_is_cached(all_compiled, tmp_path):
    spec = PROGRAMS["scale_dyn"]
    a = it.compile_program(spec.path, "x86_64", tmp_path)
    mtime = a.vmfb.stat().st_mtime_ns
    b = it.compile_program(spec.path, "x86_64", tmp_path)
    assert a == b and b.vmfb.stat().st_mtime_ns == mtime
    assert a.vmfb.parent.parent == tmp_path
    assert a.vmfb.parent.name.startswith("scale_dyn-x86_64-")    # + content key


def test_compile_takes_arch_aliases(all_compiled, compile_cache):
    c = it.compile_program(PROGRAMS["matmul"].path, "ARM64", compile_cache)
    assert c == all_compiled[("matmul", "aarch64")] and c.arch == "aarch64"


SMALL = """
func.func @small(%a: tensor<8xf32>) -> tensor<8xf32> {
  %0 = arith.addf %a, %a : tensor<8xf32>
  return %0 : tensor<8xf32>
}
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"),
                    reason="XDG_CACHE_HOME places the user cache dir on Linux only")
def test_default_cache_dir_reuses_by_content(tmp_path, monkeypatch):
    """Without a directory, outputs go to the user cache dir, one directory per
    content hash: same file, text and flags reuse it; other text or flags, or
    the same text in another file (the IR's locations name the file), do not."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    root = it.default_cache_dir()
    assert root == tmp_path / "xdg" / "portable-kernel-runtime" / "iree-compile"
    src = tmp_path / "small.mlir"
    src.write_text(SMALL)
    a = it.compile_program(src, HOST)
    assert a.vmfb.is_relative_to(root) and a.vmfb.parent.name.startswith(f"small-{HOST}-")
    mtime = a.vmfb.stat().st_mtime_ns
    b = it.compile_program(src, HOST)
    assert b == a and b.vmfb.stat().st_mtime_ns == mtime
    # the same text elsewhere gets its own entry, whose locations name it
    other = tmp_path / "elsewhere" / "small.mlir"
    other.parent.mkdir()
    other.write_text(SMALL)
    e = it.compile_program(other, HOST)
    assert e.vmfb != a.vmfb and str(other) in e.hal_mlir.read_text()
    # other flags or other text: a new entry, the old one stays
    c = it.compile_program(src, HOST, extra_flags=["--iree-llvmcpu-debug-symbols=false"])
    src.write_text(SMALL.replace("addf %a, %a", "mulf %a, %a"))
    d = it.compile_program(src, HOST)
    assert len({a.vmfb.parent, c.vmfb.parent, d.vmfb.parent}) == 3
    assert a.vmfb.stat().st_mtime_ns == mtime
    x = np.arange(8, dtype=np.float32)
    assert it.run_plan(it.plan_program(d, [x]), [x])[0].tolist() == (x * x).tolist()


def test_compile_error_is_reported(tmp_path):
    bad = tmp_path / "bad.mlir"
    bad.write_text("func.func @f(%a: tensor<4xf32>) -> tensor<4xf32> { return %b : tensor<4xf32> }\n")
    with pytest.raises(it.CompileError, match="iree-compile failed") as info:
        it.compile_program(bad, "x86_64", tmp_path / "out")
    assert isinstance(info.value, it.IreeToolError) and "%b" in str(info.value)


def _fake_compiler(directory: Path, version_line: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    exe = directory / "iree-compile"
    exe.write_text("#!/bin/sh\n"
                   "echo 'IREE (https://iree.dev):'\n"
                   f"echo '  {version_line}'\n"
                   "echo '  Optimized build'\n")
    exe.chmod(0o755)
    return exe


@pytest.mark.skipif(sys.platform == "win32", reason="shell script as fake compiler")
def test_other_compiler_version_is_refused(tmp_path, monkeypatch):
    exe = _fake_compiler(tmp_path / "bin", "IREE compiler version 3.12.0rc20250101 @ 0123abcd")
    monkeypatch.setenv("PATH", f"{exe.parent}{os.pathsep}{os.environ['PATH']}")
    for call in (it.find_iree_compile, it.iree_compile_version,
                 lambda: it.compile_program(PROGRAMS["matmul"].path, "x86_64", tmp_path)):
        with pytest.raises(it.IreeToolError) as info:
            call()
        msg = str(info.value)
        assert "\n" not in msg
        assert "3.12.0rc20250101" in msg and "3.13.0" in msg
        assert "pip install 'portable-kernel-runtime[iree]'" in msg
        assert info.value.field == "version" and info.value.value == "3.12.0rc20250101"
    assert not list(tmp_path.glob("matmul-*"))


@pytest.mark.skipif(sys.platform == "win32", reason="shell script as fake compiler")
def test_supported_compiler_build_is_accepted(tmp_path, monkeypatch):
    exe = _fake_compiler(tmp_path / "bin", "IREE compiler version 3.13.0rc20990101 @ 0123abcd")
    monkeypatch.setenv("PATH", f"{exe.parent}{os.pathsep}{os.environ['PATH']}")
    assert it.find_iree_compile() == exe
    assert it.iree_compile_version() == "3.13.0rc20990101"
    # a release that only starts with the same digits is another version
    exe2 = _fake_compiler(tmp_path / "bin2", "IREE compiler version 3.13.01")
    monkeypatch.setenv("PATH", f"{exe2.parent}{os.pathsep}{os.environ['PATH']}")
    with pytest.raises(it.IreeToolError, match="3.13.01"):
        it.find_iree_compile()


def test_missing_compiler_is_reported(tmp_path, monkeypatch):
    import sysconfig
    empty = tmp_path / "empty"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    monkeypatch.setattr(sysconfig, "get_path", lambda name, *a, **k: str(empty))
    with pytest.raises(it.IreeToolError) as info:
        it.find_iree_compile()
    msg = str(info.value)
    assert "\n" not in msg and "not found" in msg
    assert "3.13.0" in msg and "pip install 'portable-kernel-runtime[iree]'" in msg


def test_import_does_not_load_iree():
    code = ("import sys, hal_cpu, hal_cpu.iree; "
            "print([m for m in sys.modules if m.split('.')[0] in ('iree', 'platformdirs')])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "[]"


# ---------------------------------------------------------------------------
# the plans of the programs

def test_plan_static_single_dispatch(all_compiled):
    c = all_compiled[("matmul", "x86_64")]
    lhs, rhs = PROGRAMS["matmul"].make_inputs(np.random.default_rng(0))
    plan = it.plan_program(c, [lhs, rhs])
    (d,) = plan.dispatches
    assert d.export_name == "matmul_dispatch_0_matmul_37x29x53_f32"
    assert d.executable == "matmul_dispatch_0"
    assert d.constants == []
    assert d.bindings[:2] == [it.BindingRef("input", 0, 0, 37 * 53 * 4),
                              it.BindingRef("input", 1, 0, 53 * 29 * 4)]
    out = d.bindings[2]
    assert out.kind == "buffer" and plan.buffers[out.ref] == 37 * 29 * 4
    (res,) = plan.results
    assert res.storage == out and res.shape == (37, 29) and res.dtype == np.float32


@pytest.mark.parametrize("arch", TEST_ARCHES)
def test_plan_dynamic_shape_constants(all_compiled, arch):
    c = all_compiled[("scale_dyn", arch)]
    spec = PROGRAMS["scale_dyn"]
    rng = np.random.default_rng(0)
    got = {}
    for n in (0, 1000, 4096, 4097, 5000, 100_000):
        inputs = spec.make_inputs(rng, n=n, s=1.75)
        (d,) = it.plan_dispatches(c, inputs)
        # constants: bits of the f32 scalar, then the dim as two 32-bit halves
        assert d.constants == [_f32_bits(1.75), n, 0]
        assert d.bindings == [it.BindingRef("input", 0, 0, 4 * n),
                              it.BindingRef("buffer", "transient_buffer", 0, 4 * n)]
        got[n] = d.workgroup_count
    # the host code computes ceil(n / 4096) workgroups along x
    assert got == {0: (0, 1, 1), 1000: (1, 1, 1), 4096: (1, 1, 1), 4097: (2, 1, 1),
                   5000: (2, 1, 1), 100_000: (25, 1, 1)}


def test_plan_big_dim_uses_high_constant(all_compiled):
    c = all_compiled[("scale_dyn", "x86_64")]
    # only shapes are looked at, so a broadcast view stands in for a huge array
    x = np.broadcast_to(np.float32(0), (2**32 + 5,))
    (d,) = it.plan_dispatches(c, [x, -2.0])
    assert d.constants == [_f32_bits(-2.0), 5, 1]


def test_plan_two_dispatches_share_transient_buffer(all_compiled):
    c = all_compiled[("mm_rowsum", "x86_64")]
    inputs = PROGRAMS["mm_rowsum"].make_inputs(np.random.default_rng(0))
    plan = it.plan_program(c, inputs)
    d0, d1 = plan.dispatches
    assert d0.so_path == d1.so_path and d0.executable == "mm_rowsum_linked"
    assert d0.export_name == "mm_rowsum_dispatch_0_matmul_37x29x53_f32"
    assert d1.export_name == "mm_rowsum_dispatch_1_reduction_37x29_f32"
    (buf, size), = plan.buffers.items()
    assert d0.bindings[2] == it.BindingRef("buffer", buf, 0, size)
    assert d1.bindings == [it.BindingRef("buffer", buf, 0, size)] * 2
    r, m = plan.results
    assert (r.shape, m.shape) == ((37,), (37, 29))
    assert r.storage.ref == m.storage.ref == buf
    spans = sorted((x.storage.offset, x.storage.offset + x.storage.length) for x in (r, m))
    assert spans[0][1] <= spans[1][0] <= spans[1][1] <= size


def test_plan_checks_input_shapes(all_compiled):
    c = all_compiled[("matmul", "x86_64")]
    with pytest.raises(ValueError, match="input1"):
        it.plan_program(c, [np.zeros((37, 53), np.float32), np.zeros((53, 30), np.float32)])
    with pytest.raises(ValueError, match="element type"):
        it.plan_program(c, [np.zeros((37, 53), np.float64), np.zeros((53, 29), np.float32)])
    with pytest.raises(ValueError, match="takes 2 arguments"):
        it.plan_program(c, [np.zeros((37, 53), np.float32)])


# ---------------------------------------------------------------------------
# the reference runtime, and run_plan with a numpy stand-in for our runtime

def _tolerance(name):
    return dict(rtol=1e-4, atol=1e-4) if name in ("matmul", "mm_rowsum", "sum_last") \
        else dict(rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("name", list(PROGRAMS))
def test_reference_run_matches_numpy(all_compiled, name):
    c = all_compiled[(name, HOST)]
    spec = PROGRAMS[name]
    inputs = spec.make_inputs(np.random.default_rng(7))
    got = it.reference_run(c.vmfb, spec.function, inputs)
    want = spec.numpy_reference(inputs)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype
        np.testing.assert_allclose(g, w, **_tolerance(name))


def test_reference_run_dynamic_sizes(all_compiled):
    c = all_compiled[("scale_dyn", HOST)]
    spec = PROGRAMS["scale_dyn"]
    for n in (1, 4097, 9000):
        inputs = spec.make_inputs(np.random.default_rng(n), n=n, s=np.float32(-0.5))
        (g,) = it.reference_run(c.vmfb, "scale_dyn", inputs)
        np.testing.assert_allclose(g, spec.numpy_reference(inputs)[0], rtol=1e-6)


def _numpy_kernel(name, inputs):
    """A run_dispatch stand-in for single-dispatch programs: reads the input
    bindings (shaped like ``inputs``), takes scalars from the push constants,
    writes the numpy result into the last binding."""
    spec = PROGRAMS[name]
    tensors = [x for x in inputs if hasattr(x, "shape")]

    def run(dispatch, bindings):
        args = [b.view(t.dtype).reshape(t.shape) for t, b in zip(tensors, bindings)]
        if name == "scale_dyn":
            assert dispatch.constants[1:] == [args[0].size, 0]
            args.append(struct.unpack("<f", struct.pack("<I", dispatch.constants[0]))[0])
        (out,) = spec.numpy_reference(args)
        bindings[-1][:] = np.ascontiguousarray(out).view(np.uint8).reshape(-1)
    return run


@pytest.mark.parametrize("name", [n for n, s in PROGRAMS.items() if s.num_dispatches == 1])
def test_run_plan_plumbing_with_numpy_kernels(all_compiled, name):
    c = all_compiled[(name, HOST)]
    spec = PROGRAMS[name]
    kw = {"n": 3001, "s": 0.25} if name == "scale_dyn" else {}
    inputs = spec.make_inputs(np.random.default_rng(3), **kw)
    got = it.run_plan(it.plan_program(c, inputs), inputs, _numpy_kernel(name, inputs),
                      fill_byte=0xCD)
    ref = it.reference_run(c.vmfb, spec.function, inputs)
    for g, r in zip(got, ref):
        np.testing.assert_allclose(g, r, **_tolerance(name))


XFER = """
func.func @xfer(%a: tensor<100xf32>, %b: tensor<?xf32>) -> (tensor<100xf32>, tensor<100xf32>, tensor<?xf32>, tensor<200xf32>) {
  %c = arith.constant dense<1.5> : tensor<100xf32>
  %cat = tensor.concat dim(0) %a, %a : (tensor<100xf32>, tensor<100xf32>) -> tensor<200xf32>
  return %c, %a, %b, %cat : tensor<100xf32>, tensor<100xf32>, tensor<?xf32>, tensor<200xf32>
}
"""


def test_transfers_and_returned_inputs(tmp_path):
    src = tmp_path / "xfer.mlir"
    src.write_text(XFER)
    c = it.compile_program(src, HOST, tmp_path / "out")
    rng = np.random.default_rng(5)
    inputs = [rng.standard_normal(100).astype(np.float32),
              rng.standard_normal(17).astype(np.float32)]
    plan = it.plan_program(c, inputs)
    assert not plan.dispatches
    kinds = {type(s).__name__ for s in plan.steps}
    assert kinds == {"FillStep", "CopyStep"}
    assert plan.results[1].storage.kind == "input" and plan.results[2].storage.ref == 1
    with pytest.raises(it.EvaluationError, match="transfers"):
        it.plan_dispatches(c, inputs)

    def no_dispatch(d, b):
        raise AssertionError("no dispatch expected")
    got = it.run_plan(plan, inputs, no_dispatch, fill_byte=0xCD)
    ref = it.reference_run(c.vmfb, "xfer", inputs)
    assert [g.shape for g in got] == [r.shape for r in ref]
    for g, r in zip(got, ref):
        np.testing.assert_array_equal(g, r)


# ---------------------------------------------------------------------------
# the interpreter on hand-written HAL-level IR (read by IREE's MLIR parser)

def _hal(body: str, args: str = "%arg0: !hal.buffer_view", extra: str = "") -> str:
    return f"""#map = affine_map<()[s0, s1] -> (s0 ceildiv 16 + s1 * 2)>
module {{
  util.global private @__device_0 : !hal.device
  util.global private @__exe : !hal.executable
  util.initializer {{
    %c0 = arith.constant 0 : index
    %c-1_i64 = arith.constant -1 : i64
    %dev = hal.devices.get %c0 : !hal.device
    util.global.store %dev, @__device_0 : !hal.device
    %e = hal.executable.create device(%dev : !hal.device) affinity(%c-1_i64) target(@ex::@embedded_elf_x86_64) : !hal.executable
    util.global.store %e, @__exe : !hal.executable
    util.return
  }}
{extra}
  util.func public @f({args}) -> !hal.buffer_view attributes {{iree.abi.stub, iree.reflection = {{d = "x {{ y"}}}} {{
    %c0 = arith.constant 0 : index
    %c1 = arith.constant 1 : index
    %c64 = arith.constant 64 : index
    %c128 = arith.constant 128 : index
    %c-1_i64 = arith.constant -1 : i64
    %c0_i64 = arith.constant 0 : i64
    %null = util.null : !hal.fence
    %__dev = util.global.load immutable @__device_0 : !hal.device
    %exe = util.global.load immutable @__exe : !hal.executable
    %buffer = hal.buffer_view.buffer<%arg0 : !hal.buffer_view> : !hal.buffer
    %mt = hal.memory_type<"DeviceVisible|DeviceLocal"> : i32
    %bu = hal.buffer_usage<"Transfer|DispatchStorage"> : i32
    %transient_buffer = hal.device.queue.alloca<%__dev : !hal.device> affinity(%c-1_i64) wait(%null) signal(%null) pool(%c0_i64) type(%mt) usage(%bu) flags("None") : !hal.buffer{{%c128}}
    %cmd = hal.command_buffer.create device(%__dev : !hal.device) mode(OneShot) categories("Transfer|Dispatch") affinity(%c-1_i64) : !hal.command_buffer
    %function_id = hal.executable.lookup.function target(%exe : !hal.executable) function(@ex::@embedded_elf_x86_64::@ex_fn) : i64
{body}
    hal.device.queue.execute<%__dev : !hal.device> affinity(%c-1_i64) wait(%null) signal(%null) commands(%cmd) flags("None")
    %et = hal.element_type<f32> : i32
    %enc = hal.encoding_type<dense_row_major> : i32
    %view = hal.buffer_view.create buffer(%transient_buffer : !hal.buffer)[%c0, %c64] shape([%c1]) type(%et) encoding(%enc) : !hal.buffer_view
    util.return %view : !hal.buffer_view
  }}
}}
"""


def _dispatch_of(tmp_path, consts_ir: str, consts: list[str], inputs, wg="%c1, %c1, %c1",
                 args="%arg0: !hal.buffer_view", extra=""):
    body = consts_ir + f"""
    hal.command_buffer.dispatch<%cmd : !hal.command_buffer> target(%exe : !hal.executable)[%function_id] workgroups([{wg}]) constants([{", ".join(consts)}]) bindings([
      (%buffer : !hal.buffer)[%c0, %c64],
      (%transient_buffer : !hal.buffer)[%c1, %c64]
    ]) flags("None")"""
    p = tmp_path / "t.hal.mlir"
    p.write_text(_hal(body, args, extra))
    (d,) = it.plan_dispatches(p, inputs)
    return d


ARITH_CASES = [
    # (ops producing %r : i32, expected uint32)
    ("%a = arith.constant -7 : i32\n%b = arith.constant 2 : i32\n%r = arith.divsi %a, %b : i32", -3),
    ("%a = arith.constant -7 : i32\n%b = arith.constant 2 : i32\n%r = arith.floordivsi %a, %b : i32", -4),
    ("%a = arith.constant -7 : i32\n%b = arith.constant 2 : i32\n%r = arith.ceildivsi %a, %b : i32", -3),
    ("%a = arith.constant 7 : i32\n%b = arith.constant 2 : i32\n%r = arith.ceildivsi %a, %b : i32", 4),
    ("%a = arith.constant 7 : i32\n%b = arith.constant -2 : i32\n%r = arith.ceildivsi %a, %b : i32", -3),
    ("%a = arith.constant -7 : i32\n%b = arith.constant -2 : i32\n%r = arith.ceildivsi %a, %b : i32", 4),
    ("%a = arith.constant 7 : i32\n%b = arith.constant 2 : i32\n%r = arith.ceildivui %a, %b : i32", 4),
    ("%a = arith.constant -7 : i32\n%b = arith.constant 2 : i32\n%r = arith.divui %a, %b : i32", (2**32 - 7) // 2),
    ("%a = arith.constant -7 : i32\n%b = arith.constant 3 : i32\n%r = arith.remsi %a, %b : i32", -1),
    ("%a = arith.constant -7 : i32\n%b = arith.constant 3 : i32\n%r = arith.remui %a, %b : i32", (2**32 - 7) % 3),
    ("%a = arith.constant 2147483647 : i32\n%b = arith.constant 1 : i32\n%r = arith.addi %a, %b : i32", 2**31),
    ("%a = arith.constant 5 : i32\n%b = arith.constant 9 : i32\n%r = arith.subi %a, %b : i32", -4),
    ("%a = arith.constant 65536 : i32\n%b = arith.constant 65537 : i32\n%r = arith.muli %a, %b overflow<nsw> : i32", 65536),
    ("%a = arith.constant -8 : i32\n%b = arith.constant 1 : i32\n%r = arith.shrui %a, %b : i32", (2**32 - 8) >> 1),
    ("%a = arith.constant -8 : i32\n%b = arith.constant 1 : i32\n%r = arith.shrsi %a, %b : i32", -4),
    ("%a = arith.constant 3 : i32\n%b = arith.constant 30 : i32\n%r = arith.shli %a, %b : i32", 2**31 + 2**30),
    ("%a = arith.constant 12 : i32\n%b = arith.constant 10 : i32\n%r = arith.andi %a, %b : i32", 8),
    ("%a = arith.constant 12 : i32\n%b = arith.constant 10 : i32\n%r = arith.ori %a, %b : i32", 14),
    ("%a = arith.constant 12 : i32\n%b = arith.constant 10 : i32\n%r = arith.xori %a, %b : i32", 6),
    ("%a = arith.constant -1 : i32\n%b = arith.constant 3 : i32\n%r = arith.maxsi %a, %b : i32", 3),
    ("%a = arith.constant -1 : i32\n%b = arith.constant 3 : i32\n%r = arith.minsi %a, %b : i32", -1),
    ("%a = arith.constant -1 : i32\n%b = arith.constant 3 : i32\n%r = arith.maxui %a, %b : i32", -1),
    ("%a = arith.constant -1 : i32\n%b = arith.constant 3 : i32\n%r = arith.minui %a, %b : i32", 3),
    ("%a = arith.constant 1.5 : f32\n%r = arith.bitcast %a : f32 to i32", _f32_bits(1.5)),
    ("%a = arith.constant 0x7FC00000 : f32\n%r = arith.bitcast %a : f32 to i32", 0x7FC00000),
    ("%a = arith.constant -1 : i64\n%r = arith.trunci %a : i64 to i32", -1),
    ("%a = arith.constant 4294967298 : i64\n%r = arith.trunci %a : i64 to i32", 2),
    ("%a = arith.constant -2 : i32\n%x = arith.extsi %a : i32 to i64\n%s = arith.constant 32 : i64\n"
     "%y = arith.shrui %x, %s : i64\n%r = arith.trunci %y : i64 to i32", -1),
    ("%a = arith.constant -2 : i32\n%x = arith.extui %a : i32 to i64\n%s = arith.constant 32 : i64\n"
     "%y = arith.shrui %x, %s : i64\n%r = arith.trunci %y : i64 to i32", 0),
    ("%a = arith.constant -2 : index\n%r = arith.index_cast %a : index to i32", -2),
    ("%a = arith.constant -2 : i32\n%x = arith.index_castui %a : i32 to index\n"
     "%r = arith.index_cast %x : index to i32", -2),
    ("%a = arith.constant 100 : index\n%b = arith.constant 3 : index\n%x = affine.apply #map()[%a, %b]\n"
     "%r = arith.index_cast %x : index to i32", 7 + 6),
    ("%a = arith.constant 100 : index\n%x = affine.apply affine_map<(d0)[s0] -> (d0 floordiv 8 - s0 mod 3)>(%a)[%a]\n"
     "%r = arith.index_cast %x : index to i32", 12 - 1),
    ("%a = arith.constant 100 : index\n%x = affine.min affine_map<(d0) -> (d0, 64)>(%a)\n"
     "%r = arith.index_cast %x : index to i32", 64),
    ("%t = arith.constant true\n%a = arith.constant 1 : i32\n%b = arith.constant 2 : i32\n"
     "%r = arith.select %t, %a, %b : i32", 1),
    ("%t = arith.constant false\n%a = arith.constant 1 : i32\n%b = arith.constant 2 : i32\n"
     "%r = arith.select %t, %a, %b : i32", 2),
]


@pytest.mark.parametrize("ops,expected", ARITH_CASES,
                         ids=[c[0].splitlines()[-1].split("=")[1].split()[0] + f"-{i}"
                              for i, c in enumerate(ARITH_CASES)])
def test_evaluator_arith(tmp_path, ops, expected):
    d = _dispatch_of(tmp_path, "\n".join("    " + l for l in ops.splitlines()), ["%r"],
                     [np.zeros(16, np.float32)])
    assert d.constants == [expected & 0xFFFFFFFF]


@pytest.mark.parametrize("pred,a,b,want", [
    ("eq", 3, 3, 1), ("ne", 3, 3, 0), ("slt", -1, 0, 1), ("ult", -1, 0, 0),
    ("sle", 2, 2, 1), ("ule", -1, 1, 0), ("sgt", 0, -1, 1), ("ugt", -1, 0, 1),
    ("sge", -5, -4, 0), ("uge", -4, -5, 1),
])
def test_evaluator_cmpi(tmp_path, pred, a, b, want):
    ops = f"""    %a = arith.constant {a} : index
    %b = arith.constant {b} : index
    %p = arith.cmpi {pred}, %a, %b : index
    %x = arith.select %p, %c1, %c0 : index
    %r = arith.index_cast %x : index to i32"""
    assert _dispatch_of(tmp_path, ops, ["%r"], [np.zeros(16, np.float32)]).constants == [want]


@pytest.mark.parametrize("pred,a,b,want", [
    ("olt", 1.0, 2.0, 1), ("oge", 1.0, 2.0, 0), ("une", 0.5, 0.5, 0),
    ("ord", 1.0, "0x7FC00000", 0), ("uno", 1.0, "0x7FC00000", 1), ("ult", 1.0, "0x7FC00000", 1),
])
def test_evaluator_cmpf(tmp_path, pred, a, b, want):
    ops = f"""    %a = arith.constant {a} : f32
    %b = arith.constant {b} : f32
    %p = arith.cmpf {pred}, %a, %b : f32
    %r = arith.extui %p : i1 to i32"""
    assert _dispatch_of(tmp_path, ops, ["%r"], [np.zeros(16, np.float32)]).constants == [want]


def test_evaluator_dims_scalars_and_workgroups(tmp_path):
    ops = """    %d = hal.buffer_view.dim<%arg0 : !hal.buffer_view>[1] : index
    %wx = arith.ceildivui %d, %c64 : index
    %r = arith.index_cast %d : index to i32
    %s = arith.bitcast %arg1 : f32 to i32"""
    d = _dispatch_of(tmp_path, ops, ["%s", "%r", "%arg2"], [np.zeros((2, 130), np.float32), 0.5, -3],
                     wg="%wx, %d, %c1",
                     args="%arg0: !hal.buffer_view, %arg1: f32, %arg2: i32")
    assert d.workgroup_count == (3, 130, 1)
    assert d.constants == [_f32_bits(0.5), 130, 2**32 - 3]
    assert d.export_name == "ex_fn" and d.executable == "ex"
    assert d.bindings == [it.BindingRef("input", 0, 0, 64),
                          it.BindingRef("buffer", "transient_buffer", 1, 64)]


def test_evaluator_control_flow(tmp_path):
    ops = """    %d = hal.buffer_view.dim<%arg0 : !hal.buffer_view>[0] : index
    %big = arith.cmpi ugt, %d, %c64 : index
    cf.cond_br %big, ^bb1, ^bb2(%c1 : index)
  ^bb1:  // pred: ^bb0
    %two = arith.constant 2 : index
    cf.br ^bb2(%two : index)
  ^bb2(%n: index):  // 2 preds: ^bb0, ^bb1
    %r = arith.index_cast %n : index to i32"""
    assert _dispatch_of(tmp_path, ops, ["%r"], [np.zeros(100, np.float32)]).constants == [2]
    assert _dispatch_of(tmp_path, ops, ["%r"], [np.zeros(20, np.float32)]).constants == [1]


def _line_of(path: Path, needle: str) -> int:
    (n,) = [k for k, line in enumerate(path.read_text().splitlines(), 1) if needle in line]
    return n


def test_evaluator_unknown_op_is_named(tmp_path):
    """An op without a handler stops the program where it is reached, naming
    the op and its line (here the IR's own: it carries no locations)."""
    ops = """    %u = "foo.mystery"(%c1) : (index) -> index
    %r = arith.constant 9 : i32"""
    with pytest.raises(it.UnsupportedOpError, match="foo.mystery") as info:
        _dispatch_of(tmp_path, ops, ["%r"], [np.zeros(16, np.float32)])
    path = tmp_path / "t.hal.mlir"
    line = _line_of(path, "foo.mystery")
    assert info.value.op == "foo.mystery" and info.value.line == line
    assert str(info.value).startswith(f"{path}: line {line}: cannot run op 'foo.mystery'")


def test_unknown_op_of_a_known_dialect_is_a_parse_error(tmp_path):
    ops = ("    hal.command_buffer.advise_buffer<%cmd : !hal.command_buffer> "
           "buffer(%buffer : !hal.buffer)\n    %r = arith.constant 9 : i32")
    with pytest.raises(it.EvaluationError, match="MLIR cannot parse it") as info:
        _dispatch_of(tmp_path, ops, ["%r"], [np.zeros(16, np.float32)])
    assert info.value.line == _line_of(tmp_path / "t.hal.mlir", "advise_buffer")


def test_evaluator_skips_no_effect_ops(tmp_path):
    ops = """    hal.command_buffer.execution_barrier<%cmd : !hal.command_buffer> source("Dispatch|Transfer|CommandRetire") target("CommandIssue|Dispatch|Transfer") flags("None")
    %alloc = hal.device.allocator<%__dev : !hal.device> : !hal.allocator
    hal.buffer.assert<%buffer : !hal.buffer> message("input0") allocator(%alloc : !hal.allocator) minimum_length(%c64) type(DeviceVisible) usage("Transfer")
    %r = arith.constant 9 : i32"""
    assert _dispatch_of(tmp_path, ops, ["%r"], [np.zeros(16, np.float32)]).constants == [9]


def test_parse_error_names_line(tmp_path):
    p = tmp_path / "bad.hal.mlir"
    p.write_text(_hal("    %r = arith.constant 9 : i32\n    this is not an op"))
    with pytest.raises(it.EvaluationError, match="MLIR cannot parse it") as info:
        it.plan_program(p, [np.zeros(16, np.float32)])
    assert info.value.line == _line_of(p, "this is not an op") and info.value.path == p


def test_evaluator_memoized_command_buffer(tmp_path):
    extra = """  util.global private @__f_memo : !hal.command_buffer
  util.func private @__f_memo_apply() -> !hal.command_buffer {
    %c0 = arith.constant 0 : index
    %c1 = arith.constant 1 : index
    %c8 = arith.constant 8 : index
    %c2 = arith.constant 2 : index
    %c-1_i64 = arith.constant -1 : i64
    %dev = util.global.load immutable @__device_0 : !hal.device
    %exe = util.global.load immutable @__exe : !hal.executable
    %cmd = hal.command_buffer.create device(%dev : !hal.device) mode("None") categories("Transfer|Dispatch") affinity(%c-1_i64) bindings(%c2) : !hal.command_buffer
    %function_id = hal.executable.lookup.function target(%exe : !hal.executable) function(@ex2::@embedded_elf_x86_64::@memo_fn) : i64
    hal.command_buffer.dispatch<%cmd : !hal.command_buffer> target(%exe : !hal.executable)[%function_id] workgroups([%c2, %c1, %c1]) bindings([
      (%c1 : index)[%c8, %c8],
      (%c0 : index)[%c0, %c8]
    ]) flags("None")
    util.return %cmd : !hal.command_buffer
  }
  util.initializer {
    %0 = util.call @__f_memo_apply() : () -> !hal.command_buffer
    util.global.store %0, @__f_memo : !hal.command_buffer
    util.return
  }"""
    body = """    %memo = util.global.load immutable @__f_memo : !hal.command_buffer
    %c16 = arith.constant 16 : index
    hal.device.queue.execute.indirect<%__dev : !hal.device> affinity(%c-1_i64) wait(%null) signal(%null) commands(%memo) bindings([
      (%buffer : !hal.buffer)[%c0, %c64],
      (%transient_buffer : !hal.buffer)[%c16, %c16]
    ]) flags("None")"""
    p = tmp_path / "m.hal.mlir"
    p.write_text(_hal(body, extra=extra))
    (d,) = it.plan_dispatches(p, [np.zeros(16, np.float32)])
    assert d.export_name == "memo_fn" and d.workgroup_count == (2, 1, 1)
    assert d.bindings == [it.BindingRef("buffer", "transient_buffer", 24, 8),
                          it.BindingRef("input", 0, 0, 8)]


# ---------------------------------------------------------------------------
# the bundled samples of hal_cpu/samples

SAMPLES = Path(__file__).resolve().parent.parent / "hal_cpu" / "samples"


def _manifest():
    import json
    return json.loads((SAMPLES / "manifest.json").read_text())


def test_sample_manifest_matches_files():
    import hashlib
    m = _manifest()
    assert m["format"] == 1 and set(m["arches"]) == set(arches.RUNTIME_ARCHES)
    assert set(m["kernels"]) == {"mul_add", "matmul", "sum_last"}
    for name, k in m["kernels"].items():
        roles = [b["role"] for b in k["bindings"]]
        assert roles.count("output") == 1 and roles[-1] == "output"
        assert k["reference"] in ("mul_add", "matmul", "sum_last")
        for b in k["bindings"]:
            assert b["length"] == int(np.prod(b["shape"])) * np.dtype(b["dtype"]).itemsize
        for arch, p in k["per_arch"].items():
            data = (SAMPLES / p["file"]).read_bytes()
            assert len(data) == p["size"]
            assert hashlib.sha256(data).hexdigest() == p["sha256"]
            assert int.from_bytes(data[18:20], "little") == e_machine(arch)
            assert k["export"].encode() in data
            assert len(p["workgroup_count"]) == 3 and min(p["workgroup_count"]) >= 1


def test_samples_rebuild_identically(tmp_path):
    """The committed x86_64 samples are what build_samples.py produces now."""
    import importlib.util
    import json
    spec = importlib.util.spec_from_file_location("build_samples", SAMPLES / "build_samples.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.main(["--out", str(tmp_path), "--arch", HOST,
                     "--build-dir", str(tmp_path / "build")]) == 0
    new = json.loads((tmp_path / "manifest.json").read_text())
    old = _manifest()
    for name, k in new["kernels"].items():
        assert k["export"] == old["kernels"][name]["export"]
        assert k["bindings"] == old["kernels"][name]["bindings"]
        assert k["per_arch"][HOST] == old["kernels"][name]["per_arch"][HOST]
