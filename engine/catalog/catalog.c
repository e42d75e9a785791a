/* SPDX-License-Identifier: MIT */
/*
 * engine/catalog/catalog.c — LMDB environment, record codecs (FORMAT.md §2).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "catalog.h"

/* ---- record codecs ---------------------------------------------------------------------- */

size_t kv_model_rec_size(void)
{
  return 36;
}

void kv_model_rec_encode(const kv_model_rec *r, uint8_t *dst)
{
  memset(dst, 0, 36);
  dst[0] = KV_REC_VERSION;
  dst[1] = (uint8_t)r->dtype;
  kv_put_le32(dst + 4, r->n_layers);
  kv_put_le32(dst + 8, r->n_kv_heads);
  kv_put_le32(dst + 12, r->head_dim);
  kv_put_le32(dst + 16, r->block_tokens);
  memcpy(dst + 20, r->hash, 16);
}

static kvdb_status rec_version(const uint8_t *src, size_t len, size_t min, const char *what)
{
  if (len < min)
    return kv_fail(KVDB_CORRUPT, "%s record truncated: %zu bytes, at least %zu expected", what,
                   len, min);
  if (src[0] > KV_REC_VERSION)
    return kv_fail(KVDB_VERSION, "%s record version %u is newer than %u", what, src[0],
                   KV_REC_VERSION);
  if (src[0] == 0)
    return kv_fail(KVDB_CORRUPT, "%s record version 0", what);
  return KVDB_OK;
}

kvdb_status kv_model_rec_decode(const uint8_t *src, size_t len, kv_model_rec *r)
{
  KV_RET(rec_version(src, len, 36, "model"));
  if (len != 36)
    return kv_fail(KVDB_CORRUPT, "model record is %zu bytes, not 36", len);
  r->dtype = src[1];
  r->n_layers = kv_get_le32(src + 4);
  r->n_kv_heads = kv_get_le32(src + 8);
  r->head_dim = kv_get_le32(src + 12);
  r->block_tokens = kv_get_le32(src + 16);
  memcpy(r->hash, src + 20, 16);
  return KVDB_OK;
}

size_t kv_block_rec_size(uint32_t n_tokens)
{
  return 72 + 4 * (size_t)n_tokens;
}

void kv_block_rec_encode(const kv_block_rec *r, const uint32_t *tokens, uint8_t *dst)
{
  memset(dst, 0, 72);
  dst[0] = KV_REC_VERSION;
  dst[1] = (uint8_t)r->tier;
  kv_put_le32(dst + 4, r->refcount);
  kv_put_le32(dst + 8, r->n_tokens);
  kv_put_le64(dst + 16, r->segment);
  kv_put_le64(dst + 24, r->offset);
  kv_put_le64(dst + 32, r->bytes);
  memcpy(dst + 40, r->parent, 16);
  memcpy(dst + 56, r->model, 16);
  if (tokens != NULL) {
    for (uint32_t i = 0; i < r->n_tokens; i++)
      kv_put_le32(dst + 72 + 4 * i, tokens[i]);
  } else {
    memcpy(dst + 72, r->tokens, 4 * (size_t)r->n_tokens);
  }
}

kvdb_status kv_block_rec_decode(const uint8_t *src, size_t len, kv_block_rec *r)
{
  KV_RET(rec_version(src, len, 72, "block"));
  r->tier = src[1];
  r->refcount = kv_get_le32(src + 4);
  r->n_tokens = kv_get_le32(src + 8);
  r->segment = kv_get_le64(src + 16);
  r->offset = kv_get_le64(src + 24);
  r->bytes = kv_get_le64(src + 32);
  memcpy(r->parent, src + 40, 16);
  memcpy(r->model, src + 56, 16);
  r->tokens = src + 72;
  if (r->n_tokens == 0 || r->n_tokens > 4096 || len != kv_block_rec_size(r->n_tokens))
    return kv_fail(KVDB_CORRUPT, "block record of %zu bytes claims %u tokens", len, r->n_tokens);
  if (r->tier >= KVDB_TIER_COUNT || r->refcount == 0 || r->bytes == 0 ||
      r->offset % KV_PAGE != 0 || r->bytes % KV_PAGE != 0)
    return kv_fail(KVDB_CORRUPT, "block record has tier %u, refcount %u, offset %llu, bytes %llu",
                   r->tier, r->refcount, (unsigned long long)r->offset,
                   (unsigned long long)r->bytes);
  return KVDB_OK;
}

size_t kv_ctx_rec_size(uint32_t n_blocks)
{
  return 56 + 16 * (size_t)n_blocks;
}

void kv_ctx_rec_encode(const kv_ctx_rec *r, const uint8_t *blocks, uint8_t *dst)
{
  memset(dst, 0, 56);
  dst[0] = KV_REC_VERSION;
  dst[1] = (uint8_t)r->flags;
  kv_put_le32(dst + 4, r->n_blocks);
  kv_put_le64(dst + 8, r->n_tokens);
  kv_put_le64(dst + 16, r->bytes);
  kv_put_le64(dst + 24, r->created_ms);
  kv_put_le64(dst + 32, r->last_access_ms);
  memcpy(dst + 40, r->model, 16);
  memcpy(dst + 56, blocks, 16 * (size_t)r->n_blocks);
}

kvdb_status kv_ctx_rec_decode(const uint8_t *src, size_t len, kv_ctx_rec *r)
{
  KV_RET(rec_version(src, len, 56, "context"));
  r->flags = src[1];
  r->n_blocks = kv_get_le32(src + 4);
  r->n_tokens = kv_get_le64(src + 8);
  r->bytes = kv_get_le64(src + 16);
  r->created_ms = kv_get_le64(src + 24);
  r->last_access_ms = kv_get_le64(src + 32);
  memcpy(r->model, src + 40, 16);
  r->blocks = src + 56;
  if (r->n_blocks == 0 || len != kv_ctx_rec_size(r->n_blocks) ||
      r->n_tokens > (uint64_t)r->n_blocks * 4096 || r->n_tokens < r->n_blocks ||
      (r->flags & ~(uint32_t)KV_CTX_EXPLICIT) != 0)
    return kv_fail(KVDB_CORRUPT, "context record of %zu bytes claims %u blocks, %llu tokens", len,
                   r->n_blocks, (unsigned long long)r->n_tokens);
  return KVDB_OK;
}

size_t kv_seg_rec_size(void)
{
  return 32;
}

void kv_seg_rec_encode(const kv_seg_rec *r, uint8_t *dst)
{
  memset(dst, 0, 32);
  dst[0] = KV_REC_VERSION;
  dst[1] = (uint8_t)r->tier;
  dst[2] = (uint8_t)r->state;
  kv_put_le32(dst + 4, r->owner_pid);
  kv_put_le64(dst + 8, r->end);
  kv_put_le64(dst + 16, r->live_bytes);
  kv_put_le64(dst + 24, r->live_blocks);
}

kvdb_status kv_seg_rec_decode(const uint8_t *src, size_t len, kv_seg_rec *r)
{
  KV_RET(rec_version(src, len, 32, "segment"));
  if (len != 32)
    return kv_fail(KVDB_CORRUPT, "segment record is %zu bytes, not 32", len);
  r->tier = src[1];
  r->state = src[2];
  r->owner_pid = kv_get_le32(src + 4);
  r->end = kv_get_le64(src + 8);
  r->live_bytes = kv_get_le64(src + 16);
  r->live_blocks = kv_get_le64(src + 24);
  if (r->tier >= KVDB_TIER_COUNT || r->state > KV_SEG_SEALED || r->live_bytes > r->end ||
      r->end % KV_PAGE != 0)
    return kv_fail(KVDB_CORRUPT, "segment record has tier %u, state %u, end %llu, live %llu",
                   r->tier, r->state, (unsigned long long)r->end,
                   (unsigned long long)r->live_bytes);
  return KVDB_OK;
}

/* ---- environment ------------------------------------------------------------------------ */

kvdb_status kv_mdb_fail(int mrc, const char *what)
{
  kvdb_status st;
  switch (mrc) {
  case MDB_NOTFOUND:
    return KVDB_NOTFOUND;
  case MDB_MAP_FULL:
  case ENOSPC:
    st = KVDB_FULL;
    break;
  case ENOMEM:
    st = KVDB_NOMEM;
    break;
  case EACCES:
  case EROFS:
    st = KVDB_READONLY;
    break;
  case MDB_CORRUPTED:
  case MDB_PAGE_NOTFOUND:
  case MDB_INVALID:
    st = KVDB_CORRUPT;
    break;
  case MDB_VERSION_MISMATCH:
    st = KVDB_VERSION;
    break;
  case MDB_READERS_FULL:
    st = KVDB_BUSY;
    break;
  default:
    st = KVDB_IOERR;
  }
  return kv_fail(st, "catalog: %s: %s", what, mdb_strerror(mrc));
}

kvdb_status kv_txn_begin(kv_catalog *c, int write, MDB_txn **out)
{
  int mrc = mdb_txn_begin(c->env, NULL, write ? 0 : MDB_RDONLY, out);
  if (mrc != 0) {
    *out = NULL;
    return kv_mdb_fail(mrc, write ? "begin write transaction" : "begin read transaction");
  }
  return KVDB_OK;
}

kvdb_status kv_txn_commit(MDB_txn *txn)
{
  int mrc = mdb_txn_commit(txn);
  return mrc == 0 ? KVDB_OK : kv_mdb_fail(mrc, "commit");
}

static kvdb_status cat_get(MDB_txn *txn, MDB_dbi dbi, const void *k, size_t klen, MDB_val *v,
                           const char *what)
{
  MDB_val key = {klen, (void *)(uintptr_t)k};
  int mrc = mdb_get(txn, dbi, &key, v);
  if (mrc == MDB_NOTFOUND)
    return KVDB_NOTFOUND;
  if (mrc != 0)
    return kv_mdb_fail(mrc, what);
  return KVDB_OK;
}

kvdb_status kv_cat_get_block(kv_catalog *c, MDB_txn *txn, const uint8_t hash[16], kv_block_rec *r)
{
  MDB_val v;
  KV_RET(cat_get(txn, c->blocks, hash, 16, &v, "get block"));
  return kv_block_rec_decode(v.mv_data, v.mv_size, r);
}

kvdb_status kv_cat_get_ctx(kv_catalog *c, MDB_txn *txn, const uint8_t key[16], kv_ctx_rec *r)
{
  MDB_val v;
  KV_RET(cat_get(txn, c->contexts, key, 16, &v, "get context"));
  return kv_ctx_rec_decode(v.mv_data, v.mv_size, r);
}

kvdb_status kv_cat_get_seg(kv_catalog *c, MDB_txn *txn, uint64_t id, kv_seg_rec *r)
{
  uint8_t k[8];
  kv_be64(k, id);
  MDB_val v;
  KV_RET(cat_get(txn, c->segments, k, 8, &v, "get segment"));
  return kv_seg_rec_decode(v.mv_data, v.mv_size, r);
}

kvdb_status kv_cat_put_seg(kv_catalog *c, MDB_txn *txn, uint64_t id, const kv_seg_rec *r)
{
  uint8_t k[8], buf[32];
  kv_be64(k, id);
  kv_seg_rec_encode(r, buf);
  MDB_val key = {8, k}, val = {32, buf};
  int mrc = mdb_put(txn, c->segments, &key, &val, 0);
  return mrc == 0 ? KVDB_OK : kv_mdb_fail(mrc, "put segment");
}

kvdb_status kv_cat_get_u64(kv_catalog *c, MDB_txn *txn, const char *name, uint64_t *v)
{
  MDB_val val;
  KV_RET(cat_get(txn, c->meta, name, strlen(name), &val, name));
  if (val.mv_size != 8)
    return kv_fail(KVDB_CORRUPT, "catalog meta '%s' is %zu bytes, not 8", name, val.mv_size);
  *v = kv_get_le64(val.mv_data);
  return KVDB_OK;
}

kvdb_status kv_cat_put_u64(kv_catalog *c, MDB_txn *txn, const char *name, uint64_t v)
{
  uint8_t b[8];
  kv_put_le64(b, v);
  MDB_val key = {strlen(name), (void *)(uintptr_t)name}, val = {8, b};
  int mrc = mdb_put(txn, c->meta, &key, &val, 0);
  return mrc == 0 ? KVDB_OK : kv_mdb_fail(mrc, name);
}

static kvdb_status open_dbs(kv_catalog *c, MDB_txn *txn, unsigned create)
{
  struct {
    const char *name;
    MDB_dbi *dbi;
    unsigned flags;
  } t[] = {
    {"meta", &c->meta, 0},         {"models", &c->models, 0},
    {"blocks", &c->blocks, 0},     {"children", &c->children, MDB_DUPSORT | MDB_DUPFIXED},
    {"contexts", &c->contexts, 0}, {"atime", &c->atime, 0},
    {"segments", &c->segments, 0},
  };
  for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) {
    int mrc = mdb_dbi_open(txn, t[i].name, t[i].flags | create, t[i].dbi);
    if (mrc != 0) {
      char what[64];
      snprintf(what, sizeof what, "open database '%s'", t[i].name);
      return kv_mdb_fail(mrc, what);
    }
  }
  return KVDB_OK;
}

kvdb_status kv_catalog_open(kv_catalog *c, const char *dir, uint64_t map_bytes, int rdonly,
                            int create, int nosync)
{
  memset(c, 0, sizeof *c);
  c->rdonly = rdonly;
  int mrc = mdb_env_create(&c->env);
  if (mrc != 0)
    return kv_mdb_fail(mrc, "create environment");
  mdb_env_set_maxdbs(c->env, 16);
  mdb_env_set_maxreaders(c->env, 1024);
  mdb_env_set_mapsize(c->env, (size_t)map_bytes);
  char path[4096];
  snprintf(path, sizeof path, "%s/catalog.mdb", dir);
  /* MDB_NOTLS: read transactions are not tied to threads (callers use many threads).
   * MDB_NOSUBDIR: the catalog is one file (plus its -lock) in the database directory. */
  unsigned flags = MDB_NOSUBDIR | MDB_NOTLS;
  if (rdonly)
    flags |= MDB_RDONLY;
  if (nosync)
    flags |= MDB_NOSYNC;
  struct stat st;
  if (stat(path, &st) != 0) {
    if (rdonly || !create) {
      mdb_env_close(c->env);
      c->env = NULL;
      return kv_fail(KVDB_NOTFOUND, "no database at '%s' (no catalog.mdb)", dir);
    }
  }
  mrc = mdb_env_open(c->env, path, flags, 0644);
  if (mrc != 0 && rdonly && (mrc == EACCES || mrc == EROFS)) {
    /* a read-only directory: no lock file can be made; read without one */
    mrc = mdb_env_open(c->env, path, flags | MDB_NOLOCK, 0644);
  }
  if (mrc != 0) {
    kvdb_status st2 = kv_mdb_fail(mrc, path);
    mdb_env_close(c->env);
    c->env = NULL;
    return st2;
  }
  MDB_txn *txn = NULL;
  kvdb_status rc;
  /* First a read transaction: check the version before writing anything (KVDB_VERSION). */
  KV_ERR(kv_txn_begin(c, 0, &txn));
  MDB_dbi meta;
  mrc = mdb_dbi_open(txn, "meta", 0, &meta);
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
      rc = kv_fail(KVDB_CORRUPT, "catalog '%s' has no format version", path);
    if (rc != KVDB_OK)
      goto out;
    if (ver > KVDB_FORMAT_VERSION) {
      rc = kv_fail(KVDB_VERSION,
                   "database '%s' has format version %llu; this build reads up to %d", dir,
                   (unsigned long long)ver, KVDB_FORMAT_VERSION);
      goto out;
    }
  }
  if (fresh && rdonly) {
    rc = kv_fail(KVDB_NOTFOUND, "catalog '%s' is empty", path);
    goto out;
  }
  if (!fresh) {
    KV_ERR(open_dbs(c, txn, 0));
    mdb_txn_commit(txn); /* a read txn: makes the dbi handles permanent */
    txn = NULL;
    return KVDB_OK;
  }
  mdb_txn_abort(txn);
  txn = NULL;
  KV_ERR(kv_txn_begin(c, 1, &txn));
  KV_ERR(open_dbs(c, txn, MDB_CREATE));
  uint64_t ver = 0;
  if (kv_cat_get_u64(c, txn, "format", &ver) == KVDB_NOTFOUND) {
    KV_ERR(kv_cat_put_u64(c, txn, "format", KVDB_FORMAT_VERSION));
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
    mdb_txn_abort(txn);
  mdb_env_close(c->env);
  c->env = NULL;
  return rc;
}

void kv_catalog_close(kv_catalog *c)
{
  if (c->env != NULL)
    mdb_env_close(c->env);
  c->env = NULL;
}
