/* beamd-sim internals: options, the frame bank and the message sender.
 *
 * beamd-sim is a synthetic detector for testing and benchmarking beamd: it
 * sends SERIES_START / FRAME / SERIES_END messages in the wire format of
 * proto/proto.h over a ZeroMQ PUB or PUSH socket, or (--protocol) the
 * DECTRIS SIMPLON stream v1 / v2 a real detector sends (dectris.c). This
 * header is shared by the tool's own files only; nothing else links
 * against it.
 */
#ifndef BEAMD_SIM_H
#define BEAMD_SIM_H

#include <hdf5.h>
#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "proto/err.h"
#include "proto/proto.h"
#include "tools/common/cli.h"
#include "pipeline/frame.h"
#include "tools/common/sig.h"

typedef enum sim_pattern_e {
  SIM_PAT_POISSON = 0,
  SIM_PAT_FLAT,
  SIM_PAT_COUNTER,
  SIM_PAT_STEM,
  SIM_PAT_XPCS,
  SIM_PAT_PCA,
  SIM_PAT_PTYCHO,
  SIM_PAT_PUMPPROBE,
} sim_pattern_t;

/* What goes on the wire (--protocol): beamd's own protocol, or a DECTRIS
 * detector stream (dectris.c, docs/tools.md). */
typedef enum sim_protocol_e {
  SIM_PROTO_BEAMD = 0,
  SIM_PROTO_DECTRIS1, /* SIMPLON "legacy": JSON multipart messages */
  SIM_PROTO_DECTRIS2, /* SIMPLON CBOR, one part per message */
} sim_protocol_t;

typedef enum sim_dx_detail_e { SIM_DX_NONE = 0, SIM_DX_BASIC, SIM_DX_ALL } sim_dx_detail_t;
typedef enum sim_dx_enc_e {
  SIM_DX_RAW = 0, SIM_DX_LZ4, SIM_DX_BSLZ4, SIM_DX_BSZSTD
} sim_dx_enc_t;

/* Faults --fault can inject into a DECTRIS stream, one bit each. */
typedef enum sim_dx_fault_e {
  SIM_FAULT_NONJSON = 0, SIM_FAULT_TRUNCATED, SIM_FAULT_BEFORE_HEADER,
  SIM_FAULT_STALE, SIM_FAULT_GAP, SIM_FAULT_SIZE, SIM_FAULT_ENCODING,
  SIM_FAULT_DTYPE, SIM_FAULT_HASH, SIM_FAULT_NOSIG, SIM_FAULT_TYPENOTFIRST,
  SIM_FAULT_NESTING, SIM_FAULT_DIMS, SIM_FAULT_SHORT, SIM_FAULT_ALGORITHM,
  SIM_FAULT_COUNT_
} sim_dx_fault_t;

#define SIM_PCA_MAX_K 32
#define SIM_PCA_NO_DRIFT UINT64_MAX

const char *sim_pattern_name(sim_pattern_t p);

typedef struct sim_opts_s {
  const char *endpoint;
  int bind;          /* 1: bind, 0: connect */
  int sock_type;     /* ZMQ_PUB or ZMQ_PUSH */
  uint32_t h, w;
  beam_dtype_t dtype;
  double rate;       /* frames/s; 0 = as fast as possible */
  uint64_t frames;   /* per series; 0 = forever (one series) */
  uint64_t nseries;
  uint64_t series_id0;
  beam_codec_t codec;
  sim_pattern_t pattern;
  double mean;
  uint64_t seed;
  double wait_subs;  /* seconds, PUB only */
  int hwm;           /* -1: ZeroMQ default */
  uint64_t malformed;
  double frame_time; /* < 0: derive from rate */
  json_t *meta;      /* extra series metadata (owned) */
  /* xpcs only (see xpcs.c and docs/tools.md) */
  uint32_t xpcs_rings;
  uint32_t xpcs_modes;   /* coherence factor beta = 1 / modes */
  double xpcs_rate_min, xpcs_rate_max; /* 1/s */
  const char *label_file; /* ring label image written at start-up */
  /* pca only (see pca.c and docs/tools.md) */
  uint32_t pca_k;
  double pca_strengths[SIM_PCA_MAX_K];
  int pca_strengths_set; /* 0: pca_strengths are per-pixel RMS, times sqrt(H*W) */
  double pca_sigma;      /* < 0: Poisson noise, else Gaussian of this sigma */
  double pca_spikes;     /* fraction of pixels per frame */
  uint64_t pca_outliers;
  uint64_t pca_drift_at; /* SIM_PCA_NO_DRIFT: none */
  double pca_drift_angle; /* degrees */
  const char *pca_basis_file;
  int mean_set;          /* --mean given (pca has its own default) */
  /* ptycho only (see ptycho.c and docs/ptycho.md) */
  int shape_set;         /* --shape given (ptycho defaults to n x n) */
  uint32_t pty_n;        /* diffraction pattern side; 0: min(H, W) or 64 */
  double pty_energy, pty_distance, pty_pixel; /* eV, m, m */
  double pty_photons;    /* sum |P|^2 over modes = photons per frame on |O| = 1 */
  int pty_poisson;
  int pty_raster;        /* 0: Fermat spiral, 1: jittered raster */
  double pty_step, pty_jitter; /* m; fraction of the step */
  uint32_t pty_probe_modes;
  double pty_zp_diam, pty_zp_drn, pty_zp_cs, pty_defocus; /* m */
  const char *pty_object_file; /* FILE.h5[:/dataset] */
  const char *write_h5;  /* write the scan file and exit, no socket */
  /* pumpprobe only (see pumpprobe.c and docs/tools.md) */
  double pp_t0, pp_dmin, pp_dmax;  /* ps */
  double pp_fmin, pp_fmax;         /* 1/ps */
  double pp_taumin, pp_taumax;     /* ps */
  double pp_amp;                   /* amplitude / mean at the centre */
  const char *pp_truth_file;       /* float32 [5][H][W] a b tau f c */
  /* DECTRIS streams only (see dectris.c and docs/tools.md) */
  sim_protocol_t protocol;
  sim_dx_detail_t dx_detail;
  sim_dx_enc_t dx_enc;
  const char *dx_header_appendix, *dx_image_appendix; /* NULL: none */
  uint32_t dx_channels;  /* v2: 1 or 2 */
  int dx_jfj;            /* v2: Jungfraujoch flavour */
  uint32_t dx_faults;    /* 1u << sim_dx_fault_t */
  const char *dx_opt;    /* a DECTRIS-only option seen, for the error */
  int quiet;
  int stats_json;
} sim_opts_t;

/* Frame time in seconds: --frame-time, else 1/rate, else 0.001. It is both
 * the metadata frame_time and the XPCS model's time step. */
double sim_frame_time(const sim_opts_t *o);

/* XPCS speckle generator (xpcs.c): per-pixel AR(1) complex fields in q
 * rings with known relaxation rates, Poisson-sampled. */
typedef struct sim_xpcs_s sim_xpcs_t;
/* Builds the ring geometry and allocates all state. Returns 0, BEAM_EINVAL
 * (rings thinner than a pixel) or BEAM_ENOMEM. */
int sim_xpcs_new(sim_xpcs_t **out, const sim_opts_t *o, beam_diag_t *d);
/* Renders frame `frame_id` into dst (npix elements of the dtype). Frames
 * must come in order: each call advances the field one frame time, and
 * frame 0 restarts the process from its stationary distribution with the
 * next series' random stream. Never allocates. */
void sim_xpcs_render(sim_xpcs_t *self, uint64_t frame_id, void *dst);
/* The ground truth for the series metadata ("xpcs" object); new reference. */
json_t *sim_xpcs_meta(const sim_xpcs_t *self);
/* Writes the ring label image (uint16 HxW, 0 = no ring, ring r = r+1). */
int sim_xpcs_write_labels(const sim_xpcs_t *self, const char *path, beam_diag_t *d);
/* Frees everything and NULLs *self; NULL-safe. */
void sim_xpcs_destroy(sim_xpcs_t **self);

/* PCA generator (pca.c): mean image + a known rank-k subspace with random
 * per-frame coefficients, noise, hot-pixel spikes, outlier frames and an
 * optional subspace change. */
typedef struct sim_pca_s sim_pca_t;
/* Builds the basis, mean image and outlier list. Returns 0, BEAM_EINVAL
 * (k or the outlier count does not fit) or BEAM_ENOMEM. */
int sim_pca_new(sim_pca_t **out, const sim_opts_t *o, beam_diag_t *d);
/* Called at each SERIES_START: the next series draws from its own streams. */
void sim_pca_series_start(sim_pca_t *self);
/* Renders frame `frame_id` into dst (npix elements of the dtype); any
 * order, never allocates. */
void sim_pca_render(sim_pca_t *self, uint64_t frame_id, void *dst);
/* The ground truth for the series metadata ("pca" object); new reference. */
json_t *sim_pca_meta(const sim_pca_t *self, const char *basis_file);
/* Writes the basis: float32 (k, H, W), or (2, k, H, W) with a drift
 * (before, from drift_at on). */
int sim_pca_write_basis(const sim_pca_t *self, const char *path, beam_diag_t *d);
void sim_pca_destroy(sim_pca_t **self);

/* Ptychography scan (ptycho.c): a known complex object, a zone-plate probe
 * (optionally several incoherent modes), a Fermat-spiral or jittered-raster
 * scan, far-field intensities sum_j |F(P_j O_window)|^2 (unitary FFT),
 * optional Poisson noise. The command-line options are parsed there. */
typedef struct sim_ptycho_s sim_ptycho_t;
/* Option codes of the ptycho options; main.c splices SIM_PTYCHO_LONG_OPTS
 * into its table and hands these codes to sim_ptycho_opt. */
enum {
  SIM_PTY_OPT_BASE = 1024, SIM_PTY_N = SIM_PTY_OPT_BASE, SIM_PTY_ENERGY, SIM_PTY_DISTANCE,
  SIM_PTY_PIXEL, SIM_PTY_PHOTONS, SIM_PTY_NOISE, SIM_PTY_SCAN, SIM_PTY_STEP, SIM_PTY_JITTER,
  SIM_PTY_MODES, SIM_PTY_ZP_DIAM, SIM_PTY_ZP_DRN, SIM_PTY_ZP_CS, SIM_PTY_DEFOCUS,
  SIM_PTY_OBJECT, SIM_PTY_WRITE_H5, SIM_PTY_OPT_END
};
#define SIM_PTYCHO_LONG_OPTS                                                  \
  {"ptycho-n", required_argument, 0, SIM_PTY_N},                              \
  {"energy", required_argument, 0, SIM_PTY_ENERGY},                           \
  {"distance", required_argument, 0, SIM_PTY_DISTANCE},                       \
  {"pixel-size", required_argument, 0, SIM_PTY_PIXEL},                        \
  {"photons", required_argument, 0, SIM_PTY_PHOTONS},                         \
  {"noise", required_argument, 0, SIM_PTY_NOISE},                             \
  {"scan", required_argument, 0, SIM_PTY_SCAN},                               \
  {"scan-step", required_argument, 0, SIM_PTY_STEP},                          \
  {"scan-jitter", required_argument, 0, SIM_PTY_JITTER},                      \
  {"probe-modes", required_argument, 0, SIM_PTY_MODES},                       \
  {"zp-diameter", required_argument, 0, SIM_PTY_ZP_DIAM},                     \
  {"zp-outer-zone", required_argument, 0, SIM_PTY_ZP_DRN},                    \
  {"zp-stop", required_argument, 0, SIM_PTY_ZP_CS},                           \
  {"defocus", required_argument, 0, SIM_PTY_DEFOCUS},                         \
  {"ptycho-object", required_argument, 0, SIM_PTY_OBJECT},                    \
  {"write-h5", required_argument, 0, SIM_PTY_WRITE_H5},
/* Sets the defaults of the ptycho fields. */
void sim_ptycho_defaults(sim_opts_t *o);
/* Parses one ptycho option (code from the enum). Returns 0 or -1 after
 * printing why. */
int sim_ptycho_opt(int code, const char *arg, sim_opts_t *o);
/* Cross-checks after parsing (shape vs n, frames); 0 or -1 after printing. */
int sim_ptycho_check(sim_opts_t *o);
/* Builds object, probe, scan and FFT plan. BEAM_EINVAL / BEAM_EIO for a
 * bad object file or geometry, BEAM_ENOMEM. */
int sim_ptycho_new(sim_ptycho_t **out, const sim_opts_t *o, beam_diag_t *d);
/* Renders frame `frame_id` (scan point frame_id mod count) into dst and
 * sets pos (x, y, 0) in metres. Any order; never allocates. */
void sim_ptycho_render(sim_ptycho_t *self, uint64_t frame_id, void *dst, double pos[3]);
/* Adds geometry (energy, distance, pixel_size, beam_center), the scan
 * positions and a "ptycho" summary to the series metadata m; 0 or -1. */
int sim_ptycho_meta(const sim_ptycho_t *self, json_t *m);
/* Writes the whole scan (frames, positions, geometry, truth) as an NXmx
 * file beamd-replay serves and beamd-ptycho reads (ptycho_h5.c). */
int sim_ptycho_write_h5(sim_ptycho_t *self, const sim_opts_t *o, const char *path,
                        beam_diag_t *d);
void sim_ptycho_destroy(sim_ptycho_t **self);

/* Pump-probe delay scan (pumpprobe.c): per-pixel damped cosines after a
 * time zero with known, spatially varying maps; Poisson counts; the delay
 * of each frame in the series metadata ("delay", ps). */
typedef struct sim_pp_s sim_pp_t;
int sim_pp_new(sim_pp_t **out, const sim_opts_t *o, beam_diag_t *d);
/* Delay (ps) of frame frame_id. */
double sim_pp_delay(const sim_pp_t *s, uint64_t frame_id);
/* Renders frame frame_id into dst (npix elements of the dtype); any order,
 * never allocates. */
void sim_pp_render(sim_pp_t *s, uint64_t series_id, uint64_t frame_id, void *dst);
/* The "pumpprobe" metadata object (parameters, model, "delays"); new ref. */
json_t *sim_pp_meta(const sim_pp_t *s, const sim_opts_t *o);
int sim_pp_write_truth(const sim_pp_t *s, const char *path, beam_diag_t *d);
/* The truth maps, float32 [5][H][W] in the order a b tau f c. */
const float *sim_pp_truth(const sim_pp_t *s);
/* --write-h5 with --pattern pumpprobe: the series as an HDF5 file (frames,
 * /entry/data/delay, the truth maps) in the layout beamd-replay serves and
 * beamd-fit reads (pumpprobe_h5.c). Returns 0 or < 0 with d set. */
int sim_pp_write_h5(sim_pp_t *s, const sim_opts_t *o, const char *path, beam_diag_t *d);
void sim_pp_destroy(sim_pp_t **self);

/* Pre-generated pixels. Static patterns (poisson, flat, counter) hand out
 * windows into one buffer, so a frame costs no generation and can be sent
 * zero-copy; stem renders a disk on top of a poisson window into a buffer
 * the caller provides, and xpcs and pca render each frame. */
typedef struct sim_bank_s {
  sim_pattern_t pattern;
  beam_dtype_t dtype;
  size_t esize;
  size_t npix;
  uint32_t h, w;
  uint64_t seed;
  uint8_t *data;    /* bank, nelems elements */
  size_t nelems;
  size_t nwin;      /* number of valid window start offsets */
  /* stem only */
  int32_t *disk_dy, *disk_dx; /* disk pixel offsets from its centre */
  size_t ndisk;
  uint32_t scan_nx, scan_ny;
  double disk_peak;
  sim_xpcs_t *xpcs; /* xpcs only */
  sim_pca_t *pca;   /* pca only */
  sim_ptycho_t *ptycho; /* ptycho only */
  sim_pp_t *pp;         /* pumpprobe only */
} sim_bank_t;

/* Allocates and fills the bank. Returns 0 or BEAM_ENOMEM / BEAM_EINVAL. */
int sim_bank_init(sim_bank_t *self, const sim_opts_t *o, beam_diag_t *d);
/* 1 when sim_bank_frame returns a pointer into the bank (zero-copy safe).
 * For xpcs the bank is one zero frame, used only by malformed messages. */
int sim_bank_is_static(const sim_bank_t *self);
/* Pixels of frame `frame_id` of a series. Static patterns return a window
 * of the bank (valid until destroy) and ignore dst; stem, xpcs and pca render into dst
 * (npix * esize bytes) and returns it. Sets pos[0..1] (metres) and returns
 * *has_pos = 1 for stem. Never allocates. */
const void *sim_bank_frame(sim_bank_t *self, uint64_t frame_id, void *dst,
                           double pos[3], int *has_pos);
void sim_bank_destroy(sim_bank_t *self);

/* Running totals, printed by --stats-json. */
typedef struct sim_stats_s {
  uint64_t frames_sent;
  uint64_t series;
  uint64_t bytes;          /* all parts of all messages, malformed included */
  uint64_t malformed_sent;
  uint64_t t_first_ns, t_last_ns;             /* monotonic, first/last message */
  uint64_t t_first_frame_ns, t_last_frame_ns; /* monotonic, first/last FRAME */
} sim_stats_t;

/* Message sender: owns the sequence counter and the encode buffers. */
typedef struct sim_tx_s {
  void *sock;
  const sim_opts_t *o;
  sim_bank_t *bank;
  uint64_t seq;        /* next sequence number */
  size_t raw_bytes;    /* one frame */
  uint8_t *frame_buf;  /* rendered frame (stem + codec) */
  uint8_t *enc_buf;    /* encoded payload */
  size_t enc_cap;
  uint8_t *scratch;    /* bitshuffle scratch */
  sim_stats_t st;
} sim_tx_t;

int sim_tx_init(sim_tx_t *self, void *sock, const sim_opts_t *o,
                sim_bank_t *bank, beam_diag_t *d);
void sim_tx_destroy(sim_tx_t *self);
/* Each returns 0, or -1 with errno from zmq (EINTR when a signal arrived). */
int sim_tx_series_start(sim_tx_t *self, uint64_t series_id, beam_diag_t *d);
int sim_tx_frame(sim_tx_t *self, uint64_t series_id, uint64_t frame_id,
                 beam_diag_t *d);
int sim_tx_series_end(sim_tx_t *self, uint64_t series_id, uint64_t nframes,
                      int aborted, beam_diag_t *d);
/* Sends malformed message number k (kinds cycle, see docs/tools.md). */
int sim_tx_malformed(sim_tx_t *self, uint64_t k, uint64_t series_id,
                     beam_diag_t *d);

/* DECTRIS SIMPLON streams (dectris.c). Option codes, spliced into main.c's
 * table like the ptycho ones and handed to sim_dectris_opt. */
enum {
  SIM_DX_OPT_BASE = 1100, SIM_DX_PROTOCOL = SIM_DX_OPT_BASE, SIM_DX_DETAIL,
  SIM_DX_ENCODING, SIM_DX_HAPPENDIX, SIM_DX_IAPPENDIX, SIM_DX_CHANNELS, SIM_DX_JFJ,
  SIM_DX_FAULT, SIM_DX_OPT_END
};
#define SIM_DECTRIS_LONG_OPTS                                                 \
  {"protocol", required_argument, 0, SIM_DX_PROTOCOL},                        \
  {"header-detail", required_argument, 0, SIM_DX_DETAIL},                     \
  {"encoding", required_argument, 0, SIM_DX_ENCODING},                        \
  {"header-appendix", required_argument, 0, SIM_DX_HAPPENDIX},                \
  {"image-appendix", required_argument, 0, SIM_DX_IAPPENDIX},                 \
  {"channels", required_argument, 0, SIM_DX_CHANNELS},                        \
  {"jfj", no_argument, 0, SIM_DX_JFJ},                                        \
  {"fault", required_argument, 0, SIM_DX_FAULT},
/* Sets the defaults of the DECTRIS fields (protocol beamd). */
void sim_dectris_defaults(sim_opts_t *o);
/* Parses one DECTRIS option (code from the enum); 0 or -1 after printing. */
int sim_dectris_opt(int code, const char *arg, sim_opts_t *o);
/* Cross-checks after parsing; sets the protocol's default endpoint and the
 * PUSH socket. The flags say which generic options were given. 0 or -1
 * after printing why. */
int sim_dectris_check(sim_opts_t *o, int have_bind, int have_connect, int have_socket,
                      int have_codec);
/* One line on stderr describing the run (the counterpart of main.c's). */
void sim_dectris_describe(const sim_opts_t *o);
/* Sends every series on sock (a bound PUSH) and prints the one-line JSON
 * summary on stderr; fills st for --stats-json. Returns 0, or -1 with d set
 * (d->code == 0 when a signal stopped it, which is not an error). */
int sim_dectris_run(void *sock, const sim_opts_t *o, sim_bank_t *bank, sim_stats_t *st,
                    beam_diag_t *d);

/* HDF5 file and memory types of a frame dtype, for the --write-h5 writers
 * (ptycho_h5.c, pumpprobe_h5.c); HDF5's own constants, not to be closed. */
hid_t sim_h5_file_type(beam_dtype_t dt);
hid_t sim_h5_mem_type(beam_dtype_t dt);

#endif
