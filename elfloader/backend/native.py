"""Native backend: guest code runs on this CPU, in this process.

Memory comes from ``mmap``; protections are set with ``mprotect`` and are
never writable and executable at the same time. Calls go through ctypes.
Only the host architecture can run here.
"""

from __future__ import annotations

import ctypes
import functools
import mmap
import os
import sys
import threading
from typing import Callable

import numpy as np

from .. import arch as arch_registry
from ..arch import Arch
from ..errors import ArchitectureMismatchError, BackendError
from .base import PROT_EXEC, PROT_WRITE, Backend, prot_str
from .guarded import ALIGN


def _open_libc() -> ctypes.CDLL:
    # glibc's soname first: ctypes.util.find_library runs ``ldconfig -p`` (a
    # child process) on Linux, a noticeable part of a short command's start.
    if sys.platform.startswith("linux"):
        try:
            return ctypes.CDLL("libc.so.6", use_errno=True)
        except OSError:
            pass
    from ctypes.util import find_library
    return ctypes.CDLL(find_library("c") or None, use_errno=True)


_libc = _open_libc()
_mmap = _libc.mmap
_mmap.restype = ctypes.c_void_p
_mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                  ctypes.c_int, ctypes.c_long]
_mprotect = _libc.mprotect
_mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
_munmap = _libc.munmap
_munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_MAP_FAILED = ctypes.c_void_p(-1).value

_from_buffer = ctypes.c_char.from_buffer
_addressof = ctypes.addressof

_WORD = ctypes.c_uint64 if ctypes.sizeof(ctypes.c_void_p) == 8 else ctypes.c_uint32


def map_guarded(total: int, guards: tuple[int, ...]) -> int:
    """Map ``total`` bytes (a multiple of the page size) of anonymous
    read/write memory in this process, the page at each offset of
    ``guards`` made inaccessible (an access there is SIGSEGV); returns its
    address. Free it with :func:`unmap`. The memory of
    :func:`hal_cpu.arrays.guarded_bytes`: host buffers a native dispatch
    binds in place end before such a page (see :mod:`.guarded`).

    Raises:
        BackendError: ``mmap`` or ``mprotect`` failed (``value``: bytes).
    """
    addr = _mmap(None, total, mmap.PROT_READ | mmap.PROT_WRITE,
                 mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, -1, 0)
    if addr is None or addr == _MAP_FAILED:
        err = ctypes.get_errno()
        raise BackendError(f"mmap of {total} bytes failed: {os.strerror(err)}",
                           field="map_guarded", value=total)
    page = mmap.PAGESIZE
    for offset in guards:
        if _mprotect(addr + offset, page, 0) != 0:     # PROT_NONE
            err = ctypes.get_errno()
            _munmap(addr, total)
            raise BackendError(f"mprotect of a guard page failed: "
                               f"{os.strerror(err)}", field="map_guarded",
                               value=total)
    return addr


def unmap(address: int, total: int) -> None:
    """Unmap ``total`` bytes at ``address`` (from :func:`map_guarded`)."""
    _munmap(address, total)


class NativeBackend(Backend):
    """Runs host-architecture code in this process.

    Args:
        arch: the architecture the caller expects; must be the host's.

    Raises:
        ArchitectureMismatchError: ``arch`` is not the host architecture; the
            message suggests the emulated backend.
    """

    kind = "native"

    def __init__(self, arch: Arch | None = None):
        host = arch_registry.host()
        if host is None:
            raise ArchitectureMismatchError(
                "this host's architecture has no native support; use "
                "backend='emulated'", field="backend", value="native")
        if arch is not None and arch is not host:
            raise ArchitectureMismatchError(
                f"{arch.name} code cannot run natively on this {host.name} "
                f"host; use the emulated backend (backend='emulated', "
                f"--backend=emulated)", field="arch", value=arch.name)
        self.arch = host
        self.page_size = mmap.PAGESIZE
        self._maps: dict[int, int] = {}        # address -> size (mmap)
        self._buffers: dict[int, object] = {}  # address -> ctypes buffer
        self._callbacks: list = []
        self._fn_cache: dict[tuple[int, int], Callable] = {}
        self._fn_types: dict[int, type] = {}
        # Exceptions raised by callbacks, per calling thread (several
        # threads may call into guest code at once).
        self._pending: dict[int, BaseException] = {}
        self._bounce: dict[tuple[int, int], list[int]] = {}
        self._closed = False

    def _closed_error(self, what: str, value) -> BackendError:
        return BackendError("the native backend is closed", field=what,
                            value=value)

    # --- memory -----------------------------------------------------------
    def reserve(self, size: int, align: int = 0) -> int:
        if self._closed:
            raise self._closed_error("reserve", size)
        page = self.page_size
        size = max(page, -(-size // page) * page)
        align = max(align, page)
        extra = align - page
        addr = _mmap(None, size + extra, mmap.PROT_READ | mmap.PROT_WRITE,
                     mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, -1, 0)
        if addr is None or addr == _MAP_FAILED:
            err = ctypes.get_errno()
            raise BackendError(f"mmap of {size} bytes failed: {os.strerror(err)}",
                               field="reserve", value=size)
        start = (addr + align - 1) & ~(align - 1)
        if start > addr:
            _munmap(addr, start - addr)
        if start + size < addr + size + extra:
            _munmap(start + size, addr + size + extra - start - size)
        self._maps[start] = size
        return start

    def alloc(self, size: int, align: int = 16) -> int:
        if self._closed:
            raise self._closed_error("alloc", size)
        buf = ctypes.create_string_buffer(size + align)
        addr = ctypes.addressof(buf)
        addr = (addr + align - 1) & ~(align - 1)
        self._buffers[addr] = buf
        return addr

    def release(self, address: int) -> None:
        size = self._maps.pop(address, None)
        if size is not None:
            _munmap(address, size)
        else:
            self._buffers.pop(address, None)

    def alloc_guarded(self, size: int):
        """``size`` zeroed bytes, aligned as every guarded range
        (:data:`.guarded.ALIGN`, 64 bytes; see
        :meth:`Backend.alloc_guarded`). No guard page nor canary here: a
        fault on a guard page would end this process, which runs the
        dispatch (see :mod:`.guarded`). A page or more is mapped with
        ``mmap``: pages guest code never touches cost no memory
        (workgroup-local memory is often declared larger than a kernel
        uses)."""
        if size >= self.page_size:
            return self.reserve(size), None
        return self.alloc(max(size, 1), ALIGN), None

    def read(self, address: int, size: int) -> bytes:
        """See :meth:`Backend.read`.

        Raises:
            BackendError: the backend is closed (its memory is gone)."""
        if self._closed:
            raise self._closed_error("read", address)
        return ctypes.string_at(address, size)

    def write(self, address: int, data) -> None:
        """See :meth:`Backend.write`.

        Raises:
            BackendError: the backend is closed (its memory is gone)."""
        if self._closed:
            raise self._closed_error("write", address)
        if type(data) is not bytes:
            data = bytes(data)
        ctypes.memmove(address, data, len(data))

    def protect(self, address: int, size: int, prot: int) -> None:
        if self._closed:
            raise self._closed_error("protect", address)
        if prot & PROT_WRITE and prot & PROT_EXEC:
            raise BackendError("refusing a writable and executable mapping",
                               field="protect", value=prot_str(prot))
        flags = 0
        if prot & 1:
            flags |= mmap.PROT_READ
        if prot & PROT_WRITE:
            flags |= mmap.PROT_WRITE
        if prot & PROT_EXEC:
            flags |= mmap.PROT_EXEC
        if _mprotect(address, size, flags) != 0:
            err = ctypes.get_errno()
            raise BackendError(f"mprotect({address:#x}, {size:#x}, "
                               f"{prot_str(prot)}) failed: {os.strerror(err)}",
                               field="protect", value=prot_str(prot))

    def map_array(self, array: np.ndarray, align: int = ALIGN):
        """The array's own memory when it is writable and ``align``-aligned
        (zero copy); otherwise an aligned copy, copied back after the guest
        ran unless the array is read-only (read-only arrays and ``bytes``
        are never written). An empty array gets a private aligned block.
        ``align`` is the guarded ranges' alignment (:data:`.guarded.ALIGN`);
        natively a binding has no guard page (see :meth:`alloc_guarded`).

        Raises:
            BackendError: the backend is closed; the array is strided."""
        if self._closed:
            raise self._closed_error("binding", array.shape)
        try:
            # Writable, C-contiguous and not empty (checked by from_buffer).
            # (an ndarray exports the buffer protocol; numpy's stubs do not say so)
            address = _addressof(_from_buffer(array))  # type: ignore[arg-type]
            if address % align == 0:
                return address, None
            readonly = False
        except (TypeError, ValueError):   # read-only, empty or strided
            if not array.flags.c_contiguous:
                raise BackendError("arrays must be C-contiguous",
                                   field="binding", value=array.shape) from None
            address, readonly = array.__array_interface__["data"]
        size = array.nbytes
        # Aligned copies are kept for reuse by later dispatches.
        key = (max(size, align), align)
        pool = self._bounce.setdefault(key, [])
        try:
            copy = pool.pop()   # (atomic: other threads share the pool)
        except IndexError:
            copy = self.alloc(*key)
        if size:
            ctypes.memmove(copy, address, size)

        def finish():
            if size and not readonly:
                ctypes.memmove(address, copy, size)
            if len(pool) < 8:
                pool.append(copy)
            else:
                self.release(copy)

        return copy, finish

    # --- calls ------------------------------------------------------------
    def _fn_type(self, n: int):
        t = self._fn_types.get(n)
        if t is None:
            t = self._fn_types[n] = ctypes.CFUNCTYPE(_WORD, *([_WORD] * n))
        return t

    def call(self, address: int, *args: int) -> int:
        if self._closed:
            raise BackendError("the native backend is closed", field="call",
                               value=address)
        key = (address, len(args))
        fn = self._fn_cache.get(key)
        if fn is None:
            fn = self._fn_cache[key] = self._fn_type(len(args))(address)
        mask = (1 << (8 * ctypes.sizeof(_WORD))) - 1
        result = fn(*[a & mask for a in args])
        if self._pending:
            self._raise_pending()
        return result

    def _raise_pending(self) -> None:
        """Re-raise the exception a callback raised on this thread."""
        exc = self._pending.pop(threading.get_ident(), None)
        if exc is not None:
            raise exc

    def function(self, address: int, nargs: int):
        fn = self._fn_type(nargs)(address)

        def call(*args: int) -> int:
            if self._closed:
                raise BackendError("the native backend is closed",
                                   field="call", value=address)
            result = fn(*args)
            if self._pending:
                self._raise_pending()
            return result

        return call

    def bound_calls(self, address: int,
                    args: list[tuple[int, ...]]) -> list[Callable[[], int]]:
        # The arguments are converted to C words once, not on every call.
        call = self.function(address, len(args[0]))
        return [functools.partial(call, *[_WORD(x) for x in a]) for a in args]

    def view(self, address: int, size: int) -> memoryview:
        if self._closed:
            raise self._closed_error("view", address)
        return memoryview((ctypes.c_char * size).from_address(address)).cast("B")

    def callback(self, function: Callable[..., int], nargs: int) -> int:
        mask = (1 << (8 * ctypes.sizeof(_WORD))) - 1

        def trampoline(*args):
            try:
                return int(function(*args) or 0) & mask
            except BaseException as exc:  # re-raised by call()
                self._pending.setdefault(threading.get_ident(), exc)
                return 0

        cfn = self._fn_type(nargs)(trampoline)
        self._callbacks.append(cfn)
        return ctypes.cast(cfn, ctypes.c_void_p).value or 0   # never NULL

    def close(self) -> None:
        self._closed = True
        for addr, size in list(self._maps.items()):
            _munmap(addr, size)
        self._maps.clear()
        self._buffers.clear()
        self._bounce.clear()
        self._fn_cache.clear()

    @property
    def mapped_bytes(self) -> int:
        """Bytes currently mapped by :meth:`reserve` (for leak checks)."""
        return sum(self._maps.values())

