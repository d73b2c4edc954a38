"""Private per-user folders for caches and helper programs.

A cache or a helper program the runtime runs must not come from a folder
another local user can write: a shared temporary folder (``/tmp``,
``$TMPDIR``) lets anyone create a folder or a symlink under a name they
can guess first. Every folder the runtime keeps files in is therefore

* created mode ``0700`` (missing components too),
* opened without following a symlink (``O_NOFOLLOW | O_DIRECTORY``) and
  checked on the open descriptor: a directory, owned by this user, not
  writable by group or others (a folder of ours that others may only read
  or enter, as older releases created them, is narrowed to ``0700``),

and refused with :class:`UnsafePathError` (or the caller's error class)
naming the path, the ``field`` that was checked and the value found,
otherwise. Caches live under the user's cache home (``$XDG_CACHE_HOME``,
else ``~/.cache``); only when that cannot be created is a folder
``<temp>/portable-kernel-runtime-<uid>`` used, and it passes the same
checks before anything in it is trusted.

Files a caller reuses from such a folder are checked by
:func:`check_private_file` (a regular file, not a symlink, owned by this
user, not writable by group or others).
"""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path
from typing import Union

from .errors import FatElfError

__all__ = ["APP", "UnsafePathError", "user_cache_home", "check_private_dir", "is_private",
           "private_dir", "check_private_file", "cache_folder", "temp_root"]

PathLike = Union[str, "os.PathLike[str]"]

#: The name of the runtime's folder in the cache home (and, with the user
#: id, in the temporary folder).
APP = "portable-kernel-runtime"

#: Mode bits that let another user change a folder's entries or a file.
_WRITABLE_BY_OTHERS = stat.S_IWGRP | stat.S_IWOTH
#: Mode bits that give anyone but the owner any access.
_OTHERS = stat.S_IRWXG | stat.S_IRWXO


class UnsafePathError(FatElfError):
    """A folder meant to be private, or a file in one, that another user
    could control (a symlink, someone else's, writable by group or
    others, not a directory or regular file), or an output path that is a
    symlink. ``name`` is the path, ``field`` what was checked (``owner``,
    ``mode``, ``symlink``, ``type``...), ``value`` what was found."""


def user_cache_home() -> Path:
    """The user's cache home: ``$XDG_CACHE_HOME`` when it is an absolute
    path, else ``~/.cache`` (the XDG base directory rule)."""
    env = os.environ.get("XDG_CACHE_HOME", "").strip()
    if env and os.path.isabs(env):
        return Path(env)
    return Path(os.path.expanduser("~")) / ".cache"


def _refuse(error, path, field: str, value, message: str):
    return error(message, name=os.fspath(path), field=field, value=value)


def _check_stat(st: os.stat_result, path, error, *, field: str, narrow: bool,
                readable: bool, fd: int | None) -> None:
    uid = os.getuid()
    if st.st_uid != uid:
        raise _refuse(error, path, f"{field}.owner", st.st_uid,
                      f"owned by uid {st.st_uid}, not by this user (uid {uid}); "
                      f"another user may have made it: remove it or choose "
                      f"another folder")
    mode = stat.S_IMODE(st.st_mode)
    if mode & _WRITABLE_BY_OTHERS:
        raise _refuse(error, path, f"{field}.mode", oct(mode),
                      f"mode {mode:#o} lets group or others change it; "
                      f"it must be private (0700)")
    if mode & _OTHERS and not readable:
        if not narrow or fd is None:
            raise _refuse(error, path, f"{field}.mode", oct(mode),
                          f"mode {mode:#o} lets group or others read it; "
                          f"it must be private (0700)")
        os.fchmod(fd, mode & ~_OTHERS)


def check_private_dir(path: PathLike, error=UnsafePathError, *,
                      field: str = "folder", narrow: bool = False,
                      readable: bool = False) -> Path:
    """Check that ``path`` is a private folder of this user.

    The folder is opened with ``O_NOFOLLOW | O_DIRECTORY`` and checked on
    the descriptor: not a symlink, a directory, owned by ``os.getuid()``,
    no write permission for group or others. Read or search permission for
    them is narrowed to ``0700`` when ``narrow`` (the folder is ours and
    nobody else could have written it), accepted when ``readable`` (a
    folder the user chose, such as a ``--cache_dir``), refused otherwise.

    Args:
        path: the folder.
        error: exception class raised (a :class:`fatelf.PortableKernelError`
            subclass, called with the message and ``name``, ``field``,
            ``value`` keywords).
        field: prefix of the errors' ``field`` (``<field>.owner``...).
        narrow: fix a mode that is only readable by others.
        readable: accept a mode that is only readable by others.

    Returns:
        ``path`` as a :class:`~pathlib.Path`.

    Raises:
        error: the folder is missing or a symlink (``<field>.symlink``), not
            a directory (``<field>.type``), someone else's
            (``<field>.owner``, value their uid) or not private
            (``<field>.mode``, value its mode).
    """
    path = Path(path)
    flags = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_NOFOLLOW", 0) \
        | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        try:
            st = os.lstat(path)
        except OSError:
            raise _refuse(error, path, field, os.fspath(path),
                          f"cannot open it: {exc.strerror or exc}") from None
        if stat.S_ISLNK(st.st_mode):
            raise _refuse(error, path, f"{field}.symlink", os.readlink(path),
                          "it is a symlink; a private folder must be a real "
                          "directory (another user may have planted it)") from None
        if not stat.S_ISDIR(st.st_mode):
            raise _refuse(error, path, f"{field}.type", stat.filemode(st.st_mode),
                          "it is not a directory") from None
        raise _refuse(error, path, field, os.fspath(path),
                      f"cannot open it: {exc.strerror or exc}") from None
    try:
        _check_stat(os.fstat(fd), path, error, field=field, narrow=narrow,
                    readable=readable, fd=fd)
    finally:
        os.close(fd)
    return path


def private_dir(path: PathLike, error=UnsafePathError, *,
                root: PathLike | None = None, field: str = "folder") -> Path:
    """A private folder of this user at ``path``, created if missing.

    Every component from ``root`` (default: ``path`` itself) down to
    ``path`` is created mode ``0700`` when missing and then checked with
    :func:`check_private_dir` (narrowing a mode others may only read);
    folders above ``root`` are created ``0700`` when missing and not
    checked (they are the user's own choice, such as the cache home).

    Raises:
        error: a component fails the checks of :func:`check_private_dir`.
        OSError: a folder cannot be created (for example a read-only home).
    """
    path = Path(path)
    top = Path(root) if root is not None else path
    if top != path and top not in path.parents:
        raise ValueError(f"{top} is not {path} or a folder above it")
    chain = [top, *(top / part for part in path.relative_to(top).parts)]
    top.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    for folder in chain:
        try:
            os.mkdir(folder, 0o700)
        except FileExistsError:
            pass
        check_private_dir(folder, error, field=field, narrow=True)
    return path


def is_private(st: os.stat_result, *, directory: bool) -> bool:
    """Whether ``st`` (an ``os.lstat`` result, so a symlink is itself) is
    what :func:`check_private_dir` accepts without narrowing (a directory
    of this user that nobody else can read or write) or, when not
    ``directory``, what :func:`check_private_file` accepts (a regular file
    of this user that nobody else can write): the same conditions as a
    yes/no, for a cheap re-check of a path that passed before."""
    mode = st.st_mode
    if directory:
        return (stat.S_ISDIR(mode) and st.st_uid == os.getuid()
                and not mode & (_WRITABLE_BY_OTHERS | _OTHERS))
    return (stat.S_ISREG(mode) and st.st_uid == os.getuid()
            and not mode & _WRITABLE_BY_OTHERS)


def check_private_file(path: PathLike, error=UnsafePathError, *,
                       field: str = "file") -> Path:
    """Check, without following a symlink, that ``path`` is a regular file
    owned by this user that group and others cannot write.

    Raises:
        error: missing (``field``), a symlink (``<field>.symlink``), not a
            regular file (``<field>.type``), someone else's
            (``<field>.owner``) or writable by others (``<field>.mode``).
    """
    path = Path(path)
    try:
        st = os.lstat(path)
    except OSError as exc:
        raise _refuse(error, path, field, os.fspath(path),
                      f"cannot read it: {exc.strerror or exc}") from None
    if stat.S_ISLNK(st.st_mode):
        raise _refuse(error, path, f"{field}.symlink", os.readlink(path),
                      "it is a symlink; only a regular file of this user is trusted")
    if not stat.S_ISREG(st.st_mode):
        raise _refuse(error, path, f"{field}.type", stat.filemode(st.st_mode),
                      "it is not a regular file")
    if st.st_uid != os.getuid():
        raise _refuse(error, path, f"{field}.owner", st.st_uid,
                      f"owned by uid {st.st_uid}, not by this user "
                      f"(uid {os.getuid()})")
    mode = stat.S_IMODE(st.st_mode)
    if mode & _WRITABLE_BY_OTHERS:
        raise _refuse(error, path, f"{field}.mode", oct(mode),
                      f"mode {mode:#o} lets group or others change it")
    return path


def temp_root() -> Path:
    """``<temp>/portable-kernel-runtime-<uid>``: the per-user folder in the
    shared temporary folder (``tempfile.gettempdir()``), used only when the
    cache home cannot be; not created or checked here."""
    return Path(tempfile.gettempdir()) / f"{APP}-{os.getuid()}"


def cache_folder(sub: str, error=UnsafePathError) -> Path:
    """The private cache folder ``sub`` of the runtime, created and checked:
    ``<cache home>/portable-kernel-runtime/<sub>`` (:func:`user_cache_home`),
    or, when that cannot be created (no writable home),
    ``<temp>/portable-kernel-runtime-<uid>/<sub>`` (:func:`temp_root`).
    Each folder from ``portable-kernel-runtime[-<uid>]`` down passes
    :func:`private_dir`'s checks.

    Raises:
        error: a folder there is a symlink, someone else's or not private
            (the error names it, ``field`` ``cache.<what>``).
        OSError: neither folder can be created.
    """
    root = user_cache_home() / APP
    try:
        return private_dir(root / sub, error, root=root, field="cache")
    except OSError:
        pass
    root = temp_root()
    return private_dir(root / sub, error, root=root, field="cache")
