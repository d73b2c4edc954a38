// Program: integer ops on i8, i32 and i64 (wrapping arithmetic).
// Public function: @int_ops(%a: tensor<129xi32>, %b: tensor<129xi8>, %c: tensor<129xi64>)
//                      -> (tensor<129xi32>, tensor<129xi64>)
// Computes r0 = ((a >> 3) ^ (sext(b) * 7)) + max(a, -5) - (a rem 13) (32-bit,
// arithmetic shift, signed remainder) and r1 = c * sext(a) + unsigned(b)
// (64-bit).
func.func @int_ops(%a: tensor<129xi32>, %b: tensor<129xi8>, %c: tensor<129xi64>) -> (tensor<129xi32>, tensor<129xi64>) {
  %c3 = arith.constant 3 : i32
  %c7 = arith.constant 7 : i32
  %cm5 = arith.constant -5 : i32
  %c13 = arith.constant 13 : i32
  %e0 = tensor.empty() : tensor<129xi32>
  %e1 = tensor.empty() : tensor<129xi64>
  %r:2 = linalg.generic {
      indexing_maps = [affine_map<(d0) -> (d0)>, affine_map<(d0) -> (d0)>, affine_map<(d0) -> (d0)>,
                       affine_map<(d0) -> (d0)>, affine_map<(d0) -> (d0)>],
      iterator_types = ["parallel"]}
      ins(%a, %b, %c : tensor<129xi32>, tensor<129xi8>, tensor<129xi64>)
      outs(%e0, %e1 : tensor<129xi32>, tensor<129xi64>) {
  ^bb0(%x: i32, %y: i8, %z: i64, %o0: i32, %o1: i64):
    %sh = arith.shrsi %x, %c3 : i32
    %ys = arith.extsi %y : i8 to i32
    %y7 = arith.muli %ys, %c7 : i32
    %xo = arith.xori %sh, %y7 : i32
    %mx = arith.maxsi %x, %cm5 : i32
    %rm = arith.remsi %x, %c13 : i32
    %s1 = arith.addi %xo, %mx : i32
    %r0 = arith.subi %s1, %rm : i32
    %x64 = arith.extsi %x : i32 to i64
    %yu = arith.extui %y : i8 to i64
    %p = arith.muli %z, %x64 : i64
    %r1 = arith.addi %p, %yu : i64
    linalg.yield %r0, %r1 : i32, i64
  } -> (tensor<129xi32>, tensor<129xi64>)
  return %r#0, %r#1 : tensor<129xi32>, tensor<129xi64>
}
