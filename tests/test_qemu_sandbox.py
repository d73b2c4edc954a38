"""The qemu engine's sandbox and its wire checks, seen from the host.

Each test runs guest code that makes raw system calls through a small
trampoline, ``call(number, a0, a1, a2, a3)``, for aarch64 and x86_64 (the
filter is the host's, the same for every guest architecture; the hostile
plugins of ``tests/test_sandbox.py`` cover all six). What is checked: the
agent process is confined (filter, no new privileges, its own network
namespace, empty environment, limits), Landlock hides user files, memory
is bounded, and an agent whose pipes or code the guest abuses ends in a
typed error, after which the backend goes on with a new agent. Also: no
agent outlives its Python process, and closing a backend releases its
memory file.
"""

from __future__ import annotations

import os
import struct
import subprocess
import sys
import textwrap
import time

import pytest

import elfloader
from elfloader.backend.emulated import EmulatedBackend, qemu_program, sandbox

pytestmark = pytest.mark.skipif(
    qemu_program(elfloader.arch.by_name("aarch64")) is None
    and os.environ.get("CI") != "true", reason="qemu-user is not installed")


def _le(*words: int) -> bytes:
    return struct.pack(f"<{len(words)}I", *words)


#: call(number, a0, a1, a2, a3): the system call ``number`` with four
#: arguments; returns its result.
TRAMPOLINES = {
    # mov x8, x0; mov x0, x1; mov x1, x2; mov x2, x3; mov x3, x4; svc #0; ret
    "aarch64": _le(0xAA0003E8, 0xAA0103E0, 0xAA0203E1, 0xAA0303E2, 0xAA0403E3,
                   0xD4000001, 0xD65F03C0),
    # mov rax, rdi; mov rdi, rsi; mov rsi, rdx; mov rdx, rcx; mov r10, r8;
    # syscall; ret
    "x86_64": bytes.fromhex("4889f8" "4889f7" "4889d6" "4889ca" "4d89c2"
                            "0f05" "c3"),
}
NUMBERS = {
    "aarch64": {"openat": 56, "write": 64, "mmap": 222, "munmap": 215,
                "clone": 220, "getpid": 172, "dup3": 24, "close": 57},
    "x86_64": {"openat": 257, "write": 1, "mmap": 9, "munmap": 11,
               "clone": 56, "getpid": 39, "dup3": 292, "close": 3},
}
ARCHES = list(TRAMPOLINES)
AT_FDCWD = -100
EACCES, ENOMEM = 13, 12


class Guest:
    """A qemu-engine backend with the trampoline placed."""

    def __init__(self, arch: str):
        self.backend = EmulatedBackend(elfloader.arch.by_name(arch),
                                       engine="qemu", timeout=20)
        self.arch = arch
        self.entry = self.backend.place_code(TRAMPOLINES[arch])
        self.buf = self.backend.alloc(1 << 16)

    def syscall(self, name: str, *args: int) -> int:
        mask = self.backend.arch.word_mask
        got = self.backend.call(self.entry, NUMBERS[self.arch][name],
                                *[a & mask for a in args])
        return got - (mask + 1) if got >> 63 else got

    def agent(self):
        return self.backend.cpu._agent

    def close(self):
        self.backend.close()


@pytest.fixture(params=ARCHES)
def guest(request):
    g = Guest(request.param)
    yield g
    g.close()


def _status(pid: int) -> dict[str, str]:
    with open(f"/proc/{pid}/status") as f:
        return dict(line.rstrip("\n").split(":\t", 1) for line in f if ":\t" in line)


def test_agent_is_confined(guest):
    guest.syscall("getpid")            # allowed: the agent is up
    pid = guest.agent().pid
    status = _status(pid)
    assert status["Seccomp"].strip() == "2"          # a filter
    assert status["NoNewPrivs"].strip() == "1"
    assert os.readlink(f"/proc/{pid}/ns/net") != os.readlink("/proc/self/ns/net")
    with open(f"/proc/{pid}/environ", "rb") as f:
        assert f.read() == b""
    with open(f"/proc/{pid}/limits") as f:
        limits = {line[:26].strip(): line[26:].split() for line in f}
    assert limits["Max file size"][0] == str(sandbox.STDERR_LIMIT)
    assert limits["Max core file size"][0] == "0"
    assert limits["Max address space"][0] != "unlimited"


def test_refused_calls_are_faults_and_the_agent_goes_on(guest, tmp_path):
    path = tmp_path / "created"
    guest.backend.write(guest.buf, os.fsencode(path) + b"\0")
    with pytest.raises(elfloader.EmulationError) as info:
        guest.syscall("openat", AT_FDCWD, guest.buf, 0o101, 0o644)
    assert info.value.fault.kind == "syscall"
    assert info.value.fault.syscall_name == "openat"
    assert not path.exists()
    # A process, not a thread: qemu-user makes the call with signals
    # blocked, the filter ends the agent; still a system-call fault.
    with pytest.raises(elfloader.EmulationError) as info:
        guest.syscall("clone", 17, 0, 0, 0)          # SIGCHLD: a fork
    assert info.value.fault.kind == "syscall"
    assert guest.syscall("getpid") > 0               # a new agent


@pytest.mark.skipif(sandbox.landlock_abi() == 0, reason="no Landlock here")
def test_landlock_hides_user_files(guest, tmp_path):
    secret = tmp_path / "secret"
    secret.write_text("not for guests")
    for path, readable in ((secret, False), ("/etc/passwd", False),
                           ("/proc/1/environ", False),
                           ("/usr/bin/env", True)):
        guest.backend.write(guest.buf, os.fsencode(str(path)) + b"\0")
        got = guest.syscall("openat", AT_FDCWD, guest.buf, 0, 0)
        assert (got >= 0) == readable, (path, got)
        if not readable:
            assert got == -EACCES


def test_memory_is_bounded(guest):
    huge = 64 << 30
    got = guest.syscall("mmap", 0, huge, 3, 0x22)     # RW, private anonymous
    assert got == -ENOMEM
    small = guest.syscall("mmap", 0, 16 << 20, 3, 0x22)
    assert small > 0
    assert guest.syscall("munmap", small, 16 << 20) == 0


def _reply_fd(guest) -> int:
    guest.syscall("getpid")
    return int(guest.agent().proc.args[-1])


@pytest.mark.parametrize("forged", ["unknown kind", "flood", "wrong length"])
def test_forged_replies_are_typed_errors(guest, forged):
    fd = _reply_fd(guest)
    message = {"unknown kind": struct.pack("<IIQ", 99, 1, 0),
               "flood": struct.pack("<II", 2, 0xFFFFFFFF) + b"\xAA" * 4096,
               "wrong length": struct.pack("<II", 2, 3) + b"\0" * 24}[forged]
    guest.backend.write(guest.buf, message)
    start = time.monotonic()
    with pytest.raises(elfloader.EmulationError) as info:
        guest.syscall("write", fd, guest.buf, len(message))
    assert info.value.fault.kind == "agent_protocol"
    assert "wire format" in str(info.value)
    assert time.monotonic() - start < 10
    assert guest.syscall("getpid") > 0               # a new agent


def test_a_forged_result_is_refused(guest):
    """A reply of the right kind and length for a call that is not the
    one running (a guest cannot know the call's sequence number without
    reading the agent's memory) ends the agent at once."""
    fd = _reply_fd(guest)
    done = struct.pack("<IIQQ", 2, 2, 1234, 0)        # DONE(1234), call 0
    guest.backend.write(guest.buf, done)
    with pytest.raises(elfloader.EmulationError) as info:
        guest.syscall("write", fd, guest.buf, len(done))
    assert info.value.fault.kind == "agent_protocol"
    assert guest.syscall("getpid") > 0


def test_guest_that_unmaps_the_agent_is_a_typed_error(guest):
    """A guest that unmaps the agent's own code ends its agent: qemu-user
    dies or stops on an assertion of its own (kind emulator_aborted), a
    typed error either way, and the next call gets a new agent."""
    # The agent's callback entry points are its own code.
    guest.syscall("getpid")
    code = guest.backend._engine.slots[0] & ~0xFFF
    start = time.monotonic()
    with pytest.raises(elfloader.EmulationError) as info:
        guest.syscall("munmap", code - (64 << 10), 256 << 10)
    assert info.value.fault.kind in ("agent_died", "agent_protocol", "emulator_aborted")
    assert time.monotonic() - start < 15
    assert guest.syscall("getpid") > 0


def test_the_agents_own_descriptors_are_out_of_reach(guest):
    """Guest code may not close or replace the agent's pipes or memory
    file (the agent's watchdog polls its request pipe to end with its
    host); its other descriptors it may."""
    guest.syscall("getpid")
    for fd in sandbox.agent_fds(4):
        for call, args in (("dup3", (0, fd, 0)), ("close", (fd,))):
            with pytest.raises(elfloader.EmulationError) as info:
                guest.syscall(call, *args)
            assert info.value.fault.syscall_name == call
    assert guest.syscall("dup3", 0, 50, 0) == 50
    assert guest.syscall("close", 50) == 0


def test_stderr_is_bounded(guest):
    guest.backend.write(guest.buf, b"x" * (1 << 16))
    with pytest.raises(elfloader.EmulationError):
        for _ in range(sandbox.STDERR_LIMIT // (1 << 16) + 2):
            got = guest.syscall("write", 2, guest.buf, 1 << 16)
            if got < 0:
                raise elfloader.EmulationError("write refused")
    agent_stderr = guest.agent().stderr if guest.agent() else None
    if agent_stderr is not None and not agent_stderr.closed:
        agent_stderr.seek(0, 2)
        assert agent_stderr.tell() <= sandbox.STDERR_LIMIT


def _agents_under(directory: str) -> list[int]:
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/cmdline", "rb") as f:
                    if f.read().startswith(os.fsencode(directory)):
                        found.append(int(name))
            except OSError:
                pass
    return found


def test_no_agent_outlives_its_process(tmp_path):
    """A Python session that exits (or is killed) with backends open
    leaves no qemu-user process behind."""
    links = tmp_path / "qemu"
    links.mkdir()
    for program in ("qemu-aarch64", "qemu-riscv64"):
        (links / program).symlink_to(qemu_program(
            elfloader.arch.by_name(program.split("-")[1])))
    script = textwrap.dedent("""
        import sys, elfloader
        from elfloader.backend.emulated import EmulatedBackend
        kept = []
        for arch in ("aarch64", "riscv64"):
            b = EmulatedBackend(elfloader.arch.by_name(arch), engine="qemu")
            b.call(b.place_code(b.arch.return_insn))
            kept.append(b)
        print("up", flush=True)
        if sys.argv[1] == "hang":
            import time; time.sleep(60)
    """)
    env = dict(os.environ, PKR_QEMU_DIR=str(links))
    for how in ("exit", "hang"):
        proc = subprocess.Popen([sys.executable, "-c", script, how], env=env,
                                stdout=subprocess.PIPE, text=True)
        assert proc.stdout.readline().strip() == "up"
        assert len(_agents_under(str(links))) == 2
        if how == "hang":
            proc.kill()
        proc.wait(30)
        deadline = time.monotonic() + 10
        while _agents_under(str(links)) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _agents_under(str(links)) == [], how


def _memfds() -> list[str]:
    out = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("/memfd:guest_"):
            out.append(target)
    return out


def test_closing_releases_guest_memory():
    before = _memfds()
    g = Guest("aarch64")
    g.syscall("getpid")
    assert len(_memfds()) > len(before)
    g.close()
    assert _memfds() == before


def test_sandbox_status_names_its_layers():
    got = sandbox.status()
    assert got["seccomp"] is True and got["problem"] == ""
    assert got["landlock"] == sandbox.landlock_abi()
