/*
 * vector_overread.c - a plugin whose loop reads whole vectors, so that it
 * reads past the end of its input whenever the element count is not a
 * multiple of the vector length: how far past depends on the vector
 * length the CPU runs at (SVE VL, RVV VLEN), known only at run time.
 *
 * Both imports take
 *   struct { const float* src; float* dst; size_t n; float scale; }
 * and store the sum of src[0..n) * scale in dst[0]:
 *   vector_sum_ok       predicated tail: reads exactly n elements
 *   vector_sum_overread whole vectors: reads src[0..roundup(n, lanes))
 * With SVE (aarch64, built for the sve profile) and RVV (riscv64, built for
 * rv64gcv) the lanes are the vector length's; elsewhere 4 lanes of scalar
 * code, whose multiply-adds become fused multiply-adds with a memory operand
 * (vfmadd231ss) when built for an x86 CPU with FMA.
 */
#include "plugin_abi.h"

#if defined(__ARM_FEATURE_SVE)
#include <arm_sve.h>
#elif defined(__riscv_vector)
#include <riscv_vector.h>
#endif

typedef struct {
  const float* src;
  float* dst;
  size_t n;
  float scale;
} sum_params_t;

__attribute__((noinline)) static float sum_ok(const float* src, size_t n,
                                              float scale) {
#if defined(__ARM_FEATURE_SVE)
  svfloat32_t acc = svdup_f32(0.0f);
  for (size_t i = 0; i < n; i += svcntw()) {
    svbool_t live = svwhilelt_b32_u64(i, n);
    acc = svadd_f32_m(live, acc, svld1_f32(live, src + i));
  }
  return svaddv_f32(svptrue_b32(), acc) * scale;
#elif defined(__riscv_vector)
  size_t lanes = __riscv_vsetvlmax_e32m1();
  vfloat32m1_t acc = __riscv_vfmv_v_f_f32m1(0.0f, lanes);
  for (size_t i = 0; i < n;) {
    size_t vl = __riscv_vsetvl_e32m1(n - i);
    acc = __riscv_vfadd_vv_f32m1_tu(acc, acc,
                                    __riscv_vle32_v_f32m1(src + i, vl), vl);
    i += vl;
  }
  vfloat32m1_t zero = __riscv_vfmv_v_f_f32m1(0.0f, lanes);
  return __riscv_vfmv_f_s_f32m1_f32(
             __riscv_vfredusum_vs_f32m1_f32m1(acc, zero, lanes)) * scale;
#else
  float total = 0.0f;
  for (size_t i = 0; i < n; ++i) total += src[i] * scale;
  return total;
#endif
}

__attribute__((noinline)) static float sum_overread(const float* src,
                                                   size_t n, float scale) {
#if defined(__ARM_FEATURE_SVE)
  svbool_t all = svptrue_b32();
  svfloat32_t acc = svdup_f32(0.0f);
  for (size_t i = 0; i < n; i += svcntw()) {
    svfloat32_t v = svld1_f32(all, src + i); /* the whole vector */
    acc = svadd_f32_x(all, acc, v);
  }
  return svaddv_f32(all, acc) * scale;
#elif defined(__riscv_vector)
  size_t lanes = __riscv_vsetvlmax_e32m1();
  vfloat32m1_t acc = __riscv_vfmv_v_f_f32m1(0.0f, lanes);
  for (size_t i = 0; i < n; i += lanes) {
    vfloat32m1_t v = __riscv_vle32_v_f32m1(src + i, lanes); /* the whole vector */
    acc = __riscv_vfadd_vv_f32m1(acc, v, lanes);
  }
  vfloat32m1_t zero = __riscv_vfmv_v_f_f32m1(0.0f, lanes);
  return __riscv_vfmv_f_s_f32m1_f32(
             __riscv_vfredusum_vs_f32m1_f32m1(acc, zero, lanes)) * scale;
#else
  float total = 0.0f;
  for (size_t i = 0; i < n; i += 4) { /* four at a time */
    total += src[i] * scale;
    total += src[i + 1] * scale;
    total += src[i + 2] * scale;
    total += src[i + 3] * scale;
  }
  return total;
#endif
}

static int vector_sum_ok(void* params, void* context, void* reserved) {
  (void)context, (void)reserved;
  const sum_params_t* p = (const sum_params_t*)params;
  p->dst[0] = sum_ok(p->src, p->n, p->scale);
  return 0;
}

static int vector_sum_overread(void* params, void* context, void* reserved) {
  (void)context, (void)reserved;
  const sum_params_t* p = (const sum_params_t*)params;
  p->dst[0] = sum_overread(p->src, p->n, p->scale);
  return 0;
}

typedef struct {
  const char* name;
  plugin_import_fn_t fn;
} entry_t;

static const entry_t kImports[] = {
    {"vector_sum_ok", vector_sum_ok},
    {"vector_sum_overread", vector_sum_overread},
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
    .name = "vector_overread",
    .description = "tests/plugins/vector_overread.c",
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
