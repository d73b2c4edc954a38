"""IREE's plugin header, ``iree/hal/local/executable_plugin.h``, as hal_cpu
declares it (``hal_cpu/include``): a plugin written the way IREE's samples
are, including only that header, builds with ``build_plugin`` /
``hal-cpu build-plugin`` unmodified and runs, natively and emulated, and
the same x86_64 object runs under IREE's own ``iree-run-module``."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import hal_cpu
from hal_cpu import PluginStatusError
from hal_cpu.buildtools import zig as zigbuild
from hal_cpu.plugins import PluginManager
from hal_cpu.programs import compile_program, vm

ROOT = Path(__file__).resolve().parent.parent
SOURCE = ROOT / "tests" / "plugins" / "iree_header_plugin.c"
EXAMPLE = ROOT / "sample_plugins" / "standalone_example.mlir"

pytestmark = pytest.mark.skipif(not zigbuild.zig_available(), reason="ziglang not installed")


@pytest.fixture(scope="module")
def header_plugin(tmp_path_factory) -> Path:
    """The plugin for x86_64 and aarch64, one FatELF bundle."""
    out = tmp_path_factory.mktemp("header_plugin") / "iree_header_plugin.sos"
    out.write_bytes(zigbuild.build_plugin([SOURCE], "x86_64,aarch64"))
    return out


def test_header_is_on_the_include_path():
    include = Path(hal_cpu.get_include())
    header = include / "iree" / "hal" / "local" / "executable_plugin.h"
    assert header.is_file()
    # plugin_abi.h takes the ABI from IREE's header name: one home
    assert '#include "iree/hal/local/executable_plugin.h"' in (
        include / "plugin_abi.h").read_text()


@pytest.mark.parametrize("arch", ["x86_64", "aarch64"])
def test_plugin_runs(header_plugin, compile_cache, arch):
    """out = a * b * scale (plugin, ``scale`` a load parameter) + b
    (generated code), against numpy."""
    comp = compile_program(EXAMPLE, arch, compile_cache)
    rng = np.random.default_rng(3)
    a = rng.standard_normal(200).astype(np.float32)
    b = rng.standard_normal(200).astype(np.float32)
    with PluginManager.from_specs([f"{header_plugin}?scale=3"], arch=arch) as plugins:
        with vm.load_program(comp, arch=arch, plugins=plugins) as program:
            (out,) = program("mixed_invocation", a, b)
    np.testing.assert_allclose(out, a * b * np.float32(3) + b, rtol=1e-6)


def test_status_from_the_header_macros(header_plugin):
    """``iree_hal_executable_plugin_status_from_code(INVALID_ARGUMENT)`` from
    ``load`` is the plugin's status error with that code."""
    with pytest.raises(PluginStatusError) as info:
        PluginManager.from_specs([f"{header_plugin}?fail=1"], arch="x86_64")
    assert info.value.code == 3 and info.value.code_name == "INVALID_ARGUMENT"


def test_cli_build_and_debug_build_without_ubsan(tmp_path):
    """``hal-cpu build-plugin`` builds the source as it is; an unoptimized
    build (``-O0``, where zig's clang would add UBSan calls nothing can
    resolve in a freestanding object) is still self-contained."""
    out = tmp_path / "p.so"
    proc = subprocess.run([sys.executable, "-m", "hal_cpu", "build-plugin", str(SOURCE),
                           "--arch=x86_64", "-o", str(out)], capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert out.read_bytes()[:4] == b"\x7fELF"
    data = zigbuild.build_plugin([SOURCE], "x86_64", defines=["-O0"], debug=True)
    assert data  # build_plugin checked it is self-contained (no undefined symbol)
    assert "-fno-sanitize=undefined" in zigbuild.CFLAGS


@pytest.mark.skipif(shutil.which("iree-run-module") is None,
                    reason="IREE's iree-run-module is not installed")
def test_same_object_runs_under_iree(tmp_path, compile_cache):
    """The x86_64 object built here loads in IREE's runtime (the header's
    layouts are IREE's) and computes what hal_cpu computes."""
    so = tmp_path / "iree_header_plugin.so"
    zigbuild.build_plugin_file([SOURCE], so, "x86_64")
    comp = compile_program(EXAMPLE, "x86_64", compile_cache)
    proc = subprocess.run(
        ["iree-run-module", "--device=local-sync", f"--module={comp.vmfb}",
         f"--executable_plugin={so}", "--function=mixed_invocation",
         "--input=100xf32=2", "--input=100xf32=4"],
        capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "100xf32=12 12 12" in proc.stdout
