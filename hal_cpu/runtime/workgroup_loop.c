// Runtime support library of hal_cpu: runs a range of workgroups of one
// dispatch in machine code, so a host driving a 3-D grid crosses into the
// backend once per chunk of workgroups instead of once per workgroup.
//
// Freestanding C17: no libc, no compiler runtime calls (64-bit division on
// 32-bit targets is done with 32-bit operations below), no atomics. Built by
// hal_cpu/runtime/build.py for every architecture of the runtime and packed
// into the FatELF bundle hal_cpu/runtime/runtime.sos.
//
// int hal_cpu_workgroup_loop(fn, environment, dispatch_state,
//                            workgroup_state, range)
//
// Runs the workgroups with linear ids begin <= i < end of the grid
// workgroup_count_x * workgroup_count_y * workgroup_count_z (x fastest,
// then y, then z: i = x + count_x * (y + count_y * z)). For each one it
// stores (x, y, z) in workgroup_state->workgroup_id_{x,y,z} and calls
// fn(environment, dispatch_state, workgroup_state). Other fields of the
// workgroup state (processor id, local memory) are the caller's.
//
// Range struct (hal_cpu_workgroup_range_t, 40 bytes, same offsets on every
// target; 8-byte alignment, 4 on x86_32):
//    0  uint64_t begin          in: first linear id; out: see below
//    8  uint64_t end            in: one past the last linear id
//   16  uint64_t failed_index   out: id of the failing workgroup, else ~0
//   24  uint64_t stop           in: address of a uint32_t stop flag, or 0
//   32  int32_t  status         out: the failing workgroup's return, else 0
//   36  uint32_t reserved       zero; not read
//
// Return values (also named in hal_cpu/runtime/__init__.py):
//   0                          every workgroup in [begin, end) returned 0
//                              (an empty range included); begin = end.
//   r != 0 from fn             the workgroup with id i returned r; nothing
//                              after it ran; begin = failed_index = i,
//                              status = r.
//   HAL_CPU_WORKGROUP_LOOP_STOPPED (INT32_MIN)
//                              the stop flag was non-zero before workgroup
//                              i ran (it is read before every workgroup);
//                              begin = i, the first id not run; status = 0.
//   HAL_CPU_WORKGROUP_LOOP_INVALID (INT32_MIN + 1)
//                              a NULL argument, a zero workgroup count, a
//                              range reaching past the grid or a stop
//                              address beyond the pointer width; nothing
//                              ran and the range is not written.
// A workgroup failed exactly when range->status != 0, so a dispatch
// function returning one of the two codes above is still told apart.
//
// int hal_cpu_dispatch_batch(batch)
//
// Runs several dispatches in order, each one's whole grid through
// hal_cpu_workgroup_loop on one worker, each finishing before the next
// starts (a replayed command buffer: one crossing per submission). Before
// a dispatch runs, its binding pointers are written from the batch's table
// and its range is reset to [0, total).
//
// Batch struct (hal_cpu_batch_t, 32 bytes, same offsets on every target):
//    0  uint64_t dispatches     in: address of count dispatch records
//    8  uint64_t table          in: address of table_count uint64_t host
//                               addresses (a submission's binding table)
//   16  uint32_t count          in: dispatch records
//   20  uint32_t table_count    in: entries of the table
//   24  uint32_t failed         out: index of the dispatch that stopped the
//                               batch, else 0xFFFFFFFF
//   28  int32_t  status         out: its return (as below), else 0
//
// Dispatch record (hal_cpu_batch_dispatch_t, 64 bytes):
//    0  uint64_t fn, 8 environment, 16 dispatch_state, 24 workgroup_state,
//   32  uint64_t range          as hal_cpu_workgroup_loop's arguments
//   40  uint64_t sources        address of binding_count source records
//   48  uint64_t total          workgroups of the grid: the range [0, total)
//   56  uint32_t binding_count  binding pointers written
//   60  uint32_t reserved       zero; not read
// Source record (hal_cpu_batch_source_t, 16 bytes): uint64_t slot (a table
// index, or ~0: none), uint64_t offset. Binding i's pointer becomes
// table[slot] + offset, or offset itself for slot ~0, stored in the
// dispatch state's binding_ptrs[i].
//
// Return values: 0 when every dispatch returned 0 (failed = ~0, status =
// 0); else the first non-zero return of hal_cpu_workgroup_loop, dispatch
// `failed` having returned it (its range tells which workgroup) and no
// later dispatch run; HAL_CPU_WORKGROUP_LOOP_INVALID with failed = ~0 when
// the batch itself is malformed (NULL, addresses beyond the pointer width,
// a slot past the table, more bindings than the dispatch state holds):
// then nothing ran.
//
// Limits: linear ids are uint64_t, so end <= 2^64 - 1. count_x * count_y *
// count_z can reach 2^80; the ids of a larger grid are not reachable through
// one range and the caller splits such a grid itself.

#include <stddef.h>
#include <stdint.h>

#define HAL_CPU_EXPORT __attribute__((visibility("default")))

#define HAL_CPU_WORKGROUP_LOOP_OK 0
#define HAL_CPU_WORKGROUP_LOOP_STOPPED (-2147483647 - 1)
#define HAL_CPU_WORKGROUP_LOOP_INVALID (-2147483647)

// iree_hal_executable_dispatch_state_v0_t (IREE executable library ABI
// v0.6): the leading fields, up to the workgroup counts the loop reads.
typedef struct hal_cpu_dispatch_state_t {
  uint32_t workgroup_size_x;
  uint32_t workgroup_size_y;
  uint16_t workgroup_size_z;
  uint16_t constant_count;
  uint32_t workgroup_count_x;
  uint32_t workgroup_count_y;
  uint16_t workgroup_count_z;
  uint8_t max_concurrency;
  uint8_t binding_count;
  // constants, binding_ptrs, binding_lengths follow; not read here.
} hal_cpu_dispatch_state_t;

// iree_hal_executable_workgroup_state_v0_t (v0.6): the leading fields, up
// to the workgroup id the loop writes.
typedef struct hal_cpu_workgroup_state_t {
  uint32_t workgroup_id_x;
  uint32_t workgroup_id_y;
  uint16_t workgroup_id_z;
  uint16_t reserved;
  // processor_id, local_memory, local_memory_size follow; the caller's.
} hal_cpu_workgroup_state_t;

// iree_hal_executable_dispatch_v0_t; the environment is opaque here.
typedef int (*hal_cpu_dispatch_fn_t)(
    const void* environment, const hal_cpu_dispatch_state_t* dispatch_state,
    const hal_cpu_workgroup_state_t* workgroup_state);

typedef struct hal_cpu_workgroup_range_t {
  uint64_t begin;
  uint64_t end;
  uint64_t failed_index;
  uint64_t stop;
  int32_t status;
  uint32_t reserved;
} hal_cpu_workgroup_range_t;

_Static_assert(sizeof(hal_cpu_workgroup_range_t) == 40, "range layout");
_Static_assert(offsetof(hal_cpu_workgroup_range_t, stop) == 24, "range layout");
_Static_assert(offsetof(hal_cpu_workgroup_range_t, status) == 32, "range layout");
_Static_assert(offsetof(hal_cpu_workgroup_state_t, workgroup_id_z) == 8,
               "workgroup state layout");
_Static_assert(offsetof(hal_cpu_dispatch_state_t, workgroup_count_x) == 12,
               "dispatch state layout");
_Static_assert(offsetof(hal_cpu_dispatch_state_t, workgroup_count_z) == 20,
               "dispatch state layout");

// n / d and n % d for a 64-bit n and a non-zero 32-bit d. 64-bit targets
// divide natively; 32-bit ones divide the high word with the 32-bit divide
// instruction and shift the low word in one bit at a time, keeping the
// remainder below d in 32 bits (so no __udivdi3/__aeabi_uldivmod call).
static uint64_t divmod_u64_u32(uint64_t n, uint32_t d, uint32_t* rem) {
#if UINTPTR_MAX > 0xFFFFFFFFu
  *rem = (uint32_t)(n % d);
  return n / d;
#else
  uint32_t hi = (uint32_t)(n >> 32);
  uint32_t lo = (uint32_t)n;
  uint32_t q_hi = hi / d;
  uint32_t r = hi - q_hi * d;
  uint32_t q_lo = 0;
  for (int bit = 31; bit >= 0; --bit) {
    uint32_t carry = r >> 31;  // r * 2 + 1 may need 33 bits
    r = (r << 1) | ((lo >> bit) & 1u);
    q_lo <<= 1;
    if (carry || r >= d) {
      r -= d;  // wraps back below d when carry was set
      q_lo |= 1u;
    }
  }
  *rem = r;
  return ((uint64_t)q_hi << 32) | q_lo;
#endif
}

// (x, y, z) of linear id i; z is returned unbounded (the caller checks it).
static void decompose(uint64_t i, uint32_t count_x, uint32_t count_y,
                      uint32_t* x, uint32_t* y, uint64_t* z) {
  uint64_t xy = divmod_u64_u32(i, count_x, x);
  *z = divmod_u64_u32(xy, count_y, y);
}

// The loop itself, called directly by both exports (an exported symbol
// called from inside the library would go through the PLT).
static int workgroup_loop(
    hal_cpu_dispatch_fn_t fn, const void* environment,
    const hal_cpu_dispatch_state_t* dispatch_state,
    hal_cpu_workgroup_state_t* workgroup_state,
    hal_cpu_workgroup_range_t* range) {
  if (!fn || !dispatch_state || !workgroup_state || !range) {
    return HAL_CPU_WORKGROUP_LOOP_INVALID;
  }
  const uint64_t end = range->end;
  uint64_t i = range->begin;
  if (range->stop > (uint64_t)UINTPTR_MAX) return HAL_CPU_WORKGROUP_LOOP_INVALID;
  const volatile uint32_t* stop =
      (const volatile uint32_t*)(uintptr_t)range->stop;
  if (i < end) {
    const uint32_t count_x = dispatch_state->workgroup_count_x;
    const uint32_t count_y = dispatch_state->workgroup_count_y;
    const uint32_t count_z = dispatch_state->workgroup_count_z;
    if (count_x == 0 || count_y == 0 || count_z == 0) {
      return HAL_CPU_WORKGROUP_LOOP_INVALID;
    }
    uint32_t x, y;
    uint64_t z;
    decompose(end - 1, count_x, count_y, &x, &y, &z);
    if (z >= count_z) return HAL_CPU_WORKGROUP_LOOP_INVALID;
    decompose(i, count_x, count_y, &x, &y, &z);
    uint32_t z32 = (uint32_t)z;
    for (; i < end; ++i) {
      if (stop && *stop) {
        range->begin = i;
        range->failed_index = ~(uint64_t)0;
        range->status = 0;
        return HAL_CPU_WORKGROUP_LOOP_STOPPED;
      }
      workgroup_state->workgroup_id_x = x;
      workgroup_state->workgroup_id_y = y;
      workgroup_state->workgroup_id_z = (uint16_t)z32;
      int result = fn(environment, dispatch_state, workgroup_state);
      if (result != 0) {
        range->begin = i;
        range->failed_index = i;
        range->status = result;
        return result;
      }
      if (++x == count_x) {
        x = 0;
        if (++y == count_y) {
          y = 0;
          ++z32;
        }
      }
    }
  }
  range->begin = i;
  range->failed_index = ~(uint64_t)0;
  range->status = 0;
  return HAL_CPU_WORKGROUP_LOOP_OK;
}

HAL_CPU_EXPORT int hal_cpu_workgroup_loop(
    hal_cpu_dispatch_fn_t fn, const void* environment,
    const hal_cpu_dispatch_state_t* dispatch_state,
    hal_cpu_workgroup_state_t* workgroup_state,
    hal_cpu_workgroup_range_t* range) {
  return workgroup_loop(fn, environment, dispatch_state, workgroup_state,
                        range);
}

typedef struct hal_cpu_batch_source_t {
  uint64_t slot;
  uint64_t offset;
} hal_cpu_batch_source_t;

typedef struct hal_cpu_batch_dispatch_t {
  uint64_t fn;
  uint64_t environment;
  uint64_t dispatch_state;
  uint64_t workgroup_state;
  uint64_t range;
  uint64_t sources;
  uint64_t total;
  uint32_t binding_count;
  uint32_t reserved;
} hal_cpu_batch_dispatch_t;

typedef struct hal_cpu_batch_t {
  uint64_t dispatches;
  uint64_t table;
  uint32_t count;
  uint32_t table_count;
  uint32_t failed;
  int32_t status;
} hal_cpu_batch_t;

_Static_assert(sizeof(hal_cpu_batch_source_t) == 16, "source layout");
_Static_assert(sizeof(hal_cpu_batch_dispatch_t) == 64, "batch record layout");
_Static_assert(offsetof(hal_cpu_batch_dispatch_t, binding_count) == 56,
               "batch record layout");
_Static_assert(sizeof(hal_cpu_batch_t) == 32, "batch layout");
_Static_assert(offsetof(hal_cpu_batch_t, status) == 28, "batch layout");

// iree_hal_executable_dispatch_state_v0_t after binding_count: the
// pointers to the constants, binding pointer and binding length arrays.
typedef struct hal_cpu_dispatch_state_arrays_t {
  hal_cpu_dispatch_state_t head;
  const uint32_t* constants;
  void* const* binding_ptrs;
  const size_t* binding_lengths;
} hal_cpu_dispatch_state_arrays_t;

static int batch_invalid(hal_cpu_batch_t* batch) {
  batch->failed = 0xFFFFFFFFu;
  batch->status = HAL_CPU_WORKGROUP_LOOP_INVALID;
  return HAL_CPU_WORKGROUP_LOOP_INVALID;
}

#define HAL_CPU_FITS(v) ((uint64_t)(v) <= (uint64_t)UINTPTR_MAX)

HAL_CPU_EXPORT int hal_cpu_dispatch_batch(hal_cpu_batch_t* batch) {
  if (!batch) return HAL_CPU_WORKGROUP_LOOP_INVALID;
  if (!HAL_CPU_FITS(batch->dispatches) || !HAL_CPU_FITS(batch->table) ||
      (batch->count && !batch->dispatches) ||
      (batch->table_count && !batch->table)) {
    return batch_invalid(batch);
  }
  const hal_cpu_batch_dispatch_t* records =
      (const hal_cpu_batch_dispatch_t*)(uintptr_t)batch->dispatches;
  const uint64_t* table = (const uint64_t*)(uintptr_t)batch->table;
  const uint32_t count = batch->count;
  const uint32_t table_count = batch->table_count;
  // Every record is checked before anything runs.
  for (uint32_t d = 0; d < count; ++d) {
    const hal_cpu_batch_dispatch_t* r = &records[d];
    if (!r->fn || !r->dispatch_state || !r->workgroup_state || !r->range ||
        !HAL_CPU_FITS(r->fn) || !HAL_CPU_FITS(r->environment) ||
        !HAL_CPU_FITS(r->dispatch_state) ||
        !HAL_CPU_FITS(r->workgroup_state) || !HAL_CPU_FITS(r->range) ||
        !HAL_CPU_FITS(r->sources) || (r->binding_count && !r->sources)) {
      return batch_invalid(batch);
    }
    const hal_cpu_dispatch_state_arrays_t* state =
        (const hal_cpu_dispatch_state_arrays_t*)(uintptr_t)r->dispatch_state;
    if (r->binding_count > state->head.binding_count ||
        (r->binding_count && !state->binding_ptrs)) {
      return batch_invalid(batch);
    }
    const hal_cpu_batch_source_t* sources =
        (const hal_cpu_batch_source_t*)(uintptr_t)r->sources;
    for (uint32_t b = 0; b < r->binding_count; ++b) {
      uint64_t slot = sources[b].slot;
      if (slot != ~(uint64_t)0 && slot >= table_count) {
        return batch_invalid(batch);
      }
    }
  }
  for (uint32_t d = 0; d < count; ++d) {
    const hal_cpu_batch_dispatch_t* r = &records[d];
    const hal_cpu_dispatch_state_arrays_t* state =
        (const hal_cpu_dispatch_state_arrays_t*)(uintptr_t)r->dispatch_state;
    const hal_cpu_batch_source_t* sources =
        (const hal_cpu_batch_source_t*)(uintptr_t)r->sources;
    void** ptrs = (void**)state->binding_ptrs;
    for (uint32_t b = 0; b < r->binding_count; ++b) {
      uint64_t slot = sources[b].slot;
      uint64_t address = sources[b].offset;
      if (slot != ~(uint64_t)0) address += table[slot];
      ptrs[b] = (void*)(uintptr_t)address;
    }
    hal_cpu_workgroup_range_t* range =
        (hal_cpu_workgroup_range_t*)(uintptr_t)r->range;
    range->begin = 0;
    range->end = r->total;
    range->failed_index = ~(uint64_t)0;
    range->status = 0;
    int result = workgroup_loop(
        (hal_cpu_dispatch_fn_t)(uintptr_t)r->fn,
        (const void*)(uintptr_t)r->environment, &state->head,
        (hal_cpu_workgroup_state_t*)(uintptr_t)r->workgroup_state, range);
    if (result != 0) {
      batch->failed = d;
      batch->status = result;
      return result;
    }
  }
  batch->failed = 0xFFFFFFFFu;
  batch->status = 0;
  return 0;
}
