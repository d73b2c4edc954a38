// Program: 3-D transpose.
// Public function: @transpose(%x: tensor<6x7x5xf32>) -> tensor<5x6x7xf32>
// Computes x.transpose(2, 0, 1) via linalg.transpose.
func.func @transpose(%x: tensor<6x7x5xf32>) -> tensor<5x6x7xf32> {
  %empty = tensor.empty() : tensor<5x6x7xf32>
  %r = linalg.transpose ins(%x : tensor<6x7x5xf32>) outs(%empty : tensor<5x6x7xf32>) permutation = [2, 0, 1]
  return %r : tensor<5x6x7xf32>
}
