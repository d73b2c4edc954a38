// Sample kernel "matmul" for the hal-cpu demo (built by build_samples.py).
// Public function: @matmul(%lhs: tensor<13x17xf32>, %rhs: tensor<17x11xf32>) -> tensor<13x11xf32>
// Computes lhs @ rhs (odd sizes, not multiples of any tile) on a zero-filled
// init; a single dispatch with bindings (lhs, rhs, result).
func.func @matmul(%lhs: tensor<13x17xf32>, %rhs: tensor<17x11xf32>) -> tensor<13x11xf32> {
  %zero = arith.constant 0.0 : f32
  %empty = tensor.empty() : tensor<13x11xf32>
  %init = linalg.fill ins(%zero : f32) outs(%empty : tensor<13x11xf32>) -> tensor<13x11xf32>
  %r = linalg.matmul ins(%lhs, %rhs : tensor<13x17xf32>, tensor<17x11xf32>)
                     outs(%init : tensor<13x11xf32>) -> tensor<13x11xf32>
  return %r : tensor<13x11xf32>
}
