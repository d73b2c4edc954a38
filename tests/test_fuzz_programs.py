"""A short deterministic slice of the program fuzz targets (``python -m fuzz
--target vmfb-run`` and ``--target names``): compiled programs whose
bytecode, function descriptors, names, read-only segments and dispatch and
allocation constants are mutated, loaded and run natively (x86_64,
confined) and emulated (aarch64, riscv64). Every case must end with
results or a typed error: no other exception (traceback), no crash, no
result holding bytes from outside its input buffers (oob), no run past the
time or memory bounds. The mutator's own pieces are checked too: the cases
are deterministic, the seeds' dispatch and allocation constants are
found, and the canary check sees canary bytes in a result."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
#: (target, cases per backend)
SLICES = [("vmfb-run", 16), ("names", 10)]
PROBLEMS = ("escape", "oob", "crash(guest)", "crash(host)", "hang(guest)", "hang", "blowup")


@pytest.fixture(scope="module", params=SLICES, ids=[t for t, _ in SLICES])
def program_report(request, tmp_path_factory):
    target, cases = request.param
    out = tmp_path_factory.mktemp(f"fuzz-{target}")
    report = out / "report.json"
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1")
    proc = subprocess.run(
        [sys.executable, "-m", "fuzz", "--target", target, "--backend", "both",
         "--cases", str(cases), "--seed", "1", "--jobs", "2", "--report", str(report),
         "--out", str(out / "cases"), "--quiet", "--no-minimize"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert report.exists(), proc.stdout + proc.stderr
    return target, cases, json.loads(report.read_text()), proc


def test_slice_runs_both_backends(program_report):
    target, cases, report, _ = program_report
    rows = report["summary"][target]
    assert sorted(rows) == ["emulated", "native"]
    for backend, row in rows.items():
        assert sum(row.values()) == cases, (backend, row)
    arches = {c["arch"] for c in report["cases"]}
    assert "x86_64" in arches and arches & {"aarch64", "riscv64"}, arches
    # the mutations reach both ends: some programs still run, most are refused
    total = {k: sum(r[k] for r in rows.values()) for k in ("accepted", "typed")}
    assert total["accepted"] > 0 and total["typed"] > 0, rows


@pytest.mark.parametrize("column", PROBLEMS)
def test_slice_has_no(program_report, column):
    target, _, report, proc = program_report
    n = sum(row[column] for row in report["summary"][target].values())
    assert n == 0, proc.stdout


def test_cases_are_deterministic_and_mutate_what_they_say():
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    from fuzz import corpus
    c = corpus.Corpus(with_sites=False)
    kinds = set()
    for backend in corpus.BACKENDS:
        for i in range(40):
            a = corpus.make_case(c, 3, backend, i, ("vmfb-run", "names"))
            assert a == corpus.make_case(c, 3, backend, i, ("vmfb-run", "names"))
            data = corpus.case_data(c, a)
            assert data == corpus.case_data(c, a)
            assert data != c.seed(a["seed"]).data, a["mutations"]
            kinds.update(m.split(":", 1)[0] for m in a["mutations"])
            if a["target"] == "names":
                assert all(m.startswith(("name:", "plugin name ")) for m in a["mutations"])
                kinds.add(a["kind"])
    assert {"opcode", "register", "memory", "name", "plugin"} <= kinds, kinds


def test_seeds_expose_dispatch_and_allocation_constants():
    """The constants feeding hal.command_buffer.dispatch (workgroup counts,
    binding offsets and lengths) and the allocations are found in the
    compiled seeds, with the bytecode's other sites."""
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    from fuzz import corpus
    seeds = corpus.Corpus(with_sites=False).run_seeds()
    assert {s.arch for s in seeds} == {"x86_64", "aarch64", "riscv64"}
    roles = {site.role for s in seeds for site in s.model.memory_consts}
    assert "hal.command_buffer.dispatch" in roles, roles
    assert roles & {"hal.device.queue.alloca", "hal.allocator.allocate"}, roles
    assert roles & {"vm.buffer.alloc", "vm.list.alloc", "vm.list.resize"}, roles
    for s in seeds:
        m = s.model
        assert m.opcodes and m.registers and m.descriptors and m.names, s.path
        # each site's bytes hold the value recorded for it
        for site in m.opcodes[:20] + m.registers[:20] + m.memory_consts[:20]:
            assert int.from_bytes(s.data[site.pos:site.pos + site.size],
                                  "little") == site.value, (s.path, site)


def test_canary_check_sees_bytes_from_around_an_input():
    """The positive control of the oob column: bytes read past an input
    (which sits between canary bytes) are seen in a result; the input's own
    bytes are not."""
    import ctypes

    import numpy as np

    from fuzz.vmrun import OutOfBufferRead, check_result, in_canary
    a = in_canary(np.arange(1, 9, dtype=np.float32))
    assert a.ctypes.data % 64 == 0
    check_result("inside", [a.copy(), np.int32(7)])
    for at in (-8, a.nbytes - 4, a.nbytes + 100):
        raw = ctypes.string_at(a.ctypes.data + at, 16)
        with pytest.raises(OutOfBufferRead):
            check_result("past", [np.frombuffer(raw, np.uint8)])


@pytest.mark.parametrize("saved", [
    # a register operand of vm.buffer.hash changed so that its 64-bit result
    # lands in the register the function returns as i32; the conversion of
    # the result raised numpy's OverflowError. A result is now wrapped to
    # its width, as a register's low half reads in IREE's VM.
    "escape-i64-result-as-i32",
    # a call's callee changed so that two functions call each other without
    # end; Python's recursion limit was reached inside a ctypes call, which
    # reports it as ctypes.ArgumentError. It is now RESOURCE_EXHAUSTED, as
    # a RecursionError raised anywhere else in a call is.
    "escape-recursion-in-ctypes-argument"])
def test_saved_escape_case_now_ends_in_a_result_or_typed_error(saved):
    """A saved escape of ``fuzz/cases`` now ends in a result or a typed
    error."""
    case = ROOT / "fuzz" / "cases" / f"{saved}.bin"
    proc = subprocess.run([sys.executable, "-m", "fuzz", "--replay", str(case)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    now = [line for line in proc.stdout.splitlines() if line.startswith("now:")]
    assert len(now) == 1, proc.stdout + proc.stderr
    assert now[0].split()[1] in ("accepted", "typed"), now[0]
