/* SPDX-License-Identifier: MIT */
/*
 * tests/unit/test_codec_frames.c — lossless frames (compress/frames.c, section format version
 * 2): bit-exact round trips of several sections of any shape and dtype, the low planes stored
 * raw and the high planes compressed, one frame beating per-section zstd-planes on small
 * sections, the frame plan, every broken header rejected, and the parallel decode of many
 * frames (equal to one thread's; the lowest failing frame reported). Exponent pairs (f16 plane
 * 1, KV_FRAME_CODING_EXPPAIRS): bit-exact under every coding choice and every join (portable,
 * AVX2, AVX-512) on shapes whose sections start at any element, with exponents outside the
 * window (escapes), every broken stream field rejected; golden frames written by earlier builds
 * keep decoding to the same bytes.
 *
 *   test_codec_frames [DIR]          the tests; DIR: verify the golden frames in DIR
 *   test_codec_frames --write DIR    write the golden frames (only for a new frame coding: never
 *                                    rewrite the files of a released one)
 *   test_codec_frames --write-corpus DIR   write the fuzz seeds of fuzz_frame
 */
#include "codec_int.h"
#include "kvgen.h"

#include <errno.h>

static const kv_codec_dtype dtypes[] = {KV_CODEC_F16, KV_CODEC_BF16, KV_CODEC_F32};

typedef struct tframe {
  uint8_t *enc;
  size_t len;
  void *src; /* the sections back to back */
  size_t src_len;
} tframe;

/* A frame of n sections (alternating K and V, rows/dims from the seed) of dtype dt. */
static tframe make_frame_ex(kv_codec_dtype dt, uint32_t n, uint32_t rows, uint32_t dim,
                            uint64_t seed, int level, kv_frame_coding coding, unsigned kinds,
                            unsigned spikes);

static tframe make_frame(kv_codec_dtype dt, uint32_t n, uint32_t rows, uint32_t dim,
                         uint64_t seed, int level)
{
  return make_frame_ex(dt, n, rows, dim, seed, level, KV_FRAME_AUTO, 0, 0);
}

/* kinds: 0 alternating K and V, 1 all K, 2 all V, 3 alternating with V rows repeating; spikes: every spikes-th element (0: none) of
 * an f16 frame gets an exponent far from the rest (0, subnormals, 1e4, inf, NaN). */
static tframe make_frame_ex(kv_codec_dtype dt, uint32_t n, uint32_t rows, uint32_t dim,
                            uint64_t seed, int level, kv_frame_coding coding, unsigned kinds,
                            unsigned spikes)
{
  tframe f;
  kv_frame_sec secs[64];
  size_t es = kv_codec_dtype_bytes(dt), total = 0;
  CHECK(n <= 64);
  for (uint32_t i = 0; i < n; i++)
    total += (size_t)(rows + i % 3) * dim * es;
  f.src = kt_xmalloc(total);
  f.src_len = total;
  size_t at = 0;
  for (uint32_t i = 0; i < n; i++) {
    size_t len;
    uint32_t r = rows + i % 3; /* sections of different lengths */
    kv_section_kind kd = kinds == 1   ? KV_SECTION_K
                         : kinds == 2 ? KV_SECTION_V
                                      : ((i & 1) ? KV_SECTION_V : KV_SECTION_K);
    void *s = kvgen_section(dt, kd, seed + i, r, dim, &len);
    if (spikes > 0 && dt == KV_CODEC_F16) {
      static const uint16_t odd[] = {0x0000, 0x8000, 0x0001, 0x83ff, 0x70e2, 0x7c00, 0xfe01,
                                     0x0400, 0x3c00};
      uint16_t *h = s;
      for (size_t j = (i * 7) % spikes; j < len / 2; j += spikes)
        h[j] = odd[(j / spikes + i) % (sizeof odd / sizeof odd[0])];
    }
    if (kinds == 3 && kd == KV_SECTION_V) /* V rows repeating (a layer-0 V: token values) */
      for (uint32_t row = 5; row < r; row++)
        memcpy((uint8_t *)s + (size_t)row * dim * es, (uint8_t *)s + (size_t)(row % 5) * dim * es,
               (size_t)dim * es);
    memcpy((uint8_t *)f.src + at, s, len);
    free(s);
    secs[i].rows = (uint8_t *)f.src + at;
    secs[i].n_rows = r;
    secs[i].head_dim = dim;
    secs[i].kind = kd;
    at += len;
  }
  size_t bound = kv_frame_bound(dt, secs, n);
  size_t sb = kv_frame_encode_scratch_bytes(dt, secs, n, level);
  CHECK(bound > 0 && sb > 0);
  void *scratch = kt_xmalloc(sb);
  f.enc = kt_xmalloc(bound);
  kv_codec_err e;
  CHECK_OK(e, kv_frame_encode_ex(dt, secs, n, level, coding, scratch, sb, f.enc, bound, &f.len,
                                 &e));
  CHECK(f.len <= bound);
  free(scratch);
  return f;
}

static void *decode_frame(const tframe *f, kv_codec_dctx *ctx)
{
  kv_frame_info info;
  kv_codec_err e;
  CHECK_OK(e, kv_frame_parse(f->enc, f->len, &info, &e));
  size_t sb = kv_frame_decode_scratch_bytes(&info);
  void *scratch = kt_xmalloc(sb), *out = kt_xmalloc(f->src_len);
  CHECK_OK(e, kv_frame_decode(ctx, f->enc, f->len, scratch, sb, out, f->src_len, &e));
  free(scratch);
  return out;
}

TEST(frame_roundtrip_every_dtype)
{
  void *mem = kt_xmalloc(kv_codec_dctx_bytes());
  kv_codec_dctx *ctx = kv_codec_dctx_init(mem, kv_codec_dctx_bytes());
  CHECK(ctx != NULL);
  for (size_t k = 0; k < 3; k++)
    for (uint32_t n = 1; n <= 9; n += 4) {
      tframe f = make_frame(dtypes[k], n, 37, 24, 100 + n, 0);
      kv_frame_info info;
      kv_codec_err e;
      CHECK_OK(e, kv_frame_parse(f.enc, f.len, &info, &e));
      CHECK(info.n_sections == n && info.dtype == dtypes[k]);
      CHECK(info.zstd_level == KV_FRAME_LEVEL_DEFAULT);
      CHECK(info.n_elems * kv_codec_dtype_bytes(dtypes[k]) == f.src_len);
      CHECK(info.frame_bytes == f.len);
      uint64_t off = 0;
      for (uint32_t i = 0; i < n; i++) {
        uint32_t r, d;
        uint64_t o;
        kv_section_kind kd;
        CHECK(kv_frame_section(f.enc, &info, i, &r, &d, &kd, &o) == KV_CODEC_OK);
        CHECK(r == 37 + i % 3 && d == 24 && o == off);
        CHECK(kd == ((i & 1) ? KV_SECTION_V : KV_SECTION_K));
        off += (uint64_t)r * d * kv_codec_dtype_bytes(dtypes[k]);
      }
      for (int with_ctx = 0; with_ctx < 2; with_ctx++) {
        void *out = decode_frame(&f, with_ctx ? ctx : NULL);
        CHECK(memcmp(out, f.src, f.src_len) == 0);
        free(out);
      }
      free(f.enc);
      free(f.src);
    }
  free(mem);
}

/* Random bit patterns (NaNs, infinities, subnormals): still bit-exact; incompressible planes
 * are stored raw, so the frame is at most header + raw bytes. */
TEST(frame_any_bits_and_raw_planes)
{
  for (size_t k = 0; k < 3; k++) {
    size_t es = kv_codec_dtype_bytes(dtypes[k]);
    uint32_t rows = 300, dim = 16, n = 3;
    size_t one = (size_t)rows * dim * es;
    uint8_t *src = kt_xmalloc(n * one);
    kvgen_bytes(7 + k, n * one, src);
    kv_frame_sec secs[3];
    for (uint32_t i = 0; i < n; i++) {
      secs[i].rows = src + i * one;
      secs[i].n_rows = rows;
      secs[i].head_dim = dim;
      secs[i].kind = KV_SECTION_K;
    }
    size_t bound = kv_frame_bound(dtypes[k], secs, n), sb =
      kv_frame_encode_scratch_bytes(dtypes[k], secs, n, 1);
    uint8_t *enc = kt_xmalloc(bound), *scratch = kt_xmalloc(sb);
    size_t len;
    kv_codec_err e;
    CHECK_OK(e, kv_frame_encode(dtypes[k], secs, n, 1, scratch, sb, enc, bound, &len, &e));
    CHECK(len == bound); /* every plane raw */
    kv_frame_info info;
    CHECK_OK(e, kv_frame_parse(enc, len, &info, &e));
    for (size_t b = 0; b < es; b++)
      CHECK(info.plane_len[b] == info.n_elems);
    tframe f = {enc, len, src, n * one};
    void *out = decode_frame(&f, NULL);
    CHECK(memcmp(out, src, n * one) == 0);
    free(out);
    free(enc);
    free(scratch);
    free(src);
  }
}

/* KV: the high plane compresses, the low plane is stored raw; and one frame of 16 small
 * sections is smaller than the 16 sections as zstd-planes each (one frame's fixed cost). */
TEST(frame_beats_per_section_planes)
{
  tframe f = make_frame(KV_CODEC_F16, 16, 64, 8, 5, 0);
  kv_frame_info info;
  kv_codec_err e;
  CHECK_OK(e, kv_frame_parse(f.enc, f.len, &info, &e));
  CHECK(info.plane_len[0] == info.n_elems);
  CHECK(info.plane_len[1] < info.n_elems * 3 / 4);
  size_t per_section = 0, at = 0;
  for (uint32_t i = 0; i < 16; i++) {
    kv_section_shape s = {KV_CODEC_F16, (i & 1) ? KV_SECTION_V : KV_SECTION_K, 64 + i % 3, 8};
    size_t len = (size_t)s.n_tokens * 8 * 2, enc_len;
    kv_codec_params p;
    memset(&p, 0, sizeof p);
    p.zstd_level = KV_FRAME_LEVEL_DEFAULT;
    uint8_t *enc = kt_encode(KV_CODEC_ID_ZSTD_PLANES, &s, (uint8_t *)f.src + at, len, &p,
                             &enc_len);
    per_section += enc_len;
    at += len;
    free(enc);
  }
  CHECK(f.len < per_section);
  free(f.enc);
  free(f.src);
}

TEST(frame_plan)
{
  uint64_t b[10] = {8192, 8192, 8192, 8192, 8192, 8192, 8192, 8192, 8192, 100};
  uint32_t first[10];
  CHECK(kv_frames_plan(b, 10, 32768, first) == 3);
  CHECK(first[0] == 0 && first[1] == 4 && first[2] == 8);
  CHECK(kv_frames_plan(b, 10, 1, NULL) == 10);
  CHECK(kv_frames_plan(b, 10, 1u << 30, first) == 1 && first[0] == 0);
  CHECK(kv_frames_plan(b, 0, 4096, first) == 0);
  CHECK(kv_frames_plan(b, 10, 0, NULL) == kv_frames_plan(b, 10, KV_FRAME_BYTES_DEFAULT, NULL));
}

TEST(frame_encode_argument_errors)
{
  uint16_t rows[64] = {0};
  kv_frame_sec s = {rows, 8, 8, KV_SECTION_K};
  uint8_t dst[256], scratch[1 << 16];
  size_t len;
  kv_codec_err e;
  CHECK_RC(KV_CODEC_EINVAL, e, kv_frame_encode((kv_codec_dtype)9, &s, 1, 1, scratch,
                                                 sizeof scratch, dst, sizeof dst, &len, &e));
  CHECK_RC(KV_CODEC_EINVAL, e, kv_frame_encode(KV_CODEC_F16, &s, 0, 1, scratch, sizeof scratch,
                                                 dst, sizeof dst, &len, &e));
  CHECK_RC(KV_CODEC_EINVAL, e, kv_frame_encode(KV_CODEC_F16, &s, 1, 23, scratch, sizeof scratch,
                                                 dst, sizeof dst, &len, &e));
  kv_frame_sec z = {rows, 0, 8, KV_SECTION_K};
  CHECK_RC(KV_CODEC_EINVAL, e, kv_frame_encode(KV_CODEC_F16, &z, 1, 1, scratch, sizeof scratch,
                                                 dst, sizeof dst, &len, &e));
  CHECK(kv_frame_bound(KV_CODEC_F16, &z, 1) == 0);
  z.n_rows = 8;
  z.kind = (kv_section_kind)2;
  CHECK_RC(KV_CODEC_EINVAL, e, kv_frame_encode(KV_CODEC_F16, &z, 1, 1, scratch, sizeof scratch,
                                                 dst, sizeof dst, &len, &e));
  CHECK_RC(KV_CODEC_ENOMEM, e, kv_frame_encode(KV_CODEC_F16, &s, 1, 1, scratch, 16, dst,
                                                 sizeof dst, &len, &e));
  CHECK_RC(KV_CODEC_ETOOSMALL, e, kv_frame_encode(KV_CODEC_F16, &s, 1, 1, scratch,
                                                    sizeof scratch, dst, 20, &len, &e));
  size_t sb = kv_frame_encode_scratch_bytes(KV_CODEC_F16, &s, 1, 1);
  CHECK(sb > 0 && sb <= sizeof scratch);
  CHECK_OK(e, kv_frame_encode(KV_CODEC_F16, &s, 1, 1, scratch, sb, dst, sizeof dst, &len, &e));
}

/* Every header field broken on its own, truncation and extension: KV_CODEC_ECORRUPT, never a
 * crash or a wrong length accepted. */
TEST(frame_corrupt_headers_rejected)
{
  tframe f = make_frame_ex(KV_CODEC_F16, 4, 40, 8, 9, 0, KV_FRAME_PLANES, 0, 0);
  kv_frame_info info;
  kv_codec_err e;
  CHECK_OK(e, kv_frame_parse(f.enc, f.len, &info, &e));
  CHECK(info.coding == 0);
  uint8_t *b = kt_xmalloc(f.len + 8);
  struct {
    size_t off;
    uint8_t val;
  } bad[] = {
    {0, 2},  {1, 1},  {1, 3},  {2, 0},  {2, 4},  {3, 0},  {3, 23}, {4, 0},
    {5, 0x20}, {6, 2}, {6, 0x80}, {7, 1}, {8, 0}, {11, 0x40}, {12, 0}, {14, 2},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    memcpy(b, f.enc, f.len);
    if (bad[i].off == 8) /* rows of section 0: 0 */
      memset(b + 8, 0, 4);
    else if (bad[i].off == 12) /* dims of section 0: 0 */
      memset(b + 12, 0, 4);
    else
      b[bad[i].off] = bad[i].val;
    CHECK_RC(KV_CODEC_ECORRUPT, e, kv_frame_parse(b, f.len, &info, &e));
  }
  /* plane lengths that do not add up */
  CHECK_OK(e, kv_frame_parse(f.enc, f.len, &info, &e));
  size_t pl = info.header_bytes - 8;
  memcpy(b, f.enc, f.len);
  kv_codec_put_le32(b + pl, kv_codec_get_le32(b + pl) + 1);
  CHECK_RC(KV_CODEC_ECORRUPT, e, kv_frame_parse(b, f.len, &info, &e));
  memcpy(b, f.enc, f.len);
  kv_codec_put_le32(b + pl + 4, 0);
  CHECK_RC(KV_CODEC_ECORRUPT, e, kv_frame_parse(b, f.len, &info, &e));
  for (size_t cut = 0; cut < f.len; cut += 7)
    CHECK_RC(KV_CODEC_ECORRUPT, e, kv_frame_parse(f.enc, cut, &info, &e));
  memcpy(b, f.enc, f.len);
  CHECK_RC(KV_CODEC_ECORRUPT, e, kv_frame_parse(b, f.len + 8, &info, &e));
  /* a damaged compressed plane: an error, or (zstd has no checksum here) some bytes — never
   * outside the buffer; the block's page checksums catch it in the engine */
  CHECK_OK(e, kv_frame_parse(f.enc, f.len, &info, &e));
  CHECK(info.plane_len[1] < info.n_elems);
  size_t sb = kv_frame_decode_scratch_bytes(&info);
  uint8_t *scratch = kt_xmalloc(sb), *out = kt_xmalloc(f.src_len);
  size_t z = info.header_bytes + info.plane_len[0];
  for (size_t k = 0; k < info.plane_len[1]; k += 3) {
    memcpy(b, f.enc, f.len);
    b[z + k] ^= 0x5a;
    kv_codec_status st = kv_frame_decode(NULL, b, f.len, scratch, sb, out, f.src_len, &e);
    CHECK(st == KV_CODEC_OK || st == KV_CODEC_ECORRUPT);
  }
  CHECK_RC(KV_CODEC_ETOOSMALL, e, kv_frame_decode(NULL, f.enc, f.len, scratch, sb, out,
                                                    f.src_len - 1, &e));
  CHECK_RC(KV_CODEC_ENOMEM, e, kv_frame_decode(NULL, f.enc, f.len, scratch, 64, out, f.src_len,
                                                 &e));
  free(scratch);
  free(out);
  free(b);
  free(f.enc);
  free(f.src);
}

TEST(frames_decode_parallel)
{
  enum { NF = 23, NT = 4 };
  tframe f[NF];
  kv_frame_job jobs[NF];
  size_t sb = 0;
  for (int i = 0; i < NF; i++) {
    f[i] = make_frame(i % 2 ? KV_CODEC_F16 : KV_CODEC_F32, 5, 50 + i, 16, 1000 + i, 0);
    kv_frame_info info;
    kv_codec_err e;
    CHECK_OK(e, kv_frame_parse(f[i].enc, f[i].len, &info, &e));
    size_t s = kv_frame_decode_scratch_bytes(&info);
    sb = s > sb ? s : sb;
    jobs[i].src = f[i].enc;
    jobs[i].len = f[i].len;
    jobs[i].dst = kt_xmalloc(f[i].src_len);
    jobs[i].dst_cap = f[i].src_len;
  }
  kv_frame_worker w[NT];
  void *mem[NT];
  for (int t = 0; t < NT; t++) {
    mem[t] = kt_xmalloc(kv_codec_dctx_bytes());
    w[t].ctx = kv_codec_dctx_init(mem[t], kv_codec_dctx_bytes());
    w[t].scratch = kt_xmalloc(sb);
    w[t].scratch_cap = sb;
  }
  kv_codec_err e;
  for (unsigned nt = 1; nt <= NT; nt++) {
    for (int i = 0; i < NF; i++)
      memset(jobs[i].dst, 0, jobs[i].dst_cap);
    CHECK_OK(e, kv_frames_decode_mt(jobs, NF, w, nt, &e));
    for (int i = 0; i < NF; i++)
      CHECK(memcmp(jobs[i].dst, f[i].src, f[i].src_len) == 0);
  }
  /* frames 7 and 15 broken: the error is frame 7's (dst too small names its size) */
  jobs[15].len -= 1;
  jobs[7].dst_cap -= 2;
  CHECK_RC(KV_CODEC_ETOOSMALL, e, kv_frames_decode_mt(jobs, NF, w, NT, &e));
  CHECK(e.value == f[7].src_len - 2);
  jobs[7].dst_cap += 2;
  CHECK_RC(KV_CODEC_ECORRUPT, e, kv_frames_decode_mt(jobs, NF, w, 3, &e));
  CHECK_RC(KV_CODEC_EINVAL, e, kv_frames_decode_mt(jobs, NF, w, 0, &e));
  CHECK_OK(e, kv_frames_decode_mt(jobs, 0, w, 2, &e));
  for (int t = 0; t < NT; t++) {
    free(w[t].scratch);
    free(mem[t]);
  }
  for (int i = 0; i < NF; i++) {
    free(jobs[i].dst);
    free(f[i].enc);
    free(f[i].src);
  }
}


/* Exponent pairs: every coding, every join this CPU has, sections starting at odd and unaligned
 * elements (odd dims and rows), K-only, V-only and mixed frames, escapes: bit-exact; forced
 * pairs are flagged, PLANES never is; AUTO takes them on KV-like data only when they pay. */
TEST(frame_exppairs_roundtrip)
{
  static const uint32_t shapes[][3] = {{1, 1, 1}, {1, 3, 1}, {3, 37, 24}, {5, 40, 8},
                                       {4, 33, 7}, {9, 64, 16}, {2, 1, 129}};
  int top = kv_frames_simd_limit(2);
  for (int lim = 0; lim <= top; lim++) {
    CHECK(kv_frames_simd_limit(lim) == lim);
    for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++)
      for (unsigned kinds = 0; kinds < 3; kinds++)
        for (unsigned sp = 0; sp < 3; sp++)
          for (int c = 0; c < 3; c++) {
            unsigned spikes = sp == 0 ? 0 : sp == 1 ? 97 : 3;
            tframe f = make_frame_ex(KV_CODEC_F16, shapes[k][0], shapes[k][1], shapes[k][2],
                                     77 + k, 0, (kv_frame_coding)c, kinds, spikes);
            kv_frame_info info;
            kv_codec_err e;
            CHECK_OK(e, kv_frame_parse(f.enc, f.len, &info, &e));
            if (c == KV_FRAME_PLANES)
              CHECK(info.coding == 0);
            if (c == KV_FRAME_EXPPAIRS && info.n_elems >= 1500 && spikes != 3)
              CHECK(info.coding == KV_FRAME_CODING_EXPPAIRS);
            void *out = decode_frame(&f, NULL);
            CHECK(memcmp(out, f.src, f.src_len) == 0);
            free(out);
            free(f.enc);
            free(f.src);
          }
  }
  kv_frames_simd_limit(2);
  /* repeated V rows: auto keeps the V stream's plain zstd high bytes (stream coding 2) inside a
   * pairs frame, the K stream in pairs */
  {
    tframe f = make_frame_ex(KV_CODEC_F16, 8, 200, 8, 5, 0, KV_FRAME_AUTO, 3, 0);
    kv_frame_info info;
    kv_codec_err e;
    CHECK_OK(e, kv_frame_parse(f.enc, f.len, &info, &e));
    CHECK(info.coding == KV_FRAME_CODING_EXPPAIRS);
    const uint8_t *k = f.enc + info.header_bytes + info.plane_len[0];
    CHECK(k[1] == 0 || k[1] == 1);
    size_t cnt = (size_t)info.k_elems;
    const uint8_t *v = k + 12 + kv_codec_get_le32(k + 8) + 3 * ((cnt + 7) / 8) +
                       5 * (size_t)kv_codec_get_le32(k + 4);
    CHECK(v[1] == 2);
    CHECK(v + 12 + kv_codec_get_le32(v + 8) == f.enc + f.len);
    void *out = decode_frame(&f, NULL);
    CHECK(memcmp(out, f.src, f.src_len) == 0);
    free(out);
    free(f.enc);
    free(f.src);
  }
  /* bf16 and f32 frames never take them */
  for (size_t k = 1; k < 3; k++) {
    tframe f = make_frame_ex(dtypes[k], 3, 50, 16, 3, 0, KV_FRAME_EXPPAIRS, 0, 0);
    kv_frame_info info;
    kv_codec_err e;
    CHECK_OK(e, kv_frame_parse(f.enc, f.len, &info, &e));
    CHECK(info.coding == 0);
    free(f.enc);
    free(f.src);
  }
  /* a coding outside the enum */
  uint16_t rows[64] = {0};
  kv_frame_sec s = {rows, 8, 8, KV_SECTION_K};
  uint8_t dst[512], scratch[1 << 16];
  size_t len;
  kv_codec_err e;
  CHECK_RC(KV_CODEC_EINVAL, e, kv_frame_encode_ex(KV_CODEC_F16, &s, 1, 1, (kv_frame_coding)3,
                                                    scratch, sizeof scratch, dst, sizeof dst,
                                                    &len, &e));
}

/* Every field of an exponent-pairs stream broken on its own: KV_CODEC_ECORRUPT; any damaged
 * byte: an error or some bytes, never a write outside the output. */
TEST(frame_exppairs_corrupt_rejected)
{
  tframe f = make_frame_ex(KV_CODEC_F16, 4, 40, 8, 21, 0, KV_FRAME_EXPPAIRS, 0, 97);
  kv_frame_info info;
  kv_codec_err e;
  CHECK_OK(e, kv_frame_parse(f.enc, f.len, &info, &e));
  CHECK(info.coding == KV_FRAME_CODING_EXPPAIRS);
  size_t sb = kv_frame_decode_scratch_bytes(&info);
  uint8_t *scratch = kt_xmalloc(sb), *out = kt_xmalloc(f.src_len), *b = kt_xmalloc(f.len);
  size_t st = info.header_bytes + info.plane_len[0]; /* the K stream's header */
  uint32_t n_esc = kv_codec_get_le32(f.enc + st + 4);
  CHECK(n_esc > 0); /* the spikes */
  struct {
    size_t off;
    uint32_t v;
    int u32;
  } bad[] = {
    {0, 17, 0}, {0, 255, 0}, {1, 2, 0}, {2, 1, 0}, {3, 1, 0},
    {4, 0xffffffffu, 1}, {4, 0, 1}, {4, n_esc + 1, 1}, {8, 0, 1}, {8, 0x7fffffffu, 1},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    memcpy(b, f.enc, f.len);
    if (bad[i].u32)
      kv_codec_put_le32(b + st + bad[i].off, bad[i].v);
    else
      b[st + bad[i].off] = (uint8_t)bad[i].v;
    CHECK_RC(KV_CODEC_ECORRUPT, e, kv_frame_decode(NULL, b, f.len, scratch, sb, out, f.src_len,
                                                     &e));
  }
  /* escapes: the last one's position past the stream, two out of order, an exponent > 31 */
  uint32_t p = kv_codec_get_le32(f.enc + st + 8), cnt = (uint32_t)(info.k_elems);
  size_t esc = st + 12 + p + 3 * ((cnt + 7) / 8);
  memcpy(b, f.enc, f.len);
  kv_codec_put_le32(b + esc + 5 * (n_esc - 1), cnt);
  CHECK_RC(KV_CODEC_ECORRUPT, e, kv_frame_decode(NULL, b, f.len, scratch, sb, out, f.src_len, &e));
  if (n_esc > 1) {
    memcpy(b, f.enc, f.len);
    kv_codec_put_le32(b + esc + 5, kv_codec_get_le32(b + esc));
    CHECK_RC(KV_CODEC_ECORRUPT, e, kv_frame_decode(NULL, b, f.len, scratch, sb, out, f.src_len,
                                                     &e));
  }
  memcpy(b, f.enc, f.len);
  b[esc + 4] = 32;
  CHECK_RC(KV_CODEC_ECORRUPT, e, kv_frame_decode(NULL, b, f.len, scratch, sb, out, f.src_len, &e));
  /* the flag on a bf16 frame; the flag cleared on a pairs frame is some other plane 1 */
  memcpy(b, f.enc, f.len);
  b[2] = KV_CODEC_BF16;
  CHECK_RC(KV_CODEC_ECORRUPT, e, kv_frame_parse(b, f.len, &info, &e));
  memcpy(b, f.enc, f.len);
  b[6] = 0;
  kv_codec_status s0 = kv_frame_decode(NULL, b, f.len, scratch, sb, out, f.src_len, &e);
  CHECK(s0 == KV_CODEC_OK || s0 == KV_CODEC_ECORRUPT);
  for (size_t k = st; k < f.len; k++) {
    memcpy(b, f.enc, f.len);
    b[k] ^= (uint8_t)(0x5a + k);
    kv_codec_status r = kv_frame_decode(NULL, b, f.len, scratch, sb, out, f.src_len, &e);
    CHECK(r == KV_CODEC_OK || r == KV_CODEC_ECORRUPT);
  }
  free(scratch);
  free(out);
  free(b);
  free(f.enc);
  free(f.src);
}

/* ---- golden frames ------------------------------------------------------------------------- */

typedef struct gcase {
  const char *name;
  kv_codec_dtype dt;
  uint32_t n, rows, dim;
  kv_frame_coding coding;
  unsigned kinds, spikes;
} gcase;

/* frames_*: added 2026-11-27 with exponent pairs; the planes cases pin the coding every earlier
 * build wrote (byte 6 = 0) */
static const gcase gcases[] = {
  {"frame_planes_f16_kv", KV_CODEC_F16, 6, 40, 8, KV_FRAME_PLANES, 0, 0},
  {"frame_planes_bf16_v", KV_CODEC_BF16, 3, 21, 13, KV_FRAME_PLANES, 2, 0},
  {"frame_planes_f32_k", KV_CODEC_F32, 2, 30, 8, KV_FRAME_PLANES, 1, 0},
  {"frame_exppairs_f16_kv", KV_CODEC_F16, 8, 64, 8, KV_FRAME_EXPPAIRS, 0, 0},
  {"frame_exppairs_f16_odd_escapes", KV_CODEC_F16, 5, 33, 7, KV_FRAME_EXPPAIRS, 0, 41},
  {"frame_exppairs_f16_k_only", KV_CODEC_F16, 3, 100, 16, KV_FRAME_EXPPAIRS, 1, 0},
  {"frame_exppairs_f16_plain_v", KV_CODEC_F16, 8, 200, 8, KV_FRAME_AUTO, 3, 0},
};
#define N_GCASES (sizeof gcases / sizeof gcases[0])

static int write_file(const char *dir, const char *name, const char *ext, const void *p,
                      size_t n)
{
  char path[1024];
  snprintf(path, sizeof path, "%s/%s%s", dir, name, ext);
  FILE *f = fopen(path, "wb");
  if (f == NULL || fwrite(p, 1, n, f) != n) {
    fprintf(stderr, "cannot write %s: %s\n", path, strerror(errno));
    if (f != NULL)
      fclose(f);
    return -1;
  }
  return fclose(f) == 0 ? 0 : -1;
}

static uint8_t *read_file(const char *dir, const char *name, const char *ext, size_t *n)
{
  char path[1024];
  snprintf(path, sizeof path, "%s/%s%s", dir, name, ext);
  FILE *f = fopen(path, "rb");
  if (f == NULL) {
    fprintf(stderr, "cannot read %s: %s\n", path, strerror(errno));
    return NULL;
  }
  fseek(f, 0, SEEK_END);
  long l = ftell(f);
  fseek(f, 0, SEEK_SET);
  uint8_t *p = kt_xmalloc(l > 0 ? (size_t)l : 1);
  *n = fread(p, 1, (size_t)(l > 0 ? l : 0), f);
  fclose(f);
  return p;
}

/* the rows of a decoded frame as little-endian elements */
static void to_le(kv_codec_dtype dt, const void *rows, size_t bytes, uint8_t *le)
{
  kv_codec_store_le(dt, rows, bytes / kv_codec_dtype_bytes(dt), le);
}

/* reject_*: a pairs frame with a broken stream */
static size_t make_reject(const tframe *f, int which, uint8_t *b)
{
  kv_frame_info info;
  kv_codec_err e;
  CHECK_OK(e, kv_frame_parse(f->enc, f->len, &info, &e));
  memcpy(b, f->enc, f->len);
  size_t st = info.header_bytes + info.plane_len[0];
  if (which == 0)
    b[st] = 17; /* base */
  else if (which == 1)
    kv_codec_put_le32(b + st + 8, kv_codec_get_le32(b + st + 8) + 1); /* pair bytes */
  else
    b[6] = 3; /* an unknown coding flag */
  return f->len;
}
static const char *const gre[] = {"reject_frame_exppairs_base", "reject_frame_exppairs_len",
                                  "reject_frame_coding_flag"};

static int golden_write(const char *dir, int corpus)
{
  for (size_t i = 0; i < N_GCASES; i++) {
    const gcase *g = &gcases[i];
    tframe f = make_frame_ex(g->dt, g->n, g->rows, g->dim, 500 + i, 0, g->coding, g->kinds,
                             g->spikes);
    uint8_t *le = kt_xmalloc(f.src_len);
    to_le(g->dt, f.src, f.src_len, le);
    if (write_file(dir, g->name, ".bin", f.enc, f.len) != 0 ||
        (!corpus && write_file(dir, g->name, ".dec", le, f.src_len) != 0))
      return 1;
    if (i == 3)
      for (int r = 0; r < 3; r++) {
        uint8_t *b = kt_xmalloc(f.len);
        size_t n = make_reject(&f, r, b);
        if (write_file(dir, gre[r], ".bin", b, n) != 0)
          return 1;
        free(b);
      }
    free(le);
    free(f.enc);
    free(f.src);
  }
  printf("wrote %zu golden frames and %zu rejects to %s\n", N_GCASES, sizeof gre / sizeof gre[0],
         dir);
  return 0;
}

static const char *golden_dir;

TEST(frame_golden)
{
  for (size_t i = 0; i < N_GCASES; i++) {
    size_t n, nd;
    uint8_t *bin = read_file(golden_dir, gcases[i].name, ".bin", &n);
    uint8_t *dec = read_file(golden_dir, gcases[i].name, ".dec", &nd);
    CHECK(bin != NULL && dec != NULL);
    kv_frame_info info;
    kv_codec_err e;
    CHECK_OK(e, kv_frame_parse(bin, n, &info, &e));
    CHECK(info.coding == (gcases[i].coding != KV_FRAME_PLANES ? KV_FRAME_CODING_EXPPAIRS : 0));
    size_t bytes = (size_t)info.n_elems * kv_codec_dtype_bytes(info.dtype);
    CHECK(bytes == nd);
    size_t sb = kv_frame_decode_scratch_bytes(&info);
    uint8_t *scratch = kt_xmalloc(sb), *out = kt_xmalloc(bytes), *le = kt_xmalloc(bytes);
    int top = kv_frames_simd_limit(2);
    for (int lim = 0; lim <= top; lim++) {
      kv_frames_simd_limit(lim);
      memset(out, 0, bytes);
      CHECK_OK(e, kv_frame_decode(NULL, bin, n, scratch, sb, out, bytes, &e));
      to_le(info.dtype, out, bytes, le);
      CHECK(memcmp(le, dec, bytes) == 0);
    }
    kv_frames_simd_limit(2);
    free(scratch);
    free(out);
    free(le);
    free(bin);
    free(dec);
  }
  for (size_t r = 0; r < sizeof gre / sizeof gre[0]; r++) {
    size_t n;
    uint8_t *bin = read_file(golden_dir, gre[r], ".bin", &n);
    CHECK(bin != NULL);
    kv_frame_info info;
    kv_codec_err e;
    kv_codec_status st = kv_frame_parse(bin, n, &info, &e);
    if (st == KV_CODEC_OK) {
      size_t bytes = (size_t)info.n_elems * kv_codec_dtype_bytes(info.dtype);
      size_t sb = kv_frame_decode_scratch_bytes(&info);
      uint8_t *scratch = kt_xmalloc(sb), *out = kt_xmalloc(bytes);
      st = kv_frame_decode(NULL, bin, n, scratch, sb, out, bytes, &e);
      free(scratch);
      free(out);
    }
    CHECK(st == KV_CODEC_ECORRUPT);
    free(bin);
  }
}

int main(int argc, char **argv)
{
  if (argc == 3 && strcmp(argv[1], "--write") == 0)
    return golden_write(argv[2], 0);
  if (argc == 3 && strcmp(argv[1], "--write-corpus") == 0)
    return golden_write(argv[2], 1);
  RUN(frame_roundtrip_every_dtype);
  RUN(frame_any_bits_and_raw_planes);
  RUN(frame_beats_per_section_planes);
  RUN(frame_plan);
  RUN(frame_encode_argument_errors);
  RUN(frame_corrupt_headers_rejected);
  RUN(frames_decode_parallel);
  RUN(frame_exppairs_roundtrip);
  RUN(frame_exppairs_corrupt_rejected);
  if (argc == 2) {
    golden_dir = argv[1];
    RUN(frame_golden);
  }
  printf("%d passed, 0 failed\n", kt_passed);
  return T_EXIT_PASS;
}
