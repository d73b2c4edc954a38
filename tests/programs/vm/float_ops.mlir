// Scalar f32/f64 host code: arithmetic rounded to f32, comparisons with
// NaN, math functions, casts to and from integers.
func.func @arith_f32(%a: f32, %b: f32) -> (f32, f32, f32, f32, f32) {
  %0 = arith.addf %a, %b : f32
  %1 = arith.subf %a, %b : f32
  %2 = arith.mulf %a, %b : f32
  %3 = arith.divf %a, %b : f32
  %4 = arith.remf %a, %b : f32
  return %0, %1, %2, %3, %4 : f32, f32, f32, f32, f32
}
func.func @arith_f64(%a: f64, %b: f64) -> (f64, f64, f64, f64, f64) {
  %0 = arith.addf %a, %b : f64
  %1 = arith.subf %a, %b : f64
  %2 = arith.mulf %a, %b : f64
  %3 = arith.divf %a, %b : f64
  %4 = arith.remf %a, %b : f64
  return %0, %1, %2, %3, %4 : f64, f64, f64, f64, f64
}
func.func @cmp_f32(%a: f32, %b: f32) -> (i1, i1, i1, i1, i1, i1, i1, i1) {
  %0 = arith.cmpf oeq, %a, %b : f32
  %1 = arith.cmpf ueq, %a, %b : f32
  %2 = arith.cmpf one, %a, %b : f32
  %3 = arith.cmpf une, %a, %b : f32
  %4 = arith.cmpf olt, %a, %b : f32
  %5 = arith.cmpf ule, %a, %b : f32
  %6 = arith.cmpf ogt, %a, %b : f32
  %7 = arith.cmpf uno, %a, %b : f32
  return %0, %1, %2, %3, %4, %5, %6, %7 : i1, i1, i1, i1, i1, i1, i1, i1
}
func.func @cmp_f64(%a: f64, %b: f64) -> (i1, i1, i1, i1, i1) {
  %0 = arith.cmpf oeq, %a, %b : f64
  %1 = arith.cmpf une, %a, %b : f64
  %2 = arith.cmpf olt, %a, %b : f64
  %3 = arith.cmpf uge, %a, %b : f64
  %4 = arith.cmpf ord, %a, %b : f64
  return %0, %1, %2, %3, %4 : i1, i1, i1, i1, i1
}
func.func @unary_f32(%a: f32) -> (f32, f32, f32, f32, f32, f32) {
  %0 = math.absf %a : f32
  %1 = arith.negf %a : f32
  %2 = math.ceil %a : f32
  %3 = math.floor %a : f32
  %4 = math.round %a : f32
  %5 = math.roundeven %a : f32
  return %0, %1, %2, %3, %4, %5 : f32, f32, f32, f32, f32, f32
}
func.func @unary_f64(%a: f64) -> (f64, f64, f64, f64, f64, f64) {
  %0 = math.absf %a : f64
  %1 = arith.negf %a : f64
  %2 = math.ceil %a : f64
  %3 = math.floor %a : f64
  %4 = math.round %a : f64
  %5 = math.roundeven %a : f64
  return %0, %1, %2, %3, %4, %5 : f64, f64, f64, f64, f64, f64
}
func.func @math_f32(%a: f32, %b: f32) -> (f32, f32, f32, f32, f32, f32, f32, f32, f32, f32) {
  %0 = math.exp %a : f32
  %1 = math.log %a : f32
  %2 = math.sqrt %a : f32
  %3 = math.rsqrt %a : f32
  %4 = math.tanh %a : f32
  %5 = math.sin %a : f32
  %6 = math.cos %a : f32
  %7 = math.atan2 %a, %b : f32
  %8 = math.powf %a, %b : f32
  %9 = math.erf %a : f32
  return %0, %1, %2, %3, %4, %5, %6, %7, %8, %9 : f32, f32, f32, f32, f32, f32, f32, f32, f32, f32
}
func.func @math_f64(%a: f64, %b: f64) -> (f64, f64, f64, f64, f64, f64, f64, f64, f64, f64) {
  %0 = math.exp %a : f64
  %1 = math.log %a : f64
  %2 = math.sqrt %a : f64
  %3 = math.rsqrt %a : f64
  %4 = math.tanh %a : f64
  %5 = math.sin %a : f64
  %6 = math.cos %a : f64
  %7 = math.atan2 %a, %b : f64
  %8 = math.powf %a, %b : f64
  %9 = math.log1p %a : f64
  return %0, %1, %2, %3, %4, %5, %6, %7, %8, %9 : f64, f64, f64, f64, f64, f64, f64, f64, f64, f64
}
func.func @minmax_f32(%a: f32, %b: f32) -> (f32, f32, f32) {
  %0 = arith.minimumf %a, %b : f32
  %1 = arith.maximumf %a, %b : f32
  %c = arith.cmpf olt, %a, %b : f32
  %2 = arith.select %c, %a, %b : f32
  return %0, %1, %2 : f32, f32, f32
}
func.func @casts_f32(%a: f32, %i: i32, %l: i64) -> (i32, i32, i64, f32, f32, f32, f32, i32, f32, f64) {
  %0 = arith.fptosi %a : f32 to i32
  %1 = arith.fptoui %a : f32 to i32
  %2 = arith.fptosi %a : f32 to i64
  %3 = arith.sitofp %i : i32 to f32
  %4 = arith.uitofp %i : i32 to f32
  %5 = arith.sitofp %l : i64 to f32
  %6 = arith.uitofp %l : i64 to f32
  %7 = arith.bitcast %a : f32 to i32
  %8 = arith.bitcast %i : i32 to f32
  %9 = arith.extf %a : f32 to f64
  return %0, %1, %2, %3, %4, %5, %6, %7, %8, %9 : i32, i32, i64, f32, f32, f32, f32, i32, f32, f64
}
func.func @casts_f64(%a: f64, %l: i64) -> (i64, f64) {
  %0 = arith.bitcast %a : f64 to i64
  %1 = arith.bitcast %l : i64 to f64
  return %0, %1 : i64, f64
}
func.func @fma_f32(%a: f32, %b: f32, %c: f32) -> f32 {
  %0 = math.fma %a, %b, %c : f32
  return %0 : f32
}
