"""The qemu engine's TCG plugin: instruction counts and memory shadows of
guest code, shared with the host through a results ``memfd``.

``workbench.c`` (built by ``build.py`` into the committed FatELF bundle
``tcg_plugin.sos``, one shared object per host architecture) declares the
qemu plugin API it uses in ``qemu_plugin_api.h``. An engine made while
:func:`request` is in effect loads it into every agent (see
:mod:`..qemu_engine`); :func:`results_of` gives the address space's
:class:`Results`, the memory both sides read and write. The word indices
below are the plugin's (``workbench.c``'s ``W_*``).
"""

from __future__ import annotations

import contextlib
import mmap
import os
import threading
import weakref
from typing import Any, Iterator

import numpy as np

from ....errors import EngineError

BUNDLE = os.path.join(os.path.dirname(__file__), "tcg_plugin.sos")

MODE_COUNT, MODE_SANITIZE = 1, 2
#: With MODE_SANITIZE: accesses outside bindings only (no shadow).
MODE_OUTSIDE_ONLY = 4
MAGIC = 0x68616C776F726B31
W_MAGIC, W_GENERATION, W_ACTIVE = 0, 1, 2
W_LOOP_LO, W_LOOP_HI, W_N_KERNEL, W_KERNEL = 4, 5, 6, 7
W_N_STATES, W_CX, W_CY, W_CZ, W_N_BINDINGS = 23, 24, 25, 26, 27
W_COUNTS_OFF, W_COUNTS_CAP = 28, 29
W_EVENTS_OFF, W_EVENTS_CAP, W_EVENTS_N, W_EVENTS_LOST = 30, 31, 32, 33
W_UNSEEN = 36
W_STATES, W_BINDINGS, BINDING_WORDS = 64, 320, 6
MAX_KERNEL, MAX_STATES, MAX_BINDINGS = 8, 256, 64
EVENT_WORDS = 8
FLAG_UNINITIALIZED = 1
#: Event kinds the plugin writes (``EV_*``).
EVENT_KINDS = {1: "race", 2: "order", 4: "uninitialized", 5: "outside"}

HEADER = 8192
#: Workgroups whose counts are kept (8 bytes each).
COUNTS_CAP = 1 << 20
#: Events kept per dispatch (64 bytes each); more are counted as lost.
EVENTS_CAP = 1 << 16
#: Binding bytes a dispatch may have under the sanitizer (8 shadow bytes
#: each: writer and reader).
SHADOW_CAP = 16 << 20

_lock = threading.Lock()
_requested = 0
_plugin_fds: dict[str, int] = {}
_results: "weakref.WeakKeyDictionary[Any, Results]" = weakref.WeakKeyDictionary()


@contextlib.contextmanager
def request(mode: int) -> Iterator[None]:
    """Engines made inside the block load the plugin in ``mode``
    (:data:`MODE_COUNT` | :data:`MODE_SANITIZE`); blocks nest, modes
    combine."""
    global _requested
    with _lock:
        before = _requested
        _requested |= mode
    try:
        yield
    finally:
        with _lock:
            _requested = before


def requested() -> int:
    """The mode engines made now load the plugin in (0: none)."""
    return _requested


def plugin_fd() -> int:
    """A ``memfd`` holding the plugin for this host (made once).

    Raises:
        EngineError: the bundle is missing or has no plugin for this host.
    """
    import fatelf
    from fatelf import arches
    host = arches.host()
    name = host.name if host else os.uname().machine
    with _lock:
        fd = _plugin_fds.get(name)
        if fd is not None:
            return fd
        try:
            with open(BUNDLE, "rb") as f:
                data = fatelf.select(f.read(), name)
        except (OSError, fatelf.FatElfError) as exc:
            raise EngineError(f"no qemu plugin for host {name} in {BUNDLE}: "
                              f"{exc}", field="plugin", value=name) from None
        fd = os.memfd_create(f"tcg_plugin_{name}", os.MFD_CLOEXEC)
        os.write(fd, data)
        _plugin_fds[name] = fd
        return fd


class Results:
    """The results ``memfd`` of one instrumented address space: control
    words (:attr:`words`, uint64), per-workgroup counts, events and binding
    shadows, at the offsets the control words give.

    Raises:
        EngineError: the file cannot be made.
    """

    def __init__(self, mode: int):
        self.mode = mode
        self.size = HEADER + 8 * COUNTS_CAP + 8 * EVENT_WORDS * EVENTS_CAP \
            + 8 * SHADOW_CAP
        try:
            self.fd = os.memfd_create("workbench_results", os.MFD_CLOEXEC)
            os.ftruncate(self.fd, self.size)
            self.mm = mmap.mmap(self.fd, self.size, mmap.MAP_SHARED)
        except OSError as exc:
            raise EngineError(f"cannot make the plugin's results file: {exc}",
                              field="plugin", value=self.size) from None
        #: the control words (uint64)
        self.words = np.frombuffer(self.mm, np.uint64, HEADER // 8, 0)
        self.counts_off = HEADER
        self.events_off = self.counts_off + 8 * COUNTS_CAP
        self.shadow_off = self.events_off + 8 * EVENT_WORDS * EVENTS_CAP
        w = self.words
        w[W_MAGIC] = MAGIC
        w[W_COUNTS_OFF], w[W_COUNTS_CAP] = self.counts_off, COUNTS_CAP
        w[W_EVENTS_OFF], w[W_EVENTS_CAP] = self.events_off, EVENTS_CAP
        self.closed = False

    def counts(self, n: int) -> np.ndarray:
        """The first ``n`` workgroups' counts (uint64 view)."""
        return np.frombuffer(self.mm, np.uint64, n, self.counts_off)

    def events(self) -> np.ndarray:
        """The events of the last dispatch, shape ``(n, 8)`` uint64 (at
        most :data:`EVENTS_CAP`: the words are the guest process's too)."""
        n = min(int(self.words[W_EVENTS_N]), EVENTS_CAP)
        return np.frombuffer(self.mm, np.uint64, n * EVENT_WORDS,
                             self.events_off).reshape(n, EVENT_WORDS)

    def shadow(self, offset: int, length: int) -> np.ndarray:
        """The shadow of ``length`` binding bytes at byte ``offset`` of the
        file: shape ``(2, length)`` uint32, the writers (linear id + 1, 0
        none) then the readers (linear id + 1, 0 none, ~0 several)."""
        return np.frombuffer(self.mm, np.uint32, 2 * length,
                             offset).reshape(2, length)

    def plugin_args(self, fd: int, guest_fd: int, arena: tuple[int, int]) -> str:
        """qemu-user's ``-plugin`` arguments after the file name, for the
        agent's descriptor numbers of the results file (``fd``) and guest
        memory (``guest_fd``)."""
        return (f"results={fd},guest={guest_fd},arena={arena[0]:#x},"
                f"size={arena[1] - arena[0]:#x},rsize={self.size:#x},"
                f"mode={self.mode}")

    def close(self) -> None:
        if getattr(self, "closed", True):
            return
        self.closed = True
        del self.words
        try:
            self.mm.close()
        except BufferError:
            pass    # (a view of the caller's still holds it: freed with it)
        os.close(self.fd)


def attach(space: Any, results: Results) -> None:
    """Remember ``results`` as the plugin's results of address space
    ``space``."""
    _results[space] = results


def results_of(space: Any) -> Results | None:
    """The plugin's results of ``space`` (an emulated backend), or None
    when its engine loads no plugin."""
    try:
        return _results.get(space)
    except TypeError:
        return None
