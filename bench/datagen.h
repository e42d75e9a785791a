/* SPDX-License-Identifier: MIT */
/*
 * bench/datagen.h — deterministic KV-cache-like data and token sequences for kvdb-bench
 * (in the manner of zstd's datagen.c: everything is a function of a seed; no external data).
 *
 * KV values (fp16) look like a real model's in the ways storage and compression care about:
 *  - every channel (layer, K/V, head, dim) has its own scale, log-normally spread, and a small
 *    bias; V channels are quieter than K channels;
 *  - a few K channels per (layer, head) are outliers: a large bias of fixed sign and a wider
 *    spread (the "massive activation" key channels KIVI and KVQuant describe);
 *  - the value of token t depends on the tokens [0, t] (a rolling hash of the prefix), so two
 *    prompts with an equal prefix have equal KV for that prefix, as a model's would.
 * Values are bias + scale * z with z roughly standard normal (Irwin–Hall of four uniforms).
 *
 * The buffer layout is [layer][K,V][token][head][dim] (kvdb's KVDB_LAYOUT_LKTHD).
 */
#ifndef BENCH_DATAGEN_H
#define BENCH_DATAGEN_H

#include <stddef.h>
#include <stdint.h>

/* ---- a small PRNG for the benchmark's choices (splitmix64) ------------------------------- */

typedef struct dg_rng {
  uint64_t s;
} dg_rng;

static inline uint64_t dg_mix(uint64_t z)
{
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

static inline uint64_t dg_next(dg_rng *r)
{
  r->s += 0x9e3779b97f4a7c15ull;
  return dg_mix(r->s);
}

/* Uniform in [0, n), 1 <= n <= 2^32 (multiply-shift; bias below n / 2^32). */
static inline uint32_t dg_below(dg_rng *r, uint64_t n)
{
  return (uint32_t)(((dg_next(r) >> 32) * n) >> 32);
}

/* ---- KV ------------------------------------------------------------------------------- */

typedef struct dg_kv_model {
  uint32_t n_layers, n_kv_heads, head_dim;
  uint64_t seed;
  float *bias;  /* [layer][kv][head][dim] */
  float *scale; /* [layer][kv][head][dim] */
} dg_kv_model;

/* Derive the per-channel statistics of a model shape from `seed`. Returns 0 or -1 (no memory). */
int dg_kv_model_init(dg_kv_model *m, uint32_t n_layers, uint32_t n_kv_heads, uint32_t head_dim,
                     uint64_t seed);
void dg_kv_model_free(dg_kv_model *m);

/* Bytes of fp16 K and V of one token for all layers and heads. */
size_t dg_kv_token_bytes(const dg_kv_model *m);

/*
 * Fill `dst` with the fp16 KV of tokens[0..n) in [layer][K,V][token][head][dim] layout
 * (n * dg_kv_token_bytes(m) bytes). Returns 0, or -1 when out of memory (dst untouched).
 */
int dg_kv_fill_f16(const dg_kv_model *m, const uint32_t *tokens, size_t n, uint16_t *dst);

/* IEEE binary32 -> binary16, round to nearest even (overflow to infinity). */
uint16_t dg_f32_to_f16(float f);

/* ---- tokens --------------------------------------------------------------------------- */

/* n token ids in [0, vocab) from `seed`. */
void dg_tokens(uint32_t *dst, size_t n, uint64_t seed, uint32_t vocab);

/*
 * A prompt that shares a prefix with its family: tokens [0, n_shared) come from family_seed
 * (equal for every prompt of the family, like a system prompt or a shared document), the
 * rest from prompt_seed.
 */
void dg_prompt(uint32_t *dst, size_t n, uint64_t family_seed, size_t n_shared,
               uint64_t prompt_seed, uint32_t vocab);

#endif
