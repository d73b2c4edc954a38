// Host code on the VM's own ref types: !util.list (vm.list.*) and
// !util.buffer (vm.buffer.*).
func.func @list_sum(%n: i32) -> (i32, i32) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %nn = arith.index_cast %n : i32 to index
  %list = util.list.create %nn : !util.list<i32>
  util.list.resize %list, %nn : !util.list<i32>
  scf.for %i = %c0 to %nn step %c1 {
    %v = arith.index_cast %i : index to i32
    %sq = arith.muli %v, %v : i32
    util.list.set %list[%i], %sq : !util.list<i32>
  }
  %z = arith.constant 0 : i32
  %s = scf.for %i = %c0 to %nn step %c1 iter_args(%acc = %z) -> i32 {
    %v = util.list.get %list[%i] : !util.list<i32>
    %a = arith.addi %acc, %v : i32
    scf.yield %a : i32
  }
  %size = util.list.size %list : !util.list<i32>
  %sz = arith.index_cast %size : index to i32
  return %s, %sz : i32, i32
}

func.func @buffer_ops(%a: i32, %b: i64, %f: f32) -> (i32, i64, f32, i32, i8, i16, i32, i64, i64) {
  %c0 = arith.constant 0 : index
  %c4 = arith.constant 4 : index
  %c8 = arith.constant 8 : index
  %c16 = arith.constant 16 : index
  %c24 = arith.constant 24 : index
  %c32 = arith.constant 32 : index
  %buf = util.buffer.alloc uninitialized : !util.buffer{%c32}
  util.buffer.store %a, %buf[%c0 for %c4] : i32 -> !util.buffer{%c32}
  util.buffer.store %b, %buf[%c8 for %c8] : i64 -> !util.buffer{%c32}
  util.buffer.store %f, %buf[%c16 for %c4] : f32 -> !util.buffer{%c32}
  %x = util.buffer.load %buf[%c0 for %c4] : !util.buffer{%c32} -> i32
  %y = util.buffer.load %buf[%c8 for %c8] : !util.buffer{%c32} -> i64
  %g = util.buffer.load %buf[%c16 for %c4] : !util.buffer{%c32} -> f32
  %copy = util.buffer.alloc uninitialized : !util.buffer{%c32}
  util.buffer.copy %buf[%c0], %copy[%c0], %c24 : !util.buffer{%c32} -> !util.buffer{%c32}
  %eq = util.buffer.compare %buf[%c0], %copy[%c0], %c24 : !util.buffer{%c32}, !util.buffer{%c32}
  %eqi = arith.extui %eq : i1 to i32
  %lo = util.buffer.load %buf[%c0 for %c4] : !util.buffer{%c32} -> i8
  %c2 = arith.constant 2 : index
  %mid = util.buffer.load %buf[%c0 for %c2] : !util.buffer{%c32} -> i16
  %sz = util.buffer.size %buf : !util.buffer
  %szi = arith.index_cast %sz : index to i32
  %h = util.buffer.hash %buf[%c0 for %c24] : !util.buffer{%c32} -> i64
  %c5 = arith.constant 5 : index
  %c1 = arith.constant 1 : index
  %h2 = util.buffer.hash %buf[%c1 for %c5] : !util.buffer{%c32} -> i64
  return %x, %y, %g, %eqi, %lo, %mid, %szi, %h, %h2 : i32, i64, f32, i32, i8, i16, i32, i64, i64
}
