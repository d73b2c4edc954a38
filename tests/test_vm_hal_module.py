"""hal_cpu.programs.vm.hal_module: the ``hal`` module's exports, called as a
program's bytecode calls them, over real executables compiled by
iree-compile; results compared with IREE's own runtime."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from fatelf import arches
from hal_cpu.arrays import guarded_bytes
from hal_cpu.programs import compile_program
from hal_cpu.programs.vm.hal_module import (
    HAL_MODULE_VERSION,
    Buffer,
    BufferView,
    CommandBuffer,
    Device,
    Executable,
    Fence,
    HalModule,
)
from hal_cpu.programs.vm.module_def import read_module
from hal_cpu.programs.vm.refs import VmBuffer, VmStatusError

from conftest import iree_source_file

HERE = Path(__file__).parent
MLP = HERE / "programs" / "vm_hal" / "mlp.mlir"
HOST = arches.host_arch()

F32 = 0x21000020
DENSE = 1
WHOLE = -1
ANY = -1                  # queue affinity: any queue
DISPATCH_TRANSFER = 3075  # usage: transfer | dispatch storage
DEVICE_LOCAL = 48
DEVICE_VISIBLE = 16


@pytest.fixture(scope="module")
def mlp(compile_cache):
    """arch -> (compiled program, its ModuleDef)."""
    cache = {}

    def get(arch):
        if arch not in cache:
            c = compile_program(MLP, arch, compile_cache)
            cache[arch] = (c, read_module(c.vmfb))
        return cache[arch]
    return get


def rodata(mdef, what):
    """The module's read-only data as VM buffers (as vm.const.ref.rodata),
    found by content: ``what`` is a predicate on the bytes."""
    found = []
    for seg in mdef.rodata:
        data = mdef.rodata_bytes(seg.index)
        if what(bytes(data[:64])):
            found.append(VmBuffer(data, True, f"rodata[{seg.index}]"))
    return found


def s(text: str) -> VmBuffer:
    return VmBuffer(text.encode(), True, repr(text))


class MlpProgram:
    """The MLP module's functions, written out call by call as its bytecode
    makes them (``iree-dump-module --output=disassembly``)."""

    def __init__(self, hal: HalModule, mdef):
        self.hal = hal
        (fmt,) = rodata(mdef, lambda b: b.startswith(b"embedded-elf-"))
        (elf,) = rodata(mdef, lambda b: b.startswith(b"\x7fELF"))
        names = rodata(mdef, lambda b: b.startswith(b"predict_dispatch_"))
        names.sort(key=lambda v: v.bytes())
        self.fmt, self.elf, self.names = fmt, elf, names
        self.init()

    def call(self, name, *args):
        cconv, fn = self.hal.exports["hal." + name]
        return fn(*args)

    def init(self):
        c = self.call
        assert c("devices.count") == 1
        device = c("devices.get", 0)
        ok, value = c("device.query.i64", device, s("hal.device.id"), s("local*"))
        assert (ok, value) == (1, 1)
        ok, value = c("device.query.i64", device, s("hal.executable.format"), self.fmt)
        assert (ok, value) == (1, 1)
        self.device = device
        self.exe = c("executable.create", device, ANY, self.fmt, self.elf, None)
        cb = c("command_buffer.create", device, 0, 3, ANY, 3)
        f0 = c("executable.lookup.function", self.exe, self.names[0])
        c("command_buffer.dispatch", cb, self.exe, f0, 1, 1, 1, 0, (),
          ((0, 0, None, 0, 256), (0, 2, None, 0, 128)))
        c("command_buffer.execution_barrier", cb, 28, 13, 0)
        f1 = c("executable.lookup.function", self.exe, self.names[1])
        c("command_buffer.dispatch", cb, self.exe, f1, 4, 1, 1, 0, (),
          ((0, 2, None, 0, 128), (0, 1, None, 0, 128)))
        c("command_buffer.execution_barrier", cb, 28, 13, 0)
        c("command_buffer.finalize", cb)
        self.cb = cb

    def predict(self, view):
        c = self.call
        device, cb = self.device, self.cb
        c("buffer_view.assert", view, s("input0"), F32, DENSE, ((4,), (16,)))
        buf = c("buffer_view.buffer", view)
        allocator = c("device.allocator", device)
        c("buffer.assert", buf, s("tensor"), allocator, 256, DEVICE_VISIBLE,
          DISPATCH_TRANSFER)
        f0 = c("fence.create", device, 0)
        result = c("device.queue.alloca", device, ANY, None, f0, 0, DEVICE_LOCAL,
                   DISPATCH_TRANSFER, 128, 0)
        f1 = c("fence.create", device, 0)
        transient = c("device.queue.alloca", device, ANY, None, f1, 0,
                      DEVICE_LOCAL, DISPATCH_TRANSFER, 128, 0)
        joined = c("fence.join", 0, ((f0,), (f1,)))
        done = c("fence.create", device, 0)
        c("device.queue.execute.indirect", device, ANY, joined, done, cb, 0,
          ((buf, 0, 256), (result, 0, 128), (transient, 0, 128)))
        freed = c("fence.create", device, 0)
        c("device.queue.dealloca", device, ANY, done, freed, transient, 0)
        status = c("fence.await", -1, 0, ((freed,),))
        if status:
            raise VmStatusError(status, "failed to wait on timepoint")
        return c("buffer_view.create", result, 0, 128, F32, DENSE, ((4,), (8,)))


def reference(x: np.ndarray) -> np.ndarray:
    mm = x.astype(np.float64) @ np.full((16, 8), np.float32(0.05), np.float64)
    b = np.float32(0.1)
    relu = np.maximum(mm + b, b)
    e = np.exp(relu - relu.max(axis=1, keepdims=True))
    return (e / e.sum(axis=1, keepdims=True)).astype(np.float32)


def iree_predict(vmfb: Path, x: np.ndarray) -> np.ndarray:
    import iree.runtime as rt
    module = rt.load_vm_flatbuffer_file(str(vmfb), driver="local-task")
    return np.asarray(module.predict(x).to_host())


def inputs(seed=0):
    return np.random.default_rng(seed).standard_normal((4, 16)).astype(np.float32)


# ---------------------------------------------------------------------------

def test_exports_match_iree_exports_table():
    """Every export has the name and calling convention of exports.inl."""
    text = iree_source_file("runtime/src/iree/modules/hal/exports.inl")
    table = {}
    for name, args, rets in re.findall(
            r'EXPORT_FN(?:_CUSTOM)?\("([^"]+)",\s*\w+,\s*(\w+),\s*(\w+)\)', text):
        table["hal." + name] = f"0{args}_{rets}"
    with HalModule(arch="x86_64") as hal:
        assert hal.name == "hal" and hal.version == HAL_MODULE_VERSION == 7
        for name, (cconv, fn) in hal.exports.items():
            assert table[name] == cconv, name
            assert callable(fn)
        missing = sorted(set(table) - set(hal.exports))
    assert missing == ["hal.channel.create", "hal.channel.rank_and_count",
                       "hal.channel.split", "hal.command_buffer.collective"]


def test_ref_types_have_vm_types_and_slots():
    for cls, name in ((Device, "!hal.device"), (Buffer, "!hal.buffer"),
                      (BufferView, "!hal.buffer_view"),
                      (CommandBuffer, "!hal.command_buffer"),
                      (Executable, "!hal.executable"), (Fence, "!hal.fence")):
        assert cls.vm_type == name
        assert "__slots__" in cls.__dict__


@pytest.mark.parametrize("arch,backend", [
    pytest.param("x86_64", "native", marks=pytest.mark.skipif(
        HOST != "x86_64", reason="x86_64 host only")),
    ("aarch64", "emulated")])
def test_mlp_by_hand_matches_iree(mlp, arch, backend):
    compiled, mdef = mlp(arch)
    x = inputs()
    with HalModule(arch=arch, backend=backend) as hal:
        prog = MlpProgram(hal, mdef)
        out = hal.to_numpy(prog.predict(hal.wrap_input(x)))
        again = hal.to_numpy(prog.predict(hal.wrap_input(x + 1)))
    assert out.shape == (4, 8) and out.dtype == np.float32
    np.testing.assert_allclose(out, reference(x), rtol=2e-6, atol=1e-7)
    np.testing.assert_allclose(again, reference(x + 1), rtol=2e-6, atol=1e-7)
    native_vmfb = mlp(HOST)[0].vmfb if HOST in ("x86_64", "aarch64") else None
    if native_vmfb is not None:
        theirs = iree_predict(native_vmfb, x)
        if arch == HOST:
            np.testing.assert_array_equal(out, theirs)
        else:
            np.testing.assert_allclose(out, theirs, rtol=2e-6, atol=1e-7)


@pytest.mark.skipif(HOST != "x86_64", reason="x86_64 host only")
@pytest.mark.parametrize("bad", [np.zeros((4, 15), np.float32),
                                 np.zeros((4, 16), np.float64),
                                 np.zeros((16,), np.float32),
                                 np.zeros((4, 16), np.int32)])
def test_wrong_input_fails_as_iree_does(mlp, bad):
    """buffer_view.assert names the expected and actual shape or element
    type in IREE's words."""
    import iree.runtime as rt
    compiled, mdef = mlp("x86_64")
    module = rt.load_vm_flatbuffer_file(str(compiled.vmfb), driver="local-task")
    with pytest.raises(ValueError) as theirs:
        module.predict(bad)
    with HalModule(arch="x86_64") as hal:
        prog = MlpProgram(hal, mdef)
        with pytest.raises(VmStatusError) as ours:
            prog.predict(hal.wrap_input(bad))
    assert ours.value.code == 3
    assert "INVALID_ARGUMENT; " + ours.value.message + ";" in str(theirs.value)


def test_device_queries():
    with HalModule(arch="aarch64", backend="emulated", cpu="sve") as hal:
        q = hal.exports["hal.device.query.i64"][1]
        dev = hal.exports["hal.devices.get"][1](0)
        assert dev is hal.device and hal.exports["hal.devices.get"][1](1) is None
        assert q(dev, s("hal.device.id"), s("local*")) == (1, 1)
        assert q(dev, s("hal.device.id"), s("local-task")) == (1, 1)
        assert q(dev, s("hal.device.id"), s("vulkan*")) == (1, 0)
        assert q(dev, s("hal.executable.format"), s("embedded-elf-arm_64")) == (1, 1)
        assert q(dev, s("hal.executable.format"), s("embedded-elf-x86_64")) == (1, 0)
        assert q(dev, s("hal.executable.format"), s("system-elf-arm_64")) == (1, 0)
        assert q(dev, s("hal.device"), s("concurrency")) == (1, 1)
        ok, workers = q(dev, s("hal.dispatch"), s("concurrency"))
        assert ok == 1 and workers >= 1
        assert q(dev, s("hal.cpu"), s("sve")) == (1, 1)        # the profile's
        assert q(dev, s("hal.cpu"), s("sme")) == (1, 0)
        assert q(dev, s("hal.cpu"), s("avx2")) == (0, 0)       # another arch's
        assert q(dev, s("hal.nothing"), s("x")) == (0, 0)
        with pytest.raises(VmStatusError) as e:
            q(None, s("hal.device.id"), s("local*"))
        assert e.value.code == 3 and "!hal.device" in e.value.message
    with HalModule(arch="x86_64", workers=3) as hal:
        q = hal.exports["hal.device.query.i64"][1]
        assert q(hal.device, s("hal.dispatch"), s("concurrency")) == (1, 3)
        assert q(hal.device, s("hal.cpu"), s("avx2")) == (1, 0)  # generic CPU


def test_wrap_input_and_to_numpy_round_trip():
    with HalModule(arch="x86_64") as hal:
        for a in (np.arange(12, dtype=np.int32).reshape(3, 4),
                  np.arange(10, dtype=np.float64)[::2],          # not contiguous
                  np.array([True, False, True]), np.float16(1.5) * np.ones((2, 2, 2)),
                  np.array(7, np.uint8), np.zeros((0, 3), np.float32)):
            view = hal.wrap_input(a)
            assert view.buffer.address % 64 == 0
            out = hal.to_numpy(view)
            assert out.dtype == a.dtype and out.shape == a.shape
            np.testing.assert_array_equal(out, a)
            assert not np.shares_memory(out, view.buffer.array)
        view = hal.wrap_input(np.zeros((2, 3), np.int32))
        e = hal.exports
        assert e["hal.buffer_view.element_type"][1](view) == 0x11000020   # si32
        assert e["hal.buffer_view.rank"][1](view) == 2
        assert e["hal.buffer_view.dim"][1](view, 1) == 3
        assert e["hal.buffer_view.encoding_type"][1](view) == 1
        with pytest.raises(VmStatusError) as err:
            e["hal.buffer_view.dim"][1](view, 2)
        assert err.value.code == 11
        with pytest.raises(VmStatusError):
            hal.to_numpy(view.buffer)


def test_buffers_ranges_and_host_access():
    with HalModule(arch="x86_64", fill_byte=0xAB) as hal:
        e = {k[4:]: fn for k, (_, fn) in hal.exports.items()}
        alloc = e["device.allocator"](hal.device)
        buf = e["allocator.allocate"](alloc, ANY, DEVICE_LOCAL, DISPATCH_TRANSFER, 64)
        assert e["buffer.length"](buf) == 64 and buf.address % 64 == 0
        assert e["buffer.load"](buf, 0, 4) == -0x54545455          # 0xABABABAB
        e["buffer.store"](0x01020304, buf, 8, 4)
        e["buffer.store"](-1, buf, 12, 2)
        assert e["buffer.load"](buf, 8, 4) == 0x01020304
        assert e["buffer.load"](buf, 12, 4) == -0x54540001         # 0xABABFFFF
        sub = e["buffer.subspan"](buf, 8, 16)
        assert e["buffer.length"](sub) == 16 and e["buffer.load"](sub, 0, 1) == 4
        assert e["buffer.subspan"](buf, 8, WHOLE).length == 56
        for call, args in (("buffer.subspan", (buf, 60, 8)),
                           ("buffer.load", (buf, 62, 4)),
                           ("buffer.store", (1, buf, 64, 1)),
                           ("buffer_view.create", (buf, 32, 64, F32, DENSE, ((16,),)))):
            with pytest.raises(VmStatusError) as err:
                e[call](*args)
            assert err.value.code == 11, call
        with pytest.raises(VmStatusError) as err:
            e["buffer.length"](None)
        assert err.value.code == 3 and "null" in err.value.message
        with pytest.raises(VmStatusError) as err:
            e["buffer.length"](hal.device)
        assert err.value.code == 3 and "!hal.device" in err.value.message
        view = e["buffer_view.create"](buf, 16, 32, F32, DENSE, ((2,), (4,)))
        assert e["buffer_view.buffer"](view).length == 32
        with pytest.raises(VmStatusError) as err:
            e["buffer.assert"](buf, s("tensor"), alloc, 128, DEVICE_VISIBLE, 3)
        assert err.value.code == 3 and err.value.message == (
            "tensor buffer byte length 64 less than expected minimum 128")
        e["buffer.assert"](buf, s("tensor"), alloc, 64, DEVICE_LOCAL, DISPATCH_TRANSFER)


def test_transfers_recorded_and_queued():
    with HalModule(arch="x86_64") as hal:
        e = {k[4:]: fn for k, (_, fn) in hal.exports.items()}
        dev = hal.device
        a = e["device.queue.alloca"](dev, ANY, None, None, 0, DEVICE_LOCAL,
                                     DISPATCH_TRANSFER, 32, 0)
        b = e["device.queue.alloca"](dev, ANY, None, None, 0, DEVICE_LOCAL,
                                     DISPATCH_TRANSFER, 32, 0)
        cb = e["command_buffer.create"](dev, 1, 3, ANY, 2)
        # slot 0: fill 16-bit pattern; update bytes into slot 1; copy direct
        e["command_buffer.fill_buffer"](cb, None, 0, 32, 0, 0x1234, 2, 0)
        e["command_buffer.update_buffer"](cb, VmBuffer(b"wxyz", True), 1, None, 4,
                                          3, 1, 0)
        e["command_buffer.copy_buffer"](cb, 0, 0, a, 2, b, 20, 6, 0)
        e["command_buffer.execution_barrier"](cb, 28, 13, 0)
        e["command_buffer.finalize"](cb)
        with pytest.raises(VmStatusError) as err:
            e["command_buffer.fill_buffer"](cb, a, 0, 4, 0, 0, 1, 0)
        assert err.value.code == 9
        with pytest.raises(VmStatusError) as err:        # slots need a table
            e["device.queue.execute"](dev, ANY, None, None, cb, 0)
        assert err.value.code == 3
        with pytest.raises(VmStatusError) as err:        # slot 1 too short
            e["device.queue.execute.indirect"](dev, ANY, None, None, cb, 0,
                                               ((a, 0, 32), (b, 0, 6)))
        assert err.value.code == 11
        done = e["fence.create"](dev, 0)
        e["device.queue.execute.indirect"](dev, ANY, None, done, cb, 0,
                                           ((a, 0, WHOLE), (b, 0, 32)))
        assert e["fence.query"](done) == 0
        assert a.array.tobytes() == bytes.fromhex("3412") * 16
        assert b.array[4:7].tobytes() == b"xyz"
        assert b.array[20:26].tobytes() == bytes.fromhex("341234123412")
        e["device.queue.fill"](dev, ANY, None, None, a, 4, 8, 0x7F, 1, 0)
        e["device.queue.copy"](dev, ANY, None, None, a, 0, b, 0, 16, 0)
        e["device.queue.update"](dev, ANY, None, None, VmBuffer(b"0123456789"), 2,
                                 b, 30, 2, 0)
        assert b.array[:16].tobytes() == bytes.fromhex("34123412") + b"\x7f" * 8 \
            + bytes.fromhex("34123412")
        assert b.array[30:].tobytes() == b"23"
        data = VmBuffer(b"\0" * 5 + b"file-bytes", True)
        f = e["ex.file.from_memory"](dev, ANY, 1, data, 5, 10, 0)
        e["device.queue.read"](dev, ANY, None, None, f, 5, a, 0, 5, 0)
        assert a.array[:5].tobytes() == b"bytes"
        with pytest.raises(VmStatusError) as err:
            e["device.queue.read"](dev, ANY, None, None, f, 8, a, 0, 5, 0)
        assert err.value.code == 11
        with pytest.raises(VmStatusError) as err:
            e["device.queue.copy"](dev, ANY, None, None, a, 30, b, 0, 4, 0)
        assert err.value.code == 11


def test_allocator_import():
    """Read-only data is imported as a private aligned copy (kernels may
    write imports in place); mutable host memory is used where it lies
    when 64-byte aligned, else a try-import fails."""
    raw = np.zeros(256, np.uint8)
    start = -raw.ctypes.data % 64
    raw[start:start + 8] = np.arange(8)
    constant = VmBuffer(memoryview(raw[start + 4:start + 68]).toreadonly(), True)
    aligned = VmBuffer(memoryview(raw[start:start + 128]))
    skewed = VmBuffer(memoryview(raw[start + 4:start + 68]))
    with HalModule(arch="x86_64") as hal:
        imp = hal.exports["hal.allocator.import"][1]
        alloc = hal.device.allocator
        immutable = DISPATCH_TRANSFER | (1 << 19)
        buf = imp(alloc, 1, ANY, DEVICE_LOCAL, immutable, constant, 0, WHOLE)
        assert buf.length == 64 and buf.address % 64 == 0
        assert buf.array[:4].tolist() == [4, 5, 6, 7]
        assert not np.shares_memory(buf.array, raw)
        # mutable memory is bound in place only when it ends before a guard
        # page (a vm.buffer the program allocated)
        assert imp(alloc, 1, ANY, DEVICE_LOCAL, DISPATCH_TRANSFER, aligned, 0,
                   WHOLE) is None
        storage = guarded_bytes(128)
        own = VmBuffer(storage)
        own.guarded = True
        buf = imp(alloc, 1, ANY, DEVICE_LOCAL, DISPATCH_TRANSFER, own, 0, WHOLE)
        assert buf.address == storage.ctypes.data and buf.length == 128
        assert imp(alloc, 1, ANY, DEVICE_LOCAL, DISPATCH_TRANSFER, skewed, 0, 64) is None
        copy = imp(alloc, 0, ANY, DEVICE_LOCAL, DISPATCH_TRANSFER, skewed, 0, 64)
        assert copy.address % 64 == 0 and copy.array[:4].tolist() == [4, 5, 6, 7]
        with pytest.raises(VmStatusError) as err:        # read-only as mutable
            imp(alloc, 1, ANY, DEVICE_LOCAL, DISPATCH_TRANSFER, constant, 0, 64)
        assert err.value.code == 7
        with pytest.raises(VmStatusError) as err:
            imp(alloc, 1, ANY, DEVICE_LOCAL, immutable, aligned, 64, 128)
        assert err.value.code == 3


def test_fences_defer_queue_work_until_signalled():
    with HalModule(arch="x86_64") as hal:
        e = {k[4:]: fn for k, (_, fn) in hal.exports.items()}
        dev = hal.device
        buf = e["allocator.allocate"](dev.allocator, ANY, DEVICE_LOCAL, 3, 8)
        gate, other = e["fence.create"](dev, 0), e["fence.create"](dev, 0)
        both = e["fence.join"](0, ((gate,), (None,), (other,)))
        done = e["fence.create"](dev, 0)
        e["device.queue.fill"](dev, ANY, both, done, buf, 0, 8, 5, 1, 0)
        assert e["fence.query"](done) == 17                        # DEFERRED
        assert e["fence.await"](0, 0, ((done,),)) == 4             # DEADLINE_EXCEEDED
        with pytest.raises(VmStatusError) as err:
            e["fence.await"](-1, 0, ((done,),))
        assert err.value.code == 4
        e["fence.signal"](gate)
        assert buf.array.tolist() == [0] * 8 and e["fence.query"](done) == 17
        e["fence.signal"](other)
        assert buf.array.tolist() == [5] * 8
        assert e["fence.query"](done) == 0 and e["fence.await"](-1, 0, ((done,),)) == 0
        assert e["fence.join"](0, ((None,),)) is None
        assert e["fence.query"](e["fence.join"](0, ((done,), (gate,)))) == 0
        # a failed fence fails what waits on it, and the await
        gate = e["fence.create"](dev, 0)
        after = e["fence.create"](dev, 0)
        e["device.queue.fill"](dev, ANY, gate, after, buf, 0, 8, 9, 1, 0)
        e["fence.fail"](gate, 10)
        assert buf.array.tolist() == [5] * 8
        assert e["fence.query"](after) == 10
        with pytest.raises(VmStatusError) as err:
            e["fence.await"](-1, 0, ((done,), (after,)))
        assert err.value.code == 10 and "ABORTED" in err.value.message


@pytest.mark.skipif(HOST != "x86_64", reason="x86_64 host only")
def test_mlp_through_executable_dispatch(mlp):
    """A time limit or several workers send dispatches through
    hal_cpu.Executable.dispatch; the results are the same."""
    compiled, mdef = mlp("x86_64")
    x = inputs(3)
    with HalModule(arch="x86_64", workers=2) as hal:
        prog = MlpProgram(hal, mdef)
        many = hal.to_numpy(prog.predict(hal.wrap_input(x)))
    with HalModule(arch="x86_64") as hal:
        prog = MlpProgram(hal, mdef)
        fast = hal.to_numpy(prog.predict(hal.wrap_input(x)))
        hal.timeout = 5
        limited = hal.to_numpy(prog.predict(hal.wrap_input(x)))
        hal.timeout = None
        again = hal.to_numpy(prog.predict(hal.wrap_input(x)))
        with pytest.raises(Exception):
            hal.timeout = -1
    np.testing.assert_array_equal(many, fast)
    np.testing.assert_array_equal(limited, fast)
    np.testing.assert_array_equal(again, fast)
    with pytest.raises(VmStatusError) as err:       # executables unloaded
        prog.predict(hal.wrap_input(x))
    assert err.value.code == 9


def test_executable_create_checks_format_and_caches(mlp):
    compiled, mdef = mlp("aarch64")
    with HalModule(arch="x86_64") as hal:
        prog_fmt = rodata(mdef, lambda b: b.startswith(b"embedded-elf-"))[0]
        elf = rodata(mdef, lambda b: b.startswith(b"\x7fELF"))[0]
        create = hal.exports["hal.executable.create"][1]
        with pytest.raises(VmStatusError) as err:
            create(hal.device, ANY, prog_fmt, elf, None)
        assert err.value.code == 5 and "embedded-elf-arm_64" in err.value.message
    with HalModule(arch="aarch64", backend="emulated") as hal:
        create = hal.exports["hal.executable.create"][1]
        exe = create(hal.device, ANY, prog_fmt, elf, None)
        assert create(hal.device, ANY, prog_fmt, elf, None) is exe
        lookup = hal.exports["hal.executable.lookup.function"][1]
        assert lookup(exe, s(exe.library.exports[1].name)) == 1
        with pytest.raises(VmStatusError) as err:
            lookup(exe, s("nope"))
        assert err.value.code == 5
        with pytest.raises(VmStatusError) as err:
            create(hal.device, ANY, prog_fmt, elf, VmBuffer(b"abc"))
        assert err.value.code == 3
        with pytest.raises(VmStatusError) as err:      # constants it lacks
            create(hal.device, ANY, prog_fmt, elf, VmBuffer(b"abcd"))
        assert err.value.code == 3 and "declares 0 constants, 1 given" \
            in err.value.message
    hal.close()                                   # again: nothing happens
    assert exe.closed
    with pytest.raises(VmStatusError):
        create(hal.device, ANY, prog_fmt, elf, None)


@pytest.mark.parametrize("arch,backend", [
    pytest.param(HOST, "native", marks=pytest.mark.skipif(
        HOST not in ("x86_64", "aarch64"), reason="no native executables")),
    ("riscv64", "emulated")])
def test_plugin_executable_with_direct_bindings(compile_cache, arch, backend):
    """IREE's custom-dispatch sample: its executable imports simple_mul from
    an executable plugin; dispatched here with direct bindings and
    queue.execute."""
    from hal_cpu.plugins import PluginManager
    prebuilt = HERE.parent / "sample_plugins" / "prebuilt" / "standalone.sos"
    c = compile_program(HERE.parent / "sample_plugins" / "standalone_example.mlir",
                        arch, compile_cache)
    mdef = read_module(c.vmfb)
    (fmt,) = rodata(mdef, lambda b: b.startswith(b"embedded-elf-"))
    (elf,) = rodata(mdef, lambda b: b.startswith(b"\x7fELF"))
    n = 100
    a = np.arange(n, dtype=np.float32) - 30
    b = np.linspace(-2, 2, n, dtype=np.float32)
    plugins = PluginManager.from_specs([str(prebuilt)], arch=arch, backend=backend)
    with HalModule(arch=arch, backend=backend, plugins=plugins) as hal:
        e = {k[4:]: fn for k, (_, fn) in hal.exports.items()}
        dev = hal.device
        exe = e["executable.create"](dev, ANY, fmt, elf, None)
        mul = e["executable.lookup.function"](exe, s("mul"))
        va, vb = hal.wrap_input(a), hal.wrap_input(b)
        out = e["allocator.allocate"](dev.allocator, ANY, DEVICE_LOCAL,
                                      DISPATCH_TRANSFER, 4 * n)
        cb = e["command_buffer.create"](dev, 1, 3, ANY, 0)
        e["command_buffer.dispatch"](cb, exe, mul, -(-n // 64), 1, 1, 0,
                                     ((n,), (0,)),
                                     ((0, 0, va.buffer, 0, 4 * n),
                                      (0, 0, vb.buffer, 0, 4 * n),
                                      (0, 0, out, 0, WHOLE)))
        e["command_buffer.finalize"](cb)
        done = e["fence.create"](dev, 0)
        e["device.queue.execute"](dev, ANY, None, done, cb, 0)
        assert e["fence.await"](-1, 0, ((done,),)) == 0
        view = e["buffer_view.create"](out, 0, 4 * n, F32, DENSE, ((n,),))
        np.testing.assert_allclose(hal.to_numpy(view), a * b, rtol=1e-6)
    plugins.close()
    with HalModule(arch=arch, backend=backend) as hal:
        from hal_cpu.errors import UnresolvedImportError
        with pytest.raises(UnresolvedImportError):
            hal.exports["hal.executable.create"][1](hal.device, ANY, fmt, elf, None)


# ---------------------------------------------------------------------------
# whole functions through the VM (hal_cpu.programs.vm.translate)

def _load(vmfb, **kwargs):
    pytest.importorskip("hal_cpu.programs.vm.translate")
    from hal_cpu.programs.vm.program import load_program
    return load_program(vmfb, **kwargs)


@pytest.mark.parametrize("arch,backend", [
    pytest.param("x86_64", "native", marks=pytest.mark.skipif(
        HOST != "x86_64", reason="x86_64 host only")),
    ("aarch64", "emulated")])
def test_mlp_through_the_vm(mlp, arch, backend):
    compiled, _ = mlp(arch)
    prog = _load(compiled.vmfb, arch=arch, backend=backend)
    try:
        predict = prog.function("predict")
        for seed in range(3):
            x = inputs(seed)
            (out,) = predict(x)
            np.testing.assert_allclose(out, reference(x), rtol=2e-6, atol=1e-7)
        with pytest.raises(VmStatusError) as err:
            predict(np.zeros((4, 15), np.float32))
        assert err.value.code == 3
        assert "input0 shape dimension 1 mismatch; expected 16 but have 15" \
            in err.value.message
    finally:
        prog.hal.close()


@pytest.mark.skipif(HOST != "x86_64", reason="x86_64 host only")
def test_programs_through_the_vm_match_iree(compile_cache):
    """Programs with dynamic shapes, integer types, gathers give IREE's
    runtime's results bit for bit."""
    import iree.runtime as rt

    from program_specs import ACCEPTANCE
    rng = np.random.default_rng(5)
    for name in ("matmul_dyn", "int_ops", "gather", "softmax"):
        spec = ACCEPTANCE[name]
        c = compile_program(spec.path, "x86_64", compile_cache)
        ins = spec.make_inputs(rng)
        prog = _load(c.vmfb, arch="x86_64", backend="native")
        try:
            ours = prog.function(spec.function)(*ins)
        finally:
            prog.hal.close()
        module = rt.load_vm_flatbuffer_file(str(c.vmfb), driver="local-task")
        theirs = getattr(module, spec.function)(*ins)
        theirs = theirs if isinstance(theirs, (list, tuple)) else [theirs]
        assert len(ours) == len(theirs), name
        for a, b in zip(ours, theirs):
            b = np.asarray(b.to_host() if hasattr(b, "to_host") else b)
            assert a.dtype == b.dtype and a.shape == b.shape, name
            np.testing.assert_array_equal(a, b, err_msg=name)


@pytest.mark.parametrize("arch,backend", [
    pytest.param("x86_64", "native", marks=pytest.mark.skipif(
        HOST != "x86_64", reason="x86_64 host only")),
    ("riscv64", "emulated")])
def test_check_programs_through_the_vm(compile_cache, arch, backend):
    """The check-module programs: constants read from files and imported,
    fills, copies, in-place sorts of constants; every check passes."""
    checks = HERE / "programs" / "check"
    names = (("gather_sort", "elementwise", "linalg") if backend == "native"
             else ("gather_sort",))
    for name in names:
        c = compile_program(checks / f"{name}.mlir", arch, compile_cache)
        prog = _load(c.vmfb, arch=arch, backend=backend)
        try:
            for fn in prog.functions:
                prog.function(fn)()
                prog.function(fn)()          # constants unchanged by the first
        finally:
            prog.hal.close()


@pytest.mark.skipif(HOST != "x86_64", reason="x86_64 host only")
def test_threads_share_one_program(compile_cache):
    """Threads calling one program at once each get their own results (a
    dispatch whose layout another thread holds goes through
    Executable.dispatch)."""
    import threading

    from program_specs import ACCEPTANCE
    spec = ACCEPTANCE["matmul_dyn"]
    c = compile_program(spec.path, "x86_64", compile_cache)
    rng = np.random.default_rng(9)
    ins = [spec.make_inputs(rng, m=40 + i, k=64, n=48) for i in range(4)]
    errors = []
    prog = _load(c.vmfb, arch="x86_64", backend="native")
    fn = prog.function(spec.function)
    want = [fn(*i)[0] for i in ins]          # one thread at a time
    for w, i in zip(want, ins):
        np.testing.assert_allclose(w, spec.numpy_reference(i)[0], rtol=1e-4,
                                   atol=1e-4)

    def work(i):
        try:
            for _ in range(100):
                (out,) = fn(*ins[i])
                np.testing.assert_array_equal(out, want[i])
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
    try:
        threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        prog.hal.close()
    assert not errors, errors[0]
