/* libFuzzer entry for beamd-replay's request parser
 * (tools/beamd-replay/request.c): every request a client sends to the
 * replay server goes through it (built by `make fuzz`).
 *
 * The input is the request part. A request is refused with a reason, or
 * accepted within the limits PROTOCOL.md section 13 sets: credit
 * 1..RP_CREDIT_MAX, slot numbers inside the landing area, a path exactly
 * when slots are given. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "tools/beamd-replay/replay.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static uint32_t slots[RP_CREDIT_MAX];

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  /* An exact-size copy, so any read past the bytes shows under ASan. */
  uint8_t *buf = malloc(size ? size : 1);
  if (!buf)
    return 0;
  if (size)
    memcpy(buf, data, size);
  char why[256];
  rp_req_t q;
  const char *err = rp_request_parse(buf, size, &q, slots, why, sizeof why);
  if (err) {
    if (!err[0] || q.shm_path)
      abort();
  } else if (!q.info) {
    if (q.credit < 1 || q.credit > RP_CREDIT_MAX || q.nslots > RP_CREDIT_MAX ||
        (q.nslots != 0) != (q.shm_path != NULL))
      abort();
    for (uint64_t i = 0; i < q.nslots; i++)
      if (q.shm_slot_bytes == 0 || slots[i] >= q.shm_size / q.shm_slot_bytes)
        abort();
  }
  free(q.shm_path);
  free(buf);
  return 0;
}
