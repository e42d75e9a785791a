/* SPDX-License-Identifier: MIT */
/*
 * tests/unit/test_codec_kvquant.c — the "kvquant" codec (id 5, issue 16): sizes at the
 * layout of FORMAT-codecs.md (bits per element with scales, zeros and 8-bit residual rows
 * included), the error of unclipped and residual elements within KIVI's bound, page-group
 * decodes equal to the whole decode, configurations the shape cannot take, corrupt group
 * tables; and the causal quality metric of quality.c: known answers, the causal mask, dropped
 * rows, and that kvquant int4 scores near kivi int4 at fewer bits.
 */
#include "codec_int.h"
#include "kvgen.h"

#include <math.h>

static kv_section_shape shp(kv_codec_dtype dt, kv_section_kind kind, uint32_t n, uint32_t d)
{
  kv_section_shape s = {dt, kind, n, d};
  return s;
}

/* Bytes of a kvquant section by the layout of FORMAT-codecs.md, computed independently. */
static size_t layout_bytes_sink(uint32_t n, uint32_t d, unsigned bits, uint32_t group,
                                uint32_t res, uint32_t G, uint32_t sink)
{
  uint32_t ng = (n + G - 1) / G;
  size_t total = KV_SECTION_FIXED_BYTES + 4 * (size_t)ng;
  for (uint32_t g = 0; g < ng; g++) {
    uint32_t r0 = g * G, t = n - r0 < G ? n - r0 : G, qend = n - res;
    uint32_t q = r0 >= qend ? 0 : (qend - r0 < t ? qend - r0 : t), rr = t - q;
    if (g == 0 && sink) { /* the sink rows: one 8-bit chunk before the quantized rows */
      total += 4 * (size_t)d + (size_t)sink * d;
      q -= sink;
    }
    total += (size_t)(q + group - 1) / group * 4 * d + (size_t)q * ((d * bits + 7) / 8);
    if (rr > 0)
      total += 4 * (size_t)d + (size_t)rr * d;
  }
  return total;
}

static size_t layout_bytes(uint32_t n, uint32_t d, unsigned bits, uint32_t group, uint32_t res,
                           uint32_t G)
{
  return layout_bytes_sink(n, d, bits, group, res, G, 0);
}

TEST(sizes_and_bits_per_element)
{
  /* stories260K's shape: 512 tokens x head_dim 8, int4, group 128, residual 8 */
  uint32_t n = 512, d = 8;
  for (int kind = 0; kind < 2; kind++) {
    kv_section_shape s = shp(KV_CODEC_F16, (kv_section_kind)kind, n, d);
    size_t len;
    void *src = kvgen_section(KV_CODEC_F16, s.kind, 11 + kind, n, d, &len);
    kv_codec_params p;
    kv_codec_params_init(&p);
    p.bits = 4;
    p.residual = 8;
    size_t el;
    uint8_t *enc = kt_encode(KV_CODEC_ID_KVQUANT, &s, src, len, &p, &el);
    kv_section_info info;
    void *dec = kt_decode(enc, el, &info);
    CHECK(info.codec_id == KV_CODEC_ID_KVQUANT && info.params.group == 128);
    CHECK(info.params.page_tokens % 128 == 0);
    CHECK(el == layout_bytes(n, d, 4, 128, 8, info.params.page_tokens));
    double bpe = 8.0 * (double)el / ((double)n * d);
    fprintf(stderr, "kvquant int4 g128 r8, 512 x 8: %zu bytes, %.4f bits per element (G %u)\n", el, bpe, info.params.page_tokens);
    CHECK(bpe <= 4.5); /* the target, headers included */
    free(dec);
    free(enc);
    free(src);
  }
}

/* Every element: residual rows within an 8-bit step of their chunk; quantized rows within
 * half a step of their clipped range, or saturated at its end. */
TEST(error_bound_and_clipping)
{
  uint32_t n = 300, d = 24;
  unsigned bitsv[3] = {8, 4, 2};
  for (int kind = 0; kind < 2; kind++)
    for (int b = 0; b < 3; b++) {
      kv_section_shape s = shp(KV_CODEC_F32, (kv_section_kind)kind, n, d);
      size_t len;
      float *src = kvgen_section(KV_CODEC_F32, s.kind, 40 + b, n, d, &len);
      kv_codec_params p;
      kv_codec_params_init(&p);
      p.bits = bitsv[b];
      p.group = 64;
      p.residual = 20;
      size_t el;
      uint8_t *enc = kt_encode(KV_CODEC_ID_KVQUANT, &s, src, len, &p, &el);
      kv_section_info info;
      float *dec = kt_decode(enc, el, &info);
      for (uint32_t j = 0; j < d; j++) {
        /* residual rows 280..299: one 8-bit chunk per page group; the whole span bounds it */
        float lo = INFINITY, hi = -INFINITY;
        for (uint32_t t = n - 20; t < n; t++) {
          lo = fminf(lo, src[t * d + j]);
          hi = fmaxf(hi, src[t * d + j]);
        }
        double step = (hi - lo) / 255.0 * 1.01 + 1e-3;
        for (uint32_t t = n - 20; t < n; t++)
          CHECK(fabs(dec[t * d + j] - src[t * d + j]) <= step);
        /* quantized rows: decoded values lie in the chunk's range (clipping never widens) */
        for (uint32_t c0 = 0; c0 < n - 20; c0 += 64) {
          uint32_t c1 = c0 + 64 < n - 20 ? c0 + 64 : n - 20;
          float mn = INFINITY, mx = -INFINITY;
          for (uint32_t t = c0; t < c1; t++) {
            mn = fminf(mn, src[t * d + j]);
            mx = fmaxf(mx, src[t * d + j]);
          }
          double slack = (mx - mn) / ((1u << bitsv[b]) - 1) + 1e-2;
          for (uint32_t t = c0; t < c1; t++)
            CHECK(dec[t * d + j] >= mn - slack && dec[t * d + j] <= mx + slack);
        }
      }
      free(dec);
      free(enc);
      free(src);
    }
}

TEST(page_groups_decode_alone)
{
  uint32_t n = 1000, d = 16;
  kv_section_shape s = shp(KV_CODEC_F16, KV_SECTION_V, n, d);
  size_t len;
  void *src = kvgen_section(KV_CODEC_F16, s.kind, 7, n, d, &len);
  kv_codec_params p;
  kv_codec_params_init(&p);
  p.bits = 4;
  p.group = 32;
  p.residual = 100; /* residual rows span several page groups */
  p.page_tokens = 64;
  size_t el;
  uint8_t *enc = kt_encode(KV_CODEC_ID_KVQUANT, &s, src, len, &p, &el);
  kv_section_info info;
  uint8_t *all = kt_decode(enc, el, &info);
  size_t rowb = (size_t)d * 2, scr = kv_section_scratch_bytes(&info);
  void *scratch = kt_xmalloc(scr);
  kv_codec_err e = {0};
  for (uint32_t g = 0; g < info.n_groups; g++) {
    uint64_t off, glen;
    CHECK_OK(e, kv_section_group_span(enc, el, g, g + 1, &off, &glen, &e));
    size_t ob = kv_section_rows_bytes(&info, g, g + 1);
    uint8_t *one = kt_xmalloc(ob);
    CHECK_OK(e, kv_section_decode_groups(enc, el, enc + off, glen, g, g + 1, scratch, scr, one, ob,
                                         &e));
    CHECK(memcmp(one, all + (size_t)g * 64 * rowb, ob) == 0);
    free(one);
  }
  free(scratch);
  free(all);
  free(enc);
  free(src);
}

/* Sink rows (the first rows at 8 bits), with and without residual rows in the same page group:
 * every decoded row close to its source (a row the decoder skipped would be garbage). */
TEST(sink_rows)
{
  uint32_t n = 448, d = 8;
  unsigned res[2] = {0, 8};
  for (int kind = 0; kind < 2; kind++)
    for (int r = 0; r < 2; r++) {
      kv_section_shape s = shp(KV_CODEC_F32, (kv_section_kind)kind, n, d);
      size_t len;
      float *src = kvgen_section(KV_CODEC_F32, s.kind, 5, n, d, &len);
      kv_codec_params p;
      kv_codec_params_init(&p);
      p.bits = 4;
      p.sink = 4;
      p.residual = res[r];
      size_t el;
      uint8_t *enc = kt_encode(KV_CODEC_ID_KVQUANT, &s, src, len, &p, &el);
      CHECK(enc[31] == 4);
      kv_section_info info;
      float *dec = kt_decode(enc, el, &info);
      CHECK(info.params.sink == 4);
      CHECK(el == layout_bytes_sink(n, d, 4, 128, res[r], info.params.page_tokens, 4));
      for (uint32_t t = 0; t < n; t++)
        for (uint32_t j = 0; j < d; j++) {
          double e = fabs(dec[t * d + j] - src[t * d + j]);
          CHECK(t < 4 ? e < 0.02 : e < 1.5);
        }
      free(dec);
      free(enc);
      free(src);
    }
  kv_codec_err e = {0};
  kv_section_shape s = shp(KV_CODEC_F16, KV_SECTION_K, 64, 8);
  kv_codec_params p;
  kv_codec_params_init(&p);
  p.bits = 4;
  p.sink = 256;
  CHECK(kv_codec_bound(kv_codec_by_id(KV_CODEC_ID_KVQUANT), &s, &p) == 0);
  p.sink = 2;
  CHECK(kv_codec_bound(kv_codec_by_id(KV_CODEC_ID_KIVI), &s, &p) == 0); /* kivi has no sink */
  (void)e;
}

/* Pre-RoPE K: keys with per-channel structure, rotated by RoPE (adjacent pairs, base 10000) at
 * positions 100.., as a model caches them. Quantizing before RoPE (the codec un-rotates at
 * encode and rotates back at decode) loses far less than quantizing the rotated keys. */
static void rope_rotate(float *x, uint32_t n, uint32_t d, uint32_t pos0, int half)
{
  for (uint32_t t = 0; t < n; t++)
    for (uint32_t i = 0; i < d / 2; i++) {
      uint32_t a = half ? i : 2 * i, b = half ? i + d / 2 : 2 * i + 1;
      double th = pow(10000.0, -2.0 * i / d), ang = (double)(pos0 + t) * th;
      double x0 = x[t * d + a], x1 = x[t * d + b];
      x[t * d + a] = (float)(x0 * cos(ang) - x1 * sin(ang));
      x[t * d + b] = (float)(x0 * sin(ang) + x1 * cos(ang));
    }
}

static double rms_err(const float *a, const float *b, size_t n)
{
  double e = 0, r = 0;
  for (size_t i = 0; i < n; i++) {
    e += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
    r += (double)a[i] * a[i];
  }
  return sqrt(e / r);
}

TEST(pre_rope_keys)
{
  uint32_t n = 512, d = 64;
  for (int half = 0; half < 2; half++)
    for (int dti = 0; dti < 2; dti++) {
      kv_codec_dtype dt = dti ? KV_CODEC_F32 : KV_CODEC_F16; /* f16: the AVX2 kernel (adjacent) */
      float *k = kt_xmalloc(sizeof(float) * n * d);
      kvgen_keys(77, n, d, k);
      rope_rotate(k, n, d, 100, half);
      size_t es = kv_codec_dtype_bytes(dt), len = (size_t)n * d * es;
      void *src = kt_xmalloc(len);
      kv_codec_from_f32(dt, k, (size_t)n * d, src);
      kv_codec_to_f32(dt, src, (size_t)n * d, k); /* the values as stored */
      kv_section_shape s = shp(dt, KV_SECTION_K, n, d);
      kv_codec_params p;
      kv_codec_params_init(&p);
      p.bits = 4;
      p.residual = 8;
      size_t el0, el1;
      uint8_t *post = kt_encode(KV_CODEC_ID_KVQUANT, &s, src, len, &p, &el0);
      p.rope_base = 10000.0f;
      p.rope_style = half ? KV_ROPE_HALF : KV_ROPE_ADJACENT;
      p.rope_pos0 = 100;
      uint8_t *pre = kt_encode(KV_CODEC_ID_KVQUANT, &s, src, len, &p, &el1);
      CHECK(el1 == el0 + KV_SECTION_ROPE_EXT && (pre[3] & 2) && ((pre[3] & 4) != 0) == half);
      kv_section_info info;
      void *d0 = kt_decode(post, el0, &info), *d1 = kt_decode(pre, el1, &info);
      CHECK(info.params.rope_base == 10000.0f && info.params.rope_pos0 == 100 &&
            info.params.rope_style == p.rope_style);
      float *y0 = kt_xmalloc(sizeof(float) * n * d), *y1 = kt_xmalloc(sizeof(float) * n * d);
      kv_codec_to_f32(dt, d0, (size_t)n * d, y0);
      kv_codec_to_f32(dt, d1, (size_t)n * d, y1);
      double e0 = rms_err(k, y0, (size_t)n * d), e1 = rms_err(k, y1, (size_t)n * d);
      fprintf(stderr, "pre-RoPE %s %s: relative RMS error %.4f (post-RoPE %.4f)\n",
              half ? "half" : "adjacent", dti ? "f32" : "f16", e1, e0);
      CHECK(e1 < 0.08 && e1 < e0);
      /* a page group alone decodes the same rows (its angles start at its own position) */
      kv_codec_err e = {0};
      uint64_t off, glen;
      CHECK_OK(e, kv_section_group_span(pre, el1, 1, 2, &off, &glen, &e));
      size_t ob = kv_section_rows_bytes(&info, 1, 2), scr = kv_section_scratch_bytes(&info);
      uint8_t *one = kt_xmalloc(ob);
      void *scratch = kt_xmalloc(scr);
      CHECK_OK(e, kv_section_decode_groups(pre, el1, pre + off, glen, 1, 2, scratch, scr, one, ob,
                                           &e));
      CHECK(memcmp(one, (uint8_t *)d1 + (size_t)info.params.page_tokens * d * es, ob) == 0);
      /* a V section cannot carry RoPE; a header claiming it is corrupt */
      uint8_t *b = kt_xmalloc(el1);
      memcpy(b, pre, el1);
      b[3] |= 1;
      CHECK_RC(KV_CODEC_ECORRUPT, e, kt_try_decode(b, el1, &e));
      memcpy(b, pre, el1);
      float bad = 0.5f; /* base outside (1, 1e9] */
      memcpy(b + KV_SECTION_FIXED_BYTES, &bad, 4);
      CHECK_RC(KV_CODEC_ECORRUPT, e, kt_try_decode(b, el1, &e));
      CHECK_RC(KV_CODEC_ECORRUPT, e, kt_try_decode(pre, KV_SECTION_FIXED_BYTES + 4, &e));
      free(b), free(one), free(scratch), free(y0), free(y1), free(d0), free(d1), free(pre);
      free(post), free(src), free(k);
    }
  kv_section_shape v = shp(KV_CODEC_F16, KV_SECTION_V, 64, 8);
  kv_codec_params p;
  kv_codec_params_init(&p);
  p.bits = 4;
  p.rope_base = 10000.0f;
  p.rope_style = KV_ROPE_ADJACENT;
  CHECK(kv_codec_bound(kv_codec_by_id(KV_CODEC_ID_KVQUANT), &v, &p) == 0); /* V: refused */
}

TEST(bad_configs_and_corrupt_input)
{
  kv_codec_err e = {0};
  kv_section_shape s = shp(KV_CODEC_F16, KV_SECTION_V, 64, 8);
  size_t len;
  void *src = kvgen_section(KV_CODEC_F16, s.kind, 3, 64, 8, &len);
  const kv_codec *c = kv_codec_by_name("kvquant");
  CHECK(c != NULL && c->id == KV_CODEC_ID_KVQUANT && (c->flags & KV_CODEC_LOSSY));
  kv_codec_params p;
  kv_codec_params_init(&p);
  p.bits = 4;
  p.group = 128; /* a V group is tokens here: more than the section's 64 */
  uint8_t dst[4096], scr[1 << 16];
  size_t out;
  CHECK_RC(KV_CODEC_EINVAL, e, kv_codec_encode(c, &s, src, len, &p, scr, sizeof scr, dst,
                                               sizeof dst, &out, &e));
  CHECK(kt_msg_has(&e, "group larger than the tokens"));
  p.group = 0;
  p.bits = 3;
  CHECK_RC(KV_CODEC_EINVAL, e, kv_codec_encode(c, &s, src, len, &p, scr, sizeof scr, dst,
                                               sizeof dst, &out, &e));
  p.bits = 4;
  p.residual = 65;
  CHECK_RC(KV_CODEC_EINVAL, e, kv_codec_encode(c, &s, src, len, &p, scr, sizeof scr, dst,
                                               sizeof dst, &out, &e));
  p.residual = 8;
  size_t el;
  uint8_t *enc = kt_encode(KV_CODEC_ID_KVQUANT, &s, src, len, &p, &el);
  CHECK(kt_try_decode(enc, el, &e) == KV_CODEC_OK);
  uint8_t *b = kt_xmalloc(el);
  memcpy(b, enc, el); /* a group-table entry that is not the layout's */
  kv_codec_put_le32(b + KV_SECTION_FIXED_BYTES, kv_codec_get_le32(b + KV_SECTION_FIXED_BYTES) + 1);
  CHECK_RC(KV_CODEC_ECORRUPT, e, kt_try_decode(b, el, &e));
  memcpy(b, enc, el); /* truncated */
  CHECK_RC(KV_CODEC_ECORRUPT, e, kt_try_decode(b, el - 1, &e));
  free(b);
  free(enc);
  free(src);
}

/* ---- the causal metric ---- */

TEST(causal_attend_known_answers)
{
  /* 3 rows, d = 2: a query at position 0 sees only row 0, at position 2 all three */
  float k[6] = {1, 0, 0, 1, 1, 1}, v[6] = {1, 2, 3, 4, 5, 6};
  float q[4] = {0, 0, 0, 0}, out[4];
  uint32_t qp[2] = {0, 2};
  uint8_t scr[4096];
  kv_codec_err e = {0};
  CHECK_OK(e, kv_quality_causal_attend(KV_CODEC_F32, 3, 2, k, v, NULL, q, qp, 2, scr, sizeof scr,
                                       out, &e));
  CHECK(out[0] == 1 && out[1] == 2);                       /* row 0 only */
  CHECK(fabsf(out[2] - 3) < 1e-6f && fabsf(out[3] - 4) < 1e-6f); /* uniform over 3 rows */
  /* rows at positions 5 and 9 (others dropped): a query at 4 sees nothing (zero output) */
  uint32_t rp[2] = {5, 9}, qp2[2] = {4, 7};
  CHECK_OK(e, kv_quality_causal_attend(KV_CODEC_F32, 2, 2, k, v, rp, q, qp2, 2, scr, sizeof scr,
                                       out, &e));
  CHECK(out[0] == 0 && out[1] == 0 && out[2] == 1 && out[3] == 2);
  uint32_t bad[2] = {9, 5};
  CHECK_RC(KV_CODEC_EINVAL, e, kv_quality_causal_attend(KV_CODEC_F32, 2, 2, k, v, bad, q, qp2, 2,
                                                        scr, sizeof scr, out, &e));
  CHECK_RC(KV_CODEC_ENOMEM, e, kv_quality_causal_attend(KV_CODEC_F32, 2, 2, k, v, rp, q, qp2, 2,
                                                        scr, 8, out, &e));
  uint32_t pos[64];
  CHECK(kv_quality_probe_positions(512, 64, pos) == 64);
  CHECK(pos[0] == 4 && pos[63] == 508);
  for (int i = 1; i < 64; i++)
    CHECK(pos[i] == pos[i - 1] + 8);
  CHECK(kv_quality_probe_positions(10, 64, pos) == 10 && pos[9] == 9);
}

/* The causal metric on synthetic KV (Llama-shaped, outlier key channels): kvquant int4 (4.3
 * bits, K post-RoPE, unclipped at 4 bits) within 0.01 of kivi int4 (5 bits: V per token in
 * groups of 32 channels); int2 well below. */
static double causal_quality(unsigned id, unsigned bits, unsigned group, uint32_t n, uint32_t d)
{
  size_t len;
  kv_section_shape ks = shp(KV_CODEC_F16, KV_SECTION_K, n, d);
  kv_section_shape vs = shp(KV_CODEC_F16, KV_SECTION_V, n, d);
  void *k = kvgen_section(KV_CODEC_F16, KV_SECTION_K, 91, n, d, &len);
  void *v = kvgen_section(KV_CODEC_F16, KV_SECTION_V, 92, n, d, &len);
  kv_codec_params p;
  kv_codec_params_init(&p);
  p.bits = bits;
  p.group = group;
  size_t kl, vl;
  uint8_t *ke = kt_encode(id, &ks, k, len, &p, &kl);
  p.group = id == KV_CODEC_ID_KIVI ? 0 : group;
  uint8_t *ve = kt_encode(id, &vs, v, len, &p, &vl);
  kv_section_info info;
  void *kd = kt_decode(ke, kl, &info), *vd = kt_decode(ve, vl, &info);
  float *probes = kt_xmalloc(sizeof(float) * 64 * d);
  uint32_t pos[64], np;
  kv_codec_err e = {0};
  CHECK_OK(e, kv_quality_spread_probes(&ks, k, len, 64, probes, pos, &np, &e));
  CHECK(np == 64);
  size_t sc = kv_quality_causal_scratch_bytes(n, d);
  void *scr = kt_xmalloc(sc);
  float *ref = kt_xmalloc(sizeof(float) * 64 * d), *test = kt_xmalloc(sizeof(float) * 64 * d);
  CHECK_OK(e, kv_quality_causal_attend(KV_CODEC_F16, n, d, k, v, NULL, probes, pos, np, scr, sc,
                                       ref, &e));
  CHECK_OK(e, kv_quality_causal_attend(KV_CODEC_F16, n, d, kd, vd, NULL, probes, pos, np, scr, sc,
                                       test, &e));
  kv_quality q;
  CHECK_OK(e, kv_quality_compare(ref, test, np, d, &q, &e));
  free(scr), free(ref), free(test), free(probes), free(kd), free(vd), free(ke), free(ve);
  free(k), free(v);
  return q.cos_mean;
}

TEST(kvquant_int4_on_the_causal_metric)
{
  double kivi4 = causal_quality(KV_CODEC_ID_KIVI, 4, 32, 512, 128);
  double kvq4 = causal_quality(KV_CODEC_ID_KVQUANT, 4, 128, 512, 128);
  double kvq2 = causal_quality(KV_CODEC_ID_KVQUANT, 2, 128, 512, 128);
  fprintf(stderr, "causal quality: kivi int4 %.5f, kvquant int4 %.5f, kvquant int2 %.5f\n", kivi4, kvq4,
         kvq2);
  CHECK(kvq4 >= 0.985 && kvq4 >= kivi4 - 0.01 && kvq2 < kvq4 - 0.1);
}

/* Per-channel widths (flags bit 3): the layout's size (widths after each quantized chunk's
 * zeros), the widths stored (<= 8, block sums = bits x channels), the error no worse than the
 * uniform layout's on channels of unequal ranges, weights that move bits, and refused configs. */
TEST(per_channel_widths)
{
  uint32_t n = 512, d = 8;
  kv_codec_err e = {0};
  float *f = kt_xmalloc(sizeof(float) * n * d);
  uint16_t *h = kt_xmalloc(2 * (size_t)n * d);
  kvgen_gauss(77, (size_t)n * d, 1.0f, f);
  for (uint32_t r = 0; r < n; r++) /* channel j's spread 2^(j - 4): 1/16 .. 8 */
    for (uint32_t j = 0; j < d; j++)
      f[(size_t)r * d + j] *= ldexpf(1.0f, (int)j - 4);
  kv_codec_from_f32(KV_CODEC_F16, f, (size_t)n * d, h);
  kv_section_shape s = shp(KV_CODEC_F16, KV_SECTION_V, n, d);
  size_t len = (size_t)n * d * 2, el0, el1, el2;
  kv_codec_params p;
  kv_codec_params_init(&p);
  p.bits = 4;
  p.group = 128;
  uint8_t *uni = kt_encode(KV_CODEC_ID_KVQUANT, &s, h, len, &p, &el0);
  p.alloc = 1;
  uint8_t *alc = kt_encode(KV_CODEC_ID_KVQUANT, &s, h, len, &p, &el1);
  kv_section_info info;
  CHECK_OK(e, kv_section_parse(alc, el1, &info, &e));
  CHECK(info.params.alloc == 1 && (alc[3] & 8u));
  /* + 4 width bytes per quantized chunk of 128 rows */
  CHECK(el1 == layout_bytes(n, d, 4, 128, 0, info.params.page_tokens) + 4 * (n / 128));
  CHECK(el0 + 4 * (n / 128) == el1);
  uint8_t *wb = alc + info.header_bytes + 4 * d; /* group 0, chunk 0's widths */
  unsigned sum = 0, w7 = wb[3] >> 4, w0 = wb[0] & 15u;
  for (uint32_t j = 0; j < d; j++)
    sum += (wb[j / 2] >> ((j % 2) * 4)) & 15u;
  CHECK(sum == 32 && w7 > w0); /* the widest channel gets more bits than the narrowest */
  uint16_t *a = kt_decode(uni, el0, &info), *b = kt_decode(alc, el1, &info);
  double eu = 0, ea = 0;
  for (size_t i = 0; i < (size_t)n * d; i++) {
    double x = kv_codec_f16_to_f32(h[i]);
    eu += pow(kv_codec_f16_to_f32(a[i]) - x, 2);
    ea += pow(kv_codec_f16_to_f32(b[i]) - x, 2);
  }
  fprintf(stderr, "widths: squared error %.4g uniform, %.4g per-channel widths\n", eu, ea);
  CHECK(ea < 0.5 * eu);
  /* weights: channel 0 weighted 1e6 gets more bits than unweighted */
  float wt[8] = {1e6f, 1, 1, 1, 1, 1, 1, 1};
  p.chan_weight = wt;
  uint8_t *wtd = kt_encode(KV_CODEC_ID_KVQUANT, &s, h, len, &p, &el2);
  CHECK(el2 == el1);
  CHECK((wtd[info.header_bytes + 4 * d] & 15u) > w0);
  /* refused: widths on kivi, at 8 bits, weights without widths, a negative weight, 3 bits
   * without widths; 3 bits with them is fine */
  uint8_t dst[1 << 14], scr[1 << 17];
  size_t out;
  const kv_codec *kq = kv_codec_by_id(KV_CODEC_ID_KVQUANT), *kv = kv_codec_by_id(KV_CODEC_ID_KIVI);
  kv_codec_params bad = p;
  bad.chan_weight = NULL;
  bad.group = 0;
  CHECK_RC(KV_CODEC_EINVAL, e, kv_codec_encode(kv, &s, h, len, &bad, scr, sizeof scr, dst,
                                               sizeof dst, &out, &e));
  bad = p;
  bad.bits = 8;
  CHECK_RC(KV_CODEC_EINVAL, e, kv_codec_encode(kq, &s, h, len, &bad, scr, sizeof scr, dst,
                                               sizeof dst, &out, &e));
  bad = p;
  bad.alloc = 0;
  CHECK_RC(KV_CODEC_EINVAL, e, kv_codec_encode(kq, &s, h, len, &bad, scr, sizeof scr, dst,
                                               sizeof dst, &out, &e));
  bad = p;
  wt[3] = -1;
  CHECK_RC(KV_CODEC_EINVAL, e, kv_codec_encode(kq, &s, h, len, &bad, scr, sizeof scr, dst,
                                               sizeof dst, &out, &e));
  wt[3] = 1;
  bad = p;
  bad.alloc = 0;
  bad.chan_weight = NULL;
  bad.bits = 3;
  CHECK_RC(KV_CODEC_EINVAL, e, kv_codec_encode(kq, &s, h, len, &bad, scr, sizeof scr, dst,
                                               sizeof dst, &out, &e));
  bad.alloc = 1;
  CHECK_OK(e, kv_codec_encode(kq, &s, h, len, &bad, scr, sizeof scr, dst, sizeof dst, &out, &e));
  CHECK(kt_try_decode(dst, out, &e) == KV_CODEC_OK);
  /* flags bit 3 on a kivi section: reserved */
  uint8_t *kb = kt_xmalloc(el0);
  memcpy(kb, uni, el0);
  kb[0] = KV_CODEC_ID_KIVI;
  kb[3] |= 8u;
  CHECK_RC(KV_CODEC_ECORRUPT, e, kt_try_decode(kb, el0, &e));
  free(kb);
  free(a);
  free(b);
  free(uni);
  free(alc);
  free(wtd);
  free(f);
  free(h);
}

int main(void)
{
  RUN(sizes_and_bits_per_element);
  RUN(per_channel_widths);
  RUN(error_bound_and_clipping);
  RUN(page_groups_decode_alone);
  RUN(sink_rows);
  RUN(pre_rope_keys);
  RUN(bad_configs_and_corrupt_input);
  RUN(causal_attend_known_answers);
  RUN(kvquant_int4_on_the_causal_metric);
  printf("%d passed, 0 failed\n", kt_passed);
  return T_EXIT_PASS;
}
