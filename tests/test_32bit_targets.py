"""The 32-bit targets (x86_32, arm32, riscv32) as iree-compile 3.13 builds
for them, at their default CPU profiles, with IREE's own test programs
(read from a checkout of IREE's source, ``PKR_IREE_SOURCE``;
skipped without it):

* ``stablehlo_ops/round.mlir``, ``regression/layernorm.mlir`` and
  ``regression/associative_reordering.mlir`` (the functions x86_32 got
  wrong with x87 code) pass from MLIR and from the ``.vmfb``; on x86_32's
  x87-only profile ``i686`` round passes too (libm.c's rounding replaces
  musl's, which x87's 64-bit mantissa breaks), while layer norm and the
  reordered sum differ beyond their tolerances (``atol=1e-4``) as on a real
  i686: x87 precision, not an error of the runtime.
* IREE's math suite (``tests/e2e/math``: ``generate.py
  --testcases=math_ops_llvm-cpu.json``, 56 functions) links and passes
  (compiler-rt's builtins and libm.c in ``libm.sos``).
* A ``.vmfb`` built by iree-compile itself (no hal_cpu libm) whose
  executables call an empty ``fmaf`` is refused when it loads, with one
  :class:`hal_cpu.empty_functions.EmptyFunctionError` naming the file, the
  export and how to compile so that it links; compiled with
  :func:`hal_cpu.programs.compiler.libm_linker_flags` it passes.

CI time: by default the math suite runs from the ``.vmfb`` on the three
architectures and from MLIR on riscv32, and the three e2e programs from
MLIR and ``.vmfb`` on x86_32 and from the ``.vmfb`` elsewhere (the MLIR
path differs only by the cached compile). ``PKR_FULL_32BIT=1`` runs every
program both ways on every architecture.
"""

from __future__ import annotations

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from hal_cpu.cli import main
from hal_cpu.empty_functions import EmptyFunctionError
from hal_cpu.library import Executable
from hal_cpu.programs import compile_program
from hal_cpu.programs.compiler import find_iree_compile, libm_linker_flags, target_flags

from conftest import ROOT, iree_source_file

ARCHES32 = ("x86_32", "arm32", "riscv32")
E2E = ("stablehlo_ops/round.mlir", "regression/layernorm.mlir",
       "regression/associative_reordering.mlir")
FULL = os.environ.get("PKR_FULL_32BIT") == "1"
FMA = ROOT / "tests" / "programs" / "support32" / "fma.mlir"


@pytest.fixture(scope="module")
def e2e_files(tmp_path_factory) -> list[Path]:
    folder = tmp_path_factory.mktemp("iree-e2e")
    out = []
    for rel in E2E:
        path = folder / rel.replace("/", "__")
        path.write_text(iree_source_file(f"tests/e2e/{rel}"))
        out.append(path)
    return out


@pytest.fixture(scope="module")
def math_suite(tmp_path_factory) -> Path:
    """IREE's generated math suite (56 functions) as one MLIR file."""
    folder = tmp_path_factory.mktemp("iree-math")
    for name in ("generate.py", "math_ops_llvm-cpu.json"):
        (folder / name).write_text(iree_source_file(f"tests/e2e/math/{name}"))
    proc = subprocess.run([sys.executable, "generate.py",
                           "--testcases=math_ops_llvm-cpu.json"], cwd=folder,
                          capture_output=True, text=True, check=True)
    path = folder / "math.mlir"
    path.write_text(proc.stdout)
    return path


def compile_all(jobs, cache):
    with ThreadPoolExecutor(max_workers=2) as pool:
        done = {job: pool.submit(compile_program, job[0], job[1], cache, cpu=job[2])
                for job in jobs}
        return {job: f.result() for job, f in done.items()}


def check(capsys, program, arch, cache, *extra) -> tuple[int, list[str]]:
    rc = main(["check-module", str(program), f"--arch={arch}", f"--cache_dir={cache}",
               *extra])
    out, err = capsys.readouterr()
    return rc, (out + err).splitlines()


def functions_line(lines) -> str:
    return next(ln for ln in reversed(lines) if "functions passed" in ln)


@pytest.mark.parametrize("arch", ARCHES32)
def test_iree_e2e_programs_pass(e2e_files, compile_cache, capsys, arch):
    """round, layer norm (static and dynamic) and the reordered sum pass at
    the default profile, from the compiled module (and from MLIR)."""
    compiled = compile_all([(f, arch, None) for f in e2e_files], compile_cache)
    for path in e2e_files:
        programs = [compiled[(path, arch, None)].vmfb]
        if FULL or arch == "x86_32":
            programs.append(path)
        for program in programs:
            rc, lines = check(capsys, program, arch, compile_cache)
            assert rc == 0 and not [ln for ln in lines if ln.startswith("FAIL")], lines


def test_x87_profile(e2e_files, compile_cache, capsys):
    """x86_32 at i686 (x87 only): round passes; layer norm and the reordered
    sum differ beyond atol=1e-4, x87's 64-bit intermediates against the
    f32 reference (-0.147384 for 0: 5 - 1920 * (1/384) is not 0 at 64 bits
    and is divided by sqrt(1e-12); 79898.4 for 79898.3)."""
    compile_all([(f, "x86_32", "i686") for f in e2e_files], compile_cache)
    results = {}
    for path in e2e_files:
        rc, lines = check(capsys, path, "x86_32", compile_cache, "--cpu=i686")
        results[path.name] = (rc, lines)
    rc, lines = results["stablehlo_ops__round.mlir"]
    assert rc == 0 and lines[-1] == "1 of 1 functions passed (x86_32)", lines
    rc, lines = results["regression__layernorm.mlir"]
    assert rc == 1 and "lhs value -0.147384 differs from the rhs value 0" in "\n".join(lines)
    rc, lines = results["regression__associative_reordering.mlir"]
    assert rc == 1 and "FAIL @check_reordering" in lines
    assert "atol=0.0001" in "\n".join(lines)


@pytest.mark.parametrize("arch", ARCHES32)
def test_iree_math_suite_links_and_passes(math_suite, compile_cache, capsys, arch):
    """All 56 functions of IREE's math suite (f16 and f32 libm ops, with
    their atol/rtol) link and pass: compiler-rt's conversions
    (__extendsfdf2, __aeabi_d2h...) come from libm.sos."""
    compiled = compile_program(math_suite, arch, compile_cache)
    programs = [compiled.vmfb] + ([math_suite] if FULL or arch == "riscv32" else [])
    outputs = []
    for program in programs:
        rc, lines = check(capsys, program, arch, compile_cache)
        assert functions_line(lines) == f"56 of 56 functions passed ({arch})", [
            ln for ln in lines if not ln.startswith("PASS")][:20]
        assert rc == 0
        outputs.append(lines)
    assert all(o == outputs[0] for o in outputs)


# --- a module built by iree-compile alone ---------------------------------------

RAW = {"x86_32": None, "arm32": "armv7-a"}   # CPUs without fused multiply-add


def raw_compile(arch: str, cpu: str | None, out: Path, *extra: str) -> Path:
    """``fma.mlir`` compiled by iree-compile with the profile's flags and
    nothing of hal_cpu's (``extra`` flags added)."""
    vmfb = out / f"fma_{arch}{'_linked' if extra else ''}.vmfb"
    subprocess.run([str(find_iree_compile()), str(FMA), *target_flags(arch, cpu), *extra,
                    "-o", str(vmfb)], check=True, capture_output=True)
    return vmfb


@pytest.mark.parametrize("arch", list(RAW))
def test_module_calling_an_empty_function_is_refused_at_load(tmp_path, capsys, arch):
    """iree-compile's own module: the export's call to fmaf (zero bytes:
    it would run the padding or whatever follows) is found when the
    executable loads: one error line naming the .vmfb, the export, the
    reason and the way to compile it; nothing runs. With the flag
    libm_linker_flags gives, the same compile passes."""
    vmfb = raw_compile(arch, RAW[arch], tmp_path)
    cpu = [f"--cpu={RAW[arch]}"] if RAW[arch] else []
    rc, lines = check(capsys, vmfb, arch, tmp_path, *cpu)
    assert rc != 0
    (line,) = [ln for ln in lines if ln.startswith("hal-cpu")]
    assert line.startswith(f"hal-cpu: error: {vmfb}: call: export "
                           "_fma_dispatch_0_elementwise_5_f32 calls a function of no code")
    assert "fmaf" in line and "libm_linker_flags" in line and "<memory>" not in line

    flags, _ = libm_linker_flags(arch, tmp_path, RAW[arch])
    linked = raw_compile(arch, RAW[arch], tmp_path, *flags)
    rc, lines = check(capsys, linked, arch, tmp_path, *cpu)
    assert rc == 0 and lines[-1] == f"1 of 1 functions passed ({arch})", lines


def test_empty_function_error_from_the_library(tmp_path):
    """The library itself raises the typed error (a HalCpuError with name,
    field and value) before any dispatch; the executable's address of the
    empty function is the value."""
    vmfb = raw_compile("x86_32", None, tmp_path,
                       f"--iree-hal-dump-executable-binaries-to={tmp_path / 'bin'}")
    assert vmfb.is_file()
    (so,) = sorted((tmp_path / "bin").glob("*.so"))
    with pytest.raises(EmptyFunctionError) as e:
        Executable(so, backend="emulated")
    assert e.value.name == str(so) and e.value.field == "call"
    assert e.value.value.startswith("0x")
    assert "_fma_dispatch_0_elementwise_5_f32" in e.value.message


def test_unreadable_unwind_tables_are_no_error(tmp_path):
    """A library whose .eh_frame is garbage loads as before the check: the
    scan finds what the section headers show, never raises."""
    import elfloader
    from hal_cpu.empty_functions import find_empty_calls

    raw_compile("x86_32", None, tmp_path,
                f"--iree-hal-dump-executable-binaries-to={tmp_path / 'bin'}")
    (so,) = sorted((tmp_path / "bin").glob("*.so"))
    image = elfloader.read_image(so)
    assert find_empty_calls(image)
    from elftools.elf.elffile import ELFFile
    with open(so, "rb") as f:
        sec = ELFFile(f).get_section_by_name(".eh_frame")
        offset, size = sec["sh_offset"], sec["sh_size"]
    data = bytearray(image.data)
    data[offset:offset + size] = b"\xff" * size
    broken = tmp_path / "broken.so"
    broken.write_bytes(bytes(data))
    # without FDEs the call past the end of .text is still seen
    calls = find_empty_calls(elfloader.read_image(broken))
    assert calls and all(c.site is not None for c in calls)
