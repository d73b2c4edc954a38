// Program: 2-D convolution, NHWC input and HWCF filter, stride 1, no padding.
// Public function: @conv2d(%x: tensor<1x9x11x3xf32>, %w: tensor<3x3x3x5xf32>) -> tensor<1x7x9x5xf32>
// Computes out[n, y, x, f] = sum over (i, j, c) of x[n, y+i, x+j, c] * w[i, j, c, f]
// via linalg.conv_2d_nhwc_hwcf on a zero-filled init.
func.func @conv2d(%x: tensor<1x9x11x3xf32>, %w: tensor<3x3x3x5xf32>) -> tensor<1x7x9x5xf32> {
  %zero = arith.constant 0.0 : f32
  %empty = tensor.empty() : tensor<1x7x9x5xf32>
  %init = linalg.fill ins(%zero : f32) outs(%empty : tensor<1x7x9x5xf32>) -> tensor<1x7x9x5xf32>
  %r = linalg.conv_2d_nhwc_hwcf {dilations = dense<1> : tensor<2xi64>, strides = dense<1> : tensor<2xi64>}
         ins(%x, %w : tensor<1x9x11x3xf32>, tensor<3x3x3x5xf32>)
         outs(%init : tensor<1x7x9x5xf32>) -> tensor<1x7x9x5xf32>
  return %r : tensor<1x7x9x5xf32>
}
