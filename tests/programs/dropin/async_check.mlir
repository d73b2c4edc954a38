// A test program compiled with --iree-execution-model=async-external: each
// function takes a wait fence and a signal fence only, which
// check-module makes and waits on as IREE's tools do.
//
//   hal-cpu check-module async_check.mlir \
//     --compile_flag=--iree-execution-model=async-external

func.func @mul_add_matches() {
  %a = util.unfoldable_constant dense<[1.0, 2.0, 3.0, 4.0]> : tensor<4xf32>
  %b = util.unfoldable_constant dense<2.0> : tensor<4xf32>
  %0 = arith.mulf %a, %b : tensor<4xf32>
  %1 = arith.addf %0, %b : tensor<4xf32>
  check.expect_almost_eq_const(%1, dense<[4.0, 6.0, 8.0, 10.0]> : tensor<4xf32>) : tensor<4xf32>
  return
}

func.func @sum_matches() {
  %a = util.unfoldable_constant dense<[1, 2, 3, 4]> : tensor<4xi32>
  %zero = arith.constant dense<0> : tensor<i32>
  %sum = linalg.reduce ins(%a : tensor<4xi32>) outs(%zero : tensor<i32>) dimensions = [0]
    (%x: i32, %acc: i32) {
      %s = arith.addi %x, %acc : i32
      linalg.yield %s : i32
    }
  check.expect_eq_const(%sum, dense<10> : tensor<i32>) : tensor<i32>
  return
}

// CHECK: PASS @mul_add_matches
// CHECK: PASS @sum_matches
// CHECK: 2 of 2 functions passed
