/* Array wrappers around hal_cpu/runtime/libm.c for tests/test_defaults_32bit.py:
 * linked with the shipped object (hal_cpu/runtime/libm.sos) into a shared
 * object the loader runs emulated; every argument is an integer or a
 * pointer, so the runtime's integer calling convention reaches them. */

float fmaf(float, float, float);
float floorf(float), ceilf(float), truncf(float), roundf(float);
float roundevenf(float), rintf(float), nearbyintf(float);
double floor(double), ceil(double), trunc(double), round(double);
double roundeven(double), rint(double), nearbyint(double);
float fmaxf(float, float), fminf(float, float);
double fmax(double, double), fmin(double, double);
unsigned hal_cpu_f32_bits_to_f16(unsigned);
unsigned hal_cpu_f64_bits_to_f16(unsigned long long);

#define EXPORT __attribute__((visibility("default")))

static float (*const unary32[])(float) = {
    floorf, ceilf, truncf, roundf, roundevenf, rintf, nearbyintf};
static double (*const unary64[])(double) = {
    floor, ceil, trunc, round, roundeven, rint, nearbyint};
static float (*const binary32[])(float, float) = {fmaxf, fminf};
static double (*const binary64[])(double, double) = {fmax, fmin};

EXPORT void t_unary32(int op, const float* x, float* y, int n) {
  for (int i = 0; i < n; i++) y[i] = unary32[op](x[i]);
}

EXPORT void t_unary64(int op, const double* x, double* y, int n) {
  for (int i = 0; i < n; i++) y[i] = unary64[op](x[i]);
}

EXPORT void t_binary32(int op, const float* a, const float* b, float* y, int n) {
  for (int i = 0; i < n; i++) y[i] = binary32[op](a[i], b[i]);
}

EXPORT void t_binary64(int op, const double* a, const double* b, double* y, int n) {
  for (int i = 0; i < n; i++) y[i] = binary64[op](a[i], b[i]);
}

EXPORT void t_fmaf(const float* a, const float* b, const float* c, float* y, int n) {
  for (int i = 0; i < n; i++) y[i] = fmaf(a[i], b[i], c[i]);
}

EXPORT void t_f2h(const unsigned* x, unsigned short* y, int n) {
  for (int i = 0; i < n; i++) y[i] = (unsigned short)hal_cpu_f32_bits_to_f16(x[i]);
}

EXPORT void t_d2h(const unsigned long long* x, unsigned short* y, int n) {
  for (int i = 0; i < n; i++) y[i] = (unsigned short)hal_cpu_f64_bits_to_f16(x[i]);
}

#if defined(__i386__)
/* the replacements of __truncsfhf2 and __truncdfhf2 for SSE2 callers, called
 * as LLVM calls those (this file is built for a CPU with SSE2) */
_Float16 hal_cpu_truncsfhf2_xmm0(float);
_Float16 hal_cpu_truncdfhf2_xmm0(double);

EXPORT void t_f2h_xmm0(const float* x, _Float16* y, int n) {
  for (int i = 0; i < n; i++) y[i] = hal_cpu_truncsfhf2_xmm0(x[i]);
}

EXPORT void t_d2h_xmm0(const double* x, _Float16* y, int n) {
  for (int i = 0; i < n; i++) y[i] = hal_cpu_truncdfhf2_xmm0(x[i]);
}
#endif
