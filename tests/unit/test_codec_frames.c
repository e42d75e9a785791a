/* SPDX-License-Identifier: MIT */
/*
 * tests/unit/test_codec_frames.c — lossless frames (compress/frames.c, section format version
 * 2): bit-exact round trips of several sections of any shape and dtype, the low planes stored
 * raw and the high planes compressed, one frame beating per-section zstd-planes on small
 * sections, the frame plan, every broken header rejected, and the parallel decode of many
 * frames (equal to one thread's; the lowest failing frame reported).
 */
#include "codec_int.h"
#include "kvgen.h"

static const kv_codec_dtype dtypes[] = {KV_CODEC_F16, KV_CODEC_BF16, KV_CODEC_F32};

typedef struct tframe {
  uint8_t *enc;
  size_t len;
  void *src; /* the sections back to back */
  size_t src_len;
} tframe;

/* A frame of n sections (alternating K and V, rows/dims from the seed) of dtype dt. */
static tframe make_frame(kv_codec_dtype dt, uint32_t n, uint32_t rows, uint32_t dim,
                         uint64_t seed, int level)
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
    void *s = kvgen_section(dt, (i & 1) ? KV_SECTION_V : KV_SECTION_K, seed + i, r, dim, &len);
    memcpy((uint8_t *)f.src + at, s, len);
    free(s);
    secs[i].rows = (uint8_t *)f.src + at;
    secs[i].n_rows = r;
    secs[i].head_dim = dim;
    secs[i].kind = (i & 1) ? KV_SECTION_V : KV_SECTION_K;
    at += len;
  }
  size_t bound = kv_frame_bound(dt, secs, n);
  size_t sb = kv_frame_encode_scratch_bytes(dt, secs, n, level);
  CHECK(bound > 0 && sb > 0);
  void *scratch = kt_xmalloc(sb);
  f.enc = kt_xmalloc(bound);
  kv_codec_err e;
  CHECK_OK(e, kv_frame_encode(dt, secs, n, level, scratch, sb, f.enc, bound, &f.len, &e));
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
  tframe f = make_frame(KV_CODEC_F16, 4, 40, 8, 9, 0);
  kv_frame_info info;
  kv_codec_err e;
  CHECK_OK(e, kv_frame_parse(f.enc, f.len, &info, &e));
  uint8_t *b = kt_xmalloc(f.len + 8);
  struct {
    size_t off;
    uint8_t val;
  } bad[] = {
    {0, 2},  {1, 1},  {1, 3},  {2, 0},  {2, 4},  {3, 0},  {3, 23}, {4, 0},
    {5, 0x20}, {6, 1}, {7, 1}, {8, 0}, {11, 0x40}, {12, 0}, {14, 2},
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

int main(void)
{
  RUN(frame_roundtrip_every_dtype);
  RUN(frame_any_bits_and_raw_planes);
  RUN(frame_beats_per_section_planes);
  RUN(frame_plan);
  RUN(frame_encode_argument_errors);
  RUN(frame_corrupt_headers_rejected);
  RUN(frames_decode_parallel);
  printf("%d passed, 0 failed\n", kt_passed);
  return T_EXIT_PASS;
}
