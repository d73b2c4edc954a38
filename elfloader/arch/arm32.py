"""arm32: AAPCS with the hard-float variant (VFP registers for floats; the
runtime passes integers only, in r0-r3, result in r0, return address in lr).

Relocations (REL, implicit addends) as handled by IREE's
``runtime/src/iree/hal/local/elf/arch/arm_32.c``; numbers and formulas from
the ELF for the Arm Architecture psABI. Odd code addresses are Thumb; the
emulator and ``bx`` switch instruction sets on bit 0 as the hardware does.
"""

from unicorn import UC_ARCH_ARM, UC_MODE_ARM
from unicorn import arm_const as A

from .base import Arch, CallingConvention, reloc_table, words

_CPACR_CP10_CP11_FULL = 0xF << 20
_FPEXC_EN = 1 << 30


def _init(uc) -> None:
    # VFP/NEON instructions are undefined until CPACR grants cp10/cp11 and
    # FPEXC.EN is set.
    uc.reg_write(A.UC_ARM_REG_C1_C0_2,
                 uc.reg_read(A.UC_ARM_REG_C1_C0_2) | _CPACR_CP10_CP11_FULL)
    uc.reg_write(A.UC_ARM_REG_FPEXC, _FPEXC_EN)


RELOCATIONS = reloc_table({
    2: ("R_ARM_ABS32", 4, lambda S, A, P, B: S + A),
    3: ("R_ARM_REL32", 4, lambda S, A, P, B: S + A - P),
    21: ("R_ARM_GLOB_DAT", 4, lambda S, A, P, B: S),
    22: ("R_ARM_JUMP_SLOT", 4, lambda S, A, P, B: S),
    23: ("R_ARM_RELATIVE", 4, lambda S, A, P, B: B + A),
})

ARCH = Arch(
    name="arm32",
    aliases=("arm", "armv7", "armv7a", "armhf", "arm_32"),
    host_names=("armv7l", "armv7", "armv8l"),
    machine=40,
    elf_class=32,
    rel_tags="rel",
    relocations=RELOCATIONS,
    cc=CallingConvention(
        arg_regs=(A.UC_ARM_REG_R0, A.UC_ARM_REG_R1, A.UC_ARM_REG_R2,
                  A.UC_ARM_REG_R3),
        ret_reg=A.UC_ARM_REG_R0,
        sp_reg=A.UC_ARM_REG_SP,
        pc_reg=A.UC_ARM_REG_PC,
        link_reg=A.UC_ARM_REG_LR,
    ),
    uc_arch=UC_ARCH_ARM,
    uc_mode=UC_MODE_ARM,
    uc_cpu=A.UC_CPU_ARM_CORTEX_A15,
    uc_init=_init,
    import_thunk=words(
        0xE1A0C000,  # mov r12, r0
        0xE1A00001,  # mov r0, r1
        0xE1A01002,  # mov r1, r2
        0xE1A02003,  # mov r2, r3
        0xE12FFF1C,  # bx r12
    ),
    return_insn=words(0xE12FFF1E),  # bx lr
)
