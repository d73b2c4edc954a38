"""Shared parts of riscv32 and riscv64: relocation numbers, the integer
calling convention (a0-a7, result in a0, return address in ra) and the
import thunk, which is the same code for both widths."""

from .base import CallingConvention, Disassembly, UnicornModel, reloc_table, words

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


#: RISC-V instruction lengths from the low bits of the first 16-bit unit
#: (unprivileged ISA, "Expanded Instruction-Length Encoding"): bits 1:0 not
#: 11 is a 16-bit (C extension) instruction, bits 4:2 not 111 a 32-bit one;
#: 48-bit and longer encodings are not decoded.
LENGTHS = ((0x3, 0x0, 2), (0x3, 0x1, 2), (0x3, 0x2, 2), (0x1F, 0x1F, 0))

#: Encodings of the V extension (RVV 1.0): major opcode OP-V (arithmetic,
#: vsetvli), and LOAD-FP/STORE-FP with a vector width (funct3 0, 5, 6 or
#: 7). capstone 6 decodes them; with capstone 5 a report shows their bytes
#: and this name.
EXTENSIONS = ((0x7F, 0x57, "RVV (vector extension)"),) + tuple(
    (0x707F, (width << 12) | opcode, "RVV (vector extension)")
    for opcode in (0x07, 0x27) for width in (0, 5, 6, 7))


def disassembly(word_size: int) -> Disassembly:
    """Capstone facts for riscv32 (``word_size`` 4) or riscv64 (8): the
    base ISA of that width plus compressed instructions, and (capstone 6)
    the F, D, A and V extensions the profiles use."""
    return Disassembly(
        capstone_arch="CS_ARCH_RISCV",
        capstone_modes=(f"CS_MODE_RISCV{8 * word_size}", "CS_MODE_RISCVC"),
        optional_modes=OPTIONAL_MODES, text_fixes=TEXT_FIXES,
        lengths=LENGTHS, extensions=EXTENSIONS, stores=STORES,
        store_opcodes=STORE_OPCODES)


#: Mnemonic starts of the instructions that store.
STORES = ("s", "c.s", "fs", "c.fs", "vs", "amo", "sc.")
#: Major opcodes of STORE, STORE-FP (vector stores too) and AMO.
STORE_OPCODES = (0x23, 0x27, 0x2F)


#: capstone 6 mode names of the standard extensions beyond I and C that the
#: CPU profiles and qemu's most capable model use (absent from capstone 5,
#: which decodes F, D, A and bit manipulation always and V never).
OPTIONAL_MODES = ("CS_MODE_RISCV_FD", "CS_MODE_RISCV_A", "CS_MODE_RISCV_V",
                  "CS_MODE_RISCV_ZBA", "CS_MODE_RISCV_ZBB", "CS_MODE_RISCV_ZBS")

#: qemu-user ``-cpu`` properties of the bit-manipulation extensions its
#: most capable models add.
QEMU_BITMANIP = ",zba=true,zbb=true,zbc=true,zbs=true"

#: riscv exception causes of an ecall from U, S and M mode: unicorn 2.1
#: reports 8 (U) whatever the mode (it calls the hook before QEMU adds the
#: privilege level; its CPU runs in M mode), the others are kept in case a
#: version reports the final cause.
UC_ECALLS = (8, 9, 11)


def unicorn_model(word_size: int) -> UnicornModel:
    """unicorn's riscv32 (``word_size`` 4) or riscv64 (8) CPU: the float
    unit switched on (mstatus.FS) before code runs, ``ecall`` reported as
    an interrupt."""
    return UnicornModel("UC_ARCH_RISCV", f"UC_MODE_RISCV{8 * word_size}", "riscv_const",
                        "UC_RISCV_REG_", init="riscv_fpu", syscall_intnos=UC_ECALLS)


#: capstone 6.0.0a11 prints the SEW of vsetvli/vsetivli in hexadecimal
#: (``e0x20``); RVV's assembly syntax is decimal (``e32``).
TEXT_FIXES = ((r"\be0x10\b", "e16"), (r"\be0x20\b", "e32"),
              (r"\be0x40\b", "e64"))
