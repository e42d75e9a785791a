/* SPDX-License-Identifier: MIT */
/*
 * bench/bench_policy_oracle.c — `kvdb-bench policy` part 5c (issue 17): an oracle upper bound
 * for part 5b's comparison. On the same trace, contexts, profiles and policy model as the
 * baselines and the default rule, every context is placed knowing the trace's true request
 * counts (those of the measured requests, per drift phase on the drifting trace, where the
 * oracle re-places everything at each phase boundary for free):
 *
 *   - placed:  kv_policy_rebalance (the default rule) on those counts; the resulting static
 *              placement serves the phase's requests (mean TTFT and quality, as the simulation
 *              scores them). An achievable point: an oracle schedule exists that does this.
 *   - LP:      kv_policy_upper_bound on the same instance. For any placement of mean quality
 *              >= q, mean TTFT >= alpha q - UB(alpha) / F for every alpha >= 0 (U = sum f
 *              (alpha Q - TTFT), F = sum f), so max over the sweep's alphas is a lower bound on
 *              the TTFT of any per-phase static placement at quality q: the gain it implies is
 *              an upper bound on any placement rule's, given the true counts.
 *
 * The oracle places on the qualities as scored (the held-out probes' profiles), not on those
 * the rules decide on.
 *
 * Each context's first request of the whole trace is a miss for any online policy (there is
 * nothing stored to load): the oracle serves it by a prefill too (quality 1), and places on
 * the other requests' counts; U of those misses (alpha - prefill each) joins the LP's.
 *
 * Within a phase the requests are drawn i.i.d. (Zipf over a fixed order), so for any online
 * policy (LRU, LFU, S3-FIFO, ARC, the default rule) whose state before a request does not
 * depend on that request, the expected TTFT - alpha quality of the request is at least that of
 * the best static placement for the true probabilities: the oracle bounds every rule and every
 * baseline here in expectation (the measured counts stand for the probabilities).
 */
#define _GNU_SOURCE
#include "bench_policy.h"

/* Request counts of the measured requests in phase ph (of `phases`), into f[n], but for each
 * context's first request of the whole trace (first[i]): that one is a miss for every online
 * policy (nothing to load yet), counted in *nc with its prefill time in *pc. */
static void phase_counts(const trace *tr, const model *md, const size_t *first, int phases,
                         int ph, double *f, double *nc, double *pc)
{
  size_t len = tr->n_req / (size_t)phases;
  size_t lo = (size_t)ph * len, hi = ph == phases - 1 ? tr->n_req : lo + len;
  if (lo < tr->n_warm)
    lo = tr->n_warm;
  memset(f, 0, tr->n * sizeof *f);
  *nc = *pc = 0;
  for (size_t r = lo; r < hi; r++) {
    uint32_t i = tr->req[r];
    if (first[i] == r) {
      *nc += 1;
      *pc += md->prefill[i];
    } else {
      f[i] += 1;
    }
  }
}

int pb_oracle_init(pb_oracle *o, const trace *tr, const model *md, int phases)
{
  memset(o, 0, sizeof *o);
  o->tr = tr;
  o->md = md;
  o->phases = phases;
  o->f = calloc((size_t)phases * tr->n, sizeof *o->f);
  o->comp_n = calloc((size_t)phases, sizeof *o->comp_n);
  o->comp_s = calloc((size_t)phases, sizeof *o->comp_s);
  o->pc = calloc(tr->n, sizeof *o->pc);
  o->opt = malloc((size_t)tr->n * NCFG * sizeof *o->opt);
  o->ws = kv_policy_ws_create();
  size_t *first = malloc(tr->n * sizeof *first);
  if (o->f == NULL || o->comp_n == NULL || o->comp_s == NULL || o->pc == NULL ||
      o->opt == NULL || o->ws == NULL || first == NULL) {
    free(first);
    pb_oracle_free(o);
    bench_log("out of memory (oracle)");
    return -1;
  }
  for (uint32_t i = 0; i < tr->n; i++) { /* the oracle knows the qualities as scored */
    first[i] = SIZE_MAX;
    for (uint32_t k = 0; k < NCFG; k++) {
      o->opt[(size_t)i * NCFG + k] = tr->c[i].opt[k];
      o->opt[(size_t)i * NCFG + k].quality = tr->c[i].qs[k];
    }
  }
  for (size_t r = 0; r < tr->n_req; r++)
    if (first[tr->req[r]] == SIZE_MAX)
      first[tr->req[r]] = r;
  for (int ph = 0; ph < phases; ph++)
    phase_counts(tr, md, first, phases, ph, o->f + (size_t)ph * tr->n, &o->comp_n[ph],
                 &o->comp_s[ph]);
  free(first);
  return 0;
}

void pb_oracle_free(pb_oracle *o)
{
  free(o->f);
  free(o->comp_n);
  free(o->comp_s);
  free(o->pc);
  free(o->opt);
  kv_policy_ws_free(o->ws);
  memset(o, 0, sizeof *o);
}

int pb_oracle_run(pb_oracle *o, double alpha, int want_ub, result *res, double *ub_over_f)
{
  const trace *tr = o->tr;
  kv_policy_params p = o->md->p;
  p.alpha = alpha;
  p.rule = KV_POLICY_REFILL;
  double ft = 0, fq = 0, F = 0, ub = 0, dram = 0, ssd = 0, miss = 0;
  for (int ph = 0; ph < o->phases; ph++) {
    const double *f = o->f + (size_t)ph * tr->n;
    /* the first requests: misses for anyone (U of them: alpha x 1 - prefill each) */
    ft += o->comp_s[ph];
    fq += o->comp_n[ph];
    F += o->comp_n[ph];
    miss += o->comp_n[ph];
    ub += alpha * o->comp_n[ph] - o->comp_s[ph];
    size_t m = 0;
    for (uint32_t i = 0; i < tr->n; i++) {
      if (f[i] <= 0) /* not requested in this phase: not stored costs nothing */
        continue;
      kv_policy_context *c = &o->pc[m++];
      c->options = &o->opt[(size_t)i * NCFG];
      c->n_options = NCFG;
      c->raw_bytes = tr->c[i].raw;
      c->n_tokens = tr->c[i].ptok;
      c->frequency = f[i];
      c->current = kv_policy_place_none();
    }
    if (m == 0)
      continue;
    kv_policy_plan plan;
    kv_policy_err err;
    kvdb_status st = kv_policy_rebalance_ws(o->ws, &p, o->pc, m, &plan, &err);
    if (st != KVDB_OK)
      return pfail("kv_policy_rebalance (oracle)", st, &err);
    kv_policy_eval ev;
    st = kv_policy_evaluate(&p, o->pc, m, plan.place, &ev, &err);
    if (st == KVDB_OK && ev.over_capacity != 0) {
      bench_log("oracle: the default rule's plan is over a capacity (mask %u)",
                ev.over_capacity);
      st = KVDB_PANIC;
    }
    if (st == KVDB_OK) {
      for (size_t k = 0; k < m; k++) {
        const kv_policy_place *pl = &plan.place[k];
        double w = o->pc[k].frequency;
        if (pl->tier == KV_POLICY_NONE)
          miss += w;
        else if (pl->cached)
          dram += w;
        else
          ssd += w;
      }
    }
    kv_policy_plan_free(&plan);
    if (st != KVDB_OK)
      return pfail("kv_policy_evaluate (oracle)", st, &err);
    double fp = 0;
    for (size_t k = 0; k < m; k++)
      fp += o->pc[k].frequency;
    ft += ev.mean_ttft_s * fp;
    fq += ev.mean_quality * fp;
    F += fp;
    if (want_ub) {
      double b = 0;
      st = kv_policy_upper_bound(&p, o->pc, m, &b, NULL, &err);
      if (st != KVDB_OK)
        return pfail("kv_policy_upper_bound (oracle)", st, &err);
      ub += b;
    }
  }
  memset(res, 0, sizeof *res);
  res->alpha = alpha;
  res->kind = 4;
  snprintf(res->name, sizeof res->name, "oracle a=%g", alpha);
  res->ttft = F > 0 ? ft / F : 0;
  res->quality = F > 0 ? fq / F : 1;
  res->hit_dram = F > 0 ? dram / F : 0;
  res->hit_ssd = F > 0 ? ssd / F : 0;
  res->miss = F > 0 ? miss / F : 0;
  if (ub_over_f != NULL)
    *ub_over_f = F > 0 ? ub / F : 0;
  return 0;
}

/* The lowest oracle TTFT at quality >= q: the sweep's points, then a bisection of alpha
 * between the last point below q and the first at or above it (the greedy's quality grows
 * with alpha nearly monotonically; every point tried that reaches q counts). */
double pb_oracle_ttft_at(pb_oracle *o, const result *sweep, size_t n_sweep, double q)
{
  double best = -1, lo = -1, hi = -1;
  for (size_t a = 0; a < n_sweep; a++) {
    if (sweep[a].quality >= q) {
      if (best < 0 || sweep[a].ttft < best)
        best = sweep[a].ttft;
      if (hi < 0)
        hi = sweep[a].alpha;
    } else if (hi < 0) {
      lo = sweep[a].alpha;
    }
  }
  if (hi < 0 || lo < 0)
    return best;
  for (int it = 0; it < 14; it++) {
    double mid = lo > 0 ? sqrt(lo * hi) : 0.5 * (lo + hi);
    result r;
    if (pb_oracle_run(o, mid, 0, &r, NULL) != 0)
      return best;
    if (r.quality >= q) {
      hi = mid;
      if (r.ttft < best)
        best = r.ttft;
    } else {
      lo = mid;
    }
  }
  return best;
}

/* The LP's lower bound on the TTFT of any per-phase placement of quality >= q. */
double pb_oracle_lp_ttft_at(const double *alpha, const double *ub_over_f, size_t n, double q)
{
  double lb = 0;
  for (size_t a = 0; a < n; a++) {
    double v = alpha[a] * q - ub_over_f[a];
    if (v > lb)
      lb = v;
  }
  return lb;
}
