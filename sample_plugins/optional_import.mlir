// An executable whose plugin imports are all optional.
//
// IREE's compiler (3.x) has no attribute that marks a func.call import as
// weak/optional (ConvertToLLVM always passes weak=false), but it honours
// `hal.import.name` as the exact import-table key.  The runtime treats any
// import-table name starting with `?` as optional: resolution leaves it NULL
// and reports MISSING_OPTIONAL instead of failing the executable load.  So
// naming the import "?name" is how an optional import is spelled here.
//
// Nothing in MLIR can test whether an optional import resolved, so the
// caller selects the path with `mode`:
//   mode 0: generated-code fallback, out = a * b (no plugin needed)
//   mode 1: calls "?simple_mul_workgroup" (only valid when a plugin provides
//           it, e.g. prebuilt/standalone.sos; standalone_alt.sos adds 1000)
//   mode 2: calls "?missing_fn" (no sample plugin provides it; calling it
//           while unresolved jumps through a NULL import)
// The import table of this executable is therefore
//   ["?missing_fn", "?simple_mul_workgroup"]   (sorted)
// and it loads with no plugin at all, or with plugins that lack either name.
//
// Public function:  @optional_mul(a, b, mode: i32) -> a*b (+1000 for alt, mode 1)

module @optional_import {

  stream.executable private @optional_exec {
    stream.executable.export public @maybe_mul workgroups(%n: index) -> (index, index, index) {
      %groups = affine.apply affine_map<()[s0] -> (s0 ceildiv 64)>()[%n]
      %one = arith.constant 1 : index
      stream.return %groups, %one, %one : index, index, index
    }

    builtin.module {
      func.func private @opt_simple_mul(
          %lhs: memref<f32>, %lhs_offset: index,
          %rhs: memref<f32>, %rhs_offset: index,
          %out: memref<f32>, %out_offset: index,
          %dim: index, %tid: index) attributes {
        hal.import.name = "?simple_mul_workgroup",
        hal.import.fields = ["processor_id", "processor_data"],
        llvm.bareptr = true
      }
      func.func private @opt_missing(
          %lhs: memref<f32>, %lhs_offset: index,
          %rhs: memref<f32>, %rhs_offset: index,
          %out: memref<f32>, %out_offset: index,
          %dim: index, %tid: index) attributes {
        hal.import.name = "?missing_fn",
        hal.import.fields = ["processor_id", "processor_data"],
        llvm.bareptr = true
      }

      func.func @maybe_mul(%lhs_binding: !stream.binding,
                           %rhs_binding: !stream.binding,
                           %out_binding: !stream.binding,
                           %dim: index, %mode: index) {
        %c0 = arith.constant 0 : index
        %c1 = arith.constant 1 : index
        %c2 = arith.constant 2 : index
        %c64 = arith.constant 64 : index
        %wg = stream.dispatch.workgroup.id[0] : index

        %lhs = stream.binding.subspan %lhs_binding[%c0] : !stream.binding -> memref<?xf32>{%dim}
        %rhs = stream.binding.subspan %rhs_binding[%c0] : !stream.binding -> memref<?xf32>{%dim}
        %out = stream.binding.subspan %out_binding[%c0] : !stream.binding -> memref<?xf32>{%dim}

        %is_plugin = arith.cmpi eq, %mode, %c1 : index
        %is_missing = arith.cmpi eq, %mode, %c2 : index
        %use_import = arith.ori %is_plugin, %is_missing : i1
        scf.if %use_import {
          %lhs_base, %lhs_off, %lhs_size, %lhs_stride = iree_codegen.extract_strided_metadata %lhs
              : memref<?xf32> -> memref<f32>, index, index, index
          %rhs_base, %rhs_off, %rhs_size, %rhs_stride = iree_codegen.extract_strided_metadata %rhs
              : memref<?xf32> -> memref<f32>, index, index, index
          %out_base, %out_off, %out_size, %out_stride = iree_codegen.extract_strided_metadata %out
              : memref<?xf32> -> memref<f32>, index, index, index
          scf.if %is_plugin {
            func.call @opt_simple_mul(%lhs_base, %lhs_off, %rhs_base, %rhs_off,
                                      %out_base, %out_off, %dim, %wg)
                : (memref<f32>, index, memref<f32>, index, memref<f32>, index, index, index) -> ()
          } else {
            func.call @opt_missing(%lhs_base, %lhs_off, %rhs_base, %rhs_off,
                                   %out_base, %out_off, %dim, %wg)
                : (memref<f32>, index, memref<f32>, index, memref<f32>, index, index, index) -> ()
          }
        } else {
          // Fallback: this workgroup's 64-element tile in generated code.
          %begin = arith.muli %wg, %c64 : index
          %limit = arith.addi %begin, %c64 : index
          %end = arith.minui %limit, %dim : index
          scf.for %i = %begin to %end step %c1 {
            %x = memref.load %lhs[%i] : memref<?xf32>
            %y = memref.load %rhs[%i] : memref<?xf32>
            %p = arith.mulf %x, %y : f32
            memref.store %p, %out[%i] : memref<?xf32>
          }
        }
        return
      }
    }
  }

  func.func @optional_mul(%a: tensor<?xf32>, %b: tensor<?xf32>, %mode: i32) -> tensor<?xf32> {
    %c0 = arith.constant 0 : index
    %n = tensor.dim %a, %c0 : tensor<?xf32>
    %mode_index = arith.index_cast %mode : i32 to index
    %prod = flow.dispatch @optional_exec::@maybe_mul[%n](%a, %b, %n, %mode_index)
        : (tensor<?xf32>{%n}, tensor<?xf32>{%n}, index, index) -> tensor<?xf32>{%n}
    return %prod : tensor<?xf32>
  }
}
