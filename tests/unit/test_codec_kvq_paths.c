/* SPDX-License-Identifier: MIT */
/*
 * tests/unit/test_codec_kvq_paths.c — kvquant's decoders give the same bits every way (issue 16,
 * decode speed): the portable loops (simd 0), the AVX2 kernels with the separate RoPE pass (no
 * decoding context), the fused AVX2 kernel that dequantizes and rotates each pre-RoPE key row
 * in one pass with its angles from the context's table (quant.c rope_table), the same with
 * streaming stores, and a second decode that finds its table cached. On synthetic keys
 * (kvgen: outlier channels) across head dims, bits, sink and residual rows and first positions;
 * on large values, where the kernels that skip the fp16-range clamp must not be chosen; on
 * enough positions to refill the context's tables; and on real keys: a llama2.c model's K
 * after RoPE (tests/unit/tinymodel.h, random weights, head_dim 8 like stories260K).
 * Without AVX2 the SIMD paths are the portable one and the test still checks the decoders.
 */
#define _GNU_SOURCE /* mkstemp */
#include "codec_int.h"
#include "kvgen.h"
#include "refmodel.h"
#include "tinymodel.h"

#include <unistd.h>

static kv_codec_dctx *g_ctx;
static int g_fused; /* decodes that took the fused path (a table was in the context) */
static int g_alloc; /* encode with per-channel widths (params.alloc), bits below 8 */
static const float *g_weight; /* and these channel weights (K) */

/* Decode every group of enc with simd / ctx into out (len bytes). */
static void decode_groups(const uint8_t *enc, size_t enc_len, const kv_section_info *info,
                          kv_codec_dctx *ctx, int simd, uint8_t *out)
{
  size_t rowb = (size_t)info->shape.head_dim * kv_codec_dtype_bytes(info->shape.dtype);
  float *ws = kt_xmalloc(kv_quant_scratch_bytes(info->shape.head_dim));
  kv_codec_err e = {0};
  for (uint32_t g = 0; g < info->n_groups; g++) {
    uint64_t off, glen;
    CHECK_OK(e, kv_section_group_span(enc, enc_len, g, g + 1, &off, &glen, &e));
    kv_quant_decode_group_ctx(ctx, info, g, enc + off, ws, out + (size_t)g * info->params.page_tokens * rowb,
                              simd);
  }
  kv_quant_stream_fence();
  free(ws);
}

/*
 * kv_section_decode_rows_dctx (issue 16: a get decodes straight into the caller's layout): the
 * first n_rows rows at a stride equal the contiguous decode `want` (all rows), and the bytes
 * between rows and after the last are untouched. n_rows: every row, all but one, one group,
 * one group and 3 rows (a cut group), one row, none; strides: the row, the row + 2 (odd
 * addresses: ordinary stores), 2 rows + 16 (16-byte steps: streaming stores through a
 * context that asks for them).
 */
static void check_strided(const uint8_t *enc, size_t el, const kv_section_info *info,
                          const uint8_t *want, kv_codec_dctx *ctx)
{
  size_t rowb = (size_t)info->shape.head_dim * kv_codec_dtype_bytes(info->shape.dtype);
  uint32_t n = info->n_rows, pt = info->params.page_tokens;
  uint32_t counts[] = {n, n - 1, pt < n ? pt : n, pt + 3 < n ? pt + 3 : n, 1, 0};
  size_t strides[] = {rowb, rowb + 2, 2 * rowb + 16};
  for (int si = 0; si < 3; si++)
    for (int ci = 0; ci < 6; ci++)
      for (int stream = 0; stream < 2; stream++) {
        uint32_t nr = counts[ci];
        size_t stride = strides[si], cap = (size_t)n * stride + 64;
        uint8_t *out = aligned_alloc(64, (cap + 63) / 64 * 64);
        CHECK(out != NULL);
        memset(out, 0xA5, cap);
        size_t scr = kv_section_rows_scratch_bytes(info, nr);
        CHECK(scr > 0);
        void *ws = kt_xmalloc(scr);
        kv_codec_err e = {0};
        kv_codec_dctx_set_stream(ctx, stream);
        CHECK_OK(e, kv_section_decode_rows_dctx(stream ? ctx : NULL, enc, el, nr, ws, scr, out,
                                                stride, NULL, &e));
        kv_codec_dctx_set_stream(ctx, 0);
        for (uint32_t r = 0; r < nr; r++)
          CHECK(memcmp(out + (size_t)r * stride, want + (size_t)r * rowb, rowb) == 0);
        for (size_t i = 0; i < cap; i++) { /* the gaps and the rest: not written */
          size_t r = i / stride;
          if (r < nr && i % stride < rowb)
            continue;
          CHECK(out[i] == 0xA5);
        }
        if (nr > 0 && scr > 1) /* a scratch one byte short is refused */
          CHECK(kv_section_decode_rows_dctx(NULL, enc, el, nr, ws, scr - 1, out, stride, NULL,
                                            &e) == KV_CODEC_ENOMEM);
        free(ws);
        free(out);
      }
}

/* Encode the f16 section src (n x d) as kvquant and check every decoder gives the same bytes. */
static void same_every_way(kv_section_kind kind, const uint16_t *src, uint32_t n, uint32_t d,
                           unsigned bits, uint32_t pos0, uint32_t sink, uint32_t residual,
                           uint32_t page_tokens)
{
  kv_section_shape s = {KV_CODEC_F16, kind, n, d};
  kv_codec_params p;
  kv_codec_params_init(&p);
  p.bits = bits;
  p.residual = residual;
  p.sink = sink;
  p.group = page_tokens >= 128 ? 128 : page_tokens;
  p.page_tokens = page_tokens;
  if (g_alloc && bits < 8) {
    p.alloc = 1;
    p.chan_weight = kind == KV_SECTION_K ? g_weight : NULL;
  }
  if (kind == KV_SECTION_K) {
    p.rope_base = 10000.0f;
    p.rope_style = KV_ROPE_ADJACENT;
    p.rope_pos0 = pos0;
  }
  size_t len = (size_t)n * d * 2, el;
  uint8_t *enc = kt_encode(KV_CODEC_ID_KVQUANT, &s, src, len, &p, &el);
  kv_section_info info;
  kv_codec_err e = {0};
  CHECK_OK(e, kv_section_parse(enc, el, &info, &e));
  CHECK(info.params.alloc == p.alloc);
  uint8_t *port = kt_xmalloc(len), *two = kt_xmalloc(len), *fused = kt_xmalloc(len);
  uint8_t *again = kt_xmalloc(len), *whole = kt_xmalloc(len), *avx2 = kt_xmalloc(len);
  uint8_t *st = aligned_alloc(64, (len + 64) / 64 * 64); /* streaming stores */
  CHECK(st != NULL);
  decode_groups(enc, el, &info, NULL, 0, port);
  decode_groups(enc, el, &info, NULL, 1, two);
  kv_quant_avx512(0); /* the AVX2 kernels alone (the AVX-512 one where the CPU has it above) */
  decode_groups(enc, el, &info, NULL, 1, avx2);
  kv_quant_avx512(-1);
  uint32_t tabs = g_ctx->rope_n, used = g_ctx->rope_used;
  decode_groups(enc, el, &info, g_ctx, 1, fused);
  if (g_ctx->rope_n != tabs || g_ctx->rope_used != used)
    g_fused++; /* it built a table: the fused kernel ran */
  decode_groups(enc, el, &info, g_ctx, 1, again); /* the tables found in the context */
  decode_groups(enc, el, &info, g_ctx, 2, st);
  /* and through the public call (kv_section_decode_dctx) */
  size_t scr = kv_section_scratch_bytes(&info);
  void *ws = kt_xmalloc(scr);
  CHECK_OK(e, kv_section_decode_dctx(g_ctx, enc, el, ws, scr, whole, len, NULL, &e));
  if (memcmp(port, two, len) != 0) { size_t i = 0; while (port[i] == two[i]) i++; fprintf(stderr, "DIFF kind %d n %u d %u bits %u alloc %u sink %u res %u page %u at byte %zu row %zu\n", (int)kind, n, d, bits, p.alloc, sink, residual, page_tokens, i, i / (2 * d)); }
  CHECK(memcmp(port, two, len) == 0);
  CHECK(memcmp(port, avx2, len) == 0);
  CHECK(memcmp(port, fused, len) == 0);
  CHECK(memcmp(port, again, len) == 0);
  CHECK(memcmp(port, st, len) == 0);
  CHECK(memcmp(port, whole, len) == 0);
  check_strided(enc, el, &info, port, g_ctx);
  for (size_t i = 0; i < len / 2; i++) { /* finite, like the encoder's input */
    uint16_t h = kv_codec_get_le16(port + 2 * i);
    CHECK((h & 0x7c00u) != 0x7c00u);
  }
  free(ws);
  free(port);
  free(two);
  free(fused);
  free(again);
  free(whole);
  free(avx2);
  free(st);
  free(enc);
}

TEST(synthetic_keys_and_values)
{
  static const uint32_t dims[] = {8, 16, 24, 64, 128};
  static const unsigned bitss[] = {2, 4, 8};
  for (size_t di = 0; di < sizeof dims / sizeof dims[0]; di++)
    for (size_t bi = 0; bi < 3; bi++)
      for (int kind = 0; kind < 2; kind++) {
        uint32_t d = dims[di], n = 300 + (uint32_t)di * 37;
        size_t len;
        uint16_t *src =
          kvgen_section(KV_CODEC_F16, (kv_section_kind)kind, 100 + di * 10 + bi, n, d, &len);
        same_every_way((kv_section_kind)kind, src, n, d, bitss[bi], (uint32_t)(di * 1000 + bi),
                       bi == 1 ? 4 : 0, 8 + (uint32_t)bi * 5, 128);
        same_every_way((kv_section_kind)kind, src, n, d, bitss[bi], 7, 0, 0, 256);
        free(src);
      }
}

/* Per-channel widths (flags bit 3): every mean width 1..7, head dims with a short last block
 * (12, 13: odd, 24) and whole ones, K (pre-RoPE, with and without channel weights) and V. */
TEST(alloc_keys_and_values)
{
  static const uint32_t dims[] = {8, 12, 13, 24, 64};
  float w[64];
  for (int j = 0; j < 64; j++)
    w[j] = (float)(1 + (j * 7) % 5); /* uneven sensitivities */
  g_alloc = 1;
  for (size_t di = 0; di < sizeof dims / sizeof dims[0]; di++)
    for (unsigned bits = 1; bits <= 7; bits++)
      for (int kind = 0; kind < 2; kind++) {
        uint32_t d = dims[di], n = 260 + (uint32_t)di * 29;
        size_t len;
        uint16_t *src = kvgen_section(KV_CODEC_F16, (kv_section_kind)kind, 300 + di * 10 + bits,
                                      n, d, &len);
        if (d % 2 != 0 && kind == KV_SECTION_K)
          kind = KV_SECTION_V; /* RoPE needs an even head_dim: these are V sections */
        g_weight = bits % 2 ? w : NULL;
        same_every_way((kv_section_kind)kind, src, n, d, bits, (uint32_t)(di * 500 + bits),
                       bits == 3 ? 4 : 0, bits % 3 == 0 ? 0 : 8, bits == 5 ? 256 : 128);
        free(src);
      }
  g_alloc = 0;
  g_weight = NULL;
}

/* The strided decode of kivi and raw sections (K and V, f16 and f32), and what it refuses:
 * a codec that decodes contiguous rows only, more rows than the section, a stride below a
 * row. */
TEST(strided_kivi_raw_and_refusals)
{
  static const unsigned ids[] = {KV_CODEC_ID_KIVI, KV_CODEC_ID_RAW};
  for (int ii = 0; ii < 2; ii++)
    for (int kind = 0; kind < 2; kind++)
      for (int dti = 0; dti < 2; dti++) {
        kv_codec_dtype dt = dti ? KV_CODEC_F32 : KV_CODEC_F16;
        uint32_t n = 200, d = 40;
        size_t len;
        void *src = kvgen_section(dt, (kv_section_kind)kind, 7 + (unsigned)(ii * 4 + kind * 2 + dti),
                                  n, d, &len);
        kv_section_shape s = {dt, (kv_section_kind)kind, n, d};
        kv_codec_params p;
        kv_codec_params_init(&p);
        if (ids[ii] == KV_CODEC_ID_KIVI) {
          p.bits = 4;
          p.group = kind == KV_SECTION_K ? 32 : 8;
          p.residual = 12; /* raw rows at the end */
          p.page_tokens = 64;
        }
        size_t el;
        uint8_t *enc = kt_encode(ids[ii], &s, src, len, &p, &el);
        kv_section_info info;
        kv_codec_err e = {0};
        CHECK_OK(e, kv_section_parse(enc, el, &info, &e));
        size_t scr = kv_section_scratch_bytes(&info);
        uint8_t *want = kt_xmalloc(len);
        void *ws = kt_xmalloc(scr ? scr : 1);
        CHECK_OK(e, kv_section_decode_dctx(NULL, enc, el, ws, scr, want, len, NULL, &e));
        check_strided(enc, el, &info, want, g_ctx);
        free(ws);
        free(want);
        free(enc);
        free(src);
      }
  /* refusals */
  uint32_t n = 64, d = 16;
  size_t len, el;
  void *src = kvgen_section(KV_CODEC_F16, KV_SECTION_K, 3, n, d, &len);
  kv_section_shape s = {KV_CODEC_F16, KV_SECTION_K, n, d};
  kv_codec_params p;
  kv_codec_params_init(&p);
  uint8_t *enc = kt_encode(KV_CODEC_ID_ZSTD_PLANES, &s, src, len, &p, &el);
  uint8_t *out = kt_xmalloc(4 * len), ws[1 << 16];
  kv_codec_err e = {0};
  CHECK(!kv_section_decodes_strided(KV_CODEC_ID_ZSTD_PLANES));
  CHECK(!kv_section_decodes_strided(KV_CODEC_ID_DROP));
  CHECK(kv_section_decode_rows_dctx(NULL, enc, el, n, ws, sizeof ws, out, 64, NULL, &e) ==
        KV_CODEC_EINVAL);
  free(enc);
  p.bits = 4;
  enc = kt_encode(KV_CODEC_ID_KVQUANT, &s, src, len, &p, &el);
  CHECK(kv_section_decode_rows_dctx(NULL, enc, el, n + 1, ws, sizeof ws, out, 64, NULL, &e) ==
        KV_CODEC_EINVAL);
  CHECK(kv_section_decode_rows_dctx(NULL, enc, el, n, ws, sizeof ws, out, 2 * d - 1, NULL, &e) ==
        KV_CODEC_EINVAL);
  CHECK(kv_section_decode_rows_dctx(NULL, enc, el - 1, n, ws, sizeof ws, out, 64, NULL, &e) ==
        KV_CODEC_ECORRUPT);
  CHECK_OK(e, kv_section_decode_rows_dctx(NULL, enc, el, n, ws, sizeof ws, out, 64, NULL, &e));
  free(out);
  free(enc);
  free(src);
}

/* Values near the fp16 limit: code * scale + zero may leave +-65504, and the kernels that
 * skip the clamp must not run; every decoder still clamps the same way. */
TEST(large_values)
{
  uint32_t n = 256, d = 8;
  float *f = kt_xmalloc(sizeof(float) * n * d);
  uint16_t *h = kt_xmalloc(2 * (size_t)n * d);
  for (int kind = 0; kind < 2; kind++)
    for (unsigned bits = 2; bits <= 8; bits *= 2) {
      kvgen_gauss(5 + bits + (unsigned)kind, (size_t)n * d, 1.0f, f);
      for (uint32_t r = 0; r < n; r++)
        for (uint32_t j = 0; j < d; j++) {
          float *x = &f[(size_t)r * d + j];
          if (j < 2) /* one pair at the edge of the range: its norm stays below 65504 */
            *x = (r % 2 ? 46000.0f : -46000.0f) * (j ? 1 : -1);
          else if (kind == KV_SECTION_V && j == 2)
            *x = r % 3 ? 65504.0f : -65504.0f;
        }
      kv_codec_from_f32(KV_CODEC_F16, f, (size_t)n * d, h);
      same_every_way((kv_section_kind)kind, h, n, d, bits, 0, 0, 8, 128);
      g_alloc = 1; /* and with per-channel widths (8 bits: uniform still) */
      same_every_way((kv_section_kind)kind, h, n, d, bits == 8 ? 5 : bits, 0, 0, 8, 128);
      g_alloc = 0;
    }
  free(f);
  free(h);
}

/* More positions than the context holds tables: they are dropped and rebuilt, same bits. */
TEST(tables_refilled)
{
  uint32_t n = 256, d = 64;
  size_t len;
  uint16_t *src = kvgen_section(KV_CODEC_F16, KV_SECTION_K, 9, n, d, &len);
  for (uint32_t i = 0; i < 3 * KV_DCTX_ROPE_TABS; i++)
    same_every_way(KV_SECTION_K, src, n, d, 4, i * 256, 0, 8, 256);
  same_every_way(KV_SECTION_K, src, n, d, 4, 0, 0, 8, 256); /* an early position again */
  free(src);
}

/* Real keys: a llama2.c model's K after RoPE (head_dim 8), every layer and KV head. */
TEST(model_keys)
{
  char path[] = "/tmp/kvq_paths_model_XXXXXX";
  int fd = mkstemp(path);
  CHECK(fd >= 0);
  close(fd);
  CHECK(tm_write_model(path, 42) == 0);
  refmodel_model *m = NULL;
  CHECK(refmodel_model_load(path, &m) == 0);
  unlink(path);
  const refmodel_config *c = refmodel_model_config(m);
  int npos = c->seq_len;
  refmodel_state *st = NULL;
  CHECK(refmodel_state_new(m, npos, &st) == 0);
  uint64_t seed = 3;
  for (int p = 0; p < npos; p++)
    CHECK(refmodel_forward(st, 3 + (int)(tm_rand(&seed) % 300), p, NULL) == 0);
  int hs = c->dim / c->n_heads, kvd = c->n_kv_heads * hs;
  uint16_t *k = kt_xmalloc(2 * (size_t)npos * hs), *v = kt_xmalloc(2 * (size_t)npos * hs);
  for (int l = 0; l < c->n_layers; l++)
    for (int kh = 0; kh < c->n_kv_heads; kh++) {
      for (int p = 0; p < npos; p++) {
        const float *kr = refmodel_state_key(st, l, 0) + (size_t)p * kvd + (size_t)kh * hs;
        const float *vr = refmodel_state_value(st, l, 0) + (size_t)p * kvd + (size_t)kh * hs;
        kv_codec_from_f32(KV_CODEC_F16, kr, (size_t)hs, k + (size_t)p * hs);
        kv_codec_from_f32(KV_CODEC_F16, vr, (size_t)hs, v + (size_t)p * hs);
      }
      for (unsigned bits = 2; bits <= 8; bits *= 2) {
        same_every_way(KV_SECTION_K, k, (uint32_t)npos, (uint32_t)hs, bits, 0, 0, 8, 64);
        same_every_way(KV_SECTION_V, v, (uint32_t)npos, (uint32_t)hs, bits, 0, 0, 8, 64);
      }
      g_alloc = 1;
      for (unsigned bits = 3; bits <= 5; bits++) {
        same_every_way(KV_SECTION_K, k, (uint32_t)npos, (uint32_t)hs, bits, 0, 0, 0, 64);
        same_every_way(KV_SECTION_V, v, (uint32_t)npos, (uint32_t)hs, bits, 0, 0, 0, 64);
      }
      g_alloc = 0;
    }
  free(k);
  free(v);
  refmodel_state_free(st);
  refmodel_model_free(m);
}

int main(void)
{
  size_t cb = kv_codec_dctx_bytes();
  void *mem = kt_xmalloc(cb);
  g_ctx = kv_codec_dctx_init(mem, cb);
  CHECK(g_ctx != NULL);
  RUN(synthetic_keys_and_values);
  RUN(alloc_keys_and_values);
  RUN(large_values);
  RUN(strided_kivi_raw_and_refusals);
  RUN(tables_refilled);
  RUN(model_keys);
  fprintf(stderr, "fused pre-RoPE decodes: %d (AVX2 %s, AVX-512 %s)\n", g_fused,
          kv_quant_simd_available() ? "yes" : "no", kv_quant_avx512(-1) ? "yes" : "no");
  if (kv_quant_simd_available())
    CHECK(g_fused > 0); /* the fused kernel was exercised */
  free(mem);
  printf("%d passed, 0 failed\n", kt_passed);
  return T_EXIT_PASS;
}
