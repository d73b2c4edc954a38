/*
 * hostile_executable.c - an IREE CPU executable library (the
 * iree_hal_executable_library_query ABI, version 0x6; layouts as in
 * hal_cpu/abi.py) written in C, whose one export makes the Linux system
 * calls of tests/plugins/hostile_cases.h.
 *
 * Export `hostile_dispatch`: 4 push constants, 2 bindings.
 *   constant 0  the case number (hostile_cases.h: 1 openat ... 12
 *               rt_sigaction; 0 none: returns 0; 13: calls the optional
 *               import `hostile_syscall` and returns what it returns)
 *   constant 1  pid (kill, tgkill, ptrace, process_vm_readv), port (socket)
 *               or MiB to write (mmap)
 *   constant 2, 3  process_vm_readv: the low and high 32 bits of an
 *               address in pid
 *   binding 0   path: a NUL-terminated string (the marker, or the file to
 *               remove or rename)
 *   binding 1   path2: a NUL-terminated string (renameat's new name)
 * It returns 0 when the case did what it was made for (an escape), else
 * the errno (the runtime reports a workgroup that returned non-zero).
 *
 * Built with -DHOSTILE_INIT=<case number> -DHOSTILE_PATH="\"/marker\"",
 * the case runs from an initializer (DT_INIT_ARRAY) while the library is
 * loaded.
 */
#include "hostile_cases.h"

#include "executable_library.h"

/* ---- the export ---------------------------------------------------------- */

#define HOSTILE_IMPORT 13
#define CONSTANT_COUNT 4
#define BINDING_COUNT 2

/* The binding as a C string, or NULL when it holds no NUL. */
static const char* binding_string(const dispatch_state_t* state, int i) {
  if (state->binding_count <= i || !state->binding_ptrs[i]) return NULL;
  const char* s = (const char*)state->binding_ptrs[i];
  for (size_t k = 0; k < state->binding_lengths[i]; ++k)
    if (!s[k]) return s;
  return NULL;
}

static int hostile_dispatch(const environment_t* environment,
                            const dispatch_state_t* state,
                            const workgroup_state_t* workgroup_state) {
  (void)workgroup_state;
  if (state->constant_count < CONSTANT_COUNT) return HS_EINVAL;
  const uint32_t* c = state->constants;
  if (c[0] == HOSTILE_IMPORT) {
    const void* fn = environment->import_funcs ? environment->import_funcs[0]
                                               : NULL;
    if (!fn) return 38; /* ENOSYS: no plugin provides hostile_syscall */
    return environment->import_thunk(fn, NULL, environment->import_contexts[0],
                                     NULL);
  }
  hostile_args_t a = {0};
  a.which = (int)c[0];
  a.path = binding_string(state, 0);
  a.path2 = binding_string(state, 1);
  a.pid = (long)(int32_t)c[1];
  a.port = c[1];
  a.touch_mib = c[1];
  a.addr = (uintptr_t)((uint64_t)c[2] | ((uint64_t)c[3] << 32));
  return (int)hostile_run(&a);
}

static const dispatch_fn_t kExportPtrs[1] = {hostile_dispatch};
static const char* const kExportNames[1] = {"hostile_dispatch"};
static const dispatch_attrs_t kExportAttrs[1] = {{
    .constant_count = CONSTANT_COUNT,
    .binding_count = BINDING_COUNT,
    .workgroup_size_x = 1,
    .workgroup_size_y = 1,
    .workgroup_size_z = 1,
}};
static const char* const kImportNames[1] = {"?hostile_syscall"};

static const library_header_t kHeader = {
    .version = LIBRARY_VERSION_0_6,
    .name = "hostile_executable",
    .features = 0,
    .sanitizer = 0,
};

static const library_v0_t kLibrary = {
    .header = &kHeader,
    .imports = {.count = 1, .symbols = kImportNames},
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
