// Sample kernel "sum_last" for the hal-cpu demo (built by build_samples.py).
// Public function: @sum_last(%x: tensor<9x129xf32>) -> tensor<9xf32>
// Computes x.sum(axis=-1); a single dispatch with bindings (x, result).
func.func @sum_last(%x: tensor<9x129xf32>) -> tensor<9xf32> {
  %zero = arith.constant 0.0 : f32
  %empty = tensor.empty() : tensor<9xf32>
  %init = linalg.fill ins(%zero : f32) outs(%empty : tensor<9xf32>) -> tensor<9xf32>
  %r = linalg.generic {
      indexing_maps = [affine_map<(d0, d1) -> (d0, d1)>, affine_map<(d0, d1) -> (d0)>],
      iterator_types = ["parallel", "reduction"]}
      ins(%x : tensor<9x129xf32>) outs(%init : tensor<9xf32>) {
  ^bb0(%in: f32, %acc: f32):
    %s = arith.addf %in, %acc : f32
    linalg.yield %s : f32
  } -> tensor<9xf32>
  return %r : tensor<9xf32>
}
