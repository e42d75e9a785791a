/* SPDX-License-Identifier: MIT */
/*
 * tests/unit/test_codec_golden.c — encoded sections written by earlier builds must keep
 * decoding to the same bytes, and known-bad sections must keep being refused.
 *
 *   test_codec_golden DIR                 verify tests/golden/v1/codec (the meson test)
 *   test_codec_golden --write DIR         write the golden files: only when a new section
 *                                         format version is introduced, into a new vN folder;
 *                                         never rewrite a released version's files
 *   test_codec_golden --write-corpus DEC RT   write fuzz seeds for fuzz_codec_decode (DEC) and
 *                                         fuzz_codec_roundtrip (RT)
 *
 * Files per case NAME: NAME.bin (the encoded section), NAME.dec (the decoded rows, elements
 * little-endian), and for drop sections NAME.pos (kept positions, u32 little-endian).
 * reject_*.bin must fail to decode with KV_CODEC_ECORRUPT. Verification reads only the files:
 * it does not depend on the generator or the encoder, whose output may change over time.
 */
#include "codec_int.h"
#include "kvgen.h"

#include <errno.h>

typedef struct golden_case {
  const char *name;
  unsigned id;
  kv_codec_dtype dtype;
  kv_section_kind kind;
  uint32_t n, d;
  unsigned bits, group, residual, page;
  int level;
  kv_drop_method method;
  unsigned permille;
  unsigned sink, alloc; /* kvquant: 8-bit first rows; per-channel widths (flags bit 3) */
  float rope_base;      /* kvquant K: pre-RoPE (adjacent pairs, first position 3) */
} golden_case;

static const golden_case cases[] = {
  {"raw_f16_k", KV_CODEC_ID_RAW, KV_CODEC_F16, KV_SECTION_K, 40, 32, 0, 0, 0, 16, 0, 0, 0},
  {"zstd_f16_k", KV_CODEC_ID_ZSTD_PLANES, KV_CODEC_F16, KV_SECTION_K, 200, 64, 0, 0, 0, 64, 3, 0, 0},
  {"zstd_bf16_v", KV_CODEC_ID_ZSTD_PLANES, KV_CODEC_BF16, KV_SECTION_V, 100, 48, 0, 0, 0, 32, 1, 0, 0},
  {"zstd_f32_k", KV_CODEC_ID_ZSTD_PLANES, KV_CODEC_F32, KV_SECTION_K, 70, 20, 0, 0, 0, 0, 0, 0, 0},
  {"kivi8_f16_k", KV_CODEC_ID_KIVI, KV_CODEC_F16, KV_SECTION_K, 96, 64, 8, 32, 0, 0, 0, 0, 0},
  {"kivi4_f16_k_residual", KV_CODEC_ID_KIVI, KV_CODEC_F16, KV_SECTION_K, 100, 64, 4, 16, 10, 32, 0, 0, 0},
  {"kivi4_bf16_v", KV_CODEC_ID_KIVI, KV_CODEC_BF16, KV_SECTION_V, 80, 64, 4, 32, 0, 0, 0, 0, 0},
  {"kivi2_f32_v_odd", KV_CODEC_ID_KIVI, KV_CODEC_F32, KV_SECTION_V, 50, 37, 2, 7, 3, 20, 0, 0, 0},
  {"drop_knorm_raw_f16_k", KV_CODEC_ID_DROP, KV_CODEC_F16, KV_SECTION_K, 120, 32, 0, 0, 0, 0, 0, KV_DROP_KNORM, 500},
  {"drop_keydiff_q4_f16_k", KV_CODEC_ID_DROP, KV_CODEC_F16, KV_SECTION_K, 200, 64, 4, 0, 4, 0, 0, KV_DROP_KEYDIFF, 300},
  {"drop_snapkv_q8_bf16_v", KV_CODEC_ID_DROP, KV_CODEC_BF16, KV_SECTION_V, 150, 32, 8, 16, 0, 0, 0, KV_DROP_SNAPKV, 400},
  /* kvquant (codec 5, issue 16): added 2026-11-27 with the per-channel widths; the first two
   * pin the layout without them, as every earlier build wrote it */
  {"kvquant4_f16_k_rope", KV_CODEC_ID_KVQUANT, KV_CODEC_F16, KV_SECTION_K, 300, 16, 4, 64, 8, 128, 0, 0, 0, 4, 0, 10000.0f},
  {"kvquant2_bf16_v", KV_CODEC_ID_KVQUANT, KV_CODEC_BF16, KV_SECTION_V, 140, 24, 2, 64, 5, 128, 0, 0, 0, 0, 0, 0},
  {"kvquant4a_f16_k_rope_alloc", KV_CODEC_ID_KVQUANT, KV_CODEC_F16, KV_SECTION_K, 300, 24, 4, 64, 8, 128, 0, 0, 0, 4, 1, 10000.0f},
  {"kvquant5a_bf16_v_alloc_odd", KV_CODEC_ID_KVQUANT, KV_CODEC_BF16, KV_SECTION_V, 200, 13, 5, 64, 3, 128, 0, 0, 0, 0, 1, 0},
  {"kvquant3a_f32_k_alloc", KV_CODEC_ID_KVQUANT, KV_CODEC_F32, KV_SECTION_K, 150, 8, 3, 32, 0, 64, 0, 0, 0, 0, 1, 0},
};
#define N_CASES (sizeof cases / sizeof cases[0])

static const char *const rejects[] = {
  "reject_unknown_id", "reject_bad_version", "reject_truncated", "reject_trailing_byte",
  "reject_oversized_group", "reject_bitmap_count", "reject_zstd_frame", "reject_group_too_big",
  "reject_kvq_width", "reject_kvq_width_sum",
};
#define N_REJECTS (sizeof rejects / sizeof rejects[0])

/* ---- files ----------------------------------------------------------------------------------- */

static uint8_t *read_file(const char *dir, const char *name, const char *ext, size_t *len)
{
  char path[4096];
  snprintf(path, sizeof path, "%s/%s%s", dir, name, ext);
  FILE *f = fopen(path, "rb");
  if (f == NULL) {
    fprintf(stderr, "cannot open '%s': %s\n", path, strerror(errno));
    exit(T_EXIT_FAIL);
  }
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  uint8_t *b = kt_xmalloc(n > 0 ? (size_t)n : 1);
  if (n < 0 || fread(b, 1, (size_t)n, f) != (size_t)n) {
    fprintf(stderr, "cannot read '%s'\n", path);
    exit(T_EXIT_FAIL);
  }
  fclose(f);
  *len = (size_t)n;
  return b;
}

static void write_file(const char *dir, const char *name, const char *ext, const void *b,
                       size_t len)
{
  char path[4096];
  snprintf(path, sizeof path, "%s/%s%s", dir, name, ext);
  FILE *f = fopen(path, "wb");
  if (f == NULL || fwrite(b, 1, len, f) != len || fclose(f) != 0) {
    fprintf(stderr, "cannot write '%s': %s\n", path, strerror(errno));
    exit(T_EXIT_FAIL);
  }
}

/* ---- generation ------------------------------------------------------------------------------- */

typedef struct encoded {
  uint8_t *sec, *dec, *pos;
  size_t sec_len, dec_len, pos_len;
  void *src;
  size_t src_len;
} encoded;

static void encode_case(const golden_case *c, encoded *out)
{
  kv_codec_err e = {0};
  memset(out, 0, sizeof *out);
  kv_section_shape s = {c->dtype, c->kind, c->n, c->d};
  out->src = kvgen_section(c->dtype, c->kind, 1000 + c->n, c->n, c->d, &out->src_len);
  kv_codec_params p;
  kv_codec_params_init(&p);
  p.bits = c->bits;
  p.group = c->group;
  p.residual = c->residual;
  p.page_tokens = c->page;
  p.zstd_level = c->level;
  p.sink = c->sink;
  p.alloc = c->alloc;
  if (c->rope_base != 0) {
    p.rope_base = c->rope_base;
    p.rope_style = KV_ROPE_ADJACENT;
    p.rope_pos0 = 3;
  }
  uint32_t *keep = NULL, n_keep = 0;
  if (c->id == KV_CODEC_ID_DROP) {
    size_t klen;
    void *k = kvgen_section(c->dtype, KV_SECTION_K, 1000 + c->n, c->n, c->d, &klen);
    kv_section_shape ks = s;
    ks.kind = KV_SECTION_K;
    float *q = NULL;
    kv_snapkv_window w = {NULL, 8, 2, 0, KV_POOL_MAX, 1};
    if (c->method == KV_DROP_SNAPKV) {
      q = kt_xmalloc(sizeof(float) * 8 * 2 * c->d);
      kvgen_gauss(c->n, (size_t)8 * 2 * c->d, 1.0f, q);
      w.q = q;
    }
    const kv_snapkv_window *wp = c->method == KV_DROP_SNAPKV ? &w : NULL;
    size_t scr = kv_drop_scratch_bytes(c->method, c->n, c->d, wp);
    void *scratch = kt_xmalloc(scr);
    keep = kt_xmalloc(4 * (size_t)c->n);
    CHECK_OK(e, kv_drop_select(c->method, &ks, k, klen, c->permille, wp, scratch, scr, keep, c->n,
                               &n_keep, &e));
    free(scratch);
    free(q);
    free(k);
    p.keep_pos = keep;
    p.n_keep = n_keep;
    p.keep_permille = c->permille;
    p.drop_method = c->method;
    out->pos_len = 4 * (size_t)n_keep;
    out->pos = kt_xmalloc(out->pos_len);
    for (uint32_t i = 0; i < n_keep; i++)
      kv_codec_put_le32(out->pos + 4 * (size_t)i, keep[i]);
  }
  out->sec = kt_encode(c->id, &s, out->src, out->src_len, &p, &out->sec_len);
  kv_section_info info;
  void *rows = kt_decode(out->sec, out->sec_len, &info);
  out->dec_len = kv_section_rows_bytes(&info, 0, info.n_groups);
  out->dec = kt_xmalloc(out->dec_len);
  kv_codec_store_le(c->dtype, rows, out->dec_len / kv_codec_dtype_bytes(c->dtype), out->dec);
  free(rows);
  free(keep);
}

static void encoded_free(encoded *x)
{
  free(x->sec);
  free(x->dec);
  free(x->pos);
  free(x->src);
}

static const golden_case *case_named(const char *name)
{
  for (size_t i = 0; i < N_CASES; i++)
    if (strcmp(cases[i].name, name) == 0)
      return &cases[i];
  abort();
}

/* The broken sections, each made from a valid one. */
static uint8_t *make_reject(const char *name, size_t *len)
{
  encoded x;
  uint8_t *b;
  if (strcmp(name, "reject_unknown_id") == 0 || strcmp(name, "reject_bad_version") == 0 ||
      strcmp(name, "reject_zstd_frame") == 0) {
    encode_case(case_named("zstd_f16_k"), &x);
    b = kt_xmalloc(x.sec_len);
    memcpy(b, x.sec, x.sec_len);
    *len = x.sec_len;
    if (name[7] == 'u')
      b[0] = 9;
    else if (name[7] == 'b')
      b[1] = 2;
    else { /* the zstd magic of group 0's high plane */
      kv_section_info info;
      kv_codec_err e = {0};
      CHECK_OK(e, kv_section_parse(b, *len, &info, &e));
      size_t g0 = info.header_bytes;
      b[g0 + 8 + kv_codec_get_le32(b + g0)] ^= 0x5a;
    }
  } else if (strcmp(name, "reject_truncated") == 0) {
    encode_case(case_named("kivi4_f16_k_residual"), &x);
    *len = x.sec_len / 2;
    b = kt_xmalloc(*len);
    memcpy(b, x.sec, *len);
  } else if (strcmp(name, "reject_trailing_byte") == 0 ||
             strcmp(name, "reject_oversized_group") == 0) {
    encode_case(case_named("raw_f16_k"), &x);
    *len = x.sec_len + (name[7] == 't');
    b = kt_xmalloc(*len);
    memcpy(b, x.sec, x.sec_len);
    if (name[7] == 't')
      b[x.sec_len] = 0;
    else
      kv_codec_put_le32(b + KV_SECTION_FIXED_BYTES, 0xffffffffu);
  } else if (strcmp(name, "reject_bitmap_count") == 0) {
    encode_case(case_named("drop_knorm_raw_f16_k"), &x);
    b = kt_xmalloc(x.sec_len);
    memcpy(b, x.sec, x.sec_len);
    *len = x.sec_len;
    for (int t = 0; t < 8; t++) /* keep one token more than there are rows */
      if (!(b[KV_SECTION_FIXED_BYTES] & (1u << t))) {
        b[KV_SECTION_FIXED_BYTES] |= (uint8_t)(1u << t);
        break;
      }
  } else if (strncmp(name, "reject_kvq_width", 16) == 0) {
    /* kvquant with widths: channel 0 of the first quantized chunk 9 bits wide, or channels 0
     * and 1 at 8 bits each where the block's 8 channels have 32 bits (the chunk after the 4
     * sink rows' 8-bit chunk: 4d scales and zeros, then its own 4d) */
    encode_case(case_named("kvquant4a_f16_k_rope_alloc"), &x);
    b = kt_xmalloc(x.sec_len);
    memcpy(b, x.sec, x.sec_len);
    *len = x.sec_len;
    kv_section_info info;
    kv_codec_err e = {0};
    CHECK_OK(e, kv_section_parse(b, *len, &info, &e));
    uint8_t *wb = b + info.header_bytes + 8 * (size_t)info.shape.head_dim;
    if (name[16] == 0) {
      wb[0] = (uint8_t)((wb[0] & 0xf0u) | 9u);
    } else {
      wb[0] = 0x88;
      wb[1] = (uint8_t)(wb[1] | 0x11u); /* channels 2, 3 at least 1 bit: 18 of the 32 */
      wb[2] = 0x88;                     /* channels 4, 5: 34 */
    }
  } else { /* reject_group_too_big: a kivi group length one more than its layout */
    encode_case(case_named("kivi8_f16_k"), &x);
    b = kt_xmalloc(x.sec_len);
    memcpy(b, x.sec, x.sec_len);
    *len = x.sec_len;
    kv_codec_put_le32(b + KV_SECTION_FIXED_BYTES, kv_codec_get_le32(b + KV_SECTION_FIXED_BYTES) + 1);
  }
  encoded_free(&x);
  return b;
}

static int write_golden(const char *dir)
{
  for (size_t i = 0; i < N_CASES; i++) {
    encoded x;
    encode_case(&cases[i], &x);
    write_file(dir, cases[i].name, ".bin", x.sec, x.sec_len);
    write_file(dir, cases[i].name, ".dec", x.dec, x.dec_len);
    if (x.pos)
      write_file(dir, cases[i].name, ".pos", x.pos, x.pos_len);
    encoded_free(&x);
  }
  for (size_t i = 0; i < N_REJECTS; i++) {
    size_t len;
    uint8_t *b = make_reject(rejects[i], &len);
    write_file(dir, rejects[i], ".bin", b, len);
    free(b);
  }
  printf("wrote %zu golden and %zu reject sections to %s\n", N_CASES, N_REJECTS, dir);
  return T_EXIT_PASS;
}

/* Roundtrip seeds: 5 config bytes (see tests/fuzz/fuzz_codec_roundtrip.c), then elements. */
static int write_corpus(const char *dec_dir, const char *rt_dir)
{
  char name[64];
  for (size_t i = 0; i < N_CASES; i++) {
    encoded x;
    encode_case(&cases[i], &x);
    write_file(dec_dir, cases[i].name, ".bin", x.sec, x.sec_len);
    encoded_free(&x);
  }
  for (size_t i = 0; i < N_REJECTS; i++) {
    size_t len;
    uint8_t *b = make_reject(rejects[i], &len);
    write_file(dec_dir, rejects[i], ".bin", b, len);
    free(b);
  }
  static const struct {
    uint8_t cfg[5];
    uint32_t n;
  } rt[] = {
    {{0, 31, 0, 3, 0x00}, 40},  /* f16, d 32, default page, level 3, K, int8 */
    {{1, 15, 8, 1, 0x05}, 50},  /* bf16, d 16, page 8, level 1, V, int4 */
    {{2, 6, 5, 19, 0x0a}, 30},  /* f32, d 7, page 5, level 19, K, int2 */
    {{0, 63, 16, 0, 0x11}, 20}, /* f16, d 64, page 16, level default, V, int4, residual */
    {{0, 7, 0, 3, 0x60}, 200},  /* f16, d 8, kvquant widths (mean 4), K pre-RoPE */
    {{1, 12, 0, 4, 0x31}, 90},  /* bf16, d 13, kvquant widths (mean 5), V, residual */
  };
  for (size_t i = 0; i < sizeof rt / sizeof rt[0]; i++) {
    kv_codec_dtype dt = (kv_codec_dtype)(rt[i].cfg[0] % 3 + 1);
    uint32_t d = rt[i].cfg[1] % 64u + 1;
    size_t len;
    void *x = kvgen_section(dt, (rt[i].cfg[4] & 1) ? KV_SECTION_V : KV_SECTION_K, i, rt[i].n, d, &len);
    uint8_t *b = kt_xmalloc(5 + len);
    memcpy(b, rt[i].cfg, 5);
    kv_codec_store_le(dt, x, len / kv_codec_dtype_bytes(dt), b + 5);
    snprintf(name, sizeof name, "seed_%zu", i);
    write_file(rt_dir, name, ".bin", b, 5 + len);
    free(b);
    free(x);
  }
  printf("wrote fuzz seeds to %s and %s\n", dec_dir, rt_dir);
  return T_EXIT_PASS;
}

/* ---- verification ------------------------------------------------------------------------------ */

static int verify(const char *dir)
{
  int failed = 0;
  for (size_t i = 0; i < N_CASES; i++) {
    kv_codec_err e = {0};
    size_t sec_len, dec_len;
    uint8_t *sec = read_file(dir, cases[i].name, ".bin", &sec_len);
    uint8_t *want = read_file(dir, cases[i].name, ".dec", &dec_len);
    kv_section_info info;
    kv_codec_status rc = kv_section_parse(sec, sec_len, &info, &e);
    if (rc == KV_CODEC_OK) {
      size_t out = kv_section_rows_bytes(&info, 0, info.n_groups);
      size_t scr = kv_section_scratch_bytes(&info);
      uint8_t *rows = kt_xmalloc(out), *le = kt_xmalloc(out), *scratch = kt_xmalloc(scr);
      rc = kv_section_decode(sec, sec_len, scratch, scr, rows, out, NULL, &e);
      if (rc == KV_CODEC_OK) {
        kv_codec_store_le(info.shape.dtype, rows, out / kv_codec_dtype_bytes(info.shape.dtype), le);
        if (out != dec_len || memcmp(le, want, out) != 0) {
          fprintf(stderr, "%s: decoded rows differ from %s.dec\n", cases[i].name, cases[i].name);
          failed++;
        }
        if (info.codec_id == KV_CODEC_ID_DROP) {
          size_t pos_len;
          uint8_t *pw = read_file(dir, cases[i].name, ".pos", &pos_len);
          uint32_t *pos = kt_xmalloc(4 * (size_t)info.n_rows);
          CHECK_OK(e, kv_section_positions(sec, sec_len, 0, info.n_rows, pos, &e));
          int bad = pos_len != 4 * (size_t)info.n_rows;
          for (uint32_t r = 0; !bad && r < info.n_rows; r++)
            bad = pos[r] != kv_codec_get_le32(pw + 4 * (size_t)r);
          if (bad) {
            fprintf(stderr, "%s: positions differ from %s.pos\n", cases[i].name, cases[i].name);
            failed++;
          }
          free(pos);
          free(pw);
        }
      }
      free(rows);
      free(le);
      free(scratch);
    }
    if (rc != KV_CODEC_OK) {
      char msg[256];
      kv_codec_errmsg(&e, msg, sizeof msg);
      fprintf(stderr, "%s: does not decode: %s\n", cases[i].name, msg);
      failed++;
    } else {
      printf("ok %s\n", cases[i].name);
    }
    free(sec);
    free(want);
  }
  for (size_t i = 0; i < N_REJECTS; i++) {
    kv_codec_err e = {0};
    size_t len;
    uint8_t *b = read_file(dir, rejects[i], ".bin", &len);
    kv_codec_status rc = kt_try_decode(b, len, &e);
    if (rc != KV_CODEC_ECORRUPT) {
      fprintf(stderr, "%s: got %s, wanted KV_CODEC_ECORRUPT\n", rejects[i],
              kv_codec_status_name(rc));
      failed++;
    } else {
      char msg[256];
      kv_codec_errmsg(&e, msg, sizeof msg);
      printf("ok %s (%s)\n", rejects[i], msg);
    }
    free(b);
  }
  printf("%zu passed, %d failed\n", N_CASES + N_REJECTS - (size_t)failed, failed);
  return failed ? T_EXIT_FAIL : T_EXIT_PASS;
}

int main(int argc, char **argv)
{
  if (argc == 3 && strcmp(argv[1], "--write") == 0)
    return write_golden(argv[2]);
  if (argc == 4 && strcmp(argv[1], "--write-corpus") == 0)
    return write_corpus(argv[2], argv[3]);
  if (argc == 2 && argv[1][0] != '-')
    return verify(argv[1]);
  fprintf(stderr, "usage: %s DIR | --write DIR | --write-corpus DECODE_DIR ROUNDTRIP_DIR\n",
          argv[0]);
  return 2;
}
