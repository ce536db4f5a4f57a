/* Log-bucketed latency histogram (see hist.h). Bucket i covers
 * [10^(3 + i/20), 10^(3 + (i+1)/20)) ns, so bucket 0 starts at 1 us. */
#include "pipeline/hist.h"

#include <math.h>

#define PER_DECADE 20.0
#define LOG_MIN 3.0 /* 1 us */

void beam_hist_reset(beam_hist_t *h) {
  for (int i = 0; i < BEAM_HIST_BUCKETS; i++)
    atomic_store_explicit(&h->b[i], 0, memory_order_relaxed);
  atomic_store(&h->count, 0);
  atomic_store(&h->sum_ns, 0);
}

static int bucket_of(uint64_t ns) {
  if (ns < 1000)
    return 0;
  int i = (int)((log10((double)ns) - LOG_MIN) * PER_DECADE);
  if (i < 0)
    i = 0;
  if (i >= BEAM_HIST_BUCKETS)
    i = BEAM_HIST_BUCKETS - 1;
  return i;
}

void beam_hist_add(beam_hist_t *h, uint64_t ns) {
  atomic_fetch_add_explicit(&h->b[bucket_of(ns)], 1, memory_order_relaxed);
  atomic_fetch_add_explicit(&h->count, 1, memory_order_relaxed);
  atomic_fetch_add_explicit(&h->sum_ns, ns, memory_order_relaxed);
}

uint64_t beam_hist_count(const beam_hist_t *h) {
  return atomic_load_explicit(&h->count, memory_order_relaxed);
}

double beam_hist_quantile(const beam_hist_t *h, double q) {
  uint64_t counts[BEAM_HIST_BUCKETS], total = 0;
  for (int i = 0; i < BEAM_HIST_BUCKETS; i++) {
    counts[i] = atomic_load_explicit(&h->b[i], memory_order_relaxed);
    total += counts[i];
  }
  if (total == 0)
    return 0.0;
  if (q < 0)
    q = 0;
  if (q > 1)
    q = 1;
  double target = q * (double)total, acc = 0;
  for (int i = 0; i < BEAM_HIST_BUCKETS; i++) {
    if (counts[i] == 0)
      continue;
    if (acc + (double)counts[i] >= target) {
      /* Interpolate geometrically inside the bucket. */
      double frac = ((double)counts[i] > 0) ? (target - acc) / (double)counts[i] : 0;
      return pow(10.0, LOG_MIN + (i + frac) / PER_DECADE);
    }
    acc += (double)counts[i];
  }
  return pow(10.0, LOG_MIN + BEAM_HIST_BUCKETS / PER_DECADE);
}
