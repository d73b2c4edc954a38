/*
 * hostile.c - an executable plugin that tries to reach the host through
 * Linux system calls (tests/plugins/hostile_cases.h), to check that
 * emulation is a sandbox: every attempt must end in a 'syscall' fault.
 *
 * Load parameters (`hostile.sos?syscall=openat&path=/tmp/x`):
 *   syscall=NAME   the case: openat unlinkat renameat execve socket kill
 *                  tgkill ptrace process_vm_readv clone mmap rt_sigaction
 *                  (or none)
 *   path=, path2=  files (the marker to make, the file to remove or rename,
 *                  the new name)
 *   pid=N          the process kill, tgkill, ptrace and process_vm_readv aim
 *                  at (refused without a call below 2)
 *   port=N         the TCP port on 127.0.0.1 socket connects to
 *   addr=N         process_vm_readv: the address to read in pid (0x... or
 *                  decimal)
 *   touch_mib=N    mmap: MiB of the mapping written to (default 1536)
 *   when=load|call load (default): the case runs in `load`; call: `load`
 *                  only keeps the parameters and each call of the imports
 *                  hostile_syscall or simple_mul_workgroup (the name the
 *                  sample programs import) runs it
 *
 * `load` returns OK when the case did what it was made for (an escape),
 * else a status for the errno: UNIMPLEMENTED (ENOSYS), RESOURCE_EXHAUSTED
 * (ENOMEM), PERMISSION_DENIED (EPERM, EACCES), INVALID_ARGUMENT (bad
 * parameters, EINVAL), UNKNOWN (any other). The imports return 0 or the
 * errno.
 *
 * Built with -DHOSTILE_INIT=<case number> -DHOSTILE_PATH="\"/marker\"",
 * the case runs from an initializer while the file is being loaded.
 */
#include "hostile_cases.h"
#include "plugin_abi.h"

static hostile_args_t g_args;
static char g_path[512], g_path2[512];
static int g_when_call;

static int view_is(iree_hal_executable_plugin_string_view_t v, const char* s) {
  size_t n = hs_strlen(s);
  if (v.size != n) return 0;
  for (size_t i = 0; i < n; ++i)
    if (v.data[i] != s[i]) return 0;
  return 1;
}

static int copy_view(iree_hal_executable_plugin_string_view_t v, char* out,
                     size_t capacity) {
  if (v.size >= capacity) return 0;
  for (size_t i = 0; i < v.size; ++i) out[i] = v.data[i];
  out[v.size] = 0;
  return 1;
}

/* A decimal or 0x-prefixed hexadecimal number, optionally negative. */
static int parse_number(iree_hal_executable_plugin_string_view_t v,
                        uint64_t* out, int* negative) {
  size_t i = 0;
  int base = 10;
  *negative = 0;
  if (i < v.size && v.data[i] == '-') *negative = 1, ++i;
  if (i + 1 < v.size && v.data[i] == '0' &&
      (v.data[i + 1] == 'x' || v.data[i + 1] == 'X'))
    base = 16, i += 2;
  if (i >= v.size) return 0;
  uint64_t value = 0;
  for (; i < v.size; ++i) {
    char c = v.data[i];
    int digit;
    if (c >= '0' && c <= '9') digit = c - '0';
    else if (base == 16 && c >= 'a' && c <= 'f') digit = c - 'a' + 10;
    else if (base == 16 && c >= 'A' && c <= 'F') digit = c - 'A' + 10;
    else return 0;
    value = value * (uint64_t)base + (uint64_t)digit;
  }
  *out = value;
  return 1;
}

static uint32_t status_of(long err) {
  switch (err) {
    case 0: return IREE_HAL_EXECUTABLE_PLUGIN_STATUS_OK;
    case 38: return IREE_HAL_EXECUTABLE_PLUGIN_STATUS_UNIMPLEMENTED;   /* ENOSYS */
    case 12: return IREE_HAL_EXECUTABLE_PLUGIN_STATUS_RESOURCE_EXHAUSTED; /* ENOMEM */
    case 1:                                                            /* EPERM */
    case 13: return IREE_HAL_EXECUTABLE_PLUGIN_STATUS_PERMISSION_DENIED;  /* EACCES */
    case HS_EINVAL: return IREE_HAL_EXECUTABLE_PLUGIN_STATUS_INVALID_ARGUMENT;
    default: return IREE_HAL_EXECUTABLE_PLUGIN_STATUS_UNKNOWN;
  }
}

static int parse_params(size_t count,
                        const iree_hal_executable_plugin_string_pair_t* params) {
  hostile_args_t a = {0};
  int when_call = 0;
  for (size_t i = 0; i < count; ++i) {
    iree_hal_executable_plugin_string_view_t key = params[i].key;
    iree_hal_executable_plugin_string_view_t value = params[i].value;
    uint64_t number = 0;
    int negative = 0;
    if (view_is(key, "syscall")) {
      int found = -1;
      for (int c = 0; c < HOSTILE_CASE_COUNT; ++c)
        if (view_is(value, kHostileNames[c])) found = c;
      if (found < 0) return 0;
      a.which = found;
    } else if (view_is(key, "path")) {
      if (!copy_view(value, g_path, sizeof g_path)) return 0;
      a.path = g_path;
    } else if (view_is(key, "path2")) {
      if (!copy_view(value, g_path2, sizeof g_path2)) return 0;
      a.path2 = g_path2;
    } else if (view_is(key, "when")) {
      if (view_is(value, "call")) when_call = 1;
      else if (!view_is(value, "load")) return 0;
    } else if (parse_number(value, &number, &negative)) {
      if (view_is(key, "pid")) a.pid = negative ? -(long)number : (long)number;
      else if (negative) return 0;
      else if (view_is(key, "port")) a.port = (unsigned)number;
      else if (view_is(key, "addr")) a.addr = (uintptr_t)number;
      else if (view_is(key, "touch_mib")) a.touch_mib = (unsigned)number;
      else return 0;
    } else {
      return 0;
    }
  }
  g_args = a;
  g_when_call = when_call;
  return 1;
}

static iree_hal_executable_plugin_status_t plugin_load(
    const iree_hal_executable_plugin_environment_v0_t* environment,
    size_t param_count, const iree_hal_executable_plugin_string_pair_t* params,
    void** out_self) {
  (void)environment;
  *out_self = NULL;
  if (!parse_params(param_count, params))
    return plugin_status(IREE_HAL_EXECUTABLE_PLUGIN_STATUS_INVALID_ARGUMENT);
  if (g_when_call) return plugin_status(IREE_HAL_EXECUTABLE_PLUGIN_STATUS_OK);
  return plugin_status(status_of(hostile_run(&g_args)));
}

static void plugin_unload(void* self) { (void)self; }

/* Both imports run the case chosen at load (when=call). */
static int hostile_syscall(void* params, void* context, void* reserved) {
  (void)params, (void)context, (void)reserved;
  return (int)hostile_run(&g_args);
}

static const char* const kImports[] = {"hostile_syscall",
                                       "simple_mul_workgroup"};

static iree_hal_executable_plugin_status_t plugin_resolve(
    void* self, const iree_hal_executable_plugin_resolve_params_v0_t* params,
    iree_hal_executable_plugin_resolution_t* out_resolution) {
  (void)self;
  int missing = 0;
  *out_resolution = 0;
  for (size_t i = 0; i < params->count; ++i) {
    if (params->out_fn_ptrs[i]) continue;
    const char* name = params->symbol_names[i];
    int optional = name[0] == '?';
    if (optional) ++name;
    int found = 0;
    for (size_t j = 0; j < sizeof kImports / sizeof kImports[0]; ++j) {
      size_t k = 0;
      while (name[k] && name[k] == kImports[j][k]) ++k;
      if (name[k] == kImports[j][k]) found = 1;
    }
    if (found) {
      params->out_fn_ptrs[i] = (void*)hostile_syscall;
      params->out_fn_contexts[i] = NULL;
    } else if (optional) {
      *out_resolution |= IREE_HAL_EXECUTABLE_PLUGIN_RESOLUTION_MISSING_OPTIONAL;
    } else {
      missing = 1;
    }
  }
  return plugin_status(missing ? IREE_HAL_EXECUTABLE_PLUGIN_STATUS_NOT_FOUND
                               : IREE_HAL_EXECUTABLE_PLUGIN_STATUS_OK);
}

static const iree_hal_executable_plugin_header_t kHeader = {
    .version = IREE_HAL_EXECUTABLE_PLUGIN_VERSION_0_1,
    .name = "hostile",
    .description = "tests/plugins/hostile.c",
    .features = IREE_HAL_EXECUTABLE_PLUGIN_FEATURE_STANDALONE,
    .sanitizer = IREE_HAL_EXECUTABLE_PLUGIN_SANITIZER_NONE,
};

static const iree_hal_executable_plugin_v0_t kPlugin = {
    .header = &kHeader,
    .load = plugin_load,
    .unload = plugin_unload,
    .resolve = plugin_resolve,
};

IREE_HAL_EXECUTABLE_PLUGIN_EXPORT const iree_hal_executable_plugin_header_t**
iree_hal_executable_plugin_query(iree_hal_executable_plugin_version_t max_version,
                                 void* reserved) {
  (void)reserved;
  if (max_version < IREE_HAL_EXECUTABLE_PLUGIN_VERSION_0_1) return NULL;
  return (const iree_hal_executable_plugin_header_t**)&kPlugin;
}
