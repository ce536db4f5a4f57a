/* beamd-replay: the request parser (PROTOCOL.md section 13), apart from the
 * server so that it is a pure function of the bytes received: the fuzz
 * target tests/fuzz/fuzz_replay_json.c drives it directly. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tools/beamd-replay/replay.h"

static const char *get_uint(json_t *o, const char *key, int required, uint64_t lo,
                            uint64_t hi, uint64_t *out, char *why, size_t wl) {
  json_t *v = json_object_get(o, key);
  if (!v) {
    if (!required)
      return NULL;
    snprintf(why, wl, "missing \"%s\"", key);
    return why;
  }
  if (!json_is_integer(v) || json_integer_value(v) < 0 ||
      (uint64_t)json_integer_value(v) < lo || (uint64_t)json_integer_value(v) > hi) {
    snprintf(why, wl, "\"%s\" must be an integer in %llu..%llu", key, (unsigned long long)lo,
             (unsigned long long)hi);
    return why;
  }
  *out = (uint64_t)json_integer_value(v);
  return NULL;
}

/* The optional "shm" object of a get (section 13.6): path, size,
 * slot_bytes and one slot number per frame the reply may carry. */
static const char *get_shm(json_t *o, rp_req_t *q, uint32_t *slots, char *why, size_t wl) {
  if (!o)
    return NULL;
  if (!json_is_object(o))
    return "\"shm\" must be an object";
  json_t *path = json_object_get(o, "path"), *sl = json_object_get(o, "slots");
  if (!json_is_string(path) || !json_is_array(sl))
    return "\"shm\" needs \"path\" (a string) and \"slots\" (an array)";
  const char *e = get_uint(o, "size", 1, 1, (uint64_t)INT64_MAX, &q->shm_size, why, wl);
  if (!e)
    e = get_uint(o, "slot_bytes", 1, 1, q->shm_size, &q->shm_slot_bytes, why, wl);
  if (e)
    return e;
  size_t n = json_array_size(sl);
  if (n < 1 || n > RP_CREDIT_MAX)
    return "\"shm\".\"slots\" must hold 1..4096 slot numbers";
  uint64_t nslot = q->shm_size / q->shm_slot_bytes;
  for (size_t i = 0; i < n; i++) {
    json_t *v = json_array_get(sl, i);
    if (!json_is_integer(v) || json_integer_value(v) < 0 || (uint64_t)json_integer_value(v) >= nslot) {
      snprintf(why, wl, "\"shm\".\"slots\"[%zu] must be a slot number in 0..%llu", i,
               (unsigned long long)(nslot - 1));
      return why;
    }
    slots[i] = (uint32_t)json_integer_value(v);
  }
  if (!(q->shm_path = strdup(json_string_value(path))))
    return "out of memory";
  q->nslots = n;
  return NULL;
}

const char *rp_request_parse(const void *buf, size_t len, rp_req_t *q, uint32_t *slots,
                             char *why, size_t wl) {
  memset(q, 0, sizeof *q);
  q->id = -1;
  json_error_t jerr;
  json_t *req = json_loadb(buf, len, 0, &jerr);
  if (!req) {
    snprintf(why, wl, "request is not valid JSON: %s", jerr.text);
    return why;
  }
  const char *err = NULL;
  if (!json_is_object(req)) {
    json_decref(req);
    return "request is not a JSON object";
  }
  json_t *id = json_object_get(req, "id");
  q->id = json_is_integer(id) && json_integer_value(id) >= 0 ? json_integer_value(id) : -1;
  json_t *op = json_object_get(req, "op");
  const char *ops = json_is_string(op) ? json_string_value(op) : NULL;
  if (!ops || (strcmp(ops, "get") && strcmp(ops, "info"))) {
    err = "\"op\" must be \"get\" or \"info\"";
  } else if (!strcmp(ops, "info")) {
    q->info = 1;
  } else {
    json_t *st = json_object_get(req, "start");
    err = get_uint(req, "next", 1, 0, (uint64_t)INT64_MAX, &q->next, why, wl);
    if (!err)
      err = get_uint(req, "credit", 1, 1, RP_CREDIT_MAX, &q->credit, why, wl);
    if (!err)
      err = get_uint(req, "max_bytes", 0, 1, (uint64_t)INT64_MAX, &q->max_bytes, why, wl);
    if (!err && st && !json_is_boolean(st))
      err = "\"start\" must be true or false";
    q->start = st && json_is_true(st);
    if (!err)
      err = get_shm(json_object_get(req, "shm"), q, slots, why, wl);
    json_t *mp = json_object_get(req, "map");
    if (!err && mp && !json_is_boolean(mp))
      err = "\"map\" must be true or false";
    q->map = mp && json_is_true(mp);
  }
  json_decref(req);
  if (err) {
    free(q->shm_path);
    q->shm_path = NULL;
  }
  return err;
}
