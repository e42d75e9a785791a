/* SPDX-License-Identifier: MIT */
/*
 * bench/bench_policy_sim.c — `kvdb-bench policy` parts 4 and 5: the policies on the trace
 * (LRU, fixed compression + LRU, EvicPress and per byte through policy/), each request's
 * TTFT and quality by the policy model; then EvicPress against the baselines at equal quality.
 */
#define _GNU_SOURCE
#include "bench_policy.h"

typedef struct lru_list {
  int32_t *prev, *next;
  int32_t head, tail; /* head = most recent */
  uint64_t used, cap;
} lru_list;

static void lru_init(lru_list *l, int32_t *prev, int32_t *next, uint64_t cap)
{
  l->prev = prev;
  l->next = next;
  l->head = l->tail = -1;
  l->used = 0;
  l->cap = cap;
}

static void lru_unlink(lru_list *l, int32_t i)
{
  if (l->prev[i] >= 0)
    l->next[l->prev[i]] = l->next[i];
  else
    l->head = l->next[i];
  if (l->next[i] >= 0)
    l->prev[l->next[i]] = l->prev[i];
  else
    l->tail = l->prev[i];
}

static void lru_push_front(lru_list *l, int32_t i)
{
  l->prev[i] = -1;
  l->next[i] = l->head;
  if (l->head >= 0)
    l->prev[l->head] = i;
  l->head = i;
  if (l->tail < 0)
    l->tail = i;
}

int pb_model_init(model *md, const trace *tr, const tiers_m *tm, int decoded)
{
  md->decoded = decoded;
  md->tiers[0] = (kv_policy_tier){"dram", (uint64_t)((double)tr->raw_total * PB_DRAM_FRAC),
                                  tm->dram_bps, tm->dram_lat_s,
                                  KV_POLICY_TIER_INCLUSIVE |
                                      (decoded ? (uint32_t)KV_POLICY_TIER_DECODED : 0u)};
  md->tiers[1] = (kv_policy_tier){"ssd", (uint64_t)((double)tr->raw_total * PB_SSD_FRAC),
                                  tm->ssd_bps, tm->ssd_lat_s, 0};
  kv_policy_params_init(&md->p);
  md->p.tiers = md->tiers;
  md->p.n_tiers = 2;
  md->p.prefill_tokens_per_s = PB_PREFILL_TPS;
  md->ttft = malloc((size_t)tr->n * NCFG * 2 * sizeof *md->ttft);
  md->prefill = malloc((size_t)tr->n * sizeof *md->prefill);
  md->dram = malloc((size_t)tr->n * NCFG * sizeof *md->dram);
  if (md->ttft == NULL || md->prefill == NULL || md->dram == NULL)
    return -1;
  for (uint32_t i = 0; i < tr->n; i++) {
    kv_policy_context c;
    memset(&c, 0, sizeof c);
    c.options = tr->c[i].opt;
    c.n_options = NCFG;
    c.raw_bytes = tr->c[i].raw;
    c.n_tokens = tr->c[i].ptok;
    c.frequency = 1;
    c.current = kv_policy_place_none();
    for (uint32_t k = 0; k < NCFG; k++) {
      kv_policy_place a = {1, (int32_t)k, 1}, b = {1, (int32_t)k, 0};
      md->ttft[((size_t)i * NCFG + k) * 2 + 0] = kv_policy_ttft(&md->p, &c, a);
      md->ttft[((size_t)i * NCFG + k) * 2 + 1] = kv_policy_ttft(&md->p, &c, b);
      const kv_policy_option *x = &tr->c[i].opt[k];
      md->dram[(size_t)i * NCFG + k] =
          !decoded ? x->bytes : x->decoded_bytes ? x->decoded_bytes : tr->c[i].raw;
    }
    md->prefill[i] = kv_policy_ttft(&md->p, &c, kv_policy_place_none());
    if (!isfinite(md->prefill[i]) || !isfinite(md->ttft[(size_t)i * NCFG * 2])) {
      bench_log("context %u: the policy model refuses it", i);
      return -1;
    }
  }
  return 0;
}

void pb_model_free(model *md)
{
  free(md->ttft);
  free(md->prefill);
  free(md->dram);
  memset(md, 0, sizeof *md);
}

/* LRU eviction over DRAM (inclusive) and SSD, every context in config `cfg`. */
int pb_sim_lru(const trace *tr, const model *md, uint32_t cfg, result *res)
{
  uint32_t n = tr->n;
  int32_t *buf = malloc(4 * (size_t)n * sizeof *buf);
  uint8_t *in_d = calloc(n, 1), *in_s = calloc(n, 1);
  if (buf == NULL || in_d == NULL || in_s == NULL) {
    free(buf);
    free(in_d);
    free(in_s);
    return -1;
  }
  lru_list D, S;
  lru_init(&D, buf, buf + n, md->tiers[0].capacity_bytes);
  lru_init(&S, buf + 2 * (size_t)n, buf + 3 * (size_t)n, md->tiers[1].capacity_bytes);
  acc a;
  memset(&a, 0, sizeof a);
  for (size_t r = 0; r < tr->n_req; r++) {
    int32_t i = (int32_t)tr->req[r];
    uint64_t b = tr->c[i].opt[cfg].bytes, bd = md->dram[(size_t)i * NCFG + cfg];
    int meas = r >= tr->n_warm;
    double wbytes = 0;
    if (in_d[i]) {
      if (meas)
        acc_add(&a, md->ttft[((size_t)i * NCFG + cfg) * 2], tr->c[i].qs[cfg], 0);
      lru_unlink(&D, i);
      lru_push_front(&D, i);
      lru_unlink(&S, i);
      lru_push_front(&S, i);
      continue;
    }
    if (in_s[i]) {
      if (meas)
        acc_add(&a, md->ttft[((size_t)i * NCFG + cfg) * 2 + 1], tr->c[i].qs[cfg], 1);
      lru_unlink(&S, i);
      lru_push_front(&S, i);
    } else {
      if (meas)
        acc_add(&a, md->prefill[i], 1.0, 2);
      if (b > S.cap)
        continue;
      while (S.used + b > S.cap) { /* leaving the SSD leaves the store (and DRAM) */
        int32_t v = S.tail;
        lru_unlink(&S, v);
        in_s[v] = 0;
        S.used -= tr->c[v].opt[cfg].bytes;
        if (in_d[v]) {
          lru_unlink(&D, v);
          in_d[v] = 0;
          D.used -= md->dram[(size_t)v * NCFG + cfg];
        }
      }
      lru_push_front(&S, i);
      in_s[i] = 1;
      S.used += b;
      wbytes += (double)b;
    }
    if (bd <= D.cap) { /* into DRAM: the put, or an SSD hit promoted */
      while (D.used + bd > D.cap) {
        int32_t v = D.tail;
        lru_unlink(&D, v);
        in_d[v] = 0;
        D.used -= md->dram[(size_t)v * NCFG + cfg];
      }
      lru_push_front(&D, i);
      in_d[i] = 1;
      D.used += bd;
      wbytes += (double)bd;
    }
    if (meas)
      a.wbytes += wbytes;
  }
  acc_result(&a, res);
  free(buf);
  free(in_d);
  free(in_s);
  return 0;
}

/* kvdb_recompress's rule (policy.h's kv_policy_config_reachable), made stricter for a
 * quantized context: dropping tokens from it keeps its bits (the kept rows are not exact), so
 * a quantized context does not become a token-dropping config with exact rows (bits 0). */
static int cfg_reachable(const kvdb_config *have, const kvdb_config *want)
{
  return kv_policy_config_reachable(have, want) &&
         (have->method != KVDB_METHOD_QUANT || want->bits != 0);
}

/* The EvicPress policy: admit on every put, rebalance every N/2 requests. */
typedef struct evsim {
  const trace *tr;
  const model *md;
  const cfgm *cm;
  kv_policy_params p;
  int32_t *cfg;      /* [n] stored config, -1 = not stored */
  uint8_t *cached;   /* [n] */
  double *f;         /* [n] decayed count at time ft */
  double *ft;
  kv_policy_option *ro; /* [n][NCFG] reachable options */
  uint8_t *rmap;     /* [n][NCFG] their configs */
  uint8_t *nro;      /* [n] */
  kv_policy_context *pc;
  uint32_t *idx;     /* instance index -> context */
  kv_policy_ws *ws;
  acc a;
  uint64_t recompress, moves, promoted;
  uint64_t dram_used; /* bytes of the cached contexts in the DRAM tier */
  double half_life;   /* of the frequencies, requests */
  int rate_k;         /* > 0: frequency = max(decayed count, K / (time since the K-th last
                         access) in count units) */
  double *tk;         /* [n][PB_RATE_K_MAX] the last accesses' times, most recent first */
  uint32_t *cand;     /* [n] promotion: cached contexts by gain per byte */
  double *cgain;      /* [n] */
} evsim;

static void ev_reach(evsim *e, uint32_t i)
{
  const tctx *c = &e->tr->c[i];
  uint8_t k = 0;
  for (uint32_t j = 0; j < NCFG; j++)
    if (e->cfg[i] < 0 || cfg_reachable(&e->cm[e->cfg[i]].cfg, &e->cm[j].cfg)) {
      e->ro[(size_t)i * NCFG + k] = c->opt[j];
      e->rmap[(size_t)i * NCFG + k] = (uint8_t)j;
      k++;
    }
  e->nro[i] = k;
}

#define PB_RATE_K_MAX 8

static double ev_freq(const evsim *e, uint32_t i, double now)
{
  double f = kv_policy_decay(e->f[i], now - e->ft[i], e->half_life, 0);
  if (e->rate_k > 0) { /* the K-th last access's rate, in the decayed count's units */
    double tk = e->tk[(size_t)i * PB_RATE_K_MAX + (e->rate_k - 1)];
    if (tk >= 0) {
      double r = (double)e->rate_k / (now - tk + 1.0) * e->half_life / 0.6931471805599453;
      f = r > f ? r : f;
    }
  }
  return f;
}

/* An access at `now`: the last K access times shift (rate_k > 0). */
static void ev_touch(evsim *e, uint32_t i, double now)
{
  if (e->rate_k <= 0)
    return;
  double *t = &e->tk[(size_t)i * PB_RATE_K_MAX];
  for (int k = e->rate_k - 1; k > 0; k--)
    t[k] = t[k - 1];
  t[0] = now;
}

/* Build the instance: every stored context (index order) and, if in >= 0, context `in` last. */
static size_t ev_instance(evsim *e, double now, int64_t in)
{
  size_t m = 0;
  for (uint32_t i = 0; i < e->tr->n; i++) {
    if (e->cfg[i] < 0 || (int64_t)i == in)
      continue;
    kv_policy_context *c = &e->pc[m];
    c->options = &e->ro[(size_t)i * NCFG];
    c->n_options = e->nro[i];
    c->raw_bytes = e->tr->c[i].raw;
    c->n_tokens = e->tr->c[i].ptok;
    c->frequency = ev_freq(e, i, now);
    int32_t sub = -1;
    for (uint32_t k = 0; k < e->nro[i]; k++)
      if (e->rmap[(size_t)i * NCFG + k] == (uint8_t)e->cfg[i])
        sub = (int32_t)k;
    c->current = (kv_policy_place){1, sub, e->cached[i]};
    e->idx[m++] = i;
  }
  if (in >= 0) {
    uint32_t i = (uint32_t)in;
    kv_policy_context *c = &e->pc[m];
    c->options = &e->ro[(size_t)i * NCFG];
    c->n_options = e->nro[i];
    c->raw_bytes = e->tr->c[i].raw;
    c->n_tokens = e->tr->c[i].ptok;
    c->frequency = ev_freq(e, i, now);
    c->current = kv_policy_place_none();
    e->idx[m++] = i;
  }
  return m;
}

static void ev_apply(evsim *e, const kv_policy_plan *plan, double *wbytes)
{
  for (size_t k = 0; k < plan->n_moves; k++) {
    const kv_policy_move *mv = &plan->moves[k];
    uint32_t i = e->idx[mv->context];
    int32_t old = e->cfg[i];
    if (mv->to.tier == KV_POLICY_NONE) {
      if (e->cached[i])
        e->dram_used -= e->md->dram[(size_t)i * NCFG + (uint32_t)old];
      e->cfg[i] = -1;
      e->cached[i] = 0;
    } else {
      int32_t ncfg = e->rmap[(size_t)i * NCFG + (uint32_t)mv->to.option];
      const tctx *c = &e->tr->c[i];
      if (e->cached[i])
        e->dram_used -= e->md->dram[(size_t)i * NCFG + (uint32_t)old];
      if (mv->to.cached)
        e->dram_used += e->md->dram[(size_t)i * NCFG + (uint32_t)ncfg];
      if (ncfg != old) /* a put or a re-encoding writes the persistent copy */
        *wbytes += (double)c->opt[ncfg].bytes;
      if (mv->to.cached && (!e->cached[i] || ncfg != old))
        *wbytes += (double)e->md->dram[(size_t)i * NCFG + (uint32_t)ncfg];
      if (old >= 0 && ncfg != old)
        e->recompress++;
      e->cfg[i] = ncfg;
      e->cached[i] = mv->to.cached ? 1 : 0;
    }
    e->moves++;
  }
  for (size_t k = 0; k < plan->n_moves; k++) {
    uint32_t i = e->idx[plan->moves[k].context];
    ev_reach(e, i);
  }
}

/* Promotion on a hit, as the engine does it (engine/place/placer.c PROMOTION; every rule but
 * KV_POLICY_LEAST_DROP): a hit of a context stored but not cached asks whether caching it pays:
 * its utility gain cached per DRAM byte, f x (TTFT from its tier - TTFT from DRAM) / bytes,
 * against the least such gain among the contexts cached now, by PB_PROMOTE_MARGIN. When it
 * does, it is cached: alone when it fits, else in place of the cached contexts of least gain
 * per byte (each below its own by the margin), least first, when they free enough room. Its
 * config and persistent copy stay (a get moves no stored context); the DRAM copy is written. */
#define PB_PROMOTE_MARGIN 1.25

static double ev_cache_gain(const evsim *e, uint32_t i, double now)
{
  size_t k = (size_t)i * NCFG + (uint32_t)e->cfg[i];
  double b = (double)e->md->dram[k];
  return ev_freq(e, i, now) * (e->md->ttft[k * 2 + 1] - e->md->ttft[k * 2]) / (b > 0 ? b : 1);
}

static int cmp_gain_idx(const void *a, const void *b, void *arg)
{
  const double *g = arg;
  uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
  return g[x] < g[y] ? -1 : g[x] > g[y] ? 1 : (x > y) - (x < y);
}

static void ev_promote(evsim *e, uint32_t i, double now, double *wbytes)
{
  const model *md = e->md;
  size_t ki = (size_t)i * NCFG + (uint32_t)e->cfg[i];
  uint64_t bi = md->dram[ki], cap = md->tiers[0].capacity_bytes;
  if (bi > cap)
    return;
  double gi = ev_cache_gain(e, i, now);
  if (!(gi > 0))
    return;
  size_t nc = 0;
  double least = INFINITY;
  for (uint32_t j = 0; j < e->tr->n; j++)
    if (e->cfg[j] >= 0 && e->cached[j]) {
      e->cgain[j] = ev_cache_gain(e, j, now);
      least = e->cgain[j] < least ? e->cgain[j] : least;
      e->cand[nc++] = j;
    }
  if (nc > 0 && !(gi > least * PB_PROMOTE_MARGIN))
    return;
  uint64_t room = cap - (e->dram_used < cap ? e->dram_used : cap);
  size_t take = 0;
  if (room < bi) {
    qsort_r(e->cand, nc, sizeof *e->cand, cmp_gain_idx, e->cgain);
    while (take < nc && room < bi && e->cgain[e->cand[take]] * PB_PROMOTE_MARGIN < gi) {
      uint32_t j = e->cand[take++];
      room += md->dram[(size_t)j * NCFG + (uint32_t)e->cfg[j]];
    }
    if (room < bi)
      return;
  }
  for (size_t k = 0; k < take; k++) {
    uint32_t j = e->cand[k];
    e->cached[j] = 0;
    e->dram_used -= md->dram[(size_t)j * NCFG + (uint32_t)e->cfg[j]];
    e->moves++;
  }
  e->cached[i] = 1;
  e->dram_used += bi;
  *wbytes += (double)bi;
  e->moves++;
  e->promoted++;
}

int pb_sim_evicpress(const trace *tr, const model *md, const cfgm *cm, double alpha,
                     kv_policy_rule rule, result *res)
{
  uint32_t n = tr->n;
  evsim e;
  memset(&e, 0, sizeof e);
  e.tr = tr;
  e.md = md;
  e.cm = cm;
  e.p = md->p;
  e.p.alpha = alpha;
  e.p.rule = rule;
  e.cfg = malloc(n * sizeof *e.cfg);
  e.cached = calloc(n, 1);
  e.f = calloc(n, sizeof *e.f);
  e.ft = calloc(n, sizeof *e.ft);
  e.ro = malloc((size_t)n * NCFG * sizeof *e.ro);
  e.rmap = malloc((size_t)n * NCFG);
  e.nro = malloc(n);
  e.pc = calloc(n, sizeof *e.pc);
  e.idx = malloc(n * sizeof *e.idx);
  e.ws = kv_policy_ws_create();
  e.cand = malloc(n * sizeof *e.cand);
  e.cgain = malloc(n * sizeof *e.cgain);
  const char *pe = getenv("KVDB_BENCH_POLICY_PROMOTE"); /* 0: the simulation without it */
  int promote = rule != KV_POLICY_LEAST_DROP && !(pe != NULL && strcmp(pe, "0") == 0);
  const char *he = getenv("KVDB_BENCH_POLICY_HL"); /* experiments: half-life x contexts */
  e.half_life = (he != NULL ? atof(he) : PB_HALF_LIFE_PER_CTX) * n;
  const char *ke = getenv("KVDB_BENCH_POLICY_RATE_K"); /* experiments */
  e.rate_k = ke != NULL ? atoi(ke) : 0;
  if (e.rate_k > PB_RATE_K_MAX)
    e.rate_k = PB_RATE_K_MAX;
  e.tk = malloc((size_t)n * PB_RATE_K_MAX * sizeof *e.tk);
  if (e.tk != NULL)
    for (size_t k = 0; k < (size_t)n * PB_RATE_K_MAX; k++)
      e.tk[k] = -1;
  int rc = -1;
  if (!e.cfg || !e.cached || !e.f || !e.ft || !e.ro || !e.rmap || !e.nro || !e.pc || !e.idx ||
      !e.ws || !e.cand || !e.cgain || !e.tk) {
    bench_log("out of memory (simulation)");
    goto out;
  }
  for (uint32_t i = 0; i < n; i++) {
    e.cfg[i] = -1;
    ev_reach(&e, i);
  }
  const char *re = getenv("KVDB_BENCH_POLICY_REBAL"); /* experiments: rebalance every n/x */
  size_t rdiv = re != NULL && atoi(re) > 0 ? (size_t)atoi(re) : 2;
  size_t every = n / rdiv > 0 ? n / rdiv : 1;
  for (size_t r = 0; r < tr->n_req; r++) {
    uint32_t i = tr->req[r];
    double now = (double)r;
    int meas = r >= tr->n_warm;
    e.f[i] = kv_policy_decay(e.f[i], now - e.ft[i], e.half_life, 1);
    ev_touch(&e, i, now);
    e.ft[i] = now;
    double wbytes = 0;
    if (e.cfg[i] >= 0) {
      int where = e.cached[i] ? 0 : 1;
      if (meas)
        acc_add(&e.a, md->ttft[((size_t)i * NCFG + (uint32_t)e.cfg[i]) * 2 + (size_t)where],
                tr->c[i].qs[e.cfg[i]], where);
      if (where == 1 && promote)
        ev_promote(&e, i, now, &wbytes);
    } else {
      if (meas)
        acc_add(&e.a, md->prefill[i], 1.0, 2);
      size_t m = ev_instance(&e, now, i), in = m - 1;
      kv_policy_plan plan;
      kv_policy_err err;
      kvdb_status st = kv_policy_admit_ws(e.ws, &e.p, e.pc, m, &in, 1, &plan, &err);
      if (st != KVDB_OK) {
        pfail("kv_policy_admit", st, &err);
        goto out;
      }
      ev_apply(&e, &plan, &wbytes);
      kv_policy_plan_free(&plan);
    }
    if ((r + 1) % every == 0) {
      size_t m = ev_instance(&e, now, -1);
      kv_policy_plan plan;
      kv_policy_err err;
      kvdb_status st = kv_policy_rebalance_ws(e.ws, &e.p, e.pc, m, &plan, &err);
      if (st != KVDB_OK) {
        pfail("kv_policy_rebalance", st, &err);
        goto out;
      }
      ev_apply(&e, &plan, &wbytes);
      kv_policy_plan_free(&plan);
    }
    if (meas)
      e.a.wbytes += wbytes;
  }
  for (uint32_t i = 0; i < n; i++) /* configs in use at the end (EvicPress Figure 11) */
    if (e.cfg[i] >= 0)
      (e.cached[i] ? res->hist_cached : res->hist_ssd)[e.cfg[i]]++;
  acc_result(&e.a, res);
  res->recompress = e.recompress;
  res->moves = e.moves;
  res->promoted = e.promoted;
  rc = 0;
out:
  free(e.cfg);
  free(e.cached);
  free(e.f);
  free(e.ft);
  free(e.ro);
  free(e.rmap);
  free(e.nro);
  free(e.pc);
  free(e.idx);
  free(e.cand);
  free(e.cgain);
  free(e.tk);
  kv_policy_ws_free(e.ws);
  return rc;
}

/* ---- 5. comparisons -------------------------------------------------------------------------- */

/* The lowest EvicPress mean TTFT among runs of mean quality >= q (-1 when none reaches q). */
static double ev_ttft_at(const result *ev, size_t n_ev, double q, size_t *which)
{
  double best = -1;
  for (size_t k = 0; k < n_ev; k++)
    if (ev[k].quality >= q && (best < 0 || ev[k].ttft < best)) {
      best = ev[k].ttft;
      *which = k;
    }
  return best;
}

/* The highest EvicPress mean quality among runs of mean TTFT <= t (-1 when none). */
static double ev_quality_at(const result *ev, size_t n_ev, double t)
{
  double best = -1;
  for (size_t k = 0; k < n_ev; k++)
    if (ev[k].ttft <= t && ev[k].quality > best)
      best = ev[k].quality;
  return best;
}

/* fixed[0] is LRU (raw); fixed[1..] the compressed configs. on_front[k] is set for front
 * points; gains are taken at the compressed front points of quality >= floor x LRU's. */
void pb_compare(const result *fixed, size_t n_fixed, const result *ev, size_t n_ev,
                double floor, uint8_t *on_front, double *pt_gain, double *pt_qgain, gains *g)
{
  memset(g, 0, sizeof *g);
  const result *lru = &fixed[0];
  size_t w = 0;
  double t = ev_ttft_at(ev, n_ev, 0.97 * lru->quality, &w);
  g->vs_lru_3pct = t > 0 ? lru->ttft / t : 0;
  g->lru_3pct_run = w;
  g->vs_compress = INFINITY;
  double lsum = 0, qsum = 0;
  g->q_gain_min = INFINITY;
  for (size_t k = 0; k < n_fixed; k++) {
    int dominated = 0;
    for (size_t j = 0; j < n_fixed && !dominated; j++)
      dominated = j != k && fixed[j].ttft <= fixed[k].ttft && fixed[j].quality >= fixed[k].quality &&
                  (fixed[j].ttft < fixed[k].ttft || fixed[j].quality > fixed[k].quality);
    on_front[k] = !dominated;
    pt_gain[k] = pt_qgain[k] = NAN;
    if (dominated || k == 0 || fixed[k].quality < floor * lru->quality)
      continue;
    size_t which = 0;
    double te = ev_ttft_at(ev, n_ev, fixed[k].quality, &which);
    double gk = te > 0 ? fixed[k].ttft / te : 0; /* not reached: counts as no gain at all */
    g->unreached += te <= 0;
    double qe = ev_quality_at(ev, n_ev, fixed[k].ttft);
    double qg = qe >= 0 ? qe - fixed[k].quality : -fixed[k].quality;
    pt_gain[k] = gk;
    pt_qgain[k] = qg;
    if (gk < g->vs_compress) {
      g->vs_compress = gk;
      g->worst_point = k;
    }
    lsum += log(gk > 0 ? gk : 1e-300);
    qsum += qg;
    g->q_gain_min = qg < g->q_gain_min ? qg : g->q_gain_min;
    g->n_points++;
  }
  if (g->n_points == 0) {
    g->vs_compress = 0;
    g->q_gain_min = 0;
  } else {
    g->vs_compress_geo = exp(lsum / (double)g->n_points);
    g->q_gain_mean = qsum / (double)g->n_points;
  }
}
