"""Guest memory seen from Python: one reader and writer for every part of
the runtime that looks into a backend's memory.

:class:`GuestMemory` reads and writes bytes, C structs (a
:class:`~fatelf.cstruct.CStruct` laid out for the backend's architecture,
or a numpy structured dtype), scalar arrays, numpy arrays and C strings at
guest addresses. Its subclasses only add where addresses come from and what
is checked: :class:`GuestView` checks every pointer a loaded image hands
out before following it (library and plugin tables);
:class:`hal_cpu.plugins.ParamsView` reads an import's params struct; the
pytest fixtures (:mod:`hal_cpu.testing.pytest_plugin`) place and read test arrays.
"""

from __future__ import annotations

import operator
from typing import Mapping

import numpy as np

from elfloader import Backend, ElfModule
from elfloader.backend import PROT_EXEC, PROT_READ
from fatelf.cstruct import CStruct, pack_array, sizeof, unpack_array

from .errors import LibraryError


class GuestMemory:
    """Reads and writes the guest memory of ``backend``; every address must
    be mapped (else the backend raises :class:`elfloader.BackendError`).

    Attributes:
        backend: the backend; ptr_size: 4 or 8 (``size_t`` and pointers);
        c_abi: the key of struct layouts, ``(pointer size, int64 alignment)``.
    """

    def __init__(self, backend: Backend):
        self.backend = backend
        self.ptr_size = backend.pointer_size
        self.c_abi = backend.arch.c_abi

    @property
    def pointer_size(self) -> int:
        return self.ptr_size

    def check(self, address: int, size: int, what: str,
              prot: int = PROT_READ) -> None:
        """Raise when ``[address, address + size)`` may not be read; this
        class checks nothing (:class:`GuestView` does)."""

    def read(self, address: int, size: int, what: str = "memory") -> bytes:
        """``size`` bytes at ``address``."""
        self.check(address, size, what)
        return self.backend.read(address, size)

    def write(self, address: int, data) -> None:
        """Copy bytes-like ``data`` (or a numpy array's bytes, C order) to
        ``address``."""
        if isinstance(data, np.ndarray):
            data = np.ascontiguousarray(data).view(np.uint8).reshape(-1)
        self.backend.write(address, data)

    def pack(self, layout, values: Mapping) -> bytes:
        """Bytes of a struct: ``layout`` is a :class:`CStruct` (laid out for
        this architecture: ``ptr`` and ``size`` fields have its pointer
        width, ``u64``/``i64`` its alignment) or a numpy structured dtype
        (used as given: fixed widths). Missing fields are zero; a value may
        be anything with ``__index__`` (e.g. a guest array of the pytest
        fixtures, which stands for its address) or a float.

        Raises:
            struct.error, ValueError: a value does not fit its field.
        """
        values = {k: operator.index(v) if _is_address(v) else v
                  for k, v in values.items()}
        if isinstance(layout, CStruct):
            return layout.layout(*self.c_abi).pack(**values)
        record = np.zeros((), np.dtype(layout))
        for key, value in values.items():
            record[key] = value
        return record.tobytes()

    def struct(self, cstruct, address: int, what: str = "struct") -> dict:
        """Fields of the struct at ``address`` as a dict: ``cstruct`` is a
        :class:`CStruct` (laid out for this architecture) or a numpy
        structured dtype."""
        if isinstance(cstruct, CStruct):
            layout = cstruct.layout(*self.c_abi)
            return layout.unpack(self.read(address, layout.size, what))
        dtype = np.dtype(cstruct)
        record = np.frombuffer(self.read(address, dtype.itemsize, what), dtype)[0]
        return {name: record[name].item() for name in dtype.names}

    def structs(self, cstruct: CStruct, address: int, count: int,
                what: str = "structs") -> list[dict]:
        """``count`` consecutive structs at ``address``."""
        layout = cstruct.layout(*self.c_abi)
        if count == 0:
            return []
        return layout.unpack_array(self.read(address, layout.size * count, what),
                                   0, count)

    def scalars(self, ctype: str, address: int, count: int,
                what: str = "array") -> list:
        """``count`` scalars of C type ``ctype`` (``ptr``, ``u32``...)."""
        if count == 0:
            return []
        size = sizeof(ctype, self.ptr_size) * count
        return unpack_array(ctype, self.ptr_size, self.read(address, size, what))

    def numpy(self, address: int, dtype, shape, what: str = "array") -> np.ndarray:
        """A copy of the array of ``dtype`` and ``shape`` (an int: a count
        of elements) at ``address``, C order."""
        dtype = np.dtype(dtype)
        shape = (int(shape),) if np.ndim(shape) == 0 else tuple(shape)
        count = int(np.prod(shape, dtype=np.int64))
        data = self.read(address, dtype.itemsize * count, what)
        return np.frombuffer(data, dtype).reshape(shape).copy()

    def string(self, address: int, what: str = "string",
               optional: bool = True, limit: int = 4096) -> str | None:
        """The NUL-terminated UTF-8 string at ``address`` (at most ``limit``
        bytes); None for NULL when ``optional``."""
        if address == 0 and optional:
            return None
        self.check(address, 1, what)
        return self.backend.read_cstring(address, limit)


def _is_address(value) -> bool:
    """A value packed as an integer address: has ``__index__`` and is not
    already a plain integer or bool."""
    return (hasattr(value, "__index__") and not isinstance(value, (int, np.integer))
            and not isinstance(value, np.ndarray))


class GuestView(GuestMemory):
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
        super().__init__(backend)
        self.module, self.name = module, name
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

    def array(self, ctype: str, address: int, count: int, what: str) -> list:
        """``count`` scalars of C type ``ctype`` (``ptr``, ``u32``...)."""
        return self.scalars(ctype, address, count, what)

    def string(self, address: int, what: str = "string", optional: bool = True,
               limit: int = 4096) -> str | None:
        """As :meth:`GuestMemory.string`, stopping at the image's end and
        at its first page that is not readable."""
        if address == 0 and optional:
            return None
        self.check(address, 1, what)
        if self.module is not None:
            limit = min(limit, self.module.hi - address)
            page = self.backend.page_size
            end = address - address % page + page
            while end < address + limit and self.module.protection(end) & PROT_READ:
                end += page
            limit = min(limit, end - address)
        return self.backend.read_cstring(address, limit)


def ptr_array(ptr_size: int, values) -> bytes:
    """Bytes of a C array of pointers (or ``size_t``)."""
    return pack_array("ptr", ptr_size, values)
