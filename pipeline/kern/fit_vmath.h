/* Vectorisable float exp, log and sincos for the fitter's SIMD pass.
 *
 * Why not libm: gcc vectorises expf/sinf/cosf only through glibc's libmvec
 * under -ffast-math, and it fuses sinf+cosf into a scalar sincosf that has
 * no vector variant, which leaves the loop scalar (docs/fit.md). These are
 * branch-free (selects only), integer tricks via memcpy, so a loop over
 * lanes that calls them vectorises at any ISA the caller is compiled for.
 *
 * Polynomials are Cephes' single-precision ones (S. Moshier, public
 * domain). Accuracy against libm double, measured by test_kern_fit:
 *   fit_expf   x in [-87, 88]: relative error <= 3e-7 (~2.5 ulp);
 *              below -87.3 returns 0; NaN in, NaN out
 *   fit_logf   x > 0 normal: absolute error <= 2e-7 for x in [0.5, 2],
 *              relative <= 2e-7 elsewhere; 0 -> -inf, x < 0 -> NaN
 *   fit_sincosf |x| <= 1e4: absolute error <= 6e-7 (three-part Cody–Waite
 *              reduction by π/2; the error grows with |x|/1e4 beyond) */
#ifndef BEAM_KERN_FIT_VMATH_H
#define BEAM_KERN_FIT_VMATH_H

#include <stdint.h>
#include <string.h>

static inline float fit__as_f(int32_t i) {
  float f;
  memcpy(&f, &i, 4);
  return f;
}
static inline int32_t fit__as_i(float f) {
  int32_t i;
  memcpy(&i, &f, 4);
  return i;
}
/* Round to nearest integer (as a float) without a libm call: adding
 * 1.5·2^23 pushes the fraction out of the mantissa. |x| < 2^22. */
static inline float fit__rint(float x) {
  const float m = 12582912.0f;
  return (x + m) - m;
}

static inline float fit_expf(float x) {
  /* Written so NaN takes the upper clamp: the float-to-int conversion
   * below must only ever see a finite value in [-126, 128]. */
  float xc = x < 88.3762626647949f ? x : 88.3762626647949f;
  xc = xc > -87.3f ? xc : -87.3f;
  float n = fit__rint(xc * 1.44269504088896341f);
  float r = xc - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  float r2 = r * r;
  float p = 1.9875691500E-4f;
  p = p * r + 1.3981999507E-3f;
  p = p * r + 8.3334519073E-3f;
  p = p * r + 4.1665795894E-2f;
  p = p * r + 1.6666665459E-1f;
  p = p * r + 5.0000001201E-1f;
  p = p * r2 + r + 1.0f;
  float s = fit__as_f((int32_t)((uint32_t)((int32_t)n + 127) << 23));
  float v = p * s;
  v = x < -87.3f ? 0.0f : v;
  return x != x ? x : v;
}

static inline float fit_logf(float x) {
  int32_t bits = fit__as_i(x);
  float e = (float)(((bits >> 23) & 0xff) - 126);
  float m = fit__as_f((bits & 0x007fffff) | 0x3f000000); /* [0.5, 1) */
  int lo = m < 0.707106781186547524f;
  e = lo ? e - 1.0f : e;
  float z = lo ? m + m - 1.0f : m - 1.0f;
  float z2 = z * z;
  float p = 7.0376836292E-2f;
  p = p * z - 1.1514610310E-1f;
  p = p * z + 1.1676998740E-1f;
  p = p * z - 1.2420140846E-1f;
  p = p * z + 1.4249322787E-1f;
  p = p * z - 1.6668057665E-1f;
  p = p * z + 2.0000714765E-1f;
  p = p * z - 2.4999993993E-1f;
  p = p * z + 3.3333331174E-1f;
  float y = p * z * z2;
  y = y + e * -2.12194440e-4f;
  y = y - 0.5f * z2;
  float v = z + y + e * 0.693359375f;
  v = x == 0.0f ? -__builtin_inff() : v;
  v = x < 0.0f ? __builtin_nanf("") : v;
  v = x == __builtin_inff() ? x : v;
  return x != x ? x : v;
}

static inline void fit_sincosf(float x, float *s, float *c) {
  float j = fit__rint(x * 0.636619772367581343f); /* nearest multiple of π/2 */
  float r = x - j * 1.5703125f;
  r = r - j * 4.837512969970703125e-4f;
  r = r - j * 7.54978995489188216e-8f;
  float r2 = r * r;
  float sp = -1.9515295891E-4f;
  sp = sp * r2 + 8.3321608736E-3f;
  sp = sp * r2 - 1.6666654611E-1f;
  float sv = r + r * r2 * sp;
  float cp = 2.443315711809948E-5f;
  cp = cp * r2 - 1.388731625493765E-3f;
  cp = cp * r2 + 4.166664568298827E-2f;
  float cv = 1.0f - 0.5f * r2 + r2 * r2 * cp;
  /* NaN or |x| past 2^30 would make the conversion undefined; the result
   * is NaN or meaningless there anyway, so any quadrant will do. */
  float jq = j < 1073741824.0f && j > -1073741824.0f ? j : 0.0f;
  int32_t q = (int32_t)jq & 3;
  float ss = (q & 1) ? cv : sv, cc = (q & 1) ? sv : cv;
  ss = (q & 2) ? -ss : ss;
  cc = ((q + 1) & 2) ? -cc : cc;
  *s = ss;
  *c = cc;
}
#endif
