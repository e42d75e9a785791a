/* SPDX-License-Identifier: MIT */
/*
 * engine/block/cblock.h — the block floor (LAYERS: above the model and the catalog's records,
 * below segments), for the layers above: block bodies in memory, no handle and no I/O.
 * Compressed block objects (cblock.c), copies between block sections and a caller's view
 * (copy.c), and a block's score region (score_write.c: FORMAT.md §3c has the bytes,
 * format/block.h ("THE SCORE REGION") the geometry and checksums, score/score.h the copies).
 *
 * A model whose fingerprint has score_bits 8 or 4 (kvdb_model.score_bits, part of h_{-1})
 * gets a score region appended to every block object it writes; the block record says so
 * (KV_BLK_SCORE8 / KV_BLK_SCORE4) and its `bytes` include the region. Readers of K and V
 * (get, get_tokens) stop at the end of the data region.
 */
#ifndef KV_CBLOCK_H
#define KV_CBLOCK_H

#include "catalog/catalog.h"
#include "model/model.h"
#include "block.h"

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
  /* lossless frames (format 3): a frame's rows, its sections, the plan */
  uint8_t *frows;
  kv_frame_sec *fsecs;
  uint32_t *ffirst, *flen;
  uint64_t *fsb;
  size_t frows_cap;
  uint32_t fcap; /* entries of fsb, ffirst (+ 1) and flen */
  int packed;    /* kv_cblock_build's last object: 1 packed (block format 5), 0 whole pages */
} kv_cenc;
void kv_cenc_free(kv_cenc *e);

/* What one block is built from. */
typedef struct kv_cblock_src {
  const kvdb_config *cfg;
  const kv_block_geom *g;
  const kvdb_kv_view *kv; /* the caller's view */
  uint64_t t0;            /* the block's first token in the view and in the context */
  uint64_t keep_t0;       /* DROP: the block's first token in its context; it keeps
                             kv_drop_keep_span(keep_t0, n_tokens, permille) tokens per head */
  uint64_t ctx_tokens;    /* tokens of the whole context (KIVI's residual) */
  const kv_queries *q;    /* NULL, or the queries (required for SnapKV) */
  int last_block;         /* the context's last block (SnapKV's window is its tail) */
  uint32_t index;         /* block index, for messages */
  const uint8_t *hash, *parent, *model_hash;
  const uint32_t *tokens; /* g->n_tokens */
  uint32_t frame_bytes;   /* lossless: raw bytes per frame (kvdb_options.lossless_frame_bytes;
                             0 = KV_FRAME_BYTES_DEFAULT) */
  kv_model_rope rope;     /* the model's RoPE (style 0: none): kvquant's pre-RoPE K */
  uint64_t pack_max;      /* 0: whole pages (block formats 2, 3); else an object of at most
                             this many bytes is packed (block format 5, FORMAT.md §3f) */
  const kv_calib *calib;  /* the model's calibration (kvdb_model_calibrate), or NULL: int4 and
                             int2 sections then take kv_calib_section_params()'s widths, weights,
                             bits and groups per (layer, KV head) */
} kv_cblock_src;

/* An upper bound of the object bytes of a block of geometry g stored with cfg; 0 when cfg
 * cannot store it. */
uint64_t kv_cblock_bound(const kvdb_config *cfg, const kv_block_geom *g);
/* The same for a writer with the model's calibration (NULL: kv_cblock_bound). */
uint64_t kv_cblock_bound_cal(const kvdb_config *cfg, const kv_block_geom *g, const kv_calib *cal);

/* Encode the K and V sections s, s + 1 (s even) of the block of `src` from their contiguous
 * rows: e->pair receives the K section (len[0] bytes) then the V section (len[1]); the kept
 * positions of a drop config are e->keep. */
kvdb_status kv_cblock_encode_pair(const kv_cblock_src *src, const kv_section_codec *sc,
                                  uint32_t s, const uint8_t *rows_k, const uint8_t *rows_v,
                                  kv_cenc *e, uint32_t len[2]);

/* Build the compressed block object of `src` into dst (dst_cap >= kv_cblock_bound()). A
 * lossless config writes lossless frames (format 3: kv_cblock_seal_frames), the others
 * sections (format 2); either packed (format 5, e->packed set) when it fits src->pack_max. */
kvdb_status kv_cblock_build(const kv_cblock_src *src, kv_cenc *e, uint8_t *dst, size_t dst_cap,
                            uint64_t *obj_bytes);

/* Decoding state (one thread): a codec decoding context and reusable buffers. */
typedef struct kv_cdec {
  void *ctx_mem;
  kv_codec_dctx *ctx;
  uint8_t *scratch, *rows;
  size_t scratch_cap, rows_cap;
  /* format 3: the last frame decoded (its block's hash and offset), so that the sections of
   * one frame decode it once */
  uint8_t *frame;
  size_t frame_cap;
  uint8_t frame_hash[16];
  uint64_t frame_off;
  int frame_valid;
  /* format 3, many frames at once (kv_cblock_decode_data): one worker per online CPU */
  kv_frame_worker *mt_w;
  void **mt_ctx;
  unsigned mt_n;
  kv_frame_job *mt_jobs;
  uint32_t mt_jobs_cap;
  uint8_t *mt_rows;
  size_t mt_rows_cap;
} kv_cdec;
/* A decode of a format-3 block range uses every core from this many bytes of KV and 2 frames
 * on, with at most this many threads. */
#define KV_CDEC_MT_MIN_BYTES (256u << 10)
#define KV_CDEC_MAX_THREADS 16u
kvdb_status kv_cdec_init(kv_cdec *d);
void kv_cdec_free(kv_cdec *d);

/* Parse the header of section s (hdr_bytes, len >= its header) of a compressed block and check
 * it against the block: codec id of the table, dtype, tokens, dims, K or V. */
kvdb_status kv_cblock_section_info(const kv_block_hdr *h, const uint8_t *hdr_bytes, size_t len,
                                   uint32_t s, uint8_t codec_id, kv_section_info *info);

/* Decode section s of a verified compressed block in buf (the whole object): *rows (owned by d,
 * valid until its next use) gets *n_rows rows, positions (optional, n_tokens entries) their
 * token positions. Format 3: the section's frame is decoded (once for all its sections). */
kvdb_status kv_cblock_decode_section(const kv_block_hdr *h, const uint8_t *buf, uint32_t s,
                                     kv_cdec *d, const uint8_t **rows, uint32_t *n_rows,
                                     uint32_t *positions);

/* Decode sections [s0, s1) of a verified compressed block that drops no tokens into the raw
 * page-grouped data region `data` (h->g.data_bytes). Format 3: the range's frames are decoded
 * on every online CPU (kv_frames_decode_mt) when they are 2 or more and hold at least
 * KV_CDEC_MT_MIN_BYTES; the calling thread alone otherwise. */
kvdb_status kv_cblock_decode_data(const kv_block_hdr *h, const uint8_t *buf, uint32_t s0,
                                  uint32_t s1, kv_cdec *d, uint8_t *data);

/* Format 3: the rows of section s from its frame, decoded into d->frame unless it holds it
 * already; the frame is checked against the block (dtype, sections, their shapes and kinds).
 * buf holds the meta region and at least the frame's bytes (verified). */
kvdb_status kv_cblock_frame_rows(const kv_block_hdr *h, const uint8_t *buf, uint32_t s,
                                 kv_cdec *d, const uint8_t **rows);

/* A codec status as a kvdb status with the codec's message after `what`. */
kvdb_status kv_codec_fail(kv_codec_status st, const kv_codec_err *err, const char *what);

/* Sections [s0, s1) of a verified format-2 block that drops no tokens, their first n rows
 * decoded straight into the view at tokens t0, t0 + 1, ... (issue 16: no data region and no
 * scatter): kivi, kvquant and raw sections through kv_section_decode_rows_dctx() wherever the
 * view's rows of a section are head_dim contiguous elements at ascending token strides
 * (kv_view_section_rows); any other section decoded into d->rows and copied
 * (kv_scatter_rows). Same bytes as kv_cblock_decode_data() + kv_scatter_sections(). */
kvdb_status kv_cblock_decode_view(const kv_block_hdr *h, const uint8_t *buf, uint32_t s0,
                                  uint32_t s1, uint32_t n, kv_cdec *d, const kvdb_kv_view *v,
                                  uint64_t t0);

/* ---- copies between block sections and caller views (copy.c) ---- */
/* Where the view's row of section s at token t0 is, its next tokens' rows *stride bytes
 * apart; NULL when the view's rows of that section are not head_dim contiguous elements
 * (dim_stride) or its tokens are not at least a row apart in ascending order. */
uint8_t *kv_view_section_rows(const kv_block_geom *g, const kvdb_kv_view *v, uint32_t s,
                              uint64_t t0, size_t *stride);
/* Gather tokens [0, g->n_tokens) of the caller's view starting at token `t0` into the data
 * region `data` (g->data_bytes, zeroed padding): all sections, or section `s` alone. */
void kv_gather(const kv_block_geom *g, const kvdb_kv_view *v, uint64_t t0, uint8_t *data);
void kv_gather_section(const kv_block_geom *g, const kvdb_kv_view *v, uint64_t t0, uint32_t s,
                       uint8_t *data);
/* Section s of tokens [t0, t0 + g->n_tokens) of the view as n_tokens contiguous rows (codec
 * input). */
void kv_gather_rows(const kv_block_geom *g, const kvdb_kv_view *v, uint64_t t0, uint32_t s,
                    uint8_t *rows);
/* Tokens [t0, t0 + n) of one (layer, KV head) of K (is_v 0) or V as n contiguous rows. */
void kv_gather_head(const kvdb_kv_view *v, uint32_t elem_bytes, uint32_t head_dim,
                    uint32_t layer, uint32_t head, int is_v, uint64_t t0, uint64_t n,
                    uint8_t *rows);
/* n_tokens contiguous rows into section s of a page-grouped data region. */
void kv_rows_to_section(const kv_block_geom *g, const uint8_t *rows, uint32_t s, uint8_t *data);
/* n_rows contiguous rows of section s into the view at tokens t0, t0 + 1, ... */
void kv_scatter_rows(const kv_block_geom *g, const uint8_t *rows, uint32_t n_rows, uint32_t s,
                     const kvdb_kv_view *v, uint64_t t0);
/* Scatter tokens [from, from + n) of the data region into the view at token t0 + (t - from):
 * all sections, or sections [s0, s1) only, with non-temporal stores when `stream` (what
 * kv_scatter_streams() says for a scatter of n tokens of every section: a large one). */
void kv_scatter(const kv_block_geom *g, const uint8_t *data, uint32_t from, uint32_t n,
                const kvdb_kv_view *v, uint64_t t0);
int kv_scatter_streams(const kv_block_geom *g, uint32_t n);
void kv_scatter_sections(const kv_block_geom *g, const uint8_t *data, uint32_t s0, uint32_t s1,
                         uint32_t from, uint32_t n, const kvdb_kv_view *v, uint64_t t0,
                         int stream);
/* One row (head_dim elements) of section s into the view at token dst_tok of layer 0 (the
 * get_tokens convention). */
void kv_put_row(const kv_block_geom *g, uint32_t s, const uint8_t *row, const kvdb_kv_view *v,
                uint64_t dst_tok);
/* Scatter one token `t` of one layer (all heads, K and V) into view token `dst_tok`. `data`
 * is the data region (or NULL with `page_of` resolving group addresses). */
void kv_scatter_token_layer(const kv_block_geom *g, const uint8_t *data, uint32_t layer,
                            uint32_t t, const kvdb_kv_view *v, uint64_t dst_tok);

/* ---- score regions (score_write.c) ---- */

/* The block-record flags of a block written with score copies of `bits` (0: none) of `variant`
 * (0: version 1; KV_SCORE_COPY_CENTERED: version 2). */
static inline uint32_t kv_score_rec_flags(unsigned bits, unsigned variant)
{
  uint32_t f = bits == 8 ? KV_BLK_SCORE8 : bits == 4 ? KV_BLK_SCORE4 : 0;
  return f != 0 && variant != 0 ? f | KV_BLK_SCOREV2 : f;
}
/* The largest packed raw object a put writes by default (kvdb_options.packed_block_bytes 0). */
#define KV_PACK_MAX_DEFAULT (128u << 10)

/* The geometry of record rec's object, from g (kv_block_geom_init of the model's shape and the
 * record's tokens): packed (block format 4, FORMAT.md §3e) when the record says so. */
static inline void kv_rec_geom(kv_block_geom *g, const kv_block_rec *rec)
{
  if ((rec->bflags & KV_BLK_PACKED) && !(rec->bflags & KV_BLK_COMPRESSED))
    kv_block_geom_pack(g);
}
/* A packed object (raw: block format 4, compressed: 5) lies at a 64-byte offset; the pages
 * that cover it start kv_rec_lead() bytes before it. */
static inline int kv_rec_packed(const kv_block_rec *rec)
{
  return (rec->bflags & KV_BLK_PACKED) != 0;
}
static inline uint64_t kv_rec_lead(const kv_block_rec *rec)
{
  return kv_rec_packed(rec) ? rec->offset % KV_PAGE : 0;
}

/* The bits of a block record's score copies (0: none). */
static inline unsigned kv_rec_score_bits(const kv_block_rec *rec)
{
  return (rec->bflags & KV_BLK_SCORE8) ? 8 : (rec->bflags & KV_BLK_SCORE4) ? 4 : 0;
}
/* The variant of a block record's score copies: 0 (version 1, every block written before
 * version 2 existed) or KV_SCORE_COPY_CENTERED. */
static inline unsigned kv_rec_score_variant(const kv_block_rec *rec)
{
  return (rec->bflags & KV_BLK_SCOREV2) ? KV_SCORE_COPY_CENTERED : 0;
}

/* Bytes of the score region of a block of geometry g at `bits` of `variant` (0 when bits is 0
 * or the shape cannot be scored). */
uint64_t kv_score_region_bytes(const kv_block_geom *g, unsigned bits, unsigned variant);
/* Bytes of a block record's object before its score region (what get reads at most). */
uint64_t kv_rec_body_bytes(const kv_block_geom *g, const kv_block_rec *rec);

/*
 * kv_score_copy_build() - write copy c (layer * n_kv_heads + head) of the region `region` from
 * the block's n_tokens K rows of that layer and head, row t at rows + t * stride (the model's
 * dtype). KVDB_INVALID names a non-finite key.
 */
kvdb_status kv_score_copy_build(const kv_block_geom *g, const kv_sregion *r, uint32_t c,
                                const uint8_t *rows, size_t stride, uint8_t *region);

/*
 * kv_score_region_build() - the whole region of the block whose tokens are [t0, t0 + n_tokens)
 * of the caller's view: every copy from the view's K rows, then the table (kv_sregion_seal).
 * `region` holds r->bytes. KVDB_INVALID (a non-finite key), KVDB_NOMEM.
 */
kvdb_status kv_score_region_build(const kv_block_geom *g, const kv_sregion *r,
                                  const kvdb_kv_view *kv, uint64_t t0, const uint8_t hash[16],
                                  uint8_t *region);

/*
 * kv_score_copy_from_section() - copy s / 2 (s even: a K section) from K section s of a raw
 * block object being built in `obj` (its rows read in place, still in cache; gathered from the
 * view at t0 when the section's groups are not back to back).
 */
kvdb_status kv_score_copy_from_section(const kv_block_geom *g, const kv_sregion *r, uint32_t s,
                                       const uint8_t *obj, const kvdb_kv_view *kv, uint64_t t0,
                                       uint8_t *region);

/*
 * kv_score_block_append() - for a model with score_bits: build the score region of a sealed
 * block object in `obj` (*obj_bytes long; room for kv_score_region_bytes() more) right after
 * it, from the view's K rows [t0, t0 + n_tokens), mark its header, and add the region to
 * *obj_bytes. A model without score_bits: nothing. KVDB_INVALID (a non-finite key), KVDB_NOMEM.
 */
kvdb_status kv_score_block_append(const kvdb_model *m, unsigned variant, const kv_block_geom *g,
                                  const kvdb_kv_view *kv, uint64_t t0, const uint8_t hash[16],
                                  uint8_t *obj, uint64_t *obj_bytes);

/* Verify a whole block's score region (kvdb_verify, a whole-block read): buf holds the object
 * as read (rec->bytes), hdr its parsed header. KVDB_CORRUPT names segment, offset, block. */
kvdb_status kv_score_region_check(const kv_block_rec *rec, const uint8_t hash[16],
                                  const kv_block_hdr *hdr, const uint8_t *buf);

#endif
