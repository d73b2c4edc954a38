"""riscv32: ILP32 psABI (the runtime passes integers only)."""

from unicorn import UC_ARCH_RISCV, UC_MODE_RISCV32

from . import riscv
from .base import Arch

ARCH = Arch(
    name="riscv32",
    aliases=("rv32", "riscv_32"),
    host_names=("riscv32",),
    machine=243,
    elf_class=32,
    rel_tags="rela",
    relocations=riscv.relocations(4),
    cc=riscv.CALLING_CONVENTION,
    uc_arch=UC_ARCH_RISCV,
    uc_mode=UC_MODE_RISCV32,
    uc_init=riscv.uc_init,
    import_thunk=riscv.IMPORT_THUNK,
    return_insn=riscv.RETURN_INSN,
)
