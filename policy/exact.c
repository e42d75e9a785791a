/* SPDX-License-Identifier: MIT */
/*
 * policy/exact.c — what the greedy is measured against: the optimum of small instances
 * (search.c's branch and bound over every context's placement choices, without a budget, from
 * the greedy's placement) and an upper bound for large ones (the Lagrangian dual of the tier
 * capacities, i.e. the LP relaxation of the multiple-choice knapsack, lowered by coordinate
 * descent with an exact convex-hull step per tier, then a pattern search: search.c).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "policy_int.h"


#define EXACT_MAX_CONTEXTS 32
#define EXACT_DEFAULT_NODES 50000000ull
#ifndef EXACT_LAMBDA /* the bound of kv_policy_exact: pol_bb_run's lambda_mode */
#define EXACT_LAMBDA 2
#endif

kvdb_status kv_policy_exact(const kv_policy_params *p, const kv_policy_context *ctx, size_t n,
                            uint64_t max_nodes, kv_policy_place *place, double *utility,
                            kv_policy_err *err)
{
  pol_model m;
  kvdb_status st = pol_model_init(&m, p, ctx, n, err);
  if (st != KVDB_OK)
    return st;
  if ((n > 0 && place == NULL) || utility == NULL)
    return pol_fail(err, KVDB_INVALID, "place or utility is NULL");
  if (n > EXACT_MAX_CONTEXTS)
    return pol_fail(err, KVDB_UNSUPPORTED, "exact solver: %zu contexts, at most %d", n,
                    EXACT_MAX_CONTEXTS);
  if (n == 0) {
    *utility = 0;
    return KVDB_OK;
  }
  kv_policy_place *best = calloc(n, sizeof *best);
  if (best == NULL)
    return pol_fail(err, KVDB_NOMEM, "out of memory");
  /* the first incumbent: the greedy's solution without its own search (POL_NO_SEARCH), else
   * nothing stored */
  for (size_t i = 0; i < n; i++)
    best[i] = kv_policy_place_none();
  m.no_search = 1;
  kv_policy_ws *ws = kv_policy_ws_create();
  if (ws == NULL ||
      pol_greedy(ws, &m, NULL, best, &(uint64_t){0}, &(uint64_t){0}, NULL) != KVDB_OK)
    for (size_t i = 0; i < n; i++)
      best[i] = kv_policy_place_none();
  kv_policy_ws_free(ws);
  m.no_search = 0;
  uint64_t nodes = max_nodes != 0 ? max_nodes : EXACT_DEFAULT_NODES;
  int complete, found;
  st = pol_bb_run(&m, best, pol_place_total(&m, best), 0.0, EXACT_LAMBDA, nodes, UINT64_MAX,
                  SIZE_MAX, &complete, &found);
  if (st == KVDB_NOMEM) {
    st = pol_fail(err, KVDB_NOMEM, "out of memory");
  } else if (st == KVDB_OK && !complete) {
    st = pol_fail(err, KVDB_UNSUPPORTED, "exact solver: node budget of %llu exhausted",
                  (unsigned long long)nodes);
  } else if (st == KVDB_OK) {
    memcpy(place, best, n * sizeof *place);
    *utility = pol_place_total(&m, place);
  }
  free(best);
  return st;
}

kvdb_status kv_policy_upper_bound(const kv_policy_params *p, const kv_policy_context *ctx,
                                  size_t n, double *bound, double *lambda_out,
                                  kv_policy_err *err)
{
  pol_model m;
  kvdb_status st = pol_model_init(&m, p, ctx, n, err);
  if (st != KVDB_OK)
    return st;
  if (bound == NULL)
    return pol_fail(err, KVDB_INVALID, "bound is NULL");
  double b, lambda[KV_POLICY_MAX_TIERS] = {0};
  if (pol_lagrange_prices(&m, 200, UINT64_MAX, &b, lambda) != 0)
    return pol_fail(err, KVDB_NOMEM, "out of memory (placement choices)");
  *bound = b;
  if (lambda_out != NULL)
    memcpy(lambda_out, lambda, m.T * sizeof *lambda_out);
  return KVDB_OK;
}
