/* SPDX-License-Identifier: MIT */
/*
 * tools/refkv/refkv.c — the reference model's KV in kvdb (refkv.h).
 *
 * refmodel keeps K and V as two float arrays laid out [layer][pos][kv_dim] (refmodel.h), which
 * a kvdb_tensor_view describes directly: layer stride max_pos * kv_dim floats, token stride
 * kv_dim floats, head stride head_size floats, dims contiguous. So for float32 storage kvdb
 * reads from and writes into the model's cache with no copy; f16 and bf16 go through a packed
 * [layer][K,V][token][head][dim] staging buffer and a rounding conversion.
 */
#define _POSIX_C_SOURCE 200809L
#include "refkv.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#if defined(__GNUC__)
#define RK_PRINTF(f, a) __attribute__((format(printf, f, a)))
#else
#define RK_PRINTF(f, a)
#endif

static _Thread_local char errmsg_buf[1024];

static kvdb_status rk_fail(kvdb_status rc, const char *fmt, ...) RK_PRINTF(2, 3);
static kvdb_status rk_fail(kvdb_status rc, const char *fmt, ...)
{
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(errmsg_buf, sizeof errmsg_buf, fmt, ap);
  va_end(ap);
  return rc;
}

/* A failed kvdb call: keep its status and message. */
static kvdb_status rk_kvdb(kvdb_status rc, const char *what)
{
  return rk_fail(rc, "%s: %s: %s", what, kvdb_status_name(rc), kvdb_errmsg());
}

const char *refkv_errmsg(void)
{
  return errmsg_buf;
}

kvdb_status refkv_fail(kvdb_status rc, const char *fmt, ...)
{
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(errmsg_buf, sizeof errmsg_buf, fmt, ap);
  va_end(ap);
  return rc;
}

static double now_s(void)
{
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ---- storage configs --------------------------------------------------------------------- */

static const char *const storage_names[] = {"f32", "f16", "bf16"};

const char *refkv_storage_name(refkv_storage s)
{
  return (unsigned)s < sizeof storage_names / sizeof storage_names[0] ? storage_names[s] : NULL;
}

kvdb_status refkv_storage_parse(const char *name, refkv_storage *out)
{
  for (unsigned i = 0; name != NULL && i < sizeof storage_names / sizeof storage_names[0]; i++)
    if (strcmp(name, storage_names[i]) == 0) {
      *out = (refkv_storage)i;
      return KVDB_OK;
    }
  return rk_fail(KVDB_INVALID, "unknown storage '%s' (expected f32, f16 or bf16)",
                 name != NULL ? name : "(null)");
}

static kvdb_dtype storage_dtype(refkv_storage s)
{
  return s == REFKV_STORE_F16 ? KVDB_F16 : s == REFKV_STORE_BF16 ? KVDB_BF16 : KVDB_F32;
}

/* ---- conversions ------------------------------------------------------------------------- */

uint16_t refkv_f32_to_f16(float f)
{
  uint32_t x;
  memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000u, exp = (x >> 23) & 0xffu, man = x & 0x7fffffu;
  if (exp == 0xff) /* inf stays inf; NaN stays NaN (quiet bit set) */
    return (uint16_t)(sign | 0x7c00u | (man != 0 ? 0x200u | (man >> 13) : 0));
  int e = (int)exp - 127 + 15;
  if (e >= 0x1f)
    return (uint16_t)(sign | 0x7c00u);
  if (e <= 0) { /* an f16 subnormal or zero: value = m * 2^-24 */
    if (e < -10)
      return (uint16_t)sign;
    man |= 0x800000u;
    unsigned shift = (unsigned)(14 - e);
    uint32_t half = man >> shift, rem = man & ((1u << shift) - 1), mid = 1u << (shift - 1);
    if (rem > mid || (rem == mid && (half & 1u)))
      half++;
    return (uint16_t)(sign | half);
  }
  uint32_t half = sign | (uint32_t)e << 10 | man >> 13, rem = man & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (half & 1u)))
    half++; /* a carry into the exponent is right, up to infinity */
  return (uint16_t)half;
}

float refkv_f16_to_f32(uint16_t h)
{
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu, x;
  if (exp == 0 && man == 0) {
    x = sign;
  } else if (exp == 0) { /* subnormal: normalize */
    uint32_t e = 0;
    while ((man & 0x400u) == 0) {
      man <<= 1;
      e++;
    }
    x = sign | (113u - e) << 23 | (man & 0x3ffu) << 13;
  } else if (exp == 0x1f) {
    x = sign | 0x7f800000u | man << 13;
  } else {
    x = sign | (exp + 112u) << 23 | man << 13;
  }
  float f;
  memcpy(&f, &x, 4);
  return f;
}

uint16_t refkv_f32_to_bf16(float f)
{
  uint32_t x;
  memcpy(&x, &f, 4);
  if ((x & 0x7f800000u) == 0x7f800000u && (x & 0x7fffffu) != 0)
    return (uint16_t)((x >> 16) | 0x40u);
  x += 0x7fffu + ((x >> 16) & 1u);
  return (uint16_t)(x >> 16);
}

float refkv_bf16_to_f32(uint16_t h)
{
  uint32_t x = (uint32_t)h << 16;
  float f;
  memcpy(&f, &x, 4);
  return f;
}

/* ---- the model --------------------------------------------------------------------------- */

char *refkv_default_id(const char *name_hint, const refmodel_model *rm, char *out)
{
  char base[45] = "llama2c";
  if (name_hint != NULL && name_hint[0] != '\0') {
    const char *slash = strrchr(name_hint, '/');
    const char *b = slash != NULL ? slash + 1 : name_hint;
    size_t len = strlen(b);
    if (len > 4 && strcmp(b + len - 4, ".bin") == 0)
      len -= 4;
    if (len > 44)
      len = 44;
    if (len > 0) {
      memcpy(base, b, len);
      base[len] = '\0';
    }
  }
  snprintf(out, 64, "%s-%012llx", base, (unsigned long long)(refmodel_model_digest(rm) >> 16));
  return out;
}

kvdb_status refkv_model_init(refkv_model *out, const refmodel_model *rm, const char *id,
                             const char *name_hint, refkv_storage storage, uint32_t block_tokens)
{
  if (out == NULL || rm == NULL)
    return rk_fail(KVDB_INVALID, "refkv_model_init: %s is NULL", out == NULL ? "out" : "model");
  memset(out, 0, sizeof *out);
  if (refkv_storage_name(storage) == NULL)
    return rk_fail(KVDB_INVALID, "refkv_model_init: storage %d is not a refkv_storage",
                   (int)storage);
  if (id != NULL) {
    size_t len = strlen(id);
    if (len < 1 || len > 63)
      return rk_fail(KVDB_INVALID, "model id '%s' is %zu bytes (must be 1..63)", id, len);
    memcpy(out->id, id, len + 1);
  } else {
    refkv_default_id(name_hint, rm, out->id);
  }
  if (block_tokens == 0)
    block_tokens = 16;
  if (block_tokens < 16 || block_tokens > 4096 || (block_tokens & (block_tokens - 1)) != 0)
    return rk_fail(KVDB_INVALID, "block tokens %u (must be a power of two from 16 to 4096)",
                   block_tokens);
  const refmodel_config *c = refmodel_model_config(rm);
  out->rm = rm;
  out->storage = storage;
  out->kv_dim = (size_t)c->kv_dim;
  out->q_floats = (size_t)c->n_layers * (size_t)c->dim;
  out->km.id = out->id;
  out->km.n_layers = (uint32_t)c->n_layers;
  out->km.n_kv_heads = (uint32_t)c->n_kv_heads;
  out->km.head_dim = (uint32_t)c->head_size;
  out->km.dtype = storage_dtype(storage);
  out->km.block_tokens = block_tokens;
  if (kvdb_model_token_bytes(&out->km) == 0)
    return rk_fail(KVDB_INVALID,
                   "model shape %u layers x %u KV heads x head_dim %u is outside kvdb's limits",
                   out->km.n_layers, out->km.n_kv_heads, out->km.head_dim);
  return KVDB_OK;
}

void refkv_model_copy(refkv_model *dst, const refkv_model *src)
{
  *dst = *src;
  dst->km.id = dst->id;
}

kvdb_status refkv_model_set_config(refkv_model *m, const char *name)
{
  kvdb_config c;
  kvdb_status rc = kvdb_config_parse(name != NULL ? name : "", &c);
  if (rc != KVDB_OK) /* kvdb's message names the config */
    return rk_fail(rc, "%s", kvdb_errmsg());
  rc = kvdb_config_check(&m->km, &c);
  if (rc != KVDB_OK)
    return rk_fail(rc, "model %s: %s", m->id, kvdb_errmsg());
  m->config = c;
  return KVDB_OK;
}

int refkv_model_lossless(const refkv_model *m)
{
  return m->storage == REFKV_STORE_F32 &&
         (m->config.method == KVDB_METHOD_RAW || m->config.method == KVDB_METHOD_LOSSLESS);
}

char *refkv_model_describe(const refkv_model *m, char *buf, size_t cap)
{
  char name[64];
  kvdb_config_name(&m->config, name, sizeof name);
  snprintf(buf, cap, "%s %s", refkv_storage_name(m->storage), name);
  return buf;
}

size_t refkv_token_bytes(const refkv_model *m)
{
  return kvdb_model_token_bytes(&m->km);
}

/* The state's K and V cache as a kvdb view (float32, in place). */
static void state_view(const refkv_model *m, refmodel_state *st, kvdb_kv_view *v)
{
  size_t max_pos = (size_t)refmodel_state_max_pos(st);
  memset(v, 0, sizeof *v);
  v->k.base = refmodel_state_key(st, 0, 0);
  v->k.layer_stride = (int64_t)(max_pos * m->kv_dim * sizeof(float));
  v->k.token_stride = (int64_t)(m->kv_dim * sizeof(float));
  v->k.head_stride = (int64_t)(m->km.head_dim * sizeof(float));
  v->v = v->k;
  v->v.base = refmodel_state_value(st, 0, 0);
}

/*
 * Convert between the state's cache (positions [0, n)) and a packed LKTHD buffer of n tokens in
 * the stored 16-bit dtype. to_buf: state -> buffer.
 */
static void convert(const refkv_model *m, refmodel_state *st, uint16_t *buf, size_t n,
                    size_t n_copy, int to_buf)
{
  size_t kv_dim = m->kv_dim;
  int bf16 = m->storage == REFKV_STORE_BF16;
  for (uint32_t l = 0; l < m->km.n_layers; l++)
    for (int kv = 0; kv < 2; kv++) {
      uint16_t *b = buf + ((size_t)l * 2 + (size_t)kv) * n * kv_dim;
      for (size_t t = 0; t < n_copy; t++) {
        float *f = kv == 0 ? refmodel_state_key(st, (int)l, (int)t)
                           : refmodel_state_value(st, (int)l, (int)t);
        uint16_t *bt = b + t * kv_dim;
        if (to_buf)
          for (size_t i = 0; i < kv_dim; i++)
            bt[i] = bf16 ? refkv_f32_to_bf16(f[i]) : refkv_f32_to_f16(f[i]);
        else
          for (size_t i = 0; i < kv_dim; i++)
            f[i] = bf16 ? refkv_bf16_to_f32(bt[i]) : refkv_f16_to_f32(bt[i]);
      }
    }
}

static kvdb_status check_call(const refkv_model *m, refmodel_state *st, const uint32_t *tokens,
                              size_t n, const char *fn)
{
  if (m == NULL || st == NULL || tokens == NULL)
    return rk_fail(KVDB_INVALID, "%s: %s is NULL", fn,
                   m == NULL    ? "model"
                   : st == NULL ? "state"
                                : "tokens");
  if (n < 1 || n > (size_t)refmodel_state_max_pos(st))
    return rk_fail(KVDB_INVALID, "%s: %zu tokens (the state holds 1..%d)", fn, n,
                   refmodel_state_max_pos(st));
  return KVDB_OK;
}

kvdb_status refkv_put(kvdb *db, const refkv_model *m, refmodel_state *st, const uint32_t *tokens,
                      size_t n, kvdb_put_info *info)
{
  return refkv_put_ex(db, m, st, tokens, n, NULL, 0, 0, info);
}

kvdb_status refkv_put_ex(kvdb *db, const refkv_model *m, refmodel_state *st, const uint32_t *tokens,
                         size_t n, const float *queries, uint32_t n_queries, int profile,
                         kvdb_put_info *info)
{
  kvdb_status rc = check_call(m, st, tokens, n, "refkv_put");
  if (rc != KVDB_OK)
    return rc;
  if (n_queries > 0 && queries == NULL)
    return rk_fail(KVDB_INVALID, "refkv_put: %u queries but queries is NULL", n_queries);
  kvdb_put_opts po;
  kvdb_put_opts_init(&po);
  po.config = m->config;
  po.flags = profile ? KVDB_PUT_PROFILE : 0;
  po.queries = queries;
  po.n_queries = n_queries;
  po.n_q_heads = (uint32_t)refmodel_model_config(m->rm)->n_heads;
  kvdb_kv_view v;
  uint16_t *buf = NULL;
  if (m->storage == REFKV_STORE_F32) {
    state_view(m, st, &v);
  } else {
    buf = malloc(n * refkv_token_bytes(m));
    if (buf == NULL)
      return rk_fail(KVDB_NOMEM, "refkv_put: out of memory for %zu tokens", n);
    convert(m, st, buf, n, n, 1);
    kvdb_kv_view_packed(&v, buf, &m->km, n, KVDB_LAYOUT_LKTHD);
  }
  rc = kvdb_put_ex(db, &m->km, tokens, n, &v, &po, info);
  free(buf);
  return rc == KVDB_OK ? KVDB_OK : rk_kvdb(rc, "kvdb_put");
}

kvdb_status refkv_prefill_queries(const refkv_model *m, refmodel_state *st, const int *tokens,
                                  size_t n, size_t start, uint32_t n_queries, float *queries,
                                  uint32_t *got)
{
  *got = 0;
  if (m == NULL || st == NULL || tokens == NULL || start >= n || (n_queries > 0 && queries == NULL))
    return rk_fail(KVDB_INVALID, "refkv_prefill_queries: bad arguments (start %zu, n %zu)", start,
                   n);
  size_t q = n - start < n_queries ? n - start : n_queries;
  size_t bulk = n - start - q;
  int rc = REFMODEL_OK;
  if (bulk > 0)
    rc = refmodel_prefill(st, tokens + start, (int)bulk, (int)start, NULL);
  const refmodel_config *c = refmodel_model_config(m->rm);
  size_t dim = (size_t)c->dim;
  for (size_t i = 0; rc == REFMODEL_OK && i < q; i++) {
    size_t pos = start + bulk + i;
    rc = refmodel_forward(st, tokens[pos], (int)pos, NULL);
    for (int l = 0; rc == REFMODEL_OK && l < c->n_layers; l++)
      memcpy(queries + i * m->q_floats + (size_t)l * dim, refmodel_state_query(st, l),
             dim * sizeof(float));
  }
  if (rc != REFMODEL_OK)
    return rk_fail(KVDB_INVALID, "refkv_prefill_queries: %s: %s", refmodel_strerror(rc),
                   refmodel_errmsg());
  *got = (uint32_t)q;
  return KVDB_OK;
}

kvdb_status refkv_report_quality(kvdb *db, const refkv_model *m, const uint32_t *tokens, size_t n,
                                 double quality)
{
  if (m == NULL || tokens == NULL || n < 1)
    return rk_fail(KVDB_INVALID, "refkv_report_quality: bad arguments");
  size_t nb = (n + m->km.block_tokens - 1) / m->km.block_tokens;
  kvdb_key *h = malloc(nb * sizeof *h);
  if (h == NULL)
    return rk_fail(KVDB_NOMEM, "refkv_report_quality: out of memory");
  kvdb_status rc = kvdb_chain_hashes(&m->km, tokens, n, h, nb);
  if (rc == KVDB_OK)
    rc = kvdb_report_quality(db, &h[nb - 1], &m->config, quality);
  free(h);
  return rc == KVDB_OK ? KVDB_OK : rk_kvdb(rc, "kvdb_report_quality");
}

/* Element i of a packed buffer in the stored dtype, as float32. */
static float stored_elem(const refkv_model *m, const void *buf, size_t i)
{
  if (m->storage == REFKV_STORE_F32)
    return ((const float *)buf)[i];
  uint16_t h = ((const uint16_t *)buf)[i];
  return m->storage == REFKV_STORE_BF16 ? refkv_bf16_to_f32(h) : refkv_f16_to_f32(h);
}

/*
 * Token-dropping configs (KVDB_METHOD_DROP). kvdb_get delivers no block stored with dropped rows,
 * so the longest stored prefix of tokens[0..n_search) is read with kvdb_get_kept: each kept row
 * at its position, and a mask of the absent ones per layer and KV head. Kept rows go into st's
 * cache; absent ones are zeroed and marked absent for the query heads of their KV head
 * (refmodel_state_set_absent), so the model attends as it would over the compressed cache.
 * Positions [0, *hit) are restored, *hit = min(the prefix hit, limit).
 */
static kvdb_status get_dropped(kvdb *db, const refkv_model *m, refmodel_state *st,
                               const uint32_t *tokens, size_t n_search, size_t limit, size_t *hit)
{
  size_t n_lh = (size_t)m->km.n_layers * m->km.n_kv_heads, hd = m->km.head_dim;
  size_t len = n_search;
  void *buf = malloc(len * refkv_token_bytes(m));
  uint8_t *present = malloc(n_lh * len);
  kvdb_status rc = KVDB_OK;
  if (buf == NULL || present == NULL) {
    rc = rk_fail(KVDB_NOMEM, "refkv_get: out of memory for %zu tokens", len);
    goto done;
  }
  kvdb_kv_view v;
  kvdb_kv_view_packed(&v, buf, &m->km, len, KVDB_LAYOUT_LKTHD);
  size_t got = 0, kept = 0;
  rc = kvdb_get_kept(db, &m->km, tokens, len, &v, present, n_lh * len, &got, &kept);
  if (rc != KVDB_OK) {
    rc = rk_kvdb(rc, "kvdb_get_kept");
    goto done;
  }
  size_t upto = got < limit ? got : limit;
  for (size_t l = 0; l < m->km.n_layers; l++) {
    for (size_t t = 0; t < upto; t++) { /* everything zero, then the kept rows */
      memset(refmodel_state_key(st, (int)l, (int)t), 0, m->kv_dim * sizeof(float));
      memset(refmodel_state_value(st, (int)l, (int)t), 0, m->kv_dim * sizeof(float));
    }
    for (size_t g = 0; g < m->km.n_kv_heads; g++) {
      size_t lh = l * m->km.n_kv_heads + g;
      for (size_t t = 0; t < upto; t++) {
        if (!present[lh * len + t]) {
          if (refmodel_state_set_absent(st, (int)l, (int)g, (int)t, 1) != REFMODEL_OK) {
            rc = rk_fail(KVDB_NOMEM, "refkv_get: %s", refmodel_errmsg());
            goto done;
          }
          continue;
        }
        float *k = refmodel_state_key(st, (int)l, (int)t) + g * hd;
        float *vv = refmodel_state_value(st, (int)l, (int)t) + g * hd;
        size_t kb = ((l * 2 + 0) * len + t) * m->kv_dim + g * hd;
        size_t vb = ((l * 2 + 1) * len + t) * m->kv_dim + g * hd;
        for (size_t d = 0; d < hd; d++) {
          k[d] = stored_elem(m, buf, kb + d);
          vv[d] = stored_elem(m, buf, vb + d);
        }
      }
    }
  }
  *hit = upto;
done:
  free(buf);
  free(present);
  return rc;
}

kvdb_status refkv_get(kvdb *db, const refkv_model *m, refmodel_state *st, const uint32_t *tokens,
                      size_t n, size_t *hit)
{
  kvdb_status rc = check_call(m, st, tokens, n, "refkv_get");
  if (rc != KVDB_OK)
    return rc;
  if (hit == NULL)
    return rk_fail(KVDB_INVALID, "refkv_get: hit is NULL");
  *hit = 0;
  refmodel_state_clear_absent(st);
  if (m->config.method == KVDB_METHOD_DROP)
    return get_dropped(db, m, st, tokens, n, n, hit);
  kvdb_kv_view v;
  uint16_t *buf = NULL;
  if (m->storage == REFKV_STORE_F32) {
    state_view(m, st, &v);
  } else {
    buf = malloc(n * refkv_token_bytes(m));
    if (buf == NULL)
      return rk_fail(KVDB_NOMEM, "refkv_get: out of memory for %zu tokens", n);
    kvdb_kv_view_packed(&v, buf, &m->km, n, KVDB_LAYOUT_LKTHD);
  }
  size_t h = 0;
  rc = kvdb_get(db, &m->km, tokens, n, &v, &h);
  if (rc == KVDB_OK && buf != NULL)
    convert(m, st, buf, n, h, 0);
  free(buf);
  if (rc != KVDB_OK)
    return rk_kvdb(rc, "kvdb_get");
  *hit = h;
  return KVDB_OK;
}

/* ---- continuing a prompt ------------------------------------------------------------------ */

/* prompt[0..n) as kvdb tokens in a new array (*out), each checked against the vocabulary. */
static kvdb_status prompt_tokens(const refkv_model *m, const int *prompt, size_t n, const char *fn,
                                 uint32_t **out)
{
  *out = NULL;
  int vocab = refmodel_model_config(m->rm)->vocab_size;
  for (size_t i = 0; i < n; i++)
    if (prompt[i] < 0 || prompt[i] >= vocab)
      return rk_fail(KVDB_INVALID, "%s: prompt token %zu is %d (the vocabulary is 0..%d)", fn, i,
                     prompt[i], vocab - 1);
  uint32_t *u = malloc((n > 0 ? n : 1) * sizeof *u);
  if (u == NULL)
    return rk_fail(KVDB_NOMEM, "%s: out of memory", fn);
  for (size_t i = 0; i < n; i++)
    u[i] = (uint32_t)prompt[i];
  *out = u;
  return KVDB_OK;
}

static kvdb_status rm_err(int rc, const char *what)
{
  return rk_fail(rc == REFMODEL_ENOMEM ? KVDB_NOMEM : KVDB_INVALID, "%s: %s: %s", what,
                 refmodel_strerror(rc), refmodel_errmsg());
}

/*
 * Bring `st` to the state after feeding prompt[0..n): the stored prefix of prompt[0..n-1) from db
 * (when db is not NULL), the rest computed. *hit receives the restored length.
 */
static kvdb_status restore_and_prefill(kvdb *db, const refkv_model *m, refmodel_state *st,
                                       const int *prompt, const uint32_t *utok, size_t n,
                                       size_t *hit, double *get_s, double *prefill_s)
{
  double t0 = now_s();
  *hit = 0;
  refmodel_state_clear_absent(st);
  if (db != NULL && n > 1) {
    /* A dropped context is found by its key, so the whole prompt is searched: a stored context
     * of all n tokens restores n - 1 of them (the last is always fed). */
    kvdb_status rc = m->config.method == KVDB_METHOD_DROP
                         ? get_dropped(db, m, st, utok, n, n - 1, hit)
                         : refkv_get(db, m, st, utok, n - 1, hit);
    if (rc != KVDB_OK)
      return rc;
  }
  double t1 = now_s();
  int rc = refmodel_prefill(st, prompt + *hit, (int)(n - *hit), (int)*hit, NULL);
  if (rc != REFMODEL_OK)
    return rm_err(rc, "refmodel_prefill");
  if (get_s != NULL)
    *get_s = t1 - t0;
  if (prefill_s != NULL)
    *prefill_s = now_s() - t1;
  return KVDB_OK;
}

kvdb_status refkv_continue(kvdb *db, const refkv_model *m, refmodel_state *st, const int *prompt,
                           size_t n, int max_new, int stop_token, int *out, refkv_run *run)
{
  if (m == NULL || st == NULL || prompt == NULL || out == NULL)
    return rk_fail(KVDB_INVALID, "refkv_continue: a required argument is NULL");
  if (n < 1 || max_new < 1 || n + (size_t)max_new - 1 > (size_t)refmodel_state_max_pos(st))
    return rk_fail(KVDB_INVALID,
                   "refkv_continue: %zu prompt tokens + %d new need %zu positions (the state "
                   "holds %d; n and max_new must be >= 1)",
                   n, max_new, n + (size_t)(max_new > 0 ? max_new : 1) - 1,
                   refmodel_state_max_pos(st));
  uint32_t *utok;
  kvdb_status rc = prompt_tokens(m, prompt, n, "refkv_continue", &utok);
  if (rc != KVDB_OK)
    return rc;
  refkv_run r;
  memset(&r, 0, sizeof r);
  r.prompt_tokens = n;
  double t0 = now_s();
  rc = restore_and_prefill(db, m, st, prompt, utok, n, &r.hit_tokens, &r.get_s, &r.prefill_s);
  free(utok);
  if (rc != KVDB_OK)
    return rc;
  int vocab = refmodel_model_config(m->rm)->vocab_size;
  int first = refmodel_argmax(refmodel_state_logits(st), vocab);
  double t1 = now_s();
  r.ttft_s = t1 - t0;
  r.prefill_tokens = n - r.hit_tokens;
  if (first != stop_token || stop_token < 0) {
    out[0] = first;
    r.n_generated = 1;
    if (max_new > 1) {
      int k = 0;
      int grc = refmodel_generate(st, first, (int)n, max_new - 1, stop_token, out + 1, &k);
      if (grc != REFMODEL_OK)
        return rm_err(grc, "refmodel_generate");
      r.n_generated += (size_t)k;
    }
  }
  r.generate_s = now_s() - t1;
  if (run != NULL)
    *run = r;
  return KVDB_OK;
}

/* KL(p || q) of the softmaxes of two logit vectors, in nats (double). */
static double kl_logits(const float *lp_logits, const float *lq_logits, float *lp, float *lq,
                        int vocab)
{
  refmodel_log_softmax(lp_logits, vocab, lp);
  refmodel_log_softmax(lq_logits, vocab, lq);
  double kl = 0;
  for (int i = 0; i < vocab; i++)
    kl += exp((double)lp[i]) * ((double)lp[i] - (double)lq[i]);
  return kl > 0 ? kl : 0; /* rounding can give -1e-12 for equal distributions */
}

kvdb_status refkv_quality_measure(kvdb *db, const refkv_model *m, refmodel_state *ref,
                                  refmodel_state *test, const int *prompt, size_t n, int steps,
                                  refkv_quality *out)
{
  if (m == NULL || ref == NULL || test == NULL || prompt == NULL || out == NULL)
    return rk_fail(KVDB_INVALID, "refkv_quality_measure: a required argument is NULL");
  size_t need = n + (size_t)(steps > 0 ? steps : 1) - 1;
  if (n < 1 || steps < 1 || need > (size_t)refmodel_state_max_pos(ref) ||
      need > (size_t)refmodel_state_max_pos(test))
    return rk_fail(KVDB_INVALID,
                   "refkv_quality_measure: %zu prompt tokens and %d steps need %zu positions "
                   "(the states hold %d and %d)",
                   n, steps, need, refmodel_state_max_pos(ref), refmodel_state_max_pos(test));
  uint32_t *utok;
  kvdb_status rc = prompt_tokens(m, prompt, n, "refkv_quality_measure", &utok);
  if (rc != KVDB_OK)
    return rc;
  int vocab = refmodel_model_config(m->rm)->vocab_size;
  float *lp = malloc((size_t)vocab * sizeof *lp), *lq = malloc((size_t)vocab * sizeof *lq);
  refkv_quality q;
  memset(&q, 0, sizeof q);
  if (lp == NULL || lq == NULL) {
    rc = rk_fail(KVDB_NOMEM, "refkv_quality_measure: out of memory");
    goto done;
  }
  size_t unused;
  if ((rc = restore_and_prefill(NULL, m, ref, prompt, utok, n, &unused, NULL, NULL)) != KVDB_OK ||
      (rc = restore_and_prefill(db, m, test, prompt, utok, n, &q.hit_tokens, NULL, NULL)) !=
          KVDB_OK)
    goto done;
  for (int s = 0; s < steps; s++) {
    const float *a = refmodel_state_logits(ref), *b = refmodel_state_logits(test);
    int next = refmodel_argmax(a, vocab);
    q.agree += next == refmodel_argmax(b, vocab);
    double kl = kl_logits(a, b, lp, lq, vocab);
    q.mean_kl += kl;
    if (kl > q.max_kl)
      q.max_kl = kl;
    q.steps++;
    if (s + 1 < steps) {
      int r1 = refmodel_forward(ref, next, (int)n + s, NULL);
      int r2 = r1 == REFMODEL_OK ? refmodel_forward(test, next, (int)n + s, NULL) : r1;
      if (r2 != REFMODEL_OK) {
        rc = rm_err(r2, "refmodel_forward");
        goto done;
      }
    }
  }
  q.mean_kl /= q.steps;
  q.agreement = (double)q.agree / q.steps;
  *out = q;
done:
  free(utok);
  free(lp);
  free(lq);
  return rc;
}
