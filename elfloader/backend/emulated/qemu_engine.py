"""The qemu engine: guest code runs under qemu-user, in a guest agent.

Each CPU is one child process: ``qemu-<arch> -cpu <model>`` running the
agent (``agent/agent.c``, a static Linux program of the guest
architecture, shipped as the FatELF bundle ``agent/agent.sos`` and handed
to qemu-user through a ``memfd``). Guest memory is one ``memfd`` per
address space: the host maps it whole, the agent maps it at the arena's
guest address (:data:`ARENAS`), so the host reads and writes guest memory
with plain copies and no request. Page protections are real ``mprotect``
calls of the agent (the space's memory-map log, applied before each call);
guard pages are ``PROT_NONE`` pages, and a fault reaches the agent as a
signal with the exact pc and data address.

Requests go down a pipe and replies come back on another (the wire format
is in ``agent.c``): set protections, call a function, return from a host
callback. A callback is one of the agent's 256 entry points; calling it
sends the slot and its arguments to the host, which runs the Python
function and answers with the result. A stop request (time limit, Ctrl-C,
another worker's fault) is ``SIGUSR1``: the agent leaves the call and
reports where it was. An agent that dies or does not answer is killed;
the next call starts a new one with the same memory.

Every agent runs in the sandbox of :mod:`.sandbox` (system-call filter,
Landlock, its own network namespace, bounded memory): guest code reaches
nothing on the host, and a system call it makes is a fault of the call
(``SIGSYS`` from the filter, reported by the agent). Every byte from an
agent is untrusted input, since guest code shares the agent's process and
may write to its pipes or over its code: a reply must have a known kind
and that kind's length, a reply during a call must carry that call's
sequence number, nothing may arrive unasked, and a reply that breaks
these rules is an :class:`EmulationError` (``fault.kind``
``"agent_protocol"``) and ends the agent.

A CPU may run its calls under qemu-user's gdb stub
(:meth:`QemuCpu.debug_next` with a :class:`GdbStub`): its next call starts
a new agent with ``-g PATH``, a UNIX socket in a private folder, which
waits for gdb before running its first instruction; that agent's calls
have no time limit and its start no timeout.

qemu-user does not see writes the host makes to a page whose code it has
already translated. Every change that may put new code on a page ("map",
"invalidate" in the log) therefore first makes the page writable in the
agent, which makes qemu-user drop the page's translations.
"""

from __future__ import annotations

import bisect
import ctypes
import mmap
import os
import select
import signal
import struct
import subprocess
import tempfile
import threading
import time
import weakref

from fatelf import arches
from fatelf.text import printable_lines

from ...arch import ARCHES, Arch
from ...errors import BackendError, EmulationError, EngineError, Fault
from ..base import PROT_EXEC, PROT_READ, PROT_WRITE, prot_str
from . import sandbox, syscalls, tcg_plugin
from .choice import INSTALL_HINT, QEMU, QEMU_PROGRAMS, qemu_program
from .engine import FAULTS, Cpu, Engine, Space
from .pages import lookup

#: Guest addresses ``(start, end)`` of the arena every agent maps, by
#: architecture name (each :attr:`elfloader.arch.QemuUser.arena`; why these
#: addresses: :data:`elfloader.arch.base.ARENA_64` and ``ARENA_32``).
ARENAS = {a.name: a.qemu.arena for a in ARCHES}
AGENT_BUNDLE = os.path.join(os.path.dirname(__file__), "agent", "agent.sos")


# Requests and replies (agent.c).
_MAP, _PROTECT, _CALL, _RETURN, _EXIT, _CALLBACKS, _ABORT = 1, 2, 3, 4, 5, 6, 7
_OK, _DONE, _CALLBACK, _FAULT, _STOPPED, _ERROR = 1, 2, 3, 4, 5, 6
_MAX_WORDS = 4096
#: Words of each reply kind (None: the request says; see _Agent.request).
#: Replies during a call end with the call's sequence number.
_REPLY_WORDS = {_OK: None, _DONE: 2, _CALLBACK: 10, _FAULT: 6, _STOPPED: 3,
                _ERROR: 3}
_REQUEST_NAMES = {_MAP: "map", _PROTECT: "protect", _CALLBACKS: "callbacks"}
_SIGSYS = 31
_F_SEAL_SEAL, _F_SEAL_SHRINK, _F_SEAL_GROW, _F_SEAL_WRITE = 1, 2, 4, 8
_F_ADD_SEALS = 1033
_SI_KERNEL = 0x80         # si_code of a signal the kernel sent for a #GP
_START_TIMEOUT = 30.0     # seconds for a new agent to answer
_STOP_TIMEOUT = 5.0       # seconds for a stopped call to report
#: Seconds between checks of a running call's agent memory (a call shorter
#: than this is never checked: guest code touches at most some 20 MiB in
#: that time under qemu-user).
_MEMORY_POLL = 0.05
_HEAD = struct.Struct("<II")

_SIGNALS = {
    signal.SIGILL: ("invalid_instruction", "invalid instruction"),
    signal.SIGFPE: ("arithmetic", "arithmetic exception (integer division "
                    "by zero or overflow)"),
    signal.SIGBUS: ("bus_error", "bus error (misaligned or outside the "
                    "mapped object)"),
    signal.SIGTRAP: ("trap", "trap or breakpoint instruction"),
}


class ProtocolError(EngineError):
    """A guest agent's reply broke the wire format (guest code wrote to
    the agent's pipe or over the agent)."""


class EmulatorAbortError(EngineError):
    """qemu-user itself stopped: one of its assertions failed or it gave
    up on the guest (a forged ``rt_sigreturn`` frame does this), as its
    stderr says (:data:`_ABORT_MARKS`)."""


#: What qemu-user writes on its stderr when it aborts: a glib or C
#: assertion, or a guest signal it cannot deliver.
_ABORT_MARKS = (b"**ERROR:", b"Assertion `", b"assertion failed",
                b"qemu: uncaught target signal")


def _seal(fd: int, seals: int) -> None:
    """Add ``seals`` to memfd ``fd`` for every holder of the file (a guest
    that reaches the descriptor can then neither resize it nor, with
    ``F_SEAL_WRITE``, change it)."""
    import fcntl
    fcntl.fcntl(fd, _F_ADD_SEALS, seals)

_agent_files: dict[str, int] = {}
_agent_lock = threading.Lock()
#: Engines alive in this process (a forked child must not use them: its
#: agents and guest memory are the parent's).
_ENGINES: "weakref.WeakSet[QemuEngine]" = weakref.WeakSet()


def _after_fork_in_child() -> None:
    """In a forked child: the engines' agents and guest memory are the
    parent's. Their host mappings become private copies (nothing the child
    writes reaches the parent), and every use is refused."""
    global _agent_lock
    _agent_lock = threading.Lock()
    for engine in list(_ENGINES):
        engine.forked = True
        if engine.mm is not None:
            size = engine.arena[1] - engine.arena[0]
            _mmap(ctypes.c_void_p(engine.host_base), ctypes.c_size_t(size),
                  mmap.PROT_READ | mmap.PROT_WRITE,
                  mmap.MAP_PRIVATE | _MAP_FIXED, engine.memfd, 0)


_MAP_FIXED = 0x10
_libc = ctypes.CDLL(None, use_errno=True)
_mmap = _libc.mmap
_mmap.restype = ctypes.c_void_p
_mmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                  ctypes.c_int, ctypes.c_long)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def agent_fd(arch: Arch) -> int:
    """A ``memfd`` holding the agent executable of ``arch`` (made once per
    process).

    Raises:
        EngineError: the bundle is missing or has no agent for ``arch``.
    """
    with _agent_lock:
        fd = _agent_files.get(arch.name)
        if fd is not None:
            return fd
        import fatelf
        try:
            with open(AGENT_BUNDLE, "rb") as f:
                data = f.read()
            elf = fatelf.select(data, arch.name)
        except (OSError, fatelf.FatElfError) as exc:
            raise EngineError(f"no guest agent for {arch.name} in "
                              f"{AGENT_BUNDLE}: {exc}", field="agent",
                              value=arch.name) from None
        fd = os.memfd_create(f"agent_{arch.name}",
                             os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        os.write(fd, elf)
        _seal(fd, _F_SEAL_WRITE | _F_SEAL_SHRINK | _F_SEAL_GROW | _F_SEAL_SEAL)
        _agent_files[arch.name] = fd
        return fd


class GdbStub:
    """qemu-user's gdb stub for one agent (``-g PATH``): the socket
    ``<folder>/agent.sock``, made by the agent (its sandbox may make
    sockets beneath ``folder`` alone: :func:`.sandbox.spawn`).

    Args:
        folder: a private folder of this user, new for the session
            (:func:`fatelf.private_dirs.private_dir`); its path must leave
            the socket's path under 108 bytes.
        listening: called as ``listening(path, pid)`` once the agent
            (process ``pid``) listens at ``path``, before the host's
            first request to it, which waits (without a time limit) for
            gdb to connect and let the agent run: start gdb here.
    """

    def __init__(self, folder: str, listening=None):
        self.folder = os.path.realpath(folder)
        self.path = os.path.join(self.folder, "agent.sock")
        self.listening = listening
        #: The agent serving the stub (set when it starts), or None.
        self.pid: int | None = None


#: While set (:func:`debug_calls`): ``hook(cpu, address, args)``, asked
#: before each call of a CPU whose agent is not under a gdb stub; a
#: :class:`GdbStub` it returns runs that call (and the CPU's next ones)
#: under that stub, as :meth:`QemuCpu.debug_next` does.
_DEBUG_HOOK = None


def debug_calls(hook):
    """Let ``hook(cpu, address, args)`` (None: no hook) choose, call by
    call, a call of any qemu CPU of this process to run under a gdb stub
    (see :data:`_DEBUG_HOOK`); returns the hook set before. A hook runs on
    the thread making the call and must not call the CPU itself."""
    global _DEBUG_HOOK
    old, _DEBUG_HOOK = _DEBUG_HOOK, hook
    return old


class _Region:
    """A reservation's part of the space's memory file."""

    __slots__ = ("address", "size", "host", "_engine")

    def __init__(self, engine: "QemuEngine", address: int, size: int):
        self.address, self.size, self._engine = address, size, engine
        self.host = engine.host_base + (address - engine.arena[0])

    def free(self) -> None:
        """Give the pages back to the system; they read as zeros again."""
        self._engine.discard(self.address, self.size)


class _Agent:
    """One agent process and its pipes."""

    def __init__(self, engine: "QemuEngine", stub: GdbStub | None = None):
        self.engine = engine
        #: Whether qemu-user serves a gdb stub for this agent (no time
        #: limits then).
        self.debugged = stub is not None
        if engine.memfd is None:
            raise EngineError("the qemu engine is closed: no guest memory "
                              "for an agent", field="engine",
                              value=engine.arch.name)
        req_r, self.req_w = os.pipe()
        self.rep_r, rep_w = os.pipe()
        exe = agent_fd(engine.arch)
        self.stderr = tempfile.TemporaryFile(prefix="qemu_agent_")
        # In the agent the descriptors have numbers of the sandbox's
        # protected range, which guest code cannot close or dup over.
        mine: tuple[int, ...] = (exe, req_r, rep_w, engine.memfd)
        results = engine.instrument
        if results is not None:
            # The workbench's TCG plugin, loaded from a descriptor (Landlock
            # refuses plugin files), and the results file it shares.
            mine += (tcg_plugin.plugin_fd(), results.fd)
        theirs = sandbox.agent_fds(len(mine))
        self.memfd = theirs[3]
        plugin = [] if results is None else [
            "-plugin", f"/proc/self/fd/{theirs[4]},"
            + results.plugin_args(theirs[5], theirs[3], engine.arena)]
        argv = [engine.program, *plugin, "-cpu", engine.cpu_option,
                f"/proc/self/fd/{theirs[0]}", str(theirs[1]), str(theirs[2])]
        if stub is not None:
            argv[1:1] = ["-g", stub.path]
        try:
            self.proc = sandbox.spawn(argv, dict(zip(theirs, mine)),
                                      stderr=self.stderr,
                                      sockets=stub.folder if stub else None)
        except (OSError, subprocess.SubprocessError, EngineError) as exc:
            for fd in (req_r, rep_w, self.req_w, self.rep_r):
                os.close(fd)
            self.stderr.close()
            raise EngineError(f"cannot start {engine.program}: {exc}",
                              field="engine", value=engine.program) from None
        os.close(req_r)
        os.close(rep_w)
        self.pid = self.proc.pid
        self.owner = os.getpid()
        self._buf = bytearray()
        self.closed = False
        #: Bytes of private resident memory the agent may reach (set once
        #: it started: sandbox.bound_memory), or None.
        self.memory_bound: int | None = None

    # --- wire -----------------------------------------------------------------
    def _check_owner(self) -> None:
        """Refuse the pipes in a forked child: a byte it wrote or read
        would belong to a call of the parent's, which would then wait for
        a reply the child took.

        Raises:
            EngineError: this process is not the one that started the agent.
        """
        if os.getpid() != self.owner:
            raise EngineError(f"the {self.engine.arch.name} guest agent "
                              "belongs to the parent process: after fork(), "
                              "load the file again in the child",
                              field="agent", value=self.pid)

    def send(self, kind: int, words=()) -> None:
        self._check_owner()
        data = _HEAD.pack(kind, len(words)) + struct.pack(
            f"<{len(words)}Q", *words)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(self.req_w, view):]
        except OSError:
            raise self.died() from None

    def recv(self, deadline: float | None = None):
        """The next reply as ``(kind, words)``; None when ``deadline``
        (``time.monotonic()``) passes first. The kind is known and the
        count is that kind's (or at most ``_MAX_WORDS`` for ``OK``).

        Raises:
            ProtocolError: the reply breaks the wire format.
            EngineError: the agent died.
        """
        self._check_owner()
        buf = self._buf
        while True:
            if len(buf) >= 8:
                kind, count = _HEAD.unpack_from(buf)
                if kind not in _REPLY_WORDS or count != (
                        _REPLY_WORDS[kind] if _REPLY_WORDS[kind] is not None
                        else min(count, _MAX_WORDS)):
                    raise self.broken(f"a reply of kind {kind} with {count} "
                                      "words", kind)
                end = 8 + 8 * count
                if len(buf) >= end:
                    words = struct.unpack_from(f"<{count}Q", buf, 8)
                    del buf[:end]
                    return kind, words
            if self.closed:
                raise self.died()
            try:
                if deadline is not None:
                    left = deadline - time.monotonic()
                    if left <= 0 or not select.select([self.rep_r], [], [],
                                                      left)[0]:
                        return None
                chunk = os.read(self.rep_r, 65536)
            except OSError:
                chunk = b""
            if not chunk:
                raise self.died()
            buf += chunk

    def broken(self, what: str, value) -> ProtocolError:
        """End the agent: it sent ``what``, which the wire format does not
        allow."""
        self.kill()
        return ProtocolError(f"the {self.engine.arch.name} guest agent sent "
                             f"{what}, which its wire format does not allow "
                             "(guest code wrote to the agent's pipe or over "
                             "the agent); the agent was ended",
                             field="agent", value=value)

    def expect_quiet(self) -> None:
        """Check that nothing arrived unasked before a new request.

        Raises:
            ProtocolError: bytes are waiting on the reply pipe.
        """
        if self.closed:
            return
        self._check_owner()
        if self._buf or select.select([self.rep_r], [], [], 0)[0]:
            try:
                extra = len(self._buf) + len(os.read(self.rep_r, 65536))
            except OSError:
                extra = len(self._buf)
            if extra:
                raise self.broken(f"{extra} bytes nobody asked for", extra)

    def request(self, kind: int, words=(),
                timeout: float | None = _START_TIMEOUT,
                count: int | None = None):
        """Send a request that is answered at once; returns the reply's
        words (``count`` of them, when given); ``timeout`` None (a
        debugged agent): wait as long as it takes.

        Raises:
            ProtocolError: the reply breaks the wire format.
            EngineError: the agent died, did not answer, or refused.
        """
        self.expect_quiet()
        self.send(kind, words)
        reply = self.recv(None if timeout is None
                          else time.monotonic() + timeout)
        if reply is None:
            self.kill()
            raise EngineError(f"the {self.engine.arch.name} guest agent did "
                              f"not answer within {timeout:g} s",
                              field="agent", value=self.pid)
        got, out = reply
        if got == _ERROR:
            errno_, what, index = out
            if what != kind or not 0 < errno_ < 4096:
                raise self.broken(f"an error reply {out!r} to request {kind}",
                                  got)
            raise EngineError(f"the guest agent's request "
                              f"{_REQUEST_NAMES.get(kind, kind)} failed at "
                              f"item {index}: {os.strerror(errno_)}",
                              field="agent", value=kind)
        if got != _OK or (count is not None and len(out) != count):
            raise self.broken(f"reply {got} with {len(out)} words to request "
                              f"{_REQUEST_NAMES.get(kind, kind)}", got)
        return out

    def died(self) -> EngineError:
        """The error for an agent that is gone (and its reaping)."""
        said, raw = "", b""
        if not self.stderr.closed:
            self.stderr.seek(0)
            raw = self.stderr.read()[-2000:].strip()
        aborted = any(mark in raw for mark in _ABORT_MARKS)
        if aborted:
            # qemu-user's threads may each print the same line.
            raw = b"\n".join(dict.fromkeys(raw.splitlines()))
        if raw:
            # What the agent's process wrote (qemu-user's words, or the
            # guest's own): data, each line behind a label, escaped.
            said = printable_lines(raw, "  guest agent stderr| ",
                                   max_lines=20, limit=200)
        self.kill()
        status = self.proc.returncode
        how = (f"killed by signal {-status}" if status is not None and status < 0
               else f"exit status {status}")
        cls, head, what = ((EmulatorAbortError, "the emulator aborted: ",
                            "stopped on a failed check of its own")
                           if aborted else (EngineError, "", "died"))
        err = cls(f"{head}the {self.engine.arch.name} guest agent "
                  f"({self.engine.program} -cpu "
                  f"{self.engine.cpu_option}) {what} ({how})"
                  + (f"; it wrote:\n{said}" if said else ""),
                  field="agent", value=self.pid,
                  signal=-status if status is not None and status < 0
                  else None)
        return err

    def signal(self, sig: int) -> None:
        if self.closed:
            return
        try:
            os.kill(self.pid, sig)
        except ProcessLookupError:
            pass

    def kill(self) -> None:
        """End the agent (in the process that started it; a forked child
        only lets go of its copies of the pipes) and free what it held."""
        if self.closed:
            return
        mine = os.getpid() == self.owner
        if mine:
            self.signal(signal.SIGKILL)
        self.closed = True
        if mine:
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                pass
        for fd in (self.req_w, self.rep_r):
            try:
                os.close(fd)
            except OSError:
                pass
        self.stderr.close()

    def close(self) -> None:
        if self.closed:
            return
        if os.getpid() != self.owner:
            self.kill()
            return
        try:
            self.send(_EXIT)
            self.proc.wait(2)
        except (EngineError, subprocess.TimeoutExpired):
            pass
        self.kill()


class QemuCpu(Cpu):
    """One agent process of a :class:`QemuEngine` space: its own registers
    and translated code, the space's memory. Different CPUs run calls at
    the same time (each in its own process); one CPU runs one call at a
    time."""

    def __init__(self, engine: QemuEngine, space: Space):
        super().__init__(space)
        self._engine = engine
        self._mask = space.arch.word_mask
        self._agent: _Agent | None = None
        self._pending: BaseException | None = None
        self._sequence = 0                # of the last call sent
        self._lock = threading.Lock()     # guards _agent against stop()
        self._debug: GdbStub | None = None  # for the next call's agent
        self._spawn()

    def debug_next(self, stub: GdbStub) -> None:
        """Run this CPU's calls, from its next one on, under qemu-user's
        gdb stub ``stub``: the agent running now is closed, and the next
        call starts a new one with ``-g`` (see :class:`GdbStub`), whose
        calls have no time limit."""
        self._debug = stub

    @property
    def space(self) -> Space:
        """The address space (the emulated backend) this CPU runs in."""
        return self._space

    # --- the agent process ----------------------------------------------------
    def _spawn(self, stub: GdbStub | None = None) -> _Agent:
        """Start an agent (under gdb stub ``stub``), map the memory file
        and check its callbacks."""
        engine = self._engine
        agent = _Agent(engine, stub)
        limit = None if stub is not None else _START_TIMEOUT
        try:
            if stub is not None:
                self._await_stub(agent, stub)
            start, end = engine.arena
            base, = agent.request(_MAP, (agent.memfd, end - start, start, 1),
                                  timeout=limit, count=1)
            if base != start:
                raise EngineError(f"the guest agent mapped guest memory at "
                                  f"{base:#x}, not {start:#x}", field="agent",
                                  value=base)
            slots = agent.request(_CALLBACKS, timeout=limit, count=256)
            agent.memory_bound = sandbox.bound_memory(agent.pid)
            if engine.slots is None:
                engine.slots = list(slots)
            elif list(slots) != engine.slots:
                raise EngineError("guest agents disagree on callback "
                                  "addresses", field="agent", value=agent.pid)
        except BaseException:
            # (an agent that died has said why in the error: qemu's stderr)
            agent.kill()
            raise
        with self._lock:
            self._agent = agent
        return agent

    def _await_stub(self, agent: _Agent, stub: GdbStub) -> None:
        """Wait until ``agent`` listens at ``stub.path``, then tell
        ``stub.listening``.

        Raises:
            EngineError: the agent died or made no socket within the
                start-up time.
        """
        stub.pid = agent.pid
        deadline = time.monotonic() + _START_TIMEOUT
        while not os.path.exists(stub.path):
            if agent.proc.poll() is not None:
                raise agent.died()
            if time.monotonic() > deadline:
                agent.kill()
                raise EngineError(f"the {self._engine.arch.name} guest agent "
                                  f"made no gdb socket at {stub.path} within "
                                  f"{_START_TIMEOUT:g} s", field="agent",
                                  value=stub.path)
            time.sleep(0.01)
        if stub.listening is not None:
            stub.listening(stub.path, agent.pid)

    def _live_agent(self) -> _Agent:
        """The running agent, restarted (with the whole address space)
        when the last one died, or under a gdb stub when one is asked
        for (:meth:`debug_next`)."""
        agent = self._agent
        stub, self._debug = self._debug, None
        if stub is not None and agent is not None:
            agent.close()
        if agent is None or agent.closed:
            self._agent = None
            agent = self._spawn(stub)
            with self._state.lock:
                self.map_all()
        return agent

    # --- memory map ---------------------------------------------------------
    def _current(self, state, start: int, end: int) -> list[int]:
        """``(address, size, prot)`` words giving ``[start, end)`` the
        protections of page-map ``state`` (unmapped: none)."""
        out: list[int] = []
        starts, ranges = state
        i = max(0, bisect.bisect_right(starts, start) - 1)
        at = start
        for s, e, p in ranges[i:]:
            if s >= end:
                break
            if e <= at:
                continue
            if s > at:
                out += (at, s - at, 0)
                at = s
            stop = min(e, end)
            out += (at, stop - at, p)
            at = stop
        if at < end:
            out += (at, end - at, 0)
        return out

    def _protect(self, agent: _Agent, words: list[int]) -> None:
        """Send protection triples to ``agent`` in requests of bounded
        size."""
        step = (_MAX_WORDS // 3) * 3
        for i in range(0, len(words), step):
            agent.request(_PROTECT, words[i:i + step], count=0)

    def sync(self) -> None:
        shared = self._state
        if self.gen == shared.gen:
            return
        first = shared.gen - len(shared.log)
        state = shared.pages.state
        words: list[int] = []
        rw = PROT_READ | PROT_WRITE
        for kind, address, size, _ in shared.log[self.gen - first:]:
            if kind in ("map", "invalidate"):
                # Writable first: qemu-user drops translations of the page.
                words += (address, size, rw)
            words += self._current(state, address, address + size)
        self.gen = shared.gen
        if self._agent is not None and not self._agent.closed and words:
            try:
                self._protect(self._agent, words)
            except EngineError:
                self._agent.kill()

    def map_all(self) -> None:
        shared = self._state
        words: list[int] = []
        for start, end, prot in shared.pages.state[1]:
            words += (start, end - start, prot)
        self.gen = shared.gen
        if words:
            # Set by _spawn, which this CPU's constructor and _live_agent
            # run first.
            assert self._agent is not None
            self._protect(self._agent, words)

    # --- calls ------------------------------------------------------------
    def call(self, address: int, *args: int) -> int:
        """Call ``address`` with integer arguments; see :meth:`Cpu.call`."""
        self._refuse_forked(address)
        self._enter(address)
        try:
            return self._run(address, args)
        finally:
            self._leave()

    def _refuse_forked(self, address: int) -> None:
        # Before _enter: its sync() would talk to the parent's agent.
        if self._engine.forked:
            raise BackendError("this emulated address space belongs to the "
                               "parent process (qemu engine): after fork(), "
                               "load the file again in the child",
                               field="call", value=address)

    def _run(self, address: int, args) -> int:
        if len(args) > 16:
            raise BackendError(f"{len(args)} arguments: at most 16",
                               field="call", value=address)
        mask = self._mask
        self._pending = None
        timeout = self._space.timeout_us / 1e6
        hook = _DEBUG_HOOK
        if hook is not None and self._debug is None and (
                self._agent is None or not self._agent.debugged):
            self._debug = hook(self, address, args)
        try:
            agent = self._live_agent()
            if agent.debugged:
                timeout = 0      # a person may hold the call in gdb
            deadline = time.monotonic() + timeout if timeout else None
            agent.expect_quiet()
            self._sequence = sequence = (self._sequence + 1) & (2**64 - 1)
            agent.send(_CALL, [address & mask, self._stack_top, sequence]
                       + [a & mask for a in args])
        except EngineError as exc:
            raise self._died(exc, address) from None
        if self._stop:
            agent.signal(signal.SIGUSR1)
        while True:
            wake = time.monotonic() + _MEMORY_POLL
            try:
                reply = agent.recv(wake if deadline is None
                                   else min(deadline, wake))
            except EngineError as exc:
                raise self._died(exc, address) from None
            except BaseException:      # Ctrl-C: stop the call, then go on
                self._halt(agent)
                raise
            if reply is None and (deadline is None
                                  or time.monotonic() < deadline):
                self._check_memory(agent, address)
                continue
            if reply is None:
                pc = self._halt(agent)
                raise self._error(
                    "timeout", f"stopped after the {timeout:g} s time limit",
                    address, pc)
            kind, words = reply
            if kind != _OK and words[-1] != sequence:
                raise self._died(agent.broken(
                    f"a reply for call {words[-1]} during call {sequence}",
                    words[-1]), address)
            words = words[:-1]
            if kind == _DONE:
                return words[0] & mask
            if kind == _CALLBACK:
                try:
                    self._serve(agent, words)
                except EngineError as exc:
                    raise self._died(exc, address) from None
                continue
            if kind == _FAULT:
                raise self._fault(words, address)
            if kind == _STOPPED:
                if self._pending is not None:
                    exc, self._pending = self._pending, None
                    raise exc
                raise self._error("stopped", "stopped by request", address,
                                  words[0] or None)
            raise self._died(agent.broken(f"reply {kind} during a call", kind),
                             address)

    def _check_memory(self, agent: _Agent, address: int) -> None:
        """End ``agent`` when its private resident memory is past its
        bound (the sandbox's ``RLIMIT_AS`` does not hold on 32-bit guests:
        see :func:`.sandbox.bound_memory`).

        Raises:
            EmulationError: ``fault.kind`` ``"memory_limit"``.
        """
        used = sandbox.over_bound(agent.pid, agent.memory_bound)
        if used is None:
            return
        agent.kill()
        record = Fault("memory_limit", f"the guest used {used >> 20} MiB of "
                       f"private memory, more than the sandbox allows "
                       f"({sandbox.MEMORY_LIMIT >> 20} MiB past its start); "
                       "the guest agent was ended")
        raise EmulationError(record.message(address), field="call",
                             value=address, fault=record)

    def _serve(self, agent: _Agent, words) -> None:
        """Run the Python callback the guest called and answer it.

        Raises:
            ProtocolError: the slot is not one of the agent's entry points.
        """
        shared = self._state
        slot, args = words[0], words[1:]
        if slot >= len(self._engine.slots or ()):
            raise agent.broken(f"a callback from slot {slot}", slot)
        entry = None
        if slot < len(shared.slots):
            entry = shared.callbacks.get(shared.slots[slot])
        if entry is None:
            agent.send(_RETURN, (0,))
            return
        function, nargs = entry
        mask = self._mask
        try:
            result = int(function(*[a & mask for a in args[:nargs]]) or 0)
            # Memory the callback mapped, protected or released applies to
            # this CPU before the guest goes on.
            with shared.lock:
                self.sync()
        except BaseException as exc:
            if self._pending is None:
                self._pending = exc
            agent.send(_ABORT)
            return
        agent.send(_RETURN, (result & mask,))

    def _halt(self, agent: _Agent) -> int | None:
        """Stop the running call and wait for the agent to report; returns
        the pc it stopped at (None if unknown). An agent that does not
        report is killed (the next call starts a new one)."""
        if agent.closed:
            return None
        agent.signal(signal.SIGUSR1)
        deadline = time.monotonic() + _STOP_TIMEOUT
        while True:
            try:
                reply = agent.recv(deadline)
            except EngineError:
                return None
            except BaseException:
                agent.kill()
                raise
            if reply is None:
                agent.kill()
                return None
            kind, words = reply
            if kind != _OK and words[-1] != self._sequence:
                agent.kill()
                return None
            if kind == _CALLBACK:
                agent.send(_ABORT)
                continue
            if kind in (_STOPPED, _FAULT):
                return (words[0] if kind == _STOPPED else words[3]) or None
            if kind == _DONE:
                return None

    def stop(self) -> None:
        with self._state.lock:
            if self.thread is None or self._closed:
                return
            self._stop = True
        with self._lock:
            if self._agent is not None and not self._agent.closed:
                self._agent.signal(signal.SIGUSR1)

    # --- errors -------------------------------------------------------------
    def _error(self, fault: str, what: str, address: int,
               pc: int | None) -> EmulationError:
        # "call of X stopped at pc=P after the ..." as on unicorn.
        record = Fault(fault, what, pc=pc)
        return EmulationError(record.message(address), field="call",
                              value=address, fault=record)

    def _died(self, exc: EngineError, address: int) -> EmulationError:
        """The error for a call whose agent died, could not start or broke
        the wire format (``fault.kind`` ``"agent_protocol"``). An agent ended by
        ``SIGSYS`` met the filter while qemu-user had signals blocked, as
        it has while it creates a process for the guest: a ``syscall``
        fault whose number is not known."""
        if exc.signal == _SIGSYS:
            return syscalls.fault(
                self.arch, None, None, address,
                attempt="creating a process (fork, vfork or clone without "
                "CLONE_THREAD)", detail="the sandbox refused it and ended "
                "the guest agent; " + syscalls.BARE_METAL)
        record = Fault("agent_protocol" if isinstance(exc, ProtocolError)
                       else "emulator_aborted"
                       if isinstance(exc, EmulatorAbortError)
                       else "agent_died", exc.message)
        return EmulationError(record.message(address), field="call",
                              value=address, fault=record)

    def _fault(self, words, address: int) -> EmulationError:
        """The error for a call that stopped with a fault signal."""
        sig, code, data, pc, sp_bits = words
        mask = self._mask
        if sig == _SIGSYS:
            return _syscall_fault(self.arch, data,
                                  syscalls.start_of(self.arch, pc & mask),
                                  address)
        data &= mask
        # 0 unknown, 1 read, 2 write, 3 instruction fetch (x86 error code)
        kind = (sp_bits >> 62) & 3
        page_size = self._space.page_size
        page = data - data % page_size
        exact = access = prot = None
        if sig == signal.SIGSEGV and code & 0xFFFFFFFF == _SI_KERNEL:
            # x86 #GP: no address (an aligned SSE/AVX access that is not
            # aligned, a privileged or I/O instruction, a bad segment).
            fault, what = ("general_protection", "general protection fault "
                           "(misaligned aligned-vector access, privileged or "
                           "I/O instruction)")
        elif sig == signal.SIGSEGV:
            prot = lookup(self._state.pages.state, data)
            start, end = self._engine.arena
            if not start <= pc < end and not (prot or 0) & PROT_EXEC:
                # In the agent's own code, which touches no guest memory:
                # the fetch of the function it was asked to call.
                access, pc, data = "fetch", address & mask, address & mask
            elif (kind == 3 or ((not kind or pc == data)
                                and _is_fetch(pc, data, prot))
                  or _transfers_to(self._space, pc, data, prot)):
                access = "fetch"
                pc = data     # qemu-user gives the jump's pc; the CPU's is the target
            elif kind:
                access = "write" if kind == 2 else "read"
            elif prot is not None and prot & PROT_READ and not prot & PROT_WRITE:
                access = "write"
            else:
                access = _access_of(self._space, pc) or "access"
            if access == "access":
                fault = ("access_unmapped" if prot is None
                         else "access_protected")
                what = ("read or write of unmapped memory" if prot is None
                        else "access to protected memory")
            else:
                fault, what = FAULTS[access, prot is not None]
            exact = data if access != "fetch" else pc
            what += (f" (page {prot_str(prot)})" if prot is not None else "")
        else:
            fault, what = _SIGNALS.get(sig, ("signal", f"signal {sig}"))
            if sig == signal.SIGBUS:
                exact = data
        # (no access size: a signal does not say)
        record = Fault(fault, what, access=access if access != "access"
                       else None, pc=pc, address=exact,
                       page=page if exact is not None else None,
                       protection=prot, signal=sig)
        return EmulationError(record.message(address), field="call",
                              value=address, fault=record)

    # --- lifetime -------------------------------------------------------------
    def close_engine(self) -> None:
        self._closed = True
        with self._lock:
            agent, self._agent = self._agent, None
        if agent is not None:
            agent.close()


def _syscall_fault(arch: Arch, number: int, pc: int,
                   address: int) -> EmulationError:
    """The error for a system call the filter refused, from the number the
    agent read in the guest's number register. Where that register is
    also the result register (x86), qemu-user has already written the
    host call's result there, which for a refused call is the host's
    system call number: the name comes from the host's table."""
    if arch.syscalls.number != arch.cc.int_result:
        return syscalls.fault(arch, number, pc, address)
    host = syscalls.host_table()
    called = syscalls.name(host, number) if host else None
    guest = syscalls.number(arch.syscalls.table, called) if called else None
    return syscalls.fault(arch, guest, pc, address, called=called)


def _is_fetch(pc: int, data: int, prot) -> bool:
    """Whether a fault at ``data`` with pc ``pc`` was the instruction
    fetch (the instruction at pc, up to 16 bytes, on that address)."""
    return pc - 16 < data <= pc + 15 and (prot is None or not prot & PROT_EXEC)


def _transfers_to(space, pc: int, data: int, prot) -> bool:
    """Whether a fault at ``data`` is the fetch of a jump's target:
    qemu-user reports x86 fetch faults at the pc of the call, jump or
    return that went there (real CPUs and unicorn: at the target; see
    :attr:`.QemuFacts.branches`)."""
    branches = QEMU[space.arch.name].branches
    if not branches or (prot or 0) & PROT_EXEC:
        return False
    from ...diagnose import disassemble
    try:
        text = disassemble(space.arch.name, space.read(pc, 16), pc)
    except BackendError:
        return False
    return text.startswith(branches)


def _access_of(space, pc: int) -> str | None:
    """``"read"`` or ``"write"`` from the instruction at ``pc``, where the
    disassembler (or the major opcode: :attr:`.Disassembly.store_opcodes`)
    tells; else None."""
    name = space.arch.name
    facts = space.arch.disassembly
    thumb = facts.thumb_modes is not None
    try:
        code = space.read(pc & ~1 if thumb else pc, 4)
    except BackendError:
        return None
    if facts.store_opcodes and len(code) == 4 and code[0] & 3 == 3:
        return "write" if code[0] & 0x7F in facts.store_opcodes else "read"
    stores = facts.stores
    if stores is None:
        return None
    from ...diagnose import disassemble
    text = disassemble(name, code, pc)
    if not text or text.startswith("("):
        return None
    mnemonic = text.split()[0].lower()
    return "write" if mnemonic.startswith(stores) else "read"


class QemuEngine(Engine):
    """Agents under qemu-user for one address space (see the module
    docstring).

    Raises:
        EngineError: qemu-user or the agent bundle is missing, or the
            memory file cannot be made.
    """

    name = "qemu"
    eager_sync = False
    defer_free = False

    def __init__(self, arch: Arch, profile: arches.Profile | None,
                 vlen: int | None, program: str | None = None):
        super().__init__(arch, profile, vlen)
        found = program or qemu_program(arch)
        if found is None:
            raise EngineError(f"{QEMU_PROGRAMS.get(arch.name, 'qemu-user')} is "
                              f"not installed: {INSTALL_HINT}", field="engine",
                              value=arch.name)
        self.program: str = found
        if profile is not None:
            self.cpu_option = profile.qemu_cpu_option(vlen)
        else:
            self.cpu_option = QEMU[arch.name].max_model.format(
                vlen=vlen or 128, vq=(vlen or 128) // 128,
                vlenb=(vlen or 128) // 8)
        sandbox.require()
        agent_fd(arch)
        self.forked = False
        self.arena = arch.qemu.arena
        self.slots: list[int] | None = None
        size = self.arena[1] - self.arena[0]
        # Both None once closed.
        self.memfd: int | None
        self.mm: mmap.mmap | None
        try:
            self.memfd = os.memfd_create(f"guest_{arch.name}",
                                         os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
            os.ftruncate(self.memfd, size)
            # Guest code reaches the file through the agent: it may not
            # resize it (the host's mapping would fault).
            _seal(self.memfd, _F_SEAL_SHRINK | _F_SEAL_GROW | _F_SEAL_SEAL)
            self.mm = mmap.mmap(self.memfd, size, mmap.MAP_SHARED)
        except OSError as exc:
            raise EngineError(f"cannot make guest memory: {exc}",
                              field="engine", value=size) from None
        view = ctypes.c_char.from_buffer(self.mm)
        self.host_base = ctypes.addressof(view)
        del view
        #: the workbench plugin's results when agents load it
        #: (:func:`.tcg_plugin.request` in effect when the engine was made)
        mode = tcg_plugin.requested()
        self.instrument = tcg_plugin.Results(mode) if mode else None
        _ENGINES.add(self)

    def describe(self) -> str:
        what = self.profile.name if self.profile else "most capable model"
        if self.vlen:
            what += f", vector length {self.vlen} bits"
        return (f"qemu ({what}: {os.path.basename(self.program)} -cpu "
                f"{self.cpu_option})")

    def region(self, address: int, size: int) -> _Region:
        return _Region(self, address, size)

    def discard(self, address: int, size: int) -> None:
        """Free the pages of ``[address, address + size)`` (zeros again)."""
        if self.mm is not None and not self.forked:
            self.mm.madvise(mmap.MADV_REMOVE, address - self.arena[0], size)

    def new_cpu(self, space: Space) -> QemuCpu:
        if self.instrument is not None:
            tcg_plugin.attach(space, self.instrument)
        return QemuCpu(self, space)

    def setup(self, space: Space, slots: int) -> list[int]:
        # The space's first CPU started an agent, which set the slots.
        assert self.slots is not None
        return list(self.slots[:slots])

    def close(self) -> None:
        mm, self.mm = getattr(self, "mm", None), None
        if mm is not None:
            mm.close()
        fd = getattr(self, "memfd", None)
        if fd is not None:
            os.close(fd)
            self.memfd = None
        results = getattr(self, "instrument", None)
        if results is not None:
            results.close()
