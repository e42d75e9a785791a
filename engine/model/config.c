/* SPDX-License-Identifier: MIT */
/*
 * engine/model/config.c — storage configs (kvdb_config): names, checks, the catalog encoding, and
 * the codec parameters of one section of a block stored with a config.
 *
 * NAMES    base [ "+int" bits ] { ":" option }
 *   base    raw | lossless | int8 | int4 | int2 | kivi<B> | kvquant<B> | knorm<P> | keydiff<P>
 *           | snapkv<P>
 *           (P = kept percent, 1..99 with an optional decimal: knorm12.5 keeps 0.125)
 *           int4 and int2 are KVQuant (kvdb_quantizer KVDB_QUANT_KVQUANT: codec 5, K and V per
 *           channel in groups of 128 tokens, K before RoPE when the model gives its RoPE), int8
 *           is KIVI (codec 3); kivi<B> (B = 8, 4, 2) and kvquant<B> name the quantizer: kivi4
 *           and kivi2 are the int4 and int2 of databases before issue 16, kivi8 = int8,
 *           kvquant4 = int4, kvquant8 is KVQuant at 8 bits.
 *   +intN   drop methods only: quantize the kept rows to N bits
 *   :gG     quantization group (tokens for K, channels for V)
 *   :rR     residual: the context's last R tokens in full precision
 *   :zL     zstd level of lossless (-7..22)
 * The canonical name writes what differs from the defaults, in that order.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

#include "model.h"

static const char *const DROP_NAME[] = {"", "knorm", "keydiff", "snapkv"};

static kvdb_status bad(const char *name, const char *why)
{
  return kv_fail(KVDB_INVALID, "config '%s': %s", name, why);
}

/* Parse an unsigned decimal of at most max at *p; advances *p. -1 when none or too big. */
static long num(const char **p, long max)
{
  const char *s = *p;
  long v = 0;
  int n = 0;
  while (*s >= '0' && *s <= '9' && n < 9) {
    v = v * 10 + (*s - '0');
    s++;
    n++;
  }
  if (n == 0 || v > max || (*s >= '0' && *s <= '9'))
    return -1;
  *p = s;
  return v;
}

kvdb_status kvdb_config_parse(const char *name, kvdb_config *out)
{
  kv_clear_error();
  if (name == NULL || out == NULL)
    return kv_fail(KVDB_INVALID, "config name or out is NULL");
  kvdb_config c;
  memset(&c, 0, sizeof c);
  const char *p = name;
  if (strncmp(p, "raw", 3) == 0) {
    c.method = KVDB_METHOD_RAW;
    p += 3;
  } else if (strncmp(p, "lossless", 8) == 0) {
    c.method = KVDB_METHOD_LOSSLESS;
    p += 8;
  } else if (strncmp(p, "int", 3) == 0 || strncmp(p, "kivi", 4) == 0 ||
             strncmp(p, "kvquant", 7) == 0) {
    int q = p[0] == 'i' ? -1 : p[1] == 'i' ? KVDB_QUANT_KIVI : KVDB_QUANT_KVQUANT;
    p += q < 0 ? 3 : q == KVDB_QUANT_KIVI ? 4 : 7;
    long b = num(&p, 8);
    if (b != 8 && b != 4 && b != 2)
      return bad(name, "quantization is int8, int4 or int2 (kivi8/4/2, kvquant8/4/2)");
    c.method = KVDB_METHOD_QUANT;
    c.bits = (uint8_t)b;
    /* int4 and int2 are KVQuant, int8 KIVI (KIVI's per-token V costs little at 8 bits) */
    c.drop = (uint8_t)(q >= 0 ? q : b == 8 ? KVDB_QUANT_KIVI : KVDB_QUANT_KVQUANT);
  } else {
    int d = 0;
    for (int i = 1; i <= 3 && d == 0; i++)
      if (strncmp(p, DROP_NAME[i], strlen(DROP_NAME[i])) == 0)
        d = i;
    if (d == 0)
      return bad(name, "unknown method (raw, lossless, int8, int4, int2, knorm, keydiff, snapkv)");
    p += strlen(DROP_NAME[d]);
    long k = num(&p, 99);
    if (k < 0)
      return bad(name, "a drop method needs the kept percentage 1..99, e.g. knorm50");
    long permille = k * 10;
    if (*p == '.') { /* one decimal: knorm12.5 keeps 0.125 */
      p++;
      if (*p < '0' || *p > '9')
        return bad(name, "the kept percentage takes one decimal, e.g. knorm12.5");
      permille += *p++ - '0';
    }
    if (permille < 1 || permille > 999)
      return bad(name, "the kept percentage must be 0.1..99.9");
    c.method = KVDB_METHOD_DROP;
    c.drop = (uint8_t)d;
    c.keep_permille = (uint16_t)permille;
    if (strncmp(p, "+int", 4) == 0) {
      p += 4;
      long b = num(&p, 8);
      if (b != 8 && b != 4 && b != 2)
        return bad(name, "dropped rows quantize to +int8, +int4 or +int2");
      c.bits = (uint8_t)b;
    }
  }
  while (*p == ':') {
    char opt = p[1];
    p += 2;
    if (opt == 'g') {
      long g = num(&p, 4096);
      if (g <= 0)
        return bad(name, "group ':g' must be 1..4096");
      c.group = (uint16_t)g;
    } else if (opt == 'r') {
      long r = num(&p, 1L << 30);
      if (r < 0)
        return bad(name, "residual ':r' must be 0..2^30");
      c.residual = (uint32_t)r;
    } else if (opt == 'z') {
      int neg = *p == '-';
      p += neg;
      long z = num(&p, 22);
      if (z < 0 || (neg && z > 7) || z == 0)
        return bad(name, "zstd level ':z' must be -7..22 and not 0");
      c.zstd_level = (int8_t)(neg ? -z : z);
    } else {
      return bad(name, "unknown option (':g' group, ':r' residual, ':z' zstd level)");
    }
  }
  if (*p != 0)
    return bad(name, "unexpected characters at the end");
  KV_RET(kv_config_valid(&c, name));
  *out = c;
  return KVDB_OK;
}

/* What is wrong with a config, or NULL when it is valid. */
static const char *config_problem(const kvdb_config *c)
{
  switch (c->method) {
  case KVDB_METHOD_RAW:
  case KVDB_METHOD_LOSSLESS:
    if (c->bits || c->drop || c->keep_permille || c->group || c->residual)
      return "raw and lossless take no bits, drop method, keep share, group or residual";
    if (c->method == KVDB_METHOD_RAW && c->zstd_level)
      return "raw takes no zstd level";
    if (c->zstd_level < -7 || c->zstd_level > 22)
      return "zstd level must be -7..22";
    return NULL;
  case KVDB_METHOD_QUANT:
    if (c->bits != 8 && c->bits != 4 && c->bits != 2)
      return "bits must be 8, 4 or 2";
    if (c->drop != KVDB_QUANT_KIVI && c->drop != KVDB_QUANT_KVQUANT)
      return "quantizer must be 0 (kivi) or 1 (kvquant)";
    if (c->keep_permille)
      return "quantization takes no keep share";
    break;
  case KVDB_METHOD_DROP:
    if (c->drop < KVDB_DROP_KNORM || c->drop > KVDB_DROP_SNAPKV)
      return "drop method must be knorm, keydiff or snapkv";
    if (c->keep_permille < 1 || c->keep_permille > 999)
      return "keep share must be 1..999 per mille";
    if (c->bits != 0 && c->bits != 8 && c->bits != 4 && c->bits != 2)
      return "bits of kept rows must be 0, 8, 4 or 2";
    if (c->residual)
      return "residual applies to quantization (int8/int4/int2) only";
    break;
  default:
    return "unknown method";
  }
  if (c->zstd_level)
    return "only lossless takes a zstd level";
  if (c->bits == 0 && c->group)
    return "group applies to quantized rows only";
  return NULL;
}

kvdb_status kv_config_valid(const kvdb_config *c, const char *what)
{
  const char *why = config_problem(c);
  return why == NULL ? KVDB_OK : bad(what, why);
}

int kv_config_valid_quiet(const kvdb_config *c)
{
  return config_problem(c) == NULL ? 0 : -1;
}

kvdb_status kvdb_config_check(const kvdb_model *m, const kvdb_config *c)
{
  kv_clear_error();
  if (m == NULL || c == NULL)
    return kv_fail(KVDB_INVALID, "model or config is NULL");
  uint32_t bt;
  KV_RET(kv_check_model(m, &bt));
  char nm[48];
  kvdb_config_name(c, nm, sizeof nm);
  KV_RET(kv_config_valid(c, nm));
  if (c->group > bt)
    return kv_fail(KVDB_INVALID,
                   "config '%s': group %u is larger than the model's block_tokens %u (K is "
                   "quantized over groups of tokens of one block)",
                   nm, c->group, bt);
  if (m->score_bits != 0 && c->method == KVDB_METHOD_DROP)
    return kv_fail(KVDB_INVALID,
                   "config '%s' drops tokens, which model '%s' (score_bits %u) cannot: kvdb_score "
                   "ranks every token and kvdb_get_tokens must fetch the ones it picks",
                   nm, m->id, m->score_bits);
  return KVDB_OK;
}

char *kvdb_config_name(const kvdb_config *c, char *buf, size_t cap)
{
  if (buf == NULL || cap == 0)
    return buf;
  if (c == NULL || kv_config_valid_quiet(c) != 0) {
    snprintf(buf, cap, "?");
    return buf;
  }
  int n = 0;
  switch (c->method) {
  case KVDB_METHOD_RAW:
    n = snprintf(buf, cap, "raw");
    break;
  case KVDB_METHOD_LOSSLESS:
    n = snprintf(buf, cap, "lossless");
    break;
  case KVDB_METHOD_QUANT:
    if (c->drop == KVDB_QUANT_KVQUANT)
      n = snprintf(buf, cap, c->bits == 8 ? "kvquant%u" : "int%u", c->bits);
    else
      n = snprintf(buf, cap, c->bits == 8 ? "int%u" : "kivi%u", c->bits);
    break;
  default:
    if (c->keep_permille % 10 == 0)
      n = snprintf(buf, cap, "%s%u", DROP_NAME[c->drop], c->keep_permille / 10);
    else
      n = snprintf(buf, cap, "%s%u.%u", DROP_NAME[c->drop], c->keep_permille / 10,
                   c->keep_permille % 10);
    if (c->bits && n >= 0 && (size_t)n < cap)
      n += snprintf(buf + n, cap - (size_t)n, "+int%u", c->bits);
  }
  if (c->group && n >= 0 && (size_t)n < cap)
    n += snprintf(buf + n, cap - (size_t)n, ":g%u", c->group);
  if (c->residual && n >= 0 && (size_t)n < cap)
    n += snprintf(buf + n, cap - (size_t)n, ":r%u", c->residual);
  if (c->zstd_level && n >= 0 && (size_t)n < cap)
    snprintf(buf + n, cap - (size_t)n, ":z%d", c->zstd_level);
  return buf;
}

int kv_config_drops(const kvdb_config *c)
{
  return c->method == KVDB_METHOD_DROP;
}

/* ---- catalog encoding: 12 bytes ---- */

void kv_config_encode(const kvdb_config *c, uint8_t *p)
{
  p[0] = c->method;
  p[1] = c->bits;
  p[2] = c->drop;
  p[3] = (uint8_t)c->zstd_level;
  kv_put_le16(p + 4, c->keep_permille);
  kv_put_le16(p + 6, c->group);
  kv_put_le32(p + 8, c->residual);
}

kvdb_status kv_config_decode(const uint8_t *p, kvdb_config *c)
{
  memset(c, 0, sizeof *c);
  c->method = p[0];
  c->bits = p[1];
  c->drop = p[2];
  c->zstd_level = (int8_t)p[3];
  c->keep_permille = kv_get_le16(p + 4);
  c->group = kv_get_le16(p + 6);
  c->residual = kv_get_le32(p + 8);
  if (kv_config_valid_quiet(c) != 0)
    return kv_fail(KVDB_CORRUPT, "stored config is not valid (method %u, bits %u, drop %u)",
                   c->method, c->bits, c->drop);
  return KVDB_OK;
}

/* ---- codec parameters of one section ---- */

kvdb_status kv_config_section(const kvdb_config *c, const kv_block_geom *g, uint64_t ctx_tokens,
                              uint64_t t0, kv_section_codec *out)
{
  return kv_config_section_rope(c, g, ctx_tokens, t0, NULL, out);
}

kvdb_status kv_config_section_rope(const kvdb_config *c, const kv_block_geom *g,
                                   uint64_t ctx_tokens, uint64_t t0, const kv_model_rope *rope,
                                   kv_section_codec *out)
{
  memset(out, 0, sizeof *out);
  kv_codec_params_init(&out->params);
  int kvq = c->method == KVDB_METHOD_QUANT && c->drop == KVDB_QUANT_KVQUANT;
  switch (c->method) {
  case KVDB_METHOD_LOSSLESS:
    out->codec = kv_codec_by_id(KV_CODEC_ID_ZSTD_PLANES);
    out->params.zstd_level = c->zstd_level;
    break;
  case KVDB_METHOD_QUANT:
    out->codec = kv_codec_by_id(kvq ? KV_CODEC_ID_KVQUANT : KV_CODEC_ID_KIVI);
    out->params.bits = c->bits;
    if (kvq && rope != NULL && rope->style != KVDB_ROPE_NONE && g->head_dim % 2 == 0 &&
        t0 + g->n_tokens <= (1ull << 31)) {
      /* K before RoPE: token t of the context at position t (K sections only: cblock.c's
       * section_params clears these for V) */
      out->params.rope_base = rope->base;
      out->params.rope_style = rope->style == KVDB_ROPE_HALF ? KV_ROPE_HALF : KV_ROPE_ADJACENT;
      out->params.rope_pos0 = (uint32_t)t0;
    }
    break;
  case KVDB_METHOD_DROP:
    out->codec = kv_codec_by_id(KV_CODEC_ID_DROP);
    out->params.bits = c->bits;
    out->params.keep_permille = c->keep_permille;
    out->params.drop_method = (kv_drop_method)c->drop;
    break;
  default:
    return kv_fail(KVDB_INVALID, "raw blocks have no section codec");
  }
  if (out->codec == NULL)
    return kv_fail(KVDB_UNSUPPORTED, "codec for method %u is not in this build", c->method);
  if (out->params.bits) {
    /* a trailing partial block may hold fewer tokens than the group: its K groups shrink to
     * the block (each section header records the group it was coded with) */
    uint32_t grp = c->group ? c->group : kvq ? KV_CODEC_KVQ_GROUP_DEFAULT : KV_CODEC_GROUP_DEFAULT;
    /* dropping quantizes only the kept rows: K groups run along those (knorm50+int8 on a
     * 32-token block keeps 16 rows per head, so the default group of 32 becomes 16) */
    uint32_t rows = c->method == KVDB_METHOD_DROP
                        ? kv_drop_keep_count(g->n_tokens, c->keep_permille)
                        : g->n_tokens;
    out->group_k = grp < rows ? grp : rows;
    /* kivi's V groups run along channels, kvquant's along tokens like K's */
    uint32_t vlim = kvq ? rows : g->head_dim;
    out->group_v = grp < vlim ? grp : vlim;
  }
  if (c->method == KVDB_METHOD_QUANT && c->residual > 0) {
    /* the context's last `residual` tokens, as far as they fall in this block */
    uint64_t first_res = c->residual >= ctx_tokens ? 0 : ctx_tokens - c->residual;
    uint64_t end = t0 + g->n_tokens;
    if (end > first_res)
      out->params.residual = (unsigned)(end - (first_res > t0 ? first_res : t0));
  }
  return KVDB_OK;
}
