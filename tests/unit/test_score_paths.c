/* SPDX-License-Identifier: MIT */
/*
 * tests/unit/test_score_paths.c — score: every kernel path (portable, AVX2, AVX-512 VNNI,
 * whichever this CPU has) gives bit-identical scores, equal to the score defined in score.h
 * computed here independently from the query's public codes and scales; on random code bytes
 * (int8 -128 and int4 nibble 0 included), all head dims 2..4096 (pages with and without padding),
 * 1..8 query vectors, any start and length. Then the streaming top-k: equal to a sort-based
 * oracle under the documented order (ties by position, -0 below +0, NaN last), for every k,
 * thread count, kernel path and span split; the accumulator under random push orders and merges,
 * and at large k on score shapes that stress its histogram and its radix finish (run it with
 * KVDB_SCORE_IMPL=portable / avx2 too: tests score-paths-portable, score-paths-avx2).
 */
#define _POSIX_C_SOURCE 200809L
#include "score_test.h"

#include <math.h>

static const kv_score_impl IMPLS[] = {KV_SCORE_IMPL_PORTABLE, KV_SCORE_IMPL_AVX2,
                                      KV_SCORE_IMPL_AVX512};
#define N_IMPLS 3

/* The score of score.h "SCORE OF TOKEN t", from public data only. */
static float ref_score(const kv_score_query *q, const uint8_t *row, uint32_t d, unsigned bits,
                       float scale)
{
  float m = 0;
  for (uint32_t v = 0; v < kv_score_query_n_vec(q); v++) {
    const int8_t *c = kv_score_query_codes(q, v);
    int64_t dot = 0;
    for (uint32_t j = 0; j < d; j++) {
      int k = bits == 8 ? (int8_t)row[j]
                        : (j % 2 == 0 ? (row[j / 2] & 15) - 8 : (row[j / 2] >> 4) - 8);
      dot += (int64_t)c[j] * k;
    }
    float part = (float)(int32_t)dot * kv_score_query_scale(q, v);
    m = v == 0 ? part : (part > m ? part : m);
  }
  return m * scale;
}

typedef struct test_view {
  kv_score_view v;
  uint8_t *codes;
  float *scales;
} test_view;

static void make_view(test_view *tv, t_rng *r, uint32_t n, uint32_t d, unsigned bits, int extreme)
{
  kv_score_layout l;
  REQUIRE(kv_score_layout_init(&l, n, d, bits, NULL) == KV_SCORE_OK, "layout n=%u d=%u", n, d);
  size_t cb = (size_t)l.n_pages * 4096;
  REQUIRE(posix_memalign((void **)&tv->codes, 64, cb) == 0, "oom");
  tv->scales = malloc((size_t)n * 4);
  for (size_t i = 0; i < cb; i++) {
    uint8_t b = (uint8_t)t_next(r);
    if (extreme == 1)
      b = (i & 1) ? 0x80 : 0x7f; /* int8 -128 / 127; int4 nibbles 0 / 8, 15 / 7 */
    if (extreme == 2)
      b = 0x80; /* all -128 (int8); nibbles 0 and 8 (int4) */
    tv->codes[i] = b;
  }
  for (uint32_t t = 0; t < n; t++) {
    uint32_t c = t_below(r, 10);
    tv->scales[t] = c == 0 ? 0.0f : c == 1 ? 1e-30f : c == 2 ? 3e4f : (float)(t_unif(r) * 0.05);
  }
  REQUIRE(kv_score_view_init(&tv->v, n, d, bits, tv->codes, tv->scales, NULL) == KV_SCORE_OK,
          "view");
}

static void free_view(test_view *tv)
{
  free(tv->codes);
  free(tv->scales);
}

static kv_score_query *make_query(t_rng *r, uint32_t heads, uint32_t d, kv_score_combine c,
                                  int extreme)
{
  float *qf = malloc((size_t)heads * d * 4);
  for (size_t i = 0; i < (size_t)heads * d; i++)
    qf[i] = extreme ? ((i & 1) ? 7.0f : -7.0f) : t_gauss(r) * (i % 9 == 0 ? 10.0f : 1.0f);
  kv_score_query *q = NULL;
  kv_score_err e;
  REQUIRE(kv_score_query_create(KV_SCORE_F32, qf, heads, d, (size_t)d * 4, c, &q, &e) ==
              KV_SCORE_OK,
          "query: %s", t_errtext(&e));
  free(qf);
  return q;
}

static void test_paths_equal(void)
{
  t_rng r = {42};
  const uint32_t dims[] = {2, 4, 6, 8, 16, 30, 32, 48, 64, 96, 100, 128, 192, 256, 320, 512, 4096};
  const struct {
    uint32_t heads;
    kv_score_combine c;
  } qs[] = {{1, KV_SCORE_SUM}, {4, KV_SCORE_SUM}, {2, KV_SCORE_MAX}, {3, KV_SCORE_MAX},
            {8, KV_SCORE_MAX}};
  int n_impl = 0;
  for (int i = 0; i < N_IMPLS; i++)
    if (kv_score_impl_available(IMPLS[i])) {
      printf("path %s available\n", kv_score_impl_name(IMPLS[i]));
      n_impl++;
    }
  CHECK(kv_score_impl_available(KV_SCORE_IMPL_PORTABLE), "portable always available");
  for (size_t di = 0; di < sizeof dims / sizeof dims[0]; di++) {
    for (unsigned bits = 4; bits <= 8; bits += 4) {
      uint32_t d = dims[di];
      if (bits == 4 && d % 2)
        continue;
      for (int extreme = 0; extreme < 3; extreme++) {
        uint32_t n = d >= 1024 ? 37 : 1000 + (uint32_t)extreme;
        test_view tv;
        make_view(&tv, &r, n, d, bits, extreme);
        for (size_t qi = 0; qi < sizeof qs / sizeof qs[0]; qi++) {
          kv_score_query *q = make_query(&r, qs[qi].heads, d, qs[qi].c, extreme);
          float *want = malloc((size_t)n * 4), *got = malloc((size_t)n * 4);
          for (uint32_t t = 0; t < n; t++)
            want[t] = ref_score(q, tv.codes + kv_score_layout_code_offset(&tv.v.layout, t) -
                                       tv.v.layout.meta_bytes,
                                d, bits, tv.scales[t]);
          for (int ii = 0; ii < N_IMPLS; ii++) {
            if (!kv_score_impl_available(IMPLS[ii]))
              continue;
            /* whole range, then odd sub-ranges (tails of 1..15 rows, page cuts) */
            uint32_t starts[] = {0, 1, 15, 33, n / 2, n - 1};
            for (size_t si = 0; si < sizeof starts / sizeof starts[0]; si++) {
              uint32_t a = starts[si], len = si == 0 ? n : (uint32_t)(1 + t_below(&r, n - a));
              memset(got, 0xff, (size_t)n * 4);
              kv_score_err e;
              kv_score_status rc = kv_score_tokens(q, &tv.v, a, len, IMPLS[ii], got, &e);
              REQUIRE(rc == KV_SCORE_OK, "score: %s", t_errtext(&e));
              int bad = -1;
              for (uint32_t t = 0; t < len && bad < 0; t++)
                if (memcmp(&got[t], &want[a + t], 4) != 0)
                  bad = (int)t;
              CHECK(bad < 0,
                    "%s d=%u bits=%u extreme=%d heads=%u comb=%d start=%u: token %d got %.9g want "
                    "%.9g",
                    kv_score_impl_name(IMPLS[ii]), d, bits, extreme, qs[qi].heads, qs[qi].c, a,
                    a + bad, (double)got[bad < 0 ? 0 : bad], (double)want[a + (bad < 0 ? 0 : bad)]);
            }
          }
          free(want);
          free(got);
          kv_score_query_free(q);
        }
        free_view(&tv);
      }
    }
  }
  printf("paths compared: %d\n", n_impl);
}

/* SUM of the heads equals one query with the summed heads (same quantization). */
static void test_sum_is_summed_query(void)
{
  t_rng r = {5};
  uint32_t d = 64, G = 4;
  float qf[4 * 64], qs[64];
  for (uint32_t j = 0; j < d; j++) {
    double s = 0;
    for (uint32_t g = 0; g < G; g++) {
      qf[g * d + j] = t_gauss(&r);
      s += qf[g * d + j];
    }
    qs[j] = (float)s;
  }
  kv_score_query *a, *b;
  kv_score_query_create(KV_SCORE_F32, qf, G, d, d * 4, KV_SCORE_SUM, &a, NULL);
  kv_score_query_create(KV_SCORE_F32, qs, 1, d, 0, KV_SCORE_SUM, &b, NULL);
  CHECK(kv_score_query_n_vec(a) == 1, "SUM collapses to one vector");
  CHECK(memcmp(kv_score_query_codes(a, 0), kv_score_query_codes(b, 0), d) == 0 &&
            kv_score_query_scale(a, 0) == kv_score_query_scale(b, 0),
        "SUM of heads = the summed query");
  /* f16 query equals the f32 query of the same values */
  uint16_t qh[64];
  float qr[64];
  for (uint32_t j = 0; j < d; j++) {
    qh[j] = kv_score_f32_to_f16(qf[j]);
    qr[j] = kv_score_f16_to_f32(qh[j]);
  }
  kv_score_query *c, *e2;
  kv_score_query_create(KV_SCORE_F16, qh, 1, d, 0, KV_SCORE_SUM, &c, NULL);
  kv_score_query_create(KV_SCORE_F32, qr, 1, d, 0, KV_SCORE_SUM, &e2, NULL);
  CHECK(memcmp(kv_score_query_codes(c, 0), kv_score_query_codes(e2, 0), d) == 0 &&
            kv_score_query_scale(c, 0) == kv_score_query_scale(e2, 0),
        "f16 query = f32 query of the same values");
  kv_score_query_free(a);
  kv_score_query_free(b);
  kv_score_query_free(c);
  kv_score_query_free(e2);
}

/* ---- top-k -------------------------------------------------------------------------------- */

static void test_topk_oracle(void)
{
  t_rng r = {9};
  const uint32_t shapes[][3] = {{5000, 128, 8}, {4096, 128, 4}, {3001, 96, 8}, {700, 8, 4},
                                {20000, 64, 8}};
  for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
    uint32_t n = shapes[si][0], d = shapes[si][1], bits = shapes[si][2];
    test_view tv;
    make_view(&tv, &r, n, d, bits, 0);
    /* many exact ties: scales from a small set, a block of identical rows */
    for (uint32_t t = 0; t < n; t++)
      tv.scales[t] = (float)(1 + t_below(&r, 3)) * 0.01f;
    kv_score_layout *l = &tv.v.layout;
    for (uint32_t t = 100; t < 160 && t < n; t++)
      memcpy(tv.codes + kv_score_layout_code_offset(l, t) - l->meta_bytes,
             tv.codes + kv_score_layout_code_offset(l, 99) - l->meta_bytes, l->row_bytes);
    kv_score_query *q = make_query(&r, 2, d, si % 2 ? KV_SCORE_MAX : KV_SCORE_SUM, 0);
    float *all = malloc((size_t)n * 4);
    REQUIRE(kv_score_tokens(q, &tv.v, 0, n, KV_SCORE_IMPL_PORTABLE, all, NULL) == KV_SCORE_OK, "all");
    uint32_t pos_base = 1000;
    kv_score_pair *oracle = malloc((size_t)n * sizeof *oracle);
    for (uint32_t t = 0; t < n; t++) {
      oracle[t].pos = pos_base + t;
      oracle[t].score = all[t];
    }
    t_sort_pairs(oracle, n);
    uint32_t ks[] = {1, 2, 7, n / 100 + 1, n / 20, n / 10, n / 2, n - 1, n};
    uint32_t *pos = malloc((size_t)n * 4);
    float *sc = malloc((size_t)n * 4);
    for (size_t ki = 0; ki < sizeof ks / sizeof ks[0]; ki++) {
      uint32_t k = ks[ki];
      for (int ii = 0; ii < N_IMPLS; ii++) {
        if (!kv_score_impl_available(IMPLS[ii]))
          continue;
        for (unsigned th = 1; th <= 4; th++) {
          /* split into 1..5 spans at random points */
          kv_score_span sp[5];
          uint32_t ns = 1 + t_below(&r, 5), cut[6];
          cut[0] = 0;
          cut[ns] = n;
          for (uint32_t i = 1; i < ns; i++)
            cut[i] = cut[i - 1] + t_below(&r, n - cut[i - 1] + 1);
          for (uint32_t i = 0; i < ns; i++)
            sp[i] = (kv_score_span){&tv.v, cut[i], cut[i + 1] - cut[i], pos_base};
          kv_score_opts o;
          kv_score_opts_init(&o);
          o.impl = IMPLS[ii];
          o.n_threads = th;
          uint32_t got = 0;
          kv_score_err e;
          REQUIRE(kv_score_topk(q, sp, ns, k, &o, NULL, 0, pos, sc, &got, &e) == KV_SCORE_OK,
                  "topk: %s", t_errtext(&e));
          int bad = -1;
          for (uint32_t i = 0; i < k && bad < 0; i++)
            if (pos[i] != oracle[i].pos || memcmp(&sc[i], &oracle[i].score, 4) != 0)
              bad = (int)i;
          CHECK(got == k && bad < 0,
                "shape %zu k=%u %s threads=%u spans=%u: rank %d got (%u, %.9g) want (%u, %.9g)", si,
                k, kv_score_impl_name(IMPLS[ii]), th, ns, bad, pos[bad < 0 ? 0 : bad],
                (double)sc[bad < 0 ? 0 : bad], oracle[bad < 0 ? 0 : bad].pos,
                (double)oracle[bad < 0 ? 0 : bad].score);
        }
      }
    }
    /* auto threads with a tiny per-thread size, caller scratch */
    kv_score_opts o;
    kv_score_opts_init(&o);
    o.min_thread_bytes = 4096;
    kv_score_span whole = {&tv.v, 0, n, pos_base};
    uint32_t k = n / 10;
    size_t sb = kv_score_topk_scratch_bytes(k, 0);
    void *scratch = malloc(sb);
    uint32_t got;
    REQUIRE(kv_score_topk(q, &whole, 1, k, &o, scratch, sb, pos, sc, &got, NULL) == KV_SCORE_OK,
            "auto");
    int same = 1;
    for (uint32_t i = 0; i < k; i++)
      same &= pos[i] == oracle[i].pos;
    CHECK(same, "auto threads + caller scratch = oracle");
    free(scratch);
    free(pos);
    free(sc);
    free(oracle);
    free(all);
    kv_score_query_free(q);
    free_view(&tv);
  }
}

static void test_acc(void)
{
  t_rng r = {77};
  uint32_t n = 20000;
  kv_score_pair *p = malloc(n * sizeof *p), *o = malloc(n * sizeof *o);
  for (uint32_t i = 0; i < n; i++) {
    p[i].pos = i * 3 + 11;
    uint32_t c = t_below(&r, 40);
    p[i].score = c == 0 ? NAN : c == 1 ? -0.0f : c == 2 ? 0.0f : c == 3 ? INFINITY
               : c == 4 ? -INFINITY : (float)t_below(&r, 50) - 25.0f;
  }
  memcpy(o, p, n * sizeof *p);
  t_sort_pairs(o, n);
  /* NaN last, -0 right below +0 */
  CHECK(isnan(o[n - 1].score), "NaN ranks last");
  CHECK(kv_score_better(5, 0.0f, 1, -0.0f) && !kv_score_better(1, -0.0f, 5, 0.0f), "+0 above -0");
  CHECK(kv_score_better(1, 2.0f, 2, 2.0f) && !kv_score_better(2, 2.0f, 1, 2.0f), "ties by position");
  CHECK(kv_score_better(9, -INFINITY, 1, NAN), "NaN below -inf");
  uint32_t ks[] = {1, 3, 100, 2000, n};
  uint32_t *pos = malloc(n * 4);
  float *sc = malloc(n * 4);
  for (size_t ki = 0; ki < sizeof ks / sizeof ks[0]; ki++) {
    uint32_t k = ks[ki];
    void *mem = malloc(kv_score_acc_bytes(k)), *mem2 = malloc(kv_score_acc_bytes(k));
    for (int round = 0; round < 4; round++) {
      /* shuffle, then push in random-sized pieces through the three entry points, with a merge */
      for (uint32_t i = n - 1; i > 0; i--) {
        uint32_t j = t_below(&r, i + 1);
        kv_score_pair t = p[i];
        p[i] = p[j];
        p[j] = t;
      }
      kv_score_acc a, b;
      REQUIRE(kv_score_acc_init(&a, k, mem, kv_score_acc_bytes(k), NULL) == KV_SCORE_OK, "init");
      REQUIRE(kv_score_acc_init(&b, k, mem2, kv_score_acc_bytes(k), NULL) == KV_SCORE_OK, "init");
      for (uint32_t i = 0; i < n;) {
        uint32_t m = 1 + t_below(&r, 300);
        if (m > n - i)
          m = n - i;
        kv_score_acc *dst = (i / 997) % 2 ? &a : &b;
        if (round % 2)
          kv_score_acc_push_pairs(dst, p + i, m);
        else
          for (uint32_t j = 0; j < m; j++)
            kv_score_acc_push(dst, p[i + j].pos, p[i + j].score);
        i += m;
      }
      kv_score_acc_merge(&a, &b);
      uint32_t got = kv_score_acc_finish(&a, pos, sc);
      int bad = -1;
      for (uint32_t i = 0; i < k && bad < 0; i++) {
        int same_score = memcmp(&sc[i], &o[i].score, 4) == 0 || (isnan(sc[i]) && isnan(o[i].score));
        if (pos[i] != o[i].pos || !same_score)
          bad = (int)i;
      }
      CHECK(got == k && bad < 0, "acc k=%u round %d: rank %d", k, round, bad);
    }
    free(mem);
    free(mem2);
  }
  /* push_scores in pieces of any length (the float pre-filter, scalar or AVX-512, with NaN,
   * infinities, signed zeros and ties) against the sorted oracle */
  {
    float *s = malloc(n * 4);
    for (uint32_t i = 0; i < n; i++) {
      uint32_t c = t_below(&r, 40);
      s[i] = c == 0 ? NAN : c == 1 ? -0.0f : c == 2 ? 0.0f : c == 3 ? INFINITY
           : c == 4 ? -INFINITY : (float)t_below(&r, 5000) * 0.01f - 25.0f;
      o[i].pos = 7 + i;
      o[i].score = s[i];
    }
    t_sort_pairs(o, n);
    for (size_t ki = 0; ki < sizeof ks / sizeof ks[0]; ki++) {
      uint32_t k = ks[ki];
      void *mem = malloc(kv_score_acc_bytes(k));
      kv_score_acc a;
      REQUIRE(kv_score_acc_init(&a, k, mem, kv_score_acc_bytes(k), NULL) == KV_SCORE_OK, "init");
      for (uint32_t i = 0; i < n;) {
        uint32_t m = 1 + t_below(&r, 600);
        if (m > n - i)
          m = n - i;
        kv_score_acc_push_scores(&a, 7 + i, s + i, m);
        i += m;
      }
      uint32_t got = kv_score_acc_finish(&a, pos, sc);
      int bad = -1;
      for (uint32_t i = 0; i < k && bad < 0; i++) {
        int same_score = memcmp(&sc[i], &o[i].score, 4) == 0 || (isnan(sc[i]) && isnan(o[i].score));
        if (pos[i] != o[i].pos || !same_score)
          bad = (int)i;
      }
      CHECK(got == k && bad < 0, "push_scores k=%u: rank %d", k, bad);
      free(mem);
    }
    free(s);
  }
  /* push_scores: positions pos_base + i */
  {
    uint64_t mem[2 * 10 + 256];
    kv_score_acc a;
    REQUIRE(sizeof mem == kv_score_acc_bytes(10), "acc bytes");
    kv_score_acc_init(&a, 10, mem, sizeof mem, NULL);
    float s[100];
    for (int i = 0; i < 100; i++)
      s[i] = (float)(i % 10);
    kv_score_acc_push_scores(&a, 500, s, 100);
    uint32_t got = kv_score_acc_finish(&a, pos, sc);
    CHECK(got == 10 && pos[0] == 509 && pos[1] == 519 && pos[9] == 599 && sc[0] == 9.0f,
          "push_scores ties: %u %u %u", pos[0], pos[1], pos[9]);
    /* fewer candidates than k */
    kv_score_acc_init(&a, 10, mem, sizeof mem, NULL);
    kv_score_acc_push_scores(&a, 0, s, 3);
    CHECK(kv_score_acc_finish(&a, pos, NULL) == 3 && pos[0] == 2, "fewer than k");
  }
  free(pos);
  free(sc);
  free(p);
  free(o);
}

/* Score shapes for test_acc_shapes: token i of n. */
static float shape_score(int shape, uint32_t i, uint32_t n, t_rng *r)
{
  switch (shape) {
  case 0: return 800.0f + 60.0f * t_gauss(r); /* the bench's: a large offset, a narrow spread */
  case 1: return 2.0f + 0.1f * (float)(t_unif(r) - 0.5); /* straddles a power of two */
  case 2: return i % 9973 == 5 ? 1e30f : t_gauss(r);  /* far outliers: the rest in one step */
  case 3: return (float)t_below(r, 20);               /* 20 values: long runs of ties */
  case 4: return (float)i * (60.0f / (float)n) + 0.01f * t_gauss(r); /* rising: past the armed range */
  case 5: return -(float)i;                           /* falling: nothing after the start */
  case 6: {                                           /* NaN, infinities, zeros, subnormals */
    uint32_t c = t_below(r, 12);
    return c == 0 ? NAN : c == 1 ? -0.0f : c == 2 ? 0.0f : c == 3 ? INFINITY
         : c == 4 ? -INFINITY : c == 5 ? 1e-40f : c == 6 ? -1e-40f : t_gauss(r);
  }
  case 7: return 3.0f;                                /* all equal: positions decide */
  case 8: return 1.0f + (float)t_below(r, 64) * 1.1920929e-7f; /* adjacent floats */
  case 9: return ((i / 3000) % 2 ? 1000.0f : -1000.0f) + t_gauss(r); /* two clusters */
  default: return ldexpf(1.0f + (float)t_unif(r), (int)(i / 500) - 60); /* many octaves */
  }
}

/* The accumulator at large k: its histogram (buckets set on the entries' range, the threshold at
 * bucket floors, set up again after a selection and after a finish), the candidate path of
 * this run (KVDB_SCORE_IMPL: AVX-512, AVX2 or scalar) and the radix finish (runs of equal steps,
 * long runs, the boundary) on shapes that stress each, against the sorted oracle: pushed in
 * pieces of any length, in two halves with a finish between (the accumulator stays usable), and
 * as two accumulators merged. */
static void test_acc_shapes(void)
{
  t_rng r = {4242};
  const uint32_t n = 60000, base = 5;
  float *s = malloc(n * 4);
  kv_score_pair *o = malloc(n * sizeof *o), *oh = malloc(n * sizeof *oh);
  uint32_t *pos = malloc(n * 4);
  float *sc = malloc(n * 4);
  const uint32_t ks[] = {1024, 1500, 4096, n / 10, n / 2, n - 1, n};
  for (int shape = 0; shape <= 10; shape++) {
    for (uint32_t i = 0; i < n; i++) {
      s[i] = shape_score(shape, i, n, &r);
      o[i].pos = base + i;
      o[i].score = s[i];
    }
    memcpy(oh, o, (n / 2) * sizeof *o);
    t_sort_pairs(o, n);
    t_sort_pairs(oh, n / 2);
    for (size_t ki = 0; ki < sizeof ks / sizeof ks[0]; ki++) {
      uint32_t k = ks[ki];
      void *mem = malloc(kv_score_acc_bytes(k)), *mem2 = malloc(kv_score_acc_bytes(k));
      for (int mode = 0; mode < 3; mode++) {
        kv_score_acc a, b;
        REQUIRE(kv_score_acc_init(&a, k, mem, kv_score_acc_bytes(k), NULL) == KV_SCORE_OK, "init");
        REQUIRE(kv_score_acc_init(&b, k, mem2, kv_score_acc_bytes(k), NULL) == KV_SCORE_OK, "init");
        int bad_half = -1;
        for (uint32_t i = 0; i < n;) {
          uint32_t m = 1 + t_below(&r, 700);
          if (m > n - i)
            m = n - i;
          if (mode == 1 && i < n / 2 && i + m > n / 2)
            m = n / 2 - i;
          kv_score_acc_push_scores(mode == 2 && (i / 1000) % 2 ? &b : &a, base + i, s + i, m);
          i += m;
          if (mode == 1 && i == n / 2) {
            uint32_t kh = k < n / 2 ? k : n / 2;
            uint32_t got = kv_score_acc_finish(&a, pos, sc);
            for (uint32_t j = 0; j < kh && bad_half < 0; j++)
              if (pos[j] != oh[j].pos || !(memcmp(&sc[j], &oh[j].score, 4) == 0 ||
                                           (isnan(sc[j]) && isnan(oh[j].score))))
                bad_half = (int)j;
            if (got != kh && bad_half < 0)
              bad_half = (int)got;
          }
        }
        if (mode == 2)
          kv_score_acc_merge(&a, &b);
        uint32_t got = kv_score_acc_finish(&a, pos, sc);
        int bad = -1;
        for (uint32_t j = 0; j < k && bad < 0; j++)
          if (pos[j] != o[j].pos ||
              !(memcmp(&sc[j], &o[j].score, 4) == 0 || (isnan(sc[j]) && isnan(o[j].score))))
            bad = (int)j;
        CHECK(got == k && bad < 0 && bad_half < 0,
              "acc shape %d k=%u mode %d: got %u, rank %d (%u, %.9g; oracle %u, %.9g), half %d",
              shape, k, mode, got, bad, pos[bad < 0 ? 0 : bad], (double)sc[bad < 0 ? 0 : bad],
              o[bad < 0 ? 0 : bad].pos, (double)o[bad < 0 ? 0 : bad].score, bad_half);
      }
      free(mem);
      free(mem2);
    }
  }
  free(s);
  free(o);
  free(oh);
  free(pos);
  free(sc);
}

int main(void)
{
  test_paths_equal();
  test_sum_is_summed_query();
  test_topk_oracle();
  test_acc();
  test_acc_shapes();
  return t_finish("test_score_paths");
}
