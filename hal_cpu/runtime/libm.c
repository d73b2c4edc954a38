/* Math library functions that iree-compile 3.13 leaves missing or empty in
 * the executables it builds for 32-bit targets.
 *
 * iree-compile links musl's math functions into every embedded ELF as LLVM
 * bitcode, because LLVM turns some intrinsics into calls to libm during
 * instruction selection. For 32-bit targets it links the bitcode it built
 * for wasm32 (libmusl_wasm32_generic.bc), in which fmaf, floor and round
 * are functions whose whole body is `unreachable`: they compile to zero
 * bytes, so a call to them runs whatever code follows (or falls off the end
 * of .text). Other functions LLVM may call (fmaxf, fminf, truncf, ...) are
 * not in that bitcode at all, and the link fails with "undefined symbol".
 *
 * hal_cpu/runtime/libm_link.py, the linker iree-compile runs for these
 * targets, sends the calls to the empty functions to the ones here, and
 * links this object so that the missing ones resolve. It also sends, for
 * x86_32 CPUs with SSE2, the f32/f64 -> f16 conversions to versions that
 * return the half in xmm0 as LLVM's callers then expect (IREE's device
 * library returns it in st(0) and eax, right only without SSE2).
 *
 * Everything is integer arithmetic on the IEEE-754 bit patterns (round to
 * nearest even, no floating-point exceptions), so the results are exact
 * and the same on every FPU: x87 (whose excess precision breaks the usual
 * `x + 0x1p23 - 0x1p23` tricks), SSE, VFP, or none. Freestanding C, no libc.
 */

#pragma STDC FP_CONTRACT OFF

typedef unsigned int u32;
typedef unsigned long long u64;

#define EXPORT __attribute__((visibility("hidden"), used))

static inline u32 f2u(float f) {
  u32 u;
  __builtin_memcpy(&u, &f, 4);
  return u;
}

static inline float u2f(u32 u) {
  float f;
  __builtin_memcpy(&f, &u, 4);
  return f;
}

static inline u64 d2u(double d) {
  u64 u;
  __builtin_memcpy(&u, &d, 8);
  return u;
}

static inline double u2d(u64 u) {
  double d;
  __builtin_memcpy(&d, &u, 8);
  return d;
}

static inline int clz64(u64 x) { /* x != 0 */
  u32 hi = (u32)(x >> 32);
  return hi ? __builtin_clz(hi) : 32 + __builtin_clz((u32)x);
}

/* ---------------------------------------------------------------- fmaf -- */

#define F_SIGN 0x80000000u
#define F_ABS 0x7fffffffu
#define F_INF 0x7f800000u
#define F_QNAN 0x7fc00000u
#define F_QUIET 0x00400000u

/* x * y + z with one rounding. */
EXPORT float fmaf(float x, float y, float z) {
  u32 ux = f2u(x), uy = f2u(y), uz = f2u(z);
  u32 ax = ux & F_ABS, ay = uy & F_ABS, az = uz & F_ABS;
  u32 sp = (ux ^ uy) & F_SIGN, sz = uz & F_SIGN;

  /* NaN, infinity and zero operands */
  if (ax > F_INF) return u2f(ux | F_QUIET);
  if (ay > F_INF) return u2f(uy | F_QUIET);
  if (az > F_INF) return u2f(uz | F_QUIET);
  if (ax == F_INF || ay == F_INF) {
    if (ax == 0 || ay == 0) return u2f(F_QNAN);          /* inf * 0 */
    if (az == F_INF && sz != sp) return u2f(F_QNAN);     /* inf - inf */
    return u2f(sp | F_INF);
  }
  if (az == F_INF) return z;
  if (ax == 0 || ay == 0) {
    if (az == 0) return u2f(sp & sz);  /* -0 only when both are -0 */
    return z;
  }

  /* finite, non-zero product: P * 2^ep, and z: Z * 2^ez */
  u32 mx = ax >> 23 ? (ax & 0x7fffff) | 0x800000 : ax;
  u32 my = ay >> 23 ? (ay & 0x7fffff) | 0x800000 : ay;
  int ex = ax >> 23 ? (int)(ax >> 23) - 150 : -149;
  int ey = ay >> 23 ? (int)(ay >> 23) - 150 : -149;
  u64 P = (u64)mx * my;
  int ep = ex + ey;
  int n = clz64(P) - 1;          /* most significant bit to bit 62 */
  P <<= n;
  ep -= n;

  u64 R;
  int E;
  u32 sign;
  if (az == 0) {
    R = P, E = ep, sign = sp;
  } else {
    u32 mz = az >> 23 ? (az & 0x7fffff) | 0x800000 : az;
    int ez = az >> 23 ? (int)(az >> 23) - 150 : -149;
    u64 Z = mz;
    n = clz64(Z) - 1;
    Z <<= n;
    ez -= n;
    /* L: the operand of larger magnitude; S is shifted right to its scale,
     * the bits shifted out kept as a sticky bit in bit 0. L has at most 48
     * significant bits from bit 62, so its low 15 bits are zero and the
     * sticky bit decides ties and boundaries exactly. */
    u64 L, S;
    int d;
    u32 sl, ss;
    if (ep > ez || (ep == ez && P >= Z)) {
      L = P, S = Z, E = ep, d = ep - ez, sl = sp, ss = sz;
    } else {
      L = Z, S = P, E = ez, d = ez - ep, sl = sz, ss = sp;
    }
    if (d >= 63) {
      S = 1;
    } else if (d > 0) {
      S = (S >> d) | ((S & ((1ull << d) - 1)) != 0);
    }
    R = sl == ss ? L + S : L - S;
    if (R == 0) return u2f(0);   /* exact cancellation: +0 */
    sign = sl;
  }

  /* round R * 2^E to a float */
  n = clz64(R);
  R <<= n;                       /* most significant bit to bit 63 */
  E -= n;
  int biased = E + 190;          /* exponent field of R * 2^E */
  if (biased > 254) return u2f(sign | F_INF);
  int s = biased >= 1 ? 40 : -(E + 149);  /* bits below the last kept one */
  u32 m;
  if (s >= 65) {
    return u2f(sign);
  } else if (s == 64) {
    m = R > (1ull << 63);        /* above half of the smallest subnormal */
  } else {
    u64 rest = R & ((1ull << s) - 1), half = 1ull << (s - 1);
    m = (u32)(R >> s);
    if (rest > half || (rest == half && (m & 1))) m++;
  }
  /* a carry out of the mantissa moves into the exponent field */
  u32 bits = biased >= 1 ? ((u32)(biased - 1) << 23) + m : m;
  return u2f(sign | bits);
}

/* ------------------------------------------------ rounding to integers -- */

/* Round the float bits u to an integer: mode 'f' floor, 'c' ceil, 't'
 * trunc, 'a' half away from zero, 'e' half to even. */
static inline u32 round_f32(u32 u, int mode) {
  u32 a = u & F_ABS, sign = u & F_SIGN;
  int e = (int)(a >> 23) - 127;
  if (a > F_INF) return u | F_QUIET;          /* NaN */
  if (e >= 23) return u;                      /* integral, infinity */
  if (a == 0) return u;
  if (e < 0) {                                /* 0 < |x| < 1 */
    int up;
    switch (mode) {
      case 'f': up = sign != 0; break;
      case 'c': up = sign == 0; break;
      case 'a': up = e == -1; break;
      case 'e': up = a > 0x3f000000u; break;  /* above one half */
      default: up = 0;
    }
    return sign | (up ? 0x3f800000u : 0);
  }
  u32 frac = (1u << (23 - e)) - 1;            /* fraction bits */
  u32 rest = a & frac, half = (frac >> 1) + 1;
  if (rest == 0) return u;
  u32 t = a & ~frac;                          /* truncated magnitude */
  int up;
  switch (mode) {
    case 'f': up = sign != 0; break;
    case 'c': up = sign == 0; break;
    case 'a': up = rest >= half; break;
    case 'e': up = rest > half || (rest == half && (t & (frac + 1))); break;
    default: up = 0;
  }
  return sign | (up ? t + frac + 1 : t);      /* a carry bumps the exponent */
}

#define D_SIGN 0x8000000000000000ull
#define D_ABS 0x7fffffffffffffffull
#define D_INF 0x7ff0000000000000ull
#define D_QUIET 0x0008000000000000ull
#define D_ONE 0x3ff0000000000000ull
#define D_HALF 0x3fe0000000000000ull

static inline u64 round_f64(u64 u, int mode) {
  u64 a = u & D_ABS, sign = u & D_SIGN;
  int e = (int)(a >> 52) - 1023;
  if (a > D_INF) return u | D_QUIET;
  if (e >= 52) return u;
  if (a == 0) return u;
  if (e < 0) {
    int up;
    switch (mode) {
      case 'f': up = sign != 0; break;
      case 'c': up = sign == 0; break;
      case 'a': up = e == -1; break;
      case 'e': up = a > D_HALF; break;
      default: up = 0;
    }
    return sign | (up ? D_ONE : 0);
  }
  u64 frac = (1ull << (52 - e)) - 1;
  u64 rest = a & frac, half = (frac >> 1) + 1;
  if (rest == 0) return u;
  u64 t = a & ~frac;
  int up;
  switch (mode) {
    case 'f': up = sign != 0; break;
    case 'c': up = sign == 0; break;
    case 'a': up = rest >= half; break;
    case 'e': up = rest > half || (rest == half && (t & (frac + 1))); break;
    default: up = 0;
  }
  return sign | (up ? t + frac + 1 : t);
}

EXPORT float floorf(float x) { return u2f(round_f32(f2u(x), 'f')); }
EXPORT float ceilf(float x) { return u2f(round_f32(f2u(x), 'c')); }
EXPORT float truncf(float x) { return u2f(round_f32(f2u(x), 't')); }
EXPORT float roundf(float x) { return u2f(round_f32(f2u(x), 'a')); }
EXPORT float roundevenf(float x) { return u2f(round_f32(f2u(x), 'e')); }
/* the default rounding mode, which IREE's code never changes */
EXPORT float rintf(float x) { return u2f(round_f32(f2u(x), 'e')); }
EXPORT float nearbyintf(float x) { return u2f(round_f32(f2u(x), 'e')); }

EXPORT double floor(double x) { return u2d(round_f64(d2u(x), 'f')); }
EXPORT double ceil(double x) { return u2d(round_f64(d2u(x), 'c')); }
EXPORT double trunc(double x) { return u2d(round_f64(d2u(x), 't')); }
EXPORT double round(double x) { return u2d(round_f64(d2u(x), 'a')); }
EXPORT double roundeven(double x) { return u2d(round_f64(d2u(x), 'e')); }
EXPORT double rint(double x) { return u2d(round_f64(d2u(x), 'e')); }
EXPORT double nearbyint(double x) { return u2d(round_f64(d2u(x), 'e')); }

/* ------------------------------------------------------- minimum, maximum */

/* IEEE maxNum/minNum: a NaN operand gives the other one; -0 < +0. Keys
 * order the bit patterns as the values they stand for. */
static inline u32 key32(u32 u) { return u & F_SIGN ? ~u : u | F_SIGN; }
static inline u64 key64(u64 u) { return u & D_SIGN ? ~u : u | D_SIGN; }

EXPORT float fmaxf(float x, float y) {
  u32 ux = f2u(x), uy = f2u(y);
  if ((ux & F_ABS) > F_INF) return (uy & F_ABS) > F_INF ? u2f(ux | F_QUIET) : y;
  if ((uy & F_ABS) > F_INF) return x;
  return key32(ux) >= key32(uy) ? x : y;
}

EXPORT float fminf(float x, float y) {
  u32 ux = f2u(x), uy = f2u(y);
  if ((ux & F_ABS) > F_INF) return (uy & F_ABS) > F_INF ? u2f(ux | F_QUIET) : y;
  if ((uy & F_ABS) > F_INF) return x;
  return key32(ux) <= key32(uy) ? x : y;
}

EXPORT double fmax(double x, double y) {
  u64 ux = d2u(x), uy = d2u(y);
  if ((ux & D_ABS) > D_INF) return (uy & D_ABS) > D_INF ? u2d(ux | D_QUIET) : y;
  if ((uy & D_ABS) > D_INF) return x;
  return key64(ux) >= key64(uy) ? x : y;
}

EXPORT double fmin(double x, double y) {
  u64 ux = d2u(x), uy = d2u(y);
  if ((ux & D_ABS) > D_INF) return (uy & D_ABS) > D_INF ? u2d(ux | D_QUIET) : y;
  if ((uy & D_ABS) > D_INF) return x;
  return key64(ux) <= key64(uy) ? x : y;
}

/* ------------------------------------------------ conversions to f16 -- */

/* f32 bits -> f16 bits, round to nearest even (NaN stays NaN, quiet). */
EXPORT u32 hal_cpu_f32_bits_to_f16(u32 u) {
  u32 sign = (u >> 16) & 0x8000, a = u & F_ABS;
  if (a > F_INF) return sign | 0x7e00 | ((a >> 13) & 0x3ff);
  if (a >= 0x477ff000u) return sign | 0x7c00;   /* 65520 and up: infinity */
  int e = (int)(a >> 23) - 127;
  u32 mant = a & 0x7fffff, bits, rest, half;
  if (e >= -14) {                                /* a normal half */
    bits = ((u32)(e + 15) << 10) | (mant >> 13);
    rest = mant & 0x1fff, half = 0x1000;
  } else if (e >= -25) {                         /* a subnormal half */
    u32 m = mant | 0x800000;
    int s = -(e + 1);                            /* 14..24 */
    bits = m >> s;
    rest = m & ((1u << s) - 1), half = 1u << (s - 1);
  } else {
    return sign;
  }
  if (rest > half || (rest == half && (bits & 1))) bits++;
  return sign | bits;
}

/* f64 bits -> f16 bits, rounded once. */
EXPORT u32 hal_cpu_f64_bits_to_f16(u64 u) {
  u32 sign = (u32)(u >> 48) & 0x8000;
  u64 a = u & D_ABS, rest, half;
  if (a > D_INF) return sign | 0x7e00 | (u32)((a >> 42) & 0x3ff);
  if (a >= 0x40effe0000000000ull) return sign | 0x7c00;
  int e = (int)(a >> 52) - 1023;
  u64 mant = a & 0xfffffffffffffull;
  u32 bits;
  if (e >= -14) {
    bits = ((u32)(e + 15) << 10) | (u32)(mant >> 42);
    rest = mant & ((1ull << 42) - 1), half = 1ull << 41;
  } else if (e >= -25) {
    u64 m = mant | (1ull << 52);
    int s = 28 - e;                              /* 43..53 */
    bits = (u32)(m >> s);
    rest = m & ((1ull << s) - 1), half = 1ull << (s - 1);
  } else {
    return sign;
  }
  if (rest > half || (rest == half && (bits & 1))) bits++;
  return sign | bits;
}

#if defined(__i386__)
/* __truncsfhf2 and __truncdfhf2 as LLVM calls them on x86_32 with SSE2:
 * the argument on the stack, the half returned in xmm0 (and eax). */
__asm__(
    "  .section .text.hal_cpu_truncsfhf2_xmm0,\"ax\",@progbits\n"
    "  .globl hal_cpu_truncsfhf2_xmm0\n"
    "  .hidden hal_cpu_truncsfhf2_xmm0\n"
    "  .type hal_cpu_truncsfhf2_xmm0,@function\n"
    "hal_cpu_truncsfhf2_xmm0:\n"
    "  pushl 4(%esp)\n"                 /* the float's bits */
    "  calll hal_cpu_f32_bits_to_f16\n"
    "  addl $4, %esp\n"
    "  movd %eax, %xmm0\n"
    "  retl\n"
    "  .size hal_cpu_truncsfhf2_xmm0, .-hal_cpu_truncsfhf2_xmm0\n"
    "  .section .text.hal_cpu_truncdfhf2_xmm0,\"ax\",@progbits\n"
    "  .globl hal_cpu_truncdfhf2_xmm0\n"
    "  .hidden hal_cpu_truncdfhf2_xmm0\n"
    "  .type hal_cpu_truncdfhf2_xmm0,@function\n"
    "hal_cpu_truncdfhf2_xmm0:\n"
    "  pushl 8(%esp)\n"                 /* the double's high word */
    "  pushl 8(%esp)\n"                 /* and its low word */
    "  calll hal_cpu_f64_bits_to_f16\n"
    "  addl $8, %esp\n"
    "  movd %eax, %xmm0\n"
    "  retl\n"
    "  .size hal_cpu_truncdfhf2_xmm0, .-hal_cpu_truncdfhf2_xmm0\n"
    "  .text\n");
#endif
