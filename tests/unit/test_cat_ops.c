/* SPDX-License-Identifier: MIT */
/*
 * tests/unit/test_cat_ops.c — the catalog's typed records of the operations floor
 * (engine/catalog/ops_rec.c, catalog.h "THE OPERATIONS FLOOR'S RECORDS"), through the catalog
 * API on a catalog of its own: model records, context records with and without their
 * access-time entries (short ones encoded on the stack, long ones not; blocks that point into
 * the record being replaced), access-time entries alone (a delete at a time where there is no
 * entry finds nothing and leaves the others), the access-time update of place_rec.c, a
 * profile's presence.
 */
#include "kvdb_test.h"

#include "catalog/catalog.h"
#include "kv_common.h"

static void open_cat(kv_catalog *c, const char *dir)
{
  ASSERT_OK(kv_catalog_open(c, dir, 1ull << 30, 0, 1, 1));
}

static int atime_there(kv_catalog *c, kv_txn *txn, const uint8_t key[16], uint64_t ms)
{
  uint8_t ak[24];
  kv_be64(ak, ms);
  memcpy(ak + 8, key, 16);
  kv_cat_bytes v;
  kvdb_status rc = kv_cat_get_raw(c, txn, KV_TBL_ATIME, ak, 24, &v);
  ASSERT(rc == KVDB_OK || rc == KVDB_NOTFOUND);
  return rc == KVDB_OK;
}

static void test_models(const char *dir)
{
  kv_catalog c;
  open_cat(&c, dir);
  kv_txn *txn;
  ASSERT_OK(kv_txn_begin(&c, 1, &txn));
  kv_model_rec r;
  kv_clear_error();
  ASSERT_STATUS(KVDB_NOTFOUND, kv_cat_get_model(&c, txn, "m-a", &r));
  ASSERT_EQ(kvdb_errmsg()[0], 0); /* an absent record is no error */
  kv_model_rec a = {.n_layers = 3, .n_kv_heads = 2, .head_dim = 64, .dtype = 1,
                    .block_tokens = 16, .score_bits = 8};
  for (int i = 0; i < 16; i++)
    a.hash[i] = (uint8_t)(i * 7 + 1);
  ASSERT_OK(kv_cat_put_model(&c, txn, "m-a", &a));
  ASSERT_OK(kv_txn_commit(txn));
  ASSERT_OK(kv_txn_begin(&c, 0, &txn));
  memset(&r, 0, sizeof r);
  ASSERT_OK(kv_cat_get_model(&c, txn, "m-a", &r));
  ASSERT(memcmp(r.hash, a.hash, 16) == 0);
  ASSERT_EQ(r.n_layers, 3);
  ASSERT_EQ(r.n_kv_heads, 2);
  ASSERT_EQ(r.head_dim, 64);
  ASSERT_EQ(r.dtype, 1);
  ASSERT_EQ(r.block_tokens, 16);
  ASSERT_EQ(r.score_bits, 8);
  /* the id is the whole key: a prefix of it is another model */
  ASSERT_STATUS(KVDB_NOTFOUND, kv_cat_get_model(&c, txn, "m-", &r));
  kv_txn_abort(txn);
  /* a record that does not decode is CORRUPT, with a message */
  ASSERT_OK(kv_txn_begin(&c, 1, &txn));
  ASSERT_OK(kv_cat_put_raw(&c, txn, KV_TBL_MODELS, "m-b", 3, "xx", 2, "test"));
  kv_clear_error();
  ASSERT_STATUS(KVDB_CORRUPT, kv_cat_get_model(&c, txn, "m-b", &r));
  ASSERT(kvdb_errmsg()[0] != 0);
  kv_txn_abort(txn);
  kv_catalog_close(&c);
}

/* A context record of n blocks under key[0] = k, put with its access-time entry at ms; read
 * back whole. */
static void put_ctx_check(kv_catalog *c, uint8_t k, uint32_t n, uint64_t ms, int v2)
{
  uint8_t key[16] = {k};
  uint8_t *blocks = malloc(16 * (size_t)n);
  ASSERT(blocks != NULL);
  for (size_t i = 0; i < 16 * (size_t)n; i++)
    blocks[i] = (uint8_t)(i * 31 + k);
  kv_ctx_rec r = {.flags = KV_CTX_EXPLICIT, .n_blocks = n, .n_tokens = 16ull * n,
                  .bytes = 4096ull * n, .created_ms = ms - 5, .last_access_ms = ms};
  if (v2)
    r.config.method = KVDB_METHOD_LOSSLESS;
  memset(r.model, 0xab, 16);
  kv_txn *txn;
  ASSERT_OK(kv_txn_begin(c, 1, &txn));
  ASSERT_OK(kv_cat_put_ctx_atime(c, txn, key, &r, blocks));
  ASSERT_OK(kv_txn_commit(txn));
  ASSERT_OK(kv_txn_begin(c, 0, &txn));
  kv_ctx_rec g;
  ASSERT_OK(kv_cat_get_ctx(c, txn, key, &g));
  ASSERT_EQ(g.flags, KV_CTX_EXPLICIT);
  ASSERT_EQ(g.n_blocks, n);
  ASSERT_EQ(g.n_tokens, 16ull * n);
  ASSERT_EQ(g.bytes, 4096ull * n);
  ASSERT_EQ(g.created_ms, ms - 5);
  ASSERT_EQ(g.last_access_ms, ms);
  ASSERT_EQ(g.config.method, v2 ? KVDB_METHOD_LOSSLESS : KVDB_METHOD_RAW);
  ASSERT(memcmp(g.blocks, blocks, 16 * (size_t)n) == 0);
  ASSERT(atime_there(c, txn, key, ms));
  kv_txn_abort(txn);
  free(blocks);
}

static void test_contexts(const char *dir)
{
  kv_catalog c;
  open_cat(&c, dir);
  put_ctx_check(&c, 1, 1, 1000, 0);
  put_ctx_check(&c, 2, 240, 2000, 1);  /* the most the stack takes */
  put_ctx_check(&c, 3, 241, 3000, 1);  /* one more: a buffer of its own */
  put_ctx_check(&c, 4, 5000, 4000, 0); /* long */

  /* replace context 4's record with one whose blocks are the old record's own bytes in the
   * map (as an access-time update does): the new record has the same blocks */
  uint8_t key[16] = {4};
  kv_txn *txn;
  ASSERT_OK(kv_txn_begin(&c, 1, &txn));
  kv_ctx_rec r;
  ASSERT_OK(kv_cat_get_ctx(&c, txn, key, &r));
  uint8_t *want = malloc(16 * 5000);
  ASSERT(want != NULL);
  memcpy(want, r.blocks, 16 * 5000);
  r.last_access_ms = 4500;
  r.config.method = KVDB_METHOD_LOSSLESS; /* a longer record (version 2) */
  ASSERT_OK(kv_cat_put_ctx(&c, txn, key, &r, r.blocks));
  ASSERT_OK(kv_cat_get_ctx(&c, txn, key, &r));
  ASSERT_EQ(r.n_blocks, 5000);
  ASSERT_EQ(r.last_access_ms, 4500);
  ASSERT(memcmp(r.blocks, want, 16 * 5000) == 0);
  /* kv_cat_put_ctx leaves the access-time entries alone */
  ASSERT(atime_there(&c, txn, key, 4000));
  ASSERT(!atime_there(&c, txn, key, 4500));

  /* the entries alone */
  ASSERT_OK(kv_cat_put_atime(&c, txn, key, 4500));
  ASSERT(atime_there(&c, txn, key, 4500));
  ASSERT_OK(kv_cat_del_atime_at(&c, txn, key, 4000));
  ASSERT(!atime_there(&c, txn, key, 4000));
  kv_clear_error();
  ASSERT_STATUS(KVDB_NOTFOUND, kv_cat_del_atime_at(&c, txn, key, 4000));
  ASSERT_EQ(kvdb_errmsg()[0], 0);
  /* no entry at that time: nothing else is touched (kv_cat_del_atime would scan) */
  ASSERT_STATUS(KVDB_NOTFOUND, kv_cat_del_atime_at(&c, txn, key, 4499));
  ASSERT(atime_there(&c, txn, key, 4500));
  uint64_t n;
  ASSERT_OK(kv_cat_count(&c, txn, KV_TBL_ATIME, &n));
  ASSERT_EQ(n, 4);
  ASSERT_OK(kv_cat_count(&c, txn, KV_TBL_CONTEXTS, &n));
  ASSERT_EQ(n, 4);
  ASSERT_OK(kv_txn_commit(txn));
  free(want);
  kv_catalog_close(&c);
}

/* kv_cat_ctx_set_access (place_rec.c, over the functions above): a later time rewrites the
 * record and moves its access-time entry; an earlier or equal one, or a context that is gone,
 * changes nothing */
static void test_set_access(const char *dir)
{
  kv_catalog c;
  open_cat(&c, dir);
  put_ctx_check(&c, 9, 300, 7000, 1); /* 300 blocks: the record does not fit on the stack */
  uint8_t key[16] = {9}, gone[16] = {99};
  kv_txn *txn;
  kv_ctx_rec r;
  uint64_t n0, n;
  ASSERT_OK(kv_txn_begin(&c, 1, &txn));
  ASSERT_OK(kv_cat_count(&c, txn, KV_TBL_ATIME, &n0));
  ASSERT_OK(kv_cat_ctx_set_access(&c, txn, key, 7500));
  ASSERT_OK(kv_cat_get_ctx(&c, txn, key, &r));
  ASSERT_EQ(r.last_access_ms, 7500);
  ASSERT_EQ(r.n_blocks, 300);
  ASSERT_EQ(r.created_ms, 6995);
  ASSERT_EQ(r.config.method, KVDB_METHOD_LOSSLESS);
  for (size_t i = 0; i < 16 * 300; i++)
    ASSERT_EQ(r.blocks[i], (uint8_t)(i * 31 + 9));
  ASSERT(atime_there(&c, txn, key, 7500));
  ASSERT(!atime_there(&c, txn, key, 7000));
  ASSERT_OK(kv_cat_count(&c, txn, KV_TBL_ATIME, &n));
  ASSERT_EQ(n, n0); /* moved, not added */
  ASSERT_OK(kv_cat_ctx_set_access(&c, txn, key, 7200)); /* earlier: nothing */
  ASSERT_OK(kv_cat_ctx_set_access(&c, txn, key, 7500)); /* equal: nothing */
  ASSERT_OK(kv_cat_get_ctx(&c, txn, key, &r));
  ASSERT_EQ(r.last_access_ms, 7500);
  ASSERT(atime_there(&c, txn, key, 7500));
  ASSERT(!atime_there(&c, txn, key, 7200));
  kv_clear_error();
  ASSERT_OK(kv_cat_ctx_set_access(&c, txn, gone, 9000)); /* gone: nothing, no message */
  ASSERT_EQ(kvdb_errmsg()[0], 0);
  ASSERT(!atime_there(&c, txn, gone, 9000));
  ASSERT_OK(kv_cat_count(&c, txn, KV_TBL_ATIME, &n));
  ASSERT_EQ(n, n0);
  ASSERT_OK(kv_txn_commit(txn));
  kv_catalog_close(&c);
}

static void test_profiles(const char *dir)
{
  kv_catalog c;
  open_cat(&c, dir);
  uint8_t key[16] = {9}, other[16] = {10};
  kv_txn *txn;
  ASSERT_OK(kv_txn_begin(&c, 1, &txn));
  ASSERT_EQ(kv_cat_has_profile(&c, txn, key), 0);
  kv_profile_rec *p = calloc(1, sizeof *p);
  ASSERT(p != NULL);
  p->n_probes = 2;
  p->measured_ms = 77;
  ASSERT_OK(kv_cat_put_profile(&c, txn, key, p));
  ASSERT_EQ(kv_cat_has_profile(&c, txn, key), 1);
  ASSERT_EQ(kv_cat_has_profile(&c, txn, other), 0);
  ASSERT_OK(kv_cat_del_profile(&c, txn, key));
  ASSERT_EQ(kv_cat_has_profile(&c, txn, key), 0);
  kv_txn_abort(txn);
  free(p);
  kv_catalog_close(&c);
}

int main(void)
{
  char *dir = t_tmpdir("catops");
  test_models(dir);
  test_contexts(dir);
  test_set_access(dir);
  test_profiles(dir);
  t_rmdir(dir);
  printf("test_cat_ops: all passed\n");
  return 0;
}
