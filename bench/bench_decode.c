/* SPDX-License-Identifier: MIT */
/*
 * bench/bench_decode.c — `kvdb-bench decode` (issue 18): decode steps from the store through a
 * decode session (kvdb.h "Decoding from the store"), the I/O figures of a step against reading
 * the whole context, measured in the same run.
 *
 * SHAPE. Llama-3-8B's KV (8 KV heads, head_dim 128, 32 query heads: G = 4; f16), a context of
 * 32768 tokens (4096 with --quick), block_tokens 4096 (one checksum page per section covers its
 * 256 page groups), int4 score copies (an eighth of K and V to scan per step). Of the model's 32
 * layers, 4 are stored and decoded (2 with --quick): every figure is per layer (the same shape
 * for each of the 32), and 32 layers of 32k tokens are 4 GiB of K and V, past what this
 * machine's time budget reads per run. Stated in the report and the JSON (layers_run).
 *
 * DATA. Keys and values: bench/datagen.c (per-channel log-normal scales, outlier K channels, a
 * prefix-dependent value per token), its keys then reshaped (--keys model, the default) so that
 * the top-10% selections have the statistics of the real model's: stories260K (tools/refmodel)
 * decodes greedily from BOS; at each of its steps past 3/5 of its 320 positions, for every
 * (layer, KV head), the group-summed query's exact q·K over the prefix gives the top 10%, and
 * measure_model() records (sel_stats): the share of the top k in the last 1, 5 and 25% of the
 * positions (recency), P(position t+1 picked | t picked) and the picks per occupied 16-token
 * group and their run lengths outside the last 5% (clustering), the share of the previous
 * step's picks picked again (persistence), and rho, the mean cosine of consecutive queries.
 * The synthetic keys (syn_keys, syn_head): per (layer, KV head) every channel's deviation from
 * its bias is made an AR(1) chain along positions (coefficient c: neighbouring keys alike, so a
 * query picking one tends to pick its neighbours), the keys' part along a random unit
 * direction u is replaced by a recency boost b(t) = R sigma exp(-(N - 1 - t) / (tau N)) / Mq
 * (sigma: the standard deviation of a score; appended tokens 1), and every query gets a
 * constant part Mq / G u, so q·k gains b(t). Queries: per (layer, query head) an AR(1) process
 * in the keys' channel space, q_t = rho' q_{t-1} + sqrt(1 - rho'^2) e_t, e_t normal with the K
 * channel's scale per dimension, plus the constant part. R, tau, c and rho' are fitted by
 * bisection (syn_fit) so that the exact top 10% of the synthetic keys under those queries
 * (syn_eval: 2 heads of layer 0, 10 steps) has the model's recent-5% and recent-25% shares,
 * P(next | picked) and persistence; the other statistics are compared, not fitted: the report
 * and the JSON (model_* vs synthetic_*) print them side by side. --keys independent keeps
 * datagen's keys (independent token to token: no recency, no clustering; rho' = rho), the
 * worst case for page groups. Without the model files: datagen's keys and rho = 0.9.
 * STEPS. Three sessions, one after the other on the same (growing) context, recent window
 * W = 64, hot pool 25% of the context per layer and KV head, budget k = 10% of the context per
 * KV head, scoring on the emulated near-data device for the SSD tier:
 *   token rows    the exact top k; cold rows gathered on the device (only they cross)
 *   page groups   KVDB_DECODE_PAGE_GROUPS: the cold picks as whole 4 KiB page groups, read and
 *                 verified by the host; the device scores everything (beta 0)   <- the JSON's
 *                 headline fields
 *   app           page groups with APP's split of the scoring (beta per step, Eq. 2-4)
 * Each step: page cache dropped (fadvise + drop_caches on the run directory), then for every
 * layer select + fetch (timed: the step's scoring and I/O), then the step's new token appended
 * (its K and V: datagen's next token). 16 warm-up steps, then 16 measured (8 with --quick).
 *   hot_pool_hit            selected rows served from DRAM / rows selected (measured steps)
 *   step_read_amplification bytes fetches read from segment files / bytes of the cold rows' K
 *                           and V (the page groups around each cold row come with it)
 *   host_bytes_ratio        bytes crossing to the host per step (score pairs or the copies the
 *                           host read + rows the host read or the device sent) / the
 *                           context's K and V (the layers run)
 *   step_io_vs_full         mean step time / time of kvdb_get of the whole context, cold
 *                           (the baseline, same run, same layers)
 *   agreement_20pct         from the model side (bench/bench_decode_model.c,
 *                           bench_decode_agreement), null when that part is not linked
 * The other variants' figures carry the prefixes token_ and app_.
 */
#define _GNU_SOURCE
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "datagen.h"
#include "kvdb.h"
#include "refmodel.h"
#include "shared_paths.h"

/* The model side's figure (bench/bench_decode_model.c): greedy agreement of sparse decoding
 * through a session with dense attention on stories260K at a 20% budget, its curve added to j.
 * Returns 0 and *agreement_20pct, or non-zero when it could not run (the field is then null).
 * Weak: absent until that file is linked. */
int bench_decode_agreement(const bench_env *env, bench_json *j, double *agreement_20pct)
    __attribute__((weak));

#define BD_HEADS 8
#define BD_DIM 128
#define BD_G 4
#define BD_W 64
#define BD_WARM 16
#define BD_HOT_PCT 25 /* hot pool per layer and KV head, % of the context */
#define BD_BT 4096 /* block_tokens: one checksum page per section covers 256 page groups */
#define BD_BITS 4  /* int4 score copies: an eighth of K and V to scan per step */
#define BD_COLD_PM 200 /* the cold budget variant: kvdb_decode_opts.cold_share_permille */

/* Statistics of top-k selections (the model's or the synthetic context's), summed over the
 * (step, layer, KV head) samples: what decides hot-pool hits and page-group amplification.
 * "Recent" is the last 5% of the positions (at least one), "old" the positions before it. */
typedef struct sel_stats {
  double n;                 /* samples */
  double rec1, rec5, rec25; /* share of the top k in the last 1 / 5 / 25% of positions */
  double old_rate;          /* share of the old positions selected */
  double nb_sel, nb_both;   /* old picks t with t+1 old; of them, t+1 picked too */
  double g_occ, g_picks;    /* whole 16-token groups of the old part holding a pick; their picks */
  double runs, run_len;     /* runs of consecutive picks inside those groups: number, total length */
  double pers;              /* persistence: share of the previous step's picks picked again */
  double n_pers;
} sel_stats;

static int cmp_desc(const void *a, const void *b)
{
  float x = *(const float *)a, y = *(const float *)b;
  return x < y ? 1 : x > y ? -1 : 0;
}

/* sel[0..n) = 1 for the top k of sc (ties at the threshold included); tmp holds n floats. */
static void topk_mask(const float *sc, uint32_t n, uint32_t k, uint8_t *sel, float *tmp)
{
  memcpy(tmp, sc, (size_t)n * sizeof *tmp);
  qsort(tmp, n, sizeof *tmp, cmp_desc);
  float thr = tmp[k - 1];
  for (uint32_t t = 0; t < n; t++)
    sel[t] = sc[t] >= thr;
}

/* Add one selection sel[0..n) (k picks); prev, if not NULL, is the previous step's over
 * positions [0, n_prev). */
static void sel_add(sel_stats *a, const uint8_t *sel, uint32_t n, uint32_t k, const uint8_t *prev,
                    uint32_t n_prev)
{
  uint32_t r1 = n - (n / 100 > 0 ? n / 100 : 1), r5 = n - (n / 20 > 0 ? n / 20 : 1),
           r25 = n - (n / 4 > 0 ? n / 4 : 1);
  double c1 = 0, c5 = 0, c25 = 0, old = 0;
  for (uint32_t t = 0; t < n; t++) {
    c1 += sel[t] && t >= r1;
    c5 += sel[t] && t >= r5;
    c25 += sel[t] && t >= r25;
    old += sel[t] && t < r5;
    if (sel[t] && t + 1 < r5) {
      a->nb_sel++;
      a->nb_both += sel[t + 1];
    }
  }
  a->rec1 += c1 / k;
  a->rec5 += c5 / k;
  a->rec25 += c25 / k;
  a->old_rate += r5 ? old / r5 : 0;
  for (uint32_t g = 0; g + 16 <= r5; g += 16) {
    uint32_t picks = 0;
    for (uint32_t t = g; t < g + 16; t++) {
      picks += sel[t];
      if (sel[t] && (t == g || !sel[t - 1]))
        a->runs++;
    }
    a->g_occ += picks > 0;
    a->g_picks += picks;
    a->run_len += picks;
  }
  a->n++;
  if (prev != NULL) {
    uint32_t pk = 0, kept = 0;
    for (uint32_t t = 0; t < n_prev && t < n; t++)
      if (prev[t]) {
        pk++;
        kept += sel[t];
      }
    if (pk > 0) {
      a->pers += (double)kept / pk;
      a->n_pers++;
    }
  }
}

/* The means of the sums (in place). */
typedef struct sel_fig {
  double rec1, rec5, rec25, old_rate, p_nb, per_group, run_len, pers;
} sel_fig;

static sel_fig sel_mean(const sel_stats *a)
{
  sel_fig f;
  double n = a->n > 0 ? a->n : NAN;
  f.rec1 = a->rec1 / n;
  f.rec5 = a->rec5 / n;
  f.rec25 = a->rec25 / n;
  f.old_rate = a->old_rate / n;
  f.p_nb = a->nb_sel > 0 ? a->nb_both / a->nb_sel : NAN;
  f.per_group = a->g_occ > 0 ? a->g_picks / a->g_occ : NAN;
  f.run_len = a->runs > 0 ? a->run_len / a->runs : NAN;
  f.pers = a->n_pers > 0 ? a->pers / a->n_pers : NAN;
  return f;
}

typedef struct model_stats {
  int measured;
  double rho;
  sel_fig f; /* the top-10% selections' statistics */
} model_stats;

static void model_find(const bench_env *env, char *model, char *tok, size_t cap, int *ok)
{
  char where[8000];
  *ok = 0;
  if (env->model_dir != NULL) {
    snprintf(model, cap, "%.4000s/stories260K/stories260K.bin", env->model_dir);
    snprintf(tok, cap, "%.4000s/stories260K/tok512.bin", env->model_dir);
    *ok = bench_file_exists(model) && bench_file_exists(tok);
    return;
  }
  *ok = shared_find_model(model, tok, cap, where, sizeof where) == 0;
}

/* The query and selection statistics of stories260K's greedy decode (see DATA). */
static void measure_model(const bench_env *env, model_stats *ms)
{
  memset(ms, 0, sizeof *ms);
  ms->rho = 0.9;
  sel_stats acc;
  memset(&acc, 0, sizeof acc);
  ms->f = sel_mean(&acc);
  char model[8192], tok[8192];
  int ok;
  model_find(env, model, tok, sizeof model, &ok);
  refmodel_model *rm = NULL;
  refmodel_state *st = NULL;
  if (!ok || refmodel_model_load(model, &rm) != REFMODEL_OK)
    return;
  const refmodel_config *c = refmodel_model_config(rm);
  int P = c->seq_len < 320 ? c->seq_len : 320, from = P * 3 / 5;
  if (refmodel_state_new(rm, P, &st) != REFMODEL_OK) {
    refmodel_model_free(rm);
    return;
  }
  int hs = c->head_size, G = c->n_heads / c->n_kv_heads, nkv = c->n_kv_heads;
  size_t nh = (size_t)c->n_layers * nkv;
  float *prevq = calloc(nh * hs, sizeof(float)), *sc = malloc((size_t)P * sizeof(float));
  float *tmp = malloc((size_t)P * sizeof(float));
  uint8_t *prevsel = calloc(nh * (size_t)P, 1), *sel = malloc((size_t)P);
  double cos_sum = 0;
  long n_cos = 0;
  int token = 1;
  for (int p = 0; p < P && prevq && sc && tmp && prevsel && sel; p++) {
    const float *logits;
    if (refmodel_forward(st, token, p, &logits) != REFMODEL_OK)
      break;
    token = refmodel_argmax(logits, c->vocab_size);
    if (p < from)
      continue;
    uint32_t n = (uint32_t)p + 1, k = n / 10 > 0 ? n / 10 : 1;
    for (int l = 0; l < c->n_layers; l++) {
      const float *q = refmodel_state_query(st, l);
      const float *K = refmodel_state_key(st, l, 0);
      for (int h = 0; h < nkv; h++) {
        float qs[256];
        for (int d = 0; d < hs; d++) {
          qs[d] = 0;
          for (int g = 0; g < G; g++)
            qs[d] += q[(h * G + g) * hs + d];
        }
        float *pq = prevq + ((size_t)l * nkv + h) * hs;
        if (p > from) {
          double dot = 0, a = 0, b = 0;
          for (int d = 0; d < hs; d++) {
            dot += (double)qs[d] * pq[d];
            a += (double)qs[d] * qs[d];
            b += (double)pq[d] * pq[d];
          }
          if (a > 0 && b > 0) {
            cos_sum += dot / sqrt(a * b);
            n_cos++;
          }
        }
        memcpy(pq, qs, hs * sizeof(float));
        for (uint32_t t = 0; t < n; t++) {
          double s = 0;
          for (int d = 0; d < hs; d++)
            s += (double)qs[d] * K[(size_t)t * c->kv_dim + h * hs + d];
          sc[t] = (float)s;
        }
        topk_mask(sc, n, k, sel, tmp);
        uint8_t *ps = prevsel + ((size_t)l * nkv + h) * P;
        sel_add(&acc, sel, n, k, p > from ? ps : NULL, n - 1);
        memcpy(ps, sel, n);
      }
    }
  }
  if (n_cos > 0 && acc.n_pers > 0) {
    ms->measured = 1;
    ms->rho = cos_sum / n_cos;
    ms->f = sel_mean(&acc);
  }
  free(prevq);
  free(sc);
  free(tmp);
  free(prevsel);
  free(sel);
  refmodel_state_free(st);
  refmodel_model_free(rm);
}

static double gauss(dg_rng *r)
{
  double u = ((double)(dg_next(r) >> 11) + 0.5) / 9007199254740992.0;
  double v = ((double)(dg_next(r) >> 11) + 0.5) / 9007199254740992.0;
  return sqrt(-2 * log(u)) * cos(2 * M_PI * v);
}

/* ---- the synthetic keys (see DATA) ------------------------------------------------------- */

static float f16_to_f32(uint16_t h)
{
  uint32_t sign = (uint32_t)(h >> 15) << 31, e = (h >> 10) & 31, m = h & 1023, b;
  if (e == 0) {
    float f = ldexpf((float)m, -24);
    return sign ? -f : f;
  }
  b = e == 31 ? sign | 0x7f800000u | (m << 13) : sign | ((e + 112) << 23) | (m << 13);
  float f;
  memcpy(&f, &b, sizeof f);
  return f;
}

/* How the keys are made from datagen's: per (layer, KV head), every channel's deviation from
 * its bias follows an AR(1) chain along the positions (coefficient c: neighbouring tokens'
 * keys alike, so a query that picks one tends to pick its neighbours: the model's clustering),
 * the part along a direction u (random, unit) is replaced by b(t) / Mq u with the boost
 * b(t) = R sigma exp(-(N - 1 - t) / (tau N)) (1 for the appended tokens; sigma the standard
 * deviation of the query's score of a key), and every query head's query gets a constant part
 * Mq / G u (Mq 8 times the standard deviation of the summed query along u): q·k gains b(t),
 * the recency of the model's top k. The queries' AR(1) coefficient rho is refitted with them
 * (the recent picks persist, so the others must drift faster to keep the model's
 * persistence). c, R and rho are fitted by bisection to the model's P(neighbour picked |
 * picked), recent-5% share and persistence; every other statistic is compared, not fitted. */
typedef struct syn_keys {
  int on;          /* 0: datagen's keys unchanged ("independent") */
  double c, R, tau, rho;
} syn_keys;

/* The direction u of (layer, KV head), and sigma, Mq (see syn_keys). */
static void syn_dir(const dg_kv_model *dm, uint32_t l, uint32_t h, float *u, double *sigma,
                    double *mq)
{
  dg_rng r = {dm->seed ^ 0x7379u ^ ((uint64_t)l << 20) ^ ((uint64_t)h << 8)};
  double n2 = 0;
  for (uint32_t d = 0; d < BD_DIM; d++) {
    u[d] = (float)gauss(&r);
    n2 += (double)u[d] * u[d];
  }
  const float *s = dm->scale + ((size_t)l * 2 * BD_HEADS + h) * BD_DIM; /* K's scales */
  double s4 = 0, su = 0;
  for (uint32_t d = 0; d < BD_DIM; d++) {
    u[d] = (float)(u[d] / sqrt(n2));
    s4 += (double)s[d] * s[d] * s[d] * s[d];
    su += (double)u[d] * u[d] * s[d] * s[d];
  }
  *sigma = sqrt(BD_G * s4);
  *mq = 8 * sqrt(BD_G * su);
}

/* The keys of (l, h) for tokens [0, nt) of the K section ks ([token][head][dim] f16) made as
 * syn_keys says, the context's first n being the put: written back into ks (f16) when dev is
 * NULL, else their deviations from the channel biases into dev[t * BD_DIM + d] (f32). */
static void syn_head(const dg_kv_model *dm, const syn_keys *p, uint32_t l, uint32_t h, uint16_t *ks,
                     uint32_t nt, uint32_t n, float *dev)
{
  const float *b = dm->bias + ((size_t)l * 2 * BD_HEADS + h) * BD_DIM;
  const float *s = dm->scale + ((size_t)l * 2 * BD_HEADS + h) * BD_DIM;
  float u[BD_DIM];
  double sigma, mq, zp[BD_DIM], v[BD_DIM], a = sqrt(1 - p->c * p->c);
  syn_dir(dm, l, h, u, &sigma, &mq);
  for (uint32_t t = 0; t < nt; t++) {
    uint16_t *row = ks + ((size_t)t * BD_HEADS + h) * BD_DIM;
    double proj = 0;
    for (uint32_t d = 0; d < BD_DIM; d++) {
      double z = ((double)f16_to_f32(row[d]) - b[d]) / s[d];
      zp[d] = t == 0 || !p->on ? z : p->c * zp[d] + a * z;
      v[d] = s[d] * zp[d];
      proj += v[d] * u[d];
    }
    if (p->on) {
      double boost = t >= n ? 1 : exp(-(double)(n - 1 - t) / (p->tau * n));
      boost *= p->R * sigma / mq;
      for (uint32_t d = 0; d < BD_DIM; d++)
        v[d] += (boost - proj) * u[d];
    }
    for (uint32_t d = 0; d < BD_DIM; d++) {
      if (dev != NULL)
        dev[(size_t)t * BD_DIM + d] = (float)v[d];
      else if (p->on)
        row[d] = dg_f32_to_f16((float)(b[d] + v[d]));
    }
  }
}

#define SYN_HEADS 2  /* KV heads of layer 0 the fit scores */
#define SYN_STEPS 10 /* query steps per evaluation */

/* The selection statistics of the synthetic context: the top 10% of the exact q·k of
 * SYN_HEADS heads over SYN_STEPS AR(1) query steps. ks: layer 0's K section; dev: n * BD_DIM
 * floats; tmp: n floats; sel, prev: n bytes. */
static sel_fig syn_eval(const dg_kv_model *dm, const syn_keys *p, uint16_t *ks, uint32_t nt,
                        uint32_t n, float *dev, float *sc, float *tmp, uint8_t *sel, uint8_t *prev)
{
  sel_stats acc;
  memset(&acc, 0, sizeof acc);
  uint32_t k = n / 10;
  for (uint32_t h = 0; h < SYN_HEADS; h++) {
    syn_head(dm, p, 0, h, ks, n < nt ? n : nt, n, dev);
    float u[BD_DIM];
    double sigma, mq, noise[BD_DIM];
    syn_dir(dm, 0, h, u, &sigma, &mq);
    const float *s = dm->scale + (size_t)h * BD_DIM;
    dg_rng r = {0x51u + h};
    for (uint32_t d = 0; d < BD_DIM; d++)
      noise[d] = gauss(&r) * sqrt((double)BD_G) * s[d];
    for (uint32_t step = 0; step < SYN_STEPS; step++) {
      float Q[BD_DIM];
      for (uint32_t d = 0; d < BD_DIM; d++) {
        if (step > 0)
          noise[d] = p->rho * noise[d] +
                     sqrt(1 - p->rho * p->rho) * gauss(&r) * sqrt((double)BD_G) * s[d];
        Q[d] = (float)(noise[d] + (p->on ? mq * u[d] : 0));
      }
      for (uint32_t t = 0; t < n; t++) {
        const float *x = dev + (size_t)t * BD_DIM;
        float a = 0;
        for (uint32_t d = 0; d < BD_DIM; d++)
          a += Q[d] * x[d];
        sc[t] = a;
      }
      topk_mask(sc, n, k, sel, tmp);
      sel_add(&acc, sel, n, k, step > 0 ? prev : NULL, n);
      memcpy(prev, sel, n);
    }
  }
  return sel_mean(&acc);
}

/* Bisection of *x in [lo, hi] so that the statistic (increasing in *x) meets the target. */
static void syn_fit(const dg_kv_model *dm, syn_keys *p, double *x, double lo, double hi,
                    double target, int which, uint16_t *ks, uint32_t nt, uint32_t n, float *dev,
                    float *sc, float *tmp, uint8_t *sel, uint8_t *prev)
{
  for (int it = 0; it < 8; it++) {
    *x = (lo + hi) / 2;
    sel_fig f = syn_eval(dm, p, ks, nt, n, dev, sc, tmp, sel, prev);
    double v = which == 0 ? f.p_nb : which == 1 ? f.rec5 : which == 2 ? f.pers : f.rec25;
    if (v < target)
      lo = *x;
    else
      hi = *x;
  }
  *x = (lo + hi) / 2;
}

typedef struct bd_run {
  const bench_env *env;
  kvdb *db;
  const kvdb_model *m;
  const uint32_t *tok;
  const kvdb_kv_view *v; /* all generated tokens */
  uint32_t N, K, S, HOT;
  float *q, *qn, *qm, *qe; /* AR part, its scales, constant part (or NULL), their sum */
  size_t nq;
  uint32_t *pos, *prevpos;
  uint16_t *rows;
  double rho;
  dg_rng *r;
  kvdb_key ctx;   /* the context now (appends change its key) */
  uint32_t t_next; /* the next token to append */
  uint64_t full_ns;
  double ctx_bytes;
} bd_run;

typedef struct bd_fig {
  double hit, amp, host_ratio, io_ratio, step_ms, score_b, persist, beta;
  double select_ms, fetch_ms; /* a step's time in kvdb_decode_select (scoring) and in
                                 kvdb_decode_fetch (the rows' reads), means */
  double topk_ret; /* share of the true top k returned (kvdb_decode_stats.top_k_returned) */
} bd_fig;

/* One session: 16 warm-up steps, then S measured; each step selects and fetches every layer
 * (page cache dropped first: timed), then appends the step's token. */
static int bd_variant(bd_run *x, const char *name, uint32_t flags, int32_t host_pm,
                      int32_t fetch_dev, uint32_t cold_pm, bd_fig *f)
{
  FILE *o = x->env->out;
  const uint32_t L = x->m->n_layers, K = x->K, S = x->S;
  kvdb_decode_opts dopt;
  kvdb_decode_opts_init(&dopt);
  dopt.recent_tokens = BD_W;
  dopt.hot_tokens = x->HOT;
  dopt.device = KVDB_SCORE_EMULATED;
  dopt.device_tiers = 1u << KVDB_TIER_SSD;
  dopt.host_share_permille = host_pm;
  dopt.fetch_device = fetch_dev;
  dopt.flags = flags;
  dopt.cold_share_permille = cold_pm;
  kvdb_decode *s;
  if (kvdb_decode_open(x->db, x->m, &x->ctx, 1, &dopt, &s) != KVDB_OK) {
    fprintf(stderr, "decode: session: %s\n", kvdb_errmsg());
    return 1;
  }
  kvdb_decode_stats s0, s1;
  memset(&s0, 0, sizeof s0);
  double step_ns = 0, sel_ns = 0, fet_ns = 0, pers_sum = 0, a = x->rho, b = sqrt(1 - x->rho * x->rho);
  long pers_n = 0;
  kvdb_kv_view rv;
  kvdb_kv_view_packed(&rv, x->rows, x->m, K, KVDB_LAYOUT_LKTHD); /* layer 0's part: one layer */
  uint8_t *mark = malloc((size_t)x->N + 4 * (BD_WARM + S));
  int rc = 1;
  for (uint32_t step = 0; mark != NULL && step < BD_WARM + S; step++) {
    if (step == BD_WARM)
      kvdb_decode_stat(s, &s0);
    for (size_t i = 0; i < x->nq; i++)
      x->q[i] = (float)(a * x->q[i] + b * gauss(x->r) * x->qn[i]);
    for (size_t i = 0; i < x->nq; i++)
      x->qe[i] = x->q[i] + (x->qm != NULL ? x->qm[i] : 0);
    bench_drop_cache(x->env->dir);
    uint64_t ts = bench_now_ns();
    for (uint32_t l = 0; l < L; l++) {
      uint32_t *p = x->pos + (size_t)l * BD_HEADS * K;
      uint64_t t1 = bench_now_ns();
      if (kvdb_decode_select(s, 0, l, x->qe + (size_t)l * BD_HEADS * BD_G * BD_DIM, KVDB_F32,
                             BD_HEADS * BD_G, K, p, NULL) != KVDB_OK) {
        fprintf(stderr, "decode: step %u layer %u: %s\n", step, l, kvdb_errmsg());
        goto out;
      }
      uint64_t t2 = bench_now_ns();
      if (kvdb_decode_fetch(s, 0, l, p, K, &rv) != KVDB_OK) {
        fprintf(stderr, "decode: step %u layer %u: %s\n", step, l, kvdb_errmsg());
        goto out;
      }
      if (step >= BD_WARM) {
        sel_ns += (double)(t2 - t1);
        fet_ns += (double)(bench_now_ns() - t2);
      }
    }
    uint64_t te = bench_now_ns() - ts;
    if (step >= BD_WARM)
      step_ns += (double)te;
    if (step > 0) /* persistence of the selections (as measured on the model) */
      for (size_t c = 0; c < (size_t)L * BD_HEADS; c++) {
        memset(mark, 0, (size_t)x->N + 4 * (BD_WARM + S));
        for (uint32_t i = 0; i < K; i++)
          mark[x->prevpos[c * K + i]] = 1;
        uint32_t kept = 0;
        for (uint32_t i = 0; i < K; i++)
          kept += mark[x->pos[c * K + i]];
        pers_sum += (double)kept / K;
        pers_n++;
      }
    memcpy(x->prevpos, x->pos, (size_t)L * BD_HEADS * K * sizeof *x->pos);
    /* the step's token: its K and V (datagen's next token) appended */
    kvdb_kv_view av = *x->v;
    size_t off = (size_t)x->t_next * BD_HEADS * BD_DIM * 2;
    av.k.base = (uint8_t *)x->v->k.base + off;
    av.v.base = (uint8_t *)x->v->v.base + off;
    if (kvdb_decode_append(s, 0, x->tok + x->t_next, 1, &av) != KVDB_OK) {
      fprintf(stderr, "decode: append: %s\n", kvdb_errmsg());
      goto out;
    }
    x->t_next++;
    fprintf(stderr, "decode: %s: step %u: %.1f ms\n", name, step, te * 1e-6);
  }
  if (mark == NULL)
    goto out;
  if (kvdb_decode_flush(s) != KVDB_OK) {
    fprintf(stderr, "decode: flush: %s\n", kvdb_errmsg());
    goto out;
  }
  kvdb_decode_context(s, 0, &x->ctx, NULL, NULL);
  kvdb_decode_stat(s, &s1);
  double sel = (double)(s1.selected - s0.selected), hot = (double)(s1.hot_hits - s0.hot_hits);
  double ssd = (double)(s1.ssd_bytes - s0.ssd_bytes);
  double cold_b = (double)(s1.cold_row_bytes - s0.cold_row_bytes);
  double host = (double)(s1.host_bytes - s0.host_bytes) / S;
  f->score_b = (double)(s1.score_bytes - s0.score_bytes) / S;
  f->hit = hot / sel;
  f->amp = cold_b > 0 ? ssd / cold_b : NAN;
  f->host_ratio = host / x->ctx_bytes;
  f->step_ms = step_ns / S * 1e-6;
  f->select_ms = sel_ns / S * 1e-6;
  f->fetch_ms = fet_ns / S * 1e-6;
  f->io_ratio = step_ns / S / (double)x->full_ns;
  f->persist = pers_n ? pers_sum / pers_n : NAN;
  f->beta = s1.beta;
  f->topk_ret = s1.top_k > s0.top_k ? (double)(s1.top_k_returned - s0.top_k_returned) /
                                          (double)(s1.top_k - s0.top_k)
                                    : NAN;
  fprintf(o, "decode: [%s]\n", name);
  fprintf(o, "  hot_pool_hit %.3f (%.0f of %.0f rows over %u steps after %u warm-up; DRAM %.0f "
             "MiB)\n", f->hit, hot, sel, S, BD_WARM, s1.hot_pool_bytes / 1048576.0);
  fprintf(o, "  step_read_amplification %.2f (%.2f MiB read for %.2f MiB of cold rows per step; "
             "scoring read %.1f MiB of score copies per step)\n", f->amp, ssd / S / 1048576,
          cold_b / S / 1048576, f->score_b / 1048576);
  fprintf(o, "  host_bytes_ratio %.4f (%.2f MiB to the host per step)\n", f->host_ratio,
          host / 1048576);
  fprintf(o, "  step_io_vs_full %.3f (a step %.1f ms: select %.1f, fetch %.1f); selection "
             "persistence %.3f; beta %.3f\n", f->io_ratio, f->step_ms, f->select_ms, f->fetch_ms,
          f->persist, f->beta);
  fprintf(o, "  top-k returned %.3f (of the true top k's positions, the share in the rows "
             "delivered)\n", f->topk_ret);
  rc = 0;
out:
  free(mark);
  kvdb_decode_close(s);
  return rc;
}

int bench_decode(const bench_env *env, bench_json *j)
{
  const uint32_t L = env->quick ? 2 : 4, N = env->quick ? 4096 : 32768;
  const uint32_t S = env->quick ? 8 : 16, K = N / 10, HOT = N * BD_HOT_PCT / 100;
  const uint32_t NT = N + 4 * (BD_WARM + S); /* the context and four variants' appends */
  FILE *o = env->out;
  model_stats ms;
  measure_model(env, &ms);
  fprintf(o, "decode: query statistics of stories260K: %s rho %.3f\n",
          ms.measured ? "measured" : "default (no model)", ms.rho);
  kvdb_model m = {"bench-decode-llama3-8b", L, BD_HEADS, BD_DIM, KVDB_F16, BD_BT, BD_BITS};
  dg_kv_model dm;
  if (dg_kv_model_init(&dm, L, BD_HEADS, BD_DIM, env->seed) != 0)
    return fprintf(stderr, "decode: out of memory\n"), 1;
  uint32_t *tok = malloc((size_t)NT * sizeof *tok);
  size_t tb = kvdb_model_token_bytes(&m);
  uint16_t *kv = malloc((size_t)NT * tb);
  uint16_t *full = malloc((size_t)N * tb);
  int rc = 1;
  kvdb *db = NULL;
  float *q = NULL, *qn = NULL, *qe = NULL, *qm = NULL;
  uint32_t *pos = NULL, *prevpos = NULL;
  uint16_t *rows = NULL;
  if (tok == NULL || kv == NULL || full == NULL) {
    fprintf(stderr, "decode: out of memory for %u tokens\n", NT);
    goto out;
  }
  dg_tokens(tok, NT, env->seed ^ 0xdec0de, 128256);
  fprintf(stderr, "decode: generating %u tokens of KV (%u layers)\n", NT, L);
  if (dg_kv_fill_f16(&dm, tok, NT, kv) != 0)
    goto out;
  /* the keys: the model's selection statistics reproduced (fitted), or datagen's */
  syn_keys sk = {0, 0, 0, 0.03, ms.rho};
  int model_keys = env->keys == NULL || strcmp(env->keys, "model") == 0;
  sel_fig synf;
  {
    float *dev = malloc((size_t)N * BD_DIM * sizeof *dev), *sc = malloc((size_t)N * sizeof *sc),
          *tmp = malloc((size_t)N * sizeof *tmp);
    uint8_t *sel = malloc(N), *prev = malloc(N);
    if (dev == NULL || sc == NULL || tmp == NULL || sel == NULL || prev == NULL) {
      free(dev), free(sc), free(tmp), free(sel), free(prev);
      fprintf(stderr, "decode: out of memory\n");
      goto out;
    }
    if (model_keys && ms.measured) {
      fprintf(stderr, "decode: fitting the synthetic keys to the model's statistics\n");
      sk.on = 1;
      for (int pass = 0; pass < 2; pass++) {
        syn_fit(&dm, &sk, &sk.R, 0, 16, ms.f.rec5, 1, kv, NT, N, dev, sc, tmp, sel, prev);
        syn_fit(&dm, &sk, &sk.tau, 0.002, 0.5, ms.f.rec25, 3, kv, NT, N, dev, sc, tmp, sel, prev);
        syn_fit(&dm, &sk, &sk.c, 0, 0.995, ms.f.p_nb, 0, kv, NT, N, dev, sc, tmp, sel, prev);
      }
      syn_fit(&dm, &sk, &sk.rho, 0.3, 0.999, ms.f.pers, 2, kv, NT, N, dev, sc, tmp, sel, prev);
    }
    synf = syn_eval(&dm, &sk, kv, NT, N, dev, sc, tmp, sel, prev);
    for (uint32_t l = 0; sk.on && l < L; l++)
      for (uint32_t h = 0; h < BD_HEADS; h++)
        syn_head(&dm, &sk, l, h, kv + (size_t)l * 2 * NT * BD_HEADS * BD_DIM, NT, N, NULL);
    free(dev), free(sc), free(tmp), free(sel), free(prev);
  }
  fprintf(o, "decode: keys '%s'%s: c %.3f, R %.2f, tau %.3f, queries' rho %.3f\n",
          sk.on ? "model" : "independent",
          model_keys && !sk.on ? " (no model to fit: datagen's)" : "", sk.c, sk.R, sk.tau,
          sk.rho);
  fprintf(o, "decode: top-10%% selections      %-10s %-10s\n", "model", "synthetic");
  {
    const char *nm[8] = {"share in the last 1%", "share in the last 5%", "share in the last 25%",
                         "old positions picked", "P(next picked | picked)",
                         "picks per 16-token group", "run length in a group", "persistence"};
    double mv[8] = {ms.f.rec1, ms.f.rec5, ms.f.rec25, ms.f.old_rate, ms.f.p_nb, ms.f.per_group,
                    ms.f.run_len, ms.f.pers};
    double sv[8] = {synf.rec1, synf.rec5, synf.rec25, synf.old_rate, synf.p_nb, synf.per_group,
                    synf.run_len, synf.pers};
    for (int i = 0; i < 8; i++)
      fprintf(o, "  %-28s %-10.3f %-10.3f\n", nm[i], mv[i], sv[i]);
  }
  kvdb_options opt;
  kvdb_options_init(&opt);
  opt.dram_bytes = 0; /* no DRAM tier: what is not in the session's pools comes from the SSD */
  /* a SmartSSD tier configured: the store writes version-1 score copies, the version the
   * near-data device (its emulation here) scores; version 2 would be scored by the host */
  opt.smartssd_bytes = (uint64_t)1 << 40;
  kvdb_status st;
  if ((st = kvdb_open(env->dir, &opt, &db)) != KVDB_OK) {
    fprintf(stderr, "decode: open: %s\n", kvdb_errmsg());
    goto out;
  }
  /* the context: the first N tokens (a view over the NT-token buffer) */
  kvdb_kv_view v;
  kvdb_kv_view_packed(&v, kv, &m, NT, KVDB_LAYOUT_LKTHD);
  kvdb_put_info pi;
  fprintf(stderr, "decode: put of %u tokens\n", N);
  if ((st = kvdb_put(db, &m, tok, N, &v, &pi)) != KVDB_OK) {
    fprintf(stderr, "decode: put: %s\n", kvdb_errmsg());
    goto out;
  }
  /* the baseline: the whole context's K and V read cold */
  kvdb_kv_view fv;
  kvdb_kv_view_packed(&fv, full, &m, N, KVDB_LAYOUT_LKTHD);
  const char *how = bench_drop_cache(env->dir);
  size_t hit = 0;
  uint64_t t0 = bench_now_ns();
  st = kvdb_get(db, &m, tok, N, &fv, &hit);
  uint64_t full_ns = bench_now_ns() - t0;
  if (st != KVDB_OK || hit != N) {
    fprintf(stderr, "decode: get: %s (hit %zu)\n", kvdb_errmsg(), hit);
    goto out;
  }
  double ctx_bytes = (double)N * tb;
  fprintf(o, "decode: %u layers x %u KV heads x %u dims f16, %u tokens (%.0f MiB of K and V); "
             "whole-context get (cold, %s): %.1f ms, %.2f GB/s\n", L, BD_HEADS, BD_DIM, N,
          ctx_bytes / 1048576, how, full_ns * 1e-6, bench_gbps((uint64_t)ctx_bytes, full_ns));
  /* queries: AR(1) per (layer, query head), in the keys' channel scales */
  size_t nq = (size_t)L * BD_HEADS * BD_G * BD_DIM;
  q = malloc(nq * sizeof *q);
  qn = malloc(nq * sizeof *qn);
  qe = malloc(nq * sizeof *qe);
  qm = sk.on ? calloc(nq, sizeof *qm) : NULL;
  pos = malloc((size_t)L * BD_HEADS * K * sizeof *pos);
  prevpos = calloc((size_t)L * BD_HEADS * K, sizeof *prevpos);
  rows = malloc((size_t)K * BD_HEADS * BD_DIM * 2 * 2);
  if (q == NULL || qn == NULL || qe == NULL || (sk.on && qm == NULL) || pos == NULL || prevpos == NULL || rows == NULL)
    goto out;
  dg_rng r = {env->seed ^ 0x5eed};
  for (size_t i = 0; i < nq; i++) {
    size_t l = i / ((size_t)BD_HEADS * BD_G * BD_DIM), h = i / ((size_t)BD_G * BD_DIM) % BD_HEADS,
           d = i % BD_DIM;
    qn[i] = dm.scale[((l * 2 + 0) * BD_HEADS + h) * BD_DIM + d]; /* K's channel scale */
    q[i] = (float)(gauss(&r) * qn[i]);
  }
  for (uint32_t l = 0; sk.on && l < L; l++) /* the constant part along u (syn_keys) */
    for (uint32_t h = 0; h < BD_HEADS; h++) {
      float u[BD_DIM];
      double sigma, mq;
      syn_dir(&dm, l, h, u, &sigma, &mq);
      for (uint32_t g = 0; g < BD_G; g++)
        for (uint32_t d = 0; d < BD_DIM; d++)
          qm[(((size_t)l * BD_HEADS + h) * BD_G + g) * BD_DIM + d] = (float)(mq / BD_G * u[d]);
    }
  bd_run run = {.env = env, .db = db, .m = &m, .tok = tok, .v = &v, .N = N, .K = K, .S = S,
                .HOT = HOT, .q = q, .qn = qn, .nq = nq, .pos = pos, .prevpos = prevpos,
                .rows = rows, .rho = sk.rho, .qm = qm, .qe = qe, .r = &r, .ctx = pi.context, .t_next = N,
                .full_ns = full_ns, .ctx_bytes = ctx_bytes};
  /* the variants, one after the other on the same (growing) context */
  bd_fig tokf, grpf, appf, budf;
  if (bd_variant(&run, "token rows: exact top-k, rows gathered on the device", 0, 0, -1, 0,
                 &tokf) != 0 ||
      bd_variant(&run, "page groups: cold picks as whole 4 KiB groups, read by the host",
                 KVDB_DECODE_PAGE_GROUPS, 0, KVDB_SCORE_CPU, 0, &grpf) != 0 ||
      bd_variant(&run, "page groups with APP's split of the scoring (beta per step)",
                 KVDB_DECODE_PAGE_GROUPS, -1, KVDB_SCORE_CPU, 0, &appf) != 0 ||
      bd_variant(&run, "page groups with a cold budget of 20% (the rest from DRAM past the top k)",
                 KVDB_DECODE_PAGE_GROUPS, 0, KVDB_SCORE_CPU, BD_COLD_PM, &budf) != 0)
    goto out;
  fprintf(o, "decode: top-10%% persistence: model %.3f, synthetic (exact q·k) %.3f, the store's "
             "selections (token rows) %.3f\n", ms.f.pers, synf.pers, tokf.persist);
  double agree = NAN;
  if (bench_decode_agreement != NULL && bench_decode_agreement(env, j, &agree) != 0)
    agree = NAN;
  bench_json_num(j, "agreement_20pct", agree);
  bench_json_num(j, "hot_pool_hit", grpf.hit);
  bench_json_num(j, "step_read_amplification", grpf.amp);
  bench_json_num(j, "host_bytes_ratio", grpf.host_ratio);
  bench_json_num(j, "step_io_vs_full", grpf.io_ratio);
  bench_json_num(j, "token_hot_pool_hit", tokf.hit);
  bench_json_num(j, "token_step_read_amplification", tokf.amp);
  bench_json_num(j, "token_host_bytes_ratio", tokf.host_ratio);
  bench_json_num(j, "token_step_io_vs_full", tokf.io_ratio);
  bench_json_num(j, "app_hot_pool_hit", appf.hit);
  bench_json_num(j, "app_host_bytes_ratio", appf.host_ratio);
  bench_json_num(j, "app_step_io_vs_full", appf.io_ratio);
  bench_json_num(j, "app_beta", appf.beta);
  bench_json_num(j, "budget_hot_pool_hit", budf.hit);
  bench_json_num(j, "budget_step_read_amplification", budf.amp);
  bench_json_num(j, "budget_host_bytes_ratio", budf.host_ratio);
  bench_json_num(j, "budget_step_io_vs_full", budf.io_ratio);
  bench_json_num(j, "budget_topk_returned", budf.topk_ret);
  bench_json_num(j, "topk_returned", grpf.topk_ret);
  bench_json_num(j, "token_topk_returned", tokf.topk_ret);
  bench_json_int(j, "layers_run", L);
  bench_json_int(j, "context_tokens", N);
  bench_json_int(j, "budget_tokens", K);
  bench_json_int(j, "hot_tokens", HOT);
  bench_json_int(j, "recent_tokens", BD_W);
  bench_json_num(j, "full_get_ms", full_ns * 1e-6);
  bench_json_num(j, "step_ms", grpf.step_ms);
  bench_json_num(j, "token_step_ms", tokf.step_ms);
  bench_json_num(j, "score_bytes_per_step", grpf.score_b);
  bench_json_num(j, "model_rho", ms.rho);
  bench_json_num(j, "model_persistence", ms.f.pers);
  bench_json_str(j, "keys", sk.on ? "model" : "independent");
  bench_json_num(j, "keys_c", sk.c);
  bench_json_num(j, "keys_R", sk.R);
  bench_json_num(j, "keys_tau", sk.tau);
  bench_json_num(j, "keys_rho", sk.rho);
  {
    const char *nm[8] = {"recent1", "recent5", "recent25", "old_rate", "p_next", "per_group16",
                         "run_len16", "persistence_exact"}; /* (model_persistence and
                         synthetic_persistence: the fields of before, kept) */
    double mv[8] = {ms.f.rec1, ms.f.rec5, ms.f.rec25, ms.f.old_rate, ms.f.p_nb, ms.f.per_group,
                    ms.f.run_len, ms.f.pers};
    double sv[8] = {synf.rec1, synf.rec5, synf.rec25, synf.old_rate, synf.p_nb, synf.per_group,
                    synf.run_len, synf.pers};
    char key[64];
    for (int i = 0; i < 8; i++) {
      snprintf(key, sizeof key, "model_%s", nm[i]);
      bench_json_num(j, key, mv[i]);
      snprintf(key, sizeof key, "synthetic_%s", nm[i]);
      bench_json_num(j, key, sv[i]);
    }
  }
  bench_json_num(j, "synthetic_persistence", tokf.persist);
  bench_json_bool(j, "model_stats_measured", ms.measured);
  rc = 0;
out:
  kvdb_close(db);
  dg_kv_model_free(&dm);
  free(tok);
  free(kv);
  free(full);
  free(q);
  free(qn);
  free(qe);
  free(qm);
  free(pos);
  free(prevpos);
  free(rows);
  return rc;
}
