"""The qemu engine's own promises: the agent's life (death, restart, stop,
time limit), callbacks, fresh code on reused pages, parallel CPUs."""

from __future__ import annotations

import os
import signal
import struct
import threading
import time

import pytest

import elfloader
from elfloader.backend.emulated import EmulatedBackend, qemu_program

pytestmark = pytest.mark.skipif(
    qemu_program("aarch64") is None and os.environ.get("CI") != "true",
    reason="qemu-user is not installed")

ADD = struct.pack("<II", 0x8B010000, 0xD65F03C0)          # x0 += x1; ret
SUB = struct.pack("<II", 0xCB010000, 0xD65F03C0)          # x0 -= x1; ret
SPIN = struct.pack("<I", 0x14000000)                      # b .
CALL_X2 = struct.pack("<IIII", 0xA9BF7BFD, 0xD63F0040,    # stp x29, x30; blr x2
                      0xA8C17BFD, 0xD65F03C0)             # ldp x29, x30; ret


@pytest.fixture
def be():
    backend = EmulatedBackend(elfloader.arch.by_name("aarch64"), engine="qemu")
    yield backend
    backend.close()


def agent_pids(backend):
    return [c._agent.pid for c in backend.state.cpus if c._agent is not None]


def test_a_dead_agent_is_a_typed_error_and_the_next_call_restarts_it(be):
    spin, add = be.place_code(SPIN), be.place_code(ADD)
    data = be.alloc(64)
    be.write(data, b"kept across the restart")
    pid = agent_pids(be)[0]
    threading.Timer(0.3, os.kill, (pid, signal.SIGKILL)).start()
    with pytest.raises(elfloader.EmulationError) as info:
        be.call(spin)
    assert info.value.fault.kind == "agent_died"
    assert "died (killed by signal 9)" in str(info.value)
    assert be.call(add, 40, 2) == 42                    # a new agent
    assert agent_pids(be)[0] != pid
    assert be.read(data, 23) == b"kept across the restart"


def test_time_limit_stops_the_call_and_the_engine_goes_on(be):
    spin, add = be.place_code(SPIN), be.place_code(ADD)
    be.timeout_us = 200_000
    start = time.monotonic()
    with pytest.raises(elfloader.EmulationError) as info:
        be.call(spin)
    assert time.monotonic() - start < 5
    err = info.value
    assert err.fault.kind == "timeout" and err.fault.pc == spin
    assert "after the 0.2 s time limit" in str(err)
    be.timeout_us = 0
    assert be.call(add, 1, 2) == 3


def test_stop_from_another_thread(be):
    spin = be.place_code(SPIN)
    threading.Timer(0.3, be.stop_workers, (1,)).start()
    with pytest.raises(elfloader.EmulationError) as info:
        be.call(spin)
    assert info.value.fault.kind == "stopped" and info.value.fault.pc == spin


def test_callbacks_and_their_errors(be):
    call_x2 = be.place_code(CALL_X2)
    seen = []

    def host(a, b):
        seen.append((a, b))
        return a * 10 + b
    fn = be.callback(host, 2)
    assert be.call(call_x2, 4, 2, fn) == 42 and seen == [(4, 2)]

    def fails(a, b):
        raise ValueError("from the host")
    bad = be.callback(fails, 2)
    with pytest.raises(ValueError, match="from the host"):
        be.call(call_x2, 1, 2, bad)
    assert be.call(call_x2, 5, 3, fn) == 53            # still usable


def test_new_code_on_a_page_that_ran_code(be):
    """qemu-user keeps translations of pages the host rewrites; a page
    that ran code and is released, then reused for other code, runs the
    new code."""
    add = be.place_code(ADD)
    assert be.call(add, 10, 3) == 13
    be.release(add)
    sub = be.place_code(SUB)
    assert sub == add                                  # the same page again
    assert be.call(sub, 10, 3) == 7
    # Code written over code in place (a debugger's write) runs too.
    be.write(sub, ADD)
    assert be.call(sub, 10, 3) == 13


def test_cpus_run_calls_at_the_same_time(be):
    """Two CPUs (two agent processes) are inside their calls at once: each
    call reaches a host callback that waits for the other's."""
    call_x2 = be.place_code(CALL_X2)
    barrier = threading.Barrier(2, timeout=20)

    def meet(a, b):
        barrier.wait()
        return a + b
    fn = be.callback(meet, 2)
    cpus = be.cpus(2)
    assert len(set(agent_pids(be))) == 2
    results = {}
    threads = [threading.Thread(target=lambda i=i, c=c: results.__setitem__(
        i, c.call(call_x2, i, 100, fn))) for i, c in enumerate(cpus)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == {0: 100, 1: 101}


def test_guard_page_fault_is_exact(be):
    """A read one byte past an array reaches the guard page: the report
    has the exact address (a real PROT_NONE page under qemu-user)."""
    load_byte = be.place_code(struct.pack("<II", 0x39400000, 0xD65F03C0))  # ldrb w0, [x0]
    import numpy as np
    array = np.arange(4096, dtype=np.uint8)
    address, finish = be.map_array(array)
    assert be.call(load_byte, address + 4095) == 255
    with pytest.raises(elfloader.EmulationError) as info:
        be.call(load_byte, address + 4096)
    assert info.value.fault.address == address + 4096
    assert be.guard_page(address + 4096) is not None
    finish()


def test_missing_qemu_is_a_typed_error(monkeypatch):
    monkeypatch.setenv("PKR_QEMU_DIR", "/nonexistent")
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(elfloader.EngineError, match="apt-get install qemu-user"):
        EmulatedBackend(elfloader.arch.by_name("riscv64"), engine="qemu")


@pytest.mark.parametrize("arch", ["x86_64", "x86_32"])
def test_what_a_real_x86_faults_on_faults(arch):
    """A misaligned MOVAPS and privileged or I/O instructions fault, as
    on the real CPU (a general protection fault, reported by kind)."""
    if qemu_program(arch) is None:
        pytest.skip(f"no qemu for {arch}")
    with EmulatedBackend(elfloader.arch.by_name(arch), engine="qemu") as be:
        data = be.alloc(256, 64)
        movaps = be.place_code(
            bytes([0x0F, 0x28, 0x07, 0xC3]) if arch == "x86_64"       # movaps xmm0, [rdi]
            else bytes([0x8B, 0x44, 0x24, 0x04, 0x0F, 0x28, 0x00, 0xC3]))  # [eax]
        be.call(movaps, data)                                          # aligned: runs
        for code, arg in ((movaps, data + 4), (be.place_code(b"\xfa\xc3"), 0),  # cli
                          (be.place_code(b"\xe6\x80\xc3"), 0)):                # out 0x80, al
            with pytest.raises(elfloader.EmulationError) as info:
                be.call(code, arg)
            assert info.value.fault.kind == "general_protection"
            assert "general protection fault" in str(info.value)


def test_agents_end_with_their_host_process(tmp_path):
    """A host process killed while its agent runs an endless loop leaves
    no agent behind (the agent watches its request pipe)."""
    import subprocess
    import sys
    script = tmp_path / "host.py"
    script.write_text(
        "import elfloader\n"
        "from elfloader.backend.emulated import EmulatedBackend\n"
        "be = EmulatedBackend(elfloader.arch.by_name('aarch64'), engine='qemu')\n"
        "spin = be.place_code(bytes.fromhex('00000014'))\n"
        "print(be.cpu._agent.pid, flush=True)\n"
        "be.call(spin)\n")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    host = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE,
                            text=True, env=dict(os.environ, PYTHONPATH=root))
    agent = int(host.stdout.readline())
    time.sleep(0.5)
    os.kill(host.pid, signal.SIGKILL)
    host.wait()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{agent}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except FileNotFoundError:
            return
        if state == "Z":        # exited; reaped by whoever adopted it
            return
        time.sleep(0.1)
    pytest.fail(f"agent {agent} still runs after its host was killed")


def test_an_agent_that_does_not_answer_is_killed_and_replaced(be, monkeypatch):
    """A stopped call whose agent never reports (here: the process is
    frozen) ends at the time limit; the agent is killed, not left behind,
    and the next call runs on a new one."""
    from elfloader.backend.emulated import qemu_engine
    monkeypatch.setattr(qemu_engine, "_STOP_TIMEOUT", 0.5)
    spin, add = be.place_code(SPIN), be.place_code(ADD)
    agent = be.cpu._agent
    be.timeout_us = 300_000
    threading.Timer(0.1, os.kill, (agent.pid, signal.SIGSTOP)).start()
    with pytest.raises(elfloader.EmulationError) as info:
        be.call(spin)
    assert info.value.fault.kind == "timeout"
    assert agent.closed and agent.proc.returncode == -signal.SIGKILL
    be.timeout_us = 0
    assert be.call(add, 2, 3) == 5
