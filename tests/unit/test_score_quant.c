/* SPDX-License-Identifier: MIT */
/*
 * tests/unit/test_score_quant.c — score: quantization error bounds (int8, int4; f32, f16,
 * bf16 keys), the score copy layout (page grouping, offsets, sizes), encode/parse round trips,
 * the parser's rejection of every malformed header field, and bad arguments everywhere (k = 0,
 * k > N, NULL, misaligned buffers and sizes, shapes out of range) with the message naming it.
 */
#define _POSIX_C_SOURCE 200809L
#include "score_test.h"

#include <math.h>

/* ---- quantization ------------------------------------------------------------------------ */

static void fill_row(t_rng *r, float *x, uint32_t d, int kind)
{
  double mag = kind == 0 ? 1.0 : kind == 1 ? 1e-3 : kind == 2 ? 300.0 : 1e-6;
  for (uint32_t j = 0; j < d; j++)
    x[j] = (float)(t_gauss(r) * mag);
  if (kind == 4) /* one outlier channel */
    x[d / 2] = 120.0f;
  if (kind == 5) /* f16 subnormal range */
    for (uint32_t j = 0; j < d; j++)
      x[j] = (float)(t_gauss(r) * 3e-6);
}

static void check_bound(const float *x, uint32_t d, unsigned bits, const uint8_t *codes,
                        float s, const char *what)
{
  int Q = bits == 8 ? 127 : 7;
  double amax = 0;
  for (uint32_t j = 0; j < d; j++)
    amax = fmax(amax, fabs((double)x[j]));
  if (amax == 0) {
    CHECK(s == 0.0f, "%s: zero row has scale %g", what, (double)s);
  } else {
    double ideal = amax / Q;
    CHECK((double)s >= ideal && (double)s <= ideal * (1 + 0x1p-23) + 0x1p-149,
          "%s: scale %.9g not in [amax/Q, amax/Q (1 + 2^-23)] with amax/Q = %.9g", what, (double)s,
          ideal);
  }
  float y[KV_SCORE_MAX_HEAD_DIM];
  kv_score_dequantize_row(codes, d, bits, s, y);
  double qsum = 0, err = 0;
  t_rng r = {d * 7u + bits};
  for (uint32_t j = 0; j < d; j++) {
    int c = bits == 8 ? (int8_t)codes[j]
                      : (j % 2 == 0 ? (codes[j / 2] & 15) - 8 : (codes[j / 2] >> 4) - 8);
    CHECK(c >= -Q && c <= Q, "%s: code %d out of [-%d, %d]", what, c, Q, Q);
    double e = fabs((double)x[j] - (double)c * (double)s);
    CHECK(e <= (double)s / 2, "%s: element %u error %.9g > s/2 = %.9g", what, j, e, (double)s / 2);
    /* dequantize_row is c * s in float: within one float rounding of the exact product */
    CHECK(fabs((double)y[j] - (double)c * (double)s) <= fabs((double)c * (double)s) * 0x1p-24,
          "%s: dequantized element %u", what, j);
    double qj = t_gauss(&r);
    qsum += fabs(qj);
    err += qj * ((double)x[j] - (double)c * (double)s);
  }
  CHECK(fabs(err) <= (double)s / 2 * qsum * (1 + 1e-12),
        "%s: dot error %.9g above the bound %.9g", what, fabs(err), (double)s / 2 * qsum);
}

static void test_quant_bounds(void)
{
  t_rng r = {1};
  const uint32_t dims[] = {2, 8, 64, 96, 128, 256, 4096};
  float x[KV_SCORE_MAX_HEAD_DIM];
  uint16_t h[KV_SCORE_MAX_HEAD_DIM];
  uint8_t codes[KV_SCORE_MAX_HEAD_DIM];
  for (size_t di = 0; di < sizeof dims / sizeof dims[0]; di++) {
    uint32_t d = dims[di];
    for (int kind = 0; kind < 6; kind++) {
      for (unsigned bits = 4; bits <= 8; bits += 4) {
        for (int dt = 1; dt <= 3; dt++) {
          fill_row(&r, x, d, kind);
          const void *src = x;
          if (dt == KV_SCORE_F16) {
            for (uint32_t j = 0; j < d; j++) {
              h[j] = kv_score_f32_to_f16(x[j]);
              x[j] = kv_score_f16_to_f32(h[j]);
            }
            src = h;
          } else if (dt == KV_SCORE_BF16) {
            for (uint32_t j = 0; j < d; j++) {
              uint32_t b;
              memcpy(&b, &x[j], 4);
              h[j] = (uint16_t)(b >> 16);
              x[j] = kv_score_bf16_to_f32(h[j]);
            }
            src = h;
          }
          float s = -1;
          kv_score_err e;
          kv_score_status rc = kv_score_quantize_rows((kv_score_dtype)dt, src, 0, 1, d, bits,
                                                      codes, 0, &s, &e);
          REQUIRE(rc == KV_SCORE_OK, "quantize d=%u bits=%u: %s", d, bits, t_errtext(&e));
          char what[96];
          snprintf(what, sizeof what, "d=%u kind=%d bits=%u dtype=%d", d, kind, bits, dt);
          check_bound(x, d, bits, codes, s, what);
        }
      }
    }
  }
  /* zero rows: scale 0, int8 codes 0, int4 nibbles 8 */
  memset(x, 0, sizeof x);
  float s = 1;
  REQUIRE(kv_score_quantize_rows(KV_SCORE_F32, x, 0, 1, 16, 8, codes, 0, &s, NULL) == KV_SCORE_OK,
          "zero row");
  CHECK(s == 0.0f && codes[0] == 0 && codes[15] == 0, "zero row int8: s=%g", (double)s);
  REQUIRE(kv_score_quantize_rows(KV_SCORE_F32, x, 0, 1, 16, 4, codes, 0, &s, NULL) == KV_SCORE_OK,
          "zero row int4");
  CHECK(s == 0.0f && codes[0] == 0x88 && codes[7] == 0x88, "zero row int4: byte 0x%02x", codes[0]);
  /* the largest element gets +-Q exactly; nibble order: element 0 low, element 1 high */
  float y[4] = {-2.0f, 1.2f, 0.5f, 0.0f};
  REQUIRE(kv_score_quantize_rows(KV_SCORE_F32, y, 0, 1, 4, 4, codes, 0, &s, NULL) == KV_SCORE_OK,
          "int4 order");
  CHECK(codes[0] == (uint8_t)((-7 + 8) | ((4 + 8) << 4)), "int4 byte 0 = 0x%02x", codes[0]);
  CHECK(codes[1] == (uint8_t)((2 + 8) | ((0 + 8) << 4)), "int4 byte 1 = 0x%02x", codes[1]);
  REQUIRE(kv_score_quantize_rows(KV_SCORE_F32, y, 0, 1, 4, 8, codes, 0, &s, NULL) == KV_SCORE_OK,
          "int8 order");
  CHECK((int8_t)codes[0] == -127 && (int8_t)codes[1] == 76 && (int8_t)codes[2] == 32,
        "int8 codes %d %d %d", (int8_t)codes[0], (int8_t)codes[1], (int8_t)codes[2]);
}

static void test_quant_rejects(void)
{
  float x[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  uint8_t codes[64];
  float s[4];
  kv_score_err e;
  x[5] = NAN;
  CHECK(kv_score_quantize_rows(KV_SCORE_F32, x, 0, 1, 8, 8, codes, 0, s, &e) == KV_SCORE_EINVAL &&
            strstr(t_errtext(&e), "NaN") != NULL,
        "NaN key: %s", t_errtext(&e));
  x[5] = INFINITY;
  float rows[3][8] = {{1}, {2}, {3}};
  rows[2][3] = -INFINITY;
  CHECK(kv_score_quantize_rows(KV_SCORE_F32, rows, sizeof rows[0], 3, 8, 8, codes, 8, s, &e) ==
                KV_SCORE_EINVAL &&
            e.value == 2,
        "infinite key names row 2: %s", t_errtext(&e));
  CHECK(kv_score_quantize_rows(KV_SCORE_F32, x, 0, 1, 7, 4, codes, 0, s, &e) == KV_SCORE_EINVAL &&
            strstr(t_errtext(&e), "even head_dim") != NULL,
        "odd d int4: %s", t_errtext(&e));
  CHECK(kv_score_quantize_rows(KV_SCORE_F32, x, 0, 1, 8, 5, codes, 0, s, &e) == KV_SCORE_EINVAL &&
            strstr(t_errtext(&e), "bits") != NULL,
        "bits 5: %s", t_errtext(&e));
  CHECK(kv_score_quantize_rows((kv_score_dtype)9, x, 0, 1, 8, 8, codes, 0, s, &e) ==
            KV_SCORE_EINVAL,
        "dtype 9");
  CHECK(kv_score_quantize_rows(KV_SCORE_F32, NULL, 0, 1, 8, 8, codes, 0, s, &e) == KV_SCORE_EINVAL,
        "NULL src");
  CHECK(kv_score_quantize_rows(KV_SCORE_F32, rows, 16, 2, 8, 8, codes, 8, s, &e) ==
                KV_SCORE_EINVAL &&
            strstr(t_errtext(&e), "stride") != NULL,
        "short stride: %s", t_errtext(&e));
  CHECK(kv_score_quantize_rows(KV_SCORE_F32, rows, 32, 2, 8, 8, codes, 4, s, &e) ==
            KV_SCORE_EINVAL,
        "short code stride");
  CHECK(kv_score_quantize_rows(KV_SCORE_F32, x, 0, 1, KV_SCORE_MAX_HEAD_DIM + 1, 8, codes, 0, s,
                               &e) == KV_SCORE_EINVAL,
        "d too large");
}

/* ---- layout and the copy ----------------------------------------------------------------- */

static void test_layout(void)
{
  struct {
    uint32_t n, d, bits, rb, pt, pages;
    uint64_t meta;
  } cases[] = {
      {256, 128, 8, 128, 32, 8, 4096},  {256, 128, 4, 64, 64, 4, 4096},
      {1000, 128, 8, 128, 32, 32, 4096}, {512, 8, 8, 8, 512, 1, 4096},
      {512, 8, 4, 4, 1024, 1, 4096},     {100, 96, 8, 96, 32, 4, 4096},
      {3, 4096, 8, 4096, 1, 3, 4096},    {1, 2, 4, 1, 4096, 1, 4096},
      {1008, 64, 8, 64, 64, 16, 4096},   {1009, 64, 8, 64, 64, 16, 8192},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    kv_score_layout l;
    kv_score_err e;
    REQUIRE(kv_score_layout_init(&l, cases[i].n, cases[i].d, cases[i].bits, &e) == KV_SCORE_OK,
            "layout %zu: %s", i, t_errtext(&e));
    CHECK(l.row_bytes == cases[i].rb && l.page_tokens == cases[i].pt &&
              l.n_pages == cases[i].pages && l.meta_bytes == cases[i].meta &&
              l.total_bytes == cases[i].meta + 4096ull * cases[i].pages,
          "layout %zu: rb %u pt %u pages %u meta %llu", i, l.row_bytes, l.page_tokens, l.n_pages,
          (unsigned long long)l.meta_bytes);
    CHECK(l.page_tokens * l.row_bytes <= 4096 && 2 * l.page_tokens * l.row_bytes > 4096,
          "layout %zu: page_tokens is the largest power of two that fits", i);
    CHECK(kv_score_layout_code_offset(&l, cases[i].n - 1) + l.row_bytes <= l.total_bytes,
          "layout %zu: last row inside", i);
  }
  kv_score_layout l;
  kv_score_err e;
  CHECK(kv_score_layout_init(&l, 0, 128, 8, &e) == KV_SCORE_EINVAL &&
            strstr(t_errtext(&e), "n_tokens") != NULL,
        "0 tokens: %s", t_errtext(&e));
  CHECK(kv_score_layout_init(&l, KV_SCORE_MAX_TOKENS + 1, 128, 8, &e) == KV_SCORE_EINVAL,
        "too many tokens");
  CHECK(kv_score_layout_init(&l, 16, 0, 8, &e) == KV_SCORE_EINVAL, "d 0");
  CHECK(kv_score_layout_init(&l, 16, 127, 4, &e) == KV_SCORE_EINVAL, "odd d int4");
  CHECK(kv_score_layout_init(&l, 16, 128, 2, &e) == KV_SCORE_EINVAL, "bits 2");
  CHECK(kv_score_layout_init(NULL, 16, 128, 8, &e) == KV_SCORE_EINVAL, "NULL layout");
}

static void *aligned(size_t n)
{
  void *p = NULL;
  if (posix_memalign(&p, 4096, n ? n : 1) != 0) {
    fprintf(stderr, "out of memory\n");
    exit(1);
  }
  return p;
}

static void test_copy_roundtrip(void)
{
  t_rng r = {7};
  const uint32_t shapes[][3] = {{256, 128, 8}, {256, 128, 4}, {300, 96, 8}, {37, 8, 4},
                                {5000, 64, 8}, {1, 4096, 8},  {17, 2, 4}};
  for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
    uint32_t n = shapes[si][0], d = shapes[si][1], bits = shapes[si][2];
    uint16_t *k = malloc((size_t)n * d * 2);
    for (size_t i = 0; i < (size_t)n * d; i++)
      k[i] = kv_score_f32_to_f16(t_gauss(&r) * (i % d == 3 ? 20.0f : 1.0f));
    kv_score_layout l;
    REQUIRE(kv_score_layout_init(&l, n, d, bits, NULL) == KV_SCORE_OK, "layout");
    uint8_t *buf = aligned(l.total_bytes + 4096);
    memset(buf, 0xA5, l.total_bytes + 4096);
    size_t len = 0;
    kv_score_err e;
    /* too small first: ETOOSMALL naming the size */
    CHECK(kv_score_copy_encode(KV_SCORE_F16, k, (size_t)d * 2, n, d, bits, buf, l.total_bytes - 1,
                               &len, &e) == KV_SCORE_ETOOSMALL &&
              e.limit == l.total_bytes,
          "encode too small: %s", t_errtext(&e));
    REQUIRE(kv_score_copy_encode(KV_SCORE_F16, k, (size_t)d * 2, n, d, bits, buf,
                                 l.total_bytes + 4096, &len, &e) == KV_SCORE_OK,
            "encode: %s", t_errtext(&e));
    CHECK(len == l.total_bytes && len % 4096 == 0, "encoded length %zu", len);
    CHECK(buf[len] == 0xA5, "encode wrote past total_bytes");
    kv_score_view v;
    REQUIRE(kv_score_copy_parse(buf, len, &v, &e) == KV_SCORE_OK, "parse: %s", t_errtext(&e));
    CHECK(v.layout.n_tokens == n && v.layout.head_dim == d && v.layout.bits == bits &&
              v.codes == buf + l.meta_bytes,
          "parsed view");
    /* each row equals a direct quantization of that row */
    uint8_t row[KV_SCORE_MAX_HEAD_DIM];
    int bad = 0;
    for (uint32_t t = 0; t < n; t++) {
      float s;
      kv_score_quantize_rows(KV_SCORE_F16, k + (size_t)t * d, 0, 1, d, bits, row, 0, &s, NULL);
      if (memcmp(row, buf + kv_score_layout_code_offset(&l, t), l.row_bytes) != 0 ||
          memcmp(&s, &v.scales[t], 4) != 0)
        bad++;
    }
    CHECK(bad == 0, "shape %zu: %d rows differ from direct quantization", si, bad);
    /* padding is zero: after the scales, and after the last row of each page */
    int nz = 0;
    for (uint64_t i = 64 + 4ull * n; i < l.meta_bytes; i++)
      nz += buf[i] != 0;
    for (uint32_t p = 0; p < l.n_pages; p++) {
      uint32_t rows = n - p * l.page_tokens < l.page_tokens ? n - p * l.page_tokens : l.page_tokens;
      for (uint64_t i = (uint64_t)rows * l.row_bytes; i < 4096; i++)
        nz += buf[l.meta_bytes + (uint64_t)p * 4096 + i] != 0;
    }
    CHECK(nz == 0, "shape %zu: %d padding bytes not zero", si, nz);
    free(buf);
    free(k);
  }
}

static void put32(uint8_t *p, uint32_t v)
{
  memcpy(p, &v, 4);
}

static void test_copy_rejects(void)
{
  uint32_t n = 100, d = 64;
  float *k = calloc((size_t)n * d, 4);
  for (size_t i = 0; i < (size_t)n * d; i++)
    k[i] = (float)(i % 17) - 8.0f;
  kv_score_layout l;
  kv_score_layout_init(&l, n, d, 8, NULL);
  uint8_t *good = aligned(l.total_bytes), *b = aligned(l.total_bytes + 8);
  size_t len;
  REQUIRE(kv_score_copy_encode(KV_SCORE_F32, k, d * 4, n, d, 8, good, l.total_bytes, &len, NULL) ==
              KV_SCORE_OK,
          "encode");
  struct {
    size_t off;
    uint32_t val;
    int width;
    const char *what;
  } muts[] = {
      {0, 0x4B564442, 4, "magic"},       {4, 2, 1, "version"},       {5, 2, 1, "bits"},
      {6, 2, 1, "scale dtype"},          {7, 1, 1, "flags"},         {8, 0, 4, "n_tokens"},
      {8, 200, 4, "n_pages"},            {8, 5000, 4, "meta_bytes"}, {12, 0, 4, "head_dim"},
      {12, 5000, 4, "head_dim"},         {12, 32, 4, "row_bytes"},   {16, 32, 4, "row_bytes"},
      {20, 32, 4, "page_tokens"},        {24, 8192, 4, "meta_bytes"}, {28, 3, 4, "n_pages"},
      {40, 1, 1, "reserved"},            {5, 4, 1, "row_bytes"},
  };
  kv_score_view v;
  kv_score_err e;
  for (size_t i = 0; i < sizeof muts / sizeof muts[0]; i++) {
    memcpy(b, good, len);
    if (muts[i].width == 4)
      put32(b + muts[i].off, muts[i].val);
    else
      b[muts[i].off] = (uint8_t)muts[i].val;
    kv_score_status rc = kv_score_copy_parse(b, len, &v, &e);
    CHECK(rc == KV_SCORE_ECORRUPT && strstr(t_errtext(&e), muts[i].what) != NULL,
          "mutation %zu (offset %zu = %u): got %s, expected a message naming '%s'", i,
          muts[i].off, muts[i].val, t_errtext(&e), muts[i].what);
    CHECK(v.codes == NULL && v.layout.n_tokens == 0, "mutation %zu: view not cleared", i);
  }
  float bad[3] = {-1.0f, NAN, INFINITY};
  for (int i = 0; i < 3; i++) {
    memcpy(b, good, len);
    memcpy(b + 64 + 4 * 37, &bad[i], 4);
    CHECK(kv_score_copy_parse(b, len, &v, &e) == KV_SCORE_ECORRUPT && e.value == 37 &&
              strstr(t_errtext(&e), "scale") != NULL,
          "bad scale %d: %s", i, t_errtext(&e));
  }
  memcpy(b, good, len);
  CHECK(kv_score_copy_parse(b, len - 4096, &v, &e) == KV_SCORE_ECORRUPT &&
            strstr(t_errtext(&e), "length") != NULL,
        "truncated: %s", t_errtext(&e));
  CHECK(kv_score_copy_parse(b, len + 8, &v, &e) == KV_SCORE_ECORRUPT, "trailing bytes");
  CHECK(kv_score_copy_parse(b, 63, &v, &e) == KV_SCORE_ECORRUPT &&
            strstr(t_errtext(&e), "header") != NULL,
        "short header: %s", t_errtext(&e));
  CHECK(kv_score_copy_parse(b + 1, len - 1, &v, &e) == KV_SCORE_EINVAL &&
            strstr(t_errtext(&e), "aligned") != NULL,
        "misaligned: %s", t_errtext(&e));
  CHECK(kv_score_copy_parse(NULL, len, &v, &e) == KV_SCORE_EINVAL, "NULL src");
  CHECK(kv_score_copy_parse(b, len, NULL, &e) == KV_SCORE_EINVAL, "NULL view");
  CHECK(kv_score_copy_parse(good, len, &v, &e) == KV_SCORE_OK, "good copy still parses");
  free(good);
  free(b);
  free(k);
}

/* ---- bad arguments of the scoring API ----------------------------------------------------- */

static void test_api_rejects(void)
{
  uint32_t n = 64, d = 32;
  float *k = calloc((size_t)n * d, 4), qf[4 * 32];
  for (size_t i = 0; i < (size_t)n * d; i++)
    k[i] = (float)((int)(i * 7 % 13) - 6);
  for (int i = 0; i < 4 * 32; i++)
    qf[i] = (float)(i % 5) - 2.0f;
  kv_score_layout l;
  kv_score_layout_init(&l, n, d, 8, NULL);
  uint8_t *buf = aligned(l.total_bytes);
  kv_score_copy_encode(KV_SCORE_F32, k, d * 4, n, d, 8, buf, l.total_bytes, NULL, NULL);
  kv_score_view v;
  REQUIRE(kv_score_copy_parse(buf, l.total_bytes, &v, NULL) == KV_SCORE_OK, "parse");
  kv_score_query *q = NULL;
  kv_score_err e;
  REQUIRE(kv_score_query_create(KV_SCORE_F32, qf, 4, d, d * 4, KV_SCORE_MAX, &q, &e) == KV_SCORE_OK,
          "query: %s", t_errtext(&e));
  CHECK(kv_score_query_n_vec(q) == 4 && kv_score_query_head_dim(q) == d, "MAX keeps 4 vectors");
  kv_score_span sp = {&v, 0, n, 0};
  uint32_t pos[80];
  float sc[80];
  uint32_t got = 99;

  CHECK(kv_score_topk(q, &sp, 1, 0, NULL, NULL, 0, pos, sc, &got, &e) == KV_SCORE_EINVAL &&
            strstr(t_errtext(&e), "k is 0") != NULL && got == 0,
        "k = 0: %s", t_errtext(&e));
  CHECK(kv_score_topk(q, &sp, 1, n + 1, NULL, NULL, 0, pos, sc, &got, &e) == KV_SCORE_EINVAL &&
            strstr(t_errtext(&e), "larger than the number of tokens") != NULL && e.value == n + 1 &&
            e.limit == n,
        "k > N: %s", t_errtext(&e));
  CHECK(kv_score_topk(NULL, &sp, 1, 4, NULL, NULL, 0, pos, sc, &got, &e) == KV_SCORE_EINVAL,
        "NULL query");
  CHECK(kv_score_topk(q, NULL, 1, 4, NULL, NULL, 0, pos, sc, &got, &e) == KV_SCORE_EINVAL,
        "NULL spans");
  CHECK(kv_score_topk(q, &sp, 1, 4, NULL, NULL, 0, NULL, NULL, &got, &e) == KV_SCORE_EINVAL,
        "NULL outputs");
  CHECK(kv_score_topk(q, &sp, 0, 1, NULL, NULL, 0, pos, sc, &got, &e) == KV_SCORE_EINVAL,
        "no spans: k > 0 tokens");
  kv_score_span past = {&v, 10, n, 0};
  CHECK(kv_score_topk(q, &past, 1, 4, NULL, NULL, 0, pos, sc, &got, &e) == KV_SCORE_EINVAL &&
            strstr(t_errtext(&e), "past the end") != NULL,
        "span past end: %s", t_errtext(&e));
  kv_score_span noview = {NULL, 0, 4, 0};
  CHECK(kv_score_topk(q, &noview, 1, 4, NULL, NULL, 0, pos, sc, &got, &e) == KV_SCORE_EINVAL,
        "span without a view");
  unsigned char small[16];
  CHECK(kv_score_topk(q, &sp, 1, 4, NULL, small, sizeof small, pos, sc, &got, &e) ==
            KV_SCORE_ENOMEM,
        "scratch too small");
  kv_score_opts o;
  kv_score_opts_init(&o);
  o.impl = (kv_score_impl)7;
  CHECK(kv_score_topk(q, &sp, 1, 4, &o, NULL, 0, pos, sc, &got, &e) == KV_SCORE_EINVAL,
        "unknown impl");
  /* a query of another head_dim */
  kv_score_query *q16;
  REQUIRE(kv_score_query_create(KV_SCORE_F32, qf, 1, 16, 0, KV_SCORE_SUM, &q16, NULL) == KV_SCORE_OK,
          "q16");
  CHECK(kv_score_topk(q16, &sp, 1, 4, NULL, NULL, 0, pos, sc, &got, &e) == KV_SCORE_EINVAL &&
            strstr(t_errtext(&e), "head_dim") != NULL,
        "head_dim mismatch: %s", t_errtext(&e));
  CHECK(kv_score_tokens(q16, &v, 0, 4, KV_SCORE_IMPL_AUTO, sc, &e) == KV_SCORE_EINVAL,
        "tokens: head_dim mismatch");
  kv_score_query_free(q16);
  CHECK(kv_score_tokens(q, &v, n - 2, 4, KV_SCORE_IMPL_AUTO, sc, &e) == KV_SCORE_EINVAL &&
            strstr(t_errtext(&e), "past the end") != NULL,
        "tokens past the end: %s", t_errtext(&e));
  /* good calls */
  CHECK(kv_score_topk(q, &sp, 1, n, NULL, NULL, 0, pos, sc, &got, &e) == KV_SCORE_OK && got == n,
        "k = N works: %s", t_errtext(&e));
  CHECK(kv_score_topk(q, &sp, 1, 1, NULL, NULL, 0, pos, NULL, &got, &e) == KV_SCORE_OK && got == 1,
        "k = 1, positions only");

  /* query creation */
  kv_score_query *bad = (kv_score_query *)&e;
  CHECK(kv_score_query_create(KV_SCORE_F32, qf, 0, d, 0, KV_SCORE_SUM, &bad, &e) ==
                KV_SCORE_EINVAL &&
            bad == NULL,
        "0 heads sets *out NULL");
  CHECK(kv_score_query_create(KV_SCORE_F32, qf, KV_SCORE_MAX_Q_HEADS + 1, d, d * 4, KV_SCORE_SUM,
                              &bad, &e) == KV_SCORE_EINVAL,
        "too many heads");
  CHECK(kv_score_query_create(KV_SCORE_F32, NULL, 1, d, 0, KV_SCORE_SUM, &bad, &e) ==
            KV_SCORE_EINVAL,
        "NULL q");
  CHECK(kv_score_query_create(KV_SCORE_F32, qf, 2, d, 4, KV_SCORE_SUM, &bad, &e) ==
                KV_SCORE_EINVAL &&
            strstr(t_errtext(&e), "stride") != NULL,
        "short head stride: %s", t_errtext(&e));
  CHECK(kv_score_query_create(KV_SCORE_F32, qf, 1, d, 0, (kv_score_combine)5, &bad, &e) ==
            KV_SCORE_EINVAL,
        "unknown combine");
  float qn[32];
  memcpy(qn, qf, sizeof qn);
  qn[9] = NAN;
  CHECK(kv_score_query_create(KV_SCORE_F32, qn, 1, d, 0, KV_SCORE_SUM, &bad, &e) ==
                KV_SCORE_EINVAL &&
            strstr(t_errtext(&e), "NaN") != NULL,
        "NaN query: %s", t_errtext(&e));
  float big[2][32];
  for (int j = 0; j < 32; j++)
    big[0][j] = big[1][j] = 3e38f;
  CHECK(kv_score_query_create(KV_SCORE_F32, big, 2, d, sizeof big[0], KV_SCORE_SUM, &bad, &e) ==
                KV_SCORE_EINVAL &&
            strstr(t_errtext(&e), "overflow") != NULL,
        "sum overflow: %s", t_errtext(&e));
  kv_score_query_free(NULL);

  /* accumulator */
  kv_score_acc acc;
  uint64_t mem[8];
  CHECK(kv_score_acc_init(&acc, 0, mem, sizeof mem, &e) == KV_SCORE_EINVAL, "acc k = 0");
  CHECK(kv_score_acc_init(&acc, 8, mem, sizeof mem, &e) == KV_SCORE_ENOMEM, "acc memory small");
  CHECK(kv_score_acc_init(&acc, 2, (char *)mem + 1, sizeof mem - 8, &e) == KV_SCORE_EINVAL,
        "acc misaligned");
  /* views */
  CHECK(kv_score_view_init(&v, n, d, 8, NULL, v.scales, &e) == KV_SCORE_EINVAL, "view NULL codes");
  kv_score_query_free(q);
  free(buf);
  free(k);
  /* status names and messages */
  CHECK(strcmp(kv_score_status_name(KV_SCORE_ECORRUPT), "KV_SCORE_ECORRUPT") == 0, "name");
  CHECK(strcmp(kv_score_status_name((kv_score_status)99), "KV_SCORE_E?") == 0, "unknown name");
  char msg[8];
  size_t full = kv_score_errmsg(&e, msg, sizeof msg);
  CHECK(full > sizeof msg && strlen(msg) == sizeof msg - 1, "errmsg truncates and reports length");
}

/* Seeds for tests/fuzz/fuzz_score_copy: valid copies of small shapes and a few broken ones. */
static int write_seeds(const char *dir)
{
  const uint32_t shapes[][3] = {{1, 2, 4}, {5, 8, 8}, {40, 64, 4}, {33, 128, 8}, {70, 96, 8},
                                {3, 30, 4}, {1100, 4, 8}};
  t_rng r = {99};
  for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
    uint32_t n = shapes[si][0], d = shapes[si][1], bits = shapes[si][2];
    float *k = malloc((size_t)n * d * 4);
    for (size_t i = 0; i < (size_t)n * d; i++)
      k[i] = t_gauss(&r) * (i % 7 == 0 ? 9.0f : 1.0f);
    kv_score_layout l;
    kv_score_layout_init(&l, n, d, bits, NULL);
    uint8_t *b = aligned(l.total_bytes);
    REQUIRE(kv_score_copy_encode(KV_SCORE_F32, k, (size_t)d * 4, n, d, bits, b, l.total_bytes,
                                 NULL, NULL) == KV_SCORE_OK,
            "encode seed");
    for (int variant = 0; variant < (si < 2 ? 3 : 1); variant++) {
      if (variant == 1)
        b[28] ^= 1; /* n_pages */
      if (variant == 2) {
        b[28] ^= 1;
        float neg = -1.0f;
        memcpy(b + 64, &neg, 4);
      }
      char path[4096];
      snprintf(path, sizeof path, "%s/seed_n%u_d%u_b%u_%d", dir, n, d, bits, variant);
      FILE *f = fopen(path, "wb");
      REQUIRE(f != NULL, "cannot write %s", path);
      REQUIRE(fwrite(b, 1, l.total_bytes, f) == l.total_bytes && fclose(f) == 0, "write %s", path);
    }
    free(b);
    free(k);
  }
  /* centered, rotated copies (version 2, issue 18): a good one per shape, and for the first
   * two a negative center scale and version-2 bytes under a version-1 header */
  const uint32_t cshapes[][3] = {{1, 2, 4}, {40, 64, 4}, {33, 128, 8}, {300, 8, 4}};
  t_rng rc = {1234};
  for (size_t si = 0; si < sizeof cshapes / sizeof cshapes[0]; si++) {
    uint32_t n = cshapes[si][0], d = cshapes[si][1], bits = cshapes[si][2];
    float *k = malloc((size_t)n * d * 4);
    for (size_t i = 0; i < (size_t)n * d; i++)
      k[i] = t_gauss(&rc) * (i % 7 == 0 ? 9.0f : 1.0f) + (i % d == 1 ? 20.0f : 0.0f);
    kv_score_layout l;
    kv_score_layout_init_v(&l, n, d, bits, KV_SCORE_COPY_CENTERED, NULL);
    uint8_t *b = aligned(l.total_bytes);
    REQUIRE(kv_score_copy_encode_v(KV_SCORE_F32, k, (size_t)d * 4, n, d, bits,
                                   KV_SCORE_COPY_CENTERED, b, l.total_bytes, NULL, NULL) ==
                KV_SCORE_OK,
            "encode centered seed");
    for (int variant = 0; variant < (si < 2 ? 3 : 1); variant++) {
      if (variant == 1) {
        float neg = -1.0f;
        memcpy(b + 32, &neg, 4); /* center scale */
      }
      if (variant == 2) {
        b[35] ^= 0x80; /* the center scale back to +1... */
        b[4] = 1; /* ...under a version-1 header */
      }
      char path[4096];
      snprintf(path, sizeof path, "%s/seed_centered_n%u_d%u_b%u_%d", dir, n, d, bits, variant);
      FILE *f = fopen(path, "wb");
      REQUIRE(f != NULL, "cannot write %s", path);
      REQUIRE(fwrite(b, 1, l.total_bytes, f) == l.total_bytes && fclose(f) == 0, "write %s", path);
    }
    free(b);
    free(k);
  }
  return 0;
}

int main(int argc, char **argv)
{
  if (argc == 3 && strcmp(argv[1], "--write-seeds") == 0)
    return write_seeds(argv[2]);
  test_quant_bounds();
  test_quant_rejects();
  test_layout();
  test_copy_roundtrip();
  test_copy_rejects();
  test_api_rejects();
  return t_finish("test_score_quant");
}
