// Calls `simple_mul_workgroup` from an executable plugin, then adds the second
// operand with ordinary generated code:  result = a * b + b.
//
// The import is declared with the same signature and attributes as IREE's
// samples/custom_dispatch/cpu/plugin/standalone_example.mlir so the plugin
// sees this parameter struct (index == pointer-sized integer):
//
//   struct { const float* binding0; size_t binding0_offset;
//            const float* binding1; size_t binding1_offset;
//            float* binding2;       size_t binding2_offset;
//            size_t dim; size_t tid;
//            uint32_t processor_id; const uint64_t* processor_data; }
//
// `tid` is the x workgroup id; each workgroup handles 64 elements.
//
// Compile and run, for example:
//   iree-compile sample_plugins/standalone_example.mlir \
//     --iree-hal-target-device=local \
//     --iree-hal-local-target-device-backends=llvm-cpu \
//     --iree-llvmcpu-target-triple=x86_64-pc-linux-elf \
//     --iree-llvmcpu-target-cpu=generic -o /tmp/standalone_example.vmfb
//   iree-run-module --device=local-sync --module=/tmp/standalone_example.vmfb \
//     --function=mixed_invocation --input=8xf32=2 --input=8xf32=4 \
//     --executable_plugin=sample_plugins/prebuilt/standalone.sos
//   -> 8xf32=12 12 12 12 12 12 12 12

module @standalone_example {

  stream.executable private @plugin_mul {
    // One workgroup per 64 elements of the dynamic dimension.
    stream.executable.export public @mul workgroups(%n: index) -> (index, index, index) {
      %groups = affine.apply affine_map<()[s0] -> (s0 ceildiv 64)>()[%n]
      %one = arith.constant 1 : index
      stream.return %groups, %one, %one : index, index, index
    }

    builtin.module {
      // Resolved at load time through the executable plugin manager.
      func.func private @simple_mul_workgroup(
          %lhs: memref<f32>, %lhs_offset: index,
          %rhs: memref<f32>, %rhs_offset: index,
          %out: memref<f32>, %out_offset: index,
          %dim: index, %tid: index) attributes {
        hal.import.fields = ["processor_id", "processor_data"],
        llvm.bareptr = true
      }

      func.func @mul(%lhs_binding: !stream.binding,
                     %rhs_binding: !stream.binding,
                     %out_binding: !stream.binding,
                     %dim: index) {
        %c0 = arith.constant 0 : index
        %wg = stream.dispatch.workgroup.id[0] : index

        %lhs = stream.binding.subspan %lhs_binding[%c0] : !stream.binding -> memref<?xf32>{%dim}
        %rhs = stream.binding.subspan %rhs_binding[%c0] : !stream.binding -> memref<?xf32>{%dim}
        %out = stream.binding.subspan %out_binding[%c0] : !stream.binding -> memref<?xf32>{%dim}

        // Only base pointers and element offsets cross into the plugin.
        %lhs_base, %lhs_off, %lhs_size, %lhs_stride = iree_codegen.extract_strided_metadata %lhs
            : memref<?xf32> -> memref<f32>, index, index, index
        %rhs_base, %rhs_off, %rhs_size, %rhs_stride = iree_codegen.extract_strided_metadata %rhs
            : memref<?xf32> -> memref<f32>, index, index, index
        %out_base, %out_off, %out_size, %out_stride = iree_codegen.extract_strided_metadata %out
            : memref<?xf32> -> memref<f32>, index, index, index

        func.call @simple_mul_workgroup(%lhs_base, %lhs_off, %rhs_base, %rhs_off,
                                        %out_base, %out_off, %dim, %wg)
            : (memref<f32>, index, memref<f32>, index, memref<f32>, index, index, index) -> ()
        return
      }
    }
  }

  // a * b (plugin) + b (generated code).
  func.func @mixed_invocation(%a: tensor<?xf32>, %b: tensor<?xf32>) -> tensor<?xf32> {
    %c0 = arith.constant 0 : index
    %n = tensor.dim %a, %c0 : tensor<?xf32>
    %prod = flow.dispatch @plugin_mul::@mul[%n](%a, %b, %n)
        : (tensor<?xf32>{%n}, tensor<?xf32>{%n}, index) -> tensor<?xf32>{%n}
    %sum = arith.addf %prod, %b : tensor<?xf32>
    return %sum : tensor<?xf32>
  }
}
