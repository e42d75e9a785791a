/* SPDX-License-Identifier: MIT */
/*
 * bench/kvset.h — the KV data sets `kvdb-bench compress` and `kvdb-bench policy` measure codecs
 * and quality profiles on, built once here for both.
 *
 * A set is a list of heads; head h is one (context, layer, KV head) and owns two sections of
 * compress/'s SECTION layout (codec.h), K at 2h and V at 2h + 1, each n_tokens rows of head_dim
 * f16 elements:
 *   real       the stories260K model (tools/refmodel, float32 forward pass) over windows of
 *              TinyStories text: each context is BOS + the next 511 tokens of the text at
 *              positions 0..511 (the model's seq_len): the first 496 prefilled, the last
 *              BENCH_KVSET_REAL_OBS = 16 fed one by one to capture their queries
 *              (refmodel_state_query: every layer, all query heads, after RoPE). K (after RoPE)
 *              and V of every layer and KV head, rounded to f16; heads context-major, then
 *              layer, then KV head.
 *   synthetic  Llama-3-8B-shaped KV from datagen.c (layers x 8 KV heads x head_dim 128, four
 *              outlier key channels per head), one context of 1024 tokens. No queries.
 *
 * bench_kvset_prepare then computes per head what quality and SnapKV need, as the engine takes
 * them (engine/ops/profile.c, engine/block/cblock.c): the probes (the real set: for KV head g every query
 * head g*grp .. g*grp + grp - 1 of every captured position, position-major; the synthetic set:
 * derived from K by kv_quality_derive_probes, the engine's fallback) and the original attention
 * outputs for them; on the real set also the derived probes beside the real ones; SnapKV's
 * observation window (the real set: the captured queries; the synthetic set, and `kwin` beside
 * the real queries: the last BENCH_KVSET_SNAP_OBS keys scaled to norm sqrt(head_dim)).
 */
#ifndef KVDB_BENCH_KVSET_H
#define KVDB_BENCH_KVSET_H

#include <stddef.h>
#include <stdint.h>

#include "bench.h"
#include "codec.h"

#define BENCH_KVSET_REAL_TOKENS 512u /* tokens per real context (stories260K's seq_len) */
#define BENCH_KVSET_REAL_OBS 16u     /* a real context's last positions whose queries are kept */
#define BENCH_KVSET_SYN_TOKENS 1024u /* tokens of the synthetic context */
#define BENCH_KVSET_SYN_HEADS 8u
#define BENCH_KVSET_SYN_HEAD_DIM 128u
#define BENCH_KVSET_SNAP_OBS 32u     /* keys standing in for SnapKV's queries */

typedef struct bench_kvset {
  const char *name;      /* "real" / "synthetic" */
  const char *prefix;    /* JSON key prefix of `compress`: "" / "synthetic_" */
  char desc[512];        /* one line: what the set is */
  uint32_t n_ctx;        /* contexts */
  uint32_t heads_per_ctx;/* layers x KV heads */
  uint32_t n_heads;      /* n_ctx x heads_per_ctx; sections = 2 * n_heads */
  uint32_t n_tokens, head_dim;
  size_t sec_bytes;      /* n_tokens * head_dim * 2 */
  size_t total;          /* 2 * n_heads * sec_bytes */
  uint16_t *kv;          /* head h: K section at 2h, V section at 2h + 1 (bench_alloc) */
  /* the real set's queries as captured: [n_ctx][REAL_OBS][n_layers][n_q_heads][d]; NULL for
   * the synthetic set */
  float *queries;
  uint32_t n_layers, n_kv_heads, n_q_heads;
  /* per head, from bench_kvset_prepare */
  uint32_t max_probes;   /* rows per head of probes and ref */
  float *probes;         /* [n_heads][max_probes][d]: real queries, else derived from K */
  uint32_t *n_probes;    /* [n_heads] */
  float *ref;            /* [n_heads][max_probes][d]: attention outputs over the original KV */
  float *dprobes;        /* real set: [n_heads][KV_QUALITY_MAX_DERIVED][d] from K; else NULL */
  uint32_t *n_dprobes;   /* [n_heads] */
  float *dref;           /* [n_heads][KV_QUALITY_MAX_DERIVED][d] */
  uint32_t win_obs, win_qh; /* SnapKV window: observed positions x query heads per KV head */
  float *win;            /* [n_heads][win_obs][win_qh][d] */
  float *kwin;           /* real set: [n_heads][SNAP_OBS][d], the keys as queries; else NULL */
} bench_kvset;

/* Growable scratch (bench_alloc'd; grown outside timed regions only). */
typedef struct bench_scratch {
  void *p;
  size_t cap;
} bench_scratch;

/* At least n bytes in s (old contents are dropped). 0, or -1 logged. */
int bench_scratch_need(bench_scratch *s, size_t n);
void bench_scratch_free(bench_scratch *s);

/* Section sec of a set's layout starting at base (the set's kv, or a decoded copy of it). */
static inline const uint8_t *bench_kvset_sec(const bench_kvset *s, const void *base, size_t sec)
{
  return (const uint8_t *)base + sec * s->sec_bytes;
}

/* The synthetic set with `layers` layers (seed env->seed). 0, or -1 logged. */
int bench_kvset_synthetic(bench_kvset *s, const bench_env *env, uint32_t layers);

/*
 * The real set of n_ctx contexts. The model: --model-dir, else $KVDB_MODEL_DIR, else the
 * build's default (shared/models); the corpus: $KVDB_CORPUS_DIR, else <model dir>/../corpora,
 * else the build's default. 0 = made; 1 = the inputs are missing (`why` lists every path
 * looked at); -1 = error, logged.
 */
int bench_kvset_real(bench_kvset *s, const bench_env *env, uint32_t n_ctx, char *why,
                     size_t why_cap);

/* Probes, reference outputs and SnapKV windows of every head (see above). 0, or -1 logged. */
int bench_kvset_prepare(bench_kvset *s, bench_scratch *ws);

void bench_kvset_free(bench_kvset *s);

/* Log "what: <the codec's message>"; returns -1. */
int bench_codec_fail(const char *what, const kv_codec_err *err);

/* rows x d floats from f16 keys: each row scaled to norm sqrt(d) (a unit-variance query's). */
void bench_keys_as_queries(const uint16_t *k, uint32_t rows, uint32_t d, float *q);

/* The reference model's files and the corpus (the paths bench_kvset_real uses; `looked` lists
 * the paths tried when one is missing; -1 then, unlogged), and at least
 * `need` tokens of the corpus (malloc'd into *out; 0, or -1 logged). For bench_truth.c. */
struct refmodel_tokenizer;
int bench_kvset_inputs(const bench_env *env, char *bin, char *tok, char *text, size_t cap,
                       char *looked, size_t looked_cap);
int bench_kvset_tokens(const struct refmodel_tokenizer *tk, const char *textp, size_t need,
                       int **out);

#endif
