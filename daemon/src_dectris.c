/* temporary: replaced by the DECTRIS source in the next commit */
#include "daemon/beamd.h"
/* In the order of the format enum's choices. */
enum { FMT_AUTO = 0, FMT_V1 = 1, FMT_V2 = 2 };

const beam_param_t beamd_dectris_params[] = {
    {"format", BEAM_P_ENUM, "auto", 0, 0, 0, "auto|v1|v2", NULL,
     "stream format: v1 = SIMPLON legacy JSON (stream format legacy), v2 = CBOR (format cbor, "
     "also Jungfraujoch); auto = told by each message's first bytes", NULL},
    {"channel", BEAM_P_STRING, "", 0, 0, 0, NULL, NULL,
     "v2 with several thresholds: the channel the pipeline receives (for example threshold_2); "
     "\"\" = the first one the start message lists", NULL},
    {"verify_hash", BEAM_P_BOOL, "false", 0, 0, 0, NULL, NULL,
     "v1: check each image's md5 against its dimage hash (costs a pass over the blob; some "
     "detector firmware sends hashes that do not match)", NULL},
    BEAM_PARAM_END};

static int o(beamd_t *d, void **s, const beam_cnode_t *c, char *e, size_t l) {
  (void)d; (void)s; (void)c; snprintf(e, l, "dectris: not yet"); return BEAM_ENOTSUP; }
static void r(beamd_t *d, void *s) { (void)d; (void)s; }
static int dr(beamd_t *d, void *s) { (void)d; (void)s; return 0; }
const beamd_source_ops_t beamd_src_dectris = {.mode = "dectris", .lossless = 1, .params = beamd_dectris_params, .open = o, .resume = r, .drain = dr, .stop = r, .close = r};
