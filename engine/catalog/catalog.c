/* SPDX-License-Identifier: MIT */
/*
 * engine/catalog/catalog.c — LMDB environment, record codecs (FORMAT.md §2).
 */
#define _GNU_SOURCE
#define KV_CATALOG_IMPL /* the real mdb_txn_* here (catalog.h routes the engine's through us) */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <xxhash.h>

#include "catalog_int.h"
#include "model/model.h"

/* ---- record codecs ---------------------------------------------------------------------- */

#define KV_MODEL_REC_VERSION 4u /* version 2: the model's RoPE (byte 3, bytes 36..39); version 3:
                                   a calibration after byte 40 (kvdb_model_calibrate); version 4:
                                   output gains after it (kvdb_model_set_output_gains) */

static int model_rec_v2(const kv_model_rec *r)
{
  return r->rope_style != 0 || r->rope_base != 0.0f;
}

size_t kv_model_rec_size(const kv_model_rec *r)
{
  return model_rec_v2(r) ? 40 : 36;
}

void kv_model_rec_encode(const kv_model_rec *r, uint8_t *dst)
{
  memset(dst, 0, kv_model_rec_size(r));
  dst[0] = model_rec_v2(r) ? 2 : 1; /* a model without RoPE stays readable by format 3 */
  if (model_rec_v2(r)) {
    uint32_t b;
    memcpy(&b, &r->rope_base, 4);
    dst[3] = (uint8_t)r->rope_style;
    kv_put_le32(dst + 36, b);
  }
  dst[1] = (uint8_t)r->dtype;
  dst[2] = (uint8_t)r->score_bits;
  kv_put_le32(dst + 4, r->n_layers);
  kv_put_le32(dst + 8, r->n_kv_heads);
  kv_put_le32(dst + 12, r->head_dim);
  kv_put_le32(dst + 16, r->block_tokens);
  memcpy(dst + 20, r->hash, 16);
}

kvdb_status kv_rec_version_max(const uint8_t *src, size_t len, size_t min, const char *what,
                               unsigned max)
{
  if (len < min)
    return kv_fail(KVDB_CORRUPT, "%s record truncated: %zu bytes, at least %zu expected", what,
                   len, min);
  if (src[0] > max)
    return kv_fail(KVDB_VERSION, "%s record version %u is newer than %u", what, src[0], max);
  if (src[0] == 0)
    return kv_fail(KVDB_CORRUPT, "%s record version 0", what);
  return KVDB_OK;
}

static kvdb_status rec_version(const uint8_t *src, size_t len, size_t min, const char *what)
{
  if (len < min)
    return kv_fail(KVDB_CORRUPT, "%s record truncated: %zu bytes, at least %zu expected", what,
                   len, min);
  if (src[0] > KV_REC_VERSION)
    return kv_fail(KVDB_VERSION, "%s record version %u is newer than %u", what, src[0],
                   KV_REC_VERSION);
  if (src[0] == 0)
    return kv_fail(KVDB_CORRUPT, "%s record version 0", what);
  return KVDB_OK;
}

/* Version 3 (FORMAT.md §2): bytes 0..39 as version 2 (RoPE optional: style and base 0 when not
 * given), then the calibration: u32 its bytes C (from byte 40 to the end), u8 calibration
 * version 1, u8 plans (bit p: plan p present), u16 0, u32 contexts, u32 probes, f32 budget x 2,
 * f32 weights [heads][head_dim], per present plan [heads] x (u8 K bits, u8 V bits, u16 K group,
 * u16 V group), u64 XXH3-64 of every byte before it (the whole record). */
#define CAL_HEAD 24u /* C .. budgets */
#define CAL_OPT 6u

static uint64_t calib_len(uint32_t heads, uint32_t d, unsigned plans)
{
  uint64_t n = CAL_HEAD + 4ull * heads * d + 8;
  for (unsigned p = 0; p < KV_CALIB_N_PLANS; p++)
    if (plans & (1u << p))
      n += (uint64_t)CAL_OPT * heads;
  return n;
}

static unsigned calib_plans(const kv_calib *c)
{
  unsigned m = 0;
  for (unsigned p = 0; p < KV_CALIB_N_PLANS; p++)
    m |= c->plan[p] != NULL ? 1u << p : 0;
  return m;
}

size_t kv_model_rec_calib_size(const kv_model_rec *r, const kv_calib *c)
{
  return 40 + (size_t)calib_len(r->n_layers * r->n_kv_heads, r->head_dim, calib_plans(c));
}

static void encode_calib(const kv_model_rec *r, const kv_calib *c, uint8_t *dst, uint8_t ver);

void kv_model_rec_encode_calib(const kv_model_rec *r, const kv_calib *c, uint8_t *dst)
{
  encode_calib(r, c, dst, 3);
}

/* Version 3's bytes, stamped version ver (4: gains follow) before the checksum. */
static void encode_calib(const kv_model_rec *r, const kv_calib *c, uint8_t *dst, uint8_t ver)
{
  uint32_t heads = r->n_layers * r->n_kv_heads, d = r->head_dim;
  size_t n = kv_model_rec_calib_size(r, c);
  memset(dst, 0, n);
  kv_model_rec base = *r;
  base.rope_base = 1.0f; /* encode as version 2, then restamp */
  base.rope_style = 1;
  kv_model_rec_encode(&base, dst);
  dst[0] = ver;
  dst[3] = (uint8_t)r->rope_style;
  uint32_t b;
  memcpy(&b, &r->rope_base, 4);
  kv_put_le32(dst + 36, b);
  uint8_t *p = dst + 40;
  kv_put_le32(p, (uint32_t)(n - 40));
  p[4] = 1;
  p[5] = (uint8_t)calib_plans(c);
  kv_put_le32(p + 8, c->n_contexts);
  kv_put_le32(p + 12, c->n_probes);
  for (int i = 0; i < KV_CALIB_N_PLANS; i++) {
    float f = c->plan[i] != NULL ? c->budget[i] : 0.0f;
    memcpy(&b, &f, 4);
    kv_put_le32(p + 16 + 4 * i, b);
  }
  p += CAL_HEAD;
  for (size_t i = 0; i < (size_t)heads * d; i++, p += 4) {
    memcpy(&b, &c->weight[i], 4);
    kv_put_le32(p, b);
  }
  for (int i = 0; i < KV_CALIB_N_PLANS; i++)
    for (uint32_t h = 0; c->plan[i] != NULL && h < heads; h++, p += CAL_OPT) {
      p[0] = c->plan[i][h].kb;
      p[1] = c->plan[i][h].vb;
      kv_put_le16(p + 2, c->plan[i][h].kg);
      kv_put_le16(p + 4, c->plan[i][h].vg);
    }
  kv_put_le64(p, XXH3_64bits(dst, n - 8));
}

kvdb_status kv_model_calib_decode(const uint8_t *src, size_t len, kv_calib *out)
{
  memset(out, 0, sizeof *out);
  kv_model_rec r = {0}; /* zeroed: gcc -O3 cannot see that the decode sets every field */
  KV_RET(kv_model_rec_decode(src, len, &r));
  if (r.calib_bytes == 0)
    return KVDB_OK;
  const uint8_t *p = src + 40;
  uint32_t heads = r.n_layers * r.n_kv_heads, d = r.head_dim;
  unsigned plans = p[5];
  size_t end = 40 + (size_t)r.calib_bytes; /* the record's end before version 4 */
  if (kv_get_le64(src + end - 8) != XXH3_64bits(src, end - 8))
    return kv_fail(KVDB_CORRUPT, "model record: the calibration's checksum does not match");
  if (p[4] != 1 || (plans & ~3u) != 0 || p[6] != 0 || p[7] != 0 || r.n_layers == 0 ||
      r.n_layers > 1024 || r.n_kv_heads == 0 || r.n_kv_heads > 1024 || d == 0 || d > 4096 ||
      calib_len(heads, d, plans) != r.calib_bytes)
    return kv_fail(KVDB_CORRUPT, "model record: calibration version %u, plans %#x, %u bytes for "
                                 "%u heads of %u",
                   p[4], plans, r.calib_bytes, heads, d);
  out->n_layers = r.n_layers;
  out->n_heads = r.n_kv_heads;
  out->head_dim = d;
  out->n_contexts = kv_get_le32(p + 8);
  out->n_probes = kv_get_le32(p + 12);
  out->weight = malloc((size_t)heads * d * sizeof(float));
  for (int i = 0; i < KV_CALIB_N_PLANS; i++)
    if (plans & (1u << i))
      out->plan[i] = malloc((size_t)heads * sizeof(kv_calib_opt));
  if (out->weight == NULL || ((plans & 1) && !out->plan[0]) || ((plans & 2) && !out->plan[1])) {
    kv_calib_free(out);
    return kv_fail(KVDB_NOMEM, "model calibration of %u heads", heads);
  }
  kvdb_status rc = KVDB_OK;
  for (int i = 0; i < KV_CALIB_N_PLANS; i++) {
    uint32_t b = kv_get_le32(p + 16 + 4 * i);
    memcpy(&out->budget[i], &b, 4);
    if ((plans & (1u << i)) ? !(out->budget[i] > 0.0f && out->budget[i] <= 16.0f) : b != 0)
      rc = KVDB_CORRUPT;
  }
  p += CAL_HEAD;
  for (size_t i = 0; i < (size_t)heads * d; i++, p += 4) {
    uint32_t b = kv_get_le32(p);
    memcpy(&out->weight[i], &b, 4);
    if (!(out->weight[i] >= 0.0f && out->weight[i] <= 1e30f)) /* NaN too */
      rc = KVDB_CORRUPT;
  }
  for (int i = 0; i < KV_CALIB_N_PLANS; i++)
    for (uint32_t h = 0; out->plan[i] != NULL && h < heads; h++, p += CAL_OPT) {
      kv_calib_opt *o = &out->plan[i][h];
      o->kb = p[0];
      o->vb = p[1];
      o->kg = kv_get_le16(p + 2);
      o->vg = kv_get_le16(p + 4);
      if (o->kb < 1 || o->kb > 7 || o->vb < 1 || o->vb > 7 || o->kg == 0 || o->vg == 0 ||
          o->kg > 4096 || o->vg > 4096)
        rc = KVDB_CORRUPT;
    }
  if (rc != KVDB_OK) {
    kv_calib_free(out);
    return kv_fail(KVDB_CORRUPT, "model record: the calibration holds values out of range");
  }
  return KVDB_OK;
}

/* Version 4 (FORMAT.md §2): bytes 0..39 as version 3, then at byte 40 the calibration of
 * version 3 (C >= 32 bytes, its checksum over bytes 0 .. 40 + C - 8) or a u32 0 (C = 0, none:
 * 4 bytes), then the output gains block of G bytes: u32 G, u8 gains version 1, u8 0, u16 0,
 * u32 query heads Q, u32 channels (1 or head_dim), f32 gains [n_layers][Q][channels], u64
 * XXH3-64 of the gains block's bytes before it, seeded with XXH3-64 of bytes 0..39 (so a
 * damaged calibration and damaged gains are told apart). */
#define GAINS_HEAD 16u

static uint64_t gains_len(uint32_t layers, uint32_t q, uint32_t ch)
{
  return GAINS_HEAD + 4ull * layers * q * ch + 8;
}

static int has_gains(const kv_model_gains *g)
{
  return g != NULL && g->g != NULL;
}

size_t kv_model_rec_full_size(const kv_model_rec *r, const kv_calib *c, const kv_model_gains *g)
{
  int cal = c != NULL && c->weight != NULL;
  if (!has_gains(g))
    return cal ? kv_model_rec_calib_size(r, c) : kv_model_rec_size(r);
  size_t n = cal ? kv_model_rec_calib_size(r, c) : 44;
  return n + (size_t)gains_len(r->n_layers, g->n_q_heads, g->channels);
}

void kv_model_rec_encode_full(const kv_model_rec *r, const kv_calib *c, const kv_model_gains *g,
                              uint8_t *dst)
{
  int cal = c != NULL && c->weight != NULL;
  if (!has_gains(g)) {
    if (cal)
      kv_model_rec_encode_calib(r, c, dst);
    else
      kv_model_rec_encode(r, dst);
    return;
  }
  size_t n = kv_model_rec_full_size(r, c, g), at;
  memset(dst, 0, n);
  if (cal) {
    encode_calib(r, c, dst, 4);
    at = kv_model_rec_calib_size(r, c);
  } else {
    kv_model_rec base = *r; /* encode as version 2, then restamp (as version 3 does) */
    base.rope_base = 1.0f;
    base.rope_style = 1;
    kv_model_rec_encode(&base, dst);
    dst[3] = (uint8_t)r->rope_style;
    uint32_t b;
    memcpy(&b, &r->rope_base, 4);
    kv_put_le32(dst + 36, b);
    kv_put_le32(dst + 40, 0);
    at = 44;
  }
  dst[0] = 4;
  uint8_t *p = dst + at;
  kv_put_le32(p, (uint32_t)(n - at));
  p[4] = 1;
  kv_put_le32(p + 8, g->n_q_heads);
  kv_put_le32(p + 12, g->channels);
  size_t cnt = (size_t)r->n_layers * g->n_q_heads * g->channels;
  for (size_t i = 0; i < cnt; i++) {
    uint32_t b;
    memcpy(&b, &g->g[i], 4);
    kv_put_le32(p + GAINS_HEAD + 4 * i, b);
  }
  size_t body = n - at - 8;
  kv_put_le64(p + body, XXH3_64bits_withSeed(p, body, XXH3_64bits(dst, 40)));
}

void kv_model_gains_free(kv_model_gains *g)
{
  if (g == NULL)
    return;
  free(g->g);
  memset(g, 0, sizeof *g);
}

kvdb_status kv_model_gains_decode(const uint8_t *src, size_t len, kv_model_gains *out)
{
  memset(out, 0, sizeof *out);
  kv_model_rec r = {0};
  KV_RET(kv_model_rec_decode(src, len, &r));
  if (r.gains_bytes == 0)
    return KVDB_OK;
  const uint8_t *p = src + len - r.gains_bytes;
  size_t body = r.gains_bytes - 8;
  if (kv_get_le64(p + body) != XXH3_64bits_withSeed(p, body, XXH3_64bits(src, 40)))
    return kv_fail(KVDB_CORRUPT, "model record: the output gains' checksum does not match");
  uint32_t q = kv_get_le32(p + 8), ch = kv_get_le32(p + 12);
  if (p[4] != 1 || p[5] != 0 || kv_get_le16(p + 6) != 0 || r.n_layers == 0 ||
      r.n_layers > 1024 || r.n_kv_heads == 0 || q == 0 || q > 65536 || q % r.n_kv_heads != 0 ||
      (ch != 1 && ch != r.head_dim) || gains_len(r.n_layers, q, ch) != r.gains_bytes)
    return kv_fail(KVDB_CORRUPT, "model record: output gains version %u, %u query heads of %u "
                                 "channels in %u bytes (%u layers, %u KV heads of %u)",
                   p[4], q, ch, r.gains_bytes, r.n_layers, r.n_kv_heads, r.head_dim);
  size_t cnt = (size_t)r.n_layers * q * ch;
  out->g = malloc(cnt * sizeof(float));
  if (out->g == NULL)
    return kv_fail(KVDB_NOMEM, "output gains of %zu floats", cnt);
  out->n_layers = r.n_layers;
  out->n_q_heads = q;
  out->channels = ch;
  for (size_t i = 0; i < cnt; i++) {
    uint32_t b = kv_get_le32(p + GAINS_HEAD + 4 * i);
    memcpy(&out->g[i], &b, 4);
    if (!(out->g[i] >= 0.0f && out->g[i] <= 3.0e38f)) { /* NaN and inf too */
      double bad = out->g[i];
      kv_model_gains_free(out);
      return kv_fail(KVDB_CORRUPT, "model record: output gain %zu is %g", i, bad);
    }
  }
  return KVDB_OK;
}

kvdb_status kv_model_rec_decode(const uint8_t *src, size_t len, kv_model_rec *r)
{
  KV_RET(kv_rec_version_max(src, len, 36, "model", KV_MODEL_REC_VERSION));
  size_t want = src[0] >= 2 ? 40 : 36;
  r->calib_bytes = 0;
  r->gains_bytes = 0;
  if (src[0] == 3 && len >= 44 + 8) {
    r->calib_bytes = kv_get_le32(src + 40);
    want = 40 + (size_t)r->calib_bytes;
  }
  int bad4 = 0;
  if (src[0] == 4) {
    bad4 = 1;
    if (len >= 44) {
      r->calib_bytes = kv_get_le32(src + 40);
      uint64_t at = 40 + (r->calib_bytes ? (uint64_t)r->calib_bytes : 4);
      if (at + 4 <= len) {
        r->gains_bytes = kv_get_le32(src + at);
        want = (size_t)(at + r->gains_bytes);
        bad4 = (r->calib_bytes != 0 && r->calib_bytes < CAL_HEAD + 8) ||
               r->gains_bytes < GAINS_HEAD + 8 || at + r->gains_bytes > len;
      }
    }
  }
  if (bad4 || len != want || (src[0] == 3 && r->calib_bytes < CAL_HEAD + 8))
    return kv_fail(KVDB_CORRUPT, "model record version %u is %zu bytes, not %zu", src[0], len,
                   want);
  r->dtype = src[1];
  r->score_bits = src[2]; /* reserved (0) before format 3 */
  r->rope_style = src[3]; /* version 2; reserved (0) in version 1 */
  r->rope_base = 0.0f;
  if (src[0] >= 2) {
    uint32_t b = kv_get_le32(src + 36);
    memcpy(&r->rope_base, &b, 4);
  }
  int rope_ok = (r->rope_style == 1 || r->rope_style == 2) && r->rope_base > 1.0f &&
                r->rope_base <= 1e9f;
  if ((r->score_bits != 0 && r->score_bits != 8 && r->score_bits != 4) ||
      (src[0] == 1 && src[3] != 0) || (src[0] == 2 && !rope_ok) ||
      (src[0] >= 3 && !rope_ok && !(r->rope_style == 0 && r->rope_base == 0.0f)))
    return kv_fail(KVDB_CORRUPT, "model record (version %u) has score bits %u, RoPE style %u "
                                 "and base %g",
                   src[0], src[2], src[3], (double)r->rope_base);
  r->n_layers = kv_get_le32(src + 4);
  r->n_kv_heads = kv_get_le32(src + 8);
  r->head_dim = kv_get_le32(src + 12);
  r->block_tokens = kv_get_le32(src + 16);
  memcpy(r->hash, src + 20, 16);
  return KVDB_OK;
}

size_t kv_block_rec_size(uint32_t n_tokens)
{
  return 72 + 4 * (size_t)n_tokens;
}

void kv_block_rec_encode(const kv_block_rec *r, const uint32_t *tokens, uint8_t *dst)
{
  memset(dst, 0, 72);
  dst[0] = KV_REC_VERSION;
  dst[1] = (uint8_t)r->tier;
  dst[2] = (uint8_t)r->bflags;
  dst[3] = r->method;
  kv_put_le32(dst + 4, r->refcount);
  kv_put_le32(dst + 8, r->n_tokens);
  dst[12] = r->bits;
  dst[13] = r->drop;
  kv_put_le16(dst + 14, r->keep_permille);
  kv_put_le64(dst + 16, r->segment);
  kv_put_le64(dst + 24, r->offset);
  kv_put_le64(dst + 32, r->bytes);
  memcpy(dst + 40, r->parent, 16);
  memcpy(dst + 56, r->model, 16);
  if (tokens != NULL) {
    for (uint32_t i = 0; i < r->n_tokens; i++)
      kv_put_le32(dst + 72 + 4 * i, tokens[i]);
  } else {
    memcpy(dst + 72, r->tokens, 4 * (size_t)r->n_tokens);
  }
}

kvdb_status kv_block_rec_decode(const uint8_t *src, size_t len, kv_block_rec *r)
{
  KV_RET(rec_version(src, len, 72, "block"));
  r->tier = src[1];
  r->bflags = src[2];
  r->method = src[3];
  r->refcount = kv_get_le32(src + 4);
  r->n_tokens = kv_get_le32(src + 8);
  r->bits = src[12];
  r->drop = src[13];
  r->keep_permille = kv_get_le16(src + 14);
  r->segment = kv_get_le64(src + 16);
  r->offset = kv_get_le64(src + 24);
  r->bytes = kv_get_le64(src + 32);
  memcpy(r->parent, src + 40, 16);
  memcpy(r->model, src + 56, 16);
  r->tokens = src + 72;
  if (r->n_tokens == 0 || r->n_tokens > 4096 || len != kv_block_rec_size(r->n_tokens))
    return kv_fail(KVDB_CORRUPT, "block record of %zu bytes claims %u tokens", len, r->n_tokens);
  /* a packed object (flag bit 5, format 7) is 64-byte aligned; every other one whole pages */
  uint64_t align = (r->bflags & KV_BLK_PACKED) ? 64u : KV_PAGE;
  if (r->tier >= KVDB_TIER_COUNT || r->refcount == 0 || r->bytes == 0 ||
      r->offset % align != 0 || r->bytes % align != 0)
    return kv_fail(KVDB_CORRUPT, "block record has tier %u, refcount %u, offset %llu, bytes %llu",
                   r->tier, r->refcount, (unsigned long long)r->offset,
                   (unsigned long long)r->bytes);
  /* bytes 2, 3, 12..15 were reserved (0 = raw) in format 1: how the block is stored */
  int compressed = (r->bflags & KV_BLK_COMPRESSED) != 0, drops = (r->bflags & KV_BLK_DROPS) != 0;
  if ((r->bflags & ~127u) != 0 || (r->bflags & 12u) == 12u ||
      ((r->bflags & KV_BLK_KEPTN) &&
       (!drops || r->keep_permille == 0 || r->keep_permille > r->n_tokens)) ||
      ((r->bflags & KV_BLK_PACKED) &&
       (r->bflags & (uint32_t)(KV_BLK_SCORE8 | KV_BLK_SCORE4 | KV_BLK_SCOREV2)) != 0) ||
      ((r->bflags & KV_BLK_SCOREV2) && !(r->bflags & 12u)) || r->method > KVDB_METHOD_DROP ||
      compressed != (r->method != KVDB_METHOD_RAW) || drops != (r->method == KVDB_METHOD_DROP) ||
      (r->method == KVDB_METHOD_RAW && (r->bits || r->drop || r->keep_permille)))
    return kv_fail(KVDB_CORRUPT, "block record says flags %u, method %u, bits %u, drop %u",
                   r->bflags, r->method, r->bits, r->drop);
  return KVDB_OK;
}

uint32_t kv_block_rec_kept(const kv_block_rec *r)
{
  if (!(r->bflags & KV_BLK_DROPS))
    return r->n_tokens;
  if (r->bflags & KV_BLK_KEPTN)
    return r->keep_permille;
  /* formats 2-7: ceil(n * permille / 1000), at least 1 (compress/'s kv_drop_keep_count) */
  if (r->keep_permille == 0 || r->keep_permille > 1000)
    return 0;
  uint64_t k = ((uint64_t)r->n_tokens * r->keep_permille + 999) / 1000;
  return k < 1 ? 1 : (uint32_t)k;
}

static int ctx_rec_v2(const kv_ctx_rec *r)
{
  return r->config.method != KVDB_METHOD_RAW || r->has_stats;
}

#define CTX_STATS_BYTES 40u /* version 3: flags u8, tier u8, 6 reserved, freq f64, freq_ms,
                               accesses, prior u64 */

static size_t ctx_rec_head(const kv_ctx_rec *r)
{
  return r->has_stats ? 56 + KV_CONFIG_BYTES + CTX_STATS_BYTES
                      : ctx_rec_v2(r) ? 56 + KV_CONFIG_BYTES : 56;
}

size_t kv_ctx_rec_size(const kv_ctx_rec *r, uint32_t n_blocks)
{
  return ctx_rec_head(r) + 16 * (size_t)n_blocks;
}

void kv_ctx_rec_encode(const kv_ctx_rec *r, const uint8_t *blocks, uint8_t *dst)
{
  size_t head = ctx_rec_head(r);
  memmove(dst + head, blocks, 16 * (size_t)r->n_blocks); /* blocks may point into dst */
  memset(dst, 0, head);
  dst[0] = r->has_stats ? 3 : ctx_rec_v2(r) ? 2 : 1;
  dst[1] = (uint8_t)r->flags;
  kv_put_le32(dst + 4, r->n_blocks);
  kv_put_le64(dst + 8, r->n_tokens);
  kv_put_le64(dst + 16, r->bytes);
  kv_put_le64(dst + 24, r->created_ms);
  kv_put_le64(dst + 32, r->last_access_ms);
  memcpy(dst + 40, r->model, 16);
  if (ctx_rec_v2(r))
    kv_config_encode(&r->config, dst + 56);
  if (r->has_stats) {
    uint8_t *p = dst + 56 + KV_CONFIG_BYTES;
    const kv_ctxstats *cs = &r->stats;
    uint32_t fl = cs->flags & (uint32_t)KV_CTXS_CACHED;
    p[0] = (uint8_t)(cs->prior != 0 ? fl | KV_CTXS_PRIOR : fl);
    p[1] = (uint8_t)cs->tier;
    kv_put_lef64(p + 8, cs->freq);
    kv_put_le64(p + 16, cs->freq_ms);
    kv_put_le64(p + 24, cs->accesses);
    kv_put_le64(p + 32, cs->prior);
  }
}

kvdb_status kv_ctx_rec_decode(const uint8_t *src, size_t len, kv_ctx_rec *r)
{
  KV_RET(kv_rec_version_max(src, len, 56, "context", KV_CTX_REC_VERSION));
  size_t head = src[0] >= 3 ? 56 + KV_CONFIG_BYTES + CTX_STATS_BYTES
                            : src[0] >= 2 ? 56 + KV_CONFIG_BYTES : 56;
  if (len < head)
    return kv_fail(KVDB_CORRUPT, "context record truncated: %zu bytes", len);
  r->flags = src[1];
  r->n_blocks = kv_get_le32(src + 4);
  r->n_tokens = kv_get_le64(src + 8);
  r->bytes = kv_get_le64(src + 16);
  r->created_ms = kv_get_le64(src + 24);
  r->last_access_ms = kv_get_le64(src + 32);
  memcpy(r->model, src + 40, 16);
  memset(&r->config, 0, sizeof r->config);
  r->has_stats = 0;
  memset(&r->stats, 0, sizeof r->stats);
  if (src[0] >= 2) {
    KV_RET(kv_config_decode(src + 56, &r->config));
    if (src[0] == 2 && r->config.method == KVDB_METHOD_RAW)
      return kv_fail(KVDB_CORRUPT, "context record version 2 with a raw config");
  }
  if (src[0] >= 3) {
    const uint8_t *p = src + 56 + KV_CONFIG_BYTES;
    kv_ctxstats *cs = &r->stats;
    r->has_stats = 1;
    cs->flags = p[0];
    cs->tier = p[1];
    cs->freq = kv_get_lef64(p + 8);
    cs->freq_ms = kv_get_le64(p + 16);
    cs->accesses = kv_get_le64(p + 24);
    cs->prior = kv_get_le64(p + 32);
    int reserved = p[2] != 0 || p[3] != 0 || kv_get_le32(p + 4) != 0;
    if ((cs->flags & ~(uint32_t)(KV_CTXS_CACHED | KV_CTXS_PRIOR)) != 0 || reserved ||
        ((cs->flags & KV_CTXS_PRIOR) != 0) != (cs->prior != 0) || cs->tier < KVDB_TIER_SSD ||
        cs->tier >= KVDB_TIER_COUNT || !isfinite(cs->freq) || cs->freq < 0)
      return kv_fail(KVDB_CORRUPT, "context record's statistics: flags %u, tier %u, "
                     "frequency %g", cs->flags, cs->tier, cs->freq);
    cs->flags &= ~(uint32_t)KV_CTXS_PRIOR;
  }
  r->blocks = src + head;
  if (r->n_blocks == 0 || len != head + 16 * (size_t)r->n_blocks ||
      r->n_tokens > (uint64_t)r->n_blocks * 4096 || r->n_tokens < r->n_blocks ||
      (r->flags & ~(uint32_t)KV_CTX_EXPLICIT) != 0)
    return kv_fail(KVDB_CORRUPT, "context record of %zu bytes claims %u blocks, %llu tokens", len,
                   r->n_blocks, (unsigned long long)r->n_tokens);
  return KVDB_OK;
}

/* ---- profile record: 16-byte header, 56 bytes per entry (version 1); version 2 (a profile
 * measured with output gains: some entry has KVDB_PROFILE_WEIGHTED, flag bit 3) 72 bytes per
 * entry: f64 cosine at 56 and f64 worst_head at 64 ---- */

#define PROF_HDR 16
#define PROF_ENT 56
#define PROF_ENT2 72

static unsigned profile_version(const kv_profile_rec *r)
{
  if (r->version >= 2)
    return 2;
  for (uint32_t i = 0; i < r->n_entries; i++)
    if (r->e[i].flags & KVDB_PROFILE_WEIGHTED)
      return 2;
  return 1;
}

size_t kv_profile_rec_size(const kv_profile_rec *r)
{
  return PROF_HDR + (profile_version(r) == 2 ? PROF_ENT2 : PROF_ENT) * (size_t)r->n_entries;
}

void kv_profile_rec_encode(const kv_profile_rec *r, uint8_t *dst)
{
  unsigned ver = profile_version(r);
  size_t ent = ver == 2 ? PROF_ENT2 : PROF_ENT;
  memset(dst, 0, kv_profile_rec_size(r));
  dst[0] = (uint8_t)ver;
  kv_put_le16(dst + 2, (uint16_t)r->n_entries);
  kv_put_le32(dst + 4, r->n_probes);
  kv_put_le64(dst + 8, r->measured_ms);
  for (uint32_t i = 0; i < r->n_entries; i++) {
    uint8_t *p = dst + PROF_HDR + ent * i;
    const kvdb_profile_entry *e = &r->e[i];
    if (ver == 2) {
      kv_put_lef64(p + 56, e->cosine);
      kv_put_lef64(p + 64, e->worst_head);
    }
    kv_config_encode(&e->config, p);
    kv_put_le32(p + 12, e->flags);
    kv_put_le64(p + 16, e->bytes);
    kv_put_lef64(p + 24, e->quality);
    kv_put_lef64(p + 32, e->rel_l2);
    kv_put_lef64(p + 40, e->reported_quality);
    kv_put_le32(p + 48, e->n_reports);
  }
}

kvdb_status kv_profile_rec_decode(const uint8_t *src, size_t len, kv_profile_rec *r)
{
  KV_RET(kv_rec_version_max(src, len, PROF_HDR, "profile", KV_PROFILE_REC_VERSION));
  r->version = src[0];
  r->n_entries = kv_get_le16(src + 2);
  r->n_probes = kv_get_le32(src + 4);
  r->measured_ms = kv_get_le64(src + 8);
  size_t ent = r->version == 2 ? PROF_ENT2 : PROF_ENT;
  if (src[1] != 0 || r->n_entries > KV_PROFILE_MAX_ENTRIES ||
      len != PROF_HDR + ent * (size_t)r->n_entries)
    return kv_fail(KVDB_CORRUPT, "profile record of %zu bytes claims %u entries", len,
                   r->n_entries);
  for (uint32_t i = 0; i < r->n_entries; i++) {
    const uint8_t *p = src + PROF_HDR + ent * i;
    kvdb_profile_entry *e = &r->e[i];
    memset(e, 0, sizeof *e);
    KV_RET(kv_config_decode(p, &e->config));
    e->flags = kv_get_le32(p + 12);
    e->bytes = kv_get_le64(p + 16);
    e->quality = kv_get_lef64(p + 24);
    e->rel_l2 = kv_get_lef64(p + 32);
    e->reported_quality = kv_get_lef64(p + 40);
    e->n_reports = kv_get_le32(p + 48);
    e->n_probes = r->n_probes;
    e->cosine = r->version == 2 ? kv_get_lef64(p + 56) : e->quality;
    e->worst_head = r->version == 2 ? kv_get_lef64(p + 64) : NAN;
    /* bit 2: format 3; bit 3: version 2 */
    if ((e->flags & (r->version == 2 ? ~15u : ~7u)) != 0 || kv_get_le32(p + 52) != 0)
      return kv_fail(KVDB_CORRUPT, "profile entry %u has flags %u", i, e->flags);
  }
  return KVDB_OK;
}

size_t kv_seg_rec_size(void)
{
  return 32;
}

void kv_seg_rec_encode(const kv_seg_rec *r, uint8_t *dst)
{
  memset(dst, 0, 32);
  dst[0] = KV_REC_VERSION;
  dst[1] = (uint8_t)r->tier;
  dst[2] = (uint8_t)r->state;
  kv_put_le32(dst + 4, r->owner_pid);
  kv_put_le64(dst + 8, r->end);
  kv_put_le64(dst + 16, r->live_bytes);
  kv_put_le64(dst + 24, r->live_blocks);
}

kvdb_status kv_seg_rec_decode(const uint8_t *src, size_t len, kv_seg_rec *r)
{
  KV_RET(rec_version(src, len, 32, "segment"));
  if (len != 32)
    return kv_fail(KVDB_CORRUPT, "segment record is %zu bytes, not 32", len);
  r->tier = src[1];
  r->state = src[2];
  r->owner_pid = kv_get_le32(src + 4);
  r->end = kv_get_le64(src + 8);
  r->live_bytes = kv_get_le64(src + 16);
  r->live_blocks = kv_get_le64(src + 24);
  if (r->tier >= KVDB_TIER_COUNT || r->state > KV_SEG_SEALED || r->live_bytes > r->end ||
      r->end % KV_PAGE != 0)
    return kv_fail(KVDB_CORRUPT, "segment record has tier %u, state %u, end %llu, live %llu",
                   r->tier, r->state, (unsigned long long)r->end,
                   (unsigned long long)r->live_bytes);
  return KVDB_OK;
}

/* ---- environment ------------------------------------------------------------------------ */

static _Atomic unsigned map_full_events;

unsigned kv_cat_map_full_events(void)
{
  return atomic_load(&map_full_events);
}

kvdb_status kv_mdb_fail(int mrc, const char *what)
{
  kvdb_status st;
  switch (mrc) {
  case MDB_NOTFOUND:
    return KVDB_NOTFOUND;
  case MDB_MAP_FULL:
    atomic_fetch_add(&map_full_events, 1);
    return kv_fail(KVDB_FULL, "catalog: %s: %s (the map grows before the next write: retry)",
                   what, mdb_strerror(mrc));
  case ENOSPC:
    st = KVDB_FULL;
    break;
  case ENOMEM:
    st = KVDB_NOMEM;
    break;
  case EACCES:
  case EROFS:
    st = KVDB_READONLY;
    break;
  case MDB_CORRUPTED:
  case MDB_PAGE_NOTFOUND:
  case MDB_INVALID:
    st = KVDB_CORRUPT;
    break;
  case MDB_VERSION_MISMATCH:
    st = KVDB_VERSION;
    break;
  case MDB_READERS_FULL:
    st = KVDB_BUSY;
    break;
  default:
    st = KVDB_IOERR;
  }
  return kv_fail(st, "catalog: %s: %s", what, mdb_strerror(mrc));
}

kvdb_status kv_cursor_open(MDB_txn *txn, MDB_dbi dbi, MDB_cursor **cur, const char *what)
{
  int mrc = mdb_cursor_open(txn, dbi, cur);
  return mrc == 0 ? KVDB_OK : kv_mdb_fail(mrc, what);
}

/* ---- map growth (catalog.h, kv_txn_begin) ---- */

/* transactions this thread holds open (any catalog): such a thread never waits for a resize */
static _Thread_local unsigned txn_depth;

static void map_enter(kv_catalog *c)
{
  pthread_mutex_lock(&c->map_mu);
  /* a thread holding a transaction of this catalog goes on (the resize waits for it anyway) */
  while (c->map_resizing && (txn_depth == 0 || c->map_active == 0))
    pthread_cond_wait(&c->map_cv, &c->map_mu);
  c->map_active++;
  pthread_mutex_unlock(&c->map_mu);
  txn_depth++;
}

static void map_leave(kv_catalog *c)
{
  pthread_mutex_lock(&c->map_mu);
  if (c->map_active > 0 && --c->map_active == 0)
    pthread_cond_broadcast(&c->map_cv);
  pthread_mutex_unlock(&c->map_mu);
  if (txn_depth > 0)
    txn_depth--;
}

/* bytes of the map in use (up to the last page written) and the map's size */
static void map_usage(kv_catalog *c, uint64_t *used, uint64_t *map)
{
  MDB_envinfo info;
  MDB_stat st;
  *used = *map = 0;
  if (mdb_env_info(kv_menv(c->env), &info) == 0 && mdb_env_stat(kv_menv(c->env), &st) == 0) {
    *used = ((uint64_t)info.me_last_pgno + 1) * st.ms_psize;
    *map = info.me_mapsize;
  }
}

/* Resize the map with no transaction of this process open: grow (double it until the used
 * pages are under 3/4 of it; `force`: at least once) or adopt another process's size (grow 0).
 * The caller holds no transaction. Returns an LMDB error or 0. */
static int map_resize(kv_catalog *c, int grow, int force)
{
  pthread_mutex_lock(&c->map_mu);
  if (c->map_resizing) { /* another thread is at it: wait for it and take its result */
    while (c->map_resizing)
      pthread_cond_wait(&c->map_cv, &c->map_mu);
    pthread_mutex_unlock(&c->map_mu);
    return 0;
  }
  c->map_resizing = 1;
  while (c->map_active > 0)
    pthread_cond_wait(&c->map_cv, &c->map_mu);
  int mrc = 0;
  if (grow) {
    uint64_t used, map;
    map_usage(c, &used, &map);
    uint64_t want = map;
    if (force || used > want / 4 * 3) {
      want = map * 2;
      while (used > want / 4 * 3 && want < (SIZE_MAX >> 2))
        want *= 2;
    }
    if (want > map && want <= (SIZE_MAX >> 1)) {
      mrc = mdb_env_set_mapsize(kv_menv(c->env), (size_t)want);
      if (mrc == 0)
        c->map_grows++;
    }
  } else {
    mrc = mdb_env_set_mapsize(kv_menv(c->env), 0);
  }
  c->map_resizing = 0;
  pthread_cond_broadcast(&c->map_cv);
  pthread_mutex_unlock(&c->map_mu);
  return mrc;
}

/* Before an outermost write transaction: grow the map when it is 3/4 used, or 1/2 used after
 * an MDB_MAP_FULL in this process. */
static void map_maybe_grow(kv_catalog *c)
{
  uint64_t used = 0, map = 0;
  pthread_mutex_lock(&c->map_mu); /* not while a vacuum replaces the environment */
  while (c->map_resizing)
    pthread_cond_wait(&c->map_cv, &c->map_mu);
  if (c->env != NULL)
    map_usage(c, &used, &map);
  pthread_mutex_unlock(&c->map_mu);
  if (map == 0)
    return;
  unsigned full = atomic_load(&map_full_events);
  int force = 0;
  if (full != atomic_load(&c->map_full_seen)) {
    atomic_store(&c->map_full_seen, full); /* a hint: at worst one more look */
    force = used > map / 2;
  }
  if (!force && used <= map / 4 * 3)
    return;
  int mrc = map_resize(c, 1, force);
  if (mrc != 0) /* the write goes on in the map it has (and fails MAP_FULL if it must) */
    kv_fail(KVDB_FULL, "catalog: cannot grow the map past %" PRIu64 " bytes: %s", map,
            mdb_strerror(mrc));
}

/* Begin in c's environment as it is once no resize or vacuum holds it back (a vacuum replaces
 * the environment: c->env is read after map_enter). */
static int cat_begin(kv_catalog *c, MDB_txn *parent, unsigned flags, MDB_txn **out)
{
  map_enter(c);
  int mrc = c->env != NULL ? mdb_txn_begin(kv_menv(c->env), parent, flags, out) : EBADF;
  if (mrc == MDB_MAP_RESIZED && txn_depth == 1) {
    /* another process grew the map past ours: adopt its size, then begin again */
    map_leave(c);
    mrc = map_resize(c, 0, 0);
    if (mrc != 0)
      return mrc;
    map_enter(c);
    mrc = c->env != NULL ? mdb_txn_begin(kv_menv(c->env), parent, flags, out) : EBADF;
  }
  if (mrc != 0)
    map_leave(c);
  return mrc;
}

int kv_mdb_txn_begin(MDB_env *env, MDB_txn *parent, unsigned flags, MDB_txn **out)
{
  kv_catalog *c = mdb_env_get_userctx(env);
  if (c == NULL || !c->map_sync)
    return mdb_txn_begin(env, parent, flags, out);
  return cat_begin(c, parent, flags, out);
}

int kv_mdb_txn_commit(MDB_txn *txn)
{
  kv_catalog *c = mdb_env_get_userctx(mdb_txn_env(txn));
  int mrc = mdb_txn_commit(txn);
  if (c != NULL && c->map_sync)
    map_leave(c);
  return mrc;
}

void kv_mdb_txn_abort(MDB_txn *txn)
{
  if (txn == NULL)
    return;
  kv_catalog *c = mdb_env_get_userctx(mdb_txn_env(txn));
  mdb_txn_abort(txn);
  if (c != NULL && c->map_sync)
    map_leave(c);
}

/* ---- the reserve (catalog.h) ---- */

/* Top the reserve up when less than half of it is left past the used pages. */
static void reserve_top_up(kv_catalog *c)
{
  uint64_t used = 0, map = 0;
  pthread_mutex_lock(&c->map_mu); /* not while a vacuum replaces the environment */
  while (c->map_resizing)
    pthread_cond_wait(&c->map_cv, &c->map_mu);
  int fd = -1;
  if (c->env != NULL) {
    map_usage(c, &used, &map);
    mdb_env_get_fd(kv_menv(c->env), &fd);
  }
  pthread_mutex_unlock(&c->map_mu);
  uint64_t want = KV_CAT_RESERVE(used);
  pthread_mutex_lock(&c->res_mu);
  if (fd >= 0 && used > 0 && (c->res_end < used || c->res_end - used < want / 2)) {
    int e = 0;
    while (fallocate(fd, FALLOC_FL_KEEP_SIZE, (off_t)used, (off_t)want) != 0 && (e = errno) == EINTR)
      e = 0;
    if (e == 0) {
      c->res_end = used + want;
      c->res_short = 0;
    } else if (e == ENOSPC || e == EDQUOT) {
      c->res_short = 1;
    } else { /* EOPNOTSUPP and the like: no reserve on this filesystem */
      c->res_end = UINT64_MAX;
    }
  }
  pthread_mutex_unlock(&c->res_mu);
}

kvdb_status kv_cat_reserve_short(kv_catalog *c)
{
  if (c->rdonly || !c->map_sync)
    return KVDB_OK;
  reserve_top_up(c);
  pthread_mutex_lock(&c->res_mu);
  int is_short = c->res_short;
  uint64_t left = c->res_end;
  pthread_mutex_unlock(&c->res_mu);
  if (!is_short)
    return KVDB_OK;
  return kv_fail(KVDB_FULL, "the disk is full: the catalog's reserve (up to byte %" PRIu64
                 " of catalog.mdb) is kept for deletes and compaction; delete contexts and "
                 "run kvdb_compact to free space", left);
}

int kv_cat_reader_check(kv_catalog *c)
{
  int dead = 0, mrc = -1;
  if (c->nolock)
    return 0;
  if (!c->map_sync || txn_depth > 0) {
    /* a thread holding a transaction: no resize or vacuum replaces the environment now */
    if (c->env != NULL)
      mrc = mdb_reader_check(kv_menv(c->env), &dead);
  } else { /* not while a resize or a vacuum holds the environment */
    pthread_mutex_lock(&c->map_mu);
    while (c->map_resizing)
      pthread_cond_wait(&c->map_cv, &c->map_mu);
    if (c->env != NULL)
      mrc = mdb_reader_check(kv_menv(c->env), &dead);
    pthread_mutex_unlock(&c->map_mu);
  }
  if (mrc != 0)
    return 0;
  if (dead > 0)
    atomic_fetch_add(&c->stale_readers, (uint64_t)dead);
  return dead;
}

/* Every KV_READER_CHECK_EVERY write transactions, or after KV_READER_CHECK_MS: clear dead
 * readers' slots (a scan of the reader table, one fcntl probe per process in it). */
static void reader_check_due(kv_catalog *c)
{
  uint64_t n = atomic_fetch_add(&c->wbegins, 1) + 1;
  uint64_t now = kv_now_ms(), last = atomic_load(&c->reader_check_ms);
  if (n % KV_READER_CHECK_EVERY != 0 && now - last < KV_READER_CHECK_MS)
    return;
  if (!atomic_compare_exchange_strong(&c->reader_check_ms, &last, now) &&
      n % KV_READER_CHECK_EVERY != 0)
    return; /* another thread checks now */
  kv_cat_reader_check(c);
}

kvdb_status kv_txn_begin(kv_catalog *c, int write, kv_txn **out)
{
  if (write && !c->rdonly)
    reader_check_due(c);
  if (write && !c->rdonly && c->map_sync && txn_depth == 0) {
    map_maybe_grow(c);
    reserve_top_up(c);
  }
  MDB_txn *mt = NULL;
  int mrc = c->map_sync ? cat_begin(c, NULL, write ? 0 : MDB_RDONLY, &mt)
                        : mdb_txn_begin(kv_menv(c->env), NULL, write ? 0 : MDB_RDONLY, &mt);
  if (mrc == MDB_READERS_FULL && kv_cat_reader_check(c) > 0)
    mrc = c->map_sync ? cat_begin(c, NULL, write ? 0 : MDB_RDONLY, &mt)
                      : mdb_txn_begin(kv_menv(c->env), NULL, write ? 0 : MDB_RDONLY, &mt);
  *out = kv_ktxn(mt);
  if (mrc == EBADF) {
    *out = NULL;
    return kv_fail(KVDB_IOERR, "catalog: closed after a failed vacuum (see the log); reopen "
                   "the database");
  }
  if (mrc != 0) {
    *out = NULL;
    if (mrc == MDB_READERS_FULL)
      return kv_fail(KVDB_BUSY, "catalog: begin read transaction: all %u reader slots are "
                     "taken by live read transactions (MDB_READERS_FULL); retry",
                     KV_CAT_MAX_READERS);
    return kv_mdb_fail(mrc, write ? "begin write transaction" : "begin read transaction");
  }
  if (c->nolock) {
    MDB_envinfo ei;
    if (mdb_env_info(kv_menv(c->env), &ei) == 0 && (uint64_t)ei.me_last_txnid != c->nolock_txnid) {
      kv_mdb_txn_abort(kv_mtxn(*out));
      *out = NULL;
      return kv_fail(KVDB_BUSY, "catalog: the database was written (transaction %llu, opened at "
                     "%llu) since this read-only handle opened it without its lock file, "
                     "which this user cannot write: reopen it to read the new state",
                     (unsigned long long)ei.me_last_txnid,
                     (unsigned long long)c->nolock_txnid);
    }
  }
  return KVDB_OK;
}

kv_catalog *kv_txn_catalog(kv_txn *txn)
{
  return mdb_env_get_userctx(mdb_txn_env(kv_mtxn(txn)));
}

kvdb_status kv_txn_commit_base(kv_catalog *c, kv_txn *txn)
{
  uint64_t id = mdb_txn_id(kv_mtxn(txn));
  int stamped = 0;
  if (c != NULL && c->track) {
    uint8_t b[8];
    for (int i = 0; i < 8; i++)
      b[i] = (uint8_t)(id >> (8 * i));
    MDB_val k = {6, (void *)(uintptr_t)"wstamp"}, v = {8, b};
    /* EACCES: a read transaction (nothing to stamp); another failure leaves the commit to
     * fail or to go unrecorded (a view then takes it for someone else's: conservative) */
    stamped = mdb_put(kv_mtxn(txn), c->meta, &k, &v, 0) == 0;
  }
  int mrc = kv_mdb_txn_commit(kv_mtxn(txn));
  if (mrc != 0)
    return kv_mdb_fail(mrc, "commit");
  if (stamped) {
    pthread_mutex_lock(&c->own_mu);
    c->own_ids[c->own_next++ % KV_CAT_OWN_IDS] = id;
    pthread_mutex_unlock(&c->own_mu);
  }
  return KVDB_OK;
}

void kv_txn_abort(kv_txn *txn)
{
  kv_mdb_txn_abort(kv_mtxn(txn));
}

uint64_t kv_txn_id(kv_txn *txn)
{
  return mdb_txn_id(kv_mtxn(txn));
}

/* mdb_reader_list's lines: "pid thread txnid" ("-" for an idle slot); the oldest txnid */
static int oldest_reader_line(const char *msg, void *ctx)
{
  uint64_t *oldest = ctx;
  char txn[32];
  unsigned long long v;
  if (sscanf(msg, "%*d %*x %31s", txn) == 1 && sscanf(txn, "%llu", &v) == 1 && v < *oldest)
    *oldest = v;
  return 0;
}

uint64_t kv_cat_oldest_reader(kv_catalog *c)
{
  uint64_t oldest = UINT64_MAX;
  mdb_reader_list(kv_menv(c->env), oldest_reader_line, &oldest);
  return oldest;
}

kvdb_status kv_cat_track_commits(kv_catalog *c)
{
  if (c->rdonly)
    return kv_fail(KVDB_READONLY, "commit tracking on a read-only catalog");
  if (!c->track) {
    int e = pthread_mutex_init(&c->own_mu, NULL);
    if (e != 0)
      return kv_fail(KVDB_NOMEM, "commit tracking: pthread_mutex_init: %s", strerror(e));
    c->track = 1;
  }
  return KVDB_OK;
}

int kv_cat_own_since(kv_catalog *c, uint64_t since, uint64_t upto)
{
  if (!c->track || upto < since || upto - since > KV_CAT_OWN_IDS)
    return upto == since;
  int all = 1;
  pthread_mutex_lock(&c->own_mu);
  unsigned n = c->own_next < KV_CAT_OWN_IDS ? c->own_next : KV_CAT_OWN_IDS;
  for (uint64_t id = since + 1; id <= upto && all; id++) {
    int found = 0;
    for (unsigned i = 0; i < n && !found; i++)
      found = c->own_ids[i] == id;
    all = found;
  }
  pthread_mutex_unlock(&c->own_mu);
  return all;
}

static kvdb_status cat_get(kv_txn *txn, MDB_dbi dbi, const void *k, size_t klen, MDB_val *v,
                           const char *what)
{
  MDB_val key = {klen, (void *)(uintptr_t)k};
  int mrc = mdb_get(kv_mtxn(txn), dbi, &key, v);
  if (mrc == MDB_NOTFOUND)
    return KVDB_NOTFOUND;
  if (mrc != 0)
    return kv_mdb_fail(mrc, what);
  return KVDB_OK;
}

kvdb_status kv_cat_get_block(kv_catalog *c, kv_txn *txn, const uint8_t hash[16], kv_block_rec *r)
{
  MDB_val v;
  KV_RET(cat_get(txn, c->blocks, hash, 16, &v, "get block"));
  return kv_block_rec_decode(v.mv_data, v.mv_size, r);
}

kvdb_status kv_cat_get_ctx(kv_catalog *c, kv_txn *txn, const uint8_t key[16], kv_ctx_rec *r)
{
  MDB_val v;
  KV_RET(cat_get(txn, c->contexts, key, 16, &v, "get context"));
  return kv_ctx_rec_decode(v.mv_data, v.mv_size, r);
}

kvdb_status kv_cat_get_seg(kv_catalog *c, kv_txn *txn, uint64_t id, kv_seg_rec *r)
{
  uint8_t k[8];
  kv_be64(k, id);
  MDB_val v;
  KV_RET(cat_get(txn, c->segments, k, 8, &v, "get segment"));
  return kv_seg_rec_decode(v.mv_data, v.mv_size, r);
}

kvdb_status kv_cat_get_u64(kv_catalog *c, kv_txn *txn, const char *name, uint64_t *v)
{
  MDB_val val;
  KV_RET(cat_get(txn, c->meta, name, strlen(name), &val, name));
  if (val.mv_size != 8)
    return kv_fail(KVDB_CORRUPT, "catalog meta '%s' is %zu bytes, not 8", name, val.mv_size);
  *v = kv_get_le64(val.mv_data);
  return KVDB_OK;
}

kvdb_status kv_cat_put_u64(kv_catalog *c, kv_txn *txn, const char *name, uint64_t v)
{
  uint8_t b[8];
  kv_put_le64(b, v);
  MDB_val key = {strlen(name), (void *)(uintptr_t)name}, val = {8, b};
  int mrc = mdb_put(kv_mtxn(txn), c->meta, &key, &val, 0);
  return mrc == 0 ? KVDB_OK : kv_mdb_fail(mrc, name);
}

kvdb_status kv_cat_require_format(kv_catalog *c, kv_txn *txn, uint64_t version)
{
  uint64_t cur = 0;
  KV_RET(kv_cat_get_u64(c, txn, "format", &cur));
  return cur >= version ? KVDB_OK : kv_cat_put_u64(c, txn, "format", version);
}

kvdb_status kv_cat_get_profile_rec(kv_catalog *c, kv_txn *txn, const uint8_t key[16],
                                   kv_profile_rec *r)
{
  if (!c->has_profiles)
    return KVDB_NOTFOUND;
  MDB_val v;
  KV_RET(cat_get(txn, c->profiles, key, 16, &v, "get profile"));
  r->prior = 0;
  return kv_profile_rec_decode(v.mv_data, v.mv_size, r);
}

kvdb_status kv_cat_put_profile(kv_catalog *c, kv_txn *txn, const uint8_t key[16],
                               const kv_profile_rec *r)
{
  if (!c->has_profiles)
    return kv_fail(KVDB_READONLY, "the catalog has no profiles database (opened read-only)");
  KV_RET(kv_cat_require_format(c, txn, 2));
  size_t len = kv_profile_rec_size(r);
  uint8_t *buf = malloc(len);
  if (buf == NULL)
    return kv_fail(KVDB_NOMEM, "profile record");
  kv_profile_rec_encode(r, buf);
  MDB_val k = {16, (void *)(uintptr_t)key}, v = {len, buf};
  int mrc = mdb_put(kv_mtxn(txn), c->profiles, &k, &v, 0);
  free(buf);
  return mrc == 0 ? KVDB_OK : kv_mdb_fail(mrc, "put profile");
}

static kvdb_status open_dbs(kv_catalog *c, kv_txn *txn, unsigned create)
{
  struct {
    const char *name;
    MDB_dbi *dbi;
    unsigned flags;
  } t[] = {
    {"meta", &c->meta, 0},         {"models", &c->models, 0},
    {"blocks", &c->blocks, 0},     {"contexts", &c->contexts, 0},
    {"atime", &c->atime, 0},       {"segments", &c->segments, 0},
  };
  for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) {
    int mrc = mdb_dbi_open(kv_mtxn(txn), t[i].name, t[i].flags | create, t[i].dbi);
    if (mrc != 0) {
      char what[64];
      snprintf(what, sizeof what, "open database '%s'", t[i].name);
      return kv_mdb_fail(mrc, what);
    }
  }
  /* the block indexes came with format 4 (a new catalog has them, an older one gets them from
   * its first read-write open: kv_idx_build); the legacy `children` is in formats 1-3 only */
  const unsigned dup = MDB_DUPSORT | MDB_DUPFIXED;
  int mrc = mdb_dbi_open(kv_mtxn(txn), "next", dup | create, &c->next);
  if (mrc == 0)
    mrc = mdb_dbi_open(kv_mtxn(txn), "segblocks", dup | create, &c->segblocks);
  if (mrc == 0)
    c->has_index = 1;
  else if (mrc != MDB_NOTFOUND)
    return kv_mdb_fail(mrc, "open the block indexes");
  mrc = create ? MDB_NOTFOUND : mdb_dbi_open(kv_mtxn(txn), "children", dup, &c->children);
  if (mrc == 0)
    c->has_children = 1;
  else if (mrc != MDB_NOTFOUND)
    return kv_mdb_fail(mrc, "open database 'children'");
  /* profiles came with format 2: a format-1 catalog lacks it until a writer creates it */
  mrc = mdb_dbi_open(kv_mtxn(txn), "profiles", create, &c->profiles);
  if (mrc == 0)
    c->has_profiles = 1;
  else if (mrc != MDB_NOTFOUND)
    return kv_mdb_fail(mrc, "open database 'profiles'");
  /* ctxstats came with the placement policy (builds that do not know it ignore it) */
  mrc = mdb_dbi_open(kv_mtxn(txn), "ctxstats", create, &c->ctxstats);
  if (mrc == 0)
    c->has_ctxstats = 1;
  else if (mrc != MDB_NOTFOUND)
    return kv_mdb_fail(mrc, "open database 'ctxstats'");
  /* priors came with format 7 (PRIORS): created empty by a read-write open */
  mrc = mdb_dbi_open(kv_mtxn(txn), "priors", create, &c->priors);
  if (mrc == 0)
    c->has_priors = 1;
  else if (mrc != MDB_NOTFOUND)
    return kv_mdb_fail(mrc, "open database 'priors'");
  return KVDB_OK;
}

static int env_create(kv_catalog *c, uint64_t map_bytes)
{
  MDB_env *env = NULL;
  int mrc = mdb_env_create(&env);
  c->env = kv_kenv(env);
  if (mrc != 0) {
    c->env = NULL;
    return mrc;
  }
  mdb_env_set_userctx(kv_menv(c->env), c); /* kv_txn_commit finds the catalog by its environment */
  mdb_env_set_maxdbs(kv_menv(c->env), 16);
  mdb_env_set_maxreaders(kv_menv(c->env), KV_CAT_MAX_READERS);
  mdb_env_set_mapsize(kv_menv(c->env), (size_t)map_bytes);
  return 0;
}

/*
 * May a read-only handle that cannot write the lock file `lpath` read the catalog without it
 * (MDB_NOLOCK)? Without the lock file its read transactions are not in LMDB's reader table, so
 * a writer may reuse the pages they read; that is safe only while no process writes. Every
 * process that has an LMDB environment open holds an fcntl lock on its lock file (LMDB takes
 * byte 0 shared at open), so: KVDB_OK when none is held now (or there is no lock file: no
 * process opened the database with one); KVDB_BUSY naming the process and the fix when one is.
 */
static kvdb_status nolock_allowed(const char *lpath)
{
  int fd = open(lpath, O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT)
      return KVDB_OK;
    return kv_fail(KVDB_READONLY, "catalog lock file '%s' can be neither written nor read by this "
                   "user (%s), so a read-only open cannot tell whether a process is writing: give "
                   "this user read and write access to it", lpath, strerror(errno));
  }
  struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = 0, .l_len = 0};
  int e = fcntl(fd, F_GETLK, &fl) == 0 ? 0 : errno;
  close(fd); /* this process holds no lock on it: it could not open the environment */
  if (e != 0)
    return kv_fail_errno(e, "cannot test the locks of catalog lock file '%s'", lpath);
  if (fl.l_type == F_UNLCK)
    return KVDB_OK;
  return kv_fail(KVDB_BUSY, "catalog lock file '%s' is not writable by this user, and process %d "
                 "has the database open: reading without the lock file could see pages that a "
                 "writer reuses. Give this user write access to the lock file (e.g. a common "
                 "group and chmod g+w on it and the directory), or open read-only when no process "
                 "has the database open", lpath, (int)fl.l_pid);
}

/* ---- this process's open catalogs ---- */

static pthread_mutex_t reg_mu = PTHREAD_MUTEX_INITIALIZER;
static kv_catalog *reg_head;

/* with reg_mu held: record c's file (dev, inode) */
static void reg_add(kv_catalog *c)
{
  int fd = -1;
  struct stat st;
  if (mdb_env_get_fd(kv_menv(c->env), &fd) != 0 || fstat(fd, &st) != 0)
    return;
  c->file_dev = (uint64_t)st.st_dev;
  c->file_ino = (uint64_t)st.st_ino;
  c->reg_next = reg_head;
  reg_head = c;
  c->registered = 1;
}

static void reg_del(kv_catalog *c)
{
  pthread_mutex_lock(&reg_mu);
  for (kv_catalog **pp = &reg_head; c->registered && *pp != NULL; pp = &(*pp)->reg_next)
    if (*pp == c) {
      *pp = c->reg_next;
      break;
    }
  c->registered = 0;
  pthread_mutex_unlock(&reg_mu);
}

/* with reg_mu held: another catalog of this process on c's file */
static int reg_shared(const kv_catalog *c)
{
  for (const kv_catalog *o = reg_head; o != NULL; o = o->reg_next)
    if (o != c && o->file_dev == c->file_dev && o->file_ino == c->file_ino)
      return 1;
  return 0;
}

/* close the environment and what goes with it (the map lock) */
static void cat_env_close(kv_catalog *c)
{
  reg_del(c);
  if (c->env != NULL)
    mdb_env_close(kv_menv(c->env));
  if (c->lockfd >= 0)
    close(c->lockfd); /* after the environment: closing it drops this process's fcntl locks */
  c->lockfd = -1;
  free(c->path);
  c->path = NULL;
  if (c->map_sync) {
    pthread_mutex_destroy(&c->map_mu);
    pthread_cond_destroy(&c->map_cv);
    pthread_mutex_destroy(&c->res_mu);
    c->map_sync = 0;
  }
}

kvdb_status kv_cat_env_open(kv_catalog *c, const char *dir, uint64_t map_bytes, int rdonly,
                            int create, int nosync)
{
  memset(c, 0, sizeof *c);
  c->rdonly = rdonly;
  c->lockfd = -1;
  if (pthread_mutex_init(&c->map_mu, NULL) != 0 || pthread_cond_init(&c->map_cv, NULL) != 0 ||
      pthread_mutex_init(&c->res_mu, NULL) != 0)
    return kv_fail(KVDB_NOMEM, "catalog: cannot initialize the map lock");
  c->map_sync = 1;
  int mrc = env_create(c, map_bytes);
  if (mrc != 0) {
    cat_env_close(c);
    return kv_mdb_fail(mrc, "create environment");
  }
  char path[4096];
  snprintf(path, sizeof path, "%s/catalog.mdb", dir);
  /* MDB_NOTLS: read transactions are not tied to threads (callers use many threads).
   * MDB_NOSUBDIR: the catalog is one file (plus its -lock) in the database directory. */
  unsigned flags = MDB_NOSUBDIR | MDB_NOTLS;
  if (rdonly)
    flags |= MDB_RDONLY;
  if (nosync)
    flags |= MDB_NOSYNC;
  struct stat st;
  if (stat(path, &st) != 0) {
    if (rdonly || !create) {
      cat_env_close(c);
      c->env = NULL;
      return kv_fail(KVDB_NOTFOUND, "no database at '%s' (no catalog.mdb)", dir);
    }
  }
  pthread_mutex_lock(&reg_mu); /* not while a vacuum of this process replaces the file */
  mrc = mdb_env_open(kv_menv(c->env), path, flags, 0644);
  kvdb_status why = KVDB_OK;
  if (mrc != 0 && rdonly && (mrc == EACCES || mrc == EPERM || mrc == EROFS)) {
    /* the lock file cannot be opened for writing (another user's, or a directory where it
     * cannot be made): read without it, while no process has the database open. A failed
     * mdb_env_open leaves the environment unusable (LMDB: close it), so a fresh one. */
    char lpath[4200];
    snprintf(lpath, sizeof lpath, "%s-lock", path);
    mdb_env_close(kv_menv(c->env));
    c->env = NULL;
    why = nolock_allowed(lpath);
    if (why == KVDB_OK && (mrc = env_create(c, map_bytes)) == 0) {
      mrc = mdb_env_open(kv_menv(c->env), path, flags | MDB_NOLOCK, 0644);
      MDB_envinfo ei;
      if (mrc == 0 && (mrc = mdb_env_info(kv_menv(c->env), &ei)) == 0) {
        c->nolock = 1;
        c->nolock_txnid = ei.me_last_txnid;
      }
    }
  } else if (mrc == EACCES || mrc == EPERM) {
    why = kv_fail(KVDB_READONLY, "catalog '%s' or its lock file '%s-lock' is not writable by "
                  "this user: open with KVDB_O_RDONLY to read the database", path, path);
  }
  if (mrc == 0 && why == KVDB_OK)
    reg_add(c);
  pthread_mutex_unlock(&reg_mu);
  if (why != KVDB_OK || mrc != 0) {
    kvdb_status st2 = why != KVDB_OK ? why : kv_mdb_fail(mrc, path);
    cat_env_close(c);
    c->env = NULL;
    return st2;
  }
  c->path = strdup(path);
  if (c->path == NULL) {
    cat_env_close(c);
    c->env = NULL;
    return kv_fail(KVDB_NOMEM, "catalog path");
  }
  unsigned got = 0;
  mdb_env_get_flags(kv_menv(c->env), &got);
  c->env_flags = flags | (got & MDB_NOLOCK);
  if (!rdonly) { /* kv_catalog_vacuum asks it whether another process has the catalog open */
    char lpath[4200];
    snprintf(lpath, sizeof lpath, "%s-lock", path);
    c->lockfd = open(lpath, O_RDWR | O_CLOEXEC);
  }
  kv_cat_reader_check(c); /* slots of processes that died inside a read transaction */
  return KVDB_OK;
}

kvdb_status kv_cat_open_dbs(kv_catalog *c, kv_txn *txn, unsigned create)
{
  return open_dbs(c, txn, create);
}

void kv_catalog_close(kv_catalog *c)
{
  if (c->env != NULL || c->map_sync) /* (no environment: a failed vacuum's reopen) */
    cat_env_close(c);
  c->env = NULL;
  if (c->track)
    pthread_mutex_destroy(&c->own_mu);
  c->track = 0;
}

/* ---- vacuum (catalog.h) ---- */

/* Hold every new transaction of this process back and wait until none is open (as a map
 * resize does). 0: held; -1: a resize or vacuum is under way (the caller skips). */
static int gate_take(kv_catalog *c)
{
  pthread_mutex_lock(&c->map_mu);
  if (c->map_resizing) {
    pthread_mutex_unlock(&c->map_mu);
    return -1;
  }
  c->map_resizing = 1;
  while (c->map_active > 0)
    pthread_cond_wait(&c->map_cv, &c->map_mu);
  pthread_mutex_unlock(&c->map_mu);
  return 0;
}

static void gate_give(kv_catalog *c)
{
  pthread_mutex_lock(&c->map_mu);
  c->map_resizing = 0;
  pthread_cond_broadcast(&c->map_cv);
  pthread_mutex_unlock(&c->map_mu);
}

/* The names of the catalog's databases (the main database's keys), NUL-terminated. */
static int db_names(MDB_txn *txn, char ***out, size_t *n)
{
  MDB_dbi main;
  MDB_cursor *cur;
  *out = NULL;
  *n = 0;
  int mrc = mdb_dbi_open(txn, NULL, 0, &main);
  if (mrc == 0)
    mrc = mdb_cursor_open(txn, main, &cur);
  if (mrc != 0)
    return mrc;
  MDB_val k, v;
  char **names = NULL;
  size_t cnt = 0;
  while ((mrc = mdb_cursor_get(cur, &k, &v, MDB_NEXT)) == 0) {
    char **nn = realloc(names, (cnt + 1) * sizeof *nn);
    char *nm = malloc(k.mv_size + 1);
    if (nn == NULL || nm == NULL) {
      free(nm);
      names = nn != NULL ? nn : names;
      mrc = ENOMEM;
      break;
    }
    names = nn;
    memcpy(nm, k.mv_data, k.mv_size);
    nm[k.mv_size] = 0;
    names[cnt++] = nm;
  }
  mdb_cursor_close(cur);
  *out = names;
  *n = cnt;
  return mrc == MDB_NOTFOUND ? 0 : mrc;
}

static void names_free(char **names, size_t n)
{
  for (size_t i = 0; i < n; i++)
    free(names[i]);
  free(names);
}

/* Bytes a rewrite in key order would take: per database, its entries times the mean node size
 * of its first 256, in full pages, plus its overflow pages and one branch page in 64. */
static uint64_t packed_bytes(MDB_txn *txn, char **names, size_t n, unsigned psize)
{
  uint64_t pages = 4; /* meta pages, main and free databases' roots */
  for (size_t i = 0; i < n; i++) {
    MDB_dbi d;
    MDB_stat st;
    MDB_cursor *cur;
    if (mdb_dbi_open(txn, names[i], 0, &d) != 0 || mdb_stat(txn, d, &st) != 0 ||
        mdb_cursor_open(txn, d, &cur) != 0)
      continue;
    MDB_val k, v;
    uint64_t bytes = 0, cnt = 0;
    for (int mrc = mdb_cursor_get(cur, &k, &v, MDB_FIRST); mrc == 0 && cnt < 256;
         mrc = mdb_cursor_get(cur, &k, &v, MDB_NEXT), cnt++)
      bytes += 10 + k.mv_size + (v.mv_size > psize / 2 ? 8 : v.mv_size); /* node, index */
    mdb_cursor_close(cur);
    uint64_t leaf = cnt ? (st.ms_entries * (bytes / cnt) + psize - 17) / (psize - 16) : 1;
    pages += leaf + leaf / 64 + 1 + st.ms_overflow_pages;
  }
  return pages * psize;
}

/* Copy every database of the open environment (read transaction rt) into the new file `tmp`
 * in key order. */
static kvdb_status vacuum_copy(MDB_txn *rt, char **names, size_t n,
                               const char *tmp, size_t mapsize)
{
  MDB_env *ne = NULL;
  MDB_txn *wt = NULL;
  MDB_cursor *cur = NULL;
  kvdb_status rc = KVDB_OK;
  int mrc = mdb_env_create(&ne);
  if (mrc == 0)
    mrc = mdb_env_set_maxdbs(ne, 64);
  if (mrc == 0)
    mrc = mdb_env_set_mapsize(ne, mapsize);
  if (mrc == 0)
    mrc = mdb_env_open(ne, tmp, MDB_NOSUBDIR | MDB_NOLOCK | MDB_NOSYNC, 0644);
  if (mrc != 0) {
    rc = kv_mdb_fail(mrc, "vacuum: create the new catalog");
    goto out;
  }
  for (size_t i = 0; i < n && rc == KVDB_OK; i++) {
    MDB_dbi od, nd;
    unsigned fl = 0;
    MDB_stat os, ns;
    if ((mrc = mdb_dbi_open(rt, names[i], 0, &od)) != 0 || (mrc = mdb_dbi_flags(rt, od, &fl)) != 0 ||
        (mrc = mdb_stat(rt, od, &os)) != 0 || (mrc = mdb_txn_begin(ne, NULL, 0, &wt)) != 0 ||
        (mrc = mdb_dbi_open(wt, names[i], (fl & ~MDB_CREATE) | MDB_CREATE, &nd)) != 0 ||
        (mrc = mdb_cursor_open(rt, od, &cur)) != 0) {
      rc = kv_mdb_fail(mrc, "vacuum: open a database");
      break;
    }
    MDB_val k, v, prev = {0, NULL};
    uint64_t cnt = 0;
    while ((mrc = mdb_cursor_get(cur, &k, &v, MDB_NEXT)) == 0) {
      /* in key order: appended to the last page (a dupsort key's items in their order) */
      unsigned pf = MDB_APPEND;
      if ((fl & MDB_DUPSORT) && prev.mv_data != NULL && prev.mv_size == k.mv_size &&
          memcmp(prev.mv_data, k.mv_data, k.mv_size) == 0)
        pf = MDB_APPENDDUP;
      if ((mrc = mdb_put(wt, nd, &k, &v, pf)) != 0)
        break;
      prev = k; /* points into the old map: valid as rt */
      if (++cnt % 65536 == 0) { /* bounded dirty pages per transaction */
        if ((mrc = mdb_txn_commit(wt)) != 0 || (mrc = mdb_txn_begin(ne, NULL, 0, &wt)) != 0) {
          wt = NULL;
          break;
        }
      }
    }
    mdb_cursor_close(cur);
    cur = NULL;
    if (mrc != MDB_NOTFOUND) {
      rc = kv_mdb_fail(mrc, "vacuum: copy a database");
      break;
    }
    if ((mrc = mdb_stat(wt, nd, &ns)) != 0 || (mrc = mdb_txn_commit(wt)) != 0) {
      wt = NULL;
      rc = kv_mdb_fail(mrc, "vacuum: commit");
      break;
    }
    wt = NULL;
    if (ns.ms_entries != os.ms_entries)
      rc = kv_fail(KVDB_IOERR, "vacuum: database '%s' has %zu entries in the copy, %zu in the "
                   "catalog", names[i], ns.ms_entries, os.ms_entries);
  }
  if (rc == KVDB_OK && (mrc = mdb_env_sync(ne, 1)) != 0)
    rc = kv_mdb_fail(mrc, "vacuum: sync the new catalog");
out:
  if (wt != NULL)
    mdb_txn_abort(wt);
  if (ne != NULL)
    mdb_env_close(ne);
  return rc;
}

/* Reopen the (new) catalog file with the same settings and database handles. */
static kvdb_status vacuum_reopen(kv_catalog *c, size_t mapsize)
{
  mdb_env_close(kv_menv(c->env));
  c->env = NULL;
  MDB_txn *txn = NULL;
  int mrc = env_create(c, mapsize);
  if (mrc == 0)
    mrc = mdb_env_open(kv_menv(c->env), c->path, c->env_flags, 0644);
  if (mrc == 0)
    mrc = mdb_txn_begin(kv_menv(c->env), NULL, MDB_RDONLY, &txn);
  if (mrc != 0) {
    if (c->env != NULL)
      mdb_env_close(kv_menv(c->env));
    c->env = NULL;
    return kv_mdb_fail(mrc, "vacuum: reopen the catalog");
  }
  MDB_dbi meta;
  kvdb_status rc = KVDB_OK;
  if ((mrc = mdb_dbi_open(txn, "meta", 0, &meta)) != 0)
    rc = kv_mdb_fail(mrc, "vacuum: open database 'meta'");
  if (rc == KVDB_OK)
    rc = open_dbs(c, kv_ktxn(txn), 0);
  /* every database handle is taken anew (the engine reads them from c at each use, and no
   * transaction is open): their numbers may differ from the old environment's */
  if (rc == KVDB_OK && (mrc = mdb_txn_commit(txn)) != 0) /* makes the handles permanent */
    rc = kv_mdb_fail(mrc, "vacuum: reopen the catalog");
  else if (rc != KVDB_OK)
    mdb_txn_abort(txn);
  if (rc != KVDB_OK) {
    mdb_env_close(kv_menv(c->env));
    c->env = NULL;
  }
  return rc;
}

kvdb_status kv_cat_vacuum_file(kv_catalog *c, int force, int *done, uint64_t *before,
                               uint64_t *after, int *recount)
{
  struct stat fst;
  *done = 0;
  if (before != NULL)
    *before = 0;
  if (after != NULL)
    *after = 0;
  if (c->rdonly || c->lockfd < 0 || c->path == NULL || !c->map_sync || txn_depth != 0 ||
      (c->env_flags & MDB_NOLOCK))
    return KVDB_OK;
  if (stat(c->path, &fst) != 0)
    return kv_fail_errno(errno, "vacuum: cannot stat '%s'", c->path);
  if (before != NULL)
    *before = (uint64_t)fst.st_size;
  if (after != NULL)
    *after = (uint64_t)fst.st_size;
  if (!force && fst.st_size < (1 << 20))
    return KVDB_OK; /* not worth holding the handle for */
  pthread_mutex_lock(&reg_mu); /* no handle of this process opens or closes meanwhile */
  if (reg_shared(c)) { /* another handle of this process has it open */
    pthread_mutex_unlock(&reg_mu);
    return KVDB_OK;
  }
  if (gate_take(c) != 0) {
    pthread_mutex_unlock(&reg_mu);
    return KVDB_OK;
  }
  kvdb_status rc = KVDB_OK;
  *recount = 0;
  MDB_txn *rt = NULL;
  char **names = NULL;
  size_t n = 0;
  MDB_envinfo info;
  MDB_stat est;
  int mrc = mdb_env_info(kv_menv(c->env), &info);
  if (mrc == 0)
    mrc = mdb_env_stat(kv_menv(c->env), &est);
  if (mrc == 0)
    mrc = mdb_txn_begin(kv_menv(c->env), NULL, MDB_RDONLY, &rt);
  if (mrc == 0)
    mrc = db_names(rt, &names, &n);
  if (mrc != 0) {
    rc = kv_mdb_fail(mrc, "vacuum: read the catalog");
    goto out;
  }
  uint64_t packed = packed_bytes(rt, names, n, est.ms_psize);
  if (!force && (uint64_t)fst.st_size <= 2 * packed)
    goto out;
  /* the only user? (the exclusive lock also keeps other processes from opening meanwhile) */
  struct flock lk = {.l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = 0, .l_len = 1};
  if (fcntl(c->lockfd, F_SETLK, &lk) != 0)
    goto out; /* another process has it open: not now */
  char tmp[4200];
  snprintf(tmp, sizeof tmp, "%s.vacuum", c->path);
  unlink(tmp);
  rc = vacuum_copy(rt, names, n, tmp, info.me_mapsize);
  mdb_txn_abort(rt);
  rt = NULL;
  if (rc == KVDB_OK && rename(tmp, c->path) != 0)
    rc = kv_fail_errno(errno, "vacuum: cannot rename '%s' to '%s'", tmp, c->path);
  if (rc != KVDB_OK) {
    unlink(tmp);
    lk.l_type = F_RDLCK; /* back to what LMDB holds */
    fcntl(c->lockfd, F_SETLK, &lk);
    goto out;
  }
  char dir[4200];
  snprintf(dir, sizeof dir, "%s", c->path);
  char *slash = strrchr(dir, '/');
  if (slash != NULL) {
    *slash = 0;
    int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
      fsync(dfd); /* the rename is durable */
      close(dfd);
    }
  }
  rc = vacuum_reopen(c, info.me_mapsize);
  if (rc == KVDB_OK) {
    int fd = -1;
    if (mdb_env_get_fd(kv_menv(c->env), &fd) == 0 && fstat(fd, &fst) == 0) {
      c->file_dev = (uint64_t)fst.st_dev; /* the new file (the registry entry is c) */
      c->file_ino = (uint64_t)fst.st_ino;
    }
    *done = 1;
    /* kvdb_stat's counters carry the id of the transaction that kept them: the new file's ids
     * start anew, so count them again (after the gate below: it begins a transaction) */
    *recount = 1;
    if (after != NULL && stat(c->path, &fst) == 0)
      *after = (uint64_t)fst.st_size;
  }
out:
  if (rt != NULL)
    mdb_txn_abort(rt);
  names_free(names, n);
  gate_give(c);
  pthread_mutex_unlock(&reg_mu);
  return rc;
}
