// Program: elementwise multiply-add.
// Public function: @mul_add(%a: tensor<10007xf32>, %b: tensor<10007xf32>) -> tensor<10007xf32>
// Computes a * b + a elementwise. 10007 elements is not a multiple of any
// tile size and spans several workgroups.
func.func @mul_add(%a: tensor<10007xf32>, %b: tensor<10007xf32>) -> tensor<10007xf32> {
  %init = tensor.empty() : tensor<10007xf32>
  %r = linalg.generic {
      indexing_maps = [affine_map<(d0) -> (d0)>, affine_map<(d0) -> (d0)>, affine_map<(d0) -> (d0)>],
      iterator_types = ["parallel"]}
      ins(%a, %b : tensor<10007xf32>, tensor<10007xf32>) outs(%init : tensor<10007xf32>) {
  ^bb0(%x: f32, %y: f32, %o: f32):
    %m = arith.mulf %x, %y : f32
    %s = arith.addf %m, %x : f32
    linalg.yield %s : f32
  } -> tensor<10007xf32>
  return %r : tensor<10007xf32>
}
