/*
 * Guest agent of the qemu-user engine.
 *
 * A static Linux program of the guest architecture, started by the host
 * under qemu-user. It maps the host's guest-memory file (a memfd) at one
 * address, then serves requests read from a pipe and answers on another:
 * set page protections, call a function with integer arguments, return
 * from a host callback. Guest code runs on this program's main thread; a
 * fault (SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGTRAP) or a stop request
 * (SIGUSR1 from the host) ends the call with a report of the signal, the
 * data address, the pc and the stack pointer. A system call the host's
 * filter refuses arrives as SIGSYS and is reported the same way, with the
 * guest's system call number in place of the data address.
 *
 * Wire format, both directions, little endian: a header of two u32 words
 * (kind, count) followed by count u64 words. Every reply during a call
 * ends with the call's sequence number, so the host can tell the agent's
 * replies from stale or forged bytes on the pipe.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

typedef uint64_t u64;
typedef uintptr_t word;

enum {
  REQ_MAP = 1,      /* memfd, size, address hint, fixed -> OK(base) */
  REQ_PROTECT = 2,  /* (address, size, prot) triples -> OK */
  REQ_CALL = 3,     /* function, stack top, sequence, args... -> DONE | CALLBACK | FAULT | STOPPED */
  REQ_RETURN = 4,   /* value: the result of the callback being served */
  REQ_EXIT = 5,
  REQ_CALLBACKS = 6, /* -> OK(address of every callback slot) */
  REQ_ABORT = 7,    /* end the call whose callback is being served: STOPPED */
};
enum {
  REP_OK = 1,
  REP_DONE = 2,     /* result, sequence */
  REP_CALLBACK = 3, /* slot, arguments[NCBARGS], sequence */
  REP_FAULT = 4,    /* signal, code, data address, pc, sp, sequence */
  REP_STOPPED = 5,  /* pc, sp, sequence */
  REP_ERROR = 6,    /* errno, request kind, index */
};

#define NARGS 16
#define NCBARGS 8
#define MAXWORDS 4096

static int fd_in = 0, fd_out = 1;
static u64 words[MAXWORDS];
static sigjmp_buf call_env;
static volatile sig_atomic_t in_guest, in_call, stop_pending;
static volatile u64 fault_info[5];
static u64 call_sequence;

static void die(void) { _exit(3); }

static void read_full(void *buf, size_t n) {
  char *p = buf;
  while (n) {
    ssize_t r = read(fd_in, p, n);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) die();
    p += r;
    n -= (size_t)r;
  }
}

static void write_full(const void *buf, size_t n) {
  const char *p = buf;
  while (n) {
    ssize_t r = write(fd_out, p, n);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) die();
    p += r;
    n -= (size_t)r;
  }
}

static void reply(uint32_t kind, const u64 *data, uint32_t count) {
  uint32_t head[2] = {kind, count};
  char buf[8 + 8 * 32];
  if (count <= 32) { /* one write: one pipe transfer */
    memcpy(buf, head, 8);
    memcpy(buf + 8, data, 8 * count);
    write_full(buf, 8 + 8 * (size_t)count);
    return;
  }
  write_full(head, 8);
  write_full(data, 8 * (size_t)count);
}

static uint32_t request(uint32_t *count) {
  uint32_t head[2];
  read_full(head, 8);
  if (head[1] > MAXWORDS) die();
  read_full(words, 8 * (size_t)head[1]);
  *count = head[1];
  return head[0];
}

/* --- the pc and stack pointer in a signal's context ----------------------- */
static void context_pc_sp(void *uctx, u64 *pc, u64 *sp) {
  ucontext_t *uc = uctx;
#if defined(__x86_64__)
  *pc = (u64)uc->uc_mcontext.gregs[REG_RIP];
  *sp = (u64)uc->uc_mcontext.gregs[REG_RSP];
#elif defined(__i386__)
  *pc = (u64)(uint32_t)uc->uc_mcontext.gregs[REG_EIP];
  *sp = (u64)(uint32_t)uc->uc_mcontext.gregs[REG_ESP];
#elif defined(__aarch64__)
  *pc = uc->uc_mcontext.pc;
  *sp = uc->uc_mcontext.sp;
#elif defined(__arm__)
  *pc = uc->uc_mcontext.arm_pc;
  /* Thumb state (CPSR.T) is bit 0 of the reported pc, as in a code pointer. */
  if (uc->uc_mcontext.arm_cpsr & (1u << 5)) *pc |= 1;
  *sp = uc->uc_mcontext.arm_sp;
#elif defined(__riscv)
  *pc = (u64)uc->uc_mcontext.__gregs[0];
  *sp = (u64)uc->uc_mcontext.__gregs[2];
#else
#error "unsupported architecture"
#endif
}

/* The system call number a SIGSYS refused, from the guest's registers
 * (the signal's own si_syscall is the host's under qemu-user). */
static u64 context_syscall(void *uctx) {
  ucontext_t *uc = uctx;
#if defined(__x86_64__)
  return (u64)uc->uc_mcontext.gregs[REG_RAX];
#elif defined(__i386__)
  return (u64)(uint32_t)uc->uc_mcontext.gregs[REG_EAX];
#elif defined(__aarch64__)
  return uc->uc_mcontext.regs[8];
#elif defined(__arm__)
  return uc->uc_mcontext.arm_r7;
#elif defined(__riscv)
  return (u64)uc->uc_mcontext.__gregs[17]; /* a7 */
#endif
}

/* The kind of a memory fault, where the context records it (the x86 page
 * fault error code): 0 read, 1 write, 2 instruction fetch, -1 not known. */
static int64_t context_write(void *uctx) {
#if defined(__x86_64__) || defined(__i386__)
  ucontext_t *uc = uctx;
  long err = (long)uc->uc_mcontext.gregs[REG_ERR];
  if (err & 0x10) return 2;
  return (err >> 1) & 1;
#else
  (void)uctx;
  return -1;
#endif
}

/* --- AVX masked loads ---------------------------------------------------------
 * qemu-user 7.2 loads every lane of VMASKMOVPS/PD and VPMASKMOVD/Q, masked
 * or not, so a masked load whose inactive lanes cross into a guard page
 * faults where a real CPU does not (IREE's AVX2 kernels load loop tails
 * this way). Such a fault makes the page readable for the rest of the call
 * (guard pages read as zeros: what masked lanes get) and retries the
 * instruction; the pages are protected again when the call ends. */
#if defined(__x86_64__) || defined(__i386__)
#define SOFT_PAGES 64
static word soft_pages[SOFT_PAGES];
static unsigned soft_count;

static int is_masked_load(const unsigned char *code) {
  /* Three-byte VEX (C4), opcode map 0F38, opcodes 2C/2D/8C (loads). */
#if defined(__i386__)
  if ((code[1] & 0xC0) != 0xC0) return 0; /* LES, not VEX */
#endif
  return code[0] == 0xC4 && (code[1] & 0x1F) == 2 &&
         (code[3] == 0x2C || code[3] == 0x2D || code[3] == 0x8C);
}

static volatile sig_atomic_t in_soften;

static int soften(word pc, word address) {
  word page = address & ~(word)4095;
  int masked;
  /* A fault on the instruction's own bytes is a fetch; and reading them
   * must not fault again inside this handler. */
  if (in_soften || (address >= pc - 16 && address < pc + 16)) return 0;
  for (unsigned i = 0; i < soft_count; i++)
    if (soft_pages[i] == page) return 0;
  if (soft_count == SOFT_PAGES) return 0;
  in_soften = 1;
  masked = is_masked_load((const unsigned char *)pc);
  in_soften = 0;
  if (!masked || mprotect((void *)page, 4096, PROT_READ)) return 0;
  soft_pages[soft_count++] = page;
  return 1;
}

static void harden(void) {
  for (unsigned i = 0; i < soft_count; i++) mprotect((void *)soft_pages[i], 4096, PROT_NONE);
  soft_count = 0;
  in_soften = 0;
}
#else
static int soften(word pc, word address) {
  (void)pc;
  (void)address;
  return 0;
}
static void harden(void) {}
#endif

static void on_fault(int sig, siginfo_t *info, void *uctx) {
  u64 pc, sp;
  if (!in_call) _exit(4); /* a fault in the agent itself */
  context_pc_sp(uctx, &pc, &sp);
  if (sig == SIGSEGV && in_guest && soften((word)pc, (word)info->si_addr)) return;
  fault_info[0] = (u64)sig;
  fault_info[1] = (u64)(int64_t)info->si_code;
  fault_info[2] = sig == SIGSYS ? context_syscall(uctx) : (u64)(word)info->si_addr;
  fault_info[3] = pc;
  fault_info[4] = sp | ((u64)(context_write(uctx) + 1) << 62);
  siglongjmp(call_env, 1);
}

static void on_stop(int sig, siginfo_t *info, void *uctx) {
  u64 pc, sp;
  (void)sig;
  (void)info;
  if (!in_call) return;
  if (!in_guest) { /* in a host callback: stop when it returns */
    stop_pending = 1;
    return;
  }
  context_pc_sp(uctx, &pc, &sp);
  fault_info[0] = 0;
  fault_info[3] = pc;
  fault_info[4] = sp;
  siglongjmp(call_env, 2);
}

/* Apply (address, size, prot) triples; answer OK, or ERROR at the first
 * that fails. */
static void protect(uint32_t count) {
  for (uint32_t i = 0; i + 3 <= count; i += 3) {
    if (mprotect((void *)(word)words[i], (size_t)words[i + 1], (int)words[i + 2])) {
      u64 err[3] = {(u64)errno, REQ_PROTECT, i / 3};
      reply(REP_ERROR, err, 3);
      return;
    }
  }
  reply(REP_OK, 0, 0);
}

/* --- host callbacks -------------------------------------------------------- */
static word callback(unsigned name, word a0, word a1, word a2, word a3,
                     word a4, word a5, word a6, word a7) {
  /* The slot's name is its base-4 digits written as an octal literal. */
  unsigned slot = (name & 7) | ((name >> 3) & 7) << 2 | ((name >> 6) & 7) << 4 |
                  ((name >> 9) & 7) << 6;
  u64 msg[2 + NCBARGS] = {slot, a0, a1, a2, a3, a4, a5, a6, a7, call_sequence};
  uint32_t count;
  word result = 0;
  in_guest = 0;
  reply(REP_CALLBACK, msg, 2 + NCBARGS);
  for (;;) {
    uint32_t kind = request(&count);
    if (kind == REQ_RETURN && count == 1) {
      result = (word)words[0];
      break;
    }
    if (kind == REQ_PROTECT) {
      protect(count);
      continue;
    }
    if (kind == REQ_ABORT) {
      stop_pending = 1;
      break;
    }
    die(); /* no other request is valid while a callback runs */
  }
  if (stop_pending) {
    fault_info[0] = 0;
    fault_info[3] = 0;
    fault_info[4] = 0;
    siglongjmp(call_env, 2);
  }
  in_guest = 1;
  return result;
}

#define CB1(i) \
  static word cb_##i(word a0, word a1, word a2, word a3, word a4, word a5, word a6, word a7) { \
    return callback(i, a0, a1, a2, a3, a4, a5, a6, a7); \
  }
#define CB4(i) CB1(i##0) CB1(i##1) CB1(i##2) CB1(i##3)
#define CB16(i) CB4(i##0) CB4(i##1) CB4(i##2) CB4(i##3)
#define CB64(i) CB16(i##0) CB16(i##1) CB16(i##2) CB16(i##3)
CB64(0) CB64(1) CB64(2) CB64(3)
#define ADDR1(i) cb_##i,
#define ADDR4(i) ADDR1(i##0) ADDR1(i##1) ADDR1(i##2) ADDR1(i##3)
#define ADDR16(i) ADDR4(i##0) ADDR4(i##1) ADDR4(i##2) ADDR4(i##3)
#define ADDR64(i) ADDR16(i##0) ADDR16(i##1) ADDR16(i##2) ADDR16(i##3)
/* cb_0123 is slot 0*64 + 1*16 + 2*4 + 3. */
typedef word (*callback_fn)(word, word, word, word, word, word, word, word);
static const callback_fn callbacks[256] = {ADDR64(0) ADDR64(1) ADDR64(2) ADDR64(3)};

/* --- calls ------------------------------------------------------------------ */
typedef word (*fn16)(word, word, word, word, word, word, word, word, word, word,
                     word, word, word, word, word, word);

static fn16 call_fn;
static word call_args[NARGS];
static word call_result;

static void call_body(void) {
  word *a = call_args;
  call_result = call_fn(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8], a[9],
                        a[10], a[11], a[12], a[13], a[14], a[15]);
}

/* run_on_stack(body, top): call body() with the stack pointer at top (16-byte
 * aligned), then return on this stack. A fault or stop leaves it by
 * siglongjmp, which restores the stack pointer of the sigsetjmp. */
void run_on_stack(void (*body)(void), word top);
#if defined(__x86_64__)
__asm__(".text\n.globl run_on_stack\n.type run_on_stack,@function\nrun_on_stack:\n"
        "  push %rbp\n  mov %rsp, %rbp\n  mov %rsi, %rsp\n  call *%rdi\n"
        "  mov %rbp, %rsp\n  pop %rbp\n  ret\n");
#elif defined(__i386__)
__asm__(".text\n.globl run_on_stack\n.type run_on_stack,@function\nrun_on_stack:\n"
        "  push %ebp\n  mov %esp, %ebp\n  mov 8(%ebp), %eax\n  mov 12(%ebp), %esp\n"
        "  call *%eax\n  mov %ebp, %esp\n  pop %ebp\n  ret\n");
#elif defined(__aarch64__)
__asm__(".text\n.globl run_on_stack\n.type run_on_stack,%function\nrun_on_stack:\n"
        "  stp x29, x30, [sp, #-16]!\n  mov x29, sp\n  mov sp, x1\n  blr x0\n"
        "  mov sp, x29\n  ldp x29, x30, [sp], #16\n  ret\n");
#elif defined(__arm__)
__asm__(".text\n.arm\n.globl run_on_stack\n.type run_on_stack,%function\nrun_on_stack:\n"
        "  push {r4, lr}\n  mov r4, sp\n  mov sp, r1\n  blx r0\n  mov sp, r4\n"
        "  pop {r4, pc}\n");
#elif defined(__riscv) && __riscv_xlen == 64
__asm__(".text\n.globl run_on_stack\n.type run_on_stack,@function\nrun_on_stack:\n"
        "  addi sp, sp, -16\n  sd ra, 8(sp)\n  sd s0, 0(sp)\n  mv s0, sp\n"
        "  mv sp, a1\n  jalr a0\n  mv sp, s0\n  ld ra, 8(sp)\n  ld s0, 0(sp)\n"
        "  addi sp, sp, 16\n  ret\n");
#elif defined(__riscv)
__asm__(".text\n.globl run_on_stack\n.type run_on_stack,@function\nrun_on_stack:\n"
        "  addi sp, sp, -16\n  sw ra, 12(sp)\n  sw s0, 8(sp)\n  mv s0, sp\n"
        "  mv sp, a1\n  jalr a0\n  mv sp, s0\n  lw ra, 12(sp)\n  lw s0, 8(sp)\n"
        "  addi sp, sp, 16\n  ret\n");
#endif

/* Raise the sticky "inexact" floating-point flag. qemu-user computes guest
 * floating point with the host's FPU only once that flag is set (until
 * then every operation goes through its software path, several times
 * slower); a process that has done any inexact arithmetic has it set, as
 * IREE's own runtime has when it dispatches. */
static void set_inexact(void) {
#if defined(__x86_64__) || defined(__i386__)
  unsigned csr;
  __asm__ volatile("stmxcsr %0" : "=m"(csr));
  csr |= 0x20; /* PE */
  __asm__ volatile("ldmxcsr %0" : : "m"(csr));
#elif defined(__aarch64__)
  unsigned long fpsr;
  __asm__ volatile("mrs %0, fpsr" : "=r"(fpsr));
  fpsr |= 0x10; /* IXC */
  __asm__ volatile("msr fpsr, %0" : : "r"(fpsr));
#elif defined(__arm__)
  unsigned fpscr;
  __asm__ volatile("vmrs %0, fpscr" : "=r"(fpscr));
  fpscr |= 0x10; /* IXC */
  __asm__ volatile("vmsr fpscr, %0" : : "r"(fpscr));
#elif defined(__riscv)
  __asm__ volatile("csrsi 0x001, 1"); /* fflags.NX */
#endif
}

/* words: function, stack top (0: this program's stack), sequence,
 * arguments... */
static void do_call(uint32_t count) {
  u64 result[2];
  word top = (word)words[1];
  call_fn = (fn16)(word)words[0];
  call_sequence = words[2];
  for (uint32_t i = 0; i < NARGS; i++) call_args[i] = i + 3 < count ? (word)words[i + 3] : 0;
  stop_pending = 0;
  in_call = 1;
  int how = sigsetjmp(call_env, 1);
  if (how == 0) {
    set_inexact();
    in_guest = 1;
    if (top) run_on_stack(call_body, top & ~(word)15);
    else call_body();
    in_guest = 0;
    in_call = 0;
    harden();
    result[0] = (u64)call_result;
    result[1] = call_sequence;
    reply(REP_DONE, result, 2);
    return;
  }
  in_guest = 0;
  in_call = 0;
  harden();
  if (how == 1) {
    u64 out[6];
    for (int i = 0; i < 5; i++) out[i] = fault_info[i];
    out[5] = call_sequence;
    reply(REP_FAULT, out, 6);
  } else {
    u64 out[3] = {fault_info[3], fault_info[4], call_sequence};
    reply(REP_STOPPED, out, 3);
  }
}

/* The host's end of the request pipe closes when the host process ends,
 * however it ends: then the agent ends too, even in the middle of guest
 * code that would run forever. The watchdog thread waits for that (poll
 * with no events reports only the hang-up) and blocks every signal, so
 * stop requests and faults reach the main thread. */
static void *watchdog(void *arg) {
  (void)arg;
  struct pollfd p = {.fd = fd_in, .events = 0, .revents = 0};
  for (;;) {
    if (poll(&p, 1, -1) > 0 && (p.revents & (POLLHUP | POLLERR | POLLNVAL))) _exit(5);
  }
  return 0;
}

static void start_watchdog(void) {
  sigset_t all, old;
  pthread_t thread;
  pthread_attr_t attr;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  pthread_attr_init(&attr);
  pthread_attr_setstacksize(&attr, 1 << 16);
  pthread_create(&thread, &attr, watchdog, 0);
  pthread_sigmask(SIG_SETMASK, &old, 0);
}

static char altstack[1 << 16];

int main(int argc, char **argv) {
  if (argc >= 3) {
    fd_in = atoi(argv[1]);
    fd_out = atoi(argv[2]);
  }
  stack_t ss = {.ss_sp = altstack, .ss_size = sizeof altstack, .ss_flags = 0};
  sigaltstack(&ss, 0);
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_sigaction = on_fault;
  sa.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_NODEFER;
  sigemptyset(&sa.sa_mask);
  int faults[] = {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGTRAP, SIGSYS};
  for (unsigned i = 0; i < sizeof faults / sizeof faults[0]; i++) sigaction(faults[i], &sa, 0);
  sa.sa_sigaction = on_stop;
  sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
  sigaction(SIGUSR1, &sa, 0);
  signal(SIGPIPE, SIG_IGN);
  start_watchdog();

  for (;;) {
    uint32_t count;
    uint32_t kind = request(&count);
    switch (kind) {
      case REQ_MAP: {
        if (count != 4) die();
        int flags = MAP_SHARED | (words[3] ? MAP_FIXED_NOREPLACE : 0);
        void *p = mmap((void *)(word)words[2], (size_t)words[1], PROT_NONE, flags,
                       (int)words[0], 0);
        if (p == MAP_FAILED) {
          u64 err[3] = {(u64)errno, REQ_MAP, 0};
          reply(REP_ERROR, err, 3);
        } else {
          u64 base = (u64)(word)p;
          reply(REP_OK, &base, 1);
        }
        break;
      }
      case REQ_PROTECT:
        protect(count);
        break;
      case REQ_CALL:
        if (count < 3) die();
        do_call(count);
        break;
      case REQ_CALLBACKS: {
        static u64 addresses[256];
        for (unsigned i = 0; i < 256; i++) addresses[i] = (u64)(word)callbacks[i];
        reply(REP_OK, addresses, 256);
        break;
      }
      case REQ_EXIT:
        _exit(0);
      default:
        die();
    }
  }
}
