/* SPDX-License-Identifier: MIT */
/*
 * engine/catalog/place_rec.c — the typed catalog functions of the floors seg, track, place
 * and db (catalog.h, "records of seg/track/place"): what those floors read and write in the
 * catalog beyond the typed gets, puts and iterators of iter.c.
 */
#define _GNU_SOURCE
#include <string.h>

#include "catalog_int.h"

int kv_cat_has_ctx(kv_catalog *c, kv_txn *txn, const uint8_t key[16])
{
  MDB_val k = {16, (void *)(uintptr_t)key}, v;
  return mdb_get(kv_mtxn(txn), c->contexts, &k, &v) == 0;
}

kvdb_status kv_cat_ctx_set_access(kv_catalog *c, kv_txn *txn, const uint8_t key[16], uint64_t ms)
{
  kv_ctx_rec cr;
  kvdb_status rc = kv_cat_get_ctx(c, txn, key, &cr);
  if (rc == KVDB_NOTFOUND)
    return KVDB_OK; /* deleted meanwhile: nothing to stamp */
  KV_RET(rc);
  if (ms <= cr.last_access_ms)
    return KVDB_OK;
  /* the old access-time entry goes (a missing one is no error: the new one replaces it) */
  (void)kv_cat_del_atime_at(c, txn, key, cr.last_access_ms);
  kv_clear_error();
  cr.last_access_ms = ms;
  /* cr.blocks points into the record being replaced: kv_cat_put_ctx encodes before it puts */
  return kv_cat_put_ctx_atime(c, txn, key, &cr, cr.blocks);
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
