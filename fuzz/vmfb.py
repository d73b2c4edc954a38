"""Target ``vmfb``: hostile compiled modules for :mod:`hal_cpu.programs.vm.module_def`.

Seeds are real ``.vmfb`` files, compiled by ``iree-compile`` from the
repository's programs (:data:`PROGRAMS` for :data:`ARCHES`, through
:func:`hal_cpu.programs.compile_program` and its cache). :class:`VmfbModel`
maps a seed: the ZIP local header of ``module.fb`` (method, flags, sizes,
ZIP64 sizes, name and extra lengths), the size prefix, and every field the
FlatBuffer reaches from its root, walked with the reader's own schema
(:data:`hal_cpu.programs.vm.module_def.SCHEMA`): tables' vtables (sizes, slot
offsets, the table's signed offset to it), offsets to tables, vectors and
strings, vector lengths, scalars (versions, ordinals, register counts,
external data offsets and lengths, union types, location indexes) and the
strings' bytes.

One to three mutations per case (:func:`mutate_vmfb`): a field set to a
boundary value (zero, all ones, sign and width limits, plus or minus one,
the FlatBuffer's and file's sizes, the VM's register limits) or, for an
offset, to another table (type confusion, aliasing, cycles); a string made
invalid UTF-8, stripped of its terminating zero or given a huge length;
ZIP header values (compressed, encrypted, a member claiming 1 GiB);
random bytes in the FlatBuffer; truncation at the structure's edges;
appended bytes.

The child (:func:`run`) reads the mutated file as bytes and as a path
(:func:`hal_cpu.programs.vm.module_def.read_module`), takes every function's
bytecode, every read-only segment's bytes and every debug location, and
lists and reads the archive's executables through :mod:`hal_cpu.programs.vm.vmfb`.
Each must finish with success or a typed error.
"""

from __future__ import annotations

import os
import random
import struct
from dataclasses import dataclass, field
from pathlib import Path

from .model import Field
from .mutate import _pick, generic_values, set_field

ROOT = Path(__file__).resolve().parent.parent
PROGRAMS = ("tests/programs/matmul.mlir", "tests/programs/mm_rowsum.mlir",
            "tests/programs/host_code.mlir", "tests/programs/check/elementwise.mlir",
            "tests/programs/host_modules/basic.mlir")
ARCHES = ("x86_64", "riscv32")
#: Elements of one vector walked (the rest share their layout).
_WALK_ELEMENTS = 48


def seed_files() -> list[tuple[str, Path]]:
    """``(seed name, path)`` of each seed, compiled when not cached."""
    from hal_cpu.programs import compile_program
    out = []
    for program in PROGRAMS:
        for arch in ARCHES:
            out.append((f"vmfb:{program}@{arch}",
                        Path(compile_program(ROOT / program, arch).vmfb)))
    return out


@dataclass
class VmfbModel:
    """What a seed is made of (absolute file offsets)."""
    name: str
    data: bytes
    fields: list = field(default_factory=list)
    offsets: list = field(default_factory=list)       # uoffset fields
    strings: list = field(default_factory=list)       # (name, start, length)
    tables: list = field(default_factory=list)        # table positions
    zip_fields: list = field(default_factory=list)
    fb_start: int = 0
    fb_end: int = 0
    marks: list = field(default_factory=list)         # truncation points

    @classmethod
    def build(cls, data: bytes, name: str) -> "VmfbModel":
        from hal_cpu.programs.vm import module_def as md
        m = cls(name, data)
        u16 = lambda p: struct.unpack_from("<H", data, p)[0]  # noqa: E731
        u32 = lambda p: struct.unpack_from("<I", data, p)[0]  # noqa: E731
        # ZIP local header of module.fb
        z = m.zip_fields
        for fname, off, size, kind in (("flags", 6, 2, "flags"), ("method", 8, 2, "method"),
                                       ("csize", 18, 4, "size"), ("usize", 22, 4, "size"),
                                       ("name_len", 26, 2, "size"),
                                       ("extra_len", 28, 2, "size")):
            z.append(Field(f"zip.{fname}", off, size, int.from_bytes(
                data[off:off + size], "little"), kind))
        name_len, extra_len = u16(26), u16(28)
        pos = 30 + name_len
        end = pos + extra_len
        while pos + 4 <= end:
            tag, n = struct.unpack_from("<HH", data, pos)
            if tag == 1:
                for k in range(min(n, 16) // 8):
                    at = pos + 4 + 8 * k
                    z.append(Field(f"zip.zip64[{k}]", at, 8, struct.unpack_from(
                        "<Q", data, at)[0], "size"))
            pos += 4 + n
        prefix_at = end
        m.fb_start = fb = prefix_at + 4
        m.fb_end = fb + u32(prefix_at)
        m.fields.append(Field("size_prefix", prefix_at, 4, u32(prefix_at), "size"))
        m.fields.append(Field("identifier", fb + 4, 4, u32(fb + 4), "int"))
        root_field = Field("root", fb, 4, u32(fb), "uoffset")
        m.offsets.append(root_field)
        seen: set = set()

        def scalar(path, pos, kind):
            size = {"u8": 1, "i16": 2, "u16": 2, "u32": 4, "i32": 4, "u64": 8}[kind]
            value = int.from_bytes(data[pos:pos + size], "little")
            meaning = ("offset" if path.endswith("external_data_offset") else
                       "size" if path.endswith(("external_data_length", "byte_size",
                                                "global_bytes_capacity", "bytecode_length"))
                       else "registers" if path.endswith("register_count") else
                       "version" if path.endswith("bytecode_version") else
                       "utype" if kind == "u8" else "int")
            m.fields.append(Field(path, pos, size, value, meaning))

        def vector(path, pos):
            target = pos + u32(pos)
            m.offsets.append(Field(path, pos, 4, u32(pos), "uoffset"))
            count = u32(target)
            m.fields.append(Field(f"{path}.length", target, 4, count, "count"))
            return target + 4, count

        def table(path, t, schema):
            m.tables.append(t)
            if t in seen:
                return
            seen.add(t)
            soff = struct.unpack_from("<i", data, t)[0]
            vt = t - soff
            m.fields.append(Field(f"{path}.soffset", t, 4, soff & 0xFFFFFFFF, "soffset"))
            vt_size, t_size = u16(vt), u16(vt + 2)
            m.fields.append(Field(f"{path}.vtable_size", vt, 2, vt_size, "voffset"))
            m.fields.append(Field(f"{path}.table_size", vt + 2, 2, t_size, "voffset"))
            union_types = {}
            for fname, (slot, kind) in md.SCHEMA[schema].items():
                at = vt + 4 + 2 * slot
                if at + 2 > vt + vt_size:
                    continue
                fo = u16(at)
                m.fields.append(Field(f"{path}.{fname}.voffset", at, 2, fo, "voffset"))
                if fo == 0:
                    continue
                pos = t + fo
                fpath = f"{path}.{fname}" if path else fname
                if kind in ("u8", "i16", "u32", "i32", "u64"):
                    scalar(fpath, pos, kind)
                    if kind == "u8":
                        union_types[fname] = data[pos]
                elif kind == "string":
                    start, count = vector(fpath, pos)
                    m.strings.append((fpath, start, count))
                elif kind.startswith("table:"):
                    target = pos + u32(pos)
                    m.offsets.append(Field(fpath, pos, 4, u32(pos), "uoffset"))
                    table(fpath, target, kind[6:])
                elif kind.startswith("union:"):
                    utype = union_types.get(f"{fname}_type", 0)
                    member = md.UNIONS[kind[6:]].get(utype)
                    target = pos + u32(pos)
                    m.offsets.append(Field(fpath, pos, 4, u32(pos), "uoffset"))
                    if member:
                        table(fpath, target, member)
                elif kind in ("[u8]", "[i32]"):
                    start, count = vector(fpath, pos)
                    size = 1 if kind == "[u8]" else 4
                    for i in range(min(count, _WALK_ELEMENTS)):
                        scalar(f"{fpath}[{i}]", start + size * i, "u8" if size == 1
                               else "i32")
                    if kind == "[u8]":
                        union_types[fname] = bytes(data[start:start + count])
                elif kind.startswith("[struct:"):
                    sname = kind[8:-1]
                    start, count = vector(fpath, pos)
                    for i in range(min(count, _WALK_ELEMENTS)):
                        for f_name, f_off, f_kind in md.STRUCTS[sname]:
                            scalar(f"{fpath}[{i}].{f_name}",
                                   start + md.STRUCT_SIZES[sname] * i + f_off, f_kind)
                elif kind.startswith("[table:") or kind.startswith("[union:"):
                    start, count = vector(fpath, pos)
                    types = union_types.get(f"{fname}_type", b"")
                    for i in range(min(count, _WALK_ELEMENTS)):
                        at = start + 4 * i
                        m.offsets.append(Field(f"{fpath}[{i}]", at, 4, u32(at), "uoffset"))
                        if kind.startswith("[table:"):
                            table(f"{fpath}[{i}]", at + u32(at), kind[7:-1])
                        else:
                            member = md.UNIONS[kind[7:-1]].get(
                                types[i] if i < len(types) else 0)
                            if member:
                                table(f"{fpath}[{i}]", at + u32(at), member)

        table("", fb + u32(fb), "BytecodeModuleDef")
        module = md.read_module(data)
        m.marks = [0, 4, 29, 30, prefix_at, prefix_at + 2, fb, fb + 8, fb + 12,
                   m.fb_end - 1, m.fb_end, len(data) - 1]
        for r in module.rodata:
            m.marks += [r.offset, r.offset + r.size // 2, r.offset + r.size - 1]
        return m


# --- mutators ------------------------------------------------------------------------
def _values(rng, f: Field, m: VmfbModel) -> list[int]:
    from hal_cpu.programs.vm import module_def as md
    n, fb_len = len(m.data), m.fb_end - m.fb_start
    v = f.value
    if f.kind == "uoffset":
        # another table, the end of the buffer, itself, misaligned
        others = [t - f.offset for t in rng.sample(m.tables, min(8, len(m.tables)))]
        return others + [0, 1, 2, 4, v + 1, v + 2, v - 4, v + 4, fb_len, m.fb_end - f.offset,
                         m.fb_end - f.offset - 4, 0x7FFFFFFF, 0xFFFFFFFC, n]
    if f.kind == "count":
        return [0, 1, v + 1, v - 1, v * 2, v + 16, fb_len, fb_len // 4, fb_len // 20,
                0x10000, 0x7FFFFFFF, 0xFFFFFFFF, 0x80000000, n]
    if f.kind == "voffset":
        return [0, 1, 2, 3, 4, v + 2, v - 2, v + 4, v * 2, 0x7FFF, 0xFFFF, 0xFFFE, fb_len & 0xFFFF]
    if f.kind == "soffset":
        return [0, 4, -4 & 0xFFFFFFFF, (v + 2) & 0xFFFFFFFF, (v - 2) & 0xFFFFFFFF,
                f.offset - m.fb_start, (f.offset - m.fb_end) & 0xFFFFFFFF, 0x7FFFFFFF,
                0x80000000]
    if f.kind == "offset":
        return [0, v + 1, n, n - 1, v + n, 1 << 63, (1 << 64) - 1, (1 << 64) - v, 64]
    if f.kind == "size":
        return [0, 1, v + 1, v - 1, v * 2, n, n + 1, 1 << 30, 1 << 31, 0x7FFFFFFF,
                0xFFFFFFFF, (1 << 64) - 1, 1 << 62, md.MAX_GLOBAL_BYTES + 1]
    if f.kind == "registers":
        return [0, -1 & 0xFFFF, md.MAX_I32_REGISTERS, md.MAX_I32_REGISTERS + 1,
                md.MAX_REF_REGISTERS, md.MAX_REF_REGISTERS + 1, 0x7FFF, 0x8000]
    if f.kind == "version":
        return [0, 17 << 16, (17 << 16) | 1, 18 << 16, 16 << 16, 0xFFFFFFFF, 17]
    if f.kind == "utype":
        return [0, 1, 2, 3, 4, 5, 0x7F, 0xFF]
    if f.kind == "method":
        return [8, 12, 14, 1, 99, 0xFFFF]
    if f.kind == "flags":
        return [1, 8, 0x41, 0xFFFF]
    return [0, 1, 0xFFFFFFFF, 0x7FFFFFFF, 0x80000000, v + 1, v - 1, -1, 16, 0x10000]


def _set(f: Field, value: int):
    return f"{f.name} {f.value:#x} -> {value & ((1 << 8 * f.size) - 1):#x}", [set_field(f, value)]


def m_field(rng, m: VmfbModel):
    f = rng.choice(m.fields)
    r = rng.random()
    if r < 0.15:
        value = f.value ^ (1 << rng.randrange(8 * f.size))
    elif r < 0.6:
        value = rng.choice(_values(rng, f, m))
    else:
        value = rng.choice(generic_values(f.value, f.size))
    return _set(f, value)


def m_offset(rng, m: VmfbModel):
    f = rng.choice(m.offsets)
    return _set(f, rng.choice(_values(rng, f, m)))


def m_string(rng, m: VmfbModel):
    name, start, count = rng.choice(m.strings)
    choice = rng.randrange(5)
    if choice == 0 and count:
        at = start + rng.randrange(count)
        return f"{name}[{at - start}] = 0xff", [("set", at, b"\xff")]
    if choice == 1 and count >= 2:
        at = start + rng.randrange(count - 1)
        bad = rng.choice([b"\xc3\x28", b"\xe2\x28", b"\xed\xa0", b"\xc0\xaf"])
        return f"{name}[{at - start}] = {bad.hex()}", [("set", at, bad)]
    if choice == 2:
        return f"{name} without its terminating zero", [("set", start + count, b"A")]
    if choice == 3 and count:
        return f"{name} with a zero inside", [("set", start + rng.randrange(count), b"\0")]
    length = rng.choice([count + 1, count + 3, 0xFFFFFFFF, 0x7FFFFFFF, m.fb_end - start])
    return (f"{name}.length {count} -> {length & 0xFFFFFFFF:#x}",
            [("set", start - 4, (length & 0xFFFFFFFF).to_bytes(4, "little"))])


def m_zip(rng, m: VmfbModel):
    f = rng.choice(m.zip_fields)
    return _set(f, rng.choice(_values(rng, f, m) + generic_values(f.value, f.size)))


def m_bytes(rng, m: VmfbModel):
    k = rng.choice([1, 1, 2, 4, 8, 16])
    ops, where = [], []
    for _ in range(k):
        at = rng.randrange(m.fb_start, m.fb_end)
        ops.append(("set", at, bytes([rng.randrange(256)])))
        where.append(f"{at:#x}")
    return f"{k} random bytes at {','.join(where)}", ops


def m_truncate(rng, m: VmfbModel):
    n = len(m.data)
    length = rng.choice(m.marks) if rng.random() < 0.7 else rng.randrange(n)
    length = max(0, min(length, n - 1))
    return f"truncate to {length:#x} of {n:#x}", [("truncate", length)]


def m_append(rng, m: VmfbModel):
    k = rng.choice([1, 7, 64, 4096])
    return f"append {k} bytes", [("append", bytes(rng.randrange(256) for _ in range(k)))]


def m_copy(rng, m: VmfbModel):
    """Eight bytes of one table written over another (type confusion)."""
    a, b = rng.sample(m.tables, 2) if len(m.tables) > 1 else (m.tables[0], m.tables[0])
    raw = m.data[a:a + 8]
    return f"table at {a:#x} copied over {b:#x}", [("set", b, raw)]


VMFB_MUTATORS = [(m_field, 30), (m_offset, 12), (m_string, 10), (m_zip, 6), (m_bytes, 12),
                 (m_truncate, 5), (m_append, 1), (m_copy, 4)]


def mutate_vmfb(rng: random.Random, model: VmfbModel, count: int | None = None) -> list:
    """1 to 3 mutations of one seed: ``[(description, ops), ...]``."""
    if count is None:
        count = rng.choice([1, 1, 1, 2, 2, 3])
    out = []
    for _ in range(count):
        fn = _pick(rng, VMFB_MUTATORS)
        desc, ops = fn(rng, model)
        out.append((f"{fn.__name__[2:]}: {desc}", ops))
    return out


# --- the child's steps -------------------------------------------------------------------
def use(module) -> int:
    """Touch everything a module offers; returns a byte count."""
    total = 0
    for f in module.functions:
        total += len(bytes(module.function_bytecode(f.ordinal)))
    for r in module.rodata:
        total += len(bytes(module.rodata_bytes(r.index)))
    if module.debug is not None:
        for f in module.functions:
            for off, _ in module.debug.locations(f.ordinal):
                module.debug.stack(f.ordinal, off)
                module.debug.location(f.ordinal, off + 1, nearest=True)
    return total


def run(case, data, rep, opts):
    """The mutated file read as bytes and as a path, everything in it used,
    its executables listed and read; the first typed error is raised at the
    end (every step runs)."""
    import shutil
    import tempfile

    from fatelf import PortableKernelError
    from hal_cpu.programs.vm import vmfb
    from hal_cpu.programs.vm.module_def import read_module
    first_typed = []

    def step(name, fn):
        rep.enter(name)
        try:
            fn()
        except PortableKernelError as exc:
            rep.mark_failure()
            first_typed.append(exc)

    tmp = tempfile.mkdtemp(prefix="pkr-fuzz-vmfb-")
    path = os.path.join(tmp, "case.vmfb")
    with open(path, "wb") as f:
        f.write(data)

    def executables():
        for e in vmfb.executables(path):
            vmfb.read_executable(path, e.member)

    try:
        step("parse", lambda: use(read_module(data, name="case.vmfb")))
        step("map", lambda: use(read_module(path)))
        step("verify", executables)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if first_typed:
        raise first_typed[0]
