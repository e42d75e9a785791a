/* SPDX-License-Identifier: MIT */
/*
 * tests/unit/test_codec_lossless.c — the registry, the section header, element conversions,
 * and the lossless codecs ("raw", "zstd-planes") with the byte-plane entropy bound.
 */
#include "codec_int.h"
#include "kvgen.h"

#include <math.h>

static const kv_codec_dtype dtypes[] = {KV_CODEC_F16, KV_CODEC_BF16, KV_CODEC_F32};

static kv_section_shape shape_of(kv_codec_dtype dt, kv_section_kind kind, uint32_t n, uint32_t d)
{
  kv_section_shape s = {dt, kind, n, d};
  return s;
}

static void roundtrip_exact(unsigned id, const kv_section_shape *s, const void *src, size_t len,
                            const kv_codec_params *p)
{
  size_t enc_len;
  uint8_t *enc = kt_encode(id, s, src, len, p, &enc_len);
  kv_section_info info;
  void *dec = kt_decode(enc, enc_len, &info);
  CHECK(info.codec_id == id);
  CHECK(info.shape.n_tokens == s->n_tokens && info.shape.head_dim == s->head_dim);
  CHECK(info.shape.dtype == s->dtype && info.shape.kind == s->kind);
  CHECK(info.n_rows == s->n_tokens);
  CHECK(info.section_bytes == enc_len);
  CHECK(memcmp(dec, src, len) == 0);
  free(enc);
  free(dec);
}

/* ---- registry ------------------------------------------------------------------------------- */

TEST(registry_lookup)
{
  static const struct {
    unsigned id;
    const char *name;
    unsigned flags;
  } want[] = {
    {KV_CODEC_ID_RAW, "raw", KV_CODEC_LOSSLESS},
    {KV_CODEC_ID_ZSTD_PLANES, "zstd-planes", KV_CODEC_LOSSLESS},
    {KV_CODEC_ID_KIVI, "kivi", KV_CODEC_LOSSY},
    {KV_CODEC_ID_DROP, "drop", KV_CODEC_LOSSY | KV_CODEC_DROPS_TOKENS},
    {KV_CODEC_ID_KVQUANT, "kvquant", KV_CODEC_LOSSY},
  };
  CHECK(kv_codec_count() == 5);
  for (size_t i = 0; i < 5; i++) {
    const kv_codec *c = kv_codec_by_id(want[i].id);
    CHECK(c != NULL && c->id == want[i].id);
    CHECK(strcmp(c->name, want[i].name) == 0);
    CHECK(c->flags == want[i].flags);
    CHECK(kv_codec_by_name(want[i].name) == c);
    CHECK(kv_codec_at(i) == c);
  }
  CHECK(kv_codec_at(5) == NULL);
  CHECK(kv_codec_by_id(0) == NULL && kv_codec_by_id(6) == NULL && kv_codec_by_id(255) == NULL);
  CHECK(kv_codec_by_name("zstd") == NULL && kv_codec_by_name("") == NULL);
  CHECK(kv_codec_by_name(NULL) == NULL);
  CHECK(kv_codec_dtype_bytes(KV_CODEC_F16) == 2 && kv_codec_dtype_bytes(KV_CODEC_BF16) == 2);
  CHECK(kv_codec_dtype_bytes(KV_CODEC_F32) == 4 && kv_codec_dtype_bytes((kv_codec_dtype)0) == 0);
}

TEST(status_names_and_messages)
{
  CHECK(strcmp(kv_codec_status_name(KV_CODEC_OK), "KV_CODEC_OK") == 0);
  CHECK(strcmp(kv_codec_status_name(KV_CODEC_ECORRUPT), "KV_CODEC_ECORRUPT") == 0);
  CHECK(strcmp(kv_codec_status_name((kv_codec_status)99), "KV_CODEC_UNKNOWN") == 0);
  char buf[256];
  CHECK(kv_codec_errmsg(NULL, buf, sizeof buf) == 2 && strcmp(buf, "ok") == 0);
  kv_codec_err e = {0};
  uint8_t junk[40] = {0};
  junk[0] = 77;
  CHECK_RC(KV_CODEC_ECORRUPT, e, kv_section_parse(junk, sizeof junk, &(kv_section_info){0}, &e));
  size_t n = kv_codec_errmsg(&e, buf, sizeof buf);
  CHECK(n == strlen(buf));
  CHECK(strstr(buf, "corrupt section: unknown codec id (value 77") == buf);
  CHECK(strstr(buf, "codec.c:") != NULL);
  /* a short buffer is cut but terminated, and the full length is reported */
  char small[8];
  CHECK(kv_codec_errmsg(&e, small, sizeof small) == n);
  CHECK(strlen(small) == 7);
}

/* ---- conversions ------------------------------------------------------------------------------ */

/* Reference: nearest f16 by search over the monotonic positive bit patterns, ties to even. */
static uint16_t ref_f32_to_f16(float x)
{
  if (isnan(x))
    return 0x7e00;
  uint16_t sign = signbit(x) ? 0x8000 : 0;
  double a = fabs((double)x);
  if (a >= 65520.0)
    return sign | 0x7c00;
  uint32_t lo = 0, hi = 0x7bff;
  while (lo < hi) { /* largest h with value(h) <= a */
    uint32_t mid = (lo + hi + 1) / 2;
    if ((double)kv_codec_f16_to_f32((uint16_t)mid) <= a)
      lo = mid;
    else
      hi = mid - 1;
  }
  if (lo == 0x7bff)
    return sign | 0x7bff;
  double v0 = kv_codec_f16_to_f32((uint16_t)lo), v1 = kv_codec_f16_to_f32((uint16_t)(lo + 1));
  uint32_t h = (a - v0 < v1 - a) ? lo : (a - v0 > v1 - a) ? lo + 1 : ((lo & 1) ? lo + 1 : lo);
  return (uint16_t)(sign | h);
}

TEST(f16_conversion_exact)
{
  for (uint32_t h = 0; h < 65536; h++) {
    float f = kv_codec_f16_to_f32((uint16_t)h);
    uint16_t back = kv_codec_f32_to_f16(f);
    if ((h & 0x7c00) == 0x7c00 && (h & 0x3ff)) /* NaN: stays NaN, quiet bit set, sign kept */
      CHECK(back == (uint16_t)(h | 0x200));
    else
      CHECK(back == h);
  }
  /* every halfway point between neighbours rounds to the even one */
  for (uint32_t h = 0; h < 0x7bff; h++) {
    float mid = (kv_codec_f16_to_f32((uint16_t)h) + kv_codec_f16_to_f32((uint16_t)(h + 1))) / 2;
    CHECK(kv_codec_f32_to_f16(mid) == ((h & 1) ? h + 1 : h));
    CHECK(kv_codec_f32_to_f16(-mid) == (0x8000 | ((h & 1) ? h + 1 : h)));
  }
  kvgen_rng r = {42};
  for (int i = 0; i < 300000; i++) {
    uint32_t bits = (uint32_t)kvgen_next(&r);
    if (i % 3 == 0) /* concentrate on the f16 range */
      bits = (bits & 0x80ffffffu) | ((uint32_t)(100 + (bits >> 24) % 45) << 23);
    float f;
    memcpy(&f, &bits, 4);
    if (isnan(f))
      continue;
    CHECK(kv_codec_f32_to_f16(f) == ref_f32_to_f16(f));
  }
  CHECK(kv_codec_f32_to_f16(65519.0f) == 0x7bff && kv_codec_f32_to_f16(65520.0f) == 0x7c00);
  CHECK(kv_codec_f32_to_f16(INFINITY) == 0x7c00 && kv_codec_f32_to_f16(-INFINITY) == 0xfc00);
  CHECK(kv_codec_f32_to_f16(0x1p-25f) == 0 && kv_codec_f32_to_f16(0x1.8p-25f) == 1);
}

TEST(bf16_conversion_exact)
{
  for (uint32_t h = 0; h < 65536; h++) {
    float f = kv_codec_bf16_to_f32((uint16_t)h);
    uint16_t back = kv_codec_f32_to_bf16(f);
    if ((h & 0x7f80) == 0x7f80 && (h & 0x7f))
      CHECK(back == (uint16_t)(h | 0x40));
    else
      CHECK(back == h);
  }
  kvgen_rng r = {7};
  for (int i = 0; i < 300000; i++) {
    uint32_t bits = (uint32_t)kvgen_next(&r);
    float f;
    memcpy(&f, &bits, 4);
    if (isnan(f))
      continue;
    /* reference in double: the two neighbours by magnitude, ties to even */
    uint32_t mag = bits & 0x7fffffffu;
    uint16_t sign = (uint16_t)((bits >> 16) & 0x8000u), lo = (uint16_t)(mag >> 16), want;
    double a = fabs((double)f), v0 = kv_codec_bf16_to_f32(lo);
    double v1 = lo == 0x7f7f ? ldexp(1.0, 128) : kv_codec_bf16_to_f32((uint16_t)(lo + 1));
    if (mag == 0x7f800000u)
      want = 0x7f80;
    else if (a - v0 < v1 - a)
      want = lo;
    else if (a - v0 > v1 - a)
      want = (uint16_t)(lo + 1);
    else
      want = (lo & 1) ? (uint16_t)(lo + 1) : lo;
    want |= sign;
    CHECK(kv_codec_f32_to_bf16(f) == want);
  }
}

TEST(bulk_conversions)
{
  float f[5] = {0.5f, -2.25f, 1e-6f, 3.0e5f, -0.0f};
  for (size_t i = 0; i < 3; i++) {
    uint8_t buf[20];
    float back[5];
    kv_codec_from_f32(dtypes[i], f, 5, buf);
    kv_codec_to_f32(dtypes[i], buf, 5, back);
    CHECK(back[0] == 0.5f && back[1] == -2.25f && signbit(back[4]));
    if (dtypes[i] == KV_CODEC_F16)
      CHECK(isinf(back[3]));
    else
      CHECK(fabsf(back[3] - 3.0e5f) <= 3.0e5f / 128);
  }
}

/* ---- raw and zstd-planes round trips ---------------------------------------------------------- */

TEST(raw_roundtrip)
{
  kv_codec_params p;
  kv_codec_params_init(&p);
  for (size_t i = 0; i < 3; i++) {
    size_t len;
    void *k = kvgen_section(dtypes[i], KV_SECTION_K, 1, 300, 128, &len);
    kv_section_shape s = shape_of(dtypes[i], KV_SECTION_K, 300, 128);
    roundtrip_exact(KV_CODEC_ID_RAW, &s, k, len, &p);
    free(k);
  }
  uint8_t one[2] = {0x12, 0x34};
  kv_section_shape s1 = shape_of(KV_CODEC_F16, KV_SECTION_V, 1, 1);
  roundtrip_exact(KV_CODEC_ID_RAW, &s1, one, 2, &p);
  /* the raw payload is the little-endian elements after the header */
  size_t n;
  uint8_t *enc = kt_encode(KV_CODEC_ID_RAW, &s1, one, 2, &p, &n);
  CHECK(n == KV_SECTION_FIXED_BYTES + 4 + 2);
  uint16_t v;
  memcpy(&v, one, 2);
  CHECK(enc[36] == (v & 0xff) && enc[37] == (v >> 8));
  free(enc);
}

TEST(zstd_roundtrip_kv_data)
{
  static const struct {
    uint32_t n, d;
    unsigned page;
    int level;
  } cases[] = {
    {1, 1, 0, 0},      {1, 128, 0, 3},   {1000, 128, 0, 1}, {257, 72, 0, 19},
    {100, 3, 7, 0},    {64, 128, 1, -7}, {130, 64, 64, 5},  {40, 130, 40, 2},
  };
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
    for (size_t i = 0; i < 3; i++)
      for (int kind = 0; kind < 2; kind++) {
        size_t len;
        void *x = kvgen_section(dtypes[i], (kv_section_kind)kind, c * 10 + i, cases[c].n,
                                cases[c].d, &len);
        kv_section_shape s = shape_of(dtypes[i], (kv_section_kind)kind, cases[c].n, cases[c].d);
        kv_codec_params p;
        kv_codec_params_init(&p);
        p.page_tokens = cases[c].page;
        p.zstd_level = cases[c].level;
        roundtrip_exact(KV_CODEC_ID_ZSTD_PLANES, &s, x, len, &p);
        free(x);
      }
}

TEST(zstd_roundtrip_any_bits)
{
  /* arbitrary bit patterns, NaN payloads and infinities included, come back bit for bit */
  for (size_t i = 0; i < 3; i++) {
    size_t es = kv_codec_dtype_bytes(dtypes[i]), len = 333 * 17 * es;
    uint8_t *x = kt_xmalloc(len);
    kvgen_bytes(99 + i, len, x);
    for (size_t j = 0; j < len / es; j += 5) /* make every fifth element a NaN or inf */
      if (es == 2) {
        uint16_t h = (uint16_t)(dtypes[i] == KV_CODEC_F16 ? 0x7c00 | (j & 0x3ff) : 0x7f80 | (j & 0x7f));
        memcpy(x + 2 * j, &h, 2);
      } else {
        uint32_t w = 0x7f800000u | (uint32_t)j;
        memcpy(x + 4 * j, &w, 4);
      }
    kv_section_shape s = shape_of(dtypes[i], KV_SECTION_V, 333, 17);
    kv_codec_params p;
    kv_codec_params_init(&p);
    roundtrip_exact(KV_CODEC_ID_ZSTD_PLANES, &s, x, len, &p);
    roundtrip_exact(KV_CODEC_ID_RAW, &s, x, len, &p);
    free(x);
  }
}

TEST(zstd_incompressible_planes_stored_raw)
{
  size_t len = 256 * 64 * 2;
  uint8_t *x = kt_xmalloc(len);
  kvgen_bytes(5, len, x);
  kv_section_shape s = shape_of(KV_CODEC_F16, KV_SECTION_K, 256, 64);
  kv_codec_params p;
  kv_codec_params_init(&p);
  size_t n;
  uint8_t *enc = kt_encode(KV_CODEC_ID_ZSTD_PLANES, &s, x, len, &p, &n);
  kv_section_info info;
  kv_codec_err e = {0};
  CHECK_OK(e, kv_section_parse(enc, n, &info, &e));
  CHECK(n == kv_codec_bound(&kv_codec_zstd_planes, &s, &p)); /* every plane raw */
  uint64_t off, glen;
  for (uint32_t g = 0; g < info.n_groups; g++) {
    CHECK_OK(e, kv_section_group_span(enc, n, g, g + 1, &off, &glen, &e));
    uint32_t plane = kv_codec_group_rows(&info, g) * 64;
    CHECK(kv_codec_get_le32(enc + off) == plane && kv_codec_get_le32(enc + off + 4) == plane);
    CHECK(glen == 8 + 2 * (uint64_t)plane);
  }
  free(enc);
  free(x);
}

TEST(zstd_shrinks_and_is_deterministic)
{
  size_t len;
  void *k = kvgen_section(KV_CODEC_F16, KV_SECTION_K, 3, 1024, 128, &len);
  kv_section_shape s = shape_of(KV_CODEC_F16, KV_SECTION_K, 1024, 128);
  kv_codec_params p;
  kv_codec_params_init(&p);
  size_t n1, n2;
  uint8_t *a = kt_encode(KV_CODEC_ID_ZSTD_PLANES, &s, k, len, &p, &n1);
  uint8_t *b = kt_encode(KV_CODEC_ID_ZSTD_PLANES, &s, k, len, &p, &n2);
  CHECK(n1 == n2 && memcmp(a, b, n1) == 0);
  CHECK(n1 < len * 95 / 100); /* the exponent plane shrinks */
  kv_section_info info;
  kv_codec_err e = {0};
  CHECK_OK(e, kv_section_parse(a, n1, &info, &e));
  CHECK(info.params.zstd_level == KV_CODEC_ZSTD_LEVEL_DEFAULT);
  CHECK(info.params.page_tokens == 128 && info.n_groups == 8); /* 128 x 256 B = 32 KiB groups */
  /* all-zero data shrinks to almost nothing */
  memset(k, 0, len);
  free(a);
  a = kt_encode(KV_CODEC_ID_ZSTD_PLANES, &s, k, len, &p, &n1);
  CHECK(n1 < 2048);
  free(a);
  free(b);
  free(k);
}

/* ---- entropy bound --------------------------------------------------------------------------- */

TEST(entropy_bound_known_values)
{
  kv_codec_err e = {0};
  /* high byte constant, low byte uniform over 256 values: 8 bits per element */
  uint16_t x[1024];
  for (int i = 0; i < 1024; i++)
    x[i] = (uint16_t)(0x3c00 | (i & 0xff));
  kv_section_shape s = shape_of(KV_CODEC_F16, KV_SECTION_K, 16, 64);
  double b;
  CHECK_OK(e, kv_lossless_entropy_bound(&s, x, sizeof x, &b, &e));
  CHECK(fabs(b - 1024.0) < 1e-9);
  /* two equally likely low bytes and two equally likely high bytes: 2 bits per element */
  for (int i = 0; i < 1024; i++)
    x[i] = (uint16_t)(((i & 1) ? 0x3c00 : 0x4000) | ((i & 2) ? 1 : 2));
  CHECK_OK(e, kv_lossless_entropy_bound(&s, x, sizeof x, &b, &e));
  CHECK(fabs(b - 256.0) < 1e-9);
  /* constant data: zero */
  float f[64];
  for (int i = 0; i < 64; i++)
    f[i] = 1.5f;
  kv_section_shape s32 = shape_of(KV_CODEC_F32, KV_SECTION_V, 8, 8);
  CHECK_OK(e, kv_lossless_entropy_bound(&s32, f, sizeof f, &b, &e));
  CHECK(b == 0.0);
  CHECK_RC(KV_CODEC_EINVAL, e, kv_lossless_entropy_bound(&s32, f, sizeof f - 4, &b, &e));
  CHECK_RC(KV_CODEC_EINVAL, e, kv_lossless_entropy_bound(&s32, f, sizeof f, NULL, &e));
}

TEST(zstd_planes_near_entropy_bound)
{
  /* the target is lossless_vs_bound >= 0.98 on KV-like f16 */
  for (int kind = 0; kind < 2; kind++) {
    size_t len;
    void *x = kvgen_section(KV_CODEC_F16, (kv_section_kind)kind, 11, 4096, 128, &len);
    kv_section_shape s = shape_of(KV_CODEC_F16, (kv_section_kind)kind, 4096, 128);
    kv_codec_params p;
    kv_codec_params_init(&p);
    size_t n;
    uint8_t *enc = kt_encode(KV_CODEC_ID_ZSTD_PLANES, &s, x, len, &p, &n);
    double bound;
    kv_codec_err e = {0};
    CHECK_OK(e, kv_lossless_entropy_bound(&s, x, len, &bound, &e));
    double vs = ((double)len / n) / ((double)len / bound);
    printf("  %s: ratio %.4f, bound ratio %.4f, lossless_vs_bound %.4f\n", kind ? "V" : "K",
           (double)len / n, (double)len / bound, vs);
    CHECK(vs >= 0.98);
    free(enc);
    free(x);
  }
}

/* ---- partial decoding ------------------------------------------------------------------------ */

static void check_groups(unsigned id, const kv_codec_params *params)
{
  kv_codec_params pp = *params, *p = &pp;
  pp.page_tokens = 64;
  size_t len;
  void *x = kvgen_section(KV_CODEC_BF16, KV_SECTION_K, 21, 500, 96, &len);
  kv_section_shape s = shape_of(KV_CODEC_BF16, KV_SECTION_K, 500, 96);
  size_t n;
  uint8_t *enc = kt_encode(id, &s, x, len, p, &n);
  kv_section_info info;
  kv_codec_err e = {0};
  uint8_t *all = kt_decode(enc, n, &info);
  CHECK(info.n_groups == (500 + 63) / 64);
  size_t scr = kv_section_scratch_bytes(&info), row = 96 * 2;
  void *scratch = kt_xmalloc(scr);
  uint8_t *part = kt_xmalloc(len);
  for (uint32_t g0 = 0; g0 < info.n_groups; g0++)
    for (uint32_t g1 = g0 + 1; g1 <= info.n_groups; g1 += 3) {
      uint64_t off, glen;
      CHECK_OK(e, kv_section_group_span(enc, info.header_bytes, g0, g1, &off, &glen, &e));
      size_t out = kv_section_rows_bytes(&info, g0, g1);
      /* only the header and the groups' bytes are handed over */
      uint8_t *hdr = kt_xmalloc(info.header_bytes), *pl = kt_xmalloc(glen);
      memcpy(hdr, enc, info.header_bytes);
      memcpy(pl, enc + off, glen);
      CHECK_OK(e, kv_section_decode_groups(hdr, info.header_bytes, pl, glen, g0, g1, scratch, scr,
                                           part, out, &e));
      CHECK(memcmp(part, all + (size_t)g0 * 64 * row, out) == 0);
      CHECK_RC(KV_CODEC_ETOOSMALL, e, kv_section_decode_groups(hdr, info.header_bytes, pl, glen,
                                                               g0, g1, scratch, scr, part, out - 1,
                                                               &e));
      CHECK(e.limit == out);
      CHECK_RC(KV_CODEC_ECORRUPT, e, kv_section_decode_groups(hdr, info.header_bytes, pl,
                                                              glen - 1, g0, g1, scratch, scr, part,
                                                              out, &e));
      free(hdr);
      free(pl);
    }
  /* the header size is known from the fixed 32 bytes alone, for reading it before the rest */
  size_t hb;
  CHECK_OK(e, kv_section_header_bytes(enc, KV_SECTION_FIXED_BYTES, &hb, &e));
  CHECK(hb == info.header_bytes && hb == KV_SECTION_FIXED_BYTES + 4 * (size_t)info.n_groups);
  CHECK_RC(KV_CODEC_ECORRUPT, e, kv_section_header_bytes(enc, KV_SECTION_FIXED_BYTES - 1, &hb, &e));
  CHECK_RC(KV_CODEC_EINVAL, e, kv_section_decode_groups(enc, n, enc, 0, 2, 2, scratch, scr, part,
                                                        len, &e));
  CHECK_RC(KV_CODEC_EINVAL, e, kv_section_decode_groups(enc, n, enc, 0, 0, info.n_groups + 1,
                                                        scratch, scr, part, len, &e));
  uint64_t off, glen;
  CHECK_RC(KV_CODEC_EINVAL, e, kv_section_group_span(enc, n, 3, 2, &off, &glen, &e));
  /* rows map to tokens one to one */
  uint32_t pos[5], r;
  CHECK_OK(e, kv_section_positions(enc, n, 100, 5, pos, &e));
  CHECK(pos[0] == 100 && pos[4] == 104);
  CHECK_OK(e, kv_section_row_of_token(enc, n, 499, &r, &e));
  CHECK(r == 499);
  CHECK_RC(KV_CODEC_EINVAL, e, kv_section_row_of_token(enc, n, 500, &r, &e));
  CHECK_RC(KV_CODEC_EINVAL, e, kv_section_positions(enc, n, 498, 5, pos, &e));
  free(scratch);
  free(part);
  free(all);
  free(enc);
  free(x);
}

TEST(partial_decode_groups)
{
  kv_codec_params p;
  kv_codec_params_init(&p);
  check_groups(KV_CODEC_ID_RAW, &p);
  check_groups(KV_CODEC_ID_ZSTD_PLANES, &p);
}

/* ---- argument errors -------------------------------------------------------------------------- */

TEST(encode_argument_errors)
{
  kv_codec_err e = {0};
  size_t len;
  void *x = kvgen_section(KV_CODEC_F16, KV_SECTION_K, 1, 64, 32, &len);
  kv_section_shape s = shape_of(KV_CODEC_F16, KV_SECTION_K, 64, 32);
  kv_codec_params p;
  kv_codec_params_init(&p);
  const kv_codec *z = &kv_codec_zstd_planes;
  size_t bound = kv_codec_bound(z, &s, &p), scr = kv_codec_scratch_bytes(z, &s, &p, KV_CODEC_OP_ENCODE);
  uint8_t *dst = kt_xmalloc(bound), *scratch = kt_xmalloc(scr);
  size_t n;
  CHECK_RC(KV_CODEC_EINVAL, e, kv_codec_encode(z, &s, x, len - 2, &p, scratch, scr, dst, bound, &n, &e));
  CHECK(kt_msg_has(&e, "src_len"));
  CHECK_RC(KV_CODEC_ENOMEM, e, kv_codec_encode(z, &s, x, len, &p, scratch, scr - 100, dst, bound, &n, &e));
  CHECK(e.limit == scr);
  CHECK_RC(KV_CODEC_ENOMEM, e, kv_codec_encode(z, &s, x, len, &p, NULL, 0, dst, bound, &n, &e));
  CHECK_RC(KV_CODEC_ETOOSMALL, e, kv_codec_encode(z, &s, x, len, &p, scratch, scr, dst, 40, &n, &e));
  CHECK_RC(KV_CODEC_ETOOSMALL, e, kv_codec_encode(&kv_codec_raw, &s, x, len, &p, scratch, scr, dst,
                                                  len, &n, &e));
  CHECK(e.limit == len + KV_SECTION_FIXED_BYTES + 4);
  CHECK_RC(KV_CODEC_EINVAL, e, kv_codec_encode(NULL, &s, x, len, &p, scratch, scr, dst, bound, &n, &e));

  kv_section_shape bad = s;
  bad.dtype = (kv_codec_dtype)4;
  CHECK_RC(KV_CODEC_EINVAL, e, kv_codec_encode(z, &bad, x, len, &p, scratch, scr, dst, bound, &n, &e));
  CHECK(kt_msg_has(&e, "unknown dtype"));
  CHECK(kv_codec_bound(z, &bad, &p) == 0 && kv_codec_scratch_bytes(z, &bad, &p, KV_CODEC_OP_DECODE) == 0);
  bad = s;
  bad.n_tokens = 0;
  CHECK_RC(KV_CODEC_EINVAL, e, kv_codec_encode(z, &bad, x, 0, &p, scratch, scr, dst, bound, &n, &e));
  bad = s;
  bad.head_dim = KV_CODEC_MAX_HEAD_DIM + 1;
  CHECK(kv_codec_bound(z, &bad, &p) == 0);
  bad = s;
  bad.kind = (kv_section_kind)2;
  CHECK_RC(KV_CODEC_EINVAL, e, kv_codec_encode(z, &bad, x, len, &p, scratch, scr, dst, bound, &n, &e));

  /* parameters a codec does not use must stay zero */
  kv_codec_params q = p;
  q.bits = 4;
  CHECK_RC(KV_CODEC_EINVAL, e, kv_codec_encode(z, &s, x, len, &q, scratch, scr, dst, bound, &n, &e));
  CHECK(kt_msg_has(&e, "bits set"));
  q = p;
  q.zstd_level = 23;
  CHECK_RC(KV_CODEC_EINVAL, e, kv_codec_encode(z, &s, x, len, &q, scratch, scr, dst, bound, &n, &e));
  q = p;
  q.zstd_level = 3;
  CHECK_RC(KV_CODEC_EINVAL, e, kv_codec_encode(&kv_codec_raw, &s, x, len, &q, scratch, scr, dst,
                                               bound, &n, &e));
  q = p;
  q.page_tokens = KV_CODEC_MAX_PAGE_TOKENS + 1;
  CHECK_RC(KV_CODEC_EINVAL, e, kv_codec_encode(z, &s, x, len, &q, scratch, scr, dst, bound, &n, &e));
  q = p;
  q.keep_permille = 500;
  CHECK_RC(KV_CODEC_EINVAL, e, kv_codec_encode(z, &s, x, len, &q, scratch, scr, dst, bound, &n, &e));
  q = p;
  uint32_t pos[1] = {0};
  q.keep_pos = pos;
  q.n_keep = 1;
  CHECK_RC(KV_CODEC_EINVAL, e, kv_codec_encode(z, &s, x, len, &q, scratch, scr, dst, bound, &n, &e));
  /* a page group may hold at most 1 GiB of raw rows */
  kv_section_shape wide = shape_of(KV_CODEC_F32, KV_SECTION_K, 65536, 65536);
  q = p;
  q.page_tokens = 8192;
  CHECK(kv_codec_bound(z, &wide, &q) == 0);
  free(dst);
  free(scratch);
  free(x);
}

/* ---- corrupt input ---------------------------------------------------------------------------- */

static uint8_t *sample_section(unsigned id, size_t *n)
{
  size_t len;
  void *x = kvgen_section(KV_CODEC_F16, KV_SECTION_V, 8, 150, 64, &len);
  kv_section_shape s = shape_of(KV_CODEC_F16, KV_SECTION_V, 150, 64);
  kv_codec_params p;
  kv_codec_params_init(&p);
  p.page_tokens = 64;
  uint8_t *enc = kt_encode(id, &s, x, len, &p, n);
  free(x);
  return enc;
}

TEST(corrupt_sections_rejected)
{
  kv_codec_err e = {0};
  for (unsigned id = KV_CODEC_ID_RAW; id <= KV_CODEC_ID_ZSTD_PLANES; id++) {
    size_t n;
    uint8_t *enc = sample_section(id, &n);
    uint8_t *b = kt_xmalloc(n + 1);
    CHECK(kt_try_decode(enc, n, &e) == KV_CODEC_OK);

    /* every truncation is rejected */
    for (size_t cut = 0; cut < n; cut++) {
      memcpy(b, enc, cut);
      CHECK_RC(KV_CODEC_ECORRUPT, e, kt_try_decode(b, cut, &e));
    }
    /* a trailing byte too */
    memcpy(b, enc, n);
    b[n] = 0;
    CHECK_RC(KV_CODEC_ECORRUPT, e, kt_try_decode(b, n + 1, &e));
    CHECK(kt_msg_has(&e, "bytes after the last group"));

    static const uint8_t bad_ids[] = {0, 6, 200, 255};
    for (size_t i = 0; i < sizeof bad_ids; i++) {
      memcpy(b, enc, n);
      b[0] = bad_ids[i];
      CHECK_RC(KV_CODEC_ECORRUPT, e, kt_try_decode(b, n, &e));
      CHECK(kt_msg_has(&e, "unknown codec id"));
      CHECK_RC(KV_CODEC_ECORRUPT, e, kv_section_decode_groups(b, n, b, 4, 0, 1, NULL, 0, b, 0, &e));
    }
    memcpy(b, enc, n);
    b[1] = 2;
    CHECK_RC(KV_CODEC_ECORRUPT, e, kt_try_decode(b, n, &e));
    CHECK(kt_msg_has(&e, "version"));
    memcpy(b, enc, n);
    b[3] |= 0x80;
    CHECK_RC(KV_CODEC_ECORRUPT, e, kt_try_decode(b, n, &e));
    memcpy(b, enc, n);
    b[31] = 1;
    CHECK_RC(KV_CODEC_ECORRUPT, e, kt_try_decode(b, n, &e));
    memcpy(b, enc, n);
    b[2] = 9;
    CHECK_RC(KV_CODEC_ECORRUPT, e, kt_try_decode(b, n, &e));
    CHECK(kt_msg_has(&e, "dtype"));
    /* oversized lengths */
    memcpy(b, enc, n);
    kv_codec_put_le32(b + KV_SECTION_FIXED_BYTES, 0x7fffffffu);
    CHECK_RC(KV_CODEC_ECORRUPT, e, kt_try_decode(b, n, &e));
    memcpy(b, enc, n);
    kv_codec_put_le32(b + 4, 0xffffffffu); /* n_tokens */
    CHECK_RC(KV_CODEC_ECORRUPT, e, kt_try_decode(b, n, &e));
    memcpy(b, enc, n);
    kv_codec_put_le32(b + 8, 1u << 20); /* head_dim */
    CHECK_RC(KV_CODEC_ECORRUPT, e, kt_try_decode(b, n, &e));
    memcpy(b, enc, n);
    kv_codec_put_le32(b + 12, 149); /* n_rows != n_tokens */
    CHECK_RC(KV_CODEC_ECORRUPT, e, kt_try_decode(b, n, &e));
    memcpy(b, enc, n);
    kv_codec_put_le32(b + 16, 0); /* page_tokens */
    CHECK_RC(KV_CODEC_ECORRUPT, e, kt_try_decode(b, n, &e));
    memcpy(b, enc, n);
    b[20] = 4; /* bits on a lossless codec */
    CHECK_RC(KV_CODEC_ECORRUPT, e, kt_try_decode(b, n, &e));
    memcpy(b, enc, n);
    b[30] = (uint8_t)(id == KV_CODEC_ID_RAW ? 3 : 0); /* level on raw / none on zstd */
    CHECK_RC(KV_CODEC_ECORRUPT, e, kt_try_decode(b, n, &e));
    free(b);
    free(enc);
  }
}

TEST(corrupt_zstd_planes_payload)
{
  kv_codec_err e = {0};
  size_t n;
  uint8_t *enc = sample_section(KV_CODEC_ID_ZSTD_PLANES, &n);
  kv_section_info info;
  CHECK_OK(e, kv_section_parse(enc, n, &info, &e));
  uint8_t *b = kt_xmalloc(n);
  size_t g0 = info.header_bytes;
  uint32_t l0 = kv_codec_get_le32(enc + g0), l1 = kv_codec_get_le32(enc + g0 + 4);
  CHECK(l0 == 64 * 64 && l1 < 64 * 64); /* low byte raw, high byte zstd */
  /* plane length larger than the plane */
  memcpy(b, enc, n);
  kv_codec_put_le32(b + g0, 64 * 64 + 1);
  CHECK_RC(KV_CODEC_ECORRUPT, e, kt_try_decode(b, n, &e));
  /* plane lengths not adding up to the group */
  memcpy(b, enc, n);
  kv_codec_put_le32(b + g0 + 4, l1 - 1);
  CHECK_RC(KV_CODEC_ECORRUPT, e, kt_try_decode(b, n, &e));
  CHECK(kt_msg_has(&e, "add up"));
  /* a zstd frame damaged in its header */
  memcpy(b, enc, n);
  b[g0 + 8 + l0] ^= 0xff; /* first byte of the zstd magic */
  CHECK_RC(KV_CODEC_ECORRUPT, e, kt_try_decode(b, n, &e));
  CHECK(kt_msg_has(&e, "zstd frame"));
  /* random damage anywhere: an error or a decode, never a crash (run under ASan/valgrind) */
  kvgen_rng r = {1234};
  for (int i = 0; i < 3000; i++) {
    memcpy(b, enc, n);
    for (int k = 0; k < 1 + i % 4; k++)
      b[kvgen_next(&r) % n] ^= (uint8_t)(1u << (kvgen_next(&r) % 8));
    kv_codec_status rc = kt_try_decode(b, n, &e);
    CHECK(rc == KV_CODEC_OK || rc == KV_CODEC_ECORRUPT);
  }
  free(b);
  free(enc);
}

/*
 * A kv_codec_dctx gives the same bytes and statuses as decoding without one, for every codec
 * and for group ranges; it survives a failed decode (a damaged zstd frame) and stays usable;
 * init refuses NULL and short memory and aligns memory itself.
 */
TEST(decoding_context)
{
  kv_codec_err e = {0};
  CHECK(kv_codec_dctx_bytes() > 64);
  CHECK(kv_codec_dctx_init(NULL, kv_codec_dctx_bytes()) == NULL);
  uint8_t *mem = kt_xmalloc(kv_codec_dctx_bytes() + 1);
  CHECK(kv_codec_dctx_init(mem, kv_codec_dctx_bytes() - 1) == NULL);
  kv_codec_dctx *ctx = kv_codec_dctx_init(mem + 1, kv_codec_dctx_bytes()); /* odd address */
  CHECK(ctx != NULL);
  for (unsigned id = KV_CODEC_ID_RAW; id <= KV_CODEC_ID_KIVI; id++)
    for (int kind = 0; kind < 2; kind++) {
      size_t len, n;
      /* 600 x 64 f16 = 75 KiB: large enough for the streaming stores (KV_CODEC_STREAM_MIN_BYTES) */
      void *x = kvgen_section(KV_CODEC_F16, (kv_section_kind)kind, 40 + id, 600, 64, &len);
      kv_section_shape s = shape_of(KV_CODEC_F16, (kv_section_kind)kind, 600, 64);
      kv_codec_params p;
      kv_codec_params_init(&p);
      p.page_tokens = 64;
      if (id == KV_CODEC_ID_KIVI)
        p.bits = 4;
      uint8_t *enc = kt_encode(id, &s, x, len, &p, &n);
      kv_section_info info;
      CHECK_OK(e, kv_section_parse(enc, n, &info, &e));
      size_t scr = kv_section_scratch_bytes(&info);
      uint8_t *a = kt_decode(enc, n, &info), *b = kt_xmalloc(len), *scratch = kt_xmalloc(scr);
      CHECK_OK(e, kv_section_decode_dctx(ctx, enc, n, scratch, scr, b, len, NULL, &e));
      CHECK(memcmp(a, b, len) == 0);
      kv_codec_dctx_set_stream(ctx, 1); /* streaming stores: the same bytes */
      CHECK(len >= KV_CODEC_STREAM_MIN_BYTES && kv_codec_stream_call(ctx, len));
      CHECK(!kv_codec_stream_call(ctx, KV_CODEC_STREAM_MIN_BYTES - 1));
      memset(b, 0, len);
      CHECK_OK(e, kv_section_decode_dctx(ctx, enc, n, scratch, scr, b, len, NULL, &e));
      CHECK(memcmp(a, b, len) == 0);
      kv_codec_dctx_set_stream(ctx, 0);
      if (id != KV_CODEC_ID_KIVI)
        CHECK(memcmp(a, x, len) == 0);
      /* groups 1..2 through the context, from the header and their own payload */
      uint64_t off, glen;
      CHECK_OK(e, kv_section_group_span(enc, n, 1, 3, &off, &glen, &e));
      size_t rb = kv_section_rows_bytes(&info, 1, 3), at = kv_section_rows_bytes(&info, 0, 1);
      memset(b, 0, len);
      CHECK_OK(e, kv_section_decode_groups_dctx(ctx, enc, info.header_bytes, enc + off, glen, 1, 3,
                                                scratch, scr, b, rb, &e));
      CHECK(memcmp(a + at, b, rb) == 0);
      CHECK_RC(KV_CODEC_ETOOSMALL, e, kv_section_decode_groups_dctx(ctx, enc, info.header_bytes,
                                                                    enc + off, glen, 1, 3, scratch,
                                                                    scr, b, rb - 1, &e));
      CHECK_RC(KV_CODEC_ECORRUPT, e, kv_section_decode_dctx(ctx, enc, n - 1, scratch, scr, b, len,
                                                            NULL, &e));
      if (id == KV_CODEC_ID_ZSTD_PLANES) {
        /* damage the high plane's frame of group 0: an error, then the context still works */
        uint8_t *bad = kt_xmalloc(n);
        memcpy(bad, enc, n);
        size_t g0 = info.header_bytes;
        uint32_t l0 = kv_codec_get_le32(bad + g0), l1 = kv_codec_get_le32(bad + g0 + 4);
        CHECK(l1 < l0 || l0 < 64 * 64);
        size_t frame = g0 + 8 + (l0 < 64 * 64 ? 0 : l0); /* a compressed plane */
        bad[frame + 7] ^= 0x5a;
        bad[frame + 12] ^= 0xa5;
        kv_codec_status rc = kv_section_decode_dctx(ctx, bad, n, scratch, scr, b, len, NULL, &e);
        CHECK(rc == KV_CODEC_ECORRUPT || rc == KV_CODEC_OK);
        CHECK(kv_section_decode(bad, n, scratch, scr, a, len, NULL, &e) == rc);
        CHECK_OK(e, kv_section_decode_dctx(ctx, enc, n, scratch, scr, b, len, NULL, &e));
        CHECK(memcmp(b, x, len) == 0);
        free(bad);
      }
      free(scratch);
      free(a);
      free(b);
      free(enc);
      free(x);
    }
  free(mem);
}

int main(void)
{
  RUN(registry_lookup);
  RUN(status_names_and_messages);
  RUN(f16_conversion_exact);
  RUN(bf16_conversion_exact);
  RUN(bulk_conversions);
  RUN(raw_roundtrip);
  RUN(zstd_roundtrip_kv_data);
  RUN(zstd_roundtrip_any_bits);
  RUN(zstd_incompressible_planes_stored_raw);
  RUN(zstd_shrinks_and_is_deterministic);
  RUN(entropy_bound_known_values);
  RUN(zstd_planes_near_entropy_bound);
  RUN(partial_decode_groups);
  RUN(encode_argument_errors);
  RUN(corrupt_sections_rejected);
  RUN(corrupt_zstd_planes_payload);
  RUN(decoding_context);
  printf("%d passed, 0 failed\n", kt_passed);
  return T_EXIT_PASS;
}
