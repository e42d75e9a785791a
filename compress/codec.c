/* SPDX-License-Identifier: MIT */
/*
 * compress/codec.c — the codec registry, the section header, and element conversions.
 *
 * Owns everything the codecs share: the status names and messages, the fixed 32-byte section
 * header (writing it, and parsing it as untrusted input), the default and validation rules of
 * the parameters, the generic decode entry points that dispatch on the stored codec id, and
 * the f16/bf16 conversions. The codecs themselves live in lossless.c (raw, zstd-planes),
 * quant.c (kivi) and drop.c (drop).
 *
 * INVARIANTS
 *   H1. A kv_section_info that kv_section_parse() returned OK for describes a section whose
 *       every size fits in uint64_t without overflow: n_rows * head_dim * 4 <= 2^48,
 *       page_tokens * row bytes <= 2^30, and each group-table entry is one the codec can
 *       produce for that group (exactly, or within its bound for zstd-planes).
 *   H2. The encoder and kv_section_parse() apply the same rules (validate_config()), so every
 *       section this build writes parses, and parse rejects what no encoder could write.
 */
#define KV_CODEC_INTERNAL
#include "codec.h"

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
static kv_codec_status validate_config(uint8_t id, const kv_section_shape *s, uint32_t n_rows,
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
  int uses_quant = id == KV_CODEC_ID_KIVI || (id == KV_CODEC_ID_DROP && p->bits != 0);
  int uses_drop = id == KV_CODEC_ID_DROP;

  if (uses_level) {
    if (p->zstd_level < -7 || p->zstd_level > 22 || p->zstd_level == 0)
      return KV_CODEC_FAIL(err, code, "zstd level outside -7..22", (int64_t)p->zstd_level, 22);
  } else if (p->zstd_level != 0) {
    return KV_CODEC_FAIL(err, code, "zstd level set for a codec without zstd",
                         (int64_t)p->zstd_level, 0);
  }

  if (uses_quant) {
    if (!bits_ok(p->bits))
      return KV_CODEC_FAIL(err, code, "bits must be 8, 4 or 2", p->bits, 8);
    if (p->group == 0 || p->group > 65535)
      return KV_CODEC_FAIL(err, code, "quantization group out of range", p->group, 65535);
    if (s->kind == KV_SECTION_K && p->group > n_rows)
      return KV_CODEC_FAIL(err, code, "quantization group larger than the tokens", p->group,
                           n_rows);
    if (s->kind == KV_SECTION_V && p->group > s->head_dim)
      return KV_CODEC_FAIL(err, code, "quantization group larger than head_dim", p->group,
                           s->head_dim);
    if (s->kind == KV_SECTION_K && p->page_tokens % p->group != 0)
      return KV_CODEC_FAIL(err, code, "page_tokens not a multiple of the key group",
                           p->page_tokens, p->group);
    if (p->residual > n_rows)
      return KV_CODEC_FAIL(err, code, "residual larger than the rows", p->residual, n_rows);
  } else {
    if (p->bits != 0)
      return KV_CODEC_FAIL(err, code, "bits set for a codec without quantization", p->bits, 0);
    if (p->group != 0)
      return KV_CODEC_FAIL(err, code, "group set for a codec without quantization", p->group, 0);
    if (p->residual != 0)
      return KV_CODEC_FAIL(err, code, "residual set for a codec without quantization",
                           p->residual, 0);
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
  if (uses_quant && kind == KV_SECTION_K && p->group > 0)
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

  int uses_quant = id == KV_CODEC_ID_KIVI || (id == KV_CODEC_ID_DROP && p->bits != 0);
  if (id == KV_CODEC_ID_ZSTD_PLANES && r->zstd_level == 0)
    r->zstd_level = KV_CODEC_ZSTD_LEVEL_DEFAULT;
  if (uses_quant && r->group == 0) {
    uint32_t lim = shape->kind == KV_SECTION_K ? n_rows : shape->head_dim;
    r->group = KV_CODEC_GROUP_DEFAULT < lim ? KV_CODEC_GROUP_DEFAULT : lim;
  }
  if (r->page_tokens == 0)
    r->page_tokens = default_page_tokens(id, shape->head_dim, kv_codec_dtype_bytes(shape->dtype),
                                         r, shape->kind, uses_quant);
  if (id < KV_CODEC_ID_RAW || id > KV_CODEC_ID_DROP)
    return KV_CODEC_FAIL(err, KV_CODEC_EINVAL, "unknown codec id", id, KV_CODEC_ID_DROP);

  kv_codec_status rc = validate_config(id, shape, n_rows, r, KV_CODEC_EINVAL, err);
  if (rc != KV_CODEC_OK)
    return rc;
  info->n_rows = n_rows;
  info->n_groups = (uint32_t)(((uint64_t)n_rows + r->page_tokens - 1) / r->page_tokens);
  size_t bitmap = id == KV_CODEC_ID_DROP ? ((size_t)shape->n_tokens + 7) / 8 : 0;
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
  dst[3] = (uint8_t)(info->shape.kind == KV_SECTION_V ? 1 : 0);
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
  dst[31] = 0;
  if (info->codec_id == KV_CODEC_ID_DROP) {
    size_t b = ((size_t)info->shape.n_tokens + 7) / 8;
    uint8_t *bm = dst + KV_SECTION_FIXED_BYTES;
    memset(bm, 0, b);
    for (uint32_t i = 0; i < info->n_rows; i++)
      bm[keep_pos[i] >> 3] |= (uint8_t)(1u << (keep_pos[i] & 7));
  }
}

/* ---- registry ------------------------------------------------------------------------------ */

static const kv_codec *const registry[] = {
  &kv_codec_raw,
  &kv_codec_zstd_planes,
  &kv_codec_kivi,
  &kv_codec_drop,
};
#define N_CODECS (sizeof registry / sizeof registry[0])

const kv_codec *kv_codec_by_id(unsigned id)
{
  for (size_t i = 0; i < N_CODECS; i++)
    if (registry[i]->id == id)
      return registry[i];
  return NULL;
}

const kv_codec *kv_codec_by_name(const char *name)
{
  if (name == NULL)
    return NULL;
  for (size_t i = 0; i < N_CODECS; i++)
    if (strcmp(registry[i]->name, name) == 0)
      return registry[i];
  return NULL;
}

size_t kv_codec_count(void)
{
  return N_CODECS;
}

const kv_codec *kv_codec_at(size_t i)
{
  return i < N_CODECS ? registry[i] : NULL;
}

size_t kv_codec_bound(const kv_codec *c, const kv_section_shape *shape, const kv_codec_params *p)
{
  return c ? c->bound(shape, p) : 0;
}

size_t kv_codec_scratch_bytes(const kv_codec *c, const kv_section_shape *shape,
                              const kv_codec_params *p, kv_codec_op op)
{
  return c ? c->scratch_bytes(shape, p, op) : 0;
}

kv_codec_status kv_codec_encode(const kv_codec *c, const kv_section_shape *shape, const void *src,
                                size_t src_len, const kv_codec_params *p, void *scratch,
                                size_t scratch_cap, void *dst, size_t dst_cap, size_t *out_len,
                                kv_codec_err *err)
{
  if (c == NULL)
    return KV_CODEC_FAIL(err, KV_CODEC_EINVAL, "NULL codec", 0, 0);
  return c->encode(shape, src, src_len, p, scratch, scratch_cap, dst, dst_cap, out_len, err);
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

/* ---- parsing -------------------------------------------------------------------------------- */

kv_codec_status kv_section_header_bytes(const void *src, size_t src_len, size_t *out,
                                        kv_codec_err *err)
{
  const uint8_t *h = src;
  if (src == NULL || out == NULL)
    return KV_CODEC_FAIL(err, KV_CODEC_EINVAL, "NULL src or out", 0, 0);
  if (src_len < KV_SECTION_FIXED_BYTES)
    return KV_CODEC_FAIL(err, KV_CODEC_ECORRUPT, "section shorter than its fixed header", src_len,
                         KV_SECTION_FIXED_BYTES);
  uint32_t n_tokens = kv_codec_get_le32(h + 4);
  uint32_t n_rows = kv_codec_get_le32(h + 12);
  uint32_t page = kv_codec_get_le32(h + 16);
  if (n_tokens == 0 || n_tokens > KV_CODEC_MAX_TOKENS)
    return KV_CODEC_FAIL(err, KV_CODEC_ECORRUPT, "n_tokens out of range", n_tokens,
                         KV_CODEC_MAX_TOKENS);
  if (n_rows == 0 || n_rows > n_tokens)
    return KV_CODEC_FAIL(err, KV_CODEC_ECORRUPT, "row count out of range", n_rows, n_tokens);
  if (page == 0 || page > KV_CODEC_MAX_PAGE_TOKENS)
    return KV_CODEC_FAIL(err, KV_CODEC_ECORRUPT, "page_tokens out of range", page,
                         KV_CODEC_MAX_PAGE_TOKENS);
  uint64_t n_groups = ((uint64_t)n_rows + page - 1) / page;
  size_t bitmap = h[0] == KV_CODEC_ID_DROP ? ((size_t)n_tokens + 7) / 8 : 0;
  *out = KV_SECTION_FIXED_BYTES + bitmap + 4 * (size_t)n_groups;
  return KV_CODEC_OK;
}

kv_codec_status kv_section_parse(const void *src, size_t src_len, kv_section_info *info,
                                 kv_codec_err *err)
{
  const uint8_t *h = src;
  if (src == NULL || info == NULL)
    return KV_CODEC_FAIL(err, KV_CODEC_EINVAL, "NULL src or info", 0, 0);
  memset(info, 0, sizeof *info);
  if (src_len < KV_SECTION_FIXED_BYTES)
    return KV_CODEC_FAIL(err, KV_CODEC_ECORRUPT, "section shorter than its fixed header", src_len,
                         KV_SECTION_FIXED_BYTES);
  const kv_codec *c = kv_codec_by_id(h[0]);
  if (c == NULL)
    return KV_CODEC_FAIL(err, KV_CODEC_ECORRUPT, "unknown codec id", h[0], KV_CODEC_ID_DROP);
  if (h[1] != KV_SECTION_VERSION)
    return KV_CODEC_FAIL(err, KV_CODEC_ECORRUPT, "unsupported section version", h[1],
                         KV_SECTION_VERSION);
  if (h[3] & 0xfeu)
    return KV_CODEC_FAIL(err, KV_CODEC_ECORRUPT, "reserved flag bits set", h[3], 1);
  if (h[31] != 0)
    return KV_CODEC_FAIL(err, KV_CODEC_ECORRUPT, "reserved header byte set", h[31], 0);

  info->codec_id = h[0];
  info->version = h[1];
  info->shape.dtype = (kv_codec_dtype)h[2];
  info->shape.kind = (h[3] & 1u) ? KV_SECTION_V : KV_SECTION_K;
  info->shape.n_tokens = kv_codec_get_le32(h + 4);
  info->shape.head_dim = kv_codec_get_le32(h + 8);
  info->n_rows = kv_codec_get_le32(h + 12);
  kv_codec_params *p = &info->params;
  kv_codec_params_init(p);
  p->page_tokens = kv_codec_get_le32(h + 16);
  p->bits = h[20];
  p->drop_method = (kv_drop_method)h[21];
  p->group = kv_codec_get_le16(h + 22);
  p->residual = kv_codec_get_le32(h + 24);
  p->keep_permille = kv_codec_get_le16(h + 28);
  p->zstd_level = (int8_t)h[30];
  if (info->codec_id == KV_CODEC_ID_DROP)
    p->n_keep = info->n_rows;

  kv_codec_status rc = validate_config(info->codec_id, &info->shape, info->n_rows, p,
                                       KV_CODEC_ECORRUPT, err);
  if (rc != KV_CODEC_OK)
    return rc;
  info->n_groups = (uint32_t)(((uint64_t)info->n_rows + p->page_tokens - 1) / p->page_tokens);
  size_t bitmap = info->codec_id == KV_CODEC_ID_DROP ? ((size_t)info->shape.n_tokens + 7) / 8 : 0;
  info->header_bytes = KV_SECTION_FIXED_BYTES + bitmap + 4 * (size_t)info->n_groups;
  if (src_len < info->header_bytes)
    return KV_CODEC_FAIL(err, KV_CODEC_ECORRUPT, "section truncated inside its header", src_len,
                         info->header_bytes);
  rc = c->check(info, h, err);
  if (rc != KV_CODEC_OK)
    return rc;
  const uint8_t *table = h + KV_SECTION_FIXED_BYTES + bitmap;
  uint64_t total = info->header_bytes;
  for (uint32_t g = 0; g < info->n_groups; g++)
    total += kv_codec_get_le32(table + 4 * (size_t)g);
  info->section_bytes = total;
  return KV_CODEC_OK;
}

size_t kv_section_scratch_bytes(const kv_section_info *info)
{
  if (info == NULL)
    return 0;
  const kv_codec *c = kv_codec_by_id(info->codec_id);
  if (c == NULL)
    return 0;
  return c->scratch_bytes(&info->shape, &info->params, KV_CODEC_OP_DECODE);
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

static const uint8_t *group_table(const kv_section_info *info, const uint8_t *hdr)
{
  size_t bitmap = info->codec_id == KV_CODEC_ID_DROP ? ((size_t)info->shape.n_tokens + 7) / 8 : 0;
  return hdr + KV_SECTION_FIXED_BYTES + bitmap;
}

kv_codec_status kv_section_group_span(const void *hdr, size_t hdr_len, uint32_t g0, uint32_t g1,
                                      uint64_t *off, uint64_t *len, kv_codec_err *err)
{
  kv_section_info info;
  if (off == NULL || len == NULL)
    return KV_CODEC_FAIL(err, KV_CODEC_EINVAL, "NULL off or len", 0, 0);
  kv_codec_status rc = kv_section_parse(hdr, hdr_len, &info, err);
  if (rc != KV_CODEC_OK)
    return rc;
  if (g0 >= g1 || g1 > info.n_groups)
    return KV_CODEC_FAIL(err, KV_CODEC_EINVAL, "group range outside the section", g1,
                         info.n_groups);
  const uint8_t *t = group_table(&info, hdr);
  uint64_t o = info.header_bytes, l = 0;
  for (uint32_t g = 0; g < g1; g++) {
    uint32_t n = kv_codec_get_le32(t + 4 * (size_t)g);
    if (g < g0)
      o += n;
    else
      l += n;
  }
  *off = o;
  *len = l;
  return KV_CODEC_OK;
}

kv_codec_status kv_codec_decode_check(const kv_section_info *info, const uint8_t *hdr,
                                      size_t payload_len, uint32_t g0, uint32_t g1,
                                      size_t dst_cap, kv_codec_err *err)
{
  if (g0 >= g1 || g1 > info->n_groups)
    return KV_CODEC_FAIL(err, KV_CODEC_EINVAL, "group range outside the section", g1,
                         info->n_groups);
  const uint8_t *t = group_table(info, hdr);
  uint64_t need = 0;
  for (uint32_t g = g0; g < g1; g++)
    need += kv_codec_get_le32(t + 4 * (size_t)g);
  if (payload_len != need)
    return KV_CODEC_FAIL(err, KV_CODEC_ECORRUPT,
                         payload_len < need ? "payload truncated" : "payload longer than its groups",
                         payload_len, need);
  size_t out = kv_section_rows_bytes(info, g0, g1);
  if (dst_cap < out)
    return KV_CODEC_FAIL(err, KV_CODEC_ETOOSMALL, "dst smaller than the decoded rows", dst_cap,
                         out);
  return KV_CODEC_OK;
}

kv_codec_status kv_codec_decode_begin(uint8_t id, const void *hdr, size_t hdr_len,
                                      size_t payload_len, uint32_t g0, uint32_t g1,
                                      size_t dst_cap, kv_section_info *info, kv_codec_err *err)
{
  kv_codec_status rc = kv_section_parse(hdr, hdr_len, info, err);
  if (rc != KV_CODEC_OK)
    return rc;
  if (info->codec_id != id)
    return KV_CODEC_FAIL(err, KV_CODEC_ECORRUPT, "section was written by another codec",
                         info->codec_id, id);
  return kv_codec_decode_check(info, hdr, payload_len, g0, g1, dst_cap, err);
}

kv_codec_status kv_codec_decode_parsed(const kv_section_info *info, const uint8_t *hdr,
                                       const uint8_t *payload, uint32_t g0, uint32_t g1,
                                       void *scratch, size_t scratch_cap, void *dst,
                                       kv_codec_dctx *ctx, kv_codec_err *err)
{
  switch (info->codec_id) {
  case KV_CODEC_ID_RAW: return kv_raw_decode_parsed(info, payload, g0, g1, dst);
  case KV_CODEC_ID_ZSTD_PLANES:
    return kv_zp_decode_parsed(info, hdr, payload, g0, g1, scratch, scratch_cap, dst, ctx, err);
  case KV_CODEC_ID_KIVI:
    return kv_kivi_decode_parsed(info, payload, g0, g1, scratch, scratch_cap, dst, ctx, err);
  case KV_CODEC_ID_DROP:
    return kv_drop_decode_parsed(info, payload, g0, g1, scratch, scratch_cap, dst, ctx, err);
  default: break;
  }
  return KV_CODEC_FAIL(err, KV_CODEC_ECORRUPT, "unknown codec id", info->codec_id,
                       KV_CODEC_ID_DROP); /* unreachable: kv_section_parse() checked it */
}

kv_codec_status kv_section_decode_groups(const void *hdr, size_t hdr_len, const void *payload,
                                         size_t payload_len, uint32_t g0, uint32_t g1,
                                         void *scratch, size_t scratch_cap, void *dst,
                                         size_t dst_cap, kv_codec_err *err)
{
  return kv_section_decode_groups_dctx(NULL, hdr, hdr_len, payload, payload_len, g0, g1, scratch,
                                       scratch_cap, dst, dst_cap, err);
}

/* Parses the header once (the codecs' decode members would parse it again). */
kv_codec_status kv_section_decode_groups_dctx(kv_codec_dctx *ctx, const void *hdr, size_t hdr_len,
                                              const void *payload, size_t payload_len, uint32_t g0,
                                              uint32_t g1, void *scratch, size_t scratch_cap,
                                              void *dst, size_t dst_cap, kv_codec_err *err)
{
  kv_section_info info;
  if (hdr == NULL || hdr_len < 1)
    return KV_CODEC_FAIL(err, KV_CODEC_ECORRUPT, "section shorter than its fixed header", 0,
                         KV_SECTION_FIXED_BYTES);
  if (kv_codec_by_id(((const uint8_t *)hdr)[0]) == NULL)
    return KV_CODEC_FAIL(err, KV_CODEC_ECORRUPT, "unknown codec id", ((const uint8_t *)hdr)[0],
                         KV_CODEC_ID_DROP);
  if (payload == NULL || dst == NULL)
    return KV_CODEC_FAIL(err, KV_CODEC_EINVAL, "NULL payload or dst", 0, 0);
  kv_codec_status rc = kv_section_parse(hdr, hdr_len, &info, err);
  if (rc != KV_CODEC_OK)
    return rc;
  rc = kv_codec_decode_check(&info, hdr, payload_len, g0, g1, dst_cap, err);
  if (rc != KV_CODEC_OK)
    return rc;
  return kv_codec_decode_parsed(&info, hdr, payload, g0, g1, scratch, scratch_cap, dst, ctx, err);
}

kv_codec_status kv_section_decode(const void *src, size_t src_len, void *scratch,
                                  size_t scratch_cap, void *dst, size_t dst_cap,
                                  kv_section_info *info, kv_codec_err *err)
{
  return kv_section_decode_dctx(NULL, src, src_len, scratch, scratch_cap, dst, dst_cap, info, err);
}

kv_codec_status kv_section_decode_dctx(kv_codec_dctx *ctx, const void *src, size_t src_len,
                                       void *scratch, size_t scratch_cap, void *dst,
                                       size_t dst_cap, kv_section_info *info, kv_codec_err *err)
{
  kv_section_info local;
  kv_section_info *in = info ? info : &local;
  kv_codec_status rc = kv_section_parse(src, src_len, in, err);
  if (rc != KV_CODEC_OK)
    return rc;
  if (src_len != in->section_bytes)
    return KV_CODEC_FAIL(err, KV_CODEC_ECORRUPT,
                         src_len < in->section_bytes ? "section truncated"
                                                     : "bytes after the last group",
                         src_len, in->section_bytes);
  if (dst == NULL)
    return KV_CODEC_FAIL(err, KV_CODEC_EINVAL, "NULL payload or dst", 0, 0);
  size_t out = kv_section_rows_bytes(in, 0, in->n_groups);
  if (dst_cap < out)
    return KV_CODEC_FAIL(err, KV_CODEC_ETOOSMALL, "dst smaller than the decoded rows", dst_cap,
                         out);
  return kv_codec_decode_parsed(in, src, (const uint8_t *)src + in->header_bytes, 0, in->n_groups,
                                scratch, scratch_cap, dst, ctx, err);
}

kv_codec_status kv_section_positions(const void *hdr, size_t hdr_len, uint32_t row0, uint32_t n,
                                     uint32_t *pos, kv_codec_err *err)
{
  kv_section_info info;
  kv_codec_status rc = kv_section_parse(hdr, hdr_len, &info, err);
  if (rc != KV_CODEC_OK)
    return rc;
  if (pos == NULL && n > 0)
    return KV_CODEC_FAIL(err, KV_CODEC_EINVAL, "NULL pos", 0, 0);
  if ((uint64_t)row0 + n > info.n_rows)
    return KV_CODEC_FAIL(err, KV_CODEC_EINVAL, "rows beyond the section", (uint64_t)row0 + n,
                         info.n_rows);
  if (info.codec_id != KV_CODEC_ID_DROP) {
    for (uint32_t i = 0; i < n; i++)
      pos[i] = row0 + i;
    return KV_CODEC_OK;
  }
  const uint8_t *bm = (const uint8_t *)hdr + KV_SECTION_FIXED_BYTES;
  uint32_t row = 0, out = 0;
  for (uint32_t t = 0; t < info.shape.n_tokens && out < n; t++) {
    if (bm[t >> 3] & (1u << (t & 7))) {
      if (row >= row0)
        pos[out++] = t;
      row++;
    }
  }
  return KV_CODEC_OK;
}

kv_codec_status kv_section_row_of_token(const void *hdr, size_t hdr_len, uint32_t token,
                                        uint32_t *row, kv_codec_err *err)
{
  kv_section_info info;
  kv_codec_status rc = kv_section_parse(hdr, hdr_len, &info, err);
  if (rc != KV_CODEC_OK)
    return rc;
  if (row == NULL)
    return KV_CODEC_FAIL(err, KV_CODEC_EINVAL, "NULL row", 0, 0);
  if (token >= info.shape.n_tokens)
    return KV_CODEC_FAIL(err, KV_CODEC_EINVAL, "token beyond the section", token,
                         info.shape.n_tokens);
  if (info.codec_id != KV_CODEC_ID_DROP) {
    *row = token;
    return KV_CODEC_OK;
  }
  const uint8_t *bm = (const uint8_t *)hdr + KV_SECTION_FIXED_BYTES;
  if (!(bm[token >> 3] & (1u << (token & 7)))) {
    *row = KV_SECTION_DROPPED;
    return KV_CODEC_OK;
  }
  *row = kv_drop_bitmap_count(bm, token);
  return KV_CODEC_OK;
}
