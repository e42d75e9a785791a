/* SPDX-License-Identifier: MIT */
/*
 * score/score_avx512.c — the AVX-512 BW + VNNI scoring kernel. Built with
 * -mavx512f -mavx512bw -mavx512vnni; score.c calls it only when the CPU reports those.
 *
 * vpdpbusd multiplies UNSIGNED bytes by SIGNED bytes. Keys are the streamed operand, so they are
 * made unsigned: int8 k ^ 0x80 = k + 128 (then dot = sum (k+128) q - 128 * sum q); int4 nibbles
 * are offset-binary already (n = c + 8: dot = sum n q - 8 * sum q). Both corrections are exact
 * integers, so the dot equals the portable one [S1]. Tokens go 16 at a time: one accumulator
 * per token, then a transpose-reduction gives the 16 dots in one vector, and the float part is
 * done 16 lanes wide with the same operations as kv_score_combine_dots (the max is a
 * greater-than compare and blend, not vmaxps, so that the operand order is explicit).
 *
 * Rows of any size: 64-byte pieces, the last one loaded with a byte mask (masked lanes read as
 * zero and never fault); zero key bytes meet zero query padding, so they add nothing after the
 * correction. Rows of 64, 128 and 256 bytes (int8 d = 64/128/256, int4 d = 128/256/512) take
 * unrolled loops without masks.
 */
#include "score_int.h"

#include <immintrin.h>

#ifndef KV_PREFETCH512
#define KV_PREFETCH512 2048
#endif

/* 16 vectors of 16 int32 partial sums -> one vector whose lane i is the sum of a[i]. */
static inline __m512i reduce16(const __m512i a[16])
{
  __m512i x[8], y[4];
  KV_UNROLL
  for (int i = 0; i < 8; i++)
    x[i] = _mm512_add_epi32(_mm512_unpacklo_epi32(a[2 * i], a[2 * i + 1]),
                            _mm512_unpackhi_epi32(a[2 * i], a[2 * i + 1]));
  KV_UNROLL
  for (int i = 0; i < 4; i++)
    y[i] = _mm512_add_epi32(_mm512_unpacklo_epi64(x[2 * i], x[2 * i + 1]),
                            _mm512_unpackhi_epi64(x[2 * i], x[2 * i + 1]));
  /* y[i]: per 128-bit lane L, the lane-L sums of tokens 4i .. 4i+3 */
  __m512i u01 = _mm512_add_epi32(_mm512_shuffle_i32x4(y[0], y[1], 0x88),
                                 _mm512_shuffle_i32x4(y[0], y[1], 0xDD));
  __m512i u23 = _mm512_add_epi32(_mm512_shuffle_i32x4(y[2], y[3], 0x88),
                                 _mm512_shuffle_i32x4(y[2], y[3], 0xDD));
  return _mm512_add_epi32(_mm512_shuffle_i32x4(u01, u23, 0x88),
                          _mm512_shuffle_i32x4(u01, u23, 0xDD));
}

/* Accumulate one 64-byte key piece into acc. */
static inline __m512i piece8(__m512i acc, __m512i kv, __m512i q)
{
  return _mm512_dpbusd_epi32(acc, _mm512_xor_si512(kv, _mm512_set1_epi8((char)0x80)), q);
}
static inline __m512i piece4(__m512i acc, __m512i kv, __m512i qlo, __m512i qhi)
{
  const __m512i m = _mm512_set1_epi8(0x0f);
  acc = _mm512_dpbusd_epi32(acc, _mm512_and_si512(kv, m), qlo);
  return _mm512_dpbusd_epi32(acc, _mm512_and_si512(_mm512_srli_epi16(kv, 4), m), qhi);
}

/* Dots of m <= 16 rows against vector v; P full pieces known at compile time when fixed != 0. */
static inline __attribute__((always_inline)) __m512i
dots16(const kv_score_query *q, uint32_t v, const uint8_t *codes, uint32_t rb, unsigned bits,
       uint32_t m, const uint32_t fixed)
{
  __m512i acc[16];
  KV_UNROLL
  for (int i = 0; i < 16; i++)
    acc[i] = _mm512_setzero_si512();
  const uint32_t P = fixed ? fixed : (rb + 63) / 64;
  const uint32_t tail = rb % 64;
  const __mmask64 last = tail ? (((__mmask64)1 << tail) - 1) : ~(__mmask64)0;
  if (bits == 8) {
    const int8_t *qv = q->q8 + (size_t)v * q->q8_stride;
    if (fixed) {
      __m512i qp[4];
      KV_UNROLL
      for (uint32_t p = 0; p < P; p++)
        qp[p] = _mm512_loadu_si512((const void *)(qv + 64 * p));
      KV_UNROLL
      for (uint32_t i = 0; i < m; i++) {
        const uint8_t *row = codes + (size_t)i * rb;
        KV_UNROLL
        for (uint32_t p = 0; p < P; p++)
          acc[i] = piece8(acc[i], _mm512_loadu_si512((const void *)(row + 64 * p)), qp[p]);
      }
    } else {
      KV_UNROLL
      for (uint32_t i = 0; i < m; i++) {
        const uint8_t *row = codes + (size_t)i * rb;
        KV_UNROLL
        for (uint32_t p = 0; p < P; p++) {
          __mmask64 mk = p + 1 == P ? last : ~(__mmask64)0;
          acc[i] = piece8(acc[i], _mm512_maskz_loadu_epi8(mk, row + 64 * p),
                          _mm512_loadu_si512((const void *)(qv + 64 * p)));
        }
      }
    }
  } else {
    const int8_t *lo = q->q4lo + (size_t)v * q->q4_stride;
    const int8_t *hi = q->q4hi + (size_t)v * q->q4_stride;
    if (fixed) {
      __m512i ql[4], qh[4];
      KV_UNROLL
      for (uint32_t p = 0; p < P; p++) {
        ql[p] = _mm512_loadu_si512((const void *)(lo + 64 * p));
        qh[p] = _mm512_loadu_si512((const void *)(hi + 64 * p));
      }
      KV_UNROLL
      for (uint32_t i = 0; i < m; i++) {
        const uint8_t *row = codes + (size_t)i * rb;
        KV_UNROLL
        for (uint32_t p = 0; p < P; p++)
          acc[i] = piece4(acc[i], _mm512_loadu_si512((const void *)(row + 64 * p)), ql[p], qh[p]);
      }
    } else {
      KV_UNROLL
      for (uint32_t i = 0; i < m; i++) {
        const uint8_t *row = codes + (size_t)i * rb;
        KV_UNROLL
        for (uint32_t p = 0; p < P; p++) {
          __mmask64 mk = p + 1 == P ? last : ~(__mmask64)0;
          acc[i] = piece4(acc[i], _mm512_maskz_loadu_epi8(mk, row + 64 * p),
                          _mm512_loadu_si512((const void *)(lo + 64 * p)),
                          _mm512_loadu_si512((const void *)(hi + 64 * p)));
        }
      }
    }
  }
  __m512i d = reduce16(acc);
  int32_t corr = q->qsum[v] * (bits == 8 ? 128 : 8);
  return _mm512_sub_epi32(d, _mm512_set1_epi32(corr));
}

/* Scores of m <= 16 rows starting at blk (m and fixed are constants after inlining for full
 * blocks, so the 16 accumulators stay in registers). */
static inline __attribute__((always_inline)) void
block16(const kv_score_query *q, const uint8_t *blk, uint32_t rb, unsigned bits,
        const float *scales, uint32_t m, float *out, const uint32_t fixed)
{
  __mmask16 mk = (__mmask16)(m == 16 ? 0xffffu : ((1u << m) - 1));
  __m512 best = _mm512_mul_ps(_mm512_cvtepi32_ps(dots16(q, 0, blk, rb, bits, m, fixed)),
                              _mm512_set1_ps(q->qscale[0]));
  for (uint32_t v = 1; v < q->n_vec; v++) {
    __m512 part = _mm512_mul_ps(_mm512_cvtepi32_ps(dots16(q, v, blk, rb, bits, m, fixed)),
                                _mm512_set1_ps(q->qscale[v]));
    __mmask16 gt = _mm512_cmp_ps_mask(part, best, _CMP_GT_OQ);
    best = _mm512_mask_blend_ps(gt, best, part);
  }
  __m512 s = _mm512_maskz_loadu_ps(mk, scales);
  _mm512_mask_storeu_ps(out, mk, _mm512_mul_ps(best, s));
}

static inline __attribute__((always_inline)) void
run_fixed(const kv_score_query *q, const uint8_t *codes, uint32_t rb, unsigned bits,
          const float *scales, uint32_t n, float *out, const uint32_t fixed)
{
  uint32_t t0 = 0;
  /* software prefetch KV_PREFETCH512 bytes ahead of the block being scored, as on AVX2: the
   * hardware prefetcher alone leaves the kernel waiting on memory (issue 18, bench/RESULTS.md).
   * A prefetch never faults, so reading ahead past the run's end is harmless. */
  const uint32_t lines = fixed ? 16 * fixed : (16 * rb + 63) / 64;
  if (bits == 8) {
    for (; t0 + 16 <= n; t0 += 16) {
      const char *pf = (const char *)(codes + (size_t)t0 * rb) + KV_PREFETCH512;
      for (uint32_t l = 0; l < lines; l++)
        _mm_prefetch(pf + 64 * (size_t)l, _MM_HINT_T0);
      block16(q, codes + (size_t)t0 * rb, rb, 8, scales + t0, 16, out + t0, fixed);
    }
  } else {
    for (; t0 + 16 <= n; t0 += 16) {
      const char *pf = (const char *)(codes + (size_t)t0 * rb) + KV_PREFETCH512;
      for (uint32_t l = 0; l < lines; l++)
        _mm_prefetch(pf + 64 * (size_t)l, _MM_HINT_T0);
      block16(q, codes + (size_t)t0 * rb, rb, 4, scales + t0, 16, out + t0, fixed);
    }
  }
  if (t0 < n)
    block16(q, codes + (size_t)t0 * rb, rb, bits, scales + t0, n - t0, out + t0, fixed);
}

void kv_score_run_avx512(const kv_score_query *q, const uint8_t *codes, uint32_t row_bytes,
                         unsigned bits, const float *scales, uint32_t n, float *out)
{
  switch (row_bytes) {
  case 64: run_fixed(q, codes, row_bytes, bits, scales, n, out, 1); break;
  case 128: run_fixed(q, codes, row_bytes, bits, scales, n, out, 2); break;
  case 256: run_fixed(q, codes, row_bytes, bits, scales, n, out, 4); break;
  default: run_fixed(q, codes, row_bytes, bits, scales, n, out, 0); break;
  }
}

/* Sortable keys of 16 scores (score.c sort_key): a non-NaN float's bits with the sign bit set
 * (positive) or all bits flipped (negative); a NaN never gets here (the ordered compare fails). */
static inline __m512i sort_keys16(__m512 v)
{
  __m512i b = _mm512_castps_si512(v);
  return _mm512_xor_si512(b, _mm512_or_si512(_mm512_srai_epi32(b, 31),
                                             _mm512_set1_epi32((int)0x80000000u)));
}

uint32_t kv_score_cand_avx512(const float *s, uint32_t m, float thr, uint32_t pos0, uint64_t *out)
{
  const __m512 t = _mm512_set1_ps(thr);
  /* entry i = (key << 32) | ~pos: 32-bit lanes (~pos_i, key_i) from the two compressed vectors */
  const __m512i lo = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
  const __m512i hi = _mm512_setr_epi32(8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31);
  const __m512i step = _mm512_set1_epi32(16);
  __m512i np = _mm512_sub_epi32(_mm512_set1_epi32((int)~pos0),
                                _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
  uint32_t c = 0, i = 0;
  for (; i + 16 <= m; i += 16) {
    __m512 v = _mm512_loadu_ps(s + i);
    __mmask16 k = _mm512_cmp_ps_mask(v, t, _CMP_GE_OQ);
    if (k) { /* usually 0 once the threshold has risen: one compare per 16 tokens */
      __m512i kc = _mm512_maskz_compress_epi32(k, sort_keys16(v));
      __m512i pc = _mm512_maskz_compress_epi32(k, np);
      /* whole vectors: lanes past the count are overwritten by the next ones or lie in the
       * caller's slack (out has room for m entries, and c + 16 <= i + 16 <= m here) */
      _mm512_storeu_si512((void *)(out + c), _mm512_permutex2var_epi32(pc, lo, kc));
      _mm512_storeu_si512((void *)(out + c + 8), _mm512_permutex2var_epi32(pc, hi, kc));
      c += (uint32_t)__builtin_popcount(k);
    }
    np = _mm512_sub_epi32(np, step);
  }
  if (i < m) {
    __mmask16 live = (__mmask16)((1u << (m - i)) - 1);
    __m512 v = _mm512_maskz_loadu_ps(live, s + i);
    __mmask16 k = _mm512_mask_cmp_ps_mask(live, v, t, _CMP_GE_OQ);
    if (k) {
      unsigned cnt = (unsigned)__builtin_popcount(k);
      __m512i kc = _mm512_maskz_compress_epi32(k, sort_keys16(v));
      __m512i pc = _mm512_maskz_compress_epi32(k, np);
      __mmask8 m0 = (__mmask8)(cnt >= 8 ? 0xff : (1u << cnt) - 1);
      __mmask8 m1 = (__mmask8)(cnt <= 8 ? 0 : (1u << (cnt - 8)) - 1);
      _mm512_mask_storeu_epi64((void *)(out + c), m0, _mm512_permutex2var_epi32(pc, lo, kc));
      _mm512_mask_storeu_epi64((void *)(out + c + 8), m1, _mm512_permutex2var_epi32(pc, hi, kc));
      c += cnt;
    }
  }
  return c;
}

uint32_t kv_score_keep_ge_avx512(uint64_t *a, uint32_t n, uint64_t thr)
{
  const __m512i t = _mm512_set1_epi64((long long)thr);
  uint32_t j = 0, i = 0;
  for (; i + 8 <= n; i += 8) {
    __m512i v = _mm512_loadu_si512((const void *)(a + i));
    __mmask8 k = _mm512_cmp_epu64_mask(v, t, _MM_CMPINT_NLT);
    /* j <= i: the whole-vector store only overwrites entries already read */
    _mm512_storeu_si512((void *)(a + j), _mm512_maskz_compress_epi64(k, v));
    j += (uint32_t)__builtin_popcount(k);
  }
  for (; i < n; i++) {
    uint64_t e = a[i];
    a[j] = e;
    j += e >= thr;
  }
  return j;
}
