/* SPDX-License-Identifier: MIT */
/*
 * tests/fuzz/fuzz_ctxstats.c — the placement policy's catalog record decoder
 * (engine/catalog/ctxstats.c, FORMAT.md §2 "ctxstats record") on untrusted bytes.
 *
 * Must never crash or read outside the input. Properties (abort when broken):
 *   - a refusal is KVDB_CORRUPT or KVDB_VERSION with a message;
 *   - an accepted record is 32 bytes, its tier is a persistent tier, its frequency finite and
 *     >= 0, and encoding it gives back exactly the input (no field is lost or normalized);
 *   - the decayed frequency is finite, >= 0 and never above the stored one.
 * Seeds: tests/fuzz/corpora/ctxstats/.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "catalog/ctxstats.h"
#include "kvdb.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
  kv_ctxstats r;
  kvdb_status rc = kv_ctxstats_decode(data, size, &r);
  if (rc != KVDB_OK) {
    if ((rc != KVDB_CORRUPT && rc != KVDB_VERSION) || kvdb_errmsg()[0] == 0)
      abort();
    return 0;
  }
  if (size != KV_CTXSTATS_REC_BYTES || r.tier < KVDB_TIER_SSD || r.tier >= KVDB_TIER_COUNT ||
      !isfinite(r.freq) || r.freq < 0)
    abort();
  uint8_t buf[KV_CTXSTATS_REC_BYTES];
  kv_ctxstats_encode(&r, buf);
  if (memcmp(buf, data, size) != 0)
    abort();
  double f = kv_ctxstats_freq_at(&r, r.freq_ms + 3600000, 600000.0);
  if (!isfinite(f) || f < 0 || f > r.freq)
    abort();
  return 0;
}
