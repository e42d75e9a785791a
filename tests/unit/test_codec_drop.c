/* SPDX-License-Identifier: MIT */
/*
 * tests/unit/test_codec_drop.c — token selection (knorm, keydiff, snapkv) against brute-force
 * oracles, and the "drop" codec: positions, kept rows, drop + quantize, bad and corrupt input.
 */
#include "codec_int.h"
#include "kvgen.h"

#include <math.h>

static kv_section_shape shape_of(kv_codec_dtype dt, kv_section_kind kind, uint32_t n, uint32_t d)
{
  kv_section_shape s = {dt, kind, n, d};
  return s;
}

static uint32_t *select_keep(kv_drop_method m, const kv_section_shape *s, const void *k,
                             size_t len, unsigned permille, const kv_snapkv_window *w,
                             uint32_t *n_keep)
{
  kv_codec_err e = {0};
  size_t scr = kv_drop_scratch_bytes(m, s->n_tokens, s->head_dim, w);
  CHECK(scr > 0);
  void *scratch = kt_xmalloc(scr);
  uint32_t *pos = kt_xmalloc(sizeof(uint32_t) * s->n_tokens);
  CHECK_OK(e, kv_drop_select(m, s, k, len, permille, w, scratch, scr, pos, s->n_tokens, n_keep, &e));
  CHECK(*n_keep == kv_drop_keep_count(s->n_tokens, permille));
  for (uint32_t i = 1; i < *n_keep; i++)
    CHECK(pos[i] > pos[i - 1]);
  CHECK(pos[*n_keep - 1] < s->n_tokens);
  free(scratch);
  return pos;
}

/* Oracle check: the kept set is exactly the k best by score (higher = keep), ties -> earlier. */
static void check_exact_topk(const double *score, uint32_t n, const uint32_t *pos, uint32_t k)
{
  uint8_t *kept = calloc(n, 1);
  for (uint32_t i = 0; i < k; i++)
    kept[pos[i]] = 1;
  for (uint32_t i = 0; i < n; i++) {
    uint32_t rank = 0; /* tokens that beat i */
    for (uint32_t j = 0; j < n; j++)
      if (score[j] > score[i] || (score[j] == score[i] && j < i))
        rank++;
    CHECK(kept[i] == (rank < k));
  }
  free(kept);
}

/* Oracle check with a tolerance for float-versus-double scoring: every kept token scores at
 * least as well as every dropped one, up to tol; and where the oracle's margin at the cut is
 * wider than tol, the sets are equal. Returns the number of tokens compared. */
static void check_topk_tol(const double *score, uint32_t n, const uint8_t *kept, double tol)
{
  double min_kept = INFINITY, max_dropped = -INFINITY;
  for (uint32_t i = 0; i < n; i++) {
    if (kept[i])
      min_kept = fmin(min_kept, score[i]);
    else
      max_dropped = fmax(max_dropped, score[i]);
  }
  if (!(min_kept >= max_dropped - tol))
    fprintf(stderr, "worst kept %.12g < best dropped %.12g - %.3g\n", min_kept, max_dropped, tol);
  CHECK(min_kept >= max_dropped - tol);
}

TEST(keep_counts)
{
  CHECK(kv_drop_keep_count(10, 100) == 1 && kv_drop_keep_count(10, 500) == 5);
  CHECK(kv_drop_keep_count(10, 900) == 9 && kv_drop_keep_count(10, 1000) == 10);
  CHECK(kv_drop_keep_count(7, 500) == 4 && kv_drop_keep_count(3, 100) == 1);
  CHECK(kv_drop_keep_count(1, 100) == 1 && kv_drop_keep_count(1000, 300) == 300);
  CHECK(kv_drop_keep_count(0, 500) == 0 && kv_drop_keep_count(10, 0) == 0);
  CHECK(kv_drop_keep_count(10, 1001) == 0);
}

TEST(knorm_keeps_lowest_norms)
{
  static const kv_codec_dtype dts[] = {KV_CODEC_F16, KV_CODEC_BF16, KV_CODEC_F32};
  for (size_t di = 0; di < 3; di++) {
    uint32_t n = 400, d = 64;
    size_t len, es = kv_codec_dtype_bytes(dts[di]);
    uint8_t *k = kvgen_section(dts[di], KV_SECTION_K, 5 + di, n, d, &len);
    /* ties: tokens 10..14 are copies of token 3 */
    for (uint32_t t = 10; t < 15; t++)
      memcpy(k + (size_t)t * d * es, k + (size_t)3 * d * es, d * es);
    kv_section_shape s = shape_of(dts[di], KV_SECTION_K, n, d);
    float *f = kt_xmalloc(sizeof(float) * n * d);
    kv_codec_to_f32(dts[di], k, (size_t)n * d, f);
    double *score = kt_xmalloc(sizeof(double) * n);
    for (uint32_t t = 0; t < n; t++) {
      double ss = 0;
      for (uint32_t j = 0; j < d; j++)
        ss += (double)f[(size_t)t * d + j] * f[(size_t)t * d + j];
      score[t] = -ss; /* lower norm scores higher; the square keeps the order */
    }
    for (unsigned pm = 100; pm <= 1000; pm += 100) {
      uint32_t nk;
      uint32_t *pos = select_keep(KV_DROP_KNORM, &s, k, len, pm, NULL, &nk);
      check_exact_topk(score, n, pos, nk);
      free(pos);
    }
    free(score);
    free(f);
    free(k);
  }
}

TEST(keydiff_keeps_least_similar)
{
  uint32_t n = 300, d = 128;
  size_t len;
  void *k = kvgen_section(KV_CODEC_F16, KV_SECTION_K, 9, n, d, &len);
  kv_section_shape s = shape_of(KV_CODEC_F16, KV_SECTION_K, n, d);
  float *f = kt_xmalloc(sizeof(float) * n * d);
  kv_codec_to_f32(KV_CODEC_F16, k, (size_t)n * d, f);
  /* the oracle is the paper's wording: the mean cosine similarity of a key to all other keys */
  double *norm = kt_xmalloc(sizeof(double) * n), *score = kt_xmalloc(sizeof(double) * n);
  for (uint32_t i = 0; i < n; i++) {
    double ss = 0;
    for (uint32_t j = 0; j < d; j++)
      ss += (double)f[(size_t)i * d + j] * f[(size_t)i * d + j];
    norm[i] = sqrt(ss);
  }
  for (uint32_t i = 0; i < n; i++) {
    double sum = 0;
    for (uint32_t t = 0; t < n; t++) {
      if (t == i)
        continue;
      double dp = 0;
      for (uint32_t j = 0; j < d; j++)
        dp += (double)f[(size_t)i * d + j] * f[(size_t)t * d + j];
      sum += dp / (norm[i] * norm[t]);
    }
    score[i] = -sum / (n - 1); /* keep the least similar */
  }
  uint8_t *kept = kt_xmalloc(n);
  for (unsigned pm = 100; pm < 1000; pm += 100) {
    uint32_t nk;
    uint32_t *pos = select_keep(KV_DROP_KEYDIFF, &s, k, len, pm, NULL, &nk);
    memset(kept, 0, n);
    for (uint32_t i = 0; i < nk; i++)
      kept[pos[i]] = 1;
    check_topk_tol(score, n, kept, 1e-12);
    free(pos);
  }
  free(kept);
  free(norm);
  free(score);
  free(f);
  free(k);
}

/* SnapKV oracle in double, straight from the definition in codec.h. */
static void snap_oracle(const float *kf, uint32_t n, uint32_t d, const kv_snapkv_window *w,
                        double *pooled, uint32_t *len_out)
{
  uint32_t len = w->tail_window ? n - w->n_obs : n;
  double *sc = calloc(n, sizeof(double)), *l = kt_xmalloc(sizeof(double) * n);
  for (uint32_t r = 0; r < w->n_obs * w->n_q_heads; r++) {
    const float *q = w->q + (size_t)r * d;
    uint32_t obs = r / w->n_q_heads;
    uint32_t vis = w->tail_window ? n - w->n_obs + obs + 1 : n;
    double m = -INFINITY, sum = 0;
    for (uint32_t i = 0; i < vis; i++) {
      double dp = 0;
      for (uint32_t j = 0; j < d; j++)
        dp += (double)q[j] * kf[(size_t)i * d + j];
      l[i] = dp / sqrt((double)d);
      m = fmax(m, l[i]);
    }
    for (uint32_t i = 0; i < vis; i++)
      sum += exp(l[i] - m);
    for (uint32_t i = 0; i < vis && i < len; i++)
      sc[i] += exp(l[i] - m) / sum;
  }
  unsigned kernel = w->kernel ? w->kernel : 7;
  int h = (int)kernel / 2;
  for (int i = 0; i < (int)len; i++) {
    double acc = w->pool == KV_POOL_MAX ? -INFINITY : 0;
    for (int j = i - h; j <= i + h; j++) {
      if (j < 0 || j >= (int)len)
        continue; /* max pool ignores padding; avg pool counts it as zero */
      acc = w->pool == KV_POOL_MAX ? fmax(acc, sc[j]) : acc + sc[j];
    }
    pooled[i] = w->pool == KV_POOL_MAX ? acc : acc / kernel;
  }
  *len_out = len;
  free(sc);
  free(l);
}

TEST(snapkv_matches_oracle)
{
  uint32_t n = 256, d = 64;
  size_t len;
  void *k = kvgen_section(KV_CODEC_F16, KV_SECTION_K, 13, n, d, &len);
  kv_section_shape s = shape_of(KV_CODEC_F16, KV_SECTION_K, n, d);
  float *kf = kt_xmalloc(sizeof(float) * n * d);
  kv_codec_to_f32(KV_CODEC_F16, k, (size_t)n * d, kf);
  static const struct {
    uint32_t n_obs, heads;
    unsigned kernel;
    kv_pool pool;
    int tail;
    unsigned permille;
  } cases[] = {
    {8, 4, 0, KV_POOL_MAX, 0, 500}, {8, 4, 0, KV_POOL_AVG, 0, 300}, {16, 1, 1, KV_POOL_MAX, 0, 200},
    {4, 2, 3, KV_POOL_AVG, 1, 500}, {32, 4, 7, KV_POOL_MAX, 1, 100}, {32, 1, 5, KV_POOL_AVG, 1, 900},
    {64, 2, 7, KV_POOL_MAX, 1, 100}, /* keeps fewer than the window: the most recent ones */
  };
  double *pooled = kt_xmalloc(sizeof(double) * n);
  uint8_t *kept = kt_xmalloc(n);
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    float *q = kt_xmalloc(sizeof(float) * cases[c].n_obs * cases[c].heads * d);
    kvgen_gauss(100 + c, (size_t)cases[c].n_obs * cases[c].heads * d, 1.0f, q);
    if (cases[c].tail) /* the window's queries resemble its own keys, as in a real prompt */
      for (uint32_t o = 0; o < cases[c].n_obs; o++)
        for (uint32_t h = 0; h < cases[c].heads; h++)
          for (uint32_t j = 0; j < d; j++)
            q[((size_t)o * cases[c].heads + h) * d + j] =
              0.5f * q[((size_t)o * cases[c].heads + h) * d + j] +
              0.3f * kf[(size_t)(n - cases[c].n_obs + o) * d + j];
    kv_snapkv_window w = {q, cases[c].n_obs, cases[c].heads, cases[c].kernel, cases[c].pool,
                          cases[c].tail};
    uint32_t nk, plen;
    uint32_t *pos = select_keep(KV_DROP_SNAPKV, &s, k, len, cases[c].permille, &w, &nk);
    snap_oracle(kf, n, d, &w, pooled, &plen);
    memset(kept, 0, n);
    for (uint32_t i = 0; i < nk; i++)
      kept[pos[i]] = 1;
    uint32_t window_kept = 0;
    if (cases[c].tail) {
      uint32_t wk = cases[c].n_obs < nk ? cases[c].n_obs : nk;
      for (uint32_t t = n - wk; t < n; t++) /* the window (its most recent part) is kept */
        CHECK(kept[t]);
      for (uint32_t t = n - cases[c].n_obs; t < n - wk; t++)
        CHECK(!kept[t]);
      window_kept = wk;
    }
    uint32_t prefix_kept = 0;
    for (uint32_t t = 0; t < plen; t++)
      prefix_kept += kept[t];
    CHECK(prefix_kept == nk - window_kept);
    double mx = 0;
    for (uint32_t t = 0; t < plen; t++)
      mx = fmax(mx, pooled[t]);
    if (prefix_kept > 0 && prefix_kept < plen)
      check_topk_tol(pooled, plen, kept, 1e-5 * mx);
    free(pos);
    free(q);
  }
  /* deterministic */
  float *q = kt_xmalloc(sizeof(float) * 8 * d);
  kvgen_gauss(1, (size_t)8 * d, 1.0f, q);
  kv_snapkv_window w = {q, 8, 1, 0, KV_POOL_MAX, 0};
  uint32_t n1, n2;
  uint32_t *a = select_keep(KV_DROP_SNAPKV, &s, k, len, 400, &w, &n1);
  uint32_t *b = select_keep(KV_DROP_SNAPKV, &s, k, len, 400, &w, &n2);
  CHECK(n1 == n2 && memcmp(a, b, n1 * sizeof(uint32_t)) == 0);
  free(a);
  free(b);
  free(q);
  free(kept);
  free(pooled);
  free(kf);
  free(k);
}

TEST(select_argument_errors)
{
  kv_codec_err e = {0};
  uint32_t n = 64, d = 32, pos[64], nk;
  size_t len;
  void *k = kvgen_section(KV_CODEC_F16, KV_SECTION_K, 1, n, d, &len);
  kv_section_shape s = shape_of(KV_CODEC_F16, KV_SECTION_K, n, d);
  float q[4 * 32];
  kvgen_gauss(2, 4 * 32, 1.0f, q);
  kv_snapkv_window w = {q, 4, 1, 0, KV_POOL_MAX, 0};
  size_t scr = kv_drop_scratch_bytes(KV_DROP_SNAPKV, n, d, &w);
  void *scratch = kt_xmalloc(scr);
  kv_section_shape v = s;
  v.kind = KV_SECTION_V;
  CHECK_RC(KV_CODEC_EINVAL, e, kv_drop_select(KV_DROP_KNORM, &v, k, len, 500, NULL, scratch, scr, pos, n, &nk, &e));
  CHECK(kt_msg_has(&e, "K section"));
  CHECK_RC(KV_CODEC_EINVAL, e, kv_drop_select(KV_DROP_SNAPKV, &s, k, len, 500, NULL, scratch, scr, pos, n, &nk, &e));
  CHECK(kt_msg_has(&e, "observation window"));
  CHECK_RC(KV_CODEC_EINVAL, e, kv_drop_select(KV_DROP_KNORM, &s, k, len, 500, &w, scratch, scr, pos, n, &nk, &e));
  CHECK_RC(KV_CODEC_EINVAL, e, kv_drop_select(KV_DROP_NONE, &s, k, len, 500, NULL, scratch, scr, pos, n, &nk, &e));
  CHECK_RC(KV_CODEC_EINVAL, e, kv_drop_select(KV_DROP_KNORM, &s, k, len, 0, NULL, scratch, scr, pos, n, &nk, &e));
  CHECK_RC(KV_CODEC_EINVAL, e, kv_drop_select(KV_DROP_KNORM, &s, k, len, 1001, NULL, scratch, scr, pos, n, &nk, &e));
  CHECK_RC(KV_CODEC_EINVAL, e, kv_drop_select(KV_DROP_KNORM, &s, k, len, 500, NULL, scratch, scr, pos, 31, &nk, &e));
  CHECK_RC(KV_CODEC_EINVAL, e, kv_drop_select(KV_DROP_KNORM, &s, k, len - 1, 500, NULL, scratch, scr, pos, n, &nk, &e));
  CHECK_RC(KV_CODEC_ENOMEM, e, kv_drop_select(KV_DROP_SNAPKV, &s, k, len, 500, &w, scratch, scr - 1, pos, n, &nk, &e));
  kv_snapkv_window bad = w;
  bad.kernel = 4; /* even */
  CHECK_RC(KV_CODEC_EINVAL, e, kv_drop_select(KV_DROP_SNAPKV, &s, k, len, 500, &bad, scratch, scr, pos, n, &nk, &e));
  CHECK(kv_drop_scratch_bytes(KV_DROP_SNAPKV, n, d, &bad) == 0);
  bad = w;
  bad.pool = (kv_pool)2;
  CHECK_RC(KV_CODEC_EINVAL, e, kv_drop_select(KV_DROP_SNAPKV, &s, k, len, 500, &bad, scratch, scr, pos, n, &nk, &e));
  bad = w;
  bad.tail_window = 1;
  bad.n_obs = 65;
  CHECK_RC(KV_CODEC_EINVAL, e, kv_drop_select(KV_DROP_SNAPKV, &s, k, len, 500, &bad, scratch, scr, pos, n, &nk, &e));
  bad = w;
  bad.q = NULL;
  CHECK_RC(KV_CODEC_EINVAL, e, kv_drop_select(KV_DROP_SNAPKV, &s, k, len, 500, &bad, scratch, scr, pos, n, &nk, &e));
  CHECK(kv_drop_scratch_bytes(KV_DROP_KNORM, 0, d, NULL) == 0);
  free(scratch);
  free(k);
}

/* ---- the drop codec ---------------------------------------------------------------------------- */

TEST(drop_codec_keeps_rows_and_positions)
{
  kv_codec_err e = {0};
  uint32_t n = 333, d = 96;
  size_t len, es = 2;
  uint8_t *k = kvgen_section(KV_CODEC_F16, KV_SECTION_K, 21, n, d, &len);
  uint8_t *v = kvgen_section(KV_CODEC_F16, KV_SECTION_V, 22, n, d, &len);
  kv_section_shape sk = shape_of(KV_CODEC_F16, KV_SECTION_K, n, d);
  kv_section_shape sv = shape_of(KV_CODEC_F16, KV_SECTION_V, n, d);
  uint32_t nk;
  uint32_t *pos = select_keep(KV_DROP_KNORM, &sk, k, len, 500, NULL, &nk);
  kv_codec_params p;
  kv_codec_params_init(&p);
  p.keep_pos = pos;
  p.n_keep = nk;
  p.keep_permille = 500;
  p.drop_method = KV_DROP_KNORM;
  size_t nek, nev;
  uint8_t *ek = kt_encode(KV_CODEC_ID_DROP, &sk, k, len, &p, &nek);
  uint8_t *ev = kt_encode(KV_CODEC_ID_DROP, &sv, v, len, &p, &nev);
  CHECK(nek == 32 + (n + 7) / 8 + 4 * ((nk + 31) / 32) + (size_t)nk * d * es);
  kv_section_info ik, iv;
  uint8_t *dk = kt_decode(ek, nek, &ik), *dv = kt_decode(ev, nev, &iv);
  CHECK(ik.n_rows == nk && iv.n_rows == nk && ik.shape.n_tokens == n);
  size_t hb; /* the bitmap is part of the header */
  CHECK_OK(e, kv_section_header_bytes(ek, KV_SECTION_FIXED_BYTES, &hb, &e));
  CHECK(hb == ik.header_bytes && hb == 32 + (n + 7) / 8 + 4 * (size_t)ik.n_groups);
  CHECK(ik.params.drop_method == KV_DROP_KNORM && ik.params.keep_permille == 500);
  CHECK(ik.params.page_tokens == 32); /* 16 rows of 96 f16 stay under 4 KiB, 32 reach it */
  for (uint32_t i = 0; i < nk; i++) { /* the kept rows, exactly, in token order */
    CHECK(memcmp(dk + (size_t)i * d * es, k + (size_t)pos[i] * d * es, d * es) == 0);
    CHECK(memcmp(dv + (size_t)i * d * es, v + (size_t)pos[i] * d * es, d * es) == 0);
  }
  /* decode says which tokens survive, the same for K and V */
  uint32_t *pk = kt_xmalloc(4 * nk), *pv = kt_xmalloc(4 * nk);
  CHECK_OK(e, kv_section_positions(ek, nek, 0, nk, pk, &e));
  CHECK_OK(e, kv_section_positions(ev, ik.header_bytes, 0, nk, pv, &e));
  CHECK(memcmp(pk, pos, 4 * nk) == 0 && memcmp(pv, pos, 4 * nk) == 0);
  CHECK_OK(e, kv_section_positions(ek, nek, 7, 3, pk, &e));
  CHECK(pk[0] == pos[7] && pk[2] == pos[9]);
  uint32_t ki = 0;
  for (uint32_t t = 0; t < n; t++) {
    uint32_t row;
    CHECK_OK(e, kv_section_row_of_token(ek, nek, t, &row, &e));
    if (ki < nk && pos[ki] == t)
      CHECK(row == ki++);
    else
      CHECK(row == KV_SECTION_DROPPED);
  }
  /* partial decode of one group */
  uint64_t off, glen;
  CHECK_OK(e, kv_section_group_span(ek, nek, 2, 3, &off, &glen, &e));
  uint8_t *part = kt_xmalloc(glen), *scr = kt_xmalloc(64);
  CHECK_OK(e, kv_section_decode_groups(ek, ik.header_bytes, ek + off, glen, 2, 3, scr, 64, part,
                                       glen, &e));
  CHECK(memcmp(part, dk + (size_t)64 * d * es, glen) == 0);
  free(part);
  free(scr);
  free(pk);
  free(pv);
  free(dk);
  free(dv);
  free(ek);
  free(ev);
  free(pos);
  free(k);
  free(v);
}

TEST(drop_then_quantize_equals_kivi_of_kept_rows)
{
  uint32_t n = 500, d = 128;
  size_t len, es = 2;
  uint8_t *k = kvgen_section(KV_CODEC_BF16, KV_SECTION_K, 31, n, d, &len);
  kv_section_shape sk = shape_of(KV_CODEC_BF16, KV_SECTION_K, n, d);
  for (int kind = 0; kind < 2; kind++) {
    sk.kind = (kv_section_kind)kind;
    uint32_t nk;
    kv_section_shape sel = sk;
    sel.kind = KV_SECTION_K;
    uint32_t *pos = select_keep(KV_DROP_KEYDIFF, &sel, k, len, 300, NULL, &nk);
    kv_codec_params p;
    kv_codec_params_init(&p);
    p.keep_pos = pos;
    p.n_keep = nk;
    p.keep_permille = 300;
    p.drop_method = KV_DROP_KEYDIFF;
    p.bits = 4;
    p.residual = 12;
    size_t ne, nq;
    uint8_t *enc = kt_encode(KV_CODEC_ID_DROP, &sk, k, len, &p, &ne);
    kv_section_info info;
    uint8_t *dec = kt_decode(enc, ne, &info);
    CHECK(info.params.bits == 4 && info.params.group == 32 && info.params.residual == 12);
    /* the kept rows gathered and quantized by kivi give the same rows */
    uint8_t *g = kt_xmalloc((size_t)nk * d * es);
    for (uint32_t i = 0; i < nk; i++)
      memcpy(g + (size_t)i * d * es, k + (size_t)pos[i] * d * es, d * es);
    kv_section_shape sg = shape_of(KV_CODEC_BF16, sk.kind, nk, d);
    kv_codec_params q;
    kv_codec_params_init(&q);
    q.bits = 4;
    q.residual = 12;
    uint8_t *qenc = kt_encode(KV_CODEC_ID_KIVI, &sg, g, (size_t)nk * d * es, &q, &nq);
    uint8_t *qdec = kt_decode(qenc, nq, &info);
    CHECK(memcmp(dec, qdec, (size_t)nk * d * es) == 0);
    /* and the payloads match byte for byte after the headers */
    CHECK(ne - (32 + (n + 7) / 8) == nq - 32);
    CHECK(memcmp(enc + 32 + (n + 7) / 8, qenc + 32, nq - 32) == 0);
    free(g);
    free(qenc);
    free(qdec);
    free(enc);
    free(dec);
    free(pos);
  }
  free(k);
}

TEST(drop_codec_argument_errors)
{
  kv_codec_err e = {0};
  uint32_t n = 40, d = 16;
  size_t len;
  void *k = kvgen_section(KV_CODEC_F16, KV_SECTION_K, 3, n, d, &len);
  kv_section_shape s = shape_of(KV_CODEC_F16, KV_SECTION_K, n, d);
  uint8_t *dst = kt_xmalloc(1 << 16), *scr = kt_xmalloc(1 << 16);
  const kv_codec *c = &kv_codec_drop;
  uint32_t pos[5] = {1, 5, 9, 20, 39};
  kv_codec_params p;
  kv_codec_params_init(&p);
  p.keep_pos = pos;
  p.n_keep = 5;
  p.keep_permille = 100;
  p.drop_method = KV_DROP_KNORM;
  size_t n_out;
  CHECK_OK(e, kv_codec_encode(c, &s, k, len, &p, scr, 1 << 16, dst, 1 << 16, &n_out, &e));
  kv_codec_params q = p;
  uint32_t unsorted[3] = {5, 1, 9};
  q.keep_pos = unsorted;
  q.n_keep = 3;
  CHECK_RC(KV_CODEC_EINVAL, e, kv_codec_encode(c, &s, k, len, &q, scr, 1 << 16, dst, 1 << 16, &n_out, &e));
  CHECK(kt_msg_has(&e, "strictly increasing"));
  uint32_t dup[3] = {1, 1, 9};
  q.keep_pos = dup;
  CHECK_RC(KV_CODEC_EINVAL, e, kv_codec_encode(c, &s, k, len, &q, scr, 1 << 16, dst, 1 << 16, &n_out, &e));
  uint32_t beyond[2] = {3, 40};
  q.keep_pos = beyond;
  q.n_keep = 2;
  CHECK_RC(KV_CODEC_EINVAL, e, kv_codec_encode(c, &s, k, len, &q, scr, 1 << 16, dst, 1 << 16, &n_out, &e));
  CHECK(kt_msg_has(&e, "beyond the tokens"));
  q = p;
  q.keep_pos = NULL;
  CHECK_RC(KV_CODEC_EINVAL, e, kv_codec_encode(c, &s, k, len, &q, scr, 1 << 16, dst, 1 << 16, &n_out, &e));
  CHECK(kv_codec_bound(c, &s, &q) > 0); /* sizing works without positions */
  q = p;
  q.n_keep = 0;
  CHECK_RC(KV_CODEC_EINVAL, e, kv_codec_encode(c, &s, k, len, &q, scr, 1 << 16, dst, 1 << 16, &n_out, &e));
  q = p;
  q.drop_method = KV_DROP_NONE;
  CHECK_RC(KV_CODEC_EINVAL, e, kv_codec_encode(c, &s, k, len, &q, scr, 1 << 16, dst, 1 << 16, &n_out, &e));
  q = p;
  q.keep_permille = 0;
  CHECK_RC(KV_CODEC_EINVAL, e, kv_codec_encode(c, &s, k, len, &q, scr, 1 << 16, dst, 1 << 16, &n_out, &e));
  q = p;
  q.bits = 4;
  q.group = 8; /* larger than the 5 kept rows of K */
  CHECK_RC(KV_CODEC_EINVAL, e, kv_codec_encode(c, &s, k, len, &q, scr, 1 << 16, dst, 1 << 16, &n_out, &e));
  CHECK(kt_msg_has(&e, "larger than the tokens (value 8, limit 5)"));
  q = p;
  q.residual = 1; /* residual without quantization */
  CHECK_RC(KV_CODEC_EINVAL, e, kv_codec_encode(c, &s, k, len, &q, scr, 1 << 16, dst, 1 << 16, &n_out, &e));
  size_t bound = kv_codec_bound(c, &s, &p);
  CHECK_RC(KV_CODEC_ETOOSMALL, e, kv_codec_encode(c, &s, k, len, &p, scr, 1 << 16, dst, bound - 1, &n_out, &e));
  free(dst);
  free(scr);
  free(k);
}

TEST(drop_corrupt_rejected)
{
  kv_codec_err e = {0};
  uint32_t n = 45, d = 16;
  size_t len;
  void *k = kvgen_section(KV_CODEC_F16, KV_SECTION_K, 3, n, d, &len);
  kv_section_shape s = shape_of(KV_CODEC_F16, KV_SECTION_K, n, d);
  uint32_t pos[6] = {0, 4, 8, 15, 30, 44};
  kv_codec_params p;
  kv_codec_params_init(&p);
  p.keep_pos = pos;
  p.n_keep = 6;
  p.keep_permille = 150;
  p.drop_method = KV_DROP_SNAPKV;
  for (unsigned bits = 0; bits <= 4; bits += 4) {
    p.bits = bits;
    size_t ne;
    uint8_t *enc = kt_encode(KV_CODEC_ID_DROP, &s, k, len, &p, &ne);
    CHECK(kt_try_decode(enc, ne, &e) == KV_CODEC_OK);
    uint8_t *b = kt_xmalloc(ne);
    for (size_t cut = 0; cut < ne; cut++)
      CHECK_RC(KV_CODEC_ECORRUPT, e, kt_try_decode(enc, cut, &e));
    memcpy(b, enc, ne);
    b[32] ^= 2; /* keep one more token than rows */
    CHECK_RC(KV_CODEC_ECORRUPT, e, kt_try_decode(b, ne, &e));
    CHECK(kt_msg_has(&e, "keep bitmap count"));
    memcpy(b, enc, ne);
    b[32 + 5] |= 0x80; /* token 47 of 45 */
    CHECK_RC(KV_CODEC_ECORRUPT, e, kt_try_decode(b, ne, &e));
    CHECK(kt_msg_has(&e, "past the tokens"));
    memcpy(b, enc, ne);
    kv_codec_put_le32(b + 12, 46); /* more rows than tokens */
    CHECK_RC(KV_CODEC_ECORRUPT, e, kt_try_decode(b, ne, &e));
    memcpy(b, enc, ne);
    b[21] = 4; /* unknown method */
    CHECK_RC(KV_CODEC_ECORRUPT, e, kt_try_decode(b, ne, &e));
    memcpy(b, enc, ne);
    kv_codec_put_le16(b + 28, 1001);
    CHECK_RC(KV_CODEC_ECORRUPT, e, kt_try_decode(b, ne, &e));
    memcpy(b, enc, ne);
    kv_codec_put_le32(b + 32 + 6, 0xfffffff0u); /* oversized group length */
    CHECK_RC(KV_CODEC_ECORRUPT, e, kt_try_decode(b, ne, &e));
    kvgen_rng r = {bits + 5};
    for (int i = 0; i < 2000; i++) {
      memcpy(b, enc, ne);
      b[kvgen_next(&r) % ne] ^= (uint8_t)(1u << (kvgen_next(&r) % 8));
      kv_codec_status rc = kt_try_decode(b, ne, &e);
      CHECK(rc == KV_CODEC_OK || rc == KV_CODEC_ECORRUPT);
    }
    free(b);
    free(enc);
  }
  free(k);
}

int main(void)
{
  RUN(keep_counts);
  RUN(knorm_keeps_lowest_norms);
  RUN(keydiff_keeps_least_similar);
  RUN(snapkv_matches_oracle);
  RUN(select_argument_errors);
  RUN(drop_codec_keeps_rows_and_positions);
  RUN(drop_then_quantize_equals_kivi_of_kept_rows);
  RUN(drop_codec_argument_errors);
  RUN(drop_corrupt_rejected);
  printf("%d passed, 0 failed\n", kt_passed);
  return T_EXIT_PASS;
}
