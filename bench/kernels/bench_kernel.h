/* Shared declarations of the benchmark kernels (bench/emulator_vs_qemu.py).
 *
 * Every kernel is freestanding C: no libc, no compiler runtime calls, so the
 * same object file links both into a self-contained ET_DYN (loaded by
 * elfloader) and into a static Linux executable (run under qemu-user).
 * Each one takes a buffer and a size and returns an int that depends on
 * the work done, so both runs can be checked against each other. */
#ifndef BENCH_KERNEL_H
#define BENCH_KERNEL_H

#include <stdint.h>

/* Objects are built with -fvisibility=hidden; these symbols are exported. */
#define BENCH_EXPORT __attribute__((visibility("default")))

/* Fills nbytes of buf with a deterministic pattern whose 32-bit words are
 * float32 values in [1, 2); returns 0. */
BENCH_EXPORT int bench_init(void *buf, unsigned nbytes);

/* C = A * B for n x n float32 matrices stored one after another in buf
 * (A, then B, then C: 3 * n * n * 4 bytes); returns a hash of C's diagonal. */
BENCH_EXPORT int kernel_matmul(void *buf, unsigned n);

/* Writes all nbytes of buf with 64-bit stores, BENCH_FILL_PASSES times;
 * returns a value read back after the last pass. */
BENCH_EXPORT int kernel_fill(void *buf, unsigned nbytes);

/* CRC-32 (IEEE, reflected, table-driven) of nbytes of buf. */
BENCH_EXPORT int kernel_crc32(void *buf, unsigned nbytes);

#define BENCH_FILL_PASSES 4

#endif
