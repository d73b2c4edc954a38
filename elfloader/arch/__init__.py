"""Architecture registry: one module per architecture, looked up by ELF
identity (``e_machine`` and class) or by any name the project's
architecture table (:mod:`fatelf.arches`) accepts.

Each module holds one :class:`Arch`: its psABI, disassembly and
system-call facts, how qemu-user and unicorn run it, and what is built for
it (:mod:`.base`). The per-architecture tables of the layers above are
derived from :data:`ARCHES`."""

from __future__ import annotations

import importlib

from fatelf import arches as table
from fatelf.errors import FatElfSelectError

from ..errors import UnsupportedElfError
from .base import (
    Arch,
    BuildTargets,
    CallingConvention,
    Disassembly,
    QemuUser,
    Relocation,
    SystemCalls,
    UnicornModel,
)

#: The :class:`Arch` of every runtime architecture, in the order of
#: :data:`fatelf.arches.RUNTIME_ARCHES`.
ARCHES: list[Arch] = [importlib.import_module("." + name, __name__).ARCH
                      for name in table.RUNTIME_ARCHES]
_BY_INFO = {a.info.name: a for a in ARCHES}


def names() -> list[str]:
    """Canonical names of the supported architectures."""
    return [a.name for a in ARCHES]


def by_name(name: str) -> Arch:
    """The architecture called ``name`` (canonical name or any alias of the
    architecture table, e.g. ``arm64``, ``i686``, ``rv32``).

    Raises:
        UnsupportedElfError: unknown or unsupported name (field ``arch``);
            the message lists the accepted names.
    """
    try:
        return _BY_INFO[table.lookup(name, runtime=True).name]
    except FatElfSelectError as exc:
        raise UnsupportedElfError(exc.message, field="arch", value=name) from None


def resolve(arch: Arch | str | None) -> Arch | None:
    """``arch`` as an :class:`Arch` (names are looked up; None stays None)."""
    return by_name(arch) if isinstance(arch, str) else arch


def by_elf(machine: int, elf_class: int) -> Arch | None:
    """The architecture for ELF ``e_machine`` and class (32 or 64), or None."""
    info = table.by_target(machine, elf_class)
    return _BY_INFO.get(info.name) if info else None


def host() -> Arch | None:
    """The architecture of the running interpreter, or None if unsupported
    (or if the interpreter's pointer width differs, e.g. 32-bit Python)."""
    info = table.host()
    return _BY_INFO.get(info.name) if info else None


__all__ = ["Arch", "BuildTargets", "CallingConvention", "Disassembly", "QemuUser", "Relocation",
           "SystemCalls", "UnicornModel", "ARCHES", "names", "by_name", "by_elf", "host",
           "resolve"]
