/* Geometry of stage kind `azint`: pyFAI's PONI convention (pyFAI.geometry,
 * 0.21: rotation_matrix, tth, chi, qFunction, diffSolidAngle,
 * polarization) written out for one point, and the .poni file reader.
 * Not the binning: that is azint.c. */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pipeline/kern/azint.h"

/* t = R3 R2 R1 (p1, p2, dist): rotation 1 and 2 left-handed, 3
 * right-handed, as pyFAI states them. */
void beam_azint_lab(const beam_azint_geom_t *g, double p1, double p2, double t[3]) {
  double c1 = cos(g->rot1), s1 = sin(g->rot1), c2 = cos(g->rot2), s2 = sin(g->rot2);
  double c3 = cos(g->rot3), s3 = sin(g->rot3), L = g->dist;
  /* R1 */
  double a0 = p1, a1 = c1 * p2 + s1 * L, a2 = -s1 * p2 + c1 * L;
  /* R2 */
  double b0 = c2 * a0 - s2 * a2, b1 = a1, b2 = s2 * a0 + c2 * a2;
  /* R3 */
  t[0] = c3 * b0 - s3 * b1;
  t[1] = s3 * b0 + c3 * b1;
  t[2] = b2;
}

void beam_azint_tth_chi(const beam_azint_geom_t *g, double p1, double p2, double *tth, double *chi) {
  double t[3];
  beam_azint_lab(g, p1, p2, t);
  *tth = atan2(sqrt(t[0] * t[0] + t[1] * t[1]), t[2]);
  *chi = atan2(t[0], t[1]);
}

double beam_azint_radial(const beam_azint_geom_t *g, beam_azint_unit_t u, double tth) {
  if (u == BEAM_AZINT_2TH_DEG)
    return tth;
  /* pyFAI: q = 4e-9 π / λ sin(2θ / 2), nm⁻¹ with λ in metres */
  return 4.0e-9 * M_PI / g->wavelength * sin(tth / 2.0);
}

double beam_azint_scale(beam_azint_unit_t u) {
  return u == BEAM_AZINT_2TH_DEG ? 180.0 / M_PI : u == BEAM_AZINT_Q_A ? 0.1 : 1.0;
}

double beam_azint_solid_angle(const beam_azint_geom_t *g, double p1, double p2) {
  double cosa = g->dist / sqrt(g->dist * g->dist + (p1 * p1 + p2 * p2));
  return cosa * cosa * cosa;
}

double beam_azint_polarization(double tth, double chi, double f) {
  double c2 = cos(tth) * cos(tth);
  return 0.5 * (1.0 + c2 - f * cos(2.0 * chi) * (1.0 - c2));
}

/* ---- .poni files ------------------------------------------------------------ */

static int num_after(const char *s, double *v) {
  char *end;
  while (*s == ' ' || *s == '\t')
    s++;
  errno = 0;
  *v = strtod(s, &end);
  if (end == s || errno || !isfinite(*v))
    return -1;
  while (*end == ' ' || *end == '\t' || *end == '\r' || *end == '\n')
    end++;
  return *end == '\0' || *end == ',' || *end == '}' ? 0 : -1;
}

/* "key": number inside the Detector_config JSON object. */
static int json_num(const char *obj, const char *key, double *v) {
  char pat[32];
  snprintf(pat, sizeof pat, "\"%s\"", key);
  const char *p = strstr(obj, pat);
  if (!p)
    return -1;
  p += strlen(pat);
  while (*p == ' ')
    p++;
  if (*p != ':')
    return -1;
  char *end;
  errno = 0;
  *v = strtod(p + 1, &end);
  return end == p + 1 || errno || !isfinite(*v) ? -1 : 0;
}

int beam_azint_poni_load(const char *path, beam_azint_geom_t *g, beam_diag_t *d) {
  FILE *f = fopen(path, "r");
  if (!f)
    return BEAM_DIAG(d, BEAM_EIO, "azint: poni: cannot open %s: %s", path, strerror(errno));
  static const char *const keys[] = {"Distance", "Poni1", "Poni2", "Rot1", "Rot2", "Rot3",
                                     "Wavelength", "PixelSize1", "PixelSize2"};
  double *dst[] = {&g->dist, &g->poni1, &g->poni2, &g->rot1, &g->rot2, &g->rot3,
                   &g->wavelength, &g->pixel1, &g->pixel2};
  int seen[9] = {0};
  char line[4096];
  int rc = 0, lineno = 0;
  while (rc == 0 && fgets(line, sizeof line, f)) {
    lineno++;
    if (line[0] == '#' || !strchr(line, ':'))
      continue;
    char *colon = strchr(line, ':');
    *colon = '\0';
    const char *val = colon + 1;
    if (!strcmp(line, "Detector_config")) {
      if (json_num(val, "pixel1", &g->pixel1) < 0 || json_num(val, "pixel2", &g->pixel2) < 0)
        rc = BEAM_DIAG(d, BEAM_ECONFIG, "azint: poni: %s:%d: Detector_config has no numeric "
                       "pixel1 and pixel2", path, lineno);
      seen[7] = seen[8] = 1;
      continue;
    }
    for (int k = 0; k < 9; k++)
      if (!strcmp(line, keys[k])) {
        if (num_after(val, dst[k]) < 0)
          rc = BEAM_DIAG(d, BEAM_ECONFIG, "azint: poni: %s:%d: %s is not a number", path, lineno, keys[k]);
        seen[k] = 1;
      }
  }
  fclose(f);
  for (int k = 0; rc == 0 && k < 9; k++)
    if (!seen[k])
      rc = BEAM_DIAG(d, BEAM_ECONFIG, "azint: poni: %s has no %s%s", path,
                     k >= 7 ? "pixel size (PixelSize1/2 or Detector_config pixel1/pixel2) for " : "",
                     keys[k]);
  return rc;
}
