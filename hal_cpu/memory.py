"""Small helpers to read ABI structs and pointer arrays through a backend,
with every pointer checked against the ranges it may point into."""

from __future__ import annotations

import struct

from elfloader import Backend

from .cstruct import CStruct
from .errors import LibraryError


class GuestView:
    """Reads ABI data of one loaded image through its backend.

    Every address is checked to lie inside the image (``lo``..``hi``) before
    it is read, so a corrupt table raises :class:`LibraryError` instead of
    faulting the interpreter.
    """

    def __init__(self, backend: Backend, lo: int, hi: int, name: str,
                 error=LibraryError):
        self.backend, self.lo, self.hi, self.name = backend, lo, hi, name
        self.ptr_size = backend.pointer_size
        self.error = error

    def check(self, address: int, size: int, what: str) -> None:
        if not (self.lo <= address and address + size <= self.hi):
            raise self.error(f"pointer {address:#x} (+{size}) lies outside the "
                             f"image {self.lo:#x}-{self.hi:#x}", name=self.name,
                             field=what, value=address)

    def struct(self, cstruct: CStruct, address: int, what: str) -> dict:
        layout = cstruct.layout(*self.backend.arch.c_abi)
        self.check(address, layout.size, what)
        return layout.unpack(self.backend.read(address, layout.size))

    def array(self, code: str, address: int, count: int, what: str) -> list:
        if code == "ptr":
            code = "Q" if self.ptr_size == 8 else "I"
        size = struct.calcsize("<" + code) * count
        if count == 0:
            return []
        self.check(address, size, what)
        return list(struct.unpack(f"<{count}{code}", self.backend.read(address, size)))

    def structs(self, cstruct: CStruct, address: int, count: int, what: str) -> list[dict]:
        layout = cstruct.layout(*self.backend.arch.c_abi)
        if count == 0:
            return []
        self.check(address, layout.size * count, what)
        data = self.backend.read(address, layout.size * count)
        return [layout.unpack(data, i * layout.size) for i in range(count)]

    def string(self, address: int, what: str, optional: bool = True) -> str | None:
        if address == 0 and optional:
            return None
        self.check(address, 1, what)
        return self.backend.read_cstring(address, min(4096, self.hi - address))


def ptr_array(ptr_size: int, values) -> bytes:
    return struct.pack(f"<{len(values)}{'Q' if ptr_size == 8 else 'I'}",
                       *[v & ((1 << (8 * ptr_size)) - 1) for v in values])
