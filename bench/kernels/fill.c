/* Store-bound loop: every pass rewrites the whole buffer. */
#include "bench_kernel.h"

BENCH_EXPORT int kernel_fill(void *buf, unsigned nbytes) {
  uint64_t *restrict p = (uint64_t *)buf;
  const uint64_t count = nbytes / 8;
  uint64_t seed = 0x9e3779b97f4a7c15u;
  if (count == 0)
    return 0;
  for (unsigned pass = 0; pass < BENCH_FILL_PASSES; pass++) {
    for (uint64_t i = 0; i < count; i++)
      p[i] = seed + i;
    /* Read one stored word back so that no pass is a dead store. */
    seed = p[(seed * 2654435761u) % count] ^ (pass + 1);
  }
  return (int)(seed ^ (seed >> 32));
}
