/* SPDX-License-Identifier: MIT */
/*
 * engine/model/model.c — what every layer checks and hashes about a model and a caller's
 * view, with no handle: kv_check_model / kv_check_n_tokens / kv_check_view(_extent), the
 * model fingerprint h_{-1} (kv_model_hash), the block chain hash (kv_chain_hash), and the
 * public helpers built on them (kvdb_chain_hashes, kvdb_block_context, kvdb_kv_view_packed,
 * kvdb_model_token_bytes, kvdb_key_hex, kvdb_key_parse).
 */
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>

#include "model.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "kvdb hashes token arrays as stored in memory: a big-endian port must convert them"
#endif

kvdb_status kv_check_model(const kvdb_model *m, uint32_t *bt)
{
  *bt = 0;
  if (m == NULL)
    return kv_fail(KVDB_INVALID, "model is NULL");
  if (m->id == NULL || m->id[0] == 0 || strlen(m->id) > 63)
    return kv_fail(KVDB_INVALID, "model id must be 1..63 bytes");
  *bt = m->block_tokens ? m->block_tokens : 256;
  kv_block_geom g;
  kvdb_status rc = kv_block_geom_init(&g, m->n_layers, m->n_kv_heads, m->head_dim, m->dtype, *bt, 1);
  if (rc != KVDB_OK)
    return kv_fail(rc, "model '%s': %s", m->id, kvdb_errmsg());
  if (m->score_bits != 0 && m->score_bits != 8 && m->score_bits != 4)
    return kv_fail(KVDB_INVALID, "model '%s': score_bits %u is not 0, 8 or 4", m->id,
                   m->score_bits);
  if (m->score_bits == 4 && m->head_dim % 2 != 0)
    return kv_fail(KVDB_INVALID, "model '%s': int4 score copies need an even head_dim, not %u",
                   m->id, m->head_dim);
  return kv_check_rope(m);
}

kvdb_status kv_check_rope(const kvdb_model *m)
{
  if (m->rope_style == KVDB_ROPE_NONE && m->rope_base == 0.0f)
    return KVDB_OK;
  if (m->rope_style != KVDB_ROPE_ADJACENT && m->rope_style != KVDB_ROPE_HALF)
    return kv_fail(KVDB_INVALID,
                   "model '%s': rope_style %u is not 0 (none), 1 (adjacent pairs) or 2 (half "
                   "pairs), or rope_base is set without a style",
                   m->id, m->rope_style);
  if (!(m->rope_base > 1.0f && m->rope_base <= 1e9f))
    return kv_fail(KVDB_INVALID, "model '%s': rope_base %g is not in (1, 1e9]", m->id,
                   (double)m->rope_base);
  if (m->head_dim % 2 != 0)
    return kv_fail(KVDB_INVALID, "model '%s': RoPE needs an even head_dim, not %u", m->id,
                   m->head_dim);
  return KVDB_OK;
}

kvdb_status kv_check_n_tokens(size_t n)
{
  if (n > KV_MAX_TOKENS)
    return kv_fail(KVDB_INVALID, "n %zu is too large: a context holds at most %zu tokens", n,
                   (size_t)KV_MAX_TOKENS);
  return KVDB_OK;
}

size_t kvdb_model_token_bytes(const kvdb_model *m)
{
  uint32_t bt;
  if (kv_check_model(m, &bt) != KVDB_OK)
    return 0;
  return (size_t)m->n_layers * m->n_kv_heads * m->head_dim * 2 * kv_dtype_bytes(m->dtype);
}

void kv_model_hash(const kvdb_model *m, uint32_t bt, uint8_t out[16])
{
  uint8_t buf[128];
  size_t idl = strlen(m->id);
  memcpy(buf, "kvdb-model-v1", 14);
  memcpy(buf + 14, m->id, idl + 1);
  uint8_t *p = buf + 15 + idl;
  kv_put_le32(p, m->n_layers);
  kv_put_le32(p + 4, m->n_kv_heads);
  kv_put_le32(p + 8, m->head_dim);
  kv_put_le32(p + 12, m->dtype);
  kv_put_le32(p + 16, bt);
  size_t len = (size_t)(p + 20 - buf);
  if (m->score_bits != 0) { /* appended only when set: fingerprints without it are unchanged */
    kv_put_le32(p + 20, m->score_bits);
    len += 4;
  }
  XXH128_canonical_t c;
  XXH128_canonicalFromHash(&c, XXH3_128bits(buf, len));
  memcpy(out, c.digest, 16);
}

void kv_chain_hash(const uint8_t parent[16], const uint32_t *tokens, size_t n, uint8_t out[16])
{
  XXH3_state_t st;
  XXH3_128bits_reset(&st);
  XXH3_128bits_update(&st, parent, 16);
  XXH3_128bits_update(&st, tokens, n * sizeof *tokens);
  XXH128_canonical_t c;
  XXH128_canonicalFromHash(&c, XXH3_128bits_digest(&st));
  memcpy(out, c.digest, 16);
}

kvdb_status kvdb_chain_hashes(const kvdb_model *m, const uint32_t *tokens, size_t n,
                              kvdb_key *hashes, size_t hashes_cap)
{
  kv_clear_error();
  uint32_t bt;
  KV_RET(kv_check_model(m, &bt));
  if (tokens == NULL || n == 0 || hashes == NULL)
    return kv_fail(KVDB_INVALID, "tokens, n and hashes must be non-NULL and non-zero");
  size_t nb = n / bt + (n % bt != 0); /* n + bt - 1 would wrap for n near SIZE_MAX */
  if (hashes_cap < nb)
    return kv_fail(KVDB_INVALID, "hashes_cap %zu < %zu blocks", hashes_cap, nb);
  uint8_t prev[16];
  kv_model_hash(m, bt, prev);
  for (size_t i = 0; i < nb; i++) {
    size_t len = (i + 1) * bt <= n ? bt : n - i * bt;
    kv_chain_hash(prev, tokens + i * bt, len, hashes[i].b);
    memcpy(prev, hashes[i].b, 16);
  }
  return KVDB_OK;
}

kvdb_status kvdb_block_context(const kvdb_model *m, const kvdb_key *key, kvdb_key *context)
{
  kv_clear_error();
  uint32_t bt;
  KV_RET(kv_check_model(m, &bt));
  if (key == NULL || context == NULL)
    return kv_fail(KVDB_INVALID, "key and context must be non-NULL");
  uint8_t buf[16 + 16 + 16];
  memcpy(buf, "kvdb-explicit-v1", 16);
  kv_model_hash(m, bt, buf + 16);
  memcpy(buf + 32, key->b, 16);
  XXH128_canonical_t c;
  XXH128_canonicalFromHash(&c, XXH3_128bits(buf, sizeof buf));
  memcpy(context->b, c.digest, 16);
  return KVDB_OK;
}

kvdb_status kvdb_kv_view_packed(kvdb_kv_view *view, void *base, const kvdb_model *m,
                                size_t n_tokens, kvdb_layout layout)
{
  kv_clear_error();
  uint32_t bt;
  if (view == NULL || base == NULL)
    return kv_fail(KVDB_INVALID, "view and base must be non-NULL");
  KV_RET(kv_check_model(m, &bt));
  int64_t eb = kv_dtype_bytes(m->dtype), d = m->head_dim, h = m->n_kv_heads;
  if (n_tokens > (uint64_t)INT64_MAX / ((uint64_t)2 * m->n_layers * h * d * eb))
    return kv_fail(KVDB_INVALID, "n_tokens %zu: a packed buffer of that many tokens would be "
                   "larger than 2^63 bytes", n_tokens);
  int64_t half = (int64_t)n_tokens * h * d * eb; /* bytes of K (or V) of one layer */
  memset(view, 0, sizeof *view);
  switch (layout) {
  case KVDB_LAYOUT_LKTHD:
    view->k.token_stride = h * d * eb;
    view->k.head_stride = d * eb;
    break;
  case KVDB_LAYOUT_LKHTD:
    view->k.token_stride = d * eb;
    view->k.head_stride = (int64_t)n_tokens * d * eb;
    break;
  default:
    return kv_fail(KVDB_INVALID, "layout %d is not KVDB_LAYOUT_LKTHD or KVDB_LAYOUT_LKHTD",
                   (int)layout);
  }
  view->k.base = base;
  view->k.layer_stride = 2 * half;
  view->k.dim_stride = eb;
  view->v = view->k;
  view->v.base = (uint8_t *)base + half;
  return KVDB_OK;
}

char *kvdb_key_hex(const kvdb_key *key, char *buf)
{
  return kv_hex16(key->b, buf);
}

kvdb_status kvdb_key_parse(const char *hex, kvdb_key *out)
{
  kv_clear_error();
  if (hex == NULL || out == NULL || strlen(hex) != 32)
    return kv_fail(KVDB_INVALID, "a key is 32 hex digits");
  for (int i = 0; i < 16; i++) {
    unsigned v = 0;
    for (int j = 0; j < 2; j++) {
      char c = hex[2 * i + j];
      unsigned x = c >= '0' && c <= '9'   ? (unsigned)(c - '0')
                   : c >= 'a' && c <= 'f' ? (unsigned)(c - 'a' + 10)
                   : c >= 'A' && c <= 'F' ? (unsigned)(c - 'A' + 10)
                                          : 99u;
      if (x > 15)
        return kv_fail(KVDB_INVALID, "'%s' is not a hex key", hex);
      v = v * 16 + x;
    }
    out->b[i] = (uint8_t)v;
  }
  return KVDB_OK;
}

kvdb_status kv_check_view(const kvdb_kv_view *v, const kvdb_model *m, const char *what)
{
  if (v == NULL)
    return kv_fail(KVDB_INVALID, "%s view is NULL", what);
  const kvdb_tensor_view *t[2] = {&v->k, &v->v};
  for (int i = 0; i < 2; i++) {
    if (t[i]->base == NULL && t[i]->layer_bases == NULL)
      return kv_fail(KVDB_INVALID, "%s view: %s has neither base nor layer_bases", what,
                     i ? "v" : "k");
    if (t[i]->layer_bases != NULL)
      for (uint32_t l = 0; l < m->n_layers; l++)
        if (t[i]->layer_bases[l] == NULL)
          return kv_fail(KVDB_INVALID, "%s view: %s.layer_bases[%u] is NULL", what,
                         i ? "v" : "k", l);
  }
  return KVDB_OK;
}

/* Whether the byte offsets a view gives for n_tokens tokens stay within int64 (each element's
 * offset is a sum of index x stride products computed in int64: caller strides that overflow
 * it would address anything). */
kvdb_status kv_check_view_extent(const kvdb_kv_view *v, const kvdb_model *m, uint64_t n_tokens,
                                 const char *what)
{
  const kvdb_tensor_view *t[2] = {&v->k, &v->v};
  uint64_t idx[4] = {m->n_layers - 1, n_tokens ? n_tokens - 1 : 0, m->n_kv_heads - 1,
                     m->head_dim - 1};
  for (int i = 0; i < 2; i++) {
    int64_t st[4] = {t[i]->layer_bases ? 0 : t[i]->layer_stride, t[i]->token_stride,
                     t[i]->head_stride, t[i]->dim_stride};
    uint64_t sum = 0, term;
    int over = 0;
    for (int d = 0; d < 4 && !over; d++) {
      uint64_t a = st[d] < 0 ? (uint64_t)0 - (uint64_t)st[d] : (uint64_t)st[d];
      over = __builtin_mul_overflow(a, idx[d], &term) || __builtin_add_overflow(sum, term, &sum);
    }
    if (over || sum > (uint64_t)INT64_MAX - 8)
      return kv_fail(KVDB_INVALID, "%s view: %s's strides for %" PRIu64 " tokens address more than "
                     "2^63 bytes", what, i ? "v" : "k", n_tokens);
  }
  return KVDB_OK;
}

