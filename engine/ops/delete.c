/* SPDX-License-Identifier: MIT */
/*
 * engine/ops/delete.c — removing contexts: kvdb_delete, and kv_delete_ctx_txn (a context's
 * records and the blocks only it held, in a caller's write transaction: put's LRU eviction and
 * the placer use it too) with kv_seg_unref (one block less in a segment: also re-encoding).
 */
#include <stdlib.h>
#include <string.h>

#include "catalog/catalog.h"
#include "ops_int.h"

/* ---- segment accounting ---- */

kvdb_status kv_seg_unref(kvdb *db, MDB_txn *txn, uint64_t seg, uint64_t bytes)
{
  kv_seg_rec sr;
  KV_RET(kv_cat_get_seg(&db->cat, txn, seg, &sr));
  sr.live_bytes = sr.live_bytes >= bytes ? sr.live_bytes - bytes : 0;
  sr.live_blocks = sr.live_blocks ? sr.live_blocks - 1 : 0;
  return kv_cat_put_seg(&db->cat, txn, seg, &sr);
}

/* ---- delete ---- */

kvdb_status kv_delete_ctx_txn(kvdb *db, MDB_txn *txn, const uint8_t key[16], uint64_t *freed)
{
  *freed = 0;
  kv_ctx_rec cr;
  KV_RET(kv_cat_get_ctx(&db->cat, txn, key, &cr));
  KV_RET(kv_counts_add(&db->cat, txn, kv_cat_ctx_tier(&db->cat, txn, &cr), KV_CNT_CONTEXTS, -1));
  size_t nb = cr.n_blocks;
  uint8_t *blocks = malloc(16 * nb);
  if (blocks == NULL)
    return kv_fail(KVDB_NOMEM, "context blocks");
  memcpy(blocks, cr.blocks, 16 * nb);
  kvdb_status rc = KVDB_OK;
  int mrc;
  uint8_t ak[24];
  kv_atime_key(ak, cr.last_access_ms, key);
  MDB_val akv = {24, ak}, k = {16, (void *)(uintptr_t)key};
  mdb_del(txn, db->cat.atime, &akv, NULL);
  if (db->cat.has_profiles)
    mdb_del(txn, db->cat.profiles, &k, NULL); /* its profile, if one was recorded */
  KV_ERR(kv_cat_del_ctxstats(&db->cat, txn, key)); /* and its access count */
  mrc = mdb_del(txn, db->cat.contexts, &k, NULL);
  if (mrc != 0) {
    rc = kv_mdb_fail(mrc, "delete context");
    goto out;
  }
  for (size_t i = 0; i < nb; i++) {
    const uint8_t *h = blocks + 16 * i;
    kv_block_rec br;
    rc = kv_cat_get_block(&db->cat, txn, h, &br);
    if (rc == KVDB_NOTFOUND) { /* [C1] broken by an earlier fault: nothing to release */
      rc = KVDB_OK;
      continue;
    }
    if (rc != KVDB_OK)
      goto out;
    MDB_val bk = {16, (void *)(uintptr_t)h};
    if (br.refcount > 1) {
      br.refcount--;
      size_t len = kv_block_rec_size(br.n_tokens);
      uint8_t *buf = malloc(len);
      if (buf == NULL) {
        rc = kv_fail(KVDB_NOMEM, "block record");
        goto out;
      }
      kv_block_rec_encode(&br, NULL, buf);
      MDB_val bv = {len, buf};
      mrc = mdb_put(txn, db->cat.blocks, &bk, &bv, 0);
      free(buf);
      if (mrc != 0) {
        rc = kv_mdb_fail(mrc, "put block");
        goto out;
      }
      continue;
    }
    uint64_t seg = br.segment, bytes = br.bytes;
    /* its index entries first: the record's tokens say where they are */
    KV_ERR(kv_idx_child_del(&db->cat, txn, br.parent, h, br.tokens, br.n_tokens));
    KV_ERR(kv_idx_seg_del(&db->cat, txn, seg, h));
    mrc = mdb_del(txn, db->cat.blocks, &bk, NULL);
    if (mrc != 0) {
      rc = kv_mdb_fail(mrc, "delete block");
      goto out;
    }
    KV_ERR(kv_seg_unref(db, txn, seg, bytes));
    *freed += bytes;
    if (db->dram != NULL)
      kv_dram_remove(db->dram, h);
  }
out:
  free(blocks);
  return rc;
}

kvdb_status kvdb_delete(kvdb *db, const kvdb_key *context)
{
  KV_RET(kv_check_db(db));
  if (context == NULL)
    return kv_fail(KVDB_INVALID, "context is NULL");
  if (db->cat.rdonly)
    return kv_fail(KVDB_READONLY, "database '%s' is open read-only", db->dir);
  MDB_txn *txn;
  uint64_t freed;
  KV_RET(kv_txn_begin(&db->cat, 1, &txn));
  kvdb_status rc = kv_delete_ctx_txn(db, txn, context->b, &freed);
  if (rc == KVDB_NOTFOUND) {
    char hx[33];
    rc = kv_fail(KVDB_NOTFOUND, "no context %s", kv_hex16(context->b, hx));
  }
  if (rc != KVDB_OK) {
    mdb_txn_abort(txn);
    return rc;
  }
  return kv_txn_commit(txn);
}

