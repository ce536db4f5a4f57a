#include "pipeline/cache.h"

#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

/* The highest-numbered cache index the kernel lists (index3 = L3 on x86,
 * the last level on most ARM servers), its size in KiB. */
static size_t sysfs_llc(void) {
  size_t best = 0;
  for (int i = 0; i < 8; i++) {
    char path[96];
    snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/size", i);
    FILE *f = fopen(path, "r");
    if (!f)
      continue;
    unsigned long v = 0;
    char unit = 0;
    if (fscanf(f, "%lu%c", &v, &unit) >= 1) {
      size_t b = unit == 'M' ? (size_t)v << 20 : unit == 'K' ? (size_t)v << 10 : (size_t)v;
      if (b > best)
        best = b;
    }
    fclose(f);
  }
  return best;
}

size_t beam_llc_bytes(void) {
  static atomic_size_t cached = 0; /* 0 = not read yet; SIZE_MAX = unknown */
  size_t v = atomic_load(&cached);
  if (v)
    return v == SIZE_MAX ? 0 : v;
  long sc = -1;
#ifdef _SC_LEVEL3_CACHE_SIZE
  sc = sysconf(_SC_LEVEL3_CACHE_SIZE);
#endif
  v = sc > 0 ? (size_t)sc : sysfs_llc();
  atomic_store(&cached, v ? v : SIZE_MAX);
  return v;
}

int beam_cache_resident(size_t bytes) {
  size_t llc = beam_llc_bytes();
  return llc ? bytes <= llc / 4 : bytes <= (2u << 20);
}

size_t beam_mem_available(void) {
  FILE *f = fopen("/proc/meminfo", "r");
  if (!f)
    return 0;
  char line[256];
  size_t kb = 0;
  while (fgets(line, sizeof line, f))
    if (sscanf(line, "MemAvailable: %zu kB", &kb) == 1)
      break;
  fclose(f);
  return kb * 1024;
}
