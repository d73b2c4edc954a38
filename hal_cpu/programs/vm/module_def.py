"""A ``.vmfb``'s VM module, read and verified into plain records.

The file is untrusted. :func:`read_module` checks, before using it, every
offset, vtable, vector length, string, nested table and union of the
FlatBuffer (schema ``iree.vm.BytecodeModuleDef``, IREE's
``runtime/src/iree/schemas/bytecode_module_def.fbs``, bytecode version
17.0), the ZIP local header in front of it, and the external read-only
data behind it; then cross-checks what IREE's loader checks (function
ranges inside the bytecode, register counts within the VM's limits,
export ordinals, table lengths). Anything malformed raises
:class:`ModuleFormatError` (or :class:`UnsupportedModuleError`) naming the
file, the field (e.g. ``function_descriptors[3].bytecode_offset``) and
the value; nothing is allocated from a claimed count before the bytes for
it are known to exist.

Layout facts used here:

* a ``.vmfb`` is a ZIP archive of stored members; its first member is
  ``module.fb``, a size-prefixed FlatBuffer (4-byte length, then the
  FlatBuffer: root offset, file identifier ``IREE``). A bare ``module.fb``
  (``IREE`` at bytes 8-12) is read the same way.
* large read-only data segments are not inside the FlatBuffer: a segment
  with ``external_data_offset``/``external_data_length`` lies at
  ``align_up(end of the FlatBuffer in the file, 64) + external_data_offset``
  (the end of the FlatBuffer is the offset of its first byte after the
  size prefix plus the prefix's value); in an archive from
  ``iree-compile`` that is the data of the member holding the embedded
  executable.

The FlatBuffer's field slots are written once below as data
(:data:`SCHEMA`); every position is checked here first, then read with
the ``flatbuffers`` package's decoders (``flatbuffers.encode.Get`` with
the packers of ``flatbuffers.number_types``): the checks are this file's,
the FlatBuffers encoding is the library's.
"""

from __future__ import annotations

import bisect
import collections
import dataclasses
import hashlib
import os
import re
import struct
from dataclasses import dataclass, field
from typing import NoReturn, Union

from flatbuffers import number_types as _N
from flatbuffers.encode import Get as _fb_get

from .refs import VmError

__all__ = ["ModuleFormatError", "UnsupportedModuleError", "read_module", "ModuleDef",
           "Dependency", "ImportDef", "ExportDef", "FunctionDef", "RodataDef", "DebugInfo",
           "BYTECODE_VERSION", "MAX_MODULE_BYTES", "MAX_I32_REGISTERS", "MAX_REF_REGISTERS",
           "check_zip_entry"]


class ModuleFormatError(VmError):
    """A ``.vmfb`` (or ``module.fb``) that is malformed: ``name`` is the
    file, ``field`` the checked field (e.g.
    ``function_descriptors[3].bytecode_offset``), ``value`` the offending
    value."""


class UnsupportedModuleError(ModuleFormatError):
    """A well-formed module this runtime does not run: another bytecode
    version, unknown feature bits, a compressed member or segment."""


#: The bytecode version read: major must be equal, minor at most this.
BYTECODE_VERSION = (17, 0)
#: Largest file read, in bytes (``max_bytes=`` of :func:`read_module`).
MAX_MODULE_BYTES = 1 << 32
#: Register limits of a function, as IREE's verifier has them: the counts
#: rounded up to a power of two must fit the register ordinal masks
#: (0x7FFF for i32, 0x3FFF for refs).
MAX_I32_REGISTERS = 0x4000
MAX_REF_REGISTERS = 0x2000
#: Limits of the per-instance state a module may ask for.
MAX_GLOBAL_BYTES = 1 << 26
MAX_GLOBAL_REFS = 1 << 20
#: Alignment of external read-only data behind the FlatBuffer.
SEGMENT_ALIGNMENT = 64
#: Feature bits known (EXT_F32, EXT_F64, YIELD, UNWIND).
KNOWN_FEATURES = 0xF
FEATURE_NAMES = {0: "EXT_F32", 1: "EXT_F64", 2: "YIELD", 3: "UNWIND"}
#: Bounds of the work a debug location lookup does (nested and fused
#: locations may form cycles in a hostile file).
_LOCATION_DEPTH = 32
_LOCATION_STEPS = 512

_IDENTIFIER = b"IREE"
_ZIP_LOCAL = b"PK\x03\x04"
_MODULE_MEMBER = "module.fb"

# --- the schema, as data --------------------------------------------------------------
#: Each table's fields: name -> (slot, kind). The n-th field of a table is at
#: vtable offset 4 + 2n; a union takes two slots, its type (``u8``) and its
#: value. Kinds: scalars ``u8 i16 u32 i32 u64``, ``string``, ``table:T``,
#: ``union:U`` (a union's value), and vectors ``[u8]``, ``[i32]``,
#: ``[table:T]``, ``[struct:S]``, ``[union:U]``.
SCHEMA = {
    "BytecodeModuleDef": {
        "name": (0, "string"), "version": (1, "u32"), "requirements": (2, "u32"),
        "attrs": (3, "[table:AttrDef]"), "types": (4, "[table:TypeDef]"),
        "dependencies": (5, "[table:ModuleDependencyDef]"),
        "imported_functions": (6, "[table:ImportFunctionDef]"),
        "exported_functions": (7, "[table:ExportFunctionDef]"),
        "function_signatures": (8, "[table:FunctionSignatureDef]"),
        "rodata_segments": (9, "[table:RodataSegmentDef]"),
        "rwdata_segments": (10, "[table:RwdataSegmentDef]"),
        "module_state": (11, "table:ModuleStateDef"),
        "function_descriptors": (12, "[struct:FunctionDescriptor]"),
        "bytecode_version": (13, "u32"), "bytecode_data": (14, "[u8]"),
        "debug_database": (15, "table:DebugDatabaseDef")},
    "AttrDef": {"key": (0, "string"), "value": (1, "string")},
    "TypeDef": {"full_name": (0, "string")},
    "FunctionSignatureDef": {"calling_convention": (0, "string"),
                             "attrs": (1, "[table:AttrDef]")},
    "ModuleDependencyDef": {"name": (0, "string"), "minimum_version": (1, "u32"),
                            "flags": (2, "u32")},
    "ImportFunctionDef": {"full_name": (0, "string"),
                          "signature": (1, "table:FunctionSignatureDef"),
                          "flags": (2, "u32")},
    "ExportFunctionDef": {"local_name": (0, "string"), "internal_ordinal": (1, "i32")},
    "RodataSegmentDef": {"compression_type_type": (0, "u8"),
                         "compression_type": (1, "union:CompressionTypeDef"),
                         "embedded_data": (2, "[u8]"), "external_data_offset": (3, "u64"),
                         "external_data_length": (4, "u64")},
    "UncompressedDataDef": {},
    "RwdataSegmentDef": {"byte_size": (0, "i32")},
    "ModuleStateDef": {"global_bytes_capacity": (0, "i32"), "global_ref_count": (1, "i32")},
    "CallSiteLocDef": {"callee": (0, "i32"), "caller": (1, "i32")},
    "FileLineColLocDef": {"filename": (0, "string"), "line": (1, "i32"),
                          "column": (2, "i32")},
    "FusedLocDef": {"metadata": (0, "string"), "locations": (1, "[i32]")},
    "NameLocDef": {"name": (0, "string"), "child_location": (1, "i32")},
    "FunctionSourceMapDef": {"local_name": (0, "string"),
                             "locations": (1, "[struct:BytecodeLocationDef]")},
    "DebugDatabaseDef": {"location_table_type": (0, "[u8]"),
                         "location_table": (1, "[union:LocationTypeDef]"),
                         "functions": (2, "[table:FunctionSourceMapDef]")},
}
#: Structs: name -> fields (name, byte offset, kind); their sizes in
#: :data:`STRUCT_SIZES`.
STRUCTS = {
    "FunctionDescriptor": (("bytecode_offset", 0, "i32"), ("bytecode_length", 4, "i32"),
                           ("requirements", 8, "u32"), ("reserved", 12, "i16"),
                           ("block_count", 14, "i16"), ("i32_register_count", 16, "i16"),
                           ("ref_register_count", 18, "i16")),
    "BytecodeLocationDef": (("bytecode_offset", 0, "i32"), ("location", 4, "i32")),
}
STRUCT_SIZES = {"FunctionDescriptor": 20, "BytecodeLocationDef": 8}
#: Unions: name -> {type byte: table}; a union vector's types are the
#: vector field before it (``location_table_type``).
UNIONS = {"CompressionTypeDef": {1: "UncompressedDataDef"},
          "LocationTypeDef": {1: "CallSiteLocDef", 2: "FileLineColLocDef",
                              3: "FusedLocDef", 4: "NameLocDef"}}
#: Flag bits of dependencies and imports.
FLAG_OPTIONAL = 1 << 1
#: Union members: CompressionTypeDef and LocationTypeDef.
COMPRESSION_NONE, COMPRESSION_UNCOMPRESSED = 0, 1
LOC_NONE, LOC_CALLSITE, LOC_FILELINECOL, LOC_FUSED, LOC_NAME = range(5)
_CODES = {"u8": "B", "i16": "h", "u16": "H", "u32": "I", "i32": "i", "u64": "Q"}


def _struct(name: str) -> struct.Struct:
    fields = STRUCTS[name]
    assert [f[1] for f in fields] == sorted(f[1] for f in fields)
    s = struct.Struct("<" + "".join(_CODES[k] for _, _, k in fields))
    assert s.size == STRUCT_SIZES[name]
    return s


_DESCRIPTOR = _struct("FunctionDescriptor")
_BYTECODE_LOCATION = _struct("BytecodeLocationDef")

#: FlatBuffers scalar kinds read here: the library's packer of each.
_SCALARS = {"u8": _N.Uint8Flags.packer_type, "u16": _N.Uint16Flags.packer_type,
            "i16": _N.Int16Flags.packer_type, "u32": _N.Uint32Flags.packer_type,
            "i32": _N.Int32Flags.packer_type, "u64": _N.Uint64Flags.packer_type}
_U16 = _N.VOffsetTFlags.packer_type
_U32 = _N.UOffsetTFlags.packer_type
_I32 = _N.SOffsetTFlags.packer_type
_CCONV = re.compile(r"0[iIfFrvCD]*_[iIfFrvCD]*")


# --- records ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Dependency:
    """A module this one needs: ``name`` (e.g. ``hal``), the
    ``minimum_version`` it must report, whether it is ``optional``."""
    name: str
    minimum_version: int
    optional: bool


@dataclass(frozen=True)
class ImportDef:
    """An imported function: its full ``name`` (``hal.buffer.assert``), its
    calling convention (``0rrrIii_v``; ``""`` when absent), whether it is
    ``optional`` and its signature's ``attrs``."""
    name: str
    cconv: str
    optional: bool
    attrs: dict


@dataclass(frozen=True)
class ExportDef:
    """An exported function: its local ``name``, the internal ``function``
    ordinal implementing it, that function's ``cconv`` and ``attrs`` (e.g.
    ``iree.abi.declaration``, ``iree.reflection``)."""
    name: str
    function: int
    cconv: str
    attrs: dict


@dataclass(frozen=True)
class FunctionDef:
    """An internal function (ordinal order).

    Attributes:
        ordinal: its index; name: its name in the debug database, else the
            first export naming it, else ``__func<ordinal>``; cconv: its
            calling convention (``""`` when absent); bytecode_offset,
            bytecode_length: its range in the module's bytecode (checked
            inside it); i32_register_count, ref_register_count: registers
            (within :data:`MAX_I32_REGISTERS`, :data:`MAX_REF_REGISTERS`);
            requirements: feature bits; block_count: blocks (at least 1);
            attrs: its signature's attributes.
    """
    ordinal: int
    name: str
    cconv: str
    bytecode_offset: int
    bytecode_length: int
    i32_register_count: int
    ref_register_count: int
    requirements: int
    block_count: int
    attrs: dict = field(default_factory=dict)


@dataclass(frozen=True)
class RodataDef:
    """A read-only data segment.

    Attributes:
        index: its ordinal; size: bytes; alignment: the largest power of two
            up to 64 dividing its offset in the file (the file does not
            record the alignment asked for); mime_type: None (bytecode 17.0
            does not record one); external: True when the data lies behind
            the FlatBuffer (an embedded executable); offset: where its bytes
            start in the file (or bytes) read.
    """
    index: int
    size: int
    alignment: int
    mime_type: str | None
    external: bool = False
    offset: int = 0


@dataclass(frozen=True)
class DebugInfo:
    """The module's debug database: source locations of bytecode offsets.

    Attributes:
        function_names: per internal function (ordinal order), the name of
            its source map (``None`` where it has none).

    A source map is the function's of the same index, as the schema says,
    unless its name is the name of exactly one export: iree-compile 3.x
    writes every function's map at index 0, where the last one encoded
    stays (the module initializer's, ``__init``), so the name tells which
    function it describes.
    """
    function_names: tuple
    _table: tuple = field(repr=False, compare=False, default=())
    _maps: tuple = field(repr=False, compare=False, default=())
    _index: dict = field(repr=False, compare=False, default_factory=dict)

    def locations(self, ordinal: int) -> tuple:
        """``(bytecode offset, location or None)`` of every op of function
        ``ordinal`` that has one (offsets relative to the function's start,
        as the file lists them); ``()`` without a source map."""
        if not 0 <= ordinal < len(self._maps):
            return ()
        return tuple((off, self._format(loc)) for off, loc in self._maps[ordinal])

    def location(self, ordinal: int, offset: int, *, nearest: bool = False) -> str | None:
        """``file:line:col`` of the op at ``offset`` (relative to the start
        of function ``ordinal``): the innermost file location (for a call
        site, the callee's), or None when unknown. With ``nearest``, the
        last op at or before ``offset`` that has a location entry."""
        loc = self._entry(ordinal, offset, nearest)
        return None if loc is None else self._format(loc)

    def stack(self, ordinal: int, offset: int, *, nearest: bool = False) -> tuple:
        """Every file location of the op, innermost first (for call sites:
        the callee, then its callers); ``()`` when unknown."""
        loc = self._entry(ordinal, offset, nearest)
        if loc is None:
            return ()
        out: list[str] = []
        self._walk(loc, 0, [0], out, all_frames=True)
        return tuple(out)

    def _entry(self, ordinal, offset, nearest):
        if not 0 <= ordinal < len(self._maps):
            return None
        index = self._index.get(ordinal)
        if index is None:
            first: dict = {}
            for off, loc in self._maps[ordinal]:
                first.setdefault(off, loc)
            index = self._index[ordinal] = (first, sorted(first))
        first, keys = index
        loc = first.get(offset)
        if loc is None and nearest:
            at = bisect.bisect_right(keys, offset) - 1
            loc = first[keys[at]] if at >= 0 else None
        return loc

    def _format(self, loc: int) -> str | None:
        out: list[str] = []
        self._walk(loc, 0, [0], out, all_frames=False)
        return out[0] if out else None

    def _walk(self, loc, depth, steps, out, all_frames) -> None:
        steps[0] += 1
        if depth > _LOCATION_DEPTH or steps[0] > _LOCATION_STEPS or (out and not all_frames):
            return
        entry = self._table[loc]
        kind = entry[0]
        if kind == LOC_FILELINECOL:
            out.append(f"{entry[1]}:{entry[2]}:{entry[3]}")
        elif kind == LOC_CALLSITE:
            self._walk(entry[1], depth + 1, steps, out, all_frames)
            if all_frames:
                self._walk(entry[2], depth + 1, steps, out, all_frames)
        elif kind == LOC_FUSED:
            for child in entry[2]:
                before = len(out)
                self._walk(child, depth + 1, steps, out, all_frames)
                if len(out) > before or steps[0] > _LOCATION_STEPS:
                    break
        elif kind == LOC_NAME and entry[2] is not None:
            self._walk(entry[2], depth + 1, steps, out, all_frames)


@dataclass(frozen=True)
class ModuleDef:
    """A verified VM module.

    Attributes:
        name: the module's namespace (e.g. ``module``); version: its
            version; bytecode_version: ``(major, minor)``; requirements:
            feature bits (1 EXT_F32, 2 EXT_F64, 4 YIELD, 8 UNWIND);
            dependencies; types: type names in table order; imports;
            exports; functions: internal functions in ordinal order;
            rodata: read-only segments (bytes: :meth:`rodata_bytes`);
            global_bytes: bytes of primitive globals; global_refs: ref
            globals; rwdata: byte sizes of read-write segments; debug: the
            debug database or None; attrs: module attributes; source: the
            file's name for messages.
    """
    name: str
    version: int
    bytecode_version: tuple
    requirements: int
    dependencies: tuple
    types: tuple
    imports: tuple
    exports: tuple
    functions: tuple
    rodata: tuple
    global_bytes: int
    global_refs: int
    debug: DebugInfo | None
    attrs: dict = field(default_factory=dict)
    rwdata: tuple = ()
    source: str = "<memory>"
    _data: memoryview = field(default=memoryview(b""), repr=False, compare=False)
    _bytecode: tuple = field(default=(0, 0), repr=False, compare=False)

    def rodata_bytes(self, index: int) -> memoryview:
        """The bytes of read-only segment ``index`` (a read-only view of the
        file's bytes: nothing is copied)."""
        if not isinstance(index, int) or not 0 <= index < len(self.rodata):
            raise ModuleFormatError(f"no read-only segment {index!r} (the module has "
                                    f"{len(self.rodata)})", name=self.source,
                                    field="rodata", value=index)
        seg = self.rodata[index]
        return self._data[seg.offset:seg.offset + seg.size]

    def function_bytecode(self, ordinal: int) -> memoryview:
        """Exactly the bytecode of internal function ``ordinal``."""
        if not isinstance(ordinal, int) or not 0 <= ordinal < len(self.functions):
            raise ModuleFormatError(f"no internal function {ordinal!r} (the module has "
                                    f"{len(self.functions)})", name=self.source,
                                    field="functions", value=ordinal)
        fn = self.functions[ordinal]
        start = self._bytecode[0] + fn.bytecode_offset
        return self._data[start:start + fn.bytecode_length]

    @property
    def bytecode(self) -> memoryview:
        """The module's whole bytecode block."""
        start, length = self._bytecode
        return self._data[start:start + length]

    def export(self, name: str) -> ExportDef:
        """The export called ``name``."""
        for e in self.exports:
            if e.name == name:
                return e
        raise ModuleFormatError(f"no export {name!r}; it exports: "
                                + (", ".join(e.name for e in self.exports) or "(none)"),
                                name=self.source, field="exported_functions", value=name)


# --- checked FlatBuffer access ---------------------------------------------------------
class _Fb:
    """A FlatBuffer (``buf``: the bytes after the size prefix) whose reads
    are checked first."""

    def __init__(self, buf: memoryview, name: str, base: int):
        self.buf = buf
        self.size = len(buf)
        self.name = name
        self.base = base          # offset of buf[0] in the file

    def fail(self, field_: _Where, message: str, value=None,
             cls=ModuleFormatError) -> NoReturn:
        raise cls(message, name=self.name, field=_name(field_), value=value)

    def get(self, kind: str, pos: int, field_: _Where):
        scalar = _SCALARS[kind]
        if pos < 0 or pos + scalar.size > self.size:
            self.fail(field_, f"{kind} at {pos} lies outside the {self.size}-byte "
                      "FlatBuffer", pos)
        return _fb_get(scalar, self.buf, pos)

    def uoffset_target(self, pos: int, field_: _Where, align: int = 4) -> int:
        # (the checks of get inline: this runs for every table and string)
        if 0 <= pos <= self.size - 4:
            rel = _fb_get(_U32, self.buf, pos)
        else:
            rel = self.get("u32", pos, field_)
        target = pos + rel
        if rel == 0 or target + 4 > self.size:
            self.fail(field_, f"offset {rel} at {pos} points outside the {self.size}-byte "
                      "FlatBuffer", rel)
        if target % align:
            self.fail(field_, f"offset {rel} at {pos} points to {target}, not "
                      f"{align}-byte aligned", target)
        return target

    def table(self, pos: int, schema: str, field_: _Where) -> "_Table":
        if pos % 4 or pos < 0 or pos + 4 > self.size:
            self.fail(field_, f"table at {pos} is misaligned or outside the FlatBuffer", pos)
        vt = pos - _fb_get(_I32, self.buf, pos)       # pos + 4 <= size: checked
        if vt < 0 or vt % 2 or vt + 4 > self.size:
            self.fail((field_, "vtable"), f"vtable at {vt} lies outside the FlatBuffer", vt)
        vt_size = _fb_get(_U16, self.buf, vt)        # vt + 4 <= size: checked
        t_size = _fb_get(_U16, self.buf, vt + 2)
        if vt_size < 4 or vt_size % 2 or vt + vt_size > self.size:
            self.fail((field_, "vtable"), f"vtable size {vt_size} at {vt} is invalid",
                      vt_size)
        if t_size < 4 or pos + t_size > self.size:
            self.fail((field_, "vtable"), f"table size {t_size} at {pos} runs past the "
                      "FlatBuffer", t_size)
        return _Table(self, pos, vt, vt_size, t_size, SCHEMA[schema], field_)


class _Table:
    __slots__ = ("fb", "pos", "vt", "vt_size", "t_size", "slots", "path")

    def __init__(self, fb, pos, vt, vt_size, t_size, slots, path):
        self.fb, self.pos, self.vt, self.vt_size, self.t_size = fb, pos, vt, vt_size, t_size
        self.slots, self.path = slots, path

    def _field(self, name: str, size: int) -> int | None:
        """Absolute position of field ``name`` (``size`` bytes) or None."""
        voff = 4 + 2 * self.slots[name][0]
        if voff + 2 > self.vt_size:
            return None
        off = _fb_get(_U16, self.fb.buf, self.vt + voff)     # inside the checked vtable
        if off == 0:
            return None
        if off < 4 or off + size > self.t_size:
            self.fb.fail((self.path, name), f"field at {off} lies outside its "
                         f"{self.t_size}-byte table", off)
        return self.pos + off

    def has(self, name: str) -> bool:
        return self._field(name, 1) is not None

    def scalar(self, name: str, kind: str, default: int = 0) -> int:
        scalar = _SCALARS[kind]
        pos = self._field(name, scalar.size)
        if pos is None:
            return default
        return _fb_get(scalar, self.fb.buf, pos)

    def _target(self, name: str) -> int | None:
        pos = self._field(name, 4)
        if pos is None:
            return None
        return self.fb.uoffset_target(pos, (self.path, name))

    def table(self, name: str, schema: str) -> "_Table | None":
        target = self._target(name)
        return None if target is None else self.fb.table(target, schema, (self.path, name))

    def vector(self, name: str, elem_size: int) -> tuple[int, int] | None:
        """``(start of the elements, count)`` or None; the elements are
        checked to lie inside the FlatBuffer."""
        target = self._target(name)
        if target is None:
            return None
        return _vector_at(self.fb, target, elem_size, (self.path, name))

    def string(self, name: str, required: bool = False) -> str | None:
        target = self._target(name)
        if target is None:
            if required:
                self.fb.fail((self.path, name), "missing", None)
            return None
        return _string_at(self.fb, target, (self.path, name))

    def tables(self, name: str, schema: str) -> list:
        vec = self.vector(name, 4)
        if vec is None:
            return []
        start, count = vec
        path = (self.path, name)
        return [self.fb.table(self.fb.uoffset_target(start + 4 * i, (path, i)),
                              schema, (path, i)) for i in range(count)]


#: Where a field is, for an error: ``"name"``, or ``(where, "name")`` (a
#: field of a table) or ``(where, index)`` (an element of a vector), made
#: a string (:func:`_name`) only when an error names it.
_Where = Union[str, tuple]


def _name(where) -> str:
    """``types[3].full_name`` of ``(((\"\", "types"), 3), "full_name")``."""
    if isinstance(where, str):
        return where
    base, part = where
    base = _name(base)
    if isinstance(part, int):
        return f"{base}[{part}]"
    return f"{base}.{part}" if base else part


def _vector_at(fb: _Fb, pos: int, elem_size: int, path: _Where) -> tuple[int, int]:
    if 0 <= pos <= fb.size - 4:
        count = _fb_get(_U32, fb.buf, pos)
    else:
        count = fb.get("u32", pos, path)
    start = pos + 4
    if count > (fb.size - start) // max(elem_size, 1):
        fb.fail(path, f"vector of {count} {elem_size}-byte elements at {pos} runs past the "
                f"{fb.size}-byte FlatBuffer", count)
    return start, count


def _string_at(fb: _Fb, pos: int, path: _Where) -> str:
    start, count = _vector_at(fb, pos, 1, path)
    if start + count >= fb.size or fb.buf[start + count] != 0:
        fb.fail(path, "string without its terminating zero byte", count)
    try:
        return str(fb.buf[start:start + count], "utf-8")
    except UnicodeDecodeError as exc:
        fb.fail(path, f"not valid UTF-8 ({exc.reason} at byte {exc.start})",
                bytes(fb.buf[start:start + min(count, 64)]))


# --- the container ---------------------------------------------------------------------
def _label(source, name):
    if name is not None:
        return name
    if isinstance(source, (str, os.PathLike)):
        return os.fspath(source)
    return "<memory>"


def _load(source, label: str, max_bytes: int):
    """``memoryview`` of the whole input (a file is mapped, not read)."""
    if isinstance(source, (str, os.PathLike)):
        from fatelf.files import map_regular, open_regular
        fd, size = open_regular(source, ModuleFormatError, name=label)
        os.close(fd)
        if size > max_bytes:
            raise ModuleFormatError(f"it is {size} bytes, more than the {max_bytes} a "
                                    "module may have", name=label, field="file", value=size)
        data = map_regular(source, ModuleFormatError, name=label)
        mv = memoryview(data)
        if len(mv) > max_bytes:
            raise ModuleFormatError(f"it is {len(mv)} bytes, more than the {max_bytes} a "
                                    "module may have", name=label, field="file",
                                    value=len(mv))
        return mv
    if isinstance(source, (bytes, bytearray, memoryview)):
        mv = memoryview(source)
        if mv.ndim != 1 or mv.itemsize != 1:
            mv = mv.cast("B")
        if len(mv) > max_bytes:
            raise ModuleFormatError(f"it is {len(mv)} bytes, more than the {max_bytes} a "
                                    "module may have", name=label, field="file",
                                    value=len(mv))
        return mv.toreadonly()
    raise TypeError(f"read_module takes a path or bytes, not {type(source).__name__}")


def _zip_extra_sizes(extra: bytes) -> tuple[int | None, int | None]:
    """Uncompressed and compressed sizes of a ZIP64 extra field, if any."""
    pos = 0
    while pos + 4 <= len(extra):
        tag, size = struct.unpack_from("<HH", extra, pos)
        body = extra[pos + 4:pos + 4 + size]
        if tag == 1:
            usize = struct.unpack_from("<Q", body, 0)[0] if len(body) >= 8 else None
            csize = struct.unpack_from("<Q", body, 8)[0] if len(body) >= 16 else None
            return usize, csize
        pos += 4 + size
    return None, None


def _locate(data: memoryview, label: str, max_bytes: int) -> tuple[int, int | None]:
    """``(offset of the size prefix, the member's declared size or None)``
    of the module's FlatBuffer in ``data``."""
    n = len(data)
    if n >= 30 and data[:4] == _ZIP_LOCAL:
        (_, _, flags, method, _, _, _, csize, usize, name_len,
         extra_len) = struct.unpack_from("<IHHHHHIIIHH", data, 0)
        start = 30 + name_len + extra_len
        if start > n:
            raise ModuleFormatError(f"the first ZIP member's header ({start} bytes) runs "
                                    f"past the {n}-byte file", name=label,
                                    field="zip.member[0].header", value=start)
        try:
            member = bytes(data[30:30 + name_len]).decode("utf-8")
        except UnicodeDecodeError:
            member = None
        if member != _MODULE_MEMBER:
            raise ModuleFormatError(f"the first ZIP member is {member!r}, not "
                                    f"{_MODULE_MEMBER}: not a compiled IREE module",
                                    name=label, field="zip.member[0].name",
                                    value=bytes(data[30:30 + min(name_len, 64)]))
        if flags & 1:
            raise UnsupportedModuleError(f"{_MODULE_MEMBER} is encrypted", name=label,
                                         field="module.fb.flags", value=flags)
        if method != 0:
            raise UnsupportedModuleError(
                f"{_MODULE_MEMBER} is compressed (method {method}); modules are "
                "stored uncompressed", name=label, field="module.fb.compression_method",
                value=method)
        if 0xFFFFFFFF in (csize, usize):
            zu, zc = _zip_extra_sizes(bytes(data[30 + name_len:start]))
            usize = zu if usize == 0xFFFFFFFF else usize
            csize = zc if csize == 0xFFFFFFFF else csize
            if usize is None or csize is None:
                raise ModuleFormatError(f"{_MODULE_MEMBER}'s ZIP64 sizes are missing",
                                        name=label, field="module.fb.size", value=None)
        declared = None
        if usize or csize:
            if usize != csize:
                raise ModuleFormatError(
                    f"{_MODULE_MEMBER} is stored but its sizes differ ({csize} "
                    f"compressed, {usize} not)", name=label, field="module.fb.size",
                    value=usize)
            if usize > max_bytes or start + usize > n:
                raise ModuleFormatError(
                    f"{_MODULE_MEMBER} claims {usize} bytes at {start}; the file has {n}",
                    name=label, field="module.fb.size", value=usize)
            declared = usize
        return start, declared
    if n >= 12 and data[8:12] == _IDENTIFIER:
        return 0, None
    raise ModuleFormatError("neither a ZIP archive starting with module.fb nor a "
                            "FlatBuffer with identifier IREE: not a compiled IREE module",
                            name=label, field="file", value=bytes(data[:8]))


# --- reading ---------------------------------------------------------------------------
def read_module(source, *, name: str | None = None,
                max_bytes: int = MAX_MODULE_BYTES) -> ModuleDef:
    """Read and verify the VM module of a ``.vmfb``.

    Args:
        source: a path (``str`` or path-like; a regular file, mapped: the
            map lives as long as the module and the views it gave) or the
            bytes of a ``.vmfb`` or of a bare ``module.fb``.
        name: the name used in errors (default: the path, or
            ``<memory>``).
        max_bytes: largest input accepted.

    Raises:
        ModuleFormatError: the input is not a well-formed module (the error
            names the file, the field and the value).
        UnsupportedModuleError: another bytecode version, unknown feature
            bits, compressed data.
    """
    label = _label(source, name)
    data = _load(source, label, max_bytes)
    prefix_at, declared = _locate(data, label, max_bytes)
    n = len(data)
    if prefix_at + 4 > n:
        raise ModuleFormatError("the FlatBuffer's size prefix lies past the end of the file",
                                name=label, field="module.fb.size_prefix", value=n)
    length = struct.unpack_from("<I", data, prefix_at)[0]
    # The prefix counts from the byte after it; as in IREE's loader it is
    # checked against the rest of the file (iree-compile writes the member's
    # size there, so the FlatBuffer's range ends 4 bytes past the member).
    # A bare module.fb copied out of the archive ends there: its last 4
    # bytes of the prefixed range are missing and only those are forgiven.
    room = n - prefix_at - 4
    present = length
    if length > room and prefix_at == 0 and length - room <= 4:
        present = room
    if present > room:
        raise ModuleFormatError(f"the FlatBuffer's size prefix says {length} bytes; "
                                f"{max(room, 0)} follow it", name=label,
                                field="module.fb.size_prefix", value=length)
    if present < 8 or data[prefix_at + 8:prefix_at + 12] != _IDENTIFIER:
        raise ModuleFormatError("the FlatBuffer's file identifier is not IREE", name=label,
                                field="module.fb.identifier",
                                value=bytes(data[prefix_at + 8:prefix_at + 12]))
    fb_start = prefix_at + 4
    fb = _Fb(data[fb_start:fb_start + present], label, fb_start)
    rodata_base = -(-(fb_start + length) // SEGMENT_ALIGNMENT) * SEGMENT_ALIGNMENT
    key = None
    if fb_start + present <= _READ_MEMO_BYTES:
        # What _read checks and returns depends on these bytes (the
        # container's header and the FlatBuffer), the file's size (the
        # bounds of external rodata) and the label (messages) only.
        key = (label, n, prefix_at, length, present,
               hashlib.sha256(data[:fb_start + present]).digest())
        done = _read_memo.get(key)
        if done is not None:
            _read_memo.move_to_end(key)
            return dataclasses.replace(done, _data=data)
    try:
        mdef = _read(fb, data, label, rodata_base)
    except RecursionError:
        raise ModuleFormatError("nesting too deep", name=label, field="module.fb",
                                value=None) from None
    if key is not None:
        _read_memo[key] = dataclasses.replace(mdef, _data=memoryview(b""))
        while len(_read_memo) > _READ_MEMO_COUNT:
            _read_memo.popitem(last=False)
    return mdef


#: Modules read and verified in this process, by content (see
#: :func:`read_module`): a module read again (each ``load_program`` of
#: the same file, a benchmark's loads) is not walked again. Its records
#: are immutable; each reading gets its own ``_data`` (its own map).
_READ_MEMO_COUNT = 16
#: Only modules whose FlatBuffer ends within this many bytes of the
#: file's start (hashing a larger one would cost more than reading it).
_READ_MEMO_BYTES = 1 << 20
_read_memo: collections.OrderedDict = collections.OrderedDict()


def _attrs(fb: _Fb, table: _Table | None) -> dict:
    if table is None:
        return {}
    out = {}
    for a in table.tables("attrs", "AttrDef"):
        key = a.string("key")
        if not key:
            fb.fail((a.path, "key"), "attribute without a key", key)
        out[key] = a.string("value") or ""
    return out


def _cconv(fb: _Fb, sig: _Table | None) -> str:
    if sig is None:
        return ""
    cc = sig.string("calling_convention") or ""
    if cc and not _CCONV.fullmatch(cc):
        fb.fail((sig.path, "calling_convention"), "not a VM calling convention "
                "(0<arguments>_<results> of i I f F r v C D)", cc[:80])
    return cc


def _read(fb: _Fb, data: memoryview, label: str, rodata_base: int) -> ModuleDef:
    root_pos = fb.uoffset_target(0, "root")
    root = fb.table(root_pos, "BytecodeModuleDef", "")
    root.path = ""

    # Version and features first: another version's layout is not read.
    bc = root.scalar("bytecode_version", "u32", 0)
    version = (bc >> 16, bc & 0xFFFF)
    if version[0] != BYTECODE_VERSION[0] or version[1] > BYTECODE_VERSION[1]:
        fb.fail("bytecode_version", f"bytecode version {version[0]}.{version[1]}; this "
                f"runtime reads {BYTECODE_VERSION[0]}.{BYTECODE_VERSION[1]}",
                f"{version[0]}.{version[1]}", UnsupportedModuleError)
    requirements = root.scalar("requirements", "u32", 0)
    _check_features(fb, "requirements", requirements)

    mod_name = root.string("name")
    if not mod_name:
        fb.fail("name", "the module has no name", mod_name)
    mod_version = root.scalar("version", "u32", 0)
    attrs = _attrs(fb, root)

    types = []
    for i, t in enumerate(root.tables("types", "TypeDef")):
        tn = t.string("full_name")
        if not tn:
            fb.fail(f"types[{i}].full_name", "type without a name", tn)
        types.append(tn)

    deps = []
    for i, d in enumerate(root.tables("dependencies", "ModuleDependencyDef")):
        dn = d.string("name")
        if not dn:
            fb.fail(f"dependencies[{i}].name", "dependency without a module name", dn)
        flags = d.scalar("flags", "u32", 1)
        deps.append(Dependency(dn, d.scalar("minimum_version", "u32", 0),
                               bool(flags & FLAG_OPTIONAL)))

    imports = []
    for i, m in enumerate(root.tables("imported_functions", "ImportFunctionDef")):
        iname = m.string("full_name")
        if not iname:
            fb.fail(f"imported_functions[{i}].full_name", "import without a name", iname)
        sig = m.table("signature", "FunctionSignatureDef")
        flags = m.scalar("flags", "u32", 1)
        imports.append(ImportDef(iname, _cconv(fb, sig), bool(flags & FLAG_OPTIONAL),
                                 _attrs(fb, sig)))

    sigs = root.tables("function_signatures", "FunctionSignatureDef")
    sig_info = [(_cconv(fb, s), _attrs(fb, s)) for s in sigs]

    # bytecode
    bvec = root.vector("bytecode_data", 1)
    bc_start, bc_len = bvec if bvec is not None else (0, 0)

    # descriptors
    dvec = root.vector("function_descriptors", _DESCRIPTOR.size)
    dstart, dcount = dvec if dvec is not None else (0, 0)
    if dcount != len(sigs):
        fb.fail("function_signatures", f"{len(sigs)} function signatures for {dcount} "
                "function descriptors", len(sigs))
    descriptors = []
    for i in range(dcount):
        off, blen, req, _reserved, blocks, ni32, nref = _DESCRIPTOR.unpack_from(
            fb.buf, dstart + i * _DESCRIPTOR.size)
        where = f"function_descriptors[{i}]"
        if off < 0 or off > bc_len:
            fb.fail(f"{where}.bytecode_offset", f"offset {off} lies outside the "
                    f"{bc_len}-byte bytecode", off)
        if blen <= 0 or off + blen > bc_len:
            fb.fail(f"{where}.bytecode_length", f"{blen} bytes at {off} run past the "
                    f"{bc_len}-byte bytecode" if blen > 0 else "function without bytecode",
                    blen)
        if blocks <= 0:
            fb.fail(f"{where}.block_count", "a function needs at least one block", blocks)
        if not 0 <= ni32 <= MAX_I32_REGISTERS:
            fb.fail(f"{where}.i32_register_count", f"{ni32} i32 registers; the VM allows "
                    f"0 to {MAX_I32_REGISTERS}", ni32)
        if not 0 <= nref <= MAX_REF_REGISTERS:
            fb.fail(f"{where}.ref_register_count", f"{nref} ref registers; the VM allows "
                    f"0 to {MAX_REF_REGISTERS}", nref)
        _check_features(fb, f"{where}.requirements", req)
        descriptors.append((off, blen, req, blocks, ni32, nref))

    exports = []
    for i, e in enumerate(root.tables("exported_functions", "ExportFunctionDef")):
        ename = e.string("local_name")
        if not ename:
            fb.fail(f"exported_functions[{i}].local_name", "export without a name", ename)
        ordinal = e.scalar("internal_ordinal", "i32", 0)
        if not 0 <= ordinal < dcount:
            fb.fail(f"exported_functions[{i}].internal_ordinal", f"ordinal {ordinal} of "
                    f"{dcount} internal functions", ordinal)
        cc, fattrs = sig_info[ordinal]
        exports.append(ExportDef(ename, ordinal, cc, fattrs))

    # read-only data
    rodata = []
    for i, r in enumerate(root.tables("rodata_segments", "RodataSegmentDef")):
        rodata.append(_rodata(fb, r, i, data, rodata_base))

    rwdata = []
    for i, w in enumerate(root.tables("rwdata_segments", "RwdataSegmentDef")):
        size = w.scalar("byte_size", "i32", 0)
        if not 0 <= size <= MAX_GLOBAL_BYTES:
            fb.fail(f"rwdata_segments[{i}].byte_size", f"{size} bytes; at most "
                    f"{MAX_GLOBAL_BYTES} are allowed", size)
        rwdata.append(size)

    global_bytes = global_refs = 0
    state = root.table("module_state", "ModuleStateDef")
    if state is not None:
        global_bytes = state.scalar("global_bytes_capacity", "i32", 0)
        global_refs = state.scalar("global_ref_count", "i32", 0)
        if not 0 <= global_bytes <= MAX_GLOBAL_BYTES:
            fb.fail("module_state.global_bytes_capacity", f"{global_bytes} bytes of "
                    f"globals; at most {MAX_GLOBAL_BYTES} are allowed", global_bytes)
        if not 0 <= global_refs <= MAX_GLOBAL_REFS:
            fb.fail("module_state.global_ref_count", f"{global_refs} ref globals; at "
                    f"most {MAX_GLOBAL_REFS} are allowed", global_refs)

    debug = None
    db = root.table("debug_database", "DebugDatabaseDef")
    if db is not None:
        debug = _debug(fb, db, exports, dcount)

    # names: the debug database's, else the first export's, else a made-up one
    export_names: dict[int, str] = {}
    for e in exports:
        export_names.setdefault(e.function, e.name)
    functions = []
    for i, (off, blen, req, blocks, ni32, nref) in enumerate(descriptors):
        fname = export_names.get(i)
        if fname is None and debug is not None:
            fname = debug.function_names[i] or None
        fname = fname or f"__func{i}"
        cc, fattrs = sig_info[i]
        functions.append(FunctionDef(i, fname, cc, off, blen, ni32, nref, req, blocks,
                                     fattrs))

    return ModuleDef(
        name=mod_name, version=mod_version, bytecode_version=version,
        requirements=requirements, dependencies=tuple(deps), types=tuple(types),
        imports=tuple(imports), exports=tuple(exports), functions=tuple(functions),
        rodata=tuple(rodata), global_bytes=global_bytes, global_refs=global_refs,
        debug=debug, attrs=attrs, rwdata=tuple(rwdata), source=label, _data=data,
        _bytecode=(fb.base + bc_start, bc_len))


def _check_features(fb: _Fb, where: str, bits: int) -> None:
    if bits & ~KNOWN_FEATURES:
        fb.fail(where, f"unknown feature bits {bits & ~KNOWN_FEATURES:#x} (known: "
                + ", ".join(f"{1 << b:#x} {n}" for b, n in FEATURE_NAMES.items()) + ")",
                bits, UnsupportedModuleError)


def _alignment(offset: int) -> int:
    if offset % SEGMENT_ALIGNMENT == 0:
        return SEGMENT_ALIGNMENT
    return offset & -offset


def _rodata(fb: _Fb, r: _Table, index: int, data: memoryview, base: int) -> RodataDef:
    where = f"rodata_segments[{index}]"
    ctype = r.scalar("compression_type_type", "u8", 0)
    if ctype not in (COMPRESSION_NONE, COMPRESSION_UNCOMPRESSED):
        fb.fail(f"{where}.compression_type", f"compression type {ctype} is not known "
                "(only uncompressed data is read)", ctype, UnsupportedModuleError)
    if ctype == COMPRESSION_UNCOMPRESSED and r.has("compression_type"):
        r.table("compression_type", "UncompressedDataDef")       # an empty table: only checked
    emb = r.vector("embedded_data", 1)
    if emb is not None:
        start, count = emb
        off = fb.base + start
        return RodataDef(index, count, _alignment(off), None, False, off)
    ext_off = r.scalar("external_data_offset", "u64", 0)
    ext_len = r.scalar("external_data_length", "u64", 0)
    n = len(data)
    if base > n or ext_off > n - base:
        fb.fail(f"{where}.external_data_offset", f"offset {ext_off} past the read-only "
                f"data at {base} lies outside the {n}-byte file", ext_off)
    if ext_len > n - base - ext_off:
        fb.fail(f"{where}.external_data_length", f"{ext_len} bytes at {base + ext_off} "
                f"run past the {n}-byte file", ext_len)
    off = base + ext_off
    return RodataDef(index, ext_len, _alignment(off), None, True, off)


def _debug(fb: _Fb, db: _Table, exports: list, dcount: int) -> DebugInfo:
    tvec = db.vector("location_table_type", 1)
    vvec = db.vector("location_table", 4)
    tstart, tcount = tvec if tvec is not None else (0, 0)
    vstart, vcount = vvec if vvec is not None else (0, 0)
    if tcount != vcount:
        fb.fail("debug_database.location_table", f"{vcount} locations with {tcount} "
                "location types", vcount)
    raw: list[tuple] = []
    for i in range(vcount):
        where = f"debug_database.location_table[{i}]"
        kind = fb.buf[tstart + i]
        if kind == LOC_NONE:
            raw.append((LOC_NONE,))
            continue
        schema = UNIONS["LocationTypeDef"].get(kind)
        if schema is None:
            fb.fail(where, f"unknown location type {kind}", kind)
        t = fb.table(fb.uoffset_target(vstart + 4 * i, where), schema, where)
        if kind == LOC_CALLSITE:
            raw.append((kind, t.scalar("callee", "i32"), t.scalar("caller", "i32")))
        elif kind == LOC_FILELINECOL:
            raw.append((kind, t.string("filename") or "", t.scalar("line", "i32"),
                        t.scalar("column", "i32")))
        elif kind == LOC_FUSED:
            children: tuple[int, ...] = ()
            vec = t.vector("locations", 4)
            if vec is not None:
                start, count = vec
                children = struct.unpack_from(f"<{count}i", fb.buf, start)
            raw.append((kind, t.string("metadata"), children))
        else:
            child = t.scalar("child_location", "i32") if t.has("child_location") else None
            raw.append((kind, t.string("name") or "", child))
    for i, entry in enumerate(raw):
        refs = {LOC_CALLSITE: lambda e: e[1:3], LOC_FUSED: lambda e: e[2],
                LOC_NAME: lambda e: () if e[2] is None else (e[2],)}.get(entry[0])
        for ref in (refs(entry) if refs else ()):
            if not 0 <= ref < vcount:
                fb.fail(f"debug_database.location_table[{i}]", f"refers to location {ref} "
                        f"of {vcount}", ref)
    names, maps = [], []
    fns = db.tables("functions", "FunctionSourceMapDef")
    if len(fns) > dcount:
        fb.fail("debug_database.functions", f"{len(fns)} source maps for {dcount} "
                "functions", len(fns))
    for i, f in enumerate(fns):
        names.append(f.string("local_name"))
        vec = f.vector("locations", _BYTECODE_LOCATION.size)
        entries: tuple[tuple[int, int], ...] = ()
        if vec is not None:
            start, count = vec
            flat = struct.unpack_from(f"<{2 * count}i", fb.buf, start)
            entries = tuple(zip(flat[0::2], flat[1::2]))
            for j, (_, loc) in enumerate(entries):
                if not 0 <= loc < vcount:
                    fb.fail((((f.path, "locations"), j), "location"), f"location {loc} of "
                            f"{vcount}", loc)
        maps.append(entries)
    # A source map belongs to the function of its index (the schema), but
    # iree-compile 3.x writes each function's map at index 0 (the last one
    # encoded stays): a map named like exactly one export is that export's.
    by_name: dict[str, set] = {}
    for e in exports:
        by_name.setdefault(e.name, set()).add(e.function)
    owner_names: list = [None] * dcount
    owner_maps: list = [()] * dcount
    taken = [False] * dcount
    for i, (fname, entries) in enumerate(zip(names, maps)):
        target = i
        named = by_name.get(fname) if fname else None
        if named and len(named) == 1:
            target = next(iter(named))
        if not taken[target]:
            taken[target] = True
            owner_names[target], owner_maps[target] = fname, entries
    return DebugInfo(tuple(owner_names), tuple(raw), tuple(owner_maps))


# --- ZIP members read by other parts ---------------------------------------------------
def check_zip_entry(info, file_size: int, *, name: str, limit: int, error=ModuleFormatError
                    ) -> None:
    """Check a :class:`zipfile.ZipInfo` of a ``.vmfb`` before its bytes are
    read: stored (not compressed, not encrypted), its sizes equal, at most
    ``limit`` bytes, and its data inside the ``file_size``-byte file.

    Raises:
        error: naming the member (``field``: ``zip.<member>``) and the value.
    """
    where = f"zip.{info.filename}"
    if info.flag_bits & 1:
        raise error(f"member {info.filename} is encrypted", name=name, field=where,
                    value=info.flag_bits)
    if info.compress_type != 0:
        raise error(f"member {info.filename} is compressed (method "
                    f"{info.compress_type}); a .vmfb's members are stored", name=name,
                    field=where, value=info.compress_type)
    if info.file_size != info.compress_size:
        raise error(f"member {info.filename} is stored but claims {info.file_size} bytes "
                    f"from {info.compress_size}", name=name, field=where,
                    value=info.file_size)
    if info.file_size > limit:
        raise error(f"member {info.filename} claims {info.file_size} bytes, more than "
                    f"{limit}", name=name, field=where, value=info.file_size)
    if info.header_offset < 0 or info.header_offset + 30 + info.compress_size > file_size:
        raise error(f"member {info.filename} claims {info.compress_size} bytes at "
                    f"{info.header_offset}; the file has {file_size}", name=name,
                    field=where, value=info.compress_size)
