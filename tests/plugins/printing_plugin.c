/*
 * printing_plugin.c - a system-library executable plugin (ABI 0x1) that
 * prints a line to stdout for every element it multiplies, as IREE's
 * system-plugin sample does: the test of where a plugin's output lands
 * among what run-module prints (EXEC first, the plugin's lines while the
 * dispatch runs, the results last).
 *
 * Imports resolved:
 *   system_mul_workgroup   out = lhs * rhs over the 64-element tile of
 *                          workgroup `tid` (the parameter struct of
 *                          sample_plugins/system_example.mlir), printing
 *                          "mul[tid:i](lhs * rhs = out)" per element.
 *
 * Build: cc -std=c11 -shared -fPIC -O2 -I sample_plugins -I hal_cpu/include
 *        tests/plugins/printing_plugin.c -o printing_plugin.so
 */
#include <stdio.h>
#include <stdlib.h>

#include "sample_common.h"

static int printing_mul_workgroup(void* params_ptr, void* context,
                                  void* reserved) {
  (void)context;
  (void)reserved;
  const mul_params_t* p = (const mul_params_t*)params_ptr;
  size_t begin, end;
  if (!tile_range(p->dim, p->tid, &begin, &end)) return 0;
  const float* lhs = p->binding0 + p->binding0_offset;
  const float* rhs = p->binding1 + p->binding1_offset;
  float* out = p->binding2 + p->binding2_offset;
  for (size_t i = begin; i < end; ++i) {
    out[i] = lhs[i] * rhs[i];
    printf("mul[%zu:%zu](%g * %g = %g)\n", p->tid, i, lhs[i], rhs[i], out[i]);
  }
  return 0;
}

static iree_hal_executable_plugin_status_t printing_load(
    const iree_hal_executable_plugin_environment_v0_t* environment,
    size_t param_count, const iree_hal_executable_plugin_string_pair_t* params,
    void** out_self) {
  (void)environment;
  (void)param_count;
  (void)params;
  *out_self = NULL;
  return plugin_status(IREE_HAL_EXECUTABLE_PLUGIN_STATUS_OK);
}

static void printing_unload(void* self) {
  (void)self;
  fflush(stdout);
}

static const export_entry_t kExports[] = {
    {"system_mul_workgroup", printing_mul_workgroup, 0},
};

static iree_hal_executable_plugin_status_t printing_resolve(
    void* self, const iree_hal_executable_plugin_resolve_params_v0_t* params,
    iree_hal_executable_plugin_resolution_t* out_resolution) {
  return resolve_from_table(kExports, sizeof(kExports) / sizeof(kExports[0]),
                            self, params, out_resolution);
}

static const iree_hal_executable_plugin_header_t kHeader = {
    .version = IREE_HAL_EXECUTABLE_PLUGIN_VERSION_0_1,
    .name = "printing_system",
    .description = "tests/plugins/printing_plugin.c (libc, prints)",
    .features = IREE_HAL_EXECUTABLE_PLUGIN_FEATURE_NONE,
    .sanitizer = IREE_HAL_EXECUTABLE_PLUGIN_SANITIZER_NONE,
};

static const iree_hal_executable_plugin_v0_t kPlugin = {
    .header = &kHeader,
    .load = printing_load,
    .unload = printing_unload,
    .resolve = printing_resolve,
};

IREE_HAL_EXECUTABLE_PLUGIN_EXPORT const iree_hal_executable_plugin_header_t**
iree_hal_executable_plugin_query(iree_hal_executable_plugin_version_t max_version,
                                 void* reserved) {
  (void)reserved;
  if (max_version < IREE_HAL_EXECUTABLE_PLUGIN_VERSION_0_1) return NULL;
  return (const iree_hal_executable_plugin_header_t**)&kPlugin;
}
