/* SPDX-License-Identifier: MIT */
/*
 * tests/unit/test_decode.c — decode sessions (kvdb_decode_*: engine/ops/decode.c).
 *   - select: for every layer and KV head, the positions and scores kvdb_score_batch gives for
 *     the same tokens put at once — with every token published, and with unpublished tokens
 *     appended in the session (scored on the CPU from the session's DRAM);
 *   - fetch: every row is the KV the tokens were put or appended with; the first step reads
 *     from the store (cold), the rows are promoted after the step and later steps hit the hot
 *     pool (no more bytes read); the recent window and unpublished tokens are hot hits;
 *   - a hot pool smaller than k: demotions, rows still exact;
 *   - two contexts in one session, each its own positions; the emulated near-data device
 *     selects the same positions, and APP's beta is within [0, 1];
 *   - page-group selection: the picks in DRAM stay, the cold ones come as whole page groups
 *     holding top-k positions, k distinct positions, rows exact;
 *   - a second process opens a session on what the first one published;
 *   - bad input: each with a status and a message naming it.
 */
#include "kvdb_test.h"

#include <math.h>
#include <sys/wait.h>
#include <unistd.h>

static const kvdb_model M = {"decode-m", 2, 2, 32, KVDB_F16, 16, 8};
#define NQ 4 /* query heads: 2 per KV head */
#define K 12

static void make_tokens(uint32_t *tok, size_t n, uint64_t seed)
{
  for (size_t i = 0; i < n; i++)
    tok[i] = (uint32_t)(t_rand(&seed) % 30000);
}

/* The KV of positions [t0, t0 + n) of the sequence `tok` (t_kv_value's) in a packed buffer. */
static uint16_t *kv_slice(const uint32_t *tok, size_t t0, size_t n, kvdb_kv_view *v)
{
  uint16_t *b = malloc(n * kvdb_model_token_bytes(&M));
  ASSERT(b != NULL);
  t_fill_kv_range(&M, tok, t0, n, b);
  ASSERT_OK(kvdb_kv_view_packed(v, b, &M, n, KVDB_LAYOUT_LKTHD));
  return b;
}

static void make_query(float *q, uint64_t seed)
{
  for (int i = 0; i < NQ * 32; i++)
    q[i] = (float)((int)(t_rand(&seed) % 2001) - 1000) / 250.0f;
}

/* Select in the session and compare with kvdb_score_batch on `ref` (the tokens put at once). */
static void check_select(kvdb_decode *s, uint32_t ctx, kvdb *ref, const kvdb_key *rk,
                         const float *q, uint32_t *pos)
{
  for (uint32_t l = 0; l < M.n_layers; l++) {
    float sc[2 * K];
    ASSERT_OK(kvdb_decode_select(s, ctx, l, q, KVDB_F32, NQ, K, pos + l * 2 * K, sc));
    for (uint32_t h = 0; h < 2; h++) {
      uint32_t p2[K];
      float s2[K];
      kvdb_score_req r = {l, h, q + h * 2 * 32, 2, K, p2, s2};
      ASSERT_OK(kvdb_score_batch(ref, &M, rk, KVDB_F32, &r, 1, NULL, NULL));
      ASSERT(memcmp(pos + l * 2 * K + h * K, p2, sizeof p2) == 0);
      ASSERT(memcmp(sc + h * K, s2, sizeof s2) == 0);
    }
  }
}

/* Fetch what select chose and check every row against the tokens' KV. */
static void check_fetch(kvdb_decode *s, uint32_t ctx, const uint32_t *tok, const uint32_t *pos)
{
  uint16_t buf[2 * K * 2 * 32];
  for (uint32_t l = 0; l < M.n_layers; l++) {
    kvdb_kv_view v;
    ASSERT_OK(kvdb_kv_view_packed(&v, buf, &M, K, KVDB_LAYOUT_LKTHD));
    memset(buf, 0xff, sizeof buf);
    ASSERT_OK(kvdb_decode_fetch(s, ctx, l, pos + l * 2 * K, K, &v));
    for (uint32_t kv = 0; kv < 2; kv++)
      for (uint32_t i = 0; i < K; i++)
        for (uint32_t h = 0; h < 2; h++)
          for (uint32_t d = 0; d < 32; d++) {
            uint32_t p = pos[l * 2 * K + h * K + i];
            ASSERT_EQ(buf[((kv * K + i) * 2 + h) * 32 + d], t_kv_value(tok, p, l, kv, h, d));
          }
  }
}

static void test_select_fetch(void)
{
  char *dir = t_tmpdir("decode"), *rdir = t_tmpdir("decode-ref");
  kvdb *db, *ref;
  ASSERT_OK(kvdb_open(dir, NULL, &db));
  ASSERT_OK(kvdb_open(rdir, NULL, &ref));
  uint32_t tok[300];
  make_tokens(tok, 300, 3);
  kvdb_put_info pi, rp;
  t_put_kv(db, &M, tok, 250, &pi);
  t_put_kv(ref, &M, tok, 250, &rp);
  kvdb_decode_opts o;
  kvdb_decode_opts_init(&o);
  o.recent_tokens = 8;
  o.hot_tokens = 64;
  kvdb_decode *s;
  ASSERT_OK(kvdb_decode_open(db, &M, &pi.context, 1, &o, &s));
  float q[NQ * 32];
  make_query(q, 17);
  uint32_t pos[2 * 2 * K];
  kvdb_decode_stats st0, st1, st2;
  /* step 1: cold; step 2 promotes them; step 3 hits the hot pool */
  check_select(s, 0, ref, &rp.context, q, pos);
  check_fetch(s, 0, tok, pos);
  ASSERT_OK(kvdb_decode_stat(s, &st0));
  ASSERT(st0.cold_reads > 0 && st0.ssd_bytes > 0 && st0.host_bytes > 0);
  ASSERT_EQ(st0.selected, 2 * 2 * K);
  ASSERT_EQ(st0.hot_hits + st0.cold_reads, st0.selected);
  ASSERT_EQ(st0.steps, 1);
  check_select(s, 0, ref, &rp.context, q, pos);
  check_fetch(s, 0, tok, pos);
  ASSERT_OK(kvdb_decode_stat(s, &st1));
  ASSERT_EQ(st1.promoted, st0.cold_reads);
  ASSERT_EQ(st1.cold_reads, st0.cold_reads); /* all hot now */
  ASSERT_EQ(st1.ssd_bytes, st0.ssd_bytes);
  ASSERT_EQ(st1.hot_hits, st0.hot_hits + 2 * 2 * K);
  /* appends: unpublished tokens are selectable and fetchable, and scored as if stored */
  for (size_t t = 250; t < 258; t++) {
    kvdb_kv_view v;
    uint16_t *b = kv_slice(tok, t, 1, &v);
    ASSERT_OK(kvdb_decode_append(s, 0, tok + t, 1, &v));
    free(b);
  }
  uint64_t n, np;
  ASSERT_OK(kvdb_decode_context(s, 0, NULL, &n, &np));
  ASSERT_EQ(n, 258);
  ASSERT_EQ(np, 256);
  kvdb_put_info rp2;
  t_put_kv(ref, &M, tok, 258, &rp2);
  uint64_t seed = 5;
  for (int step = 0; step < 6; step++) {
    make_query(q, 1000 + (uint64_t)step);
    if (step == 3) { /* a query pointing at the newest token's key: it must be selected */
      for (int i = 0; i < NQ * 32; i++)
        q[i] = (float)(t_rand(&seed) % 3);
    }
    check_select(s, 0, ref, &rp2.context, q, pos);
    check_fetch(s, 0, tok, pos);
  }
  ASSERT_OK(kvdb_decode_stat(s, &st2));
  ASSERT(st2.hot_hits > st1.hot_hits && st2.hot_pool_bytes > 0);
  ASSERT(st2.beta >= 0 && st2.beta <= 1);
  kvdb_key cur;
  ASSERT_OK(kvdb_decode_context(s, 0, &cur, NULL, NULL));
  kvdb_decode_close(s);
  /* a small hot pool: demotions, rows still exact */
  o.hot_tokens = 5;
  {
    kvdb_decode *s2;
    /* the session's appends published 256 tokens: the context's key changed (the 2 unpublished
     * ones are gone with the session) */
    kvdb_context_info ci;
    ASSERT_STATUS(KVDB_NOTFOUND, kvdb_context_stat(db, &pi.context, &ci));
    ASSERT_OK(kvdb_context_stat(db, &cur, &ci));
    ASSERT_EQ(ci.n_tokens, 256);
    ASSERT_OK(kvdb_decode_open(db, &M, &cur, 1, &o, &s2));
    kvdb_put_info rp3;
    t_put_kv(ref, &M, tok, 256, &rp3);
    for (int step = 0; step < 5; step++) {
      make_query(q, 2000 + (uint64_t)step);
      check_select(s2, 0, ref, &rp3.context, q, pos);
      check_fetch(s2, 0, tok, pos);
    }
    kvdb_decode_stats st;
    ASSERT_OK(kvdb_decode_stat(s2, &st));
    ASSERT(st.demoted > 0);
    kvdb_decode_close(s2);
  }
  /* a second process opens a session on what this one published */
  pid_t pid = fork();
  ASSERT(pid >= 0);
  if (pid == 0) {
    kvdb *d2;
    kvdb_decode *s3;
    if (kvdb_open(dir, NULL, &d2) != KVDB_OK ||
        kvdb_decode_open(d2, &M, &cur, 1, NULL, &s3) != KVDB_OK)
      _exit(2);
    make_query(q, 77);
    if (kvdb_decode_select(s3, 0, 1, q, KVDB_F32, NQ, K, pos, NULL) != KVDB_OK)
      _exit(3);
    check_fetch(s3, 0, tok, pos); /* layer 0's rows of layer 1's positions: still exact */
    kvdb_decode_close(s3);
    kvdb_close(d2);
    _exit(0);
  }
  int wst;
  ASSERT(waitpid(pid, &wst, 0) == pid);
  ASSERT(WIFEXITED(wst) && WEXITSTATUS(wst) == 0);
  kvdb_close(db);
  kvdb_close(ref);
  t_rmdir(dir);
  t_rmdir(rdir);
}

static void test_two_contexts_device(void)
{
  char *dir = t_tmpdir("decode2"), *rdir = t_tmpdir("decode2-ref");
  kvdb *db, *ref;
  ASSERT_OK(kvdb_open(dir, NULL, &db));
  ASSERT_OK(kvdb_open(rdir, NULL, &ref));
  uint32_t ta[200], tb[170];
  make_tokens(ta, 200, 21);
  make_tokens(tb, 170, 22);
  kvdb_put_info pa, pb, ra, rb;
  t_put_kv(db, &M, ta, 200, &pa);
  t_put_kv(db, &M, tb, 170, &pb);
  t_put_kv(ref, &M, ta, 200, &ra);
  t_put_kv(ref, &M, tb, 170, &rb);
  kvdb_key keys[2] = {pa.context, pb.context};
  kvdb_decode_opts o;
  kvdb_decode_opts_init(&o);
  o.device = KVDB_SCORE_EMULATED;
  o.device_tiers = 1u << KVDB_TIER_SSD;
  kvdb_decode *s;
  ASSERT_OK(kvdb_decode_open(db, &M, keys, 2, &o, &s));
  float q[NQ * 32];
  uint32_t pos[2 * 2 * K];
  for (int step = 0; step < 4; step++) {
    make_query(q, 300 + (uint64_t)step);
    check_select(s, 0, ref, &ra.context, q, pos);
    check_fetch(s, 0, ta, pos);
    check_select(s, 1, ref, &rb.context, q, pos);
    check_fetch(s, 1, tb, pos);
  }
  kvdb_decode_stats st;
  ASSERT_OK(kvdb_decode_stat(s, &st));
  ASSERT(st.beta >= 0 && st.beta <= 1);
  ASSERT(st.score_bytes > 0);
  kvdb_decode_close(s);
  kvdb_close(db);
  kvdb_close(ref);
  t_rmdir(dir);
  t_rmdir(rdir);
}

/* KVDB_DECODE_PAGE_GROUPS: DRAM picks kept, cold picks replaced by whole page groups holding
 * them (16 tokens here: block_tokens 16), k distinct positions, rows exact; `extra` flags added
 * (KVDB_DECODE_PROMOTE_PICKS: only picks promoted). Returns the rows promoted. */
static uint64_t page_groups_run(uint32_t extra)
{
  char *dir = t_tmpdir("decode-pg"), *rdir = t_tmpdir("decode-pg-ref");
  kvdb *db, *ref;
  ASSERT_OK(kvdb_open(dir, NULL, &db));
  ASSERT_OK(kvdb_open(rdir, NULL, &ref));
  uint32_t tok[400];
  make_tokens(tok, 400, 31);
  kvdb_put_info pi, rp;
  t_put_kv(db, &M, tok, 400, &pi);
  t_put_kv(ref, &M, tok, 400, &rp);
  kvdb_decode_opts o;
  kvdb_decode_opts_init(&o);
  o.recent_tokens = 8;
  o.hot_tokens = 16;
  o.flags = KVDB_DECODE_PAGE_GROUPS | extra;
  o.fetch_device = KVDB_SCORE_CPU;
  kvdb_decode *s;
  ASSERT_OK(kvdb_decode_open(db, &M, &pi.context, 1, &o, &s));
  float q[NQ * 32];
  uint32_t pos[2 * 2 * K];
  for (int step = 0; step < 6; step++) {
    make_query(q, 500 + (uint64_t)(step / 2)); /* each query twice: the second finds hot rows */
    for (uint32_t l = 0; l < M.n_layers; l++) {
      uint32_t *p = pos + l * 2 * K;
      ASSERT_OK(kvdb_decode_select(s, 0, l, q, KVDB_F32, NQ, K, p, NULL));
      for (uint32_t h = 0; h < 2; h++) {
        uint32_t ex[K];
        kvdb_score_req r = {l, h, q + h * 2 * 32, 2, K, ex, NULL};
        ASSERT_OK(kvdb_score_batch(ref, &M, &rp.context, KVDB_F32, &r, 1, NULL, NULL));
        const uint32_t *ph = p + h * K;
        for (uint32_t i = 0; i < K; i++) {
          for (uint32_t j = 0; j < i; j++)
            ASSERT(ph[i] != ph[j]); /* distinct */
          int pick = 0, group = 0;  /* a pick, or in the group of a pick */
          for (uint32_t e = 0; e < K; e++) {
            pick |= ex[e] == ph[i];
            group |= ex[e] / 16 == ph[i] / 16;
          }
          ASSERT(pick || group);
        }
      }
    }
    check_fetch(s, 0, tok, pos);
  }
  kvdb_decode_stats st;
  ASSERT_OK(kvdb_decode_stat(s, &st));
  ASSERT(st.hot_hits > 0 && st.cold_reads > 0 && st.promoted > 0);
  kvdb_decode_close(s);
  kvdb_close(db);
  kvdb_close(ref);
  t_rmdir(dir);
  t_rmdir(rdir);
  return st.promoted;
}

/* Every row of the groups read is a promotion candidate (default), or only the picks
 * (KVDB_DECODE_PROMOTE_PICKS): the former promotes at least as many. */
static void test_page_groups(void)
{
  uint64_t all = page_groups_run(0), picks = page_groups_run(KVDB_DECODE_PROMOTE_PICKS);
  ASSERT(all >= picks && picks > 0);
}

/* kvdb_decode_opts.cold_share_permille: a cold budget of whole page groups, the rest of the k
 * from DRAM past the top k: k distinct positions, each a pick, in a pick's group or among the
 * ranking's top 4k; rows exact; the stats count the top k and the part of it returned. */
static void test_cold_budget(void)
{
  char *dir = t_tmpdir("decode-cb"), *rdir = t_tmpdir("decode-cb-ref");
  kvdb *db, *ref;
  ASSERT_OK(kvdb_open(dir, NULL, &db));
  ASSERT_OK(kvdb_open(rdir, NULL, &ref));
  uint32_t tok[400];
  make_tokens(tok, 400, 37);
  kvdb_put_info pi, rp;
  t_put_kv(db, &M, tok, 400, &pi);
  t_put_kv(ref, &M, tok, 400, &rp);
  kvdb_decode_opts o;
  kvdb_decode_opts_init(&o);
  o.recent_tokens = 8;
  o.hot_tokens = 32;
  o.fetch_device = KVDB_SCORE_CPU;
  o.cold_share_permille = 1000; /* without the flag: refused */
  kvdb_decode *s;
  ASSERT_STATUS(KVDB_INVALID, kvdb_decode_open(db, &M, &pi.context, 1, &o, &s));
  ASSERT_MSG_HAS("cold_share_permille");
  o.flags = KVDB_DECODE_PAGE_GROUPS;
  o.cold_share_permille = 1001;
  ASSERT_STATUS(KVDB_INVALID, kvdb_decode_open(db, &M, &pi.context, 1, &o, &s));
  o.cold_share_permille = 1000; /* 12 rows: a group whose cold rows fit */
  ASSERT_OK(kvdb_decode_open(db, &M, &pi.context, 1, &o, &s));
  float q[NQ * 32];
  uint32_t pos[2 * 2 * K];
  uint64_t selects = 0;
  for (int step = 0; step < 8; step++) {
    make_query(q, 700 + (uint64_t)(step / 2));
    for (uint32_t l = 0; l < M.n_layers; l++) {
      uint32_t *p = pos + l * 2 * K;
      ASSERT_OK(kvdb_decode_select(s, 0, l, q, KVDB_F32, NQ, K, p, NULL));
      selects++;
      for (uint32_t h = 0; h < 2; h++) {
        uint32_t ex[4 * K];
        kvdb_score_req r = {l, h, q + h * 2 * 32, 2, 4 * K, ex, NULL};
        ASSERT_OK(kvdb_score_batch(ref, &M, &rp.context, KVDB_F32, &r, 1, NULL, NULL));
        const uint32_t *ph = p + h * K;
        for (uint32_t i = 0; i < K; i++) {
          for (uint32_t j = 0; j < i; j++)
            ASSERT(ph[i] != ph[j]); /* distinct */
          int ok = 0; /* a pick, in the group of a pick, or ranked in the top 4k */
          for (uint32_t e = 0; e < K; e++)
            ok |= ex[e] == ph[i] || ex[e] / 16 == ph[i] / 16;
          for (uint32_t e = K; e < 4 * K; e++)
            ok |= ex[e] == ph[i];
          ASSERT(ok);
        }
      }
    }
    check_fetch(s, 0, tok, pos);
  }
  kvdb_decode_stats st;
  ASSERT_OK(kvdb_decode_stat(s, &st));
  ASSERT_EQ(st.top_k, selects * 2 * K);
  ASSERT(st.top_k_returned > 0 && st.top_k_returned <= st.top_k);
  ASSERT(st.hot_hits > 0 && st.cold_reads > 0);
  kvdb_decode_close(s);
  kvdb_close(db);
  kvdb_close(ref);
  t_rmdir(dir);
  t_rmdir(rdir);
}

static void test_bad_input(void)
{
  char *dir = t_tmpdir("decode-bad");
  kvdb *db;
  ASSERT_OK(kvdb_open(dir, NULL, &db));
  uint32_t tok[60];
  make_tokens(tok, 60, 9);
  kvdb_put_info pi;
  t_put_kv(db, &M, tok, 60, &pi);
  kvdb_decode *s;
  ASSERT_STATUS(KVDB_INVALID, kvdb_decode_open(db, &M, NULL, 1, NULL, &s));
  ASSERT_MSG_HAS("contexts is NULL");
  ASSERT(s == NULL);
  kvdb_decode_opts o;
  kvdb_decode_opts_init(&o);
  o.hot_tokens = (1u << 24) + 1;
  ASSERT_STATUS(KVDB_INVALID, kvdb_decode_open(db, &M, &pi.context, 1, &o, &s));
  ASSERT_MSG_HAS("hot_tokens");
  kvdb_decode_opts_init(&o);
  o.host_share_permille = 1001;
  ASSERT_STATUS(KVDB_INVALID, kvdb_decode_open(db, &M, &pi.context, 1, &o, &s));
  ASSERT_MSG_HAS("host_share_permille");
  kvdb_decode_opts_init(&o);
  o.flags = 1u << 2; /* (bit 1 is KVDB_DECODE_PROMOTE_PICKS) */
  ASSERT_STATUS(KVDB_INVALID, kvdb_decode_open(db, &M, &pi.context, 1, &o, &s));
  ASSERT_MSG_HAS("opts->flags");
  kvdb_decode_opts_init(&o);
  o.fetch_device = 7;
  ASSERT_STATUS(KVDB_INVALID, kvdb_decode_open(db, &M, &pi.context, 1, &o, &s));
  ASSERT_MSG_HAS("opts->fetch_device");
  kvdb_model other = M;
  other.n_kv_heads = 4;
  ASSERT_STATUS(KVDB_MISMATCH, kvdb_decode_open(db, &other, &pi.context, 1, NULL, &s));
  ASSERT_OK(kvdb_decode_open(db, &M, &pi.context, 1, NULL, &s));
  float q[NQ * 32];
  make_query(q, 1);
  uint32_t pos[2 * 61];
  ASSERT_STATUS(KVDB_INVALID, kvdb_decode_select(s, 0, 2, q, KVDB_F32, NQ, K, pos, NULL));
  ASSERT_MSG_HAS("layer 2 out of range");
  ASSERT_STATUS(KVDB_INVALID, kvdb_decode_select(s, 0, 0, q, KVDB_F32, 3, K, pos, NULL));
  ASSERT_MSG_HAS("n_q_heads 3");
  ASSERT_STATUS(KVDB_INVALID, kvdb_decode_select(s, 0, 0, q, KVDB_F32, NQ, 61, pos, NULL));
  ASSERT_MSG_HAS("k 61 out of range");
  ASSERT_STATUS(KVDB_INVALID, kvdb_decode_select(s, 0, 0, q, KVDB_F32, NQ, 0, pos, NULL));
  ASSERT_MSG_HAS("k 0");
  ASSERT_STATUS(KVDB_INVALID, kvdb_decode_select(s, 1, 0, q, KVDB_F32, NQ, K, pos, NULL));
  ASSERT_MSG_HAS("ctx 1 out of range");
  q[5] = NAN;
  ASSERT_STATUS(KVDB_INVALID, kvdb_decode_select(s, 0, 0, q, KVDB_F32, NQ, K, pos, NULL));
  q[5] = 0;
  ASSERT_OK(kvdb_decode_select(s, 0, 0, q, KVDB_F32, NQ, K, pos, NULL));
  pos[3] = 60;
  uint16_t buf[2 * K * 2 * 32];
  kvdb_kv_view v;
  ASSERT_OK(kvdb_kv_view_packed(&v, buf, &M, K, KVDB_LAYOUT_LKTHD));
  ASSERT_STATUS(KVDB_INVALID, kvdb_decode_fetch(s, 0, 0, pos, K, &v));
  ASSERT_MSG_HAS("positions[3] = 60 is past");
  ASSERT_STATUS(KVDB_INVALID, kvdb_decode_fetch(s, 0, 0, pos, K, NULL));
  ASSERT_MSG_HAS("out is NULL");
  ASSERT_STATUS(KVDB_INVALID, kvdb_decode_stat(s, NULL));
  kvdb_decode_close(s);
  kvdb_decode_close(NULL);
  kvdb_model m0 = M;
  m0.id = "decode-none";
  m0.score_bits = 0;
  ASSERT_STATUS(KVDB_UNSUPPORTED, kvdb_decode_open(db, &m0, &pi.context, 1, NULL, &s));
  ASSERT_MSG_HAS("score_bits 0");
  kvdb_close(db);
  t_rmdir(dir);
}

/* BKP's work after a fetch runs on the session's worker: a stat right after the fetches sees
 * every promotion (it waits), a second fetch of a layer waits for the first one's work, and a
 * close with work still queued finishes it and ends the worker (ASan/TSan: no leak, no race). */
static void test_background_bkp(void)
{
  char *dir = t_tmpdir("decode-bg");
  kvdb *db;
  ASSERT_OK(kvdb_open(dir, NULL, &db));
  uint32_t tok[250];
  make_tokens(tok, 250, 5);
  kvdb_put_info pi;
  t_put_kv(db, &M, tok, 250, &pi);
  kvdb_decode_opts o;
  kvdb_decode_opts_init(&o);
  o.recent_tokens = 8;
  o.hot_tokens = 64;
  float q[NQ * 32];
  make_query(q, 23);
  uint32_t pos[2 * 2 * K];
  for (int rep = 0; rep < 20; rep++) {
    kvdb_decode *s;
    ASSERT_OK(kvdb_decode_open(db, &M, &pi.context, 1, &o, &s));
    for (uint32_t l = 0; l < M.n_layers; l++)
      ASSERT_OK(kvdb_decode_select(s, 0, l, q, KVDB_F32, NQ, K, pos + l * 2 * K, NULL));
    check_fetch(s, 0, tok, pos);
    if (rep % 2 == 0) {
      kvdb_decode_stats st;
      ASSERT_OK(kvdb_decode_stat(s, &st));
      ASSERT(st.cold_reads > 0);
      ASSERT_EQ(st.promoted, st.cold_reads); /* all of it done before stat returned */
      check_fetch(s, 0, tok, pos);             /* fetch again: now every row is hot */
      kvdb_decode_stats st2;
      ASSERT_OK(kvdb_decode_stat(s, &st2));
      ASSERT_EQ(st2.cold_reads, st.cold_reads);
      ASSERT_EQ(st2.hot_hits, st.hot_hits + 2 * K * M.n_layers);
    }
    kvdb_decode_close(s); /* odd reps: the promotions may still be queued */
  }
  kvdb_close(db);
  t_rmdir(dir);
}

int main(void)
{
  test_select_fetch();
  test_background_bkp();
  test_two_contexts_device();
  test_page_groups();
  test_cold_budget();
  test_bad_input();
  printf("test_decode: ok\n");
  return 0;
}
