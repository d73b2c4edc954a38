"""riscv64: LP64D psABI (the runtime passes integers only)."""

from fatelf.arches import lookup

from . import riscv
from .base import Arch, SystemCalls

ARCH = Arch(
    info=lookup("riscv64"),
    rel_tags="rela",
    relocations=riscv.relocations(8),
    cc=riscv.CALLING_CONVENTION,
    import_thunk=riscv.IMPORT_THUNK,
    return_insn=riscv.RETURN_INSN,
    disassembly=riscv.disassembly(8),
    syscalls=SystemCalls(  # ecall
        instructions=("ecall",), number="a7", length=4, table="riscv64"),
)
