/* SPDX-License-Identifier: MIT */
/*
 * tests/unit/test_policy_refill.c — the default placement rule (policy.h THE DEFAULT RULE,
 * KV_POLICY_REFILL) on the cases each of its parts exists for, computed by hand: the per-byte
 * trap (the best-single-context guard), the coarse tier a cascade leaves half empty (the
 * refill), the slow top tier (a new context starts on the tier where it is worth most, where
 * Algorithm 1 as written drops it), the tie a cascade cannot see past (re-insertion); then on
 * random small instances against the exact optimum: never above it, never below what storing
 * nothing gives, never over a capacity, deterministic, and its share of the optimum's gain
 * (min and p5 are checked against floors under the figures measured when it was written; the
 * figures themselves are `kvdb-bench policy`'s, part 7).
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
      fprintf(stderr, "%s:%d: %s = %.12g, expected %s = %.12g\n", __FILE__, __LINE__, #a, a_,     \
              #b, b_);                                                                             \
      abort();                                                                                     \
    }                                                                                              \
  } while (0)

#define GB 1000000000ull

static uint64_t rng_state;
static uint64_t rnd(void)
{
  uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
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

static kv_policy_option opt(uint64_t bytes, double q)
{
  kv_policy_option o;
  memset(&o, 0, sizeof o);
  o.bytes = bytes;
  o.quality = q;
  return o;
}

static kv_policy_context ctxof(const kv_policy_option *o, uint32_t n, uint64_t tokens, double f)
{
  kv_policy_context c;
  memset(&c, 0, sizeof c);
  c.options = o;
  c.n_options = n;
  c.raw_bytes = o[0].bytes;
  c.n_tokens = tokens;
  c.frequency = f;
  c.current = kv_policy_place_none();
  return c;
}

static int place_is(kv_policy_place a, int32_t t, int32_t o, uint32_t cached)
{
  if (t == KV_POLICY_NONE)
    return a.tier == KV_POLICY_NONE;
  return a.tier == t && a.option == o && a.cached == cached;
}

/* One tier of 10 GB at 10 GB/s, prefill 1000 tokens/s, alpha 0 (quality does not count). */
static kv_policy_params one_tier(kv_policy_tier *t, kv_policy_rule rule)
{
  *t = (kv_policy_tier){"t0", 10 * GB, 10e9, 0, 0};
  kv_policy_params p;
  kv_policy_params_init(&p);
  p.tiers = t;
  p.n_tiers = 1;
  p.alpha = 0;
  p.prefill_tokens_per_s = 1000;
  p.rule = rule;
  return p;
}

static double rebalance_u(const kv_policy_params *p, const kv_policy_context *c, size_t n,
                          kv_policy_place *out)
{
  kv_policy_plan plan;
  CHECK_OK(kv_policy_rebalance(p, c, n, &plan, NULL));
  for (uint32_t t = 0; t < p->n_tiers; t++)
    CHECK(plan.used_after[t] <= p->tiers[t].capacity_bytes);
  double u = plan.utility_after;
  for (size_t i = 0; out != NULL && i < n; i++)
    out[i] = plan.place[i];
  kv_policy_plan_free(&plan);
  return u;
}

/*
 * The per-byte trap. A: 1 GB, 2000 tokens (stored 0.1 s, recomputed 2 s: gains 1.9); B: 10 GB,
 * 10000 tokens (1 s vs 10 s: gains 9). Both do not fit. Per byte, evicting B costs 0.9 per GB,
 * A 1.9: B leaves, the tier keeps A (gain 1.9 of 9). The guard places B alone (the single
 * context of highest gain) and refills around it: nothing else fits; 9 > 1.9 wins.
 */
static void test_trap(void)
{
  kv_policy_tier t;
  kv_policy_option oa[1] = {opt(1 * GB, 1)}, ob[1] = {opt(10 * GB, 1)};
  kv_policy_context c[2] = {ctxof(oa, 1, 2000, 1), ctxof(ob, 1, 10000, 1)};
  kv_policy_place pl[2];
  kv_policy_params p = one_tier(&t, KV_POLICY_PER_BYTE);
  double u_pb = rebalance_u(&p, c, 2, pl);
  CHECK(place_is(pl[0], 0, 0, 0) && place_is(pl[1], KV_POLICY_NONE, 0, 0));
  CHECK_NEAR(u_pb, -0.1 - 10, 1e-9);
  p = one_tier(&t, KV_POLICY_REFILL);
  double u = rebalance_u(&p, c, 2, pl);
  CHECK(place_is(pl[0], KV_POLICY_NONE, 0, 0) && place_is(pl[1], 0, 0, 0));
  CHECK_NEAR(u, -2 - 1, 1e-9);
  printf("trap: per byte keeps the dense 1 GB context (U %.1f), the default the 10 GB one "
         "(U %.1f, the optimum)\n", u_pb, u);
}

/*
 * The coarse tier. A 6 GB (gains 6: 1 per GB), B 5 GB (gains 4: 0.8), C 4 GB (gains 2.4: 0.6),
 * 10 GB. Per byte evicts C then B: A alone, 4 GB empty. The refill puts C back: A + C gains
 * 8.4, the optimum (A + B does not fit, B + C gains 6.4).
 */
static void test_refill(void)
{
  kv_policy_tier t;
  /* gain = recompute - load = tokens / 1000 - bytes / 10e9 */
  kv_policy_option oa[1] = {opt(6 * GB, 1)}, ob[1] = {opt(5 * GB, 1)}, oc[1] = {opt(4 * GB, 1)};
  kv_policy_context c[3] = {ctxof(oa, 1, 6600, 1), ctxof(ob, 1, 4500, 1), ctxof(oc, 1, 2800, 1)};
  kv_policy_place pl[3];
  kv_policy_params p = one_tier(&t, KV_POLICY_PER_BYTE);
  rebalance_u(&p, c, 3, pl);
  CHECK(place_is(pl[0], 0, 0, 0) && place_is(pl[1], KV_POLICY_NONE, 0, 0) &&
        place_is(pl[2], KV_POLICY_NONE, 0, 0));
  p = one_tier(&t, KV_POLICY_REFILL);
  double u = rebalance_u(&p, c, 3, pl);
  CHECK(place_is(pl[0], 0, 0, 0) && place_is(pl[1], KV_POLICY_NONE, 0, 0) &&
        place_is(pl[2], 0, 0, 0));
  kv_policy_place ex[3];
  double eu;
  CHECK_OK(kv_policy_exact(&p, c, 3, 0, ex, &eu, NULL));
  CHECK_NEAR(u, eu, 1e-9);
  printf("refill: per byte leaves 4 of 10 GB empty; the default refills it (the optimum)\n");
}

/*
 * The slow top tier (issue 17 note a): the DRAM probe measured 1 MB/s, so serving a 1 GB
 * context from DRAM takes 1000 s, more than recomputing it (10 s); the SSD serves it in 0.5 s.
 * Algorithm 1 as written starts a new context on the top tier, finds recomputing better there
 * and drops it; the default starts it on the SSD. Both through kv_policy_admit, as a put does,
 * and with unlimited tiers, as the engine's first step of a put does.
 */
static void test_slow_top_tier(void)
{
  kv_policy_tier t[2] = {{"dram", KV_POLICY_UNLIMITED, 1e6, 0, KV_POLICY_TIER_INCLUSIVE},
                         {"ssd", KV_POLICY_UNLIMITED, 2e9, 0, 0}};
  kv_policy_params p;
  kv_policy_params_init(&p);
  p.tiers = t;
  p.n_tiers = 2;
  p.prefill_tokens_per_s = 1000;
  kv_policy_option o[1] = {opt(1 * GB, 1)};
  kv_policy_context c[1] = {ctxof(o, 1, 10000, 1)};
  size_t in = 0;
  kv_policy_plan plan;
  p.rule = KV_POLICY_LEAST_DROP;
  CHECK_OK(kv_policy_admit(&p, c, 1, &in, 1, &plan, NULL));
  CHECK(place_is(plan.place[0], KV_POLICY_NONE, 0, 0));
  kv_policy_plan_free(&plan);
  p.rule = KV_POLICY_REFILL;
  CHECK_OK(kv_policy_admit(&p, c, 1, &in, 1, &plan, NULL));
  CHECK(place_is(plan.place[0], 1, 0, 0));
  CHECK_NEAR(plan.utility_after, 1 - 0.5, 1e-9);
  kv_policy_plan_free(&plan);
  /* a top tier slower than the SSD but faster than recomputing: the SSD serves it best */
  t[0].read_bps = 1e9;
  CHECK_OK(kv_policy_admit(&p, c, 1, &in, 1, &plan, NULL));
  CHECK(place_is(plan.place[0], 1, 0, 0));
  kv_policy_plan_free(&plan);
  p.rule = KV_POLICY_LEAST_DROP;
  CHECK_OK(kv_policy_admit(&p, c, 1, &in, 1, &plan, NULL));
  CHECK(place_is(plan.place[0], 1, 0, 1)); /* as written: cached in the slower DRAM */
  kv_policy_plan_free(&plan);
  printf("slow top tier: least drop drops (or caches in the slow tier), the default serves "
         "from the SSD\n");
}

/* ---- random small instances against the exact optimum ------------------------------------ */

typedef struct inst {
  kv_policy_tier tiers[3];
  kv_policy_params p;
  kv_policy_option opts[8 * 6];
  kv_policy_context c[8];
  size_t n;
} inst;

static void inst_make(inst *x)
{
  memset(x, 0, sizeof *x);
  x->n = 2 + rndn(7);
  uint32_t T = 1 + rndn(3);
  int incl = T >= 2 && rndn(2) == 0;
  uint64_t total = 0;
  for (size_t i = 0; i < x->n; i++) {
    uint32_t k = 1 + rndn(6);
    uint64_t raw = (uint64_t)(1 + rndn(64)) * (GB / 16);
    kv_policy_option *o = &x->opts[i * 6];
    for (uint32_t j = 0; j < k; j++) {
      double frac = j == 0 ? 1.0 : 0.05 + 0.9 * rnd01();
      o[j] = opt((uint64_t)((double)raw * frac) + 1, j == 0 ? 1.0 : 1 - 0.3 * rnd01() * rnd01());
      o[j].config.method = (uint8_t)rndn(4);
    }
    x->c[i] = ctxof(o, k, 1000 + rndn(40000), rndn(5) == 0 ? 0.0 : 5 * rnd01());
    total += raw;
  }
  double bw = 20e9;
  for (uint32_t t = 0; t < T; t++) {
    uint64_t cap = (uint64_t)((double)total * (0.05 + 0.6 * rnd01())) + 1;
    uint32_t flags = t == 0 && incl ? KV_POLICY_TIER_INCLUSIVE : 0;
    if (t == 0 && rndn(4) == 0) {
      flags |= KV_POLICY_TIER_DECODED;
      bw = rndn(2) ? bw : 1e8; /* sometimes a slow top tier */
    }
    x->tiers[t] = (kv_policy_tier){NULL, cap, bw, rndn(2) ? 0 : 1e-4 * rnd01(), flags};
    bw /= 2 + 8 * rnd01();
  }
  kv_policy_params_init(&x->p);
  x->p.tiers = x->tiers;
  x->p.n_tiers = T;
  x->p.alpha = pow(10, -2 + 4 * rnd01());
  x->p.prefill_tokens_per_s = 2000 + 20000 * rnd01();
  x->p.decode_bps[KVDB_METHOD_QUANT] = rndn(2) ? 0 : 8e9;
}

static int cmp_d(const void *a, const void *b)
{
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static void test_vs_exact(void)
{
  enum { N = 3000 };
  static double share[N];
  size_t ns = 0, better_than_pb = 0, worse_than_pb = 0;
  for (int it = 0; it < N; it++) {
    inst x;
    inst_make(&x);
    kv_policy_place ex[8], pl[8], pl2[8];
    double eu;
    CHECK_OK(kv_policy_exact(&x.p, x.c, x.n, 0, ex, &eu, NULL));
    double u = rebalance_u(&x.p, x.c, x.n, pl);
    double u2 = rebalance_u(&x.p, x.c, x.n, pl2);
    CHECK(u == u2 && memcmp(pl, pl2, sizeof pl[0] * x.n) == 0); /* deterministic */
    double none = 0, tol = 1e-9 * (fabs(eu) + 1);
    for (size_t i = 0; i < x.n; i++)
      none += kv_policy_utility(&x.p, &x.c[i], kv_policy_place_none());
    CHECK(u <= eu + tol);
    CHECK(u >= none - tol); /* never worse than storing nothing */
    kv_policy_params pb = x.p;
    pb.rule = KV_POLICY_PER_BYTE;
    double upb = rebalance_u(&pb, x.c, x.n, NULL);
    better_than_pb += u > upb + tol;
    worse_than_pb += u < upb - tol;
    if (eu - none > tol)
      share[ns++] = (u - none) / (eu - none);
  }
  qsort(share, ns, sizeof *share, cmp_d);
  double mn = share[0], p5 = share[ns / 20], med = share[ns / 2];
  printf("default rule vs exact, %zu instances with something to gain: min %.4f, p5 %.4f, "
         "median %.4f; above the per-byte greedy in %zu, below it in %zu of %d\n",
         ns, mn, p5, med, better_than_pb, worse_than_pb, N);
  CHECK(ns > N / 2);
  /* the exchange (greedy.c (f)) lifted the min from 0.827 to 0.919 on these instances (gcc;
   * 0.889 built by clang, whose rounding changes a few instances); the search (g), which
   * finishes on every instance this small, to 0.9999 (it keeps only placements worth more than
   * the greedy's by 1e-4 of the gain) */
  CHECK(p5 >= 0.9999 && mn >= 0.9998 && med >= 0.9999);
  CHECK(better_than_pb > 10 * worse_than_pb);
}

/*
 * Four changes through a loss (issue 17: the default rule's worst instance of `kvdb-bench
 * policy` part 7 had this shape: one coarse tier, one large context where three smaller ones
 * do better). One tier of 10 GB; A 9 GB gains 5.0, B, C, D 3.3 GB gain 1.8 each, E 2 GB gains
 * 1.2 (gain = tokens / 1000 - bytes / 10e9). The optimum stores B, C, D (5.4). Per byte, the
 * cascade evicts D, C, B, then A: E alone (1.2); per drop the small ones leave: A alone (5.0).
 * The default's guard keeps A alone (its trial of B alone refills E first, the densest, then
 * C: 4.8) and the exchange's steps of one, two or three changes from A all lose (A out, B and C
 * in: 3.6): only four changes (A out, B, C, D in) win.
 * Before the search (greedy.c (g)) the default rule kept A: 5.0 / 5.4 = 0.926 of the optimum
 * (checked by building greedy.c with -DPOL_SEARCH_MAX=0); the search reaches the optimum.
 */
static void test_four_changes(void)
{
  kv_policy_tier t;
  kv_policy_option oa[1] = {opt(9 * GB, 1)}, ob[1] = {opt(33 * GB / 10, 1)},
                   oc[1] = {opt(33 * GB / 10, 1)}, od[1] = {opt(33 * GB / 10, 1)},
                   oe[1] = {opt(2 * GB, 1)};
  kv_policy_context c[5] = {ctxof(oa, 1, 5900, 1), ctxof(ob, 1, 2130, 1), ctxof(oc, 1, 2130, 1),
                            ctxof(od, 1, 2130, 1), ctxof(oe, 1, 1400, 1)};
  kv_policy_place pl[5], ex[5];
  double eu;
  kv_policy_params p = one_tier(&t, KV_POLICY_REFILL);
  CHECK_OK(kv_policy_exact(&p, c, 5, 0, ex, &eu, NULL));
  CHECK(place_is(ex[0], KV_POLICY_NONE, 0, 0) && place_is(ex[1], 0, 0, 0) &&
        place_is(ex[2], 0, 0, 0) && place_is(ex[3], 0, 0, 0) &&
        place_is(ex[4], KV_POLICY_NONE, 0, 0));
  double none = -5.9 - 3 * 2.13 - 1.4;
  CHECK_NEAR(eu - none, 5.4, 1e-9);
  double u = rebalance_u(&p, c, 5, pl);
  CHECK(place_is(pl[0], KV_POLICY_NONE, 0, 0) && place_is(pl[1], 0, 0, 0) &&
        place_is(pl[2], 0, 0, 0) && place_is(pl[3], 0, 0, 0) &&
        place_is(pl[4], KV_POLICY_NONE, 0, 0));
  CHECK_NEAR(u, eu, 1e-9);
  kv_policy_params q = one_tier(&t, KV_POLICY_LEAST_DROP);
  CHECK_NEAR(rebalance_u(&q, c, 5, NULL) - none, 5.0, 1e-9);
  q = one_tier(&t, KV_POLICY_PER_BYTE);
  double upb = rebalance_u(&q, c, 5, NULL);
  CHECK_NEAR(upb - none, 1.2, 1e-9);
  printf("four changes: per byte gains %.2f, the default %.2f (the optimum; 5.00 before the "
         "search)\n", upb - none, u - none);
}

/*
 * Stability: two contexts of one size on two tiers that hold one each, the more valuable on
 * the slower tier by a hair (frequencies 1 and 1 + 1e-9): the default's rebalance keeps them
 * where they are (the swap gains less than the rule's margin; it used to swap them on every
 * rebalance: kvdb-admin rebalance of a rebalanced store planned moves). A real difference
 * (frequency 2) is still acted on.
 */
static void test_stable(void)
{
  kv_policy_tier t[2] = {{"fast", 5 * GB, 10e9, 0, 0}, {"slow", 5 * GB, 1e9, 0, 0}};
  kv_policy_option o[1] = {opt(5 * GB, 1)};
  kv_policy_params p;
  kv_policy_params_init(&p);
  p.tiers = t;
  p.n_tiers = 2;
  p.alpha = 0;
  p.prefill_tokens_per_s = 1000;
  p.rule = KV_POLICY_REFILL;
  for (int big = 0; big < 2; big++) {
    kv_policy_context c[2] = {ctxof(o, 1, 100000, 1), ctxof(o, 1, 100000, big ? 2 : 1 + 1e-9)};
    c[0].current = (kv_policy_place){0, 0, 0};
    c[1].current = (kv_policy_place){1, 0, 0};
    kv_policy_plan plan;
    CHECK_OK(kv_policy_rebalance(&p, c, 2, &plan, NULL));
    if (big) {
      CHECK(plan.n_moves == 2 && place_is(plan.place[1], 0, 0, 0) &&
            place_is(plan.place[0], 1, 0, 0));
      CHECK(plan.utility_after > plan.utility_before);
    } else {
      CHECK(plan.n_moves == 0 && place_is(plan.place[0], 0, 0, 0) &&
            place_is(plan.place[1], 1, 0, 0));
      CHECK(plan.utility_after == plan.utility_before);
      CHECK(plan.used_after[0] == plan.used_before[0] && plan.used_after[1] == plan.used_before[1]);
    }
    kv_policy_plan_free(&plan);
  }
  printf("stable: a near-tie is not swapped; a real gain is\n");
  /* the same swap when storing nothing is almost as good as the store (a prefill barely slower
   * than the slow tier, utilities dominated by alpha x quality): the store's gain over nothing
   * is small, so a margin of that gain alone let a swap of 2e-5 of the moved contexts'
   * utilities through (admin-place's flake); of their utilities, it does not */
  p.alpha = 100;
  p.prefill_tokens_per_s = 100000 / 5.01;
  for (int big = 0; big < 2; big++) {
    kv_policy_context c[2] = {ctxof(o, 1, 100000, 1), ctxof(o, 1, 100000, big ? 2 : 1 + 1e-3)};
    c[0].current = (kv_policy_place){0, 0, 0};
    c[1].current = (kv_policy_place){1, 0, 0};
    kv_policy_plan plan;
    CHECK_OK(kv_policy_rebalance(&p, c, 2, &plan, NULL));
    if (big) {
      CHECK(plan.n_moves == 2 && place_is(plan.place[1], 0, 0, 0));
    } else {
      double u_none = kv_policy_utility(&p, &c[0], kv_policy_place_none()) +
                      kv_policy_utility(&p, &c[1], kv_policy_place_none());
      /* the case the old margin let through: the swap gains more than 1e-4 of the gain
       * over nothing (0.0045 against 4.5), less than 1e-4 of the contexts' utilities (194.6) */
      kv_policy_place sw0 = {1, 0, 0}, sw1 = {0, 0, 0};
      double swapped = kv_policy_utility(&p, &c[0], sw0) + kv_policy_utility(&p, &c[1], sw1);
      CHECK(swapped - plan.utility_before > 1e-4 * (plan.utility_before - u_none));
      CHECK(swapped - plan.utility_before < 1e-4 * plan.utility_before);
      CHECK(plan.n_moves == 0 && place_is(plan.place[0], 0, 0, 0) &&
            place_is(plan.place[1], 1, 0, 0));
    }
    kv_policy_plan_free(&plan);
  }
  printf("stable: also when storing nothing is nearly as good (utilities of alpha x quality)\n");
}

int main(void)
{
  const char *s = getenv("KVDB_SEED");
  rng_state = s != NULL ? strtoull(s, NULL, 10) : 1;
  test_trap();
  test_refill();
  test_slow_top_tier();
  test_four_changes();
  test_vs_exact();
  test_stable();
  printf("policy-refill: ok\n");
  return 0;
}
