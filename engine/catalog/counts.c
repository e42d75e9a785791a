/* SPDX-License-Identifier: MIT */
/*
 * engine/catalog/counts.c — the counters kvdb_stat reads (catalog.h, COUNTS).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <string.h>

#include "catalog_int.h"

#define META_COUNTS "counts"

void kv_counts_encode(uint64_t stamp, const kv_counts *k, uint8_t b[KV_COUNTS_BYTES])
{
  memset(b, 0, 16);
  b[0] = 1;
  kv_put_le64(b + 8, stamp);
  uint8_t *p = b + 16;
  for (uint32_t t = 0; t < KVDB_TIER_COUNT; t++)
    for (unsigned f = 0; f < KV_CNT_N; f++, p += 8)
      kv_put_le64(p, k->v[t][f]);
}

kvdb_status kv_counts_decode(const uint8_t *b, size_t len, uint64_t *stamp, kv_counts *k)
{
  if (len != KV_COUNTS_BYTES || b[0] != 1)
    return kv_fail(KVDB_CORRUPT, "catalog meta 'counts' is %zu bytes of version %u, not %d of 1",
                   len, len > 0 ? b[0] : 0, KV_COUNTS_BYTES);
  for (int i = 1; i < 8; i++)
    if (b[i] != 0)
      return kv_fail(KVDB_CORRUPT, "catalog meta 'counts' has reserved byte %d set", i);
  *stamp = kv_get_le64(b + 8);
  const uint8_t *p = b + 16;
  for (uint32_t t = 0; t < KVDB_TIER_COUNT; t++)
    for (unsigned f = 0; f < KV_CNT_N; f++, p += 8)
      k->v[t][f] = kv_get_le64(p);
  return KVDB_OK;
}

/* The record in txn: *have = 1 when it decodes (with its stamp), else 0. */
static kvdb_status load(kv_catalog *c, kv_txn *txn, kv_counts *k, uint64_t *stamp, int *have)
{
  MDB_val key = {sizeof META_COUNTS - 1, (void *)(uintptr_t)META_COUNTS}, v;
  *have = 0;
  int mrc = mdb_get(kv_mtxn(txn), c->meta, &key, &v);
  if (mrc == MDB_NOTFOUND)
    return KVDB_OK;
  if (mrc != 0)
    return kv_mdb_fail(mrc, "get counts");
  if (kv_counts_decode(v.mv_data, v.mv_size, stamp, k) != KVDB_OK) {
    kv_clear_error(); /* a damaged record is stale: recounted */
    return KVDB_OK;
  }
  *have = 1;
  return KVDB_OK;
}

static kvdb_status store(kv_catalog *c, kv_txn *txn, uint64_t stamp, const kv_counts *k)
{
  uint8_t b[KV_COUNTS_BYTES];
  kv_counts_encode(stamp, k, b);
  MDB_val key = {sizeof META_COUNTS - 1, (void *)(uintptr_t)META_COUNTS}, v = {sizeof b, b};
  int mrc = mdb_put(kv_mtxn(txn), c->meta, &key, &v, 0);
  return mrc == 0 ? KVDB_OK : kv_mdb_fail(mrc, "put counts");
}

/* The record in write transaction txn: *cur = 1 when it decodes and is current (kept by this
 * transaction or by the last commit), else 0. */
static kvdb_status load_w(kv_catalog *c, kv_txn *txn, kv_counts *k, int *cur)
{
  uint64_t stamp = 0, id = mdb_txn_id(kv_mtxn(txn));
  int have;
  KV_RET(load(c, txn, k, &stamp, &have));
  *cur = have && (stamp == id || stamp + 1 == id);
  return KVDB_OK;
}

kvdb_status kv_counts_get(kv_catalog *c, kv_txn *txn, kv_counts *out)
{
  uint64_t stamp = 0;
  int have;
  KV_RET(load(c, txn, out, &stamp, &have));
  return have && stamp == mdb_txn_id(kv_mtxn(txn)) ? KVDB_OK : KVDB_NOTFOUND;
}

uint32_t kv_cat_ctx_tier(kv_catalog *c, kv_txn *txn, const kv_ctx_rec *cr)
{
  kv_block_rec br;
  if (cr->n_blocks == 0 ||
      kv_cat_get_block(c, txn, cr->blocks + 16 * ((size_t)cr->n_blocks - 1), &br) != KVDB_OK) {
    kv_clear_error();
    return KVDB_TIER_SSD;
  }
  return br.tier;
}

kvdb_status kv_counts_recount(kv_catalog *c, kv_txn *txn, kv_counts *out)
{
  memset(out, 0, sizeof *out);
  MDB_cursor *cur;
  MDB_val k, v;
  kvdb_status rc = KVDB_OK;
  int mrc = mdb_cursor_open(kv_mtxn(txn), c->segments, &cur);
  if (mrc != 0)
    return kv_mdb_fail(mrc, "open segment cursor");
  for (mrc = mdb_cursor_get(cur, &k, &v, MDB_FIRST); mrc == 0 && rc == KVDB_OK;
       mrc = mdb_cursor_get(cur, &k, &v, MDB_NEXT)) {
    kv_seg_rec sr;
    rc = kv_seg_rec_decode(v.mv_data, v.mv_size, &sr);
    if (rc != KVDB_OK)
      break;
    out->v[sr.tier][KV_CNT_SEGMENTS]++;
    out->v[sr.tier][KV_CNT_SEG_BYTES] += sr.end;
    out->v[sr.tier][KV_CNT_LIVE_BYTES] += sr.live_bytes;
    out->v[sr.tier][KV_CNT_LIVE_BLOCKS] += sr.live_blocks;
  }
  mdb_cursor_close(cur);
  if (rc != KVDB_OK)
    return rc;
  mrc = mdb_cursor_open(kv_mtxn(txn), c->contexts, &cur);
  if (mrc != 0)
    return kv_mdb_fail(mrc, "open context cursor");
  for (mrc = mdb_cursor_get(cur, &k, &v, MDB_FIRST); mrc == 0;
       mrc = mdb_cursor_get(cur, &k, &v, MDB_NEXT)) {
    kv_ctx_rec cr;
    if (kv_ctx_rec_decode(v.mv_data, v.mv_size, &cr) != KVDB_OK) {
      kv_clear_error();
      continue;
    }
    out->v[kv_cat_ctx_tier(c, txn, &cr)][KV_CNT_CONTEXTS]++;
  }
  mdb_cursor_close(cur);
  return KVDB_OK;
}

kvdb_status kv_counts_add(kv_catalog *c, kv_txn *txn, uint32_t tier, unsigned field,
                          int64_t delta)
{
  if (delta == 0 || c->rdonly)
    return KVDB_OK;
  kv_counts k;
  int cur;
  KV_RET(load_w(c, txn, &k, &cur));
  if (!cur)
    return KVDB_OK; /* stale: recounted by the next rebuild */
  if (tier >= KVDB_TIER_COUNT || field >= KV_CNT_N)
    return kv_fail(KVDB_PANIC, "counter %u of tier %u", field, tier);
  uint64_t *x = &k.v[tier][field];
  if (delta < 0 && (uint64_t)(-(delta + 1)) + 1 > *x)
    return store(c, txn, 0, &k); /* below zero: they were wrong; stale from here */
  *x += (uint64_t)delta;
  return store(c, txn, mdb_txn_id(kv_mtxn(txn)), &k);
}

kvdb_status kv_counts_seg(kv_catalog *c, kv_txn *txn, const kv_seg_rec *old,
                          const kv_seg_rec *nw)
{
  if (c->rdonly)
    return KVDB_OK;
  kv_counts k;
  int cur;
  KV_RET(load_w(c, txn, &k, &cur));
  if (!cur)
    return KVDB_OK;
  int bad = 0;
  if (old != NULL) {
    uint64_t *x = k.v[old->tier];
    bad = x[KV_CNT_SEGMENTS] < 1 || x[KV_CNT_SEG_BYTES] < old->end ||
          x[KV_CNT_LIVE_BYTES] < old->live_bytes || x[KV_CNT_LIVE_BLOCKS] < old->live_blocks;
    if (!bad) {
      x[KV_CNT_SEGMENTS]--;
      x[KV_CNT_SEG_BYTES] -= old->end;
      x[KV_CNT_LIVE_BYTES] -= old->live_bytes;
      x[KV_CNT_LIVE_BLOCKS] -= old->live_blocks;
    }
  }
  if (nw != NULL && !bad) {
    uint64_t *x = k.v[nw->tier];
    x[KV_CNT_SEGMENTS]++;
    x[KV_CNT_SEG_BYTES] += nw->end;
    x[KV_CNT_LIVE_BYTES] += nw->live_bytes;
    x[KV_CNT_LIVE_BLOCKS] += nw->live_blocks;
  }
  return store(c, txn, bad ? 0 : mdb_txn_id(kv_mtxn(txn)), &k);
}

kvdb_status kv_counts_invalidate(kv_catalog *c, kv_txn *txn)
{
  kv_counts k;
  uint64_t stamp = 0;
  int have;
  KV_RET(load(c, txn, &k, &stamp, &have));
  return have && stamp != 0 ? store(c, txn, 0, &k) : KVDB_OK;
}

void kv_counts_stamp(kv_catalog *c, kv_txn *txn)
{
  if (c->rdonly)
    return;
  kv_counts k;
  uint64_t stamp = 0;
  int have;
  if (load(c, txn, &k, &stamp, &have) != KVDB_OK) {
    kv_clear_error(); /* left stale; recounted */
    return;
  }
  if (!have || stamp + 1 != mdb_txn_id(kv_mtxn(txn)))
    return; /* stamped by this transaction already, or stale */
  /* a read transaction's snapshot id is the stamp itself (above), so this is a write one;
   * a failure leaves them stale (the commit may still succeed) */
  if (store(c, txn, mdb_txn_id(kv_mtxn(txn)), &k) != KVDB_OK)
    kv_clear_error();
}

kvdb_status kv_counts_put(kv_catalog *c, kv_txn *txn, const kv_counts *k)
{
  return store(c, txn, mdb_txn_id(kv_mtxn(txn)), k);
}

void kv_counts_open(kv_catalog *c)
{
  if (c->rdonly)
    return;
  kv_txn *txn;
  kv_counts k;
  if (kv_txn_begin(c, 0, &txn) != KVDB_OK) {
    kv_clear_error();
    return;
  }
  kvdb_status rc = kv_counts_get(c, txn, &k);
  mdb_txn_abort(kv_mtxn(txn));
  if (rc == KVDB_NOTFOUND && (rc = kv_txn_begin(c, 1, &txn)) == KVDB_OK) {
    int cur;
    rc = load_w(c, txn, &k, &cur);
    if (rc == KVDB_OK && !cur) { /* not rebuilt meanwhile */
      rc = kv_counts_recount(c, txn, &k);
      if (rc == KVDB_OK)
        rc = store(c, txn, mdb_txn_id(kv_mtxn(txn)), &k);
    }
    if (rc == KVDB_OK) { /* kv_txn_commit's stamp and commit (schema.c is above this file) */
      kv_counts_stamp(c, txn);
      rc = kv_txn_commit_base(c, txn);
    } else {
      mdb_txn_abort(kv_mtxn(txn));
    }
  }
  kv_clear_error(); /* best effort: stale counters only make kvdb_stat count (and report a
                       damaged segment record, as it did before the counters) */
}
