/* SPDX-License-Identifier: MIT */
/*
 * tests/unit/test_compress_api.c — compression through the public API: configs and their
 * names, puts with each method, gets that return exactly what the codec decodes, contexts with
 * dropped tokens (kvdb_get_context), partial reads of compressed blocks (kvdb_get_tokens),
 * quality profiles and reports, re-encoding, shared blocks keeping the most faithful config,
 * and the database around it (reopen, verify, compact, a flipped byte, the format version).
 */
#include "kvdb_test.h"

#include <fcntl.h>
#include <math.h>
#include <sys/stat.h>

#include "codec.h"

/* 3 full blocks of 32 tokens and a partial one of 4 (shorter than the KIVI group) */
static const kvdb_model M = {"test-compress", 3, 2, 64, KVDB_F16, 32};
enum { N = 100 };

static kvdb_options opts(void)
{
  kvdb_options o;
  kvdb_options_init(&o);
  o.dram_bytes = 0; /* every get reads the disk unless a test says otherwise */
  o.log_level = -1;
  return o;
}

static void tokens(uint32_t *t, size_t n, uint64_t seed)
{
  for (size_t i = 0; i < n; i++)
    t[i] = (uint32_t)(t_rand(&seed) % 30000);
}

/* KV with structure: per-channel scales and offsets, so quantization and dropping matter */
static void fill(const uint32_t *tok, size_t n, uint16_t *buf)
{
  size_t i = 0;
  for (uint32_t l = 0; l < M.n_layers; l++)
    for (uint32_t kv = 0; kv < 2; kv++)
      for (size_t t = 0; t < n; t++)
        for (uint32_t h = 0; h < M.n_kv_heads; h++)
          for (uint32_t d = 0; d < M.head_dim; d++) {
            uint64_t s = tok[t] * 2654435761u + t * 97 + l * 131 + kv * 7 + h * 17 + d;
            double u = (double)(t_rand(&s) % 20000) / 10000.0 - 1.0; /* -1 .. 1 */
            double scale = kv ? 0.5 : 1.0 + (d % 8 == 0 ? 6.0 : 0.0) + (double)(d % 5);
            buf[i++] = kv_codec_f32_to_f16((float)(u * scale + (kv ? 0.0 : 0.3 * (d % 3))));
          }
}

static uint16_t *alloc_kv(size_t n)
{
  uint16_t *b = malloc(n * kvdb_model_token_bytes(&M));
  ASSERT(b != NULL);
  return b;
}

static size_t at(uint32_t l, uint32_t kv, size_t t, uint32_t h, uint32_t d, size_t n)
{
  return ((((size_t)l * 2 + kv) * n + t) * M.n_kv_heads + h) * M.head_dim + d;
}

static kvdb_status put_cfg(kvdb *db, const uint32_t *tok, size_t n, const uint16_t *buf,
                           const char *cfg, uint32_t flags, kvdb_put_info *info)
{
  kvdb_put_opts po;
  kvdb_put_opts_init(&po);
  if (kvdb_config_parse(cfg, &po.config) != KVDB_OK)
    return KVDB_INVALID;
  po.flags = flags;
  kvdb_kv_view v;
  ASSERT_OK(kvdb_kv_view_packed(&v, (void *)buf, &M, n, KVDB_LAYOUT_LKTHD));
  return kvdb_put_ex(db, &M, tok, n, &v, &po, info);
}

/*
 * What a get of a context stored with KIVI `bits` must return: each block's sections encoded
 * by the codec with the engine's rules (K group = min(group, block tokens), V group =
 * min(group, head_dim), the context's last `residual` tokens exact), then decoded.
 */
/* What a get returns for src stored with quantized config cf by model m (M's shape): each
 * section encoded and decoded by the codec the config names (kivi: K groups of tokens, V of
 * channels; kvquant: both of tokens, default 128, K before RoPE when m gives its RoPE). */
static void expected_quant_m(const kvdb_model *m, const uint16_t *src, size_t n,
                             const kvdb_config *cf, uint16_t *exp)
{
  int kvq = cf->drop == KVDB_QUANT_KVQUANT;
  const kv_codec *c = kv_codec_by_id(kvq ? KV_CODEC_ID_KVQUANT : KV_CODEC_ID_KIVI);
  uint16_t rows[32 * 64], dec[32 * 64];
  static uint8_t enc[1 << 16], scratch[1 << 20];
  for (size_t b0 = 0; b0 < n; b0 += M.block_tokens) {
    uint32_t nt = (uint32_t)(b0 + M.block_tokens <= n ? M.block_tokens : n - b0);
    for (uint32_t l = 0; l < M.n_layers; l++)
      for (uint32_t h = 0; h < M.n_kv_heads; h++)
        for (uint32_t kv = 0; kv < 2; kv++) {
          for (uint32_t t = 0; t < nt; t++)
            memcpy(rows + t * M.head_dim, src + at(l, kv, b0 + t, h, 0, n), M.head_dim * 2);
          kv_section_shape sh = {KV_CODEC_F16, kv ? KV_SECTION_V : KV_SECTION_K, nt, M.head_dim};
          kv_codec_params p;
          kv_codec_params_init(&p);
          p.bits = cf->bits;
          unsigned g = cf->group ? cf->group : kvq ? 128 : 32;
          p.group = kv && !kvq ? (g < M.head_dim ? g : M.head_dim) : (g < nt ? g : nt);
          size_t first_res = cf->residual >= n ? 0 : n - cf->residual;
          p.residual = b0 + nt > first_res ? (unsigned)(b0 + nt - (first_res > b0 ? first_res : b0)) : 0;
          if (kvq && !kv && m->rope_style != 0) {
            p.rope_base = m->rope_base;
            p.rope_style = m->rope_style == KVDB_ROPE_HALF ? KV_ROPE_HALF : KV_ROPE_ADJACENT;
            p.rope_pos0 = (uint32_t)b0;
          }
          size_t out = 0;
          ASSERT(kv_codec_encode(c, &sh, rows, (size_t)nt * M.head_dim * 2, &p, scratch,
                                 sizeof scratch, enc, sizeof enc, &out, NULL) == KV_CODEC_OK);
          ASSERT(kv_section_decode(enc, out, scratch, sizeof scratch, dec, sizeof dec, NULL,
                                   NULL) == KV_CODEC_OK);
          for (uint32_t t = 0; t < nt; t++)
            memcpy(exp + at(l, kv, b0 + t, h, 0, n), dec + t * M.head_dim, M.head_dim * 2);
        }
  }
}

static void expected_quant(const uint16_t *src, size_t n, const kvdb_config *cf, uint16_t *exp)
{
  expected_quant_m(&M, src, n, cf, exp);
}

static void test_config_names(void)
{
  const char *ok[] = {"raw",       "lossless",  "lossless:z9",    "lossless:z-3", "int8",
                      "int4",      "int2",      "int4:g64",       "int4:r128",    "knorm50",
                      "keydiff30", "snapkv70",  "snapkv50+int4",  "knorm12.5",    "int2:g16:r8",
                      "kivi4",     "kivi2",     "kvquant8",       "kivi4:g64:r8"};
  for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
    kvdb_config c, c2;
    ASSERT_OK(kvdb_config_parse(ok[i], &c));
    char nm[48];
    kvdb_config_name(&c, nm, sizeof nm);
    ASSERT_OK(kvdb_config_parse(nm, &c2)); /* canonical names parse back to the same config */
    ASSERT(memcmp(&c, &c2, sizeof c) == 0);
  }
  kvdb_config c;
  ASSERT_OK(kvdb_config_parse("knorm50", &c));
  ASSERT_EQ(c.method, KVDB_METHOD_DROP);
  ASSERT_EQ(c.keep_permille, 500);
  char nm[48];
  ASSERT(strcmp(kvdb_config_name(&c, nm, sizeof nm), "knorm50") == 0);
  const char *bad[] = {"", "int3", "int4:x1", "knorm", "knorm100", "knorm0", "lossless:z0",
                       "raw:g8", "knorm50+int3", "int4extra", "snapkv50:r10", "zstd",
                       "knorm12.", "knorm0.0"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    ASSERT_STATUS(KVDB_INVALID, kvdb_config_parse(bad[i], &c));
    ASSERT_MSG_HAS("config");
  }
  /* a config the model cannot take: K groups along the tokens of one block */
  ASSERT_OK(kvdb_config_parse("int4:g64", &c));
  ASSERT_STATUS(KVDB_INVALID, kvdb_config_check(&M, &c));
  ASSERT_MSG_HAS("group 64");
  ASSERT(strcmp(kvdb_config_name(&(kvdb_config){.method = 9}, nm, sizeof nm), "?") == 0);
  /* the quantizer: int4/int2 KVQuant, int8 KIVI; kivi<B>/kvquant<B> name it; a config of
   * method QUANT written before issue 16 (drop 0) is KIVI, named kivi4 / kivi2 */
  static const struct {
    const char *name, *canon;
    uint8_t bits, quant;
  } AL[] = {{"int4", "int4", 4, KVDB_QUANT_KVQUANT},    {"int2", "int2", 2, KVDB_QUANT_KVQUANT},
            {"int8", "int8", 8, KVDB_QUANT_KIVI},       {"kivi8", "int8", 8, KVDB_QUANT_KIVI},
            {"kvquant4", "int4", 4, KVDB_QUANT_KVQUANT}, {"kvquant2", "int2", 2, KVDB_QUANT_KVQUANT},
            {"kivi4", "kivi4", 4, KVDB_QUANT_KIVI},     {"kivi2", "kivi2", 2, KVDB_QUANT_KIVI},
            {"kvquant8", "kvquant8", 8, KVDB_QUANT_KVQUANT}};
  for (size_t i = 0; i < sizeof AL / sizeof AL[0]; i++) {
    ASSERT_OK(kvdb_config_parse(AL[i].name, &c));
    ASSERT(c.method == KVDB_METHOD_QUANT && c.bits == AL[i].bits && c.drop == AL[i].quant);
    ASSERT(strcmp(kvdb_config_name(&c, nm, sizeof nm), AL[i].canon) == 0);
  }
  kvdb_config old4 = {KVDB_METHOD_QUANT, 4, 0, 0, 0, 0, 0};
  ASSERT(strcmp(kvdb_config_name(&old4, nm, sizeof nm), "kivi4") == 0);
  kvdb_config q2 = {KVDB_METHOD_QUANT, 4, 2, 0, 0, 0, 0};
  ASSERT_STATUS(KVDB_INVALID, kvdb_config_check(&M, &q2));
  ASSERT_MSG_HAS("quantizer");
  ASSERT_STATUS(KVDB_INVALID, kvdb_config_parse("kivi3", &c));
  ASSERT_STATUS(KVDB_INVALID, kvdb_config_parse("kvquant", &c));
  /* the model's optional RoPE: both or neither, a known style, a base in (1, 1e9], even dims */
  kvdb_model mr = M;
  mr.rope_base = 10000.0f;
  mr.rope_style = KVDB_ROPE_ADJACENT;
  ASSERT_OK(kvdb_config_check(&mr, &c));
  mr.rope_style = 3;
  ASSERT_STATUS(KVDB_INVALID, kvdb_config_check(&mr, &c));
  ASSERT_MSG_HAS("rope_style");
  mr.rope_style = KVDB_ROPE_NONE; /* a base without a style */
  ASSERT_STATUS(KVDB_INVALID, kvdb_config_check(&mr, &c));
  mr.rope_style = KVDB_ROPE_HALF;
  mr.rope_base = 1.0f;
  ASSERT_STATUS(KVDB_INVALID, kvdb_config_check(&mr, &c));
  ASSERT_MSG_HAS("rope_base");
  mr.rope_base = 500000.0f;
  mr.head_dim = 63;
  ASSERT_STATUS(KVDB_INVALID, kvdb_config_check(&mr, &c));
  ASSERT_MSG_HAS("even head_dim");
}

/* int4 with the model's RoPE quantizes K before RoPE: a get returns what the kvquant codec
 * decodes with the model's RoPE (pre-RoPE K) — not what it decodes without — and the model
 * record keeps the RoPE (kvdb_model_get, re-encoding); without RoPE the same data is coded
 * post-RoPE. The model record of a RoPE model is version 2; reopened, it reads back. */
static void test_rope_model(void)
{
  char *dir = t_tmpdir("rope");
  kvdb_options o = opts();
  kvdb *db;
  ASSERT_OK(kvdb_open(dir, &o, &db));
  kvdb_model mr = M;
  mr.id = "test-compress-rope";
  mr.rope_base = 10000.0f;
  mr.rope_style = KVDB_ROPE_HALF;
  size_t tb = kvdb_model_token_bytes(&M);
  uint16_t *src = alloc_kv(N), *out = alloc_kv(N), *pre = alloc_kv(N), *post = alloc_kv(N);
  uint32_t tok[N];
  tokens(tok, N, 4242);
  fill(tok, N, src);
  kvdb_config c4;
  ASSERT_OK(kvdb_config_parse("int4", &c4));
  expected_quant_m(&mr, src, N, &c4, pre);
  expected_quant_m(&M, src, N, &c4, post);
  ASSERT(memcmp(pre, post, N * tb) != 0);
  kvdb_put_opts po;
  kvdb_put_opts_init(&po);
  po.config = c4;
  kvdb_kv_view v;
  ASSERT_OK(kvdb_kv_view_packed(&v, src, &mr, N, KVDB_LAYOUT_LKTHD));
  kvdb_put_info info;
  ASSERT_OK(kvdb_put_ex(db, &mr, tok, N, &v, &po, &info));
  ASSERT_OK(kvdb_kv_view_packed(&v, out, &mr, N, KVDB_LAYOUT_LKTHD));
  size_t hit = 0;
  ASSERT_OK(kvdb_get(db, &mr, tok, N, &v, &hit));
  ASSERT_EQ(hit, N);
  ASSERT(memcmp(out, pre, N * tb) == 0);
  /* the RoPE is not part of the fingerprint: the same shape without it reads the same blocks */
  kvdb_model plain = mr;
  plain.rope_base = 0.0f;
  plain.rope_style = KVDB_ROPE_NONE;
  memset(out, 0, N * tb);
  ASSERT_OK(kvdb_get(db, &plain, tok, N, &v, &hit));
  ASSERT_EQ(hit, N);
  ASSERT(memcmp(out, pre, N * tb) == 0);
  kvdb_close(db);
  ASSERT_OK(kvdb_open(dir, &o, &db));
  kvdb_model got;
  ASSERT_OK(kvdb_model_get(db, mr.id, &got));
  ASSERT(got.rope_base == 10000.0f && got.rope_style == KVDB_ROPE_HALF);
  /* re-encoding with the model as stored keeps pre-RoPE K: back to int4 from int4:g16 */
  kvdb_config g16;
  ASSERT_OK(kvdb_config_parse("int4:g16", &g16));
  ASSERT_OK(kvdb_put_ex(db, &got, tok, N, &v, &po, NULL)); /* already there: nothing new */
  ASSERT_OK(kvdb_recompress(db, &got, &info.context, &g16, NULL));
  expected_quant_m(&mr, pre, N, &g16, post); /* re-encoded from what was stored */
  ASSERT_OK(kvdb_get(db, &got, tok, N, &v, &hit));
  ASSERT(memcmp(out, post, N * tb) == 0);
  ASSERT_OK(kvdb_verify(db, NULL, NULL, NULL, NULL));
  kvdb_close(db);
  free(src);
  free(out);
  free(pre);
  free(post);
  t_rmdir(dir);
}

static void test_methods_round_trip(void)
{
  char *dir = t_tmpdir("comp");
  kvdb_options o = opts();
  kvdb *db;
  ASSERT_OK(kvdb_open(dir, &o, &db));
  kvdb_stats st;
  ASSERT_OK(kvdb_stat(db, &st));
  ASSERT_EQ(st.format_version, 4); /* a new database: format 4 (its block indexes) */
  uint16_t *src = alloc_kv(N), *out = alloc_kv(N), *exp = alloc_kv(N);
  const char *cfgs[] = {"lossless", "int8",  "int4",  "int2",  "int4:g16",
                        "int4:r40", "kivi4", "kivi2", "kvquant8"};
  uint64_t bytes[9];
  for (int c = 0; c < 9; c++) {
    uint32_t tok[N];
    tokens(tok, N, 100 + (uint64_t)c);
    fill(tok, N, src);
    kvdb_put_info info;
    ASSERT_OK(put_cfg(db, tok, N, src, cfgs[c], 0, &info));
    ASSERT_EQ(info.blocks_written, 4);
    size_t hit = 0;
    ASSERT_OK(kvdb_lookup(db, &M, tok, N, &hit));
    ASSERT_EQ(hit, N);
    memset(out, 0xA5, N * kvdb_model_token_bytes(&M));
    kvdb_kv_view v;
    ASSERT_OK(kvdb_kv_view_packed(&v, out, &M, N, KVDB_LAYOUT_LKTHD));
    ASSERT_OK(kvdb_get(db, &M, tok, N, &v, &hit));
    ASSERT_EQ(hit, N);
    if (c == 0) {
      memcpy(exp, src, N * kvdb_model_token_bytes(&M));
    } else {
      kvdb_config cf;
      ASSERT_OK(kvdb_config_parse(cfgs[c], &cf));
      expected_quant(src, N, &cf, exp);
      ASSERT(memcmp(exp, src, N * kvdb_model_token_bytes(&M)) != 0); /* it is lossy */
    }
    ASSERT(memcmp(out, exp, N * kvdb_model_token_bytes(&M)) == 0);
    kvdb_context_info ci;
    ASSERT_OK(kvdb_context_stat(db, &info.context, &ci));
    char nm[48];
    ASSERT(strcmp(kvdb_config_name(&ci.config, nm, sizeof nm), cfgs[c]) == 0);
    bytes[c] = ci.bytes;
    /* kvdb_get_context: all rows, positions are the tokens */
    uint32_t pos[3 * 2 * N], nrows[6];
    memset(out, 0, N * kvdb_model_token_bytes(&M));
    ASSERT_OK(kvdb_get_context(db, &M, &info.context, &v, pos, nrows));
    ASSERT(memcmp(out, exp, N * kvdb_model_token_bytes(&M)) == 0);
    for (int lh = 0; lh < 6; lh++) {
      ASSERT_EQ(nrows[lh], N);
      for (uint32_t r = 0; r < N; r++)
        ASSERT_EQ(pos[lh * N + r], r);
    }
  }
  /* sizes follow the bits (lossless of this noise-like data is near raw); kvquant's
   * scales cost what kivi's do at 32-token groups (one scale pair per 32 elements for K and
   * V alike): the two are at most a page per block apart */
  ASSERT(bytes[3] < bytes[2] && bytes[2] < bytes[1] && bytes[1] < bytes[0]);
  ASSERT(bytes[7] < bytes[6] && bytes[6] < bytes[1]);
  ASSERT(bytes[2] <= bytes[6] + 4 * 4096 && bytes[8] <= bytes[1] + 4 * 4096);
  ASSERT_OK(kvdb_stat(db, &st));
  /* created at 4: lossless frames (block format 3) raise it to 5, packed compressed objects
   * (block format 5, FORMAT.md §3f) to 9 */
  ASSERT_EQ(st.format_version, 9);
  ASSERT_OK(kvdb_verify(db, NULL, NULL, NULL, NULL));
  kvdb_close(db);
  /* a second process-like reopen reads the same */
  ASSERT_OK(kvdb_open(dir, &o, &db));
  uint32_t tok[N];
  tokens(tok, N, 102);
  fill(tok, N, src);
  kvdb_config c4;
  ASSERT_OK(kvdb_config_parse("int4", &c4));
  expected_quant(src, N, &c4, exp);
  kvdb_kv_view v;
  ASSERT_OK(kvdb_kv_view_packed(&v, out, &M, N, KVDB_LAYOUT_LKTHD));
  size_t hit;
  ASSERT_OK(kvdb_get(db, &M, tok, N, &v, &hit));
  ASSERT_EQ(hit, N);
  ASSERT(memcmp(out, exp, N * kvdb_model_token_bytes(&M)) == 0);
  kvdb_close(db);
  free(src);
  free(out);
  free(exp);
  t_rmdir(dir);
}

/* queries: [n_q][layer][n_q_heads = 4][head_dim], keys-like so snapkv has something to find */
static float *make_queries(uint32_t n_q)
{
  float *q = malloc((size_t)n_q * M.n_layers * 4 * M.head_dim * sizeof *q);
  uint64_t s = 5;
  for (size_t i = 0; i < (size_t)n_q * M.n_layers * 4 * M.head_dim; i++)
    q[i] = (float)((double)(t_rand(&s) % 2000) / 1000.0 - 1.0);
  return q;
}

static void test_drop(void)
{
  char *dir = t_tmpdir("drop");
  kvdb_options o = opts();
  kvdb *db;
  ASSERT_OK(kvdb_open(dir, &o, &db));
  uint16_t *src = alloc_kv(N), *out = alloc_kv(N);
  uint32_t tok[N];
  tokens(tok, N, 7);
  fill(tok, N, src);
  /* snapkv needs queries: refused before anything is written */
  ASSERT_STATUS(KVDB_INVALID, put_cfg(db, tok, N, src, "snapkv50", 0, NULL));
  ASSERT_MSG_HAS("queries");
  kvdb_stats st;
  ASSERT_OK(kvdb_stat(db, &st));
  ASSERT_EQ(st.n_contexts, 0);
  ASSERT_EQ(st.bytes_written, 0);
  const char *cfgs[] = {"knorm50", "keydiff30", "snapkv70"};
  float *q = make_queries(4);
  for (int c = 0; c < 3; c++) {
    tokens(tok, N, 70 + (uint64_t)c);
    fill(tok, N, src);
    kvdb_put_opts po;
    kvdb_put_opts_init(&po);
    ASSERT_OK(kvdb_config_parse(cfgs[c], &po.config));
    po.queries = q;
    po.n_queries = 4;
    po.n_q_heads = 4;
    kvdb_kv_view v;
    ASSERT_OK(kvdb_kv_view_packed(&v, src, &M, N, KVDB_LAYOUT_LKTHD));
    kvdb_put_info info;
    ASSERT_OK(kvdb_put_ex(db, &M, tok, N, &v, &po, &info));
    /* not a prefix kvdb_get can deliver */
    size_t hit = 99;
    ASSERT_OK(kvdb_lookup(db, &M, tok, N, &hit));
    ASSERT_EQ(hit, 0);
    ASSERT_OK(kvdb_kv_view_packed(&v, out, &M, N, KVDB_LAYOUT_LKTHD));
    ASSERT_OK(kvdb_get(db, &M, tok, N, &v, &hit));
    ASSERT_EQ(hit, 0);
    /* kvdb_get_context: per head, the kept rows in token order, exact, with their positions */
    uint32_t pos[6 * N], nrows[6];
    memset(out, 0, N * kvdb_model_token_bytes(&M));
    ASSERT_OK(kvdb_get_context(db, &M, &info.context, &v, pos, nrows));
    uint32_t keep = 0;
    for (uint32_t b0 = 0; b0 < N; b0 += 32) /* context-exact (format 8): round(p x N) */
      keep += kv_drop_keep_span(b0, b0 + 32 <= N ? 32 : N - b0, po.config.keep_permille);
    ASSERT_EQ(keep, (N * po.config.keep_permille + 500) / 1000);
    for (uint32_t l = 0; l < M.n_layers; l++)
      for (uint32_t h = 0; h < M.n_kv_heads; h++) {
        uint32_t lh = l * M.n_kv_heads + h;
        ASSERT_EQ(nrows[lh], keep);
        for (uint32_t r = 0; r < keep; r++) {
          uint32_t p = pos[lh * N + r];
          ASSERT(p < N && (r == 0 || p > pos[lh * N + r - 1]));
          for (uint32_t kv = 0; kv < 2; kv++)
            ASSERT(memcmp(out + at(l, kv, r, h, 0, N), src + at(l, kv, p, h, 0, N),
                          M.head_dim * 2) == 0);
        }
      }
    /* get_tokens: a kept position reads back; a dropped one is named */
    uint32_t kept = pos[N * 1 + 3], dropped = 0;
    while (dropped < N) {
      int is_kept = 0;
      for (uint32_t h = 0; h < M.n_kv_heads && !is_kept; h++)
        for (uint32_t r = 0; r < keep && !is_kept; r++)
          is_kept = pos[(1 * M.n_kv_heads + h) * N + r] == dropped;
      if (!is_kept)
        break;
      dropped++;
    }
    ASSERT(dropped < N);
    uint16_t row_out[2 * 2 * 64];
    kvdb_kv_view rv;
    ASSERT_OK(kvdb_kv_view_packed(&rv, row_out, &M, 1, KVDB_LAYOUT_LKTHD));
    kvdb_status rc = kvdb_get_tokens(db, &M, &info.context, 0, &kept, 1, &rv);
    if (rc == KVDB_OK) { /* kept by both heads of layer 0: exact */
      ASSERT(memcmp(row_out, src + at(0, 0, kept, 0, 0, N), 64 * 2) == 0);
    } else {
      ASSERT_EQ(rc, KVDB_NOTFOUND); /* head 0 kept it, head 1 did not */
    }
    ASSERT_STATUS(KVDB_NOTFOUND, kvdb_get_tokens(db, &M, &info.context, 1, &dropped, 1, &rv));
    ASSERT_MSG_HAS("was dropped");
  }
  free(q);

  /* drop + quantize with the default group (32) on 32-token blocks: half the rows are kept,
   * so the K groups run over the 16 kept rows; each kept row decodes to within a step */
  const char *dq[] = {"knorm50+int8", "keydiff30+int4"};
  for (int c = 0; c < 2; c++) {
    tokens(tok, N, 90 + (uint64_t)c);
    fill(tok, N, src);
    kvdb_put_info info;
    ASSERT_OK(put_cfg(db, tok, N, src, dq[c], 0, &info));
    kvdb_config cfg;
    ASSERT_OK(kvdb_config_parse(dq[c], &cfg));
    kvdb_kv_view v;
    ASSERT_OK(kvdb_kv_view_packed(&v, out, &M, N, KVDB_LAYOUT_LKTHD));
    uint32_t pos[6 * N], nrows[6];
    ASSERT_OK(kvdb_get_context(db, &M, &info.context, &v, pos, nrows));
    uint32_t keep = 0;
    for (uint32_t b0 = 0; b0 < N; b0 += 32) /* context-exact (format 8): round(p x N) */
      keep += kv_drop_keep_span(b0, b0 + 32 <= N ? 32 : N - b0, cfg.keep_permille);
    ASSERT_EQ(keep, (N * cfg.keep_permille + 500) / 1000);
    double steps = (double)((1u << cfg.bits) - 1);
    for (uint32_t l = 0; l < M.n_layers; l++)
      for (uint32_t h = 0; h < M.n_kv_heads; h++) {
        uint32_t lh = l * M.n_kv_heads + h;
        ASSERT_EQ(nrows[lh], keep);
        for (uint32_t kv = 0; kv < 2; kv++) {
          /* the widest range a K group (a channel) or a V group (a row) can span */
          float lo = 1e30f, hi = -1e30f;
          for (size_t t = 0; t < N; t++)
            for (uint32_t d = 0; d < M.head_dim; d++) {
              float x = kv_codec_f16_to_f32(src[at(l, kv, t, h, d, N)]);
              lo = x < lo ? x : lo;
              hi = x > hi ? x : hi;
            }
          for (uint32_t r = 0; r < keep; r++)
            for (uint32_t d = 0; d < M.head_dim; d++) {
              float want = kv_codec_f16_to_f32(src[at(l, kv, pos[lh * N + r], h, d, N)]);
              float got = kv_codec_f16_to_f32(out[at(l, kv, r, h, d, N)]);
              ASSERT(fabsf(got - want) <= (hi - lo) / steps + 0.01f);
            }
        }
      }
  }
  ASSERT_OK(kvdb_verify(db, NULL, NULL, NULL, NULL));
  kvdb_close(db);
  free(src);
  free(out);
  t_rmdir(dir);
}

static void test_get_tokens_partial(void)
{
  static const kvdb_model MB = {"test-compress-big", 4, 4, 128, KVDB_F16, 256};
  char *dir = t_tmpdir("ctok");
  kvdb_options o = opts();
  kvdb *db;
  ASSERT_OK(kvdb_open(dir, &o, &db));
  enum { NB = 512 };
  size_t tb = kvdb_model_token_bytes(&MB);
  uint16_t *src = malloc(NB * tb), *full = malloc(NB * tb);
  uint32_t tok[NB];
  tokens(tok, NB, 9);
  t_fill_kv(&MB, tok, NB, src);
  kvdb_put_opts po;
  kvdb_put_opts_init(&po);
  ASSERT_OK(kvdb_config_parse("int4", &po.config));
  kvdb_kv_view v;
  ASSERT_OK(kvdb_kv_view_packed(&v, src, &MB, NB, KVDB_LAYOUT_LKTHD));
  kvdb_put_info info;
  ASSERT_OK(kvdb_put_ex(db, &MB, tok, NB, &v, &po, &info));
  ASSERT_OK(kvdb_kv_view_packed(&v, full, &MB, NB, KVDB_LAYOUT_LKTHD));
  size_t hit;
  ASSERT_OK(kvdb_get(db, &MB, tok, NB, &v, &hit));
  ASSERT_EQ(hit, NB);
  kvdb_context_info ci;
  ASSERT_OK(kvdb_context_stat(db, &info.context, &ci));
  /* 16 positions of layer 2: the same bytes as the full get, reading a fraction of it */
  uint32_t pos[16];
  for (int i = 0; i < 16; i++)
    pos[i] = (uint32_t)(i * 31 + 5);
  uint16_t *sub = malloc(16 * tb);
  kvdb_kv_view sv;
  ASSERT_OK(kvdb_kv_view_packed(&sv, sub, &MB, 16, KVDB_LAYOUT_LKTHD));
  kvdb_stats s0, s1;
  ASSERT_OK(kvdb_stat(db, &s0));
  ASSERT_OK(kvdb_get_tokens(db, &MB, &info.context, 2, pos, 16, &sv));
  ASSERT_OK(kvdb_stat(db, &s1));
  for (int i = 0; i < 16; i++)
    for (uint32_t kv = 0; kv < 2; kv++)
      for (uint32_t h = 0; h < MB.n_kv_heads; h++)
        ASSERT(memcmp(sub + ((kv * 16 + (size_t)i) * MB.n_kv_heads + h) * 128,
                      full + (((2 * 2 + kv) * (size_t)NB + pos[i]) * MB.n_kv_heads + h) * 128,
                      128 * 2) == 0);
  uint64_t read = s1.bytes_read - s0.bytes_read;
  ASSERT(read > 0 && read < ci.bytes / 2); /* header, meta, section headers, 16-token groups */
  free(sub);
  free(src);
  free(full);
  kvdb_close(db);
  t_rmdir(dir);
}

static const kvdb_profile_entry *entry(const kvdb_profile_entry *e, size_t n, const char *name)
{
  kvdb_config c;
  ASSERT_OK(kvdb_config_parse(name, &c));
  for (size_t i = 0; i < n; i++)
    if (memcmp(&e[i].config, &c, sizeof c) == 0)
      return &e[i];
  fprintf(stderr, "no profile entry %s\n", name);
  abort();
}

static void test_profile(void)
{
  char *dir = t_tmpdir("prof");
  kvdb_options o = opts();
  kvdb *db;
  ASSERT_OK(kvdb_open(dir, &o, &db));
  uint16_t *src = alloc_kv(N);
  uint32_t tok[N];
  tokens(tok, N, 11);
  fill(tok, N, src);
  kvdb_put_info info;
  ASSERT_OK(put_cfg(db, tok, N, src, "lossless", KVDB_PUT_PROFILE, &info)); /* "profile only" */
  kvdb_profile_entry e[64];
  size_t n = 0;
  ASSERT_OK(kvdb_profile_get(db, &info.context, e, 64, &n));
  ASSERT_EQ(n, 13); /* the default space without queries */
  kvdb_context_info ci;
  ASSERT_OK(kvdb_context_stat(db, &info.context, &ci));
  ASSERT_EQ(ci.has_profile, 1);
  const kvdb_profile_entry *raw = entry(e, n, "raw"), *ll = entry(e, n, "lossless"),
                           *i8 = entry(e, n, "int8"), *i4 = entry(e, n, "int4"),
                           *i2 = entry(e, n, "int2"), *k90 = entry(e, n, "keydiff90"),
                           *k30 = entry(e, n, "keydiff30");
  ASSERT(raw->quality == 1.0 && (raw->flags & KVDB_PROFILE_EXACT));
  ASSERT(ll->quality == 1.0 && (ll->flags & KVDB_PROFILE_STORED) && ll->bytes == ci.bytes);
  ASSERT(i8->quality > 0.999 && i8->quality <= 1.0);
  ASSERT(i4->quality < i8->quality && i2->quality < i4->quality);
  ASSERT(i8->rel_l2 < i4->rel_l2 && i4->rel_l2 < i2->rel_l2);
  ASSERT(k90->quality > k30->quality);
  ASSERT(i2->bytes < i4->bytes && i4->bytes < i8->bytes && i8->bytes < raw->bytes);
  ASSERT(isnan(i4->reported_quality) && i4->n_probes > 0);
  /* the caller's own measure wins; reports are averaged */
  ASSERT_OK(kvdb_report_quality(db, &info.context, &i4->config, 0.5));
  ASSERT_OK(kvdb_report_quality(db, &info.context, &i4->config, 0.7));
  kvdb_config other;
  ASSERT_OK(kvdb_config_parse("knorm10+int2", &other));
  ASSERT_OK(kvdb_report_quality(db, &info.context, &other, 0.1)); /* not in the space: added */
  ASSERT_STATUS(KVDB_INVALID, kvdb_report_quality(db, &info.context, &other, 1.5));
  ASSERT_OK(kvdb_profile_get(db, &info.context, e, 64, &n));
  ASSERT_EQ(n, 14);
  ASSERT(fabs(entry(e, n, "int4")->reported_quality - 0.6) < 1e-12);
  ASSERT_EQ(entry(e, n, "int4")->n_reports, 2);
  /* measured again on demand: the reports stay */
  kvdb_put_opts po;
  kvdb_put_opts_init(&po);
  po.profile_space = "int8,int4,knorm50";
  ASSERT_OK(kvdb_profile(db, &M, &info.context, &po));
  ASSERT_OK(kvdb_profile_get(db, &info.context, e, 64, &n));
  ASSERT(fabs(entry(e, n, "int4")->reported_quality - 0.6) < 1e-12);
  ASSERT(entry(e, n, "lossless")->flags & KVDB_PROFILE_STORED);
  /* with queries: the snapkv configs join the default space */
  float *q = make_queries(4);
  kvdb_put_opts_init(&po);
  po.queries = q;
  po.n_queries = 4;
  po.n_q_heads = 4;
  ASSERT_OK(kvdb_profile(db, &M, &info.context, &po));
  ASSERT_OK(kvdb_profile_get(db, &info.context, e, 64, &n));
  ASSERT(entry(e, n, "snapkv50")->quality > 0 && entry(e, n, "snapkv90")->quality > 0.9);
  po.n_q_heads = 3; /* not a multiple of the KV heads */
  ASSERT_STATUS(KVDB_INVALID, kvdb_profile(db, &M, &info.context, &po));
  ASSERT_MSG_HAS("n_q_heads");
  kvdb_put_opts_init(&po);
  po.profile_space = "int4,bogus";
  ASSERT_STATUS(KVDB_INVALID, kvdb_profile(db, &M, &info.context, &po));
  ASSERT_MSG_HAS("bogus");
  free(q);
  /* a context stored with dropped tokens cannot be measured later */
  uint32_t tok2[N];
  tokens(tok2, N, 12);
  kvdb_put_info i2nfo;
  ASSERT_OK(put_cfg(db, tok2, N, src, "knorm50", 0, &i2nfo));
  ASSERT_STATUS(KVDB_INVALID, kvdb_profile(db, &M, &i2nfo.context, NULL));
  ASSERT_STATUS(KVDB_NOTFOUND, kvdb_profile_get(db, &i2nfo.context, e, 64, &n));
  /* deleting a context deletes its profile */
  ASSERT_OK(kvdb_delete(db, &info.context));
  ASSERT_STATUS(KVDB_NOTFOUND, kvdb_profile_get(db, &info.context, e, 64, &n));
  kvdb_close(db);
  free(src);
  t_rmdir(dir);
}

static void test_recompress_and_sharing(void)
{
  char *dir = t_tmpdir("recomp");
  kvdb_options o = opts();
  o.dram_bytes = 16 << 20; /* decoded copies in the DRAM tier must follow the re-encoding */
  kvdb *db;
  ASSERT_OK(kvdb_open(dir, &o, &db));
  size_t tb = kvdb_model_token_bytes(&M);
  uint16_t *src = alloc_kv(N), *out = alloc_kv(N), *exp = alloc_kv(N);
  uint32_t tok[N];
  tokens(tok, N, 21);
  fill(tok, N, src);
  kvdb_put_info a;
  ASSERT_OK(put_cfg(db, tok, N, src, "lossless", KVDB_PUT_PROFILE, &a));
  kvdb_kv_view v;
  ASSERT_OK(kvdb_kv_view_packed(&v, out, &M, N, KVDB_LAYOUT_LKTHD));
  size_t hit;
  ASSERT_OK(kvdb_get(db, &M, tok, N, &v, &hit)); /* fills the DRAM tier with exact blocks */
  kvdb_config to;
  ASSERT_OK(kvdb_config_parse("int4", &to));
  ASSERT_OK(kvdb_recompress(db, &M, &a.context, &to, NULL));
  kvdb_context_info ci;
  ASSERT_OK(kvdb_context_stat(db, &a.context, &ci));
  ASSERT_EQ(ci.config.method, KVDB_METHOD_QUANT);
  ASSERT_OK(kvdb_get(db, &M, tok, N, &v, &hit));
  ASSERT_EQ(hit, N);
  expected_quant(src, N, &to, exp);
  ASSERT(memcmp(out, exp, N * tb) == 0); /* the re-encoded blocks, not the cached exact ones */
  kvdb_profile_entry e[64];
  size_t n;
  ASSERT_OK(kvdb_profile_get(db, &a.context, e, 64, &n));
  ASSERT(entry(e, n, "int4")->flags & KVDB_PROFILE_STORED);
  ASSERT_EQ(entry(e, n, "int4")->bytes, ci.bytes);
  /* precision does not come back */
  kvdb_config back;
  ASSERT_OK(kvdb_config_parse("lossless", &back));
  ASSERT_STATUS(KVDB_INVALID, kvdb_recompress(db, &M, &a.context, &back, NULL));
  ASSERT_MSG_HAS("precision");
  ASSERT_OK(kvdb_config_parse("int8", &back));
  ASSERT_STATUS(KVDB_INVALID, kvdb_recompress(db, &M, &a.context, &back, NULL));
  ASSERT_OK(kvdb_config_parse("int2", &to)); /* coarser is fine */
  ASSERT_OK(kvdb_recompress(db, &M, &a.context, &to, NULL));
  /* shared blocks: B shares A's first three blocks and is put exactly: they become exact */
  uint32_t tokb[N + 40];
  memcpy(tokb, tok, 96 * sizeof *tokb);
  tokens(tokb + 96, N + 40 - 96, 22);
  uint16_t *srcb = alloc_kv(N + 40), *outb = alloc_kv(N + 40);
  fill(tokb, N + 40, srcb);
  ASSERT(memcmp(srcb, src, 0) == 0);
  kvdb_put_info b;
  ASSERT_OK(put_cfg(db, tokb, N + 40, srcb, "raw", 0, &b));
  ASSERT_EQ(b.blocks_written, 5); /* three rewritten exactly, two new */
  ASSERT_OK(kvdb_kv_view_packed(&v, outb, &M, N + 40, KVDB_LAYOUT_LKTHD));
  ASSERT_OK(kvdb_get(db, &M, tokb, N + 40, &v, &hit));
  ASSERT_EQ(hit, N + 40);
  ASSERT(memcmp(outb, srcb, (N + 40) * tb) == 0);
  /* A now reads its first 96 tokens exactly, its last block int2 */
  ASSERT_OK(kvdb_kv_view_packed(&v, out, &M, N, KVDB_LAYOUT_LKTHD));
  ASSERT_OK(kvdb_get(db, &M, tok, N, &v, &hit));
  ASSERT_EQ(hit, N);
  for (uint32_t l = 0; l < M.n_layers; l++)
    for (uint32_t kv = 0; kv < 2; kv++)
      ASSERT(memcmp(out + at(l, kv, 0, 0, 0, N), src + at(l, kv, 0, 0, 0, N),
                    96 * M.n_kv_heads * M.head_dim * 2) == 0);
  /* re-encoding A leaves the shared blocks alone: B still reads exactly */
  ASSERT_OK(kvdb_config_parse("int2:g8", &to));
  ASSERT_OK(kvdb_recompress(db, &M, &a.context, &to, NULL));
  ASSERT_OK(kvdb_kv_view_packed(&v, outb, &M, N + 40, KVDB_LAYOUT_LKTHD));
  ASSERT_OK(kvdb_get(db, &M, tokb, N + 40, &v, &hit));
  ASSERT(memcmp(outb, srcb, (N + 40) * tb) == 0);
  ASSERT_OK(kvdb_verify(db, NULL, NULL, NULL, NULL));
  /* compaction moves compressed blocks like any other */
  ASSERT_OK(kvdb_delete(db, &b.context));
  kvdb_compact_report cr;
  ASSERT_OK(kvdb_compact(db, 0.99, NULL, NULL, &cr));
  ASSERT_OK(kvdb_kv_view_packed(&v, out, &M, N, KVDB_LAYOUT_LKTHD));
  ASSERT_OK(kvdb_get(db, &M, tok, N, &v, &hit));
  ASSERT_EQ(hit, N);
  ASSERT_OK(kvdb_verify(db, NULL, NULL, NULL, NULL));
  kvdb_close(db);
  free(src);
  free(out);
  free(exp);
  free(srcb);
  free(outb);
  t_rmdir(dir);
}

static void test_corrupt_compressed(void)
{
  char *dir = t_tmpdir("ccorrupt");
  kvdb_options o = opts();
  kvdb *db;
  ASSERT_OK(kvdb_open(dir, &o, &db));
  uint16_t *src = alloc_kv(N), *out = alloc_kv(N);
  uint32_t tok[N];
  tokens(tok, N, 31);
  fill(tok, N, src);
  ASSERT_OK(put_cfg(db, tok, N, src, "lossless", 0, NULL));
  kvdb_close(db);
  /* flip a byte near the end of the second block object (its data region) */
  char path[4200];
  snprintf(path, sizeof path, "%s/ssd/seg-0000000000000001.kvs", dir);
  int fd = open(path, O_RDWR);
  ASSERT(fd >= 0);
  struct stat st;
  fstat(fd, &st);
  ASSERT_OK(kvdb_open(dir, &o, &db));
  kvdb_iter *it;
  kvdb_context_info ci;
  ASSERT_OK(kvdb_iter_open(db, &it));
  ASSERT_OK(kvdb_iter_next(it, &ci));
  kvdb_iter_close(it);
  kvdb_close(db);
  /* blocks are written in order; find block 1's end from the objects' sizes via the header */
  uint64_t b0 = t_first_object_bytes(fd);
  off_t off = (off_t)b0 + 4096 * 2 + 10; /* inside block 1 (its meta is one page) */
  uint8_t byte;
  ASSERT(pread(fd, &byte, 1, off) == 1);
  byte ^= 0x20;
  ASSERT(pwrite(fd, &byte, 1, off) == 1);
  close(fd);
  ASSERT_OK(kvdb_open(dir, &o, &db));
  kvdb_kv_view v;
  ASSERT_OK(kvdb_kv_view_packed(&v, out, &M, N, KVDB_LAYOUT_LKTHD));
  size_t hit;
  ASSERT_OK(kvdb_get(db, &M, tok, N, &v, &hit));
  ASSERT_EQ(hit, 32); /* block 0 only */
  ASSERT(memcmp(out, src, 0) == 0);
  ASSERT_EQ(t_check_kv(&M, tok, 0, N, out), 0);
  kvdb_stats s;
  ASSERT_OK(kvdb_stat(db, &s));
  ASSERT_EQ(s.corrupt_blocks, 1);
  kvdb_verify_report rep;
  ASSERT_STATUS(KVDB_CORRUPT, kvdb_verify(db, NULL, NULL, NULL, &rep));
  ASSERT_EQ(rep.problems, 1);
  ASSERT_STATUS(KVDB_CORRUPT, kvdb_get_context(db, &M, &ci.key, &v, NULL, NULL));
  ASSERT_MSG_HAS("checksum mismatch");
  kvdb_close(db);
  free(src);
  free(out);
  t_rmdir(dir);
  (void)st;
}

/* A get of int4 blocks of >= 4 MiB of KV runs each block's layers on every core (get.c
 * layers_mt): it returns what kvdb_get_context (one section at a time, one thread) returns,
 * and a damaged section in the layers of another thread than the caller's is caught there: the
 * block is not delivered, counted corrupt. */
static void test_mt_get(void)
{
  static const kvdb_model MT = {"test-compress-mt", 8, 8, 128, KVDB_F16, 256};
  enum { NT = 512 };
  char *dir = t_tmpdir("mtget");
  kvdb_options o = opts();
  kvdb *db;
  ASSERT_OK(kvdb_open(dir, &o, &db));
  size_t tb = kvdb_model_token_bytes(&MT);
  uint16_t *src = malloc(NT * tb), *a = malloc(NT * tb), *b = malloc(NT * tb);
  ASSERT(src != NULL && a != NULL && b != NULL);
  uint32_t tok[NT];
  tokens(tok, NT, 77);
  t_fill_kv(&MT, tok, NT, src);
  kvdb_put_opts po;
  kvdb_put_opts_init(&po);
  ASSERT_OK(kvdb_config_parse("int4", &po.config));
  kvdb_kv_view v;
  ASSERT_OK(kvdb_kv_view_packed(&v, src, &MT, NT, KVDB_LAYOUT_LKTHD));
  kvdb_put_info info;
  ASSERT_OK(kvdb_put_ex(db, &MT, tok, NT, &v, &po, &info));
  ASSERT_OK(kvdb_kv_view_packed(&v, a, &MT, NT, KVDB_LAYOUT_LKTHD));
  size_t hit = 0;
  ASSERT_OK(kvdb_get(db, &MT, tok, NT, &v, &hit));
  ASSERT_EQ(hit, NT);
  kvdb_kv_view vb;
  ASSERT_OK(kvdb_kv_view_packed(&vb, b, &MT, NT, KVDB_LAYOUT_LKTHD));
  ASSERT_OK(kvdb_get_context(db, &MT, &info.context, &vb, NULL, NULL));
  ASSERT(memcmp(a, b, NT * tb) == 0);
  ASSERT(memcmp(a, src, NT * tb) != 0); /* lossy */
  /* partial prefixes on every core: block 1 cut inside a page group (300: 44 of its 256
   * tokens, 16-token pages), and at a page group's end (288) */
  static const size_t pn[] = {300, 288};
  for (int pi = 0; pi < 2; pi++) {
    size_t n = pn[pi];
    memset(a, 0x5A, NT * tb);
    ASSERT_OK(kvdb_kv_view_packed(&v, a, &MT, n, KVDB_LAYOUT_LKTHD));
    ASSERT_OK(kvdb_get(db, &MT, tok, n, &v, &hit));
    ASSERT_EQ(hit, n);
    size_t plane = (size_t)MT.n_kv_heads * MT.head_dim; /* elements of a token */
    for (size_t lk = 0; lk < 2u * MT.n_layers; lk++) /* (layer, K/V) planes */
      ASSERT(memcmp(a + lk * n * plane, b + lk * NT * plane, n * plane * 2) == 0);
    for (size_t i = 2u * MT.n_layers * n * plane; i < NT * tb / 2; i++)
      ASSERT_EQ(a[i], 0x5A5A); /* nothing past the view */
  }
  kvdb_close(db);
  /* a byte three quarters into block 0's object: a section of layer 5 or 6 of 8 */
  char path[4200];
  snprintf(path, sizeof path, "%s/ssd/seg-0000000000000001.kvs", dir);
  int fd = open(path, O_RDWR);
  ASSERT(fd >= 0);
  uint64_t b0 = t_first_object_bytes(fd);
  off_t off = (off_t)(b0 / 4 * 3);
  uint8_t byte;
  ASSERT(pread(fd, &byte, 1, off) == 1);
  byte ^= 0x01;
  ASSERT(pwrite(fd, &byte, 1, off) == 1);
  close(fd);
  ASSERT_OK(kvdb_open(dir, &o, &db));
  ASSERT_OK(kvdb_get(db, &MT, tok, NT, &v, &hit));
  ASSERT_EQ(hit, 0);
  kvdb_stats st;
  ASSERT_OK(kvdb_stat(db, &st));
  ASSERT_EQ(st.corrupt_blocks, 1);
  kvdb_close(db);
  free(src);
  free(a);
  free(b);
  t_rmdir(dir);
}

/* A view of n tokens of M's shape, K and V each [layer][token][head][dim] with odd gaps: rows
 * head_stride = row + 2 apart (odd addresses), tokens 2 x that + 6, layers n tokens + 10
 * (dim_stride 0), or dims 4 bytes apart (dim_stride 4: rows that are not contiguous), or
 * through layer_bases. buf: view_bytes(n) bytes per tensor, K then V. */
static size_t view_hs(int dims4)
{
  return dims4 ? (size_t)M.head_dim * 4 + 2 : (size_t)M.head_dim * 2 + 2;
}
static size_t view_ts(int dims4)
{
  return 2 * view_hs(dims4) + 6;
}
static size_t view_ls(size_t n, int dims4)
{
  return n * view_ts(dims4) + 10;
}
static size_t view_bytes(size_t n, int dims4)
{
  return M.n_layers * view_ls(n, dims4);
}
static void odd_view(uint8_t *buf, size_t n, int dims4, void **lb, kvdb_kv_view *v)
{
  memset(v, 0, sizeof *v);
  for (int kv = 0; kv < 2; kv++) {
    kvdb_tensor_view *tv = kv ? &v->v : &v->k;
    uint8_t *base = buf + kv * view_bytes(n, dims4);
    tv->token_stride = (int64_t)view_ts(dims4);
    tv->head_stride = (int64_t)view_hs(dims4);
    tv->dim_stride = dims4 ? 4 : 0;
    if (lb != NULL) { /* layers in reverse order through layer_bases */
      for (uint32_t l = 0; l < M.n_layers; l++)
        lb[kv * M.n_layers + l] = base + (M.n_layers - 1 - l) * view_ls(n, dims4);
      tv->layer_bases = (void *const *)&lb[kv * M.n_layers];
    } else {
      tv->base = base;
      tv->layer_stride = (int64_t)view_ls(n, dims4);
    }
  }
}
static size_t odd_at(size_t n, int dims4, int rev, uint32_t l, uint32_t kv, size_t t, uint32_t h,
                     uint32_t d)
{
  uint32_t ll = rev ? M.n_layers - 1 - l : l;
  return kv * view_bytes(n, dims4) + ll * view_ls(n, dims4) + t * view_ts(dims4) +
         h * view_hs(dims4) + d * (dims4 ? 4 : 2);
}

/* Issue 16: a get decodes format-2 blocks straight into the caller's view (get.c `direct`,
 * cblock.c kv_cblock_decode_view): the same bytes as the codec's decode, into views with odd
 * strides, layer_bases, rows that are not contiguous (decoded aside and copied), and partial
 * prefixes whose last block is cut inside a page group; only the view's rows are written; hit
 * counts one SSD hit per block. */
static void test_direct_views(void)
{
  char *dir = t_tmpdir("direct");
  kvdb_options o = opts();
  kvdb *db;
  ASSERT_OK(kvdb_open(dir, &o, &db));
  const char *cfgs[] = {"int4", "kivi4", "int4:r40", "int2", "int8", "lossless"};
  uint16_t *src = alloc_kv(N), *exp = alloc_kv(N);
  size_t cap = 2 * view_bytes(N, 1);
  uint8_t *buf = malloc(cap);
  void *lb[2 * 3];
  ASSERT(buf != NULL);
  for (int c = 0; c < 6; c++) {
    uint32_t tok[N];
    tokens(tok, N, 900 + (uint64_t)c);
    fill(tok, N, src);
    ASSERT_OK(put_cfg(db, tok, N, src, cfgs[c], 0, NULL));
    if (c == 5) {
      memcpy(exp, src, N * kvdb_model_token_bytes(&M));
    } else {
      kvdb_config cf;
      ASSERT_OK(kvdb_config_parse(cfgs[c], &cf));
      expected_quant(src, N, &cf, exp);
    }
    /* prefixes: every token, a cut last block (6 of 32), whole blocks, a cut second block */
    static const size_t ns[] = {N, 70, 64, 40, 1};
    for (int ni = 0; ni < 5; ni++)
      for (int shape = 0; shape < 3; shape++) { /* odd strides, layer_bases, dims 4 apart */
        size_t n = ns[ni];
        int dims4 = shape == 2, rev = shape == 1;
        memset(buf, 0xA5, cap);
        kvdb_kv_view v;
        odd_view(buf, n, dims4, rev ? lb : NULL, &v);
        kvdb_stats s0, s1;
        ASSERT_OK(kvdb_stat(db, &s0));
        size_t hit = 0;
        ASSERT_OK(kvdb_get(db, &M, tok, n, &v, &hit));
        ASSERT_EQ(hit, n);
        ASSERT_OK(kvdb_stat(db, &s1));
        ASSERT_EQ(s1.tier[KVDB_TIER_SSD].hits - s0.tier[KVDB_TIER_SSD].hits,
                  (n + M.block_tokens - 1) / M.block_tokens);
        size_t written = 0;
        for (uint32_t l = 0; l < M.n_layers; l++)
          for (uint32_t kv = 0; kv < 2; kv++)
            for (size_t t = 0; t < n; t++)
              for (uint32_t h = 0; h < M.n_kv_heads; h++)
                for (uint32_t d = 0; d < M.head_dim; d++) {
                  uint16_t x;
                  memcpy(&x, buf + odd_at(n, dims4, rev, l, kv, t, h, d), 2);
                  ASSERT_EQ(x, exp[at(l, kv, t, h, d, N)]);
                  written += 2;
                }
        size_t untouched = 0; /* everything else keeps its 0xA5 */
        for (size_t i = 0; i < 2 * view_bytes(n, dims4); i++)
          untouched += buf[i] == 0xA5;
        size_t same = 0; /* written bytes that happen to be 0xA5 */
        for (uint32_t l = 0; l < M.n_layers; l++)
          for (uint32_t kv = 0; kv < 2; kv++)
            for (size_t t = 0; t < n; t++)
              for (uint32_t h = 0; h < M.n_kv_heads; h++)
                for (uint32_t d = 0; d < M.head_dim; d++) {
                  const uint8_t *e = (const uint8_t *)&exp[at(l, kv, t, h, d, N)];
                  same += (e[0] == 0xA5) + (e[1] == 0xA5);
                }
        ASSERT_EQ(untouched, 2 * view_bytes(n, dims4) - written + same);
      }
  }
  kvdb_close(db);
  free(src);
  free(exp);
  free(buf);
  t_rmdir(dir);
}

/* Object k of the whole-page segment file fd: its offset (objects back to back, each its
 * header's meta_bytes + data_bytes). */
static uint64_t nth_object(int fd, int k, uint64_t *bytes)
{
  uint64_t off = 0;
  for (int i = 0;; i++) {
    uint8_t hdr[128];
    ASSERT(pread(fd, hdr, sizeof hdr, (off_t)off) == (ssize_t)sizeof hdr);
    uint64_t meta = 0, data = 0;
    for (int j = 3; j >= 0; j--)
      meta = meta << 8 | hdr[8 + j];
    for (int j = 7; j >= 0; j--)
      data = data << 8 | hdr[96 + j];
    ASSERT(meta > 0 && meta % 4096 == 0 && data % 4096 == 0);
    if (i == k) {
      *bytes = meta + data;
      return off;
    }
    off += meta + data;
  }
}

/* A get of many compressed blocks (each block's reads in flight while the one before is
 * decoded, get.c "The read schedule") gives what kvdb_get_context gives, whole and as partial
 * prefixes; a damaged byte in the middle of a middle block ends the get before that block (its
 * KV never delivered as a hit, the later blocks never processed: nothing written where they
 * go), the block counted corrupt. */
static void test_deep_get(void)
{
  static const kvdb_model MD = {"test-compress-deep", 8, 8, 128, KVDB_F16, 256};
  enum { ND = 5 * 256 + 60 };
  char *dir = t_tmpdir("deepget");
  kvdb_options o = opts();
  kvdb *db;
  ASSERT_OK(kvdb_open(dir, &o, &db));
  size_t tb = kvdb_model_token_bytes(&MD), plane = (size_t)MD.n_kv_heads * MD.head_dim;
  uint16_t *src = malloc(ND * tb), *a = malloc(ND * tb), *b = malloc(ND * tb);
  ASSERT(src != NULL && a != NULL && b != NULL);
  uint32_t *tok = malloc(ND * sizeof *tok);
  ASSERT(tok != NULL);
  tokens(tok, ND, 83);
  t_fill_kv(&MD, tok, ND, src);
  kvdb_put_opts po;
  kvdb_put_opts_init(&po);
  ASSERT_OK(kvdb_config_parse("int4", &po.config));
  kvdb_kv_view v, vb;
  ASSERT_OK(kvdb_kv_view_packed(&v, src, &MD, ND, KVDB_LAYOUT_LKTHD));
  kvdb_put_info info;
  ASSERT_OK(kvdb_put_ex(db, &MD, tok, ND, &v, &po, &info));
  ASSERT_OK(kvdb_kv_view_packed(&vb, b, &MD, ND, KVDB_LAYOUT_LKTHD));
  ASSERT_OK(kvdb_get_context(db, &MD, &info.context, &vb, NULL, NULL));
  static const size_t pn[] = {ND, 1024, 700, 30};
  for (int rep = 0; rep < 2; rep++) { /* (the second: the read buffers reused) */
    for (int pi = 0; pi < 4; pi++) {
      size_t n = pn[pi], hit = 0;
      memset(a, 0x5A, ND * tb);
      ASSERT_OK(kvdb_kv_view_packed(&v, a, &MD, n, KVDB_LAYOUT_LKTHD));
      ASSERT_OK(kvdb_get(db, &MD, tok, n, &v, &hit));
      ASSERT_EQ(hit, n);
      for (size_t lk = 0; lk < 2u * MD.n_layers; lk++)
        ASSERT(memcmp(a + lk * n * plane, b + lk * ND * plane, n * plane * 2) == 0);
      for (size_t i = 2u * MD.n_layers * n * plane; i < ND * tb / 2; i++)
        ASSERT_EQ(a[i], 0x5A5A);
    }
  }
  kvdb_close(db);
  char path[4200];
  snprintf(path, sizeof path, "%s/ssd/seg-0000000000000001.kvs", dir);
  int fd = open(path, O_RDWR);
  ASSERT(fd >= 0);
  uint64_t b2;
  uint64_t o2 = nth_object(fd, 2, &b2);
  ASSERT(b2 > (2u << 20));
  off_t off = (off_t)(o2 + b2 / 2);
  uint8_t byte;
  ASSERT(pread(fd, &byte, 1, off) == 1);
  byte ^= 0x10;
  ASSERT(pwrite(fd, &byte, 1, off) == 1);
  close(fd);
  ASSERT_OK(kvdb_open(dir, &o, &db));
  for (int rep = 0; rep < 2; rep++) {
    size_t hit = 1;
    memset(a, 0x5A, ND * tb);
    ASSERT_OK(kvdb_kv_view_packed(&v, a, &MD, ND, KVDB_LAYOUT_LKTHD));
    ASSERT_OK(kvdb_get(db, &MD, tok, ND, &v, &hit));
    ASSERT_EQ(hit, 512);
    for (size_t lk = 0; lk < 2u * MD.n_layers; lk++) {
      ASSERT(memcmp(a + lk * ND * plane, b + lk * ND * plane, 512 * plane * 2) == 0);
      for (size_t i = 768 * plane; i < ND * plane; i++) /* (the damaged block's layers */
        ASSERT_EQ(a[lk * ND * plane + i], 0x5A5A);      /* before its bad one may be) */
    }
  }
  kvdb_stats st;
  ASSERT_OK(kvdb_stat(db, &st));
  ASSERT_EQ(st.corrupt_blocks, 2);
  kvdb_close(db);
  free(tok);
  free(src);
  free(a);
  free(b);
  t_rmdir(dir);
}

int main(void)
{
  test_deep_get();
  test_direct_views();
  test_mt_get();
  test_config_names();
  test_rope_model();
  test_methods_round_trip();
  test_drop();
  test_get_tokens_partial();
  test_profile();
  test_recompress_and_sharing();
  test_corrupt_compressed();
  printf("test_compress_api: all passed\n");
  return 0;
}
