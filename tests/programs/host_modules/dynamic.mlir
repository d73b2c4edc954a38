// Shaped like IREE's samples/custom_module/dynamic: the module is loaded
// from a file with parameters (--module=custom_string.py@create_custom_module?...).
module @example {
  func.func private @custom.string.from_tensor(tensor<?xi8>) -> !custom.string
  func.func private @custom.string.print(!custom.string)
  func.func private @custom.error()

  func.func @main() {
    %hello_bytes = util.unfoldable_constant dense<[0, 1, 2, 3, 4]> : tensor<5xi8>
    %hello_arg = tensor.cast %hello_bytes : tensor<5xi8> to tensor<?xi8>
    %hello_str = call @custom.string.from_tensor(%hello_arg) : (tensor<?xi8>) -> !custom.string
    call @custom.string.print(%hello_str) : (!custom.string) -> ()
    return
  }

  func.func @error() {
    call @custom.error() : () -> ()
    return
  }
}
