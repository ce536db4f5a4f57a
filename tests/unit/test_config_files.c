/* Runs the configuration corpus: every tests/configs/bad/X.yaml must fail
 * to load with exactly the messages in X.expect (one per line, in order),
 * and every tests/configs/good/X.yaml must load without a message.
 *
 * Files are loaded from inside their directory, so messages name the bare
 * file ("cycle.yaml:5:12: error: ...") whatever the checkout's path. The
 * tree is found through $BEAM_SRCDIR (default "."; the tests run from the
 * repository root). */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "tests/common/runner.h"

#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "daemon/config.h"
#include "proto/err.h"

/* At least this many bad cases: the corpus must not shrink unnoticed. */
#define MIN_BAD_CASES 15

static int cmp_str(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Sorted list of the *.yaml names in dir (NULL-terminated, malloc'd). */
static char **list_yaml(const char *dir, size_t *n) {
  DIR *d = opendir(dir);
  if (!d) {
    print_error("cannot open directory %s\n", dir);
    fail();
  }
  char **v = NULL;
  size_t cnt = 0;
  struct dirent *de;
  while ((de = readdir(d))) {
    size_t len = strlen(de->d_name);
    if (len < 6 || strcmp(de->d_name + len - 5, ".yaml"))
      continue;
    v = realloc(v, (cnt + 2) * sizeof *v);
    assert_non_null(v);
    v[cnt++] = strdup(de->d_name);
  }
  closedir(d);
  if (cnt)
    qsort(v, cnt, sizeof *v, cmp_str);
  else
    v = calloc(1, sizeof *v);
  v[cnt] = NULL;
  *n = cnt;
  return v;
}

static void free_list(char **v) {
  for (size_t i = 0; v && v[i]; i++)
    free(v[i]);
  free(v);
}

static char *read_text(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f)
    return NULL;
  size_t cap = 4096, n = 0;
  char *buf = malloc(cap);
  size_t r;
  while (buf && (r = fread(buf + n, 1, cap - n - 1, f)) > 0) {
    n += r;
    if (n + 1 == cap)
      buf = realloc(buf, cap *= 2);
  }
  fclose(f);
  if (buf)
    buf[n] = '\0';
  return buf;
}

/* Enters $BEAM_SRCDIR/tests/configs/<sub>; returns a fd of the old cwd. */
static int enter(const char *sub) {
  const char *src = getenv("BEAM_SRCDIR");
  char dir[4096];
  snprintf(dir, sizeof dir, "%s/tests/configs/%s", src && src[0] ? src : ".", sub);
  int back = open(".", O_RDONLY | O_DIRECTORY);
  assert_true(back >= 0);
  if (chdir(dir) != 0) {
    print_error("cannot enter %s (set BEAM_SRCDIR to the source tree)\n", dir);
    fail();
  }
  return back;
}

static void leave(int back) {
  assert_int_equal(fchdir(back), 0);
  close(back);
}

static void test_bad_configs(void **state) {
  int back = enter("bad");
  size_t n;
  char **names = list_yaml(".", &n);
  int failures = 0;
  for (size_t i = 0; i < n; i++) {
    char expect_path[1024];
    snprintf(expect_path, sizeof expect_path, "%.*s.expect", (int)(strlen(names[i]) - 5),
             names[i]);
    char *expect = read_text(expect_path);
    if (!expect) {
      print_error("%s: missing %s\n", names[i], expect_path);
      failures++;
      continue;
    }
    beam_cfg_errs_t e = {0};
    beam_config_t *c = NULL;
    int rc = beam_config_load_file(names[i], &c, &e);
    int ok = rc == BEAM_ECONFIG && c == NULL && e.n > 0;
    /* Compare line by line so a mismatch report says which one. */
    size_t k = 0;
    char *save = NULL;
    for (char *line = strtok_r(expect, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
      if (k >= e.n || strcmp(line, e.msgs[k])) {
        print_error("%s: message %zu\n  expected: %s\n  got:      %s\n", names[i], k + 1, line,
                    k < e.n ? e.msgs[k] : "(none)");
        ok = 0;
      }
      k++;
    }
    if (k == 0) {
      print_error("%s: %s is empty\n", names[i], expect_path);
      ok = 0;
    }
    for (; k < e.n; k++) {
      print_error("%s: unexpected extra message: %s\n", names[i], e.msgs[k]);
      ok = 0;
    }
    if (!ok) {
      print_error("%s: rc %d (%s)\n", names[i], rc, beam_err_name(rc));
      failures++;
    }
    beam_config_free(&c);
    beam_cfg_errs_free(&e);
    free(expect);
  }
  if (n < MIN_BAD_CASES) {
    print_error("only %zu bad configs (want at least %d)\n", n, MIN_BAD_CASES);
    failures++;
  }
  free_list(names);
  leave(back);
  assert_int_equal(failures, 0);
}

static void test_good_configs(void **state) {
  int back = enter("good");
  size_t n;
  char **names = list_yaml(".", &n);
  int failures = 0;
  for (size_t i = 0; i < n; i++) {
    beam_cfg_errs_t e = {0};
    beam_config_t *c = NULL;
    int rc = beam_config_load_file(names[i], &c, &e);
    for (size_t k = 0; k < e.n; k++)
      print_error("%s\n", e.msgs[k]);
    if (rc != 0 || !c || e.n) {
      print_error("%s: rc %d (%s)\n", names[i], rc, beam_err_name(rc));
      failures++;
    } else {
      /* A good file's dump must load too and dump the same. */
      char *d1 = beam_cfg_dump(c->root);
      beam_config_t *c2 = NULL;
      assert_non_null(d1);
      if (beam_config_load_string(d1, strlen(d1), "dump", &c2, &e) != 0) {
        print_error("%s: its dump does not load\n", names[i]);
        failures++;
      } else {
        char *d2 = beam_cfg_dump(c2->root);
        if (!d2 || strcmp(d1, d2)) {
          print_error("%s: dump is not stable\n", names[i]);
          failures++;
        }
        free(d2);
      }
      free(d1);
      beam_config_free(&c2);
    }
    beam_config_free(&c);
    beam_cfg_errs_free(&e);
  }
  assert_true(n >= 1);
  free_list(names);
  leave(back);
  assert_int_equal(failures, 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_bad_configs),
      cmocka_unit_test(test_good_configs),
  };
  return beam_run_tests(tests, NULL, NULL);
}
