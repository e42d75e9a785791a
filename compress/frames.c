/* SPDX-License-Identifier: MIT */
/*
 * compress/frames.c — lossless frames (section format version 2, FORMAT-codecs.md "Lossless
 * frames"): the byte planes of SEVERAL sections packed together, each plane one zstd frame
 * (or raw), and the parallel decode of many frames.
 *
 * Why: zstd-planes (lossless.c) compresses each plane of each page group of each section alone.
 * A stories260K section (head_dim 8) of 512 tokens is 8 KiB, so its high-byte plane is one
 * 4 KiB zstd frame, and every frame pays libzstd's fixed cost (frame header, Huffman table
 * read and build: ~4.5 us with a reused context): decode runs at 1.2-1.5 GB/s. A frame here
 * holds the planes of as many consecutive sections as reach the frame size (a raw-byte
 * target): one Huffman table for all of them, one fixed cost per frame, and the noisy low
 * planes are stored raw (a memcpy to decode) unless zstd saves at least 1/32 of them. An f16
 * frame's high plane is coded as EXPONENT PAIRS where they pay (header byte 6; below): the
 * exponents of two elements as one zstd symbol, half as many Huffman symbols to decode, the
 * sign and mantissa bits raw and joined back by SIMD (measured 1.4x faster decoding for 0.34%
 * of ratio on stories260K; bench/RESULTS.md, issue 16, session 27).
 *
 * A frame is the unit of decoding: a reader of one section decodes its whole frame (the read
 * amplification a larger frame costs; `kvdb-bench compress` measures it). Decoding runs on the
 * caller's kv_codec_dctx (or a static context carved from its scratch) into the caller's
 * buffer: single-shot decompression of each plane into a buffer of exactly its size, so a
 * hostile frame cannot make the decoder write outside it. kv_frames_decode_mt() decodes a list
 * of frames on several threads, each with a caller-made decoding context and scratch.
 */
#define ZSTD_STATIC_LINKING_ONLY /* ZSTD_initStatic*, ZSTD_estimate* (exported by libzstd.so) */
#include "codec_int.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <zstd.h>
#include <zstd_errors.h>

static inline size_t align64(size_t n)
{
  return (n + 63) & ~(size_t)63;
}

#define EP_STREAM_HDR 12 /* exponent pairs: bytes of a stream's header */
#define EP_BASE_MAX 16   /* the largest base: b + 15 <= 31 */

/* Elements of the sections, or 0 when a section breaks [F1]. */
static uint64_t frame_elems(const kv_frame_sec *secs, uint32_t n)
{
  uint64_t sum = 0;
  for (uint32_t i = 0; i < n; i++) {
    if (secs[i].n_rows == 0 || secs[i].n_rows > (1u << 30) || secs[i].head_dim == 0 ||
        secs[i].head_dim > 65536 || (secs[i].kind != KV_SECTION_K && secs[i].kind != KV_SECTION_V))
      return 0;
    sum += (uint64_t)secs[i].n_rows * secs[i].head_dim;
  }
  return sum;
}

size_t kv_frame_header_bytes(kv_codec_dtype dtype, uint32_t n_sections)
{
  return KV_FRAME_FIXED_BYTES + 8 * (size_t)n_sections + 4 * kv_codec_dtype_bytes(dtype);
}

static kv_codec_status check_args(kv_codec_dtype dtype, const kv_frame_sec *secs, uint32_t n,
                                  uint64_t *elems, kv_codec_err *err)
{
  if (kv_codec_dtype_bytes(dtype) == 0)
    return KV_CODEC_FAIL(err, KV_CODEC_EINVAL, "frame dtype is not f16, bf16 or f32", dtype, 3);
  if (secs == NULL || n == 0 || n > KV_FRAME_MAX_SECTIONS)
    return KV_CODEC_FAIL(err, KV_CODEC_EINVAL, "frame sections: NULL or count outside 1..4096",
                         n, KV_FRAME_MAX_SECTIONS);
  uint64_t e = frame_elems(secs, n);
  if (e == 0)
    return KV_CODEC_FAIL(err, KV_CODEC_EINVAL,
                         "a frame section has 0 or too many rows or dims, or no kind", 0, 0);
  if (e > KV_FRAME_MAX_ELEMS)
    return KV_CODEC_FAIL(err, KV_CODEC_EINVAL, "frame elements exceed 2^28", e,
                         KV_FRAME_MAX_ELEMS);
  for (uint32_t i = 0; i < n; i++)
    if (secs[i].rows == NULL)
      return KV_CODEC_FAIL(err, KV_CODEC_EINVAL, "frame section rows are NULL", i, n);
  *elems = e;
  return KV_CODEC_OK;
}

size_t kv_frame_bound(kv_codec_dtype dtype, const kv_frame_sec *secs, uint32_t n_sections)
{
  uint64_t e;
  kv_codec_err err;
  if (check_args(dtype, secs, n_sections, &e, &err) != KV_CODEC_OK)
    return 0;
  return kv_frame_header_bytes(dtype, n_sections) + (size_t)e * kv_codec_dtype_bytes(dtype);
}

size_t kv_frame_encode_scratch_bytes(kv_codec_dtype dtype, const kv_frame_sec *secs,
                                     uint32_t n_sections, int level)
{
  uint64_t e;
  kv_codec_err err;
  if (check_args(dtype, secs, n_sections, &e, &err) != KV_CODEC_OK)
    return 0;
  if (level == 0)
    level = KV_FRAME_LEVEL_DEFAULT;
  ZSTD_compressionParameters cp = ZSTD_getCParams(level, e, 0);
  /* one plane, and a static compression context for when the thread's cannot be had; f16:
   * the exponent-pairs plane being built (at most the raw plane) and its pair bytes */
  size_t ep = dtype == KV_CODEC_F16 ? align64((size_t)e + EP_STREAM_HDR * 2) +
                                          align64((size_t)e / 2 + 2)
                                    : 0;
  return KV_CODEC_SCRATCH_SLACK + align64((size_t)e) + ep +
         align64(ZSTD_estimateCCtxSize_usingCParams(cp));
}

/* ---- exponent pairs (f16 plane 1; FORMAT-codecs.md "Exponent pairs") -------------------------
 *
 * Per non-empty stream (K, then V) of cnt high bytes (sign | 5 exponent bits | 2 mantissa bits):
 * a 12-byte header (base b 0..16, pair coding 0 raw / 1 zstd, 2 reserved bytes, escapes u32,
 * stored pair bytes P u32), P bytes of pairs (H = ceil(cnt/2) bytes once decoded: element 2j's
 * code in the low nibble of byte j, 2j+1's in the high one; code = exponent - b), three bitmaps
 * of ceil(cnt/8) bytes (bit i%8 of byte i/8 for element i: the sign, mantissa bit 1, mantissa
 * bit 0), then 5 bytes per escape (position u32 strictly increasing < cnt, exponent u8): the
 * elements whose exponent lies outside [b, b+15] (their code is ignored; the encoder writes 0). */

static size_t ceil_div(size_t a, size_t b)
{
  return (a + b - 1) / b;
}

/* Bytes of one stream's exponent-pairs coding, pairs stored as P bytes. */
static size_t ep_stream_bytes(size_t cnt, size_t p, size_t n_esc)
{
  return EP_STREAM_HDR + p + 3 * ceil_div(cnt, 8) + 5 * n_esc;
}

/* Encode one stream of cnt high bytes hi[] at out (cap bytes). Returns its bytes, 0 when it
 * does not fit cap, or SIZE_MAX on a zstd error (*zerr set). pairs: ceil(cnt/2) bytes. */
static size_t ep_encode_stream(const uint8_t *hi, size_t cnt, ZSTD_CCtx *cctx, int level,
                               uint8_t *pairs, uint8_t *out, size_t cap, size_t *zerr)
{
  size_t hist[32] = {0};
  for (size_t i = 0; i < cnt; i++)
    hist[(hi[i] >> 2) & 31]++;
  unsigned b = 0;
  size_t best = 0;
  for (unsigned c = 0; c <= EP_BASE_MAX; c++) {
    size_t in = 0;
    for (unsigned k = 0; k < 16; k++)
      in += hist[c + k];
    if (in > best) {
      best = in;
      b = c;
    }
  }
  size_t n_esc = cnt - best, h = ceil_div(cnt, 2), nb = ceil_div(cnt, 8);
  if (ep_stream_bytes(cnt, 0, n_esc) >= cap)
    return 0;
  uint8_t *bm = NULL; /* the bitmaps follow the pairs: written once P is known */
  size_t esc_at = 0;
  for (size_t j = 0; j < h; j++) {
    unsigned e0 = (hi[2 * j] >> 2) & 31, c0 = e0 - b, c1 = 0;
    if (e0 < b || c0 > 15)
      c0 = 0;
    if (2 * j + 1 < cnt) {
      unsigned e1 = (hi[2 * j + 1] >> 2) & 31;
      c1 = e1 - b;
      if (e1 < b || c1 > 15)
        c1 = 0;
    }
    pairs[j] = (uint8_t)(c0 | c1 << 4);
  }
  /* the pairs: zstd when it saves at least 1/32 of them, else raw */
  size_t avail = cap - ep_stream_bytes(cnt, 0, n_esc), p = 0;
  uint8_t coding = 0;
  size_t keep_below = h - h / KV_FRAME_MIN_SAVING;
  if (keep_below > 0) {
    ZSTD_CCtx_reset(cctx, ZSTD_reset_session_and_parameters);
    size_t r = ZSTD_CCtx_setParameter(cctx, ZSTD_c_compressionLevel, level);
    if (!ZSTD_isError(r))
      r = ZSTD_CCtx_setParameter(cctx, ZSTD_c_minMatch, KV_FRAME_MIN_MATCH);
    if (!ZSTD_isError(r))
      r = ZSTD_compress2(cctx, out + EP_STREAM_HDR, avail < keep_below ? avail : keep_below,
                         pairs, h);
    if (ZSTD_isError(r)) {
      if (ZSTD_getErrorCode(r) != ZSTD_error_dstSize_tooSmall) {
        *zerr = (size_t)ZSTD_getErrorCode(r);
        return SIZE_MAX;
      }
    } else if (r < keep_below) {
      p = r;
      coding = 1;
    }
  }
  if (coding == 0) {
    if (h > avail)
      return 0;
    memcpy(out + EP_STREAM_HDR, pairs, h);
    p = h;
  }
  out[0] = (uint8_t)b;
  out[1] = coding;
  out[2] = out[3] = 0;
  kv_codec_put_le32(out + 4, (uint32_t)n_esc);
  kv_codec_put_le32(out + 8, (uint32_t)p);
  bm = out + EP_STREAM_HDR + p;
  uint8_t *esc = bm + 3 * nb;
  for (size_t j = 0; j < nb; j++) {
    unsigned sg = 0, m1 = 0, m0 = 0, lim = cnt - 8 * j < 8 ? (unsigned)(cnt - 8 * j) : 8;
    for (unsigned t = 0; t < lim; t++) {
      unsigned v = hi[8 * j + t];
      sg |= (v >> 7) << t;
      m1 |= ((v >> 1) & 1) << t;
      m0 |= (v & 1) << t;
    }
    bm[j] = (uint8_t)sg;
    bm[nb + j] = (uint8_t)m1;
    bm[2 * nb + j] = (uint8_t)m0;
  }
  for (size_t i = 0; n_esc > 0 && i < cnt; i++) {
    unsigned e = (hi[i] >> 2) & 31;
    if (e < b || e - b > 15) {
      kv_codec_put_le32(esc + 5 * esc_at, (uint32_t)i);
      esc[5 * esc_at + 4] = (uint8_t)e;
      esc_at++;
    }
  }
  return ep_stream_bytes(cnt, p, n_esc);
}

kv_codec_status kv_frame_encode(kv_codec_dtype dtype, const kv_frame_sec *secs,
                                uint32_t n_sections, int level, void *scratch, size_t scratch_cap,
                                void *dst, size_t dst_cap, size_t *out_len, kv_codec_err *err)
{
  return kv_frame_encode_ex(dtype, secs, n_sections, level, KV_FRAME_AUTO, scratch, scratch_cap,
                            dst, dst_cap, out_len, err);
}

kv_codec_status kv_frame_encode_ex(kv_codec_dtype dtype, const kv_frame_sec *secs,
                                   uint32_t n_sections, int level, kv_frame_coding coding,
                                   void *scratch, size_t scratch_cap, void *dst, size_t dst_cap,
                                   size_t *out_len, kv_codec_err *err)
{
  uint64_t elems;
  if (out_len == NULL || dst == NULL)
    return KV_CODEC_FAIL(err, KV_CODEC_EINVAL, "NULL dst or out_len", 0, 0);
  *out_len = 0;
  kv_codec_status rc = check_args(dtype, secs, n_sections, &elems, err);
  if (rc != KV_CODEC_OK)
    return rc;
  if (level == 0)
    level = KV_FRAME_LEVEL_DEFAULT;
  if (level < -7 || level > 22)
    return KV_CODEC_FAIL(err, KV_CODEC_EINVAL, "zstd level outside -7..22", (int64_t)level, 22);
  if (coding != KV_FRAME_AUTO && coding != KV_FRAME_PLANES && coding != KV_FRAME_EXPPAIRS)
    return KV_CODEC_FAIL(err, KV_CODEC_EINVAL, "frame coding is not auto, planes or exppairs",
                         (int64_t)coding, 2);
  size_t need = kv_frame_encode_scratch_bytes(dtype, secs, n_sections, level);
  if (scratch == NULL || scratch_cap < need)
    return KV_CODEC_FAIL(err, KV_CODEC_ENOMEM, "scratch smaller than the frame's scratch bytes",
                         scratch == NULL ? 0 : scratch_cap, need);
  size_t es = kv_codec_dtype_bytes(dtype), n = (size_t)elems;
  size_t hb = kv_frame_header_bytes(dtype, n_sections);
  size_t bound = hb + n * es;
  if (dst_cap < hb)
    return KV_CODEC_FAIL(err, KV_CODEC_ETOOSMALL, "dst smaller than the frame header", dst_cap,
                         bound);
  size_t cap = scratch_cap;
  uint8_t *ws = kv_codec_scratch_align(scratch, &cap);
  int try_ep = dtype == KV_CODEC_F16 && coding != KV_FRAME_PLANES;
  size_t ep_cap = dtype == KV_CODEC_F16 ? align64(n + EP_STREAM_HDR * 2) : 0;
  size_t ep_pairs = dtype == KV_CODEC_F16 ? align64(n / 2 + 2) : 0;
  uint8_t *plane = ws, *ep_out = ws + align64(n), *pairs = ep_out + ep_cap;
  uint8_t *cmem = pairs + ep_pairs;
  ZSTD_CCtx *cctx = kv_lossless_thread_cctx();
  if (cctx == NULL &&
      (cctx = ZSTD_initStaticCCtx(cmem, cap - align64(n) - ep_cap - ep_pairs)) == NULL)
    return KV_CODEC_FAIL(err, KV_CODEC_ENOMEM, "zstd cannot use the scratch", cap, 0);

  uint8_t *d = dst;
  memset(d, 0, hb);
  d[0] = KV_CODEC_ID_FRAME;
  d[1] = KV_FRAME_VERSION;
  d[2] = (uint8_t)dtype;
  d[3] = (uint8_t)(int8_t)level;
  kv_codec_put_le16(d + 4, (uint16_t)n_sections);
  size_t nk = 0; /* elements of the K stream */
  for (uint32_t i = 0; i < n_sections; i++) {
    kv_codec_put_le32(d + KV_FRAME_FIXED_BYTES + 8 * (size_t)i,
                      secs[i].n_rows | (secs[i].kind == KV_SECTION_V ? KV_FRAME_V_BIT : 0));
    kv_codec_put_le32(d + KV_FRAME_FIXED_BYTES + 8 * (size_t)i + 4, secs[i].head_dim);
    if (secs[i].kind == KV_SECTION_K)
      nk += (size_t)secs[i].n_rows * secs[i].head_dim;
  }
  size_t pos = hb;
  for (unsigned b = 0; b < es; b++) {
    /* plane b: the K sections' bytes, then the V sections', each in section order */
    size_t at_k = 0, at_v = nk;
    for (uint32_t i = 0; i < n_sections; i++) {
      size_t m = (size_t)secs[i].n_rows * secs[i].head_dim;
      size_t *at = secs[i].kind == KV_SECTION_K ? &at_k : &at_v;
      kv_planes_split(secs[i].rows, m, es, b, plane + *at);
      *at += m;
    }
    size_t avail = dst_cap - pos, len = 0, slen[2] = {0, 0};
    /* compressed (one zstd frame per non-empty stream) only when it saves at least 1/32 of
     * the plane: a near-incompressible plane decodes at Huffman speed, a raw one at memcpy's */
    size_t keep_below = n - n / KV_FRAME_MIN_SAVING;
    if (keep_below > 0 && avail > 0) {
      size_t cap_z = avail < keep_below ? avail : keep_below;
      for (int st = 0; st < 2; st++) {
        size_t from = st ? nk : 0, cnt = st ? n - nk : nk;
        if (cnt == 0)
          continue;
        if (len >= cap_z) {
          len = 0;
          break;
        }
        /* the level, and matches of 7 bytes or more only: fewer sequences to decode
         * (measured: 3-12% faster decoding of stories260K frames, 0.13% less ratio) */
        ZSTD_CCtx_reset(cctx, ZSTD_reset_session_and_parameters);
        size_t r = ZSTD_CCtx_setParameter(cctx, ZSTD_c_compressionLevel, level);
        if (!ZSTD_isError(r))
          r = ZSTD_CCtx_setParameter(cctx, ZSTD_c_minMatch, KV_FRAME_MIN_MATCH);
        if (!ZSTD_isError(r))
          r = ZSTD_compress2(cctx, d + pos + len, cap_z - len, plane + from, cnt);
        if (ZSTD_isError(r)) {
          if (ZSTD_getErrorCode(r) != ZSTD_error_dstSize_tooSmall)
            return KV_CODEC_FAIL(err, KV_CODEC_ENOMEM, "zstd compression failed",
                                 (uint64_t)ZSTD_getErrorCode(r), 0);
          len = 0;
          break;
        }
        slen[st] = r;
        len += r;
      }
    }
    if (len == 0 || len >= keep_below) { /* store the plane raw */
      if (avail < n)
        return KV_CODEC_FAIL(err, KV_CODEC_ETOOSMALL, "dst smaller than the encoded frame",
                             dst_cap, bound);
      memcpy(d + pos, plane, n);
      len = n;
    }
    if (b == 1 && try_ep && (coding == KV_FRAME_EXPPAIRS || len < n)) {
      /* exponent pairs instead, when they fit the raw plane and (auto) cost at most
       * 1/KV_FRAME_EP_SLACK more than the plain plane: they decode faster */
      size_t ep_len = 0, ok = 1, zerr = 0, n_pairs = 0, zat = 0;
      for (int st = 0; st < 2 && ok; st++) {
        size_t from = st ? nk : 0, cnt = st ? n - nk : nk;
        if (cnt == 0)
          continue;
        size_t r = ep_encode_stream(plane + from, cnt, cctx, level, pairs, ep_out + ep_len,
                                    n - ep_len, &zerr);
        if (r == SIZE_MAX)
          return KV_CODEC_FAIL(err, KV_CODEC_ENOMEM, "zstd compression failed", zerr, 0);
        /* auto: the stream's plain zstd bytes instead where the pairs cost more than
         * 1/KV_FRAME_EP_SLACK over them (repeated rows: zstd matches whole rows of high
         * bytes, the raw bitmaps cannot) */
        if (coding == KV_FRAME_AUTO && slen[st] != cnt &&
            (r == 0 || r > slen[st] + slen[st] / KV_FRAME_EP_SLACK + EP_STREAM_HDR)) {
          if (EP_STREAM_HDR + slen[st] > n - ep_len) {
            ok = 0;
            break;
          }
          uint8_t *o = ep_out + ep_len;
          memset(o, 0, EP_STREAM_HDR);
          o[1] = 2;
          kv_codec_put_le32(o + 8, (uint32_t)slen[st]);
          memcpy(o + EP_STREAM_HDR, d + pos + zat, slen[st]);
          r = EP_STREAM_HDR + slen[st];
        } else {
          n_pairs++;
        }
        zat += slen[st];
        if (r == 0)
          ok = 0;
        ep_len += r;
      }
      if (ok && n_pairs > 0 && ep_len <= n && ep_len <= avail &&
          (coding == KV_FRAME_EXPPAIRS ||
           ep_len <= len + len / KV_FRAME_EP_SLACK)) {
        memcpy(d + pos, ep_out, ep_len);
        len = ep_len;
        d[6] = KV_FRAME_CODING_EXPPAIRS;
      }
    }
    kv_codec_put_le32(d + KV_FRAME_FIXED_BYTES + 8 * (size_t)n_sections + 4 * b, (uint32_t)len);
    pos += len;
  }
  *out_len = pos;
  return KV_CODEC_OK;
}

kv_codec_status kv_frame_parse(const void *src, size_t len, kv_frame_info *info,
                               kv_codec_err *err)
{
  const uint8_t *s = src;
  if (src == NULL || info == NULL)
    return KV_CODEC_FAIL(err, KV_CODEC_EINVAL, "NULL frame or info", 0, 0);
  memset(info, 0, sizeof *info);
  if (len < KV_FRAME_FIXED_BYTES)
    return KV_CODEC_FAIL(err, KV_CODEC_ECORRUPT, "frame shorter than its fixed header", len,
                         KV_FRAME_FIXED_BYTES);
  if (s[0] != KV_CODEC_ID_FRAME)
    return KV_CODEC_FAIL(err, KV_CODEC_ECORRUPT, "not a lossless frame (codec id)", s[0],
                         KV_CODEC_ID_FRAME);
  if (s[1] != KV_FRAME_VERSION)
    return KV_CODEC_FAIL(err, KV_CODEC_ECORRUPT, "unknown lossless frame version", s[1],
                         KV_FRAME_VERSION);
  size_t es = kv_codec_dtype_bytes((kv_codec_dtype)s[2]);
  if (es == 0)
    return KV_CODEC_FAIL(err, KV_CODEC_ECORRUPT, "frame dtype is not f16, bf16 or f32", s[2], 3);
  int level = (int8_t)s[3];
  if (level < -7 || level > 22 || level == 0)
    return KV_CODEC_FAIL(err, KV_CODEC_ECORRUPT, "frame zstd level outside -7..22", s[3], 22);
  uint32_t ns = kv_codec_get_le16(s + 4);
  if (ns == 0 || ns > KV_FRAME_MAX_SECTIONS)
    return KV_CODEC_FAIL(err, KV_CODEC_ECORRUPT, "frame section count outside 1..4096", ns,
                         KV_FRAME_MAX_SECTIONS);
  if (s[7] != 0 || (s[6] & ~KV_FRAME_CODING_EXPPAIRS) != 0)
    return KV_CODEC_FAIL(err, KV_CODEC_ECORRUPT, "frame coding flags or reserved byte unknown",
                         kv_codec_get_le16(s + 6), KV_FRAME_CODING_EXPPAIRS);
  if ((s[6] & KV_FRAME_CODING_EXPPAIRS) && s[2] != KV_CODEC_F16)
    return KV_CODEC_FAIL(err, KV_CODEC_ECORRUPT, "exponent pairs in a frame that is not f16", s[2],
                         KV_CODEC_F16);
  size_t hb = kv_frame_header_bytes((kv_codec_dtype)s[2], ns);
  if (len < hb)
    return KV_CODEC_FAIL(err, KV_CODEC_ECORRUPT, "frame shorter than its header", len, hb);
  uint64_t e = 0, ek = 0;
  for (uint32_t i = 0; i < ns; i++) {
    uint32_t rw = kv_codec_get_le32(s + KV_FRAME_FIXED_BYTES + 8 * (size_t)i);
    uint32_t r = rw & ~KV_FRAME_V_BIT;
    uint32_t d = kv_codec_get_le32(s + KV_FRAME_FIXED_BYTES + 8 * (size_t)i + 4);
    if (r == 0 || r > (1u << 30) || d == 0 || d > 65536)
      return KV_CODEC_FAIL(err, KV_CODEC_ECORRUPT, "frame section rows or dims out of range", i,
                           ns);
    e += (uint64_t)r * d;
    if (!(rw & KV_FRAME_V_BIT))
      ek += (uint64_t)r * d;
    if (e > KV_FRAME_MAX_ELEMS)
      return KV_CODEC_FAIL(err, KV_CODEC_ECORRUPT, "frame elements exceed 2^28", e,
                           KV_FRAME_MAX_ELEMS);
  }
  uint64_t sum = hb;
  for (unsigned b = 0; b < es; b++) {
    uint32_t l = kv_codec_get_le32(s + KV_FRAME_FIXED_BYTES + 8 * (size_t)ns + 4 * b);
    if (l == 0 || l > e)
      return KV_CODEC_FAIL(err, KV_CODEC_ECORRUPT, "frame plane length out of range", l, e);
    info->plane_len[b] = l;
    sum += l;
  }
  if (sum != len)
    return KV_CODEC_FAIL(err, KV_CODEC_ECORRUPT, "frame length is not header + planes", len, sum);
  info->dtype = (kv_codec_dtype)s[2];
  info->coding = s[6];
  info->zstd_level = level;
  info->n_sections = ns;
  info->n_elems = e;
  info->k_elems = ek;
  info->header_bytes = hb;
  info->frame_bytes = len;
  return KV_CODEC_OK;
}

static void sec_at(const uint8_t *s, uint32_t i, uint32_t *rows, uint32_t *dim, int *is_v)
{
  uint32_t rw = kv_codec_get_le32(s + KV_FRAME_FIXED_BYTES + 8 * (size_t)i);
  *rows = rw & ~KV_FRAME_V_BIT;
  *is_v = (rw & KV_FRAME_V_BIT) != 0;
  *dim = kv_codec_get_le32(s + KV_FRAME_FIXED_BYTES + 8 * (size_t)i + 4);
}

kv_codec_status kv_frame_section(const void *src, const kv_frame_info *info, uint32_t i,
                                 uint32_t *n_rows, uint32_t *head_dim, kv_section_kind *kind,
                                 uint64_t *byte_offset)
{
  if (src == NULL || info == NULL || i >= info->n_sections)
    return KV_CODEC_EINVAL;
  uint64_t off = 0;
  size_t es = kv_codec_dtype_bytes(info->dtype);
  uint32_t r, d;
  int v;
  for (uint32_t k = 0; k < i; k++) {
    sec_at(src, k, &r, &d, &v);
    off += (uint64_t)r * d * es;
  }
  sec_at(src, i, &r, &d, &v);
  if (n_rows != NULL)
    *n_rows = r;
  if (head_dim != NULL)
    *head_dim = d;
  if (kind != NULL)
    *kind = v ? KV_SECTION_V : KV_SECTION_K;
  if (byte_offset != NULL)
    *byte_offset = off;
  return KV_CODEC_OK;
}

/* One stream of an exponent-pairs plane, checked (ep_parse_stream). */
typedef struct ep_stream {
  unsigned base;
  const uint8_t *pairs; /* H decoded pair bytes */
  const uint8_t *bm;    /* three bitmaps of nb bytes: sign, mantissa bit 1, mantissa bit 0 */
  size_t nb;
  const uint8_t *esc;   /* n_esc x (position u32, exponent u8), checked */
  uint32_t n_esc, esc_at;
  const uint8_t *hi;    /* a plain stream (coding 2): its high bytes; NULL for pairs */
} ep_stream;

/* The high byte of stream element k. */
static inline unsigned ep_hi(const ep_stream *s, size_t k)
{
  unsigned code = (s->pairs[k >> 1] >> (4 * (k & 1))) & 15, bit = k & 7;
  size_t by = k >> 3;
  return (((unsigned)s->bm[by] >> bit) & 1) << 7 | ((code + s->base) & 31) << 2 |
         (((unsigned)s->bm[s->nb + by] >> bit) & 1) << 1 |
         (((unsigned)s->bm[2 * s->nb + by] >> bit) & 1);
}

/* m elements from stream element at: low bytes lo[0 .. m), the high bytes from s; out: m
 * host-order 16-bit elements (escapes not yet applied). */
static void ep_join_scalar(const uint8_t *lo, const ep_stream *s, size_t at, size_t m,
                           uint8_t *out)
{
  for (size_t i = 0; i < m; i++) {
    uint16_t v = (uint16_t)(lo[i] | ep_hi(s, at + i) << 8);
    memcpy(out + 2 * i, &v, 2);
  }
}

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
/* ep_spread[x]: byte t = bit t of x */
#define EP_S1(x)                                                                                   \
  ((uint64_t)((x) & 1) | (uint64_t)(((x) >> 1) & 1) << 8 | (uint64_t)(((x) >> 2) & 1) << 16 |      \
   (uint64_t)(((x) >> 3) & 1) << 24 | (uint64_t)(((x) >> 4) & 1) << 32 |                          \
   (uint64_t)(((x) >> 5) & 1) << 40 | (uint64_t)(((x) >> 6) & 1) << 48 |                          \
   (uint64_t)(((x) >> 7) & 1) << 56)
#define EP_S4(x) EP_S1(x), EP_S1((x) + 1), EP_S1((x) + 2), EP_S1((x) + 3)
#define EP_S16(x) EP_S4(x), EP_S4((x) + 4), EP_S4((x) + 8), EP_S4((x) + 12)
#define EP_S64(x) EP_S16(x), EP_S16((x) + 16), EP_S16((x) + 32), EP_S16((x) + 48)
static const uint64_t ep_spread[256] = {EP_S64(0), EP_S64(64), EP_S64(128), EP_S64(192)};

/* 4 bytes -> the low bytes of 4 16-bit lanes */
static inline uint64_t ep_widen4(uint64_t x)
{
  x = (x | x << 16) & 0x0000FFFF0000FFFFull;
  return (x | x << 8) & 0x00FF00FF00FF00FFull;
}

/* Portable: 8 elements at a time in 64-bit words (SWAR). */
static void ep_join_swar(const uint8_t *lo, const ep_stream *s, size_t at, size_t m,
                         uint8_t *out)
{
  size_t i = 0;
  if ((at & 7) == 0) {
    const uint64_t bb = 0x0101010101010101ull * s->base;
    for (; i + 8 <= m; i += 8) {
      size_t k = at + i, by = k >> 3;
      uint32_t pw;
      memcpy(&pw, s->pairs + (k >> 1), 4);
      uint64_t c = ep_widen4(pw);                        /* pair byte j in lane j */
      c = (c | c << 4) & 0x0F0F0F0F0F0F0F0Full;          /* its codes in bytes 2j, 2j+1 */
      uint64_t hi = (c + bb) << 2 | ep_spread[s->bm[by]] << 7 | ep_spread[s->bm[s->nb + by]] << 1 |
                    ep_spread[s->bm[2 * s->nb + by]];    /* bytes <= 31 before the shift */
      uint64_t l;
      memcpy(&l, lo + i, 8);
      uint64_t o0 = ep_widen4(l & 0xffffffffu) | ep_widen4(hi & 0xffffffffu) << 8;
      uint64_t o1 = ep_widen4(l >> 32) | ep_widen4(hi >> 32) << 8;
      memcpy(out + 2 * i, &o0, 8);
      memcpy(out + 2 * i + 8, &o1, 8);
    }
  }
  ep_join_scalar(lo + i, s, at + i, m - i, out + 2 * i);
}
#define EP_PORTABLE ep_join_swar
#else
#define EP_PORTABLE ep_join_scalar
#endif

#if defined(__x86_64__) && defined(__GNUC__) && defined(__BYTE_ORDER__) &&                       \
  __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
#define EP_X86 1
#include <immintrin.h>

/* 32 bits of a bitmap -> 32 bytes of 0xFF (bit set) or 0 */
__attribute__((target("avx2"))) static inline __m256i ep_expand32(const uint8_t *p)
{
  uint32_t w;
  memcpy(&w, p, 4);
  const __m256i shuf = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2,
                                        2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
  const __m256i sel = _mm256_set1_epi64x((long long)0x8040201008040201ull);
  __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32((int)w), shuf);
  return _mm256_cmpeq_epi8(_mm256_and_si256(v, sel), sel);
}

/* The 32 codes of stream elements k .. k+31 (k even) plus the base, one byte each, in order. */
__attribute__((target("avx2"))) static inline __m256i ep_exps32(const ep_stream *s, size_t k)
{
  __m256i w = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(const void *)(s->pairs +
                                                                                   (k >> 1))));
  __m256i nib = _mm256_or_si256(_mm256_and_si256(w, _mm256_set1_epi16(0x000F)),
                                _mm256_and_si256(_mm256_slli_epi16(w, 4),
                                                 _mm256_set1_epi16(0x0F00)));
  return _mm256_add_epi8(nib, _mm256_set1_epi8((char)s->base)); /* <= 31 */
}

__attribute__((target("avx2"))) static void ep_join_avx2(const uint8_t *lo, const ep_stream *s,
                                                         size_t at, size_t m, uint8_t *out)
{
  size_t i = 0;
  if ((at & 7) == 0) {
    for (; i + 32 <= m; i += 32) {
      size_t k = at + i, by = k >> 3;
      __m256i hi = _mm256_slli_epi16(ep_exps32(s, k), 2); /* no byte carries: <= 124 */
      hi = _mm256_or_si256(hi, _mm256_and_si256(ep_expand32(s->bm + by), _mm256_set1_epi8(-128)));
      hi = _mm256_or_si256(hi, _mm256_and_si256(ep_expand32(s->bm + s->nb + by),
                                                _mm256_set1_epi8(2)));
      hi = _mm256_or_si256(hi, _mm256_and_si256(ep_expand32(s->bm + 2 * s->nb + by),
                                                _mm256_set1_epi8(1)));
      __m256i l = _mm256_loadu_si256((const __m256i *)(const void *)(lo + i));
      __m256i a = _mm256_unpacklo_epi8(l, hi), c = _mm256_unpackhi_epi8(l, hi);
      _mm256_storeu_si256((__m256i *)(void *)(out + 2 * i), _mm256_permute2x128_si256(a, c, 0x20));
      _mm256_storeu_si256((__m256i *)(void *)(out + 2 * i + 32),
                          _mm256_permute2x128_si256(a, c, 0x31));
    }
  }
  ep_join_scalar(lo + i, s, at + i, m - i, out + 2 * i);
}

__attribute__((target("avx2,avx512f,avx512bw,avx512vl"))) static void
ep_join_avx512(const uint8_t *lo, const ep_stream *s, size_t at, size_t m, uint8_t *out)
{
  size_t i = 0;
  if ((at & 7) == 0) {
    const __m256i c80 = _mm256_set1_epi8(-128), c2 = _mm256_set1_epi8(2), c1 = _mm256_set1_epi8(1);
    for (; i + 32 <= m; i += 32) {
      size_t k = at + i, by = k >> 3;
      uint32_t ms, m1, m0;
      memcpy(&ms, s->bm + by, 4);
      memcpy(&m1, s->bm + s->nb + by, 4);
      memcpy(&m0, s->bm + 2 * s->nb + by, 4);
      __m256i hi = _mm256_slli_epi16(ep_exps32(s, k), 2);
      hi = _mm256_mask_add_epi8(hi, (__mmask32)ms, hi, c80); /* the bits are disjoint: + = | */
      hi = _mm256_mask_add_epi8(hi, (__mmask32)m1, hi, c2);
      hi = _mm256_mask_add_epi8(hi, (__mmask32)m0, hi, c1);
      __m512i l16 = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)(const void *)(lo + i)));
      __m512i h16 = _mm512_slli_epi16(_mm512_cvtepu8_epi16(hi), 8);
      _mm512_storeu_si512((void *)(out + 2 * i), _mm512_or_si512(l16, h16));
    }
  }
  ep_join_scalar(lo + i, s, at + i, m - i, out + 2 * i);
}
#endif

typedef void (*ep_join_fn)(const uint8_t *, const ep_stream *, size_t, size_t, uint8_t *);

/* The widest join this CPU runs, at most lim (0 portable, 1 AVX2, 2 AVX-512BW/VL); the
 * environment's KVDB_FRAMES_SIMD=0|avx2 caps it further (measurements). */
static ep_join_fn ep_join_pick(int lim)
{
#ifdef EP_X86
  const char *cap = getenv("KVDB_FRAMES_SIMD");
  if (cap != NULL && cap[0] == '0')
    lim = 0;
  else if (cap != NULL && strcmp(cap, "avx2") == 0 && lim > 1)
    lim = 1;
  if (lim >= 2 && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl"))
    return ep_join_avx512;
  if (lim >= 1 && __builtin_cpu_supports("avx2"))
    return ep_join_avx2;
#else
  (void)lim;
#endif
  return EP_PORTABLE;
}

static _Atomic(ep_join_fn) ep_join_fn_now; /* NULL: not chosen yet */

static ep_join_fn ep_join(void)
{
  ep_join_fn f = atomic_load_explicit(&ep_join_fn_now, memory_order_relaxed);
  if (f == NULL) {
    f = ep_join_pick(2);
    atomic_store_explicit(&ep_join_fn_now, f, memory_order_relaxed);
  }
  return f;
}

int kv_frames_simd_limit(int lim)
{
  ep_join_fn f = ep_join_pick(lim);
  atomic_store_explicit(&ep_join_fn_now, f, memory_order_relaxed);
#ifdef EP_X86
  return f == ep_join_avx512 ? 2 : f == ep_join_avx2 ? 1 : 0;
#else
  return 0;
#endif
}

/* Check one stream of cnt elements at p (avail bytes) and decode its pairs into buf (ceil(cnt/2)
 * bytes). Its bytes, or 0 with *err set. */
static size_t ep_parse_stream(const uint8_t *p, size_t avail, size_t cnt, ZSTD_DCtx *dctx,
                              uint8_t *buf, ep_stream *s, kv_codec_err *err)
{
  size_t h = ceil_div(cnt, 2), nb = ceil_div(cnt, 8);
  if (avail < EP_STREAM_HDR) {
    KV_CODEC_FAIL(err, KV_CODEC_ECORRUPT, "exponent pairs: stream header past the plane", avail,
                  EP_STREAM_HDR);
    return 0;
  }
  uint32_t n_esc = kv_codec_get_le32(p + 4), pl = kv_codec_get_le32(p + 8);
  if (p[1] == 2) { /* the stream's high bytes as they are: raw (P = cnt) or zstd */
    if (p[0] != 0 || p[2] != 0 || p[3] != 0 || n_esc != 0 || pl == 0 ||
        pl > avail - EP_STREAM_HDR) {
      KV_CODEC_FAIL(err, KV_CODEC_ECORRUPT, "exponent pairs: bad plain stream header", pl,
                    avail);
      return 0;
    }
    if (pl == cnt) {
      s->hi = p + EP_STREAM_HDR;
    } else {
      size_t r = ZSTD_decompressDCtx(dctx, buf, cnt, p + EP_STREAM_HDR, pl);
      if (ZSTD_isError(r) || r != cnt) {
        KV_CODEC_FAIL(err, KV_CODEC_ECORRUPT, "exponent pairs: zstd frame does not decode to "
                      "the stream's high bytes", ZSTD_isError(r) ? 0 : r, cnt);
        return 0;
      }
      s->hi = buf;
    }
    s->n_esc = 0;
    s->esc_at = 0;
    return EP_STREAM_HDR + pl;
  }
  s->hi = NULL;
  if (p[0] > EP_BASE_MAX || p[1] > 1 || p[2] != 0 || p[3] != 0 || n_esc > cnt ||
      (p[1] == 0 ? pl != h : pl == 0)) {
    KV_CODEC_FAIL(err, KV_CODEC_ECORRUPT, "exponent pairs: bad stream header", p[0], p[1]);
    return 0;
  }
  size_t total = ep_stream_bytes(cnt, pl, n_esc);
  if (pl > avail || total > avail) {
    KV_CODEC_FAIL(err, KV_CODEC_ECORRUPT, "exponent pairs: stream longer than its plane", total,
                  avail);
    return 0;
  }
  if (p[1] == 0) {
    s->pairs = p + EP_STREAM_HDR;
  } else {
    size_t r = ZSTD_decompressDCtx(dctx, buf, h, p + EP_STREAM_HDR, pl);
    if (ZSTD_isError(r) || r != h) {
      KV_CODEC_FAIL(err, KV_CODEC_ECORRUPT, "exponent pairs: zstd frame does not decode to the pairs",
                    ZSTD_isError(r) ? 0 : r, h);
      return 0;
    }
    s->pairs = buf;
  }
  s->base = p[0];
  s->bm = p + EP_STREAM_HDR + pl;
  s->nb = nb;
  s->esc = s->bm + 3 * nb;
  s->n_esc = n_esc;
  s->esc_at = 0;
  for (uint32_t j = 0; j < n_esc; j++) {
    uint32_t pos = kv_codec_get_le32(s->esc + 5 * (size_t)j);
    if (pos >= cnt || (j > 0 && pos <= kv_codec_get_le32(s->esc + 5 * (size_t)(j - 1))) ||
        s->esc[5 * (size_t)j + 4] > 31) {
      KV_CODEC_FAIL(err, KV_CODEC_ECORRUPT, "exponent pairs: escape out of order or range", pos,
                    cnt);
      return 0;
    }
  }
  return total;
}

size_t kv_frame_decode_scratch_bytes(const kv_frame_info *info)
{
  if (info == NULL || info->n_elems == 0)
    return 0;
  size_t es = kv_codec_dtype_bytes(info->dtype);
  return KV_CODEC_SCRATCH_SLACK + align64(ZSTD_estimateDCtxSize()) +
         es * align64((size_t)info->n_elems);
}

kv_codec_status kv_frame_decode(kv_codec_dctx *ctx, const void *src, size_t len, void *scratch,
                                size_t scratch_cap, void *dst, size_t dst_cap, kv_codec_err *err)
{
  kv_frame_info info;
  kv_codec_status rc = kv_frame_parse(src, len, &info, err);
  if (rc != KV_CODEC_OK)
    return rc;
  size_t es = kv_codec_dtype_bytes(info.dtype), n = (size_t)info.n_elems;
  if (dst == NULL || dst_cap < n * es)
    return KV_CODEC_FAIL(err, KV_CODEC_ETOOSMALL, "dst smaller than the frame's rows",
                         dst == NULL ? 0 : dst_cap, n * es);
  size_t need = kv_frame_decode_scratch_bytes(&info);
  if (scratch == NULL || scratch_cap < need)
    return KV_CODEC_FAIL(err, KV_CODEC_ENOMEM, "scratch smaller than the frame's scratch bytes",
                         scratch == NULL ? 0 : scratch_cap, need);
  size_t cap = scratch_cap, dctx_bytes = align64(ZSTD_estimateDCtxSize());
  uint8_t *ws = kv_codec_scratch_align(scratch, &cap);
  ZSTD_DCtx *dctx = NULL;
  const uint8_t *ps = (const uint8_t *)src + info.header_bytes;
  const uint8_t *planes[4] = {NULL, NULL, NULL, NULL};
  int ep = (info.coding & KV_FRAME_CODING_EXPPAIRS) != 0;
  ep_stream eps[2];
  memset(eps, 0, sizeof eps);
  for (unsigned b = 0; b < es; b++) {
    uint32_t l = info.plane_len[b];
    if (l == n && !(ep && b == 1)) {
      planes[b] = ps;
    } else {
      if (dctx == NULL) {
        if (ctx != NULL && ctx->magic == KV_DCTX_MAGIC && ctx->zd != NULL) {
          dctx = ctx->zd;
          ZSTD_DCtx_reset(dctx, ZSTD_reset_session_and_parameters);
        } else if ((dctx = ZSTD_initStaticDCtx(ws, dctx_bytes)) == NULL) {
          return KV_CODEC_FAIL(err, KV_CODEC_ENOMEM, "zstd cannot use the scratch", dctx_bytes,
                               0);
        }
      }
      if (ep && b == 1) { /* exponent pairs: K stream, V stream; pairs decoded into the buffer */
        uint8_t *buf = ws + dctx_bytes + align64(n);
        size_t used = 0, nk = (size_t)info.k_elems;
        for (int st = 0; st < 2; st++) {
          size_t cnt = st ? n - nk : nk;
          if (cnt == 0)
            continue;
          size_t r = ep_parse_stream(ps + used, l - used, cnt, dctx, buf, &eps[st], err);
          if (r == 0)
            return KV_CODEC_ECORRUPT;
          used += r;
          buf += eps[st].hi != NULL ? cnt : ceil_div(cnt, 2);
        }
        if (used != l)
          return KV_CODEC_FAIL(err, KV_CODEC_ECORRUPT,
                               "exponent pairs: streams do not fill their plane", used, l);
        ps += l;
        continue;
      }
      uint8_t *buf = ws + dctx_bytes + b * align64(n);
      size_t r = ZSTD_decompressDCtx(dctx, buf, n, ps, l);
      if (ZSTD_isError(r) || r != n)
        return KV_CODEC_FAIL(err, KV_CODEC_ECORRUPT, "zstd frame does not decode to its plane",
                             ZSTD_isError(r) ? 0 : r, n);
      planes[b] = buf;
    }
    ps += l;
  }
  /* each section from its place in its stream (all K sections first: one join when the frame
   * holds K sections only, or its K sections precede its V sections) */
  size_t at_k = 0, at_v = (size_t)info.k_elems;
  uint8_t *out = dst;
  ep_join_fn join = ep ? ep_join() : NULL;
  for (uint32_t i = 0; i < info.n_sections; i++) {
    uint32_t r, d;
    int v;
    sec_at(src, i, &r, &d, &v);
    size_t m = (size_t)r * d, *at = v ? &at_v : &at_k;
    if (ep) {
      ep_stream *st = &eps[v];
      size_t from = *at - (v ? (size_t)info.k_elems : 0); /* the element in its stream */
      if (st->hi != NULL)
        kv_planes_join2(planes[0] + *at, st->hi + from, m, out);
      else
        join(planes[0] + *at, st, from, m, out);
      for (; st->esc_at < st->n_esc; st->esc_at++) { /* the exponents outside the window */
        const uint8_t *x = st->esc + 5 * (size_t)st->esc_at;
        uint32_t pos = kv_codec_get_le32(x);
        if (pos >= from + m)
          break;
        uint16_t w;
        memcpy(&w, out + 2 * (pos - from), 2);
        w = (uint16_t)((w & ~(0x1Fu << 10)) | (unsigned)x[4] << 10);
        memcpy(out + 2 * (pos - from), &w, 2);
      }
    } else if (es == 2)
      kv_planes_join2(planes[0] + *at, planes[1] + *at, m, out);
    else
      kv_planes_join4(planes[0] + *at, planes[1] + *at, planes[2] + *at, planes[3] + *at, m,
                      out);
    *at += m;
    out += m * es;
  }
  return KV_CODEC_OK;
}

uint32_t kv_frames_plan(const uint64_t *sec_bytes, uint32_t n_sections, uint64_t frame_bytes,
                        uint32_t *first)
{
  uint32_t nf = 0, in = 0;
  uint64_t acc = 0;
  if (frame_bytes == 0)
    frame_bytes = KV_FRAME_BYTES_DEFAULT;
  for (uint32_t s = 0; s < n_sections; s++) {
    if (in == 0) {
      if (first != NULL)
        first[nf] = s;
      nf++;
    }
    acc += sec_bytes[s];
    in++;
    /* a frame closes once it reaches the target or holds the most sections a frame may */
    if (acc >= frame_bytes || in == KV_FRAME_MAX_SECTIONS)
      acc = in = 0;
  }
  return nf;
}

/* ---- parallel decode ----------------------------------------------------------------------- */

typedef struct mt_run {
  const kv_frame_job *jobs;
  size_t n;
  atomic_size_t next;
  atomic_size_t first_bad; /* lowest failing job index, n when none */
} mt_run;

typedef struct mt_arg {
  mt_run *run;
  kv_frame_worker *w;
  size_t bad; /* the lowest job this worker failed, run->n when none */
  kv_codec_status st;
  kv_codec_err err;
} mt_arg;

static void *mt_work(void *p)
{
  mt_arg *a = p;
  mt_run *r = a->run;
  for (;;) {
    size_t i = atomic_fetch_add_explicit(&r->next, 1, memory_order_relaxed);
    if (i >= r->n || i > atomic_load_explicit(&r->first_bad, memory_order_relaxed))
      break;
    const kv_frame_job *j = &r->jobs[i];
    kv_codec_err e;
    kv_codec_status st = kv_frame_decode(a->w->ctx, j->src, j->len, a->w->scratch,
                                         a->w->scratch_cap, j->dst, j->dst_cap, &e);
    if (st != KV_CODEC_OK) {
      if (i < a->bad) {
        a->bad = i;
        a->st = st;
        a->err = e;
      }
      size_t cur = atomic_load_explicit(&r->first_bad, memory_order_relaxed);
      while (i < cur && !atomic_compare_exchange_weak(&r->first_bad, &cur, i))
        ;
    }
  }
  return NULL;
}

kv_codec_status kv_frames_decode_mt(const kv_frame_job *jobs, size_t n_jobs, kv_frame_worker *w,
                                    unsigned n_threads, kv_codec_err *err)
{
  if ((jobs == NULL && n_jobs > 0) || w == NULL || n_threads == 0 ||
      n_threads > KV_FRAME_MAX_THREADS)
    return KV_CODEC_FAIL(err, KV_CODEC_EINVAL, "frames_decode_mt: NULL jobs or workers, or "
                                               "threads outside 1..256",
                         n_threads, KV_FRAME_MAX_THREADS);
  if (n_threads > n_jobs)
    n_threads = n_jobs ? (unsigned)n_jobs : 1;
  mt_run r = {.jobs = jobs, .n = n_jobs};
  atomic_init(&r.next, 0);
  atomic_init(&r.first_bad, n_jobs);
  mt_arg args[KV_FRAME_MAX_THREADS];
  pthread_t tid[KV_FRAME_MAX_THREADS];
  unsigned started = 1;
  for (unsigned t = 0; t < n_threads; t++) {
    args[t].run = &r;
    args[t].w = &w[t];
    args[t].bad = n_jobs;
    args[t].st = KV_CODEC_OK;
  }
  for (unsigned t = 1; t < n_threads; t++) {
    if (pthread_create(&tid[t], NULL, mt_work, &args[t]) != 0)
      break; /* the threads started so far (and this one) do the work */
    started++;
  }
  mt_work(&args[0]);
  for (unsigned t = 1; t < started; t++)
    pthread_join(tid[t], NULL);
  size_t bad = n_jobs;
  unsigned who = 0;
  for (unsigned t = 0; t < started; t++)
    if (args[t].bad < bad) {
      bad = args[t].bad;
      who = t;
    }
  if (bad == n_jobs)
    return KV_CODEC_OK;
  if (err != NULL)
    *err = args[who].err;
  return args[who].st;
}
