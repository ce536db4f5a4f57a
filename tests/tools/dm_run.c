/* dm_run: runs the DM engine on raw files, for the integration tests.
 *
 *   dm_run --in DIR --out DIR --n N --obj HxW [options]
 *
 * DIR (in) holds little-endian raw arrays:
 *   amp.f32      views x n x n float32 amplitudes, FFT order, < 0 masked
 *   pos.i32      views x 2 int32 (row, col) window offsets
 *   probe.c128   M_P x n x n complex128 initial probe
 *   object.c128  M_O x H x W complex128 initial object
 * DIR (out) receives probe.c128, object.c128 (final) and metrics.csv
 * (iteration,fourier_error,probe_change,object_change,seconds).
 *
 * Options: --prec f32|f64 --algorithm dm|raar --probe-modes M --object-modes M --beta B
 *   --obj-reg R --probe-reg R --iters K --probe-update-start S
 *   --inner-passes I --fourier-relax F --probe-support S --threads T
 *   --batches B (add the views in B calls)
 * Exit status 0, or 1 with the engine's message on stderr. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pipeline/ptycho/dm.h"

static void *read_all(const char *dir, const char *name, size_t *len) {
  char path[4096];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  FILE *f = fopen(path, "rb");
  if (!f) {
    fprintf(stderr, "dm_run: %s: %s\n", path, strerror(errno));
    return NULL;
  }
  fseek(f, 0, SEEK_END);
  long sz = ftell(f);
  fseek(f, 0, SEEK_SET);
  void *buf = malloc(sz > 0 ? (size_t)sz : 1);
  if (!buf || fread(buf, 1, (size_t)sz, f) != (size_t)sz) {
    fprintf(stderr, "dm_run: %s: short read\n", path);
    free(buf);
    fclose(f);
    return NULL;
  }
  fclose(f);
  *len = (size_t)sz;
  return buf;
}

static int write_all(const char *dir, const char *name, const void *buf, size_t len) {
  char path[4096];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  FILE *f = fopen(path, "wb");
  if (!f || fwrite(buf, 1, len, f) != len) {
    fprintf(stderr, "dm_run: %s: %s\n", path, strerror(errno));
    if (f)
      fclose(f);
    return -1;
  }
  return fclose(f) == 0 ? 0 : -1;
}

static void usage(void) {
  fprintf(stderr, "usage: dm_run --in DIR --out DIR --n N --obj HxW [--prec f32|f64] [--algorithm dm|raar] "
                  "[--probe-modes M] [--object-modes M] [--beta B] [--obj-reg R] "
                  "[--probe-reg R] [--iters K] [--probe-update-start S] [--inner-passes I] "
                  "[--fourier-relax F] [--probe-support S] [--threads T] [--batches B]\n");
}

int main(int argc, char **argv) {
  beam_dm_conf_t c;
  beam_dm_conf_default(&c);
  const char *in = NULL, *out = NULL;
  unsigned iters = 10, batches = 1;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!v) {
      usage();
      return 2;
    }
    i++;
    if (!strcmp(a, "--in")) in = v;
    else if (!strcmp(a, "--out")) out = v;
    else if (!strcmp(a, "--n")) c.n = (uint32_t)strtoul(v, NULL, 10);
    else if (!strcmp(a, "--obj")) {
      if (sscanf(v, "%ux%u", &c.obj_h, &c.obj_w) != 2) {
        usage();
        return 2;
      }
    } else if (!strcmp(a, "--prec")) c.prec = !strcmp(v, "f64") ? BEAM_DM_F64 : BEAM_DM_F32;
    else if (!strcmp(a, "--probe-modes")) c.probe_modes = (uint32_t)strtoul(v, NULL, 10);
    else if (!strcmp(a, "--object-modes")) c.object_modes = (uint32_t)strtoul(v, NULL, 10);
    else if (!strcmp(a, "--beta")) c.beta = strtod(v, NULL);
    else if (!strcmp(a, "--algorithm")) c.algorithm = !strcmp(v, "raar") ? BEAM_DM_ALG_RAAR : BEAM_DM_ALG_DM;
    else if (!strcmp(a, "--obj-reg")) c.obj_reg = strtod(v, NULL);
    else if (!strcmp(a, "--probe-reg")) c.probe_reg = strtod(v, NULL);
    else if (!strcmp(a, "--iters")) iters = (unsigned)strtoul(v, NULL, 10);
    else if (!strcmp(a, "--probe-update-start"))
      c.probe_update_start = (uint32_t)strtoul(v, NULL, 10);
    else if (!strcmp(a, "--inner-passes")) c.inner_passes = (uint32_t)strtoul(v, NULL, 10);
    else if (!strcmp(a, "--fourier-relax")) c.fourier_relax = strtod(v, NULL);
    else if (!strcmp(a, "--probe-support")) c.probe_support = strtod(v, NULL);
    else if (!strcmp(a, "--threads")) c.threads = atoi(v);
    else if (!strcmp(a, "--batches")) batches = (unsigned)strtoul(v, NULL, 10);
    else {
      usage();
      return 2;
    }
  }
  if (!in || !out || c.n == 0 || batches == 0) {
    usage();
    return 2;
  }
  const size_t npx = (size_t)c.n * c.n;
  size_t la, lp, lpr, lo;
  float *amp = read_all(in, "amp.f32", &la);
  int32_t *pos = read_all(in, "pos.i32", &lp);
  double *probe = read_all(in, "probe.c128", &lpr);
  double *obj = read_all(in, "object.c128", &lo);
  beam_diag_t d;
  beam_diag_clear(&d);
  beam_dm_t *e = NULL;
  int rc = -1;
  FILE *mf = NULL;
  if (!amp || !pos || !probe || !obj)
    goto done;
  uint32_t nv = (uint32_t)(lp / (2 * sizeof(int32_t)));
  if (la != nv * npx * sizeof(float) ||
      lpr != c.probe_modes * npx * 2 * sizeof(double) ||
      lo != (size_t)c.object_modes * c.obj_h * c.obj_w * 2 * sizeof(double)) {
    fprintf(stderr, "dm_run: file sizes do not match n, --obj and the mode counts\n");
    goto done;
  }
  c.max_views = nv;
  rc = beam_dm_create(&e, &c, BEAM_DM_CPU, &d);
  if (rc == 0)
    rc = beam_dm_set_probe(e, probe, &d);
  if (rc == 0)
    rc = beam_dm_set_object(e, obj, &d);
  for (uint32_t b = 0; rc == 0 && b < batches; b++) {
    uint32_t v0 = (uint32_t)((uint64_t)nv * b / batches);
    uint32_t v1 = (uint32_t)((uint64_t)nv * (b + 1) / batches);
    rc = beam_dm_add_views(e, v1 - v0, amp + v0 * npx, pos + 2 * (size_t)v0, &d);
  }
  char path[4096];
  snprintf(path, sizeof path, "%s/metrics.csv", out);
  mf = rc == 0 ? fopen(path, "w") : NULL;
  if (rc == 0 && !mf) {
    fprintf(stderr, "dm_run: %s: %s\n", path, strerror(errno));
    rc = -1;
  }
  if (mf)
    fprintf(mf, "iteration,fourier_error,probe_change,object_change,seconds\n");
  for (unsigned it = 0; rc == 0 && it < iters; it++) {
    beam_dm_metrics_t m;
    rc = beam_dm_iterate(e, &m, &d);
    if (rc == 0)
      fprintf(mf, "%u,%.17g,%.17g,%.17g,%.6g\n", m.iteration, m.fourier_error, m.probe_change,
              m.object_change, m.seconds);
  }
  if (mf)
    fclose(mf);
  mf = NULL;
  if (rc == 0) {
    rc = beam_dm_get_probe(e, probe, &d);
    if (rc == 0)
      rc = beam_dm_get_object(e, obj, &d);
  }
  if (rc == 0 && (write_all(out, "probe.c128", probe, lpr) < 0 ||
                  write_all(out, "object.c128", obj, lo) < 0))
    rc = -1;
  if (rc < 0 && d.code)
    fprintf(stderr, "dm_run: %s: %s\n", beam_err_name(d.code), d.msg);
done:
  beam_dm_destroy(&e);
  free(amp);
  free(pos);
  free(probe);
  free(obj);
  return rc == 0 ? 0 : 1;
}
