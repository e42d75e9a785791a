/* SPDX-License-Identifier: MIT */
/*
 * tools/ingest/safetensors.h — KV computed elsewhere, one context per safetensors file, for
 * kvdb-ingest. Not part of libkvdb.
 *
 * safetensors: an 8-byte little-endian header length N, N bytes of a JSON object (tensor name ->
 * {"dtype", "shape", "data_offsets": [begin, end]} with offsets relative to the byte buffer that
 * follows the header; an optional "__metadata__" object of string values), then the byte buffer.
 * Tensors are row-major and little-endian.
 *
 * What a kvdb context file holds (kvdb-ingest.1.md has the same table):
 *
 *   tokens                          I32  [T] or [1, T]      the context's token ids (>= 0)
 *   and K/V in one of two forms (all F16, all BF16 or all F32):
 *   k, v                            [L, T, H, D]            stacked, per token (vLLM/LMCache);
 *                                   [L, H, T, D]            with __metadata__ kv_layout = "LHTD"
 *   past_key_values.<l>.key/.value  [1, H, T, D] or [H, T, D]  one per layer l = 0..L-1
 *                                                           (Hugging Face transformers' cache)
 *   __metadata__.model_id           optional: the model id the KV is stored under (1..63 bytes);
 *                                   kvdb-ingest --model-id takes precedence
 *
 * L layers, H KV heads, D head_dim, T tokens; K after RoPE, as the model caches it. Any other
 * tensor is ignored. Everything is checked before anything is stored: sizes, offsets inside the
 * file, dtypes, that every shape agrees, kvdb's shape limits; each failure names the file, the
 * tensor and what was wrong.
 */
#ifndef KVDB_INGEST_SAFETENSORS_H
#define KVDB_INGEST_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "kvdb.h"

/* The longest header accepted (the safetensors format's own limit). */
#define ST_MAX_HEADER_BYTES (100u << 20)

typedef struct st_context {
  void *map; /* the file, mapped read-only (NULL for st_parse) */
  size_t map_len;
  uint32_t *tokens; /* n_tokens ids (copied out of the file) */
  size_t n_tokens;
  kvdb_dtype dtype;
  uint32_t n_layers, n_kv_heads, head_dim;
  int per_layer;      /* 1: past_key_values.<l>.* tensors; 0: stacked k, v */
  int lhtd;           /* stacked with kv_layout LHTD */
  kvdb_kv_view view;  /* describes the K and V bytes in place, for kvdb_put */
  void **layer_bases; /* per-layer form: 2 * n_layers pointers (K then V) */
  char model_id[64];  /* __metadata__.model_id, or "" */
} st_context;

/*
 * Parse a safetensors context held in buf[0..len) (not copied: it must outlive c, which points
 * into it). name labels it in messages. Returns 0, or -1 with the reason in err.
 */
int st_parse(const uint8_t *buf, size_t len, const char *name, st_context *c, char *err,
             size_t err_cap);

/* Map the file at path read-only and st_parse it. Returns 0, or -1 with the reason in err. */
int st_open(const char *path, st_context *c, char *err, size_t err_cap);

/* Free and unmap. A zeroed st_context is fine. */
void st_close(st_context *c);

#endif
