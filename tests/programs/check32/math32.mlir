// What IREE's e2e op suites found broken on 32-bit x86 and Arm, small:
// exp, tanh, log, sin/cos, sigmoid, expm1 and a reduction over exp (their
// polynomials call fmaf on CPUs without FMA), softmax (fmaxf), rounding
// (roundf and the functions SSE2 lacks), layer norm (a constant row must
// normalize to exactly 0). Expected values: numpy in float64, rounded to
// f32. Run with `hal-cpu check-module` (tests/test_defaults_32bit.py).

func.func @exp() {
  %x = util.unfoldable_constant dense<[0.0, 1.0, -1.0, 0.5, 10.0, -10.0, 20.0, -20.0, 88.0, -87.0, 3.3, -0.001]> : tensor<12xf32>
  %r = math.exp %x : tensor<12xf32>
  check.expect_almost_eq_const(%r, dense<[1.0, 2.7182817459106445, 0.3678794503211975, 1.6487212181091309, 22026.46484375, 4.539993096841499e-05, 485165184.0, 2.06115369216775e-09, 1.6516362661361307e+38, 1.6458114537543937e-38, 27.112638473510742, 0.9990004897117615]> : tensor<12xf32>, atol 1.0e-6, rtol 1.0e-6) : tensor<12xf32>
  return
}

func.func @tanh() {
  %x = util.unfoldable_constant dense<[0.0, 1.0, -1.0, 0.5, 10.0, -10.0, 20.0, -20.0, 88.0, -87.0, 3.3, -0.001]> : tensor<12xf32>
  %r = math.tanh %x : tensor<12xf32>
  check.expect_almost_eq_const(%r, dense<[0.0, 0.7615941762924194, -0.7615941762924194, 0.46211716532707214, 1.0, -1.0, 1.0, -1.0, 1.0, -1.0, 0.9972829818725586, -0.0009999996982514858]> : tensor<12xf32>, atol 1.0e-6) : tensor<12xf32>
  return
}

func.func @sigmoid() {
  %x = util.unfoldable_constant dense<[0.0, 1.0, -1.0, 0.5, 10.0, -10.0, 20.0, -20.0, 88.0, -87.0, 3.3, -0.001]> : tensor<12xf32>
  %one = arith.constant dense<1.0> : tensor<12xf32>
  %n = arith.negf %x : tensor<12xf32>
  %e = math.exp %n : tensor<12xf32>
  %d = arith.addf %one, %e : tensor<12xf32>
  %r = arith.divf %one, %d : tensor<12xf32>
  check.expect_almost_eq_const(%r, dense<[0.5, 0.7310585975646973, 0.2689414322376251, 0.622459352016449, 0.9999545812606812, 4.539786823443137e-05, 1.0, 2.06115369216775e-09, 1.0, 1.6458114537543937e-38, 0.9644287824630737, 0.4997499883174896]> : tensor<12xf32>, atol 1.0e-6, rtol 1.0e-5) : tensor<12xf32>
  return
}

func.func @expm1() {
  %x = util.unfoldable_constant dense<[0.0, 1.0, -1.0, 0.5, 10.0, -10.0, 20.0, -20.0, 88.0, -87.0, 3.3, -0.001]> : tensor<12xf32>
  %r = math.expm1 %x : tensor<12xf32>
  check.expect_almost_eq_const(%r, dense<[0.0, 1.718281865119934, -0.6321205496788025, 0.6487212777137756, 22025.46484375, -0.9999545812606812, 485165184.0, -1.0, 1.6516362661361307e+38, -1.0, 26.112638473510742, -0.0009995001601055264]> : tensor<12xf32>, atol 1.0e-6, rtol 1.0e-5) : tensor<12xf32>
  return
}

func.func @log() {
  %x = util.unfoldable_constant dense<[0.0010000000474974513, 0.5, 1.0, 2.0, 10.0, 1000.0, 9.999999682655225e-21, 3.3999999521443642e+38]> : tensor<8xf32>
  %r = math.log %x : tensor<8xf32>
  %p = math.log1p %x : tensor<8xf32>
  check.expect_almost_eq_const(%r, dense<[-6.907755374908447, -0.6931471824645996, 0.0, 0.6931471824645996, 2.3025851249694824, 6.907755374908447, -46.051700592041016, 88.72200775146484]> : tensor<8xf32>, atol 1.0e-5, rtol 1.0e-6) : tensor<8xf32>
  check.expect_almost_eq_const(%p, dense<[0.00099950039293617, 0.40546509623527527, 0.6931471824645996, 1.0986123085021973, 2.397895336151123, 6.908754825592041, 9.999999682655225e-21, 88.72200775146484]> : tensor<8xf32>, atol 1.0e-5, rtol 1.0e-6) : tensor<8xf32>
  return
}

func.func @sin_cos() {
  %x = util.unfoldable_constant dense<[0.0, 0.5, -1.0, 1.5707963705062866, 3.1415927410125732, -2.5, 10.0, 100.0]> : tensor<8xf32>
  %s = math.sin %x : tensor<8xf32>
  %c = math.cos %x : tensor<8xf32>
  check.expect_almost_eq_const(%s, dense<[0.0, 0.4794255495071411, -0.8414709568023682, 1.0, -8.742277657347586e-08, -0.5984721183776855, -0.5440211296081543, -0.5063656568527222]> : tensor<8xf32>, atol 1.0e-5) : tensor<8xf32>
  check.expect_almost_eq_const(%c, dense<[1.0, 0.8775825500488281, 0.5403022766113281, -4.371138828673793e-08, -1.0, -0.8011435866355896, -0.83907151222229, 0.8623188734054565]> : tensor<8xf32>, atol 1.0e-5) : tensor<8xf32>
  return
}

func.func @sum_of_exp() {
  %x = util.unfoldable_constant dense<[[0.0, 1.0, -1.0, 0.5, 10.0, -10.0, 3.3], [1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0]]> : tensor<2x7xf32>
  %e = math.exp %x : tensor<2x7xf32>
  %zero = arith.constant 0.0 : f32
  %init = tensor.empty() : tensor<2xf32>
  %fill = linalg.fill ins(%zero : f32) outs(%init : tensor<2xf32>) -> tensor<2xf32>
  %r = linalg.reduce ins(%e : tensor<2x7xf32>) outs(%fill : tensor<2xf32>) dimensions = [1]
    (%a: f32, %acc: f32) {
      %s = arith.addf %a, %acc : f32
      linalg.yield %s : f32
    }
  check.expect_almost_eq_const(%r, dense<[22059.31336, 19.027973]> : tensor<2xf32>, atol 1.0e-5, rtol 1.0e-6) : tensor<2xf32>
  return
}

func.func @softmax() {
  %x = util.unfoldable_constant dense<[[1.0, 2.0, 3.0, 4.0, -1.0], [0.5, -1.0, 0.0, 2.5, 100.0], [-50.0, -50.0, -50.0, -50.0, -50.0]]> : tensor<3x5xf32>
  %init = tensor.empty() : tensor<3x5xf32>
  %r = linalg.softmax dimension(1) ins(%x : tensor<3x5xf32>) outs(%init : tensor<3x5xf32>) -> tensor<3x5xf32>
  check.expect_almost_eq_const(%r, dense<[[0.031920112669467926, 0.08676785975694656, 0.23585949838161469, 0.6411325931549072, 0.004319917410612106], [0.0, 0.0, 0.0, 0.0, 1.0], [0.2, 0.2, 0.2, 0.2, 0.2]]> : tensor<3x5xf32>, atol 1.0e-6) : tensor<3x5xf32>
  return
}

func.func @max_min() {
  %a = util.unfoldable_constant dense<[1.0, -2.0, 0.0, -0.0, 3.5, -1.0e30]> : tensor<6xf32>
  %b = util.unfoldable_constant dense<[2.0, -3.0, -0.0, 0.0, 3.5, 1.0e-30]> : tensor<6xf32>
  %mx = arith.maximumf %a, %b : tensor<6xf32>
  %mn = arith.minimumf %a, %b : tensor<6xf32>
  %nx = arith.maxnumf %a, %b : tensor<6xf32>
  %nn = arith.minnumf %a, %b : tensor<6xf32>
  check.expect_almost_eq_const(%mx, dense<[2.0, -2.0, 0.0, 0.0, 3.5, 1.0e-30]> : tensor<6xf32>, atol 0.0) : tensor<6xf32>
  check.expect_almost_eq_const(%mn, dense<[1.0, -3.0, -0.0, -0.0, 3.5, -1.0e30]> : tensor<6xf32>, atol 0.0) : tensor<6xf32>
  check.expect_almost_eq_const(%nx, dense<[2.0, -2.0, 0.0, 0.0, 3.5, 1.0e-30]> : tensor<6xf32>, atol 0.0) : tensor<6xf32>
  check.expect_almost_eq_const(%nn, dense<[1.0, -3.0, -0.0, -0.0, 3.5, -1.0e30]> : tensor<6xf32>, atol 0.0) : tensor<6xf32>
  return
}

func.func @round() {
  %x = util.unfoldable_constant dense<[-0.7, -0.5, -0.2, 0.0, 0.2, 0.5, 0.7, 2.5, -2.5, 1.5, 8388607.5, -3.5, 0.49999997, 1.0e10]> : tensor<14xf32>
  %r = math.round %x : tensor<14xf32>
  %e = math.roundeven %x : tensor<14xf32>
  %f = math.floor %x : tensor<14xf32>
  %c = math.ceil %x : tensor<14xf32>
  check.expect_almost_eq_const(%r, dense<[-1.0, -1.0, -0.0, 0.0, 0.0, 1.0, 1.0, 3.0, -3.0, 2.0, 8388608.0, -4.0, 0.0, 1.0e10]> : tensor<14xf32>, atol 0.0) : tensor<14xf32>
  check.expect_almost_eq_const(%e, dense<[-1.0, -0.0, -0.0, 0.0, 0.0, 0.0, 1.0, 2.0, -2.0, 2.0, 8388608.0, -4.0, 0.0, 1.0e10]> : tensor<14xf32>, atol 0.0) : tensor<14xf32>
  check.expect_almost_eq_const(%f, dense<[-1.0, -1.0, -1.0, 0.0, 0.0, 0.0, 0.0, 2.0, -3.0, 1.0, 8388607.0, -4.0, 0.0, 1.0e10]> : tensor<14xf32>, atol 0.0) : tensor<14xf32>
  check.expect_almost_eq_const(%c, dense<[-0.0, -0.0, -0.0, 0.0, 1.0, 1.0, 1.0, 3.0, -2.0, 2.0, 8388608.0, -3.0, 1.0, 1.0e10]> : tensor<14xf32>, atol 0.0) : tensor<14xf32>
  return
}

// (x - mean) / sqrt(var + 1e-12) over rows of 12, as IREE's
// regression/layernorm.mlir over rows of 384: the mean is the sum times
// 1/n (inexact in f32), and the row of 5.0 must still give exactly 0.
func.func @layernorm() {
  %x = util.unfoldable_constant dense<[[8.164, -10.223, 1.672, -2.271, -1.811, -0.862, -8.08, -0.928, -3.461, 13.292, 0.903, -1.411], [1.928, -0.954, 3.831, -0.799, 0.097, 6.183, 2.18, -2.021, -0.731, 2.162, 7.74, -1.078], [5.0, 5.0, 5.0, 5.0, 5.0, 5.0, 5.0, 5.0, 5.0, 5.0, 5.0, 5.0]]> : tensor<3x12xf32>
  %n = util.unfoldable_constant dense<12.0> : tensor<3xf32>
  %zero = arith.constant 0.0 : f32
  %one = arith.constant 1.0 : f32
  %eps = arith.constant 9.99999996E-13 : f32
  %init = tensor.empty() : tensor<3xf32>
  %fill = linalg.fill ins(%zero : f32) outs(%init : tensor<3xf32>) -> tensor<3xf32>
  %recip = linalg.generic {indexing_maps = [affine_map<(i) -> (i)>, affine_map<(i) -> (i)>], iterator_types = ["parallel"]} ins(%n : tensor<3xf32>) outs(%init : tensor<3xf32>) {
  ^bb0(%v: f32, %o: f32):
    %r = arith.divf %one, %v : f32
    linalg.yield %r : f32
  } -> tensor<3xf32>
  %sum = linalg.reduce ins(%x : tensor<3x12xf32>) outs(%fill : tensor<3xf32>) dimensions = [1]
    (%a: f32, %acc: f32) {
      %s = arith.addf %a, %acc : f32
      linalg.yield %s : f32
    }
  %empty = tensor.empty() : tensor<3x12xf32>
  %centered = linalg.generic {indexing_maps = [affine_map<(i, j) -> (i, j)>, affine_map<(i, j) -> (i)>, affine_map<(i, j) -> (i)>, affine_map<(i, j) -> (i, j)>], iterator_types = ["parallel", "parallel"]} ins(%x, %sum, %recip : tensor<3x12xf32>, tensor<3xf32>, tensor<3xf32>) outs(%empty : tensor<3x12xf32>) {
  ^bb0(%v: f32, %s: f32, %r: f32, %o: f32):
    %mean = arith.mulf %s, %r : f32
    %d = arith.subf %v, %mean : f32
    linalg.yield %d : f32
  } -> tensor<3x12xf32>
  %sq = linalg.reduce ins(%centered : tensor<3x12xf32>) outs(%fill : tensor<3xf32>) dimensions = [1]
    (%a: f32, %acc: f32) {
      %m = arith.mulf %a, %a : f32
      %s = arith.addf %m, %acc : f32
      linalg.yield %s : f32
    }
  %norm = linalg.generic {indexing_maps = [affine_map<(i, j) -> (i, j)>, affine_map<(i, j) -> (i)>, affine_map<(i, j) -> (i)>, affine_map<(i, j) -> (i, j)>], iterator_types = ["parallel", "parallel"]} ins(%centered, %sq, %recip : tensor<3x12xf32>, tensor<3xf32>, tensor<3xf32>) outs(%empty : tensor<3x12xf32>) {
  ^bb0(%d: f32, %q: f32, %r: f32, %o: f32):
    %var = arith.mulf %q, %r : f32
    %ve = arith.addf %var, %eps : f32
    %rs = math.rsqrt %ve : f32
    %y = arith.mulf %d, %rs : f32
    linalg.yield %y : f32
  } -> tensor<3x12xf32>
  check.expect_almost_eq_const(%norm, dense<[[1.4194507598876953, -1.62173330783844, 0.34568309783935547, -0.30648359656333923, -0.23040026426315308, -0.07343698292970657, -1.2672841548919678, -0.08435329049825668, -0.5033079385757446, 2.2676148414611816, 0.2184915542602539, -0.16424082219600677], [0.12974533438682556, -0.8461382985115051, 0.7741265296936035, -0.7936532497406006, -0.4902556836605072, 1.5705450773239136, 0.21507592499256134, -1.2074387073516846, -0.770627498626709, 0.20898084342479706, 2.0977659225463867, -0.8881263136863708], [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]]> : tensor<3x12xf32>, atol 1.0e-5) : tensor<3x12xf32>
  return
}
