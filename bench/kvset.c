/* SPDX-License-Identifier: MIT */
/*
 * bench/kvset.c — the real and synthetic KV sets of `kvdb-bench compress` and `policy`
 * (kvset.h).
 */
#define _GNU_SOURCE
#include "kvset.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codec.h"
#include "datagen.h"
#include "refmodel.h"

#ifndef BENCH_MODEL_DIR
#define BENCH_MODEL_DIR "../shared/models"
#endif
#ifndef BENCH_CORPUS_DIR
#define BENCH_CORPUS_DIR "../shared/corpora"
#endif

#define SYN_VOCAB 128256u /* Llama 3's: the synthetic set's token ids */

int bench_scratch_need(bench_scratch *s, size_t n)
{
  if (n <= s->cap)
    return 0;
  bench_free(s->p);
  s->p = bench_alloc(n);
  s->cap = s->p ? n : 0;
  if (s->p == NULL) {
    bench_log("out of memory (%zu bytes of scratch)", n);
    return -1;
  }
  return 0;
}

void bench_scratch_free(bench_scratch *s)
{
  bench_free(s->p);
  s->p = NULL;
  s->cap = 0;
}

void bench_kvset_free(bench_kvset *s)
{
  bench_free(s->kv);
  free(s->queries);
  free(s->probes);
  free(s->n_probes);
  free(s->ref);
  free(s->dprobes);
  free(s->n_dprobes);
  free(s->dref);
  free(s->win);
  free(s->kwin);
  memset(s, 0, sizeof *s);
}

void bench_keys_as_queries(const uint16_t *k, uint32_t rows, uint32_t d, float *q)
{
  kv_codec_to_f32(KV_CODEC_F16, k, (size_t)rows * d, q);
  for (uint32_t r = 0; r < rows; r++) {
    float *x = q + (size_t)r * d;
    double ss = 0;
    for (uint32_t j = 0; j < d; j++)
      ss += (double)x[j] * x[j];
    if (ss > 0) {
      float f = (float)sqrt((double)d / ss);
      for (uint32_t j = 0; j < d; j++)
        x[j] *= f;
    }
  }
}

int bench_codec_fail(const char *what, const kv_codec_err *err)
{
  char msg[512];
  kv_codec_errmsg(err, msg, sizeof msg);
  bench_log("%s: %s", what, msg);
  return -1;
}

/* ---- probes --------------------------------------------------------------------------------- */

/* Probes derived from head h's K (kv_quality_derive_probes) into pr, and the original
 * attention outputs for them into ref. */
static int derive_and_attend(const bench_kvset *s, bench_scratch *ws, uint32_t h, float *pr,
                             uint32_t *np, float *ref)
{
  kv_section_shape ks = {KV_CODEC_F16, KV_SECTION_K, s->n_tokens, s->head_dim};
  kv_codec_err err;
  const uint8_t *k = bench_kvset_sec(s, s->kv, 2 * (size_t)h), *v = k + s->sec_bytes;
  if (kv_quality_derive_probes(&ks, k, s->sec_bytes, pr, KV_QUALITY_MAX_DERIVED, np, &err) !=
      KV_CODEC_OK)
    return bench_codec_fail("kv_quality_derive_probes", &err);
  if (kv_quality_attend(KV_CODEC_F16, s->n_tokens, s->head_dim, k, v, pr, *np, ws->p, ws->cap,
                        ref, &err) != KV_CODEC_OK)
    return bench_codec_fail("kv_quality_attend", &err);
  return 0;
}

int bench_kvset_prepare(bench_kvset *s, bench_scratch *ws)
{
  uint32_t d = s->head_dim, nh = s->n_heads;
  uint32_t grp = s->queries != NULL ? s->n_q_heads / s->n_kv_heads : 1;
  s->max_probes = s->queries != NULL ? BENCH_KVSET_REAL_OBS * grp : KV_QUALITY_MAX_DERIVED;
  s->win_obs = s->queries != NULL ? BENCH_KVSET_REAL_OBS : BENCH_KVSET_SNAP_OBS;
  s->win_qh = grp;
  size_t row = (size_t)d * sizeof(float), per = (size_t)s->max_probes * row;
  s->probes = malloc(nh * per);
  s->ref = malloc(nh * per);
  s->n_probes = malloc(nh * sizeof(uint32_t));
  s->win = malloc(nh * (size_t)s->win_obs * s->win_qh * row);
  int ok = s->probes && s->ref && s->n_probes && s->win;
  if (ok && s->queries != NULL) {
    s->dprobes = malloc(nh * (size_t)KV_QUALITY_MAX_DERIVED * row);
    s->dref = malloc(nh * (size_t)KV_QUALITY_MAX_DERIVED * row);
    s->n_dprobes = malloc(nh * sizeof(uint32_t));
    s->kwin = malloc(nh * (size_t)BENCH_KVSET_SNAP_OBS * row);
    ok = s->dprobes && s->dref && s->n_dprobes && s->kwin;
  }
  if (!ok) {
    bench_log("out of memory preparing the %s set", s->name);
    return -1;
  }
  uint32_t most = s->max_probes > KV_QUALITY_MAX_DERIVED ? s->max_probes : KV_QUALITY_MAX_DERIVED;
  if (bench_scratch_need(ws, kv_quality_attend_scratch_bytes(s->n_tokens, d, most)) != 0)
    return -1;
  kv_codec_err err;
  for (uint32_t h = 0; h < nh; h++) {
    float *pr = s->probes + (size_t)h * s->max_probes * d;
    float *ref = s->ref + (size_t)h * s->max_probes * d;
    float *win = s->win + (size_t)h * s->win_obs * s->win_qh * d;
    const uint8_t *k = bench_kvset_sec(s, s->kv, 2 * (size_t)h), *v = k + s->sec_bytes;
    const uint16_t *last =
        (const uint16_t *)(const void *)k + (size_t)(s->n_tokens - BENCH_KVSET_SNAP_OBS) * d;
    if (s->queries == NULL) {
      if (derive_and_attend(s, ws, h, pr, &s->n_probes[h], ref) != 0)
        return -1;
      bench_keys_as_queries(last, BENCH_KVSET_SNAP_OBS, d, win);
      continue;
    }
    bench_keys_as_queries(last, BENCH_KVSET_SNAP_OBS, d,
                          s->kwin + (size_t)h * BENCH_KVSET_SNAP_OBS * d);
    /* head h = (context c, layer l, KV head g), as bench_kvset_real lays the sections out */
    uint32_t g = h % s->n_kv_heads, l = (h / s->n_kv_heads) % s->n_layers;
    uint32_t c = h / (s->n_kv_heads * s->n_layers), np = 0;
    for (uint32_t o = 0; o < BENCH_KVSET_REAL_OBS; o++)
      for (uint32_t j = 0; j < grp; j++, np++)
        memcpy(pr + (size_t)np * d,
               s->queries + ((((size_t)c * BENCH_KVSET_REAL_OBS + o) * s->n_layers + l) *
                                 s->n_q_heads + (size_t)g * grp + j) * d,
               row);
    s->n_probes[h] = np;
    memcpy(win, pr, (size_t)np * row);
    if (kv_quality_attend(KV_CODEC_F16, s->n_tokens, d, k, v, pr, np, ws->p, ws->cap, ref, &err) !=
        KV_CODEC_OK)
      return bench_codec_fail("kv_quality_attend", &err);
    if (derive_and_attend(s, ws, h, s->dprobes + (size_t)h * KV_QUALITY_MAX_DERIVED * d,
                          &s->n_dprobes[h], s->dref + (size_t)h * KV_QUALITY_MAX_DERIVED * d) != 0)
      return -1;
  }
  return 0;
}

/* ---- the synthetic set ---------------------------------------------------------------------- */

int bench_kvset_synthetic(bench_kvset *s, const bench_env *env, uint32_t layers)
{
  uint32_t L = layers, H = BENCH_KVSET_SYN_HEADS, d = BENCH_KVSET_SYN_HEAD_DIM;
  uint32_t n = BENCH_KVSET_SYN_TOKENS;
  memset(s, 0, sizeof *s);
  s->name = "synthetic";
  s->prefix = "synthetic_";
  s->n_ctx = 1;
  s->heads_per_ctx = s->n_heads = L * H;
  s->n_layers = L;
  s->n_kv_heads = H;
  s->n_tokens = n;
  s->head_dim = d;
  s->sec_bytes = (size_t)n * d * 2;
  s->total = 2 * (size_t)s->n_heads * s->sec_bytes;
  dg_kv_model m;
  if (dg_kv_model_init(&m, L, H, d, env->seed) != 0)
    return -1;
  uint32_t *tok = malloc(n * sizeof *tok);
  uint16_t *lkthd = malloc(s->total);
  s->kv = bench_alloc(s->total);
  if (tok != NULL)
    dg_tokens(tok, n, env->seed, SYN_VOCAB);
  if (tok == NULL || lkthd == NULL || s->kv == NULL || dg_kv_fill_f16(&m, tok, n, lkthd) != 0) {
    bench_log("out of memory generating synthetic KV (%zu bytes)", s->total);
    free(tok);
    free(lkthd);
    dg_kv_model_free(&m);
    bench_kvset_free(s);
    return -1;
  }
  /* [layer][K,V][token][head][dim] -> head (layer, head): K section, V section */
  for (uint32_t l = 0; l < L; l++)
    for (uint32_t h = 0; h < H; h++)
      for (uint32_t kv = 0; kv < 2; kv++) {
        uint16_t *dst = s->kv + ((size_t)(l * H + h) * 2 + kv) * n * d;
        for (uint32_t t = 0; t < n; t++)
          memcpy(dst + (size_t)t * d, lkthd + ((((size_t)l * 2 + kv) * n + t) * H + h) * d, 2 * d);
      }
  free(tok);
  free(lkthd);
  dg_kv_model_free(&m);
  snprintf(s->desc, sizeof s->desc,
           "datagen.c, Llama-3-8B shape: 1 context x %u tokens, %u layers x %u KV heads x "
           "head_dim %u, f16 (4 outlier key channels per head, seed %llu)",
           n, L, H, d, (unsigned long long)env->seed);
  return 0;
}

/* ---- the real set --------------------------------------------------------------------------- */

/* Read a whole (small) file. NULL on failure. */
static char *slurp(const char *path, size_t *len)
{
  FILE *f = fopen(path, "rb");
  if (f == NULL)
    return NULL;
  char *b = NULL;
  if (fseek(f, 0, SEEK_END) == 0) {
    long n = ftell(f);
    if (n >= 0 && fseek(f, 0, SEEK_SET) == 0 && (b = malloc((size_t)n + 1)) != NULL) {
      if (fread(b, 1, (size_t)n, f) != (size_t)n) {
        free(b);
        b = NULL;
      } else {
        *len = (size_t)n;
      }
    }
  }
  fclose(f);
  return b;
}

/* The model and the corpus (kvset.h bench_kvset_real). `looked` lists every path tried. */
static int find_inputs(const bench_env *env, char *bin, char *tok, char *text, size_t cap,
                       char *looked, size_t looked_cap)
{
  const char *md = env->model_dir ? env->model_dir : getenv("KVDB_MODEL_DIR");
  if (md == NULL || md[0] == 0)
    md = BENCH_MODEL_DIR;
  snprintf(bin, cap, "%.4000s/stories260K/stories260K.bin", md);
  snprintf(tok, cap, "%.4000s/stories260K/tok512.bin", md);
  if (!bench_file_exists(bin) || !bench_file_exists(tok)) {
    snprintf(looked, looked_cap, "model not found: looked for %.2000s and %.2000s", bin, tok);
    return -1;
  }
  const char *env_c = getenv("KVDB_CORPUS_DIR");
  char cand[3][4096];
  int nc = 0;
  if (env_c != NULL && env_c[0] != 0)
    snprintf(cand[nc++], sizeof cand[0], "%s", env_c);
  snprintf(cand[nc++], sizeof cand[0], "%.4000s/../corpora", md);
  snprintf(cand[nc++], sizeof cand[0], "%s", BENCH_CORPUS_DIR);
  size_t used = (size_t)snprintf(looked, looked_cap, "corpus not found: looked for");
  for (int i = 0; i < nc; i++) {
    snprintf(text, cap, "%.4000s/tinystories/tinystories_validation_head.txt", cand[i]);
    if (bench_file_exists(text))
      return 0;
    if (used < looked_cap)
      used += (size_t)snprintf(looked + used, looked_cap - used, "%s %.4100s", i ? "," : "", text);
  }
  return -1;
}

static int rfail(const char *what, int rc)
{
  bench_log("%s: %s: %s", what, refmodel_strerror(rc), refmodel_errmsg());
  return -1;
}

/* Tokens of the corpus, at least `need`. */
static int corpus_tokens(const refmodel_tokenizer *tk, const char *textp, size_t need, int **out)
{
  size_t len = 0, n_tok = 0;
  int *toks = NULL, r;
  char *text = slurp(textp, &len);
  if (text == NULL) {
    bench_log("cannot read '%s': %s", textp, strerror(errno));
    return -1;
  }
  /* ~2.1 bytes per token in this corpus: encode 4 bytes per token needed, all if too few */
  size_t take = need * 4 < len ? need * 4 : len;
  for (;;) {
    free(toks);
    toks = malloc(refmodel_encode_bound(take) * sizeof *toks);
    if (toks == NULL) {
      bench_log("out of memory (tokens)");
      break;
    }
    if ((r = refmodel_encode(tk, text, take, 0, toks, refmodel_encode_bound(take), &n_tok)) !=
        REFMODEL_OK) {
      rfail("tokenizing the corpus", r);
      free(toks);
      toks = NULL;
      break;
    }
    if (n_tok > need || take == len)
      break;
    take = len;
  }
  free(text);
  if (toks != NULL && n_tok < need) {
    bench_log("the corpus has %zu tokens, %zu needed", n_tok, need);
    free(toks);
    toks = NULL;
  }
  *out = toks;
  return toks != NULL ? 0 : -1;
}

/* Context c of the set: its KV and its last positions' queries, from a prefill of the first
 * n - REAL_OBS tokens and steps of the last ones (the queries a caller of kvdb_put_ex gives). */
static int real_context(bench_kvset *s, refmodel_state *st, const refmodel_config *cf,
                        const int *ctx, uint32_t c)
{
  uint32_t n = s->n_tokens, L = s->n_layers, H = s->n_kv_heads, d = s->head_dim;
  size_t q_step = (size_t)L * s->n_q_heads * d; /* floats of one position's queries */
  int r;
  if ((r = refmodel_prefill(st, ctx, (int)(n - BENCH_KVSET_REAL_OBS), 0, NULL)) != REFMODEL_OK)
    return rfail("refmodel_prefill", r);
  for (uint32_t o = 0; o < BENCH_KVSET_REAL_OBS; o++) {
    uint32_t t = n - BENCH_KVSET_REAL_OBS + o;
    if ((r = refmodel_forward(st, ctx[t], (int)t, NULL)) != REFMODEL_OK)
      return rfail("refmodel_forward", r);
    float *qo = s->queries + ((size_t)c * BENCH_KVSET_REAL_OBS + o) * q_step;
    for (uint32_t l = 0; l < L; l++) {
      const float *q = refmodel_state_query(st, (int)l);
      if (q == NULL)
        return rfail("refmodel_state_query", REFMODEL_EINVAL);
      memcpy(qo + (size_t)l * s->n_q_heads * d, q, (size_t)s->n_q_heads * d * sizeof(float));
    }
  }
  for (uint32_t l = 0; l < L; l++) {
    const float *kb = refmodel_state_key(st, (int)l, 0);
    const float *vb = refmodel_state_value(st, (int)l, 0);
    for (uint32_t h = 0; h < H; h++)
      for (uint32_t kv = 0; kv < 2; kv++) {
        const float *src = (kv == 0 ? kb : vb) + (size_t)h * d;
        uint16_t *dst = s->kv + (((size_t)(c * L + l) * H + h) * 2 + kv) * n * d;
        for (uint32_t t = 0; t < n; t++)
          kv_codec_from_f32(KV_CODEC_F16, src + (size_t)t * (size_t)cf->kv_dim, d,
                            dst + (size_t)t * d);
      }
  }
  return 0;
}

int bench_kvset_real(bench_kvset *s, const bench_env *env, uint32_t n_ctx, char *why,
                     size_t why_cap)
{
  char bin[4200], tokp[4200], textp[4200];
  memset(s, 0, sizeof *s);
  s->name = "real";
  s->prefix = "";
  if (find_inputs(env, bin, tokp, textp, sizeof bin, why, why_cap) != 0)
    return 1;
  refmodel_model *m = NULL;
  refmodel_tokenizer *tk = NULL;
  refmodel_state *st = NULL;
  int *toks = NULL, *ctx = NULL, rc = -1, r;
  if ((r = refmodel_model_load(bin, &m)) != REFMODEL_OK)
    return rfail("loading the model", r);
  const refmodel_config *cf = refmodel_model_config(m);
  uint32_t n = BENCH_KVSET_REAL_TOKENS;
  uint32_t L = (uint32_t)cf->n_layers, H = (uint32_t)cf->n_kv_heads, d = (uint32_t)cf->head_size;
  if ((r = refmodel_tokenizer_load(tokp, cf->vocab_size, &tk)) != REFMODEL_OK) {
    rfail("loading the tokenizer", r);
    goto out;
  }
  if (corpus_tokens(tk, textp, (size_t)n_ctx * (n - 1), &toks) != 0)
    goto out;
  s->n_ctx = n_ctx;
  s->heads_per_ctx = L * H;
  s->n_heads = n_ctx * L * H;
  s->n_tokens = n;
  s->head_dim = d;
  s->sec_bytes = (size_t)n * d * 2;
  s->total = 2 * (size_t)s->n_heads * s->sec_bytes;
  s->n_layers = L;
  s->n_kv_heads = H;
  s->n_q_heads = (uint32_t)cf->n_heads;
  s->kv = bench_alloc(s->total);
  s->queries = malloc((size_t)n_ctx * BENCH_KVSET_REAL_OBS * L * s->n_q_heads * d * sizeof(float));
  ctx = malloc(n * sizeof *ctx);
  if (s->kv == NULL || s->queries == NULL || ctx == NULL) {
    bench_log("out of memory (%zu bytes of real KV)", s->total);
    goto out;
  }
  if ((r = refmodel_state_new(m, (int)n, &st)) != REFMODEL_OK) {
    rfail("refmodel_state_new", r);
    goto out;
  }
  for (uint32_t c = 0; c < n_ctx; c++) {
    ctx[0] = REFMODEL_TOKEN_BOS;
    memcpy(ctx + 1, toks + (size_t)c * (n - 1), (n - 1) * sizeof *ctx);
    if (real_context(s, st, cf, ctx, c) != 0)
      goto out;
  }
  snprintf(s->desc, sizeof s->desc,
           "stories260K (refmodel, float32 forward pass, K after RoPE, rounded to f16) over "
           "TinyStories: %u contexts x %u tokens (BOS + consecutive text windows), %u layers x "
           "%u KV heads x head_dim %u; the queries of each context's last %u positions (%u query "
           "heads) captured as quality probes and SnapKV window",
           n_ctx, n, L, H, d, BENCH_KVSET_REAL_OBS, s->n_q_heads);
  rc = 0;
out:
  refmodel_state_free(st);
  refmodel_tokenizer_free(tk);
  refmodel_model_free(m);
  free(toks);
  free(ctx);
  if (rc != 0)
    bench_kvset_free(s);
  return rc;
}

/* ---- the inputs for other measurements on the reference model (bench_truth.c) ---- */

int bench_kvset_inputs(const bench_env *env, char *bin, char *tok, char *text, size_t cap,
                       char *looked, size_t looked_cap)
{
  return find_inputs(env, bin, tok, text, cap, looked, looked_cap);
}

int bench_kvset_tokens(const refmodel_tokenizer *tk, const char *textp, size_t need, int **out)
{
  return corpus_tokens(tk, textp, need, out);
}
