/* vector_plugin.c - imports written for the compiler's auto-vectorizer.
 *
 * Built for the vector CPU profiles (x86-64-v3 and Haswell: AVX2+FMA; sve:
 * SVE at any vector length; rv64gcv and rv32imf+zve32f: RVV at any VLEN;
 * armv7-a+neon+vfp4: NEON), the loops below become vector code: fused
 * multiply-adds, predicated or strip-mined tails, widening integer dot
 * products. Results do not depend on the vector length: saxpy rounds once
 * per element (the multiply-add is contracted to an fma), the dot product
 * is integer.
 *
 *   vector_saxpy(params): out[i] = a * x[i] + y[i]          for i < n
 *   vector_dot_i8(params): *out = sum(int32(x[i]) * int32(y[i]))
 */
#include "plugin_abi.h"

typedef struct {
  const float* x;  /* ptr */
  const float* y;  /* ptr */
  float* out;      /* ptr */
  size_t n;        /* size */
  float a;         /* f32 */
} saxpy_params_t;

typedef struct {
  const signed char* x;  /* ptr */
  const signed char* y;  /* ptr */
  int* out;              /* ptr */
  size_t n;              /* size */
} dot_params_t;

static int vector_saxpy(void* params, void* context, void* reserved) {
  (void)context, (void)reserved;
  const saxpy_params_t* p = (const saxpy_params_t*)params;
  const float* restrict x = p->x;
  const float* restrict y = p->y;
  float* restrict out = p->out;
  const float a = p->a;
  for (size_t i = 0; i < p->n; ++i) out[i] = a * x[i] + y[i]; /* contracted to fma */
  return 0;
}

static int vector_dot_i8(void* params, void* context, void* reserved) {
  (void)context, (void)reserved;
  const dot_params_t* p = (const dot_params_t*)params;
  const signed char* restrict x = p->x;
  const signed char* restrict y = p->y;
  int sum = 0;
  for (size_t i = 0; i < p->n; ++i) sum += (int)x[i] * (int)y[i];
  *p->out = sum;
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

static int same(const char* a, const char* b) {
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
    void* fn = same(name + optional, "vector_saxpy")    ? (void*)vector_saxpy
               : same(name + optional, "vector_dot_i8") ? (void*)vector_dot_i8
                                                        : 0;
    if (fn) {
      params->out_fn_ptrs[i] = fn;
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
    .name = "vector",
    .description = "auto-vectorized saxpy and int8 dot product",
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
