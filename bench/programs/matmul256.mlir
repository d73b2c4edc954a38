// 256x256x256 float32 matrix multiply on a zero-filled init.
// Public function: @matmul256(%lhs: tensor<256x256xf32>, %rhs: tensor<256x256xf32>) -> tensor<256x256xf32>
// (bench/iree_under_qemu.py).
func.func @matmul256(%lhs: tensor<256x256xf32>, %rhs: tensor<256x256xf32>) -> tensor<256x256xf32> {
  %zero = arith.constant 0.0 : f32
  %empty = tensor.empty() : tensor<256x256xf32>
  %init = linalg.fill ins(%zero : f32) outs(%empty : tensor<256x256xf32>) -> tensor<256x256xf32>
  %r = linalg.matmul ins(%lhs, %rhs : tensor<256x256xf32>, tensor<256x256xf32>)
                     outs(%init : tensor<256x256xf32>) -> tensor<256x256xf32>
  return %r : tensor<256x256xf32>
}
