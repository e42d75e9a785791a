/* SPDX-License-Identifier: MIT */
/*
 * compress/quant.c — KIVI quantization (Liu et al. 2024), codec "kivi" (id 3), and the page
 * group coder the "drop" codec reuses for its kept rows.
 *
 * Keys have a few channels with large, persistent magnitudes (outlier channels), so KIVI
 * quantizes K per channel: each channel of each run of `group` tokens gets its own scale and
 * zero, and an outlier channel does not spoil the others' resolution. Values have no such
 * channels but vary per token, so V is quantized per token, in runs of `group` channels.
 * Asymmetric min/max: zero = min, scale = (max - min) / (2^bits - 1), both stored as fp16 with
 * directed rounding so the stored range still covers every value (the bound in codec.h).
 * The last `residual` rows (the most recent tokens, the ones decoding attends to most) stay in
 * full precision.
 *
 * Decoding is the hot path: a get of a quantized context must keep up with the disk (target
 * >= 8 GB/s of decoded f16 per core for int4). On x86-64 CPUs with AVX2, F16C and FMA the rows
 * are dequantized 16 channels at a time, then 8; head_dim 8 (tiny models such as stories260K,
 * where a row is one vector) has its own K and V kernels that keep the shuffle port free:
 * codes unpacked by broadcast + variable shifts, V's scale and zero broadcast from memory.
 * Through a decoding context set to stream (kv_codec_dctx_set_stream()) the AVX2 kernels write
 * with non-temporal stores when dst and the rows are 16-byte aligned: a large decode then
 * skips the read-for-ownership of every output line. Elsewhere a portable loop runs. All
 * produce identical bits: y = code * scale + zero where code * scale is exact in float (8-bit
 * code times an 11-bit fp16 significand), so fused or unfused, vector or scalar, y has one
 * rounding, and the scalar f32->f16/bf16 conversions round exactly as vcvtps2ph and the vector
 * bf16 code do.
 */
#include "codec_int.h"

/*
 * Quantization takes inputs with |x| <= 65504 (the fp16 range of the stored zero point), but
 * code * scale + zero can land a rounding beyond it, where f16 overflows to inf (seen: an
 * input of 65504 decoded as inf at every bit width). Clamping y to the input range never moves
 * it away from x, so the error bound holds and every decoded element is finite.
 */
#define KV_QUANT_MAX 65504.0f
static inline float clamp_fp16_range(float y)
{
  return y > KV_QUANT_MAX ? KV_QUANT_MAX : y < -KV_QUANT_MAX ? -KV_QUANT_MAX : y;
}

#include <math.h>
#include <stdatomic.h>
#include <string.h>

#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
#define KV_QUANT_X86 1
#include <immintrin.h>
#else
#define KV_QUANT_X86 0
#endif

/* ---- geometry of a page group ------------------------------------------------------------- */

typedef struct qgeom {
  uint32_t r0;         /* first row of the group */
  uint32_t t;          /* rows */
  uint32_t s;          /* kvquant, group 0: the sink rows first, one 8-bit per-channel chunk */
  uint32_t q;          /* quantized rows (after the sink rows; the rest are residual rows: raw,
                          or 8-bit for kvquant) */
  uint32_t n_pairs;    /* scale/zero pairs (kvquant: the residual chunk's d pairs included) */
  int percol;          /* rows quantized per channel in chunks of `group` rows (K; kvquant V too) */
  int res8;            /* kvquant: the residual rows are one 8-bit per-channel chunk, not raw */
  int alloc;           /* kvquant: per-channel widths in each quantized chunk (flags bit 3) */
  size_t chb;          /* bytes of a quantized chunk's parameters: 4d, + ceil(d/2) widths */
  size_t rowpack;      /* code bytes per row */
  size_t pairs_bytes, codes_bytes, raw_bytes;
} qgeom;

static void geom(const kv_section_info *info, uint32_t g, qgeom *o)
{
  const kv_codec_params *p = &info->params;
  uint32_t d = info->shape.head_dim;
  uint32_t qend = info->n_rows - p->residual;
  int kvq = info->codec_id == KV_CODEC_ID_KVQUANT;
  o->r0 = g * p->page_tokens;
  o->t = kv_codec_group_rows(info, g);
  o->q = o->r0 >= qend ? 0 : (qend - o->r0 < o->t ? qend - o->r0 : o->t);
  o->s = g == 0 && kvq ? (p->sink < o->q ? p->sink : o->q) : 0;
  uint32_t res = o->t - o->q; /* residual rows of the group */
  o->q -= o->s;
  o->rowpack = ((size_t)d * p->bits + 7) / 8;
  o->percol = info->shape.kind == KV_SECTION_K || kvq;
  o->res8 = kvq && res > 0;
  o->alloc = kvq && p->alloc;
  o->chb = 4 * (size_t)d + (o->alloc ? ((size_t)d + 1) / 2 : 0);
  uint32_t nch = o->percol ? (o->q + p->group - 1) / p->group : 0;
  if (o->percol)
    o->n_pairs = (o->s ? d : 0) + nch * d + (o->res8 ? d : 0);
  else
    o->n_pairs = o->q * ((d + p->group - 1) / p->group);
  o->pairs_bytes = 4 * (size_t)o->n_pairs + (o->chb - 4 * (size_t)d) * nch;
  o->codes_bytes = (size_t)o->s * d + (size_t)o->q * o->rowpack + (kvq ? (size_t)res * d : 0);
  o->raw_bytes = kvq ? 0 : (size_t)res * d * kv_codec_dtype_bytes(info->shape.dtype);
}

/* At most ~5x the raw rows of a group (<= 2^30 by [H1]), so it fits a u32 table entry. */
size_t kv_quant_group_bytes(const kv_section_info *info, uint32_t g)
{
  qgeom q;
  geom(info, g, &q);
  return q.pairs_bytes + q.codes_bytes + q.raw_bytes;
}

/* row buffer (float), min, max, zero (float) and 1/scale (double) per channel; decode: a row,
 * scales, zeros, codes; then (pre-RoPE K) the rotation state, up to 15d floats */
size_t kv_quant_scratch_bytes(uint32_t head_dim)
{
  return KV_CODEC_SCRATCH_SLACK + 16 * sizeof(float) * (size_t)head_dim + 64;
}

kv_codec_status kv_quant_check(const kv_section_info *info, const uint8_t *hdr,
                               kv_codec_err *err)
{
  size_t bitmap = kv_section_ext_bytes(info->codec_id, kv_section_flags(info),
                                       info->shape.n_tokens);
  const uint8_t *t = hdr + KV_SECTION_FIXED_BYTES + bitmap;
  for (uint32_t g = 0; g < info->n_groups; g++) {
    size_t want = kv_quant_group_bytes(info, g);
    uint32_t have = kv_codec_get_le32(t + 4 * (size_t)g);
    if (have != want)
      return KV_CODEC_FAIL(err, KV_CODEC_ECORRUPT, "quantized group length is not its layout's",
                           have, want);
  }
  return KV_CODEC_OK;
}

/* ---- scale and zero --------------------------------------------------------------------------- */

/* Largest fp16 <= v (v finite, |v| <= 65504). */
static uint16_t f16_floor(float v)
{
  uint16_t h = kv_codec_f16_rne(v); /* v is finite (load_row checked it): the branch-free one */
  if (kv_codec_f16_to_f32(h) <= v)
    return h;
  if ((h & 0x7fffu) == 0)
    return 0x8001u; /* below zero: the smallest negative subnormal */
  return (h & 0x8000u) ? (uint16_t)(h + 1) : (uint16_t)(h - 1);
}

/* Smallest non-negative fp16 >= s (0 <= s < 65504). */
static uint16_t f16_ceil(double s)
{
  uint16_t h = kv_codec_f16_rne((float)s);
  if ((double)kv_codec_f16_to_f32(h) < s)
    h = (uint16_t)(h + 1);
  return h;
}

/* fp16 (scale, zero) covering [mn, mx] with 2^bits - 1 steps. */
static void scale_zero(float mn, float mx, unsigned maxq, uint16_t *s_h, uint16_t *z_h)
{
  uint16_t z = f16_floor(mn);
  double zf = kv_codec_f16_to_f32(z);
  uint16_t s = f16_ceil(((double)mx - zf) / maxq);
  /* exact in double: maxq (8 bits) x s (11 bits) + z (11 bits) */
  while (zf + (double)maxq * kv_codec_f16_to_f32(s) < (double)mx)
    s = (uint16_t)(s + 1);
  *s_h = s;
  *z_h = z;
}

static inline unsigned quantize(float x, double z, double inv, unsigned maxq)
{
  double v = ((double)x - z) * inv + 0.5;
  if (!(v > 0))
    return 0;
  unsigned c = (unsigned)v;
  return c > maxq ? maxq : c;
}

static inline void put_code(uint8_t *row, unsigned bits, uint32_t j, unsigned c)
{
  if (bits == 8)
    row[j] = (uint8_t)c;
  else if (bits == 4)
    row[j >> 1] |= (uint8_t)(c << ((j & 1u) * 4));
  else
    row[j >> 2] |= (uint8_t)(c << ((j & 3u) * 2));
}

static inline unsigned get_code(const uint8_t *row, unsigned bits, uint32_t j)
{
  if (bits == 8)
    return row[j];
  if (bits == 4)
    return (row[j >> 1] >> ((j & 1u) * 4)) & 15u;
  return (row[j >> 2] >> ((j & 3u) * 2)) & 3u;
}

/* ---- encoding ---------------------------------------------------------------------------------- */

static void halves(const uint8_t *src, uint32_t n, float *dst, int simd);

/* The CPU check of kv_quant_simd_available(), made once per process. */
static int simd_ok(void)
{
  static _Atomic int known = -1;
  int k = atomic_load_explicit(&known, memory_order_relaxed);
  if (k < 0) {
    k = kv_quant_simd_available();
    atomic_store_explicit(&known, k, memory_order_relaxed);
  }
  return k;
}

static kv_codec_status load_row(const kv_section_info *info, const uint8_t *src,
                                const uint32_t *row_map, uint32_t r, float *x, kv_codec_err *err)
{
  uint32_t d = info->shape.head_dim;
  size_t row = (size_t)d * kv_codec_dtype_bytes(info->shape.dtype);
  uint32_t sr = row_map ? row_map[r] : r;
  if (info->shape.dtype == KV_CODEC_F16) /* exact either way; F16C where the CPU has it */
    halves(src + (size_t)sr * row, d, x, simd_ok());
  else
    kv_codec_to_f32(info->shape.dtype, src + (size_t)sr * row, d, x);
  for (uint32_t j = 0; j < d; j++)
    if (!(fabsf(x[j]) <= 65504.0f))
      return KV_CODEC_FAIL(err, KV_CODEC_EINVAL,
                           "value not finite or beyond the fp16 range of KIVI's zero point", sr,
                           j);
  return KV_CODEC_OK;
}

/*
 * kvquant's clipping (encoder only): the [lo, hi] range of one channel of a chunk that gives
 * the smallest squared error after quantization, among the ranges that shrink [min, max] by
 * 0, 5, 10, 15 or 20% of its width from either end. Outliers then saturate at a code's end
 * instead of stretching every other value's step (KVQuant, Hooper et al. 2024). Used for V at
 * 4 and 2 bits and for K at 2 bits (kv_quant_encode_group).
 */
static void clip_range(const float *buf, uint32_t n, uint32_t d, uint32_t j, unsigned maxq,
                       float *lo, float *hi)
{
  static const float cut[5] = {0.0f, 0.05f, 0.10f, 0.15f, 0.20f};
  float mn = INFINITY, mx = -INFINITY;
  for (uint32_t r = 0; r < n; r++) {
    float x = buf[(size_t)r * d + j];
    mn = x < mn ? x : mn;
    mx = x > mx ? x : mx;
  }
  *lo = mn;
  *hi = mx;
  if (!(mx > mn) || n < 4)
    return;
  double best = HUGE_VAL;
  float w = mx - mn;
  for (int a = 0; a < 5; a++)
    for (int b = 0; b < 5; b++) {
      float l = mn + cut[a] * w, h = mx - cut[b] * w;
      uint16_t sh, zh;
      scale_zero(l, h, maxq, &sh, &zh);
      float sf = kv_codec_f16_to_f32(sh), zf = kv_codec_f16_to_f32(zh);
      float iv = sf > 0 ? 1.0f / sf : 0.0f;
      double e = 0;
      for (uint32_t r = 0; r < n && e < best; r++) {
        float x = buf[(size_t)r * d + j];
        float c = floorf((x - zf) * iv + 0.5f);
        c = c < 0 ? 0 : (c > (float)maxq ? (float)maxq : c);
        float y = c * sf + zf;
        e += (double)(y - x) * (y - x);
      }
      if (e < best) {
        best = e;
        *lo = l;
        *hi = h;
      }
    }
}

/*
 * kvquant's per-channel bit allocation (flags bit 3, params.alloc; encoder side). A chunk's
 * channels form blocks of 8 (the last one possibly shorter, n channels); a block's codes take
 * bits x n bits of every row, split among its channels, 0..8 bits each, so that the chunk's
 * squared error is least (an exact dynamic program over the block's channels, each channel's
 * error measured by quantizing it at every width). Channel j's width: nibble j % 2 (low
 * first) of byte j / 2 of the widths after the chunk's zeros.
 */
#define KV_ALLOC_BLOCK 8
#define KV_ALLOC_MAXW 8

static inline unsigned width_at(const uint8_t *wb, uint32_t j)
{
  return (wb[j >> 1] >> ((j & 1u) * 4)) & 15u;
}

/* Squared error of channel j of n rows (buf, stride d) at w bits; the range in *lo, *hi: w 0 =
 * the channel's mean rounded to fp16, stored as the zero with scale 0; else [min, max], or
 * clip_range()'s when clip. */
static double chan_cost(const float *buf, uint32_t n, uint32_t d, uint32_t j, unsigned w, int clip,
                        float *lo, float *hi)
{
  double e = 0;
  if (w == 0) {
    double m = 0;
    for (uint32_t r = 0; r < n; r++)
      m += buf[(size_t)r * d + j];
    float zf = kv_codec_f16_to_f32(kv_codec_f16_rne((float)(m / n)));
    for (uint32_t r = 0; r < n; r++) {
      double t = (double)buf[(size_t)r * d + j] - zf;
      e += t * t;
    }
    *lo = *hi = zf;
    return e;
  }
  unsigned maxq = (1u << w) - 1;
  float mn = INFINITY, mx = -INFINITY;
  for (uint32_t r = 0; r < n; r++) {
    float x = buf[(size_t)r * d + j];
    mn = x < mn ? x : mn;
    mx = x > mx ? x : mx;
  }
  if (clip)
    clip_range(buf, n, d, j, maxq, &mn, &mx);
  uint16_t sh, zh;
  scale_zero(mn, mx, maxq, &sh, &zh);
  float sf = kv_codec_f16_to_f32(sh), zf = kv_codec_f16_to_f32(zh);
  double z = zf, inv = sf > 0 ? 1.0 / sf : 0.0;
  for (uint32_t r = 0; r < n; r++) {
    float x = buf[(size_t)r * d + j];
    double t = (double)((float)quantize(x, z, inv, maxq) * sf + zf) - x;
    e += t * t;
  }
  *lo = mn;
  *hi = mx;
  return e;
}

/* Widths of a chunk's channels (n rows in buf) into wb (ceil(d/2) bytes, zeroed here) and each
 * channel's range at its width into lo/hi. */
static void alloc_widths(const float *buf, uint32_t n, uint32_t d, unsigned bits, int clip,
                         const float *wt, float *lo, float *hi, uint8_t *wb)
{
  enum { NB = KV_ALLOC_BLOCK, NW = KV_ALLOC_MAXW + 1, MAXB = KV_ALLOC_BLOCK * 7 + 1 };
  memset(wb, 0, ((size_t)d + 1) / 2);
  for (uint32_t j0 = 0; j0 < d; j0 += NB) {
    uint32_t nc = d - j0 < NB ? d - j0 : NB, budget = bits * nc;
    double cost[NB][NW], best[NB + 1][MAXB];
    float rl[NB][NW], rh[NB][NW];
    unsigned char pick[NB][MAXB];
    for (uint32_t c = 0; c < nc; c++)
      for (unsigned w = 0; w < NW; w++)
        cost[c][w] = chan_cost(buf, n, d, j0 + c, w, clip, &rl[c][w], &rh[c][w]) *
                     (wt ? (double)wt[j0 + c] : 1.0);
    for (uint32_t b = 0; b <= budget; b++)
      best[0][b] = b == 0 ? 0 : HUGE_VAL;
    for (uint32_t c = 0; c < nc; c++)
      for (uint32_t b = 0; b <= budget; b++) {
        best[c + 1][b] = HUGE_VAL;
        pick[c][b] = 0;
        for (unsigned w = 0; w < NW && w <= b; w++) {
          double v = best[c][b - w] + cost[c][w];
          if (v < best[c + 1][b]) {
            best[c + 1][b] = v;
            pick[c][b] = (unsigned char)w;
          }
        }
      }
    uint32_t b = budget; /* reachable: budget <= 7 nc <= 8 nc */
    for (uint32_t c = nc; c-- > 0;) {
      unsigned w = pick[c][b];
      uint32_t j = j0 + c;
      wb[j >> 1] = (uint8_t)(wb[j >> 1] | (w << ((j & 1u) * 4)));
      lo[j] = rl[c][w];
      hi[j] = rh[c][w];
      b -= w;
    }
  }
}

/* Code c of w bits at bit pos of a row (low bits first; w <= 8, so at most two bytes). */
static inline void put_bits(uint8_t *row, size_t pos, unsigned w, unsigned c)
{
  if (w == 0)
    return;
  size_t b = pos >> 3;
  unsigned sh = (unsigned)(pos & 7u);
  row[b] = (uint8_t)(row[b] | (c << sh));
  if (sh + w > 8)
    row[b + 1] = (uint8_t)(row[b + 1] | (c >> (8 - sh)));
}

static inline unsigned get_bits(const uint8_t *row, size_t pos, unsigned w)
{
  if (w == 0)
    return 0;
  size_t b = pos >> 3;
  unsigned sh = (unsigned)(pos & 7u), v = (unsigned)row[b] >> sh;
  if (sh + w > 8)
    v |= (unsigned)row[b + 1] << (8 - sh);
  return v & ((1u << w) - 1u);
}

/*
 * The decoder's view of a chunk's widths: each channel's width and bit offset in its row
 * (pos), and, for the AVX2 kernels, which 32-bit word of its block holds it (sh[2d + j]: 0 =
 * the block's bits 0..31, -1 = bits 24..55), its shift inside that word (sh[j]) and its mask
 * (sh[d + j]). A width above 8, or one that would run past its block's bits x n bits, decodes
 * as width 0 (kv_quant_alloc_check rejects such sections first).
 */
static void alloc_layout(const uint8_t *wb, uint32_t d, unsigned bits, uint8_t *wid,
                         uint32_t *pos, int32_t *sh)
{
  for (uint32_t j0 = 0; j0 < d; j0 += KV_ALLOC_BLOCK) {
    uint32_t nc = d - j0 < KV_ALLOC_BLOCK ? d - j0 : KV_ALLOC_BLOCK, budget = bits * nc, off = 0;
    for (uint32_t j = j0; j < j0 + nc; j++) {
      unsigned w = width_at(wb, j);
      if (w > KV_ALLOC_MAXW || off + w > budget)
        w = 0;
      wid[j] = (uint8_t)w;
      pos[j] = bits * j0 + off;
      /* blocks above 32 bits: a code at off >= 24 is read from bits 24..55 (off - 24 + w <= 32);
       * blocks of 32 bits or fewer are read whole from their first 32 */
      int hi = bits > 4 && off >= 24;
      sh[j] = (int32_t)(hi ? off - 24 : off);
      sh[d + j] = (int32_t)((1u << w) - 1u);
      sh[2 * (size_t)d + j] = hi ? -1 : 0;
      off += w;
    }
  }
}

/*
 * kvquant's pre-RoPE keys. The pair (a, b) of frequency i (adjacent: channels 2i, 2i+1; half:
 * i, i + d/2) of the row at token position p is rotated by the angle p * base^(-2i/d), in
 * double: encode un-rotates each row with cos/sin of its own angle (rope_unrotate), decode
 * rotates the decoded rows back (rope_rotate_rows: the first row's cos/sin from libm, the next
 * rows' by rotating that pair by one position's angle, in double), then rounds to the dtype.
 */
static void rope_pair(uint32_t d, unsigned style, uint32_t i, uint32_t *a, uint32_t *b)
{
  *a = style == KV_ROPE_HALF ? i : 2 * i;
  *b = style == KV_ROPE_HALF ? i + d / 2 : 2 * i + 1;
}

static void rope_unrotate(const kv_codec_params *p, uint32_t d, uint32_t pos, float *x)
{
  for (uint32_t i = 0; i < d / 2; i++) {
    uint32_t a, b;
    rope_pair(d, p->rope_style, i, &a, &b);
    double ang = (double)pos * pow((double)p->rope_base, -2.0 * i / d);
    double c = cos(ang), s = sin(ang), x0 = x[a], x1 = x[b];
    x[a] = (float)(x0 * c + x1 * s);
    x[b] = (float)(x1 * c - x0 * s);
  }
}

#define KV_ROPE_CHAINS 4 /* independent angle recurrences: row r advances chain r % 4 */

/* The decoder's angles of group rows starting at position pos, for frequency i with theta_i =
 * pow(base, -2i/d): chain 0 starts at cos/sin(pos theta_i) (libm, double); chain j at chain
 * j-1's double (c, s) rotated by (cos, sin)(theta_i); the step is that rotation applied
 * KV_ROPE_CHAINS times to (1, 0); all in double, then rounded to float. c, s:
 * [KV_ROPE_CHAINS][h]; ct, st: [h]. */
static void rope_state(const kv_codec_params *p, uint32_t d, uint32_t pos, float *c, float *s,
                       float *ct, float *st)
{
  uint32_t h = d / 2;
  for (uint32_t i = 0; i < h; i++) {
    double th = pow((double)p->rope_base, -2.0 * i / d);
    double c1 = cos(th), s1 = sin(th), cj = cos((double)pos * th), sj = sin((double)pos * th);
    double cs = 1, ss = 0;
    for (uint32_t j = 0; j < KV_ROPE_CHAINS; j++) {
      c[j * h + i] = (float)cj;
      s[j * h + i] = (float)sj;
      double cn = cj * c1 - sj * s1, csn = cs * c1 - ss * s1;
      sj = sj * c1 + cj * s1;
      cj = cn;
      ss = ss * c1 + cs * s1;
      cs = csn;
    }
    ct[i] = (float)cs;
    st[i] = (float)ss;
  }
}

static void rope_rotate_rows(const kv_codec_params *p, uint32_t d, kv_codec_dtype dt,
                             uint32_t pos, uint32_t rows, uint8_t *out, size_t rowb, float *ws)
{
  uint32_t h = d / 2;
  float *c = ws, *s = c + KV_ROPE_CHAINS * h, *ct = s + KV_ROPE_CHAINS * h, *st = ct + h;
  float *y = st + h; /* d floats: 6d in all */
  rope_state(p, d, pos, c, s, ct, st);
  int half = p->rope_style == KV_ROPE_HALF;
  for (uint32_t r = 0; r < rows; r++) {
    uint8_t *row = out + (size_t)r * rowb;
    float *cj = c + (r % KV_ROPE_CHAINS) * h, *sj = s + (r % KV_ROPE_CHAINS) * h;
    kv_codec_to_f32(dt, row, d, y);
    for (uint32_t i = 0; i < h; i++) {
      uint32_t a = half ? i : 2 * i, b = half ? i + h : 2 * i + 1;
      float y0 = y[a], y1 = y[b];
      float p0 = y0 * cj[i], p1 = y1 * sj[i], p2 = y0 * sj[i], p3 = y1 * cj[i];
      y[a] = p0 - p1;
      y[b] = p2 + p3;
      /* this chain's next angle: rotate (c, s) by KV_ROPE_CHAINS steps, in float */
      float q0 = cj[i] * ct[i], q1 = sj[i] * st[i], q2 = sj[i] * ct[i], q3 = cj[i] * st[i];
      cj[i] = q0 - q1;
      sj[i] = q2 + q3;
    }
    kv_codec_from_f32(dt, y, d, row);
  }
}

/*
 * The angles rope_rotate_rows uses for rows [0, rows) of a group at position pos, adjacent
 * pairs, as a table in ctx: row r at tab + 2 r d, its d cos then its d sin, each pair's value
 * on both of the pair's channels — the values of chain r % KV_ROPE_CHAINS after r /
 * KV_ROPE_CHAINS steps, computed by the same float operations, so a kernel that reads them
 * rotates to the same bits (the sin of a pair's first channel is stored negated, as
 * rope_rows_avx2 negates it). A table serves every later group at the same position and shape
 * (every layer and head of a context). NULL when ctx is NULL or the table would not fit.
 * ws: 5d floats.
 */
static const float *rope_table(kv_codec_dctx *ctx, const kv_codec_params *p, uint32_t d,
                               uint32_t pos, uint32_t rows, float *ws)
{
  if (ctx == NULL || ctx->magic != KV_DCTX_MAGIC || ctx->rope == NULL)
    return NULL;
  size_t need = 2 * (size_t)rows * d;
  if (need > KV_DCTX_ROPE_FLOATS)
    return NULL;
  uint32_t bb;
  memcpy(&bb, &p->rope_base, sizeof bb);
  for (uint32_t i = 0; i < ctx->rope_n; i++) {
    const kv_rope_tab *e = &ctx->rope_tab[i];
    if (e->base_bits == bb && e->style == p->rope_style && e->d == d && e->pos == pos &&
        e->rows >= rows)
      return ctx->rope + e->off;
  }
  if (ctx->rope_n == KV_DCTX_ROPE_TABS || ctx->rope_used + need > KV_DCTX_ROPE_FLOATS)
    ctx->rope_n = ctx->rope_used = 0; /* full: start over */
  float *t = ctx->rope + ctx->rope_used;
  uint32_t h = d / 2;
  float *c = ws, *sn = c + KV_ROPE_CHAINS * h, *ct = sn + KV_ROPE_CHAINS * h, *st = ct + h;
  rope_state(p, d, pos, c, sn, ct, st);
  for (uint32_t r = 0; r < rows; r++) {
    float *cj = c + (r % KV_ROPE_CHAINS) * h, *sj = sn + (r % KV_ROPE_CHAINS) * h;
    float *tr = t + 2 * (size_t)r * d;
    for (uint32_t i = 0; i < h; i++) {
      tr[2 * i] = tr[2 * i + 1] = cj[i];
      tr[d + 2 * i] = -sj[i]; /* the sign of y1 * s in y0 c - y1 s: exact either way */
      tr[d + 2 * i + 1] = sj[i];
      float q0 = cj[i] * ct[i], q1 = sj[i] * st[i], q2 = sj[i] * ct[i], q3 = cj[i] * st[i];
      cj[i] = q0 - q1;
      sj[i] = q2 + q3;
    }
  }
  kv_rope_tab *e = &ctx->rope_tab[ctx->rope_n++];
  e->base_bits = bb;
  e->style = p->rope_style;
  e->d = d;
  e->pos = pos;
  e->rows = rows;
  e->off = ctx->rope_used;
  ctx->rope_used += (uint32_t)((need + 15) / 16 * 16); /* keep tables 64-byte aligned */
  return t;
}

/*
 * Rows [rel0, rel0 + nrows) of group q (relative to its first row) quantized per channel in
 * chunks of `group` rows: per chunk d scales then d zeros at `pairs`, codes at `codes`, one
 * row of rowpack bytes after another. clip: choose each range by clip_range() (needs the
 * chunk's rows as floats in ws: kv_kvq_scratch_bytes()); else min/max (KIVI's K). alloc:
 * per-channel widths (alloc_widths), stored after each chunk's zeros.
 */
static kv_codec_status enc_percol(const kv_section_info *info, const uint8_t *s8,
                                  const uint32_t *row_map, uint32_t r0, uint32_t nrows,
                                  uint32_t group, unsigned bits, int clip, int alloc,
                                  uint8_t *pairs, uint8_t *codes, size_t rowpack, void *ws,
                                  kv_codec_err *err)
{
  uint32_t d = info->shape.head_dim;
  unsigned maxq = (1u << bits) - 1;
  float *x = ws, *mn = x + d, *mx = mn + d, *zf = mx + d;
  double *inv = (double *)(void *)(zf + d); /* 16*d bytes in: 8-aligned, ws is 64-aligned */
  float *buf = (float *)(void *)((uint8_t *)ws + 8 * sizeof(float) * (size_t)d + 64);
  size_t chb = 4 * (size_t)d + (alloc ? ((size_t)d + 1) / 2 : 0);
  int buffered = clip || alloc;
  kv_codec_status rc;
  memset(codes, 0, (size_t)nrows * rowpack);
  for (uint32_t c0 = 0; c0 < nrows; c0 += group) {
    uint32_t c1 = c0 + group < nrows ? c0 + group : nrows;
    uint8_t *cp = pairs + (size_t)(c0 / group) * chb, *wb = cp + 4 * (size_t)d;
    for (uint32_t j = 0; j < d; j++) {
      mn[j] = INFINITY;
      mx[j] = -INFINITY;
    }
    for (uint32_t r = c0; r < c1; r++) {
      float *xr = buffered ? buf + (size_t)(r - c0) * d : x;
      if ((rc = load_row(info, s8, row_map, r0 + r, xr, err)) != KV_CODEC_OK)
        return rc;
      if (info->params.rope_base != 0)
        rope_unrotate(&info->params, d, info->params.rope_pos0 + r0 + r, xr);
      for (uint32_t j = 0; j < d; j++) {
        mn[j] = xr[j] < mn[j] ? xr[j] : mn[j];
        mx[j] = xr[j] > mx[j] ? xr[j] : mx[j];
      }
    }
    if (alloc)
      alloc_widths(buf, c1 - c0, d, bits, clip, info->params.chan_weight, mn, mx, wb);
    else if (clip)
      for (uint32_t j = 0; j < d; j++)
        clip_range(buf, c1 - c0, d, j, maxq, &mn[j], &mx[j]);
    for (uint32_t j = 0; j < d; j++) {
      uint16_t sh, zh;
      unsigned w = alloc ? width_at(wb, j) : bits;
      if (w == 0) { /* a constant channel: its mean as the zero, scale 0 */
        sh = 0;
        zh = kv_codec_f16_rne(mn[j]);
      } else {
        scale_zero(mn[j], mx[j], (1u << w) - 1, &sh, &zh);
      }
      kv_codec_put_le16(cp + 2 * (size_t)j, sh);                 /* scales[d] */
      kv_codec_put_le16(cp + 2 * (size_t)d + 2 * (size_t)j, zh); /* then zeros[d] */
      float sf = kv_codec_f16_to_f32(sh);
      zf[j] = kv_codec_f16_to_f32(zh);
      inv[j] = sf > 0 ? 1.0 / sf : 0.0;
    }
    for (uint32_t r = c0; r < c1; r++) {
      const float *xr = x;
      if (buffered)
        xr = buf + (size_t)(r - c0) * d;
      else if (load_row(info, s8, row_map, r0 + r, x, NULL) == KV_CODEC_OK && /* checked above */
               info->params.rope_base != 0)
        rope_unrotate(&info->params, d, info->params.rope_pos0 + r0 + r, x);
      uint8_t *row = codes + (size_t)r * rowpack;
      if (alloc) {
        size_t pos = 0; /* block k starts at bit bits * 8k: the widths of a block fill it */
        for (uint32_t j = 0; j < d; j++) {
          unsigned w = width_at(wb, j);
          if (j % KV_ALLOC_BLOCK == 0)
            pos = (size_t)bits * j;
          put_bits(row, pos, w, quantize(xr[j], zf[j], inv[j], (1u << w) - 1));
          pos += w;
        }
      } else {
        for (uint32_t j = 0; j < d; j++)
          put_code(row, bits, j, quantize(xr[j], zf[j], inv[j], maxq));
      }
    }
  }
  return KV_CODEC_OK;
}

size_t kv_kvq_scratch_bytes(uint32_t head_dim, uint32_t page_tokens)
{
  return kv_quant_scratch_bytes(head_dim) + 4 * (size_t)page_tokens * head_dim + 64;
}

kv_codec_status kv_quant_encode_group(const kv_section_info *info, uint32_t g, const void *src,
                                      const uint32_t *row_map, void *ws, uint8_t *dst,
                                      kv_codec_err *err)
{
  const kv_codec_params *p = &info->params;
  const uint8_t *s8 = src;
  uint32_t d = info->shape.head_dim;
  unsigned bits = p->bits, maxq = (1u << bits) - 1;
  qgeom q;
  geom(info, g, &q);
  uint8_t *pairs = dst, *codes = dst + q.pairs_bytes, *raw = codes + q.codes_bytes;
  float *x = ws;
  kv_codec_status rc;

  if (info->codec_id == KV_CODEC_ID_KVQUANT) { /* [sink][quantized rows][residual] */
    uint32_t nch = (q.q + p->group - 1) / p->group, qe = q.s + q.q;
    size_t sp = q.s ? 4 * (size_t)d : 0, sc = (size_t)q.s * d;
    rc = q.s ? enc_percol(info, s8, row_map, q.r0, q.s, q.s, 8, 0, 0, pairs, codes, d, ws, err)
             : KV_CODEC_OK;
    /* clipping: V at 4 and 2 bits, K at 2 bits only (measured on stories260K, bench_truth.c:
     * clipping K at 4 bits raised the model's KL from 0.00100 to 0.00187, at 2 bits it cut it
     * from 0.72 to 0.057) */
    int clipx = info->shape.kind == KV_SECTION_V ? bits <= 4 : bits <= 2;
    /* per-channel widths: every channel's range the least-error one of clip_range() (which
     * includes [min, max]) at its width, K too: K at 1..3 bits needs it. On stories260K
     * (bench_truth.c, 24 contexts) the causal metric rose 0.98992 -> 0.99030, but the model's
     * KL after the stored context rose too (0.00092 -> 0.00111; bench/RESULTS.md, issue 16) */
    if (q.alloc)
      clipx = 1;
    if (rc == KV_CODEC_OK)
      rc = enc_percol(info, s8, row_map, q.r0 + q.s, q.q, p->group, bits, clipx, q.alloc,
                      pairs + sp, codes + sc, q.rowpack, ws, err);
    if (rc == KV_CODEC_OK && q.res8)
      rc = enc_percol(info, s8, row_map, q.r0 + qe, q.t - qe, q.t - qe, 8, 0, 0,
                      pairs + sp + (size_t)nch * q.chb, codes + sc + (size_t)q.q * q.rowpack, d,
                      ws, err);
    return rc;
  }
  if (info->shape.kind == KV_SECTION_K) {
    rc = enc_percol(info, s8, row_map, q.r0, q.q, p->group, bits, 0, 0, pairs, codes, q.rowpack,
                    ws, err);
    if (rc != KV_CODEC_OK)
      return rc;
  } else {
    memset(codes, 0, q.codes_bytes);
    uint32_t ng = (d + p->group - 1) / p->group;
    for (uint32_t r = 0; r < q.q; r++) {
      if ((rc = load_row(info, s8, row_map, q.r0 + r, x, err)) != KV_CODEC_OK)
        return rc;
      uint8_t *row = codes + (size_t)r * q.rowpack;
      for (uint32_t k = 0; k < ng; k++) {
        uint32_t j0 = k * p->group, j1 = j0 + p->group < d ? j0 + p->group : d;
        float lo = INFINITY, hi = -INFINITY;
        for (uint32_t j = j0; j < j1; j++) {
          lo = x[j] < lo ? x[j] : lo;
          hi = x[j] > hi ? x[j] : hi;
        }
        uint16_t sh, zh;
        scale_zero(lo, hi, maxq, &sh, &zh);
        uint8_t *pp = pairs + 4 * (size_t)r * ng; /* scales[ng] then zeros[ng] */
        kv_codec_put_le16(pp + 2 * (size_t)k, sh);
        kv_codec_put_le16(pp + 2 * (size_t)ng + 2 * (size_t)k, zh);
        float sf = kv_codec_f16_to_f32(sh);
        double z = kv_codec_f16_to_f32(zh), iv = sf > 0 ? 1.0 / sf : 0.0;
        for (uint32_t j = j0; j < j1; j++)
          put_code(row, bits, j, quantize(x[j], z, iv, maxq));
      }
    }
  }
  size_t rowb = (size_t)d * kv_codec_dtype_bytes(info->shape.dtype);
  for (uint32_t r = q.q; r < q.t; r++) {
    uint32_t sr = row_map ? row_map[q.r0 + r] : q.r0 + r;
    kv_codec_store_le(info->shape.dtype, s8 + (size_t)sr * rowb, d, raw + (size_t)(r - q.q) * rowb);
  }
  return KV_CODEC_OK;
}

/* ---- decoding: portable ------------------------------------------------------------------------ */

/*
 * N (16 or 8) channels from channel j, codes one byte each (codes points at channel j's).
 * Every loop has a constant trip count once inlined, which is what gcc -O2's "very cheap"
 * vectorizer needs, and the conversion is branch-free, so each loop becomes SSE2/NEON code.
 */
static inline void deqn_portable(const uint8_t *codes, uint32_t j, const float *s,
                                 const float *z, float sb, float zb, kv_codec_dtype dt,
                                 uint8_t *out, int N)
{
  float c[16], y[16];
  for (int k = 0; k < N; k++)
    c[k] = (float)codes[k];
  if (s != NULL)
    for (int k = 0; k < N; k++)
      y[k] = clamp_fp16_range(c[k] * s[j + k] + z[j + k]);
  else
    for (int k = 0; k < N; k++)
      y[k] = clamp_fp16_range(c[k] * sb + zb);
  if (dt == KV_CODEC_F16) {
    uint16_t h[16];
    for (int k = 0; k < N; k++)
      h[k] = kv_codec_f16_rne(y[k]);
    memcpy(out + 2 * (size_t)j, h, 2 * (size_t)N);
  } else if (dt == KV_CODEC_BF16) {
    uint16_t h[16];
    for (int k = 0; k < N; k++)
      h[k] = kv_codec_bf16_rne(y[k]);
    memcpy(out + 2 * (size_t)j, h, 2 * (size_t)N);
  } else {
    memcpy(out + 4 * (size_t)j, y, 4 * (size_t)N);
  }
}

/*
 * Channels [j0, j1) of one row: y = code * scale + zero, scale/zero per channel (s, z indexed
 * by channel) or one pair for the span (s == NULL: sb, zb); blocks of 16, then one of 8, then
 * one channel at a time for the rest. y is finite, so the branch-free conversions apply.
 * Output elements are in host order, like every decoder's.
 */
static void deq_span_portable(const uint8_t *codes, unsigned bits, uint32_t j0, uint32_t j1,
                              const float *s, const float *z, float sb, float zb,
                              kv_codec_dtype dt, uint8_t *out_row, float *tmp, uint8_t *u8)
{
  uint32_t n = j1 - j0, j = 0;
  const uint8_t *c8 = codes + j0;
  if (bits != 8) { /* unpack the whole span first: no store-to-load stalls in the blocks */
    for (uint32_t k = 0; k < n; k++)
      u8[k] = (uint8_t)get_code(codes, bits, j0 + k);
    c8 = u8;
  }
  for (; j + 16 <= n; j += 16)
    deqn_portable(c8 + j, j0 + j, s, z, sb, zb, dt, out_row, 16);
  if (j + 8 <= n) {
    deqn_portable(c8 + j, j0 + j, s, z, sb, zb, dt, out_row, 8);
    j += 8;
  }
  for (uint32_t k = j; k < n; k++)
    tmp[k - j] = clamp_fp16_range(s != NULL ? (float)c8[k] * s[j0 + k] + z[j0 + k]
                                            : (float)c8[k] * sb + zb);
  kv_codec_from_f32(dt, tmp, n - j, out_row + (size_t)(j0 + j) * kv_codec_dtype_bytes(dt));
}

/* ---- decoding: AVX2 + F16C -------------------------------------------------------------------- */

#if KV_QUANT_X86
#define KV_AVX2 __attribute__((target("avx2,f16c,fma")))
#define KV_INLINE __attribute__((always_inline)) inline

int kv_quant_simd_available(void)
{
#if defined(__clang__)
  /* clang 14 cannot test f16c; every AVX2 CPU has it */
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c") &&
         __builtin_cpu_supports("fma");
#endif
}

/* 16 codes starting at channel j (j * bits a multiple of 8) as two float vectors. */
KV_AVX2 static KV_INLINE void codes16(const uint8_t *row, unsigned bits, uint32_t j, __m256 *c0,
                                      __m256 *c1)
{
  __m128i v;
  if (bits == 8) {
    v = _mm_loadu_si128((const __m128i *)(const void *)(row + j));
  } else if (bits == 4) {
    __m128i x = _mm_loadl_epi64((const __m128i *)(const void *)(row + j / 2));
    __m128i m = _mm_set1_epi8(0x0f);
    v = _mm_unpacklo_epi8(_mm_and_si128(x, m), _mm_and_si128(_mm_srli_epi16(x, 4), m));
  } else {
    int32_t w;
    memcpy(&w, row + j / 4, 4);
    __m128i x = _mm_shuffle_epi8(_mm_cvtsi32_si128(w),
                                 _mm_setr_epi8(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3));
    __m256i sh = _mm256_setr_epi32(0, 2, 4, 6, 0, 2, 4, 6), three = _mm256_set1_epi32(3);
    __m256i a = _mm256_and_si256(_mm256_srlv_epi32(_mm256_cvtepu8_epi32(x), sh), three);
    __m256i b =
      _mm256_and_si256(_mm256_srlv_epi32(_mm256_cvtepu8_epi32(_mm_srli_si128(x, 8)), sh), three);
    *c0 = _mm256_cvtepi32_ps(a);
    *c1 = _mm256_cvtepi32_ps(b);
    return;
  }
  *c0 = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(v));
  *c1 = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(v, 8)));
}

/* 8 codes starting at channel j (j * bits a multiple of 8) as one float vector; reads exactly
 * the bits bytes that hold them. */
KV_AVX2 static KV_INLINE __m256 codes8(const uint8_t *row, unsigned bits, uint32_t j)
{
  __m128i v;
  if (bits == 8) {
    v = _mm_loadl_epi64((const __m128i *)(const void *)(row + j));
  } else if (bits == 4) {
    int32_t w;
    memcpy(&w, row + j / 2, 4);
    __m128i x = _mm_cvtsi32_si128(w), m = _mm_set1_epi8(0x0f);
    v = _mm_unpacklo_epi8(_mm_and_si128(x, m), _mm_and_si128(_mm_srli_epi16(x, 4), m));
  } else {
    uint16_t w;
    memcpy(&w, row + j / 4, 2);
    __m128i x = _mm_shuffle_epi8(_mm_cvtsi32_si128(w),
                                 _mm_setr_epi8(0, 0, 0, 0, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0));
    __m256i sh = _mm256_setr_epi32(0, 2, 4, 6, 0, 2, 4, 6);
    return _mm256_cvtepi32_ps(
      _mm256_and_si256(_mm256_srlv_epi32(_mm256_cvtepu8_epi32(x), sh), _mm256_set1_epi32(3)));
  }
  return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(v));
}

/*
 * The 8 codes of a row of head_dim 8 (bits bytes) as floats, unpacked with one broadcast and
 * variable shifts: no shuffle-port work, which is what limits these short rows.
 */
KV_AVX2 static KV_INLINE __m256 codes_row8(const uint8_t *row, unsigned bits)
{
  if (bits == 8)
    return _mm256_cvtepi32_ps(
      _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(const void *)row)));
  int32_t w;
  __m256i sh, m;
  if (bits == 4) {
    memcpy(&w, row, 4);
    sh = _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28);
    m = _mm256_set1_epi32(15);
  } else {
    uint16_t h;
    memcpy(&h, row, 2);
    w = h;
    sh = _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14);
    m = _mm256_set1_epi32(3);
  }
  return _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(w), sh), m));
}

/* 16 bytes at out: an ordinary store, or (nt) a streaming one (out is 16-byte aligned then). */
KV_AVX2 static KV_INLINE void store16(uint8_t *out, __m128i v, int nt)
{
  if (nt)
    _mm_stream_si128((__m128i *)(void *)out, v);
  else
    _mm_storeu_si128((__m128i *)(void *)out, v);
}

/* 8 elements of dt at out; nt: with streaming stores (out 16-byte aligned); clamp = 0 when the
 * caller knows y is inside +-KV_QUANT_MAX (no_clamp_avx2). */
KV_AVX2 static KV_INLINE void store8c(kv_codec_dtype dt, uint8_t *out, __m256 y, int nt, int clamp)
{
  /* clamp_fp16_range(), 8 at a time (y is never NaN: finite codes, scales and zeros) */
  if (clamp)
    y = _mm256_min_ps(_mm256_max_ps(y, _mm256_set1_ps(-KV_QUANT_MAX)),
                      _mm256_set1_ps(KV_QUANT_MAX));
  if (dt == KV_CODEC_F16) {
    store16(out, _mm256_cvtps_ph(y, _MM_FROUND_TO_NEAREST_INT), nt);
  } else if (dt == KV_CODEC_BF16) { /* y is finite here: round to nearest even */
    __m256i b = _mm256_castps_si256(y);
    __m256i odd = _mm256_and_si256(_mm256_srli_epi32(b, 16), _mm256_set1_epi32(1));
    b = _mm256_srli_epi32(_mm256_add_epi32(b, _mm256_add_epi32(odd, _mm256_set1_epi32(0x7fff))), 16);
    store16(out, _mm_packus_epi32(_mm256_castsi256_si128(b), _mm256_extracti128_si256(b, 1)), nt);
  } else {
    store16(out, _mm_castps_si128(_mm256_castps256_ps128(y)), nt);
    store16(out + 16, _mm_castps_si128(_mm256_extractf128_ps(y, 1)), nt);
  }
}

KV_AVX2 static KV_INLINE void store8(kv_codec_dtype dt, uint8_t *out, __m256 y, int nt)
{
  store8c(dt, out, y, nt, 1);
}

/*
 * Channels [j0, j0 + len) of one row (j0 * bits a multiple of 8): blocks of 16, then one of 8;
 * per-channel s/z (s != NULL, indexed by channel) or one pair sb/zb. Returns the channels done,
 * len rounded down to a multiple of 8; the caller does the rest.
 */
KV_AVX2 static KV_INLINE uint32_t deq_blocks(const uint8_t *codes, unsigned bits, uint32_t j0,
                                             uint32_t len, const float *s, const float *z,
                                             float sb, float zb, kv_codec_dtype dt,
                                             uint8_t *out_row, int nt)
{
  size_t es = dt == KV_CODEC_F32 ? 4 : 2;
  __m256 vs = _mm256_set1_ps(sb), vz = _mm256_set1_ps(zb);
  uint32_t j = j0, end16 = j0 + len / 16 * 16;
  for (; j < end16; j += 16) {
    __m256 c0, c1, s0 = vs, s1 = vs, z0 = vz, z1 = vz;
    codes16(codes, bits, j, &c0, &c1);
    if (s != NULL) {
      s0 = _mm256_loadu_ps(s + j);
      s1 = _mm256_loadu_ps(s + j + 8);
      z0 = _mm256_loadu_ps(z + j);
      z1 = _mm256_loadu_ps(z + j + 8);
    }
    store8(dt, out_row + j * es, _mm256_add_ps(_mm256_mul_ps(c0, s0), z0), nt);
    store8(dt, out_row + (j + 8) * es, _mm256_add_ps(_mm256_mul_ps(c1, s1), z1), nt);
  }
  if (len % 16 >= 8) {
    if (s != NULL) {
      vs = _mm256_loadu_ps(s + j);
      vz = _mm256_loadu_ps(z + j);
    }
    store8(dt, out_row + j * es, _mm256_add_ps(_mm256_mul_ps(codes8(codes, bits, j), vs), vz), nt);
  }
  return len / 8 * 8;
}

/* fp16 little-endian -> float, n values */
/*
 * rope_rotate_rows for f16 rows of adjacent pairs, d % 8 == 0: the same float operations, eight
 * lanes at a time. ws: per chain j, vc[j], vs[j] (cos and sin of each channel's pair,
 * duplicated over the pair: KV_ROPE_CHAINS x d floats each), then vct, vst (d each): 10d
 * floats, set by the caller. head_dim 8 keeps the four chains in registers.
 */
KV_AVX2 static void rope_rows_avx2(uint32_t d, uint32_t rows, uint8_t *out, size_t rowb,
                                   float *ws)
{
  float *vc = ws, *vs = vc + KV_ROPE_CHAINS * d, *vct = vs + KV_ROPE_CHAINS * d, *vst = vct + d;
  const __m256 sign = _mm256_setr_ps(-0.0f, 0.0f, -0.0f, 0.0f, -0.0f, 0.0f, -0.0f, 0.0f);
#define ROPE8(ROW, C, S, CT, ST)                                                                   \
  do {                                                                                             \
    __m256 y_ = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(ROW)));           \
    __m256 z_ = _mm256_add_ps(_mm256_mul_ps(y_, C),                                              \
                              _mm256_mul_ps(_mm256_permute_ps(y_, 0xb1), _mm256_xor_ps(S, sign))); \
    _mm_storeu_si128((__m128i *)(void *)(ROW),                                                     \
                     _mm256_cvtps_ph(z_, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));         \
    __m256 cn_ = _mm256_sub_ps(_mm256_mul_ps(C, CT), _mm256_mul_ps(S, ST));                       \
    S = _mm256_add_ps(_mm256_mul_ps(S, CT), _mm256_mul_ps(C, ST));                                 \
    C = cn_;                                                                                       \
  } while (0)
  if (d == 8) {
    __m256 c0 = _mm256_loadu_ps(vc), c1 = _mm256_loadu_ps(vc + 8), c2 = _mm256_loadu_ps(vc + 16);
    __m256 c3 = _mm256_loadu_ps(vc + 24), s0 = _mm256_loadu_ps(vs), s1 = _mm256_loadu_ps(vs + 8);
    __m256 s2 = _mm256_loadu_ps(vs + 16), s3 = _mm256_loadu_ps(vs + 24);
    __m256 ct = _mm256_loadu_ps(vct), st = _mm256_loadu_ps(vst);
    uint32_t r = 0;
    for (; r + 4 <= rows; r += 4) {
      ROPE8(out + (size_t)r * rowb, c0, s0, ct, st);
      ROPE8(out + (size_t)(r + 1) * rowb, c1, s1, ct, st);
      ROPE8(out + (size_t)(r + 2) * rowb, c2, s2, ct, st);
      ROPE8(out + (size_t)(r + 3) * rowb, c3, s3, ct, st);
    }
    if (r < rows)
      ROPE8(out + (size_t)r * rowb, c0, s0, ct, st);
    if (r + 1 < rows)
      ROPE8(out + (size_t)(r + 1) * rowb, c1, s1, ct, st);
    if (r + 2 < rows)
      ROPE8(out + (size_t)(r + 2) * rowb, c2, s2, ct, st);
    return;
  }
  for (uint32_t r = 0; r < rows; r++) {
    uint8_t *row = out + (size_t)r * rowb;
    float *cj = vc + (size_t)(r % KV_ROPE_CHAINS) * d, *sj = vs + (size_t)(r % KV_ROPE_CHAINS) * d;
    for (uint32_t k = 0; k < d; k += 8) {
      __m256 c = _mm256_loadu_ps(cj + k), sn = _mm256_loadu_ps(sj + k);
      __m256 ct = _mm256_loadu_ps(vct + k), st = _mm256_loadu_ps(vst + k);
      ROPE8(row + 2 * k, c, sn, ct, st);
      _mm256_storeu_ps(cj + k, c);
      _mm256_storeu_ps(sj + k, sn);
    }
  }
#undef ROPE8
}

KV_AVX2 static void halves_avx2(const uint8_t *src, uint32_t n, float *dst)
{
  uint32_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(dst + i,
                     _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(src + 2 * i))));
  for (; i < n; i++)
    dst[i] = _cvtsh_ss(kv_codec_get_le16(src + 2 * i));
}

/*
 * K: `rows` rows sharing per-channel s/z; channels [0, d/8*8). Head dims of 8 (one vector per
 * row: the tiny models) keep s and z in registers across the rows.
 */
KV_AVX2 static KV_INLINE void k_rows_impl(const uint8_t *codes, size_t rowpack, uint32_t rows,
                                          uint32_t d, unsigned bits, const float *s,
                                          const float *z, kv_codec_dtype dt, uint8_t *out,
                                          size_t rowb, int nt, int clamp)
{
  if (d == 8) {
    __m256 vs = _mm256_loadu_ps(s), vz = _mm256_loadu_ps(z);
    for (uint32_t r = 0; r < rows; r++)
      store8c(dt, out + r * rowb, _mm256_fmadd_ps(codes_row8(codes + r * rowpack, bits), vs, vz),
              nt, clamp);
    return;
  }
  for (uint32_t r = 0; r < rows; r++)
    deq_blocks(codes + r * rowpack, bits, 0, d, s, z, 0, 0, dt, out + r * rowb, nt);
}

/*
 * Pre-RoPE K, f16 rows of adjacent pairs, d % 8 == 0: each row dequantized as k_rows_impl
 * does, rounded to f16 and widened back (what rope_rows_avx2 would read from the output),
 * then rotated as rope_rows_avx2 rotates it, with the row's cos and sin from tab (rope_table:
 * row r at tab + 2 r d): the bits of the two passes, in one, and no angle recurrence.
 */
KV_AVX2 static KV_INLINE __m256 rope_f16_round(__m256 y, int clamp)
{
  if (clamp)
    y = _mm256_min_ps(_mm256_max_ps(y, _mm256_set1_ps(-KV_QUANT_MAX)),
                      _mm256_set1_ps(KV_QUANT_MAX));
  return _mm256_cvtph_ps(_mm256_cvtps_ph(y, _MM_FROUND_TO_NEAREST_INT));
}

KV_AVX2 static KV_INLINE __m128i rope_apply(__m256 y, const float *c, const float *sn)
{
  __m256 z = _mm256_add_ps(_mm256_mul_ps(y, _mm256_loadu_ps(c)),
                           _mm256_mul_ps(_mm256_permute_ps(y, 0xb1), _mm256_loadu_ps(sn)));
  return _mm256_cvtps_ph(z, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}

/*
 * Whether code * s + z stays inside +-KV_QUANT_MAX for every code 0..maxq of channels
 * [0, d/8*8): then clamp_fp16_range() is the identity on every row of the chunk and a kernel
 * may skip it (y is monotonic in the code: code * s is exact and rounding is monotonic).
 */
KV_AVX2 static int no_clamp_avx2(const float *s, const float *z, uint32_t d, unsigned bits)
{
  __m256 lim = _mm256_set1_ps(KV_QUANT_MAX), nlim = _mm256_set1_ps(-KV_QUANT_MAX);
  __m256 mq = _mm256_set1_ps((float)((1u << bits) - 1)), bad = _mm256_setzero_ps();
  for (uint32_t k = 0; k + 8 <= d; k += 8) {
    __m256 vs = _mm256_loadu_ps(s + k), vz = _mm256_loadu_ps(z + k);
    __m256 hi = _mm256_fmadd_ps(mq, vs, vz);
    bad = _mm256_or_ps(bad, _mm256_cmp_ps(vz, nlim, _CMP_LT_OQ));
    bad = _mm256_or_ps(bad, _mm256_cmp_ps(vz, lim, _CMP_GT_OQ));
    bad = _mm256_or_ps(bad, _mm256_cmp_ps(hi, nlim, _CMP_LT_OQ));
    bad = _mm256_or_ps(bad, _mm256_cmp_ps(hi, lim, _CMP_GT_OQ));
    bad = _mm256_or_ps(bad, _mm256_cmp_ps(hi, hi, _CMP_UNORD_Q));
    bad = _mm256_or_ps(bad, _mm256_cmp_ps(vz, vz, _CMP_UNORD_Q));
  }
  return _mm256_movemask_ps(bad) == 0;
}

KV_AVX2 static KV_INLINE void k_rows_rope_impl(const uint8_t *codes, size_t rowpack, uint32_t rows,
                                               uint32_t d, unsigned bits, const float *s,
                                               const float *z, const float *tab, uint8_t *out,
                                               size_t rowb, int nt, int clamp)
{
  if (d == 8) {
    __m256 vs = _mm256_loadu_ps(s), vz = _mm256_loadu_ps(z);
    for (uint32_t r = 0; r < rows; r++) {
      __m256 y =
        rope_f16_round(_mm256_fmadd_ps(codes_row8(codes + r * rowpack, bits), vs, vz), clamp);
      store16(out + r * rowb, rope_apply(y, tab + 16 * (size_t)r, tab + 16 * (size_t)r + 8), nt);
    }
    return;
  }
  for (uint32_t r = 0; r < rows; r++) {
    const uint8_t *row = codes + r * rowpack;
    const float *tc = tab + 2 * (size_t)r * d;
    for (uint32_t k = 0; k < d; k += 8) {
      __m256 y = _mm256_add_ps(_mm256_mul_ps(codes8(row, bits, k), _mm256_loadu_ps(s + k)),
                               _mm256_loadu_ps(z + k));
      store16(out + r * rowb + 2 * (size_t)k,
              rope_apply(rope_f16_round(y, clamp), tc + k, tc + d + k), nt);
    }
  }
}

KV_AVX2 static void k_rows_rope_avx2(const uint8_t *codes, size_t rowpack, uint32_t rows,
                                     uint32_t d, unsigned bits, const float *s, const float *z,
                                     const float *tab, uint8_t *out, size_t rowb, int nt)
{
  int clamp = !no_clamp_avx2(s, z, d, bits);
#define KR_CALL(B, NT)                                                                             \
  do {                                                                                             \
    if (clamp)                                                                                     \
      k_rows_rope_impl(codes, rowpack, rows, d, B, s, z, tab, out, rowb, NT, 1);                   \
    else                                                                                           \
      k_rows_rope_impl(codes, rowpack, rows, d, B, s, z, tab, out, rowb, NT, 0);                   \
  } while (0)
  switch (bits * 2 + (nt ? 1u : 0u)) {
  case 8 * 2: KR_CALL(8, 0); break;
  case 8 * 2 + 1: KR_CALL(8, 1); break;
  case 4 * 2: KR_CALL(4, 0); break;
  case 4 * 2 + 1: KR_CALL(4, 1); break;
  case 2 * 2: KR_CALL(2, 0); break;
  case 2 * 2 + 1: KR_CALL(2, 1); break;
  default: break;
  }
#undef KR_CALL
}

/*
 * kvquant with per-channel widths (flags bit 3), d % 8 == 0: block k of a row is the `bits`
 * bytes at byte bits x k; each channel's code is (word >> sh) & mask, word = the block's bits
 * 0..31 or 24..55 (alloc_layout: shifts, masks, word selects at shm, + d, + 2d), so a row of
 * head_dim 8 is a broadcast (two and a blend above 4 bits), a variable shift and an and:
 * kivi's cost. bits is a constant in every instance (k_rows_alloc_avx2). A block is loaded
 * as a whole 4- or 8-byte word (then masked to its bits bytes) wherever that many bytes remain
 * before end, the end of the codes: a load of exactly 3, 5, 6 or 7 bytes goes through the stack
 * and stalls its store forwarding (measured: 1.4 GB/s instead of 11); the last rows gather
 * their bytes in a register. tab (f16 only): pre-RoPE K rotated as k_rows_rope_impl does.
 */
static inline uint64_t load_le_bytes(const uint8_t *b, unsigned n)
{
  uint64_t w = 0;
  for (unsigned i = 0; i < n; i++)
    w |= (uint64_t)b[i] << (8 * i);
  return w;
}

KV_AVX2 static KV_INLINE __m256 codes_alloc8(const uint8_t *row, unsigned bits, uint32_t k,
                                             size_t left, __m256i sh, __m256i m, __m256i sel)
{
  const uint8_t *b = row + (size_t)bits * k; /* left: the bytes of the codes from b on */
  __m256i v;
  if (bits <= 4) { /* every code inside bits 0..31 */
    uint32_t w;
    if (left >= 4) {
      memcpy(&w, b, 4); /* little-endian host (x86) */
      if (bits < 4)
        w &= (1u << (8 * bits)) - 1u;
    } else {
      w = (uint32_t)load_le_bytes(b, bits);
    }
    v = _mm256_set1_epi32((int32_t)w);
  } else {
    uint64_t w;
    if (left >= 8) {
      memcpy(&w, b, 8);
      w &= ((uint64_t)1 << (8 * bits)) - 1u;
    } else {
      w = load_le_bytes(b, bits);
    }
    v = _mm256_blendv_epi8(_mm256_set1_epi32((int32_t)(uint32_t)w),
                           _mm256_set1_epi32((int32_t)(uint32_t)(w >> 24)), sel);
  }
  return _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srlv_epi32(v, sh), m));
}

KV_AVX2 static KV_INLINE void k_rows_alloc_impl(const uint8_t *codes, size_t rowpack,
                                                uint32_t rows, uint32_t d, unsigned bits,
                                                const float *s, const float *z, const int32_t *shm,
                                                const float *tab, kv_codec_dtype dt, uint8_t *out,
                                                size_t rowb, int nt, int clamp)
{
  size_t es = dt == KV_CODEC_F32 ? 4 : 2;
  const uint8_t *end = codes + (size_t)rows * rowpack;
  if (d == 8) {
    __m256 vs = _mm256_loadu_ps(s), vz = _mm256_loadu_ps(z);
    __m256i sh = _mm256_loadu_si256((const __m256i *)(const void *)shm);
    __m256i m = _mm256_loadu_si256((const __m256i *)(const void *)(shm + 8));
    __m256i sel = _mm256_loadu_si256((const __m256i *)(const void *)(shm + 16));
    /* a row is `bits` bytes here; rows [0, fast) have a whole 4- or 8-byte word before end:
     * their loop needs no check (the last rows go through codes_alloc8's) */
    uint32_t word = bits <= 4 ? 4 : 8, need = (word + bits - 1) / bits;
    uint32_t fast = rows >= need ? rows - need + 1 : 0, r = 0;
#define ALLOC_ROW8(LEFT)                                                                           \
  do {                                                                                             \
    __m256 y_ = _mm256_fmadd_ps(codes_alloc8(codes + (size_t)r * bits, bits, 0, LEFT, sh, m, sel), \
                                vs, vz);                                                           \
    if (tab != NULL)                                                                               \
      store16(out + r * rowb,                                                                      \
              rope_apply(rope_f16_round(y_, clamp), tab + 16 * (size_t)r,                          \
                         tab + 16 * (size_t)r + 8),                                                \
              nt);                                                                                 \
    else                                                                                           \
      store8c(dt, out + r * rowb, y_, nt, clamp);                                                  \
  } while (0)
    if (tab != NULL) /* the same loops twice: tab's test leaves each of them */
      for (; r < fast; r++)
        ALLOC_ROW8(8);
    else
      for (; r < fast; r++)
        ALLOC_ROW8(8);
    for (; r < rows; r++)
      ALLOC_ROW8((size_t)(rows - r) * bits);
#undef ALLOC_ROW8
    return;
  }
  for (uint32_t r = 0; r < rows; r++) {
    const uint8_t *row = codes + r * rowpack;
    for (uint32_t k = 0; k < d; k += 8) {
      __m256i sh = _mm256_loadu_si256((const __m256i *)(const void *)(shm + k));
      __m256i m = _mm256_loadu_si256((const __m256i *)(const void *)(shm + d + k));
      __m256i sel = _mm256_loadu_si256((const __m256i *)(const void *)(shm + 2 * (size_t)d + k));
      size_t left = (size_t)(end - row) - (size_t)bits * (k / 8);
      __m256 y = _mm256_fmadd_ps(codes_alloc8(row, bits, k / 8, left, sh, m, sel),
                                 _mm256_loadu_ps(s + k), _mm256_loadu_ps(z + k));
      if (tab != NULL) {
        const float *tc = tab + 2 * (size_t)r * d;
        store16(out + r * rowb + 2 * (size_t)k,
                rope_apply(rope_f16_round(y, clamp), tc + k, tc + d + k), nt);
      } else {
        store8c(dt, out + r * rowb + k * es, y, nt, clamp);
      }
    }
  }
}


/*
 * V: `rows` rows, each with ng (scale, zero) pairs of `group` channels (group % 8 == 0), the
 * pairs of a row fp16 [ng scales][ng zeros]; channels [j0, j0 + len/8*8) of every group.
 * One pair per row of 8 channels (head_dim 8): eight rows' pairs are widened at once and
 * broadcast from memory.
 */
KV_AVX2 static KV_INLINE void v_rows_impl(const uint8_t *codes, size_t rowpack,
                                          const uint8_t *params, uint32_t rows, uint32_t d,
                                          uint32_t group, unsigned bits, kv_codec_dtype dt,
                                          uint8_t *out, size_t rowb, int nt)
{
  uint32_t ng = (d + group - 1) / group, r = 0;
  if (d == 8 && group == 8) { /* params: s0 z0 s1 z1 ... (4 bytes per row) */
    float sz[16] __attribute__((aligned(32)));
    for (; r + 8 <= rows; r += 8) {
      const uint8_t *pp = params + 4 * (size_t)r;
      _mm256_store_ps(sz, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)pp)));
      _mm256_store_ps(sz + 8,
                      _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(pp + 16))));
      for (uint32_t i = 0; i < 8; i++) { /* broadcasts from memory: load ports, not shuffles */
        __m256 c = codes_row8(codes + (r + i) * rowpack, bits);
        __m256 y = _mm256_fmadd_ps(c, _mm256_broadcast_ss(sz + 2 * i),
                                   _mm256_broadcast_ss(sz + 2 * i + 1));
        store8(dt, out + (r + i) * rowb, y, nt);
      }
    }
  }
  for (; r < rows; r++) {
    const uint8_t *pr = params + 4 * (size_t)r * ng;
    for (uint32_t k = 0; k < ng; k++) {
      uint32_t j0 = k * group, len = j0 + group < d ? group : d - j0;
      float sb = _cvtsh_ss(kv_codec_get_le16(pr + 2 * (size_t)k));
      float zb = _cvtsh_ss(kv_codec_get_le16(pr + 2 * (size_t)ng + 2 * (size_t)k));
      deq_blocks(codes + r * rowpack, bits, j0, len, NULL, NULL, sb, zb, dt, out + r * rowb, nt);
    }
  }
}

/* One instance of a kernel per (bits, dtype, streaming stores), all constants inside. */
#define KV_SWITCH_BITS_DT_NT(CALL)                                                                 \
  switch ((bits * 4 + (unsigned)dt) * 2 + (nt ? 1u : 0u)) {                                        \
  case (8 * 4 + KV_CODEC_F16) * 2: CALL(8, KV_CODEC_F16, 0); break;                                \
  case (8 * 4 + KV_CODEC_BF16) * 2: CALL(8, KV_CODEC_BF16, 0); break;                              \
  case (8 * 4 + KV_CODEC_F32) * 2: CALL(8, KV_CODEC_F32, 0); break;                                \
  case (4 * 4 + KV_CODEC_F16) * 2: CALL(4, KV_CODEC_F16, 0); break;                                \
  case (4 * 4 + KV_CODEC_BF16) * 2: CALL(4, KV_CODEC_BF16, 0); break;                              \
  case (4 * 4 + KV_CODEC_F32) * 2: CALL(4, KV_CODEC_F32, 0); break;                                \
  case (2 * 4 + KV_CODEC_F16) * 2: CALL(2, KV_CODEC_F16, 0); break;                                \
  case (2 * 4 + KV_CODEC_BF16) * 2: CALL(2, KV_CODEC_BF16, 0); break;                              \
  case (2 * 4 + KV_CODEC_F32) * 2: CALL(2, KV_CODEC_F32, 0); break;                                \
  case (8 * 4 + KV_CODEC_F16) * 2 + 1: CALL(8, KV_CODEC_F16, 1); break;                            \
  case (8 * 4 + KV_CODEC_BF16) * 2 + 1: CALL(8, KV_CODEC_BF16, 1); break;                          \
  case (8 * 4 + KV_CODEC_F32) * 2 + 1: CALL(8, KV_CODEC_F32, 1); break;                            \
  case (4 * 4 + KV_CODEC_F16) * 2 + 1: CALL(4, KV_CODEC_F16, 1); break;                            \
  case (4 * 4 + KV_CODEC_BF16) * 2 + 1: CALL(4, KV_CODEC_BF16, 1); break;                          \
  case (4 * 4 + KV_CODEC_F32) * 2 + 1: CALL(4, KV_CODEC_F32, 1); break;                            \
  case (2 * 4 + KV_CODEC_F16) * 2 + 1: CALL(2, KV_CODEC_F16, 1); break;                            \
  case (2 * 4 + KV_CODEC_BF16) * 2 + 1: CALL(2, KV_CODEC_BF16, 1); break;                          \
  case (2 * 4 + KV_CODEC_F32) * 2 + 1: CALL(2, KV_CODEC_F32, 1); break;                            \
  default: break;                                                                                  \
  }

KV_AVX2 static void k_rows_avx2(const uint8_t *codes, size_t rowpack, uint32_t rows, uint32_t d,
                                unsigned bits, const float *s, const float *z, kv_codec_dtype dt,
                                uint8_t *out, size_t rowb, int nt)
{
  /* head_dim 8 without the clamp where no code can leave the fp16 range (no_clamp_avx2) */
  int clamp = d != 8 || !no_clamp_avx2(s, z, d, bits);
#define K_CALL(B, DT, NT)                                                                          \
  do {                                                                                             \
    if (clamp)                                                                                     \
      k_rows_impl(codes, rowpack, rows, d, B, s, z, DT, out, rowb, NT, 1);                         \
    else                                                                                           \
      k_rows_impl(codes, rowpack, rows, d, B, s, z, DT, out, rowb, NT, 0);                         \
  } while (0)
  KV_SWITCH_BITS_DT_NT(K_CALL)
#undef K_CALL
}

KV_AVX2 static void v_rows_avx2(const uint8_t *codes, size_t rowpack, const uint8_t *params,
                                uint32_t rows, uint32_t d, uint32_t group, unsigned bits,
                                kv_codec_dtype dt, uint8_t *out, size_t rowb, int nt)
{
#define V_CALL(B, DT, NT) v_rows_impl(codes, rowpack, params, rows, d, group, B, DT, out, rowb, NT)
  KV_SWITCH_BITS_DT_NT(V_CALL)
#undef V_CALL
}

KV_AVX2 static void k_rows_alloc_avx2(const uint8_t *codes, size_t rowpack, uint32_t rows,
                                      uint32_t d, unsigned bits, const float *s, const float *z,
                                      const int32_t *shm, const float *tab, kv_codec_dtype dt,
                                      uint8_t *out, size_t rowb, int nt)
{
  /* codes <= 255 (widths <= 8): the 8-bit check covers every width */
  int clamp = !no_clamp_avx2(s, z, d, 8);
  if (tab != NULL)
    dt = KV_CODEC_F16;
  /* one instance per (bits, dtype, streaming stores, clamp): constants inside */
#define KA_CALL(B, DT, NT)                                                                         \
  do {                                                                                             \
    if (clamp)                                                                                     \
      k_rows_alloc_impl(codes, rowpack, rows, d, B, s, z, shm, tab, DT, out, rowb, NT, 1);         \
    else                                                                                           \
      k_rows_alloc_impl(codes, rowpack, rows, d, B, s, z, shm, tab, DT, out, rowb, NT, 0);         \
  } while (0)
#define KA_DT(B)                                                                                   \
  do {                                                                                             \
    switch ((unsigned)dt * 2 + (nt ? 1u : 0u)) {                                                   \
    case KV_CODEC_F16 * 2: KA_CALL(B, KV_CODEC_F16, 0); break;                                     \
    case KV_CODEC_F16 * 2 + 1: KA_CALL(B, KV_CODEC_F16, 1); break;                                 \
    case KV_CODEC_BF16 * 2: KA_CALL(B, KV_CODEC_BF16, 0); break;                                   \
    case KV_CODEC_BF16 * 2 + 1: KA_CALL(B, KV_CODEC_BF16, 1); break;                               \
    case KV_CODEC_F32 * 2: KA_CALL(B, KV_CODEC_F32, 0); break;                                     \
    case KV_CODEC_F32 * 2 + 1: KA_CALL(B, KV_CODEC_F32, 1); break;                                 \
    default: break;                                                                                \
    }                                                                                              \
  } while (0)
  switch (bits) {
  case 1: KA_DT(1); break;
  case 2: KA_DT(2); break;
  case 3: KA_DT(3); break;
  case 4: KA_DT(4); break;
  case 5: KA_DT(5); break;
  case 6: KA_DT(6); break;
  case 7: KA_DT(7); break;
  default: break;
  }
#undef KA_DT
#undef KA_CALL
}

/* One span of one row with one (sb, zb) pair: returns the channels done (see deq_blocks). */
KV_AVX2 static uint32_t span_avx2(const uint8_t *codes, unsigned bits, uint32_t j0, uint32_t len,
                                  float sb, float zb, kv_codec_dtype dt, uint8_t *out_row, int nt)
{
  uint32_t done = 0;
#define S_CALL(B, DT, NT) done = deq_blocks(codes, B, j0, len, NULL, NULL, sb, zb, DT, out_row, NT)
  KV_SWITCH_BITS_DT_NT(S_CALL)
#undef S_CALL
  return done;
}

/*
 * AVX-512 (F, BW, VL) per-channel rows, f16 output, d % 16 == 0 (issue 16: an int4 get is
 * bound by this decode once it writes straight into the caller's view): 32 channels per
 * step in two 16-lane vectors, the same operations as k_rows_impl (code x scale is exact in
 * float, so the fused multiply-add rounds once as the portable y = c * s + z does; the clamp
 * to the f16 range; vcvtps2ph to nearest), so the same bits; head_dim 128 keeps its scales and
 * zeros in registers across the rows. The clamp is left out where no code can leave the f16
 * range (no_clamp_avx2).
 */
#define KV_AVX512 __attribute__((target("avx2,f16c,fma,avx512f,avx512bw,avx512vl")))

static int g_avx512 = -1; /* -1 unknown; kv_quant_avx512() */

int kv_quant_avx512(int enable)
{
  int have = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512vl") && kv_quant_simd_available();
  int v = enable >= 0 ? (enable && have) : have;
  __atomic_store_n(&g_avx512, v, __ATOMIC_RELAXED);
  return v;
}

static int avx512_on(void)
{
  int v = __atomic_load_n(&g_avx512, __ATOMIC_RELAXED);
  return v >= 0 ? v : kv_quant_avx512(-1);
}

/* 16 codes of channels [j, j + 16) of a row as int32 lanes (j x bits a multiple of 8). */
KV_AVX512 static KV_INLINE __m512i codes16_512(const uint8_t *row, unsigned bits, uint32_t j)
{
  if (bits == 8)
    return _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(const void *)(row + j)));
  if (bits == 4) {
    __m128i x = _mm_loadl_epi64((const __m128i *)(const void *)(row + j / 2)), m = _mm_set1_epi8(0x0f);
    return _mm512_cvtepu8_epi32(
      _mm_unpacklo_epi8(_mm_and_si128(x, m), _mm_and_si128(_mm_srli_epi16(x, 4), m)));
  }
  int32_t w;
  memcpy(&w, row + j / 4, 4);
  __m128i x = _mm_shuffle_epi8(_mm_cvtsi32_si128(w),
                               _mm_setr_epi8(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3));
  __m512i sh = _mm512_setr_epi32(0, 2, 4, 6, 0, 2, 4, 6, 0, 2, 4, 6, 0, 2, 4, 6);
  return _mm512_and_si512(_mm512_srlv_epi32(_mm512_cvtepu8_epi32(x), sh), _mm512_set1_epi32(3));
}

KV_AVX512 static KV_INLINE void store_ph512(uint8_t *out, __m512 y, int nt, int clamp)
{
  if (clamp)
    y = _mm512_min_ps(_mm512_max_ps(y, _mm512_set1_ps(-KV_QUANT_MAX)),
                      _mm512_set1_ps(KV_QUANT_MAX));
  __m256i h = _mm512_cvtps_ph(y, _MM_FROUND_TO_NEAREST_INT);
  if (nt) { /* out is 16-byte aligned */
    _mm_stream_si128((__m128i *)(void *)out, _mm256_castsi256_si128(h));
    _mm_stream_si128((__m128i *)(void *)(out + 16), _mm256_extracti128_si256(h, 1));
  } else {
    _mm256_storeu_si256((__m256i *)(void *)out, h);
  }
}

/* D: head_dim when it is a constant of the instance (128), 0 for any d % 16 == 0 */
KV_AVX512 static KV_INLINE void k_rows512_impl(const uint8_t *codes, size_t rowpack,
                                               uint32_t rows, uint32_t d, unsigned bits,
                                               const float *s, const float *z, uint8_t *out,
                                               size_t rowb, int nt, int clamp, uint32_t D)
{
  if (D != 0) {
    __m512 vs[8], vz[8]; /* D <= 128 */
    for (uint32_t k = 0; k < D / 16; k++) {
      vs[k] = _mm512_loadu_ps(s + 16 * k);
      vz[k] = _mm512_loadu_ps(z + 16 * k);
    }
    for (uint32_t r = 0; r < rows; r++) {
      const uint8_t *row = codes + (size_t)r * rowpack;
      uint8_t *o = out + (size_t)r * rowb;
      for (uint32_t k = 0; k < D / 16; k++)
        store_ph512(o + 32 * k,
                    _mm512_fmadd_ps(_mm512_cvtepi32_ps(codes16_512(row, bits, 16 * k)), vs[k],
                                    vz[k]),
                    nt, clamp);
    }
    return;
  }
  for (uint32_t r = 0; r < rows; r++) {
    const uint8_t *row = codes + (size_t)r * rowpack;
    uint8_t *o = out + (size_t)r * rowb;
    for (uint32_t j = 0; j < d; j += 16)
      store_ph512(o + 2 * (size_t)j,
                  _mm512_fmadd_ps(_mm512_cvtepi32_ps(codes16_512(row, bits, j)),
                                  _mm512_loadu_ps(s + j), _mm512_loadu_ps(z + j)),
                  nt, clamp);
  }
}

KV_AVX512 static void k_rows_avx512(const uint8_t *codes, size_t rowpack, uint32_t rows,
                                    uint32_t d, unsigned bits, const float *s, const float *z,
                                    uint8_t *out, size_t rowb, int nt)
{
  int clamp = !no_clamp_avx2(s, z, d, bits);
#define K5_CALL(B, NT, CL)                                                                         \
  do {                                                                                             \
    if (d == 128)                                                                                  \
      k_rows512_impl(codes, rowpack, rows, d, B, s, z, out, rowb, NT, CL, 128);                    \
    else                                                                                           \
      k_rows512_impl(codes, rowpack, rows, d, B, s, z, out, rowb, NT, CL, 0);                      \
  } while (0)
#define K5_BITS(NT, CL)                                                                            \
  do {                                                                                             \
    if (bits == 8)                                                                                 \
      K5_CALL(8, NT, CL);                                                                          \
    else if (bits == 4)                                                                            \
      K5_CALL(4, NT, CL);                                                                          \
    else                                                                                           \
      K5_CALL(2, NT, CL);                                                                          \
  } while (0)
  if (nt && clamp)
    K5_BITS(1, 1);
  else if (nt)
    K5_BITS(1, 0);
  else if (clamp)
    K5_BITS(0, 1);
  else
    K5_BITS(0, 0);
#undef K5_BITS
#undef K5_CALL
}

#else
int kv_quant_simd_available(void)
{
  return 0;
}
int kv_quant_avx512(int enable)
{
  (void)enable;
  return 0;
}
#endif

void kv_quant_stream_fence(void)
{
#if KV_QUANT_X86
  _mm_sfence(); /* streaming stores are weakly ordered: order them before what follows */
#endif
}

static void halves(const uint8_t *src, uint32_t n, float *dst, int simd)
{
#if KV_QUANT_X86
  if (simd) {
    halves_avx2(src, n, dst);
    return;
  }
#else
  (void)simd;
#endif
  for (uint32_t i = 0; i < n; i++)
    dst[i] = kv_codec_f16_to_f32(kv_codec_get_le16(src + 2 * (size_t)i));
}

/* Rows quantized per channel in chunks of `group` rows (enc_percol's layout) into out. */
/* tab (not NULL only on the AVX2 path, f16, d % 8 == 0): the rows' RoPE table (rope_table,
 * from these rows' first), rows rotated as they are dequantized. alloc: per-channel widths
 * after each chunk's zeros; shm (2d int32), pos (d u32), wid (d bytes): their layout. */
static void dec_percol(const uint8_t *pairs, const uint8_t *codes, size_t rowpack, uint32_t nrows,
                       uint32_t group, unsigned bits, uint32_t d, kv_codec_dtype dt, uint8_t *out,
                       size_t rowb, int simd, int nt, float *tmp, float *s, float *z, uint8_t *u8,
                       const float *tab, int alloc, int32_t *shm, uint32_t *pos, uint8_t *wid)
{
  size_t chb = 4 * (size_t)d + (alloc ? ((size_t)d + 1) / 2 : 0);
  for (uint32_t c0 = 0; c0 < nrows; c0 += group) {
    uint32_t c1 = c0 + group < nrows ? c0 + group : nrows;
    const uint8_t *cp = pairs + (size_t)(c0 / group) * chb;
    halves(cp, d, s, simd);
    halves(cp + 2 * (size_t)d, d, z, simd);
    if (alloc) {
      alloc_layout(cp + 4 * (size_t)d, d, bits, wid, pos, shm);
#if KV_QUANT_X86
      if (simd && d % 8 == 0) {
        k_rows_alloc_avx2(codes + (size_t)c0 * rowpack, rowpack, c1 - c0, d, bits, s, z, shm,
                          tab ? tab + 2 * (size_t)c0 * d : NULL, dt, out + c0 * rowb, rowb, nt);
        continue;
      }
#endif
      for (uint32_t r = c0; r < c1; r++) {
        const uint8_t *row = codes + (size_t)r * rowpack;
        for (uint32_t j = 0; j < d; j++)
          u8[j] = (uint8_t)get_bits(row, pos[j], wid[j]);
        deq_span_portable(u8, 8, 0, d, s, z, 0, 0, dt, out + r * rowb, tmp, NULL);
      }
      continue;
    }
    uint32_t done = 0; /* channels [0, done) decoded by the SIMD kernel */
#if KV_QUANT_X86
    if (simd && tab != NULL) {
      k_rows_rope_avx2(codes + (size_t)c0 * rowpack, rowpack, c1 - c0, d, bits, s, z,
                       tab + 2 * (size_t)c0 * d, out + c0 * rowb, rowb, nt);
      done = d;
    } else if (simd && dt == KV_CODEC_F16 && d % 16 == 0 &&
               (bits == 2 || bits == 4 || bits == 8) && avx512_on()) {
      k_rows_avx512(codes + (size_t)c0 * rowpack, rowpack, c1 - c0, d, bits, s, z,
                    out + c0 * rowb, rowb, nt);
      done = d;
    } else if (simd) {
      k_rows_avx2(codes + (size_t)c0 * rowpack, rowpack, c1 - c0, d, bits, s, z, dt,
                  out + c0 * rowb, rowb, nt);
      done = d / 8 * 8;
    }
#else
    (void)nt;
    (void)tab;
#endif
    if (done < d)
      for (uint32_t r = c0; r < c1; r++)
        deq_span_portable(codes + (size_t)r * rowpack, bits, done, d, s, z, 0, 0, dt,
                          out + r * rowb, tmp, u8);
  }
}

void kv_quant_decode_group(const kv_section_info *info, uint32_t g, const uint8_t *src, void *ws,
                           void *dst, int simd)
{
  kv_quant_decode_group_ctx(NULL, info, g, src, ws, dst, simd);
}

void kv_quant_decode_group_ctx(kv_codec_dctx *ctx, const kv_section_info *info, uint32_t g,
                               const uint8_t *src, void *ws, void *dst, int simd)
{
  size_t rowb = (size_t)info->shape.head_dim * kv_codec_dtype_bytes(info->shape.dtype);
  kv_quant_decode_group_strided(ctx, info, g, src, ws, dst, rowb, simd);
}

void kv_quant_decode_group_strided(kv_codec_dctx *ctx, const kv_section_info *info, uint32_t g,
                                   const uint8_t *src, void *ws, void *dst, size_t rowb, int simd)
{
  const kv_codec_params *p = &info->params;
  uint32_t d = info->shape.head_dim, group = p->group;
  unsigned bits = p->bits;
  kv_codec_dtype dt = info->shape.dtype;
  size_t row_bytes = (size_t)d * kv_codec_dtype_bytes(dt); /* rowb: the output's row stride */
  qgeom q;
  geom(info, g, &q);
  const uint8_t *pairs = src, *codes = src + q.pairs_bytes, *raw = codes + q.codes_bytes;
  float *tmp = ws, *s = tmp + d, *z = s + d;
  uint8_t *u8 = (uint8_t *)(z + d); /* d bytes of unpacked codes (scratch holds 16d floats) */
  int32_t *shm = (int32_t *)(void *)(tmp + 4 * (size_t)d); /* alloc: shifts, masks, selects */
  uint32_t *apos = (uint32_t *)(void *)(tmp + 7 * (size_t)d); /* d bit offsets */
  uint8_t *wid = (uint8_t *)(tmp + 8 * (size_t)d);             /* d widths */
  uint8_t *out = dst;
  /* streaming stores need every 8-element block 16-byte aligned: dst and the rows */
  int nt = simd == 2 && ((uintptr_t)dst & 15u) == 0 && rowb % 16 == 0 && row_bytes % 16 == 0;
  simd = simd && kv_quant_simd_available();
  nt = nt && simd;

  if (q.percol) {
    size_t sp = q.s ? 4 * (size_t)d : 0, sc = (size_t)q.s * d;
    uint32_t qe = q.s + q.q;
    const float *tab = NULL; /* pre-RoPE K on the AVX2 path: rotated as dequantized */
#if KV_QUANT_X86
    if (info->codec_id == KV_CODEC_ID_KVQUANT && p->rope_base != 0 && simd &&
        dt == KV_CODEC_F16 && p->rope_style == KV_ROPE_ADJACENT && d % 8 == 0)
      tab = rope_table(ctx, p, d, p->rope_pos0 + q.r0, q.t, tmp);
#else
    (void)ctx;
#endif
    if (q.s) /* kvquant: the sink rows, one 8-bit chunk */
      dec_percol(pairs, codes, d, q.s, q.s, 8, d, dt, out, rowb, simd, nt, tmp, s, z, u8, tab, 0,
                 shm, apos, wid);
    dec_percol(pairs + sp, codes + sc, q.rowpack, q.q, group, bits, d, dt, out + (size_t)q.s * rowb,
               rowb, simd, nt, tmp, s, z, u8, tab ? tab + 2 * (size_t)q.s * d : NULL, q.alloc, shm,
               apos, wid);
    if (q.res8) { /* kvquant: the residual rows, one 8-bit chunk */
      uint32_t nch = (q.q + group - 1) / group;
      dec_percol(pairs + sp + (size_t)nch * q.chb, codes + sc + (size_t)q.q * q.rowpack, d,
                 q.t - qe, q.t - qe, 8, d, dt, out + (size_t)qe * rowb, rowb, simd, nt, tmp, s, z,
                 u8, tab ? tab + 2 * (size_t)qe * d : NULL, 0, shm, apos, wid);
    }
    if (tab != NULL)
      return; /* rotated already */
    if (info->codec_id == KV_CODEC_ID_KVQUANT) { /* no raw rows; pre-RoPE K: rotate back */
#if KV_QUANT_X86
      if (p->rope_base != 0 && simd && dt == KV_CODEC_F16 && p->rope_style == KV_ROPE_ADJACENT &&
          d % 8 == 0) {
        /* rope_rotate_rows' state, each pair's values duplicated over its two channels */
        float *w = tmp, *vc = w + 5 * (size_t)d, *vs = vc + KV_ROPE_CHAINS * (size_t)d;
        float *vct = vs + KV_ROPE_CHAINS * (size_t)d, *vst = vct + d;
        uint32_t h = d / 2;
        rope_state(p, d, p->rope_pos0 + q.r0, w, w + KV_ROPE_CHAINS * h, w + 2 * KV_ROPE_CHAINS * h,
                   w + 2 * KV_ROPE_CHAINS * h + h);
        float *c = w, *sn = w + KV_ROPE_CHAINS * h, *ct = sn + KV_ROPE_CHAINS * h, *st = ct + h;
        for (uint32_t i = 0; i < h; i++) {
          for (uint32_t j = 0; j < KV_ROPE_CHAINS; j++) {
            vc[j * d + 2 * i] = vc[j * d + 2 * i + 1] = c[j * h + i];
            vs[j * d + 2 * i] = vs[j * d + 2 * i + 1] = sn[j * h + i];
          }
          vct[2 * i] = vct[2 * i + 1] = ct[i];
          vst[2 * i] = vst[2 * i + 1] = st[i];
        }
        rope_rows_avx2(d, q.t, out, rowb, vc);
        return;
      }
#endif
      if (p->rope_base != 0)
        rope_rotate_rows(p, d, dt, p->rope_pos0 + q.r0, q.t, out, rowb, tmp);
      return;
    }
  } else {
    uint32_t ng = (d + group - 1) / group, rows = q.q;
    int fast = 0;
#if KV_QUANT_X86
    fast = simd && group % 8 == 0; /* then every group starts byte-aligned */
    if (fast)
      v_rows_avx2(codes, q.rowpack, pairs, q.q, d, group, bits, dt, out, rowb, nt);
    if (fast && (d % group) % 8 == 0)
      rows = 0; /* every channel done */
#endif
    for (uint32_t r = 0; r < rows; r++) {
      const uint8_t *row = codes + (size_t)r * q.rowpack, *pr = pairs + 4 * (size_t)r * ng;
      for (uint32_t k = 0; k < ng; k++) {
        uint32_t j0 = k * group, j1 = j0 + group < d ? j0 + group : d;
        if (fast && (j1 - j0) % 8 == 0)
          continue; /* done by v_rows_avx2 */
        float sb = kv_codec_f16_to_f32(kv_codec_get_le16(pr + 2 * (size_t)k));
        float zb = kv_codec_f16_to_f32(kv_codec_get_le16(pr + 2 * (size_t)ng + 2 * (size_t)k));
        if (fast) /* a short last group: v_rows_avx2 did its whole blocks of 8 */
          j0 += (j1 - j0) / 8 * 8;
#if KV_QUANT_X86
        else if (simd && ((size_t)j0 * bits) % 8 == 0 && j1 - j0 >= 8)
          j0 += span_avx2(row, bits, j0, j1 - j0, sb, zb, dt, out + r * rowb, nt);
#endif
        if (j0 < j1)
          deq_span_portable(row, bits, j0, j1, NULL, NULL, sb, zb, dt, out + r * rowb, tmp, u8);
      }
    }
  }
  if (rowb == row_bytes) {
    kv_codec_load_le(dt, raw, (size_t)(q.t - q.q) * d, out + (size_t)q.q * rowb);
    return;
  }
  for (uint32_t r = q.q; r < q.t; r++) /* raw rows into a strided output, one at a time */
    kv_codec_load_le(dt, raw + (size_t)(r - q.q) * row_bytes, d, out + (size_t)r * rowb);
}

/* kvquant with per-channel widths: every width of groups [g0, g1) (payload: their bytes) is
 * 0..8 and every block's widths sum to at most bits x its channels. */
kv_codec_status kv_quant_alloc_check(const kv_section_info *info, const uint8_t *payload,
                                     uint32_t g0, uint32_t g1, kv_codec_err *err)
{
  uint32_t d = info->shape.head_dim;
  const uint8_t *in = payload;
  for (uint32_t g = g0; g < g1; g++) {
    qgeom q;
    geom(info, g, &q);
    if (!q.alloc)
      return KV_CODEC_OK; /* a section's groups all have it or none */
    uint32_t nch = (q.q + info->params.group - 1) / info->params.group;
    const uint8_t *cp = in + (q.s ? 4 * (size_t)d : 0);
    for (uint32_t c = 0; c < nch; c++) {
      const uint8_t *wb = cp + (size_t)c * q.chb + 4 * (size_t)d;
      for (uint32_t j0 = 0; j0 < d; j0 += KV_ALLOC_BLOCK) {
        uint32_t nc = d - j0 < KV_ALLOC_BLOCK ? d - j0 : KV_ALLOC_BLOCK, sum = 0;
        for (uint32_t j = j0; j < j0 + nc; j++) {
          unsigned w = width_at(wb, j);
          if (w > KV_ALLOC_MAXW)
            return KV_CODEC_FAIL(err, KV_CODEC_ECORRUPT, "channel width above 8 bits", w,
                                 KV_ALLOC_MAXW);
          sum += w;
        }
        if (sum > info->params.bits * nc)
          return KV_CODEC_FAIL(err, KV_CODEC_ECORRUPT, "channel widths exceed their block's bits",
                               sum, info->params.bits * nc);
      }
      if (d % 2 != 0 && (wb[d / 2] >> 4) != 0)
        return KV_CODEC_FAIL(err, KV_CODEC_ECORRUPT, "width padding bits set", wb[d / 2], 0);
    }
    in += kv_quant_group_bytes(info, g);
  }
  return KV_CODEC_OK;
}

/* ---- the kivi codec ---------------------------------------------------------------------------- */

size_t kv_codec_kivi_bound(const kv_section_shape *shape, const kv_codec_params *p)
{
  kv_section_info info;
  if (kv_codec_plan(KV_CODEC_ID_KIVI, shape, p, &info, NULL) != KV_CODEC_OK)
    return 0;
  size_t n = info.header_bytes;
  for (uint32_t g = 0; g < info.n_groups; g++)
    n += kv_quant_group_bytes(&info, g);
  return n;
}

size_t kv_codec_kivi_scratch_bytes(const kv_section_shape *shape, const kv_codec_params *p,
                                   kv_codec_op op)
{
  kv_section_info info;
  (void)op;
  if (kv_codec_plan(KV_CODEC_ID_KIVI, shape, p, &info, NULL) != KV_CODEC_OK)
    return 0;
  return kv_quant_scratch_bytes(shape->head_dim);
}

/* The encode kivi and kvquant share once their section is planned: the scratch (need bytes)
 * and dst (bound bytes) checked, the header written, then each page group and its size in the
 * group table (the header's last 4 * n_groups bytes). */
static kv_codec_status quant_encode_planned(const kv_section_info *info, size_t need, size_t bound,
                                            const void *src, void *scratch, size_t scratch_cap,
                                            void *dst, size_t dst_cap, size_t *out_len,
                                            kv_codec_err *err)
{
  if (scratch == NULL || scratch_cap < need)
    return KV_CODEC_FAIL(err, KV_CODEC_ENOMEM, "scratch smaller than scratch_bytes()",
                         scratch ? scratch_cap : 0, need);
  if (dst_cap < bound)
    return KV_CODEC_FAIL(err, KV_CODEC_ETOOSMALL, "dst smaller than the encoded section", dst_cap,
                         bound);
  size_t cap = scratch_cap;
  void *ws = kv_codec_scratch_align(scratch, &cap);
  uint8_t *d = dst;
  kv_codec_write_header(info, NULL, d);
  size_t pos = info->header_bytes;
  uint8_t *table = d + info->header_bytes - 4 * (size_t)info->n_groups;
  for (uint32_t g = 0; g < info->n_groups; g++) {
    size_t n = kv_quant_group_bytes(info, g);
    kv_codec_status rc = kv_quant_encode_group(info, g, src, NULL, ws, d + pos, err);
    if (rc != KV_CODEC_OK)
      return rc;
    kv_codec_put_le32(table + 4 * (size_t)g, (uint32_t)n);
    pos += n;
  }
  *out_len = pos;
  return KV_CODEC_OK;
}

kv_codec_status kv_codec_kivi_encode(const kv_section_shape *shape, const void *src, size_t src_len,
                                     const kv_codec_params *p, void *scratch, size_t scratch_cap,
                                     void *dst, size_t dst_cap, size_t *out_len, kv_codec_err *err)
{
  kv_section_info info;
  kv_codec_status rc = kv_codec_encode_args(shape, src, src_len, dst, out_len, err);
  if (rc != KV_CODEC_OK)
    return rc;
  rc = kv_codec_plan(KV_CODEC_ID_KIVI, shape, p, &info, err);
  if (rc != KV_CODEC_OK)
    return rc;
  return quant_encode_planned(&info, kv_quant_scratch_bytes(shape->head_dim),
                              kv_codec_kivi_bound(shape, p), src, scratch, scratch_cap, dst,
                              dst_cap, out_len, err);
}

kv_codec_status kv_kivi_decode_parsed(const kv_section_info *info, const uint8_t *payload,
                                      uint32_t g0, uint32_t g1, void *scratch, size_t scratch_cap,
                                      void *dst, kv_codec_dctx *ctx, kv_codec_err *err)
{
  size_t rowb = (size_t)info->shape.head_dim * kv_codec_dtype_bytes(info->shape.dtype);
  return kv_kivi_decode_strided(info, payload, g0, g1, scratch, scratch_cap, dst, rowb, ctx, err);
}

kv_codec_status kv_kivi_decode_strided(const kv_section_info *info, const uint8_t *payload,
                                       uint32_t g0, uint32_t g1, void *scratch,
                                       size_t scratch_cap, void *dst, size_t rowb,
                                       kv_codec_dctx *ctx, kv_codec_err *err)
{
  size_t need = kv_quant_scratch_bytes(info->shape.head_dim);
  if (scratch == NULL || scratch_cap < need)
    return KV_CODEC_FAIL(err, KV_CODEC_ENOMEM, "scratch smaller than scratch_bytes()",
                         scratch ? scratch_cap : 0, need);
  size_t cap = scratch_cap;
  void *ws = kv_codec_scratch_align(scratch, &cap);
  const uint8_t *in = payload;
  uint8_t *out = dst;
  kv_codec_status rc = kv_quant_alloc_check(info, payload, g0, g1, err);
  if (rc != KV_CODEC_OK)
    return rc;
  int stream = kv_codec_stream_call(ctx, kv_section_rows_bytes(info, g0, g1));
  for (uint32_t g = g0; g < g1; g++) { /* lengths are exact by kv_quant_check */
    kv_quant_decode_group_strided(ctx, info, g, in, ws, out, rowb, stream ? 2 : 1);
    in += kv_quant_group_bytes(info, g);
    out += (size_t)kv_codec_group_rows(info, g) * rowb;
  }
  if (stream)
    kv_quant_stream_fence(); /* one fence per call: the rows are ordered before we return */
  return KV_CODEC_OK;
}


/* ---- the kvquant codec -------------------------------------------------------------------------- */

size_t kv_codec_kvq_bound(const kv_section_shape *shape, const kv_codec_params *p)
{
  kv_section_info info;
  if (kv_codec_plan(KV_CODEC_ID_KVQUANT, shape, p, &info, NULL) != KV_CODEC_OK)
    return 0;
  size_t n = info.header_bytes;
  for (uint32_t g = 0; g < info.n_groups; g++)
    n += kv_quant_group_bytes(&info, g);
  return n;
}

size_t kv_codec_kvq_scratch_bytes(const kv_section_shape *shape, const kv_codec_params *p,
                                  kv_codec_op op)
{
  kv_section_info info;
  if (kv_codec_plan(KV_CODEC_ID_KVQUANT, shape, p, &info, NULL) != KV_CODEC_OK)
    return 0;
  if (op == KV_CODEC_OP_DECODE)
    return kv_quant_scratch_bytes(shape->head_dim);
  return kv_kvq_scratch_bytes(shape->head_dim, info.params.page_tokens);
}

kv_codec_status kv_codec_kvq_encode(const kv_section_shape *shape, const void *src, size_t src_len,
                                    const kv_codec_params *p, void *scratch, size_t scratch_cap,
                                    void *dst, size_t dst_cap, size_t *out_len, kv_codec_err *err)
{
  kv_section_info info;
  kv_codec_status rc = kv_codec_encode_args(shape, src, src_len, dst, out_len, err);
  if (rc != KV_CODEC_OK)
    return rc;
  rc = kv_codec_plan(KV_CODEC_ID_KVQUANT, shape, p, &info, err);
  if (rc != KV_CODEC_OK)
    return rc;
  return quant_encode_planned(&info, kv_kvq_scratch_bytes(shape->head_dim, info.params.page_tokens),
                              kv_codec_kvq_bound(shape, p), src, scratch, scratch_cap, dst,
                              dst_cap, out_len, err);
}
