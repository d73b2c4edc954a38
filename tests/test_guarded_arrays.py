"""Placement of the pytest fixtures' test arrays (hal_cpu.testing.guarded): flush
against the guard page after them by default, a stated alignment, IREE's
padded placement on request; overruns counted in elements; the x86
instructions qemu-user reads past their operands."""

from __future__ import annotations

import numpy as np
import pytest

import elfloader
from hal_cpu.memory import GuestMemory
from hal_cpu.testing.guarded import (
    ALIGNMENT,
    GuardedArrays,
    elements,
    overrun_elements,
    qemu_overread,
    qemu_overread_of,
)


@pytest.fixture
def arrays():
    backend = elfloader.open_backend("riscv32", "emulated", engine="unicorn")
    placed = GuardedArrays(GuestMemory(backend))
    yield placed
    placed.close()
    backend.close()


@pytest.mark.parametrize("dtype,count", [(np.float32, 101), (np.float64, 3),
                                         (np.int8, 7), (np.uint16, 1),
                                         (np.float32, 1024), (np.float32, 0)])
def test_flush_by_default(arrays, dtype, count):
    values = np.arange(count).astype(dtype)
    a = arrays.place(values)
    assert a.strict and a.padding == 0 and a.end == a.body[1]
    assert a.address % np.dtype(dtype).alignment == 0
    assert a.align == np.dtype(dtype).alignment
    np.testing.assert_array_equal(a.numpy(), values)
    assert "padded" not in repr(a)


@pytest.mark.parametrize("how", [dict(padded=True), dict(strict=False),
                                 dict(align=ALIGNMENT)])
def test_padded_on_request(arrays, how):
    a = arrays.place(np.zeros(101, np.float32), **how)
    assert a.address % ALIGNMENT == 0 and not a.strict
    assert a.padding == -(-404 // 64) * 64 - 404 == 44
    assert "44 bytes padded" in repr(a)
    assert arrays.changed() == []
    arrays.backend.write(a.end + 8, b"\0\0\0\0")        # a write into them
    assert arrays.changed() == [(a, 412, 415)]


def test_padded_default_for_every_array(arrays):
    padded = GuardedArrays(arrays.memory, True)
    a = padded.place(np.zeros(5, np.float32))
    b = padded.place(np.zeros(5, np.float32), padded=False)
    assert a.padding == 44 and b.padding == 0
    padded.close()


def test_stated_alignment(arrays):
    a = arrays.place(np.zeros(5, np.float32), align=16)
    assert a.address % 16 == 0 and a.padding == 12
    b = arrays.place(np.zeros(8, np.float32), align=16)
    assert b.address % 16 == 0 and b.padding == 0
    c = arrays.place(np.zeros(3, np.float32), align=2)   # as stated
    assert c.address % 2 == 0 and c.padding == 0


@pytest.mark.parametrize("align", [0, 3, 24, -8, 1 << 20, 2.5, True])
def test_bad_alignment(arrays, align):
    with pytest.raises(ValueError, match="power of two"):
        arrays.place(np.zeros(4, np.float32), align=align)


def test_padded_and_strict_must_agree(arrays):
    with pytest.raises(ValueError, match="contradicts"):
        arrays.place(np.zeros(4, np.float32), padded=True, strict=True)
    assert arrays.place(np.zeros(4, np.float32), padded=False,
                        strict=True).strict


def test_slack_keeps_canary_after_every_array(arrays):
    arrays.slack = 12
    a = arrays.place(np.zeros(101, np.float32))
    assert a.padding == 12 and a.align == 4
    b = arrays.place(np.zeros(101, np.float32), padded=True)
    assert b.padding == -(-(404 + 12) // 64) * 64 - 404


def test_elements_in_words():
    assert elements(1, np.float32) == "1 float"
    assert elements(8, np.float32) == "8 floats"
    assert elements(2, np.float64) == "2 doubles"
    assert elements(3, np.float16) == "3 halves"
    assert elements(1, np.int32) == "1 int32 element"
    assert elements(5, np.uint8) == "5 uint8 elements"
    assert elements(2, np.dtype([("a", "<i4")])) == "2 struct elements"


def test_overrun_counted_in_elements(arrays):
    a = arrays.place(np.zeros(100, np.float32))
    assert overrun_elements(a, 400, 403) == "1 float past the end"
    assert overrun_elements(a, 400, 431) == "8 floats past the end"
    assert overrun_elements(a, 401, 401) == "1 float past the end"
    assert overrun_elements(a, 412, 412) == "4 floats past the end"
    assert overrun_elements(a, -4, -1) == "1 float before the start"
    assert overrun_elements(a, -1, -1) == "1 float before the start"
    assert overrun_elements(a, -9, -5) == "3 floats before the start"
    d = arrays.place(np.zeros(4, np.float64))
    assert overrun_elements(d, 32, 63) == "4 doubles past the end"


def test_qemu_overreading_instructions():
    assert qemu_overread_of("vfmadd231ss xmm1, xmm0, dword ptr [rdi + rcx*4]") == 12
    assert qemu_overread_of("vfnmsub132sd xmm0, xmm1, qword ptr [eax]") == 8
    assert qemu_overread_of("cvtdq2pd xmm0, qword ptr [rax]") == 8
    assert qemu_overread_of("vcvtdq2pd ymm0, xmmword ptr [rax]") == 16
    for exact in ("vfmadd231ss xmm1, xmm0, xmm2", "vfmadd213ps xmm0, xmm1, "
                  "xmmword ptr [rcx]", "vmovss xmm0, dword ptr [rax]",
                  "addss xmm0, dword ptr [rcx]", "ld1w {z1.s}, p0/z, [x0]", "",
                  None):
        assert qemu_overread_of(exact) == 0, exact


def test_no_slack_off_x86_or_off_qemu():
    backend = elfloader.open_backend("x86_64", "emulated", engine="unicorn")
    try:
        assert qemu_overread(backend, []) == 0
    finally:
        backend.close()
