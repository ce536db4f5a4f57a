/* Shared pieces of the CPU-vs-CUDA cross-checks: two harnesses on the same
 * config, fed the same frames. Header-only so each test stays one file. */
#ifndef BEAM_TEST_XCHECK_H
#define BEAM_TEST_XCHECK_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "gpu/gpu.h"
#include "tests/common/stage_harness.h"

typedef struct xpair_s {
  bh_t *cpu, *gpu;
} xpair_t;

/* cfg_of() is called twice so each side owns its tree. */
static inline void xpair_new(xpair_t *x, const beam_stage_ops_t *cpu, const beam_stage_ops_t *gpu,
                             const beam_param_t *params, beam_cnode_t *(*cfg_of)(void)) {
  beam_cnode_t *a = cfg_of(), *b = cfg_of();
  assert_int_equal(bh_validate(a, params, NULL, 0), 0);
  assert_int_equal(bh_validate(b, params, NULL, 0), 0);
  beam_diag_t d = {0};
  if (bh_new(&x->cpu, cpu, a, &d) != 0)
    fail_msg("cpu init: %s", d.msg);
  beam_diag_clear(&d);
  if (bh_new(&x->gpu, gpu, b, &d) != 0)
    fail_msg("cuda init: %s", d.msg);
}

static inline void xpair_start(xpair_t *x, beam_dtype_t dt, uint32_t ndim, const uint32_t *shape) {
  beam_diag_t d = {0};
  if (bh_start(x->cpu, dt, ndim, shape, &d) != 0)
    fail_msg("cpu start: %s", d.msg);
  beam_diag_clear(&d);
  if (bh_start(x->gpu, dt, ndim, shape, &d) != 0)
    fail_msg("cuda start: %s", d.msg);
}

static inline void xpair_process(xpair_t *x, const beam_frame_t *in) {
  if (bh_process(x->cpu, in) != 0)
    fail_msg("cpu process: %s", x->cpu->st.diag.msg);
  if (bh_process(x->gpu, in) != 0)
    fail_msg("cuda process: %s", x->gpu->st.diag.msg);
}

static inline void xpair_end(xpair_t *x) {
  assert_int_equal(bh_end(x->cpu), 0);
  assert_int_equal(bh_end(x->gpu), 0);
}

/* Same results in the same order, same identity and shape; pixels compared
 * bit for bit. */
static inline void xpair_expect_identical(const xpair_t *x) {
  assert_int_equal(x->cpu->nres, x->gpu->nres);
  for (size_t i = 0; i < x->cpu->nres; i++) {
    const beam_frame_t *c = x->cpu->res[i], *g = x->gpu->res[i];
    assert_int_equal(x->cpu->res_out[i], x->gpu->res_out[i]);
    assert_int_equal(c->frame_id, g->frame_id);
    assert_int_equal(c->flags, g->flags);
    assert_int_equal(c->nbytes, g->nbytes);
    size_t bad = bh_bits_differ(c->data, g->data, c->nbytes);
    if (bad)
      fail_msg("result %zu: %zu bytes differ between cpu and cuda", i, bad);
  }
}

/* Without a device the CUDA backend must refuse cleanly at init (ENOTSUP,
 * a message saying why) and stay destroyable; then the test skips. */
static inline void xcheck_expect_no_device(const beam_stage_ops_t *gpu, const beam_param_t *params,
                                           beam_cnode_t *(*cfg_of)(void)) {
  beam_cnode_t *c = cfg_of();
  assert_int_equal(bh_validate(c, params, NULL, 0), 0);
  bh_t *h;
  beam_diag_t d = {0};
  int rc = bh_new(&h, gpu, c, &d);
  if (rc != BEAM_ENOTSUP || !(strstr(d.msg, "without CUDA") || strstr(d.msg, "needs a CUDA device")))
    fail_msg("cuda init without a device: rc %d, \"%s\"", rc, d.msg);
  bh_free(&h);
  skip();
}

static inline void xpair_free(xpair_t *x) {
  bh_free(&x->cpu);
  bh_free(&x->gpu);
}

#endif
