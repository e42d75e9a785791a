/* SPDX-License-Identifier: MIT */
/*
 * score/score.c — quantization, the score copy (writer and parser), queries, kernel
 * dispatch, the portable kernel, the streaming top-k with its worker threads, and the exact
 * reference scorer. The SIMD kernels are in score_avx2.c and score_avx512.c (built with their
 * own -m flags and called only when the CPU has the instructions).
 *
 * INVARIANTS
 *   S1. Every kernel path returns bit-identical scores (score.h "SCORE OF TOKEN t"); the float
 *       part is the same few IEEE operations in the same order everywhere.
 *   S2. The top k is a function of the multiset of (pos, score) offered, never of the order in
 *       which they were offered, the threads or the chunking: the order (score.h ORDER) is a
 *       strict total order on the 64-bit entries (sortable score << 32 | ~pos).
 *   S3. An accumulator holds at most 2k entries; no function materializes all N scores unless
 *       the caller asked for them (kv_score_tokens, kv_score_exact).
 */
#define _GNU_SOURCE
#include "score_int.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "score reads little-endian f32 scales in place: big-endian hosts are not supported"
#endif

/* ------------------------------------------------------------------------------------------ */
/* Status and errors                                                                           */

const char *kv_score_status_name(kv_score_status rc)
{
  switch (rc) {
  case KV_SCORE_OK: return "KV_SCORE_OK";
  case KV_SCORE_EINVAL: return "KV_SCORE_EINVAL";
  case KV_SCORE_ECORRUPT: return "KV_SCORE_ECORRUPT";
  case KV_SCORE_ENOMEM: return "KV_SCORE_ENOMEM";
  case KV_SCORE_ETOOSMALL: return "KV_SCORE_ETOOSMALL";
  case KV_SCORE_EUNSUPPORTED: return "KV_SCORE_EUNSUPPORTED";
  }
  return "KV_SCORE_E?";
}

size_t kv_score_errmsg(const kv_score_err *err, char *buf, size_t cap)
{
  int n;
  if (err == NULL || err->code == KV_SCORE_OK) {
    n = snprintf(buf, cap, "ok");
  } else {
    const char *kind = err->code == KV_SCORE_ECORRUPT ? "corrupt score copy"
                       : err->code == KV_SCORE_EINVAL  ? "invalid argument"
                                                       : kv_score_status_name(err->code);
    n = snprintf(buf, cap, "%s: %s (value %llu, limit %llu) [%s:%d]", kind,
                 err->what ? err->what : "?", (unsigned long long)err->value,
                 (unsigned long long)err->limit, err->file ? err->file : "?", err->line);
  }
  return n < 0 ? 0 : (size_t)n;
}

static kv_score_status fail_at(kv_score_err *err, kv_score_status code, const char *what,
                               uint64_t value, uint64_t limit, const char *file, int line)
{
  if (err != NULL) {
    err->code = code;
    err->what = what;
    err->value = value;
    err->limit = limit;
    err->file = file;
    err->line = line;
  }
  return code;
}
#define FAIL(err, code, what, value, limit)                                                        \
  fail_at((err), (code), (what), (uint64_t)(value), (uint64_t)(limit), __FILE__, __LINE__)

/* ------------------------------------------------------------------------------------------ */
/* Elements                                                                                    */

size_t kv_score_dtype_bytes(kv_score_dtype dtype)
{
  switch (dtype) {
  case KV_SCORE_F16:
  case KV_SCORE_BF16: return 2;
  case KV_SCORE_F32: return 4;
  }
  return 0;
}

float kv_score_f16_to_f32(uint16_t h)
{
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16, em = h & 0x7fffu, o;
  if (em >= 0x7c00u) {
    o = 0x7f800000u | ((em & 0x3ffu) << 13);
  } else if (em >= 0x0400u) {
    o = (em << 13) + (112u << 23);
  } else {
    float sub = (float)em * 0x1p-24f; /* exact */
    memcpy(&o, &sub, 4);
  }
  o |= sign;
  float r;
  memcpy(&r, &o, 4);
  return r;
}

float kv_score_bf16_to_f32(uint16_t b)
{
  uint32_t o = (uint32_t)b << 16;
  float r;
  memcpy(&r, &o, 4);
  return r;
}

uint16_t kv_score_f32_to_f16(float f)
{
  uint32_t x;
  memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000u;
  x &= 0x7fffffffu;
  if (x > 0x7f800000u)
    return (uint16_t)(sign | 0x7e00u); /* NaN */
  if (x >= 0x477ff000u)
    return (uint16_t)(sign | 0x7c00u); /* rounds to infinity */
  if (x < 0x38800000u) {               /* f16 subnormal or zero: round onto the 2^-24 grid */
    float a;
    memcpy(&a, &x, 4);
    return (uint16_t)(sign | (uint32_t)nearbyintf(a * 0x1p24f));
  }
  uint32_t r = (x - (112u << 23) + 0xfffu + ((x >> 13) & 1u)) >> 13;
  return (uint16_t)(sign | r);
}

static inline float load_elem(kv_score_dtype dtype, const uint8_t *p, uint32_t j)
{
  if (dtype == KV_SCORE_F32) {
    float f;
    memcpy(&f, p + 4 * (size_t)j, 4);
    return f;
  }
  uint16_t h;
  memcpy(&h, p + 2 * (size_t)j, 2);
  return dtype == KV_SCORE_F16 ? kv_score_f16_to_f32(h) : kv_score_bf16_to_f32(h);
}

uint32_t kv_score_row_bytes(uint32_t head_dim, unsigned bits)
{
  if (head_dim == 0 || head_dim > KV_SCORE_MAX_HEAD_DIM)
    return 0;
  if (bits == 8)
    return head_dim;
  if (bits == 4 && head_dim % 2 == 0)
    return head_dim / 2;
  return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* Quantization                                                                                */

/* Symmetric quantization of x[0..d) to [-Q, Q] (score.h QUANTIZATION). x must be finite. */
static void quant_row(const float *x, uint32_t d, int Q, int8_t *c, float *scale)
{
  double amax = 0;
  for (uint32_t j = 0; j < d; j++) {
    double a = fabs((double)x[j]);
    if (a > amax)
      amax = a;
  }
  if (amax == 0) {
    memset(c, 0, d);
    *scale = 0.0f;
    return;
  }
  double sd = amax / (double)Q;
  float s = (float)sd;
  if ((double)s < sd)
    s = nextafterf(s, INFINITY);
  for (uint32_t j = 0; j < d; j++) {
    double v = nearbyint((double)x[j] / (double)s);
    if (v > Q)
      v = Q;
    if (v < -Q)
      v = -Q;
    c[j] = (int8_t)v;
  }
  *scale = s;
}

kv_score_status kv_score_quantize_rows(kv_score_dtype dtype, const void *src, size_t src_stride,
                                       uint32_t n_rows, uint32_t head_dim, unsigned bits,
                                       uint8_t *codes, size_t code_stride, float *scales,
                                       kv_score_err *err)
{
  size_t eb = kv_score_dtype_bytes(dtype);
  if (eb == 0)
    return FAIL(err, KV_SCORE_EINVAL, "unknown key dtype", dtype, 3);
  if (bits != 8 && bits != 4)
    return FAIL(err, KV_SCORE_EINVAL, "bits must be 8 or 4", bits, 8);
  uint32_t rb = kv_score_row_bytes(head_dim, bits);
  if (rb == 0)
    return FAIL(err, KV_SCORE_EINVAL,
                bits == 4 && head_dim % 2 ? "int4 needs an even head_dim" : "head_dim out of range",
                head_dim, KV_SCORE_MAX_HEAD_DIM);
  if (n_rows == 0)
    return KV_SCORE_OK;
  if (src == NULL || codes == NULL || scales == NULL)
    return FAIL(err, KV_SCORE_EINVAL, "NULL keys, codes or scales", 0, 0);
  if (n_rows > 1 && src_stride < head_dim * eb)
    return FAIL(err, KV_SCORE_EINVAL, "key row stride smaller than a row", src_stride, head_dim * eb);
  if (n_rows > 1 && code_stride < rb)
    return FAIL(err, KV_SCORE_EINVAL, "code row stride smaller than a row", code_stride, rb);
  float x[KV_SCORE_MAX_HEAD_DIM];
  int8_t c[KV_SCORE_MAX_HEAD_DIM];
  const int Q = bits == 8 ? 127 : 7;
  for (uint32_t r = 0; r < n_rows; r++) {
    const uint8_t *row = (const uint8_t *)src + (size_t)r * src_stride;
    for (uint32_t j = 0; j < head_dim; j++) {
      x[j] = load_elem(dtype, row, j);
      if (!isfinite(x[j]))
        return FAIL(err, KV_SCORE_EINVAL, "key row has a NaN or infinite element (value: row)", r,
                    n_rows);
    }
    quant_row(x, head_dim, Q, c, &scales[r]);
    uint8_t *out = codes + (size_t)r * code_stride;
    if (bits == 8) {
      memcpy(out, c, head_dim);
    } else {
      for (uint32_t b = 0; b < rb; b++)
        out[b] = (uint8_t)((uint32_t)(c[2 * b] + 8) | ((uint32_t)(c[2 * b + 1] + 8) << 4));
    }
  }
  return KV_SCORE_OK;
}

void kv_score_dequantize_row(const uint8_t *codes, uint32_t head_dim, unsigned bits, float scale,
                             float *out)
{
  uint32_t rb = kv_score_row_bytes(head_dim, bits);
  if (rb == 0 || codes == NULL || out == NULL)
    return;
  if (bits == 8) {
    for (uint32_t j = 0; j < head_dim; j++)
      out[j] = (float)(int8_t)codes[j] * scale;
  } else {
    for (uint32_t b = 0; b < rb; b++) {
      out[2 * b] = (float)((codes[b] & 15) - 8) * scale;
      out[2 * b + 1] = (float)((codes[b] >> 4) - 8) * scale;
    }
  }
}

/* ------------------------------------------------------------------------------------------ */
/* The score copy                                                                              */

static inline uint32_t get_le32(const uint8_t *p)
{
  return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}
static inline void put_le32(uint8_t *p, uint32_t v)
{
  p[0] = (uint8_t)v;
  p[1] = (uint8_t)(v >> 8);
  p[2] = (uint8_t)(v >> 16);
  p[3] = (uint8_t)(v >> 24);
}

kv_score_status kv_score_layout_init(kv_score_layout *out, uint32_t n_tokens, uint32_t head_dim,
                                     unsigned bits, kv_score_err *err)
{
  return kv_score_layout_init_v(out, n_tokens, head_dim, bits, 0, err);
}

static int pow2(uint32_t x)
{
  return x != 0 && (x & (x - 1)) == 0;
}

kv_score_status kv_score_layout_init_v(kv_score_layout *out, uint32_t n_tokens, uint32_t head_dim,
                                       unsigned bits, unsigned variant, kv_score_err *err)
{
  if (out == NULL)
    return FAIL(err, KV_SCORE_EINVAL, "NULL layout", 0, 0);
  memset(out, 0, sizeof *out);
  if (bits != 8 && bits != 4)
    return FAIL(err, KV_SCORE_EINVAL, "bits must be 8 or 4", bits, 8);
  if (head_dim == 0 || head_dim > KV_SCORE_MAX_HEAD_DIM)
    return FAIL(err, KV_SCORE_EINVAL, "head_dim out of range", head_dim, KV_SCORE_MAX_HEAD_DIM);
  if (bits == 4 && head_dim % 2 != 0)
    return FAIL(err, KV_SCORE_EINVAL, "int4 needs an even head_dim", head_dim, 0);
  if (n_tokens == 0 || n_tokens > KV_SCORE_MAX_TOKENS)
    return FAIL(err, KV_SCORE_EINVAL, "n_tokens out of range", n_tokens, KV_SCORE_MAX_TOKENS);
  uint32_t rb = kv_score_row_bytes(head_dim, bits);
  uint32_t pt = 1;
  while ((uint64_t)pt * 2 * rb <= KV_SCORE_PAGE_BYTES)
    pt *= 2;
  out->n_tokens = n_tokens;
  out->head_dim = head_dim;
  out->bits = bits;
  out->row_bytes = rb;
  out->page_tokens = pt;
  out->n_pages = (uint32_t)(((uint64_t)n_tokens + pt - 1) / pt);
  if (variant != 0 && variant != KV_SCORE_COPY_CENTERED)
    return FAIL(err, KV_SCORE_EINVAL, "unknown score copy variant", variant, KV_SCORE_COPY_CENTERED);
  if (variant != 0 && !pow2(head_dim))
    return FAIL(err, KV_SCORE_EINVAL, "a centered copy needs a power-of-two head_dim", head_dim, 0);
  uint64_t meta = KV_SCORE_COPY_HDR_BYTES + 4ull * n_tokens;
  if (variant != 0) {
    out->variant = variant;
    out->center_off = (uint32_t)((meta + 63) / 64 * 64);
    meta = out->center_off + head_dim;
  }
  out->meta_bytes = (meta + KV_SCORE_PAGE_BYTES - 1) / KV_SCORE_PAGE_BYTES * KV_SCORE_PAGE_BYTES;
  out->total_bytes = out->meta_bytes + (uint64_t)out->n_pages * KV_SCORE_PAGE_BYTES;
  return KV_SCORE_OK;
}

kv_score_status kv_score_copy_encode(kv_score_dtype dtype, const void *src, size_t src_stride,
                                     uint32_t n_tokens, uint32_t head_dim, unsigned bits,
                                     void *dst, size_t dst_cap, size_t *out_len, kv_score_err *err)
{
  return kv_score_copy_encode_v(dtype, src, src_stride, n_tokens, head_dim, bits, 0, dst, dst_cap,
                                out_len, err);
}

/* x[0..d) <- H x, the normalized Walsh-Hadamard transform (Sylvester order), d a power of two. */
static void fwht(double *x, uint32_t d)
{
  for (uint32_t h = 1; h < d; h *= 2)
    for (uint32_t i = 0; i < d; i += 2 * h)
      for (uint32_t j = i; j < i + h; j++) {
        double a = x[j], b = x[j + h];
        x[j] = a + b;
        x[j + h] = a - b;
      }
  double f = 1.0 / sqrt((double)d);
  for (uint32_t j = 0; j < d; j++)
    x[j] *= f;
}

/* The version-2 body: center codes and scale into the meta region, then per page the rows
 * H k_t - m^ (as f32) quantized by kv_score_quantize_rows. */
static kv_score_status encode_centered(const kv_score_layout *l, kv_score_dtype dtype,
                                       const uint8_t *src, size_t src_stride, uint8_t *d,
                                       kv_score_err *err)
{
  const uint32_t n = l->n_tokens, hd = l->head_dim;
  double *lo = malloc(sizeof(double) * hd * 3), *hi = lo ? lo + hd : NULL, *x = lo ? lo + 2 * hd : NULL;
  float *rows = malloc((size_t)l->page_tokens * hd * sizeof(float));
  kv_score_status rc = KV_SCORE_OK;
  if (lo == NULL || rows == NULL) {
    rc = FAIL(err, KV_SCORE_ENOMEM, "out of memory for a centered copy", 0, 0);
    goto out;
  }
  for (uint32_t t = 0; t < n; t++)
    for (uint32_t j = 0; j < hd; j++) {
      double v = load_elem(dtype, src + (size_t)t * src_stride, j);
      if (!isfinite(v)) {
        rc = FAIL(err, KV_SCORE_EINVAL, "key row has a NaN or infinite element (value: row)", t, n);
        goto out;
      }
      if (t == 0 || v < lo[j])
        lo[j] = v;
      if (t == 0 || v > hi[j])
        hi[j] = v;
    }
  float xf[KV_SCORE_MAX_HEAD_DIM], sc[KV_SCORE_PAGE_BYTES]; /* page_tokens <= 4096 */
  for (uint32_t j = 0; j < hd; j++)
    x[j] = (lo[j] + hi[j]) / 2;
  fwht(x, hd);
  for (uint32_t j = 0; j < hd; j++)
    xf[j] = (float)x[j];
  int8_t *cc = (int8_t *)(d + l->center_off);
  float cs;
  quant_row(xf, hd, 127, cc, &cs);
  memcpy(d + 32, &cs, 4);
  for (uint32_t p = 0; p < l->n_pages; p++) {
    uint32_t t0 = p * l->page_tokens;
    uint32_t m = n - t0 < l->page_tokens ? n - t0 : l->page_tokens;
    for (uint32_t i = 0; i < m; i++) {
      for (uint32_t j = 0; j < hd; j++)
        x[j] = load_elem(dtype, src + (size_t)(t0 + i) * src_stride, j);
      fwht(x, hd);
      for (uint32_t j = 0; j < hd; j++) {
        float r = (float)(x[j] - (double)((float)cc[j] * cs));
        /* a difference of finite floats can still overflow float: refuse rather than store inf */
        if (!isfinite(r)) {
          rc = FAIL(err, KV_SCORE_EINVAL, "centered key row overflows float (value: row)", t0 + i, n);
          goto out;
        }
        rows[(size_t)i * hd + j] = r;
      }
    }
    rc = kv_score_quantize_rows(KV_SCORE_F32, rows, (size_t)hd * 4, m, hd, l->bits,
                                d + l->meta_bytes + (uint64_t)p * KV_SCORE_PAGE_BYTES, l->row_bytes,
                                sc, err);
    if (rc != KV_SCORE_OK)
      goto out;
    memcpy(d + KV_SCORE_COPY_HDR_BYTES + 4 * (size_t)t0, sc, 4 * (size_t)m);
  }
out:
  free(lo);
  free(rows);
  return rc;
}

kv_score_status kv_score_copy_encode_v(kv_score_dtype dtype, const void *src, size_t src_stride,
                                       uint32_t n_tokens, uint32_t head_dim, unsigned bits,
                                       unsigned variant, void *dst, size_t dst_cap,
                                       size_t *out_len, kv_score_err *err)
{
  kv_score_layout l;
  kv_score_status rc = kv_score_layout_init_v(&l, n_tokens, head_dim, bits, variant, err);
  if (rc != KV_SCORE_OK)
    return rc;
  if (kv_score_dtype_bytes(dtype) == 0)
    return FAIL(err, KV_SCORE_EINVAL, "unknown key dtype", dtype, 3);
  if (src == NULL || dst == NULL)
    return FAIL(err, KV_SCORE_EINVAL, "NULL keys or destination", 0, 0);
  if (dst_cap < l.total_bytes)
    return FAIL(err, KV_SCORE_ETOOSMALL, "destination smaller than the score copy", dst_cap,
                l.total_bytes);
  uint8_t *d = dst;
  memset(d, 0, (size_t)l.total_bytes);
  put_le32(d, KV_SCORE_COPY_MAGIC);
  d[4] = KV_SCORE_COPY_VERSION;
  d[5] = (uint8_t)bits;
  d[6] = 3;
  d[7] = 0;
  put_le32(d + 8, n_tokens);
  put_le32(d + 12, head_dim);
  put_le32(d + 16, l.row_bytes);
  put_le32(d + 20, l.page_tokens);
  put_le32(d + 24, (uint32_t)l.meta_bytes);
  put_le32(d + 28, l.n_pages);
  if (variant != 0) {
    d[4] = KV_SCORE_COPY_VERSION_CENTERED;
    d[7] = KV_SCORE_COPY_CENTERED;
    if (n_tokens > 1 && src_stride < head_dim * kv_score_dtype_bytes(dtype))
      return FAIL(err, KV_SCORE_EINVAL, "key row stride smaller than a row", src_stride,
                  head_dim * kv_score_dtype_bytes(dtype));
    rc = encode_centered(&l, dtype, src, src_stride, d, err);
    if (rc != KV_SCORE_OK)
      return rc;
    if (out_len != NULL)
      *out_len = (size_t)l.total_bytes;
    return KV_SCORE_OK;
  }
  float sc[KV_SCORE_PAGE_BYTES]; /* page_tokens <= 4096 */
  for (uint32_t p = 0; p < l.n_pages; p++) {
    uint32_t t0 = p * l.page_tokens;
    uint32_t m = n_tokens - t0 < l.page_tokens ? n_tokens - t0 : l.page_tokens;
    rc = kv_score_quantize_rows(dtype, (const uint8_t *)src + (size_t)t0 * src_stride, src_stride,
                                m, head_dim, bits, d + l.meta_bytes + (uint64_t)p * KV_SCORE_PAGE_BYTES,
                                l.row_bytes, sc, err);
    if (rc != KV_SCORE_OK) {
      if (err != NULL && rc == KV_SCORE_EINVAL && err->limit == m) {
        err->value += t0; /* name the section's row, not the page's */
        err->limit = n_tokens;
      }
      return rc;
    }
    memcpy(d + KV_SCORE_COPY_HDR_BYTES + 4 * (size_t)t0, sc, 4 * (size_t)m);
  }
  if (out_len != NULL)
    *out_len = (size_t)l.total_bytes;
  return KV_SCORE_OK;
}

kv_score_status kv_score_copy_parse(const void *src, size_t len, kv_score_view *out,
                                    kv_score_err *err)
{
  if (out == NULL)
    return FAIL(err, KV_SCORE_EINVAL, "NULL view", 0, 0);
  memset(out, 0, sizeof *out);
  if (src == NULL)
    return FAIL(err, KV_SCORE_EINVAL, "NULL score copy", 0, 0);
  if ((uintptr_t)src % 4 != 0)
    return FAIL(err, KV_SCORE_EINVAL, "score copy buffer not 4-byte aligned", (uintptr_t)src % 4, 4);
  const uint8_t *s = src;
  if (len < KV_SCORE_COPY_HDR_BYTES)
    return FAIL(err, KV_SCORE_ECORRUPT, "shorter than the 64-byte header", len,
                KV_SCORE_COPY_HDR_BYTES);
  if (get_le32(s) != KV_SCORE_COPY_MAGIC)
    return FAIL(err, KV_SCORE_ECORRUPT, "bad magic", get_le32(s), KV_SCORE_COPY_MAGIC);
  if (s[4] != KV_SCORE_COPY_VERSION && s[4] != KV_SCORE_COPY_VERSION_CENTERED)
    return FAIL(err, KV_SCORE_ECORRUPT, "unknown version", s[4], KV_SCORE_COPY_VERSION_CENTERED);
  if (s[5] != 8 && s[5] != 4)
    return FAIL(err, KV_SCORE_ECORRUPT, "bits is not 8 or 4", s[5], 8);
  if (s[6] != 3)
    return FAIL(err, KV_SCORE_ECORRUPT, "scale dtype is not f32 (3)", s[6], 3);
  unsigned variant = s[4] == KV_SCORE_COPY_VERSION ? 0 : KV_SCORE_COPY_CENTERED;
  if (s[7] != variant)
    return FAIL(err, KV_SCORE_ECORRUPT, "flags do not match the version", s[7], variant);
  float cs = 0;
  if (variant != 0) {
    memcpy(&cs, s + 32, 4);
    if (!(cs >= 0.0f) || !isfinite(cs))
      return FAIL(err, KV_SCORE_ECORRUPT, "the center scale is negative, NaN or infinite", 0, 0);
  }
  for (unsigned i = variant != 0 ? 36 : 32; i < KV_SCORE_COPY_HDR_BYTES; i++)
    if (s[i] != 0)
      return FAIL(err, KV_SCORE_ECORRUPT, "reserved header byte not zero (value: offset)", i, 0);
  uint32_t n = get_le32(s + 8), d = get_le32(s + 12);
  if (n == 0 || n > KV_SCORE_MAX_TOKENS)
    return FAIL(err, KV_SCORE_ECORRUPT, "n_tokens out of range", n, KV_SCORE_MAX_TOKENS);
  if (d == 0 || d > KV_SCORE_MAX_HEAD_DIM)
    return FAIL(err, KV_SCORE_ECORRUPT, "head_dim out of range", d, KV_SCORE_MAX_HEAD_DIM);
  if (s[5] == 4 && d % 2 != 0)
    return FAIL(err, KV_SCORE_ECORRUPT, "odd head_dim with 4 bits", d, 0);
  kv_score_layout l;
  if (kv_score_layout_init_v(&l, n, d, s[5], variant, NULL) != KV_SCORE_OK)
    return FAIL(err, KV_SCORE_ECORRUPT,
                variant != 0 ? "shape has no layout (a centered copy needs a power-of-two head_dim)"
                             : "shape has no layout",
                n, d);
  if (get_le32(s + 16) != l.row_bytes)
    return FAIL(err, KV_SCORE_ECORRUPT, "row_bytes does not match the shape", get_le32(s + 16),
                l.row_bytes);
  if (get_le32(s + 20) != l.page_tokens)
    return FAIL(err, KV_SCORE_ECORRUPT, "page_tokens does not match the shape", get_le32(s + 20),
                l.page_tokens);
  if (get_le32(s + 24) != l.meta_bytes)
    return FAIL(err, KV_SCORE_ECORRUPT, "meta_bytes does not match the shape", get_le32(s + 24),
                l.meta_bytes);
  if (get_le32(s + 28) != l.n_pages)
    return FAIL(err, KV_SCORE_ECORRUPT, "n_pages does not match the shape", get_le32(s + 28),
                l.n_pages);
  if (len != l.total_bytes)
    return FAIL(err, KV_SCORE_ECORRUPT, "section length differs from the layout's", len,
                l.total_bytes);
  const float *sc = (const float *)(const void *)(s + KV_SCORE_COPY_HDR_BYTES);
  for (uint32_t t = 0; t < n; t++) {
    float v = sc[t];
    if (!(v >= 0.0f) || !isfinite(v))
      return FAIL(err, KV_SCORE_ECORRUPT, "a token scale is negative, NaN or infinite (value: token)",
                  t, n);
  }
  out->layout = l;
  out->codes = s + l.meta_bytes;
  out->scales = sc;
  if (variant != 0) {
    out->center = (const int8_t *)(s + l.center_off);
    out->center_scale = cs;
  }
  return KV_SCORE_OK;
}

kv_score_status kv_score_view_init(kv_score_view *out, uint32_t n_tokens, uint32_t head_dim,
                                   unsigned bits, const uint8_t *codes, const float *scales,
                                   kv_score_err *err)
{
  if (out == NULL)
    return FAIL(err, KV_SCORE_EINVAL, "NULL view", 0, 0);
  memset(out, 0, sizeof *out);
  kv_score_status rc = kv_score_layout_init(&out->layout, n_tokens, head_dim, bits, err);
  if (rc != KV_SCORE_OK)
    return rc;
  if (codes == NULL || scales == NULL) {
    memset(out, 0, sizeof *out);
    return FAIL(err, KV_SCORE_EINVAL, "NULL codes or scales", 0, 0);
  }
  out->codes = codes;
  out->scales = scales;
  return KV_SCORE_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* Queries                                                                                     */

static kv_score_status query_build(kv_score_dtype dtype, const void *q, uint32_t n_heads,
                                   uint32_t head_dim, size_t head_stride, kv_score_combine combine,
                                   int rotate, kv_score_query **out, kv_score_err *err);

kv_score_status kv_score_query_create(kv_score_dtype dtype, const void *q, uint32_t n_heads,
                                      uint32_t head_dim, size_t head_stride,
                                      kv_score_combine combine, kv_score_query **out,
                                      kv_score_err *err)
{
  kv_score_status rc = query_build(dtype, q, n_heads, head_dim, head_stride, combine, 0, out, err);
  if (rc != KV_SCORE_OK || !pow2(head_dim))
    return rc;
  rc = query_build(dtype, q, n_heads, head_dim, head_stride, combine, 1, &(*out)->rot, err);
  if (rc != KV_SCORE_OK) {
    kv_score_query_free(*out);
    *out = NULL;
  }
  return rc;
}

/* The query object; with `rotate`, its vectors are H x_v (score.h THE CENTERED, ROTATED COPY). */
static kv_score_status query_build(kv_score_dtype dtype, const void *q, uint32_t n_heads,
                                   uint32_t head_dim, size_t head_stride, kv_score_combine combine,
                                   int rotate, kv_score_query **out, kv_score_err *err)
{
  if (out == NULL)
    return FAIL(err, KV_SCORE_EINVAL, "NULL output query", 0, 0);
  *out = NULL;
  size_t eb = kv_score_dtype_bytes(dtype);
  if (eb == 0)
    return FAIL(err, KV_SCORE_EINVAL, "unknown query dtype", dtype, 3);
  if (q == NULL)
    return FAIL(err, KV_SCORE_EINVAL, "NULL query", 0, 0);
  if (n_heads == 0 || n_heads > KV_SCORE_MAX_Q_HEADS)
    return FAIL(err, KV_SCORE_EINVAL, "query heads out of range", n_heads, KV_SCORE_MAX_Q_HEADS);
  if (head_dim == 0 || head_dim > KV_SCORE_MAX_HEAD_DIM)
    return FAIL(err, KV_SCORE_EINVAL, "head_dim out of range", head_dim, KV_SCORE_MAX_HEAD_DIM);
  if (combine != KV_SCORE_SUM && combine != KV_SCORE_MAX)
    return FAIL(err, KV_SCORE_EINVAL, "unknown head combination", combine, 1);
  if (n_heads > 1 && head_stride < head_dim * eb)
    return FAIL(err, KV_SCORE_EINVAL, "query head stride smaller than a head", head_stride,
                head_dim * eb);
  uint32_t n_vec = combine == KV_SCORE_SUM ? 1 : n_heads;
  uint32_t s8 = (head_dim + 63) / 64 * 64, s4 = (head_dim / 2 + 63) / 64 * 64;
  if (s4 == 0)
    s4 = 64;
  size_t bytes = sizeof(kv_score_query) + 64 + (size_t)n_vec * (s8 + 2 * s4) +
                 (size_t)n_vec * (sizeof(int32_t) + sizeof(float));
  kv_score_query *qq = calloc(1, bytes);
  float *x = malloc(head_dim * sizeof(float));
  if (qq == NULL || x == NULL) {
    free(qq);
    free(x);
    return FAIL(err, KV_SCORE_ENOMEM, "out of memory for the query", bytes, 0);
  }
  uint8_t *p = (uint8_t *)(qq + 1);
  p += (64 - (uintptr_t)p % 64) % 64;
  qq->n_vec = n_vec;
  qq->n_heads = n_heads;
  qq->head_dim = head_dim;
  qq->combine = (uint32_t)combine;
  qq->q8_stride = s8;
  qq->q4_stride = s4;
  qq->q8 = (int8_t *)p;
  p += (size_t)n_vec * s8;
  qq->q4lo = (int8_t *)p;
  p += (size_t)n_vec * s4;
  qq->q4hi = (int8_t *)p;
  p += (size_t)n_vec * s4;
  qq->qsum = (int32_t *)(void *)p;
  p += (size_t)n_vec * sizeof(int32_t);
  qq->qscale = (float *)(void *)p;
  for (uint32_t v = 0; v < n_vec; v++) {
    for (uint32_t j = 0; j < head_dim; j++) {
      double acc = 0;
      uint32_t h0 = combine == KV_SCORE_SUM ? 0 : v, h1 = combine == KV_SCORE_SUM ? n_heads : v + 1;
      for (uint32_t h = h0; h < h1; h++) {
        float e = load_elem(dtype, (const uint8_t *)q + (size_t)h * head_stride, j);
        if (!isfinite(e)) {
          free(x);
          free(qq);
          return FAIL(err, KV_SCORE_EINVAL, "query has a NaN or infinite element (value: head)", h,
                      n_heads);
        }
        acc += (double)e;
      }
      x[j] = (float)acc;
      if (!isfinite(x[j])) {
        free(x);
        free(qq);
        return FAIL(err, KV_SCORE_EINVAL, "sum of the query heads overflows float (value: dim)", j,
                    head_dim);
      }
    }
    if (rotate) {
      double xd[KV_SCORE_MAX_HEAD_DIM];
      for (uint32_t j = 0; j < head_dim; j++)
        xd[j] = x[j];
      fwht(xd, head_dim);
      for (uint32_t j = 0; j < head_dim; j++)
        x[j] = (float)xd[j];
    }
    int8_t *c = qq->q8 + (size_t)v * s8;
    quant_row(x, head_dim, 127, c, &qq->qscale[v]);
    int32_t sum = 0;
    for (uint32_t j = 0; j < head_dim; j++)
      sum += c[j];
    qq->qsum[v] = sum;
    for (uint32_t b = 0; b < head_dim / 2; b++) {
      qq->q4lo[(size_t)v * s4 + b] = c[2 * b];
      qq->q4hi[(size_t)v * s4 + b] = c[2 * b + 1];
    }
  }
  free(x);
  *out = qq;
  return KV_SCORE_OK;
}

void kv_score_query_free(kv_score_query *q)
{
  if (q != NULL)
    free(q->rot);
  free(q);
}

uint32_t kv_score_query_n_vec(const kv_score_query *q)
{
  return q ? q->n_vec : 0;
}
uint32_t kv_score_query_head_dim(const kv_score_query *q)
{
  return q ? q->head_dim : 0;
}
const int8_t *kv_score_query_codes(const kv_score_query *q, uint32_t v)
{
  return q && v < q->n_vec ? q->q8 + (size_t)v * q->q8_stride : NULL;
}
float kv_score_query_scale(const kv_score_query *q, uint32_t v)
{
  return q && v < q->n_vec ? q->qscale[v] : 0.0f;
}
const kv_score_query *kv_score_query_rotated(const kv_score_query *q)
{
  return q ? q->rot : NULL;
}

/* ------------------------------------------------------------------------------------------ */
/* Kernel paths                                                                                */

void kv_score_run_portable(const kv_score_query *q, const uint8_t *codes, uint32_t row_bytes,
                           unsigned bits, const float *scales, uint32_t n, float *out)
{
  int32_t dots[KV_SCORE_MAX_Q_HEADS];
  for (uint32_t t = 0; t < n; t++) {
    const uint8_t *row = codes + (size_t)t * row_bytes;
    for (uint32_t v = 0; v < q->n_vec; v++)
      dots[v] = kv_score_dot_row(q, v, row, row_bytes, bits);
    out[t] = kv_score_combine_dots(q, dots, scales[t]);
  }
}

static int cpu_has(kv_score_impl impl)
{
#if defined(__x86_64__) || defined(__i386__)
  switch (impl) {
  case KV_SCORE_IMPL_AVX2:
#ifdef KV_SCORE_HAVE_AVX2
    return __builtin_cpu_supports("avx2");
#else
    return 0;
#endif
  case KV_SCORE_IMPL_AVX512:
#ifdef KV_SCORE_HAVE_AVX512
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vnni");
#else
    return 0;
#endif
  default: return impl == KV_SCORE_IMPL_PORTABLE || impl == KV_SCORE_IMPL_AUTO;
  }
#else
  return impl == KV_SCORE_IMPL_PORTABLE || impl == KV_SCORE_IMPL_AUTO;
#endif
}

int kv_score_impl_available(kv_score_impl impl)
{
  return cpu_has(impl);
}

const char *kv_score_impl_name(kv_score_impl impl)
{
  switch (impl) {
  case KV_SCORE_IMPL_AUTO: return "auto";
  case KV_SCORE_IMPL_PORTABLE: return "portable";
  case KV_SCORE_IMPL_AVX2: return "avx2";
  case KV_SCORE_IMPL_AVX512: return "avx512vnni";
  }
  return "?";
}

static atomic_int auto_impl; /* 0 = not resolved yet */

kv_score_impl kv_score_impl_resolve(kv_score_impl impl)
{
  if (impl != KV_SCORE_IMPL_AUTO)
    return impl;
  int a = atomic_load_explicit(&auto_impl, memory_order_relaxed);
  if (a != 0)
    return (kv_score_impl)a;
  kv_score_impl best = cpu_has(KV_SCORE_IMPL_AVX512) ? KV_SCORE_IMPL_AVX512
                       : cpu_has(KV_SCORE_IMPL_AVX2) ? KV_SCORE_IMPL_AVX2
                                                     : KV_SCORE_IMPL_PORTABLE;
  const char *env = getenv("KVDB_SCORE_IMPL");
  if (env != NULL) {
    kv_score_impl want = strcmp(env, "portable") == 0 ? KV_SCORE_IMPL_PORTABLE
                         : strcmp(env, "avx2") == 0   ? KV_SCORE_IMPL_AVX2
                         : strncmp(env, "avx512", 6) == 0 ? KV_SCORE_IMPL_AVX512
                                                          : KV_SCORE_IMPL_AUTO;
    if (want != KV_SCORE_IMPL_AUTO && cpu_has(want))
      best = want;
  }
  atomic_store_explicit(&auto_impl, (int)best, memory_order_relaxed);
  return best;
}

static kv_score_kernel_fn kernel_of(kv_score_impl impl)
{
  switch (impl) {
#ifdef KV_SCORE_HAVE_AVX2
  case KV_SCORE_IMPL_AVX2: return kv_score_run_avx2;
#endif
#ifdef KV_SCORE_HAVE_AVX512
  case KV_SCORE_IMPL_AVX512: return kv_score_run_avx512;
#endif
  default: return kv_score_run_portable;
  }
}

static kv_score_status pick_kernel(kv_score_impl impl, kv_score_kernel_fn *fn, kv_score_err *err)
{
  if (impl < KV_SCORE_IMPL_AUTO || impl > KV_SCORE_IMPL_AVX512)
    return FAIL(err, KV_SCORE_EINVAL, "unknown kernel path", impl, KV_SCORE_IMPL_AVX512);
  kv_score_impl r = kv_score_impl_resolve(impl);
  if (!cpu_has(r))
    return FAIL(err, KV_SCORE_EUNSUPPORTED, "kernel path not available on this CPU or build", r, 0);
  *fn = kernel_of(r);
  return KV_SCORE_OK;
}

/* Score tokens [t, t + n) of v through fn, cutting at page ends when pages are not full. */
static void score_run_plain(kv_score_kernel_fn fn, const kv_score_query *q, const kv_score_view *v,
                            uint32_t t, uint32_t n, float *out)
{
  const kv_score_layout *l = &v->layout;
  int contiguous = (uint64_t)l->page_tokens * l->row_bytes == KV_SCORE_PAGE_BYTES;
  while (n > 0) {
    uint32_t m = n;
    if (!contiguous) {
      uint32_t left = l->page_tokens - t % l->page_tokens;
      if (m > left)
        m = left;
    }
    const uint8_t *codes = v->codes + (size_t)(t / l->page_tokens) * KV_SCORE_PAGE_BYTES +
                           (size_t)(t % l->page_tokens) * l->row_bytes;
    fn(q, codes, l->row_bytes, l->bits, v->scales + t, m, out);
    t += m;
    n -= m;
    out += m;
  }
}

/* Vector v of q as a query of its own (n_vec 1): pointers into q, nothing allocated. */
static kv_score_query query_vec(const kv_score_query *q, uint32_t v)
{
  kv_score_query one = *q;
  one.n_vec = 1;
  one.q8 = q->q8 + (size_t)v * q->q8_stride;
  one.q4lo = q->q4lo + (size_t)v * q->q4_stride;
  one.q4hi = q->q4hi + (size_t)v * q->q4_stride;
  one.qsum = q->qsum + v;
  one.qscale = q->qscale + v;
  one.rot = NULL;
  return one;
}

/* bias_v of a version-2 view (score.h THE CENTERED, ROTATED COPY); r is the rotated query. */
static float center_bias(const kv_score_query *r, uint32_t v, const kv_score_view *view)
{
  const int8_t *qc = r->q8 + (size_t)v * r->q8_stride;
  int32_t cdot = 0;
  for (uint32_t j = 0; j < r->head_dim; j++)
    cdot += (int32_t)qc[j] * (int32_t)view->center[j];
  return ((float)cdot * r->qscale[v]) * view->center_scale;
}

/* Score tokens [t, t + n) of any view: version 1 as score_run_plain; version 2 with the rotated
 * query, vector by vector (each an n_vec-1 kernel run: part_v), plus each vector's bias, then
 * the greater-than max over vectors, all here in the same order whatever the kernel. */
static void score_run(kv_score_kernel_fn fn, const kv_score_query *q, const kv_score_view *v,
                      uint32_t t, uint32_t n, float *out)
{
  if (v->layout.variant == 0) {
    score_run_plain(fn, q, v, t, n, out);
    return;
  }
  const kv_score_query *r = q->rot;
  if (r->n_vec == 1) {
    float b = center_bias(r, 0, v);
    score_run_plain(fn, r, v, t, n, out);
    for (uint32_t i = 0; i < n; i++)
      out[i] = out[i] + b;
    return;
  }
  float part[256];
  for (uint32_t i0 = 0; i0 < n; i0 += 256) {
    uint32_t m = n - i0 < 256 ? n - i0 : 256;
    for (uint32_t vv = 0; vv < r->n_vec; vv++) {
      kv_score_query one = query_vec(r, vv);
      float b = center_bias(r, vv, v);
      score_run_plain(fn, &one, v, t + i0, m, part);
      for (uint32_t i = 0; i < m; i++) {
        float x = part[i] + b;
        if (vv == 0 || x > out[i0 + i])
          out[i0 + i] = x;
      }
    }
  }
}

static kv_score_status check_view(const kv_score_query *q, const kv_score_view *v,
                                  kv_score_err *err)
{
  if (v == NULL || v->codes == NULL || v->scales == NULL)
    return FAIL(err, KV_SCORE_EINVAL, "NULL view or view without codes", 0, 0);
  if (v->layout.head_dim != q->head_dim)
    return FAIL(err, KV_SCORE_EINVAL, "view head_dim differs from the query's", v->layout.head_dim,
                q->head_dim);
  if (kv_score_row_bytes(v->layout.head_dim, v->layout.bits) != v->layout.row_bytes ||
      v->layout.page_tokens == 0)
    return FAIL(err, KV_SCORE_EINVAL, "view layout is not initialized", 0, 0);
  if (v->layout.variant != 0 && (v->center == NULL || q->rot == NULL))
    return FAIL(err, KV_SCORE_EINVAL, "centered view without center codes or rotated query", 0, 0);
  return KV_SCORE_OK;
}

kv_score_status kv_score_tokens(const kv_score_query *q, const kv_score_view *v, uint32_t first,
                                uint32_t n, kv_score_impl impl, float *out, kv_score_err *err)
{
  if (q == NULL || out == NULL)
    return FAIL(err, KV_SCORE_EINVAL, "NULL query or output", 0, 0);
  kv_score_status rc = check_view(q, v, err);
  if (rc != KV_SCORE_OK)
    return rc;
  if ((uint64_t)first + n > v->layout.n_tokens)
    return FAIL(err, KV_SCORE_EINVAL, "token range past the end of the view", (uint64_t)first + n,
                v->layout.n_tokens);
  kv_score_kernel_fn fn;
  rc = pick_kernel(impl, &fn, err);
  if (rc != KV_SCORE_OK)
    return rc;
  score_run(fn, q, v, first, n, out);
  return KV_SCORE_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* The order and the accumulator                                                               */

static inline uint32_t sort_key(float s)
{
  uint32_t b;
  memcpy(&b, &s, 4);
  if ((b & 0x7fffffffu) > 0x7f800000u)
    return 0; /* NaN: below everything */
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

static inline float key_score(uint32_t key)
{
  uint32_t b = key == 0 ? 0x7fc00000u : (key & 0x80000000u) ? (key & 0x7fffffffu) : ~key;
  float s;
  memcpy(&s, &b, 4);
  return s;
}

static inline uint64_t entry_of(uint32_t pos, float score)
{
  return ((uint64_t)sort_key(score) << 32) | (uint32_t)~pos;
}

int kv_score_better(uint32_t pos_a, float score_a, uint32_t pos_b, float score_b)
{
  return entry_of(pos_a, score_a) > entry_of(pos_b, score_b);
}

/* Candidates are appended without branches in batches of at most ACC_BATCH, so the buffer
 * has that much slack beyond the 2k at which it is compacted. */
#define ACC_BATCH 256u
/* From this k on, an accumulator also keeps a histogram of 2^ACC_HIST_BITS counters. */
#define ACC_HIST_MIN_K 1024u
#ifndef ACC_HIST_BITS
#define ACC_HIST_BITS 12u
#endif
#define ACC_HIST_N (1u << ACC_HIST_BITS)
/* Buckets of at most this many entries are ordered by the final insertion pass of top_sorted. */
#define TOP_SMALL 32u

size_t kv_score_acc_bytes(uint32_t k)
{
  return ((size_t)k * 2 + ACC_BATCH) * sizeof(uint64_t) +
         (k >= ACC_HIST_MIN_K ? (size_t)ACC_HIST_N * sizeof(uint32_t) : 0);
}

kv_score_status kv_score_acc_init(kv_score_acc *acc, uint32_t k, void *mem, size_t mem_bytes,
                                  kv_score_err *err)
{
  if (acc == NULL || mem == NULL)
    return FAIL(err, KV_SCORE_EINVAL, "NULL accumulator or memory", 0, 0);
  if (k == 0)
    return FAIL(err, KV_SCORE_EINVAL, "k is 0", 0, 1);
  if (k > (UINT32_MAX - ACC_BATCH) / 2)
    return FAIL(err, KV_SCORE_EINVAL, "k too large", k, (UINT32_MAX - ACC_BATCH) / 2);
  if ((uintptr_t)mem % 8 != 0)
    return FAIL(err, KV_SCORE_EINVAL, "accumulator memory not 8-byte aligned", (uintptr_t)mem % 8, 8);
  if (mem_bytes < kv_score_acc_bytes(k))
    return FAIL(err, KV_SCORE_ENOMEM, "accumulator memory too small", mem_bytes,
                kv_score_acc_bytes(k));
  memset(acc, 0, sizeof *acc);
  acc->buf = mem;
  acc->k = k;
  acc->cap = 2 * k;
  acc->thr = 0;
  acc->thr_score = -INFINITY;
  if (k >= ACC_HIST_MIN_K)
    acc->hist = (uint32_t *)(void *)(acc->buf + (size_t)k * 2 + ACC_BATCH);
  return KV_SCORE_OK;
}

/* Descending sort of a[0..n). Short runs: insertion sort. Otherwise an LSD radix sort on the
 * bytes of ~e (ascending ~e = descending e) using tmp[0..n) as the other buffer; passes whose
 * byte is the same for every entry are skipped. */
static void sort_desc(uint64_t *a, size_t n, uint64_t *tmp)
{
  if (n < 64 || tmp == NULL) {
    for (size_t i = 1; i < n; i++) {
      uint64_t x = a[i];
      size_t j = i;
      while (j > 0 && a[j - 1] < x) {
        a[j] = a[j - 1];
        j--;
      }
      a[j] = x;
    }
    return;
  }
  static const size_t NB = 256;
  size_t hist[8][256];
  memset(hist, 0, sizeof hist);
  for (size_t i = 0; i < n; i++) {
    uint64_t x = ~a[i];
    for (unsigned b = 0; b < 8; b++)
      hist[b][(x >> (8 * b)) & 255]++;
  }
  uint64_t *src = a, *dst = tmp;
  for (unsigned b = 0; b < 8; b++) {
    size_t *h = hist[b], sum = 0;
    int trivial = 0;
    for (size_t d = 0; d < NB; d++)
      if (h[d] == n)
        trivial = 1;
    if (trivial)
      continue;
    for (size_t d = 0; d < NB; d++) {
      size_t c = h[d];
      h[d] = sum;
      sum += c;
    }
    for (size_t i = 0; i < n; i++) {
      uint64_t e = src[i];
      dst[h[((~e) >> (8 * b)) & 255]++] = e;
    }
    uint64_t *t = src;
    src = dst;
    dst = t;
  }
  if (src != a)
    memcpy(a, src, n * sizeof *a);
}

/* a[0..need) := the `need` largest entries of a[0..n) in descending order (1 <= need <= n), with
 * tmp[0..tmp_cap) as scratch and cnt[0..4096) as counters; what a[need..n) holds afterwards is
 * undefined. Returns 0 (a[] unchanged) when tmp_cap is less than the entries the pass keeps
 * (need and the rest of the boundary digit's bucket): never when tmp_cap >= n.
 * The entries' range [mn, mx] is cut into 2^(2D) equal steps, x = (e - mn) >> sh (subtracting mn
 * rather than taking top bits keeps the steps even where the scores straddle a power of two),
 * D = 11 for thousands of entries (fewer for fewer). One pass counts both D-bit digits of x,
 * the high digit's counts give the boundary (the lowest high digit still needed), one pass keeps
 * the entries at and above it (stable) while counting their low digits, and two stable
 * scatters (low digit, then high) order them by x: an LSD radix sort of about k entries, every
 * pass branch-free. Entries of equal x (about one pair per thousand: a step is 2^-22 of the
 * range) are put in order by insertion; a long run of them (ties of score, one far outlier)
 * by the same sort on its own range, whose steps are 2^22 times finer. */
typedef struct lsd_plan {
  uint64_t mn; /* x = (e - mn) >> sh < 2^(2D) for every entry e in [mn, mx] */
  unsigned sh, D;
} lsd_plan;

static void lsd_plan_init(lsd_plan *p, uint64_t mn, uint64_t mx, size_t n)
{
  const uint64_t rng = mx - mn;
  const unsigned rbits = rng ? 64u - (unsigned)__builtin_clzll(rng) : 0; /* rng < 2^rbits */
  const unsigned nbits = 64u - (unsigned)__builtin_clzll((uint64_t)n | 1); /* n < 2^nbits */
  p->mn = mn;
  p->D = nbits < 6 ? 6 : nbits > 11 ? 11 : nbits;
  p->sh = rbits > 2 * p->D ? rbits - 2 * p->D : 0;
}

static int top_sorted_counted(uint64_t *a, size_t n, size_t need, uint64_t *tmp, size_t tmp_cap,
                              uint32_t *cnt, const lsd_plan *p);

static int top_sorted(uint64_t *a, size_t n, size_t need, uint64_t *tmp, size_t tmp_cap,
                      uint32_t *cnt)
{
  if (n <= TOP_SMALL) {
    sort_desc(a, n, NULL);
    return 1;
  }
  uint64_t mn = a[0], mx = a[0];
  for (size_t i = 1; i < n; i++) {
    mn = a[i] < mn ? a[i] : mn;
    mx = a[i] > mx ? a[i] : mx;
  }
  if (mn == mx)
    return 1; /* equal entries: any order is the order */
  lsd_plan p;
  lsd_plan_init(&p, mn, mx, n);
  memset(cnt, 0, ((size_t)2 << p.D) * sizeof *cnt);
  for (size_t i = 0; i < n; i++)
    cnt[(uint32_t)((a[i] - mn) >> p.sh) >> p.D]++;
  return top_sorted_counted(a, n, need, tmp, tmp_cap, cnt, &p);
}

/* top_sorted once the entries' high digits are counted in cnt[0 .. 2^D) (and cnt[2^D .. 2^(2D+1))
 * is zero): the caller may count them in a pass of its own. */
static int top_sorted_counted(uint64_t *a, size_t n, size_t need, uint64_t *tmp, size_t tmp_cap,
                              uint32_t *cnt, const lsd_plan *p)
{
  const uint64_t mn = p->mn;
  const unsigned sh = p->sh, D = p->D;
  const uint32_t ND = 1u << D, MD = ND - 1;
  uint32_t *hi = cnt, *lo = cnt + ND;
  uint32_t bb = MD;
  size_t m = 0;
  while (m + hi[bb] < need) {
    m += hi[bb];
    bb--;
  }
  m += hi[bb]; /* kept: the entries of high digits bb .. ND-1 */
  if (m > tmp_cap)
    return 0;
  /* keep them (stable, in place) and count their low digits */
  size_t j = 0;
  for (size_t i = 0; i < n; i++) {
    uint64_t e = a[i];
    uint32_t x = (uint32_t)((e - mn) >> sh);
    uint32_t keep = (x >> D) >= bb;
    a[j] = e;
    j += keep;
    lo[x & MD] += keep;
  }
  /* counts -> starts, best digit first */
  uint32_t sum = 0;
  for (uint32_t d = ND; d-- > 0;) {
    uint32_t c = lo[d];
    lo[d] = sum;
    sum += c;
  }
  sum = 0;
  for (uint32_t d = ND; d-- > bb;) {
    uint32_t c = hi[d];
    hi[d] = sum;
    sum += c;
  }
  for (size_t i = 0; i < m; i++) {
    uint64_t e = a[i];
    tmp[lo[(uint32_t)((e - mn) >> sh) & MD]++] = e;
  }
  for (size_t i = 0; i < m; i++) {
    uint64_t e = tmp[i];
    a[hi[(uint32_t)((e - mn) >> sh) >> D]++] = e;
  }
  /* runs of equal x: insertion, or the same sort when long */
  for (size_t i = 0; i < need;) {
    uint64_t xi = (a[i] - mn) >> sh;
    size_t r = i + 1;
    while (r < m && (a[r] - mn) >> sh == xi)
      r++;
    if (r - i > TOP_SMALL) {
      uint32_t sub[4096];
      (void)top_sorted(a + i, r - i, r - i, tmp + i, r - i, sub);
    } else if (r - i > 1) {
      sort_desc(a + i, r - i, NULL);
    }
    i = r;
  }
  return 1;
}

/* Branch-free partition of a[0..n): entries whose digit (e >> shift) & mask satisfies the test
 * first (stable order not kept). Returns how many. */
static size_t part_digit_gt(uint64_t *a, size_t n, unsigned shift, uint64_t mask, uint64_t b)
{
  size_t j = 0;
  for (size_t i = 0; i < n; i++) {
    uint64_t x = a[i], y = a[j];
    size_t take = ((x >> shift) & mask) > b;
    a[i] = y;
    a[j] = x;
    j += take;
  }
  return j;
}
static size_t part_digit_eq(uint64_t *a, size_t n, unsigned shift, uint64_t mask, uint64_t b)
{
  size_t j = 0;
  for (size_t i = 0; i < n; i++) {
    uint64_t x = a[i], y = a[j];
    size_t take = ((x >> shift) & mask) == b;
    a[i] = y;
    a[j] = x;
    j += take;
  }
  return j;
}

/* Reorder a[0..n) so that a[0..k) are its k largest entries (0 < k <= n): an MSB radix select
 * with branch-free partitions (the entries of a top k are mostly random, so comparison-based
 * partitions mispredict on every other element). Each level first finds the highest bit in
 * which the remaining entries differ (min/max pass) and histograms the 11 bits from there down,
 * so no pass is spent on bits the entries share (scores of a top k share their sign, exponent
 * and leading mantissa bits). */
static void select_top(uint64_t *a, size_t n, size_t k)
{
  enum { DIG = 11 };
  size_t lo = 0, hi = n; /* a[0..lo) are in; the answer's rest is in a[lo..hi) */
  uint32_t hist[1u << DIG];
  while (lo < k) {
    size_t m = hi - lo, need = k - lo;
    if (m <= 64) {
      sort_desc(a + lo, m, NULL);
      return;
    }
    uint64_t mn = a[lo], mx = a[lo];
    for (size_t i = lo + 1; i < hi; i++) {
      mn = a[i] < mn ? a[i] : mn;
      mx = a[i] > mx ? a[i] : mx;
    }
    if (mn == mx)
      return; /* all equal: any need of them */
    unsigned top = 63u - (unsigned)__builtin_clzll(mn ^ mx);
    unsigned sh = top >= DIG - 1 ? top - (DIG - 1) : 0;
    uint64_t mask = ((uint64_t)1 << (top - sh + 1)) - 1;
    memset(hist, 0, sizeof(uint32_t) * (size_t)(mask + 1));
    for (size_t i = lo; i < hi; i++)
      hist[(a[i] >> sh) & mask]++;
    size_t cum = 0;
    uint64_t b = mask;
    for (;; b--) {
      if (cum + hist[b] >= need)
        break;
      cum += hist[b];
    }
    size_t gt = part_digit_gt(a + lo, m, sh, mask, b);
    size_t eq = hist[b];
    if (eq != m - gt)
      (void)part_digit_eq(a + lo + gt, m - gt, sh, mask, b);
    if (gt + eq == need)
      return;
    lo += gt;
    hi = lo + eq;
  }
}

/* THE THRESHOLD. thr is such that no entry below it can be in the top k of what was pushed:
 * either the k-th best of k entries held (after a selection) or one below the floor of a
 * histogram bucket at and above which k pushed entries were counted. Entries <= thr are not
 * admitted (a new entry never equals an old one: positions are distinct); entries < thr are
 * dropped from the buffer, entries equal to it kept (it may be the k-th best itself). */

/* Raise the admission threshold to m (an entry value) if higher. */
static void acc_raise(kv_score_acc *a, uint64_t m)
{
  if (a->have_thr && m <= a->thr)
    return;
  a->thr = m;
  a->have_thr = 1;
  uint32_t key = (uint32_t)(m >> 32);
  /* the float filter must never reject an entry above thr: with a NaN threshold, none. A
   * histogram threshold ends a bucket, and keys 1 .. 0x007fffff and above 0xff800000 are no
   * float's (sort_key sends every NaN to 0): below -inf the filter takes everything, above +inf
   * it takes +inf, and the entry compare decides. */
  float f = key == 0 ? -INFINITY : key_score(key);
  if (isnan(f))
    f = key < 0x80000000u ? -INFINITY : INFINITY;
  a->thr_score = f;
  if (key == 0)
    a->have_thr = 2; /* entry compare only */
}

/* Keep exactly the best k (radix select); the threshold becomes the k-th best. */
static void acc_compact(kv_score_acc *a)
{
  if (a->n <= a->k)
    return;
  select_top(a->buf, a->n, a->k);
  a->n = a->k;
  uint64_t m = a->buf[0];
  for (uint32_t i = 1; i < a->k; i++)
    m = a->buf[i] < m ? a->buf[i] : m;
  acc_raise(a, m);
}

/* Drop the buffer's entries below the threshold (keeping their order). */
static void acc_drop_below(kv_score_acc *a)
{
#ifdef KV_SCORE_HAVE_AVX512
  if (kv_score_impl_resolve(KV_SCORE_IMPL_AUTO) == KV_SCORE_IMPL_AVX512) {
    a->n = kv_score_keep_ge_avx512(a->buf, a->n, a->thr);
    return;
  }
#endif
  uint64_t thr = a->thr, *buf = a->buf;
  uint32_t j = 0;
  for (uint32_t i = 0; i < a->n; i++) {
    uint64_t e = buf[i];
    buf[j] = e;
    j += e >= thr;
  }
  a->n = j;
}

/* THE HISTOGRAM (k >= ACC_HIST_MIN_K). hist[b] counts pushed entries whose score key lies in
 * bucket b = (key - hbase) >> hshift (keys below hbase in bucket 0, above the last bucket in
 * it): each admitted entry is counted once, dropped or not, so when the counts of the buckets
 * above b add up to k or more, k distinct entries beat every entry of bucket b and below, and
 * bstar, the lowest bucket that can still hold a top-k entry, rises with them and the
 * threshold with it. The buckets are set up ("armed") on the range of the first k entries and
 * again on the best k after every selection (ACC_HIST_N buckets over about twice that range),
 * so the threshold follows the running k-th best to within a few entries and a full buffer is
 * emptied by one pass (acc_drop_below) instead of a selection. (Session 25's histogram had
 * fixed buckets of 1/8 octave; the top 10% of a context's scores spans about 3 of them.) */
static inline uint32_t hist_bucket(const kv_score_acc *a, uint64_t e)
{
  uint32_t key = (uint32_t)(e >> 32);
  uint32_t d = key >= a->hbase ? (key - a->hbase) >> a->hshift : 0;
  return d < ACC_HIST_N - 1 ? d : ACC_HIST_N - 1;
}

static void acc_hist_raise(kv_score_acc *a)
{
  const uint32_t *h = a->hist;
  uint32_t b = a->bstar;
  while (a->cnt_ge - h[b] >= a->k) { /* stops at the last bucket: cnt_ge is then h[b] */
    a->cnt_ge -= h[b];
    b++;
  }
  if (b != a->bstar) {
    a->bstar = b;
    /* k entries have keys >= floor (so floor < 2^32): thr = (floor - 1, position 0) */
    uint64_t floor = (uint64_t)a->hbase + ((uint64_t)b << a->hshift);
    acc_raise(a, (floor << 32) - 1);
  }
}

/* Set the buckets up on the range of the entries held and count them. */
static void acc_hist_arm(kv_score_acc *a)
{
  const uint64_t *buf = a->buf;
  uint32_t n = a->n;
  if (n == 0) {
    a->harmed = 0;
    return;
  }
  uint64_t mn = buf[0], mx = buf[0];
  for (uint32_t i = 1; i < n; i++) {
    mn = buf[i] < mn ? buf[i] : mn;
    mx = buf[i] > mx ? buf[i] : mx;
  }
  uint32_t lo = (uint32_t)(mn >> 32), rng = (uint32_t)(mx >> 32) - lo;
  unsigned rbits = rng ? 32u - (unsigned)__builtin_clz(rng) : 0; /* rng < 2^rbits */
  a->hbase = lo;
  a->hshift = rbits > ACC_HIST_BITS - 1 ? rbits - (ACC_HIST_BITS - 1) : 0; /* half the buckets */
  memset(a->hist, 0, (size_t)ACC_HIST_N * sizeof *a->hist);
  for (uint32_t i = 0; i < n; i++)
    a->hist[hist_bucket(a, buf[i])]++;
  a->bstar = 0;
  a->cnt_ge = n;
  a->emax = mx;
  a->harmed = 1;
  acc_hist_raise(a);
}

/* Count the entries buf[n0..n) just added. */
static void acc_hist_add(kv_score_acc *a, uint32_t n0)
{
  if (!a->harmed) {
    if (a->n >= a->k)
      acc_hist_arm(a);
    return;
  }
  uint32_t *h = a->hist, bs = a->bstar;
  uint64_t ge = 0, mx = a->emax;
  for (uint32_t i = n0; i < a->n; i++) {
    uint64_t e = a->buf[i];
    uint32_t b = hist_bucket(a, e);
    h[b]++;
    ge += b >= bs; /* the float filter lets a few entries of the bucket below through */
    mx = e > mx ? e : mx;
  }
  a->cnt_ge += ge;
  a->emax = mx;
  acc_hist_raise(a);
}

/* The buffer is full: drop what the threshold now refuses; if that leaves more than 1.5 k, the
 * exact selection (and the histogram set up again on the best k). */
static void acc_make_room(kv_score_acc *a)
{
  if (a->have_thr) {
    acc_drop_below(a);
    if (a->n <= a->k + a->k / 2)
      return;
  }
  acc_compact(a);
  if (a->hist != NULL)
    acc_hist_arm(a);
}

/* Entries buf[n0..n) were just appended. */
static inline void acc_added(kv_score_acc *a, uint32_t n0)
{
  if (a->hist != NULL)
    acc_hist_add(a, n0);
  if (a->n >= a->cap)
    acc_make_room(a);
}

/* Append entries e[0..m) (m <= ACC_BATCH) that beat the threshold, without branches. */
static inline void acc_add_batch(kv_score_acc *a, const uint64_t *e, uint32_t m)
{
  uint64_t thr = a->thr; /* 0 before the first compaction: every entry but (NaN, pos ~0) passes */
  uint64_t *buf = a->buf;
  uint32_t n = a->n, n0 = n;
  int all = !a->have_thr;
  for (uint32_t i = 0; i < m; i++) {
    buf[n] = e[i];
    n += e[i] > thr || all;
  }
  a->n = n;
  acc_added(a, n0);
}

void kv_score_acc_push(kv_score_acc *acc, uint32_t pos, float score)
{
  uint64_t e = entry_of(pos, score);
  acc->n_pushed++;
  acc_add_batch(acc, &e, 1);
}

/* The candidates of m scores: entries of the scores >= thr, in order, to out (room for m). */
typedef uint32_t (*cand_fn)(const float *s, uint32_t m, float thr, uint32_t pos0, uint64_t *out);

static uint32_t cand_scalar(const float *s, uint32_t m, float thr, uint32_t pos0, uint64_t *out)
{
  uint32_t c = 0;
  for (uint32_t j = 0; j < m; j++) {
    out[c] = entry_of(pos0 + j, s[j]);
    c += s[j] >= thr;
  }
  return c;
}

/* The candidate path follows the kernels' dispatch (the CPU, and KVDB_SCORE_IMPL): the same
 * entries in the same order on every path; the scalar loop costs about 1 ns per token, a
 * visible share of a k = 10% scan. */
static cand_fn cand_impl(void)
{
  switch (kv_score_impl_resolve(KV_SCORE_IMPL_AUTO)) {
#ifdef KV_SCORE_HAVE_AVX512
  case KV_SCORE_IMPL_AVX512: return kv_score_cand_avx512;
#endif
#ifdef KV_SCORE_HAVE_AVX2
  case KV_SCORE_IMPL_AVX2: return kv_score_cand_avx2;
#endif
  default: return cand_scalar;
  }
}

void kv_score_acc_push_scores(kv_score_acc *acc, uint32_t pos_base, const float *scores, uint32_t n)
{
  acc->n_pushed += n;
  cand_fn cand = NULL;
  for (uint32_t i = 0; i < n; i += ACC_BATCH) {
    uint32_t m = n - i < ACC_BATCH ? n - i : ACC_BATCH;
    const float *s = scores + i;
    if (cand == NULL)
      cand = cand_impl();
    if (acc->have_thr == 1) {
      /* the float filter (a score below thr_score cannot beat thr; NaN fails), the entries
       * written straight to the buffer (n < cap: room for ACC_BATCH more). It may let through
       * entries equal in score to thr's (or -0 against +0): harmless, THE THRESHOLD drops them. */
      uint32_t n0 = acc->n;
      acc->n += cand(s, m, acc->thr_score, pos_base + i, acc->buf + n0);
      acc_added(acc, n0);
    } else if (acc->have_thr == 0 &&
               cand(s, m, -INFINITY, pos_base + i, acc->buf + acc->n) == m) {
      /* no threshold yet: every entry enters; the same path builds them when none is a NaN
       * (which the ordered compare refuses: such a batch takes the loop below) */
      uint32_t n0 = acc->n;
      acc->n += m;
      acc_added(acc, n0);
    } else {
      uint64_t e[ACC_BATCH];
      for (uint32_t j = 0; j < m; j++)
        e[j] = entry_of(pos_base + i + j, s[j]);
      acc_add_batch(acc, e, m);
    }
  }
}

void kv_score_acc_push_pairs(kv_score_acc *acc, const kv_score_pair *pairs, size_t n)
{
  uint64_t e[ACC_BATCH];
  acc->n_pushed += n;
  for (size_t i = 0; i < n; i += ACC_BATCH) {
    uint32_t m = (uint32_t)(n - i < ACC_BATCH ? n - i : ACC_BATCH);
    for (uint32_t j = 0; j < m; j++)
      e[j] = entry_of(pairs[i + j].pos, pairs[i + j].score);
    acc_add_batch(acc, e, m);
  }
}

void kv_score_acc_merge(kv_score_acc *acc, kv_score_acc *src)
{
  acc_compact(src);
  acc->n_pushed += src->n;
  for (uint32_t i = 0; i < src->n; i += ACC_BATCH) {
    uint32_t m = src->n - i < ACC_BATCH ? src->n - i : ACC_BATCH;
    acc_add_batch(acc, src->buf + i, m);
  }
}

uint32_t kv_score_acc_finish(kv_score_acc *acc, uint32_t *pos, float *scores)
{
  uint64_t *buf = acc->buf;
  /* top_sorted's scratch is the buffer's rest (2k + ACC_BATCH entries in all): about k + a
   * bucket is kept there; if that does not fit, the exact selection first (then n = k) */
  uint32_t small[4096];
  uint32_t *cnt = acc->hist != NULL ? acc->hist : small;
  int counted = 0;
  if (acc->n > acc->k && acc->have_thr) {
    if (acc->hist != NULL && acc->harmed && acc->emax >= acc->thr) {
      /* every entry held is <= emax, and those kept >= thr: the radix plan is known before
       * the pass that drops the rest, which counts the kept ones' high digits too */
      lsd_plan p;
      lsd_plan_init(&p, acc->thr, acc->emax, acc->n);
      memset(cnt, 0, ((size_t)2 << p.D) * sizeof *cnt);
      uint64_t thr = acc->thr;
      uint32_t j = 0;
      for (uint32_t i = 0; i < acc->n; i++) {
        uint64_t e = buf[i];
        uint32_t keep = e >= thr;
        buf[j] = e;
        j += keep;
        cnt[(uint32_t)(((e - thr) >> p.sh) >> p.D) & ((keep << p.D) - keep)] += keep;
      }
      acc->n = j;
      counted = j > acc->k && j > TOP_SMALL &&
                top_sorted_counted(buf, j, acc->k, buf + j, (size_t)acc->k * 2 + ACC_BATCH - j,
                                   cnt, &p);
    } else {
      acc_drop_below(acc);
    }
  }
  uint32_t got = acc->n < acc->k ? acc->n : acc->k;
  if (got > 0 && !counted &&
      !top_sorted(buf, acc->n, got, buf + acc->n, (size_t)acc->k * 2 + ACC_BATCH - acc->n, cnt)) {
    acc_compact(acc);
    (void)top_sorted(buf, acc->n, got, buf + acc->n, (size_t)acc->k * 2 + ACC_BATCH - acc->n, cnt);
  }
  acc->n = got;
  if (got == acc->k)
    acc_raise(acc, buf[got - 1]);
  acc->harmed = 0; /* the counters served top_sorted: set up again on the next push */
  for (uint32_t i = 0; i < got; i++) {
    uint64_t e = buf[i];
    if (pos != NULL)
      pos[i] = ~(uint32_t)e;
    if (scores != NULL)
      scores[i] = key_score((uint32_t)(e >> 32));
  }
  return got;
}

/* ------------------------------------------------------------------------------------------ */
/* Top-k over spans, threaded                                                                  */

#define CHUNK_TOKENS 256u
#define MAX_THREADS 64u

void kv_score_opts_init(kv_score_opts *o)
{
  if (o == NULL)
    return;
  memset(o, 0, sizeof *o);
  o->impl = KV_SCORE_IMPL_AUTO;
}

size_t kv_score_topk_scratch_bytes(uint32_t k, unsigned n_threads)
{
  if (n_threads == 0 || n_threads > MAX_THREADS)
    n_threads = MAX_THREADS;
  return (size_t)n_threads * kv_score_acc_bytes(k) + 64;
}

typedef struct topk_work {
  const kv_score_query *q;
  kv_score_kernel_fn fn;
  const kv_score_span *spans;
  size_t n_spans;
  uint64_t begin, end; /* over the concatenated spans */
  kv_score_acc acc;
  pthread_t tid;
  int started;
} topk_work;

static void run_work(topk_work *w)
{
  float buf[CHUNK_TOKENS];
  uint64_t g0 = 0;
  for (size_t s = 0; s < w->n_spans && g0 < w->end; s++) {
    const kv_score_span *sp = &w->spans[s];
    uint64_t g1 = g0 + sp->n;
    uint64_t a = w->begin > g0 ? w->begin : g0, b = w->end < g1 ? w->end : g1;
    for (uint64_t x = a; x < b;) {
      uint32_t m = (uint32_t)(b - x < CHUNK_TOKENS ? b - x : CHUNK_TOKENS);
      uint32_t t = sp->first + (uint32_t)(x - g0);
      score_run(w->fn, w->q, sp->view, t, m, buf);
      kv_score_acc_push_scores(&w->acc, sp->pos_base + t, buf, m);
      x += m;
    }
    g0 = g1;
  }
}

static void *work_main(void *arg)
{
  run_work(arg);
  return NULL;
}

static unsigned online_cpus(void)
{
  static atomic_uint cached;
  unsigned c = atomic_load_explicit(&cached, memory_order_relaxed);
  if (c == 0) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    c = n < 1 ? 1u : n > (long)MAX_THREADS ? MAX_THREADS : (unsigned)n;
    atomic_store_explicit(&cached, c, memory_order_relaxed);
  }
  return c;
}

kv_score_status kv_score_topk(const kv_score_query *q, const kv_score_span *spans, size_t n_spans,
                              uint32_t k, const kv_score_opts *opts, void *scratch,
                              size_t scratch_bytes, uint32_t *out_pos, float *out_scores,
                              uint32_t *n_out, kv_score_err *err)
{
  if (n_out != NULL)
    *n_out = 0;
  if (q == NULL)
    return FAIL(err, KV_SCORE_EINVAL, "NULL query", 0, 0);
  if (spans == NULL && n_spans > 0)
    return FAIL(err, KV_SCORE_EINVAL, "NULL spans", 0, 0);
  if (out_pos == NULL && out_scores == NULL)
    return FAIL(err, KV_SCORE_EINVAL, "NULL outputs (both positions and scores)", 0, 0);
  if (k == 0)
    return FAIL(err, KV_SCORE_EINVAL, "k is 0", 0, 1);
  uint64_t total = 0, code_bytes = 0;
  for (size_t s = 0; s < n_spans; s++) {
    kv_score_status rc = check_view(q, spans[s].view, err);
    if (rc != KV_SCORE_OK)
      return rc;
    if ((uint64_t)spans[s].first + spans[s].n > spans[s].view->layout.n_tokens)
      return FAIL(err, KV_SCORE_EINVAL, "span past the end of its view (value: span)", s,
                  spans[s].view->layout.n_tokens);
    if ((uint64_t)spans[s].pos_base + spans[s].first + spans[s].n > (uint64_t)UINT32_MAX + 1)
      return FAIL(err, KV_SCORE_EINVAL, "span positions exceed 32 bits (value: span)", s, 0);
    total += spans[s].n;
    code_bytes += (uint64_t)spans[s].n * spans[s].view->layout.row_bytes;
  }
  if (total > UINT32_MAX)
    return FAIL(err, KV_SCORE_EINVAL, "more than 2^32 - 1 tokens", total, UINT32_MAX);
  if (k > total)
    return FAIL(err, KV_SCORE_EINVAL, "k is larger than the number of tokens", k, total);
  kv_score_opts defaults;
  if (opts == NULL) {
    kv_score_opts_init(&defaults);
    opts = &defaults;
  }
  kv_score_kernel_fn fn;
  kv_score_status rc = pick_kernel(opts->impl, &fn, err);
  if (rc != KV_SCORE_OK)
    return rc;

  unsigned nt = opts->n_threads;
  if (nt == 0) {
    uint64_t per = opts->min_thread_bytes ? opts->min_thread_bytes : (2u << 20);
    uint64_t by_size = code_bytes / per;
    nt = online_cpus();
    if (by_size < nt)
      nt = by_size < 1 ? 1 : (unsigned)by_size;
  }
  if (nt > MAX_THREADS)
    nt = MAX_THREADS;
  if (nt > total / 16)
    nt = total / 16 > 0 ? (unsigned)(total / 16) : 1;

  size_t need = kv_score_topk_scratch_bytes(k, nt);
  void *owned = NULL;
  if (scratch == NULL) {
    owned = malloc(need);
    if (owned == NULL)
      return FAIL(err, KV_SCORE_ENOMEM, "out of memory for the top-k buffers", need, 0);
    scratch = owned;
    scratch_bytes = need;
  } else if (scratch_bytes < need) {
    return FAIL(err, KV_SCORE_ENOMEM, "scratch smaller than kv_score_topk_scratch_bytes()",
                scratch_bytes, need);
  }
  uint8_t *mem = scratch;
  mem += (8 - (uintptr_t)mem % 8) % 8;

  topk_work work[MAX_THREADS];
  uint64_t per = (total + nt - 1) / nt;
  per = (per + 15) / 16 * 16;
  for (unsigned i = 0; i < nt; i++) {
    topk_work *w = &work[i];
    memset(w, 0, sizeof *w);
    w->q = q;
    w->fn = fn;
    w->spans = spans;
    w->n_spans = n_spans;
    w->begin = (uint64_t)i * per < total ? (uint64_t)i * per : total;
    w->end = (uint64_t)(i + 1) * per < total ? (uint64_t)(i + 1) * per : total;
    (void)kv_score_acc_init(&w->acc, k, mem + (size_t)i * kv_score_acc_bytes(k),
                            kv_score_acc_bytes(k), NULL);
  }
  /* workers 1..nt-1 on their own threads; a thread that cannot start runs here instead */
  for (unsigned i = 1; i < nt; i++)
    work[i].started = pthread_create(&work[i].tid, NULL, work_main, &work[i]) == 0;
  run_work(&work[0]);
  for (unsigned i = 1; i < nt; i++) {
    if (work[i].started)
      pthread_join(work[i].tid, NULL);
    else
      run_work(&work[i]);
  }
  for (unsigned i = 1; i < nt; i++)
    kv_score_acc_merge(&work[0].acc, &work[i].acc);
  uint32_t got = kv_score_acc_finish(&work[0].acc, out_pos, out_scores);
  free(owned);
  if (n_out != NULL)
    *n_out = got;
  return KV_SCORE_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* Exact reference                                                                             */

kv_score_status kv_score_exact(kv_score_dtype kdtype, const void *keys, size_t key_stride,
                               uint32_t n, uint32_t head_dim, kv_score_dtype qdtype, const void *q,
                               uint32_t n_heads, size_t q_stride, kv_score_combine combine,
                               float *out, kv_score_err *err)
{
  size_t kb = kv_score_dtype_bytes(kdtype), qb = kv_score_dtype_bytes(qdtype);
  if (kb == 0 || qb == 0)
    return FAIL(err, KV_SCORE_EINVAL, "unknown key or query dtype", kb == 0 ? kdtype : qdtype, 3);
  if (keys == NULL || q == NULL || out == NULL)
    return FAIL(err, KV_SCORE_EINVAL, "NULL keys, query or output", 0, 0);
  if (head_dim == 0 || head_dim > KV_SCORE_MAX_HEAD_DIM)
    return FAIL(err, KV_SCORE_EINVAL, "head_dim out of range", head_dim, KV_SCORE_MAX_HEAD_DIM);
  if (n_heads == 0 || n_heads > KV_SCORE_MAX_Q_HEADS)
    return FAIL(err, KV_SCORE_EINVAL, "query heads out of range", n_heads, KV_SCORE_MAX_Q_HEADS);
  if (combine != KV_SCORE_SUM && combine != KV_SCORE_MAX)
    return FAIL(err, KV_SCORE_EINVAL, "unknown head combination", combine, 1);
  if (n > 1 && key_stride < head_dim * kb)
    return FAIL(err, KV_SCORE_EINVAL, "key row stride smaller than a row", key_stride, head_dim * kb);
  if (n_heads > 1 && q_stride < head_dim * qb)
    return FAIL(err, KV_SCORE_EINVAL, "query head stride smaller than a head", q_stride,
                head_dim * qb);
  double *qd = malloc((size_t)n_heads * head_dim * sizeof(double));
  if (qd == NULL)
    return FAIL(err, KV_SCORE_ENOMEM, "out of memory for the query", 0, 0);
  for (uint32_t h = 0; h < n_heads; h++)
    for (uint32_t j = 0; j < head_dim; j++)
      qd[(size_t)h * head_dim + j] = load_elem(qdtype, (const uint8_t *)q + (size_t)h * q_stride, j);
  for (uint32_t r = 0; r < n; r++) {
    const uint8_t *row = (const uint8_t *)keys + (size_t)r * key_stride;
    double comb = 0;
    for (uint32_t h = 0; h < n_heads; h++) {
      double dot = 0;
      for (uint32_t j = 0; j < head_dim; j++)
        dot += qd[(size_t)h * head_dim + j] * (double)load_elem(kdtype, row, j);
      if (combine == KV_SCORE_SUM)
        comb += dot;
      else
        comb = h == 0 || dot > comb ? dot : comb;
    }
    out[r] = (float)comb;
  }
  free(qd);
  return KV_SCORE_OK;
}
