/* SPDX-License-Identifier: MIT */
/*
 * score/cuda/score_cuda.cu — the CUDA scorer of score_cuda.h: the scoring kernel, the
 * device radix select of the top k, the host driver, and the host emulation of both.
 *
 * INVARIANTS
 *   C1. The score of a token is computed by ONE function, kvc_score_token(), compiled for the
 *       device and for the host (the emulation); it performs score.h "SCORE OF TOKEN t": an
 *       exact int32 dot (any summation order: integers), __int2float_rn + __fmul_rn per query
 *       vector, the greater-than max, __fmul_rn by the token scale. No other float operation.
 *   C2. The order entry of a token is kvc_entry() = sortable(score) << 32 | ~pos: the CPU
 *       accumulator's key (score.c entry_of), so "larger entry" is score.h ORDER exactly.
 *   C3. The radix select (kvc_select) only ever takes entries by comparing their masked top bits
 *       with the chosen prefix, and it checks every histogram's total against the count it
 *       expects (a device fault shows as an error, not as a wrong top k).
 *   C4. Nothing is left on the device or in flight when a call returns.
 */
#include "score_cuda.h"

#include <cuda_runtime.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------------------------------ */
/* Errors                                                                                      */

static kv_score_status kvc_fail(kv_score_err *err, kv_score_status code, const char *what,
                                uint64_t value, uint64_t limit, int line)
{
  if (err != NULL) {
    err->code = code;
    err->what = what;
    err->value = value;
    err->limit = limit;
    err->file = __FILE__;
    err->line = line;
  }
  return code;
}
#define FAIL(err, code, what, value, limit)                                                        \
  kvc_fail((err), (code), (what), (uint64_t)(value), (uint64_t)(limit), __LINE__)

/* A CUDA runtime error of `call`: out of memory is ENOMEM, anything else EUNSUPPORTED. The
 * non-sticky error state is cleared so that the thread's next CUDA call does not see it. */
#define CUDA_FAIL(err, e, what_text)                                                               \
  ((void)cudaGetLastError(),                                                                       \
   (e) == cudaErrorMemoryAllocation                                                                \
       ? FAIL(err, KV_SCORE_ENOMEM, what_text " (value: cudaError_t)", (e), 0)                     \
       : FAIL(err, KV_SCORE_EUNSUPPORTED, what_text " (value: cudaError_t)", (e), 0))

/* ------------------------------------------------------------------------------------------ */
/* Code shared by the device and the host emulation                                            */

#define KVC_HD __host__ __device__

/* The query as the kernels read it (device or host pointers into one packed buffer). */
typedef struct kvc_query {
  const int8_t *q8;    /* n_vec x s8: the int8 codes of each vector */
  const int8_t *q4lo;  /* n_vec x s4: q4lo[b] = q8[2b] (element of the low nibble of byte b) */
  const int8_t *q4hi;  /* n_vec x s4: q4hi[b] = q8[2b + 1] */
  const int32_t *qsum; /* n_vec: sum of the codes (the int4 word path's bias) */
  const float *qscale; /* n_vec */
  uint32_t s8, s4, n_vec, head_dim;
} kvc_query;

/* The keys of one view. */
typedef struct kvc_keys {
  const uint8_t *codes; /* first code page */
  const float *scales;
  uint32_t row_bytes, page_tokens, bits;
  int words; /* rows are read as 4-byte words: row_bytes % 4 == 0 and codes 4-aligned */
} kvc_keys;

KVC_HD static inline uint32_t kvc_load32(const uint8_t *p)
{
#ifdef __CUDA_ARCH__
  return *(const uint32_t *)(const void *)p; /* 4-aligned (kvc_keys.words, query strides) */
#else
  uint32_t w;
  memcpy(&w, p, 4);
  return w;
#endif
}

/* c + sum over the 4 bytes of a and b as signed bytes: exact. */
KVC_HD static inline int32_t kvc_dp4(uint32_t a, uint32_t b, int32_t c)
{
#ifdef __CUDA_ARCH__
  return __dp4a((int)a, (int)b, c);
#else
  for (unsigned i = 0; i < 32; i += 8)
    c += (int32_t)(int8_t)(uint8_t)(a >> i) * (int32_t)(int8_t)(uint8_t)(b >> i);
  return c;
#endif
}

KVC_HD static inline float kvc_mul(float a, float b)
{
#ifdef __CUDA_ARCH__
  return __fmul_rn(a, b); /* never contracted, round to nearest even, denormals kept */
#else
  return a * b;
#endif
}

KVC_HD static inline float kvc_i2f(int32_t x)
{
#ifdef __CUDA_ARCH__
  return __int2float_rn(x);
#else
  return (float)x;
#endif
}

KVC_HD static inline uint32_t kvc_f2u(float f)
{
#ifdef __CUDA_ARCH__
  return __float_as_uint(f);
#else
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
#endif
}

/* The exact integer dot of row `row` against query vector v. */
KVC_HD static inline int32_t kvc_dot(const kvc_query *q, const kvc_keys *k, uint32_t v,
                                     const uint8_t *row)
{
  int32_t dot = 0;
  uint32_t rb = k->row_bytes;
  if (k->bits == 8) {
    const int8_t *qv = q->q8 + (size_t)v * q->s8;
    if (k->words) {
      for (uint32_t j = 0; j < rb; j += 4)
        dot = kvc_dp4(kvc_load32((const uint8_t *)qv + j), kvc_load32(row + j), dot);
    } else {
      for (uint32_t j = 0; j < rb; j++)
        dot += (int32_t)qv[j] * (int32_t)(int8_t)row[j];
    }
  } else {
    const int8_t *lo = q->q4lo + (size_t)v * q->s4, *hi = q->q4hi + (size_t)v * q->s4;
    if (k->words) {
      /* nibbles n in 0..15 are non-negative signed bytes: sum q * (n - 8) = dp4(q, n) - 8 sum q */
      for (uint32_t b = 0; b < rb; b += 4) {
        uint32_t w = kvc_load32(row + b);
        dot = kvc_dp4(kvc_load32((const uint8_t *)lo + b), w & 0x0f0f0f0fu, dot);
        dot = kvc_dp4(kvc_load32((const uint8_t *)hi + b), (w >> 4) & 0x0f0f0f0fu, dot);
      }
      dot -= 8 * q->qsum[v];
    } else {
      for (uint32_t b = 0; b < rb; b++) {
        int32_t c = row[b];
        dot += (int32_t)lo[b] * ((c & 15) - 8) + (int32_t)hi[b] * ((c >> 4) - 8);
      }
    }
  }
  return dot;
}

/* score.h "SCORE OF TOKEN t" (C1). */
KVC_HD static inline float kvc_score_token(const kvc_query *q, const kvc_keys *k, uint32_t t)
{
  const uint8_t *row = k->codes + (size_t)(t / k->page_tokens) * KV_SCORE_PAGE_BYTES +
                       (size_t)(t % k->page_tokens) * k->row_bytes;
  float m = kvc_mul(kvc_i2f(kvc_dot(q, k, 0, row)), q->qscale[0]);
  for (uint32_t v = 1; v < q->n_vec; v++) {
    float part = kvc_mul(kvc_i2f(kvc_dot(q, k, v, row)), q->qscale[v]);
    m = part > m ? part : m;
  }
  return kvc_mul(m, k->scales[t]);
}

/* The order entry (C2): score.c sort_key / entry_of. */
KVC_HD static inline uint64_t kvc_entry(uint32_t pos, float score)
{
  uint32_t b = kvc_f2u(score), key;
  if ((b & 0x7fffffffu) > 0x7f800000u)
    key = 0; /* NaN: below everything */
  else
    key = (b & 0x80000000u) ? ~b : (b | 0x80000000u);
  return ((uint64_t)key << 32) | (uint32_t)~pos;
}

/* The histogram digit of entry e at `shift` when its bits under `mask` equal `prefix`, else -1. */
KVC_HD static inline int kvc_hist_digit(uint64_t e, uint64_t prefix, uint64_t mask, unsigned shift)
{
  return (e & mask) == prefix ? (int)((e >> shift) & 255u) : -1;
}

/* 1: e is above the selected prefix (taken), 0: equal to it (taken while needed), -1: below. */
KVC_HD static inline int kvc_class(uint64_t e, uint64_t prefix, uint64_t mask)
{
  uint64_t m = e & mask;
  return m > prefix ? 1 : m == prefix ? 0 : -1;
}

/* ------------------------------------------------------------------------------------------ */
/* Kernels                                                                                     */

#define KVC_THREADS 256u
#define KVC_MAX_BLOCKS 4096u

__global__ void kvc_k_entries(kvc_query q, kvc_keys k, uint32_t first, uint32_t n,
                              uint32_t pos_base, uint64_t *ent)
{
  uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) {
    uint32_t t = first + i;
    ent[i] = kvc_entry(pos_base + t, kvc_score_token(&q, &k, t));
  }
}

__global__ void kvc_k_scores(kvc_query q, kvc_keys k, uint32_t first, uint32_t n, float *out)
{
  uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n)
    out[i] = kvc_score_token(&q, &k, first + i);
}

__global__ void kvc_k_hist(const uint64_t *ent, uint64_t n, uint64_t prefix, uint64_t mask,
                           unsigned shift, unsigned *hist)
{
  __shared__ unsigned h[256];
  for (unsigned i = threadIdx.x; i < 256; i += blockDim.x)
    h[i] = 0;
  __syncthreads();
  uint64_t stride = (uint64_t)gridDim.x * blockDim.x;
  for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
    int d = kvc_hist_digit(ent[i], prefix, mask, shift);
    if (d >= 0)
      atomicAdd(&h[d], 1u);
  }
  __syncthreads();
  for (unsigned i = threadIdx.x; i < 256; i += blockDim.x)
    if (h[i] != 0)
      atomicAdd(&hist[i], h[i]);
}

/* cnt[0] counts entries above the prefix (slots [0, n_gt)), cnt[1] those equal to it (slots
 * [n_gt, n_gt + need), the first `need` to arrive). */
__global__ void kvc_k_collect(const uint64_t *ent, uint64_t n, uint64_t prefix, uint64_t mask,
                              uint32_t n_gt, uint32_t need, uint64_t *out, unsigned *cnt)
{
  uint64_t stride = (uint64_t)gridDim.x * blockDim.x;
  for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
    uint64_t e = ent[i];
    int c = kvc_class(e, prefix, mask);
    if (c > 0) {
      unsigned j = atomicAdd(&cnt[0], 1u);
      if (j < n_gt)
        out[j] = e;
    } else if (c == 0) {
      unsigned j = atomicAdd(&cnt[1], 1u);
      if (j < need)
        out[n_gt + j] = e;
    }
  }
}

/* ------------------------------------------------------------------------------------------ */
/* Host helpers shared by the device path and the emulation                                    */

static uint32_t round_up(uint32_t x, uint32_t a)
{
  return (x + a - 1) / a * a;
}

/* The packed query: q8 | q4lo | q4hi | qsum | qscale, each part 16-byte aligned. */
typedef struct kvc_qpack {
  uint8_t *host;
  size_t bytes;
  size_t off_q4lo, off_q4hi, off_qsum, off_qscale;
  uint32_t s8, s4, n_vec, head_dim;
} kvc_qpack;

static kv_score_status kvc_pack_query(const kv_score_query *q, kvc_qpack *p, kv_score_err *err)
{
  memset(p, 0, sizeof *p);
  p->n_vec = kv_score_query_n_vec(q);
  p->head_dim = kv_score_query_head_dim(q);
  p->s8 = round_up(p->head_dim, 16);
  p->s4 = round_up(p->head_dim / 2 > 0 ? p->head_dim / 2 : 1, 16);
  size_t n = p->n_vec;
  p->off_q4lo = n * p->s8;
  p->off_q4hi = p->off_q4lo + n * p->s4;
  p->off_qsum = p->off_q4hi + n * p->s4;
  p->off_qscale = p->off_qsum + (n * 4 + 15) / 16 * 16;
  p->bytes = p->off_qscale + (n * 4 + 15) / 16 * 16;
  p->host = (uint8_t *)calloc(1, p->bytes);
  if (p->host == NULL)
    return FAIL(err, KV_SCORE_ENOMEM, "out of host memory for the packed query", p->bytes, 0);
  for (uint32_t v = 0; v < p->n_vec; v++) {
    const int8_t *c = kv_score_query_codes(q, v);
    int8_t *q8 = (int8_t *)p->host + (size_t)v * p->s8;
    int8_t *lo = (int8_t *)(p->host + p->off_q4lo) + (size_t)v * p->s4;
    int8_t *hi = (int8_t *)(p->host + p->off_q4hi) + (size_t)v * p->s4;
    int32_t sum = 0;
    memcpy(q8, c, p->head_dim);
    for (uint32_t j = 0; j < p->head_dim; j++)
      sum += c[j];
    for (uint32_t b = 0; b < p->head_dim / 2; b++) {
      lo[b] = c[2 * b];
      hi[b] = c[2 * b + 1];
    }
    float s = kv_score_query_scale(q, v);
    memcpy(p->host + p->off_qsum + 4 * (size_t)v, &sum, 4);
    memcpy(p->host + p->off_qscale + 4 * (size_t)v, &s, 4);
  }
  return KV_SCORE_OK;
}

/* The kernels' view of a packed query at `base` (the host buffer or its device copy). */
static kvc_query kvc_query_at(const kvc_qpack *p, const uint8_t *base)
{
  kvc_query q;
  q.q8 = (const int8_t *)base;
  q.q4lo = (const int8_t *)(base + p->off_q4lo);
  q.q4hi = (const int8_t *)(base + p->off_q4hi);
  q.qsum = (const int32_t *)(const void *)(base + p->off_qsum);
  q.qscale = (const float *)(const void *)(base + p->off_qscale);
  q.s8 = p->s8;
  q.s4 = p->s4;
  q.n_vec = p->n_vec;
  q.head_dim = p->head_dim;
  return q;
}

static kvc_keys kvc_keys_of(const kv_score_layout *l, const uint8_t *codes, const float *scales)
{
  kvc_keys k;
  k.codes = codes;
  k.scales = scales;
  k.row_bytes = l->row_bytes;
  k.page_tokens = l->page_tokens;
  k.bits = l->bits;
  k.words = l->row_bytes % 4 == 0 && (uintptr_t)codes % 4 == 0;
  return k;
}

/* A layout must be exactly what kv_score_layout_init gives for its shape: the kernels trust it. */
static kv_score_status kvc_check_layout(const kv_score_layout *l, kv_score_err *err)
{
  kv_score_layout want;
  if (l->variant != 0)
    return FAIL(err, KV_SCORE_EUNSUPPORTED,
                "centered (version 2) score copies are scored on the CPU only", l->variant, 0);
  if (kv_score_layout_init(&want, l->n_tokens, l->head_dim, l->bits, NULL) != KV_SCORE_OK ||
      memcmp(&want, l, sizeof want) != 0)
    return FAIL(err, KV_SCORE_EINVAL,
                "view layout is not the one kv_score_layout_init gives for its shape", 0, 0);
  return KV_SCORE_OK;
}

/* A span reduced to what the checks and the drivers need (host or device views alike). */
typedef struct kvc_span {
  const kv_score_layout *layout;
  const uint8_t *codes;
  const float *scales;
  int device;
  uint32_t first, n, pos_base;
} kvc_span;

static kv_score_status kvc_check_spans(const kv_score_query *q, const kvc_span *sp, size_t n_spans,
                                       uint32_t k, int want_outputs, uint64_t *total_out,
                                       kv_score_err *err)
{
  if (q == NULL)
    return FAIL(err, KV_SCORE_EINVAL, "NULL query", 0, 0);
  if (!want_outputs)
    return FAIL(err, KV_SCORE_EINVAL, "NULL outputs (both positions and scores)", 0, 0);
  if (k == 0)
    return FAIL(err, KV_SCORE_EINVAL, "k is 0", 0, 1);
  uint64_t total = 0;
  for (size_t s = 0; s < n_spans; s++) {
    if (sp[s].layout == NULL || sp[s].codes == NULL || sp[s].scales == NULL)
      return FAIL(err, KV_SCORE_EINVAL, "NULL view or view without codes (value: span)", s, 0);
    kv_score_status rc = kvc_check_layout(sp[s].layout, err);
    if (rc != KV_SCORE_OK)
      return rc;
    if (sp[s].layout->head_dim != kv_score_query_head_dim(q))
      return FAIL(err, KV_SCORE_EINVAL, "view head_dim differs from the query's",
                  sp[s].layout->head_dim, kv_score_query_head_dim(q));
    if (sp[s].device != sp[0].device)
      return FAIL(err, KV_SCORE_EINVAL, "spans on different CUDA devices (value: span)", s, 0);
    if ((uint64_t)sp[s].first + sp[s].n > sp[s].layout->n_tokens)
      return FAIL(err, KV_SCORE_EINVAL, "span past the end of its view (value: span)", s,
                  sp[s].layout->n_tokens);
    if ((uint64_t)sp[s].pos_base + sp[s].first + sp[s].n > (uint64_t)UINT32_MAX + 1)
      return FAIL(err, KV_SCORE_EINVAL, "span positions exceed 32 bits (value: span)", s, 0);
    total += sp[s].n;
  }
  if (total > UINT32_MAX)
    return FAIL(err, KV_SCORE_EINVAL, "more than 2^32 - 1 tokens", total, UINT32_MAX);
  if (k > total)
    return FAIL(err, KV_SCORE_EINVAL, "k is larger than the number of tokens", k, total);
  *total_out = total;
  return KV_SCORE_OK;
}

static kv_score_status kvc_check_range(const kv_score_query *q, const kv_score_layout *l,
                                       const void *codes, const void *scales, uint32_t first,
                                       uint32_t n, const float *out, kv_score_err *err)
{
  if (q == NULL || out == NULL)
    return FAIL(err, KV_SCORE_EINVAL, "NULL query or output", 0, 0);
  if (l == NULL || codes == NULL || scales == NULL)
    return FAIL(err, KV_SCORE_EINVAL, "NULL view or view without codes", 0, 0);
  kv_score_status rc = kvc_check_layout(l, err);
  if (rc != KV_SCORE_OK)
    return rc;
  if (l->head_dim != kv_score_query_head_dim(q))
    return FAIL(err, KV_SCORE_EINVAL, "view head_dim differs from the query's", l->head_dim,
                kv_score_query_head_dim(q));
  if ((uint64_t)first + n > l->n_tokens)
    return FAIL(err, KV_SCORE_EINVAL, "token range past the end of the view", (uint64_t)first + n,
                l->n_tokens);
  return KV_SCORE_OK;
}

/* The MSB radix select over the entries, whatever holds them (the device or the emulation). */
typedef struct kvc_sel_ops {
  /* hist[d] = number of entries e with (e & mask) == prefix and digit (e >> shift) & 255 == d */
  kv_score_status (*hist)(void *ctx, uint64_t prefix, uint64_t mask, unsigned shift,
                          uint32_t hist[256], kv_score_err *err);
  /* out[0..n_gt + need) (host) <- the entries above the prefix, then `need` equal to it;
   * cnt[0], cnt[1] <- how many of each there were */
  kv_score_status (*collect)(void *ctx, uint64_t prefix, uint64_t mask, uint32_t n_gt,
                             uint32_t need, uint64_t *out, uint32_t cnt[2], kv_score_err *err);
} kvc_sel_ops;

/* The digit b to descend into: above = the entries of digits > b; above < need <= above + h[b]. */
static void kvc_pick_digit(const uint32_t hist[256], uint32_t need, unsigned *b_out,
                           uint32_t *above_out)
{
  uint64_t cum = 0;
  unsigned b = 255;
  for (;; b--) {
    if (cum + hist[b] >= need || b == 0)
      break;
    cum += hist[b];
  }
  *b_out = b;
  *above_out = (uint32_t)cum;
}

static kv_score_status kvc_select(const kvc_sel_ops *ops, void *ctx, uint64_t n, uint32_t k,
                                  uint64_t *out, kv_score_err *err)
{
  uint64_t prefix = 0, mask = 0, avail = n;
  uint32_t need = k;
  for (unsigned pass = 0; pass < 8; pass++) {
    unsigned shift = 56 - 8 * pass, b;
    uint32_t h[256], above;
    kv_score_status rc = ops->hist(ctx, prefix, mask, shift, h, err);
    if (rc != KV_SCORE_OK)
      return rc;
    uint64_t sum = 0;
    for (unsigned d = 0; d < 256; d++)
      sum += h[d];
    if (sum != avail) /* C3 */
      return FAIL(err, KV_SCORE_EUNSUPPORTED,
                  "device top-k histogram does not add up (value: its total)", sum, avail);
    kvc_pick_digit(h, need, &b, &above);
    need -= above;
    prefix |= (uint64_t)b << shift;
    mask |= (uint64_t)255 << shift;
    avail = h[b];
    if (avail == need)
      break; /* every entry with this prefix is in */
  }
  uint32_t cnt[2] = {0, 0};
  kv_score_status rc = ops->collect(ctx, prefix, mask, k - need, need, out, cnt, err);
  if (rc != KV_SCORE_OK)
    return rc;
  if (cnt[0] != k - need || cnt[1] != avail)
    return FAIL(err, KV_SCORE_EUNSUPPORTED,
                "device top-k collect counts disagree with the histograms (value: above)", cnt[0],
                k - need);
  return KV_SCORE_OK;
}

/* The entries of the top k, any order -> out_pos / out_scores in ORDER, through the CPU's own
 * accumulator (kv_score_acc_finish: its sort and its NaN reporting). */
static kv_score_status kvc_finish(const uint64_t *ent, uint32_t k, uint32_t *out_pos,
                                  float *out_scores, uint32_t *n_out, kv_score_err *err)
{
  size_t bytes = kv_score_acc_bytes(k);
  void *mem = malloc(bytes);
  kv_score_pair *pairs = (kv_score_pair *)malloc((size_t)k * sizeof *pairs);
  if (mem == NULL || pairs == NULL) {
    free(mem);
    free(pairs);
    return FAIL(err, KV_SCORE_ENOMEM, "out of host memory for the top-k order", bytes, 0);
  }
  for (uint32_t i = 0; i < k; i++) {
    uint32_t key = (uint32_t)(ent[i] >> 32);
    uint32_t b = key == 0 ? 0x7fc00000u : (key & 0x80000000u) ? (key & 0x7fffffffu) : ~key;
    pairs[i].pos = ~(uint32_t)ent[i];
    memcpy(&pairs[i].score, &b, 4);
  }
  kv_score_acc acc;
  kv_score_status rc = kv_score_acc_init(&acc, k, mem, bytes, err);
  uint32_t got = 0;
  if (rc == KV_SCORE_OK) {
    kv_score_acc_push_pairs(&acc, pairs, k);
    got = kv_score_acc_finish(&acc, out_pos, out_scores);
  }
  free(mem);
  free(pairs);
  if (rc == KV_SCORE_OK && n_out != NULL)
    *n_out = got;
  return rc;
}

/* ------------------------------------------------------------------------------------------ */
/* Host emulation                                                                              */

typedef struct kvc_emu {
  const uint64_t *ent;
  uint64_t n;
} kvc_emu;

static kv_score_status kvc_emu_hist(void *ctx, uint64_t prefix, uint64_t mask, unsigned shift,
                                    uint32_t hist[256], kv_score_err *err)
{
  (void)err;
  const kvc_emu *e = (const kvc_emu *)ctx;
  memset(hist, 0, 256 * sizeof *hist);
  for (uint64_t i = 0; i < e->n; i++) {
    int d = kvc_hist_digit(e->ent[i], prefix, mask, shift);
    if (d >= 0)
      hist[d]++;
  }
  return KV_SCORE_OK;
}

static kv_score_status kvc_emu_collect(void *ctx, uint64_t prefix, uint64_t mask, uint32_t n_gt,
                                       uint32_t need, uint64_t *out, uint32_t cnt[2],
                                       kv_score_err *err)
{
  (void)err;
  const kvc_emu *e = (const kvc_emu *)ctx;
  for (uint64_t i = 0; i < e->n; i++) {
    int c = kvc_class(e->ent[i], prefix, mask);
    if (c > 0) {
      if (cnt[0] < n_gt)
        out[cnt[0]] = e->ent[i];
      cnt[0]++;
    } else if (c == 0) {
      if (cnt[1] < need)
        out[n_gt + cnt[1]] = e->ent[i];
      cnt[1]++;
    }
  }
  return KV_SCORE_OK;
}

extern "C" kv_score_status kv_score_cuda_emu_tokens(const kv_score_query *q,
                                                    const kv_score_view *v, uint32_t first,
                                                    uint32_t n, float *out, kv_score_err *err)
{
  kv_score_status rc = kvc_check_range(q, v ? &v->layout : NULL, v ? v->codes : NULL,
                                       v ? v->scales : NULL, first, n, out, err);
  if (rc != KV_SCORE_OK)
    return rc;
  kvc_qpack p;
  rc = kvc_pack_query(q, &p, err);
  if (rc != KV_SCORE_OK)
    return rc;
  kvc_query qq = kvc_query_at(&p, p.host);
  kvc_keys kk = kvc_keys_of(&v->layout, v->codes, v->scales);
  for (uint32_t i = 0; i < n; i++)
    out[i] = kvc_score_token(&qq, &kk, first + i);
  free(p.host);
  return KV_SCORE_OK;
}

extern "C" kv_score_status kv_score_cuda_emu_topk(const kv_score_query *q,
                                                  const kv_score_span *spans, size_t n_spans,
                                                  uint32_t k, uint32_t *out_pos,
                                                  float *out_scores, uint32_t *n_out,
                                                  kv_score_err *err)
{
  if (n_out != NULL)
    *n_out = 0;
  if (spans == NULL && n_spans > 0)
    return FAIL(err, KV_SCORE_EINVAL, "NULL spans", 0, 0);
  kvc_span *sp = (kvc_span *)calloc(n_spans ? n_spans : 1, sizeof *sp);
  if (sp == NULL)
    return FAIL(err, KV_SCORE_ENOMEM, "out of host memory for the spans", n_spans, 0);
  for (size_t s = 0; s < n_spans; s++) {
    const kv_score_view *v = spans[s].view;
    sp[s].layout = v ? &v->layout : NULL;
    sp[s].codes = v ? v->codes : NULL;
    sp[s].scales = v ? v->scales : NULL;
    sp[s].first = spans[s].first;
    sp[s].n = spans[s].n;
    sp[s].pos_base = spans[s].pos_base;
  }
  uint64_t total = 0;
  kv_score_status rc =
      kvc_check_spans(q, sp, n_spans, k, out_pos != NULL || out_scores != NULL, &total, err);
  kvc_qpack p;
  memset(&p, 0, sizeof p);
  uint64_t *ent = NULL, *top = NULL;
  if (rc == KV_SCORE_OK)
    rc = kvc_pack_query(q, &p, err);
  if (rc == KV_SCORE_OK) {
    ent = (uint64_t *)malloc(total * sizeof *ent);
    top = (uint64_t *)malloc((size_t)k * sizeof *top);
    if (ent == NULL || top == NULL)
      rc = FAIL(err, KV_SCORE_ENOMEM, "out of host memory for the entries", total * 8, 0);
  }
  if (rc == KV_SCORE_OK) {
    kvc_query qq = kvc_query_at(&p, p.host);
    uint64_t off = 0;
    for (size_t s = 0; s < n_spans; s++) {
      kvc_keys kk = kvc_keys_of(sp[s].layout, sp[s].codes, sp[s].scales);
      for (uint32_t i = 0; i < sp[s].n; i++) {
        uint32_t t = sp[s].first + i;
        ent[off + i] = kvc_entry(sp[s].pos_base + t, kvc_score_token(&qq, &kk, t));
      }
      off += sp[s].n;
    }
    kvc_emu ctx = {ent, total};
    static const kvc_sel_ops ops = {kvc_emu_hist, kvc_emu_collect};
    rc = kvc_select(&ops, &ctx, total, k, top, err);
  }
  if (rc == KV_SCORE_OK)
    rc = kvc_finish(top, k, out_pos, out_scores, n_out, err);
  free(ent);
  free(top);
  free(p.host);
  free(sp);
  return rc;
}

/* ------------------------------------------------------------------------------------------ */
/* The device                                                                                  */

extern "C" void kv_score_cuda_opts_init(kv_score_cuda_opts *o)
{
  if (o != NULL)
    memset(o, 0, sizeof *o);
}

extern "C" const char *kv_score_cuda_error_name(uint64_t cuda_error)
{
  const char *s = cudaGetErrorName((cudaError_t)(int)cuda_error);
  return s != NULL ? s : "unrecognized CUDA error";
}

static kv_score_status kvc_device_count(int *count, kv_score_err *err)
{
  *count = 0;
  cudaError_t e = cudaGetDeviceCount(count);
  if (e != cudaSuccess) {
    *count = 0;
    (void)cudaGetLastError();
    return FAIL(err, KV_SCORE_EUNSUPPORTED,
                "no usable CUDA driver or device: cudaGetDeviceCount failed (value: cudaError_t)",
                e, 0);
  }
  if (*count <= 0)
    return FAIL(err, KV_SCORE_EUNSUPPORTED, "no CUDA device: cudaGetDeviceCount found none", 0,
                0);
  return KV_SCORE_OK;
}

extern "C" kv_score_status kv_score_cuda_available(int *n_devices, kv_score_err *err)
{
  int n = 0;
  kv_score_status rc = kvc_device_count(&n, err);
  if (n_devices != NULL)
    *n_devices = n;
  return rc;
}

/* Make `device` the calling thread's current device (the previous one into *saved) after
 * checking that it exists and can run this build's code (compute capability >= 7.5). */
static kv_score_status kvc_enter(int device, int *saved, kv_score_err *err)
{
  int count;
  kv_score_status rc = kvc_device_count(&count, err);
  if (rc != KV_SCORE_OK)
    return rc;
  if (device < 0 || device >= count)
    return FAIL(err, KV_SCORE_EINVAL, "CUDA device index past the devices present", device, count);
  int major = 0, minor = 0;
  cudaError_t e = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
  if (e == cudaSuccess)
    e = cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device);
  if (e != cudaSuccess)
    return CUDA_FAIL(err, e, "cudaDeviceGetAttribute (compute capability) failed");
  if (major * 10 + minor < 75)
    return FAIL(err, KV_SCORE_EUNSUPPORTED,
                "CUDA device below compute capability 7.5 (value: major * 10 + minor)",
                major * 10 + minor, 75);
  e = cudaGetDevice(saved);
  if (e != cudaSuccess)
    return CUDA_FAIL(err, e, "cudaGetDevice failed");
  e = cudaSetDevice(device);
  if (e != cudaSuccess)
    return CUDA_FAIL(err, e, "cudaSetDevice failed");
  return KV_SCORE_OK;
}

static void kvc_leave(int saved)
{
  (void)cudaSetDevice(saved);
}

static cudaStream_t kvc_stream(const kv_score_cuda_opts *opts)
{
  return opts != NULL ? (cudaStream_t)opts->stream : (cudaStream_t)0;
}

static unsigned kvc_blocks(uint64_t n, unsigned cap)
{
  uint64_t b = (n + KVC_THREADS - 1) / KVC_THREADS;
  return b == 0 ? 1u : b > cap ? cap : (unsigned)b;
}

extern "C" kv_score_status kv_score_cuda_upload(const kv_score_view *src, int device,
                                                const kv_score_cuda_opts *opts,
                                                kv_score_cuda_view *out, kv_score_err *err)
{
  if (out == NULL)
    return FAIL(err, KV_SCORE_EINVAL, "NULL output view", 0, 0);
  memset(out, 0, sizeof *out);
  if (src == NULL || src->codes == NULL || src->scales == NULL)
    return FAIL(err, KV_SCORE_EINVAL, "NULL view or view without codes", 0, 0);
  kv_score_status rc = kvc_check_layout(&src->layout, err);
  if (rc != KV_SCORE_OK)
    return rc;
  if (device < 0)
    return FAIL(err, KV_SCORE_EINVAL, "negative CUDA device index", 0, 0);
  const kv_score_layout *l = &src->layout;
  size_t code_bytes = (size_t)l->n_pages * KV_SCORE_PAGE_BYTES;
  /* what the CPU scorer reads: up to the end of the last token's row */
  size_t used = (size_t)(kv_score_layout_code_offset(l, l->n_tokens - 1) - l->meta_bytes) +
                l->row_bytes;
  size_t scale_bytes = (size_t)l->n_tokens * sizeof(float);
  size_t bytes = code_bytes + scale_bytes;
  int saved;
  rc = kvc_enter(device, &saved, err);
  if (rc != KV_SCORE_OK)
    return rc;
  cudaStream_t st = kvc_stream(opts);
  void *mem = NULL;
  cudaError_t e = cudaMalloc(&mem, bytes);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    kvc_leave(saved);
    return FAIL(err, KV_SCORE_ENOMEM, "cudaMalloc of the score copy failed (value: bytes)", bytes,
                0);
  }
  uint8_t *d = (uint8_t *)mem;
  const char *what = NULL;
  if ((e = cudaMemsetAsync(d + used, 0, code_bytes - used, st)) != cudaSuccess)
    what = "cudaMemsetAsync of the last code page's tail failed";
  else if ((e = cudaMemcpyAsync(d, src->codes, used, cudaMemcpyHostToDevice, st)) != cudaSuccess)
    what = "cudaMemcpyAsync of the codes to the device failed";
  else if ((e = cudaMemcpyAsync(d + code_bytes, src->scales, scale_bytes, cudaMemcpyHostToDevice,
                                st)) != cudaSuccess)
    what = "cudaMemcpyAsync of the scales to the device failed";
  else if ((e = cudaStreamSynchronize(st)) != cudaSuccess)
    what = "cudaStreamSynchronize after the upload failed";
  if (what != NULL) {
    rc = FAIL(err, KV_SCORE_EUNSUPPORTED, what, e, 0);
    (void)cudaGetLastError();
    (void)cudaFree(mem);
    kvc_leave(saved);
    return rc;
  }
  out->layout = *l;
  out->codes = d;
  out->scales = (const float *)(const void *)(d + code_bytes);
  out->device = device;
  out->owned = mem;
  kvc_leave(saved);
  return KV_SCORE_OK;
}

/* Can `device` read p? Device memory of that device, managed memory, or mapped host memory. */
static kv_score_status kvc_check_pointer(const void *p, int device, const char *what,
                                         kv_score_err *err)
{
  cudaPointerAttributes a;
  memset(&a, 0, sizeof a);
  cudaError_t e = cudaPointerGetAttributes(&a, p);
  if (e != cudaSuccess)
    return CUDA_FAIL(err, e, "cudaPointerGetAttributes failed");
  if (a.type == cudaMemoryTypeManaged || (a.type == cudaMemoryTypeHost && a.devicePointer == p))
    return KV_SCORE_OK;
  if (a.type == cudaMemoryTypeDevice && a.device == device)
    return KV_SCORE_OK;
  return FAIL(err, KV_SCORE_EINVAL, what, (uint64_t)a.type, device);
}

extern "C" kv_score_status kv_score_cuda_view_wrap(kv_score_cuda_view *out, uint32_t n_tokens,
                                                   uint32_t head_dim, unsigned bits,
                                                   const uint8_t *codes, const float *scales,
                                                   int device, kv_score_err *err)
{
  if (out == NULL)
    return FAIL(err, KV_SCORE_EINVAL, "NULL output view", 0, 0);
  memset(out, 0, sizeof *out);
  kv_score_layout l;
  kv_score_status rc = kv_score_layout_init(&l, n_tokens, head_dim, bits, err);
  if (rc != KV_SCORE_OK)
    return rc;
  if (codes == NULL || scales == NULL)
    return FAIL(err, KV_SCORE_EINVAL, "NULL codes or scales", 0, 0);
  if (device < 0)
    return FAIL(err, KV_SCORE_EINVAL, "negative CUDA device index", 0, 0);
  int saved;
  rc = kvc_enter(device, &saved, err);
  if (rc != KV_SCORE_OK)
    return rc;
  rc = kvc_check_pointer(codes, device,
                         "codes are not memory this CUDA device can read (value: cudaMemoryType)",
                         err);
  if (rc == KV_SCORE_OK)
    rc = kvc_check_pointer(
        scales, device, "scales are not memory this CUDA device can read (value: cudaMemoryType)",
        err);
  kvc_leave(saved);
  if (rc != KV_SCORE_OK)
    return rc;
  out->layout = l;
  out->codes = codes;
  out->scales = scales;
  out->device = device;
  return KV_SCORE_OK;
}

extern "C" void kv_score_cuda_view_free(kv_score_cuda_view *v)
{
  if (v == NULL)
    return;
  if (v->owned != NULL) {
    int saved = 0;
    int have = cudaGetDevice(&saved) == cudaSuccess && cudaSetDevice(v->device) == cudaSuccess;
    (void)cudaFree(v->owned);
    if (have)
      kvc_leave(saved);
    (void)cudaGetLastError();
  }
  memset(v, 0, sizeof *v);
}

/* The device scratch of one call: packed query | hist[256] | cnt[2] | top[k] | ent[total]. */
typedef struct kvc_dev {
  cudaStream_t st;
  uint8_t *mem;
  uint8_t *query;
  unsigned *hist, *cnt;
  uint64_t *top, *ent;
  uint64_t n;
} kvc_dev;

static size_t align256(size_t x)
{
  return (x + 255) / 256 * 256;
}

static kv_score_status kvc_dev_hist(void *ctx, uint64_t prefix, uint64_t mask, unsigned shift,
                                    uint32_t hist[256], kv_score_err *err)
{
  kvc_dev *d = (kvc_dev *)ctx;
  cudaError_t e = cudaMemsetAsync(d->hist, 0, 256 * sizeof(unsigned), d->st);
  if (e != cudaSuccess)
    return CUDA_FAIL(err, e, "cudaMemsetAsync of the histogram failed");
  kvc_k_hist<<<kvc_blocks(d->n, KVC_MAX_BLOCKS), KVC_THREADS, 0, d->st>>>(d->ent, d->n, prefix,
                                                                          mask, shift, d->hist);
  if ((e = cudaGetLastError()) != cudaSuccess)
    return CUDA_FAIL(err, e, "launch of the histogram kernel failed");
  e = cudaMemcpyAsync(hist, d->hist, 256 * sizeof(unsigned), cudaMemcpyDeviceToHost, d->st);
  if (e == cudaSuccess)
    e = cudaStreamSynchronize(d->st);
  if (e != cudaSuccess)
    return CUDA_FAIL(err, e, "the histogram kernel or its copy to the host failed");
  return KV_SCORE_OK;
}

static kv_score_status kvc_dev_collect(void *ctx, uint64_t prefix, uint64_t mask, uint32_t n_gt,
                                       uint32_t need, uint64_t *out, uint32_t cnt[2],
                                       kv_score_err *err)
{
  kvc_dev *d = (kvc_dev *)ctx;
  cudaError_t e = cudaMemsetAsync(d->cnt, 0, 2 * sizeof(unsigned), d->st);
  if (e != cudaSuccess)
    return CUDA_FAIL(err, e, "cudaMemsetAsync of the collect counters failed");
  kvc_k_collect<<<kvc_blocks(d->n, KVC_MAX_BLOCKS), KVC_THREADS, 0, d->st>>>(
      d->ent, d->n, prefix, mask, n_gt, need, d->top, d->cnt);
  if ((e = cudaGetLastError()) != cudaSuccess)
    return CUDA_FAIL(err, e, "launch of the collect kernel failed");
  unsigned c[2] = {0, 0};
  e = cudaMemcpyAsync(c, d->cnt, sizeof c, cudaMemcpyDeviceToHost, d->st);
  if (e == cudaSuccess)
    e = cudaMemcpyAsync(out, d->top, ((size_t)n_gt + need) * sizeof(uint64_t),
                        cudaMemcpyDeviceToHost, d->st);
  if (e == cudaSuccess)
    e = cudaStreamSynchronize(d->st);
  if (e != cudaSuccess)
    return CUDA_FAIL(err, e, "the collect kernel or its copy to the host failed");
  cnt[0] = c[0];
  cnt[1] = c[1];
  return KV_SCORE_OK;
}

extern "C" kv_score_status kv_score_cuda_tokens(const kv_score_query *q,
                                                const kv_score_cuda_view *v, uint32_t first,
                                                uint32_t n, const kv_score_cuda_opts *opts,
                                                float *out, kv_score_err *err)
{
  kv_score_status rc = kvc_check_range(q, v ? &v->layout : NULL, v ? v->codes : NULL,
                                       v ? v->scales : NULL, first, n, out, err);
  if (rc != KV_SCORE_OK)
    return rc;
  if (v->device < 0)
    return FAIL(err, KV_SCORE_EINVAL, "negative CUDA device index", 0, 0);
  if (n == 0)
    return KV_SCORE_OK;
  kvc_qpack p;
  rc = kvc_pack_query(q, &p, err);
  if (rc != KV_SCORE_OK)
    return rc;
  int saved;
  rc = kvc_enter(v->device, &saved, err);
  if (rc != KV_SCORE_OK) {
    free(p.host);
    return rc;
  }
  cudaStream_t st = kvc_stream(opts);
  size_t off_out = align256(p.bytes), bytes = off_out + (size_t)n * sizeof(float);
  uint8_t *mem = NULL;
  cudaError_t e = cudaMalloc((void **)&mem, bytes);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    free(p.host);
    kvc_leave(saved);
    return FAIL(err, KV_SCORE_ENOMEM, "cudaMalloc for scoring failed (value: bytes)", bytes, 0);
  }
  const char *what = NULL;
  if ((e = cudaMemcpyAsync(mem, p.host, p.bytes, cudaMemcpyHostToDevice, st)) != cudaSuccess) {
    what = "cudaMemcpyAsync of the query to the device failed";
  } else {
    kvc_k_scores<<<(n + KVC_THREADS - 1) / KVC_THREADS, KVC_THREADS, 0, st>>>(
        kvc_query_at(&p, mem), kvc_keys_of(&v->layout, v->codes, v->scales), first, n,
        (float *)(void *)(mem + off_out));
    if ((e = cudaGetLastError()) != cudaSuccess)
      what = "launch of the scoring kernel failed";
    else if ((e = cudaMemcpyAsync(out, mem + off_out, (size_t)n * sizeof(float),
                                  cudaMemcpyDeviceToHost, st)) != cudaSuccess)
      what = "cudaMemcpyAsync of the scores to the host failed";
    else if ((e = cudaStreamSynchronize(st)) != cudaSuccess)
      what = "the scoring kernel failed (cudaStreamSynchronize)";
  }
  rc = what != NULL ? FAIL(err, KV_SCORE_EUNSUPPORTED, what, e, 0) : KV_SCORE_OK;
  (void)cudaGetLastError();
  (void)cudaFree(mem);
  free(p.host);
  kvc_leave(saved);
  return rc;
}

extern "C" kv_score_status kv_score_cuda_topk(const kv_score_query *q,
                                              const kv_score_cuda_span *spans, size_t n_spans,
                                              uint32_t k, const kv_score_cuda_opts *opts,
                                              uint32_t *out_pos, float *out_scores,
                                              uint32_t *n_out, kv_score_err *err)
{
  if (n_out != NULL)
    *n_out = 0;
  if (spans == NULL && n_spans > 0)
    return FAIL(err, KV_SCORE_EINVAL, "NULL spans", 0, 0);
  kvc_span *sp = (kvc_span *)calloc(n_spans ? n_spans : 1, sizeof *sp);
  if (sp == NULL)
    return FAIL(err, KV_SCORE_ENOMEM, "out of host memory for the spans", n_spans, 0);
  for (size_t s = 0; s < n_spans; s++) {
    const kv_score_cuda_view *v = spans[s].view;
    sp[s].layout = v ? &v->layout : NULL;
    sp[s].codes = v ? v->codes : NULL;
    sp[s].scales = v ? v->scales : NULL;
    sp[s].device = v ? v->device : -1;
    sp[s].first = spans[s].first;
    sp[s].n = spans[s].n;
    sp[s].pos_base = spans[s].pos_base;
  }
  uint64_t total = 0;
  kv_score_status rc =
      kvc_check_spans(q, sp, n_spans, k, out_pos != NULL || out_scores != NULL, &total, err);
  if (rc == KV_SCORE_OK && sp[0].device < 0)
    rc = FAIL(err, KV_SCORE_EINVAL, "negative CUDA device index", 0, 0);
  kvc_qpack p;
  memset(&p, 0, sizeof p);
  uint64_t *top = NULL;
  if (rc == KV_SCORE_OK)
    rc = kvc_pack_query(q, &p, err);
  if (rc == KV_SCORE_OK) {
    top = (uint64_t *)malloc((size_t)k * sizeof *top);
    if (top == NULL)
      rc = FAIL(err, KV_SCORE_ENOMEM, "out of host memory for the top k", (uint64_t)k * 8, 0);
  }
  int saved = 0, entered = 0;
  if (rc == KV_SCORE_OK) {
    rc = kvc_enter(sp[0].device, &saved, err);
    entered = rc == KV_SCORE_OK;
  }
  kvc_dev d;
  memset(&d, 0, sizeof d);
  if (rc == KV_SCORE_OK) {
    d.st = kvc_stream(opts);
    d.n = total;
    size_t off_hist = align256(p.bytes), off_cnt = off_hist + align256(256 * sizeof(unsigned));
    size_t off_top = off_cnt + 256, off_ent = off_top + align256((size_t)k * 8);
    size_t bytes = off_ent + (size_t)total * 8;
    cudaError_t e = cudaMalloc((void **)&d.mem, bytes);
    if (e != cudaSuccess) {
      (void)cudaGetLastError();
      d.mem = NULL;
      rc = FAIL(err, KV_SCORE_ENOMEM, "cudaMalloc for the top-k entries failed (value: bytes)",
                bytes, 0);
    } else {
      d.query = d.mem;
      d.hist = (unsigned *)(void *)(d.mem + off_hist);
      d.cnt = (unsigned *)(void *)(d.mem + off_cnt);
      d.top = (uint64_t *)(void *)(d.mem + off_top);
      d.ent = (uint64_t *)(void *)(d.mem + off_ent);
      e = cudaMemcpyAsync(d.query, p.host, p.bytes, cudaMemcpyHostToDevice, d.st);
      if (e != cudaSuccess)
        rc = CUDA_FAIL(err, e, "cudaMemcpyAsync of the query to the device failed");
    }
  }
  if (rc == KV_SCORE_OK) {
    kvc_query qq = kvc_query_at(&p, d.query);
    uint64_t off = 0;
    for (size_t s = 0; s < n_spans && rc == KV_SCORE_OK; s++) {
      if (sp[s].n == 0)
        continue;
      kvc_k_entries<<<(sp[s].n + KVC_THREADS - 1) / KVC_THREADS, KVC_THREADS, 0, d.st>>>(
          qq, kvc_keys_of(sp[s].layout, sp[s].codes, sp[s].scales), sp[s].first, sp[s].n,
          sp[s].pos_base, d.ent + off);
      cudaError_t e = cudaGetLastError();
      if (e != cudaSuccess)
        rc = CUDA_FAIL(err, e, "launch of the scoring kernel failed");
      off += sp[s].n;
    }
  }
  if (rc == KV_SCORE_OK) {
    static const kvc_sel_ops ops = {kvc_dev_hist, kvc_dev_collect};
    rc = kvc_select(&ops, &d, total, k, top, err);
  }
  if (d.mem != NULL) {
    (void)cudaStreamSynchronize(d.st); /* C4: nothing in flight on an error path either */
    (void)cudaFree(d.mem);
    (void)cudaGetLastError();
  }
  if (entered)
    kvc_leave(saved);
  if (rc == KV_SCORE_OK)
    rc = kvc_finish(top, k, out_pos, out_scores, n_out, err);
  free(top);
  free(p.host);
  free(sp);
  return rc;
}
