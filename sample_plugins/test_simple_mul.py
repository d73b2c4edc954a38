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
    pa, pb, pc = plugin.array(a), plugin.array(b), plugin.zeros(n, np.float32)
    for tid in range(-(-n // TILE)):
        status = plugin.call("simple_mul_workgroup", MUL_PARAMS, dict(
            binding0=pa, binding1=pb, binding2=pc, dim=n, tid=tid))
        assert status == 0, f"{hal_arch}: workgroup {tid} returned {status}"
    np.testing.assert_array_equal(plugin.read(pc), a * b)


#: standalone_plugin.c, the params of param_add_workgroup and
#: param_scale_workgroup, as a numpy structured dtype per pointer width
#: this time (pointers and size_t are 4 or 8 bytes wide).
def unary_params(pointer_size: int) -> np.dtype:
    word = f"<u{pointer_size}"
    return np.dtype([("binding0", word), ("binding0_offset", word),
                     ("binding1", word), ("binding1_offset", word),
                     ("dim", word), ("tid", word)])


def test_load_parameters_reach_the_plugin(hal_plugin, hal_arch):
    plugin = hal_plugin(f"{BUNDLE}?bias=2.5&scale=-3")
    assert plugin.plugin.params == [("bias", "2.5"), ("scale", "-3")]
    layout = unary_params(plugin.backend.pointer_size)
    x = np.arange(TILE, dtype=np.float32)
    px, out = plugin.array(x), plugin.zeros(TILE, np.float32)
    assert plugin.call("param_add_workgroup", layout, dict(
        binding0=px, binding1=out, dim=TILE, tid=0)) == 0
    np.testing.assert_array_equal(plugin.read(out), x + 2.5)
    assert plugin.call("param_scale_workgroup", layout, dict(
        binding0=px, binding1=out, dim=TILE, tid=0)) == 0
    np.testing.assert_array_equal(out, x * -3)
