// Shaped like IREE's samples/custom_module/static: a tensor crosses into
// the host module as a buffer view.
module @example {
  func.func private @custom.string.from_tensor(tensor<?xi8>) -> !custom.string
  func.func private @custom.string.print(!custom.string)

  func.func @main() {
    %hello_bytes = util.unfoldable_constant dense<[0, 1, 2, 3, 4]> : tensor<5xi8>
    %hello_arg = tensor.cast %hello_bytes : tensor<5xi8> to tensor<?xi8>
    %hello_str = call @custom.string.from_tensor(%hello_arg) : (tensor<?xi8>) -> !custom.string
    call @custom.string.print(%hello_str) : (!custom.string) -> ()
    return
  }
}
