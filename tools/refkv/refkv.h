/* SPDX-License-Identifier: MIT */
/*
 * tools/refkv/refkv.h — the reference model's KV in kvdb: store what tools/refmodel computed,
 * and continue a prompt from stored KV (look up the longest stored prefix, get its KV into the
 * model's cache, prefill only the rest). Used by kvdb-ingest, kvdb-demo, kvdb-bench prefix and
 * the tests. Not part of libkvdb; it uses only the public kvdb.h, like any kvdb user would.
 *
 * How KV is stored: two choices. The element type (refkv_storage): the model's float32 KV as
 * KVDB_F32, or rounded to nearest even as KVDB_F16 or KVDB_BF16. And the engine's compression
 * config for the blocks a put writes (kvdb_config: raw, lossless, int8/4/2, token dropping; see
 * kvdb.h), set with refkv_model_set_config(). A model stored as f32 with a raw or lossless config
 * is lossless: a continuation from stored KV is bit-identical to a full recompute. Anything else
 * is lossy, and refkv_quality_measure() gives what it costs in real-model terms — greedy-token
 * agreement and next-token KL divergence against float32 — which refkv_report_quality() records
 * in the context's quality profile (the caller's measure, which wins over kvdb's proxy).
 *
 * Errors. Functions return a kvdb_status; after a failure refkv_errmsg() names what was wrong
 * (the kvdb or refmodel message included). The message is per thread.
 *
 * Threading. A refkv_model is immutable after refkv_model_init(): share it freely. A
 * refmodel_state belongs to one thread at a time (refmodel.h); the kvdb handle may be shared.
 */
#ifndef REFKV_H
#define REFKV_H

#include <stddef.h>
#include <stdint.h>

#include "kvdb.h"
#include "refmodel.h"

#ifdef __cplusplus
extern "C" {
#endif

/* How the model's KV is stored. Names (refkv_storage_name) are what the tools' --storage takes. */
typedef enum refkv_storage {
  REFKV_STORE_F32 = 0,  /* "f32": as computed, lossless */
  REFKV_STORE_F16 = 1,  /* "f16": IEEE half, round to nearest even (lossy) */
  REFKV_STORE_BF16 = 2, /* "bf16": bfloat16, round to nearest even (lossy) */
} refkv_storage;

/* "f32", "f16", "bf16"; NULL for a value that is not a refkv_storage. */
const char *refkv_storage_name(refkv_storage s);

/* Parse a --storage value. KVDB_INVALID (message lists the accepted names) when unknown. */
kvdb_status refkv_storage_parse(const char *name, refkv_storage *out);

/* A reference model as kvdb sees it: the fingerprint under which its KV is stored. */
typedef struct refkv_model {
  kvdb_model km; /* km.id points at id[] below: do not copy a refkv_model by value
                    and use the copy's km (use refkv_model_copy) */
  char id[64];
  const refmodel_model *rm; /* not owned; must outlive this */
  refkv_storage storage;
  kvdb_config config; /* how puts store new blocks (refkv_model_set_config); zero = raw */
  size_t kv_dim;      /* floats of K (or V) per layer and token */
  size_t q_floats;    /* floats of one query position for all layers (n_layers * dim) */
} refkv_model;

/*
 * Describe refmodel `rm` for kvdb. `id` names the model in the store (1..63 bytes); NULL derives
 * it from the checkpoint: refkv_default_id(name_hint, rm). block_tokens: kvdb's block size (a
 * power of two 16..4096; 0 = 16). The KV shape is rm's n_layers × n_kv_heads × head_size.
 * Returns KVDB_OK or KVDB_INVALID (bad id, storage or block_tokens).
 */
kvdb_status refkv_model_init(refkv_model *out, const refmodel_model *rm, const char *id,
                             const char *name_hint, refkv_storage storage, uint32_t block_tokens);

/* Copy src into dst, fixing dst->km.id to point at dst->id. */
void refkv_model_copy(refkv_model *dst, const refkv_model *src);

/*
 * Store new blocks with the kvdb config named `name` ("raw", "lossless", "int8", "int4:g64",
 * "snapkv50+int4", ...: kvdb_config_parse), checked against the model's shape
 * (kvdb_config_check). Returns KVDB_OK or KVDB_INVALID with kvdb's reason.
 */
kvdb_status refkv_model_set_config(refkv_model *m, const char *name);

/* 1 when KV read back is exactly what was computed: f32 storage and a raw or lossless config. */
int refkv_model_lossless(const refkv_model *m);

/* "f32 raw", "f16 int8", ...: the storage and the config's canonical name into buf (>= 64). */
char *refkv_model_describe(const refkv_model *m, char *buf, size_t cap);

/*
 * The default model id: the checkpoint's file name without directories and without a ".bin"
 * ending (at most 44 bytes of it), "-", and the first 12 hex digits of refmodel_model_digest(rm),
 * e.g. "stories260K-1c0f8a2e9b3d". Two checkpoints that differ in any byte get different ids,
 * so the KV of one is never served for the other. name_hint NULL gives "llama2c-<digest>".
 * out must hold 64 bytes. Returns out.
 */
char *refkv_default_id(const char *name_hint, const refmodel_model *rm, char *out);

/* Bytes of one token's K and V for all layers in the stored dtype (kvdb_model_token_bytes). */
size_t refkv_token_bytes(const refkv_model *m);

/*
 * Store positions [0, n) of st's KV cache as the context tokens[0..n) (kvdb_put). The state must
 * hold at least n positions, already computed for exactly these tokens. For REFKV_STORE_F32 kvdb
 * reads the cache in place; other storages convert through a temporary buffer (n ×
 * refkv_token_bytes bytes). info: optional, as kvdb_put.
 * Returns KVDB_OK or kvdb_put's errors; KVDB_INVALID for n > the state's positions; KVDB_NOMEM.
 */
kvdb_status refkv_put(kvdb *db, const refkv_model *m, refmodel_state *st, const uint32_t *tokens,
                      size_t n, kvdb_put_info *info);

/*
 * refkv_put with the extras of kvdb_put_ex: `queries` (n_queries of them, 0..64, laid out
 * [query][layer][n_heads][head_size] as refkv_prefill_queries() writes them) are the prompt's
 * last queries, which SnapKV configs need and the quality profile uses as probes; `profile`
 * non-zero also measures and records the context's quality profile (KVDB_PUT_PROFILE).
 * queries may be NULL with n_queries 0. Returns as refkv_put.
 */
kvdb_status refkv_put_ex(kvdb *db, const refkv_model *m, refmodel_state *st, const uint32_t *tokens,
                         size_t n, const float *queries, uint32_t n_queries, int profile,
                         kvdb_put_info *info);

/*
 * Feed tokens[start..n) at positions start..n-1 (refmodel_prefill) and keep the queries of the
 * last min(n_queries, n - start) positions, oldest first, into queries (room for n_queries *
 * m->q_floats floats); *got receives how many. Returns KVDB_OK or KVDB_INVALID (as
 * refmodel_prefill).
 */
kvdb_status refkv_prefill_queries(const refkv_model *m, refmodel_state *st, const int *tokens,
                                  size_t n, size_t start, uint32_t n_queries, float *queries,
                                  uint32_t *got);

/*
 * Record `quality` (0..1, e.g. refkv_quality.agreement) as the caller-measured quality of the
 * stored context tokens[0..n) in m's config (kvdb_report_quality). Returns KVDB_OK,
 * KVDB_NOTFOUND (no such context), KVDB_INVALID, KVDB_READONLY.
 */
kvdb_status refkv_report_quality(kvdb *db, const refkv_model *m, const uint32_t *tokens, size_t n,
                                 double quality);

/*
 * Copy the KV of the longest stored prefix of tokens[0..n) into st's cache (kvdb_get), widened
 * to float32. *hit receives its length (0..n); positions [hit, n) of the cache are unspecified
 * afterwards. With a token-dropping config (m->config.method KVDB_METHOD_DROP), whose blocks
 * kvdb_get does not deliver, the longest stored prefix of tokens[0..n) is read with
 * kvdb_get_kept instead: its kept rows go to their positions and its dropped rows are marked
 * absent in st (refmodel_state_set_absent), so the model attends over what the store kept.
 * Clears st's earlier absent marks first. Returns KVDB_OK (also for 0 hits) or kvdb_get's
 * (kvdb_get_kept's) errors; KVDB_INVALID for n > the state's positions; KVDB_NOMEM.
 */
kvdb_status refkv_get(kvdb *db, const refkv_model *m, refmodel_state *st, const uint32_t *tokens,
                      size_t n, size_t *hit);

/* What one refkv_continue() did. Times are wall-clock seconds. */
typedef struct refkv_run {
  size_t prompt_tokens;  /* n */
  size_t hit_tokens;     /* positions restored from the store */
  size_t prefill_tokens; /* positions computed: n - hit_tokens */
  double get_s;          /* kvdb_get (lookup included) and the widening copy */
  double prefill_s;      /* forward passes over the positions not restored */
  double ttft_s;         /* from the call until the first new token is known */
  double generate_s;     /* the remaining new tokens */
  size_t n_generated;    /* new tokens written to out */
} refkv_run;

/*
 * Greedy continuation of `prompt` (n >= 1 tokens, n + max_new <= the state's positions).
 * With db non-NULL: restore the longest stored prefix of prompt[0..n-1) (the last prompt token is
 * always fed, as its logits give the first new token), prefill the rest, then generate. (With a
 * token-dropping config: the longest stored prefix of prompt[0..n) by kvdb_get_kept, at most
 * n - 1 positions of it, its dropped rows absent; see refkv_get.) With db
 * NULL: a full recompute. out receives up to max_new (>= 1) new tokens; generation stops early
 * before stop_token when stop_token >= 0 (refmodel_generate semantics).
 * The state's logits are those of the last token fed. run: optional.
 * Returns KVDB_OK; KVDB_INVALID (arguments, a token out of the model's vocab); kvdb_get's errors.
 */
kvdb_status refkv_continue(kvdb *db, const refkv_model *m, refmodel_state *st, const int *prompt,
                           size_t n, int max_new, int stop_token, int *out, refkv_run *run);

/* Real-model quality of continuing from stored KV (refkv_quality_measure). */
typedef struct refkv_quality {
  size_t hit_tokens; /* prompt positions that came from the store */
  int steps;         /* next-token distributions compared */
  int agree;         /* steps whose argmax equals the full recompute's */
  double agreement;  /* agree / steps */
  double mean_kl;    /* mean over steps of KL(full || stored), nats */
  double max_kl;     /* largest step KL, nats */
} refkv_quality;

/*
 * Compare continuing `prompt` from stored KV with a full float32 recompute over `steps` steps:
 * `ref` recomputes the prompt and generates greedily; `test` restores the longest stored prefix
 * of prompt[0..n-1), prefills the rest and is then fed the same tokens as `ref`
 * (teacher forcing), so every step compares the two next-token distributions for the same
 * context: KL(full || stored) of their softmaxes, and whether their argmaxes agree. A
 * token-dropping config is measured over its kept rows (refkv_get); its hit is 0 (and the
 * result exact) when no stored block starts the prompt. For a
 * lossless model (refkv_model_lossless) the result is exact agreement and KL 0 (bit-identical
 * logits); otherwise it is the quality the storage costs. ref and test must be two states of m's
 * model holding at least n + steps positions.
 * Returns KVDB_OK; KVDB_INVALID; KVDB_NOMEM; kvdb_get's errors.
 */
kvdb_status refkv_quality_measure(kvdb *db, const refkv_model *m, refmodel_state *ref,
                                  refmodel_state *test, const int *prompt, size_t n, int steps,
                                  refkv_quality *out);

/* Message of the last refkv failure on this thread ("" if none). Never NULL. */
const char *refkv_errmsg(void);

/* Set the message refkv_errmsg() returns (printf format) and return rc: for the files built
 * with refkv (refdecode.c), so that their failures read like refkv's. */
#if defined(__GNUC__)
__attribute__((format(printf, 2, 3)))
#endif
kvdb_status refkv_fail(kvdb_status rc, const char *fmt, ...);

/* Conversions used for the lossy storages (exposed for tests): round to nearest even; NaN stays
 * NaN (quiet), infinities and signed zeros are kept, f16 overflow becomes infinity. */
uint16_t refkv_f32_to_f16(float f);
float refkv_f16_to_f32(uint16_t h);
uint16_t refkv_f32_to_bf16(float f);
float refkv_bf16_to_f32(uint16_t h);

#ifdef __cplusplus
}
#endif

#endif /* REFKV_H */
