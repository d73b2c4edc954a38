"""C structs described once as data and laid out for a pointer width.

The project's one struct layer: ELF headers and tables, FatELF headers and
records, IREE's executable library and plugin ABI structs, plugin parameter
structs and pointer arrays are all :class:`CStruct` descriptions. A
description lists its fields with C types; :meth:`CStruct.layout` computes
offsets with the natural alignment rules of the C ABIs the project runs
(every scalar aligned to its size, except 64-bit integers on i386, which are
4-byte aligned; a struct aligned to its largest member) for 4- or 8-byte
pointers. Everything is little endian. Both backends read and write the same
bytes.

Field types:

=========  ==============================================================
``u8`` ``u16`` ``u32`` ``u64``  unsigned integers of that many bits
``i8`` ``i16`` ``i32`` ``i64``  signed integers
``f32`` ``f64``                 IEEE floats
``ptr``                         pointer / ``uintptr_t`` / ``size_t`` /
                                ``Elf_Addr``: the pointer width, unsigned
``sptr``                        ``intptr_t`` / ``Elf_Sxword``: signed
``size``                        ``size_t`` / ``iree_host_size_t`` (= ``ptr``)
CStruct                         another struct, nested by value
``(type, n)``                   an array of ``n`` elements
=========  ==============================================================
"""

from __future__ import annotations

import struct
from functools import lru_cache
from typing import Sequence

_FIXED = {"u8": "B", "u16": "H", "u32": "I", "u64": "Q", "i8": "b",
          "i16": "h", "i32": "i", "i64": "q", "f32": "f", "f64": "d"}
_WORD = {("ptr", 4): "I", ("ptr", 8): "Q", ("size", 4): "I", ("size", 8): "Q",
         ("sptr", 4): "i", ("sptr", 8): "q"}


def scalar_code(ctype: str, ptr_size: int) -> str:
    """``struct`` format code of a scalar field type for ``ptr_size``."""
    code = _FIXED.get(ctype) or _WORD.get((ctype, ptr_size))
    if code is None:
        raise ValueError(f"unknown C type {ctype!r} (pointer size {ptr_size})")
    return code


class Layout:
    """Offsets and packing of a :class:`CStruct` for one pointer width.

    Attributes:
        name: the struct's C name.
        size: ``sizeof`` in bytes; align: ``alignof``.
        offsets: field name -> byte offset (nested fields as ``outer.inner``).
        names: the flat field names in order (nested as ``outer.inner``).
    """

    size: int
    align: int
    _fmt: str
    format: str

    def __init__(self, cstruct: "CStruct", ptr_size: int, int64_align: int = 8):
        self.name = cstruct.name
        self.ptr_size = ptr_size
        self.offsets: dict[str, int] = {}
        self._fields: list[tuple[str, str, int]] = []   # flat (name, code, count)
        fmt, off, align = "<", 0, 1
        for name, ctype in cstruct.fields:
            count = 1
            if isinstance(ctype, tuple):
                ctype, count = ctype
            if isinstance(ctype, CStruct):
                sub = ctype.layout(ptr_size, int64_align)
                pad = -off % sub.align
                fmt += "x" * pad
                off += pad
                self.offsets[name] = off
                for sname, code, scount in sub._fields:
                    self._fields.append((f"{name}.{sname}", code, scount))
                for sname, soff in sub.offsets.items():
                    self.offsets[f"{name}.{sname}"] = off + soff
                fmt += sub.format[1:]
                off += sub.size
                align = max(align, sub.align)
                continue
            code = scalar_code(ctype, ptr_size)
            size = struct.calcsize(code)
            pad = -off % min(size, int64_align)
            fmt += "x" * pad
            off += pad
            self.offsets[name] = off
            self._fields.append((name, code, count))
            fmt += f"{count}{code}" if count > 1 else code
            off += size * count
            align = max(align, min(size, int64_align))
        fmt += "x" * (-off % align)
        self._fmt = fmt
        self._struct = struct.Struct(fmt)
        self.size = self._struct.size
        self.align = align
        self.names = [n for n, _, _ in self._fields]
        #: the ``struct`` format (with ``<`` and padding) of the whole struct
        self.format = fmt
        self._scalar = all(c == 1 for _, _, c in self._fields)

    def pack(self, **values) -> bytes:
        """Bytes of the struct; missing fields are zero, arrays are sequences."""
        flat = []
        for name, _, count in self._fields:
            v = values.get(name, 0)
            if count > 1:
                v = list(v) if v else []
                flat.extend(v + [0] * (count - len(v)))
            else:
                flat.append(v)
        return self._struct.pack(*flat)

    def unpack(self, data, offset: int = 0) -> dict:
        """Field name -> value (arrays as tuples, nested as ``a.b``).

        Raises:
            struct.error: ``data`` holds fewer than :attr:`size` bytes at
                ``offset`` (callers check ranges first).
        """
        raw = self._struct.unpack_from(data, offset)
        if self._scalar:
            return dict(zip(self.names, raw))
        out, i = {}, 0
        for name, _, count in self._fields:
            out[name] = raw[i] if count == 1 else tuple(raw[i:i + count])
            i += count
        return out

    def unpack_array(self, data, offset: int, count: int) -> list[dict]:
        """``count`` consecutive structs starting at ``offset``."""
        if self._scalar:
            names = self.names
            view = memoryview(data)[offset:offset + count * self.size]
            return [dict(zip(names, v)) for v in self._struct.iter_unpack(view)]
        return [self.unpack(data, offset + i * self.size) for i in range(count)]


class CStruct:
    """A C struct: a name, ``(field, type)`` pairs and where it is defined.

    Args:
        name: the C name, e.g. ``iree_hal_executable_dispatch_state_v0_t``.
        fields: ``(field name, type)`` pairs; see the module docstring.
        source: where the layout comes from (header file and version).
    """

    def __init__(self, name: str, fields, source: str = ""):
        self.name = name
        self.fields = list(fields)
        self.source = source

    @lru_cache(maxsize=None)
    def layout(self, ptr_size: int = 8, int64_align: int = 8) -> Layout:
        """Layout for ``ptr_size``-byte pointers and 64-bit integers aligned
        to ``int64_align`` bytes (pass ``*arch.c_abi``)."""
        return Layout(self, ptr_size, int64_align)

    def __hash__(self):
        return id(self)

    def __repr__(self):
        return f"<CStruct {self.name}>"


@lru_cache(maxsize=None)
def _array_struct(ctype: str, ptr_size: int, count: int) -> struct.Struct:
    return struct.Struct(f"<{count}{scalar_code(ctype, ptr_size)}")


def pack_array(ctype: str, ptr_size: int, values: Sequence[int]) -> bytes:
    """Bytes of a C array of scalars (e.g. ``ptr`` for a pointer array);
    integer values are truncated to the element width."""
    code = scalar_code(ctype, ptr_size)
    if code in "fd":
        return _array_struct(ctype, ptr_size, len(values)).pack(*values)
    mask = (1 << (8 * struct.calcsize(code))) - 1
    if code.islower():
        half = (mask + 1) >> 1
        values = [((v & mask) ^ half) - half for v in values]
    else:
        values = [v & mask for v in values]
    return _array_struct(ctype, ptr_size, len(values)).pack(*values)


def unpack_array(ctype: str, ptr_size: int, data, offset: int = 0,
                 count: int | None = None) -> list:
    """Elements of a C array of scalars (``count`` defaults to all of
    ``data`` past ``offset``)."""
    size = struct.calcsize("<" + scalar_code(ctype, ptr_size))
    if count is None:
        count = (len(data) - offset) // size
    return list(_array_struct(ctype, ptr_size, count).unpack_from(data, offset))


def sizeof(ctype: str, ptr_size: int) -> int:
    """Size in bytes of a scalar field type."""
    return struct.calcsize("<" + scalar_code(ctype, ptr_size))
