// 3x3 convolution, stride 1, no padding: NHWC input 1x34x34x32, HWCF
// filter 3x3x32x32, output 1x32x32x32 on a zero-filled init.
// Public function: @conv3x3(%input: tensor<1x34x34x32xf32>, %filter: tensor<3x3x32x32xf32>) -> tensor<1x32x32x32xf32>
// (bench/iree_under_qemu.py).
func.func @conv3x3(%input: tensor<1x34x34x32xf32>, %filter: tensor<3x3x32x32xf32>) -> tensor<1x32x32x32xf32> {
  %zero = arith.constant 0.0 : f32
  %empty = tensor.empty() : tensor<1x32x32x32xf32>
  %init = linalg.fill ins(%zero : f32) outs(%empty : tensor<1x32x32x32xf32>) -> tensor<1x32x32x32xf32>
  %r = linalg.conv_2d_nhwc_hwcf {dilations = dense<1> : tensor<2xi64>, strides = dense<1> : tensor<2xi64>}
         ins(%input, %filter : tensor<1x34x34x32xf32>, tensor<3x3x32x32xf32>)
         outs(%init : tensor<1x32x32x32xf32>) -> tensor<1x32x32x32xf32>
  return %r : tensor<1x32x32x32xf32>
}
