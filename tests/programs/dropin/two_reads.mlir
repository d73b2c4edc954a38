// Two dispatches read the same input: a row sum of %a (a reduction),
// then %a scaled by that sum (elementwise, after the reduction).
// `hal-cpu plan` must not say the second dispatch's binding of %a was
// "written by an earlier step": a dispatch never writes the function's
// inputs.
func.func @normalize(%a: tensor<4x8xf32>) -> tensor<4x8xf32> {
  %zero = arith.constant 0.0 : f32
  %init = tensor.empty() : tensor<4xf32>
  %filled = linalg.fill ins(%zero : f32) outs(%init : tensor<4xf32>) -> tensor<4xf32>
  %sum = linalg.generic {
      indexing_maps = [affine_map<(i, j) -> (i, j)>, affine_map<(i, j) -> (i)>],
      iterator_types = ["parallel", "reduction"]}
      ins(%a : tensor<4x8xf32>) outs(%filled : tensor<4xf32>) {
    ^bb0(%x: f32, %acc: f32):
      %s = arith.addf %x, %acc : f32
      linalg.yield %s : f32
  } -> tensor<4xf32>
  // (kept apart: two dispatches, not one fused)
  %kept = util.optimization_barrier %sum : tensor<4xf32>
  %out = tensor.empty() : tensor<4x8xf32>
  %scaled = linalg.generic {
      indexing_maps = [affine_map<(i, j) -> (i, j)>, affine_map<(i, j) -> (i)>,
                       affine_map<(i, j) -> (i, j)>],
      iterator_types = ["parallel", "parallel"]}
      ins(%a, %kept : tensor<4x8xf32>, tensor<4xf32>) outs(%out : tensor<4x8xf32>) {
    ^bb0(%x: f32, %s: f32, %o: f32):
      %r = arith.divf %x, %s : f32
      linalg.yield %r : f32
  } -> tensor<4x8xf32>
  return %scaled : tensor<4x8xf32>
}
