"""Tests of :mod:`hal_cpu.programs`: compiling the test programs with
iree-compile, IREE's runtime as the reference; and the plans of the compiled
programs (:func:`hal_cpu.programs.vm.plan_program`, a record-only run on the VM) run
by :func:`hal_cpu.programs.vm.run_plan`."""

from __future__ import annotations

import os
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import hal_cpu.programs as it
from fatelf import arches
from hal_cpu.programs import vm
from hal_cpu.programs.vm.program import InputMismatchError

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
    ds = vm.plan_program(c, inputs).dispatches
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
    assert vm.run_plan(vm.plan_program(d, [x]), [x])[0].tolist() == (x * x).tolist()


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
    code = ("import sys, hal_cpu, hal_cpu.programs; "
            "print([m for m in sys.modules if m.split('.')[0] in ('iree', 'platformdirs')])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "[]"


# ---------------------------------------------------------------------------
# the plans of the programs

def test_plan_static_single_dispatch(all_compiled):
    c = all_compiled[("matmul", "x86_64")]
    lhs, rhs = PROGRAMS["matmul"].make_inputs(np.random.default_rng(0))
    plan = vm.plan_program(c, [lhs, rhs])
    (d,) = plan.dispatches
    assert d.export_name == "matmul_dispatch_0_matmul_37x29x53_f32"
    assert d.executable == "matmul_dispatch_0"
    assert d.constants == []
    assert d.bindings[:2] == [vm.BindingRef("input", 0, 0, 37 * 53 * 4),
                              vm.BindingRef("input", 1, 0, 53 * 29 * 4)]
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
        (d,) = vm.plan_program(c, inputs).dispatches
        # constants: bits of the f32 scalar, then the dim as two 32-bit halves
        assert d.constants == [_f32_bits(1.75), n, 0]
        assert d.bindings[0] == vm.BindingRef("input", 0, 0, 4 * n)
        out = d.bindings[1]
        assert (out.kind, out.offset, out.length) == ("buffer", 0, 4 * n)
        got[n] = d.workgroup_count
    # the host code computes ceil(n / 4096) workgroups along x
    assert got == {0: (0, 1, 1), 1000: (1, 1, 1), 4096: (1, 1, 1), 4097: (2, 1, 1),
                   5000: (2, 1, 1), 100_000: (25, 1, 1)}


def test_plan_of_an_input_past_the_memory_limit_is_typed(all_compiled):
    """A record-only call still hands its inputs to the program as buffers
    of their bytes: a 16 GiB input (a broadcast view) is past the memory
    limit, one typed error naming the input."""
    c = all_compiled[("scale_dyn", "x86_64")]
    x = np.broadcast_to(np.float32(0), (2**32 + 5,))
    with pytest.raises(vm.VmStatusError, match=r"an input: \d+ bytes") as info:
        vm.plan_program(c, [x, -2.0], memory_limit=1 << 30)
    assert info.value.field == "RESOURCE_EXHAUSTED"


def test_plan_two_dispatches_share_transient_buffer(all_compiled):
    c = all_compiled[("mm_rowsum", "x86_64")]
    inputs = PROGRAMS["mm_rowsum"].make_inputs(np.random.default_rng(0))
    plan = vm.plan_program(c, inputs)
    d0, d1 = plan.dispatches
    assert d0.so_path == d1.so_path and d0.executable == "mm_rowsum_linked"
    assert d0.export_name == "mm_rowsum_dispatch_0_matmul_37x29x53_f32"
    assert d1.export_name == "mm_rowsum_dispatch_1_reduction_37x29_f32"
    (buf, size), = plan.buffers.items()
    assert d0.bindings[2] == vm.BindingRef("buffer", buf, 0, size)
    assert d1.bindings == [vm.BindingRef("buffer", buf, 0, size)] * 2
    r, m = plan.results
    assert (r.shape, m.shape) == ((37,), (37, 29))
    assert r.storage.ref == m.storage.ref == buf
    spans = sorted((x.storage.offset, x.storage.offset + x.storage.length) for x in (r, m))
    assert spans[0][1] <= spans[1][0] <= spans[1][1] <= size


def test_plan_checks_input_shapes(all_compiled):
    c = all_compiled[("matmul", "x86_64")]
    with pytest.raises(InputMismatchError, match=r"@matmul: input1 .*\[53, 29\]"):
        vm.plan_program(c, [np.zeros((37, 53), np.float32), np.zeros((53, 30), np.float32)])
    with pytest.raises(InputMismatchError, match="element type"):
        vm.plan_program(c, [np.zeros((37, 53), np.float64), np.zeros((53, 29), np.float32)])
    with pytest.raises(TypeError, match="takes 2 arguments"):
        vm.plan_program(c, [np.zeros((37, 53), np.float32)])


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
    got = vm.run_plan(vm.plan_program(c, inputs), inputs, _numpy_kernel(name, inputs),
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
    plan = vm.plan_program(c, inputs)
    assert not plan.dispatches
    kinds = {type(s).__name__ for s in plan.steps}
    assert kinds == {"FillStep", "CopyStep"}
    assert plan.results[1].storage.kind == "input" and plan.results[2].storage.ref == 1

    def no_dispatch(d, b):
        raise AssertionError("no dispatch expected")
    got = vm.run_plan(plan, inputs, no_dispatch, fill_byte=0xCD)
    ref = it.reference_run(c.vmfb, "xfer", inputs)
    assert [g.shape for g in got] == [r.shape for r in ref]
    for g, r in zip(got, ref):
        np.testing.assert_array_equal(g, r)


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
    """The committed x86_64 samples are what hal_cpu.buildtools.samples produces now."""
    import json

    from hal_cpu.buildtools import samples as mod
    assert mod.main(["--out", str(tmp_path), "--arch", HOST,
                     "--build-dir", str(tmp_path / "build")]) == 0
    new = json.loads((tmp_path / "manifest.json").read_text())
    old = _manifest()
    for name, k in new["kernels"].items():
        assert k["export"] == old["kernels"][name]["export"]
        assert k["bindings"] == old["kernels"][name]["bindings"]
        assert k["per_arch"][HOST] == old["kernels"][name]["per_arch"][HOST]
