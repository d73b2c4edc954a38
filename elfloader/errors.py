"""Error types raised by :mod:`elfloader`.

Every error derives from :class:`ElfError` (itself a
:class:`fatelf.PortableKernelError`, the project's one base class) and
carries the file name, the field that was checked and the offending value,
so a message reads like ``kernel.so: e_machine: 0x0028 is not a supported
architecture``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fatelf.errors import PortableKernelError

if TYPE_CHECKING:
    from .diagnose import FaultReport


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
        :class:`~elfloader.diagnose.FaultReport` of a fault in a loaded
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
