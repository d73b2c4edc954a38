/* f32 matrix multiply, i-k-j loop order (the inner loop vectorizes). */
#include "bench_kernel.h"

BENCH_EXPORT int kernel_matmul(void *buf, unsigned n) {
  const float *restrict a = (const float *)buf;
  const float *restrict b = a + (uint64_t)n * n;
  float *restrict c = (float *)(b + (uint64_t)n * n);
  for (unsigned i = 0; i < n; i++) {
    float *restrict row = c + (uint64_t)i * n;
    for (unsigned j = 0; j < n; j++)
      row[j] = 0.0f;
    for (unsigned k = 0; k < n; k++) {
      const float aik = a[(uint64_t)i * n + k];
      const float *restrict brow = b + (uint64_t)k * n;
      for (unsigned j = 0; j < n; j++)
        row[j] += aik * brow[j];
    }
  }
  uint32_t h = 0;
  for (unsigned i = 0; i < n; i++) {
    union { float f; uint32_t u; } v = {c[(uint64_t)i * n + i]};
    h = h * 31u + v.u;
  }
  return (int)h;
}
