"""The engine contract: what an emulated address space
(:class:`~.space.EmulatedBackend`) needs from the thing that runs guest
code, and what an engine may use of the space.

Two engines run guest code:

* ``qemu`` (:mod:`.qemu_engine`): a guest agent, a small static Linux
  program of the guest architecture, runs under qemu-user in a child
  process and maps the backend's guest memory (a ``memfd``). It runs the
  vector ISAs real kernels use (AVX2/FMA, SVE/SVE2 at any vector length,
  RVV 1.0 at any VLEN, NEON) at qemu-user's speed. Needs ``qemu-<arch>``
  (Debian/Ubuntu package ``qemu-user``).
* ``unicorn`` (:mod:`.unicorn_engine`): unicorn 2.1 CPUs in this process
  (QEMU 5.0: no AVX/AVX2/FMA, no RVV 1.0, no SVE). Needs nothing more
  than the ``unicorn`` wheel.

An engine hands the address space its arena (the guest addresses it may
allocate), host memory for each reservation (:class:`Region`), and CPUs
(:class:`Cpu`): each CPU has its own registers and stack, applies the
space's memory-map log before its calls, runs one call at a time and can
be stopped from another thread. The space's shared state (page map, log,
callbacks, CPUs, lock) is a :class:`~.state.SpaceState`; an engine sees
the space itself only as a :class:`Space`. Which engine runs an
architecture is :mod:`.choice`'s business. Only the engine modules import
unicorn or start qemu-user.
"""

from __future__ import annotations

import threading
from typing import Protocol

from fatelf import arches

from ...arch import Arch
from ...errors import BackendError
from .state import Region, SpaceState

__all__ = ["FAULTS", "STACK_SIZE", "Cpu", "Engine", "Region", "Space"]

#: Bytes of each CPU's stack (a guard page lies below it).
STACK_SIZE = 1 << 20

#: Faults by (access, mapped): the ``kind`` and ``what`` of the
#: :class:`~elfloader.errors.Fault` an :class:`EmulationError` carries.
FAULTS = {
    ("read", False): ("read_unmapped", "read from unmapped memory"),
    ("write", False): ("write_unmapped", "write to unmapped memory"),
    ("fetch", False): ("fetch_unmapped", "instruction fetch from unmapped memory"),
    ("read", True): ("read_protected", "read from unreadable memory"),
    ("write", True): ("write_protected", "write to read-only memory"),
    ("fetch", True): ("fetch_protected",
                      "instruction fetch from non-executable memory"),
}


class Space(Protocol):
    """What an engine and its CPUs use of the address space they serve
    (:class:`~.space.EmulatedBackend`).

    Attributes:
        arch: the guest architecture.
        page_size: the space's page size, bytes.
        timeout_us: the limit of one call in microseconds (0: none), read
            at the start of every call.
        state: the shared state (:class:`~.state.SpaceState`).
        cpu: the space's own CPU, which closes only with the space.
    """

    arch: Arch
    page_size: int
    timeout_us: int
    state: SpaceState[Cpu]
    cpu: Cpu

    def read(self, address: int, size: int) -> bytes:
        """Guest bytes (see :meth:`elfloader.backend.Backend.read`)."""
        ...

    def write(self, address: int, data) -> None:
        """Write guest bytes (see :meth:`elfloader.backend.Backend.write`)."""

    def place_code(self, code: bytes) -> int:
        """Machine code in fresh read+execute memory; its address."""
        ...

    def release_stack(self, stack: int) -> None:
        """Give back a CPU's stack (its lowest address)."""


class Cpu:
    """State every engine's CPU shares; the engine modules subclass it.

    What the address space calls besides :meth:`call`, :meth:`stop` and
    :meth:`close`: :meth:`sync`, :meth:`map_all`, :meth:`start` and
    :meth:`close_engine`, each with the space's lock held.

    Attributes:
        page_size: the engine's page size, bytes.
        thread: ident of the thread running a call, or None.
        gen: entries of the space's memory-map log this CPU has applied.
        stack: lowest address of this CPU's stack, None before
            :meth:`start`.
    """

    page_size = 4096

    def __init__(self, space: Space):
        self._space = space
        self._state = space.state
        self.arch = space.arch
        self.thread: int | None = None
        self.gen = 0
        self._closed = False
        self._stop = False
        self.stack: int | None = None
        self._stack_top = 0

    # --- what the engines implement -----------------------------------------
    def call(self, address: int, *args: int) -> int:
        """Call ``address`` with integer arguments (see
        :meth:`elfloader.backend.Backend.call`).

        Raises:
            EmulationError: the CPU faulted, was stopped, or ran past the
                space's ``timeout_us``.
            BackendError: the space or this CPU is closed, or this CPU is
                already running a call.
        """
        raise NotImplementedError

    def stop(self) -> None:
        """Ask the running call (on another thread) to end as soon as
        possible; it raises :class:`EmulationError` with ``fault.kind``
        ``"stopped"``. Does nothing when the CPU is idle."""
        raise NotImplementedError

    def sync(self) -> None:
        """Apply the space's memory-map log entries this CPU has not seen.
        Called with the space's lock held, when this CPU is not running or
        from its own callback."""
        raise NotImplementedError

    def map_all(self) -> None:
        """Map the space's whole address space into this new CPU. Called
        with the space's lock held."""
        raise NotImplementedError

    def start(self, stack: int) -> None:
        """Use ``stack`` (the lowest address of a stack of
        :data:`STACK_SIZE` bytes) for calls."""
        self.stack = stack
        self._stack_top = stack + STACK_SIZE - 64

    def close_engine(self) -> None:
        """Free the engine's resources of this CPU now."""
        raise NotImplementedError

    # --- shared -------------------------------------------------------------
    def _enter(self, address: int) -> None:
        """Mark this CPU as running a call on this thread, after applying
        pending memory-map changes."""
        state = self._state
        with state.lock:
            if self._closed or state.closed:
                raise BackendError("the emulated backend is closed",
                                   field="call", value=address)
            me = threading.get_ident()
            for c in state.cpus:
                if c.thread == me:
                    raise BackendError("a Python callback may not call back "
                                       "into emulated code", field="call",
                                       value=address)
            if self.thread is not None:
                raise BackendError("this CPU is running another call (use "
                                   "fork_cpu() for one CPU per thread)",
                                   field="call", value=address)
            self.sync()
            self.thread = me
            self._stop = False

    def _leave(self) -> None:
        self.thread = None
        state = self._state
        if state.log or state.dead:
            with state.lock:
                state.trim()

    def close(self) -> None:
        """Free this CPU (not the backend's own: close the backend). Its
        stack goes back to the backend."""
        state = self._state
        with state.lock:
            if self._closed:
                return
            if self is self._space.cpu:
                raise BackendError("the backend's own CPU closes with the "
                                   "backend", field="close", value=None)
            if self.thread is not None:
                raise BackendError("cannot close a CPU while it runs a call",
                                   field="close", value=None)
            state.cpus.remove(self)
            self.close_engine()
            if self.stack is not None and not state.closed:
                self._space.release_stack(self.stack)
            state.trim()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class Engine:
    """One engine serving one address space.

    Attributes:
        name: ``"qemu"`` or ``"unicorn"``.
        profile: the CPU profile its CPUs model, or None (the most capable
            model the engine has).
        vlen: vector length in bits of a scalable profile (or of the
            default model), else None.
        arena: ``(start, end)`` guest addresses the space may allocate.
        eager_sync: memory-map changes are cheap for this engine's CPUs:
            idle ones apply them at once.
        defer_free: a released reservation's host memory must outlive the
            CPUs that may still run on it (freed once every CPU unmapped
            it); False when it can be freed at once.
    """

    name = ""
    eager_sync = True
    defer_free = True

    def __init__(self, arch: Arch, profile: arches.Profile | None,
                 vlen: int | None):
        self.arch = arch
        self.profile = profile
        self.vlen = vlen
        self.arena = (0, 0)

    def region(self, address: int, size: int) -> Region:
        """Zeroed read/write host memory for the reservation
        ``[address, address + size)``."""
        raise NotImplementedError

    def new_cpu(self, space: Space) -> Cpu:
        """A new CPU of ``space`` (not yet started)."""
        raise NotImplementedError

    def setup(self, space: Space, slots: int) -> list[int]:
        """Prepare ``space`` once its first CPU and stack exist; returns the
        guest addresses of ``slots`` callback entry points, in order."""
        raise NotImplementedError

    def describe(self) -> str:
        """``engine, CPU model`` for messages and ``--verbose``."""
        cpu = self.profile.name if self.profile else "most capable model"
        if self.vlen:
            cpu += f", vector length {self.vlen} bits"
        return f"{self.name} ({cpu})"

    def close(self) -> None:
        """Free what the engine holds for the space (after its CPUs)."""
