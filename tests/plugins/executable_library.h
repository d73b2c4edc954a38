/*
 * executable_library.h - the subset of IREE's executable library ABI
 * (iree/hal/local/executable_library.h, v0.6; layouts as in hal_cpu/abi.py)
 * that the test executables of this folder export.
 */
#ifndef TESTS_PLUGINS_EXECUTABLE_LIBRARY_H_
#define TESTS_PLUGINS_EXECUTABLE_LIBRARY_H_

#include <stddef.h>
#include <stdint.h>

#define LIBRARY_VERSION_0_6 0x00000006u

typedef struct {
  uint32_t version;
  const char* name;
  uint32_t features;
  int32_t sanitizer;
} library_header_t;

typedef int (*import_thunk_t)(const void* fn, void* params, void* context,
                              void* reserved);

typedef struct {
  const uint32_t* constants;
  import_thunk_t import_thunk;
  const void* const* import_funcs;
  void* const* import_contexts;
  uint64_t processor_data[8];
} environment_t;

typedef struct {
  uint32_t workgroup_size_x;
  uint32_t workgroup_size_y;
  uint16_t workgroup_size_z;
  uint16_t constant_count;
  uint32_t workgroup_count_x;
  uint32_t workgroup_count_y;
  uint16_t workgroup_count_z;
  uint8_t max_concurrency;
  uint8_t binding_count;
  const uint32_t* constants;
  void* const* binding_ptrs;
  const size_t* binding_lengths;
} dispatch_state_t;

typedef struct {
  uint32_t workgroup_id_x;
  uint32_t workgroup_id_y;
  uint16_t workgroup_id_z;
  uint16_t reserved;
  uint32_t processor_id;
  void* local_memory;
  uint32_t local_memory_size;
} workgroup_state_t;

typedef int (*dispatch_fn_t)(const environment_t* environment,
                             const dispatch_state_t* dispatch_state,
                             const workgroup_state_t* workgroup_state);

typedef struct {
  uint64_t flags;
  uint16_t local_memory_pages;
  uint8_t constant_count;
  uint8_t binding_count;
  uint32_t workgroup_size_x;
  uint32_t workgroup_size_y;
  uint16_t workgroup_size_z;
  uint16_t parameter_count;
  uint64_t reserved_1[5];
} dispatch_attrs_t;

typedef struct {
  uint32_t count;
  const char* const* symbols;
} import_table_t;

typedef struct {
  uint32_t count;
  const dispatch_fn_t* ptrs;
  const dispatch_attrs_t* attrs;
  const void* params;
  const void* occupancy;
  const char* const* names;
  const char* const* tags;
  const void* parameter_names;
  const void* source_locations;
  const void* stage_locations;
} export_table_t;

typedef struct {
  uint32_t count;
} constant_table_t;

typedef struct {
  uint32_t count;
  const void* files;
} source_file_table_t;

typedef struct {
  const library_header_t* header;
  import_table_t imports;
  export_table_t exports;
  constant_table_t constants;
  source_file_table_t sources;
} library_v0_t;

#endif  /* TESTS_PLUGINS_EXECUTABLE_LIBRARY_H_ */
