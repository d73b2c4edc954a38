"""arm32: AAPCS with the hard-float variant (VFP registers for floats; the
runtime passes integers only, in r0-r3, result in r0, return address in lr).

Relocations (REL, implicit addends) as handled by IREE's
``runtime/src/iree/hal/local/elf/arch/arm_32.c``; numbers and formulas from
the ELF for the Arm Architecture psABI. Odd code addresses are Thumb; the
CPU and ``bx`` switch instruction sets on bit 0.
"""

from fatelf.arches import lookup

from .base import (
    ARENA_32,
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

#: The T bit of cpsr: set in Thumb state.
CPSR_T = 1 << 5

RELOCATIONS = reloc_table({
    2: ("R_ARM_ABS32", 4, lambda S, A, P, B: S + A),
    3: ("R_ARM_REL32", 4, lambda S, A, P, B: S + A - P),
    21: ("R_ARM_GLOB_DAT", 4, lambda S, A, P, B: S),
    22: ("R_ARM_JUMP_SLOT", 4, lambda S, A, P, B: S),
    23: ("R_ARM_RELATIVE", 4, lambda S, A, P, B: B + A),
})

ARCH = Arch(
    info=lookup("arm32"),
    rel_tags="rel",
    relocations=RELOCATIONS,
    cc=CallingConvention(
        int_args=("r0", "r1", "r2", "r3"), int_result="r0",
        stack_pointer="sp", program_counter="pc", return_address="lr"),
    import_thunk=words(
        0xE1A0C000,  # mov r12, r0
        0xE1A00001,  # mov r0, r1
        0xE1A01002,  # mov r1, r2
        0xE1A02003,  # mov r2, r3
        0xE12FFF1C,  # bx r12
    ),
    return_insn=words(0xE12FFF1E),  # bx lr
    # A32 instructions are 4 bytes. A code address with bit 0 set is T32
    # (Thumb), whose instructions are 4 bytes when the first halfword's
    # bits 15:11 are 11101, 11110 or 11111, else 2 (Arm ARM, "T32
    # instruction set encoding").
    disassembly=Disassembly(
        capstone_arch="CS_ARCH_ARM", capstone_modes=("CS_MODE_ARM",),
        thumb_modes=("CS_MODE_THUMB",),
        thumb_lengths=((0xF800, 0xE800, 4), (0xF800, 0xF000, 4),
                       (0xF800, 0xF800, 4), (0, 0, 2)),
        stores=("st", "vst", "push", "vpush", "srs")),
    syscalls=SystemCalls(  # svc #0 (EABI: number in r7)
        instructions=("svc", "swi"), number="r7", length=4, table="arm", thumb_length=2),
    qemu=QemuUser("qemu-arm", ARENA_32),
    # VFP/NEON are enabled (CPACR, FPEXC) before code runs.
    unicorn=UnicornModel("UC_ARCH_ARM", "UC_MODE_ARM", "arm_const", "UC_ARM_REG_",
                         cpu="UC_CPU_ARM_CORTEX_A15", init="arm_vfp", page_size=4096,
                         syscall_intnos=(UC_ARM_EXCP_SWI,), thumb=("cpsr", CPSR_T)),
    builds=BuildTargets(agent=("-target", "arm-linux-musleabihf", "-mcpu=cortex_a9"),
                        vector_profile="armv7-a+neon+vfp4+hwdiv",
                        # VFPv3 without NEON: one object serves every profile
                        libm=("-target", "arm-freestanding-eabihf",
                              "-mcpu=generic+v7a+vfp3d16")),
)
