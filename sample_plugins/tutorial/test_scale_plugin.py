"""Tests of scale_plugin.c on six architectures (the README's example)."""

from pathlib import Path

import numpy as np
import pytest

from fatelf.cstruct import CStruct
from hal_cpu.buildtools import zig as zigbuild

HERE = Path(__file__).resolve().parent

#: scale_params_t, described once; laid out per architecture.
SCALE_PARAMS = CStruct("scale_params_t", [
    ("in", "ptr"), ("out", "ptr"), ("n", "size"), ("factor", "f32")])


@pytest.fixture(scope="session")
def scale_sos(tmp_path_factory):
    """scale_plugin.c built for every architecture, with -g."""
    pytest.importorskip("ziglang")
    path = tmp_path_factory.mktemp("scale") / "scale.sos"
    path.write_bytes(zigbuild.build_plugin([HERE / "scale_plugin.c"], "all",
                                           debug=True))
    return path


def test_scale(hal_plugin, hal_arch, scale_sos):
    plugin = hal_plugin(scale_sos)          # loaded for this architecture
    x = np.linspace(-1, 1, 1000, dtype=np.float32)
    src, dst = plugin.array(x), plugin.empty(x.shape, np.float32)
    status = plugin.call("scale_f32", SCALE_PARAMS,
                         {"in": src, "out": dst, "n": x.size, "factor": 0.5})
    assert status == 0
    np.testing.assert_array_equal(plugin.read(dst), x * np.float32(0.5))


def test_params_layout(hal_plugin, hal_arch, scale_sos):
    ptr = hal_plugin(scale_sos).backend.pointer_size
    layout = SCALE_PARAMS.layout(ptr)
    assert layout.offsets == {"in": 0, "out": ptr, "n": 2 * ptr,
                              "factor": 3 * ptr}
    assert layout.size == (32 if ptr == 8 else 16)
