/*
 * buggy_plugin.c - a plugin whose imports have the usual bugs, to check that
 * the pytest fixtures turn each into a failing test with the right report.
 *
 * Every import takes
 *   struct { const float* src; float* dst; size_t n; float scale; }
 * and computes dst[i] = src[i] * scale for i < n, except:
 *   scale_ok        correct
 *   scale_overrun   also writes dst[n]              (overrun by one, write)
 *   sum_overrun     dst[0] = sum of src[0..n]       (overrun by one, read)
 *   scale_underrun  writes dst[i - 1]               (underrun by one, write)
 *   null_write      writes through a NULL pointer
 *   spin            never returns
 * The work is done by static (non-exported) helpers, so reports need the
 * static symbol table to name them.
 */
#include "plugin_abi.h"

typedef struct {
  const float* src;
  float* dst;
  size_t n;
  float scale;
} scale_params_t;

__attribute__((noinline)) static void scale_range(const float* src, float* dst,
                                                  size_t begin, size_t end,
                                                  float scale, long shift) {
  for (size_t i = begin; i < end; ++i) {
    dst[(long)i + shift] = src[i] * scale;
  }
}

__attribute__((noinline)) static float sum_range(const float* src, size_t end) {
  float total = 0.0f;
  for (size_t i = 0; i <= end; ++i) {
    total += src[i];
  }
  return total;
}

static int scale_ok(void* params, void* context, void* reserved) {
  (void)context, (void)reserved;
  const scale_params_t* p = (const scale_params_t*)params;
  scale_range(p->src, p->dst, 0, p->n, p->scale, 0);
  return 0;
}

static int scale_overrun(void* params, void* context, void* reserved) {
  (void)context, (void)reserved;
  const scale_params_t* p = (const scale_params_t*)params;
  scale_range(p->src, p->dst, 0, p->n + 1, p->scale, 0);
  return 0;
}

static int sum_overrun(void* params, void* context, void* reserved) {
  (void)context, (void)reserved;
  const scale_params_t* p = (const scale_params_t*)params;
  p->dst[0] = sum_range(p->src, p->n);
  return 0;
}

static int scale_underrun(void* params, void* context, void* reserved) {
  (void)context, (void)reserved;
  const scale_params_t* p = (const scale_params_t*)params;
  scale_range(p->src, p->dst, 0, p->n, p->scale, -1);
  return 0;
}

static int null_write(void* params, void* context, void* reserved) {
  (void)context, (void)reserved;
  const scale_params_t* p = (const scale_params_t*)params;
  float* volatile table = 0; /* a pointer the code forgot to set */
  scale_range(p->src, table, 0, p->n, p->scale, 0);
  return 0;
}

static int spin(void* params, void* context, void* reserved) {
  (void)params, (void)context, (void)reserved;
  volatile size_t steps = 0;
  for (;;) steps = steps + 1; /* the exit condition was forgotten */
  return 0;
}

typedef struct {
  const char* name;
  plugin_import_fn_t fn;
} entry_t;

static const entry_t kImports[] = {
    {"scale_ok", scale_ok},           {"scale_overrun", scale_overrun},
    {"sum_overrun", sum_overrun},     {"scale_underrun", scale_underrun},
    {"null_write", null_write},       {"spin", spin},
};

static int same(const char* a, const char* b) {
  while (*a && *a == *b) ++a, ++b;
  return *a == *b;
}

static iree_hal_executable_plugin_status_t plugin_load(
    const iree_hal_executable_plugin_environment_v0_t* environment,
    size_t param_count, const iree_hal_executable_plugin_string_pair_t* params,
    void** out_self) {
  (void)environment, (void)param_count, (void)params;
  *out_self = NULL;
  return plugin_status(IREE_HAL_EXECUTABLE_PLUGIN_STATUS_OK);
}

static void plugin_unload(void* self) { (void)self; }

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
    size_t j = 0;
    while (j < sizeof(kImports) / sizeof(kImports[0]) &&
           !same(kImports[j].name, name))
      ++j;
    if (j < sizeof(kImports) / sizeof(kImports[0])) {
      params->out_fn_ptrs[i] = kImports[j].fn;
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
    .name = "buggy",
    .description = "tests/plugins/buggy_plugin.c",
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
