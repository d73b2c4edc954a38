// Row sums of a 131072x16 float32 matrix: x.sum(axis=-1).
// Public function: @rowsum(%x: tensor<131072x16xf32>) -> tensor<131072xf32>
// One dispatch with bindings (x, result); little work per row, many rows,
// so the natural workgroup grid is large (bench/grid_sweep.py).
func.func @rowsum(%x: tensor<131072x16xf32>) -> tensor<131072xf32> {
  %zero = arith.constant 0.0 : f32
  %empty = tensor.empty() : tensor<131072xf32>
  %init = linalg.fill ins(%zero : f32) outs(%empty : tensor<131072xf32>) -> tensor<131072xf32>
  %r = linalg.generic {
      indexing_maps = [affine_map<(d0, d1) -> (d0, d1)>, affine_map<(d0, d1) -> (d0)>],
      iterator_types = ["parallel", "reduction"]}
      ins(%x : tensor<131072x16xf32>) outs(%init : tensor<131072xf32>) {
  ^bb0(%in: f32, %acc: f32):
    %s = arith.addf %in, %acc : f32
    linalg.yield %s : f32
  } -> tensor<131072xf32>
  return %r : tensor<131072xf32>
}
