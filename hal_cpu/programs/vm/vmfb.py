"""Compiled IREE modules (``.vmfb``): the executables embedded in them.

``iree-compile`` writes a module as a ZIP archive of stored (uncompressed)
members: ``module.fb``, the VM module's FlatBuffer, and one member per
executable it embeds, named ``<executable>_<format>.so`` (an ELF, or a
FatELF bundle). The runtime reads those members with :mod:`zipfile` from a
regular file only, each stored (not compressed), within the image size limit
and inside the file (:func:`hal_cpu.programs.vm.module_def.check_zip_entry`);
``hal-cpu inspect`` lists them and ``hal-cpu run --executable=NAME`` runs one. The module's
host program (its ``module.fb``) is not interpreted: ``run-module`` and
``plan`` need the MLIR source.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from typing import TYPE_CHECKING

from fatelf.files import open_regular

from ...errors import HalCpuError

if TYPE_CHECKING:
    from zipfile import ZipFile

#: The member holding the VM module in every ``.vmfb``.
MODULE_MEMBER = "module.fb"
#: Largest embedded executable read, in bytes (the loader's image limit).
MAX_MEMBER_BYTES = 1 << 30
_ZIP_MAGIC = b"PK\x03\x04"


class ModuleFileError(HalCpuError):
    """A ``.vmfb`` that cannot be read, or an executable it does not hold."""


@dataclass(frozen=True)
class Embedded:
    """One executable in a ``.vmfb``.

    Attributes:
        name: the member's name without ``.so`` (e.g.
            ``mm_rowsum_linked_embedded_elf_x86_64``); member: the member's
            name; size: its size in bytes.
    """

    name: str
    member: str
    size: int


def is_module_file(path) -> bool:
    """Whether ``path`` is a regular file starting like a ``.vmfb`` (a ZIP
    archive); reads four bytes. False for anything that cannot be read."""
    try:
        fd, size = open_regular(path, ModuleFileError)
    except ModuleFileError:
        return False
    with os.fdopen(fd, "rb") as f:
        return size >= 4 and f.read(4) == _ZIP_MAGIC


def _open(path) -> "ZipFile":
    import zipfile

    from .module_def import check_zip_entry
    fd, size = open_regular(path, ModuleFileError)
    f = os.fdopen(fd, "rb")
    try:
        archive = zipfile.ZipFile(f)
    except (zipfile.BadZipFile, OSError, ValueError, EOFError, struct.error,
            OverflowError, NotImplementedError) as exc:
        f.close()
        raise ModuleFileError(f"not a compiled IREE module: {exc}",
                              name=os.fspath(path), field="file",
                              value=os.fspath(path)) from None
    try:
        # every member stored, its declared size within the file and the
        # limit, before any member is read
        for info in archive.infolist():
            check_zip_entry(info, size, name=os.fspath(path), limit=MAX_MEMBER_BYTES,
                            error=ModuleFileError)
    except ModuleFileError:
        archive.close()
        f.close()
        raise
    if MODULE_MEMBER not in archive.namelist():
        archive.close()
        f.close()
        raise ModuleFileError(f"a ZIP archive without {MODULE_MEMBER}: not a "
                              "compiled IREE module", name=os.fspath(path),
                              field="file", value=os.fspath(path))
    return archive


def executables(path) -> list[Embedded]:
    """The executables embedded in the ``.vmfb`` at ``path``, in archive
    order.

    Raises:
        ModuleFileError: not a regular file, not a ZIP archive with
            ``module.fb``.
    """
    with _open(path) as archive:
        return [Embedded(i.filename.removesuffix(".so"), i.filename, i.file_size)
                for i in archive.infolist()
                if i.filename != MODULE_MEMBER and not i.is_dir()]


def read_executable(path, name: str | None) -> tuple[bytes, str]:
    """The bytes of one embedded executable and a label for messages
    (``file.vmfb:member``).

    Args:
        path: the ``.vmfb``.
        name: the executable's name (with or without ``.so``, or the part
            before ``_embedded_elf_``); None when the module holds only one.

    Raises:
        ModuleFileError: no such executable (the message lists them), none
            named while several exist, a member over
            :data:`MAX_MEMBER_BYTES`, or an unreadable archive.
    """
    found = executables(path)
    label = os.fspath(path)
    if name is None:
        if len(found) != 1:
            raise ModuleFileError(
                f"it embeds {len(found)} executables; name one with "
                f"--executable=NAME: {', '.join(e.name for e in found) or '(none)'}",
                name=label, field="--executable", value=None)
        pick = found[0]
    else:
        matches = [e for e in found if name in (e.name, e.member)
                   or e.name.split("_embedded_elf_")[0] == name]
        if len(matches) != 1:
            names = ", ".join(e.name for e in found) or "(none)"
            raise ModuleFileError(
                (f"no executable {name!r}" if not matches else
                 f"{name!r} names {len(matches)} executables")
                + f"; it embeds: {names}", name=label, field="--executable",
                value=name)
        pick = matches[0]
    if pick.size > MAX_MEMBER_BYTES:
        raise ModuleFileError(f"executable {pick.name} is {pick.size} bytes, "
                              f"more than {MAX_MEMBER_BYTES}", name=label,
                              field="--executable", value=pick.size)
    import zipfile
    with _open(path) as archive:
        try:
            with archive.open(pick.member) as member:
                data = member.read(MAX_MEMBER_BYTES + 1)
        except (zipfile.BadZipFile, OSError, ValueError, EOFError,
                NotImplementedError) as exc:
            raise ModuleFileError(f"cannot read executable {pick.name}: {exc}",
                                  name=label, field="--executable",
                                  value=pick.name) from None
    return data, f"{label}:{pick.member}"


def check_source(path) -> None:
    """Check that ``path`` can be MLIR source: a regular file (opened
    without blocking) that is not a compiled module.

    Raises:
        ModuleFileError: not a regular file (a FIFO, a device, a
            directory), unreadable, or a ``.vmfb`` (the message says what to
            pass instead and that inspect/run take its executables).
    """
    fd, size = open_regular(path, ModuleFileError, field="program")
    os.close(fd)
    if is_module_file(path):
        raise ModuleFileError(
            "a compiled IREE module (.vmfb); this command needs the MLIR "
            "source it was compiled from (hal-cpu inspect lists the "
            "executables in a .vmfb and hal-cpu run --executable=NAME runs "
            "one)", name=os.fspath(path), field="program",
            value=os.fspath(path))
    check_text(path, size)


#: Largest MLIR program read, in bytes.
MAX_SOURCE_BYTES = 1 << 30


def check_text(path, size: int | None = None) -> None:
    """Check that the program at ``path`` is UTF-8 text (MLIR is), reading
    it in chunks.

    Raises:
        ModuleFileError: larger than :data:`MAX_SOURCE_BYTES`, or bytes
            that are not UTF-8 (``value`` is the byte offset of the first
            one; the message shows the bytes and the line).
    """
    import codecs
    name = os.fspath(path)
    fd, size = open_regular(path, ModuleFileError, field="program")
    with os.fdopen(fd, "rb") as f:
        if size > MAX_SOURCE_BYTES:
            raise ModuleFileError(f"it is {size} bytes, more than the "
                                  f"{MAX_SOURCE_BYTES} bytes a program may have",
                                  name=name, field="program", value=size)
        decoder = codecs.getincrementaldecoder("utf-8")()
        offset, line = 0, 1
        while True:
            chunk = f.read(1 << 20)
            try:
                decoder.decode(chunk, final=not chunk)
            except UnicodeDecodeError as exc:
                at = offset + exc.start
                line += chunk.count(b"\n", 0, exc.start)
                bad = chunk[exc.start:exc.end].hex(" ")
                raise ModuleFileError(
                    f"byte {at} (line {line}) is not UTF-8 text (bytes {bad}); "
                    "MLIR programs are UTF-8", name=name, field="program",
                    value=at) from None
            if not chunk:
                return
            line += chunk.count(b"\n")
            offset += len(chunk)
