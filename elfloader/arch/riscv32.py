"""riscv32: ILP32 psABI (the runtime passes integers only)."""

from fatelf.arches import lookup

from . import riscv
from .base import ARENA_32, Arch, BuildTargets, QemuUser, SystemCalls

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
    # Full RVV 1.0 on rv32 (no rv32 profile has it), at RVV's lengths.
    qemu=QemuUser("qemu-riscv32", ARENA_32, ("riscv64", "rv64gcv"),
                  model="rv32,v=true,vlen={vlen},elen=64,vext_spec=v1.0"
                        + riscv.QEMU_BITMANIP),
    unicorn=riscv.unicorn_model(4),
    # musl's riscv32 setjmp saves double registers unless the ABI is soft.
    builds=BuildTargets(agent=("-target", "riscv32-linux-musl", "-mcpu=generic_rv32+m+a",
                               "-mabi=ilp32"),
                        vector_profile="rv32imf+zve32f",
                        # integer only, ilp32: iree-compile's rv32 code
                        # calls its support functions with floats in
                        # integer registers (its --iree-llvmcpu-target-abi=
                        # ilp32) although it marks its objects single-float
                        # with +f: the linker gives this object their float-
                        # ABI flag (libm_link.py). One object, every profile.
                        libm=("-target", "riscv32-freestanding-none",
                              "-mcpu=generic_rv32+m", "-mabi=ilp32")),
)
