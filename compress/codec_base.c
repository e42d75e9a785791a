/* SPDX-License-Identifier: MIT */
/*
 * compress/codec_base.c — what every codec of compress/ uses, below them all: the status
 * names and messages, the element conversions and little-endian rows, the rules of the
 * parameters (kv_codec_validate_config) and their defaults, planning and writing a section
 * header, the decoding context's stream setting, and the drop codec's keep counts and bitmaps.
 * Calls nothing of the codecs (codec.c, above them, holds the registry and the parsing).
 *
 * INVARIANTS
 *   H1. A kv_section_info that kv_section_parse() returned OK for describes a section whose
 *       every size fits in uint64_t without overflow: n_rows * head_dim * 4 <= 2^48,
 *       page_tokens * row bytes <= 2^30, and each group-table entry is one the codec can
 *       produce for that group (exactly, or within its bound for zstd-planes).
 *   H2. The encoder and kv_section_parse() apply the same rules (kv_codec_validate_config()),
 *       so every section this build writes parses, and parse rejects what no encoder could write.
 */
#include "codec_int.h"

#include <stdio.h>
#include <string.h>

/* ---- status and messages ------------------------------------------------------------------ */

const char *kv_codec_status_name(kv_codec_status rc)
{
  switch (rc) {
  case KV_CODEC_OK: return "KV_CODEC_OK";
  case KV_CODEC_EINVAL: return "KV_CODEC_EINVAL";
  case KV_CODEC_ECORRUPT: return "KV_CODEC_ECORRUPT";
  case KV_CODEC_ETOOSMALL: return "KV_CODEC_ETOOSMALL";
  case KV_CODEC_ENOMEM: return "KV_CODEC_ENOMEM";
  }
  return "KV_CODEC_UNKNOWN";
}

static const char *status_text(kv_codec_status rc)
{
  switch (rc) {
  case KV_CODEC_OK: return "ok";
  case KV_CODEC_EINVAL: return "invalid argument";
  case KV_CODEC_ECORRUPT: return "corrupt section";
  case KV_CODEC_ETOOSMALL: return "destination too small";
  case KV_CODEC_ENOMEM: return "scratch too small";
  }
  return "unknown status";
}

size_t kv_codec_errmsg(const kv_codec_err *err, char *buf, size_t cap)
{
  char tmp[512];
  int n;
  if (err == NULL || err->code == KV_CODEC_OK) {
    n = snprintf(tmp, sizeof tmp, "ok");
  } else {
    const char *what = err->what ? err->what : "no detail";
    if (err->limit != 0)
      n = snprintf(tmp, sizeof tmp, "%s: %s (value %llu, limit %llu) [%s:%d]",
                   status_text(err->code), what, (unsigned long long)err->value,
                   (unsigned long long)err->limit, err->file ? err->file : "?", err->line);
    else
      n = snprintf(tmp, sizeof tmp, "%s: %s (value %llu) [%s:%d]", status_text(err->code), what,
                   (unsigned long long)err->value, err->file ? err->file : "?", err->line);
  }
  if (n < 0)
    n = 0;
  if (cap > 0) {
    size_t len = (size_t)n < cap - 1 ? (size_t)n : cap - 1;
    if (len >= sizeof tmp)
      len = sizeof tmp - 1;
    memcpy(buf, tmp, len);
    buf[len] = '\0';
  }
  return (size_t)n;
}

kv_codec_status kv_codec_fail_at(kv_codec_err *err, kv_codec_status code, const char *what,
                                 uint64_t value, uint64_t limit, const char *file, int line)
{
  if (err != NULL) {
    err->code = code;
    err->what = what;
    err->value = value;
    err->limit = limit;
    err->file = file;
    err->line = line;
  }
  return code;
}

void *kv_codec_scratch_align(void *scratch, size_t *cap)
{
  uintptr_t p = (uintptr_t)scratch;
  uintptr_t a = (p + 63) & ~(uintptr_t)63;
  size_t skip = (size_t)(a - p);
  if (scratch == NULL || *cap < skip) {
    *cap = 0;
    return scratch;
  }
  *cap -= skip;
  return (void *)a;
}

/* ---- elements ------------------------------------------------------------------------------ */

size_t kv_codec_dtype_bytes(kv_codec_dtype dtype)
{
  switch (dtype) {
  case KV_CODEC_F16: return 2;
  case KV_CODEC_BF16: return 2;
  case KV_CODEC_F32: return 4;
  }
  return 0;
}

static inline float f32_from_bits(uint32_t u)
{
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

static inline uint32_t f32_bits(float f)
{
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}

float kv_codec_f16_to_f32(uint16_t h)
{
  return kv_codec_f16_widen(h);
}

/*
 * Round to nearest even, bit-identical to x86 F16C vcvtps2ph with _MM_FROUND_TO_NEAREST_INT
 * (the AVX2 dequantizer relies on that; test_codec_quant checks it against the hardware).
 * Method of F. Giesen's float_to_half_fast3_rtne; NaN keeps its sign and top payload bits and
 * becomes quiet, as vcvtps2ph does.
 */
uint16_t kv_codec_f32_to_f16(float f)
{
  uint32_t x = f32_bits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u)
    return (uint16_t)(((x >> 16) & 0x8000u) | 0x7e00u | ((x >> 13) & 0x3ffu));
  return kv_codec_f16_rne(f);
}

float kv_codec_bf16_to_f32(uint16_t b)
{
  return f32_from_bits((uint32_t)b << 16);
}

uint16_t kv_codec_f32_to_bf16(float f)
{
  uint32_t x = f32_bits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) /* NaN: keep sign and top payload, force quiet */
    return (uint16_t)((x >> 16) | 0x0040u);
  return kv_codec_bf16_rne(f);
}

void kv_codec_to_f32(kv_codec_dtype dtype, const void *src, size_t n, float *dst)
{
  const uint8_t *s = src;
  switch (dtype) {
  case KV_CODEC_F16:
    for (size_t i = 0; i < n; i++) {
      uint16_t h;
      memcpy(&h, s + 2 * i, 2);
      dst[i] = kv_codec_f16_widen(h);
    }
    break;
  case KV_CODEC_BF16:
    for (size_t i = 0; i < n; i++) {
      uint16_t h;
      memcpy(&h, s + 2 * i, 2);
      dst[i] = kv_codec_bf16_to_f32(h);
    }
    break;
  case KV_CODEC_F32:
    memcpy(dst, src, n * sizeof(float));
    break;
  }
}

void kv_codec_from_f32(kv_codec_dtype dtype, const float *src, size_t n, void *dst)
{
  uint8_t *d = dst;
  switch (dtype) {
  case KV_CODEC_F16:
    for (size_t i = 0; i < n; i++) {
      uint32_t x = f32_bits(src[i]);
      uint16_t h = (x & 0x7fffffffu) > 0x7f800000u ? kv_codec_f32_to_f16(src[i])
                                                   : kv_codec_f16_rne(src[i]);
      memcpy(d + 2 * i, &h, 2);
    }
    break;
  case KV_CODEC_BF16:
    for (size_t i = 0; i < n; i++) {
      uint16_t h = kv_codec_f32_to_bf16(src[i]);
      memcpy(d + 2 * i, &h, 2);
    }
    break;
  case KV_CODEC_F32:
    memcpy(dst, src, n * sizeof(float));
    break;
  }
}

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
#define KV_HOST_LE 1
#else
#define KV_HOST_LE 0
#endif

void kv_codec_store_le(kv_codec_dtype dtype, const void *src, size_t n, uint8_t *dst)
{
  size_t es = kv_codec_dtype_bytes(dtype);
  if (KV_HOST_LE) {
    memcpy(dst, src, n * es);
  } else if (es == 2) {
    for (size_t i = 0; i < n; i++) {
      uint16_t v;
      memcpy(&v, (const uint8_t *)src + 2 * i, 2);
      kv_codec_put_le16(dst + 2 * i, v);
    }
  } else {
    for (size_t i = 0; i < n; i++) {
      uint32_t v;
      memcpy(&v, (const uint8_t *)src + 4 * i, 4);
      kv_codec_put_le32(dst + 4 * i, v);
    }
  }
}

void kv_codec_load_le(kv_codec_dtype dtype, const uint8_t *src, size_t n, void *dst)
{
  size_t es = kv_codec_dtype_bytes(dtype);
  if (KV_HOST_LE) {
    memcpy(dst, src, n * es);
  } else if (es == 2) {
    for (size_t i = 0; i < n; i++) {
      uint16_t v = kv_codec_get_le16(src + 2 * i);
      memcpy((uint8_t *)dst + 2 * i, &v, 2);
    }
  } else {
    for (size_t i = 0; i < n; i++) {
      uint32_t v = kv_codec_get_le32(src + 4 * i);
      memcpy((uint8_t *)dst + 4 * i, &v, 4);
    }
  }
}

/* Eight float partial sums (so the loop vectorizes without -ffast-math), summed in a fixed
 * order: the same inputs give the same result on every build. */
double kv_codec_dot_f32(const float *a, const float *b, uint32_t d)
{
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  uint32_t j = 0;
  for (; j + 8 <= d; j += 8)
    for (int u = 0; u < 8; u++)
      acc[u] += a[j + u] * b[j + u];
  float t = 0;
  for (; j < d; j++)
    t += a[j] * b[j];
  return (double)((acc[0] + acc[1]) + (acc[2] + acc[3])) +
         (double)((acc[4] + acc[5]) + (acc[6] + acc[7])) + t;
}

/* ---- parameters ---------------------------------------------------------------------------- */

void kv_codec_params_init(kv_codec_params *p)
{
  memset(p, 0, sizeof *p);
  p->drop_method = KV_DROP_NONE;
  p->keep_pos = NULL;
}

/* Raw-row bytes a group of page_tokens rows may hold (H1). */
#define KV_GROUP_RAW_MAX (1u << 30)

static int bits_ok(unsigned bits)
{
  return bits == 8 || bits == 4 || bits == 2;
}

/*
 * The rules every section obeys, with parameters already resolved (no "0 = default" left).
 * `code` is what a violation returns: EINVAL when encoding, ECORRUPT when parsing (H2).
 */
kv_codec_status kv_codec_validate_config(uint8_t id, const kv_section_shape *s, uint32_t n_rows,
                                         const kv_codec_params *p, kv_codec_status code,
                                         kv_codec_err *err)
{
  size_t es = kv_codec_dtype_bytes(s->dtype);
  if (es == 0)
    return KV_CODEC_FAIL(err, code, "unknown dtype", s->dtype, 3);
  if (s->kind != KV_SECTION_K && s->kind != KV_SECTION_V)
    return KV_CODEC_FAIL(err, code, "section kind is neither K nor V", s->kind, 1);
  if (s->n_tokens == 0 || s->n_tokens > KV_CODEC_MAX_TOKENS)
    return KV_CODEC_FAIL(err, code, "n_tokens out of range", s->n_tokens, KV_CODEC_MAX_TOKENS);
  if (s->head_dim == 0 || s->head_dim > KV_CODEC_MAX_HEAD_DIM)
    return KV_CODEC_FAIL(err, code, "head_dim out of range", s->head_dim, KV_CODEC_MAX_HEAD_DIM);
  if (n_rows == 0 || n_rows > s->n_tokens)
    return KV_CODEC_FAIL(err, code, "row count out of range", n_rows, s->n_tokens);
  if (id != KV_CODEC_ID_DROP && n_rows != s->n_tokens)
    return KV_CODEC_FAIL(err, code, "row count differs from n_tokens", n_rows, s->n_tokens);
  if (p->page_tokens == 0 || p->page_tokens > KV_CODEC_MAX_PAGE_TOKENS)
    return KV_CODEC_FAIL(err, code, "page_tokens out of range", p->page_tokens,
                         KV_CODEC_MAX_PAGE_TOKENS);
  if ((uint64_t)p->page_tokens * s->head_dim * es > KV_GROUP_RAW_MAX)
    return KV_CODEC_FAIL(err, code, "page group larger than 1 GiB of raw rows",
                         (uint64_t)p->page_tokens * s->head_dim * es, KV_GROUP_RAW_MAX);

  int uses_level = id == KV_CODEC_ID_ZSTD_PLANES;
  int uses_quant = id == KV_CODEC_ID_KIVI || id == KV_CODEC_ID_KVQUANT ||
                   (id == KV_CODEC_ID_DROP && p->bits != 0);
  int uses_drop = id == KV_CODEC_ID_DROP;
  int percol = s->kind == KV_SECTION_K || id == KV_CODEC_ID_KVQUANT; /* groups of tokens */

  if (uses_level) {
    if (p->zstd_level < -7 || p->zstd_level > 22 || p->zstd_level == 0)
      return KV_CODEC_FAIL(err, code, "zstd level outside -7..22", (int64_t)p->zstd_level, 22);
  } else if (p->zstd_level != 0) {
    return KV_CODEC_FAIL(err, code, "zstd level set for a codec without zstd",
                         (int64_t)p->zstd_level, 0);
  }

  if (uses_quant) {
    /* kvquant with per-channel widths: bits is the mean width, 1..7 */
    int alloc_bits = p->alloc == 1 && id == KV_CODEC_ID_KVQUANT && p->bits >= 1 && p->bits <= 7;
    if (!bits_ok(p->bits) && !alloc_bits)
      return KV_CODEC_FAIL(err, code, "bits must be 8, 4 or 2 (kvquant with alloc: 1..7)",
                           p->bits, 8);
    if (p->group == 0 || p->group > 65535)
      return KV_CODEC_FAIL(err, code, "quantization group out of range", p->group, 65535);
    if (percol && p->group > n_rows)
      return KV_CODEC_FAIL(err, code, "quantization group larger than the tokens", p->group,
                           n_rows);
    if (!percol && p->group > s->head_dim)
      return KV_CODEC_FAIL(err, code, "quantization group larger than head_dim", p->group,
                           s->head_dim);
    if (percol && p->page_tokens % p->group != 0)
      return KV_CODEC_FAIL(err, code, "page_tokens not a multiple of the key group",
                           p->page_tokens, p->group);
    if (p->residual > n_rows)
      return KV_CODEC_FAIL(err, code, "residual larger than the rows", p->residual, n_rows);
    if (p->sink > 255 || (p->sink != 0 && id != KV_CODEC_ID_KVQUANT))
      return KV_CODEC_FAIL(err, code, "sink rows set for a codec without them, or above 255",
                           p->sink, id == KV_CODEC_ID_KVQUANT ? 255 : 0);
    if (p->rope_base != 0 || p->rope_style != 0 || p->rope_pos0 != 0) {
      if (id != KV_CODEC_ID_KVQUANT || s->kind != KV_SECTION_K)
        return KV_CODEC_FAIL(err, code, "RoPE set for other than a kvquant K section", id, 5);
      if (!(p->rope_base > 1.0f && p->rope_base <= 1e9f))
        return KV_CODEC_FAIL(err, code, "RoPE base outside (1, 1e9]", (uint64_t)p->rope_base,
                             1000000000);
      if (p->rope_style != KV_ROPE_ADJACENT && p->rope_style != KV_ROPE_HALF)
        return KV_CODEC_FAIL(err, code, "unknown RoPE style", p->rope_style, KV_ROPE_HALF);
      if (s->head_dim % 2 != 0)
        return KV_CODEC_FAIL(err, code, "RoPE needs an even head_dim", s->head_dim, 0);
      if ((uint64_t)p->rope_pos0 + s->n_tokens > (1ull << 31))
        return KV_CODEC_FAIL(err, code, "RoPE positions beyond 2^31", p->rope_pos0, 1u << 31);
    }
    if (p->alloc > 1 || (p->alloc && (id != KV_CODEC_ID_KVQUANT || p->bits == 8)))
      return KV_CODEC_FAIL(err, code, "bit allocation set other than on kvquant below 8 bits",
                           p->alloc, 1);
    if (p->chan_weight != NULL) {
      if (!p->alloc)
        return KV_CODEC_FAIL(err, code, "channel weights without bit allocation", 0, 1);
      for (uint32_t j = 0; j < s->head_dim; j++)
        if (!(p->chan_weight[j] >= 0.0f && p->chan_weight[j] <= 3.0e38f))
          return KV_CODEC_FAIL(err, code, "channel weight not finite and >= 0", j, 0);
    }
    if (p->sink > p->page_tokens || p->sink + p->residual > n_rows)
      return KV_CODEC_FAIL(err, code, "sink rows beyond the first page group or the residual",
                           p->sink, p->page_tokens);
  } else {
    if (p->bits != 0)
      return KV_CODEC_FAIL(err, code, "bits set for a codec without quantization", p->bits, 0);
    if (p->group != 0)
      return KV_CODEC_FAIL(err, code, "group set for a codec without quantization", p->group, 0);
    if (p->residual != 0)
      return KV_CODEC_FAIL(err, code, "residual set for a codec without quantization",
                           p->residual, 0);
    if (p->sink != 0)
      return KV_CODEC_FAIL(err, code, "sink rows set for a codec without quantization", p->sink,
                           0);
    if (p->rope_base != 0 || p->rope_style != 0 || p->rope_pos0 != 0)
      return KV_CODEC_FAIL(err, code, "RoPE set for a codec without quantization", id, 5);
    if (p->alloc != 0 || p->chan_weight != NULL)
      return KV_CODEC_FAIL(err, code, "bit allocation set for a codec without quantization",
                           p->alloc, 0);
  }

  if (uses_drop) {
    if (p->keep_permille == 0 || p->keep_permille > 1000)
      return KV_CODEC_FAIL(err, code, "keep_permille outside 1..1000", p->keep_permille, 1000);
    if (p->drop_method != KV_DROP_KNORM && p->drop_method != KV_DROP_KEYDIFF &&
        p->drop_method != KV_DROP_SNAPKV)
      return KV_CODEC_FAIL(err, code, "unknown drop method", p->drop_method, KV_DROP_SNAPKV);
  } else {
    if (p->keep_permille != 0)
      return KV_CODEC_FAIL(err, code, "keep_permille set for a codec that keeps every token",
                           p->keep_permille, 0);
    if (p->drop_method != KV_DROP_NONE)
      return KV_CODEC_FAIL(err, code, "drop method set for a codec that keeps every token",
                           p->drop_method, 0);
  }
  return KV_CODEC_OK;
}

/*
 * KV_PAGE_GROUP_RAW_BYTES : raw bytes a default page group reaches — 4 KiB (one page) for the
 *   codecs whose groups cost nothing but a table entry; KV_PAGE_GROUP_ZSTD_BYTES for
 *   zstd-planes, where each group pays frame and Huffman-table overhead (codec.h PAGE GROUPS).
 */
#ifndef KV_PAGE_GROUP_RAW_BYTES
#define KV_PAGE_GROUP_RAW_BYTES 4096u
#endif
#ifndef KV_PAGE_GROUP_ZSTD_BYTES
#define KV_PAGE_GROUP_ZSTD_BYTES 32768u
#endif

static uint32_t default_page_tokens(uint8_t id, uint32_t head_dim, size_t es,
                                    const kv_codec_params *p, kv_section_kind kind, int uses_quant)
{
  uint64_t row = (uint64_t)head_dim * es;
  uint64_t want = id == KV_CODEC_ID_ZSTD_PLANES ? KV_PAGE_GROUP_ZSTD_BYTES : KV_PAGE_GROUP_RAW_BYTES;
  uint32_t g = 16;
  while (g * row < want && g < KV_CODEC_MAX_PAGE_TOKENS)
    g <<= 1;
  if (uses_quant && (kind == KV_SECTION_K || id == KV_CODEC_ID_KVQUANT) && p->group > 0)
    g = (g + p->group - 1) / p->group * p->group;
  return g;
}

kv_codec_status kv_codec_plan(uint8_t id, const kv_section_shape *shape, const kv_codec_params *p,
                              kv_section_info *info, kv_codec_err *err)
{
  if (shape == NULL || p == NULL || info == NULL)
    return KV_CODEC_FAIL(err, KV_CODEC_EINVAL, "NULL shape or params", 0, 0);
  if (kv_codec_dtype_bytes(shape->dtype) == 0)
    return KV_CODEC_FAIL(err, KV_CODEC_EINVAL, "unknown dtype", shape->dtype, 3);
  if (shape->n_tokens == 0 || shape->n_tokens > KV_CODEC_MAX_TOKENS)
    return KV_CODEC_FAIL(err, KV_CODEC_EINVAL, "n_tokens out of range", shape->n_tokens,
                         KV_CODEC_MAX_TOKENS);
  if (shape->head_dim == 0 || shape->head_dim > KV_CODEC_MAX_HEAD_DIM)
    return KV_CODEC_FAIL(err, KV_CODEC_EINVAL, "head_dim out of range", shape->head_dim,
                         KV_CODEC_MAX_HEAD_DIM);

  memset(info, 0, sizeof *info);
  info->codec_id = id;
  info->version = KV_SECTION_VERSION;
  info->shape = *shape;
  info->params = *p;
  info->params.keep_pos = NULL;
  info->params.n_keep = 0;
  kv_codec_params *r = &info->params;
  uint32_t n_rows = shape->n_tokens;

  if (id == KV_CODEC_ID_DROP && p->keep_pos == NULL) {
    /* sizing only (bound, scratch): the row count is n_keep, or the ratio's keep count */
    n_rows = p->n_keep ? p->n_keep : kv_drop_keep_count(shape->n_tokens, p->keep_permille);
    if (n_rows == 0 || n_rows > shape->n_tokens)
      return KV_CODEC_FAIL(err, KV_CODEC_EINVAL, "kept row count out of range", n_rows,
                           shape->n_tokens);
    r->n_keep = n_rows;
  } else if (id == KV_CODEC_ID_DROP) {
    if (p->n_keep == 0)
      return KV_CODEC_FAIL(err, KV_CODEC_EINVAL, "drop needs n_keep > 0", p->n_keep, 0);
    if (p->n_keep > shape->n_tokens)
      return KV_CODEC_FAIL(err, KV_CODEC_EINVAL, "more kept positions than tokens", p->n_keep,
                           shape->n_tokens);
    for (uint32_t i = 0; i < p->n_keep; i++) {
      if (p->keep_pos[i] >= shape->n_tokens)
        return KV_CODEC_FAIL(err, KV_CODEC_EINVAL, "kept position beyond the tokens",
                             p->keep_pos[i], shape->n_tokens);
      if (i > 0 && p->keep_pos[i] <= p->keep_pos[i - 1])
        return KV_CODEC_FAIL(err, KV_CODEC_EINVAL, "kept positions not strictly increasing",
                             p->keep_pos[i], p->keep_pos[i - 1]);
    }
    n_rows = p->n_keep;
    r->n_keep = p->n_keep;
  } else if (p->keep_pos != NULL || p->n_keep != 0) {
    return KV_CODEC_FAIL(err, KV_CODEC_EINVAL, "kept positions given to a codec that keeps all",
                         p->n_keep, 0);
  }

  int uses_quant = id == KV_CODEC_ID_KIVI || id == KV_CODEC_ID_KVQUANT ||
                   (id == KV_CODEC_ID_DROP && p->bits != 0);
  if (id == KV_CODEC_ID_ZSTD_PLANES && r->zstd_level == 0)
    r->zstd_level = KV_CODEC_ZSTD_LEVEL_DEFAULT;
  if (uses_quant && r->group == 0) {
    uint32_t lim = shape->kind == KV_SECTION_K || id == KV_CODEC_ID_KVQUANT ? n_rows
                                                                             : shape->head_dim;
    uint32_t def = id == KV_CODEC_ID_KVQUANT ? KV_CODEC_KVQ_GROUP_DEFAULT : KV_CODEC_GROUP_DEFAULT;
    r->group = def < lim ? def : lim;
  }
  if (r->page_tokens == 0)
    r->page_tokens = default_page_tokens(id, shape->head_dim, kv_codec_dtype_bytes(shape->dtype),
                                         r, shape->kind, uses_quant);
  if (id < KV_CODEC_ID_RAW || id > KV_CODEC_ID_KVQUANT)
    return KV_CODEC_FAIL(err, KV_CODEC_EINVAL, "unknown codec id", id, KV_CODEC_ID_KVQUANT);

  kv_codec_status rc = kv_codec_validate_config(id, shape, n_rows, r, KV_CODEC_EINVAL, err);
  if (rc != KV_CODEC_OK)
    return rc;
  info->n_rows = n_rows;
  info->n_groups = (uint32_t)(((uint64_t)n_rows + r->page_tokens - 1) / r->page_tokens);
  size_t bitmap = kv_section_ext_bytes(id, kv_section_flags(info), shape->n_tokens);
  info->header_bytes = KV_SECTION_FIXED_BYTES + bitmap + 4 * (size_t)info->n_groups;
  return KV_CODEC_OK;
}

void kv_codec_write_header(const kv_section_info *info, const uint32_t *keep_pos, uint8_t *dst)
{
  const kv_codec_params *p = &info->params;
  memset(dst, 0, KV_SECTION_FIXED_BYTES);
  dst[0] = info->codec_id;
  dst[1] = info->version;
  dst[2] = (uint8_t)info->shape.dtype;
  dst[3] = kv_section_flags(info);
  kv_codec_put_le32(dst + 4, info->shape.n_tokens);
  kv_codec_put_le32(dst + 8, info->shape.head_dim);
  kv_codec_put_le32(dst + 12, info->n_rows);
  kv_codec_put_le32(dst + 16, p->page_tokens);
  dst[20] = (uint8_t)p->bits;
  dst[21] = (uint8_t)p->drop_method;
  kv_codec_put_le16(dst + 22, (uint16_t)p->group);
  kv_codec_put_le32(dst + 24, p->residual);
  kv_codec_put_le16(dst + 28, (uint16_t)p->keep_permille);
  dst[30] = (uint8_t)(int8_t)p->zstd_level;
  dst[31] = (uint8_t)p->sink; /* kvquant's sink rows; 0 for every other codec */
  if (p->rope_base != 0) { /* kvquant pre-RoPE K: base and first position */
    uint32_t b;
    memcpy(&b, &p->rope_base, 4);
    kv_codec_put_le32(dst + KV_SECTION_FIXED_BYTES, b);
    kv_codec_put_le32(dst + KV_SECTION_FIXED_BYTES + 4, p->rope_pos0);
  }
  if (info->codec_id == KV_CODEC_ID_DROP) {
    size_t b = ((size_t)info->shape.n_tokens + 7) / 8;
    uint8_t *bm = dst + KV_SECTION_FIXED_BYTES;
    memset(bm, 0, b);
    for (uint32_t i = 0; i < info->n_rows; i++)
      bm[keep_pos[i] >> 3] |= (uint8_t)(1u << (keep_pos[i] & 7));
  }
}

kv_codec_status kv_codec_encode_args(const kv_section_shape *shape, const void *src,
                                     size_t src_len, const void *dst, size_t *out_len,
                                     kv_codec_err *err)
{
  if (shape == NULL || src == NULL || out_len == NULL)
    return KV_CODEC_FAIL(err, KV_CODEC_EINVAL, "NULL shape, src or out_len", 0, 0);
  *out_len = 0;
  size_t es = kv_codec_dtype_bytes(shape->dtype);
  if (es == 0)
    return KV_CODEC_FAIL(err, KV_CODEC_EINVAL, "unknown dtype", shape->dtype, 3);
  uint64_t want = (uint64_t)shape->n_tokens * shape->head_dim * es;
  if (src_len != want)
    return KV_CODEC_FAIL(err, KV_CODEC_EINVAL, "src_len is not n_tokens * head_dim * elem bytes",
                         src_len, want);
  if (dst == NULL)
    return KV_CODEC_FAIL(err, KV_CODEC_EINVAL, "NULL dst", 0, 0);
  return KV_CODEC_OK;
}

size_t kv_section_rows_bytes(const kv_section_info *info, uint32_t g0, uint32_t g1)
{
  if (info == NULL || g0 >= g1 || g1 > info->n_groups)
    return 0;
  uint64_t r0 = (uint64_t)g0 * info->params.page_tokens;
  uint64_t r1 = (uint64_t)g1 * info->params.page_tokens;
  if (r1 > info->n_rows)
    r1 = info->n_rows;
  return (size_t)((r1 - r0) * info->shape.head_dim * kv_codec_dtype_bytes(info->shape.dtype));
}

/* ---- token dropping: keep counts and bitmaps ------------------------------------------------ */

uint32_t kv_drop_keep_count(uint32_t n_tokens, unsigned keep_permille)
{
  if (n_tokens == 0 || keep_permille == 0 || keep_permille > 1000)
    return 0;
  uint64_t k = ((uint64_t)n_tokens * keep_permille + 999) / 1000;
  return k < 1 ? 1 : (uint32_t)k;
}

uint32_t kv_drop_keep_span(uint64_t t0, uint32_t n_tokens, unsigned keep_permille)
{
  if (n_tokens == 0 || keep_permille == 0 || keep_permille > 1000 ||
      t0 + n_tokens > (1ull << 53))
    return 0;
  uint64_t a = (t0 * keep_permille + 500) / 1000;
  uint64_t b = ((t0 + n_tokens) * keep_permille + 500) / 1000;
  return b - a < 1 ? 1 : (uint32_t)(b - a);
}

uint32_t kv_drop_bitmap_count(const uint8_t *bitmap, uint32_t n_tokens)
{
  uint32_t c = 0, full = n_tokens / 8;
  for (uint32_t i = 0; i < full; i++)
    c += (uint32_t)__builtin_popcount(bitmap[i]);
  if (n_tokens & 7u)
    c += (uint32_t)__builtin_popcount(bitmap[full] & ((1u << (n_tokens & 7u)) - 1));
  return c;
}

/* ---- decoding context: the stream setting --------------------------------------------------- */

void kv_codec_dctx_set_stream(kv_codec_dctx *ctx, int stream)
{
  if (ctx != NULL && ctx->magic == KV_DCTX_MAGIC)
    ctx->stream = stream != 0;
}

int kv_codec_dctx_stream(const kv_codec_dctx *ctx)
{
  return ctx != NULL && ctx->magic == KV_DCTX_MAGIC && ctx->stream;
}

int kv_codec_stream_call(const kv_codec_dctx *ctx, size_t out_bytes)
{
  return kv_codec_dctx_stream(ctx) && out_bytes >= KV_CODEC_STREAM_MIN_BYTES;
}
