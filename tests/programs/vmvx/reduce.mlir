// Reductions for the VMVX tests: a row sum, a column maximum and a
// softmax (reductions feeding element-wise work).
func.func @row_sum(%a: tensor<5x12xf32>) -> tensor<5xf32> {
  %c0 = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<5xf32>
  %f = linalg.fill ins(%c0 : f32) outs(%e : tensor<5xf32>) -> tensor<5xf32>
  %r = linalg.reduce ins(%a : tensor<5x12xf32>) outs(%f : tensor<5xf32>) dimensions = [1]
    (%x: f32, %acc: f32) {
      %s = arith.addf %x, %acc : f32
      linalg.yield %s : f32
    }
  return %r : tensor<5xf32>
}

func.func @col_max(%a: tensor<6x9xi32>) -> tensor<9xi32> {
  %c0 = arith.constant -2147483648 : i32
  %e = tensor.empty() : tensor<9xi32>
  %f = linalg.fill ins(%c0 : i32) outs(%e : tensor<9xi32>) -> tensor<9xi32>
  %r = linalg.reduce ins(%a : tensor<6x9xi32>) outs(%f : tensor<9xi32>) dimensions = [0]
    (%x: i32, %acc: i32) {
      %m = arith.maxsi %x, %acc : i32
      linalg.yield %m : i32
    }
  return %r : tensor<9xi32>
}

func.func @softmax(%a: tensor<3x16xf32>) -> tensor<3x16xf32> {
  %e = tensor.empty() : tensor<3x16xf32>
  %r = linalg.softmax dimension(1) ins(%a : tensor<3x16xf32>) outs(%e : tensor<3x16xf32>) -> tensor<3x16xf32>
  return %r : tensor<3x16xf32>
}
