"""The interface every backend implements.

A backend owns an address space of one architecture: it allocates and
protects memory, copies bytes in and out, calls functions with the C calling
convention and turns Python callables into C function pointers. Everything
above it (the ELF loader, the executable library and plugin ABIs) is written
once against this interface.
"""

from __future__ import annotations

import abc
import contextlib
import functools
import os
import threading
from typing import Callable, Iterator

import numpy as np

from ..arch import Arch

PROT_NONE, PROT_READ, PROT_WRITE, PROT_EXEC = 0, 1, 2, 4

# Guards every backend's active time limits (Backend.time_limit).
_LIMITS_LOCK = threading.Lock()


def _after_fork_in_child() -> None:
    # A lock held by a thread of the parent would never be released.
    global _LIMITS_LOCK
    _LIMITS_LOCK = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def prot_str(prot: int) -> str:
    return "".join(c if prot & b else "-" for c, b in
                   (("r", PROT_READ), ("w", PROT_WRITE), ("x", PROT_EXEC)))


class Backend(abc.ABC):
    """An address space and a CPU of one architecture.

    Attributes:
        arch: the :class:`~elfloader.arch.Arch` whose code runs here.
        kind: ``"native"`` or ``"emulated"``.
        page_size: granularity of :meth:`reserve` and :meth:`protect`, bytes.
    """

    kind: str
    arch: Arch
    page_size: int
    #: Limit of one guest call in microseconds (0: none); only the emulated
    #: backend can stop a call, natively it is not enforced. Set it for a
    #: block of calls with :meth:`time_limit`.
    timeout_us: int = 0
    # While time_limit blocks are active: the limit they replaced and each
    # block's limit in microseconds, in the order they began.
    _limits_base: int = 0
    _limits_active: list[int] | None = None
    # Set by close(); every use of a closed backend raises BackendError.
    _closed: bool = False

    @property
    def pointer_size(self) -> int:
        return self.arch.pointer_size

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called: the backend's memory is gone
        and every use of it (``read``, ``write``, ``call``, a view...)
        raises :class:`~elfloader.BackendError`."""
        return self._closed

    @property
    def modules(self) -> list:
        """The :class:`~elfloader.ElfModule` s loaded in this address space
        and not closed, in address order (a debugger's symbol files, a
        report's symbols). Held weakly: a module nobody keeps is not kept
        alive by its backend."""
        loaded = self.__dict__.get("_modules")
        if loaded is None:
            return []
        return sorted((m for m in loaded if m.loaded), key=lambda m: m.lo)

    def _add_module(self, module) -> None:
        """Called by :class:`~elfloader.ElfModule` once it is loaded."""
        import weakref
        self.__dict__.setdefault("_modules", weakref.WeakSet()).add(module)

    # --- memory -----------------------------------------------------------
    @abc.abstractmethod
    def reserve(self, size: int, align: int = 0) -> int:
        """Map ``size`` bytes (rounded up to :attr:`page_size`), zeroed and
        read/write, aligned to ``align`` bytes (a power of two; at least a
        page); returns the address. Never executable."""

    @abc.abstractmethod
    def alloc(self, size: int, align: int = 16) -> int:
        """Allocate ``size`` zeroed read/write bytes aligned to ``align``."""

    @abc.abstractmethod
    def release(self, address: int) -> None:
        """Free memory returned by :meth:`reserve`, :meth:`alloc` or
        :meth:`place_code`."""

    @abc.abstractmethod
    def read(self, address: int, size: int) -> bytes:
        """Copy ``size`` bytes out of the address space."""

    @abc.abstractmethod
    def write(self, address: int, data) -> None:
        """Copy bytes-like ``data`` into the address space (ignores the page
        protection, like a debugger would)."""

    @abc.abstractmethod
    def protect(self, address: int, size: int, prot: int) -> None:
        """Set the protection of a page-aligned range of a reservation to a
        combination of PROT_READ/WRITE/EXEC. Writable and executable together
        is refused."""

    def place_code(self, code: bytes) -> int:
        """Put machine code in fresh memory and make it read+execute.

        Returns the address of the first instruction."""
        size = -(-len(code) // self.page_size) * self.page_size
        address = self.reserve(size)
        self.write(address, code)
        self.protect(address, size, PROT_READ | PROT_EXEC)
        return address

    def read_cstring(self, address: int, limit: int = 4096) -> str:
        """Read a NUL-terminated UTF-8 string of at most ``limit`` bytes."""
        out = bytearray()
        while len(out) < limit:
            chunk = self.read(address + len(out), min(64, limit - len(out)))
            end = chunk.find(b"\0")
            if end >= 0:
                out += chunk[:end]
                return out.decode("utf-8", "replace")
            out += chunk
        return out.decode("utf-8", "replace")

    def alloc_bytes(self, data: bytes, align: int = 16) -> int:
        """Allocate and fill; returns the address."""
        address = self.alloc(max(len(data), 1), align)
        if data:
            self.write(address, data)
        return address

    # --- arrays -----------------------------------------------------------
    @abc.abstractmethod
    def map_array(self, array: np.ndarray) -> tuple[int, Callable[[], None]]:
        """Make a C-contiguous array visible to guest code.

        Returns ``(address, finish)``; call ``finish()`` (unless it is None)
        after the guest has run to bring its writes back into ``array`` and
        free any copy. The native backend hands out the array's own memory
        when it is writable and aligned (zero copy, ``finish`` None). The
        address is 64-byte aligned; read-only arrays are never written.
        The emulated backend puts a guard page after the copy: its
        ``finish()`` raises :class:`~elfloader.GuardError` (after copying
        back) when the guest wrote past the array's end."""

    def alloc_guarded(self, size: int
                      ) -> tuple[int, Callable[[], None] | None]:
        """``size`` zeroed read/write bytes, 64-byte aligned, for memory
        guest code may overrun (a backend that can puts a guard page after
        it). Returns ``(address, check)``; ``check()``, unless None, raises
        :class:`~elfloader.GuardError` when guest code wrote past the end
        (this backend: ``check`` is always None). Free with
        :meth:`release`."""
        return self.alloc(max(size, 1), 64), None

    def stacks(self) -> list[tuple[int, int]]:
        """``(lowest address, size in bytes)`` of each CPU's stack, worker
        0's first, where the backend knows them (the emulated backend);
        empty natively."""
        return []

    def guard_page(self, address: int) -> tuple[int, int] | None:
        """``(guard page, start of the range it guards)`` when ``address``
        lies in the guard page after a live range from :meth:`map_array` or
        :meth:`alloc_guarded`; None otherwise (always, on this backend)."""
        return None

    # --- calls ------------------------------------------------------------
    @contextlib.contextmanager
    def time_limit(self, seconds: float) -> Iterator[None]:
        """Limit each guest call to ``seconds`` (0: none) inside the block
        (:attr:`timeout_us`; only the emulated backend stops a call).

        The limit is the backend's, shared by every thread: while blocks on
        several threads (or nested ones) overlap, the shortest non-zero
        limit among them applies to all, and the limit from before the
        first block comes back when the last one ends."""
        us = int(seconds * 1e6) if seconds else 0
        with _LIMITS_LOCK:
            active = self._limits_active
            if active is None:
                self._limits_base = self.timeout_us
                active = self._limits_active = []
            active.append(us)
            self.timeout_us = _shortest(active)
        try:
            yield
        finally:
            with _LIMITS_LOCK:
                active.remove(us)
                if active:
                    self.timeout_us = _shortest(active)
                else:
                    self.timeout_us = self._limits_base
                    self._limits_active = None

    @abc.abstractmethod
    def call(self, address: int, *args: int) -> int:
        """Call ``address`` with integer/pointer arguments in the C calling
        convention; returns the integer result register, unsigned, pointer
        width. Interpret narrower results with :func:`as_int32`."""

    def function(self, address: int, nargs: int) -> Callable[..., int]:
        """A callable for repeated calls of ``address`` with ``nargs``
        integer arguments, each already in range (unsigned, pointer width);
        faster than :meth:`call` where the backend allows."""
        call = self.call
        return lambda *args: call(address, *args)

    def bound_calls(self, address: int,
                    args: list[tuple[int, ...]]) -> list[Callable[[], int]]:
        """One no-argument callable per worker, calling ``address`` with that
        worker's fixed integer arguments ``args[w]`` (all of one length, each
        in range), for calls that may run at once on ``len(args)`` host
        threads; the cheapest way to repeat a call (see
        :meth:`worker_functions`)."""
        fns = self.worker_functions(address, len(args[0]), len(args))
        return [functools.partial(f, *a) for f, a in zip(fns, args)]

    def view(self, address: int, size: int) -> memoryview | None:
        """A writable ``memoryview`` (format ``B``) of ``size`` bytes of
        memory from :meth:`alloc`, valid until it is released; None when the
        backend cannot expose its memory (then use :meth:`write`)."""
        return None

    def worker_functions(self, address: int, nargs: int,
                         workers: int) -> list[Callable[..., int]]:
        """One callable per worker for calls of ``address`` that may run at
        the same time on ``workers`` host threads (natively every thread
        runs on the host CPU; the emulated backend gives each worker its own
        CPU sharing the memory)."""
        return [self.function(address, nargs)] * workers

    def stop_workers(self, workers: int) -> None:
        """Ask calls running on the first ``workers`` callables of
        :meth:`worker_functions` to end as soon as possible (they raise
        :class:`~elfloader.EmulationError` with ``fault.kind`` ``"stopped"``).
        Natively a call cannot be stopped: this does nothing."""

    @abc.abstractmethod
    def callback(self, function: Callable[..., int], nargs: int) -> int:
        """A C function pointer that calls ``function(*int_args) -> int``.

        Exceptions raised by ``function`` are re-raised by the :meth:`call`
        that reached it. The pointer lives as long as the backend."""

    def close(self) -> None:
        """Release everything the backend holds."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _shortest(limits: list[int]) -> int:
    """The limit of overlapping time_limit blocks: a lone block's own (0
    too), else the shortest non-zero one."""
    if len(limits) == 1:
        return limits[0]
    return min((u for u in limits if u), default=0)


def as_int32(value: int) -> int:
    """Low 32 bits of a result register as a signed C ``int``."""
    value &= 0xFFFFFFFF
    return value - (1 << 32) if value & 0x80000000 else value
