/* SPDX-License-Identifier: MIT */
/*
 * tests/unit/test_score_cuda.c — the optional CUDA scorer (score/cuda/score_cuda.h).
 * Built only when meson found nvcc (-Dcuda=auto|enabled).
 *
 *   test_score_cuda host   needs no GPU (never skips):
 *     - every argument error of every entry point is KV_SCORE_EINVAL naming the problem, found
 *       before any CUDA call (fake device pointers are passed and never touched);
 *     - without a GPU, valid calls fail cleanly with KV_SCORE_EUNSUPPORTED carrying
 *       cudaGetDeviceCount's error (35, cudaErrorInsufficientDriver, on a machine without the
 *       NVIDIA driver), and nothing crashes;
 *     - the host emulation — the kernels' own __host__ __device__ scoring, entry, digit and
 *       collect functions and the same radix-select driver, run on the CPU — equals
 *       kv_score_tokens() and kv_score_topk() bit for bit: random codes (int8 -128, int4
 *       nibble 0), head dims 1..4096 (word and byte paths, padded pages), 1..8 query vectors,
 *       ties, zero / NaN / infinite scales, duplicated spans, every k from 1 to N; and
 *       Llama-shaped keys (bench/datagen.c) quantized by kv_score_copy_encode().
 *   test_score_cuda gpu    exits 77 (meson: SKIP) saying what it checked when no CUDA device
 *     is usable; with one, uploads the same data and compares kv_score_cuda_tokens() and
 *     kv_score_cuda_topk() with the CPU scorer bit for bit (wrapped views, several spans, a
 *     2M-token section, device error paths).
 */
#define _POSIX_C_SOURCE 200809L
#include "score_test.h"

#include <math.h>

#include "datagen.h"
#include "score_cuda.h"

/* ---- helpers -------------------------------------------------------------------------------- */

static void expect(kv_score_status want, kv_score_status got, const kv_score_err *e,
                   const char *what_sub, const char *ctx)
{
  CHECK(got == want, "%s: got %s, want %s (%s)", ctx, kv_score_status_name(got),
        kv_score_status_name(want), t_errtext(e));
  if (got == want && want != KV_SCORE_OK && what_sub != NULL)
    CHECK(e->what != NULL && strstr(e->what, what_sub) != NULL, "%s: message '%s' lacks '%s'",
          ctx, e->what ? e->what : "(null)", what_sub);
}

typedef struct test_view {
  kv_score_view v;
  uint8_t *mem;   /* the allocation; codes may start 1 byte into it (byte path) */
  uint8_t *codes;
  float *scales;
} test_view;

/* kind 0: random bytes; 1: alternating extremes; 2: codes from {0, 1} with equal scales (ties) */
static void make_view(test_view *tv, t_rng *r, uint32_t n, uint32_t d, unsigned bits, int kind,
                      int misalign)
{
  kv_score_layout l;
  REQUIRE(kv_score_layout_init(&l, n, d, bits, NULL) == KV_SCORE_OK, "layout n=%u d=%u", n, d);
  size_t cb = (size_t)l.n_pages * 4096;
  REQUIRE(posix_memalign((void **)&tv->mem, 64, cb + 64) == 0, "oom");
  tv->codes = tv->mem + (misalign ? 1 : 0);
  tv->scales = malloc((size_t)n * 4);
  REQUIRE(tv->scales != NULL, "oom");
  for (size_t i = 0; i < cb; i++) {
    uint8_t b = (uint8_t)t_next(r);
    if (kind == 1)
      b = (i & 1) ? 0x80 : 0x7f; /* int8 -128 / 127; int4 nibbles 0 / 8, 15 / 7 */
    if (kind == 2)
      b = bits == 8 ? (uint8_t)(t_next(r) & 1) : (uint8_t)(0x88 + (t_next(r) & 0x11));
    tv->codes[i] = b;
  }
  for (uint32_t t = 0; t < n; t++) {
    uint32_t c = t_below(r, 10);
    tv->scales[t] = kind == 2   ? 0.25f
                    : c == 0    ? 0.0f
                    : c == 1    ? 1e-30f
                    : c == 2    ? 3e4f
                                : (float)(t_unif(r) * 0.05);
  }
  REQUIRE(kv_score_view_init(&tv->v, n, d, bits, tv->codes, tv->scales, NULL) == KV_SCORE_OK,
          "view");
}

static void free_view(test_view *tv)
{
  free(tv->mem);
  free(tv->scales);
}

static kv_score_query *make_query(t_rng *r, uint32_t heads, uint32_t d, kv_score_combine c)
{
  float *qf = malloc((size_t)heads * d * 4);
  REQUIRE(qf != NULL, "oom");
  for (size_t i = 0; i < (size_t)heads * d; i++)
    qf[i] = t_gauss(r) * (i % 9 == 0 ? 10.0f : 1.0f);
  kv_score_query *q = NULL;
  kv_score_err e;
  REQUIRE(kv_score_query_create(KV_SCORE_F32, qf, heads, d, (size_t)d * 4, c, &q, &e) ==
              KV_SCORE_OK,
          "query: %s", t_errtext(&e));
  free(qf);
  return q;
}

/* Same bits, except that two NaNs are equal (a device's NaN payload may differ). */
static int same_score(float a, float b, int nan_any)
{
  if (nan_any && isnan(a) && isnan(b))
    return 1;
  return memcmp(&a, &b, 4) == 0;
}

/* First index where the two score arrays differ, or -1. */
static long first_diff(const float *a, const float *b, uint32_t n, int nan_any)
{
  for (uint32_t i = 0; i < n; i++)
    if (!same_score(a[i], b[i], nan_any))
      return (long)i;
  return -1;
}

/* A device view that is never dereferenced: every call given it fails before touching memory. */
static kv_score_cuda_view fake_dview(uint32_t n, uint32_t d, unsigned bits, int device)
{
  kv_score_cuda_view v;
  memset(&v, 0, sizeof v);
  REQUIRE(kv_score_layout_init(&v.layout, n, d, bits, NULL) == KV_SCORE_OK, "layout");
  v.codes = (const uint8_t *)(uintptr_t)0x10000;
  v.scales = (const float *)(uintptr_t)0x20000;
  v.device = device;
  return v;
}

/* Compare one top-k call's outputs with kv_score_topk's for the same spans. */
typedef kv_score_status (*topk_under_test)(void *ctx, uint32_t k, uint32_t *pos, float *scores,
                                           uint32_t *n_out, kv_score_err *err);

static void compare_topk(const char *label, const kv_score_query *q, const kv_score_span *spans,
                         size_t n_spans, uint32_t k, topk_under_test fn, void *ctx)
{
  uint32_t *wp = malloc((size_t)k * 4), *gp = malloc((size_t)k * 4), wn = 0, gn = 0;
  float *ws = malloc((size_t)k * 4), *gs = malloc((size_t)k * 4);
  REQUIRE(wp && gp && ws && gs, "oom");
  kv_score_err e;
  kv_score_opts o;
  kv_score_opts_init(&o);
  kv_score_status rc = kv_score_topk(q, spans, n_spans, k, &o, NULL, 0, wp, ws, &wn, &e);
  REQUIRE(rc == KV_SCORE_OK, "%s: kv_score_topk: %s", label, t_errtext(&e));
  memset(gp, 0xee, (size_t)k * 4);
  memset(gs, 0xee, (size_t)k * 4);
  rc = fn(ctx, k, gp, gs, &gn, &e);
  CHECK(rc == KV_SCORE_OK, "%s k=%u: %s", label, k, t_errtext(&e));
  if (rc == KV_SCORE_OK) {
    CHECK(gn == wn, "%s k=%u: n_out %u, want %u", label, k, gn, wn);
    long bad = -1;
    for (uint32_t i = 0; i < wn && bad < 0; i++)
      if (gp[i] != wp[i] || memcmp(&gs[i], &ws[i], 4) != 0)
        bad = (long)i;
    CHECK(bad < 0, "%s k=%u: rank %ld is (%u, %.9g), want (%u, %.9g)", label, k, bad,
          gp[bad < 0 ? 0 : bad], (double)gs[bad < 0 ? 0 : bad], wp[bad < 0 ? 0 : bad],
          (double)ws[bad < 0 ? 0 : bad]);
    /* positions only, scores only */
    uint32_t *gp2 = malloc((size_t)k * 4);
    float *gs2 = malloc((size_t)k * 4);
    REQUIRE(gp2 && gs2, "oom");
    CHECK(fn(ctx, k, gp2, NULL, NULL, &e) == KV_SCORE_OK && memcmp(gp2, wp, (size_t)k * 4) == 0,
          "%s k=%u: positions only", label, k);
    CHECK(fn(ctx, k, NULL, gs2, NULL, &e) == KV_SCORE_OK && memcmp(gs2, ws, (size_t)k * 4) == 0,
          "%s k=%u: scores only", label, k);
    free(gp2);
    free(gs2);
  }
  free(wp);
  free(gp);
  free(ws);
  free(gs);
}

typedef struct emu_ctx {
  const kv_score_query *q;
  const kv_score_span *spans;
  size_t n_spans;
} emu_ctx;

static kv_score_status emu_topk(void *ctx, uint32_t k, uint32_t *pos, float *scores,
                                uint32_t *n_out, kv_score_err *err)
{
  const emu_ctx *c = ctx;
  return kv_score_cuda_emu_topk(c->q, c->spans, c->n_spans, k, pos, scores, n_out, err);
}

/* ---- argument errors (no CUDA call is reached) ---------------------------------------------- */

static void test_arg_errors(void)
{
  kv_score_err e;
  kv_score_status rc;
  t_rng r = {3};
  test_view tv;
  make_view(&tv, &r, 100, 64, 8, 0, 0);
  kv_score_query *q = make_query(&r, 1, 64, KV_SCORE_SUM);
  kv_score_query *q32 = make_query(&r, 1, 32, KV_SCORE_SUM);
  float out[100];
  uint32_t pos[100];

  /* names of CUDA errors: a table in cudart, no driver needed */
  CHECK(strcmp(kv_score_cuda_error_name(35), "cudaErrorInsufficientDriver") == 0, "name 35: %s",
        kv_score_cuda_error_name(35));
  CHECK(strcmp(kv_score_cuda_error_name(100), "cudaErrorNoDevice") == 0, "name 100: %s",
        kv_score_cuda_error_name(100));
  CHECK(strcmp(kv_score_cuda_error_name(0), "cudaSuccess") == 0, "name 0");
  kv_score_cuda_opts co;
  memset(&co, 0x5a, sizeof co);
  kv_score_cuda_opts_init(&co);
  CHECK(co.stream == NULL, "opts_init: default stream");
  kv_score_cuda_opts_init(NULL);

  /* upload */
  kv_score_cuda_view dv;
  rc = kv_score_cuda_upload(&tv.v, 0, NULL, NULL, &e);
  expect(KV_SCORE_EINVAL, rc, &e, "NULL output view", "upload out NULL");
  memset(&dv, 0x5a, sizeof dv);
  rc = kv_score_cuda_upload(NULL, 0, NULL, &dv, &e);
  expect(KV_SCORE_EINVAL, rc, &e, "NULL view", "upload src NULL");
  CHECK(dv.codes == NULL && dv.owned == NULL && dv.layout.n_tokens == 0, "failed upload zeroes");
  kv_score_view bad = tv.v;
  bad.codes = NULL;
  expect(KV_SCORE_EINVAL, kv_score_cuda_upload(&bad, 0, NULL, &dv, &e), &e, "without codes",
         "upload codes NULL");
  bad = tv.v;
  bad.layout.page_tokens = 16;
  expect(KV_SCORE_EINVAL, kv_score_cuda_upload(&bad, 0, NULL, &dv, &e), &e, "layout",
         "upload bad layout");
  bad = tv.v;
  bad.layout.n_tokens = 1000; /* the rest of the layout no longer matches */
  expect(KV_SCORE_EINVAL, kv_score_cuda_upload(&bad, 0, NULL, &dv, &e), &e, "layout",
         "upload n_tokens changed");
  expect(KV_SCORE_EINVAL, kv_score_cuda_upload(&tv.v, -1, NULL, &dv, &e), &e, "negative",
         "upload device -1");

  /* wrap */
  const uint8_t *fc = (const uint8_t *)(uintptr_t)0x10000;
  const float *fs = (const float *)(uintptr_t)0x20000;
  expect(KV_SCORE_EINVAL, kv_score_cuda_view_wrap(NULL, 10, 8, 8, fc, fs, 0, &e), &e, "NULL output",
         "wrap out NULL");
  expect(KV_SCORE_EINVAL, kv_score_cuda_view_wrap(&dv, 10, 8, 5, fc, fs, 0, &e), &e, "bits",
         "wrap bits 5");
  expect(KV_SCORE_EINVAL, kv_score_cuda_view_wrap(&dv, 10, 0, 8, fc, fs, 0, &e), &e, "head_dim",
         "wrap d 0");
  expect(KV_SCORE_EINVAL, kv_score_cuda_view_wrap(&dv, 10, 7, 4, fc, fs, 0, &e), &e, "even",
         "wrap odd int4");
  expect(KV_SCORE_EINVAL, kv_score_cuda_view_wrap(&dv, 0, 8, 8, fc, fs, 0, &e), &e, "n_tokens",
         "wrap 0 tokens");
  expect(KV_SCORE_EINVAL, kv_score_cuda_view_wrap(&dv, 10, 8, 8, NULL, fs, 0, &e), &e, "NULL codes",
         "wrap codes NULL");
  expect(KV_SCORE_EINVAL, kv_score_cuda_view_wrap(&dv, 10, 8, 8, fc, NULL, 0, &e), &e, "NULL",
         "wrap scales NULL");
  expect(KV_SCORE_EINVAL, kv_score_cuda_view_wrap(&dv, 10, 8, 8, fc, fs, -2, &e), &e, "negative",
         "wrap device -2");

  /* free: NULL, zeroed and wrapped-like views only get zeroed */
  kv_score_cuda_view_free(NULL);
  kv_score_cuda_view fv = fake_dview(10, 8, 8, 0);
  kv_score_cuda_view_free(&fv);
  CHECK(fv.codes == NULL && fv.scales == NULL && fv.layout.n_tokens == 0, "free zeroes the view");

  /* tokens: the device version and the emulation check the same things */
  kv_score_cuda_view d64 = fake_dview(100, 64, 8, 0);
  expect(KV_SCORE_EINVAL, kv_score_cuda_tokens(NULL, &d64, 0, 10, NULL, out, &e), &e, "NULL query",
         "tokens q NULL");
  expect(KV_SCORE_EINVAL, kv_score_cuda_tokens(q, &d64, 0, 10, NULL, NULL, &e), &e, "output",
         "tokens out NULL");
  expect(KV_SCORE_EINVAL, kv_score_cuda_tokens(q, NULL, 0, 10, NULL, out, &e), &e, "NULL view",
         "tokens view NULL");
  expect(KV_SCORE_EINVAL, kv_score_cuda_tokens(q32, &d64, 0, 10, NULL, out, &e), &e, "head_dim",
         "tokens head_dim");
  expect(KV_SCORE_EINVAL, kv_score_cuda_tokens(q, &d64, 95, 10, NULL, out, &e), &e, "past the end",
         "tokens range");
  kv_score_cuda_view dbad = d64;
  dbad.layout.row_bytes = 32;
  expect(KV_SCORE_EINVAL, kv_score_cuda_tokens(q, &dbad, 0, 10, NULL, out, &e), &e, "layout",
         "tokens bad layout");
  dbad = d64;
  dbad.device = -1;
  expect(KV_SCORE_EINVAL, kv_score_cuda_tokens(q, &dbad, 0, 10, NULL, out, &e), &e, "negative",
         "tokens device -1");
  expect(KV_SCORE_EINVAL, kv_score_cuda_emu_tokens(NULL, &tv.v, 0, 10, out, &e), &e, "NULL query",
         "emu tokens q NULL");
  expect(KV_SCORE_EINVAL, kv_score_cuda_emu_tokens(q32, &tv.v, 0, 10, out, &e), &e, "head_dim",
         "emu tokens head_dim");
  expect(KV_SCORE_EINVAL, kv_score_cuda_emu_tokens(q, &tv.v, 50, 51, out, &e), &e, "past the end",
         "emu tokens range");
  expect(KV_SCORE_EINVAL, kv_score_cuda_emu_tokens(q, NULL, 0, 1, out, &e), &e, "NULL view",
         "emu tokens view NULL");

  /* top-k */
  kv_score_cuda_view d64b = fake_dview(50, 64, 4, 1), d32 = fake_dview(100, 32, 8, 0);
  kv_score_cuda_span cs[2] = {{&d64, 0, 100, 0}, {&d64b, 0, 50, 100}};
  expect(KV_SCORE_EINVAL, kv_score_cuda_topk(NULL, cs, 1, 5, NULL, pos, out, NULL, &e), &e,
         "NULL query", "topk q NULL");
  expect(KV_SCORE_EINVAL, kv_score_cuda_topk(q, NULL, 1, 5, NULL, pos, out, NULL, &e), &e,
         "NULL spans", "topk spans NULL");
  expect(KV_SCORE_EINVAL, kv_score_cuda_topk(q, cs, 1, 5, NULL, NULL, NULL, NULL, &e), &e,
         "NULL outputs", "topk outputs NULL");
  expect(KV_SCORE_EINVAL, kv_score_cuda_topk(q, cs, 1, 0, NULL, pos, out, NULL, &e), &e, "k is 0",
         "topk k 0");
  expect(KV_SCORE_EINVAL, kv_score_cuda_topk(q, cs, 1, 101, NULL, pos, out, NULL, &e), &e,
         "larger than", "topk k > N");
  expect(KV_SCORE_EINVAL, kv_score_cuda_topk(q, cs, 0, 1, NULL, pos, out, NULL, &e), &e,
         "larger than", "topk no spans");
  expect(KV_SCORE_EINVAL, kv_score_cuda_topk(q, cs, 2, 5, NULL, pos, out, NULL, &e), &e,
         "different CUDA devices", "topk two devices");
  kv_score_cuda_span c1 = {&d64, 90, 11, 0};
  expect(KV_SCORE_EINVAL, kv_score_cuda_topk(q, &c1, 1, 5, NULL, pos, out, NULL, &e), &e,
         "past the end", "topk span past end");
  c1 = (kv_score_cuda_span){&d64, 0, 100, UINT32_MAX - 50};
  expect(KV_SCORE_EINVAL, kv_score_cuda_topk(q, &c1, 1, 5, NULL, pos, out, NULL, &e), &e,
         "32 bits", "topk positions overflow");
  c1 = (kv_score_cuda_span){&d32, 0, 100, 0};
  expect(KV_SCORE_EINVAL, kv_score_cuda_topk(q, &c1, 1, 5, NULL, pos, out, NULL, &e), &e,
         "head_dim", "topk head_dim");
  c1 = (kv_score_cuda_span){NULL, 0, 100, 0};
  expect(KV_SCORE_EINVAL, kv_score_cuda_topk(q, &c1, 1, 5, NULL, pos, out, NULL, &e), &e,
         "NULL view", "topk view NULL");
  dbad = d64;
  dbad.layout.n_pages = 1;
  c1 = (kv_score_cuda_span){&dbad, 0, 100, 0};
  expect(KV_SCORE_EINVAL, kv_score_cuda_topk(q, &c1, 1, 5, NULL, pos, out, NULL, &e), &e, "layout",
         "topk bad layout");
  dbad = d64;
  dbad.device = -3;
  c1 = (kv_score_cuda_span){&dbad, 0, 100, 0};
  expect(KV_SCORE_EINVAL, kv_score_cuda_topk(q, &c1, 1, 5, NULL, pos, out, NULL, &e), &e,
         "negative", "topk device -3");
  uint32_t n_out = 77;
  kv_score_span hs[1] = {{&tv.v, 0, 100, 0}};
  expect(KV_SCORE_EINVAL, kv_score_cuda_emu_topk(q, hs, 1, 101, pos, out, &n_out, &e), &e,
         "larger than", "emu topk k > N");
  CHECK(n_out == 0, "failed top-k sets n_out = 0");
  expect(KV_SCORE_EINVAL, kv_score_cuda_emu_topk(q, hs, 1, 0, pos, out, NULL, &e), &e, "k is 0",
         "emu topk k 0");
  expect(KV_SCORE_EINVAL, kv_score_cuda_emu_topk(q32, hs, 1, 5, pos, out, NULL, &e), &e,
         "head_dim", "emu topk head_dim");
  expect(KV_SCORE_EINVAL, kv_score_cuda_emu_topk(q, hs, 1, 5, NULL, NULL, NULL, &e), &e,
         "NULL outputs", "emu topk outputs NULL");
  expect(KV_SCORE_EINVAL, kv_score_cuda_emu_topk(q, NULL, 1, 5, pos, out, NULL, &e), &e,
         "NULL spans", "emu topk spans NULL");
  hs[0].first = 1;
  expect(KV_SCORE_EINVAL, kv_score_cuda_emu_topk(q, hs, 1, 5, pos, out, NULL, &e), &e,
         "past the end", "emu topk span past end");

  kv_score_query_free(q);
  kv_score_query_free(q32);
  free_view(&tv);
}

/* ---- no GPU: valid calls fail cleanly with the driver's answer ------------------------------ */

static void test_no_device_paths(void)
{
  kv_score_err e;
  memset(&e, 0, sizeof e);
  int n = -1;
  kv_score_status rc = kv_score_cuda_available(&n, &e);
  if (rc == KV_SCORE_OK) {
    printf("a CUDA device is present (%d): the no-device paths are not reachable here; "
           "`test_score_cuda gpu` runs the device\n", n);
    return;
  }
  char msg[512];
  kv_score_errmsg(&e, msg, sizeof msg);
  printf("no CUDA device: %s [%s]\n", msg, kv_score_cuda_error_name(e.value));
  CHECK(rc == KV_SCORE_EUNSUPPORTED, "available: %s", kv_score_status_name(rc));
  CHECK(n == 0, "available: n_devices %d, want 0", n);
  CHECK(e.what != NULL && strstr(e.what, "cudaGetDeviceCount") != NULL, "message names the call");
  uint64_t code = e.value; /* 35 here (no libcuda.so.1); 100 on a driver without a GPU */

  t_rng r = {4};
  test_view tv;
  make_view(&tv, &r, 300, 128, 8, 0, 0);
  kv_score_query *q = make_query(&r, 2, 128, KV_SCORE_MAX);
  kv_score_cuda_view dv, fake = fake_dview(300, 128, 8, 0);
  float out[300];
  uint32_t pos[300], n_out = 9;
  const uint8_t *fc = (const uint8_t *)(uintptr_t)0x10000;
  const float *fs = (const float *)(uintptr_t)0x20000;
  struct {
    const char *name;
    kv_score_status rc;
  } calls[4];
  memset(&dv, 0x5a, sizeof dv);
  memset(&e, 0, sizeof e);
  calls[0].name = "upload";
  calls[0].rc = kv_score_cuda_upload(&tv.v, 0, NULL, &dv, &e);
  CHECK(dv.owned == NULL && dv.codes == NULL, "failed upload leaves a zeroed view");
  CHECK(e.value == code, "upload: error %llu, want %llu", (unsigned long long)e.value,
        (unsigned long long)code);
  calls[1].name = "wrap";
  calls[1].rc = kv_score_cuda_view_wrap(&dv, 300, 128, 8, fc, fs, 0, &e);
  CHECK(e.value == code, "wrap: error %llu", (unsigned long long)e.value);
  calls[2].name = "tokens";
  calls[2].rc = kv_score_cuda_tokens(q, &fake, 0, 300, NULL, out, &e);
  CHECK(e.value == code, "tokens: error %llu", (unsigned long long)e.value);
  kv_score_cuda_span cs = {&fake, 0, 300, 0};
  calls[3].name = "topk";
  calls[3].rc = kv_score_cuda_topk(q, &cs, 1, 10, NULL, pos, out, &n_out, &e);
  CHECK(n_out == 0, "topk without a device: n_out %u", n_out);
  for (int i = 0; i < 4; i++) {
    CHECK(calls[i].rc == KV_SCORE_EUNSUPPORTED, "%s without a device: %s", calls[i].name,
          kv_score_status_name(calls[i].rc));
  }
  CHECK(e.what != NULL && strstr(e.what, "cudaGetDeviceCount") != NULL, "topk message: %s",
        t_errtext(&e));
  /* tokens of an empty range touch nothing: OK even without a device, as on the CPU */
  CHECK(kv_score_cuda_tokens(q, &fake, 300, 0, NULL, out, &e) == KV_SCORE_OK, "empty range");
  kv_score_query_free(q);
  free_view(&tv);
}

/* ---- host emulation == CPU scorer ----------------------------------------------------------- */

static void test_emu_tokens(void)
{
  t_rng r = {42};
  const uint32_t dims[] = {1, 2, 3, 4, 6, 8, 16, 30, 32, 48, 64, 96, 100, 128, 130, 256, 4096};
  const struct {
    uint32_t heads;
    kv_score_combine c;
  } qs[] = {{1, KV_SCORE_SUM}, {4, KV_SCORE_SUM}, {2, KV_SCORE_MAX}, {8, KV_SCORE_MAX}};
  unsigned compared = 0;
  for (size_t di = 0; di < sizeof dims / sizeof dims[0]; di++) {
    for (unsigned bits = 4; bits <= 8; bits += 4) {
      uint32_t d = dims[di];
      if (bits == 4 && d % 2)
        continue;
      for (int kind = 0; kind < 3; kind++) {
        uint32_t n = d >= 1024 ? 45 : 700;
        test_view tv;
        make_view(&tv, &r, n, d, bits, kind, kind == 1); /* kind 1 also on the byte path */
        float *want = malloc((size_t)n * 4), *got = malloc((size_t)n * 4);
        REQUIRE(want && got, "oom");
        for (size_t qi = 0; qi < sizeof qs / sizeof qs[0]; qi++) {
          kv_score_query *q = make_query(&r, qs[qi].heads, d, qs[qi].c);
          kv_score_err e;
          REQUIRE(kv_score_tokens(q, &tv.v, 0, n, KV_SCORE_IMPL_PORTABLE, want, &e) == KV_SCORE_OK,
                  "cpu: %s", t_errtext(&e));
          uint32_t starts[] = {0, 1, 33, n - 1};
          for (size_t si = 0; si < 4; si++) {
            uint32_t a = starts[si], len = si == 0 ? n : 1 + t_below(&r, n - a);
            memset(got, 0xff, (size_t)n * 4);
            kv_score_status rc = kv_score_cuda_emu_tokens(q, &tv.v, a, len, got, &e);
            CHECK(rc == KV_SCORE_OK, "emu tokens: %s", t_errtext(&e));
            long bad = first_diff(got, want + a, len, 0);
            CHECK(bad < 0, "d=%u bits=%u kind=%d heads=%u comb=%d start=%u: token %ld %.9g != %.9g",
                  d, bits, kind, qs[qi].heads, qs[qi].c, a, a + bad,
                  (double)got[bad < 0 ? 0 : bad], (double)want[a + (bad < 0 ? 0 : bad)]);
            compared += len;
          }
          kv_score_query_free(q);
        }
        free(want);
        free(got);
        free_view(&tv);
      }
    }
  }
  printf("emulated scores equal kv_score_tokens: %u tokens compared\n", compared);
}

static void test_emu_topk(void)
{
  t_rng r = {9};
  const struct {
    uint32_t n, d;
    unsigned bits;
    int kind;
  } shapes[] = {{5000, 128, 8, 0}, {4096, 128, 4, 0}, {3001, 96, 8, 0}, {700, 8, 4, 1},
                {20000, 64, 8, 2}, {2500, 64, 4, 2},  {1000, 3, 8, 0}};
  for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
    uint32_t n = shapes[si].n, d = shapes[si].d;
    test_view tv;
    make_view(&tv, &r, n, d, shapes[si].bits, shapes[si].kind, 0);
    if (shapes[si].kind == 0) { /* a NaN, an infinite and a negative-zero-making scale */
      tv.scales[7] = NAN;
      tv.scales[8] = INFINITY;
      tv.scales[9] = 0.0f;
    }
    for (int qi = 0; qi < 2; qi++) {
      kv_score_query *q =
          make_query(&r, qi ? 4 : 1, d, qi ? KV_SCORE_MAX : KV_SCORE_SUM);
      /* one span, then a random split with a moved position base, then duplicated spans */
      kv_score_span one = {&tv.v, 0, n, 0};
      uint32_t cut = 1 + t_below(&r, n - 1);
      kv_score_span split[3] = {{&tv.v, cut, n - cut, 1000}, {&tv.v, 0, cut, 1000},
                                {&tv.v, 0, n / 3, 7}};
      kv_score_span dup[2] = {{&tv.v, 0, n, 5}, {&tv.v, 0, n, 5}};
      uint32_t ks[] = {1, 2, 7, n / 100 + 1, n / 10, n / 2, n - 1, n};
      for (size_t ki = 0; ki < sizeof ks / sizeof ks[0]; ki++) {
        char label[128];
        snprintf(label, sizeof label, "emu n=%u d=%u bits=%u kind=%d q=%d", n, d, shapes[si].bits,
                 shapes[si].kind, qi);
        emu_ctx c1 = {q, &one, 1}, c2 = {q, split, 3}, c3 = {q, dup, 2};
        compare_topk(label, q, &one, 1, ks[ki], emu_topk, &c1);
        compare_topk(label, q, split, 3, ks[ki], emu_topk, &c2);
        compare_topk(label, q, dup, 2, 2 * ks[ki] - (ki & 1), emu_topk, &c3);
      }
      kv_score_query_free(q);
    }
    free_view(&tv);
  }
  printf("emulated top-k equals kv_score_topk (%u shapes)\n",
         (unsigned)(sizeof shapes / sizeof shapes[0]));
}

/* Llama-shaped keys: 8 KV heads x 128 dims of f16 from bench/datagen.c, quantized into score
 * copies by kv_score_copy_encode() and parsed back, as the engine stores them. */
typedef struct llama_set {
  uint32_t n, H, d;
  uint16_t *kv;
  uint8_t *copies[2][8]; /* [int8, int4][head] */
  kv_score_view views[2][8];
} llama_set;

static void llama_make(llama_set *s, uint32_t n)
{
  memset(s, 0, sizeof *s);
  s->n = n;
  s->H = 8;
  s->d = 128;
  dg_kv_model dm;
  REQUIRE(dg_kv_model_init(&dm, 1, s->H, s->d, 11) == 0, "datagen");
  uint32_t *tok = malloc((size_t)n * 4);
  s->kv = malloc((size_t)n * dg_kv_token_bytes(&dm));
  REQUIRE(tok && s->kv, "oom");
  dg_tokens(tok, n, 5, 32000);
  REQUIRE(dg_kv_fill_f16(&dm, tok, n, s->kv) == 0, "fill");
  for (int b = 0; b < 2; b++) {
    unsigned bits = b ? 4 : 8;
    for (uint32_t h = 0; h < s->H; h++) {
      kv_score_layout l;
      REQUIRE(kv_score_layout_init(&l, n, s->d, bits, NULL) == KV_SCORE_OK, "layout");
      REQUIRE(posix_memalign((void **)&s->copies[b][h], 4096, (size_t)l.total_bytes) == 0, "oom");
      kv_score_err e;
      size_t len = 0;
      /* [layer][K,V][token][head][dim]: K of head h, token t at (t * H + h) * d */
      REQUIRE(kv_score_copy_encode(KV_SCORE_F16, s->kv + (size_t)h * s->d,
                                   (size_t)s->H * s->d * 2, n, s->d, bits, s->copies[b][h],
                                   (size_t)l.total_bytes, &len, &e) == KV_SCORE_OK,
              "encode: %s", t_errtext(&e));
      REQUIRE(kv_score_copy_parse(s->copies[b][h], len, &s->views[b][h], &e) == KV_SCORE_OK,
              "parse: %s", t_errtext(&e));
    }
  }
  free(tok);
  dg_kv_model_free(&dm);
}

static void llama_free(llama_set *s)
{
  for (int b = 0; b < 2; b++)
    for (uint32_t h = 0; h < s->H; h++)
      free(s->copies[b][h]);
  free(s->kv);
}

/* A GQA query of G heads near the key of a random token of KV head h. */
static kv_score_query *llama_query(const llama_set *s, t_rng *r, uint32_t h, uint32_t G,
                                   kv_score_combine c)
{
  float *qf = malloc((size_t)G * s->d * 4);
  REQUIRE(qf != NULL, "oom");
  for (uint32_t g = 0; g < G; g++) {
    uint32_t p = t_below(r, s->n);
    for (uint32_t j = 0; j < s->d; j++)
      qf[g * s->d + j] =
          kv_score_f16_to_f32(s->kv[((size_t)p * s->H + h) * s->d + j]) + t_gauss(r) * 0.5f;
  }
  kv_score_query *q = NULL;
  kv_score_err e;
  REQUIRE(kv_score_query_create(KV_SCORE_F32, qf, G, s->d, (size_t)s->d * 4, c, &q, &e) ==
              KV_SCORE_OK,
          "query: %s", t_errtext(&e));
  free(qf);
  return q;
}

static void test_emu_llama(void)
{
  llama_set s;
  llama_make(&s, 4096);
  t_rng r = {21};
  float *want = malloc((size_t)s.n * 4), *got = malloc((size_t)s.n * 4);
  REQUIRE(want && got, "oom");
  for (int b = 0; b < 2; b++) {
    for (uint32_t h = 0; h < s.H; h += 3) {
      for (int ci = 0; ci < 2; ci++) {
        kv_score_combine c = ci ? KV_SCORE_MAX : KV_SCORE_SUM;
        kv_score_query *q = llama_query(&s, &r, h, 4, c);
        kv_score_err e;
        REQUIRE(kv_score_tokens(q, &s.views[b][h], 0, s.n, KV_SCORE_IMPL_AUTO, want, &e) ==
                    KV_SCORE_OK,
                "cpu: %s", t_errtext(&e));
        CHECK(kv_score_cuda_emu_tokens(q, &s.views[b][h], 0, s.n, got, &e) == KV_SCORE_OK,
              "emu: %s", t_errtext(&e));
        long bad = first_diff(got, want, s.n, 0);
        CHECK(bad < 0, "llama bits=%d head=%u comb=%d: token %ld differs", b ? 4 : 8, h, ci, bad);
        kv_score_span one = {&s.views[b][h], 0, s.n, 0};
        emu_ctx ctx = {q, &one, 1};
        uint32_t ks[] = {s.n / 100, s.n / 20, s.n / 10};
        for (int ki = 0; ki < 3; ki++) {
          char label[96];
          snprintf(label, sizeof label, "llama emu bits=%d head=%u comb=%d", b ? 4 : 8, h, ci);
          compare_topk(label, q, &one, 1, ks[ki], emu_topk, &ctx);
        }
        kv_score_query_free(q);
      }
    }
  }
  printf("emulation on Llama-shaped quantized keys: int8 and int4, SUM and MAX, k = 1/5/10%%\n");
  free(want);
  free(got);
  llama_free(&s);
}

/* ---- on a GPU ------------------------------------------------------------------------------- */

typedef struct gpu_ctx {
  const kv_score_query *q;
  const kv_score_cuda_span *spans;
  size_t n_spans;
} gpu_ctx;

static kv_score_status gpu_topk(void *ctx, uint32_t k, uint32_t *pos, float *scores,
                                uint32_t *n_out, kv_score_err *err)
{
  const gpu_ctx *c = ctx;
  return kv_score_cuda_topk(c->q, c->spans, c->n_spans, k, NULL, pos, scores, n_out, err);
}

static void gpu_compare_view(const char *label, const kv_score_query *q, const kv_score_view *hv,
                             const kv_score_cuda_view *dv, t_rng *r)
{
  uint32_t n = hv->layout.n_tokens;
  float *want = malloc((size_t)n * 4), *got = malloc((size_t)n * 4);
  REQUIRE(want && got, "oom");
  kv_score_err e;
  REQUIRE(kv_score_tokens(q, hv, 0, n, KV_SCORE_IMPL_AUTO, want, &e) == KV_SCORE_OK, "cpu: %s",
          t_errtext(&e));
  kv_score_status rc = kv_score_cuda_tokens(q, dv, 0, n, NULL, got, &e);
  CHECK(rc == KV_SCORE_OK, "%s: cuda tokens: %s [%s]", label, t_errtext(&e),
        kv_score_cuda_error_name(e.value));
  if (rc == KV_SCORE_OK) {
    long bad = first_diff(got, want, n, 1);
    CHECK(bad < 0, "%s: token %ld: gpu %.9g, cpu %.9g", label, bad, (double)got[bad < 0 ? 0 : bad],
          (double)want[bad < 0 ? 0 : bad]);
  }
  uint32_t a = t_below(r, n), len = t_below(r, n - a + 1);
  rc = kv_score_cuda_tokens(q, dv, a, len, NULL, got, &e);
  CHECK(rc == KV_SCORE_OK && first_diff(got, want + a, len, 1) < 0, "%s: sub-range %u+%u", label,
        a, len);
  kv_score_span hs = {hv, 0, n, 0};
  kv_score_cuda_span ds = {dv, 0, n, 0};
  gpu_ctx ctx = {q, &ds, 1};
  uint32_t ks[] = {1, 5, n / 100 + 1, n / 10 + 1, n / 2, n};
  for (size_t ki = 0; ki < sizeof ks / sizeof ks[0]; ki++)
    compare_topk(label, q, &hs, 1, ks[ki], gpu_topk, &ctx);
  /* two spans: a random cut with moved positions */
  uint32_t cut = n > 1 ? 1 + t_below(r, n - 1) : 0;
  kv_score_span hs2[2] = {{hv, cut, n - cut, 10}, {hv, 0, cut, 10}};
  kv_score_cuda_span ds2[2] = {{dv, cut, n - cut, 10}, {dv, 0, cut, 10}};
  gpu_ctx ctx2 = {q, ds2, 2};
  compare_topk(label, q, hs2, 2, n / 7 + 1, gpu_topk, &ctx2);
  free(want);
  free(got);
}

static int run_gpu(void)
{
  kv_score_err e;
  memset(&e, 0, sizeof e);
  int n_dev = 0;
  kv_score_status rc = kv_score_cuda_available(&n_dev, &e);
  if (rc != KV_SCORE_OK) {
    char msg[512];
    kv_score_errmsg(&e, msg, sizeof msg);
    printf("SKIP: no CUDA device to run on. Checked cudaGetDeviceCount through "
           "kv_score_cuda_available(): %s -> %s [%s]. The host-side checks are "
           "`test_score_cuda host`.\n",
           kv_score_status_name(rc), msg,
           e.value ? kv_score_cuda_error_name(e.value) : "0 devices");
    return T_EXIT_SKIP;
  }
  printf("CUDA devices: %d; running on device 0\n", n_dev);
  t_rng r = {77};

  /* random views of every kind, uploaded; and the same device memory wrapped */
  const struct {
    uint32_t n, d;
    unsigned bits;
    int kind, misalign;
  } shapes[] = {{5000, 128, 8, 0, 0}, {4096, 128, 4, 0, 1}, {3001, 96, 8, 1, 1},
                {700, 8, 4, 1, 0},    {20000, 64, 8, 2, 0}, {1000, 3, 8, 0, 0},
                {45, 4096, 8, 0, 0},  {300, 130, 4, 0, 0}};
  for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
    test_view tv;
    make_view(&tv, &r, shapes[si].n, shapes[si].d, shapes[si].bits, shapes[si].kind,
              shapes[si].misalign);
    tv.scales[shapes[si].n / 2] = NAN;
    kv_score_cuda_view dv, wv;
    rc = kv_score_cuda_upload(&tv.v, 0, NULL, &dv, &e);
    REQUIRE(rc == KV_SCORE_OK, "upload: %s [%s]", t_errtext(&e), kv_score_cuda_error_name(e.value));
    rc = kv_score_cuda_view_wrap(&wv, dv.layout.n_tokens, dv.layout.head_dim, dv.layout.bits,
                                 dv.codes, dv.scales, 0, &e);
    CHECK(rc == KV_SCORE_OK && wv.owned == NULL, "wrap of uploaded memory: %s", t_errtext(&e));
    for (int qi = 0; qi < 3; qi++) {
      kv_score_query *q = make_query(&r, qi == 0 ? 1 : qi == 1 ? 4 : 8, shapes[si].d,
                                     qi == 2 ? KV_SCORE_MAX : KV_SCORE_SUM);
      char label[128];
      snprintf(label, sizeof label, "gpu n=%u d=%u bits=%u kind=%d q=%d", shapes[si].n,
               shapes[si].d, shapes[si].bits, shapes[si].kind, qi);
      gpu_compare_view(label, q, &tv.v, &dv, &r);
      if (qi == 0 && rc == KV_SCORE_OK)
        gpu_compare_view("wrapped", q, &tv.v, &wv, &r);
      kv_score_query_free(q);
    }
    kv_score_cuda_view_free(&wv);
    kv_score_cuda_view_free(&dv);
    CHECK(dv.owned == NULL && dv.codes == NULL, "free zeroes");
    free_view(&tv);
  }

  /* Llama-shaped quantized keys: two heads' copies as two spans of one top-k */
  llama_set s;
  llama_make(&s, 8192);
  for (int b = 0; b < 2; b++) {
    kv_score_cuda_view dv[2];
    for (int h = 0; h < 2; h++)
      REQUIRE(kv_score_cuda_upload(&s.views[b][h], 0, NULL, &dv[h], &e) == KV_SCORE_OK,
              "upload: %s", t_errtext(&e));
    for (int ci = 0; ci < 2; ci++) {
      kv_score_query *q = llama_query(&s, &r, 0, 4, ci ? KV_SCORE_MAX : KV_SCORE_SUM);
      gpu_compare_view("llama", q, &s.views[b][0], &dv[0], &r);
      kv_score_span hs[2] = {{&s.views[b][0], 0, s.n, 0}, {&s.views[b][1], 0, s.n, s.n}};
      kv_score_cuda_span ds[2] = {{&dv[0], 0, s.n, 0}, {&dv[1], 0, s.n, s.n}};
      gpu_ctx ctx = {q, ds, 2};
      uint32_t ks[] = {2 * s.n / 100, 2 * s.n / 20, 2 * s.n / 10};
      for (int ki = 0; ki < 3; ki++)
        compare_topk("llama two heads", q, hs, 2, ks[ki], gpu_topk, &ctx);
      kv_score_query_free(q);
    }
    kv_score_cuda_view_free(&dv[0]);
    kv_score_cuda_view_free(&dv[1]);
  }
  llama_free(&s);

  /* a long section: the histogram and collect kernels loop over their grid */
  {
    test_view tv;
    make_view(&tv, &r, 1u << 21, 128, 8, 0, 0);
    kv_score_cuda_view dv;
    REQUIRE(kv_score_cuda_upload(&tv.v, 0, NULL, &dv, &e) == KV_SCORE_OK, "upload: %s",
            t_errtext(&e));
    kv_score_query *q = make_query(&r, 1, 128, KV_SCORE_SUM);
    kv_score_span hs = {&tv.v, 0, tv.v.layout.n_tokens, 0};
    kv_score_cuda_span ds = {&dv, 0, dv.layout.n_tokens, 0};
    gpu_ctx ctx = {q, &ds, 1};
    compare_topk("gpu 2M tokens", q, &hs, 1, 1000, gpu_topk, &ctx);
    compare_topk("gpu 2M tokens", q, &hs, 1, 1u << 18, gpu_topk, &ctx);
    kv_score_query_free(q);
    kv_score_cuda_view_free(&dv);
    free_view(&tv);
  }

  /* device error paths */
  {
    test_view tv;
    make_view(&tv, &r, 100, 64, 8, 0, 0);
    kv_score_cuda_view dv;
    expect(KV_SCORE_EINVAL, kv_score_cuda_upload(&tv.v, n_dev, NULL, &dv, &e), &e,
           "past the devices", "upload to a missing device");
    expect(KV_SCORE_EINVAL,
           kv_score_cuda_view_wrap(&dv, 100, 64, 8, tv.codes, tv.scales, 0, &e), &e,
           "can read", "wrap of pageable host memory");
    free_view(&tv);
  }
  return t_finish("test_score_cuda gpu");
}

int main(int argc, char **argv)
{
  if (argc != 2 || (strcmp(argv[1], "host") != 0 && strcmp(argv[1], "gpu") != 0)) {
    fprintf(stderr, "usage: test_score_cuda host|gpu\n");
    return 2;
  }
  if (strcmp(argv[1], "gpu") == 0)
    return run_gpu();
  test_arg_errors();
  test_no_device_paths();
  test_emu_tokens();
  test_emu_topk();
  test_emu_llama();
  return t_finish("test_score_cuda host");
}
