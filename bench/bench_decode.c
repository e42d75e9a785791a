/* SPDX-License-Identifier: MIT */
/*
 * bench/bench_decode.c — `kvdb-bench decode` (issue 18): decode steps from the store through a
 * decode session (kvdb.h "Decoding from the store"), the I/O figures of a step against reading
 * the whole context, measured in the same run.
 *
 * SHAPE. Llama-3-8B's KV (8 KV heads, head_dim 128, 32 query heads: G = 4; f16), a context of
 * 32768 tokens (4096 with --quick), block_tokens 256, int8 score copies. Of the model's 32
 * layers, 4 are stored and decoded (2 with --quick): every figure is per layer (the same shape
 * for each of the 32), and 32 layers of 32k tokens are 4 GiB of K and V, past what this
 * machine's time budget reads per run. Stated in the report and the JSON (layers_run).
 *
 * DATA. Keys and values: bench/datagen.c (per-channel log-normal scales, outlier K channels, a
 * prefix-dependent value per token). Queries: per (layer, query head) an AR(1) process in the
 * keys' channel space, q_t = rho q_{t-1} + sqrt(1 - rho^2) e_t, e_t normal with the K channel's
 * scale per dimension (outlier channels weigh as in a real model's q·k). rho is MEASURED on the
 * real model: stories260K (tools/refmodel) decodes greedily from BOS; at each of its steps
 * past position 192 the group-summed query of every (layer, KV head) is compared with the
 * previous step's (cosine), and the top-10% of its q·K over the prefix with the previous
 * step's top-10% (persistence: the share still selected). rho = the mean cosine. The model's
 * persistence and the synthetic run's own are both reported, so the match can be judged.
 * Without the model files rho = 0.9 (said so: model_stats "default").
 *
 * STEPS. A session over the stored context with the emulated near-data device for the SSD
 * tier (scoring and row gathering on the "device"; only <pos, score> pairs and the chosen rows
 * cross to the host), recent window W = 64, hot pool 15% of the context per layer and head,
 * budget k = 10% of the context per KV head. Each step: page cache dropped (fadvise on the
 * segment files), then for every layer select + fetch (timed: the step's I/O and scoring),
 * then the step's new token appended (its K and V: datagen's next token). 16 warm-up steps,
 * then 32 measured (8 with --quick).
 *   hot_pool_hit            selected rows served from DRAM / rows selected (measured steps)
 *   step_read_amplification bytes fetches read from segment files / bytes of the cold rows' K
 *                           and V (the page groups around each cold row come with it)
 *   host_bytes_ratio        bytes crossing to the host per step (score pairs + rows the host
 *                           read or the device sent) / the context's K and V (the layers run)
 *   step_io_vs_full         mean step time / time of kvdb_get of the whole context, cold
 *                           (the baseline, same run, same layers)
 *   agreement_20pct         from the model side (bench/bench_decode_model.c,
 *                           bench_decode_agreement), null when that part is not linked
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

int bench_decode(const bench_env *env, bench_json *j)
{
  const uint32_t L = env->quick ? 2 : 4, N = env->quick ? 4096 : 32768;
  const uint32_t S = env->quick ? 8 : 32, K = N / 10, HOT = N * 15 / 100;
  const uint32_t NT = N + BD_WARM + S; /* tokens generated: the context and the appends */
  FILE *o = env->out;
  model_stats ms;
  measure_model(env, &ms);
  fprintf(o, "decode: query statistics of stories260K: %s rho %.3f, top-10%% persistence %.3f, "
             "recent-window share %.3f\n", ms.measured ? "measured" : "default (no model)",
          ms.rho, ms.persist, ms.recent);
  kvdb_model m = {"bench-decode-llama3-8b", L, BD_HEADS, BD_DIM, KVDB_F16, 256, 8};
  dg_kv_model dm;
  if (dg_kv_model_init(&dm, L, BD_HEADS, BD_DIM, env->seed) != 0)
    return fprintf(stderr, "decode: out of memory\n"), 1;
  uint32_t *tok = malloc((size_t)NT * sizeof *tok);
  size_t tb = kvdb_model_token_bytes(&m);
  uint16_t *kv = malloc((size_t)NT * tb);
  uint16_t *full = malloc((size_t)N * tb);
  int rc = 1;
  kvdb *db = NULL;
  kvdb_decode *s = NULL;
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
  kvdb_decode_opts dopt;
  kvdb_decode_opts_init(&dopt);
  dopt.recent_tokens = BD_W;
  dopt.hot_tokens = HOT;
  dopt.device = KVDB_SCORE_EMULATED;
  dopt.device_tiers = 1u << KVDB_TIER_SSD;
  if ((st = kvdb_decode_open(db, &m, &pi.context, 1, &dopt, &s)) != KVDB_OK) {
    fprintf(stderr, "decode: session: %s\n", kvdb_errmsg());
    goto out;
  }
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
  double a = ms.rho, b = sqrt(1 - ms.rho * ms.rho);
  for (size_t i = 0; i < nq; i++) {
    size_t l = i / ((size_t)BD_HEADS * BD_G * BD_DIM), h = i / ((size_t)BD_G * BD_DIM) % BD_HEADS,
           d = i % BD_DIM;
    qn[i] = dm.scale[((l * 2 + 0) * BD_HEADS + h) * BD_DIM + d]; /* K's channel scale */
    q[i] = (float)(gauss(&r) * qn[i]);
  }
  kvdb_decode_stats s0, s1;
  memset(&s0, 0, sizeof s0);
  double step_ns = 0, pers_sum = 0;
  long pers_n = 0;
  kvdb_kv_view rv;
  kvdb_kv_view_packed(&rv, rows, &m, K, KVDB_LAYOUT_LKTHD); /* layer 0's part: one layer */
  for (uint32_t step = 0; step < BD_WARM + S; step++) {
    if (step == BD_WARM)
      kvdb_decode_stat(s, &s0);
    for (size_t i = 0; i < nq; i++)
      q[i] = (float)(a * q[i] + b * gauss(&r) * qn[i]);
    bench_drop_cache(env->dir);
    uint64_t ts = bench_now_ns();
    for (uint32_t l = 0; l < L; l++) {
      uint32_t *p = pos + (size_t)l * BD_HEADS * K;
      if (kvdb_decode_select(s, 0, l, q + (size_t)l * BD_HEADS * BD_G * BD_DIM, KVDB_F32,
                             BD_HEADS * BD_G, K, p, NULL) != KVDB_OK ||
          kvdb_decode_fetch(s, 0, l, p, K, &rv) != KVDB_OK) {
        fprintf(stderr, "decode: step %u layer %u: %s\n", step, l, kvdb_errmsg());
        goto out;
      }
    }
    uint64_t te = bench_now_ns() - ts;
    if (step >= BD_WARM)
      step_ns += (double)te;
    /* persistence of the synthetic selections (as measured on the model) */
    if (step > 0) {
      for (size_t c = 0; c < (size_t)L * BD_HEADS; c++) {
        uint8_t *mark = calloc(N + BD_WARM + S, 1);
        if (mark == NULL)
          continue;
        for (uint32_t i = 0; i < K; i++)
          mark[prevpos[c * K + i]] = 1;
        uint32_t kept = 0;
        for (uint32_t i = 0; i < K; i++)
          kept += mark[pos[c * K + i]];
        free(mark);
        pers_sum += (double)kept / K;
        pers_n++;
      }
    }
    memcpy(prevpos, pos, (size_t)L * BD_HEADS * K * sizeof *pos);
    /* the step's token: its K and V (datagen's next token) appended */
    kvdb_kv_view av = v;
    size_t off = (size_t)(N + step) * BD_HEADS * BD_DIM * 2;
    av.k.base = (uint8_t *)v.k.base + off;
    av.v.base = (uint8_t *)v.v.base + off;
    if (kvdb_decode_append(s, 0, tok + N + step, 1, &av) != KVDB_OK) {
      fprintf(stderr, "decode: append: %s\n", kvdb_errmsg());
      goto out;
    }
    fprintf(stderr, "decode: step %u: %.1f ms\n", step, te * 1e-6);
  }
  kvdb_decode_stat(s, &s1);
  double sel = (double)(s1.selected - s0.selected);
  double hot = (double)(s1.hot_hits - s0.hot_hits);
  double ssd = (double)(s1.ssd_bytes - s0.ssd_bytes);
  double cold_b = (double)(s1.cold_row_bytes - s0.cold_row_bytes);
  double host = (double)(s1.host_bytes - s0.host_bytes) / S;
  double score_b = (double)(s1.score_bytes - s0.score_bytes) / S;
  double hit_rate = hot / sel, amp = cold_b > 0 ? ssd / cold_b : NAN;
  double host_ratio = host / ctx_bytes, io_ratio = step_ns / S / (double)full_ns;
  double synth_pers = pers_n ? pers_sum / pers_n : NAN;
  fprintf(o, "decode: budget k = %u (10%%) per KV head, recent W = %u, hot pool %u tokens (15%%) "
             "per layer and head (%.0f MiB of DRAM)\n", K, BD_W, HOT,
          s1.hot_pool_bytes / 1048576.0);
  fprintf(o, "decode: synthetic top-10%% persistence %.3f (the model's %.3f)\n", synth_pers,
          ms.persist);
  fprintf(o, "decode: %u measured steps after %u warm-up: hot_pool_hit %.3f (%.0f of %.0f rows)\n",
          S, BD_WARM, hit_rate, hot, sel);
  fprintf(o, "decode: step_read_amplification %.2f (%.1f MiB read for %.1f MiB of cold rows per "
             "step; scoring read %.1f MiB of score copies per step on the device)\n", amp,
          ssd / S / 1048576, cold_b / S / 1048576, score_b / 1048576);
  fprintf(o, "decode: host_bytes_ratio %.4f (%.2f MiB to the host per step of %.0f MiB)\n",
          host_ratio, host / 1048576, ctx_bytes / 1048576);
  fprintf(o, "decode: step_io_vs_full %.3f (a step %.1f ms, the whole context %.1f ms); APP "
             "beta %.3f\n", io_ratio, step_ns / S * 1e-6, full_ns * 1e-6, s1.beta);
  double agree = NAN;
  if (bench_decode_agreement != NULL && bench_decode_agreement(env, j, &agree) != 0)
    agree = NAN;
  bench_json_num(j, "agreement_20pct", agree);
  bench_json_num(j, "hot_pool_hit", hit_rate);
  bench_json_num(j, "step_read_amplification", amp);
  bench_json_num(j, "host_bytes_ratio", host_ratio);
  bench_json_num(j, "step_io_vs_full", io_ratio);
  bench_json_int(j, "layers_run", L);
  bench_json_int(j, "context_tokens", N);
  bench_json_int(j, "budget_tokens", K);
  bench_json_int(j, "hot_tokens", HOT);
  bench_json_int(j, "recent_tokens", BD_W);
  bench_json_num(j, "full_get_ms", full_ns * 1e-6);
  bench_json_num(j, "step_ms", step_ns / S * 1e-6);
  bench_json_num(j, "score_bytes_per_step", score_b);
  bench_json_num(j, "app_beta", s1.beta);
  bench_json_num(j, "model_rho", ms.rho);
  bench_json_num(j, "model_persistence", ms.persist);
  bench_json_num(j, "synthetic_persistence", synth_pers);
  bench_json_bool(j, "model_stats_measured", ms.measured);
  rc = 0;
out:
  kvdb_decode_close(s);
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
