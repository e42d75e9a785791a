/* SPDX-License-Identifier: MIT */
/*
 * bench/bench_policy_bound.c — `kvdb-bench policy` part 6: the greedy placement against the LP
 * upper bound over the alpha sweep, and the time to place 100,000 contexts.
 */
#define _GNU_SOURCE
#include "bench_policy.h"

int pb_greedy_vs_bound(const trace *tr, const model *md, double alpha, bound_row *row)
{
  kv_policy_context *pc = calloc(tr->n, sizeof *pc);
  if (pc == NULL)
    return -1;
  kv_policy_params p = md->p;
  p.alpha = alpha;
  row->alpha = alpha;
  row->none = 0;
  for (uint32_t i = 0; i < tr->n; i++) {
    pc[i].options = tr->c[i].opt;
    pc[i].n_options = NCFG;
    pc[i].raw_bytes = tr->c[i].raw;
    pc[i].n_tokens = tr->c[i].ptok;
    pc[i].frequency = tr->f_end[i];
    pc[i].current = kv_policy_place_none();
    row->none += kv_policy_utility(&p, &pc[i], kv_policy_place_none());
  }
  kv_policy_err err;
  kvdb_status st = kv_policy_upper_bound(&p, pc, tr->n, &row->ub, NULL, &err);
  if (st != KVDB_OK) {
    free(pc);
    return pfail("kv_policy_upper_bound", st, &err);
  }
  for (int r = 0; r < OPT_RULES; r++) {
    p.rule = (kv_policy_rule)r;
    kv_policy_plan plan;
    if ((st = kv_policy_rebalance(&p, pc, tr->n, &plan, &err)) != KVDB_OK) {
      free(pc);
      return pfail("kv_policy_rebalance", st, &err);
    }
    row->g[r] = plan.utility_after;
    row->ratio[r] = row->ub > row->none ? (plan.utility_after - row->none) / (row->ub - row->none)
                                        : 1.0;
    row->plain[r] = row->ub > 0 && plan.utility_after > 0 ? plan.utility_after / row->ub : NAN;
    kv_policy_plan_free(&plan);
  }
  free(pc);
  return 0;
}

int pb_place_100k(const bench_env *env, const trace *tr, const tiers_m *tm, int decoded,
                  big_m *out)
{
  const uint32_t n = PB_BIG_N;
  int runs = env->quick ? PB_BIG_RUNS_QUICK : PB_BIG_RUNS_FULL, rc = -1;
  kv_policy_ws *ws = NULL;
  kv_policy_option *o = malloc((size_t)n * NCFG * sizeof *o);
  kv_policy_context *pc = calloc(n, sizeof *pc);
  double *zipf = malloc(n * sizeof *zipf);
  uint32_t *perm = malloc(n * sizeof *perm);
  if (!o || !pc || !zipf || !perm) {
    bench_log("out of memory (100k contexts)");
    goto out;
  }
  uint64_t s = env->seed ^ 0x100000ull, total = 0;
  for (uint32_t j = 0; j < n; j++)
    perm[j] = j;
  for (uint32_t j = n; j > 1; j--) {
    uint32_t k = (uint32_t)(rng_next(&s) % j);
    uint32_t x = perm[j - 1];
    perm[j - 1] = perm[k];
    perm[k] = x;
  }
  for (uint32_t j = 0; j < n; j++) {
    const tctx *b = &tr->c[j % tr->n];
    const dataset *ds = &PB_DATASETS[b->dataset];
    double sig = sqrt(log(1 + 0.25)), med = ds->mean_tokens / sqrt(1.25);
    double tok = med * exp(sig * rng_normal(&s));
    tok = tok < 256 ? 256 : tok > 131072 ? 131072 : tok;
    uint64_t tokens = (uint64_t)tok, raw = tokens * PB_TOKEN_BYTES;
    for (uint32_t k = 0; k < NCFG; k++) {
      kv_policy_option *x = &o[(size_t)j * NCFG + k];
      *x = b->opt[k];
      x->bytes = (uint64_t)((double)b->opt[k].bytes * ((double)raw / (double)b->raw));
      x->decoded_bytes =
          (uint64_t)((double)b->opt[k].decoded_bytes * ((double)raw / (double)b->raw));
      if (x->bytes == 0)
        x->bytes = 1;
    }
    pc[j].options = &o[(size_t)j * NCFG];
    pc[j].n_options = NCFG;
    pc[j].raw_bytes = raw;
    pc[j].n_tokens = tokens;
    pc[j].frequency = 100.0 * pow((double)(perm[j] + 1), -PB_ZIPF);
    pc[j].current = kv_policy_place_none();
    total += raw;
  }
  kv_policy_tier t3[3] = {
    {"dram", (uint64_t)((double)total * PB_DRAM_FRAC), tm->dram_bps, tm->dram_lat_s,
     KV_POLICY_TIER_INCLUSIVE | (decoded ? (uint32_t)KV_POLICY_TIER_DECODED : 0u)},
    {"ssd", (uint64_t)((double)total * 0.20), tm->ssd_bps, tm->ssd_lat_s, 0},
    {"smartssd", (uint64_t)((double)total * 0.20), tm->ssd_bps, tm->ssd_lat_s, 0},
  };
  kv_policy_params p;
  kv_policy_params_init(&p);
  p.tiers = t3;
  p.n_tiers = 3;
  p.alpha = 1.0;
  p.prefill_tokens_per_s = PB_PREFILL_TPS;
  out->n_options = (size_t)n * NCFG;
  ws = kv_policy_ws_create();
  if (ws == NULL)
    goto out;
  for (int r = 0; r < OPT_RULES; r++) {
    p.rule = (kv_policy_rule)r;
    double ms[PB_BIG_RUNS_FULL], ms2[PB_BIG_RUNS_FULL];
    for (int k = 0; k < runs; k++) { /* without a workspace */
      kv_policy_plan plan;
      kv_policy_err err;
      uint64_t t0 = bench_now_ns();
      kvdb_status st = kv_policy_rebalance(&p, pc, n, &plan, &err);
      ms2[k] = (double)(bench_now_ns() - t0) * 1e-6;
      kv_policy_plan_free(&plan);
      if (st != KVDB_OK) {
        pfail("kv_policy_rebalance (100k)", st, &err);
        goto out;
      }
    }
    out->ms_nows[r] = median(ms2, (size_t)runs);
    { /* the workspace's first call grows it: untimed */
      kv_policy_plan plan;
      kv_policy_err err;
      kvdb_status st = kv_policy_rebalance_ws(ws, &p, pc, n, &plan, &err);
      kv_policy_plan_free(&plan);
      if (st != KVDB_OK) {
        pfail("kv_policy_rebalance_ws (100k)", st, &err);
        goto out;
      }
    }
    for (int k = 0; k < runs; k++) {
      kv_policy_plan plan;
      kv_policy_err err;
      uint64_t t0 = bench_now_ns();
      kvdb_status st = kv_policy_rebalance_ws(ws, &p, pc, n, &plan, &err);
      ms[k] = (double)(bench_now_ns() - t0) * 1e-6;
      if (st != KVDB_OK) {
        pfail("kv_policy_rebalance (100k)", st, &err);
        goto out;
      }
      if (plan.used_after[0] > t3[0].capacity_bytes || plan.used_after[1] > t3[1].capacity_bytes ||
          plan.used_after[2] > t3[2].capacity_bytes) {
        bench_log("the 100k placement exceeds a tier");
        kv_policy_plan_free(&plan);
        goto out;
      }
      out->ops[r] = plan.n_recompress + plan.n_evict;
      if (r == PB_HEAD && k == runs - 1) /* the placed store, for the admit timing below */
        for (uint32_t j = 0; j < n; j++)
          pc[j].current = plan.place[j];
      kv_policy_plan_free(&plan);
    }
    double mn = ms[0], mx = ms[0];
    for (int k = 1; k < runs; k++) {
      mn = ms[k] < mn ? ms[k] : mn;
      mx = ms[k] > mx ? ms[k] : mx;
    }
    out->ms_min[r] = mn;
    out->ms_max[r] = mx;
    out->ms[r] = median(ms, (size_t)runs);
  }
  /* one put into that store (the default rule): the hottest context arrives again */
  p.rule = PB_HEAD;
  size_t in = 0;
  for (uint32_t j = 0; j < n; j++)
    if (perm[j] == 0)
      in = j;
  pc[in].current = kv_policy_place_none();
  double ms[PB_BIG_RUNS_FULL];
  for (int k = 0; k < runs; k++) {
    kv_policy_plan plan;
    kv_policy_err err;
    uint64_t t0 = bench_now_ns();
    kvdb_status st = kv_policy_admit_ws(ws, &p, pc, n, &in, 1, &plan, &err);
    ms[k] = (double)(bench_now_ns() - t0) * 1e-6;
    if (st != KVDB_OK) {
      pfail("kv_policy_admit_ws (100k)", st, &err);
      goto out;
    }
    kv_policy_plan_free(&plan);
  }
  out->admit_ms = median(ms, (size_t)runs);
  rc = 0;
out:
  kv_policy_ws_free(ws);
  free(o);
  free(pc);
  free(zipf);
  free(perm);
  return rc;
}
