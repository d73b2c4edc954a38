/*
 * plugin_abi.h - the IREE HAL executable plugin ABI, version 0x1.
 *
 * The type layouts, enum values and the exported symbol name below are taken
 * from IREE's runtime/src/iree/hal/local/executable_plugin.h
 * (IREE_HAL_EXECUTABLE_PLUGIN_VERSION_0_1 == 0x00000001).  They must stay
 * binary compatible with that header; everything else here (naming of the
 * helpers, the helpers themselves) is our own.
 *
 * This header only needs the freestanding C headers so that it can be used by
 * plugins built with -ffreestanding and no libc.
 */
#ifndef SAMPLE_PLUGINS_PLUGIN_ABI_H_
#define SAMPLE_PLUGINS_PLUGIN_ABI_H_

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- versioning --------------------------------------------------------- */

typedef uint32_t iree_hal_executable_plugin_version_t;
#define IREE_HAL_EXECUTABLE_PLUGIN_VERSION_0_1 0x00000001u
#define IREE_HAL_EXECUTABLE_PLUGIN_VERSION_LATEST \
  IREE_HAL_EXECUTABLE_PLUGIN_VERSION_0_1

/* ---- feature bits ------------------------------------------------------- */

typedef uint32_t iree_hal_executable_plugin_features_t;
#define IREE_HAL_EXECUTABLE_PLUGIN_FEATURE_NONE 0u
/* No system facilities used beyond what the plugin API hands in. */
#define IREE_HAL_EXECUTABLE_PLUGIN_FEATURE_STANDALONE (1u << 0)
/* Status values are full iree_status_t objects rather than bare codes. */
#define IREE_HAL_EXECUTABLE_PLUGIN_FEATURE_FULL_STATUS (1u << 1)

/* ---- sanitizer kind (an int32-sized enum in the header struct) ---------- */

typedef enum iree_hal_executable_plugin_sanitizer_kind_e {
  IREE_HAL_EXECUTABLE_PLUGIN_SANITIZER_NONE = 0,
  IREE_HAL_EXECUTABLE_PLUGIN_SANITIZER_ADDRESS = 1,
  IREE_HAL_EXECUTABLE_PLUGIN_SANITIZER_MEMORY = 2,
  IREE_HAL_EXECUTABLE_PLUGIN_SANITIZER_THREAD = 3,
  IREE_HAL_EXECUTABLE_PLUGIN_SANITIZER_UNDEFINED = 4,
  IREE_HAL_EXECUTABLE_PLUGIN_SANITIZER_MAX_ENUM = INT32_MAX,
} iree_hal_executable_plugin_sanitizer_kind_t;

typedef size_t iree_host_size_t;

/*
 * Header shared by all plugin API versions.
 * Natural C layout: on LP64 it is 4+4(pad)+8+8+4+4+64 = 96 bytes; on 32-bit
 * targets pointers are 4 bytes and the alignment of `reserved` follows the
 * target ABI (4 on i386, 8 on arm/riscv32).
 */
typedef struct iree_hal_executable_plugin_header_t {
  iree_hal_executable_plugin_version_t version;
  const char* name;
  const char* description;
  iree_hal_executable_plugin_features_t features;
  iree_hal_executable_plugin_sanitizer_kind_t sanitizer;
  uint64_t reserved[8];
} iree_hal_executable_plugin_header_t;

/* Signature of the one exported symbol. */
typedef const iree_hal_executable_plugin_header_t** (
    *iree_hal_executable_plugin_query_fn_t)(
    iree_hal_executable_plugin_version_t max_version, void* reserved);

#define IREE_HAL_EXECUTABLE_PLUGIN_EXPORT_NAME \
  "iree_hal_executable_plugin_query"
#define IREE_HAL_EXECUTABLE_PLUGIN_EXPORT \
  __attribute__((visibility("default")))

/* ---- status ------------------------------------------------------------- */

/* Without FEATURE_FULL_STATUS a status is a bare code stored in a pointer. */
typedef struct iree_status_handle_t* iree_hal_executable_plugin_status_t;

#define IREE_HAL_EXECUTABLE_PLUGIN_STATUS_OK 0
#define IREE_HAL_EXECUTABLE_PLUGIN_STATUS_CANCELLED 1
#define IREE_HAL_EXECUTABLE_PLUGIN_STATUS_UNKNOWN 2
#define IREE_HAL_EXECUTABLE_PLUGIN_STATUS_INVALID_ARGUMENT 3
#define IREE_HAL_EXECUTABLE_PLUGIN_STATUS_DEADLINE_EXCEEDED 4
#define IREE_HAL_EXECUTABLE_PLUGIN_STATUS_NOT_FOUND 5
#define IREE_HAL_EXECUTABLE_PLUGIN_STATUS_ALREADY_EXISTS 6
#define IREE_HAL_EXECUTABLE_PLUGIN_STATUS_PERMISSION_DENIED 7
#define IREE_HAL_EXECUTABLE_PLUGIN_STATUS_RESOURCE_EXHAUSTED 8
#define IREE_HAL_EXECUTABLE_PLUGIN_STATUS_FAILED_PRECONDITION 9
#define IREE_HAL_EXECUTABLE_PLUGIN_STATUS_ABORTED 10
#define IREE_HAL_EXECUTABLE_PLUGIN_STATUS_OUT_OF_RANGE 11
#define IREE_HAL_EXECUTABLE_PLUGIN_STATUS_UNIMPLEMENTED 12
#define IREE_HAL_EXECUTABLE_PLUGIN_STATUS_INTERNAL 13
#define IREE_HAL_EXECUTABLE_PLUGIN_STATUS_UNAVAILABLE 14
#define IREE_HAL_EXECUTABLE_PLUGIN_STATUS_DATA_LOSS 15
#define IREE_HAL_EXECUTABLE_PLUGIN_STATUS_UNAUTHENTICATED 16
#define IREE_HAL_EXECUTABLE_PLUGIN_STATUS_DEFERRED 17
#define IREE_HAL_EXECUTABLE_PLUGIN_STATUS_CODE_MASK 0x1Fu

static inline iree_hal_executable_plugin_status_t plugin_status(uint32_t code) {
  return (iree_hal_executable_plugin_status_t)(
      (uintptr_t)(code & IREE_HAL_EXECUTABLE_PLUGIN_STATUS_CODE_MASK));
}

static inline uint32_t plugin_status_code(
    iree_hal_executable_plugin_status_t status) {
  return (uint32_t)((uintptr_t)status &
                    IREE_HAL_EXECUTABLE_PLUGIN_STATUS_CODE_MASK);
}

/* ---- host allocator (layout-compatible with iree_allocator_t) ----------- */

typedef enum iree_hal_executable_plugin_allocator_command_e {
  IREE_HAL_EXECUTABLE_PLUGIN_ALLOCATOR_COMMAND_MALLOC = 0,
  IREE_HAL_EXECUTABLE_PLUGIN_ALLOCATOR_COMMAND_CALLOC = 1,
  IREE_HAL_EXECUTABLE_PLUGIN_ALLOCATOR_COMMAND_REALLOC = 2,
  IREE_HAL_EXECUTABLE_PLUGIN_ALLOCATOR_COMMAND_FREE = 3,
} iree_hal_executable_plugin_allocator_command_t;

/* `params` of MALLOC/CALLOC/REALLOC points at this; FREE passes NULL. */
typedef struct iree_hal_executable_plugin_allocator_alloc_params_t {
  iree_host_size_t byte_length;
} iree_hal_executable_plugin_allocator_alloc_params_t;

typedef iree_hal_executable_plugin_status_t (
    *iree_hal_executable_plugin_allocator_ctl_fn_t)(
    void* self, iree_hal_executable_plugin_allocator_command_t command,
    const void* params, void** inout_ptr);

typedef struct iree_hal_executable_plugin_allocator_t {
  void* self;
  iree_hal_executable_plugin_allocator_ctl_fn_t ctl;
} iree_hal_executable_plugin_allocator_t;

/* ---- strings (not NUL terminated; use `size`) --------------------------- */

typedef struct iree_hal_executable_plugin_string_view_t {
  const char* data;
  iree_host_size_t size;
} iree_hal_executable_plugin_string_view_t;

typedef struct iree_hal_executable_plugin_string_pair_t {
  iree_hal_executable_plugin_string_view_t key;
  iree_hal_executable_plugin_string_view_t value;
} iree_hal_executable_plugin_string_pair_t;

/* ---- import resolution -------------------------------------------------- */

typedef uint32_t iree_hal_executable_plugin_resolution_t;
/* Set when at least one `?`-prefixed (optional) import was left NULL. */
#define IREE_HAL_EXECUTABLE_PLUGIN_RESOLUTION_MISSING_OPTIONAL (1u << 0)

/* ---- version 0 interface ------------------------------------------------ */

typedef struct iree_hal_executable_plugin_environment_v0_t {
  iree_hal_executable_plugin_allocator_t host_allocator;
} iree_hal_executable_plugin_environment_v0_t;

typedef struct iree_hal_executable_plugin_resolve_params_v0_t {
  size_t count;
  const char* const* symbol_names; /* sorted; `?` prefix = optional */
  void** out_fn_ptrs;              /* non-NULL entries are already resolved */
  void** out_fn_contexts;
} iree_hal_executable_plugin_resolve_params_v0_t;

typedef iree_hal_executable_plugin_status_t (
    *iree_hal_executable_plugin_resolve_fn_v0_t)(
    void* self, const iree_hal_executable_plugin_resolve_params_v0_t* params,
    iree_hal_executable_plugin_resolution_t* out_resolution);

/* What the query function returns (as a header**) for version 0x1. */
typedef struct iree_hal_executable_plugin_v0_t {
  const iree_hal_executable_plugin_header_t* header;
  iree_hal_executable_plugin_status_t (*load)(
      const iree_hal_executable_plugin_environment_v0_t* environment,
      size_t param_count,
      const iree_hal_executable_plugin_string_pair_t* params, void** out_self);
  void (*unload)(void* self);
  iree_hal_executable_plugin_resolve_fn_v0_t resolve;
} iree_hal_executable_plugin_v0_t;

/*
 * Every resolved import is called (through the executable's import thunk) as
 *   int fn(void* params, void* context, void* reserved);
 * where `params` points at a naturally aligned struct holding the call's
 * results followed by its arguments, and a return of 0 means success.
 */
typedef int (*plugin_import_fn_t)(void* params, void* context,
                                  void* reserved);

#ifdef __cplusplus
}
#endif

#endif /* SAMPLE_PLUGINS_PLUGIN_ABI_H_ */
