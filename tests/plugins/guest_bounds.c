/*
 * guest_bounds.c - an IREE CPU executable library (the
 * iree_hal_executable_library_query ABI, version 0x6; layouts as in
 * hal_cpu/abi.py) whose one export tests the bounds of emulated guests
 * (tests/test_guest_bounds.py).
 *
 * Export `bounds_dispatch`: 3 push constants, 1 binding.
 *   constant 0  the case:
 *               1  mmap `constant 1` MiB of anonymous memory in pieces of
 *                  `constant 2` MiB (0: one piece) and write one byte per
 *                  page of each: returns 0 when all of it was written (the
 *                  escape), else the errno of the mmap that failed
 *               2  a forged rt_sigreturn (x86_64; elsewhere returns 38):
 *                  the stack pointer on a frame of 0x41 bytes
 *               3  read the byte `constant 1` bytes before binding 0
 *               4  write the byte `constant 1` bytes before binding 0
 *               5  read the byte `constant 1` bytes after binding 0's end
 *               0  returns 0
 *   binding 0   any bytes
 * Cases 3-5 return 0 when the access went through.
 */
#include "hostile_syscall.h"

#include <stddef.h>
#include <stdint.h>

#include "executable_library.h"

/* ---- the export ---------------------------------------------------------- */

#define CONSTANT_COUNT 3
#define BINDING_COUNT 1

__attribute__((noinline)) static long bounds_mmap(unsigned mib,
                                                  unsigned piece_mib) {
  unsigned long total = (unsigned long)mib << 20;
  unsigned long piece = piece_mib ? (unsigned long)piece_mib << 20 : total;
  for (unsigned long done = 0; done < total; done += piece) {
    /* PROT_READ|PROT_WRITE, MAP_PRIVATE|MAP_ANONYMOUS */
    long got = hs_call6(NR_mmap, 0, (long)piece, 3, 0x02 | 0x20, -1, 0);
    if (hs_failed(got)) return -got;
    volatile unsigned char* p = (volatile unsigned char*)got;
    for (unsigned long off = 0; off < piece; off += 4096) p[off] = 1;
  }
  return 0;
}

__attribute__((noinline)) static long bounds_sigreturn(void) {
#if defined(__x86_64__)
  static unsigned char frame[4096] __attribute__((aligned(16)));
  for (size_t i = 0; i < sizeof frame; ++i) frame[i] = 0x41;
  __asm__ volatile("mov %0, %%rsp\n\tmov $15, %%eax\n\tsyscall"
                   : : "r"(frame + 64) : "rax", "rcx", "r11", "memory");
  return 0;
#else
  return 38;
#endif
}

__attribute__((noinline)) static int bounds_read(const volatile uint8_t* p) {
  uint8_t got = *p;
  return got & 0;
}

__attribute__((noinline)) static void bounds_write(volatile uint8_t* p) {
  *p = 0x7F;
}

static int bounds_dispatch(const environment_t* environment,
                           const dispatch_state_t* state,
                           const workgroup_state_t* workgroup_state) {
  (void)environment;
  (void)workgroup_state;
  if (state->constant_count < CONSTANT_COUNT) return 22;
  const uint32_t* c = state->constants;
  uint8_t* binding = (uint8_t*)state->binding_ptrs[0];
  switch (c[0]) {
    case 1: return (int)bounds_mmap(c[1], c[2]);
    case 2: return (int)bounds_sigreturn();
    case 3: return bounds_read(binding - c[1]);
    case 4: bounds_write(binding - c[1]); return 0;
    case 5: return bounds_read(binding + state->binding_lengths[0] + c[1]);
    default: return 0;
  }
}

static const dispatch_fn_t kExportPtrs[1] = {bounds_dispatch};
static const char* const kExportNames[1] = {"bounds_dispatch"};
static const dispatch_attrs_t kExportAttrs[1] = {{
    .constant_count = CONSTANT_COUNT,
    .binding_count = BINDING_COUNT,
    .workgroup_size_x = 1,
    .workgroup_size_y = 1,
    .workgroup_size_z = 1,
}};

static const library_header_t kHeader = {
    .version = LIBRARY_VERSION_0_6,
    .name = "guest_bounds",
    .features = 0,
    .sanitizer = 0,
};

static const library_v0_t kLibrary = {
    .header = &kHeader,
    .imports = {.count = 0},
    .exports = {.count = 1, .ptrs = kExportPtrs, .attrs = kExportAttrs,
                .names = kExportNames},
    .constants = {.count = 0},
    .sources = {.count = 0},
};

__attribute__((visibility("default"))) const library_header_t**
iree_hal_executable_library_query(uint32_t max_version,
                                  const environment_t* environment) {
  (void)environment;
  if (max_version < LIBRARY_VERSION_0_6) return NULL;
  return (const library_header_t**)&kLibrary;
}
