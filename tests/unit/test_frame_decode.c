/* Unit tests of lazy decode (beam_frame_decode, pipeline/frame.h): a frame
 * that entered the graph still in its wire codec is decoded exactly once
 * into the slot's own storage, however many stage threads ask at the same
 * time (fan-out); the borrowed encoded buffer is released once; a bad
 * payload turns the frame CORRUPT for every caller; the slot comes back to
 * its pool clean; a decoder waits while the encoded bytes are lent
 * (beam_frame_encoded_lend) and decodes after they are returned; the
 * decode pool (decode_pool.h) decodes frames handed to it, once, beside
 * a stage decoding the same frames, and drops what its queue cannot hold.
 * The reference is the original array (memcmp: exact). */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "tests/common/runner.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "pipeline/decode_pool.h"
#include "pipeline/frame.h"

#define H 61
#define W 67 /* H*W not a multiple of 8: bitshuffle's uncompressed tail is exercised */
#define NTHREADS 4

typedef struct enc_s {
  void *buf;
  atomic_int released;
} enc_t;

static void release_enc(beam_frame_t *f, void *ctx) {
  (void)f;
  enc_t *e = ctx;
  atomic_fetch_add(&e->released, 1);
  free(e->buf);
  e->buf = NULL;
}

static uint16_t *pattern(void) {
  uint16_t *a = malloc(H * W * sizeof *a);
  assert_non_null(a);
  uint32_t x = 12345;
  for (int i = 0; i < H * W; i++) {
    x = x * 1664525u + 1013904223u;
    a[i] = (uint16_t)((x >> 28) + (i % W == 7 ? 60000u : 0u)); /* sparse counts, a hot column */
  }
  return a;
}

/* A frame of pool p holding `a` encoded with codec, borrowed from a heap
 * buffer as ingest borrows a ZeroMQ message. */
static beam_frame_t *encoded_frame(beam_pool_t *p, beam_codec_t codec, const uint16_t *a, enc_t *e,
                                   int spoil) {
  size_t raw = H * W * sizeof *a;
  size_t cap = beam_codec_bound(codec, raw, 2);
  void *scratch = malloc(raw);
  e->buf = malloc(cap);
  atomic_init(&e->released, 0);
  assert_non_null(scratch);
  assert_non_null(e->buf);
  int64_t n = beam_codec_encode(codec, a, raw, 2, e->buf, cap, scratch);
  free(scratch);
  assert_true(n > 16);
  if (spoil) /* keep the framing (headers, sizes), ruin the LZ4 stream */
    memset((uint8_t *)e->buf + 16, 0xff, (size_t)n - 16);
  beam_frame_t *f = beam_pool_try_get(p);
  assert_non_null(f);
  f->dtype = BEAM_DT_U16;
  f->ndim = 2;
  f->shape[0] = H;
  f->shape[1] = W;
  f->nbytes = raw;
  f->flags = 0;
  f->data = e->buf;
  f->release = release_enc;
  f->release_ctx = e;
  f->codec = (uint8_t)codec;
  f->enc_size = (size_t)n;
  atomic_store(&f->dec_state, BEAM_DEC_PENDING);
  return f;
}

typedef struct call_s {
  beam_frame_t *f;
  void *scratch;
  pthread_barrier_t *go;
  int rc;
  const char *why;
} call_t;

static void *decode_thread(void *arg) {
  call_t *c = arg;
  pthread_barrier_wait(c->go);
  c->rc = beam_frame_decode(c->f, c->scratch, &c->why);
  return NULL;
}

/* NTHREADS callers at once, each with its own scratch, as fan-out stages. */
static void decode_concurrently(beam_frame_t *f, call_t *calls) {
  pthread_t th[NTHREADS];
  pthread_barrier_t go;
  pthread_barrier_init(&go, NULL, NTHREADS);
  for (int i = 0; i < NTHREADS; i++) {
    calls[i] = (call_t){.f = f, .scratch = malloc(H * W * 2), .go = &go};
    assert_non_null(calls[i].scratch);
    assert_int_equal(pthread_create(&th[i], NULL, decode_thread, &calls[i]), 0);
  }
  for (int i = 0; i < NTHREADS; i++) {
    pthread_join(th[i], NULL);
    free(calls[i].scratch);
  }
  pthread_barrier_destroy(&go);
}

static void check_good(beam_codec_t codec) {
  beam_diag_t d = {0};
  beam_pool_t *p = beam_pool_new(2, H * W * 2, 0, &d);
  assert_non_null(p);
  uint16_t *a = pattern();
  enc_t e;
  beam_frame_t *f = encoded_frame(p, codec, a, &e, 0);
  call_t calls[NTHREADS];
  decode_concurrently(f, calls);
  for (int i = 0; i < NTHREADS; i++)
    assert_int_equal(calls[i].rc, 0);
  assert_int_equal(atomic_load(&e.released), 1); /* encoded buffer given back once */
  assert_ptr_equal(f->data, f->own_data);
  assert_int_equal(atomic_load(&f->dec_state), BEAM_DEC_DONE);
  assert_int_equal(f->codec, BEAM_CODEC_RAW);
  assert_int_equal(f->nbytes, H * W * 2);
  assert_int_equal(f->flags & BEAM_FLAG_CORRUPT, 0);
  assert_memory_equal(f->data, a, H * W * 2);
  /* A second call is a no-op. */
  assert_int_equal(beam_frame_decode(f, NULL, NULL), 0);
  beam_frame_unref(f);
  assert_int_equal(atomic_load(&e.released), 1);
  assert_int_equal(beam_pool_free_count(p), 2);
  free(a);
  beam_pool_close(&p);
}

static void test_decode_bslz4_once(void **state) {
  (void)state;
  check_good(BEAM_CODEC_BSLZ4);
}

static void test_decode_lz4_once(void **state) {
  (void)state;
  check_good(BEAM_CODEC_LZ4);
}

static void test_decode_bad_payload_corrupt(void **state) {
  (void)state;
  beam_diag_t d = {0};
  beam_pool_t *p = beam_pool_new(1, H * W * 2, 0, &d);
  assert_non_null(p);
  uint16_t *a = pattern();
  enc_t e;
  beam_frame_t *f = encoded_frame(p, BEAM_CODEC_BSLZ4, a, &e, 1);
  call_t calls[NTHREADS];
  decode_concurrently(f, calls);
  for (int i = 0; i < NTHREADS; i++) {
    assert_int_equal(calls[i].rc, BEAM_EPROTO);
    assert_non_null(calls[i].why);
  }
  assert_int_equal(atomic_load(&e.released), 1);
  assert_int_equal(atomic_load(&f->dec_state), BEAM_DEC_FAILED);
  assert_true(f->flags & BEAM_FLAG_CORRUPT);
  assert_int_equal(f->nbytes, 0);
  assert_ptr_equal(f->data, f->own_data);
  beam_frame_unref(f);
  /* The slot comes back clean: the next user sees a plain raw frame. */
  beam_frame_t *g = beam_pool_try_get(p);
  assert_ptr_equal(g, f);
  assert_int_equal(atomic_load(&g->dec_state), BEAM_DEC_NONE);
  assert_int_equal(g->codec, BEAM_CODEC_RAW);
  assert_null(g->release);
  beam_frame_unref(g);
  free(a);
  beam_pool_close(&p);
}

/* keep_encoded (a pass-through stage beside decoding stages): the decode
 * keeps the wire bytes, unchanged and unreleased, until the last unref;
 * a failed decode keeps nothing; a slot comes back without them. */
static void test_decode_keeps_encoded(void **state) {
  (void)state;
  beam_diag_t d = {0};
  beam_pool_t *p = beam_pool_new(1, H * W * 2, 0, &d);
  assert_non_null(p);
  uint16_t *a = pattern();
  void *scratch = malloc(H * W * 2);
  assert_non_null(scratch);
  for (int spoil = 0; spoil <= 1; spoil++) {
    enc_t e;
    beam_frame_t *f = encoded_frame(p, BEAM_CODEC_BSLZ4, a, &e, spoil);
    f->keep_encoded = 1;
    const void *wire = e.buf;
    size_t wire_len = f->enc_size;
    const void *kd;
    size_t kl;
    beam_codec_t kc;
    assert_int_equal(beam_frame_encoded_kept(f, &kd, &kl, &kc), 0); /* not decoded yet */
    const char *why = NULL;
    assert_int_equal(beam_frame_decode(f, scratch, &why), spoil ? BEAM_EPROTO : 0);
    if (!spoil) {
      assert_memory_equal(f->data, a, H * W * 2);
      assert_int_equal(beam_frame_encoded_kept(f, &kd, &kl, &kc), 1);
      assert_ptr_equal(kd, wire);
      assert_int_equal(kl, wire_len);
      assert_int_equal(kc, BEAM_CODEC_BSLZ4);
      assert_int_equal(atomic_load(&e.released), 0);
    } else {
      assert_int_equal(beam_frame_encoded_kept(f, &kd, &kl, &kc), 0);
      assert_int_equal(atomic_load(&e.released), 1);
    }
    beam_frame_unref(f);
    assert_int_equal(atomic_load(&e.released), 1);
    beam_frame_t *g = beam_pool_try_get(p);
    assert_int_equal(g->keep_encoded, 0);
    assert_null(g->enc_data);
    beam_frame_unref(g);
  }
  free(scratch);
  free(a);
  beam_pool_close(&p);
}

/* NF frames through a 2-thread decode pool with a queue of 4 while this
 * thread, as a stage, decodes the same frames in order: each is decoded
 * exactly once (its buffer released once), right, by whichever got there
 * first; frames beyond the queue are left to the stage; a broken one is
 * CORRUPT for both. ASan checks the references (every frame back). */
#define NF 24
static void test_decode_pool(void **state) {
  (void)state;
  beam_diag_t d = {0};
  beam_pool_t *p = beam_pool_new(NF, H * W * 2, 0, &d);
  assert_non_null(p);
  beam_decode_pool_t *dp = beam_decode_pool_new(2, 4, H * W * 2, &d);
  assert_non_null(dp);
  uint16_t *a = pattern();
  void *scratch = malloc(H * W * 2);
  assert_non_null(scratch);
  enc_t e[NF];
  beam_frame_t *f[NF];
  for (int i = 0; i < NF; i++) {
    f[i] = encoded_frame(p, i % 3 ? BEAM_CODEC_BSLZ4 : BEAM_CODEC_LZ4, a, &e[i], i == 7);
    beam_frame_ref(f[i], 1);
    beam_decode_pool_push(dp, f[i]);
  }
  for (int i = 0; i < NF; i++) {
    const char *why = NULL;
    int rc = beam_frame_decode(f[i], scratch, &why);
    if (i == 7) {
      assert_int_equal(rc, BEAM_EPROTO);
      assert_true(f[i]->flags & BEAM_FLAG_CORRUPT);
    } else {
      assert_int_equal(rc, 0);
      assert_memory_equal(f[i]->data, a, H * W * 2);
    }
    assert_int_equal(atomic_load(&e[i].released), 1);
    beam_frame_unref(f[i]);
  }
  unsigned long long ahead = beam_decode_pool_decoded(dp);
  beam_decode_pool_free(&dp);
  assert_null(dp);
  assert_true(ahead <= NF);
  assert_int_equal(beam_pool_free_count(p), NF); /* every reference came back */
  free(scratch);
  free(a);
  beam_pool_close(&p);
}

static void test_decode_too_large_for_slot(void **state) {
  (void)state;
  beam_diag_t d = {0};
  beam_pool_t *p = beam_pool_new(1, H * W, 0, &d); /* half the frame */
  assert_non_null(p);
  uint16_t *a = pattern();
  enc_t e;
  beam_frame_t *f = encoded_frame(p, BEAM_CODEC_LZ4, a, &e, 0);
  const char *why = NULL;
  assert_int_equal(beam_frame_decode(f, NULL, &why), BEAM_EPROTO);
  assert_non_null(why);
  assert_true(f->flags & BEAM_FLAG_CORRUPT);
  assert_int_equal(atomic_load(&e.released), 1);
  beam_frame_unref(f);
  free(a);
  beam_pool_close(&p);
}

/* A decoder that arrives while the encoded bytes are lent (record's
 * pass-through) waits, and decodes once they come back: it must neither
 * free the buffer under the borrower nor return with the frame still
 * encoded. The decoder is started while the loan is held and given time to
 * reach its wait, so the order is forced, not left to the scheduler. */
static void test_decode_waits_for_loan(void **state) {
  (void)state;
  beam_diag_t d = {0};
  beam_pool_t *p = beam_pool_new(1, H * W * 2, 0, &d);
  assert_non_null(p);
  uint16_t *a = pattern();
  enc_t e;
  beam_frame_t *f = encoded_frame(p, BEAM_CODEC_BSLZ4, a, &e, 0);
  void *enc = f->data;
  size_t enc_size = f->enc_size;
  assert_int_equal(beam_frame_encoded_lend(f), 1);
  assert_int_equal(beam_frame_encoded_lend(f), 0); /* one loan at a time */
  pthread_barrier_t go;
  pthread_barrier_init(&go, NULL, 2);
  call_t c = {.f = f, .scratch = malloc(H * W * 2), .go = &go};
  assert_non_null(c.scratch);
  pthread_t th;
  assert_int_equal(pthread_create(&th, NULL, decode_thread, &c), 0);
  pthread_barrier_wait(&go);
  struct timespec nap = {0, 20 * 1000 * 1000};
  nanosleep(&nap, NULL);
  /* Still lent: nothing decoded, nothing released, bytes where they were. */
  assert_int_equal(atomic_load(&f->dec_state), BEAM_DEC_BUSY);
  assert_int_equal(atomic_load(&e.released), 0);
  assert_ptr_equal(f->data, enc);
  assert_int_equal(f->enc_size, enc_size);
  beam_frame_encoded_return(f);
  pthread_join(th, NULL);
  pthread_barrier_destroy(&go);
  free(c.scratch);
  assert_int_equal(c.rc, 0);
  assert_int_equal(atomic_load(&f->dec_state), BEAM_DEC_DONE);
  assert_int_equal(atomic_load(&e.released), 1);
  assert_memory_equal(f->data, a, H * W * 2);
  /* Decoded frames (and raw ones) have nothing to lend. */
  assert_int_equal(beam_frame_encoded_lend(f), 0);
  assert_int_equal(atomic_load(&f->dec_state), BEAM_DEC_DONE);
  beam_frame_unref(f);
  beam_frame_t *g = beam_pool_try_get(p);
  assert_int_equal(beam_frame_encoded_lend(g), 0);
  assert_int_equal(atomic_load(&g->dec_state), BEAM_DEC_NONE);
  beam_frame_unref(g);
  free(a);
  beam_pool_close(&p);
}

static void test_raw_frame_untouched(void **state) {
  (void)state;
  beam_diag_t d = {0};
  beam_pool_t *p = beam_pool_new(1, 64, 0, &d);
  assert_non_null(p);
  beam_frame_t *f = beam_pool_try_get(p);
  memset(f->data, 7, 64);
  f->nbytes = 64;
  assert_int_equal(beam_frame_decode(f, NULL, NULL), 0);
  assert_int_equal(atomic_load(&f->dec_state), BEAM_DEC_NONE);
  assert_int_equal(((uint8_t *)f->data)[63], 7);
  beam_frame_unref(f);
  beam_pool_close(&p);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_decode_bslz4_once),
      cmocka_unit_test(test_decode_lz4_once),
      cmocka_unit_test(test_decode_bad_payload_corrupt),
      cmocka_unit_test(test_decode_too_large_for_slot),
      cmocka_unit_test(test_decode_keeps_encoded),
      cmocka_unit_test(test_decode_pool),
      cmocka_unit_test(test_decode_waits_for_loan),
      cmocka_unit_test(test_raw_frame_untouched),
  };
  return beam_run_tests(tests, NULL, NULL);
}
