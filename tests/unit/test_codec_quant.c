/* SPDX-License-Identifier: MIT */
/*
 * tests/unit/test_codec_quant.c — the "kivi" codec: the error bound of codec.h on every
 * element, exact residual rows, sizes, configurations the shape cannot take, corrupt input,
 * and bit-identical SIMD and portable dequantization.
 */
#include "codec_int.h"
#include "kvgen.h"

#include <float.h>
#include <math.h>

#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define HAVE_X86 1
#else
#define HAVE_X86 0
#endif

static const kv_codec_dtype dtypes[] = {KV_CODEC_F16, KV_CODEC_BF16, KV_CODEC_F32};

static kv_section_shape shape_of(kv_codec_dtype dt, kv_section_kind kind, uint32_t n, uint32_t d)
{
  kv_section_shape s = {dt, kind, n, d};
  return s;
}

/* Unit in the last place at |y| of dtype (0 means exact for f32 when asked for the dtype). */
static double ulp_of(kv_codec_dtype dt, double y)
{
  y = fabs(y);
  int e;
  frexp(y > 0 ? y : DBL_MIN, &e); /* y = m * 2^e, m in [0.5, 1) */
  switch (dt) {
  case KV_CODEC_F16: return ldexp(1.0, (e - 1 < -14 ? -14 : e - 1) - 10);
  case KV_CODEC_BF16: return ldexp(1.0, (e - 1 < -126 ? -126 : e - 1) - 7);
  case KV_CODEC_F32: return ldexp(1.0, (e - 1 < -126 ? -126 : e - 1) - 23);
  }
  return 0;
}

/*
 * Check every element of a decoded kivi section against codec.h's bound, computing each
 * quantization unit's min and max from the original data. Returns the largest error divided
 * by its bound (<= 1 passes).
 */
static double check_bound(const kv_section_shape *s, const void *orig, const void *dec,
                          unsigned bits, unsigned group, unsigned residual)
{
  uint32_t n = s->n_tokens, d = s->head_dim;
  float *x = kt_xmalloc(sizeof(float) * n * d), *y = kt_xmalloc(sizeof(float) * n * d);
  kv_codec_to_f32(s->dtype, orig, (size_t)n * d, x);
  kv_codec_to_f32(s->dtype, dec, (size_t)n * d, y);
  uint32_t qend = n - residual;
  double worst = 0;
  unsigned maxq = (1u << bits) - 1;
  for (uint32_t t = 0; t < n; t++)
    for (uint32_t j = 0; j < d; j++) {
      double xv = x[(size_t)t * d + j], yv = y[(size_t)t * d + j];
      if (t >= qend) { /* residual rows are exact */
        CHECK(memcmp(&x[(size_t)t * d + j], &y[(size_t)t * d + j], 4) == 0);
        continue;
      }
      double lo = INFINITY, hi = -INFINITY;
      if (s->kind == KV_SECTION_K) { /* channel j over the key group holding t */
        uint32_t c0 = t / group * group, c1 = c0 + group < qend ? c0 + group : qend;
        for (uint32_t u = c0; u < c1; u++) {
          lo = fmin(lo, x[(size_t)u * d + j]);
          hi = fmax(hi, x[(size_t)u * d + j]);
        }
      } else { /* token t over the value group holding j */
        uint32_t j0 = j / group * group, j1 = j0 + group < d ? j0 + group : d;
        for (uint32_t u = j0; u < j1; u++) {
          lo = fmin(lo, x[(size_t)t * d + u]);
          hi = fmax(hi, x[(size_t)t * d + u]);
        }
      }
      double scale = (hi - lo + ulp_of(KV_CODEC_F16, lo)) / maxq * (1 + 0x1p-10) + 0x1p-24;
      double mag = fmax(fabs(xv), fabs(yv));
      double tol = scale / 2 * (1 + 1e-9) + ulp_of(KV_CODEC_F32, mag) / 2 +
                   (s->dtype == KV_CODEC_F32 ? 0 : ulp_of(s->dtype, mag) / 2);
      double err = fabs(xv - yv);
      if (err > tol)
        fprintf(stderr, "token %u channel %u: x %.9g decoded %.9g err %.3g > bound %.3g\n", t, j,
                xv, yv, err, tol);
      CHECK(err <= tol);
      worst = fmax(worst, err / tol);
    }
  free(x);
  free(y);
  return worst;
}

static void kivi_case(kv_codec_dtype dt, kv_section_kind kind, uint32_t n, uint32_t d,
                      unsigned bits, unsigned group, unsigned residual, unsigned page,
                      uint64_t seed)
{
  size_t len, enc_len;
  void *x = kvgen_section(dt, kind, seed, n, d, &len);
  kv_section_shape s = shape_of(dt, kind, n, d);
  kv_codec_params p;
  kv_codec_params_init(&p);
  p.bits = bits;
  p.group = group;
  p.residual = residual;
  p.page_tokens = page;
  uint8_t *enc = kt_encode(KV_CODEC_ID_KIVI, &s, x, len, &p, &enc_len);
  CHECK(enc_len == kv_codec_bound(&kv_codec_kivi, &s, &p)); /* kivi sizes are exact */
  kv_section_info info;
  void *dec = kt_decode(enc, enc_len, &info);
  CHECK(info.params.bits == bits && info.params.residual == residual);
  unsigned g = info.params.group;
  double worst = check_bound(&s, x, dec, bits, g, residual);
  if (residual < n && (uint64_t)n * d > 1)
    CHECK(worst > 0.9); /* errors come close to the bound: it is tight, the check has teeth */
  /* deterministic */
  size_t l2;
  uint8_t *enc2 = kt_encode(KV_CODEC_ID_KIVI, &s, x, len, &p, &l2);
  CHECK(l2 == enc_len && memcmp(enc, enc2, l2) == 0);
  free(enc2);
  free(enc);
  free(dec);
  free(x);
}

/* Inputs at the edge of the allowed range (|x| <= 65504): code * scale + zero may round past
 * it; decoding clamps, so nothing becomes inf and the bound holds (it did not before). */
TEST(kivi_extreme_values_finite)
{
  enum { T = 40, D = 24 };
  float f[T * D];
  uint64_t s = 11;
  for (size_t dti = 0; dti < 3; dti++)
    for (int kind = 0; kind < 2; kind++)
      for (unsigned bits = 8; bits >= 2; bits /= 2) {
        kv_codec_dtype dt = dtypes[dti];
        /* the largest magnitude the dtype holds within the range: bf16 rounds 65504 to 65536 */
        float top = dt == KV_CODEC_BF16 ? 65280.0f : 65504.0f;
        for (size_t i = 0; i < T * D; i++) {
          s = s * 6364136223846793005ull + 1442695040888963407ull;
          unsigned r = (unsigned)(s >> 33) % 5;
          f[i] = r == 0 ? top : r == 1 ? -top
                 : (float)((double)(s >> 11) / 9007199254740992.0 * 2.0 * top - top);
        }
        uint8_t src[T * D * 4];
        kv_codec_from_f32(dt, f, T * D, src);
        kv_section_shape sh = shape_of(dt, kind ? KV_SECTION_V : KV_SECTION_K, T, D);
        kv_codec_params p;
        kv_codec_params_init(&p);
        p.bits = bits;
        p.group = 8;
        size_t enc_len;
        uint8_t *enc = kt_encode(KV_CODEC_ID_KIVI, &sh, src, (size_t)T * D * kv_codec_dtype_bytes(dt), &p, &enc_len);
        kv_section_info info;
        void *dec = kt_decode(enc, enc_len, &info);
        float y[T * D];
        kv_codec_to_f32(dt, dec, T * D, y);
        for (size_t i = 0; i < T * D; i++)
          CHECK(isfinite(y[i]) && fabsf(y[i]) <= 65504.0f);
        check_bound(&sh, src, dec, bits, info.params.group, 0);
        free(enc);
        free(dec);
      }
}

TEST(kivi_error_bound)
{
  static const unsigned bitss[] = {8, 4, 2};
  for (size_t i = 0; i < 3; i++)
    for (int kind = 0; kind < 2; kind++)
      for (size_t b = 0; b < 3; b++) {
        kivi_case(dtypes[i], (kv_section_kind)kind, 300, 128, bitss[b], 32, 0, 0, 1 + i + b);
        kivi_case(dtypes[i], (kv_section_kind)kind, 300, 128, bitss[b], 32, 20, 64, 7 + i);
      }
  /* odd shapes and groups: partial chunks, odd channel groups, residual across groups */
  kivi_case(KV_CODEC_F16, KV_SECTION_K, 97, 72, 4, 16, 13, 32, 3);
  kivi_case(KV_CODEC_F16, KV_SECTION_V, 97, 72, 4, 7, 13, 10, 4);
  kivi_case(KV_CODEC_BF16, KV_SECTION_V, 50, 37, 2, 5, 0, 0, 5);
  kivi_case(KV_CODEC_F32, KV_SECTION_K, 33, 130, 8, 33, 1, 0, 6);
  kivi_case(KV_CODEC_F16, KV_SECTION_K, 20, 128, 4, 0, 0, 0, 8);  /* default group clips to 20 */
  kivi_case(KV_CODEC_F16, KV_SECTION_V, 64, 128, 4, 0, 64, 0, 9); /* every row residual */
  kivi_case(KV_CODEC_F16, KV_SECTION_K, 1, 1, 2, 1, 0, 0, 10);
  kivi_case(KV_CODEC_F16, KV_SECTION_V, 128, 128, 4, 128, 0, 1, 11); /* one row per group */
}

TEST(kivi_sizes)
{
  size_t len, n;
  void *x = kvgen_section(KV_CODEC_F16, KV_SECTION_K, 1, 256, 128, &len);
  kv_section_shape s = shape_of(KV_CODEC_F16, KV_SECTION_K, 256, 128);
  kv_codec_params p;
  kv_codec_params_init(&p);
  p.bits = 4;
  /* default G for K: 16 rows reach 4 KiB, rounded up to the 32-token key group: 8 groups,
   * each 1 chunk x 128 scales and zeros + 32 rows x 64 code bytes */
  uint8_t *enc = kt_encode(KV_CODEC_ID_KIVI, &s, x, len, &p, &n);
  CHECK(n == 32 + 8 * 4 + 8 * (128 * 4 + 32 * 64));
  free(enc);
  p.bits = 2;
  p.residual = 10;
  enc = kt_encode(KV_CODEC_ID_KIVI, &s, x, len, &p, &n);
  /* last group: 22 quantized rows in 1 chunk, 10 raw rows */
  CHECK(n == 32 + 32 + 7 * (128 * 4 + 32 * 32) + (128 * 4 + 22 * 32 + 10 * 256));
  free(enc);
  s.kind = KV_SECTION_V;
  p.bits = 8;
  p.residual = 0;
  p.group = 32;
  enc = kt_encode(KV_CODEC_ID_KIVI, &s, x, len, &p, &n);
  /* V: G = 16 rows, 16 groups; per row 4 scales + 4 zeros + 128 code bytes */
  CHECK(n == 32 + 16 * 4 + 256 * (4 * 4 + 128));
  free(enc);
  free(x);
}

TEST(kivi_constant_rows_exact)
{
  /* an f16 unit whose values are all equal decodes exactly (scale 0, zero = the value) */
  uint16_t x[64 * 16];
  for (int i = 0; i < 64 * 16; i++)
    x[i] = kv_codec_f32_to_f16(0.1f * (float)(i % 16) - 0.7f); /* constant per channel */
  kv_section_shape s = shape_of(KV_CODEC_F16, KV_SECTION_K, 64, 16);
  kv_codec_params p;
  kv_codec_params_init(&p);
  p.bits = 2;
  size_t n;
  uint8_t *enc = kt_encode(KV_CODEC_ID_KIVI, &s, x, sizeof x, &p, &n);
  kv_section_info info;
  uint16_t *y = kt_decode(enc, n, &info);
  CHECK(memcmp(x, y, sizeof x) == 0);
  free(enc);
  free(y);
}

TEST(kivi_config_errors)
{
  kv_codec_err e = {0};
  size_t len;
  void *x = kvgen_section(KV_CODEC_F16, KV_SECTION_K, 1, 40, 64, &len);
  kv_section_shape s = shape_of(KV_CODEC_F16, KV_SECTION_K, 40, 64);
  const kv_codec *c = &kv_codec_kivi;
  uint8_t *dst = kt_xmalloc(1 << 16), *scratch = kt_xmalloc(1 << 16);
  size_t n;
  kv_codec_params p;
  kv_codec_params_init(&p);
  CHECK_RC(KV_CODEC_EINVAL, e, kv_codec_encode(c, &s, x, len, &p, scratch, 1 << 16, dst, 1 << 16, &n, &e));
  CHECK(kt_msg_has(&e, "bits must be 8, 4 or 2"));
  p.bits = 3;
  CHECK_RC(KV_CODEC_EINVAL, e, kv_codec_encode(c, &s, x, len, &p, scratch, 1 << 16, dst, 1 << 16, &n, &e));
  p.bits = 4;
  p.group = 64; /* larger than the 40 tokens */
  CHECK_RC(KV_CODEC_EINVAL, e, kv_codec_encode(c, &s, x, len, &p, scratch, 1 << 16, dst, 1 << 16, &n, &e));
  CHECK(kt_msg_has(&e, "quantization group larger than the tokens (value 64, limit 40)"));
  CHECK(kv_codec_bound(c, &s, &p) == 0);
  kv_section_shape v = s;
  v.kind = KV_SECTION_V;
  p.group = 65; /* larger than head_dim 64 */
  CHECK_RC(KV_CODEC_EINVAL, e, kv_codec_encode(c, &v, x, len, &p, scratch, 1 << 16, dst, 1 << 16, &n, &e));
  CHECK(kt_msg_has(&e, "larger than head_dim"));
  p.group = 16;
  p.page_tokens = 24; /* not a multiple of the key group */
  CHECK_RC(KV_CODEC_EINVAL, e, kv_codec_encode(c, &s, x, len, &p, scratch, 1 << 16, dst, 1 << 16, &n, &e));
  CHECK(kt_msg_has(&e, "multiple of the key group"));
  CHECK_OK(e, kv_codec_encode(c, &v, x, len, &p, scratch, 1 << 16, dst, 1 << 16, &n, &e)); /* V: fine */
  p.page_tokens = 0;
  p.residual = 41;
  CHECK_RC(KV_CODEC_EINVAL, e, kv_codec_encode(c, &s, x, len, &p, scratch, 1 << 16, dst, 1 << 16, &n, &e));
  p.residual = 0;
  p.zstd_level = 1;
  CHECK_RC(KV_CODEC_EINVAL, e, kv_codec_encode(c, &s, x, len, &p, scratch, 1 << 16, dst, 1 << 16, &n, &e));
  p.zstd_level = 0;
  size_t need = kv_codec_scratch_bytes(c, &s, &p, KV_CODEC_OP_ENCODE);
  CHECK_RC(KV_CODEC_ENOMEM, e, kv_codec_encode(c, &s, x, len, &p, scratch, need - 1, dst, 1 << 16, &n, &e));
  size_t bound = kv_codec_bound(c, &s, &p);
  CHECK_RC(KV_CODEC_ETOOSMALL, e, kv_codec_encode(c, &s, x, len, &p, scratch, need, dst, bound - 1, &n, &e));
  CHECK(e.limit == bound);
  CHECK_OK(e, kv_codec_encode(c, &s, x, len, &p, scratch, need, dst, bound, &n, &e));
  CHECK(n == bound);

  /* values quantization cannot take: non-finite, or beyond the fp16 zero point's range */
  float f[40 * 64];
  kv_codec_to_f32(KV_CODEC_F16, x, 40 * 64, f);
  kv_section_shape s32 = shape_of(KV_CODEC_F32, KV_SECTION_K, 40, 64);
  f[5 * 64 + 3] = NAN;
  CHECK_RC(KV_CODEC_EINVAL, e, kv_codec_encode(c, &s32, f, sizeof f, &p, scratch, 1 << 16, dst, 1 << 16, &n, &e));
  CHECK(kt_msg_has(&e, "not finite") && e.value == 5 && e.limit == 3);
  f[5 * 64 + 3] = 70000.0f;
  CHECK_RC(KV_CODEC_EINVAL, e, kv_codec_encode(c, &s32, f, sizeof f, &p, scratch, 1 << 16, dst, 1 << 16, &n, &e));
  f[5 * 64 + 3] = -65504.0f; /* the edge of the range is fine */
  CHECK_OK(e, kv_codec_encode(c, &s32, f, sizeof f, &p, scratch, 1 << 16, dst, 1 << 16, &n, &e));
  free(dst);
  free(scratch);
  free(x);
}

TEST(kivi_corrupt_rejected)
{
  kv_codec_err e = {0};
  size_t len, n;
  void *x = kvgen_section(KV_CODEC_F16, KV_SECTION_K, 2, 100, 32, &len);
  kv_section_shape s = shape_of(KV_CODEC_F16, KV_SECTION_K, 100, 32);
  kv_codec_params p;
  kv_codec_params_init(&p);
  p.bits = 4;
  p.residual = 5;
  uint8_t *enc = kt_encode(KV_CODEC_ID_KIVI, &s, x, len, &p, &n);
  uint8_t *b = kt_xmalloc(n);
  for (size_t cut = 0; cut < n; cut++)
    CHECK_RC(KV_CODEC_ECORRUPT, e, kt_try_decode(enc, cut, &e));
  static const struct {
    size_t off;
    uint8_t val;
    const char *msg;
  } edits[] = {
    {20, 3, "bits"},      {20, 0, "bits must be"}, {22, 0, "quantization group"},
    {22, 200, "larger than the tokens"}, {24, 101, "residual"}, {21, 1, "drop method"},
    {28, 1, "keep_permille"}, {16, 33, "multiple of the key group"},
  };
  for (size_t i = 0; i < sizeof edits / sizeof edits[0]; i++) {
    memcpy(b, enc, n);
    b[edits[i].off] = edits[i].val;
    CHECK_RC(KV_CODEC_ECORRUPT, e, kt_try_decode(b, n, &e));
    if (!kt_msg_has(&e, edits[i].msg)) {
      char m[256];
      kv_codec_errmsg(&e, m, sizeof m);
      fprintf(stderr, "edit %zu: %s\n", i, m);
    }
    CHECK(kt_msg_has(&e, edits[i].msg));
  }
  /* a group length one off */
  memcpy(b, enc, n);
  kv_codec_put_le32(b + 32, kv_codec_get_le32(b + 32) + 1);
  CHECK_RC(KV_CODEC_ECORRUPT, e, kt_try_decode(b, n, &e));
  CHECK(kt_msg_has(&e, "quantized group length"));
  /* the raw and kivi decoders refuse each other's sections */
  kv_section_info info;
  CHECK_OK(e, kv_section_parse(enc, n, &info, &e));
  uint8_t *out = kt_xmalloc(len), *scr = kt_xmalloc(1 << 16);
  CHECK_RC(KV_CODEC_ECORRUPT, e, kv_codec_raw.decode(enc, n, enc + info.header_bytes,
                                                     n - info.header_bytes, 0, info.n_groups, scr,
                                                     1 << 16, out, len, &e));
  CHECK(kt_msg_has(&e, "another codec"));
  /* random damage: an error or a decode, never a crash */
  kvgen_rng r = {77};
  for (int i = 0; i < 3000; i++) {
    memcpy(b, enc, n);
    b[kvgen_next(&r) % n] ^= (uint8_t)(1u << (kvgen_next(&r) % 8));
    kv_codec_status rc = kt_try_decode(b, n, &e);
    CHECK(rc == KV_CODEC_OK || rc == KV_CODEC_ECORRUPT);
  }
  free(out);
  free(scr);
  free(b);
  free(enc);
  free(x);
}

TEST(kivi_partial_groups)
{
  kv_codec_err e = {0};
  size_t len, n;
  void *x = kvgen_section(KV_CODEC_BF16, KV_SECTION_K, 3, 300, 64, &len);
  kv_section_shape s = shape_of(KV_CODEC_BF16, KV_SECTION_K, 300, 64);
  kv_codec_params p;
  kv_codec_params_init(&p);
  p.bits = 4;
  p.residual = 30;
  p.page_tokens = 64;
  uint8_t *enc = kt_encode(KV_CODEC_ID_KIVI, &s, x, len, &p, &n);
  kv_section_info info;
  uint8_t *all = kt_decode(enc, n, &info);
  size_t scr = kv_section_scratch_bytes(&info);
  void *scratch = kt_xmalloc(scr);
  uint8_t *part = kt_xmalloc(len);
  for (uint32_t g = 0; g < info.n_groups; g++) {
    uint64_t off, glen;
    CHECK_OK(e, kv_section_group_span(enc, n, g, g + 1, &off, &glen, &e));
    size_t out = kv_section_rows_bytes(&info, g, g + 1);
    CHECK_OK(e, kv_section_decode_groups(enc, info.header_bytes, enc + off, glen, g, g + 1,
                                         scratch, scr, part, out, &e));
    CHECK(memcmp(part, all + (size_t)g * 64 * 128, out) == 0);
  }
  free(scratch);
  free(part);
  free(all);
  free(enc);
  free(x);
}

/* ---- SIMD and portable decoders agree bit for bit ---------------------------------------------- */

#if HAVE_X86
__attribute__((target("f16c"))) static uint16_t hw_f32_to_f16(float f)
{
  return (uint16_t)_mm_extract_epi16(_mm_cvtps_ph(_mm_set_ss(f), _MM_FROUND_TO_NEAREST_INT), 0);
}
#endif

TEST(f16_rounding_matches_f16c)
{
#if HAVE_X86
  if (!kv_quant_simd_available()) {
    printf("  (no AVX2/F16C on this CPU: skipped)\n");
    return;
  }
  kvgen_rng r = {3};
  for (int i = 0; i < 1000000; i++) {
    uint32_t bits = (uint32_t)kvgen_next(&r);
    if (i & 1)
      bits = (bits & 0x80ffffffu) | ((uint32_t)(98 + (bits >> 24) % 46) << 23);
    float f;
    memcpy(&f, &bits, 4);
    CHECK(kv_codec_f32_to_f16(f) == hw_f32_to_f16(f));
  }
  for (uint32_t h = 0; h < 0x7bff; h++) {
    float mid = (kv_codec_f16_to_f32((uint16_t)h) + kv_codec_f16_to_f32((uint16_t)(h + 1))) / 2;
    CHECK(kv_codec_f32_to_f16(mid) == hw_f32_to_f16(mid));
  }
#else
  printf("  (not x86: skipped)\n");
#endif
}

TEST(simd_and_portable_identical)
{
  if (!kv_quant_simd_available())
    printf("  (no AVX2/F16C: both runs take the portable path)\n");
  static const unsigned bitss[] = {8, 4, 2};
  static const uint32_t dims[] = {128, 72, 37, 16, 100};
  for (size_t i = 0; i < 3; i++)
    for (int kind = 0; kind < 2; kind++)
      for (size_t b = 0; b < 3; b++)
        for (size_t k = 0; k < sizeof dims / sizeof dims[0]; k++) {
          uint32_t n = 150, d = dims[k];
          float *f = kt_xmalloc(sizeof(float) * n * d);
          kvgen_gauss(i * 100 + b * 10 + k, (size_t)n * d, 1.0f, f);
          for (size_t u = 0; u < (size_t)n * d; u += 3) /* tiny values: subnormal outputs */
            f[u] *= 1e-6f;
          size_t es = kv_codec_dtype_bytes(dtypes[i]), len = (size_t)n * d * es, enc_len;
          void *x = kt_xmalloc(len);
          kv_codec_from_f32(dtypes[i], f, (size_t)n * d, x);
          kv_section_shape s = shape_of(dtypes[i], (kv_section_kind)kind, n, d);
          kv_codec_params p;
          kv_codec_params_init(&p);
          p.bits = bitss[b];
          p.group = kind == KV_SECTION_V ? (k % 2 ? 8 : 32) : 16;
          p.page_tokens = 48;
          uint8_t *enc = kt_encode(KV_CODEC_ID_KIVI, &s, x, len, &p, &enc_len);
          kv_section_info info;
          kv_codec_err e = {0};
          CHECK_OK(e, kv_section_parse(enc, enc_len, &info, &e));
          uint8_t *a = kt_xmalloc(len), *c = kt_xmalloc(len);
          uint8_t *st = aligned_alloc(64, (len + 64) / 64 * 64 + 64); /* streaming stores */
          CHECK(st != NULL);
          float *ws = kt_xmalloc(kv_quant_scratch_bytes(d));
          for (uint32_t g = 0; g < info.n_groups; g++) {
            uint64_t off, glen;
            CHECK_OK(e, kv_section_group_span(enc, enc_len, g, g + 1, &off, &glen, &e));
            size_t o = (size_t)g * 48 * d * es;
            kv_quant_decode_group(&info, g, enc + off, ws, a + o, 1);
            kv_quant_decode_group(&info, g, enc + off, ws, c + o, 0);
            kv_quant_decode_group(&info, g, enc + off, ws, st + o, 2);
          }
          kv_quant_stream_fence();
          CHECK(memcmp(a, c, len) == 0);
          CHECK(memcmp(a, st, len) == 0);
          free(ws);
          free(a);
          free(c);
          free(st);
          free(enc);
          free(x);
          free(f);
        }
}

/*
 * Head dims that are not multiples of 16 (the AVX2 kernels' blocks of 8, the head_dim-8
 * kernels of tiny models, and the portable tails): SIMD and portable decoding give the same
 * bits, for K and V, every bits and dtype, V groups of one pair per row and smaller, and row
 * counts that leave partial chunks of the 8-row V kernel.
 */
TEST(simd_and_portable_identical_small_heads)
{
  static const unsigned bitss[] = {8, 4, 2};
  static const uint32_t dims[] = {8, 24, 40, 12, 4, 2, 1};
  static const uint32_t rows[] = {333, 45};
  for (size_t i = 0; i < 3; i++)
    for (int kind = 0; kind < 2; kind++)
      for (size_t b = 0; b < 3; b++)
        for (size_t k = 0; k < sizeof dims / sizeof dims[0]; k++)
          for (size_t v = 0; v < 3; v++) {
            uint32_t n = rows[v % 2], d = dims[k];
            float *f = kt_xmalloc(sizeof(float) * n * d);
            kvgen_gauss(i * 1000 + b * 100 + k * 10 + v, (size_t)n * d, 3.0f, f);
            for (size_t u = 0; u < (size_t)n * d; u += 5)
              f[u] *= 1e-6f;
            size_t es = kv_codec_dtype_bytes(dtypes[i]), len = (size_t)n * d * es, enc_len;
            void *x = kt_xmalloc(len);
            kv_codec_from_f32(dtypes[i], f, (size_t)n * d, x);
            kv_section_shape s = shape_of(dtypes[i], (kv_section_kind)kind, n, d);
            kv_codec_params p;
            kv_codec_params_init(&p);
            p.bits = bitss[b];
            if (kind == KV_SECTION_V) /* one pair per row, 8 channels, 4 channels */
              p.group = v == 0 ? d : (v == 1 ? (d < 8 ? d : 8) : (d < 4 ? d : 4));
            else
              p.group = v == 2 ? 16 : 32;
            p.residual = v == 1 ? 5 : 0;
            uint8_t *enc = kt_encode(KV_CODEC_ID_KIVI, &s, x, len, &p, &enc_len);
            kv_section_info info;
            kv_codec_err e = {0};
            CHECK_OK(e, kv_section_parse(enc, enc_len, &info, &e));
            uint8_t *a = kt_xmalloc(len), *c = kt_xmalloc(len);
            /* streaming stores: 64-aligned, and shifted by one element (ordinary stores then) */
            uint8_t *st = aligned_alloc(64, (len + 64) / 64 * 64 + 64);
            CHECK(st != NULL);
            float *ws = kt_xmalloc(kv_quant_scratch_bytes(d));
            size_t o = 0, sh = v == 2 ? es : 0;
            for (uint32_t g = 0; g < info.n_groups; g++) {
              uint64_t off, glen;
              CHECK_OK(e, kv_section_group_span(enc, enc_len, g, g + 1, &off, &glen, &e));
              kv_quant_decode_group(&info, g, enc + off, ws, a + o, 1);
              kv_quant_decode_group(&info, g, enc + off, ws, c + o, 0);
              kv_quant_decode_group(&info, g, enc + off, ws, st + sh + o, 2);
              o += kv_section_rows_bytes(&info, g, g + 1);
            }
            kv_quant_stream_fence();
            CHECK(o == len);
            CHECK(memcmp(a, c, len) == 0);
            CHECK(memcmp(a, st + sh, len) == 0);
            free(st);
            CHECK(check_bound(&s, x, a, p.bits, info.params.group, p.residual) <= 1.0);
            free(ws);
            free(a);
            free(c);
            free(enc);
            free(x);
            free(f);
          }
}

int main(void)
{
  RUN(kivi_error_bound);
  RUN(kivi_extreme_values_finite);
  RUN(kivi_sizes);
  RUN(kivi_constant_rows_exact);
  RUN(kivi_config_errors);
  RUN(kivi_corrupt_rejected);
  RUN(kivi_partial_groups);
  RUN(f16_rounding_matches_f16c);
  RUN(simd_and_portable_identical);
  RUN(simd_and_portable_identical_small_heads);
  printf("%d passed, 0 failed\n", kt_passed);
  return T_EXIT_PASS;
}
