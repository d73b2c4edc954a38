// Program: dynamically shaped elementwise op with a scalar argument.
// Public function: @scale_dyn(%x: tensor<?xf32>, %s: f32) -> tensor<?xf32>
// Computes x * s + x. The dispatch receives push constants carrying the
// bits of %s and the dynamic dimension of %x.
func.func @scale_dyn(%x: tensor<?xf32>, %s: f32) -> tensor<?xf32> {
  %c0 = arith.constant 0 : index
  %n = tensor.dim %x, %c0 : tensor<?xf32>
  %init = tensor.empty(%n) : tensor<?xf32>
  %r = linalg.generic {
      indexing_maps = [affine_map<(d0) -> (d0)>, affine_map<(d0) -> (d0)>],
      iterator_types = ["parallel"]}
      ins(%x : tensor<?xf32>) outs(%init : tensor<?xf32>) {
  ^bb0(%v: f32, %o: f32):
    %m = arith.mulf %v, %s : f32
    %a = arith.addf %m, %v : f32
    linalg.yield %a : f32
  } -> tensor<?xf32>
  return %r : tensor<?xf32>
}
