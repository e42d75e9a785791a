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
 * prefix-dependent value per token). Queries: per (layer, query head) an AR(1) process in the
 * keys' channel space, q_t = rho q_{t-1} + sqrt(1 - rho^2) e_t, e_t normal with the K channel's
 * scale per dimension (outlier channels weigh as in a real model's q·k). rho is MEASURED on the
 * real model: stories260K (tools/refmodel) decodes greedily from BOS; at each of its steps
 * past 3/5 of its 320 positions the group-summed query of every (layer, KV head) is compared
 * with the previous step's (cosine), and the top-10% of its q·K over the prefix with the
 * previous step's top-10% (persistence: the share still selected). rho = the mean cosine. The
 * model's persistence and the synthetic run's own are both reported, so the match can be
 * judged. What the synthetic data lacks: the model's recency (a share of its top 10% lies in
 * the last 16 of 320 positions, reported) and any clustering of selected tokens in positions
 * (datagen's keys are independent per token): both would raise the hits and lower the
 * amplification measured here. Without the model files rho = 0.9 ("default").
 *
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

typedef struct model_stats {
  int measured;
  double rho, persist, recent;
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

static int cmp_desc(const void *a, const void *b)
{
  float x = *(const float *)a, y = *(const float *)b;
  return x < y ? 1 : x > y ? -1 : 0;
}

/* The query statistics of stories260K's greedy decode (see DATA). */
static void measure_model(const bench_env *env, model_stats *ms)
{
  ms->measured = 0;
  ms->rho = 0.9;
  ms->persist = ms->recent = NAN;
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
  float *prevthr = calloc(nh, sizeof(float));
  uint8_t *prevsel = calloc(nh * (size_t)P, 1);
  double cos_sum = 0, pers_sum = 0, rec_sum = 0;
  long n_cos = 0, n_pers = 0;
  int token = 1;
  for (int p = 0; p < P && prevq && sc && prevthr && prevsel; p++) {
    const float *logits;
    if (refmodel_forward(st, token, p, &logits) != REFMODEL_OK)
      break;
    token = refmodel_argmax(logits, c->vocab_size);
    if (p < from)
      continue;
    int n = p + 1, k = n / 10 > 0 ? n / 10 : 1;
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
        for (int t = 0; t < n; t++) {
          double s = 0;
          for (int d = 0; d < hs; d++)
            s += (double)qs[d] * K[(size_t)t * c->kv_dim + h * hs + d];
          sc[t] = (float)s;
        }
        float *sorted = malloc((size_t)n * sizeof(float));
        if (sorted == NULL)
          continue;
        memcpy(sorted, sc, (size_t)n * sizeof(float));
        qsort(sorted, (size_t)n, sizeof(float), cmp_desc);
        float thr = sorted[k - 1];
        free(sorted);
        uint8_t *sel = prevsel + ((size_t)l * nkv + h) * P;
        int kept = 0, prevk = 0, recent = 0;
        for (int t = 0; t < n; t++) {
          int now = sc[t] >= thr;
          if (t < n - 1 && sel[t]) {
            prevk++;
            kept += now;
          }
          recent += now && t >= n - BD_W / 4; /* the model's window, scaled to its 320 tokens */
          sel[t] = (uint8_t)now;
        }
        if (p > from && prevk > 0) {
          pers_sum += (double)kept / prevk;
          rec_sum += (double)recent / k;
          n_pers++;
        }
      }
    }
  }
  if (n_cos > 0 && n_pers > 0) {
    ms->measured = 1;
    ms->rho = cos_sum / n_cos;
    ms->persist = pers_sum / n_pers;
    ms->recent = rec_sum / n_pers;
  }
  free(prevq);
  free(sc);
  free(prevthr);
  free(prevsel);
  refmodel_state_free(st);
  refmodel_model_free(rm);
}

static double gauss(dg_rng *r)
{
  double u = ((double)(dg_next(r) >> 11) + 0.5) / 9007199254740992.0;
  double v = ((double)(dg_next(r) >> 11) + 0.5) / 9007199254740992.0;
  return sqrt(-2 * log(u)) * cos(2 * M_PI * v);
}

typedef struct bd_run {
  const bench_env *env;
  kvdb *db;
  const kvdb_model *m;
  const uint32_t *tok;
  const kvdb_kv_view *v; /* all generated tokens */
  uint32_t N, K, S, HOT;
  float *q, *qn;
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
  double step_ns = 0, pers_sum = 0, a = x->rho, b = sqrt(1 - x->rho * x->rho);
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
    bench_drop_cache(x->env->dir);
    uint64_t ts = bench_now_ns();
    for (uint32_t l = 0; l < L; l++) {
      uint32_t *p = x->pos + (size_t)l * BD_HEADS * K;
      if (kvdb_decode_select(s, 0, l, x->q + (size_t)l * BD_HEADS * BD_G * BD_DIM, KVDB_F32,
                             BD_HEADS * BD_G, K, p, NULL) != KVDB_OK ||
          kvdb_decode_fetch(s, 0, l, p, K, &rv) != KVDB_OK) {
        fprintf(stderr, "decode: step %u layer %u: %s\n", step, l, kvdb_errmsg());
        goto out;
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
  fprintf(o, "  step_io_vs_full %.3f (a step %.1f ms); selection persistence %.3f; beta %.3f\n",
          f->io_ratio, f->step_ms, f->persist, f->beta);
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
  fprintf(o, "decode: query statistics of stories260K: %s rho %.3f, top-10%% persistence %.3f, "
             "recent-window share %.3f\n", ms.measured ? "measured" : "default (no model)",
          ms.rho, ms.persist, ms.recent);
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
  float *q = NULL, *qn = NULL;
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
  pos = malloc((size_t)L * BD_HEADS * K * sizeof *pos);
  prevpos = calloc((size_t)L * BD_HEADS * K, sizeof *prevpos);
  rows = malloc((size_t)K * BD_HEADS * BD_DIM * 2 * 2);
  if (q == NULL || qn == NULL || pos == NULL || prevpos == NULL || rows == NULL)
    goto out;
  dg_rng r = {env->seed ^ 0x5eed};
  for (size_t i = 0; i < nq; i++) {
    size_t l = i / ((size_t)BD_HEADS * BD_G * BD_DIM), h = i / ((size_t)BD_G * BD_DIM) % BD_HEADS,
           d = i % BD_DIM;
    qn[i] = dm.scale[((l * 2 + 0) * BD_HEADS + h) * BD_DIM + d]; /* K's channel scale */
    q[i] = (float)(gauss(&r) * qn[i]);
  }
  bd_run run = {.env = env, .db = db, .m = &m, .tok = tok, .v = &v, .N = N, .K = K, .S = S,
                .HOT = HOT, .q = q, .qn = qn, .nq = nq, .pos = pos, .prevpos = prevpos,
                .rows = rows, .rho = ms.rho, .r = &r, .ctx = pi.context, .t_next = N,
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
  fprintf(o, "decode: model top-10%% persistence %.3f; the synthetic queries' %.3f\n", ms.persist,
          tokf.persist);
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
  bench_json_num(j, "model_persistence", ms.persist);
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
  free(pos);
  free(prevpos);
  free(rows);
  return rc;
}
