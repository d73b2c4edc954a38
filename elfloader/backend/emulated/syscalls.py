"""System calls made by guest code: a fault, on both engines.

A kernel or plugin runs bare metal: it has no operating system to call.
An instruction that enters the kernel (``svc``, ``ecall``, ``syscall``,
``int 0x80``, ``sysenter``) therefore ends the call with an
:class:`~elfloader.errors.EmulationError` whose ``fault`` is
``"syscall"``, the same way a bad memory access does. The unicorn engine
stops at the instruction itself; the qemu engine's system-call filter
refuses the call and the guest agent reports it (see
:mod:`.sandbox`).

Names come from libseccomp's system-call tables (through ``pyseccomp``),
for the architecture :attr:`elfloader.arch.Arch.syscalls` names.
"""

from __future__ import annotations

import functools

from ...arch import Arch
from ...errors import EmulationError


@functools.lru_cache(maxsize=None)
def name(table: str, number: int) -> str | None:
    """The name of system call ``number`` in libseccomp's table ``table``
    (e.g. ``"aarch64"``), or None when it has none or libseccomp is
    missing."""
    try:
        import pyseccomp
        token = getattr(pyseccomp.Arch, table.upper())
        got = pyseccomp.resolve_syscall(token, int(number))
    except Exception:  # noqa: BLE001 - no library, no table, no such call
        return None
    return got.decode() if isinstance(got, bytes) else str(got)


def start_of(arch: Arch, pc: int) -> int:
    """The address of the system-call instruction whose next instruction
    is at ``pc`` (bit 0 of an arm32 pc marks Thumb code and is kept)."""
    facts = arch.syscalls
    if facts.thumb_length is not None and pc & 1:
        return pc - facts.thumb_length
    return pc - facts.length


def fault(arch: Arch, number: int, pc: int, address: int) -> EmulationError:
    """The error for a system call made by the instruction at ``pc``
    during a call of ``address``: ``fault`` ``"syscall"``, ``syscall``
    the number (as the guest's register held it), ``syscall_name`` its
    name on ``arch`` (or None), ``pc`` the instruction's address, ``what``
    the report's kind (``system call openat (56)``)."""
    number &= arch.word_mask
    called = name(arch.syscalls.table, number)
    what = (f"system call {called} ({number})" if called
            else f"system call {number} (no such call on {arch.name})")
    err = EmulationError(f"{what} at pc={pc:#x} while calling {address:#x}: "
                         "kernels and plugins run bare metal and may not "
                         "call the operating system", field="call",
                         value=address)
    err.fault, err.what, err.pc = "syscall", what, pc
    err.syscall, err.syscall_name = number, called
    err.fault_page = err.fault_address = err.access_size = None
    return err


__all__ = ["name", "start_of", "fault"]
