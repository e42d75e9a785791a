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

kvdb_status kv_seg_unref(kvdb *db, kv_txn *txn, uint64_t seg, uint64_t bytes)
{
  kv_seg_rec sr;
  KV_RET(kv_cat_get_seg(&db->cat, txn, seg, &sr));
  sr.live_bytes = sr.live_bytes >= bytes ? sr.live_bytes - bytes : 0;
  sr.live_blocks = sr.live_blocks ? sr.live_blocks - 1 : 0;
  return kv_cat_put_seg(&db->cat, txn, seg, &sr);
}

/* ---- delete ---- */

kvdb_status kv_delete_ctx_txn(kvdb *db, kv_txn *txn, const uint8_t key[16], uint64_t *freed)
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
  kv_cat_del_atime_at(&db->cat, txn, key, cr.last_access_ms); /* [C4]: absent when broken */
  kv_cat_del_profile(&db->cat, txn, key); /* its profile, if one was recorded */
  KV_ERR(kv_cat_del_ctxstats(&db->cat, txn, key)); /* and its access count */
  KV_ERR(kv_cat_del_ctx(&db->cat, txn, key));
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
    if (br.refcount > 1) {
      br.refcount--;
      KV_ERR(kv_cat_put_block(&db->cat, txn, h, &br));
      continue;
    }
    uint64_t seg = br.segment, bytes = br.bytes;
    /* its index entries first: the record's tokens say where they are */
    KV_ERR(kv_idx_child_del(&db->cat, txn, br.parent, h, br.tokens, br.n_tokens));
    KV_ERR(kv_idx_seg_del(&db->cat, txn, seg, h));
    KV_ERR(kv_cat_del_block(&db->cat, txn, h));
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
  kv_txn *txn;
  uint64_t freed;
  KV_RET(kv_txn_begin(&db->cat, 1, &txn));
  kvdb_status rc = kv_delete_ctx_txn(db, txn, context->b, &freed);
  if (rc == KVDB_NOTFOUND) {
    char hx[33];
    rc = kv_fail(KVDB_NOTFOUND, "no context %s", kv_hex16(context->b, hx));
  }
  if (rc != KVDB_OK) {
    kv_txn_abort(txn);
    return rc;
  }
  return kv_txn_commit(txn);
}

