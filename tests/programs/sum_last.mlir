// Program: reduction (sum over the last dimension).
// Public function: @sum_last(%x: tensor<33x257xf32>) -> tensor<33xf32>
// Computes x.sum(axis=-1).
func.func @sum_last(%x: tensor<33x257xf32>) -> tensor<33xf32> {
  %zero = arith.constant 0.0 : f32
  %empty = tensor.empty() : tensor<33xf32>
  %init = linalg.fill ins(%zero : f32) outs(%empty : tensor<33xf32>) -> tensor<33xf32>
  %r = linalg.generic {
      indexing_maps = [affine_map<(d0, d1) -> (d0, d1)>, affine_map<(d0, d1) -> (d0)>],
      iterator_types = ["parallel", "reduction"]}
      ins(%x : tensor<33x257xf32>) outs(%init : tensor<33xf32>) {
  ^bb0(%in: f32, %acc: f32):
    %s = arith.addf %in, %acc : f32
    linalg.yield %s : f32
  } -> tensor<33xf32>
  return %r : tensor<33xf32>
}
