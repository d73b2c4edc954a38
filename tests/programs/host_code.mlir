// Host code that reads device data: a loop whose condition reads a tensor,
// a scalar result read from a tensor, and a size computed on the device.
func.func @double_until(%x: tensor<f32>, %limit: f32) -> tensor<f32> {
  %r = scf.while (%a = %x) : (tensor<f32>) -> tensor<f32> {
    %v = tensor.extract %a[] : tensor<f32>
    %c = arith.cmpf olt, %v, %limit : f32
    scf.condition(%c) %a : tensor<f32>
  } do {
  ^bb0(%b: tensor<f32>):
    %d = arith.addf %b, %b : tensor<f32>
    scf.yield %d : tensor<f32>
  }
  return %r : tensor<f32>
}

func.func @third_of_square(%x: tensor<4xi32>) -> i32 {
  %c2 = arith.constant 2 : index
  %y = arith.muli %x, %x : tensor<4xi32>
  %v = tensor.extract %y[%c2] : tensor<4xi32>
  return %v : i32
}

func.func @iota_of_sum(%x: tensor<3xi32>) -> tensor<?xf32> {
  %c0 = arith.constant 0 : index
  %z = arith.constant 0 : i32
  %e0 = tensor.empty() : tensor<i32>
  %init = linalg.fill ins(%z : i32) outs(%e0 : tensor<i32>) -> tensor<i32>
  %s = linalg.reduce ins(%x : tensor<3xi32>) outs(%init : tensor<i32>) dimensions = [0]
    (%a: i32, %acc: i32) {
      %t = arith.addi %a, %acc : i32
      linalg.yield %t : i32
    }
  %n32 = tensor.extract %s[] : tensor<i32>
  %n = arith.index_cast %n32 : i32 to index
  %e = tensor.empty(%n) : tensor<?xf32>
  %r = linalg.generic {indexing_maps = [affine_map<(i) -> (i)>], iterator_types = ["parallel"]}
      outs(%e : tensor<?xf32>) {
  ^bb0(%o: f32):
    %i = linalg.index 0 : index
    %ii = arith.index_cast %i : index to i32
    %f = arith.sitofp %ii : i32 to f32
    linalg.yield %f : f32
  } -> tensor<?xf32>
  return %r : tensor<?xf32>
}
