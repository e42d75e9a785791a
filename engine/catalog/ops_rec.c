/* SPDX-License-Identifier: MIT */
/*
 * engine/catalog/ops_rec.c — the typed records the operations floor (engine/ops) reads and
 * writes beside those of catalog.c and iter.c: model records, context records with their
 * access-time entries, access-time entries alone, a context's profile's presence
 * (catalog.h, "THE OPERATIONS FLOOR'S RECORDS").
 */
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>

#include "catalog_int.h"
#include "model/model.h" /* KV_CONFIG_BYTES */

/* ---- model records ---- */

/* The stored bytes of model `id`'s record into *v (KVDB_NOTFOUND without a message). */
static kvdb_status model_val(kv_catalog *c, kv_txn *txn, const char *id, MDB_val *v)
{
  MDB_val k = {strlen(id), (void *)(uintptr_t)id};
  int mrc = mdb_get(kv_mtxn(txn), c->models, &k, v);
  if (mrc == MDB_NOTFOUND)
    return KVDB_NOTFOUND;
  return mrc == 0 ? KVDB_OK : kv_mdb_fail(mrc, "get model");
}

kvdb_status kv_cat_get_model(kv_catalog *c, kv_txn *txn, const char *id, kv_model_rec *r)
{
  MDB_val v;
  KV_RET(model_val(c, txn, id, &v));
  return kv_model_rec_decode(v.mv_data, v.mv_size, r);
}

kvdb_status kv_cat_put_model(kv_catalog *c, kv_txn *txn, const char *id, const kv_model_rec *r)
{
  uint8_t buf[64];
  kv_model_rec_encode(r, buf);
  MDB_val k = {strlen(id), (void *)(uintptr_t)id}, v = {kv_model_rec_size(r), buf};
  int mrc = mdb_put(kv_mtxn(txn), c->models, &k, &v, 0);
  return mrc == 0 ? KVDB_OK : kv_mdb_fail(mrc, "put model");
}

kvdb_status kv_cat_put_model_calib(kv_catalog *c, kv_txn *txn, const char *id,
                                   const kv_model_rec *r, const kv_calib *cal)
{
  size_t n = kv_model_rec_calib_size(r, cal);
  uint8_t *buf = malloc(n);
  if (buf == NULL)
    return kv_fail(KVDB_NOMEM, "model record of %zu bytes", n);
  kv_model_rec_encode_calib(r, cal, buf);
  MDB_val k = {strlen(id), (void *)(uintptr_t)id}, v = {n, buf};
  int mrc = mdb_put(kv_mtxn(txn), c->models, &k, &v, 0);
  free(buf);
  return mrc == 0 ? KVDB_OK : kv_mdb_fail(mrc, "put model");
}

kvdb_status kv_cat_put_model_full(kv_catalog *c, kv_txn *txn, const char *id,
                                  const kv_model_rec *r, const kv_calib *cal,
                                  const kv_model_gains *g)
{
  size_t n = kv_model_rec_full_size(r, cal, g);
  uint8_t *buf = malloc(n);
  if (buf == NULL)
    return kv_fail(KVDB_NOMEM, "model record of %zu bytes", n);
  kv_model_rec_encode_full(r, cal, g, buf);
  MDB_val k = {strlen(id), (void *)(uintptr_t)id}, v = {n, buf};
  int mrc = mdb_put(kv_mtxn(txn), c->models, &k, &v, 0);
  free(buf);
  return mrc == 0 ? KVDB_OK : kv_mdb_fail(mrc, "put model");
}

kvdb_status kv_cat_get_model_gains(kv_catalog *c, kv_txn *txn, const char *id,
                                   kv_model_gains *out)
{
  memset(out, 0, sizeof *out);
  MDB_val v;
  KV_RET(model_val(c, txn, id, &v));
  return kv_model_gains_decode(v.mv_data, v.mv_size, out);
}

kvdb_status kv_cat_get_model_calib(kv_catalog *c, kv_txn *txn, const char *id, kv_calib *out)
{
  memset(out, 0, sizeof *out);
  MDB_val v;
  KV_RET(model_val(c, txn, id, &v));
  return kv_model_calib_decode(v.mv_data, v.mv_size, out);
}

/* ---- context records and access times ---- */

/* A context record of up to this many blocks is encoded on the stack (~4 KiB), a longer one
 * in a buffer of its own. */
#define KV_PUT_CTX_STACK_BLOCKS 240u

static void atime_key(uint8_t ak[24], uint64_t ms, const uint8_t key[16])
{
  kv_be64(ak, ms);
  memcpy(ak + 8, key, 16);
}

kvdb_status kv_cat_put_ctx(kv_catalog *c, kv_txn *txn, const uint8_t key[16], const kv_ctx_rec *r,
                           const uint8_t *blocks)
{
  uint8_t stk[56 + KV_CONFIG_BYTES + 16 * KV_PUT_CTX_STACK_BLOCKS];
  size_t len = kv_ctx_rec_size(r, r->n_blocks);
  uint8_t *buf = len <= sizeof stk ? stk : malloc(len);
  if (buf == NULL)
    return kv_fail(KVDB_NOMEM, "context record of %zu bytes", len);
  kv_ctx_rec_encode(r, blocks, buf);
  MDB_val k = {16, (void *)(uintptr_t)key}, v = {len, buf};
  int mrc = mdb_put(kv_mtxn(txn), c->contexts, &k, &v, 0);
  if (buf != stk)
    free(buf);
  return mrc == 0 ? KVDB_OK : kv_mdb_fail(mrc, "put context");
}

kvdb_status kv_cat_put_atime(kv_catalog *c, kv_txn *txn, const uint8_t key[16], uint64_t ms)
{
  uint8_t ak[24];
  atime_key(ak, ms, key);
  MDB_val k = {24, ak}, empty = {0, NULL};
  int mrc = mdb_put(kv_mtxn(txn), c->atime, &k, &empty, 0);
  return mrc == 0 ? KVDB_OK : kv_mdb_fail(mrc, "put access time");
}

kvdb_status kv_cat_put_ctx_atime(kv_catalog *c, kv_txn *txn, const uint8_t key[16],
                                 const kv_ctx_rec *r, const uint8_t *blocks)
{
  KV_RET(kv_cat_put_ctx(c, txn, key, r, blocks));
  return kv_cat_put_atime(c, txn, key, r->last_access_ms);
}

kvdb_status kv_cat_del_atime_at(kv_catalog *c, kv_txn *txn, const uint8_t key[16], uint64_t ms)
{
  uint8_t ak[24];
  atime_key(ak, ms, key);
  MDB_val k = {24, ak};
  int mrc = mdb_del(kv_mtxn(txn), c->atime, &k, NULL);
  return mrc == 0 ? KVDB_OK : kv_mdb_fail(mrc, "delete access time");
}

/* ---- profiles ---- */

int kv_cat_has_profile(kv_catalog *c, kv_txn *txn, const uint8_t key[16])
{
  if (!c->has_profiles)
    return 0;
  MDB_val k = {16, (void *)(uintptr_t)key}, v;
  return mdb_get(kv_mtxn(txn), c->profiles, &k, &v) == 0;
}
