/* Persistent fork-join pool of the CPU backends (see fjpool.h).
 *
 * A job is n tasks claimed one at a time from one 64-bit word, `claim` =
 * generation (32 bits) | n (16) | next task (16), with a compare-and-swap:
 * the caller claims tasks too, so when the helpers are slow to wake (a
 * node with more busy threads than cores) it does the work itself instead
 * of waiting for them, and a helper that wakes late finds the word of a
 * later job (or no task left) and cannot run a stale one. The job's fn
 * and ctx are read only after a successful claim, when the caller cannot
 * move on before that task is done. The caller then waits until `done`
 * counts all n tasks.
 * Waits spin first (the next phase is often due within microseconds
 * while the stage streams frames) and then sleep on a futex, so a stage
 * waiting for frames costs no CPU. The spin is short on purpose: where
 * threads outnumber cores, a spinning thread steals the slice that the
 * thread it waits for needs. */
#include "pipeline/fjpool.h"

#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

/* About 10-30 us of polling, by the pause instruction's latency. */
#define SPIN 2000

struct beam_fjpool_s {
  unsigned n; /* threads, caller included */
  pthread_t tid[BEAM_FJPOOL_MAX];
  unsigned started;        /* helpers running */
  _Atomic uint64_t claim;  /* gen << 32 | tasks << 16 | next */
  _Atomic unsigned gen;    /* low bits of the generation: helpers sleep on it */
  _Atomic unsigned done;   /* tasks finished in this generation */
  _Atomic int sleepers, caller_sleeps;
  atomic_bool stop;
  beam_fjpool_fn fn;    /* the job (written before claim is published) */
  void *ctx;
};

static inline void relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ __volatile__("yield");
#endif
}

static void futex_wait(_Atomic unsigned *a, unsigned val) {
  syscall(SYS_futex, (unsigned *)a, FUTEX_WAIT_PRIVATE, val, NULL, NULL, 0);
}

static void futex_wake(_Atomic unsigned *a, int n) {
  syscall(SYS_futex, (unsigned *)a, FUTEX_WAKE_PRIVATE, n, NULL, NULL, 0);
}

/* Claims and runs tasks of the current job until none is left. */
static void work(beam_fjpool_t *p) {
  uint64_t c = atomic_load(&p->claim);
  for (;;) {
    unsigned tasks = (unsigned)(c >> 16) & 0xffff, k = (unsigned)c & 0xffff;
    if (k >= tasks)
      return;
    if (!atomic_compare_exchange_weak(&p->claim, &c, c + 1))
      continue; /* c reloaded: another claim, or a new job */
    p->fn(p->ctx, k);
    /* seq_cst: Dekker with the caller's caller_sleeps-then-load */
    if (atomic_fetch_add(&p->done, 1) + 1 == tasks && atomic_load(&p->caller_sleeps))
      futex_wake(&p->done, 1);
    c = atomic_load(&p->claim);
  }
}

static void *helper(void *arg) {
  beam_fjpool_t *p = arg;
  /* The generation at creation, not whatever gen is when this thread
   * first runs: a helper scheduled late (the caller does the work without
   * it) could otherwise take destroy's bump as its starting point and
   * sleep through it. */
  unsigned seen = 0;
  for (;;) {
    unsigned v;
    int i;
    for (i = 0; i < SPIN && (v = atomic_load_explicit(&p->gen, memory_order_acquire)) == seen; i++)
      relax();
    if (i == SPIN) {
      atomic_fetch_add(&p->sleepers, 1);
      /* seq_cst: either the caller sees the sleeper and wakes it, or the
       * sleeper sees the new generation */
      while ((v = atomic_load(&p->gen)) == seen)
        futex_wait(&p->gen, seen);
      atomic_fetch_sub(&p->sleepers, 1);
    }
    seen = v;
    if (atomic_load(&p->stop))
      return NULL;
    work(p);
  }
}

int beam_fjpool_new(beam_fjpool_t **out, unsigned n, const char *who, beam_diag_t *d) {
  *out = NULL;
  if (n < 1 || n > BEAM_FJPOOL_MAX)
    return BEAM_DIAG(d, BEAM_EINVAL, "%s: threads must be 1..%d, got %u", who, BEAM_FJPOOL_MAX, n);
  beam_fjpool_t *p = calloc(1, sizeof *p);
  if (!p)
    return BEAM_DIAG(d, BEAM_ENOMEM, "%s: out of memory", who);
  p->n = n;
  for (unsigned k = 1; k < n; k++) {
    int e = pthread_create(&p->tid[k], NULL, helper, p);
    if (e != 0) {
      beam_fjpool_destroy(&p);
      return BEAM_DIAG(d, BEAM_ENOMEM, "%s: cannot start thread %u of %u: %s", who, k + 1, n, strerror(e));
    }
    p->started++;
  }
  *out = p;
  return 0;
}

void beam_fjpool_destroy(beam_fjpool_t **self) {
  beam_fjpool_t *p = self ? *self : NULL;
  if (!p)
    return;
  atomic_store(&p->stop, 1);
  atomic_fetch_add(&p->gen, 1);
  futex_wake(&p->gen, INT_MAX);
  for (unsigned k = 1; k <= p->started; k++)
    pthread_join(p->tid[k], NULL);
  free(p);
  *self = NULL;
}

unsigned beam_fjpool_size(const beam_fjpool_t *self) { return self->n; }

void beam_fjpool_run(beam_fjpool_t *p, unsigned n, beam_fjpool_fn fn, void *ctx) {
  BEAM_ASSERT(n >= 1 && n <= BEAM_FJPOOL_TASKS);
  if (p->n == 1 || n == 1) {
    for (unsigned k = 0; k < n; k++)
      fn(ctx, k);
    return;
  }
  p->fn = fn, p->ctx = ctx;
  atomic_store(&p->done, 0);
  uint64_t g = (atomic_load(&p->claim) >> 32) + 1;
  atomic_store(&p->claim, g << 32 | (uint64_t)n << 16); /* publishes fn, ctx */
  atomic_fetch_add(&p->gen, 1);
  if (atomic_load(&p->sleepers))
    futex_wake(&p->gen, (int)(n - 1 < p->n - 1 ? n - 1 : p->n - 1));
  work(p);
  unsigned v = atomic_load_explicit(&p->done, memory_order_acquire);
  for (int i = 0; i < SPIN && v != n; i++) {
    relax();
    v = atomic_load_explicit(&p->done, memory_order_acquire);
  }
  if (v != n) {
    atomic_store(&p->caller_sleeps, 1);
    while ((v = atomic_load(&p->done)) != n)
      futex_wait(&p->done, v);
    atomic_store(&p->caller_sleeps, 0);
  }
}

unsigned beam_fjpool_cores(void) {
  long c = sysconf(_SC_NPROCESSORS_ONLN);
  return c < 1 ? 1u : c > BEAM_FJPOOL_MAX ? BEAM_FJPOOL_MAX : (unsigned)c;
}
