"""x86_32: System V i386 psABI (cdecl).

Relocations (REL, implicit addends) as handled by IREE's
``runtime/src/iree/hal/local/elf/arch/x86_32.c``; numbers and formulas from
the i386 psABI. Arguments are passed on the stack, the result in eax; the
call pushes the return address and the caller pops the arguments. 64-bit
integers are 4-byte aligned inside structs.
"""

from fatelf.arches import lookup

from . import x86
from .base import (
    ARENA_32,
    Arch,
    BuildTargets,
    CallingConvention,
    Disassembly,
    QemuUser,
    SystemCalls,
    UnicornModel,
    reloc_table,
)

RELOCATIONS = reloc_table({
    1: ("R_386_32", 4, lambda S, A, P, B: S + A),
    2: ("R_386_PC32", 4, lambda S, A, P, B: S + A - P),
    6: ("R_386_GLOB_DAT", 4, lambda S, A, P, B: S),
    7: ("R_386_JMP_SLOT", 4, lambda S, A, P, B: S),
    8: ("R_386_RELATIVE", 4, lambda S, A, P, B: B + A),
})

ARCH = Arch(
    info=lookup("x86_32"),
    rel_tags="rel",
    relocations=RELOCATIONS,
    cc=CallingConvention(
        int_args=(), int_result="eax", stack_pointer="esp",
        program_counter="eip", return_address=None),
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
    # Variable length (1 to 15 bytes): only the decoder knows.
    disassembly=Disassembly(
        capstone_arch="CS_ARCH_X86", capstone_modes=("CS_MODE_32",), default_length=0,
        # VEX (C4, C5) and EVEX (62) prefixes; in 32-bit code these bytes
        # are LES, LDS and BOUND unless the next byte's top bits are 11.
        extensions=((0xC0FF, 0xC0C4, "AVX/AVX2/FMA (VEX-encoded)"),
                    (0xC0FF, 0xC0C5, "AVX/AVX2 (VEX-encoded)"),
                    (0xC0FF, 0xC062, "AVX-512 (EVEX-encoded)")),
    ),
    # int 0x80 (CD 80), sysenter (0F 34); syscall (0F 05) enters the kernel
    # from 32-bit code on AMD CPUs
    syscalls=SystemCalls(
        instructions=("int", "sysenter", "syscall"), number="eax", length=2,
        table="x86"),
    qemu=QemuUser("qemu-i386", ARENA_32, branches=x86.QEMU_BRANCHES),
    # int 0x80, sysenter; and syscall (AMD's 32-bit entry), which unicorn
    # too runs as a no-op without the hook. SSE and the x87 state of a
    # Linux process are set up before code runs.
    unicorn=UnicornModel("UC_ARCH_X86", "UC_MODE_32", "x86_const", "UC_X86_REG_",
                         init="x86_32_fpu",
                         syscall_insns=("UC_X86_INS_SYSENTER", "UC_X86_INS_SYSCALL"),
                         syscall_intnos=(0x80,)),
    builds=BuildTargets(agent=("-target", "x86-linux-musl", "-mcpu=i686"),
                        vector_profile="haswell",
                        # x87 only: one object serves every profile
                        libm=("-target", "x86-freestanding-none", "-mcpu=i686")),
)
