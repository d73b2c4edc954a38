"""``hal-cpu build-plugin`` builds vector bundles: a CPU profile per
architecture (``--cpu=x86_64:x86-64-v3,aarch64:sve,riscv64:rv64gcv``, or
bare profile names), several profiles of one architecture as records of
their own (the first the default every loader picks, the others picked by
profile), and ``-o x.so`` for one architecture writes the ELF itself."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

import fatelf
from elfloader.backend.emulated import qemu_program
from fatelf.cstruct import CStruct

from conftest import ROOT

pytest.importorskip("ziglang")

from hal_cpu.buildtools import zig as zigbuild  # noqa: E402

SOURCE = ROOT / "sample_plugins" / "tutorial" / "scale_plugin.c"
SCALE_PARAMS = CStruct("scale_params_t", [
    ("in", "ptr"), ("out", "ptr"), ("n", "size"), ("factor", "f32")])


def hal_cpu(*args, check=True):
    proc = subprocess.run([sys.executable, "-m", "hal_cpu", *map(str, args)],
                          capture_output=True, text=True, cwd=ROOT)
    if check:
        assert proc.returncode == 0, proc.stderr
    return proc


def test_one_profile_per_architecture(tmp_path):
    out = tmp_path / "v.sos"
    proc = hal_cpu("build-plugin", SOURCE, "-o", out,
                   "--cpu=x86_64:x86-64-v3,aarch64:sve,riscv64:rv64gcv")
    assert proc.stdout.startswith(f"{out}: ")
    assert "FatELF, x86_64:x86-64-v3, aarch64:sve, riscv64:rv64gcv, x86_32, " \
           "arm32, riscv32" in proc.stdout
    found = dict(zigbuild.bundle_profiles(out.read_bytes()))
    assert found == {"x86_64": "x86-64-v3", "aarch64": "sve", "riscv64": "rv64gcv",
                     "x86_32": None, "arm32": None, "riscv32": None}
    # bare names apply to their own architecture; the same bundle
    again = tmp_path / "w.sos"
    hal_cpu("build-plugin", SOURCE, "-o", again, "--cpu=x86-64-v3,sve,rv64gcv")
    assert again.read_bytes() == out.read_bytes()
    # the Python API's mapping gives the same bytes too
    data = zigbuild.build_plugin([SOURCE], "all", cpu={
        "x86_64": "x86-64-v3", "arm64": "sve", "riscv64": "rv64gcv"})
    assert data == out.read_bytes()


@pytest.fixture(scope="module")
def two_profiles(tmp_path_factory):
    """aarch64 baseline and SVE, x86_64 baseline and x86-64-v3, as records."""
    out = tmp_path_factory.mktemp("profiles") / "two.sos"
    proc = hal_cpu("build-plugin", SOURCE, "-g", "-o", out, "--arch=arm64,x86_64",
                   "--cpu=aarch64:armv8-a,aarch64:sve,x86-64,x86-64-v3")
    assert ("FatELF, aarch64:armv8-a, aarch64:sve, x86_64:x86-64, "
            "x86_64:x86-64-v3") in proc.stdout
    return out


def test_several_profiles_per_architecture_are_records(two_profiles):
    data = two_profiles.read_bytes()
    bundle = fatelf.read(two_profiles)
    assert [(r.arch, r.osabi_version) for r in bundle.records] == [
        ("x86_64", 0), ("x86_64", 1), ("aarch64", 0), ("aarch64", 1)]
    assert zigbuild.bundle_profiles(data) == [
        ("x86_64", "x86-64"), ("x86_64", "x86-64-v3"),
        ("aarch64", "armv8-a"), ("aarch64", "sve")]
    # what every loader picks (IREE's takes the first record of the
    # architecture): the first profile given
    assert zigbuild.profile_of(fatelf.select(data, "aarch64")) == "armv8-a"
    # picked by profile; an unknown one falls back to that default
    for cpu, want in (("sve", "sve"), ("SVE", "sve"), ("armv8-a", "armv8-a"),
                      (None, "armv8-a"), ("sve2", "armv8-a")):
        elf, got = zigbuild.select_profile(data, "arm64", cpu)
        assert got == want and zigbuild.profile_of(elf) == want
    elf, got = zigbuild.select_profile(data, "x86_64", "x86-64-v3")
    assert got == "x86-64-v3" and elf[zigbuild.EI_ABIVERSION] == 1
    image = zigbuild.profile_image(two_profiles, "aarch64", "sve")
    assert image.name == f"{two_profiles}[aarch64:sve]"
    with pytest.raises(fatelf.FatElfError, match="no record for riscv64"):
        zigbuild.select_profile(data, "riscv64", "rv64gcv")


@pytest.mark.parametrize("cpu, engine", [
    ("armv8-a", "unicorn"),
    pytest.param("sve", "qemu", marks=pytest.mark.skipif(
        not qemu_program("aarch64"), reason="qemu-aarch64 runs SVE")),
])
def test_the_record_of_a_profile_runs_on_it(two_profiles, cpu, engine):
    """The record picked for a profile loads and computes on a CPU of that
    profile, and reports name the file, the architecture and the profile."""
    from hal_cpu.plugins import PluginManager
    image = zigbuild.profile_image(two_profiles, "aarch64", cpu)
    with PluginManager("aarch64", "emulated", engine=engine, cpu=cpu) as manager:
        plugin = manager.register_embedded(image)
        assert plugin.name == "scale"
        assert manager.plugins[-1].module.name == f"{two_profiles}[aarch64:{cpu}]"
        be = manager.backend
        (fn,), (ctx,) = manager.resolve(["scale_f32"])
        x = np.linspace(-1, 1, 37, dtype=np.float32)
        src, dst, params = be.alloc(x.nbytes), be.alloc(x.nbytes), be.alloc(64)
        be.write(src, x.tobytes())
        be.write(params, SCALE_PARAMS.layout(*be.arch.c_abi).pack(
            **{"in": src, "out": dst, "n": x.size,
               "factor": 0.5}))
        assert be.call(fn, params, ctx, 0) == 0
        got = np.frombuffer(be.read(dst, x.nbytes), np.float32)
        np.testing.assert_array_equal(got, x * np.float32(0.5))


def test_so_output_for_one_architecture_is_an_elf(tmp_path):
    so = tmp_path / "scale.so"
    proc = hal_cpu("build-plugin", SOURCE, "--arch=riscv64", "-o", so)
    assert proc.stdout == f"{so}: {so.stat().st_size} bytes, ELF, riscv64\n"
    data = so.read_bytes()
    assert data[:4] == b"\x7fELF" and not fatelf.is_fatelf(data)
    zigbuild.check_self_contained(data, "riscv64", exports=[zigbuild.PLUGIN_QUERY])
    # with a profile: the ELF records it
    hal_cpu("build-plugin", SOURCE, "--arch=riscv64", "--cpu=rv64gcv", "-o", so)
    assert zigbuild.profile_of(so.read_bytes()) == "rv64gcv"
    assert zigbuild.bundle_profiles(so.read_bytes()) == [("riscv64", "rv64gcv")]
    # a .sos for one architecture is still a bundle
    sos = tmp_path / "scale.sos"
    hal_cpu("build-plugin", SOURCE, "--arch=riscv64", "-o", sos)
    assert fatelf.is_fatelf(sos.read_bytes())


@pytest.mark.parametrize("args, message", [
    (["--arch=x86_64,aarch64", "-o", "{tmp}/two.so"],
     "a .so holds one ELF; this build has 2 records (x86_64, aarch64): name the "
     "output .sos for a FatELF bundle, or build one architecture and one profile"),
    (["--arch=aarch64", "--cpu=aarch64:armv8-a,aarch64:sve", "-o", "{tmp}/two.so"],
     "this build has 2 records (aarch64:armv8-a, aarch64:sve)"),
    (["--arch=x86_64", "--cpu=sve", "-o", "{tmp}/x.sos"],
     "sve is a CPU profile of aarch64, which is not among the architectures "
     "built (x86_64)"),
    (["--cpu=avx9000", "-o", "{tmp}/x.sos"], "unknown CPU profile 'avx9000'"),
    (["--cpu=riscv64:sve", "-o", "{tmp}/x.sos"], "no CPU profile 'sve' for riscv64"),
    (["--cpu=mips:x", "-o", "{tmp}/x.sos"], "mips"),
])
def test_bad_builds_are_one_line(tmp_path, args, message):
    proc = hal_cpu("build-plugin", SOURCE,
                   *[a.format(tmp=tmp_path) for a in args], check=False)
    assert proc.returncode == 1 and proc.stdout == ""
    assert len(proc.stderr.splitlines()) == 1 and message in proc.stderr, proc.stderr
    assert not list(tmp_path.iterdir())
