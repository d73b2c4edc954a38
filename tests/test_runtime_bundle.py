"""The runtime support library (hal_cpu/runtime): its committed FatELF
bundle, its reproducible build, the range struct layout, and the workgroup
loop running real sample executables and Python dispatch functions on all
six architectures under emulation (and natively on an x86_64 host)."""

from __future__ import annotations

import io
import json
import re
import struct
from pathlib import Path

import numpy as np
import pytest
from elftools.elf.dynamic import DynamicSection
from elftools.elf.elffile import ELFFile

import elfloader
import fatelf
import hal_cpu
from elfloader import as_int32
from fatelf import arches
from fatelf.cstruct import pack_array
from hal_cpu import abi, runtime
from hal_cpu.buildtools import zig as zigbuild
from hal_cpu.runtime import (
    LOOP_INVALID,
    LOOP_OK,
    LOOP_STOPPED,
    LOOP_SYMBOL,
    NO_INDEX,
    WORKGROUP_RANGE,
)

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ROOT / "hal_cpu" / "samples"
MANIFEST = json.loads((SAMPLES / "manifest.json").read_text())
ARCHES = list(arches.RUNTIME_ARCHES)

HOST = arches.host()
BACKENDS = [("emulated", a) for a in ARCHES]
if HOST is not None and HOST.name == "x86_64":
    BACKENDS.append(("native", "x86_64"))
BACKEND_IDS = [f"{a}-{k}" for k, a in BACKENDS]


# ---------------------------------------------------------------------------
# The committed bundle
# ---------------------------------------------------------------------------

def test_bundle_holds_the_runtime_architectures():
    data = runtime.BUNDLE.read_bytes()
    assert fatelf.is_fatelf(data)
    assert sorted(fatelf.FatElf.parse(data).arches) == sorted(ARCHES)


@pytest.mark.parametrize("arch", ARCHES)
def test_bundle_record_is_self_contained(arch):
    image = elfloader.read_image(runtime.BUNDLE, arch=arch)
    assert image.arch.name == arch
    elf = ELFFile(io.BytesIO(bytes(image.data)))
    defined, undefined, needed = [], [], []
    for section in elf.iter_sections():
        if section.name == ".dynsym":
            for sym in section.iter_symbols():
                if sym.name:
                    (undefined if sym["st_shndx"] == "SHN_UNDEF" else defined).append(sym.name)
        if isinstance(section, DynamicSection):
            needed += [t.needed for t in section.iter_tags() if t.entry.d_tag == "DT_NEEDED"]
    assert sorted(defined) == sorted(runtime.SYMBOLS)
    assert undefined == [] and needed == []
    zigbuild.check_self_contained(bytes(image.data), arch, exports=list(runtime.SYMBOLS))
    module = elfloader.load(runtime.BUNDLE, arch=arch, backend="emulated")
    try:
        assert module.lookup(LOOP_SYMBOL)
        assert module.backend.arch.name == arch
    finally:
        module.close()
        module.backend.close()


@pytest.mark.skipif(not zigbuild.zig_available(), reason="ziglang not importable")
def test_bundle_rebuilds_byte_identically(tmp_path, monkeypatch):
    if zigbuild.zig_version() != zigbuild.ZIG_VERSION:
        pytest.skip(f"ziglang {zigbuild.zig_version()} is not {zigbuild.ZIG_VERSION}")
    from hal_cpu.buildtools import runtime as build

    monkeypatch.setenv("ZIG_GLOBAL_CACHE_DIR", str(tmp_path / "zig-cache"))
    path = build.build(tmp_path / "out")
    assert path.name == "runtime.sos"
    assert path.read_bytes() == runtime.BUNDLE.read_bytes()


def test_zigbuild_errors(tmp_path, monkeypatch):
    monkeypatch.setattr(zigbuild, "zig_available", lambda: False)
    with pytest.raises(zigbuild.ZigBuildError, match="ziglang") as info:
        zigbuild.build_freestanding("x.c", "riscv32", cwd=tmp_path, work_dir=tmp_path)
    assert isinstance(info.value, hal_cpu.HalCpuError)
    monkeypatch.undo()
    if not zigbuild.zig_available():
        return
    (tmp_path / "bad.c").write_text("int f(void) { return undeclared; }\n")
    with pytest.raises(zigbuild.ZigBuildError, match="undeclared"):
        zigbuild.build_freestanding("bad.c", "x86_64", cwd=tmp_path, work_dir=tmp_path)
    (tmp_path / "ext.c").write_text(
        "extern int g(void);\n"
        "__attribute__((visibility(\"default\"))) int f(void) { return g(); }\n")
    with pytest.raises(zigbuild.ZigBuildError, match="undefined"):
        zigbuild.build_freestanding("ext.c", "arm32", cwd=tmp_path, work_dir=tmp_path)


def test_range_layout_is_the_same_everywhere():
    source = runtime.SOURCE.read_text()
    asserted = dict(re.findall(r"offsetof\(hal_cpu_workgroup_range_t, (\w+)\) == (\d+)", source))
    size = re.search(r"sizeof\(hal_cpu_workgroup_range_t\) == (\d+)", source)
    assert asserted and size
    want = {"begin": 0, "end": 8, "failed_index": 16, "stop": 24, "status": 32, "reserved": 36}
    for c_abi in {a.c_abi for a in elfloader.arch.ARCHES}:
        layout = WORKGROUP_RANGE.layout(*c_abi)
        assert layout.offsets == want
        assert layout.size == int(size.group(1)) == 40
        for name, offset in asserted.items():
            assert layout.offsets[name] == int(offset)
    assert runtime.return_name(LOOP_STOPPED) == "STOPPED"
    assert runtime.return_name(LOOP_INVALID) == "INVALID"
    assert runtime.return_name(3) == "WORKGROUP_FAILED(3)"


# ---------------------------------------------------------------------------
# Running the loop
# ---------------------------------------------------------------------------

def _dispatch_target(executable, export: str) -> tuple[int, int]:
    """(dispatch function address, environment address) of an export.

    Uses hal_cpu.Executable internals; the one place this test does."""
    return executable.export(export).address, executable._env


class Loop:
    """The runtime bundle loaded into one backend, with helpers to lay out
    dispatch states and ranges there and call the loop."""

    def __init__(self, kind: str, arch: str):
        self.module = elfloader.load(runtime.BUNDLE, arch=arch, backend=kind)
        self.backend = be = self.module.backend
        self.address = self.module.lookup(LOOP_SYMBOL)
        self.c_abi = be.arch.c_abi
        self.ptr_size = be.pointer_size
        self.range_layout = WORKGROUP_RANGE.layout(*self.c_abi)
        self.wg_layout = abi.WORKGROUP_STATE.layout(*self.c_abi)
        self.state_layout = abi.DISPATCH_STATE.layout(*self.c_abi)
        self.allocs: list[int] = []
        self.stop_flag = self.alloc(b"\0" * 4)
        self.range_addr = self.alloc(bytes(self.range_layout.size))

    def alloc(self, data: bytes) -> int:
        addr = self.backend.alloc_bytes(data, 16)
        self.allocs.append(addr)
        return addr

    def dispatch_state(self, count, size=(1, 1, 1), binding_ptrs=(), binding_lengths=()) -> int:
        ps = self.ptr_size
        ptrs = self.alloc(pack_array("ptr", ps, list(binding_ptrs) or [0]))
        lengths = self.alloc(pack_array("ptr", ps, list(binding_lengths) or [0]))
        return self.alloc(self.state_layout.pack(
            workgroup_size_x=size[0], workgroup_size_y=size[1], workgroup_size_z=size[2],
            workgroup_count_x=count[0], workgroup_count_y=count[1],
            workgroup_count_z=count[2], max_concurrency=1,
            binding_count=len(binding_ptrs), constants=self.alloc(b"\0" * 4),
            binding_ptrs=ptrs, binding_lengths=lengths))

    def workgroup_state(self, local_memory_size: int = 0) -> int:
        local = self.alloc(bytes(local_memory_size)) if local_memory_size else 0
        return self.alloc(self.wg_layout.pack(processor_id=0, local_memory=local,
                                              local_memory_size=local_memory_size))

    def set_stop(self, value: int) -> None:
        self.backend.write(self.stop_flag, struct.pack("<I", value))

    def run(self, fn: int, env: int, state: int, wg: int, begin: int, end: int,
            stop: bool | int = True) -> tuple[int, dict]:
        """Call the loop over [begin, end); returns (signed result, range)."""
        stop_addr = self.stop_flag if stop is True else (stop or 0)
        self.backend.write(self.range_addr, self.range_layout.pack(
            begin=begin, end=end, failed_index=12345, stop=stop_addr, status=99))
        result = as_int32(self.backend.call(self.address, fn, env, state, wg,
                                            self.range_addr))
        return result, self.range_layout.unpack(self.backend.read(
            self.range_addr, self.range_layout.size))

    def close(self) -> None:
        for addr in self.allocs:
            self.backend.release(addr)
        self.module.close()
        self.backend.close()


@pytest.fixture(scope="module", params=BACKENDS, ids=BACKEND_IDS)
def loop(request):
    kind, arch = request.param
    instance = Loop(kind, arch)
    yield instance
    instance.close()


def test_loop_runs_sum_last(loop):
    kernel = MANIFEST["kernels"]["sum_last"]
    arch = loop.backend.arch.name
    info = kernel["per_arch"][arch]
    be = loop.backend
    exe = hal_cpu.Executable(SAMPLES / info["file"], backend=be)
    try:
        fn, env = _dispatch_target(exe, kernel["export"])
        export = exe.export(kernel["export"])
        rng = np.random.default_rng(7)
        arrays = []
        for b in kernel["bindings"]:
            a = (rng.standard_normal(b["shape"]) if b["role"] == "input"
                 else np.zeros(b["shape"]))
            arrays.append(np.ascontiguousarray(a, dtype=b["dtype"]))
        count = tuple(info["workgroup_count"])
        total = count[0] * count[1] * count[2]
        assert total > 2

        def dispatch(ranges, stop_value=0):
            outputs = [np.zeros_like(a) for a in arrays[1:]]
            mapped = [be.map_array(a) for a in arrays[:1] + outputs]
            try:
                state = loop.dispatch_state(count, export.workgroup_size,
                                            [m[0] for m in mapped],
                                            [a.nbytes for a in arrays])
                wg = loop.workgroup_state(export.local_memory_size)
                loop.set_stop(stop_value)
                results = [loop.run(fn, env, state, wg, lo, hi) for lo, hi in ranges]
            finally:
                for _, finish in mapped:
                    if finish is not None:   # None: the array itself was used
                        finish()
            return results, outputs[0]

        # The whole grid in two chunks.
        split = total // 2
        results, out = dispatch([(0, split), (split, total)])
        for (ret, rng_out), (_, hi) in zip(results, [(0, split), (split, total)]):
            assert ret == LOOP_OK
            assert rng_out["begin"] == hi and rng_out["status"] == 0
            assert rng_out["failed_index"] == NO_INDEX
        np.testing.assert_allclose(out, arrays[0].sum(axis=-1), rtol=2e-5, atol=1e-5)

        # A set stop flag: nothing runs, begin stays, the output is untouched.
        results, out = dispatch([(1, total)], stop_value=1)
        (ret, rng_out), = results
        assert ret == LOOP_STOPPED and rng_out["begin"] == 1 and rng_out["status"] == 0
        assert not out.any()
    finally:
        exe.close()


class Recorder:
    """A dispatch function in Python: records the workgroup ids it sees,
    returns chosen values and can raise the stop flag."""

    def __init__(self, loop: Loop):
        self.loop = loop
        self.calls: list[tuple[int, int, int]] = []
        self.returns: dict[int, int] = {}
        self.stop_after: int | None = None
        self.address = loop.backend.callback(self, 3)

    def reset(self, returns=None, stop_after=None):
        self.calls, self.returns, self.stop_after = [], dict(returns or {}), stop_after
        self.loop.set_stop(0)

    def __call__(self, env, state, wg):
        assert env == 0xE0
        x, y, z = struct.unpack("<IIH", self.loop.backend.read(wg, 10))
        self.calls.append((x, y, z))
        if self.stop_after is not None and len(self.calls) == self.stop_after:
            self.loop.set_stop(1)
        return self.returns.get(len(self.calls) - 1, 0) & 0xFFFFFFFF


@pytest.fixture(scope="module")
def recorder(loop):
    return Recorder(loop)


def _ids(count, begin, end):
    out = []
    for i in range(begin, end):
        q, x = divmod(i, count[0])
        z, y = divmod(q, count[1])
        out.append((x, y, z))
    return out


@pytest.mark.parametrize("count, begin, end", [
    ((5, 3, 4), 0, 60),
    ((5, 3, 4), 13, 47),
    ((1, 1, 1), 0, 1),
    ((7, 1, 3), 20, 21),
    # Large ids: the 32-bit targets divide 64-bit ids without a libcall.
    ((0xFFFFFFFF, 0x10001, 0xFFFF), (0xFFFFFFFF - 2) + 0xFFFFFFFF * (0x10000 + 0x10001 * 1000),
     (0xFFFFFFFF - 2) + 0xFFFFFFFF * (0x10000 + 0x10001 * 1000) + 5),
    ((3, 0xFFFFFFFF, 0xFFFF), 3 * 0xFFFFFFFF * 0x1234 - 4, 3 * 0xFFFFFFFF * 0x1234 + 2),
    ((0xFFFFFFFF, 0xFFFFFFFF, 0xFFFF), (1 << 64) - 4, (1 << 64) - 1),
], ids=["full", "middle", "single", "one", "carry_xy", "carry_yz", "top"])
def test_loop_walks_the_grid(loop, recorder, count, begin, end):
    state = loop.dispatch_state(count)
    wg = loop.workgroup_state()
    recorder.reset()
    ret, rng = loop.run(recorder.address, 0xE0, state, wg, begin, end)
    assert ret == LOOP_OK
    assert (rng["begin"], rng["end"], rng["status"], rng["failed_index"]) == (end, end, 0, NO_INDEX)
    assert recorder.calls == _ids(count, begin, end)


@pytest.mark.parametrize("code", [7, -1, LOOP_STOPPED])
def test_loop_stops_at_a_failing_workgroup(loop, recorder, code):
    state = loop.dispatch_state((4, 2, 2))
    wg = loop.workgroup_state()
    recorder.reset(returns={2: code})
    ret, rng = loop.run(recorder.address, 0xE0, state, wg, 5, 16)
    assert ret == code
    assert rng["status"] == code  # non-zero: a workgroup failed, even for LOOP_STOPPED
    assert rng["failed_index"] == 7 and rng["begin"] == 7
    assert recorder.calls == _ids((4, 2, 2), 5, 8)


def test_loop_stop_flag(loop, recorder):
    state = loop.dispatch_state((4, 2, 2))
    wg = loop.workgroup_state()
    # Raised while running: checked before each workgroup.
    recorder.reset(stop_after=3)
    ret, rng = loop.run(recorder.address, 0xE0, state, wg, 2, 16)
    assert ret == LOOP_STOPPED
    assert (rng["begin"], rng["status"], rng["failed_index"]) == (5, 0, NO_INDEX)
    assert recorder.calls == _ids((4, 2, 2), 2, 5)
    # Resuming from range.begin finishes the grid.
    recorder.reset()
    ret, rng = loop.run(recorder.address, 0xE0, state, wg, 5, 16)
    assert ret == LOOP_OK and recorder.calls == _ids((4, 2, 2), 5, 16)
    # No flag at all (stop = NULL).
    recorder.reset()
    loop.set_stop(1)
    ret, rng = loop.run(recorder.address, 0xE0, state, wg, 0, 16, stop=0)
    assert ret == LOOP_OK and len(recorder.calls) == 16


def test_loop_refuses_bad_ranges(loop, recorder):
    wg = loop.workgroup_state()
    fn = recorder.address
    untouched = {"begin": 0, "end": 0, "failed_index": 12345, "stop": 0, "status": 99,
                 "reserved": 0}

    def check(count, begin, end, stop=0):
        recorder.reset()
        ret, rng = loop.run(fn, 0xE0, loop.dispatch_state(count), wg, begin, end, stop=stop)
        assert ret == LOOP_INVALID
        assert rng == {**untouched, "begin": begin, "end": end, "stop": stop}
        assert recorder.calls == []

    check((4, 2, 2), 0, 17)          # past the grid
    check((4, 2, 2), 16, 17)
    check((0, 2, 2), 0, 1)           # zero counts
    check((4, 0, 2), 0, 1)
    check((4, 2, 0), 0, 1)
    if loop.ptr_size == 4:
        check((4, 2, 2), 0, 1, stop=1 << 32)  # not a 32-bit address
    # NULL arguments.
    state = loop.dispatch_state((4, 2, 2))
    for args in ((0, 0xE0, state, wg, loop.range_addr), (fn, 0xE0, 0, wg, loop.range_addr),
                 (fn, 0xE0, state, 0, loop.range_addr), (fn, 0xE0, state, wg, 0)):
        assert as_int32(loop.backend.call(loop.address, *args)) == LOOP_INVALID
    # An empty range runs nothing, even with zero counts.
    recorder.reset()
    ret, rng = loop.run(fn, 0xE0, loop.dispatch_state((0, 0, 0)), wg, 3, 3)
    assert ret == LOOP_OK and rng["begin"] == 3 and recorder.calls == []
    ret, rng = loop.run(fn, 0xE0, loop.dispatch_state((4, 2, 2)), wg, 9, 2)
    assert ret == LOOP_OK and rng["begin"] == 9 and recorder.calls == []
