// Program: argmax over the last dimension (first index of the maximum).
// Public function: @argmax(%x: tensor<9x41xf32>) -> tensor<9xi32>
// Computes x.argmax(axis=-1) as i32 with one reduction that carries the
// running maximum and its index.
func.func @argmax(%x: tensor<9x41xf32>) -> tensor<9xi32> {
  %ninf = arith.constant 0xFF800000 : f32
  %c0 = arith.constant 0 : i32
  %ev = tensor.empty() : tensor<9xf32>
  %ei = tensor.empty() : tensor<9xi32>
  %iv = linalg.fill ins(%ninf : f32) outs(%ev : tensor<9xf32>) -> tensor<9xf32>
  %ii = linalg.fill ins(%c0 : i32) outs(%ei : tensor<9xi32>) -> tensor<9xi32>
  %r:2 = linalg.generic {
      indexing_maps = [affine_map<(d0, d1) -> (d0, d1)>, affine_map<(d0, d1) -> (d0)>,
                       affine_map<(d0, d1) -> (d0)>],
      iterator_types = ["parallel", "reduction"]}
      ins(%x : tensor<9x41xf32>) outs(%iv, %ii : tensor<9xf32>, tensor<9xi32>) {
  ^bb0(%v: f32, %best: f32, %bi: i32):
    %j = linalg.index 1 : index
    %ji = arith.index_cast %j : index to i32
    %gt = arith.cmpf ogt, %v, %best : f32
    %nb = arith.select %gt, %v, %best : f32
    %ni = arith.select %gt, %ji, %bi : i32
    linalg.yield %nb, %ni : f32, i32
  } -> (tensor<9xf32>, tensor<9xi32>)
  return %r#1 : tensor<9xi32>
}
