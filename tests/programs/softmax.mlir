// Program: softmax over the last dimension.
// Public function: @softmax(%x: tensor<7x33xf32>) -> tensor<7x33xf32>
// Computes exp(x - max(x, axis=-1)) / sum(exp(x - max(x, axis=-1)), axis=-1)
// via linalg.softmax.
func.func @softmax(%x: tensor<7x33xf32>) -> tensor<7x33xf32> {
  %empty = tensor.empty() : tensor<7x33xf32>
  %r = linalg.softmax dimension(1) ins(%x : tensor<7x33xf32>) outs(%empty : tensor<7x33xf32>) -> tensor<7x33xf32>
  return %r : tensor<7x33xf32>
}
