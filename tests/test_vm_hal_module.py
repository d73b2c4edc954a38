"""hal_cpu.vm.hal_module: the ``hal`` module's exports, called as a
program's bytecode calls them, over real executables compiled by
iree-compile; results compared with IREE's own runtime."""

from __future__ import annotations

import re
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

from fatelf import arches
from hal_cpu.iree import compile_program
from hal_cpu.vm.hal_module import (HAL_MODULE_VERSION, Buffer, BufferView,
                                   CommandBuffer, Device, Executable, Fence,
                                   HalModule)
from hal_cpu.vm.module_def import read_module
from hal_cpu.vm.refs import VmBuffer, VmStatusError

HERE = Path(__file__).parent
MLP = HERE / "programs" / "vm_hal" / "mlp.mlir"
HOST = arches.host_arch()
IREE_SRC = Path("/work/.mirror/iree-org+iree/repo")

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
    try:
        text = subprocess.run(
            ["git", "-C", str(IREE_SRC), "show",
             "HEAD:runtime/src/iree/modules/hal/exports.inl"],
            capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("IREE's source is not here")
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
