/* SPDX-License-Identifier: MIT */
/*
 * tests/unit/test_index.c — the catalog's block indexes (engine/catalog/index.h, format 4):
 *  - fanout: 10,000 continuations of one block (sharing their first tokens, so that the trie
 *    must descend) and nested partial blocks; every lookup and get gives the longest stored
 *    prefix (computed here by brute force), also after deletes, compaction and relocations
 *  - deep: 256-token blocks whose children share long prefixes (the trie descends through all
 *    its chunk sizes), with deletes between puts
 *  - upgrade: a format-3 database with 2,000 children of one block, read-only (the legacy scan
 *    of every child) and upgraded by a read-write open
 *  - sysprompt: a 200-token system prompt still hits after 1,000 unrelated contexts (children
 *    of the model's root)
 *  - compact: compacting one segment of 64 blocks in a database of 20,000 blocks visits that
 *    segment's entries of the segment index, not the whole blocks table
 *  - indexes stay consistent (kvdb_verify checks them) after put/delete/compact/relocate, and
 *    verify reports a damaged index
 */
#include "kvdb_test.h"
#include "catalog/catalog_int.h" /* white-box: LMDB directly */

#include <inttypes.h>

#include "catalog/catalog.h"
#include "place/place.h"

static kvdb_model M16 = {"index-16", 1, 1, 16, KVDB_F16, 16};   /* small blocks */
static kvdb_model M256 = {"index-256", 1, 1, 16, KVDB_F16, 256}; /* the default block size */
static kvdb_model MC = {"index-c", 2, 2, 64, KVDB_F16, 16};      /* 20 KiB block objects */

static kvdb_options opts(void)
{
  kvdb_options o;
  kvdb_options_init(&o);
  o.dram_bytes = 0;
  o.log_level = -1;
  o.sync_mode = KVDB_SYNC_NONE;
  o.use_direct_io = 0;
  return o;
}

/* The stored contexts, for the brute-force answer. */
typedef struct stored {
  uint32_t *tok;
  size_t n;
  int live;
} stored;

/* Delete every third of s[0..n) (by its context key) and mark it dead, with every context equal
 * to a deleted one (deleted with it). */
static void delete_thirds(kvdb *db, const kvdb_model *m, stored *s, size_t n)
{
  size_t bt = m->block_tokens;
  for (size_t i = 0; i < n; i += 3) {
    kvdb_key keys[8];
    ASSERT_OK(kvdb_chain_hashes(m, s[i].tok, s[i].n, keys, 8));
    kvdb_status st = kvdb_delete(db, &keys[(s[i].n + bt - 1) / bt - 1]);
    ASSERT(st == KVDB_OK || st == KVDB_NOTFOUND); /* a duplicate context was deleted already */
    s[i].live = 0;
  }
  for (size_t i = 0; i < n; i++)
    for (size_t j = 0; j < n && s[i].live; j += 3)
      if (s[j].n == s[i].n && memcmp(s[j].tok, s[i].tok, s[i].n * sizeof *s[i].tok) == 0)
        s[i].live = 0;
}

static void free_stored(stored *s, size_t n)
{
  for (size_t i = 0; i < n; i++)
    free(s[i].tok);
  free(s);
}

static size_t lcp(const uint32_t *a, size_t na, const uint32_t *b, size_t nb)
{
  size_t n = na < nb ? na : nb, i = 0;
  while (i < n && a[i] == b[i])
    i++;
  return i;
}

static size_t brute(const stored *s, size_t ns, const uint32_t *q, size_t nq)
{
  size_t best = 0;
  for (size_t i = 0; i < ns; i++)
    if (s[i].live) {
      size_t l = lcp(s[i].tok, s[i].n, q, nq);
      if (l > best)
        best = l;
    }
  return best;
}

static void verify_clean(kvdb *db)
{
  kvdb_verify_report r;
  kvdb_status st = kvdb_verify(db, NULL, NULL, NULL, &r);
  if (st != KVDB_OK)
    fprintf(stderr, "verify: %s (%s)\n", kvdb_status_name(st), kvdb_errmsg());
  ASSERT_OK(st);
  ASSERT_EQ(r.problems, 0);
}

/* queries around stored context i: itself plus more, cut part-way and diverging */
static size_t check_queries(kvdb *db, const kvdb_model *m, const stored *s, size_t ns,
                            uint64_t seed, size_t nqueries, int with_get)
{
  uint32_t q[600];
  size_t checked = 0;
  for (size_t k = 0; k < nqueries; k++) {
    size_t i = t_rand(&seed) % ns;
    size_t cut = 1 + t_rand(&seed) % s[i].n;
    if (t_rand(&seed) % 3 == 0)
      cut = s[i].n; /* the whole context, then new tokens */
    memcpy(q, s[i].tok, cut * sizeof *q);
    size_t nq = cut + 1 + t_rand(&seed) % 40;
    for (size_t j = cut; j < nq; j++)
      q[j] = 40000 + (uint32_t)(t_rand(&seed) % 1000); /* never a stored token */
    size_t want = brute(s, ns, q, nq), hit = 0;
    ASSERT_OK(kvdb_lookup(db, m, q, nq, &hit));
    if (hit != want) {
      fprintf(stderr, "query %zu (context %zu, cut %zu of %zu, n %zu): lookup hit %zu, the "
                      "longest stored prefix is %zu\n", k, i, cut, s[i].n, nq, hit, want);
      abort();
    }
    if (with_get && k % 8 == 0)
      ASSERT_EQ(t_get_check(db, m, q, nq), want);
    checked++;
  }
  return checked;
}

/* 10,000 continuations of one 16-token block: a shared 5-token turn header, then a question of
 * 3..40 tokens drawn from 50 words (so many share longer prefixes too), some nested (one the
 * prefix of another). */
static void test_fanout(void)
{
  char *dir = t_tmpdir("index");
  kvdb_options o = opts();
  o.segment_bytes = 1 << 20; /* segments seal: compaction moves blocks */
  kvdb *db;
  ASSERT_OK(kvdb_open(dir, &o, &db));
  const kvdb_model *m = &M16;
  enum { N = 10000 };
  stored *s = calloc(N, sizeof *s);
  ASSERT(s != NULL);
  uint64_t seed = 42;
  uint32_t doc[16];
  for (int i = 0; i < 16; i++)
    doc[i] = 100 + (uint32_t)i;
  const uint32_t header[5] = {7, 8, 9, 10, 11};
  for (size_t i = 0; i < N; i++) {
    size_t extra = 3 + t_rand(&seed) % 38, n = 16 + 5 + extra;
    s[i].tok = malloc(n * sizeof *s[i].tok);
    ASSERT(s[i].tok != NULL);
    memcpy(s[i].tok, doc, sizeof doc);
    memcpy(s[i].tok + 16, header, sizeof header);
    if (i > 0 && i % 10 == 0) { /* nested: a prefix of an earlier one, or one extending it */
      const stored *e = &s[t_rand(&seed) % i];
      size_t take = 16 + 5 + t_rand(&seed) % (e->n - 21 + 1);
      if (take > n)
        take = n;
      memcpy(s[i].tok, e->tok, take * sizeof *s[i].tok);
      for (size_t j = take; j < n; j++)
        s[i].tok[j] = 1000 + (uint32_t)(t_rand(&seed) % 50);
    } else {
      for (size_t j = 21; j < n; j++)
        s[i].tok[j] = 1000 + (uint32_t)(t_rand(&seed) % 50);
    }
    s[i].n = n;
    s[i].live = 1;
    t_put_kv(db, m, s[i].tok, n, NULL);
  }
  size_t q = check_queries(db, m, s, N, 7, 3000, 1);
  verify_clean(db);

  /* delete a third, compact, relocate some (re-encoded: their blocks move): same answers */
  delete_thirds(db, m, s, N);
  kvdb_compact_report cr;
  ASSERT_OK(kvdb_compact(db, 1.0, NULL, NULL, &cr));
  ASSERT(cr.blocks_moved > 0);
  kvdb_config lossless;
  ASSERT_OK(kvdb_config_parse("lossless", &lossless));
  int moved = 0;
  for (size_t i = 1; i < N && moved < 200; i += 7) {
    if (!s[i].live)
      continue;
    kvdb_key keys[8];
    ASSERT_OK(kvdb_chain_hashes(m, s[i].tok, s[i].n, keys, 8));
    kvdb_status st = kvdb_relocate(db, m, &keys[(s[i].n + 15) / 16 - 1], &lossless,
                                   KVDB_TIER_SSD, NULL);
    ASSERT_OK(st);
    moved++;
  }
  ASSERT_OK(kvdb_compact(db, 1.0, NULL, NULL, &cr));
  verify_clean(db);
  q += check_queries(db, m, s, N, 8, 3000, 1);

  /* reopen read-only: the same answers from the same indexes */
  kvdb_close(db);
  o.flags = KVDB_O_RDONLY;
  ASSERT_OK(kvdb_open(dir, &o, &db));
  q += check_queries(db, m, s, N, 9, 500, 0);
  kvdb_close(db);
  free_stored(s, N);
  t_rmdir(dir);
  printf("ok fanout: 10,000 continuations of one block, %zu lookups at the longest stored "
         "prefix\n", q);
}

/* A 200-token system prompt (a partial first block of 256) among 1,000 unrelated contexts: the
 * model's root has 1,001 children. */
static void test_sysprompt(void)
{
  char *dir = t_tmpdir("index");
  kvdb_options o = opts();
  kvdb *db;
  ASSERT_OK(kvdb_open(dir, &o, &db));
  const kvdb_model *m = &M256;
  uint64_t seed = 5;
  uint32_t tok[600];
  for (int i = 0; i < 1000; i++) {
    size_t n = 100 + t_rand(&seed) % 400;
    for (size_t j = 0; j < n; j++)
      tok[j] = (uint32_t)(t_rand(&seed) % 32000);
    t_put_kv(db, m, tok, n, NULL);
  }
  uint32_t sys[200];
  for (int j = 0; j < 200; j++)
    sys[j] = 32000 + (uint32_t)j;
  t_put_kv(db, m, sys, 200, NULL);
  int hits = 0;
  for (int k = 0; k < 200; k++) {
    memcpy(tok, sys, sizeof sys);
    size_t n = 200 + 20 + t_rand(&seed) % 300;
    for (size_t j = 200; j < n; j++)
      tok[j] = (uint32_t)(t_rand(&seed) % 32000);
    size_t hit = 0;
    ASSERT_OK(kvdb_lookup(db, m, tok, n, &hit));
    hits += hit == 200;
    if (k % 20 == 0)
      ASSERT_EQ(t_get_check(db, m, tok, n), 200);
  }
  ASSERT_EQ(hits, 200);
  kvdb_close(db);
  t_rmdir(dir);
  printf("ok sysprompt: 200 of 200 hits of a 200-token prompt among 1,001 root children\n");
}

/* 256-token blocks whose children share long prefixes (so the trie descends through its
 * chunks of 8, 16, 32, 64 and 96 tokens): 1,500 contexts, each a random earlier one's prefix
 * of random length then new tokens; a third deleted, then 500 more sharing with the rest. */
static void test_deep(void)
{
  char *dir = t_tmpdir("index");
  kvdb_options o = opts();
  kvdb *db;
  ASSERT_OK(kvdb_open(dir, &o, &db));
  const kvdb_model *m = &M256;
  enum { N = 2000, FIRST = 1500 };
  stored *s = calloc(N, sizeof *s);
  ASSERT(s != NULL);
  uint64_t seed = 99;
  uint32_t head[256];
  for (int j = 0; j < 256; j++)
    head[j] = 20000 + (uint32_t)j; /* every context starts with this block, then diverges */
  size_t q = 0;
  for (size_t i = 0; i < N; i++) {
    if (i == FIRST) { /* delete a third of the first ones */
      delete_thirds(db, m, s, FIRST);
      verify_clean(db);
      q += check_queries(db, m, s, FIRST, 3, 1000, 1);
    }
    size_t n = 257 + t_rand(&seed) % 255; /* one full block and a partial one */
    s[i].tok = malloc(n * sizeof *s[i].tok);
    ASSERT(s[i].tok != NULL);
    memcpy(s[i].tok, head, sizeof head);
    size_t take = 256;
    if (i > 0) {
      const stored *e = &s[t_rand(&seed) % i];
      take = 256 + t_rand(&seed) % (e->n - 256 + 1);
      if (take > n)
        take = n;
      memcpy(s[i].tok, e->tok, take * sizeof *s[i].tok);
    }
    for (size_t j = take; j < n; j++)
      s[i].tok[j] = (uint32_t)(t_rand(&seed) % 4); /* 4 words: long shared runs */
    s[i].n = n;
    s[i].live = 1;
    t_put_kv(db, m, s[i].tok, n, NULL);
  }
  verify_clean(db);
  q += check_queries(db, m, s, N, 4, 3000, 1);
  kvdb_close(db);
  free_stored(s, N);
  t_rmdir(dir);
  printf("ok deep: 2,000 continuations of a 256-token block sharing long prefixes, %zu lookups "
         "at the longest stored prefix\n", q);
}

/* Turn a format-4 catalog into what a format-3 build writes: the legacy `children` database
 * (parent -> child hashes) in place of `next` and `segblocks`, meta format 3. */
static void make_format3(const char *dir)
{
  char path[4200];
  snprintf(path, sizeof path, "%s/catalog.mdb", dir);
  MDB_env *env;
  MDB_txn *txn;
  MDB_dbi meta, blocks, children, next, segblocks;
  ASSERT(mdb_env_create(&env) == 0);
  mdb_env_set_maxdbs(env, 16);
  mdb_env_set_mapsize(env, 1ull << 30);
  ASSERT(mdb_env_open(env, path, MDB_NOSUBDIR, 0644) == 0);
  ASSERT(mdb_txn_begin(env, NULL, 0, &txn) == 0);
  ASSERT(mdb_dbi_open(txn, "meta", 0, &meta) == 0);
  ASSERT(mdb_dbi_open(txn, "blocks", 0, &blocks) == 0);
  ASSERT(mdb_dbi_open(txn, "next", MDB_DUPSORT | MDB_DUPFIXED, &next) == 0);
  ASSERT(mdb_dbi_open(txn, "segblocks", MDB_DUPSORT | MDB_DUPFIXED, &segblocks) == 0);
  ASSERT(mdb_dbi_open(txn, "children", MDB_CREATE | MDB_DUPSORT | MDB_DUPFIXED, &children) == 0);
  MDB_cursor *cur;
  MDB_val k, v;
  ASSERT(mdb_cursor_open(txn, blocks, &cur) == 0);
  size_t n = 0;
  for (int mrc = mdb_cursor_get(cur, &k, &v, MDB_FIRST); mrc == 0;
       mrc = mdb_cursor_get(cur, &k, &v, MDB_NEXT), n++) {
    kv_block_rec br;
    ASSERT_OK(kv_block_rec_decode(v.mv_data, v.mv_size, &br));
    uint8_t parent[16], child[16];
    memcpy(parent, br.parent, 16);
    memcpy(child, k.mv_data, 16);
    MDB_val pk = {16, parent}, cv = {16, child};
    ASSERT(mdb_put(txn, children, &pk, &cv, MDB_NODUPDATA) == 0);
  }
  mdb_cursor_close(cur);
  ASSERT(mdb_drop(txn, next, 1) == 0 && mdb_drop(txn, segblocks, 1) == 0);
  uint8_t fmt[8] = {3};
  MDB_val fk = {6, "format"}, fv = {8, fmt};
  ASSERT(mdb_put(txn, meta, &fk, &fv, 0) == 0);
  ASSERT(mdb_txn_commit(txn) == 0);
  mdb_env_close(env);
  ASSERT(n > 1000);
}

/* A format-3 database (as an earlier build wrote it) with 2,000 children of one block: read
 * read-only as it is (every child examined, not 64), then opened read-write: upgraded to format
 * 4 in its open (both indexes built, `children` dropped), same answers, verify clean. */
static void test_upgrade(void)
{
  char *dir = t_tmpdir("index");
  kvdb_options o = opts();
  kvdb *db;
  ASSERT_OK(kvdb_open(dir, &o, &db));
  const kvdb_model *m = &M16;
  enum { N = 2000 };
  stored *s = calloc(N, sizeof *s);
  ASSERT(s != NULL);
  uint64_t seed = 3;
  for (size_t i = 0; i < N; i++) {
    size_t n = 17 + t_rand(&seed) % 40;
    s[i].tok = malloc(n * sizeof *s[i].tok);
    ASSERT(s[i].tok != NULL);
    for (size_t j = 0; j < n; j++)
      s[i].tok[j] = j < 16 ? 300 + (uint32_t)j : (uint32_t)(t_rand(&seed) % 5000);
    s[i].n = n;
    s[i].live = 1;
    t_put_kv(db, m, s[i].tok, n, NULL);
  }
  kvdb_close(db);
  make_format3(dir);
  o.flags = KVDB_O_RDONLY;
  ASSERT_OK(kvdb_open(dir, &o, &db));
  kvdb_stats st;
  ASSERT_OK(kvdb_stat(db, &st));
  ASSERT_EQ(st.format_version, 3);
  ASSERT(!db->cat.has_index && db->cat.has_children);
  size_t q = check_queries(db, m, s, N, 12, 1000, 1);
  kvdb_close(db);
  o = opts();
  ASSERT_OK(kvdb_open(dir, &o, &db));
  ASSERT_OK(kvdb_stat(db, &st));
  ASSERT_EQ(st.format_version, 4);
  ASSERT(db->cat.has_index && !db->cat.has_children);
  q += check_queries(db, m, s, N, 13, 1000, 1);
  verify_clean(db);
  kvdb_close(db);
  free_stored(s, N);
  t_rmdir(dir);
  printf("ok upgrade: format 3 with 2,000 children read read-only, upgraded read-write, %zu "
         "lookups exact, verify clean\n", q);
}

static void count_problem(void *ctx, const kvdb_problem *p)
{
  (void)p;
  ++*(int *)ctx;
}

/* 20,000 one-block contexts in segments of 64 blocks; half of one segment's deleted; compacting
 * it visits that segment's entries only. Then a damaged segment index is a verify problem. */
static void test_compact_linear(void)
{
  char *dir = t_tmpdir("index");
  kvdb_options o = opts();
  const kvdb_model *m = &MC;
  uint32_t tok[16];
  /* one block object's bytes (measured): a segment holds 64 of them */
  uint64_t seed = 11;
  kvdb *db;
  ASSERT_OK(kvdb_open(dir, &o, &db));
  for (int j = 0; j < 16; j++)
    tok[j] = (uint32_t)(t_rand(&seed) % 32000);
  kvdb_put_info info;
  {
    uint16_t buf[16 * 2 * 2 * 2 * 64];
    t_fill_kv(m, tok, 16, buf);
    kvdb_kv_view v;
    ASSERT_OK(kvdb_kv_view_packed(&v, buf, m, 16, KVDB_LAYOUT_LKTHD));
    ASSERT_OK(kvdb_put(db, m, tok, 16, &v, &info));
  }
  kv_txn *txn;
  kv_block_rec br;
  ASSERT_OK(kv_txn_begin(&db->cat, 0, &txn));
  ASSERT_OK(kv_cat_get_block(&db->cat, txn, info.context.b, &br));
  mdb_txn_abort(kv_mtxn(txn));
  kvdb_close(db);
  o.segment_bytes = 64 * KV_ALIGN_UP(br.bytes, KV_PAGE); /* a packed block's put: its pages */
  ASSERT_OK(kvdb_open(dir, &o, &db));
  enum { N = 20000 };
  kvdb_key *keys = malloc(N * sizeof *keys);
  ASSERT(keys != NULL);
  keys[0] = info.context;
  for (int i = 1; i < N; i++) {
    for (int j = 0; j < 16; j++)
      tok[j] = (uint32_t)(t_rand(&seed) % 32000);
    t_put_kv(db, m, tok, 16, NULL);
    ASSERT_OK(kvdb_chain_hashes(m, tok, 16, &keys[i], 1));
  }
  kvdb_stats st;
  ASSERT_OK(kvdb_stat(db, &st));
  ASSERT_EQ(st.n_blocks, N);
  /* the segment of context 1000's block; delete half of its blocks */
  ASSERT_OK(kv_txn_begin(&db->cat, 0, &txn));
  ASSERT_OK(kv_cat_get_block(&db->cat, txn, keys[1000].b, &br));
  uint64_t victim = br.segment;
  kvdb_key *del = malloc(64 * sizeof *del);
  ASSERT(del != NULL);
  int nd = 0, in_victim = 0;
  for (int i = 0; i < N; i++) {
    kv_block_rec b;
    ASSERT_OK(kv_cat_get_block(&db->cat, txn, keys[i].b, &b));
    if (b.segment == victim && in_victim++ % 2 == 0 && nd < 64)
      del[nd++] = keys[i];
  }
  mdb_txn_abort(kv_mtxn(txn));
  ASSERT_EQ(in_victim, 64);
  for (int i = 0; i < nd; i++)
    ASSERT_OK(kvdb_delete(db, &del[i]));
  db->compact_visits = 0;
  kvdb_compact_report cr;
  ASSERT_OK(kvdb_compact(db, 0.6, NULL, NULL, &cr)); /* only the victim is under 60% live */
  ASSERT_EQ(cr.blocks_moved, 32);
  uint64_t visits = db->compact_visits;
  printf("compaction of one segment (64 blocks, 32 live) among %d blocks visited %" PRIu64
         " index entries\n", N, visits);
  ASSERT(visits <= 64); /* the full-table scan visited 20,000 */
  verify_clean(db);
  ASSERT_OK(kvdb_stat(db, &st));
  ASSERT_EQ(st.n_blocks, N - 32);

  /* a damaged segment index (an entry gone, a stray one): verify reports both */
  ASSERT_OK(kv_txn_begin(&db->cat, 1, &txn));
  ASSERT_OK(kv_cat_get_block(&db->cat, txn, keys[5].b, &br));
  ASSERT_OK(kv_idx_seg_del(&db->cat, txn, br.segment, keys[5].b));
  ASSERT_OK(kv_idx_seg_add(&db->cat, txn, br.segment + 1000, keys[6].b));
  ASSERT_OK(kv_txn_commit(txn));
  int problems = 0;
  ASSERT_STATUS(KVDB_CORRUPT, kvdb_verify(db, count_problem, NULL, &problems, NULL));
  ASSERT_EQ(problems, 2);
  /* and kvdb_repair rebuilds the indexes from the block records */
  kvdb_repair_report rr;
  ASSERT_OK(kvdb_repair(db, 0, NULL, NULL, NULL, &rr));
  ASSERT_EQ(rr.problems, 2);
  verify_clean(db);
  free(del);
  free(keys);
  kvdb_close(db);
  t_rmdir(dir);
  printf("ok compact: linear in the victim's blocks; verify checks the segment index, repair "
         "rebuilds it\n");
}

int main(int argc, char **argv)
{
  const char *only = argc > 1 ? argv[1] : NULL;
  if (only == NULL || strcmp(only, "sysprompt") == 0)
    test_sysprompt();
  if (only == NULL || strcmp(only, "upgrade") == 0)
    test_upgrade();
  if (only == NULL || strcmp(only, "deep") == 0)
    test_deep();
  if (only == NULL || strcmp(only, "compact") == 0)
    test_compact_linear();
  if (only == NULL || strcmp(only, "fanout") == 0)
    test_fanout();
  return 0;
}
