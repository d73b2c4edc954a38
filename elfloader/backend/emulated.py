"""Emulated backend: guest code runs on a unicorn CPU of any supported
architecture, on any host.

The address space is laid out by a page allocator below 2 GiB (so 32-bit
guests fit). A call writes the arguments with the architecture's calling
convention, points the return address at a sentinel page and runs until the
program counter reaches it; no per-instruction hook is installed. Python
callbacks live in one small trampoline page, the only range with a code hook.
"""

from __future__ import annotations

from typing import Callable

import numpy as np
from unicorn import (UC_HOOK_CODE, UC_PROT_EXEC, UC_PROT_NONE, UC_PROT_READ,
                     UC_PROT_WRITE, Uc, UcError)
from unicorn import unicorn_const as UCC

from ..arch import Arch
from ..errors import BackendError, EmulationError
from .base import PROT_EXEC, PROT_READ, PROT_WRITE, Backend, prot_str

_ARENA_START = 0x0001_0000
_ARENA_END = 0x7FFF_0000
_STACK_SIZE = 1 << 20
_HEAP_CHUNK = 1 << 20       # small allocations come from 1 MiB chunks
_HEAP_LIMIT = 256 << 10     # larger ones get their own mapping
_HEAP_GRAIN = 64
_TRAMPOLINE_SLOT = 16
_TRAMPOLINE_SLOTS = 256

_UC_ERRORS = {
    UCC.UC_ERR_READ_UNMAPPED: "read from unmapped memory",
    UCC.UC_ERR_WRITE_UNMAPPED: "write to unmapped memory",
    UCC.UC_ERR_FETCH_UNMAPPED: "instruction fetch from unmapped memory",
    UCC.UC_ERR_READ_PROT: "read from protected memory",
    UCC.UC_ERR_WRITE_PROT: "write to protected memory",
    UCC.UC_ERR_FETCH_PROT: "instruction fetch from non-executable memory",
    UCC.UC_ERR_INSN_INVALID: "invalid instruction",
    UCC.UC_ERR_EXCEPTION: "unhandled CPU exception",
    UCC.UC_ERR_READ_UNALIGNED: "unaligned read",
    UCC.UC_ERR_WRITE_UNALIGNED: "unaligned write",
}


def _uc_prot(prot: int) -> int:
    out = UC_PROT_NONE
    if prot & PROT_READ:
        out |= UC_PROT_READ
    if prot & PROT_WRITE:
        out |= UC_PROT_WRITE
    if prot & PROT_EXEC:
        out |= UC_PROT_EXEC
    return out


class EmulatedBackend(Backend):
    """Runs code of ``arch`` on a unicorn CPU.

    Args:
        arch: the guest architecture.
        timeout: optional limit for one call, in seconds (0: none). A call
            that runs past it raises :class:`EmulationError`.
    """

    kind = "emulated"

    def __init__(self, arch: Arch, timeout: float = 0.0):
        self.arch = arch
        self.timeout_us = int(timeout * 1e6)
        try:
            self.uc = Uc(arch.uc_arch, arch.uc_mode)
            if arch.uc_cpu is not None:
                self.uc.ctl_set_cpu_model(arch.uc_cpu)
            arch.uc_init(self.uc)
        except UcError as exc:
            raise BackendError(f"cannot start a {arch.name} CPU: {exc}",
                               field="backend", value=arch.name) from None
        # Guest code assumes at least 4 KiB pages (aarch64 ADRP, for one).
        self.page_size = max(4096, self.uc.ctl_get_page_size())
        self._free: list[tuple[int, int]] = [(_ARENA_START, _ARENA_END)]
        self._maps: dict[int, int] = {}
        self._heap_free: list[tuple[int, int]] = []   # (address, size)
        self._heap_live: dict[int, int] = {}          # address -> size
        self._heap_chunks: set[int] = set()
        self._callbacks: dict[int, tuple[Callable, int]] = {}
        self._pending: BaseException | None = None
        self._depth = 0

        stack = self.reserve(_STACK_SIZE)
        self._stack_top = stack + _STACK_SIZE - 64
        self._sentinel = self.place_code(arch.return_insn * 4)
        tsize = _TRAMPOLINE_SLOT * _TRAMPOLINE_SLOTS
        slot = arch.return_insn * (_TRAMPOLINE_SLOT // len(arch.return_insn))
        self._tramp = self.place_code(slot * _TRAMPOLINE_SLOTS)
        self._tramp_next = self._tramp
        self.uc.hook_add(UC_HOOK_CODE, self._on_trampoline,
                         begin=self._tramp, end=self._tramp + tsize - 1)

    # --- memory -----------------------------------------------------------
    def _take(self, size: int, align: int) -> int:
        for i, (start, end) in enumerate(self._free):
            first = (start + align - 1) & ~(align - 1)
            if end - first >= size:
                del self._free[i]
                if first + size < end:
                    self._free.insert(i, (first + size, end))
                if start < first:
                    self._free.insert(i, (start, first))
                return first
        raise BackendError(f"emulated address space exhausted ({size:#x} bytes "
                           f"wanted)", field="reserve", value=size)

    def _give_back(self, start: int, size: int) -> None:
        self._free.append((start, start + size))
        self._free.sort()
        merged = []
        for s, e in self._free:
            if merged and merged[-1][1] == s:
                merged[-1] = (merged[-1][0], e)
            else:
                merged.append((s, e))
        self._free = merged

    def reserve(self, size: int, align: int = 0) -> int:
        size = max(self.page_size, -(-size // self.page_size) * self.page_size)
        addr = self._take(size, max(align, self.page_size))
        try:
            self.uc.mem_map(addr, size, UC_PROT_READ | UC_PROT_WRITE)
        except UcError as exc:
            self._give_back(addr, size)
            raise BackendError(f"cannot map {size:#x} bytes: {exc}",
                               field="reserve", value=size) from None
        self._maps[addr] = size
        return addr

    def alloc(self, size: int, align: int = 16) -> int:
        # Small blocks come from long-lived chunks: mapping and unmapping
        # guest memory is slow and makes unicorn drop its translated code.
        if size > _HEAP_LIMIT or align > _HEAP_GRAIN:
            return self.reserve(max(size, 1), align)
        size = max(_HEAP_GRAIN, -(-size // _HEAP_GRAIN) * _HEAP_GRAIN)
        for i, (addr, free) in enumerate(self._heap_free):
            if free >= size:
                if free == size:
                    del self._heap_free[i]
                else:
                    self._heap_free[i] = (addr + size, free - size)
                break
        else:
            addr = self.reserve(_HEAP_CHUNK)
            self._heap_chunks.add(addr)
            self._heap_free.append((addr + size, _HEAP_CHUNK - size))
        self._heap_live[addr] = size
        self.uc.mem_write(addr, bytes(size))
        return addr

    def _heap_release(self, address: int) -> None:
        size = self._heap_live.pop(address)
        blocks = sorted(self._heap_free + [(address, size)])
        merged = [blocks[0]]
        for a, s in blocks[1:]:
            last_a, last_s = merged[-1]
            if last_a + last_s == a:
                merged[-1] = (last_a, last_s + s)
            else:
                merged.append((a, s))
        self._heap_free = merged

    def release(self, address: int) -> None:
        if address in self._heap_live:
            self._heap_release(address)
            return
        size = self._maps.pop(address, None)
        if size is None:
            return
        self.uc.mem_unmap(address, size)
        self._give_back(address, size)

    def read(self, address: int, size: int) -> bytes:
        try:
            return bytes(self.uc.mem_read(address, size))
        except UcError as exc:
            raise BackendError(f"cannot read {size} bytes at {address:#x}: {exc}",
                               field="read", value=address) from None

    def write(self, address: int, data) -> None:
        try:
            self.uc.mem_write(address, bytes(data))
        except UcError as exc:
            raise BackendError(f"cannot write {len(data)} bytes at "
                               f"{address:#x}: {exc}", field="write",
                               value=address) from None

    def protect(self, address: int, size: int, prot: int) -> None:
        if prot & PROT_WRITE and prot & PROT_EXEC:
            raise BackendError("refusing a writable and executable mapping",
                               field="protect", value=prot_str(prot))
        self.uc.mem_protect(address, size, _uc_prot(prot))

    def map_array(self, array: np.ndarray):
        if not array.flags.c_contiguous:
            raise BackendError("arrays must be C-contiguous", field="binding",
                               value=array.shape)
        addr = self.alloc(array.nbytes)
        if array.nbytes:
            self.write(addr, array.tobytes())

        def finish():
            if array.flags.writeable and array.nbytes:
                view = array.reshape(-1).view(np.uint8)
                view[:] = np.frombuffer(self.read(addr, array.nbytes), np.uint8)
            self.release(addr)

        return addr, finish

    # --- calls ------------------------------------------------------------
    def call(self, address: int, *args: int) -> int:
        if self._depth:
            raise BackendError("a Python callback may not call back into "
                               "emulated code", field="call", value=address)
        uc = self.uc
        self.arch.emu_prepare_call(uc, address, args, self._sentinel,
                                   self._stack_top)
        self._depth += 1
        try:
            uc.emu_start(address, self._sentinel, timeout=self.timeout_us)
        except UcError as exc:
            raise self._fault(exc, address) from None
        finally:
            self._depth -= 1
        if self._pending is not None:
            exc, self._pending = self._pending, None
            raise exc
        pc = uc.reg_read(self.arch.cc.pc_reg)
        if pc != self._sentinel:
            if self.timeout_us:
                raise EmulationError(
                    f"call of {address:#x} stopped at pc={pc:#x} after the "
                    f"{self.timeout_us / 1e6:g} s limit", field="call",
                    value=address)
            raise EmulationError(f"call of {address:#x} stopped at pc={pc:#x}",
                                 field="call", value=address)
        return self.arch.emu_result(uc)

    def _fault(self, exc: UcError, address: int) -> EmulationError:
        pc = self.uc.reg_read(self.arch.cc.pc_reg)
        what = _UC_ERRORS.get(exc.errno, str(exc))
        return EmulationError(f"{what} at pc={pc:#x} while calling {address:#x}",
                              field="call", value=address)

    def callback(self, function: Callable[..., int], nargs: int) -> int:
        addr = self._tramp_next
        if addr >= self._tramp + _TRAMPOLINE_SLOT * _TRAMPOLINE_SLOTS:
            raise BackendError("too many callbacks", field="callback",
                               value=len(self._callbacks))
        self._tramp_next += _TRAMPOLINE_SLOT
        self._callbacks[addr] = (function, nargs)
        return addr

    def _on_trampoline(self, uc, address, size, user_data):
        entry = self._callbacks.get(address)
        if entry is None:
            return
        function, nargs = entry
        args = self.arch.emu_callback_args(uc, nargs)
        try:
            result = int(function(*args) or 0)
        except BaseException as exc:
            if self._pending is None:
                self._pending = exc
            uc.emu_stop()
            return
        self.arch.emu_callback_return(uc, result)

    def close(self) -> None:
        self._heap_live.clear()
        self._heap_free.clear()
        self._heap_chunks.clear()
        for addr in list(self._maps):
            self.release(addr)

    @property
    def mapped_bytes(self) -> int:
        """Bytes currently held: mappings plus live small allocations, not
        counting the free space of allocation chunks (for leak checks)."""
        chunks = len(self._heap_chunks) * _HEAP_CHUNK
        return sum(self._maps.values()) - chunks + sum(self._heap_live.values())
