/* Deterministic buffer contents for the benchmark kernels. */
#include "bench_kernel.h"

BENCH_EXPORT int bench_init(void *buf, unsigned nbytes) {
  uint32_t *words = (uint32_t *)buf;
  uint32_t x = 2463534242u;
  for (unsigned i = 0; i < nbytes / 4; i++) {
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    words[i] = 0x3f800000u | (x >> 9); /* float32 in [1, 2) */
  }
  return 0;
}
