"""How unicorn models each architecture's CPU, in unicorn's values.

The facts are each architecture's :attr:`elfloader.arch.Arch.unicorn`
record, which names unicorn's constants (architecture, mode, CPU model,
register prefix, system-call instructions and interrupts) without importing
unicorn; :data:`MODELS` is derived from them here, where the names become
unicorn's values. What must be switched on in a fresh CPU before compiled
code runs (FP/SIMD units that reset disabled, the x86_32 translation
workaround) is code: the setups of :data:`INITS`, which the records name.
Register ids are derived from the psABI calling convention of
:mod:`elfloader.arch` by name, so the calling convention is described
once. Only the emulated backend imports this module (and unicorn).
"""

from __future__ import annotations

import ctypes
import importlib
from dataclasses import dataclass
from typing import Callable

from unicorn import arm_const, riscv_const, x86_const
from unicorn import unicorn_const as UC
from unicorn.unicorn_py3.unicorn import uc_hook_h, uclib

from ...arch import ARCHES, Arch, UnicornModel

# --- enabling FP/SIMD and other per-CPU setup ---------------------------------
_CR0_MP, _CR0_EM = 1 << 1, 1 << 2
_CR4_OSFXSR, _CR4_OSXMMEXCPT = 1 << 9, 1 << 10
_CPACR_CP10_CP11_FULL = 0xF << 20
_FPEXC_EN = 1 << 30
_MSTATUS_FS_DIRTY = 0x6000


def _x86_32_init(uc) -> None:
    # SSE usable: no x87 emulation trap, FXSAVE/SSE enabled by the "OS".
    cr0 = uc.reg_read(x86_const.UC_X86_REG_CR0)
    uc.reg_write(x86_const.UC_X86_REG_CR0, (cr0 | _CR0_MP) & ~_CR0_EM)
    cr4 = uc.reg_read(x86_const.UC_X86_REG_CR4)
    uc.reg_write(x86_const.UC_X86_REG_CR4, cr4 | _CR4_OSFXSR | _CR4_OSXMMEXCPT)
    # The floating-point state a Linux process starts with (x87: extended
    # precision, exceptions masked; SSE: exceptions masked), as qemu-user
    # and real chips give; unicorn starts both at 0.
    uc.reg_write(x86_const.UC_X86_REG_FPCW, 0x037F)
    uc.reg_write(x86_const.UC_X86_REG_MXCSR, 0x1F80)
    # unicorn 2.1 crashes the process while translating long straight-line
    # x87 blocks (generic i686 code is full of them) unless a code hook is
    # present. A hook whose callback is a native function that does nothing
    # (libc ``abs``) avoids the crash at a small cost; Python is never entered.
    libc = ctypes.CDLL(None)
    noop = ctypes.cast(libc.abs, ctypes.c_void_p)
    handle = uc_hook_h()
    status = uclib.uc_hook_add(
        uc._uch,  # noqa: SLF001 - unicorn keeps its engine handle private
        ctypes.byref(handle), UC.UC_HOOK_CODE, noop, None,
        ctypes.c_uint64(1), ctypes.c_uint64(0))
    if status != UC.UC_ERR_OK:
        uc.hook_add(UC.UC_HOOK_CODE, lambda *args: None)


def _arm32_init(uc) -> None:
    # VFP/NEON instructions are undefined until CPACR grants cp10/cp11 and
    # FPEXC.EN is set.
    uc.reg_write(arm_const.UC_ARM_REG_C1_C0_2,
                 uc.reg_read(arm_const.UC_ARM_REG_C1_C0_2) | _CPACR_CP10_CP11_FULL)
    uc.reg_write(arm_const.UC_ARM_REG_FPEXC, _FPEXC_EN)


def _riscv_init(uc) -> None:
    # Float instructions trap until mstatus.FS is non-zero (Off); Dirty
    # also keeps the state saved across the emulator's context switches.
    uc.reg_write(riscv_const.UC_RISCV_REG_MSTATUS, _MSTATUS_FS_DIRTY)


#: The setups a fresh CPU gets, by the name an architecture's
#: :attr:`elfloader.arch.UnicornModel.init` gives.
INITS: dict[str, Callable[[object], None]] = {
    "x86_32_fpu": _x86_32_init,
    "arm_vfp": _arm32_init,
    "riscv_fpu": _riscv_init,
}


@dataclass(frozen=True)
class UcSyscalls:
    """How unicorn stops at the system-call instructions of one architecture
    (measured on unicorn 2.1). Neither hook costs anything per instruction:
    unicorn calls them only when such an instruction runs.

    Attributes:
        insns: ``UC_X86_INS_*`` instructions hooked with ``UC_HOOK_INSN``
            (x86 ``syscall``, ``sysenter``); in the hook the pc is the
            instruction's own address.
        intnos: interrupt numbers that are system calls, from
            ``UC_HOOK_INTR`` (``int 0x80``: 0x80; ``svc``: ``EXCP_SWI``, 2;
            ``ecall``: the cause of an ecall); in the hook the pc is the
            next instruction's. With such a hook every other exception the
            CPU raises reaches it too (page faults, ``brk``, ``int3``...):
            those stop the call as an unhandled CPU exception, as unicorn
            does when no hook catches them.
        thumb: ``(register, bit)`` whose bit is set in Thumb state (arm32:
            ``cpsr`` T), the state the pc's bit 0 marks; None elsewhere.
    """

    insns: tuple[int, ...] = ()
    intnos: frozenset[int] = frozenset()
    thumb: tuple[str, int] | None = None


@dataclass(frozen=True)
class UcModel:
    """unicorn's view of one architecture.

    Attributes:
        uc_arch, uc_mode: ``Uc(uc_arch, uc_mode)``; cpu: ``UC_CPU_*`` model
            or None for unicorn's default.
        regs: unicorn's constants module; prefix: register constant prefix.
        init: called with a fresh ``Uc`` to enable FP/SIMD etc.
        page_size: the CPU's page size, set before it starts (unicorn's
            ARM CPUs default to 1 KiB pages: four times the TLB fills of
            4 KiB ones), or None for unicorn's default.
        syscalls: how unicorn reports a system-call instruction.
    """

    uc_arch: int
    uc_mode: int
    regs: object
    prefix: str
    cpu: int | None = None
    init: Callable[[object], None] | None = None
    page_size: int | None = None
    syscalls: UcSyscalls = UcSyscalls()

    def reg(self, name: str) -> int:
        """unicorn register id of psABI register ``name`` (``rdi``, ``x0``)."""
        return getattr(self.regs, self.prefix + name.upper())


def uc_model(facts: UnicornModel) -> UcModel:
    """unicorn's values for the constant names of ``facts``.

    Raises:
        AttributeError, ImportError: a name the installed unicorn lacks.
        KeyError: an ``init`` name :data:`INITS` lacks.
    """
    regs = importlib.import_module("unicorn." + facts.constants)
    return UcModel(
        getattr(UC, facts.arch), getattr(UC, facts.mode), regs, facts.prefix,
        cpu=getattr(regs, facts.cpu) if facts.cpu else None,
        init=INITS[facts.init] if facts.init else None,
        page_size=facts.page_size,
        syscalls=UcSyscalls(insns=tuple(getattr(regs, n) for n in facts.syscall_insns),
                            intnos=frozenset(facts.syscall_intnos), thumb=facts.thumb))


#: unicorn's model per runtime architecture, from each
#: :attr:`elfloader.arch.Arch.unicorn`.
MODELS: dict[str, UcModel] = {a.name: uc_model(a.unicorn) for a in ARCHES}


@dataclass(frozen=True)
class UcRegisters:
    """Register ids of an architecture's calling convention.

    Attributes:
        args: ids of the integer argument registers; result, sp, pc: ids;
        link: id of the return-address register, or None (pushed);
        syscall: id of the register holding a system call's number
        (:attr:`elfloader.arch.SystemCalls.number`).
    """

    args: tuple[int, ...]
    result: int
    sp: int
    pc: int
    link: int | None
    syscall: int


def model(arch: Arch) -> UcModel:
    return MODELS[arch.name]


def registers(arch: Arch) -> UcRegisters:
    """Register ids derived from ``arch.cc`` and ``arch.syscalls`` by name."""
    m, cc = MODELS[arch.name], arch.cc
    return UcRegisters(
        args=tuple(m.reg(r) for r in cc.int_args), result=m.reg(cc.int_result),
        sp=m.reg(cc.stack_pointer), pc=m.reg(cc.program_counter),
        link=m.reg(cc.return_address) if cc.return_address else None,
        syscall=m.reg(arch.syscalls.number))


def virtual_tlb(uc) -> None:
    """Switch a fresh CPU to unicorn's virtual TLB (before anything is
    mapped or run): page permissions then come from the TLB-fill hook,
    not from the CPU's own page tables (which are off)."""
    uc.ctl_set_tlb_mode(UC.UC_TLB_VIRTUAL)


def flush_tlb(uc) -> None:
    """Drop every TLB entry of ``uc`` (translated code stays)."""
    uc.ctl(UC.UC_CTL_TLB_FLUSH, UC.UC_CTL_IO_WRITE)
