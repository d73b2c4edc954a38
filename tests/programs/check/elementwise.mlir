// Elementwise ops in IREE's check-module style: each public function
// computes on constants and compares with check.expect_*.
func.func @add_f32() {
  %a = util.unfoldable_constant dense<[1.0, 2.0, 3.0, 4.0]> : tensor<4xf32>
  %b = util.unfoldable_constant dense<[0.5, -2.0, 8.0, 0.25]> : tensor<4xf32>
  %r = arith.addf %a, %b : tensor<4xf32>
  check.expect_almost_eq_const(%r, dense<[1.5, 0.0, 11.0, 4.25]> : tensor<4xf32>) : tensor<4xf32>
  return
}

func.func @exp_tanh() {
  %a = util.unfoldable_constant dense<[0.0, 1.0, -1.0, 0.5]> : tensor<4xf32>
  %e = math.exp %a : tensor<4xf32>
  %t = math.tanh %a : tensor<4xf32>
  check.expect_almost_eq_const(%e, dense<[1.0, 2.7182817, 0.36787945, 1.6487213]> : tensor<4xf32>, atol 1.0e-5) : tensor<4xf32>
  check.expect_almost_eq_const(%t, dense<[0.0, 0.7615942, -0.7615942, 0.46211717]> : tensor<4xf32>, atol 1.0e-5) : tensor<4xf32>
  return
}

func.func @select_cmp() {
  %a = util.unfoldable_constant dense<[1, 5, -3, 7]> : tensor<4xi32>
  %b = util.unfoldable_constant dense<[2, 5, -4, 0]> : tensor<4xi32>
  %c = arith.cmpi sgt, %a, %b : tensor<4xi32>
  %r = arith.select %c, %a, %b : tensor<4xi1>, tensor<4xi32>
  check.expect_eq_const(%r, dense<[2, 5, -3, 7]> : tensor<4xi32>) : tensor<4xi32>
  return
}

func.func @f16_mul() {
  %a = util.unfoldable_constant dense<[1.5, 2.0, -3.0]> : tensor<3xf16>
  %r = arith.mulf %a, %a : tensor<3xf16>
  check.expect_almost_eq_const(%r, dense<[2.25, 4.0, 9.0]> : tensor<3xf16>) : tensor<3xf16>
  return
}

func.func @scalar_checks() {
  %one = util.unfoldable_constant 1 : i32
  %zero = util.unfoldable_constant 0 : i32
  check.expect_true(%one) : i32
  check.expect_false(%zero) : i32
  %t = util.unfoldable_constant dense<[1, 2, 3]> : tensor<3xi32>
  check.expect_all_true(%t) : tensor<3xi32>
  return
}
