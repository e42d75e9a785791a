/* SPDX-License-Identifier: MIT */
/*
 * tests/unit/test_api.c — the public API as a user meets it: round trips (also through a
 * second process), prefix hits, dedup, explicit keys, delete, iteration, get_tokens, and every
 * kind of bad input and damaged file the engine must refuse or survive.
 */
#include "kvdb_test.h"
#include "cat_edit.h" /* white-box: LMDB directly */

#include <fcntl.h>
#include <pthread.h>
#include <sys/stat.h>
#include <sys/wait.h>

static kvdb_model M_SMALL = {"test-small", 2, 2, 64, KVDB_F16, 16};  /* packed sections */
static kvdb_model M_PAGED = {"test-paged", 2, 2, 128, KVDB_F16, 64}; /* 4 groups of 16 */

static kvdb_options quiet_opts(void)
{
  kvdb_options o;
  kvdb_options_init(&o);
  o.dram_bytes = 8 << 20;
  o.log_level = -1;
  return o;
}

static kvdb *t_open(const char *dir)
{
  kvdb_options o = quiet_opts();
  kvdb *db;
  ASSERT_OK(kvdb_open(dir, &o, &db));
  return db;
}

static void make_tokens(uint32_t *t, size_t n, uint64_t seed)
{
  for (size_t i = 0; i < n; i++)
    t[i] = (uint32_t)(t_rand(&seed) % 32000);
}

static void test_roundtrip_and_reopen(void)
{
  char *dir = t_tmpdir("rt");
  const kvdb_model *ms[2] = {&M_SMALL, &M_PAGED};
  uint32_t tok[300];
  make_tokens(tok, 300, 1);
  kvdb *db = t_open(dir);
  for (int k = 0; k < 2; k++) {
    kvdb_put_info info;
    t_put_kv(db, ms[k], tok, 300, &info);
    uint32_t bt = ms[k]->block_tokens;
    ASSERT_EQ(info.n_blocks, (300 + bt - 1) / bt);
    ASSERT_EQ(info.blocks_written, info.n_blocks);
    ASSERT_EQ(t_get_check(db, ms[k], tok, 300), 300);
    size_t hit;
    ASSERT_OK(kvdb_lookup(db, ms[k], tok, 300, &hit));
    ASSERT_EQ(hit, 300);
  }
  kvdb_close(db);
  /* a second process reopens and reads everything back bit-exact (cold: no DRAM) */
  pid_t pid = fork();
  if (pid == 0) {
    kvdb *db2 = t_open(dir);
    for (int k = 0; k < 2; k++)
      if (t_get_check(db2, ms[k], tok, 300) != 300)
        _exit(1);
    kvdb_stats st;
    ASSERT_OK(kvdb_stat(db2, &st));
    if (st.n_contexts != 2 || st.tier[KVDB_TIER_SSD].hits == 0)
      _exit(2);
    kvdb_close(db2);
    _exit(0);
  }
  int status;
  waitpid(pid, &status, 0);
  ASSERT(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  /* both handles at once in two processes */
  db = t_open(dir);
  pid = fork();
  if (pid == 0) {
    kvdb *db2 = t_open(dir);
    uint32_t t2[40];
    make_tokens(t2, 40, 99);
    t_put_kv(db2, &M_SMALL, t2, 40, NULL);
    kvdb_close(db2);
    _exit(0);
  }
  waitpid(pid, &status, 0);
  ASSERT(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  uint32_t t2[40];
  make_tokens(t2, 40, 99);
  ASSERT_EQ(t_get_check(db, &M_SMALL, t2, 40), 40);
  ASSERT_OK(kvdb_verify(db, NULL, NULL, NULL, NULL));
  kvdb_close(db);
  t_rmdir(dir);
}

static void test_prefix_sharing(void)
{
  char *dir = t_tmpdir("prefix");
  kvdb *db = t_open(dir);
  const kvdb_model *m = &M_SMALL; /* 16-token blocks */
  uint32_t a[100], b[100];
  make_tokens(a, 100, 2);
  memcpy(b, a, sizeof a);
  for (int i = 40; i < 100; i++)
    b[i] = a[i] + 1; /* b shares a's first 40 tokens */
  kvdb_put_info info;
  t_put_kv(db, m, a, 100, &info);
  ASSERT_EQ(info.blocks_written, 7);
  t_put_kv(db, m, b, 100, &info);
  ASSERT_EQ(info.blocks_shared, 2); /* blocks 0 and 1 (tokens 0..31) */
  ASSERT_EQ(info.blocks_written, 5);
  /* putting a again is a no-op */
  t_put_kv(db, m, a, 100, &info);
  ASSERT_EQ(info.blocks_written, 0);
  /* a query sharing 45 tokens with a: 2 full blocks + 13 tokens of block 2 via the tail scan */
  uint32_t q[80];
  memcpy(q, a, 45 * 4);
  for (int i = 45; i < 80; i++)
    q[i] = 40000 + i;
  size_t hit;
  ASSERT_OK(kvdb_lookup(db, m, q, 80, &hit));
  ASSERT_EQ(hit, 45);
  ASSERT_EQ(t_get_check(db, m, q, 80), 45);
  /* shorter than a block */
  ASSERT_OK(kvdb_lookup(db, m, a, 7, &hit));
  ASSERT_EQ(hit, 7);
  ASSERT_EQ(t_get_check(db, m, a, 7), 7);
  /* a trailing partial block (100 = 6*16 + 4) is found exactly and as a prefix */
  ASSERT_OK(kvdb_lookup(db, m, a, 98, &hit));
  ASSERT_EQ(hit, 98);
  uint32_t longer[120];
  memcpy(longer, a, sizeof a);
  make_tokens(longer + 100, 20, 5);
  ASSERT_OK(kvdb_lookup(db, m, longer, 120, &hit));
  ASSERT_EQ(hit, 100);
  ASSERT_EQ(t_get_check(db, m, longer, 120), 100);
  /* first token differs: nothing */
  q[0] = a[0] + 7;
  ASSERT_OK(kvdb_lookup(db, m, q, 80, &hit));
  ASSERT_EQ(hit, 0);
  /* another model id never sees these blocks */
  kvdb_model other = *m;
  other.id = "another";
  ASSERT_OK(kvdb_lookup(db, &other, a, 100, &hit));
  ASSERT_EQ(hit, 0);
  /* delete a: b's shared blocks survive */
  kvdb_key ka = {{0}}, kb;
  kvdb_key hashes[7];
  ASSERT_OK(kvdb_chain_hashes(m, a, 100, hashes, 7));
  ka = hashes[6];
  ASSERT_OK(kvdb_delete(db, &ka));
  ASSERT_STATUS(KVDB_NOTFOUND, kvdb_delete(db, &ka));
  ASSERT_OK(kvdb_lookup(db, m, a, 100, &hit));
  ASSERT_EQ(hit, 40); /* 2 shared blocks + b's block 2, whose first 8 tokens are a's */
  ASSERT_OK(kvdb_chain_hashes(m, b, 100, hashes, 7));
  kb = hashes[6];
  ASSERT_EQ(t_get_check(db, m, b, 100), 100);
  kvdb_context_info ci;
  ASSERT_OK(kvdb_context_stat(db, &kb, &ci));
  ASSERT_EQ(ci.n_tokens, 100);
  ASSERT_EQ(ci.n_blocks, 7);
  ASSERT(strcmp(ci.model_id, "test-small") == 0);
  /* iterate: exactly one context left */
  kvdb_iter *it;
  ASSERT_OK(kvdb_iter_open(db, &it));
  int n = 0;
  while (kvdb_iter_next(it, &ci) == KVDB_OK)
    n++;
  kvdb_iter_close(it);
  ASSERT_EQ(n, 1);
  ASSERT_OK(kvdb_verify(db, NULL, NULL, NULL, NULL));
  /* compaction reclaims a's dead blocks and keeps b readable */
  kvdb_close(db);
  kvdb_options o = quiet_opts();
  o.segment_bytes = 1 << 20;
  ASSERT_OK(kvdb_open(dir, &o, &db));
  for (int r = 0; r < 40; r++) { /* fill and seal a few segments, then delete most */
    uint32_t t[64];
    make_tokens(t, 64, 1000 + r);
    t_put_kv(db, m, t, 64, NULL);
    if (r % 4 != 0) {
      ASSERT_OK(kvdb_chain_hashes(m, t, 64, hashes, 4));
      ASSERT_OK(kvdb_delete(db, &hashes[3]));
    }
  }
  kvdb_stats before, after;
  ASSERT_OK(kvdb_stat(db, &before));
  kvdb_compact_report rep;
  ASSERT_OK(kvdb_compact(db, 0.9, NULL, NULL, &rep));
  ASSERT_OK(kvdb_stat(db, &after));
  ASSERT(rep.segments_rewritten > 0);
  ASSERT(after.segment_file_bytes < before.segment_file_bytes);
  ASSERT_EQ(after.live_bytes, before.live_bytes);
  ASSERT_EQ(t_get_check(db, m, b, 100), 100);
  for (int r = 0; r < 40; r += 4) {
    uint32_t t[64];
    make_tokens(t, 64, 1000 + r);
    ASSERT_EQ(t_get_check(db, m, t, 64), 64);
  }
  ASSERT_OK(kvdb_verify(db, NULL, NULL, NULL, NULL));
  kvdb_close(db);
  t_rmdir(dir);
}

static void test_get_tokens(void)
{
  char *dir = t_tmpdir("gt");
  kvdb *db = t_open(dir);
  const kvdb_model *ms[2] = {&M_PAGED, &M_SMALL};
  for (int k = 0; k < 2; k++) {
    const kvdb_model *m = ms[k];
    uint32_t tok[200];
    make_tokens(tok, 200, 3 + k);
    kvdb_put_info info;
    t_put_kv(db, m, tok, 200, &info);
    uint32_t pos[] = {0, 199, 17, 17, 64, 130, 5};
    size_t np = sizeof pos / sizeof pos[0];
    size_t row = (size_t)m->n_kv_heads * m->head_dim;
    uint16_t *out = calloc(2 * np * row, 2);
    kvdb_kv_view v;
    /* out: [K,V][i][head][dim] */
    ASSERT_OK(kvdb_kv_view_packed(&v, out, m, np, KVDB_LAYOUT_LKTHD));
    for (uint32_t layer = 0; layer < m->n_layers; layer++) {
      kvdb_close(db); /* cold: from disk, page by page */
      db = t_open(dir);
      kvdb_stats st0, st1;
      ASSERT_OK(kvdb_stat(db, &st0));
      ASSERT_OK(kvdb_get_tokens(db, m, &info.context, layer, pos, np, &v));
      ASSERT_OK(kvdb_stat(db, &st1));
      for (size_t i = 0; i < np; i++)
        for (uint32_t kv = 0; kv < 2; kv++)
          for (uint32_t h = 0; h < m->n_kv_heads; h++)
            for (uint32_t d = 0; d < m->head_dim; d++)
              ASSERT_EQ(out[((kv * np + i) * m->n_kv_heads + h) * m->head_dim + d],
                        t_kv_value(tok, pos[i], layer, kv, h, d));
      if (m == &M_PAGED) /* only some pages of 4 blocks were read, never whole blocks */
        ASSERT(st1.bytes_read - st0.bytes_read < 4ull * 64 * kvdb_model_token_bytes(m) / 2);
    }
    uint32_t bad = 200;
    ASSERT_STATUS(KVDB_INVALID, kvdb_get_tokens(db, m, &info.context, 0, &bad, 1, &v));
    ASSERT_MSG_HAS("out of range");
    ASSERT_STATUS(KVDB_INVALID, kvdb_get_tokens(db, m, &info.context, m->n_layers, pos, 1, &v));
    ASSERT_MSG_HAS("layer");
    kvdb_key nokey = {{1, 2, 3}};
    ASSERT_STATUS(KVDB_NOTFOUND, kvdb_get_tokens(db, m, &nokey, 0, pos, 1, &v));
    free(out);
  }
  kvdb_close(db);
  t_rmdir(dir);
}

static void test_explicit_keys_and_layouts(void)
{
  char *dir = t_tmpdir("xk");
  kvdb *db = t_open(dir);
  const kvdb_model *m = &M_SMALL;
  uint32_t tok[16];
  make_tokens(tok, 16, 7);
  size_t tb = kvdb_model_token_bytes(m);
  uint16_t *buf = malloc(16 * tb), *out = calloc(16, tb);
  t_fill_kv(m, tok, 16, buf);
  kvdb_kv_view v, vo;
  ASSERT_OK(kvdb_kv_view_packed(&v, buf, m, 16, KVDB_LAYOUT_LKTHD));
  kvdb_key key = {{0xde, 0xad, 0xbe, 0xef}};
  ASSERT_OK(kvdb_put_block(db, m, &key, tok, 16, &v));
  ASSERT_OK(kvdb_put_block(db, m, &key, tok, 16, &v)); /* same tokens: no-op */
  uint32_t other[16];
  make_tokens(other, 16, 8);
  ASSERT_STATUS(KVDB_INVALID, kvdb_put_block(db, m, &key, other, 16, &v));
  /* read back into a Hugging Face layout ([layer][kv][head][token][dim]) */
  ASSERT_OK(kvdb_kv_view_packed(&vo, out, m, 16, KVDB_LAYOUT_LKHTD));
  size_t nt;
  ASSERT_OK(kvdb_get_block(db, m, &key, tok, 16, &vo, &nt));
  ASSERT_EQ(nt, 16);
  for (uint32_t l = 0; l < m->n_layers; l++)
    for (uint32_t kv = 0; kv < 2; kv++)
      for (uint32_t h = 0; h < m->n_kv_heads; h++)
        for (uint32_t t = 0; t < 16; t++)
          for (uint32_t d = 0; d < m->head_dim; d++)
            ASSERT_EQ(out[((((size_t)l * 2 + kv) * m->n_kv_heads + h) * 16 + t) * m->head_dim + d],
                      t_kv_value(tok, t, l, kv, h, d));
  ASSERT_STATUS(KVDB_NOTFOUND, kvdb_get_block(db, m, &key, other, 16, &vo, &nt));
  kvdb_key missing = {{9}};
  ASSERT_STATUS(KVDB_NOTFOUND, kvdb_get_block(db, m, &missing, NULL, 0, &vo, &nt));
  /* per-layer base pointers and a strided (transposed) V: the llama.cpp v_trans layout */
  uint16_t *kl[2], *vl[2];
  for (int l = 0; l < 2; l++) {
    kl[l] = calloc(16 * 2 * 64, 2);
    vl[l] = calloc(16 * 2 * 64, 2);
  }
  kvdb_kv_view sv = {0};
  sv.k.layer_bases = (void *const *)kl;
  sv.k.token_stride = 2 * 64 * 2;
  sv.k.head_stride = 64 * 2;
  sv.v.layer_bases = (void *const *)vl;
  sv.v.head_stride = 64 * 16 * 2; /* V[head][dim][token] */
  sv.v.dim_stride = 16 * 2;
  sv.v.token_stride = 2;
  ASSERT_OK(kvdb_get_block(db, m, &key, NULL, 0, &sv, &nt));
  for (uint32_t l = 0; l < 2; l++)
    for (uint32_t t = 0; t < 16; t++)
      for (uint32_t h = 0; h < 2; h++)
        for (uint32_t d = 0; d < 64; d++) {
          ASSERT_EQ(kl[l][(t * 2 + h) * 64 + d], t_kv_value(tok, t, l, 0, h, d));
          ASSERT_EQ(vl[l][(h * 64 + d) * 16 + t], t_kv_value(tok, t, l, 1, h, d));
        }
  kvdb_key ctx;
  ASSERT_OK(kvdb_block_context(m, &key, &ctx));
  kvdb_context_info ci;
  ASSERT_OK(kvdb_context_stat(db, &ctx, &ci));
  ASSERT_EQ(ci.explicit_key, 1);
  ASSERT_OK(kvdb_delete(db, &ctx));
  ASSERT_STATUS(KVDB_NOTFOUND, kvdb_get_block(db, m, &key, NULL, 0, &vo, &nt));
  for (int l = 0; l < 2; l++) {
    free(kl[l]);
    free(vl[l]);
  }
  free(buf);
  free(out);
  kvdb_close(db);
  t_rmdir(dir);
}

/* 1 when an LKHTD ([layer][kv][head][token][dim]) buffer holds tokens[0..n) exactly */
static int check_lkhtd(const kvdb_model *m, const uint32_t *tok, size_t n, const uint16_t *out)
{
  for (uint32_t l = 0; l < m->n_layers; l++)
    for (uint32_t kv = 0; kv < 2; kv++)
      for (uint32_t h = 0; h < m->n_kv_heads; h++)
        for (size_t t = 0; t < n; t++)
          for (uint32_t d = 0; d < m->head_dim; d++)
            if (out[((((size_t)l * 2 + kv) * m->n_kv_heads + h) * n + t) * m->head_dim + d] !=
                t_kv_value(tok, t, l, kv, h, d))
              return 0;
  return 1;
}

/*
 * Blocks big enough (20 MiB) for the copies into the caller's buffer to use non-temporal
 * stores and for a get to read each block in two waves (16 layers, then 4), read back from
 * disk and then from the DRAM tier into buffers at every alignment the copy distinguishes
 * (64-byte, 16-byte, 8-byte: the last one cannot stream) and in both orders of heads and
 * tokens; then a byte flipped in the second wave of the second block.
 */
static void test_large_blocks_layouts_alignments(void)
{
  static const kvdb_model M_BIG = {"test-big", 20, 8, 128, KVDB_F16, 256};
  const kvdb_model *m = &M_BIG;
  char *dir = t_tmpdir("big");
  kvdb_options o = quiet_opts();
  o.dram_bytes = 64 << 20;
  kvdb *db;
  ASSERT_OK(kvdb_open(dir, &o, &db));
  enum { N = 512 };
  uint32_t tok[N];
  make_tokens(tok, N, 91);
  size_t tb = kvdb_model_token_bytes(m);
  uint16_t *src = malloc(N * tb);
  t_fill_kv(m, tok, N, src);
  kvdb_kv_view v;
  ASSERT_OK(kvdb_kv_view_packed(&v, src, m, N, KVDB_LAYOUT_LKTHD));
  ASSERT_OK(kvdb_put(db, m, tok, N, &v, NULL));
  kvdb_close(db);
  uint8_t *raw = NULL;
  ASSERT(posix_memalign((void **)&raw, 64, N * tb + 64) == 0);
  const size_t shift[3] = {0, 16, 8};
  for (int pass = 0; pass < 2; pass++) { /* 0: every get from disk; 1: from the DRAM tier */
    o.dram_bytes = pass == 0 ? 0 : 96 << 20;
    ASSERT_OK(kvdb_open(dir, &o, &db));
    if (pass == 1) { /* load the tier */
      ASSERT_OK(kvdb_kv_view_packed(&v, raw, m, N, KVDB_LAYOUT_LKTHD));
      size_t hit = 0;
      ASSERT_OK(kvdb_get(db, m, tok, N, &v, &hit));
      ASSERT_EQ(hit, N);
    }
    for (int a = 0; a < 3; a++) {
      uint16_t *out = (uint16_t *)(raw + shift[a]);
      memset(raw, 0xA5, N * tb + 64);
      ASSERT_OK(kvdb_kv_view_packed(&v, out, m, N, KVDB_LAYOUT_LKTHD));
      size_t hit = 0;
      ASSERT_OK(kvdb_get(db, m, tok, N, &v, &hit));
      ASSERT_EQ(hit, N);
      ASSERT_EQ(t_check_kv(m, tok, N, N, out), N);
      memset(raw, 0xA5, N * tb + 64);
      ASSERT_OK(kvdb_kv_view_packed(&v, out, m, N, KVDB_LAYOUT_LKHTD));
      ASSERT_OK(kvdb_get(db, m, tok, N, &v, &hit));
      ASSERT_EQ(hit, N);
      ASSERT(check_lkhtd(m, tok, N, out));
    }
    kvdb_stats st;
    ASSERT_OK(kvdb_stat(db, &st));
    ASSERT_EQ(st.tier[KVDB_TIER_SSD].hits, pass == 0 ? 6 * 2 : 2); /* 2 blocks per get */
    if (pass == 1)
      ASSERT_EQ(st.tier[KVDB_TIER_DRAM].hits, 6 * 2);
    kvdb_close(db);
  }
  /* flip a byte in the last layer of block 1: the hit ends after block 0 */
  char path[4200];
  snprintf(path, sizeof path, "%s/ssd/seg-0000000000000001.kvs", dir);
  int fd = open(path, O_RDWR);
  ASSERT(fd >= 0);
  struct stat st;
  fstat(fd, &st);
  off_t off = st.st_size - 5000;
  uint8_t byte;
  ASSERT(pread(fd, &byte, 1, off) == 1);
  byte ^= 0x10;
  ASSERT(pwrite(fd, &byte, 1, off) == 1);
  close(fd);
  o.dram_bytes = 0;
  ASSERT_OK(kvdb_open(dir, &o, &db));
  uint16_t *out = (uint16_t *)raw;
  ASSERT_OK(kvdb_kv_view_packed(&v, out, m, N, KVDB_LAYOUT_LKTHD));
  size_t hit = 0;
  ASSERT_OK(kvdb_get(db, m, tok, N, &v, &hit));
  ASSERT_EQ(hit, 256);
  ASSERT_EQ(t_check_kv(m, tok, 256, N, out), 256);
  kvdb_stats st2;
  ASSERT_OK(kvdb_stat(db, &st2));
  ASSERT_EQ(st2.corrupt_blocks, 1);
  kvdb_close(db);
  free(raw);
  free(src);
  t_rmdir(dir);
}

static void test_bad_input(void)
{
  char *dir = t_tmpdir("bad");
  kvdb *db = t_open(dir);
  uint32_t tok[32];
  make_tokens(tok, 32, 11);
  uint16_t *buf = malloc(32 * kvdb_model_token_bytes(&M_SMALL));
  kvdb_kv_view v;
  ASSERT_OK(kvdb_kv_view_packed(&v, buf, &M_SMALL, 32, KVDB_LAYOUT_LKTHD));
  t_fill_kv(&M_SMALL, tok, 32, buf);
  ASSERT_OK(kvdb_put(db, &M_SMALL, tok, 32, &v, NULL));
  /* shape mismatch under the same id */
  kvdb_model m2 = M_SMALL;
  m2.n_layers = 3;
  ASSERT_STATUS(KVDB_MISMATCH, kvdb_put(db, &m2, tok, 32, &v, NULL));
  ASSERT_MSG_HAS("test-small");
  /* bad models */
  kvdb_model bad = M_SMALL;
  bad.block_tokens = 48;
  ASSERT_STATUS(KVDB_INVALID, kvdb_put(db, &bad, tok, 32, &v, NULL));
  ASSERT_MSG_HAS("block_tokens");
  bad = M_SMALL;
  bad.dtype = (kvdb_dtype)9;
  ASSERT_STATUS(KVDB_INVALID, kvdb_put(db, &bad, tok, 32, &v, NULL));
  ASSERT_MSG_HAS("dtype");
  bad = M_SMALL;
  bad.id = "";
  ASSERT_STATUS(KVDB_INVALID, kvdb_put(db, &bad, tok, 32, &v, NULL));
  ASSERT_STATUS(KVDB_INVALID, kvdb_put(db, NULL, tok, 32, &v, NULL));
  /* NULL and zero-length arguments */
  ASSERT_STATUS(KVDB_INVALID, kvdb_put(db, &M_SMALL, NULL, 32, &v, NULL));
  ASSERT_STATUS(KVDB_INVALID, kvdb_put(db, &M_SMALL, tok, 0, &v, NULL));
  ASSERT_STATUS(KVDB_INVALID, kvdb_put(db, &M_SMALL, tok, 32, NULL, NULL));
  ASSERT_STATUS(KVDB_INVALID, kvdb_put(NULL, &M_SMALL, tok, 32, &v, NULL));
  size_t hit;
  ASSERT_STATUS(KVDB_INVALID, kvdb_lookup(db, &M_SMALL, tok, 0, &hit));
  ASSERT_STATUS(KVDB_INVALID, kvdb_lookup(db, &M_SMALL, tok, 32, NULL));
  ASSERT_STATUS(KVDB_INVALID, kvdb_get(db, &M_SMALL, tok, 32, NULL, &hit));
  kvdb_kv_view empty = {0};
  ASSERT_STATUS(KVDB_INVALID, kvdb_get(db, &M_SMALL, tok, 32, &empty, &hit));
  ASSERT_STATUS(KVDB_INVALID, kvdb_kv_view_packed(&v, buf, &M_SMALL, 32, (kvdb_layout)7));
  kvdb_options o;
  kvdb_options_init(&o);
  o.sync_mode = (kvdb_sync_mode)5;
  kvdb *x;
  ASSERT_STATUS(KVDB_INVALID, kvdb_open(dir, &o, &x));
  ASSERT(x == NULL);
  ASSERT_STATUS(KVDB_INVALID, kvdb_open(NULL, NULL, &x));
  kvdb_key k;
  ASSERT_STATUS(KVDB_INVALID, kvdb_key_parse("xyz", &k));
  char hx[33];
  ASSERT_OK(kvdb_key_parse(kvdb_key_hex(&(kvdb_key){{1, 2, 0xff}}, hx), &k));
  ASSERT_EQ(k.b[2], 0xff);
  ASSERT(strcmp(kvdb_status_name(KVDB_CORRUPT), "KVDB_CORRUPT") == 0);
  kvdb_close(db);
  /* use after close is refused, not a crash: the handle is freed, so test a fresh NULL */
  ASSERT_STATUS(KVDB_INVALID, kvdb_lookup(NULL, &M_SMALL, tok, 32, &hit));
  free(buf);
  t_rmdir(dir);
}

/* Flip one byte in a segment file; that block is corrupt, every other block still reads. */
static void test_corruption(void)
{
  char *dir = t_tmpdir("corrupt");
  kvdb *db = t_open(dir);
  const kvdb_model *m = &M_PAGED;
  uint32_t a[128], b[128];
  make_tokens(a, 128, 21);
  make_tokens(b, 128, 22);
  t_put_kv(db, m, a, 128, NULL);
  t_put_kv(db, m, b, 128, NULL);
  kvdb_close(db);
  /* the first segment holds a's two blocks then b's; flip a byte inside a's second block */
  char path[4200];
  snprintf(path, sizeof path, "%s/ssd/seg-0000000000000001.kvs", dir);
  int fd = open(path, O_RDWR);
  ASSERT(fd >= 0);
  struct stat st;
  fstat(fd, &st);
  off_t off = st.st_size / 4 + 4096 * 3 + 100; /* data area of block 1 of a */
  uint8_t byte;
  ASSERT(pread(fd, &byte, 1, off) == 1);
  byte ^= 0x40;
  ASSERT(pwrite(fd, &byte, 1, off) == 1);
  close(fd);
  db = t_open(dir);
  size_t hit;
  ASSERT_OK(kvdb_lookup(db, m, a, 128, &hit)); /* lookup reads no data */
  ASSERT_EQ(hit, 128);
  ASSERT_EQ(t_get_check(db, m, a, 128), 64); /* the hit ends before the bad block */
  kvdb_stats s;
  ASSERT_OK(kvdb_stat(db, &s));
  ASSERT_EQ(s.corrupt_blocks, 1);
  ASSERT_EQ(t_get_check(db, m, b, 128), 128);
  kvdb_verify_report rep;
  ASSERT_STATUS(KVDB_CORRUPT, kvdb_verify(db, NULL, NULL, NULL, &rep));
  ASSERT_EQ(rep.problems, 1);
  /* get_tokens names the segment and offset */
  kvdb_key hashes[2];
  ASSERT_OK(kvdb_chain_hashes(m, a, 128, hashes, 2));
  uint32_t pos[64];
  for (int i = 0; i < 64; i++)
    pos[i] = 64 + i;
  uint16_t *out = calloc(64, kvdb_model_token_bytes(m));
  kvdb_kv_view v;
  ASSERT_OK(kvdb_kv_view_packed(&v, out, m, 64, KVDB_LAYOUT_LKTHD));
  kvdb_close(db);
  db = t_open(dir);
  kvdb_status rc = KVDB_OK;
  for (uint32_t layer = 0; layer < m->n_layers && rc == KVDB_OK; layer++)
    rc = kvdb_get_tokens(db, m, &hashes[1], layer, pos, 64, &v);
  ASSERT_EQ(rc, KVDB_CORRUPT);
  ASSERT_MSG_HAS("segment 1 at offset");
  free(out);
  kvdb_close(db);
  t_rmdir(dir);
}

/*
 * A byte flipped in the LAST page of a middle block: the get verifies and copies a block
 * section by section, so earlier sections of the bad block reach the buffer before the bad one
 * is found. The hit must still end before that block, with everything inside it exact.
 */
static void test_corruption_late_in_block(void)
{
  char *dir = t_tmpdir("corrupt2");
  kvdb *db = t_open(dir);
  const kvdb_model *m = &M_PAGED;
  uint32_t a[192];
  make_tokens(a, 192, 31);
  t_put_kv(db, m, a, 192, NULL); /* three blocks of 64 tokens, equal in size */
  kvdb_close(db);
  char path[4200];
  snprintf(path, sizeof path, "%s/ssd/seg-0000000000000001.kvs", dir);
  int fd = open(path, O_RDWR);
  ASSERT(fd >= 0);
  struct stat st;
  fstat(fd, &st);
  off_t off = st.st_size / 3 * 2 - 100; /* the last page of block 1 */
  uint8_t byte;
  ASSERT(pread(fd, &byte, 1, off) == 1);
  byte ^= 0x01;
  ASSERT(pwrite(fd, &byte, 1, off) == 1);
  close(fd);
  db = t_open(dir);
  ASSERT_EQ(t_get_check(db, m, a, 192), 64);
  kvdb_stats s;
  ASSERT_OK(kvdb_stat(db, &s));
  ASSERT_EQ(s.corrupt_blocks, 1);
  ASSERT_EQ(t_get_check(db, m, a, 64), 64); /* block 0 alone is fine */
  kvdb_close(db);
  t_rmdir(dir);
}

/*
 * The read schedule skips blocks the DRAM tier holds; a block skipped that way can be evicted
 * before its turn (here: by the block read just before it, in a one-block tier). The get must
 * notice, read it from disk after all, and deliver every token.
 */
static void test_dram_block_evicted_during_get(void)
{
  char *dir = t_tmpdir("dramevict");
  const kvdb_model *m = &M_PAGED;
  uint32_t a[192];
  make_tokens(a, 192, 41);
  kvdb *db = t_open(dir);
  t_put_kv(db, m, a, 192, NULL);
  kvdb_close(db);
  kvdb_options o = quiet_opts();
  o.dram_bytes = 64 * kvdb_model_token_bytes(m); /* exactly one block's data */
  ASSERT_OK(kvdb_open(dir, &o, &db));
  ASSERT_EQ(t_get_check(db, m, a, 128), 128); /* the tier now holds block 1 only */
  kvdb_stats s0, s1;
  ASSERT_OK(kvdb_stat(db, &s0));
  ASSERT_EQ(s0.tier[KVDB_TIER_DRAM].blocks, 1);
  ASSERT_EQ(t_get_check(db, m, a, 192), 192);
  ASSERT_OK(kvdb_stat(db, &s1));
  ASSERT_EQ(s1.tier[KVDB_TIER_SSD].hits - s0.tier[KVDB_TIER_SSD].hits, 3); /* all from disk */
  ASSERT_EQ(s1.corrupt_blocks, 0);
  kvdb_close(db);
  t_rmdir(dir);
}

/* ---- one handle, many threads ---- */

enum { TH_N = 4, TH_CTX = 6, TH_TOK = 160 };

typedef struct th_arg {
  kvdb *db;
  int id;
  int failures;
} th_arg;

static void th_tokens(int who, int c, uint32_t *t)
{
  make_tokens(t, TH_TOK, 1000); /* every context shares its first 64 tokens (one block) */
  uint64_t seed = 2000 + (uint64_t)who * 100 + (uint64_t)c;
  for (size_t i = 64; i < TH_TOK; i++)
    t[i] = (uint32_t)(t_rand(&seed) % 32000);
}

static void *th_main(void *p)
{
  th_arg *a = p;
  const kvdb_model *m = &M_PAGED;
  size_t tb = kvdb_model_token_bytes(m);
  uint16_t *buf = malloc(TH_TOK * tb), *out = malloc(TH_TOK * tb);
  uint32_t t[TH_TOK];
  for (int round = 0; round < 3; round++) {
    for (int c = 0; c < TH_CTX; c++) { /* put mine (again: a dedup no-op after round 0) */
      th_tokens(a->id, c, t);
      t_fill_kv(m, t, TH_TOK, buf);
      kvdb_kv_view v;
      kvdb_kv_view_packed(&v, buf, m, TH_TOK, KVDB_LAYOUT_LKTHD);
      if (kvdb_put(a->db, m, t, TH_TOK, &v, NULL) != KVDB_OK)
        a->failures++;
    }
    for (int who = 0; who < TH_N; who++) /* read everyone's that exists by now */
      for (int c = 0; c < TH_CTX; c++) {
        th_tokens(who, c, t);
        size_t hit = 0, lhit = 0;
        if (kvdb_lookup(a->db, m, t, TH_TOK, &lhit) != KVDB_OK)
          a->failures++;
        kvdb_kv_view v;
        kvdb_kv_view_packed(&v, out, m, TH_TOK, KVDB_LAYOUT_LKTHD);
        if (kvdb_get(a->db, m, t, TH_TOK, &v, &hit) != KVDB_OK)
          a->failures++;
        if (t_check_kv(m, t, hit, TH_TOK, out) != hit) /* whatever was hit is exact */
          a->failures++;
        if (who == a->id && hit != TH_TOK) /* my own are all there */
          a->failures++;
      }
  }
  free(buf);
  free(out);
  return NULL;
}

/* kvdb.h: "one handle is safe to use from many threads". Four threads share one handle with a
 * DRAM tier too small for the working set (so blocks are inserted, evicted and read from disk
 * concurrently) and puts that share a block. */
static void test_threads_share_handle(void)
{
  char *dir = t_tmpdir("threads");
  kvdb_options o = quiet_opts();
  o.dram_bytes = 5 * 64 * kvdb_model_token_bytes(&M_PAGED); /* 5 of ~50 blocks */
  kvdb *db;
  ASSERT_OK(kvdb_open(dir, &o, &db));
  pthread_t th[TH_N];
  th_arg args[TH_N];
  for (int i = 0; i < TH_N; i++) {
    args[i] = (th_arg){db, i, 0};
    ASSERT(pthread_create(&th[i], NULL, th_main, &args[i]) == 0);
  }
  for (int i = 0; i < TH_N; i++) {
    pthread_join(th[i], NULL);
    ASSERT_EQ(args[i].failures, 0);
  }
  kvdb_stats st;
  ASSERT_OK(kvdb_stat(db, &st));
  ASSERT_EQ(st.n_contexts, TH_N * TH_CTX);
  ASSERT_EQ(st.n_blocks, 1 + TH_N * TH_CTX * 2); /* the shared first block is stored once */
  ASSERT_EQ(st.corrupt_blocks, 0);
  ASSERT_OK(kvdb_verify(db, NULL, NULL, NULL, NULL));
  kvdb_close(db);
  t_rmdir(dir);
}

static void test_missing_and_truncated_segment(void)
{
  char *dir = t_tmpdir("trunc");
  kvdb_options o = quiet_opts();
  o.segment_bytes = 1 << 20;
  kvdb *db;
  ASSERT_OK(kvdb_open(dir, &o, &db));
  const kvdb_model *m = &M_PAGED;
  uint32_t a[64 * 20];
  make_tokens(a, 64 * 20, 31);
  t_put_kv(db, m, a, 64 * 10, NULL); /* 1.3 MiB: seals segment 1 */
  t_put_kv(db, m, a, 64 * 20, NULL); /* the other 10 blocks go to segment 2 */
  kvdb_stats s;
  ASSERT_OK(kvdb_stat(db, &s));
  ASSERT(s.n_segments >= 2);
  kvdb_close(db);
  char path[4200];
  snprintf(path, sizeof path, "%s/ssd/seg-0000000000000002.kvs", dir);
  ASSERT(truncate(path, 4096) == 0);
  ASSERT_OK(kvdb_open(dir, &o, &db));
  size_t hit = t_get_check(db, m, a, 64 * 20);
  ASSERT(hit > 0 && hit < 64 * 20);
  ASSERT_STATUS(KVDB_CORRUPT, kvdb_verify(db, NULL, NULL, NULL, NULL));
  kvdb_close(db);
  ASSERT(unlink(path) == 0);
  ASSERT_OK(kvdb_open(dir, &o, &db));
  ASSERT_EQ(t_get_check(db, m, a, 64 * 20), hit);
  ASSERT_STATUS(KVDB_CORRUPT, kvdb_verify(db, NULL, NULL, NULL, NULL));
  kvdb_close(db);
  t_rmdir(dir);
}

static int t_set_format_version(const char *dir, unsigned v);

static void test_newer_version_and_readonly(void)
{
  char *dir = t_tmpdir("ver");
  kvdb *db = t_open(dir);
  uint32_t a[20];
  make_tokens(a, 20, 41);
  t_put_kv(db, &M_SMALL, a, 20, NULL);
  kvdb_close(db);
  /* read-only directory: a writable open is refused, a read-only open reads */
  ASSERT(chmod(dir, 0555) == 0);
  if (access(dir, W_OK) != 0) { /* not root: permissions apply */
    kvdb_options o = quiet_opts();
    ASSERT_STATUS(KVDB_READONLY, kvdb_open(dir, &o, &db));
    ASSERT_MSG_HAS("not writable");
    o.flags = KVDB_O_RDONLY;
    ASSERT_OK(kvdb_open(dir, &o, &db));
    ASSERT_EQ(t_get_check(db, &M_SMALL, a, 20), 20);
    ASSERT_STATUS(KVDB_READONLY, kvdb_put(db, &M_SMALL, a, 20, &(kvdb_kv_view){{a, 0, 0, 0, 0, 0}, {a, 0, 0, 0, 0, 0}}, NULL));
    kvdb_close(db);
  }
  ASSERT(chmod(dir, 0755) == 0);
  {
    kvdb_options o = quiet_opts();
    o.flags = KVDB_O_RDONLY;
    ASSERT_OK(kvdb_open(dir, &o, &db));
    ASSERT_EQ(t_get_check(db, &M_SMALL, a, 20), 20);
    ASSERT_STATUS(KVDB_READONLY, kvdb_delete(db, &(kvdb_key){{0}}));
    kvdb_close(db);
  }
  /* a database written by a newer format: refused, and nothing is written */
  {
    kvdb_options o = quiet_opts();
    ASSERT_OK(kvdb_open(dir, &o, &db));
    kvdb_close(db);
  }
  /* rewrite the format number with the internal catalog API */
  ASSERT(t_set_format_version(dir, KVDB_FORMAT_VERSION + 1) == 0);
  char path[4200];
  snprintf(path, sizeof path, "%s/catalog.mdb", dir);
  struct stat st0, st1;
  ASSERT(stat(path, &st0) == 0);
  kvdb_options o = quiet_opts();
  ASSERT_STATUS(KVDB_VERSION, kvdb_open(dir, &o, &db));
  ASSERT_MSG_HAS("format version");
  ASSERT(stat(path, &st1) == 0);
  ASSERT(st0.st_mtime == st1.st_mtime && st0.st_size == st1.st_size);
  t_rmdir(dir);
}

/* Internal helper (catalog API) for the version test. */
#include "catalog/catalog.h"
static int t_set_format_version(const char *dir, unsigned v)
{
  kv_catalog c;
  if (kv_catalog_open(&c, dir, 1ull << 30, 0, 0, 0) != KVDB_OK)
    return -1;
  kv_txn *txn;
  if (kv_txn_begin(&c, 1, &txn) != KVDB_OK)
    return -1;
  kv_cat_put_u64(&c, txn, "format", v);
  int rc = kv_txn_commit(txn) == KVDB_OK ? 0 : -1;
  kv_catalog_close(&c);
  return rc;
}

/* the stored tail block's tokens 4..7 become the query's (catalog record offset 72 + 4 i) */
static uint32_t g_query_tail[8];
static void edit_tail_tokens(uint8_t *rec, size_t *len)
{
  ASSERT(*len >= 72 + 4 * 8);
  for (int i = 4; i < 8; i++)
    memcpy(rec + 72 + 4 * i, &g_query_tail[i], 4);
}
static void edit_huge_bytes(uint8_t *rec, size_t *len)
{
  ASSERT(*len >= 40);
  uint64_t huge = 1ull << 50; /* a multiple of 4096: only the geometry shows it is wrong */
  memcpy(rec + 32, &huge, 8);
}

/* A catalog record has no checksum of its own (LMDB's pages have none): what it says about a
 * block is checked against the block before KV is delivered or a buffer is sized from it. */
static void test_damaged_block_record(void)
{
  char *dir = t_tmpdir("rec");
  const kvdb_model *m = &M_SMALL; /* 16-token blocks */
  uint32_t stored[24], query[24];
  make_tokens(stored, 24, 4242);
  memcpy(query, stored, sizeof stored);
  for (int i = 20; i < 24; i++)
    query[i] = stored[i] + 1; /* the query shares 4 of the stored tail's 8 tokens */
  memcpy(g_query_tail, query + 16, sizeof g_query_tail);
  kvdb *db = t_open(dir);
  t_put_kv(db, m, stored, 24, NULL);
  kvdb_close(db);
  kvdb_key h[2];
  ASSERT_OK(kvdb_chain_hashes(m, stored, 24, h, 2));

  /* intact: the tail matches on 4 tokens */
  db = t_open(dir);
  ASSERT_EQ(t_get_check(db, m, query, 24), 20);
  kvdb_close(db);

  /* the record's copy of the tail tokens says the query's tokens 20..23 are stored: the
   * block's own tokens (checksummed) say they are not, so no KV of other tokens is delivered */
  t_cat_edit(dir, T_CAT_BLOCKS, h[1].b, 16, edit_tail_tokens);
  db = t_open(dir);
  size_t hit;
  ASSERT_OK(kvdb_lookup(db, m, query, 24, &hit));
  ASSERT_EQ(hit, 24); /* lookup trusts the catalog; get verifies */
  ASSERT_EQ(t_get_check(db, m, query, 24), 16);
  kvdb_stats st;
  ASSERT_OK(kvdb_stat(db, &st));
  ASSERT(st.corrupt_blocks >= 1);
  kvdb_close(db);

  /* a record asking for 2^50 bytes: no allocation is sized from it, the hit ends before it */
  t_cat_edit(dir, T_CAT_BLOCKS, h[0].b, 16, edit_huge_bytes);
  db = t_open(dir);
  ASSERT_EQ(t_get_check(db, m, stored, 24), 0);
  ASSERT_OK(kvdb_stat(db, &st));
  ASSERT(st.corrupt_blocks >= 1);
  kvdb_close(db);
  t_rmdir(dir);
}

static void test_ssd_capacity_evicts_lru(void)
{
  char *dir = t_tmpdir("cap");
  kvdb_options o = quiet_opts();
  const kvdb_model *m = &M_PAGED;
  o.ssd_bytes = 6 * (64 * kvdb_model_token_bytes(m) + 8192); /* about 6 blocks */
  kvdb *db;
  ASSERT_OK(kvdb_open(dir, &o, &db));
  uint32_t t[10][64];
  for (int i = 0; i < 10; i++) {
    make_tokens(t[i], 64, 500 + i);
    t_put_kv(db, m, t[i], 64, NULL);
    kvdb_stats s;
    ASSERT_OK(kvdb_stat(db, &s));
    ASSERT(s.live_bytes <= o.ssd_bytes);
  }
  size_t hit;
  ASSERT_OK(kvdb_lookup(db, m, t[0], 64, &hit));
  ASSERT_EQ(hit, 0); /* the oldest went first */
  ASSERT_OK(kvdb_lookup(db, m, t[9], 64, &hit));
  ASSERT_EQ(hit, 64);
  /* a context larger than the whole tier is refused with KVDB_FULL */
  uint32_t big[64 * 8];
  make_tokens(big, 64 * 8, 77);
  uint16_t *buf = malloc(sizeof big / 4 * kvdb_model_token_bytes(m));
  kvdb_kv_view v;
  ASSERT_OK(kvdb_kv_view_packed(&v, buf, m, 64 * 8, KVDB_LAYOUT_LKTHD));
  ASSERT_STATUS(KVDB_FULL, kvdb_put(db, m, big, 64 * 8, &v, NULL));
  ASSERT_OK(kvdb_lookup(db, m, t[9], 64, &hit)); /* the failed put evicted nothing */
  ASSERT_EQ(hit, 64);
  free(buf);
  ASSERT_OK(kvdb_verify(db, NULL, NULL, NULL, NULL));
  kvdb_close(db);
  t_rmdir(dir);
}

int main(void)
{
  test_roundtrip_and_reopen();
  test_prefix_sharing();
  test_get_tokens();
  test_explicit_keys_and_layouts();
  test_large_blocks_layouts_alignments();
  test_bad_input();
  test_corruption();
  test_corruption_late_in_block();
  test_dram_block_evicted_during_get();
  test_threads_share_handle();
  test_missing_and_truncated_segment();
  test_newer_version_and_readonly();
  test_ssd_capacity_evicts_lru();
  test_damaged_block_record();
  printf("test_api: all passed\n");
  return 0;
}
