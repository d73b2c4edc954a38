"""Shared parts of riscv32 and riscv64: relocation numbers, the integer
calling convention (a0-a7, result in a0, return address in ra) and the
import thunk, which is the same code for both widths."""

from .base import CallingConvention, reloc_table, words

R_RISCV_32 = 1
R_RISCV_64 = 2
R_RISCV_RELATIVE = 3
R_RISCV_JUMP_SLOT = 5


def relocations(word_size: int):
    """RELA relocations for riscv32 (``word_size`` 4) or riscv64 (8), as
    IREE's ``runtime/src/iree/hal/local/elf/arch/riscv.c`` handles them."""
    rows = {
        R_RISCV_32: ("R_RISCV_32", 4, lambda S, A, P, B: S + A),
        R_RISCV_RELATIVE: ("R_RISCV_RELATIVE", word_size,
                           lambda S, A, P, B: B + A),
        R_RISCV_JUMP_SLOT: ("R_RISCV_JUMP_SLOT", word_size,
                            lambda S, A, P, B: S),
    }
    if word_size == 8:
        rows[R_RISCV_64] = ("R_RISCV_64", 8, lambda S, A, P, B: S + A)
    return reloc_table(rows)


CALLING_CONVENTION = CallingConvention(
    int_args=tuple(f"a{i}" for i in range(8)),
    int_result="a0", stack_pointer="sp", program_counter="pc",
    return_address="ra")

IMPORT_THUNK = words(
    0x00050293,  # mv t0, a0
    0x00058513,  # mv a0, a1
    0x00060593,  # mv a1, a2
    0x00068613,  # mv a2, a3
    0x00028067,  # jr t0
)
RETURN_INSN = words(0x00008067)  # ret
