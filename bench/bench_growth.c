/* SPDX-License-Identifier: MIT */
/*
 * bench/bench_growth.c — kvdb-bench growth: how put, lookup, compact, verify and the catalog's
 * size grow with the number of stored blocks (10k to 1M; --quick: 10k to 100k), as ratios to
 * the first point, and what repeated delete-and-compact cycles do to the catalog's size.
 *
 * The model is tiny on purpose (1 layer, 1 KV head, head_dim 8, f16, 16-token blocks: 512
 * bytes of K/V per block, one 4 KiB page per block object), so that a million blocks (4 GiB of
 * segments) fit a small machine in minutes: the figures are the engine's per-block costs
 * (catalog, hashing, one page of I/O), not bandwidth. Each context is 4 blocks of its own
 * tokens (nothing shared). Segments are 1 MiB (256 blocks), sync_mode NONE, buffered I/O (the page
 * cache, not O_DIRECT: a 4 KiB O_DIRECT write costs the disk's latency, ~1 ms on a loaded VM),
 * no DRAM tier.
 *
 * At each point N (the store is filled up to N blocks, continuing from the last point):
 *   put      mean µs per context over the last 2,000 puts of the fill
 *   lookup   p50 / p99 µs of kvdb_lookup of 2,000 random stored contexts
 *   compact  a probe: 1,024 new contexts (16 segments), every other one deleted, then
 *            kvdb_compact(0.75) — seconds, and µs per block moved (the probe's 2,048 live
 *            blocks; the surviving half stays stored)
 *   verify   kvdb_verify of everything: seconds, µs per block
 *   catalog  catalog.mdb bytes per stored block
 * After the last point, 3 rounds of: delete a random half of the contexts, kvdb_compact(0.5)
 * (the catalog's bytes per live block now, as a ratio to the fresh fill's: cycleK_catalog_vs_
 * fresh), put new contexts back up to N blocks (the same ratio: cycleK_refilled_vs_fresh).
 */
#define _GNU_SOURCE
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "bench.h"
#include "kvdb.h"

#define G_BT 16u     /* tokens per block */
#define G_NB 4u      /* blocks per context */
#define G_NT (G_BT * G_NB)
#define G_SAMPLES 2000
#define G_PROBE 1024 /* contexts of the compaction probe */

static const kvdb_model GM = {"growth-tiny", 1, 1, 8, KVDB_F16, G_BT};

typedef struct gstate {
  kvdb *db;
  const char *dir;
  uint8_t *live;      /* live[i]: context i is stored */
  uint64_t n_ctx;     /* contexts ever put (ids 0 .. n_ctx-1) */
  uint64_t cap;
  uint64_t n_live;
  uint16_t kv[G_NT * 16]; /* one context's K/V (contents do not matter) */
  uint64_t seed;
} gstate;

static uint64_t g_mix(uint64_t x)
{
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

static void ctx_tokens(const gstate *g, uint64_t id, uint32_t *tok)
{
  for (uint32_t k = 0; k < G_NT; k++)
    tok[k] = (uint32_t)(g_mix(g->seed * 0x100000001b3ull + id * G_NT + k) % 32000u);
}

static int put_ctx(gstate *g, uint64_t id)
{
  uint32_t tok[G_NT];
  ctx_tokens(g, id, tok);
  kvdb_kv_view v;
  kvdb_kv_view_packed(&v, g->kv, &GM, G_NT, KVDB_LAYOUT_LKTHD);
  kvdb_status rc = kvdb_put(g->db, &GM, tok, G_NT, &v, NULL);
  if (rc != KVDB_OK) {
    bench_log("growth: put of context %" PRIu64 ": %s: %s", id, kvdb_status_name(rc),
              kvdb_errmsg());
    return -1;
  }
  if (id >= g->cap) {
    uint64_t nc = g->cap ? g->cap * 2 : 1 << 16;
    while (nc <= id)
      nc *= 2;
    uint8_t *nl = realloc(g->live, nc);
    if (nl == NULL)
      return -1;
    memset(nl + g->cap, 0, nc - g->cap);
    g->live = nl;
    g->cap = nc;
  }
  g->live[id] = 1;
  g->n_live++;
  return 0;
}

static int del_ctx(gstate *g, uint64_t id)
{
  uint32_t tok[G_NT];
  ctx_tokens(g, id, tok);
  kvdb_key h[G_NB];
  kvdb_status rc = kvdb_chain_hashes(&GM, tok, G_NT, h, G_NB);
  if (rc == KVDB_OK)
    rc = kvdb_delete(g->db, &h[G_NB - 1]);
  if (rc != KVDB_OK) {
    bench_log("growth: delete of context %" PRIu64 ": %s: %s", id, kvdb_status_name(rc),
              kvdb_errmsg());
    return -1;
  }
  g->live[id] = 0;
  g->n_live--;
  return 0;
}

static uint64_t catalog_bytes(const gstate *g)
{
  char p[4200];
  struct stat st;
  snprintf(p, sizeof p, "%s/catalog.mdb", g->dir);
  return stat(p, &st) == 0 ? (uint64_t)st.st_size : 0;
}

/* put new contexts until `blocks` blocks are live; the last `timed` puts are timed */
static int fill_to(gstate *g, uint64_t blocks, size_t timed, double *mean_us)
{
  uint64_t want = blocks / G_NB;
  bench_samples s = {0};
  uint64_t t_last = bench_now_ns();
  while (g->n_live < want) {
    uint64_t t0 = bench_now_ns();
    if (put_ctx(g, g->n_ctx++) != 0)
      return -1;
    if (want - g->n_live < timed)
      bench_samples_push(&s, bench_now_ns() - t0);
    if (bench_now_ns() - t_last > 5000000000ull) {
      t_last = bench_now_ns();
      bench_log("growth: %" PRIu64 " of %" PRIu64 " blocks", g->n_live * G_NB, blocks);
    }
  }
  if (mean_us != NULL)
    *mean_us = bench_samples_mean(&s) / 1e3;
  bench_samples_free(&s);
  return 0;
}

static uint64_t pick_live(gstate *g, uint64_t *rnd)
{
  for (;;) {
    *rnd = g_mix(*rnd);
    uint64_t id = *rnd % g->n_ctx;
    if (g->live[id])
      return id;
  }
}

typedef struct gpoint {
  uint64_t blocks;
  double put_us, look_p50, look_p99, compact_s, compact_us_blk, verify_s, verify_us_blk;
  double cat_b_blk;
} gpoint;

static int measure(gstate *g, gpoint *pt)
{
  uint64_t rnd = g->seed ^ pt->blocks;
  bench_samples s = {0};
  for (int i = 0; i < G_SAMPLES; i++) {
    uint32_t tok[G_NT];
    ctx_tokens(g, pick_live(g, &rnd), tok);
    size_t hit = 0;
    uint64_t t0 = bench_now_ns();
    kvdb_status rc = kvdb_lookup(g->db, &GM, tok, G_NT, &hit);
    bench_samples_push(&s, bench_now_ns() - t0);
    if (rc != KVDB_OK || hit != G_NT) {
      bench_log("growth: lookup: %s, hit %zu of %u", kvdb_status_name(rc), hit, G_NT);
      bench_samples_free(&s);
      return -1;
    }
  }
  pt->look_p50 = (double)bench_samples_pct(&s, 50) / 1e3;
  pt->look_p99 = (double)bench_samples_pct(&s, 99) / 1e3;
  bench_samples_free(&s);
  pt->cat_b_blk = (double)catalog_bytes(g) / (double)(g->n_live * G_NB);
  /* compaction probe: fresh segments, half dead */
  uint64_t first = g->n_ctx;
  for (int i = 0; i < G_PROBE; i++)
    if (put_ctx(g, g->n_ctx++) != 0)
      return -1;
  for (int i = 0; i < G_PROBE; i += 2)
    if (del_ctx(g, first + (uint64_t)i) != 0)
      return -1;
  kvdb_compact_report cr;
  uint64_t t0 = bench_now_ns();
  kvdb_status rc = kvdb_compact(g->db, 0.75, NULL, NULL, &cr);
  pt->compact_s = (double)(bench_now_ns() - t0) / 1e9;
  if (rc != KVDB_OK) {
    bench_log("growth: compact: %s: %s", kvdb_status_name(rc), kvdb_errmsg());
    return -1;
  }
  pt->compact_us_blk = cr.blocks_moved ? pt->compact_s * 1e6 / (double)cr.blocks_moved : 0;
  kvdb_verify_report vr;
  t0 = bench_now_ns();
  rc = kvdb_verify(g->db, NULL, NULL, NULL, &vr);
  pt->verify_s = (double)(bench_now_ns() - t0) / 1e9;
  if (rc != KVDB_OK) {
    bench_log("growth: verify: %s: %s", kvdb_status_name(rc), kvdb_errmsg());
    return -1;
  }
  pt->verify_us_blk = pt->verify_s * 1e6 / (double)(vr.blocks_checked ? vr.blocks_checked : 1);
  return 0;
}

int bench_growth(const bench_env *env, bench_json *j)
{
  static const uint64_t full_pts[] = {10000, 100000, 1000000};
  static const uint64_t quick_pts[] = {10000, 30000, 100000};
  const uint64_t *pts = env->quick ? quick_pts : full_pts;
  const int n_pts = 3, cycles = 3;
  gstate *g = calloc(1, sizeof *g);
  if (g == NULL)
    return 1;
  g->dir = env->dir;
  g->seed = env->seed;
  for (size_t i = 0; i < sizeof g->kv / sizeof g->kv[0]; i++)
    g->kv[i] = (uint16_t)(0x3c00 + (i % 251));
  kvdb_options o;
  kvdb_options_init(&o);
  o.sync_mode = KVDB_SYNC_NONE;
  o.dram_bytes = 0;
  o.segment_bytes = 1 << 20;
  o.use_direct_io = 0; /* the page cache: per-block engine costs, not the disk's latency */
  kvdb_status rc = kvdb_open(env->dir, &o, &g->db);
  if (rc != KVDB_OK) {
    bench_log("growth: open: %s", kvdb_errmsg());
    free(g);
    return 1;
  }
  fprintf(env->out, "model: 1 layer, 1 KV head, head_dim 8, f16, 16-token blocks (one 4 KiB page "
          "each); contexts of 4 blocks; 1 MiB segments; sync NONE; buffered I/O\n");
  fprintf(env->out, "%9s %9s %9s %9s %9s %11s %9s %11s %9s\n", "blocks", "put_us", "look_p50",
          "look_p99", "compact_s", "compact_us/b", "verify_s", "verify_us/b", "cat_B/blk");
  gpoint p[3];
  int ret = 0;
  for (int i = 0; i < n_pts && ret == 0; i++) {
    memset(&p[i], 0, sizeof p[i]);
    p[i].blocks = pts[i];
    if (fill_to(g, pts[i], G_SAMPLES, &p[i].put_us) != 0 || measure(g, &p[i]) != 0) {
      ret = 1;
      break;
    }
    fprintf(env->out, "%9" PRIu64 " %9.1f %9.1f %9.1f %9.3f %11.1f %9.2f %11.2f %9.0f\n",
            p[i].blocks, p[i].put_us, p[i].look_p50, p[i].look_p99, p[i].compact_s,
            p[i].compact_us_blk, p[i].verify_s, p[i].verify_us_blk, p[i].cat_b_blk);
    fflush(env->out);
  }
  double cyc[3] = {0}, refill[3] = {0};
  double fresh = 0;
  if (ret == 0) {
    fprintf(env->out, "ratios to %" PRIu64 " blocks (x%.0f blocks):\n", pts[0],
            (double)pts[n_pts - 1] / (double)pts[0]);
    for (int i = 1; i < n_pts; i++)
      fprintf(env->out, "  %7" PRIu64 ": put %.2f, lookup p50 %.2f p99 %.2f, compact/block %.2f, "
              "verify/block %.2f, catalog/block %.2f\n", p[i].blocks,
              bench_ratio(p[i].put_us, p[0].put_us), bench_ratio(p[i].look_p50, p[0].look_p50),
              bench_ratio(p[i].look_p99, p[0].look_p99),
              bench_ratio(p[i].compact_us_blk, p[0].compact_us_blk),
              bench_ratio(p[i].verify_us_blk, p[0].verify_us_blk),
              bench_ratio(p[i].cat_b_blk, p[0].cat_b_blk));
    /* delete-and-compact cycles at the last point */
    uint64_t n = pts[n_pts - 1];
    fresh = p[n_pts - 1].cat_b_blk;
    uint64_t rnd = g->seed * 7 + 1;
    for (int c = 0; c < cycles && ret == 0; c++) {
      uint64_t target = g->n_live / 2;
      while (g->n_live > target && ret == 0)
        ret = del_ctx(g, pick_live(g, &rnd));
      kvdb_compact_report cr;
      if (ret == 0 && (rc = kvdb_compact(g->db, 0.5, NULL, NULL, &cr)) != KVDB_OK) {
        bench_log("growth: compact: %s: %s", kvdb_status_name(rc), kvdb_errmsg());
        ret = 1;
      }
      cyc[c] = (double)catalog_bytes(g) / (double)(g->n_live * G_NB);
      if (ret == 0)
        ret = fill_to(g, n, 0, NULL);
      refill[c] = (double)catalog_bytes(g) / (double)(g->n_live * G_NB);
      if (ret == 0)
        fprintf(env->out, "cycle %d: delete half, compact: catalog %.0f B per live block, %.2fx "
                "the fresh fill; refilled to %" PRIu64 " blocks: %.0f B/block, %.2fx\n", c + 1,
                cyc[c], cyc[c] / fresh, n, refill[c], refill[c] / fresh);
    }
  }
  if (ret == 0) {
    char key[64];
    for (int i = 0; i < n_pts; i++) {
      snprintf(key, sizeof key, "blocks_%d", i);
      bench_json_int(j, key, (int64_t)p[i].blocks);
#define GJ(name, v)                                                                               \
  do {                                                                                            \
    snprintf(key, sizeof key, "%s_%" PRIu64, name, p[i].blocks);                                  \
    bench_json_num(j, key, v);                                                                    \
  } while (0)
      GJ("put_us", p[i].put_us);
      GJ("lookup_p50_us", p[i].look_p50);
      GJ("lookup_p99_us", p[i].look_p99);
      GJ("compact_s", p[i].compact_s);
      GJ("compact_us_per_block", p[i].compact_us_blk);
      GJ("verify_s", p[i].verify_s);
      GJ("verify_us_per_block", p[i].verify_us_blk);
      GJ("catalog_bytes_per_block", p[i].cat_b_blk);
#undef GJ
    }
    int l = n_pts - 1;
    bench_json_num(j, "put_ratio", bench_ratio(p[l].put_us, p[0].put_us));
    bench_json_num(j, "lookup_p99_ratio", bench_ratio(p[l].look_p99, p[0].look_p99));
    bench_json_num(j, "compact_per_block_ratio", bench_ratio(p[l].compact_us_blk, p[0].compact_us_blk));
    bench_json_num(j, "verify_per_block_ratio", bench_ratio(p[l].verify_us_blk, p[0].verify_us_blk));
    bench_json_num(j, "catalog_per_block_ratio", bench_ratio(p[l].cat_b_blk, p[0].cat_b_blk));
    for (int c = 0; c < cycles; c++) {
      snprintf(key, sizeof key, "cycle%d_catalog_vs_fresh", c + 1);
      bench_json_num(j, key, bench_ratio(cyc[c], fresh));
      snprintf(key, sizeof key, "cycle%d_refilled_vs_fresh", c + 1);
      bench_json_num(j, key, bench_ratio(refill[c], fresh));
    }
  }
  kvdb_close(g->db);
  free(g->live);
  free(g);
  return ret;
}
