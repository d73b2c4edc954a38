// Program: softmax over the last dimension.
// Public function: @softmax(%x: tensor<7x33xf32>) -> tensor<7x33xf32>
// Computes exp(x - max(x, axis=-1)) / sum(exp(x - max(x, axis=-1)), axis=-1).
// The maximum is taken with a compare and select: linalg.softmax lowers it
// to the fmaxf libcall, which iree-compile cannot link for generic i686.
#row = affine_map<(d0, d1) -> (d0, d1)>
#red = affine_map<(d0, d1) -> (d0)>
func.func @softmax(%x: tensor<7x33xf32>) -> tensor<7x33xf32> {
  %ninf = arith.constant 0xFF800000 : f32
  %zero = arith.constant 0.0 : f32
  %e1 = tensor.empty() : tensor<7xf32>
  %m0 = linalg.fill ins(%ninf : f32) outs(%e1 : tensor<7xf32>) -> tensor<7xf32>
  %max = linalg.generic {indexing_maps = [#row, #red], iterator_types = ["parallel", "reduction"]}
      ins(%x : tensor<7x33xf32>) outs(%m0 : tensor<7xf32>) {
  ^bb0(%v: f32, %acc: f32):
    %gt = arith.cmpf ogt, %v, %acc : f32
    %m = arith.select %gt, %v, %acc : f32
    linalg.yield %m : f32
  } -> tensor<7xf32>
  %s0 = linalg.fill ins(%zero : f32) outs(%e1 : tensor<7xf32>) -> tensor<7xf32>
  %sum = linalg.generic {indexing_maps = [#row, #red, #red], iterator_types = ["parallel", "reduction"]}
      ins(%x, %max : tensor<7x33xf32>, tensor<7xf32>) outs(%s0 : tensor<7xf32>) {
  ^bb0(%v: f32, %m: f32, %acc: f32):
    %d = arith.subf %v, %m : f32
    %e = math.exp %d : f32
    %a = arith.addf %e, %acc : f32
    linalg.yield %a : f32
  } -> tensor<7xf32>
  %e2 = tensor.empty() : tensor<7x33xf32>
  %r = linalg.generic {indexing_maps = [#row, #red, #red, #row], iterator_types = ["parallel", "parallel"]}
      ins(%x, %max, %sum : tensor<7x33xf32>, tensor<7xf32>, tensor<7xf32>) outs(%e2 : tensor<7x33xf32>) {
  ^bb0(%v: f32, %m: f32, %s: f32, %o: f32):
    %d = arith.subf %v, %m : f32
    %e = math.exp %d : f32
    %q = arith.divf %e, %s : f32
    linalg.yield %q : f32
  } -> tensor<7x33xf32>
  return %r : tensor<7x33xf32>
}
