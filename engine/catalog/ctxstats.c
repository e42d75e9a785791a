/* SPDX-License-Identifier: MIT */
/*
 * engine/catalog/ctxstats.c — the ctxstats record codec and the policy's meta entries
 * (catalog.h CTXSTATS, FORMAT.md §2).
 *
 * ctxstats record (32 bytes, little-endian):
 *   0 u8 version (1) | 1 u8 flags (bit 0 cached in DRAM) | 2 u8 tier | 3 u8 reserved (0) |
 *   4 u32 reserved (0) | 8 f64 frequency | 16 u64 frequency as of (Unix ms) | 24 u64 accesses
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "catalog_int.h"

void kv_ctxstats_encode(const kv_ctxstats *r, uint8_t dst[KV_CTXSTATS_REC_BYTES])
{
  memset(dst, 0, KV_CTXSTATS_REC_BYTES);
  dst[0] = KV_CTXSTATS_REC_VERSION;
  dst[1] = (uint8_t)r->flags;
  dst[2] = (uint8_t)r->tier;
  kv_put_lef64(dst + 8, r->freq);
  kv_put_le64(dst + 16, r->freq_ms);
  kv_put_le64(dst + 24, r->accesses);
}

kvdb_status kv_ctxstats_decode(const uint8_t *src, size_t len, kv_ctxstats *r)
{
  if (len != KV_CTXSTATS_REC_BYTES)
    return kv_fail(KVDB_CORRUPT, "ctxstats record is %zu bytes, not %u", len,
                   KV_CTXSTATS_REC_BYTES);
  if (src[0] == 0)
    return kv_fail(KVDB_CORRUPT, "ctxstats record version 0");
  if (src[0] > KV_CTXSTATS_REC_VERSION)
    return kv_fail(KVDB_VERSION, "ctxstats record version %u is newer than %u", src[0],
                   KV_CTXSTATS_REC_VERSION);
  r->flags = src[1];
  r->tier = src[2];
  r->freq = kv_get_lef64(src + 8);
  r->freq_ms = kv_get_le64(src + 16);
  r->accesses = kv_get_le64(src + 24);
  if ((r->flags & ~(uint32_t)KV_CTXS_CACHED) != 0 || src[3] != 0 || kv_get_le32(src + 4) != 0 ||
      r->tier < KVDB_TIER_SSD || r->tier >= KVDB_TIER_COUNT || !isfinite(r->freq) || r->freq < 0)
    return kv_fail(KVDB_CORRUPT, "ctxstats record has flags %u, tier %u, frequency %g", r->flags,
                   r->tier, r->freq);
  return KVDB_OK;
}

double kv_ctxstats_freq_at(const kv_ctxstats *r, uint64_t now_ms, double half_life_ms)
{
  if (!(half_life_ms > 0) || now_ms <= r->freq_ms)
    return r->freq;
  return r->freq * exp2(-(double)(now_ms - r->freq_ms) / half_life_ms);
}

kvdb_status kv_cat_get_ctxstats(kv_catalog *c, kv_txn *txn, const uint8_t key[16],
                                kv_ctxstats *r)
{
  if (!c->has_ctxstats)
    return KVDB_NOTFOUND;
  MDB_val k = {16, (void *)(uintptr_t)key}, v;
  int mrc = mdb_get(kv_mtxn(txn), c->ctxstats, &k, &v);
  if (mrc == MDB_NOTFOUND)
    return KVDB_NOTFOUND;
  if (mrc != 0)
    return kv_mdb_fail(mrc, "get ctxstats");
  return kv_ctxstats_decode(v.mv_data, v.mv_size, r);
}

kvdb_status kv_cat_put_ctxstats(kv_catalog *c, kv_txn *txn, const uint8_t key[16],
                                const kv_ctxstats *r)
{
  if (!c->has_ctxstats)
    return kv_fail(KVDB_READONLY, "the catalog has no ctxstats database (opened read-only)");
  uint8_t b[KV_CTXSTATS_REC_BYTES];
  kv_ctxstats_encode(r, b);
  MDB_val k = {16, (void *)(uintptr_t)key}, v = {sizeof b, b};
  int mrc = mdb_put(kv_mtxn(txn), c->ctxstats, &k, &v, 0);
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
