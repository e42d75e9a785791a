/* SPDX-License-Identifier: MIT */
/*
 * score/score_int.h — private to score/: the query object and the kernel entry
 * points of the three paths (score.c, score_avx2.c, score_avx512.c).
 *
 * A kernel scores n CONTIGUOUS rows (row r at codes + r * row_bytes) into out[0..n). Callers
 * (score.c) split a view into such runs at page boundaries. Every kernel must produce exactly
 * the score defined in score.h ("SCORE OF TOKEN t"): the integer dot, then
 * part = (float)dot * qscale, then the greater-than max over vectors, then * scale[t].
 */
#ifndef KV_SCORE_INT_H
#define KV_SCORE_INT_H

#include "score.h"

/* Full unrolling of the kernels' per-row and per-chunk loops: the row count and the chunks per
 * row are constants after inlining, and gcc then keeps every accumulator in a register. Only
 * for gcc: clang unrolls on its own, and with the pragma its sanitizer builds took over nine
 * minutes (and 2.7 GB) to compile score_avx512.c instead of 8 s. */
#if defined(__GNUC__) && !defined(__clang__)
#define KV_UNROLL _Pragma("GCC unroll 16")
#else
#define KV_UNROLL
#endif

struct kv_score_query {
  uint32_t n_vec;    /* quantized vectors: 1 (SUM or one head) or n_heads (MAX) */
  uint32_t n_heads;  /* query heads given */
  uint32_t head_dim;
  uint32_t combine;
  uint32_t q8_stride; /* bytes between vectors in q8: head_dim rounded up to 64 */
  uint32_t q4_stride; /* bytes between vectors in q4lo/q4hi: head_dim/2 rounded up to 64 */
  int8_t *q8;        /* n_vec x q8_stride, zero padded */
  int8_t *q4lo;      /* q4lo[b] = q8[2b]: the query element of the low nibble of key byte b */
  int8_t *q4hi;      /* q4hi[b] = q8[2b + 1] */
  int32_t *qsum;     /* per vector: sum of its codes */
  float *qscale;     /* per vector */
  struct kv_score_query *rot; /* the rotated query (score.h THE CENTERED, ROTATED COPY): its
                                 vectors are H x_v, quantized; NULL when head_dim is not a power
                                 of two (version-2 copies need one) or in the rotated one itself */
};

typedef void (*kv_score_kernel_fn)(const kv_score_query *q, const uint8_t *codes,
                                   uint32_t row_bytes, unsigned bits, const float *scales,
                                   uint32_t n, float *out);

void kv_score_run_portable(const kv_score_query *q, const uint8_t *codes, uint32_t row_bytes,
                           unsigned bits, const float *scales, uint32_t n, float *out);
#ifdef KV_SCORE_HAVE_AVX2
void kv_score_run_avx2(const kv_score_query *q, const uint8_t *codes, uint32_t row_bytes,
                       unsigned bits, const float *scales, uint32_t n, float *out);
/* kv_score_cand_avx512's contract, 8 scores per compare. */
uint32_t kv_score_cand_avx2(const float *s, uint32_t m, float thr, uint32_t pos0, uint64_t *out);
#endif
#ifdef KV_SCORE_HAVE_AVX512
void kv_score_run_avx512(const kv_score_query *q, const uint8_t *codes, uint32_t row_bytes,
                         unsigned bits, const float *scales, uint32_t n, float *out);
/* The accumulator's candidates, 16 scores per compare: for each j < m, in ascending order, with
 * s[j] >= thr (ordered: a NaN never passes), writes the entry (sort key of s[j] << 32) |
 * ~(pos0 + j) to out[0..) and returns their count. out must have room for m entries. The same
 * entries as score.c's scalar loop (cand_scalar). */
uint32_t kv_score_cand_avx512(const float *s, uint32_t m, float thr, uint32_t pos0, uint64_t *out);
/* Keep the entries a[i] >= thr of a[0..n) (in order, in place); returns how many. */
uint32_t kv_score_keep_ge_avx512(uint64_t *a, uint32_t n, uint64_t thr);
#endif

/* The float part of a score, shared by every path for the scalar tails: dots[v] are the exact
 * integer dots of one token against the n_vec vectors. */
static inline float kv_score_combine_dots(const kv_score_query *q, const int32_t *dots,
                                          float scale)
{
  float m = (float)dots[0] * q->qscale[0];
  for (uint32_t v = 1; v < q->n_vec; v++) {
    float part = (float)dots[v] * q->qscale[v];
    m = part > m ? part : m;
  }
  return m * scale;
}

/* Exact integer dot of one row against vector v (the portable definition). */
static inline int32_t kv_score_dot_row(const kv_score_query *q, uint32_t v, const uint8_t *row,
                                       uint32_t row_bytes, unsigned bits)
{
  int32_t dot = 0;
  if (bits == 8) {
    const int8_t *qv = q->q8 + (size_t)v * q->q8_stride;
    for (uint32_t j = 0; j < row_bytes; j++)
      dot += (int32_t)qv[j] * (int32_t)(int8_t)row[j];
  } else {
    const int8_t *lo = q->q4lo + (size_t)v * q->q4_stride;
    const int8_t *hi = q->q4hi + (size_t)v * q->q4_stride;
    for (uint32_t b = 0; b < row_bytes; b++) {
      int32_t c = row[b];
      dot += (int32_t)lo[b] * ((c & 15) - 8) + (int32_t)hi[b] * ((c >> 4) - 8);
    }
  }
  return dot;
}

#endif
