/*
 * init_order.c - constructors and destructors whose order a test observes.
 *
 * The loader runs DT_INIT (`_init`), then DT_INIT_ARRAY in order (the
 * constructors, sorted by priority: 101 before 102); at unload
 * DT_FINI_ARRAY in reverse (destructor 102 before 101), then DT_FINI
 * (`_fini`). Each records a number:
 *   initializers into init_log (read with init_log_entry),
 *   finalizers into the int array the test hands to set_fini_sink
 *   (element 0 counts the entries that follow), memory of the test's
 *   that outlives this module.
 * With -DFAULTING_CONSTRUCTOR a third constructor (priority 103, so
 * DT_INIT_ARRAY[2]) writes through a pointer that was never set.
 */

#define EXPORT __attribute__((visibility("default")))

static volatile int init_log[8];
static volatile int init_count;
static int* volatile fini_sink;

static void log_init(int id) {
  if (init_count < 8) {
    init_log[init_count] = id;
  }
  init_count = init_count + 1;
}

static void log_fini(int id) {
  int* sink = fini_sink;
  if (sink != 0 && sink[0] < 7) {
    sink[1 + sink[0]] = id;
    sink[0] = sink[0] + 1;
  }
}

/* DT_INIT and DT_FINI: the linker names the functions called _init and
 * _fini in the dynamic section. */
void _init(void) { log_init(10); }
void _fini(void) { log_fini(100); }

__attribute__((constructor(101))) static void first_constructor(void) {
  log_init(1);
}

__attribute__((constructor(102))) static void second_constructor(void) {
  log_init(2);
}

__attribute__((destructor(101))) static void last_destructor(void) {
  log_fini(101);
}

__attribute__((destructor(102))) static void first_destructor(void) {
  log_fini(102);
}

#ifdef FAULTING_CONSTRUCTOR
__attribute__((constructor(103))) static void faulting_constructor(void) {
  int* volatile table = (int*)8; /* a pointer that was never set */
  *table = 3;
}
#endif

EXPORT int init_log_count(void) { return init_count; }

EXPORT int init_log_entry(int i) {
  return 0 <= i && i < init_count && i < 8 ? init_log[i] : -1;
}

EXPORT void set_fini_sink(int* sink) { fini_sink = sink; }
