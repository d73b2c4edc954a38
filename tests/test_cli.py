"""``hal-cpu`` from the command line, with .npy files and FatELF bundles."""

from __future__ import annotations

import re
import subprocess
import sys

import numpy as np
import pytest

import fatelf
from hal_cpu import programs as iree_tools
from hal_cpu.plugins import PluginManager
from hal_cpu.programs import vm

from conftest import PREBUILT, ROOT

ARCHES_64 = ["x86_64", "aarch64", "riscv64"]
ALL_ARCHES = ARCHES_64 + ["x86_32", "arm32", "riscv32"]


def hal_cpu(*args, check=True):
    proc = subprocess.run([sys.executable, "-m", "hal_cpu", *map(str, args)],
                          capture_output=True, text=True, cwd=ROOT)
    if check:
        assert proc.returncode == 0, proc.stderr
    return proc


@pytest.fixture(scope="module")
def matmul_bundle(compiled, tmp_path_factory):
    """A FatELF holding the matmul executable for all six architectures."""
    elfs = [compiled("matmul", a).so_files[0].read_bytes() for a in ALL_ARCHES]
    path = tmp_path_factory.mktemp("bundle") / "matmul.sos"
    path.write_bytes(fatelf.join(elfs))
    return path


def _matmul_args(compiled, arch, tmp_path):
    rng = np.random.default_rng(11)
    a = rng.standard_normal((37, 53)).astype(np.float32)
    b = rng.standard_normal((53, 29)).astype(np.float32)
    np.save(tmp_path / "a.npy", a)
    np.save(tmp_path / "b.npy", b)
    comp = compiled("matmul", arch)
    (d,) = vm.plan_program(comp, [a, b]).dispatches
    wc = ",".join(map(str, d.workgroup_count))
    return a, b, d, [f"--function={d.export_name}", f"--workgroup_count={wc}",
                     f"--binding=@{tmp_path / 'a.npy'}",
                     f"--binding=@{tmp_path / 'b.npy'}", "--binding=37x29xf32",
                     f"--output=2=@{tmp_path / 'c.npy'}"]


@pytest.mark.parametrize("arch", ARCHES_64)
def test_run_with_npy_files(compiled, tmp_path, arch):
    a, b, d, args = _matmul_args(compiled, arch, tmp_path)
    proc = hal_cpu("run", compiled("matmul", arch).so_files[0], *args)
    np.testing.assert_allclose(np.load(tmp_path / "c.npy"), a @ b, rtol=1e-4,
                               atol=1e-4)
    assert proc.stdout.splitlines()[2].startswith("binding[2]: 37x29xf32=[")


@pytest.mark.parametrize("arch,backend", [("x86_64", "native"),
                                          ("x86_64", "emulated"),
                                          ("aarch64", "emulated"),
                                          ("riscv64", "emulated"),
                                          ("x86_32", "auto"), ("arm32", "auto"),
                                          ("riscv32", "auto")])
def test_run_from_bundle(compiled, matmul_bundle, tmp_path, arch,
                                    backend):
    a, b, d, args = _matmul_args(compiled, arch, tmp_path)
    hal_cpu("run", matmul_bundle, f"--arch={arch}", f"--backend={backend}", *args)
    np.testing.assert_allclose(np.load(tmp_path / "c.npy"), a @ b, rtol=1e-4,
                               atol=1e-4)


def test_bundle_without_the_arch(compiled, tmp_path):
    elf = compiled("matmul", "aarch64").so_files[0].read_bytes()
    bundle = tmp_path / "one.sos"
    bundle.write_bytes(fatelf.join([elf]))
    proc = hal_cpu("inspect", bundle, "--arch=riscv64", check=False)
    assert proc.returncode == 1
    assert "aarch64" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_run_prints_buffer_views(compiled):
    so = compiled("mul_add", "x86_64").so_files[0]
    # Workgroups past the data are skipped by the kernel's own bounds.
    proc = hal_cpu("run", so, "--entry_point=0", "--workgroup_count=3,1,1",
                   "--binding=10007xf32=2", "--binding=10007xf32=3",
                   "--binding=10007xf32")
    lines = proc.stdout.splitlines()
    assert lines[2].startswith("binding[2]: 10007xf32=8 8 8")


def test_inspect_library_and_plugin(compiled):
    out = hal_cpu("inspect", compiled("scale_dyn", "riscv64").so_files[0]).stdout
    assert "riscv64" in out and "scale_dyn_dispatch_0" in out
    assert "constants=3" in out
    out = hal_cpu("inspect", PREBUILT / "standalone.sos", "--arch=arm32",
                  "--resolve", "simple_mul_workgroup", "--resolve",
                  "?missing_fn").stdout
    assert "sample_standalone" in out and "STANDALONE" in out
    assert "simple_mul_workgroup: fn=" in out and "?missing_fn: unresolved" in out
    out = hal_cpu("inspect", PREBUILT / "system_plugin_x86_64.so", "--resolve",
                  "system_mul_workgroup").stdout
    assert "kind:         system library" in out and "fn=" not in out
    assert "sample_system_plugin_call_count  (func)" in out
    out = hal_cpu("inspect", PREBUILT / "system_plugin_x86_64.so", "--resolve",
                  "system_mul_workgroup", "--run_sandboxed").stdout
    assert "(--run_sandboxed)" in out and "system_mul_workgroup: fn=" in out


def test_run_with_plugin(compile_cache, tmp_path):
    comp = iree_tools.compile_program(ROOT / "sample_plugins" /
                                      "standalone_example.mlir", "aarch64",
                                      compile_cache)
    a = np.arange(100, dtype=np.float32)
    with PluginManager.from_specs([str(PREBUILT / "standalone.sos")],
                                  arch="aarch64") as plugins:
        (d, _) = vm.plan_program(comp, [a, a], "mixed_invocation",
                                 plugins=plugins).dispatches
    proc = hal_cpu("run", comp.so_files[0], f"--function={d.export_name}",
                   "--workgroup_count=" + ",".join(map(str, d.workgroup_count)),
                   *[f"--constant={c}" for c in d.constants],
                   "--binding=100xf32=3", "--binding=100xf32=4",
                   "--binding=100xf32",
                   f"--executable_plugin={PREBUILT / 'standalone.sos'}")
    assert proc.stdout.splitlines()[2].startswith("binding[2]: 100xf32=12 12 12")


def test_inspect_names_the_plugin_each_import_needs(compile_cache):
    """inspect lists an executable's imports even when nothing resolves them,
    and with plugins says which one provides each."""
    comp = iree_tools.compile_program(ROOT / "sample_plugins" /
                                      "standalone_example.mlir", "riscv64",
                                      compile_cache)
    so = comp.so_files[0]
    out = hal_cpu("inspect", so).stdout
    assert "simple_mul_workgroup" in out and "UNRESOLVED" not in out
    out = hal_cpu("inspect", so, "--executable_plugin",
                  str(PREBUILT / "standalone_alt.sos"), "--executable_plugin",
                  str(PREBUILT / "standalone.sos")).stdout
    assert "simple_mul_workgroup  resolved by" in out
    out = hal_cpu("inspect", so, "--executable_plugin=embedded:"
                  + str(PREBUILT / "standalone_riscv64.so")).stdout
    assert "resolved by" in out


def test_bad_command_lines_are_one_line(tmp_path):
    """Every bad input named in the reliability work gets one line on stderr
    and the right exit status, never a traceback."""
    sample = "hal_cpu/samples/sum_last_x86_64.so"
    base = ["run", sample, "--entry_point=0", "--workgroup_count=9,1,1"]
    cases = [
        (base + ["--binding=1000000000000xf32"], 1, "16 GiB"),
        (base + ["--binding=100000000000000000000xf32"], 1, "16 GiB"),
        (base + ["--binding=9x129xf32", "--binding=9xf32",
                 "--output=1=@/nonexistentdir/out.npy"], 1, "not a writable directory"),
        (base + ["--binding=@/dev/null"], 1, "not a regular file"),
        (base + ["--binding=8xi1=2"], 1, "i1"),
        (["run", sample, "--entry_point=0", "--workgroup_count=1,1"], 2, "three"),
        (["run", sample, "--entry_point=0", "--workgroup_count=4294967296,1,1"],
         2, "x = 4294967296"),
        (["run", sample, "--entry_point=0", "--workgroup_count=1,1,65536"],
         2, "z = 65536"),
        (["run", sample, "--entry_point=0", "--arch=vax"], 2, "unknown architecture"),
        (base + ["--binding=9x129xf32", "--binding=9xf32", "--executable_plugin="
                 + str(PREBUILT / "standalone_aarch64.so")], 1, "embedded:PATH"),
        (base + ["--binding=9x129xf32", "--binding=9xf32", "--executable_plugin="
                 + str(PREBUILT / "standalone.sos") + "?bias=abc"], 1,
         "standalone.sos[x86_64]: load: load returned INVALID_ARGUMENT (3); "
         "parameters bias=abc"),
    ]
    pickled = tmp_path / "p.npy"
    np.save(pickled, np.array([object()]), allow_pickle=True)
    cases.append((base + [f"--binding=@{pickled}"], 1, "pickled"))
    for args, status, words in cases:
        proc = hal_cpu(*args, check=False)
        assert proc.returncode == status, (args, proc.stderr)
        assert "Traceback" not in proc.stderr, proc.stderr
        if status == 1:
            assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
        assert words in proc.stderr, (args, proc.stderr)


def test_version_flags():
    assert hal_cpu("--version").stdout.startswith("hal-cpu ")


@pytest.mark.parametrize("args,words", [
    (["run", "missing.so", "--entry_point=0"], "No such file"),
    (["run", "pyproject.toml", "--entry_point=0"], "e_ident"),
    (["run", "hal_cpu/samples/mul_add_aarch64.so", "--entry_point=0",
      "--backend=native"], "emulated"),
    (["run", "hal_cpu/samples/mul_add_x86_64.so", "--entry_point=0",
      "--binding=4xq9=1"], "unknown element type"),
    (["run", "hal_cpu/samples/mul_add_x86_64.so", "--function=nope"], "no export"),
    (["run", "hal_cpu/samples/mul_add_x86_64.so", "--entry_point=0",
      "--executable_plugin=x.sos?bias"], "malformed parameters"),
])
def test_errors_are_one_line(args, words):
    proc = hal_cpu(*args, check=False)
    assert proc.returncode == 1
    assert words in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_iree_run_module_accepts_our_join(compile_cache, tmp_path):
    """IREE's runtime loads a bundle that our join made from our plugin ELFs
    for x86_64, aarch64 and riscv64."""
    elfs = [(PREBUILT / f"standalone_{a}.so").read_bytes() for a in ARCHES_64]
    bundle = tmp_path / "three.sos"
    bundle.write_bytes(fatelf.join(elfs))
    comp = iree_tools.compile_program(ROOT / "sample_plugins" /
                                      "standalone_example.mlir", "x86_64",
                                      compile_cache)
    proc = subprocess.run(["iree-run-module", "--device=local-sync",
                           f"--module={comp.vmfb}", "--function=mixed_invocation",
                           "--input=8xf32=2", "--input=8xf32=4",
                           f"--executable_plugin={bundle}"],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "8xf32=12 12 12 12 12 12 12 12" in proc.stdout


def test_demo():
    proc = hal_cpu("demo")
    assert "21 of 21 sample dispatches match numpy" in proc.stdout
    # The import resolved by the bundled sample plugin, once per architecture.
    lines = proc.stdout.splitlines()
    start = lines.index(next(line for line in lines if line.startswith(
        "import simple_mul_workgroup resolved by the sample plugin")))
    rows = {line.split()[0]: line.split() for line in lines[start + 2:start + 8]}
    assert sorted(rows) == sorted(ALL_ARCHES)
    for arch, (_, backend, engine, plugin, error, _time) in rows.items():
        assert plugin == "sample_standalone" and float(error) <= 1e-3
        assert (backend, engine) in (("native", "-"), ("emulated", "qemu"),
                                     ("emulated", "unicorn"))
    assert lines[start + 8] == "6 of 6 plugin imports match numpy (tolerance 0.001)"


def test_demo_plugin_bundle_is_the_prebuilt_one():
    """The demo's copy of the sample plugin bundle (package data, so it is
    there without the repository) is sample_plugins/prebuilt/standalone.sos."""
    shipped = ROOT / "hal_cpu" / "samples" / "standalone.sos"
    assert shipped.read_bytes() == (PREBUILT / "standalone.sos").read_bytes()
    proc = hal_cpu("demo", "--arch=rv32", "--arch=aarch64")
    assert "2 of 2 plugin imports match numpy" in proc.stdout
    assert re.search(r"\nriscv32 +emulated +(qemu|unicorn) +sample_standalone",
                     proc.stdout)
