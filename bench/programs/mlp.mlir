// A 3-dispatch MLP (matmul + add + relu + softmax) for bench/vm_programs.py.
func.func @predict(%x: tensor<4x16xf32>) -> tensor<4x8xf32> {
  %w = arith.constant dense<0.05> : tensor<16x8xf32>
  %b = arith.constant dense<0.1> : tensor<4x8xf32>
  %init = tensor.empty() : tensor<4x8xf32>
  %zero = arith.constant 0.0 : f32
  %filled = linalg.fill ins(%zero : f32) outs(%init : tensor<4x8xf32>) -> tensor<4x8xf32>
  %mm = linalg.matmul ins(%x, %w : tensor<4x16xf32>, tensor<16x8xf32>) outs(%filled : tensor<4x8xf32>) -> tensor<4x8xf32>
  %add = arith.addf %mm, %b : tensor<4x8xf32>
  %relu = arith.maximumf %add, %b : tensor<4x8xf32>
  %sm = linalg.softmax dimension(1) ins(%relu : tensor<4x8xf32>) outs(%init : tensor<4x8xf32>) -> tensor<4x8xf32>
  return %sm : tensor<4x8xf32>
}
