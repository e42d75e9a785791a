/* SPDX-License-Identifier: MIT */
/*
 * engine/catalog/ctxstats.c — the ctxstats record codec and the policy's meta entries
 * (catalog.h CTXSTATS, FORMAT.md §2).
 *
 * ctxstats record (32 bytes, little-endian; version 2: 40 bytes):
 *   0 u8 version (1, 2) | 1 u8 flags (bit 0 cached in DRAM, bit 1 prior: version 2 only) |
 *   2 u8 tier | 3 u8 reserved (0) | 4 u32 reserved (0) | 8 f64 frequency |
 *   16 u64 frequency as of (Unix ms) | 24 u64 accesses | version 2: 32 u64 prior group (!= 0)
 * prior record (catalog.h PRIORS; 16 + 40 n bytes): 0 u8 version (1) | 1 u8 reserved (0) |
 *   2 u16 n entries (1..40) | 4 u32 reserved (0) | 8 u64 predicted as of (Unix ms); per entry:
 *   storage config (12) | u32 reserved (0) | f64 quality | f64 rel_l2 | f64 bytes per token
 */
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "catalog_int.h"
#include "model/model.h"
#include "policy.h"

size_t kv_ctxstats_encode(const kv_ctxstats *r, uint8_t dst[KV_CTXSTATS_REC_MAX])
{
  size_t n = r->prior != 0 ? KV_CTXSTATS_REC_BYTES_V2 : KV_CTXSTATS_REC_BYTES;
  memset(dst, 0, n);
  dst[0] = r->prior != 0 ? 2 : 1;
  uint32_t fl = r->flags & ~(uint32_t)KV_CTXS_PRIOR;
  dst[1] = (uint8_t)(r->prior != 0 ? fl | KV_CTXS_PRIOR : fl);
  dst[2] = (uint8_t)r->tier;
  kv_put_lef64(dst + 8, r->freq);
  kv_put_le64(dst + 16, r->freq_ms);
  kv_put_le64(dst + 24, r->accesses);
  if (r->prior != 0)
    kv_put_le64(dst + 32, r->prior);
  return n;
}

kvdb_status kv_ctxstats_decode(const uint8_t *src, size_t len, kv_ctxstats *r)
{
  if (len < 1 || src[0] == 0)
    return kv_fail(KVDB_CORRUPT, "ctxstats record of %zu bytes, version 0", len);
  if (src[0] > KV_CTXSTATS_REC_VERSION)
    return kv_fail(KVDB_VERSION, "ctxstats record version %u is newer than %u", src[0],
                   KV_CTXSTATS_REC_VERSION);
  size_t want = src[0] == 1 ? KV_CTXSTATS_REC_BYTES : KV_CTXSTATS_REC_BYTES_V2;
  if (len != want)
    return kv_fail(KVDB_CORRUPT, "ctxstats record version %u is %zu bytes, not %zu", src[0], len,
                   want);
  r->flags = src[1];
  r->tier = src[2];
  r->freq = kv_get_lef64(src + 8);
  r->freq_ms = kv_get_le64(src + 16);
  r->accesses = kv_get_le64(src + 24);
  r->prior = src[0] == 2 ? kv_get_le64(src + 32) : 0;
  /* version 1: bit 0 only; version 2: bit 1 set, a non-zero group */
  uint32_t known = src[0] == 2 ? (uint32_t)(KV_CTXS_CACHED | KV_CTXS_PRIOR) : KV_CTXS_CACHED;
  if ((r->flags & ~known) != 0 || (src[0] == 2 && (!(r->flags & KV_CTXS_PRIOR) || r->prior == 0)) ||
      src[3] != 0 || kv_get_le32(src + 4) != 0 || r->tier < KVDB_TIER_SSD ||
      r->tier >= KVDB_TIER_COUNT || !isfinite(r->freq) || r->freq < 0)
    return kv_fail(KVDB_CORRUPT, "ctxstats record has flags %u, tier %u, frequency %g", r->flags,
                   r->tier, r->freq);
  r->flags &= ~(uint32_t)KV_CTXS_PRIOR; /* kept as r->prior */
  return KVDB_OK;
}

double kv_ctxstats_freq_at(const kv_ctxstats *r, uint64_t now_ms, double half_life_ms)
{
  if (!(half_life_ms > 0) || now_ms <= r->freq_ms)
    return r->freq;
  return r->freq * exp2(-(double)(now_ms - r->freq_ms) / half_life_ms);
}

/* The context's own record when it carries the statistics (version 3, FOLDED STATS). */
static kvdb_status folded_ctx(kv_catalog *c, kv_txn *txn, const uint8_t key[16], kv_ctx_rec *cr)
{
  kvdb_status rc = kv_cat_get_ctx(c, txn, key, cr);
  if (rc == KVDB_OK && !cr->has_stats)
    rc = KVDB_NOTFOUND;
  return rc;
}

int kv_cat_has_ctxstats_rec(kv_catalog *c, kv_txn *txn, const uint8_t key[16])
{
  MDB_val k = {16, (void *)(uintptr_t)key}, v;
  return c->has_ctxstats && mdb_get(kv_mtxn(txn), c->ctxstats, &k, &v) == 0;
}

kvdb_status kv_cat_get_ctxstats(kv_catalog *c, kv_txn *txn, const uint8_t key[16],
                                kv_ctxstats *r)
{
  if (!c->has_ctxstats)
    return KVDB_NOTFOUND;
  MDB_val k = {16, (void *)(uintptr_t)key}, v;
  int mrc = mdb_get(kv_mtxn(txn), c->ctxstats, &k, &v);
  if (mrc == MDB_NOTFOUND) { /* FOLDED STATS: the context record's, when it has them */
    kv_ctx_rec cr;
    kvdb_status rc = folded_ctx(c, txn, key, &cr);
    if (rc == KVDB_OK)
      *r = cr.stats;
    else if (rc == KVDB_NOTFOUND)
      kv_clear_error();
    return rc;
  }
  if (mrc != 0)
    return kv_mdb_fail(mrc, "get ctxstats");
  return kv_ctxstats_decode(v.mv_data, v.mv_size, r);
}

kvdb_status kv_cat_put_ctxstats(kv_catalog *c, kv_txn *txn, const uint8_t key[16],
                                const kv_ctxstats *r)
{
  if (!c->has_ctxstats)
    return kv_fail(KVDB_READONLY, "the catalog has no ctxstats database (opened read-only)");
  if (r->prior != 0)
    KV_RET(kv_cat_require_format(c, txn, KV_FORMAT_PRIORS));
  MDB_val k = {16, (void *)(uintptr_t)key}, v;
  int mrc = mdb_get(kv_mtxn(txn), c->ctxstats, &k, &v);
  if (mrc == MDB_NOTFOUND) { /* FOLDED STATS: into the context record when it carries them */
    kv_ctx_rec cr;
    kvdb_status rc = folded_ctx(c, txn, key, &cr);
    if (rc == KVDB_OK) {
      cr.stats = *r;
      size_t len = kv_ctx_rec_size(&cr, cr.n_blocks);
      uint8_t *buf = malloc(len);
      if (buf == NULL)
        return kv_fail(KVDB_NOMEM, "context record");
      kv_ctx_rec_encode(&cr, cr.blocks, buf); /* cr.blocks points into the txn's map */
      rc = kv_cat_put_raw(c, txn, KV_TBL_CONTEXTS, key, 16, buf, len, "put context");
      free(buf);
      return rc;
    }
    if (rc != KVDB_NOTFOUND)
      return rc;
    kv_clear_error();
  } else if (mrc != 0) {
    return kv_mdb_fail(mrc, "get ctxstats");
  }
  uint8_t b[KV_CTXSTATS_REC_MAX];
  size_t n = kv_ctxstats_encode(r, b);
  MDB_val nv = {n, b};
  mrc = mdb_put(kv_mtxn(txn), c->ctxstats, &k, &nv, 0);
  return mrc == 0 ? KVDB_OK : kv_mdb_fail(mrc, "put ctxstats");
}

kvdb_status kv_cat_del_ctxstats(kv_catalog *c, kv_txn *txn, const uint8_t key[16])
{
  if (!c->has_ctxstats)
    return KVDB_OK;
  MDB_val k = {16, (void *)(uintptr_t)key};
  int mrc = mdb_del(kv_mtxn(txn), c->ctxstats, &k, NULL);
  return mrc == 0 || mrc == MDB_NOTFOUND ? KVDB_OK : kv_mdb_fail(mrc, "delete ctxstats");
}

kvdb_status kv_cat_touch_ctxstats(kv_catalog *c, kv_txn *txn, const uint8_t key[16],
                                  uint64_t now_ms, double half_life_ms)
{
  kv_ctxstats r;
  kvdb_status rc = kv_cat_get_ctxstats(c, txn, key, &r);
  if (rc == KVDB_NOTFOUND || rc == KVDB_CORRUPT) { /* a damaged record starts over */
    memset(&r, 0, sizeof r);
    r.tier = KVDB_TIER_SSD;
    r.freq_ms = now_ms;
  } else if (rc != KVDB_OK) {
    return rc;
  }
  /* accesses may arrive out of order (several handles): an older one is decayed to freq_ms */
  if (now_ms >= r.freq_ms) {
    r.freq = kv_ctxstats_freq_at(&r, now_ms, half_life_ms) + 1.0;
    r.freq_ms = now_ms;
  } else {
    r.freq += half_life_ms > 0 ? exp2(-(double)(r.freq_ms - now_ms) / half_life_ms) : 1.0;
  }
  r.accesses++;
  return kv_cat_put_ctxstats(c, txn, key, &r);
}

kvdb_status kv_cat_get_str(kv_catalog *c, kv_txn *txn, const char *name, char *buf, size_t cap)
{
  MDB_val k = {strlen(name), (void *)(uintptr_t)name}, v;
  int mrc = mdb_get(kv_mtxn(txn), c->meta, &k, &v);
  if (mrc == MDB_NOTFOUND)
    return KVDB_NOTFOUND;
  if (mrc != 0)
    return kv_mdb_fail(mrc, name);
  if (v.mv_size >= cap || memchr(v.mv_data, 0, v.mv_size) != NULL)
    return kv_fail(KVDB_CORRUPT, "catalog meta '%s' is %zu bytes or holds a NUL", name,
                   v.mv_size);
  memcpy(buf, v.mv_data, v.mv_size);
  buf[v.mv_size] = 0;
  return KVDB_OK;
}

kvdb_status kv_cat_put_str(kv_catalog *c, kv_txn *txn, const char *name, const char *s)
{
  MDB_val k = {strlen(name), (void *)(uintptr_t)name}, v = {strlen(s), (void *)(uintptr_t)s};
  int mrc = mdb_put(kv_mtxn(txn), c->meta, &k, &v, 0);
  return mrc == 0 ? KVDB_OK : kv_mdb_fail(mrc, name);
}

kvdb_status kv_cat_get_blob(kv_catalog *c, kv_txn *txn, const char *name, void *buf, size_t len)
{
  MDB_val k = {strlen(name), (void *)(uintptr_t)name}, v;
  int mrc = mdb_get(kv_mtxn(txn), c->meta, &k, &v);
  if (mrc == MDB_NOTFOUND)
    return KVDB_NOTFOUND;
  if (mrc != 0)
    return kv_mdb_fail(mrc, name);
  if (v.mv_size != len)
    return kv_fail(KVDB_CORRUPT, "catalog meta '%s' is %zu bytes, not %zu", name, v.mv_size,
                   len);
  memcpy(buf, v.mv_data, len);
  return KVDB_OK;
}

kvdb_status kv_cat_put_blob(kv_catalog *c, kv_txn *txn, const char *name, const void *buf,
                            size_t len)
{
  MDB_val k = {strlen(name), (void *)(uintptr_t)name}, v = {len, (void *)(uintptr_t)buf};
  int mrc = mdb_put(kv_mtxn(txn), c->meta, &k, &v, 0);
  return mrc == 0 ? KVDB_OK : kv_mdb_fail(mrc, name);
}

/* ---- PRIORS ------------------------------------------------------------------------------ */

size_t kv_prior_rec_size(uint32_t n_entries)
{
  return KV_PRIOR_HDR + KV_PRIOR_ENT * (size_t)n_entries;
}

void kv_prior_rec_encode(const kv_profile_rec *p, uint8_t *dst)
{
  memset(dst, 0, kv_prior_rec_size(p->n_entries));
  dst[0] = KV_PRIOR_REC_VERSION;
  kv_put_le16(dst + 2, (uint16_t)p->n_entries);
  kv_put_le64(dst + 8, p->measured_ms);
  for (uint32_t i = 0; i < p->n_entries; i++) {
    uint8_t *e = dst + KV_PRIOR_HDR + KV_PRIOR_ENT * i;
    kv_config_encode(&p->e[i].config, e);
    kv_put_lef64(e + 16, p->e[i].quality);
    kv_put_lef64(e + 24, p->e[i].rel_l2);
    kv_put_lef64(e + 32, p->prior_bpt[i]);
  }
}

kvdb_status kv_prior_rec_decode(const uint8_t *src, size_t len, kv_profile_rec *p)
{
  KV_RET(kv_rec_version_max(src, len, KV_PRIOR_HDR, "prior", KV_PRIOR_REC_VERSION));
  uint32_t n = kv_get_le16(src + 2);
  if (src[1] != 0 || kv_get_le32(src + 4) != 0 || n == 0 || n > KV_PRIOR_MAX_ENTRIES ||
      len != kv_prior_rec_size(n))
    return kv_fail(KVDB_CORRUPT, "prior record of %zu bytes claims %u entries", len, n);
  memset(p, 0, offsetof(kv_profile_rec, e));
  p->n_entries = n;
  p->n_probes = 0;
  p->measured_ms = kv_get_le64(src + 8);
  p->prior = 0;
  for (uint32_t i = 0; i < n; i++) {
    const uint8_t *e = src + KV_PRIOR_HDR + KV_PRIOR_ENT * i;
    kvdb_profile_entry *pe = &p->e[i];
    memset(pe, 0, sizeof *pe);
    KV_RET(kv_config_decode(e, &pe->config));
    pe->quality = kv_get_lef64(e + 16);
    pe->rel_l2 = kv_get_lef64(e + 24);
    pe->reported_quality = NAN;
    p->prior_bpt[i] = kv_get_lef64(e + 32);
    if (kv_get_le32(e + 12) != 0 || !isfinite(pe->quality) || !isfinite(pe->rel_l2) ||
        !(p->prior_bpt[i] > 0) || !isfinite(p->prior_bpt[i]))
      return kv_fail(KVDB_CORRUPT, "prior record entry %u: quality %g, bytes per token %g", i,
                     pe->quality, p->prior_bpt[i]);
  }
  return KVDB_OK;
}

kvdb_status kv_cat_get_prior(kv_catalog *c, kv_txn *txn, uint64_t key, kv_profile_rec *p)
{
  if (!c->has_priors)
    return KVDB_NOTFOUND;
  uint8_t kb[8];
  kv_be64(kb, key);
  MDB_val k = {8, kb}, v;
  int mrc = mdb_get(kv_mtxn(txn), c->priors, &k, &v);
  if (mrc == MDB_NOTFOUND)
    return KVDB_NOTFOUND;
  if (mrc != 0)
    return kv_mdb_fail(mrc, "get prior");
  return kv_prior_rec_decode(v.mv_data, v.mv_size, p);
}

kvdb_status kv_cat_put_profile_ref(kv_catalog *c, kv_txn *txn, const uint8_t key[16],
                                   const kv_profile_rec *p, uint64_t now_ms)
{
  if (!c->has_priors || !c->has_ctxstats)
    return kv_fail(KVDB_READONLY, "the catalog has no priors database (opened read-only)");
  if (p->prior == 0 || p->n_entries == 0 || p->n_entries > KV_PRIOR_MAX_ENTRIES)
    return kv_fail(KVDB_INVALID, "profile of %u entries is no prior reference", p->n_entries);
  KV_RET(kv_cat_require_format(c, txn, KV_FORMAT_PRIORS));
  uint8_t buf[KV_PRIOR_HDR + KV_PRIOR_ENT * KV_PRIOR_MAX_ENTRIES], kb[8];
  size_t len = kv_prior_rec_size(p->n_entries);
  kv_prior_rec_encode(p, buf);
  kv_be64(kb, p->prior);
  MDB_val k = {8, kb}, v;
  int mrc = mdb_get(kv_mtxn(txn), c->priors, &k, &v);
  if (mrc != 0 && mrc != MDB_NOTFOUND)
    return kv_mdb_fail(mrc, "get prior");
  if (mrc == MDB_NOTFOUND || v.mv_size != len || memcmp(v.mv_data, buf, len) != 0) {
    MDB_val nv = {len, buf};
    mrc = mdb_put(kv_mtxn(txn), c->priors, &k, &nv, 0);
    if (mrc != 0)
      return kv_mdb_fail(mrc, "put prior");
  }
  kv_ctxstats r;
  kvdb_status rc = kv_cat_get_ctxstats(c, txn, key, &r);
  if (rc == KVDB_NOTFOUND || rc == KVDB_CORRUPT) { /* as kv_cat_touch_ctxstats starts one */
    kv_clear_error();
    memset(&r, 0, sizeof r);
    r.tier = KVDB_TIER_SSD;
    r.freq_ms = now_ms;
  } else if (rc != KVDB_OK) {
    return rc;
  }
  r.prior = p->prior;
  KV_RET(kv_cat_put_ctxstats(c, txn, key, &r));
  rc = kv_cat_del_profile(c, txn, key); /* an older one would take precedence */
  return rc == KVDB_NOTFOUND ? KVDB_OK : rc;
}

void kv_profile_rec_mark_stored(kv_profile_rec *p, const kvdb_config *cfg, uint64_t bytes)
{
  uint32_t i;
  for (uint32_t k = 0; k < p->n_entries; k++)
    p->e[k].flags &= ~(uint32_t)KVDB_PROFILE_STORED;
  for (i = 0; i < p->n_entries && !kv_policy_config_equal(&p->e[i].config, cfg); i++)
    ;
  if (i == p->n_entries) {
    if (p->n_entries == KV_PROFILE_MAX_ENTRIES)
      return;
    memset(&p->e[i], 0, sizeof p->e[i]);
    p->e[i].config = *cfg;
    p->e[i].quality = p->e[i].cosine = kv_policy_config_exact(cfg) ? 1.0 : NAN;
    p->e[i].worst_head = p->e[i].quality;
    p->e[i].reported_quality = NAN;
    p->e[i].n_probes = p->n_probes;
    p->n_entries++;
  }
  p->e[i].flags |= KVDB_PROFILE_STORED | KVDB_PROFILE_EXACT;
  p->e[i].bytes = bytes;
}

kvdb_status kv_cat_get_profile(kv_catalog *c, kv_txn *txn, const uint8_t key[16],
                               kv_profile_rec *r)
{
  kvdb_status rc = kv_cat_get_profile_rec(c, txn, key, r);
  if (rc != KVDB_NOTFOUND)
    return rc;
  kv_ctxstats cs;
  kv_ctx_rec cr;
  if (kv_cat_get_ctxstats(c, txn, key, &cs) != KVDB_OK || cs.prior == 0 ||
      kv_cat_get_prior(c, txn, cs.prior, r) != KVDB_OK ||
      kv_cat_get_ctx(c, txn, key, &cr) != KVDB_OK) {
    kv_clear_error(); /* advisory: no profile */
    return KVDB_NOTFOUND;
  }
  for (uint32_t i = 0; i < r->n_entries; i++) {
    double b = r->prior_bpt[i] * (double)cr.n_tokens;
    r->e[i].bytes = b >= 1 ? (uint64_t)llround(b) : 1;
  }
  r->prior = cs.prior;
  kv_profile_rec_mark_stored(r, &cr.config, cr.bytes);
  return KVDB_OK;
}
