"""Run native code in a forked child process, so that a kernel that crashes
(SIGSEGV, SIGILL, SIGBUS...) ends the child, not the caller.

:func:`run_in_child` forks (``os.fork``: the child starts from the caller's
memory, so nothing is re-imported or re-read; tens of milliseconds at most)
and calls a function there. The child reports through a pipe: progress
notes (what it is doing, so a crash can be placed) and finally the
function's result or the exception it raised, both pickled. Large results
belong in :func:`shared_array` memory, which both processes see.
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


def _send(fd: int, message, plain: bool = False) -> None:
    if plain and message[0] == "raise":
        exc = message[1]
        message = ("raise", exc.message if isinstance(exc, PortableKernelError)
                   else f"{type(exc).__name__}: {exc}")
    try:
        data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        pickle.loads(data)
    except Exception:  # noqa: BLE001 - unpicklable result or exception
        kind, value = message
        if kind == "raise":
            value = HalCpuError(str(value), value=type(value).__name__)
        else:
            value = HalCpuError(f"the child's result {type(value).__name__} "
                                "cannot be sent back")
            kind = "raise"
        data = pickle.dumps((kind, value), protocol=pickle.HIGHEST_PROTOCOL)
    view = memoryview(_HEADER.pack(len(data)) + data)
    while view:
        view = view[os.write(fd, view):]


def _child(fd: int, fn: Callable, confine: Callable | None = None) -> int:
    status = 0
    plain = confine is not None
    try:
        if confine is not None:
            confine(fd)
        result = fn(lambda note: _send(fd, ("note", note), plain))
        _send(fd, ("result", result), plain)
    except KeyboardInterrupt:
        status = 130
    except Exception as exc:  # noqa: BLE001 - every error goes to the parent
        _send(fd, ("raise", exc), plain)
    except BaseException:  # noqa: BLE001 - SystemExit and the like
        status = 1
    return status


def _read_messages(fd: int, deadline: float | None = None,
                   plain: bool = False) -> tuple[list, bool]:
    """The messages the child sent until it closed the pipe, and whether
    ``deadline`` (``time.monotonic()``) passed first (then: those sent so
    far). ``plain``: the child is not trusted; only plain data is read, at
    most :data:`UNTRUSTED_LIMIT` bytes, and messages of another shape are
    dropped."""
    chunks, late, total = [], False, 0
    while True:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                late = True
                break
        data = os.read(fd, 1 << 16)
        if not data:
            break
        total += len(data)
        if plain and total > UNTRUSTED_LIMIT:
            break
        chunks.append(data)
    buf = b"".join(chunks)
    messages, pos = [], 0
    while pos + _HEADER.size <= len(buf):
        (n,) = _HEADER.unpack_from(buf, pos)
        pos += _HEADER.size
        if pos + n > len(buf):
            break                      # cut short by the crash
        if not plain:
            messages.append(pickle.loads(buf[pos:pos + n]))
        else:
            try:
                message = _PlainUnpickler(io.BytesIO(buf[pos:pos + n])).load()
            except Exception:  # noqa: BLE001 - anything malformed
                message = None
            if (isinstance(message, tuple) and len(message) == 2
                    and message[0] in ("note", "result", "raise")
                    and (message[0] == "result" or isinstance(message[1], str))):
                messages.append(message)
        pos += n
    return messages, late


def signal_name(number: int) -> str:
    """``SIGSEGV`` for 11, ``signal 42`` for numbers without a name."""
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def run_in_child(fn: Callable[[Callable[[str], None]], object], *,
                 name: str | None = None, what: str = "the kernel",
                 timeout: float | None = None,
                 confine: Callable[[int], None] | None = None):
    """Call ``fn(note)`` in a forked child and return its result.

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
            its message, and at most :data:`UNTRUSTED_LIMIT` bytes are read.

    Returns:
        what ``fn`` returned.

    Raises:
        NativeCrashError: the child died by a signal or exited without an
            answer; ``signal`` and ``stage`` (the last note) say how and where.
        Exception: whatever ``fn`` raised (its :class:`HalCpuError` and
            other project errors arrive with their type, message and fields).
        CallTimeoutError: ``timeout`` passed; the child was killed.
        KeyboardInterrupt: the child or the parent was interrupted (the
            child is killed and reaped).
    """
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        status = 1
        try:
            os.close(read_fd)
            status = _child(write_fd, fn, confine)
        finally:
            try:
                sys.stdout.flush()
                sys.stderr.flush()
            finally:
                os._exit(status)
    os.close(write_fd)
    deadline = time.monotonic() + timeout if timeout else None
    try:
        messages, late = _read_messages(read_fd, deadline,
                                        plain=confine is not None)
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
