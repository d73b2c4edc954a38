"""A read past the end that depends on the vector length is caught by the
pytest fixtures' default placement: tests/plugins/vector_overread.c sums a
float array with whole SVE / RVV vectors (built for the sve and rv64gcv
profiles), so with 101 elements it reads 3 to 27 floats past the end
depending on the vector length. Flush against its guard page (the
default), the array's first byte past the end faults at every vector
length, on the qemu engine, with a report naming the array and counting
the overrun in floats; padded as IREE pads buffers (64 bytes), the reads
of VL 128 and 512 land in the padding and go unseen.

On x86 with FMA (x86-64-v3, haswell) the same plugin's scalar code reads
with ``vfmadd231ss``, whose 4-byte operand qemu-user 7.2 loads as 16
bytes: the arrays keep 12 bytes after their end, so the correct sum passes
and the overread is still caught, counted from the operand."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from elfloader.backend.emulated import choice
from fatelf import arches

ROOT = Path(__file__).resolve().parent.parent
SOURCE = ROOT / "tests" / "plugins" / "vector_overread.c"
ON_CI = os.environ.get("CI", "").lower() == "true"

#: The profile each vector architecture's record is built for, and the
#: vector lengths tested (the smallest, one in the middle, the largest).
VECTOR_CPUS = {"aarch64": "sve", "riscv64": "rv64gcv"}
LENGTHS = {"aarch64": (128, 256, 512, 1024, 2048), "riscv64": (128, 256, 512, 1024)}
#: x86 profiles with FMA: the scalar code's multiply-adds read memory.
FMA_CPUS = {"x86_64": "x86-64-v3", "x86_32": "haswell"}
#: Elements in the array: a multiple of no vector's lane count.
N = 101
#: Where padded arrays end: IREE's 64-byte alignment.
PADDED_BYTES = -(-4 * N // 64) * 64

INNER_TESTS = '''
import numpy as np
from fatelf.cstruct import CStruct

SOS = {sos!r}
#: vector_overread.c, sum_params_t
PARAMS = CStruct("sum_params_t", [("src", "ptr"), ("dst", "ptr"), ("n", "size"),
                                  ("scale", "f32")])
N = {n}


def call(hal_plugin, name, padded=None):
    plugin = hal_plugin(SOS)
    x = np.arange(N, dtype=np.float32)
    src = plugin.array(x, padded=padded)
    total = plugin.zeros(1, np.float32)
    status = plugin.call(name, PARAMS, dict(src=src, dst=total, n=N,
                                            scale=1.0))
    return plugin.read(total)[0], status, x


def test_sum_ok(hal_plugin):
    total, status, x = call(hal_plugin, "vector_sum_ok")
    assert status == 0 and total == x.sum()


def test_sum_overread(hal_plugin):
    call(hal_plugin, "vector_sum_overread")


def test_sum_overread_padded(hal_plugin):
    assert call(hal_plugin, "vector_sum_overread", padded=True)[1] == 0
'''


def _need_qemu() -> None:
    missing = [choice.QEMU_PROGRAMS[a] for a in {**VECTOR_CPUS, **FMA_CPUS}
               if choice.qemu_program(a) is None]
    if missing:
        if ON_CI:
            pytest.fail(f"{', '.join(missing)} missing on CI")
        pytest.skip(f"the vector profiles run on the qemu engine: "
                    f"{', '.join(missing)} not installed")


def _build(tmp_path_factory, cpus: dict) -> Path:
    pytest.importorskip("ziglang")
    from hal_cpu.buildtools import zig as zigbuild
    out = tmp_path_factory.mktemp("overread") / "overread.sos"
    out.write_bytes(zigbuild.build_plugin([SOURCE], "all", debug=True,
                                          cpu=cpus))
    return out


@pytest.fixture(scope="module")
def overread_sos(tmp_path_factory) -> Path:
    """vector_overread.c for the six architectures with -g: SVE on aarch64,
    RVV on riscv64, scalar code for each architecture's default CPU
    elsewhere."""
    return _build(tmp_path_factory, VECTOR_CPUS)


@pytest.fixture(scope="module")
def profile_sos(tmp_path_factory) -> Path:
    """The same with x86 built for FMA (x86-64-v3, haswell)."""
    return _build(tmp_path_factory, {**VECTOR_CPUS, **FMA_CPUS})


def inner_session(tmp_path: Path, sos: Path, *args: str):
    """(exit status, {test id: (outcome, failure text)}, output)."""
    tests = tmp_path / "test_overread.py"
    tests.write_text(INNER_TESTS.format(sos=str(sos), n=N))
    xml = tmp_path / "out.xml"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)
                       if p]))
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q",
         f"--junitxml={xml}", "--rootdir", str(tmp_path), str(tests), *args],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    results = {}
    for case in ET.parse(xml).iter("testcase"):
        failure = case.find("failure")
        results[case.get("name")] = (("passed", "") if failure is None
                                     else ("failed", failure.text or ""))
    return proc.returncode, results, proc.stdout + proc.stderr


def _load_line(arch: str) -> int:
    """The source line of the whole-vector load of ``arch``'s code."""
    marked = [i for i, line in enumerate(SOURCE.read_text().splitlines(), 1)
              if "/* the whole vector */" in line]
    return marked[0 if arch == "aarch64" else 1]


OVERRUN = re.compile(
    rf"  overrun:      src \(float32\[{N}\], {4 * N} bytes\): the "
    rf"(\d+-byte )?access reached element {N}, 1 float past the end"
    r"( \(its operand: qemu-user loads 12 bytes past it, up to the data "
    r"address\))?")


def _check_caught(text: str, arch: str, vlen: int | None,
                  cpu: str | None = None) -> None:
    lines = text.splitlines()
    assert lines[0].startswith("BindingOverrunError: "), text
    # (the record of the profile when one is given: overread.sos[aarch64:sve])
    record = f"{arch}:{cpu}" if cpu else arch
    assert (f"overread.sos[{record}]: {arch}: import vector_sum_overread: "
            "read from unreadable memory") in lines[0], lines[0]
    assert "sum_overread+0x" in lines[1]
    fma = arch in FMA_CPUS and cpu == FMA_CPUS[arch]
    past = 13 if fma else 1      # qemu's 16-byte load of a 4-byte operand
    assert (f"(src at offset {4 * N + past - 1} of {4 * N} bytes ({past} past "
            "the end, guard page))") in text, text
    # the array named, the overrun counted in its elements
    overrun = [OVERRUN.fullmatch(l) for l in lines if l.startswith("  overrun:")]
    assert len(overrun) == 1 and overrun[0], text
    assert bool(overrun[0][2]) == fma, text
    if fma:
        assert "vfmadd231ss" in next(l for l in lines
                                     if l.startswith("  instruction:"))
    source = next(l for l in lines if l.startswith("  source:"))
    if vlen is not None:
        assert source.endswith(f"vector_overread.c:{_load_line(arch)}"), source
        emulator = next(l for l in lines if l.startswith("  emulator:"))
        assert (f"qemu ({VECTOR_CPUS[arch]}, vector length {vlen} bits"
                in emulator), emulator
    else:
        assert "vector_overread.c:" in source or "no line information" in source
    assert "Traceback" not in text


def test_vector_length_dependent_overread_is_caught_by_default(tmp_path,
                                                               profile_sos):
    _need_qemu()
    profiles = [f"--hal-cpu={VECTOR_CPUS[a]}:vlen={','.join(map(str, v))}"
                for a, v in LENGTHS.items()]
    profiles += [f"--hal-cpu={cpu}" for cpu in FMA_CPUS.values()]
    status, results, output = inner_session(
        tmp_path, profile_sos, "--hal-engine=qemu",
        f"--hal-arch={','.join([*VECTOR_CPUS, *FMA_CPUS])}", *profiles)
    assert status == 1, output
    assert len(results) == 3 * (sum(map(len, LENGTHS.values()))
                                + len(FMA_CPUS)), output
    for arch, lengths in LENGTHS.items():
        for vlen in lengths:
            tid = f"{arch}-{VECTOR_CPUS[arch]}-vlen{vlen}"
            assert results[f"test_sum_ok[{tid}]"] == ("passed", ""), (
                tid, results[f"test_sum_ok[{tid}]"])
            outcome, text = results[f"test_sum_overread[{tid}]"]
            assert outcome == "failed", (tid, output)
            _check_caught(text, arch, vlen, VECTOR_CPUS[arch])
            # padded (IREE's 64 bytes): caught only where whole vectors
            # reach past the padding
            lanes = vlen // 32
            reads = 4 * (-(-N // lanes) * lanes)
            outcome, text = results[f"test_sum_overread_padded[{tid}]"]
            if reads <= PADDED_BYTES:
                assert outcome == "passed", (tid, text)
            else:
                assert outcome == "failed", tid
                assert text.startswith("BindingOverrunError: "), text
    # VL 512 reads only the padding
    assert results["test_sum_overread_padded[aarch64-sve-vlen512]"][0] == "passed"
    assert results["test_sum_overread_padded[riscv64-rv64gcv-vlen512]"][0] == "passed"
    # x86 with FMA: the correct sum passes, the overread is caught
    for arch, cpu in FMA_CPUS.items():
        tid = f"{arch}-{cpu}"
        assert results[f"test_sum_ok[{tid}]"] == ("passed", ""), (
            tid, results[f"test_sum_ok[{tid}]"])
        outcome, text = results[f"test_sum_overread[{tid}]"]
        assert outcome == "failed", (tid, output)
        _check_caught(text, arch, None, cpu)
        assert results[f"test_sum_overread_padded[{tid}]"] == ("passed", "")


def test_scalar_overread_is_caught_on_six_architectures(tmp_path, overread_sos):
    """The same import at every architecture's default CPU (4 lanes of
    scalar code on the four without SVE or RVV). The bundle's aarch64 and
    riscv64 code is SVE and RVV, which only the qemu engine runs: the
    engine is named, so that ``PKR_ENGINE=unicorn`` does not pick it."""
    _need_qemu()
    status, results, output = inner_session(tmp_path, overread_sos, "--hal-engine=qemu",
                                            "-k", "test_sum_overread and not padded")
    assert status == 1, output
    assert len(results) == len(arches.RUNTIME_ARCHES), output
    for arch in arches.RUNTIME_ARCHES:
        outcome, text = results[f"test_sum_overread[{arch}]"]
        assert outcome == "failed", (arch, output)
        _check_caught(text, arch, None)
