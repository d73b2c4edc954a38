"""What an architecture module provides to the loader and the backends.

Each module in :mod:`elfloader.arch` builds one :class:`Arch`: its ELF
identity, its table of relocation types, its C calling convention as seen by
the emulator, and the machine code of its import thunk. The loader and the
backends only read these tables; they never branch on the architecture.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

# Relocation formulas take S (symbol address), A (addend), P (place address)
# and B (load bias) and return the value stored at the place.
Formula = Callable[[int, int, int, int], int]


@dataclass(frozen=True)
class Relocation:
    """One row of an architecture's relocation table.

    Attributes:
        name: psABI name, e.g. ``R_AARCH64_RELATIVE``.
        size: bytes written at the place (4 or 8).
        formula: ``(S, A, P, B) -> value``.
        check: how the value must fit the place: ``"wrap"`` (truncate),
            ``"signed"`` or ``"unsigned"`` (raise if it does not fit).
    """

    name: str
    size: int
    formula: Formula
    check: str = "wrap"


@dataclass(frozen=True)
class CallingConvention:
    """Integer/pointer argument passing of the C ABI, for the emulator.

    Attributes:
        arg_regs: unicorn register ids for the integer arguments, in order.
        ret_reg: register holding an integer/pointer result.
        sp_reg, pc_reg: stack pointer and program counter registers.
        link_reg: register receiving the return address, or ``None`` when the
            call instruction pushes it on the stack (x86).
        stack_align: stack alignment required at a call site, in bytes.
    """

    arg_regs: Sequence[int]
    ret_reg: int
    sp_reg: int
    pc_reg: int
    link_reg: int | None
    stack_align: int = 16


@dataclass(frozen=True)
class Arch:
    """Everything the loader and backends need to know about one architecture.

    Attributes:
        name: canonical name (``x86_64``, ``aarch64``, ``riscv64``, ...).
        aliases: other accepted spellings (``amd64``, ``arm64``, ...).
        machine: ELF ``e_machine``.
        elf_class: 32 or 64 (``EI_CLASS``); also the pointer width in bits.
        rel_tags: which relocation tables this architecture uses:
            ``"rela"`` (``DT_RELA``) or ``"rel"`` (``DT_REL``).
        relocations: relocation type number -> :class:`Relocation`.
        cc: calling convention used by the emulated backend.
        uc_arch, uc_mode, uc_cpu: unicorn identifiers (``uc_cpu`` may be None).
        uc_init: called with a fresh ``Uc`` to enable FP/SIMD etc.
        import_thunk: machine code of ``int thunk(fn, params, context,
            reserved)`` that tail-calls ``fn(params, context, reserved)``
            (iree/hal/local/executable_library.h, import_thunk).
        return_insn: machine code of a plain function return.
        host_names: ``platform.machine()`` values meaning this architecture.
        int64_align: alignment of 64-bit integers inside C structs (4 on
            i386, 8 elsewhere).
    """

    name: str
    machine: int
    elf_class: int
    rel_tags: str
    relocations: Mapping[int, Relocation]
    cc: CallingConvention
    uc_arch: int
    uc_mode: int
    uc_init: Callable[[object], None]
    import_thunk: bytes
    return_insn: bytes
    uc_cpu: int | None = None
    int64_align: int = 8
    aliases: tuple[str, ...] = ()
    host_names: tuple[str, ...] = ()

    @property
    def pointer_size(self) -> int:
        """Pointer width in bytes (4 or 8)."""
        return self.elf_class // 8

    @property
    def c_abi(self) -> tuple[int, int]:
        """(pointer size, 64-bit integer alignment): the key of struct layouts."""
        return self.pointer_size, self.int64_align

    @property
    def word_mask(self) -> int:
        return (1 << self.elf_class) - 1

    # --- emulated calling convention -------------------------------------
    # The stack-passing variants (x86_32) override these through ``cc``
    # having no argument registers; see :func:`stack_args_call`.

    def emu_prepare_call(self, uc, func: int, args: Sequence[int],
                         return_address: int, stack_top: int) -> None:
        """Set registers and stack so that running from ``func`` performs
        ``func(*args)`` and returns to ``return_address``."""
        cc = self.cc
        ps = self.pointer_size
        nreg = len(cc.arg_regs)
        reg_args, stack_args = list(args[:nreg]), list(args[nreg:])
        sp = stack_top - ps * len(stack_args)
        sp &= ~(cc.stack_align - 1)
        if stack_args:
            uc.mem_write(sp, pack_words(stack_args, ps))
        if cc.link_reg is None:
            sp -= ps
            uc.mem_write(sp, pack_words([return_address], ps))
        else:
            uc.reg_write(cc.link_reg, return_address)
        for reg, value in zip(cc.arg_regs, reg_args):
            uc.reg_write(reg, value & self.word_mask)
        uc.reg_write(cc.sp_reg, sp)

    def emu_result(self, uc) -> int:
        """Integer/pointer result of the call that just returned."""
        return uc.reg_read(self.cc.ret_reg) & self.word_mask

    def emu_callback_args(self, uc, count: int) -> list[int]:
        """The first ``count`` integer arguments at a function's entry."""
        cc = self.cc
        ps = self.pointer_size
        out = [uc.reg_read(r) & self.word_mask for r in cc.arg_regs[:count]]
        if len(out) < count:
            sp = uc.reg_read(cc.sp_reg)
            # At entry the stack holds the return address first when the call
            # instruction pushed it.
            first = sp + (ps if cc.link_reg is None else 0)
            n = count - len(out)
            out += unpack_words(bytes(uc.mem_read(first, n * ps)), ps)
        return out

    def emu_callback_return(self, uc, value: int) -> None:
        """Return ``value`` from the function whose entry the emulator is at."""
        cc = self.cc
        uc.reg_write(cc.ret_reg, value & self.word_mask)
        if cc.link_reg is None:
            sp = uc.reg_read(cc.sp_reg)
            ret = unpack_words(bytes(uc.mem_read(sp, self.pointer_size)),
                               self.pointer_size)[0]
            uc.reg_write(cc.sp_reg, sp + self.pointer_size)
        else:
            ret = uc.reg_read(cc.link_reg)
        uc.reg_write(cc.pc_reg, ret)


def pack_words(values: Sequence[int], size: int) -> bytes:
    fmt = "<%d%s" % (len(values), "Q" if size == 8 else "I")
    mask = (1 << (8 * size)) - 1
    return struct.pack(fmt, *[v & mask for v in values])


def unpack_words(data: bytes, size: int) -> list[int]:
    fmt = "<%d%s" % (len(data) // size, "Q" if size == 8 else "I")
    return list(struct.unpack(fmt, data))


def words(*insns: int) -> bytes:
    """Little-endian 32-bit instruction words as bytes."""
    return struct.pack("<%dI" % len(insns), *insns)


def reloc_table(rows: Mapping[int, tuple]) -> dict[int, Relocation]:
    """Build a relocation table from ``{type: (name, size, formula[, check])}``."""
    return {rtype: Relocation(*row) for rtype, row in rows.items()}
