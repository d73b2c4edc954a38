// Matrix products for the VMVX tests; with microkernels and data tiling
// they run as vmvx.pack, vmvx.mmt4d and vmvx.unpack.
func.func @matmul(%a: tensor<8x16xf32>, %b: tensor<16x4xf32>) -> tensor<8x4xf32> {
  %c0 = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<8x4xf32>
  %f = linalg.fill ins(%c0 : f32) outs(%e : tensor<8x4xf32>) -> tensor<8x4xf32>
  %r = linalg.matmul ins(%a, %b : tensor<8x16xf32>, tensor<16x4xf32>) outs(%f : tensor<8x4xf32>) -> tensor<8x4xf32>
  return %r : tensor<8x4xf32>
}

func.func @matmul_odd(%a: tensor<7x13xf32>, %b: tensor<13x5xf32>) -> tensor<7x5xf32> {
  %c0 = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<7x5xf32>
  %f = linalg.fill ins(%c0 : f32) outs(%e : tensor<7x5xf32>) -> tensor<7x5xf32>
  %r = linalg.matmul ins(%a, %b : tensor<7x13xf32>, tensor<13x5xf32>) outs(%f : tensor<7x5xf32>) -> tensor<7x5xf32>
  return %r : tensor<7x5xf32>
}

func.func @matmul_i8(%a: tensor<6x10xi8>, %b: tensor<10x3xi8>) -> tensor<6x3xi32> {
  %c0 = arith.constant 0 : i32
  %e = tensor.empty() : tensor<6x3xi32>
  %f = linalg.fill ins(%c0 : i32) outs(%e : tensor<6x3xi32>) -> tensor<6x3xi32>
  %r = linalg.matmul ins(%a, %b : tensor<6x10xi8>, tensor<10x3xi8>) outs(%f : tensor<6x3xi32>) -> tensor<6x3xi32>
  return %r : tensor<6x3xi32>
}

func.func @matmul_big(%a: tensor<96x64xf32>, %b: tensor<64x80xf32>) -> tensor<96x80xf32> {
  %c0 = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<96x80xf32>
  %f = linalg.fill ins(%c0 : f32) outs(%e : tensor<96x80xf32>) -> tensor<96x80xf32>
  %r = linalg.matmul ins(%a, %b : tensor<96x64xf32>, tensor<64x80xf32>) outs(%f : tensor<96x80xf32>) -> tensor<96x80xf32>
  return %r : tensor<96x80xf32>
}
