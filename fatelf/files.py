"""Opening input files without trusting them.

Every file the runtime reads is opened without blocking (a FIFO with no
writer would block ``open`` forever) and must be a regular file: a FIFO, a
device (``/dev/zero`` never ends), a socket or a directory is refused with
the caller's typed error before a byte is read. Large files are mapped,
not read, so that only the bytes a parser looks at are touched.
"""

from __future__ import annotations

import mmap
import os
import stat

_KINDS = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISDIR, "a directory"),
          (stat.S_ISSOCK, "a socket"))


def describe_mode(mode: int) -> str:
    """``a FIFO``, ``a directory``... for a non-regular ``st_mode``."""
    for test, what in _KINDS:
        if test(mode):
            return what
    return "not a regular file"


def open_regular(path, error, *, field: str = "file", name: str | None = None
                 ) -> tuple[int, int]:
    """Open ``path`` for reading without blocking and check that it is a
    regular file.

    Args:
        path: the file.
        error: exception class to raise (a
            :class:`fatelf.PortableKernelError` subclass; called with the
            message and ``name``, ``field``, ``value`` keywords).
        field: ``field`` of the errors; name: their ``name`` (default the
            path).

    Returns:
        ``(file descriptor, size in bytes)``; close the descriptor.

    Raises:
        error: the file cannot be opened (the OS's reason), or it is a FIFO,
            a device, a socket or a directory.
    """
    name = name if name is not None else os.fspath(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise error(f"cannot open it: {exc.strerror or exc}", name=name,
                    field=field, value=os.fspath(path)) from None
    except (TypeError, ValueError) as exc:
        raise error(f"cannot open it: {exc}", name=name, field=field,
                    value=repr(path)) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise error(f"it is {describe_mode(st.st_mode)}, not a regular file",
                        name=name, field=field, value=os.fspath(path))
    except BaseException:
        os.close(fd)
        raise
    return fd, st.st_size


def map_regular(path, error, *, field: str = "file", name: str | None = None):
    """A read-only ``mmap`` of the regular file ``path`` (``b""`` when it
    is empty): nothing is read until a parser touches it. Close the map
    when done (after releasing any ``memoryview`` of it).

    Raises:
        error: as :func:`open_regular`, or the file cannot be mapped.
    """
    fd, size = open_regular(path, error, field=field, name=name)
    try:
        if size == 0:
            return b""
        try:
            return mmap.mmap(fd, size, access=mmap.ACCESS_READ)
        except (OSError, ValueError, OverflowError) as exc:
            raise error(f"cannot map it: {getattr(exc, 'strerror', None) or exc}",
                        name=name if name is not None else os.fspath(path),
                        field=field, value=size) from None
    finally:
        os.close(fd)


def read_regular(path, error, limit: int, *, field: str = "file",
                 name: str | None = None) -> bytes:
    """The bytes of the regular file ``path``, at most ``limit`` of them.

    Raises:
        error: as :func:`open_regular`; the file is larger than ``limit``
            bytes (``value`` is its size).
    """
    name = name if name is not None else os.fspath(path)
    fd, size = open_regular(path, error, field=field, name=name)
    try:
        if size > limit:
            raise error(f"it is {size} bytes, more than the {limit} bytes "
                        "such a file may have", name=name, field=field, value=size)
        chunks, left = [], limit + 1
        while left > 0:
            try:
                chunk = os.read(fd, min(left, 1 << 20))
            except OSError as exc:
                raise error(f"cannot read it: {exc.strerror or exc}", name=name,
                            field=field, value=os.fspath(path)) from None
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        data = b"".join(chunks)
        if len(data) > limit:   # grew while read
            raise error(f"it is more than the {limit} bytes such a file may "
                        "have", name=name, field=field, value=len(data))
        return data
    finally:
        os.close(fd)
