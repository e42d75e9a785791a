/* SPDX-License-Identifier: MIT */
/*
 * engine/catalog/index.c — the trie of chain blocks (`next`) and the segment index
 * (`segblocks`); catalog.h (INDEXES) says how they are laid out and searched.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>

#include "catalog_int.h"

#define KV_IDX_CHUNK_MAX 96u     /* tokens of the longest chunk */
#define KV_IDX_KEY_MAX (16u + 4u * KV_IDX_CHUNK_MAX)
#define KV_IDX_WITNESS_MAX 64    /* blocks of one entry tried for a usable record */
#define KV_IDX_NODE_SEED 0x6b76646e65787431ull /* "kvdnext1": node ids are never block hashes */

/* End of chunk d (its first token is the end of chunk d - 1, or 0). */
static uint64_t chunk_end(uint32_t d)
{
  static const uint32_t first[4] = {8, 24, 56, 120};
  return d < 4 ? first[d] : 120u + (uint64_t)KV_IDX_CHUNK_MAX * (d - 3);
}

static uint64_t chunk_start(uint32_t d)
{
  return d == 0 ? 0 : chunk_end(d - 1);
}

/* node || tokens [s0, s1) as u32 BE; tokens come as u32 LE bytes (records) */
static size_t make_key_le(uint8_t *key, const uint8_t node[16], const uint8_t *tok_le,
                          uint64_t s0, uint64_t s1)
{
  memcpy(key, node, 16);
  uint8_t *p = key + 16;
  for (uint64_t i = s0; i < s1; i++, p += 4) {
    uint32_t t = kv_get_le32(tok_le + 4 * i);
    p[0] = (uint8_t)(t >> 24);
    p[1] = (uint8_t)(t >> 16);
    p[2] = (uint8_t)(t >> 8);
    p[3] = (uint8_t)t;
  }
  return (size_t)(p - key);
}

static size_t make_key_q(uint8_t *key, const uint8_t node[16], const uint32_t *q, uint64_t s0,
                         uint64_t s1)
{
  memcpy(key, node, 16);
  uint8_t *p = key + 16;
  for (uint64_t i = s0; i < s1; i++, p += 4) {
    p[0] = (uint8_t)(q[i] >> 24);
    p[1] = (uint8_t)(q[i] >> 16);
    p[2] = (uint8_t)(q[i] >> 8);
    p[3] = (uint8_t)q[i];
  }
  return (size_t)(p - key);
}

/* node_{d+1} from node_d and chunk d's key bytes (node || BE tokens) */
static void next_node(const uint8_t *key, size_t klen, uint8_t out[16])
{
  XXH128_canonical_t c;
  XXH128_canonicalFromHash(&c, XXH3_128bits_withSeed(key, klen, KV_IDX_NODE_SEED));
  memcpy(out, c.digest, 16);
}

static kvdb_status idx_cursor(kv_txn *txn, MDB_dbi dbi, MDB_cursor **cur)
{
  return kv_cursor_open(kv_mtxn(txn), dbi, cur, "open index cursor");
}

/* ---- the trie --------------------------------------------------------------------------- */

/* Give block `o` its entry at depth d + 1 when it has tokens past chunk d (invariant T). */
static kvdb_status extend(kv_catalog *c, kv_txn *txn, const uint8_t *key, size_t klen,
                          uint32_t d, const uint8_t o[16])
{
  kv_block_rec r;
  kvdb_status rc = kv_cat_get_block(c, txn, o, &r);
  if (rc == KVDB_NOTFOUND || rc == KVDB_CORRUPT)
    return KVDB_OK; /* a damaged catalog (verify reports it): nothing to extend */
  KV_RET(rc);
  uint64_t s0 = chunk_end(d);
  if (r.n_tokens <= s0)
    return KVDB_OK;
  uint64_t s1 = chunk_end(d + 1) < r.n_tokens ? chunk_end(d + 1) : r.n_tokens;
  uint8_t node[16], nk[KV_IDX_KEY_MAX];
  next_node(key, klen, node);
  size_t nl = make_key_le(nk, node, r.tokens, s0, s1);
  MDB_val k = {nl, nk}, v = {16, (void *)(uintptr_t)o};
  int mrc = mdb_put(kv_mtxn(txn), c->next, &k, &v, MDB_NODUPDATA);
  return mrc == 0 || mrc == MDB_KEYEXIST ? KVDB_OK : kv_mdb_fail(mrc, "put index entry");
}

kvdb_status kv_idx_child_add(kv_catalog *c, kv_txn *txn, const uint8_t parent[16],
                             const uint8_t hash[16], const uint8_t *tokens_le, uint32_t n)
{
  if (!c->has_index)
    return kv_fail(KVDB_READONLY, "the catalog has no block index (format < 4, read-only)");
  /* tokens may point into the catalog (a record), valid only until the next write: a copy */
  uint8_t *tok = malloc(4 * (size_t)n + 1);
  if (tok == NULL)
    return kv_fail(KVDB_NOMEM, "index tokens");
  memcpy(tok, tokens_le, 4 * (size_t)n);
  tokens_le = tok;
  MDB_cursor *cur;
  kvdb_status rc = idx_cursor(txn, c->next, &cur);
  if (rc != KVDB_OK) {
    free(tok);
    return rc;
  }
  uint8_t node[16], key[KV_IDX_KEY_MAX];
  memcpy(node, parent, 16);
  for (uint32_t d = 0; n > 0; d++) {
    uint64_t s0 = chunk_start(d), s1 = chunk_end(d) < n ? chunk_end(d) : n;
    size_t klen = make_key_le(key, node, tokens_le, s0, s1);
    MDB_val k = {klen, key}, v;
    /* the other blocks this entry lists before ours joins */
    size_t others = 0;
    uint8_t other[16];
    int mrc = mdb_cursor_get(cur, &k, &v, MDB_SET_KEY);
    if (mrc == 0) {
      size_t cnt = 0;
      mdb_cursor_count(cur, &cnt);
      for (; mrc == 0 && others < 2; mrc = mdb_cursor_get(cur, &k, &v, MDB_NEXT_DUP))
        if (v.mv_size == 16 && memcmp(v.mv_data, hash, 16) != 0) {
          if (others == 0)
            memcpy(other, v.mv_data, 16);
          others++;
        }
      if (cnt > 2)
        others = 2; /* at least two others (T holds for them) */
    } else if (mrc != MDB_NOTFOUND) {
      rc = kv_mdb_fail(mrc, "read index entry");
      break;
    }
    k = (MDB_val){klen, key};
    v = (MDB_val){16, (void *)(uintptr_t)hash};
    mrc = mdb_put(kv_mtxn(txn), c->next, &k, &v, MDB_NODUPDATA);
    if (mrc != 0 && mrc != MDB_KEYEXIST) {
      rc = kv_mdb_fail(mrc, "put index entry");
      break;
    }
    if (others == 1 && s1 == chunk_end(d) && (rc = extend(c, txn, key, klen, d, other)) != KVDB_OK)
      break;
    if (s1 == n || others == 0)
      break; /* ends here, or alone here */
    next_node(key, klen, node);
  }
  mdb_cursor_close(cur);
  free(tok);
  return rc;
}

kvdb_status kv_idx_child_del(kv_catalog *c, kv_txn *txn, const uint8_t parent[16],
                             const uint8_t hash[16], const uint8_t *tokens_le, uint32_t n)
{
  if (!c->has_index)
    return kv_fail(KVDB_READONLY, "the catalog has no block index (format < 4, read-only)");
  uint8_t *tok = malloc(4 * (size_t)n + 1); /* as in kv_idx_child_add */
  if (tok == NULL)
    return kv_fail(KVDB_NOMEM, "index tokens");
  memcpy(tok, tokens_le, 4 * (size_t)n);
  uint8_t node[16], key[KV_IDX_KEY_MAX];
  memcpy(node, parent, 16);
  kvdb_status rc = KVDB_OK;
  for (uint32_t d = 0; n > 0; d++) {
    uint64_t s0 = chunk_start(d), s1 = chunk_end(d) < n ? chunk_end(d) : n;
    size_t klen = make_key_le(key, node, tok, s0, s1);
    MDB_val k = {klen, key}, v = {16, (void *)(uintptr_t)hash};
    int mrc = mdb_del(kv_mtxn(txn), c->next, &k, &v);
    if (mrc == MDB_NOTFOUND)
      break; /* its entries ended at the depth before */
    if (mrc != 0) {
      rc = kv_mdb_fail(mrc, "delete index entry");
      break;
    }
    if (s1 == n)
      break;
    next_node(key, klen, node);
  }
  free(tok);
  return rc;
}

static uint32_t common_prefix(const uint8_t *stored, uint32_t n_stored, const uint32_t *q,
                              size_t nq)
{
  uint32_t n = n_stored < nq ? n_stored : (uint32_t)nq;
  uint32_t i = 0;
  while (i < n && kv_get_le32(stored + 4 * i) == q[i])
    i++;
  return i;
}

/* Tokens key (node || BE tokens) shares with the query's chunk qk (same layout) after node. */
static uint32_t key_lcp(const MDB_val *k, const uint8_t *qk, size_t qlen)
{
  if (k->mv_size < 16)
    return 0;
  size_t a = (k->mv_size - 16) / 4, b = (qlen - 16) / 4, n = a < b ? a : b;
  const uint8_t *p = (const uint8_t *)k->mv_data + 16;
  uint32_t i = 0;
  while (i < n && memcmp(p + 4 * i, qk + 16 + 4 * i, 4) == 0)
    i++;
  return i;
}

/* Consider the blocks of the entry under the cursor (positioned on its first duplicate): the
 * first usable one's record gives a candidate. */
static kvdb_status consider(kv_catalog *c, kv_txn *txn, MDB_cursor *cur, const uint8_t model[16],
                            const uint32_t *q, size_t nq, uint32_t *best, kv_block_rec *rec,
                            uint8_t hash[16])
{
  MDB_val k, v;
  int mrc = mdb_cursor_get(cur, &k, &v, MDB_GET_CURRENT);
  for (int tried = 0; mrc == 0 && tried < KV_IDX_WITNESS_MAX; tried++) {
    kv_block_rec br;
    if (v.mv_size == 16 && kv_cat_get_block(c, txn, v.mv_data, &br) == KVDB_OK &&
        memcmp(br.model, model, 16) == 0 && !(br.bflags & KV_BLK_DROPS)) {
      uint32_t l = common_prefix(br.tokens, br.n_tokens, q, nq);
      if (l > *best) {
        *best = l;
        *rec = br;
        memcpy(hash, v.mv_data, 16);
      }
      return KVDB_OK;
    }
    mrc = mdb_cursor_get(cur, &k, &v, MDB_NEXT_DUP);
  }
  return mrc == 0 || mrc == MDB_NOTFOUND ? KVDB_OK : kv_mdb_fail(mrc, "read index entry");
}

/* A catalog of format < 4 opened read-only: every child in the legacy database. */
static kvdb_status legacy_best(kv_catalog *c, kv_txn *txn, const uint8_t parent[16],
                               const uint8_t model[16], const uint32_t *q, size_t nq,
                               uint32_t *best, kv_block_rec *rec, uint8_t hash[16])
{
  MDB_cursor *cur;
  if (!c->has_children || mdb_cursor_open(kv_mtxn(txn), c->children, &cur) != 0)
    return KVDB_OK; /* none (or dropped since: below) */
  MDB_val k = {16, (void *)(uintptr_t)parent}, v;
  int mrc;
  for (mrc = mdb_cursor_get(cur, &k, &v, MDB_SET_KEY); mrc == 0;
       mrc = mdb_cursor_get(cur, &k, &v, MDB_NEXT_DUP)) {
    kv_block_rec br;
    if (v.mv_size != 16 || kv_cat_get_block(c, txn, v.mv_data, &br) != KVDB_OK ||
        memcmp(br.model, model, 16) != 0 || (br.bflags & KV_BLK_DROPS))
      continue;
    uint32_t l = common_prefix(br.tokens, br.n_tokens, q, nq);
    if (l > *best) {
      *best = l;
      *rec = br;
      memcpy(hash, v.mv_data, 16);
    }
  }
  mdb_cursor_close(cur);
  /* another process may have upgraded the catalog and dropped `children` (MDB_NOTFOUND or
   * MDB_BAD_DBI): tail hits are then found again after a reopen */
  return KVDB_OK;
}

kvdb_status kv_idx_child_best(kv_catalog *c, kv_txn *txn, const uint8_t parent[16],
                              const uint8_t model[16], const uint32_t *q, size_t nq,
                              uint32_t *best, kv_block_rec *rec, uint8_t hash[16])
{
  *best = 0;
  if (!c->has_index)
    return legacy_best(c, txn, parent, model, q, nq, best, rec, hash);
  MDB_cursor *cur;
  KV_RET(idx_cursor(txn, c->next, &cur));
  uint8_t node[16], qk[KV_IDX_KEY_MAX];
  memcpy(node, parent, 16);
  kvdb_status rc = KVDB_OK;
  for (uint32_t d = 0; chunk_start(d) < nq; d++) {
    uint64_t s0 = chunk_start(d), s1 = chunk_end(d) < nq ? chunk_end(d) : nq;
    size_t qlen = make_key_q(qk, node, q, s0, s1);
    /* the key sharing most tokens with qk is its successor or its predecessor */
    MDB_val k = {qlen, qk}, v, bk = {0, NULL};
    uint32_t bl = 0;
    int mrc = mdb_cursor_get(cur, &k, &v, MDB_SET_RANGE);
    if (mrc == 0 && k.mv_size >= 16 && memcmp(k.mv_data, node, 16) == 0) {
      bl = key_lcp(&k, qk, qlen);
      bk = k;
    }
    if (mrc == 0)
      mrc = mdb_cursor_get(cur, &k, &v, MDB_PREV_NODUP);
    else if (mrc == MDB_NOTFOUND)
      mrc = mdb_cursor_get(cur, &k, &v, MDB_LAST);
    if (mrc == 0 && k.mv_size >= 16 && memcmp(k.mv_data, node, 16) == 0) {
      uint32_t l = key_lcp(&k, qk, qlen);
      if (l > bl) {
        bl = l;
        bk = k;
      }
    } else if (mrc != 0 && mrc != MDB_NOTFOUND) {
      rc = kv_mdb_fail(mrc, "search index");
      break;
    }
    if (bl == 0)
      break;
    /* the entry's blocks: the first usable one gives s0 + bl tokens or more */
    uint8_t ek[KV_IDX_KEY_MAX];
    size_t elen = bk.mv_size;
    if (elen > sizeof ek)
      break; /* not a key this build writes (a damaged catalog): no answer from it */
    memcpy(ek, bk.mv_data, elen);
    k = (MDB_val){elen, ek};
    mrc = mdb_cursor_get(cur, &k, &v, MDB_SET_KEY);
    if (mrc != 0) {
      rc = kv_mdb_fail(mrc, "read index entry");
      break;
    }
    size_t cnt = 0;
    mdb_cursor_count(cur, &cnt);
    if ((rc = consider(c, txn, cur, model, q, nq, best, rec, hash)) != KVDB_OK)
      break;
    int whole = s1 == chunk_end(d) && elen == qlen && bl == (qlen - 16) / 4;
    if (!whole || cnt < 2 || s1 == nq)
      break; /* the answer is in the entry's record (one block), or the query ends */
    next_node(qk, qlen, node); /* T: every block continuing past it is one depth down */
  }
  mdb_cursor_close(cur);
  return rc;
}

/* ---- the segment index ------------------------------------------------------------------ */

/* Put (add) or delete the segment index entry (seg, hash); one already there, or already gone,
 * is fine. */
static kvdb_status seg_entry(kv_catalog *c, kv_txn *txn, uint64_t seg, const uint8_t hash[16],
                             int add)
{
  if (!c->has_index)
    return kv_fail(KVDB_READONLY, "the catalog has no block index (format < 4, read-only)");
  uint8_t kb[8];
  kv_be64(kb, seg);
  MDB_val k = {8, kb}, v = {16, (void *)(uintptr_t)hash};
  if (add) {
    int mrc = mdb_put(kv_mtxn(txn), c->segblocks, &k, &v, MDB_NODUPDATA);
    return mrc == 0 || mrc == MDB_KEYEXIST ? KVDB_OK : kv_mdb_fail(mrc, "put segment index entry");
  }
  int mrc = mdb_del(kv_mtxn(txn), c->segblocks, &k, &v);
  return mrc == 0 || mrc == MDB_NOTFOUND ? KVDB_OK
                                         : kv_mdb_fail(mrc, "delete segment index entry");
}

kvdb_status kv_idx_seg_add(kv_catalog *c, kv_txn *txn, uint64_t seg, const uint8_t hash[16])
{
  return seg_entry(c, txn, seg, hash, 1);
}

kvdb_status kv_idx_seg_del(kv_catalog *c, kv_txn *txn, uint64_t seg, const uint8_t hash[16])
{
  return seg_entry(c, txn, seg, hash, 0);
}

kvdb_status kv_idx_seg_move(kv_catalog *c, kv_txn *txn, uint64_t from, uint64_t to,
                            const uint8_t hash[16])
{
  if (from == to)
    return KVDB_OK;
  KV_RET(kv_idx_seg_del(c, txn, from, hash));
  return kv_idx_seg_add(c, txn, to, hash);
}

/* ---- the upgrade ------------------------------------------------------------------------ */

kvdb_status kv_idx_build(kv_catalog *c, kv_txn *txn)
{
  const unsigned dup = MDB_CREATE | MDB_DUPSORT | MDB_DUPFIXED;
  int mrc = mdb_dbi_open(kv_mtxn(txn), "next", dup, &c->next);
  if (mrc == 0)
    mrc = mdb_dbi_open(kv_mtxn(txn), "segblocks", dup, &c->segblocks);
  if (mrc != 0)
    return kv_mdb_fail(mrc, "create the block indexes");
  if ((mrc = mdb_drop(kv_mtxn(txn), c->next, 0)) != 0 ||
      (mrc = mdb_drop(kv_mtxn(txn), c->segblocks, 0)) != 0)
    return kv_mdb_fail(mrc, "empty the block indexes");
  c->has_index = 1;
  MDB_cursor *cur;
  MDB_val k, v;
  kvdb_status rc = idx_cursor(txn, c->blocks, &cur);
  if (rc != KVDB_OK)
    return rc;
  for (mrc = mdb_cursor_get(cur, &k, &v, MDB_FIRST); mrc == 0 && rc == KVDB_OK;
       mrc = mdb_cursor_get(cur, &k, &v, MDB_NEXT)) {
    kv_block_rec br;
    if (k.mv_size == 16 && kv_block_rec_decode(v.mv_data, v.mv_size, &br) == KVDB_OK)
      rc = kv_idx_seg_add(c, txn, br.segment, k.mv_data); /* a damaged record: verify says so */
  }
  mdb_cursor_close(cur);
  if (rc != KVDB_OK)
    return rc;
  if (c->has_children) {
    if ((rc = idx_cursor(txn, c->children, &cur)) != KVDB_OK)
      return rc;
    for (mrc = mdb_cursor_get(cur, &k, &v, MDB_FIRST); mrc == 0 && rc == KVDB_OK;
         mrc = mdb_cursor_get(cur, &k, &v, MDB_NEXT)) {
      kv_block_rec br;
      uint8_t parent[16], child[16];
      if (k.mv_size != 16 || v.mv_size != 16)
        continue;
      memcpy(parent, k.mv_data, 16);
      memcpy(child, v.mv_data, 16);
      if (kv_cat_get_block(c, txn, child, &br) == KVDB_OK &&
          memcmp(br.parent, parent, 16) == 0)
        rc = kv_idx_child_add(c, txn, parent, child, br.tokens, br.n_tokens);
    }
    mdb_cursor_close(cur);
    if (rc != KVDB_OK)
      return rc;
    if ((mrc = mdb_drop(kv_mtxn(txn), c->children, 1)) != 0)
      return kv_mdb_fail(mrc, "drop database 'children'");
    c->has_children = 0;
  }
  return kv_cat_require_format(c, txn, KV_FORMAT_INDEXES);
}

/* ---- verify ----------------------------------------------------------------------------- */

static void hex16(const uint8_t *h, char out[33])
{
  static const char d[] = "0123456789abcdef";
  for (int i = 0; i < 16; i++) {
    out[2 * i] = d[h[i] >> 4];
    out[2 * i + 1] = d[h[i] & 15];
  }
  out[32] = 0;
}

/* 1 when block `hash` is an explicit-key block (its own context, flagged so): not in the trie */
static int is_explicit(kv_catalog *c, kv_txn *txn, const uint8_t hash[16])
{
  kv_ctx_rec cr;
  return kv_cat_get_ctx(c, txn, hash, &cr) == KVDB_OK && (cr.flags & KV_CTX_EXPLICIT);
}

/* 1 when some depth-0 entry of `parent` lists `hash`: a block whose record's tokens were
 * damaged is still indexed under its true ones (the record's damage is the blocks check's to
 * report). Visits the parent's entries: only when the direct check failed. */
static int listed_under(MDB_cursor *tc, const uint8_t parent[16], const uint8_t hash[16])
{
  MDB_val k = {16, (void *)(uintptr_t)parent}, v;
  for (int mrc = mdb_cursor_get(tc, &k, &v, MDB_SET_RANGE);
       mrc == 0 && k.mv_size >= 16 && memcmp(k.mv_data, parent, 16) == 0;
       mrc = mdb_cursor_get(tc, &k, &v, MDB_NEXT))
    if (v.mv_size == 16 && memcmp(v.mv_data, hash, 16) == 0)
      return 1;
  return 0;
}

kvdb_status kv_idx_verify(kv_catalog *c, kv_txn *txn, kv_idx_problem_fn fn, void *ctx)
{
  if (!c->has_index)
    return KVDB_OK; /* format < 4 read-only: nothing to check */
  char msg[256], hx[33];
  MDB_cursor *cur, *ic;
  MDB_val k, v;
  int mrc;
  KV_RET(idx_cursor(txn, c->blocks, &cur));
  MDB_cursor *tc = NULL;
  kvdb_status rc = idx_cursor(txn, c->segblocks, &ic);
  if (rc == KVDB_OK && (rc = idx_cursor(txn, c->next, &tc)) != KVDB_OK)
    mdb_cursor_close(ic);
  if (rc != KVDB_OK) {
    mdb_cursor_close(cur);
    return rc;
  }
  /* every block record: in the segment index under its segment, and in the trie */
  for (mrc = mdb_cursor_get(cur, &k, &v, MDB_FIRST); mrc == 0;
       mrc = mdb_cursor_get(cur, &k, &v, MDB_NEXT)) {
    kv_block_rec br;
    if (k.mv_size != 16 || kv_block_rec_decode(v.mv_data, v.mv_size, &br) != KVDB_OK)
      continue; /* the blocks pass reports it */
    uint8_t sk[8];
    kv_be64(sk, br.segment);
    MDB_val ik = {8, sk}, iv = {16, k.mv_data};
    if (mdb_cursor_get(ic, &ik, &iv, MDB_GET_BOTH) != 0) {
      snprintf(msg, sizeof msg, "block %s (segment %llu) is missing from the segment index",
               (hex16(k.mv_data, hx), hx), (unsigned long long)br.segment);
      fn(ctx, msg);
    }
    if (br.n_tokens == 0 || is_explicit(c, txn, k.mv_data))
      continue;
    uint8_t key[KV_IDX_KEY_MAX];
    uint64_t s1 = chunk_end(0) < br.n_tokens ? chunk_end(0) : br.n_tokens;
    MDB_val tk = {make_key_le(key, br.parent, br.tokens, 0, s1), key}, tv = {16, k.mv_data};
    if (mdb_cursor_get(tc, &tk, &tv, MDB_GET_BOTH) != 0 &&
        !listed_under(tc, br.parent, k.mv_data)) {
      snprintf(msg, sizeof msg, "block %s is missing from the lookup index (`next`)",
               (hex16(k.mv_data, hx), hx));
      fn(ctx, msg);
    }
  }
  mdb_cursor_close(tc);
  mdb_cursor_close(cur);
  /* every segment index entry: a block record located in that segment */
  for (mrc = mdb_cursor_get(ic, &k, &v, MDB_FIRST); mrc == 0;
       mrc = mdb_cursor_get(ic, &k, &v, MDB_NEXT)) {
    kv_block_rec br;
    uint64_t seg = k.mv_size == 8 ? kv_get_be64(k.mv_data) : 0;
    if (k.mv_size != 8 || v.mv_size != 16) {
      fn(ctx, "segment index entry of the wrong size");
      continue;
    }
    kvdb_status st = kv_cat_get_block(c, txn, v.mv_data, &br);
    if (st == KVDB_NOTFOUND || (st == KVDB_OK && br.segment != seg)) {
      hex16(v.mv_data, hx);
      if (st == KVDB_NOTFOUND)
        snprintf(msg, sizeof msg, "segment index lists block %s in segment %llu: no such block",
                 hx, (unsigned long long)seg);
      else
        snprintf(msg, sizeof msg,
                 "segment index lists block %s in segment %llu: its record says segment %llu",
                 hx, (unsigned long long)seg, (unsigned long long)br.segment);
      fn(ctx, msg);
    }
  }
  mdb_cursor_close(ic);
  /* every trie entry: blocks that exist */
  KV_RET(idx_cursor(txn, c->next, &cur));
  for (mrc = mdb_cursor_get(cur, &k, &v, MDB_FIRST); mrc == 0;
       mrc = mdb_cursor_get(cur, &k, &v, MDB_NEXT)) {
    kv_block_rec br;
    if (v.mv_size != 16 || kv_cat_get_block(c, txn, v.mv_data, &br) == KVDB_NOTFOUND) {
      snprintf(msg, sizeof msg, "lookup index (`next`) lists block %s: no such block",
               v.mv_size == 16 ? (hex16(v.mv_data, hx), hx) : "?");
      fn(ctx, msg);
    }
  }
  mdb_cursor_close(cur);
  return KVDB_OK;
}

/* ---- rebuild (kvdb_repair) -------------------------------------------------------------- */

kvdb_status kv_idx_rebuild(kv_catalog *c, kv_txn *txn)
{
  if (!c->has_index)
    return kv_fail(KVDB_READONLY, "the catalog has no block index (format < 4, read-only)");
  int mrc;
  if ((mrc = mdb_drop(kv_mtxn(txn), c->next, 0)) != 0 ||
      (mrc = mdb_drop(kv_mtxn(txn), c->segblocks, 0)) != 0)
    return kv_mdb_fail(mrc, "empty the block indexes");
  MDB_cursor *cur;
  MDB_val k, v;
  KV_RET(idx_cursor(txn, c->blocks, &cur));
  kvdb_status rc = KVDB_OK;
  for (mrc = mdb_cursor_get(cur, &k, &v, MDB_FIRST); mrc == 0 && rc == KVDB_OK;
       mrc = mdb_cursor_get(cur, &k, &v, MDB_NEXT)) {
    kv_block_rec br;
    uint8_t hash[16];
    if (k.mv_size != 16 || kv_block_rec_decode(v.mv_data, v.mv_size, &br) != KVDB_OK)
      continue;
    memcpy(hash, k.mv_data, 16);
    rc = kv_idx_seg_add(c, txn, br.segment, hash);
    if (rc == KVDB_OK && br.n_tokens > 0 && !is_explicit(c, txn, hash))
      rc = kv_idx_child_add(c, txn, br.parent, hash, br.tokens, br.n_tokens);
  }
  mdb_cursor_close(cur);
  return rc;
}
