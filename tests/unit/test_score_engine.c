/* SPDX-License-Identifier: MIT */
/*
 * tests/unit/test_score_engine.c — kvdb_score / kvdb_score_batch over stored contexts
 * (engine/ops/score_ctx.c, the score region of FORMAT.md §3c):
 *   - the result equals the brute-force top k over the context's keys at the copy's precision
 *     (the keys read back with kvdb_get_context, quantized whole by kv_score_copy_encode,
 *     scored by kv_score_tokens, fully sorted by ORDER: higher score first, equal scores by
 *     lower position — the keys repeat on purpose so ties occur), positions and score bits;
 *     int8 and int4; paged and packed sections; f32 and f16 queries; GQA sum and max;
 *   - the same from the SSD tier (host reads, in one wave and in many small ones), the DRAM tier
 *     (regions kept beside the blocks), the emulated near-data device (HIE), and mixes of them;
 *   - a context on the SmartSSD tier (kvdb_relocate), scored by the device by default;
 *   - after reopening, in a second process; after a compaction moved the blocks (the regions
 *     kept in DRAM are read again); from four threads on one handle at once;
 *   - a context re-encoded (kvdb_recompress) still scores, on copies rebuilt from the keys the
 *     re-encoding read (raw: the keys as put);
 *   - a damaged byte of a score copy: KVDB_CORRUPT from kvdb_score (host and DRAM paths) and
 *     kvdb_verify, while kvdb_get, which never reads the region, still hits the whole context;
 *   - kvdb_get reads exactly the objects without their regions;
 *   - bad input: a model without score copies (KVDB_UNSUPPORTED), k = 0, k > N, layer or head
 *     out of range, NULL, a bad dtype, a non-finite query, another model, a missing context,
 *     bad options, score_bits of another value under one id, a token-dropping config.
 */
#include "kvdb_test.h"

#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include "place/place.h"
#include "score.h"
#include "ops/ops_int.h"

static const kvdb_model M8 = {"score8-paged", 2, 2, 128, KVDB_F16, 64, 8};  /* paged sections */
static const kvdb_model M4 = {"score4-packed", 2, 2, 64, KVDB_F16, 16, 4}; /* packed sections */
static const kvdb_model M0 = {"score0-plain", 2, 2, 64, KVDB_F16, 16, 0};  /* no copies */

#define N_TOK 300u

/* smartssd_bytes of the databases t_open opens: with a SmartSSD tier the engine writes
 * version-1 score copies (the near-data device's), without one version 2 */
static uint64_t g_smart_bytes;
static uint32_t g_packed; /* kvdb_options.packed_block_bytes of t_open */

static kvdb *t_open(const char *dir, uint64_t dram, uint32_t flags)
{
  kvdb_options o;
  kvdb_options_init(&o);
  o.dram_bytes = dram;
  o.smartssd_bytes = g_smart_bytes;
  o.packed_block_bytes = g_packed;
  o.log_level = -1;
  o.flags |= flags;
  kvdb *db;
  ASSERT_OK(kvdb_open(dir, &o, &db));
  return db;
}

static double t_gauss(uint64_t *s)
{
  double u1 = ((double)(t_rand(s) >> 11) + 0.5) / 9007199254740992.0;
  double u2 = ((double)(t_rand(s) >> 11) + 0.5) / 9007199254740992.0;
  return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

/* A context's tokens and KV (packed LKTHD f16): gaussian keys with a per-token size, and every
 * 7th token's keys a copy of an earlier token's, so equal scores occur. */
typedef struct ctx {
  uint32_t tok[N_TOK];
  uint16_t *kv;
  kvdb_key key;
} ctx;

static void make_ctx(ctx *c, const kvdb_model *m, uint64_t seed)
{
  size_t tb = kvdb_model_token_bytes(m);
  c->kv = malloc(N_TOK * tb);
  ASSERT(c->kv != NULL);
  for (uint32_t i = 0; i < N_TOK; i++)
    c->tok[i] = (uint32_t)(t_rand(&seed) % 32000);
  const uint32_t H = m->n_kv_heads, D = m->head_dim;
  for (uint32_t l = 0; l < m->n_layers; l++)
    for (uint32_t kv = 0; kv < 2; kv++)
      for (uint32_t t = 0; t < N_TOK; t++) {
        double size = 0.25 + (double)(t_rand(&seed) % 1000) / 250.0;
        for (uint32_t h = 0; h < H; h++)
          for (uint32_t d = 0; d < D; d++) {
            size_t i = ((((size_t)l * 2 + kv) * N_TOK + t) * H + h) * D + d;
            if (kv == 0 && t % 7 == 6)
              c->kv[i] = c->kv[i - (size_t)(t / 2 + 1) * H * D]; /* an earlier token's key */
            else
              c->kv[i] = kv_score_f32_to_f16((float)(t_gauss(&seed) * size));
          }
      }
}

/* The variant of the score copies the engine wrote (kvdb_context_info.score_versions): the
 * brute force below encodes the same. */
static unsigned g_variant;
static uint32_t g_v1_blocks; /* leading blocks of version-1 copies whatever g_variant says */

static unsigned variant_of(kvdb *db, const kvdb_key *key)
{
  kvdb_context_info ci;
  ASSERT_OK(kvdb_context_stat(db, key, &ci));
  ASSERT(ci.score_versions == 1 || ci.score_versions == 2);
  if (ci.score_versions == 2) { /* the database says so: builds before format 6 refuse it */
    kvdb_stats st;
    ASSERT_OK(kvdb_stat(db, &st));
    ASSERT_EQ(st.format_version, 6);
  }
  return ci.score_versions == 2 ? KV_SCORE_COPY_CENTERED : 0;
}

static void put_ctx(kvdb *db, const kvdb_model *m, ctx *c, const kvdb_config *cfg)
{
  kvdb_kv_view v;
  ASSERT_OK(kvdb_kv_view_packed(&v, c->kv, m, N_TOK, KVDB_LAYOUT_LKTHD));
  kvdb_put_opts o;
  kvdb_put_opts_init(&o);
  if (cfg != NULL)
    o.config = *cfg;
  kvdb_put_info info;
  ASSERT_OK(kvdb_put_ex(db, m, c->tok, N_TOK, &v, &o, &info));
  c->key = info.context;
  if (m->score_bits != 0 && g_v1_blocks == 0)
    g_variant = variant_of(db, &c->key);
}

/* A query: n_q vectors of head_dim as f32, or the same rounded to f16. */
static void make_query(const kvdb_model *m, uint32_t n_q, uint64_t seed, float *qf, uint16_t *qh)
{
  for (uint32_t i = 0; i < n_q * m->head_dim; i++) {
    qf[i] = (float)t_gauss(&seed);
    if (qh != NULL) {
      qh[i] = kv_score_f32_to_f16(qf[i]);
      qf[i] = kv_score_f16_to_f32(qh[i]);
    }
  }
}

/* The brute-force top k of (layer, head): all of the context's keys as stored (keys[] packed
 * LKTHD, n tokens), quantized block by block (a version-2 copy is centered per block) at the
 * model's bits and the engine's variant (g_variant), every score, a full sort. */
static void brute(const kvdb_model *m, const uint16_t *keys, uint32_t layer, uint32_t head,
                  const void *q, kv_score_dtype qd, uint32_t n_q, kv_score_combine comb,
                  uint32_t k, uint32_t *pos, float *sc)
{
  const uint32_t H = m->n_kv_heads, D = m->head_dim, BT = m->block_tokens;
  kv_score_layout l;
  ASSERT(kv_score_layout_init_v(&l, BT, D, m->score_bits, g_variant, NULL) == KV_SCORE_OK);
  uint8_t *copy = aligned_alloc(4096, l.total_bytes);
  ASSERT(copy != NULL);
  kv_score_query *kq;
  ASSERT(kv_score_query_create(qd, q, n_q, D, (size_t)D * kv_score_dtype_bytes(qd), comb, &kq,
                               NULL) == KV_SCORE_OK);
  float all[N_TOK];
  for (uint32_t t0 = 0; t0 < N_TOK; t0 += BT) {
    uint32_t n = N_TOK - t0 < BT ? N_TOK - t0 : BT;
    size_t len = 0;
    const uint16_t *rows = keys + ((size_t)layer * 2 * N_TOK * H + (size_t)t0 * H + head) * D;
    unsigned var = t0 / BT < g_v1_blocks ? 0 : g_variant;
    ASSERT(kv_score_copy_encode_v(KV_SCORE_F16, rows, (size_t)H * D * 2, n, D, m->score_bits,
                                  var, copy, l.total_bytes, &len, NULL) == KV_SCORE_OK);
    kv_score_view v;
    ASSERT(kv_score_copy_parse(copy, len, &v, NULL) == KV_SCORE_OK);
    ASSERT(kv_score_tokens(kq, &v, 0, n, KV_SCORE_IMPL_PORTABLE, all + t0, NULL) == KV_SCORE_OK);
  }
  uint32_t idx[N_TOK];
  for (uint32_t i = 0; i < N_TOK; i++)
    idx[i] = i;
  for (uint32_t i = 1; i < N_TOK; i++) /* insertion sort by ORDER: the plainest sort */
    for (uint32_t j = i; j > 0 && kv_score_better(idx[j], all[idx[j]], idx[j - 1],
                                                  all[idx[j - 1]]);
         j--) {
      uint32_t t = idx[j];
      idx[j] = idx[j - 1];
      idx[j - 1] = t;
    }
  for (uint32_t i = 0; i < k; i++) {
    pos[i] = idx[i];
    sc[i] = all[idx[i]];
  }
  kv_score_query_free(kq);
  free(copy);
}

static int n_ties_seen;

static void expect_same(const uint32_t *pos, const float *sc, const uint32_t *wpos,
                        const float *wsc, uint32_t k, const char *what)
{
  for (uint32_t i = 0; i < k; i++) {
    if (pos[i] != wpos[i] || memcmp(&sc[i], &wsc[i], 4) != 0) {
      fprintf(stderr, "%s: rank %u is (%u, %.9g), brute force (%u, %.9g)\n", what, i, pos[i],
              (double)sc[i], wpos[i], (double)wsc[i]);
      abort();
    }
    if (i > 0 && sc[i] == sc[i - 1])
      n_ties_seen++;
  }
}

/* The context's keys as the engine returns them (packed LKTHD). */
static uint16_t *read_back(kvdb *db, const kvdb_model *m, const ctx *c)
{
  uint16_t *buf = malloc(N_TOK * kvdb_model_token_bytes(m));
  kvdb_kv_view v;
  ASSERT_OK(kvdb_kv_view_packed(&v, buf, m, N_TOK, KVDB_LAYOUT_LKTHD));
  ASSERT_OK(kvdb_get_context(db, m, &c->key, &v, NULL, NULL));
  return buf;
}

/* Every (layer, head) by kvdb_score with a few k, f32 and f16 queries, against brute force. */
static void check_single(kvdb *db, const kvdb_model *m, const ctx *c, const uint16_t *keys)
{
  float qf[4096];
  uint16_t qh[4096];
  uint32_t pos[N_TOK], wpos[N_TOK];
  float sc[N_TOK], wsc[N_TOK];
  const uint32_t ks[] = {1, 10, N_TOK / 10, N_TOK};
  for (uint32_t l = 0; l < m->n_layers; l++)
    for (uint32_t h = 0; h < m->n_kv_heads; h++)
      for (int f16 = 0; f16 < 2; f16++) {
        make_query(m, 1, 100 + l * 10 + h + f16, qf, f16 ? qh : NULL);
        for (size_t ki = 0; ki < sizeof ks / sizeof ks[0]; ki++) {
          uint32_t k = ks[ki];
          ASSERT_OK(kvdb_score(db, m, &c->key, l, h, f16 ? (const void *)qh : (const void *)qf,
                               f16 ? KVDB_F16 : KVDB_F32, k, pos, sc));
          brute(m, keys, l, h, f16 ? (const void *)qh : (const void *)qf,
                f16 ? KV_SCORE_F16 : KV_SCORE_F32, 1, KV_SCORE_SUM, k, wpos, wsc);
          expect_same(pos, sc, wpos, wsc, k, m->id);
        }
      }
}

/* All (layer, head) pairs in one batch with n_q = 4 heads per KV head; returns the stats. */
static void check_batch(kvdb *db, const kvdb_model *m, const ctx *c, const uint16_t *keys,
                        const kvdb_score_opts *o, kvdb_score_stats *st, uint64_t seed)
{
  enum { NQ = 4, K = 37 };
  uint32_t nr = m->n_layers * m->n_kv_heads;
  kvdb_score_req *r = calloc(nr, sizeof *r);
  float *q = malloc((size_t)nr * NQ * m->head_dim * 4);
  uint32_t *pos = malloc((size_t)nr * K * 4), wpos[K];
  float *sc = malloc((size_t)nr * K * 4), wsc[K];
  ASSERT(r && q && pos && sc);
  for (uint32_t i = 0; i < nr; i++) {
    make_query(m, NQ, seed + i, q + (size_t)i * NQ * m->head_dim, NULL);
    r[i] = (kvdb_score_req){i / m->n_kv_heads, i % m->n_kv_heads,
                            q + (size_t)i * NQ * m->head_dim, NQ, K, pos + i * K, sc + i * K};
  }
  ASSERT_OK(kvdb_score_batch(db, m, &c->key, KVDB_F32, r, nr, o, st));
  kv_score_combine comb = o != NULL && o->combine == KVDB_SCORE_MAX ? KV_SCORE_MAX : KV_SCORE_SUM;
  for (uint32_t i = 0; i < nr; i++) {
    brute(m, keys, r[i].layer, r[i].kv_head, r[i].q, KV_SCORE_F32, NQ, comb, K, wpos, wsc);
    expect_same(pos + i * K, sc + i * K, wpos, wsc, K, "batch");
  }
  ASSERT_EQ(st->tokens, (uint64_t)nr * N_TOK);
  free(r);
  free(q);
  free(pos);
  free(sc);
}

static uint32_t n_blocks(const kvdb_model *m)
{
  return (N_TOK + m->block_tokens - 1) / m->block_tokens;
}

static void test_host_and_gqa(const kvdb_model *m)
{
  char *dir = t_tmpdir("score");
  kvdb *db = t_open(dir, 0, 0); /* no DRAM tier: every copy is read from the SSD tier */
  ctx c;
  make_ctx(&c, m, 7);
  put_ctx(db, m, &c, NULL);
  uint16_t *keys = read_back(db, m, &c);
  ASSERT(memcmp(keys, c.kv, N_TOK * kvdb_model_token_bytes(m)) == 0);
  check_single(db, m, &c, keys);
  kvdb_score_opts o;
  kvdb_score_opts_init(&o);
  kvdb_score_stats st;
  for (int comb = 0; comb < 2; comb++) {
    o.combine = comb ? KVDB_SCORE_MAX : KVDB_SCORE_SUM;
    o.n_threads = comb ? 1 : 0;
    check_batch(db, m, &c, keys, &o, &st, 500 + comb);
    ASSERT_EQ(st.dram_copies, 0);
    ASSERT_EQ(st.device_copies, 0);
    ASSERT_EQ(st.host_copies, (uint64_t)n_blocks(m) * m->n_layers * m->n_kv_heads);
  }
  kvdb_stats s;
  ASSERT_OK(kvdb_stat(db, &s));
  /* created at 4 (score regions are format 3); 6 once version-2 copies are written */
  ASSERT_EQ(s.format_version, g_variant ? 6 : 4);
  free(keys);
  free(c.kv);
  kvdb_close(db);
  t_rmdir(dir);
}

/* DRAM-resident blocks, the emulated device and the host in one call; then a second process. */
static void test_tiers_and_reopen(void)
{
  const kvdb_model *m = &M8;
  char *dir = t_tmpdir("score");
  kvdb *db = t_open(dir, 64 << 20, 0);
  ctx c;
  make_ctx(&c, m, 11);
  put_ctx(db, m, &c, NULL);
  uint16_t *keys = read_back(db, m, &c); /* get_context does not fill the DRAM tier */
  /* a get of the first 150 tokens brings blocks 0..2 into the DRAM tier */
  uint16_t *buf = malloc(150 * kvdb_model_token_bytes(m));
  kvdb_kv_view v;
  ASSERT_OK(kvdb_kv_view_packed(&v, buf, m, 150, KVDB_LAYOUT_LKTHD));
  size_t hit = 0;
  ASSERT_OK(kvdb_get(db, m, c.tok, 150, &v, &hit));
  ASSERT_EQ(hit, 150);
  free(buf);
  uint32_t copies = m->n_layers * m->n_kv_heads, in_dram = 3, nb = n_blocks(m);
  kvdb_score_opts o;
  kvdb_score_opts_init(&o);
  kvdb_score_stats st, st2;
  check_batch(db, m, &c, keys, &o, &st, 900); /* regions of DRAM blocks read and kept */
  ASSERT_EQ(st.host_copies, (uint64_t)nb * copies);
  check_batch(db, m, &c, keys, &o, &st2, 901);
  ASSERT_EQ(st2.dram_copies, (uint64_t)in_dram * copies);
  ASSERT_EQ(st2.host_copies, (uint64_t)(nb - in_dram) * copies);
  ASSERT(st2.host_bytes < st.host_bytes);
  /* the emulated near-data device for the SSD blocks, the host for the DRAM ones (HIE) */
  o.device = KVDB_SCORE_EMULATED;
  o.device_tiers = 1u << KVDB_TIER_SSD;
  o.chunk_tokens = 64;
  o.host_share_permille = 0; /* the device scores every device-tier block (no APP split) */
  check_batch(db, m, &c, keys, &o, &st, 902);
  ASSERT_EQ(st.dram_copies, (uint64_t)in_dram * copies);
  if (g_variant != 0) { /* version-2 copies: the device ranks version 1 only, the host scores */
    ASSERT_EQ(st.device_copies, 0);
    ASSERT_EQ(st.host_copies, (uint64_t)(nb - in_dram) * copies);
  } else {
    ASSERT_EQ(st.device_copies, (uint64_t)(nb - in_dram) * copies);
    ASSERT_EQ(st.host_copies, 0);
    ASSERT(st.device_bytes > 0 && st.device_to_host_bytes > 0 && st.host_bytes == 0);
  }
  o.device = KVDB_SCORE_NEAR_DATA; /* no XRT here: the emulation */
  o.combine = KVDB_SCORE_MAX;
  check_batch(db, m, &c, keys, &o, &st, 903);
  ASSERT_EQ(st.device_copies, g_variant != 0 ? 0 : (uint64_t)(nb - in_dram) * copies);
  o.device_tiers = 0; /* the SmartSSD tier only: these blocks are on the SSD tier */
  check_batch(db, m, &c, keys, &o, &st, 904);
  ASSERT_EQ(st.device_copies, 0);

  /* the top k of one query, then its full K and V by get_tokens */
  float q[128];
  make_query(m, 1, 42, q, NULL);
  uint32_t pos[30], wpos[30];
  float sc[30], wsc[30];
  ASSERT_OK(kvdb_score(db, m, &c.key, 1, 1, q, KVDB_F32, 30, pos, sc));
  uint16_t *sel = malloc(30 * kvdb_model_token_bytes(m));
  ASSERT_OK(kvdb_kv_view_packed(&v, sel, m, 30, KVDB_LAYOUT_LKTHD));
  ASSERT_OK(kvdb_get_tokens(db, m, &c.key, 1, pos, 30, &v));
  for (uint32_t i = 0; i < 30; i++) /* layer 1 lands at layer 0 of the view; K of head 1 */
    ASSERT(memcmp(sel + ((size_t)i * m->n_kv_heads + 1) * m->head_dim,
                  c.kv + (((size_t)1 * 2 * N_TOK + pos[i]) * m->n_kv_heads + 1) * m->head_dim,
                  m->head_dim * 2) == 0);
  free(sel);
  kvdb_close(db);

  /* a second process opens the database read-only and gets the same answers */
  brute(m, keys, 1, 1, q, KV_SCORE_F32, 1, KV_SCORE_SUM, 30, wpos, wsc);
  expect_same(pos, sc, wpos, wsc, 30, "before reopening");
  fflush(NULL);
  pid_t pid = fork();
  ASSERT(pid >= 0);
  if (pid == 0) {
    kvdb *db2 = t_open(dir, 16 << 20, KVDB_O_RDONLY);
    uint32_t p2[30];
    float s2[30];
    ASSERT_OK(kvdb_score(db2, m, &c.key, 1, 1, q, KVDB_F32, 30, p2, s2));
    expect_same(p2, s2, wpos, wsc, 30, "second process");
    check_single(db2, m, &c, keys);
    kvdb_close(db2);
    _exit(0);
  }
  int status = 0;
  ASSERT(waitpid(pid, &status, 0) == pid);
  ASSERT(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  free(keys);
  free(c.kv);
  t_rmdir(dir);
}

/* A database written before version-2 copies (here: by a handle with a SmartSSD tier, which
 * writes version 1) keeps scoring its blocks with version 1; a longer context put later by a
 * handle without that tier shares those blocks and adds version-2 ones: one context, both
 * versions, scored together (each block by its own copy), checked by kvdb_verify, read by a
 * second process. */
static void test_mixed_versions(void)
{
  const kvdb_model *m = &M8;
  char *dir = t_tmpdir("score");
  kvdb_options o;
  kvdb_options_init(&o);
  o.log_level = -1;
  o.smartssd_bytes = 64 << 20;
  kvdb *db;
  ASSERT_OK(kvdb_open(dir, &o, &db));
  ctx c;
  make_ctx(&c, m, 77);
  const uint32_t n_old = 2 * m->block_tokens; /* two whole blocks: shared by the longer put */
  kvdb_kv_view v;
  ASSERT_OK(kvdb_kv_view_packed(&v, c.kv, m, N_TOK, KVDB_LAYOUT_LKTHD));
  kvdb_put_opts po;
  kvdb_put_opts_init(&po);
  kvdb_put_info info;
  ASSERT_OK(kvdb_put_ex(db, m, c.tok, n_old, &v, &po, &info));
  kvdb_context_info ci;
  ASSERT_OK(kvdb_context_stat(db, &info.context, &ci));
  ASSERT_EQ(ci.score_versions, 1);
  kvdb_close(db);
  db = t_open(dir, 0, 0); /* no SmartSSD tier (none was recorded: no segment on it) */
  ASSERT_OK(kvdb_put_ex(db, m, c.tok, N_TOK, &v, &po, &info));
  c.key = info.context;
  ASSERT_OK(kvdb_context_stat(db, &c.key, &ci));
  ASSERT_EQ(ci.score_versions, 3); /* two old blocks of version 1, the rest version 2 */
  g_v1_blocks = 2;
  g_variant = KV_SCORE_COPY_CENTERED;
  check_single(db, m, &c, c.kv);
  kvdb_verify_report rep;
  ASSERT_OK(kvdb_verify(db, NULL, NULL, NULL, &rep));
  ASSERT_EQ(rep.problems, 0);
  kvdb_close(db);
  fflush(NULL);
  pid_t pid = fork();
  ASSERT(pid >= 0);
  if (pid == 0) {
    kvdb *db2 = t_open(dir, 0, KVDB_O_RDONLY);
    check_single(db2, m, &c, c.kv);
    kvdb_close(db2);
    _exit(0);
  }
  int status = 0;
  ASSERT(waitpid(pid, &status, 0) == pid);
  ASSERT(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  g_v1_blocks = 0;
  free(c.kv);
  t_rmdir(dir);
}

/* A compaction moves the blocks (and their regions, byte for byte): same answers; the regions
 * this handle kept in DRAM are stale (another location) and read again. */
static void test_compaction(void)
{
  const kvdb_model *m = &M4;
  char *dir = t_tmpdir("score");
  kvdb_options opt;
  kvdb_options_init(&opt);
  opt.dram_bytes = 64 << 20;
  opt.log_level = -1;
  opt.segment_bytes = 3 << 19; /* both contexts (~1 MiB each) in one segment, then sealed */
  kvdb *db;
  ASSERT_OK(kvdb_open(dir, &opt, &db));
  ctx c, other;
  make_ctx(&other, m, 29);
  put_ctx(db, m, &other, NULL);
  make_ctx(&c, m, 31);
  put_ctx(db, m, &c, NULL);
  uint16_t *keys = read_back(db, m, &c);
  uint16_t *buf = malloc(N_TOK * kvdb_model_token_bytes(m));
  kvdb_kv_view v;
  ASSERT_OK(kvdb_kv_view_packed(&v, buf, m, N_TOK, KVDB_LAYOUT_LKTHD));
  size_t hit = 0;
  ASSERT_OK(kvdb_get(db, m, c.tok, N_TOK, &v, &hit)); /* every block in DRAM */
  free(buf);
  kvdb_score_stats st;
  check_batch(db, m, &c, keys, NULL, &st, 1100);
  check_batch(db, m, &c, keys, NULL, &st, 1101);
  ASSERT_EQ(st.dram_copies, (uint64_t)n_blocks(m) * m->n_layers * m->n_kv_heads);
  ASSERT_OK(kvdb_delete(db, &other.key));
  kvdb_compact_report rep;
  ASSERT_OK(kvdb_compact(db, 1.0, NULL, NULL, &rep));
  ASSERT(rep.blocks_moved > 0);
  check_batch(db, m, &c, keys, NULL, &st, 1102); /* moved: DRAM regions refreshed */
  ASSERT_EQ(st.host_copies, (uint64_t)n_blocks(m) * m->n_layers * m->n_kv_heads);
  check_batch(db, m, &c, keys, NULL, &st, 1103);
  ASSERT_EQ(st.dram_copies, (uint64_t)n_blocks(m) * m->n_layers * m->n_kv_heads);
  kvdb_verify_report vr;
  ASSERT_OK(kvdb_verify(db, NULL, NULL, NULL, &vr));
  free(keys);
  free(c.kv);
  free(other.kv);
  kvdb_close(db);
  t_rmdir(dir);
}

/* A context moved to the SmartSSD tier: the default device_tiers send its blocks to the
 * near-data device (the emulation here); the host CPU reads the same segments otherwise. */
static void test_smartssd(void)
{
  const kvdb_model *m = &M8;
  char *dir = t_tmpdir("score");
  kvdb_options opt;
  kvdb_options_init(&opt);
  opt.dram_bytes = 0;
  opt.log_level = -1;
  opt.smartssd_bytes = 256 << 20;
  kvdb *db;
  ASSERT_OK(kvdb_open(dir, &opt, &db));
  ctx c;
  make_ctx(&c, m, 41);
  put_ctx(db, m, &c, NULL);
  ASSERT_OK(kvdb_relocate(db, m, &c.key, NULL, KVDB_TIER_SMARTSSD, NULL));
  uint32_t copies = m->n_layers * m->n_kv_heads;
  kvdb_score_opts o;
  kvdb_score_opts_init(&o);
  o.device = KVDB_SCORE_NEAR_DATA; /* no XRT here: the emulation */
  o.host_share_permille = 0;
  kvdb_score_stats st;
  check_batch(db, m, &c, c.kv, &o, &st, 1200);
  ASSERT_EQ(st.device_copies, (uint64_t)n_blocks(m) * copies);
  ASSERT_EQ(st.host_copies, 0);
  /* APP: whatever share of the device-tier blocks the host takes (forced, or chosen by Eq. 4
   * from the rates the handle measured: the first call splits evenly), the same top k; every
   * block is scored by exactly one side; a request with k > 64 (selected on the device) too */
  const int32_t shares[] = {-1, 1, 250, 500, 999, 1000, -1, -1};
  for (size_t i = 0; i < sizeof shares / sizeof shares[0]; i++) {
    o.host_share_permille = shares[i];
    o.chunk_tokens = i % 2 ? 64 : 0;
    check_batch(db, m, &c, c.kv, &o, &st, 1200); /* the same queries: the same results */
    ASSERT_EQ(st.device_copies + st.host_copies, (uint64_t)n_blocks(m) * copies);
    uint64_t want_host = ((uint64_t)n_blocks(m) * (uint32_t)(shares[i] < 0 ? 0 : shares[i]) + 500) /
                         1000 * copies;
    if (shares[i] >= 0)
      ASSERT_EQ(st.host_copies, want_host);
    if (i == 0) /* the first APP call: the host's rate is unknown, an even split measures it */
      ASSERT_EQ(st.host_copies, (uint64_t)(n_blocks(m) / 2) * copies);
  }
  float qa[128];
  make_query(m, 1, 4242, qa, NULL);
  uint32_t pa[200], pb[200];
  float sa[200], sb[200];
  kvdb_score_req ra = {1, 1, qa, 1, 200, pa, sa}, rb = {1, 1, qa, 1, 200, pb, sb};
  o.host_share_permille = 0;
  ASSERT_OK(kvdb_score_batch(db, m, &c.key, KVDB_F32, &ra, 1, &o, &st));
  ASSERT_EQ(st.device_to_host_bytes, 200 * 8); /* k > 64: the device's top k once */
  o.host_share_permille = 1000;
  ASSERT_OK(kvdb_score_batch(db, m, &c.key, KVDB_F32, &rb, 1, &o, &st));
  ASSERT_EQ(st.device_copies, 0);
  ASSERT(memcmp(pa, pb, sizeof pa) == 0 && memcmp(sa, sb, sizeof sa) == 0);
  o.host_share_permille = 1001;
  ASSERT_STATUS(KVDB_INVALID, kvdb_score_batch(db, m, &c.key, KVDB_F32, &ra, 1, &o, &st));
  ASSERT_MSG_HAS("host_share_permille");
  o.host_share_permille = -1;
  check_batch(db, m, &c, c.kv, NULL, &st, 1201);
  ASSERT_EQ(st.host_copies, (uint64_t)n_blocks(m) * copies);
  kvdb_verify_report vr;
  ASSERT_OK(kvdb_verify(db, NULL, NULL, NULL, &vr));
  free(c.kv);
  kvdb_close(db);
  t_rmdir(dir);
}

/* Four threads score on one handle (DRAM tier shared: regions inserted and pinned
 * concurrently; half of them through the emulated device). */
typedef struct thr_arg {
  kvdb *db;
  const ctx *c;
  const uint32_t *want;
  int id;
} thr_arg;

static void *score_thread(void *p)
{
  thr_arg *a = p;
  float q[128];
  make_query(&M8, 1, 77, q, NULL);
  kvdb_score_opts o;
  kvdb_score_opts_init(&o);
  if (a->id & 1) {
    o.device = KVDB_SCORE_EMULATED;
    o.device_tiers = 1u << KVDB_TIER_SSD;
  }
  o.n_threads = 2;
  for (int round = 0; round < 6; round++) {
    uint32_t pos[40];
    kvdb_score_req r = {1, 0, q, 1, 40, pos, NULL};
    ASSERT_OK(kvdb_score_batch(a->db, &M8, &a->c->key, KVDB_F32, &r, 1, &o, NULL));
    ASSERT(memcmp(pos, a->want, sizeof pos) == 0);
    if (round == 2 && a->id == 0) { /* bring the first blocks into DRAM meanwhile */
      uint16_t *buf = malloc(130 * kvdb_model_token_bytes(&M8));
      kvdb_kv_view v;
      ASSERT_OK(kvdb_kv_view_packed(&v, buf, &M8, 130, KVDB_LAYOUT_LKTHD));
      size_t hit = 0;
      ASSERT_OK(kvdb_get(a->db, &M8, a->c->tok, 130, &v, &hit));
      free(buf);
    }
  }
  return NULL;
}

static void test_threads(void)
{
  char *dir = t_tmpdir("score");
  kvdb *db = t_open(dir, 64 << 20, 0);
  ctx c;
  make_ctx(&c, &M8, 37);
  put_ctx(db, &M8, &c, NULL);
  float q[128];
  make_query(&M8, 1, 77, q, NULL);
  uint32_t want[40];
  float wsc[40];
  brute(&M8, c.kv, 1, 0, q, KV_SCORE_F32, 1, KV_SCORE_SUM, 40, want, wsc);
  pthread_t th[4];
  thr_arg args[4];
  for (int i = 0; i < 4; i++) {
    args[i] = (thr_arg){db, &c, want, i};
    ASSERT(pthread_create(&th[i], NULL, score_thread, &args[i]) == 0);
  }
  for (int i = 0; i < 4; i++)
    ASSERT(pthread_join(th[i], NULL) == 0);
  free(c.kv);
  kvdb_close(db);
  t_rmdir(dir);
}

/* The segment file of a database holding one context, and the offset of its first score
 * region (found by its magic at a page start). */
static void first_region(const char *dir, char *path, size_t cap, long *off)
{
  char cmd[4300];
  snprintf(cmd, sizeof cmd, "ls %s/ssd/seg-*.kvs | head -n 1", dir);
  FILE *p = popen(cmd, "r");
  ASSERT(p != NULL && fgets(path, (int)cap, p) != NULL);
  pclose(p);
  path[strcspn(path, "\n")] = 0;
  FILE *f = fopen(path, "rb");
  ASSERT(f != NULL);
  uint8_t page[4096];
  *off = -1;
  for (long at = 0; fread(page, 1, sizeof page, f) == sizeof page; at += 4096)
    if (kv_get_le32(page) == KV_SREGION_MAGIC) {
      *off = at;
      break;
    }
  fclose(f);
  ASSERT(*off >= 0);
}

static void flip_byte(const char *path, long off)
{
  int fd = open(path, O_RDWR);
  ASSERT(fd >= 0);
  uint8_t b;
  ASSERT(pread(fd, &b, 1, off) == 1);
  b ^= 0x40;
  ASSERT(pwrite(fd, &b, 1, off) == 1);
  close(fd);
}

static void test_corrupt_copy(void)
{
  const kvdb_model *m = &M4;
  char *dir = t_tmpdir("score");
  kvdb *db = t_open(dir, 0, 0);
  ctx c;
  make_ctx(&c, m, 13);
  put_ctx(db, m, &c, NULL);
  kvdb_close(db);
  char path[4096];
  long off;
  first_region(dir, path, sizeof path, &off);
  kv_block_geom g;
  ASSERT_OK(kv_block_geom_init(&g, m->n_layers, m->n_kv_heads, m->head_dim, m->dtype,
                               m->block_tokens, m->block_tokens));
  kv_sregion r;
  ASSERT_EQ(g_variant, KV_SCORE_COPY_CENTERED); /* a version-2 copy */
  ASSERT_OK(kv_sregion_init(&r, &g, m->score_bits, g_variant));
  /* a code byte of copy 3 (layer 1, head 1) of block 0 */
  flip_byte(path, off + (long)kv_sregion_copy_off(&r, 3) + (long)r.layout.meta_bytes + 5);

  float q[64];
  make_query(m, 1, 5, q, NULL);
  uint32_t pos[10];
  float sc[10];
  db = t_open(dir, 0, 0); /* host path */
  ASSERT_OK(kvdb_score(db, m, &c.key, 0, 0, q, KVDB_F32, 10, pos, sc)); /* copy 0: intact */
  ASSERT_STATUS(KVDB_CORRUPT, kvdb_score(db, m, &c.key, 1, 1, q, KVDB_F32, 10, pos, sc));
  ASSERT_MSG_HAS("score region");
  ASSERT_MSG_HAS("checksum");
  ASSERT_MSG_HAS("segment");
  kvdb_verify_report rep;
  ASSERT_STATUS(KVDB_CORRUPT, kvdb_verify(db, NULL, NULL, NULL, &rep));
  ASSERT_EQ(rep.problems, 1);
  uint16_t *buf = malloc(N_TOK * kvdb_model_token_bytes(m));
  kvdb_kv_view v;
  ASSERT_OK(kvdb_kv_view_packed(&v, buf, m, N_TOK, KVDB_LAYOUT_LKTHD));
  size_t hit = 0;
  ASSERT_OK(kvdb_get(db, m, c.tok, N_TOK, &v, &hit)); /* K and V are intact */
  ASSERT_EQ(hit, N_TOK);
  ASSERT(memcmp(buf, c.kv, N_TOK * kvdb_model_token_bytes(m)) == 0);
  kvdb_close(db);
  db = t_open(dir, 16 << 20, 0); /* DRAM path: block 0 in DRAM, its region read whole */
  ASSERT_OK(kvdb_get(db, m, c.tok, 16, &v, &hit));
  ASSERT_STATUS(KVDB_CORRUPT, kvdb_score(db, m, &c.key, 0, 0, q, KVDB_F32, 10, pos, sc));
  ASSERT_MSG_HAS("score region");
  kvdb_close(db);
  free(buf);
  free(c.kv);
  t_rmdir(dir);
}

/* kvdb_get reads each block object without its score region; get_tokens only some pages. */
static void test_get_reads(void)
{
  const kvdb_model *m = &M8;
  char *dir = t_tmpdir("score");
  kvdb *db = t_open(dir, 0, 0);
  ctx c;
  make_ctx(&c, m, 17);
  put_ctx(db, m, &c, NULL);
  kvdb_context_info ci;
  ASSERT_OK(kvdb_context_stat(db, &c.key, &ci));
  uint64_t regions = 0;
  for (uint32_t b = 0; b < n_blocks(m); b++) {
    kv_block_geom g;
    uint32_t n = b + 1 < n_blocks(m) ? m->block_tokens : N_TOK - b * m->block_tokens;
    ASSERT_OK(kv_block_geom_init(&g, m->n_layers, m->n_kv_heads, m->head_dim, m->dtype,
                                 m->block_tokens, n));
    regions += kv_score_region_bytes(&g, m->score_bits, g_variant);
  }
  ASSERT(regions > 0);
  kvdb_stats s0, s1;
  ASSERT_OK(kvdb_stat(db, &s0));
  uint16_t *buf = malloc(N_TOK * kvdb_model_token_bytes(m));
  kvdb_kv_view v;
  ASSERT_OK(kvdb_kv_view_packed(&v, buf, m, N_TOK, KVDB_LAYOUT_LKTHD));
  size_t hit = 0;
  ASSERT_OK(kvdb_get(db, m, c.tok, N_TOK, &v, &hit));
  ASSERT_EQ(hit, N_TOK);
  ASSERT_OK(kvdb_stat(db, &s1));
  ASSERT_EQ(s1.bytes_read - s0.bytes_read, ci.bytes - regions);
  free(buf);
  free(c.kv);
  kvdb_close(db);
  t_rmdir(dir);
}

/* A compressed config: the copies come from the keys as put, not from their decoded form. */
static void test_compressed(void)
{
  const kvdb_model *m = &M8;
  char *dir = t_tmpdir("score");
  kvdb *db = t_open(dir, 0, 0);
  ctx c;
  make_ctx(&c, m, 19);
  kvdb_config cfg;
  ASSERT_OK(kvdb_config_parse("int4", &cfg));
  put_ctx(db, m, &c, &cfg);
  uint16_t *dec = read_back(db, m, &c);
  ASSERT(memcmp(dec, c.kv, N_TOK * kvdb_model_token_bytes(m)) != 0); /* lossy */
  check_single(db, m, &c, c.kv);
  ASSERT_OK(kvdb_config_parse("knorm50", &cfg));
  ctx c2;
  make_ctx(&c2, m, 20);
  kvdb_kv_view v;
  ASSERT_OK(kvdb_kv_view_packed(&v, c2.kv, m, N_TOK, KVDB_LAYOUT_LKTHD));
  kvdb_put_opts o;
  kvdb_put_opts_init(&o);
  o.config = cfg;
  ASSERT_STATUS(KVDB_INVALID, kvdb_put_ex(db, m, c2.tok, N_TOK, &v, &o, NULL));
  ASSERT_MSG_HAS("drops tokens");
  /* re-encoding rebuilds the copies from the keys it re-encodes: here, raw, the keys as put */
  put_ctx(db, m, &c2, NULL);
  ASSERT_OK(kvdb_config_parse("int8", &cfg));
  ASSERT_OK(kvdb_recompress(db, m, &c2.key, &cfg, NULL));
  uint16_t *dec2 = read_back(db, m, &c2);
  ASSERT(memcmp(dec2, c2.kv, N_TOK * kvdb_model_token_bytes(m)) != 0); /* re-encoded */
  check_single(db, m, &c2, c2.kv);
  kvdb_verify_report vr;
  ASSERT_OK(kvdb_verify(db, NULL, NULL, NULL, &vr));
  free(dec2);
  free(dec);
  free(c.kv);
  free(c2.kv);
  kvdb_close(db);
  t_rmdir(dir);
}

static void test_bad_input(void)
{
  char *dir = t_tmpdir("score");
  kvdb *db = t_open(dir, 0, 0);
  ctx c, c0;
  make_ctx(&c, &M4, 23);
  make_ctx(&c0, &M0, 23);
  put_ctx(db, &M4, &c, NULL);
  put_ctx(db, &M0, &c0, NULL);
  float q[64];
  make_query(&M4, 1, 1, q, NULL);
  uint32_t pos[N_TOK + 1];
  float sc[N_TOK + 1];
  ASSERT_STATUS(KVDB_UNSUPPORTED, kvdb_score(db, &M0, &c0.key, 0, 0, q, KVDB_F32, 5, pos, sc));
  ASSERT_MSG_HAS("score_bits");
  ASSERT_STATUS(KVDB_INVALID, kvdb_score(db, &M4, &c.key, 0, 0, q, KVDB_F32, 0, pos, sc));
  ASSERT_MSG_HAS("k is 0");
  ASSERT_STATUS(KVDB_INVALID, kvdb_score(db, &M4, &c.key, 0, 0, q, KVDB_F32, N_TOK + 1, pos, sc));
  ASSERT_MSG_HAS("larger than");
  ASSERT_STATUS(KVDB_INVALID, kvdb_score(db, &M4, &c.key, 2, 0, q, KVDB_F32, 5, pos, sc));
  ASSERT_MSG_HAS("layer 2");
  ASSERT_STATUS(KVDB_INVALID, kvdb_score(db, &M4, &c.key, 0, 2, q, KVDB_F32, 5, pos, sc));
  ASSERT_MSG_HAS("kv_head 2");
  ASSERT_STATUS(KVDB_INVALID, kvdb_score(db, &M4, &c.key, 0, 0, NULL, KVDB_F32, 5, pos, sc));
  ASSERT_STATUS(KVDB_INVALID, kvdb_score(db, &M4, &c.key, 0, 0, q, KVDB_F32, 5, NULL, sc));
  ASSERT_STATUS(KVDB_INVALID, kvdb_score(db, &M4, &c.key, 0, 0, q, (kvdb_dtype)7, 5, pos, sc));
  ASSERT_MSG_HAS("q_dtype");
  ASSERT_STATUS(KVDB_INVALID, kvdb_score(db, &M4, NULL, 0, 0, q, KVDB_F32, 5, pos, sc));
  q[3] = NAN;
  ASSERT_STATUS(KVDB_INVALID, kvdb_score(db, &M4, &c.key, 0, 0, q, KVDB_F32, 5, pos, sc));
  ASSERT_MSG_HAS("q");
  q[3] = 1.0f;
  kvdb_key nokey = c.key;
  nokey.b[0] ^= 1;
  ASSERT_STATUS(KVDB_NOTFOUND, kvdb_score(db, &M4, &nokey, 0, 0, q, KVDB_F32, 5, pos, sc));
  kvdb_model other = M4;
  other.id = "score4-other";
  ASSERT_STATUS(KVDB_MISMATCH, kvdb_score(db, &other, &c.key, 0, 0, q, KVDB_F32, 5, pos, sc));
  kvdb_model bits8 = M4;
  bits8.score_bits = 8; /* the same id with other score_bits: another fingerprint */
  kvdb_kv_view v;
  ASSERT_OK(kvdb_kv_view_packed(&v, c.kv, &bits8, N_TOK, KVDB_LAYOUT_LKTHD));
  ASSERT_STATUS(KVDB_MISMATCH, kvdb_put(db, &bits8, c.tok, N_TOK, &v, NULL));
  ASSERT_MSG_HAS("score_bits 4");
  ASSERT_STATUS(KVDB_MISMATCH, kvdb_score(db, &bits8, &c.key, 0, 0, q, KVDB_F32, 5, pos, sc));
  kvdb_model bad = M4;
  bad.score_bits = 3;
  ASSERT_STATUS(KVDB_INVALID, kvdb_score(db, &bad, &c.key, 0, 0, q, KVDB_F32, 5, pos, sc));
  ASSERT_MSG_HAS("score_bits 3");
  kvdb_score_opts o;
  kvdb_score_opts_init(&o);
  kvdb_score_req r = {0, 0, q, 1, 5, pos, sc};
  o.chunk_tokens = 100;
  ASSERT_STATUS(KVDB_INVALID, kvdb_score_batch(db, &M4, &c.key, KVDB_F32, &r, 1, &o, NULL));
  kvdb_score_opts_init(&o);
  o.struct_size = 0;
  ASSERT_STATUS(KVDB_INVALID, kvdb_score_batch(db, &M4, &c.key, KVDB_F32, &r, 1, &o, NULL));
  kvdb_score_opts_init(&o);
  o.combine = (kvdb_score_combine)9;
  ASSERT_STATUS(KVDB_INVALID, kvdb_score_batch(db, &M4, &c.key, KVDB_F32, &r, 1, &o, NULL));
  r.n_q = 300;
  ASSERT_STATUS(KVDB_INVALID, kvdb_score_batch(db, &M4, &c.key, KVDB_F32, &r, 1, NULL, NULL));
  ASSERT_STATUS(KVDB_INVALID, kvdb_score_batch(db, &M4, &c.key, KVDB_F32, &r, 0, NULL, NULL));
  /* a database with only contexts of models without copies: format 4 as created (its block
   * indexes), nothing raised (its raw blocks in whole pages: packed ones would raise 7) */
  char *dir2 = t_tmpdir("score");
  g_packed = 1;
  kvdb *db2 = t_open(dir2, 0, 0);
  g_packed = 0;
  put_ctx(db2, &M0, &c0, NULL);
  kvdb_stats s;
  ASSERT_OK(kvdb_stat(db2, &s));
  ASSERT_EQ(s.format_version, 4);
  kvdb_close(db2);
  t_rmdir(dir2);
  free(c.kv);
  free(c0.kv);
  kvdb_close(db);
  t_rmdir(dir);
}

int main(void)
{
  test_host_and_gqa(&M8);
  kv_score_wave_bytes = 64 << 10; /* many small waves of host reads from here on */
  test_host_and_gqa(&M4);
  test_tiers_and_reopen(); /* version-2 copies (no SmartSSD tier), a second process reads them */
  ASSERT_EQ(g_variant, KV_SCORE_COPY_CENTERED);
  g_smart_bytes = 256 << 20; /* the same with version-1 copies: the device scores the SSD tier */
  test_tiers_and_reopen();
  ASSERT_EQ(g_variant, 0);
  g_smart_bytes = 0;
  test_mixed_versions();
  test_compaction();
  test_smartssd();
  test_threads();
  test_corrupt_copy();
  test_get_reads();
  test_compressed();
  test_bad_input();
  ASSERT(n_ties_seen > 0); /* the tie rule was exercised */
  printf("test_score_engine: ok (%d equal-score neighbours compared)\n", n_ties_seen);
  return 0;
}
