"""riscv64: LP64D psABI (the runtime passes integers only)."""

from fatelf.arches import lookup

from . import riscv
from .base import ARENA_64, Arch, BuildTargets, QemuUser, SystemCalls

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
    # The most capable model: RVV 1.0 at rv64gcv's lengths, bit manipulation.
    qemu=QemuUser("qemu-riscv64", ARENA_64, ("riscv64", "rv64gcv"),
                  extra=riscv.QEMU_BITMANIP),
    unicorn=riscv.unicorn_model(8),
    builds=BuildTargets(agent=("-target", "riscv64-linux-musl", "-mcpu=baseline_rv64"),
                        vector_profile="rv64gcv"),
)
