"""Backends: where guest memory lives and how guest code runs."""

from __future__ import annotations

from .. import arch as arch_registry
from ..arch import Arch
from .base import PROT_EXEC, PROT_NONE, PROT_READ, PROT_WRITE, Backend, as_int32

KINDS = ("auto", "native", "emulated")


def open_backend(arch: Arch | str | None = None, kind: str = "auto",
                 **options) -> Backend:
    """Create a backend for ``arch``.

    Args:
        arch: an :class:`Arch` or name; None means the host architecture.
        kind: ``"native"``, ``"emulated"`` or ``"auto"`` (native when ``arch``
            is the host architecture and no CPU profile, vector length or
            engine is asked for, else emulated).
        options: for the emulated backend: ``timeout`` (seconds),
            ``engine`` (``"auto"``, ``"qemu"``, ``"unicorn"``), ``cpu`` (a
            profile name of :data:`fatelf.arches.PROFILES`), ``vlen``
            (bits); see :class:`~elfloader.backend.emulated.EmulatedBackend`.

    Raises:
        ArchitectureMismatchError: native asked for a foreign architecture.
        UnsupportedElfError: unknown architecture name or kind.
    """
    from ..errors import UnsupportedElfError
    if isinstance(arch, str):
        arch = arch_registry.by_name(arch)
    host = arch_registry.host()
    if arch is None:
        arch = host
    emulation = {k: v for k, v in options.items()
                 if k in ("engine", "cpu", "vlen") and v not in (None, "auto")}
    if kind == "auto":
        kind = ("native" if arch is host and host is not None and not emulation
                else "emulated")
    if kind == "native":
        if emulation:
            raise UnsupportedElfError(
                f"{', '.join(emulation)} select an emulated CPU: use the "
                f"emulated backend", field="backend", value=kind)
        from .native import NativeBackend
        return NativeBackend(arch)
    if kind == "emulated":
        if arch is None:
            raise UnsupportedElfError("this host's architecture is not one the runtime "
                                      "supports: name an architecture", field="arch")
        from .emulated import EmulatedBackend
        return EmulatedBackend(arch, **options)
    raise UnsupportedElfError(f"unknown backend {kind!r}; use one of "
                              f"{', '.join(KINDS)}", field="backend", value=kind)


__all__ = ["Backend", "open_backend", "as_int32", "PROT_NONE", "PROT_READ",
           "PROT_WRITE", "PROT_EXEC", "KINDS"]
