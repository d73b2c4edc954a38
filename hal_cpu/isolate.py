"""Run native code in a forked child process, so that a kernel that crashes
(SIGSEGV, SIGILL, SIGBUS...) ends the child, not the caller.

:func:`run_in_child` forks (``os.fork``: the child starts from the caller's
memory, so nothing is re-imported or re-read; tens of milliseconds at most)
and calls a function there. The child reports through a pipe: progress
notes (what it is doing, so a crash can be placed) and finally the
function's result or the exception it raised, both pickled. Large results
belong in :func:`shared_array` memory, which both processes see.

**What runs where, and with which rights.** Native code run in process (or
in a child without ``sandbox``) runs with the caller's rights: a kernel or
plugin can do everything the calling user can (read and write their files,
open sockets, start programs), and only a crash is contained by the child.
``run_in_child(fn, sandbox=True)`` confines the child first
(:func:`confinement`: a system-call filter, ``PR_SET_NO_NEW_PRIVS``,
Landlock, a network namespace of its own, limits): it keeps memory,
threads, the clock, reading this runtime's and Python's files and the paths
it is given, and printing to stdout and stderr; it cannot create or write a
file, open a socket, start a process or program, nor signal another
process. A confined child is not trusted: what it sends back is plain data
(str, numbers, bytes, tuples, lists, dicts; numpy arrays through
:func:`shared_array` memory made before the fork).
"""

from __future__ import annotations

import io
import mmap
import os
import pickle
import select
import signal
import struct
import sys
import time
from typing import Callable

import numpy as np

from fatelf.errors import PortableKernelError

from .errors import CallTimeoutError, HalCpuError, NativeCrashError

_HEADER = struct.Struct("<Q")

#: Characters of an error message a confined child may send.
MESSAGE_LIMIT = 4096


def shared_array(array: np.ndarray) -> np.ndarray:
    """A copy of ``array`` in anonymous shared memory (page aligned), which a
    child forked afterwards writes and the parent reads back."""
    try:
        memory = mmap.mmap(-1, max(array.nbytes, 1))
    except (OSError, OverflowError) as exc:
        raise HalCpuError(f"cannot map {array.nbytes} bytes of shared memory "
                          f"for a binding: {getattr(exc, 'strerror', None) or exc}",
                          field="binding", value=array.nbytes) from None
    out = np.frombuffer(memory, dtype=array.dtype,
                        count=array.size).reshape(array.shape)
    out[...] = array
    return out


class _PlainUnpickler(pickle.Unpickler):
    """Unpickles only plain data (no class or function is looked up, so
    nothing runs): what a confined child, whose code is not trusted, may
    send."""

    def find_class(self, module, name):
        raise pickle.UnpicklingError(f"{module}.{name} is not plain data")


#: Bytes a confined child may send in all.
UNTRUSTED_LIMIT = 16 << 20


def _plain_value(value):
    """``value`` if it is a plain scalar, else its ``repr`` (bounded)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value[:MESSAGE_LIMIT] if isinstance(value, str) else value
    return repr(value)[:MESSAGE_LIMIT]


def _plain_error(exc: BaseException) -> tuple:
    """An exception as plain data: ``(message, name, field, value)``."""
    if isinstance(exc, PortableKernelError):
        message = str(exc.message)
        location = getattr(exc, "location", None)
        if isinstance(location, str) and location and not message.startswith(location):
            # (a program's status error: the op's source line first)
            message = f"{location}: {message}"
        return (message[:MESSAGE_LIMIT], _plain_value(exc.name),
                _plain_value(exc.field), _plain_value(exc.value))
    return (f"{type(exc).__name__}: {exc}"[:MESSAGE_LIMIT], None, None,
            type(exc).__name__)


def _send(fd: int, message, plain: bool = False) -> None:
    if plain and message[0] == "raise":
        message = ("raise", _plain_error(message[1]))
    try:
        data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        if plain:
            # what the parent will accept: plain data only
            _PlainUnpickler(io.BytesIO(data)).load()
        else:
            pickle.loads(data)
    except Exception:  # noqa: BLE001 - unpicklable result or exception
        kind, value = message
        if kind == "raise":
            value = HalCpuError(str(value), value=type(value).__name__)
        else:
            value = HalCpuError(f"the child's result {type(value).__name__} "
                                "cannot be sent back"
                                + (" (not plain data)" if plain else ""),
                                field="result", value=type(value).__name__)
            kind = "raise"
        if plain:
            value = _plain_error(value)
        data = pickle.dumps((kind, value), protocol=pickle.HIGHEST_PROTOCOL)
    view = memoryview(_HEADER.pack(len(data)) + data)
    while view:
        view = view[os.write(fd, view):]


class _Forward(io.TextIOBase):
    """A child's ``sys.stdout`` or ``sys.stderr`` whose text crosses the
    pipe to the parent (``("out", text)`` / ``("err", text)``), which writes
    it to its own stream as it arrives, line by line."""

    def __init__(self, fd: int, kind: str, plain: bool, original):
        self.fd, self.kind, self.plain = fd, kind, plain
        self.original = original
        self.pending: list[str] = []

    def write(self, text: str) -> int:
        self.pending.append(text)
        if "\n" in text or sum(map(len, self.pending)) > 1 << 14:
            self.flush()
        return len(text)

    def flush(self) -> None:
        if self.pending:
            text, self.pending = "".join(self.pending), []
            _send(self.fd, (self.kind, text), self.plain)

    def isatty(self) -> bool:
        return bool(getattr(self.original, "isatty", lambda: False)())

    def fileno(self) -> int:
        return self.original.fileno()

    @property
    def encoding(self):  # type: ignore[override]
        return "utf-8"


def _child(fd: int, fn: Callable, confine: Callable | None = None,
           forward: bool = False) -> int:
    status = 0
    plain = confine is not None
    try:
        if forward:
            # A stream this process writes to its own descriptor (1 or 2)
            # stays so: the child inherits the descriptor, and its Python
            # writes and native code's (printf) then reach it in the order
            # they are made. A stream the caller replaced (captured, as
            # pytest does) crosses the pipe instead.
            if sys.stdout is not sys.__stdout__:
                sys.stdout = _Forward(fd, "out", plain, sys.__stdout__)
            if sys.stderr is not sys.__stderr__:
                sys.stderr = _Forward(fd, "err", plain, sys.__stderr__)
        if confine is not None:
            # (a confined child's notes cross as plain data; nothing is
            # reported before the confinement holds)
            confine(fd)
        result = fn(lambda note: _send(fd, ("note", note), plain))
        sys.stdout.flush()
        sys.stderr.flush()
        # what native code printed is out before the parent, told the
        # result, prints what follows it
        flush_c_streams()
        _send(fd, ("result", result), plain)
    except KeyboardInterrupt:
        status = 130
    except Exception as exc:  # noqa: BLE001 - every error goes to the parent
        try:
            sys.stdout.flush()
            sys.stderr.flush()
            flush_c_streams()
        finally:
            _send(fd, ("raise", exc), plain)
    except BaseException:  # noqa: BLE001 - SystemExit and the like
        status = 1
    return status


def _accept(message, plain: bool) -> bool:
    """Whether a message a child sent has the shape this module sends."""
    if not plain:
        return True
    return (isinstance(message, tuple) and len(message) == 2
            and message[0] in ("note", "result", "raise", "out", "err")
            and (message[0] == "result"
                 or isinstance(message[1], str)
                 or (message[0] == "raise" and _is_plain_error(message[1]))))


def _read_messages(fd: int, deadline: float | None = None,
                   plain: bool = False, streams=None) -> tuple[list, bool]:
    """The messages the child sent until it closed the pipe, and whether
    ``deadline`` (``time.monotonic()``) passed first (then: those sent so
    far). ``plain``: the child is not trusted; only plain data is read, at
    most :data:`UNTRUSTED_LIMIT` bytes of messages other than output, and
    messages of another shape are dropped. Output (``out``/``err``) is
    written to ``streams`` (stdout, stderr) as it arrives."""
    messages: list = []
    late, total, buf = False, 0, b""
    while True:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                late = True
                break
        data = os.read(fd, 1 << 16)
        if not data:
            break
        buf += data
        pos = 0
        while pos + _HEADER.size <= len(buf):
            (n,) = _HEADER.unpack_from(buf, pos)
            if plain and n > UNTRUSTED_LIMIT:
                return messages, late
            if pos + _HEADER.size + n > len(buf):
                break
            body = buf[pos + _HEADER.size:pos + _HEADER.size + n]
            pos += _HEADER.size + n
            if not plain:
                message = pickle.loads(body)
            else:
                try:
                    message = _PlainUnpickler(io.BytesIO(body)).load()
                except Exception:  # noqa: BLE001 - anything malformed
                    message = None
            if not _accept(message, plain):
                continue
            if message[0] in ("out", "err"):
                if streams is not None:
                    stream = streams[message[0] == "err"]
                    stream.write(message[1])
                    stream.flush()
                continue
            total += n
            if plain and total > UNTRUSTED_LIMIT:
                return messages, late
            messages.append(message)
        buf = buf[pos:]
    return messages, late


def _is_plain_error(value) -> bool:
    """Whether ``value`` has the shape :func:`_plain_error` gives."""
    return (isinstance(value, tuple) and len(value) == 4
            and isinstance(value[0], str)
            and all(v is None or isinstance(v, str) for v in value[1:3])
            and (value[3] is None
                 or isinstance(value[3], (bool, int, float, str))))


def flush_c_streams() -> None:
    """Flush the C library's stdio buffers (what native code printed with
    ``printf``), which ``os._exit`` would drop and which a process
    otherwise writes only at its exit, after Python's own output."""
    try:
        import ctypes
        ctypes.CDLL(None).fflush(None)
    except Exception:  # noqa: BLE001 - nothing more to do on the way out
        pass


def _die_with(parent: int) -> None:
    """Have the kernel kill this child when ``parent`` ends (e.g. when a
    watchdog ends ``hal-cpu`` while the child runs code that cannot be
    stopped), where Linux offers it; exit at once if it is gone already."""
    try:
        import ctypes
        ctypes.CDLL(None).prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    except Exception:  # noqa: BLE001 - not Linux: the child may outlive it
        pass
    if os.getppid() != parent:
        os._exit(1)


def python_paths() -> tuple[str, ...]:
    """The directories a child running this runtime reads code from:
    Python's standard library and installed packages, and the packages
    ``fatelf``, ``elfloader`` and ``hal_cpu`` (what :func:`confinement`
    lets a confined child read)."""
    import sysconfig

    import elfloader
    import fatelf
    paths = {os.path.dirname(os.path.realpath(m.__file__ or ""))
             for m in (fatelf, elfloader, sys.modules[__package__])}
    paths.add(os.path.dirname(os.path.dirname(os.path.realpath(
        np.__file__ or ""))))
    for key in ("stdlib", "platstdlib", "purelib", "platlib"):
        path = sysconfig.get_paths().get(key)
        if path and os.path.isdir(path):
            paths.add(os.path.realpath(path))
    return tuple(sorted(p for p in paths if p))


def confinement(read=(), stdio: bool = True,
                prepare: Callable[[], object] | None = None,
                keep: tuple[int, ...] = ()) -> Callable[[int], None]:
    """A ``confine`` for :func:`run_in_child` that confines the child before
    it runs native code (:func:`elfloader.backend.emulated.sandbox.confine_native`):
    no file created or written, no socket, no process or program started,
    no signal out, no ``ptrace``; it may read what :func:`python_paths`
    lists, the platform's libraries and ``read`` (paths of files or
    directories: the program, plugins and data the child opens), allocate,
    read the clock, run threads and, with ``stdio``, print to stdout and
    stderr (else they are ``/dev/null``). What the child needs of this
    runtime (the native backend, the workgroup loop, Ctrl-C handling) is
    imported here, before the fork. ``prepare()``, when given, is called in
    the child just before it is confined (e.g. to load a host module the
    user trusts with their rights). ``keep``: descriptors the caller opened
    for the child to write (e.g. output files), kept open; every other
    one but the pipe and 0-2 is closed.

    Raises:
        HalCpuError: this machine cannot confine a child (no seccomp
            filter: pyseccomp or libseccomp missing); ``field`` is
            ``sandbox`` (``--run_native`` / ``sandbox=False`` run native
            code unconfined).
    """
    from elfloader.backend import native  # noqa: F401
    from elfloader.backend.emulated import sandbox

    from . import interrupt, library  # noqa: F401 - the child's code
    problem = sandbox.status()["problem"]
    if problem:
        raise HalCpuError(f"cannot confine native code here: {problem}; "
                          "--run_native (sandbox=False) runs it unconfined",
                          field="sandbox", value="seccomp")
    paths = set(python_paths())
    for path in read:
        if path is not None:
            paths.add(os.path.realpath(os.fspath(path)))
    allowed = tuple(sorted(paths))

    def confine(fd: int) -> None:
        if prepare is not None:
            prepare()
        sandbox.confine_native(keep=(fd, *keep), read=allowed, stdio=stdio)
    return confine


def signal_name(number: int) -> str:
    """``SIGSEGV`` for 11, ``signal 42`` for numbers without a name."""
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def run_in_child(fn: Callable[[Callable[[str], None]], object], *,
                 name: str | None = None, what: str = "the kernel",
                 timeout: float | None = None,
                 confine: Callable[[int], None] | None = None,
                 sandbox: bool = False, read=(), forward: bool = False):
    """Call ``fn(note)`` in a forked child and return its result.

    Without ``sandbox`` (or ``confine``) the child has the caller's rights:
    native code ``fn`` runs can do anything the caller can; only its crash
    is contained. With ``sandbox=True`` it is confined first
    (:func:`confinement`) and treated as untrusted.

    ``fn`` may call ``note(text)`` to say what it is about to do (e.g.
    ``in export X``); the last note names the place in the message of a
    crash. Its return value must pickle.

    Args:
        fn: the function to run in the child.
        name: the file concerned (``name`` of the errors raised).
        what: the subject of the crash message.
        timeout: seconds the child may run in all (None: no limit); past
            them it is killed (everything it runs is bounded, native code
            included).
        confine: called first in the child with the descriptor of the pipe
            to the parent (which must stay open), e.g. to confine it. The
            child is then not trusted: its notes, result and errors cross as
            plain data only (str, numbers, tuples, lists, dicts: nothing is
            looked up or run when they are read), an error it raised (or
            that ``confine`` raised) arrives as :class:`HalCpuError` with
            its message, ``name``, ``field`` and ``value`` (plain ones),
            and at most :data:`UNTRUSTED_LIMIT` bytes are read.
        sandbox: confine the child with :func:`confinement` (stdout and
            stderr connected), reading also ``read``; the child is then
            not trusted, as with ``confine``. The confinement is made once
            per child: run many calls in one child to pay it once.
        read: paths (files or directories) a ``sandbox`` child may read.
        forward: what the child's Python code writes to a ``sys.stdout``
            or ``sys.stderr`` the caller replaced (e.g. where they are
            captured) is written to this process's stream as it arrives;
            streams that are still the process's own (``sys.__stdout__``)
            write to descriptors 1 and 2 directly, as native code does, so
            Python's and native code's lines keep their order (the child
            flushes C's stdio buffers before it answers). Always so for a
            confined child.

    Returns:
        what ``fn`` returned.

    Raises:
        NativeCrashError: the child died by a signal or exited without an
            answer; ``signal`` and ``stage`` (the last note) say how and where.
        Exception: whatever ``fn`` raised (its :class:`HalCpuError` and
            other project errors arrive with their type, message and fields).
        CallTimeoutError: ``timeout`` passed; the child was killed.
        HalCpuError: ``sandbox`` on a machine that cannot confine a child
            (``field`` ``sandbox``).
        KeyboardInterrupt: the child or the parent was interrupted (the
            child is killed and reaped).
    """
    if sandbox and confine is None:
        confine = confinement(read)
    # A confined child closes the descriptors its streams may write to
    # (e.g. where pytest captures them): its Python output crosses the pipe.
    forward = forward or confine is not None
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    read_fd, write_fd = os.pipe()
    parent = os.getpid()
    pid = os.fork()
    if pid == 0:  # child
        status = 1
        try:
            _die_with(parent)
            os.close(read_fd)
            status = _child(write_fd, fn, confine, forward)
        finally:
            try:
                sys.stdout.flush()
                sys.stderr.flush()
                flush_c_streams()
            finally:
                os._exit(status)
    os.close(write_fd)
    deadline = time.monotonic() + timeout if timeout else None
    try:
        messages, late = _read_messages(
            read_fd, deadline, plain=confine is not None,
            streams=(sys.stdout, sys.stderr) if forward else None)
        if late:
            os.kill(pid, signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
    except BaseException:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        raise
    finally:
        os.close(read_fd)
    if late:
        notes = [m for k, m in messages if k == "note"]
        raise CallTimeoutError(
            f"{what} did not return within the time limit of {timeout:g} s "
            "(the child process running it natively was killed)"
            + (f" {notes[-1]}" if notes else ""), name=name, field="timeout",
            value=timeout, seconds=timeout or 0.0)
    notes = [m for k, m in messages if k == "note"]
    stage = notes[-1] if notes else ""
    for kind, value in messages:
        if kind == "result":
            return value
        if kind == "raise":
            if isinstance(value, str):
                raise HalCpuError(value, name=name)
            if isinstance(value, tuple):
                message, who, field, what = value
                raise HalCpuError(message, name=who or name, field=field,
                                  value=what)
            raise value
    if os.WIFEXITED(status) and os.WEXITSTATUS(status) == 130:
        raise KeyboardInterrupt
    if os.WIFSIGNALED(status):
        number = os.WTERMSIG(status)
        how = signal_name(number)
    else:
        number = None
        how = f"exit status {os.waitstatus_to_exitcode(status)}"
    err = NativeCrashError(f"{what} crashed natively ({how})"
                           + (f" {stage}" if stage else ""), name=name,
                           value=how, signal=number, stage=stage)
    raise err
