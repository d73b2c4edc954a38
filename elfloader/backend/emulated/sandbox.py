"""The qemu engine's sandbox: what a guest agent's process may do.

qemu-user turns every system call of the code it runs into the same call
on the host. A kernel or plugin under emulation is untrusted input, so each
agent process is confined before qemu-user starts, and the confinement
holds for the process's life (qemu-user refuses a guest's own seccomp, so
it cannot be installed later):

* a **system-call filter** (seccomp, built with libseccomp through
  ``pyseccomp``) whose default action is a trap: qemu-user hands the guest
  a ``SIGSYS``, the agent reports it, and the call ends with an
  :class:`~elfloader.errors.EmulationError` whose ``fault.kind`` is
  ``"syscall"``. Allowed are only the calls qemu-user and the agent make
  (:data:`ALLOWED`), some with their arguments checked: ``openat`` only
  without write, create, truncate or append flags; ``clone`` only for a
  thread; ``kill``/``tgkill`` only of the agent itself; ``close``,
  ``dup2`` and ``dup3`` not on the agent's own descriptors (numbered from
  :data:`PROTECTED_FDS`); ``execve`` only of
  the one path this module passes (its address is checked, so the guest
  cannot start a program); ``prlimit64`` only to read, or to set its own
  core size (to 0: the hard limit); ``fcntl`` only for descriptor flags.
  No sockets, no ``ptrace``, no ``process_vm_*``, no ``pidfd_*``, no files
  made, changed, renamed or removed.
* ``PR_SET_NO_NEW_PRIVS``.
* **Landlock** where the kernel has it: reading and executing beneath
  ``/usr`` and qemu's own directory, reading ``/etc/ld.so.cache``, the
  agent's own ``/proc/<pid>``, ``/proc/sys/vm/mmap_min_addr`` and
  ``/sys/devices/system`` (what qemu-user reads to start); no TCP bind or
  connect (ABI 4+); no signals to processes outside the sandbox and no
  abstract unix sockets (ABI 6+).
* a **new network namespace** where namespaces can be made (as root, or
  inside a new user namespace): no interface but a down loopback.
* for a debugged agent only (:func:`spawn` with ``sockets``): qemu-user's
  gdb stub (``-g PATH``) may make one UNIX stream socket below that
  per-session private folder and serve it: the filter also allows
  ``socket`` (``AF_UNIX``, ``SOCK_STREAM`` only), ``bind``, ``listen``,
  ``accept``/``accept4``, ``sendto``/``recvfrom`` and socket options,
  never ``connect`` (:data:`DEBUG_ALLOWED`), and Landlock the making of
  sockets beneath that folder alone.
* an empty environment, ``/`` as working directory, no core files, files
  it writes (its stderr) bounded to :data:`STDERR_LIMIT` bytes, and, once
  started, its address space (``RLIMIT_AS``) and its private resident
  memory (checked by the qemu engine while a call runs: 32-bit guests,
  whose whole address space qemu-user reserves up front, escape
  ``RLIMIT_AS``) each bounded to what it had to start plus
  :data:`MEMORY_LIMIT` bytes (see :func:`bound_memory`), so a guest
  cannot exhaust host memory.

:func:`status` says which layers this machine has; without seccomp the
qemu engine refuses to start.
"""

from __future__ import annotations

import ctypes
import functools
import os
import resource
import types
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import subprocess

#: First descriptor number of the agent's own files (its program, pipes and
#: guest memory): guest code may not close them or ``dup`` over them, so
#: the agent's watchdog always sees its host go.
PROTECTED_FDS = 1000
#: Bytes a guest agent may add to its address space, and to its private
#: resident memory, after it started (32- and 64-bit guests alike).
MEMORY_LIMIT = 1 << 30
#: Bytes an agent may write to a file (its stderr, which the host reads).
STDERR_LIMIT = 1 << 20

#: System calls the filter allows without conditions: those qemu-user 7.2
#: and the guest agent make after ``execve`` (seen with ``strace -f``),
#: none of which reaches a file, a process or the network.
ALLOWED = (
    "read", "write", "readv", "writev", "pread64", "lseek",
    "fstat", "newfstatat", "statx", "getdents64", "access", "faccessat",
    "faccessat2", "readlink", "readlinkat",
    "mmap", "munmap", "mprotect", "mremap", "madvise", "brk",
    "rt_sigaction", "rt_sigprocmask", "rt_sigreturn", "sigaltstack",
    "rt_sigsuspend", "rt_sigtimedwait", "rt_sigpending", "restart_syscall",
    "futex", "set_robust_list", "get_robust_list", "rseq",
    "set_tid_address", "gettid", "getpid", "getppid", "getuid", "geteuid",
    "getgid", "getegid", "getresuid", "getresgid", "getrandom", "uname",
    "sysinfo", "sched_getaffinity", "sched_yield", "get_mempolicy",
    "set_mempolicy", "membarrier", "clock_gettime", "clock_getres",
    "clock_nanosleep", "nanosleep", "gettimeofday", "poll", "ppoll",
    "exit", "exit_group", "arch_prctl", "dup", "getcwd",
)

#: What a debugged agent may do besides (:func:`spawn` with ``sockets``):
#: serve qemu-user's gdb stub on a UNIX socket it made (``socket`` itself
#: is allowed only for ``AF_UNIX`` stream sockets; ``connect`` never).
DEBUG_ALLOWED = ("bind", "listen", "accept", "accept4", "setsockopt",
                 "getsockopt", "getsockname", "sendto", "recvfrom",
                 "shutdown")
_AF_UNIX, _SOCK_STREAM, _SOCK_TYPE = 1, 1, 0xF

# Flags the checked calls look at (asm-generic values, the same on every
# host the qemu engine runs on: x86_64 and aarch64).
_O_WRITES = 0o3 | 0o100 | 0o1000 | 0o2000 | 0o20000000  # ACCMODE CREAT TRUNC APPEND __TMPFILE
_CLONE_THREAD = 0x10000
_F_DUPFD, _F_GETFD, _F_SETFD, _F_GETFL, _F_DUPFD_CLOEXEC = 0, 1, 2, 3, 1030
_ENOSYS = 38
_EPERM = 1
_RLIMIT_CORE = 4
_PR_SET_NO_NEW_PRIVS = 38
_CLONE_NEWUSER, _CLONE_NEWNET = 0x10000000, 0x40000000

# Landlock (include/uapi/linux/landlock.h); the system call numbers are
# the same on every architecture.
_LL_CREATE, _LL_ADD_RULE, _LL_RESTRICT = 444, 445, 446
_LL_VERSION = 1
_LL_PATH_BENEATH = 1
_FS_EXECUTE, _FS_READ_FILE, _FS_READ_DIR = 1 << 0, 1 << 2, 1 << 3
_FS_MAKE_SOCK = 1 << 9
#: Every file-system right each Landlock ABI version knows (index: ABI).
_FS_HANDLED = {1: (1 << 13) - 1, 2: (1 << 14) - 1, 3: (1 << 15) - 1,
               4: (1 << 15) - 1, 5: (1 << 16) - 1}
_NET_TCP = 0b11               # BIND_TCP | CONNECT_TCP (ABI 4+)
_SCOPES = 0b11                # ABSTRACT_UNIX_SOCKET | SIGNAL (ABI 6+)

_libc = ctypes.CDLL(None, use_errno=True)
_syscall = _libc.syscall
_syscall.restype = ctypes.c_long


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64),
                ("handled_access_net", ctypes.c_uint64),
                ("scoped", ctypes.c_uint64)]


class _PathBeneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64),
                ("parent_fd", ctypes.c_int32)]


@functools.lru_cache(maxsize=None)
def landlock_abi() -> int:
    """The kernel's Landlock ABI version; 0 when it has none."""
    got = _syscall(ctypes.c_long(_LL_CREATE), None, ctypes.c_size_t(0),
                   ctypes.c_uint32(_LL_VERSION))
    return max(int(got), 0)


#: Sonames pyseccomp looks up with ctypes.util.find_library when imported.
_SONAMES = {"c": "libc.so.6", "seccomp": "libseccomp.so.2"}


def _import_pyseccomp():
    """``import pyseccomp`` without ``ctypes.util.find_library`` running
    ``ldconfig`` and ``gcc`` for the two libraries it loads (about 40 ms
    and 50 ms of child CPU time, a good part of a confined command's
    start): each is tried by its soname first, the lookup left to
    ``find_library`` only when that fails."""
    import ctypes.util

    real = ctypes.util.find_library

    def find_library(name):
        soname = _SONAMES.get(name)
        if soname is not None:
            try:
                ctypes.CDLL(soname)
                return soname
            except OSError:
                pass
        return real(name)

    ctypes.util.find_library = find_library
    try:
        import pyseccomp
    finally:
        ctypes.util.find_library = real
    return pyseccomp


@functools.lru_cache(maxsize=None)
def _seccomp() -> tuple[types.ModuleType | None, str]:
    try:
        pyseccomp = _import_pyseccomp()
        pyseccomp.SyscallFilter(pyseccomp.ALLOW)
    except Exception as exc:  # noqa: BLE001 - module, library or kernel
        return None, (f"no system-call filter: pyseccomp with the system's "
                      f"libseccomp.so.2 is needed ({exc})")
    return pyseccomp, ""


def status() -> dict[str, object]:
    """What confines a guest agent on this machine: ``seccomp`` (bool),
    ``landlock`` (ABI version, 0: none) and ``problem`` (why seccomp is
    missing, or ""). Whether a network namespace can be made is found
    when an agent starts (the agent goes on without one where the kernel
    refuses it)."""
    lib, problem = _seccomp()
    return {"seccomp": lib is not None, "landlock": landlock_abi(),
            "problem": problem}


def require() -> None:
    """Raise when a guest agent cannot be confined.

    Raises:
        EngineError: no seccomp filter can be made (pyseccomp or
            libseccomp missing, or a kernel without seccomp).
    """
    from ...errors import EngineError
    lib, problem = _seccomp()
    if lib is None:
        raise EngineError(f"the qemu engine runs guest code only in a "
                          f"sandbox and cannot make one here: {problem}",
                          field="engine", value="sandbox")


def _filter(pid: int, exec_path: int | None, refuse: object = None,
            debug: bool = False) -> Any:
    """The system-call filter (a ``pyseccomp.SyscallFilter``) of agent
    process ``pid`` whose one ``execve`` passes the path at host address
    ``exec_path`` (None: no ``execve``); a refused call traps, or gets
    ``refuse`` (an action). ``debug``: also serve a gdb stub's UNIX
    socket (:data:`DEBUG_ALLOWED`)."""
    sc, _ = _seccomp()
    # Callers ran require() (spawn's caller, QemuEngine, and
    # confine_native): the library is there.
    assert sc is not None
    f = sc.SyscallFilter(sc.TRAP if refuse is None else refuse)

    def allow_if_here(name, *args):
        """Allow ``name`` (with ``args``) where this host has the call
        (``open``, ``dup2``, ``setrlimit``: x86_64 only)."""
        try:
            f.add_rule(sc.ALLOW, name, *args)
        except Exception:  # noqa: BLE001 - not a call of this host
            pass

    for name in ALLOWED:
        allow_if_here(name)
    allow_if_here("open", sc.Arg(1, sc.MASKED_EQ, _O_WRITES, 0))
    f.add_rule(sc.ALLOW, "openat", sc.Arg(2, sc.MASKED_EQ, _O_WRITES, 0))
    f.add_rule(sc.ALLOW, "clone",
               sc.Arg(0, sc.MASKED_EQ, _CLONE_THREAD, _CLONE_THREAD))
    # glibc falls back to clone, whose flags the filter can read.
    f.add_rule(sc.ERRNO(_ENOSYS), "clone3")
    f.add_rule(sc.ALLOW, "kill", sc.Arg(0, sc.EQ, pid))
    f.add_rule(sc.ALLOW, "tgkill", sc.Arg(0, sc.EQ, pid))
    if exec_path is not None:
        f.add_rule(sc.ALLOW, "execve", sc.Arg(0, sc.EQ, exec_path))
    # Descriptors below the protected range only.
    f.add_rule(sc.ALLOW, "close", sc.Arg(0, sc.LT, PROTECTED_FDS))
    f.add_rule(sc.ALLOW, "dup3", sc.Arg(1, sc.LT, PROTECTED_FDS))
    allow_if_here("dup2", sc.Arg(1, sc.LT, PROTECTED_FDS))
    f.add_rule(sc.ALLOW, "prlimit64", sc.Arg(2, sc.EQ, 0))
    # qemu-user sets its own core size to 0 before it dies of a guest's
    # fatal signal (the hard limit is 0 already).
    f.add_rule(sc.ALLOW, "prlimit64", sc.Arg(0, sc.EQ, 0),
               sc.Arg(1, sc.EQ, _RLIMIT_CORE))
    allow_if_here("setrlimit", sc.Arg(0, sc.EQ, _RLIMIT_CORE))
    for cmd in (_F_DUPFD, _F_GETFD, _F_SETFD, _F_GETFL, _F_DUPFD_CLOEXEC):
        f.add_rule(sc.ALLOW, "fcntl", sc.Arg(1, sc.EQ, cmd))
    if debug:
        f.add_rule(sc.ALLOW, "socket", sc.Arg(0, sc.EQ, _AF_UNIX),
                   sc.Arg(1, sc.MASKED_EQ, _SOCK_TYPE, _SOCK_STREAM))
        for name in DEBUG_ALLOWED:
            allow_if_here(name)
    return f


def _landlock(program: str | None, extra: tuple[str, ...] = (),
              sockets: str | None = None) -> None:
    """Restrict this process's file system, TCP and signals (see the
    module docstring; ``program``'s directory and the paths ``extra`` may
    be read and executed, sockets made beneath folder ``sockets``); does
    nothing without Landlock."""
    abi = landlock_abi()
    if not abi:
        return
    attr = _RulesetAttr(_FS_HANDLED.get(abi, _FS_HANDLED[5]),
                        _NET_TCP if abi >= 4 else 0,
                        _SCOPES if abi >= 6 else 0)
    size = 8 if abi < 4 else 16 if abi < 6 else 24
    ruleset = _syscall(ctypes.c_long(_LL_CREATE), ctypes.byref(attr),
                       ctypes.c_size_t(size), ctypes.c_uint32(0))
    if ruleset < 0:
        raise OSError(ctypes.get_errno(), "landlock_create_ruleset")
    read = _FS_READ_FILE | _FS_READ_DIR
    rules = [("/usr", read | _FS_EXECUTE),
             ("/etc/ld.so.cache", _FS_READ_FILE),
             ("/proc/self/", read),
             ("/proc/sys/vm/mmap_min_addr", _FS_READ_FILE),
             ("/sys/devices/system", read)]
    if program is not None:
        rules.append((os.path.dirname(os.path.realpath(program)),
                      read | _FS_EXECUTE))
    rules += [(path, read | _FS_EXECUTE) for path in extra]
    if sockets is not None:
        rules.append((sockets, _FS_MAKE_SOCK))
    for lib in ("/lib", "/lib64", "/lib32"):
        if os.path.isdir(lib) and not os.path.islink(lib):
            rules.append((lib, read | _FS_EXECUTE))
    try:
        for path, rights in rules:
            try:
                fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            except OSError:
                continue
            if not os.path.isdir(path):
                rights &= _FS_READ_FILE | _FS_EXECUTE   # file rights only
            rule = _PathBeneath(rights, fd)
            got = _syscall(ctypes.c_long(_LL_ADD_RULE), ctypes.c_int(ruleset),
                           ctypes.c_int(_LL_PATH_BENEATH), ctypes.byref(rule),
                           ctypes.c_uint32(0))
            os.close(fd)
            if got < 0:
                raise OSError(ctypes.get_errno(), f"landlock_add_rule {path}")
        if _syscall(ctypes.c_long(_LL_RESTRICT), ctypes.c_int(ruleset),
                    ctypes.c_uint32(0)) < 0:
            raise OSError(ctypes.get_errno(), "landlock_restrict_self")
    finally:
        os.close(ruleset)


def _new_network() -> None:
    """A network namespace of the agent's own, where one can be made."""
    for flags in (_CLONE_NEWNET, _CLONE_NEWUSER | _CLONE_NEWNET):
        if _libc.unshare(ctypes.c_int(flags)) == 0:
            return


def agent_fds(count: int) -> list[int]:
    """The descriptor numbers an agent's ``count`` own files get (see
    :data:`PROTECTED_FDS`)."""
    return list(range(PROTECTED_FDS, PROTECTED_FDS + count))


def _confine_and_exec(argv: list[str], fds: dict[int, int],
                      sockets: str | None = None) -> None:
    """In the forked child: give descriptor ``fds[n]`` the number ``n``
    (numbers of :func:`agent_fds`), confine the process (a debugged agent
    may serve a socket beneath ``sockets``), then ``execve`` qemu-user
    (see the module docstring) with only descriptors 0-2 and those open.
    Returns only by raising."""
    program = argv[0]
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft <= max(fds):
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(fds) + 64),
                                                    hard))
    for number, fd in fds.items():
        os.dup2(fd, number, inheritable=True)
    keep = set(fds) | {0, 1, 2}
    for name in os.listdir("/proc/self/fd"):
        if int(name) not in keep and int(name) not in fds.values():
            try:
                os.set_inheritable(int(name), False)
            except OSError:
                pass
    path = ctypes.create_string_buffer(os.fsencode(program))
    args = [ctypes.create_string_buffer(os.fsencode(a)) for a in argv]
    argp = (ctypes.c_char_p * (len(args) + 1))(
        *[ctypes.cast(a, ctypes.c_char_p) for a in args], None)
    envp = (ctypes.c_char_p * 1)(None)
    # Built before Landlock, which leaves the Python library unreadable.
    seccomp_filter = _filter(os.getpid(), ctypes.addressof(path),
                             debug=sockets is not None)
    _new_network()
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_FSIZE, (STDERR_LIMIT, STDERR_LIMIT))
    if _libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "PR_SET_NO_NEW_PRIVS")
    _landlock(program, sockets=sockets)
    seccomp_filter.load()
    _libc.execve(path, argp, envp)
    raise OSError(ctypes.get_errno(), f"execve {program}")


#: Bytes a confined native child may add to a regular file it was given
#: as its stdout or stderr (``RLIMIT_FSIZE`` past the larger one's size).
OUTPUT_LIMIT = 1 << 30


def confine_native(keep: tuple[int, ...] = (),
                   read: tuple[str, ...] = (), stdio: bool = False) -> None:
    """Confine this process, a forked child about to run native code that
    is not trusted (a kernel, a plugin, a system library's constructors and
    functions), for the rest of its life, as a guest agent is: the same
    system-call filter without ``execve``, whose refused calls fail with
    ``EPERM`` rather than trap (no file made, changed, renamed or removed,
    no file opened for writing, no socket, no process or program started,
    no signal to another process, no ``ptrace``); threads (``clone`` with
    ``CLONE_THREAD``), memory, the clock, reading and writing the
    descriptors it keeps stay allowed; ``PR_SET_NO_NEW_PRIVS``; Landlock
    (reading and executing only what an agent may read and the paths
    ``read``; no TCP, no signals out); a network namespace of its own where
    one can be made; no core files.

    Args:
        keep: descriptors above 2 that stay open (e.g. the pipe to the
            parent); every other one is closed, so the code cannot write to
            files this process had open.
        read: files and directories it may read (and execute) besides the
            platform's libraries.
        stdio: False: descriptors 0-2 become ``/dev/null`` and no file may
            grow (``RLIMIT_FSIZE`` 0). True: stdin becomes ``/dev/null``,
            stdout and stderr stay connected (a plugin may print, as IREE's
            system-plugin sample does), and no file may grow past the
            largest of them and of ``keep`` plus :data:`OUTPUT_LIMIT` bytes.

    Raises:
        EngineError: no system-call filter can be made on this machine.
        OSError: a layer could not be set up.
    """
    require()
    null = os.open("/dev/null", os.O_RDWR)
    for number in ((0,) if stdio else (0, 1, 2)):
        if null != number:
            os.dup2(null, number)
    if null > 2:
        os.close(null)
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd > 2 and fd not in keep:
            try:
                os.close(fd)
            except OSError:
                pass
    grow = 0
    if stdio:
        grow = OUTPUT_LIMIT
        for fd in (1, 2, *keep):
            try:
                grow = max(grow, os.fstat(fd).st_size + OUTPUT_LIMIT)
            except OSError:
                pass
    # Built before Landlock, which leaves the Python library unreadable.
    sc, _ = _seccomp()
    assert sc is not None   # require() above
    seccomp_filter = _filter(os.getpid(), None, sc.ERRNO(_EPERM))
    _new_network()
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    if hard == resource.RLIM_INFINITY or hard > grow:
        resource.setrlimit(resource.RLIMIT_FSIZE, (grow, grow))
    if _libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "PR_SET_NO_NEW_PRIVS")
    _landlock(None, tuple(read))
    seccomp_filter.load()


def spawn(argv: list[str], fds: dict[int, int], stderr,
          sockets: str | None = None) -> subprocess.Popen:
    """Start ``argv`` (qemu-user and its arguments) confined, with this
    process's descriptor ``fds[n]`` open as number ``n`` (numbers of
    :func:`agent_fds`), stdin and stdout on ``/dev/null`` and stderr on
    ``stderr``, in a session of its own. ``sockets``: a private folder
    (:func:`fatelf.private_dirs.private_dir`) beneath which a debugged
    agent's gdb stub makes and serves its UNIX socket (see the module
    docstring); None: no socket at all.

    Raises:
        EngineError: no sandbox can be made on this machine.
        OSError: the process could not start.
    """
    require()
    import subprocess  # here: a native run's confinement does not spawn
    return subprocess.Popen(
        argv, pass_fds=tuple(fds.values()), stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL, stderr=stderr, start_new_session=True,
        cwd="/", env={},
        preexec_fn=lambda: _confine_and_exec(argv, fds, sockets))


def bound_memory(pid: int, limit: int = MEMORY_LIMIT) -> int | None:
    """Bound agent ``pid``'s address space to its present size plus
    ``limit`` bytes (``RLIMIT_AS``), and return the bound of its private
    resident memory: its present ``RssAnon`` plus ``limit`` bytes, which
    the qemu engine checks while a call runs (:func:`over_bound`).

    ``RLIMIT_AS`` alone holds on 64-bit guests only: qemu-user reserves a
    32-bit guest's whole 4 GiB address space (``PROT_NONE``) when it
    starts, and a guest's ``mmap`` replaces part of that reservation
    (``MAP_FIXED``), which grows neither the address space nor, since the
    kernel subtracts the pages replaced, what ``RLIMIT_DATA`` counts
    (measured: a 1.25 GiB ``mmap`` went through both). Guest memory
    shared with the host (the ``memfd``) is not private and counts in
    neither bound. Returns None (and does nothing) if the process is
    gone.
    """
    try:
        size = _status(pid, b"VmSize")
        anon = _status(pid, b"RssAnon")
        if size is None or anon is None:
            return None
        resource.prlimit(pid, resource.RLIMIT_AS, (size + limit, size + limit))
        return anon + limit
    except (OSError, ValueError):
        return None


def _status(pid: int, key: bytes) -> int | None:
    """Field ``key`` (a size in kB) of ``/proc/<pid>/status``, in bytes;
    None when the process or the field is missing."""
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            for line in f:
                if line.startswith(key + b":"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def over_bound(pid: int, bound: int | None) -> int | None:
    """Agent ``pid``'s private resident memory (``RssAnon``), bytes, when
    it is above ``bound`` (from :func:`bound_memory`; None: no bound);
    else None."""
    if bound is None:
        return None
    anon = _status(pid, b"RssAnon")
    return anon if anon is not None and anon > bound else None


__all__ = ["ALLOWED", "DEBUG_ALLOWED", "MEMORY_LIMIT", "OUTPUT_LIMIT",
           "STDERR_LIMIT", "PROTECTED_FDS", "status", "require", "agent_fds",
           "spawn", "confine_native",
           "bound_memory", "over_bound",
           "landlock_abi"]
