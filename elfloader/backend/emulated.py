"""Emulated backend: guest code runs on unicorn CPUs of any supported
architecture, on any host.

Guest memory is host memory: every reservation is an anonymous ``mmap``
mapped into the CPU with ``mem_map_ptr``, so reads, writes and bindings are
plain copies in this process, and several CPUs (:meth:`EmulatedBackend.
fork_cpu`) can share one address space, each with its own registers and
stack, running calls concurrently from threads (``emu_start`` releases the
GIL). Addresses are handed out by a page allocator below 2 GiB (so 32-bit
guests fit).

A call writes the arguments with the architecture's calling convention,
points the return address at a sentinel and runs until the program counter
reaches it; no per-instruction hook is installed. Python callbacks live in
one small trampoline page, the only range with a code hook.

The CPUs run with unicorn's virtual TLB: guest pages map one to one onto
unicorn's physical memory, and a TLB-fill hook gives each page exactly the
permissions of the range it belongs to. With the CPU's own TLB and the MMU
off, every page would be executable, and unicorn sends each store to a page
that is both writable and executable down its self-modifying-code path; with
data pages not executable, stores stay on the fast path. A refused fill
stops the CPU with a generic exception; the hook notes the page and the
kind of access, so the fault is reported by kind.

Arrays handed to guest code (:meth:`EmulatedBackend.map_array`) and
:meth:`EmulatedBackend.alloc_guarded` memory each end at a guard page, a
page of the reservation the TLB fill refuses: the range starts 64-byte
aligned, at most 63 bytes before the guard page, and those bytes hold a
canary that is compared when the range is finished. A write of even one
byte past the end is reported (:class:`GuardError`), and a read or write
reaching the guard page stops the CPU with its exact address. Each CPU's
stack has a guard page below it.

Changes to the memory map (reserve, protect, release) are recorded in a
log that each CPU applies before its next call; CPUs that are not running
(and the CPU whose Python callback made the change) apply it at once. Host
memory of a released range is unmapped once no CPU can still reach it.
"""

from __future__ import annotations

import bisect
import ctypes
import mmap
import threading
from typing import Callable

import numpy as np
from unicorn import (UC_HOOK_CODE, UC_PROT_EXEC, UC_PROT_NONE, UC_PROT_READ,
                     UC_PROT_WRITE, Uc, UcError)
from unicorn import unicorn_const as UCC
from unicorn.unicorn_py3.unicorn import (HOOK_TLB_FILL_CFUNC, uc_hook_h,
                                         uclib)

from fatelf.cstruct import pack_array, unpack_array

from ..arch import Arch
from ..errors import BackendError, EmulationError, GuardError
from . import unicorn_arch
from .base import PROT_EXEC, PROT_READ, PROT_WRITE, Backend, prot_str

_ARENA_START = 0x0001_0000
_ARENA_END = 0x7FFF_0000
_STACK_SIZE = 1 << 20
_HEAP_CHUNK = 1 << 20       # small allocations come from 1 MiB chunks
_HEAP_LIMIT = 256 << 10     # larger ones get their own mapping
_HEAP_GRAIN = 64
_BINDING_ALIGN = 64
_POOL_LIMIT = 512 << 20     # bytes of released binding ranges kept for reuse
#: Bytes written between the end of a guarded range and its guard page, and
#: compared when the range is finished (at most ``_BINDING_ALIGN - 1``).
_CANARY = bytes((0x5C + 0x47 * i) & 0xFF for i in range(_BINDING_ALIGN))
_CANARY_PREFIX = [_CANARY[:n] for n in range(_BINDING_ALIGN + 1)]
_TRAMPOLINE_SLOT = 16
_TRAMPOLINE_SLOTS = 256
_SENTINEL_OFFSET = 32
_TLB_GROW_FILLS = 128       # fewer TLB fills in a call: TLB size is fine
_TLB_MAX_PAGES = 1 << 16    # larger working sets do not grow the TLB
#: Physical pages no reservation ever maps (the arena ends below them): a
#: data access to a page the TLB fill refuses is sent to one of them, so
#: the unmapped-memory hook sees its exact offset (see ``_add_tlb_fill_hook``).
_TRAP_START = _ARENA_END
_TRAP_END = 0x8000_0000

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

_memmove = ctypes.memmove
_memset = ctypes.memset
_string_at = ctypes.string_at


class PageMap:
    """Protection of every mapped page: sorted, non-overlapping
    ``(start, end, prot)`` ranges, looked up by bisection.

    :attr:`state` is ``(starts, ranges)``, replaced as a whole on every
    change, so a reader on another thread sees one consistent version."""

    def __init__(self):
        self.state: tuple[list[int], list[tuple[int, int, int]]] = ([], [])

    def set(self, start: int, end: int, prot: int | None) -> None:
        """Give ``[start, end)`` protection ``prot`` (None: unmapped)."""
        out = []
        for s, e, p in self.state[1]:
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
        self.state = ([r[0] for r in out], out)

    def lookup(self, address: int) -> int | None:
        """Protection of the page holding ``address``, None if unmapped."""
        return lookup(self.state, address)

    def covers(self, start: int, end: int) -> bool:
        """Whether every byte of ``[start, end)`` is mapped."""
        starts, ranges = self.state
        i = bisect.bisect_right(starts, start) - 1
        at = start
        while at < end:
            if i < 0 or i >= len(ranges):
                return False
            s, e, _ = ranges[i]
            if not s <= at < e:
                return False
            at = e
            i += 1
        return True

    def any_exec(self, start: int, end: int) -> bool:
        """Whether any page of ``[start, end)`` is executable."""
        starts, ranges = self.state
        i = max(0, bisect.bisect_right(starts, start) - 1)
        for s, e, p in ranges[i:]:
            if s >= end:
                break
            if e > start and p & PROT_EXEC:
                return True
        return False


def lookup(state, address: int) -> int | None:
    """Protection of ``address`` in a :attr:`PageMap.state`."""
    starts, ranges = state
    i = bisect.bisect_right(starts, address) - 1
    if i >= 0:
        s, e, p = ranges[i]
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


_MAP_FLAGS = {}
if hasattr(mmap, "MAP_PRIVATE") and hasattr(mmap, "MAP_ANONYMOUS"):
    _MAP_FLAGS = {"flags": mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS}


class _Region:
    """One reservation: guest range and the host memory behind it."""

    __slots__ = ("address", "size", "mm", "host")

    def __init__(self, address: int, size: int):
        self.address, self.size = address, size
        self.mm = mmap.mmap(-1, size, **_MAP_FLAGS)
        view = ctypes.c_char.from_buffer(self.mm)
        self.host = ctypes.addressof(view)
        del view   # no export left: the mapping can be closed later

    def free(self) -> None:
        self.mm.close()


class EmulatedCpu:
    """One unicorn CPU of an :class:`EmulatedBackend`: its own registers,
    stack and translated code, the backend's memory.

    Made by :meth:`EmulatedBackend.fork_cpu` (the backend's own CPU is
    :attr:`EmulatedBackend.cpu`). Different CPUs may run :meth:`call`
    at the same time from different threads; one CPU runs one call at a
    time.
    """

    def __init__(self, space: "EmulatedBackend"):
        self._space = space
        arch = self.arch = space.arch
        model = unicorn_arch.model(arch)
        self._regs = regs = unicorn_arch.registers(arch)
        self._refused: tuple[int, str, int | None] | None = None
        # Refused data pages sent to trap pages in this call, by trap index:
        # (page, access, prot); and the first trapped access, as
        # (trap index, offset in the page, size, access, pc).
        self._traps: list[tuple[int, str, int | None]] = []
        self._hit: tuple[int, int, int, str, int] | None = None
        self._fills = [0]     # TLB fills so far (counted by the hook)
        self._filled: set[int] = set()   # pages filled during this call
        self._tlb_warm = False
        self._view = ([], [])            # the PageMap state this CPU maps
        self._gen = 0                    # memory-map log entries applied
        self._thread: int | None = None  # thread running a call, if any
        self._pending: BaseException | None = None
        self._closed = False
        self._stop = False
        try:
            self.uc = Uc(model.uc_arch, model.uc_mode)
            if model.cpu is not None:
                self.uc.ctl_set_cpu_model(model.cpu)
            if model.page_size is not None:
                self.uc.ctl_set_page_size(model.page_size)
            self._uch = self.uc._uch
            unicorn_arch.virtual_tlb(self.uc)
            self.page_size = self.uc.ctl_get_page_size()
            self._fill_hook = self._add_tlb_fill_hook()
            self._add_trap_hook()
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
        self._mask = arch.word_mask
        self._ps = arch.pointer_size
        self._stack_align = arch.cc.stack_align
        self._stack: int | None = None
        self._stack_top = 0

    def _start(self, stack: int) -> None:
        """Use ``stack`` (a reservation of :data:`_STACK_SIZE` bytes) and
        hook the trampoline page."""
        self._stack = stack
        self._stack_top = stack + _STACK_SIZE - 64
        space = self._space
        self.uc.hook_add(UC_HOOK_CODE, self._on_trampoline, begin=space._tramp,
                         end=space._tramp + _TRAMPOLINE_SLOT * _TRAMPOLINE_SLOTS - 1)

    # --- TLB ----------------------------------------------------------------
    def _add_tlb_fill_hook(self):
        """Install the TLB-fill hook: guest page -> same physical page, with
        the permissions of the CPU's view of the page map. Registered
        directly (not through ``Uc.hook_add``) to keep the per-fill cost to
        one Python call.

        A fill the page map does not allow is noted for :meth:`_fault`. A
        refused instruction fetch stops the CPU at once (the pc is the
        address). A refused read or write gets a TLB entry to a trap page,
        a physical page nothing maps: the access itself then stops the CPU
        through the unmapped-memory hook (:meth:`_add_trap_hook`), which
        sees the exact address, where the fill hook only sees its page.
        Trap entries are flushed when the call ends."""
        access_of = _ACCESS
        fills, filled, traps = self._fills, self._filled, self._traps
        page = self.page_size
        most = (_TRAP_END - _TRAP_START) // page

        def fill(uch, vaddr, access, entry, key):
            fills[0] += 1
            if len(filled) <= _TLB_MAX_PAGES:
                filled.add(vaddr)
            prot = lookup(self._view, vaddr)
            need, name = access_of.get(access, (UC_PROT_READ, "read"))
            if prot is not None and prot & need:
                e = entry[0]
                e.paddr = vaddr
                e.perms = prot
                return True
            self._refused = (vaddr, name, prot)
            if name != "fetch" and len(traps) < most:
                e = entry[0]
                e.paddr = _TRAP_START + len(traps) * page
                e.perms = need
                traps.append((vaddr, name, prot))
                return True
            return False

        callback = HOOK_TLB_FILL_CFUNC(fill)
        handle = uc_hook_h()
        status = uclib.uc_hook_add(self._uch, ctypes.byref(handle),
                                   UCC.UC_HOOK_TLB_FILL, callback, None,
                                   ctypes.c_uint64(1), ctypes.c_uint64(0))
        if status != UCC.UC_ERR_OK:
            raise UcError(status)
        return callback

    def _add_trap_hook(self) -> None:
        """Hook reads and writes of the trap pages (nothing else: the hook
        is bounded to them, so accesses to mapped memory stay on unicorn's
        fast path). The first trapped access of a call is noted with its
        pc; the hook declines it, which stops the CPU."""
        page = self.page_size

        def trapped(uc, access, address, size, value, user_data):
            if self._hit is None:
                offset = address - _TRAP_START
                name = "write" if access == UCC.UC_MEM_WRITE_UNMAPPED else "read"
                self._hit = (offset // page, offset % page, size, name,
                             self._reg_read(self._regs.pc))
            return False

        self.uc.hook_add(UCC.UC_HOOK_MEM_READ_UNMAPPED
                         | UCC.UC_HOOK_MEM_WRITE_UNMAPPED, trapped,
                         begin=_TRAP_START, end=_TRAP_END - 1)

    def _flush_tlb(self) -> None:
        """Drop every TLB entry (after a change of the memory map, or to let
        unicorn resize the TLB)."""
        unicorn_arch.flush_tlb(self.uc)
        self._tlb_warm = False

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

    # --- memory map -----------------------------------------------------------
    def _sync(self) -> None:
        """Apply the backend's memory-map changes this CPU has not seen.
        Called with the backend's lock held, when this CPU is not running
        or from its own callback."""
        space = self._space
        if self._gen == space._gen:
            return
        flush = False
        uc = self.uc
        first = space._gen - len(space._log)
        try:
            for op in space._log[self._gen - first:]:
                kind, address, size, arg = op
                if kind == "map":
                    uc.mem_map_ptr(address, size, UC_PROT_READ | UC_PROT_WRITE,
                                   arg)
                    # A page refused earlier in this call may hold a trap
                    # entry (from a callback's mapping).
                    flush = flush or bool(self._traps)
                elif kind == "protect":
                    uc.mem_protect(address, size, _uc_prot(arg))
                    flush = True
                elif kind == "unmap":
                    uc.mem_unmap(address, size)
                    flush = True
                else:   # "invalidate": code written by the host
                    uc.ctl_remove_cache(address, address + size)
        except UcError as exc:
            raise BackendError(f"cannot apply {kind} of {size:#x} bytes at "
                               f"{address:#x} to a CPU: {exc}", field=kind,
                               value=address) from None
        self._gen = space._gen
        self._view = space._pages.state
        if flush:
            self._flush_tlb()

    def _map_all(self) -> None:
        """Map the backend's whole address space into this new CPU. Called
        with the backend's lock held."""
        space = self._space
        uc = self.uc
        try:
            for region in space._regions.values():
                uc.mem_map_ptr(region.address, region.size,
                               UC_PROT_READ | UC_PROT_WRITE, region.host)
            for start, end, prot in space._pages.state[1]:
                if prot != PROT_READ | PROT_WRITE:
                    uc.mem_protect(start, end - start, _uc_prot(prot))
        except UcError as exc:
            raise BackendError(f"cannot map the address space into a new "
                               f"CPU: {exc}", field="fork_cpu",
                               value=None) from None
        self._gen = space._gen
        self._view = space._pages.state

    # --- calls ------------------------------------------------------------
    def _reg_read(self, reg: int) -> int:
        uclib.uc_reg_read(self._uch, reg, ctypes.byref(self._scratch))
        return self._scratch.value & self._mask

    def _reg_write(self, reg: int, value: int) -> None:
        self._scratch.value = value & self._mask
        uclib.uc_reg_write(self._uch, reg, ctypes.byref(self._scratch))

    def _prepare_call(self, args, return_address: int) -> None:
        """Registers and stack for ``func(*args)`` returning to
        ``return_address``, by the architecture's calling convention."""
        regs, ps, mask = self._regs, self._ps, self._mask
        space = self._space
        nreg = len(regs.args)
        sp = self._stack_top
        stack_args = args[nreg:]
        if stack_args:
            sp = (sp - ps * len(stack_args)) & ~(self._stack_align - 1)
            space.write(sp, pack_array("ptr", ps, stack_args))
        else:
            sp &= ~(self._stack_align - 1)
        vals = self._reg_vals
        for i in range(min(nreg, len(args))):
            vals[i] = args[i] & mask
        for i in range(len(args), nreg):
            vals[i] = 0
        if regs.link is None:
            sp -= ps
            space.write(sp, pack_array("ptr", ps, [return_address]))
            vals[nreg] = sp
        else:
            vals[nreg] = sp
            vals[nreg + 1] = return_address
        uclib.uc_reg_write_batch(self._uch, self._reg_ids, self._reg_ptrs,
                                 self._nregs)

    def _enter(self, address: int) -> None:
        """Mark this CPU as running a call on this thread, after applying
        pending memory-map changes."""
        space = self._space
        with space._lock:
            if self._closed or space._closed:
                raise BackendError("the emulated backend is closed",
                                   field="call", value=address)
            me = threading.get_ident()
            for c in space._cpus:
                if c._thread == me:
                    raise BackendError("a Python callback may not call back "
                                       "into emulated code", field="call",
                                       value=address)
            if self._thread is not None:
                raise BackendError("this CPU is running another call (use "
                                   "fork_cpu() for one CPU per thread)",
                                   field="call", value=address)
            self._sync()
            self._thread = me
            self._stop = False

    def _leave(self) -> None:
        self._thread = None
        space = self._space
        if space._log or space._dead:
            with space._lock:
                space._trim()

    def call(self, address: int, *args: int) -> int:
        """Call ``address`` with integer arguments; see :meth:`Backend.call`.

        Raises:
            EmulationError: the CPU faulted, or ran past the backend's
                ``timeout_us``.
            BackendError: the backend or this CPU is closed, or this CPU is
                already running a call.
        """
        self._enter(address)
        try:
            space = self._space
            sentinel = space._sentinel
            self._prepare_call(args, sentinel)
            self._refused = None
            self._pending = None
            fills, filled = self._fills, self._filled
            before = fills[0]
            filled.clear()
            timeout = space.timeout_us
            if self._stop:
                status = UCC.UC_ERR_OK
            else:
                status = uclib.uc_emu_start(self._uch, address, sentinel,
                                            timeout, 0)
            self._size_tlb(fills[0] - before, len(filled))
            if self._traps:
                err = (self._fault(UcError(status), address)
                       if status != UCC.UC_ERR_OK else None)
                self._clear_traps()
                if err is not None:
                    raise err
            if self._stop:
                err = EmulationError(f"call of {address:#x} stopped by request",
                                     field="call", value=address)
                err.fault, err.fault_page, err.pc = "stopped", None, None
                err.fault_address = err.access_size = None
                raise err
            if status != UCC.UC_ERR_OK:
                raise self._fault(UcError(status), address)
            if self._pending is not None:
                exc, self._pending = self._pending, None
                raise exc
            pc = self._reg_read(self._regs.pc)
            if pc != sentinel:
                if timeout:
                    raise EmulationError(
                        f"call of {address:#x} stopped at pc={pc:#x} after the "
                        f"{timeout / 1e6:g} s limit", field="call",
                        value=address)
                raise EmulationError(f"call of {address:#x} stopped at "
                                     f"pc={pc:#x}", field="call", value=address)
            return self._reg_read(self._regs.result)
        finally:
            self._leave()

    def stop(self) -> None:
        """Ask the call this CPU is running (from another thread) to end as
        soon as possible; it raises :class:`EmulationError` with ``fault``
        ``"stopped"``. Does nothing when the CPU is idle."""
        with self._space._lock:
            if self._thread is None or self._closed:
                return
            self._stop = True
            uclib.uc_emu_stop(self._uch)

    def _clear_traps(self) -> None:
        """Drop the trap entries of this call from the TLB."""
        del self._traps[:]
        self._hit = None
        self._flush_tlb()

    def _fault(self, exc: UcError, address: int) -> EmulationError:
        """The error for a call that stopped with ``exc``: a refused TLB
        fill is reported as the access it refused (unicorn itself only says
        "unhandled CPU exception"), at the exact address when the access
        reached a trap page, else at its page."""
        pc = self._reg_read(self._regs.pc)
        refused, self._refused = self._refused, None
        hit, self._hit = self._hit, None
        page = exact = size = None
        if (hit is not None and hit[0] < len(self._traps)
                and exc.errno in _MEMORY_ERRORS):
            index, offset, size, access, pc = hit
            page, _, prot = self._traps[index]
            exact = page + offset
            fault, what = _FAULTS[access, prot is not None]
            what += (f" ({size} byte{'s' if size != 1 else ''}"
                     + (f", page {prot_str(prot)})" if prot is not None else ")"))
        elif refused is not None and exc.errno in _MEMORY_ERRORS:
            page, access, prot = refused
            if access == "fetch":
                # The pc, unless the instruction began on the page before.
                exact = pc if page <= pc < page + self.page_size else page
            fault, what = _FAULTS[access, prot is not None]
            where = (f" (page {page:#x}, {prot_str(prot)})" if prot is not None
                     else f" (page {page:#x})")
            what += where
        else:
            fault = _UC_FAULTS.get(exc.errno, "error")
            what = _UC_ERRORS.get(exc.errno, str(exc))
        at = ("" if exact is None or fault.startswith("fetch")
              else f" at {exact:#x},")
        err = EmulationError(f"{what}{at} at pc={pc:#x} while calling "
                             f"{address:#x}", field="call", value=address)
        err.fault = fault
        err.fault_page = page
        err.fault_address = exact
        err.access_size = size
        err.pc = pc
        err.what = what
        return err

    # --- callbacks ----------------------------------------------------------
    def _callback_args(self, count: int) -> list[int]:
        """The first ``count`` integer arguments at a function's entry."""
        regs, ps = self._regs, self.arch.pointer_size
        out = [self._reg_read(r) for r in regs.args[:count]]
        if len(out) < count:
            sp = self._reg_read(regs.sp)
            # At entry the stack holds the return address first when the call
            # instruction pushed it.
            first = sp + (ps if regs.link is None else 0)
            n = count - len(out)
            out += unpack_array("ptr", ps, self._space.read(first, n * ps))
        return out

    def _callback_return(self, value: int) -> None:
        """Return ``value`` from the function whose entry the CPU is at."""
        regs, ps = self._regs, self.arch.pointer_size
        self._reg_write(regs.result, value)
        if regs.link is None:
            sp = self._reg_read(regs.sp)
            ret = unpack_array("ptr", ps, self._space.read(sp, ps))[0]
            self._reg_write(regs.sp, sp + ps)
        else:
            ret = self._reg_read(regs.link)
        self._reg_write(regs.pc, ret)

    def _on_trampoline(self, uc, address, size, user_data):
        space = self._space
        entry = space._callbacks.get(address)
        if entry is None:
            return
        function, nargs = entry
        args = self._callback_args(nargs)
        try:
            result = int(function(*args) or 0)
            # Memory the callback mapped, protected or released applies to
            # this CPU before the guest goes on.
            with space._lock:
                self._sync()
        except BaseException as exc:
            if self._pending is None:
                self._pending = exc
            uc.emu_stop()
            return
        self._callback_return(result)

    # --- lifetime -----------------------------------------------------------
    def _close_engine(self) -> None:
        """Free the unicorn engine and its translation buffer now (not when
        the garbage collector finds the engine)."""
        self._closed = True
        uc, self.uc = self.uc, None
        if uc is None:
            return
        release = getattr(uc, "_Uc__finalizer", None)
        if release is not None:
            release()   # uc_close, once; the engine object is dead after it
        uc._callbacks.clear()   # the hooks hold this CPU: break the cycle

    def close(self) -> None:
        """Free this CPU (not the backend's own: close the backend). Its
        stack goes back to the backend."""
        space = self._space
        with space._lock:
            if self._closed:
                return
            if self is space.cpu:
                raise BackendError("the backend's own CPU closes with the "
                                   "backend", field="close", value=None)
            if self._thread is not None:
                raise BackendError("cannot close a CPU while it runs a call",
                                   field="close", value=None)
            space._cpus.remove(self)
            self._close_engine()
            if self._stack is not None and not space._closed:
                space._release_stack(self._stack)
            space._trim()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class EmulatedBackend(Backend):
    """Runs code of ``arch`` on unicorn CPUs.

    Args:
        arch: the guest architecture.
        timeout: optional limit for one call, in seconds (0: none). A call
            that runs past it raises :class:`EmulationError`.

    Attributes:
        cpu: the backend's own :class:`EmulatedCpu` (the one :meth:`call`
            uses); more come from :meth:`fork_cpu` / :meth:`cpus`.
        timeout_us: the call limit in microseconds (0: none), read at the
            start of every call on every CPU.
    """

    kind = "emulated"

    def __init__(self, arch: Arch, timeout: float = 0.0):
        self.arch = arch
        self.timeout_us = int(timeout * 1e6)
        self._lock = threading.RLock()
        self._closed = False
        self._pages = PageMap()
        self._regions: dict[int, _Region] = {}
        # (starts, regions) sorted by address, replaced as a whole on every
        # change: read/write look addresses up without the lock.
        self._index: tuple[list[int], list[_Region]] = ([], [])
        self._free: list[tuple[int, int]] = [(_ARENA_START, _ARENA_END)]
        self._heap_free: list[tuple[int, int]] = []   # (address, size)
        self._heap_live: dict[int, int] = {}          # address -> size
        self._heap_chunks: set[int] = set()
        self._pool: dict[int, list[int]] = {}         # size -> free ranges
        self._pooled = 0                              # bytes in _pool
        # guard page -> start of the live guarded range it ends
        self._guards: dict[int, int] = {}
        # alloc_guarded address -> (reservation, its size, guard page)
        self._guarded: dict[int, tuple[int, int, int]] = {}
        self._log: list[tuple[str, int, int, object]] = []
        self._gen = 0            # memory-map changes ever logged
        self._dead: list[tuple[int, _Region]] = []    # (gen, region) to free
        self._callbacks: dict[int, tuple[Callable, int]] = {}
        self._cpus: list[EmulatedCpu] = []
        self.cpu = EmulatedCpu(self)
        self._cpus.append(self.cpu)
        # Guest code assumes at least 4 KiB pages (aarch64 ADRP, for one).
        self.page_size = max(4096, self.cpu.page_size)
        try:
            stack = self._reserve_stack()
            # The return address is inside its page, not at its start:
            # unicorn gives the block that stops the CPU a size of zero and
            # looks up the page of its last byte (the byte before it) for
            # execution, which the previous page (data) would refuse.
            ret = arch.return_insn
            self._sentinel = self.place_code(
                ret * (2 * _SENTINEL_OFFSET // len(ret))) + _SENTINEL_OFFSET
            slot = ret * (_TRAMPOLINE_SLOT // len(ret))
            self._tramp = self.place_code(slot * _TRAMPOLINE_SLOTS)
            self._tramp_next = self._tramp
            self.cpu._start(stack)
        except BaseException:
            self.close()
            raise

    @property
    def uc(self):
        """The unicorn engine of the backend's own CPU (None once closed)."""
        return self.cpu.uc

    # --- CPUs -------------------------------------------------------------
    def fork_cpu(self) -> EmulatedCpu:
        """A new CPU sharing this backend's memory, callbacks and time
        limit, with its own registers, stack and translated code. It can
        run :meth:`EmulatedCpu.call` on another thread while other CPUs
        run theirs. Close it with :meth:`EmulatedCpu.close` (the backend's
        :meth:`close` closes all of them)."""
        self._check_open("fork_cpu", 0)
        cpu = EmulatedCpu(self)
        with self._lock:
            self._cpus.append(cpu)
            try:
                cpu._map_all()
                stack = self._reserve_stack()
                cpu._start(stack)
            except BaseException:
                self._cpus.remove(cpu)
                cpu._close_engine()
                raise
        return cpu

    def _reserve_stack(self) -> int:
        """A stack of :data:`_STACK_SIZE` bytes with a guard page below it
        (stacks grow down: an overflow stops the CPU instead of writing
        into the reservation before it). Returns the stack's lowest
        address; its reservation starts one page below."""
        page = self.page_size
        with self._lock:
            base = self._reserve(_STACK_SIZE + page, 0,
                                 (page, _STACK_SIZE + page))
            self._guards[base] = base + page
        return base + page

    def _release_stack(self, stack: int) -> None:
        """Free a stack from :meth:`_reserve_stack`."""
        with self._lock:
            self._guards.pop(stack - self.page_size, None)
            self.release(stack - self.page_size)

    def stacks(self) -> list[tuple[int, int]]:
        """``(lowest address, size in bytes)`` of each CPU's stack, in the
        order of :meth:`cpus` (worker 0's first); a guard page lies below
        each (:meth:`guard_page`)."""
        with self._lock:
            return [(c._stack, _STACK_SIZE) for c in self._cpus
                    if c._stack is not None]

    def cpus(self, n: int) -> list[EmulatedCpu]:
        """``n`` CPUs for ``n`` workers: the backend's own first, then
        forked ones, made on first use and kept (closed with the backend),
        so repeated dispatches reuse their translated code."""
        self._check_open("cpus", n)
        with self._lock:
            while len(self._cpus) < n:
                self.fork_cpu()
            return self._cpus[:n]

    # --- memory map log -----------------------------------------------------
    def _record(self, kind: str, address: int, size: int, arg=None) -> None:
        """Log one change of the memory map and apply it to every CPU that
        can take it now: those not running, and the one whose callback is
        running on this thread. Called with the lock held."""
        self._log.append((kind, address, size, arg))
        self._gen += 1
        me = threading.get_ident()
        for cpu in self._cpus:
            if cpu._thread is None or cpu._thread == me:
                cpu._sync()
        self._trim()

    def _trim(self) -> None:
        """Drop log entries every CPU has applied and free host memory no
        CPU can reach any more. Called with the lock held."""
        if not self._log and not self._dead:
            return
        done = min((c._gen for c in self._cpus), default=self._gen)
        first = self._gen - len(self._log)
        if done > first:
            del self._log[:done - first]
        if self._dead:
            keep = []
            for gen, region in self._dead:
                if gen <= done:
                    region.free()
                else:
                    keep.append((gen, region))
            self._dead = keep

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

    def _check_open(self, what: str, address) -> None:
        if self._closed:
            raise BackendError("the emulated backend is closed", field=what,
                               value=address)

    def reserve(self, size: int, align: int = 0) -> int:
        self._check_open("reserve", size)
        size = max(self.page_size, -(-size // self.page_size) * self.page_size)
        with self._lock:
            return self._reserve(size, align, (0, size))

    def _reserve(self, size: int, align: int, usable: tuple[int, int]) -> int:
        """Map ``size`` bytes (whole pages) of which those at offsets
        ``usable`` (``[lo, hi)``) are read/write; the rest stay out of the
        page map, so the TLB fill refuses them (guard pages). Called with
        the lock held."""
        addr = self._take(size, max(align, self.page_size))
        try:
            region = _Region(addr, size)
        except (OSError, ValueError, OverflowError) as exc:
            self._give_back(addr, size)
            raise BackendError(f"cannot map {size:#x} bytes: {exc}",
                               field="reserve", value=size) from None
        self._regions[addr] = region
        self._reindex()
        self._pages.set(addr + usable[0], addr + usable[1],
                        PROT_READ | PROT_WRITE)
        self._record("map", addr, size, region.host)
        return addr

    def _unmap(self, region: _Region) -> None:
        """Take ``region`` out of the address space; its host memory is
        freed once every CPU has unmapped it. Called with the lock held."""
        addr, size = region.address, region.size
        del self._regions[addr]
        self._reindex()
        self._pages.set(addr, addr + size, None)
        self._dead.append((self._gen + 1, region))
        self._record("unmap", addr, size)
        self._give_back(addr, size)

    def _heap_take(self, size: int) -> int:
        """A small block from the allocation chunks (not zeroed)."""
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
        return addr

    def alloc(self, size: int, align: int = 16) -> int:
        # Small blocks come from long-lived chunks: mapping and unmapping
        # guest memory is slow and makes unicorn drop its translated code.
        self._check_open("alloc", size)
        if size > _HEAP_LIMIT or align > _HEAP_GRAIN:
            return self.reserve(max(size, 1), align)
        with self._lock:
            addr = self._heap_take(size)
            _memset(self._host(addr, self._heap_live[addr]), 0,
                    self._heap_live[addr])
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
        """Free memory (a no-op once the backend is closed: everything is
        free then)."""
        with self._lock:
            if self._closed:
                return
            if address in self._heap_live:
                self._heap_release(address)
                return
            guarded = self._guarded.pop(address, None)
            if guarded is not None:
                self._close_guarded(*guarded)
                return
            region = self._regions.get(address)
            if region is None or address in self._heap_chunks:
                return
            free = self._pool.get(region.size)
            if free and address in free:     # a binding range kept for reuse
                free.remove(address)
                self._pooled -= region.size
            self._unmap(region)

    def _reindex(self) -> None:
        regions = sorted(self._regions.values(), key=lambda r: r.address)
        self._index = ([r.address for r in regions], regions)

    def _host(self, address: int, size: int) -> int:
        """Host address of guest ``[address, address + size)``, which must
        lie in one reservation; else raise :class:`BackendError`."""
        starts, regions = self._index
        i = bisect.bisect_right(starts, address) - 1
        if i >= 0:
            region = regions[i]
            offset = address - region.address
            if offset + size <= region.size:
                return region.host + offset
        raise BackendError(f"{size} bytes at {address:#x} are not mapped",
                           field="address", value=address)

    def _pieces(self, address: int, size: int, what: str):
        """``(host address, length)`` pieces covering guest ``[address,
        address + size)`` across adjacent reservations."""
        pieces = []
        at, end = address, address + size
        starts, regions = self._index
        while at < end:
            i = bisect.bisect_right(starts, at) - 1
            region = regions[i] if i >= 0 else None
            if region is None or at >= region.address + region.size:
                raise BackendError(f"cannot {what} {size} bytes at {address:#x}: "
                                   f"{at:#x} is not mapped", field=what,
                                   value=address)
            n = min(end, region.address + region.size) - at
            pieces.append((region.host + at - region.address, n))
            at += n
        return pieces

    def read(self, address: int, size: int) -> bytes:
        self._check_open("read", address)
        if size <= 0:
            return b""
        try:
            return _string_at(self._host(address, size), size)
        except BackendError:
            return b"".join(_string_at(h, n)
                            for h, n in self._pieces(address, size, "read"))

    def write(self, address: int, data) -> None:
        self._check_open("write", address)
        if isinstance(data, bytes):
            src, size = data, len(data)
        else:   # any buffer, without a copy
            view = np.frombuffer(data, np.uint8)
            src, size = view.ctypes.data, view.size
        if not size:
            return
        try:
            _memmove(self._host(address, size), src, size)
        except BackendError:
            done = 0
            src = ctypes.cast(src, ctypes.c_void_p).value
            for h, n in self._pieces(address, size, "write"):
                _memmove(h, src + done, n)
                done += n
        if self._pages.any_exec(address, address + size):
            # Code written over code: drop what the CPUs translated from it.
            with self._lock:
                self._record("invalidate", address, size)

    def protect(self, address: int, size: int, prot: int) -> None:
        if prot & PROT_WRITE and prot & PROT_EXEC:
            raise BackendError("refusing a writable and executable mapping",
                               field="protect", value=prot_str(prot))
        self._check_open("protect", address)
        if address % self.page_size or size % self.page_size or size <= 0:
            raise BackendError(f"cannot protect {size:#x} bytes at "
                               f"{address:#x}: not whole pages",
                               field="protect", value=address)
        with self._lock:
            if not self._pages.covers(address, address + size):
                raise BackendError(f"cannot protect {size:#x} bytes at "
                                   f"{address:#x}: not mapped",
                                   field="protect", value=address)
            self._pages.set(address, address + size, prot)
            self._record("protect", address, size, prot)

    # --- arrays -----------------------------------------------------------
    def _size_class(self, size: int) -> int:
        """Bytes of the pooled range that holds ``size`` bytes: whole pages,
        at most a quarter more than needed past four pages."""
        pages = max(1, -(-size // self.page_size))
        if pages > 4:
            step = 1 << (pages.bit_length() - 3)
            pages = -(-pages // step) * step
        return pages * self.page_size

    def _guarded_take(self, span: int) -> tuple[int, int, int]:
        """A reservation for a guarded range of ``span`` bytes (a multiple
        of :data:`_BINDING_ALIGN`): pages for the range, then a guard page.
        Taken from the pool of released ones of the same size when there
        is one. Returns ``(reservation, its size, guard page)``. Called
        with the lock held."""
        page = self.page_size
        total = self._size_class(span) + page
        free = self._pool.get(total)
        if free:
            base = free.pop()
            self._pooled -= total
        else:
            base = self._reserve(total, 0, (0, total - page))
        return base, total, base + total - page

    def _pool_give(self, base: int, total: int) -> None:
        """Keep a guarded reservation for reuse (or unmap it past
        :data:`_POOL_LIMIT`). Called with the lock held."""
        if self._pooled + total <= _POOL_LIMIT:
            self._pool.setdefault(total, []).append(base)
            self._pooled += total
        else:
            self._unmap(self._regions[base])

    def _open_guarded(self, size: int):
        """Take a guarded range of ``size`` bytes (see :meth:`map_array`)
        and write its canary. Returns ``(address, host address,
        reservation, its size, guard page, canary length)``; give it back
        with :meth:`_close_guarded`."""
        span = -(-size // _BINDING_ALIGN) * _BINDING_ALIGN
        with self._lock:
            base, total, guard = self._guarded_take(span)
            addr = guard - span
            self._guards[guard] = addr
            host = self._regions[base].host + (addr - base)
        tail = span - size
        if tail:
            _memmove(host + size, _CANARY, tail)
        return addr, host, base, total, guard, tail

    def _close_guarded(self, base: int, total: int, guard: int) -> None:
        """Give back a range from :meth:`_open_guarded` (for reuse by a
        range of the same size class). Called with the lock held."""
        self._guards.pop(guard, None)
        self._pool_give(base, total)

    def guard_page(self, address: int) -> tuple[int, int] | None:
        """``(guard page, start of the range it guards)`` when ``address``
        lies in the guard page after a live range from :meth:`map_array` or
        :meth:`alloc_guarded`, or in the one below a CPU's stack
        (:meth:`stacks`), else None."""
        page = address - address % self.page_size
        start = self._guards.get(page)
        return None if start is None else (page, start)

    def map_array(self, array: np.ndarray):
        """Copy a C-contiguous array into guest memory: 64-byte aligned,
        ending at most 63 bytes before a guard page, the bytes between
        holding a canary. ``finish()`` copies the array back unless it is
        read-only, compares the canary and returns the range for reuse by
        later bindings of the same size class.

        ``finish()`` raises :class:`GuardError` (after copying back) when
        the guest changed a canary byte: it wrote past the array's end."""
        if not array.flags.c_contiguous:
            raise BackendError("arrays must be C-contiguous", field="binding",
                               value=array.shape)
        self._check_open("binding", array.shape)
        nbytes = array.nbytes
        addr, host, base, total, guard, tail = self._open_guarded(nbytes)
        region = self._regions[base]
        data = array.ctypes.data if nbytes else 0
        if nbytes:
            _memmove(host, data, nbytes)
        done = False

        def finish():
            nonlocal done
            if done:
                return
            done = True
            with self._lock:
                # Nothing to copy from once the range is gone (backend
                # closed, or the address released by hand).
                if self._closed or self._regions.get(base) is not region:
                    return
                changed = _canary_changed(host, nbytes, tail)
                if nbytes and array.flags.writeable:
                    _memmove(data, host, nbytes)
                if changed:
                    err = _guard_error(host, addr, nbytes, tail, "binding")
                self._close_guarded(base, total, guard)
            if changed:
                raise err

        return addr, finish

    def alloc_guarded(self, size: int):
        """``size`` zeroed read/write bytes, 64-byte aligned, ending at most
        63 bytes before a guard page (the TLB fill refuses it: a read or
        write reaching it stops the CPU with its exact address), the bytes
        between holding a canary.

        Returns ``(address, check)``: ``check()`` raises
        :class:`GuardError` when a canary byte changed since the allocation
        or the last check (and writes the canary again); ``check`` is None
        when ``size`` is a multiple of 64 (the guard page follows at once).
        Free with :meth:`release`."""
        self._check_open("alloc_guarded", size)
        size = max(size, 0)
        addr, host, base, total, guard, tail = self._open_guarded(size)
        with self._lock:
            self._guarded[addr] = (base, total, guard)
        _memset(host, 0, size)
        if not tail:
            return addr, None

        def check():
            with self._lock:
                if self._guarded.get(addr, (None,))[0] != base:
                    return
                if not _canary_changed(host, size, tail):
                    return
                err = _guard_error(host, addr, size, tail, "range")
                _memmove(host + size, _CANARY, tail)
            raise err

        return addr, check

    # --- calls ------------------------------------------------------------
    def call(self, address: int, *args: int) -> int:
        if self._closed:
            raise BackendError("the emulated backend is closed", field="call",
                               value=address)
        return self.cpu.call(address, *args)

    def function(self, address: int, nargs: int) -> Callable[..., int]:
        call = self.cpu.call
        return lambda *args: call(address, *args)

    def worker_functions(self, address: int, nargs: int,
                         workers: int) -> list[Callable[..., int]]:
        """One callable per worker, each on its own CPU (:meth:`cpus`), so
        the workers' calls run at the same time."""
        return [(lambda call: lambda *args: call(address, *args))(cpu.call)
                for cpu in self.cpus(max(1, workers))]

    def stop_workers(self, workers: int) -> None:
        """Stop the calls running on the first ``workers`` CPUs
        (:meth:`EmulatedCpu.stop`)."""
        with self._lock:
            cpus = self._cpus[:workers]
        for cpu in cpus:
            cpu.stop()

    def callback(self, function: Callable[..., int], nargs: int) -> int:
        self._check_open("callback", 0)
        with self._lock:
            addr = self._tramp_next
            if addr >= self._tramp + _TRAMPOLINE_SLOT * _TRAMPOLINE_SLOTS:
                raise BackendError("too many callbacks", field="callback",
                                   value=len(self._callbacks))
            self._tramp_next += _TRAMPOLINE_SLOT
            self._callbacks[addr] = (function, nargs)
        return addr

    # --- lifetime -----------------------------------------------------------
    def close(self) -> None:
        """Free every CPU (unicorn engine and translation buffer) and all
        guest memory now, not when the garbage collector finds them. Any
        later use raises :class:`BackendError` (:meth:`release` does
        nothing)."""
        with self._lock:
            if self._closed:
                return
            running = [c for c in self._cpus if c._thread is not None
                       and c._thread != threading.get_ident()]
            if running:
                raise BackendError("cannot close the backend while a CPU runs "
                                   "a call", field="close", value=len(running))
            self._closed = True
            for cpu in self._cpus:
                cpu._close_engine()
            self._cpus.clear()
            for region in self._regions.values():
                region.free()
            for _, region in self._dead:
                region.free()
            self._regions.clear()
            self._index = ([], [])
            self._dead.clear()
            self._log.clear()
            self._pages = PageMap()
            self._heap_live.clear()
            self._heap_free.clear()
            self._heap_chunks.clear()
            self._pool.clear()
            self._pooled = 0
            self._guards.clear()
            self._guarded.clear()
            self._callbacks.clear()

    @property
    def mapped_bytes(self) -> int:
        """Bytes currently held: mappings plus live small allocations, not
        counting the free space of allocation chunks nor binding ranges kept
        for reuse (for leak checks)."""
        with self._lock:
            chunks = len(self._heap_chunks) * _HEAP_CHUNK
            return (sum(r.size for r in self._regions.values()) - chunks
                    - self._pooled + sum(self._heap_live.values()))


def _canary_changed(host: int, size: int, tail: int) -> bool:
    """Whether the ``tail`` canary bytes after ``size`` bytes at host
    address ``host`` differ from :data:`_CANARY`."""
    return bool(tail) and _string_at(host + size, tail) != _CANARY_PREFIX[tail]


def _guard_error(host: int, address: int, size: int, tail: int,
                 what: str) -> GuardError:
    """The error for a guarded range of ``size`` bytes at guest ``address``
    (host ``host``) whose ``tail`` canary bytes changed."""
    got = _string_at(host + size, tail)
    first = next(i for i in range(tail) if got[i] != _CANARY[i])
    last = max(i for i in range(tail) if got[i] != _CANARY[i])
    err = GuardError(f"guest code wrote past the end of the {size}-byte "
                     f"{what} at {address:#x}: byte {size + first} changed "
                     f"({first + 1} past the end)", field=what,
                     value=address)
    err.address, err.size = address, size
    err.offset, err.last_offset = size + first, size + last
    err.fault, err.fault_page, err.pc = "overrun", None, None
    err.fault_address, err.access_size = address + size + first, None
    return err
