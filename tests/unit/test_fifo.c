/* Unit tests of the growable FIFO used for the result queue and the PUSH
 * backlog: order kept across growth while the ring is wrapped. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "tests/common/runner.h"

#include "daemon/fifo.h"

static void test_order_across_growth(void **state) {
  (void)state;
  beam_fifo_t f;
  beam_fifo_init(&f, sizeof(int));
  assert_null(beam_fifo_front(&f));
  assert_int_equal(beam_fifo_pop(&f, NULL), 0);
  int next_in = 0, next_out = 0;
  /* Interleave pushes and pops so growth happens with head != 0. */
  for (int round = 0; round < 50; round++) {
    for (int k = 0; k < 7 + round; k++) {
      assert_int_equal(beam_fifo_push(&f, &next_in), 0);
      next_in++;
    }
    for (int k = 0; k < 5 + round / 2; k++) {
      int v = -1;
      assert_int_equal(beam_fifo_pop(&f, &v), 1);
      assert_int_equal(v, next_out);
      next_out++;
    }
  }
  assert_int_equal(f.count, (size_t)(next_in - next_out));
  int *front = beam_fifo_front(&f);
  assert_int_equal(*front, next_out);
  int v;
  while (beam_fifo_pop(&f, &v))
    assert_int_equal(v, next_out++);
  assert_int_equal(next_out, next_in);
  beam_fifo_free(&f);
  assert_null(f.buf);
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_order_across_growth)};
  return beam_run_tests(tests, NULL, NULL);
}
