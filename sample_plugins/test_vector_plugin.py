"""vector_plugin.c (prebuilt/vector.sos): auto-vectorized imports built for
each architecture's vector profile (AVX2+FMA, SVE, RVV, NEON, Zve32f), run
on the qemu engine modelling that CPU, at every vector length it has."""

from pathlib import Path

import numpy as np
import pytest

# The profile each architecture's record of vector.sos is built for.
from build import VECTOR_PROFILES  # noqa: E402 (sample_plugins/build.py)

from elfloader.backend.emulated import qemu_program
from fatelf import arches
from fatelf.cstruct import CStruct
from hal_cpu.testing.pytest_plugin import LoadedPlugin

HERE = Path(__file__).resolve().parent
VECTOR_SOS = HERE / "prebuilt" / "vector.sos"

SAXPY = CStruct("saxpy_params_t", [("x", "ptr"), ("y", "ptr"), ("out", "ptr"),
                                   ("n", "size"), ("a", "f32")])
DOT = CStruct("dot_params_t", [("x", "ptr"), ("y", "ptr"), ("out", "ptr"),
                               ("n", "size")])

CASES = [pytest.param(arch, cpu, vlen, id=f"{arch}-{cpu}" + (f"-{vlen}" if vlen else ""))
         for arch, cpu in VECTOR_PROFILES.items()
         for vlen in (sorted(arches.profile(arch, cpu).vlens) or [None])]


@pytest.mark.parametrize("arch,cpu,vlen", CASES)
def test_vector_imports(arch, cpu, vlen):
    if qemu_program(arch) is None:
        pytest.skip("the vector profiles run on the qemu engine (qemu-user)")
    rng = np.random.default_rng(3)
    plugin = LoadedPlugin(str(VECTOR_SOS), arch, "emulated", cpu=cpu, vlen=vlen,
                          engine="qemu")
    try:
        for n in (0, 1, 7, 64, 1000, 4099):       # tails of every length
            x = rng.standard_normal(n).astype(np.float32)
            y = rng.standard_normal(n).astype(np.float32)
            gx, gy, out = plugin.array(x), plugin.array(y), plugin.zeros(n)
            assert plugin.call("vector_saxpy", SAXPY, {
                "x": gx, "y": gy, "out": out, "n": n, "a": 1.75}) == 0
            want = (np.float64(1.75) * x + y).astype(np.float32)
            np.testing.assert_allclose(plugin.read(out), want, rtol=1e-6,
                                       atol=1e-6)
            i8x = rng.integers(-128, 128, n).astype(np.int8)
            i8y = rng.integers(-128, 128, n).astype(np.int8)
            dx, dy, dot = plugin.array(i8x), plugin.array(i8y), plugin.zeros(1, np.int32)
            assert plugin.call("vector_dot_i8", DOT, {
                "x": dx, "y": dy, "out": dot, "n": n}) == 0
            assert plugin.read(dot)[0] == int(i8x.astype(np.int64) @ i8y.astype(np.int64))
            for a in (gx, gy, out, dx, dy, dot):
                plugin.free(a)
    finally:
        plugin.close()
