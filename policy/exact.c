/* SPDX-License-Identifier: MIT */
/*
 * policy/exact.c — what the greedy is measured against: the optimum of small instances
 * (branch and bound over every context's placement choices) and an upper bound for large ones
 * (the Lagrangian dual of the tier capacities, i.e. the LP relaxation of the multiple-choice
 * knapsack, lowered by coordinate descent with an exact convex-hull step per tier).
 *
 * Both see exactly the greedy's choices (pol_choices): not stored; any option on any persistent
 * tier; with an inclusive tier 0, also cached (bytes on tier 0 and on the persistent tier).
 */
#include <stdlib.h>
#include <string.h>

#include "policy_int.h"

#define EXACT_MAX_CONTEXTS 32
#define EXACT_DEFAULT_NODES 50000000ull

/* ---- branch and bound ---------------------------------------------------------------------- */

typedef struct bb {
  const pol_model *m;
  size_t n;
  uint32_t *order;      /* search order of contexts */
  pol_choice **ch;      /* [n] choices of each context, best utility first */
  size_t *nch;
  double *suffix;       /* suffix[d] = sum of the best utility of order[d..n-1] */
  kv_policy_place *cur; /* [n] by context index */
  kv_policy_place *best;
  double best_u;
  int have_best;
  uint64_t used[KV_POLICY_MAX_TIERS];
  uint64_t nodes, max_nodes;
  int out_of_nodes;
} bb;

static int choice_cmp(const void *a, const void *b)
{
  const pol_choice *x = a, *y = b;
  if (x->u != y->u)
    return x->u > y->u ? -1 : 1;
  return 0; /* equal: sort_choices is stable, so enumeration order decides */
}

static void bb_search(bb *s, size_t d, double u)
{
  if (s->out_of_nodes)
    return;
  if (d == s->n) {
    if (!s->have_best || u > s->best_u) {
      s->best_u = u;
      s->have_best = 1;
      memcpy(s->best, s->cur, s->n * sizeof *s->cur);
    }
    return;
  }
  double tol = 1e-12 * (fabs(s->best_u) + 1.0);
  if (s->have_best && u + s->suffix[d] <= s->best_u + tol)
    return;
  uint32_t i = s->order[d];
  const pol_model *m = s->m;
  for (size_t k = 0; k < s->nch[i]; k++) {
    const pol_choice *c = &s->ch[i][k];
    if (s->have_best && u + c->u + s->suffix[d + 1] <= s->best_u + tol)
      break; /* choices are sorted by utility: none of the rest can do better */
    int fits = 1;
    for (uint32_t t = 0; t < m->T && fits; t++)
      fits = c->use[t] == 0 || (s->used[t] <= m->cap[t] && c->use[t] <= m->cap[t] - s->used[t]);
    if (!fits)
      continue;
    if (++s->nodes > s->max_nodes) {
      s->out_of_nodes = 1;
      return;
    }
    for (uint32_t t = 0; t < m->T; t++)
      s->used[t] += c->use[t];
    s->cur[i] = c->place;
    bb_search(s, d + 1, u + c->u);
    for (uint32_t t = 0; t < m->T; t++)
      s->used[t] -= c->use[t];
    if (s->out_of_nodes)
      return;
  }
}

/* Stable sort of one context's choices by utility, descending (insertion sort: few choices). */
static void sort_choices(pol_choice *c, size_t k)
{
  for (size_t a = 1; a < k; a++) {
    pol_choice x = c[a];
    size_t b = a;
    while (b > 0 && choice_cmp(&x, &c[b - 1]) < 0) {
      c[b] = c[b - 1];
      b--;
    }
    c[b] = x;
  }
}

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
  bb s;
  memset(&s, 0, sizeof s);
  s.m = &m;
  s.n = n;
  s.max_nodes = max_nodes != 0 ? max_nodes : EXACT_DEFAULT_NODES;
  s.order = calloc(n, sizeof *s.order);
  s.ch = calloc(n, sizeof *s.ch);
  s.nch = calloc(n, sizeof *s.nch);
  s.suffix = calloc(n + 1, sizeof *s.suffix);
  s.cur = calloc(n, sizeof *s.cur);
  s.best = calloc(n, sizeof *s.best);
  double *spread = calloc(n, sizeof *spread);
  st = KVDB_OK;
  if (!s.order || !s.ch || !s.nch || !s.suffix || !s.cur || !s.best || !spread) {
    st = pol_fail(err, KVDB_NOMEM, "out of memory");
    goto out;
  }
  for (size_t i = 0; i < n; i++) {
    s.nch[i] = pol_n_choices(&m, &ctx[i]);
    s.ch[i] = malloc(s.nch[i] * sizeof *s.ch[i]);
    if (s.ch[i] == NULL) {
      st = pol_fail(err, KVDB_NOMEM, "out of memory");
      goto out;
    }
    pol_choices(&m, &ctx[i], s.ch[i]);
    sort_choices(s.ch[i], s.nch[i]);
    spread[i] = s.ch[i][0].u - s.ch[i][s.nch[i] - 1].u;
    s.order[i] = (uint32_t)i;
  }
  /* contexts with the most at stake first: they prune the most (insertion sort, n <= 32) */
  for (size_t a = 1; a < n; a++) {
    uint32_t x = s.order[a];
    size_t b = a;
    while (b > 0 && spread[s.order[b - 1]] < spread[x]) {
      s.order[b] = s.order[b - 1];
      b--;
    }
    s.order[b] = x;
  }
  for (size_t d = n; d-- > 0;)
    s.suffix[d] = s.suffix[d + 1] + s.ch[s.order[d]][0].u;
  /* the greedy's solution is the first incumbent */
  kv_policy_ws *ws = kv_policy_ws_create();
  if (ws != NULL && pol_greedy(ws, &m, NULL, s.best, &(uint64_t){0}, &(uint64_t){0}, NULL) ==
                        KVDB_OK) {
    s.have_best = 1;
    s.best_u = 0;
    for (size_t i = 0; i < n; i++)
      s.best_u += pol_util_place(&m, &ctx[i], &s.best[i]);
  }
  kv_policy_ws_free(ws);
  bb_search(&s, 0, 0.0);
  if (s.out_of_nodes) {
    st = pol_fail(err, KVDB_UNSUPPORTED, "exact solver: node budget of %llu exhausted",
                  (unsigned long long)s.max_nodes);
    goto out;
  }
  if (!s.have_best) { /* cannot happen: "not stored" for everyone always fits */
    st = pol_fail(err, KVDB_PANIC, "exact solver found no feasible placement");
    goto out;
  }
  memcpy(place, s.best, n * sizeof *place);
  *utility = 0;
  for (size_t i = 0; i < n; i++) /* the same summation order as kv_policy_evaluate */
    *utility += pol_util_place(&m, &ctx[i], &place[i]);
out:
  if (s.ch != NULL)
    for (size_t i = 0; i < n; i++)
      free(s.ch[i]);
  free(s.ch);
  free(s.order);
  free(s.nch);
  free(s.suffix);
  free(s.cur);
  free(s.best);
  free(spread);
  return st;
}

/* ---- the upper bound ----------------------------------------------------------------------- */

typedef struct bp {
  double lambda; /* price at which the context switches to a point with fewer bytes */
  double dw;     /* bytes it then gives up */
} bp;

static int bp_cmp(const void *a, const void *b)
{
  const bp *x = a, *y = b;
  if (x->lambda != y->lambda)
    return x->lambda < y->lambda ? -1 : 1;
  return 0;
}

/* Every context's choices, computed once: choice c of context i is at off[i] <= c < off[i+1],
 * with utility u[c] and bytes use[c * T + t] per tier (doubles: the dual is in floating point). */
typedef struct ub {
  const pol_model *m;
  size_t *off;    /* [n + 1] */
  double *u;      /* [S] */
  double *use;    /* [S * T] */
  double *v;      /* scratch: value per choice of one context (kmax) */
  bp *bps;
  size_t nbp, bp_cap;
} ub;

/* The dual function: sum_t lambda_t C_t + sum_i max_c (U_c - lambda . use_c). */
static double dual_value(const ub *s, const double *lambda)
{
  const pol_model *m = s->m;
  uint32_t T = m->T;
  double total = 0;
  for (uint32_t t = 0; t < T; t++)
    if (lambda[t] > 0)
      total += lambda[t] * (double)m->cap[t];
  for (size_t i = 0; i < m->n; i++) {
    double best = -INFINITY;
    for (size_t c = s->off[i]; c < s->off[i + 1]; c++) {
      double v = s->u[c];
      const double *w = &s->use[c * T];
      for (uint32_t t = 0; t < T; t++)
        v -= lambda[t] * w[t];
      if (v > best)
        best = v;
    }
    total += best;
  }
  return total;
}

static int bp_push(ub *s, double lambda, double dw)
{
  if (s->nbp == s->bp_cap) {
    size_t nc = s->bp_cap ? 2 * s->bp_cap : 4096;
    bp *nb = realloc(s->bps, nc * sizeof *nb);
    if (nb == NULL)
      return -1;
    s->bps = nb;
    s->bp_cap = nc;
  }
  s->bps[s->nbp].lambda = lambda;
  s->bps[s->nbp].dw = dw;
  s->nbp++;
  return 0;
}

/*
 * The exact minimizer of the dual in lambda[t], the other prices fixed: tier t's LP (the
 * convex-hull greedy with a fractional last item). Per context the chosen point walks down
 * the upper concave hull of its (bytes on t, value) points as the price rises; the price that
 * brings the total down to the capacity is the answer. Returns 0, or -1 when out of memory.
 */
static int line_step(ub *s, double *lambda, uint32_t t)
{
  const pol_model *m = s->m;
  uint32_t T = m->T;
  double cap = (double)m->cap[t], usage = 0;
  s->nbp = 0;
  for (size_t i = 0; i < m->n; i++) {
    size_t c0 = s->off[i], k = s->off[i + 1] - c0;
    const double *use = &s->use[c0 * T];
    double *v = s->v;
    for (size_t c = 0; c < k; c++) {
      double x = s->u[c0 + c];
      for (uint32_t r = 0; r < T; r++)
        if (r != t)
          x -= lambda[r] * use[c * T + r];
      v[c] = x;
    }
#define W(c) (use[(c) * T + t])
    /* start: the best value at price 0 (ties: fewer bytes) */
    size_t cur = 0;
    for (size_t c = 1; c < k; c++)
      if (v[c] > v[cur] || (v[c] == v[cur] && W(c) < W(cur)))
        cur = c;
    usage += W(cur);
    double last = 0;
    for (;;) { /* next hull point: the smallest switching price among points with fewer bytes */
      size_t nx = k;
      double nl = INFINITY;
      for (size_t c = 0; c < k; c++) {
        if (!(W(c) < W(cur)))
          continue;
        double l = (v[cur] - v[c]) / (W(cur) - W(c));
        if (l < nl || (l == nl && nx < k && W(c) < W(nx))) {
          nl = l;
          nx = c;
        }
      }
      if (nx == k)
        break;
      if (nl < last)
        nl = last; /* rounding: the hull's prices never decrease */
      if (bp_push(s, nl, W(cur) - W(nx)) != 0)
        return -1;
      last = nl;
      cur = nx;
    }
#undef W
  }
  if (usage <= cap) {
    lambda[t] = 0;
    return 0;
  }
  qsort(s->bps, s->nbp, sizeof *s->bps, bp_cmp);
  for (size_t b = 0; b < s->nbp; b++) {
    usage -= s->bps[b].dw;
    if (usage <= cap * (1 + 1e-15)) {
      lambda[t] = s->bps[b].lambda > 0 ? s->bps[b].lambda : 0;
      return 0;
    }
  }
  /* every context at its fewest bytes on t and still over: cannot happen ("not stored" uses
   * no bytes); keep the highest price seen */
  lambda[t] = s->nbp > 0 ? s->bps[s->nbp - 1].lambda : 0;
  return 0;
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
  size_t kmax = 1, S = 0;
  for (size_t i = 0; i < n; i++) {
    size_t k = pol_n_choices(&m, &ctx[i]);
    kmax = k > kmax ? k : kmax;
    S += k;
  }
  ub s;
  memset(&s, 0, sizeof s);
  s.m = &m;
  pol_choice *ch = malloc(kmax * sizeof *ch);
  s.off = malloc((n + 1) * sizeof *s.off);
  s.u = malloc((S > 0 ? S : 1) * sizeof *s.u);
  s.use = malloc((S > 0 ? S : 1) * m.T * sizeof *s.use);
  s.v = malloc(kmax * sizeof *s.v);
  if (ch == NULL || s.off == NULL || s.u == NULL || s.use == NULL || s.v == NULL) {
    st = pol_fail(err, KVDB_NOMEM, "out of memory (%zu placement choices)", S);
    goto out;
  }
  s.off[0] = 0;
  for (size_t i = 0; i < n; i++) {
    size_t k = pol_choices(&m, &ctx[i], ch), c0 = s.off[i];
    for (size_t c = 0; c < k; c++) {
      s.u[c0 + c] = ch[c].u;
      for (uint32_t t = 0; t < m.T; t++)
        s.use[(c0 + c) * m.T + t] = (double)ch[c].use[t];
    }
    s.off[i + 1] = c0 + k;
  }
  double lambda[KV_POLICY_MAX_TIERS] = {0}, best_lambda[KV_POLICY_MAX_TIERS] = {0};
  double best = dual_value(&s, lambda);
  memcpy(best_lambda, lambda, sizeof lambda);
  int limited = 0;
  for (uint32_t t = 0; t < m.T; t++)
    limited += m.cap[t] != KV_POLICY_UNLIMITED;
  /* coordinate descent; with one limited tier one step is the exact LP optimum */
  for (int cycle = 0; cycle < 200 && limited > 0; cycle++) {
    double before = best;
    for (uint32_t t = 0; t < m.T; t++) {
      if (m.cap[t] == KV_POLICY_UNLIMITED)
        continue;
      if (line_step(&s, lambda, t) != 0) {
        st = pol_fail(err, KVDB_NOMEM, "out of memory (hull breakpoints)");
        goto out;
      }
      double v = dual_value(&s, lambda);
      if (v < best) {
        best = v;
        memcpy(best_lambda, lambda, sizeof lambda);
      }
    }
    if (limited == 1 || !(best < before - 1e-12 * (fabs(before) + 1.0)))
      break;
  }
  /* Coordinate descent can stop at a kink of the (piecewise linear) dual where no single price
   * helps but a joint move does: a pattern search over pairs of prices finishes the job. */
  if (limited > 1) {
    double scale = 0;
    for (uint32_t t = 0; t < m.T; t++)
      scale = best_lambda[t] > scale ? best_lambda[t] : scale;
    /* a move counts when it lowers the bound by more than rounding; at most 64 moves per step
     * size (each bound found on the way is valid: stopping early only leaves it less tight) */
    int moves = 0;
    for (double step = 0.5; step > 1e-7 && scale > 0;) {
      int improved = 0;
      double tol = 1e-12 * (fabs(best) + 1.0);
      for (uint32_t a = 0; a < m.T; a++) {
        if (m.cap[a] == KV_POLICY_UNLIMITED)
          continue;
        for (uint32_t b = a; b < m.T; b++) {
          if (m.cap[b] == KV_POLICY_UNLIMITED)
            continue;
          for (int sa = -1; sa <= 1; sa += 2)
            for (int sb = (a == b ? 0 : -1); sb <= 1; sb += 2) {
              double l2[KV_POLICY_MAX_TIERS];
              memcpy(l2, best_lambda, sizeof l2);
              l2[a] += sa * step * (best_lambda[a] > 0 ? best_lambda[a] : scale);
              if (b != a)
                l2[b] += sb * step * (best_lambda[b] > 0 ? best_lambda[b] : scale);
              if (l2[a] < 0 || l2[b] < 0)
                continue;
              double v = dual_value(&s, l2);
              if (v < best - tol) {
                best = v;
                memcpy(best_lambda, l2, sizeof l2);
                improved = 1;
              }
            }
        }
      }
      if (!improved || ++moves == 64) {
        step *= 0.5;
        moves = 0;
      }
    }
  }
  *bound = best;
  if (lambda_out != NULL)
    memcpy(lambda_out, best_lambda, m.T * sizeof *lambda_out);
out:
  free(ch);
  free(s.off);
  free(s.u);
  free(s.use);
  free(s.v);
  free(s.bps);
  return st;
}
