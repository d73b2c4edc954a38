/* Static Linux executable around one benchmark kernel, for qemu-user.
 *
 *   <exe> ITERATIONS N NBYTES
 *
 * _start passes the initial stack pointer (argc, argv...) to bench_main,
 * which fills NBYTES of a static buffer with bench_init, calls the kernel
 * ITERATIONS times with (buffer, N) and exits with the last result & 0x7f
 * (254: bad arguments, 253: NBYTES too large). The kernel is the symbol
 * bench_kernel, bound at link time (ld.lld --defsym=bench_kernel=kernel_x). */
#include "bench_kernel.h"

#define BENCH_MAX_BYTES (16u << 20)

int bench_kernel(void *buf, unsigned n);

static unsigned char buffer[BENCH_MAX_BYTES] __attribute__((aligned(64)));

__attribute__((noreturn)) static void sys_exit(long code) {
#if defined(__x86_64__)
  __asm__ volatile("syscall" : : "a"(231L), "D"(code) : "rcx", "r11", "memory");
#elif defined(__aarch64__)
  register long x0 __asm__("x0") = code;
  register long x8 __asm__("x8") = 94; /* exit_group */
  __asm__ volatile("svc #0" : : "r"(x0), "r"(x8) : "memory");
#elif defined(__riscv) && __riscv_xlen == 64
  register long a0 __asm__("a0") = code;
  register long a7 __asm__("a7") = 94; /* exit_group */
  __asm__ volatile("ecall" : : "r"(a0), "r"(a7) : "memory");
#else
#error "unsupported architecture"
#endif
  for (;;) {
  }
}

static int parse(const char *s, uint64_t *out) {
  uint64_t v = 0;
  if (!s || !*s)
    return 0;
  for (; *s; s++) {
    if (*s < '0' || *s > '9')
      return 0;
    v = v * 10 + (uint64_t)(*s - '0');
  }
  *out = v;
  return 1;
}

__attribute__((noreturn, used)) void bench_main(long *sp) {
  long argc = sp[0];
  char **argv = (char **)(sp + 1);
  uint64_t iterations, n, nbytes;
  if (argc != 4 || !parse(argv[1], &iterations) || !parse(argv[2], &n) ||
      !parse(argv[3], &nbytes))
    sys_exit(254);
  if (nbytes > BENCH_MAX_BYTES)
    sys_exit(253);
  bench_init(buffer, (unsigned)nbytes);
  int result = 0;
  for (uint64_t i = 0; i < iterations; i++)
    result = bench_kernel(buffer, (unsigned)n);
  sys_exit(result & 0x7f);
}

#if defined(__x86_64__)
__asm__(".text\n.globl _start\n.type _start,@function\n_start:\n"
        "  xor %ebp, %ebp\n  mov %rsp, %rdi\n  and $-16, %rsp\n"
        "  call bench_main\n  ud2\n");
#elif defined(__aarch64__)
__asm__(".text\n.globl _start\n.type _start,%function\n_start:\n"
        "  mov x29, #0\n  mov x30, #0\n  mov x0, sp\n  and sp, x0, #-16\n"
        "  bl bench_main\n  brk #0\n");
#elif defined(__riscv)
__asm__(".text\n.globl _start\n.type _start,@function\n_start:\n"
        "  mv a0, sp\n  andi sp, sp, -16\n  call bench_main\n  unimp\n");
#endif
