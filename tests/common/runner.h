/* The main of every C test binary, on top of cmocka: what lets
 * tests/run-unit.sh run each test in its own process (as libuv's runner
 * does), so that a test that crashes or hangs names itself and the others
 * still run.
 *   BEAM_TEST_LIST=1        print the binary's test names, one a line
 *   BEAM_TEST_FILTER=NAME   run only the test NAME (a cmocka glob)
 * Without either, every test runs in this process, as plain cmocka does.
 * Include after <cmocka.h>. */
#ifndef BEAM_TESTS_RUNNER_H
#define BEAM_TESTS_RUNNER_H

#include <stdio.h>
#include <stdlib.h>

static inline int beam__run_tests(const char *group, const struct CMUnitTest *t, size_t n,
                                  CMFixtureFunction setup, CMFixtureFunction teardown) {
  if (getenv("BEAM_TEST_LIST")) {
    for (size_t i = 0; i < n; i++)
      printf("%s\n", t[i].name);
    return 0;
  }
  const char *only = getenv("BEAM_TEST_FILTER");
  if (only && *only)
    cmocka_set_test_filter(only);
  return _cmocka_run_group_tests(group, t, n, setup, teardown);
}

#define beam_run_tests(tests, setup, teardown) \
  beam__run_tests(__FILE__, (tests), sizeof(tests) / sizeof((tests)[0]), (setup), (teardown))

#endif
