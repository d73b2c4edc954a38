// math.fma on f32: on a 32-bit CPU without fused multiply-add instructions
// (x86_32 pentium4, arm32 armv7-a) LLVM calls fmaf, which iree-compile
// 3.13 leaves without a body unless the executable links hal_cpu's libm.
func.func @fma() {
  %a = util.unfoldable_constant dense<[1.5, -2.0, 3.25, 0.5, 16777216.0]> : tensor<5xf32>
  %b = util.unfoldable_constant dense<[2.0, 0.25, -1.0, 8.0, 1.0]> : tensor<5xf32>
  %c = util.unfoldable_constant dense<[0.5, 1.0, 0.25, -4.0, 1.0]> : tensor<5xf32>
  %r = math.fma %a, %b, %c : tensor<5xf32>
  check.expect_almost_eq_const(%r, dense<[3.5, 0.5, -3.0, 0.0, 16777216.0]> : tensor<5xf32>) : tensor<5xf32>
  return
}
