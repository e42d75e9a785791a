/* SPDX-License-Identifier: MIT */
/*
 * score/score_avx2.c — the AVX2 scoring kernel. Built with -mavx2; score.c calls it only
 * when the CPU reports AVX2.
 *
 * vpmaddubsw multiplies unsigned by signed bytes and adds pairs into SATURATING int16. int8:
 * |k| * (q with k's sign) is k*q exactly, and a pair is at most 2 * 128 * 127 = 32512 < 32767,
 * so nothing saturates (query codes are in [-127, 127] by construction). int4: the offset-binary
 * nibbles (0..15) times q, two pairs at most 4 * 15 * 127 = 7620; the 8 * sum q bias is removed
 * afterwards. vpmaddwd then widens to int32. The dot is exact and equals the portable one [S1].
 * Tokens go 8 at a time (one accumulator each, then a transpose-reduction); bytes of a row past
 * its last full 32-byte piece are added by scalar code.
 */
#include "score_int.h"

#include <immintrin.h>
#include <string.h>

#ifndef KV_PREFETCH
#define KV_PREFETCH 1024
#endif

static inline __m256i reduce8(const __m256i a[8])
{
  __m256i x[4];
  KV_UNROLL
  for (int i = 0; i < 4; i++)
    x[i] = _mm256_add_epi32(_mm256_unpacklo_epi32(a[2 * i], a[2 * i + 1]),
                            _mm256_unpackhi_epi32(a[2 * i], a[2 * i + 1]));
  __m256i y0 = _mm256_add_epi32(_mm256_unpacklo_epi64(x[0], x[1]), _mm256_unpackhi_epi64(x[0], x[1]));
  __m256i y1 = _mm256_add_epi32(_mm256_unpacklo_epi64(x[2], x[3]), _mm256_unpackhi_epi64(x[2], x[3]));
  return _mm256_add_epi32(_mm256_permute2x128_si256(y0, y1, 0x20),
                          _mm256_permute2x128_si256(y0, y1, 0x31));
}

static inline __attribute__((always_inline)) __m256i
dots8(const kv_score_query *q, uint32_t v, const uint8_t *blk, uint32_t rb, unsigned bits,
      uint32_t m, const uint32_t fixed, int32_t corr4)
{
  const __m256i ones = _mm256_set1_epi16(1);
  __m256i acc[8];
  KV_UNROLL
  for (int i = 0; i < 8; i++)
    acc[i] = _mm256_setzero_si256();
  const uint32_t P = fixed ? fixed : rb / 32;
  if (bits == 8) {
    const int8_t *qv = q->q8 + (size_t)v * q->q8_stride;
    KV_UNROLL
    for (uint32_t i = 0; i < m; i++) {
      const uint8_t *row = blk + (size_t)i * rb;
      KV_UNROLL
      for (uint32_t p = 0; p < P; p++) {
        __m256i kv = _mm256_loadu_si256((const __m256i *)(const void *)(row + 32 * p));
        __m256i qq = _mm256_loadu_si256((const __m256i *)(const void *)(qv + 32 * p));
        __m256i pr = _mm256_maddubs_epi16(_mm256_abs_epi8(kv), _mm256_sign_epi8(qq, kv));
        acc[i] = _mm256_add_epi32(acc[i], _mm256_madd_epi16(pr, ones));
      }
    }
  } else {
    const __m256i mk = _mm256_set1_epi8(0x0f);
    const int8_t *lo = q->q4lo + (size_t)v * q->q4_stride;
    const int8_t *hi = q->q4hi + (size_t)v * q->q4_stride;
    KV_UNROLL
    for (uint32_t i = 0; i < m; i++) {
      const uint8_t *row = blk + (size_t)i * rb;
      KV_UNROLL
      for (uint32_t p = 0; p < P; p++) {
        __m256i kv = _mm256_loadu_si256((const __m256i *)(const void *)(row + 32 * p));
        __m256i ql = _mm256_loadu_si256((const __m256i *)(const void *)(lo + 32 * p));
        __m256i qh = _mm256_loadu_si256((const __m256i *)(const void *)(hi + 32 * p));
        __m256i pr = _mm256_add_epi16(
            _mm256_maddubs_epi16(_mm256_and_si256(kv, mk), ql),
            _mm256_maddubs_epi16(_mm256_and_si256(_mm256_srli_epi16(kv, 4), mk), qh));
        acc[i] = _mm256_add_epi32(acc[i], _mm256_madd_epi16(pr, ones));
      }
    }
  }
  __m256i d = reduce8(acc);
  if (bits == 4)
    d = _mm256_sub_epi32(d, _mm256_set1_epi32(corr4));
  if (32 * P < rb) { /* scalar tail of each row */
    int32_t t[8];
    _mm256_storeu_si256((__m256i *)(void *)t, d);
    KV_UNROLL
    for (uint32_t i = 0; i < m; i++) {
      const uint8_t *row = blk + (size_t)i * rb;
      if (bits == 8) {
        const int8_t *qv = q->q8 + (size_t)v * q->q8_stride;
        for (uint32_t j = 32 * P; j < rb; j++)
          t[i] += (int32_t)qv[j] * (int32_t)(int8_t)row[j];
      } else {
        const int8_t *lo = q->q4lo + (size_t)v * q->q4_stride;
        const int8_t *hi = q->q4hi + (size_t)v * q->q4_stride;
        for (uint32_t b = 32 * P; b < rb; b++) {
          int32_t c = row[b];
          t[i] += (int32_t)lo[b] * ((c & 15) - 8) + (int32_t)hi[b] * ((c >> 4) - 8);
        }
      }
    }
    d = _mm256_loadu_si256((const __m256i *)(const void *)t);
  }
  return d;
}

static inline __attribute__((always_inline)) void
block8(const kv_score_query *q, const uint8_t *blk, uint32_t rb, unsigned bits,
       const float *scales, float *out, const uint32_t fixed, const int32_t *corr4)
{
  __m256 best = _mm256_mul_ps(_mm256_cvtepi32_ps(dots8(q, 0, blk, rb, bits, 8, fixed, corr4[0])),
                              _mm256_set1_ps(q->qscale[0]));
  for (uint32_t v = 1; v < q->n_vec; v++) {
    __m256 part = _mm256_mul_ps(_mm256_cvtepi32_ps(dots8(q, v, blk, rb, bits, 8, fixed, corr4[v])),
                                _mm256_set1_ps(q->qscale[v]));
    best = _mm256_blendv_ps(best, part, _mm256_cmp_ps(part, best, _CMP_GT_OQ));
  }
  _mm256_storeu_ps(out, _mm256_mul_ps(best, _mm256_loadu_ps(scales)));
}

static inline __attribute__((always_inline)) void
run_fixed(const kv_score_query *q, const uint8_t *codes, uint32_t rb, unsigned bits,
          const float *scales, uint32_t n, float *out, const uint32_t fixed, const int32_t *corr4)
{
  uint32_t t0 = 0;
  /* software prefetch KV_PREFETCH bytes ahead of the block being scored: the kernel is near its
   * compute bound, and the hardware prefetcher alone leaves it waiting on memory (issue 18:
   * int8 d 128 from DRAM 7.9 -> 9.x GB/s on a 2-core EPYC). A prefetch never faults, so reading
   * ahead past the run's end is harmless. */
  const uint32_t lines = fixed ? 8 * fixed * 32 / 64 : (8 * rb + 63) / 64;
  if (bits == 8) {
    for (; t0 + 8 <= n; t0 += 8) {
      const char *pf = (const char *)(codes + (size_t)t0 * rb) + KV_PREFETCH;
      for (uint32_t l = 0; l < lines; l++)
        _mm_prefetch(pf + 64 * (size_t)l, _MM_HINT_T0);
      block8(q, codes + (size_t)t0 * rb, rb, 8, scales + t0, out + t0, fixed, corr4);
    }
  } else {
    for (; t0 + 8 <= n; t0 += 8) {
      const char *pf = (const char *)(codes + (size_t)t0 * rb) + KV_PREFETCH;
      for (uint32_t l = 0; l < lines; l++)
        _mm_prefetch(pf + 64 * (size_t)l, _MM_HINT_T0);
      block8(q, codes + (size_t)t0 * rb, rb, 4, scales + t0, out + t0, fixed, corr4);
    }
  }
  if (t0 < n) { /* fewer than 8 rows: integer dots by the vector code, float part per token */
    uint32_t m = n - t0;
    int32_t dots[KV_SCORE_MAX_Q_HEADS][8];
    for (uint32_t v = 0; v < q->n_vec; v++)
      _mm256_storeu_si256((__m256i *)(void *)dots[v],
                          dots8(q, v, codes + (size_t)t0 * rb, rb, bits, m, fixed, corr4[v]));
    int32_t d[KV_SCORE_MAX_Q_HEADS];
    KV_UNROLL
    for (uint32_t i = 0; i < m; i++) {
      for (uint32_t v = 0; v < q->n_vec; v++)
        d[v] = dots[v][i];
      out[t0 + i] = kv_score_combine_dots(q, d, scales[t0 + i]);
    }
  }
}

void kv_score_run_avx2(const kv_score_query *q, const uint8_t *codes, uint32_t row_bytes,
                       unsigned bits, const float *scales, uint32_t n, float *out)
{
  int32_t corr4[KV_SCORE_MAX_Q_HEADS];
  uint32_t vec_bytes = row_bytes / 32 * 32;
  for (uint32_t v = 0; v < q->n_vec; v++) {
    int32_t s = 0;
    if (bits == 4)
      for (uint32_t b = 0; b < vec_bytes; b++)
        s += q->q4lo[(size_t)v * q->q4_stride + b] + q->q4hi[(size_t)v * q->q4_stride + b];
    corr4[v] = 8 * s;
  }
  switch (row_bytes) {
  case 64: run_fixed(q, codes, row_bytes, bits, scales, n, out, 2, corr4); break;
  case 128: run_fixed(q, codes, row_bytes, bits, scales, n, out, 4, corr4); break;
  default: run_fixed(q, codes, row_bytes, bits, scales, n, out, 0, corr4); break;
  }
}

static inline uint64_t cand_entry(const float *s, uint32_t j, uint32_t pos0)
{
  uint32_t b;
  memcpy(&b, &s[j], 4);
  uint32_t key = b ^ ((uint32_t)((int32_t)b >> 31) | 0x80000000u); /* not a NaN when kept */
  return ((uint64_t)key << 32) | (uint32_t)~(pos0 + j);
}

uint32_t kv_score_cand_avx2(const float *s, uint32_t m, float thr, uint32_t pos0, uint64_t *out)
{
  const __m256 t = _mm256_set1_ps(thr);
  uint32_t c = 0, i = 0;
  for (; i + 8 <= m; i += 8) {
    unsigned k = (unsigned)_mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(s + i), t, _CMP_GE_OQ));
    if (k == 0) /* usual once the threshold has risen: one compare per 8 tokens */
      continue;
    /* branch-free within the group: a third of the tokens pass early in a k = 10% scan, too
     * many for a loop over the mask's bits to predict */
    for (unsigned l = 0; l < 8; l++) {
      out[c] = cand_entry(s, i + l, pos0);
      c += (k >> l) & 1u;
    }
  }
  for (; i < m; i++) {
    out[c] = cand_entry(s, i, pos0);
    c += s[i] >= thr;
  }
  return c;
}
