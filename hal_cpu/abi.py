"""The IREE CPU executable ABIs, each struct described once.

Executable library structs: ``iree/hal/local/executable_library.h``,
library version 0x6 (IREE_HAL_EXECUTABLE_LIBRARY_VERSION_0_6).
Executable plugin structs: ``iree/hal/local/executable_plugin.h``, plugin
version 0x1 (IREE_HAL_EXECUTABLE_PLUGIN_VERSION_0_1).
Layouts follow for 4- and 8-byte pointers through :mod:`fatelf.cstruct`.
"""

from __future__ import annotations

from fatelf.cstruct import CStruct

_LIB = "iree/hal/local/executable_library.h, v0.6"
_PLUGIN = "iree/hal/local/executable_plugin.h, v0.1"

LIBRARY_VERSION = 0x00000006
LIBRARY_QUERY = "iree_hal_executable_library_query"
WORKGROUP_LOCAL_MEMORY_PAGE_SIZE = 4096
MAX_CONSTANT_COUNT = 64
MAX_BINDING_COUNT = 64
PROCESSOR_DATA_CAPACITY = 8
DISPATCH_FLAG_SEQUENTIAL = 1 << 0
DISPATCH_FLAG_WORKGROUP_SIZE_DYNAMIC = 1 << 1
SANITIZERS = {0: "none", 1: "address", 2: "memory", 3: "thread", 4: "undefined"}

PLUGIN_VERSION = 0x00000001
PLUGIN_QUERY = "iree_hal_executable_plugin_query"
PLUGIN_FEATURE_STANDALONE = 1 << 0
PLUGIN_FEATURE_FULL_STATUS = 1 << 1
PLUGIN_RESOLUTION_MISSING_OPTIONAL = 1 << 0
PLUGIN_STATUS_CODE_MASK = 0x1F
ALLOCATOR_MALLOC, ALLOCATOR_CALLOC, ALLOCATOR_REALLOC, ALLOCATOR_FREE = 0, 1, 2, 3
STATUS_CODES = [
    "OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED",
    "NOT_FOUND", "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED",
    "FAILED_PRECONDITION", "ABORTED", "OUT_OF_RANGE", "UNIMPLEMENTED",
    "INTERNAL", "UNAVAILABLE", "DATA_LOSS", "UNAUTHENTICATED", "DEFERRED",
]

# --- executable library ----------------------------------------------------
LIBRARY_HEADER = CStruct("iree_hal_executable_library_header_t", [
    ("version", "u32"), ("name", "ptr"), ("features", "u32"),
    ("sanitizer", "i32")], _LIB)

IMPORT_TABLE = CStruct("iree_hal_executable_import_table_v0_t", [
    ("count", "u32"), ("symbols", "ptr")], _LIB)

ENVIRONMENT = CStruct("iree_hal_executable_environment_v0_t", [
    ("constants", "ptr"), ("import_thunk", "ptr"), ("import_funcs", "ptr"),
    ("import_contexts", "ptr"),
    ("processor_data", ("u64", PROCESSOR_DATA_CAPACITY))], _LIB)

DISPATCH_STATE = CStruct("iree_hal_executable_dispatch_state_v0_t", [
    ("workgroup_size_x", "u32"), ("workgroup_size_y", "u32"),
    ("workgroup_size_z", "u16"), ("constant_count", "u16"),
    ("workgroup_count_x", "u32"), ("workgroup_count_y", "u32"),
    ("workgroup_count_z", "u16"), ("max_concurrency", "u8"),
    ("binding_count", "u8"), ("constants", "ptr"), ("binding_ptrs", "ptr"),
    ("binding_lengths", "ptr")], _LIB)

WORKGROUP_STATE = CStruct("iree_hal_executable_workgroup_state_v0_t", [
    ("workgroup_id_x", "u32"), ("workgroup_id_y", "u32"),
    ("workgroup_id_z", "u16"), ("reserved", "u16"), ("processor_id", "u32"),
    ("local_memory", "ptr"), ("local_memory_size", "u32")], _LIB)

DISPATCH_ATTRS = CStruct("iree_hal_executable_dispatch_attrs_v0_t", [
    ("flags", "u64"), ("local_memory_pages", "u16"), ("constant_count", "u8"),
    ("binding_count", "u8"), ("workgroup_size_x", "u32"),
    ("workgroup_size_y", "u32"), ("workgroup_size_z", "u16"),
    ("parameter_count", "u16"), ("reserved_1", ("u64", 5))], _LIB)

EXPORT_TABLE = CStruct("iree_hal_executable_export_table_v0_t", [
    ("count", "u32"), ("ptrs", "ptr"), ("attrs", "ptr"), ("params", "ptr"),
    ("occupancy", "ptr"), ("names", "ptr"), ("tags", "ptr"),
    ("parameter_names", "ptr"), ("source_locations", "ptr"),
    ("stage_locations", "ptr")], _LIB)

CONSTANT_TABLE = CStruct("iree_hal_executable_constant_table_v0_t", [
    ("count", "u32")], _LIB)

SOURCE_FILE_TABLE = CStruct("iree_hal_executable_source_file_table_v0_t", [
    ("count", "u32"), ("files", "ptr")], _LIB)

LIBRARY_V0 = CStruct("iree_hal_executable_library_v0_t", [
    ("header", "ptr"), ("imports", IMPORT_TABLE), ("exports", EXPORT_TABLE),
    ("constants", CONSTANT_TABLE), ("sources", SOURCE_FILE_TABLE)], _LIB)

# --- executable plugin -----------------------------------------------------
PLUGIN_HEADER = CStruct("iree_hal_executable_plugin_header_t", [
    ("version", "u32"), ("name", "ptr"), ("description", "ptr"),
    ("features", "u32"), ("sanitizer", "i32"), ("reserved", ("u64", 8))],
    _PLUGIN)

PLUGIN_V0 = CStruct("iree_hal_executable_plugin_v0_t", [
    ("header", "ptr"), ("load", "ptr"), ("unload", "ptr"), ("resolve", "ptr")],
    _PLUGIN)

PLUGIN_ALLOCATOR = CStruct("iree_hal_executable_plugin_allocator_t", [
    ("self", "ptr"), ("ctl", "ptr")], _PLUGIN)

PLUGIN_ENVIRONMENT = CStruct("iree_hal_executable_plugin_environment_v0_t", [
    ("host_allocator", PLUGIN_ALLOCATOR)], _PLUGIN)

STRING_VIEW = CStruct("iree_hal_executable_plugin_string_view_t", [
    ("data", "ptr"), ("size", "size")], _PLUGIN)

STRING_PAIR = CStruct("iree_hal_executable_plugin_string_pair_t", [
    ("key", STRING_VIEW), ("value", STRING_VIEW)], _PLUGIN)

ALLOC_PARAMS = CStruct("iree_hal_executable_plugin_allocator_alloc_params_t", [
    ("byte_length", "size")], _PLUGIN)

RESOLVE_PARAMS = CStruct("iree_hal_executable_plugin_resolve_params_v0_t", [
    ("count", "size"), ("symbol_names", "ptr"), ("out_fn_ptrs", "ptr"),
    ("out_fn_contexts", "ptr")], _PLUGIN)


def status_name(code: int) -> str:
    """Name of a plugin status code (``NOT_FOUND``...)."""
    return STATUS_CODES[code] if 0 <= code < len(STATUS_CODES) else f"CODE_{code}"
