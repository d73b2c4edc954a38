"""Target ``code``: hostile machine code in a valid kernel, run emulated.

The seeds are the sample executables ``hal_cpu/samples/*_<arch>.so``. A
case changes bytes inside the code of the export the child dispatches
(export 0: from its entry to the next function or the end of the
executable segment) and nothing else, so the file still loads and the
changed code runs. Each case applies one to three of:

* ``plant``: a planted Linux system-call sequence (:mod:`fuzz.asm`), at the
  export's entry (so it runs) or inside it: the number in the number
  register (:attr:`elfloader.arch.Arch.syscalls`), plausible arguments
  (paths, strings, ``sockaddr``\\ s and ``argv`` arrays carried after the
  code and found pc-relatively), the system-call instruction and a return.
  Most calls aim at the case's canaries (:class:`Canary`): ``openat`` with
  ``O_CREAT`` of a file in the case's directory, writes to, truncation,
  removal, renaming, linking and ``chmod`` of its canary file, ``mkdir``,
  ``execve`` of ``/bin/sh -c "touch <dir>/x"`` (and ``touch`` itself,
  ``execveat``), ``socket`` and ``connect`` to the run's TCP listener or
  the case's unix socket (on x86_32 also through ``socketcall``),
  ``kill``/``tgkill``/``pidfd_send_signal``/``ptrace`` of the run's
  ``sleep`` process, ``fork``, ``vfork``, ``clone`` (a process or a
  thread), ``io_uring_setup``, a read of the canary file. Others are calls
  the qemu engine's filter lets through, aimed at the engine itself
  (writes of forged replies and reads on the agent's descriptors,
  ``dup3`` over them, signals blocked then an endless loop, the request
  pipe found and replaced by ``/dev/null`` so that the agent's watchdog no
  longer hears its host end, ``munmap``, ``exit_group``); others a random
  number with plausible arguments (never
  one that takes a process id, or could harm the machine if it ran: see
  :data:`NEVER_RANDOM`); and on x86_64 the legacy ``vsyscall`` page and
  ``int 0x80``, on x86_32 ``sysenter``, on arm32 OABI ``svc`` numbers and
  the ARM private calls.
* ``insn``: one instruction of a list per architecture: system-call,
  trap, privileged and system-register instructions, indirect branches.
* ``words``: random instruction words (random bytes on x86).
* ``bytes``: random bytes.

A case is planned from ``(seed, index)`` alone (each mutation keeps the
seed of its own generator); its bytes also hold the run's canary values
(directory, port, process id), so a replay plans it again against new
canaries. Only the emulated backend runs these cases: on the native one
the code would run on this machine.

After each case the parent checks the canaries (:meth:`Canary.check`):
nothing new in the case's directory or the run's directory, the canary
file unchanged, nothing accepted by the listeners, the ``sleep`` process
alive, not stopped and not traced, no process adopted by the fuzzer
(it is the children's subreaper) still alive, no process of the case's
guest agents' sessions left. Any of these is a ``breach``.
"""

from __future__ import annotations

import ctypes
import os
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import time

from elfloader.backend.emulated import syscalls as sysnames

from .asm import ASSEMBLERS, Program

#: libseccomp's system-call table of each architecture.
TABLES = {"x86_64": "x86_64", "x86_32": "x86", "aarch64": "aarch64", "arm32": "arm",
          "riscv64": "riscv64", "riscv32": "riscv64"}

AT_FDCWD = -100
O_WRONLY, O_RDWR, O_CREAT, O_TRUNC, O_APPEND = 1, 2, 0o100, 0o1000, 0o2000
AF_UNIX, AF_INET, SOCK_STREAM = 1, 2, 1
SIGKILL, SIGTERM, SIGSTOP, SIGCHLD, SIGUSR1 = 9, 15, 19, 17, 10
PTRACE_ATTACH, PTRACE_SEIZE = 16, 0x4206
CLONE_THREAD_FLAGS = 0x100 | 0x200 | 0x400 | 0x800 | 0x10000 | 0x40000
SECRET = b"pkr-canary-secret-0123456789"     # contents of the canary file

#: Never drawn as a random number (their first argument is a process id,
#: or they change the machine: if a filter let one through, a random
#: argument could reach a process or setting of this shared host). The
#: deliberate calls aim only at the canaries.
NEVER_RANDOM = frozenset((
    "kill", "tkill", "tgkill", "rt_sigqueueinfo", "rt_tgsigqueueinfo",
    "pidfd_open", "pidfd_send_signal", "pidfd_getfd", "ptrace", "process_vm_readv",
    "process_vm_writev", "process_madvise", "process_mrelease", "kcmp", "setpgid",
    "setpriority", "sched_setscheduler", "sched_setparam", "sched_setaffinity",
    "sched_setattr", "prlimit64", "ioprio_set", "migrate_pages", "move_pages",
    "perf_event_open", "reboot", "kexec_load", "kexec_file_load", "init_module",
    "finit_module", "delete_module", "swapon", "swapoff", "mount", "umount",
    "umount2", "pivot_root", "settimeofday", "clock_settime", "clock_settime64",
    "clock_adjtime", "clock_adjtime64", "adjtimex", "stime", "sethostname",
    "setdomainname", "syslog", "acct", "quotactl", "quotactl_fd", "vhangup",
    "iopl", "ioperm", "bpf", "keyctl", "add_key", "request_key", "nfsservctl",
    "fanotify_init", "fanotify_mark", "open_by_handle_at", "name_to_handle_at",
    "mount_setattr", "fsopen", "fsmount", "fsconfig", "move_mount", "open_tree",
    "waitid", "wait4", "waitpid", "setns", "lookup_dcookie", "sysctl", "_sysctl",
    "ipc", "msgctl", "semctl", "shmctl", "socketcall", "ioctl", "fcntl", "fcntl64",
    "landlock_restrict_self", "set_mempolicy_home_node", "mbind",
))


def nr(arch: str, name: str) -> int | None:
    return sysnames.number(TABLES[arch], name)


# --- the export's code ---------------------------------------------------------------
def export_range(model) -> tuple[int, int, int]:
    """``(file offset, end offset, vaddr)`` of export 0's code: from its
    entry to the next function the image knows of (the query function,
    other exports) or the end of its segment's file bytes."""
    ptrs = sorted((s for s in model.sites if s.name.startswith("library.exports.ptrs[")),
                  key=lambda s: int(s.name.rsplit("[", 1)[1].rstrip("]")))
    if not ptrs:
        raise ValueError(f"{model.name}: no export pointers (struct sites missing)")
    entry = ptrs[0].field.value & ~1
    starts = {p.field.value & ~1 for p in ptrs} | set(model.image.exports.values())
    for seg in model.image.segments:
        if seg.vaddr <= entry < seg.vaddr + seg.filesz:
            end = seg.vaddr + seg.filesz
            break
    else:
        raise ValueError(f"{model.name}: export 0 at {entry:#x} is not in the file")
    end = min([end] + [a for a in starts if entry < a < end])
    off = model.file_offset(entry)
    return model.base + off, model.base + off + (end - entry), entry


# --- environments --------------------------------------------------------------------
def placeholder_env(index: int) -> dict:
    """Canary values for planning without canaries (tests, listings): a
    directory that does not exist, the discard port, a process id above
    any ``pid_max``."""
    return {"dir": f"/nonexistent/pkc/{index}", "port": 9, "pid": 0x3FFFFFF0,
            "secret_len": len(SECRET)}


# --- planted sequences -------------------------------------------------------------
def _cstr(s) -> bytes:
    return (s.encode() if isinstance(s, str) else s) + b"\0"


def _sockaddr_in(port: int) -> bytes:
    return (AF_INET).to_bytes(2, "little") + port.to_bytes(2, "big") + \
        bytes([127, 0, 0, 1]) + bytes(8)


def _sockaddr_un(path: str) -> bytes:
    return (AF_UNIX).to_bytes(2, "little") + _cstr(path)


class Plant:
    """Builds one planted sequence for ``arch`` against ``env``."""

    def __init__(self, arch: str, env: dict, rng: random.Random):
        self.arch, self.env, self.rng = arch, env, rng
        self.p = Program(ASSEMBLERS[arch])
        self.d = env["dir"]
        self.keep = f"{self.d}/keep"
        self.sock = f"{self.d}/sock"

    def a(self, i):
        return self.p.arg(i)

    def call(self, name, *args):
        """Arguments (ints, or ``("ptr", label)``/``("buf",)``/``("ret",)``),
        then the call. Arrays and buffers first: they use scratch registers."""
        p, number = self.p, nr(self.arch, name)
        if number is None:
            raise LookupError(name)
        for i, v in enumerate(args):
            if isinstance(v, tuple) and v[0] == "array":
                p.array(self.a(i), v[1])
            elif isinstance(v, tuple) and v[0] == "buf":
                p.buffer(self.a(i))
        if any(isinstance(v, tuple) and v[0] == "ret" for v in args):
            i = next(i for i, v in enumerate(args) if isinstance(v, tuple) and v[0] == "ret")
            p.ret_to(self.a(i))
        for i, v in enumerate(args):
            if isinstance(v, int):
                p.li(self.a(i), v)
            elif v[0] == "ptr":
                p.adr(self.a(i), v[1])
        p.syscall(number)
        return self

    def s(self, label, text) -> tuple:
        self.p.string(label, _cstr(text) if not isinstance(text, bytes) else text)
        return ("ptr", label)

    def has(self, *names) -> bool:
        return all(nr(self.arch, n) is not None for n in names)


def _new_file(pl: Plant) -> str:
    return f"{pl.d}/{pl.rng.choice(['n', 'new', 'x', '.h', 'keep~'])}"


def c_openat_create(pl):
    flags = O_WRONLY | O_CREAT | pl.rng.choice([0, O_TRUNC, 0o200])   # O_EXCL
    pl.call("openat", AT_FDCWD, pl.s("p", _new_file(pl)), flags, 0o644)
    return "openat(AT_FDCWD, <dir>/new, O_CREAT|O_WRONLY)"


def c_open_create(pl):
    if not pl.has("open"):
        return c_openat_create(pl)
    if pl.rng.random() < 0.3 and pl.has("creat"):
        pl.call("creat", pl.s("p", _new_file(pl)), 0o644)
        return "creat(<dir>/new)"
    pl.call("open", pl.s("p", _new_file(pl)), O_WRONLY | O_CREAT, 0o600)
    return "open(<dir>/new, O_CREAT|O_WRONLY)"


def c_openat_trunc(pl):
    pl.call("openat", AT_FDCWD, pl.s("p", pl.keep), O_WRONLY | O_TRUNC, 0)
    return "openat(<dir>/keep, O_WRONLY|O_TRUNC)"


def c_open_write(pl):
    pl.call("openat", AT_FDCWD, pl.s("p", pl.keep), O_RDWR | O_APPEND, 0)
    pl.call("write", ("ret",), pl.s("m", b"pwned\n"), 6)
    pl.p.ret()
    return "openat(<dir>/keep, O_RDWR|O_APPEND) + write"


def c_open_read(pl):
    """Read the canary file; the export returns read()'s result, which is
    the file's length only when the read worked."""
    pl.call("openat", AT_FDCWD, pl.s("p", pl.keep), 0, 0)
    pl.call("read", ("ret",), ("buf",), 64)
    pl.p.ret()
    return "openat(<dir>/keep, O_RDONLY) + read (returns its count)"


def c_unlink(pl):
    if pl.rng.random() < 0.3 and pl.has("unlink"):
        pl.call("unlink", pl.s("p", pl.keep))
        return "unlink(<dir>/keep)"
    pl.call("unlinkat", AT_FDCWD, pl.s("p", pl.keep), 0)
    return "unlinkat(AT_FDCWD, <dir>/keep, 0)"


def c_rename(pl):
    dst = pl.rng.choice([f"{pl.d}/moved", f"{pl.d}/../moved-{pl.d.rsplit('/', 1)[1]}"])
    if pl.has("renameat") and pl.rng.random() < 0.6:
        pl.call("renameat", AT_FDCWD, pl.s("p", pl.keep), AT_FDCWD, pl.s("q", dst))
        return "renameat(<dir>/keep, <dir>/moved)"
    pl.call("renameat2", AT_FDCWD, pl.s("p", pl.keep), AT_FDCWD, pl.s("q", dst),
            pl.rng.choice([0, 1]))              # RENAME_NOREPLACE
    return "renameat2(<dir>/keep, <dir>/moved)"


def c_mkdir(pl):
    pl.call("mkdirat", AT_FDCWD, pl.s("p", f"{pl.d}/d"), 0o755)
    return "mkdirat(<dir>/d)"


def c_link(pl):
    if pl.rng.random() < 0.5:
        pl.call("linkat", AT_FDCWD, pl.s("p", pl.keep), AT_FDCWD, pl.s("q", f"{pl.d}/l"), 0)
        return "linkat(<dir>/keep, <dir>/l)"
    pl.call("symlinkat", pl.s("p", "/etc/passwd"), AT_FDCWD, pl.s("q", f"{pl.d}/l"))
    return "symlinkat(/etc/passwd, <dir>/l)"


def c_chmod(pl):
    if pl.rng.random() < 0.5:
        pl.call("fchmodat", AT_FDCWD, pl.s("p", pl.keep), 0o4777)
        return "fchmodat(<dir>/keep, 04777)"
    pl.call("truncate", pl.s("p", pl.keep), 0)
    return "truncate(<dir>/keep, 0)"


def c_mknod(pl):
    pl.call("mknodat", AT_FDCWD, pl.s("p", f"{pl.d}/f"), 0o10644, 0)    # S_IFIFO
    return "mknodat(<dir>/f, S_IFIFO)"


def _argv(pl, *words):
    items = [pl.s(f"a{i}", w) for i, w in enumerate(words)]
    return ("array", items + [("int", 0)])


def c_execve_sh(pl):
    argv = _argv(pl, "/bin/sh", "-c", f"touch {pl.d}/x")
    pl.call("execve", ("ptr", "a0"), argv, 0)
    return 'execve("/bin/sh", ["/bin/sh", "-c", "touch <dir>/x"], NULL)'


def c_execve_touch(pl):
    argv = _argv(pl, "/usr/bin/touch", f"{pl.d}/x")
    if pl.rng.random() < 0.3:
        pl.call("execveat", AT_FDCWD, ("ptr", "a0"), argv, 0, 0)
        return 'execveat(AT_FDCWD, "/usr/bin/touch", [.., "<dir>/x"])'
    pl.call("execve", ("ptr", "a0"), argv, 0)
    return 'execve("/usr/bin/touch", ["/usr/bin/touch", "<dir>/x"], NULL)'


def _socket(pl, family, addr: bytes, what: str):
    if pl.arch == "x86_32" and pl.rng.random() < 0.5:
        # socketcall(SYS_SOCKET, [family, SOCK_STREAM, 0]), then
        # socketcall(SYS_CONNECT, [fd, &addr, len])
        pl.s("sa", addr)
        pl.call("socketcall", 1, ("array", [("int", family), ("int", SOCK_STREAM),
                                            ("int", 0)]))
        pl.call("socketcall", 3, ("array", [("ret",), ("ptr", "sa"), ("int", len(addr))]))
        pl.p.ret()
        return f"socketcall(SYS_SOCKET/SYS_CONNECT) to {what}"
    pl.call("socket", family, SOCK_STREAM, 0)
    pl.call("connect", ("ret",), pl.s("sa", addr), len(addr))
    pl.p.ret()
    return f"socket + connect to {what}"


def c_connect_tcp(pl):
    return _socket(pl, AF_INET, _sockaddr_in(pl.env["port"]), "the TCP listener")


def c_connect_unix(pl):
    return _socket(pl, AF_UNIX, _sockaddr_un(pl.sock), "<dir>/sock")


def c_kill(pl):
    sig = pl.rng.choice([SIGKILL, SIGTERM, SIGSTOP])
    pid = pl.env["pid"]
    r = pl.rng.random()
    if r < 0.5:
        pl.call("kill", pid, sig)
        return f"kill(sleeper, {sig})"
    if r < 0.75:
        pl.call("tgkill", pid, pid, sig)
        return f"tgkill(sleeper, sleeper, {sig})"
    pl.call("pidfd_open", pid, 0)
    pl.call("pidfd_send_signal", ("ret",), sig, 0, 0)
    pl.p.ret()
    return f"pidfd_open(sleeper) + pidfd_send_signal({sig})"


def c_ptrace(pl):
    req = pl.rng.choice([PTRACE_ATTACH, PTRACE_SEIZE])
    pl.call("ptrace", req, pl.env["pid"], 0, 0)
    return f"ptrace({req:#x}, sleeper)"


def c_fork(pl):
    r = pl.rng.random()
    if r < 0.25 and pl.has("fork"):
        pl.call("fork")
        return "fork()"
    if r < 0.4 and pl.has("vfork"):
        pl.call("vfork")
        return "vfork()"
    if r < 0.75:
        pl.call("clone", SIGCHLD, 0, 0, 0, 0)
        return "clone(SIGCHLD, 0): a process"
    pl.call("clone", CLONE_THREAD_FLAGS, 0, 0, 0, 0)
    return "clone(CLONE_VM|CLONE_THREAD|..., 0): a thread on the same stack"


def c_io_uring(pl):
    pl.call("io_uring_setup", 4, ("buf",))
    return "io_uring_setup(4, stack)"


def c_engine_fds(pl):
    """Calls the qemu engine's filter allows, aimed at its agent."""
    r = pl.rng.random()
    fd = pl.rng.randrange(0, 12)
    if r < 0.3:
        forged = bytes(pl.rng.randrange(256) for _ in range(pl.rng.choice([8, 16, 24, 40])))
        pl.call("write", fd, pl.s("m", forged), len(forged))
        return f"write({fd}, {len(forged)} forged bytes)"
    if r < 0.5:
        pl.call("read", fd, ("buf",), 64)
        pl.p.ret()
        return f"read({fd}, stack, 64)"
    if r < 0.7:
        # every descriptor up to 12 becomes a copy of stdin (/dev/null):
        # the agent's pipes and watchdog see nothing any more; then loop
        for k in range(3, 12):
            pl.p.li(pl.a(0), 0).li(pl.a(1), k).li(pl.a(2), 0).syscall(nr(pl.arch, "dup3"))
        pl.p.emit(pl.p.asm.loop())
        return "dup3(0, 3..11) then an endless loop"
    if r < 0.85:
        pl.call("close", fd)
        return f"close({fd})"
    pl.call("exit_group", pl.rng.choice([0, 1, 139]))
    return "exit_group()"


def c_orphan(pl):
    """Make the agent deaf to its host, then loop: (block every signal,)
    turn each descriptor that refuses a zero-byte write (the request
    pipe's read end, which the agent's watchdog polls for its host's end)
    into a copy of /dev/null, and loop forever."""
    from .asm import dup_over_read_ends
    blocked = pl.rng.random() < 0.7
    if blocked:
        pl.p.string("all", b"\xff" * 8)
        pl.call("rt_sigprocmask", 0, ("ptr", "all"), 0, 8)
    pl.p.emit(dup_over_read_ends(pl.arch, 3, 64, nr(pl.arch, "write"), nr(pl.arch, "dup3")))
    pl.p.emit(pl.p.asm.loop())
    return ("rt_sigprocmask(SIG_BLOCK, all), " if blocked else "") + \
        "dup3(0, k) over every read-only descriptor 3..63, then an endless loop"


def c_signals(pl):
    """Block every signal (the host's stop request too), then loop."""
    pl.p.string("all", b"\xff" * 8)
    pl.call("rt_sigprocmask", 0, ("ptr", "all"), 0, 8)     # SIG_BLOCK
    if pl.rng.random() < 0.5:
        pl.p.emit(pl.p.asm.loop())
        return "rt_sigprocmask(SIG_BLOCK, all) then an endless loop"
    return "rt_sigprocmask(SIG_BLOCK, all)"


def c_memory(pl):
    r = pl.rng.random()
    length = pl.rng.choice([1 << 20, 1 << 30, 1 << 31])
    base = pl.rng.choice([0, 0x10000, 0x100000, 0x400000])
    if r < 0.5:
        pl.call("munmap", base, length)
        return f"munmap({base:#x}, {length:#x})"
    pl.call("mprotect", base, length, pl.rng.choice([0, 7]))
    return f"mprotect({base:#x}, {length:#x})"


def c_random(pl):
    """A random number (not one of :data:`NEVER_RANDOM`) with plausible
    arguments: canary paths, a stack buffer, small numbers, sizes."""
    rng, table = pl.rng, TABLES[pl.arch]
    for _ in range(50):
        r = rng.random()
        if r < 0.8:
            number = rng.randrange(0, 460)
        elif r < 0.9 and pl.arch == "x86_64":
            number = 0x40000000 | rng.randrange(0, 548)         # x32 numbers
        else:
            number = rng.choice([460, 511, 1000, 0xFFFF, 0x7FFFFFFF, 0xF0000 + rng.randrange(8)])
        name = sysnames.name(table, number)
        if name not in NEVER_RANDOM:
            break
    else:
        number, name = nr(pl.arch, "getppid"), "getppid"
    pool = [("ptr", "p"), ("buf",), 0, 1, 2, 0x41, 0o644, 64, 4096, AT_FDCWD]
    pl.s("p", _new_file(pl))
    args = [rng.choice([("ptr", "p"), ("buf",)])]      # never a small first argument
    args += [rng.choice(pool) for _ in range(rng.randrange(6))]
    p = pl.p
    for i, v in enumerate(args):
        if isinstance(v, tuple) and v[0] == "buf":
            p.buffer(pl.a(i))
    for i, v in enumerate(args):
        if isinstance(v, int):
            p.li(pl.a(i), v)
        elif v[0] == "ptr":
            p.adr(pl.a(i), v[1])
    p.syscall(number)
    return f"system call {number:#x} ({name or 'no such call'}) with {len(args)} arguments"


def c_alt_entry(pl):
    """The other ways into a kernel: x86_64 ``int 0x80`` (the i386 table)
    and the vsyscall page, x86_32 ``sysenter``, arm32 OABI ``svc`` and the
    ARM private calls."""
    p, rng = pl.p, pl.rng
    if pl.arch == "x86_64":
        if rng.random() < 0.5:
            pl.s("p", _new_file(pl))
            p.adr(3, "p").li(1, O_WRONLY | O_CREAT).li(2, 0o644).li(0, 5)   # ebx ecx edx; open
            p.emit(b"\xcd\x80").ret()
            return "int 0x80 open(<dir>/new, O_CREAT) from 64-bit code"
        entry = 0xFFFFFFFFFF600000 + rng.choice([0, 0x400, 0x800])
        p.buffer(7).li(6, 0).li(11, entry).emit(p.asm.call_reg(11)).ret()
        return f"call vsyscall {entry:#x}"
    if pl.arch == "x86_32":
        pl.s("p", _new_file(pl))
        p.adr(3, "p").li(1, O_WRONLY | O_CREAT).li(2, 0o644).li(0, 5)
        p.emit(rng.choice([b"\x0f\x34", b"\x0f\x05"])).ret()
        return "sysenter/syscall open(<dir>/new, O_CREAT) from 32-bit code"
    if pl.arch == "arm32":
        if rng.random() < 0.6:
            number, what = rng.choice([(5, "open"), (39, "mkdir"), (10, "unlink"),
                                       (37, "kill"), (2, "fork")])
            if what == "kill":
                p.li(0, pl.env["pid"]).li(1, SIGKILL)
            elif what == "open":
                pl.s("p", _new_file(pl))
                p.adr(0, "p").li(1, O_WRONLY | O_CREAT).li(2, 0o644)
            elif what in ("mkdir", "unlink"):
                pl.s("p", f"{pl.d}/d" if what == "mkdir" else pl.keep)
                p.adr(0, "p").li(1, 0o755)
            p.emit(p.asm.syscall(0x900000 + number)).ret()
            return f"OABI svc #{0x900000 + number:#x} ({what})"
        private = 0xF0000 + rng.randrange(1, 7)
        p.li(0, 0).li(1, 0x1000).li(2, 0).syscall(private).ret()
        return f"ARM private call {private:#x}"
    return c_random(pl)


CALLS = [  # (builder, weight)
    (c_openat_create, 8), (c_open_create, 3), (c_openat_trunc, 3), (c_open_write, 3),
    (c_open_read, 3), (c_unlink, 5), (c_rename, 4), (c_mkdir, 3), (c_link, 2),
    (c_chmod, 2), (c_mknod, 1), (c_execve_sh, 6), (c_execve_touch, 3),
    (c_connect_tcp, 5), (c_connect_unix, 4), (c_kill, 6), (c_ptrace, 2), (c_fork, 5),
    (c_io_uring, 1), (c_engine_fds, 6), (c_orphan, 3), (c_signals, 2), (c_memory, 2),
    (c_random, 10), (c_alt_entry, 3),
]


CALL_BY_NAME = {fn.__name__[2:]: fn for fn, _ in CALLS}


def _pick(rng, table):
    total = sum(w for _, w in table)
    x = rng.random() * total
    for fn, w in table:
        x -= w
        if x < 0:
            return fn
    return table[-1][0]


def build_plant(arch: str, env: dict, rng: random.Random, fn=None) -> tuple[str, bytes]:
    """One planted sequence: (description, bytes)."""
    fn = fn or _pick(rng, CALLS)
    pl = Plant(arch, env, rng)
    try:
        what = fn(pl)
    except LookupError:             # a call this architecture does not have
        fn, pl = c_random, Plant(arch, env, rng)
        what = fn(pl)
    p = pl.p
    if not p.code or p.code[-1] not in (p.asm.ret(), p.asm.loop()):
        p.ret()
    return f"{fn.__name__[2:]}: {what}", p.assemble()


# --- single instructions --------------------------------------------------------------
INSNS = {
    "x86_64": ["0f05", "cd80", "0f34", "cc", "f4", "0f0b", "0fa2", "0f31", "e400", "ee", "cf",
               "0f01d0", "0f01f9", "65488b042500000000", "64488b042528000000", "0f01c1",
               "ffe0", "ffd0", "c3", "cd03", "cd81", "f1", "0f00c0", "fa", "9c58", "0f20c0"],
    "x86_32": ["cd80", "0f34", "0f05", "cc", "f4", "0f0b", "0fa2", "0f31", "65a100000000",
               "ea000000003300", "9a000000002300", "cf", "ffe0", "ffd0", "c3", "cd81", "fa",
               "0f20c0", "8ee0"],
    "aarch64": [0xD4000001, 0xD4000021, 0xD4000002, 0xD4000003, 0xD4200000, 0xD4400000,
                0x00000000, 0xD503207F, 0xD53BD040, 0xD51BD040, 0xD53BE040, 0xD5380000,
                0xD50B7420, 0xD50B7520, 0xD65F03C0, 0xD61F0000, 0xD63F0000, 0xD69F03E0,
                0xD51B4200, 0xD5033FDF],
    "arm32": [0xEF000000, 0xEF900005, 0xEF9F0002, 0xEF0F0005, 0xE1200070, 0xE7F000F0,
              0xEE1D0F70, 0xEE0D0F70, 0xE320F003, 0xE12FFF1E, 0xE12FFF30, 0xE12FFF10,
              0xF1010200, 0xF10C0080, 0xE1600070, 0xE1400070, 0xEE100F10],
    "riscv64": [0x00000073, 0x00100073, 0x30200073, 0x10200073, 0x10500073, 0xC0002573,
                0xC0102573, 0x30002573, 0x0000100F, 0x00009002, 0x00000000, 0x00050067,
                0x00008067, 0x18051073],
}
INSNS["riscv32"] = INSNS["riscv64"]


def _insn_bytes(arch: str, item) -> bytes:
    if isinstance(item, str):
        return bytes.fromhex(item)
    return int(item).to_bytes(4, "little")


# --- cases -----------------------------------------------------------------------------
#: Mutation kinds of a ``code`` case, with weights.
KINDS = (("plant", 7), ("insn", 2), ("words", 2), ("bytes", 1))
#: Bytes a planted sequence may need: it starts no later than this
#: before the export's end, else at the entry.
STEP = {"x86_64": 1, "x86_32": 1, "aarch64": 4, "arm32": 4, "riscv64": 2, "riscv32": 2}


def plan(rng: random.Random) -> list[dict]:
    """The mutations of one case, without bytes: each kind and the seed of
    its own generator (a ``plant`` may also name its ``call``, one of
    :data:`CALL_BY_NAME`)."""
    count = rng.choice([1, 1, 1, 1, 2, 2, 2, 3])
    out = []
    for _ in range(count):
        total = sum(w for _, w in KINDS)
        x, kind = rng.random() * total, KINDS[-1][0]
        for k, w in KINDS:
            x -= w
            if x < 0:
                kind = k
                break
        out.append({"kind": kind, "seed": rng.getrandbits(48)})
    # the plants run first: at the entry when one is there
    return sorted(out, key=lambda m: m["kind"] != "plant")


def materialize(plans: list[dict], arch: str, region: tuple[int, int, int],
                env: dict) -> list[tuple[str, list]]:
    """Mutations ``(description, ops)`` of ``plans`` for a seed whose
    export 0 occupies file bytes ``region[0]:region[1]``."""
    start, end, vaddr = region
    size = end - start
    step = STEP[arch]
    out = []
    entry_taken = False
    taken: list[tuple[int, int]] = []          # planted ranges, relative
    for m in plans:
        rng = random.Random(m["seed"])
        kind = m["kind"]
        if kind == "plant":
            fn = CALL_BY_NAME.get(m.get("call"))
            for _ in range(8):
                desc, raw = build_plant(arch, env, rng, fn)
                if len(raw) <= size:
                    break
            else:
                desc, raw = build_plant(arch, env, rng, c_random)
            at_entry = (not entry_taken and rng.random() < 0.8
                        and all(len(raw) <= a for a, _ in taken)) or m.get("at") == "entry"
            room = size - len(raw)
            free = [p for p in range(0, max(room, 0) + 1, step)
                    if all(p + len(raw) <= a or p >= b for a, b in taken)]
            if at_entry or room < step:
                pos = 0
            else:
                pos = rng.choice(free) if free else rng.randrange(0, room + 1, step)
            entry_taken = entry_taken or pos == 0
            taken.append((pos, pos + len(raw)))
            raw = raw[:size]
            where = "entry" if pos == 0 else f"entry+{pos:#x}"
            out.append((f"plant at {where}: {desc}", [("set", start + pos, raw)]))
        elif kind == "insn":
            raw = _insn_bytes(arch, rng.choice(INSNS[arch]))
            pos = rng.choice([0, rng.randrange(0, max(1, size - len(raw)), step)])
            out.append((f"insn at entry+{pos:#x}: {raw.hex()}", [("set", start + pos, raw)]))
        elif kind == "words":
            n = rng.choice([1, 1, 2, 4])
            ops = []
            for _ in range(n):
                width = rng.choice([1, 2, 3, 4, 6]) if step == 1 else 4
                pos = rng.randrange(0, max(1, size - width), step)
                ops.append(("set", start + pos, bytes(rng.randrange(256) for _ in range(width))))
            out.append((f"{n} random words at "
                        + ",".join(f"entry+{o[1] - start:#x}" for o in ops), ops))
        else:
            n = rng.choice([1, 2, 4, 8, 16])
            ops = [("set", start + rng.randrange(size), bytes([rng.randrange(256)]))
                   for _ in range(n)]
            out.append((f"{n} random bytes in export 0", ops))
    return out


# --- canaries ------------------------------------------------------------------------
_PR_SET_CHILD_SUBREAPER, _PR_SET_PDEATHSIG = 36, 1


def _prctl(option: int, value: int) -> int:
    libc = ctypes.CDLL(None, use_errno=True)
    return libc.prctl(option, value, 0, 0, 0)


def _die_with_parent() -> None:
    _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def _proc_stat(pid: int):
    """(ppid, session, state, comm) of ``pid``, or None."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read().decode("utf-8", "replace")
    except OSError:
        return None
    head, _, rest = raw.rpartition(")")
    comm = head.split("(", 1)[1] if "(" in head else "?"
    fields = rest.split()
    try:
        return int(fields[1]), int(fields[3]), fields[0], comm
    except (IndexError, ValueError):
        return None


def _sleeper_status(pid: int) -> tuple[int, tuple]:
    """(TracerPid, (voluntary, involuntary context switches)) of ``pid``."""
    tracer, switches = 0, [None, None]
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("TracerPid:"):
                    tracer = int(line.split()[1])
                elif line.startswith("voluntary_ctxt_switches:"):
                    switches[0] = int(line.split()[1])
                elif line.startswith("nonvoluntary_ctxt_switches:"):
                    switches[1] = int(line.split()[1])
    except (OSError, ValueError):
        pass
    return tracer, tuple(switches)


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode("utf-8", "replace").strip()[:200]
    except OSError:
        return "?"


def _processes():
    for name in os.listdir("/proc"):
        if name.isdigit():
            st = _proc_stat(int(name))
            if st is not None:
                yield int(name), st


class Canary:
    """The run's canaries, in the fuzzer's process: a directory (one
    subdirectory per case, holding a canary file ``keep`` and a listening
    unix socket ``sock``), a TCP listener on 127.0.0.1 and a ``sleep``
    process. The fuzzer becomes the subreaper of its descendants, so a
    process a case leaves behind becomes its child."""

    def __init__(self):
        self.me = os.getpid()
        self.root = tempfile.mkdtemp(prefix="k", dir="/tmp")
        self.tcp = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.tcp.bind(("127.0.0.1", 0))
        self.tcp.listen(16)
        self.tcp.setblocking(False)
        self.port = self.tcp.getsockname()[1]
        self.sleeper = None
        self._start_sleeper()
        self.subreaper = _prctl(_PR_SET_CHILD_SUBREAPER, 1) == 0
        self.cases: dict[str, dict] = {}     # case id -> what prepare() made
        self.known_agents: set[int] = set()
        self.ended: set[int] = set()          # left-behind processes this ended
        self.adopted: list[dict] = []

    def _start_sleeper(self) -> None:
        self.sleeper = subprocess.Popen(["sleep", "1000000"], stdin=subprocess.DEVNULL,
                                        stdout=subprocess.DEVNULL,
                                        stderr=subprocess.DEVNULL,
                                        preexec_fn=_die_with_parent)
        # once asleep, its count of context switches stays put
        deadline = time.monotonic() + 5
        last = None
        while time.monotonic() < deadline:
            st = _proc_stat(self.sleeper.pid)
            now = _sleeper_status(self.sleeper.pid)[1]
            if st is not None and st[2] == "S" and st[3] == "sleep" and now == last:
                break
            last = now
            time.sleep(0.02)
        self.sleeper_switches = last

    def env(self, index: int) -> dict:
        return {"dir": f"{self.root}/{index:x}", "port": self.port,
                "pid": self.sleeper.pid, "secret_len": len(SECRET)}

    # --- per case ---------------------------------------------------------------
    def prepare(self, case: dict) -> None:
        d = case["canary"]["dir"]
        if os.path.lexists(d):          # a replay or a reduction of the case
            _remove(d)
        os.makedirs(d)
        keep = os.path.join(d, "keep")
        with open(keep, "wb") as f:
            f.write(SECRET)
        os.chmod(keep, 0o600)
        unix = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        unix.bind(os.path.join(d, "sock"))
        unix.listen(4)
        unix.setblocking(False)
        self.cases[case["id"]] = {"dir": d, "unix": unix, "keep": self._stat(keep),
                                  "dir_stat": self._stat(d)}

    @staticmethod
    def _stat(path):
        st = os.lstat(path)
        return (st.st_ino, st.st_mode, st.st_size, st.st_nlink, st.st_uid, st.st_mtime_ns)

    def check(self, case: dict, agents: list[int], running: dict[str, int],
              all_agents: set[int]) -> list[str]:
        """What the case changed on the host (empty: nothing). ``agents``:
        the case's guest agent processes; ``running``: case id -> child
        process id of the cases still running; ``all_agents``: the agents
        of every case so far (running ones included)."""
        out = []
        made = self.cases.pop(case["id"], None)
        if made is None:
            return ["canaries of the case were not prepared"]
        d = made["dir"]
        # the case's directory and canary file
        try:
            names = sorted(os.listdir(d))
        except OSError as exc:
            names = None
            out.append(f"canary directory unreadable: {exc}")
        if names is not None and names != ["keep", "sock"]:
            extra = sorted(set(names) - {"keep", "sock"})
            gone = sorted({"keep", "sock"} - set(names))
            out.append(f"canary directory changed: new {extra}, gone {gone}")
        keep = os.path.join(d, "keep")
        try:
            if self._stat(keep) != made["keep"]:
                out.append(f"canary file metadata changed: {made['keep']} -> "
                           f"{self._stat(keep)}")
            with open(keep, "rb") as f:
                if f.read() != SECRET:
                    out.append("canary file contents changed")
        except OSError as exc:
            if names is None or "keep" in names:
                out.append(f"canary file unreadable: {exc}")
        # the run's directory: only the case directories
        extra = [n for n in os.listdir(self.root)
                 if not os.path.isdir(os.path.join(self.root, n))
                 or n.startswith("moved")]
        if extra:
            out.append(f"new entries in the run's canary directory: {sorted(extra)}")
            for n in extra:
                _remove(os.path.join(self.root, n))
        # listeners
        for what, sock in (("TCP listener", self.tcp), ("unix socket", made["unix"])):
            try:
                conn, peer = sock.accept()
                out.append(f"the {what} accepted a connection from {peer!r}")
                conn.close()
            except (BlockingIOError, InterruptedError):
                pass
            except OSError as exc:
                out.append(f"the {what} failed: {exc}")
        made["unix"].close()
        # the sleeper
        out += self._check_sleeper()
        # processes left behind
        self.known_agents.update(agents)
        self.known_agents.update(all_agents)
        out += self._check_processes(agents, running)
        if not out:
            shutil.rmtree(d, ignore_errors=True)
        return out

    def _check_sleeper(self) -> list[str]:
        out = []
        code = self.sleeper.poll()
        if code is not None:
            out.append(f"the sleep process {self.sleeper.pid} ended (status {code})")
            self._start_sleeper()
            return out
        st = _proc_stat(self.sleeper.pid)
        tracer, switches = _sleeper_status(self.sleeper.pid)
        if st is not None and st[2] in ("T", "t") or tracer:
            out.append(f"the sleep process {self.sleeper.pid} is stopped or traced "
                       f"(state {st[2] if st else '?'}, tracer {tracer})")
        elif switches != self.sleeper_switches:
            # asleep in one nanosleep, it runs only when something reaches
            # it: a signal, a ptrace attach (even one since detached)
            out.append(f"the sleep process {self.sleeper.pid} was woken (context "
                       f"switches {self.sleeper_switches} -> {switches}): signalled "
                       f"or traced")
        if out:
            self.sleeper.kill()
            self.sleeper.wait()
            self._start_sleeper()
        return out

    def _check_processes(self, agents: list[int], running: dict[str, int],
                         grace: float = 3.0) -> list[str]:
        out = []
        sessions = set(agents)
        deadline = time.monotonic() + grace
        while True:
            left = []
            for pid, (ppid, sid, state, comm) in _processes():
                if pid in (self.me, self.sleeper.pid):
                    continue
                ours = ppid == self.me and pid not in running.values()
                if not ours and sid not in sessions:
                    continue
                if state == "Z" and ppid == self.me:
                    try:
                        os.waitpid(pid, os.WNOHANG)
                    except ChildProcessError:
                        pass
                    # an agent leads a session of its own (started with
                    # one); a process forked from one shares its session
                    agent = pid in self.known_agents or (
                        sid == pid and comm.startswith("qemu-"))
                    if not agent and pid not in self.ended:
                        out.append(f"a process that was not a guest agent ended under "
                                   f"the fuzzer: pid {pid} ({comm}), session {sid}")
                    continue
                if state == "Z":
                    continue
                left.append((pid, ppid, sid, state, comm))
            if not left or time.monotonic() >= deadline:
                break
            time.sleep(0.05)
        for pid, ppid, sid, state, comm in left:
            whose = "a guest agent of this case" if pid in sessions else \
                "a guest agent" if pid in self.known_agents else "a process"
            out.append(f"{whose} outlived its case: pid {pid} ({comm}: {_cmdline(pid)}), "
                       f"parent {ppid}, session {sid}, state {state}"
                       + (f"; cases running meanwhile: {sorted(running)}" if running else ""))
            self.adopted.append({"pid": pid, "comm": comm, "session": sid})
            if ppid == self.me or sid in sessions:
                try:                    # a descendant of this fuzzer: end it
                    os.kill(pid, signal.SIGKILL)
                    self.ended.add(pid)
                except ProcessLookupError:
                    pass
        return out

    def close(self) -> None:
        for made in self.cases.values():
            made["unix"].close()
        self.cases.clear()
        self.tcp.close()
        if self.sleeper is not None and self.sleeper.poll() is None:
            self.sleeper.kill()
            self.sleeper.wait()
        # reap what was adopted meanwhile
        for pid, (ppid, _, state, _) in list(_processes()):
            if ppid == self.me and state == "Z":
                try:
                    os.waitpid(pid, os.WNOHANG)
                except ChildProcessError:
                    pass
        shutil.rmtree(self.root, ignore_errors=True)


def _remove(path: str) -> None:
    try:
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
        else:
            os.unlink(path)
    except OSError:
        pass


# --- positive control ----------------------------------------------------------------
#: Calls whose effect the canaries must see when nothing confines them.
CONTROL_CALLS = (c_openat_create, c_open_create, c_openat_trunc, c_open_write, c_unlink,
                 c_rename, c_mkdir, c_link, c_chmod, c_mknod, c_execve_sh, c_execve_touch,
                 c_connect_tcp, c_connect_unix, c_kill)

_MACHINES = {"x86_64": (62, 0), "x86_32": (3, 0), "aarch64": (183, 0),
             "arm32": (40, 0x05000000), "riscv64": (243, 0x5), "riscv32": (243, 0x5)}


def control_elf(arch: str, env: dict, fn, seed: int = 0) -> bytes:
    """A static Linux executable of ``arch`` that runs the planted
    sequence ``fn`` (one of :data:`CONTROL_CALLS`) against ``env`` and
    exits: run by qemu-user without any sandbox it must change a canary,
    which shows the planted bytes make the calls they claim and that
    :meth:`Canary.check` sees them."""
    import struct
    pl = Plant(arch, env, random.Random(seed))
    fn(pl)
    p = pl.p
    p.li(p.arg(0), 0).syscall(nr(arch, "exit_group"))
    body = p.assemble()
    machine, flags = _MACHINES[arch]
    base = 0x400000
    if ASSEMBLERS[arch].ptr == 8:
        head = 64 + 56
        ehdr = struct.pack("<16sHHIQQQIHHHHHH", b"\x7fELF\x02\x01\x01" + bytes(9), 2,
                           machine, 1, base + head, 64, 0, flags, 64, 56, 1, 64, 0, 0)
        phdr = struct.pack("<IIQQQQQQ", 1, 7, 0, base, base, head + len(body),
                           head + len(body), 0x1000)
    else:
        head = 52 + 32
        ehdr = struct.pack("<16sHHIIIIIHHHHHH", b"\x7fELF\x01\x01\x01" + bytes(9), 2,
                           machine, 1, base + head, 52, 0, flags, 52, 32, 1, 40, 0, 0)
        phdr = struct.pack("<IIIIIIII", 1, 0, base, base, head + len(body),
                           head + len(body), 7, 0x1000)
    return ehdr + phdr + body


def run_control(arches=None, out=print) -> dict:
    """The positive control: each of :data:`CONTROL_CALLS`, on each
    architecture whose qemu-user is installed, run by qemu-user *without*
    the project's sandbox (a static executable of the planted sequence,
    :func:`control_elf`), must change a canary. Returns
    ``{arch: {call: [what the canaries saw]}}`` (an empty list: nothing,
    a failure of the control); architectures without qemu-user are left
    out. Run it in a process of its own: it makes that process a
    subreaper."""
    import resource

    import elfloader
    from elfloader.backend.emulated import choice

    canary = Canary()
    results: dict = {}
    try:
        index = 0
        for arch in arches or TABLES:
            program = choice.qemu_program(elfloader.arch.by_name(arch))
            if program is None:
                out(f"{arch}: no qemu-user, left out")
                continue
            for fn in CONTROL_CALLS:
                index += 1
                env = canary.env(index)
                case = {"id": f"control-{index}", "canary": env}
                canary.prepare(case)
                with tempfile.TemporaryDirectory(prefix="pkc-control-") as tmp:
                    path = os.path.join(tmp, "control")
                    with open(path, "wb") as f:
                        f.write(control_elf(arch, env, fn))
                    os.chmod(path, 0o700)
                    try:
                        subprocess.run(
                            [program, path], cwd=tmp, stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            timeout=20, preexec_fn=lambda: resource.setrlimit(
                                resource.RLIMIT_CORE, (0, 0)))
                    except subprocess.TimeoutExpired:
                        pass
                if fn is c_kill:
                    # kill() returns once the signal is queued; the sleeper
                    # ends a moment later, which a loaded machine stretches
                    try:
                        canary.sleeper.wait(timeout=5)
                    except subprocess.TimeoutExpired:
                        pass
                seen = canary.check(case, [], {}, set())
                results.setdefault(arch, {})[fn.__name__[2:]] = seen
                out(f"{arch:8s} {fn.__name__[2:]:15s} "
                    + (seen[0] if seen else "NOTHING SEEN"))
    finally:
        canary.close()
    return results
