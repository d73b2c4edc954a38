// Shaped like IREE's samples/custom_module/basic: a string type and
// functions of a host module named "custom" (custom_string.py).
module @example {
  func.func private @custom.string.create(!util.buffer) -> !custom.string
  func.func private @custom.string.length(!custom.string) -> index attributes {
    vm.signature = (!vm.ref<!custom.string>) -> i64
  }
  func.func private @custom.string.print(!custom.string)
  // optional: when no module provides it, @custom_string_dprint runs
  func.func private @custom.string.dprint(!custom.string) attributes {
    vm.fallback = @custom_string_dprint
  }
  func.func private @custom_string_dprint(%ignored: !custom.string) {
    %data = util.buffer.constant : !util.buffer = "optimized"
    %str = call @custom.string.create(%data) : (!util.buffer) -> !custom.string
    call @custom.string.print(%str) : (!custom.string) -> ()
    return
  }

  func.func @main() {
    %hello_data = util.buffer.constant : !util.buffer = "hello"
    %hello_str = call @custom.string.create(%hello_data) : (!util.buffer) -> !custom.string
    call @custom.string.print(%hello_str) : (!custom.string) -> ()
    %strlen = call @custom.string.length(%hello_str) : (!custom.string) -> index
    util.optimization_barrier %strlen : index
    %debug_data = util.buffer.constant : !util.buffer = "debug"
    %debug_str = call @custom.string.create(%debug_data) : (!util.buffer) -> !custom.string
    call @custom.string.dprint(%debug_str) : (!custom.string) -> ()
    return
  }
}
