// Scalar i32/i64 host code: arithmetic that wraps, division, shifts,
// comparisons, select, casts between widths.
func.func @add_i32(%a: i32, %b: i32) -> i32 {
  %0 = arith.addi %a, %b : i32
  return %0 : i32
}
func.func @arith_i32(%a: i32, %b: i32) -> (i32, i32, i32, i32, i32) {
  %0 = arith.subi %a, %b : i32
  %1 = arith.muli %a, %b : i32
  %2 = arith.andi %a, %b : i32
  %3 = arith.ori %a, %b : i32
  %4 = arith.xori %a, %b : i32
  return %0, %1, %2, %3, %4 : i32, i32, i32, i32, i32
}
func.func @div_i32(%a: i32, %b: i32) -> (i32, i32, i32, i32) {
  %0 = arith.divsi %a, %b : i32
  %1 = arith.remsi %a, %b : i32
  %2 = arith.divui %a, %b : i32
  %3 = arith.remui %a, %b : i32
  return %0, %1, %2, %3 : i32, i32, i32, i32
}
func.func @shifts_i32(%a: i32, %b: i32) -> (i32, i32, i32) {
  %0 = arith.shli %a, %b : i32
  %1 = arith.shrsi %a, %b : i32
  %2 = arith.shrui %a, %b : i32
  return %0, %1, %2 : i32, i32, i32
}
func.func @cmp_i32(%a: i32, %b: i32) -> (i1, i1, i1, i1, i1, i1) {
  %0 = arith.cmpi slt, %a, %b : i32
  %1 = arith.cmpi ult, %a, %b : i32
  %2 = arith.cmpi sge, %a, %b : i32
  %3 = arith.cmpi ugt, %a, %b : i32
  %4 = arith.cmpi eq, %a, %b : i32
  %5 = arith.cmpi ne, %a, %b : i32
  return %0, %1, %2, %3, %4, %5 : i1, i1, i1, i1, i1, i1
}
func.func @minmax_i32(%a: i32, %b: i32) -> (i32, i32, i32, i32, i32) {
  %0 = arith.minsi %a, %b : i32
  %1 = arith.maxsi %a, %b : i32
  %2 = arith.minui %a, %b : i32
  %3 = arith.maxui %a, %b : i32
  %c = arith.cmpi slt, %a, %b : i32
  %4 = arith.select %c, %a, %b : i32
  return %0, %1, %2, %3, %4 : i32, i32, i32, i32, i32
}
func.func @arith_i64(%a: i64, %b: i64) -> (i64, i64, i64, i64, i64, i64) {
  %0 = arith.addi %a, %b : i64
  %1 = arith.subi %a, %b : i64
  %2 = arith.muli %a, %b : i64
  %3 = arith.andi %a, %b : i64
  %4 = arith.ori %a, %b : i64
  %5 = arith.xori %a, %b : i64
  return %0, %1, %2, %3, %4, %5 : i64, i64, i64, i64, i64, i64
}
func.func @div_i64(%a: i64, %b: i64) -> (i64, i64, i64, i64) {
  %0 = arith.divsi %a, %b : i64
  %1 = arith.remsi %a, %b : i64
  %2 = arith.divui %a, %b : i64
  %3 = arith.remui %a, %b : i64
  return %0, %1, %2, %3 : i64, i64, i64, i64
}
func.func @shifts_i64(%a: i64, %b: i64) -> (i64, i64, i64) {
  %0 = arith.shli %a, %b : i64
  %1 = arith.shrsi %a, %b : i64
  %2 = arith.shrui %a, %b : i64
  return %0, %1, %2 : i64, i64, i64
}
func.func @cmp_i64(%a: i64, %b: i64) -> (i1, i1, i1, i1, i1) {
  %0 = arith.cmpi slt, %a, %b : i64
  %1 = arith.cmpi ult, %a, %b : i64
  %2 = arith.cmpi sge, %a, %b : i64
  %3 = arith.cmpi eq, %a, %b : i64
  %4 = arith.cmpi ne, %a, %b : i64
  return %0, %1, %2, %3, %4 : i1, i1, i1, i1, i1
}
func.func @widths(%a: i32, %b: i64) -> (i64, i64, i32, i32, i32, i32, i32) {
  %0 = arith.extsi %a : i32 to i64
  %1 = arith.extui %a : i32 to i64
  %2 = arith.trunci %b : i64 to i32
  %t8 = arith.trunci %a : i32 to i8
  %3 = arith.extsi %t8 : i8 to i32
  %4 = arith.extui %t8 : i8 to i32
  %t16 = arith.trunci %a : i32 to i16
  %5 = arith.extsi %t16 : i16 to i32
  %6 = arith.extui %t16 : i16 to i32
  return %0, %1, %2, %3, %4, %5, %6 : i64, i64, i32, i32, i32, i32, i32
}
func.func @mixed(%a: i32, %b: i64, %c: i32, %d: i64) -> (i64, i32) {
  %0 = arith.extsi %a : i32 to i64
  %1 = arith.addi %0, %b : i64
  %2 = arith.muli %1, %d : i64
  %3 = arith.trunci %2 : i64 to i32
  %4 = arith.addi %3, %c : i32
  return %2, %4 : i64, i32
}
func.func @ctlz(%a: i32, %b: i64) -> (i32, i64) {
  %0 = math.ctlz %a : i32
  %1 = math.ctlz %b : i64
  return %0, %1 : i32, i64
}
func.func @abs_i(%a: i32, %b: i64) -> (i32, i64) {
  %0 = math.absi %a : i32
  %1 = math.absi %b : i64
  return %0, %1 : i32, i64
}
