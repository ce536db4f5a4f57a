/* The CPU backends' fork-join pool (pipeline/fjpool.h): every
 * task of a run runs exactly once and its writes are visible when the run
 * returns, for task counts below, at and above the thread count; pools
 * created and destroyed at once (a helper that first runs after destroy
 * must still see it: this hung once) or after a few runs; bad sizes. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "tests/common/runner.h"

#include <string.h>

#include "pipeline/fjpool.h"

typedef struct job_s {
  unsigned hits[64];
  unsigned gen;
  unsigned seen[64]; /* the caller's gen each task saw */
} job_t;

static void task(void *ctx, unsigned k) {
  job_t *j = ctx;
  j->hits[k]++; /* one writer per k: no atomics needed if each runs once */
  j->seen[k] = j->gen;
}

static void test_each_task_once(void **state) {
  for (unsigned th = 1; th <= 4; th++) {
    beam_fjpool_t *p;
    beam_diag_t d = {0};
    assert_int_equal(beam_fjpool_new(&p, th, "test", &d), 0);
    assert_int_equal(beam_fjpool_size(p), th);
    job_t j;
    memset(&j, 0, sizeof j);
    for (unsigned r = 0; r < 3000; r++) {
      unsigned n = 1 + r % 40;
      j.gen = r; /* written before the run: every task must see it */
      beam_fjpool_run(p, n, task, &j);
      for (unsigned k = 0; k < n; k++) {
        if (j.hits[k] != 1 || j.seen[k] != r)
          fail_msg("threads %u run %u: task %u ran %u times, saw run %u", th, r, k, j.hits[k], j.seen[k]);
        j.hits[k] = 0;
      }
      for (unsigned k = n; k < 64; k++)
        assert_int_equal(j.hits[k], 0);
    }
    beam_fjpool_destroy(&p);
    assert_null(p);
    beam_fjpool_destroy(&p); /* NULL-safe */
  }
}

static void test_create_destroy(void **state) {
  job_t j;
  memset(&j, 0, sizeof j);
  for (unsigned it = 0; it < 2000; it++) {
    beam_fjpool_t *p;
    beam_diag_t d = {0};
    assert_int_equal(beam_fjpool_new(&p, 2 + it % 3, "test", &d), 0);
    for (unsigned r = 0; r < it % 4; r++)
      beam_fjpool_run(p, 3, task, &j);
    beam_fjpool_destroy(&p); /* must return: helpers may not have run yet */
  }
}

static void test_bad_sizes(void **state) {
  beam_fjpool_t *p = (beam_fjpool_t *)1;
  beam_diag_t d = {0};
  assert_int_equal(beam_fjpool_new(&p, 0, "xpcs_multitau", &d), BEAM_EINVAL);
  assert_null(p);
  assert_non_null(strstr(d.msg, "xpcs_multitau: threads must be 1..64"));
  assert_int_equal(beam_fjpool_new(&p, BEAM_FJPOOL_MAX + 1, "x", &d), BEAM_EINVAL);
  assert_true(beam_fjpool_cores() >= 1);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_each_task_once),
      cmocka_unit_test(test_create_destroy),
      cmocka_unit_test(test_bad_sizes),
  };
  return beam_run_tests(tests, NULL, NULL);
}
