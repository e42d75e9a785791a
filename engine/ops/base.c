/* SPDX-License-Identifier: MIT */
/*
 * engine/ops/base.c — what the operations share (ops_int.h, and ops.h for the floors above):
 * model ids and records (kv_model_id_check, kv_model_known, kv_model_rec_of, kv_model_rec_load,
 * kv_model_by_hash), a context's record and blocks as a read
 * finds them (kv_ctx_of_model, kv_ctx_block), and the snapshot-and-retry loop of the reads
 * (kv_read_begin, kv_read_again, kv_gen_moved).
 */
#include <stdlib.h>
#include <string.h>

#include "ops_int.h"

/* ---- model records ---- */

kvdb_status kv_model_id_check(const char *id)
{
  size_t len = strlen(id);
  if (len < 1 || len > 63)
    return kv_fail(KVDB_INVALID, "model id of %zu bytes (1..63)", len);
  return KVDB_OK;
}

kvdb_status kv_model_known(kvdb *db, kv_txn *txn, const kvdb_model *m, uint32_t bt,
                           const uint8_t mh[16])
{
  kv_model_rec mr;
  KV_RET(kv_cat_get_model(&db->cat, txn, m->id, &mr));
  if (memcmp(mr.hash, mh, 16) != 0)
    return kv_fail(KVDB_MISMATCH,
                   "model '%s' is stored with n_layers %u, n_kv_heads %u, head_dim %u, dtype %u, "
                   "block_tokens %u, score_bits %u; this call has %u, %u, %u, %u, %u, %u",
                   m->id, mr.n_layers, mr.n_kv_heads, mr.head_dim, mr.dtype, mr.block_tokens,
                   mr.score_bits, m->n_layers, m->n_kv_heads, m->head_dim, (unsigned)m->dtype, bt,
                   m->score_bits);
  return KVDB_OK;
}

void kv_model_rec_of(const kvdb_model *m, uint32_t bt, const uint8_t mh[16], kv_model_rec *mr)
{
  *mr = (kv_model_rec){.n_layers = m->n_layers, .n_kv_heads = m->n_kv_heads,
                       .head_dim = m->head_dim, .dtype = (uint32_t)m->dtype, .block_tokens = bt,
                       .score_bits = m->score_bits, .rope_base = m->rope_base,
                       .rope_style = m->rope_style};
  memcpy(mr->hash, mh, 16);
}

kvdb_status kv_model_rec_load(kvdb *db, kv_txn *txn, const kvdb_model *m, uint32_t bt,
                              const uint8_t mh[16], kv_model_rec *mr, int *stored)
{
  kvdb_status rc = kv_model_known(db, txn, m, bt, mh);
  if (rc == KVDB_OK) /* the stored record's fields (its RoPE, its parts' sizes) */
    rc = kv_cat_get_model(&db->cat, txn, m->id, mr);
  *stored = rc == KVDB_OK;
  if (rc == KVDB_NOTFOUND) {
    kv_model_rec_of(m, bt, mh, mr);
    rc = KVDB_OK;
  }
  return rc;
}

kvdb_status kv_model_by_hash(kvdb *db, kv_txn *txn, const uint8_t mh[16], char id[64],
                             kv_model_rec *rec)
{
  kv_cat_iter it;
  KV_RET(kv_cat_iter_open(&db->cat, txn, KV_TBL_MODELS, &it, "open model cursor"));
  kvdb_status rc = KVDB_NOTFOUND; /* also when the scan ends on a failure */
  while (kv_cat_iter_next(&it)) {
    kv_model_rec mr;
    if (kv_model_rec_decode(it.val.data, it.val.size, &mr) == KVDB_OK &&
        memcmp(mr.hash, mh, 16) == 0) {
      size_t n = it.key.size < 63 ? it.key.size : 63;
      memcpy(id, it.key.data, n);
      id[n] = 0;
      if (rec != NULL)
        *rec = mr;
      rc = KVDB_OK;
      break;
    }
  }
  kv_cat_iter_close(&it);
  return rc;
}

/* ---- a context as a read finds it ---- */

kvdb_status kv_ctx_of_model(kvdb *db, kv_txn *txn, const uint8_t key[16],
                            const uint8_t model_hash[16], const kvdb_model *m, kv_ctx_rec *out)
{
  char hx[33];
  uint32_t bt = m->block_tokens ? m->block_tokens : 256;
  kvdb_status rc = kv_model_known(db, txn, m, bt, model_hash);
  if (rc != KVDB_OK && rc != KVDB_NOTFOUND)
    return rc; /* MISMATCH: the id is stored with another shape (both named) */
  rc = kv_cat_get_ctx(&db->cat, txn, key, out);
  if (rc == KVDB_NOTFOUND)
    return kv_fail(KVDB_NOTFOUND, "no context %s", kv_hex16(key, hx));
  if (rc == KVDB_OK && memcmp(out->model, model_hash, 16) != 0)
    return kv_fail(KVDB_MISMATCH, "context %s belongs to another model shape than '%s'%s",
                   kv_hex16(key, hx), m->id,
                   m->score_bits ? " (with its score_bits: they are part of the shape)" : "");
  return rc;
}

kvdb_status kv_ctx_block(kvdb *db, kv_txn *txn, const uint8_t key[16], const uint8_t hash[16],
                         kv_block_rec *out)
{
  kvdb_status rc = kv_cat_get_block(&db->cat, txn, hash, out);
  if (rc == KVDB_OK)
    return KVDB_OK;
  char hx[33], hb[33];
  return kv_fail(rc == KVDB_NOTFOUND ? KVDB_CORRUPT : rc, "context %s lists block %s, which %s",
                 kv_hex16(key, hx), kv_hex16(hash, hb),
                 rc == KVDB_NOTFOUND ? "is missing" : kvdb_errmsg());
}

/* ---- snapshot and retry ---- */

int kv_gen_moved(kvdb *db, uint64_t gen)
{
  kv_txn *txn;
  uint64_t now = gen;
  if (kv_txn_begin(&db->cat, 0, &txn) != KVDB_OK)
    return 0;
  kv_cat_get_u64(&db->cat, txn, "gen", &now);
  kv_txn_abort(txn);
  return now != gen;
}

kvdb_status kv_read_begin(kvdb *db, kv_read_snap *s)
{
  KV_RET(kv_txn_begin(&db->cat, 0, &s->txn));
  kv_files_prune(db, s->txn);
  s->gen = 0;
  kv_cat_get_u64(&db->cat, s->txn, "gen", &s->gen);
  return KVDB_OK;
}

int kv_read_again(kvdb *db, kv_read_snap *s, int failed)
{
  if (!failed || s->tries >= KV_READ_RETRIES)
    return 0;
  s->tries++;
  return kv_gen_moved(db, s->gen);
}
