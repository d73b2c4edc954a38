"""Emulated backend: guest code runs on a unicorn CPU of any supported
architecture, on any host.

The address space is laid out by a page allocator below 2 GiB (so 32-bit
guests fit). A call writes the arguments with the architecture's calling
convention, points the return address at a sentinel page and runs until the
program counter reaches it; no per-instruction hook is installed. Python
callbacks live in one small trampoline page, the only range with a code hook.

The CPU runs with unicorn's virtual TLB: guest pages map one to one onto
unicorn's physical memory, and a TLB-fill hook gives each page exactly the
permissions of the range it belongs to. With the CPU's own TLB and the MMU
off, every page would be executable, and unicorn sends each store to a page
that is both writable and executable down its self-modifying-code path; with
data pages not executable, stores stay on the fast path. A refused fill
stops the CPU with a generic exception; the hook notes the page and the
kind of access, so the fault is reported by kind.
"""

from __future__ import annotations

import bisect
import ctypes
from typing import Callable

import numpy as np
from unicorn import (UC_HOOK_CODE, UC_PROT_EXEC, UC_PROT_NONE, UC_PROT_READ,
                     UC_PROT_WRITE, Uc, UcError)
from unicorn import unicorn_const as UCC
from unicorn.unicorn_py3.unicorn import (HOOK_TLB_FILL_CFUNC, uc_hook_h,
                                         uclib)

from fatelf.cstruct import pack_array, unpack_array

from ..arch import Arch
from ..errors import BackendError, EmulationError
from . import unicorn_arch
from .base import PROT_EXEC, PROT_READ, PROT_WRITE, Backend, prot_str

_ARENA_START = 0x0001_0000
_ARENA_END = 0x7FFF_0000
_STACK_SIZE = 1 << 20
_HEAP_CHUNK = 1 << 20       # small allocations come from 1 MiB chunks
_HEAP_LIMIT = 256 << 10     # larger ones get their own mapping
_HEAP_GRAIN = 64
_TRAMPOLINE_SLOT = 16
_TRAMPOLINE_SLOTS = 256
_SENTINEL_OFFSET = 32
_TLB_GROW_FILLS = 128       # fewer TLB fills in a call: TLB size is fine
_TLB_MAX_PAGES = 1 << 16    # larger working sets do not grow the TLB

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


#: What a TLB fill is for (``uc_mem_type``): the permission it needs, and
#: the name of the access in messages.
_ACCESS = {
    UCC.UC_MEM_READ: (UC_PROT_READ, "read"),
    UCC.UC_MEM_WRITE: (UC_PROT_WRITE, "write"),
    UCC.UC_MEM_FETCH: (UC_PROT_EXEC, "fetch"),
}

#: Faults by (access, mapped): the ``fault`` attribute of the
#: :class:`EmulationError` and the start of its message.
_FAULTS = {
    ("read", False): ("read_unmapped", "read from unmapped memory"),
    ("write", False): ("write_unmapped", "write to unmapped memory"),
    ("fetch", False): ("fetch_unmapped", "instruction fetch from unmapped memory"),
    ("read", True): ("read_protected", "read from unreadable memory"),
    ("write", True): ("write_protected", "write to read-only memory"),
    ("fetch", True): ("fetch_protected",
                      "instruction fetch from non-executable memory"),
}
_UC_FAULTS = {
    UCC.UC_ERR_READ_UNMAPPED: "read_unmapped",
    UCC.UC_ERR_WRITE_UNMAPPED: "write_unmapped",
    UCC.UC_ERR_FETCH_UNMAPPED: "fetch_unmapped",
    UCC.UC_ERR_READ_PROT: "read_protected",
    UCC.UC_ERR_WRITE_PROT: "write_protected",
    UCC.UC_ERR_FETCH_PROT: "fetch_protected",
    UCC.UC_ERR_INSN_INVALID: "invalid_instruction",
    UCC.UC_ERR_EXCEPTION: "exception",
    UCC.UC_ERR_READ_UNALIGNED: "read_unaligned",
    UCC.UC_ERR_WRITE_UNALIGNED: "write_unaligned",
}


#: Stops that a refused TLB fill can cause.
_MEMORY_ERRORS = frozenset((
    UCC.UC_ERR_EXCEPTION, UCC.UC_ERR_READ_UNMAPPED, UCC.UC_ERR_WRITE_UNMAPPED,
    UCC.UC_ERR_FETCH_UNMAPPED, UCC.UC_ERR_READ_PROT, UCC.UC_ERR_WRITE_PROT,
    UCC.UC_ERR_FETCH_PROT))


class PageMap:
    """Protection of every mapped page: sorted, non-overlapping
    ``(start, end, prot)`` ranges, looked up by bisection."""

    def __init__(self):
        self.ranges: list[tuple[int, int, int]] = []
        self.starts: list[int] = []

    def set(self, start: int, end: int, prot: int | None) -> None:
        """Give ``[start, end)`` protection ``prot`` (None: unmapped)."""
        out = []
        for s, e, p in self.ranges:
            if e <= start or s >= end:
                out.append((s, e, p))
                continue
            if s < start:
                out.append((s, start, p))
            if e > end:
                out.append((end, e, p))
        if prot is not None:
            out.append((start, end, prot))
        out.sort()
        self.ranges = out
        self.starts = [r[0] for r in out]

    def lookup(self, address: int) -> int | None:
        """Protection of the page holding ``address``, None if unmapped."""
        i = bisect.bisect_right(self.starts, address) - 1
        if i >= 0:
            s, e, p = self.ranges[i]
            if address < e:
                return p
        return None


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
        model = unicorn_arch.model(arch)
        self._regs = regs = unicorn_arch.registers(arch)
        self._pages = PageMap()
        self._refused: tuple[int, str, int | None] | None = None
        self._fills = [0]     # TLB fills so far (counted by the hook)
        self._filled: set[int] = set()   # pages filled during this call
        self._tlb_warm = False
        try:
            self.uc = Uc(model.uc_arch, model.uc_mode)
            if model.cpu is not None:
                self.uc.ctl_set_cpu_model(model.cpu)
            if model.page_size is not None:
                self.uc.ctl_set_page_size(model.page_size)
            self._uch = self.uc._uch
            unicorn_arch.virtual_tlb(self.uc)
            self._fill_hook = self._add_tlb_fill_hook()
            if model.init is not None:
                model.init(self.uc)
        except UcError as exc:
            raise BackendError(f"cannot start a {arch.name} CPU: {exc}",
                               field="backend", value=arch.name) from None
        # One batch write sets the argument registers, the stack pointer and
        # the return-address register of a call.
        ids = list(regs.args) + [regs.sp] + ([regs.link] if regs.link else [])
        self._nregs = len(ids)
        self._reg_ids = (ctypes.c_int32 * len(ids))(*ids)
        self._reg_vals = (ctypes.c_uint64 * len(ids))()
        base = ctypes.addressof(self._reg_vals)
        self._reg_ptrs = (ctypes.c_void_p * len(ids))(
            *[base + 8 * i for i in range(len(ids))])
        self._scratch = ctypes.c_uint64()
        self._closed = False
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
        # The return address is inside its page, not at its start: unicorn
        # gives the block that stops the CPU a size of zero and looks up the
        # page of its last byte (the byte before it) for execution, which
        # the previous page (data) refuses.
        self._sentinel = self.place_code(
            arch.return_insn * (2 * _SENTINEL_OFFSET // len(arch.return_insn))
        ) + _SENTINEL_OFFSET
        tsize = _TRAMPOLINE_SLOT * _TRAMPOLINE_SLOTS
        slot = arch.return_insn * (_TRAMPOLINE_SLOT // len(arch.return_insn))
        self._tramp = self.place_code(slot * _TRAMPOLINE_SLOTS)
        self._tramp_next = self._tramp
        self.uc.hook_add(UC_HOOK_CODE, self._on_trampoline,
                         begin=self._tramp, end=self._tramp + tsize - 1)

    def _add_tlb_fill_hook(self):
        """Install the TLB-fill hook: guest page -> same physical page, with
        the permissions of :attr:`_pages`; a refusal is noted for
        :meth:`_fault`. Registered directly (not through ``Uc.hook_add``) to
        keep the per-fill cost to one Python call."""
        pages, access_of = self._pages, _ACCESS
        fills, filled = self._fills, self._filled

        def fill(uch, vaddr, access, entry, key):
            fills[0] += 1
            filled.add(vaddr)
            prot = pages.lookup(vaddr)
            need, name = access_of.get(access, (UC_PROT_READ, "read"))
            if prot is not None and prot & need:
                e = entry[0]
                e.paddr = vaddr
                e.perms = prot
                return True
            self._refused = (vaddr, name, prot)
            return False

        callback = HOOK_TLB_FILL_CFUNC(fill)
        handle = uc_hook_h()
        status = uclib.uc_hook_add(self._uch, ctypes.byref(handle),
                                   UCC.UC_HOOK_TLB_FILL, callback, None,
                                   ctypes.c_uint64(1), ctypes.c_uint64(0))
        if status != UCC.UC_ERR_OK:
            raise UcError(status)
        return callback

    def _size_tlb(self, fills: int, pages: int) -> None:
        """After a call that needed ``fills`` TLB fills for ``pages``
        distinct pages: flush the TLB if it is too small for the call.

        unicorn resizes its TLB only when it is flushed, doubling it when
        more than 70% of its entries were used since the last flush. It
        was too small when the call refilled pages it had already filled
        (more fills than pages), or when the call started with a warm TLB
        and still needed many fills (the pages did not stay from the call
        before). Calls touching more than :data:`_TLB_MAX_PAGES` pages
        stream through memory; they are left to refill rather than grow
        the TLB (and its host memory) without end."""
        if fills <= _TLB_GROW_FILLS or pages > _TLB_MAX_PAGES:
            self._tlb_warm = True
        elif self._tlb_warm or fills > pages + pages // 2:
            self._flush_tlb()
        else:
            self._tlb_warm = True

    def _flush_tlb(self) -> None:
        """Drop every TLB entry (after a protection change, or to let
        unicorn resize the TLB)."""
        unicorn_arch.flush_tlb(self.uc)
        self._tlb_warm = False

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
        self._pages.set(addr, addr + size, PROT_READ | PROT_WRITE)
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
        self._pages.set(address, address + size, None)
        self._flush_tlb()
        self._give_back(address, size)

    def _check_open(self, what: str, address: int) -> None:
        if self._closed:
            raise BackendError("the emulated backend is closed", field=what,
                               value=address)

    def read(self, address: int, size: int) -> bytes:
        self._check_open("read", address)
        try:
            return bytes(self.uc.mem_read(address, size))
        except UcError as exc:
            raise BackendError(f"cannot read {size} bytes at {address:#x}: {exc}",
                               field="read", value=address) from None

    def write(self, address: int, data) -> None:
        self._check_open("write", address)
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
        self._check_open("protect", address)
        try:
            self.uc.mem_protect(address, size, _uc_prot(prot))
        except UcError as exc:
            raise BackendError(f"cannot protect {size:#x} bytes at {address:#x}: "
                               f"{exc}", field="protect", value=address) from None
        self._pages.set(address, address + size, prot)
        self._flush_tlb()

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
    def _reg_read(self, reg: int) -> int:
        uclib.uc_reg_read(self._uch, reg, ctypes.byref(self._scratch))
        return self._scratch.value & self.arch.word_mask

    def _reg_write(self, reg: int, value: int) -> None:
        self._scratch.value = value & self.arch.word_mask
        uclib.uc_reg_write(self._uch, reg, ctypes.byref(self._scratch))

    def _prepare_call(self, args, return_address: int) -> None:
        """Registers and stack for ``func(*args)`` returning to
        ``return_address``, by the architecture's calling convention."""
        regs, ps, mask = self._regs, self.pointer_size, self.arch.word_mask
        nreg = len(regs.args)
        sp = self._stack_top
        stack_args = args[nreg:]
        if stack_args:
            sp = (sp - ps * len(stack_args)) & ~(self.arch.cc.stack_align - 1)
            self.uc.mem_write(sp, pack_array("ptr", ps, stack_args))
        else:
            sp &= ~(self.arch.cc.stack_align - 1)
        vals = self._reg_vals
        for i in range(min(nreg, len(args))):
            vals[i] = args[i] & mask
        for i in range(len(args), nreg):
            vals[i] = 0
        if regs.link is None:
            sp -= ps
            self.uc.mem_write(sp, pack_array("ptr", ps, [return_address]))
            vals[nreg] = sp
        else:
            vals[nreg] = sp
            vals[nreg + 1] = return_address
        uclib.uc_reg_write_batch(self._uch, self._reg_ids, self._reg_ptrs,
                                 self._nregs)

    def call(self, address: int, *args: int) -> int:
        self._check_open("call", address)
        if self._depth:
            raise BackendError("a Python callback may not call back into "
                               "emulated code", field="call", value=address)
        self._prepare_call(args, self._sentinel)
        self._refused = None
        fills, filled = self._fills, self._filled
        before = fills[0]
        filled.clear()
        self._depth += 1
        try:
            status = uclib.uc_emu_start(self._uch, address, self._sentinel,
                                        self.timeout_us, 0)
        finally:
            self._depth -= 1
        self._size_tlb(fills[0] - before, len(filled))
        if status != UCC.UC_ERR_OK:
            raise self._fault(UcError(status), address)
        if self._pending is not None:
            exc, self._pending = self._pending, None
            raise exc
        pc = self._reg_read(self._regs.pc)
        if pc != self._sentinel:
            if self.timeout_us:
                raise EmulationError(
                    f"call of {address:#x} stopped at pc={pc:#x} after the "
                    f"{self.timeout_us / 1e6:g} s limit", field="call",
                    value=address)
            raise EmulationError(f"call of {address:#x} stopped at pc={pc:#x}",
                                 field="call", value=address)
        return self._reg_read(self._regs.result)

    def _fault(self, exc: UcError, address: int) -> EmulationError:
        """The error for a call that stopped with ``exc``: a refused TLB
        fill is reported as the access it refused (unicorn itself only says
        "unhandled CPU exception")."""
        pc = self._reg_read(self._regs.pc)
        refused, self._refused = self._refused, None
        page = None
        if refused is not None and exc.errno in _MEMORY_ERRORS:
            page, access, prot = refused
            fault, what = _FAULTS[access, prot is not None]
            where = (f" (page {page:#x}, {prot_str(prot)})" if prot is not None
                     else f" (page {page:#x})")
            what += where
        else:
            fault = _UC_FAULTS.get(exc.errno, "error")
            what = _UC_ERRORS.get(exc.errno, str(exc))
        err = EmulationError(f"{what} at pc={pc:#x} while calling {address:#x}",
                             field="call", value=address)
        err.fault = fault
        err.fault_page = page
        err.pc = pc
        return err

    def callback(self, function: Callable[..., int], nargs: int) -> int:
        addr = self._tramp_next
        if addr >= self._tramp + _TRAMPOLINE_SLOT * _TRAMPOLINE_SLOTS:
            raise BackendError("too many callbacks", field="callback",
                               value=len(self._callbacks))
        self._tramp_next += _TRAMPOLINE_SLOT
        self._callbacks[addr] = (function, nargs)
        return addr

    def _callback_args(self, count: int) -> list[int]:
        """The first ``count`` integer arguments at a function's entry."""
        regs, ps = self._regs, self.pointer_size
        out = [self._reg_read(r) for r in regs.args[:count]]
        if len(out) < count:
            sp = self._reg_read(regs.sp)
            # At entry the stack holds the return address first when the call
            # instruction pushed it.
            first = sp + (ps if regs.link is None else 0)
            n = count - len(out)
            out += unpack_array("ptr", ps, bytes(self.uc.mem_read(first, n * ps)))
        return out

    def _callback_return(self, value: int) -> None:
        """Return ``value`` from the function whose entry the CPU is at."""
        regs, ps = self._regs, self.pointer_size
        self._reg_write(regs.result, value)
        if regs.link is None:
            sp = self._reg_read(regs.sp)
            ret = unpack_array("ptr", ps, bytes(self.uc.mem_read(sp, ps)))[0]
            self._reg_write(regs.sp, sp + ps)
        else:
            ret = self._reg_read(regs.link)
        self._reg_write(regs.pc, ret)

    def _on_trampoline(self, uc, address, size, user_data):
        entry = self._callbacks.get(address)
        if entry is None:
            return
        function, nargs = entry
        args = self._callback_args(nargs)
        try:
            result = int(function(*args) or 0)
        except BaseException as exc:
            if self._pending is None:
                self._pending = exc
            uc.emu_stop()
            return
        self._callback_return(result)

    def close(self) -> None:
        """Unmap everything and free the CPU and its translation buffer now
        (not when the garbage collector finds the engine)."""
        if self._closed:
            return
        self._closed = True
        self._heap_live.clear()
        self._heap_free.clear()
        self._heap_chunks.clear()
        for addr in list(self._maps):
            self.release(addr)
        self._callbacks.clear()
        release = getattr(self.uc, "_Uc__finalizer", None)
        if release is not None:
            release()   # uc_close, once; the engine object is dead after it
        self.uc = None

    @property
    def mapped_bytes(self) -> int:
        """Bytes currently held: mappings plus live small allocations, not
        counting the free space of allocation chunks (for leak checks)."""
        chunks = len(self._heap_chunks) * _HEAP_CHUNK
        return sum(self._maps.values()) - chunks + sum(self._heap_live.values())
