// Program: matrix multiply with sizes that are not multiples of any tile size.
// Public function: @matmul(%lhs: tensor<37x53xf32>, %rhs: tensor<53x29xf32>) -> tensor<37x29xf32>
// Computes lhs @ rhs via linalg.matmul on a zero-filled init.
func.func @matmul(%lhs: tensor<37x53xf32>, %rhs: tensor<53x29xf32>) -> tensor<37x29xf32> {
  %zero = arith.constant 0.0 : f32
  %empty = tensor.empty() : tensor<37x29xf32>
  %init = linalg.fill ins(%zero : f32) outs(%empty : tensor<37x29xf32>) -> tensor<37x29xf32>
  %r = linalg.matmul ins(%lhs, %rhs : tensor<37x53xf32>, tensor<53x29xf32>)
                     outs(%init : tensor<37x29xf32>) -> tensor<37x29xf32>
  return %r : tensor<37x29xf32>
}
