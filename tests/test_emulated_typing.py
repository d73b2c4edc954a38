"""Paths of the emulated backend that its type annotations single out."""

from elfloader.arch import by_name
from elfloader.backend.emulated.space import EmulatedBackend


def test_unicorn_reuses_pooled_guarded_range_with_another_lead() -> None:
    """A pooled guarded range reused for another lead logs each protection
    change with its protection, which the unicorn engine applies."""
    backend = EmulatedBackend(by_name("x86_64"), engine="unicorn")
    try:
        page = backend.page_size
        first, _ = backend.alloc_guarded(10 * page)
        backend.release(first)
        # Same size class, a lead one page longer.
        second, _ = backend.alloc_guarded(9 * page - 64)
        backend.release(second)
    finally:
        backend.close()
