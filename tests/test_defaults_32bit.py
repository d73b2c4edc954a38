"""x86_32 and arm32 run what IREE compiles for them at their default CPU
profiles (``pentium4``, ``armv7-a+neon+vfp4+hwdiv``) and give x86_64's
results.

What IREE's e2e op suites found (iree-compile 3.13): for every 32-bit target
iree-compile links musl's math functions as the bitcode it built for wasm32,
in which ``fmaf``, ``floor`` and ``round`` have no body (zero bytes: a call
runs whatever follows, here past the end of ``.text``) and ``fmaxf``,
``fminf``, ``truncf``... do not exist (softmax did not link). And x87-only
code (the old ``i686`` default) keeps f32 intermediates at 64-bit precision,
so round, layer norm and reductions differ from x86_64 as on a real i686.
``compile_program`` now links 32-bit executables through
``hal_cpu/buildtools/libm_link.py`` and ``libm.c``; x86_32 defaults to SSE2.

The tests: a check-style program (``programs/check32/math32.mlir``) passes
on both 32-bit architectures, both engines, exactly as on x86_64; numeric
programs (``libm32.mlir``) give x86_64's bits (arm32: but for NEON's
flushed subnormals and VFPv4's fused multiply-adds) and an exactly rounded
``math.fma``; no executable calls past its code; the linker's repair and
refusal on hand-made objects; ``libm.c`` itself against exact references;
a reference through an undefined symbol is a load-time error naming it.
"""

from __future__ import annotations

import struct
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

import elfloader
import fatelf
from fatelf import arches
from hal_cpu import runtime
from hal_cpu.buildtools import libm_link
from hal_cpu.cli import main
from hal_cpu.programs import compile_program
from hal_cpu.programs.compiler import _iree_lld
from hal_cpu.programs.vm import load_program

from conftest import ROOT, emulation_engines

HERE = ROOT / "tests" / "programs" / "check32"
MATH32 = HERE / "math32.mlir"
LIBM32 = HERE / "libm32.mlir"
HARNESS = HERE / "libm_harness.c"
ARCHES32 = ("x86_32", "arm32")
ENGINES = emulation_engines()
RNG_SEED = 32

# references computed over NaN and infinity inputs on purpose
pytestmark = [pytest.mark.filterwarnings("ignore:invalid value encountered"),
              pytest.mark.filterwarnings("ignore:overflow encountered")]


# --- compiled programs ----------------------------------------------------------

#: (program, arch, cpu) compiled once per session, two at a time.
JOBS = ([(MATH32, a, None) for a in ("x86_64",) + ARCHES32]
        + [(MATH32, "x86_32", "i686")]
        + [(LIBM32, a, None) for a in ("x86_64",) + ARCHES32]
        # the software fmaf of libm.c on both architectures
        + [(LIBM32, "x86_32", "i686"), (LIBM32, "arm32", "armv7-a")])


@pytest.fixture(scope="module")
def programs(compile_cache):
    """(program path, arch, cpu) -> Compiled, for every job of JOBS."""
    with ThreadPoolExecutor(max_workers=2) as pool:
        done = {job: pool.submit(compile_program, job[0], job[1], compile_cache,
                                 cpu=job[2]) for job in JOBS}
        return {job: f.result() for job, f in done.items()}


def check_module(capsys, cache, arch, *extra) -> tuple[int, list[str]]:
    rc = main(["check-module", str(MATH32), f"--cache_dir={cache}", f"--arch={arch}",
               *extra])
    return rc, capsys.readouterr().out.splitlines()


def test_default_profiles_are_the_ones_tested():
    """The architectures' plain names compile for the tested profiles, both
    engines run them, and both link our libm."""
    assert arches.DEFAULT_PROFILES["x86_32"] == "pentium4"
    assert arches.DEFAULT_PROFILES["arm32"] == "armv7-a+neon+vfp4+hwdiv"
    for arch in ARCHES32:
        default = arches.profile(arch, arches.DEFAULT_PROFILES[arch])
        assert arches.lookup(arch).iree_flags == default.iree_flags
        assert default.unicorn and not default.note
        assert arch in runtime.LIBM_ARCHES
    assert "x87" in arches.profile("x86_32", "i686").note


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("arch", ARCHES32)
def test_check_program_passes_as_on_x86_64(programs, compile_cache, capsys, arch, engine):
    """exp, tanh, sigmoid, expm1, log, sin/cos, a sum of exp, softmax,
    max/min, rounding and layer norm: every function passes, as on x86_64."""
    rc, ref = check_module(capsys, compile_cache, "x86_64")
    assert rc == 0 and ref[-1] == "11 of 11 functions passed (x86_64)", ref
    rc, out = check_module(capsys, compile_cache, arch, f"--engine={engine}",
                           "--backend=emulated")
    assert out == [line.replace("x86_64", arch) for line in ref]
    assert rc == 0


@pytest.mark.parametrize("engine", ENGINES)
def test_x87_profile_differs_as_a_real_i686(programs, compile_cache, capsys, engine):
    """On the x87-only profile the same program fails layer norm (1/n is
    inexact and kept at 64 bits): what an i686 under Linux computes, as
    qemu-user models it, not an emulation error. Round passes: musl's
    roundf (adding and subtracting 2^23, at 64-bit precision there) is
    replaced by libm.c's (hal_cpu.runtime.LIBM_REDIRECTS)."""
    rc, out = check_module(capsys, compile_cache, "x86_32", "--cpu=i686",
                           f"--engine={engine}")
    failed = [ln for ln in out if ln.startswith("FAIL")]
    assert failed == ["FAIL @layernorm"], out
    text = "\n".join(out)
    assert "lhs value -0.147384 differs from the rhs value 0" in text
    assert rc == 1


# --- numeric programs -------------------------------------------------------------

def _bits(a):
    a = np.asarray(a)
    return a.view({2: np.uint16, 4: np.uint32, 8: np.uint64}[a.dtype.itemsize])


def assert_same_bits(got, want, what=""):
    """Equal bit for bit (any NaN equals any NaN)."""
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape and got.dtype == want.dtype, what
    nan = np.isnan(want).ravel()
    assert np.array_equal(np.isnan(got).ravel(), nan), what
    bad = np.flatnonzero((_bits(got) != _bits(want)).ravel() & ~nan)
    assert bad.size == 0, (f"{what}: {bad.size} of {got.size} differ, first at "
                           f"{bad[0]}: {got.ravel()[bad[0]]!r} != {want.ravel()[bad[0]]!r}")


def fma_exact(a, b, c) -> np.ndarray:
    """fma(a, b, c) rounded once to f32 (nearest, ties to even), exactly."""
    out = np.empty(a.shape, np.float32)
    for i, (x, y, z) in enumerate(zip(a.tolist(), b.tolist(), c.tolist())):
        if not all(np.isfinite(v) for v in (x, y, z)):
            out[i] = np.float32(x * y + z)   # f64: the product cannot overflow
            continue
        exact = Fraction(x) * Fraction(y) + Fraction(z)
        if exact == 0:
            prod_neg = (np.signbit(np.float32(x)) != np.signbit(np.float32(y)))
            both_neg = (x * y == 0 and prod_neg and np.signbit(np.float32(z)))
            out[i] = np.float32(-0.0 if both_neg else 0.0)
            continue
        out[i] = _round_f32(exact)
    return out


def _round_f32(exact: Fraction) -> np.float32:
    sign = -1 if exact < 0 else 1
    a = abs(exact)
    e = a.numerator.bit_length() - a.denominator.bit_length()
    if Fraction(2) ** e > a:
        e -= 1                                   # 2^e <= a < 2^(e+1)
    q = max(e - 23, -149)                        # weight of the last bit
    scaled = a / Fraction(2) ** q
    n = scaled.numerator // scaled.denominator
    rest = scaled - n
    if rest > Fraction(1, 2) or (rest == Fraction(1, 2) and n % 2):
        n += 1
    value = Fraction(n) * Fraction(2) ** q
    if value >= Fraction(2) ** 128:
        return np.float32(sign * np.inf)
    return np.float32(sign * float(value))


def fma_inputs(rng, n=4099):
    """Random and adversarial fma operands: every bit pattern, cancellation,
    halfway cases that double rounding gets wrong, tiny addends (sticky
    bits), subnormal and overflowing results."""
    def f32(x):
        return np.asarray(x, np.float64).astype(np.float32)
    parts = []
    k = n // 6
    bits = rng.integers(0, 1 << 32, (3, k), dtype=np.uint64).astype(np.uint32)
    parts.append(tuple(bits[i].view(np.float32) for i in range(3)))
    a = f32(rng.uniform(1, 2, k))
    b = f32(rng.uniform(1, 2, k))
    p = (a.astype(np.float64) * b).astype(np.float32)
    parts.append((a, b, f32(-p.astype(np.float64) * (1 + rng.integers(-4, 5, k) * 2.0 ** -24))))
    # a*b = 1 + 2^-24 + 2^-47 style: halfway after one rounding to double
    m = rng.integers(1 << 22, 1 << 23, k)
    a = f32((1 << 23) + m) * np.float32(2.0 ** -23)
    b = f32(1 + rng.integers(1, 1 << 10, k) * 2.0 ** -23)
    parts.append((a, b, f32(rng.choice([-1, 1], k) * 2.0 ** rng.integers(-60, -20, k))))
    parts.append((f32(rng.uniform(-1, 1, k) * 2.0 ** -70), f32(rng.uniform(-1, 1, k) * 2.0 ** -70),
                  f32(rng.uniform(-1, 1, k) * 2.0 ** rng.integers(-149, -120, k))))
    parts.append((f32(rng.uniform(-4, 4, k) * 2.0 ** 64), f32(rng.uniform(-4, 4, k) * 2.0 ** 62),
                  f32(rng.uniform(-1, 1, k) * 3e38)))
    rest = n - 5 * k
    parts.append(tuple(f32(rng.standard_normal(rest) * 2.0 ** rng.integers(-30, 30, rest))
                       for _ in range(3)))
    a, b, c = (np.concatenate([p[i] for p in parts]) for i in range(3))
    special = np.float32([0.0, -0.0, np.inf, -np.inf, np.nan, 1.0, -1.0, 2.0 ** -149, 3e38])
    g = np.array(np.meshgrid(special, special, special)).reshape(3, -1)
    return tuple(np.concatenate([x, y]) for x, y in zip((a, b, c), g))


def run(compiled, inputs, function, arch, engine, monkeypatch):
    if engine:
        monkeypatch.setenv("PKR_ENGINE", engine)
    backend = "auto" if arch == "x86_64" else "emulated"
    return run_program(compiled, inputs, function, backend=backend, arch=arch)


def run_program(compiled, inputs, function, *, backend, arch):
    """One call of ``function`` of ``compiled`` on the VM: its results."""
    with load_program(compiled, arch=arch, backend=backend) as program:
        return program.function(function)(*inputs)


def _nonsubnormal(*arrays):
    ok = np.ones(arrays[0].shape, bool)
    tiny = np.finfo(np.float32).tiny
    for a in arrays:
        ok &= ~((a != 0) & (np.abs(a) < tiny))
    return ok


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("arch,cpu", [("x86_32", None), ("arm32", None),
                                      ("x86_32", "i686"), ("arm32", "armv7-a")])
def test_fma_is_exactly_rounded(programs, monkeypatch, arch, cpu, engine):
    """math.fma: x86_32 and the profiles without FMA call libm.c's fmaf,
    which gives the exactly rounded result everywhere (subnormals too);
    arm32's default runs NEON's vfma, exact but flushing subnormals."""
    rng = np.random.default_rng(RNG_SEED)
    a, b, c = fma_inputs(rng)
    want = fma_exact(a, b, c)
    (got,) = run(programs[(LIBM32, arch, cpu)], [a, b, c], "fma", arch, engine,
                 monkeypatch)
    if (arch, cpu) == ("arm32", None):
        keep = _nonsubnormal(a, b, c, want, got)
        assert keep.mean() > 0.75
        got, want = got[keep], want[keep]
    assert_same_bits(got, want, f"fma on {arch} {cpu or 'default'}")


def rounding_inputs(rng, n=3001):
    bits = rng.integers(0, 1 << 32, n // 3, dtype=np.uint64).astype(np.uint32).view(np.float32)
    halves = (rng.integers(-(1 << 24), 1 << 24, n // 3) / 2).astype(np.float32)
    near = (rng.standard_normal(n - 2 * (n // 3)) * 10).astype(np.float32)
    special = np.float32([0.5, -0.5, 1.5, -2.5, 0.49999997, -0.49999997, 8388607.5,
                          8388608.0, 16777215.0, 0.0, -0.0, np.inf, -np.inf, np.nan,
                          1e-45, -1e-45, 3.4e38])
    return np.concatenate([bits, halves, near, special])


def round_half_away(x):
    d = x.astype(np.float64)
    t = np.trunc(d)
    r = np.where(np.abs(d - t) >= 0.5, t + np.sign(d), t)
    return np.where(np.isfinite(d), r, d).astype(x.dtype)


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("arch", ARCHES32)
def test_numeric_results_match_x86_64(programs, monkeypatch, arch, engine):
    """Rounding, max/min (NaN, signed zeros), exp/tanh/log/sin/expm1 and
    softmax on thousands of values: x86_32 gives x86_64's bits; arm32 its
    rounding and max/min bits (but for NEON's flushed subnormals) and its
    polynomials within a few units in the last place (fused multiply-adds)."""
    rng = np.random.default_rng(RNG_SEED)
    x = rounding_inputs(rng)
    ref = run(programs[(LIBM32, "x86_64", None)], [x], "rounding", "x86_64", None, monkeypatch)
    got = run(programs[(LIBM32, arch, None)], [x], "rounding", arch, engine, monkeypatch)
    exact = [round_half_away(x), np.round(x), np.floor(x), np.ceil(x)]
    for name, g, r, e in zip(("round", "roundeven", "floor", "ceil"), got, ref, exact):
        assert_same_bits(r, e, f"{name} on x86_64")
        assert_same_bits(g, e, f"{name} on {arch}")

    a = rounding_inputs(rng)
    b = np.concatenate([a[1:], a[:1]])
    b[::7] = -a[::7]                      # equal magnitudes, ±0 pairs
    ref = run(programs[(LIBM32, "x86_64", None)], [a, b], "minmax", "x86_64", None,
              monkeypatch)
    got = run(programs[(LIBM32, arch, None)], [a, b], "minmax", arch, engine, monkeypatch)
    for name, g, r in zip(("maximumf", "minimumf", "maxnumf", "minnumf"), got, ref):
        keep = _nonsubnormal(a, b) if arch == "arm32" else np.ones(a.shape, bool)
        if name.endswith("numf"):    # of +0 and -0, either (LLVM's maxnum)
            keep &= ~((a == 0) & (b == 0))
        assert_same_bits(g[keep], r[keep], f"{name} on {arch}")

    x = np.concatenate([rng.uniform(-20, 20, 2000), rng.standard_normal(1000),
                        [0.0, -0.0, 88.0, -87.0, 1e-3, 100.0, -1000.0]]).astype(np.float32)
    ref = run(programs[(LIBM32, "x86_64", None)], [x], "transcendental", "x86_64", None,
              monkeypatch)
    got = run(programs[(LIBM32, arch, None)], [x], "transcendental", arch, engine,
              monkeypatch)
    for name, g, r in zip(("exp", "tanh", "log", "sin", "expm1"), got, ref):
        close_to_x86_64(g, r, arch, name)

    s = (rng.standard_normal((7, 37)) * 5).astype(np.float32)
    s[3] = 5.0
    (ref,) = run(programs[(LIBM32, "x86_64", None)], [s], "softmax", "x86_64", None,
                 monkeypatch)
    (got,) = run(programs[(LIBM32, arch, None)], [s], "softmax", arch, engine, monkeypatch)
    close_to_x86_64(got, ref, arch, "softmax")


def close_to_x86_64(got, ref, arch, what):
    """x86_32: x86_64's bits. arm32: NEON flushes subnormals to zero, and
    VFPv4 fuses the multiply-adds that IREE's polynomials mark contractable
    (x86 without FMA cannot): a few units in the last place."""
    if arch == "x86_32":
        assert_same_bits(got, ref, f"{what} on {arch}")
        return
    keep = _nonsubnormal(got, ref)
    assert keep.mean() > 0.95
    np.testing.assert_allclose(got[keep], ref[keep], rtol=4e-6, atol=1e-5,
                               err_msg=f"{what} on {arch}")


# --- the executables ------------------------------------------------------------

def direct_call_targets(so: Path) -> tuple[list[tuple[int, int]], int]:
    """(call address, target) of every direct call in the executable
    segment of ``so``, decoded linearly with capstone, and the segment's end."""
    import capstone
    image = elfloader.read_image(so)
    (seg,) = [s for s in image.segments if s.flags & 1]
    code = image.data[seg.offset:seg.offset + seg.filesz]
    if image.arch.name == "x86_32":
        md = capstone.Cs(capstone.CS_ARCH_X86, capstone.CS_MODE_32)
        calls = ("call",)
    else:
        md = capstone.Cs(capstone.CS_ARCH_ARM, capstone.CS_MODE_ARM)
        calls = ("bl", "blx")
    out = []
    for addr, _, mnemonic, ops in md.disasm_lite(code, seg.vaddr):
        if mnemonic in calls and ops.lstrip("#").startswith("0x"):
            out.append((addr, int(ops.lstrip("#"), 16)))
    return out, seg.vaddr + seg.memsz


@pytest.mark.parametrize("arch", ARCHES32)
def test_executables_call_no_function_without_code(programs, arch):
    """Every direct call of the 32-bit executables lands inside their code."""
    for job in ((MATH32, arch, None), (LIBM32, arch, None)):
        for so in programs[job].so_files:
            calls, end = direct_call_targets(so)
            assert calls, so
            assert all(t < end for _, t in calls), (so, [c for c in calls if c[1] >= end])


def test_iree_linker_leaves_a_call_past_the_code(compile_cache, tmp_path):
    """Without our linker (iree-compile's own iree-lld), pentium4's exp calls
    the empty fmaf: one past the end of .text, with no relocation; loading
    it is refused with the typed error naming the call (never a result)."""
    from hal_cpu.empty_functions import EmptyFunctionError
    lld = _iree_lld()
    if lld is None:
        pytest.skip("iree-lld not found")
    src = tmp_path / "exp_only.mlir"
    src.write_text("func.func @exp(%x: tensor<?xf32>) -> tensor<?xf32> {\n"
                   "  %r = math.exp %x : tensor<?xf32>\n  return %r : tensor<?xf32>\n}\n")
    comp = compile_program(src, "x86_32", compile_cache,
                           extra_flags=[f"--iree-llvmcpu-embedded-linker-path={lld}"])
    (so,) = comp.so_files
    calls, end = direct_call_targets(so)
    assert any(t == end for _, t in calls)
    assert not [r for r in elfloader.read_image(so).relocations
                if r.type != 8]    # R_386_RELATIVE only
    x = np.linspace(-3, 3, 16, dtype=np.float32)
    with pytest.raises(EmptyFunctionError, match="calls a function of no code"):
        run_program(comp, [x], "exp", backend="emulated", arch="x86_32")
    ours = compile_program(src, "x86_32", compile_cache)
    (got,) = run_program(ours, [x], "exp", backend="emulated", arch="x86_32")
    np.testing.assert_allclose(got, np.exp(x.astype(np.float64)), rtol=2e-7)


# --- the linker, on hand-made objects -----------------------------------------------

zig_only = pytest.mark.skipif(
    subprocess.run([sys.executable, "-c", "import ziglang"], capture_output=True).returncode,
    reason="ziglang not installed")

#: Assembly of an object as iree-compile hands it to the linker: a local
#: function ``NAME`` of zero bytes in its own section, called from an
#: exported ``use(const float in[3], float* out)`` computing NAME(in...).
EMPTY_FUNCTION_ASM = {
    "x86_32": """
    .section .text.{name},"ax",@progbits
    .type {name},@function
{name}:
    .size {name}, 0
    .section .text.use,"ax",@progbits
    .globl use
    .type use,@function
use:
    movl 4(%esp), %eax
    pushl 8(%eax)
    pushl 4(%eax)
    pushl (%eax)
    calll {name}
    addl $12, %esp
    movl 8(%esp), %eax
    fstps (%eax)
    retl
    .size use, .-use
""",
    "arm32": """
    .syntax unified
    .arm
    .section .text.{name},"ax",%progbits
    .type {name},%function
{name}:
    .size {name}, 0
    .section .text.use,"ax",%progbits
    .globl use
    .type use,%function
use:
    push {{r4, lr}}
    mov r4, r1
    vldr s0, [r0]
    vldr s1, [r0, #4]
    vldr s2, [r0, #8]
    bl {name}
    vstr s0, [r4]
    pop {{r4, pc}}
    .size use, .-use
""",
}

ZIG_TARGET = {"x86_32": ("-target", "x86-freestanding-none", "-mcpu=pentium4"),
              "arm32": ("-target", "arm-freestanding-eabihf", "-mcpu=cortex_a15")}
LINK = ["--build-id=none", "-nostdlib", "-static", "-shared", "--no-undefined",
        "--gc-sections", "-z", "now", "-z", "relro", "--hash-style=sysv"]


def zig(*args, cwd):
    subprocess.run([sys.executable, "-m", "ziglang", *map(str, args)], cwd=cwd,
                   check=True, capture_output=True)


def libm_object(arch: str, folder: Path) -> Path:
    path = folder / f"libm_{arch}.o"
    path.write_bytes(fatelf.select(runtime.LIBM_BUNDLE.read_bytes(), arch))
    return path


def call_use(so: Path, arch: str, values) -> float:
    module = elfloader.load(so, backend="emulated")
    try:
        be = module.backend
        src = be.alloc_bytes(np.float32(values).tobytes())
        dst = be.alloc_bytes(bytes(4))
        be.call(module.lookup("use"), src, dst)
        return float(np.frombuffer(be.read(dst, 4), np.float32)[0])
    finally:
        module.close()
        module.backend.close()


@zig_only
@pytest.mark.parametrize("arch", ARCHES32)
def test_linker_sends_calls_of_empty_functions_to_libm(tmp_path, arch):
    """An object calling a zero-byte fmaf (as iree-compile leaves it): linked
    plainly, the call runs past the code; through libm_link.py it calls
    libm.c's fmaf. An empty function libm.c lacks fails the link, named."""
    (tmp_path / "e.s").write_text(EMPTY_FUNCTION_ASM[arch].format(name="fmaf"))
    zig("cc", *ZIG_TARGET[arch], "-c", "e.s", "-o", "e.o", cwd=tmp_path)
    lib = libm_object(arch, tmp_path)
    lld = [sys.executable, "-m", "ziglang", "ld.lld"]

    zig("ld.lld", *LINK, "e.o", "-o", "plain.so", cwd=tmp_path)
    with pytest.raises(elfloader.EmulationError):
        call_use(tmp_path / "plain.so", arch, [2.0, 3.0, 4.0])

    data = (tmp_path / "e.o").read_bytes()
    fixed, names = libm_link.redirect_empty_functions(data, "e.o", {"fmaf"})
    assert names == ["fmaf"] and fixed != data
    # the script, as iree-compile runs it (through the shell, lld first)
    wrapper = tmp_path / "lld.sh"
    wrapper.write_text("#!/bin/sh\nexec " + " ".join(lld) + ' "$@"\n')
    wrapper.chmod(0o755)
    rc = libm_link.main([str(wrapper), str(lib), *LINK, str(tmp_path / "e.o"),
                         "-o", str(tmp_path / "fixed.so")])
    assert rc == 0
    assert call_use(tmp_path / "fixed.so", arch, [2.0, 3.0, 4.0]) == 10.0
    assert call_use(tmp_path / "fixed.so", arch, [1 + 2.0 ** -12, 1 - 2.0 ** -12, -1.0]) \
        == -(2.0 ** -24)

    (tmp_path / "m.s").write_text(EMPTY_FUNCTION_ASM[arch].format(name="mystery"))
    zig("cc", *ZIG_TARGET[arch], "-c", "m.s", "-o", "m.o", cwd=tmp_path)
    with pytest.raises(libm_link.LinkError, match="calls mystery, which"):
        libm_link.redirect_empty_functions((tmp_path / "m.o").read_bytes(), "m.o",
                                           {"fmaf"})
    proc = subprocess.run([sys.executable, str(runtime.LIBM_LINKER), str(wrapper),
                           str(lib), *LINK, str(tmp_path / "m.o"), "-o",
                           str(tmp_path / "m.so")], capture_output=True, text=True)
    assert proc.returncode == 1 and "calls mystery" in proc.stderr
    assert not (tmp_path / "m.so").exists()

    # iree-compile links the code it evaluates at compile time (for the
    # host) with the same linker: such objects are linked as they are
    (tmp_path / "host.c").write_text(
        "__attribute__((visibility(\"default\"))) int host(int a) { return a + 1; }\n")
    zig("cc", "-target", "x86_64-freestanding-none", "-fPIC", "-O2", "-c", "host.c",
        "-o", "host.o", cwd=tmp_path)
    rc = libm_link.main([str(wrapper), str(lib), *LINK, str(tmp_path / "host.o"),
                         "-o", str(tmp_path / "host.so")])
    assert rc == 0
    assert elfloader.read_image(tmp_path / "host.so").arch.name == "x86_64"


# --- libm.c itself ----------------------------------------------------------------

@zig_only
def test_libm_bundle_rebuilds_byte_identically(tmp_path, monkeypatch):
    from hal_cpu.buildtools import runtime as build
    from hal_cpu.buildtools import zig as zigbuild
    if zigbuild.zig_version() != zigbuild.ZIG_VERSION:
        pytest.skip(f"ziglang {zigbuild.zig_version()} is not {zigbuild.ZIG_VERSION}")
    monkeypatch.setenv("ZIG_GLOBAL_CACHE_DIR", str(tmp_path / "zig-cache"))
    path = build.build_libm_bundle(tmp_path / "out")
    assert path.read_bytes() == runtime.LIBM_BUNDLE.read_bytes()
    assert [r.arch for r in fatelf.read(path).records] == list(runtime.LIBM_ARCHES)


@pytest.fixture(scope="module")
def harness(tmp_path_factory):
    """arch -> shared object of libm_harness.c linked with the shipped libm
    object of that architecture."""
    if subprocess.run([sys.executable, "-c", "import ziglang"]).returncode:
        pytest.skip("ziglang not installed")
    folder = tmp_path_factory.mktemp("libm-harness")
    out = {}
    for arch in ARCHES32:
        zig("cc", *ZIG_TARGET[arch], "-fPIC", "-ffreestanding", "-fno-builtin",
            "-ffp-contract=off", "-O2", "-fvisibility=hidden", "-fno-unwind-tables",
            "-fno-asynchronous-unwind-tables", "-c", str(HARNESS), "-o", f"h_{arch}.o",
            cwd=folder)
        lib = libm_object(arch, folder)
        zig("ld.lld", *LINK, f"h_{arch}.o", lib.name, "-o", f"h_{arch}.so", cwd=folder)
        out[arch] = folder / f"h_{arch}.so"
    return out


class Harness:
    """libm_harness.c loaded emulated: ``h(fn, *args, out_dtype=, n=)``
    calls ``fn(*args, out, n)``, arrays copied into guest memory."""

    def __init__(self, so, engine):
        self.module = elfloader.load(so, backend="emulated", engine=engine)
        self.be = self.module.backend

    def __call__(self, fn, *args, out_dtype, n):
        size = n * np.dtype(out_dtype).itemsize
        ptrs = [self.be.alloc_bytes(np.ascontiguousarray(a).tobytes())
                if isinstance(a, np.ndarray) else a for a in args]
        dst = self.be.alloc_bytes(bytes(size))
        self.be.call(self.module.lookup(fn), *ptrs, dst, n)
        return np.frombuffer(self.be.read(dst, size), out_dtype)

    def close(self):
        self.module.close()
        self.be.close()


def _random_doubles(rng, n):
    bits = rng.integers(0, 1 << 63, n, dtype=np.int64).astype(np.uint64)
    bits |= rng.integers(0, 2, n, dtype=np.uint64) << np.uint64(63)
    x = bits.view(np.float64)
    near = rng.standard_normal(n) * 2.0 ** rng.integers(-3, 60, n)
    halves = rng.integers(-(1 << 53), 1 << 53, n) / 2.0
    special = np.float64([0.5, -0.5, 2.5, -2.5, 0.49999999999999994, 4503599627370495.5,
                          4503599627370496.0, 0.0, -0.0, np.inf, -np.inf, np.nan, 5e-324])
    return np.concatenate([x, near, halves, special])


def round_half_away64(x):
    t = np.trunc(x)
    with np.errstate(invalid="ignore"):
        r = np.where(np.abs(x - t) >= 0.5, t + np.sign(x), t)
    return np.where(np.isfinite(x), r, x)


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("arch", ARCHES32)
def test_libm_functions_are_exact(harness, arch, engine):
    """Every function of libm.c, as shipped in libm.sos, on both 32-bit
    architectures and engines: rounding (f32, f64), fmax/fmin (NaN,
    signed zeros), fmaf and the conversions to f16 (x86_32: also as SSE2
    code calls them), bit for bit against exact references."""
    rng = np.random.default_rng(RNG_SEED)
    h = Harness(harness[arch], engine)
    try:
        x = rounding_inputs(rng)
        d = _random_doubles(rng, 1000)
        refs32 = [np.floor(x), np.ceil(x), np.trunc(x), round_half_away(x),
                  np.round(x), np.round(x), np.round(x)]
        refs64 = [np.floor(d), np.ceil(d), np.trunc(d), round_half_away64(d),
                  np.round(d), np.round(d), np.round(d)]
        names = ("floor", "ceil", "trunc", "round", "roundeven", "rint", "nearbyint")
        for op, name in enumerate(names):
            got = h("t_unary32", op, x, out_dtype=np.float32, n=x.size)
            assert_same_bits(got, refs32[op].astype(np.float32), name + "f")
            got = h("t_unary64", op, d, out_dtype=np.float64, n=d.size)
            assert_same_bits(got, refs64[op], name)

        for dtype, fn, vals in ((np.float32, "t_binary32", x), (np.float64, "t_binary64", d)):
            a = vals
            b = np.concatenate([vals[1:], vals[:1]])
            b[::5] = -a[::5]
            hi = np.where(np.isnan(a), b, np.where(np.isnan(b), a, np.maximum(a, b)))
            lo = np.where(np.isnan(a), b, np.where(np.isnan(b), a, np.minimum(a, b)))
            zeros = (a == 0) & (b == 0)   # max(-0, +0) = +0, min = -0
            hi = np.where(zeros, np.where(np.signbit(a) & np.signbit(b), a, np.abs(a)), hi)
            lo = np.where(zeros, np.where(np.signbit(a) | np.signbit(b), -np.abs(a), a), lo)
            for op, ref in enumerate((hi, lo)):
                got = h(fn, op, a, b, out_dtype=dtype, n=a.size)
                assert_same_bits(got, ref.astype(dtype), f"{fn}[{op}]")

        a, b, c = fma_inputs(rng)
        got = h("t_fmaf", a, b, c, out_dtype=np.float32, n=a.size)
        assert_same_bits(got, fma_exact(a, b, c), "fmaf")

        # conversions to f16 (numpy rounds to nearest even, once)
        x = np.concatenate([x, (rng.standard_normal(2000) * 2.0 ** rng.integers(
            -28, 18, 2000)).astype(np.float32),
            np.float32([65504, 65519.996, 65520, 2.0 ** -24, 2.0 ** -25, 3 * 2.0 ** -26])])
        d = np.concatenate([d, rng.standard_normal(2000) * 2.0 ** rng.integers(-28, 18, 2000),
                            [65519.99999999999, 65520.0, 2.0 ** -25, 2.0 ** -25 + 2.0 ** -70]])
        for fn, vals in (("t_f2h", x), ("t_d2h", d)):
            got = h(fn, vals, out_dtype=np.uint16, n=vals.size).view(np.float16)
            assert_same_bits(got, vals.astype(np.float16), fn)
        if arch == "x86_32":     # as __truncsfhf2/__truncdfhf2 of SSE2 code
            for fn, vals in (("t_f2h_xmm0", x), ("t_d2h_xmm0", d)):
                got = h(fn, vals, out_dtype=np.float16, n=vals.size)
                assert_same_bits(got, vals.astype(np.float16), fn)
    finally:
        h.close()


# --- references through undefined symbols ------------------------------------------

UNDEFINED_C = """
extern float fmaf(float, float, float);
extern int counter;
float (*volatile pointer)(float, float, float) = fmaf;
__attribute__((visibility("default"))) float call_fmaf(float a) { return fmaf(a, a, a); }
__attribute__((visibility("default"))) int read_counter(void) { return counter; }
"""


def _relocation_types(path: Path) -> set[int]:
    from elftools.elf.elffile import ELFFile
    from elftools.elf.relocation import RelocationSection
    with open(path, "rb") as f:
        elf = ELFFile(f)
        return {r["r_info_type"] for sec in elf.iter_sections()
                if isinstance(sec, RelocationSection) for r in sec.iter_relocations()}


@zig_only
@pytest.mark.parametrize("arch", ARCHES32)
def test_undefined_symbol_is_a_load_time_error(tmp_path, arch):
    """An executable referring to symbols nothing defines (JUMP_SLOT,
    GLOB_DAT, 32/ABS32, a text relocation PC32; and a relocation type the
    loader does not apply) fails to load, naming them; nothing is mapped."""
    (tmp_path / "u.c").write_text(UNDEFINED_C)
    flags = [*ZIG_TARGET[arch], "-O2", "-ffreestanding", "-fvisibility=hidden",
             "-fno-unwind-tables", "-fno-asynchronous-unwind-tables"]
    zig("cc", *flags, "-fPIC", "-c", "u.c", "-o", "u.o", cwd=tmp_path)
    zig("ld.lld", "--build-id=none", "-nostdlib", "-shared", "-z", "now",
        "--hash-style=sysv", "u.o", "-o", "u.so", cwd=tmp_path)
    files = [tmp_path / "u.so"]
    if arch == "x86_32":   # non-PIC code: an R_386_PC32 in .text
        zig("cc", *flags, "-fno-pic", "-c", "u.c", "-o", "n.o", cwd=tmp_path)
        zig("ld.lld", "--build-id=none", "-nostdlib", "-shared", "-z", "notext", "-z",
            "now", "--hash-style=sysv", "n.o", "-o", "n.so", cwd=tmp_path)
        files.append(tmp_path / "n.so")
        assert 2 in _relocation_types(tmp_path / "n.so")     # R_386_PC32
    for path in files:
        with pytest.raises(elfloader.UndefinedSymbolError) as info:
            elfloader.load(path, backend="emulated")
        assert "fmaf" in str(info.value) and "counter" in str(info.value)
        assert info.value.value == ["fmaf", "counter"]

    # the PLT slot's relocation turned into one the loader does not apply
    # (R_386_PLT32 / R_ARM_CALL, as in relocatable objects): still named
    jump_slot, other = {"x86_32": (7, 4), "arm32": (22, 28)}[arch]
    data = bytearray((tmp_path / "u.so").read_bytes())
    patched = _retype(data, jump_slot, other)
    (tmp_path / "r.so").write_bytes(patched)
    with pytest.raises(elfloader.UndefinedSymbolError,
                       match=rf"undefined symbol fmaf \(relocation type {other}"):
        elfloader.read_image(tmp_path / "r.so")


def _retype(data: bytearray, old: int, new: int) -> bytes:
    """The ELF32 ``data`` with every REL relocation of type ``old`` made
    type ``new`` (section headers read with pyelftools)."""
    import io

    from elftools.elf.elffile import ELFFile
    from elftools.elf.relocation import RelocationSection
    elf = ELFFile(io.BytesIO(bytes(data)))
    count = 0
    for sec in elf.iter_sections():
        if not isinstance(sec, RelocationSection):
            continue
        for i in range(sec.num_relocations()):
            at = sec["sh_offset"] + i * sec["sh_entsize"] + 4
            (info,) = struct.unpack_from("<I", data, at)
            if info & 0xFF == old:
                struct.pack_into("<I", data, at, (info & ~0xFF) | new)
                count += 1
    assert count
    return bytes(data)
