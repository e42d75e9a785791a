/* SPDX-License-Identifier: MIT */
/*
 * tests/fuzz/fuzz_catalog.c — the catalog's record decoders (engine/catalog/catalog.c,
 * FORMAT.md §2) on untrusted bytes: LMDB hands the engine whatever bytes a value holds on disk.
 *
 * Every input goes to all five decoders (model, block, context, segment and profile record).
 * Must never crash or read outside the input. Properties (abort when broken):
 *   - a refusal is KVDB_CORRUPT or KVDB_VERSION (a newer record version) with a message;
 *   - an accepted record keeps the promises the engine relies on: tokens and block lists point
 *     inside the input and end exactly at its end; counts, tiers, states and alignments are in
 *     range;
 *   - encode(decode(x)) decodes to the same record, and encoding that gives the same bytes
 *     (every field survives a rewrite, which is what put, delete, compaction and re-encoding do
 *     to records they change).
 * Seeds: tests/fuzz/corpora/catalog/ (made by `fuzz_make_seeds DIR`, tests/fuzz/make_seeds.c).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <math.h>

#include "catalog/catalog.h"
#include "model/model.h"
#include "kvdb.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void refused(kvdb_status rc)
{
  if ((rc != KVDB_CORRUPT && rc != KVDB_VERSION) || kvdb_errmsg()[0] == 0)
    abort();
}

static void model(const uint8_t *data, size_t size)
{
  kv_model_rec r, r2;
  kvdb_status rc = kv_model_rec_decode(data, size, &r);
  if (rc != KVDB_OK) {
    refused(rc);
    return;
  }
  if (r.calib_bytes != 0 || r.gains_bytes != 0) { /* versions 3 and 4: the calibration
                                                     (kv_model_calib_decode), the output gains
                                                     (kv_model_gains_decode) */
    kv_calib c;
    kv_model_gains g;
    rc = kv_model_calib_decode(data, size, &c);
    if (rc != KVDB_OK) {
      refused(rc);
      return;
    }
    rc = kv_model_gains_decode(data, size, &g);
    if (rc != KVDB_OK) {
      refused(rc);
      kv_calib_free(&c);
      return;
    }
    if ((r.calib_bytes != 0) != (c.weight != NULL) || (r.gains_bytes != 0) != (g.g != NULL) ||
        (c.weight != NULL && (c.n_layers != r.n_layers || c.n_heads != r.n_kv_heads ||
                              c.head_dim != r.head_dim)) ||
        (g.g != NULL && (g.n_layers != r.n_layers || g.n_q_heads == 0 ||
                         g.n_q_heads % r.n_kv_heads != 0 ||
                         (g.channels != 1 && g.channels != r.head_dim))) ||
        kv_model_rec_full_size(&r, &c, &g) != size)
      abort();
    for (size_t i = 0; g.g != NULL && i < (size_t)g.n_layers * g.n_q_heads * g.channels; i++)
      if (!(g.g[i] >= 0.0f && isfinite(g.g[i]))) /* what the profile weighs by */
        abort();
    uint8_t *cb = malloc(size);
    if (cb == NULL)
      abort();
    kv_model_rec_encode_full(&r, &c, &g, cb); /* every field survives a rewrite, bit for bit */
    if (memcmp(cb, data, size) != 0)
      abort();
    uint32_t heads = c.n_layers * c.n_heads;
    for (int p = 0; p < KV_CALIB_N_PLANS; p++) /* what a writer will read */
      for (uint32_t h = 0; c.plan[p] != NULL && h < heads; h++) {
        kv_codec_params cp;
        kv_codec_params_init(&cp);
        if (!kv_calib_section_params(&c, p ? 2 : 4, h / c.n_heads, h % c.n_heads, 0, 16, 0,
                                     &cp) ||
            cp.bits < 1 || cp.bits > 7 || cp.group < 1 || cp.group > 16 ||
            cp.chan_weight != c.weight + (size_t)h * c.head_dim)
          abort();
      }
    free(cb);
    kv_calib_free(&c);
    kv_model_gains_free(&g);
    return;
  }
  uint8_t buf[64];
  if (size != kv_model_rec_size(&r))
    abort();
  kv_model_rec_encode(&r, buf);
  if (kv_model_rec_decode(buf, kv_model_rec_size(&r), &r2) != KVDB_OK ||
      r.rope_style != r2.rope_style || memcmp(&r.rope_base, &r2.rope_base, 4) != 0 ||
      memcmp(r.hash, r2.hash, 16) != 0 || r.n_layers != r2.n_layers ||
      r.n_kv_heads != r2.n_kv_heads || r.head_dim != r2.head_dim || r.dtype != r2.dtype ||
      r.block_tokens != r2.block_tokens)
    abort();
}

static void block(const uint8_t *data, size_t size)
{
  kv_block_rec r, r2;
  kvdb_status rc = kv_block_rec_decode(data, size, &r);
  if (rc != KVDB_OK) {
    refused(rc);
    return;
  }
  if (r.n_tokens < 1 || r.n_tokens > 4096 || r.tokens < data ||
      r.tokens + 4 * (size_t)r.n_tokens != data + size || size != kv_block_rec_size(r.n_tokens))
    abort();
  /* whole pages, or (a packed object: raw, format 7, or compressed, format 9; never with
   * score copies) 64-byte units */
  uint64_t unit = (r.bflags & KV_BLK_PACKED) ? 64u : KV_PAGE;
  if (r.tier >= KVDB_TIER_COUNT || r.refcount == 0 || r.bytes == 0 || r.offset % unit != 0 ||
      r.bytes % unit != 0 ||
      ((r.bflags & KV_BLK_PACKED) &&
       (r.bflags & (KV_BLK_SCORE8 | KV_BLK_SCORE4 | KV_BLK_SCOREV2)) != 0))
    abort();
  uint32_t sum = 0;
  for (uint32_t i = 0; i < r.n_tokens; i++)
    sum += kv_get_le32(r.tokens + 4 * i); /* as the lookup walk reads them */
  (void)sum;
  uint8_t *buf = malloc(kv_block_rec_size(r.n_tokens));
  if (buf == NULL)
    abort();
  kv_block_rec_encode(&r, NULL, buf);
  if (kv_block_rec_decode(buf, kv_block_rec_size(r.n_tokens), &r2) != KVDB_OK ||
      r.refcount != r2.refcount || r.tier != r2.tier || r.n_tokens != r2.n_tokens ||
      r.bflags != r2.bflags || r.method != r2.method || r.bits != r2.bits || r.drop != r2.drop ||
      r.keep_permille != r2.keep_permille ||
      r.segment != r2.segment || r.offset != r2.offset || r.bytes != r2.bytes ||
      memcmp(r.parent, r2.parent, 16) != 0 || memcmp(r.model, r2.model, 16) != 0 ||
      memcmp(r.tokens, r2.tokens, 4 * (size_t)r.n_tokens) != 0)
    abort();
  free(buf);
}

static void context(const uint8_t *data, size_t size)
{
  kv_ctx_rec r, r2;
  kvdb_status rc = kv_ctx_rec_decode(data, size, &r);
  if (rc != KVDB_OK) {
    refused(rc);
    return;
  }
  if (r.n_blocks == 0 || r.blocks < data || r.blocks + 16 * (size_t)r.n_blocks != data + size ||
      size != kv_ctx_rec_size(&r, r.n_blocks) || r.n_tokens < r.n_blocks ||
      r.n_tokens > (uint64_t)r.n_blocks * 4096 || (r.flags & ~(uint32_t)KV_CTX_EXPLICIT) != 0)
    abort();
  size_t len = kv_ctx_rec_size(&r, r.n_blocks);
  uint8_t *buf = malloc(len), *again = malloc(len);
  if (buf == NULL || again == NULL)
    abort();
  kv_ctx_rec_encode(&r, r.blocks, buf);
  uint8_t c1[KV_CONFIG_BYTES], c2[KV_CONFIG_BYTES];
  if (kv_ctx_rec_decode(buf, len, &r2) != KVDB_OK || kv_ctx_rec_size(&r2, r2.n_blocks) != len)
    abort();
  kv_config_encode(&r.config, c1);
  kv_config_encode(&r2.config, c2);
  kv_ctx_rec_encode(&r2, r2.blocks, again);
  if (r.flags != r2.flags || r.n_blocks != r2.n_blocks || r.n_tokens != r2.n_tokens ||
      r.bytes != r2.bytes || r.created_ms != r2.created_ms ||
      r.last_access_ms != r2.last_access_ms || memcmp(r.model, r2.model, 16) != 0 ||
      memcmp(c1, c2, sizeof c1) != 0 || memcmp(r.blocks, r2.blocks, 16 * (size_t)r.n_blocks) != 0 ||
      memcmp(buf, again, len) != 0)
    abort();
  free(buf);
  free(again);
}

static void segment(const uint8_t *data, size_t size)
{
  kv_seg_rec r, r2;
  kvdb_status rc = kv_seg_rec_decode(data, size, &r);
  if (rc != KVDB_OK) {
    refused(rc);
    return;
  }
  if (r.tier >= KVDB_TIER_COUNT || r.state > KV_SEG_SEALED || r.live_bytes > r.end ||
      r.end % KV_PAGE != 0)
    abort();
  uint8_t buf[64];
  kv_seg_rec_encode(&r, buf);
  if (kv_seg_rec_decode(buf, kv_seg_rec_size(), &r2) != KVDB_OK || r.tier != r2.tier ||
      r.state != r2.state || r.owner_pid != r2.owner_pid || r.end != r2.end ||
      r.live_bytes != r2.live_bytes || r.live_blocks != r2.live_blocks)
    abort();
}

static void profile(const uint8_t *data, size_t size)
{
  static kv_profile_rec r, r2; /* ~16 KiB each */
  kvdb_status rc = kv_profile_rec_decode(data, size, &r);
  if (rc != KVDB_OK) {
    refused(rc);
    return;
  }
  if (r.n_entries > KV_PROFILE_MAX_ENTRIES || size != kv_profile_rec_size(&r))
    abort();
  uint8_t *buf = malloc(size ? size : 1), *again = malloc(size ? size : 1);
  if (buf == NULL || again == NULL)
    abort();
  kv_profile_rec_encode(&r, buf);
  if (kv_profile_rec_decode(buf, size, &r2) != KVDB_OK || r2.n_entries != r.n_entries ||
      r2.n_probes != r.n_probes || r2.measured_ms != r.measured_ms)
    abort();
  kv_profile_rec_encode(&r2, again);
  if (memcmp(buf, again, size) != 0)
    abort();
  free(buf);
  free(again);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
  /* exact-size copies, so a read one byte past the record is caught by ASan */
  uint8_t *copy = malloc(size ? size : 1);
  if (copy == NULL)
    return 0;
  memcpy(copy, data, size);
  model(copy, size);
  block(copy, size);
  context(copy, size);
  segment(copy, size);
  profile(copy, size);
  free(copy);
  return 0;
}
