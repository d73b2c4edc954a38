/*
 * system_plugin.c - an IREE HAL executable plugin (ABI 0x1) meant to be built
 * as an ordinary host shared library (cc -shared -fPIC) and loaded with the
 * system dynamic loader (dlopen / ctypes).  Unlike standalone_plugin.c it may
 * use libc: its per-load state comes from calloc()/free() rather than the
 * host allocator, which is why it does not claim FEATURE_STANDALONE.
 *
 * Imports resolved:
 *   system_mul_workgroup   out = lhs * rhs over the 64-element tile of
 *                          workgroup `tid`; same parameter struct as
 *                          simple_mul_workgroup in standalone_plugin.c
 *                          (see system_example.mlir).  The import context is
 *                          the plugin instance, which counts the calls.
 *
 * Load parameters: none are interpreted.
 */
#include <stdlib.h>

#include "sample_common.h"

typedef struct {
  /* Number of workgroup calls made through this instance. */
  unsigned long calls;
} system_instance_t;

static int system_mul_workgroup(void* params_ptr, void* context,
                                void* reserved) {
  (void)reserved;
  const mul_params_t* p = (const mul_params_t*)params_ptr;
  system_instance_t* instance = (system_instance_t*)context;
  if (instance) __atomic_fetch_add(&instance->calls, 1, __ATOMIC_RELAXED);
  size_t begin, end;
  if (!tile_range(p->dim, p->tid, &begin, &end)) return 0;
  const float* lhs = p->binding0 + p->binding0_offset;
  const float* rhs = p->binding1 + p->binding1_offset;
  float* out = p->binding2 + p->binding2_offset;
  for (size_t i = begin; i < end; ++i) out[i] = lhs[i] * rhs[i];
  return 0;
}

static iree_hal_executable_plugin_status_t system_load(
    const iree_hal_executable_plugin_environment_v0_t* environment,
    size_t param_count, const iree_hal_executable_plugin_string_pair_t* params,
    void** out_self) {
  (void)environment;
  (void)param_count;
  (void)params;
  system_instance_t* instance = calloc(1, sizeof(*instance));
  if (!instance) {
    *out_self = NULL;
    return plugin_status(IREE_HAL_EXECUTABLE_PLUGIN_STATUS_RESOURCE_EXHAUSTED);
  }
  *out_self = instance;
  return plugin_status(IREE_HAL_EXECUTABLE_PLUGIN_STATUS_OK);
}

static void system_unload(void* self) { free(self); }

static const export_entry_t kExports[] = {
    {"system_mul_workgroup", system_mul_workgroup, 1},
};

static iree_hal_executable_plugin_status_t system_resolve(
    void* self, const iree_hal_executable_plugin_resolve_params_v0_t* params,
    iree_hal_executable_plugin_resolution_t* out_resolution) {
  return resolve_from_table(kExports, sizeof(kExports) / sizeof(kExports[0]),
                            self, params, out_resolution);
}

static const iree_hal_executable_plugin_header_t kHeader = {
    .version = IREE_HAL_EXECUTABLE_PLUGIN_VERSION_0_1,
    .name = "sample_system",
    .description = "sample_plugins/system_plugin.c (libc, host only)",
    .features = IREE_HAL_EXECUTABLE_PLUGIN_FEATURE_NONE,
    .sanitizer = IREE_HAL_EXECUTABLE_PLUGIN_SANITIZER_NONE,
};

static const iree_hal_executable_plugin_v0_t kPlugin = {
    .header = &kHeader,
    .load = system_load,
    .unload = system_unload,
    .resolve = system_resolve,
};

IREE_HAL_EXECUTABLE_PLUGIN_EXPORT const iree_hal_executable_plugin_header_t**
iree_hal_executable_plugin_query(iree_hal_executable_plugin_version_t max_version,
                                 void* reserved) {
  (void)reserved;
  if (max_version < IREE_HAL_EXECUTABLE_PLUGIN_VERSION_0_1) return NULL;
  return (const iree_hal_executable_plugin_header_t**)&kPlugin;
}

/*
 * Not part of the plugin ABI: lets a host that loaded this library with the
 * system loader (e.g. ctypes) read how many workgroup calls an instance saw.
 */
IREE_HAL_EXECUTABLE_PLUGIN_EXPORT unsigned long sample_system_plugin_call_count(
    void* self) {
  system_instance_t* instance = (system_instance_t*)self;
  return instance ? __atomic_load_n(&instance->calls, __ATOMIC_RELAXED) : 0;
}
