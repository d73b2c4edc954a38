/*
 * plugin_abi.h - hal_cpu's header for writing IREE executable plugins
 * (plugin ABI version 0x1).
 *
 * The ABI itself (types, struct layouts, enum values, the exported symbol)
 * has one home: "iree/hal/local/executable_plugin.h" in this folder, which
 * declares it under IREE's names and path so that plugins written for IREE
 * build here unmodified.  This header includes it and adds the project's
 * helpers: plugin_status(), plugin_status_code() and plugin_import_fn_t.
 *
 * Only freestanding C headers are needed: plugins may be built with
 * -ffreestanding and no libc.
 */
#ifndef SAMPLE_PLUGINS_PLUGIN_ABI_H_
#define SAMPLE_PLUGINS_PLUGIN_ABI_H_

#include "iree/hal/local/executable_plugin.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A status of code `code` (0 = OK) as a plugin function returns it. */
static inline iree_hal_executable_plugin_status_t plugin_status(uint32_t code) {
  return (iree_hal_executable_plugin_status_t)(
      (uintptr_t)(code & IREE_HAL_EXECUTABLE_PLUGIN_STATUS_CODE_MASK));
}

/* The code (0 = OK) of a status a host function returned. */
static inline uint32_t plugin_status_code(
    iree_hal_executable_plugin_status_t status) {
  return (uint32_t)((uintptr_t)status &
                    IREE_HAL_EXECUTABLE_PLUGIN_STATUS_CODE_MASK);
}

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
