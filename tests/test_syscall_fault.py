"""A system call made by guest code is a fault: the call ends with an
:class:`elfloader.EmulationError` whose ``fault`` is ``"syscall"``, with
the call's number and name and the address of the system-call instruction
itself, on all six architectures; the CPU stays usable. The report of a
dispatch or a direct import call keeps those facts and shows the
instruction."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import elfloader
from elfloader.backend.emulated import EmulatedBackend

from conftest import emulation_engines

SAMPLES = Path(__file__).resolve().parent.parent / "hal_cpu" / "samples"


def _le(*words: int) -> bytes:
    return b"".join(w.to_bytes(4, "little") for w in words)


def _engines() -> list:
    """unicorn, and qemu where installed."""
    return list(emulation_engines())


#: name -> (arch, code, offset of the system-call instruction, number, Thumb,
#: the instruction as the report prints it). Each loads socket's number (no
#: pointer arguments: qemu-user passes it to the host, whose filter refuses
#: it) into the number register, makes the call, then returns.
CASES = {
    # mov eax, 41; syscall; ret
    "x86_64-syscall": ("x86_64", bytes.fromhex("b829000000" "0f05" "c3"), 5,
                       41, False, "syscall"),
    # mov eax, 359; int 0x80; ret
    "x86_32-int80": ("x86_32", bytes.fromhex("b867010000" "cd80" "c3"), 5,
                     359, False, "int 0x80"),
    # mov eax, 359; sysenter; ret
    "x86_32-sysenter": ("x86_32", bytes.fromhex("b867010000" "0f34" "c3"), 5,
                        359, False, "sysenter"),
    # mov eax, 359; syscall (AMD's 32-bit entry); ret
    "x86_32-syscall": ("x86_32", bytes.fromhex("b867010000" "0f05" "c3"), 5,
                       359, False, "syscall"),
    # movz x8, #198; svc #0; ret
    "aarch64-svc": ("aarch64", _le(0xD28018C8, 0xD4000001, 0xD65F03C0), 4,
                    198, False, "svc #0"),
    # movw r7, #281; svc #0; bx lr
    "arm32-svc": ("arm32", _le(0xE3007119, 0xEF000000, 0xE12FFF1E), 4,
                  281, False, "svc #0"),
    # Thumb: movw r7, #281; svc #0; bx lr
    "arm32-thumb-svc": ("arm32", bytes.fromhex("40f21917" "00df" "7047"), 4,
                        281, True, "svc #0"),
    # li a7, 198; ecall; ret
    "riscv64-ecall": ("riscv64", _le(0x0C600893, 0x00000073, 0x00008067), 4,
                      198, False, "ecall"),
    "riscv32-ecall": ("riscv32", _le(0x0C600893, 0x00000073, 0x00008067), 4,
                      198, False, "ecall"),
}

#: Cases qemu-user 7.2 runs as other faults: i386 user mode has no
#: ``sysenter`` (general protection fault) and no ``syscall`` (invalid
#: instruction). Either way the call stops at the instruction.
QEMU_NOT_SYSCALLS = {"x86_32-sysenter": "general_protection",
                     "x86_32-syscall": "invalid_instruction"}

#: return 42
RET42 = {
    "x86_64": bytes.fromhex("b82a000000" "c3"),
    "x86_32": bytes.fromhex("b82a000000" "c3"),
    "aarch64": _le(0x52800540, 0xD65F03C0),
    "arm32": _le(0xE3A0002A, 0xE12FFF1E),
    "riscv64": _le(0x02A00513, 0x00008067),
    "riscv32": _le(0x02A00513, 0x00008067),
}


def _place(backend, case: str) -> tuple[int, int]:
    """(entry, address of the system-call instruction) of ``case``'s code
    placed in ``backend`` (bit 0 set on both for Thumb code)."""
    _, code, offset, _, thumb, _ = CASES[case]
    start = backend.place_code(code)
    bit = 1 if thumb else 0
    return start | bit, (start + offset) | bit


def _check(err: elfloader.EmulationError, case: str, at: int) -> None:
    _, _, _, number, _, _ = CASES[case]
    assert err.fault.kind == "syscall", str(err)
    assert err.fault.syscall == number
    assert err.fault.syscall_name == "socket"
    assert err.fault.pc == at, (hex(err.fault.pc), hex(at))
    assert err.fault.what == f"system call socket ({number})"
    assert "socket" in str(err)


@pytest.fixture(params=_engines())
def engine(request):
    return request.param


@pytest.mark.parametrize("case", list(CASES))
def test_system_call_is_a_fault(case, engine):
    backend = EmulatedBackend(elfloader.arch.by_name(CASES[case][0]),
                              engine=engine)
    try:
        entry, at = _place(backend, case)
        with pytest.raises(elfloader.EmulationError) as info:
            backend.call(entry, 1, 2, 3)
        if engine == "qemu" and case in QEMU_NOT_SYSCALLS:
            # qemu-user does not enter its system-call path for these: the
            # instruction faults where it stands, and nothing is called.
            assert info.value.fault.kind == QEMU_NOT_SYSCALLS[case]
            assert info.value.fault.pc == at
            return
        _check(info.value, case, at)
    finally:
        backend.close()


@pytest.mark.parametrize("case", ["x86_64-syscall", "x86_32-int80",
                                  "aarch64-svc", "arm32-thumb-svc",
                                  "riscv64-ecall"])
def test_cpu_is_usable_after_a_system_call(case, engine):
    """The same CPU runs calls after the fault, faults again at the same
    instruction, and a forked CPU faults the same way."""
    arch = CASES[case][0]
    backend = EmulatedBackend(elfloader.arch.by_name(arch), engine=engine)
    try:
        entry, at = _place(backend, case)
        ret42 = backend.place_code(RET42[arch])
        fork = backend.fork_cpu()
        for cpu in (backend, backend, fork):
            with pytest.raises(elfloader.EmulationError) as info:
                cpu.call(entry)
            _check(info.value, case, at)
            assert cpu.call(ret42) == 42
        fork.close()
    finally:
        backend.close()


def test_other_exceptions_are_not_system_calls():
    """Breakpoint instructions and x86 interrupts other than 0x80 stop the
    call as an unhandled CPU exception, not as a system call (the unicorn
    engine's interrupt hook sees them too)."""
    codes = {
        "x86_32": bytes.fromhex("cd21" "c3"),          # int 0x21
        "aarch64": _le(0xD4200000, 0xD65F03C0),        # brk #0
        "arm32": _le(0xE1200070, 0xE12FFF1E),          # bkpt #0
    }
    for arch, code in codes.items():
        backend = EmulatedBackend(elfloader.arch.by_name(arch),
                                  engine="unicorn")
        try:
            function = backend.place_code(code)
            with pytest.raises(elfloader.EmulationError) as info:
                backend.call(function)
            assert info.value.fault.kind == "exception", str(info.value)
            assert getattr(info.value, "syscall", None) is None
            assert backend.call(backend.place_code(RET42[arch])) == 42
        finally:
            backend.close()


# --- reports ----------------------------------------------------------------------
_REPORT_CASES = ["x86_64-syscall", "x86_32-int80", "aarch64-svc", "arm32-svc",
                 "arm32-thumb-svc", "riscv64-ecall", "riscv32-ecall"]


@pytest.mark.parametrize("case", _REPORT_CASES)
def test_dispatch_report_of_a_system_call(case, engine):
    """An export that makes a system call: the dispatch's error is the
    fault report (kind, pc, the instruction) and keeps the call's number
    and name."""
    import dataclasses

    from hal_cpu import Executable
    arch, _, _, number, thumb, insn = CASES[case]
    path = SAMPLES / f"sum_last_{arch}.so"
    with Executable(path, backend="emulated", engine=engine) as exe:
        entry, at = _place(exe.backend, case)
        e = exe.exports[0]
        bad = dataclasses.replace(e, address=entry)
        exe.exports[0] = bad
        exe._export_cache = {0: bad, bad.name: bad}
        with pytest.raises(elfloader.EmulationError) as info:
            exe.dispatch(0, (1, 1, 1), [np.ones((9, 129), np.float32),
                                        np.zeros(9, np.float32)])
    err = info.value
    text = str(err)
    first = text.splitlines()[0]
    assert first.startswith(f"{path}: {arch}: export {e.name}")
    assert f"system call socket ({number})" in first
    assert f"instruction:  {insn}" in text, text
    digits = 8 if arch in ("x86_32", "arm32", "riscv32") else 16
    bare = at & ~1 if thumb else at
    assert f"pc:           0x{bare:0{digits}x}" in text
    assert err.fault.kind == "syscall"
    assert err.fault.syscall == number and err.fault.syscall_name == "socket"
    assert err.fault.pc == at


@pytest.mark.parametrize("case", ["aarch64-svc", "arm32-thumb-svc",
                                  "x86_32-int80"])
def test_import_report_of_a_system_call(case, engine):
    from hal_cpu.faults import import_fault
    arch, _, _, number, thumb, insn = CASES[case]
    backend = EmulatedBackend(elfloader.arch.by_name(arch), engine=engine)
    try:
        entry, at = _place(backend, case)
        with pytest.raises(elfloader.EmulationError) as info:
            backend.call(entry)
        err = import_fault(info.value, backend, [], "plugin_import", None)
        text = str(err)
    finally:
        backend.close()
    assert f"import plugin_import: system call socket ({number})" in text
    assert f"instruction:  {insn}" in text, text
    assert err.fault.kind == "syscall"
    assert err.fault.syscall == number and err.fault.syscall_name == "socket"
    assert err.fault.pc == (at & ~1 if thumb else at)   # without the Thumb bit
