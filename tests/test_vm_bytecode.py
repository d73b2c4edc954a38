"""VM bytecode: the opcode table, the decoder and the translator.

* decoding every function of the project's programs (x86_64 and riscv32)
  gives the instructions, at the byte offsets, that
  ``iree-dump-module --output=disassembly --bytecode_offsets`` prints;
* malformed bytecode raises BytecodeError (a VmError), nothing else;
* translated functions of scalar host programs (tests/programs/vm/*.mlir)
  give what IREE's own runtime gives, on edge-case inputs;
* hand-assembled functions cover imports, variadic calls, refs, lists,
  buffers, globals and failures.
"""

from __future__ import annotations

import itertools
import math
import random
import re
import struct
import subprocess
from pathlib import Path

import pytest

from hal_cpu.programs import compile_many
from hal_cpu.programs.vm import isa
from hal_cpu.programs.vm.decode import BytecodeError, decode
from hal_cpu.programs.vm.module_def import FunctionDef, read_module
from hal_cpu.programs.vm.refs import VmBuffer, VmError, VmList, VmStatusError
from hal_cpu.programs.vm.translate import (
    BACKEDGE_HOOK,
    Env,
    UnsupportedOpError,
    parse_cconv,
    translate,
)

ROOT = Path(__file__).resolve().parent.parent
PROGRAMS = sorted(p for d in ("", "check", "host_modules")
                  for p in (ROOT / "tests" / "programs" / d).glob("*.mlir"))
VM_PROGRAMS = sorted((ROOT / "tests" / "programs" / "vm").glob("*.mlir"))
ARCHES = ("x86_64", "riscv32")
VM_FLAGS = ["--iree-input-demote-f64-to-f32=false"]


# ---------------------------------------------------------------------------
# helpers

@pytest.fixture(scope="module")
def project_vmfbs(compile_cache) -> dict:
    jobs = [(p, a) for p in PROGRAMS for a in ARCHES]
    done = compile_many(jobs, compile_cache, max_workers=2)
    return {(p.relative_to(ROOT / "tests" / "programs").as_posix(), a): c.vmfb
            for (p, a), c in zip(jobs, done)}


@pytest.fixture(scope="module")
def vm_vmfbs(compile_cache) -> dict:
    jobs = [(p, "x86_64") for p in VM_PROGRAMS]
    done = compile_many(jobs, compile_cache, max_workers=2, extra_flags=VM_FLAGS)
    return {p.stem: c.vmfb for p, c in zip(VM_PROGRAMS, done)}


def disassembly(path) -> list[tuple[str, list[tuple[int, str]]]]:
    """(function name, [(offset, op name)]) per function, in ordinal order."""
    out = subprocess.run(["iree-dump-module", "--output=disassembly",
                          "--bytecode_offsets", str(path)],
                         capture_output=True, text=True, check=True).stdout
    funcs, cur = [], None
    for line in out.splitlines():
        if line.startswith("vm.func @"):
            cur = []
            funcs.append((line[len("vm.func @"):].split("(")[0], cur))
            continue
        m = re.match(r"\[([0-9A-F]{8})\](\^bb\d+:|\s+(.*))$", line)
        if m and cur is not None:
            if m.group(2).startswith("^"):
                cur.append((int(m.group(1), 16), "vm.block"))
            else:
                name = re.search(r"\b(vm\.[\w.]+)", m.group(3)).group(1)
                cur.append((int(m.group(1), 16), name))
    return funcs


def load(path, imports=None, **env_kw):
    """Translate every function of a module; run its ``__init``."""
    mod = read_module(path)
    env = Env.for_module(mod, **env_kw)
    if imports is not None:
        env.imports[:] = imports
    env.functions[:] = [translate(f, mod.function_bytecode(f.ordinal), env,
                                  module_name=mod.name) for f in mod.functions]
    exports = {e.name: env.functions[e.function] for e in mod.exports}
    if "__init" in exports:
        exports["__init"]()
    return mod, env, exports


def f32(x: float) -> float:
    try:
        return struct.unpack("<f", struct.pack("<f", x))[0]
    except OverflowError:
        return math.copysign(math.inf, x)


def same(a, b) -> bool:
    """Equal values; floats bit for bit (any NaN equals any NaN)."""
    if isinstance(a, tuple) or isinstance(b, tuple):
        a = a if isinstance(a, tuple) else (a,)
        b = b if isinstance(b, tuple) else (b,)
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, float) or isinstance(b, float):
        a, b = float(a), float(b)
        if a != a and b != b:
            return True
        return struct.pack("<d", a) == struct.pack("<d", b)
    return int(a) == int(b)


I32 = [0, 1, -1, 2, 7, -7, 31, 32, 33, 255, -129, 0x7FFF, 2**31 - 1, -2**31,
       0x55555555, -123456789]
I64 = [0, 1, -1, 2, 63, 64, 65, 2**31, -2**31 - 1, 2**32, -2**32 + 1, 2**63 - 1,
       -2**63, 0x5555555555555555, 123456789012345]
F64 = [0.0, -0.0, 1.0, -1.5, 2.5, 0.5, -0.5, 3.5, -2.5, 1.1, 7.0, 1e-40, 1e-310,
       3.4e38, -3.4e38, 1e300, math.inf, -math.inf, math.nan, 1e10, -2.5e9,
       3e9, 123456.7, 2.0**63, 2.0**64, -2.0**63, 0.49999997]
F32 = sorted({f32(x) for x in F64 if not (x != x)}) + [math.nan]
VALUES = {"i": I32, "I": I64, "f": F32, "F": F64}


def inputs(cconv: str, limit: int = 400, seed: int = 1):
    args, _ = parse_cconv(cconv)
    pools = [VALUES[a] for a in args]
    combos = list(itertools.product(*pools))
    if len(combos) > limit:
        combos = random.Random(seed).sample(combos, limit)
    return combos


# ---------------------------------------------------------------------------
# the opcode table

def test_isa_table():
    assert isa.BY_NAME["add.i32"].opcode == 34
    assert isa.BY_NAME["call.variadic.yieldable"].opcode == 136
    assert isa.BY_NAME["add.f32"].opset == isa.EXT_F32
    assert isa.BY_NAME["round.f64.even"].opcode == 63
    assert isa.PREFIXES == {0xE0: isa.EXT_F32, 0xE1: isa.EXT_F64}
    assert len(isa.OPS[isa.CORE]) == 137 and len(isa.OPS[isa.EXT_F32]) == 62
    assert len(isa.OPS[isa.EXT_F64]) == 64
    for table in isa.OPS.values():
        for op in table.values():
            for f in op.fields:
                assert f.kind in isa.FIELD_SIZES or f.kind in (
                    "str", "regs", "sizes", "remap", "cases"), (op.name, f)


# ---------------------------------------------------------------------------
# decoding real programs

@pytest.mark.parametrize("arch", ARCHES)
@pytest.mark.parametrize("program", [p.relative_to(ROOT / "tests" / "programs").as_posix()
                                     for p in PROGRAMS])
def test_decode_matches_disassembly(project_vmfbs, program, arch):
    path = project_vmfbs[(program, arch)]
    mod = read_module(path)
    expected = disassembly(path)
    assert len(expected) == len(mod.functions)
    env = Env.for_module(mod)
    for (name, ops), fn in zip(expected, mod.functions):
        got = decode(mod.function_bytecode(fn.ordinal), function=fn.name,
                     i32_count=fn.i32_register_count, ref_count=fn.ref_register_count)
        assert [(i.offset, i.name) for i in got] == ops, name
        # every op of every program translates
        translate(fn, mod.function_bytecode(fn.ordinal), env, module_name=mod.name)


# ---------------------------------------------------------------------------
# malformed bytecode

def _fn(i32=8, ref=4, cconv="0v_v", name="f", ordinal=0):
    return FunctionDef(ordinal=ordinal, name=name, cconv=cconv, bytecode_offset=0,
                       bytecode_length=0, i32_register_count=i32,
                       ref_register_count=ref, requirements=0, block_count=1)


def asm(*ops) -> bytes:
    """Assemble (mnemonic, *field values) tuples; ``block`` markers included.
    Branch targets are block numbers, replaced by their offsets."""
    out = bytearray()
    blocks, fixups = [], []
    for mnemonic, *args in ops:
        op = isa.BY_NAME[mnemonic]
        if op.opset != isa.CORE:
            out.append({v: k for k, v in isa.PREFIXES.items()}[op.opset])
        if mnemonic == "block":
            blocks.append(len(out))
        out.append(op.opcode)
        assert len(args) == len(op.fields), mnemonic
        for f, v in zip(op.fields, args):
            k = f.kind
            if k in ("i32", "i64", "f32", "f64", "ref", "u16"):
                out += struct.pack("<H", v)
            elif k in ("c_i32",):
                out += struct.pack("<i", v)
            elif k == "c_i64":
                out += struct.pack("<q", v)
            elif k == "c_f32":
                out += struct.pack("<f", v)
            elif k == "c_f64":
                out += struct.pack("<d", v)
            elif k == "target":
                fixups.append((len(out), v))
                out += b"\0\0\0\0"
            elif k in ("func", "global", "rodata", "type"):
                out += struct.pack("<I", v)
            elif k == "str":
                b = v.encode()
                out += struct.pack("<H", len(b)) + b
            elif k in ("regs", "sizes", "remap"):
                if len(out) & 1:
                    out.append(0)
                flat = [x for p in v for x in p] if k == "remap" else list(v)
                out += struct.pack(f"<H{len(flat)}H", len(v), *flat)
            elif k == "cases":
                for target, pairs in v:
                    fixups.append((len(out), target))
                    out += b"\0\0\0\0"
                    if len(out) & 1:
                        out.append(0)
                    flat = [x for p in pairs for x in p]
                    out += struct.pack(f"<H{len(flat)}H", len(pairs), *flat)
            else:
                raise AssertionError(k)
    for at, block in fixups:
        struct.pack_into("<I", out, at, blocks[block])
    return bytes(out)


R = isa.REF_BIT
MOVE = isa.MOVE_BIT


def test_decode_errors_name_function_offset_value():
    with pytest.raises(BytecodeError) as e:
        decode(bytes([121, 13, 1, 0]), function="mod.f")
    assert e.value.function == "mod.f" and e.value.offset == 2
    assert "truncated" in str(e.value)
    with pytest.raises(BytecodeError) as e:
        decode(bytes([121, 200]), function="mod.f")
    assert e.value.offset == 1 and e.value.value == 200 and "0xC8" in str(e.value)
    with pytest.raises(BytecodeError) as e:
        decode(bytes([121, 0xE0, 250]), function="mod.f")
    assert e.value.value == 250 and "ext_f32" in str(e.value)
    with pytest.raises(BytecodeError) as e:
        decode(asm(("block",), ("const.i32", 5, 9), ("return", ())), i32_count=8)
    assert e.value.value == 9
    with pytest.raises(BytecodeError) as e:
        decode(asm(("block",), ("const.ref.zero", R | 4), ("return", ())), ref_count=4)
    with pytest.raises(BytecodeError):   # ref register without its ref bit
        decode(asm(("block",), ("const.ref.zero", 1), ("return", ())))
    with pytest.raises(BytecodeError):   # an i64 in the last register
        decode(asm(("block",), ("const.i64.zero", 7), ("return", ())), i32_count=8)
    bad_target = bytearray(asm(("block",), ("br", 0, ())))
    struct.pack_into("<I", bad_target, 2, 1)
    with pytest.raises(BytecodeError) as e:
        decode(bytes(bad_target))
    assert "not a block" in str(e.value)
    with pytest.raises(BytecodeError):
        decode(bytes([13, 0, 0, 0, 0, 0, 0]))  # no block marker first
    assert issubclass(BytecodeError, VmError)


def test_malformed_bytecode_never_escapes_as_other_errors(project_vmfbs):
    mod = read_module(project_vmfbs[("matmul.mlir", "x86_64")])
    env = Env.for_module(mod)
    rng = random.Random(7)
    for fn in mod.functions:
        code = bytes(mod.function_bytecode(fn.ordinal))
        cases = [code[:n] for n in range(len(code))]
        for _ in range(300):
            b = bytearray(code)
            for _ in range(rng.randint(1, 4)):
                b[rng.randrange(len(b))] = rng.randrange(256)
            cases.append(bytes(b))
        for case in cases:
            try:
                translate(fn, case, env, module_name=mod.name)
            except VmError:
                pass


# ---------------------------------------------------------------------------
# translated programs against IREE's runtime

def _iree_module(path):
    rt = pytest.importorskip("iree.runtime")
    return rt.load_vm_flatbuffer_file(str(path), driver="local-task")


def _skip(name, args) -> bool:
    """Inputs whose result IREE's C code leaves undefined (the x86 runtime
    traps on them)."""
    if name.startswith("div_"):
        a, b = args
        lo = -2**31 if name == "div_i32" else -2**63
        return b == 0 or (a == lo and b == -1)
    return False


@pytest.mark.parametrize("program", ["int_ops", "float_ops"])
def test_scalar_ops_match_iree(vm_vmfbs, program):
    path = vm_vmfbs[program]
    theirs = _iree_module(path)
    mod, env, ours = load(path)
    checked = 0
    for export in mod.exports:
        if export.name.startswith("__"):
            continue
        for args in inputs(export.cconv):
            if _skip(export.name, args):
                continue
            want = getattr(theirs, export.name)(*args)
            got = ours[export.name](*args)
            assert same(got, want), (export.name, args, got, want)
            checked += 1
    assert checked > 1000


def test_division_by_zero_and_overflow():
    # hand-made: IREE's runtime traps on these inputs
    code = asm(("block",), ("div.i32.s", 0, 1, 2), ("rem.i32.s", 0, 1, 3),
               ("return", (2, 3)))
    fn = translate(_fn(cconv="0ii_ii"), code, Env())
    assert fn(-2**31, -1) == (-2**31, 0)
    assert fn(-7, 2) == (-3, -1)
    assert fn(7, -2) == (-3, 1)
    with pytest.raises(VmStatusError) as e:
        fn(1, 0)
    assert e.value.code == 3
    code = asm(("block",), ("div.i64.u", 0, 2, 4), ("rem.i64.u", 0, 2, 6),
               ("return", (4, 6)))
    fn = translate(_fn(cconv="0II_II"), code, Env())
    assert fn(-1, 3) == (6148914691236517205, 0)
    with pytest.raises(VmStatusError):
        fn(5, 0)


def test_control_flow_matches_iree(vm_vmfbs):
    path = vm_vmfbs["control"]
    theirs = _iree_module(path)
    mod, env, ours = load(path)
    for a, b in [(48, 18), (17, 5), (2**62, 6), (-12, 8), (0, 9), (7, 0)]:
        assert ours["gcd"](a, b) == theirs.gcd(a, b)
    for x, k in [(3, 5), (2**33, 7), (-1, 2**30)]:
        assert same(ours["calls"](x, k), theirs.calls(x, k))
    for n in [1, 2, 3, 7, 27, 97, 871]:
        assert ours["collatz"](n) == theirs.collatz(n)
    for n in [0, 1, 5, 30]:
        assert same(ours["nested"](n), theirs.nested(n))
    for x in [5, -7, 2**40, 2**63 - 1]:
        assert same(ours["bump"](x), theirs.bump(x))
    for x in range(-2, 8):
        assert ours["switch"](x) == theirs.switch(x)
    assert ours["checked"](21) == theirs.checked(21) == 42
    with pytest.raises(VmStatusError) as e:
        ours["checked"](-1)
    assert e.value.code == 9 and e.value.message == "x must not be negative"


def test_branch_operands_are_one_parallel_copy(vm_vmfbs):
    # swap_loop's entry branch copies an i64 out of registers that the same
    # list overwrites with other values before: read in order, the loop
    # counter would be garbage (IREE's runtime, which copies one by one,
    # returns the inputs unchanged)
    mod, env, ours = load(vm_vmfbs["control"])
    for n in [0, 1, 2, 3, 9]:
        a, b, f, k = 1, 2, 1.0, n
        for _ in range(n):
            a, b, f, k = b, a + b, f32(f32(f * 0.5) + f), k ^ n
        assert ours["swap_loop"](n, 1, 2, 1.0) == (a, b, f, k)


def test_refs_match_iree(vm_vmfbs):
    path = vm_vmfbs["refs"]
    theirs = _iree_module(path)
    mod, env, ours = load(path)
    for n in [0, 1, 5, 100]:
        assert ours["list_sum"](n) == theirs.list_sum(n)
    for a, b, f in [(-5, 2**40 + 3, 1.5), (2**31 - 1, -1, math.inf), (0x1234, 0, -0.0)]:
        assert same(ours["buffer_ops"](a, b, f), theirs.buffer_ops(a, b, f))


def test_straight_line_functions_have_no_loop(vm_vmfbs):
    mod, env, ours = load(vm_vmfbs["int_ops"])
    assert "while" not in ours["mixed"].vm_source
    mod, env, ours = load(vm_vmfbs["control"])
    assert "while True:" in ours["collatz"].vm_source


def test_backedge_hook_sees_every_loop_iteration(vm_vmfbs):
    mod, env, ours = load(vm_vmfbs["control"])
    seen = []

    class Stop(Exception):
        pass

    def hook():
        seen.append(1)
        if len(seen) > 50:
            raise Stop
    BACKEDGE_HOOK[0] = hook
    try:
        assert ours["collatz"](6) == 8
        assert len(seen) == 8
        with pytest.raises(Stop):
            ours["collatz"](27)
    finally:
        BACKEDGE_HOOK[0] = None


# ---------------------------------------------------------------------------
# hand-assembled functions

def test_import_calls_variadic_segments_and_resolution():
    calls = []

    def plain(a, b, r):
        calls.append(("plain", a, b, r))
        return a + b, r

    def variadic(r, seg, i):
        calls.append(("variadic", r, seg, i))
        return len(seg)

    env = Env(imports=[plain, variadic, None],
              import_cconvs=["0iIr_Ir", "0rCiIDi_i", "0v_v"],
              import_names=["m.plain", "m.variadic", "m.missing"])
    assert parse_cconv("0rCiID_i") == (["r", ("i", "I")], ["i"])
    # arguments: i0, i2:3, i4, r0 (the cconv places them)
    code = asm(("block",),
               ("call", isa.IMPORT_BIT | 0, (0, 2, R | 0), (6, R | 1)),
               ("call.variadic", isa.IMPORT_BIT | 1, (0xFFFF, 2, 0xFFFF),
                (R | 1, 4, 2, 0, 6, 4), (8,)),
               ("import.resolved", isa.IMPORT_BIT | 1, 9),
               ("import.resolved", isa.IMPORT_BIT | 2, 1),
               ("return", (6, 8, 9, 1, R | 1)))
    fn = translate(_fn(cconv="0iIir_Iiiir", i32=10), code, env)
    obj = object()
    assert fn(5, 2**40, 9, obj) == (5 + 2**40, 2, 1, 0, obj)
    assert calls[0] == ("plain", 5, 2**40, obj)
    assert calls[1] == ("variadic", obj, ((9, 2**40), (5, 5 + 2**40)), 9)
    # an unresolved import raises NOT_FOUND when called
    code = asm(("block",), ("call", isa.IMPORT_BIT | 2, (), ()), ("return", ()))
    with pytest.raises(VmStatusError) as e:
        translate(_fn(), code, env)()
    assert e.value.code == 5 and "m.missing" in e.value.message


def test_internal_calls_and_yieldable_calls():
    env = Env()
    callee = asm(("block",), ("add.i64", 0, 0, 4), ("add.i32", 2, 2, 6),
                 ("return", (4, 6)))
    # i64 at i0:1, i32 at i2
    env.functions.append(translate(_fn(cconv="0Ii_Ii", ordinal=0), callee, env))
    caller = asm(("block",),
                 ("call", 0, (0, 2), (4, 6)),
                 ("call.yieldable", 0, (4, 6), 1, (4, 6)),
                 ("block",),
                 ("return", (4, 6)))
    env.functions.append(translate(_fn(cconv="0Ii_Ii", ordinal=1), caller, env))
    assert env.functions[1](3, 5) == (12, 20)


def test_refs_lists_buffers_globals():
    rodata = VmBuffer(b"\x01\x02\x03\x04\x05\x06\x07\x08", readonly=True)
    env = Env(rodata=[rodata], global_bytes=bytearray(16), global_refs=[None, None],
              types=["i32", "!vm.buffer", "!vm.list<i32>", "!hal.buffer"])
    code = asm(("block",),
               ("const.ref.rodata", 0, R | 0),
               ("const.i64", 2, 2),                      # offset 2
               ("buffer.load.i16.u", R | 0, 2, 4),      # 0x0605
               ("global.store.i32", 4, 4),
               ("global.load.i32", 4, 5),
               ("global.store.ref", 1, 1, R | 0),
               ("global.load.ref", 1, 1, R | 1),
               ("cmp.eq.ref", R | 0, R | 1, 6),
               ("cast.any.ref", R | 1, 1, R | 2),
               ("const.i32", 3, 7),
               ("list.alloc", 2, 7, R | 3),
               ("list.resize", R | 3, 7),
               ("list.set.i32", R | 3, 6, 5),
               ("list.size", R | 3, 8),
               ("list.get.i32", R | 3, 6, 9),
               ("switch.i32", 6, 4, (5, 8, 9), 10),
               ("discard.refs", (R | MOVE | 2,)),
               ("cmp.nz.ref", R | 2, 11),
               ("return", (5, 6, 8, 9, 10, 11)))
    fn = translate(_fn(i32=12, cconv="0v_iiiiii"), code, env)
    assert fn() == (0x0605, 1, 3, 0x0605, 3, 0)
    assert env.global_bytes[4:8] == struct.pack("<i", 0x0605)
    assert env.global_refs[1] is rodata
    # a read-only buffer cannot be stored to; out of bounds loads fail
    code = asm(("block",), ("const.ref.rodata", 0, R | 0), ("const.i64", 8, 0),
               ("buffer.load.i8.u", R | 0, 0, 2), ("return", (2,)))
    with pytest.raises(VmStatusError) as e:
        translate(_fn(cconv="0v_i"), code, env)()
    assert e.value.code == 11
    code = asm(("block",), ("const.ref.rodata", 0, R | 0), ("const.i64.zero", 0),
               ("const.i32", 1, 2), ("buffer.store.i8", R | 0, 0, 2), ("return", ()))
    with pytest.raises(VmStatusError) as e:
        translate(_fn(), code, env)()
    assert e.value.code == 7
    # cast.any.ref checks the type
    code = asm(("block",), ("const.ref.rodata", 0, R | 0),
               ("cast.any.ref", R | 0, 3, R | 1), ("return", ()))
    with pytest.raises(VmStatusError) as e:
        translate(_fn(), code, env)()
    assert e.value.code == 3
    # buffers made by the program: alloc, fill, copy, compare, clone
    code = asm(("block",),
               ("const.i64", 8, 0), ("const.i32", 8, 2),
               ("buffer.alloc", 0, 2, R | 0),
               ("const.i64.zero", 4), ("const.i64", 2, 6), ("const.i32", -1, 3),
               ("buffer.fill.i16", R | 0, 4, 6, 3),
               ("buffer.clone", R | 0, 4, 0, 2, R | 1),
               ("buffer.compare", R | 0, 4, R | 1, 4, 0, 8),
               ("buffer.length", R | 1, 10),
               ("buffer.load.i32", R | 1, 4, 9),
               ("return", (8, 10, 9, R | 0)))
    fn = translate(_fn(cconv="0v_iIir", i32=12), code, env)
    eq, length, word, buf = fn()
    assert (eq, length, word) == (1, 8, -1) and buf.bytes() == b"\xff" * 4 + b"\0" * 4
    assert isinstance(VmList("i32"), list)


def test_registers_read_before_written_start_at_zero():
    code = asm(("block",), ("cond_br", 0, 1, (), 2, ()),
               ("block",), ("const.i32", 5, 1), ("br", 2, ((1, 2), (R | 1, R | 0))),
               ("block",), ("return", (1, 2, 3, R | 0)))
    fn = translate(_fn(cconv="0i_iiir"), code, Env())
    assert fn(1) == (5, 5, 0, None)
    assert fn(0) == (0, 0, 0, None)
    with pytest.raises(BytecodeError):
        env = Env(functions=[None])
        translate(_fn(), asm(("block",), ("call", 3, (), ()), ("return", ())), env)


def test_br_table_and_fail_location():
    env = Env(locate=lambda ordinal, offset: f"prog.mlir:{ordinal}:{offset}")
    code = asm(("block",),
               ("br_table", 0, 3, ((1, 2),), 2, ((1, ((1, 2),)), (2, ()))),
               ("block",), ("return", (2,)),
               ("block",), ("const.i32", 3, 2), ("fail", 2, "case two"),
               ("block",), ("const.i32", 99, 2), ("return", (2,)))
    fn = translate(_fn(cconv="0ii_i", ordinal=4), code, env)
    assert fn(0, 7) == 7
    assert fn(5, 7) == 99
    with pytest.raises(VmStatusError) as e:
        fn(1, 7)
    assert e.value.code == 3 and e.value.message == "case two"
    assert e.value.location.startswith("prog.mlir:4:")
    assert "prog.mlir:4:" in str(e.value)


def test_unsupported_op_raises_at_translate_time():
    env = Env(locate=lambda ordinal, offset: "prog.mlir:7:3")
    env.functions.append(None)
    # variadic calls go to imports only
    code = asm(("block",), ("const.i32.zero", 0),
               ("call.variadic", 0, (1,), (0,), ()), ("return", ()))
    with pytest.raises(UnsupportedOpError) as e:
        translate(_fn(), code, env, module_name="m")
    assert e.value.op == "vm.call.variadic" and e.value.location == "prog.mlir:7:3"
    assert "m.f" in str(e.value) and "prog.mlir:7:3" in str(e.value)
    assert e.value.offset == 4


def _dummy_args(op):
    out = []
    for f in op.fields:
        k = f.kind
        out.append(2 if k in ("i32", "f32") else 4 if k in ("i64", "f64") else
                   R | 1 if k == "ref" else 1 if k.startswith("c_") or k == "target" else
                   isa.IMPORT_BIT if k == "func" else "x" if k == "str" else
                   () if k in ("regs", "remap", "sizes", "cases") else 0)
    return out


def test_every_op_translates():
    env = Env(rodata=[VmBuffer(b"")], global_bytes=bytearray(64), global_refs=[None],
              types=["i32"], imports=[lambda *a: None], import_cconvs=["0v_v"])
    for name, op in isa.BY_NAME.items():
        if name == "block":
            continue
        code = asm(("block",), (name, *_dummy_args(op)), ("block",), ("return", ()))
        translate(_fn(), code, env)


def test_buffer_hash_is_siphash_2_4():
    env = Env(rodata=[VmBuffer(bytes(range(64)))])
    code = asm(("block",), ("const.ref.rodata", 0, R | 0), ("const.i64.zero", 2),
               ("buffer.hash", R | 0, 2, 0, 4), ("return", (4,)))
    fn = translate(_fn(cconv="0I_I"), code, env)
    # SipHash-2-4 reference vectors (key 00..0f, message 00 01 .. n-1)
    assert fn(0) & 0xFFFFFFFFFFFFFFFF == 0x726FDB47DD0E0E31
    assert fn(8) & 0xFFFFFFFFFFFFFFFF == 0x93F5F5799A932462
    assert fn(63) & 0xFFFFFFFFFFFFFFFF == 0x958A324CEB064572
