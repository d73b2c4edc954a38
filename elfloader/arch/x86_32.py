"""x86_32: System V i386 psABI (cdecl).

Relocations (REL, implicit addends) as handled by IREE's
``runtime/src/iree/hal/local/elf/arch/x86_32.c``; numbers and formulas from
the i386 psABI. Arguments are passed on the stack, the result in eax; the
call pushes the return address and the caller pops the arguments. 64-bit
integers are 4-byte aligned inside structs.
"""

from unicorn import UC_ARCH_X86, UC_MODE_32
from unicorn import x86_const as X

from .base import Arch, CallingConvention, reloc_table

_CR0_MP, _CR0_EM = 1 << 1, 1 << 2
_CR4_OSFXSR, _CR4_OSXMMEXCPT = 1 << 9, 1 << 10


def _init(uc) -> None:
    # Make SSE usable: no x87 emulation trap, FXSAVE/SSE enabled by the "OS".
    cr0 = uc.reg_read(X.UC_X86_REG_CR0)
    uc.reg_write(X.UC_X86_REG_CR0, (cr0 | _CR0_MP) & ~_CR0_EM)
    cr4 = uc.reg_read(X.UC_X86_REG_CR4)
    uc.reg_write(X.UC_X86_REG_CR4, cr4 | _CR4_OSFXSR | _CR4_OSXMMEXCPT)
    _install_translation_workaround(uc)


def _install_translation_workaround(uc) -> None:
    """unicorn 2.1 crashes the process while translating long straight-line
    x87 blocks (generic i686 code from LLVM is full of them) unless a code
    hook is present. A hook whose callback is a native function that does
    nothing (libc ``abs``) avoids the crash at a small cost; Python is never
    entered. Falls back to a Python no-op hook if the binding changes."""
    import ctypes

    from unicorn import UC_HOOK_CODE
    try:
        from unicorn.unicorn_py3.unicorn import HOOK_CODE_CFUNC
        libc = ctypes.CDLL(None)
        noop = HOOK_CODE_CFUNC(ctypes.cast(libc.abs, ctypes.c_void_p).value)
        uc._Uc__do_hook_add(UC_HOOK_CODE, noop, 1, 0)
    except (ImportError, AttributeError, OSError):
        uc.hook_add(UC_HOOK_CODE, lambda *args: None)


RELOCATIONS = reloc_table({
    1: ("R_386_32", 4, lambda S, A, P, B: S + A),
    2: ("R_386_PC32", 4, lambda S, A, P, B: S + A - P),
    6: ("R_386_GLOB_DAT", 4, lambda S, A, P, B: S),
    7: ("R_386_JMP_SLOT", 4, lambda S, A, P, B: S),
    8: ("R_386_RELATIVE", 4, lambda S, A, P, B: B + A),
})

ARCH = Arch(
    name="x86_32",
    aliases=("i386", "i686", "x86", "ia32"),
    host_names=("i386", "i686", "x86"),
    machine=3,
    elf_class=32,
    rel_tags="rel",
    relocations=RELOCATIONS,
    cc=CallingConvention(
        arg_regs=(),
        ret_reg=X.UC_X86_REG_EAX,
        sp_reg=X.UC_X86_REG_ESP,
        pc_reg=X.UC_X86_REG_EIP,
        link_reg=None,
    ),
    uc_arch=UC_ARCH_X86,
    uc_mode=UC_MODE_32,
    uc_init=_init,
    int64_align=4,
    import_thunk=bytes.fromhex(
        "8b442404"  # mov eax, [esp+4]       ; fn
        "ff742410"  # push dword [esp+16]    ; reserved
        "ff742410"  # push dword [esp+16]    ; context
        "ff742410"  # push dword [esp+16]    ; params
        "ffd0"      # call eax
        "83c40c"    # add esp, 12
        "c3"        # ret
    ),
    return_insn=bytes.fromhex("c3"),  # ret
)
