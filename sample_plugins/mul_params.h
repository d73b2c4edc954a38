/*
 * Parameters shared by the sample plugins' *_mul_workgroup imports.
 */
#ifndef SAMPLE_PLUGINS_MUL_PARAMS_H_
#define SAMPLE_PLUGINS_MUL_PARAMS_H_

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

#endif  /* SAMPLE_PLUGINS_MUL_PARAMS_H_ */
