// Calls the stateful imports of standalone_plugin.c, whose behaviour comes
// from the plugin's load parameters (bias=..., scale=...):
//
//   @add_bias(x)  = param_add_workgroup(x)   = x + bias   (bias default 0)
//   @scale(x)     = param_scale_workgroup(x) = x * scale  (scale default 1)
//
// Both imports take this parameter struct (index == pointer-sized integer):
//
//   struct { const float* binding0; size_t binding0_offset;
//            float* binding1;       size_t binding1_offset;
//            size_t dim; size_t tid; }
//
// and process the 64-element tile of x workgroup `tid`.  iree-run-module
// passes no load parameters to plugins, so under IREE's own tools both
// functions return their input unchanged.

module @param_example {

  stream.executable private @param_exec {
    stream.executable.export public @add_bias workgroups(%n: index) -> (index, index, index) {
      %groups = affine.apply affine_map<()[s0] -> (s0 ceildiv 64)>()[%n]
      %one = arith.constant 1 : index
      stream.return %groups, %one, %one : index, index, index
    }
    stream.executable.export public @scale workgroups(%n: index) -> (index, index, index) {
      %groups = affine.apply affine_map<()[s0] -> (s0 ceildiv 64)>()[%n]
      %one = arith.constant 1 : index
      stream.return %groups, %one, %one : index, index, index
    }

    builtin.module {
      func.func private @param_add_workgroup(
          %in: memref<f32>, %in_offset: index,
          %out: memref<f32>, %out_offset: index,
          %dim: index, %tid: index) attributes {
        llvm.bareptr = true
      }
      func.func private @param_scale_workgroup(
          %in: memref<f32>, %in_offset: index,
          %out: memref<f32>, %out_offset: index,
          %dim: index, %tid: index) attributes {
        llvm.bareptr = true
      }

      func.func @add_bias(%in_binding: !stream.binding,
                          %out_binding: !stream.binding,
                          %dim: index) {
        %c0 = arith.constant 0 : index
        %wg = stream.dispatch.workgroup.id[0] : index
        %in = stream.binding.subspan %in_binding[%c0] : !stream.binding -> memref<?xf32>{%dim}
        %out = stream.binding.subspan %out_binding[%c0] : !stream.binding -> memref<?xf32>{%dim}
        %in_base, %in_off, %in_size, %in_stride = iree_codegen.extract_strided_metadata %in
            : memref<?xf32> -> memref<f32>, index, index, index
        %out_base, %out_off, %out_size, %out_stride = iree_codegen.extract_strided_metadata %out
            : memref<?xf32> -> memref<f32>, index, index, index
        func.call @param_add_workgroup(%in_base, %in_off, %out_base, %out_off, %dim, %wg)
            : (memref<f32>, index, memref<f32>, index, index, index) -> ()
        return
      }

      func.func @scale(%in_binding: !stream.binding,
                       %out_binding: !stream.binding,
                       %dim: index) {
        %c0 = arith.constant 0 : index
        %wg = stream.dispatch.workgroup.id[0] : index
        %in = stream.binding.subspan %in_binding[%c0] : !stream.binding -> memref<?xf32>{%dim}
        %out = stream.binding.subspan %out_binding[%c0] : !stream.binding -> memref<?xf32>{%dim}
        %in_base, %in_off, %in_size, %in_stride = iree_codegen.extract_strided_metadata %in
            : memref<?xf32> -> memref<f32>, index, index, index
        %out_base, %out_off, %out_size, %out_stride = iree_codegen.extract_strided_metadata %out
            : memref<?xf32> -> memref<f32>, index, index, index
        func.call @param_scale_workgroup(%in_base, %in_off, %out_base, %out_off, %dim, %wg)
            : (memref<f32>, index, memref<f32>, index, index, index) -> ()
        return
      }
    }
  }

  func.func @add_bias(%x: tensor<?xf32>) -> tensor<?xf32> {
    %c0 = arith.constant 0 : index
    %n = tensor.dim %x, %c0 : tensor<?xf32>
    %y = flow.dispatch @param_exec::@add_bias[%n](%x, %n)
        : (tensor<?xf32>{%n}, index) -> tensor<?xf32>{%n}
    return %y : tensor<?xf32>
  }

  func.func @scale(%x: tensor<?xf32>) -> tensor<?xf32> {
    %c0 = arith.constant 0 : index
    %n = tensor.dim %x, %c0 : tensor<?xf32>
    %y = flow.dispatch @param_exec::@scale[%n](%x, %n)
        : (tensor<?xf32>{%n}, index) -> tensor<?xf32>{%n}
    return %y : tensor<?xf32>
  }
}
