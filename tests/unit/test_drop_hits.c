/* SPDX-License-Identifier: MIT */
/*
 * tests/unit/test_drop_hits.c — prefix hits of contexts stored with dropped tokens
 * (kvdb_lookup_kept, kvdb_get_kept): the hit and its kept count, the kept rows at their
 * positions bit for bit against kvdb_get_context, the absent positions exactly the dropped
 * ones, prefixes shorter than the context, a chain whose first blocks are raw and later ones
 * dropped, a flipped byte ending the hit, and bad arguments. kvdb_lookup and kvdb_get of such
 * a context keep their 0-token hit.
 */
#include "kvdb_test.h"

#include <fcntl.h>
#include <sys/stat.h>

#include "catalog/catalog.h"
#include "codec.h"

/* 3 full blocks of 32 tokens and a partial one of 4 */
static const kvdb_model M = {"test-drop-hits", 3, 2, 64, KVDB_F16, 32};
enum { N = 100, LH = 3 * 2 };
#define SENTINEL 0xEEEEu

static void tokens(uint32_t *t, size_t n, uint64_t seed)
{
  for (size_t i = 0; i < n; i++)
    t[i] = (uint32_t)(t_rand(&seed) % 30000);
}

/* finite f16 values of varied magnitude per channel, so knorm has norms to rank */
static void fill(const uint32_t *tok, size_t n, uint16_t *buf)
{
  size_t i = 0;
  for (uint32_t l = 0; l < M.n_layers; l++)
    for (uint32_t kv = 0; kv < 2; kv++)
      for (size_t t = 0; t < n; t++)
        for (uint32_t h = 0; h < M.n_kv_heads; h++)
          for (uint32_t d = 0; d < M.head_dim; d++) {
            uint64_t s = tok[t] * 2654435761u + t * 97 + l * 131 + kv * 7 + h * 17 + d;
            uint64_t r = t_rand(&s);
            uint16_t exp = (uint16_t)(10 + r % 7);  /* 2^-5 .. 2^1 */
            buf[i++] = (uint16_t)(((r >> 8) & 1) << 15 | exp << 10 | ((r >> 16) & 0x3ff));
          }
}

static size_t at(uint32_t l, uint32_t kv, size_t t, uint32_t h, size_t n)
{
  return ((((size_t)l * 2 + kv) * n + t) * M.n_kv_heads + h) * M.head_dim;
}

static uint16_t *alloc_kv(size_t n)
{
  uint16_t *b = malloc(n * kvdb_model_token_bytes(&M));
  ASSERT(b != NULL);
  return b;
}

static kvdb_options opts(uint64_t dram)
{
  kvdb_options o;
  kvdb_options_init(&o);
  o.dram_bytes = dram;
  o.log_level = -1;
  return o;
}

static float *queries(void)
{
  float *q = malloc((size_t)4 * M.n_layers * 4 * M.head_dim * sizeof *q);
  uint64_t s = 5;
  for (size_t i = 0; i < (size_t)4 * M.n_layers * 4 * M.head_dim; i++)
    q[i] = (float)((double)(t_rand(&s) % 2000) / 1000.0 - 1.0);
  return q;
}

static void put_cfg(kvdb *db, const uint32_t *tok, size_t n, const uint16_t *src, const char *cfg,
                    kvdb_put_info *info)
{
  kvdb_put_opts po;
  kvdb_put_opts_init(&po);
  ASSERT_OK(kvdb_config_parse(cfg, &po.config));
  float *q = queries();
  po.queries = q;
  po.n_queries = 4;
  po.n_q_heads = 4;
  kvdb_kv_view v;
  ASSERT_OK(kvdb_kv_view_packed(&v, (void *)src, &M, n, KVDB_LAYOUT_LKTHD));
  ASSERT_OK(kvdb_put_ex(db, &M, tok, n, &v, &po, info));
  free(q);
}

/*
 * Check a get_kept of tokens[0, nq) whose hit must be `want_hit`, against kvdb_get_context of
 * the context `key` (n_ctx tokens, holding the query's first want_hit tokens): the rows with a
 * position below want_hit are exactly the present ones, each bit for bit; every other row of
 * the view keeps the sentinel; the kept count is what kvdb_lookup_kept says. Returns the kept
 * count.
 */
static size_t check_kept(kvdb *db, const uint32_t *tok, size_t nq, const kvdb_key *key,
                         size_t n_ctx, size_t want_hit)
{
  size_t hit = 99, kept = 99, hit2 = 99, kept2 = 99;
  ASSERT_OK(kvdb_lookup_kept(db, &M, tok, nq, &hit, &kept));
  ASSERT_EQ(hit, want_hit);
  uint16_t *ctx = alloc_kv(n_ctx), *out = alloc_kv(nq);
  uint32_t *pos = malloc(LH * n_ctx * sizeof *pos), nrows[LH];
  kvdb_kv_view v;
  ASSERT_OK(kvdb_kv_view_packed(&v, ctx, &M, n_ctx, KVDB_LAYOUT_LKTHD));
  ASSERT_OK(kvdb_get_context(db, &M, key, &v, pos, nrows));
  for (size_t i = 0; i < nq * kvdb_model_token_bytes(&M) / 2; i++)
    out[i] = SENTINEL;
  uint8_t *present = malloc(LH * nq);
  memset(present, 7, LH * nq);
  ASSERT_OK(kvdb_kv_view_packed(&v, out, &M, nq, KVDB_LAYOUT_LKTHD));
  ASSERT_OK(kvdb_get_kept(db, &M, tok, nq, &v, present, LH * nq, &hit2, &kept2));
  ASSERT_EQ(hit2, want_hit);
  ASSERT_EQ(kept2, kept);
  for (uint32_t l = 0; l < M.n_layers; l++)
    for (uint32_t h = 0; h < M.n_kv_heads; h++) {
      uint32_t lh = l * M.n_kv_heads + h;
      uint8_t *mask = present + (size_t)lh * nq;
      uint8_t *want = calloc(nq, 1);
      size_t n_in = 0;
      for (uint32_t r = 0; r < nrows[lh]; r++) {
        uint32_t p = pos[(size_t)lh * n_ctx + r];
        if (p >= want_hit)
          continue;
        want[p] = 1;
        n_in++;
        for (uint32_t kv = 0; kv < 2; kv++) /* the kept row, bit for bit */
          ASSERT(memcmp(out + at(l, kv, p, h, nq), ctx + at(l, kv, r, h, n_ctx),
                        M.head_dim * 2) == 0);
      }
      ASSERT_EQ(n_in, kept);
      for (size_t t = 0; t < nq; t++) {
        ASSERT_EQ(mask[t], want[t]); /* absent exactly where dropped or past the hit */
        if (!want[t])
          for (uint32_t kv = 0; kv < 2; kv++)
            for (uint32_t d = 0; d < M.head_dim; d++)
              ASSERT_EQ(out[at(l, kv, t, h, nq) + d], SENTINEL);
      }
      free(want);
    }
  free(ctx);
  free(out);
  free(pos);
  free(present);
  return kept;
}

/* kept tokens of a context's first n tokens (whole blocks): the ratio exactly, rounded half up
 * (format 8: each block records its share, kv_drop_keep_span) */
static size_t keep_count(size_t n_tokens, unsigned permille)
{
  return (n_tokens * permille + 500) / 1000;
}

/* a context stored whole with dropping: lookup_kept/get_kept serve it, and its prefixes */
static void test_dropped(uint64_t dram)
{
  char *dir = t_tmpdir("drophits");
  kvdb_options o = opts(dram);
  kvdb *db;
  ASSERT_OK(kvdb_open(dir, &o, &db));
  uint16_t *src = alloc_kv(N + 20), *out = alloc_kv(N);
  const char *cfgs[] = {"knorm50", "snapkv50", "keydiff30+int4"};
  const unsigned permille[] = {500, 500, 300};
  for (int c = 0; c < 3; c++) {
    uint32_t tok[N + 20];
    tokens(tok, N + 20, 100 + (uint64_t)c);
    fill(tok, N, src);
    kvdb_put_info info;
    put_cfg(db, tok, N, src, cfgs[c], &info);
    /* kvdb_lookup and kvdb_get keep their 0-token hit */
    size_t hit = 99;
    ASSERT_OK(kvdb_lookup(db, &M, tok, N, &hit));
    ASSERT_EQ(hit, 0);
    kvdb_kv_view v;
    ASSERT_OK(kvdb_kv_view_packed(&v, out, &M, N, KVDB_LAYOUT_LKTHD));
    ASSERT_OK(kvdb_get(db, &M, tok, N, &v, &hit));
    ASSERT_EQ(hit, 0);
    /* the whole context */
    size_t want = keep_count(N, permille[c]);
    ASSERT_EQ(check_kept(db, tok, N, &info.context, N, N), want);
    if (c == 0) /* knorm50 keeps exactly half of each full block and 2 of the 4-token one */
      ASSERT_EQ(want, 50);
    /* prefixes: two whole blocks; a query ending inside block 2 ends the hit before it */
    ASSERT_EQ(check_kept(db, tok, 64, &info.context, N, 64), keep_count(64, permille[c]));
    ASSERT_EQ(check_kept(db, tok, 50, &info.context, N, 32), keep_count(32, permille[c]));
    ASSERT_EQ(check_kept(db, tok, 10, &info.context, N, 0), 0);
    /* a query continuing past the stored partial block: all of it hits */
    ASSERT_EQ(check_kept(db, tok, N + 20, &info.context, N, N), want);
  }
  /* a miss */
  uint32_t other[N];
  tokens(other, N, 999);
  size_t hit = 9, kept = 9;
  ASSERT_OK(kvdb_lookup_kept(db, &M, other, N, &hit, &kept));
  ASSERT_EQ(hit, 0);
  ASSERT_EQ(kept, 0);
  kvdb_close(db);
  free(src);
  free(out);
  t_rmdir(dir);
}

/* a chain whose first two blocks are stored raw (shared with a raw context put first) and
 * whose later blocks are dropped */
static void test_mixed(uint64_t dram)
{
  char *dir = t_tmpdir("dropmixed");
  kvdb_options o = opts(dram);
  kvdb *db;
  ASSERT_OK(kvdb_open(dir, &o, &db));
  uint16_t *src = alloc_kv(N), *src64 = alloc_kv(64);
  uint32_t tok[N];
  tokens(tok, N, 55);
  fill(tok, N, src);
  fill(tok, 64, src64);
  kvdb_put_info raw, info;
  put_cfg(db, tok, 64, src64, "raw", &raw);
  put_cfg(db, tok, N, src, "knorm50", &info);
  ASSERT_EQ(info.blocks_shared, 2);
  size_t hit = 0;
  ASSERT_OK(kvdb_lookup(db, &M, tok, N, &hit));
  ASSERT_EQ(hit, 64); /* kvdb_lookup stops at the first dropped block, as before */
  ASSERT_EQ(check_kept(db, tok, N, &info.context, N, N), 64 + 16 + 2);
  /* a prefix ending inside a raw block hits in part, as kvdb_lookup */
  ASSERT_EQ(check_kept(db, tok, 40, &info.context, N, 40), 40);
  /* the raw rows are the put's */
  uint16_t *out = alloc_kv(N);
  uint8_t *present = malloc(LH * N);
  kvdb_kv_view v;
  ASSERT_OK(kvdb_kv_view_packed(&v, out, &M, N, KVDB_LAYOUT_LKTHD));
  size_t kept;
  ASSERT_OK(kvdb_get_kept(db, &M, tok, N, &v, present, LH * N, &hit, &kept));
  for (uint32_t l = 0; l < M.n_layers; l++)
    for (uint32_t kv = 0; kv < 2; kv++)
      ASSERT(memcmp(out + at(l, kv, 0, 0, N), src + at(l, kv, 0, 0, N),
                    64 * kvdb_model_token_bytes(&M) / (2 * M.n_layers)) == 0);
  kvdb_close(db);
  free(src);
  free(src64);
  free(out);
  free(present);
  t_rmdir(dir);
}

/* a flipped byte in block 1 of a dropped context ends the hit before it; nothing wrong is
 * marked present */
static void test_corrupt(void)
{
  char *dir = t_tmpdir("dropcorrupt");
  kvdb_options o = opts(0);
  kvdb *db;
  ASSERT_OK(kvdb_open(dir, &o, &db));
  uint16_t *src = alloc_kv(N), *out = alloc_kv(N);
  uint32_t tok[N];
  tokens(tok, N, 77);
  fill(tok, N, src);
  kvdb_put_info info;
  put_cfg(db, tok, N, src, "knorm50", &info);
  kvdb_close(db);
  char path[4200];
  snprintf(path, sizeof path, "%s/ssd/seg-0000000000000001.kvs", dir);
  int fd = open(path, O_RDWR);
  ASSERT(fd >= 0);
  uint64_t b0 = t_first_object_bytes(fd);
  off_t off = (off_t)b0 + 4096 * 2 + 10; /* inside block 1 */
  uint8_t byte;
  ASSERT(pread(fd, &byte, 1, off) == 1);
  byte ^= 0x20;
  ASSERT(pwrite(fd, &byte, 1, off) == 1);
  close(fd);
  ASSERT_OK(kvdb_open(dir, &o, &db));
  size_t hit, kept;
  ASSERT_OK(kvdb_lookup_kept(db, &M, tok, N, &hit, &kept));
  ASSERT_EQ(hit, N); /* no block data is read */
  uint8_t *present = malloc(LH * N);
  kvdb_kv_view v;
  ASSERT_OK(kvdb_kv_view_packed(&v, out, &M, N, KVDB_LAYOUT_LKTHD));
  ASSERT_OK(kvdb_get_kept(db, &M, tok, N, &v, present, LH * N, &hit, &kept));
  ASSERT_EQ(hit, 32);
  ASSERT_EQ(kept, 16);
  for (uint32_t lh = 0; lh < LH; lh++)
    for (size_t t = 32; t < N; t++)
      ASSERT_EQ(present[lh * N + t], 0);
  kvdb_stats st;
  ASSERT_OK(kvdb_stat(db, &st));
  ASSERT_EQ(st.corrupt_blocks, 1);
  kvdb_close(db);
  free(src);
  free(out);
  free(present);
  t_rmdir(dir);
}

static void test_bad_args(void)
{
  char *dir = t_tmpdir("dropbad");
  kvdb_options o = opts(0);
  kvdb *db;
  ASSERT_OK(kvdb_open(dir, &o, &db));
  uint16_t *src = alloc_kv(N), *out = alloc_kv(N);
  uint32_t tok[N];
  tokens(tok, N, 88);
  fill(tok, N, src);
  put_cfg(db, tok, N, src, "knorm50", NULL);
  uint8_t *present = malloc(LH * N);
  kvdb_kv_view v;
  ASSERT_OK(kvdb_kv_view_packed(&v, out, &M, N, KVDB_LAYOUT_LKTHD));
  size_t hit = 5, kept = 5;
  ASSERT_STATUS(KVDB_INVALID, kvdb_get_kept(db, &M, tok, N, &v, NULL, LH * N, &hit, &kept));
  ASSERT_MSG_HAS("present is NULL");
  ASSERT_EQ(hit, 0);
  ASSERT_EQ(kept, 0);
  ASSERT_STATUS(KVDB_INVALID, kvdb_get_kept(db, &M, tok, N, &v, present, LH * N - 1, &hit, &kept));
  ASSERT_MSG_HAS("present_cap");
  ASSERT_STATUS(KVDB_INVALID, kvdb_get_kept(db, &M, tok, N, &v, present, LH * N, NULL, &kept));
  ASSERT_MSG_HAS("hit_tokens");
  ASSERT_STATUS(KVDB_INVALID, kvdb_get_kept(db, &M, tok, N, NULL, present, LH * N, &hit, &kept));
  ASSERT_MSG_HAS("out");
  ASSERT_STATUS(KVDB_INVALID, kvdb_get_kept(db, &M, tok, 0, &v, present, LH * N, &hit, &kept));
  ASSERT_MSG_HAS("n is 0");
  ASSERT_STATUS(KVDB_INVALID, kvdb_lookup_kept(db, &M, tok, N, &hit, NULL));
  ASSERT_MSG_HAS("kept_tokens is NULL");
  ASSERT_STATUS(KVDB_INVALID, kvdb_lookup_kept(db, &M, tok, N, NULL, &kept));
  ASSERT_MSG_HAS("hit_tokens is NULL");
  /* the same id with another shape */
  kvdb_model m2 = M;
  m2.head_dim = 32;
  ASSERT_STATUS(KVDB_MISMATCH, kvdb_lookup_kept(db, &m2, tok, N, &hit, &kept));
  kvdb_close(db);
  free(src);
  free(out);
  free(present);
  t_rmdir(dir);
}

/* kept tokens a context of n tokens stores at `permille`: its blocks' context-exact shares */
static size_t spans(size_t n, unsigned permille)
{
  size_t k = 0;
  for (size_t t0 = 0; t0 < n; t0 += M.block_tokens)
    k += kv_drop_keep_span(t0, (uint32_t)(n - t0 < M.block_tokens ? n - t0 : M.block_tokens),
                           permille);
  return k;
}

/* issue 16: a stored context keeps round(keep x n_tokens) tokens per head whatever its length
 * (the blocks carry the rounding remainder: FORMAT.md §2, KV_BLK_KEPTN), not each block's
 * ratio rounded up; every prefix of whole blocks keeps its own exact share too */
static void test_exact_ratio(void)
{
  char *dir = t_tmpdir("dropexact");
  kvdb_options o = opts(0);
  kvdb *db;
  ASSERT_OK(kvdb_open(dir, &o, &db));
  const struct {
    const char *cfg;
    unsigned permille;
  } cf[] = {{"knorm90", 900}, {"keydiff30+int4", 300}, {"knorm75+int8", 750},
            {"snapkv50", 500}, {"keydiff12.5", 125}};
  const size_t lens[] = {1, 31, 32, 33, 100, 257, 500};
  uint64_t seed = 1000;
  for (size_t c = 0; c < sizeof cf / sizeof cf[0]; c++)
    for (size_t l = 0; l < sizeof lens / sizeof lens[0]; l++) {
      size_t n = lens[l];
      if (cf[c].permille == 500 && n < 32)
        continue; /* snapkv's observation window needs a longer context */
      uint32_t *tok = malloc(n * sizeof *tok);
      uint16_t *src = alloc_kv(n);
      tokens(tok, n, seed++);
      fill(tok, n, src);
      kvdb_put_info info;
      put_cfg(db, tok, n, src, cf[c].cfg, &info);
      size_t exact = (n * cf[c].permille + 500) / 1000, want = spans(n, cf[c].permille);
      /* a block whose share rounds to no token still keeps one row: with R(x) = x * permille
       * / 1000 rounded, the 1-token tails (30% of 1 token; of 33: R(33) = R(32) = 10); with
       * these ratios and 32-token blocks never a full block, so every other length is exact */
      size_t z = 0;
      for (size_t t0 = 0; t0 < n; t0 += 32) {
        size_t e = t0 + 32 < n ? t0 + 32 : n;
        z += (e * cf[c].permille + 500) / 1000 == (t0 * cf[c].permille + 500) / 1000;
      }
      ASSERT_EQ(want, exact + z);
      if (n % 32 != 1)
        ASSERT_EQ(z, 0);
      ASSERT_EQ(check_kept(db, tok, n, &info.context, n, n), want);
      if (n >= 64) /* a prefix of whole blocks: its own exact share */
        ASSERT_EQ(check_kept(db, tok, 64, &info.context, n, 64), (64 * cf[c].permille + 500) / 1000);
      free(tok);
      free(src);
    }
  /* 90% of 500 tokens in 32-token blocks: 450 rows, where the per-block ceiling kept 453 */
  ASSERT_EQ(spans(500, 900), 450);
  kvdb_stats st;
  ASSERT_OK(kvdb_stat(db, &st));
  /* the blocks record their counts (KV_BLK_KEPTN, format 8) and are packed (format 9) */
  ASSERT_EQ(st.format_version, 9);
  kvdb_close(db);
  t_rmdir(dir);
}

/* the block record's offset 14 in both forms: a block written before format 8 (the ratio in
 * permille, kept = ceil per block, as every golden database's) and after (the kept count) */
static void test_record_forms(void)
{
  uint32_t tok[16] = {0};
  uint8_t buf[72 + 4 * 16];
  kv_block_rec r = {.refcount = 1, .tier = KVDB_TIER_SSD, .n_tokens = 16, .segment = 1,
                    .offset = 4096, .bytes = 4096, .method = KVDB_METHOD_DROP,
                    .bflags = KV_BLK_COMPRESSED | KV_BLK_DROPS, .drop = 1, .keep_permille = 900};
  kv_block_rec d;
  kv_block_rec_encode(&r, tok, buf);
  ASSERT_OK(kv_block_rec_decode(buf, sizeof buf, &d));
  ASSERT_EQ(kv_block_rec_kept(&d), 15); /* old rounding: ceil(16 x 0.9) */
  r.bflags |= KV_BLK_KEPTN;
  r.keep_permille = 14;
  kv_block_rec_encode(&r, tok, buf);
  ASSERT_OK(kv_block_rec_decode(buf, sizeof buf, &d));
  ASSERT_EQ(kv_block_rec_kept(&d), 14);
  r.keep_permille = 17; /* more than its tokens */
  kv_block_rec_encode(&r, tok, buf);
  ASSERT_STATUS(KVDB_CORRUPT, kv_block_rec_decode(buf, sizeof buf, &d));
  r.keep_permille = 0;
  kv_block_rec_encode(&r, tok, buf);
  ASSERT_STATUS(KVDB_CORRUPT, kv_block_rec_decode(buf, sizeof buf, &d));
  r = (kv_block_rec){.refcount = 1, .tier = KVDB_TIER_SSD, .n_tokens = 16, .segment = 1,
                     .offset = 4096, .bytes = 4096, .bflags = KV_BLK_KEPTN}; /* not dropped */
  kv_block_rec_encode(&r, tok, buf);
  ASSERT_STATUS(KVDB_CORRUPT, kv_block_rec_decode(buf, sizeof buf, &d));
}

int main(void)
{
  test_record_forms();
  test_exact_ratio();
  test_bad_args();
  test_dropped(0);
  test_dropped(64u << 20); /* with a DRAM tier */
  test_mixed(0);
  test_mixed(64u << 20);
  test_corrupt();
  printf("ok\n");
  return 0;
}
