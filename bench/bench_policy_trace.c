/* SPDX-License-Identifier: MIT */
/*
 * bench/bench_policy_trace.c — `kvdb-bench policy` part 3: the trace: contexts drawn from the
 * datasets of EvicPress §3.1 on the measured profiles, and Zipf requests over them: stationary,
 * drifting (every 1/PB_DRIFT_PHASES of the trace, PB_DRIFT_SWAP x contexts random pairs of
 * popularity ranks swap), or with one-shot contexts mixed in (a quarter of the contexts,
 * requested once each).
 */
#define _GNU_SOURCE
#include "bench_policy.h"

void pb_trace_free(trace *t)
{
  free(t->c);
  free(t->req);
  free(t->f_end);
  memset(t, 0, sizeof *t);
}

int pb_build_trace(const bench_env *env, const cfgm *cm, const double *q_real,
                   const double *q_score, uint32_t n_real, trace *tr)
{
  return pb_build_trace_mode(env, cm, q_real, q_score, n_real, PB_TRACE_STATIONARY, tr);
}

/* Swap random pairs of popularity ranks: `pairs` swaps. */
static void shuffle_some(uint32_t *perm, uint32_t n, uint32_t pairs, uint64_t *s)
{
  for (uint32_t k = 0; k < pairs; k++) {
    uint32_t a = (uint32_t)(rng_next(s) % n), b = (uint32_t)(rng_next(s) % n), x = perm[a];
    perm[a] = perm[b];
    perm[b] = x;
  }
}

int pb_build_trace_mode(const bench_env *env, const cfgm *cm, const double *q_real,
                        const double *q_score, uint32_t n_real, int mode, trace *tr)
{
  if (q_score == NULL)
    q_score = q_real;
  uint32_t n = env->quick ? PB_N_CTX_QUICK : PB_N_CTX_FULL;
  memset(tr, 0, sizeof *tr);
  tr->n = n;
  tr->n_req = (size_t)n * PB_REQ_PER_CTX;
  tr->n_warm = (size_t)n * PB_WARM_PER_CTX;
  tr->c = calloc(n, sizeof *tr->c);
  tr->req = malloc(tr->n_req * sizeof *tr->req);
  tr->f_end = calloc(n, sizeof *tr->f_end);
  double *cdf = malloc(n * sizeof *cdf), *ft = calloc(n, sizeof *ft);
  uint32_t *perm = malloc(n * sizeof *perm);
  if (!tr->c || !tr->req || !tr->f_end || !cdf || !ft || !perm) {
    free(cdf);
    free(ft);
    free(perm);
    bench_log("out of memory (trace)");
    return -1;
  }
  uint64_t s = env->seed * 0x9e3779b97f4a7c15ull + 17;
  for (uint32_t i = 0; i < n; i++) {
    tctx *c = &tr->c[i];
    c->dataset = (uint32_t)(rng_next(&s) % N_DATASETS);
    const dataset *ds = &PB_DATASETS[c->dataset];
    /* length: log-normal with the dataset's mean and a coefficient of variation of 0.5 */
    double sig = sqrt(log(1 + 0.25)), med = ds->mean_tokens / sqrt(1.25);
    double tok = med * exp(sig * rng_normal(&s));
    c->tokens = (uint64_t)(tok < 256 ? 256 : tok > 131072 ? 131072 : tok);
    c->raw = c->tokens * PB_TOKEN_BYTES;
    c->ptok = pb_prefill_tokens(c->tokens);
    /* sensitivity: log-normal with the dataset's median and coefficient of variation */
    double ss = sqrt(log(1 + ds->cv_sens * ds->cv_sens));
    double sens = ds->median_sens * exp(ss * rng_normal(&s));
    c->sens = sens < 0.01 ? 0.01 : sens > 0.99 ? 0.99 : sens;
    c->base = (uint32_t)(rng_next(&s) % n_real);
    const double *qb = q_real + (size_t)c->base; /* q_real[cfg * n_real + ctx]; row NCFG:
                                                    PB_SENS_CFG */
    double qs = qb[(size_t)NCFG * n_real];
    double dref = 1 - (qs < 0 ? 0 : qs > 1 ? 1 : qs);
    if (dref < 1e-6)
      dref = 1e-6;
    double k = -log(1 - c->sens) / dref;
    for (uint32_t j = 0; j < NCFG; j++) {
      kv_policy_option *o = &c->opt[j];
      memset(o, 0, sizeof *o);
      o->config = cm[j].cfg;
      o->bytes = j == CFG_RAW ? c->raw : (uint64_t)((double)c->raw / cm[j].ratio);
      if (o->bytes == 0)
        o->bytes = 1;
      double qj = qb[(size_t)j * n_real];
      double d = 1 - (qj < 0 ? 0 : qj > 1 ? 1 : qj);
      int exact = cm[j].cfg.method == KVDB_METHOD_RAW || cm[j].cfg.method == KVDB_METHOD_LOSSLESS;
      o->quality = exact ? 1.0 : exp(-k * d);
      /* as scored: the same sensitivity on the held-out probes' loss */
      double qj_s = q_score[(size_t)j * n_real + c->base];
      double d_s = 1 - (qj_s < 0 ? 0 : qj_s > 1 ? 1 : qj_s);
      c->qs[j] = exact ? 1.0 : exp(-k * d_s);
      o->decode_bps = cm[j].decode_bps;
      /* decoded: a dropping config keeps its kept rows, the others the whole context */
      if (cm[j].cfg.method == KVDB_METHOD_DROP)
        o->decoded_bytes = c->raw / 1000 * cm[j].cfg.keep_permille;
    }
    tr->raw_total += c->raw;
  }
  /* popularity: Zipf over a random order of the contexts (PB_TRACE_ONESHOT: over the first
   * three quarters; each of the others is requested once, at a random request) */
  uint32_t nz = mode == PB_TRACE_ONESHOT ? n - n / 4 : n;
  for (uint32_t i = 0; i < n; i++)
    perm[i] = i;
  for (uint32_t i = nz; i > 1; i--) {
    uint32_t k = (uint32_t)(rng_next(&s) % i);
    uint32_t x = perm[i - 1];
    perm[i - 1] = perm[k];
    perm[k] = x;
  }
  double z = 0;
  for (uint32_t r = 0; r < nz; r++) {
    z += pow((double)(r + 1), -PB_ZIPF);
    cdf[r] = z;
  }
  size_t phase = tr->n_req / PB_DRIFT_PHASES;
  for (size_t q = 0; q < tr->n_req; q++) {
    if (mode == PB_TRACE_DRIFT && q > 0 && q % phase == 0) /* popularity drifts */
      shuffle_some(perm, nz, (uint32_t)(nz * PB_DRIFT_SWAP), &s);
    double u = rng_u01(&s) * z;
    uint32_t lo = 0, hi = nz - 1;
    while (lo < hi) {
      uint32_t mid = (lo + hi) / 2;
      if (cdf[mid] < u)
        lo = mid + 1;
      else
        hi = mid;
    }
    tr->req[q] = perm[lo];
  }
  for (uint32_t i = nz; i < n; i++) /* the one-shot contexts */
    tr->req[rng_next(&s) % tr->n_req] = i;
  for (size_t q = 0; q < tr->n_req; q++) {
    uint32_t i = tr->req[q];
    tr->f_end[i] = kv_policy_decay(tr->f_end[i], (double)q - ft[i], PB_HALF_LIFE_PER_CTX * n, 1);
    ft[i] = (double)q;
  }
  for (uint32_t i = 0; i < n; i++)
    tr->f_end[i] =
        kv_policy_decay(tr->f_end[i], (double)tr->n_req - ft[i], PB_HALF_LIFE_PER_CTX * n, 0);
  free(cdf);
  free(ft);
  free(perm);
  return 0;
}
