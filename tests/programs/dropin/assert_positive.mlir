// A function that fails with a status when its input is not positive:
// iree-run-module prints FAILED_PRECONDITION; x must be positive, and so
// does hal-cpu run-module (one line naming the .vmfb).
func.func @f(%x: i32) -> i32 {
  %c0 = arith.constant 0 : i32
  %ok = arith.cmpi sgt, %x, %c0 : i32
  cf.assert %ok, "x must be positive"
  return %x : i32
}
