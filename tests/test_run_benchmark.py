"""``hal-cpu run --benchmark_repetitions / --benchmark_min_time``: the
repetitions run in one interruptible region, each a plain
``Executable.dispatch`` call; time limit and Ctrl-C cover the whole run."""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import time

import pytest

import elfloader
from hal_cpu import cli, interrupt
from hal_cpu.cli import executables
from hal_cpu.library import Executable

from conftest import ROOT

SAMPLES = ROOT / "hal_cpu" / "samples"
HOST = elfloader.arch.host()
SUM_LAST = ["--entry_point=0", "--workgroup_count=9,1,1",
            "--binding=9x129xf32=1", "--binding=9xf32", "--print_bindings=none"]
LINE = re.compile(r"dispatch time \((?P<where>[^)]*), (?P<n>\d+) repetitions\): "
                  r"min (?P<min>[\d.]+) us, median (?P<median>[\d.]+) us, "
                  r"mean (?P<mean>[\d.]+) us$")

needs_host = pytest.mark.skipif(
    HOST is None or not (SAMPLES / f"sum_last_{HOST.name}.so").exists(),
    reason="no bundled sample for this host")


def hal_cpu(*args):
    return subprocess.run([sys.executable, "-m", "hal_cpu", *map(str, args)],
                          capture_output=True, text=True, cwd=ROOT)


def _line(stdout: str) -> re.Match:
    match = LINE.match(stdout.strip().splitlines()[-1])
    assert match, stdout
    low, mid = float(match["min"]), float(match["median"])
    assert 0 < low <= mid and float(match["mean"]) >= low
    return match


@pytest.mark.parametrize("text, value", [
    ("0.5", (0.5, 0)), ("0.5s", (0.5, 0)), ("2s", (2.0, 0)), ("1e-3", (1e-3, 0)),
    ("100x", (0.0, 100)), ("1x", (0.0, 1))])
def test_min_time_forms(text, value):
    assert executables._min_time(text) == value


@pytest.mark.parametrize("text", ["0", "0s", "-1", "nan", "inf", "1e9", "s",
                                  "x", "0x", "-3x", "1.5x", "abc", "",
                                  f"{executables.MAX_REPETITIONS + 1}x"])
def test_min_time_rejects(text):
    with pytest.raises(argparse.ArgumentTypeError):
        executables._min_time(text)


@pytest.fixture
def sample():
    if HOST is None or not (SAMPLES / f"sum_last_{HOST.name}.so").exists():
        pytest.skip("no bundled sample for this host")
    return SAMPLES / f"sum_last_{HOST.name}.so"


def test_repetitions_are_plain_dispatch_calls(sample, monkeypatch, capsys):
    """In-process: one interruptible region for the first dispatch and one
    for all repetitions; each repetition calls Executable.dispatch as the
    Python API does (no progress callback, no time limit)."""
    calls, regions = [], []
    dispatch, run = Executable.dispatch, interrupt.run_interruptible

    def spy(self, *args, **kwargs):
        calls.append(kwargs)
        return dispatch(self, *args, **kwargs)

    def region(fn, stop):
        regions.append(fn)
        return run(fn, stop)
    monkeypatch.setattr(Executable, "dispatch", spy)
    monkeypatch.setattr(interrupt, "run_interruptible", region)
    assert cli.main(["run", str(sample), *SUM_LAST, "--no_isolate",
                     "--benchmark_repetitions=25"]) == 0
    match = _line(capsys.readouterr().out)
    assert match["n"] == "25" and "native" in match["where"]
    assert len(regions) == 2 and len(calls) == 26
    assert calls[0]["progress"] is not None
    assert all(c == {"workers": None} for c in calls[1:])


def test_timeout_bounds_each_repetition(sample, monkeypatch, capsys):
    """With --timeout, every repetition gets what is left of the limit."""
    limits = []
    dispatch = Executable.dispatch

    def spy(self, *args, **kwargs):
        limits.append(kwargs.get("timeout"))
        return dispatch(self, *args, **kwargs)
    monkeypatch.setattr(Executable, "dispatch", spy)
    assert cli.main(["run", str(sample), *SUM_LAST, "--no_isolate",
                     "--timeout=30", "--benchmark_min_time=5x"]) == 0
    assert _line(capsys.readouterr().out)["n"] == "5"
    assert len(limits) == 6
    assert all(0 < t <= 30 for t in limits)
    assert limits[1:] == sorted(limits[1:], reverse=True)


@pytest.mark.parametrize("isolate", ["--isolate", "--no_isolate"])
def test_min_time_runs_for_that_long(sample, isolate):
    start = time.monotonic()
    proc = hal_cpu("run", sample, *SUM_LAST, isolate,
                   "--benchmark_min_time=0.3s")
    assert proc.returncode == 0, proc.stderr
    assert time.monotonic() - start >= 0.3
    assert int(_line(proc.stdout)["n"]) > 1


def test_count_forms_combine(sample):
    """--benchmark_min_time=Nx is a count; with --benchmark_repetitions the
    larger count is run."""
    for flags, n in ((["--benchmark_min_time=7x"], "7"),
                     (["--benchmark_min_time=7x", "--benchmark_repetitions=3"], "7"),
                     (["--benchmark-min-time=2x", "--benchmark_repetitions=9"], "9")):
        proc = hal_cpu("run", sample, *SUM_LAST, *flags)
        assert proc.returncode == 0, proc.stderr
        assert _line(proc.stdout)["n"] == n


@pytest.mark.parametrize("backend", ["native", "emulated"])
def test_time_limit_covers_the_repetitions(backend):
    """--timeout bounds the whole command, repetitions included."""
    arch = HOST.name if backend == "native" and HOST is not None else "riscv64"
    sample = SAMPLES / f"sum_last_{arch}.so"
    start = time.monotonic()
    proc = hal_cpu("run", sample, *SUM_LAST, f"--backend={backend}",
                   "--timeout=1", "--benchmark_min_time=60s")
    assert time.monotonic() - start < 20
    assert proc.returncode == 1
    # (an emulated call may be the one the limit stops)
    assert "time limit" in proc.stderr, proc.stderr
    if backend == "native":
        assert "the time limit of 1 s passed after" in proc.stderr


@pytest.mark.parametrize("isolate", ["--isolate", "--no_isolate"])
def test_interrupt_stops_the_repetitions(sample, isolate):
    proc = subprocess.Popen(
        [sys.executable, "-m", "hal_cpu", "run", str(sample), *SUM_LAST,
         isolate, "--benchmark_min_time=120s"], cwd=ROOT,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.default_int_handler))
    try:
        time.sleep(2.0)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 130, err
    assert err == "hal-cpu: interrupted\n"
