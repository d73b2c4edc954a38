// Program: exp reduction over the last dimension.
// Public function: @exp_reduce(%x: tensor<9x37xf32>) -> tensor<9xf32>
// Computes sum(exp(x), axis=-1): a transcendental polynomial feeding a
// reduction, what vector units (AVX2+FMA, SVE, RVV, NEON) are built for.
#row = affine_map<(d0, d1) -> (d0, d1)>
#red = affine_map<(d0, d1) -> (d0)>
func.func @exp_reduce(%x: tensor<9x37xf32>) -> tensor<9xf32> {
  %zero = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<9xf32>
  %init = linalg.fill ins(%zero : f32) outs(%e : tensor<9xf32>) -> tensor<9xf32>
  %sum = linalg.generic {indexing_maps = [#row, #red], iterator_types = ["parallel", "reduction"]}
      ins(%x : tensor<9x37xf32>) outs(%init : tensor<9xf32>) {
  ^bb0(%v: f32, %acc: f32):
    %x_exp = math.exp %v : f32
    %a = arith.addf %x_exp, %acc : f32
    linalg.yield %a : f32
  } -> tensor<9xf32>
  return %sum : tensor<9xf32>
}
