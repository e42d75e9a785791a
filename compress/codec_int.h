/* SPDX-License-Identifier: MIT */
/*
 * compress/codec_int.h — private to compress/ (and the module's unit tests): what the codecs
 * share. codec.h is the module's header for everything above it.
 *
 * The files of compress/, lowest first, each calling only files below it:
 *   codec_base.c  status and messages, element conversions, little-endian rows, the parameter
 *                 rules (kv_codec_validate_config), planning and writing a section header, the
 *                 decoding context's stream setting, keep counts and bitmaps
 *   lossless.c, quant.c, drop.c, quality.c
 *                 the codecs (raw, zstd-planes; kivi; drop; drop uses quant.c's KIVI groups)
 *                 and the quality proxy
 *   codec.c       the registry (the kv_codec entries), parsing a section header, and the
 *                 decode entry points that dispatch on the stored codec id
 */
#ifndef KV_CODEC_INT_H
#define KV_CODEC_INT_H

#include "codec.h"

#include <string.h>

static inline void kv_codec_put_le16(uint8_t *p, uint16_t v)
{
  p[0] = (uint8_t)v;
  p[1] = (uint8_t)(v >> 8);
}
static inline void kv_codec_put_le32(uint8_t *p, uint32_t v)
{
  p[0] = (uint8_t)v;
  p[1] = (uint8_t)(v >> 8);
  p[2] = (uint8_t)(v >> 16);
  p[3] = (uint8_t)(v >> 24);
}
static inline uint16_t kv_codec_get_le16(const uint8_t *p)
{
  return (uint16_t)(p[0] | (p[1] << 8));
}
static inline uint32_t kv_codec_get_le32(const uint8_t *p)
{
  return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}

/*
 * Branch-free element conversions for hot loops (selects instead of branches, so loops over
 * them vectorize). kv_codec_f16_rne: f32 -> f16 rounding to nearest even, exact for every
 * non-NaN input (NaN -> inf here; the public kv_codec_f32_to_f16 keeps NaNs). Identical to
 * F16C vcvtps2ph for non-NaN inputs: the subnormal case rounds through a float add of 0.5.
 */
static inline uint16_t kv_codec_f16_rne(float f)
{
  uint32_t x, tb;
  float t;
  memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000u;
  x &= 0x7fffffffu;
  uint32_t normal = (x - (112u << 23) + 0xfffu + ((x >> 13) & 1u)) >> 13; /* rebias, round */
  memcpy(&t, &x, 4);
  t += 0.5f; /* below 2^-14: the add rounds onto the f16 subnormal grid */
  memcpy(&tb, &t, 4);
  uint32_t is_sub = 0u - (uint32_t)(x < 0x38800000u); /* all ones or zero: no branches */
  uint32_t is_big = 0u - (uint32_t)(x >= 0x47800000u);
  uint32_t o = ((tb - 0x3f000000u) & is_sub) | (normal & ~is_sub);
  o = (0x7c00u & is_big) | (o & ~is_big);
  return (uint16_t)(o | sign);
}
static inline uint16_t kv_codec_bf16_rne(float f) /* finite or infinite inputs */
{
  uint32_t x;
  memcpy(&x, &f, 4);
  return (uint16_t)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}
static inline float kv_codec_f16_widen(uint16_t h) /* exact, NaN payloads kept */
{
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16, em = h & 0x7fffu, sb, o;
  float sub = (float)em * 0x1p-24f, r;
  memcpy(&sb, &sub, 4);
  o = em >= 0x7c00u ? (0x7f800000u | ((em & 0x3ffu) << 13)) : (em << 13) + (112u << 23);
  o = em < 0x0400u ? sb : o;
  o |= sign;
  memcpy(&r, &o, 4);
  return r;
}

/* Record an error (file:line of the check) and return its code. */
kv_codec_status kv_codec_fail_at(kv_codec_err *err, kv_codec_status code, const char *what,
                                 uint64_t value, uint64_t limit, const char *file, int line);
#define KV_CODEC_FAIL(err, code, what, value, limit)                                              \
  kv_codec_fail_at((err), (code), (what), (uint64_t)(value), (uint64_t)(limit), __FILE__, __LINE__)

/* 64-byte aligned start of a caller scratch buffer; *cap shrinks to what is left. */
void *kv_codec_scratch_align(void *scratch, size_t *cap);
#define KV_CODEC_SCRATCH_SLACK 64

/*
 * The rules every section obeys, with parameters already resolved (no "0 = default" left).
 * `code` is what a violation returns: EINVAL when encoding (kv_codec_plan()), ECORRUPT when
 * parsing (kv_section_parse()).
 */
kv_codec_status kv_codec_validate_config(uint8_t id, const kv_section_shape *s, uint32_t n_rows,
                                         const kv_codec_params *p, kv_codec_status code,
                                         kv_codec_err *err);
/*
 * Validate shape + params for encoding with codec `id` and describe the section to be
 * written: defaults resolved, n_rows, n_groups, header_bytes (section_bytes left 0).
 */
kv_codec_status kv_codec_plan(uint8_t id, const kv_section_shape *shape, const kv_codec_params *p,
                              kv_section_info *info, kv_codec_err *err);
/* Write the fixed header and the keep bitmap (drop) of a planned section; the group table is
 * the codec's to fill. dst holds info->header_bytes. */
void kv_codec_write_header(const kv_section_info *info, const uint32_t *keep_pos, uint8_t *dst);
/*
 * The codecs' decoders behind a header kv_section_parse() accepted (info) and arguments
 * kv_codec_decode_check() accepted: payload holds exactly groups [g0, g1), dst their rows.
 * They check only the scratch (ENOMEM) and what the payload bytes themselves say (ECORRUPT).
 * ctx may be NULL. codec.c's kv_codec_decode_parsed() dispatches to them on info->codec_id.
 */
kv_codec_status kv_raw_decode_parsed(const kv_section_info *info, const uint8_t *payload,
                                     uint32_t g0, uint32_t g1, void *dst);
kv_codec_status kv_zp_decode_parsed(const kv_section_info *info, const uint8_t *hdr,
                                    const uint8_t *payload, uint32_t g0, uint32_t g1,
                                    void *scratch, size_t scratch_cap, void *dst,
                                    kv_codec_dctx *ctx, kv_codec_err *err);
kv_codec_status kv_kivi_decode_parsed(const kv_section_info *info, const uint8_t *payload,
                                      uint32_t g0, uint32_t g1, void *scratch, size_t scratch_cap,
                                      void *dst, kv_codec_dctx *ctx, kv_codec_err *err);
/* kivi and kvquant: the same decode with row r of the groups written at dst + r * rowb (rowb
 * >= the row's bytes: kv_section_decode_rows_dctx's strided output). */
kv_codec_status kv_kivi_decode_strided(const kv_section_info *info, const uint8_t *payload,
                                       uint32_t g0, uint32_t g1, void *scratch,
                                       size_t scratch_cap, void *dst, size_t rowb,
                                       kv_codec_dctx *ctx, kv_codec_err *err);
kv_codec_status kv_drop_decode_parsed(const kv_section_info *info, const uint8_t *payload,
                                      uint32_t g0, uint32_t g1, void *scratch, size_t scratch_cap,
                                      void *dst, kv_codec_dctx *ctx, kv_codec_err *err);
/* A decoding context (codec.h "DECODING CONTEXT"): made by kv_codec_dctx_init() (lossless.c,
 * whose zstd-planes decoder uses zd); the stream setting is read by every decoder. */
#define KV_DCTX_MAGIC 0x6b7664637478314full /* "kvdctx1O" */

/*
 * kvquant's pre-RoPE K decode keeps the angles of the page groups it decodes in the context
 * (quant.c rope_table): per (RoPE base, style, head_dim, first position) the cos and sin of
 * every row of a group, computed once and reused by every layer and head at that position
 * (libm's pow/sincos per group cost more than decoding a group of 256 rows of head_dim 8).
 * KV_DCTX_ROPE_FLOATS floats (256 KiB) after the zstd context, up to KV_DCTX_ROPE_TABS tables;
 * when full, the tables are dropped and refilled.
 */
#define KV_DCTX_ROPE_FLOATS (64u * 1024u)
#define KV_DCTX_ROPE_TABS 16u
typedef struct kv_rope_tab {
  uint32_t base_bits, style, d, pos, rows; /* what the table is of; rows: at least this many */
  uint32_t off;                            /* its first float in rope[] */
} kv_rope_tab;

struct kv_codec_dctx {
  uint64_t magic;
  struct ZSTD_DCtx_s *zd; /* static, in the memory right after this struct (64-aligned) */
  int stream;    /* kv_codec_dctx_set_stream() */
  float *rope;   /* KV_DCTX_ROPE_FLOATS floats after the zstd context (32-byte aligned) */
  uint32_t rope_n, rope_used; /* tables in rope_tab, floats of rope[] they use */
  kv_rope_tab rope_tab[KV_DCTX_ROPE_TABS];
};

/* The stream setting of a context (0 for NULL or an uninitialized one). */
int kv_codec_dctx_stream(const kv_codec_dctx *ctx);
/* Whether a decode call writing out_bytes streams: the context asks for it and the call is
 * large enough to pay for its closing store fence (measured: 8 KiB calls got slower). */
#define KV_CODEC_STREAM_MIN_BYTES (64u << 10)
int kv_codec_stream_call(const kv_codec_dctx *ctx, size_t out_bytes);
/* Common checks of encode arguments (shape, src_len, pointers). */
kv_codec_status kv_codec_encode_args(const kv_section_shape *shape, const void *src,
                                     size_t src_len, const void *dst, size_t *out_len,
                                     kv_codec_err *err);

/* Bytes between a section's fixed header and its group table: the drop codec's keep bitmap, or
 * kvquant's RoPE extension (flags bit 1: f32 rope_base, u32 rope_pos0). */
#define KV_SECTION_ROPE_EXT 8
static inline size_t kv_section_ext_bytes(uint8_t id, uint8_t flags, uint32_t n_tokens)
{
  if (id == KV_CODEC_ID_DROP)
    return ((size_t)n_tokens + 7) / 8;
  return id == KV_CODEC_ID_KVQUANT && (flags & 2u) ? KV_SECTION_ROPE_EXT : 0;
}
static inline uint8_t kv_section_flags(const kv_section_info *info)
{
  const kv_codec_params *p = &info->params;
  return (uint8_t)((info->shape.kind == KV_SECTION_V ? 1u : 0u) | (p->rope_base != 0 ? 2u : 0u) |
                   (p->rope_style == KV_ROPE_HALF ? 4u : 0u) | (p->alloc ? 8u : 0u));
}

/* Rows of group g and its first row. */
static inline uint32_t kv_codec_group_rows(const kv_section_info *info, uint32_t g)
{
  uint32_t first = g * info->params.page_tokens;
  uint32_t left = info->n_rows - first;
  return left < info->params.page_tokens ? left : info->params.page_tokens;
}

/* Dot product of float rows (drop.c scoring, quality.c logits). */
double kv_codec_dot_f32(const float *a, const float *b, uint32_t d);

/* Elements in host order <-> little-endian bytes. */
void kv_codec_store_le(kv_codec_dtype dtype, const void *src, size_t n, uint8_t *dst);
void kv_codec_load_le(kv_codec_dtype dtype, const uint8_t *src, size_t n, void *dst);

/* lossless.c — byte planes (plane p = byte p of each element of es bytes, host order), shared
 * with frames.c's multi-section frames. */
void kv_planes_split(const uint8_t *src, size_t n, size_t es, unsigned p, uint8_t *out);
void kv_planes_join2(const uint8_t *p0, const uint8_t *p1, size_t n, uint8_t *dst);
void kv_planes_join4(const uint8_t *p0, const uint8_t *p1, const uint8_t *p2, const uint8_t *p3,
                     size_t n, uint8_t *dst);
/* frames.c — the exponent-pairs join's instruction set from now on: the widest this CPU runs
 * of at most lim (0 portable, 1 AVX2, 2 AVX-512BW/VL); returns the one chosen (tests). */
int kv_frames_simd_limit(int lim);
/* This thread's zstd compression context (made at its first use, freed at thread exit), or
 * NULL when it cannot be made. */
struct ZSTD_CCtx_s *kv_lossless_thread_cctx(void);

/* quant.c — KIVI page groups, shared by the kivi and drop codecs. Rows are the rows of the
 * section being written (row_map maps them to rows of src; NULL = identity). */
size_t kv_quant_group_bytes(const kv_section_info *info, uint32_t g);
size_t kv_quant_scratch_bytes(uint32_t head_dim); /* includes KV_CODEC_SCRATCH_SLACK */
kv_codec_status kv_quant_encode_group(const kv_section_info *info, uint32_t g, const void *src,
                                      const uint32_t *row_map, void *ws, uint8_t *dst,
                                      kv_codec_err *err);
/* simd: 1 = AVX2/F16C/FMA kernels when the CPU has them, 2 = the same with streaming stores
 * (when dst and every row are 16-byte aligned; ordinary stores otherwise; the caller ends its
 * run of groups with kv_quant_stream_fence()), 0 = portable code; the same bits every way. */
void kv_quant_decode_group(const kv_section_info *info, uint32_t g, const uint8_t *src, void *ws,
                           void *dst, int simd);
/* The same through a decoding context (may be NULL): pre-RoPE K on the AVX2 path then
 * dequantizes and rotates each row in one pass, with its angles from the context's tables. */
void kv_quant_decode_group_ctx(kv_codec_dctx *ctx, const kv_section_info *info, uint32_t g,
                               const uint8_t *src, void *ws, void *dst, int simd);
/* The same with the output's rows rowb bytes apart (rowb >= the row's bytes; streaming stores
 * only when rowb is a multiple of 16 too). */
void kv_quant_decode_group_strided(kv_codec_dctx *ctx, const kv_section_info *info, uint32_t g,
                                   const uint8_t *src, void *ws, void *dst, size_t rowb, int simd);
void kv_quant_stream_fence(void); /* sfence on x86, nothing elsewhere */
int kv_quant_simd_available(void);
/* The AVX-512 per-channel kernel (f16 rows, head_dim % 16 == 0, 2/4/8 bits) from now on:
 * enable 1 when the CPU has AVX-512 F/BW/VL (and AVX2), 0 never (tests, benches: the AVX2
 * kernel), -1 as the CPU allows (the default). Returns whether it is used. */
int kv_quant_avx512(int enable);
/* kvquant with per-channel widths (flags bit 3): checks the widths of groups [g0, g1) of a
 * parsed section, payload = their bytes (lengths already checked); OK for other sections. */
kv_codec_status kv_quant_alloc_check(const kv_section_info *info, const uint8_t *payload,
                                     uint32_t g0, uint32_t g1, kv_codec_err *err);
/* kvquant's encode scratch: kv_quant_scratch_bytes() plus a page group's rows as floats. */
size_t kv_kvq_scratch_bytes(uint32_t head_dim, uint32_t page_tokens);
size_t kv_codec_kvq_bound(const kv_section_shape *shape, const kv_codec_params *p);
size_t kv_codec_kvq_scratch_bytes(const kv_section_shape *shape, const kv_codec_params *p,
                                  kv_codec_op op);
kv_codec_status kv_codec_kvq_encode(const kv_section_shape *shape, const void *src, size_t src_len,
                                    const kv_codec_params *p, void *scratch, size_t scratch_cap,
                                    void *dst, size_t dst_cap, size_t *out_len, kv_codec_err *err);
kv_codec_status kv_quant_check(const kv_section_info *info, const uint8_t *hdr,
                               kv_codec_err *err);

/* Set bits among the first n_tokens bits of a keep bitmap (codec_base.c). */
uint32_t kv_drop_bitmap_count(const uint8_t *bitmap, uint32_t n_tokens);

/*
 * The codecs' members (lossless.c: raw, zstd-planes; quant.c: kivi; drop.c: drop); codec.c
 * makes them the kv_codec entries below, with decode members that parse the header through
 * kv_section_parse() and then call the *_decode_parsed function above.
 */
size_t kv_codec_raw_bound(const kv_section_shape *shape, const kv_codec_params *p);
size_t kv_codec_raw_scratch_bytes(const kv_section_shape *shape, const kv_codec_params *p,
                                  kv_codec_op op);
kv_codec_status kv_codec_raw_encode(const kv_section_shape *shape, const void *src, size_t src_len,
                                    const kv_codec_params *p, void *scratch, size_t scratch_cap,
                                    void *dst, size_t dst_cap, size_t *out_len, kv_codec_err *err);
kv_codec_status kv_codec_raw_check(const kv_section_info *info, const uint8_t *hdr,
                                   kv_codec_err *err);
size_t kv_codec_zp_bound(const kv_section_shape *shape, const kv_codec_params *p);
size_t kv_codec_zp_scratch_bytes(const kv_section_shape *shape, const kv_codec_params *p,
                                 kv_codec_op op);
kv_codec_status kv_codec_zp_encode(const kv_section_shape *shape, const void *src, size_t src_len,
                                   const kv_codec_params *p, void *scratch, size_t scratch_cap,
                                   void *dst, size_t dst_cap, size_t *out_len, kv_codec_err *err);
kv_codec_status kv_codec_zp_check(const kv_section_info *info, const uint8_t *hdr,
                                  kv_codec_err *err);
size_t kv_codec_kivi_bound(const kv_section_shape *shape, const kv_codec_params *p);
size_t kv_codec_kivi_scratch_bytes(const kv_section_shape *shape, const kv_codec_params *p,
                                   kv_codec_op op);
kv_codec_status kv_codec_kivi_encode(const kv_section_shape *shape, const void *src, size_t src_len,
                                     const kv_codec_params *p, void *scratch, size_t scratch_cap,
                                     void *dst, size_t dst_cap, size_t *out_len, kv_codec_err *err);
size_t kv_codec_drop_bound(const kv_section_shape *shape, const kv_codec_params *p);
size_t kv_codec_drop_scratch_bytes(const kv_section_shape *shape, const kv_codec_params *p,
                                   kv_codec_op op);
kv_codec_status kv_codec_drop_encode(const kv_section_shape *shape, const void *src, size_t src_len,
                                     const kv_codec_params *p, void *scratch, size_t scratch_cap,
                                     void *dst, size_t dst_cap, size_t *out_len, kv_codec_err *err);
kv_codec_status kv_codec_drop_check(const kv_section_info *info, const uint8_t *hdr,
                                    kv_codec_err *err);

/* The registry's entries (codec.c). */
extern const kv_codec kv_codec_raw;
extern const kv_codec kv_codec_zstd_planes;
extern const kv_codec kv_codec_kivi;
extern const kv_codec kv_codec_drop;
extern const kv_codec kv_codec_kvquant;

#endif /* KV_CODEC_INT_H */
