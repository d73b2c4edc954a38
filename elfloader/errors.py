"""Error types raised by :mod:`elfloader`.

Every error derives from :class:`ElfError` (itself a
:class:`fatelf.PortableKernelError`, the project's one base class) and
carries the file name, the field that was checked and the offending value,
so a message reads like ``kernel.so: e_machine: 0x0028 is not a supported
architecture``. :class:`FaultReport`, what is known about a fault in guest
code, is here too: an :class:`EmulationError` carries one (built by
:mod:`elfloader.diagnose`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from fatelf import arches as _arches
from fatelf.errors import PortableKernelError


class ElfError(PortableKernelError):
    """Base class of every error raised by :mod:`elfloader`.

    Attributes:
        name: the file (or ``<memory>``) the error is about.
        field: the ELF field or loader step that failed, e.g. ``e_machine``.
        value: the offending value, if any.
    """


class ElfFormatError(ElfError):
    """The bytes are not a well-formed ELF image (header, tables, ranges),
    or a FatELF bundle holding it is malformed."""


class UnsupportedElfError(ElfError):
    """A well-formed ELF that this loader does not handle (class, byte order,
    machine, type, dynamic tag), or an unknown architecture or backend name."""


class RelocationError(ElfError):
    """A relocation that cannot be applied (unknown type, place outside the
    image, bad symbol index, value that does not fit)."""


class SymbolNotFoundError(ElfError):
    """An exported symbol looked up by name is not in the dynamic symbol table."""


class UndefinedSymbolError(ElfError):
    """The image imports symbols: embedded ELFs must be self-contained."""


class BackendError(ElfError):
    """Memory or call failure inside a backend."""


class ArchitectureMismatchError(BackendError):
    """The image's architecture cannot run on the chosen backend (for the
    native backend: it is not the host architecture), or a FatELF bundle has
    no record for the architecture asked for."""


class EngineError(BackendError):
    """An emulation engine cannot run what was asked: qemu-user is missing,
    the engine does not model the CPU profile, the vector length is out of
    range, or the guest agent could not start.

    Attributes:
        signal: the signal that killed the guest agent, or None.
    """

    signal: int | None = None


class EmulationError(BackendError):
    """The emulated CPU stopped on a fault (invalid memory access, invalid
    instruction, time limit) while running guest code.

    Attributes (set by the emulated backend on CPU faults):
        fault: the kind, e.g. ``write_unmapped``, ``invalid_instruction``,
        ``timeout``, ``stopped``, ``agent_died``, ``syscall`` (the code made
        a system call: ``syscall`` holds its number, ``syscall_name`` its
        name or None), ``agent_protocol`` (the guest agent's reply broke
        the wire format); what: the same in words,
        with the page (or the exact address) when one was refused; pc: the
        faulting pc; fault_page: the page the refused access touched, or
        None; fault_address: the exact address of the first byte the
        refused access touched (the pc for a refused instruction fetch), or
        None when unknown; access_size: bytes of the refused read or write
        (its part on the refused page), or None; signal: the host signal
        the qemu engine's agent caught, or None; report: the
        :class:`FaultReport` of a fault in a loaded
        module's initializer or finalizer, or None.

    Each is None on an error that does not set it.
    """

    fault: str | None = None
    what: str | None = None
    pc: int | None = None
    fault_page: int | None = None
    fault_address: int | None = None
    access_size: int | None = None
    syscall: int | None = None
    syscall_name: str | None = None
    signal: int | None = None
    report: FaultReport | None = None


class GuardError(EmulationError):
    """Guest code changed the canary bytes between the end of a guarded
    range (an array from the emulated backend's ``map_array``, or memory
    from ``alloc_guarded``) and its guard page: it wrote past the end.

    Attributes:
        address: the range's guest address; size: its length in bytes;
        offset: offset from the range's start of the first changed byte
        (``size`` or more); last_offset: that of the last changed byte.
        ``fault`` is ``"overrun"``; ``pc`` is None (the write is seen
        after the call, not when it happens).
    """

    address: int
    size: int
    offset: int
    last_offset: int


@dataclass
class FaultReport:
    """What is known about one fault in guest code.

    Attributes:
        file: the image's file name (e.g. ``kernel.so``).
        arch: architecture name.
        kind: what failed, e.g. ``write to unmapped memory``.
        pc: address of the faulting instruction.
        function: export or import that was running, or None.
        function_kind: what ``function`` is: ``export``, ``import``,
            ``initializer``...
        workgroup: workgroup id ``(x, y, z)``, or None.
        symbol: ``name+0x1c`` of the pc (:meth:`Symbolizer.symbolize`), or None.
        source: ``file:line`` of the pc, or None.
        instruction: text of the instruction at the pc, or None.
        data_address: the address the failed access used, or None.
        data_description: where that address lies (:func:`describe_address`).
        note: a remark on the pc or the instruction, or None (e.g. that
            the CPU reported the pc after the instruction it refused).
        module: the image holding the pc (its file name), when it is not
            ``file``, e.g. a plugin called from an executable; or None.
        engine: the emulator that ran the code and its CPU model (e.g.
            ``qemu (sve, vector length 256 bits: ...)``), or None.
        caller: what called ``function``, e.g. ``export mul of k.so`` for
            an import a dispatch called; or None.
        source_note: why there is no ``source`` (e.g.
            :data:`NO_LINE_TABLE`), shown in the ``source`` row; or None.
    """

    file: str
    arch: str
    kind: str
    pc: int
    function: str | None = None
    function_kind: str = "export"
    workgroup: tuple[int, int, int] | None = None
    symbol: str | None = None
    source: str | None = None
    instruction: str | None = None
    data_address: int | None = None
    data_description: str | None = None
    note: str | None = None
    module: str | None = None
    caller: str | None = None
    engine: str | None = None
    source_note: str | None = None

    def summary(self, word_size: int) -> str:
        """The report's first line (see :meth:`format`).

        Raises:
            ValueError: ``word_size`` (bytes) is neither 4 nor 8.
        """
        fmt = _address_format(word_size)
        where = []
        if self.function:
            called = f" (called from {self.caller})" if self.caller else ""
            where.append(f"{self.function_kind} {self.function}".strip() + called)
        if self.workgroup is not None:
            ids = ", ".join(str(int(c)) for c in self.workgroup)
            where.append(f"workgroup ({ids})")
        head = [self.file, self.arch] + ([", ".join(where)] if where else [])
        at = (fmt(self.data_address) if self.data_address is not None
              else f"pc {fmt(self.pc)}")
        return ": ".join(head + [f"{self.kind} at {at}"])

    def format(self, word_size: int) -> str:
        """The report as text: a one-line summary, then the ``pc`` (with its
        symbol), ``instruction``, ``data address`` (with its description;
        left out when there is none) and ``source`` lines.

        Args:
            word_size: the guest's pointer size in bytes, 4 or 8; addresses
                print as ``0x%08x`` or ``0x%016x``, reduced modulo
                ``2**(8 * word_size)``.

        Raises:
            ValueError: ``word_size`` is neither 4 nor 8.
        """
        fmt = _address_format(word_size)
        lines = [self.summary(word_size)]

        def row(label: str, text: str) -> None:
            lines.append(f"  {label + ':':<14}{text}")

        where = self.symbol or "(no symbol)"
        if self.module:
            where += f" in {self.module}"
        row("pc", f"{fmt(self.pc)} {where}")
        row("instruction", self.instruction or "(unreadable)")
        if self.note:
            row("note", self.note)
        if self.data_address is not None:
            desc = self.data_description
            row("data address", fmt(self.data_address) + (f" ({desc})" if desc else ""))
        row("source", self.source or "(no line information"
            + (f": {self.source_note}" if self.source_note else "") + ")")
        if self.engine:
            row("emulator", self.engine)
        return "\n".join(lines)

    def __str__(self) -> str:
        try:
            word = _arches.lookup(self.arch).pointer_size
        except Exception:  # noqa: BLE001 - unknown name: widest addresses
            word = 8
        return self.format(word)


def _address_format(word_size: int) -> Callable[[int], str]:
    if word_size not in (4, 8):
        raise ValueError(f"word size {word_size!r} is not 4 or 8 bytes")
    mask = (1 << (8 * word_size)) - 1
    digits = 2 * word_size
    return lambda a: f"0x{int(a) & mask:0{digits}x}"
