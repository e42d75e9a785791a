/* SPDX-License-Identifier: MIT */
/*
 * tests/unit/test_codec_quality.c — the attention-output quality proxy: known answers, the
 * derived probes, and the quality of every method on synthetic Llama-like KV (int8 >= 0.999,
 * int4 >= 0.99: the targets), with supplied and with derived probes.
 */
#include "codec_int.h"
#include "kvgen.h"

#include <math.h>

static kv_section_shape shape_of(kv_codec_dtype dt, kv_section_kind kind, uint32_t n, uint32_t d)
{
  kv_section_shape s = {dt, kind, n, d};
  return s;
}

static kv_quality measure(const kv_section_shape *s, const void *k, const void *v, uint32_t n_dec,
                          const void *kd, const void *vd, const float *probes, uint32_t n_probes)
{
  kv_codec_err e = {0};
  kv_quality q;
  size_t scr = kv_quality_scratch_bytes(s->n_tokens, s->head_dim, n_probes);
  CHECK(scr > 0);
  void *scratch = kt_xmalloc(scr);
  CHECK_OK(e, kv_quality_attention(s, k, v, n_dec, kd, vd, probes, n_probes, scratch, scr, &q, &e));
  free(scratch);
  return q;
}

TEST(identical_is_perfect)
{
  size_t len;
  void *k = kvgen_section(KV_CODEC_F16, KV_SECTION_K, 1, 200, 64, &len);
  void *v = kvgen_section(KV_CODEC_F16, KV_SECTION_V, 2, 200, 64, &len);
  kv_section_shape s = shape_of(KV_CODEC_F16, KV_SECTION_K, 200, 64);
  kv_quality q = measure(&s, k, v, 200, k, v, NULL, 0);
  CHECK(q.cos_mean == 1.0 && q.cos_min == 1.0 && q.rel_l2 == 0.0 && q.n_probes == 16);
  float probes[3 * 64];
  kvgen_gauss(3, 3 * 64, 1.0f, probes);
  q = measure(&s, k, v, 200, k, v, probes, 3);
  CHECK(q.cos_mean == 1.0 && q.rel_l2 == 0.0 && q.n_probes == 3);
  free(k);
  free(v);
}

TEST(attend_known_answers)
{
  kv_codec_err e = {0};
  /* one key: the output is its value, whatever the query */
  float k1[4] = {0.3f, -1.0f, 2.0f, 0.5f}, v1[4] = {1.5f, -2.0f, 0.25f, 8.0f}, q[4] = {1, 2, 3, 4};
  float out[4];
  uint8_t scratch[4096];
  CHECK_OK(e, kv_quality_attend(KV_CODEC_F32, 1, 4, k1, v1, q, 1, scratch, sizeof scratch, out, &e));
  CHECK(memcmp(out, v1, sizeof out) == 0);
  /* two keys with logits ln 3 and 0: weights 3/4 and 1/4 */
  float k2[4] = {1, 0, 0, 1}, v2[4] = {4, 8, -4, 0};
  float q2[2] = {(float)(sqrt(2.0) * log(3.0)), 0};
  float o2[2];
  CHECK_OK(e, kv_quality_attend(KV_CODEC_F32, 2, 2, k2, v2, q2, 1, scratch, sizeof scratch, o2, &e));
  CHECK(fabs(o2[0] - 2.0) < 1e-5 && fabs(o2[1] - 6.0) < 1e-5);
  /* the same in f16 elements */
  uint16_t k2h[4], v2h[4];
  kv_codec_from_f32(KV_CODEC_F16, k2, 4, k2h);
  kv_codec_from_f32(KV_CODEC_F16, v2, 4, v2h);
  CHECK_OK(e, kv_quality_attend(KV_CODEC_F16, 2, 2, k2h, v2h, q2, 1, scratch, sizeof scratch, o2, &e));
  CHECK(fabs(o2[0] - 2.0) < 1e-5 && fabs(o2[1] - 6.0) < 1e-5);
  /* exactly the stated scratch suffices, one byte less does not */
  size_t need = kv_quality_attend_scratch_bytes(2, 2, 1);
  CHECK(need > 0 && need <= sizeof scratch && kv_quality_attend_scratch_bytes(0, 2, 1) == 0);
  uint8_t *exact = kt_xmalloc(need);
  CHECK_OK(e, kv_quality_attend(KV_CODEC_F32, 2, 2, k2, v2, q2, 1, exact, need, o2, &e));
  CHECK_RC(KV_CODEC_ENOMEM, e, kv_quality_attend(KV_CODEC_F32, 2, 2, k2, v2, q2, 1, exact, need - 1, o2, &e));
  free(exact);
  CHECK_RC(KV_CODEC_ENOMEM, e, kv_quality_attend(KV_CODEC_F32, 2, 2, k2, v2, q2, 1, scratch, 10, o2, &e));
  CHECK_RC(KV_CODEC_EINVAL, e, kv_quality_attend((kv_codec_dtype)0, 2, 2, k2, v2, q2, 1, scratch,
                                                 sizeof scratch, o2, &e));
  CHECK_RC(KV_CODEC_EINVAL, e, kv_quality_attend(KV_CODEC_F32, 0, 2, k2, v2, q2, 1, scratch,
                                                 sizeof scratch, o2, &e));
}

TEST(compare_edge_cases)
{
  kv_codec_err e = {0};
  kv_quality q;
  float a[6] = {1, 0, 0, 0, 0, 0}, b[6] = {0, 1, 0, 0, 0, 0}, z[6] = {0};
  CHECK_OK(e, kv_quality_compare(a, b, 2, 3, &q, &e)); /* probe 0 orthogonal, probe 1 both zero */
  CHECK(fabs(q.cos_mean - 0.5) < 1e-12 && q.cos_min == 0.0);
  CHECK(fabs(q.rel_l2 - sqrt(2.0)) < 1e-12);
  CHECK_OK(e, kv_quality_compare(z, a, 2, 3, &q, &e)); /* reference zero, test not */
  CHECK(q.cos_mean == 0.5 && isinf(q.rel_l2));
  float c[3] = {2, 0, 0};
  CHECK_OK(e, kv_quality_compare(a, c, 1, 3, &q, &e)); /* same direction, twice as long */
  CHECK(q.cos_mean == 1.0 && fabs(q.rel_l2 - 1.0) < 1e-12);
  CHECK_RC(KV_CODEC_EINVAL, e, kv_quality_compare(a, b, 0, 3, &q, &e));
}

TEST(derived_probes)
{
  kv_codec_err e = {0};
  uint32_t d = 8;
  static const struct {
    uint32_t n, count;
    uint32_t pos[16];
  } cases[] = {
    {100, 16, {92, 93, 94, 95, 96, 97, 98, 99, 0, 12, 25, 37, 50, 62, 75, 87}},
    {10, 10, {0, 1, 2, 3, 4, 5, 6, 7, 8, 9}},
    {20, 13, {12, 13, 14, 15, 16, 17, 18, 19, 0, 2, 5, 7, 10}},
  };
  for (size_t c = 0; c < 3; c++) {
    uint32_t n = cases[c].n;
    float *kf = kt_xmalloc(sizeof(float) * n * d);
    kvgen_gauss(c, (size_t)n * d, 1.0f, kf);
    kv_section_shape s = shape_of(KV_CODEC_F32, KV_SECTION_K, n, d);
    float probes[KV_QUALITY_MAX_DERIVED * 8];
    uint32_t np;
    CHECK_OK(e, kv_quality_derive_probes(&s, kf, (size_t)n * d * 4, probes, KV_QUALITY_MAX_DERIVED,
                                         &np, &e));
    CHECK(np == cases[c].count);
    for (uint32_t i = 0; i < np; i++) { /* the key's direction, at norm sqrt(d) */
      const float *key = kf + (size_t)cases[c].pos[i] * d, *pr = probes + (size_t)i * d;
      double kk = 0, pp = 0, kp = 0;
      for (uint32_t j = 0; j < d; j++) {
        kk += (double)key[j] * key[j];
        pp += (double)pr[j] * pr[j];
        kp += (double)key[j] * pr[j];
      }
      CHECK(fabs(pp - d) < 1e-4 * d);
      CHECK(fabs(kp / sqrt(kk * pp) - 1.0) < 1e-6);
    }
    CHECK_RC(KV_CODEC_EINVAL, e, kv_quality_derive_probes(&s, kf, (size_t)n * d * 4, probes, np - 1,
                                                          &np, &e));
    free(kf);
  }
}

TEST(quality_argument_errors)
{
  kv_codec_err e = {0};
  size_t len;
  void *k = kvgen_section(KV_CODEC_F16, KV_SECTION_K, 1, 50, 16, &len);
  kv_section_shape s = shape_of(KV_CODEC_F16, KV_SECTION_K, 50, 16);
  kv_quality q;
  size_t scr = kv_quality_scratch_bytes(50, 16, 0);
  void *scratch = kt_xmalloc(scr);
  float probe[16] = {0};
  CHECK_RC(KV_CODEC_EINVAL, e, kv_quality_attention(&s, k, k, 51, k, k, NULL, 0, scratch, scr, &q, &e));
  CHECK_RC(KV_CODEC_EINVAL, e, kv_quality_attention(&s, k, k, 0, k, k, NULL, 0, scratch, scr, &q, &e));
  CHECK_RC(KV_CODEC_EINVAL, e, kv_quality_attention(&s, k, k, 50, k, k, NULL, 3, scratch, scr, &q, &e));
  CHECK_RC(KV_CODEC_EINVAL, e, kv_quality_attention(&s, k, k, 50, k, k, probe, 0, scratch, scr, &q, &e));
  CHECK_RC(KV_CODEC_EINVAL, e, kv_quality_attention(&s, k, NULL, 50, k, k, NULL, 0, scratch, scr, &q, &e));
  CHECK_RC(KV_CODEC_ENOMEM, e, kv_quality_attention(&s, k, k, 50, k, k, NULL, 0, scratch, scr - 64, &q, &e));
  CHECK(kv_quality_scratch_bytes(0, 16, 0) == 0);
  free(scratch);
  free(k);
}

/* ---- quality of the methods on Llama-like KV --------------------------------------------------- */

typedef struct head {
  kv_section_shape sk, sv;
  void *k, *v;
  size_t len;
} head;

static void head_make(head *h, uint64_t seed, uint32_t n, uint32_t d)
{
  h->sk = shape_of(KV_CODEC_F16, KV_SECTION_K, n, d);
  h->sv = shape_of(KV_CODEC_F16, KV_SECTION_V, n, d);
  h->k = kvgen_section(KV_CODEC_F16, KV_SECTION_K, seed, n, d, &h->len);
  h->v = kvgen_section(KV_CODEC_F16, KV_SECTION_V, seed + 1000, n, d, &h->len);
}

/* Quality of a head after encoding K and V with params p (kivi, or drop with positions). */
static kv_quality quality_of(const head *h, unsigned id, const kv_codec_params *p,
                             const float *probes, uint32_t n_probes)
{
  size_t nk, nv;
  uint8_t *ek = kt_encode(id, &h->sk, h->k, h->len, p, &nk);
  uint8_t *ev = kt_encode(id, &h->sv, h->v, h->len, p, &nv);
  kv_section_info ik, iv;
  void *dk = kt_decode(ek, nk, &ik), *dv = kt_decode(ev, nv, &iv);
  CHECK(ik.n_rows == iv.n_rows);
  kv_quality q = measure(&h->sk, h->k, h->v, ik.n_rows, dk, dv, probes, n_probes);
  free(ek);
  free(ev);
  free(dk);
  free(dv);
  return q;
}

static kv_quality kivi_quality(const head *h, unsigned bits, const float *probes, uint32_t np)
{
  kv_codec_params p;
  kv_codec_params_init(&p);
  p.bits = bits;
  return quality_of(h, KV_CODEC_ID_KIVI, &p, probes, np);
}

static kv_quality drop_quality(const head *h, kv_drop_method m, unsigned permille,
                               const kv_snapkv_window *w, const float *probes, uint32_t np)
{
  kv_codec_err e = {0};
  size_t scr = kv_drop_scratch_bytes(m, h->sk.n_tokens, h->sk.head_dim, w);
  void *scratch = kt_xmalloc(scr);
  uint32_t *pos = kt_xmalloc(4 * h->sk.n_tokens), n_keep;
  CHECK_OK(e, kv_drop_select(m, &h->sk, h->k, h->len, permille, w, scratch, scr, pos,
                             h->sk.n_tokens, &n_keep, &e));
  kv_codec_params p;
  kv_codec_params_init(&p);
  p.keep_pos = pos;
  p.n_keep = n_keep;
  p.keep_permille = permille;
  p.drop_method = m;
  kv_quality q = quality_of(h, KV_CODEC_ID_DROP, &p, probes, np);
  free(pos);
  free(scratch);
  return q;
}

TEST(quantization_quality_targets)
{
  uint32_t n = 1024, d = 128;
  float probes[16 * 128];
  kvgen_gauss(77, 16 * 128, 1.0f, probes);
  for (uint64_t seed = 1; seed <= 2; seed++) {
    head h;
    head_make(&h, seed, n, d);
    for (int derived = 0; derived < 2; derived++) {
      const float *pr = derived ? NULL : probes;
      uint32_t np = derived ? 0 : 16;
      kv_quality q8 = kivi_quality(&h, 8, pr, np), q4 = kivi_quality(&h, 4, pr, np),
                 q2 = kivi_quality(&h, 2, pr, np);
      printf("  head %llu, %s probes: int8 %.6f (rel %.4f), int4 %.6f (rel %.4f), int2 %.6f "
             "(rel %.4f)\n",
             (unsigned long long)seed, derived ? "derived" : "supplied", q8.cos_mean, q8.rel_l2,
             q4.cos_mean, q4.rel_l2, q2.cos_mean, q2.rel_l2);
      fflush(stdout);
      CHECK(q8.cos_mean >= 0.999);
      CHECK(q4.cos_mean >= 0.99);
      CHECK(q8.cos_mean > q4.cos_mean && q4.cos_mean > q2.cos_mean);
      CHECK(q8.rel_l2 < q4.rel_l2 && q4.rel_l2 < q2.rel_l2);
      CHECK(q2.cos_mean > 0.5 && q2.cos_mean < 0.999);
    }
    free(h.k);
    free(h.v);
  }
}

TEST(dropping_quality)
{
  uint32_t n = 1024, d = 128;
  head h;
  head_make(&h, 5, n, d);
  float obs[16 * 4 * 128];
  kvgen_gauss(8, sizeof obs / sizeof obs[0], 1.0f, obs);
  kv_snapkv_window w = {obs, 16, 4, 0, KV_POOL_MAX, 0};
  for (int derived = 0; derived < 2; derived++) {
    /* supplied probes: the observation window's queries (what SnapKV optimises for) */
    const float *pr = derived ? NULL : obs;
    uint32_t np = derived ? 0 : 64;
    kv_quality all = drop_quality(&h, KV_DROP_KNORM, 1000, NULL, pr, np);
    CHECK(all.cos_mean == 1.0 && all.rel_l2 == 0.0); /* keeping every token changes nothing */
    kv_quality kn = drop_quality(&h, KV_DROP_KNORM, 500, NULL, pr, np);
    kv_quality kd = drop_quality(&h, KV_DROP_KEYDIFF, 500, NULL, pr, np);
    kv_quality sn = drop_quality(&h, KV_DROP_SNAPKV, 500, &w, pr, np);
    kv_quality kd9 = drop_quality(&h, KV_DROP_KEYDIFF, 900, NULL, pr, np);
    kv_quality kd1 = drop_quality(&h, KV_DROP_KEYDIFF, 100, NULL, pr, np);
    printf("  %s probes: knorm50 %.4f, keydiff50 %.4f, snapkv50 %.4f, keydiff90 %.4f, "
           "keydiff10 %.4f\n",
           derived ? "derived" : "window", kn.cos_mean, kd.cos_mean, sn.cos_mean, kd9.cos_mean,
           kd1.cos_mean);
    CHECK(kn.cos_mean < 1.0 && kd.cos_mean < 1.0 && sn.cos_mean < 1.0);
    CHECK(kd9.cos_mean > kd1.cos_mean);
    if (!derived) /* on its own observation queries SnapKV beats query-blind knorm */
      CHECK(sn.cos_mean > kn.cos_mean);
  }
  /* drop + quantize costs more than either alone */
  kv_codec_err e = {0};
  size_t scr = kv_drop_scratch_bytes(KV_DROP_KEYDIFF, n, d, NULL);
  void *scratch = kt_xmalloc(scr);
  uint32_t *pos = kt_xmalloc(4 * n), nk;
  CHECK_OK(e, kv_drop_select(KV_DROP_KEYDIFF, &h.sk, h.k, h.len, 500, NULL, scratch, scr, pos, n,
                             &nk, &e));
  kv_codec_params p;
  kv_codec_params_init(&p);
  p.keep_pos = pos;
  p.n_keep = nk;
  p.keep_permille = 500;
  p.drop_method = KV_DROP_KEYDIFF;
  p.bits = 2;
  kv_quality both = quality_of(&h, KV_CODEC_ID_DROP, &p, NULL, 0);
  kv_quality drop_only = drop_quality(&h, KV_DROP_KEYDIFF, 500, NULL, NULL, 0);
  kv_quality q_only = kivi_quality(&h, 2, NULL, 0);
  printf("  keydiff50 + int2 %.4f (keydiff50 %.4f, int2 %.4f)\n", both.cos_mean,
         drop_only.cos_mean, q_only.cos_mean);
  CHECK(both.cos_mean < drop_only.cos_mean && both.cos_mean < q_only.cos_mean);
  free(pos);
  free(scratch);
  free(h.k);
  free(h.v);
}

int main(void)
{
  RUN(identical_is_perfect);
  RUN(attend_known_answers);
  RUN(compare_edge_cases);
  RUN(derived_probes);
  RUN(quality_argument_errors);
  RUN(quantization_quality_targets);
  RUN(dropping_quality);
  printf("%d passed, 0 failed\n", kt_passed);
  return T_EXIT_PASS;
}
