/* SPDX-License-Identifier: MIT */
/*
 * engine/model/model.h — the model floor (LAYERS: above io, below the catalog), for the
 * layers above: checks and hashes of a model and a caller's view (model.c), and storage
 * configs (config.c): validity, the catalog encoding, and the compress/ codec that stores one
 * section of a block with a config. Nothing here takes a handle.
 */
#ifndef KV_MODEL_H
#define KV_MODEL_H

#include "block.h"
#include "codec.h"
#include "kv_common.h"
#include "policy.h"

/* ---- checks and hashes (model.c) ---- */
kvdb_status kv_check_model(const kvdb_model *m, uint32_t *block_tokens);
/* The most tokens a context can hold (its block count is a u32, blocks hold >= 16 tokens):
 * put, get and lookup refuse a larger n (KVDB_INVALID) before any arithmetic on it. */
#define KV_MAX_TOKENS ((uint64_t)UINT32_MAX * 16)
kvdb_status kv_check_n_tokens(size_t n);
kvdb_status kv_check_view(const kvdb_kv_view *v, const kvdb_model *m, const char *what);
/* KVDB_INVALID when the view's strides for n_tokens tokens (with the model's layers, heads and
 * dims) give byte offsets beyond int64 (a valid view first: kv_check_view). */
kvdb_status kv_check_view_extent(const kvdb_kv_view *v, const kvdb_model *m, uint64_t n_tokens,
                                 const char *what);
void kv_model_hash(const kvdb_model *m, uint32_t block_tokens, uint8_t out[16]);
void kv_chain_hash(const uint8_t parent[16], const uint32_t *tokens, size_t n, uint8_t out[16]);

/* ---- storage configs (config.c) ---- */

#define KV_CONFIG_BYTES 12 /* kv_config_encode() */

/* KVDB_OK, or KVDB_INVALID with a message naming `what` and the problem. */
kvdb_status kv_config_valid(const kvdb_config *c, const char *what);
/* 0 when valid, -1 when not; records no message. */
int kv_config_valid_quiet(const kvdb_config *c);
/* Exact (RAW or LOSSLESS), equal and reachable configs: policy.h's kv_policy_config_*. */
/* DROP: some tokens are not stored. */
int kv_config_drops(const kvdb_config *c);

void kv_config_encode(const kvdb_config *c, uint8_t *p);
/* KVDB_CORRUPT when the 12 bytes are not a valid config. */
kvdb_status kv_config_decode(const uint8_t *p, kvdb_config *c);

/* How one section of a block is coded: the codec, its parameters (residual already resolved
 * for the block), and the quantization group for a K and for a V section. */
typedef struct kv_section_codec {
  const kv_codec *codec;
  kv_codec_params params;
  uint32_t group_k, group_v;
} kv_section_codec;

/* A model's RoPE (kvdb_model.rope_base / rope_style; style KVDB_ROPE_NONE = not given). */
typedef struct kv_model_rope {
  float base;
  uint32_t style;
} kv_model_rope;

/* KVDB_OK when (base, style) is a valid optional RoPE for head_dim (both 0, or style 1 or 2
 * with 1 < base <= 1e9 and head_dim even); else KVDB_INVALID naming the model. */
kvdb_status kv_check_rope(const kvdb_model *m);

/*
 * kv_config_section() - the codec of the sections of a block of geometry g whose first token
 * is token t0 of a context of ctx_tokens tokens, stored with config c (not RAW). The caller
 * sets params.group from group_k / group_v per section and, for DROP, keep_pos/n_keep.
 * kv_config_section_rope(): the same with the model's RoPE (NULL or style 0: none): a kvquant
 * config (int4, int2) then quantizes K before RoPE (params.rope_*, set for K: the caller clears
 * them for V sections).
 */
kvdb_status kv_config_section(const kvdb_config *c, const kv_block_geom *g, uint64_t ctx_tokens,
                              uint64_t t0, kv_section_codec *out);
kvdb_status kv_config_section_rope(const kvdb_config *c, const kv_block_geom *g,
                                   uint64_t ctx_tokens, uint64_t t0, const kv_model_rope *rope,
                                   kv_section_codec *out);

#endif
