"""Executable plugins with real artifacts: our sample plugins (embedded,
system, FatELF), IREE-compiled executables that import from them, and the
plugin manager's ordering and failure behaviour."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest

from hal_cpu import (
    Executable,
    PluginError,
    PluginSpecError,
    PluginStatusError,
    UnresolvedImportError,
)
from hal_cpu.plugins import PluginManager, PluginSpec
from hal_cpu.programs import compile_program
from hal_cpu.programs.vm import PlanRunner, plan_program, run_plan

from conftest import PREBUILT, ROOT, SIMPLE_MUL

EXAMPLE = ROOT / "sample_plugins" / "standalone_example.mlir"
OPTIONAL = ROOT / "sample_plugins" / "optional_import.mlir"
ALL_ARCHES = ["x86_64", "aarch64", "riscv64", "x86_32", "arm32", "riscv32"]


def run_with_plugins(compile_cache, mlir, arch, inputs, plugins, function):
    comp = compile_program(mlir, arch, compile_cache)
    plan = plan_program(comp, inputs, function, plugins=plugins)
    with PlanRunner(backend=plugins.backend if plugins else "auto",
                    arch=arch, plugins=plugins) as runner:
        return run_plan(plan, inputs, runner)


@pytest.mark.parametrize("arch", ALL_ARCHES)
def test_simple_mul_import_matches_numpy(compile_cache, arch):
    rng = np.random.default_rng(5)
    a, b = rng.standard_normal((2, 200)).astype(np.float32)
    with PluginManager(arch) as plugins:
        plugins.register_spec(str(PREBUILT / "standalone.sos"))
        assert plugins.backend.kind == ("native" if arch == "x86_64" else "emulated")
        (out,) = run_with_plugins(compile_cache, EXAMPLE, arch, [a, b], plugins,
                                  "mixed_invocation")
    np.testing.assert_allclose(out, a * b + b, rtol=1e-6)


def test_last_registered_plugin_wins(compile_cache):
    a = np.arange(100, dtype=np.float32)
    b = np.full(100, 2, np.float32)
    for order, plus in (([("standalone.sos"), ("standalone_alt.sos")], 1000),
                        ([("standalone_alt.sos"), ("standalone.sos")], 0)):
        with PluginManager("riscv64") as plugins:
            for name in order:
                plugins.register_spec(str(PREBUILT / name))
            (out,) = run_with_plugins(compile_cache, EXAMPLE, "riscv64", [a, b],
                                      plugins, "mixed_invocation")
        np.testing.assert_allclose(out, a * b + plus + b)


def test_python_plugin_from_native_and_emulated_code(compile_cache):
    a = np.arange(130, dtype=np.float32)
    b = np.full(130, 3, np.float32)

    def mul_minus_one(params, context):
        p = params.struct(SIMPLE_MUL)
        b0, o0, b1, o1, b2, o2 = (p[k] for k in (
            "binding0", "binding0_offset", "binding1", "binding1_offset",
            "binding2", "binding2_offset"))
        dim, tid = p["dim"], p["tid"]
        lo, hi = tid * 64, min(dim, tid * 64 + 64)
        x = params.array(b0 + 4 * (o0 + lo), np.float32, hi - lo)
        y = params.array(b1 + 4 * (o1 + lo), np.float32, hi - lo)
        params.store(b2 + 4 * (o2 + lo), x * y - 1)
        return 0

    for arch in ("x86_64", "aarch64", "x86_32"):
        with PluginManager(arch) as plugins:
            plugins.register_spec(str(PREBUILT / "standalone.sos"))
            plugins.register_python({"simple_mul_workgroup": mul_minus_one})
            (out,) = run_with_plugins(compile_cache, EXAMPLE, arch, [a, b],
                                      plugins, "mixed_invocation")
        np.testing.assert_allclose(out, a * b - 1 + b)


def test_python_plugin_error_propagates(compile_cache):
    def boom(params, context):
        raise RuntimeError("kernel failed")

    a = np.ones(10, np.float32)
    for arch in ("x86_64", "riscv64"):
        with PluginManager(arch) as plugins:
            plugins.register_python({"simple_mul_workgroup": boom})
            with pytest.raises(RuntimeError, match="kernel failed"):
                run_with_plugins(compile_cache, EXAMPLE, arch, [a, a], plugins,
                                 "mixed_invocation")


@pytest.mark.parametrize("arch", ["x86_64", "aarch64"])
def test_optional_import_falls_back(compile_cache, arch):
    a = np.arange(70, dtype=np.float32)
    b = np.full(70, 2, np.float32)
    comp = compile_program(OPTIONAL, arch, compile_cache)
    # No plugin provides ?missing_fn: it resolves to NULL and the mode-0
    # fallback computes the product itself.
    with PluginManager(arch) as plugins:
        plugins.register_spec(str(PREBUILT / "standalone.sos"))
        (out,) = run_with_plugins(compile_cache, OPTIONAL, arch, [a, b, 0],
                                  plugins, "optional_mul")
        np.testing.assert_allclose(out, a * b)
        (out,) = run_with_plugins(compile_cache, OPTIONAL, arch, [a, b, 1],
                                  plugins, "optional_mul")
        np.testing.assert_allclose(out, a * b)
        fns, _ = plugins.resolve(["?missing_fn", "?simple_mul_workgroup"])
        assert fns[0] == 0 and fns[1] != 0
    # Without any plugin every optional import is NULL; the fallback runs.
    with Executable(comp.so_files[0], arch=arch) as exe:
        assert exe.imports and all(n.startswith("?") for n in exe.imports)
    (out,) = run_with_plugins(compile_cache, OPTIONAL, arch, [a, b, 0], None,
                              "optional_mul")
    np.testing.assert_allclose(out, a * b)


def test_missing_required_import_lists_names(compile_cache):
    comp = compile_program(EXAMPLE, "x86_64", compile_cache)
    with pytest.raises(UnresolvedImportError, match="simple_mul_workgroup") as info:
        Executable(comp.so_files[0])
    assert info.value.missing == ["simple_mul_workgroup"]
    with PluginManager("x86_64") as plugins:
        plugins.register_python({"other": lambda p, c: 0}, name="pyplugin")
        plugins.register_spec(str(PREBUILT / "system_plugin_x86_64.so"))
        with pytest.raises(UnresolvedImportError) as info:
            Executable(comp.so_files[0], plugins=plugins)
        assert info.value.missing == ["simple_mul_workgroup"]
        assert info.value.searched == ["sample_system", "pyplugin"]
        assert "sample_system" in str(info.value)


def test_system_plugin_natively(compile_cache):
    a = np.arange(65, dtype=np.float32)
    with PluginManager("x86_64") as plugins:
        plugin = plugins.register_spec(str(PREBUILT / "system_plugin_x86_64.so"))
        assert plugin.kind == "system"
        (out,) = run_with_plugins(compile_cache, ROOT / "sample_plugins" /
                                  "system_example.mlir", "x86_64", [a, a],
                                  plugins, None)
    np.testing.assert_allclose(out, a * a + a)


def test_load_parameters_and_host_allocator(compile_cache):
    x = np.linspace(-1, 1, 100, dtype=np.float32)
    for arch in ("x86_64", "riscv32"):
        with PluginManager(arch) as plugins:
            plugins.register_spec(f"{PREBUILT / 'standalone.sos'}?bias=2.5&scale=-2")
            assert plugins.allocator.sizes, "load() allocates through the host allocator"
            (out,) = run_with_plugins(compile_cache, ROOT / "sample_plugins" /
                                      "param_example.mlir", arch, [x], plugins,
                                      "add_bias")
            np.testing.assert_allclose(out, x + 2.5)
            plugins.close()
            assert not plugins.allocator.sizes, "unload() frees its instance"


# --- bad input ---------------------------------------------------------------
def _file_offset(data: bytes, vaddr: int) -> int:
    e_phoff, = struct.unpack_from("<Q", data, 0x20)
    e_phnum, = struct.unpack_from("<H", data, 0x38)
    for i in range(e_phnum):
        p_type, _, p_offset, p_vaddr, _, p_filesz = struct.unpack_from(
            "<IIQQQQ", data, e_phoff + 56 * i)
        if p_type == 1 and p_vaddr <= vaddr < p_vaddr + p_filesz:
            return vaddr - p_vaddr + p_offset
    raise AssertionError(hex(vaddr))


def _patched_plugin(tmp_path, patch) -> Path:
    data = bytearray((PREBUILT / "standalone_x86_64.so").read_bytes())
    patch(data)
    out = tmp_path / "patched_x86_64.so"
    out.write_bytes(bytes(data))
    return out


def assert_nothing_registered(plugins, mapped_before):
    assert plugins.plugins == []
    assert plugins.backend.mapped_bytes == mapped_before


def test_query_returning_null(tmp_path):
    def patch(data):
        pos = data.find(bytes.fromhex("480f45c1"))  # cmovne rax, rcx
        data[pos:pos + 4] = bytes.fromhex("0f1f4000")  # nop: always NULL
    path = _patched_plugin(tmp_path, patch)
    with PluginManager("x86_64") as plugins:
        before = plugins.backend.mapped_bytes
        with pytest.raises(PluginError, match="returned NULL for version 0x1"):
            plugins.register_embedded(path)
        assert_nothing_registered(plugins, before)


def test_newer_plugin_version(tmp_path):
    with PluginManager("x86_64") as plugins:
        p = plugins.register_embedded(PREBUILT / "standalone_x86_64.so")
        module = p.module
        lib = plugins.backend.call(module.lookup("iree_hal_executable_plugin_query"), 1, 0)
        header = struct.unpack("<Q", plugins.backend.read(lib, 8))[0]
        vaddr = header - module.base
    data = (PREBUILT / "standalone_x86_64.so").read_bytes()
    off = _file_offset(data, vaddr)
    assert struct.unpack_from("<I", data, off)[0] == 1
    path = _patched_plugin(tmp_path, lambda d: struct.pack_into("<I", d, off, 2))
    with PluginManager("x86_64") as plugins:
        before = plugins.backend.mapped_bytes
        with pytest.raises(PluginError, match="version 0x2 is newer than the "
                           "supported version 0x1"):
            plugins.register_embedded(path)
        assert_nothing_registered(plugins, before)


def test_load_error_status():
    for arch in ("x86_64", "aarch64"):
        with PluginManager(arch) as plugins:
            before = plugins.backend.mapped_bytes
            with pytest.raises(PluginStatusError) as info:
                plugins.register_spec(f"{PREBUILT / 'standalone.sos'}?bias=oops")
            assert info.value.code_name == "INVALID_ARGUMENT"
            assert "load returned INVALID_ARGUMENT" in str(info.value)
            assert_nothing_registered(plugins, before)
            assert not plugins.allocator.sizes


def test_resolve_error_status():
    with PluginManager("riscv64") as plugins:
        plugins.register_spec(str(PREBUILT / "standalone.sos"))
        with pytest.raises(UnresolvedImportError, match="missing_fn"):
            plugins.resolve(["simple_mul_workgroup", "missing_fn"])


def test_system_plugin_for_foreign_arch():
    with PluginManager("aarch64") as plugins:
        before = plugins.backend.mapped_bytes
        with pytest.raises(PluginError, match="host only"):
            plugins.register_spec(str(PREBUILT / "system_plugin_x86_64.so"))
        assert_nothing_registered(plugins, before)


@pytest.mark.parametrize("spec", ["", "embedded:", "?bias=1", "x.sos?bias",
                                  "x.sos?=1&&"])
def test_malformed_spec(spec):
    with pytest.raises(PluginSpecError):
        PluginSpec(spec)


def test_spec_kinds():
    assert PluginSpec("a/b.sos").kind == "embedded"
    assert PluginSpec("embedded:a/b.so?k=v%20w").params == [("k", "v w")]
    assert PluginSpec("/usr/lib/libfoo.so").kind == "system"


def test_from_specs_failure_leaves_nothing(tmp_path):
    with pytest.raises(PluginError):
        PluginManager.from_specs([str(PREBUILT / "standalone.sos"),
                                  str(tmp_path / "absent.so")], arch="x86_64")
