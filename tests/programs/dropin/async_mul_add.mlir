// An asynchronous function, as --iree-execution-model=async-external
// compiles it: @mul_add takes two tensors, then a wait fence and a signal
// fence (the calling convention says "0rrrr_r"); a tool calling it makes
// the wait fence (already reached) and the signal fence and waits on the
// latter, as iree-run-module does.
//
//   iree-compile async_mul_add.mlir --iree-execution-model=async-external \
//     --iree-hal-target-device=local \
//     --iree-hal-local-target-device-backends=llvm-cpu -o - |
//   hal-cpu run-module --module=- --function=mul_add \
//     --input=4xf32=1,2,3,4 --input=4xf32=2
//   -> 4xf32=4 6 8 10
func.func @mul_add(%a: tensor<4xf32>, %b: tensor<4xf32>) -> tensor<4xf32> {
  %0 = arith.mulf %a, %b : tensor<4xf32>
  %1 = arith.addf %0, %b : tensor<4xf32>
  return %1 : tensor<4xf32>
}

// CHECK: EXEC @mul_add
// CHECK-NEXT: result[0]: hal.buffer_view
// CHECK-NEXT: 4xf32=4 6 8 10
