// Program: integer elementwise op.
// Public function: @add_i32(%a: tensor<513xi32>, %b: tensor<513xi32>) -> tensor<513xi32>
// Computes (a + b) * 3 - a elementwise with wrapping 32-bit integer arithmetic.
func.func @add_i32(%a: tensor<513xi32>, %b: tensor<513xi32>) -> tensor<513xi32> {
  %c3 = arith.constant 3 : i32
  %init = tensor.empty() : tensor<513xi32>
  %r = linalg.generic {
      indexing_maps = [affine_map<(d0) -> (d0)>, affine_map<(d0) -> (d0)>, affine_map<(d0) -> (d0)>],
      iterator_types = ["parallel"]}
      ins(%a, %b : tensor<513xi32>, tensor<513xi32>) outs(%init : tensor<513xi32>) {
  ^bb0(%x: i32, %y: i32, %o: i32):
    %s = arith.addi %x, %y : i32
    %m = arith.muli %s, %c3 : i32
    %d = arith.subi %m, %x : i32
    linalg.yield %d : i32
  } -> tensor<513xi32>
  return %r : tensor<513xi32>
}
