"""Start-up: what ``hal-cpu`` and the packages import before they need it,
usage errors, and the VM's translations cached on disk.

* ``hal-cpu --help`` lists the subcommands without importing their modules
  (nor numpy); its listing says what each subcommand's own parser says.
* ``import hal_cpu``, ``import elfloader``, ``import fatelf`` import none of
  their modules until a name is used.
* A usage error shows the usage of the subcommand given.
* ``hal-cpu run-module`` of a ``.vmfb`` imports neither the workbench
  (only ``--sanitize`` / ``--count_instructions`` need it), nor the Google
  Benchmark report, nor the flatbuffers package; ``--sanitize`` still
  imports the workbench and runs under it.
* ``load_program`` keeps each module's translated functions in the private
  cache folder (``vm-translations``) by content and link, and a later load
  reuses them with the same results; a damaged file is replaced, and
  ``PKR_VM_CACHE=0`` keeps nothing.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from hal_cpu.cli import build_parser
from hal_cpu.programs import HostModule, compile_program, export
from hal_cpu.programs.vm import load_program

ROOT = Path(__file__).resolve().parent.parent
MLP = ROOT / "bench" / "programs" / "mlp.mlir"


def fresh(code: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """``code`` in a fresh interpreter (the checkout first on the path)."""
    run_env = dict(os.environ, PYTHONPATH=str(ROOT), **(env or {}))
    return subprocess.run([sys.executable, "-c", code], capture_output=True,
                          text=True, timeout=300, env=run_env)


def test_help_imports_no_subcommand_module():
    proc = fresh("import sys\n"
                 "from hal_cpu.cli import main\n"
                 "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
                 "print('MODULES', ' '.join(sorted(sys.modules)))")
    assert proc.returncode == 0, proc.stderr
    assert "run-module" in proc.stdout and "build-plugin" in proc.stdout
    modules = set(proc.stdout.split("MODULES", 1)[1].split())
    loaded = {m for m in modules if m.startswith(("hal_cpu.cli.", "numpy", "elfloader"))}
    assert loaded == set(), loaded


def test_listing_says_what_each_subcommand_says():
    """The summaries --help prints without importing a subcommand are each
    subcommand's own help: the listing of every parser built is the same
    text."""
    assert build_parser(listing=True).format_help() == build_parser().format_help()


@pytest.mark.parametrize("package", ["hal_cpu", "elfloader", "fatelf"])
def test_package_imports_nothing_until_used(package):
    proc = fresh(f"import sys, {package}\n"
                 "print(' '.join(sorted(sys.modules)))")
    assert proc.returncode == 0, proc.stderr
    modules = set(proc.stdout.split())
    assert "numpy" not in modules
    # fatelf.lazy is the mechanism that defers the rest
    assert not {m for m in modules if m.startswith(package + ".")} - {"fatelf.lazy"}


def test_names_still_import_on_use():
    proc = fresh("import hal_cpu, elfloader, fatelf\n"
                 "from hal_cpu import Executable, HalCpuError, zeros\n"
                 "from elfloader import ElfImage, load\n"
                 "print(hal_cpu.abi.__name__, elfloader.arch.by_name('x86_64').name,"
                 " fatelf.arches.host_arch() is not None, issubclass(HalCpuError,"
                 " fatelf.PortableKernelError), Executable.__name__, ElfImage.__name__)")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["hal_cpu.abi", "x86_64", "True", "True",
                                   "Executable", "ElfImage"]


def test_usage_error_shows_the_subcommand_usage():
    for argv, usage in ((["run-module", "--bogus", "x.vmfb"], "usage: hal-cpu run-module"),
                        (["inspect", "--nope", "x.so"], "usage: hal-cpu inspect"),
                        (["no-such-command"], "usage: hal-cpu [-h]")):
        proc = subprocess.run([sys.executable, "-m", "hal_cpu", *argv],
                              capture_output=True, text=True, timeout=120,
                              env=dict(os.environ, PYTHONPATH=str(ROOT)))
        assert proc.returncode == 2, proc.stderr
        assert proc.stderr.startswith(usage), proc.stderr
        assert "Traceback" not in proc.stderr


@pytest.mark.skipif(os.uname().machine not in ("x86_64", "AMD64"),
                    reason="the MLP is compiled for x86_64 and run natively")
def _run_module_in_child(mlp, *extra):
    """run-module of the MLP in a fresh Python: (the return code and the
    start of the last line printed, the modules imported)."""
    code = ("import contextlib, io, sys\n"
            "from hal_cpu.cli import main\n"
            "out = io.StringIO()\n"
            "with contextlib.redirect_stdout(out):\n"
            f"    rc = main(['run-module', {str(mlp.vmfb)!r}, '--function=predict',"
            " '--input=4x16xf32=1', *sys.argv[1:]])\n"
            "print(rc, out.getvalue().splitlines()[-1][:9])\n"
            "print('MODULES', ' '.join(sorted(sys.modules)))")

    run_env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-c", code, *extra],
                          capture_output=True, text=True, timeout=300,
                          env=run_env)
    assert proc.returncode == 0, proc.stderr
    head, _, names = proc.stdout.partition("MODULES")
    return head.split(), set(names.split())


def test_run_module_imports_only_what_it_runs(mlp):
    head, modules = _run_module_in_child(mlp)
    assert head == ["0", "4x8xf32=["]
    unwanted = {m for m in modules
                if m.startswith(("hal_cpu.workbench", "hal_cpu.cli.gbench"))}
    assert unwanted == set(), unwanted
    # The module is read with the FlatBuffers library's decoders.
    assert "flatbuffers.encode" in modules


@pytest.mark.requires("qemu-user")
def test_run_module_sanitize_imports_the_workbench(mlp):
    """--sanitize (which runs on the qemu engine) is what brings the
    workbench in."""
    head, modules = _run_module_in_child(mlp, "--sanitize")
    assert head == ["0", "4x8xf32=["]
    assert "hal_cpu.workbench.commands" in modules


# ---------------------------------------------------------------------------
# translations cached on disk

@pytest.fixture()
def cache_home(tmp_path, monkeypatch) -> Path:
    """A fresh cache home for the runtime's private folders."""
    home = tmp_path / "cache"
    monkeypatch.setenv("XDG_CACHE_HOME", str(home))
    monkeypatch.delenv("PKR_VM_CACHE", raising=False)
    return home / "portable-kernel-runtime" / "vm-translations"


@pytest.fixture(scope="module")
def mlp(compile_cache):
    return compile_program(MLP, "x86_64", compile_cache)


def _predict(vmfb, x):
    with load_program(vmfb) as program:
        (out,) = program("predict", x)
        return out, program


@pytest.mark.skipif(os.uname().machine not in ("x86_64", "AMD64"),
                    reason="the MLP is compiled for x86_64 and run natively")
def test_translations_are_cached_and_reused(cache_home, mlp, monkeypatch):
    x = np.random.default_rng(2).standard_normal((4, 16)).astype(np.float32)
    first, _ = _predict(mlp.vmfb, x)
    files = sorted(cache_home.glob("*.marshal"))
    assert len(files) == 1
    assert oct(files[0].stat().st_mode & 0o777) == "0o600"
    stamp = files[0].stat().st_mtime_ns
    again, program = _predict(mlp.vmfb, x)
    np.testing.assert_array_equal(first, again)
    assert files[0].stat().st_mtime_ns == stamp          # read, not rewritten
    assert "def vm_f" in program.functions["predict"]._fn.vm_source

    files[0].write_bytes(b"not a cache file")             # damaged: replaced
    third, _ = _predict(mlp.vmfb, x)
    np.testing.assert_array_equal(first, third)
    assert files[0].read_bytes() != b"not a cache file"

    monkeypatch.setenv("PKR_VM_CACHE", "0")
    files[0].unlink()
    _predict(mlp.vmfb, x)
    assert not list(cache_home.glob("*.marshal"))


def test_a_different_link_is_a_different_entry(cache_home, compile_cache, tmp_path):
    """``vm.import.resolved`` is translated to a constant: a program whose
    optional import is resolved and the same one without it are cached
    apart, and each runs its own branch from the cache."""
    source = tmp_path / "optional.mlir"
    source.write_text("""
module @optional {
  func.func private @extra.value() -> i64 attributes {vm.fallback = @fallback}
  func.func private @fallback() -> i64 {
    %c = arith.constant -1 : i64
    %v = util.optimization_barrier %c : i64
    return %v : i64
  }
  func.func @get() -> i64 {
    %v = call @extra.value() : () -> i64
    return %v : i64
  }
}
""")

    class Extra(HostModule):
        name = "extra"

        @export("value")
        def value(self):
            return 42

    def get(modules):
        with load_program(source, host_modules=modules,
                          cache_dir=str(compile_cache)) as program:
            return int(program("get")[0])

    for _ in range(2):          # translated and cached, then from the cache
        assert get([]) == -1
        assert get([Extra()]) == 42
    assert len(list(cache_home.glob("*.marshal"))) == 2
