/* beamd-fit input: the scan through beamd-replay's frame source (so every
 * layout and codec beamd-replay reads works here too), the x values, the
 * pixel selection, and this rank's frames read and decoded once. */
#include "tools/beamd-fit/bfit.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/h5util.h"

/* A dataset named "DSET" (in the scan's file, the master for NXmx) or
 * "FILE:DSET". *own is the file to close afterwards, or -1. */
static hid_t open_spec(const bf_input_t *in, const char *spec, const char *opt, hid_t *own,
                       char *where, size_t wl, beam_diag_t *d) {
  char buf[1024], why[512];
  snprintf(buf, sizeof buf, "%s", spec);
  const char *ds = beam_h5_split_spec(buf);
  hid_t f = in->src.file;
  *own = -1;
  if (ds) {
    f = *own = H5Fopen(buf, H5F_ACC_RDONLY, H5P_DEFAULT);
    if (f < 0)
      return BEAM_DIAG(d, BEAM_EIO, "--%s: file %s: cannot open as HDF5: %s", opt, buf,
                       rp_h5_reason(why, sizeof why));
    snprintf(where, wl, "file %s dataset %s", buf, ds);
  } else {
    ds = buf;
    snprintf(where, wl, "file %s dataset %s", in->src.path, ds);
  }
  if (!beam_h5_exists(f, ds)) {
    BEAM_DIAG(d, BEAM_EINVAL, "--%s: %s: no such dataset", opt, where);
    goto fail;
  }
  hid_t id = H5Dopen2(f, ds, H5P_DEFAULT);
  if (id < 0) {
    BEAM_DIAG(d, BEAM_EINVAL, "--%s: %s: cannot open: %s", opt, where,
              rp_h5_reason(why, sizeof why));
    goto fail;
  }
  return id;
fail:
  if (*own >= 0)
    H5Fclose(*own);
  *own = -1;
  return -1;
}

static int read_x(bf_input_t *in, const bf_opts_t *o, beam_diag_t *d) {
  in->x = malloc(in->T * sizeof *in->x);
  if (!in->x)
    return BEAM_DIAG(d, BEAM_ENOMEM, "x values");
  if (!o->x_dataset) {
    for (uint64_t k = 0; k < in->T; k++)
      in->x[k] = o->x_start + (double)k * o->x_step;
    snprintf(in->x_what, sizeof in->x_what, "x = %.17g + k * %.17g", o->x_start, o->x_step);
    return 0;
  }
  char where[1100], why[512];
  hid_t own, ds = open_spec(in, o->x_dataset, "x", &own, where, sizeof where, d);
  if (ds < 0)
    return d->code;
  int rc = 0;
  hid_t sp = H5Dget_space(ds);
  hsize_t dims[8] = {0};
  int nd = H5Sget_simple_extent_ndims(sp);
  if (nd >= 1 && nd <= 8)
    H5Sget_simple_extent_dims(sp, dims, NULL);
  hid_t t = H5Dget_type(ds);
  H5T_class_t cls = H5Tget_class(t);
  H5Tclose(t);
  if (cls != H5T_INTEGER && cls != H5T_FLOAT)
    rc = BEAM_DIAG(d, BEAM_ESHAPE, "--x: %s: not numbers", where);
  else if (nd != 1)
    rc = BEAM_DIAG(d, BEAM_ESHAPE, "--x: %s: has %d dimensions, expected 1 (one x per frame)",
                   where, nd);
  else if (dims[0] != in->T)
    rc = BEAM_DIAG(d, BEAM_ESHAPE, "--x: %s: %llu values, but file %s dataset %s has %llu "
                   "frames", where, (unsigned long long)dims[0], in->src.path, in->src.dataset,
                   (unsigned long long)in->T);
  else if (H5Dread(ds, H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, in->x) < 0)
    rc = BEAM_DIAG(d, BEAM_EIO, "--x: %s: %s", where, rp_h5_reason(why, sizeof why));
  for (uint64_t k = 0; rc == 0 && k < in->T; k++)
    if (!isfinite(in->x[k]))
      rc = BEAM_DIAG(d, BEAM_EINVAL, "--x: %s: index %llu is not finite (%g)", where,
                     (unsigned long long)k, in->x[k]);
  H5Sclose(sp);
  H5Dclose(ds);
  if (own >= 0)
    H5Fclose(own);
  snprintf(in->x_what, sizeof in->x_what, "%s", where);
  return rc;
}

/* Selected pixels: inside the ROI and zero in the mask (the NXmx
 * pixel_mask convention: any set bit excludes the pixel). */
static int select_pixels(bf_input_t *in, const bf_opts_t *o, beam_diag_t *d) {
  uint64_t n = (uint64_t)in->h * in->w;
  uint8_t *keep = malloc(n);
  if (!keep)
    return BEAM_DIAG(d, BEAM_ENOMEM, "pixel selection");
  uint32_t y0 = 0, y1 = in->h, x0 = 0, x1 = in->w;
  if (o->have_roi) {
    if (o->roi[1] > in->h || o->roi[3] > in->w) {
      free(keep);
      return BEAM_DIAG(d, BEAM_EINVAL, "--roi %u:%u,%u:%u: outside the %ux%u frames of file %s "
                       "dataset %s", o->roi[0], o->roi[1], o->roi[2], o->roi[3], in->h, in->w,
                       in->src.path, in->src.dataset);
    }
    y0 = o->roi[0], y1 = o->roi[1], x0 = o->roi[2], x1 = o->roi[3];
  }
  for (uint32_t y = 0; y < in->h; y++)
    for (uint32_t x = 0; x < in->w; x++)
      keep[(uint64_t)y * in->w + x] = y >= y0 && y < y1 && x >= x0 && x < x1;
  if (o->mask) {
    char where[1100], why[512];
    hid_t own, ds = open_spec(in, o->mask, "mask", &own, where, sizeof where, d);
    if (ds < 0) {
      free(keep);
      return d->code;
    }
    int rc = 0;
    hid_t sp = H5Dget_space(ds);
    hsize_t dims[8] = {0};
    int nd = H5Sget_simple_extent_ndims(sp);
    if (nd >= 1 && nd <= 8)
      H5Sget_simple_extent_dims(sp, dims, NULL);
    uint32_t *m = NULL;
    if (nd != 2 || dims[0] != in->h || dims[1] != in->w)
      rc = BEAM_DIAG(d, BEAM_ESHAPE, "--mask: %s: shape must be the frame shape %ux%u", where,
                     in->h, in->w);
    else if (!(m = malloc(n * sizeof *m)))
      rc = BEAM_DIAG(d, BEAM_ENOMEM, "mask");
    else if (H5Dread(ds, H5T_NATIVE_UINT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, m) < 0)
      rc = BEAM_DIAG(d, BEAM_EIO, "--mask: %s: %s", where, rp_h5_reason(why, sizeof why));
    for (uint64_t i = 0; rc == 0 && i < n; i++)
      if (m[i])
        keep[i] = 0;
    free(m);
    H5Sclose(sp);
    H5Dclose(ds);
    if (own >= 0)
      H5Fclose(own);
    if (rc) {
      free(keep);
      return rc;
    }
  }
  in->npix = 0;
  for (uint64_t i = 0; i < n; i++)
    in->npix += keep[i];
  in->pix = malloc((in->npix ? in->npix : 1) * sizeof *in->pix);
  if (!in->pix) {
    free(keep);
    return BEAM_DIAG(d, BEAM_ENOMEM, "pixel list");
  }
  uint64_t k = 0;
  for (uint64_t i = 0; i < n; i++)
    if (keep[i])
      in->pix[k++] = (uint32_t)i;
  free(keep);
  if (!in->npix)
    return BEAM_DIAG(d, BEAM_EINVAL, "file %s dataset %s: the mask and ROI leave no pixel to fit",
                     in->src.path, in->src.dataset);
  return 0;
}

int bf_input_open(bf_input_t *in, const bf_opts_t *o, beam_diag_t *d) {
  memset(in, 0, sizeof *in);
  int rc = rp_src_open(&in->src, o->input, o->dataset, d);
  if (rc < 0)
    return rc;
  in->src_open = 1;
  in->T = in->src.nframes;
  in->h = in->src.h;
  in->w = in->src.w;
  in->esize = in->src.esize;
  in->dtype = in->src.dtype;
  if ((uint64_t)in->h * in->w > UINT32_MAX)
    return BEAM_DIAG(d, BEAM_ELIMIT, "file %s: frames of %ux%u pixels are too large",
                     in->src.path, in->h, in->w);
  if ((rc = read_x(in, o, d)) < 0)
    return rc;
  return select_pixels(in, o, d);
}

static const rp_part_t *part_at(const rp_src_t *s, uint64_t g) {
  const rp_part_t *p = &s->parts[0];
  for (size_t i = 0; i < s->nparts; i++)
    if (s->parts[i].first <= g)
      p = &s->parts[i];
  return p;
}

/* Frame boundary b moved down to a chunk boundary of its part. */
static uint64_t align_down(const rp_src_t *s, uint64_t b) {
  if (b >= s->nframes)
    return s->nframes;
  const rp_part_t *p = part_at(s, b);
  uint64_t c = p->chunk0 > 1 ? p->chunk0 : 1;
  return p->first + (b - p->first) / c * c;
}

void bf_input_range(const bf_input_t *in, int rank, int size, uint64_t *f0, uint64_t *f1) {
  uint64_t T = in->T;
  *f0 = align_down(&in->src, T * (uint64_t)rank / (uint64_t)size);
  *f1 = align_down(&in->src, T * (uint64_t)(rank + 1) / (uint64_t)size);
}

/* The selected pixels of one decoded frame, in the file's element type. */
static void gather(const bf_input_t *in, const uint8_t *frame, uint8_t *dst) {
  const uint32_t *pix = in->pix;
  uint64_t n = in->npix;
  if (n == (uint64_t)in->h * in->w) {
    memcpy(dst, frame, n * in->esize);
    return;
  }
  switch (in->esize) {
  case 1: for (uint64_t k = 0; k < n; k++) dst[k] = frame[pix[k]]; break;
  case 2: {
    const uint16_t *f = (const uint16_t *)frame;
    uint16_t *o = (uint16_t *)dst;
    for (uint64_t k = 0; k < n; k++) o[k] = f[pix[k]];
    break;
  }
  case 4: {
    const uint32_t *f = (const uint32_t *)frame;
    uint32_t *o = (uint32_t *)dst;
    for (uint64_t k = 0; k < n; k++) o[k] = f[pix[k]];
    break;
  }
  default:
    for (uint64_t k = 0; k < n; k++)
      memcpy(dst + k * in->esize, frame + (uint64_t)pix[k] * in->esize, in->esize);
  }
}

int bf_input_read(bf_input_t *in, uint64_t f0, uint64_t f1, beam_diag_t *d) {
  rp_src_t *s = &in->src;
  in->f0 = f0;
  in->f1 = f1;
  size_t row = (size_t)in->npix * in->esize;
  in->slab = malloc((f1 - f0) * row + 1);
  uint8_t *buf = malloc(s->slot_size), *frame = malloc(s->raw_size);
  uint8_t *scratch = malloc(s->raw_size);
  int rc = 0;
  if (!in->slab || !buf || !frame || !scratch)
    rc = BEAM_DIAG(d, BEAM_ENOMEM, "frames %llu..%llu: %.1f MiB of frames for this rank",
                   (unsigned long long)f0, (unsigned long long)f1,
                   (double)(f1 - f0) * (double)row / 1048576.0);
  char why[1024];
  for (uint64_t g = f0; rc == 0 && g < f1; g++) {
    beam_codec_t codec;
    size_t len;
    if (rp_src_read(s, g, buf, s->slot_size, &codec, &len, why, sizeof why) < 0) {
      rc = BEAM_DIAG(d, BEAM_EIO, "%s", why);
      break;
    }
    const uint8_t *raw = buf;
    if (codec != BEAM_CODEC_RAW) {
      const char *bad = NULL;
      if (beam_codec_decode(codec, buf, len, frame, s->raw_size, s->esize, scratch, &bad) < 0) {
        const rp_part_t *p = part_at(s, g);
        rc = BEAM_DIAG(d, BEAM_EIO, "file %s dataset %s frame %llu: %s chunk: %s", p->file,
                       p->dataset, (unsigned long long)(g - p->first), beam_codec_name(codec),
                       bad ? bad : "cannot decode");
        break;
      }
      raw = frame;
    }
    gather(in, raw, in->slab + (g - f0) * row);
  }
  free(buf);
  free(frame);
  free(scratch);
  return rc;
}

void bf_input_close(bf_input_t *in) {
  if (in->src_open)
    rp_src_close(&in->src);
  free(in->x);
  free(in->pix);
  free(in->slab);
  memset(in, 0, sizeof *in);
}
