/* Stage kind `fit`: schema, configuration (with the model-dependent checks
 * of bounds/initial, run at config load so --check-config reports them at
 * file:line:col), per-series buffers, accumulation, result emission. The
 * fitting itself (threads over beam_fit_cpu_range) is fit_stage_cpu.c. */
#include "pipeline/kern/fit_stage.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "pipeline/kern/fit_int.h"
#include "pipeline/kern/kern_int.h"
#include "pipeline/kern/kinds.h"

#define WHO "fit"

static const char *model_valid(const beam_cnode_t *v) {
  return v->scalar && beam_fit_model_from_name(v->scalar) >= 0
             ? NULL
             : "unknown model (known: dcos, dcos_t0, dcos2, exp, stretch, stretch_xt, exp2, "
               "gauss, lorentz, poly)";
}

static const char *map_valid(const beam_cnode_t *v) {
  return v->kind == BEAM_CN_MAP ? NULL : "expected a map of parameter names";
}

const beam_param_t beam_fit_params[] = {
    BEAM_STAGE_COMMON_PARAMS,
    {"source", BEAM_P_ENUM, "pixels", 0, 0, 0, "pixels|result", NULL,
     "pixels: fit every pixel's trace over the frames of a series; result: fit the curves of "
     "each frame an upstream stage publishes (input: stage.y+x+weights outputs)", NULL},
    {"model", BEAM_P_STRING, NULL, 1, 0, 0, NULL, NULL,
     "engine model: dcos, dcos_t0, dcos2, exp, stretch, stretch_xt, exp2, gauss, lorentz, poly "
     "(docs/fit.md)", model_valid},
    {"degree", BEAM_P_INT, "1", 0, 0, BEAM_FIT_MAX_PARAMS - 1, NULL, NULL,
     "poly only: polynomial degree", NULL},
    {"estimator", BEAM_P_ENUM, "lse", 0, 0, 0, "lse|lse_poisson|mle", NULL,
     "lse (weights 1/sigma^2 or 1), lse_poisson (w = 1/max(y,1)) or mle (Poisson deviance)", NULL},
    {"bounds", BEAM_P_ANY, NULL, 0, 0, 0, NULL, NULL,
     "per parameter name: [lo, hi] (inf, -inf allowed; lo = hi fixes it), e.g. {tau: [0, inf]}",
     map_valid},
    {"initial", BEAM_P_ANY, NULL, 0, 0, 0, NULL, NULL,
     "start for every fit, one number per parameter name (all of the model's); default: the "
     "engine's automatic per-trace guess", map_valid},
    {"x", BEAM_P_STRING, "frame_index", 0, 0, 0, NULL, NULL,
     "pixels: frame_index, frame_time (index x series frame_time), pos_x/pos_y/pos_z (the "
     "frame's scan position) or a series metadata key holding one number per frame (e.g. "
     "delay); result: index, or an output of the upstream stage listed in input (e.g. lags)",
     NULL},
    {"x_scale", BEAM_P_FLOAT, "1", 0, 1, 0, NULL, NULL,
     "x used = x_scale * x + x_offset (e.g. 1e12 for seconds to ps)", NULL},
    {"x_offset", BEAM_P_FLOAT, "0", 0, 1, 0, NULL, NULL, "see x_scale", NULL},
    {"range", BEAM_P_FLOAT_LIST, NULL, 0, 1, 0, NULL, NULL,
     "[lo, hi]: only points with lo <= x <= hi (after x_scale/x_offset) are fitted", NULL},
    {"weights", BEAM_P_STRING, NULL, 0, 0, 0, NULL, NULL,
     "result: the upstream output (listed in input) holding each point's sigma (e.g. g2_err); "
     "w = 1/sigma^2, sigma <= 0 or NaN masks the point", NULL},
    {"weights_are", BEAM_P_ENUM, "sigma", 0, 0, 0, "sigma|weight", NULL,
     "result: the weights output holds sigma, or the weight itself", NULL},
    {"axis", BEAM_P_INT, "0", 0, 0, 1, NULL, NULL,
     "result: the axis of a 2-D result along which a curve runs (0: rows, as g2 [lag][roi])",
     NULL},
    {"curves", BEAM_P_BOOL, "true", 0, 0, 0, NULL, NULL,
     "result: also publish the fitted curves at the input's x (output `curves`)", NULL},
    {"every", BEAM_P_INT, "0", 0, 0, 1e12, NULL, NULL,
     "pixels: also fit every N frames for a live preview (PARTIAL); 0 = only at series end", NULL},
    {"max_frames", BEAM_P_INT, "1024", 0, 2, 1 << 24, NULL, NULL,
     "pixels: frames kept per series; later frames are refused and the result is INCOMPLETE",
     NULL},
    {"memory", BEAM_P_SIZE, "2Gi", 0, 1024, 1099511627776.0, NULL, NULL,
     "pixels: limit for the trace buffer (max_frames x pixels x 4 bytes) and results; a series "
     "that needs more is refused at its start", NULL},
    {"threads", BEAM_P_INT, "1", 0, 0, BEAM_FITS_MAX_THREADS, NULL, NULL,
     "cpu backend: threads sharing each batch's fits (0 = one per online core)", NULL},
    {"max_iter", BEAM_P_INT, "100", 0, 1, 100000, NULL, NULL, "LM passes per fit", NULL},
    {"absolute_sigma", BEAM_P_BOOL, "false", 0, 0, 0, NULL, NULL,
     "lse: errors from (J^T W J)^-1 unscaled (curve_fit absolute_sigma=True); false scales "
     "by chi2/(N-P)", NULL},
    BEAM_PARAM_END};

/* ---- configuration ---------------------------------------------------------------- */

static int model_of(const beam_cnode_t *cfg, int *P, int *degree) {
  const char *m = beam_cfg_str(cfg, "model");
  int id = m ? beam_fit_model_from_name(m) : -1;
  if (id < 0)
    return -1;
  *degree = (int)beam_cfg_int(cfg, "degree", 1);
  const beam_fit_model_info_t *mi = beam_fit_model_info((beam_fit_model_t)id);
  *P = mi->n_params ? mi->n_params : *degree + 1;
  return id;
}

static int param_index(beam_fit_model_t m, int P, const char *name) {
  const beam_fit_model_info_t *mi = beam_fit_model_info(m);
  for (int j = 0; j < P; j++) {
    if (mi->n_params == 0) { /* poly: c0..cN */
      char nm[16];
      snprintf(nm, sizeof nm, "c%d", j);
      if (!strcmp(nm, name))
        return j;
    } else if (!strcmp(mi->param_names[j], name)) {
      return j;
    }
  }
  return -1;
}

static void param_list(beam_fit_model_t m, int P, char *buf, size_t len) {
  const beam_fit_model_info_t *mi = beam_fit_model_info(m);
  size_t o = 0;
  buf[0] = 0;
  for (int j = 0; j < P && o + 8 < len; j++) {
    int n = mi->n_params ? snprintf(buf + o, len - o, "%s%s", j ? " " : "", mi->param_names[j])
                         : snprintf(buf + o, len - o, "%sc%d", j ? " " : "", j);
    o += n > 0 ? (size_t)n : 0;
  }
}

/* A YAML number, with inf / .inf spelled either way. */
static int num_of(const beam_cnode_t *n, double *v) {
  if (!n || n->kind != BEAM_CN_SCALAR || !n->scalar)
    return -1;
  const char *s = n->scalar;
  int neg = *s == '-';
  const char *t = s + (neg || *s == '+');
  if (!strcmp(t, "inf") || !strcmp(t, ".inf") || !strcmp(t, "Inf") || !strcmp(t, ".Inf") ||
      !strcmp(t, "infinity")) {
    *v = neg ? -INFINITY : INFINITY;
    return 0;
  }
  char *end;
  *v = strtod(s, &end);
  return end != s && *end == 0 && !isnan(*v) ? 0 : -1;
}

/* Bounds and initial against the model; each problem at its own key. */
static int check_params(const beam_cnode_t *cfg, beam_fits_conf_t *c, beam_cfg_errs_t *errs,
                        char *first, size_t flen) {
  int nerr = 0, P, degree, id = model_of(cfg, &P, &degree);
  if (id < 0)
    return 0; /* model_valid already reported it */
  char names[160];
  param_list((beam_fit_model_t)id, P, names, sizeof names);
#define FAIL(node, line, col, ...)                                                              \
  do {                                                                                         \
    char m_[320];                                                                              \
    snprintf(m_, sizeof m_, __VA_ARGS__);                                                      \
    if (errs)                                                                                  \
      beam_cfg_err_at(errs, (node)->file, line, col, "%s", m_);                                \
    if (first && !first[0])                                                                    \
      snprintf(first, flen, "%s:%d:%d: error: %s", (node)->file ? (node)->file : "<config>",   \
               line, col, m_);                                                                 \
    nerr++;                                                                                    \
  } while (0)
  const beam_cnode_t *b = beam_cfg_get(cfg, "bounds");
  for (size_t i = 0; b && b->kind == BEAM_CN_MAP && i < b->n; i++) {
    int j = param_index((beam_fit_model_t)id, P, b->keys[i]);
    const beam_cnode_t *v = b->items[i];
    double lo, hi;
    if (j < 0) {
      FAIL(b, b->key_line[i], b->key_col[i], "fit.bounds: model %s has no parameter \"%.40s\" (it has: %s)",
           beam_fit_model_info((beam_fit_model_t)id)->name, b->keys[i], names);
    } else if (v->kind != BEAM_CN_SEQ || v->n != 2 || num_of(v->items[0], &lo) ||
               num_of(v->items[1], &hi)) {
      FAIL(v, v->line, v->col, "fit.bounds.%s: expected [lo, hi] (numbers, inf allowed)", b->keys[i]);
    } else if (!(lo <= hi)) {
      FAIL(v, v->line, v->col, "fit.bounds.%s: lo %g is above hi %g", b->keys[i], lo, hi);
    } else if (c) {
      c->lo[j] = lo, c->hi[j] = hi;
    }
  }
  const beam_cnode_t *in = beam_cfg_get(cfg, "initial");
  int given[BEAM_FIT_MAX_PARAMS] = {0}, ngiven = 0;
  for (size_t i = 0; in && in->kind == BEAM_CN_MAP && i < in->n; i++) {
    int j = param_index((beam_fit_model_t)id, P, in->keys[i]);
    double v;
    if (j < 0) {
      FAIL(in, in->key_line[i], in->key_col[i], "fit.initial: model %s has no parameter \"%.40s\" (it has: %s)",
           beam_fit_model_info((beam_fit_model_t)id)->name, in->keys[i], names);
    } else if (num_of(in->items[i], &v) || !isfinite(v)) {
      FAIL(in->items[i], in->items[i]->line, in->items[i]->col, "fit.initial.%s: expected a finite number",
           in->keys[i]);
    } else {
      ngiven += !given[j];
      given[j] = 1;
      if (c)
        c->p0[j] = v;
    }
  }
  if (in && in->kind == BEAM_CN_MAP && ngiven > 0 && ngiven < P && nerr == 0)
    FAIL(in, in->line, in->col, "fit.initial: give every parameter of model %s (%s), or none for "
         "the automatic guess", beam_fit_model_info((beam_fit_model_t)id)->name, names);
  if (c)
    c->have_p0 = ngiven == P;
  const char *src = beam_cfg_str(cfg, "source");
  const char *est = beam_cfg_str(cfg, "estimator");
  const beam_cnode_t *w = beam_cfg_get(cfg, "weights");
  if (w && src && !strcmp(src, "pixels"))
    FAIL(w, w->line, w->col, "fit.weights: only for source: result (pixels use the estimator)");
  if (w && est && strcmp(est, "lse") != 0)
    FAIL(w, w->line, w->col, "fit.weights: only with estimator lse");
  const beam_cnode_t *r = beam_cfg_get(cfg, "range");
  if (r && (r->kind != BEAM_CN_SEQ || r->n != 2 || !(beam__cfg_item_num(r->items[0]) <= beam__cfg_item_num(r->items[1]))))
    FAIL(r, r->line, r->col, "fit.range: expected [lo, hi] with lo <= hi");
  const beam_cnode_t *mem = beam_cfg_get(cfg, "memory");
  if (src && !strcmp(src, "pixels") && mem && mem->line > 0) {
    /* One pixel is the least a series can have. */
    double need = (double)beam_cfg_int(cfg, "max_frames", 1024) * 4.0;
    if ((double)mem->ival < need)
      FAIL(mem, mem->line, mem->col, "fit.memory: %lld bytes cannot hold even one pixel's %lld frames (%.0f bytes)",
           (long long)mem->ival, (long long)beam_cfg_int(cfg, "max_frames", 1024), need);
  }
#undef FAIL
  return nerr;
}

int beam_fit_stage_check(const beam_cnode_t *cfg, beam_cfg_errs_t *errs) {
  return check_params(cfg, NULL, errs, NULL, 0);
}

int beam_fits_conf_load(beam_fits_conf_t *c, const beam_cnode_t *cfg, beam_diag_t *d) {
  memset(c, 0, sizeof *c);
  int id = model_of(cfg, &c->P, &c->degree);
  if (id < 0)
    return BEAM_DIAG(d, BEAM_ECONFIG, WHO ": unknown model \"%s\"",
                     beam_cfg_str(cfg, "model") ? beam_cfg_str(cfg, "model") : "");
  c->model = (beam_fit_model_t)id;
  for (int j = 0; j < BEAM_FIT_MAX_PARAMS; j++)
    c->lo[j] = -INFINITY, c->hi[j] = INFINITY;
  char first[400] = "";
  if (check_params(cfg, c, NULL, first, sizeof first) > 0)
    return BEAM_DIAG(d, BEAM_ECONFIG, "%s", first);
  const char *src = beam_cfg_str(cfg, "source");
  c->source = src && !strcmp(src, "result") ? BEAM_FITS_RESULT : BEAM_FITS_PIXELS;
  beam_fit_opts_default(&c->opts);
  const char *est = beam_cfg_str(cfg, "estimator");
  c->opts.estimator = !est || !strcmp(est, "lse") ? BEAM_FIT_LSE
                      : !strcmp(est, "mle")       ? BEAM_FIT_MLE
                                                  : BEAM_FIT_LSE_POISSON;
  c->opts.init = c->have_p0 ? BEAM_FIT_INIT_GIVEN : BEAM_FIT_INIT_AUTO;
  c->opts.max_iter = (int)beam_cfg_int(cfg, "max_iter", 100);
  c->opts.absolute_sigma = beam_cfg_bool(cfg, "absolute_sigma", 0);
  c->x_scale = beam_cfg_float(cfg, "x_scale", 1);
  c->x_offset = beam_cfg_float(cfg, "x_offset", 0);
  c->range_lo = -INFINITY, c->range_hi = INFINITY;
  const beam_cnode_t *r = beam_cfg_get(cfg, "range");
  if (r && r->n == 2)
    c->range_lo = beam__cfg_item_num(r->items[0]), c->range_hi = beam__cfg_item_num(r->items[1]);
  c->axis = (unsigned)beam_cfg_int(cfg, "axis", 0);
  c->curves = beam_cfg_bool(cfg, "curves", 1);
  c->every = (uint64_t)beam_cfg_int(cfg, "every", 0);
  c->max_frames = (uint64_t)beam_cfg_int(cfg, "max_frames", 1024);
  c->memory = (uint64_t)beam_cfg_int(cfg, "memory", (int64_t)2 << 30);
  int64_t th = beam_cfg_int(cfg, "threads", 1);
  c->threads = th > 0 ? (unsigned)th : 0;
  const char *wa = beam_cfg_str(cfg, "weights_are");
  c->w_sigma = !wa || strcmp(wa, "weight") != 0;
  const char *xs = beam_cfg_str(cfg, "x");
  if (!xs)
    xs = c->source == BEAM_FITS_RESULT ? "index" : "frame_index";
  /* input "stage.a+b+c": the outputs this stage reads, [0] = the curves */
  const char *in = beam_cfg_str(cfg, "input");
  const char *dot = in ? strchr(in, '.') : NULL;
  c->n_in = 1;
  if (dot) {
    const char *p = dot + 1;
    c->n_in = 0;
    while (*p && c->n_in < BEAM_FITS_MAX_IN) {
      const char *e = strchr(p, '+');
      size_t n = e ? (size_t)(e - p) : strlen(p);
      if (n == 0 || n >= BEAM_NAME_MAX)
        return BEAM_DIAG(d, BEAM_ECONFIG, WHO ": input \"%s\": an empty or too long output name", in);
      memcpy(c->in_names[c->n_in], p, n);
      c->in_names[c->n_in++][n] = 0;
      p = e ? e + 1 : p + n;
    }
    if (*p)
      return BEAM_DIAG(d, BEAM_ECONFIG, WHO ": input \"%s\": at most %d outputs", in, BEAM_FITS_MAX_IN);
  }
  if (c->source == BEAM_FITS_PIXELS && c->n_in > 1)
    return BEAM_DIAG(d, BEAM_ECONFIG, WHO ": source pixels reads one input, not \"%s\"", in);
  const char *wn = beam_cfg_str(cfg, "weights");
  if (c->source == BEAM_FITS_RESULT) {
    /* "frame_index" is the schema's default (the pixels' spelling): for a
     * result it is the point index, not an output to look for. */
    if (!strcmp(xs, "index") || !strcmp(xs, "frame_index")) {
      c->x = BEAM_FITS_X_INDEX;
    } else {
      c->x = BEAM_FITS_X_OUTPUT;
      snprintf(c->x_key, sizeof c->x_key, "%s", xs);
    }
    if (wn)
      snprintf(c->w_name, sizeof c->w_name, "%s", wn);
    /* Every listed output must have a role, and every role a listed output. */
    for (unsigned k = 1; k < c->n_in; k++)
      if (strcmp(c->in_names[k], c->x_key) != 0 && strcmp(c->in_names[k], c->w_name) != 0)
        return BEAM_DIAG(d, BEAM_ECONFIG, WHO ": input lists \"%s\", which is neither x (%s) nor weights (%s)",
                         c->in_names[k], xs, wn ? wn : "none");
    const char *need[2] = {c->x == BEAM_FITS_X_OUTPUT ? c->x_key : NULL, wn};
    for (int k = 0; k < 2; k++) {
      int found = 0;
      for (unsigned j = 1; need[k] && j < c->n_in; j++)
        found |= !strcmp(c->in_names[j], need[k]);
      if (need[k] && !found)
        return BEAM_DIAG(d, BEAM_ECONFIG,
                         WHO ": %s \"%s\" must be an output of the upstream stage listed in input "
                         "(e.g. input: g2.g2+%s)", k ? "weights" : "x", need[k], need[k]);
    }
  } else {
    if (!strcmp(xs, "frame_index") || !strcmp(xs, "index"))
      c->x = BEAM_FITS_X_INDEX;
    else if (!strcmp(xs, "frame_time"))
      c->x = BEAM_FITS_X_TIME;
    else if (!strncmp(xs, "pos_", 4) && xs[4] >= 'x' && xs[4] <= 'z' && !xs[5])
      c->x = BEAM_FITS_X_POS, c->x_pos_axis = xs[4] - 'x';
    else
      c->x = BEAM_FITS_X_META;
    snprintf(c->x_key, sizeof c->x_key, "%s", xs);
  }
  return 0;
}

/* ---- start ------------------------------------------------------------------------- */

void beam_fits_free(beam_fits_t *s) {
  free(s->y);
  free(s->x);
  free(s->w);
  free((void *)s->meta_x);
  free(s->params);
  free(s->errors);
  free(s->chi2_red);
  free(s->status);
  free(s->iters);
  free(s->p0);
  beam_fits_conf_t c = s->conf;
  memset(s, 0, sizeof *s);
  s->conf = c;
}

static const char *param_labels(const beam_fits_conf_t *c, char *buf, size_t len) {
  const beam_fit_model_info_t *mi = beam_fit_model_info(c->model);
  size_t o = 0;
  o += (size_t)snprintf(buf, len, "[");
  for (int j = 0; j < c->P && o + 16 < len; j++) {
    int n = mi->n_params ? snprintf(buf + o, len - o, "%s\"%s\"", j ? "," : "", mi->param_names[j])
                         : snprintf(buf + o, len - o, "%s\"c%d\"", j ? "," : "", j);
    o += n > 0 ? (size_t)n : 0;
  }
  snprintf(buf + o, len - o, "]");
  return buf;
}

/* The metadata list x_key of the series: one number per frame id. */
static int load_meta_x(beam_fits_t *s, const beam_series_t *series, beam_diag_t *d) {
  const char *key = s->conf.x_key;
  json_t *root = series && series->meta_json ? json_loads(series->meta_json, 0, NULL) : NULL;
  json_t *a = root ? json_object_get(root, key) : NULL;
  if (!json_is_array(a) || json_array_size(a) == 0) {
    json_decref(root);
    return BEAM_DIAG(d, BEAM_ECONFIG,
                     WHO ": x \"%s\": the series metadata has no list \"%s\" (one number per frame)",
                     key, key);
  }
  size_t n = json_array_size(a);
  double *v = malloc(n * sizeof *v);
  if (!v) {
    json_decref(root);
    return BEAM_DIAG(d, BEAM_ENOMEM, WHO ": out of memory");
  }
  for (size_t i = 0; i < n; i++) {
    json_t *e = json_array_get(a, i);
    v[i] = json_is_number(e) ? json_number_value(e) : NAN;
  }
  json_decref(root);
  s->meta_x = v, s->meta_nx = n;
  return 0;
}

int beam_fits_start(beam_stage_t *self, beam_fits_t *s, const beam_series_t *series,
                    const beam_indesc_t *in, beam_diag_t *d) {
  beam_fits_conf_t *c = &s->conf;
  beam_fits_free(s);
  char sh[64];
  if (!beam__dtype_real(in->dtype) || in->ndim < 1 || in->ndim > 3)
    return BEAM_DIAG(d, BEAM_ESHAPE, WHO ": input %s %s: expected a real 1-, 2- or 3-D array",
                     beam_dtype_name(in->dtype), beam_shape_str(in->ndim, in->shape, sh, sizeof sh));
  size_t P = (size_t)c->P, npix = 1;
  for (uint32_t i = 0; i < in->ndim; i++)
    npix *= in->shape[i];
  if (c->source == BEAM_FITS_PIXELS) {
    s->n_fits = npix, s->T = c->max_frames;
    double need = (double)s->T * (double)npix * 4 + (double)npix * (2 * P + 2) * 8 +
                  (c->have_p0 ? (double)npix * P * 8 : 0);
    if (need > (double)c->memory) {
      const beam_cnode_t *m = beam_cfg_get(self->cfg, "memory");
      return BEAM_DIAG(d, BEAM_ELIMIT,
                       "%s:%d:%d: " WHO ": memory %llu bytes is below the %.0f MiB that max_frames %llu "
                       "x %zu pixels x 4 bytes (+ results) need: raise memory, lower max_frames, or "
                       "bin the frames upstream", m && m->file ? m->file : "<config>", m ? m->line : 0,
                       m ? m->col : 0, (unsigned long long)c->memory, need / 1048576.0,
                       (unsigned long long)c->max_frames, npix);
    }
    if (c->x == BEAM_FITS_X_TIME && !(series && series->frame_time_s > 0))
      return BEAM_DIAG(d, BEAM_ECONFIG, WHO ": x frame_time: the series has no frame_time");
    if (c->x == BEAM_FITS_X_META && load_meta_x(s, series, d) < 0)
      return d->code;
    memcpy(s->oshape, in->shape, sizeof s->oshape);
    s->ondim = in->ndim;
    s->frame_time = series ? series->frame_time_s : 0;
  } else {
    if (in->ndim > 2)
      return BEAM_DIAG(d, BEAM_ESHAPE, WHO ": source result takes 1-D or 2-D results, not %s",
                       beam_shape_str(in->ndim, in->shape, sh, sizeof sh));
    unsigned ax = in->ndim == 1 ? 0 : c->axis;
    s->T = in->shape[ax];
    s->n_fits = in->ndim == 1 ? 1 : in->shape[1 - ax];
    s->oshape[0] = (uint32_t)s->n_fits;
    s->ondim = 1;
  }
  size_t nf = s->n_fits;
  if (!(s->y = malloc(s->T * nf * sizeof *s->y)) || !(s->x = malloc(s->T * sizeof *s->x)) ||
      !(s->params = malloc(nf * P * sizeof *s->params)) ||
      !(s->errors = malloc(nf * P * sizeof *s->errors)) ||
      !(s->chi2_red = malloc(nf * sizeof *s->chi2_red)) || !(s->status = malloc(nf)) ||
      !(s->iters = malloc(nf * sizeof *s->iters)) ||
      (c->source == BEAM_FITS_RESULT && !(s->w = malloc(s->T * nf * sizeof *s->w))) ||
      (c->have_p0 && !(s->p0 = malloc(nf * P * sizeof *s->p0)))) {
    beam_fits_free(s);
    return BEAM_DIAG(d, BEAM_ENOMEM, WHO ": cannot allocate %zu fits x %zu points", nf, s->T);
  }
  for (size_t i = 0; c->have_p0 && i < nf; i++)
    memcpy(s->p0 + i * P, c->p0, P * sizeof *s->p0);

  /* Outputs. Pixels: a [param][y][x] stack per quantity (one image per
   * parameter, labelled), the image's own shape for chi2 and status.
   * Result: [fit][param], [fit], and the curves in the input's shape. */
  beam_outdesc_t *o = self->outs;
  uint32_t shp[BEAM_MAX_NDIM] = {0}, nd;
  if (c->source == BEAM_FITS_PIXELS) {
    shp[0] = (uint32_t)P;
    for (uint32_t i = 0; i < s->ondim; i++)
      shp[i + 1] = s->oshape[i];
    nd = s->ondim + 1;
    beam__declare(&o[BEAM_FITS_OUT_PARAMS], "params", BEAM_DT_F32, nd, shp, "", 0);
    beam__declare(&o[BEAM_FITS_OUT_ERRORS], "errors", BEAM_DT_F32, nd, shp, "", 0);
    beam__declare(&o[BEAM_FITS_OUT_CHI2], "chi2", BEAM_DT_F32, s->ondim, s->oshape, "", 0);
    beam__declare(&o[BEAM_FITS_OUT_STATUS], "status", BEAM_DT_U8, s->ondim, s->oshape, "", 0);
    for (int k = 0; k < 2; k++)
      o[k].axes[0] = "param", o[k].slots = 2;
    o[BEAM_FITS_OUT_CHI2].slots = o[BEAM_FITS_OUT_STATUS].slots = 2;
    self->nouts = 4;
  } else {
    shp[0] = (uint32_t)nf, shp[1] = (uint32_t)P;
    beam__declare(&o[BEAM_FITS_OUT_PARAMS], "params", BEAM_DT_F64, 2, shp, "", 0);
    beam__declare(&o[BEAM_FITS_OUT_ERRORS], "errors", BEAM_DT_F64, 2, shp, "", 0);
    beam__declare(&o[BEAM_FITS_OUT_CHI2], "chi2", BEAM_DT_F64, 1, shp, "", 0);
    beam__declare(&o[BEAM_FITS_OUT_STATUS], "status", BEAM_DT_U8, 1, shp, "", 0);
    for (int k = 0; k < 4; k++)
      o[k].axes[0] = "fit";
    o[BEAM_FITS_OUT_PARAMS].axes[1] = o[BEAM_FITS_OUT_ERRORS].axes[1] = "param";
    self->nouts = 4;
    if (c->curves) {
      beam__declare(&o[BEAM_FITS_OUT_CURVES], "curves", BEAM_DT_F64, in->ndim, in->shape, "", 0);
      o[BEAM_FITS_OUT_CURVES].axes[0] = in->ndim == 1 ? "point" : c->axis == 0 ? "point" : "fit";
      if (in->ndim == 2)
        o[BEAM_FITS_OUT_CURVES].axes[1] = c->axis == 0 ? "fit" : "point";
      self->nouts = 5;
    }
  }
  /* Parameter names label the param axis; the status codes the status
   * output. Static per model: the strings live in the stage. */
  o[BEAM_FITS_OUT_PARAMS].labels_json = o[BEAM_FITS_OUT_ERRORS].labels_json =
      param_labels(c, c->labels, sizeof c->labels);
  o[BEAM_FITS_OUT_STATUS].labels_json =
      "[\"converged\",\"bound\",\"max_iter\",\"singular\",\"bad_input\",\"too_few\"]";
  o[BEAM_FITS_OUT_CHI2].units = "";
  return 0;
}

/* ---- accumulation ------------------------------------------------------------------- */

/* Which listed output a frame is: by its pool's topic "<stage>.<output>";
 * a frame without one (tests) is the curves. */
static int which_in(const beam_fits_t *s, const beam_frame_t *in) {
  const char *t = in->pool ? beam_pool_topic(in->pool) : NULL;
  const char *dot = t ? strchr(t, '.') : NULL;
  if (!dot)
    return 0;
  for (unsigned k = 0; k < s->conf.n_in; k++)
    if (!strcmp(dot + 1, s->conf.in_names[k]))
      return (int)k;
  return s->conf.in_names[0][0] ? -1 : 0;
}

static float xmap(const beam_fits_conf_t *c, double x) { return (float)(c->x_scale * x + c->x_offset); }

static int take_pixels(beam_stage_t *self, beam_fits_t *s, const beam_frame_t *in) {
  beam_fits_conf_t *c = &s->conf;
  s->nseen++;
  size_t ne = in->ndim ? 1 : 0;
  for (uint32_t i = 0; i < in->ndim; i++)
    ne *= in->shape[i];
  if (in->flags & (BEAM_FLAG_BAD | BEAM_FLAG_CORRUPT) || in->nbytes < beam__frame_bytes(in) ||
      ne != s->n_fits || !beam__dtype_real(in->dtype)) {
    s->nbad++;
    return BEAM_DIAG(&self->diag, BEAM_ESHAPE, WHO ": frame %llu is bad or does not match the series",
                     (unsigned long long)in->frame_id);
  }
  double x;
  switch (c->x) {
  case BEAM_FITS_X_INDEX: x = (double)in->frame_id; break;
  case BEAM_FITS_X_TIME: x = (double)in->frame_id * s->frame_time; break;
  case BEAM_FITS_X_POS: x = in->flags & BEAM_FLAG_POS ? in->pos[c->x_pos_axis] : NAN; break;
  default: x = in->frame_id < s->meta_nx ? s->meta_x[in->frame_id] : NAN; break;
  }
  if (!isfinite(x)) {
    s->nbad++;
    return BEAM_DIAG(&self->diag, BEAM_EINVAL, WHO ": frame %llu has no x (%s)",
                     (unsigned long long)in->frame_id, c->x_key);
  }
  float xf = xmap(c, x);
  if (!(xf >= c->range_lo && xf <= c->range_hi))
    return 0; /* outside the fitted window, by request */
  if (s->n >= s->T) {
    s->nover++;
    return BEAM_DIAG(&self->diag, BEAM_ELIMIT, WHO ": max_frames %llu reached: frame %llu left out",
                     (unsigned long long)c->max_frames, (unsigned long long)in->frame_id);
  }
  float *row = s->y + s->n * s->n_fits;
  size_t np = s->n_fits;
  switch (in->dtype) {
#define M(T, D)                                                                                    \
  case D: {                                                                                        \
    const T *p = in->data;                                                                         \
    for (size_t i = 0; i < np; i++)                                                                \
      row[i] = (float)p[i];                                                                        \
    break;                                                                                         \
  }
    BEAM__REAL_DTYPES(M)
#undef M
  default:
    break;
  }
  s->x[s->n++] = xf;
  return c->every > 0 && s->nseen % c->every == 0 && s->n > (size_t)c->P ? 1 : 0;
}

static int take_result(beam_stage_t *self, beam_fits_t *s, const beam_frame_t *in) {
  beam_fits_conf_t *c = &s->conf;
  int k = which_in(s, in);
  if (k < 0)
    return 0; /* another output of the producer (not ours) */
  const char *role = k == 0 ? "curves" : !strcmp(c->in_names[k], c->x_key) ? "x" : "weights";
  size_t T = s->T, nf = s->n_fits, rows;
  if (in->nbytes < beam__frame_bytes(in) || !beam__dtype_real(in->dtype))
    return BEAM_DIAG(&self->diag, BEAM_ESHAPE, WHO ": %s frame %llu is short or not real", role,
                     (unsigned long long)in->frame_id);
  if (*role == 'x') {
    rows = in->ndim == 1 ? in->shape[0] : 0;
    if (rows == 0 || rows > T)
      return BEAM_DIAG(&self->diag, BEAM_ESHAPE, WHO ": x frame has %zu points, the curves at most %zu",
                       rows, T);
    for (size_t t = 0; t < rows; t++)
      s->x[t] = xmap(c, beam_elem_get(in->data, in->dtype, t));
    s->x_rows = (uint32_t)rows;
  } else {
    /* The curves' axis may be shorter than declared (xpcs_multitau cuts
     * rows without pairs); the fit count may not change. */
    int ok = in->ndim == 1 || in->ndim == 2;
    size_t ax = in->ndim == 1 ? 0 : c->axis;
    rows = in->shape[ax];
    size_t fits = in->ndim == 1 ? 1 : in->shape[1 - ax];
    if (!ok || fits != nf || rows > T || rows == 0)
      return BEAM_DIAG(&self->diag, BEAM_ESHAPE, WHO ": %s frame %llu: %zu curves of %zu points, "
                       "the series declared %zu of at most %zu", role,
                       (unsigned long long)in->frame_id, fits, rows, nf, T);
    /* Stored as [point][fit] whatever the input axis, so one stride pair
     * serves every frame. */
    float *dst = k == 0 ? s->y : s->w;
    for (size_t t = 0; t < rows; t++)
      for (size_t i = 0; i < nf; i++) {
        double v = beam_elem_get(in->data, in->dtype, ax == 0 ? t * nf + i : i * rows + t);
        if (k != 0 && c->w_sigma)
          v = isfinite(v) && v > 0 ? 1.0 / (v * v) : 0.0;
        else if (k != 0 && !(isfinite(v) && v >= 0))
          v = 0;
        dst[t * nf + i] = (float)v;
      }
    if (k == 0) {
      s->in_rows = (uint32_t)rows;
      beam_frame_copy_ident(&s->ident, in);
    } else {
      s->w_rows = (uint32_t)rows;
    }
  }
  s->got[k] = 1, s->got_fid[k] = in->frame_id;
  for (unsigned j = 0; j < c->n_in; j++)
    if (!s->got[j] || s->got_fid[j] != s->got_fid[0])
      return 0;
  if ((c->x == BEAM_FITS_X_OUTPUT && s->x_rows != s->in_rows) ||
      (c->w_name[0] && s->w_rows != s->in_rows))
    return BEAM_DIAG(&self->diag, BEAM_ESHAPE, WHO ": frame %llu: curves of %u points, x %u, weights %u",
                     (unsigned long long)in->frame_id, s->in_rows, s->x_rows, s->w_rows);
  for (unsigned j = 0; j < c->n_in; j++)
    s->got[j] = 0;
  s->n = s->in_rows;
  if (c->x == BEAM_FITS_X_INDEX)
    for (size_t t = 0; t < s->n; t++)
      s->x[t] = xmap(c, (double)t);
  if (!c->w_name[0])
    for (size_t t = 0; t < s->n * nf; t++)
      s->w[t] = 1.0f;
  /* The window: points outside it weigh 0 (masked), for every fit. */
  for (size_t t = 0; t < s->n; t++)
    if (!(s->x[t] >= c->range_lo && s->x[t] <= c->range_hi))
      for (size_t i = 0; i < nf; i++)
        s->w[t * nf + i] = 0.0f;
  return 1;
}

int beam_fits_take(beam_stage_t *self, beam_fits_t *s, const beam_frame_t *in) {
  return s->conf.source == BEAM_FITS_PIXELS ? take_pixels(self, s, in) : take_result(self, s, in);
}

void beam_fits_batch(const beam_fits_t *s, beam_fit_batch_t *b) {
  const beam_fits_conf_t *c = &s->conf;
  memset(b, 0, sizeof *b);
  b->model = c->model;
  b->poly_degree = c->degree;
  b->n_fits = s->n_fits, b->n_points = s->n;
  /* Both sources hold [point][fit]: frame-major, no transpose. */
  b->y = s->y, b->y_fit_stride = 1, b->y_point_stride = (ptrdiff_t)s->n_fits;
  b->x = s->x, b->x_fit_stride = 0, b->x_point_stride = 1;
  if (s->w && c->opts.estimator == BEAM_FIT_LSE)
    b->w = s->w, b->w_fit_stride = 1, b->w_point_stride = (ptrdiff_t)s->n_fits;
  b->p0 = s->p0;
  b->lo = c->lo, b->hi = c->hi;
}

/* ---- emission ------------------------------------------------------------------------ */

static void finish(beam_frame_t *f, const beam_fits_t *s, uint32_t flags) {
  if (s->conf.source == BEAM_FITS_RESULT)
    beam_frame_copy_ident(f, &s->ident);
  /* Pixel maps come from many frames: the scan position (flag POS) of the
   * frame that triggered a preview (its ident is copied) is not theirs. */
  uint32_t pos = s->conf.source == BEAM_FITS_PIXELS ? BEAM_FLAG_POS : 0;
  if (pos)
    memset(f->pos, 0, sizeof f->pos);
  f->flags = (f->flags & ~(uint32_t)(BEAM_FLAG_META | BEAM_FLAG_PARTIAL | BEAM_FLAG_FINAL |
                                     BEAM_FLAG_BAD | BEAM_FLAG_CORRUPT | BEAM_FLAG_ANOMALY | pos)) |
             flags;
}

void beam_fits_emit(beam_fits_t *s, beam_emit_t *emit, uint32_t flags) {
  const beam_fits_conf_t *c = &s->conf;
  size_t nf = s->n_fits, P = (size_t)c->P;
  int pix = c->source == BEAM_FITS_PIXELS;
  for (int k = 0; k < 2; k++) {
    beam_frame_t *f = beam_emit_get(emit, (unsigned)k);
    if (!f)
      return;
    const double *src = k ? s->errors : s->params;
    if (pix) { /* [fit][param] -> [param][pixel] */
      float *o = f->data;
      for (size_t j = 0; j < P; j++)
        for (size_t i = 0; i < nf; i++)
          o[j * nf + i] = (float)src[i * P + j];
    } else {
      memcpy(f->data, src, nf * P * sizeof(double));
    }
    finish(f, s, flags);
    beam_emit_put(emit, f);
  }
  beam_frame_t *f = beam_emit_get(emit, BEAM_FITS_OUT_CHI2);
  if (!f)
    return;
  for (size_t i = 0; i < nf; i++) {
    if (pix)
      ((float *)f->data)[i] = (float)s->chi2_red[i];
    else
      ((double *)f->data)[i] = s->chi2_red[i];
  }
  finish(f, s, flags);
  beam_emit_put(emit, f);
  if (!(f = beam_emit_get(emit, BEAM_FITS_OUT_STATUS)))
    return;
  memcpy(f->data, s->status, nf);
  finish(f, s, flags);
  beam_emit_put(emit, f);
  if (pix || !c->curves)
    return;
  if (!(f = beam_emit_get(emit, BEAM_FITS_OUT_CURVES)))
    return;
  double *o = f->data, J[BEAM_FIT_MAX_PARAMS];
  size_t T = s->n;
  int ax0 = f->ndim == 1 || c->axis == 0;
  for (size_t i = 0; i < nf; i++) {
    const double *p = s->params + i * P;
    for (size_t t = 0; t < T; t++) {
      double v = isfinite(p[0]) ? beam__fit_eval(c->model, c->P, p, s->x[t], J) : NAN;
      o[ax0 ? t * nf + i : i * T + t] = v;
    }
  }
  f->shape[f->ndim == 1 ? 0 : c->axis] = (uint32_t)T;
  finish(f, s, flags);
  beam_emit_put(emit, f);
}

static uint32_t flags_of(const beam_stage_t *self, const beam_fits_t *s, const beam_frame_t *in) {
  if (in)
    return s->conf.source == BEAM_FITS_RESULT
               ? (uint32_t)(in->flags & (BEAM_FLAG_PARTIAL | BEAM_FLAG_FINAL | BEAM_FLAG_ABORTED))
               : (uint32_t)BEAM_FLAG_PARTIAL;
  uint32_t fl = BEAM_FLAG_FINAL;
  if (self->end_missing || s->nbad || s->nover)
    fl |= BEAM_FLAG_INCOMPLETE;
  if (self->end_aborted)
    fl |= BEAM_FLAG_ABORTED;
  return fl;
}

int beam_fits_process(beam_stage_t *self, beam_fits_t *s, const beam_frame_t *in,
                      beam_emit_t *emit, beam_fits_fit_fn fit, void *backend) {
  int rc = beam_fits_take(self, s, in);
  if (rc < 0) {
    atomic_fetch_add(&self->counters[1].value, 1);
    return rc;
  }
  if (rc == 0)
    return 0;
  if ((rc = fit(self, backend)) < 0)
    return rc;
  beam_fits_emit(s, emit, flags_of(self, s, in));
  return 0;
}

int beam_fits_end(beam_stage_t *self, beam_fits_t *s, beam_emit_t *emit, beam_fits_fit_fn fit,
                  void *backend) {
  if (s->conf.source == BEAM_FITS_RESULT)
    return 0; /* every input frame was fitted as it came */
  int rc = fit(self, backend);
  if (rc < 0)
    return rc;
  beam_fits_emit(s, emit, flags_of(self, s, NULL));
  return 0;
}
