// A program whose dispatches run on VMVX around a call into a host
// module of the test's own ("stats"), as IREE's custom-module samples
// call theirs: the tensor a dispatch computed crosses into the host
// module as a buffer view and its result feeds the next dispatch.
module @host_call {
  func.func private @stats.scale(tensor<?xf32>) -> tensor<?xf32>

  func.func @main(%x: tensor<8xf32>) -> tensor<8xf32> {
    %e = tensor.empty() : tensor<8xf32>
    %y = linalg.generic {indexing_maps = [affine_map<(d0) -> (d0)>, affine_map<(d0) -> (d0)>],
                         iterator_types = ["parallel"]}
        ins(%x : tensor<8xf32>) outs(%e : tensor<8xf32>) {
    ^bb0(%v: f32, %o: f32):
      %s = arith.addf %v, %v : f32
      linalg.yield %s : f32
    } -> tensor<8xf32>
    %d = tensor.cast %y : tensor<8xf32> to tensor<?xf32>
    %z = call @stats.scale(%d) : (tensor<?xf32>) -> tensor<?xf32>
    %w = tensor.cast %z : tensor<?xf32> to tensor<8xf32>
    %r = linalg.generic {indexing_maps = [affine_map<(d0) -> (d0)>, affine_map<(d0) -> (d0)>, affine_map<(d0) -> (d0)>],
                         iterator_types = ["parallel"]}
        ins(%w, %x : tensor<8xf32>, tensor<8xf32>) outs(%e : tensor<8xf32>) {
    ^bb0(%a: f32, %b: f32, %o: f32):
      %m = arith.mulf %a, %b : f32
      %t = math.exp %b : f32
      %s = arith.addf %m, %t : f32
      linalg.yield %s : f32
    } -> tensor<8xf32>
    return %r : tensor<8xf32>
  }
}
