/* SPDX-License-Identifier: MIT */
/*
 * tests/unit/test_policy_same.c — the greedy's shortcuts decide nothing: policy/greedy.c built
 * once more with POL_REFERENCE under other names (tests/meson.build) takes none of them (every
 * refill choice by a full scan of every tier and option, the refill's order by qsort), and
 * kv_policy_rebalance / kv_policy_admit must return exactly its plans: the same placements,
 * moves, byte counts, utilities (bit for bit) and operation counts. Random instances of every
 * shape the shortcuts care about: 1-4 tiers, inclusive and DECODED tier 0, identical tiers,
 * repeated sizes and qualities (ties), frequency 0, unlimited tiers, sizes on both sides of
 * the default rule's small-instance bound (256) and of its tiny one (16), bench-shaped
 * instances of up to 3,000 contexts, admits into placed stores. The speed the shortcuts buy is
 * measured by `kvdb-bench policy` (place_100k_ms), not here.
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
      fprintf(stderr, "%s:%d: check failed: %s (instance %d)\n", __FILE__, __LINE__, #cond,       \
              cur_inst);                                                                           \
      abort();                                                                                     \
    }                                                                                              \
  } while (0)

#define GB 1000000000ull

static int cur_inst;
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

/* The reference: greedy.c with -DPOL_REFERENCE, renamed (tests/meson.build). */
kvdb_status kv_policy_ref_rebalance_ws(kv_policy_ws *ws, const kv_policy_params *p,
                                       const kv_policy_context *ctx, size_t n,
                                       kv_policy_plan *plan, kv_policy_err *err);
kvdb_status kv_policy_ref_admit_ws(kv_policy_ws *ws, const kv_policy_params *p,
                                   const kv_policy_context *ctx, size_t n, const size_t *incoming,
                                   size_t n_incoming, kv_policy_plan *plan, kv_policy_err *err);
kv_policy_ws *kv_policy_ref_ws_create(void);
void kv_policy_ref_ws_free(kv_policy_ws *ws);

typedef struct inst {
  kv_policy_tier tiers[KV_POLICY_MAX_TIERS];
  kv_policy_params p;
  kv_policy_option *opts;
  kv_policy_context *c;
  size_t n;
} inst;

/* n contexts, up to kmax options, 1..4 tiers; `bench`: the bench's shape (19 configs of
 * fixed ratios, three tiers, DRAM inclusive and decoded, the two lower tiers identical). */
static void inst_make(inst *x, size_t n, uint32_t kmax, double tight, int bench)
{
  static const double ratio[19] = {1,    1.16, 1.78, 3.19, 5.31, 1.11, 1.43, 2.0, 3.31, 1.11,
                                   1.43, 2.0,  3.31, 1.11, 2.0,  3.54, 6.36, 10.5, 6.36};
  memset(x, 0, sizeof *x);
  x->n = n;
  uint32_t T = bench ? 3 : 1 + rndn(4);
  int incl = bench || (T >= 2 && rndn(2) == 0);
  if (bench)
    kmax = 19;
  x->opts = calloc(n * kmax, sizeof *x->opts);
  x->c = calloc(n, sizeof *x->c);
  CHECK(x->opts != NULL && x->c != NULL);
  uint64_t total = 0;
  int coarse = rndn(3) == 0; /* few distinct sizes and qualities: many exact ties */
  for (size_t i = 0; i < n; i++) {
    uint32_t k = bench ? 19 : 1 + rndn(kmax);
    uint64_t raw = coarse ? (uint64_t)(1 + rndn(4)) * GB : (uint64_t)(1 + rndn(64)) * (GB / 16);
    kv_policy_option *o = &x->opts[i * kmax];
    double sens = rnd01();
    for (uint32_t j = 0; j < k; j++) {
      memset(&o[j], 0, sizeof o[j]);
      double frac = bench ? 1.0 / ratio[j] : j == 0 ? 1.0 : coarse ? 0.25 * (1 + rndn(3))
                                                               : 0.05 + 0.9 * rnd01();
      o[j].bytes = (uint64_t)((double)raw * frac) + 1;
      o[j].quality = j == 0 ? 1.0 : coarse ? 0.5 + 0.25 * rndn(3) : exp(-sens * rnd01() * frac);
      o[j].config.method = (uint8_t)(bench ? (j == 0 ? 0 : j == 1 ? 1 : j < 5 ? 2 : 3) : rndn(4));
      if (bench || rndn(3) == 0)
        o[j].decode_bps = j == 0 && bench ? 0 : 1e9 + 40e9 * rnd01();
      if (o[j].config.method == 3 || (!bench && rndn(2) == 0))
        o[j].decoded_bytes = (uint64_t)((double)raw * (0.1 + 0.9 * rnd01())) + 1;
      if (!bench && j > 0 && rndn(5) == 0) /* repeated sizes */
        o[j].bytes = o[j - 1].bytes;
    }
    memset(&x->c[i], 0, sizeof x->c[i]);
    x->c[i].options = o;
    x->c[i].n_options = k;
    x->c[i].raw_bytes = raw;
    x->c[i].n_tokens = raw / 131072 + 1;
    x->c[i].frequency = rndn(6) == 0 ? 0.0 : coarse ? (double)(1 + rndn(3))
                                                     : 100.0 * pow((double)(i + 1), -0.9);
    x->c[i].current = kv_policy_place_none();
    total += raw;
  }
  double bw = 20e9, lat = 1e-6;
  int same = rndn(2) == 0; /* tiers below the first identical (exact utility ties) */
  for (uint32_t t = 0; t < T; t++) {
    double share = bench ? (t == 0 ? 0.04 : 0.2) : tight * (0.2 + rnd01());
    uint64_t cap = (uint64_t)((double)total * share) + 1;
    if (!bench && t == T - 1 && rndn(4) == 0)
      cap = KV_POLICY_UNLIMITED;
    uint32_t flags = 0;
    if (t == 0 && incl)
      flags |= KV_POLICY_TIER_INCLUSIVE;
    if (t == 0 && (bench ? rndn(4) != 0 : rndn(3) == 0))
      flags |= KV_POLICY_TIER_DECODED;
    x->tiers[t] = (kv_policy_tier){NULL, cap, bw, lat, flags};
    if (t == 0 || !same) {
      bw /= 2 + 8 * rnd01();
      lat *= 10 + 40 * rnd01();
    }
  }
  kv_policy_params_init(&x->p);
  x->p.tiers = x->tiers;
  x->p.n_tiers = T;
  x->p.alpha = bench ? pow(10.0, -2 + 4 * rnd01()) : 10 * rnd01();
  x->p.prefill_tokens_per_s = 2000 + 20000 * rnd01();
  x->p.decode_bps[KVDB_METHOD_QUANT] = rndn(2) ? 0 : 8e9;
  x->p.decode_bps[KVDB_METHOD_LOSSLESS] = 2e9;
  x->p.rule = (kv_policy_rule)rndn(3);
}

static void inst_free(inst *x)
{
  free(x->opts);
  free(x->c);
}

static void same_plan(const kv_policy_plan *a, const kv_policy_plan *b, size_t n)
{
  CHECK(a->n_contexts == n && b->n_contexts == n);
  CHECK(memcmp(a->place, b->place, n * sizeof *a->place) == 0);
  CHECK(a->n_moves == b->n_moves);
  CHECK(a->n_moves == 0 || memcmp(a->moves, b->moves, a->n_moves * sizeof *a->moves) == 0);
  CHECK(memcmp(a->used_before, b->used_before, sizeof a->used_before) == 0);
  CHECK(memcmp(a->used_after, b->used_after, sizeof a->used_after) == 0);
  CHECK(memcmp(&a->utility_before, &b->utility_before, sizeof(double)) == 0);
  CHECK(memcmp(&a->utility_after, &b->utility_after, sizeof(double)) == 0);
  CHECK(a->n_recompress == b->n_recompress && a->n_evict == b->n_evict);
}

/* One instance: a rebalance from nothing, an admit of a few contexts into that placement, a
 * rebalance of the placed store with drifted frequencies, and an admit after capacities
 * shrink (over-full tiers). Returns the plans compared. */
static int check_inst(inst *x, kv_policy_ws *ws, kv_policy_ws *wr)
{
  size_t n = x->n;
  kv_policy_plan a, b;
  CHECK(kv_policy_rebalance_ws(ws, &x->p, x->c, n, &a, NULL) == KVDB_OK);
  CHECK(kv_policy_ref_rebalance_ws(wr, &x->p, x->c, n, &b, NULL) == KVDB_OK);
  same_plan(&a, &b, n);
  for (size_t i = 0; i < n; i++)
    x->c[i].current = a.place[i];
  kv_policy_plan_free(&a);
  kv_policy_plan_free(&b);

  size_t in[4], nin = 1 + rndn(n < 4 ? (uint32_t)n : 4);
  for (size_t k = 0; k < nin; k++) {
    size_t j;
    int dup;
    do {
      j = rndn((uint32_t)n);
      dup = 0;
      for (size_t q = 0; q < k; q++)
        dup |= in[q] == j;
    } while (dup);
    in[k] = j;
    x->c[j].current = kv_policy_place_none();
  }
  CHECK(kv_policy_admit_ws(ws, &x->p, x->c, n, in, nin, &a, NULL) == KVDB_OK);
  CHECK(kv_policy_ref_admit_ws(wr, &x->p, x->c, n, in, nin, &b, NULL) == KVDB_OK);
  same_plan(&a, &b, n);
  for (size_t i = 0; i < n; i++)
    x->c[i].current = a.place[i];
  kv_policy_plan_free(&a);
  kv_policy_plan_free(&b);

  for (size_t i = 0; i < n; i++)
    x->c[i].frequency *= rndn(4) == 0 ? 3.0 * rnd01() : 1.0;
  CHECK(kv_policy_rebalance_ws(ws, &x->p, x->c, n, &a, NULL) == KVDB_OK);
  CHECK(kv_policy_ref_rebalance_ws(wr, &x->p, x->c, n, &b, NULL) == KVDB_OK);
  same_plan(&a, &b, n);
  for (size_t i = 0; i < n; i++)
    x->c[i].current = a.place[i];
  kv_policy_plan_free(&a);
  kv_policy_plan_free(&b);

  for (uint32_t t = 0; t < x->p.n_tiers; t++)
    if (x->tiers[t].capacity_bytes != KV_POLICY_UNLIMITED)
      x->tiers[t].capacity_bytes = x->tiers[t].capacity_bytes / 2 + 1;
  CHECK(kv_policy_admit_ws(ws, &x->p, x->c, n, NULL, 0, &a, NULL) == KVDB_OK);
  CHECK(kv_policy_ref_admit_ws(wr, &x->p, x->c, n, NULL, 0, &b, NULL) == KVDB_OK);
  same_plan(&a, &b, n);
  kv_policy_plan_free(&a);
  kv_policy_plan_free(&b);
  return 4;
}

int main(void)
{
  const char *seed = getenv("KVDB_SEED");
  rng_state = seed != NULL ? strtoull(seed, NULL, 10) : 1;
  kv_policy_ws *ws = kv_policy_ws_create(), *wr = kv_policy_ref_ws_create();
  CHECK(ws != NULL && wr != NULL);
  int plans = 0, n_inst = 0;
  /* small (the tiny and small-instance paths), medium, above the 256 bound */
  static const struct {
    int count;
    uint32_t nmin, nspan;
    int bench;
  } fam[] = {{1500, 1, 16, 0}, {600, 17, 240, 0}, {150, 257, 1200, 0}, {30, 1000, 2000, 0}, {60, 20, 300, 1},
             {16, 257, 2800, 1}};
  for (size_t f = 0; f < sizeof fam / sizeof fam[0]; f++)
    for (int it = 0; it < fam[f].count; it++) {
      inst x;
      cur_inst = n_inst++;
      size_t n = fam[f].nmin + rndn(fam[f].nspan);
      inst_make(&x, n, 1 + rndn(24), 0.02 + 0.4 * rnd01(), fam[f].bench);
      plans += check_inst(&x, ws, wr);
      inst_free(&x);
    }
  kv_policy_ws_free(ws);
  kv_policy_ref_ws_free(wr);
  printf("policy-same: %d plans on %d random instances identical to the reference's\n", plans,
         n_inst);
  return 0;
}
