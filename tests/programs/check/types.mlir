func.func @dynamic_shape() {
  %a = util.unfoldable_constant dense<[1.0, 2.0, 3.0]> : tensor<3xf32>
  %d = tensor.cast %a : tensor<3xf32> to tensor<?xf32>
  %r = arith.mulf %d, %d : tensor<?xf32>
  %s = tensor.cast %r : tensor<?xf32> to tensor<3xf32>
  check.expect_almost_eq_const(%s, dense<[1.0, 4.0, 9.0]> : tensor<3xf32>) : tensor<3xf32>
  return
}

func.func @i8_wrap() {
  %a = util.unfoldable_constant dense<[100, -128, 127]> : tensor<3xi8>
  %r = arith.addi %a, %a : tensor<3xi8>
  check.expect_eq_const(%r, dense<[-56, 0, -2]> : tensor<3xi8>) : tensor<3xi8>
  return
}

func.func @i64_mul() {
  %a = util.unfoldable_constant dense<[4294967296, -3]> : tensor<2xi64>
  %r = arith.muli %a, %a : tensor<2xi64>
  check.expect_eq_const(%r, dense<[0, 9]> : tensor<2xi64>) : tensor<2xi64>
  return
}

func.func @i4_extend() {
  %a = util.unfoldable_constant dense<[1, -2, 7, -8]> : tensor<4xi4>
  %r = arith.extsi %a : tensor<4xi4> to tensor<4xi32>
  check.expect_eq_const(%r, dense<[1, -2, 7, -8]> : tensor<4xi32>) : tensor<4xi32>
  return
}

func.func @complex_mul() {
  %a = util.unfoldable_constant dense<[(1.0, 2.0), (0.0, -1.0)]> : tensor<2xcomplex<f32>>
  %e = tensor.empty() : tensor<2xf32>
  %r = linalg.generic {indexing_maps = [affine_map<(i) -> (i)>, affine_map<(i) -> (i)>],
                       iterator_types = ["parallel"]}
      ins(%a : tensor<2xcomplex<f32>>) outs(%e : tensor<2xf32>) {
  ^bb0(%c: complex<f32>, %o: f32):
    %sq = complex.mul %c, %c : complex<f32>
    %re = complex.re %sq : complex<f32>
    linalg.yield %re : f32
  } -> tensor<2xf32>
  check.expect_almost_eq_const(%r, dense<[-3.0, -1.0]> : tensor<2xf32>) : tensor<2xf32>
  return
}
