/* SPDX-License-Identifier: MIT */
/*
 * bench/bench_background.c — `kvdb-bench background`: how the engine's background work grows
 * with the store (issue 13 D), through kvdb.h only.
 *
 * A database of small contexts (32 tokens of a 2-layer x 2-KV-head x head_dim 16 f16 model, 8
 * KiB of KV each, distinct tokens) with a SmartSSD tier is filled up to each of three sizes;
 * a third of each batch is moved to the SmartSSD tier (kvdb_relocate), so that both tiers hold
 * contexts. Filling runs with KVDB_SYNC_NONE (the figures below are not put's). At each size:
 *   stat      kvdb_stat, STAT_REPS calls: p50 and p99 in us. kvdb_stat reads counters the
 *             catalog keeps; the reference is a pass over every context (kvdb_iter): the
 *             order of what kvdb_stat cost when it counted the SmartSSD tier's contexts
 *   plan      kvdb_rebalance_plan (every context read and placed: linear by nature) in ms
 * Then, at the largest size, a rebalance with the SSD tier's capacity set RB_MOVES contexts
 * under what it holds (placement EvicPress, KVDB_SYNC_FULL: each relocation is synced, as in
 * service): the plan carried out with kvdb_rebalance_step, RB_STEP moves per step, timing
 * each step, with a kvdb_stat and a kvdb_get between steps (what serving does meanwhile).
 *
 * JSON: stat_us_p50_<n>, stat_us_p99_<n>, scan_ms_<n>, plan_ms_<n> per size n; stat_us_p99
 * (largest size), stat_growth (p50 largest / smallest); rebalance_moves, rebalance_steps,
 * rebalance_step_moves, rebalance_step_ms_p50 / _p99 / _max, rebalance_total_ms,
 * rebalance_plan_ms, stat_us_p99_during_rebalance, get_us_p99_during_rebalance.
 */
#define _GNU_SOURCE
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "kvdb.h"

#define BG_TOKENS 32u
#define STAT_REPS 400
#define RB_STEP 64u

static const kvdb_model BG_MODEL = {"bench-background", 2, 2, 16, KVDB_F16, 16, 0};

static void bg_tokens(uint32_t i, uint32_t *tok)
{
  for (uint32_t t = 0; t < BG_TOKENS; t++)
    tok[t] = i * BG_TOKENS + t + 1;
}

static int bg_key(uint32_t i, kvdb_key *key)
{
  uint32_t tok[BG_TOKENS];
  kvdb_key h[BG_TOKENS / 16];
  bg_tokens(i, tok);
  if (kvdb_chain_hashes(&BG_MODEL, tok, BG_TOKENS, h, BG_TOKENS / 16) != KVDB_OK)
    return -1;
  *key = h[BG_TOKENS / 16 - 1];
  return 0;
}

static kvdb_options bg_opts(int sync)
{
  kvdb_options o;
  kvdb_options_init(&o);
  o.dram_bytes = 0;
  o.smartssd_bytes = 1ull << 40; /* room for everything: no capacity of its own */
  o.sync_mode = sync ? KVDB_SYNC_FULL : KVDB_SYNC_NONE;
  o.log_level = 0;
  return o;
}

/* Contexts [from, to): put, every third moved to the SmartSSD tier. */
static int fill(kvdb *db, const kvdb_kv_view *v, uint32_t from, uint32_t to)
{
  for (uint32_t i = from; i < to; i++) {
    uint32_t tok[BG_TOKENS];
    bg_tokens(i, tok);
    if (kvdb_put(db, &BG_MODEL, tok, BG_TOKENS, v, NULL) != KVDB_OK) {
      bench_log("background: put %u: %s", i, kvdb_errmsg());
      return -1;
    }
    kvdb_key k;
    if (i % 3 == 0 && (bg_key(i, &k) != 0 ||
                       kvdb_relocate(db, &BG_MODEL, &k, NULL, KVDB_TIER_SMARTSSD, NULL) != KVDB_OK)) {
      bench_log("background: relocate %u: %s", i, kvdb_errmsg());
      return -1;
    }
  }
  return 0;
}

static int stat_once(void *payload, size_t i)
{
  (void)i;
  kvdb_stats st;
  return kvdb_stat(payload, &st) == KVDB_OK ? 0 : -1;
}

/* A pass over every context (the reference for a counting kvdb_stat). */
static int scan_all(kvdb *db, uint64_t *n)
{
  kvdb_iter *it;
  *n = 0;
  if (kvdb_iter_open(db, &it) != KVDB_OK)
    return -1;
  kvdb_context_info ci;
  kvdb_status rc;
  while ((rc = kvdb_iter_next(it, &ci)) == KVDB_OK)
    (*n)++;
  kvdb_iter_close(it);
  return rc == KVDB_NOTFOUND ? 0 : -1;
}

int bench_background(const bench_env *env, bench_json *j)
{
  FILE *o = env->out;
  const uint32_t sizes_full[3] = {1000, 4000, 16000}, sizes_quick[3] = {500, 1000, 2000};
  const uint32_t *sizes = env->quick ? sizes_quick : sizes_full;
  const uint32_t rb_moves = env->quick ? 256 : 1024;
  char dir[4096];
  bench_path(dir, sizeof dir, env->dir, "background");
  size_t tb = kvdb_model_token_bytes(&BG_MODEL);
  uint16_t *kv = malloc(BG_TOKENS * tb);
  kvdb *db = NULL;
  int rc = -1;
  double stat_p50[3] = {0}, stat_p99[3] = {0};
  kvdb_place_plan plan;
  memset(&plan, 0, sizeof plan);
  bench_samples ss = {0}, step = {0}, st_during = {0}, get_during = {0};
  if (kv == NULL)
    goto out;
  uint64_t rng = env->seed * 0x9E3779B97F4A7C15ull + 1;
  for (size_t i = 0; i < BG_TOKENS * tb / 2; i++) { /* f16 values in [1, 2) */
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    kv[i] = (uint16_t)(0x3c00 | (rng & 0x3ff));
  }
  kvdb_kv_view v;
  if (kvdb_kv_view_packed(&v, kv, &BG_MODEL, BG_TOKENS, KVDB_LAYOUT_LKTHD) != KVDB_OK)
    goto out;
  kvdb_options op = bg_opts(0);
  if (kvdb_open(dir, &op, &db) != KVDB_OK) {
    bench_log("background: open: %s", kvdb_errmsg());
    goto out;
  }
  fprintf(o, "\n## kvdb_stat and rebalance planning against the store's size: %u-token contexts "
             "(8 KiB of KV), a third on the SmartSSD tier\n", BG_TOKENS);
  fprintf(o, "  %9s %12s %12s %14s %12s\n", "contexts", "stat p50 us", "stat p99 us",
          "scan all ms", "plan ms");
  uint32_t have = 0;
  for (int s = 0; s < 3; s++) {
    bench_log("background: filling to %u contexts", sizes[s]);
    if (fill(db, &v, have, sizes[s]) != 0)
      goto out;
    have = sizes[s];
    bench_samples_free(&ss);
    memset(&ss, 0, sizeof ss);
    bench_fn_opts fo = {stat_once, db, STAT_REPS, STAT_REPS, 0};
    if (bench_fn_run(&fo, &ss) != 0) {
      bench_log("background: stat: %s", kvdb_errmsg());
      goto out;
    }
    stat_p50[s] = (double)bench_samples_pct(&ss, 50) / 1e3;
    stat_p99[s] = (double)bench_samples_pct(&ss, 99) / 1e3;
    uint64_t n = 0, t0 = bench_now_ns();
    if (scan_all(db, &n) != 0 || n != have) {
      bench_log("background: scan: %" PRIu64 " contexts of %u: %s", n, have, kvdb_errmsg());
      goto out;
    }
    double scan_ms = (double)(bench_now_ns() - t0) / 1e6;
    /* a plan needs placement settings: a handle with placement on records them at open */
    kvdb_close(db);
    db = NULL;
    op.placement = KVDB_PLACEMENT_EVICPRESS;
    op.ssd_bytes = 0;
    if (kvdb_open(dir, &op, &db) != KVDB_OK) {
      bench_log("background: open with placement: %s", kvdb_errmsg());
      goto out;
    }
    t0 = bench_now_ns();
    if (kvdb_rebalance_plan(db, &plan) != KVDB_OK) {
      bench_log("background: plan: %s", kvdb_errmsg());
      goto out;
    }
    double plan_ms = (double)(bench_now_ns() - t0) / 1e6;
    kvdb_place_plan_free(&plan);
    kvdb_close(db);
    db = NULL;
    op.placement = KVDB_PLACEMENT_OFF;
    if (kvdb_open(dir, &op, &db) != KVDB_OK)
      goto out;
    fprintf(o, "  %9u %12.1f %12.1f %14.1f %12.1f\n", have, stat_p50[s], stat_p99[s], scan_ms,
            plan_ms);
    char k[64];
    snprintf(k, sizeof k, "stat_us_p50_%u", have);
    bench_json_num(j, k, stat_p50[s]);
    snprintf(k, sizeof k, "stat_us_p99_%u", have);
    bench_json_num(j, k, stat_p99[s]);
    snprintf(k, sizeof k, "scan_ms_%u", have);
    bench_json_num(j, k, scan_ms);
    snprintf(k, sizeof k, "plan_ms_%u", have);
    bench_json_num(j, k, plan_ms);
  }
  bench_json_num(j, "stat_us_p99", stat_p99[2]);
  bench_json_num(j, "stat_growth", bench_ratio(stat_p50[2], stat_p50[0]));

  /* the rebalance: the SSD tier made rb_moves contexts too small, synced relocations */
  kvdb_stats st;
  if (kvdb_stat(db, &st) != KVDB_OK)
    goto out;
  uint64_t per_ctx = st.tier[KVDB_TIER_SSD].contexts > 0
                         ? st.tier[KVDB_TIER_SSD].bytes / st.tier[KVDB_TIER_SSD].contexts
                         : 0;
  kvdb_close(db);
  db = NULL;
  op = bg_opts(1);
  op.placement = KVDB_PLACEMENT_EVICPRESS;
  op.placement_slack_pct = 0;
  op.ssd_bytes = st.tier[KVDB_TIER_SSD].bytes - (uint64_t)rb_moves * per_ctx;
  if (kvdb_open(dir, &op, &db) != KVDB_OK) {
    bench_log("background: open for the rebalance: %s", kvdb_errmsg());
    goto out;
  }
  bench_log("background: rebalance of %u contexts (%u over the SSD tier)", have, rb_moves);
  uint64_t t0 = bench_now_ns();
  if (kvdb_rebalance_plan(db, &plan) != KVDB_OK) {
    bench_log("background: plan: %s", kvdb_errmsg());
    goto out;
  }
  double plan_ms = (double)(bench_now_ns() - t0) / 1e6;
  size_t next = 0, steps = 0;
  uint64_t moved = 0;
  uint32_t probe = 1; /* a context read between steps (on the SSD tier: not a multiple of 3) */
  uint32_t tok[BG_TOKENS];
  bg_tokens(probe, tok);
  uint16_t *out_kv = malloc(BG_TOKENS * tb);
  kvdb_kv_view ov;
  if (out_kv == NULL ||
      kvdb_kv_view_packed(&ov, out_kv, &BG_MODEL, BG_TOKENS, KVDB_LAYOUT_LKTHD) != KVDB_OK) {
    free(out_kv);
    goto out;
  }
  t0 = bench_now_ns();
  while (next < plan.n_moves) {
    kvdb_rebalance_report rep;
    uint64_t s0 = bench_now_ns();
    if (kvdb_rebalance_step(db, &plan, &next, RB_STEP, 0, &rep) != KVDB_OK) {
      bench_log("background: rebalance step: %s", kvdb_errmsg());
      free(out_kv);
      goto out;
    }
    bench_samples_push(&step, bench_now_ns() - s0);
    moved += rep.relocated + rep.deleted;
    steps++;
    s0 = bench_now_ns();
    if (kvdb_stat(db, &st) != KVDB_OK)
      break;
    bench_samples_push(&st_during, bench_now_ns() - s0);
    size_t hit = 0;
    s0 = bench_now_ns();
    if (kvdb_get(db, &BG_MODEL, tok, BG_TOKENS, &ov, &hit) != KVDB_OK)
      break;
    bench_samples_push(&get_during, bench_now_ns() - s0);
  }
  free(out_kv);
  double total_ms = (double)(bench_now_ns() - t0) / 1e6;
  double p50 = (double)bench_samples_pct(&step, 50) / 1e6,
         p99 = (double)bench_samples_pct(&step, 99) / 1e6,
         mx = (double)bench_samples_pct(&step, 100) / 1e6;
  double sd99 = (double)bench_samples_pct(&st_during, 99) / 1e3,
         gd99 = (double)bench_samples_pct(&get_during, 99) / 1e3;
  fprintf(o, "\n## a rebalance at %u contexts, the SSD tier %u contexts over its capacity; "
             "kvdb_rebalance_step of %u moves, relocations synced\n", have, rb_moves, RB_STEP);
  fprintf(o, "  plan %.1f ms; %zu moves (%" PRIu64 " made) in %zu steps, %.1f ms in all\n",
          plan_ms, plan.n_moves, moved, steps, total_ms);
  fprintf(o, "  step ms: p50 %.1f, p99 %.1f, max %.1f\n", p50, p99, mx);
  fprintf(o, "  between steps: kvdb_stat p99 %.1f us, kvdb_get p99 %.1f us\n", sd99, gd99);
  bench_json_int(j, "rebalance_contexts", have);
  bench_json_int(j, "rebalance_moves", (int64_t)plan.n_moves);
  bench_json_int(j, "rebalance_steps", (int64_t)steps);
  bench_json_int(j, "rebalance_step_moves", RB_STEP);
  bench_json_num(j, "rebalance_step_ms_p50", p50);
  bench_json_num(j, "rebalance_step_ms_p99", p99);
  bench_json_num(j, "rebalance_step_ms_max", mx);
  bench_json_num(j, "rebalance_total_ms", total_ms);
  bench_json_num(j, "rebalance_plan_ms", plan_ms);
  bench_json_num(j, "stat_us_p99_during_rebalance", sd99);
  bench_json_num(j, "get_us_p99_during_rebalance", gd99);
  rc = 0;
out:
  kvdb_place_plan_free(&plan);
  kvdb_close(db);
  bench_samples_free(&ss);
  bench_samples_free(&step);
  bench_samples_free(&st_during);
  bench_samples_free(&get_during);
  free(kv);
  if (!env->keep)
    bench_rmtree(dir);
  return rc;
}
