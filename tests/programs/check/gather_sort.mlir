func.func @gather() {
  %src = util.unfoldable_constant dense<[10, 20, 30, 40, 50]> : tensor<5xi32>
  %idx = util.unfoldable_constant dense<[4, 0, 2]> : tensor<3xi32>
  %e = tensor.empty() : tensor<3xi32>
  %r = linalg.generic {indexing_maps = [affine_map<(i) -> (i)>, affine_map<(i) -> (i)>],
                       iterator_types = ["parallel"]}
      ins(%idx : tensor<3xi32>) outs(%e : tensor<3xi32>) {
  ^bb0(%k: i32, %o: i32):
    %ki = arith.index_cast %k : i32 to index
    %v = tensor.extract %src[%ki] : tensor<5xi32>
    linalg.yield %v : i32
  } -> tensor<3xi32>
  check.expect_eq_const(%r, dense<[50, 10, 30]> : tensor<3xi32>) : tensor<3xi32>
  return
}

func.func @scatter() {
  %orig = util.unfoldable_constant dense<[0, 0, 0, 0]> : tensor<4xi32>
  %upd = util.unfoldable_constant dense<[7, 8]> : tensor<2xi32>
  %idx = util.unfoldable_constant dense<[[3], [1]]> : tensor<2x1xi32>
  %r = iree_linalg_ext.scatter dimension_map = [0] unique_indices(true)
      ins(%upd, %idx : tensor<2xi32>, tensor<2x1xi32>) outs(%orig : tensor<4xi32>) {
  ^bb0(%u: i32, %o: i32):
    iree_linalg_ext.yield %u : i32
  } -> tensor<4xi32>
  check.expect_eq_const(%r, dense<[0, 8, 0, 7]> : tensor<4xi32>) : tensor<4xi32>
  return
}

func.func @sort() {
  %a = util.unfoldable_constant dense<[3.0, -1.0, 2.5, 0.0]> : tensor<4xf32>
  %r = iree_linalg_ext.sort dimension(0) outs(%a : tensor<4xf32>) {
  ^bb0(%x: f32, %y: f32):
    %lt = arith.cmpf olt, %x, %y : f32
    iree_linalg_ext.yield %lt : i1
  } -> tensor<4xf32>
  check.expect_almost_eq_const(%r, dense<[-1.0, 0.0, 2.5, 3.0]> : tensor<4xf32>) : tensor<4xf32>
  return
}
