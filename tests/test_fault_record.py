"""The fault record (elfloader.Fault) and the errors that carry it: the
messages the engines build from it, the constructors' arguments, copies
for a dispatch's worker and pickling. No guest code runs here."""

from __future__ import annotations

import pickle

import pytest

import elfloader
from elfloader import EmulationError, EngineError, Fault, GuardError
from elfloader.diagnose import data_address
from elfloader.errors import OVERRUN, FaultReport
from hal_cpu.errors import (
    BindingOverrunError,
    CallTimeoutError,
    LocalMemoryOverrunError,
)


@pytest.mark.parametrize("fault,detail,message", [
    # a refused access, its exact address known (unicorn trap page, qemu)
    (Fault("write_unmapped", "write to unmapped memory (4 bytes)",
           access="write", pc=0x1008, address=0x2004, page=0x2000, size=4),
     None, "write to unmapped memory (4 bytes) at 0x2004, at pc=0x1008 "
           "while calling 0x1000"),
    # only the page known: no address before the pc
    (Fault("read_protected", "read from unreadable memory (page 0x2000, ---)",
           access="read", pc=0x1008, page=0x2000, protection=0),
     None, "read from unreadable memory (page 0x2000, ---) at pc=0x1008 "
           "while calling 0x1000"),
    # a fetch: its address is the pc, said once
    (Fault("fetch_unmapped", "instruction fetch from unmapped memory",
           access="fetch", pc=0x3000, address=0x3000, page=0x3000),
     None, "instruction fetch from unmapped memory at pc=0x3000 while "
           "calling 0x1000"),
    (Fault("invalid_instruction", "invalid instruction", pc=0x1010,
           signal=4),
     None, "invalid instruction at pc=0x1010 while calling 0x1000"),
    # system calls: with and without a pc, the detail after a colon
    (Fault("syscall", "system call openat (56)", pc=0x1004, syscall=56,
           syscall_name="openat"),
     "bare metal", "system call openat (56) at pc=0x1004 while calling "
                   "0x1000: bare metal"),
    (Fault("syscall", "system call creating a process"),
     "ended", "system call creating a process while calling 0x1000: ended"),
    # stops: the call first, then where it stopped
    (Fault("timeout", "stopped after the 2 s time limit", pc=0x1008),
     None, "call of 0x1000 stopped at pc=0x1008 after the 2 s time limit"),
    (Fault("stopped", "stopped by request"), None,
     "call of 0x1000 stopped by request"),
    (Fault("stopped", "stopped", pc=0x1008), None,
     "call of 0x1000 stopped at pc=0x1008"),
    # the agent's own failure: its words alone
    (Fault("agent_died", "the x86_64 guest agent died (exit status 1)"),
     None, "the x86_64 guest agent died (exit status 1)"),
])
def test_message(fault, detail, message):
    assert fault.message(0x1000, detail) == message


def test_the_record_is_frozen_and_says_where_the_data_was():
    fault = Fault("read_unmapped", page=0x2000)
    with pytest.raises(AttributeError):
        fault.pc = 1  # type: ignore[misc]
    assert fault.data_address == 0x2000
    assert Fault("read_unmapped", address=0x2004, page=0x2000).data_address == 0x2004
    assert Fault("timeout").data_address is None
    err = EmulationError("x", fault=Fault("write_unmapped", address=8))
    assert data_address(err) == 8
    assert data_address(ValueError()) is None
    assert data_address(EmulationError("no fault")) is None


def test_constructors_take_the_fault_report_and_worker():
    fault = Fault("write_unmapped", "write to unmapped memory", pc=4)
    report = FaultReport(file="k.so", arch="riscv64", kind="write", pc=4)
    err = EmulationError("the report", name="k.so", field="dispatch",
                         fault=fault, report=report, worker=2,
                         whole_message=True)
    assert (err.fault, err.report, err.worker) == (fault, report, 2)
    assert str(err) == "the report" and err.name == "k.so"
    plain = EmulationError("refused", name="k.so", field="call")
    assert str(plain) == "k.so: call: refused"
    assert (plain.fault, plain.report, plain.worker) == (None, None, None)
    assert EngineError("died", signal=9).signal == 9
    assert EngineError("missing").signal is None


def test_guard_error_knows_its_overrun():
    err = GuardError("wrote past", field="binding", value=0x1000,
                     address=0x1000, size=10, offset=12, last_offset=13)
    assert (err.address, err.size, err.offset, err.last_offset) == (
        0x1000, 10, 12, 13)
    assert err.fault == Fault("overrun", OVERRUN, access="write",
                              address=0x100C)


def test_hal_cpu_errors_carry_the_record():
    timeout = CallTimeoutError("late", seconds=2.0, name="p.so",
                               field="timeout", value=2.0)
    assert timeout.fault == Fault("timeout") and timeout.report is None
    at = Fault("timeout", "stopped after the 2 s time limit", pc=0x40)
    assert CallTimeoutError("late", seconds=2.0, fault=at).fault is at
    local = LocalMemoryOverrunError("past", worker=3, what="local memory",
                                    offset=4096, length=4096)
    assert local.worker == 3 and local.what == "local memory"
    fault = Fault("write_unmapped", "write to unmapped memory", pc=4,
                  address=0x5000)
    binding = BindingOverrunError("report", binding=None, what="binding 0",
                                  fault=fault, worker=1, whole_message=True,
                                  name="k.so", field="bindings")
    assert (binding.fault, binding.worker, binding.binding) == (fault, 1, None)
    assert str(binding) == "report" and binding.what == "binding 0"


def test_a_copy_for_a_worker():
    try:
        raise CallTimeoutError("late", seconds=1.0, name="k.so",
                               field="timeout")
    except CallTimeoutError as exc:
        original = exc
    copy = original.on_worker(3)
    assert type(copy) is CallTimeoutError and copy is not original
    assert (copy.worker, original.worker) == (3, None)
    assert str(copy) == str(original) and copy.seconds == 1.0
    assert copy.fault is original.fault
    assert copy.__traceback__ is original.__traceback__


@pytest.mark.parametrize("err", [
    EmulationError("refused", name="k.so", field="call", value=1,
                   fault=Fault("syscall", "system call 1", syscall=1)),
    GuardError("wrote past", address=0x1000, size=10, offset=12,
               last_offset=12),
    CallTimeoutError("late", seconds=2.0, name="k.so", field="timeout"),
    EngineError("died", signal=9),
], ids=["emulation", "guard", "timeout", "engine"])
def test_pickled(err):
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is type(err) and str(back) == str(err)
    assert back.__dict__ == err.__dict__


def test_exported():
    assert elfloader.Fault is Fault and "Fault" in elfloader.__all__
