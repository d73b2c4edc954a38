/*
 * iree_header_plugin.c - a standalone plugin written the way IREE's sample
 * plugins are: against "iree/hal/local/executable_plugin.h" alone (IREE's
 * header path, declared by hal_cpu), using only what that header offers:
 * its allocator helpers, string pairs, statuses, optional imports and strcmp.
 *
 * It provides `simple_mul_workgroup`, the import of
 * sample_plugins/standalone_example.mlir, computing
 *   out[i] = lhs[i] * rhs[i] * scale
 * with `scale` a small integer load parameter (`?scale=N`, default 1), kept
 * in state the plugin allocates through the host allocator.  Loading with
 * `fail=1` returns INVALID_ARGUMENT (a status built with the header's
 * macros).  The layout checks below are compile-time facts of the ABI.
 */
#include "iree/hal/local/executable_plugin.h"

#if UINTPTR_MAX == 0xFFFFFFFFFFFFFFFFu
_Static_assert(sizeof(iree_hal_executable_plugin_header_t) == 96,
               "header layout (LP64)");
_Static_assert(offsetof(iree_hal_executable_plugin_header_t, reserved) == 32,
               "header.reserved offset (LP64)");
_Static_assert(sizeof(iree_hal_executable_plugin_string_pair_t) == 32,
               "string pair layout (LP64)");
_Static_assert(sizeof(iree_hal_executable_plugin_v0_t) == 32,
               "v0 interface layout (LP64)");
#endif
_Static_assert(sizeof(iree_hal_executable_plugin_sanitizer_kind_t) == 4,
               "sanitizer kind is 32 bits");
_Static_assert(IREE_HAL_EXECUTABLE_PLUGIN_STATUS_UNAUTHENTICATED == 16,
               "status codes are iree_status_code_t's");

typedef struct {
  iree_hal_executable_plugin_allocator_t host_allocator;
  float scale;
} header_plugin_t;

static int simple_mul_workgroup(void* params_ptr, void* context,
                                void* reserved) {
  (void)reserved;
  const header_plugin_t* plugin = (const header_plugin_t*)context;
  typedef struct {
    const float* restrict binding0;
    size_t binding0_offset;
    const float* restrict binding1;
    size_t binding1_offset;
    float* restrict binding2;
    size_t binding2_offset;
    size_t size;
    size_t tid;
    uint32_t processor_id;
    const uint64_t* restrict processor_data;
  } params_t;
  const params_t* params = (const params_t*)params_ptr;
  size_t begin = params->tid * 64;
  size_t end = begin + 64 < params->size ? begin + 64 : params->size;
  for (size_t i = begin; i < end; ++i) {
    params->binding2[params->binding2_offset + i] =
        params->binding0[params->binding0_offset + i] *
        params->binding1[params->binding1_offset + i] * plugin->scale;
  }
  return 0;
}

static bool view_equals(iree_hal_executable_plugin_string_view_t view,
                        const char* text) {
  size_t i = 0;
  for (; i < view.size; ++i) {
    if (text[i] == '\0' || text[i] != view.data[i]) return false;
  }
  return text[i] == '\0';
}

static iree_hal_executable_plugin_status_t header_plugin_load(
    const iree_hal_executable_plugin_environment_v0_t* environment,
    size_t param_count, const iree_hal_executable_plugin_string_pair_t* params,
    void** out_self) {
  *out_self = NULL;
  float scale = 1.0f;
  for (size_t i = 0; i < param_count; ++i) {
    /* `key`/`value` and `first`/`second` name the same views */
    if (view_equals(params[i].first, "fail")) {
      return iree_hal_executable_plugin_status_from_code(
          IREE_HAL_EXECUTABLE_PLUGIN_STATUS_INVALID_ARGUMENT);
    }
    if (!view_equals(params[i].key, "scale")) continue;
    int value = 0;
    for (size_t j = 0; j < params[i].value.size; ++j) {
      char c = params[i].second.data[j];
      if (c < '0' || c > '9' || value > 1000000) {
        return iree_hal_executable_plugin_status_from_code(
            IREE_HAL_EXECUTABLE_PLUGIN_STATUS_INVALID_ARGUMENT);
      }
      value = value * 10 + (c - '0');
    }
    scale = (float)value;
  }
  header_plugin_t* plugin = NULL;
  iree_hal_executable_plugin_status_t status =
      iree_hal_executable_plugin_allocator_malloc(
          environment->host_allocator, sizeof(*plugin), (void**)&plugin);
  if (!iree_hal_executable_plugin_status_is_ok(status)) return status;
  plugin->host_allocator = environment->host_allocator;
  plugin->scale = scale;
  *out_self = plugin;
  return iree_hal_executable_plugin_ok_status();
}

static void header_plugin_unload(void* self) {
  header_plugin_t* plugin = (header_plugin_t*)self;
  if (plugin) {
    iree_hal_executable_plugin_allocator_free(plugin->host_allocator, plugin);
  }
}

static iree_hal_executable_plugin_status_t header_plugin_resolve(
    void* self, const iree_hal_executable_plugin_resolve_params_v0_t* params,
    iree_hal_executable_plugin_resolution_t* out_resolution) {
  *out_resolution = 0;
  bool missing_required = false;
  for (size_t i = 0; i < params->count; ++i) {
    if (params->out_fn_ptrs[i]) continue;
    const char* name = params->symbol_names[i];
    bool optional = iree_hal_executable_plugin_import_is_optional(name);
    if (optional) ++name;
    if (iree_hal_executable_plugin_strcmp(name, "simple_mul_workgroup") == 0) {
      params->out_fn_ptrs[i] = (void*)simple_mul_workgroup;
      params->out_fn_contexts[i] = self;
    } else if (optional) {
      *out_resolution |= IREE_HAL_EXECUTABLE_PLUGIN_RESOLUTION_MISSING_OPTIONAL;
    } else {
      missing_required = true;
    }
  }
  return missing_required
             ? iree_hal_executable_plugin_status_from_code(
                   IREE_HAL_EXECUTABLE_PLUGIN_STATUS_NOT_FOUND)
             : iree_hal_executable_plugin_ok_status();
}

IREE_HAL_EXECUTABLE_PLUGIN_EXPORT const iree_hal_executable_plugin_header_t**
iree_hal_executable_plugin_query(
    iree_hal_executable_plugin_version_t max_version, void* reserved) {
  (void)reserved;
  static const iree_hal_executable_plugin_header_t header = {
      .version = IREE_HAL_EXECUTABLE_PLUGIN_VERSION_LATEST,
      .name = "iree_header_plugin",
      .description = "a plugin built against iree/hal/local/executable_plugin.h",
      .features = IREE_HAL_EXECUTABLE_PLUGIN_FEATURE_STANDALONE,
      .sanitizer = IREE_HAL_EXECUTABLE_PLUGIN_SANITIZER_KIND,
  };
  static const iree_hal_executable_plugin_v0_t plugin = {
      .header = &header,
      .load = header_plugin_load,
      .unload = header_plugin_unload,
      .resolve = header_plugin_resolve,
  };
  return max_version <= IREE_HAL_EXECUTABLE_PLUGIN_VERSION_LATEST
             ? (const iree_hal_executable_plugin_header_t**)&plugin
             : NULL;
}
