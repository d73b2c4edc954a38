// Sample kernel "mul_add" for the hal-cpu demo (built by build_samples.py).
// Public function: @mul_add(%a: tensor<5003xf32>, %b: tensor<5003xf32>) -> tensor<5003xf32>
// Computes a * b + a elementwise; compiles to a single dispatch whose
// bindings are (a, b, result).
func.func @mul_add(%a: tensor<5003xf32>, %b: tensor<5003xf32>) -> tensor<5003xf32> {
  %init = tensor.empty() : tensor<5003xf32>
  %r = linalg.generic {
      indexing_maps = [affine_map<(d0) -> (d0)>, affine_map<(d0) -> (d0)>, affine_map<(d0) -> (d0)>],
      iterator_types = ["parallel"]}
      ins(%a, %b : tensor<5003xf32>, tensor<5003xf32>) outs(%init : tensor<5003xf32>) {
  ^bb0(%x: f32, %y: f32, %o: f32):
    %m = arith.mulf %x, %y : f32
    %s = arith.addf %m, %x : f32
    linalg.yield %s : f32
  } -> tensor<5003xf32>
  return %r : tensor<5003xf32>
}
