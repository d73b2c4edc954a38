"""The unicorn engine: guest code runs on unicorn 2.1 CPUs in this
process.

Every reservation is an anonymous ``mmap`` mapped into each CPU with
``mem_map_ptr``; ``emu_start`` releases the GIL, so CPUs of one address
space run calls concurrently from threads.

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

A system call is a fault (:mod:`.syscalls`): the system-call instruction
of each architecture (``syscall``, ``int 0x80``, ``sysenter``, ``svc``,
``ecall``) is caught by an interrupt or instruction hook, which costs
nothing per instruction (:class:`.unicorn_arch.UcSyscalls`); the call
stops there and raises :class:`~elfloader.errors.EmulationError` with
``fault.kind`` ``"syscall"`` at the instruction's own address. Without the
hooks unicorn would skip an x86 ``syscall`` as if it did nothing and
report ``svc`` and ``ecall`` as an unhandled CPU exception after them.

unicorn 2.1 is QEMU 5.0: it has no AVX/AVX2/FMA, no RVV 1.0 and no SVE
(:attr:`fatelf.arches.Profile.unicorn` says which profiles it runs).
"""

from __future__ import annotations

import ctypes
import mmap

from unicorn import (
    UC_HOOK_CODE,
    UC_PROT_EXEC,
    UC_PROT_NONE,
    UC_PROT_READ,
    UC_PROT_WRITE,
    Uc,
    UcError,
)
from unicorn import unicorn_const as UCC
from unicorn.unicorn_py3.unicorn import HOOK_TLB_FILL_CFUNC, uc_hook_h, uclib

from fatelf.cstruct import pack_array, unpack_array

from ...errors import BackendError, EmulationError, Fault
from ..base import PROT_EXEC, PROT_READ, PROT_WRITE, prot_str
from . import syscalls, unicorn_arch
from .choice import INSTALL_HINT, qemu_program
from .engine import FAULTS as _FAULTS
from .engine import Cpu, Engine, Space
from .pages import lookup

_ARENA_START = 0x0001_0000
_ARENA_END = 0x7FFF_0000
_TRAMPOLINE_SLOT = 16
_SENTINEL_OFFSET = 32
_TLB_GROW_FILLS = 128       # fewer TLB fills in a call: TLB size is fine
_TLB_MAX_PAGES = 1 << 16    # larger working sets do not grow the TLB
#: Physical pages no reservation ever maps (the arena ends below them): a
#: data access to a page the TLB fill refuses is sent to one of them, so
#: the unmapped-memory hook sees its exact offset (see ``_add_tlb_fill_hook``).
_TRAP_START = _ARENA_END
_TRAP_END = 0x8000_0000

#: What a TLB fill is for (``uc_mem_type``): the permission it needs, and
#: the name of the access in messages.
_ACCESS = {
    UCC.UC_MEM_READ: (UC_PROT_READ, "read"),
    UCC.UC_MEM_WRITE: (UC_PROT_WRITE, "write"),
    UCC.UC_MEM_FETCH: (UC_PROT_EXEC, "fetch"),
}

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


class UnicornCpu(Cpu):
    """One unicorn CPU of an :class:`EmulatedBackend`: its own registers,
    stack and translated code, the backend's memory.

    Made by :meth:`EmulatedBackend.fork_cpu` (the backend's own CPU is
    :attr:`EmulatedBackend.cpu`). Different CPUs may run :meth:`call`
    at the same time from different threads; one CPU runs one call at a
    time. A system call made by the guest ends the call with a ``"syscall"``
    fault (see the module docstring); the CPU stays usable.
    """

    def __init__(self, engine: UnicornEngine, space: Space):
        super().__init__(space)
        self._engine = engine
        arch = self.arch
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
        # The PageMap state this CPU maps.
        self._view: tuple[list[int], list[tuple[int, int, int]]] = ([], [])
        self._pending: BaseException | None = None
        # What stopped this call at an interrupt or system-call hook:
        # ("syscall", number, pc of the instruction) or ("interrupt", intno).
        self._trapped: tuple | None = None
        # The unicorn engine; None once closed.
        self.uc: Uc | None
        try:
            self.uc = uc = Uc(model.uc_arch, model.uc_mode)
            if model.cpu is not None:
                uc.ctl_set_cpu_model(model.cpu)
            if model.page_size is not None:
                uc.ctl_set_page_size(model.page_size)
            self._uch = uc._uch  # noqa: SLF001 - unicorn keeps its handle private
            unicorn_arch.virtual_tlb(uc)
            self.page_size = uc.ctl_get_page_size()
            self._fill_hook = self._add_tlb_fill_hook()
            self._add_trap_hook()
            self._add_syscall_hooks(model)
            if model.init is not None:
                model.init(uc)
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

    def _open_uc(self) -> Uc:
        """The unicorn engine of this CPU, which is not closed (only a
        closed CPU has none, and a closed CPU runs and maps nothing)."""
        uc = self.uc
        assert uc is not None
        return uc

    def start(self, stack: int) -> None:
        """Use ``stack`` and hook the trampoline page."""
        super().start(stack)
        engine = self._engine
        self._open_uc().hook_add(UC_HOOK_CODE, self._on_trampoline, begin=engine.tramp,
                         end=engine.tramp + _TRAMPOLINE_SLOT * engine.slots - 1)

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

        self._open_uc().hook_add(UCC.UC_HOOK_MEM_READ_UNMAPPED
                         | UCC.UC_HOOK_MEM_WRITE_UNMAPPED, trapped,
                         begin=_TRAP_START, end=_TRAP_END - 1)

    # --- system calls -----------------------------------------------------------
    def _add_syscall_hooks(self, model) -> None:
        """Hook the architecture's system-call instructions
        (:attr:`.unicorn_arch.UcModel.syscalls`): each notes the call's
        number and the instruction's address and stops the CPU. An
        interrupt hook sees every other exception too: it notes the
        interrupt number and stops the CPU, as unicorn does when no hook
        catches an exception (:meth:`call` reports it the same way)."""
        facts = model.syscalls
        arch, regs = self.arch, self._regs
        thumb = None
        if facts.thumb is not None:
            thumb = (model.reg(facts.thumb[0]), facts.thumb[1])

        def pc_now() -> int:
            pc = self._reg_read(regs.pc)
            if thumb is not None and self._reg_read(thumb[0]) & thumb[1]:
                pc |= 1
            return pc

        def on_insn(uc, user_data):
            # The pc is the instruction's own.
            if self._trapped is None:
                self._trapped = ("syscall", self._reg_read(regs.syscall),
                                 pc_now())
            uc.emu_stop()

        def on_interrupt(uc, intno, user_data):
            if self._trapped is None:
                if intno in facts.intnos:
                    # The pc is the next instruction's.
                    self._trapped = ("syscall", self._reg_read(regs.syscall),
                                     syscalls.start_of(arch, pc_now()))
                else:
                    self._trapped = ("interrupt", intno)
            uc.emu_stop()

        for insn in facts.insns:
            # (aux1: in unicorn's binding, missing from the Python 2 one
            # mypy reads)
            self._open_uc().hook_add(UCC.UC_HOOK_INSN, on_insn,
                             aux1=insn)  # type: ignore[call-arg]
        if facts.intnos:
            self._open_uc().hook_add(UCC.UC_HOOK_INTR, on_interrupt)

    def _flush_tlb(self) -> None:
        """Drop every TLB entry (after a change of the memory map, or to let
        unicorn resize the TLB)."""
        unicorn_arch.flush_tlb(self._open_uc())
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
    def sync(self) -> None:
        """Apply the backend's memory-map changes this CPU has not seen.
        Called with the backend's lock held, when this CPU is not running
        or from its own callback."""
        shared = self._state
        if self.gen == shared.gen:
            return
        flush = False
        uc = self._open_uc()
        first = shared.gen - len(shared.log)
        try:
            for op in shared.log[self.gen - first:]:
                kind, address, size, arg = op
                if kind == "map":
                    uc.mem_map_ptr(address, size, UC_PROT_READ | UC_PROT_WRITE,
                                   arg)
                    # A page refused earlier in this call may hold a trap
                    # entry (from a callback's mapping).
                    flush = flush or bool(self._traps)
                elif kind == "protect":
                    assert isinstance(arg, int)     # (the protection)
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
        self.gen = shared.gen
        self._view = shared.pages.state
        if flush:
            self._flush_tlb()

    def map_all(self) -> None:
        """Map the backend's whole address space into this new CPU. Called
        with the backend's lock held."""
        shared = self._state
        uc = self._open_uc()
        try:
            for region in shared.regions.values():
                uc.mem_map_ptr(region.address, region.size,
                               UC_PROT_READ | UC_PROT_WRITE, region.host)
            for start, end, prot in shared.pages.state[1]:
                if prot != PROT_READ | PROT_WRITE:
                    uc.mem_protect(start, end - start, _uc_prot(prot))
        except UcError as exc:
            raise BackendError(f"cannot map the address space into a new "
                               f"CPU: {exc}", field="fork_cpu",
                               value=None) from None
        self.gen = shared.gen
        self._view = shared.pages.state

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
            sentinel = self._engine.sentinel
            self._prepare_call(args, sentinel)
            self._refused = None
            self._pending = None
            self._trapped = None
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
            trapped, self._trapped = self._trapped, None
            if trapped is not None:
                if trapped[0] == "syscall":
                    self._refused = self._hit = None
                    if self._traps:
                        self._clear_traps()
                    raise syscalls.fault(self.arch, trapped[1], trapped[2],
                                         address)
                if status == UCC.UC_ERR_OK:
                    # Another exception, stopped by the interrupt hook: as
                    # unicorn reports one that no hook catches.
                    status = UCC.UC_ERR_EXCEPTION
            if self._traps:
                err = (self._fault(UcError(status), address)
                       if status != UCC.UC_ERR_OK else None)
                self._clear_traps()
                if err is not None:
                    raise err
            if self._stop:
                record = Fault("stopped", "stopped by request")
                raise EmulationError(record.message(address), field="call",
                                     value=address, fault=record)
            if status != UCC.UC_ERR_OK:
                raise self._fault(UcError(status), address)
            if self._pending is not None:
                exc, self._pending = self._pending, None
                raise exc
            pc = self._reg_read(self._regs.pc)
            if pc != sentinel:
                what = (f"stopped after the {timeout / 1e6:g} s time limit"
                        if timeout else "stopped")
                record = Fault("timeout" if timeout else "stopped", what,
                               pc=pc)
                raise EmulationError(record.message(address), field="call",
                                     value=address, fault=record)
            return self._reg_read(self._regs.result)
        finally:
            self._leave()

    def stop(self) -> None:
        """Ask the call this CPU is running (from another thread) to end as
        soon as possible; it raises :class:`EmulationError` with ``fault.kind``
        ``"stopped"``. Does nothing when the CPU is idle."""
        with self._state.lock:
            if self.thread is None or self._closed:
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
        page = exact = size = access = prot = None
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
            if exc.errno in (UCC.UC_ERR_INSN_INVALID, UCC.UC_ERR_EXCEPTION):
                what += _unsupported(self._space, pc)
        record = Fault(fault, what, access=access, pc=pc, address=exact,
                       page=page, protection=prot, size=size)
        return EmulationError(record.message(address), field="call",
                              value=address, fault=record)

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
        shared = self._state
        entry = shared.callbacks.get(address)
        if entry is None:
            return
        function, nargs = entry
        args = self._callback_args(nargs)
        try:
            result = int(function(*args) or 0)
            # Memory the callback mapped, protected or released applies to
            # this CPU before the guest goes on.
            with shared.lock:
                self.sync()
        except BaseException as exc:
            if self._pending is None:
                self._pending = exc
            uc.emu_stop()
            return
        self._callback_return(result)

    # --- lifetime -----------------------------------------------------------
    def close_engine(self) -> None:
        """Free the unicorn engine and its translation buffer now (not when
        the garbage collector finds the engine)."""
        self._closed = True
        uc, self.uc = self.uc, None
        if uc is None:
            return
        release = getattr(uc, "_Uc__finalizer", None)
        if release is not None:
            release()   # uc_close, once; the engine object is dead after it
        uc._callbacks.clear()  # noqa: SLF001 - unicorn's hook table holds this CPU: break the cycle


def _unsupported(space, pc: int) -> str:
    """``": <instruction> (<extension>); ..."`` for an instruction unicorn
    refused that belongs to an ISA extension it lacks (unicorn may report
    the pc of the instruction or of the one after it), else ``""``."""
    from ...diagnose import disassemble, extension
    name = space.arch.name
    thumb = space.arch.disassembly.thumb_modes is not None
    for at in (pc, pc - 4, pc - 2):
        try:
            code = space.read(at & ~1 if thumb else at, 16)
        except BackendError:
            continue
        ext = extension(name, code)
        if ext is not None:
            break
    else:
        return ""
    how = ("run it with engine='qemu' (--engine=qemu)" if qemu_program(name)
           else INSTALL_HINT)
    return (f": {disassemble(name, code, at)} at {at:#x} is {ext}, which the "
            f"unicorn engine does not run; the qemu engine does: {how}")


class UnicornEngine(Engine):
    """unicorn CPUs for one address space (see the module docstring)."""

    name = "unicorn"
    eager_sync = True
    defer_free = True

    def __init__(self, arch, profile, vlen):
        super().__init__(arch, profile, vlen)
        self.arena = (_ARENA_START, _ARENA_END)
        self.sentinel = 0
        self.tramp = 0
        self.slots = 0

    def region(self, address: int, size: int) -> _Region:
        return _Region(address, size)

    def new_cpu(self, space: Space) -> UnicornCpu:
        return UnicornCpu(self, space)

    def setup(self, space: Space, slots: int) -> list[int]:
        """Place the return sentinel and the callback trampolines (one
        return instruction per slot, hooked by every CPU)."""
        ret = self.arch.return_insn
        # The return address is inside its page, not at its start: unicorn
        # gives the block that stops the CPU a size of zero and looks up the
        # page of its last byte (the byte before it) for execution, which
        # the previous page (data) would refuse.
        self.sentinel = space.place_code(
            ret * (2 * _SENTINEL_OFFSET // len(ret))) + _SENTINEL_OFFSET
        slot = ret * (_TRAMPOLINE_SLOT // len(ret))
        self.tramp = space.place_code(slot * slots)
        self.slots = slots
        return [self.tramp + i * _TRAMPOLINE_SLOT for i in range(slots)]
