/* SPDX-License-Identifier: MIT */
/*
 * engine/catalog/iter.c — the typed catalog API's tables, iterators and raw entries
 * (catalog.h, THE TYPED CATALOG API): the LMDB cursors and puts of the layers above.
 */
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>

#include "catalog_int.h"

/* The database of table t; 0 when the catalog lacks it (an older format opened read-only). */
static int tbl_dbi(const kv_catalog *c, kv_cat_table t, MDB_dbi *d)
{
  switch (t) {
  case KV_TBL_META:
    *d = c->meta;
    return 1;
  case KV_TBL_MODELS:
    *d = c->models;
    return 1;
  case KV_TBL_BLOCKS:
    *d = c->blocks;
    return 1;
  case KV_TBL_CONTEXTS:
    *d = c->contexts;
    return 1;
  case KV_TBL_ATIME:
    *d = c->atime;
    return 1;
  case KV_TBL_SEGMENTS:
    *d = c->segments;
    return 1;
  case KV_TBL_PROFILES:
    *d = c->profiles;
    return c->has_profiles;
  case KV_TBL_CTXSTATS:
    *d = c->ctxstats;
    return c->has_ctxstats;
  case KV_TBL_NEXT:
    *d = c->next;
    return c->has_index;
  case KV_TBL_SEGBLOCKS:
    *d = c->segblocks;
    return c->has_index;
  case KV_TBL_CHILDREN:
    *d = c->children;
    return c->has_children;
  }
  return 0;
}

static const char *tbl_name(kv_cat_table t)
{
  static const char *const names[] = {"meta",    "models",   "blocks", "contexts",
                                      "atime",   "segments", "profiles", "ctxstats",
                                      "next",    "segblocks", "children"};
  return (unsigned)t < sizeof names / sizeof names[0] ? names[t] : "?";
}

/* ---- iterators ---- */

enum { IT_BEFORE = 0, IT_PENDING = 1, IT_GOING = 2, IT_END = 3 };

static void it_set(kv_cat_iter *it, const MDB_val *k, const MDB_val *v)
{
  it->key.data = k->mv_data;
  it->key.size = k->mv_size;
  it->val.data = v->mv_data;
  it->val.size = v->mv_size;
}

/* mrc of a cursor step: 1 with an entry, 0 at the end (err KVDB_OK) or on a failure (err) */
static int it_step(kv_cat_iter *it, int mrc, const MDB_val *k, const MDB_val *v)
{
  if (mrc == 0) {
    it_set(it, k, v);
    return 1;
  }
  it->state_ = IT_END;
  if (mrc != MDB_NOTFOUND)
    it->err = kv_mdb_fail(mrc, it->what_);
  return 0;
}

static kvdb_status it_open(kv_catalog *c, kv_txn *txn, kv_cat_table t, kv_cat_iter *it,
                           const char *what)
{
  memset(it, 0, sizeof *it);
  it->what_ = what;
  MDB_dbi d;
  if (!tbl_dbi(c, t, &d)) {
    it->state_ = IT_END;
    return KVDB_OK;
  }
  MDB_cursor *cur;
  kvdb_status rc = kv_cursor_open(kv_mtxn(txn), d, &cur, what);
  if (rc != KVDB_OK) {
    it->state_ = IT_END; /* kv_cat_iter_next says 0, kv_cat_iter_close does nothing */
    return rc;
  }
  it->cur_ = cur;
  return KVDB_OK;
}

kvdb_status kv_cat_iter_open(kv_catalog *c, kv_txn *txn, kv_cat_table t, kv_cat_iter *it,
                             const char *what)
{
  return it_open(c, txn, t, it, what);
}

kvdb_status kv_cat_iter_open_dups(kv_catalog *c, kv_txn *txn, kv_cat_table t, const void *key,
                                  size_t key_len, kv_cat_iter *it, const char *what)
{
  KV_RET(it_open(c, txn, t, it, what));
  it->dups_ = 1;
  if (it->cur_ == NULL)
    return KVDB_OK;
  MDB_val k = {key_len, (void *)(uintptr_t)key}, v;
  int mrc = mdb_cursor_get(it->cur_, &k, &v, MDB_SET_KEY);
  if (it_step(it, mrc, &k, &v))
    it->state_ = IT_PENDING; /* the first value, handed out by the first kv_cat_iter_next */
  if (it->err != KVDB_OK) {
    kvdb_status rc = it->err;
    kv_cat_iter_close(it);
    return rc;
  }
  return KVDB_OK;
}

kvdb_status kv_cat_iter_seg_index(kv_catalog *c, kv_txn *txn, uint64_t seg, kv_cat_iter *it,
                                  const char *what)
{
  uint8_t sk[8];
  kv_be64(sk, seg);
  return kv_cat_iter_open_dups(c, txn, KV_TBL_SEGBLOCKS, sk, 8, it, what);
}

int kv_cat_iter_next(kv_cat_iter *it)
{
  MDB_val k, v;
  switch (it->state_) {
  case IT_PENDING:
    it->state_ = IT_GOING;
    return 1;
  case IT_BEFORE:
    it->state_ = IT_GOING;
    return it_step(it, mdb_cursor_get(it->cur_, &k, &v, MDB_FIRST), &k, &v);
  case IT_GOING:
    return it_step(it, mdb_cursor_get(it->cur_, &k, &v, it->dups_ ? MDB_NEXT_DUP : MDB_NEXT),
                   &k, &v);
  default:
    return 0;
  }
}

kvdb_status kv_cat_iter_del(kv_cat_iter *it)
{
  if (it->cur_ == NULL || it->state_ != IT_GOING)
    return kv_fail(KVDB_MISUSE, "catalog: %s: delete without a current entry", it->what_);
  int mrc = mdb_cursor_del(it->cur_, 0);
  return mrc == 0 ? KVDB_OK : kv_mdb_fail(mrc, it->what_);
}

void kv_cat_iter_close(kv_cat_iter *it)
{
  if (it->cur_ != NULL)
    mdb_cursor_close(it->cur_);
  it->cur_ = NULL;
  it->state_ = IT_END;
}

kvdb_status kv_cat_iter_block(const kv_cat_iter *it, kv_block_rec *r)
{
  if (it->key.size != 16)
    return kv_fail(KVDB_CORRUPT, "block key of %zu bytes", it->key.size);
  return kv_block_rec_decode(it->val.data, it->val.size, r);
}

kvdb_status kv_cat_iter_ctx(const kv_cat_iter *it, kv_ctx_rec *r)
{
  if (it->key.size != 16)
    return kv_fail(KVDB_CORRUPT, "context key of %zu bytes", it->key.size);
  return kv_ctx_rec_decode(it->val.data, it->val.size, r);
}

kvdb_status kv_cat_iter_seg(const kv_cat_iter *it, uint64_t *id, kv_seg_rec *r)
{
  if (it->key.size != 8)
    return kv_fail(KVDB_CORRUPT, "segment key of %zu bytes", it->key.size);
  *id = kv_get_be64(it->key.data);
  return kv_seg_rec_decode(it->val.data, it->val.size, r);
}

/* ---- raw entries ---- */

kvdb_status kv_cat_count(kv_catalog *c, kv_txn *txn, kv_cat_table t, uint64_t *n)
{
  MDB_dbi d;
  MDB_stat ms;
  *n = 0;
  if (!tbl_dbi(c, t, &d))
    return KVDB_OK;
  int mrc = mdb_stat(kv_mtxn(txn), d, &ms);
  if (mrc != 0)
    return kv_mdb_fail(mrc, tbl_name(t));
  *n = ms.ms_entries;
  return KVDB_OK;
}

kvdb_status kv_cat_get_raw(kv_catalog *c, kv_txn *txn, kv_cat_table t, const void *key,
                           size_t key_len, kv_cat_bytes *val)
{
  MDB_dbi d;
  if (!tbl_dbi(c, t, &d))
    return KVDB_NOTFOUND;
  MDB_val k = {key_len, (void *)(uintptr_t)key}, v;
  int mrc = mdb_get(kv_mtxn(txn), d, &k, &v);
  if (mrc == MDB_NOTFOUND)
    return KVDB_NOTFOUND;
  if (mrc != 0)
    return kv_mdb_fail(mrc, tbl_name(t));
  val->data = v.mv_data;
  val->size = v.mv_size;
  return KVDB_OK;
}

kvdb_status kv_cat_put_raw(kv_catalog *c, kv_txn *txn, kv_cat_table t, const void *key,
                           size_t key_len, const void *val, size_t val_len, const char *what)
{
  MDB_dbi d;
  if (!tbl_dbi(c, t, &d))
    return kv_fail(KVDB_READONLY, "catalog: %s: the catalog has no %s database (an older "
                   "format opened read-only)", what, tbl_name(t));
  MDB_val k = {key_len, (void *)(uintptr_t)key}, v = {val_len, (void *)(uintptr_t)val};
  int mrc = mdb_put(kv_mtxn(txn), d, &k, &v, 0);
  return mrc == 0 ? KVDB_OK : kv_mdb_fail(mrc, what);
}

kvdb_status kv_cat_del_raw(kv_catalog *c, kv_txn *txn, kv_cat_table t, const void *key,
                           size_t key_len, const char *what)
{
  MDB_dbi d;
  if (!tbl_dbi(c, t, &d))
    return KVDB_NOTFOUND;
  MDB_val k = {key_len, (void *)(uintptr_t)key};
  int mrc = mdb_del(kv_mtxn(txn), d, &k, NULL);
  if (mrc == MDB_NOTFOUND)
    return KVDB_NOTFOUND;
  return mrc == 0 ? KVDB_OK : kv_mdb_fail(mrc, what);
}

/* ---- typed puts and deletes ---- */

#define KV_PUT_BLOCK_STACK_TOKENS 1024u

kvdb_status kv_cat_put_block(kv_catalog *c, kv_txn *txn, const uint8_t hash[16],
                             const kv_block_rec *r)
{
  uint8_t stk[72 + 4 * KV_PUT_BLOCK_STACK_TOKENS];
  size_t len = kv_block_rec_size(r->n_tokens);
  uint8_t *b = len <= sizeof stk ? stk : malloc(len);
  if (b == NULL)
    return kv_fail(KVDB_NOMEM, "block record of %zu bytes", len);
  kv_block_rec_encode(r, NULL, b);
  kvdb_status rc = kv_cat_put_raw(c, txn, KV_TBL_BLOCKS, hash, 16, b, len, "put block");
  if (b != stk)
    free(b);
  return rc;
}

kvdb_status kv_cat_del_block(kv_catalog *c, kv_txn *txn, const uint8_t hash[16])
{
  return kv_cat_del_raw(c, txn, KV_TBL_BLOCKS, hash, 16, "delete block");
}

kvdb_status kv_cat_del_ctx(kv_catalog *c, kv_txn *txn, const uint8_t key[16])
{
  return kv_cat_del_raw(c, txn, KV_TBL_CONTEXTS, key, 16, "delete context");
}

kvdb_status kv_cat_del_profile(kv_catalog *c, kv_txn *txn, const uint8_t key[16])
{
  return kv_cat_del_raw(c, txn, KV_TBL_PROFILES, key, 16, "delete profile");
}

kvdb_status kv_cat_del_atime(kv_catalog *c, kv_txn *txn, const uint8_t key[16],
                             const uint64_t *ms)
{
  kvdb_status rc = KVDB_NOTFOUND;
  if (ms != NULL) {
    uint8_t ak[24];
    kv_be64(ak, *ms);
    memcpy(ak + 8, key, 16);
    rc = kv_cat_del_raw(c, txn, KV_TBL_ATIME, ak, 24, "delete access time");
  }
  if (rc != KVDB_NOTFOUND)
    return rc;
  /* not where the time says (or no time): look for its entry */
  kv_cat_iter it;
  KV_RET(kv_cat_iter_open(c, txn, KV_TBL_ATIME, &it, "delete access time"));
  while (kv_cat_iter_next(&it)) {
    if (it.key.size == 24 && memcmp(it.key.data + 8, key, 16) == 0) {
      rc = kv_cat_iter_del(&it);
      break;
    }
  }
  if (rc == KVDB_NOTFOUND && it.err != KVDB_OK)
    rc = it.err;
  kv_cat_iter_close(&it);
  return rc;
}
