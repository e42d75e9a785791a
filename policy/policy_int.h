/* SPDX-License-Identifier: MIT */
/*
 * policy/policy_int.h — what the files of policy/ share: the checked model
 * (tiers resolved once), byte, TTFT and utility of a placement, and the enumeration of a
 * context's placement choices used by the exact solver and the bound. Not part of the
 * module's interface (policy.h is).
 */
#ifndef KV_POLICY_INT_H
#define KV_POLICY_INT_H

#include <math.h>
#include <stdarg.h>

#include "policy.h"

/* The problem with the tiers resolved: built by pol_model_init after kv_policy_check. */
typedef struct pol_model {
  const kv_policy_params *p;
  const kv_policy_context *ctx;
  size_t n;
  uint32_t T;         /* tiers */
  int incl;           /* tier 0 is inclusive */
  uint32_t first;     /* first persistent tier: 1 with an inclusive tier 0, else 0 */
  uint64_t cap[KV_POLICY_MAX_TIERS];
  double inv_bw[KV_POLICY_MAX_TIERS];
  double lat[KV_POLICY_MAX_TIERS];
  int decoded[KV_POLICY_MAX_TIERS];
  int options_checked; /* 0: pol_greedy checks each option as it reads it */
  int no_search;       /* 1: the default rule skips its search (g), as kv_policy_exact wants of
                          its first incumbent */
} pol_model;

/* A placement choice of one context: what the exact solver and the bound enumerate. */
typedef struct pol_choice {
  kv_policy_place place;
  double u;
  uint64_t use[KV_POLICY_MAX_TIERS];
} pol_choice;

/* err helpers */
kvdb_status pol_fail(kv_policy_err *err, kvdb_status st, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

/* Check the input and build the model. _ex with check_options 0 leaves the options to the
 * caller, which must pass each one to pol_check_option (the greedy does, in its first pass over
 * them: one pass less over the largest input). */
kvdb_status pol_model_init(pol_model *m, const kv_policy_params *p, const kv_policy_context *ctx,
                           size_t n, kv_policy_err *err);
kvdb_status pol_model_init_ex(pol_model *m, const kv_policy_params *p,
                              const kv_policy_context *ctx, size_t n, int check_options,
                              kv_policy_err *err);

/* The checks of one option (pol_model_init's messages). */
static inline kvdb_status pol_check_option(size_t i, uint32_t o, const kv_policy_option *op,
                                           kv_policy_err *err)
{
  if (op->bytes == 0)
    return pol_fail(err, KVDB_INVALID, "context %zu option %u: bytes is 0", i, o);
  if (!(op->quality >= 0.0 && op->quality <= 1.0))
    return pol_fail(err, KVDB_INVALID, "context %zu option %u: quality %g is not in [0, 1]", i, o,
                    op->quality);
  if (!(isfinite(op->decode_bps) && op->decode_bps >= 0.0))
    return pol_fail(err, KVDB_INVALID, "context %zu option %u: decode_bps %g is not a number >= 0",
                    i, o, op->decode_bps);
  return KVDB_OK;
}

/* Bytes of option o of context c on tier t (decoded bytes on a DECODED tier). */
static inline uint64_t pol_bytes(const pol_model *m, uint32_t t, const kv_policy_context *c,
                                 uint32_t o)
{
  const kv_policy_option *op = &c->options[o];
  if (m->decoded[t])
    return op->decoded_bytes != 0 ? op->decoded_bytes : c->raw_bytes;
  return op->bytes;
}

/* Decode seconds of option o (0 on a DECODED tier or for a free method). */
static inline double pol_decode_s(const pol_model *m, uint32_t t, const kv_policy_context *c,
                                  uint32_t o)
{
  if (m->decoded[t])
    return 0.0;
  const kv_policy_option *op = &c->options[o];
  double bps = op->decode_bps;
  if (!(bps > 0.0)) {
    unsigned meth = op->config.method;
    bps = meth < 4 ? m->p->decode_bps[meth] : 0.0;
  }
  return bps > 0.0 ? (double)c->raw_bytes / bps : 0.0;
}

/* TTFT of option o served from tier t. */
static inline double pol_ttft(const pol_model *m, uint32_t t, const kv_policy_context *c,
                              uint32_t o)
{
  return m->lat[t] + (double)pol_bytes(m, t, c, o) * m->inv_bw[t] + pol_decode_s(m, t, c, o);
}

/* U of option o served from tier t. */
static inline double pol_util(const pol_model *m, uint32_t t, const kv_policy_context *c,
                              uint32_t o)
{
  return (m->p->alpha * c->options[o].quality - pol_ttft(m, t, c, o)) * c->frequency;
}

static inline double pol_ttft_none(const pol_model *m, const kv_policy_context *c)
{
  return (double)c->n_tokens / m->p->prefill_tokens_per_s;
}

static inline double pol_util_none(const pol_model *m, const kv_policy_context *c)
{
  return (m->p->alpha * m->p->recompute_quality - pol_ttft_none(m, c)) * c->frequency;
}

/* The serving tier of a stored placement. */
static inline uint32_t pol_serving(const kv_policy_place *pl)
{
  return pl->cached ? 0u : (uint32_t)pl->tier;
}

/* U of a (valid) placement. */
static inline double pol_util_place(const pol_model *m, const kv_policy_context *c,
                                    const kv_policy_place *pl)
{
  if (pl->tier == KV_POLICY_NONE)
    return pol_util_none(m, c);
  return pol_util(m, pol_serving(pl), c, (uint32_t)pl->option);
}

/* Add (sign +1) or remove (sign -1) a placement's bytes to/from used[]. */
static inline void pol_use(const pol_model *m, const kv_policy_context *c,
                           const kv_policy_place *pl, uint64_t *used, int sign)
{
  if (pl->tier == KV_POLICY_NONE)
    return;
  uint32_t o = (uint32_t)pl->option, t = (uint32_t)pl->tier;
  uint64_t b = pol_bytes(m, t, c, o);
  used[t] = sign > 0 ? used[t] + b : used[t] - b;
  if (pl->cached) {
    uint64_t b0 = pol_bytes(m, 0, c, o);
    used[0] = sign > 0 ? used[0] + b0 : used[0] - b0;
  }
}

/* Best option of context c served from tier t: highest U, then lowest index. */
static inline uint32_t pol_best_option(const pol_model *m, uint32_t t, const kv_policy_context *c)
{
  uint32_t best = 0;
  double bu = pol_util(m, t, c, 0);
  for (uint32_t o = 1; o < c->n_options; o++) {
    double u = pol_util(m, t, c, o);
    if (u > bu) {
      bu = u;
      best = o;
    }
  }
  return best;
}

/* Whether a placement is well formed for context c; a message into err when not. */
kvdb_status pol_place_valid(const pol_model *m, size_t i, const kv_policy_place *pl,
                            const char *what, kv_policy_err *err);

/* Placement equality (tier, option, cached), with every "not stored" equal. */
static inline int pol_place_eq(const kv_policy_place *a, const kv_policy_place *b)
{
  if (a->tier == KV_POLICY_NONE || b->tier == KV_POLICY_NONE)
    return a->tier == b->tier;
  return a->tier == b->tier && a->option == b->option && (a->cached != 0) == (b->cached != 0);
}

/* Number of placement choices of context c, and the choices into out[] (capacity >= that). */
size_t pol_n_choices(const pol_model *m, const kv_policy_context *c);
size_t pol_choices(const pol_model *m, const kv_policy_context *c, pol_choice *out);

/* The greedy (greedy.c), with the scratch of ws (not NULL). `incoming` marks contexts that
 * enter at the top (NULL = all); the others start at their `current`. Writes the final
 * placements into out (n) and counts. */
kvdb_status pol_greedy(kv_policy_ws *ws, const pol_model *m, const uint8_t *incoming,
                       kv_policy_place *out, uint64_t *n_recompress, uint64_t *n_evict,
                       kv_policy_err *err);

/* search.c: the prices of the dual (kv_policy_upper_bound's: at most `cycles` cycles of
 * coordinate descent, then at most max_evals evaluations of the dual in the pattern search)
 * and the bound they give. Returns 0, or -1 when out of memory. */
int pol_lagrange_prices(const pol_model *m, int cycles, uint64_t max_evals, double *bound,
                        double *lambda);
/* search.c: the branch and bound from the incumbent `inc` (utility inc_u), keeping only
 * placements worth more than inc_u + margin; lambda_mode as pol_search's. At most max_nodes
 * placements tried and max_work choices looked at. *complete: it finished; *found: inc was
 * replaced. KVDB_OK, KVDB_NOMEM, or KVDB_UNSUPPORTED (more than max_choices choices in all). */
kvdb_status pol_bb_run(const pol_model *m, kv_policy_place *inc, double inc_u, double margin,
                       int lambda_mode, uint64_t max_nodes, uint64_t max_work, size_t max_choices,
                       int *complete, int *found);
/* The total utility of placements, summed as kv_policy_evaluate does. */
double pol_place_total(const pol_model *m, const kv_policy_place *pl);
/* The default rule's search (greedy.c (g), search.c): branch and bound from the placement in
 * `place` (n = m->n <= 32), keeping only placements worth more than its utility + margin;
 * lambda_mode 0: the plain bound, 1: with the LP relaxation's prices (coordinate descent), 2:
 * prices refined by a pattern search, 3: the same within about 2 million multiply-adds. It
 * looks at most at max_work choices (the best placement found by then is kept), and does
 * nothing when the contexts have more than max_choices placement choices in all. *improved =
 * 1 when `place` was replaced. Returns KVDB_OK or KVDB_NOMEM. */
kvdb_status pol_search(const pol_model *m, kv_policy_place *place, double margin,
                       int lambda_mode, uint64_t max_work, size_t max_choices, int *improved);

#endif /* KV_POLICY_INT_H */
