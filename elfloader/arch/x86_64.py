"""x86_64: System V AMD64 psABI.

Relocations (RELA, ``DT_RELA`` and ``DT_JMPREL``) as handled by IREE's
``runtime/src/iree/hal/local/elf/arch/x86_64.c``; numbers and formulas from
the psABI. Integer arguments in rdi, rsi, rdx, rcx, r8, r9; result in rax;
the call pushes the return address.
"""

from fatelf.arches import lookup

from . import x86
from .base import (
    ARENA_64,
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
    1: ("R_X86_64_64", 8, lambda S, A, P, B: S + A),
    2: ("R_X86_64_PC32", 4, lambda S, A, P, B: S + A - P, "signed"),
    5: ("R_X86_64_COPY", 8, lambda S, A, P, B: S),
    6: ("R_X86_64_GLOB_DAT", 8, lambda S, A, P, B: S),
    7: ("R_X86_64_JUMP_SLOT", 8, lambda S, A, P, B: S),
    8: ("R_X86_64_RELATIVE", 8, lambda S, A, P, B: B + A),
    10: ("R_X86_64_32", 4, lambda S, A, P, B: S + A, "unsigned"),
    11: ("R_X86_64_32S", 4, lambda S, A, P, B: S + A, "signed"),
    24: ("R_X86_64_PC64", 8, lambda S, A, P, B: S + A - P),
})

ARCH = Arch(
    info=lookup("x86_64"),
    rel_tags="rela",
    relocations=RELOCATIONS,
    cc=CallingConvention(
        int_args=("rdi", "rsi", "rdx", "rcx", "r8", "r9"),
        int_result="rax", stack_pointer="rsp", program_counter="rip",
        return_address=None),
    import_thunk=bytes.fromhex(
        "4889f8"    # mov rax, rdi
        "4889f7"    # mov rdi, rsi
        "4889d6"    # mov rsi, rdx
        "4889ca"    # mov rdx, rcx
        "ffe0"      # jmp rax
    ),
    return_insn=bytes.fromhex("c3"),  # ret
    # Variable length (1 to 15 bytes): only the decoder knows.
    disassembly=Disassembly(
        capstone_arch="CS_ARCH_X86", capstone_modes=("CS_MODE_64",), default_length=0,
        # VEX (C4, C5) and EVEX (62) prefixes.
        extensions=((0xFF, 0xC4, "AVX/AVX2/FMA (VEX-encoded)"),
                    (0xFF, 0xC5, "AVX/AVX2 (VEX-encoded)"),
                    (0xFF, 0x62, "AVX-512 (EVEX-encoded)")),
    ),
    syscalls=SystemCalls(  # syscall (0F 05); int 0x80 and sysenter are 32-bit entries
        instructions=("syscall",), number="rax", length=2, table="x86_64"),
    qemu=QemuUser("qemu-x86_64", ARENA_64, branches=x86.QEMU_BRANCHES),
    # syscall; unicorn runs it as a no-op without the hook.
    unicorn=UnicornModel("UC_ARCH_X86", "UC_MODE_64", "x86_const", "UC_X86_REG_",
                         syscall_insns=("UC_X86_INS_SYSCALL",)),
    builds=BuildTargets(agent=("-target", "x86_64-linux-musl", "-mcpu=x86_64"),
                        vector_profile="x86-64-v3"),
)
