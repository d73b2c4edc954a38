/*
 * hostile_cases.h - what a hostile kernel or plugin tries against the host,
 * shared by tests/plugins/hostile.c (an executable plugin) and
 * tests/plugins/hostile_executable.c (an executable library).
 *
 * Each case makes raw Linux system calls (hostile_syscall.h) aimed at
 * something a test can observe on the host; under emulation every one must
 * end in a 'syscall' fault instead. hostile_run() returns 0 when the calls
 * did what they were made for (an escape) and a positive errno when the
 * kernel refused them.
 *
 *  no  name              what it does (and what the test looks for)
 *   1  openat            openat(path, O_CREAT|O_WRONLY|O_TRUNC) + write: the
 *                        marker file `path` appears
 *   2  unlinkat          unlinkat(path): the file the test made disappears
 *   3  renameat          renameat(path, path2) (renameat2 on RISC-V): path
 *                        disappears, path2 appears
 *   4  execve            execve("/bin/sh", "-c", "touch 'path'"): the marker
 *   5  socket            socket(AF_INET, SOCK_STREAM) + connect to
 *                        127.0.0.1:port: the test's listener accepts
 *   6  kill              kill(pid, SIGKILL): the test's sleeper dies
 *   7  tgkill            tgkill(pid, pid, SIGKILL): the same
 *   8  ptrace            ptrace(PTRACE_ATTACH, pid): the sleeper is traced
 *   9  process_vm_readv  reads 16 bytes at addr in pid: success is the escape
 *  10  clone             clone(SIGCHLD) (a fork: no CLONE_THREAD, no
 *                        CLONE_VM); the child makes the marker `path`
 *  11  mmap              mmap of 64 GiB (3 GiB on 32-bit) anonymous memory
 *                        (MAP_NORESERVE), then writes one byte per page to
 *                        the first `touch_mib` MiB: success is the escape
 *  12  rt_sigaction      SIGUSR1, SIGUSR2, SIGALRM, SIGINT, SIGTERM, SIGXCPU,
 *                        SIGVTALRM, SIGPROF set to SIG_IGN, then an endless
 *                        loop: never returns (the time limit must end it)
 *
 * kill, tgkill, ptrace and process_vm_readv refuse a pid below 2 without
 * making the call (EINVAL): kill(0) or kill(-1) would reach the test runner.
 */
#ifndef TESTS_PLUGINS_HOSTILE_CASES_H_
#define TESTS_PLUGINS_HOSTILE_CASES_H_

#include <stddef.h>
#include <stdint.h>

#include "hostile_syscall.h"

enum {
  HOSTILE_NONE = 0,
  HOSTILE_OPENAT = 1,
  HOSTILE_UNLINKAT = 2,
  HOSTILE_RENAMEAT = 3,
  HOSTILE_EXECVE = 4,
  HOSTILE_SOCKET = 5,
  HOSTILE_KILL = 6,
  HOSTILE_TGKILL = 7,
  HOSTILE_PTRACE = 8,
  HOSTILE_PROCESS_VM_READV = 9,
  HOSTILE_CLONE = 10,
  HOSTILE_MMAP = 11,
  HOSTILE_RT_SIGACTION = 12,
  HOSTILE_CASE_COUNT = 13,
};

/* Case names, as the plugin's `syscall=` load parameter spells them. */
static const char* const kHostileNames[HOSTILE_CASE_COUNT] = {
    "none",     "openat", "unlinkat", "renameat",         "execve",
    "socket",   "kill",   "tgkill",   "ptrace",           "process_vm_readv",
    "clone",    "mmap",   "rt_sigaction",
};

typedef struct {
  int which;          /* HOSTILE_* */
  const char* path;   /* openat, unlinkat, renameat (from), execve, clone */
  const char* path2;  /* renameat (to) */
  long pid;           /* kill, tgkill, ptrace, process_vm_readv */
  unsigned port;      /* socket */
  uintptr_t addr;     /* process_vm_readv: an address in pid */
  unsigned touch_mib; /* mmap: MiB to write to (default 1536) */
} hostile_args_t;

#define HS_EINVAL 22
#define HS_AT_FDCWD (-100)
#define HS_O_WRONLY 01
#define HS_O_CREAT 0100
#define HS_O_TRUNC 01000
#define HS_SIGKILL 9
#define HS_SIGCHLD 17
#define HS_PTRACE_ATTACH 16
#define HS_NOINLINE __attribute__((noinline, used))

static long hs_errno(long ret) { return hs_failed(ret) ? -ret : 0; }

static size_t hs_strlen(const char* s) {
  size_t n = 0;
  while (s[n]) ++n;
  return n;
}

/* `path` made (or truncated) with `text` in it. */
static long hs_make_file(const char* path, const char* text) {
  long fd = hs_call4(NR_openat, HS_AT_FDCWD, path,
                     HS_O_WRONLY | HS_O_CREAT | HS_O_TRUNC, 0644);
  if (hs_failed(fd)) return fd;
  hs_call3(NR_write, fd, text, hs_strlen(text));
  hs_call1(NR_close, fd);
  return 0;
}

HS_NOINLINE static long hostile_openat(const hostile_args_t* a) {
  if (!a->path || !a->path[0]) return HS_EINVAL;
  return hs_errno(hs_make_file(a->path, "escaped: openat\n"));
}

HS_NOINLINE static long hostile_unlinkat(const hostile_args_t* a) {
  if (!a->path || !a->path[0]) return HS_EINVAL;
  return hs_errno(hs_call3(NR_unlinkat, HS_AT_FDCWD, a->path, 0));
}

HS_NOINLINE static long hostile_renameat(const hostile_args_t* a) {
  if (!a->path || !a->path[0] || !a->path2 || !a->path2[0]) return HS_EINVAL;
  /* renameat2's flags (RISC-V) are 0: the same call as renameat. */
  return hs_errno(hs_call5(NR_renameat, HS_AT_FDCWD, a->path, HS_AT_FDCWD,
                           a->path2, 0));
}

static char g_hs_command[640];

HS_NOINLINE static long hostile_execve(const hostile_args_t* a) {
  if (!a->path || !a->path[0] || hs_strlen(a->path) > 600) return HS_EINVAL;
  static const char kTouch[] = "touch '";
  size_t n = 0;
  for (size_t i = 0; kTouch[i]; ++i) g_hs_command[n++] = kTouch[i];
  for (size_t i = 0; a->path[i]; ++i) g_hs_command[n++] = a->path[i];
  g_hs_command[n++] = '\'';
  g_hs_command[n] = 0;
  const char* argv[4] = {"/bin/sh", "-c", g_hs_command, NULL};
  const char* envp[1] = {NULL};
  /* Returns only when the kernel refused. */
  return hs_errno(hs_call3(NR_execve, argv[0], argv, envp));
}

HS_NOINLINE static long hostile_socket(const hostile_args_t* a) {
  if (a->port == 0 || a->port > 65535) return HS_EINVAL;
  long fd = hs_call3(NR_socket, 2 /* AF_INET */, 1 /* SOCK_STREAM */, 0);
  if (hs_failed(fd)) return -fd;
  /* struct sockaddr_in: family, port and address in network byte order. */
  unsigned char addr[16] = {2, 0, (unsigned char)(a->port >> 8),
                            (unsigned char)a->port, 127, 0, 0, 1};
  long ret = hs_call3(NR_connect, fd, addr, sizeof addr);
  hs_call1(NR_close, fd);
  return hs_errno(ret);
}

HS_NOINLINE static long hostile_kill(const hostile_args_t* a) {
  if (a->pid < 2) return HS_EINVAL;
  return hs_errno(hs_call2(NR_kill, a->pid, HS_SIGKILL));
}

HS_NOINLINE static long hostile_tgkill(const hostile_args_t* a) {
  if (a->pid < 2) return HS_EINVAL;
  return hs_errno(hs_call3(NR_tgkill, a->pid, a->pid, HS_SIGKILL));
}

HS_NOINLINE static long hostile_ptrace(const hostile_args_t* a) {
  if (a->pid < 2) return HS_EINVAL;
  return hs_errno(hs_call4(NR_ptrace, HS_PTRACE_ATTACH, a->pid, 0, 0));
}

HS_NOINLINE static long hostile_process_vm_readv(const hostile_args_t* a) {
  if (a->pid < 2) return HS_EINVAL;
  static unsigned char buffer[16];
  struct {
    void* base;
    size_t len;
  } local = {buffer, sizeof buffer}, remote = {(void*)a->addr, sizeof buffer};
  long got = hs_call6(NR_process_vm_readv, a->pid, (long)&local, 1,
                      (long)&remote, 1, 0);
  return hs_errno(got);
}

HS_NOINLINE static long hostile_clone(const hostile_args_t* a) {
  if (!a->path || !a->path[0]) return HS_EINVAL;
  /* A fork: a new process with a copy of this one's memory and stack. */
  long pid = hs_call5(NR_clone, HS_SIGCHLD, 0, 0, 0, 0);
  if (pid == 0) {
    hs_make_file(a->path, "escaped: clone\n");
    hs_call1(NR_exit_group, 0);
    for (;;) {
    }
  }
  return hs_errno(pid);
}

HS_NOINLINE static long hostile_mmap(const hostile_args_t* a) {
#if UINTPTR_MAX > 0xFFFFFFFFu
  const unsigned long size = 64ul << 30;
#else
  const unsigned long size = 3ul << 30;
#endif
  /* PROT_READ|PROT_WRITE, MAP_PRIVATE|MAP_ANONYMOUS|MAP_NORESERVE */
  long got = hs_call6(NR_mmap, 0, (long)size, 3, 0x02 | 0x20 | 0x4000, -1, 0);
  if (hs_failed(got)) return -got;
  volatile unsigned char* p = (volatile unsigned char*)got;
  unsigned long touch = (unsigned long)(a->touch_mib ? a->touch_mib : 1536)
                        << 20;
  if (touch > size) touch = size;
  for (unsigned long off = 0; off < touch; off += 4096) p[off] = 1;
  hs_call2(NR_munmap, got, (long)size);
  return 0;
}

HS_NOINLINE static long hostile_rt_sigaction(const hostile_args_t* a) {
  (void)a;
  /* The kernel's struct sigaction: the handler first (SIG_IGN == 1), then
   * flags, restorer (where the architecture has one) and mask, all zero
   * here; the mask is 8 bytes on every architecture. */
  static const unsigned long kIgnore[8] = {1};
  static const int kSignals[] = {10 /* SIGUSR1 */, 12 /* SIGUSR2 */,
                                 14 /* SIGALRM */, 2 /* SIGINT */,
                                 15 /* SIGTERM */, 24 /* SIGXCPU */,
                                 26 /* SIGVTALRM */, 27 /* SIGPROF */};
  long first = 0;
  for (size_t i = 0; i < sizeof kSignals / sizeof kSignals[0]; ++i) {
    long ret = hs_call4(NR_rt_sigaction, kSignals[i], kIgnore, 0, 8);
    if (i == 0) first = ret;
  }
  if (hs_failed(first)) return -first;
  volatile unsigned long spins = 0;
  for (;;) spins = spins + 1; /* whatever was meant to stop it is ignored */
  return 0;
}

/* Runs case a->which: 0 when the system calls did what they were made for,
 * else a positive errno (EINVAL for a case without its arguments). */
static long hostile_run(const hostile_args_t* a) {
  switch (a->which) {
    case HOSTILE_NONE: return 0;
    case HOSTILE_OPENAT: return hostile_openat(a);
    case HOSTILE_UNLINKAT: return hostile_unlinkat(a);
    case HOSTILE_RENAMEAT: return hostile_renameat(a);
    case HOSTILE_EXECVE: return hostile_execve(a);
    case HOSTILE_SOCKET: return hostile_socket(a);
    case HOSTILE_KILL: return hostile_kill(a);
    case HOSTILE_TGKILL: return hostile_tgkill(a);
    case HOSTILE_PTRACE: return hostile_ptrace(a);
    case HOSTILE_PROCESS_VM_READV: return hostile_process_vm_readv(a);
    case HOSTILE_CLONE: return hostile_clone(a);
    case HOSTILE_MMAP: return hostile_mmap(a);
    case HOSTILE_RT_SIGACTION: return hostile_rt_sigaction(a);
    default: return HS_EINVAL;
  }
}

#ifdef HOSTILE_INIT
/* Built with -DHOSTILE_INIT=<case> -DHOSTILE_PATH="\"/marker\"": the case
 * runs from an initializer (DT_INIT_ARRAY), while the file is loaded. */
#ifndef HOSTILE_PATH
#error "HOSTILE_INIT needs HOSTILE_PATH"
#endif
__attribute__((constructor, used)) static void hostile_init(void) {
  hostile_args_t a = {0};
  a.which = HOSTILE_INIT;
  a.path = HOSTILE_PATH;
  hostile_run(&a);
}
#endif

#endif /* TESTS_PLUGINS_HOSTILE_CASES_H_ */
