/*
 * hostile_syscall.h - raw Linux system calls for the six architectures the
 * runtime emulates, without libc: the instruction that enters the kernel
 * (inline asm) and the numbers of the calls tests/plugins/hostile_cases.h
 * makes, from each architecture's system call table.
 *
 *   x86_64   syscall    number in rax, arguments rdi rsi rdx r10 r8 r9
 *   x86_32   int $0x80  number in eax, arguments ebx ecx edx esi edi ebp
 *   aarch64  svc #0     number in x8,  arguments x0..x5
 *   arm32    svc #0     number in r7,  arguments r0..r5 (EABI)
 *   riscv64  ecall      number in a7,  arguments a0..a5
 *   riscv32  ecall      number in a7,  arguments a0..a5
 *
 * A call returns the kernel's value: -errno (-4095..-1) on failure.
 */
#ifndef TESTS_PLUGINS_HOSTILE_SYSCALL_H_
#define TESTS_PLUGINS_HOSTILE_SYSCALL_H_

#define HS_INLINE static inline __attribute__((always_inline))

#if defined(__x86_64__)

#define NR_write 1
#define NR_close 3
#define NR_mmap 9
#define NR_munmap 11
#define NR_rt_sigaction 13
#define NR_socket 41
#define NR_connect 42
#define NR_clone 56
#define NR_execve 59
#define NR_kill 62
#define NR_ptrace 101
#define NR_exit_group 231
#define NR_tgkill 234
#define NR_openat 257
#define NR_unlinkat 263
#define NR_renameat 264
#define NR_process_vm_readv 310

HS_INLINE long hs_call6(long n, long a, long b, long c, long d, long e,
                        long f) {
  register long r10 __asm__("r10") = d;
  register long r8 __asm__("r8") = e;
  register long r9 __asm__("r9") = f;
  long ret;
  __asm__ volatile("syscall"
                   : "=a"(ret)
                   : "a"(n), "D"(a), "S"(b), "d"(c), "r"(r10), "r"(r8),
                     "r"(r9)
                   : "rcx", "r11", "memory");
  return ret;
}

#elif defined(__i386__)

#define NR_close 6
#define NR_write 4
#define NR_execve 11
#define NR_ptrace 26
#define NR_kill 37
#define NR_munmap 91
#define NR_clone 120
#define NR_rt_sigaction 174
#define NR_mmap 192 /* mmap2: the offset in pages */
#define NR_exit_group 252
#define NR_tgkill 270
#define NR_openat 295
#define NR_unlinkat 301
#define NR_renameat 302
#define NR_process_vm_readv 347
#define NR_socket 359
#define NR_connect 362

HS_INLINE long hs_call6(long n, long a, long b, long c, long d, long e,
                        long f) {
  /* ebp (the sixth argument) cannot be an asm operand: it is loaded from
   * memory around the call, as musl does. */
  long nf[2] = {n, f};
  long ret;
  __asm__ volatile(
      "push %%ebp\n\t"
      "mov 4(%%eax), %%ebp\n\t"
      "mov 0(%%eax), %%eax\n\t"
      "int $0x80\n\t"
      "pop %%ebp"
      : "=a"(ret)
      : "a"(nf), "b"(a), "c"(b), "d"(c), "S"(d), "D"(e)
      : "memory");
  return ret;
}

#elif defined(__aarch64__)

#define NR_unlinkat 35
#define NR_renameat 38
#define NR_openat 56
#define NR_close 57
#define NR_write 64
#define NR_exit_group 94
#define NR_ptrace 117
#define NR_kill 129
#define NR_tgkill 131
#define NR_rt_sigaction 134
#define NR_socket 198
#define NR_connect 203
#define NR_munmap 215
#define NR_clone 220
#define NR_execve 221
#define NR_mmap 222
#define NR_process_vm_readv 270

HS_INLINE long hs_call6(long n, long a, long b, long c, long d, long e,
                        long f) {
  register long x8 __asm__("x8") = n;
  register long x0 __asm__("x0") = a;
  register long x1 __asm__("x1") = b;
  register long x2 __asm__("x2") = c;
  register long x3 __asm__("x3") = d;
  register long x4 __asm__("x4") = e;
  register long x5 __asm__("x5") = f;
  __asm__ volatile("svc #0"
                   : "+r"(x0)
                   : "r"(x8), "r"(x1), "r"(x2), "r"(x3), "r"(x4), "r"(x5)
                   : "memory");
  return x0;
}

#elif defined(__arm__)

#define NR_write 4
#define NR_close 6
#define NR_execve 11
#define NR_ptrace 26
#define NR_kill 37
#define NR_munmap 91
#define NR_clone 120
#define NR_rt_sigaction 174
#define NR_mmap 192 /* mmap2: the offset in pages */
#define NR_exit_group 248
#define NR_tgkill 268
#define NR_socket 281
#define NR_connect 283
#define NR_openat 322
#define NR_unlinkat 328
#define NR_renameat 329
#define NR_process_vm_readv 376

HS_INLINE long hs_call6(long n, long a, long b, long c, long d, long e,
                        long f) {
  register long r7 __asm__("r7") = n;
  register long r0 __asm__("r0") = a;
  register long r1 __asm__("r1") = b;
  register long r2 __asm__("r2") = c;
  register long r3 __asm__("r3") = d;
  register long r4 __asm__("r4") = e;
  register long r5 __asm__("r5") = f;
  __asm__ volatile("svc #0"
                   : "+r"(r0)
                   : "r"(r7), "r"(r1), "r"(r2), "r"(r3), "r"(r4), "r"(r5)
                   : "memory");
  return r0;
}

#elif defined(__riscv)

#define NR_unlinkat 35
#define NR_openat 56
#define NR_close 57
#define NR_write 64
#define NR_exit_group 94
#define NR_ptrace 117
#define NR_kill 129
#define NR_tgkill 131
#define NR_rt_sigaction 134
#define NR_socket 198
#define NR_connect 203
#define NR_munmap 215
#define NR_clone 220
#define NR_execve 221
#define NR_mmap 222 /* mmap2 semantics on riscv32 (offset in pages) */
#define NR_process_vm_readv 270
/* RISC-V has no renameat, only renameat2 (its flags 0: the same call). */
#define NR_renameat 276

HS_INLINE long hs_call6(long n, long a, long b, long c, long d, long e,
                        long f) {
  register long a7 __asm__("a7") = n;
  register long a0 __asm__("a0") = a;
  register long a1 __asm__("a1") = b;
  register long a2 __asm__("a2") = c;
  register long a3 __asm__("a3") = d;
  register long a4 __asm__("a4") = e;
  register long a5 __asm__("a5") = f;
  __asm__ volatile("ecall"
                   : "+r"(a0)
                   : "r"(a7), "r"(a1), "r"(a2), "r"(a3), "r"(a4), "r"(a5)
                   : "memory");
  return a0;
}

#else
#error "hostile_syscall.h: no system calls for this architecture"
#endif

#define hs_call0(n) hs_call6((n), 0, 0, 0, 0, 0, 0)
#define hs_call1(n, a) hs_call6((n), (long)(a), 0, 0, 0, 0, 0)
#define hs_call2(n, a, b) hs_call6((n), (long)(a), (long)(b), 0, 0, 0, 0)
#define hs_call3(n, a, b, c) \
  hs_call6((n), (long)(a), (long)(b), (long)(c), 0, 0, 0)
#define hs_call4(n, a, b, c, d) \
  hs_call6((n), (long)(a), (long)(b), (long)(c), (long)(d), 0, 0)
#define hs_call5(n, a, b, c, d, e) \
  hs_call6((n), (long)(a), (long)(b), (long)(c), (long)(d), (long)(e), 0)

/* A failed call returns -errno, -4095..-1. */
HS_INLINE int hs_failed(long ret) {
  return (unsigned long)ret > (unsigned long)-4096L;
}

#endif /* TESTS_PLUGINS_HOSTILE_SYSCALL_H_ */
