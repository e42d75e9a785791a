/* SPDX-License-Identifier: MIT */
/*
 * compress/quality.c — the quality proxy: how much a decoded head changes attention outputs.
 *
 * The policy needs a quality number for every (method, ratio) of every context without running
 * the model. Attention-output fidelity is the closest cheap proxy: errors in K matter only as
 * far as they move the softmax, errors in V only as far as they are weighted, and a dropped
 * token matters only if it was attended to. For probe queries q: o = softmax(q.K^T/sqrt(d)).V
 * over the original rows and o' over the decoded rows (dropped tokens absent); quality is the
 * mean cosine similarity of o and o', with the relative L2 error beside it (codec.h).
 *
 * Work is split so a head's reference outputs are computed once and compared against many
 * candidate decodings (kv_quality_attend + kv_quality_compare); kv_quality_attention() does
 * the whole measurement in one call.
 */
#include "codec_int.h"

#include <math.h>
#include <string.h>

static inline size_t al64(size_t n)
{
  return (n + 63) & ~(size_t)63;
}

/* Probes from the key rows at pos[0..c): each row as f32, scaled to norm sqrt(d) (a zero or
 * non-finite row stays as it is). */
static void probes_from_keys(const kv_section_shape *k_shape, const void *k, const uint32_t *pos,
                             uint32_t c, float *probes)
{
  uint32_t d = k_shape->head_dim;
  size_t rowb = (size_t)d * kv_codec_dtype_bytes(k_shape->dtype);
  for (uint32_t i = 0; i < c; i++) {
    float *pr = probes + (size_t)i * d;
    kv_codec_to_f32(k_shape->dtype, (const uint8_t *)k + (size_t)pos[i] * rowb, d, pr);
    double ss = 0;
    for (uint32_t j = 0; j < d; j++)
      ss += (double)pr[j] * pr[j];
    if (ss > 0 && isfinite(ss)) {
      float f = (float)(sqrt((double)d / ss));
      for (uint32_t j = 0; j < d; j++)
        pr[j] *= f;
    }
  }
}

kv_codec_status kv_quality_derive_probes(const kv_section_shape *k_shape, const void *k,
                                         size_t k_len, float *probes, uint32_t probes_cap,
                                         uint32_t *n_probes, kv_codec_err *err)
{
  size_t unused;
  if (probes == NULL || n_probes == NULL)
    return KV_CODEC_FAIL(err, KV_CODEC_EINVAL, "NULL probes or n_probes", 0, 0);
  *n_probes = 0;
  kv_codec_status rc = kv_codec_encode_args(k_shape, k, k_len, k, &unused, err);
  if (rc != KV_CODEC_OK)
    return rc;
  uint32_t n = k_shape->n_tokens, d = k_shape->head_dim;
  if (n == 0 || d == 0)
    return KV_CODEC_FAIL(err, KV_CODEC_EINVAL, "empty section", n, 0);
  uint32_t pos[KV_QUALITY_MAX_DERIVED], c = 0;
  if (n <= KV_QUALITY_MAX_DERIVED) {
    for (uint32_t t = 0; t < n; t++)
      pos[c++] = t;
  } else {
    uint32_t first_recent = n - KV_QUALITY_DERIVED_RECENT;
    for (uint32_t t = first_recent; t < n; t++)
      pos[c++] = t;
    uint32_t last = UINT32_MAX;
    for (uint32_t j = 0; j < KV_QUALITY_DERIVED_SPREAD; j++) {
      uint32_t t = (uint32_t)((uint64_t)j * n / KV_QUALITY_DERIVED_SPREAD);
      if (t < first_recent && t != last)
        pos[c++] = t;
      last = t;
    }
  }
  if (probes_cap < c)
    return KV_CODEC_FAIL(err, KV_CODEC_EINVAL, "probes_cap smaller than the derived probes",
                         probes_cap, c);
  probes_from_keys(k_shape, k, pos, c, probes);
  *n_probes = c;
  return KV_CODEC_OK;
}

size_t kv_quality_attend_scratch_bytes(uint32_t n_rows, uint32_t head_dim, uint32_t n_probes)
{
  if (n_rows == 0 || head_dim == 0 || n_probes == 0)
    return 0;
  /* logits [n_probes][n_rows] float, a float row, accumulators [n_probes][d] double, sums */
  return 64 + al64(4 * (size_t)n_probes * n_rows) + al64(4 * (size_t)head_dim) +
         al64(8 * (size_t)n_probes * head_dim) + al64(8 * (size_t)n_probes);
}

kv_codec_status kv_quality_attend(kv_codec_dtype dtype, uint32_t n_rows, uint32_t head_dim,
                                  const void *k, const void *v, const float *probes,
                                  uint32_t n_probes, void *scratch, size_t scratch_cap, float *out,
                                  kv_codec_err *err)
{
  size_t es = kv_codec_dtype_bytes(dtype);
  if (es == 0)
    return KV_CODEC_FAIL(err, KV_CODEC_EINVAL, "unknown dtype", dtype, 3);
  if (n_rows == 0 || head_dim == 0 || head_dim > KV_CODEC_MAX_HEAD_DIM || n_probes == 0)
    return KV_CODEC_FAIL(err, KV_CODEC_EINVAL, "empty rows, head_dim or probes", n_rows, 0);
  if (k == NULL || v == NULL || probes == NULL || out == NULL)
    return KV_CODEC_FAIL(err, KV_CODEC_EINVAL, "NULL k, v, probes or out", 0, 0);
  size_t need = kv_quality_attend_scratch_bytes(n_rows, head_dim, n_probes);
  if (scratch == NULL || scratch_cap < need)
    return KV_CODEC_FAIL(err, KV_CODEC_ENOMEM, "scratch smaller than the attend scratch",
                         scratch ? scratch_cap : 0, need);
  size_t cap = scratch_cap;
  uint8_t *ws = kv_codec_scratch_align(scratch, &cap);
  uint32_t d = head_dim;
  float *logit = (float *)(void *)ws;
  float *row = (float *)(void *)(ws + al64(4 * (size_t)n_probes * n_rows));
  double *acc = (double *)(void *)((uint8_t *)row + al64(4 * (size_t)d));
  double *sum = acc + (size_t)n_probes * d;
  size_t rowb = (size_t)d * es;
  float scale = (float)(1.0 / sqrt((double)d));

  for (uint32_t i = 0; i < n_rows; i++) {
    kv_codec_to_f32(dtype, (const uint8_t *)k + (size_t)i * rowb, d, row);
    for (uint32_t p = 0; p < n_probes; p++)
      logit[(size_t)p * n_rows + i] = (float)kv_codec_dot_f32(probes + (size_t)p * d, row, d) * scale;
  }
  for (uint32_t p = 0; p < n_probes; p++) {
    float *l = logit + (size_t)p * n_rows;
    float mx = -INFINITY;
    for (uint32_t i = 0; i < n_rows; i++)
      mx = l[i] > mx ? l[i] : mx;
    double s = 0;
    for (uint32_t i = 0; i < n_rows; i++) {
      l[i] = expf(l[i] - mx);
      s += l[i];
    }
    sum[p] = s;
  }
  memset(acc, 0, 8 * (size_t)n_probes * d);
  for (uint32_t i = 0; i < n_rows; i++) {
    kv_codec_to_f32(dtype, (const uint8_t *)v + (size_t)i * rowb, d, row);
    for (uint32_t p = 0; p < n_probes; p++) {
      double w = logit[(size_t)p * n_rows + i];
      double *a = acc + (size_t)p * d;
      for (uint32_t j = 0; j < d; j++)
        a[j] += w * row[j];
    }
  }
  for (uint32_t p = 0; p < n_probes; p++)
    for (uint32_t j = 0; j < d; j++)
      out[(size_t)p * d + j] = (float)(acc[(size_t)p * d + j] / sum[p]);
  return KV_CODEC_OK;
}

kv_codec_status kv_quality_compare(const float *ref, const float *test, uint32_t n_probes,
                                   uint32_t head_dim, kv_quality *q, kv_codec_err *err)
{
  if (ref == NULL || test == NULL || q == NULL || n_probes == 0 || head_dim == 0)
    return KV_CODEC_FAIL(err, KV_CODEC_EINVAL, "NULL outputs or empty probes", n_probes, 0);
  double cos_sum = 0, cos_min = 1, diff2 = 0, ref2 = 0;
  for (uint32_t p = 0; p < n_probes; p++) {
    const float *a = ref + (size_t)p * head_dim, *b = test + (size_t)p * head_dim;
    double ab = 0, aa = 0, bb = 0, dd = 0;
    for (uint32_t j = 0; j < head_dim; j++) {
      ab += (double)a[j] * b[j];
      aa += (double)a[j] * a[j];
      bb += (double)b[j] * b[j];
      dd += ((double)a[j] - b[j]) * ((double)a[j] - b[j]);
    }
    double c;
    if (dd == 0) /* identical (both zero included): exactly 1, not 1 - ulp */
      c = 1;
    else if (aa == 0 || bb == 0)
      c = 0;
    else
      c = ab / (sqrt(aa) * sqrt(bb));
    c = c > 1 ? 1 : (c < -1 ? -1 : c);
    cos_sum += c;
    cos_min = c < cos_min ? c : cos_min;
    diff2 += dd;
    ref2 += aa;
  }
  q->cos_mean = cos_sum / n_probes;
  q->cos_min = cos_min;
  q->rel_l2 = ref2 > 0 ? sqrt(diff2 / ref2) : (diff2 > 0 ? HUGE_VAL : 0.0);
  q->n_probes = n_probes;
  return KV_CODEC_OK;
}

size_t kv_quality_scratch_bytes(uint32_t n_tokens, uint32_t head_dim, uint32_t n_probes)
{
  uint32_t np = n_probes ? n_probes : KV_QUALITY_MAX_DERIVED;
  size_t attend = kv_quality_attend_scratch_bytes(n_tokens, head_dim, np);
  if (attend == 0)
    return 0;
  size_t probes = n_probes ? 0 : al64(4 * (size_t)KV_QUALITY_MAX_DERIVED * head_dim);
  return 64 + probes + 2 * al64(4 * (size_t)np * head_dim) + attend;
}

kv_codec_status kv_quality_attention(const kv_section_shape *shape, const void *k, const void *v,
                                     uint32_t n_dec, const void *k_dec, const void *v_dec,
                                     const float *probes, uint32_t n_probes, void *scratch,
                                     size_t scratch_cap, kv_quality *q, kv_codec_err *err)
{
  if (shape == NULL || k == NULL || v == NULL || k_dec == NULL || v_dec == NULL || q == NULL)
    return KV_CODEC_FAIL(err, KV_CODEC_EINVAL, "NULL shape, k, v, k_dec, v_dec or q", 0, 0);
  size_t es = kv_codec_dtype_bytes(shape->dtype);
  if (es == 0)
    return KV_CODEC_FAIL(err, KV_CODEC_EINVAL, "unknown dtype", shape->dtype, 3);
  if (shape->n_tokens == 0 || shape->head_dim == 0 || shape->head_dim > KV_CODEC_MAX_HEAD_DIM)
    return KV_CODEC_FAIL(err, KV_CODEC_EINVAL, "section shape out of range", shape->n_tokens, 0);
  if (n_dec == 0 || n_dec > shape->n_tokens)
    return KV_CODEC_FAIL(err, KV_CODEC_EINVAL, "decoded rows out of range", n_dec,
                         shape->n_tokens);
  if ((probes == NULL) != (n_probes == 0))
    return KV_CODEC_FAIL(err, KV_CODEC_EINVAL, "probes and n_probes disagree", n_probes, 0);
  size_t need = kv_quality_scratch_bytes(shape->n_tokens, shape->head_dim, n_probes);
  if (scratch == NULL || scratch_cap < need)
    return KV_CODEC_FAIL(err, KV_CODEC_ENOMEM, "scratch smaller than kv_quality_scratch_bytes()",
                         scratch ? scratch_cap : 0, need);
  size_t cap = scratch_cap;
  uint8_t *ws = kv_codec_scratch_align(scratch, &cap);
  uint32_t d = shape->head_dim, np = n_probes;
  const float *pr = probes;
  if (pr == NULL) {
    float *derived = (float *)(void *)ws;
    kv_codec_status rc = kv_quality_derive_probes(shape, k, (size_t)shape->n_tokens * d * es,
                                                  derived, KV_QUALITY_MAX_DERIVED, &np, err);
    if (rc != KV_CODEC_OK)
      return rc;
    pr = derived;
    ws += al64(4 * (size_t)KV_QUALITY_MAX_DERIVED * d);
  }
  uint32_t npa = n_probes ? n_probes : KV_QUALITY_MAX_DERIVED;
  float *ref = (float *)(void *)ws;
  float *test = (float *)(void *)(ws + al64(4 * (size_t)npa * d));
  uint8_t *rest = ws + 2 * al64(4 * (size_t)npa * d);
  size_t rest_cap = kv_quality_attend_scratch_bytes(shape->n_tokens, d, npa);
  kv_codec_status rc =
    kv_quality_attend(shape->dtype, shape->n_tokens, d, k, v, pr, np, rest, rest_cap, ref, err);
  if (rc != KV_CODEC_OK)
    return rc;
  rc = kv_quality_attend(shape->dtype, n_dec, d, k_dec, v_dec, pr, np, rest, rest_cap, test, err);
  if (rc != KV_CODEC_OK)
    return rc;
  return kv_quality_compare(ref, test, np, d, q, err);
}

/* ---- the causal metric (issue 16) ----------------------------------------------------------- */

uint32_t kv_quality_probe_positions(uint32_t n_tokens, uint32_t n_probes, uint32_t *pos)
{
  if (n_tokens == 0 || n_probes == 0 || pos == NULL)
    return 0;
  if (n_probes >= n_tokens) {
    for (uint32_t t = 0; t < n_tokens; t++)
      pos[t] = t;
    return n_tokens;
  }
  uint32_t c = 0;
  for (uint32_t j = 0; j < n_probes; j++) {
    uint32_t t = (uint32_t)(((uint64_t)2 * j + 1) * n_tokens / (2 * (uint64_t)n_probes));
    if (c == 0 || t > pos[c - 1])
      pos[c++] = t;
  }
  return c;
}

size_t kv_quality_causal_scratch_bytes(uint32_t n_rows, uint32_t head_dim)
{
  if (n_rows == 0 || head_dim == 0)
    return 0;
  /* K and V rows as float, a logit per row, a double accumulator row */
  return 64 + 2 * al64(4 * (size_t)n_rows * head_dim) + al64(4 * (size_t)n_rows) +
         al64(8 * (size_t)head_dim);
}

kv_codec_status kv_quality_causal_attend(kv_codec_dtype dtype, uint32_t n_rows, uint32_t head_dim,
                                         const void *k, const void *v, const uint32_t *row_pos,
                                         const float *q, const uint32_t *q_pos, uint32_t n_q,
                                         void *scratch, size_t scratch_cap, float *out,
                                         kv_codec_err *err)
{
  size_t es = kv_codec_dtype_bytes(dtype);
  if (es == 0)
    return KV_CODEC_FAIL(err, KV_CODEC_EINVAL, "unknown dtype", dtype, 3);
  if (n_rows == 0 || head_dim == 0 || head_dim > KV_CODEC_MAX_HEAD_DIM || n_q == 0)
    return KV_CODEC_FAIL(err, KV_CODEC_EINVAL, "empty rows, head_dim or queries", n_rows, 0);
  if (k == NULL || v == NULL || q == NULL || q_pos == NULL || out == NULL)
    return KV_CODEC_FAIL(err, KV_CODEC_EINVAL, "NULL k, v, q, q_pos or out", 0, 0);
  for (uint32_t i = 1; row_pos != NULL && i < n_rows; i++)
    if (row_pos[i] <= row_pos[i - 1])
      return KV_CODEC_FAIL(err, KV_CODEC_EINVAL, "row positions not strictly increasing",
                           row_pos[i], row_pos[i - 1]);
  size_t need = kv_quality_causal_scratch_bytes(n_rows, head_dim);
  if (scratch == NULL || scratch_cap < need)
    return KV_CODEC_FAIL(err, KV_CODEC_ENOMEM, "scratch smaller than the causal attend scratch",
                         scratch ? scratch_cap : 0, need);
  size_t cap = scratch_cap;
  uint8_t *ws = kv_codec_scratch_align(scratch, &cap);
  uint32_t d = head_dim;
  float *kf = (float *)(void *)ws;
  float *vf = (float *)(void *)(ws + al64(4 * (size_t)n_rows * d));
  float *l = (float *)(void *)(ws + 2 * al64(4 * (size_t)n_rows * d));
  double *acc = (double *)(void *)((uint8_t *)l + al64(4 * (size_t)n_rows));
  kv_codec_to_f32(dtype, k, (size_t)n_rows * d, kf);
  kv_codec_to_f32(dtype, v, (size_t)n_rows * d, vf);
  float scale = (float)(1.0 / sqrt((double)d));
  for (uint32_t p = 0; p < n_q; p++) {
    const float *qp = q + (size_t)p * d;
    /* rows at positions <= q_pos[p]: a prefix of the rows (positions increase) */
    uint32_t lo = 0, hi = n_rows;
    while (lo < hi) {
      uint32_t mid = lo + (hi - lo) / 2;
      uint32_t pm = row_pos ? row_pos[mid] : mid;
      if (pm <= q_pos[p])
        lo = mid + 1;
      else
        hi = mid;
    }
    uint32_t m = lo;
    float *o = out + (size_t)p * d;
    if (m == 0) { /* nothing to attend to: the output is zero */
      memset(o, 0, 4 * (size_t)d);
      continue;
    }
    float mx = -INFINITY;
    for (uint32_t i = 0; i < m; i++) {
      l[i] = (float)kv_codec_dot_f32(qp, kf + (size_t)i * d, d) * scale;
      mx = l[i] > mx ? l[i] : mx;
    }
    double s = 0;
    memset(acc, 0, 8 * (size_t)d);
    for (uint32_t i = 0; i < m; i++) {
      double w = expf(l[i] - mx);
      s += w;
      const float *vr = vf + (size_t)i * d;
      for (uint32_t j = 0; j < d; j++)
        acc[j] += w * vr[j];
    }
    for (uint32_t j = 0; j < d; j++)
      o[j] = (float)(acc[j] / s);
  }
  return KV_CODEC_OK;
}

kv_codec_status kv_quality_spread_probes(const kv_section_shape *k_shape, const void *k,
                                         size_t k_len, uint32_t n_probes, float *probes,
                                         uint32_t *pos, uint32_t *n_out, kv_codec_err *err)
{
  size_t unused;
  if (probes == NULL || pos == NULL || n_out == NULL || n_probes == 0)
    return KV_CODEC_FAIL(err, KV_CODEC_EINVAL, "NULL probes, pos or n_out, or no probes", 0, 0);
  *n_out = 0;
  kv_codec_status rc = kv_codec_encode_args(k_shape, k, k_len, k, &unused, err);
  if (rc != KV_CODEC_OK)
    return rc;
  uint32_t c = kv_quality_probe_positions(k_shape->n_tokens, n_probes, pos);
  probes_from_keys(k_shape, k, pos, c, probes);
  *n_out = c;
  return KV_CODEC_OK;
}

/* ---- the output-weighted quality (codec.h THE OUTPUT-WEIGHTED QUALITY) ---- */

void kv_quality_gain_add(const float *ref, const float *test, uint32_t n_pos, uint32_t grp,
                         uint32_t head_dim, const float *gains, uint32_t channels, double *e,
                         double *r)
{
  for (uint32_t i = 0; i < n_pos; i++)
    for (uint32_t j = 0; j < grp; j++) {
      const float *a = ref + ((size_t)i * grp + j) * head_dim;
      const float *b = test + ((size_t)i * grp + j) * head_dim;
      const float *g = gains + (size_t)j * channels;
      double ee = 0, rr = 0;
      for (uint32_t c = 0; c < head_dim; c++) {
        double gc = channels == 1 ? g[0] : g[c], dc = (double)a[c] - b[c];
        ee += gc * dc * dc;
        rr += gc * (double)a[c] * a[c];
      }
      e[i] += ee;
      r[i] += rr;
    }
}

double kv_quality_gain_finish(const double *e, const double *r, uint32_t n_layers,
                              uint32_t n_pos, const uint8_t *seen)
{
  double rsum = 0;
  uint32_t nl = 0;
  for (uint32_t l = 0; l < n_layers; l++) {
    if (seen != NULL && !seen[l])
      continue;
    double se = 0, sr = 0;
    for (uint32_t p = 0; p < n_pos; p++) {
      se += sqrt(fmax(0.0, e[(size_t)l * n_pos + p]));
      sr += sqrt(fmax(0.0, r[(size_t)l * n_pos + p]));
    }
    /* a layer whose outputs are all zero: exact when the errors are too, else wholly wrong */
    rsum += sr > 0 ? se / sr : (se > 0 ? 1.0 : 0.0);
    nl++;
  }
  if (nl == 0)
    return 1.0;
  double rm = rsum / nl;
  return fmax(0.0, 1.0 - rm * rm / 2);
}
