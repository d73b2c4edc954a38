// Program: two dispatches sharing one transient buffer.
// Public function: @mm_rowsum(%a: tensor<37x53xf32>, %b: tensor<53x29xf32>)
//                      -> (tensor<37xf32>, tensor<37x29xf32>)
// Computes m = a @ b and r = tanh(m).sum(axis=-1) and returns (r, m).
// IREE places m and r in the same transient allocation; the first dispatch
// writes m, the second reads m and writes r (both bind the whole buffer,
// the offsets inside it are baked into the kernels). Both dispatches are
// linked into a single hal.executable (@mm_rowsum_linked).
func.func @mm_rowsum(%a: tensor<37x53xf32>, %b: tensor<53x29xf32>) -> (tensor<37xf32>, tensor<37x29xf32>) {
  %zero = arith.constant 0.0 : f32
  %empty = tensor.empty() : tensor<37x29xf32>
  %init = linalg.fill ins(%zero : f32) outs(%empty : tensor<37x29xf32>) -> tensor<37x29xf32>
  %m = linalg.matmul ins(%a, %b : tensor<37x53xf32>, tensor<53x29xf32>)
                     outs(%init : tensor<37x29xf32>) -> tensor<37x29xf32>
  %e2 = tensor.empty() : tensor<37xf32>
  %i2 = linalg.fill ins(%zero : f32) outs(%e2 : tensor<37xf32>) -> tensor<37xf32>
  %r = linalg.generic {
      indexing_maps = [affine_map<(d0, d1) -> (d0, d1)>, affine_map<(d0, d1) -> (d0)>],
      iterator_types = ["parallel", "reduction"]}
      ins(%m : tensor<37x29xf32>) outs(%i2 : tensor<37xf32>) {
  ^bb0(%in: f32, %acc: f32):
    %t = math.tanh %in : f32
    %s = arith.addf %t, %acc : f32
    linalg.yield %s : f32
  } -> tensor<37xf32>
  return %r, %m : tensor<37xf32>, tensor<37x29xf32>
}
