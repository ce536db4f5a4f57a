/* beamd-ptycho --png: 8-bit greyscale previews with libpng's simplified
 * API. Percentile scaling keeps a few hot or dead pixels at the scan edge
 * from flattening the contrast of the rest. */
#include "tools/beamd-ptycho/ptycho.h"

#include <errno.h>
#include <math.h>
#include <png.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static int cmp_dbl(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static int save(const char *dir, const char *name, const uint8_t *px, uint32_t h, uint32_t w,
                beam_diag_t *d) {
  char path[4096];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  png_image img;
  memset(&img, 0, sizeof img);
  img.version = PNG_IMAGE_VERSION;
  img.width = w;
  img.height = h;
  img.format = PNG_FORMAT_GRAY;
  if (!png_image_write_to_file(&img, path, 0, px, (png_int_32)w, NULL))
    return BEAM_DIAG(d, BEAM_EIO, "png %s: %s", path, img.message);
  return 0;
}

/* v (h x w) -> 8 bits, lo..hi linear, clamped. */
static void to8(const double *v, size_t np, double lo, double hi, uint8_t *out) {
  double s = hi > lo ? 255.0 / (hi - lo) : 0.0;
  for (size_t i = 0; i < np; i++) {
    double t = (v[i] - lo) * s;
    out[i] = (uint8_t)(t < 0 ? 0 : t > 255 ? 255 : t + 0.5);
  }
}

static int object_mode(const char *dir, const double *o, uint32_t k, uint32_t h, uint32_t w,
                       uint32_t r0, uint32_t r1, uint32_t c0, uint32_t c1, double *amp,
                       double *ph, double *tmp, uint8_t *px, beam_diag_t *d) {
  size_t np = (size_t)h * w, nr = 0;
  double sr = 0, si = 0;
  for (uint32_t y = r0; y < r1; y++)
    for (uint32_t x = c0; x < c1; x++) {
      const double *p = o + 2 * ((size_t)y * w + x);
      sr += p[0];
      si += p[1];
      tmp[nr++] = hypot(p[0], p[1]);
    }
  double g = atan2(si, sr); /* the global phase is arbitrary in ptychography */
  for (size_t i = 0; i < np; i++) {
    amp[i] = hypot(o[2 * i], o[2 * i + 1]);
    double a = atan2(o[2 * i + 1], o[2 * i]) - g;
    ph[i] = a - 2.0 * M_PI * floor((a + M_PI) / (2.0 * M_PI));
  }
  double lo = 0, hi = 1;
  if (nr) {
    qsort(tmp, nr, sizeof *tmp, cmp_dbl);
    lo = tmp[nr / 100];
    hi = tmp[nr - 1 - nr / 100];
  }
  char name[64];
  to8(amp, np, lo, hi, px);
  snprintf(name, sizeof name, k ? "object_mode%u_amplitude.png" : "object_amplitude.png", k);
  int rc = save(dir, name, px, h, w, d);
  to8(ph, np, -M_PI, M_PI, px);
  snprintf(name, sizeof name, k ? "object_mode%u_phase.png" : "object_phase.png", k);
  return rc < 0 ? rc : save(dir, name, px, h, w, d);
}

int pt_png_write(const char *dir, const double *object, uint32_t obj_modes, uint32_t h,
                 uint32_t w, uint32_t r0, uint32_t r1, uint32_t c0, uint32_t c1,
                 const double *probe, uint32_t probe_modes, uint32_t n, beam_diag_t *d) {
  if (mkdir(dir, 0777) < 0 && errno != EEXIST)
    return BEAM_DIAG(d, BEAM_EIO, "png directory %s: %s", dir, strerror(errno));
  size_t np = (size_t)h * w, pp = (size_t)n * n, big = np > pp ? np : pp;
  double *amp = malloc(big * sizeof *amp), *ph = malloc(np * sizeof *ph);
  double *tmp = malloc(np * sizeof *tmp);
  uint8_t *px = malloc(big);
  int rc = 0;
  if (!amp || !ph || !tmp || !px)
    rc = BEAM_DIAG(d, BEAM_ENOMEM, "png buffers");
  if (r1 > h) r1 = h;
  if (c1 > w) c1 = w;
  for (uint32_t k = 0; k < obj_modes && rc == 0; k++)
    rc = object_mode(dir, object + 2 * np * k, k, h, w, r0, r1, c0, c1, amp, ph, tmp, px, d);
  for (uint32_t j = 0; j < probe_modes && rc == 0; j++) {
    const double *p = probe + 2 * pp * j;
    double mx = 0;
    for (size_t i = 0; i < pp; i++) {
      amp[i] = hypot(p[2 * i], p[2 * i + 1]);
      mx = amp[i] > mx ? amp[i] : mx;
    }
    to8(amp, pp, 0, mx, px);
    char name[64];
    snprintf(name, sizeof name, "probe_mode%u_amplitude.png", j);
    rc = save(dir, name, px, n, n, d);
  }
  free(amp);
  free(ph);
  free(tmp);
  free(px);
  return rc;
}
