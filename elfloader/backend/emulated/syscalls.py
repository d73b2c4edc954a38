"""System calls made by guest code: a fault, on both engines.

A kernel or plugin runs bare metal: it has no operating system to call.
An instruction that enters the kernel (``svc``, ``ecall``, ``syscall``,
``int 0x80``, ``sysenter``) therefore ends the call with an
:class:`~elfloader.errors.EmulationError` whose ``fault.kind`` is
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
from ...errors import EmulationError, Fault


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


#: i386's direct socket system calls (Linux 4.3 and later), where
#: libseccomp's table answers with its multiplexed ``socketcall`` number.
_X86_SOCKET_CALLS = dict(zip(
    ("socket", "socketpair", "bind", "connect", "listen", "accept4",
     "getsockopt", "setsockopt", "getsockname", "getpeername", "sendto",
     "sendmsg", "recvfrom", "recvmsg", "shutdown"), range(359, 374)))


def number(table: str, called: str) -> int | None:
    """The number of system call ``called`` in libseccomp's table
    ``table``, or None."""
    try:
        import pyseccomp
        got = int(pyseccomp.resolve_syscall(
            getattr(pyseccomp.Arch, table.upper()), called))
    except Exception:  # noqa: BLE001 - no library, no table, no such call
        return None
    if got < 0 and table == "x86":
        return _X86_SOCKET_CALLS.get(called)
    return got if got >= 0 else None


def host_table() -> str | None:
    """libseccomp's name of this host's system-call table, or None."""
    import platform
    return {"x86_64": "x86_64", "amd64": "x86_64", "aarch64": "aarch64",
            "arm64": "aarch64", "riscv64": "riscv64"}.get(platform.machine().lower())


def start_of(arch: Arch, pc: int) -> int:
    """The address of the system-call instruction whose next instruction
    is at ``pc`` (bit 0 of an arm32 pc marks Thumb code and is kept)."""
    facts = arch.syscalls
    if facts.thumb_length is not None and pc & 1:
        return pc - facts.thumb_length
    return pc - facts.length


BARE_METAL = ("kernels and plugins run bare metal and may not call the "
              "operating system")


def fault(arch: Arch, number: int | None, pc: int | None, address: int,
          called: str | None = None, attempt: str | None = None,
          detail: str = BARE_METAL) -> EmulationError:
    """The error for a system call made by the instruction at ``pc``
    during a call of ``address``. Its :class:`~elfloader.errors.Fault`:
    ``kind`` ``"syscall"``, ``syscall`` the number (as the guest's register
    held it; None when unknown), ``syscall_name`` its name on ``arch``
    (``called``, else looked up; or None), ``pc`` the instruction's address
    (None when unknown), ``what`` the report's kind (``system call openat
    (56)``; with no number and no name, ``system call`` and ``attempt``,
    what the guest was doing). ``detail`` ends the message."""
    if number is not None:
        number &= arch.word_mask
        called = called or name(arch.syscalls.table, number)
    if number is None:
        what = f"system call {called or attempt or '(unknown)'}"
    elif called:
        what = f"system call {called} ({number})"
    else:
        what = f"system call {number} (no such call on {arch.name})"
    record = Fault("syscall", what, pc=pc, syscall=number, syscall_name=called)
    return EmulationError(record.message(address, detail), field="call",
                          value=address, fault=record)


__all__ = ["name", "number", "host_table", "start_of", "fault", "BARE_METAL"]
