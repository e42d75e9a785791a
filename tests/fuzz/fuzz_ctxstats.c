/* SPDX-License-Identifier: MIT */
/*
 * tests/fuzz/fuzz_ctxstats.c — the placement's catalog record decoders on untrusted bytes. The
 * first input byte picks the decoder, the rest is the record:
 *   0  the ctxstats record (engine/catalog/ctxstats.c, FORMAT.md §2 "ctxstats record");
 *   1  meta "placement", the settings serving handles record (kv_place_set_decode);
 *   2  meta "perf.<tier>", cached tier figures (kv_place_perf_decode);
 *   3  meta "counts", kvdb_stat's per-tier counters (kv_counts_decode);
 *   4  the prior record (catalog.h PRIORS: a group's predicted profile, kv_prior_rec_decode).
 *
 * Must never crash or read outside the input. Properties (abort when broken):
 *   - a refusal is KVDB_CORRUPT (or KVDB_VERSION for ctxstats) with a message;
 *   - ctxstats: an accepted record is 32 bytes (version 1) or 40 (version 2, a prior group
 *     != 0: catalog.h PRIORS), its tier is a persistent tier, its frequency
 *     finite and >= 0, and encoding it gives back exactly the input (no field is lost or
 *     normalized); the decayed frequency is finite, >= 0 and never above the stored one;
 *   - placement settings: accepted ones are valid kvdb_options placement fields (a rule that
 *     is not off) and encode back to the input;
 *   - tier figures: accepted ones are finite, bandwidth > 0, latency >= 0, and encode back;
 *   - counters: accepted ones are KV_COUNTS_BYTES long and encode back to the input.
 * Seeds: tests/fuzz/corpora/ctxstats/.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "catalog/catalog.h"
#include "place/place.h"
#include "kvdb.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void refused(kvdb_status rc, int version_ok)
{
  if ((rc != KVDB_CORRUPT && !(version_ok && rc == KVDB_VERSION)) || kvdb_errmsg()[0] == 0)
    abort();
}

static void ctxstats(const uint8_t *data, size_t size)
{
  kv_ctxstats r;
  kvdb_status rc = kv_ctxstats_decode(data, size, &r);
  if (rc != KVDB_OK) {
    refused(rc, 1);
    return;
  }
  if (size != (r.prior != 0 ? KV_CTXSTATS_REC_BYTES_V2 : KV_CTXSTATS_REC_BYTES) ||
      r.tier < KVDB_TIER_SSD || r.tier >= KVDB_TIER_COUNT || !isfinite(r.freq) || r.freq < 0 ||
      (r.flags & KV_CTXS_PRIOR) != 0)
    abort();
  uint8_t buf[KV_CTXSTATS_REC_MAX];
  if (kv_ctxstats_encode(&r, buf) != size || memcmp(buf, data, size) != 0)
    abort();
  double f = kv_ctxstats_freq_at(&r, r.freq_ms + 3600000, 600000.0);
  if (!isfinite(f) || f < 0 || f > r.freq)
    abort();
}

static void settings(const uint8_t *data, size_t size)
{
  if (size != KV_PLACE_SET_BYTES) /* the catalog reads exactly this many bytes or refuses */
    return;
  kv_place_set s;
  kvdb_status rc = kv_place_set_decode(data, &s);
  if (rc != KVDB_OK) {
    refused(rc, 0);
    return;
  }
  kvdb_options o;
  memset(&o, 0, sizeof o);
  o.placement = s.rule;
  o.placement_alpha = s.alpha;
  o.freq_half_life_s = s.half_life_s;
  o.prefill_tokens_per_s = s.prefill_tps;
  if (s.rule == KVDB_PLACEMENT_OFF || kv_place_options_check(&o) != KVDB_OK)
    abort();
  uint8_t buf[KV_PLACE_SET_BYTES];
  kv_place_set_encode(&s, buf);
  if (memcmp(buf, data, size) != 0)
    abort();
}

static void figures(const uint8_t *data, size_t size)
{
  if (size != KV_PLACE_PERF_BYTES)
    return;
  uint64_t dev, ms;
  kv_tier_perf f;
  kvdb_status rc = kv_place_perf_decode(data, &dev, &f, &ms);
  if (rc != KVDB_OK) {
    refused(rc, 0);
    return;
  }
  if (!isfinite(f.read_bps) || !(f.read_bps > 0) || !isfinite(f.latency_s) || f.latency_s < 0)
    abort();
  uint8_t buf[KV_PLACE_PERF_BYTES];
  kv_place_perf_encode(dev, &f, ms, buf);
  if (memcmp(buf, data, size) != 0)
    abort();
}

static void counters(const uint8_t *data, size_t size)
{
  uint64_t stamp;
  kv_counts k;
  kvdb_status rc = kv_counts_decode(data, size, &stamp, &k);
  if (rc != KVDB_OK) {
    refused(rc, 0);
    return;
  }
  if (size != KV_COUNTS_BYTES)
    abort();
  uint8_t buf[KV_COUNTS_BYTES];
  kv_counts_encode(stamp, &k, buf);
  if (memcmp(buf, data, size) != 0)
    abort();
}

/* The prior record: accepted ones have 1..KV_PRIOR_MAX_ENTRIES entries, finite qualities and
 * bytes per token > 0, and encode back to the input. */
static void prior(const uint8_t *data, size_t size)
{
  static kv_profile_rec p;
  kvdb_status rc = kv_prior_rec_decode(data, size, &p);
  if (rc != KVDB_OK) {
    refused(rc, 1);
    return;
  }
  if (p.n_entries == 0 || p.n_entries > KV_PRIOR_MAX_ENTRIES ||
      size != kv_prior_rec_size(p.n_entries))
    abort();
  for (uint32_t i = 0; i < p.n_entries; i++)
    if (!isfinite(p.e[i].quality) || !(p.prior_bpt[i] > 0) || !isfinite(p.prior_bpt[i]))
      abort();
  uint8_t buf[KV_PRIOR_HDR + KV_PRIOR_ENT * KV_PRIOR_MAX_ENTRIES];
  kv_prior_rec_encode(&p, buf);
  if (memcmp(buf, data, size) != 0)
    abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
  if (size == 0)
    return 0;
  switch (data[0] % 5) {
  case 0:
    ctxstats(data + 1, size - 1);
    break;
  case 1:
    settings(data + 1, size - 1);
    break;
  case 2:
    figures(data + 1, size - 1);
    break;
  case 3:
    counters(data + 1, size - 1);
    break;
  default:
    prior(data + 1, size - 1);
    break;
  }
  return 0;
}
