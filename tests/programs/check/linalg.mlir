func.func @matmul() {
  %a = util.unfoldable_constant dense<[[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]]> : tensor<3x2xf32>
  %b = util.unfoldable_constant dense<[[1.0, 0.0, 2.0], [0.5, 1.0, -1.0]]> : tensor<2x3xf32>
  %z = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<3x3xf32>
  %init = linalg.fill ins(%z : f32) outs(%e : tensor<3x3xf32>) -> tensor<3x3xf32>
  %r = linalg.matmul ins(%a, %b : tensor<3x2xf32>, tensor<2x3xf32>) outs(%init : tensor<3x3xf32>) -> tensor<3x3xf32>
  check.expect_almost_eq_const(%r, dense<[[2.0, 2.0, 0.0], [5.0, 4.0, 2.0], [8.0, 6.0, 4.0]]> : tensor<3x3xf32>) : tensor<3x3xf32>
  return
}

func.func @conv1d() {
  %x = util.unfoldable_constant dense<[[[1.0], [2.0], [3.0], [4.0], [5.0]]]> : tensor<1x5x1xf32>
  %w = util.unfoldable_constant dense<[[[1.0]], [[0.0]], [[-1.0]]]> : tensor<3x1x1xf32>
  %z = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<1x3x1xf32>
  %init = linalg.fill ins(%z : f32) outs(%e : tensor<1x3x1xf32>) -> tensor<1x3x1xf32>
  %r = linalg.conv_1d_nwc_wcf {dilations = dense<1> : tensor<1xi64>, strides = dense<1> : tensor<1xi64>}
      ins(%x, %w : tensor<1x5x1xf32>, tensor<3x1x1xf32>) outs(%init : tensor<1x3x1xf32>) -> tensor<1x3x1xf32>
  check.expect_almost_eq_const(%r, dense<[[[-2.0], [-2.0], [-2.0]]]> : tensor<1x3x1xf32>) : tensor<1x3x1xf32>
  return
}

func.func @pad() {
  %a = util.unfoldable_constant dense<[[1, 2], [3, 4]]> : tensor<2x2xi32>
  %c9 = arith.constant 9 : i32
  %p = tensor.pad %a low[1, 0] high[0, 1] {
  ^bb0(%i: index, %j: index):
    tensor.yield %c9 : i32
  } : tensor<2x2xi32> to tensor<3x3xi32>
  check.expect_eq_const(%p, dense<[[9, 9, 9], [1, 2, 9], [3, 4, 9]]> : tensor<3x3xi32>) : tensor<3x3xi32>
  return
}
