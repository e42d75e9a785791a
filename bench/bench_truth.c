/* SPDX-License-Identifier: MIT */
/*
 * bench/bench_truth.c — part of `kvdb-bench compress` (issue 16): the int4 targets on the
 * redesigned quantizer, and the quality proxy checked against the model itself.
 *
 * Data: stories260K (tools/refmodel, float32 forward pass) over TinyStories, contexts of 512
 * tokens (BOS + a text window, positions 0..511, the model's seq_len), every token fed one by
 * one so the queries of every position are captured (all layers, all query heads, after RoPE);
 * K (after RoPE) and V rounded to f16, as kvdb stores them.
 *
 * int4 targets (one JSON field each): kvquant (codec 5) with per-channel widths (flags bit 3,
 * params.alloc), K quantized before RoPE (the model's RoPE: llama2.c's adjacent pairs, base
 * 10000), K and V per channel in groups of 256 tokens (K 128 on the heads whose plan says so), V
 * clipped, no residual rows; K's widths weighted by the queries' sensitivity (sens_weights) and
 * each head's K and V mean widths chosen from calibration contexts (head_plan) under 4.5 bits
 * per element in all; on each (layer, KV head) section of a whole 512-token context (the unit
 * `compress` measures: a context of one block). bench/RESULTS.md, issue 16, has the designs
 * measured on the way (the first int4: uniform 4 bits, group 128, last 8 rows in 8 bit).
 *   int4_bits_per_element    encoded bytes x 8 / elements, headers, scales, zeros and residual
 *                            rows included
 *   int4_quality             the causal metric (codec.h THE CAUSAL METRIC): the model's real
 *                            queries at 64 positions spread over the context (every query head
 *                            of the KV head's group), causal attention over all the decoded keys,
 *                            mean cosine of the outputs against the original KV's; mean over
 *                            (context, layer, KV head)
 *   int4_quality_worst_head  the (layer, KV head) with the lowest quality, averaged over contexts
 *   int4_decode_gbps         kv_section_decode_dctx of every int4 section, one core, median pass,
 *                            GB/s of decoded f16
 * The weights and the plan are compress/calib.c's (the engine's kvdb_model_calibrate runs the
 * same code). Beside them, what the engine writes: engine_int4_* / engine_int2_* (no
 * calibration), engine_int4_calibrated_* / engine_int2_calibrated_* (a calibrated model: the
 * calibration kv_calib_run computes on TR_CAL_* contexts that follow the measured ones in the
 * corpus, never a measured one; each section's parameters from kv_calib_section_params, as a
 * put derives them).
 *
 * Truth: every context stores its first P = 448 tokens in each config of the list below
 * (each head's K and V sections encoded and decoded; dropped rows marked absent in the model,
 * refmodel_state_set_absent); the model then reuses a prefix of that stored context — its
 * first c tokens, c = 112, 224, 336 and 448 (the whole) — and continues over the text's next
 * T = 64 tokens (teacher forcing: the true token is fed at each step, so one early difference
 * does not decide every later step). Against the same runs on the raw (f16) KV: next-token
 * agreement (argmax equal) and mean KL(raw || config) of the next-token distributions,
 * averaged over the four prefix lengths (a stored context serves prefix hits of any length:
 * issue 16 item 4), and at c = 448 alone ("end"). The profiled quality of each (context,
 * config) is the causal metric with the model's queries at 64 positions spread over the P
 * stored tokens — never the last 16, which SnapKV uses as its observation window to choose
 * what to keep — weighed as the engine's profile weighs a model with output gains
 * (kvdb_model_set_output_gains; compress/ codec.h THE OUTPUT-WEIGHTED QUALITY), with
 * stories260K's gains read from the checkpoint's W_o (load_gains); the per-head cosine mean is
 * reported beside it (`_cosine`). Then
 *   quality_spearman_vs_model     Spearman rank correlation, across configs, of the mean
 *                                 profiled quality and the mean agreement (over prefix lengths)
 *   quality_spearman_per_context  per context, across configs, Spearman of the profiled quality
 *                                 and the agreement (ties in agreement, which counts 64 steps
 *                                 per prefix length, broken by the lower KL), averaged over
 *                                 contexts
 * Beside them (*_end: the continuation after the whole stored context only, as issue 16's own
 * measurement did; *_old_metric: issue 3's probes, the queries of the last 16 positions,
 * non-causal over the block) the same correlations, and six variants of the causal metric
 * tried against both truths (KVDB_TRUTH_METRIC=nac or sq makes variant 4 or 5 the profiled
 * quality of the whole run, the int4's included).
 */
#define _GNU_SOURCE
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "codec.h"
#include "kvset.h"
#include "refmodel.h"

/*
 * TR_CTX_*   : contexts (full, --quick).
 * TR_TOKENS  : tokens per context (stories260K's seq_len).
 * TR_STORED  : the stored prefix of the truth runs; TR_TOKENS - TR_STORED continuation steps.
 * TR_WIN     : SnapKV's observation window (the last stored positions' queries).
 * TR_PROBES  : probe positions of the causal metric.
 */
#define TR_CTX_FULL 24u
#define TR_CTX_QUICK 6u
#define TR_TOKENS 512u
#define TR_STORED 448u
#define TR_STEPS (TR_TOKENS - TR_STORED)
#define TR_WIN 16u
#define TR_PROBES KV_QUALITY_SPREAD_PROBES
#define TR_NVAR 12u /* metric variants tried beside the causal metric (head_quality); 8-11:
                            the output-weighted quality (codec.h THE OUTPUT-WEIGHTED QUALITY)
                            with W_o's gains per head (8, the profile's measure), per channel
                            (9), unit gains (10: heads pooled per layer, no W_o), and 8 on the
                            relative-L2 scale, 1 - r (11) */
#define TR_NGAIN 3u /* gain sets of variants 8-10 */
#define TR_NVAR_RAW 10u /* head_quality's per-head figures: the first 6 variants, then the sums
                           variants 6 and 7 are made of per layer (truth_context) */
#define TR_DEC_MIN_NS_FULL 500000000ull
#define TR_DEC_MIN_NS_QUICK 100000000ull

#define T_INT4_BPE 4.5
#define T_INT4_Q 0.99
#define T_INT4_WORST 0.97
#define T_INT4_DEC 8.0
#define T_SPEARMAN_MODEL 0.95
#define T_SPEARMAN_CTX 0.9

typedef struct tcfg {
  const char *name;
  unsigned id, bits, group, residual;
  kv_drop_method drop;
  unsigned permille;
  unsigned sink; /* kvquant: first rows at 8 bits */
  unsigned prerope;     /* kvquant: K quantized before RoPE (the model's: adjacent, base 1e4) */
  unsigned vbits, vgroup; /* V's bits / group when not 0 (else those of K) */
  unsigned alloc;         /* kvquant: per-channel bit allocation (codec.h params.alloc) */
  unsigned perhead;       /* with alloc: K and V widths chosen per (layer, KV head) from
                             calibration contexts (head_plan), the bits/el at most bits + 0.5 */
  unsigned ecal;          /* the engine's calibrated int4: every section's parameters from the
                             calibration kv_calib_run() computed on contexts disjoint from the
                             measured ones (t->ecal), as kvdb_model_calibrate does */
} tcfg;

static const tcfg CFGS[] = {
  {"kivi int8", KV_CODEC_ID_KIVI, 8, 0, 0, KV_DROP_NONE, 0, 0, 0, 0, 0},
  {"kivi int4", KV_CODEC_ID_KIVI, 4, 0, 0, KV_DROP_NONE, 0, 0, 0, 0, 0},
  {"kivi int2", KV_CODEC_ID_KIVI, 2, 0, 0, KV_DROP_NONE, 0, 0, 0, 0, 0},
  {"kvquant int8", KV_CODEC_ID_KVQUANT, 8, 128, 0, KV_DROP_NONE, 0, 0, 1, 0, 0},
  {"kvquant int4 mixed", KV_CODEC_ID_KVQUANT, 4, 256, 0, KV_DROP_NONE, 0, 0, 1, 0, 256, 1, 1},
  {"kvquant int4 post-RoPE", KV_CODEC_ID_KVQUANT, 4, 128, 8, KV_DROP_NONE, 0, 0, 0, 0, 0},
  {"kvquant int4 sink 4", KV_CODEC_ID_KVQUANT, 4, 128, 0, KV_DROP_NONE, 0, 4, 1, 0, 0},
  {"kvquant K4 g64 V4", KV_CODEC_ID_KVQUANT, 4, 64, 8, KV_DROP_NONE, 0, 0, 1, 4, 128},
  {"kvquant int2", KV_CODEC_ID_KVQUANT, 2, 128, 8, KV_DROP_NONE, 0, 0, 1, 0, 0},
  {"knorm 90", KV_CODEC_ID_DROP, 0, 0, 0, KV_DROP_KNORM, 900, 0, 0, 0, 0},
  {"knorm 70", KV_CODEC_ID_DROP, 0, 0, 0, KV_DROP_KNORM, 700, 0, 0, 0, 0},
  {"knorm 50", KV_CODEC_ID_DROP, 0, 0, 0, KV_DROP_KNORM, 500, 0, 0, 0, 0},
  {"knorm 30", KV_CODEC_ID_DROP, 0, 0, 0, KV_DROP_KNORM, 300, 0, 0, 0, 0},
  {"keydiff 90", KV_CODEC_ID_DROP, 0, 0, 0, KV_DROP_KEYDIFF, 900, 0, 0, 0, 0},
  {"keydiff 70", KV_CODEC_ID_DROP, 0, 0, 0, KV_DROP_KEYDIFF, 700, 0, 0, 0, 0},
  {"keydiff 50", KV_CODEC_ID_DROP, 0, 0, 0, KV_DROP_KEYDIFF, 500, 0, 0, 0, 0},
  {"keydiff 30", KV_CODEC_ID_DROP, 0, 0, 0, KV_DROP_KEYDIFF, 300, 0, 0, 0, 0},
  {"snapkv 90", KV_CODEC_ID_DROP, 0, 0, 0, KV_DROP_SNAPKV, 900, 0, 0, 0, 0},
  {"snapkv 70", KV_CODEC_ID_DROP, 0, 0, 0, KV_DROP_SNAPKV, 700, 0, 0, 0, 0},
  {"snapkv 50", KV_CODEC_ID_DROP, 0, 0, 0, KV_DROP_SNAPKV, 500, 0, 0, 0, 0},
  {"snapkv 30", KV_CODEC_ID_DROP, 0, 0, 0, KV_DROP_SNAPKV, 300, 0, 0, 0, 0},
  {"snapkv 50 + kivi int4", KV_CODEC_ID_DROP, 4, 0, 0, KV_DROP_SNAPKV, 500, 0, 0, 0, 0},
  /* the configs below complete the engine's default profile space (engine/ops/profile.c
   * DEFAULT_SPACE + DEFAULT_SNAPKV: raw, lossless, int8, int4, int2, knorm/keydiff/snapkv
   * 90..30) with the parameters a put writes (engine/model/config.c): int8 is "kivi int8"
   * above; int4 and int2 are kvquant, groups of 128 tokens, no residual, K before RoPE */
  {"raw", KV_CODEC_ID_RAW, 0, 0, 0, KV_DROP_NONE, 0, 0, 0, 0, 0},
  {"lossless", KV_CODEC_ID_ZSTD_PLANES, 0, 0, 0, KV_DROP_NONE, 0, 0, 0, 0, 0},
  {"int4 (engine)", KV_CODEC_ID_KVQUANT, 4, 128, 0, KV_DROP_NONE, 0, 0, 1, 0, 0},
  {"int2 (engine)", KV_CODEC_ID_KVQUANT, 2, 128, 0, KV_DROP_NONE, 0, 0, 1, 0, 0},
};
#define N_CFG (sizeof CFGS / sizeof CFGS[0])
/* The truth's config sets (issue 16 leaves "across configs" open):
 * - the engine's profile space (the primary figures): the configs a put profiles by default
 *   and placement chooses among, as the engine encodes them — what the metric must rank;
 * - the research set: CFGS' first N_RESEARCH entries, the set of the figures before session 28
 *   (legacy KIVI int4/int2, the bench's int4 designs, snapkv50 + kivi int4);
 * - all of CFGS. */
#define N_RESEARCH 22u
static const char *const ENGINE_SPACE[] = {
    "raw",       "lossless",  "kivi int8", "int4 (engine)", "int2 (engine)", "knorm 90",
    "knorm 70",  "knorm 50",  "knorm 30",  "keydiff 90",    "keydiff 70",    "keydiff 50",
    "keydiff 30", "snapkv 90", "snapkv 70", "snapkv 50",    "snapkv 30"};
enum { SET_ENGINE, SET_RESEARCH, SET_ALL, N_SETS };

static int in_set(size_t i, int set)
{
  if (set == SET_ALL)
    return 1;
  if (set == SET_RESEARCH)
    return i < N_RESEARCH;
  for (size_t k = 0; k < sizeof ENGINE_SPACE / sizeof ENGINE_SPACE[0]; k++)
    if (strcmp(CFGS[i].name, ENGINE_SPACE[k]) == 0)
      return 1;
  return 0;
}
#define INT4_CFG 4 /* the int4 of the targets in CFGS: kvquant, pre-RoPE K, widths per channel,
                      bits per head, g256, no residual */
/* What the engine's "int4" config writes (engine/model/config.c kv_config_section_rope): kvquant
 * at 4 bits, K and V per channel in groups of 128 tokens (V clipped by the encoder's rule), no
 * residual, no widths or calibration (a put has no other contexts' queries); K before RoPE when
 * the model gives its RoPE (stories260K's: adjacent pairs, base 10000), else after. On a
 * 512-token section these are the bytes and values of a context put at block_tokens >= 128
 * (its K and V chunks of 128 tokens are the same), less one section header per extra block.
 * Reported beside the int4 of the targets (JSON engine_int4_*, engine_int4_postrope_*); not
 * among the truth's configs, so the Spearman figures are those of CFGS alone. */
static const tcfg ENGINE_INT4 = {"engine int4", KV_CODEC_ID_KVQUANT, 4, 128, 0, KV_DROP_NONE,
                                 0, 0, 1, 0, 0, 0, 0};
static const tcfg ENGINE_INT4_POST = {"engine int4 post-RoPE", KV_CODEC_ID_KVQUANT, 4, 128, 0,
                                      KV_DROP_NONE, 0, 0, 0, 0, 0, 0, 0};
/* The engine's int4 of a calibrated model (kvdb_model_calibrate): what a put writes, the
 * section parameters of kv_calib_section_params() over the calibration of TR_CAL_* contexts
 * that follow the measured ones in the corpus (never a measured context), K before RoPE, no
 * residual, the config's group left to the plan (JSON engine_int4_calibrated_*). */
static const tcfg ENGINE_INT4_CAL = {"engine int4 calibrated", KV_CODEC_ID_KVQUANT, 4, 128, 0,
                                     KV_DROP_NONE, 0, 0, 1, 0, 0, 1, 0, 1};
/* the same at 2 bits (int2): uncalibrated, as a put writes it, and calibrated (plan 1) */
static const tcfg ENGINE_INT2 = {"engine int2", KV_CODEC_ID_KVQUANT, 2, 128, 0, KV_DROP_NONE,
                                 0, 0, 1, 0, 0, 0, 0, 0};
static const tcfg ENGINE_INT2_CAL = {"engine int2 calibrated", KV_CODEC_ID_KVQUANT, 2, 128, 0,
                                     KV_DROP_NONE, 0, 0, 1, 0, 0, 1, 0, 1};
/* calibration contexts (KVDB_TRUTH_CAL_CONTEXTS=N: N of them, 1..64, an experiment; also
 * KVDB_TRUTH_CAL_GROUP, KVDB_TRUTH_CAL_PLANS: engine_calibrate) */
#define TR_CAL_FULL 24u
#define TR_CAL_QUICK 6u

/* One context: tokens, the queries of every position, the f16 KV of every position. */
typedef struct tctx {
  int tok[TR_TOKENS];
  float *q;     /* [TR_TOKENS][L][n_q_heads][d] */
  uint16_t *kv; /* [L][H][2][TR_TOKENS][d] f16 */
} tctx;

typedef struct truth {
  const bench_env *env;
  refmodel_model *m;
  refmodel_state *st;
  uint32_t L, H, QH, grp, d, vocab, kv_dim, n_ctx;
  tctx *ctx;
  void *scratch; /* codec, selection and quality scratch */
  size_t scratch_cap;
  double *q2;    /* [n_ctx][L][H][d]: per context, the sum over positions and the KV head's
                    query heads of each channel's squared query (sensitivity weights) */
  kv_calib *cal; /* [n_ctx]: perhead configs' calibration of each measured context, from the
                    other measured contexts (leave one out; head_plan), NULL before */
  tctx *cal_ctx; /* [n_cal]: the engine calibration's contexts (disjoint from ctx) */
  uint32_t n_cal;
  kv_calib ecal; /* kv_calib_run() over cal_ctx: what kvdb_model_calibrate stores */
  double ecal_secs;
  /* the output-weighted quality: W_o's gains from the checkpoint (load_gains): [0] one per
   * (layer, query head) ||W_o,h||_F^2 / d, [1] per channel diag(W_o,h^T W_o,h), [2] all 1;
   * gacc: [TR_NGAIN][2][L][TR_PROBES] sums of the config being measured (truth_context) */
  float *gain[TR_NGAIN];
  uint32_t gain_ch[TR_NGAIN];
  double *gacc;
} truth;

static int tfail(const char *what, int rc)
{
  bench_log("%s: %s: %s", what, refmodel_strerror(rc), refmodel_errmsg());
  return -1;
}


static uint16_t *sec_of(const truth *t, const tctx *c, uint32_t l, uint32_t h, int kv)
{
  return c->kv + ((((size_t)l * t->H + h) * 2 + (size_t)kv) * TR_TOKENS) * t->d;
}

static int need_scratch(truth *t, size_t n)
{
  if (n <= t->scratch_cap)
    return 0;
  free(t->scratch);
  t->scratch = malloc(n);
  t->scratch_cap = t->scratch ? n : 0;
  if (t->scratch == NULL)
    bench_log("out of memory (%zu bytes of scratch)", n);
  return t->scratch ? 0 : -1;
}

/* W_o of every layer from the llama2.c checkpoint at `bin` (tools/refmodel/refmodel.h's layout:
 * wo[L][dim][dim] after the embedding, rms_att, wq, wk, wv), its gains into t->gain (the
 * model's output gains as kvdb_model_set_output_gains takes them). */
static int load_gains(truth *t, const char *bin, const refmodel_config *cf)
{
  size_t dim = (size_t)cf->dim, L = t->L, kvd = t->kv_dim, QH = t->QH, d = t->d;
  size_t V = (size_t)(cf->vocab_size < 0 ? -cf->vocab_size : cf->vocab_size);
  long off = (long)(28 + 4 * (V * dim + L * dim + L * dim * dim + 2 * L * kvd * dim));
  float *wo = malloc(L * dim * dim * sizeof(float));
  t->gain[0] = calloc(L * QH, sizeof(float));
  t->gain[1] = calloc(L * QH * d, sizeof(float));
  t->gain[2] = malloc(L * QH * sizeof(float));
  t->gacc = malloc((size_t)TR_NGAIN * 2 * L * TR_PROBES * sizeof(double));
  FILE *f = fopen(bin, "rb");
  int ok = wo && t->gain[0] && t->gain[1] && t->gain[2] && t->gacc && f &&
           fseek(f, off, SEEK_SET) == 0 &&
           fread(wo, sizeof(float), L * dim * dim, f) == L * dim * dim;
  if (f)
    fclose(f);
  if (!ok) {
    free(wo);
    bench_log("cannot read W_o from %s", bin);
    return -1;
  }
  t->gain_ch[0] = 1;
  t->gain_ch[1] = (uint32_t)d;
  t->gain_ch[2] = 1;
  for (size_t l = 0; l < L; l++)
    for (size_t i = 0; i < dim; i++) /* row i: output i = sum_j wo[i][j] x_j, head h at j / d */
      for (size_t j = 0; j < QH * d; j++) {
        double w = wo[(l * dim + i) * dim + j];
        t->gain[1][l * QH * d + j] += (float)(w * w);
      }
  for (size_t i = 0; i < L * QH; i++) {
    double sm = 0;
    for (size_t c = 0; c < d; c++)
      sm += t->gain[1][i * d + c];
    t->gain[0][i] = (float)(sm / d);
    t->gain[2][i] = 1.0f;
  }
  free(wo);
  return 0;
}

/* Feed a context token by token, keeping every position's queries and K, V. */
static int run_context(truth *t, tctx *c)
{
  size_t qstep = (size_t)t->L * t->QH * t->d;
  int r;
  refmodel_state_clear_absent(t->st);
  for (uint32_t p = 0; p < TR_TOKENS; p++) {
    if ((r = refmodel_forward(t->st, c->tok[p], (int)p, NULL)) != REFMODEL_OK)
      return tfail("refmodel_forward", r);
    for (uint32_t l = 0; l < t->L; l++)
      memcpy(c->q + p * qstep + (size_t)l * t->QH * t->d, refmodel_state_query(t->st, (int)l),
             (size_t)t->QH * t->d * sizeof(float));
  }
  for (uint32_t l = 0; l < t->L; l++)
    for (uint32_t p = 0; p < TR_TOKENS; p++) {
      const float *kp = refmodel_state_key(t->st, (int)l, (int)p);
      const float *vp = refmodel_state_value(t->st, (int)l, (int)p);
      for (uint32_t h = 0; h < t->H; h++) {
        kv_codec_from_f32(KV_CODEC_F16, kp + (size_t)h * t->d, t->d,
                          sec_of(t, c, l, h, 0) + (size_t)p * t->d);
        kv_codec_from_f32(KV_CODEC_F16, vp + (size_t)h * t->d, t->d,
                          sec_of(t, c, l, h, 1) + (size_t)p * t->d);
      }
    }
  return 0;
}

/* Queries of KV head h of layer l at positions pos[0..n) (every query head of its group), and
 * their positions, into q / qpos; returns the rows. */
static uint32_t head_queries(const truth *t, const tctx *c, uint32_t l, uint32_t h,
                             const uint32_t *pos, uint32_t n, float *q, uint32_t *qpos)
{
  size_t qstep = (size_t)t->L * t->QH * t->d;
  uint32_t k = 0;
  for (uint32_t i = 0; i < n; i++)
    for (uint32_t j = 0; j < t->grp; j++, k++) {
      memcpy(q + (size_t)k * t->d,
             c->q + pos[i] * qstep + ((size_t)l * t->QH + h * t->grp + j) * t->d,
             t->d * sizeof(float));
      qpos[k] = pos[i];
    }
  return k;
}

/*
 * KVQuant's sensitivity weights for kvquant's bit allocation of K (params.chan_weight): the mean
 * square of each channel's queries over every position and query head of KV head h of layer l,
 * in the *other* contexts (calibration data: never the context whose keys are coded, whose
 * queries are the quality probes), averaged over each RoPE pair (a rotation mixes the pair's
 * two channels, so only the pair's sum survives every position). w: d floats.
 */
static int sens_weights(truth *t, uint32_t ci, uint32_t l, uint32_t h, float *w)
{
  uint32_t d = t->d;
  size_t per = (size_t)t->L * t->H * d;
  if (t->q2 == NULL) {
    t->q2 = calloc((size_t)t->n_ctx * per, sizeof *t->q2);
    if (t->q2 == NULL) {
      bench_log("out of memory (query weights)");
      return -1;
    }
    size_t qstep = (size_t)t->L * t->QH * d;
    for (uint32_t c = 0; c < t->n_ctx; c++)
      for (uint32_t p = 0; p < TR_TOKENS; p++)
        for (uint32_t ll = 0; ll < t->L; ll++)
          for (uint32_t qh = 0; qh < t->QH; qh++)
            kv_calib_q2_add(t->ctx[c].q + p * qstep + ((size_t)ll * t->QH + qh) * d, 1, d,
                            t->q2 + c * per + ((size_t)ll * t->H + qh / t->grp) * d);
  }
  /* the calibration's weights (compress/calib.c), all contexts but ci summed per RoPE pair */
  kv_calib_chan_weights(t->q2 + ((size_t)l * t->H + h) * d, t->n_ctx, per, ci, d,
                        KV_ROPE_ADJACENT, w);
  return 0;
}

/* Encode and decode one head's first n tokens of K and V in config cf: decoded rows into
 * kd/vd, their token positions into rpos, *rows, encoded bytes into *bytes. enc_out (when not
 * NULL, cap enc_cap) keeps the two encoded sections back to back. */
static int codec_head(truth *t, const tctx *c, uint32_t l, uint32_t h, uint32_t n, const tcfg *cf,
                      uint16_t *kd, uint16_t *vd, uint32_t *rpos, uint32_t *rows, size_t *bytes,
                      uint8_t *enc_out, size_t enc_cap, size_t *enc_len)
{
  uint32_t d = t->d;
  const kv_codec *codec = kv_codec_by_id(cf->id);
  kv_section_shape sh[2] = {{KV_CODEC_F16, KV_SECTION_K, n, d}, {KV_CODEC_F16, KV_SECTION_V, n, d}};
  kv_codec_params p[2];
  kv_codec_err err;
  uint32_t keep[TR_TOKENS], nk = 0;
  for (int kv = 0; kv < 2; kv++) {
    kv_codec_params_init(&p[kv]);
    p[kv].bits = cf->bits;
    p[kv].group = cf->id == KV_CODEC_ID_KVQUANT ? cf->group : 0;
    p[kv].residual = cf->residual;
    p[kv].sink = cf->sink;
  }
  if (cf->vbits)
    p[1].bits = cf->vbits;
  if (cf->vgroup)
    p[1].group = cf->vgroup;
  /* widths per channel, K weighted by calibration queries, bits and groups per head: the
   * calibration's section parameters (compress/calib.c), the measured context's own calibration
   * (leave one out: head_plan) or the engine's (ecal: disjoint contexts) */
  const kv_calib *cal = cf->ecal ? &t->ecal
                        : cf->alloc && t->cal ? &t->cal[(uint32_t)(c - t->ctx)]
                                              : NULL;
  if (cf->alloc && cal == NULL) {
    bench_log("%s: no calibration", cf->name);
    return -1;
  }
  for (int kv = 0; kv < 2 && cal != NULL; kv++)
    if (!kv_calib_section_params(cal, cf->bits, l, h, kv, n, 0, &p[kv])) {
      bench_log("%s: the calibration does not cover layer %u head %u", cf->name, l, h);
      return -1;
    }

  const uint16_t *k = sec_of(t, c, l, h, 0), *v = sec_of(t, c, l, h, 1);
  size_t len = (size_t)n * d * 2;
  if (cf->prerope) { /* the model's RoPE: llama2.c's adjacent pairs, base 10000 */
    p[0].rope_base = 10000.0f;
    p[0].rope_style = KV_ROPE_ADJACENT;
    p[0].rope_pos0 = 0;
  }
  if (cf->id == KV_CODEC_ID_DROP) {
    float win[TR_WIN * 8 * 64];
    uint32_t wpos[TR_WIN], wq[TR_WIN * 8];
    for (uint32_t i = 0; i < TR_WIN; i++)
      wpos[i] = n - TR_WIN + i;
    if ((size_t)TR_WIN * t->grp * d > sizeof win / sizeof win[0]) {
      bench_log("SnapKV window larger than the bench's buffer");
      return -1;
    }
    head_queries(t, c, l, h, wpos, TR_WIN, win, wq);
    kv_snapkv_window w = {win, TR_WIN, t->grp, 0, KV_POOL_AVG, 1};
    const kv_snapkv_window *wp = cf->drop == KV_DROP_SNAPKV ? &w : NULL;
    if (need_scratch(t, kv_drop_scratch_bytes(cf->drop, n, d, wp)) != 0)
      return -1;
    if (kv_drop_select(cf->drop, &sh[0], k, len, cf->permille, wp, t->scratch, t->scratch_cap,
                       keep, TR_TOKENS, &nk, &err) != KV_CODEC_OK)
      return bench_codec_fail("kv_drop_select", &err);
    for (int kv = 0; kv < 2; kv++) {
      p[kv].keep_permille = cf->permille;
      p[kv].drop_method = cf->drop;
      p[kv].keep_pos = keep;
      p[kv].n_keep = nk;
    }
  }
  *bytes = 0;
  if (enc_len)
    *enc_len = 0;
  for (int kv = 0; kv < 2; kv++) {
    size_t b = kv_codec_bound(codec, &sh[kv], &p[kv]);
    size_t es = kv_codec_scratch_bytes(codec, &sh[kv], &p[kv], KV_CODEC_OP_ENCODE);
    size_t ds = kv_codec_scratch_bytes(codec, &sh[kv], &p[kv], KV_CODEC_OP_DECODE);
    if (b == 0 || es == 0 || ds == 0) {
      bench_log("%s: the codec refuses %u x %u sections", cf->name, n, d);
      return -1;
    }
    if (need_scratch(t, b + (es > ds ? es : ds) + 64) != 0)
      return -1;
    uint8_t *enc = t->scratch;
    void *ws = (uint8_t *)t->scratch + b;
    size_t wcap = t->scratch_cap - b, el = 0;
    if (kv_codec_encode(codec, &sh[kv], kv ? v : k, len, &p[kv], ws, wcap, enc, b, &el, &err) !=
        KV_CODEC_OK)
      return bench_codec_fail("kv_codec_encode", &err);
    kv_section_info info;
    if (kv_section_decode(enc, el, ws, wcap, kv ? vd : kd, len, &info, &err) != KV_CODEC_OK)
      return bench_codec_fail("kv_section_decode", &err);
    if (kv == 0) {
      *rows = info.n_rows;
      if (kv_section_positions(enc, el, 0, info.n_rows, rpos, &err) != KV_CODEC_OK)
        return bench_codec_fail("kv_section_positions", &err);
    }
    if (enc_out != NULL) {
      if (*enc_len + el > enc_cap) {
        bench_log("encoded sections larger than their arena");
        return -1;
      }
      memcpy(enc_out + *enc_len, enc, el);
      *enc_len += el;
    }
    *bytes += el;
  }
  return 0;
}

/* Causal-metric quality of one head: decoded rows (kd, vd, rpos, rows) against the original
 * first n tokens, with the model's queries at the spread positions. Also the old metric (the
 * last TR_WIN positions' queries, non-causal) into *old when old is not NULL. */
static int head_quality(truth *t, const tctx *c, uint32_t l, uint32_t h, uint32_t n,
                        const uint16_t *kd, const uint16_t *vd, const uint32_t *rpos,
                        uint32_t rows, double *q, double *old, double *var)
{
  uint32_t d = t->d, pos[TR_PROBES];
  uint32_t np = kv_quality_probe_positions(n, TR_PROBES, pos);
  size_t qn = (size_t)np * t->grp;
  float *pr = malloc(qn * d * sizeof(float) * 3);
  uint32_t *qpos = malloc(qn * sizeof *qpos);
  if (pr == NULL || qpos == NULL) {
    free(pr);
    free(qpos);
    bench_log("out of memory (probes)");
    return -1;
  }
  float *ref = pr + qn * d, *test = ref + qn * d;
  uint32_t nq = head_queries(t, c, l, h, pos, np, pr, qpos);
  kv_codec_err err;
  kv_quality qy;
  int rc = -1;
  size_t sc = kv_quality_causal_scratch_bytes(n, d);
  size_t so = kv_quality_attend_scratch_bytes(n, d, TR_WIN * t->grp);
  if (need_scratch(t, sc > so ? sc : so) != 0)
    goto out;
  const uint16_t *k = sec_of(t, c, l, h, 0), *v = sec_of(t, c, l, h, 1);
  if (kv_quality_causal_attend(KV_CODEC_F16, n, d, k, v, NULL, pr, qpos, nq, t->scratch,
                               t->scratch_cap, ref, &err) != KV_CODEC_OK ||
      kv_quality_causal_attend(KV_CODEC_F16, rows, d, kd, vd, rpos, pr, qpos, nq, t->scratch,
                               t->scratch_cap, test, &err) != KV_CODEC_OK ||
      kv_quality_compare(ref, test, nq, d, &qy, &err) != KV_CODEC_OK) {
    bench_codec_fail("causal quality", &err);
    goto out;
  }
  *q = qy.cos_mean;
  /* KVDB_TRUTH_METRIC=nac or sq: the profiled quality (and the int4's, and its head plan's) is
   * variant 4 or 5 below instead of the cosine (an experiment: bench/RESULTS.md, issue 16,
   * "quality_spearman_vs_model: metric variants") */
  static int metric = -1;
  if (metric < 0) {
    const char *m = getenv("KVDB_TRUTH_METRIC");
    metric = m && strcmp(m, "nac") == 0 ? 1 : m && strcmp(m, "sq") == 0 ? 2 : 0;
  }
  if (metric > 0) {
    double acc = 0;
    for (uint32_t i = 0; i < nq; i++) {
      const float *a = ref + (size_t)i * d, *b = test + (size_t)i * d;
      double aa = 0, dd = 0;
      for (uint32_t j = 0; j < d; j++) {
        aa += (double)a[j] * a[j];
        dd += ((double)a[j] - b[j]) * ((double)a[j] - b[j]);
      }
      acc += aa > 0 ? fmax(0, 1 - dd / (metric == 1 ? 2 * aa : aa)) : 1;
    }
    *q = acc / nq;
  }
  if (var != NULL) { /* experiments: 0 weighted by keys seen, 1 = 1 - rel L2, 2 second half,
                        3 mean of per-probe 1 - rel err */
    double sw = 0, w = 0, s2 = 0, n2 = 0, re = 0, nc = 0, sq = 0, ewn = 0, ewd = 0, pd = 0,
           pa = 0;
    for (uint32_t i = 0; i < nq; i++) {
      const float *a = ref + (size_t)i * d, *b = test + (size_t)i * d;
      double ab = 0, aa = 0, bb = 0, dd = 0;
      for (uint32_t j = 0; j < d; j++) {
        ab += (double)a[j] * b[j];
        aa += (double)a[j] * a[j];
        bb += (double)b[j] * b[j];
        dd += ((double)a[j] - b[j]) * ((double)a[j] - b[j]);
      }
      double cs = dd == 0 ? 1 : (aa == 0 || bb == 0 ? 0 : ab / sqrt(aa * bb));
      sw += cs * (qpos[i] + 1);
      w += qpos[i] + 1;
      if (qpos[i] >= n / 2) {
        s2 += cs;
        n2++;
      }
      re += aa > 0 ? 1 - fmin(1, sqrt(dd / aa)) : 1;
      /* 4: norm-aware cosine, 1 - |a - b|^2 / (2 |a|^2) = r cos - (r^2 - 1) / 2 with
       * r = |b| / |a|: the cosine when the norm is kept, lower when it is not; floored at 0 */
      nc += aa > 0 ? fmax(0, 1 - dd / (2 * aa)) : 1;
      /* 5: 1 - squared relative error, floored at 0 */
      sq += aa > 0 ? fmax(0, 1 - dd / aa) : 1;
      /* 6: the cosine weighted by the output's energy, the larger of the original's and the
       * stored KV's (a head that writes more into the residual stream counts more; a quiet
       * head that the config makes loud too), per layer; 7: 1 - the layer's pooled squared
       * error over twice its pooled energy (norm-aware, heads pooled) */
      double ew = fmax(aa, bb);
      ewn += ew * cs;
      ewd += ew;
      pd += dd;
      pa += aa;
    }
    var[0] = sw / w;
    var[1] = 1 - qy.rel_l2;
    var[2] = s2 / n2;
    var[3] = re / nq;
    var[4] = nc / nq;
    var[5] = sq / nq;
    var[6] = ewn;
    var[7] = ewd;
    var[8] = pd;
    var[9] = pa;
    for (uint32_t gi = 0; t->gacc != NULL && gi < TR_NGAIN; gi++) { /* variants 8-10 */
      uint32_t ch = t->gain_ch[gi];
      double *ge = t->gacc + ((size_t)gi * 2 * t->L + l) * TR_PROBES;
      kv_quality_gain_add(ref, test, np, t->grp, d,
                          t->gain[gi] + ((size_t)l * t->QH + (size_t)h * t->grp) * ch, ch, ge,
                          ge + (size_t)t->L * TR_PROBES);
    }
  }
  if (old != NULL) { /* issue 3's probes: the last positions' queries over the whole block */
    uint32_t wpos[TR_WIN];
    for (uint32_t i = 0; i < TR_WIN; i++)
      wpos[i] = n - TR_WIN + i;
    uint32_t nw = head_queries(t, c, l, h, wpos, TR_WIN, pr, qpos);
    if (kv_quality_attend(KV_CODEC_F16, n, d, k, v, pr, nw, t->scratch, t->scratch_cap, ref,
                          &err) != KV_CODEC_OK ||
        kv_quality_attend(KV_CODEC_F16, rows, d, kd, vd, pr, nw, t->scratch, t->scratch_cap, test,
                          &err) != KV_CODEC_OK ||
        kv_quality_compare(ref, test, nw, d, &qy, &err) != KV_CODEC_OK) {
      bench_codec_fail("old quality", &err);
      goto out;
    }
    *old = qy.cos_mean;
  }
  rc = 0;
out:
  free(pr);
  free(qpos);
  return rc;
}

/* ---- Spearman ---- */

static void ranks(const double *x, uint32_t n, double *r)
{
  for (uint32_t i = 0; i < n; i++) {
    uint32_t less = 0, eq = 0;
    for (uint32_t j = 0; j < n; j++) {
      less += x[j] < x[i];
      eq += x[j] == x[i];
    }
    r[i] = less + (eq + 1) / 2.0; /* average rank of the ties */
  }
}

static double spearman(const double *x, const double *y, uint32_t n)
{
  double rx[64], ry[64];
  if (n < 2 || n > 64)
    return NAN;
  ranks(x, n, rx);
  ranks(y, n, ry);
  double mx = 0, my = 0;
  for (uint32_t i = 0; i < n; i++) {
    mx += rx[i];
    my += ry[i];
  }
  mx /= n;
  my /= n;
  double sxy = 0, sxx = 0, syy = 0;
  for (uint32_t i = 0; i < n; i++) {
    sxy += (rx[i] - mx) * (ry[i] - my);
    sxx += (rx[i] - mx) * (rx[i] - mx);
    syy += (ry[i] - my) * (ry[i] - my);
  }
  return sxx > 0 && syy > 0 ? sxy / sqrt(sxx * syy) : NAN;
}

/* spearman() over the configs of one set (in_set) of CFGS */
static double spearman_set(const double *x, const double *y, int set)
{
  double xs[N_CFG], ys[N_CFG];
  uint32_t n = 0;
  for (size_t i = 0; i < N_CFG; i++)
    if (in_set(i, set)) {
      xs[n] = x[i];
      ys[n++] = y[i];
    }
  return spearman(xs, ys, n);
}

/* ---- the continuation runs ---- */

/* Put the stored prefix (raw, or the decoded rows of every head) into the state and run the
 * continuation; log-probabilities of each step into lp [TR_STEPS][vocab]. */
static int continuation(truth *t, const tctx *c, uint32_t cut, float *lp)
{
  int r;
  for (uint32_t s = 0; s < TR_STEPS; s++) {
    uint32_t p = cut + s;
    const float *lg;
    if ((r = refmodel_forward(t->st, c->tok[p], (int)p, &lg)) != REFMODEL_OK)
      return tfail("refmodel_forward", r);
    refmodel_log_softmax(lg, (int)t->vocab, lp + (size_t)s * t->vocab);
  }
  return 0;
}

static void put_rows(truth *t, uint32_t l, uint32_t h, const uint16_t *kd, const uint16_t *vd,
                     const uint32_t *rpos, uint32_t rows)
{
  uint32_t d = t->d, i = 0;
  for (uint32_t p = 0; p < TR_STORED; p++) {
    float *kp = refmodel_state_key(t->st, (int)l, (int)p) + (size_t)h * d;
    float *vp = refmodel_state_value(t->st, (int)l, (int)p) + (size_t)h * d;
    if (i < rows && rpos[i] == p) {
      kv_codec_to_f32(KV_CODEC_F16, kd + (size_t)i * d, d, kp);
      kv_codec_to_f32(KV_CODEC_F16, vd + (size_t)i * d, d, vp);
      i++;
    } else { /* dropped: absent, its row zero (finite, never weighted) */
      memset(kp, 0, d * sizeof(float));
      memset(vp, 0, d * sizeof(float));
      refmodel_state_set_absent(t->st, (int)l, (int)h, (int)p, 1);
    }
  }
}

typedef struct cres {
  double q, q_old, agree, kl, bytes, var[TR_NVAR];
  double q_cos; /* the mean per-head cosine; q is the output-weighted quality when W_o's gains
                   were read (variant 8), else the same */
  double agree_cuts, kl_cuts; /* the mean over the TR_CUTS prefix lengths */
} cres;

/* Prefix lengths of the prefix-reuse truth: TR_STORED (k + 1) / TR_CUTS; the last is the end. */
#define TR_CUTS 4u

static void score_steps(const float *lp_raw, const float *lp, uint32_t V, double *agree, double *kl)
{
  *agree = *kl = 0;
  for (uint32_t s = 0; s < TR_STEPS; s++) {
    const float *a = lp_raw + (size_t)s * V, *b = lp + (size_t)s * V;
    *agree += (refmodel_argmax(a, (int)V) == refmodel_argmax(b, (int)V)) / (double)TR_STEPS;
    double k = 0;
    for (uint32_t i = 0; i < V; i++)
      k += exp((double)a[i]) * ((double)a[i] - b[i]);
    *kl += k / TR_STEPS;
  }
}

/* One context in every config: quality, agreement, KL. res[N_CFG] of this context. */
static int truth_context(truth *t, const tctx *c, cres *res)
{
  uint32_t d = t->d, V = t->vocab, nh = t->L * t->H;
  size_t hrow = (size_t)TR_TOKENS * d;
  float *lp_raw = malloc((size_t)TR_STEPS * V * sizeof(float) * (TR_CUTS + 1));
  uint16_t *kd = malloc(hrow * 2 * 2 * nh); /* every head's decoded K and V */
  uint32_t *rpos = malloc(sizeof(uint32_t) * TR_TOKENS * nh), *rows = malloc(4 * (size_t)nh);
  uint32_t ident[TR_TOKENS];
  int rc = -1;
  if (lp_raw == NULL || kd == NULL || rpos == NULL || rows == NULL) {
    bench_log("out of memory (truth)");
    goto out;
  }
  float *lp = lp_raw + (size_t)TR_CUTS * TR_STEPS * V;
  for (uint32_t i = 0; i < TR_TOKENS; i++)
    ident[i] = i;
  for (uint32_t k = 0; k < TR_CUTS; k++) { /* raw KV, each prefix length */
    refmodel_state_clear_absent(t->st);
    for (uint32_t l = 0; l < t->L; l++)
      for (uint32_t h = 0; h < t->H; h++)
        put_rows(t, l, h, sec_of(t, c, l, h, 0), sec_of(t, c, l, h, 1), ident, TR_STORED);
    if (continuation(t, c, TR_STORED * (k + 1) / TR_CUTS, lp_raw + (size_t)k * TR_STEPS * V) != 0)
      goto out;
  }
  for (size_t ci = 0; ci < N_CFG; ci++) {
    cres *r = &res[ci];
    memset(r, 0, sizeof *r);
    if (t->gacc != NULL)
      memset(t->gacc, 0, (size_t)TR_NGAIN * 2 * t->L * TR_PROBES * sizeof(double));
    for (uint32_t l = 0; l < t->L; l++) {
      double lay[4] = {0, 0, 0, 0}; /* variants 6 and 7: the layer's sums */
      for (uint32_t h = 0; h < t->H; h++) {
        size_t b, hi = (size_t)l * t->H + h;
        double q, qo, var[TR_NVAR_RAW];
        uint16_t *hk = kd + hi * 2 * hrow, *hv = hk + hrow;
        uint32_t *hp = rpos + hi * TR_TOKENS;
        if (codec_head(t, c, l, h, TR_STORED, &CFGS[ci], hk, hv, hp, &rows[hi], &b, NULL, 0,
                       NULL) != 0 ||
            head_quality(t, c, l, h, TR_STORED, hk, hv, hp, rows[hi], &q, &qo, var) != 0)
          goto out;
        for (unsigned vi = 0; vi < 6; vi++)
          r->var[vi] += var[vi] / nh;
        for (unsigned vi = 0; vi < 4; vi++)
          lay[vi] += var[6 + vi];
        r->q_cos += q / nh;
        r->q_old += qo / nh;
        r->bytes += (double)b;
      }
      r->var[6] += (lay[1] > 0 ? lay[0] / lay[1] : 1) / t->L;
      r->var[7] += (lay[3] > 0 ? fmax(0, 1 - lay[2] / (2 * lay[3])) : 1) / t->L;
    }
    for (uint32_t gi = 0; gi < TR_NGAIN; gi++)
      r->var[8 + gi] = t->gacc == NULL ? NAN
                       : kv_quality_gain_finish(t->gacc + (size_t)gi * 2 * t->L * TR_PROBES,
                                                t->gacc + ((size_t)gi * 2 + 1) * t->L * TR_PROBES,
                                                t->L, TR_PROBES, NULL);
    r->var[11] = 1 - sqrt(2 * (1 - r->var[8]));
    r->q = t->gacc != NULL ? r->var[8] : r->q_cos;
    for (uint32_t k = 0; k < TR_CUTS; k++) {
      refmodel_state_clear_absent(t->st);
      for (uint32_t hi = 0; hi < nh; hi++)
        put_rows(t, hi / t->H, hi % t->H, kd + (size_t)hi * 2 * hrow,
                 kd + (size_t)hi * 2 * hrow + hrow, rpos + (size_t)hi * TR_TOKENS, rows[hi]);
      if (continuation(t, c, TR_STORED * (k + 1) / TR_CUTS, lp) != 0)
        goto out;
      double ag, kl;
      score_steps(lp_raw + (size_t)k * TR_STEPS * V, lp, V, &ag, &kl);
      r->agree_cuts += ag / TR_CUTS;
      r->kl_cuts += kl / TR_CUTS;
      if (k + 1 == TR_CUTS) { /* the end of the stored context: the measure */
        r->agree = ag;
        r->kl = kl;
      }
    }
  }
  rc = 0;
out:
  free(lp_raw);
  free(kd);
  free(rpos);
  free(rows);
  return rc;
}

/* ---- the int4 targets ---- */

typedef struct dec_run {
  const uint8_t *arena;
  const size_t *off, *len;
  size_t n_sec, sec_bytes;
  uint8_t *out;
  void *ws;
  size_t ws_cap;
  kv_codec_dctx *ctx;
} dec_run;

static int dec_pass(void *payload, size_t iter)
{
  dec_run *r = payload;
  kv_codec_err err;
  (void)iter;
  for (size_t s = 0; s < r->n_sec; s++)
    if (kv_section_decode_dctx(r->ctx, r->arena + r->off[s], r->len[s], r->ws, r->ws_cap,
                               r->out + s * r->sec_bytes, r->sec_bytes, NULL, &err) != KV_CODEC_OK)
      return bench_codec_fail("kv_section_decode_dctx", &err);
  return 0;
}

/* memcpy of the decoded bytes (the same output size), the baseline of the decode figures */
static int copy_pass(void *payload, size_t iter)
{
  dec_run *r = payload;
  (void)iter;
  memcpy(r->ws, r->out, r->n_sec * r->sec_bytes);
  return 0;
}

static int median3_cmp(const void *a, const void *b)
{
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

typedef struct int4_fig {
  double bpe, q, worst_head, worst_any, dec_gbps;
  double dec_unfused_gbps; /* the same decode without a decoding context: K rotated in a second
                              pass with angles from libm per page group (the path before the
                              fused kernel) */
  double memcpy_gbps;      /* memcpy of the same output bytes */
  uint32_t worst_l, worst_h;
} int4_fig;

/* The metric of the int4's plans: the cosine, or KVDB_TRUTH_METRIC's variant (head_quality) */
static unsigned truth_metric(void)
{
  const char *m = getenv("KVDB_TRUTH_METRIC");
  return m && strcmp(m, "nac") == 0 ? 1 : m && strcmp(m, "sq") == 0 ? 2 : 0;
}

/* Probes of head (l, h) of context c over its first n tokens (the causal metric's spread
 * positions, every query head of the group) and their reference outputs over the original KV:
 * the fields of a kv_calib_head_data. q, ref: TR_PROBES x grp x d floats; qpos as many. */
static int head_probes(truth *t, const tctx *c, uint32_t l, uint32_t h, uint32_t n,
                       kv_calib_head_data *hd, float *q, uint32_t *qpos, float *ref)
{
  uint32_t pos[TR_PROBES], np = kv_quality_probe_positions(n, TR_PROBES, pos);
  uint32_t nq = head_queries(t, c, l, h, pos, np, q, qpos);
  kv_codec_err err;
  if (need_scratch(t, kv_quality_causal_scratch_bytes(n, t->d)) != 0)
    return -1;
  const uint16_t *k = sec_of(t, c, l, h, 0), *v = sec_of(t, c, l, h, 1);
  if (kv_quality_causal_attend(KV_CODEC_F16, n, t->d, k, v, NULL, q, qpos, nq, t->scratch,
                               t->scratch_cap, ref, &err) != KV_CODEC_OK)
    return bench_codec_fail("causal quality", &err);
  *hd = (kv_calib_head_data){KV_CODEC_F16, n, t->d, k, v, 10000.0f, KV_ROPE_ADJACENT, 0, NULL,
                             q, qpos, nq, ref, truth_metric()};
  return 0;
}

/*
 * Per-head mixed precision (perhead configs; the brief's "spend bits where the metric's error
 * is"): each measured context ci gets its own calibration t->cal[ci] from the *other* measured
 * contexts only (leave one out; calibration as KVQuant calibrates offline): K's weights
 * (sens_weights) and a plan, one option of kv_calib_options(4) per (layer, KV head): the quality
 * loss of every option on every head (kv_calib_eval), averaged over those contexts, then
 * kv_calib_plan_choose's Lagrangian choice under a byte budget of (cf->bits + 0.5) bits per
 * element over all heads. The engine's calibration (kv_calib_run, ecal) is the same code over
 * contexts disjoint from the measured ones.
 */
static int head_plan(truth *t, const tcfg *cf)
{
  uint32_t d = t->d, heads = t->L * t->H, n = TR_TOKENS;
  size_t no = 0;
  const kv_calib_opt *opts = kv_calib_options(cf->bits, &no);
  double *loss = calloc(no * t->n_ctx * heads + 1, sizeof *loss);
  double *bytes = calloc(no * heads + 1, sizeof *bytes);
  float *pq = malloc((size_t)TR_PROBES * t->grp * d * sizeof(float) * 2);
  uint32_t *qpos = malloc((size_t)TR_PROBES * t->grp * sizeof *qpos);
  uint8_t *pl = malloc(heads);
  t->cal = calloc(t->n_ctx, sizeof *t->cal);
  void *ws = NULL;
  int rc = -1;
  if (!loss || !bytes || !pq || !qpos || !pl || !t->cal || opts == NULL) {
    bench_log("out of memory (head plan)");
    goto out;
  }
  for (uint32_t ci = 0; ci < t->n_ctx; ci++) { /* each context's weights: the others' queries */
    kv_calib *c = &t->cal[ci];
    c->n_layers = t->L;
    c->n_heads = t->H;
    c->head_dim = d;
    c->weight = malloc((size_t)heads * d * sizeof(float));
    c->plan[0] = malloc(heads * sizeof(kv_calib_opt));
    if (c->weight == NULL || c->plan[0] == NULL) {
      bench_log("out of memory (head plan)");
      goto out;
    }
    for (uint32_t hh = 0; hh < heads; hh++)
      if (sens_weights(t, ci, hh / t->H, hh % t->H, c->weight + (size_t)hh * d) != 0)
        goto out;
  }
  size_t ws_cap = 0;
  for (uint32_t ci = 0; ci < t->n_ctx; ci++)
    for (uint32_t hh = 0; hh < heads; hh++) {
      kv_calib_head_data hd;
      if (head_probes(t, &t->ctx[ci], hh / t->H, hh % t->H, n, &hd, pq, qpos,
                      pq + (size_t)TR_PROBES * t->grp * d) != 0)
        goto out;
      hd.chan_weight = t->cal[ci].weight + (size_t)hh * d;
      for (size_t o = 0; o < no; o++) {
        kv_calib_opt op = opts[o];
        op.kg = op.kg ? op.kg : (uint16_t)cf->group;
        op.vg = op.vg ? op.vg : (uint16_t)(cf->vgroup ? cf->vgroup : cf->group);
        size_t need = kv_calib_eval_scratch(&hd, &op), b;
        double ls;
        kv_codec_err err;
        if (need > ws_cap) {
          free(ws);
          ws_cap = (ws = malloc(need)) ? need : 0;
          if (ws == NULL) {
            bench_log("out of memory (head plan)");
            goto out;
          }
        }
        if (kv_calib_eval(&hd, &op, ws, ws_cap, &ls, &b, &err) != KV_CODEC_OK) {
          bench_codec_fail("kv_calib_eval", &err);
          goto out;
        }
        loss[(o * t->n_ctx + ci) * heads + hh] = ls;
        bytes[o * heads + hh] = (double)b; /* the same for every context (one shape) */
      }
    }
  double budget = (cf->bits + 0.5) / 8.0 * 2.0 * n * d * heads;
  double *cal = malloc(no * heads * sizeof *cal);
  if (cal == NULL)
    goto out;
  for (uint32_t ci = 0; ci < t->n_ctx; ci++) {
    for (size_t o = 0; o < no; o++)
      for (uint32_t hh = 0; hh < heads; hh++) {
        double s = 0;
        uint32_t k = 0;
        for (uint32_t c = 0; c < t->n_ctx; c++)
          if (c != ci || t->n_ctx == 1) {
            s += loss[(o * t->n_ctx + c) * heads + hh];
            k++;
          }
        cal[o * heads + hh] = s / k;
      }
    kv_calib_plan_choose(cal, bytes, no, heads, budget, pl);
    for (uint32_t hh = 0; hh < heads; hh++) {
      kv_calib_opt op = opts[pl[hh]];
      op.kg = op.kg ? op.kg : (uint16_t)cf->group;
      op.vg = op.vg ? op.vg : (uint16_t)(cf->vgroup ? cf->vgroup : cf->group);
      t->cal[ci].plan[0][hh] = op;
    }
  }
  free(cal);
  rc = 0;
out:
  free(loss);
  free(bytes);
  free(pq);
  free(qpos);
  free(pl);
  free(ws);
  return rc;
}

/* The engine's calibration (kvdb_model_calibrate's computation, compress/calib.c) over the
 * calibration contexts: their f16 K and V and the model's queries at every position. */
static int ecal_head(void *user, uint32_t c, uint32_t l, uint32_t h, void *k, void *v)
{
  truth *t = user;
  memcpy(k, sec_of(t, &t->cal_ctx[c], l, h, 0), (size_t)TR_TOKENS * t->d * 2);
  memcpy(v, sec_of(t, &t->cal_ctx[c], l, h, 1), (size_t)TR_TOKENS * t->d * 2);
  return 0;
}

static int engine_calibrate(truth *t)
{
  const float **q = calloc(t->n_cal, sizeof *q);
  const uint32_t **qp = calloc(t->n_cal, sizeof *qp);
  uint32_t *nt = calloc(t->n_cal, sizeof *nt), *nq = calloc(t->n_cal, sizeof *nq), ident[TR_TOKENS];
  int rc = -1;
  if (!q || !qp || !nt || !nq) {
    bench_log("out of memory (calibration)");
    goto out;
  }
  for (uint32_t i = 0; i < TR_TOKENS; i++)
    ident[i] = i;
  for (uint32_t c = 0; c < t->n_cal; c++) {
    q[c] = t->cal_ctx[c].q;
    qp[c] = ident;
    nt[c] = nq[c] = TR_TOKENS;
  }
  kv_calib_input in = {.n_layers = t->L, .n_heads = t->H, .head_dim = t->d, .n_q_heads = t->QH,
                       .dtype = KV_CODEC_F16, .rope_base = 10000.0f,
                       .rope_style = KV_ROPE_ADJACENT, .n_contexts = t->n_cal, .n_tokens = nt,
                       .q = q, .q_pos = qp, .n_q = nq, .head = ecal_head, .user = t,
                       .plans = 3, .metric = truth_metric()};
  /* experiments (bench/RESULTS.md, wt-cal16): KVDB_TRUTH_CAL_GROUP=N the options' group,
   * KVDB_TRUTH_CAL_PLANS=0 K's weights only (every head 4 / 2 bits, the config's group 128) */
  const char *eg = getenv("KVDB_TRUTH_CAL_GROUP"), *ep = getenv("KVDB_TRUTH_CAL_PLANS");
  if (eg != NULL && atoi(eg) >= 16 && atoi(eg) <= 512)
    in.group = (unsigned)atoi(eg);
  if (ep != NULL && atoi(ep) >= 0 && atoi(ep) <= 3)
    in.plans = (unsigned)atoi(ep);
  kv_codec_err err;
  uint64_t t0 = bench_now_ns();
  if (kv_calib_run(&in, &t->ecal, &err) != KV_CODEC_OK) {
    bench_codec_fail("kv_calib_run", &err);
    goto out;
  }
  t->ecal_secs = (double)(bench_now_ns() - t0) * 1e-9;
  rc = 0;
out:
  free(q);
  free(qp);
  free(nt);
  free(nq);
  return rc;
}

static int int4_targets(truth *t, const tcfg *cf, int4_fig *f)
{
  uint32_t d = t->d, heads = t->L * t->H;
  size_t n_sec = (size_t)t->n_ctx * heads * 2, sec_bytes = (size_t)TR_TOKENS * d * 2;
  size_t cap = n_sec * (sec_bytes + 4096);
  uint8_t *arena = bench_alloc(cap), *out = bench_alloc(n_sec * sec_bytes);
  size_t *off = malloc(n_sec * sizeof *off), *len = malloc(n_sec * sizeof *len);
  double *hq = calloc(heads, sizeof *hq);
  uint16_t *kd = malloc(sec_bytes * 2), *vd = kd ? kd + (size_t)TR_TOKENS * d : NULL;
  void *ctx_mem = malloc(kv_codec_dctx_bytes());
  uint32_t rpos[TR_TOKENS];
  int rc = -1;
  memset(f, 0, sizeof *f);
  if (!arena || !out || !off || !len || !hq || !kd || !ctx_mem) {
    bench_log("out of memory (int4 sections)");
    goto out;
  }
  size_t pos = 0, bytes = 0, s = 0;
  f->worst_any = 1;
  if (cf->perhead && t->cal == NULL && head_plan(t, cf) != 0)
    goto out;
  for (uint32_t ci = 0; ci < t->n_ctx; ci++)
    for (uint32_t l = 0; l < t->L; l++)
      for (uint32_t h = 0; h < t->H; h++) {
        uint32_t rows;
        size_t b, el;
        double q;
        if (codec_head(t, &t->ctx[ci], l, h, TR_TOKENS, cf, kd, vd, rpos, &rows, &b,
                       arena + pos, cap - pos, &el) != 0 ||
            head_quality(t, &t->ctx[ci], l, h, TR_TOKENS, kd, vd, rpos, rows, &q, NULL, NULL) != 0)
          goto out;
        kv_section_info info; /* the K section's length, then V's */
        kv_codec_err err;
        if (kv_section_parse(arena + pos, el, &info, &err) != KV_CODEC_OK) {
          bench_codec_fail("kv_section_parse", &err);
          goto out;
        }
        off[s] = pos;
        len[s] = (size_t)info.section_bytes;
        off[s + 1] = pos + len[s];
        len[s + 1] = el - len[s];
        s += 2;
        pos += el;
        bytes += b;
        f->q += q / ((double)t->n_ctx * heads);
        hq[l * t->H + h] += q / t->n_ctx;
        f->worst_any = q < f->worst_any ? q : f->worst_any;
      }
  f->bpe = 8.0 * (double)bytes / ((double)n_sec * TR_TOKENS * d);
  f->worst_head = 1;
  for (uint32_t i = 0; i < heads; i++)
    if (hq[i] < f->worst_head) {
      f->worst_head = hq[i];
      f->worst_l = i / t->H;
      f->worst_h = i % t->H;
    }
  dec_run r = {arena, off, len, n_sec, sec_bytes, out, NULL, 0,
               kv_codec_dctx_init(ctx_mem, kv_codec_dctx_bytes())};
  kv_section_info i0;
  kv_codec_err e0;
  if (kv_section_parse(arena, len[0], &i0, &e0) != KV_CODEC_OK) {
    bench_codec_fail("kv_section_parse", &e0);
    goto out;
  }
  if (need_scratch(t, kv_section_scratch_bytes(&i0)) != 0)
    goto out;
  r.ws = t->scratch;
  r.ws_cap = t->scratch_cap;
  /* three rounds of (decode, decode without a context, memcpy), interleaved so that the
   * shared machine's load falls on all three alike; each figure the median of its rounds */
  dec_run r0 = r;
  r0.ctx = NULL;
  void *cpy = bench_alloc(n_sec * sec_bytes);
  dec_run rc_ = r;
  rc_.ws = cpy;
  if (cpy == NULL) {
    bench_log("out of memory (memcpy baseline)");
    goto out;
  }
  double g[3][3];
  for (int round = 0; round < 3; round++)
    for (int k = 0; k < 3; k++) {
      bench_samples sm = {0};
      bench_fn_opts o = {k == 0 ? dec_pass : k == 1 ? dec_pass : copy_pass,
                         k == 0 ? (void *)&r : k == 1 ? (void *)&r0 : (void *)&rc_, 3, 0,
                         t->env->quick ? TR_DEC_MIN_NS_QUICK : TR_DEC_MIN_NS_FULL};
      if (bench_fn_run(&o, &sm) != 0) {
        bench_samples_free(&sm);
        bench_free(cpy);
        goto out;
      }
      g[k][round] = bench_gbps(n_sec * sec_bytes, bench_samples_pct(&sm, 50));
      bench_samples_free(&sm);
    }
  bench_free(cpy);
  for (int k = 0; k < 3; k++)
    qsort(g[k], 3, sizeof g[k][0], median3_cmp);
  f->dec_gbps = g[0][1];
  f->dec_unfused_gbps = g[1][1];
  f->memcpy_gbps = g[2][1];
  rc = 0;
out:
  bench_free(arena);
  bench_free(out);
  free(off);
  free(len);
  free(hq);
  free(kd);
  free(ctx_mem);
  return rc;
}

/* ---- the subcommand's part ---- */

/* The figures of one int4/int2 variant as JSON fields prefixed `pre`; `more`: also the worst
 * (context, head) and the decode's memcpy baseline. */
static void int4_json(bench_json *j, const char *pre, const int4_fig *f, int more)
{
  char k[96];
#define I4_JSON(name, v)                                                                          \
  do {                                                                                            \
    snprintf(k, sizeof k, "%s%s", pre, name);                                                     \
    bench_json_num(j, k, v);                                                                      \
  } while (0)
  I4_JSON("bits_per_element", f->bpe);
  I4_JSON("quality", f->q);
  I4_JSON("quality_worst_head", f->worst_head);
  if (more)
    I4_JSON("quality_worst_context_head", f->worst_any);
  I4_JSON("decode_gbps", f->dec_gbps);
  if (more)
    I4_JSON("decode_memcpy_gbps", f->memcpy_gbps);
#undef I4_JSON
}

int bench_truth(const bench_env *env, bench_json *j)
{
  FILE *o = env->out;
  char bin[4200], tokp[4200], textp[4200], why[8500] = "";
  truth t;
  memset(&t, 0, sizeof t);
  t.env = env;
  if (bench_kvset_inputs(env, bin, tokp, textp, sizeof bin, why, sizeof why) != 0) {
    fprintf(o, "\nint4 targets and quality truth: SKIPPED — %s\n", why);
    bench_json_str(j, "quality_truth_skipped", why);
    return 0;
  }
  refmodel_tokenizer *tk = NULL;
  int *toks = NULL, rc = -1, r;
  cres *res = NULL;
  if ((r = refmodel_model_load(bin, &t.m)) != REFMODEL_OK)
    return tfail("loading the model", r);
  const refmodel_config *cf = refmodel_model_config(t.m);
  t.L = (uint32_t)cf->n_layers;
  t.H = (uint32_t)cf->n_kv_heads;
  t.QH = (uint32_t)cf->n_heads;
  t.grp = t.QH / t.H;
  t.d = (uint32_t)cf->head_size;
  t.vocab = (uint32_t)cf->vocab_size;
  t.kv_dim = (uint32_t)cf->kv_dim;
  if (load_gains(&t, bin, cf) != 0)
    goto out;
  t.n_ctx = env->quick ? TR_CTX_QUICK : TR_CTX_FULL;
  t.n_cal = env->quick ? TR_CAL_QUICK : TR_CAL_FULL;
  const char *ncal = getenv("KVDB_TRUTH_CAL_CONTEXTS");
  if (ncal != NULL && atoi(ncal) >= 1 && atoi(ncal) <= 64)
    t.n_cal = (uint32_t)atoi(ncal);
  uint64_t t0 = bench_now_ns();
  if ((r = refmodel_tokenizer_load(tokp, cf->vocab_size, &tk)) != REFMODEL_OK) {
    tfail("loading the tokenizer", r);
    goto out;
  }
  if ((r = refmodel_state_new(t.m, TR_TOKENS, &t.st)) != REFMODEL_OK) {
    tfail("refmodel_state_new", r);
    goto out;
  }
  /* the contexts follow those of the `compress` real set in the corpus (other text) */
  size_t skip = (size_t)(env->quick ? 8 : 64) * (TR_TOKENS - 1);
  /* the engine calibration's contexts follow the measured ones (disjoint text) */
  if (bench_kvset_tokens(tk, textp, skip + (size_t)(t.n_ctx + t.n_cal) * (TR_TOKENS - 1),
                         &toks) != 0)
    goto out;
  t.ctx = calloc(t.n_ctx + t.n_cal, sizeof *t.ctx);
  t.cal_ctx = t.ctx ? t.ctx + t.n_ctx : NULL;
  res = calloc((size_t)t.n_ctx * N_CFG, sizeof *res);
  if (t.ctx == NULL || res == NULL) {
    bench_log("out of memory (contexts)");
    goto out;
  }
  bench_log("quality truth: %u contexts of stories260K (+ %u calibration contexts) ...", t.n_ctx,
            t.n_cal);
  for (uint32_t c = 0; c < t.n_ctx + t.n_cal; c++) {
    tctx *x = &t.ctx[c];
    x->q = malloc((size_t)TR_TOKENS * t.L * t.QH * t.d * sizeof(float));
    x->kv = malloc((size_t)t.L * t.H * 2 * TR_TOKENS * t.d * 2);
    if (x->q == NULL || x->kv == NULL) {
      bench_log("out of memory (context %u)", c);
      goto out;
    }
    x->tok[0] = REFMODEL_TOKEN_BOS;
    memcpy(x->tok + 1, toks + skip + (size_t)c * (TR_TOKENS - 1), (TR_TOKENS - 1) * sizeof(int));
    if (run_context(&t, x) != 0)
      goto out;
  }

  int4_fig f4, fe, fp, fc, f2, f2c;
  bench_log("int4 targets ...");
  if (int4_targets(&t, &CFGS[INT4_CFG], &f4) != 0)
    goto out;
  bench_log("the engine's int4 ...");
  if (int4_targets(&t, &ENGINE_INT4, &fe) != 0 || int4_targets(&t, &ENGINE_INT4_POST, &fp) != 0)
    goto out;
  bench_log("the engine's calibration (%u contexts) and its int4 ...", t.n_cal);
  if (engine_calibrate(&t) != 0 || int4_targets(&t, &ENGINE_INT4_CAL, &fc) != 0 ||
      int4_targets(&t, &ENGINE_INT2, &f2) != 0 || int4_targets(&t, &ENGINE_INT2_CAL, &f2c) != 0)
    goto out;
  bench_log("truth runs: %zu configs x %u contexts ...", N_CFG, t.n_ctx);
  for (uint32_t c = 0; c < t.n_ctx; c++)
    if (truth_context(&t, &t.ctx[c], res + (size_t)c * N_CFG) != 0)
      goto out;

  /* across configs (means over contexts) and within each context, for each config set; the
   * headline fields are those of SET_ENGINE */
  double mq[N_CFG], mqo[N_CFG], ma[N_CFG], mkl[N_CFG], mb[N_CFG], key[N_CFG], x[N_CFG], xo[N_CFG];
  double mac[N_CFG], mqc[N_CFG], xc[N_CFG];
  double sp_cut_ctx_cos[N_SETS] = {0}, sp_cut_model_cos[N_SETS];
  memset(mqc, 0, sizeof mqc);
  memset(mq, 0, sizeof mq);
  memset(mqo, 0, sizeof mqo);
  memset(ma, 0, sizeof ma);
  memset(mkl, 0, sizeof mkl);
  memset(mb, 0, sizeof mb);
  memset(mac, 0, sizeof mac);
  double sp_ctx[N_SETS] = {0}, sp_ctx_old[N_SETS] = {0}, sp_cut_ctx[N_SETS] = {0},
         sp_cut_ctx_old[N_SETS] = {0};
  uint32_t n_sp[N_SETS] = {0}, n_sp_old[N_SETS] = {0};
  for (uint32_t c = 0; c < t.n_ctx; c++) {
    const cres *rc_ = res + (size_t)c * N_CFG;
    for (size_t i = 0; i < N_CFG; i++) {
      mq[i] += rc_[i].q / t.n_ctx;
      mqc[i] += rc_[i].q_cos / t.n_ctx;
      xc[i] = rc_[i].q_cos;
      mqo[i] += rc_[i].q_old / t.n_ctx;
      ma[i] += rc_[i].agree / t.n_ctx;
      mkl[i] += rc_[i].kl / t.n_ctx;
      mb[i] += rc_[i].bytes / t.n_ctx;
      mac[i] += rc_[i].agree_cuts / t.n_ctx;
      key[i] = rc_[i].agree - 1e-3 * fmin(rc_[i].kl, 15.0); /* agreement, ties by KL */
      x[i] = rc_[i].q;
      xo[i] = rc_[i].q_old;
    }
    for (int st = 0; st < N_SETS; st++) {
      double s = spearman_set(x, key, st), so = spearman_set(xo, key, st);
      if (!isnan(s)) {
        sp_ctx[st] += s;
        n_sp[st]++;
      }
      if (!isnan(so)) {
        sp_ctx_old[st] += so;
        n_sp_old[st]++;
      }
    }
    /* the prefix-reuse truth: agreement averaged over the TR_CUTS prefix lengths */
    for (size_t i = 0; i < N_CFG; i++)
      key[i] = rc_[i].agree_cuts - 1e-3 * fmin(rc_[i].kl_cuts, 15.0);
    for (int st = 0; st < N_SETS; st++) {
      sp_cut_ctx[st] += spearman_set(x, key, st) / t.n_ctx;
      sp_cut_ctx_old[st] += spearman_set(xo, key, st) / t.n_ctx;
      sp_cut_ctx_cos[st] += spearman_set(xc, key, st) / t.n_ctx;
    }
  }
  double sp_model[N_SETS], sp_model_old[N_SETS], sp_cut_model[N_SETS], sp_cut_model_old[N_SETS];
  for (int st = 0; st < N_SETS; st++) {
    sp_ctx[st] = n_sp[st] ? sp_ctx[st] / n_sp[st] : NAN;
    sp_ctx_old[st] = n_sp_old[st] ? sp_ctx_old[st] / n_sp_old[st] : NAN;
    sp_model[st] = spearman_set(mq, ma, st);
    sp_model_old[st] = spearman_set(mqo, ma, st);
    sp_cut_model[st] = spearman_set(mq, mac, st);
    sp_cut_model_old[st] = spearman_set(mqo, mac, st);
    sp_cut_model_cos[st] = spearman_set(mqc, mac, st);
  }
  double secs = (double)(bench_now_ns() - t0) * 1e-9;
  for (int vi = 0; vi < (int)TR_NVAR; vi++) { /* experiments */
    double mv[N_CFG], spu[N_SETS] = {0};
    for (size_t i = 0; i < N_CFG; i++)
      mv[i] = 0;
    for (uint32_t c = 0; c < t.n_ctx; c++) {
      const cres *rc_ = res + (size_t)c * N_CFG;
      double kk[N_CFG];
      for (size_t i = 0; i < N_CFG; i++) {
        mv[i] += rc_[i].var[vi] / t.n_ctx;
        x[i] = rc_[i].var[vi];
        kk[i] = rc_[i].agree_cuts - 1e-3 * fmin(rc_[i].kl_cuts, 15.0);
      }
      for (int st = 0; st < N_SETS; st++)
        spu[st] += spearman_set(x, kk, st) / t.n_ctx;
    }
    static const char *const vname[TR_NVAR] = {
        "cosine weighted by keys seen", "1 - pooled rel L2", "cosine, probes in the second half",
        "mean of 1 - per-probe rel error", "norm-aware cosine 1 - |e|^2/(2|o|^2)",
        "1 - per-probe squared rel error", "cosine weighted by output energy, per layer",
        "1 - a layer's pooled |e|^2/(2|o|^2)",
        "output-weighted, W_o's gain per head (the profile's quality)",
        "output-weighted, W_o's gain per channel", "output-weighted, unit gains (no W_o)",
        "output-weighted per head, 1 - r (relative-L2 scale)"};
    fprintf(o, "  metric variant %s, vs the 4-prefix truth (across / per context): the engine's "
               "space %.4f / %.4f, the research set %.4f / %.4f, all %.4f / %.4f; the targets' "
               "int4 (%s) scores %.5f under it (the metric: %.5f)\n",
            vname[vi], spearman_set(mv, mac, SET_ENGINE), spu[SET_ENGINE],
            spearman_set(mv, mac, SET_RESEARCH), spu[SET_RESEARCH], spearman_set(mv, mac, SET_ALL),
            spu[SET_ALL], CFGS[INT4_CFG].name, mv[INT4_CFG], mq[INT4_CFG]);
  }

  fprintf(o, "\nint4 (kvquant, codec 5 with per-channel widths: K before RoPE, K and V per channel "
             "in groups of 256 tokens, V clipped, widths by least error (K's weighted by calibration "
             "queries), K and V bits per head from calibration contexts, 4.5 bits per element in all) "
             "on %u stories260K contexts x %u layers x %u KV heads, sections of %u tokens x %u:\n",
          t.n_ctx, t.L, t.H, TR_TOKENS, t.d);
  fprintf(o, "  bits per element %.4f (target <= %.1f: %s)\n", f4.bpe, T_INT4_BPE,
          bench_met(f4.bpe <= T_INT4_BPE));
  fprintf(o, "  quality, causal metric, the model's queries at %u spread positions: mean %.5f "
             "(>= %.2f: %s); worst head (layer %u, KV head %u, over contexts) %.5f (>= %.2f: %s); "
             "worst single (context, head) %.5f\n",
          TR_PROBES, f4.q, T_INT4_Q, bench_met(f4.q >= T_INT4_Q), f4.worst_l, f4.worst_h,
          f4.worst_head, T_INT4_WORST, bench_met(f4.worst_head >= T_INT4_WORST), f4.worst_any);
  fprintf(o, "  decode %.3f GB/s of f16, one core (>= %.0f: %s); without a decoding context "
             "(K rotated in a second pass, angles from libm per group) %.3f; memcpy of the same "
             "bytes %.3f (decode / memcpy %.3f); medians of 3 interleaved rounds\n",
          f4.dec_gbps, T_INT4_DEC, bench_met(f4.dec_gbps >= T_INT4_DEC), f4.dec_unfused_gbps,
          f4.memcpy_gbps, bench_ratio(f4.dec_gbps, f4.memcpy_gbps));
  for (int e = 0; e < 2; e++) {
    const int4_fig *ef = e ? &fp : &fe;
    fprintf(o, "  the engine's int4 (kvquant g128, no residual, no calibration; K %s RoPE): bits "
               "per element %.4f, quality %.5f, worst head (layer %u, KV head %u) %.5f, worst "
               "(context, head) %.5f, decode %.3f GB/s (memcpy %.3f)\n",
            e ? "after" : "before", ef->bpe, ef->q, ef->worst_l, ef->worst_h, ef->worst_head,
            ef->worst_any, ef->dec_gbps, ef->memcpy_gbps);
  }
  fprintf(o, "  the engine's int4 of a calibrated model (kvdb_model_calibrate on %u other contexts, "
             "%.1f s: K weighted, widths per channel, K and V bits and groups per head, budget "
             "4.5): bits per element %.4f (<= %.1f: %s), quality %.5f (>= %.2f: %s), worst head "
             "(layer %u, KV head %u) %.5f (>= %.2f: %s), worst (context, head) %.5f, decode %.3f "
             "GB/s (>= %.0f: %s; memcpy %.3f)\n",
          t.n_cal, t.ecal_secs, fc.bpe, T_INT4_BPE, bench_met(fc.bpe <= T_INT4_BPE), fc.q,
          T_INT4_Q, bench_met(fc.q >= T_INT4_Q), fc.worst_l, fc.worst_h, fc.worst_head,
          T_INT4_WORST, bench_met(fc.worst_head >= T_INT4_WORST), fc.worst_any, fc.dec_gbps,
          T_INT4_DEC, bench_met(fc.dec_gbps >= T_INT4_DEC), fc.memcpy_gbps);
  for (int e = 0; e < 2; e++) {
    const int4_fig *ef = e ? &f2c : &f2;
    fprintf(o, "  the engine's int2 (%s): bits per element %.4f, quality %.5f, worst head (layer "
               "%u, KV head %u) %.5f, worst (context, head) %.5f, decode %.3f GB/s (memcpy "
               "%.3f)\n",
            e ? "calibrated as above, budget 2.5" : "kvquant g128, K before RoPE, no calibration",
            ef->bpe, ef->q, ef->worst_l, ef->worst_h, ef->worst_head, ef->worst_any, ef->dec_gbps,
            ef->memcpy_gbps);
  }
  fprintf(o, "\nquality truth: each context stores its first %u tokens in a config, the model "
             "continues over the next %u (teacher-forced), against the same on raw f16 KV; %u "
             "contexts, %.1f s\n",
          TR_STORED, TR_STEPS, t.n_ctx, secs);
  fprintf(o, "  %-24s %8s %9s %9s %9s %9s %9s %11s\n", "config", "bits/el", "quality",
          "cosine", "old q", "agree", "KL", "agree cuts");
  for (size_t i = 0; i < N_CFG; i++)
    fprintf(o, "  %-24s %8.3f %9.5f %9.5f %9.5f %9.4f %9.5f %11.4f\n", CFGS[i].name,
            8.0 * mb[i] / ((double)t.L * t.H * 2 * TR_STORED * t.d), mq[i], mqc[i], mqo[i],
            ma[i], mkl[i], mac[i]);
  static const char *const setname[N_SETS] = {
      "the engine's profile space (raw, lossless, int8, int4, int2, knorm/keydiff/snapkv 90..30 "
      "as a put encodes them; the targets' figures)",
      "the research set (the first 22 rows: legacy KIVI int4/int2, the bench's int4 designs)",
      "all rows"};
  for (int st = 0; st < N_SETS; st++) {
    fprintf(o, "  Spearman over %s:\n", setname[st]);
    fprintf(o, "    profiled quality vs agreement averaged over continuations after %u prefix "
               "lengths (%u..%u tokens of the stored context): across configs %.4f (>= %.2f: "
               "%s), within a context (mean) %.4f (>= %.1f: %s); the old metric (last %u "
               "positions' queries, no causal mask): %.4f and %.4f\n",
            TR_CUTS, TR_STORED / TR_CUTS, TR_STORED, sp_cut_model[st], T_SPEARMAN_MODEL,
            bench_met(sp_cut_model[st] >= T_SPEARMAN_MODEL), sp_cut_ctx[st], T_SPEARMAN_CTX,
            bench_met(sp_cut_ctx[st] >= T_SPEARMAN_CTX), TR_WIN, sp_cut_model_old[st],
            sp_cut_ctx_old[st]);
    fprintf(o, "    the per-head cosine mean instead of the output-weighted quality: %.4f and "
               "%.4f\n", sp_cut_model_cos[st], sp_cut_ctx_cos[st]);
    fprintf(o, "    the same after the whole stored context only (end): across configs %.4f, "
               "within a context %.4f; the old metric %.4f and %.4f\n",
            sp_model[st], sp_ctx[st], sp_model_old[st], sp_ctx_old[st]);
  }

  bench_json_num(j, "int4_bits_per_element", f4.bpe);
  bench_json_num(j, "int4_quality", f4.q);
  bench_json_num(j, "int4_quality_worst_head", f4.worst_head);
  bench_json_num(j, "int4_quality_worst_context_head", f4.worst_any);
  bench_json_num(j, "int4_decode_gbps", f4.dec_gbps);
  bench_json_num(j, "int4_decode_unfused_gbps", f4.dec_unfused_gbps);
  bench_json_num(j, "int4_decode_memcpy_gbps", f4.memcpy_gbps);
  int4_json(j, "engine_int4_", &fe, 0);
  int4_json(j, "engine_int4_postrope_", &fp, 0);
  int4_json(j, "engine_int4_calibrated_", &fc, 1);
  int4_json(j, "engine_int2_", &f2, 0);
  int4_json(j, "engine_int2_calibrated_", &f2c, 0);
  bench_json_int(j, "engine_int4_calibration_contexts", t.n_cal);
  bench_json_num(j, "engine_int4_calibration_seconds", t.ecal_secs);
  static const char *const setsuf[N_SETS] = {"", "_research_set", "_all_configs"};
  for (int st = 0; st < N_SETS; st++) {
    char k[96];
#define TR_JSON(name, v)                                                                          \
  do {                                                                                            \
    snprintf(k, sizeof k, "%s%s", name, setsuf[st]);                                              \
    bench_json_num(j, k, v);                                                                      \
  } while (0)
    TR_JSON("quality_spearman_vs_model", sp_cut_model[st]);
    TR_JSON("quality_spearman_per_context", sp_cut_ctx[st]);
    TR_JSON("quality_spearman_vs_model_cosine", sp_cut_model_cos[st]);
    TR_JSON("quality_spearman_per_context_cosine", sp_cut_ctx_cos[st]);
    TR_JSON("quality_spearman_vs_model_old_metric", sp_cut_model_old[st]);
    TR_JSON("quality_spearman_per_context_old_metric", sp_cut_ctx_old[st]);
    TR_JSON("quality_spearman_vs_model_end", sp_model[st]);
    TR_JSON("quality_spearman_per_context_end", sp_ctx[st]);
    TR_JSON("quality_spearman_vs_model_end_old_metric", sp_model_old[st]);
    TR_JSON("quality_spearman_per_context_end_old_metric", sp_ctx_old[st]);
#undef TR_JSON
  }
  bench_json_int(j, "quality_truth_contexts", t.n_ctx);
  bench_json_int(j, "quality_truth_configs", (int64_t)N_CFG);
  for (size_t i = 0; i < N_CFG; i++) {
    char k[96], nm[48];
    size_t n = 0;
    for (const char *p = CFGS[i].name; *p && n + 1 < sizeof nm; p++)
      nm[n++] = (*p >= 'a' && *p <= 'z') || (*p >= '0' && *p <= '9') ? *p : '_';
    nm[n] = 0;
    snprintf(k, sizeof k, "truth_%s_agreement", nm);
    bench_json_num(j, k, ma[i]);
    snprintf(k, sizeof k, "truth_%s_kl", nm);
    bench_json_num(j, k, mkl[i]);
    snprintf(k, sizeof k, "truth_%s_quality", nm);
    bench_json_num(j, k, mq[i]);
    snprintf(k, sizeof k, "truth_%s_quality_cosine", nm);
    bench_json_num(j, k, mqc[i]);
  }
  rc = 0;
out:
  for (uint32_t c = 0; t.ctx != NULL && c < t.n_ctx + t.n_cal; c++) {
    free(t.ctx[c].q);
    free(t.ctx[c].kv);
  }
  free(t.ctx);
  free(t.q2);
  for (uint32_t gi = 0; gi < TR_NGAIN; gi++)
    free(t.gain[gi]);
  free(t.gacc);
  for (uint32_t c = 0; t.cal != NULL && c < t.n_ctx; c++)
    kv_calib_free(&t.cal[c]);
  free(t.cal);
  kv_calib_free(&t.ecal);
  free(res);
  free(toks);
  free(t.scratch);
  refmodel_state_free(t.st);
  refmodel_tokenizer_free(tk);
  refmodel_model_free(t.m);
  return rc;
}
