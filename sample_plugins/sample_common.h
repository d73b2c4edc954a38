/*
 * Pieces shared by the sample plugins: the tile each workgroup handles, the
 * params layout of the *_mul_workgroup imports, and import resolution from a
 * table of exports. libc-free, so the standalone plugin can use it.
 */
#ifndef SAMPLE_PLUGINS_SAMPLE_COMMON_H_
#define SAMPLE_PLUGINS_SAMPLE_COMMON_H_

#include "plugin_abi.h"

/* Elements handled by one workgroup (the MLIR samples use ceildiv 64). */
#define TILE_SIZE 64

/*
 * simple_mul_workgroup, as laid out by the compiler for
 *   func.func private @simple_mul_workgroup(memref<f32>, index, memref<f32>,
 *       index, memref<f32>, index, index, index)
 *       attributes {hal.import.fields = ["processor_id", "processor_data"],
 *                   llvm.bareptr = true}
 * i.e. the call operands in order (bare memrefs become plain pointers, index
 * becomes a pointer-sized integer) followed by the requested extra fields.
 */
typedef struct {
  const float* binding0;
  size_t binding0_offset;
  const float* binding1;
  size_t binding1_offset;
  float* binding2;
  size_t binding2_offset;
  size_t dim;
  size_t tid;
  uint32_t processor_id;
  const uint64_t* processor_data;
} mul_params_t;


/* Computes the [begin, end) element range of workgroup `tid`. */
static inline int tile_range(size_t dim, size_t tid, size_t* begin,
                             size_t* end) {
  size_t first = tid * TILE_SIZE;
  if (first >= dim) return 0;
  size_t last = dim - first > TILE_SIZE ? first + TILE_SIZE : dim;
  *begin = first;
  *end = last;
  return 1;
}

/* One import a plugin can resolve. */
typedef struct {
  const char* name;
  plugin_import_fn_t fn;
  int wants_instance; /* pass the instance as the import context */
} export_entry_t;

static inline int cstr_equal(const char* a, const char* b) {
  while (*a && *a == *b) {
    ++a;
    ++b;
  }
  return *a == *b;
}

/*
 * The resolve entry point over a table of exports: entries another provider
 * already filled are skipped; a leading '?' marks an optional import, which
 * sets MISSING_OPTIONAL when absent; a missing required one gives NOT_FOUND.
 */
static inline iree_hal_executable_plugin_status_t resolve_from_table(
    const export_entry_t* exports, size_t export_count, void* self,
    const iree_hal_executable_plugin_resolve_params_v0_t* params,
    iree_hal_executable_plugin_resolution_t* out_resolution) {
  iree_hal_executable_plugin_resolution_t resolution = 0;
  int missing_required = 0;
  for (size_t i = 0; i < params->count; ++i) {
    if (params->out_fn_ptrs[i]) continue; /* another provider got it */
    const char* name = params->symbol_names[i];
    int optional = name[0] == '?';
    if (optional) ++name;
    const export_entry_t* found = NULL;
    for (size_t j = 0; j < export_count; ++j) {
      if (cstr_equal(name, exports[j].name)) {
        found = &exports[j];
        break;
      }
    }
    if (found) {
      params->out_fn_ptrs[i] = (void*)found->fn;
      params->out_fn_contexts[i] = found->wants_instance ? self : NULL;
    } else if (optional) {
      resolution |= IREE_HAL_EXECUTABLE_PLUGIN_RESOLUTION_MISSING_OPTIONAL;
    } else {
      missing_required = 1;
    }
  }
  *out_resolution = resolution;
  return plugin_status(missing_required
                           ? IREE_HAL_EXECUTABLE_PLUGIN_STATUS_NOT_FOUND
                           : IREE_HAL_EXECUTABLE_PLUGIN_STATUS_OK);
}

#endif  /* SAMPLE_PLUGINS_SAMPLE_COMMON_H_ */
