// Host control flow: loops (scf.while, scf.for), calls between functions
// (recursion included), mutable globals, asserts.
util.global private mutable @counter = 0 : i32
util.global private mutable @total = 0 : i64
util.global private mutable @scale = 1.5 : f32

func.func @gcd(%a: i64, %b: i64) -> i64 {
  %c0 = arith.constant 0 : i64
  %r:2 = scf.while (%x = %a, %y = %b) : (i64, i64) -> (i64, i64) {
    %more = arith.cmpi ne, %y, %c0 : i64
    scf.condition(%more) %x, %y : i64, i64
  } do {
  ^bb0(%x: i64, %y: i64):
    %m = arith.remsi %x, %y : i64
    scf.yield %y, %m : i64, i64
  }
  return %r#0 : i64
}

// Calls another function twice.
func.func private @sq(%x: i64, %k: i32) -> (i64, i32) {
  %0 = arith.muli %x, %x : i64
  %1 = arith.addi %k, %k : i32
  return %0, %1 : i64, i32
}
func.func @calls(%x: i64, %k: i32) -> (i64, i32) {
  %a:2 = func.call @sq(%x, %k) : (i64, i32) -> (i64, i32)
  %b:2 = func.call @sq(%a#0, %a#1) : (i64, i32) -> (i64, i32)
  return %b#0, %b#1 : i64, i32
}

// Collatz steps: a while loop with two carried values.
func.func @collatz(%n: i32) -> i32 {
  %c0 = arith.constant 0 : i32
  %c1 = arith.constant 1 : i32
  %c2 = arith.constant 2 : i32
  %c3 = arith.constant 3 : i32
  %r:2 = scf.while (%x = %n, %steps = %c0) : (i32, i32) -> (i32, i32) {
    %more = arith.cmpi sgt, %x, %c1 : i32
    scf.condition(%more) %x, %steps : i32, i32
  } do {
  ^bb0(%x: i32, %steps: i32):
    %odd = arith.andi %x, %c1 : i32
    %isodd = arith.cmpi ne, %odd, %c0 : i32
    %half = arith.divsi %x, %c2 : i32
    %t = arith.muli %x, %c3 : i32
    %t1 = arith.addi %t, %c1 : i32
    %next = arith.select %isodd, %t1, %half : i32
    %s1 = arith.addi %steps, %c1 : i32
    scf.yield %next, %s1 : i32, i32
  }
  return %r#1 : i32
}

// A loop carrying i64, f32 and i32 values that swap places each step.
func.func @swap_loop(%n: i32, %a: i64, %b: i64, %f: f32) -> (i64, i64, f32, i32) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %nn = arith.index_cast %n : i32 to index
  %half = arith.constant 0.5 : f32
  %r:4 = scf.for %i = %c0 to %nn step %c1 iter_args(%x = %a, %y = %b, %g = %f, %k = %n) -> (i64, i64, f32, i32) {
    %s = arith.addi %x, %y : i64
    %g2 = arith.mulf %g, %half : f32
    %g3 = arith.addf %g2, %g : f32
    %k2 = arith.xori %k, %n : i32
    scf.yield %y, %s, %g3, %k2 : i64, i64, f32, i32
  }
  return %r#0, %r#1, %r#2, %r#3 : i64, i64, f32, i32
}

// Sum of i*i over a nested loop, accumulating in an f64 and an i64.
func.func @nested(%n: i32) -> (i64, f64) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %nn = arith.index_cast %n : i32 to index
  %z = arith.constant 0 : i64
  %zf = arith.constant 0.0 : f64
  %r:2 = scf.for %i = %c0 to %nn step %c1 iter_args(%acc = %z, %accf = %zf) -> (i64, f64) {
    %r2:2 = scf.for %j = %c0 to %i step %c1 iter_args(%a2 = %acc, %f2 = %accf) -> (i64, f64) {
      %ij = arith.muli %i, %j : index
      %v = arith.index_cast %ij : index to i64
      %s = arith.addi %a2, %v : i64
      %vf = arith.sitofp %v : i64 to f64
      %sf = arith.addf %f2, %vf : f64
      scf.yield %s, %sf : i64, f64
    }
    scf.yield %r2#0, %r2#1 : i64, f64
  }
  return %r#0, %r#1 : i64, f64
}

// Globals: counts calls, keeps a running total and a scale.
func.func @bump(%x: i64) -> (i32, i64, f32) {
  %c = util.global.load @counter : i32
  %one = arith.constant 1 : i32
  %c2 = arith.addi %c, %one : i32
  util.global.store %c2, @counter : i32
  %t = util.global.load @total : i64
  %t2 = arith.addi %t, %x : i64
  util.global.store %t2, @total : i64
  %s = util.global.load @scale : f32
  %two = arith.constant 2.0 : f32
  %s2 = arith.mulf %s, %two : f32
  util.global.store %s2, @scale : f32
  return %c2, %t2, %s2 : i32, i64, f32
}

// Fails (vm.fail) when x is negative.
func.func @checked(%x: i32) -> i32 {
  %c0 = arith.constant 0 : i32
  %ok = arith.cmpi sge, %x, %c0 : i32
  cf.assert %ok, "x must not be negative"
  %y = arith.addi %x, %x : i32
  return %y : i32
}

// A multi-way branch (vm.br_table or a chain of cond_br).
func.func @switch(%x: i32) -> i32 {
  %i = arith.index_cast %x : i32 to index
  %r = scf.index_switch %i -> i32
  case 0 {
    %a = arith.constant 10 : i32
    scf.yield %a : i32
  }
  case 1 {
    %b = arith.constant 20 : i32
    scf.yield %b : i32
  }
  case 5 {
    %c = arith.constant 55 : i32
    scf.yield %c : i32
  }
  default {
    %d = arith.constant -1 : i32
    scf.yield %d : i32
  }
  return %r : i32
}
