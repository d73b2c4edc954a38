"""The one guarded-range mechanism (elfloader.backend.guarded): the
placement rule shared by test arrays and backend ranges, the canary rule,
the pool's bookkeeping, and a GuardedRange on the native and the emulated
backend."""

from __future__ import annotations

import numpy as np
import pytest

import elfloader
from elfloader.backend.guarded import (
    ALIGN,
    CANARY,
    GuardedRange,
    RangePool,
    canary,
    differ,
    layout,
    salt_at,
)

PAGE = 4096


def test_canary_rule():
    assert canary(ALIGN) == CANARY and len(CANARY) == ALIGN
    for salt in range(256):
        bytes_ = canary(300, salt)
        assert 0x00 not in bytes_ and 0xFF not in bytes_
        assert bytes_[:5] == canary(5, salt)
    # gaps of different pages get different salts (a byte copied from one
    # gap into another differs)
    assert len({salt_at(a * PAGE + 404) for a in range(1, 200)}) > 150


@pytest.mark.parametrize("size", [0, 1, 63, 64, 65, 404, 4095, 4096, 4097,
                                  5 * PAGE + 12, 100 * PAGE])
@pytest.mark.parametrize("align,slack", [(1, 0), (4, 0), (64, 0), (4, 12),
                                         (16, 8)])
def test_placement_rule(size, align, slack):
    start, guard, total = layout(size, PAGE, align, slack)
    tail = guard - start
    assert start % align == 0 and guard % PAGE == 0 and total == guard + PAGE
    assert size + slack <= tail < size + slack + align
    assert start >= PAGE and start - PAGE < PAGE          # one guard below
    # pooled: the same end, in a size class at most a quarter larger
    p_start, p_guard, p_total = layout(size, PAGE, align, slack, pooled=True)
    assert p_guard - p_start == tail
    pages = p_guard // PAGE - 1
    assert pages >= max(1, -(-tail // PAGE))
    assert pages <= max(4, -(-tail // PAGE) * 5 // 4)


def test_bindings_place_as_padded_arrays():
    """A backend range of n bytes lies where a test array of n bytes with
    align=64 does, relative to its upper guard page."""
    for size in (1, 100, 404, 4000, 12000):
        start, guard, _ = layout(size, PAGE)
        p_start, p_guard, _ = layout(size, PAGE, pooled=True)
        assert guard - start == p_guard - p_start == -(-size // 64) * 64


def test_differ():
    assert differ(b"abc", b"abc") is None
    assert differ(b"axcy", b"abcd") == (1, 3)


def test_pool_bookkeeping():
    pool = RangePool(3 * PAGE)
    assert pool.take(PAGE) is None
    assert pool.give(0x1000, PAGE) and pool.give(0x9000, 2 * PAGE)
    assert not pool.give(0x20000, PAGE) and pool.kept == 3 * PAGE
    assert pool.take(2 * PAGE) == 0x9000 and pool.kept == PAGE
    pool.discard(0x1000, PAGE)
    pool.discard(0x1000, PAGE)              # not kept: nothing happens
    assert pool.kept == 0 and pool.take(PAGE) is None
    pool.give(0x1000, PAGE)
    pool.clear()
    assert pool.kept == 0 and pool.take(PAGE) is None


@pytest.fixture(params=["native", "emulated"])
def backend(request):
    if request.param == "native":
        if elfloader.arch.host() is None:
            pytest.skip("no native support on this host")
        be = elfloader.open_backend(None, "native")
    else:
        be = elfloader.open_backend("riscv64", "emulated", engine="unicorn")
    yield be
    be.close()


def test_guarded_range(backend):
    page = backend.page_size
    r = GuardedRange(backend, 101, align=4, slack=12)
    assert r.address % 4 == 0 and r.body == (r.base + page,
                                             r.base + r.span - page)
    assert r.body[1] - (r.address + r.size) == 15        # 101 + 12 -> 116
    r.write_canaries()
    backend.write(r.address, bytes(range(101)))
    assert r.changed() == []
    backend.write(r.address + 103, b"\0")
    backend.write(r.address - 2, b"\0\0")
    assert r.changed() == [(-2, -1), (103, 103)]
    assert r.changed() == []                              # restored
    backend.write(r.address, np.zeros(101, np.uint8))     # the range itself
    assert r.changed() == []
    before = backend.mapped_bytes
    r.release()
    assert backend.mapped_bytes == before - r.span
