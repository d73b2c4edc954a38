"""The runtime's support library for 32-bit executables (``libm.sos``:
``hal_cpu/runtime/libm.c`` joined with compiler-rt's builtins as zig ships
them) against the host, function by function, on x86_32, arm32 and
riscv32, emulated.

``tests/programs/support32/builtins_harness.c`` wraps each function in an
array loop; it is built for the architecture's default CPU profile, with
the calling convention iree-compile's code uses (riscv32: floats in integer
registers, ilp32), linked with the shipped object and loaded emulated.
Every result is compared bit for bit with numpy's (IEEE conversions and
arithmetic, round to nearest even) or Python's integers (C's truncating
division) over edge inputs: zeros of both signs, infinities, NaNs,
subnormals, rounding ties, overflow to infinity and random bit patterns.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import elfloader
import fatelf
from fatelf import arches
from hal_cpu import runtime
from hal_cpu.buildtools import libm_link

from conftest import ROOT

HARNESS = ROOT / "tests" / "programs" / "support32" / "builtins_harness.c"
ARCHES = ("x86_32", "arm32", "riscv32")
LINK = ["--build-id=none", "-nostdlib", "-static", "-shared", "--no-undefined",
        "--gc-sections", "-z", "now", "-z", "relro", "--hash-style=sysv"]
N = 400

pytestmark = [
    pytest.mark.skipif(subprocess.run([sys.executable, "-c", "import ziglang"],
                                      capture_output=True).returncode,
                       reason="ziglang not installed"),
    pytest.mark.filterwarnings("ignore::RuntimeWarning"),
]

#: the support functions LLVM's code for IREE's programs calls, per
#: architecture: compiler-rt's conversions, integer division and shifts,
#: ARM's run-time ABI helpers, and the libm functions iree-compile's
#: bitcode leaves empty or lacks
REQUIRED = {
    "common": ["__divdi3", "__udivdi3", "__moddi3", "__umoddi3", "__extendhfsf2",
               "__truncsfhf2", "__truncdfhf2", "__extendhfdf2", "fmaf", "floor",
               "round", "fmaxf", "fminf", "fmax", "fmin", "truncf", "roundf",
               "rintf", "nearbyintf", "floorf", "ceilf"],
    "x86_32": ["__extendsfdf2", "__truncdfsf2", "__ashldi3", "__lshrdi3",
               "__ashrdi3", "__muldi3", "__gnu_h2f_ieee", "__gnu_f2h_ieee",
               "__fixsfdi", "__floatdisf", "__fixdfdi", "__floatdidf",
               "hal_cpu_truncsfhf2_xmm0", "hal_cpu_truncdfhf2_xmm0"],
    "arm32": ["__aeabi_idiv", "__aeabi_uidiv", "__aeabi_idivmod", "__aeabi_uidivmod",
              "__aeabi_ldivmod", "__aeabi_uldivmod", "__aeabi_llsl", "__aeabi_llsr",
              "__aeabi_lasr", "__aeabi_lmul", "__aeabi_h2f", "__aeabi_f2h",
              "__aeabi_d2h", "__aeabi_f2d", "__aeabi_d2f", "__aeabi_dadd",
              "__aeabi_dmul", "__aeabi_ddiv", "__aeabi_f2lz", "__aeabi_l2f"],
    "riscv32": ["__extendsfdf2", "__truncdfsf2", "__adddf3", "__subdf3", "__muldf3",
                "__divdf3", "__ashldi3", "__lshrdi3", "__ashrdi3", "__muldi3",
                "__fixsfdi", "__floatdisf", "__fixdfdi", "__floatdidf"],
}


def zig(*args, cwd):
    proc = subprocess.run([sys.executable, "-m", "ziglang", *map(str, args)], cwd=cwd,
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def harness_flags(arch: str) -> list[str]:
    """zig flags of the default profile, with iree-compile's calling
    convention (riscv32: ilp32 although the CPU has +f)."""
    flags = list(arches.profile(arch, arches.DEFAULT_PROFILES[arch]).zig_flags)
    return flags + (["-mabi=ilp32"] if arch == "riscv32" else [])


def libm_object(arch: str) -> bytes:
    return fatelf.select(runtime.LIBM_BUNDLE.read_bytes(), arch)


@pytest.fixture(scope="module")
def harnesses(tmp_path_factory):
    """arch -> loaded harness (built once per session)."""
    folder = tmp_path_factory.mktemp("support-harness")
    out = {}
    for arch in ARCHES:
        (folder / f"libm_{arch}.o").write_bytes(libm_object(arch))
        zig("cc", *harness_flags(arch), "-fPIC", "-ffreestanding", "-fno-builtin",
            "-ffp-contract=off", "-O2", "-fvisibility=hidden", "-fno-unwind-tables",
            "-fno-asynchronous-unwind-tables", "-c", HARNESS, "-o", f"h_{arch}.o",
            cwd=folder)
        zig("ld.lld", *LINK, f"h_{arch}.o", f"libm_{arch}.o", "-o", f"h_{arch}.so",
            cwd=folder)
        out[arch] = Harness(folder / f"h_{arch}.so")
    yield out
    for h in out.values():
        h.close()


class Harness:
    """The harness loaded emulated: ``h(name, *arrays, out=dtype)`` runs
    ``t_<name>(arrays..., out, n)``."""

    def __init__(self, so: Path):
        self.module = elfloader.load(so, backend="emulated")
        self.be = self.module.backend

    def __call__(self, name, *arrays, out, per: int = 1):
        n = len(arrays[0])
        ptrs = [self.be.alloc_bytes(np.ascontiguousarray(a).tobytes()) for a in arrays]
        size = n * per * np.dtype(out).itemsize
        dst = self.be.alloc_bytes(bytes(size))
        self.be.call(self.module.lookup(f"t_{name}"), *ptrs, dst, n)
        return np.frombuffer(self.be.read(dst, size), out).copy()

    def close(self):
        self.module.close()
        self.be.close()


# --- inputs -------------------------------------------------------------------

RNG = np.random.default_rng(34)


def f32_inputs() -> np.ndarray:
    special = np.float32([
        0.0, -0.0, np.inf, -np.inf, np.nan, -np.nan, 1.0, -1.0, 0.5, 1.5, 2.5, -2.5,
        3.4028235e38, -3.4028235e38, 1.17549435e-38, 1e-45, -1e-45, 1.1754942e-38,
        65504.0, 65519.996, 65520.0, -65520.0, 6.1035156e-05, 6.0975552e-05,
        5.9604645e-08, 2.9802322e-08, 2.9802326e-08, 8.940697e-08, 1e-8,
        1.00048828125, 1.00146484375, 1.0009765625, 2049.0, 2051.0, 0.1, -0.7,
        16777217.0, 9.223372e18, -9.223372e18, 1e10, -123456.789])
    bits = RNG.integers(0, 1 << 32, N, dtype=np.uint64).astype(np.uint32)
    return np.concatenate([special, bits.view(np.float32)])


def f64_inputs() -> np.ndarray:
    special = np.float64([
        0.0, -0.0, np.inf, -np.inf, np.nan, 1.0, -1.0, 0.5, 2.5, -2.5,
        1.7976931348623157e308, 2.2250738585072014e-308, 5e-324, -5e-324,
        3.4028235677973366e38, 3.4028235677973362e38, 3.402823669209385e38,
        1.1754943508222875e-38, 1.401298464324817e-45, 7.006492321624085e-46,
        7.006492321624087e-46, 65504.0, 65519.99999999999, 65520.0,
        2.9802322387695312e-08, 2.9802322387695316e-08, 1.0000000596046448,
        1.0000001788139343, 0.1, 1e300, -1e-300, 4503599627370496.5,
        9.223372036854776e18])
    bits = RNG.integers(0, 1 << 63, N, dtype=np.int64).astype(np.uint64)
    bits |= RNG.integers(0, 2, N, dtype=np.uint64) << np.uint64(63)
    near = RNG.standard_normal(N) * 2.0 ** RNG.integers(-40, 40, N)
    return np.concatenate([special, bits.view(np.float64), near])


def f16_inputs() -> np.ndarray:
    return np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)   # all of them


def i64_inputs() -> np.ndarray:
    special = [0, 1, -1, 2, -2, 3, 7, -7, (1 << 31) - 1, -(1 << 31), 1 << 31, 1 << 32,
               (1 << 32) - 1, (1 << 63) - 1, -(1 << 63), -(1 << 63) + 1, 10 ** 18]
    rand = RNG.integers(-(1 << 63), (1 << 63) - 1, N, dtype=np.int64)
    small = RNG.integers(-1000, 1000, N, dtype=np.int64)
    return np.concatenate([np.int64(special), rand, small])


# --- references ---------------------------------------------------------------

def bits(a) -> np.ndarray:
    a = np.asarray(a)
    return a.view({2: np.uint16, 4: np.uint32, 8: np.uint64}[a.dtype.itemsize])


def assert_same(got, want, what):
    """Equal bit for bit; any NaN equals any NaN."""
    got, want = np.asarray(got), np.asarray(want)
    assert got.dtype == want.dtype and got.shape == want.shape, what
    if want.dtype.kind == "f":
        nan = np.isnan(want)
        np.testing.assert_array_equal(np.isnan(got), nan, err_msg=what)
        bad = np.nonzero((bits(got) != bits(want)) & ~nan)[0]
    else:
        bad = np.nonzero(got != want)[0]
    assert not len(bad), (f"{what}: {len(bad)} differ, first at {bad[0]}: "
                          f"got {got[bad[0]]!r}, want {want[bad[0]]!r}")


def c_div(a: int, b: int) -> int:
    q = abs(a) // abs(b)
    return q if (a < 0) == (b < 0) else -q


def c_mod(a: int, b: int) -> int:
    return a - b * c_div(a, b)


def wrap(v: int, bits_: int = 64, signed: bool = True) -> int:
    v &= (1 << bits_) - 1
    return v - (1 << bits_) if signed and v >> (bits_ - 1) else v


# --- the names LLVM calls --------------------------------------------------------

@pytest.mark.parametrize("arch", ARCHES)
def test_every_called_support_function_is_provided(arch):
    """The object of each 32-bit architecture defines every function LLVM's
    code for IREE's programs calls there (conversions, 64-bit integer
    division and shifts, ARM's helpers, libm), none of them exported from
    an executable (hidden), and builds for that architecture's ABI."""
    obj = libm_link.Obj(libm_object(arch), arch)
    defined = obj.defined_globals()
    missing = sorted(set(REQUIRED["common"] + REQUIRED[arch]) - defined)
    assert not missing, missing
    visible = [obj.string(s["name"]) for s in obj.symbols[1:]
               if s["info"] >> 4 != 0 and s["shndx"] and s["other"] & 3 != 2]
    assert visible == []
    assert obj.machine == arches.lookup(arch).machine and obj.bits == 32


# --- conversions -----------------------------------------------------------------

def _f16_from_f32_names(arch):
    names = ["__truncsfhf2"] if arch != "x86_32" else []
    return names + {"arm32": ["__aeabi_f2h"], "x86_32": ["__gnu_f2h_ieee"]}.get(arch, [])


def _f32_from_f16_names(arch):
    return ["__extendhfsf2"] + {"arm32": ["__aeabi_h2f"],
                                "x86_32": ["__gnu_h2f_ieee"]}.get(arch, [])


@pytest.mark.parametrize("arch", ARCHES)
def test_f16_conversions(harnesses, arch):
    """f16 -> f32/f64 over all 65536 halves; f32/f64 -> f16 rounded to
    nearest even (ties, the largest half, overflow to infinity, subnormal
    halves, NaN) as numpy converts."""
    h = harnesses[arch]
    halves = f16_inputs()
    for name in _f32_from_f16_names(arch):
        assert_same(h(name, halves, out=np.uint32).view(np.float32),
                    halves.view(np.float16).astype(np.float32), f"{arch} {name}")
    assert_same(h("__extendhfdf2", halves, out=np.uint64).view(np.float64),
                halves.view(np.float16).astype(np.float64), f"{arch} __extendhfdf2")
    x = f32_inputs()
    for name in _f16_from_f32_names(arch):
        assert_same(h(name, x.view(np.uint32), out=np.uint16).view(np.float16),
                    x.astype(np.float16), f"{arch} {name}")
    d = f64_inputs()
    for name in (["__truncdfhf2"] if arch != "x86_32" else []) + (
            ["__aeabi_d2h"] if arch == "arm32" else []):
        assert_same(h(name, d.view(np.uint64), out=np.uint16).view(np.float16),
                    d.astype(np.float16), f"{arch} {name}")


@pytest.mark.parametrize("arch", ARCHES)
def test_f32_f64_conversions_and_double_arithmetic(harnesses, arch):
    """f32 <-> f64 (round to nearest even, overflow, subnormal results) and
    the software double arithmetic of targets without a double FPU (arm32
    calls ARM's names; riscv32 and x86_32 the generic ones)."""
    h = harnesses[arch]
    x, d = f32_inputs(), f64_inputs()
    ext, trunc = (("__aeabi_f2d", "__aeabi_d2f") if arch == "arm32"
                  else ("__extendsfdf2", "__truncdfsf2"))
    assert_same(h(ext, x.view(np.uint32), out=np.uint64).view(np.float64),
                x.astype(np.float64), f"{arch} {ext}")
    assert_same(h(trunc, d.view(np.uint64), out=np.uint32).view(np.float32),
                d.astype(np.float32), f"{arch} {trunc}")
    a, b = d, np.roll(d, 7)
    ops = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide}
    for op, ref in ops.items():
        name = f"__aeabi_d{op}" if arch == "arm32" else f"__{op}df3"
        got = h(name, a.view(np.uint64), b.view(np.uint64), out=np.uint64).view(np.float64)
        want = ref(a, b)
        if op == "div":
            # zig's compiler-rt rounds a subnormal quotient to within one
            # unit in the last place, not always to the nearest (LLVM only
            # calls __divdf3 on riscv32 rv32imf, whose CPU has no doubles)
            sub = np.isfinite(want) & (np.abs(want) < 2.2250738585072014e-308)
            ulps = np.abs(bits(got[sub]).astype(np.int64) - bits(want[sub]).astype(np.int64))
            assert ulps.max(initial=0) <= 1, f"{arch} {name} subnormal quotients"
            got, want = got[~sub], want[~sub]
        assert_same(got, want, f"{arch} {name}")


@pytest.mark.parametrize("arch", ARCHES)
def test_integer_float_conversions(harnesses, arch):
    """i64 <-> f32/f64: truncation toward zero for values in range,
    rounding to nearest even the other way."""
    h = harnesses[arch]
    names = ({"f2l": "__aeabi_f2lz", "f2ul": "__aeabi_f2ulz", "l2f": "__aeabi_l2f",
              "ul2f": "__aeabi_ul2f", "d2l": "__aeabi_d2lz", "l2d": "__aeabi_l2d"}
             if arch == "arm32" else
             {"f2l": "__fixsfdi", "f2ul": "__fixunssfdi", "l2f": "__floatdisf",
              "ul2f": "__floatundisf", "d2l": "__fixdfdi", "l2d": "__floatdidf"})
    x = f32_inputs()
    x = x[np.isfinite(x) & (np.abs(x) < 9.2e18)]
    assert_same(h(names["f2l"], x.view(np.uint32), out=np.int64),
                np.trunc(x).astype(np.int64), f"{arch} f32 -> i64")
    xu = x[x >= 0]
    assert_same(h(names["f2ul"], xu.view(np.uint32), out=np.uint64),
                np.trunc(xu).astype(np.uint64), f"{arch} f32 -> u64")
    d = f64_inputs()
    d = d[np.isfinite(d) & (np.abs(d) < 9.2e18)]
    assert_same(h(names["d2l"], d.view(np.uint64), out=np.int64),
                np.trunc(d).astype(np.int64), f"{arch} f64 -> i64")
    i = i64_inputs()
    assert_same(h(names["l2f"], i, out=np.uint32).view(np.float32),
                i.astype(np.float32), f"{arch} i64 -> f32")
    assert_same(h(names["l2d"], i, out=np.uint64).view(np.float64),
                i.astype(np.float64), f"{arch} i64 -> f64")
    u = i.view(np.uint64)
    assert_same(h(names["ul2f"], u, out=np.uint32).view(np.float32),
                u.astype(np.float32), f"{arch} u64 -> f32")


# --- integers ----------------------------------------------------------------------

@pytest.mark.parametrize("arch", ARCHES)
def test_64_bit_division_multiplication_and_shifts(harnesses, arch):
    """Signed and unsigned 64-bit quotient and remainder (C's truncation,
    INT64_MIN, divisors of every size; no division by zero or overflowing
    INT64_MIN / -1), products modulo 2^64 and shifts by 0..63."""
    h = harnesses[arch]
    a = i64_inputs()
    b = np.roll(a, 5)
    b[b == 0] = 3
    b[(a == -(1 << 63)) & (b == -1)] = 2
    A, B = [int(v) for v in a], [int(v) for v in b]
    U, V = [v & (2 ** 64 - 1) for v in A], [v & (2 ** 64 - 1) for v in B]
    want = {
        "__divdi3": np.int64([c_div(x, y) for x, y in zip(A, B)]),
        "__moddi3": np.int64([c_mod(x, y) for x, y in zip(A, B)]),
        "__udivdi3": np.uint64([x // y for x, y in zip(U, V)]),
        "__umoddi3": np.uint64([x % y for x, y in zip(U, V)]),
    }
    for name, ref in want.items():
        signed = ref.dtype == np.int64
        got = h(name, a if signed else a.view(np.uint64), b if signed else b.view(np.uint64),
                out=ref.dtype)
        assert_same(got, ref, f"{arch} {name}")
    products = np.int64([wrap(x * y) for x, y in zip(A, B)])
    shifts = RNG.integers(0, 64, len(a), dtype=np.int32)
    shifts[:64] = np.arange(64)
    S = [int(s) for s in shifts]
    shl = np.int64([wrap(x << s) for x, s in zip(A, S)])
    sar = np.int64([x >> s for x, s in zip(A, S)])
    shr = np.uint64([x >> s for x, s in zip(U, S)])
    arm = arch == "arm32"
    assert_same(h("__aeabi_lmul" if arm else "__muldi3", a, b, out=np.int64), products,
                f"{arch} multiply")
    assert_same(h("__aeabi_llsl" if arm else "__ashldi3", a, shifts, out=np.int64), shl,
                f"{arch} shift left")
    assert_same(h("__aeabi_lasr" if arm else "__ashrdi3", a, shifts, out=np.int64), sar,
                f"{arch} arithmetic shift right")
    assert_same(h("__aeabi_llsr" if arm else "__lshrdi3", a.view(np.uint64), shifts,
                  out=np.uint64), shr, f"{arch} logical shift right")
    if arm:
        q = h("__aeabi_ldivmod", a, b, out=np.uint32, per=4).reshape(-1, 4)
        assert_same(q[:, :2].copy().view(np.int64).ravel(), want["__divdi3"], "ldivmod q")
        assert_same(q[:, 2:].copy().view(np.int64).ravel(), want["__moddi3"], "ldivmod r")
        q = h("__aeabi_uldivmod", a.view(np.uint64), b.view(np.uint64),
              out=np.uint32, per=4).reshape(-1, 4)
        assert_same(q[:, :2].copy().view(np.uint64).ravel(), want["__udivdi3"], "uldivmod q")
        assert_same(q[:, 2:].copy().view(np.uint64).ravel(), want["__umoddi3"], "uldivmod r")


def test_arm_32_bit_division(harnesses):
    """ARM's __aeabi_idiv/uidiv and the divmod pairs (quotient in r0,
    remainder in r1), signed and unsigned, INT32_MIN included."""
    h = harnesses["arm32"]
    a = np.concatenate([np.int32([0, 1, -1, 7, -7, 2 ** 31 - 1, -2 ** 31, 100, -100]),
                        RNG.integers(-2 ** 31, 2 ** 31 - 1, N, dtype=np.int32)])
    b = np.roll(a, 3)
    b[b == 0] = 5
    b[(a == -2 ** 31) & (b == -1)] = 7
    A, B = [int(v) for v in a], [int(v) for v in b]
    U, V = [v & 0xFFFFFFFF for v in A], [v & 0xFFFFFFFF for v in B]
    q = np.int32([c_div(x, y) for x, y in zip(A, B)])
    r = np.int32([c_mod(x, y) for x, y in zip(A, B)])
    uq = np.uint32([x // y for x, y in zip(U, V)])
    ur = np.uint32([x % y for x, y in zip(U, V)])
    assert_same(h("__aeabi_idiv", a, b, out=np.int32), q, "idiv")
    assert_same(h("__aeabi_uidiv", a.view(np.uint32), b.view(np.uint32), out=np.uint32),
                uq, "uidiv")
    pair = h("__aeabi_idivmod", a, b, out=np.uint32, per=2).reshape(-1, 2)
    assert_same(pair[:, 0].copy().view(np.int32), q, "idivmod q")
    assert_same(pair[:, 1].copy().view(np.int32), r, "idivmod r")
    pair = h("__aeabi_uidivmod", a.view(np.uint32), b.view(np.uint32),
             out=np.uint32, per=2).reshape(-1, 2)
    assert_same(pair[:, 0].copy(), uq, "uidivmod q")
    assert_same(pair[:, 1].copy(), ur, "uidivmod r")


# --- libm ------------------------------------------------------------------------------

@pytest.mark.parametrize("arch", ARCHES)
def test_libm_functions_iree_compile_leaves_empty_or_lacks(harnesses, arch):
    """fmaxf/fminf (IEEE maxNum/minNum: a NaN gives the other operand),
    truncf, roundf (half away from zero), floor and round of doubles: as
    numpy computes them, bit for bit."""
    h = harnesses[arch]
    x = f32_inputs()
    y = np.roll(x, 3)
    assert_same(h("fmaxf", x.view(np.uint32), y.view(np.uint32), out=np.uint32)
                .view(np.float32), np.fmax(x, y), f"{arch} fmaxf")
    assert_same(h("fminf", x.view(np.uint32), y.view(np.uint32), out=np.uint32)
                .view(np.float32), np.fmin(x, y), f"{arch} fminf")
    assert_same(h("truncf", x.view(np.uint32), out=np.uint32).view(np.float32),
                np.trunc(x), f"{arch} truncf")
    away = np.where(np.isfinite(x), np.copysign(np.floor(np.abs(x) + np.float32(0.5)), x), x)
    # |x| + 0.5 rounds up for the float just below 0.5 and for odd values
    # at 2^23..2^24: the exact rule there
    exact = np.abs(x) >= 2.0 ** 23
    away = np.where(exact, x, away)
    below_half = np.abs(x) < 0.5
    away = np.where(below_half & np.isfinite(x), np.copysign(np.float32(0), x), away)
    assert_same(h("roundf", x.view(np.uint32), out=np.uint32).view(np.float32),
                away.astype(np.float32), f"{arch} roundf")
    d = f64_inputs()
    assert_same(h("floor", d.view(np.uint64), out=np.uint64).view(np.float64),
                np.floor(d), f"{arch} floor")
    ad = np.abs(d)
    fl = np.floor(ad)
    rd = np.where(ad - fl >= 0.5, fl + 1, fl)
    rd = np.where(np.isfinite(d), np.copysign(rd, d), d)
    assert_same(h("round", d.view(np.uint64), out=np.uint64).view(np.float64),
                rd, f"{arch} round")
