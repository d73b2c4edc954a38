"""Deterministic instruction counts of the kernel's own code
(hal_cpu.workbench, the qemu engine's TCG plugin): per workgroup, the same
across runs and worker counts, different at two vector lengths for
vector-length-agnostic code; the JSON of hal-cpu run --count_instructions."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import requires

PLUGINS = Path(__file__).parent / "plugins"
ARCHES = ("aarch64", "riscv64", "arm32", "x86_64")
GRID = (7, 2, 1)
N = 64 * 4


def _build(tmp_path_factory, stem: str, arches, cpu=None) -> Path:
    pytest.importorskip("ziglang")
    import fatelf
    from hal_cpu.buildtools import zig as zigbuild
    work = tmp_path_factory.mktemp(stem)
    objects = [zigbuild.build_freestanding(
        "planted_bugs.c", arch, cwd=PLUGINS, work_dir=work, cpu=cpu,
        exports=["iree_hal_executable_library_query"], debug=True)
        for arch in arches]
    path = work / f"{stem}.sos"
    path.write_bytes(fatelf.join(objects, names=[f"{stem}_{a}.so"
                                                 for a in arches]))
    return path


@pytest.fixture(scope="module")
def planted(tmp_path_factory) -> Path:
    return _build(tmp_path_factory, "planted_counts", ARCHES)


def count(library: Path, arch: str, case: int = 0, workers: int = 1,
          grid=GRID, n: int = N, **options):
    """The counts report of one dispatch of ``planted``."""
    from hal_cpu import Executable, workbench
    with workbench.Session(count=True) as wb:
        with Executable(library, arch=arch, backend="emulated",
                        engine="qemu", timeout=60, **options) as exe:
            exe.dispatch("planted", grid,
                         [np.arange(n, dtype=np.float32),
                          np.zeros(n, np.float32), np.zeros(n, np.float32)],
                         [case], workers=workers)
    assert len(wb.reports) == 1
    return wb.reports[0]


@requires("qemu-user")
@pytest.mark.parametrize("arch", ARCHES)
def test_counts_are_the_same_across_runs_and_workers(planted, arch):
    one = count(planted, arch)
    again = count(planted, arch)
    shared = count(planted, arch, workers=3)
    assert one.counts == again.counts == shared.counts
    assert len(one.counts) == GRID[0] * GRID[1]
    assert all(c > 0 for c in one.counts.values())
    assert one.total == sum(one.counts.values())
    data = one.counts_json()
    assert data["total"] == one.total and data["arch"] == arch
    assert [w[:3] for w in data["workgroups"]] == [
        [x, y, 0] for y in range(GRID[1]) for x in range(GRID[0])]


@requires("qemu-user")
def test_counts_follow_the_work(planted):
    """A workgroup doing the whole loop counts more than the others, which
    count the same."""
    report = count(planted, "riscv64", case=6, grid=(7, 1, 1))
    first = report.counts.pop((0, 0, 0))
    rest = set(report.counts.values())
    assert len(rest) == 1 and first > rest.pop()


@requires("qemu-user")
@pytest.mark.parametrize("arch, cpu, vlens", [
    ("aarch64", "sve", (128, 512)), ("riscv64", "rv64gcv", (128, 512))])
def test_vector_length_agnostic_code_counts_differ(tmp_path_factory, arch,
                                                   cpu, vlens):
    library = _build(tmp_path_factory, f"planted_{cpu}", (arch,), cpu=cpu)
    reports = [count(library, arch, case=6, grid=(1, 1, 1), n=1000, cpu=cpu,
                     vlen=v) for v in vlens]
    assert [r.vector_length for r in reports] == list(vlens)
    assert all(r.profile == cpu for r in reports)
    # the longer vector takes fewer iterations
    assert reports[0].total > reports[1].total > 0
    again = count(library, arch, case=6, grid=(1, 1, 1), n=1000, cpu=cpu,
                  vlen=vlens[0])
    assert again.counts == reports[0].counts


@requires("qemu-user")
def test_cli_writes_the_counts_json(planted, tmp_path):
    out = tmp_path / "counts.json"
    got = subprocess.run(
        [sys.executable, "-m", "hal_cpu", "run", str(planted), "--arch",
         "aarch64", "--function", "planted", "--workgroup_count", "3,1,1",
         "--binding", "12xf32=1", "--binding", "12xf32=0", "--binding",
         "12xf32=0", "--constant", "0", f"--count_instructions={out}"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert got.returncode == 0, got.stderr
    data = json.loads(out.read_text())
    assert set(data) == {"total", "workgroups", "arch", "profile",
                         "vector_length"}
    assert data["arch"] == "aarch64"
    assert [w[:3] for w in data["workgroups"]] == [[x, 0, 0] for x in range(3)]
    assert data["total"] == sum(w[3] for w in data["workgroups"]) > 0
    # the same dispatch in Python counts the same
    report = count(planted, "aarch64", grid=(3, 1, 1), n=12)
    assert report.counts_json()["workgroups"] == data["workgroups"]


@requires("qemu-user")
def test_profiles_sweeps_vector_lengths(tmp_path_factory, tmp_path):
    """hal-cpu profiles --sweep runs the command per vector length of the
    profile and prints a table (and a plot with matplotlib)."""
    library = _build(tmp_path_factory, "planted_rvv", ("riscv64",),
                     cpu="rv64gcv")
    plot = tmp_path / "sweep.png"
    got = subprocess.run(
        [sys.executable, "-m", "hal_cpu", "profiles", "--sweep", "rv64gcv",
         f"--plot={plot}", "--", "run", str(library), "--function", "planted",
         "--binding", "1000xf32=1", "--binding", "1000xf32=0", "--binding",
         "1000xf32=0", "--constant", "6"],
        cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert got.returncode == 0, got.stderr
    lines = got.stdout.strip().splitlines()
    assert lines[0].split() == ["vector", "length", "(bits)", "instructions"]
    from fatelf import arches
    vlens = sorted(next(p for p in arches.PROFILES
                        if p.name == "rv64gcv").vlens)
    rows = [tuple(int(v) for v in line.split()) for line in lines[1:]]
    assert [r[0] for r in rows] == vlens
    # each vector length's count is what a single counted run gives
    for vlen, total in rows[:2]:
        assert count(library, "riscv64", case=6, grid=(1, 1, 1), n=1000,
                     cpu="rv64gcv", vlen=vlen).total == total
    assert rows[0][1] > rows[-1][1]
    pytest.importorskip("matplotlib")
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_sweep_of_a_fixed_width_profile_is_refused(tmp_path):
    got = subprocess.run(
        [sys.executable, "-m", "hal_cpu", "profiles", "--sweep", "armv8-a",
         "--", "run", "x.so", "--function", "f"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert got.returncode == 1
    assert "armv8-a has no scalable vectors to sweep" in got.stderr
    assert "Traceback" not in got.stderr


def test_tcg_plugin_rebuilds_byte_identically(tmp_path):
    """The committed tcg_plugin.sos is what workbench.c builds (python -m
    elfloader.backend.emulated.tcg_plugin.build)."""
    pytest.importorskip("ziglang")
    from elfloader.backend.emulated.tcg_plugin import BUNDLE, build
    rebuilt = build.build(tmp_path)
    assert rebuilt.read_bytes() == Path(BUNDLE).read_bytes(), (
        "tcg_plugin.sos is not what workbench.c builds: run python -m "
        "elfloader.backend.emulated.tcg_plugin.build")
