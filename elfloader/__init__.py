"""A pure-Python loader for platform-agnostic ELF shared objects.

It verifies an ELF (32/64-bit, little endian), maps its PT_LOAD segments,
applies relocations, runs initializers, finds exports through the dynamic
symbol table and sets segment protections, in a *native* backend (this CPU,
ctypes + mmap) or an *emulated* one (unicorn, any supported architecture).

Importing the package imports none of its modules: each public name is
imported on first use (``elfloader.ElfImage`` imports
:mod:`elfloader.image`).
"""

from __future__ import annotations

import mmap
import os
from typing import TYPE_CHECKING

from fatelf.lazy import lazy_attributes

# Public name -> the module of this package defining it. Importing the
# package imports none of them (the backends import numpy, the arch tables
# are many modules): each is imported on first use of one of its names
# (PEP 562), and the functions below import what they use when called.
_EXPORTS = {
    "arch": ("Arch",),
    "backend": ("Backend", "as_int32", "open_backend"),
    "elf": ("file_extent",),
    "errors": ("ArchitectureMismatchError", "BackendError", "ElfError",
               "ElfFormatError", "EmulationError", "EngineError", "Fault",
               "GuardError", "RelocationError", "SymbolNotFoundError",
               "UndefinedSymbolError", "UnsupportedElfError"),
    "image": ("MAX_IMAGE_SIZE", "ElfImage"),
    "module": ("ElfModule",),
}

if TYPE_CHECKING:
    from .arch import Arch
    from .backend import Backend, as_int32, open_backend
    from .errors import (
        ArchitectureMismatchError,
        BackendError,
        ElfError,
        ElfFormatError,
        EmulationError,
        EngineError,
        Fault,
        GuardError,
        RelocationError,
        SymbolNotFoundError,
        UndefinedSymbolError,
        UnsupportedElfError,
    )
    from .image import ElfImage
    from .module import ElfModule


__getattr__, __dir__ = lazy_attributes(__name__, _EXPORTS, aliases={"arch_mod": "arch"})


def read_image(source, *, arch: Arch | str | None = None,
               name: str | None = None) -> ElfImage:
    """Read an ELF, or pick one out of a FatELF bundle, and verify it.

    Nothing is mapped and nothing of the file runs.

    Args:
        source: a path, the file's bytes, or an :class:`ElfImage` already
            verified (returned as it is, after the architecture check).
        arch: architecture wanted from a bundle (name or :class:`Arch`);
            None means the host's. For a plain ELF, when given, it must
            match the file.
        name: file name for messages (defaults to the path).

    Raises:
        ElfFormatError: unreadable file, malformed ELF or FatELF bundle.
        ArchitectureMismatchError: the file (or every record of a bundle)
            is for another architecture.
        other ElfError subclasses: see :class:`ElfImage`.
    """
    from fatelf.files import map_regular

    from . import arch as arch_mod
    from .errors import ElfFormatError
    from .image import ElfImage
    want = arch_mod.resolve(arch)
    if isinstance(source, ElfImage):
        return _check_arch(source, want)
    if isinstance(source, (str, os.PathLike)):
        name = name or os.fspath(source)
        # Mapped, not read: only the bytes the headers point at are copied.
        mapped = map_regular(source, ElfFormatError, name=name)
        try:
            return _image_of(mapped, name, want)
        finally:
            if isinstance(mapped, mmap.mmap):
                try:
                    mapped.close()
                except BufferError:   # a view still alive: the GC closes it
                    pass
    return _image_of(bytes(source), name or "<memory>", want)


def _read_image_of(data, name: str, want: Arch | None) -> ElfImage:
    """:func:`_image_of`, verified now."""
    from . import arch as arch_mod
    from .elf import file_extent
    from .errors import ArchitectureMismatchError, ElfFormatError
    from .image import MAX_IMAGE_SIZE, ElfImage
    # fatelf.is_fatelf, without importing the bundle format for an ELF
    if bytes(data[:4]) == _FATELF_MAGIC:
        import fatelf
        pick = want or arch_mod.host()
        if pick is None:
            raise ArchitectureMismatchError(
                "no architecture named and the host has none", name=name,
                field="arch")
        try:
            record = fatelf.FatElf.parse(data, name=name).find(pick.name)
        except fatelf.FatElfSelectError as exc:
            raise ArchitectureMismatchError(exc.message, name=name,
                                            field=exc.field or "arch",
                                            value=pick.name) from None
        except fatelf.FatElfError as exc:
            raise ElfFormatError(exc.message, name=name, field=exc.field,
                                 value=exc.value) from None
        name = f"{name}[{pick.name}]"
        start, end = record.offset, record.end
    else:
        start, end = 0, len(data)
    with memoryview(data) as whole:
        view = whole[start:end]
        try:
            extent = file_extent(view)
            if extent > MAX_IMAGE_SIZE:
                raise ElfFormatError(
                    f"its headers place data {extent:#x} bytes into the file, "
                    f"past the {MAX_IMAGE_SIZE:#x}-byte image limit",
                    name=name, field="file", value=extent)
            payload = bytes(view[:extent])
        finally:
            view.release()
    return _check_arch(ElfImage(payload, name), want)


#: The first bytes of a FatELF bundle (``fatelf.format.MAGIC``, little-endian).
_FATELF_MAGIC = (0x1F0E70FA).to_bytes(4, "little")

#: Images verified in this process, by content, name and architecture
#: asked for (see :func:`_image_of`), the most recently used last.
_IMAGES: dict = {}
_IMAGES_COUNT = 32
#: The largest image kept, and the most bytes kept in all.
_IMAGES_BYTES = 1 << 22
_IMAGES_TOTAL = 1 << 24


def _image_of(data, name: str, want: Arch | None) -> ElfImage:
    """The verified image in ``data`` (bytes or a file's map), or in the
    record of a FatELF bundle for ``want`` (default: the host).

    Bytes of at most :data:`_IMAGES_BYTES` are verified once per content,
    name and ``want`` in this process (the :data:`_IMAGES_COUNT` most
    recent, :data:`_IMAGES_TOTAL` bytes in all): the same bytes verify the
    same way, and an image is not
    changed once verified (loading maps copies of its bytes), so a
    program loaded again creates its executables without verifying their
    ELF again."""
    if type(data) is not bytes or len(data) > _IMAGES_BYTES:
        return _read_image_of(data, name, want)
    key = (name, None if want is None else want.name, data)
    image = _IMAGES.pop(key, None)
    if image is None:
        image = _read_image_of(data, name, want)
        kept = len(data) + sum(len(k[2]) for k in _IMAGES)
        while _IMAGES and (len(_IMAGES) >= _IMAGES_COUNT or kept > _IMAGES_TOTAL):
            kept -= len(next(iter(_IMAGES))[2])
            del _IMAGES[next(iter(_IMAGES))]
    _IMAGES[key] = image
    return image


def _check_arch(image: ElfImage, want: Arch | None) -> ElfImage:
    from .errors import ArchitectureMismatchError
    if want is not None and image.arch is not want:
        raise ArchitectureMismatchError(
            f"file is {image.arch.name}, not {want.name}", name=image.name,
            field="e_machine", value=image.arch.name)
    return image


def load(source, *, arch: Arch | str | None = None, backend="auto",
         initialize: bool = True, **options) -> ElfModule:
    """Load an ELF or FatELF into a new or given backend.

    Args:
        source: path, bytes or a verified :class:`ElfImage`.
        arch: expected architecture / record to select.
        backend: ``"auto"``, ``"native"``, ``"emulated"`` or a
            :class:`Backend` to load into (shared with other modules).
        initialize: run the file's initializers (False: map and relocate
            only, nothing of the file runs).
        options: passed to a new backend (``timeout`` for the emulated one).

    Raises:
        ElfError subclasses (see :func:`read_image` and :class:`ElfModule`);
        nothing stays mapped after a failure.

    Returns:
        The loaded :class:`ElfModule`; ``module.backend`` is its backend.
    """
    from .backend import Backend, open_backend
    from .module import ElfModule
    if isinstance(backend, Backend):
        image = read_image(source, arch=arch or backend.arch)
        return ElfModule(image, backend, initialize=initialize)
    image = read_image(source, arch=arch)
    be = open_backend(image.arch, backend, **options)
    try:
        return ElfModule(image, be, initialize=initialize)
    except BaseException:
        be.close()
        raise


__all__ = ["Arch", "Backend", "ElfImage", "ElfModule", "open_backend", "load",
           "read_image", "as_int32", "ElfError", "ElfFormatError",
           "UnsupportedElfError", "RelocationError", "SymbolNotFoundError",
           "UndefinedSymbolError", "BackendError", "ArchitectureMismatchError",
           "EmulationError", "EngineError", "Fault", "GuardError"]
