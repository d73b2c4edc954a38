// 512x512x512 float32 matrix multiply on a zero-filled init.
// Public function: @matmul512(%lhs: tensor<512x512xf32>, %rhs: tensor<512x512xf32>) -> tensor<512x512xf32>
// (bench/matmul.py).
func.func @matmul512(%lhs: tensor<512x512xf32>, %rhs: tensor<512x512xf32>) -> tensor<512x512xf32> {
  %zero = arith.constant 0.0 : f32
  %empty = tensor.empty() : tensor<512x512xf32>
  %init = linalg.fill ins(%zero : f32) outs(%empty : tensor<512x512xf32>) -> tensor<512x512xf32>
  %r = linalg.matmul ins(%lhs, %rhs : tensor<512x512xf32>, tensor<512x512xf32>)
                     outs(%init : tensor<512x512xf32>) -> tensor<512x512xf32>
  return %r : tensor<512x512xf32>
}
