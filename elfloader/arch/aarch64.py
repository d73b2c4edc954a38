"""aarch64: AAPCS64.

Relocations (RELA) as handled by IREE's
``runtime/src/iree/hal/local/elf/arch/arm_64.c``; numbers and formulas from
the ELF for the Arm 64-bit Architecture psABI. Integer arguments in x0-x7;
result in x0; return address in x30 (lr).
"""

from fatelf.arches import lookup

from .base import (
    ARENA_64,
    UC_ARM_EXCP_SWI,
    Arch,
    BuildTargets,
    CallingConvention,
    Disassembly,
    QemuUser,
    SystemCalls,
    UnicornModel,
    reloc_table,
    words,
)

RELOCATIONS = reloc_table({
    257: ("R_AARCH64_ABS64", 8, lambda S, A, P, B: S + A),
    260: ("R_AARCH64_PREL64", 8, lambda S, A, P, B: S + A - P),
    1025: ("R_AARCH64_GLOB_DAT", 8, lambda S, A, P, B: S + A),
    1026: ("R_AARCH64_JUMP_SLOT", 8, lambda S, A, P, B: S + A),
    1027: ("R_AARCH64_RELATIVE", 8, lambda S, A, P, B: B + A),
})

ARCH = Arch(
    info=lookup("aarch64"),
    rel_tags="rela",
    relocations=RELOCATIONS,
    cc=CallingConvention(
        int_args=tuple(f"x{i}" for i in range(8)),
        int_result="x0", stack_pointer="sp", program_counter="pc",
        return_address="x30"),
    import_thunk=words(
        0xAA0003F0,  # mov x16, x0
        0xAA0103E0,  # mov x0, x1
        0xAA0203E1,  # mov x1, x2
        0xAA0303E2,  # mov x2, x3
        0xD61F0200,  # br x16
    ),
    return_insn=words(0xD65F03C0),  # ret
    # A64 instructions are 4 bytes. Encoding groups (Arm ARM, "Top-level
    # encodings"): op0 bits 28:25 = 0010 is SVE, bit 31 = 1 with op0 0000
    # is SME.
    disassembly=Disassembly(
        capstone_arch="CS_ARCH_AARCH64",
        capstone_arch_aliases=("CS_ARCH_ARM64",), capstone_modes=("CS_MODE_ARM",),
        extensions=((0x1E000000, 0x04000000, "SVE (scalable vector extension)"),
                    (0x9E000000, 0x80000000, "SME (scalable matrix extension)")),
        stores=("st", "casp", "cas", "swp", "ldadd", "ldclr", "ldset",
                "ldeor", "prf")),
    syscalls=SystemCalls(  # svc #0
        instructions=("svc",), number="x8", length=4, table="aarch64"),
    # The most capable model: SVE at the sve profile's vector lengths.
    qemu=QemuUser("qemu-aarch64", ARENA_64, ("aarch64", "sve")),
    unicorn=UnicornModel("UC_ARCH_ARM64", "UC_MODE_ARM", "arm64_const", "UC_ARM64_REG_",
                         page_size=4096, syscall_intnos=(UC_ARM_EXCP_SWI,)),
    builds=BuildTargets(agent=("-target", "aarch64-linux-musl", "-mcpu=generic"),
                        vector_profile="sve"),
)
