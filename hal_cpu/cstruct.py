"""C structs described once as data and laid out for a pointer width.

A :class:`CStruct` lists its fields with C types; :meth:`CStruct.layout`
computes offsets with the natural alignment rules of the C ABIs used here
(every scalar aligned to its size, except 64-bit integers on i386, which
are 4-byte aligned; the struct to its largest member) for 4- or 8-byte
pointers. Both backends read and write the same bytes.
"""

from __future__ import annotations

import struct
from functools import lru_cache

# type name -> (struct code, size); "ptr" and "size" follow the pointer width.
_SCALARS = {"u8": "B", "u16": "H", "u32": "I", "i32": "i", "u64": "Q",
            "i64": "q"}


class Layout:
    """Offsets and packing of a :class:`CStruct` for one pointer width.

    Attributes:
        size: ``sizeof`` in bytes; align: ``alignof``.
        offsets: field name -> byte offset (nested fields as ``outer.inner``).
    """

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
                fmt += sub._fmt[1:]
                off += sub.size
                align = max(align, sub.align)
                continue
            code = _SCALARS.get(ctype) or ("Q" if ptr_size == 8 else "I")
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
        """Field name -> value (arrays as tuples, nested as ``a.b``)."""
        raw = self._struct.unpack_from(data, offset)
        out, i = {}, 0
        for name, _, count in self._fields:
            out[name] = raw[i] if count == 1 else tuple(raw[i:i + count])
            i += count
        return out

    def field_struct(self, name: str) -> tuple[int, struct.Struct]:
        """(offset, struct) to patch one scalar field in place."""
        for fname, code, count in self._fields:
            if fname == name:
                return self.offsets[name], struct.Struct("<" + code * count)
        raise KeyError(name)


class CStruct:
    """A C struct: a name, ``(field, type)`` pairs and where it is defined.

    Types: ``u8 u16 u32 i32 u64 i64``, ``ptr`` (pointer), ``size``
    (``size_t``/``iree_host_size_t``), another :class:`CStruct` (nested by
    value), or ``(type, n)`` for an array.
    """

    def __init__(self, name: str, fields, source: str = ""):
        self.name = name
        self.fields = list(fields)
        self.source = source

    @lru_cache(maxsize=None)
    def layout(self, ptr_size: int, int64_align: int = 8) -> Layout:
        """Layout for ``ptr_size``-byte pointers and 64-bit integers aligned
        to ``int64_align`` bytes (pass ``*arch.c_abi``)."""
        return Layout(self, ptr_size, int64_align)

    def __hash__(self):
        return id(self)

    def __repr__(self):
        return f"<CStruct {self.name}>"
