/* SPDX-License-Identifier: MIT */
/*
 * policy/search.c — the branch and bound over every context's placement choices (what
 * kv_policy_exact runs without a budget, and the default rule's search (g) runs from the
 * greedy's placement within one) and the prices of the Lagrangian dual of the tier capacities
 * (the LP relaxation of the multiple-choice knapsack; kv_policy_upper_bound's bound, the
 * search's bound). Below greedy.c and exact.c: calls neither.
 *
 * Both see exactly the greedy's choices (pol_choices): not stored; any option on any persistent
 * tier; with an inclusive tier 0, also cached (bytes on tier 0 and on the persistent tier).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "policy_int.h"


#define SEARCH_MAX_CONTEXTS 32
/* lambda_mode 3's pattern search: at most about this many multiply-adds of the dual */
#define SEARCH_DUAL_WORK 2000000ull

/* ---- the prices: the Lagrangian dual of the capacities --------------------------------------- */

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

/* The prices of the dual and the bound they give (kv_policy_upper_bound: 200 cycles of
 * coordinate descent, no limit on the pattern search's evaluations of the dual; the default
 * rule's search bounds both). Returns 0, or -1 when out of memory. */
int pol_lagrange_prices(const pol_model *mm, int cycles, uint64_t max_evals, double *bound,
                        double *lambda_out)
{
  const pol_model m = *mm;
  const kv_policy_context *ctx = m.ctx;
  size_t n = m.n;
  int st = 0;
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
    st = -1;
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
  for (int cycle = 0; cycle < cycles && limited > 0; cycle++) {
    double before = best;
    for (uint32_t t = 0; t < m.T; t++) {
      if (m.cap[t] == KV_POLICY_UNLIMITED)
        continue;
      if (line_step(&s, lambda, t) != 0) {
        st = -1;
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
  uint64_t evals = 0;
  if (limited > 1 && max_evals > 0) {
    double scale = 0;
    for (uint32_t t = 0; t < m.T; t++)
      scale = best_lambda[t] > scale ? best_lambda[t] : scale;
    /* a move counts when it lowers the bound by more than rounding; at most 64 moves per step
     * size (each bound found on the way is valid: stopping early only leaves it less tight) */
    int moves = 0;
    for (double step = 0.5; step > 1e-7 && scale > 0 && evals < max_evals;) {
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
              evals++;
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

/* ---- branch and bound ---------------------------------------------------------------------- */

/*
 * Depth-first over the contexts (most at stake first), each context's choices best first.
 * Two bounds on what the contexts not yet placed can still add, the smaller one prunes:
 *   plain:      the sum of their best utilities, capacities ignored;
 *   Lagrangian: with prices lambda_t >= 0 per limited tier (the LP relaxation's, from the
 *               coordinate descent of kv_policy_upper_bound), sum_t lambda_t * (C_t - used_t)
 *               + the sum of their best reduced values max_c (U_c - lambda . use_c): valid for
 *               every lambda >= 0, since what they add fits in C_t - used_t.
 * Choices are sorted by reduced value, so once one fails the Lagrangian bound the rest do too.
 * Choices that cannot fit the empty tiers, and choices another choice of the same context
 * dominates (at least its utility with at most its bytes on every tier), are left out.
 */
typedef struct bb {
  const pol_model *m;
  size_t n;
  uint32_t *order;      /* search order of contexts */
  pol_choice **ch;      /* [n] choices of each context, best reduced value first */
  double **red;         /* [n] their reduced values U - lambda . use */
  size_t *nch;
  double *suffix;       /* suffix[d] = sum of the best utility of order[d..n-1] */
  double *lsuffix;      /* lsuffix[d] = sum of the best reduced value of order[d..n-1] */
  double lam[KV_POLICY_MAX_TIERS];
  kv_policy_place *cur; /* [n] by context index */
  kv_policy_place *best;
  double best_u;
  int have_best, found;
  uint64_t used[KV_POLICY_MAX_TIERS];
  uint64_t nodes, max_nodes; /* nodes: placements of one context tried (kv_policy_exact) */
  uint64_t work, max_work;   /* work: choices looked at (the default rule's budget) */
  int out_of_nodes;
} bb;

static void bb_search(bb *s, size_t d, double u)
{
  if (s->out_of_nodes)
    return;
  if (d == s->n) {
    if (!s->have_best || u > s->best_u) {
      s->best_u = u;
      s->have_best = 1;
      s->found = 1;
      memcpy(s->best, s->cur, s->n * sizeof *s->cur);
    }
    return;
  }
  const pol_model *m = s->m;
  double slack = 0; /* sum_t lambda_t * (C_t - used_t) */
  for (uint32_t t = 0; t < m->T; t++)
    if (s->lam[t] > 0)
      slack += s->lam[t] * (double)(m->cap[t] - s->used[t]);
  double tol = 1e-12 * (fabs(s->best_u) + fabs(slack) + 1.0);
  if (s->have_best && (u + s->suffix[d] <= s->best_u + tol ||
                       u + slack + s->lsuffix[d] <= s->best_u + tol))
    return;
  uint32_t i = s->order[d];
  for (size_t k = 0; k < s->nch[i]; k++) {
    const pol_choice *c = &s->ch[i][k];
    if (++s->work > s->max_work) {
      s->out_of_nodes = 1;
      return;
    }
    if (s->have_best && u + slack + s->red[i][k] + s->lsuffix[d + 1] <= s->best_u + tol)
      break; /* sorted by reduced value: none of the rest can do better */
    if (s->have_best && u + c->u + s->suffix[d + 1] <= s->best_u + tol)
      continue;
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

/* Stable sort of one context's choices by reduced value, descending (insertion sort). */
static void sort_choices(pol_choice *c, double *r, size_t k)
{
  for (size_t a = 1; a < k; a++) {
    pol_choice x = c[a];
    double xr = r[a];
    size_t b = a;
    while (b > 0 && xr > r[b - 1]) {
      c[b] = c[b - 1];
      r[b] = r[b - 1];
      b--;
    }
    c[b] = x;
    r[b] = xr;
  }
}

/* 1 when choice a is at least as good as b everywhere (utility, bytes on every tier). */
static int dominates(const pol_model *m, const pol_choice *a, const pol_choice *b)
{
  if (!(a->u >= b->u))
    return 0;
  for (uint32_t t = 0; t < m->T; t++)
    if (a->use[t] > b->use[t])
      return 0;
  return 1;
}


/*
 * The search from the incumbent `inc` (utility inc_u; the search keeps only placements worth
 * more than inc_u + margin). lambda_mode: 0 plain bound only, 1 prices by coordinate descent
 * (at most 32 cycles), 2 kv_policy_upper_bound's prices (200 cycles and the pattern search),
 * 3 at most 32 cycles and the pattern search within SEARCH_DUAL_WORK. Sets *complete (the
 * search finished: nothing worth more than inc_u + margin is missed) and *found (inc was
 * replaced by a better placement). Returns KVDB_OK or KVDB_NOMEM; KVDB_UNSUPPORTED when the
 * instance has more choices than max_choices.
 */
kvdb_status pol_bb_run(const pol_model *m, kv_policy_place *inc, double inc_u, double margin,
                       int lambda_mode, uint64_t max_nodes, uint64_t max_work, size_t max_choices,
                       int *complete, int *found)
{
  size_t n = m->n;
  const kv_policy_context *ctx = m->ctx;
  *complete = 0;
  *found = 0;
  size_t S = 0;
  for (size_t i = 0; i < n; i++)
    S += pol_n_choices(m, &ctx[i]);
  if (S > max_choices)
    return KVDB_UNSUPPORTED;
  bb s;
  memset(&s, 0, sizeof s);
  s.m = m;
  s.n = n;
  s.max_nodes = max_nodes;
  s.max_work = max_work;
  if (lambda_mode > 0) {
    double bnd;
    /* mode 3: the pattern search within about 2 million multiply-adds of the dual */
    uint64_t evals = lambda_mode == 1 ? 0
                     : lambda_mode == 2 ? UINT64_MAX
                                        : 1 + SEARCH_DUAL_WORK / ((uint64_t)S * m->T + 1);
    /* mode 3 first tries the descent alone: when its bound already closes the gap, the
     * pattern search (the larger cost) is not needed */
    for (int pass = lambda_mode == 3 ? 0 : 1; pass < 2; pass++) {
      if (pol_lagrange_prices(m, lambda_mode == 2 ? 200 : 32, pass == 0 ? 0 : evals, &bnd,
                              s.lam) != 0)
        return KVDB_NOMEM;
      /* the incumbent already reaches the bound: nothing to search */
      if (bnd <= inc_u + margin + 1e-12 * (fabs(bnd) + 1.0)) {
        *complete = 1;
        return KVDB_OK;
      }
    }
  }
  kvdb_status st = KVDB_OK;
  s.order = calloc(n, sizeof *s.order);
  s.ch = calloc(n, sizeof *s.ch);
  s.red = calloc(n, sizeof *s.red);
  s.nch = calloc(n, sizeof *s.nch);
  s.suffix = calloc(n + 1, sizeof *s.suffix);
  s.lsuffix = calloc(n + 1, sizeof *s.lsuffix);
  s.cur = calloc(n, sizeof *s.cur);
  s.best = calloc(n, sizeof *s.best);
  double *spread = calloc(n, sizeof *spread);
  if (!s.order || !s.ch || !s.red || !s.nch || !s.suffix || !s.lsuffix || !s.cur || !s.best ||
      !spread) {
    st = KVDB_NOMEM;
    goto out;
  }
  for (size_t i = 0; i < n; i++) {
    size_t k = pol_n_choices(m, &ctx[i]);
    s.ch[i] = malloc(k * sizeof *s.ch[i]);
    s.red[i] = malloc(k * sizeof *s.red[i]);
    if (s.ch[i] == NULL || s.red[i] == NULL) {
      st = KVDB_NOMEM;
      goto out;
    }
    pol_choice *c = s.ch[i];
    k = pol_choices(m, &ctx[i], c);
    size_t kk = 0; /* keep what fits the empty tiers and is not dominated by a kept earlier one
                      or by any later one (ties keep the first) */
    for (size_t a = 0; a < k; a++) {
      int keep = 1;
      for (uint32_t t = 0; t < m->T && keep; t++)
        keep = c[a].use[t] <= m->cap[t];
      for (size_t b = 0; b < k && keep; b++) {
        if (b == a || !dominates(m, &c[b], &c[a]))
          continue;
        /* mutual domination = equal: the first one stays */
        keep = dominates(m, &c[a], &c[b]) && a < b;
      }
      if (keep)
        c[kk++] = c[a];
    }
    s.nch[i] = kk; /* "not stored" is never dropped: nothing dominates it but an equal one */
    double umax = -INFINITY, umin = INFINITY;
    for (size_t a = 0; a < kk; a++) {
      double r = c[a].u;
      for (uint32_t t = 0; t < m->T; t++)
        r -= s.lam[t] * (double)c[a].use[t];
      s.red[i][a] = r;
      umax = c[a].u > umax ? c[a].u : umax;
      umin = c[a].u < umin ? c[a].u : umin;
    }
    sort_choices(c, s.red[i], kk);
    spread[i] = umax - umin;
    s.order[i] = (uint32_t)i;
  }
  /* contexts with the most at stake first: they prune the most (insertion sort, n small) */
  for (size_t a = 1; a < n; a++) {
    uint32_t x = s.order[a];
    size_t b = a;
    while (b > 0 && spread[s.order[b - 1]] < spread[x]) {
      s.order[b] = s.order[b - 1];
      b--;
    }
    s.order[b] = x;
  }
  for (size_t d = n; d-- > 0;) {
    uint32_t i = s.order[d];
    double umax = -INFINITY;
    for (size_t a = 0; a < s.nch[i]; a++)
      umax = s.ch[i][a].u > umax ? s.ch[i][a].u : umax;
    s.suffix[d] = s.suffix[d + 1] + umax;
    s.lsuffix[d] = s.lsuffix[d + 1] + s.red[i][0];
  }
  memcpy(s.best, inc, n * sizeof *inc);
  s.best_u = inc_u + margin;
  s.have_best = 1;
  bb_search(&s, 0, 0.0);
  *complete = !s.out_of_nodes;
  if (s.found) {
    *found = 1;
    memcpy(inc, s.best, n * sizeof *inc);
  }
out:
  if (s.ch != NULL)
    for (size_t i = 0; i < n; i++)
      free(s.ch[i]);
  if (s.red != NULL)
    for (size_t i = 0; i < n; i++)
      free(s.red[i]);
  free(s.ch);
  free(s.red);
  free(s.order);
  free(s.nch);
  free(s.suffix);
  free(s.lsuffix);
  free(s.cur);
  free(s.best);
  free(spread);
  return st;
}

double pol_place_total(const pol_model *m, const kv_policy_place *pl)
{
  double u = 0;
  for (size_t i = 0; i < m->n; i++) /* the same summation order as kv_policy_evaluate */
    u += pol_util_place(m, &m->ctx[i], &pl[i]);
  return u;
}

kvdb_status pol_search(const pol_model *m, kv_policy_place *place, double margin,
                       int lambda_mode, uint64_t max_work, size_t max_choices, int *improved)
{
  int complete;
  *improved = 0;
  if (m->n == 0 || m->n > SEARCH_MAX_CONTEXTS)
    return KVDB_OK;
  kvdb_status st = pol_bb_run(m, place, pol_place_total(m, place), margin, lambda_mode,
                              UINT64_MAX, max_work, max_choices, &complete, improved);
  return st == KVDB_UNSUPPORTED ? KVDB_OK : st;
}
