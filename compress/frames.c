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
 * planes are stored raw (a memcpy to decode) unless zstd saves at least 1/32 of them.
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
#include <string.h>
#include <zstd.h>
#include <zstd_errors.h>

static inline size_t align64(size_t n)
{
  return (n + 63) & ~(size_t)63;
}

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
  /* one plane, and a static compression context for when the thread's cannot be had */
  return KV_CODEC_SCRATCH_SLACK + align64((size_t)e) +
         align64(ZSTD_estimateCCtxSize_usingCParams(cp));
}

kv_codec_status kv_frame_encode(kv_codec_dtype dtype, const kv_frame_sec *secs,
                                uint32_t n_sections, int level, void *scratch, size_t scratch_cap,
                                void *dst, size_t dst_cap, size_t *out_len, kv_codec_err *err)
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
  uint8_t *plane = ws, *cmem = ws + align64(n);
  ZSTD_CCtx *cctx = kv_lossless_thread_cctx();
  if (cctx == NULL &&
      (cctx = ZSTD_initStaticCCtx(cmem, cap - align64(n))) == NULL)
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
    size_t avail = dst_cap - pos, len = 0;
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
  if (kv_codec_get_le16(s + 6) != 0)
    return KV_CODEC_FAIL(err, KV_CODEC_ECORRUPT, "frame reserved bytes are not 0",
                         kv_codec_get_le16(s + 6), 0);
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
  for (unsigned b = 0; b < es; b++) {
    uint32_t l = info.plane_len[b];
    if (l == n) {
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
  for (uint32_t i = 0; i < info.n_sections; i++) {
    uint32_t r, d;
    int v;
    sec_at(src, i, &r, &d, &v);
    size_t m = (size_t)r * d, *at = v ? &at_v : &at_k;
    if (es == 2)
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
