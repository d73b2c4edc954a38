"""Hostile ``.vmfb`` files: the VM stays bounded and total, and a native
dispatch reads nothing outside its buffers.

Each case compiles a real program with the pinned ``iree-compile``, edits
the file (a workgroup count, a binding offset and length, function names,
a bytecode operand, allocation sizes) and runs it through
:func:`hal_cpu.programs.vm.load_program` and ``hal-cpu run-module``, natively and
emulated. Every edit ends in a typed error, or, for a kernel made to run
past its buffers natively, in a fault of the process running it: never in
data read from outside a buffer, a Python traceback, or unbounded memory.
"""

from __future__ import annotations

import os
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from fatelf import arches
from hal_cpu.errors import BindingOverrunError
from hal_cpu.programs import compile_program
from hal_cpu.programs.vm import VmStatusError, isa, load_program
from hal_cpu.programs.vm.decode import BytecodeError, decode
from hal_cpu.programs.vm.module_def import read_module

HOST = arches.host_arch()
N = 65536

ADD = """
func.func @add(%a: tensor<65536xf32>, %b: tensor<65536xf32>) -> tensor<65536xf32> {
  %0 = arith.addf %a, %b : tensor<65536xf32>
  return %0 : tensor<65536xf32>
}
"""

HOST_CODE = """
func.func @alloc(%n: i64) -> i64 {
  %nn = arith.index_cast %n : i64 to index
  %buf = util.buffer.alloc uninitialized : !util.buffer{%nn}
  %s = util.buffer.size %buf : !util.buffer
  %r = arith.index_cast %s : index to i64
  return %r : i64
}
func.func @resize(%n: i64) -> i64 {
  %nn = arith.index_cast %n : i64 to index
  %list = util.list.create %nn : !util.list<i32>
  util.list.resize %list, %nn : !util.list<i32>
  %size = util.list.size %list : !util.list<i32>
  %r = arith.index_cast %size : index to i64
  return %r : i64
}
func.func @hoard(%n: i64, %each: i64) -> i64 {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %nn = arith.index_cast %n : i64 to index
  %ee = arith.index_cast %each : i64 to index
  %list = util.list.create %nn : !util.list<?>
  util.list.resize %list, %nn : !util.list<?>
  scf.for %i = %c0 to %nn step %c1 {
    %b = util.buffer.alloc uninitialized : !util.buffer{%ee}
    util.list.set %list[%i], %b : !util.buffer -> !util.list<?>
  }
  %size = util.list.size %list : !util.list<?>
  %r = arith.index_cast %size : index to i64
  return %r : i64
}
func.func @mixed(%x: f32, %i: i32) -> i32 {
  %y = arith.fptosi %x : f32 to i32
  %z = arith.andi %y, %i : i32
  return %z : i32
}
func.func @aaaaa(%x: i32) -> i32 {
  %y = arith.addi %x, %x : i32
  return %y : i32
}
func.func @bbbbb(%x: i32) -> i32 {
  %y = arith.muli %x, %x : i32
  return %y : i32
}
func.func @ccccc(%x: i32) -> i32 {
  %y = arith.subi %x, %x : i32
  return %y : i32
}
func.func @ddddd(%x: i32) -> i32 {
  %y = arith.xori %x, %x : i32
  return %y : i32
}
"""


def _compile(cache: Path, name: str, text: str, arch: str) -> bytes:
    src = cache / "hostile" / f"{name}.mlir"
    src.parent.mkdir(parents=True, exist_ok=True)
    if not src.exists() or src.read_text() != text:
        src.write_text(text)
    return Path(compile_program(src, arch, cache).vmfb).read_bytes()


@pytest.fixture(scope="module")
def add_x86(compile_cache) -> bytes:
    return _compile(compile_cache, "add65536", ADD, "x86_64")


@pytest.fixture(scope="module")
def host_code(compile_cache) -> bytes:
    return _compile(compile_cache, "host_code_hostile", HOST_CODE, HOST or "x86_64")


# ---------------------------------------------------------------------------
# editing a module: bytecode fields found through the decoder


def _functions(data: bytes):
    """(definition, file offset of its bytecode, instructions) per function."""
    mdef = read_module(data, name="seed")
    out = []
    for f in mdef.functions:
        raw = bytes(mdef.function_bytecode(f.ordinal))
        start = data.find(raw)
        unique = start > 0 and data.find(raw, start + 1) < 0
        out.append((f, start if unique else None, decode(raw)))
    return out


def _field_positions(raw: bytes, ins) -> list[tuple[str, int, object]]:
    """(kind, offset within the function, value) of each register, immediate
    and register-list element of ``ins`` (as the decoder reads them)."""
    pc = ins.offset + (2 if ins.op.opset != isa.CORE else 1)
    out = []
    for field, arg in zip(ins.op.fields, ins.args):
        kind = field.kind
        if kind in isa.FIELD_SIZES:
            out.append((kind, pc, arg))
            pc += isa.FIELD_SIZES[kind]
        elif kind in ("regs", "sizes"):
            pc += pc & 1
            count = struct.unpack_from("<H", raw, pc)[0]
            for k in range(count):
                out.append((kind, pc + 2 + 2 * k, arg[k]))
            pc += 2 + 2 * count
        else:
            raise AssertionError(f"{kind} not needed here")
    return out


def _find(data: bytes, fname: str, op: str, n: int = 0):
    """(function bytecode file offset, raw bytes, the n-th ``op`` of
    function ``fname``)."""
    for f, start, instrs in _functions(data):
        if f.name == fname:
            assert start is not None, f"{fname}: its bytecode is not unique"
            raw = data[start:start + instrs[-1].end]
            found = [i for i in instrs if i.op.name == op]
            return start, raw, found[n]
    raise AssertionError(fname)


def _dispatch_call(data: bytes):
    """(function bytecode file offset, raw bytes, instructions, the
    ``hal.command_buffer.dispatch`` call) of the function recording the
    add's dispatch."""
    mdef = read_module(data, name="seed")
    for f, start, instrs in _functions(data):
        for ins in instrs:
            if ins.op.name == "call.variadic" and ins.args[0] & isa.IMPORT_BIT:
                imp = mdef.imports[ins.args[0] & ~isa.IMPORT_BIT]
                if imp.name == "hal.command_buffer.dispatch":
                    assert start is not None
                    return start, data[start:start + instrs[-1].end], instrs, ins
    raise AssertionError("no dispatch")


def _run_module(path: Path, *args: str, timeout: float = 300):
    return subprocess.run([sys.executable, "-m", "hal_cpu", "run-module",
                           f"--module={path}", *args], capture_output=True,
                          text=True, timeout=timeout)


# ---------------------------------------------------------------------------
# workgroup counts and binding ranges


def _workgroups(data: bytes, count: int) -> bytes:
    """``data`` with the add's dispatch given ``count`` workgroups (of 4096
    elements) instead of 16 (the ``vm.const.i32`` feeding x)."""
    start, raw, instrs, call = _dispatch_call(data)
    x_reg = call.args[2][3]            # (cb, executable, ordinal, x, y, z, ...)
    for ins in instrs:
        if ins.op.name == "const.i32" and ins.args[1] == x_reg:
            assert ins.args[0] == 16
            out = bytearray(data)
            struct.pack_into("<i", out, start + ins.offset + 1, count)
            return bytes(out)
    raise AssertionError("no workgroup count constant")


def _lengths(data: bytes, value: int, offset_too: bool = False) -> bytes:
    """``data`` with the add's three bindings ``value`` bytes long (the
    ``vm.const.i64`` of 262144 feeding their lengths); ``offset_too``: the
    first binding also starts ``value`` bytes into its buffer (its offset
    register pointed at the same constant)."""
    start, raw, instrs, call = _dispatch_call(data)
    out = bytearray(data)
    for ins in instrs:
        if ins.op.name == "const.i64" and ins.args[0] == 4 * N:
            struct.pack_into("<q", out, start + ins.offset + 1, value)
            reg = ins.args[1]
    if offset_too:
        regs = [p for p in _field_positions(raw, call) if p[0] == "regs"]
        # operands: cb, executable, ordinal, x, y, z, flags, then three
        # bindings of (ordinal, slot, buffer, offset, length)
        first = len(call.args[2]) - 15
        assert call.args[2][first + 4] == reg
        struct.pack_into("<H", out, start + regs[first + 3][1], reg)
    return bytes(out)


@pytest.mark.skipif(HOST != "x86_64", reason="the edited module is x86_64 code")
@pytest.mark.parametrize("count", [17, 64])
def test_workgroups_past_the_buffers_fault_natively(add_x86, tmp_path, count):
    """More workgroups than the buffers hold: natively the kernel runs into
    the guard page after a buffer and the process running it dies of
    SIGSEGV (hal-cpu's child: one error line); it never exits 0 and never
    prints data read from outside a buffer."""
    path = tmp_path / f"wg{count}.vmfb"
    path.write_bytes(_workgroups(add_x86, count))
    proc = _run_module(path, "--function=add", f"--input={N}xf32=1",
                       f"--input={N}xf32=2")
    assert proc.returncode != 0, proc.stdout[-300:]
    assert "65536xf32" not in proc.stdout
    assert "Traceback" not in proc.stderr
    # load_program in a process of its own: the fault ends it (SIGSEGV),
    # no result comes back
    probe = ("import sys, numpy as np\n"
             "from hal_cpu.programs.vm import load_program\n"
             "p = load_program(sys.argv[1], backend='native')\n"
             "r = p('add', np.ones(65536, np.float32), np.ones(65536, np.float32))\n"
             "print('RETURNED', r[0][:4])\n")
    run = subprocess.run([sys.executable, "-c", probe, str(path)],
                         capture_output=True, text=True, timeout=300)
    assert "RETURNED" not in run.stdout
    assert run.returncode == -11, (run.returncode, run.stderr[-500:])


@pytest.mark.parametrize("count", [17, 64])
def test_workgroups_past_the_buffers_are_a_fault_report_emulated(add_x86, tmp_path,
                                                                  count):
    path = tmp_path / f"wg{count}.vmfb"
    path.write_bytes(_workgroups(add_x86, count))
    with pytest.raises(BindingOverrunError) as err:
        with load_program(path, backend="emulated") as prog:
            prog("add", np.ones(N, np.float32), np.ones(N, np.float32))
    assert "past the end, guard page" in str(err.value)
    proc = _run_module(path, "--backend=emulated", "--function=add",
                       f"--input={N}xf32=1", f"--input={N}xf32=2")
    assert proc.returncode == 1 and len(proc.stderr.strip().splitlines()) >= 1
    assert "Traceback" not in proc.stderr and "65536xf32" not in proc.stdout


@pytest.mark.skipif(HOST != "x86_64", reason="the edited module is x86_64 code")
def test_binding_reaching_past_its_slot_is_refused(add_x86, tmp_path):
    """A binding whose offset + length pass its binding-table slot: refused
    at submission (OUT_OF_RANGE), before the kernel runs, on both backends."""
    path = tmp_path / "reach.vmfb"
    path.write_bytes(_lengths(add_x86, 4 * N + 4096))
    for backend in ("native", "emulated"):
        with pytest.raises(VmStatusError) as err:
            with load_program(path, backend=backend) as prog:
                prog("add", np.ones(N, np.float32), np.ones(N, np.float32))
        assert err.value.code == 11 and "binding table slot" in str(err.value)


@pytest.mark.skipif(HOST != "x86_64", reason="the edited module is x86_64 code")
def test_binding_offset_and_length_edited_fault_at_the_guard(add_x86, tmp_path):
    """Bindings 4096 bytes long, the first 4096 bytes into its buffer
    (within its slot, as IREE checks): the kernel still reads 65536
    elements, 1024 past the first input's end. Before, run-module exited
    0 with 1024 elements of host memory in the result; now the read hits
    the guard page natively, and emulated it is a fault report."""
    path = tmp_path / "offset.vmfb"
    path.write_bytes(_lengths(add_x86, 4096, offset_too=True))
    proc = _run_module(path, "--function=add", f"--input={N}xf32=1",
                       f"--input={N}xf32=2")
    assert proc.returncode != 0 and "65536xf32" not in proc.stdout
    assert "Traceback" not in proc.stderr
    proc = _run_module(path, "--backend=emulated", "--function=add",
                       f"--input={N}xf32=1", f"--input={N}xf32=2")
    assert proc.returncode == 1 and "65536xf32" not in proc.stdout
    assert "Traceback" not in proc.stderr


def test_buffers_end_before_a_guard_page():
    """Every HAL buffer's storage ends fewer than 64 bytes before an
    inaccessible page (read here through /proc/self/maps)."""
    from hal_cpu.programs.vm.hal_module import HalModule
    maps = Path("/proc/self/maps")
    if not maps.exists():
        pytest.skip("no /proc")
    with HalModule(arch=HOST or "x86_64") as hal:
        bufs = [hal.wrap_input(np.ones(n, np.uint8)) for n in (1, 63, 64, 4096, 5000,
                                                               1 << 20)]
        table = []
        for line in maps.read_text().splitlines():
            span, perms = line.split()[:2]
            lo, hi = (int(x, 16) for x in span.split("-"))
            table.append((lo, hi, perms))
        for view in bufs:
            buf = view.buffer
            end = buf.address + buf.length
            assert buf.address % 64 == 0
            guard = -(-end // 4096) * 4096
            assert guard - end < 64
            row = next(r for r in table if r[0] <= guard < r[1])
            assert row[2].startswith("---"), (hex(guard), row)


# ---------------------------------------------------------------------------
# names


HOSTILE_NAMES = ["f²xy", "fⅠx", "ﬁxy", "ab\0cd"]


def test_hostile_function_names_are_data(host_code):
    """Names Python rejects or normalizes (superscripts, letter numbers, a
    ligature NFKC turns into two letters, an embedded NUL) are kept as
    data: the program loads and each function is called by its name."""
    data = bytearray(host_code)
    for old, new in zip(["aaaaa", "bbbbb", "ccccc", "ddddd"], HOSTILE_NAMES):
        raw = new.encode()
        assert len(raw) == 5
        assert data.count(old.encode()) >= 1
        data = bytearray(bytes(data).replace(old.encode(), raw))
    with load_program(bytes(data)) as prog:
        assert sorted(prog.functions) == sorted(
            HOSTILE_NAMES + ["alloc", "resize", "hoard", "mixed"])
        assert int(prog("f²xy", 4)[0]) == 8
        assert int(prog("fⅠx", 4)[0]) == 16
        assert int(prog("ﬁxy", 4)[0]) == 0
        assert int(prog("ab\0cd", 4)[0]) == 0


# ---------------------------------------------------------------------------
# bytecode operands


@pytest.mark.skipif(HOST != "x86_64", reason="the edited module is x86_64 code")
def test_ref_register_as_an_integer_is_refused_at_load(add_x86, tmp_path):
    """A variadic call's i32 operand (hal.buffer_view.assert's element
    type) pointed at a ref register: before, a TypeError traceback
    (``BufferView & int``) at the call; now load_program refuses it,
    naming the function, the op and its offset."""
    start, raw, call = _find(add_x86, "add", "call.variadic")
    regs = [p for p in _field_positions(raw, call) if p[0] == "regs"]
    out = bytearray(add_x86)
    # operands: (view, message, element type, encoding, dims...)
    struct.pack_into("<H", out, start + regs[2][1], isa.REF_BIT | 0)
    with pytest.raises(BytecodeError) as err:
        load_program(bytes(out))
    e = err.value
    assert e.op == "vm.call.variadic" and e.offset == call.offset
    assert e.name.endswith(".add") and "register r0" in str(e)
    path = tmp_path / "ref_as_int.vmfb"
    path.write_bytes(bytes(out))
    proc = _run_module(path, "--function=add", f"--input={N}xf32=1",
                       f"--input={N}xf32=2")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert "vm.call.variadic" in proc.stderr


def test_float_read_as_an_integer_is_a_typed_error(host_code):
    """``vm.and.i32`` made to read the f32 argument's register (what only
    the running values show: IREE's registers are untyped bits) is a
    BytecodeError naming the op and its offset, not a TypeError."""
    start, raw, op = _find(host_code, "mixed", "and.i32")
    pos = [p for p in _field_positions(raw, op) if p[0] == "i32"]
    out = bytearray(host_code)
    struct.pack_into("<H", out, start + pos[0][1], 0)       # %i0: the f32 x
    with load_program(bytes(out)) as prog:
        with pytest.raises(BytecodeError) as err:
            prog("mixed", 3.5, 7)
    assert err.value.op == "vm.and.i32" and err.value.offset == op.offset
    assert "TypeError" in str(err.value)


def test_return_of_a_ref_for_an_integer_is_refused_at_load(host_code):
    start, raw, op = _find(host_code, "aaaaa", "return")
    pos = [p for p in _field_positions(raw, op) if p[0] == "regs"]
    out = bytearray(host_code)
    struct.pack_into("<H", out, start + pos[0][1], isa.REF_BIT | 0)
    with pytest.raises(BytecodeError) as err:
        load_program(bytes(out))
    assert err.value.op == "vm.return"


# ---------------------------------------------------------------------------
# allocations


@pytest.mark.parametrize("function,args,what", [
    ("alloc", (1 << 33,), "vm.buffer.alloc"),
    ("alloc", (1 << 40,), "vm.buffer.alloc"),
    ("resize", ((1 << 31) - 1,), "vm.list.resize"),
    ("hoard", (100_000, 1 << 20), "vm.buffer.alloc"),
])
def test_vm_allocations_count_against_the_memory_limit(host_code, function, args,
                                                       what):
    """Before: 2^33- and 2^40-byte vm.buffers, a list of 2^31-1 elements and
    100,000 live 1 MiB buffers grew past 1.5 GiB (or were a MemoryError
    traceback). Now each is RESOURCE_EXHAUSTED naming the op, before the
    memory is taken."""
    import resource
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with load_program(host_code, memory_limit=256 << 20) as prog:
        with pytest.raises(VmStatusError) as err:
            prog(function, *args)
        assert err.value.code == 8 and what in str(err.value)
        assert "memory limit of 268435456 bytes" in str(err.value)
        # what was counted is given back: the program runs on
        assert int(prog("hoard", 10, 1 << 20)[0]) == 10
        assert prog.hal.memory.live < 64 << 20
    grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    assert grown < 400 << 10, grown         # KiB


def test_memory_limit_from_run_module(host_code, tmp_path):
    path = tmp_path / "host_code.vmfb"
    path.write_bytes(host_code)
    proc = _run_module(path, "--function=hoard", "--input=100000",
                       f"--input={1 << 20}", "--memory_limit=256MiB")
    assert proc.returncode == 1
    assert "RESOURCE_EXHAUSTED" in proc.stderr and "vm.buffer.alloc" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    proc = _run_module(path, "--function=alloc", f"--input={1 << 40}")
    assert proc.returncode == 1 and "RESOURCE_EXHAUSTED" in proc.stderr
    assert "Traceback" not in proc.stderr and "MemoryError" not in proc.stderr


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-q", *os.sys.argv[1:]]))
