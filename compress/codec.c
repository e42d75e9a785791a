/* SPDX-License-Identifier: MIT */
/*
 * compress/codec.c — the top of compress/: the registry (the kv_codec entries of the codecs),
 * parsing a section header as untrusted input, and the generic decode entry points that
 * dispatch on the stored codec id. The codecs live in lossless.c (raw, zstd-planes), quant.c
 * (kivi) and drop.c (drop); what they share (status and messages, conversions, the parameter
 * rules, writing a header) in codec_base.c, below them. Invariants H1 and H2: codec_base.c.
 */
#include "codec_int.h"

#include <stdio.h>
#include <string.h>

/* ---- registry ------------------------------------------------------------------------------ */

static const kv_codec *const registry[] = {
  &kv_codec_raw,
  &kv_codec_zstd_planes,
  &kv_codec_kivi,
  &kv_codec_drop,
  &kv_codec_kvquant,
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
  size_t bitmap = kv_section_ext_bytes(h[0], h[3], n_tokens);
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
  /* bit 0 K/V; kvquant: bit 3 per-channel bit allocation, and on K sections bit 1 pre-RoPE
   * with bit 2 (half pairs) only beside it */
  uint8_t allowed = 1u;
  if (h[0] == KV_CODEC_ID_KVQUANT)
    allowed = (uint8_t)(allowed | 8u | ((h[3] & 3u) == 2u ? 6u : 0u));
  if (h[3] & (uint8_t)~allowed)
    return KV_CODEC_FAIL(err, KV_CODEC_ECORRUPT, "reserved flag bits set", h[3], allowed);
  if (h[31] != 0 && h[0] != KV_CODEC_ID_KVQUANT) /* kvquant: its sink rows */
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
  p->sink = h[0] == KV_CODEC_ID_KVQUANT ? h[31] : 0;
  p->alloc = (h[3] & 8u) ? 1u : 0u;
  if (h[3] & 2u) { /* kvquant pre-RoPE K: the extension after the fixed header */
    if (src_len < KV_SECTION_FIXED_BYTES + KV_SECTION_ROPE_EXT)
      return KV_CODEC_FAIL(err, KV_CODEC_ECORRUPT, "section truncated inside its header", src_len,
                           KV_SECTION_FIXED_BYTES + KV_SECTION_ROPE_EXT);
    uint32_t b = kv_codec_get_le32(h + KV_SECTION_FIXED_BYTES);
    memcpy(&p->rope_base, &b, 4);
    p->rope_pos0 = kv_codec_get_le32(h + KV_SECTION_FIXED_BYTES + 4);
    p->rope_style = (h[3] & 4u) ? KV_ROPE_HALF : KV_ROPE_ADJACENT;
  }
  if (info->codec_id == KV_CODEC_ID_DROP)
    p->n_keep = info->n_rows;

  kv_codec_status rc = kv_codec_validate_config(info->codec_id, &info->shape, info->n_rows, p,
                                                KV_CODEC_ECORRUPT, err);
  if (rc != KV_CODEC_OK)
    return rc;
  info->n_groups = (uint32_t)(((uint64_t)info->n_rows + p->page_tokens - 1) / p->page_tokens);
  size_t bitmap = kv_section_ext_bytes(info->codec_id, h[3], info->shape.n_tokens);
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

static const uint8_t *group_table(const kv_section_info *info, const uint8_t *hdr)
{
  size_t bitmap = kv_section_ext_bytes(info->codec_id, kv_section_flags(info),
                                       info->shape.n_tokens);
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

static kv_codec_status kv_codec_decode_check(const kv_section_info *info, const uint8_t *hdr,
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

static kv_codec_status kv_codec_decode_begin(uint8_t id, const void *hdr, size_t hdr_len,
                                             size_t payload_len, uint32_t g0, uint32_t g1,
                                             size_t dst_cap, kv_section_info *info,
                                             kv_codec_err *err)
{
  kv_codec_status rc = kv_section_parse(hdr, hdr_len, info, err);
  if (rc != KV_CODEC_OK)
    return rc;
  if (info->codec_id != id)
    return KV_CODEC_FAIL(err, KV_CODEC_ECORRUPT, "section was written by another codec",
                         info->codec_id, id);
  return kv_codec_decode_check(info, hdr, payload_len, g0, g1, dst_cap, err);
}

static kv_codec_status kv_codec_decode_parsed(const kv_section_info *info, const uint8_t *hdr,
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
  case KV_CODEC_ID_KVQUANT: /* the same group decoder, kvquant's layout (quant.c geom) */
    return kv_kivi_decode_parsed(info, payload, g0, g1, scratch, scratch_cap, dst, ctx, err);
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

int kv_section_decodes_strided(uint8_t codec_id)
{
  return codec_id == KV_CODEC_ID_RAW || codec_id == KV_CODEC_ID_KIVI ||
         codec_id == KV_CODEC_ID_KVQUANT;
}

/* The page group that the first n_rows rows end inside (cut: 1), or n_groups. */
static uint32_t rows_groups(const kv_section_info *info, uint32_t n_rows, int *cut)
{
  uint32_t pt = info->params.page_tokens ? info->params.page_tokens : info->n_rows;
  uint32_t g = pt ? n_rows / pt : 0;
  *cut = n_rows < info->n_rows && pt != 0 && n_rows % pt != 0;
  return n_rows >= info->n_rows ? info->n_groups : g;
}

size_t kv_section_rows_scratch_bytes(const kv_section_info *info, uint32_t n_rows)
{
  if (info == NULL || kv_codec_by_id(info->codec_id) == NULL || n_rows > info->n_rows)
    return 0;
  if (info->codec_id == KV_CODEC_ID_RAW)
    return 1; /* row by row, nothing decoded aside */
  size_t need = kv_section_scratch_bytes(info);
  int cut;
  uint32_t g = rows_groups(info, n_rows, &cut);
  if (cut) /* that group's rows, decoded aside */
    need += (size_t)kv_codec_group_rows(info, g) * info->shape.head_dim *
            kv_codec_dtype_bytes(info->shape.dtype);
  return need;
}

kv_codec_status kv_section_decode_rows_dctx(kv_codec_dctx *ctx, const void *src, size_t src_len,
                                            uint32_t n_rows, void *scratch, size_t scratch_cap,
                                            void *dst, size_t dst_stride, kv_section_info *info,
                                            kv_codec_err *err)
{
  kv_section_info local;
  kv_section_info *in = info ? info : &local;
  kv_codec_status rc = kv_section_parse(src, src_len, in, err);
  if (rc != KV_CODEC_OK)
    return rc;
  return kv_section_decode_rows_parsed(ctx, in, src, src_len, n_rows, scratch, scratch_cap, dst,
                                       dst_stride, err);
}

kv_codec_status kv_section_decode_rows_parsed(kv_codec_dctx *ctx, const kv_section_info *in,
                                              const void *src, size_t src_len, uint32_t n_rows,
                                              void *scratch, size_t scratch_cap, void *dst,
                                              size_t dst_stride, kv_codec_err *err)
{
  kv_codec_status rc;
  if (in == NULL || src == NULL)
    return KV_CODEC_FAIL(err, KV_CODEC_EINVAL, "NULL info or src", 0, 0);
  if (src_len != in->section_bytes)
    return KV_CODEC_FAIL(err, KV_CODEC_ECORRUPT,
                         src_len < in->section_bytes ? "section truncated"
                                                     : "bytes after the last group",
                         src_len, in->section_bytes);
  if (!kv_section_decodes_strided(in->codec_id))
    return KV_CODEC_FAIL(err, KV_CODEC_EINVAL, "this codec decodes contiguous rows only",
                         in->codec_id, KV_CODEC_ID_KVQUANT);
  size_t rowb = (size_t)in->shape.head_dim * kv_codec_dtype_bytes(in->shape.dtype);
  if (n_rows > in->n_rows)
    return KV_CODEC_FAIL(err, KV_CODEC_EINVAL, "more rows than the section holds", n_rows,
                         in->n_rows);
  if (dst_stride < rowb)
    return KV_CODEC_FAIL(err, KV_CODEC_EINVAL, "dst_stride below a row's bytes", dst_stride, rowb);
  if (n_rows == 0)
    return KV_CODEC_OK;
  if (dst == NULL || scratch == NULL)
    return KV_CODEC_FAIL(err, KV_CODEC_EINVAL, "NULL dst or scratch", 0, 0);
  size_t need = kv_section_rows_scratch_bytes(in, n_rows);
  if (scratch_cap < need)
    return KV_CODEC_FAIL(err, KV_CODEC_ENOMEM, "scratch smaller than rows_scratch_bytes()",
                         scratch_cap, need);
  const uint8_t *payload = (const uint8_t *)src + in->header_bytes;
  uint8_t *out = dst;
  if (in->codec_id == KV_CODEC_ID_RAW) { /* the rows lie back to back in the payload */
    for (uint32_t r = 0; r < n_rows; r++)
      kv_codec_load_le(in->shape.dtype, payload + (size_t)r * rowb, in->shape.head_dim,
                       out + (size_t)r * dst_stride);
    return KV_CODEC_OK;
  }
  int cut;
  uint32_t g1 = rows_groups(in, n_rows, &cut);
  size_t base = kv_section_scratch_bytes(in);
  if (g1 > 0) {
    rc = kv_kivi_decode_strided(in, payload, 0, g1, scratch, base, dst, dst_stride, ctx, err);
    if (rc != KV_CODEC_OK)
      return rc;
  }
  if (cut) { /* group g1 decoded aside, its first rows copied */
    const uint8_t *t = group_table(in, (const uint8_t *)src);
    uint64_t off = 0;
    for (uint32_t g = 0; g < g1; g++)
      off += kv_codec_get_le32(t + 4 * (size_t)g);
    uint8_t *rows = (uint8_t *)scratch + base;
    rc = kv_codec_decode_parsed(in, (const uint8_t *)src, payload + off, g1, g1 + 1, scratch, base,
                                rows, ctx, err);
    if (rc != KV_CODEC_OK)
      return rc;
    uint32_t r0 = g1 * in->params.page_tokens;
    for (uint32_t r = r0; r < n_rows; r++)
      memcpy(out + (size_t)r * dst_stride, rows + (size_t)(r - r0) * rowb, rowb);
  }
  return KV_CODEC_OK;
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

/* ---- the registry's entries ------------------------------------------------------------------ */

/*
 * The decode member of every codec: the header must name this codec (kv_codec_decode_begin()
 * parses it with the codec it names), then the codec's decoder runs on the checked arguments.
 */
static kv_codec_status decode_member(uint8_t id, const void *hdr, size_t hdr_len,
                                     const void *payload, size_t payload_len, uint32_t g0,
                                     uint32_t g1, void *scratch, size_t scratch_cap, void *dst,
                                     size_t dst_cap, kv_codec_err *err)
{
  kv_section_info info;
  if (payload == NULL || dst == NULL)
    return KV_CODEC_FAIL(err, KV_CODEC_EINVAL, "NULL payload or dst", 0, 0);
  kv_codec_status rc =
    kv_codec_decode_begin(id, hdr, hdr_len, payload_len, g0, g1, dst_cap, &info, err);
  if (rc != KV_CODEC_OK)
    return rc;
  return kv_codec_decode_parsed(&info, hdr, payload, g0, g1, scratch, scratch_cap, dst, NULL, err);
}

static kv_codec_status raw_decode(const void *hdr, size_t hdr_len, const void *payload,
                                  size_t payload_len, uint32_t g0, uint32_t g1, void *scratch,
                                  size_t scratch_cap, void *dst, size_t dst_cap, kv_codec_err *err)
{
  return decode_member(KV_CODEC_ID_RAW, hdr, hdr_len, payload, payload_len, g0, g1, scratch,
                       scratch_cap, dst, dst_cap, err);
}

static kv_codec_status zp_decode(const void *hdr, size_t hdr_len, const void *payload,
                                 size_t payload_len, uint32_t g0, uint32_t g1, void *scratch,
                                 size_t scratch_cap, void *dst, size_t dst_cap, kv_codec_err *err)
{
  return decode_member(KV_CODEC_ID_ZSTD_PLANES, hdr, hdr_len, payload, payload_len, g0, g1, scratch,
                       scratch_cap, dst, dst_cap, err);
}

static kv_codec_status kivi_decode(const void *hdr, size_t hdr_len, const void *payload,
                                   size_t payload_len, uint32_t g0, uint32_t g1, void *scratch,
                                   size_t scratch_cap, void *dst, size_t dst_cap,
                                   kv_codec_err *err)
{
  return decode_member(KV_CODEC_ID_KIVI, hdr, hdr_len, payload, payload_len, g0, g1, scratch,
                       scratch_cap, dst, dst_cap, err);
}

static kv_codec_status drop_decode(const void *hdr, size_t hdr_len, const void *payload,
                                   size_t payload_len, uint32_t g0, uint32_t g1, void *scratch,
                                   size_t scratch_cap, void *dst, size_t dst_cap,
                                   kv_codec_err *err)
{
  return decode_member(KV_CODEC_ID_DROP, hdr, hdr_len, payload, payload_len, g0, g1, scratch,
                       scratch_cap, dst, dst_cap, err);
}

const kv_codec kv_codec_raw = {
  .id = KV_CODEC_ID_RAW,
  .name = "raw",
  .flags = KV_CODEC_LOSSLESS,
  .bound = kv_codec_raw_bound,
  .scratch_bytes = kv_codec_raw_scratch_bytes,
  .encode = kv_codec_raw_encode,
  .decode = raw_decode,
  .check = kv_codec_raw_check,
};

const kv_codec kv_codec_zstd_planes = {
  .id = KV_CODEC_ID_ZSTD_PLANES,
  .name = "zstd-planes",
  .flags = KV_CODEC_LOSSLESS,
  .bound = kv_codec_zp_bound,
  .scratch_bytes = kv_codec_zp_scratch_bytes,
  .encode = kv_codec_zp_encode,
  .decode = zp_decode,
  .check = kv_codec_zp_check,
};

const kv_codec kv_codec_kivi = {
  .id = KV_CODEC_ID_KIVI,
  .name = "kivi",
  .flags = KV_CODEC_LOSSY,
  .bound = kv_codec_kivi_bound,
  .scratch_bytes = kv_codec_kivi_scratch_bytes,
  .encode = kv_codec_kivi_encode,
  .decode = kivi_decode,
  .check = kv_quant_check,
};

static kv_codec_status kvq_decode(const void *hdr, size_t hdr_len, const void *payload,
                                  size_t payload_len, uint32_t g0, uint32_t g1, void *scratch,
                                  size_t scratch_cap, void *dst, size_t dst_cap, kv_codec_err *err)
{
  return decode_member(KV_CODEC_ID_KVQUANT, hdr, hdr_len, payload, payload_len, g0, g1, scratch,
                       scratch_cap, dst, dst_cap, err);
}

const kv_codec kv_codec_kvquant = {
  .id = KV_CODEC_ID_KVQUANT,
  .name = "kvquant",
  .flags = KV_CODEC_LOSSY,
  .bound = kv_codec_kvq_bound,
  .scratch_bytes = kv_codec_kvq_scratch_bytes,
  .encode = kv_codec_kvq_encode,
  .decode = kvq_decode,
  .check = kv_quant_check,
};

const kv_codec kv_codec_drop = {
  .id = KV_CODEC_ID_DROP,
  .name = "drop",
  .flags = KV_CODEC_LOSSY | KV_CODEC_DROPS_TOKENS,
  .bound = kv_codec_drop_bound,
  .scratch_bytes = kv_codec_drop_scratch_bytes,
  .encode = kv_codec_drop_encode,
  .decode = drop_decode,
  .check = kv_codec_drop_check,
};
