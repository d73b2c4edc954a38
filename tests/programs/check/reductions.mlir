func.func @sum_rows() {
  %a = util.unfoldable_constant dense<[[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]> : tensor<2x3xf32>
  %z = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<2xf32>
  %init = linalg.fill ins(%z : f32) outs(%e : tensor<2xf32>) -> tensor<2xf32>
  %r = linalg.generic {indexing_maps = [affine_map<(i, j) -> (i, j)>, affine_map<(i, j) -> (i)>],
                       iterator_types = ["parallel", "reduction"]}
      ins(%a : tensor<2x3xf32>) outs(%init : tensor<2xf32>) {
  ^bb0(%x: f32, %acc: f32):
    %s = arith.addf %x, %acc : f32
    linalg.yield %s : f32
  } -> tensor<2xf32>
  check.expect_almost_eq_const(%r, dense<[6.0, 15.0]> : tensor<2xf32>) : tensor<2xf32>
  return
}

func.func @max_i32() {
  %a = util.unfoldable_constant dense<[3, -9, 12, 4, 0]> : tensor<5xi32>
  %m = arith.constant -2147483648 : i32
  %e = tensor.empty() : tensor<i32>
  %init = linalg.fill ins(%m : i32) outs(%e : tensor<i32>) -> tensor<i32>
  %r = linalg.reduce ins(%a : tensor<5xi32>) outs(%init : tensor<i32>) dimensions = [0]
    (%x: i32, %acc: i32) {
      %y = arith.maxsi %x, %acc : i32
      linalg.yield %y : i32
    }
  check.expect_eq_const(%r, dense<12> : tensor<i32>) : tensor<i32>
  return
}
