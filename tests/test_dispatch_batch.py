"""Several dispatches in one crossing: the runtime library's
``hal_cpu_dispatch_batch`` (natively and emulated), the native
:class:`hal_cpu.dispatch_policy.DispatchBatch` on real kernels, and the
VM's replay of a command buffer through it (same results as the dispatches
run one by one; faults still name their dispatch)."""

from __future__ import annotations

import struct

import numpy as np
import pytest

import elfloader
import hal_cpu
from elfloader import as_int32
from fatelf import arches
from hal_cpu import DispatchError, Executable, abi, runtime
from hal_cpu.dispatch_policy import (
    BATCH_HEADER,
    BATCH_RECORD,
    BATCH_SOURCE,
    NO_DISPATCH,
    NO_SLOT,
    DispatchBatch,
)
from hal_cpu.runtime import LOOP_INVALID, WORKGROUP_RANGE

from conftest import ROOT

SAMPLES = ROOT / "hal_cpu" / "samples"
HOST = arches.host()
NATIVE = HOST is not None and HOST.name == "x86_64"
# a 64-bit and a 32-bit target emulated, and the host natively
BACKENDS = [("emulated", "aarch64"), ("emulated", "arm32")]
if NATIVE:
    BACKENDS.append(("native", "x86_64"))


# ---------------------------------------------------------------------------
# The library function, with dispatch functions written in Python
# ---------------------------------------------------------------------------

class Batch:
    """The runtime bundle in one backend, dispatch states and a batch laid
    out there, and dispatch functions that record what they see."""

    def __init__(self, kind: str, arch: str):
        self.module = elfloader.load(runtime.BUNDLE, arch=arch, backend=kind)
        self.backend = be = self.module.backend
        self.address = self.module.lookup(runtime.BATCH_SYMBOL)
        self.c_abi = be.arch.c_abi
        self.ps = be.pointer_size
        self.state = abi.DISPATCH_STATE.layout(*self.c_abi)
        self.wg = abi.WORKGROUP_STATE.layout(*self.c_abi)
        self.range = WORKGROUP_RANGE.layout(*self.c_abi)
        self.allocs: list[int] = []
        self.seen: list[tuple[int, tuple[int, int, int], tuple[int, ...]]] = []
        self.fail: dict[tuple[int, int], int] = {}

    def alloc(self, data: bytes) -> int:
        addr = self.backend.alloc_bytes(data, 16)
        self.allocs.append(addr)
        return addr

    def function(self, tag: int) -> int:
        """A dispatch function recording (tag, workgroup id, binding
        pointers) and returning ``fail[(tag, x)]`` (else 0)."""
        word = "<Q" if self.ps == 8 else "<I"

        def fn(env, state, wg):
            x, y, z = struct.unpack("<IIH", self.backend.read(wg, 10))
            s = self.state.unpack(self.backend.read(state, self.state.size))
            ptrs = tuple(struct.unpack_from(word, self.backend.read(
                s["binding_ptrs"] + i * self.ps, self.ps))[0]
                for i in range(s["binding_count"]))
            self.seen.append((tag, (x, y, z), ptrs))
            return self.fail.get((tag, x), 0) & 0xFFFFFFFF
        return self.backend.callback(fn, 3)

    def record(self, tag: int, count: int, sources) -> bytes:
        ps = self.ps
        word = "Q" if ps == 8 else "I"
        ptrs = self.alloc(struct.pack(f"<{max(len(sources), 1)}{word}",
                                      *([0] * max(len(sources), 1))))
        state = self.alloc(self.state.pack(
            workgroup_size_x=1, workgroup_size_y=1, workgroup_size_z=1,
            workgroup_count_x=count, workgroup_count_y=1, workgroup_count_z=1,
            max_concurrency=1, binding_count=len(sources), constants=0,
            binding_ptrs=ptrs, binding_lengths=0))
        wg = self.alloc(self.wg.pack(processor_id=0, local_memory=0,
                                     local_memory_size=0))
        rng = self.alloc(self.range.pack(begin=0, end=0, failed_index=0,
                                         stop=0, status=0))
        src = self.alloc(b"".join(BATCH_SOURCE.pack(NO_SLOT if s < 0 else s, o)
                                  for s, o in sources) or bytes(16))
        return BATCH_RECORD.pack(self.function(tag), 0xE0, state, wg, rng, src,
                                 count, len(sources), 0)

    def run(self, records: list[bytes], table: list[int],
            table_count: int | None = None) -> tuple[int, tuple]:
        recs = self.alloc(b"".join(records) or bytes(64))
        tab = self.alloc(struct.pack(f"<{max(len(table), 1)}Q", *(table or [0])))
        count = len(table) if table_count is None else table_count
        header = self.alloc(BATCH_HEADER.pack(recs, tab, len(records), count,
                                              12345, 99))
        self.seen = []
        ret = as_int32(self.backend.call(self.address, header))
        return ret, BATCH_HEADER.unpack(self.backend.read(header, BATCH_HEADER.size))

    def close(self) -> None:
        for a in self.allocs:
            self.backend.release(a)
        self.module.close()
        self.backend.close()


@pytest.fixture(scope="module", params=BACKENDS,
                ids=[f"{a}-{k}" for k, a in BACKENDS])
def batch(request):
    kind, arch = request.param
    if kind == "emulated":
        pytest.importorskip("unicorn")
    b = Batch(kind, arch)
    yield b
    b.close()


def test_library_runs_dispatches_in_order_with_pointers_from_the_table(batch):
    mask = (1 << (8 * batch.ps)) - 1
    table = [0x10000, 0x20000, 0x30000]
    records = [batch.record(1, 2, [(0, 8), (2, 0)]),
               batch.record(2, 3, [(-1, 0x4440), (1, 64)])]
    ret, header = batch.run(records, table)
    assert ret == 0 and header[4:] == (NO_DISPATCH, 0)
    assert [(t, xyz) for t, xyz, _ in batch.seen] == [
        (1, (0, 0, 0)), (1, (1, 0, 0)),
        (2, (0, 0, 0)), (2, (1, 0, 0)), (2, (2, 0, 0))]
    assert {p for t, _, p in batch.seen if t == 1} == {(0x10008 & mask, 0x30000 & mask)}
    assert {p for t, _, p in batch.seen if t == 2} == {(0x4440, 0x20040)}


def test_library_stops_at_the_failing_dispatch(batch):
    batch.fail = {(2, 1): 7}
    try:
        records = [batch.record(1, 2, []), batch.record(2, 3, []),
                   batch.record(3, 1, [])]
        ret, header = batch.run(records, [])
    finally:
        batch.fail = {}
    assert ret == 7 and header[4:] == (1, 7)
    # dispatch 2 stopped after its failing workgroup; dispatch 3 never ran
    assert [(t, xyz[0]) for t, xyz, _ in batch.seen] == [(1, 0), (1, 1), (2, 0), (2, 1)]


@pytest.mark.parametrize("case", ["slot past the table", "more bindings than the state"])
def test_library_refuses_a_malformed_batch_before_running(batch, case):
    if case == "slot past the table":
        records = [batch.record(1, 1, []), batch.record(2, 1, [(3, 0)])]
        ret, header = batch.run(records, [1, 2, 3])
    else:
        rec = bytearray(batch.record(1, 1, [(0, 0)]))
        struct.pack_into("<I", rec, 56, 5)      # binding_count past the state's
        ret, header = batch.run([bytes(rec)], [1])
    assert ret == LOOP_INVALID and header[4:] == (NO_DISPATCH, LOOP_INVALID)
    assert batch.seen == []


# ---------------------------------------------------------------------------
# DispatchBatch on real kernels (native)
# ---------------------------------------------------------------------------

needs_native = pytest.mark.skipif(not NATIVE, reason="runs x86_64 kernels natively")


def _aligned(nbytes: int, value=None) -> np.ndarray:
    return hal_cpu.zeros(nbytes // 4, np.float32) if value is None else \
        hal_cpu.asarray(np.asarray(value, np.float32))


@needs_native
def test_batch_gives_what_the_dispatches_give_one_by_one():
    """mul_add twice (c = a * b + a, then d = c * b + c) in one batch,
    with c read through the table, equals the two dispatches run apart."""
    with Executable(SAMPLES / "mul_add_x86_64.so", backend="native") as exe:
        export = exe.exports[0]
        n = 5003
        rng = np.random.default_rng(3)
        a = _aligned(4 * n, rng.standard_normal(n))
        b = _aligned(4 * n, rng.standard_normal(n))
        grid = (2, 1, 1)
        first = exe.prepare(export.name, grid, [], [4 * n] * 3, workers=1)
        assert first.batchable
        # apart
        c1, d1 = _aligned(4 * n), _aligned(4 * n)
        first.run([a, b, c1])
        first.run([c1, b, d1])
        # batched: slot 0 a, 1 b, 2 c, 3 d
        c2, d2 = _aligned(4 * n), _aligned(4 * n)
        batch = DispatchBatch([(first, [(0, 0), (1, 0), (2, 0)]),
                               (first, [(2, 0), (1, 0), (3, 0)])])
        try:
            table = [x.ctypes.data for x in (a, b, c2, d2)]
            assert batch.run(table)
            np.testing.assert_array_equal(c2, c1)
            np.testing.assert_array_equal(d2, d1)
            np.testing.assert_allclose(d2, (a * b + a) * b + (a * b + a), rtol=1e-6)
            # again on other outputs: only the table changes
            c3, d3 = _aligned(4 * n), _aligned(4 * n)
            assert batch.run([x.ctypes.data for x in (a, b, c3, d3)])
            np.testing.assert_array_equal(d3, d1)
            with pytest.raises(DispatchError) as e:
                batch.run(table[:3])
            assert e.value.field == "table"
        finally:
            batch.close()
        assert not batch.run(table)          # closed: nothing runs
    with pytest.raises(DispatchError) as e:
        DispatchBatch([(first, [(0, 0)])])
    assert e.value.field in ("batch", "sources")


@needs_native
def test_batch_refuses_what_it_cannot_run():
    with Executable(SAMPLES / "mul_add_x86_64.so", backend="native") as exe:
        export = exe.exports[0].name
        counted = exe.prepare(export, (2, 1, 1), [], 3, workers=1)  # no lengths
        with pytest.raises(DispatchError) as e:
            DispatchBatch([(counted, [(0, 0)] * 3)])
        assert e.value.field == "batch"
        ok = exe.prepare(export, (2, 1, 1), [], [4] * 3, workers=1)
        with pytest.raises(DispatchError) as e:
            DispatchBatch([(ok, [(0, 0)] * 2)])
        assert e.value.field == "sources" and e.value.value == 2


@pytest.mark.parametrize("engine", ["unicorn"])
def test_emulated_prepared_dispatches_are_not_batched(engine):
    pytest.importorskip("unicorn")
    with Executable(SAMPLES / "mul_add_aarch64.so", backend="emulated",
                    engine=engine) as exe:
        p = exe.prepare(exe.exports[0].name, (2, 1, 1), [], [4] * 3, workers=1)
        assert not p.batchable


# ---------------------------------------------------------------------------
# The VM replays a command buffer through a batch
# ---------------------------------------------------------------------------

MLP = ROOT / "bench" / "programs" / "mlp.mlir"


def _command_buffers(fn) -> list:
    from hal_cpu.programs.vm.hal_module import CommandBuffer
    return [v for v in fn.__globals__.values() if isinstance(v, list)
            for v in v if isinstance(v, CommandBuffer)]


@needs_native
def test_vm_replays_a_command_buffer_in_one_batch_with_the_same_results():
    from hal_cpu.programs import compile_program
    from hal_cpu.programs.vm import load_program
    vmfb = compile_program(MLP, "x86_64").vmfb
    x = np.random.default_rng(1).standard_normal((4, 16)).astype(np.float32)
    with load_program(vmfb, workers=1) as program:
        predict = program.function("predict")
        results = [predict(x)[0]]
        # a reusable command buffer (recorded once by the module's
        # initializer) has its batch from its first submission on
        cbs = _command_buffers(predict._fn)
        assert cbs and all(cb.batch is not None for cb in cbs)
        results += [predict(x)[0] for _ in range(3)]
        # dispatch by dispatch (a time limit turns the batch off)
        program.timeout = 60
        calls: list = []

        class Counted:
            def __init__(self, batch):
                self.batch = batch

            def run(self, table):
                calls.append(table)
                return self.batch.run(table)
        batches = [cb.batch for cb in cbs]
        for cb in cbs:
            cb.batch = Counted(cb.batch)
        apart = predict(x)[0]
        assert calls == []
        program.timeout = None
        again = predict(x)[0]
        assert len(calls) == len(cbs)
        for cb, batch in zip(cbs, batches):
            cb.batch = batch
    np.testing.assert_array_equal(again, apart)
    for r in results:
        np.testing.assert_array_equal(r, apart)
    w = np.full((16, 8), 0.05, np.float32)
    logits = np.maximum(x @ w + 0.1, 0.1)
    e = np.exp(logits - logits.max(axis=1, keepdims=True))
    np.testing.assert_allclose(apart, e / e.sum(axis=1, keepdims=True), rtol=1e-5)


@needs_native
def test_vm_batch_after_close_reports_the_unloaded_executable():
    from hal_cpu.programs import compile_program
    from hal_cpu.programs.vm import VmStatusError, load_program
    vmfb = compile_program(MLP, "x86_64").vmfb
    x = np.ones((4, 16), np.float32)
    program = load_program(vmfb, workers=1)
    predict = program.function("predict")
    predict(x)
    predict(x)
    cbs = _command_buffers(predict._fn)
    for _, exe in list(program.hal._executables.values()):
        exe.close()
    with pytest.raises(VmStatusError) as e:
        predict(x)
    assert "unloaded" in str(e.value)
    program.close()
    del cbs


@needs_native
def test_vm_batches_are_bounded_per_module():
    from hal_cpu.programs import compile_program
    from hal_cpu.programs.vm import load_program
    from hal_cpu.programs.vm.hal_module import MAX_BATCHES, batch_of
    vmfb = compile_program(MLP, "x86_64").vmfb
    x = np.ones((4, 16), np.float32)
    with load_program(vmfb, workers=1) as program:
        predict = program.function("predict")
        want = predict(x)[0]
        (cb,) = _command_buffers(predict._fn)
        batch = cb.batch
        cb.batch, cb.batch_of = None, -1
        # the module holds its limit of batches: none is made, and the
        # dispatches run one by one with the same result
        assert batch_of(cb, [MAX_BATCHES]) is None and cb.batch is None
        cb.batch, cb.batch_of = None, len(cb.commands)
        np.testing.assert_array_equal(predict(x)[0], want)
        cb.batch = batch
        np.testing.assert_array_equal(predict(x)[0], want)
