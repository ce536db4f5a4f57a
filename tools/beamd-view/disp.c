/* Display forms: what a browser needs to draw a result, and no more.
 *
 * Every numeric dtype becomes float32 (a browser draws 8-bit colours; the
 * float keeps the values for a fixed colour range and for plots). Complex
 * arrays become two planes, magnitude and phase. Arrays of more than two
 * dimensions show their first plane (the last two axes), but for stacks. Images larger
 * than max_side are block-downsampled by one integer factor on both axes
 * (so the aspect ratio stays), curve-like 2-D arrays (one side <= 64) only
 * along their long side, so curves are never mixed together.
 *
 * Two forms follow the result descriptor: a stack (any 3-D array of up to
 * STACK_MAX planes: a fit's params [param][y][x], c2 per ROI, probe modes)
 * sends every plane, one array each (two for complex ones), named by the
 * descriptor's labels of the first axis when it has them, else by index,
 * so a browser can switch planes without asking; a categorical image
 * (integer dtype whose labels are strings, as a fit's status codes) is
 * downsampled by the block maximum whatever --downsample says, because a
 * mean of codes is no code. */
#include <complex.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <libwebsockets.h>

#include "tools/beamd-view/view.h"
#include "pipeline/frame.h"

#define CURVE_SIDE 64     /* 2-D arrays with a side this small are curves */
#define CURVE_MAX 65536   /* longest curve sent as is */
#define RAW_HEX_BYTES 64  /* bytes of a bad message shown in hex */
#define STACK_MAX 64      /* a 3-D array of up to this many planes is sent whole, */
#define STACK_VALUES (1u << 22) /* when its display form is at most this many values (16 MiB) */

/* ---- messages -------------------------------------------------------------- */

view_msg_t *view_msg_alloc(json_t *hdr, size_t payload_len, void **payload) {
  char *js = json_dumps(hdr, JSON_COMPACT | JSON_REAL_PRECISION(9));
  if (!js)
    return NULL;
  size_t n = strlen(js), head = 4 + n, pad = (4 - head % 4) % 4;
  view_msg_t *m = calloc(1, sizeof *m);
  if (!m) {
    free(js);
    return NULL;
  }
  m->len = head + pad + payload_len;
  m->buf = malloc(LWS_PRE + m->len);
  if (!m->buf) {
    free(js);
    free(m);
    return NULL;
  }
  unsigned char *p = m->buf + LWS_PRE;
  p[0] = (unsigned char)(n & 0xff);
  p[1] = (unsigned char)((n >> 8) & 0xff);
  p[2] = (unsigned char)((n >> 16) & 0xff);
  p[3] = (unsigned char)((n >> 24) & 0xff);
  memcpy(p + 4, js, n);
  memset(p + head, 0, pad);
  free(js);
  m->refs = 1;
  if (payload)
    *payload = p + head + pad;
  return m;
}

view_msg_t *view_msg_new(json_t *hdr, const void *payload, size_t payload_len) {
  void *dst = NULL;
  view_msg_t *m = view_msg_alloc(hdr, payload_len, &dst);
  if (m && payload_len)
    memcpy(dst, payload, payload_len);
  return m;
}

view_msg_t *view_msg_ref(view_msg_t *m) {
  if (m)
    m->refs++;
  return m;
}

void view_msg_unref(view_msg_t **pm) {
  view_msg_t *m = *pm;
  *pm = NULL;
  if (m && --m->refs == 0) {
    free(m->buf);
    free(m);
  }
}

/* ---- conversion ------------------------------------------------------------ */

/* n elements of dtype dt from src (element offset off) to float32. */
static void to_f32(const void *src, beam_dtype_t dt, size_t off, size_t n, float *out) {
#define CONV(T)                                                                \
  do {                                                                         \
    const T *s = (const T *)src + off;                                         \
    for (size_t i = 0; i < n; i++)                                             \
      out[i] = (float)s[i];                                                    \
  } while (0)
  switch (dt) {
  case BEAM_DT_U8: CONV(uint8_t); break;
  case BEAM_DT_U16: CONV(uint16_t); break;
  case BEAM_DT_U32: CONV(uint32_t); break;
  case BEAM_DT_U64: CONV(uint64_t); break;
  case BEAM_DT_I8: CONV(int8_t); break;
  case BEAM_DT_I16: CONV(int16_t); break;
  case BEAM_DT_I32: CONV(int32_t); break;
  case BEAM_DT_I64: CONV(int64_t); break;
  case BEAM_DT_F32: memcpy(out, (const float *)src + off, n * sizeof(float)); break;
  case BEAM_DT_F64: CONV(double); break;
  default: memset(out, 0, n * sizeof(float)); break;
  }
#undef CONV
}

/* Complex elements to (re, im) float32 planes. */
static void to_c32(const void *src, beam_dtype_t dt, size_t off, size_t n, float *re, float *im) {
  if (dt == BEAM_DT_C64) {
    const float *s = (const float *)src + 2 * off;
    for (size_t i = 0; i < n; i++) {
      re[i] = s[2 * i];
      im[i] = s[2 * i + 1];
    }
  } else {
    const double *s = (const double *)src + 2 * off;
    for (size_t i = 0; i < n; i++) {
      re[i] = (float)s[2 * i];
      im[i] = (float)s[2 * i + 1];
    }
  }
}

void view_downsample(const float *in, uint32_t h, uint32_t w, uint32_t fy, uint32_t fx,
                       int use_max, float *out) {
  uint32_t oh = (h + fy - 1) / fy, ow = (w + fx - 1) / fx;
  for (uint32_t oy = 0; oy < oh; oy++) {
    uint32_t y0 = oy * fy, y1 = y0 + fy < h ? y0 + fy : h;
    for (uint32_t ox = 0; ox < ow; ox++) {
      uint32_t x0 = ox * fx, x1 = x0 + fx < w ? x0 + fx : w;
      double acc = use_max ? -INFINITY : 0.0;
      uint32_t cnt = 0;
      for (uint32_t y = y0; y < y1; y++) {
        const float *row = in + (size_t)y * w;
        for (uint32_t x = x0; x < x1; x++) {
          float v = row[x];
          if (!isfinite(v))
            continue;
          if (use_max)
            acc = v > acc ? v : acc;
          else
            acc += v;
          cnt++;
        }
      }
      out[(size_t)oy * ow + ox] = cnt ? (float)(use_max ? acc : acc / cnt) : NAN;
    }
  }
}

/* Complex blocks: magnitude = mean (or max) of |z|; phase = arg of the
 * block's sum (mean mode) or of the largest element (max mode), so the
 * phase of a block is a phase the data has, not a mean of angles. */
static void downsample_cplx(const float *re, const float *im, uint32_t h, uint32_t w, uint32_t fy,
                            uint32_t fx, int use_max, float *mag, float *ph) {
  uint32_t oh = (h + fy - 1) / fy, ow = (w + fx - 1) / fx;
  for (uint32_t oy = 0; oy < oh; oy++) {
    uint32_t y0 = oy * fy, y1 = y0 + fy < h ? y0 + fy : h;
    for (uint32_t ox = 0; ox < ow; ox++) {
      uint32_t x0 = ox * fx, x1 = x0 + fx < w ? x0 + fx : w;
      double sr = 0, si = 0, sm = 0, best = -1, br = 0, bi = 0;
      uint32_t cnt = 0;
      for (uint32_t y = y0; y < y1; y++) {
        for (uint32_t x = x0; x < x1; x++) {
          size_t i = (size_t)y * w + x;
          double a = re[i], b = im[i];
          if (!isfinite(a) || !isfinite(b))
            continue;
          double m = hypot(a, b);
          sr += a;
          si += b;
          sm += m;
          if (m > best) {
            best = m;
            br = a;
            bi = b;
          }
          cnt++;
        }
      }
      size_t o = (size_t)oy * ow + ox;
      if (!cnt) {
        mag[o] = ph[o] = NAN;
      } else if (use_max) {
        mag[o] = (float)best;
        ph[o] = (float)atan2(bi, br);
      } else {
        mag[o] = (float)(sm / cnt);
        ph[o] = (float)atan2(si, sr);
      }
    }
  }
}

/* {"name", "min", "max", "nonfinite"} of a float plane. */
static json_t *plane_stats(const char *name, const float *v, size_t n) {
  float lo = INFINITY, hi = -INFINITY;
  size_t bad = 0;
  for (size_t i = 0; i < n; i++) {
    float x = v[i];
    if (!isfinite(x)) {
      bad++;
      continue;
    }
    lo = x < lo ? x : lo;
    hi = x > hi ? x : hi;
  }
  json_t *o = json_object();
  json_object_set_new(o, "name", json_string(name));
  json_object_set_new(o, "min", bad == n ? json_null() : json_real(lo));
  json_object_set_new(o, "max", bad == n ? json_null() : json_real(hi));
  json_object_set_new(o, "nonfinite", json_integer((json_int_t)bad));
  return o;
}

static json_t *common_header(const char *kind, const char *topic, const beam_hdr_t *h,
                             uint64_t t_rx_ns) {
  json_t *o = json_object();
  json_object_set_new(o, "type", json_string(kind));
  json_object_set_new(o, "topic", json_string(topic));
  if (h) {
    json_object_set_new(o, "msg_type", json_string(beam_msg_type_name(h->type)));
    json_object_set_new(o, "series_id", json_integer((json_int_t)h->series_id));
    json_object_set_new(o, "frame_id", json_integer((json_int_t)h->frame_id));
    json_object_set_new(o, "seq", json_integer((json_int_t)h->seq));
    json_object_set_new(o, "flags", json_integer(h->flags));
    json_object_set_new(o, "stage_id", json_integer(h->stage_id));
    json_object_set_new(o, "t_send_ns", json_integer((json_int_t)h->t_send_ns));
    json_object_set_new(o, "t_acq_ns", json_integer((json_int_t)h->t_acq_ns));
  }
  json_object_set_new(o, "t_rx_ns", json_integer((json_int_t)t_rx_ns));
  json_object_set_new(o, "t_tx_ns", json_integer((json_int_t)beam_realtime_ns()));
  return o;
}

static json_t *shape_json(const uint32_t *s, unsigned nd) {
  json_t *a = json_array();
  for (unsigned i = 0; i < nd; i++)
    json_array_append_new(a, json_integer(s[i]));
  return a;
}

/* The statistics document of beamd.stats and the events of beamd.series:
 * JSON only, no payload. */
static view_msg_t *build_doc(const char *topic, const beam_msg_t *m, const void *data,
                             uint64_t t_rx_ns) {
  json_t *o = common_header("doc", topic, &m->hdr, t_rx_ns);
  json_t *doc = NULL;
  if (m->hdr.type == BEAM_MSG_RESULT && data && m->hdr.dtype == BEAM_DT_U8 && m->hdr.ndim == 1)
    doc = json_loadb(data, (size_t)m->hdr.raw_size, 0, NULL);
  else if (m->meta)
    doc = json_loadb(m->meta, m->meta_len, 0, NULL);
  json_object_set_new(o, "doc", doc ? doc : json_null());
  /* A SERIES_START's header shape is the frame geometry (PROTOCOL.md §7):
   * the page needs it to know which images are detector frames. */
  if (m->hdr.type != BEAM_MSG_RESULT && m->hdr.ndim) {
    json_object_set_new(o, "dtype", json_string(beam_dtype_name((beam_dtype_t)m->hdr.dtype)));
    json_object_set_new(o, "shape", shape_json(m->hdr.shape, m->hdr.ndim));
  }
  view_msg_t *r = view_msg_new(o, NULL, 0);
  json_decref(o);
  return r;
}

view_msg_t *view_disp_build(const view_opts_t *opt, const char *topic, const beam_msg_t *m,
                            const void *data, json_t *desc, uint64_t t_rx_ns) {
  const beam_hdr_t *h = &m->hdr;
  if (!strcmp(topic, "beamd.stats") || !strcmp(topic, "beamd.series") ||
      h->type != BEAM_MSG_RESULT)
    return build_doc(topic, m, data, t_rx_ns);

  json_t *o = common_header("result", topic, h, t_rx_ns);
  json_object_set_new(o, "dtype", json_string(beam_dtype_name((beam_dtype_t)h->dtype)));
  json_object_set_new(o, "shape", shape_json(h->shape, h->ndim));
  json_object_set(o, "desc", desc ? desc : json_null());

  /* Display geometry: h x w of the first plane (1 x n for 1-D). */
  uint32_t dh = 1, dw = 1;
  uint64_t planes = 1;
  if (h->ndim == 1) {
    dw = h->shape[0];
  } else if (h->ndim >= 2) {
    dh = h->shape[h->ndim - 2];
    dw = h->shape[h->ndim - 1];
    for (unsigned i = 0; i + 2 < h->ndim; i++)
      planes *= h->shape[i];
  }
  size_t n = h->ndim ? (size_t)dh * dw : 0;
  int cplx = h->dtype == BEAM_DT_C64 || h->dtype == BEAM_DT_C128;
  /* A stack: every plane goes, named by the labels of its first axis
   * (a list of one label per plane, or {"<axis 0>": [...]}) or its index. */
  json_t *labels = desc ? json_object_get(desc, "labels") : NULL;
  json_t *plabels = NULL;
  if (json_is_array(labels) && json_array_size(labels) == planes)
    plabels = labels;
  else if (json_is_object(labels) && desc) {
    const char *ax0 = json_string_value(json_array_get(json_object_get(desc, "axes"), 0));
    json_t *l = ax0 && *ax0 ? json_object_get(labels, ax0) : NULL;
    if (json_is_array(l) && json_array_size(l) == planes)
      plabels = l;
  }
  int stack = h->ndim == 3 && planes > 1 && planes <= STACK_MAX;
  int categorical = h->ndim == 2 && !cplx && h->dtype >= BEAM_DT_U8 && h->dtype <= BEAM_DT_I64 &&
                    json_is_array(labels) && json_array_size(labels) > 0 &&
                    json_is_string(json_array_get(labels, 0));
  int use_max = opt->ds_max || categorical;
  uint32_t fy = 1, fx = 1;
  if (h->ndim == 1) {
    fx = (dw + CURVE_MAX - 1) / CURVE_MAX;
  } else if (h->ndim >= 2) {
    if (dh <= CURVE_SIDE || dw <= CURVE_SIDE) {
      fy = (dh + CURVE_MAX - 1) / CURVE_MAX;
      fx = (dw + CURVE_MAX - 1) / CURVE_MAX;
    } else {
      uint32_t big = dh > dw ? dh : dw;
      fy = fx = (big + opt->max_side - 1) / opt->max_side;
    }
  }
  uint32_t oh = (dh + fy - 1) / fy, ow = (dw + fx - 1) / fx;
  size_t on = h->ndim ? (size_t)oh * ow : 0;
  if (stack && (uint64_t)oh * ow * planes * (cplx ? 2 : 1) > STACK_VALUES)
    stack = 0; /* too big to send whole: plane 0 only */
  /* nin planes of the source go in, nplanes arrays come out. */
  unsigned nin = stack ? (unsigned)planes : 1, nplanes = cplx ? 2 * nin : nin;
  float *tmp = NULL, *tmp2 = NULL;
  void *pay = NULL;
  view_msg_t *r = NULL;
  json_t *view = json_object(), *arrays = json_array();
  if (h->ndim == 1)
    json_object_set_new(view, "shape", json_pack("[I]", (json_int_t)ow));
  else if (h->ndim >= 2)
    json_object_set_new(view, "shape", json_pack("[I,I]", (json_int_t)oh, (json_int_t)ow));
  else
    json_object_set_new(view, "shape", json_array());
  json_object_set_new(view, "factor", json_pack("[i,i]", (int)fy, (int)fx));
  json_object_set_new(view, "planes", json_integer((json_int_t)planes));
  json_object_set_new(view, "plane", json_integer(0));
  json_object_set_new(view, "complex", json_boolean(cplx));
  json_object_set_new(view, "stack", json_boolean(stack));
  json_object_set_new(view, "categorical", json_boolean(categorical));
  json_object_set_new(view, "downsample", json_string(use_max ? "max" : "mean"));

  if (n && data) {
    int ds = fy > 1 || fx > 1;
    /* One source plane at a time, so a stack costs one plane of scratch. */
    tmp = malloc(n * sizeof(float) * (cplx ? 2 : 1));
    if (!tmp)
      goto out;
    json_object_set_new(o, "data", view);
    json_object_set_new(view, "arrays", arrays);
    view = arrays = NULL;
    /* Header first needs the statistics, so compute into a scratch plane
     * and copy once into the message. */
    tmp2 = malloc(on * sizeof(float) * nplanes);
    if (!tmp2)
      goto out;
    if (cplx) {
      for (unsigned k = 0; k < nin; k++) {
        float *mag = tmp2 + 2 * k * on, *ph = mag + on;
        to_c32(data, (beam_dtype_t)h->dtype, k * n, n, tmp, tmp + n);
        if (ds) {
          downsample_cplx(tmp, tmp + n, dh, dw, fy, fx, use_max, mag, ph);
        } else {
          for (size_t i = 0; i < n; i++) {
            mag[i] = hypotf(tmp[i], tmp[n + i]);
            ph[i] = atan2f(tmp[n + i], tmp[i]);
          }
        }
      }
    } else {
      for (unsigned k = 0; k < nin; k++) {
        float *dst = tmp2 + k * on;
        if (ds) {
          to_f32(data, (beam_dtype_t)h->dtype, k * n, n, tmp);
          view_downsample(tmp, dh, dw, fy, fx, use_max, dst);
        } else {
          to_f32(data, (beam_dtype_t)h->dtype, k * n, n, dst);
        }
      }
    }
    json_t *arr = json_object_get(json_object_get(o, "data"), "arrays");
    if (stack) {
      for (unsigned k = 0; k < nin; k++) {
        json_t *l = plabels ? json_array_get(plabels, k) : NULL;
        char num[32];
        const char *nm = json_string_value(l);
        if (!nm) {
          snprintf(num, sizeof num, "%g", json_is_number(l) ? json_number_value(l) : (double)k);
          nm = num;
        }
        for (unsigned part = 0; part < (cplx ? 2u : 1u); part++) {
          json_t *st = plane_stats(nm, tmp2 + (cplx ? 2 * k + part : k) * on, on);
          if (cplx)
            json_object_set_new(st, "part", json_string(part ? "phase" : "magnitude"));
          json_array_append_new(arr, st);
        }
      }
    } else {
      json_array_append_new(arr, plane_stats(cplx ? "magnitude" : "value", tmp2, on));
      if (cplx)
        json_array_append_new(arr, plane_stats("phase", tmp2 + on, on));
    }
    r = view_msg_alloc(o, on * sizeof(float) * nplanes, &pay);
    if (r)
      memcpy(pay, tmp2, on * sizeof(float) * nplanes);
  } else {
    json_object_set_new(view, "arrays", arrays);
    json_object_set_new(o, "data", view);
    view = arrays = NULL;
    r = view_msg_new(o, NULL, 0);
  }
out:
  json_decref(view);
  json_decref(arrays);
  json_decref(o);
  free(tmp);
  free(tmp2);
  return r;
}

view_msg_t *view_disp_raw(const char *topic, zmq_msg_t *parts, size_t nparts, const char *why,
                          uint64_t t_rx_ns) {
  json_t *o = common_header("raw", topic, NULL, t_rx_ns);
  json_object_set_new(o, "why", json_string(why ? why : "unknown"));
  json_t *sizes = json_array();
  for (size_t i = 0; i < nparts; i++)
    json_array_append_new(sizes, json_integer((json_int_t)zmq_msg_size(&parts[i])));
  json_object_set_new(o, "part_sizes", sizes);
  /* The first part after the topic is where a header would be. */
  size_t k = nparts > 1 ? 1 : 0;
  char hex[2 * RAW_HEX_BYTES + 1] = "";
  if (nparts) {
    const unsigned char *p = zmq_msg_data(&parts[k]);
    size_t len = zmq_msg_size(&parts[k]);
    len = len < RAW_HEX_BYTES ? len : RAW_HEX_BYTES;
    for (size_t i = 0; i < len; i++)
      snprintf(hex + 2 * i, 3, "%02x", p[i]);
  }
  json_object_set_new(o, "head_hex", json_string(hex));
  view_msg_t *r = view_msg_new(o, NULL, 0);
  json_decref(o);
  return r;
}
