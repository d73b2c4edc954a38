/*
 * standalone_plugin.c - a libc-free IREE HAL executable plugin (ABI 0x1).
 *
 * Built with -ffreestanding and linked -nostdlib into a position independent
 * ET_DYN with no undefined symbols and no DT_NEEDED, so that one object per
 * architecture can be loaded by an embedded ELF loader on any OS (or none).
 * The only host facility used is the allocator handed to load().
 *
 * Imports resolved (names are what executables ask for; a leading `?` marks
 * an optional import):
 *
 *   simple_mul_workgroup   out = lhs * rhs         (stateless, context NULL)
 *                          PLUGIN_VARIANT=2 build: out = lhs * rhs + 1000
 *   param_add_workgroup    out = in + bias         (context = instance)
 *   param_scale_workgroup  out = in * scale        (context = instance)
 *
 * Every import processes the 64-element tile [tid*64, min(dim, tid*64+64))
 * of workgroup `tid`; binding offsets are in elements.
 *
 * Load parameters (key=value pairs, value parsed as a decimal float):
 *   bias   default 0    used by param_add_workgroup
 *   scale  default 1    used by param_scale_workgroup
 * Unknown keys are ignored; a malformed value fails load() with
 * INVALID_ARGUMENT.  The per-instance state holding the parsed values is
 * allocated from environment->host_allocator in load() and returned to it in
 * unload().
 *
 * Rules kept so the object links without a runtime: only single-precision
 * float arithmetic (no double helpers on riscv32/arm), no 64-bit integer
 * division, no struct copies or zero-fills the compiler could turn into
 * memcpy/memset calls, and no writable globals.
 */
#include "sample_common.h"

#ifndef PLUGIN_VARIANT
#define PLUGIN_VARIANT 1
#endif

/* ------------------------------------------------------------------------ */
/* Import parameter structs                                                  */
/* ------------------------------------------------------------------------ */


/*
 * param_add_workgroup / param_scale_workgroup:
 *   (memref<f32>, index, memref<f32>, index, index, index), llvm.bareptr,
 *   no extra fields.
 */
typedef struct {
  const float* binding0;
  size_t binding0_offset;
  float* binding1;
  size_t binding1_offset;
  size_t dim;
  size_t tid;
} unary_params_t;

/* Per-load state. */
typedef struct {
  iree_hal_executable_plugin_allocator_t allocator;
  float bias;
  float scale;
} instance_t;

/* ------------------------------------------------------------------------ */
/* Imports                                                                   */
/* ------------------------------------------------------------------------ */

static int simple_mul_workgroup(void* params_ptr, void* context,
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
#if PLUGIN_VARIANT == 2
    out[i] = lhs[i] * rhs[i] + 1000.0f;
#else
    out[i] = lhs[i] * rhs[i];
#endif
  }
  return 0;
}

static int param_add_workgroup(void* params_ptr, void* context,
                               void* reserved) {
  (void)reserved;
  const unary_params_t* p = (const unary_params_t*)params_ptr;
  const instance_t* instance = (const instance_t*)context;
  float bias = instance ? instance->bias : 0.0f;
  size_t begin, end;
  if (!tile_range(p->dim, p->tid, &begin, &end)) return 0;
  const float* in = p->binding0 + p->binding0_offset;
  float* out = p->binding1 + p->binding1_offset;
  for (size_t i = begin; i < end; ++i) out[i] = in[i] + bias;
  return 0;
}

static int param_scale_workgroup(void* params_ptr, void* context,
                                 void* reserved) {
  (void)reserved;
  const unary_params_t* p = (const unary_params_t*)params_ptr;
  const instance_t* instance = (const instance_t*)context;
  float scale = instance ? instance->scale : 1.0f;
  size_t begin, end;
  if (!tile_range(p->dim, p->tid, &begin, &end)) return 0;
  const float* in = p->binding0 + p->binding0_offset;
  float* out = p->binding1 + p->binding1_offset;
  for (size_t i = begin; i < end; ++i) out[i] = in[i] * scale;
  return 0;
}

/* What this plugin can resolve. */
static const export_entry_t kExports[] = {
    {"param_add_workgroup", param_add_workgroup, 1},
    {"param_scale_workgroup", param_scale_workgroup, 1},
    {"simple_mul_workgroup", simple_mul_workgroup, 0},
};
#define EXPORT_COUNT (sizeof(kExports) / sizeof(kExports[0]))

/* ------------------------------------------------------------------------ */
/* Small libc-free helpers                                                   */
/* ------------------------------------------------------------------------ */

/* Compares a sized (non NUL terminated) string with a C string. */
static int view_equals(iree_hal_executable_plugin_string_view_t view,
                       const char* text) {
  size_t i = 0;
  for (; i < view.size; ++i) {
    if (text[i] == '\0' || text[i] != view.data[i]) return 0;
  }
  return text[i] == '\0';
}

static int is_digit(char c) { return c >= '0' && c <= '9'; }

/*
 * Parses [+-]digits[.digits][(e|E)[+-]digits] (at least one mantissa digit,
 * whole string consumed) into a float using float arithmetic only.
 */
static int parse_float(const char* s, size_t n, float* out_value) {
  size_t i = 0;
  int negative = 0;
  if (i < n && (s[i] == '+' || s[i] == '-')) {
    negative = s[i] == '-';
    ++i;
  }
  float mantissa = 0.0f;
  int digits = 0;
  int exponent = 0;
  for (; i < n && is_digit(s[i]); ++i, ++digits) {
    mantissa = mantissa * 10.0f + (float)(int)(s[i] - '0');
  }
  if (i < n && s[i] == '.') {
    for (++i; i < n && is_digit(s[i]); ++i, ++digits) {
      mantissa = mantissa * 10.0f + (float)(int)(s[i] - '0');
      --exponent;
    }
  }
  if (digits == 0) return 0;
  if (i < n && (s[i] == 'e' || s[i] == 'E')) {
    ++i;
    int exp_negative = 0;
    if (i < n && (s[i] == '+' || s[i] == '-')) {
      exp_negative = s[i] == '-';
      ++i;
    }
    int exp_digits = 0;
    int exp_value = 0;
    for (; i < n && is_digit(s[i]); ++i, ++exp_digits) {
      if (exp_value < 1000) exp_value = exp_value * 10 + (s[i] - '0');
    }
    if (exp_digits == 0) return 0;
    exponent += exp_negative ? -exp_value : exp_value;
  }
  if (i != n) return 0;
  /* Scale by 10^|exponent| in one multiply/divide where possible. */
  int magnitude = exponent < 0 ? -exponent : exponent;
  float value = mantissa;
  while (magnitude > 0 && value != 0.0f) {
    int step = magnitude > 30 ? 30 : magnitude;
    float power = 1.0f;
    for (int k = 0; k < step; ++k) power *= 10.0f;
    value = exponent < 0 ? value / power : value * power;
    magnitude -= step;
  }
  *out_value = negative ? -value : value;
  return 1;
}

/* ------------------------------------------------------------------------ */
/* Plugin interface                                                          */
/* ------------------------------------------------------------------------ */

static iree_hal_executable_plugin_status_t plugin_load(
    const iree_hal_executable_plugin_environment_v0_t* environment,
    size_t param_count, const iree_hal_executable_plugin_string_pair_t* params,
    void** out_self) {
  *out_self = NULL;

  /* Parse first so nothing has to be released on a bad parameter. */
  float bias = 0.0f;
  float scale = 1.0f;
  for (size_t i = 0; i < param_count; ++i) {
    float* target = NULL;
    if (view_equals(params[i].key, "bias")) {
      target = &bias;
    } else if (view_equals(params[i].key, "scale")) {
      target = &scale;
    } else {
      continue; /* not ours */
    }
    if (!parse_float(params[i].value.data, params[i].value.size, target)) {
      return plugin_status(IREE_HAL_EXECUTABLE_PLUGIN_STATUS_INVALID_ARGUMENT);
    }
  }

  iree_hal_executable_plugin_allocator_t allocator =
      environment->host_allocator;
  if (!allocator.ctl) {
    return plugin_status(IREE_HAL_EXECUTABLE_PLUGIN_STATUS_FAILED_PRECONDITION);
  }
  iree_hal_executable_plugin_allocator_alloc_params_t alloc_params;
  alloc_params.byte_length = sizeof(instance_t);
  void* memory = NULL;
  iree_hal_executable_plugin_status_t status =
      allocator.ctl(allocator.self, IREE_HAL_EXECUTABLE_PLUGIN_ALLOCATOR_COMMAND_MALLOC,
                    &alloc_params, &memory);
  if (plugin_status_code(status) != IREE_HAL_EXECUTABLE_PLUGIN_STATUS_OK) {
    return status;
  }
  if (!memory) {
    return plugin_status(IREE_HAL_EXECUTABLE_PLUGIN_STATUS_RESOURCE_EXHAUSTED);
  }
  instance_t* instance = (instance_t*)memory;
  instance->allocator.self = allocator.self;
  instance->allocator.ctl = allocator.ctl;
  instance->bias = bias;
  instance->scale = scale;
  *out_self = instance;
  return plugin_status(IREE_HAL_EXECUTABLE_PLUGIN_STATUS_OK);
}

static void plugin_unload(void* self) {
  instance_t* instance = (instance_t*)self;
  if (!instance) return;
  void* self_ptr = instance->allocator.self;
  iree_hal_executable_plugin_allocator_ctl_fn_t ctl = instance->allocator.ctl;
  void* memory = instance;
  ctl(self_ptr, IREE_HAL_EXECUTABLE_PLUGIN_ALLOCATOR_COMMAND_FREE, NULL,
      &memory);
}

static iree_hal_executable_plugin_status_t plugin_resolve(
    void* self, const iree_hal_executable_plugin_resolve_params_v0_t* params,
    iree_hal_executable_plugin_resolution_t* out_resolution) {
  return resolve_from_table(kExports, EXPORT_COUNT, self, params,
                            out_resolution);
}

#if PLUGIN_VARIANT == 2
#define PLUGIN_NAME "sample_standalone_alt"
#define PLUGIN_DESCRIPTION \
  "sample_plugins/standalone_plugin.c (variant 2: mul adds 1000)"
#else
#define PLUGIN_NAME "sample_standalone"
#define PLUGIN_DESCRIPTION "sample_plugins/standalone_plugin.c"
#endif

static const iree_hal_executable_plugin_header_t kHeader = {
    .version = IREE_HAL_EXECUTABLE_PLUGIN_VERSION_0_1,
    .name = PLUGIN_NAME,
    .description = PLUGIN_DESCRIPTION,
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
  /* We only implement 0x1; a host that cannot take it gets NULL. */
  if (max_version < IREE_HAL_EXECUTABLE_PLUGIN_VERSION_0_1) return NULL;
  return (const iree_hal_executable_plugin_header_t**)&kPlugin;
}
