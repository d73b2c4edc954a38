"""A short deterministic slice of the fuzz harness (``python -m fuzz``):
mutated executables, plugins and FatELF bundles (also dispatched from threads
while closed, and given as FIFOs, devices, sparse files), on both backends, must be
accepted or rejected with a typed error. No other exception may escape, no
case may hang or exceed the memory and CPU limits, and the only crashes
allowed are native ones inside the file's own code (initializers, query,
dispatch, resolve, finalizers), which no verifier can judge: each is
recorded with its stage."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SLICE = ["--cases", "100", "--seed", "1", "--backend", "both", "--target", "all",
         "--jobs", "2"]


@pytest.fixture(scope="module")
def slice_report(tmp_path_factory):
    out = tmp_path_factory.mktemp("fuzz-slice")
    report = out / "report.json"
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1")
    proc = subprocess.run(
        [sys.executable, "-m", "fuzz", *SLICE, "--report", str(report),
         "--out", str(out / "cases"), "--quiet"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert report.exists(), proc.stdout + proc.stderr
    return json.loads(report.read_text()), proc


def _totals(summary: dict) -> dict:
    out: dict[str, int] = {}
    for per in summary.values():
        for row in per.values():
            for k, v in row.items():
                out[k] = out.get(k, 0) + v
    return out


def test_slice_covers_every_target_and_backend(slice_report):
    report, _ = slice_report
    summary = report["summary"]
    assert sorted(summary) == ["elf", "fatelf", "files", "plugin", "threads"]
    for target, per in summary.items():
        assert sorted(per) == ["emulated", "native"], target
    assert sum(_totals(summary).values()) == 200
    # the mutations reach every stage: some files still load, most are refused
    totals = _totals(summary)
    assert totals["accepted"] > 0 and totals["typed"] > 0


@pytest.mark.parametrize("column", ["escape", "crash(host)", "hang", "hang(guest)", "blowup"])
def test_slice_has_no(slice_report, column):
    report, proc = slice_report
    assert _totals(report["summary"])[column] == 0, proc.stdout


def test_slice_crashes_only_in_native_guest_code(slice_report):
    report, proc = slice_report
    assert report["problem_count"] == 0, proc.stdout
    guest = [c for c in report["cases"] if c["column"] in ("crash(guest)", "hang(guest)")]
    for case in guest:
        assert case["backend"] == "native", case
        assert case["stage"].split("/")[0] in (
            "init", "query", "dispatch", "resolve", "close"), case
        # inside a call of the file's code, or after one when the same file
        # is clean on the emulated backend
        assert case["in_guest"] or case.get("emulated_replay") in ("accepted", "typed"), case
    assert proc.returncode == 0, proc.stdout


def test_cases_are_deterministic():
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    from fuzz import corpus
    c = corpus.Corpus()
    for backend in corpus.BACKENDS:
        for i in range(30):
            a = corpus.make_case(c, 1, backend, i, corpus.TARGETS)
            b = corpus.make_case(c, 1, backend, i, corpus.TARGETS)
            assert a == b
            assert corpus.case_data(c, a) == corpus.case_data(c, b)
