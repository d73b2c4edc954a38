"""simple_mul_workgroup of the sample plugin on six architectures, written
only with the hal-cpu pytest fixtures (what a plugin author would write).

Run: python -m pytest sample_plugins/test_simple_mul.py [--hal-arch=host]
"""

from pathlib import Path

import numpy as np

from fatelf.cstruct import CStruct

BUNDLE = Path(__file__).resolve().parent / "prebuilt" / "standalone.sos"
TILE = 64   # elements per workgroup (sample_common.h, TILE_SIZE)

#: sample_common.h, mul_params_t: described once, laid out per architecture.
MUL_PARAMS = CStruct("mul_params_t", [
    ("binding0", "ptr"), ("binding0_offset", "size"),
    ("binding1", "ptr"), ("binding1_offset", "size"),
    ("binding2", "ptr"), ("binding2_offset", "size"),
    ("dim", "size"), ("tid", "size"),
    ("processor_id", "u32"), ("processor_data", "ptr")])


def test_simple_mul_workgroup(hal_plugin, hal_arch):
    plugin = hal_plugin(BUNDLE)
    rng = np.random.default_rng(7)
    n = 3 * TILE + 5
    a = rng.standard_normal(n).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32)
    pa, pb, pc = plugin.array(a), plugin.array(b), plugin.array(np.zeros(n, np.float32))
    for tid in range(-(-n // TILE)):
        status = plugin.call("simple_mul_workgroup", MUL_PARAMS, dict(
            binding0=pa, binding1=pb, binding2=pc, dim=n, tid=tid))
        assert status == 0, f"{hal_arch}: workgroup {tid} returned {status}"
    np.testing.assert_array_equal(plugin.read(pc, np.float32, n), a * b)


#: standalone_plugin.c, the params of param_add_workgroup, as a numpy
#: structured dtype this time (64-bit architectures only: fixed widths).
PARAM_ADD_64 = np.dtype([("binding0", "<u8"), ("binding0_offset", "<u8"),
                         ("binding1", "<u8"), ("binding1_offset", "<u8"),
                         ("dim", "<u8"), ("tid", "<u8")])


def test_load_parameters_reach_the_plugin(hal_plugin, hal_arch):
    plugin = hal_plugin(f"{BUNDLE}?bias=2.5")
    assert plugin.plugin.params == [("bias", "2.5")]
    if plugin.backend.pointer_size != 8:
        return
    n = TILE
    x = np.arange(n, dtype=np.float32)
    px, pout = plugin.array(x), plugin.array(np.zeros(n, np.float32))
    status = plugin.call("param_add_workgroup", PARAM_ADD_64, dict(
        binding0=px, binding1=pout, dim=n, tid=0))
    assert status == 0
    np.testing.assert_array_equal(plugin.read(pout, np.float32, n), x + 2.5)
