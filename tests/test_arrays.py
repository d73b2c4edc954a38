"""hal_cpu.empty/zeros/full/asarray give 64-byte-aligned arrays, used in
place by a native dispatch; a large misaligned binding warns once per
export (AlignmentCopyWarning) and still gives the right result."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pytest

import elfloader
import hal_cpu
from hal_cpu import AlignmentCopyWarning, Executable, PerformanceWarning

SAMPLES = Path(hal_cpu.__file__).parent / "samples"
KERNEL = json.loads((SAMPLES / "manifest.json").read_text())["kernels"]["mul_add"]
HOST = elfloader.arch.host()


@pytest.mark.parametrize("make", [
    lambda: hal_cpu.empty((3, 5), np.int16),
    lambda: hal_cpu.zeros(1000),
    lambda: hal_cpu.full((2, 2, 2), 7, np.uint8),
    lambda: hal_cpu.asarray(np.arange(1001, dtype=np.float64)[1:]),
    lambda: hal_cpu.asarray([[1, 2], [3, 4]], np.float32),
])
def test_arrays_are_aligned_and_writable(make):
    a = make()
    assert a.ctypes.data % 64 == 0 and a.flags.c_contiguous and a.flags.writeable


def test_array_values_shapes_dtypes():
    assert hal_cpu.zeros((2, 3), np.int32).tolist() == [[0] * 3] * 2
    f = hal_cpu.full(4, 2.5)
    assert f.dtype == np.float64 and f.tolist() == [2.5] * 4
    src = np.arange(12, dtype=np.float32).reshape(3, 4)[:, 1:]
    a = hal_cpu.asarray(src)
    assert a.shape == (3, 3) and (a == src).all()
    assert hal_cpu.asarray(a) is a                 # already aligned: as it is
    assert hal_cpu.empty((4, 0)).shape == (4, 0)   # (empty: no data to align)
    with pytest.raises(ValueError):
        hal_cpu.empty((-1,))
    assert issubclass(AlignmentCopyWarning, PerformanceWarning)


@pytest.mark.skipif(HOST is None or HOST.name not in KERNEL["per_arch"],
                    reason="no sample for this host")
def test_large_misaligned_binding_warns_once_per_export():
    entry = KERNEL["per_arch"][HOST.name]
    n = 5003
    big = 1 << 19                                  # 2 MiB of float32
    a = np.full(big + 1, 1.5, np.float32)[1:]      # 4 bytes past alignment
    assert a.ctypes.data % 64
    b, c = hal_cpu.full(n, 2.0, np.float32), hal_cpu.zeros(n)
    with Executable(SAMPLES / entry["file"], backend="native") as exe:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for _ in range(3):
                exe.dispatch(KERNEL["export"], entry["workgroup_count"], [a, b, c])
        assert [w.category for w in caught] == [AlignmentCopyWarning]
        assert "binding 0" in str(caught[0].message)
        assert (c == 4.5).all()
        aligned = hal_cpu.asarray(a)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            c[:] = 0
            exe.dispatch(KERNEL["export"], entry["workgroup_count"],
                         [aligned, b, c])
        assert (c == 4.5).all()
