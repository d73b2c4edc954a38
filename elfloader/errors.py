"""Error types raised by :mod:`elfloader`.

Every error derives from :class:`ElfError` (itself a
:class:`fatelf.PortableKernelError`, the project's one base class) and
carries the file name, the field that was checked and the offending value,
so a message reads like ``kernel.so: e_machine: 0x0028 is not a supported
architecture``. :class:`Fault`, what an emulation engine knows when the
CPU stops a call, and :class:`FaultReport`, what is known about a fault in
a loaded module, are here too: an :class:`EmulationError` carries both
(the report built by :mod:`elfloader.diagnose`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, TypeVar

from fatelf import arches as _arches
from fatelf.errors import PortableKernelError
from fatelf.text import one_line


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

    Args:
        message, name, field, value: as :class:`ElfError`.
        signal: the signal that killed the guest agent, or None.

    Attributes:
        signal: as given.
    """

    def __init__(self, message: str = "", *, signal: int | None = None,
                 **kw) -> None:
        super().__init__(message, **kw)
        self.signal = signal


#: Kinds of :class:`Fault` whose message is a stop line (``call of 0x...
#: stopped ...``) rather than a fault line.
_STOPS = frozenset({"timeout", "stopped"})
#: Kinds whose message is the words alone: the agent's own failure.
_AGENT = frozenset({"agent_died", "agent_protocol", "emulator_aborted"})


@dataclass(frozen=True)
class Fault:
    """Why the emulated CPU stopped a call of guest code: the facts an
    engine knows at the moment it stops, carried by :class:`EmulationError`
    as its ``fault``.

    Every field but ``kind`` is None when the engine does not know it (or
    it does not apply to the kind: a time limit has no data address).
    Addresses are guest addresses (integers below ``2**(8 * word size)``).

    Attributes:
        kind: what happened, one word: ``read_unmapped``,
            ``write_unmapped``, ``fetch_unmapped``, ``read_protected``,
            ``write_protected``, ``fetch_protected``, ``access_unmapped``
            and ``access_protected`` (a refused access of unknown
            direction), ``read_unaligned``, ``write_unaligned``,
            ``invalid_instruction``, ``exception`` (a CPU exception unicorn
            does not name), ``general_protection`` (x86 #GP, no address),
            ``arithmetic``, ``bus_error``, ``trap``, ``signal`` (another
            host signal the qemu engine's agent caught), ``syscall`` (the
            code made a system call), ``timeout`` (stopped at the call's
            time limit), ``stopped`` (stopped by request),
            ``agent_died`` (the qemu engine's guest agent died or could not
            start), ``emulator_aborted`` (qemu-user itself stopped: an
            assertion of its own failed on the guest's state),
            ``memory_limit`` (the agent's private memory passed the
            sandbox's bound and the agent was ended), ``agent_protocol``
            (its reply broke the wire format),
            ``overrun`` (canary bytes after a guarded range changed: seen
            after the call, not when the write happened), ``error`` (any
            other engine failure).
        what: the same in words, as the error's message and a fault
            report say it, with what the engine adds (the page's
            protection, the access size, the system call's name); None
            when there are no words for it.
        access: ``read``, ``write`` or ``fetch`` (an instruction fetch):
            the direction of the refused access, or None (not an access,
            or its direction is unknown).
        pc: the address of the faulting instruction (arm32 Thumb code
            keeps bit 0 set, as the CPU reported it), or None.
        address: the exact address of the first byte the refused access
            touched (the pc for a refused instruction fetch; for
            ``overrun``, the first changed canary byte), or None.
        page: the address of the page the refused access touched, or None.
        protection: that page's protection (``PROT_*`` bits; 0: no
            access), or None when the page is unmapped or unknown.
        size: bytes of the refused read or write (its part on the refused
            page), or None (qemu: a signal does not say).
        signal: the host signal the qemu engine's guest agent caught
            (e.g. 11 for ``SIGSEGV``), or None.
        syscall: for ``syscall``, the number the guest's number register
            held (None when unknown); else None.
        syscall_name: for ``syscall``, its name on the guest's
            architecture, or None.
    """

    kind: str
    what: str | None = None
    access: str | None = None
    pc: int | None = None
    address: int | None = None
    page: int | None = None
    protection: int | None = None
    size: int | None = None
    signal: int | None = None
    syscall: int | None = None
    syscall_name: str | None = None

    @property
    def data_address(self) -> int | None:
        """The exact address of the refused access, else its page, else
        None: what a fault report describes."""
        return self.address if self.address is not None else self.page

    def message(self, call: int, detail: str | None = None) -> str:
        """The message of the error for this fault in a call of guest
        address ``call``.

        A stop (``timeout``, ``stopped``) reads ``call of 0x1000 stopped at
        pc=0x1008 after the 2 s time limit``; an agent's failure is
        ``what`` alone; any other fault reads ``write to unmapped memory
        at 0x2000, at pc=0x1008 while calling 0x1000`` (the exact address
        left out when unknown or when it is the pc of a fetch, the pc when
        unknown), followed by ``: detail`` when ``detail`` is given.
        """
        pc = f" at pc={self.pc:#x}" if self.pc is not None else ""
        if self.kind in _STOPS:
            return f"call of {call:#x} stopped{pc}{(self.what or '')[7:]}"
        if self.kind in _AGENT:
            return self.what or ""
        at = ("" if self.address is None or self.kind.startswith("fetch")
              else f" at {self.address:#x},")
        text = f"{self.what}{at}{pc} while calling {call:#x}"
        return f"{text}: {detail}" if detail is not None else text


#: ``what`` of an ``overrun`` fault.
OVERRUN = "write outside a guarded range (canary bytes changed)"

_E = TypeVar("_E", bound="EmulationError")


class EmulationError(BackendError):
    """The emulated CPU stopped on a fault (invalid memory access, invalid
    instruction, time limit) while running guest code.

    Args:
        message, name, field, value: as :class:`ElfError`.
        fault: the :class:`Fault`, or None (an error raised for another
            reason, e.g. by a Python callback).
        report: the :class:`FaultReport` of the fault, when the error is
            about a loaded module (an initializer or finalizer, a
            dispatch, an import called), or None.
        worker: the worker (CPU) of a dispatch whose call faulted, or None.
        whole_message: ``message`` is the whole text of the error (a fault
            report), with no ``name: field:`` before it.

    Attributes:
        fault, report, worker: as given.
    """

    def __init__(self, message: str = "", *, fault: Fault | None = None,
                 report: FaultReport | None = None, worker: int | None = None,
                 whole_message: bool = False, **kw) -> None:
        super().__init__(message, **kw)
        self.fault = fault
        self.report = report
        self.worker = worker
        if whole_message:
            self.args = (message,)

    def on_worker(self: _E, worker: int) -> _E:
        """This error as raised on ``worker`` of a dispatch: a copy of the
        same type, message and traceback whose ``worker`` is ``worker``
        (the report reads that worker's workgroup state)."""
        err = type(self).__new__(type(self), *self.args)
        err.__dict__.update(self.__dict__, worker=worker)
        return err.with_traceback(self.__traceback__)

    def __reduce__(self):
        # Subclasses take keyword-only arguments: rebuild without calling
        # their constructors.
        return _rebuilt, (type(self), self.args, self.__dict__)


def _rebuilt(cls: type, args: tuple, state: dict) -> BaseException:
    err = cls.__new__(cls, *args)
    err.__dict__.update(state)
    return err


class GuardError(EmulationError):
    """Guest code changed the canary bytes between the end of a guarded
    range (an array from the emulated backend's ``map_array``, or memory
    from ``alloc_guarded``) and its guard page: it wrote past the end.

    Args:
        message, name, field, value: as :class:`EmulationError`.
        address: the range's guest address; size: its length in bytes;
        offset: offset from the range's start of the first changed byte
            (``size`` or more); last_offset: that of the last changed byte.

    Attributes:
        address, size, offset, last_offset: as given.
        fault: ``kind`` ``"overrun"``, ``access`` ``"write"``, ``address``
            the first changed byte; the pc is None (the write is seen
            after the call, not when it happens).
    """

    def __init__(self, message: str = "", *, address: int, size: int,
                 offset: int, last_offset: int, **kw) -> None:
        super().__init__(message, fault=Fault(
            "overrun", OVERRUN, access="write", address=address + offset),
            **kw)
        self.address, self.size = address, size
        self.offset, self.last_offset = offset, last_offset


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
        overrun: how far the access reached past the memory the data
            address lies by, in that memory's terms (the pytest fixtures:
            elements of a test array), shown after the data address; or
            None.
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
    overrun: str | None = None

    def summary(self, word_size: int) -> str:
        """The report's first line (see :meth:`format`).

        Raises:
            ValueError: ``word_size`` (bytes) is neither 4 nor 8.
        """
        fmt = _address_format(word_size)
        where = []
        if self.function:
            called = (f" (called from {one_line(self.caller, 300)})"
                      if self.caller else "")
            where.append(f"{self.function_kind} {one_line(self.function, 200)}"
                         .strip() + called)
        if self.workgroup is not None:
            ids = ", ".join(str(int(c)) for c in self.workgroup)
            where.append(f"workgroup ({ids})")
        head = ([one_line(self.file, 300), self.arch]
                + ([", ".join(where)] if where else []))
        at = (fmt(self.data_address) if self.data_address is not None
              else f"pc {fmt(self.pc)}")
        return ": ".join(head + [f"{one_line(self.kind)} at {at}"])

    def format(self, word_size: int) -> str:
        """The report as text: a one-line summary, then the ``pc`` (with its
        symbol), ``instruction``, ``data address`` (with its description;
        left out when there is none), ``overrun`` (when set) and ``source``
        lines.

        Args:
            word_size: the guest's pointer size in bytes, 4 or 8; addresses
                print as ``0x%08x`` or ``0x%016x``, reduced modulo
                ``2**(8 * word_size)``.

        Raises:
            ValueError: ``word_size`` is neither 4 nor 8.
        """
        fmt = _address_format(word_size)
        lines = [self.summary(word_size)]
        # Names (file, function, symbol, module, source file, what a data
        # address lies in) are the file's or the program's text: each shown
        # on its row, escaped (fatelf.text.one_line).

        def row(label: str, text: str) -> None:
            # each row one line, whatever the file's names hold
            lines.append(f"  {label + ':':<14}{one_line(text, 600)}")

        where = one_line(self.symbol, 200) or "(no symbol)"
        if self.module:
            where += f" in {one_line(self.module, 200)}"
        row("pc", f"{fmt(self.pc)} {where}")
        row("instruction", self.instruction or "(unreadable)")
        if self.note:
            row("note", self.note)
        if self.data_address is not None:
            desc = self.data_description
            row("data address", fmt(self.data_address) + (f" ({desc})" if desc else ""))
        if self.overrun:
            row("overrun", self.overrun)
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
