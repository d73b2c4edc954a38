/* Array wrappers around the support functions LLVM calls in 32-bit
 * executables (compiler-rt's builtins and libm.c, as hal_cpu/runtime/libm.sos
 * ships them), for tests/test_support_library.py. Built for each
 * architecture's default CPU profile and linked with the shipped object
 * into a shared object the loader runs emulated. Each wrapper
 * t_<function>(x[, y], out, n) applies the function to n elements; every
 * wrapper argument is an integer or a pointer and every element is a bit
 * pattern (a float travels as its bits), so the runtime's integer calling
 * convention reaches them and the results are compared bit for bit. */

typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;
typedef int i32;
typedef long long i64;

#define EXPORT __attribute__((visibility("default")))

static inline float bf(u32 u) { float f; __builtin_memcpy(&f, &u, 4); return f; }
static inline u32 fb(float f) { u32 u; __builtin_memcpy(&u, &f, 4); return u; }
static inline double bd(u64 u) { double d; __builtin_memcpy(&d, &u, 8); return d; }
static inline u64 db(double d) { u64 u; __builtin_memcpy(&u, &d, 8); return u; }
static inline _Float16 bh(u16 u) { _Float16 h; __builtin_memcpy(&h, &u, 2); return h; }
static inline u16 hb(_Float16 h) { u16 u; __builtin_memcpy(&u, &h, 2); return u; }

/* W1(name, T_in, T_out, expression of v): out[i] = expression(x[i]) */
#define W1(name, TI, TO, EXPR)                                        \
  EXPORT void t_##name(const TI* x, TO* out, int n) {                 \
    for (int i = 0; i < n; i++) { TI v = x[i]; out[i] = (EXPR); }      \
  }
/* W2(name, T_a, T_b, T_out, expression of a, b) */
#define W2(name, TA, TB, TO, EXPR)                                    \
  EXPORT void t_##name(const TA* x, const TB* y, TO* out, int n) {    \
    for (int i = 0; i < n; i++) { TA a = x[i]; TB b = y[i]; out[i] = (EXPR); } \
  }

/* ------------------------------------------- on every 32-bit target -- */
i64 __divdi3(i64, i64);
u64 __udivdi3(u64, u64);
i64 __moddi3(i64, i64);
u64 __umoddi3(u64, u64);
W2(__divdi3, i64, i64, i64, __divdi3(a, b))
W2(__udivdi3, u64, u64, u64, __udivdi3(a, b))
W2(__moddi3, i64, i64, i64, __moddi3(a, b))
W2(__umoddi3, u64, u64, u64, __umoddi3(a, b))
#if !defined(__arm__)
/* (ARM's are __aeabi_lmul, __aeabi_llsl, __aeabi_lasr and __aeabi_llsr) */
i64 __muldi3(i64, i64);
i64 __ashldi3(i64, int);
i64 __ashrdi3(i64, int);
u64 __lshrdi3(u64, int);
W2(__muldi3, i64, i64, i64, __muldi3(a, b))
W2(__ashldi3, i64, i32, i64, __ashldi3(a, b))
W2(__ashrdi3, i64, i32, i64, __ashrdi3(a, b))
W2(__lshrdi3, u64, i32, u64, __lshrdi3(a, b))
#endif

/* conversions between f16 and f32/f64, as LLVM calls them */
float __extendhfsf2(_Float16);
double __extendhfdf2(_Float16);
W1(__extendhfsf2, u16, u32, fb(__extendhfsf2(bh(v))))
W1(__extendhfdf2, u16, u64, db(__extendhfdf2(bh(v))))
#if !defined(__i386__)
/* (x86_32's callers with SSE2 take the half in xmm0, and LLVM calls the
 * replacements of libm.c there: see hal_cpu/runtime/__init__.py) */
_Float16 __truncsfhf2(float);
_Float16 __truncdfhf2(double);
W1(__truncsfhf2, u32, u16, hb(__truncsfhf2(bf(v))))
W1(__truncdfhf2, u64, u16, hb(__truncdfhf2(bd(v))))
#endif

/* math functions of libm.c */
float fmaxf(float, float), fminf(float, float), truncf(float), roundf(float);
double floor(double), round(double);
W2(fmaxf, u32, u32, u32, fb(fmaxf(bf(a), bf(b))))
W2(fminf, u32, u32, u32, fb(fminf(bf(a), bf(b))))
W1(truncf, u32, u32, fb(truncf(bf(v))))
W1(roundf, u32, u32, fb(roundf(bf(v))))
W1(floor, u64, u64, db(floor(bd(v))))
W1(round, u64, u64, db(round(bd(v))))

/* integer <-> float conversions of 64-bit integers */
#if defined(__arm__)
#define AEABI __attribute__((pcs("aapcs")))
i64 AEABI __aeabi_f2lz(float);
u64 AEABI __aeabi_f2ulz(float);
float AEABI __aeabi_l2f(i64);
float AEABI __aeabi_ul2f(u64);
i64 AEABI __aeabi_d2lz(double);
double AEABI __aeabi_l2d(i64);
W1(__aeabi_f2lz, u32, i64, __aeabi_f2lz(bf(v)))
W1(__aeabi_f2ulz, u32, u64, __aeabi_f2ulz(bf(v)))
W1(__aeabi_l2f, i64, u32, fb(__aeabi_l2f(v)))
W1(__aeabi_ul2f, u64, u32, fb(__aeabi_ul2f(v)))
W1(__aeabi_d2lz, u64, i64, __aeabi_d2lz(bd(v)))
W1(__aeabi_l2d, i64, u64, db(__aeabi_l2d(v)))
#else
i64 __fixsfdi(float);
u64 __fixunssfdi(float);
float __floatdisf(i64);
float __floatundisf(u64);
i64 __fixdfdi(double);
double __floatdidf(i64);
W1(__fixsfdi, u32, i64, __fixsfdi(bf(v)))
W1(__fixunssfdi, u32, u64, __fixunssfdi(bf(v)))
W1(__floatdisf, i64, u32, fb(__floatdisf(v)))
W1(__floatundisf, u64, u32, fb(__floatundisf(v)))
W1(__fixdfdi, u64, i64, __fixdfdi(bd(v)))
W1(__floatdidf, i64, u64, db(__floatdidf(v)))
#endif

/* ----------------------------------------- f32/f64 without a double FPU -- */
#if defined(__riscv) || defined(__i386__)
double __extendsfdf2(float);
float __truncdfsf2(double);
double __adddf3(double, double), __subdf3(double, double);
double __muldf3(double, double), __divdf3(double, double);
W1(__extendsfdf2, u32, u64, db(__extendsfdf2(bf(v))))
W1(__truncdfsf2, u64, u32, fb(__truncdfsf2(bd(v))))
W2(__adddf3, u64, u64, u64, db(__adddf3(bd(a), bd(b))))
W2(__subdf3, u64, u64, u64, db(__subdf3(bd(a), bd(b))))
W2(__muldf3, u64, u64, u64, db(__muldf3(bd(a), bd(b))))
W2(__divdf3, u64, u64, u64, db(__divdf3(bd(a), bd(b))))
#endif

/* ------------------------------------------------ ARM's run-time ABI -- */
#if defined(__arm__)
/* base procedure call standard (integer registers) even with hard float */
double AEABI __aeabi_f2d(float);
float AEABI __aeabi_d2f(double);
float AEABI __aeabi_h2f(u16);
u16 AEABI __aeabi_f2h(float);
u16 AEABI __aeabi_d2h(double);
double AEABI __aeabi_dadd(double, double), AEABI __aeabi_dsub(double, double);
double AEABI __aeabi_dmul(double, double), AEABI __aeabi_ddiv(double, double);
i32 AEABI __aeabi_idiv(i32, i32);
u32 AEABI __aeabi_uidiv(u32, u32);
/* {quotient, remainder}: in r0, r1 (read as one 64-bit value), and for the
 * 64-bit ones in r0..r3 (a 16-byte vector, returned in registers) */
u64 AEABI __aeabi_idivmod(i32, i32);
u64 AEABI __aeabi_uidivmod(u32, u32);
typedef u32 quad __attribute__((vector_size(16)));
quad AEABI __aeabi_ldivmod(i64, i64);
quad AEABI __aeabi_uldivmod(u64, u64);
i64 AEABI __aeabi_lmul(i64, i64);
i64 AEABI __aeabi_llsl(i64, int), AEABI __aeabi_lasr(i64, int);
u64 AEABI __aeabi_llsr(u64, int);
W1(__aeabi_f2d, u32, u64, db(__aeabi_f2d(bf(v))))
W1(__aeabi_d2f, u64, u32, fb(__aeabi_d2f(bd(v))))
W1(__aeabi_h2f, u16, u32, fb(__aeabi_h2f(v)))
W1(__aeabi_f2h, u32, u16, __aeabi_f2h(bf(v)))
W1(__aeabi_d2h, u64, u16, __aeabi_d2h(bd(v)))
W2(__aeabi_dadd, u64, u64, u64, db(__aeabi_dadd(bd(a), bd(b))))
W2(__aeabi_dsub, u64, u64, u64, db(__aeabi_dsub(bd(a), bd(b))))
W2(__aeabi_dmul, u64, u64, u64, db(__aeabi_dmul(bd(a), bd(b))))
W2(__aeabi_ddiv, u64, u64, u64, db(__aeabi_ddiv(bd(a), bd(b))))
W2(__aeabi_idiv, i32, i32, i32, __aeabi_idiv(a, b))
W2(__aeabi_uidiv, u32, u32, u32, __aeabi_uidiv(a, b))
W2(__aeabi_idivmod, i32, i32, u64, __aeabi_idivmod(a, b))
W2(__aeabi_uidivmod, u32, u32, u64, __aeabi_uidivmod(a, b))
EXPORT void t___aeabi_ldivmod(const i64* x, const i64* y, quad* out, int n) {
  for (int i = 0; i < n; i++) out[i] = __aeabi_ldivmod(x[i], y[i]);
}
EXPORT void t___aeabi_uldivmod(const u64* x, const u64* y, quad* out, int n) {
  for (int i = 0; i < n; i++) out[i] = __aeabi_uldivmod(x[i], y[i]);
}
W2(__aeabi_lmul, i64, i64, i64, __aeabi_lmul(a, b))
W2(__aeabi_llsl, i64, i32, i64, __aeabi_llsl(a, b))
W2(__aeabi_lasr, i64, i32, i64, __aeabi_lasr(a, b))
W2(__aeabi_llsr, u64, i32, u64, __aeabi_llsr(a, b))
#endif

/* ------------------------------------ GNU's f16 conversions (x86_32) -- */
#if defined(__i386__)
float __gnu_h2f_ieee(u16);
u16 __gnu_f2h_ieee(float);
W1(__gnu_h2f_ieee, u16, u32, fb(__gnu_h2f_ieee(v)))
W1(__gnu_f2h_ieee, u32, u16, __gnu_f2h_ieee(bf(v)))
#endif
