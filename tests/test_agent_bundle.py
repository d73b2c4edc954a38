"""The qemu engine's guest agents (elfloader/backend/emulated/agent): the
committed ``agent.sos`` holds one static program per runtime architecture
and is what ``agent.c`` and ``build.py`` produce.

A full rebuild compiles musl for six targets (minutes on a cold zig
cache), so the suite rebuilds one architecture's agent and compares it
with that record byte for byte, and checks that packing the committed
records as ``build.build`` does gives the committed bundle.
"""

from __future__ import annotations

import pytest

import fatelf
from elfloader.backend.emulated.agent import build
from fatelf import arches
from hal_cpu.buildtools import zig as zigbuild

#: The architecture whose agent the suite rebuilds: the target with the
#: most particular flags (RV32IMA with the soft-float ABI).
REBUILT = "riscv32"


def _bundle() -> fatelf.FatElf:
    return fatelf.FatElf.parse(build.BUNDLE.read_bytes(), str(build.BUNDLE))


def test_bundle_holds_the_runtime_architectures():
    bundle = _bundle()
    assert sorted(bundle.arches) == sorted(arches.RUNTIME_ARCHES) == sorted(build.TARGETS)
    assert not bundle.trailer


def test_bundle_is_its_records_packed():
    bundle = _bundle()
    singles = {a: bundle.payload(bundle.find(a)) for a in build.TARGETS}
    packed = fatelf.join(list(singles.values()), names=[f"agent_{a}" for a in singles])
    assert packed == build.BUNDLE.read_bytes()


@pytest.mark.skipif(not zigbuild.zig_available(), reason="ziglang not importable")
def test_agent_rebuilds_byte_identically(tmp_path):
    if zigbuild.zig_version() != zigbuild.ZIG_VERSION:
        pytest.skip(f"ziglang {zigbuild.zig_version()} is not {zigbuild.ZIG_VERSION}")
    # (zig's cache is shared with the other builds: musl, compiled once per
    # target, is most of a cold build's time)
    built = build.build_one(REBUILT, tmp_path)
    bundle = _bundle()
    assert built == bundle.payload(bundle.find(REBUILT)), (
        f"agent.sos's {REBUILT} record is not what agent.c builds: run "
        f"python -m elfloader.backend.emulated.agent.build")
