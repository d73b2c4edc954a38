"""``hal-cpu debug``: a real dispatch under qemu-user's gdb stub and
gdb-multiarch, stopped at its export, then completed and checked."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys

import numpy as np
import pytest

from conftest import ROOT, requires

ARCHES = ("aarch64", "riscv64", "arm32", "x86_64")
EXPORT = "mul_add_dispatch_0_elementwise_5003_f32"
N = 5003

#: What the test's gdb script does once gdb stopped at the export.
SCRIPT = """\
print $pc
info symbol $pc
bt 1
print/x $sp
stepi
print $pc
delete
continue
"""


@pytest.fixture(scope="module")
def mul_add(compile_cache):
    """mul_add_<arch>.so: the sample's MLIR compiled with DWARF (the
    bundled samples have none)."""
    from hal_cpu.programs import compile_program
    source = ROOT / "hal_cpu" / "samples" / "samples_mul_add.mlir"
    return lambda arch: compile_program(source, arch, compile_cache).so_files[0]


def hal_cpu(*args, timeout=240):
    return subprocess.run([sys.executable, "-m", "hal_cpu", *map(str, args)],
                          capture_output=True, text=True, timeout=timeout)


def _workgroups(arch: str) -> str:
    """The workgroup count the sample manifest gives mul_add on ``arch``."""
    manifest = json.loads((ROOT / "hal_cpu" / "samples" /
                           "manifest.json").read_text())
    count = manifest["kernels"]["mul_add"]["per_arch"][arch]["workgroup_count"]
    return ",".join(map(str, count))


def _inputs(tmp_path, arch):
    rng = np.random.default_rng(7)
    a = rng.standard_normal(N).astype(np.float32)
    b = rng.standard_normal(N).astype(np.float32)
    np.save(tmp_path / "a.npy", a)
    np.save(tmp_path / "b.npy", b)
    return a, b, ["--binding", f"@{tmp_path / 'a.npy'}",
                  "--binding", f"@{tmp_path / 'b.npy'}",
                  "--binding", f"{N}xf32=0",
                  "--output", f"2=@{tmp_path / 'out.npy'}",
                  "--print_bindings", "none",
                  "--workgroup_count", _workgroups(arch)]


def _pc(text: str) -> list[int]:
    """The addresses ``print $pc`` printed (``$n = (...) 0xADDR <...>``)."""
    return [int(m, 16) for m in re.findall(r"^\$\d+ = \(.*?\) (0x[0-9a-f]+)",
                                           text, re.M)]


@requires("qemu-user")
@requires("gdb-multiarch")
@pytest.mark.parametrize("arch", ARCHES)
def test_batch_stops_in_the_export_then_the_dispatch_completes(
        mul_add, tmp_path, arch):
    so = mul_add(arch)
    a, b, bindings = _inputs(tmp_path, arch)
    script = tmp_path / "steps.gdb"
    script.write_text(SCRIPT)
    proc = hal_cpu("debug", "--gdb_batch", script, "run", so, "--function",
                   EXPORT, *bindings)
    out = proc.stdout
    assert proc.returncode == 0, proc.stderr + out
    # Stopped at the breakpoint on the export, named from its DWARF.
    assert re.search(rf"Breakpoint 1, (0x[0-9a-f]+ in )?{EXPORT} ", out), out
    assert re.search(rf"^#0 .*{EXPORT} ", out, re.M), out
    pcs = _pc(out)
    assert len(pcs) == 2, out
    assert f"<{EXPORT}>" in out and f"<{EXPORT}+" in out, out
    # stepi ran one instruction forward (2 to 15 bytes, whatever the ISA).
    assert 2 <= pcs[1] - pcs[0] <= 15, out
    sp = re.search(r"^\$\d+ = (0x[0-9a-f]+)$", out, re.M)
    assert sp and int(sp.group(1), 16) != 0, out
    # gdb continued; the agent ended when the executable closed.
    assert "exited normally" in out, out
    result = np.load(tmp_path / "out.npy")
    np.testing.assert_allclose(result, a * b + a, rtol=1e-6, atol=1e-6)


@requires("qemu-user")
@requires("gdb-multiarch")
def test_gdb_command_is_a_runnable_command_line(mul_add, tmp_path):
    so = mul_add("aarch64")
    a, b, bindings = _inputs(tmp_path, "aarch64")
    proc = subprocess.Popen(
        [sys.executable, "-m", "hal_cpu", "debug", "--gdb_command", "run",
         str(so), "--function", EXPORT, *bindings],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        argv = shlex.split(line)
        assert argv[0].endswith("gdb-multiarch"), line
        gdb = subprocess.run(argv + ["-batch", "-ex", "print $pc",
                                     "-ex", "delete", "-ex", "continue"],
                             capture_output=True, text=True, timeout=120,
                             stdin=subprocess.DEVNULL)
        rest, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert f"<{EXPORT}>" in gdb.stdout, gdb.stdout + gdb.stderr
    assert "waits for gdb" in err
    np.testing.assert_allclose(np.load(tmp_path / "out.npy"), a * b + a,
                               rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("flags, field, value", [
    (["--engine", "unicorn"], "--engine", "unicorn"),
    (["--backend", "native"], "--backend", "native"),
    (["--workers", "2"], "--workers", "2"),
])
def test_no_gdb_stub_is_a_typed_error(flags, field, value):
    from hal_cpu.cli import build_parser, debug
    from hal_cpu.workbench.debug import DebugError
    so = ROOT / "hal_cpu" / "samples" / "mul_add_x86_64.so"
    args = build_parser("debug").parse_args(
        ["debug", "run", str(so), "--function", EXPORT, *flags])
    with pytest.raises(DebugError) as info:
        debug.cmd_debug(args)
    assert info.value.field == field and str(info.value.value) == value
    assert info.value.name == str(so)
    proc = hal_cpu("debug", "run", so, "--function", EXPORT, *flags)
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.startswith("hal-cpu: error: ") and field in proc.stderr
    assert "Traceback" not in proc.stderr
