"""Architecture registry: one module per architecture, looked up by ELF
identity (``e_machine`` and class) or by name."""

from __future__ import annotations

import importlib
import platform

from ..errors import UnsupportedElfError
from .base import Arch, CallingConvention, Relocation

_MODULES = ("x86_64", "aarch64", "riscv64", "x86_32", "arm32", "riscv32")


def _load_all() -> list[Arch]:
    arches = []
    for mod in _MODULES:
        try:
            arches.append(importlib.import_module("." + mod, __name__).ARCH)
        except ModuleNotFoundError as exc:
            if exc.name != f"{__name__}.{mod}":
                raise
    return arches


ARCHES: list[Arch] = _load_all()
_BY_NAME = {}
for _a in ARCHES:
    for _n in (_a.name,) + _a.aliases:
        _BY_NAME[_n.lower()] = _a


def names() -> list[str]:
    """Canonical names of the supported architectures."""
    return [a.name for a in ARCHES]


def by_name(name: str) -> Arch:
    """The architecture called ``name`` (canonical name or alias).

    Raises:
        UnsupportedElfError: unknown name; the message lists the known ones.
    """
    arch = _BY_NAME.get(name.lower())
    if arch is None:
        raise UnsupportedElfError(
            f"unknown architecture {name!r}; supported: {', '.join(names())}",
            field="arch", value=name)
    return arch


def by_elf(machine: int, elf_class: int) -> Arch | None:
    """The architecture for ELF ``e_machine`` and class (32 or 64), or None."""
    for arch in ARCHES:
        if arch.machine == machine and arch.elf_class == elf_class:
            return arch
    return None


def host() -> Arch | None:
    """The architecture of the running interpreter, or None if unsupported
    (or if the interpreter's pointer width differs, e.g. 32-bit Python)."""
    import struct
    bits = struct.calcsize("P") * 8
    m = platform.machine()
    for arch in ARCHES:
        if m in arch.host_names and arch.elf_class == bits:
            return arch
    return None


__all__ = ["Arch", "CallingConvention", "Relocation", "ARCHES", "names",
           "by_name", "by_elf", "host"]
