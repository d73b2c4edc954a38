"""riscv32: ILP32 psABI (the runtime passes integers only)."""

from fatelf.arches import lookup

from . import riscv
from .base import Arch, SystemCalls

ARCH = Arch(
    info=lookup("riscv32"),
    rel_tags="rela",
    relocations=riscv.relocations(4),
    cc=riscv.CALLING_CONVENTION,
    import_thunk=riscv.IMPORT_THUNK,
    return_insn=riscv.RETURN_INSN,
    disassembly=riscv.disassembly(4),
    syscalls=SystemCalls(  # ecall; the generic table, as riscv64
        instructions=("ecall",), number="a7", length=4, table="riscv64"),
)
