// The workbench's TCG plugin for qemu-user: deterministic instruction
// counts per workgroup and a per-byte shadow of a dispatch's bindings (the
// kernel sanitizer). Built for the host (not the guest) by build.py and
// loaded by every agent of a qemu engine made with instrumentation, as a
// descriptor: -plugin /proc/self/fd/N,results=FD,guest=FD,arena=LO,
// size=BYTES,rsize=BYTES,mode=M,arch=NAME.
//
// Shared with the host through the results memfd (words of 8 bytes, index
// names below; hal_cpu/workbench reads and writes the same words, see
// elfloader/backend/emulated/tcg_plugin/__init__.py):
//   the host writes the control words before a dispatch (generation,
//   kernel code ranges, the workgroup loop's code range, the workers'
//   workgroup states, the grid, the bindings and their shadows) and reads
//   counts, events and shadows after it;
//   the plugin adds each workgroup's kernel instructions to counts[linear
//   id], appends events (race, order, uninitialized, outside) and keeps
//   each binding byte's shadow: uint32 writer (linear id + 1, 0 none) and
//   uint32 reader (linear id + 1, 0 none, ~0 several), the writers of a
//   binding's n bytes first, then its n readers.
// The current workgroup of the agent is read from guest memory (the guest
// memfd, mapped read-only) whenever the workgroup loop stores to memory:
// the loop writes workgroup_id_{x,y,z} of its worker's state before every
// call of the kernel.
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "qemu_plugin_api.h"

QEMU_PLUGIN_EXPORT int qemu_plugin_version = QEMU_PLUGIN_API_VERSION;

enum {
  W_MAGIC = 0,
  W_GENERATION = 1,
  W_ACTIVE = 2,
  W_LOOP_LO = 4,
  W_LOOP_HI = 5,
  W_N_KERNEL = 6,
  W_KERNEL = 7,  // 8 pairs [lo, hi)
  W_N_STATES = 23,
  W_CX = 24,
  W_CY = 25,
  W_CZ = 26,
  W_N_BINDINGS = 27,
  W_COUNTS_OFF = 28,
  W_COUNTS_CAP = 29,
  W_EVENTS_OFF = 30,
  W_EVENTS_CAP = 31,
  W_EVENTS_N = 32,
  W_EVENTS_LOST = 33,
  W_UNSEEN = 36,  // SVE contiguous loads/stores run (qemu 7.2 shows none)
  W_STATES = 64,  // 256 addresses
  W_BINDINGS = 320,  // 64 x {base, length, zone_lo, zone_hi, shadow_off, flags}
  BINDING_WORDS = 6,
  MAX_KERNEL = 8,
  MAX_STATES = 256,
  MAX_BINDINGS = 64,
  EVENT_WORDS = 8,  // kind, binding, offset, size, workgroup, other, pc, store
};

enum { MODE_COUNT = 1, MODE_SANITIZE = 2, MODE_OUTSIDE_ONLY = 4 };
enum { EV_RACE = 1, EV_ORDER = 2, EV_UNINITIALIZED = 4, EV_OUTSIDE = 5 };
enum { FLAG_UNINITIALIZED = 1 };
#define MAGIC 0x68616c776f726b31ull  // "halwork1"
#define NONE UINT64_MAX
#define SEVERAL 0xFFFFFFFFu

static volatile uint64_t* ctl;    // the results memfd, mapped shared
static uint8_t* results;
static uint64_t results_size;
static const uint8_t* guest;      // guest memory, read-only
static uint64_t arena_lo, arena_size;
static unsigned mode;
static int aarch64;

static uint64_t insns;            // kernel instructions run (inline adds)
static uint64_t mark;             // insns when the workgroup last changed
static uint64_t seen_generation;
static uint64_t state_at;         // guest address of this agent's state
static uint64_t current = NONE;   // linear id of the running workgroup

// The dispatch's bindings, copied from the control words when a new
// generation starts (the host writes them before the dispatch runs).
typedef struct binding_t {
  uint64_t base, end, zone_lo, zone_hi;
  uint32_t* writers;  // one word per byte (linear id + 1, 0 none)
  uint32_t* readers;  // one word per byte (linear id + 1, 0 none, ~0 several)
  int uninitialized;
} binding_t;
static binding_t bindings[MAX_BINDINGS];
static uint64_t n_bindings, span_lo, span_hi;
// Where counts and events go, checked against the file's size when a
// generation starts (guest code shares the process and may have written
// over the control words: nothing here writes outside the file).
static uint64_t* counts;
static uint64_t counts_cap;
static uint64_t* events;
static uint64_t events_cap;

// Whether [offset, offset + bytes) lies inside the results file.
static int inside(uint64_t offset, uint64_t bytes) {
  return offset <= results_size && bytes <= results_size - offset;
}

static void load_tables(void) {
  uint64_t off = ctl[W_COUNTS_OFF], cap = ctl[W_COUNTS_CAP];
  if (cap > (1ull << 32) || !inside(off, 8 * cap)) cap = 0;
  counts = (uint64_t*)(results + (cap ? off : 0));
  counts_cap = cap;
  off = ctl[W_EVENTS_OFF];
  cap = ctl[W_EVENTS_CAP];
  if (cap > (1ull << 32) || !inside(off, 8 * EVENT_WORDS * cap)) cap = 0;
  events = (uint64_t*)(results + (cap ? off : 0));
  events_cap = cap;
}

static void load_bindings(void) {
  uint64_t n = ctl[W_N_BINDINGS];
  if (n > MAX_BINDINGS) n = MAX_BINDINGS;
  span_lo = UINT64_MAX;
  span_hi = 0;
  uint64_t good = 0;
  for (uint64_t i = 0; i < n; ++i) {
    volatile uint64_t* w = ctl + W_BINDINGS + BINDING_WORDS * i;
    binding_t* b = &bindings[i];
    b->base = w[0];
    b->end = w[0] + w[1];
    b->zone_lo = w[2];
    b->zone_hi = w[3];
    if (w[1] > (1ull << 40) || !inside(w[4], 8 * w[1])) break;
    b->writers = (uint32_t*)(results + w[4]);
    b->readers = b->writers + w[1];
    b->uninitialized = (w[5] & FLAG_UNINITIALIZED) != 0;
    if (b->zone_lo < span_lo) span_lo = b->zone_lo;
    if (b->zone_hi > span_hi) span_hi = b->zone_hi;
    good = i + 1;
  }
  n_bindings = good;
}

static uint64_t parse(const char* text) {
  return strtoull(text, NULL, 0);
}

static int in_kernel(uint64_t pc) {
  uint64_t n = ctl[W_N_KERNEL];
  if (n > MAX_KERNEL) n = MAX_KERNEL;
  for (uint64_t i = 0; i < n; ++i) {
    if (pc >= ctl[W_KERNEL + 2 * i] && pc < ctl[W_KERNEL + 2 * i + 1]) return 1;
  }
  return 0;
}

static uint64_t guest_word(uint64_t address, unsigned size) {
  uint64_t off = address - arena_lo;
  if (address < arena_lo || off + size > arena_size) return 0;
  uint64_t v = 0;
  memcpy(&v, guest + off, size);  // little-endian guests and host
  return v;
}

// A store of the workgroup loop: attribute the instructions so far to the
// running workgroup, then read which workgroup runs next.
static void loop_store(unsigned int vcpu, qemu_plugin_meminfo_t info,
                       uint64_t vaddr, void* udata) {
  (void)vcpu;
  (void)info;
  (void)udata;
  uint64_t generation = ctl[W_GENERATION];
  if (generation != seen_generation) {
    seen_generation = generation;
    state_at = 0;
    current = NONE;
    load_tables();
    if (mode & MODE_SANITIZE) load_bindings();
  } else if (current != NONE && current < counts_cap) {
    counts[current] += insns - mark;
  }
  mark = insns;
  uint64_t n = ctl[W_N_STATES];
  if (n > MAX_STATES) n = MAX_STATES;
  for (uint64_t i = 0; i < n; ++i) {
    uint64_t s = ctl[W_STATES + i];
    if (vaddr >= s && vaddr < s + 12) {
      state_at = s;
      break;
    }
  }
  if (!state_at || !ctl[W_ACTIVE]) {
    current = NONE;
    return;
  }
  uint64_t x = guest_word(state_at, 4), y = guest_word(state_at + 4, 4);
  uint64_t z = guest_word(state_at + 8, 2);
  current = x + ctl[W_CX] * (y + ctl[W_CY] * z);
}

__attribute__((noinline, cold)) static void add_event(uint64_t kind, uint64_t binding, int64_t offset,
                      uint64_t other, uint64_t pc, int store) {
  uint64_t n = ctl[W_EVENTS_N];
  if (n > events_cap) {
    ctl[W_EVENTS_LOST] += 1;
    return;
  }
  if (n) {
    uint64_t* e = events + (n - 1) * EVENT_WORDS;
    if (e[0] == kind && e[1] == binding && e[4] == current && e[5] == other &&
        e[6] == pc && e[7] == (uint64_t)store) {
      int64_t start = (int64_t)e[2], end = start + (int64_t)e[3];
      if (offset == end) {
        e[3] += 1;
        return;
      }
      if (offset >= start && offset < end) return;
    }
  }
  if (n >= events_cap) {
    ctl[W_EVENTS_LOST] += 1;
    return;
  }
  uint64_t* e = events + n * EVENT_WORDS;
  e[0] = kind;
  e[1] = binding;
  e[2] = (uint64_t)offset;
  e[3] = 1;
  e[4] = current;
  e[5] = other;
  e[6] = pc;
  e[7] = (uint64_t)store;
  ctl[W_EVENTS_N] = n + 1;
}

// One byte of binding i at offset, accessed by the running workgroup.
__attribute__((noinline)) static void shadow_byte(uint64_t i, const binding_t* b,
                                                  uint64_t offset, int store,
                                                  uint64_t pc) {
  uint32_t me = (uint32_t)(current + 1);
  uint32_t writer = b->writers[offset], reader = b->readers[offset];
  if (store) {
    if (writer && writer != me) add_event(EV_RACE, i, (int64_t)offset, writer, pc, 1);
    if (reader && reader != me)
      add_event(EV_ORDER, i, (int64_t)offset, reader == SEVERAL ? 0 : reader, pc, 1);
    b->writers[offset] = me;
  } else {
    if (writer && writer != me) {
      add_event(EV_ORDER, i, (int64_t)offset, writer, pc, 0);
    } else if (!writer && b->uninitialized) {
      add_event(EV_UNINITIALIZED, i, (int64_t)offset, 0, pc, 0);
    }
    if (reader != me && reader != SEVERAL) b->readers[offset] = reader ? SEVERAL : me;
  }
}

// The bytes [offset, offset + size) of binding i: the common cases (bytes
// only this workgroup wrote or read, inputs nobody writes) checked without
// branches per byte; anything else byte by byte.
static inline void shadow_span(uint64_t i, const binding_t* b, uint64_t offset,
                               uint64_t size, int store, uint64_t pc) {
  uint32_t me = (uint32_t)(current + 1);
  uint32_t* w = b->writers + offset;
  uint32_t* r = b->readers + offset;
  uint32_t odd = 0, fresh = 0;
  if (store) {
    for (uint64_t k = 0; k < size; ++k) {
      odd |= (w[k] != me) & (w[k] != 0);
      odd |= (r[k] != me) & (r[k] != 0);
    }
    if (!odd) {
      for (uint64_t k = 0; k < size; ++k) w[k] = me;
      return;
    }
  } else {
    uint32_t uninit = (uint32_t)b->uninitialized;
    for (uint64_t k = 0; k < size; ++k) {
      odd |= (w[k] != me) & ((w[k] != 0) | uninit);
      fresh |= (r[k] != me) & (r[k] != SEVERAL);
    }
    if (!odd) {
      if (fresh) {
        for (uint64_t k = 0; k < size; ++k) {
          if (r[k] != me && r[k] != SEVERAL) r[k] = r[k] ? SEVERAL : me;
        }
      }
      return;
    }
  }
  for (uint64_t k = 0; k < size; ++k) shadow_byte(i, b, offset + k, store, pc);
}

// A memory access of kernel code: the shadow of binding bytes, and the
// accesses outside every binding but within one's guarded range.
static void kernel_access(unsigned int vcpu, qemu_plugin_meminfo_t info,
                          uint64_t vaddr, void* udata) {
  (void)vcpu;
  uint64_t size = 1ull << qemu_plugin_mem_size_shift(info);
  uint64_t end = vaddr + size;
  if (current == NONE || end <= span_lo || vaddr >= span_hi) return;
  uint64_t pc = (uint64_t)(uintptr_t)udata;
  int store = qemu_plugin_mem_is_store(info);
  uint64_t nb = n_bindings;
  for (uint64_t i = 0; i < nb; ++i) {
    const binding_t* b = &bindings[i];
    if (vaddr >= b->base && end <= b->end) {
      if (!(mode & MODE_OUTSIDE_ONLY)) shadow_span(i, b, vaddr - b->base, size, store, pc);
      return;
    }
  }
  // Byte by byte: in some binding, in a binding's guarded range, or not ours.
  for (uint64_t a = vaddr; a < end; ++a) {
    uint64_t zone = NONE;
    uint64_t i = 0;
    for (; i < nb; ++i) {
      const binding_t* b = &bindings[i];
      if (a >= b->base && a < b->end) break;
      if (zone == NONE && a >= b->zone_lo && a < b->zone_hi) zone = i;
    }
    if (i < nb) {
      if (!(mode & MODE_OUTSIDE_ONLY))
        shadow_byte(i, &bindings[i], a - bindings[i].base, store, pc);
    } else if (zone != NONE) {
      add_event(EV_OUTSIDE, zone, (int64_t)(a - bindings[zone].base), 0, pc, store);
    }
  }
}

// SVE loads and stores qemu 7.2 runs in helpers, which call no memory
// callback: contiguous LD1*/LDNT1*/LDFF1*/LDNF1*/LD1R*/LD2-4* (bits 31..25
// 0b1010010), ST1*/STNT1*/ST2-4* and scatters (0b1110010), gathers
// (0b1000010, 0b1100010). LDR and STR of a whole Z or P register (bits
// 31..22 0b1000010110 / 0b1110010110) are plain loads and stores in qemu:
// seen.
static int sve_memory(const struct qemu_plugin_insn* insn) {
  if (!aarch64 || qemu_plugin_insn_size(insn) != 4) return 0;
  uint32_t word;
  memcpy(&word, qemu_plugin_insn_data(insn), 4);
  uint32_t top = word >> 25, ten = word >> 22;
  if (ten == 0x216 || ten == 0x396) return 0;  // LDR / STR (vector, predicate)
  return top == 0x52 || top == 0x72 || top == 0x42 || top == 0x62;
}

static void translate(qemu_plugin_id_t id, struct qemu_plugin_tb* tb) {
  (void)id;
  size_t n = qemu_plugin_tb_n_insns(tb);
  uint64_t loop_lo = ctl[W_LOOP_LO], loop_hi = ctl[W_LOOP_HI];
  for (size_t i = 0; i < n; ++i) {
    struct qemu_plugin_insn* insn = qemu_plugin_tb_get_insn(tb, i);
    uint64_t pc = qemu_plugin_insn_vaddr(insn);
    if (in_kernel(pc)) {
      if (mode & MODE_COUNT) {
        qemu_plugin_register_vcpu_insn_exec_inline(
            insn, QEMU_PLUGIN_INLINE_ADD_U64, &insns, 1);
      }
      if (mode & MODE_SANITIZE) {
        qemu_plugin_register_vcpu_mem_cb(insn, kernel_access,
                                         QEMU_PLUGIN_CB_NO_REGS,
                                         QEMU_PLUGIN_MEM_RW,
                                         (void*)(uintptr_t)pc);
        if (sve_memory(insn)) {
          qemu_plugin_register_vcpu_insn_exec_inline(
              insn, QEMU_PLUGIN_INLINE_ADD_U64, (void*)(ctl + W_UNSEEN), 1);
        }
      }
    } else if (pc >= loop_lo && pc < loop_hi) {
      qemu_plugin_register_vcpu_mem_cb(insn, loop_store, QEMU_PLUGIN_CB_NO_REGS,
                                       QEMU_PLUGIN_MEM_W, NULL);
    }
  }
}

QEMU_PLUGIN_EXPORT int qemu_plugin_install(qemu_plugin_id_t id,
                                           const qemu_info_t* info, int argc,
                                           char** argv) {
  int results_fd = -1, guest_fd = -1;
  for (int i = 0; i < argc; ++i) {
    const char* a = argv[i];
    if (!strncmp(a, "results=", 8)) results_fd = (int)parse(a + 8);
    else if (!strncmp(a, "guest=", 6)) guest_fd = (int)parse(a + 6);
    else if (!strncmp(a, "arena=", 6)) arena_lo = parse(a + 6);
    else if (!strncmp(a, "size=", 5)) arena_size = parse(a + 5);
    else if (!strncmp(a, "rsize=", 6)) results_size = parse(a + 6);
    else if (!strncmp(a, "mode=", 5)) mode = (unsigned)parse(a + 5);
    else return -1;
  }
  if (results_fd < 0 || guest_fd < 0 || !arena_size || results_size < 8192) {
    return -1;
  }
  aarch64 = info && info->target_name && !strcmp(info->target_name, "aarch64");
  void* r = mmap(NULL, results_size, PROT_READ | PROT_WRITE, MAP_SHARED,
                 results_fd, 0);
  void* g = mmap(NULL, arena_size, PROT_READ, MAP_SHARED, guest_fd, 0);
  if (r == MAP_FAILED || g == MAP_FAILED) return -1;
  results = r;
  ctl = (volatile uint64_t*)r;
  guest = g;
  if (ctl[W_MAGIC] != MAGIC) return -1;
  qemu_plugin_register_vcpu_tb_trans_cb(id, translate);
  return 0;
}
