"""Reading ABI structs and pointer arrays that a loaded image hands out,
with every pointer checked before it is followed."""

from __future__ import annotations

from fatelf.cstruct import CStruct, pack_array, sizeof, unpack_array

from elfloader import Backend, ElfModule
from elfloader.backend import PROT_EXEC, PROT_READ

from .errors import LibraryError


class GuestView:
    """Reads ABI data of one loaded image through its backend.

    Every address is checked, before it is read or called, to lie inside the
    image on pages with the needed permission (readable for data,
    executable for code), the same on both backends, so a corrupt table
    raises ``error`` (default :class:`LibraryError`) instead of faulting.

    Args:
        backend: where the image lives.
        module: the loaded image, or None for a host system library whose
            pointers cannot be checked (native backend only).
        name: file name for messages; error: the error class to raise.
    """

    def __init__(self, backend: Backend, module: ElfModule | None, name: str,
                 error=LibraryError):
        self.backend, self.module, self.name = backend, module, name
        self.ptr_size = backend.pointer_size
        self.c_abi = backend.arch.c_abi
        self.error = error

    def check(self, address: int, size: int, what: str,
              prot: int = PROT_READ) -> None:
        """Raise unless ``[address, address + size)`` lies in the image on
        pages with ``prot`` (PROT_READ or PROT_EXEC)."""
        m = self.module
        if m is None:
            if address == 0:
                raise self.error("NULL pointer", name=self.name, field=what,
                                 value=address)
            return
        if not (m.lo <= address and address + max(size, 1) <= m.hi):
            raise self.error(f"pointer {address:#x} (+{size}) lies outside the "
                             f"image {m.lo:#x}-{m.hi:#x}", name=self.name,
                             field=what, value=address)
        page = self.backend.page_size
        for p in range(address - address % page, address + max(size, 1), page):
            if not m.protection(p) & prot:
                kind = "executable" if prot & PROT_EXEC else "readable"
                raise self.error(f"pointer {address:#x} lies on a page that is "
                                 f"not {kind}", name=self.name, field=what,
                                 value=address)

    def check_code(self, address: int, what: str) -> None:
        """Raise unless ``address`` is on an executable page of the image
        (bit 0, the Thumb marker on arm32, is ignored)."""
        self.check(address & ~1, 1, what, PROT_EXEC)

    def struct(self, cstruct: CStruct, address: int, what: str) -> dict:
        layout = cstruct.layout(*self.c_abi)
        self.check(address, layout.size, what)
        return layout.unpack(self.backend.read(address, layout.size))

    def array(self, ctype: str, address: int, count: int, what: str) -> list:
        """``count`` scalars of C type ``ctype`` (``ptr``, ``u32``...)."""
        if count == 0:
            return []
        size = sizeof(ctype, self.ptr_size) * count
        self.check(address, size, what)
        return unpack_array(ctype, self.ptr_size, self.backend.read(address, size))

    def structs(self, cstruct: CStruct, address: int, count: int, what: str) -> list[dict]:
        layout = cstruct.layout(*self.c_abi)
        if count == 0:
            return []
        self.check(address, layout.size * count, what)
        return layout.unpack_array(self.backend.read(address, layout.size * count),
                                   0, count)

    def string(self, address: int, what: str, optional: bool = True) -> str | None:
        if address == 0 and optional:
            return None
        self.check(address, 1, what)
        limit = 4096
        if self.module is not None:
            limit = min(limit, self.module.hi - address)
            # Stop at the first page that is not readable.
            page = self.backend.page_size
            end = address - address % page + page
            while end < address + limit and self.module.protection(end) & PROT_READ:
                end += page
            limit = min(limit, end - address)
        return self.backend.read_cstring(address, limit)


def ptr_array(ptr_size: int, values) -> bytes:
    """Bytes of a C array of pointers (or ``size_t``)."""
    return pack_array("ptr", ptr_size, values)
