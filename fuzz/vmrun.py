"""Targets ``vmfb-run`` and ``names``: compiled programs mutated where the
VM reads meaning, then loaded and run.

Seeds are real ``.vmfb`` files compiled by the pinned ``iree-compile`` from
the repository's programs (:data:`PROGRAMS`) for x86_64 (run natively) and
aarch64 and riscv64 (run emulated), through
:func:`hal_cpu.programs.compile_program` and its cache.

:class:`ProgramModel` maps a seed with the VM's own reader and decoder
(:func:`hal_cpu.programs.vm.module_def.read_module`, :func:`hal_cpu.programs.vm.decode.decode`):
every instruction of every function, with the file offset of its opcode
byte and of each field (registers, immediates, branch targets, callee
ordinals), the function descriptors, the strings naming functions, imports
and exports, the read-only segments' sizes, and the constants that feed the
calls that size or place memory: the operands of ``hal.command_buffer.dispatch``
(workgroup counts, push constants, binding offsets and lengths), of the
``hal`` allocation, copy, fill, subspan and buffer-view calls, and of
``vm.buffer.alloc``, ``vm.list.alloc`` and ``vm.list.resize`` (a constant
feeds an operand when a ``const`` op writes the operand's register).

One to three mutations per case (:func:`mutate_run`), each one of
(:data:`RUN_MUTATORS`): an opcode replaced by another of the same operand
layout (the file still decodes; the meaning changes) or by any byte; a
register operand set to another register, the register file's edge, past
it, with the ref or move bit flipped; a branch target set to another block,
into an instruction, past the function; a callee set to another function,
another import, past both; a function descriptor's bytecode offset, length,
block count or register counts changed; a name replaced
(:data:`NAMES`: characters Python rejects or normalises, NUL, quotes,
newlines, terminal escape sequences, invalid UTF-8, very long names written
over a later part of the file); a read-only segment's size or place; a
dispatch, allocation or list constant set to a boundary value; any
constant changed; a FlatBuffer field mutation of the ``vmfb`` target.

The child (:func:`run`) fills memory with a canary pattern first
(:data:`CANARY`: blocks of the heap freed after being filled, so that
allocations made later sit among them), loads the program
(``load_program(data, backend=..., timeout=..., memory_limit=...)``) and
calls every public function with inputs built from its signature, filled
with a known pattern (:func:`inputs_for`). A result holding bytes of the
canary pattern returned bytes from outside its input buffers: the case is
``oob``. A native case runs confined when the machine can
(:func:`elfloader.backend.emulated.sandbox.confine_native`, set before the
file is read). The ``names`` target (:func:`run_names`) also runs the
command line's printers over the file (``hal-cpu inspect``, ``run-module``
without a function, which lists them, ``check-module``,
``benchmark-module`` of the first function), and has cases of the sample
plugin with its name, description and import names replaced
(:func:`run_plugin_names`): each command must end with status 0 or 1, at
most one line on stderr, and no raw control character of a name in its
output.
"""

from __future__ import annotations

import os
import random
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
#: Programs compiled into the seeds (small ones: every case loads one).
PROGRAMS = ("tests/programs/vm/control.mlir", "tests/programs/vm/refs.mlir",
            "tests/programs/vm/int_ops.mlir",
            "tests/programs/vm_hal/mlp.mlir", "tests/programs/matmul.mlir",
            "tests/programs/mm_rowsum.mlir", "tests/programs/add_i32.mlir",
            "tests/programs/check/elementwise.mlir",
            "hal_cpu/samples/samples_mul_add.mlir", "hal_cpu/samples/samples_matmul.mlir",
            "hal_cpu/samples/samples_sum_last.mlir")
#: Architectures of the seeds: the native backend runs the host's, the
#: emulated one the others.
ARCHES = ("x86_64", "aarch64", "riscv64")
#: Seconds one call (and the module's ``__init``) may take.
CALL_LIMIT = 2.0
#: Bytes of buffers a case's program may hold at once.
MEMORY_LIMIT = 256 << 20
#: Largest tensor input made from a declaration, in elements.
MAX_INPUT_ELEMENTS = 1 << 16
#: The canary pattern the child fills memory around its inputs with; no
#: seed holds any four consecutive bytes of it.
CANARY = bytes.fromhex("a71ce35d9b42f608")
#: Every four-byte window of the repeated pattern.
CANARY_WORDS = tuple((CANARY * 2)[i:i + 4] for i in range(len(CANARY)))

#: Names written over function, import and export names. Characters
#: Python's identifiers reject or NFKC normalises (``²``, ``Ⅰ``, ``ﬁ``,
#: a full-width letter), NUL, quotes, newlines, terminal escape sequences,
#: a right-to-left override, invalid UTF-8; long names are made apart.
NAMES = ("x²", "Ⅰ", "ﬁle", "ｆｕｌｌ", "a\x00b", "\x00", "'", '"', "a'b\"c", "\n",
         "line1\nline2", "\r\n", "\x1b[31mred\x1b[0m", "\x1b]0;title\x07", "\x1b[2J",
         "\t", "\x7f", "\u202egnp.exe", "\ufeffbom", "\\x41\\n", "%s%n", "{0}",
         "..", "/etc/passwd", "", " ", "é", "e\u0301", "\udcff")
_BAD_UTF8 = (b"\xff", b"\xc3\x28", b"\xed\xa0\x80", b"\xc0\xaf", b"\xe2\x28\xa1", b"\x80")
#: Lengths of the long names.
LONG_NAMES = (255, 256, 1024, 4096, 65535, 65536, 200_000)

#: ``hal`` calls whose operands size or place memory (dispatch: workgroup
#: counts, constants, binding offsets and lengths).
MEMORY_CALLS = ("hal.command_buffer.dispatch", "hal.allocator.allocate",
                "hal.device.queue.alloca", "hal.command_buffer.copy_buffer",
                "hal.command_buffer.fill_buffer", "hal.buffer.subspan",
                "hal.buffer_view.create", "hal.buffer.load", "hal.buffer.store",
                "hal.device.queue.copy", "hal.device.queue.fill",
                "hal.command_buffer.update_buffer", "hal.buffer.allocation.preserve",
                "hal.device.queue.read", "hal.device.queue.write")
#: VM ops whose operands size memory.
MEMORY_OPS = ("buffer.alloc", "buffer.clone", "list.alloc", "list.resize",
              "buffer.copy", "buffer.fill.i8", "buffer.fill.i16", "buffer.fill.i32",
              "buffer.fill.i64", "buffer.fill.f32", "buffer.fill.f64", "buffer.load.i32",
              "buffer.store.i32")


def seed_files(arches=ARCHES) -> list[tuple[str, str, Path]]:
    """``(seed name, arch, path)`` of each seed, compiled when not cached;
    a program that does not compile for an architecture is left out (with a
    warning)."""
    import sys

    from hal_cpu.programs import compile_program
    out = []
    for program in PROGRAMS:
        for arch in arches:
            try:
                path = Path(compile_program(ROOT / program, arch).vmfb)
            except Exception as exc:  # noqa: BLE001 - only fewer seeds
                first = (str(exc).strip().splitlines() or [""])[0][:200]
                print(f"fuzz: {program} for {arch} left out: {type(exc).__name__}: {first}",
                      file=sys.stderr)
                continue
            out.append((f"vmfb-run:{program}@{arch}", arch, path))
    return out


# --- the model ------------------------------------------------------------------------
@dataclass
class Site:
    """One place of the file a mutation may change: ``pos`` (file offset),
    ``size`` in bytes, ``value`` there, ``kind`` and the function
    (``fn``, internal ordinal) and instruction (``op``) it belongs to."""
    pos: int
    size: int
    value: int
    kind: str
    fn: int = -1
    op: str = ""
    role: str = ""


@dataclass
class FunctionMap:
    ordinal: int
    start: int                  # file offset of its bytecode
    length: int
    blocks: list = field(default_factory=list)      # block offsets
    starts: list = field(default_factory=list)      # instruction offsets
    i32_count: int = 0
    ref_count: int = 0


@dataclass
class ProgramModel:
    """What a seed is made of, for :func:`mutate_run` (file offsets)."""
    name: str
    data: bytes
    vmfb: Any = None                                   # fuzz.vmfb.VmfbModel
    functions: list = field(default_factory=list)      # FunctionMap
    opcodes: list = field(default_factory=list)        # Site kind core/ext_f32/ext_f64
    registers: list = field(default_factory=list)      # Site kind i32/i64/f32/f64/ref
    targets: list = field(default_factory=list)        # Site kind target
    callees: list = field(default_factory=list)        # Site kind func
    consts: list = field(default_factory=list)         # Site kind c_i32/c_i64/...
    memory_consts: list = field(default_factory=list)  # consts feeding MEMORY_*
    other_fields: list = field(default_factory=list)   # global/rodata/type/u16 ordinals
    descriptors: list = field(default_factory=list)    # model Fields
    names: list = field(default_factory=list)          # (path, start, length)
    rodata: list = field(default_factory=list)         # model Fields
    imports: int = 0
    n_functions: int = 0
    import_names: list = field(default_factory=list)

    @classmethod
    def build(cls, data: bytes, name: str) -> "ProgramModel":
        from hal_cpu.programs.vm import isa
        from hal_cpu.programs.vm.decode import decode
        from hal_cpu.programs.vm.module_def import read_module

        from .vmfb import VmfbModel
        m = cls(name, data)
        m.vmfb = VmfbModel.build(data, name)
        mdef = read_module(data, name=name)
        m.imports = len(mdef.imports)
        m.import_names = [i.name for i in mdef.imports]
        m.n_functions = len(mdef.functions)
        base = mdef._bytecode[0]
        for f in m.vmfb.fields:
            if f.name.startswith("function_descriptors["):
                m.descriptors.append(f)
            elif f.name.startswith("rodata_segments") and not f.name.endswith(
                    ("voffset", "soffset", "vtable_size", "table_size", "_type")) \
                    and "embedded_data[" not in f.name:
                m.rodata.append(f)
        m.rodata += [f for f in m.vmfb.offsets if f.name.startswith("rodata_segments")]
        for path, start, length in m.vmfb.strings:
            if path.endswith(("full_name", "local_name")) or path == "name" \
                    or path.endswith(".name"):
                m.names.append((path, start, length))
        by_name = {op.name: op for table in isa.OPS.values() for op in table.values()}
        del by_name
        for fn in mdef.functions:
            raw = bytes(mdef.function_bytecode(fn.ordinal))
            start = base + fn.bytecode_offset
            fmap = FunctionMap(fn.ordinal, start, len(raw), i32_count=fn.i32_register_count,
                               ref_count=fn.ref_register_count)
            m.functions.append(fmap)
            try:
                instrs = decode(raw, function=fn.name, i32_count=fn.i32_register_count,
                                ref_count=fn.ref_register_count)
            except Exception:  # noqa: BLE001 - a seed the decoder refuses: no sites
                continue
            writers: dict[int, list[Site]] = {}
            for ins in instrs:
                fmap.starts.append(ins.offset)
                if ins.op.opset == isa.CORE and ins.op.opcode == isa.BLOCK_OPCODE:
                    fmap.blocks.append(ins.offset)
                sites = _field_sites(raw, ins, start, fn.ordinal)
                ext = ins.op.opset != isa.CORE
                m.opcodes.append(Site(start + ins.offset + (1 if ext else 0), 1, ins.op.opcode,
                                      ins.op.opset, fn.ordinal, ins.op.name))
                consts = []
                for s in sites:
                    if s.kind in isa.REGISTER_KINDS:
                        m.registers.append(s)
                    elif s.kind == "target":
                        m.targets.append(s)
                    elif s.kind == "func":
                        m.callees.append(s)
                    elif s.kind.startswith("c_"):
                        m.consts.append(s)
                        consts.append(s)
                    elif s.kind in ("global", "rodata", "type", "u16"):
                        m.other_fields.append(s)
                if ins.op.name.startswith("const.") and consts:
                    result = [s for s in sites if s.role == "result"]
                    if result:
                        writers.setdefault(result[0].value, []).extend(consts)
                # operands of memory-sizing calls and ops
                callee = _callee_name(ins, m.import_names)
                if callee in MEMORY_CALLS or ins.op.name in MEMORY_OPS:
                    what = callee or f"vm.{ins.op.name}"
                    for s in sites:
                        if s.kind in isa.REGISTER_KINDS and s.role != "result":
                            for c in writers.get(s.value, []):
                                m.memory_consts.append(Site(c.pos, c.size, c.value, c.kind,
                                                            c.fn, c.op, what))
        return m


def _callee_name(ins, import_names) -> str | None:
    from hal_cpu.programs.vm import isa
    if not ins.op.name.startswith("call") or not ins.args:
        return None
    callee = ins.args[0]
    if callee & isa.IMPORT_BIT:
        k = callee & ~isa.IMPORT_BIT
        return import_names[k] if k < len(import_names) else None
    return None


def _field_sites(raw: bytes, ins, base: int, fn: int) -> list[Site]:
    """The sites of one instruction's fields (as :func:`decode` reads them);
    each list's registers, the values of its list entries."""
    from hal_cpu.programs.vm import isa
    sites = []
    pc = ins.offset + (2 if ins.op.opset != isa.CORE else 1)
    u16 = lambda p: struct.unpack_from("<H", raw, p)[0]  # noqa: E731
    for fld, arg in zip(ins.op.fields, ins.args):
        kind = fld.kind
        role = "result" if fld.write else ""
        if kind in isa.FIELD_SIZES:
            size = isa.FIELD_SIZES[kind]
            value = int.from_bytes(raw[pc:pc + size], "little")
            sites.append(Site(base + pc, size, value, kind, fn, ins.op.name, role))
            pc += size
        elif kind == "str":
            pc += 2 + u16(pc)
        elif kind in ("regs", "sizes", "remap"):
            pc += pc & 1
            count = u16(pc)
            per = 2 if kind != "remap" else 4
            if kind != "sizes":
                for k in range(count * per // 2):
                    at = pc + 2 + 2 * k
                    sites.append(Site(base + at, 2, u16(at), "ref" if u16(at) & isa.REF_BIT
                                      else "i32", fn, ins.op.name, role))
            pc += 2 + per * count
        elif kind == "cases":
            for _target, _pairs in arg:
                sites.append(Site(base + pc, 4, struct.unpack_from("<I", raw, pc)[0],
                                  "target", fn, ins.op.name))
                pc += 4
                pc += pc & 1
                count = u16(pc)
                pc += 2 + 4 * count
    return sites


# --- mutators --------------------------------------------------------------------------
def _set(site, value: int, what: str):
    size = site.size
    value &= (1 << 8 * size) - 1
    if value == site.value:         # a change, always
        value ^= 1
    return (f"{what} {site.op + ' ' if site.op else ''}at {site.pos:#x}: "
            f"{site.value:#x} -> {value:#x}",
            [("set", site.pos, value.to_bytes(size, "little"))])


def _layouts():
    from hal_cpu.programs.vm import isa
    out: dict = {}
    for opset, table in isa.OPS.items():
        for op in table.values():
            out.setdefault((opset, tuple(f.kind for f in op.fields)), []).append(op.opcode)
    return out


_LAYOUTS: dict | None = None


def m_opcode(rng, m: ProgramModel):
    global _LAYOUTS
    from hal_cpu.programs.vm import isa
    if _LAYOUTS is None:
        _LAYOUTS = _layouts()
    s = rng.choice(m.opcodes)
    if rng.random() < 0.75:
        op = isa.OPS[s.kind][s.value]
        same = _LAYOUTS.get((s.kind, tuple(f.kind for f in op.fields)), [s.value])
        value = rng.choice(same)
        if value == s.value:
            value = rng.choice(list(isa.OPS[s.kind]))
        return _set(s, value, "opcode")
    return _set(s, rng.randrange(256), "opcode (any byte)")


def m_register(rng, m: ProgramModel):
    from hal_cpu.programs.vm import isa
    s = rng.choice(m.registers)
    fmap = next(f for f in m.functions if f.ordinal == s.fn)
    v = s.value
    if v & isa.REF_BIT:
        count = fmap.ref_count
        choices = [isa.REF_BIT | rng.randrange(max(1, count)), isa.REF_BIT | (count - 1),
                   isa.REF_BIT | count, isa.REF_BIT | isa.REF_MASK, v ^ isa.MOVE_BIT,
                   v & ~isa.REF_BIT, isa.REF_BIT | isa.MOVE_BIT | rng.randrange(max(1, count)),
                   0xFFFF]
    else:
        count = fmap.i32_count
        choices = [rng.randrange(max(1, count)), count - 1, count, count + 1, v ^ 1,
                   0x7FFF, v | isa.REF_BIT, 0, (v + 1) & 0x7FFF]
    return _set(s, rng.choice(choices), "register")


def m_target(rng, m: ProgramModel):
    s = rng.choice(m.targets)
    fmap = next(f for f in m.functions if f.ordinal == s.fn)
    choices = [rng.choice(fmap.blocks or [0]), rng.choice(fmap.starts or [0]),
               s.value + 1, 0, fmap.length, fmap.length + 1, 0xFFFFFFFF, s.value ^ 0x80]
    return _set(s, rng.choice(choices), "branch target")


def m_callee(rng, m: ProgramModel):
    from hal_cpu.programs.vm import isa
    s = rng.choice(m.callees)
    choices = [rng.randrange(max(1, m.n_functions)), m.n_functions, 0x7FFFFFFF,
               isa.IMPORT_BIT | rng.randrange(max(1, m.imports)), isa.IMPORT_BIT | m.imports,
               isa.IMPORT_BIT | 0x7FFFFFFF, s.value ^ isa.IMPORT_BIT, s.value + 1]
    return _set(s, rng.choice(choices), "callee")


def m_descriptor(rng, m: ProgramModel):
    from .mutate import set_field
    f = rng.choice(m.descriptors)
    v = f.value
    if f.name.endswith("register_count"):
        choices = [0, 1, v - 1, v + 1, 0x7FFF, 0x8000, 0xFFFF, v * 2]
    elif f.name.endswith("block_count"):
        choices = [0, 1, v - 1, v + 1, 0x7FFF, 0xFFFF]
    else:
        choices = [0, 1, v - 1, v + 1, v + 4, v - 4, v * 2, 0x7FFFFFFF, 0xFFFFFFFF,
                   0x80000000, v + 0x10000]
    value = rng.choice(choices) & ((1 << 8 * f.size) - 1)
    if value == v:
        value ^= 1
    return (f"descriptor {f.name} {v:#x} -> {value:#x}", [set_field(f, value)])


def _encode_name(rng) -> bytes:
    r = rng.random()
    if r < 0.15:
        return rng.choice(_BAD_UTF8)
    name = rng.choice(NAMES)
    if r < 0.3:
        name = rng.choice(NAMES) + "fn" + name
    return name.encode("utf-8", "surrogatepass")


def m_name(rng, m: ProgramModel):
    """A name replaced in place (padded or cut to the old length, or given
    a shorter length), or a long name written over a later part of the file
    with the string's offset pointed at it."""
    path, start, count = rng.choice(m.names)
    if rng.random() < 0.2:
        return _long_name(rng, m, path, start, count)
    raw = _encode_name(rng)
    if rng.random() < 0.5 or len(raw) > count:
        # the new name's own length, when it fits
        if len(raw) <= count:
            ops = [("set", start - 4, len(raw).to_bytes(4, "little")),
                   ("set", start, raw + b"\0")]
            return f"name {path} -> {raw!r}", ops
        raw = raw[:count]
    padded = (raw * (count // max(1, len(raw)) + 1))[:count] if raw else b"\0" * count
    return f"name {path} -> {padded!r} (padded)", [("set", start, padded)]


def _long_name(rng, m: ProgramModel, path, start, count):
    """A long string placed over bytes later in the FlatBuffer (the string's
    offset field points forward), as long as there is room."""
    off_field = next((f for f in m.vmfb.offsets if f.name == path), None)
    want = rng.choice(LONG_NAMES)
    char = rng.choice(["a", "²", "\x1b[1m", "\n", "ﬁ", "\x00"]).encode()
    if off_field is None:
        return f"name {path} length {count} -> {want:#x}", [
            ("set", start - 4, want.to_bytes(4, "little"))]
    room_start = (start + count + 4) & ~3
    room = m.vmfb.fb_end - room_start - 8
    length = min(want, room)
    if length <= 0:
        return f"name {path} length {count} -> {want:#x}", [
            ("set", start - 4, want.to_bytes(4, "little"))]
    body = (char * (length // len(char) + 1))[:length]
    ops = [("set", room_start, len(body).to_bytes(4, "little") + body + b"\0"),
           ("set", off_field.offset,
            (room_start - off_field.offset).to_bytes(4, "little"))]
    return f"name {path} -> {len(body)} bytes of {char!r} at {room_start:#x}", ops


def m_rodata(rng, m: ProgramModel):
    from .vmfb import _values
    if not m.rodata:
        return m_const(rng, m)
    f = rng.choice(m.rodata)
    if f.kind == "uoffset":
        return _set_field(f, rng.choice(_values(rng, f, m.vmfb)), "rodata")
    return _set_field(f, rng.choice(_values(rng, f, m.vmfb) + [f.value - 1, f.value + 1, 0]),
                      "rodata")


def _set_field(f, value: int, what: str):
    from .mutate import set_field
    value &= (1 << 8 * f.size) - 1
    if value == f.value:
        value ^= 1
    return f"{what} {f.name} {f.value:#x} -> {value:#x}", [set_field(f, value)]


def _boundary(rng, s: Site) -> int:
    v = s.value
    if s.kind == "c_i32":
        v = struct.unpack("<i", s.value.to_bytes(4, "little"))[0]
    elif s.kind == "c_i64":
        v = struct.unpack("<q", s.value.to_bytes(8, "little"))[0]
    elif s.kind in ("c_f32", "c_f64"):
        fmt = "<f" if s.kind == "c_f32" else "<d"
        f = rng.choice([float("nan"), float("inf"), -float("inf"), -0.0, 1e38, -1.0,
                        2.0 ** 31, 2.0 ** 64, 5e-324])
        try:
            return int.from_bytes(struct.pack(fmt, f), "little")
        except OverflowError:
            return 0
    return rng.choice([0, -1, 1, v + 1, v - 1, -v, v * 2, v + 64, v + 4096, v * 1024,
                       (1 << 31) - 1, 1 << 31, -(1 << 31), (1 << 32) - 1, 1 << 32,
                       (1 << 40), (1 << 62), (1 << 63) - 1, -(1 << 63), 0x7FFFFFFF - v,
                       1 << 30, 3 << 30])


def m_memory(rng, m: ProgramModel):
    """A constant feeding a dispatch (workgroup counts, push constants,
    binding offsets and lengths) or an allocation, set to a boundary value."""
    if not m.memory_consts:
        return m_const(rng, m)
    s = rng.choice(m.memory_consts)
    desc, ops = _set(s, _boundary(rng, s), f"constant of {s.role}:")
    return desc, ops


def m_const(rng, m: ProgramModel):
    s = rng.choice(m.consts)
    if rng.random() < 0.2:
        return _set(s, s.value ^ (1 << rng.randrange(8 * s.size)), "constant bit")
    return _set(s, _boundary(rng, s), "constant")


def m_ordinal(rng, m: ProgramModel):
    """A global offset, read-only segment or type ordinal, or a u16 field."""
    if not m.other_fields:
        return m_const(rng, m)
    s = rng.choice(m.other_fields)
    return _set(s, rng.choice([0, s.value + 1, s.value - 1, s.value + 4, 0xFFFF,
                               0x7FFFFFFF, 0xFFFFFFFF, s.value * 2]), s.kind)


def m_flatbuffer(rng, m: ProgramModel):
    from .vmfb import mutate_vmfb
    return mutate_vmfb(rng, m.vmfb, count=1)[0]


RUN_MUTATORS = [(m_opcode, 14), (m_register, 12), (m_target, 6), (m_callee, 6),
                (m_descriptor, 7), (m_name, 6), (m_rodata, 5), (m_memory, 24),
                (m_const, 8), (m_ordinal, 5), (m_flatbuffer, 4)]
NAME_MUTATORS = [(m_name, 1)]


def _pick(rng, weighted):
    from .mutate import _pick as pick
    return pick(rng, weighted)


def mutate_run(rng: random.Random, model: ProgramModel, names: bool = False) -> list:
    """1 to 3 mutations of one seed (``names``: 1 to 3 names replaced):
    ``[(description, ops), ...]``."""
    out = []
    for _ in range(rng.choice([1, 1, 1, 2, 2, 3])):
        fn = _pick(rng, NAME_MUTATORS if names else RUN_MUTATORS)
        try:
            desc, ops = fn(rng, model)
        except (IndexError, StopIteration):      # a seed without such sites
            desc, ops = m_const(rng, model)
            fn = m_const
        out.append((f"{fn.__name__[2:]}: {desc}", ops))
    return out


# --- the child -------------------------------------------------------------------------
class OutOfBufferRead(Exception):
    """A result holds bytes of the canary pattern: it returned bytes from
    outside its input buffers."""


def fill_canary(blocks: int = 192) -> list:
    """Fill memory with :data:`CANARY`: blocks of 64 bytes to 256 KiB filled
    and two thirds of them freed (the allocator hands their space out
    again, canary and all), the others kept between them."""
    sizes = [64, 128, 200, 256, 512, 1024, 4096, 16384, 65536, 262144]
    kept: list[bytearray] = []
    freed: list[bytearray] = []
    for i in range(blocks):
        block = bytearray(CANARY * (sizes[i % len(sizes)] // len(CANARY)))
        (kept if i % 3 == 0 else freed).append(block)
    del freed
    return kept


def inputs_for(fn) -> list:
    """Inputs for ``fn`` from its declaration: each tensor filled with a
    known pattern (dynamic sizes 3), scalar arguments 3."""
    import numpy as np

    from .programs import declared_inputs
    values: list = []
    for ty, spec in zip(fn.arg_types, declared_inputs(fn, 3, MAX_INPUT_ELEMENTS)):
        if spec is None:
            values.append(3.0 if ty in ("f", "F") else 3)
            continue
        shape, dtype = spec
        count = int(np.prod(shape)) if shape else 1
        values.append(in_canary(((np.arange(count) % 7) + 1).astype(dtype).reshape(shape)))
    return values


#: Canary bytes before and after each input (:func:`in_canary`).
MARGIN = 4096


def in_canary(array):
    """``array`` copied into the middle of a buffer filled with
    :data:`CANARY`, :data:`MARGIN` bytes of it on each side, 64-byte
    aligned: a read past either end of the input reads canary bytes."""
    import numpy as np
    size = array.nbytes
    backing = np.resize(np.frombuffer(CANARY, np.uint8), size + 2 * MARGIN + 64)
    start = MARGIN + (-(backing.ctypes.data + MARGIN) % 64)
    view = backing[start:start + size].view(array.dtype).reshape(array.shape)
    view[...] = array
    return view


def _raw(value, depth: int = 0) -> bytes:
    """The bytes a result carries (arrays, buffers, lists of them)."""
    import numpy as np
    if depth > 8:
        return b""
    if isinstance(value, np.ndarray):
        return value.tobytes()
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    if isinstance(value, (list, tuple)):
        return b"".join(_raw(v, depth + 1) for v in value)
    if isinstance(value, np.generic):
        return value.tobytes()
    getter = getattr(value, "bytes", None)
    if callable(getter):
        try:
            return bytes(getter())
        except Exception:  # noqa: BLE001 - only what can be read
            return b""
    return b""


def check_result(name: str, value) -> None:
    """Raise :class:`OutOfBufferRead` when ``value`` holds canary bytes."""
    raw = _raw(value)
    for word in CANARY_WORDS:
        at = raw.find(word)
        if at >= 0:
            raise OutOfBufferRead(f"result of {name!r} holds canary bytes at byte {at} "
                                  f"of {len(raw)}: {raw[max(0, at - 8):at + 16].hex()}")


def confine(rep, keep=()) -> str:
    """Confine this (native) child as a native run is confined; the note
    says how, or why not."""
    try:
        from elfloader.backend.emulated import sandbox
        confine_native = sandbox.confine_native
    except (ImportError, AttributeError):
        return "unconfined: no confine_native"
    import sys
    import sysconfig
    read = tuple(sorted({str(ROOT), sys.prefix, sys.base_prefix,
                         sysconfig.get_paths()["stdlib"], "/usr/lib", "/lib"}))
    try:
        confine_native(keep=(rep.fd, *keep), read=read)
    except Exception as exc:  # noqa: BLE001 - run unconfined, and say so
        return f"unconfined: {type(exc).__name__}: {exc}"
    return "confined"


def run(case, data, rep, opts):
    """Load the mutated program and call every public function (see the
    module docstring); the first typed error is the outcome, after every
    function ran."""
    from fatelf import PortableKernelError
    from hal_cpu.programs.vm import load_program
    backend = "native" if case["backend"] == "native" else "emulated"
    if case["target"] == "names":
        # the file the printers read: made before the child is confined (it
        # may create no file), kept open across the confinement
        fd = os.memfd_create("case.vmfb")
        os.write(fd, data)
        opts = dict(opts, names_path=f"/proc/self/fd/{fd}", keep_fds=(fd,))
    if backend == "native" and opts.get("confine", True) and case["target"] != "names":
        # (a names case runs hal-cpu's commands, which confine their own
        # native runs: a confined process cannot confine a child again)
        note = confine(rep, opts.get("keep_fds", ()))
        if note != "confined":
            rep.send("N", note)
    keep = fill_canary()
    rep.enter("parse")
    program = load_program(data, backend=backend, timeout=CALL_LIMIT,
                           memory_limit=MEMORY_LIMIT)
    try:
        first = None
        for name, fn in list(program.functions.items()):
            rep.enter("dispatch")
            try:
                result = fn(*inputs_for(fn))
            except PortableKernelError as exc:
                rep.mark_failure()
                first = first or exc
                continue
            check_result(name, result)
        if case["target"] == "names":
            rep.enter("resolve")
            run_printers(case, data, opts["names_path"])
        if first is not None:
            raise first
    finally:
        rep.enter("close")
        program.close()
    del keep


class PrinterError(Exception):
    """A printer of the command line did not end as promised (counted as an
    escape)."""


def run_names(case, data, rep, opts):
    """Target ``names``: as :func:`run`; then the command line's printers
    (a sample plugin's names: :func:`run_plugin_names`)."""
    from fatelf import PortableKernelError
    if case.get("kind") == "plugin":
        return run_plugin_names(case, data, rep, opts)
    try:
        run(case, data, rep, opts)
    except PortableKernelError:
        rep.enter("resolve")
        run_printers(case, data, _names_path(opts))
        raise


def _names_path(opts) -> str:
    for name in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{name}").startswith("/memfd:case.vmfb"):
                return f"/proc/self/fd/{name}"
        except OSError:
            continue
    raise PrinterError("the case's file is gone")


def run_printers(case, data, path: str) -> None:
    """``hal-cpu run-module`` (lists the functions), ``check-module`` and
    ``benchmark-module`` of the first function, in this process: each must
    end with status 0 or 1, at most one line on stderr on failure, and print
    no control character but newlines."""

    backend = "native" if case["backend"] == "native" else "emulated"
    if True:
        first = None
        try:
            from hal_cpu.programs.vm.module_def import read_module
            mdef = read_module(data, name="case.vmfb")
            first = mdef.exports[0].name if mdef.exports else None
        except Exception:  # noqa: BLE001 - the commands say why
            pass
        commands = [["inspect", path],
                    ["run-module", path, f"--backend={backend}", "--timeout=2"],
                    ["check-module", path, f"--backend={backend}", "--timeout=2"]]
        if first is not None:
            commands.append(["benchmark-module", path, f"--function={first}",
                             f"--backend={backend}", "--benchmark_repetitions=1",
                             "--timeout=2"])
        for argv in commands:
            _run_and_check(argv)


def cli_inputs(data: bytes, timeout: float = 60.0) -> list[tuple[int, str]]:
    """Run ``hal-cpu run-module`` natively over ``data`` once per public
    function, with ``--input`` specs built from its signature (as
    :func:`inputs_for`: tensors of 1, dynamic sizes 3, scalars 3);
    ``[(exit status, stderr), ...]``. A file the module reader refuses
    runs once, without a function."""
    import re
    import subprocess
    import sys
    import tempfile

    from hal_cpu.programs.vm.module_def import read_module
    from hal_cpu.programs.vm.translate import parse_cconv
    out = []
    with tempfile.TemporaryDirectory(prefix="pkr-fuzz-cli-") as tmp:
        path = os.path.join(tmp, "case.vmfb")
        with open(path, "wb") as f:
            f.write(data)
        runs: list[list[str]] = []
        try:
            mdef = read_module(data, name="case.vmfb")
            for e in mdef.exports:
                if e.name in ("__init", "__deinit"):
                    continue
                args, _ = parse_cconv(e.cconv)
                decl = str(e.attrs.get("iree.abi.declaration", ""))
                tensors = re.findall(r"tensor<([0-9x?]*?)x?(i1|i8|i16|i32|i64|f16|f32|f64)>",
                                     decl)
                specs = []
                for ty in args:
                    if ty == "r" and tensors:
                        dims, elem = tensors.pop(0)
                        shape = "x".join("3" if d in ("", "?") else d
                                         for d in dims.split("x") if d)
                        specs.append(f"{shape}x{elem}=1" if shape else f"{elem}=1")
                    elif ty == "r":
                        specs.append("4xf32=1")
                    else:
                        specs.append("3")
                runs.append([f"--function={e.name}"] + [f"--input={s}" for s in specs])
        except Exception:  # noqa: BLE001 - the command says why
            runs = [[]]
        for extra in runs or [[]]:
            proc = subprocess.run(
                [sys.executable, "-m", "hal_cpu", "run-module", path, "--backend=native",
                 "--timeout=5", *extra], capture_output=True, text=True,
                errors="replace", timeout=timeout)
            out.append((proc.returncode, proc.stderr))
    return out


# --- plugin names (target ``names``) ------------------------------------------------------
#: The strings of the sample plugin that name it and its imports.
PLUGIN_STRINGS = (b"sample_standalone", b"sample_plugins/standalone_plugin.c",
                  b"simple_mul_workgroup", b"param_add_workgroup")


@dataclass
class PluginNames:
    """Where the sample plugin's name, description and import names lie
    (``strings``: ``(text, file offset)``) and the end of the region they
    share (``end``: a name may run over the strings after it up to there)."""
    name: str
    data: bytes
    strings: list = field(default_factory=list)
    end: int = 0

    @classmethod
    def build(cls, data: bytes, name: str) -> "PluginNames":
        m = cls(name, data)
        for text in PLUGIN_STRINGS:
            at = data.find(text + b"\0")
            if at >= 0:
                m.strings.append((text, at))
        m.end = max(at + len(text) for text, at in m.strings)
        return m


def plugin_seed_files(arches=ARCHES) -> list[tuple[str, str, Path]]:
    """``(seed name, arch, path)`` of the sample plugins for ``names``."""
    return [(f"plugin-names:sample_plugins/prebuilt/standalone_{a}.so", a,
             ROOT / "sample_plugins" / "prebuilt" / f"standalone_{a}.so") for a in arches]


def mutate_plugin_names(rng, m: PluginNames) -> list:
    """1 to 3 of the plugin's name, description and import names replaced
    in place (cut to the old length, or run over the strings after it up to
    the last one's end), each ending with its zero byte."""
    out = []
    for _ in range(rng.choice([1, 1, 2, 3])):
        text, at = rng.choice(m.strings)
        raw = _encode_name(rng)
        if rng.random() < 0.2:
            raw = (raw or b"a") * (m.end // max(1, len(raw)) + 1)
            room = m.end - at
        else:
            room = len(text)
        raw = raw[:room]
        out.append((f"plugin name {text.decode()} -> {raw[:40]!r} ({len(raw)} bytes)",
                    [("set", at, raw + b"\0")]))
    return out


def run_plugin_names(case, data, rep, opts):
    """A sample plugin whose name, description or import names were
    replaced: registered, its imports resolved (the names it had and the
    hostile ones), then ``hal-cpu inspect`` of it (with ``--resolve``); the
    first typed error is the outcome after every step ran."""

    from fatelf import PortableKernelError
    from hal_cpu.plugins import PluginManager
    backend = "native" if case["backend"] == "native" else "emulated"
    fd = os.memfd_create("case.so")
    os.write(fd, data)
    path = f"/proc/self/fd/{fd}"
    first = None
    rep.enter("resolve")
    names = [t.decode() for t in PLUGIN_STRINGS[2:]] + [n for n in NAMES if n][:6]
    try:
        with PluginManager(case["arch"], backend, timeout=CALL_LIMIT) as manager:
            manager.register_embedded(data)
            manager.resolve(["?" + n for n in names])
    except PortableKernelError as exc:
        rep.mark_failure()
        first = exc
    rep.enter("close")
    for argv in (["inspect", path], ["inspect", path, "--resolve=simple_mul_workgroup",
                                      "--timeout=2"]):
        _run_and_check(argv)
    os.close(fd)
    if first is not None:
        raise first


def _run_and_check(argv: list[str]) -> None:
    """``hal-cpu ARGV`` in this process, what it printed checked by
    :func:`_check_printed`."""
    import contextlib
    import io

    from hal_cpu.cli import main
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            status = main(argv)
        except SystemExit as exc:
            status = exc.code if isinstance(exc.code, int) else 2
    _check_printed(f"hal-cpu {argv[0]}", status, out.getvalue(), err.getvalue())


def _check_printed(what: str, status, text: str, errors: str) -> None:
    """A command's end as the printers promise: status 0 or 1, one line on
    stderr when 1 (or that line and the diagnosis of a native crash: the
    emulated rerun's fault report), no raw control character but
    newlines."""
    lines = errors.strip().splitlines()
    if status not in (0, 1):
        raise PrinterError(f"{what} ended with status {status}: {errors[-300:]!r}")
    diagnosis = len(lines) > 1 and lines[1].startswith("hal-cpu: running the program again")
    if status == 1 and len(lines) != 1 and not diagnosis:
        raise PrinterError(f"{what} failed with {len(lines)} lines on stderr: "
                           f"{errors[-300:]!r}")
    for stream, label in ((text, "stdout"), (errors, "stderr")):
        bad = sorted({c for c in stream if (ord(c) < 32 and c not in "\n")
                      or ord(c) == 0x7f or 0x80 <= ord(c) < 0xa0 or c in "\u202e\u202d"})
        if bad:
            raise PrinterError(f"{what} printed raw control characters {bad!r} on {label}")
