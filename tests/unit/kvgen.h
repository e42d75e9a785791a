/* SPDX-License-Identifier: MIT */
/*
 * tests/unit/kvgen.h — deterministic KV-cache-like data for the codec tests, and the small
 * assertion helpers those tests share.
 *
 * The generator uses only integer arithmetic and IEEE +, -, *, / and sqrt (no libm
 * transcendental functions), so a seed gives the same floats on every platform and compiler.
 *
 * Keys imitate one Llama-3-8B KV head (head_dim 128): every channel has its own mean and
 * spread, a few "outlier" channels carry large persistent magnitudes (|mean| 8..14, the
 * structure that makes KIVI quantize keys per channel), and each channel drifts along the
 * tokens as an AR(1) process, so neighbouring tokens resemble each other as in real KV.
 * Values have no outlier channels but a per-token scale (KIVI's reason to quantize V per
 * token). Queries are standard normal.
 */
#ifndef KVGEN_H
#define KVGEN_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codec.h"

/* ---- deterministic random numbers -------------------------------------------------------- */

typedef struct kvgen_rng {
  uint64_t s;
} kvgen_rng;

static inline uint64_t kvgen_next(kvgen_rng *r) /* splitmix64 */
{
  uint64_t z = (r->s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

static inline float kvgen_uniform(kvgen_rng *r) /* [0, 1), 24 random bits */
{
  return (float)(kvgen_next(r) >> 40) * 0x1p-24f;
}

static inline float kvgen_normal(kvgen_rng *r) /* Irwin-Hall: mean 0, variance 1 */
{
  float s = 0;
  for (int i = 0; i < 12; i++)
    s += kvgen_uniform(r);
  return s - 6.0f;
}

/* Number of outlier key channels per 128 channels. */
#define KVGEN_OUTLIERS_PER_128 4

/* Keys of one head: float [n][d] (see the file comment). */
static inline void kvgen_keys(uint64_t seed, uint32_t n, uint32_t d, float *out)
{
  kvgen_rng r = {seed * 0x2545f4914f6cdd1dull + 1};
  float *mu = malloc(sizeof(float) * d), *sd = malloc(sizeof(float) * d);
  float *a = malloc(sizeof(float) * d), *b = malloc(sizeof(float) * d), *x = malloc(sizeof(float) * d);
  uint32_t n_out = (d * KVGEN_OUTLIERS_PER_128 + 127) / 128;
  for (uint32_t c = 0; c < d; c++) {
    mu[c] = 0.4f * kvgen_normal(&r);
    sd[c] = 0.4f + 0.8f * kvgen_uniform(&r);
    a[c] = 0.5f + 0.48f * kvgen_uniform(&r); /* AR(1) coefficient */
    b[c] = sqrtf(1.0f - a[c] * a[c]);
    x[c] = kvgen_normal(&r);
  }
  for (uint32_t i = 0; i < n_out; i++) { /* spread the outlier channels over the head */
    uint32_t c = (uint32_t)((i * 2u + 1u) * (uint64_t)d / (2u * n_out));
    float sign = (kvgen_next(&r) & 1) ? 1.0f : -1.0f;
    mu[c] = sign * (8.0f + 6.0f * kvgen_uniform(&r));
    sd[c] = 1.5f + kvgen_uniform(&r);
  }
  for (uint32_t t = 0; t < n; t++)
    for (uint32_t c = 0; c < d; c++) {
      x[c] = a[c] * x[c] + b[c] * kvgen_normal(&r);
      out[(size_t)t * d + c] = mu[c] + sd[c] * x[c];
    }
  free(mu);
  free(sd);
  free(a);
  free(b);
  free(x);
}

/* Values of one head: float [n][d]. */
static inline void kvgen_values(uint64_t seed, uint32_t n, uint32_t d, float *out)
{
  kvgen_rng r = {seed * 0x9e3779b97f4a7c15ull + 7};
  float *mu = malloc(sizeof(float) * d), *sd = malloc(sizeof(float) * d);
  for (uint32_t c = 0; c < d; c++) {
    mu[c] = 0.05f * kvgen_normal(&r);
    sd[c] = 0.3f + 0.4f * kvgen_uniform(&r);
  }
  for (uint32_t t = 0; t < n; t++) {
    float scale = 0.5f + kvgen_uniform(&r);
    for (uint32_t c = 0; c < d; c++)
      out[(size_t)t * d + c] = mu[c] + scale * sd[c] * kvgen_normal(&r);
  }
  free(mu);
  free(sd);
}

/* Standard normal floats (queries, noise). */
static inline void kvgen_gauss(uint64_t seed, size_t n, float scale, float *out)
{
  kvgen_rng r = {seed ^ 0x5851f42d4c957f2dull};
  for (size_t i = 0; i < n; i++)
    out[i] = scale * kvgen_normal(&r);
}

/* Random bytes (incompressible data, arbitrary bit patterns). */
static inline void kvgen_bytes(uint64_t seed, size_t n, uint8_t *out)
{
  kvgen_rng r = {seed};
  for (size_t i = 0; i < n; i++)
    out[i] = (uint8_t)(kvgen_next(&r) >> 56);
}

/* A K or V section of shape (dtype, n, d) as a malloc'd buffer of dtype elements. */
static inline void *kvgen_section(kv_codec_dtype dt, kv_section_kind kind, uint64_t seed,
                                  uint32_t n, uint32_t d, size_t *len)
{
  float *f = malloc(sizeof(float) * (size_t)n * d);
  if (kind == KV_SECTION_K)
    kvgen_keys(seed, n, d, f);
  else
    kvgen_values(seed, n, d, f);
  size_t es = kv_codec_dtype_bytes(dt);
  void *out = malloc((size_t)n * d * es);
  kv_codec_from_f32(dt, f, (size_t)n * d, out);
  free(f);
  *len = (size_t)n * d * es;
  return out;
}

/* ---- assertions ---------------------------------------------------------------------------- */

#define T_EXIT_PASS 0
#define T_EXIT_FAIL 1
#define T_EXIT_SKIP 77

static inline void kt_fail(const char *file, int line, const char *expr, const kv_codec_err *e)
{
  char msg[512] = "";
  if (e != NULL)
    kv_codec_errmsg(e, msg, sizeof msg);
  fprintf(stderr, "%s:%d: check failed: %s%s%s\n", file, line, expr, e ? " -> " : "", msg);
  abort();
}

#define CHECK(cond)                                                                                \
  do {                                                                                             \
    if (!(cond))                                                                                   \
      kt_fail(__FILE__, __LINE__, #cond, NULL);                                                    \
  } while (0)

/* expr must return KV_CODEC_OK; `e` is the kv_codec_err it filled. */
#define CHECK_OK(e, expr)                                                                          \
  do {                                                                                             \
    kv_codec_status rc_ = (expr);                                                                  \
    if (rc_ != KV_CODEC_OK)                                                                        \
      kt_fail(__FILE__, __LINE__, #expr, &(e));                                                    \
  } while (0)

/* expr must return `want`. */
#define CHECK_RC(want, e, expr)                                                                    \
  do {                                                                                             \
    kv_codec_status rc_ = (expr);                                                                  \
    if (rc_ != (want)) {                                                                           \
      fprintf(stderr, "%s:%d: %s returned %s, wanted %s\n", __FILE__, __LINE__, #expr,            \
              kv_codec_status_name(rc_), kv_codec_status_name(want));                              \
      kt_fail(__FILE__, __LINE__, #expr, &(e));                                                    \
    }                                                                                              \
  } while (0)

/* The error message of `e` contains `needle`. */
static inline int kt_msg_has(const kv_codec_err *e, const char *needle)
{
  char msg[512];
  kv_codec_errmsg(e, msg, sizeof msg);
  return strstr(msg, needle) != NULL;
}

static int kt_passed; /* RUN() counts; each test file prints the total */
static inline int kt_passed_count(void) /* keeps kt_passed used in every includer */
{
  return kt_passed;
}

#define TEST(name) static void name(void)
#define RUN(name)                                                                                  \
  do {                                                                                             \
    name();                                                                                        \
    printf("ok %s\n", #name);                                                                      \
    kt_passed++;                                                                                   \
  } while (0)

/* ---- encode / decode helpers (malloc'd results; tests may allocate) ----------------------- */

static inline void *kt_xmalloc(size_t n)
{
  void *p = malloc(n ? n : 1);
  if (p == NULL) {
    fprintf(stderr, "out of memory (%zu bytes)\n", n);
    abort();
  }
  return p;
}

/* Encode with codec `id`; returns the section (malloc'd) and its length. */
static inline uint8_t *kt_encode(unsigned id, const kv_section_shape *s, const void *src,
                                 size_t src_len, const kv_codec_params *p, size_t *out_len)
{
  kv_codec_err e = {0};
  const kv_codec *c = kv_codec_by_id(id);
  CHECK(c != NULL);
  size_t bound = kv_codec_bound(c, s, p);
  size_t scr = kv_codec_scratch_bytes(c, s, p, KV_CODEC_OP_ENCODE);
  CHECK(bound > 0 && scr > 0);
  uint8_t *dst = kt_xmalloc(bound);
  void *scratch = kt_xmalloc(scr);
  CHECK_OK(e, kv_codec_encode(c, s, src, src_len, p, scratch, scr, dst, bound, out_len, &e));
  CHECK(*out_len <= bound);
  free(scratch);
  return dst;
}

/* Decode a whole section; returns the rows (malloc'd) and fills info. */
static inline void *kt_decode(const uint8_t *sec, size_t len, kv_section_info *info)
{
  kv_codec_err e = {0};
  CHECK_OK(e, kv_section_parse(sec, len, info, &e));
  size_t out = kv_section_rows_bytes(info, 0, info->n_groups);
  size_t scr = kv_section_scratch_bytes(info);
  CHECK(out > 0 && scr > 0);
  void *dst = kt_xmalloc(out), *scratch = kt_xmalloc(scr);
  CHECK_OK(e, kv_section_decode(sec, len, scratch, scr, dst, out, NULL, &e));
  free(scratch);
  return dst;
}

/* Status of decoding a (possibly broken) whole section, with generous buffers. */
static inline kv_codec_status kt_try_decode(const uint8_t *sec, size_t len, kv_codec_err *e)
{
  kv_section_info info;
  kv_codec_status rc = kv_section_parse(sec, len, &info, e);
  if (rc != KV_CODEC_OK)
    return rc;
  size_t out = kv_section_rows_bytes(&info, 0, info.n_groups);
  size_t scr = kv_section_scratch_bytes(&info);
  void *dst = kt_xmalloc(out), *scratch = kt_xmalloc(scr);
  rc = kv_section_decode(sec, len, scratch, scr, dst, out, NULL, e);
  free(dst);
  free(scratch);
  return rc;
}

#endif /* KVGEN_H */
