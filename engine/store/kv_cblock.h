/* SPDX-License-Identifier: MIT */
/*
 * engine/store/kv_cblock.h — compressed block objects inside the engine (cblock.c).
 */
#ifndef KV_CBLOCK_H
#define KV_CBLOCK_H

#include "kv_config.h"
#include "kv_db.h"

/* The caller's queries (kvdb_put_opts): [n_queries][n_layers][n_q_heads][head_dim]. */
typedef struct kv_queries {
  const float *q;
  uint32_t n_queries, n_q_heads;
} kv_queries;

/* Reusable encoding buffers (one put). Zero-initialize; kv_cenc_free() at the end. */
typedef struct kv_cenc {
  uint8_t *rows_k, *rows_v, *scratch, *sect, *sect_codec, *pair;
  uint32_t *keep, *sect_len;
  float *qwin;
  size_t rows_k_cap, rows_v_cap, scratch_cap, sect_cap, sect_codec_cap, keep_cap, sect_len_cap,
      qwin_cap, pair_cap;
} kv_cenc;
void kv_cenc_free(kv_cenc *e);

/* What one block is built from. */
typedef struct kv_cblock_src {
  const kvdb_config *cfg;
  const kv_block_geom *g;
  const kvdb_kv_view *kv; /* the caller's view */
  uint64_t t0;            /* the block's first token in the view and in the context */
  uint64_t ctx_tokens;    /* tokens of the whole context (KIVI's residual) */
  const kv_queries *q;    /* NULL, or the queries (required for SnapKV) */
  int last_block;         /* the context's last block (SnapKV's window is its tail) */
  uint32_t index;         /* block index, for messages */
  const uint8_t *hash, *parent, *model_hash;
  const uint32_t *tokens; /* g->n_tokens */
} kv_cblock_src;

/* An upper bound of the object bytes of a block of geometry g stored with cfg; 0 when cfg
 * cannot store it. */
uint64_t kv_cblock_bound(const kvdb_config *cfg, const kv_block_geom *g);

/* Encode the K and V sections s, s + 1 (s even) of the block of `src` from their contiguous
 * rows: e->pair receives the K section (len[0] bytes) then the V section (len[1]); the kept
 * positions of a drop config are e->keep. */
kvdb_status kv_cblock_encode_pair(const kv_cblock_src *src, const kv_section_codec *sc,
                                  uint32_t s, const uint8_t *rows_k, const uint8_t *rows_v,
                                  kv_cenc *e, uint32_t len[2]);

/* Build the compressed block object of `src` into dst (dst_cap >= kv_cblock_bound()). */
kvdb_status kv_cblock_build(const kv_cblock_src *src, kv_cenc *e, uint8_t *dst, size_t dst_cap,
                            uint64_t *obj_bytes);

/* Decoding state (one thread): a codec decoding context and reusable buffers. */
typedef struct kv_cdec {
  void *ctx_mem;
  kv_codec_dctx *ctx;
  uint8_t *scratch, *rows;
  size_t scratch_cap, rows_cap;
} kv_cdec;
kvdb_status kv_cdec_init(kv_cdec *d);
void kv_cdec_free(kv_cdec *d);

/* Parse the header of section s (hdr_bytes, len >= its header) of a compressed block and check
 * it against the block: codec id of the table, dtype, tokens, dims, K or V. */
kvdb_status kv_cblock_section_info(const kv_block_hdr *h, const uint8_t *hdr_bytes, size_t len,
                                   uint32_t s, uint8_t codec_id, kv_section_info *info);

/* Decode section s of a verified compressed block in buf (the whole object): *rows (owned by d,
 * valid until its next use) gets *n_rows rows, positions (optional, n_tokens entries) their
 * token positions. */
kvdb_status kv_cblock_decode_section(const kv_block_hdr *h, const uint8_t *buf, uint32_t s,
                                     kv_cdec *d, const uint8_t **rows, uint32_t *n_rows,
                                     uint32_t *positions);

/* Decode sections [s0, s1) of a verified compressed block that drops no tokens into the raw
 * page-grouped data region `data` (h->g.data_bytes). */
kvdb_status kv_cblock_decode_data(const kv_block_hdr *h, const uint8_t *buf, uint32_t s0,
                                  uint32_t s1, kv_cdec *d, uint8_t *data);

/* A codec status as a kvdb status with the codec's message after `what`. */
kvdb_status kv_codec_fail(kv_codec_status st, const kv_codec_err *err, const char *what);

#endif
