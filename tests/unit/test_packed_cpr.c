/* SPDX-License-Identifier: MIT */
/*
 * tests/unit/test_packed_cpr.c — packed compressed block objects (block format 5, catalog
 * format 9, format/FORMAT.md §3f) through the public API: every compressed config (lossless
 * frames, int8, int4, int2, kivi4, a residual, token dropping, dropping + int4) at stories260K's
 * 16-token blocks in f32 (head_dim 8) and f16 (head_dim 16) is stored packed (64-byte offsets,
 * fewer bytes than whole pages) and reads back exactly what the same put gives in whole pages
 * (packed_block_bytes = 1, the layout of formats 2 and 3) through kvdb_get, get_kept,
 * get_context, get_tokens and get_head_tokens — in this process, in a second one, after a
 * prefetch into the DRAM tier, after compaction, a move to the SmartSSD tier and back, and a
 * re-encoding (kvdb_recompress) that packs; a byte flipped in a packed compressed object's data
 * or section table is KVDB_CORRUPT for the reads and a problem for kvdb_verify, never wrong KV
 * (test `packed-cpr`).
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "kvdb_test.h"
#include "model/model.h"
#include "ops/ops_int.h"
#include "seg/seg.h"

static const kvdb_model M16 = {"pcpr-f16", 5, 4, 16, KVDB_F16, 16, 0};
static const kvdb_model M32 = {"pcpr-f32", 5, 4, 8, KVDB_F32, 16, 0}; /* stories260K's shape */
static const char *const CFG[] = {"lossless", "int8",    "int4",          "int2",
                                  "kivi4",    "int4:r16", "knorm50",      "keydiff50+int4"};
enum { NCFG = sizeof CFG / sizeof CFG[0], N = 200 }; /* 12 full blocks and one of 8 tokens */

static kvdb *open_db(const char *dir, uint32_t packed, uint64_t dram, uint64_t smart)
{
  kvdb_options o;
  kvdb_options_init(&o);
  o.dram_bytes = dram;
  o.log_level = -1;
  o.packed_block_bytes = packed;
  o.smartssd_bytes = smart;
  kvdb *db;
  ASSERT_OK(kvdb_open(dir, &o, &db));
  return db;
}

static void tokens(uint32_t seed, uint32_t *tok, size_t n)
{
  for (size_t i = 0; i < n; i++)
    tok[i] = seed * 100000u + (uint32_t)i;
}

/* The KV of tokens tok[0..n) in a packed LKTHD buffer: smooth values with an outlier channel
 * (finite in both dtypes; f16 from t_fill_kv). */
static void *make_kv(const kvdb_model *m, const uint32_t *tok, size_t n)
{
  void *buf = malloc(n * kvdb_model_token_bytes(m));
  ASSERT(buf != NULL);
  if (m->dtype == KVDB_F16) {
    t_fill_kv(m, tok, n, buf);
    return buf;
  }
  float *f = buf;
  size_t i = 0;
  for (uint32_t l = 0; l < m->n_layers; l++)
    for (uint32_t kv = 0; kv < 2; kv++)
      for (size_t t = 0; t < n; t++)
        for (uint32_t h = 0; h < m->n_kv_heads; h++)
          for (uint32_t d = 0; d < m->head_dim; d++)
            f[i++] = sinf(0.37f * (float)(tok[t] % 9973) + 1.3f * (float)d + (float)(l * 7 + h)) *
                         (d == 3 ? 6.0f : 1.0f) +
                     0.01f * (float)kv;
  return buf;
}

static kvdb_key put_cfg(kvdb *db, const kvdb_model *m, const uint32_t *tok, size_t n,
                        const char *cfg)
{
  void *kv = make_kv(m, tok, n);
  kvdb_kv_view v;
  ASSERT_OK(kvdb_kv_view_packed(&v, kv, m, n, KVDB_LAYOUT_LKTHD));
  kvdb_put_opts po;
  kvdb_put_opts_init(&po);
  ASSERT_OK(kvdb_config_parse(cfg, &po.config));
  kvdb_put_info info;
  ASSERT_OK(kvdb_put_ex(db, m, tok, n, &v, &po, &info));
  free(kv);
  return info.context;
}

static kv_block_rec block_rec(kvdb *db, const kvdb_key *k)
{
  kv_txn *txn;
  kv_block_rec br;
  ASSERT_OK(kv_txn_begin(&db->cat, 0, &txn));
  ASSERT_OK(kv_cat_get_block(&db->cat, txn, k->b, &br));
  br.tokens = NULL;
  kv_txn_abort(txn);
  return br;
}

static void chain(const kvdb_model *m, const uint32_t *tok, size_t n, kvdb_key *keys)
{
  ASSERT_OK(kvdb_chain_hashes(m, tok, n, keys, 64));
}

/* Everything the readers give for context tok[0..n) (key k): one byte string, with every
 * status folded in, so that two stores can be compared with memcmp. */
typedef struct reads {
  uint8_t *p;
  size_t len, cap;
} reads;

static void add(reads *r, const void *p, size_t len)
{
  if (r->len + len > r->cap) {
    r->cap = (r->len + len) * 2;
    r->p = realloc(r->p, r->cap);
    ASSERT(r->p != NULL);
  }
  memcpy(r->p + r->len, p, len);
  r->len += len;
}

static reads read_all(kvdb *db, const kvdb_model *m, const uint32_t *tok, size_t n,
                      const kvdb_key *k, int drops)
{
  reads r = {NULL, 0, 0};
  size_t tb = kvdb_model_token_bytes(m), lh = (size_t)m->n_layers * m->n_kv_heads;
  uint8_t *buf = calloc(n, tb);
  ASSERT(buf != NULL);
  kvdb_kv_view v;
  ASSERT_OK(kvdb_kv_view_packed(&v, buf, m, n, KVDB_LAYOUT_LKTHD));
  /* kvdb_get: the whole context, or (dropping) no hit */
  size_t hit = 99;
  ASSERT_OK(kvdb_get(db, m, tok, n, &v, &hit));
  ASSERT_EQ(hit, drops ? 0 : n);
  add(&r, &hit, sizeof hit);
  add(&r, buf, n * tb);
  /* kvdb_get_kept: the kept rows at their positions and the mask */
  uint8_t *present = calloc(lh, n);
  ASSERT(present != NULL);
  memset(buf, 0, n * tb);
  size_t kept = 0;
  ASSERT_OK(kvdb_get_kept(db, m, tok, n, &v, present, lh * n, &hit, &kept));
  ASSERT_EQ(hit, n);
  ASSERT(drops ? kept < n : kept == n);
  add(&r, &kept, sizeof kept);
  add(&r, present, lh * n);
  add(&r, buf, n * tb);
  /* kvdb_get_context */
  uint32_t *pos = calloc(lh * n, sizeof *pos), *nrows = calloc(lh, sizeof *nrows);
  ASSERT(pos != NULL && nrows != NULL);
  memset(buf, 0, n * tb);
  ASSERT_OK(kvdb_get_context(db, m, k, &v, pos, nrows));
  add(&r, buf, n * tb);
  add(&r, pos, lh * n * sizeof *pos);
  add(&r, nrows, lh * sizeof *nrows);
  /* kvdb_get_tokens and kvdb_get_head_tokens of five positions per layer (a dropped one is
   * KVDB_NOTFOUND: its status is compared) */
  uint32_t p5[5] = {0, 17, (uint32_t)n / 2, (uint32_t)n - 2, 3};
  uint8_t kr[5 * 64], vr[5 * 64];
  for (uint32_t l = 0; l < m->n_layers; l++) {
    kvdb_kv_view tv;
    memset(buf, 0, 5 * tb);
    ASSERT_OK(kvdb_kv_view_packed(&tv, buf, m, 5, KVDB_LAYOUT_LKTHD));
    kvdb_status st = kvdb_get_tokens(db, m, k, l, p5, 5, &tv);
    ASSERT(st == KVDB_OK || (drops && st == KVDB_NOTFOUND));
    add(&r, &st, sizeof st);
    if (st == KVDB_OK)
      add(&r, buf, 5 * tb);
    for (uint32_t h = 0; h < m->n_kv_heads; h++) {
      memset(kr, 0, sizeof kr);
      memset(vr, 0, sizeof vr);
      st = kvdb_get_head_tokens(db, m, k, l, h, p5, 5, kr, vr, NULL, NULL);
      ASSERT(st == KVDB_OK || (drops && st == KVDB_NOTFOUND));
      add(&r, &st, sizeof st);
      if (st == KVDB_OK) {
        add(&r, kr, 5 * (size_t)m->head_dim * (tb / lh / 2 / m->head_dim));
        add(&r, vr, 5 * (size_t)m->head_dim * (tb / lh / 2 / m->head_dim));
      }
    }
  }
  free(pos);
  free(nrows);
  free(present);
  free(buf);
  return r;
}

static void same(reads a, reads b, const char *what)
{
  if (a.len != b.len || memcmp(a.p, b.p, a.len) != 0) {
    fprintf(stderr, "%s: the packed store's reads differ from the whole-page store's\n", what);
    ASSERT(0);
  }
  free(a.p);
  free(b.p);
}

static int is_drop(const char *cfg)
{
  return strncmp(cfg, "knorm", 5) == 0 || strncmp(cfg, "keydiff", 7) == 0;
}

/* Context c of model m: its tokens. */
static void ctx_tokens(const kvdb_model *m, uint32_t c, uint32_t *tok)
{
  tokens((m->dtype == KVDB_F32 ? 100 : 200) + c, tok, N);
}

/* Every config into a packed store (A) and a whole-page one (B); the reads compared. */
static void put_all(kvdb *a, kvdb *b, const kvdb_model *m, double *ratio_a, double *ratio_b)
{
  uint32_t tok[N];
  for (uint32_t c = 0; c < NCFG; c++) {
    ctx_tokens(m, c, tok);
    kvdb_key ka = put_cfg(a, m, tok, N, CFG[c]), kb = put_cfg(b, m, tok, N, CFG[c]);
    ASSERT(memcmp(&ka, &kb, sizeof ka) == 0);
    kvdb_key keys[64];
    chain(m, tok, N, keys);
    int inside = 0;
    for (int i = 0; i < 13; i++) {
      kv_block_rec ra = block_rec(a, &keys[i]), rb = block_rec(b, &keys[i]);
      ASSERT((ra.bflags & (KV_BLK_PACKED | KV_BLK_COMPRESSED)) ==
             (KV_BLK_PACKED | KV_BLK_COMPRESSED));
      ASSERT(ra.offset % 64 == 0 && ra.bytes % 64 == 0);
      ASSERT(!(rb.bflags & KV_BLK_PACKED) && rb.offset % KV_PAGE == 0);
      ASSERT((ra.bflags & ~(uint32_t)KV_BLK_PACKED) == rb.bflags);
      ASSERT(ra.bytes < rb.bytes);
      inside += ra.offset % KV_PAGE != 0;
    }
    ASSERT(inside > 6); /* back to back, sharing pages */
    kvdb_context_info ia, ib;
    ASSERT_OK(kvdb_context_stat(a, &ka, &ia));
    ASSERT_OK(kvdb_context_stat(b, &kb, &ib));
    double logical = (double)N * kvdb_model_token_bytes(m);
    ratio_a[c] = (double)ia.bytes / logical;
    ratio_b[c] = (double)ib.bytes / logical;
    printf("packed-cpr: %s %-15s stored/logical packed %.3f, whole pages %.3f\n",
           m->dtype == KVDB_F32 ? "f32" : "f16", CFG[c], ratio_a[c], ratio_b[c]);
    int drops = is_drop(CFG[c]);
    reads ra = read_all(a, m, tok, N, &ka, drops), rb = read_all(b, m, tok, N, &kb, drops);
    if (c == 0) { /* lossless: the KV as put */
      void *kv = make_kv(m, tok, N);
      ASSERT(memcmp(ra.p + sizeof(size_t), kv, N * kvdb_model_token_bytes(m)) == 0);
      free(kv);
    }
    same(ra, rb, CFG[c]);
  }
  /* the stored bytes follow the config: int2 < int4 < int8 < lossless, and a dropping config
   * below what it keeps */
  ASSERT(ratio_a[3] < ratio_a[2] && ratio_a[2] < ratio_a[1] && ratio_a[1] < ratio_a[0]);
  ASSERT(ratio_a[6] < 0.7 && ratio_a[6] < ratio_b[6] && ratio_a[7] < ratio_a[2]);
}

/* Reads of every config's context in a against b's. */
static void compare_all(kvdb *a, kvdb *b, const kvdb_model *m, const char *when)
{
  uint32_t tok[N];
  for (uint32_t c = 0; c < NCFG; c++) {
    ctx_tokens(m, c, tok);
    kvdb_key keys[64];
    chain(m, tok, N, keys);
    int drops = is_drop(CFG[c]);
    char what[96];
    snprintf(what, sizeof what, "%s, %s", when, CFG[c]);
    same(read_all(a, m, tok, N, &keys[12], drops), read_all(b, m, tok, N, &keys[12], drops),
         what);
  }
}

static int g_problems;
static void on_problem(void *ctx, const kvdb_problem *p)
{
  (void)ctx;
  g_problems++;
  printf("  problem: %s\n", p->message);
}

/* A byte of block 5 of context `c` of model m flipped at `rel` from its object's start
 * (negative: from its end). */
static kv_block_rec flip(const char *dir, const kvdb_model *m, uint32_t c, int64_t rel)
{
  kvdb *db = open_db(dir, 0, 0, 0);
  uint32_t tok[N];
  ctx_tokens(m, c, tok);
  kvdb_key keys[64];
  chain(m, tok, N, keys);
  kv_block_rec br = block_rec(db, &keys[5]);
  ASSERT(br.bflags & KV_BLK_PACKED);
  char path[4200];
  ASSERT_OK(kv_seg_path(db, br.segment, path, sizeof path));
  kvdb_close(db);
  int fd = open(path, O_RDWR);
  ASSERT(fd >= 0);
  uint64_t at = rel < 0 ? br.offset + br.bytes - (uint64_t)-rel : br.offset + (uint64_t)rel;
  uint8_t b;
  ASSERT(pread(fd, &b, 1, (off_t)at) == 1);
  b ^= 0x20;
  ASSERT(pwrite(fd, &b, 1, (off_t)at) == 1);
  close(fd);
  return br;
}

/* After a flip in block 5 of context c: gets stop before it, reads of its positions are
 * KVDB_CORRUPT, its neighbour block is fine, verify names it. Then the byte is flipped back. */
static void check_damage(const char *dir, const kvdb_model *m, uint32_t c, int64_t rel)
{
  flip(dir, m, c, rel);
  kvdb *db = open_db(dir, 0, 0, 0);
  uint32_t tok[N];
  ctx_tokens(m, c, tok);
  kvdb_key keys[64];
  chain(m, tok, N, keys);
  size_t tb = kvdb_model_token_bytes(m);
  uint8_t *buf = calloc(N, tb);
  ASSERT(buf != NULL);
  kvdb_kv_view v;
  ASSERT_OK(kvdb_kv_view_packed(&v, buf, m, N, KVDB_LAYOUT_LKTHD));
  size_t hit = 99;
  ASSERT_OK(kvdb_get(db, m, tok, N, &v, &hit));
  ASSERT_EQ(hit, 5 * 16); /* blocks 0-4 only */
  ASSERT_STATUS(KVDB_CORRUPT, kvdb_get_context(db, m, &keys[12], &v, NULL, NULL));
  int corrupt = 0;
  for (uint32_t l = 0; l < m->n_layers; l++) {
    uint32_t pos[1] = {5 * 16 + 7}, ok_pos[1] = {4 * 16 + 15};
    kvdb_kv_view tv;
    ASSERT_OK(kvdb_kv_view_packed(&tv, buf, m, 1, KVDB_LAYOUT_LKTHD));
    kvdb_status st = kvdb_get_tokens(db, m, &keys[12], l, pos, 1, &tv);
    ASSERT(st == KVDB_OK || st == KVDB_CORRUPT); /* a layer whose pages hold no bad byte */
    corrupt += st == KVDB_CORRUPT;
    ASSERT_OK(kvdb_get_tokens(db, m, &keys[12], l, ok_pos, 1, &tv));
  }
  ASSERT(corrupt >= 1);
  g_problems = 0;
  kvdb_verify_report rep;
  ASSERT_STATUS(KVDB_CORRUPT, kvdb_verify(db, on_problem, NULL, NULL, &rep));
  ASSERT(rep.problems >= 1 && g_problems >= 1);
  free(buf);
  kvdb_close(db);
  flip(dir, m, c, rel); /* back as it was */
}

/* With KVDB_PCPR_CORPUS=DIR: fuzz_cblock seeds (a flags byte, then the object as on disk) of
 * packed compressed objects of store `dir` — int4 (f16), lossless frames (f32), a partial
 * keydiff50+int4 block (f16) — whole, with a flipped data byte (as is and repaired), and the
 * meta region alone (tests/fuzz/corpora/cblock/pcpr_*). */
static void write_corpus(const char *dir)
{
  const char *out = getenv("KVDB_PCPR_CORPUS");
  if (out == NULL || *out == 0)
    return;
  kvdb *db = open_db(dir, 0, 0, 0);
  struct {
    const kvdb_model *m;
    uint32_t c, block;
    const char *name;
  } seeds[] = {{&M16, 2, 3, "int4_f16"}, {&M32, 0, 1, "frames_f32"},
               {&M16, 7, 12, "keydiff50_int4_f16_tail"}};
  for (size_t i = 0; i < sizeof seeds / sizeof seeds[0]; i++) {
    uint32_t tok[N];
    ctx_tokens(seeds[i].m, seeds[i].c, tok);
    kvdb_key keys[64];
    chain(seeds[i].m, tok, N, keys);
    kv_block_rec br = block_rec(db, &keys[seeds[i].block]);
    ASSERT(br.bflags & KV_BLK_PACKED);
    char path[4200];
    ASSERT_OK(kv_seg_path(db, br.segment, path, sizeof path));
    int fd = open(path, O_RDONLY);
    ASSERT(fd >= 0);
    uint8_t *obj = malloc(br.bytes + 1);
    ASSERT(obj != NULL);
    ASSERT(pread(fd, obj + 1, br.bytes, (off_t)br.offset) == (ssize_t)br.bytes);
    close(fd);
    uint32_t meta = (uint32_t)obj[1 + 8] | (uint32_t)obj[1 + 9] << 8 | (uint32_t)obj[1 + 10] << 16 |
                    (uint32_t)obj[1 + 11] << 24;
    struct {
      const char *suffix;
      uint8_t flags;
      int flip;
      size_t len;
    } v[] = {{"", 0, 0, br.bytes}, {"_data_flip", 0, 1, br.bytes},
             {"_data_flip_repair", 7, 1, br.bytes}, {"_meta_only", 0, 0, meta}};
    for (size_t j = 0; j < sizeof v / sizeof v[0]; j++) {
      obj[0] = v[j].flags;
      size_t at = 1 + br.bytes - 90;
      obj[at] ^= v[j].flip ? 0x10 : 0;
      char fp[4400];
      snprintf(fp, sizeof fp, "%s/pcpr_%s%s.bin", out, seeds[i].name, v[j].suffix);
      FILE *f = fopen(fp, "wb");
      ASSERT(f != NULL && fwrite(obj, 1, 1 + v[j].len, f) == 1 + v[j].len && fclose(f) == 0);
      obj[at] ^= v[j].flip ? 0x10 : 0;
    }
    free(obj);
  }
  kvdb_close(db);
}

/* Remote-tier values (FORMAT.md §6) of every block of context c of model m in store a: made as
 * the write-through makes them (the packed object as it is), then taken as a remote get takes
 * them (checked, decoded, scattered): the rows equal b's kvdb_get of the context. */
static void remote_values(kvdb *a, kvdb *b, const kvdb_model *m, uint32_t c)
{
  uint32_t tok[N];
  ctx_tokens(m, c, tok);
  kvdb_key keys[64];
  chain(m, tok, N, keys);
  uint8_t mh[16];
  kv_model_hash(m, m->block_tokens, mh);
  size_t tb = kvdb_model_token_bytes(m);
  uint8_t *got = calloc(N, tb), *want = calloc(N, tb);
  ASSERT(got != NULL && want != NULL);
  kvdb_kv_view gv, wv;
  ASSERT_OK(kvdb_kv_view_packed(&gv, got, m, N, KVDB_LAYOUT_LKTHD));
  ASSERT_OK(kvdb_kv_view_packed(&wv, want, m, N, KVDB_LAYOUT_LKTHD));
  size_t hit = 0;
  ASSERT_OK(kvdb_get(b, m, tok, N, &wv, &hit));
  ASSERT_EQ(hit, N);
  const uint64_t ns = 0x7063707274657374ull;
  for (uint32_t i = 0; i < 13; i++) {
    uint8_t *v = NULL;
    size_t len = 0;
    ASSERT(block_rec(a, &keys[i]).bflags & KV_BLK_PACKED);
    ASSERT_OK(kv_rtier_value_make(a, ns, keys[i].b, &v, &len));
    uint32_t t0 = i * 16, nt = N - t0 < 16 ? N - t0 : 16;
    const uint8_t *parent = i == 0 ? mh : keys[i - 1].b;
    v[len - 10] ^= 1; /* a damaged object is refused (its rows may be written: taken again) */
    ASSERT_EQ(kv_rtier_value_take(a, m, m->block_tokens, ns, v, len, mh, parent, keys[i].b,
                                  tok + t0, nt, &gv, t0),
              -1);
    v[len - 10] ^= 1;
    ASSERT_EQ(kv_rtier_value_take(a, m, m->block_tokens, ns, v, len, mh, parent, keys[i].b,
                                  tok + t0, nt, &gv, t0),
              0);
    free(v);
  }
  ASSERT(memcmp(got, want, N * tb) == 0);
  free(got);
  free(want);
}

static void test_packed_compressed(void)
{
  char *da = t_tmpdir("pcpr-a"), *db_dir = t_tmpdir("pcpr-b");
  kvdb *a = open_db(da, 0, 0, 0), *b = open_db(db_dir, 1, 0, 0);
  double ra32[NCFG], rb32[NCFG], ra16[NCFG], rb16[NCFG];
  put_all(a, b, &M32, ra32, rb32);
  put_all(a, b, &M16, ra16, rb16);
  kvdb_stats st;
  ASSERT_OK(kvdb_stat(a, &st));
  ASSERT_EQ(st.format_version, 9);
  ASSERT_OK(kvdb_stat(b, &st));
  ASSERT(st.format_version < 9); /* whole pages: formats 5-8 */
  kvdb_verify_report rep;
  ASSERT_OK(kvdb_verify(a, NULL, NULL, NULL, &rep));
  ASSERT_EQ(rep.problems, 0);
  kvdb_close(a);
  kvdb_close(b);
  write_corpus(da);
  /* a second process reads them (handles are not shared across fork: LMDB) */
  pid_t pid = fork();
  ASSERT(pid >= 0);
  if (pid == 0) {
    kvdb *a2 = open_db(da, 0, 0, 0), *b2 = open_db(db_dir, 1, 0, 0);
    compare_all(a2, b2, &M32, "second process");
    compare_all(a2, b2, &M16, "second process");
    kvdb_close(a2);
    kvdb_close(b2);
    _exit(0);
  }
  int ws;
  ASSERT(waitpid(pid, &ws, 0) == pid && WIFEXITED(ws) && WEXITSTATUS(ws) == 0);
  b = open_db(db_dir, 1, 0, 0);
  /* prefetched into the DRAM tier, then read from it */
  a = open_db(da, 0, 64 << 20, 0);
  uint32_t tok[N];
  for (uint32_t c = 0; c < NCFG; c++) {
    ctx_tokens(&M16, c, tok);
    kvdb_prefetch_id id;
    ASSERT_OK(kvdb_prefetch(a, &M16, tok, N, NULL, &id));
    kvdb_prefetch_info in;
    do {
      usleep(1000);
      ASSERT_OK(kvdb_prefetch_poll(a, id, &in));
    } while (in.state < KVDB_PREFETCH_DONE);
    ASSERT_EQ(in.state, KVDB_PREFETCH_DONE);
  }
  compare_all(a, b, &M16, "after a prefetch");
  remote_values(a, b, &M16, 2); /* int4 */
  remote_values(a, b, &M32, 0); /* lossless frames */
  kvdb_close(a);
  /* damage: a data byte (the last page's padded tail, then a section's byte) and a section
   * table byte of packed compressed objects */
  check_damage(da, &M16, 2, -1);  /* int4: the data region's last byte */
  check_damage(da, &M32, 0, -70); /* lossless frames */
  check_damage(da, &M16, 5, 128 + 16 * 4 + 5); /* int4:r16: its section table */
  /* compaction (half of the contexts deleted), a move to the SmartSSD tier and back */
  kvdb_options o;
  kvdb_options_init(&o);
  o.dram_bytes = 0;
  o.log_level = -1;
  o.smartssd_bytes = 64 << 20;
  ASSERT_OK(kvdb_open(da, &o, &a));
  uint32_t tmp[N];
  for (uint32_t c = 0; c < 6; c++) { /* dead objects between the live ones */
    tokens(900 + c, tmp, N);
    kvdb_key k = put_cfg(a, &M16, tmp, N, CFG[c % NCFG]);
    ASSERT_OK(kvdb_delete(a, &k));
  }
  kvdb_compact_report cr;
  ASSERT_OK(kvdb_compact(a, 1.0, NULL, NULL, &cr));
  ASSERT(cr.blocks_moved > 0);
  compare_all(a, b, &M16, "after compaction");
  compare_all(a, b, &M32, "after compaction");
  ctx_tokens(&M16, 2, tok);
  kvdb_key keys[64];
  chain(&M16, tok, N, keys);
  ASSERT_OK(kvdb_relocate(a, &M16, &keys[12], NULL, KVDB_TIER_SMARTSSD, NULL));
  kv_block_rec br = block_rec(a, &keys[12]);
  ASSERT(br.tier == KVDB_TIER_SMARTSSD && (br.bflags & KV_BLK_PACKED));
  compare_all(a, b, &M16, "on the SmartSSD tier");
  ASSERT_OK(kvdb_relocate(a, &M16, &keys[12], NULL, KVDB_TIER_SSD, NULL));
  compare_all(a, b, &M16, "moved back");
  /* a packed compressed block's record at a wrong 64-byte offset: verify finds the block by
   * its scan for headers at every 64 bytes, repair rewrites the record (still packed and
   * compressed, its config kept) */
  {
    uint32_t t2[N];
    ctx_tokens(&M16, 1, t2); /* int8 */
    kvdb_key k2[64];
    chain(&M16, t2, N, k2);
    kv_txn *txn;
    kv_block_rec wr;
    ASSERT_OK(kv_txn_begin(&a->cat, 1, &txn));
    ASSERT_OK(kv_cat_get_block(&a->cat, txn, k2[3].b, &wr));
    uint64_t right = wr.offset;
    uint32_t flags = wr.bflags;
    wr.offset += 64;
    ASSERT_OK(kv_cat_put_block(&a->cat, txn, k2[3].b, &wr));
    ASSERT_OK(kv_txn_commit(txn));
    g_problems = 0;
    ASSERT_STATUS(KVDB_CORRUPT, kvdb_verify(a, on_problem, NULL, NULL, &rep));
    ASSERT(g_problems >= 1);
    kvdb_repair_report rr;
    ASSERT_OK(kvdb_repair(a, 0, NULL, NULL, NULL, &rr));
    ASSERT(rr.blocks_rebuilt >= 1);
    kv_block_rec fixed = block_rec(a, &k2[3]);
    ASSERT(fixed.offset == right && fixed.bflags == flags &&
           fixed.bflags == (KV_BLK_PACKED | KV_BLK_COMPRESSED));
    compare_all(a, b, &M16, "repaired");
  }
  /* a raw context re-encoded to int4 (kvdb_recompress): packed, as an int4 put */
  tokens(777, tmp, N);
  kvdb_key kr = put_cfg(a, &M32, tmp, N, "raw");
  ASSERT(block_rec(a, &kr).bflags == KV_BLK_PACKED);
  kvdb_config to;
  ASSERT_OK(kvdb_config_parse("int4", &to));
  ASSERT_OK(kvdb_recompress(a, &M32, &kr, &to, NULL));
  ASSERT(block_rec(a, &kr).bflags == (KV_BLK_PACKED | KV_BLK_COMPRESSED));
  kvdb_key kb = put_cfg(b, &M32, tmp, N, "int4");
  same(read_all(a, &M32, tmp, N, &kr, 0), read_all(b, &M32, tmp, N, &kb, 0), "recompressed");
  /* re-encoded onto the SmartSSD tier (a placement's recompress and move): packed there too */
  tokens(778, tmp, N);
  kr = put_cfg(a, &M32, tmp, N, "raw");
  ASSERT_OK(kvdb_relocate(a, &M32, &kr, &to, KVDB_TIER_SMARTSSD, NULL));
  br = block_rec(a, &kr);
  ASSERT(br.tier == KVDB_TIER_SMARTSSD && br.bflags == (KV_BLK_PACKED | KV_BLK_COMPRESSED));
  kb = put_cfg(b, &M32, tmp, N, "int4");
  same(read_all(a, &M32, tmp, N, &kr, 0), read_all(b, &M32, tmp, N, &kb, 0),
       "recompressed onto the SmartSSD tier");
  ASSERT_OK(kvdb_verify(a, NULL, NULL, NULL, &rep));
  ASSERT_EQ(rep.problems, 0);
  kvdb_close(a);
  kvdb_close(b);
  t_rmdir(da);
  t_rmdir(db_dir);
}

int main(void)
{
  test_packed_compressed();
  printf("test_packed_cpr: ok\n");
  return 0;
}
