/* The --wrap targets of failalloc.h. The real allocators are reached as
 * __real_*, which under ASan are its interceptors, so leaks after an
 * injected failure are still found. Single counter, relaxed atomics: the
 * sweeps arm it around init paths, which may start threads. */
#include "tests/common/failalloc.h"

#include <errno.h>
#include <stdatomic.h>
#include <stddef.h>
#include <string.h>

void *__real_malloc(size_t n);
void *__real_calloc(size_t k, size_t n);
void *__real_realloc(void *p, size_t n);
char *__real_strdup(const char *s);
int __real_posix_memalign(void **p, size_t a, size_t n);
void *__real_aligned_alloc(size_t a, size_t n);
void *__wrap_malloc(size_t n);
void *__wrap_calloc(size_t k, size_t n);
void *__wrap_realloc(void *p, size_t n);
char *__wrap_strdup(const char *s);
int __wrap_posix_memalign(void **p, size_t a, size_t n);
void *__wrap_aligned_alloc(size_t a, size_t n);

static atomic_long armed, count;
static atomic_int hit;

void failalloc_arm(long n) {
  atomic_store(&count, 0);
  atomic_store(&hit, 0);
  atomic_store(&armed, n);
}

int failalloc_hit(void) { return atomic_load(&hit); }
long failalloc_count(void) { return atomic_load(&count); }

static int fail_now(void) {
  long c = atomic_fetch_add_explicit(&count, 1, memory_order_relaxed) + 1;
  if (c != atomic_load_explicit(&armed, memory_order_relaxed))
    return 0;
  atomic_store(&hit, 1);
  return 1;
}

void *__wrap_malloc(size_t n) { return fail_now() ? NULL : __real_malloc(n); }
void *__wrap_calloc(size_t k, size_t n) { return fail_now() ? NULL : __real_calloc(k, n); }
void *__wrap_realloc(void *p, size_t n) { return fail_now() ? NULL : __real_realloc(p, n); }
char *__wrap_strdup(const char *s) { return fail_now() ? NULL : __real_strdup(s); }
int __wrap_posix_memalign(void **p, size_t a, size_t n) {
  return fail_now() ? ENOMEM : __real_posix_memalign(p, a, n);
}
void *__wrap_aligned_alloc(size_t a, size_t n) {
  return fail_now() ? NULL : __real_aligned_alloc(a, n);
}
