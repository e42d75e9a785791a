/* SPDX-License-Identifier: MIT */
/*
 * compress/lossless.c — the lossless codecs: "raw" (id 1) and "zstd-planes" (id 2), and the
 * byte-plane entropy bound they are measured against.
 *
 * KV elements are noisy in their low mantissa bits and predictable in their sign/exponent
 * bits; a general-purpose compressor on interleaved bytes sees mostly noise (zstd gets ~1.08x
 * on f16 KV). Splitting each element into byte planes (plane b = byte b of the little-endian
 * element) puts the predictable bytes together, where zstd's entropy coder gets close to the
 * order-0 bound; the noisy planes do not shrink and are stored raw, so they cost a memcpy to
 * decode. Each page group is compressed alone (codec.h "PAGE GROUPS").
 *
 * Decoding runs on a static context carved from the caller's scratch (ZSTD_initStaticDCtx) or
 * the caller's kv_codec_dctx: no allocation. Single-shot decompression into a flat buffer of
 * the exact plane size needs no window buffer, so a hostile frame cannot make the decoder write
 * outside that buffer or ask for memory.
 *
 * Encoding uses one zstd compression context per thread, made at the thread's first encode and
 * freed when the thread exits (kv_lossless_thread_cctx, frames.c uses it too): building a
 * context runs libzstd's CPUID check, which traps to the hypervisor in a VM (~20 us here: longer than compressing a 4 KiB plane, and
 * the profile of one put encodes hundreds of sections). Where that context cannot be had (out of
 * memory), the section is encoded on a static context in the caller's scratch, as before: no
 * call fails for it.
 */
#define ZSTD_STATIC_LINKING_ONLY /* ZSTD_initStatic*, ZSTD_estimate* (exported by libzstd.so) */
#include "codec_int.h"

#include <math.h>
#include <pthread.h>
#include <string.h>
#include <zstd.h>
#include <zstd_errors.h>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

static inline size_t align64(size_t n)
{
  return (n + 63) & ~(size_t)63;
}

static kv_codec_status check_scratch(size_t have, size_t need, kv_codec_err *err)
{
  if (have < need)
    return KV_CODEC_FAIL(err, KV_CODEC_ENOMEM, "scratch smaller than scratch_bytes()", have, need);
  return KV_CODEC_OK;
}

/* ---- raw ------------------------------------------------------------------------------------ */

size_t kv_codec_raw_bound(const kv_section_shape *shape, const kv_codec_params *p)
{
  kv_section_info info;
  if (kv_codec_plan(KV_CODEC_ID_RAW, shape, p, &info, NULL) != KV_CODEC_OK)
    return 0;
  return info.header_bytes +
         (size_t)info.n_rows * shape->head_dim * kv_codec_dtype_bytes(shape->dtype);
}

size_t kv_codec_raw_scratch_bytes(const kv_section_shape *shape, const kv_codec_params *p,
                                  kv_codec_op op)
{
  kv_section_info info;
  (void)op;
  if (kv_codec_plan(KV_CODEC_ID_RAW, shape, p, &info, NULL) != KV_CODEC_OK)
    return 0;
  return KV_CODEC_SCRATCH_SLACK; /* raw needs none; the slack keeps "0 = invalid" meaningful */
}

kv_codec_status kv_codec_raw_encode(const kv_section_shape *shape, const void *src, size_t src_len,
                                    const kv_codec_params *p, void *scratch, size_t scratch_cap,
                                    void *dst, size_t dst_cap, size_t *out_len, kv_codec_err *err)
{
  kv_section_info info;
  (void)scratch;
  (void)scratch_cap;
  kv_codec_status rc = kv_codec_encode_args(shape, src, src_len, dst, out_len, err);
  if (rc != KV_CODEC_OK)
    return rc;
  rc = kv_codec_plan(KV_CODEC_ID_RAW, shape, p, &info, err);
  if (rc != KV_CODEC_OK)
    return rc;
  size_t row = (size_t)shape->head_dim * kv_codec_dtype_bytes(shape->dtype);
  size_t need = info.header_bytes + src_len;
  if (dst_cap < need)
    return KV_CODEC_FAIL(err, KV_CODEC_ETOOSMALL, "dst smaller than the encoded section", dst_cap,
                         need);
  uint8_t *d = dst;
  kv_codec_write_header(&info, NULL, d);
  for (uint32_t g = 0; g < info.n_groups; g++)
    kv_codec_put_le32(d + KV_SECTION_FIXED_BYTES + 4 * (size_t)g,
                      (uint32_t)(kv_codec_group_rows(&info, g) * row));
  kv_codec_store_le(shape->dtype, src, (size_t)shape->n_tokens * shape->head_dim,
                    d + info.header_bytes);
  *out_len = need;
  return KV_CODEC_OK;
}

kv_codec_status kv_raw_decode_parsed(const kv_section_info *info, const uint8_t *payload,
                                     uint32_t g0, uint32_t g1, void *dst)
{
  size_t n = kv_section_rows_bytes(info, g0, g1) / kv_codec_dtype_bytes(info->shape.dtype);
  kv_codec_load_le(info->shape.dtype, payload, n, dst);
  return KV_CODEC_OK;
}

/* Every group holds exactly its rows' bytes. */
kv_codec_status kv_codec_raw_check(const kv_section_info *info, const uint8_t *hdr,
                                   kv_codec_err *err)
{
  const uint8_t *t = hdr + KV_SECTION_FIXED_BYTES;
  size_t row = (size_t)info->shape.head_dim * kv_codec_dtype_bytes(info->shape.dtype);
  for (uint32_t g = 0; g < info->n_groups; g++) {
    uint64_t want = (uint64_t)kv_codec_group_rows(info, g) * row;
    uint32_t have = kv_codec_get_le32(t + 4 * (size_t)g);
    if (have != want)
      return KV_CODEC_FAIL(err, KV_CODEC_ECORRUPT, "raw group length is not its rows' bytes", have,
                           want);
  }
  return KV_CODEC_OK;
}

/* ---- byte planes ------------------------------------------------------------------------------ */

/* plane p of n elements of es bytes (host order) -> out. Byte p is (v >> 8p) & 0xff. */
void kv_planes_split(const uint8_t *src, size_t n, size_t es, unsigned p, uint8_t *out)
{
  if (es == 2) {
    unsigned sh = 8 * p;
    for (size_t i = 0; i < n; i++) {
      uint16_t v;
      memcpy(&v, src + 2 * i, 2);
      out[i] = (uint8_t)(v >> sh);
    }
  } else {
    unsigned sh = 8 * p;
    for (size_t i = 0; i < n; i++) {
      uint32_t v;
      memcpy(&v, src + 4 * i, 4);
      out[i] = (uint8_t)(v >> sh);
    }
  }
}

/* Two planes -> n 16-bit elements (host order). */
void kv_planes_join2(const uint8_t *p0, const uint8_t *p1, size_t n, uint8_t *dst)
{
  size_t i = 0;
#if defined(__SSE2__) && defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
  for (; i + 16 <= n; i += 16) {
    __m128i a = _mm_loadu_si128((const __m128i *)(const void *)(p0 + i));
    __m128i b = _mm_loadu_si128((const __m128i *)(const void *)(p1 + i));
    _mm_storeu_si128((__m128i *)(void *)(dst + 2 * i), _mm_unpacklo_epi8(a, b));
    _mm_storeu_si128((__m128i *)(void *)(dst + 2 * i + 16), _mm_unpackhi_epi8(a, b));
  }
#endif
  for (; i < n; i++) {
    uint16_t v = (uint16_t)(p0[i] | (p1[i] << 8));
    memcpy(dst + 2 * i, &v, 2);
  }
}

/* Four planes -> n 32-bit elements (host order). */
void kv_planes_join4(const uint8_t *p0, const uint8_t *p1, const uint8_t *p2, const uint8_t *p3,
                     size_t n, uint8_t *dst)
{
  size_t i = 0;
#if defined(__SSE2__) && defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
  for (; i + 16 <= n; i += 16) {
    __m128i a = _mm_loadu_si128((const __m128i *)(const void *)(p0 + i));
    __m128i b = _mm_loadu_si128((const __m128i *)(const void *)(p1 + i));
    __m128i c = _mm_loadu_si128((const __m128i *)(const void *)(p2 + i));
    __m128i d = _mm_loadu_si128((const __m128i *)(const void *)(p3 + i));
    __m128i ab_lo = _mm_unpacklo_epi8(a, b), ab_hi = _mm_unpackhi_epi8(a, b);
    __m128i cd_lo = _mm_unpacklo_epi8(c, d), cd_hi = _mm_unpackhi_epi8(c, d);
    uint8_t *o = dst + 4 * i;
    _mm_storeu_si128((__m128i *)(void *)(o + 0), _mm_unpacklo_epi16(ab_lo, cd_lo));
    _mm_storeu_si128((__m128i *)(void *)(o + 16), _mm_unpackhi_epi16(ab_lo, cd_lo));
    _mm_storeu_si128((__m128i *)(void *)(o + 32), _mm_unpacklo_epi16(ab_hi, cd_hi));
    _mm_storeu_si128((__m128i *)(void *)(o + 48), _mm_unpackhi_epi16(ab_hi, cd_hi));
  }
#endif
  for (; i < n; i++) {
    uint32_t v = (uint32_t)p0[i] | ((uint32_t)p1[i] << 8) | ((uint32_t)p2[i] << 16) |
                 ((uint32_t)p3[i] << 24);
    memcpy(dst + 4 * i, &v, 4);
  }
}

/* ---- zstd-planes ------------------------------------------------------------------------------ */

static uint32_t plane_max(const kv_section_info *info)
{
  uint32_t rows = info->params.page_tokens < info->n_rows ? info->params.page_tokens : info->n_rows;
  return rows * info->shape.head_dim; /* <= 2^30 by [H1] */
}

static size_t zp_cctx_bytes(const kv_section_info *info)
{
  ZSTD_compressionParameters cp = ZSTD_getCParams(info->params.zstd_level, plane_max(info), 0);
  return ZSTD_estimateCCtxSize_usingCParams(cp);
}

size_t kv_codec_zp_bound(const kv_section_shape *shape, const kv_codec_params *p)
{
  kv_section_info info;
  if (kv_codec_plan(KV_CODEC_ID_ZSTD_PLANES, shape, p, &info, NULL) != KV_CODEC_OK)
    return 0;
  size_t es = kv_codec_dtype_bytes(shape->dtype);
  return info.header_bytes + (size_t)info.n_groups * 4 * es +
         (size_t)info.n_rows * shape->head_dim * es;
}

size_t kv_codec_zp_scratch_bytes(const kv_section_shape *shape, const kv_codec_params *p,
                                 kv_codec_op op)
{
  kv_section_info info;
  if (kv_codec_plan(KV_CODEC_ID_ZSTD_PLANES, shape, p, &info, NULL) != KV_CODEC_OK)
    return 0;
  size_t es = kv_codec_dtype_bytes(shape->dtype);
  if (op == KV_CODEC_OP_ENCODE)
    return KV_CODEC_SCRATCH_SLACK + align64(zp_cctx_bytes(&info)) + align64(plane_max(&info));
  if (op == KV_CODEC_OP_DECODE)
    return KV_CODEC_SCRATCH_SLACK + align64(ZSTD_estimateDCtxSize()) + es * align64(plane_max(&info));
  return 0;
}

/* This thread's compression context (see the file's comment), or NULL. */
static pthread_key_t cctx_key;
static int cctx_key_ok;
static pthread_once_t cctx_once = PTHREAD_ONCE_INIT;

static void cctx_free(void *c)
{
  ZSTD_freeCCtx(c);
}

static void cctx_key_make(void)
{
  cctx_key_ok = pthread_key_create(&cctx_key, cctx_free) == 0;
}

struct ZSTD_CCtx_s *kv_lossless_thread_cctx(void)
{
  if (pthread_once(&cctx_once, cctx_key_make) != 0 || !cctx_key_ok)
    return NULL;
  ZSTD_CCtx *c = pthread_getspecific(cctx_key);
  if (c == NULL && (c = ZSTD_createCCtx()) != NULL && pthread_setspecific(cctx_key, c) != 0) {
    ZSTD_freeCCtx(c);
    c = NULL;
  }
  return c;
}

kv_codec_status kv_codec_zp_encode(const kv_section_shape *shape, const void *src, size_t src_len,
                                   const kv_codec_params *p, void *scratch, size_t scratch_cap,
                                   void *dst, size_t dst_cap, size_t *out_len, kv_codec_err *err)
{
  kv_section_info info;
  kv_codec_status rc = kv_codec_encode_args(shape, src, src_len, dst, out_len, err);
  if (rc != KV_CODEC_OK)
    return rc;
  rc = kv_codec_plan(KV_CODEC_ID_ZSTD_PLANES, shape, p, &info, err);
  if (rc != KV_CODEC_OK)
    return rc;
  size_t need_scratch = kv_codec_zp_scratch_bytes(shape, p, KV_CODEC_OP_ENCODE);
  if (scratch == NULL)
    scratch_cap = 0;
  rc = check_scratch(scratch_cap, need_scratch, err);
  if (rc != KV_CODEC_OK)
    return rc;
  size_t cap = scratch_cap;
  uint8_t *ws = kv_codec_scratch_align(scratch, &cap);
  size_t cctx_bytes = align64(zp_cctx_bytes(&info));
  ZSTD_CCtx *cctx = kv_lossless_thread_cctx(), *own = NULL; /* own: the scratch one, if needed */
  if (cctx == NULL && (cctx = own = ZSTD_initStaticCCtx(ws, cctx_bytes)) == NULL)
    return KV_CODEC_FAIL(err, KV_CODEC_ENOMEM, "zstd cannot use the scratch", cctx_bytes, 0);
  uint8_t *plane = ws + cctx_bytes;

  size_t es = kv_codec_dtype_bytes(shape->dtype);
  size_t row = (size_t)shape->head_dim * es;
  size_t bound = kv_codec_zp_bound(shape, p);
  uint8_t *d = dst;
  if (dst_cap < info.header_bytes)
    return KV_CODEC_FAIL(err, KV_CODEC_ETOOSMALL, "dst smaller than the section header", dst_cap,
                         bound);
  kv_codec_write_header(&info, NULL, d);
  size_t pos = info.header_bytes;
  const uint8_t *s = src;
  for (uint32_t g = 0; g < info.n_groups; g++) {
    uint32_t rows = kv_codec_group_rows(&info, g);
    size_t n = (size_t)rows * shape->head_dim;
    const uint8_t *gsrc = s + (size_t)g * info.params.page_tokens * row;
    size_t gstart = pos;
    if (dst_cap - pos < 4 * es)
      return KV_CODEC_FAIL(err, KV_CODEC_ETOOSMALL, "dst smaller than the encoded section", dst_cap,
                           bound);
    pos += 4 * es;
    for (unsigned b = 0; b < es; b++) {
      kv_planes_split(gsrc, n, es, b, plane);
      size_t avail = dst_cap - pos;
      size_t len = 0;
      if (n > 1 && avail > 0) {
        size_t r = ZSTD_compressCCtx(cctx, d + pos, avail < n - 1 ? avail : n - 1, plane, n,
                                     info.params.zstd_level);
        if (ZSTD_isError(r) && ZSTD_getErrorCode(r) == ZSTD_error_memory_allocation &&
            own == NULL) { /* the thread's context could not grow: the scratch one */
          if ((cctx = own = ZSTD_initStaticCCtx(ws, cctx_bytes)) == NULL)
            return KV_CODEC_FAIL(err, KV_CODEC_ENOMEM, "zstd cannot use the scratch", cctx_bytes,
                                 0);
          r = ZSTD_compressCCtx(cctx, d + pos, avail < n - 1 ? avail : n - 1, plane, n,
                                info.params.zstd_level);
        }
        if (!ZSTD_isError(r))
          len = r;
        else if (ZSTD_getErrorCode(r) != ZSTD_error_dstSize_tooSmall)
          return KV_CODEC_FAIL(err, KV_CODEC_ENOMEM, "zstd compression failed",
                               (uint64_t)ZSTD_getErrorCode(r), 0);
      }
      if (len == 0) { /* [no shrink] store the plane raw */
        if (avail < n)
          return KV_CODEC_FAIL(err, KV_CODEC_ETOOSMALL, "dst smaller than the encoded section",
                               dst_cap, bound);
        memcpy(d + pos, plane, n);
        len = n;
      }
      kv_codec_put_le32(d + gstart + 4 * b, (uint32_t)len);
      pos += len;
    }
    kv_codec_put_le32(d + KV_SECTION_FIXED_BYTES + 4 * (size_t)g, (uint32_t)(pos - gstart));
  }
  *out_len = pos;
  return KV_CODEC_OK;
}

/* ---- decoding context ------------------------------------------------------------------------ */

size_t kv_codec_dctx_bytes(void)
{
  return KV_CODEC_SCRATCH_SLACK + align64(sizeof(kv_codec_dctx)) + align64(ZSTD_estimateDCtxSize()) +
         sizeof(float) * (size_t)KV_DCTX_ROPE_FLOATS;
}

kv_codec_dctx *kv_codec_dctx_init(void *mem, size_t cap)
{
  if (mem == NULL || cap < kv_codec_dctx_bytes())
    return NULL;
  uint8_t *p = kv_codec_scratch_align(mem, &cap);
  kv_codec_dctx *c = (kv_codec_dctx *)(void *)p;
  size_t zb = align64(ZSTD_estimateDCtxSize());
  c->zd = ZSTD_initStaticDCtx(p + align64(sizeof *c), zb); /* the one CPUID check */
  if (c->zd == NULL)
    return NULL;
  c->stream = 0;
  c->rope = (float *)(void *)(p + align64(sizeof *c) + zb); /* kvquant's RoPE tables (quant.c) */
  c->rope_n = c->rope_used = 0;
  c->magic = KV_DCTX_MAGIC;
  return c;
}

kv_codec_status kv_zp_decode_parsed(const kv_section_info *info, const uint8_t *hdr,
                                    const uint8_t *payload, uint32_t g0, uint32_t g1,
                                    void *scratch, size_t scratch_cap, void *dst,
                                    kv_codec_dctx *ctx, kv_codec_err *err)
{
  size_t es = kv_codec_dtype_bytes(info->shape.dtype);
  size_t pmax = align64(plane_max(info));
  size_t dctx_bytes = align64(ZSTD_estimateDCtxSize());
  if (scratch == NULL)
    scratch_cap = 0;
  kv_codec_status rc =
    check_scratch(scratch_cap, KV_CODEC_SCRATCH_SLACK + dctx_bytes + es * pmax, err);
  if (rc != KV_CODEC_OK)
    return rc;
  size_t cap = scratch_cap;
  uint8_t *ws = kv_codec_scratch_align(scratch, &cap);
  ZSTD_DCtx *dctx;
  if (ctx != NULL && ctx->magic == KV_DCTX_MAGIC && ctx->zd != NULL) {
    dctx = ctx->zd;
    ZSTD_DCtx_reset(dctx, ZSTD_reset_session_and_parameters); /* whatever a failed call left */
  } else {
    dctx = ZSTD_initStaticDCtx(ws, dctx_bytes);
    if (dctx == NULL)
      return KV_CODEC_FAIL(err, KV_CODEC_ENOMEM, "zstd cannot use the scratch", dctx_bytes, 0);
  }
  uint8_t *bufs = ws + dctx_bytes;

  const uint8_t *table = hdr + KV_SECTION_FIXED_BYTES;
  const uint8_t *in = payload;
  uint8_t *out = dst;
  size_t row = (size_t)info->shape.head_dim * es;
  for (uint32_t g = g0; g < g1; g++) {
    uint32_t glen = kv_codec_get_le32(table + 4 * (size_t)g); /* >= 4*es by kv_codec_zp_check */
    size_t n = (size_t)kv_codec_group_rows(info, g) * info->shape.head_dim;
    const uint8_t *planes[4];
    uint64_t sum = 0;
    for (unsigned b = 0; b < es; b++) {
      uint32_t len = kv_codec_get_le32(in + 4 * b);
      if (len > n)
        return KV_CODEC_FAIL(err, KV_CODEC_ECORRUPT, "plane length exceeds the plane", len, n);
      sum += len;
    }
    if (sum != glen - 4 * es)
      return KV_CODEC_FAIL(err, KV_CODEC_ECORRUPT, "plane lengths do not add up to the group",
                           sum, glen - 4 * es);
    const uint8_t *ps = in + 4 * es;
    for (unsigned b = 0; b < es; b++) {
      uint32_t len = kv_codec_get_le32(in + 4 * b);
      if (len == n) {
        planes[b] = ps;
      } else {
        uint8_t *buf = bufs + b * pmax;
        size_t r = ZSTD_decompressDCtx(dctx, buf, n, ps, len);
        if (ZSTD_isError(r) || r != n)
          return KV_CODEC_FAIL(err, KV_CODEC_ECORRUPT, "zstd frame does not decode to its plane",
                               ZSTD_isError(r) ? 0 : r, n);
        planes[b] = buf;
      }
      ps += len;
    }
    if (es == 2)
      kv_planes_join2(planes[0], planes[1], n, out);
    else
      kv_planes_join4(planes[0], planes[1], planes[2], planes[3], n, out);
    out += (size_t)kv_codec_group_rows(info, g) * row;
    in += glen;
  }
  return KV_CODEC_OK;
}

/* A group holds its plane-length table and at most every plane raw. */
kv_codec_status kv_codec_zp_check(const kv_section_info *info, const uint8_t *hdr,
                                  kv_codec_err *err)
{
  const uint8_t *t = hdr + KV_SECTION_FIXED_BYTES;
  size_t es = kv_codec_dtype_bytes(info->shape.dtype);
  size_t row = (size_t)info->shape.head_dim * es;
  for (uint32_t g = 0; g < info->n_groups; g++) {
    uint64_t max = 4 * es + (uint64_t)kv_codec_group_rows(info, g) * row;
    uint32_t have = kv_codec_get_le32(t + 4 * (size_t)g);
    if (have < 4 * es || have > max)
      return KV_CODEC_FAIL(err, KV_CODEC_ECORRUPT, "zstd-planes group length out of range", have,
                           max);
  }
  return KV_CODEC_OK;
}

/* ---- entropy bound ---------------------------------------------------------------------------- */

kv_codec_status kv_lossless_entropy_bound(const kv_section_shape *shape, const void *src,
                                          size_t src_len, double *out_bytes, kv_codec_err *err)
{
  size_t unused;
  if (out_bytes == NULL)
    return KV_CODEC_FAIL(err, KV_CODEC_EINVAL, "NULL out_bytes", 0, 0);
  kv_codec_status rc = kv_codec_encode_args(shape, src, src_len, src, &unused, err);
  if (rc != KV_CODEC_OK)
    return rc;
  size_t es = kv_codec_dtype_bytes(shape->dtype);
  size_t n = src_len / es;
  uint64_t hist[4][256];
  memset(hist, 0, sizeof hist);
  const uint8_t *s = src;
  for (size_t i = 0; i < n; i++) {
    uint32_t v;
    if (es == 2) {
      uint16_t h;
      memcpy(&h, s + 2 * i, 2);
      v = h;
    } else {
      memcpy(&v, s + 4 * i, 4);
    }
    for (size_t b = 0; b < es; b++)
      hist[b][(v >> (8 * b)) & 0xffu]++;
  }
  double bits = 0;
  for (size_t b = 0; b < es; b++)
    for (int v = 0; v < 256; v++)
      if (hist[b][v] != 0) {
        double c = (double)hist[b][v];
        bits -= c * log2(c / (double)n);
      }
  *out_bytes = bits / 8.0;
  return KV_CODEC_OK;
}
