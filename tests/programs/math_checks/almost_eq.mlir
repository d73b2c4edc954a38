func.func @exp_f32() -> () {
  %input = util.unfoldable_constant dense<[-1.0, 0.0, 0.5, 1.0, 2.0]> : tensor<5xf32>
  %result_empty = tensor.empty() : tensor<5xf32>
  %result = linalg.generic {indexing_maps = [
      affine_map<(d0) -> (d0)>, affine_map<(d0) -> (d0)>
    ], iterator_types = ["parallel"]}
    ins(%input : tensor<5xf32>) outs(%result_empty : tensor<5xf32>) {
  ^bb0(%in: f32, %out: f32):
    %r = math.exp %in : f32
    linalg.yield %r : f32
  } -> tensor<5xf32>
  check.expect_almost_eq_const(%result,
    dense<[0.36787944117144233, 1.0, 1.6487212707001282, 2.718281828459045, 7.38905609893065]> : tensor<5xf32>,
    atol 1.0e-06, rtol 1.0e-06) : tensor<5xf32>
  return
}

func.func @sqrt_f16() -> () {
  %input = util.unfoldable_constant dense<[0.0, 0.25, 1.0, 2.0, 9.0]> : tensor<5xf16>
  %result_empty = tensor.empty() : tensor<5xf16>
  %result = linalg.generic {indexing_maps = [
      affine_map<(d0) -> (d0)>, affine_map<(d0) -> (d0)>
    ], iterator_types = ["parallel"]}
    ins(%input : tensor<5xf16>) outs(%result_empty : tensor<5xf16>) {
  ^bb0(%in: f16, %out: f16):
    %r = math.sqrt %in : f16
    linalg.yield %r : f16
  } -> tensor<5xf16>
  check.expect_almost_eq_const(%result,
    dense<[0.0, 0.5, 1.0, 1.4142135623730951, 3.0]> : tensor<5xf16>,
    atol 1.0e-03, rtol 1.0e-03) : tensor<5xf16>
  return
}

func.func @tanh_f16() -> () {
  %input = util.unfoldable_constant dense<[-2.0, -0.5, 0.0, 0.5, 2.0]> : tensor<5xf16>
  %result_empty = tensor.empty() : tensor<5xf16>
  %result = linalg.generic {indexing_maps = [
      affine_map<(d0) -> (d0)>, affine_map<(d0) -> (d0)>
    ], iterator_types = ["parallel"]}
    ins(%input : tensor<5xf16>) outs(%result_empty : tensor<5xf16>) {
  ^bb0(%in: f16, %out: f16):
    %r = math.tanh %in : f16
    linalg.yield %r : f16
  } -> tensor<5xf16>
  check.expect_almost_eq_const(%result,
    dense<[-0.9640275800758169, -0.46211715726000974, 0.0, 0.46211715726000974, 0.9640275800758169]> : tensor<5xf16>,
    atol 2.0e-03, rtol 2.0e-03) : tensor<5xf16>
  return
}

func.func @wrong_f32() -> () {
  %input = util.unfoldable_constant dense<[1.0, 4.0]> : tensor<2xf32>
  %result_empty = tensor.empty() : tensor<2xf32>
  %result = linalg.generic {indexing_maps = [
      affine_map<(d0) -> (d0)>, affine_map<(d0) -> (d0)>
    ], iterator_types = ["parallel"]}
    ins(%input : tensor<2xf32>) outs(%result_empty : tensor<2xf32>) {
  ^bb0(%in: f32, %out: f32):
    %r = math.sqrt %in : f32
    linalg.yield %r : f32
  } -> tensor<2xf32>
  check.expect_almost_eq_const(%result,
    dense<[1.0, 2.5]> : tensor<2xf32>,
    atol 1.0e-03, rtol 1.0e-03) : tensor<2xf32>
  return
}
