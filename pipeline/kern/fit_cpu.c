/* The SIMD-batched fitter (beam_fit_cpu_range): FIT_L = 16 fits advance
 * together, one lane each. Per pass over the data, every lane evaluates
 * its model and analytic Jacobian in fp32 with fit_vmath.h and adds
 * χ², Jᵀr and JᵀWJ in double; the LM control (fit_lm.c) then runs per
 * lane in double, exactly as in the reference. A lane whose fit has
 * finished takes the next staged fit before the next pass (fits are
 * staged, checked and started 16 at a time, in the blocks a plain block
 * loop would use); with nothing left it idles on harmless numbers.
 *
 * The pass is compiled three times (SSE2, AVX2+FMA, AVX-512) and picked
 * at run time with __builtin_cpu_supports, because the build targets
 * baseline x86-64 and the machines differ. Lanes never mix: a NaN in one
 * fit cannot reach another. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "pipeline/kern/fit_int.h"
#include "pipeline/kern/fit_vmath.h"

typedef struct blk_s {
  size_t T;
  const float *x, *lx, *y, *w; /* [T][FIT_L] */
} blk_t;

typedef void (*pass_fn)(const blk_t *bk, const float *pt, double *acc);

#define L FIT_L
#define TWO_PI_F 6.28318530717958648f
/* Parameter j of lane l. */
#define PJ(j) pt[(j) * L + l]

/* Body of one pass: for every point and lane, POINT sets f and J[0..P-1]
 * from x = xk[l] (lx = lxk[l]); then the estimator's sums. MLE: Fisher
 * scoring weights 1/f and the Poisson deviance; f <= 0 on a used point
 * makes that lane's χ² infinite (the step is rejected). */
#define PASS_BODY(P, PREP, ...)                                                            \
  enum { NA = FIT_NACC(P) };                                                                 \
  float q0[L], q1[L], q2[L], q3[L];                                                          \
  int badf[L];                                                                               \
  (void)q0, (void)q1, (void)q2, (void)q3;                                                    \
  for (int l = 0; l < L; l++) {                                                              \
    badf[l] = 0;                                                                             \
    PREP;                                                                                    \
  }                                                                                          \
  memset(acc, 0, sizeof(double) * NA * L);                                                   \
  for (size_t k = 0; k < bk->T; k++) {                                                       \
    const float *restrict xk = bk->x + k * L, *restrict lxk = bk->lx + k * L;                \
    const float *restrict yk = bk->y + k * L, *restrict wk = bk->w + k * L;                  \
    (void)lxk;                                                                               \
    for (int l = 0; l < L; l++) {                                                            \
      float J[P], f, x = xk[l], lx = lxk[l];                                                 \
      (void)lx;                                                                              \
      __VA_ARGS__;                                                                           \
      float wv = wk[l], yv = yk[l], r = yv - f, wf;                                          \
      double c2;                                                                             \
      if (mle) {                                                                             \
        int used = wv > 0.0f;                                                                \
        badf[l] |= used & !(f > 0.0f);                                                       \
        float fs = f > 0.0f ? f : 1.0f, ys = yv > 0.0f ? yv : 1.0f;                          \
        float dv = yv > 0.0f ? 2.0f * (f - yv) - 2.0f * yv * fit_logf(fs / ys) : 2.0f * f;   \
        wf = used ? 1.0f / fs : 0.0f;                                                        \
        c2 = used ? (double)dv : 0.0;                                                        \
      } else {                                                                               \
        wf = wv;                                                                             \
        c2 = (double)wv * (double)r * (double)r;                                             \
      }                                                                                      \
      double wr = (double)wf * (double)r;                                                    \
      acc[l] += c2;                                                                          \
      double dj[P];                                                                          \
      _Pragma("GCC unroll 16") for (int j = 0; j < P; j++) {                                                          \
        dj[j] = (double)J[j];                                                                \
        acc[(1 + j) * L + l] += dj[j] * wr;                                                  \
      }                                                                                      \
      _Pragma("GCC unroll 16") for (int j = 0; j < P; j++) {                                 \
        double wj = (double)wf * dj[j];                                                      \
        _Pragma("GCC unroll 16") for (int m = j; m < P; m++)                                 \
          acc[(1 + P + j * P - j * (j - 1) / 2 + (m - j)) * L + l] += wj * dj[m];            \
      }                                                                                      \
    }                                                                                        \
  }                                                                                          \
  for (int l = 0; l < L; l++)                                                                \
    if (badf[l] || !(acc[l] == acc[l]))                                                      \
      acc[l] = __builtin_inf();

#define T512 __attribute__((target("avx512f,avx512vl,avx512dq,fma,prefer-vector-width=512")))
#define T256 __attribute__((target("avx2,fma")))

/* Six entry points per model: {SSE2, AVX2, AVX-512} x {LSE, MLE}. */
#define DEFINE_PASS(NAME, P, PREP, ...)                                                    \
  static inline __attribute__((always_inline)) void NAME##_body(                            \
      const blk_t *restrict bk, const float *restrict pt, double *restrict acc, int mle) {   \
    PASS_BODY(P, PREP, __VA_ARGS__)                                                          \
  }                                                                                          \
  static void NAME##_sse2_l(const blk_t *b, const float *p, double *a) { NAME##_body(b, p, a, 0); } \
  static void NAME##_sse2_m(const blk_t *b, const float *p, double *a) { NAME##_body(b, p, a, 1); } \
  T256 static void NAME##_avx2_l(const blk_t *b, const float *p, double *a) { NAME##_body(b, p, a, 0); } \
  T256 static void NAME##_avx2_m(const blk_t *b, const float *p, double *a) { NAME##_body(b, p, a, 1); } \
  T512 static void NAME##_avx512_l(const blk_t *b, const float *p, double *a) { NAME##_body(b, p, a, 0); } \
  T512 static void NAME##_avx512_m(const blk_t *b, const float *p, double *a) { NAME##_body(b, p, a, 1); }

/* e^(-u/tau)(a cos ωu + b sin ωu) with q = 1/tau, w = 2πf: value osc·e,
 * J[a, b, tau, f], and ∂/∂u into DU. */
#define DCOS1(A, B, IT, W, U, JO, V, DU)                                                     \
  do {                                                                                       \
    float e_ = fit_expf(-(U) * (IT)), s_, c_;                                                \
    fit_sincosf((W) * (U), &s_, &c_);                                                        \
    float E_ = e_ * c_, F_ = e_ * s_, osc_ = (A) * E_ + (B) * F_;                            \
    float dosc_ = e_ * (-(A) * s_ + (B) * c_);                                               \
    JO[0] = E_;                                                                              \
    JO[1] = F_;                                                                              \
    JO[2] = osc_ * (U) * (IT) * (IT);                                                        \
    JO[3] = dosc_ * TWO_PI_F * (U);                                                          \
    V = osc_;                                                                                \
    DU = -osc_ * (IT) + dosc_ * (W);                                                         \
  } while (0)

DEFINE_PASS(dcos, 5, (q0[l] = 1.0f / PJ(2), q1[l] = TWO_PI_F * PJ(3)), {
  float v, du;
  DCOS1(PJ(0), PJ(1), q0[l], q1[l], x, J, v, du);
  (void)du;
  J[4] = 1.0f;
  f = v + PJ(4);
})

DEFINE_PASS(dcos_t0, 6, (q0[l] = 1.0f / PJ(2), q1[l] = TWO_PI_F * PJ(3)), {
  float v, du, t0 = PJ(5), u = x > t0 ? x - t0 : 0.0f;
  DCOS1(PJ(0), PJ(1), q0[l], q1[l], u, J, v, du);
  J[4] = 1.0f;
  J[5] = x > t0 ? -du : 0.0f;
  f = v + PJ(4);
})

DEFINE_PASS(dcos2, 9,
            (q0[l] = 1.0f / PJ(2), q1[l] = TWO_PI_F * PJ(3), q2[l] = 1.0f / PJ(6),
             q3[l] = TWO_PI_F * PJ(7)),
            {
              float v1, v2, du;
              DCOS1(PJ(0), PJ(1), q0[l], q1[l], x, J, v1, du);
              DCOS1(PJ(4), PJ(5), q2[l], q3[l], x, (J + 4), v2, du);
              (void)du;
              J[8] = 1.0f;
              f = v1 + v2 + PJ(8);
            })

DEFINE_PASS(exp1, 3, (q0[l] = 1.0f / PJ(1)), {
  float e = fit_expf(-2.0f * x * q0[l]);
  J[0] = e;
  J[1] = PJ(0) * e * 2.0f * x * q0[l] * q0[l];
  J[2] = 1.0f;
  f = PJ(0) * e + PJ(2);
})

/* z^β = exp(β(ln x - ln τ + K)); x <= 0 gives z^β = 0 and no β term. */
#define STRETCH_POINT(KEXP, KLN)                                                             \
  {                                                                                          \
    int pos = x > 0.0f;                                                                      \
    float lz = pos ? lx - q0[l] + (KLN) : 0.0f;                                              \
    float zb = pos ? fit_expf(PJ(2) * lz) : 0.0f;                                            \
    float e = fit_expf(-(KEXP) * zb), ae = PJ(0) * e * (KEXP) * zb;                          \
    J[0] = e;                                                                                \
    J[1] = ae * PJ(2) * q1[l];                                                               \
    J[2] = -ae * lz;                                                                         \
    J[3] = 1.0f;                                                                             \
    f = PJ(0) * e + PJ(3);                                                                   \
  }

DEFINE_PASS(stretch, 4, (q0[l] = logf(PJ(1)), q1[l] = 1.0f / PJ(1)), STRETCH_POINT(2.0f, 0.0f))
DEFINE_PASS(stretch_xt, 4, (q0[l] = logf(PJ(1)), q1[l] = 1.0f / PJ(1)),
            STRETCH_POINT(1.0f, 0.693147180559945309f))

DEFINE_PASS(exp2m, 5, (q0[l] = 1.0f / PJ(1), q1[l] = 1.0f / PJ(3)), {
  float e1 = fit_expf(-2.0f * x * q0[l]), e2 = fit_expf(-2.0f * x * q1[l]);
  J[0] = e1;
  J[1] = PJ(0) * e1 * 2.0f * x * q0[l] * q0[l];
  J[2] = e2;
  J[3] = PJ(2) * e2 * 2.0f * x * q1[l] * q1[l];
  J[4] = 1.0f;
  f = PJ(0) * e1 + PJ(2) * e2 + PJ(4);
})

DEFINE_PASS(gauss, 5, (q0[l] = 1.0f / PJ(2)), {
  float z = (x - PJ(1)) * q0[l], g = fit_expf(-0.5f * z * z), ag = PJ(0) * g;
  J[0] = g;
  J[1] = ag * z * q0[l];
  J[2] = ag * z * z * q0[l];
  J[3] = 1.0f;
  J[4] = x;
  f = ag + PJ(3) + PJ(4) * x;
})

DEFINE_PASS(lorentz, 5, (q0[l] = 1.0f / PJ(2)), {
  float z = (x - PJ(1)) * q0[l], lo = 1.0f / (1.0f + z * z), a2 = 2.0f * PJ(0) * lo * lo;
  J[0] = lo;
  J[1] = a2 * z * q0[l];
  J[2] = a2 * z * z * q0[l];
  J[3] = 1.0f;
  J[4] = x;
  f = PJ(0) * lo + PJ(3) + PJ(4) * x;
})

#define ROW(n)                                                                               \
  {{n##_sse2_l, n##_sse2_m}, {n##_avx2_l, n##_avx2_m}, {n##_avx512_l, n##_avx512_m}}
/* [model][isa - SSE2][mle]; POLY runs the reference (one exact step). */
static const pass_fn passes[BEAM_FIT_N_MODELS][3][2] = {
    [BEAM_FIT_DCOS] = ROW(dcos),
    [BEAM_FIT_DCOS_T0] = ROW(dcos_t0),
    [BEAM_FIT_DCOS2] = ROW(dcos2),
    [BEAM_FIT_EXP] = ROW(exp1),
    [BEAM_FIT_STRETCH] = ROW(stretch),
    [BEAM_FIT_STRETCH_XT] = ROW(stretch_xt),
    [BEAM_FIT_EXP2] = ROW(exp2m),
    [BEAM_FIT_GAUSS] = ROW(gauss),
    [BEAM_FIT_LORENTZ] = ROW(lorentz),
};

beam_fit_isa_t beam_fit_cpu_isa(beam_fit_isa_t want) {
  __builtin_cpu_init();
  beam_fit_isa_t best = BEAM_FIT_ISA_SSE2;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
    best = BEAM_FIT_ISA_AVX2;
  if (best == BEAM_FIT_ISA_AVX2 && __builtin_cpu_supports("avx512f") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq"))
    best = BEAM_FIT_ISA_AVX512;
  return want == BEAM_FIT_ISA_AUTO || want > best ? best : want;
}

const char *beam_fit_isa_name(beam_fit_isa_t isa) {
  switch (isa) {
  case BEAM_FIT_ISA_SSE2:
    return "sse2";
  case BEAM_FIT_ISA_AVX2:
    return "avx2";
  case BEAM_FIT_ISA_AVX512:
    return "avx512";
  default:
    return "auto";
  }
}

/* The workspace, carved at 64-byte alignment. */
typedef struct cws_s {
  float *x, *lx, *y, *w, *pt;      /* the running lanes' data [T][L], trial points */
  float *sx, *slx, *sy, *sw;       /* the staged block's data [T][L] */
  double *xd, *yd, *wd, *acc, *p0, *scr;
  fit_lm_t *lm;
} cws_t;

static size_t carve(cws_t *c, void *base, size_t T, int P) {
  uintptr_t p = ((uintptr_t)base + 63) & ~(uintptr_t)63, p0 = (uintptr_t)base;
#define TAKE(field, type, n)                                                                 \
  do {                                                                                       \
    c->field = (type *)p;                                                                    \
    p += ((sizeof(type) * (n)) + 63) & ~(size_t)63;                                          \
  } while (0)
  TAKE(x, float, T * L);
  TAKE(lx, float, T * L);
  TAKE(y, float, T * L);
  TAKE(w, float, T * L);
  TAKE(pt, float, FIT_MAXP * L);
  TAKE(sx, float, T * L);
  TAKE(slx, float, T * L);
  TAKE(sy, float, T * L);
  TAKE(sw, float, T * L);
  TAKE(xd, double, T * L);
  TAKE(yd, double, T * L);
  TAKE(wd, double, T * L);
  TAKE(acc, double, FIT_NACC(FIT_MAXP) * L);
  TAKE(p0, double, FIT_MAXP * L);
  TAKE(lm, fit_lm_t, L);
  TAKE(scr, double, beam__fit_guess_scratch(P, T, L));
#undef TAKE
  return (size_t)(p - p0) + 64;
}

static size_t cpu_ws(int P, size_t T) {
  cws_t c;
  return carve(&c, NULL, T, P);
}

size_t beam_fit_workspace_size(const beam_fit_batch_t *b, const beam_fit_opts_t *o) {
  int P = beam_fit_check(b, o, NULL);
  if (P < 0)
    return 0;
  size_t a = cpu_ws(P, b->n_points), r = beam__fit_ref_ws(P, b->n_points);
  return a > r ? a : r;
}

int beam_fit_cpu_range(const beam_fit_batch_t *b, const beam_fit_opts_t *o, size_t i0,
                       size_t i1, void *ws, size_t ws_bytes, beam_fit_result_t *r,
                       beam_diag_t *d) {
  fit_ctx_t c;
  int rc = beam__fit_ctx(&c, b, o, d);
  if (rc < 0)
    return rc;
  if (b->model == BEAM_FIT_POLY) /* linear: one exact solve, in double */
    return beam_fit_ref_range(b, o, i0, i1, ws, ws_bytes, r, d);
  size_t T = b->n_points;
  int P = c.P;
  if (!r || !r->params || i0 > i1 || i1 > b->n_fits)
    return BEAM_DIAG(d, BEAM_EINVAL, "fit: bad range [%zu, %zu) of %zu or no results", i0, i1,
                     b->n_fits);
  if (!ws || ws_bytes < cpu_ws(P, T))
    return BEAM_DIAG(d, BEAM_EINVAL, "fit: workspace of %zu bytes, need %zu", ws_bytes,
                     cpu_ws(P, T));
  cws_t w;
  carve(&w, ws, T, P);
  int isa = beam_fit_cpu_isa(o->isa);
  pass_fn pass = passes[b->model][isa - BEAM_FIT_ISA_SSE2][o->estimator == BEAM_FIT_MLE];
  int shared = b->x_fit_stride == 0, stretch = b->model == BEAM_FIT_STRETCH ||
                                                b->model == BEAM_FIT_STRETCH_XT;
  blk_t bk = {T, w.x, w.lx, w.y, w.w};
  /* Fits are staged 16 at a time, in blocks from i0 exactly as a plain
   * block loop would take them (gather, checks, start), so the starts do
   * not depend on the scheduling. A lane whose fit finishes takes the next
   * staged fit at once (its data copied into the lane) instead of idling
   * until the slowest lane of its block is done. Lanes never mix, so every
   * fit's numbers are the same whichever lane and pass it runs in. */
  int nu[L], st[L], active[L], staged = 0, pos = 0, any = 0;
  size_t next = i0, sbase = i0, fit_of[L];
  for (int l = 0; l < L; l++) {
    active[l] = 0, fit_of[l] = 0;
    for (int j = 0; j < P; j++)
      w.pt[j * L + l] = 1.0f;
  }
  for (size_t q = 0; q < T * L; q++) /* idle lanes: harmless numbers */
    w.x[q] = w.lx[q] = w.y[q] = w.w[q] = 0.0f;
  for (;;) {
    /* Fill every idle lane from the staged block, staging more as needed. */
    for (int l = 0; l < L; l++) {
      while (!active[l]) {
        if (pos == staged) {
          if (next >= i1)
            break;
          int live = i1 - next < L ? (int)(i1 - next) : L;
          for (int s2 = 0; s2 < L; s2++) {
            nu[s2] = 0;
            st[s2] = BEAM_FIT_BAD_INPUT;
            if (s2 < live)
              st[s2] = beam__fit_gather(&c, next + s2, L, s2, w.xd, w.yd, w.wd, &nu[s2]);
            else /* a dead lane: the shared x (harmless finite numbers), no weight */
              for (size_t k = 0; k < T; k++) {
                w.xd[k * L + s2] = w.xd[k * L];
                w.yd[k * L + s2] = w.wd[k * L + s2] = 0;
              }
          }
          if (o->init == BEAM_FIT_INIT_GIVEN) {
            for (int s2 = 0; s2 < L; s2++)
              for (int j = 0; j < P; j++)
                w.p0[s2 * P + j] = s2 < live ? b->p0[(next + s2) * P + j] : 1;
          } else
            beam__fit_guess(&c, T, L, shared, w.xd, w.yd, w.wd, w.p0, w.scr);
          for (size_t q = 0; q < T * L; q++) {
            w.sx[q] = (float)w.xd[q];
            w.sy[q] = (float)w.yd[q];
            w.sw[q] = (float)w.wd[q];
            w.slx[q] = stretch && w.xd[q] > 0 ? (float)log(w.xd[q]) : 0.0f;
          }
          sbase = next, staged = live, pos = 0;
          next += (size_t)live;
        }
        int s2 = pos++;
        size_t fi = sbase + (size_t)s2;
        if (st[s2] >= 0) {
          beam__fit_fail(&c, st[s2], fi, nu[s2], r);
          continue;
        }
        for (size_t k = 0; k < T; k++) {
          w.x[k * L + l] = w.sx[k * L + s2];
          w.lx[k * L + l] = w.slx[k * L + s2];
          w.y[k * L + l] = w.sy[k * L + s2];
          w.w[k * L + l] = w.sw[k * L + s2];
        }
        beam__fit_lm_start(&w.lm[l], &c, w.p0 + s2 * P, nu[s2]);
        fit_of[l] = fi;
        active[l] = 1;
      }
    }
    any = 0;
    for (int l = 0; l < L; l++)
      any |= active[l];
    if (!any)
      break;
    for (int l = 0; l < L; l++)
      if (active[l])
        for (int j = 0; j < P; j++)
          w.pt[j * L + l] = (float)w.lm[l].pt[j];
    pass(&bk, w.pt, w.acc);
    for (int l = 0; l < L; l++) {
      if (!active[l])
        continue;
      int sl = beam__fit_lm_next(&w.lm[l], &c, w.acc + l, L);
      if (sl >= 0) {
        beam__fit_lm_finish(&w.lm[l], &c, sl, fit_of[l], r);
        active[l] = 0;
      }
    }
  }
  return 0;
}
