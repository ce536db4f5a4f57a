/* Latency histogram: log-spaced buckets from 1 us to ~100 s, lock-free
 * increments (relaxed atomics), percentiles by interpolation inside a bucket.
 * Good to within one bucket width (about 12 %), which is what a p99 on a
 * dashboard needs; exact figures come from the benchmarks. */
#ifndef BEAM_HIST_H
#define BEAM_HIST_H

#ifdef __cplusplus
#include <atomic>
using std::atomic_uint_fast64_t;
#else
#include <stdatomic.h>
#endif
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define BEAM_HIST_BUCKETS 160 /* 20 per decade over 8 decades */

typedef struct beam_hist_s {
  atomic_uint_fast64_t b[BEAM_HIST_BUCKETS];
  atomic_uint_fast64_t count;
  atomic_uint_fast64_t sum_ns;
} beam_hist_t;

void beam_hist_reset(beam_hist_t *h);
void beam_hist_add(beam_hist_t *h, uint64_t ns);
/* q in [0,1]; returns ns (0 when empty). */
double beam_hist_quantile(const beam_hist_t *h, double q);
uint64_t beam_hist_count(const beam_hist_t *h);

#ifdef __cplusplus
}
#endif
#endif
