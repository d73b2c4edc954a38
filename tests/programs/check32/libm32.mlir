// Ops that 32-bit x86 and Arm compile to libm calls (fmaf, fmaxf, fminf,
// roundevenf, floorf...) or to polynomials that call fmaf, on any input:
// tests/test_defaults_32bit.py compares their results with x86_64's and
// with exact references.

func.func @fma(%a: tensor<?xf32>, %b: tensor<?xf32>, %c: tensor<?xf32>) -> tensor<?xf32> {
  %r = math.fma %a, %b, %c : tensor<?xf32>
  return %r : tensor<?xf32>
}

func.func @rounding(%x: tensor<?xf32>) -> (tensor<?xf32>, tensor<?xf32>, tensor<?xf32>, tensor<?xf32>) {
  %r = math.round %x : tensor<?xf32>
  %e = math.roundeven %x : tensor<?xf32>
  %f = math.floor %x : tensor<?xf32>
  %c = math.ceil %x : tensor<?xf32>
  return %r, %e, %f, %c : tensor<?xf32>, tensor<?xf32>, tensor<?xf32>, tensor<?xf32>
}

func.func @minmax(%a: tensor<?xf32>, %b: tensor<?xf32>) -> (tensor<?xf32>, tensor<?xf32>, tensor<?xf32>, tensor<?xf32>) {
  %mx = arith.maximumf %a, %b : tensor<?xf32>
  %mn = arith.minimumf %a, %b : tensor<?xf32>
  %nx = arith.maxnumf %a, %b : tensor<?xf32>
  %nn = arith.minnumf %a, %b : tensor<?xf32>
  return %mx, %mn, %nx, %nn : tensor<?xf32>, tensor<?xf32>, tensor<?xf32>, tensor<?xf32>
}

func.func @transcendental(%x: tensor<?xf32>) -> (tensor<?xf32>, tensor<?xf32>, tensor<?xf32>, tensor<?xf32>, tensor<?xf32>) {
  %e = math.exp %x : tensor<?xf32>
  %t = math.tanh %x : tensor<?xf32>
  %a = math.absf %x : tensor<?xf32>
  %l = math.log %a : tensor<?xf32>
  %s = math.sin %x : tensor<?xf32>
  %m = math.expm1 %x : tensor<?xf32>
  return %e, %t, %l, %s, %m : tensor<?xf32>, tensor<?xf32>, tensor<?xf32>, tensor<?xf32>, tensor<?xf32>
}

func.func @softmax(%x: tensor<?x?xf32>) -> tensor<?x?xf32> {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %d0 = tensor.dim %x, %c0 : tensor<?x?xf32>
  %d1 = tensor.dim %x, %c1 : tensor<?x?xf32>
  %init = tensor.empty(%d0, %d1) : tensor<?x?xf32>
  %r = linalg.softmax dimension(1) ins(%x : tensor<?x?xf32>) outs(%init : tensor<?x?xf32>) -> tensor<?x?xf32>
  return %r : tensor<?x?xf32>
}
