// Element-wise f32 and i32 programs for the VMVX tests: with
// --iree-vmvx-enable-microkernels their dispatches call the vmvx module's
// 2-D ops (add, sub, mul, div, abs, neg, floor, ceil, exp, log, rsqrt and
// the integer ones); without, plain VM bytecode loops.
#id = affine_map<(d0, d1) -> (d0, d1)>
func.func @float_ops(%a: tensor<4x8xf32>, %b: tensor<4x8xf32>) -> (tensor<4x8xf32>, tensor<4x8xf32>) {
  %e = tensor.empty() : tensor<4x8xf32>
  %0:2 = linalg.generic {indexing_maps = [#id, #id, #id, #id], iterator_types = ["parallel", "parallel"]}
      ins(%a, %b : tensor<4x8xf32>, tensor<4x8xf32>) outs(%e, %e : tensor<4x8xf32>, tensor<4x8xf32>) {
  ^bb0(%x: f32, %y: f32, %o: f32, %p: f32):
    %s = arith.addf %x, %y : f32
    %d = arith.subf %x, %y : f32
    %m = arith.mulf %s, %d : f32
    %q = arith.divf %m, %y : f32
    %ab = math.absf %q : f32
    %n = arith.negf %ab : f32
    %ex = math.exp %n : f32
    %fl = math.floor %m : f32
    %ce = math.ceil %q : f32
    %t = arith.addf %fl, %ce : f32
    %l = math.log %s : f32
    %r = math.rsqrt %s : f32
    %u = arith.addf %l, %r : f32
    %v = arith.addf %u, %ex : f32
    linalg.yield %v, %t : f32, f32
  } -> (tensor<4x8xf32>, tensor<4x8xf32>)
  return %0#0, %0#1 : tensor<4x8xf32>, tensor<4x8xf32>
}

func.func @int_ops(%a: tensor<4x8xi32>, %b: tensor<4x8xi32>) -> tensor<4x8xi32> {
  %e = tensor.empty() : tensor<4x8xi32>
  %0 = linalg.generic {indexing_maps = [#id, #id, #id], iterator_types = ["parallel", "parallel"]}
      ins(%a, %b : tensor<4x8xi32>, tensor<4x8xi32>) outs(%e : tensor<4x8xi32>) {
  ^bb0(%x: i32, %y: i32, %o: i32):
    %c31 = arith.constant 31 : i32
    %c1 = arith.constant 1 : i32
    %s = arith.addi %x, %y : i32
    %m = arith.muli %s, %x : i32
    %an = arith.andi %m, %y : i32
    %or = arith.ori %an, %x : i32
    %xo = arith.xori %or, %s : i32
    %sh = arith.andi %y, %c31 : i32
    %l = arith.shli %xo, %sh : i32
    %rs = arith.shrsi %m, %sh : i32
    %ru = arith.shrui %m, %sh : i32
    %den = arith.ori %y, %c1 : i32
    %ds = arith.divsi %m, %den : i32
    %du = arith.divui %ru, %den : i32
    %t0 = arith.subi %l, %rs : i32
    %t1 = arith.addi %t0, %ds : i32
    %t2 = arith.addi %t1, %du : i32
    linalg.yield %t2 : i32
  } -> tensor<4x8xi32>
  return %0 : tensor<4x8xi32>
}

func.func @ctlz_concat(%a: tensor<4x8xi32>, %b: tensor<4x8xi32>) -> tensor<8x8xi32> {
  %e = tensor.empty() : tensor<4x8xi32>
  %z = linalg.generic {indexing_maps = [#id, #id], iterator_types = ["parallel", "parallel"]}
      ins(%a : tensor<4x8xi32>) outs(%e : tensor<4x8xi32>) {
  ^bb0(%x: i32, %o: i32):
    %c = math.ctlz %x : i32
    linalg.yield %c : i32
  } -> tensor<4x8xi32>
  %r = tensor.concat dim(0) %z, %b : (tensor<4x8xi32>, tensor<4x8xi32>) -> tensor<8x8xi32>
  return %r : tensor<8x8xi32>
}

func.func @big_mul_add(%a: tensor<200x300xf32>, %b: tensor<200x300xf32>) -> tensor<200x300xf32> {
  %e = tensor.empty() : tensor<200x300xf32>
  %0 = linalg.generic {indexing_maps = [#id, #id, #id], iterator_types = ["parallel", "parallel"]}
      ins(%a, %b : tensor<200x300xf32>, tensor<200x300xf32>) outs(%e : tensor<200x300xf32>) {
  ^bb0(%x: f32, %y: f32, %o: f32):
    %m = arith.mulf %x, %y : f32
    %s = arith.addf %m, %x : f32
    linalg.yield %s : f32
  } -> tensor<200x300xf32>
  return %0 : tensor<200x300xf32>
}
