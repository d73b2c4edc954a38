// Program: gather rows of a table by index.
// Public function: @gather(%table: tensor<50x8xf32>, %idx: tensor<17xi32>) -> tensor<17x8xf32>
// Computes table[idx] (indices must lie in [0, 50)) with tensor.extract
// inside a linalg.generic.
func.func @gather(%table: tensor<50x8xf32>, %idx: tensor<17xi32>) -> tensor<17x8xf32> {
  %empty = tensor.empty() : tensor<17x8xf32>
  %r = linalg.generic {
      indexing_maps = [affine_map<(d0, d1) -> (d0)>, affine_map<(d0, d1) -> (d0, d1)>],
      iterator_types = ["parallel", "parallel"]}
      ins(%idx : tensor<17xi32>) outs(%empty : tensor<17x8xf32>) {
  ^bb0(%i: i32, %o: f32):
    %row = arith.index_cast %i : i32 to index
    %col = linalg.index 1 : index
    %v = tensor.extract %table[%row, %col] : tensor<50x8xf32>
    linalg.yield %v : f32
  } -> tensor<17x8xf32>
  return %r : tensor<17x8xf32>
}
