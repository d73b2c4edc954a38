"""``hal-cpu debug``: a real dispatch under qemu-user's gdb stub and
gdb-multiarch, stopped at its export, then completed and checked."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import socket
import struct
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
    # stepi ran one instruction forward (1 to 15 bytes, whatever the ISA).
    assert 1 <= pcs[1] - pcs[0] <= 15, out
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


@requires("qemu-user")
@requires("gdb-multiarch")
def test_run_module_stops_in_the_programs_dispatch(compile_cache, tmp_path):
    """run-module: the program's first dispatch stops at its export in
    gdb; the program then prints its result, computed."""
    from hal_cpu.programs import compile_program
    source = ROOT / "hal_cpu" / "samples" / "samples_mul_add.mlir"
    vmfb = compile_program(source, "riscv64", compile_cache).vmfb
    script = tmp_path / "steps.gdb"
    script.write_text("bt 1\nprint $pc\ndelete\ncontinue\n")
    proc = hal_cpu("debug", "--gdb_batch", script, "run-module", vmfb,
                   "--function", "mul_add", "--input", f"{N}xf32=2",
                   "--input", f"{N}xf32=3")
    assert proc.returncode == 0, proc.stderr + proc.stdout
    assert re.search(rf"^#0 +{EXPORT} \(", proc.stdout, re.M), proc.stdout
    assert f"<{EXPORT}>" in proc.stdout
    assert "runtime.so" in proc.stdout and "exited normally" in proc.stdout
    assert re.search(rf"^{N}xf32=8 8 8 ", proc.stdout, re.M), proc.stdout


@requires("qemu-user")
@requires("gdb-multiarch")
def test_a_fault_stops_gdb_then_is_reported(mul_add, tmp_path):
    """A binding too small: gdb stops at the faulting load in the export;
    continued, the agent reports the fault and hal-cpu prints its usual
    report after gdb's transcript."""
    script = tmp_path / "steps.gdb"
    script.write_text("delete\ncontinue\nx/i $pc\ncontinue\n")
    proc = hal_cpu("debug", "--gdb_batch", script, "run", mul_add("aarch64"),
                   "--function", EXPORT, "--workgroup_count",
                   _workgroups("aarch64"), "--binding", "100xf32=2",
                   "--binding", "100xf32=3", "--binding", "100xf32=0")
    assert proc.returncode == 1, proc.stderr + proc.stdout
    assert "received signal SIGSEGV" in proc.stdout, proc.stdout
    assert re.search(rf"=> 0x[0-9a-f]+ <{EXPORT}\+\d+>:", proc.stdout)
    assert "exited normally" in proc.stdout
    assert proc.stderr.count("hal-cpu: error: ") == 1, proc.stderr
    assert "binding 0 at offset" in proc.stderr and "guard page" in proc.stderr
    assert "Traceback" not in proc.stderr


@requires("qemu-user")
@requires("gdb-multiarch")
def test_plugins_symbols_are_added_and_the_dispatch_completes(compile_cache,
                                                               tmp_path):
    """An executable calling an embedded plugin: gdb gets the plugin too
    (at its load address); closing the plugins' backend ends the agent
    gdb continues, so the session ends."""
    from hal_cpu.plugins import PluginManager
    from hal_cpu.programs import compile_program, vm
    plugin = ROOT / "sample_plugins" / "prebuilt" / "standalone.sos"
    comp = compile_program(ROOT / "sample_plugins" / "standalone_example.mlir",
                           "aarch64", compile_cache)
    a = np.arange(100, dtype=np.float32)
    with PluginManager.from_specs([str(plugin)], arch="aarch64") as plugins:
        (d, _) = vm.plan_program(comp, [a, a], "mixed_invocation",
                                 plugins=plugins).dispatches
    script = tmp_path / "steps.gdb"
    script.write_text("bt 1\ndelete\ncontinue\n")
    proc = hal_cpu("debug", "--gdb_batch", script, "run", comp.so_files[0],
                   f"--function={d.export_name}", "--workgroup_count="
                   + ",".join(map(str, d.workgroup_count)),
                   *[f"--constant={c}" for c in d.constants],
                   "--binding=100xf32=3", "--binding=100xf32=4",
                   "--binding=100xf32", f"--executable_plugin={plugin}",
                   "--print_bindings=2", timeout=120)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    added = re.findall(r'add symbol table from file "([^"]+)" with all '
                       r"sections offset by (0x[0-9a-f]+)", proc.stdout)
    assert [p.rsplit("/", 1)[-1].split("-", 1)[1] for p, _ in added][1:] \
        == ["standalone.sos_aarch64_", "runtime.so"], proc.stdout
    assert len({base for _, base in added}) == 3
    assert re.search(rf"^#0 +{d.export_name} \(", proc.stdout, re.M)
    assert "binding[2]: 100xf32=12 12 12" in proc.stdout


#: aarch64: call(number, a0, a1, a2, a3) makes that system call (x8 the
#: number): mov x8, x0; mov x0, x1; mov x1, x2; mov x2, x3; mov x3, x4;
#: svc #0; ret.
TRAMPOLINE = struct.pack("<7I", 0xAA0003E8, 0xAA0103E0, 0xAA0203E1,
                         0xAA0303E2, 0xAA0403E3, 0xD4000001, 0xD65F03C0)
SOCKET, BIND, CONNECT = 198, 200, 203          # aarch64's numbers
AF_UNIX, AF_INET, SOCK_STREAM, SOCK_DGRAM = 1, 2, 1, 2
EACCES = 13


@requires("qemu-user")
def test_a_debugged_agent_serves_its_socket_and_connects_nowhere(tmp_path):
    import elfloader
    from elfloader.backend.emulated import EmulatedBackend, sandbox
    from elfloader.backend.emulated.qemu_engine import GdbStub
    from hal_cpu.workbench.debug import session_folder

    def listening(path, pid):
        # No gdb: a connection closed at once lets the agent run.
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.connect(path)

    backend = EmulatedBackend(elfloader.arch.by_name("aarch64"),
                              engine="qemu", timeout=20)
    folder = session_folder()
    try:
        entry = backend.place_code(TRAMPOLINE)
        buf = backend.alloc(4096)
        mask = backend.arch.word_mask

        def call(*args: int) -> int:
            got = backend.call(entry, *[a & mask for a in args])
            return got - (mask + 1) if got >> 63 else got

        def address(path) -> int:
            backend.write(buf, struct.pack("<H", AF_UNIX) + os.fsencode(path)
                          + b"\0")
            return buf

        stub = GdbStub(str(folder), listening)
        backend.cpu.debug_next(stub)
        fd = call(SOCKET, AF_UNIX, SOCK_STREAM, 0)
        assert fd >= 0 and stub.pid is not None
        if sandbox.landlock_abi():
            # Landlock: sockets are made beneath the session folder only.
            assert call(BIND, fd, address(tmp_path / "out.sock"), 110) \
                == -EACCES
            assert not (tmp_path / "out.sock").exists()
        assert call(BIND, fd, address(folder / "guest.sock"), 110) == 0
        for refused, args in (("socket", (SOCKET, AF_INET, SOCK_STREAM, 0)),
                              ("socket", (SOCKET, AF_UNIX, SOCK_DGRAM, 0)),
                              ("connect", (CONNECT, fd, address(stub.path),
                                           110))):
            with pytest.raises(elfloader.EmulationError) as info:
                call(*args)
            assert info.value.fault.kind == "syscall"
            assert info.value.fault.syscall_name == refused
    finally:
        backend.close()
        shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.parametrize("flags, field", [
    (["--gdb", "/nonexistent/gdb-multiarch"], "gdb"),
    (["--gdb_batch", "/nonexistent/steps.gdb"], "--gdb_batch"),
])
def test_no_gdb_or_no_script_is_a_typed_error(flags, field):
    from hal_cpu.cli import build_parser, debug
    from hal_cpu.workbench.debug import DebugError
    so = ROOT / "hal_cpu" / "samples" / "mul_add_x86_64.so"
    args = build_parser("debug").parse_args(
        ["debug", *flags, "run", str(so), "--function", EXPORT])
    with pytest.raises(DebugError) as info:
        debug.cmd_debug(args)
    assert info.value.field == field and info.value.value == flags[1]
