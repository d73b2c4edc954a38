"""What an architecture module provides: psABI facts only.

Each module in :mod:`elfloader.arch` builds one :class:`Arch` from the
project's architecture table (:mod:`fatelf.arches`, its identity) plus the
facts of its psABI that the loader and the backends need: its table of
relocation types, its C calling convention for integer and pointer
arguments, and the machine code of IREE's import thunk. The loader and the
backends only read these tables; they never branch on the architecture.
How an emulator models the CPU lives with the emulated backend; how a
disassembler reads the machine code (:class:`Disassembly`) lives here, as
data, for fault reports.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

from fatelf.arches import ArchInfo

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
    """Integer/pointer argument passing of the C ABI, by register name.

    Attributes:
        int_args: registers carrying the first integer arguments, in order;
            further arguments go on the stack, one word each, first argument
            at the lowest address.
        int_result: register holding an integer/pointer result.
        stack_pointer, program_counter: register names.
        return_address: register receiving the return address, or ``None``
            when the call instruction pushes it on the stack (x86).
        stack_align: stack alignment required at a call site, in bytes.
    """

    int_args: Sequence[str]
    int_result: str
    stack_pointer: str
    program_counter: str
    return_address: str | None
    stack_align: int = 16


@dataclass(frozen=True)
class Disassembly:
    """How this architecture's machine code is decoded, as data for
    :func:`elfloader.diagnose.disassemble` (capstone).

    Attributes:
        capstone_arch: capstone architecture constant name, e.g.
            ``CS_ARCH_RISCV`` (looked up in the ``capstone`` package).
        capstone_modes: capstone mode constant names, OR-ed together.
        thumb_modes: modes used instead for a code address with bit 0 set,
            or None when bit 0 of a code address is part of the address.
            Set for arm32, whose function symbols and code pointers carry
            the instruction set in bit 0 (1: Thumb) per the Arm ELF psABI.
        lengths: instruction length from the first 16-bit little-endian
            unit, as ``(mask, match, length)`` rows: the first row with
            ``unit & mask == match`` gives the length in bytes (0: an
            encoding longer than the disassembler handles); no row matches:
            :attr:`default_length`.
        thumb_lengths: the same rows for Thumb code (bit 0 set).
        default_length: length when no row matches; 0 for variable-length
            instruction sets whose length only the decoder knows (x86).
        extensions: ``(mask, match, name)`` rows on the first 32-bit
            little-endian word of an instruction, naming the ISA extension
            its encoding belongs to (e.g. RVV): a report shows it with an
            instruction the disassembler cannot decode, and the unicorn
            engine names it for an instruction it cannot run.
        capstone_arch_aliases: other names of :attr:`capstone_arch` in
            other capstone releases (capstone 6 renamed ``CS_ARCH_ARM64``
            to ``CS_ARCH_AARCH64``), tried in order when it is missing.
        optional_modes: mode constant names OR-ed in where the installed
            capstone has them: capstone 6 decodes RISC-V's F, D, A and V
            extensions only when asked, capstone 5 always (F, D, A) or never
            (V) and lacks the names.
        text_fixes: ``(regex, replacement)`` rows applied to decoded text,
            for decoder releases that print an operand oddly (capstone
            6.0.0a11 prints RVV's SEW ``e32`` as ``e0x20``).
        stores: mnemonic starts of the instructions that store (write
            memory), telling a data fault's direction where the host's
            signal context does not record it; None where it does (x86).
        store_opcodes: major opcodes (low 7 bits) of the 32-bit
            instructions (low two bits ``11``) that store, decided without
            the disassembler, which does not decode them all (RISC-V: vector
            stores share STORE-FP); empty: the disassembler decides.
    """

    capstone_arch: str
    capstone_modes: tuple[str, ...]
    thumb_modes: tuple[str, ...] | None = None
    lengths: tuple[tuple[int, int, int], ...] = ()
    thumb_lengths: tuple[tuple[int, int, int], ...] = ()
    default_length: int = 4
    extensions: tuple[tuple[int, int, str], ...] = ()
    capstone_arch_aliases: tuple[str, ...] = ()
    optional_modes: tuple[str, ...] = ()
    text_fixes: tuple[tuple[str, str], ...] = ()
    stores: tuple[str, ...] | None = None
    store_opcodes: tuple[int, ...] = ()


@dataclass(frozen=True)
class SystemCalls:
    """How a Linux program of this architecture makes a system call: facts
    for reporting one, which the runtime treats as a fault (a kernel or
    plugin runs bare metal: it has no system to call).

    Attributes:
        instructions: mnemonics of the instructions that enter the kernel
            (e.g. ``("svc",)``), as the disassembler prints them.
        number: register holding the system call number.
        length: bytes of the instruction (the pc a trap reports is the
            next instruction's: the instruction starts ``length`` before).
        thumb_length: the same in Thumb code (arm32), else None.
        table: libseccomp's name of the architecture whose system call
            table gives the names (``riscv64`` serves riscv32: both use the
            generic table).
    """

    instructions: tuple[str, ...]
    number: str
    length: int
    table: str
    thumb_length: int | None = None


@dataclass(frozen=True)
class Arch:
    """Everything the loader and backends need to know about one architecture.

    Attributes:
        info: identity from the architecture table (:class:`fatelf.arches.ArchInfo`).
        rel_tags: which relocation tables this architecture uses:
            ``"rela"`` (``DT_RELA``) or ``"rel"`` (``DT_REL``).
        relocations: relocation type number -> :class:`Relocation`.
        cc: the C calling convention for integer arguments.
        import_thunk: machine code of ``int thunk(fn, params, context,
            reserved)`` that calls ``fn(params, context, reserved)``
            (iree/hal/local/executable_library.h, import_thunk).
        return_insn: machine code of a plain function return.
        disassembly: how its machine code is decoded (fault reports).
        syscalls: how its Linux system calls are made (fault reports).
        int64_align: alignment of 64-bit integers inside C structs (4 on
            i386, 8 elsewhere).
    """

    info: ArchInfo
    rel_tags: str
    relocations: Mapping[int, Relocation]
    cc: CallingConvention
    import_thunk: bytes
    return_insn: bytes
    disassembly: Disassembly
    syscalls: SystemCalls
    int64_align: int = 8

    @property
    def name(self) -> str:
        return self.info.name

    @property
    def aliases(self) -> tuple[str, ...]:
        return self.info.aliases

    @property
    def machine(self) -> int:
        """ELF ``e_machine``."""
        return self.info.machine

    @property
    def elf_class(self) -> int:
        """32 or 64: the ELF class and the pointer width in bits."""
        return self.info.elf_class

    @property
    def pointer_size(self) -> int:
        """Pointer width in bytes (4 or 8)."""
        return self.info.pointer_size

    @property
    def c_abi(self) -> tuple[int, int]:
        """(pointer size, 64-bit integer alignment): the key of struct layouts."""
        return self.pointer_size, self.int64_align

    @property
    def word_mask(self) -> int:
        return (1 << self.elf_class) - 1

    def __repr__(self):
        return f"<Arch {self.name}>"


def words(*insns: int) -> bytes:
    """Little-endian 32-bit instruction words as bytes."""
    return struct.pack("<%dI" % len(insns), *insns)


def reloc_table(rows: Mapping[int, tuple]) -> dict[int, Relocation]:
    """Build a relocation table from ``{type: (name, size, formula[, check])}``."""
    return {rtype: Relocation(*row) for rtype, row in rows.items()}
