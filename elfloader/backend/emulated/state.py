"""What an emulated address space shares with the CPUs that run on it.

:class:`~.space.EmulatedBackend` owns one :class:`SpaceState` and hands it
to every CPU its engine makes. The state holds:

* the page map (:class:`~.pages.PageMap`): the protection of every page,
  the truth both engines enforce;
* the reservations: guest ranges and the host memory behind them
  (:class:`Region`);
* the memory-map log: each change (map, protect, unmap, invalidate) is
  logged, numbered by :attr:`SpaceState.gen`, and each CPU applies the
  entries it has not seen before its next call;
* released reservations a CPU may still reach (:attr:`SpaceState.dead`),
  freed once every CPU has applied their unmap;
* the Python callbacks by guest address, and the callback entry points;
* the CPUs, and the lock that guards all of it.

A CPU takes part through the three members of :class:`LogReader`; the
rest of what a CPU offers the space is in :class:`.engine.Cpu`.
"""

from __future__ import annotations

import threading
from typing import Callable, Generic, Protocol, TypeVar

from .pages import PageMap


class Region(Protocol):
    """Host memory behind one reservation of the address space."""

    address: int     # guest address
    size: int        # bytes, whole pages
    host: int        # host address of the first byte

    def free(self) -> None:
        """Give the host memory back."""


class LogReader(Protocol):
    """What the state needs of a CPU.

    Attributes:
        gen: entries of the memory-map log the CPU has applied
            (:attr:`SpaceState.gen` once it is up to date).
        thread: ident of the thread running a call on the CPU, or None.
    """

    gen: int
    thread: int | None

    def sync(self) -> None:
        """Apply the log entries the CPU has not seen. Called with the
        state's lock held, when the CPU is not running or from its own
        callback."""


CpuT = TypeVar("CpuT", bound=LogReader)


class SpaceState(Generic[CpuT]):
    """The shared state of one emulated address space (see the module
    docstring). Everything but :attr:`pages`'s lookups and the CPUs' own
    reads of the log is changed with :attr:`lock` held.

    Args:
        eager_sync: the engine's memory-map changes are cheap: CPUs that
            are not running apply each change at once (:meth:`record`).

    Attributes:
        lock: guards the state (re-entrant: a callback on a CPU's thread
            may change the memory map).
        closed: the address space is closed.
        pages: the protection of every mapped page.
        regions: reservation address -> its :class:`Region`.
        log: memory-map changes not yet applied by every CPU, as
            ``(kind, address, size, arg)``: ``"map"`` (``arg``: host
            address), ``"protect"`` (``arg``: protection), ``"unmap"``,
            ``"invalidate"``.
        gen: memory-map changes ever logged; :attr:`log` holds the last
            ``len(log)`` of them.
        dead: ``(gen, region)`` of released reservations whose host memory
            is freed once every CPU has applied ``gen`` changes.
        callbacks: guest address of a callback entry point -> ``(Python
            function, number of integer arguments)``.
        slots: guest addresses of the callback entry points, in order.
        cpus: the space's CPUs, its own first.
    """

    def __init__(self, eager_sync: bool):
        self.eager_sync = eager_sync
        self.lock = threading.RLock()
        self.closed = False
        self.pages = PageMap()
        self.regions: dict[int, Region] = {}
        self.log: list[tuple[str, int, int, object]] = []
        self.gen = 0
        self.dead: list[tuple[int, Region]] = []
        self.callbacks: dict[int, tuple[Callable[..., int], int]] = {}
        self.slots: list[int] = []
        self.cpus: list[CpuT] = []

    def record(self, kind: str, address: int, size: int, arg=None) -> None:
        """Log one change of the memory map and apply it to every CPU that
        can take it now: those not running, and the one whose callback is
        running on this thread. Called with the lock held."""
        self.log.append((kind, address, size, arg))
        self.gen += 1
        if self.eager_sync:
            me = threading.get_ident()
            for cpu in self.cpus:
                if cpu.thread is None or cpu.thread == me:
                    cpu.sync()
        self.trim()

    def trim(self) -> None:
        """Drop log entries every CPU has applied and free host memory no
        CPU can reach any more. Called with the lock held."""
        if not self.log and not self.dead:
            return
        done = min((c.gen for c in self.cpus), default=self.gen)
        first = self.gen - len(self.log)
        if done > first:
            del self.log[:done - first]
        if self.dead:
            keep = []
            for gen, region in self.dead:
                if gen <= done:
                    region.free()
                else:
                    keep.append((gen, region))
            self.dead = keep
