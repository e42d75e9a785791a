/* SPDX-License-Identifier: MIT */
/*
 * tests/unit/test_policy.c — policy (policy.h): the EvicPress Figure 2 example, Algorithm 1
 * cases computed by hand (recompress, evict, cascade to "not stored", the inclusive DRAM tier,
 * admit into a full store and the plan's move order), the per-byte rule, greedy vs the exact
 * optimum vs the upper bound on thousands of random small instances (gap reported), capacity
 * and plan consistency after every placement on random large instances, determinism, bad
 * input. The speed of a 100k-context rebalance is measured by `kvdb-bench policy`
 * (place_100k_ms), not here: tests are not timed.
 *
 * `KVDB_SEED=N` changes the random instances (default 1).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "policy.h"

#define CHECK(cond)                                                                                \
  do {                                                                                             \
    if (!(cond)) {                                                                                 \
      fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond);                    \
      abort();                                                                                     \
    }                                                                                              \
  } while (0)
#define CHECK_OK(expr)                                                                             \
  do {                                                                                             \
    kv_policy_err e_;                                                                              \
    memset(&e_, 0, sizeof e_);                                                                     \
    (void)e_;                                                                                      \
    kvdb_status rc_ = (expr);                                                                      \
    if (rc_ != KVDB_OK) {                                                                          \
      fprintf(stderr, "%s:%d: %s -> %d\n", __FILE__, __LINE__, #expr, (int)rc_);                   \
      abort();                                                                                     \
    }                                                                                              \
  } while (0)
#define CHECK_NEAR(a, b, tol)                                                                      \
  do {                                                                                             \
    double a_ = (a), b_ = (b);                                                                     \
    if (!(fabs(a_ - b_) <= (tol))) {                                                               \
      fprintf(stderr, "%s:%d: %s = %.12g, expected %s = %.12g (tol %g)\n", __FILE__, __LINE__,    \
              #a, a_, #b, b_, (double)(tol));                                                      \
      abort();                                                                                     \
    }                                                                                              \
  } while (0)

#define GB 1000000000ull

static uint64_t rng_state;
static uint64_t rnd(void)
{
  uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
static double rnd01(void)
{
  return (double)(rnd() >> 11) * (1.0 / 9007199254740992.0);
}
static uint32_t rndn(uint32_t n)
{
  return (uint32_t)(rnd() % n);
}

static kv_policy_tier tier(const char *name, uint64_t cap, double bw, double lat, uint32_t flags)
{
  kv_policy_tier t = {name, cap, bw, lat, flags};
  return t;
}

static kv_policy_option opt(uint64_t bytes, double q)
{
  kv_policy_option o;
  memset(&o, 0, sizeof o);
  o.bytes = bytes;
  o.quality = q;
  return o;
}

static kv_policy_context ctxof(const kv_policy_option *o, uint32_t n, uint64_t raw, uint64_t tokens,
                               double f)
{
  kv_policy_context c;
  memset(&c, 0, sizeof c);
  c.options = o;
  c.n_options = n;
  c.raw_bytes = raw;
  c.n_tokens = tokens;
  c.frequency = f;
  c.current = kv_policy_place_none();
  return c;
}

static kv_policy_place pl(int32_t t, int32_t o, uint32_t cached)
{
  kv_policy_place p = {t, o, cached};
  return p;
}

static int place_is(kv_policy_place a, int32_t t, int32_t o, uint32_t cached)
{
  if (t == KV_POLICY_NONE)
    return a.tier == KV_POLICY_NONE;
  return a.tier == t && a.option == o && a.cached == cached;
}

/* Sum of TTFT over contexts and mean quality (unweighted) of placements. */
static void ttft_quality(const kv_policy_params *p, const kv_policy_context *c, size_t n,
                         const kv_policy_place *place, double *ttft_sum, double *q_mean)
{
  double ts = 0, qs = 0;
  for (size_t i = 0; i < n; i++) {
    ts += kv_policy_ttft(p, &c[i], place[i]);
    qs += place[i].tier == KV_POLICY_NONE ? p->recompute_quality
                                          : c[i].options[place[i].option].quality;
  }
  *ttft_sum = ts;
  *q_mean = qs / (double)n;
}

/* Every tier within capacity, and the plan consistent with itself and with evaluate. */
static void check_plan(const kv_policy_params *p, const kv_policy_context *c, size_t n,
                       const kv_policy_plan *plan)
{
  kv_policy_eval ev;
  CHECK_OK(kv_policy_evaluate(p, c, n, plan->place, &ev, NULL));
  CHECK(ev.over_capacity == 0);
  for (uint32_t t = 0; t < p->n_tiers; t++) {
    CHECK(plan->used_after[t] == ev.used[t]);
    CHECK(plan->used_after[t] <= p->tiers[t].capacity_bytes);
  }
  CHECK_NEAR(plan->utility_after, ev.utility, 1e-9 * (fabs(ev.utility) + 1));
  int64_t delta[KV_POLICY_MAX_TIERS] = {0};
  size_t changed = 0;
  for (size_t i = 0; i < n; i++) {
    kv_policy_place a = c[i].current, b = plan->place[i];
    int same = (a.tier == KV_POLICY_NONE || b.tier == KV_POLICY_NONE)
                   ? a.tier == b.tier
                   : (a.tier == b.tier && a.option == b.option && a.cached == b.cached);
    changed += !same;
  }
  CHECK(plan->n_moves == changed);
  int last_rank = -1;
  uint32_t last_ctx = 0;
  for (size_t k = 0; k < plan->n_moves; k++) {
    const kv_policy_move *mv = &plan->moves[k];
    CHECK(mv->context < n);
    CHECK(place_is(mv->to, plan->place[mv->context].tier, plan->place[mv->context].option,
                   plan->place[mv->context].cached));
    for (uint32_t t = 0; t < p->n_tiers; t++)
      delta[t] += mv->bytes_delta[t];
    int rank = mv->to.tier == KV_POLICY_NONE
                   ? 0
                   : 1 + 2 * ((int)p->n_tiers - 1 - mv->to.tier) + (mv->to.cached ? 1 : 0);
    CHECK(rank > last_rank || (rank == last_rank && mv->context > last_ctx));
    last_rank = rank;
    last_ctx = mv->context;
    CHECK_NEAR(mv->utility_to, kv_policy_utility(p, &c[mv->context], mv->to), 1e-9);
  }
  for (uint32_t t = 0; t < p->n_tiers; t++)
    CHECK((int64_t)plan->used_after[t] - (int64_t)plan->used_before[t] == delta[t]);
}

/* ---- EvicPress Figure 2 -------------------------------------------------------------------- */

/*
 * Two contexts on a fast tier (20 GB/s) and a slow one (2 GB/s): context 1 is 4 GB and keeps
 * full quality at 5% of its size; context 2 is 8 GB and drops to 50% quality under slight
 * compression. Figure 2's answers: compression only (both halved, both fast) 0.3 s and 75%;
 * eviction only (context 1 to the slow tier) 2.4 s and 100%; joint: context 2 fast and
 * uncompressed, context 1 compressed to 0.2 GB on the slow tier, 0.5 s and 100%. The figure's
 * TTFT is the sum over the two contexts (0.4 + 0.1 s). The fast tier holds 8 GB: eviction only
 * keeps context 2 (8 GB) and not both (12 GB), and the joint answer does not fit context 1's
 * 0.2 GB beside context 2 either. alpha = 1 (the paper's evaluation), equal frequencies.
 */
static kv_policy_option fig2_o1[3], fig2_o2[3];

static void fig2_setup(kv_policy_context *c)
{
  fig2_o1[0] = opt(4 * GB, 1.0);       /* raw */
  fig2_o1[1] = opt(2 * GB, 1.0);       /* 50% */
  fig2_o1[2] = opt(GB / 5, 1.0);       /* 5% without loss */
  fig2_o2[0] = opt(8 * GB, 1.0);       /* raw */
  fig2_o2[1] = opt(72 * GB / 10, 0.5); /* slight compression: 90% */
  fig2_o2[2] = opt(4 * GB, 0.5);       /* 50% */
  c[0] = ctxof(fig2_o1, 3, 4 * GB, 32000, 1.0);
  c[1] = ctxof(fig2_o2, 3, 8 * GB, 64000, 1.0);
}

static void test_figure2(void)
{
  kv_policy_tier tiers[2] = {tier("fast", 8 * GB, 20e9, 0, 0),
                             tier("slow", KV_POLICY_UNLIMITED, 2e9, 0, 0)};
  kv_policy_params p;
  kv_policy_params_init(&p);
  p.tiers = tiers;
  p.n_tiers = 2;
  p.alpha = 1.0;
  p.prefill_tokens_per_s = 10000;
  p.rule = KV_POLICY_LEAST_DROP; /* Algorithm 1's own choices (the default is KV_POLICY_REFILL) */
  kv_policy_context c[2];
  fig2_setup(c);

  kv_policy_plan plan;
  CHECK_OK(kv_policy_rebalance(&p, c, 2, &plan, NULL));
  check_plan(&p, c, 2, &plan);
  CHECK(place_is(plan.place[1], 0, 0, 0)); /* context 2: fast, raw */
  CHECK(place_is(plan.place[0], 1, 2, 0)); /* context 1: slow, 5% */
  double ts, qm;
  ttft_quality(&p, c, 2, plan.place, &ts, &qm);
  CHECK_NEAR(ts, 0.5, 1e-12);
  CHECK_NEAR(qm, 1.0, 0);
  CHECK(plan.n_evict == 1 && plan.n_recompress == 0);
  double joint = plan.utility_after;

  /* the other two answers of the figure, and the optimum */
  kv_policy_place comp[2] = {pl(0, 1, 0), pl(0, 2, 0)}, evic[2] = {pl(1, 0, 0), pl(0, 0, 0)};
  kv_policy_eval ev;
  ttft_quality(&p, c, 2, comp, &ts, &qm);
  CHECK_NEAR(ts, 0.3, 1e-12);
  CHECK_NEAR(qm, 0.75, 1e-12);
  CHECK_OK(kv_policy_evaluate(&p, c, 2, comp, &ev, NULL));
  CHECK(ev.over_capacity == 0 && ev.utility < joint);
  ttft_quality(&p, c, 2, evic, &ts, &qm);
  CHECK_NEAR(ts, 2.4, 1e-12);
  CHECK_NEAR(qm, 1.0, 0);
  CHECK_OK(kv_policy_evaluate(&p, c, 2, evic, &ev, NULL));
  CHECK(ev.over_capacity == 0 && ev.utility < joint);
  kv_policy_place ex[2];
  double eu;
  CHECK_OK(kv_policy_exact(&p, c, 2, 0, ex, &eu, NULL));
  CHECK_NEAR(eu, joint, 1e-12);
  double ub;
  CHECK_OK(kv_policy_upper_bound(&p, c, 2, &ub, NULL, NULL));
  CHECK(ub >= eu - 1e-12);
  kv_policy_plan_free(&plan);

  /* the same answer on the put path: context 1 first (alone it takes 5% on the fast tier),
   * then context 2 arrives and Algorithm 1 evicts context 1 (drop 0.09) rather than
   * recompressing context 2 (drop 0.46 or 0.3) */
  size_t in0 = 0, in1 = 1;
  CHECK_OK(kv_policy_admit(&p, c, 1, &in0, 1, &plan, NULL));
  CHECK(place_is(plan.place[0], 0, 2, 0));
  c[0].current = plan.place[0];
  kv_policy_plan_free(&plan);
  CHECK_OK(kv_policy_admit(&p, c, 2, &in1, 1, &plan, NULL));
  check_plan(&p, c, 2, &plan);
  CHECK(place_is(plan.place[1], 0, 0, 0));
  CHECK(place_is(plan.place[0], 1, 2, 0));
  CHECK(plan.n_moves == 2);
  CHECK(plan.moves[0].context == 0 && plan.moves[0].bytes_delta[0] == -(int64_t)(GB / 5) &&
        plan.moves[0].bytes_delta[1] == (int64_t)(GB / 5));
  CHECK(plan.moves[1].context == 1 && plan.moves[1].bytes_delta[0] == (int64_t)(8 * GB));
  kv_policy_plan_free(&plan);
  c[0].current = kv_policy_place_none();

  /* kvdb's shape: the fast tier an inclusive DRAM cache, the slow tier persistent (8.2 GB) */
  kv_policy_tier inc[2] = {tier("dram", 8 * GB, 20e9, 0, KV_POLICY_TIER_INCLUSIVE),
                           tier("ssd", 82 * GB / 10, 2e9, 0, 0)};
  p.tiers = inc;
  CHECK_OK(kv_policy_rebalance(&p, c, 2, &plan, NULL));
  check_plan(&p, c, 2, &plan);
  CHECK(place_is(plan.place[1], 1, 0, 1)); /* cached in DRAM, persistent copy raw on SSD */
  CHECK(place_is(plan.place[0], 1, 2, 0));
  ttft_quality(&p, c, 2, plan.place, &ts, &qm);
  CHECK_NEAR(ts, 0.5, 1e-12);
  CHECK_NEAR(qm, 1.0, 0);
  CHECK(plan.used_after[0] == 8 * GB && plan.used_after[1] == 8 * GB + GB / 5);
  CHECK_OK(kv_policy_exact(&p, c, 2, 0, ex, &eu, NULL));
  CHECK_NEAR(eu, plan.utility_after, 1e-12);
  kv_policy_plan_free(&plan);

  /* the per-byte rule does not find it: recompressing context 2 to 50% costs 0.3 / 4 GB, less
   * per byte than evicting context 1 (0.09 / 0.2 GB): 0.21 s at 75% quality */
  p.tiers = tiers;
  p.rule = KV_POLICY_PER_BYTE;
  CHECK_OK(kv_policy_rebalance(&p, c, 2, &plan, NULL));
  check_plan(&p, c, 2, &plan);
  CHECK(place_is(plan.place[1], 0, 2, 0));
  CHECK(place_is(plan.place[0], 0, 2, 0));
  ttft_quality(&p, c, 2, plan.place, &ts, &qm);
  CHECK_NEAR(ts, 0.21, 1e-12);
  CHECK_NEAR(qm, 0.75, 1e-12);
  CHECK(plan.utility_after < joint);
  kv_policy_plan_free(&plan);
  printf("figure 2: joint answer 0.5 s at 100%% quality (least drop, also with an inclusive "
         "DRAM tier); per-byte: 0.21 s at 75%%\n");
}

/* ---- Algorithm 1 by hand ------------------------------------------------------------------- */

static kv_policy_params base_params(kv_policy_tier *tiers, uint32_t n_tiers)
{
  kv_policy_params p;
  kv_policy_params_init(&p);
  p.tiers = tiers;
  p.n_tiers = n_tiers;
  p.alpha = 10.0;
  p.prefill_tokens_per_s = 1000.0;
  p.rule = KV_POLICY_LEAST_DROP; /* these tests walk Algorithm 1 (seed 004 Appendix A) by hand */
  return p;
}

/*
 * One tier (10 GB, 10 GB/s) and "not stored" (1000 tokens/s), alpha 10:
 *   A: raw 6 GB (U 9.4) or 3 GB at 0.9 (U 8.7), 1000 tokens (none: U 9)
 *   B: raw 6 GB (U 9.4) or 2 GB at 0.5 (U 4.8), 2000 tokens (none: U 8)
 *   C: raw 2 GB, frequency 2 (U 19.6), 500 tokens (none: U 19)
 * All raw: 14 GB. Costs: A recompress 0.7 | evict 0.4; B 4.6 | 1.4; C evict 0.6. Evicting A
 * (0.4) leaves 8 GB: done. U = 9 + 9.4 + 19.6 = 38, the optimum.
 */
static void test_alg1_single_tier(void)
{
  kv_policy_tier t[1] = {tier("t0", 10 * GB, 10e9, 0, 0)};
  kv_policy_params p = base_params(t, 1);
  kv_policy_option oa[2] = {opt(6 * GB, 1.0), opt(3 * GB, 0.9)};
  kv_policy_option ob[2] = {opt(6 * GB, 1.0), opt(2 * GB, 0.5)};
  kv_policy_option oc[1] = {opt(2 * GB, 1.0)};
  kv_policy_context c[3] = {ctxof(oa, 2, 6 * GB, 1000, 1), ctxof(ob, 2, 6 * GB, 2000, 1),
                            ctxof(oc, 1, 2 * GB, 500, 2)};
  for (int rule = 0; rule < 2; rule++) { /* per byte: 0.4/6 < 0.7/3, 1.4/6, 0.6/2: the same */
    p.rule = (kv_policy_rule)rule;
    kv_policy_plan plan;
    CHECK_OK(kv_policy_rebalance(&p, c, 3, &plan, NULL));
    check_plan(&p, c, 3, &plan);
    CHECK(place_is(plan.place[0], KV_POLICY_NONE, 0, 0));
    CHECK(place_is(plan.place[1], 0, 0, 0));
    CHECK(place_is(plan.place[2], 0, 0, 0));
    CHECK(plan.n_evict == 1 && plan.n_recompress == 0);
    CHECK_NEAR(plan.utility_after, 38.0, 1e-9);
    CHECK(plan.used_after[0] == 8 * GB);
    kv_policy_place ex[3];
    double eu;
    CHECK_OK(kv_policy_exact(&p, c, 3, 0, ex, &eu, NULL));
    CHECK_NEAR(eu, 38.0, 1e-9);
    kv_policy_plan_free(&plan);
  }
}

/*
 * Recompress, then evict, then cascade: tier 0 5 GB at 10 GB/s, tier 1 4 GB at 1 GB/s, alpha 10.
 *   A: raw 4 GB (U 9.6 fast; 6 slow) or 2 GB at 0.97 (9.5 fast; 7.7 slow), 3000 tokens
 *   B: raw 4 GB (9.6; 6) or 2 GB at 0.6 (5.8; 4), 3000 tokens
 * Both raw fast: 8 GB. Costs: A recompress 0.1 | evict to slow at 2 GB 1.9; B 3.8 | 3.6.
 * Recompress A (0.1): 6 GB. A now: evict 1.8; B 3.6: evict A to slow (2 GB). 4 GB fast, 2 GB
 * slow. U = 7.7 + 9.6 = 17.3, the optimum.
 */
static void test_alg1_recompress_then_evict(void)
{
  kv_policy_tier t[2] = {tier("fast", 5 * GB, 10e9, 0, 0), tier("slow", 4 * GB, 1e9, 0, 0)};
  kv_policy_params p = base_params(t, 2);
  kv_policy_option oa[2] = {opt(4 * GB, 1.0), opt(2 * GB, 0.97)};
  kv_policy_option ob[2] = {opt(4 * GB, 1.0), opt(2 * GB, 0.6)};
  kv_policy_context c[2] = {ctxof(oa, 2, 4 * GB, 3000, 1), ctxof(ob, 2, 4 * GB, 3000, 1)};
  kv_policy_plan plan;
  CHECK_OK(kv_policy_rebalance(&p, c, 2, &plan, NULL));
  check_plan(&p, c, 2, &plan);
  CHECK(place_is(plan.place[0], 1, 1, 0));
  CHECK(place_is(plan.place[1], 0, 0, 0));
  CHECK(plan.n_recompress == 1 && plan.n_evict == 1);
  CHECK_NEAR(plan.utility_after, 17.3, 1e-9);
  kv_policy_place ex[2];
  double eu;
  CHECK_OK(kv_policy_exact(&p, c, 2, 0, ex, &eu, NULL));
  CHECK_NEAR(eu, 17.3, 1e-9);
  kv_policy_plan_free(&plan);
}

/*
 * The cascade to "not stored": two tiers of 4 GB (10 and 1 GB/s), three raw-only contexts of
 * 4 GB, 8000 tokens (8 s), frequencies 3, 2, 1, alpha 10. Fast: U = 9.6 f; slow 6 f; none 2 f.
 * Tier 0: evict C (3.6), then B (7.2). Tier 1 (B, C: 8 GB): evict to none costs 4 f: C.
 */
static kv_policy_option cas_o[1];

static void cascade_setup(kv_policy_context *c)
{
  cas_o[0] = opt(4 * GB, 1.0);
  for (int i = 0; i < 3; i++)
    c[i] = ctxof(cas_o, 1, 4 * GB, 8000, 3.0 - i);
}

static void test_alg1_cascade(void)
{
  kv_policy_tier t[2] = {tier("fast", 4 * GB, 10e9, 0, 0), tier("slow", 4 * GB, 1e9, 0, 0)};
  kv_policy_params p = base_params(t, 2);
  kv_policy_context c[3];
  cascade_setup(c);
  kv_policy_plan plan;
  CHECK_OK(kv_policy_rebalance(&p, c, 3, &plan, NULL));
  check_plan(&p, c, 3, &plan);
  CHECK(place_is(plan.place[0], 0, 0, 0));
  CHECK(place_is(plan.place[1], 1, 0, 0));
  CHECK(place_is(plan.place[2], KV_POLICY_NONE, 0, 0));
  CHECK(plan.n_evict == 3 && plan.n_recompress == 0);
  CHECK_NEAR(plan.utility_after, 9.6 * 3 + 6 * 2 + 2 * 1, 1e-9);
  kv_policy_plan_free(&plan);
}

/*
 * The inclusive DRAM tier: DRAM 4 GB (10 GB/s) inclusive over an 8 GB SSD (1 GB/s), the same
 * three contexts. Everyone starts cached (12 GB DRAM, 12 GB SSD). DRAM: uncache C (3.6), B
 * (7.2). SSD (12 GB): A is cached, leaving the last tier drops it from DRAM too: 9.6*3 - 2*3 =
 * 22.8; B 4*2 = 8; C 4: C leaves. Then admit D (frequency 5) into that state: DRAM holds A and
 * D (8 GB): uncaching A costs 10.8, D 18: A. SSD (A, B, D: 12 GB): A to none 12, B 8, D (cached)
 * 38: B leaves. Moves in execution order: B (leaves), A (uncached on SSD), D (cached).
 */
static void test_alg1_inclusive_and_admit(void)
{
  kv_policy_tier t[2] = {tier("dram", 4 * GB, 10e9, 0, KV_POLICY_TIER_INCLUSIVE),
                         tier("ssd", 8 * GB, 1e9, 0, 0)};
  kv_policy_params p = base_params(t, 2);
  kv_policy_context c[4];
  cascade_setup(c);
  kv_policy_plan plan;
  CHECK_OK(kv_policy_rebalance(&p, c, 3, &plan, NULL));
  check_plan(&p, c, 3, &plan);
  CHECK(place_is(plan.place[0], 1, 0, 1));
  CHECK(place_is(plan.place[1], 1, 0, 0));
  CHECK(place_is(plan.place[2], KV_POLICY_NONE, 0, 0));
  CHECK(plan.used_after[0] == 4 * GB && plan.used_after[1] == 8 * GB);
  CHECK(plan.n_evict == 3);
  for (int i = 0; i < 3; i++)
    c[i].current = plan.place[i];
  kv_policy_plan_free(&plan);

  c[3] = ctxof(cas_o, 1, 4 * GB, 8000, 5.0);
  size_t in = 3;
  CHECK_OK(kv_policy_admit(&p, c, 4, &in, 1, &plan, NULL));
  check_plan(&p, c, 4, &plan);
  CHECK(place_is(plan.place[0], 1, 0, 0));
  CHECK(place_is(plan.place[1], KV_POLICY_NONE, 0, 0));
  CHECK(place_is(plan.place[2], KV_POLICY_NONE, 0, 0));
  CHECK(place_is(plan.place[3], 1, 0, 1));
  CHECK(plan.n_moves == 3);
  CHECK(plan.moves[0].context == 1 && plan.moves[0].to.tier == KV_POLICY_NONE);
  CHECK(plan.moves[0].bytes_delta[1] == -(int64_t)(4 * GB));
  CHECK(plan.moves[1].context == 0 && plan.moves[1].from.cached == 1 &&
        plan.moves[1].to.cached == 0);
  CHECK(plan.moves[1].bytes_delta[0] == -(int64_t)(4 * GB) && plan.moves[1].bytes_delta[1] == 0);
  CHECK(plan.moves[2].context == 3 && plan.moves[2].to.cached == 1);
  CHECK(plan.moves[2].bytes_delta[0] == (int64_t)(4 * GB) &&
        plan.moves[2].bytes_delta[1] == (int64_t)(4 * GB));
  CHECK_NEAR(plan.moves[2].utility_to, 9.6 * 5, 1e-9);
  CHECK_NEAR(plan.moves[0].utility_from - plan.moves[0].utility_to, 8.0, 1e-9);
  kv_policy_plan_free(&plan);

  /* admit with nothing incoming only repairs: shrink DRAM to 0 bytes' worth (1 byte) */
  for (int i = 0; i < 3; i++)
    c[i].current = pl(1, 0, i == 0);
  t[0].capacity_bytes = 1;
  CHECK_OK(kv_policy_admit(&p, c, 3, NULL, 0, &plan, NULL));
  check_plan(&p, c, 3, &plan);
  CHECK(plan.n_moves == 2 && plan.used_after[0] == 0); /* A uncached; C leaves the SSD */
  kv_policy_plan_free(&plan);
}

/* The model itself: TTFT with latency and decode, a decoded tier, NONE. */
static void test_model(void)
{
  kv_policy_tier t[2] = {tier("dram", 10 * GB, 10e9, 1e-3, KV_POLICY_TIER_INCLUSIVE | KV_POLICY_TIER_DECODED),
                         tier("ssd", KV_POLICY_UNLIMITED, 2e9, 1e-4, 0)};
  kv_policy_params p = base_params(t, 2);
  p.decode_bps[KVDB_METHOD_QUANT] = 8e9;
  kv_policy_option o[2] = {opt(4 * GB, 1.0), opt(1 * GB, 0.9)};
  o[1].config.method = KVDB_METHOD_QUANT;
  kv_policy_context c = ctxof(o, 2, 4 * GB, 4000, 2.0);
  /* SSD, int4-like: 1e-4 + 1 GB / 2 GB/s + 4 GB / 8 GB/s = 1.0001 s */
  CHECK_NEAR(kv_policy_ttft(&p, &c, pl(1, 1, 0)), 1.0001, 1e-12);
  CHECK_NEAR(kv_policy_utility(&p, &c, pl(1, 1, 0)), (10 * 0.9 - 1.0001) * 2, 1e-12);
  /* decoded DRAM: the raw 4 GB at 10 GB/s, no decode */
  CHECK_NEAR(kv_policy_ttft(&p, &c, pl(1, 1, 1)), 1e-3 + 0.4, 1e-12);
  o[1].decoded_bytes = 2 * GB;
  CHECK_NEAR(kv_policy_ttft(&p, &c, pl(1, 1, 1)), 1e-3 + 0.2, 1e-12);
  o[1].decode_bps = 4e9; /* the option's own figure wins over the table */
  CHECK_NEAR(kv_policy_ttft(&p, &c, pl(1, 1, 0)), 1e-4 + 0.5 + 1.0, 1e-12);
  CHECK_NEAR(kv_policy_ttft(&p, &c, kv_policy_place_none()), 4.0, 1e-12);
  p.recompute_quality = 0.5;
  CHECK_NEAR(kv_policy_utility(&p, &c, kv_policy_place_none()), (10 * 0.5 - 4.0) * 2, 1e-12);
  CHECK(isnan(kv_policy_utility(&p, &c, pl(0, 0, 0)))); /* tier 0 is not persistent */
  CHECK(isnan(kv_policy_ttft(&p, &c, pl(1, 2, 0))));
  CHECK_NEAR(kv_policy_decay(8, 10, 10, 0), 4, 1e-12);
  CHECK_NEAR(kv_policy_decay(8, 20, 10, 1), 3, 1e-12);
  CHECK_NEAR(kv_policy_decay(8, 20, 0, 0), 8, 0);
}

/* ---- random instances ---------------------------------------------------------------------- */

typedef struct inst {
  kv_policy_tier tiers[KV_POLICY_MAX_TIERS];
  kv_policy_params p;
  kv_policy_option *opts;
  kv_policy_context *c;
  size_t n;
} inst;

static void inst_free(inst *x)
{
  free(x->opts);
  free(x->c);
}

/* n contexts, up to kmax options, 1..3 tiers (tier 0 inclusive and/or decoded sometimes);
 * capacities a random fraction `tight` of the raw total. */
static void inst_make(inst *x, size_t n, uint32_t kmax, double tight)
{
  memset(x, 0, sizeof *x);
  x->n = n;
  uint32_t T = 1 + rndn(3);
  int incl = T >= 2 && rndn(2) == 0;
  x->opts = calloc(n * kmax, sizeof *x->opts);
  x->c = calloc(n, sizeof *x->c);
  CHECK(x->opts != NULL && x->c != NULL);
  uint64_t total = 0;
  for (size_t i = 0; i < n; i++) {
    uint32_t k = 1 + rndn(kmax);
    uint64_t raw = (uint64_t)(1 + rndn(64)) * (GB / 16);
    kv_policy_option *o = &x->opts[i * kmax];
    for (uint32_t j = 0; j < k; j++) {
      double frac = j == 0 ? 1.0 : 0.05 + 0.9 * rnd01();
      o[j] = opt((uint64_t)((double)raw * frac) + 1, j == 0 ? 1.0 : rnd01());
      o[j].config.method = (uint8_t)rndn(4);
      if (rndn(3) == 0)
        o[j].decode_bps = 1e9 + 10e9 * rnd01();
      if (rndn(2) == 0)
        o[j].decoded_bytes = (uint64_t)((double)raw * (0.1 + 0.9 * rnd01())) + 1;
    }
    x->c[i] = ctxof(o, k, raw, 1000 + rndn(40000), rndn(5) == 0 ? 0.0 : 5 * rnd01());
    total += raw;
  }
  double bw = 20e9;
  for (uint32_t t = 0; t < T; t++) {
    uint64_t cap = (uint64_t)((double)total * tight * (0.2 + rnd01())) + 1;
    if (t == T - 1 && rndn(4) == 0)
      cap = KV_POLICY_UNLIMITED;
    uint32_t flags = 0;
    if (t == 0 && incl)
      flags |= KV_POLICY_TIER_INCLUSIVE;
    if (t == 0 && rndn(4) == 0)
      flags |= KV_POLICY_TIER_DECODED;
    x->tiers[t] = tier(NULL, cap, bw, rndn(2) ? 0 : 1e-4 * rnd01(), flags);
    bw /= 2 + 8 * rnd01();
  }
  kv_policy_params_init(&x->p);
  x->p.tiers = x->tiers;
  x->p.n_tiers = T;
  x->p.alpha = 10 * rnd01();
  x->p.prefill_tokens_per_s = 2000 + 20000 * rnd01();
  x->p.decode_bps[KVDB_METHOD_QUANT] = rndn(2) ? 0 : 8e9;
  x->p.decode_bps[KVDB_METHOD_LOSSLESS] = 2e9;
  x->p.rule = (kv_policy_rule)rndn(3);
}

/* Every placement by enumeration (n <= 4 small): the optimum. */
static double brute(const inst *x, size_t i, uint64_t *used, double u)
{
  if (i == x->n)
    return u;
  double best = -INFINITY;
  const kv_policy_context *c = &x->c[i];
  int incl = (x->tiers[0].flags & KV_POLICY_TIER_INCLUSIVE) != 0;
  kv_policy_place cand[1 + 2 * KV_POLICY_MAX_TIERS * 8];
  size_t nc = 0;
  cand[nc++] = kv_policy_place_none();
  for (uint32_t cached = 0; cached <= (uint32_t)incl; cached++)
    for (uint32_t t = incl ? 1 : 0; t < x->p.n_tiers; t++)
      for (uint32_t o = 0; o < c->n_options; o++)
        cand[nc++] = pl((int32_t)t, (int32_t)o, cached);
  for (size_t k = 0; k < nc; k++) {
    kv_policy_context one = *c;
    one.current = cand[k];
    kv_policy_eval ev;
    CHECK_OK(kv_policy_evaluate(&x->p, &one, 1, NULL, &ev, NULL));
    int fits = 1;
    for (uint32_t t = 0; t < x->p.n_tiers; t++)
      fits &= ev.used[t] <= x->tiers[t].capacity_bytes - used[t];
    if (!fits)
      continue;
    for (uint32_t t = 0; t < x->p.n_tiers; t++)
      used[t] += ev.used[t];
    double v = brute(x, i + 1, used, u + ev.utility);
    for (uint32_t t = 0; t < x->p.n_tiers; t++)
      used[t] -= ev.used[t];
    best = v > best ? v : best;
  }
  return best;
}

static void test_greedy_vs_exact(void)
{
  const int N_INST = 3000;
  double worst[3] = {1, 1, 1}, sum[3] = {0, 0, 0}, ub_worst = 1;
  int count[3] = {0, 0, 0}, optimal[3] = {0, 0, 0};
  for (int it = 0; it < N_INST; it++) {
    inst x;
    inst_make(&x, 2 + rndn(6), 1 + rndn(4), 0.15 + 0.6 * rnd01());
    kv_policy_plan plan;
    CHECK_OK(kv_policy_rebalance(&x.p, x.c, x.n, &plan, NULL));
    check_plan(&x.p, x.c, x.n, &plan); /* never infeasible */
    kv_policy_place *ex = calloc(x.n, sizeof *ex);
    double eu, ub;
    CHECK_OK(kv_policy_exact(&x.p, x.c, x.n, 0, ex, &eu, NULL));
    kv_policy_eval ev;
    CHECK_OK(kv_policy_evaluate(&x.p, x.c, x.n, ex, &ev, NULL));
    CHECK(ev.over_capacity == 0);
    CHECK_NEAR(ev.utility, eu, 1e-9 * (fabs(eu) + 1));
    CHECK_OK(kv_policy_upper_bound(&x.p, x.c, x.n, &ub, NULL, NULL));
    double tol = 1e-9 * (fabs(eu) + 1);
    CHECK(plan.utility_after <= eu + tol); /* the greedy never beats the optimum */
    CHECK(eu <= ub + tol);                 /* which never beats the bound */
    if (x.n <= 4) {
      uint64_t used[KV_POLICY_MAX_TIERS] = {0};
      CHECK_NEAR(brute(&x, 0, used, 0), eu, tol);
    }
    /* the gap, as the fraction of what storing can gain over storing nothing */
    double none = 0;
    for (size_t i = 0; i < x.n; i++)
      none += kv_policy_utility(&x.p, &x.c[i], kv_policy_place_none());
    int r = x.p.rule;
    if (eu - none > 1e-9 * (fabs(eu) + 1)) {
      double g = (plan.utility_after - none) / (eu - none);
      CHECK(g <= 1 + 1e-9);
      worst[r] = g < worst[r] ? g : worst[r];
      ub_worst = (eu - none) / (ub - none) < ub_worst ? (eu - none) / (ub - none) : ub_worst;
      sum[r] += g;
      count[r]++;
    }
    optimal[r] += plan.utility_after >= eu - tol;
    free(ex);
    kv_policy_plan_free(&plan);
    inst_free(&x);
  }
  static const char *const rname[3] = {"least drop", "per byte", "refill (default)"};
  for (int r = 0; r < 3; r++)
    printf("greedy vs exact (%s, %d instances with something to gain): optimal in %d, "
           "(greedy - none)/(exact - none) mean %.4f, worst %.4f\n",
           rname[r], count[r], optimal[r], sum[r] / count[r], worst[r]);
  printf("exact vs upper bound: worst (exact - none)/(bound - none) %.4f\n", ub_worst);
  CHECK(count[0] > N_INST / 5 && count[1] > N_INST / 5 && count[2] > N_INST / 5);
}

/* With one limited tier the bound is that tier's LP: above the optimum by less than one
 * context's utility spread (the fractional item). */
static void test_bound_single_tier(void)
{
  for (int it = 0; it < 300; it++) {
    inst x;
    inst_make(&x, 3 + rndn(5), 1 + rndn(4), 0.2 + 0.5 * rnd01());
    x.p.n_tiers = 1;
    x.tiers[0].flags = 0;
    x.tiers[0].capacity_bytes = x.tiers[0].capacity_bytes == KV_POLICY_UNLIMITED
                                    ? 5 * GB : x.tiers[0].capacity_bytes;
    kv_policy_place ex[8];
    double eu, ub, lam;
    CHECK_OK(kv_policy_exact(&x.p, x.c, x.n, 0, ex, &eu, NULL));
    CHECK_OK(kv_policy_upper_bound(&x.p, x.c, x.n, &ub, &lam, NULL));
    double spread = 0;
    for (size_t i = 0; i < x.n; i++) {
      double hi = kv_policy_utility(&x.p, &x.c[i], kv_policy_place_none()), lo = hi;
      for (uint32_t o = 0; o < x.c[i].n_options; o++) {
        double u = kv_policy_utility(&x.p, &x.c[i], pl(0, (int32_t)o, 0));
        hi = u > hi ? u : hi;
        lo = u < lo ? u : lo;
      }
      spread = hi - lo > spread ? hi - lo : spread;
    }
    CHECK(lam >= 0);
    CHECK(ub >= eu - 1e-9 * (fabs(eu) + 1));
    CHECK(ub <= eu + spread + 1e-9 * (fabs(eu) + 1));
    inst_free(&x);
  }
}

/* Large random instances: capacity after every rebalance and every admit, plan consistency,
 * determinism. */
static void test_capacity_large(void)
{
  for (int it = 0; it < 12; it++) {
    inst x;
    size_t n = 200 + rndn(1800);
    inst_make(&x, n, 1 + rndn(24), 0.05 + 0.4 * rnd01());
    kv_policy_plan a, b;
    CHECK_OK(kv_policy_rebalance(&x.p, x.c, n, &a, NULL));
    check_plan(&x.p, x.c, n, &a);
    CHECK_OK(kv_policy_rebalance(&x.p, x.c, n, &b, NULL));
    CHECK(memcmp(a.place, b.place, n * sizeof *a.place) == 0);
    CHECK(a.n_moves == b.n_moves &&
          (a.n_moves == 0 || memcmp(a.moves, b.moves, a.n_moves * sizeof *a.moves) == 0));
    kv_policy_plan_free(&b);
    double ub;
    CHECK_OK(kv_policy_upper_bound(&x.p, x.c, n, &ub, NULL, NULL));
    CHECK(a.utility_after <= ub + 1e-9 * (fabs(ub) + 1));
    kv_policy_plan_free(&a);
    /* the put path: contexts arrive one by one; each plan applied before the next */
    for (size_t i = 0; i < n; i++)
      x.c[i].current = kv_policy_place_none();
    for (size_t i = 0; i < n; i += 1 + i / 50) {
      kv_policy_plan pa;
      CHECK_OK(kv_policy_admit(&x.p, x.c, i + 1, &i, 1, &pa, NULL));
      check_plan(&x.p, x.c, i + 1, &pa);
      for (size_t j = 0; j <= i; j++)
        x.c[j].current = pa.place[j];
      kv_policy_plan_free(&pa);
      if (i % 7 == 0) /* frequencies drift between puts */
        for (size_t j = 0; j <= i; j++)
          x.c[j].frequency = kv_policy_decay(x.c[j].frequency, 1, 20, rndn(10) == 0);
    }
    /* a rebalance from that state, then a capacity that shrinks: admit repairs it */
    CHECK_OK(kv_policy_rebalance(&x.p, x.c, n, &a, NULL));
    check_plan(&x.p, x.c, n, &a);
    for (size_t j = 0; j < n; j++)
      x.c[j].current = a.place[j];
    kv_policy_plan_free(&a);
    for (uint32_t t = 0; t < x.p.n_tiers; t++)
      if (x.tiers[t].capacity_bytes != KV_POLICY_UNLIMITED)
        x.tiers[t].capacity_bytes = x.tiers[t].capacity_bytes / 3 + 1;
    CHECK_OK(kv_policy_admit(&x.p, x.c, n, NULL, 0, &a, NULL));
    check_plan(&x.p, x.c, n, &a);
    kv_policy_plan_free(&a);
    inst_free(&x);
  }
}

/* The greedy built with POL_FORCE_SCAN under other names (policy/meson.build): every
 * operation found by scanning every option, as Algorithm 1 reads. */
kvdb_status kv_policy_scan_rebalance(const kv_policy_params *p, const kv_policy_context *ctx,
                                     size_t n, kv_policy_plan *plan, kv_policy_err *err);
kvdb_status kv_policy_scan_admit(const kv_policy_params *p, const kv_policy_context *ctx, size_t n,
                                 const size_t *incoming, size_t n_incoming, kv_policy_plan *plan,
                                 kv_policy_err *err);

/* The O(1) steps (prefix bests, convex hulls) choose exactly what a full scan chooses: random
 * instances with repeated sizes, decoded tiers, both rules, rebalance and admit. */
static void test_fast_equals_scan(void)
{
  int n_inst = 600;
  for (int it = 0; it < n_inst; it++) {
    inst x;
    size_t n = 5 + rndn(300);
    inst_make(&x, n, 1 + rndn(20), 0.05 + 0.4 * rnd01());
    for (size_t i = 0; i < n; i++) /* sizes that repeat: ties of the byte order */
      for (uint32_t j = 1; j < x.c[i].n_options; j++)
        if (rndn(5) == 0)
          ((kv_policy_option *)x.c[i].options)[j].bytes = x.c[i].options[j - 1].bytes;
    kv_policy_plan a, b;
    CHECK_OK(kv_policy_rebalance(&x.p, x.c, n, &a, NULL));
    CHECK_OK(kv_policy_scan_rebalance(&x.p, x.c, n, &b, NULL));
    CHECK(memcmp(a.place, b.place, n * sizeof *a.place) == 0);
    CHECK(a.n_recompress == b.n_recompress && a.n_evict == b.n_evict);
    for (size_t i = 0; i < n; i++)
      x.c[i].current = a.place[i];
    kv_policy_plan_free(&a);
    kv_policy_plan_free(&b);
    size_t in = rndn((uint32_t)n);
    x.c[in].current = kv_policy_place_none();
    CHECK_OK(kv_policy_admit(&x.p, x.c, n, &in, 1, &a, NULL));
    CHECK_OK(kv_policy_scan_admit(&x.p, x.c, n, &in, 1, &b, NULL));
    CHECK(memcmp(a.place, b.place, n * sizeof *a.place) == 0);
    kv_policy_plan_free(&a);
    kv_policy_plan_free(&b);
    inst_free(&x);
  }
  printf("fast steps = full scan on %d random instances\n", n_inst);
}

/* A workspace reused across calls of growing and shrinking sizes gives the same plans. */
static void test_workspace(void)
{
  kv_policy_ws *ws = kv_policy_ws_create();
  CHECK(ws != NULL);
  for (int it = 0; it < 40; it++) {
    inst x;
    size_t n = 1 + rndn(it % 2 ? 2000 : 50);
    inst_make(&x, n, 1 + rndn(24), 0.05 + 0.4 * rnd01());
    kv_policy_plan a, b;
    CHECK_OK(kv_policy_rebalance(&x.p, x.c, n, &a, NULL));
    CHECK_OK(kv_policy_rebalance_ws(ws, &x.p, x.c, n, &b, NULL));
    CHECK(memcmp(a.place, b.place, n * sizeof *a.place) == 0);
    CHECK(a.n_moves == b.n_moves &&
          (a.n_moves == 0 || memcmp(a.moves, b.moves, a.n_moves * sizeof *a.moves) == 0));
    for (size_t i = 0; i < n; i++)
      x.c[i].current = a.place[i];
    kv_policy_plan_free(&a);
    kv_policy_plan_free(&b);
    size_t in = rndn((uint32_t)n);
    x.c[in].current = kv_policy_place_none();
    CHECK_OK(kv_policy_admit(&x.p, x.c, n, &in, 1, &a, NULL));
    CHECK_OK(kv_policy_admit_ws(ws, &x.p, x.c, n, &in, 1, &b, NULL));
    CHECK(memcmp(a.place, b.place, n * sizeof *a.place) == 0);
    check_plan(&x.p, x.c, n, &b);
    kv_policy_plan_free(&a);
    kv_policy_plan_free(&b);
    inst_free(&x);
  }
  kv_policy_ws_free(ws);
  kv_policy_ws_free(NULL);
}

/* ---- bad input ------------------------------------------------------------------------------ */

static void expect_invalid(const kv_policy_params *p, const kv_policy_context *c, size_t n,
                           const char *sub)
{
  kv_policy_err err;
  memset(&err, 0, sizeof err);
  kv_policy_plan plan;
  memset(&plan, 0x5a, sizeof plan);
  kvdb_status rc = kv_policy_rebalance(p, c, n, &plan, &err);
  if (rc != KVDB_INVALID || err.status != KVDB_INVALID || strstr(err.msg, sub) == NULL) {
    fprintf(stderr, "expected KVDB_INVALID with '%s', got %d '%s'\n", sub, (int)rc, err.msg);
    abort();
  }
  CHECK(plan.place == NULL && plan.moves == NULL && plan.n_moves == 0);
  double u = 0, ub = 0;
  kv_policy_place ex[4];
  CHECK(kv_policy_exact(p, c, n, 0, ex, &u, NULL) == KVDB_INVALID);
  CHECK(kv_policy_upper_bound(p, c, n, &ub, NULL, NULL) == KVDB_INVALID);
  CHECK(kv_policy_check(p, c, n, NULL) == KVDB_INVALID);
}

static void test_bad_input(void)
{
  kv_policy_tier t[2] = {tier("dram", 8 * GB, 20e9, 0, KV_POLICY_TIER_INCLUSIVE),
                         tier("ssd", 16 * GB, 2e9, 0, 0)};
  kv_policy_params p = base_params(t, 2);
  kv_policy_option o[2] = {opt(4 * GB, 1.0), opt(GB, 0.9)};
  kv_policy_context c[2] = {ctxof(o, 2, 4 * GB, 1000, 1), ctxof(o, 2, 4 * GB, 1000, 1)};
  CHECK_OK(kv_policy_check(&p, c, 2, NULL));

  c[1].n_options = 0;
  expect_invalid(&p, c, 2, "context 1 has no options");
  c[1].n_options = 2;
  c[1].options = NULL;
  expect_invalid(&p, c, 2, "context 1 has no options");
  c[1].options = o;
  o[1].quality = NAN;
  expect_invalid(&p, c, 2, "context 0 option 1: quality nan is not in [0, 1]");
  o[1].quality = 1.5;
  expect_invalid(&p, c, 2, "quality 1.5 is not in [0, 1]");
  o[1].quality = 0.9;
  o[1].bytes = 0;
  expect_invalid(&p, c, 2, "option 1: bytes is 0");
  o[1].bytes = GB;
  o[1].decode_bps = -1;
  expect_invalid(&p, c, 2, "decode_bps -1");
  o[1].decode_bps = 0;
  c[0].frequency = NAN;
  expect_invalid(&p, c, 2, "context 0: frequency nan");
  c[0].frequency = -1;
  expect_invalid(&p, c, 2, "frequency -1");
  c[0].frequency = 1;
  c[0].raw_bytes = 0;
  expect_invalid(&p, c, 2, "raw_bytes is 0");
  c[0].raw_bytes = 4 * GB;
  c[0].n_tokens = 0;
  expect_invalid(&p, c, 2, "n_tokens is 0");
  c[0].n_tokens = 1000;

  t[1].capacity_bytes = 0;
  expect_invalid(&p, c, 2, "tier 1 'ssd' has zero capacity");
  t[1].capacity_bytes = 16 * GB;
  t[0].read_bps = 0;
  expect_invalid(&p, c, 2, "tier 0 'dram': read bandwidth 0");
  t[0].read_bps = NAN;
  expect_invalid(&p, c, 2, "read bandwidth nan");
  t[0].read_bps = 20e9;
  t[1].latency_s = -1;
  expect_invalid(&p, c, 2, "latency -1");
  t[1].latency_s = 0;
  t[1].flags = KV_POLICY_TIER_INCLUSIVE;
  expect_invalid(&p, c, 2, "only tier 0 may be inclusive");
  t[1].flags = 0;
  p.n_tiers = 1;
  expect_invalid(&p, c, 2, "no tier below it");
  p.n_tiers = 0;
  expect_invalid(&p, c, 2, "n_tiers 0");
  p.n_tiers = 5;
  expect_invalid(&p, c, 2, "n_tiers 5");
  p.n_tiers = 2;
  p.alpha = NAN;
  expect_invalid(&p, c, 2, "alpha nan");
  p.alpha = 10;
  p.prefill_tokens_per_s = 0;
  expect_invalid(&p, c, 2, "prefill_tokens_per_s 0");
  p.prefill_tokens_per_s = 1000;
  p.recompute_quality = 2;
  expect_invalid(&p, c, 2, "recompute_quality 2");
  p.recompute_quality = 1;
  p.decode_bps[2] = INFINITY;
  expect_invalid(&p, c, 2, "decode_bps[2] inf");
  p.decode_bps[2] = 0;
  p.rule = (kv_policy_rule)7;
  expect_invalid(&p, c, 2, "unknown rule 7");
  p.rule = KV_POLICY_LEAST_DROP;

  c[1].current = pl(0, 0, 0); /* the inclusive tier is not a persistent tier */
  expect_invalid(&p, c, 2, "context 1: current placement tier 0 is not a persistent tier");
  c[1].current = pl(1, 2, 0);
  expect_invalid(&p, c, 2, "current placement option 2 is not in 0..1");
  c[1].current = pl(KV_POLICY_NONE, KV_POLICY_NONE, 1);
  expect_invalid(&p, c, 2, "not stored but marked cached");
  c[1].current = pl(1, 0, 1);
  t[0].flags = 0;
  expect_invalid(&p, c, 2, "tier 0 is not inclusive");
  t[0].flags = KV_POLICY_TIER_INCLUSIVE;
  CHECK_OK(kv_policy_check(&p, c, 2, NULL));

  kv_policy_err err;
  kv_policy_plan plan;
  size_t in[2] = {1, 1};
  CHECK(kv_policy_admit(&p, c, 2, in, 2, &plan, &err) == KVDB_INVALID);
  CHECK(strstr(err.msg, "listed twice") != NULL);
  in[1] = 2;
  CHECK(kv_policy_admit(&p, c, 2, in, 2, &plan, &err) == KVDB_INVALID);
  CHECK(strstr(err.msg, "incoming[1] = 2 is not a context") != NULL);
  CHECK(kv_policy_admit(&p, c, 2, NULL, 1, &plan, &err) == KVDB_INVALID);
  CHECK(kv_policy_rebalance(&p, c, 2, NULL, &err) == KVDB_INVALID);
  CHECK(kv_policy_rebalance(NULL, c, 2, &plan, &err) == KVDB_INVALID);
  CHECK(kv_policy_rebalance(&p, NULL, 2, &plan, &err) == KVDB_INVALID);
  CHECK_OK(kv_policy_rebalance(&p, NULL, 0, &plan, &err)); /* nothing to place */
  CHECK(plan.n_moves == 0 && plan.n_contexts == 0);
  kv_policy_plan_free(&plan);
  kv_policy_plan_free(&plan); /* twice is fine */
  kv_policy_plan_free(NULL);

  kv_policy_place bad[2] = {pl(1, 0, 0), pl(3, 0, 0)};
  kv_policy_eval ev;
  CHECK(kv_policy_evaluate(&p, c, 2, bad, &ev, &err) == KVDB_INVALID);
  CHECK(strstr(err.msg, "context 1: placement tier 3") != NULL);

  /* the exact solver refuses what it cannot finish */
  kv_policy_context many[40];
  for (int i = 0; i < 40; i++)
    many[i] = ctxof(o, 2, 4 * GB, 1000, 1);
  kv_policy_place ex[40];
  double u;
  CHECK(kv_policy_exact(&p, many, 40, 0, ex, &u, &err) == KVDB_UNSUPPORTED);
  CHECK(strstr(err.msg, "at most 32") != NULL);
  t[0].capacity_bytes = 30 * GB;
  t[1].capacity_bytes = 50 * GB;
  CHECK(kv_policy_exact(&p, many, 20, 10, ex, &u, &err) == KVDB_UNSUPPORTED);
  CHECK(strstr(err.msg, "node budget") != NULL);
}

/* Which stored config can become which (kv_policy_config_*): the rule kvdb_recompress, the
 * placer and kvdb-bench policy apply. */
static void test_config_rules(void)
{
  const kvdb_config raw = {KVDB_METHOD_RAW, 0, 0, 0, 0, 0, 0};
  const kvdb_config lossless = {KVDB_METHOD_LOSSLESS, 0, 0, 3, 0, 0, 0};
  const kvdb_config int8 = {KVDB_METHOD_QUANT, 8, 0, 0, 0, 0, 0};
  const kvdb_config int4 = {KVDB_METHOD_QUANT, 4, 0, 0, 0, 0, 0};
  const kvdb_config int4_g64 = {KVDB_METHOD_QUANT, 4, 0, 0, 0, 64, 0};
  const kvdb_config drop50 = {KVDB_METHOD_DROP, 0, KVDB_DROP_KNORM, 0, 500, 0, 0};
  const kvdb_config drop50_int4 = {KVDB_METHOD_DROP, 4, KVDB_DROP_KNORM, 0, 500, 0, 0};
  const kvdb_config drop50_int8 = {KVDB_METHOD_DROP, 8, KVDB_DROP_KNORM, 0, 500, 0, 0};
  const kvdb_config drop30 = {KVDB_METHOD_DROP, 0, KVDB_DROP_KNORM, 0, 300, 0, 0};

  CHECK(kv_policy_config_exact(&raw) && kv_policy_config_exact(&lossless));
  CHECK(!kv_policy_config_exact(&int8) && !kv_policy_config_exact(&drop50));
  CHECK(kv_policy_config_equal(&int4, &int4) && !kv_policy_config_equal(&int4, &int4_g64));
  CHECK(!kv_policy_config_equal(&drop50, &drop30) && !kv_policy_config_equal(&raw, &lossless));
  /* exact reaches everything */
  CHECK(kv_policy_config_reachable(&raw, &lossless) && kv_policy_config_reachable(&lossless, &raw));
  CHECK(kv_policy_config_reachable(&lossless, &int4) && kv_policy_config_reachable(&raw, &drop30));
  /* dropped tokens do not come back: only itself */
  CHECK(kv_policy_config_reachable(&drop50, &drop50));
  CHECK(!kv_policy_config_reachable(&drop50, &drop30));
  CHECK(!kv_policy_config_reachable(&drop50, &raw));
  CHECK(!kv_policy_config_reachable(&drop50, &drop50_int4));
  /* quantized: coarser or equal bits, with or without dropping; never exact again */
  CHECK(kv_policy_config_reachable(&int8, &int4) && kv_policy_config_reachable(&int4, &int4_g64));
  CHECK(!kv_policy_config_reachable(&int4, &int8) && !kv_policy_config_reachable(&int8, &lossless));
  CHECK(kv_policy_config_reachable(&int8, &drop50_int4));
  CHECK(!kv_policy_config_reachable(&int4, &drop50_int8));
  CHECK(kv_policy_config_reachable(&int4, &drop50)); /* kept rows stay the quantized ones */
}

int main(void)
{
  setvbuf(stdout, NULL, _IOLBF, 0);
  const char *s = getenv("KVDB_SEED");
  rng_state = s != NULL ? strtoull(s, NULL, 0) : 1;
  printf("seed %llu\n", (unsigned long long)rng_state);
  test_model();
  test_config_rules();
  test_figure2();
  test_alg1_single_tier();
  test_alg1_recompress_then_evict();
  test_alg1_cascade();
  test_alg1_inclusive_and_admit();
  test_bad_input();
  test_bound_single_tier();
  test_greedy_vs_exact();
  test_capacity_large();
  test_fast_equals_scan();
  test_workspace();
  printf("policy: all tests passed\n");
  return 0;
}
