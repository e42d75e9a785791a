/* SPDX-License-Identifier: MIT */
/*
 * tests/unit/cat_edit.h — white-box damage shared by the tests: rewrite one record of a closed
 * database's catalog in place through LMDB, so that its readers meet an altered or damaged
 * record (a block's tokens, a context's fields, a model record's calibration or gains).
 */
#ifndef CAT_EDIT_H
#define CAT_EDIT_H

#include "kvdb_test.h"
#include "catalog/catalog_int.h"

typedef enum { T_CAT_BLOCKS, T_CAT_CONTEXTS, T_CAT_MODELS } t_cat_table;

/* Record `key` (klen bytes) of `table`: edit changes its bytes and may change *len, growing it
 * by at most 64 bytes. The record must exist. */
static inline void t_cat_edit(const char *dir, t_cat_table table, const void *key, size_t klen,
                              void (*edit)(uint8_t *rec, size_t *len))
{
  kv_catalog c;
  ASSERT_OK(kv_catalog_open(&c, dir, 1ull << 30, 0, 0, 0));
  kv_txn *txn;
  ASSERT_OK(kv_txn_begin(&c, 1, &txn));
  MDB_dbi dbi = table == T_CAT_MODELS ? c.models : table == T_CAT_CONTEXTS ? c.contexts : c.blocks;
  MDB_val k = {klen, (void *)key}, v;
  ASSERT_EQ(mdb_get(kv_mtxn(txn), dbi, &k, &v), 0);
  uint8_t *rec = malloc(v.mv_size + 64);
  ASSERT(rec != NULL);
  memcpy(rec, v.mv_data, v.mv_size);
  size_t len = v.mv_size;
  edit(rec, &len);
  MDB_val nv = {len, rec};
  ASSERT_EQ(mdb_put(kv_mtxn(txn), dbi, &k, &nv, 0), 0);
  ASSERT_OK(kv_txn_commit(txn));
  kv_catalog_close(&c);
  free(rec);
}

#endif
