"""Backend.time_limit: the per-call limit for a block of guest calls."""

from __future__ import annotations

import contextlib
import os
import threading

import pytest

import elfloader


@pytest.fixture
def be():
    backend = elfloader.open_backend(kind="native")
    yield backend
    backend.close()


def test_block_sets_and_restores_the_limit(be):
    be.timeout_us = 7
    with be.time_limit(0.5):
        assert be.timeout_us == 500_000
    assert be.timeout_us == 7


def test_a_lone_block_of_zero_removes_the_limit(be):
    be.timeout_us = 7
    with be.time_limit(0):
        assert be.timeout_us == 0
    assert be.timeout_us == 7


def test_nested_blocks_keep_the_shortest_non_zero_limit(be):
    with be.time_limit(2):
        with be.time_limit(0.5):
            assert be.timeout_us == 500_000
            with be.time_limit(0):
                assert be.timeout_us == 500_000
            with be.time_limit(3):
                assert be.timeout_us == 500_000
        assert be.timeout_us == 2_000_000
    assert be.timeout_us == 0


def test_limit_is_restored_when_the_block_raises(be):
    with pytest.raises(RuntimeError):
        with be.time_limit(1):
            raise RuntimeError
    assert be.timeout_us == 0


@contextlib.contextmanager
def block_on_another_thread(be, seconds: float):
    """A ``time_limit(seconds)`` block held open by another thread for the
    duration of the ``with``."""
    entered, leave = threading.Event(), threading.Event()

    def other():
        with be.time_limit(seconds):
            entered.set()
            leave.wait(10)

    t = threading.Thread(target=other)
    t.start()
    assert entered.wait(10)
    try:
        yield
    finally:
        leave.set()
        t.join()


def test_blocks_on_threads_share_the_shortest(be):
    with block_on_another_thread(be, 0.25):
        with be.time_limit(1):
            assert be.timeout_us == 250_000
        assert be.timeout_us == 250_000
    assert be.timeout_us == 0


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_can_set_a_limit(be):
    """In a child forked while another thread's block is open, a block
    works (the lock is new) and the open one still counts."""
    with block_on_another_thread(be, 0.25):
        pid = os.fork()
        if pid == 0:
            try:
                with be.time_limit(1):
                    ok = be.timeout_us == 250_000
                os._exit(0 if ok else 1)
            finally:
                os._exit(2)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
