/* SPDX-License-Identifier: MIT */
/*
 * engine/track/atime.c — access times of contexts (the LRU order of put's eviction, and with
 * placement on each access counts): reads note them in the handle (kv_note_access, under
 * db->mu), and the next write transaction writes them (kv_flush_atime).
 */
#include <stdlib.h>
#include <string.h>

#include "track.h"

void kv_note_access(kvdb *db, const uint8_t key[16])
{
  pthread_mutex_lock(&db->mu);
  if (db->n_pending == db->cap_pending) {
    size_t cap = db->cap_pending ? db->cap_pending * 2 : 64;
    if (cap > 4096)
      cap = 4096;
    kv_atime *n = cap > db->cap_pending ? realloc(db->pending, cap * sizeof *n) : NULL;
    if (n != NULL) {
      db->pending = n;
      db->cap_pending = cap;
    } else {
      db->n_pending = 0; /* full: forget the oldest batch; access times are advisory */
    }
  }
  if (db->cap_pending == 0) { /* no memory for even the first batch: forget this one */
    pthread_mutex_unlock(&db->mu);
    return;
  }
  memcpy(db->pending[db->n_pending].key, key, 16);
  db->pending[db->n_pending].ms = kv_now_ms();
  db->n_pending++;
  pthread_mutex_unlock(&db->mu);
}

static kvdb_status set_atime(kvdb *db, MDB_txn *txn, const uint8_t key[16], uint64_t ms)
{
  MDB_val k = {16, (void *)(uintptr_t)key}, v;
  int mrc = mdb_get(txn, db->cat.contexts, &k, &v);
  if (mrc == MDB_NOTFOUND)
    return KVDB_OK;
  if (mrc != 0)
    return kv_mdb_fail(mrc, "get context");
  kv_ctx_rec cr;
  KV_RET(kv_ctx_rec_decode(v.mv_data, v.mv_size, &cr));
  if (ms <= cr.last_access_ms)
    return KVDB_OK;
  uint8_t ak[24];
  kv_atime_key(ak, cr.last_access_ms, key);
  MDB_val akv = {24, ak};
  mdb_del(txn, db->cat.atime, &akv, NULL);
  size_t len = kv_ctx_rec_size(&cr, cr.n_blocks);
  uint8_t *buf = malloc(len);
  if (buf == NULL)
    return kv_fail(KVDB_NOMEM, "context record");
  uint64_t old = cr.last_access_ms;
  (void)old;
  cr.last_access_ms = ms;
  kv_ctx_rec_encode(&cr, cr.blocks, buf);
  MDB_val nv = {len, buf};
  mrc = mdb_put(txn, db->cat.contexts, &k, &nv, 0);
  free(buf);
  if (mrc != 0)
    return kv_mdb_fail(mrc, "put context");
  kv_atime_key(ak, ms, key);
  MDB_val empty = {0, NULL};
  mrc = mdb_put(txn, db->cat.atime, &akv, &empty, 0);
  return mrc == 0 ? KVDB_OK : kv_mdb_fail(mrc, "put access time");
}

kvdb_status kv_flush_atime(kvdb *db, MDB_txn *txn)
{
  pthread_mutex_lock(&db->mu);
  size_t n = db->n_pending;
  kv_atime *p = NULL;
  if (n > 0) {
    p = malloc(n * sizeof *p);
    if (p != NULL)
      memcpy(p, db->pending, n * sizeof *p);
    db->n_pending = 0;
  }
  pthread_mutex_unlock(&db->mu);
  kvdb_status rc = KVDB_OK;
  for (size_t i = 0; p != NULL && i < n && rc == KVDB_OK; i++) {
    rc = set_atime(db, txn, p[i].key, p[i].ms);
    if (rc == KVDB_OK) /* placement on: every access counts (frequency) */
      rc = kv_place_touch(db, txn, p[i].key, p[i].ms);
  }
  free(p);
  if (rc == KVDB_OK) /* placement on: the tiers' hit counts */
    rc = kv_place_flush_stats(db, txn);
  return rc;
}

