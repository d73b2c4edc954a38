// Program: layer normalization over the last dimension with scale and bias.
// Public function: @layer_norm(%x: tensor<5x67xf32>, %gamma: tensor<67xf32>, %beta: tensor<67xf32>) -> tensor<5x67xf32>
// Computes (x - mean) / sqrt(var + 1e-5) * gamma + beta, mean and (biased)
// var taken over the last axis.
#row = affine_map<(d0, d1) -> (d0, d1)>
#red = affine_map<(d0, d1) -> (d0)>
#col = affine_map<(d0, d1) -> (d1)>
func.func @layer_norm(%x: tensor<5x67xf32>, %gamma: tensor<67xf32>, %beta: tensor<67xf32>) -> tensor<5x67xf32> {
  %zero = arith.constant 0.0 : f32
  %n = arith.constant 67.0 : f32
  %eps = arith.constant 1.0e-5 : f32
  %e1 = tensor.empty() : tensor<5xf32>
  %z1 = linalg.fill ins(%zero : f32) outs(%e1 : tensor<5xf32>) -> tensor<5xf32>
  %sum = linalg.generic {indexing_maps = [#row, #red], iterator_types = ["parallel", "reduction"]}
      ins(%x : tensor<5x67xf32>) outs(%z1 : tensor<5xf32>) {
  ^bb0(%v: f32, %acc: f32):
    %s = arith.addf %v, %acc : f32
    linalg.yield %s : f32
  } -> tensor<5xf32>
  %var = linalg.generic {indexing_maps = [#row, #red, #red], iterator_types = ["parallel", "reduction"]}
      ins(%x, %sum : tensor<5x67xf32>, tensor<5xf32>) outs(%z1 : tensor<5xf32>) {
  ^bb0(%v: f32, %s: f32, %acc: f32):
    %m = arith.divf %s, %n : f32
    %d = arith.subf %v, %m : f32
    %d2 = arith.mulf %d, %d : f32
    %a = arith.addf %d2, %acc : f32
    linalg.yield %a : f32
  } -> tensor<5xf32>
  %e2 = tensor.empty() : tensor<5x67xf32>
  %r = linalg.generic {indexing_maps = [#row, #red, #red, #col, #col, #row],
                       iterator_types = ["parallel", "parallel"]}
      ins(%x, %sum, %var, %gamma, %beta : tensor<5x67xf32>, tensor<5xf32>, tensor<5xf32>, tensor<67xf32>, tensor<67xf32>)
      outs(%e2 : tensor<5x67xf32>) {
  ^bb0(%v: f32, %s: f32, %q: f32, %g: f32, %b: f32, %o: f32):
    %m = arith.divf %s, %n : f32
    %vr = arith.divf %q, %n : f32
    %ve = arith.addf %vr, %eps : f32
    %rs = math.rsqrt %ve : f32
    %d = arith.subf %v, %m : f32
    %y = arith.mulf %d, %rs : f32
    %yg = arith.mulf %y, %g : f32
    %yb = arith.addf %yg, %b : f32
    linalg.yield %yb : f32
  } -> tensor<5x67xf32>
  return %r : tensor<5x67xf32>
}
