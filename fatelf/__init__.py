"""Read, write, validate and select FatELF v1 bundles.

FatELF (FatELF specification v1, icculus/fatelf
docs/fatelf-specification.txt) packs several ELF images for different
targets into one file: an 8-byte little-endian header, a table of 24-byte
records (one per ELF: e_machine, OSABI, OSABI version, word size, byte order,
offset, size) and the page-aligned ELF images.  See :mod:`fatelf.format` for
the exact layout.

    >>> import fatelf
    >>> bundle = fatelf.join([x86_64_so, aarch64_so])        # doctest: +SKIP
    >>> fatelf.FatElf.parse(bundle).arches                    # doctest: +SKIP
    ['x86_64', 'aarch64']
    >>> fatelf.select(bundle, "aarch64") == aarch64_so        # doctest: +SKIP
    True
"""

from typing import TYPE_CHECKING

from .lazy import lazy_attributes

# Public name -> the module of this package defining it. Importing the
# package imports none of them: each is imported on first use of one of its
# names (PEP 562), so that ``import fatelf.errors`` (every error of the
# project derives from it) costs only that module.
_EXPORTS = {
    "arches": ("ALIASES", "ARCHES", "RUNTIME_ARCHES", "TABLE", "ArchInfo",
               "arch_name", "arch_target", "host_arch", "lookup", "parse_arch"),
    "build": ("join", "pack", "remove", "replace"),
    "errors": ("FatElfError", "FatElfFormatError", "FatElfInputError",
               "FatElfSelectError", "PortableKernelError"),
    "format": ("MAGIC", "PAGE_SIZE", "VERSION", "FatElf", "Record", "is_fatelf",
               "read", "select", "split"),
}

if TYPE_CHECKING:
    from .arches import (
        ALIASES,
        ARCHES,
        RUNTIME_ARCHES,
        TABLE,
        ArchInfo,
        arch_name,
        arch_target,
        host_arch,
        lookup,
        parse_arch,
    )
    from .build import join, pack, remove, replace
    from .errors import (
        FatElfError,
        FatElfFormatError,
        FatElfInputError,
        FatElfSelectError,
        PortableKernelError,
    )
    from .format import MAGIC, PAGE_SIZE, VERSION, FatElf, Record, is_fatelf, read, select, split


__getattr__, __dir__ = lazy_attributes(__name__, _EXPORTS)


__all__ = [
    "ALIASES", "ARCHES", "MAGIC", "PAGE_SIZE", "RUNTIME_ARCHES", "TABLE", "VERSION",
    "ArchInfo", "FatElf", "FatElfError", "FatElfFormatError", "FatElfInputError",
    "FatElfSelectError", "PortableKernelError", "Record", "arch_name", "arch_target",
    "host_arch", "is_fatelf", "join", "lookup", "pack", "parse_arch", "read", "remove",
    "replace", "select", "split",
]
