/* scale_plugin.c - one import, out[i] = in[i] * factor, as a plugin. */
#include "plugin_abi.h"

typedef struct {
  const float* in;  /* ptr: 4 or 8 bytes */
  float* out;       /* ptr */
  size_t n;         /* size: 4 or 8 bytes */
  float factor;     /* f32: 4 bytes, after the pointer-sized fields */
} scale_params_t;

static int scale_f32(void* params, void* context, void* reserved) {
  (void)context, (void)reserved;
  const scale_params_t* p = (const scale_params_t*)params;
  for (size_t i = 0; i < p->n; ++i) p->out[i] = p->in[i] * p->factor;
  return 0;
}

static iree_hal_executable_plugin_status_t load(
    const iree_hal_executable_plugin_environment_v0_t* environment,
    size_t param_count, const iree_hal_executable_plugin_string_pair_t* params,
    void** out_self) {
  (void)environment, (void)param_count, (void)params;
  *out_self = NULL;
  return plugin_status(IREE_HAL_EXECUTABLE_PLUGIN_STATUS_OK);
}

static void unload(void* self) { (void)self; }

static int is(const char* a, const char* b) {
  while (*a && *a == *b) ++a, ++b;
  return *a == *b;
}

static iree_hal_executable_plugin_status_t resolve(
    void* self, const iree_hal_executable_plugin_resolve_params_v0_t* params,
    iree_hal_executable_plugin_resolution_t* out_resolution) {
  (void)self;
  *out_resolution = 0;
  int missing = 0;
  for (size_t i = 0; i < params->count; ++i) {
    if (params->out_fn_ptrs[i]) continue;
    const char* name = params->symbol_names[i];
    int optional = name[0] == '?';
    if (is(name + optional, "scale_f32")) {
      params->out_fn_ptrs[i] = scale_f32;
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

static const iree_hal_executable_plugin_header_t header = {
    .version = IREE_HAL_EXECUTABLE_PLUGIN_VERSION_0_1,
    .name = "scale",
    .description = "out = in * factor",
    .features = IREE_HAL_EXECUTABLE_PLUGIN_FEATURE_STANDALONE,
    .sanitizer = IREE_HAL_EXECUTABLE_PLUGIN_SANITIZER_NONE,
};

static const iree_hal_executable_plugin_v0_t plugin = {
    .header = &header, .load = load, .unload = unload, .resolve = resolve};

IREE_HAL_EXECUTABLE_PLUGIN_EXPORT const iree_hal_executable_plugin_header_t**
iree_hal_executable_plugin_query(iree_hal_executable_plugin_version_t max_version,
                                 void* reserved) {
  (void)reserved;
  if (max_version < IREE_HAL_EXECUTABLE_PLUGIN_VERSION_0_1) return NULL;
  return (const iree_hal_executable_plugin_header_t**)&plugin;
}
