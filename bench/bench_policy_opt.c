/* SPDX-License-Identifier: MIT */
/*
 * bench/bench_policy_opt.c — `kvdb-bench policy` part 7: the share of the exact optimum each
 * placement rule reaches (issue 17 must-have 4), on instance families small enough for the exact
 * solver (kv_policy_exact: branch and bound over every placement, exact on the instance).
 *
 * THE FAMILIES (seeded, so every run solves the same instances)
 *   paper: the paper's shape (seed 004 §3.1 / Table 1 lengths and sensitivities, the config
 *     space's ratios and quality losses), 4..12 contexts, frequencies Zipf with skew 0..1.2 over
 *     a random order, alpha log-uniform in 0.01..10^4, and five tier layouts: DRAM (inclusive,
 *     decoded) over SSD; the same with an unlimited SSD; DRAM over SSD over SmartSSD; one tier;
 *     two plain tiers. Capacities are fractions of the raw total drawn so that they hold from
 *     about one context to most of them (the coarse regime of a 256 MiB DRAM tier).
 *   adversarial: the per-byte trap (a small dense context and a large valuable one that only
 *     fits alone), the coarse tier (contexts of 40-70% of the tier: a cascade leaves it half
 *     empty), the slow top tier (its probe measured it slower than the tier below, or than
 *     recomputing), and ties (equal densities, many options).
 * The share is (U(rule) - U(nothing stored)) / (U(optimum) - U(nothing stored)): 1 = optimal,
 * 0 = no better than storing nothing (instances where storing gains nothing are left out).
 */
#define _GNU_SOURCE
#include "bench_policy.h"

#define OPT_PAPER 220
#define OPT_ADV 80
#define OPT_PAPER_QUICK 60
#define OPT_ADV_QUICK 24
#define OPT_MAXN 12
#define OPT_MAXK 8

/* Ratio and quality loss at sensitivity 1 of the configs the paper's shape draws options from
 * (the trace's measured figures, rounded: bench/RESULTS.md "kvdb-bench policy"). */
static const struct {
  double ratio, loss;
  uint8_t method;
} OPT_CFG[OPT_MAXK] = {
  {1.00, 0.0, KVDB_METHOD_RAW},    {1.16, 0.0, KVDB_METHOD_LOSSLESS}, {1.78, 0.0005, KVDB_METHOD_QUANT},
  {3.19, 0.10, KVDB_METHOD_QUANT}, {5.31, 0.8, KVDB_METHOD_QUANT},    {2.00, 0.03, KVDB_METHOD_DROP},
  {3.31, 0.09, KVDB_METHOD_DROP},  {6.36, 0.12, KVDB_METHOD_DROP},
};

typedef struct oinst {
  kv_policy_tier tiers[KV_POLICY_MAX_TIERS];
  kv_policy_params p;
  kv_policy_option opts[OPT_MAXN * OPT_MAXK];
  kv_policy_context c[OPT_MAXN];
  size_t n;
} oinst;

static double zipf_f(uint32_t rank, double s)
{
  return 1.0 / pow((double)rank + 1.0, s);
}

/* Tiers of layout L (0..4) with capacities as fractions of `total` bytes. */
static void layout(oinst *x, uint64_t *rng, uint32_t L, uint64_t total)
{
  double lo = 0.08, hi = 0.9;
  double f0 = lo + (hi - lo) * rng_u01(rng) * rng_u01(rng), f1 = f0 * (2 + 8 * rng_u01(rng));
  uint64_t c0 = (uint64_t)((double)total * f0) + 1, c1 = (uint64_t)((double)total * f1) + 1;
  kv_policy_tier dram = {"dram", c0, 10e9, 1e-6, KV_POLICY_TIER_INCLUSIVE | KV_POLICY_TIER_DECODED};
  kv_policy_tier ssd = {"ssd", c1, 2e9, 50e-6, 0};
  kv_policy_tier sm = {"smartssd", c1, 1e9, 80e-6, 0};
  switch (L) {
  case 0:
    x->tiers[0] = dram, x->tiers[1] = ssd, x->p.n_tiers = 2;
    break;
  case 1:
    ssd.capacity_bytes = KV_POLICY_UNLIMITED;
    x->tiers[0] = dram, x->tiers[1] = ssd, x->p.n_tiers = 2;
    break;
  case 2:
    ssd.capacity_bytes = c1 / 2 + 1;
    x->tiers[0] = dram, x->tiers[1] = ssd, x->tiers[2] = sm, x->p.n_tiers = 3;
    break;
  case 3:
    ssd.capacity_bytes = c0;
    x->tiers[0] = ssd, x->p.n_tiers = 1;
    break;
  default:
    dram.flags = 0;
    x->tiers[0] = dram, x->tiers[1] = ssd, x->p.n_tiers = 2;
    break;
  }
}

/* The paper's shape: n contexts from the datasets of §3.1. */
static void make_paper(oinst *x, uint64_t *rng, uint32_t L)
{
  memset(x, 0, sizeof *x);
  kv_policy_params_init(&x->p);
  x->p.tiers = x->tiers;
  x->n = 4 + (size_t)(rng_next(rng) % (OPT_MAXN - 3));
  double skew = 0.3 * (double)(rng_next(rng) % 5);
  x->p.alpha = pow(10.0, -2 + 6 * rng_u01(rng));
  x->p.prefill_tokens_per_s = PB_PREFILL_TPS;
  x->p.decode_bps[KVDB_METHOD_LOSSLESS] = 1.5e9;
  x->p.decode_bps[KVDB_METHOD_QUANT] = 8e9;
  x->p.decode_bps[KVDB_METHOD_DROP] = 20e9;
  uint64_t total = 0;
  uint32_t perm[OPT_MAXN];
  for (uint32_t i = 0; i < x->n; i++)
    perm[i] = i;
  for (uint32_t i = (uint32_t)x->n; i-- > 1;) {
    uint32_t j = (uint32_t)(rng_next(rng) % (i + 1)), t = perm[i];
    perm[i] = perm[j], perm[j] = t;
  }
  for (size_t i = 0; i < x->n; i++) {
    const dataset *d = &PB_DATASETS[rng_next(rng) % N_DATASETS];
    double tok = d->mean_tokens * exp(0.5 * rng_normal(rng));
    uint64_t tokens = (uint64_t)(tok < 256 ? 256 : tok);
    uint64_t raw = tokens * PB_TOKEN_BYTES / 64; /* scaled down: only the ratios matter */
    double sens = d->median_sens * exp(d->cv_sens * rng_normal(rng));
    uint32_t k = 0;
    kv_policy_option *o = &x->opts[i * OPT_MAXK];
    for (uint32_t j = 0; j < OPT_MAXK; j++) {
      if (j > 0 && rng_next(rng) % 3 == 0)
        continue;
      double q = 1.0 - sens * OPT_CFG[j].loss;
      o[k].bytes = (uint64_t)((double)raw / OPT_CFG[j].ratio) + 1;
      o[k].quality = q < 0 ? 0 : q > 1 ? 1 : q;
      o[k].config.method = OPT_CFG[j].method;
      o[k].decoded_bytes = raw;
      k++;
    }
    x->c[i] = (kv_policy_context){o, k, raw, tokens, 10 * zipf_f(perm[i], skew),
                                  kv_policy_place_none()};
    total += raw;
  }
  layout(x, rng, L, total);
}

/* The adversarial families (kind 0..3). */
static void make_adv(oinst *x, uint64_t *rng, uint32_t kind)
{
  memset(x, 0, sizeof *x);
  kv_policy_params_init(&x->p);
  x->p.tiers = x->tiers;
  x->p.alpha = 1.0;
  x->p.prefill_tokens_per_s = PB_PREFILL_TPS;
  uint64_t cap = 1ull << 30;
  x->n = 2 + (size_t)(rng_next(rng) % 6);
  for (size_t i = 0; i < x->n; i++) {
    kv_policy_option *o = &x->opts[i * OPT_MAXK];
    uint64_t raw = 0, tokens = 0;
    double f = 1;
    uint32_t k = 1;
    o[0] = (kv_policy_option){.bytes = 0, .quality = 1.0};
    if (kind == 0) { /* trap: context 0 large and valuable, the others small and dense */
      raw = i == 0 ? cap : cap / (8 + rng_next(rng) % 32);
      tokens = raw / 65536;
      f = i == 0 ? 1.0 : 1.3 * (double)raw / (double)cap + 0.02 * rng_u01(rng);
    } else if (kind == 1) { /* coarse: 40-70% of the tier each */
      raw = (uint64_t)((double)cap * (0.4 + 0.3 * rng_u01(rng)));
      tokens = raw / 65536;
      f = 0.5 + rng_u01(rng);
    } else { /* slow top tier (2) / ties with options (3) */
      raw = (uint64_t)((double)cap * (0.1 + 0.5 * rng_u01(rng)));
      tokens = raw / 65536;
      f = kind == 3 ? 1.0 : 0.2 + rng_u01(rng);
      k = kind == 3 ? 4 : 2;
      for (uint32_t j = 1; j < k; j++)
        o[j] = (kv_policy_option){.bytes = raw / (1 + j), .quality = 1.0 - 0.02 * j};
    }
    o[0].bytes = raw;
    x->c[i] = (kv_policy_context){o, k, raw, tokens, f, kv_policy_place_none()};
  }
  kv_policy_tier top = {"dram", cap, 10e9, 1e-6, KV_POLICY_TIER_INCLUSIVE};
  kv_policy_tier ssd = {"ssd", 2 * cap, 2e9, 50e-6, 0};
  if (kind == 2) /* the probe measured DRAM slow: slower than the SSD, or than recomputing */
    top.read_bps = rng_next(rng) % 2 ? 1e9 : 1e7;
  if (kind == 0 || kind == 1) { /* one tier (the trap and the coarse tier are one-tier shapes) */
    ssd.capacity_bytes = cap;
    x->tiers[0] = ssd;
    x->p.n_tiers = 1;
  } else {
    x->tiers[0] = top, x->tiers[1] = ssd;
    x->p.n_tiers = 2;
  }
}

static double share_of(const oinst *x, double u, double uopt)
{
  double none = 0;
  for (size_t i = 0; i < x->n; i++)
    none += kv_policy_utility(&x->p, &x->c[i], kv_policy_place_none());
  if (!(uopt - none > 1e-9 * (fabs(uopt) + 1)))
    return NAN;
  return (u - none) / (uopt - none);
}

static void summarize(double *v, size_t n, double out[3])
{
  qsort(v, n, sizeof *v, cmp_double);
  out[0] = n ? v[0] : NAN;
  out[1] = n ? v[(size_t)floor(0.05 * (double)(n - 1))] : NAN;
  out[2] = n ? median(v, n) : NAN;
}

/* KVDB_BENCH_OPT_WORST=1: the default rule's worst instance, context by context, beside the
 * optimum. */
static void print_worst(FILE *o, oinst *x, size_t it, int paper, double share)
{
  kv_policy_place opt[OPT_MAXN];
  double uopt;
  kv_policy_plan plan;
  x->p.rule = KV_POLICY_REFILL;
  kv_policy_eval ev;
  if (kv_policy_exact(&x->p, x->c, x->n, 0, opt, &uopt, NULL) != KVDB_OK ||
      kv_policy_evaluate(&x->p, x->c, x->n, opt, &ev, NULL) != KVDB_OK ||
      kv_policy_rebalance(&x->p, x->c, x->n, &plan, NULL) != KVDB_OK)
    return;
  fprintf(o, "\nthe default rule's worst instance: #%zu (%s), share %.4f, %zu contexts, alpha %g, "
             "U rule %.6g, U opt %.6g; tiers:",
          it, paper ? "paper's shape" : "adversarial", share, x->n, x->p.alpha,
          plan.utility_after, uopt);
  for (uint32_t t = 0; t < x->p.n_tiers; t++)
    fprintf(o, " %s cap %llu used %llu/%llu (rule/opt) bw %.3g flags %u;", x->tiers[t].name,
            (unsigned long long)x->tiers[t].capacity_bytes,
            (unsigned long long)plan.used_after[t], (unsigned long long)ev.used[t],
            x->tiers[t].read_bps, x->tiers[t].flags);
  fprintf(o, "\n  %3s %12s %9s %8s   %-18s %10s   %-18s %10s\n", "ctx", "raw", "tokens", "freq",
          "rule (t/o/c bytes)", "U", "optimum", "U");
  for (size_t i = 0; i < x->n; i++) {
    const kv_policy_context *c = &x->c[i];
    kv_policy_place a = plan.place[i], b = opt[i];
    uint64_t ba = a.tier < 0 ? 0 : c->options[a.option].bytes;
    uint64_t bb = b.tier < 0 ? 0 : c->options[b.option].bytes;
    fprintf(o,
            "  %3zu %12llu %9llu %8.4f   %2d/%2d/%u %10llu %10.5g   %2d/%2d/%u %10llu %10.5g\n", i,
            (unsigned long long)c->raw_bytes, (unsigned long long)c->n_tokens, c->frequency,
            a.tier, a.option, a.cached, (unsigned long long)ba,
            kv_policy_utility(&x->p, c, a), b.tier, b.option, b.cached,
            (unsigned long long)bb, kv_policy_utility(&x->p, c, b));
  }
  kv_policy_plan_free(&plan);
}

int pb_optimality(const bench_env *env, opt_m *out)
{
  memset(out, 0, sizeof *out);
  size_t np = env->quick ? OPT_PAPER_QUICK : OPT_PAPER, na = env->quick ? OPT_ADV_QUICK : OPT_ADV;
  size_t cap = np + na;
  double *sh[OPT_RULES], *sh_paper[OPT_RULES], *tm[OPT_RULES];
  int rc = -1;
  for (int r = 0; r < OPT_RULES; r++) {
    sh[r] = calloc(cap, sizeof(double));
    sh_paper[r] = calloc(cap, sizeof(double));
    tm[r] = calloc(cap, sizeof(double));
  }
  size_t n_tm = 0, worst_it = SIZE_MAX;
  double worst_s = INFINITY;
  uint64_t worst_rng = 0;
  uint64_t rng = 0x17171717ull;
  size_t n_all[OPT_RULES] = {0}, n_paper[OPT_RULES] = {0};
  double ms = 0;
  for (size_t it = 0; it < cap; it++) {
    int r;
    for (r = 0; r < OPT_RULES; r++)
      if (sh[r] == NULL || sh_paper[r] == NULL || tm[r] == NULL)
        goto done;
    oinst x;
    int paper = it < np;
    uint64_t rng0 = rng;
    if (paper)
      make_paper(&x, &rng, (uint32_t)(it % 5));
    else
      make_adv(&x, &rng, (uint32_t)(it % 4));
    kv_policy_place best[OPT_MAXN];
    double uopt;
    kv_policy_err err;
    double t0 = now_s();
    kvdb_status st = kv_policy_exact(&x.p, x.c, x.n, 0, best, &uopt, &err);
    ms += (now_s() - t0) * 1e3;
    if (st == KVDB_UNSUPPORTED) {
      out->skipped++;
      continue;
    }
    if (st != KVDB_OK) {
      pfail("kv_policy_exact", st, &err);
      goto done;
    }
    for (r = 0; r < OPT_RULES; r++) {
      x.p.rule = (kv_policy_rule)r;
      kv_policy_plan plan;
      double t1 = now_s();
      if ((st = kv_policy_rebalance(&x.p, x.c, x.n, &plan, &err)) != KVDB_OK) {
        pfail("kv_policy_rebalance", st, &err);
        goto done;
      }
      tm[r][n_tm] = (now_s() - t1) * 1e3;
      double s = share_of(&x, plan.utility_after, uopt);
      kv_policy_plan_free(&plan);
      if (isnan(s))
        continue;
      sh[r][n_all[r]++] = s;
      if (r == KV_POLICY_REFILL && s < worst_s) {
        worst_s = s;
        worst_it = it;
        worst_rng = rng0;
      }
      if (paper)
        sh_paper[r][n_paper[r]++] = s;
    }
    n_tm++;
  }
  for (int r = 0; r < OPT_RULES; r++) {
    summarize(sh[r], n_all[r], out->all[r]);
    summarize(sh_paper[r], n_paper[r], out->paper[r]);
    out->n_all = n_all[r];
    out->n_paper = n_paper[r];
    double t3[3];
    summarize(tm[r], n_tm, t3);
    out->rule_ms[r][0] = t3[2];
    out->rule_ms[r][1] = n_tm ? tm[r][n_tm - 1] : NAN;
  }
  out->exact_ms = ms;
  const char *ws = getenv("KVDB_BENCH_OPT_WORST");
  if (ws != NULL && *ws != '\0' && strcmp(ws, "0") != 0 && worst_it != SIZE_MAX) {
    oinst x;
    rng = worst_rng;
    if (worst_it < np)
      make_paper(&x, &rng, (uint32_t)(worst_it % 5));
    else
      make_adv(&x, &rng, (uint32_t)(worst_it % 4));
    print_worst(env->out, &x, worst_it, worst_it < np, worst_s);
  }
  rc = 0;
done:
  for (int r = 0; r < OPT_RULES; r++) {
    free(sh[r]);
    free(sh_paper[r]);
    free(tm[r]);
  }
  return rc;
}
