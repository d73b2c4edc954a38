"""riscv64: LP64D psABI (integer arguments only are passed by the runtime)."""

from unicorn import UC_ARCH_RISCV, UC_MODE_RISCV64

from . import riscv
from .base import Arch

ARCH = Arch(
    name="riscv64",
    aliases=("rv64", "riscv_64"),
    host_names=("riscv64",),
    machine=243,
    elf_class=64,
    rel_tags="rela",
    relocations=riscv.relocations(8),
    cc=riscv.CALLING_CONVENTION,
    uc_arch=UC_ARCH_RISCV,
    uc_mode=UC_MODE_RISCV64,
    uc_init=riscv.uc_init,
    import_thunk=riscv.IMPORT_THUNK,
    return_insn=riscv.RETURN_INSN,
)
