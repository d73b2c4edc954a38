// Expectations that fail: check-module reports each with IREE's message.
func.func @wrong_sum() {
  %a = util.unfoldable_constant dense<[1.0, 2.0]> : tensor<2xf32>
  %r = arith.addf %a, %a : tensor<2xf32>
  check.expect_almost_eq_const(%r, dense<[2.0, 4.5]> : tensor<2xf32>) : tensor<2xf32>
  return
}

func.func @right_sum() {
  %a = util.unfoldable_constant dense<[1.0, 2.0]> : tensor<2xf32>
  %r = arith.addf %a, %a : tensor<2xf32>
  check.expect_almost_eq_const(%r, dense<[2.0, 4.0]> : tensor<2xf32>) : tensor<2xf32>
  return
}

func.func @wrong_ints() {
  %a = util.unfoldable_constant dense<[1, 2, 3]> : tensor<3xi32>
  %r = arith.muli %a, %a : tensor<3xi32>
  check.expect_eq_const(%r, dense<[1, 4, 10]> : tensor<3xi32>) : tensor<3xi32>
  %z = util.unfoldable_constant 0 : i32
  check.expect_true(%z) : i32
  return
}
