"""hal_cpu.programs.vm.module_def: real modules from iree-compile read as
iree-dump-module reads them, and hostile files refused with typed errors."""

from __future__ import annotations

import io
import json
import re
import shutil
import struct
import subprocess
import tracemalloc
import zipfile
from functools import lru_cache
from pathlib import Path

import flatbuffers
import pytest

from hal_cpu.programs import compile_program
from hal_cpu.programs.vm import module_def as md
from hal_cpu.programs.vm import vmfb
from hal_cpu.programs.vm.module_def import ModuleFormatError, UnsupportedModuleError, read_module

ROOT = Path(__file__).resolve().parent.parent
PROGRAMS = ["tests/programs/matmul.mlir", "tests/programs/mm_rowsum.mlir",
            "tests/programs/host_code.mlir", "tests/programs/check/elementwise.mlir",
            "tests/programs/host_modules/basic.mlir"]
ARCHES = ["x86_64", "riscv32"]
DUMP = shutil.which("iree-dump-module")

pytestmark = pytest.mark.skipif(DUMP is None, reason="iree-dump-module not installed")


@lru_cache(maxsize=None)
def vmfb_path(program: str, arch: str) -> Path:
    return Path(compile_program(ROOT / program, arch).vmfb)


@lru_cache(maxsize=None)
def dump(path: Path, output: str, *extra: str) -> str:
    return subprocess.run([DUMP, f"--output={output}", *extra, str(path)], check=True,
                          capture_output=True, text=True, timeout=120).stdout


@lru_cache(maxsize=None)
def dump_json(path: Path) -> dict:
    return json.loads(dump(path, "flatbuffer-json"))


CASES = [pytest.param((p, a), id=f"{Path(p).stem}-{a}") for p in PROGRAMS for a in ARCHES]


@pytest.fixture(params=CASES)
def case(request):
    program, arch = request.param
    path = vmfb_path(program, arch)
    return program, path, read_module(path)


# --- real modules ---------------------------------------------------------------------
def test_header_types_dependencies(case):
    _, path, m = case
    j = dump_json(path)
    assert m.name == j["name"]
    assert m.version == j.get("version", 0)
    assert m.bytecode_version == (17, 0) == divmod(j["bytecode_version"], 1 << 16)
    assert m.types == tuple(t["full_name"] for t in j.get("types", []))
    names = {"EXT_F32": 1, "EXT_F64": 2, "YIELD": 4, "UNWIND": 8}
    assert m.requirements == sum(names[r] for r in j.get("requirements", "").split())
    assert [(d.name, d.minimum_version, d.optional) for d in m.dependencies] == [
        (d["name"], d.get("minimum_version", 0), "OPTIONAL" in d.get("flags", ""))
        for d in j.get("dependencies", [])]
    meta = dump(path, "metadata")
    assert f"@{m.name} : version {m.version}" in meta


def test_imports_exports_cconv(case):
    _, path, m = case
    j = dump_json(path)
    assert [(i.name, i.cconv, i.optional) for i in m.imports] == [
        (i["full_name"], i.get("signature", {}).get("calling_convention", ""),
         "OPTIONAL" in i.get("flags", "")) for i in j.get("imported_functions", [])]
    sigs = j["function_signatures"]
    ordinals = [e.get("internal_ordinal", 0) for e in j["exported_functions"]]
    assert [(e.name, e.function, e.cconv, e.attrs) for e in m.exports] == [
        (e["local_name"], k, sigs[k].get("calling_convention", ""),
         {a["key"]: a["value"] for a in sigs[k].get("attrs", [])})
        for e, k in zip(j["exported_functions"], ordinals)]
    assert [f.cconv for f in m.functions] == [s.get("calling_convention", "") for s in sigs]
    # the public exports carry their ABI declaration
    assert any("iree.abi.declaration" in e.attrs for e in m.exports)


_ROW = re.compile(r"^\s*(\d+) \| ([0-9A-F]{8}) \|\s*(\d+) \|\s*(\d+) \|\s*(\d+) \|\s*(\d+) \| "
                  r"((?:EXT_F(?:32|64) \| )*)([0-9A-F]{8})", re.M)
_EXT = {"EXT_F32": 1, "EXT_F64": 2}


def test_functions_match_metadata_and_disassembly(case):
    _, path, m = case
    rows = [(int(r[0]), int(r[1], 16), int(r[2]), int(r[3]), int(r[4]), int(r[5]),
             int(r[7], 16) | sum(_EXT[x] for x in re.findall(r"EXT_F\d+", r[6])))
            for r in _ROW.findall(dump(path, "metadata"))]
    assert len(rows) == len(m.functions)
    assert [(f.ordinal, f.bytecode_offset, f.bytecode_length, f.block_count,
             f.i32_register_count, f.ref_register_count, f.requirements)
            for f in m.functions] == rows
    dis = dump(path, "disassembly", "--bytecode_offsets")
    bodies = re.split(r"^vm\.func @", dis, flags=re.M)[1:]
    exported = {e.function for e in m.exports}
    total = 0
    for f, body in zip(m.functions, bodies):
        dumped = body.split("(", 1)[0]
        if f.ordinal in exported:
            assert f.name == dumped
        else:
            # iree-dump-module names the others from the source map at their
            # index (fn<ordinal> without one); the map there may be another
            # function's (see DebugInfo)
            assert f.name == (m.debug.function_names[f.ordinal] or f"__func{f.ordinal}")
        code = m.function_bytecode(f.ordinal)
        assert len(code) == f.bytecode_length
        offsets = [int(x, 16) for x in re.findall(r"^\[([0-9A-F]{8})\]", body, re.M)]
        assert offsets and max(offsets) < f.bytecode_length
        # the source map given to a function lists offsets of its own ops
        mapped = {off for off, _ in m.debug.locations(f.ordinal)}
        assert mapped <= set(offsets), f.name
        total = max(total, f.bytecode_offset + f.bytecode_length)
    assert any(m.debug.locations(f.ordinal) for f in m.functions)
    assert total <= len(m.bytecode)
    j = dump_json(path)
    assert bytes(m.bytecode) == bytes(j["bytecode_data"])


def test_rodata_and_state(case):
    _, path, m = case
    meta = dump(path, "metadata")
    j = dump_json(path)
    listed = [(int(i), kind == "external", int(size)) for i, kind, size in re.findall(
        r"\.rodata\[\s*(\d+)\] (embedded|external)\s+(\d+) bytes", meta)]
    assert [(r.index, r.external, r.size) for r in m.rodata] == listed
    for r, seg in zip(m.rodata, j.get("rodata_segments", [])):
        data = bytes(m.rodata_bytes(r.index))
        assert len(data) == r.size and r.mime_type is None
        assert r.alignment in (1, 2, 4, 8, 16, 32, 64) and r.offset % r.alignment == 0
        if "embedded_data" in seg:
            assert data == bytes(seg["embedded_data"])
    state = j.get("module_state", {})
    assert (m.global_bytes, m.global_refs) == (state.get("global_bytes_capacity", 0),
                                               state.get("global_ref_count", 0))
    found = re.search(r"Module State:\s*\n\s*(\d+) bytes, (\d+) refs", meta)
    if found:
        assert (m.global_bytes, m.global_refs) == (int(found[1]), int(found[2]))


def test_external_rodata_is_the_executable_member(case):
    """External segments start at align_up(end of the FlatBuffer, 64) +
    external_data_offset: exactly the data of the executable's ZIP member."""
    program, path, m = case
    j = dump_json(path)
    raw = path.read_bytes()
    with zipfile.ZipFile(path) as z:
        members = {}
        for info in z.infolist():
            name_len, extra_len = struct.unpack_from("<HH", raw, info.header_offset + 26)
            members[info.header_offset + 30 + name_len + extra_len] = z.read(info)
    external = [r for r in m.rodata if r.external]
    if "host_modules" not in program:
        assert external, "a program with dispatches embeds an executable"
    prefix_at = min(members)            # module.fb's data
    fb_end = prefix_at + 4 + struct.unpack_from("<I", raw, prefix_at)[0]
    base = -(-fb_end // 64) * 64
    for r in external:
        seg = j["rodata_segments"][r.index]
        assert r.offset == base + seg["external_data_offset"]
        assert bytes(m.rodata_bytes(r.index)) == members[r.offset]
        assert bytes(m.rodata_bytes(r.index))[:4] == b"\x7fELF"
    names = [e.name for e in vmfb.executables(path)]
    assert len(names) == len(external)


def test_debug_locations_resolve_to_the_source(case):
    program, path, m = case
    assert m.debug is not None
    j = dump_json(path)["debug_database"]
    assert len(m.debug.function_names) == len(m.functions)
    assert {n for n in m.debug.function_names if n} == {f.get("local_name")
                                                        for f in j["functions"]}
    found = [(i, off, loc) for i in range(len(m.functions))
             for off, loc in m.debug.locations(i) if loc]
    assert found
    stem = Path(program).name
    for i, off, loc in found:
        file, line, col = loc.rsplit(":", 2)
        assert file.endswith(stem) and int(line) >= 0 and int(col) >= 0
        assert m.debug.location(i, off) == loc
        assert m.debug.stack(i, off)[0] == loc
        assert m.debug.location(i, off + 1, nearest=True) is not None
    assert m.debug.location(len(m.functions) + 5, 0) is None


def test_path_bytes_and_bare_flatbuffer_agree():
    path = vmfb_path("tests/programs/host_modules/basic.mlir", "x86_64")
    a, b = read_module(path), read_module(path.read_bytes(), name="basic")
    assert (a.name, a.imports, a.exports, a.functions, a.rodata) == \
           (b.name, b.imports, b.exports, b.functions, b.rodata)
    assert b.source == "basic" and a.source == str(path)
    with zipfile.ZipFile(path) as z:
        bare = z.read("module.fb")
    c = read_module(bare)
    assert (c.imports, c.exports, c.types) == (a.imports, a.exports, a.types)
    assert [bytes(c.function_bytecode(f.ordinal)) for f in c.functions] == \
           [bytes(a.function_bytecode(f.ordinal)) for f in a.functions]
    # a bare module.fb of a program with executables lacks their data
    mm = vmfb_path("tests/programs/matmul.mlir", "x86_64")
    with zipfile.ZipFile(mm) as z:
        bare = z.read("module.fb")
    with pytest.raises(ModuleFormatError) as e:
        read_module(bare)
    assert e.value.field.startswith("rodata_segments[") and "external_data" in e.value.field


# --- hostile files ----------------------------------------------------------------------
@lru_cache(maxsize=None)
def matmul() -> bytes:
    return vmfb_path("tests/programs/matmul.mlir", "x86_64").read_bytes()


def _fb_start(raw: bytes) -> int:
    name_len, extra_len = struct.unpack_from("<HH", raw, 26)
    return 30 + name_len + extra_len + 4


class Fb:
    """Positions inside the module's FlatBuffer of a mutable copy."""

    def __init__(self, raw: bytes):
        self.raw = bytearray(raw)
        self.base = _fb_start(raw)

    def u32(self, pos):
        return struct.unpack_from("<I", self.raw, self.base + pos)[0]

    def put(self, pos, fmt, value):
        struct.pack_into(fmt, self.raw, self.base + pos, value)

    def root(self):
        return self.u32(0)

    def field(self, table, name, schema="BytecodeModuleDef"):
        """Position of a field of the table at ``table``."""
        vt = table - struct.unpack_from("<i", self.raw, self.base + table)[0]
        slot = md.SCHEMA[schema][name][0]
        off = struct.unpack_from("<H", self.raw, self.base + vt + 4 + 2 * slot)[0]
        assert off, name
        return table + off

    def target(self, pos):
        return pos + self.u32(pos)

    def vector(self, name, table=None, schema="BytecodeModuleDef"):
        """Position of the length word of vector field ``name``."""
        table = self.root() if table is None else table
        return self.target(self.field(table, name, schema))

    def element(self, name, i, schema="BytecodeModuleDef"):
        vec = self.vector(name)
        return self.target(vec + 4 + 4 * i)

    def bytes(self):
        return bytes(self.raw)


def refused(data, cls=ModuleFormatError, field=None):
    with pytest.raises(cls) as e:
        read_module(data, name="hostile.vmfb")
    assert e.value.name == "hostile.vmfb"
    if field is not None:
        assert e.value.field == field, (e.value.field, str(e.value))
    return e.value


def use_all(m):
    for f in m.functions:
        m.function_bytecode(f.ordinal)
    for r in m.rodata:
        bytes(m.rodata_bytes(r.index))
    if m.debug:
        for i in range(len(m.functions)):
            for off, _ in m.debug.locations(i):
                m.debug.stack(i, off)


def test_truncated_at_many_points():
    raw = matmul()
    m = read_module(raw)
    needed = max(r.offset + r.size for r in m.rodata)
    for cut in list(range(0, 200)) + list(range(200, len(raw), 37)):
        data = raw[:cut]
        if cut >= needed:
            use_all(read_module(data))
        else:
            refused(data)


def test_flipped_bytes_accepted_or_typed():
    raw = matmul()
    start = _fb_start(raw) - 4
    m = read_module(raw)
    end = start + 4 + struct.unpack_from("<I", raw, start)[0]
    typed = 0
    for pos in range(0, end, 3):
        for mask in (0xFF,) if pos % 2 else (0x80,):
            data = bytearray(raw)
            data[pos] ^= mask
            try:
                use_all(read_module(bytes(data)))
            except ModuleFormatError as exc:
                typed += 1
                assert exc.field, exc
    assert typed > 100
    assert m.name == "module"


@pytest.mark.parametrize("vector", ["types", "imported_functions", "exported_functions",
                                    "function_signatures", "rodata_segments",
                                    "function_descriptors", "bytecode_data", "dependencies"])
@pytest.mark.parametrize("count", [0xFFFFFFFF, 0x7FFFFFFF, 0x10000])
def test_huge_vector_count(vector, count):
    fb = Fb(matmul())
    fb.put(fb.vector(vector), "<I", count)
    tracemalloc.start()
    try:
        refused(fb.bytes(), field=vector)
        assert tracemalloc.get_traced_memory()[1] < 8 << 20
    finally:
        tracemalloc.stop()


def test_huge_debug_vectors():
    fb = Fb(matmul())
    db = fb.target(fb.field(fb.root(), "debug_database"))
    for name in ("location_table", "location_table_type", "functions"):
        f2 = Fb(matmul())
        f2.put(f2.vector(name, db, "DebugDatabaseDef"), "<I", 0xFFFFFFF0)
        refused(f2.bytes(), field=f"debug_database.{name}")


def test_offsets_past_the_end():
    fb = Fb(matmul())
    fb.put(0, "<I", 0x7FFFFFF0)
    refused(fb.bytes(), field="root")
    # a vtable far away
    fb = Fb(matmul())
    fb.put(fb.root(), "<i", -0x100000)
    refused(fb.bytes(), field="vtable")
    # a string offset past the end
    fb = Fb(matmul())
    fb.put(fb.field(fb.root(), "name"), "<I", 0x7FFFFFF0)
    refused(fb.bytes(), field="name")
    # an element of a table vector
    fb = Fb(matmul())
    fb.put(fb.vector("imported_functions") + 4 + 4 * 3, "<I", 0xFFFFFFF0)
    refused(fb.bytes(), field="imported_functions[3]")


def _descriptor(fb, i):
    return fb.vector("function_descriptors") + 4 + 20 * i


@pytest.mark.parametrize("what,offset,value,field", [
    ("offset past the bytecode", 0, 1 << 20, "bytecode_offset"),
    ("negative offset", 0, -4, "bytecode_offset"),
    ("range past the bytecode", 4, 1 << 20, "bytecode_length"),
    ("empty function", 4, 0, "bytecode_length"),
])
def test_function_range_outside_the_bytecode(what, offset, value, field):
    fb = Fb(matmul())
    fb.put(_descriptor(fb, 1) + offset, "<i", value)
    refused(fb.bytes(), field=f"function_descriptors[1].{field}")


@pytest.mark.parametrize("offset,value,ok", [
    (16, md.MAX_I32_REGISTERS, True), (16, md.MAX_I32_REGISTERS + 1, False), (16, -1, False),
    (18, md.MAX_REF_REGISTERS, True), (18, md.MAX_REF_REGISTERS + 1, False), (18, -5, False),
    (14, 0, False), (14, -1, False),
])
def test_register_and_block_limits(offset, value, ok):
    fb = Fb(matmul())
    fb.put(_descriptor(fb, 2) + offset, "<h", value)
    if ok:
        m = read_module(fb.bytes())
        assert value in (m.functions[2].i32_register_count, m.functions[2].ref_register_count)
    else:
        field = {16: "i32_register_count", 18: "ref_register_count", 14: "block_count"}[offset]
        refused(fb.bytes(), field=f"function_descriptors[2].{field}")


def test_export_ordinal_out_of_range():
    fb = Fb(matmul())
    export = fb.element("exported_functions", 0)
    fb.put(fb.field(export, "internal_ordinal", "ExportFunctionDef"), "<i", 3)
    refused(fb.bytes(), field="exported_functions[0].internal_ordinal")


def test_external_rodata_outside_the_file():
    raw = matmul()
    m = read_module(raw)
    ext = next(r for r in m.rodata if r.external)
    for name, value in (("external_data_offset", len(raw)),
                        ("external_data_length", len(raw)),
                        ("external_data_offset", 0xFFFFFFFFFFFFFFF0),
                        ("external_data_length", 0xFFFFFFFFFFFFFFF0)):
        fb = Fb(raw)
        seg = fb.element("rodata_segments", ext.index)
        fb.put(fb.field(seg, name, "RodataSegmentDef"), "<Q", value)
        refused(fb.bytes(), field=f"rodata_segments[{ext.index}].{name}")


def test_bad_utf8_strings():
    fb = Fb(matmul())
    name = fb.target(fb.field(fb.root(), "name"))
    fb.raw[fb.base + name + 4] = 0xFF
    e = refused(fb.bytes(), field="name")
    assert "UTF-8" in str(e)
    fb = Fb(matmul())
    t = fb.element("types", 2)
    s = fb.target(fb.field(t, "full_name", "TypeDef"))
    fb.raw[fb.base + s + 5:fb.base + s + 7] = b"\xc3\x28"
    refused(fb.bytes(), field="types[2].full_name")
    # a string without its terminating zero: longer, up to a non-zero byte
    fb = Fb(matmul())
    end = fb.base + name + 4 + fb.u32(name)
    grow = next(k for k in range(1, 64) if fb.raw[end + k])
    fb.put(name, "<I", fb.u32(name) + grow)
    assert "terminating zero" in str(refused(fb.bytes(), field="name"))


def test_wrong_identifier_and_not_a_module():
    raw = bytearray(matmul())
    at = _fb_start(raw) + 4
    assert raw[at:at + 4] == b"IREE"
    raw[at:at + 4] = b"IREF"
    refused(bytes(raw), field="module.fb.identifier")
    refused(b"", field="file")
    refused(b"\x7fELF" + bytes(100), field="file")
    refused(b"PK\x03\x04" + bytes(60), field="zip.member[0].name")


@pytest.mark.parametrize("version", [(18, 0), (16, 0), (17, 1), (0, 0), (0xFFFF, 0xFFFF)])
def test_wrong_bytecode_version(version):
    fb = Fb(matmul())
    fb.put(fb.field(fb.root(), "bytecode_version"), "<I", (version[0] << 16) | version[1])
    e = refused(fb.bytes(), UnsupportedModuleError, field="bytecode_version")
    assert f"{version[0]}.{version[1]}" in str(e) and "17.0" in str(e)


def test_unknown_feature_bits():
    fb = Fb(matmul())
    fb.put(fb.field(fb.root(), "requirements"), "<I", 0x10 | 0x8)
    refused(fb.bytes(), UnsupportedModuleError, field="requirements")
    fb = Fb(matmul())
    fb.put(_descriptor(fb, 0) + 8, "<I", 0x100)
    refused(fb.bytes(), UnsupportedModuleError, field="function_descriptors[0].requirements")


def _local_header_with_size(raw: bytes, size: int) -> bytes:
    """The archive with module.fb's local header claiming ``size`` bytes
    (through its ZIP64 extra field)."""
    data = bytearray(raw)
    name_len, extra_len = struct.unpack_from("<HH", data, 26)
    extra = data[30 + name_len:30 + name_len + extra_len]
    pos = 0
    while pos + 4 <= len(extra):
        tag, n = struct.unpack_from("<HH", extra, pos)
        if tag == 1:
            struct.pack_into("<QQ", data, 30 + name_len + pos + 4, size, size)
            return bytes(data)
        pos += 4 + n
    struct.pack_into("<II", data, 18, size, size)
    return bytes(data)


def test_zip_bomb_member_claims_a_gibibyte():
    raw = matmul() + bytes((1 << 20) - len(matmul()))      # a 1 MiB file
    tracemalloc.start()
    try:
        refused(_local_header_with_size(raw, 1 << 30), field="module.fb.size")
        assert tracemalloc.get_traced_memory()[1] < 16 << 20
    finally:
        tracemalloc.stop()


def test_compressed_module_is_unsupported():
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("module.fb", bytes(1 << 20))              # inflates 1000-fold
    refused(buf.getvalue(), UnsupportedModuleError, field="module.fb.compression_method")


def test_vmfb_members_checked_before_reading(tmp_path):
    """hal_cpu.programs.vm.vmfb refuses deflated members and stored members whose
    declared size exceeds the file, before reading any."""
    so = b"\x7fELF" + bytes(1 << 20)
    deflated = tmp_path / "deflated.vmfb"
    with zipfile.ZipFile(deflated, "w") as z:
        z.writestr("module.fb", b"x")
        z.writestr("k_embedded_elf_x86_64.so", so, compress_type=zipfile.ZIP_DEFLATED)
    with pytest.raises(vmfb.ModuleFileError) as e:
        vmfb.read_executable(deflated, None)
    assert e.value.field == "zip.k_embedded_elf_x86_64.so" and e.value.value == 8
    claims = tmp_path / "claims.vmfb"
    with zipfile.ZipFile(claims, "w") as z:
        z.writestr("module.fb", b"x")
        z.writestr("k_embedded_elf_x86_64.so", b"\x7fELF" + bytes(60))
    data = bytearray(claims.read_bytes())
    cd = data.rindex(b"PK\x01\x02")                          # the member's directory entry
    struct.pack_into("<II", data, cd + 20, 1 << 30, 1 << 30)
    claims.write_bytes(bytes(data))
    tracemalloc.start()
    try:
        with pytest.raises(vmfb.ModuleFileError) as e:
            vmfb.executables(claims)
        assert e.value.value == 1 << 30
        assert tracemalloc.get_traced_memory()[1] < 16 << 20
    finally:
        tracemalloc.stop()
    # the real modules pass
    assert vmfb.executables(vmfb_path("tests/programs/matmul.mlir", "x86_64"))


def test_too_large_and_not_regular(tmp_path):
    path = vmfb_path("tests/programs/matmul.mlir", "x86_64")
    refused_path = pytest.raises(ModuleFormatError)
    with refused_path as e:
        read_module(path, max_bytes=1000)
    assert e.value.field == "file" and e.value.value == path.stat().st_size
    with pytest.raises(ModuleFormatError):
        read_module(tmp_path)
    with pytest.raises(ModuleFormatError):
        read_module(tmp_path / "missing.vmfb")
    with pytest.raises(ModuleFormatError):
        read_module(matmul(), max_bytes=100)


def test_accessors_refuse_bad_indices():
    m = read_module(matmul())
    for bad in (-1, len(m.rodata), "0", None):
        with pytest.raises(ModuleFormatError):
            m.rodata_bytes(bad)
    for bad in (-1, len(m.functions)):
        with pytest.raises(ModuleFormatError):
            m.function_bytecode(bad)
    assert m.export("matmul").function == 1
    with pytest.raises(ModuleFormatError):
        m.export("nope")


# --- synthetic modules: debug databases a compiler would not write ------------------------
def build(locations, maps, *, names=("f",)):
    """A bare module.fb with one function and a debug database of
    ``locations`` (tuples: ("file", name, line, col), ("call", callee,
    caller), ("fused", metadata, [children]), ("name", name, child or None),
    ("none",), ("type", n)) and source maps ``maps`` (lists of (offset,
    location))."""
    b = flatbuffers.Builder(256)

    def table(slots):
        b.StartObject(max(s for s, _, _ in slots) + 1 if slots else 0)
        for slot, kind, value in slots:
            {"u32": b.PrependUint32Slot, "i32": b.PrependInt32Slot,
             "u8": b.PrependUint8Slot, "off": b.PrependUOffsetTRelativeSlot}[kind](
                slot, value, 0 if kind != "off" else 0)
        return b.EndObject()

    def vec_offsets(offs):
        b.StartVector(4, len(offs), 4)
        for o in reversed(offs):
            b.PrependUOffsetTRelative(o)
        return b.EndVector()

    def vec_ints(values, fmt="i"):
        b.StartVector(4, len(values), 4)
        for v in reversed(values):
            b.PrependInt32(v) if fmt == "i" else b.PrependUint32(v)
        return b.EndVector()

    loc_tables, loc_types = [], []
    for loc in locations:
        kind = loc[0]
        if kind == "file":
            s = b.CreateString(loc[1])
            loc_tables.append(table([(0, "off", s), (1, "i32", loc[2]), (2, "i32", loc[3])]))
            loc_types.append(md.LOC_FILELINECOL)
        elif kind == "call":
            loc_tables.append(table([(0, "i32", loc[1]), (1, "i32", loc[2])]))
            loc_types.append(md.LOC_CALLSITE)
        elif kind == "fused":
            children = vec_ints(list(loc[2]))
            meta = b.CreateString(loc[1])
            loc_tables.append(table([(0, "off", meta), (1, "off", children)]))
            loc_types.append(md.LOC_FUSED)
        elif kind == "name":
            s = b.CreateString(loc[1])
            slots = [(0, "off", s)] + ([(1, "i32", loc[2])] if loc[2] is not None else [])
            loc_tables.append(table(slots))
            loc_types.append(md.LOC_NAME)
        else:
            loc_tables.append(table([(0, "i32", 1)]))
            loc_types.append(md.LOC_NONE if kind == "none" else loc[1])
    loc_vec = vec_offsets(loc_tables)
    b.StartVector(1, len(loc_types), 1)
    for t in reversed(loc_types):
        b.PrependUint8(t)
    type_vec = b.EndVector()
    fn_tables = []
    for i, entries in enumerate(maps):
        b.StartVector(8, len(entries), 4)
        for off, loc in reversed(entries):
            b.PrependInt32(loc)
            b.PrependInt32(off)
        locs = b.EndVector()
        name = b.CreateString(names[i] if i < len(names) else f"g{i}")
        fn_tables.append(table([(0, "off", name), (1, "off", locs)]))
    fns = vec_offsets(fn_tables)
    db = table([(0, "off", type_vec), (1, "off", loc_vec), (2, "off", fns)])
    code = b.CreateByteVector(bytes(16))
    b.StartVector(20, len(maps), 4)
    for _ in maps:
        b.PrependInt16(0)     # ref registers
        b.PrependInt16(1)     # i32 registers
        b.PrependInt16(1)     # blocks
        b.PrependInt16(0)
        b.PrependUint32(0)
        b.PrependInt32(16)
        b.PrependInt32(0)
    descs = b.EndVector()
    sigs = vec_offsets([table([]) for _ in maps])
    mod_name = b.CreateString("m")
    root = table([(0, "off", mod_name), (8, "off", sigs), (12, "off", descs),
                  (13, "u32", 17 << 16), (14, "off", code), (15, "off", db)])
    b.FinishSizePrefixed(root, b"IREE")
    return bytes(b.Output())


def test_synthetic_module_locations():
    data = build([("file", "a.mlir", 3, 4), ("file", "b.mlir", 9, 1), ("call", 0, 1),
                  ("fused", "meta", [5, 1]), ("name", "n", 2), ("none",)],
                 [[(0, 2), (4, 3), (8, 4), (12, 5)]])
    m = read_module(data)
    assert m.functions[0].name == "f" and m.debug.function_names == ("f",)
    d = m.debug
    assert d.location(0, 0) == "a.mlir:3:4"
    assert d.stack(0, 0) == ("a.mlir:3:4", "b.mlir:9:1")
    assert d.location(0, 4) == "b.mlir:9:1"          # fused: the first known child
    assert d.location(0, 8) == "a.mlir:3:4"          # name -> call site -> callee
    assert d.location(0, 12) is None and d.stack(0, 12) == ()
    assert d.location(0, 6) is None and d.location(0, 6, nearest=True) == "b.mlir:9:1"
    assert [loc for _, loc in d.locations(0)] == ["a.mlir:3:4", "b.mlir:9:1", "a.mlir:3:4",
                                                  None]


def test_synthetic_cyclic_locations_end():
    data = build([("call", 1, 0), ("fused", "", [0, 1, 2, 1, 0] * 50),
                  ("name", "loop", 2)] + [("fused", "", list(range(6)) * 40)] * 3,
                 [[(0, 0), (1, 1), (2, 2), (3, 3)]])
    m = read_module(data)
    for off in range(4):
        assert m.debug.location(0, off) is None
        assert m.debug.stack(0, off) == ()


@pytest.mark.parametrize("locations,maps,field", [
    ([("call", 0, 7)], [[(0, 0)]], "debug_database.location_table[0]"),
    ([("fused", "", [0, -1])], [[(0, 0)]], "debug_database.location_table[0]"),
    ([("name", "x", 3)], [[(0, 0)]], "debug_database.location_table[0]"),
    ([("type", 9)], [[(0, 0)]], "debug_database.location_table[0]"),
    ([("none",)], [[(0, 4)]], "debug_database.functions[0].locations[0].location"),
    ([("none",)], [[], []], None),
])
def test_synthetic_bad_debug_database(locations, maps, field):
    data = build(locations, maps)
    if field is None:
        m = read_module(data)            # two functions with empty source maps
        assert len(m.functions) == 2
        return
    refused(data, field=field)


def test_synthetic_bare_module_and_invalid_utf8_in_debug():
    data = build([("file", "ok.mlir", 1, 1)], [[(0, 0)]])
    assert read_module(data).debug.location(0, 0) == "ok.mlir:1:1"
    bad = data.replace(b"ok.mlir", b"o\xffmlir!")
    refused(bad, field="debug_database.location_table[0].filename")


# --- the fuzz target ------------------------------------------------------------------------
def test_fuzz_slice_vmfb(tmp_path):
    """A short run of ``python -m fuzz --target vmfb``: mutated modules are
    accepted or refused with typed errors; nothing escapes, hangs or blows
    up."""
    import os
    import sys
    report = tmp_path / "report.json"
    proc = subprocess.run(
        [sys.executable, "-m", "fuzz", "--target", "vmfb", "--cases", "120", "--seed", "1",
         "--jobs", "2", "--report", str(report), "--out", str(tmp_path / "cases"),
         "--quiet", "--no-minimize"],
        cwd=ROOT, env=dict(os.environ, OPENBLAS_NUM_THREADS="1"), capture_output=True,
        text=True, timeout=300)
    assert report.exists(), proc.stdout + proc.stderr
    out = json.loads(report.read_text())
    row = out["summary"]["vmfb"]["native"]
    assert sum(row.values()) == 120
    assert row["accepted"] > 0 and row["typed"] > 60, row
    assert out["problem_count"] == 0 and proc.returncode == 0, proc.stdout
    assert all(c["column"] in ("accepted", "typed") for c in out["cases"])


def test_fuzz_vmfb_cases_are_deterministic():
    from fuzz import corpus
    c = corpus.Corpus(with_sites=False)
    for i in range(20):
        a = corpus.make_case(c, 1, "native", i, ("vmfb",))
        b = corpus.make_case(c, 1, "native", i, ("vmfb",))
        assert a == b and a["seed"].startswith("vmfb:")
        assert corpus.case_data(c, a) == corpus.case_data(c, b)
