// Host code that never ends: a loop whose exit the input never reaches
// (tests/test_vm_programs.py).
func.func @spin(%n: i32) -> i32 {
  %c1 = arith.constant 1 : i32
  %c3 = arith.constant 3 : i32
  %stop = arith.constant -1 : i32
  %r = scf.while (%x = %n) : (i32) -> i32 {
    %go = arith.cmpi ne, %x, %stop : i32
    scf.condition(%go) %x : i32
  } do {
  ^bb0(%x: i32):
    %m = arith.muli %x, %c3 : i32
    %a = arith.addi %m, %c1 : i32
    %c = arith.constant 65535 : i32
    %y = arith.andi %a, %c : i32
    scf.yield %y : i32
  }
  return %r : i32
}

// A buffer as large as the input says.
func.func @sized(%n: index) -> tensor<?xf32> {
  %e = tensor.empty(%n) : tensor<?xf32>
  %c = arith.constant 1.5 : f32
  %f = linalg.fill ins(%c : f32) outs(%e : tensor<?xf32>) -> tensor<?xf32>
  return %f : tensor<?xf32>
}
