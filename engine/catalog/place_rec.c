/* SPDX-License-Identifier: MIT */
/*
 * engine/catalog/place_rec.c — the typed catalog functions of the floors seg, track, place
 * and db (catalog.h, "records of seg/track/place"): what those floors read and write in the
 * catalog beyond the typed gets, puts and iterators of iter.c.
 */
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>

#include "catalog_int.h"

int kv_cat_has_ctx(kv_catalog *c, kv_txn *txn, const uint8_t key[16])
{
  MDB_val k = {16, (void *)(uintptr_t)key}, v;
  return mdb_get(kv_mtxn(txn), c->contexts, &k, &v) == 0;
}

kvdb_status kv_cat_ctx_set_access(kv_catalog *c, kv_txn *txn, const uint8_t key[16], uint64_t ms)
{
  MDB_val k = {16, (void *)(uintptr_t)key}, v;
  int mrc = mdb_get(kv_mtxn(txn), c->contexts, &k, &v);
  if (mrc == MDB_NOTFOUND)
    return KVDB_OK;
  if (mrc != 0)
    return kv_mdb_fail(mrc, "get context");
  kv_ctx_rec cr;
  KV_RET(kv_ctx_rec_decode(v.mv_data, v.mv_size, &cr));
  if (ms <= cr.last_access_ms)
    return KVDB_OK;
  uint8_t ak[24]; /* the access-time key: last access (8, BE) || context key */
  kv_be64(ak, cr.last_access_ms);
  memcpy(ak + 8, key, 16);
  MDB_val akv = {24, ak};
  mdb_del(kv_mtxn(txn), c->atime, &akv, NULL);
  size_t len = kv_ctx_rec_size(&cr, cr.n_blocks);
  uint8_t *buf = malloc(len);
  if (buf == NULL)
    return kv_fail(KVDB_NOMEM, "context record");
  cr.last_access_ms = ms;
  kv_ctx_rec_encode(&cr, cr.blocks, buf);
  MDB_val nv = {len, buf};
  mrc = mdb_put(kv_mtxn(txn), c->contexts, &k, &nv, 0);
  free(buf);
  if (mrc != 0)
    return kv_mdb_fail(mrc, "put context");
  kv_be64(ak, ms);
  MDB_val empty = {0, NULL};
  mrc = mdb_put(kv_mtxn(txn), c->atime, &akv, &empty, 0);
  return mrc == 0 ? KVDB_OK : kv_mdb_fail(mrc, "put access time");
}

int kv_cat_peek_meta_str(kv_catalog *c, const char *name, char *buf, size_t cap)
{
  MDB_txn *txn;
  MDB_val k = {strlen(name), (void *)(uintptr_t)name}, v;
  int found = 0;
  if (mdb_txn_begin(kv_menv(c->env), NULL, MDB_RDONLY, &txn) == 0) {
    if (mdb_get(txn, c->meta, &k, &v) == 0 && v.mv_size < cap &&
        memchr(v.mv_data, 0, v.mv_size) == NULL) {
      memcpy(buf, v.mv_data, v.mv_size);
      buf[v.mv_size] = 0;
      found = 1;
    }
    mdb_txn_abort(txn);
  }
  return found;
}
