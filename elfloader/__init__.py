"""A pure-Python loader for platform-agnostic ELF shared objects.

It verifies an ELF (32/64-bit, little endian), maps its PT_LOAD segments,
applies relocations, runs initializers, finds exports through the dynamic
symbol table and sets segment protections, in a *native* backend (this CPU,
ctypes + mmap) or an *emulated* one (unicorn, any supported architecture).
"""

from __future__ import annotations

import os

from . import arch
from .arch import Arch
from .backend import Backend, as_int32, open_backend
from .errors import (ArchitectureMismatchError, BackendError, ElfError,
                     ElfFormatError, EmulationError, RelocationError,
                     SymbolNotFoundError, UndefinedSymbolError,
                     UnsupportedElfError)
from .module import ElfImage, ElfModule

arch_mod = arch  # the module, for functions whose ``arch`` argument hides it
_FATELF_MAGIC = (0x1F0E70FA).to_bytes(4, "little")


def read_image(source, *, arch: Arch | str | None = None,
               name: str | None = None) -> ElfImage:
    """Read an ELF, or pick one out of a FatELF bundle, and verify it.

    Args:
        source: a path, or the file's bytes.
        arch: architecture wanted from a bundle (name or :class:`Arch`);
            None means the host's. For a plain ELF, when given, it must
            match the file.
        name: file name for messages (defaults to the path).

    Raises:
        ElfError subclasses; FatELF problems raise ``fatelf.FatElfError``.
    """
    if isinstance(source, (str, os.PathLike)):
        name = name or os.fspath(source)
        try:
            with open(source, "rb") as f:
                data = f.read()
        except OSError as exc:
            raise ElfFormatError(exc.strerror or str(exc), name=name,
                                 field="file", value=os.fspath(source)) from None
    else:
        data = bytes(source)
    name = name or "<memory>"
    want = arch_mod.by_name(arch) if isinstance(arch, str) else arch
    if data[:4] == _FATELF_MAGIC:
        import fatelf
        pick = want or arch_mod.host()
        if pick is None:
            raise ArchitectureMismatchError(
                "no architecture named and the host has none", name=name,
                field="arch")
        data = fatelf.FatElf.parse(data, name=name).select(
            machine=pick.machine, word_size=pick.elf_class)
        name = f"{name}[{pick.name}]"
    image = ElfImage(data, name)
    if want is not None and image.arch is not want:
        raise ArchitectureMismatchError(
            f"file is {image.arch.name}, not {want.name}", name=name,
            field="e_machine", value=image.arch.name)
    return image


def load(source, *, arch: Arch | str | None = None, backend="auto",
         **options) -> ElfModule:
    """Load an ELF or FatELF into a new or given backend.

    Args:
        source: path or bytes.
        arch: expected architecture / record to select.
        backend: ``"auto"``, ``"native"``, ``"emulated"`` or a
            :class:`Backend` to load into (shared with other modules).

    Returns:
        The loaded :class:`ElfModule`; ``module.backend`` is its backend.
    """
    if isinstance(backend, Backend):
        image = read_image(source, arch=arch or backend.arch)
        return ElfModule(image, backend)
    image = read_image(source, arch=arch)
    be = open_backend(image.arch, backend, **options)
    try:
        return ElfModule(image, be)
    except BaseException:
        be.close()
        raise


__all__ = ["Arch", "Backend", "ElfImage", "ElfModule", "open_backend", "load",
           "read_image", "as_int32", "ElfError", "ElfFormatError",
           "UnsupportedElfError", "RelocationError", "SymbolNotFoundError",
           "UndefinedSymbolError", "BackendError", "ArchitectureMismatchError",
           "EmulationError"]
