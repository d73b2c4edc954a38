"""What an architecture module provides: every per-architecture fact above
the architecture table, as data.

Each module in :mod:`elfloader.arch` builds one :class:`Arch` from the
project's architecture table (:mod:`fatelf.arches`: its identity and CPU
profiles) plus:

* the facts of its psABI that the loader and the backends need: its table
  of relocation types, its C calling convention for integer and pointer
  arguments, the machine code of IREE's import thunk;
* how a disassembler reads its machine code (:class:`Disassembly`) and how
  its Linux system calls are made (:class:`SystemCalls`), for fault
  reports;
* how the emulators run it: qemu-user (:class:`QemuUser`: program, most
  capable ``-cpu`` model, fetch-fault branches, arena) and unicorn
  (:class:`UnicornModel`: constant *names*, so that this package never
  imports unicorn; :mod:`elfloader.backend.emulated.unicorn_arch` looks them
  up);
* what is built for it (:class:`BuildTargets`): the qemu engine's guest
  agent, the 32-bit libm objects, the vector sample plugin.

The loader, the backends and the build scripts only read these records
(the per-architecture tables they export, such as
``elfloader.backend.emulated.choice.QEMU``, are derived from them); they
never branch on the architecture.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

from fatelf import arches
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


#: Guest addresses ``(start, end)`` of the arena the qemu engine's agent
#: maps for a 64-bit guest: above the agent's image, below 2 GiB (32-bit
#: absolute relocations fit).
ARENA_64 = (0x1000_0000, 0x7000_0000)
#: The same for a 32-bit guest: also above the stack qemu-user places below
#: 0x4080_0000.
ARENA_32 = (0x4800_0000, 0x8000_0000)


@dataclass(frozen=True)
class QemuUser:
    """What qemu-user runs an architecture's code with.

    Attributes:
        program: qemu-user's program name, e.g. ``qemu-i386``.
        arena: guest addresses ``(start, end)`` of the arena the agent maps
            (:data:`ARENA_64`, :data:`ARENA_32`).
        vector_profile: ``(architecture, profile)`` in
            :data:`fatelf.arches.PROFILES` whose scalable vectors the most
            capable model has: its vector lengths (default first) are the
            model's, and without :attr:`model` its ``-cpu`` option is the
            model's; None: no scalable vectors.
        model: ``-cpu`` option of the most capable model, ``{vlen}``,
            ``{vq}`` and ``{vlenb}`` standing for the vector length; None:
            the vector profile's option followed by :attr:`extra` (``max``
            without a vector profile).
        extra: ``-cpu`` properties added to the vector profile's option.
        branches: mnemonic starts of the calls, jumps and returns at whose
            pc qemu-user reports a fault fetching their target (real CPUs
            and unicorn: at the target); empty: at the target.
    """

    program: str
    arena: tuple[int, int]
    vector_profile: tuple[str, str] | None = None
    model: str | None = None
    extra: str = ""
    branches: tuple[str, ...] = ()

    @property
    def vlens(self) -> tuple[int, ...]:
        """Vector lengths in bits of the most capable model (its default
        first); empty without scalable vectors."""
        if self.vector_profile is None:
            return ()
        return arches.profile(*self.vector_profile).vlens

    @property
    def max_model(self) -> str:
        """``-cpu`` option of the most capable model (see :attr:`model`)."""
        if self.model is not None:
            return self.model
        if self.vector_profile is None:
            return "max"
        return arches.profile(*self.vector_profile).qemu_cpu + self.extra


#: QEMU's ``EXCP_SWI`` (target/arm/cpu.h): the interrupt number unicorn's
#: Arm and AArch64 CPUs report for ``svc``.
UC_ARM_EXCP_SWI = 2


@dataclass(frozen=True)
class UnicornModel:
    """How unicorn models an architecture's CPU, by the names of unicorn's
    constants (measured on unicorn 2.1); the unicorn engine's
    ``unicorn_arch.MODELS`` turns them into unicorn's values.

    Attributes:
        arch, mode: ``UC_ARCH_*`` and ``UC_MODE_*`` names
            (``unicorn.unicorn_const``).
        constants: unicorn's module of this architecture's register, CPU
            and instruction constants (``x86_const``, ``arm64_const``...).
        prefix: prefix of its register constants (``UC_X86_REG_``): a psABI
            register name, upper case, follows it.
        cpu: ``UC_CPU_*`` model name in :attr:`constants`, or None for
            unicorn's default.
        init: name of the setup ``unicorn_arch.INITS`` runs on a fresh CPU
            before compiled code runs (enabling FP/SIMD units that reset
            disabled, the x86_32 translation workaround), or None.
        page_size: the CPU's page size in bytes, set before it starts
            (unicorn's Arm CPUs default to 1 KiB pages: four times the TLB
            fills of 4 KiB ones), or None for unicorn's default.
        syscall_insns: ``UC_X86_INS_*`` names (in :attr:`constants`) of the
            system-call instructions hooked with ``UC_HOOK_INSN``; in the
            hook the pc is the instruction's own address.
        syscall_intnos: interrupt numbers ``UC_HOOK_INTR`` reports for a
            system call (``int 0x80``: 0x80; ``svc``:
            :data:`UC_ARM_EXCP_SWI`; ``ecall``: its exception cause); in
            the hook the pc is the next instruction's.
        thumb: ``(register, bit)`` set in Thumb state (arm32: ``cpsr`` T),
            the state a pc's bit 0 marks; None elsewhere.
    """

    arch: str
    mode: str
    constants: str
    prefix: str
    cpu: str | None = None
    init: str | None = None
    page_size: int | None = None
    syscall_insns: tuple[str, ...] = ()
    syscall_intnos: tuple[int, ...] = ()
    thumb: tuple[str, int] | None = None


@dataclass(frozen=True)
class BuildTargets:
    """What the project builds for an architecture beyond its identity's
    freestanding zig target (:attr:`fatelf.arches.ArchInfo.zig_flags`).

    Attributes:
        agent: ``python -m ziglang cc`` flags building the qemu engine's
            guest agent (``agent.c``), a static Linux program (musl): the
            architecture's oldest CPU the engine offers, so one agent runs
            under every profile.
        vector_profile: the :data:`fatelf.arches.PROFILES` name of this
            architecture that ``sample_plugins/vector.sos`` is built for.
        libm: zig flags building ``hal_cpu/runtime/libm.c`` for executables
            of this architecture (the least capable CPU, so one object
            serves every profile); empty: its executables do not link it.
    """

    agent: tuple[str, ...]
    vector_profile: str
    libm: tuple[str, ...] = ()


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
        qemu: how qemu-user runs it (the qemu engine).
        unicorn: how unicorn models its CPU (the unicorn engine).
        builds: the agent, libm and vector-plugin builds for it.
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
    qemu: QemuUser
    unicorn: UnicornModel
    builds: BuildTargets
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
