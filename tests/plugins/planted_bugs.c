/*
 * planted_bugs.c - an IREE CPU executable library (the
 * iree_hal_executable_library_query ABI, version 0x6; layouts as in
 * hal_cpu/abi.py) whose one export has the bugs the workbench's sanitizer
 * finds, one per case (tests/test_sanitizer.py), and a vector-length-
 * agnostic loop for instruction counts (tests/test_instruction_counts.py).
 *
 * Export `planted`: 1 push constant (the case), 3 bindings of float32:
 *   binding 0 `in` (n_in elements), binding 1 `out` (n_out), binding 2
 *   `scratch` (n_out; the tests give it no contents).
 * Workgroup x handles elements [4x, 4x + 4) of out (grid ceil(n_out / 4)):
 *   0  correct:        out[i] = 2 * in[i]
 *   1  race:           also out[0] = x, in every workgroup
 *   2  order:          out[i] = 2 * in[i] + out[4x - 1] (the element the
 *                      previous workgroup writes)
 *   3  unwritten tail: the last 2 elements of out are never written
 *   4  uninitialized:  out[i] = in[i] + scratch[i]
 *   5  one past:       the last workgroup also reads in[n_in]
 *   6  long loop:      workgroup 0 computes out[i] = 2 * in[i] for every i
 *                      (a loop vectorizers make vector-length-agnostic)
 *   7  SVE contiguous: workgroup 0 copies one vector of in to out with
 *                      LD1W/ST1W (SVE builds; elsewhere as case 0), which
 *                      qemu 7.2's plugins cannot see
 */
#include <stddef.h>
#include <stdint.h>

#include "executable_library.h"

#define CONSTANT_COUNT 1
#define BINDING_COUNT 3

__attribute__((noinline)) static void scale(const float* in, float* out,
                                            size_t begin, size_t end) {
  for (size_t i = begin; i < end; ++i) out[i] = 2.0f * in[i];
}

__attribute__((noinline)) static void plant_race(float* out, uint32_t x) {
  out[0] = (float)x; /* RACE */
}

__attribute__((noinline)) static void plant_order(const float* in, float* out,
                                                  size_t begin, size_t end) {
  float before = begin ? out[begin - 1] : 0.0f; /* ORDER */
  for (size_t i = begin; i < end; ++i) out[i] = 2.0f * in[i] + before;
}

__attribute__((noinline)) static void plant_uninitialized(
    const float* in, const float* scratch, float* out, size_t begin,
    size_t end) {
  for (size_t i = begin; i < end; ++i) {
    out[i] = in[i] + scratch[i]; /* UNINITIALIZED */
  }
}

__attribute__((noinline)) static float plant_one_past(const float* in,
                                                      size_t n) {
  return in[n]; /* ONE_PAST */
}

static int planted(const environment_t* environment,
                   const dispatch_state_t* state,
                   const workgroup_state_t* workgroup_state) {
  (void)environment;
  if (state->constant_count < CONSTANT_COUNT ||
      state->binding_count < BINDING_COUNT) {
    return 22;
  }
  const float* in = (const float*)state->binding_ptrs[0];
  float* out = (float*)state->binding_ptrs[1];
  const float* scratch = (const float*)state->binding_ptrs[2];
  size_t n_in = state->binding_lengths[0] / sizeof(float);
  size_t n_out = state->binding_lengths[1] / sizeof(float);
  uint32_t x = workgroup_state->workgroup_id_x;
  size_t begin = 4 * (size_t)x, end = begin + 4;
  if (end > n_out) end = n_out;
  if (end > n_in) end = n_in;
  switch (state->constants[0]) {
    case 1:
      scale(in, out, begin, end);
      plant_race(out, x);
      break;
    case 2:
      plant_order(in, out, begin, end);
      break;
    case 3:
      if (end > n_out - 2) end = n_out - 2;
      if (begin < end) scale(in, out, begin, end);
      break;
    case 4:
      plant_uninitialized(in, scratch, out, begin, end);
      break;
    case 7:
#if defined(__ARM_FEATURE_SVE)
      if (x == 0 && n_in >= 64 && n_out >= 64) {
        __asm__ volatile("ptrue p0.s\n\tld1w {z0.s}, p0/z, [%0]\n\t"
                         "st1w {z0.s}, p0, [%1]"
                         : : "r"(in), "r"(out) : "memory", "z0", "p0");
      }
#else
      scale(in, out, begin, end);
#endif
      break;
    case 6:
      if (x == 0) scale(in, out, 0, n_out < n_in ? n_out : n_in);
      break;
    case 5:
      scale(in, out, begin, end);
      if (x + 1 == state->workgroup_count_x) out[begin] += plant_one_past(in, n_in);
      break;
    default:
      scale(in, out, begin, end);
      break;
  }
  return 0;
}

static const dispatch_fn_t kExportPtrs[1] = {planted};
static const char* const kExportNames[1] = {"planted"};
static const dispatch_attrs_t kExportAttrs[1] = {{
    .constant_count = CONSTANT_COUNT,
    .binding_count = BINDING_COUNT,
    .workgroup_size_x = 1,
    .workgroup_size_y = 1,
    .workgroup_size_z = 1,
}};

static const library_header_t kHeader = {
    .version = LIBRARY_VERSION_0_6,
    .name = "planted_bugs",
    .features = 0,
    .sanitizer = 0,
};

static const library_v0_t kLibrary = {
    .header = &kHeader,
    .imports = {.count = 0},
    .exports = {.count = 1, .ptrs = kExportPtrs, .attrs = kExportAttrs,
                .names = kExportNames},
    .constants = {.count = 0},
    .sources = {.count = 0},
};

__attribute__((visibility("default"))) const library_header_t**
iree_hal_executable_library_query(uint32_t max_version,
                                  const environment_t* environment) {
  (void)environment;
  if (max_version < LIBRARY_VERSION_0_6) return NULL;
  return (const library_header_t**)&kLibrary;
}
