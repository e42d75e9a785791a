/* SPDX-License-Identifier: MIT */
/*
 * score/score.h — near-data token scoring on the CPU: the only header of score/.
 *
 * Sparse-attention decoders (H2O, Quest, HillInfer) score every stored token of a context
 * against the current query and keep the top k. HillInfer §4.4 (CEC) does it on low-precision
 * keys with the RAW inner product q·k (no softmax, no 1/sqrt(d): both are monotonic, so the
 * ranking is the same) and then fetches only the top-k tokens' full-precision K/V. This module
 * holds the pure-function parts of that for the CPU:
 *
 *   - quantization of K rows (f16, bf16, f32) to int8 or int4 with one scale per token;
 *   - the "score copy": the page-grouped bytes of a quantized K section (one layer x one KV
 *     head), as the engine stores them beside the full-precision K, and its validating parser;
 *   - scoring of a query (f32, f16 or bf16; one or several query heads under grouped-query
 *     attention) against such keys, with AVX2 and AVX-512 VNNI kernels chosen at run time and a
 *     portable one, all giving bit-identical scores;
 *   - a streaming top-k that never holds more than 2k candidates, multithreaded over chunks;
 *   - an exact reference scorer (f64 accumulation) for tests and recall measurements.
 *
 * No I/O, no locking, nothing of the engine. Identical inputs give identical outputs on every
 * machine and every kernel path. Nothing keeps a pointer to caller memory after a call returns,
 * and no thread outlives the call that started it.
 *
 * ---------------------------------------------------------------------------------------------
 * QUANTIZATION (symmetric, one scale per token)
 *   For a row x[0..d) with amax = max |x_j|, and Q = 127 (int8) or 7 (int4):
 *     scale s = amax / Q, computed in double and rounded UP to the next float (so |x_j / s| <= Q
 *     and no code is clipped); s = 0 when amax = 0.
 *     code  c_j = nearest integer to x_j / s (computed in double, ties to even), in [-Q, Q].
 *   ERROR BOUND: every element satisfies |x_j - c_j * s| <= s / 2 (exact arithmetic on the
 *   stored c_j and float s), and s <= (amax / Q) * (1 + 2^-23) for normal s. Hence for any query
 *   |q·x - q·x̂| <= (s / 2) * sum_j |q_j|. tests/unit/test_score_quant.c asserts both.
 *   Inputs must be finite; a NaN or infinity gives KV_SCORE_EINVAL naming the row.
 *   int8 codes are stored as two's-complement bytes; int4 codes as OFFSET-BINARY nibbles
 *   n = c + 8 (1..15), element 2i in the low nibble of byte i and element 2i+1 in the high one
 *   (int4 needs an even head_dim). A parsed copy may hold any byte: int8 -128 and nibble 0
 *   (value -8) are scored as the values they encode.
 *
 * QUERY. Each query head is quantized the same way to int8 (Q = 127) with its own scale.
 *
 * SCORE OF TOKEN t, bit-exact on every path:
 *     dot_h  = sum_j qc_h[j] * kc_t[j]                      exact, in 32-bit integers
 *     part_h = (float)dot_h * qs_h                          one float multiply (round to nearest)
 *     m      = part_0, then m = (part_h > m ? part_h : m)   over h = 1 .. n_vec-1
 *     score  = m * ks_t                                      one float multiply
 *   The integer dot is exact on all paths (d <= 4096: |dot| < 2^31), so every path rounds the
 *   same values the same way. (The SIMD paths bias the key bytes to unsigned and subtract the
 *   bias times sum_j qc[j] afterwards; the integer result is the same.)
 *
 * GROUPED-QUERY ATTENTION (the query heads g = 0 .. G-1 that share one KV head):
 *   KV_SCORE_SUM (default): the sum over heads of the raw scores, sum_g q_g·k = (sum_g q_g)·k.
 *     The heads are summed (in double, then rounded to float) BEFORE quantization, so it costs
 *     one dot per token whatever G is (n_vec = 1), and it ranks like the mean over the group,
 *     which is what GQA-aware H2O/SnapKV-style selection uses.
 *   KV_SCORE_MAX: the maximum over heads of each head's raw score (n_vec = G): keeps a token
 *     that matters to any single head; G dots per token.
 *   The exact reference (kv_score_exact) computes the same combination on the unquantized
 *   inputs (per-head dots in double; their sum or max).
 *
 * ---------------------------------------------------------------------------------------------
 * THE SCORE COPY (page-grouped int8/int4 keys of one section; all integers little-endian)
 *
 * Layout choice: codes are token-major rows of row_bytes = d (int8) or d/2 (int4) bytes, in
 * 4 KiB pages of page_tokens = the largest power of two with page_tokens * row_bytes <= 4096
 * (int8, d = 128: 32 tokens per page; int4, d = 128: 64; int8, d = 8: 512). A page always holds
 * whole tokens, a page group of the f16 K (16 tokens x 128 x 2 B) maps onto an aligned part of
 * one code page, and for power-of-two row sizes the pages are full, so the code region is one
 * contiguous N x row_bytes matrix that a scanner (or the FPGA) streams without gaps. The per-token
 * scales (f32) sit in a separate meta region in front of the codes, so adding them does not
 * break the page-per-whole-tokens rule: 1024 scales per 4 KiB.
 *
 *   OFF   SIZE  FIELD
 *     0     4   magic          0xC5E8A19D (chosen as zstd chose its own: no ASCII, no pattern)
 *     4     1   version        1 (KV_SCORE_COPY_VERSION)
 *     5     1   bits           8 or 4
 *     6     1   scale_dtype    3 (f32; the only one)
 *     7     1   flags          0 (reserved)
 *     8     4   n_tokens       1 .. KV_SCORE_MAX_TOKENS
 *    12     4   head_dim       1 .. KV_SCORE_MAX_HEAD_DIM; even when bits = 4
 *    16     4   row_bytes      d or d/2 (must match)
 *    20     4   page_tokens    as above (must match)
 *    24     4   meta_bytes     64 + 4 * n_tokens rounded up to 4096 (must match)
 *    28     4   n_pages        ceil(n_tokens / page_tokens) (must match)
 *    32    32   reserved       0
 *    64  4*N    scales         f32 per token, finite and >= 0
 *     ..        zero padding to meta_bytes
 *   meta_bytes  n_pages x 4096 code pages; token t at meta_bytes + (t / page_tokens) * 4096 +
 *               (t % page_tokens) * row_bytes; bytes past the last token of a page are 0 when
 *               written and ignored when read
 *   The section is exactly meta_bytes + n_pages * 4096 bytes long (a multiple of 4096, so it
 *   can be read with O_DIRECT as a whole). Checksums are the enclosing block's business.
 *
 * THE CENTERED, ROTATED COPY (version 2; kv_score_copy_encode_v with KV_SCORE_COPY_CENTERED;
 * head_dim a power of two). Keys of one section share large per-channel offsets (outlier
 * channels), which set every token's scale and leave a 4-bit code a coarse grid for the rest.
 * Version 2 stores codes of the keys with the section's per-channel offset removed and turned
 * by the normalized Walsh-Hadamard matrix H (H = H^T = H^-1, the Sylvester order, FWHT / sqrt(d),
 * in double), which spreads what is left evenly over the channels:
 *     c~  = int8 codes (Q = 127, QUANTIZATION above) of H m, scale cs, where m_j is the midrange
 *           (min + max) / 2 of channel j over the section's tokens; m^ = cs * c~ (rotated);
 *     k'_t = H k_t - m^ (double, rounded to float), quantized per token as above (bits 8 or 4).
 * Since H is orthonormal, q·k_t = (H q)·k'_t + (H q)·m^ exactly; the first term is scored like a
 * plain copy with the ROTATED query, the second is the same for every token of the section and
 * is scored from c~. So the SCORE OF TOKEN t in a version-2 copy, bit-exact on every path, with
 * rc_v / rs_v the int8 codes and scale of the rotated query vector v (H x_v, rounded to float,
 * then quantized):
 *     dot_v  = sum_j rc_v[j] * kc_t[j];    part_v = ((float)dot_v * rs_v) * ks_t
 *     cdot_v = sum_j rc_v[j] * c~[j];      bias_v = ((float)cdot_v * rs_v) * cs
 *     score  = part_0 + bias_0, then the greater-than max of part_v + bias_v over v = 1 ..
 * (every operation one float rounding, in that order). Recall of the exact top 10% by int4
 * scoring rises from 0.84 to 0.96 on datagen's Llama-shaped keys (bench/RESULTS.md, issue 18).
 *   Header changes against version 1: version = 2, flags = 1 (KV_SCORE_COPY_CENTERED), bytes
 *   32..35 = cs (f32, finite, >= 0; the rest of 36..63 zero); the meta region holds, after the
 *   scales, c~ (head_dim int8 bytes) at center_off = 64 + 4 * n_tokens rounded up to 64, and
 *   meta_bytes = center_off + head_dim rounded up to 4096. Code pages are as in version 1.
 *
 * ERRORS. Fallible functions return a kv_score_status and fill an optional kv_score_err (NULL
 * allowed) naming what was wrong; kv_score_errmsg() formats it. The parser treats its input as
 * untrusted: anything malformed is KV_SCORE_ECORRUPT, never a crash or a read outside the
 * buffer (tests/fuzz/fuzz_score_copy.c).
 *
 * THREADS. All functions are reentrant. kv_score_topk() may start worker threads (pthreads) for
 * the duration of the call and joins them before it returns; see kv_score_opts. A query object
 * is read-only after creation and may be shared by threads; a kv_score_acc may not.
 */
#ifndef KV_SCORE_H
#define KV_SCORE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------------------------ */
/* Status and error detail                                                                     */

/** Status of every fallible function of this module. Values are pinned. */
typedef enum kv_score_status {
  KV_SCORE_OK = 0,
  KV_SCORE_EINVAL = 1,   /**< bad argument (NULL, k = 0, k > N, a shape out of range, ...) */
  KV_SCORE_ECORRUPT = 2, /**< a score copy's bytes are malformed */
  KV_SCORE_ENOMEM = 3,   /**< allocation failed or caller scratch too small */
  KV_SCORE_ETOOSMALL = 4,/**< dst too small; kv_score_err.limit holds the size needed */
  KV_SCORE_EUNSUPPORTED = 5, /**< a kernel path that this CPU or build does not have */
} kv_score_status;

/** What went wrong (filled by the failing function when `err` is not NULL). */
typedef struct kv_score_err {
  kv_score_status code;
  const char *what; /**< static text naming the problem, e.g. "k is larger than the tokens" */
  uint64_t value;   /**< the offending number (0 when meaningless) */
  uint64_t limit;   /**< the bound it broke (0 when meaningless) */
  const char *file;
  int line;
} kv_score_err;

/** @brief Static name of a status, e.g. "KV_SCORE_EINVAL". Never NULL. */
const char *kv_score_status_name(kv_score_status rc);
/** @brief One-line message into buf (NUL-terminated when cap > 0); returns the full length. */
size_t kv_score_errmsg(const kv_score_err *err, char *buf, size_t cap);

/* ------------------------------------------------------------------------------------------ */
/* Elements, shapes, quantization                                                              */

/** Element type of keys and queries. Values equal kvdb_dtype's. */
typedef enum kv_score_dtype { KV_SCORE_F16 = 1, KV_SCORE_BF16 = 2, KV_SCORE_F32 = 3 } kv_score_dtype;

#define KV_SCORE_PAGE_BYTES 4096u
#define KV_SCORE_MAX_HEAD_DIM 4096u     /**< an int8 row fills at most one page */
#define KV_SCORE_MAX_TOKENS (1u << 28)  /**< tokens per score copy */
#define KV_SCORE_MAX_Q_HEADS 256u       /**< query heads per KV head */
#define KV_SCORE_COPY_MAGIC 0xC5E8A19Du
#define KV_SCORE_COPY_VERSION 1u
#define KV_SCORE_COPY_VERSION_CENTERED 2u /**< THE CENTERED, ROTATED COPY */
#define KV_SCORE_COPY_CENTERED 1u         /**< variant / header flag of a version-2 copy */
#define KV_SCORE_COPY_HDR_BYTES 64u

/** @brief Bytes of one element of dtype, 0 for an unknown dtype. */
size_t kv_score_dtype_bytes(kv_score_dtype dtype);

/** @brief Bytes of one quantized row: d (bits 8) or d/2 (bits 4); 0 if bits/d are invalid. */
uint32_t kv_score_row_bytes(uint32_t head_dim, unsigned bits);

/**
 * @brief Quantize n_rows rows of head_dim elements (row r at src + r * src_stride bytes, host
 * byte order) to `bits` (8 or 4): codes of row r to codes + r * code_stride (row_bytes bytes
 * written; code_stride >= row_bytes), its scale to scales[r]. See QUANTIZATION above.
 * @return KV_SCORE_OK or KV_SCORE_EINVAL (NULL, bits, head_dim, strides, a non-finite element).
 */
kv_score_status kv_score_quantize_rows(kv_score_dtype dtype, const void *src, size_t src_stride,
                                       uint32_t n_rows, uint32_t head_dim, unsigned bits,
                                       uint8_t *codes, size_t code_stride, float *scales,
                                       kv_score_err *err);

/** @brief Decode one quantized row to floats (out[j] = c_j * scale, in float). Cannot fail for
 * valid bits (8/4) and head_dim; does nothing otherwise. */
void kv_score_dequantize_row(const uint8_t *codes, uint32_t head_dim, unsigned bits, float scale,
                             float *out);

/* ------------------------------------------------------------------------------------------ */
/* The score copy: layout, writer, parser                                                      */

/** Geometry of a score copy (see THE SCORE COPY). */
typedef struct kv_score_layout {
  uint32_t n_tokens, head_dim, bits;
  uint32_t row_bytes;   /**< bytes per token row */
  uint32_t page_tokens; /**< tokens per 4 KiB code page (a power of two) */
  uint32_t n_pages;     /**< code pages */
  uint64_t meta_bytes;  /**< header + scales, rounded up to 4 KiB: offset of the first code page */
  uint64_t total_bytes; /**< meta_bytes + n_pages * 4096 */
  uint32_t variant;     /**< 0: version 1; KV_SCORE_COPY_CENTERED: version 2 */
  uint32_t center_off;  /**< version 2: offset of the center codes in the meta region, else 0 */
} kv_score_layout;

/** @brief Compute the layout for a shape (a version-1 copy). EINVAL names the bad field. */
kv_score_status kv_score_layout_init(kv_score_layout *out, uint32_t n_tokens, uint32_t head_dim,
                                     unsigned bits, kv_score_err *err);
/** @brief The layout of a copy of `variant` (0 or KV_SCORE_COPY_CENTERED; the latter needs a
 * power-of-two head_dim: EINVAL otherwise). */
kv_score_status kv_score_layout_init_v(kv_score_layout *out, uint32_t n_tokens, uint32_t head_dim,
                                       unsigned bits, unsigned variant, kv_score_err *err);

/** Byte offset of token t's code row from the start of the section. */
static inline uint64_t kv_score_layout_code_offset(const kv_score_layout *l, uint32_t t)
{
  return l->meta_bytes + (uint64_t)(t / l->page_tokens) * KV_SCORE_PAGE_BYTES +
         (uint64_t)(t % l->page_tokens) * l->row_bytes;
}

/**
 * @brief Write the score copy of a K section: n_tokens rows of head_dim elements of dtype, row r
 * at src + r * src_stride bytes. dst receives layout.total_bytes bytes (header, scales, code
 * pages, zero padding). *out_len (if not NULL) receives that length.
 * @return KV_SCORE_OK, KV_SCORE_EINVAL (shape, NULL, non-finite element), KV_SCORE_ETOOSMALL
 * (dst_cap < total_bytes; err->limit has the size needed).
 */
kv_score_status kv_score_copy_encode(kv_score_dtype dtype, const void *src, size_t src_stride,
                                     uint32_t n_tokens, uint32_t head_dim, unsigned bits,
                                     void *dst, size_t dst_cap, size_t *out_len, kv_score_err *err);

/**
 * @brief kv_score_copy_encode of a copy of `variant`: 0 writes version 1 (the same bytes as
 * kv_score_copy_encode), KV_SCORE_COPY_CENTERED version 2 (THE CENTERED, ROTATED COPY; EINVAL
 * unless head_dim is a power of two).
 */
kv_score_status kv_score_copy_encode_v(kv_score_dtype dtype, const void *src, size_t src_stride,
                                       uint32_t n_tokens, uint32_t head_dim, unsigned bits,
                                       unsigned variant, void *dst, size_t dst_cap,
                                       size_t *out_len, kv_score_err *err);

/**
 * A view of quantized keys that the scorer reads: codes in the page-grouped layout starting at
 * `codes` (the first code page), scales[t] per token. Built by kv_score_copy_parse() (pointers
 * into the section) or kv_score_view_init() (any caller arrays). Holds pointers only: the bytes
 * must outlive every use of the view.
 */
typedef struct kv_score_view {
  kv_score_layout layout;
  const uint8_t *codes;
  const float *scales;
  const int8_t *center; /**< version 2 (layout.variant != 0): the center codes c~, else NULL */
  float center_scale;   /**< version 2: cs */
} kv_score_view;

/**
 * @brief Validate a score copy of len bytes at src (4-byte aligned) and point a view into it.
 * Checks every header field (see the table), that len is exactly total_bytes, and that every
 * scale is finite and >= 0. On error *out is zeroed.
 * @return KV_SCORE_OK, KV_SCORE_ECORRUPT (what names the field), KV_SCORE_EINVAL (NULL, src not
 * 4-byte aligned).
 */
kv_score_status kv_score_copy_parse(const void *src, size_t len, kv_score_view *out,
                                    kv_score_err *err);

/**
 * @brief A view over caller arrays: codes in the page-grouped layout of (n_tokens, head_dim,
 * bits) — code page p at codes + p * 4096 — and scales[n_tokens] (finite, >= 0; not checked).
 * @return KV_SCORE_OK or KV_SCORE_EINVAL.
 */
kv_score_status kv_score_view_init(kv_score_view *out, uint32_t n_tokens, uint32_t head_dim,
                                   unsigned bits, const uint8_t *codes, const float *scales,
                                   kv_score_err *err);

/* ------------------------------------------------------------------------------------------ */
/* Queries                                                                                     */

/** How the query heads of one KV head are combined (see GROUPED-QUERY ATTENTION). */
typedef enum kv_score_combine { KV_SCORE_SUM = 0, KV_SCORE_MAX = 1 } kv_score_combine;

/** A quantized query, ready for scoring. Read-only once made; shareable by threads. */
typedef struct kv_score_query kv_score_query;

/**
 * @brief Quantize a query: n_heads query heads of head_dim elements of dtype, head g at
 * q + g * head_stride bytes (head_stride >= head_dim * element bytes; ignored when n_heads = 1).
 * On KV_SCORE_OK *out receives the query (free with kv_score_query_free); else *out = NULL.
 * @return KV_SCORE_OK, KV_SCORE_EINVAL (NULL, dtype, n_heads 0 or > KV_SCORE_MAX_Q_HEADS,
 * head_dim, combine, a non-finite element), KV_SCORE_ENOMEM.
 */
kv_score_status kv_score_query_create(kv_score_dtype dtype, const void *q, uint32_t n_heads,
                                      uint32_t head_dim, size_t head_stride,
                                      kv_score_combine combine, kv_score_query **out,
                                      kv_score_err *err);
/** @brief Free a query. NULL is a no-op. */
void kv_score_query_free(kv_score_query *q);

/** Quantized vectors the query holds: 1 for KV_SCORE_SUM (or one head), n_heads for MAX. */
uint32_t kv_score_query_n_vec(const kv_score_query *q);
uint32_t kv_score_query_head_dim(const kv_score_query *q);
/** Int8 codes of vector v (head_dim bytes; valid while q lives). */
const int8_t *kv_score_query_codes(const kv_score_query *q, uint32_t v);
/** Scale of vector v. */
float kv_score_query_scale(const kv_score_query *q, uint32_t v);
/** The rotated query that version-2 copies are scored with (its codes and scales are rc_v and
 * rs_v of THE CENTERED, ROTATED COPY); NULL when head_dim is not a power of two. Valid while q
 * lives. */
const kv_score_query *kv_score_query_rotated(const kv_score_query *q);

/* ------------------------------------------------------------------------------------------ */
/* Kernel paths                                                                                */

/** Scoring kernel. All give bit-identical scores. */
typedef enum kv_score_impl {
  KV_SCORE_IMPL_AUTO = 0,     /**< the best the CPU has (or $KVDB_SCORE_IMPL: portable|avx2|avx512) */
  KV_SCORE_IMPL_PORTABLE = 1, /**< plain C */
  KV_SCORE_IMPL_AVX2 = 2,     /**< AVX2 (vpmaddubsw) */
  KV_SCORE_IMPL_AVX512 = 3,   /**< AVX-512 BW + VNNI (vpdpbusd) */
} kv_score_impl;

/** @brief 1 if the path is compiled in and the CPU (and OS) supports it; AUTO is always 1. */
int kv_score_impl_available(kv_score_impl impl);
/** @brief What AUTO resolves to on this machine (honours $KVDB_SCORE_IMPL when available). */
kv_score_impl kv_score_impl_resolve(kv_score_impl impl);
/** @brief "portable", "avx2", "avx512vnni" or "auto". */
const char *kv_score_impl_name(kv_score_impl impl);

/**
 * @brief Scores of tokens [first, first + n) of a view into out[0..n) (materialized: n is the
 * caller's choice). impl AUTO picks the best path.
 * @return KV_SCORE_OK, KV_SCORE_EINVAL (NULL, range outside the view, head_dim mismatch),
 * KV_SCORE_EUNSUPPORTED (an explicit impl this machine lacks).
 */
kv_score_status kv_score_tokens(const kv_score_query *q, const kv_score_view *v, uint32_t first,
                                uint32_t n, kv_score_impl impl, float *out, kv_score_err *err);

/* ------------------------------------------------------------------------------------------ */
/* Streaming top-k                                                                             */

/**
 * ORDER. Token a ranks above token b when score_a > score_b, or the scores are equal and
 * pos_a < pos_b (the deterministic tie rule). The comparison is on the float's total order:
 * -0 ranks below +0 and a NaN ranks below everything (and is reported as a quiet NaN).
 * Positions must be distinct for the top k to be unique.
 */
int kv_score_better(uint32_t pos_a, float score_a, uint32_t pos_b, float score_b);

/** A <pos, score> pair: the entry of a score block (HillInfer §4.2), 8 bytes. */
typedef struct kv_score_pair {
  uint32_t pos;
  float score;
} kv_score_pair;

/**
 * A bounded top-k accumulator: candidates that beat the admission threshold are appended
 * (branch-free; 16 or 8 scores per compare on AVX-512 / AVX2) to a buffer; when it holds 2k, a
 * radix selection keeps the best k and raises the threshold to the k-th best, so a push costs
 * O(1) amortized and memory stays 16k + 2 KiB bytes (+ 16 KiB from k = 1024 on) whatever the
 * number of tokens. From k = 1024 on it also counts the admitted candidates in 4096 buckets set
 * on the range of the entries' own scores (a histogram, set up again after each selection) and
 * raises the threshold to the lowest bucket that can still hold a top-k entry as they come, so
 * it follows the running k-th best and a full buffer is emptied by one pass (issue 18). The
 * finish selects and sorts in one LSD radix pass over about k entries. Caller-owned memory.
 */
typedef struct kv_score_acc {
  uint64_t *buf;     /* 2k + 256 entries: (sortable score << 32) | ~pos; larger = better */
  uint32_t k, cap, n;
  int have_thr;
  uint64_t thr;      /* entries <= thr cannot enter */
  float thr_score;   /* float filter: a score below it cannot enter */
  uint64_t n_pushed; /* candidates offered (statistics) */
  uint32_t *hist;    /* k >= 1024: 4096 counters after buf (admitted entries per bucket) */
  uint32_t bstar;    /* the lowest bucket that can still hold a top-k entry */
  uint64_t cnt_ge;   /* admitted entries in buckets >= bstar */
  uint32_t hbase;    /* score key of bucket 0's floor */
  uint32_t hshift;   /* bucket of a key: (key - hbase) >> hshift, clamped to the counters */
  int harmed;        /* the buckets are set up (from the first k entries on) */
  uint64_t emax;     /* once set up: no entry held is above it */
} kv_score_acc;

/** @brief Memory kv_score_acc_init needs for k ((2k + 256) entries of 8 bytes, and 16 KiB of
 * counters from k = 1024 on). */
size_t kv_score_acc_bytes(uint32_t k);
/** @brief Set up an empty accumulator for the best k (k >= 1) in mem (8-byte aligned). */
kv_score_status kv_score_acc_init(kv_score_acc *acc, uint32_t k, void *mem, size_t mem_bytes,
                                  kv_score_err *err);
void kv_score_acc_push(kv_score_acc *acc, uint32_t pos, float score);
/** Push scores[i] as position pos_base + i, i < n. */
void kv_score_acc_push_scores(kv_score_acc *acc, uint32_t pos_base, const float *scores, uint32_t n);
/** Push a score block. */
void kv_score_acc_push_pairs(kv_score_acc *acc, const kv_score_pair *pairs, size_t n);
/** Push every candidate src holds (src is compacted to its best k first; src stays valid). */
void kv_score_acc_merge(kv_score_acc *acc, kv_score_acc *src);
/**
 * @brief The best min(k, candidates) in ORDER (best first) into pos[] / scores[] (either may be
 * NULL); returns their count. The accumulator stays usable (it keeps exactly those).
 */
uint32_t kv_score_acc_finish(kv_score_acc *acc, uint32_t *pos, float *scores);

/** Part of a context to score: tokens [first, first + n) of *view, token t at position
 * pos_base + t (so splitting a span keeps pos_base). */
typedef struct kv_score_span {
  const kv_score_view *view;
  uint32_t first, n;
  uint32_t pos_base;
} kv_score_span;

/** Options of kv_score_topk. Fill with kv_score_opts_init(), then change fields. */
typedef struct kv_score_opts {
  kv_score_impl impl;     /**< default AUTO */
  unsigned n_threads;     /**< 0 (default): the online CPUs, fewer for small inputs; 1: the
                               calling thread only. Workers are pthreads started and joined
                               inside the call. */
  uint64_t min_thread_bytes; /**< 0 (default 2 MiB): code bytes per extra thread at least */
} kv_score_opts;
void kv_score_opts_init(kv_score_opts *o);

/** @brief Scratch bytes kv_score_topk needs for k and the threads it may use. */
size_t kv_score_topk_scratch_bytes(uint32_t k, unsigned n_threads);

/**
 * @brief The top k tokens of the spans by score against q, streamed: tokens are scored in
 * chunks of a few hundred into a stack buffer and offered to per-thread accumulators; no
 * array of all N scores exists. out_pos/out_scores receive k entries in ORDER (best first);
 * *n_out (if not NULL) receives k. scratch may be NULL (then it is malloc'ed for the call) or
 * hold kv_score_topk_scratch_bytes(k, threads) bytes. The result does not depend on the
 * threads, the chunking or the kernel path.
 * @return KV_SCORE_OK, KV_SCORE_EINVAL (q/spans/out NULL, k = 0, k > total tokens, a span
 * outside its view, a view whose head_dim differs from q's, total > 2^32 - 1), KV_SCORE_ENOMEM,
 * KV_SCORE_EUNSUPPORTED (explicit impl unavailable).
 */
kv_score_status kv_score_topk(const kv_score_query *q, const kv_score_span *spans, size_t n_spans,
                              uint32_t k, const kv_score_opts *opts, void *scratch,
                              size_t scratch_bytes, uint32_t *out_pos, float *out_scores,
                              uint32_t *n_out, kv_score_err *err);

/* ------------------------------------------------------------------------------------------ */
/* Exact reference                                                                             */

/**
 * @brief Exact scores of n key rows (dtype kdtype, row r at keys + r * key_stride bytes) against
 * a query of n_heads heads (qdtype, head g at q + g * q_stride bytes): per head the dot product
 * in double, combined by `combine` (sum or max), rounded once to float into out[r].
 * @return KV_SCORE_OK or KV_SCORE_EINVAL.
 */
kv_score_status kv_score_exact(kv_score_dtype kdtype, const void *keys, size_t key_stride,
                               uint32_t n, uint32_t head_dim, kv_score_dtype qdtype, const void *q,
                               uint32_t n_heads, size_t q_stride, kv_score_combine combine,
                               float *out, kv_score_err *err);

/* Element conversions used by every function here (exact; round to nearest even). */
float kv_score_f16_to_f32(uint16_t h);
float kv_score_bf16_to_f32(uint16_t b);
uint16_t kv_score_f32_to_f16(float f);

#ifdef __cplusplus
}
#endif

#endif /* KV_SCORE_H */
