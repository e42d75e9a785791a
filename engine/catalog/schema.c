/* SPDX-License-Identifier: MIT */
/*
 * engine/catalog/schema.c — the catalog's entry points that keep its schema: open (the
 * databases of each format, and a read-write open's upgrade: the block indexes of index.c),
 * the commit that stamps counts.c's counters, segment records with their counters, and the
 * vacuum that recounts them. Above the catalog's base (catalog.c: environment, transactions,
 * records; iter.c) and its schema users (counts.c, index.c, ctxstats.c), which call the base
 * only: the calls among the catalog's files go one way (LAYERS: catalog-base, catalog-schema,
 * catalog).
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <string.h>

#include "catalog_int.h"

kvdb_status kv_catalog_open(kv_catalog *c, const char *dir, uint64_t map_bytes, int rdonly,
                            int create, int nosync)
{
  KV_RET(kv_cat_env_open(c, dir, map_bytes, rdonly, create, nosync));
  int mrc;
  kv_txn *txn = NULL;
  kvdb_status rc;
  uint64_t fmt = 0;
  /* First a read transaction: check the version before writing anything (KVDB_VERSION). */
  KV_ERR(kv_txn_begin(c, 0, &txn));
  MDB_dbi meta;
  mrc = mdb_dbi_open(kv_mtxn(txn), "meta", 0, &meta);
  int fresh = (mrc == MDB_NOTFOUND);
  if (mrc != 0 && !fresh) {
    rc = kv_mdb_fail(mrc, "open database 'meta'");
    goto out;
  }
  if (!fresh) {
    c->meta = meta;
    uint64_t ver = 0;
    rc = kv_cat_get_u64(c, txn, "format", &ver);
    if (rc == KVDB_NOTFOUND)
      rc = kv_fail(KVDB_CORRUPT, "catalog '%s' has no format version", c->path);
    if (rc != KVDB_OK)
      goto out;
    if (ver > KVDB_FORMAT_VERSION) {
      rc = kv_fail(KVDB_VERSION,
                   "database '%s' has format version %llu; this build reads up to %d", dir,
                   (unsigned long long)ver, KVDB_FORMAT_VERSION);
      goto out;
    }
    fmt = ver;
  }
  if (fresh && rdonly) {
    rc = kv_fail(KVDB_NOTFOUND, "catalog '%s' is empty", c->path);
    goto out;
  }
  if (!fresh) {
    KV_ERR(kv_cat_open_dbs(c, txn, 0));
    if (fmt >= KV_FORMAT_INDEXES && !c->has_index) {
      rc = kv_fail(KVDB_CORRUPT, "catalog '%s' has format %llu but no block indexes", c->path,
                   (unsigned long long)fmt);
      goto out;
    }
    kv_mdb_txn_commit(kv_mtxn(txn)); /* a read txn: makes the dbi handles permanent */
    txn = NULL;
    if ((c->has_profiles && c->has_ctxstats && c->has_priors && c->has_index) || rdonly)
      return KVDB_OK;
    /* an older catalog: add the (empty) profiles and ctxstats databases it lacks, and build
     * the block indexes of format 4 (unless another process did since the read above) */
    KV_ERR(kv_txn_begin(c, 1, &txn));
    if (!c->has_index) {
      int im = mdb_dbi_open(kv_mtxn(txn), "next", MDB_DUPSORT | MDB_DUPFIXED, &c->next);
      if (im == 0)
        im = mdb_dbi_open(kv_mtxn(txn), "segblocks", MDB_DUPSORT | MDB_DUPFIXED, &c->segblocks);
      if (im == 0)
        c->has_index = 1;
      else if (im != MDB_NOTFOUND) {
        rc = kv_mdb_fail(im, "open the block indexes");
        goto out;
      }
      if (!c->has_index)
        KV_ERR(kv_idx_build(c, txn));
    }
    int pm = c->has_profiles ? 0
                             : mdb_dbi_open(kv_mtxn(txn), "profiles", MDB_CREATE, &c->profiles);
    if (pm != 0) {
      rc = kv_mdb_fail(pm, "create database 'profiles'");
      goto out;
    }
    c->has_profiles = 1;
    pm = c->has_ctxstats ? 0 : mdb_dbi_open(kv_mtxn(txn), "ctxstats", MDB_CREATE, &c->ctxstats);
    if (pm != 0) {
      rc = kv_mdb_fail(pm, "create database 'ctxstats'");
      goto out;
    }
    c->has_ctxstats = 1;
    pm = c->has_priors ? 0 : mdb_dbi_open(kv_mtxn(txn), "priors", MDB_CREATE, &c->priors);
    if (pm != 0) {
      rc = kv_mdb_fail(pm, "create database 'priors'");
      goto out;
    }
    c->has_priors = 1;
    rc = kv_txn_commit(txn);
    txn = NULL;
    if (rc == KVDB_OK)
      return KVDB_OK;
    goto out;
  }
  kv_mdb_txn_abort(kv_mtxn(txn));
  txn = NULL;
  KV_ERR(kv_txn_begin(c, 1, &txn));
  KV_ERR(kv_cat_open_dbs(c, txn, MDB_CREATE));
  uint64_t ver = 0;
  if (kv_cat_get_u64(c, txn, "format", &ver) == KVDB_NOTFOUND) {
    /* created at format 4: its block indexes (catalog.h, INDEXES) must be kept by every
     * writer, so builds that know only formats 1-3 refuse it. Other format-2/3 features raise
     * nothing more. */
    KV_ERR(kv_cat_put_u64(c, txn, "format", KV_FORMAT_INDEXES));
    KV_ERR(kv_cat_put_u64(c, txn, "next_segment", 1));
    KV_ERR(kv_cat_put_u64(c, txn, "gen", 1));
    KV_ERR(kv_cat_put_u64(c, txn, "created", kv_now_ms()));
  }
  rc = kv_txn_commit(txn);
  txn = NULL;
  if (rc == KVDB_OK)
    return KVDB_OK;
out:
  if (txn != NULL)
    kv_mdb_txn_abort(kv_mtxn(txn));
  kv_catalog_close(c); /* the environment kv_cat_env_open opened */
  return rc;
}

kvdb_status kv_txn_commit(kv_txn *txn)
{
  kv_catalog *c = kv_txn_catalog(txn);
  if (c != NULL)
    kv_counts_stamp(c, txn); /* kvdb_stat's counters are current as of this commit */
  return kv_txn_commit_base(c, txn);
}

kvdb_status kv_cat_put_seg(kv_catalog *c, kv_txn *txn, uint64_t id, const kv_seg_rec *r)
{
  kv_seg_rec old;
  kvdb_status rc = kv_cat_get_seg(c, txn, id, &old);
  if (rc == KVDB_CORRUPT) { /* replaced: what it counted is not known */
    kv_clear_error();
    KV_RET(kv_counts_invalidate(c, txn));
  } else if (rc == KVDB_OK || rc == KVDB_NOTFOUND) {
    KV_RET(kv_counts_seg(c, txn, rc == KVDB_OK ? &old : NULL, r));
  } else {
    return rc;
  }
  uint8_t k[8], buf[32];
  kv_be64(k, id);
  kv_seg_rec_encode(r, buf);
  MDB_val key = {8, k}, val = {32, buf};
  int mrc = mdb_put(kv_mtxn(txn), c->segments, &key, &val, 0);
  return mrc == 0 ? KVDB_OK : kv_mdb_fail(mrc, "put segment");
}

kvdb_status kv_cat_del_seg(kv_catalog *c, kv_txn *txn, uint64_t id)
{
  kv_seg_rec old;
  KV_RET(kv_cat_get_seg(c, txn, id, &old));
  KV_RET(kv_counts_seg(c, txn, &old, NULL));
  uint8_t k[8];
  kv_be64(k, id);
  MDB_val key = {8, k};
  int mrc = mdb_del(kv_mtxn(txn), c->segments, &key, NULL);
  return mrc == 0 ? KVDB_OK : kv_mdb_fail(mrc, "delete segment record");
}

kvdb_status kv_catalog_vacuum(kv_catalog *c, int force, int *done, uint64_t *before,
                              uint64_t *after)
{
  int recount = 0;
  kvdb_status rc = kv_cat_vacuum_file(c, force, done, before, after, &recount);
  /* kvdb_stat's counters carry the id of the transaction that kept them: the new file's ids
   * start anew, so count them again */
  if (recount)
    kv_counts_open(c);
  return rc;
}
