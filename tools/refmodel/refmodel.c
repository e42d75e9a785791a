/* SPDX-License-Identifier: MIT */
/*
 * tools/refmodel/refmodel.c — llama2.c v0 checkpoint loader and float32 CPU forward pass.
 *
 * The checkpoint is read into one float array (little-endian on disk, swapped on big-endian
 * hosts) after the header has been bounded and the byte count it implies compared with the
 * file's. The forward pass follows llama2.c's run.c (see shared/models/README.md). It differs
 * only in rounding details: RMSNorm sums are accumulated in double and RoPE angles computed in
 * double (closer to a float64 pass), and the softmax divides the weighted sum of values once
 * instead of dividing each weight. Dot products, sums and the weighted sum of values use eight
 * independent accumulators so that -O2 vectorizes them without -ffast-math.
 *
 * Also home of the per-thread error message shared with tokenizer.c (rm_fail()).
 */
#include "refmodel.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(__GNUC__)
#define RM_PRINTF(f, a) __attribute__((format(printf, f, a)))
#else
#define RM_PRINTF(f, a)
#endif

/* Shared with tokenizer.c (which repeats this prototype): record a message, return rc. */
int rm_fail(int rc, const char *fmt, ...) RM_PRINTF(2, 3);

#define HEADER_BYTES 28

struct refmodel_model {
  refmodel_config cfg;
  uint64_t digest; /* refmodel_model_digest(): of the header and weight bytes as stored */
  float *data;     /* every tensor of the file, back to back */
  const float *tok_emb, *rms_att, *wq, *wk, *wv, *wo, *rms_ffn, *w1, *w2, *w3, *rms_final;
  const float *wcls; /* tok_emb when the classifier is shared */
};

struct refmodel_state {
  const refmodel_model *m;
  int max_pos;
  float *x, *xb, *xb2, *hb, *hb2;     /* activations */
  float *q;                           /* [n_layers][dim]: each layer's query of the last step */
  float *att;                         /* [n_heads][max_pos] attention weights */
  float *rope_cos, *rope_sin;         /* [head_size / 2] for the current position */
  float *logits;                      /* [vocab_size] */
  uint8_t *absent; /* NULL, or [n_layers][n_kv_heads][max_pos]: 1 = row dropped (set_absent) */
  int *sp_slot;                       /* NULL, or [max_pos], all -1 between sparse heads */
  float *sp_k, *sp_v;                 /* NULL, or [max_pos][head_size]: gathered rows */
  float *key_cache, *value_cache;     /* [n_layers][max_pos][kv_dim] each */
};

/* ---- errors ---------------------------------------------------------------------------- */

static _Thread_local char errmsg_buf[1024];

int rm_fail(int rc, const char *fmt, ...)
{
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(errmsg_buf, sizeof errmsg_buf, fmt, ap);
  va_end(ap);
  return rc;
}

const char *refmodel_errmsg(void)
{
  return errmsg_buf;
}

const char *refmodel_strerror(int rc)
{
  switch (rc) {
  case REFMODEL_OK:
    return "REFMODEL_OK";
  case REFMODEL_EIO:
    return "REFMODEL_EIO";
  case REFMODEL_ENOMEM:
    return "REFMODEL_ENOMEM";
  case REFMODEL_EFORMAT:
    return "REFMODEL_EFORMAT";
  case REFMODEL_ETRUNCATED:
    return "REFMODEL_ETRUNCATED";
  case REFMODEL_EINVAL:
    return "REFMODEL_EINVAL";
  case REFMODEL_ENOSPC:
    return "REFMODEL_ENOSPC";
  case REFMODEL_EABORTED:
    return "REFMODEL_EABORTED";
  default:
    return "REFMODEL_E?";
  }
}

/* ---- checkpoint loading ---------------------------------------------------------------- */

static int32_t rd_i32(const unsigned char *p)
{
  uint32_t u = (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
  int32_t v;
  memcpy(&v, &u, sizeof v);
  return v;
}

/*
 * Content digest (refmodel_model_digest): each 8-byte little-endian word is multiplied into the
 * state and rotated (a multiply-rotate mix in the manner of FNV-1a over words), trailing bytes
 * one at a time, then the splitmix64 finalizer with the byte count. Independent of the host's
 * byte order. Not cryptographic: it tells checkpoints apart, it does not authenticate them.
 */
#define DIGEST_SEED 0x6b76646272656631ull /* "kvdbref1" */

static uint64_t digest_update(uint64_t h, const unsigned char *p, size_t n)
{
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t w = 0;
    for (int b = 7; b >= 0; b--)
      w = w << 8 | p[i + (size_t)b];
    h ^= w * 0x9e3779b97f4a7c15ull;
    h = (h << 27 | h >> 37) * 0x100000001b3ull;
  }
  for (; i < n; i++)
    h = (h ^ p[i]) * 0x100000001b3ull;
  return h;
}

static uint64_t digest_final(uint64_t h, uint64_t n_bytes)
{
  uint64_t z = h ^ (n_bytes * 0xbf58476d1ce4e5b9ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/* Byte-swap n floats in place when the host is big-endian (the file is little-endian). */
static void floats_from_le(float *p, size_t n)
{
  const uint16_t one = 1;
  unsigned char first;
  memcpy(&first, &one, 1);
  if (first == 1)
    return;
  for (size_t i = 0; i < n; i++) {
    unsigned char b[4], s[4];
    memcpy(b, &p[i], 4);
    s[0] = b[3];
    s[1] = b[2];
    s[2] = b[1];
    s[3] = b[0];
    memcpy(&p[i], s, 4);
  }
}

/* The tensors of a checkpoint in file order; n = float count, dst = where the pointer goes. */
struct tensor {
  const char *name;
  uint64_t n;
  const float **dst;
};

#define N_TENSORS 14

static void tensor_table(refmodel_model *m, struct tensor t[N_TENSORS])
{
  const refmodel_config *c = &m->cfg;
  uint64_t d = (uint64_t)c->dim, h = (uint64_t)c->hidden_dim, l = (uint64_t)c->n_layers;
  uint64_t kv = (uint64_t)c->kv_dim, v = (uint64_t)c->vocab_size;
  uint64_t half_freqs = (uint64_t)c->seq_len * (uint64_t)(c->head_size / 2);
  struct tensor tab[N_TENSORS] = {
      {"token_embedding", v * d, &m->tok_emb},
      {"rms_att_weight", l * d, &m->rms_att},
      {"wq", l * d * d, &m->wq},
      {"wk", l * kv * d, &m->wk},
      {"wv", l * kv * d, &m->wv},
      {"wo", l * d * d, &m->wo},
      {"rms_ffn_weight", l * d, &m->rms_ffn},
      {"w1", l * h * d, &m->w1},
      {"w2", l * d * h, &m->w2},
      {"w3", l * h * d, &m->w3},
      {"rms_final_weight", d, &m->rms_final},
      {"freq_cis_real", half_freqs, NULL},
      {"freq_cis_imag", half_freqs, NULL},
      {"wcls", c->shared_classifier ? 0 : v * d, &m->wcls},
  };
  memcpy(t, tab, sizeof tab);
}

static int check_range(const char *name, const char *field, int32_t v, int32_t lo, int32_t hi,
                       const char *why)
{
  if (v >= lo && v <= hi)
    return REFMODEL_OK;
  return rm_fail(REFMODEL_EFORMAT, "'%s': bad header: %s = %d (must be %d..%d%s)", name, field,
                 (int)v, (int)lo, (int)hi, why);
}

/*
 * Validate the 7-int header and fill m->cfg; *total_bytes receives the file size it implies.
 * Every bound is checked before any product is formed, so the uint64 arithmetic cannot overflow.
 */
static int parse_header(const unsigned char *hdr, const char *name, refmodel_model *m,
                        uint64_t *total_bytes)
{
  int32_t dim = rd_i32(hdr), hidden = rd_i32(hdr + 4), layers = rd_i32(hdr + 8);
  int32_t heads = rd_i32(hdr + 12), kv_heads = rd_i32(hdr + 16), vocab = rd_i32(hdr + 20);
  int32_t seq_len = rd_i32(hdr + 24);
  int rc;
  if ((rc = check_range(name, "dim", dim, 1, REFMODEL_MAX_DIM, "")) != 0 ||
      (rc = check_range(name, "hidden_dim", hidden, 1, REFMODEL_MAX_HIDDEN_DIM, "")) != 0 ||
      (rc = check_range(name, "n_layers", layers, 1, REFMODEL_MAX_LAYERS, "")) != 0 ||
      (rc = check_range(name, "n_heads", heads, 1, dim, ", dividing dim")) != 0 ||
      (rc = check_range(name, "n_kv_heads", kv_heads, 1, heads, ", dividing n_heads")) != 0 ||
      (rc = check_range(name, "seq_len", seq_len, 1, REFMODEL_MAX_SEQ_LEN, "")) != 0)
    return rc;
  if (dim % heads != 0)
    return rm_fail(REFMODEL_EFORMAT, "'%s': bad header: n_heads = %d does not divide dim = %d",
                   name, (int)heads, (int)dim);
  if (heads % kv_heads != 0)
    return rm_fail(REFMODEL_EFORMAT,
                   "'%s': bad header: n_kv_heads = %d does not divide n_heads = %d", name,
                   (int)kv_heads, (int)heads);
  if ((dim / heads) % 2 != 0)
    return rm_fail(REFMODEL_EFORMAT,
                   "'%s': bad header: head_size = dim / n_heads = %d is odd (RoPE needs pairs)",
                   name, (int)(dim / heads));
  if (vocab == 0 || vocab < -REFMODEL_MAX_VOCAB || vocab > REFMODEL_MAX_VOCAB)
    return rm_fail(REFMODEL_EFORMAT,
                   "'%s': bad header: vocab_size = %d (must be 1..%d, or negative for an "
                   "unshared classifier)",
                   name, (int)vocab, REFMODEL_MAX_VOCAB);

  refmodel_config *c = &m->cfg;
  c->dim = dim;
  c->hidden_dim = hidden;
  c->n_layers = layers;
  c->n_heads = heads;
  c->n_kv_heads = kv_heads;
  c->vocab_size = vocab > 0 ? vocab : -vocab;
  c->seq_len = seq_len;
  c->head_size = dim / heads;
  c->kv_dim = kv_heads * (dim / heads);
  c->shared_classifier = vocab > 0;

  struct tensor t[N_TENSORS];
  tensor_table(m, t);
  uint64_t floats = 0;
  for (int i = 0; i < N_TENSORS; i++)
    floats += t[i].n;
  *total_bytes = HEADER_BYTES + 4 * floats;
  return REFMODEL_OK;
}

static int size_check(const char *name, uint64_t want, uint64_t have)
{
  if (have < want)
    return rm_fail(REFMODEL_ETRUNCATED, "'%s': truncated: header says %llu bytes, file has %llu",
                   name, (unsigned long long)want, (unsigned long long)have);
  if (have > want)
    return rm_fail(REFMODEL_EFORMAT,
                   "'%s': size mismatch: header says %llu bytes, file has %llu (%llu extra)", name,
                   (unsigned long long)want, (unsigned long long)have,
                   (unsigned long long)(have - want));
  if (want - HEADER_BYTES > SIZE_MAX)
    return rm_fail(REFMODEL_ENOMEM, "'%s': %llu bytes of weights do not fit in memory", name,
                   (unsigned long long)(want - HEADER_BYTES));
  return REFMODEL_OK;
}

/* Point the tensors into m->data and reject non-finite values. */
static int finish_load(refmodel_model *m, const char *name)
{
  struct tensor t[N_TENSORS];
  tensor_table(m, t);
  const float *p = m->data;
  for (int i = 0; i < N_TENSORS; i++) {
    for (uint64_t j = 0; j < t[i].n; j++)
      if (!isfinite(p[j]))
        return rm_fail(REFMODEL_EFORMAT, "'%s': %s[%llu] is not finite (%g)", name, t[i].name,
                       (unsigned long long)j, (double)p[j]);
    if (t[i].dst != NULL)
      *t[i].dst = p;
    p += t[i].n;
  }
  if (m->cfg.shared_classifier)
    m->wcls = m->tok_emb;
  return REFMODEL_OK;
}

static const char *buffer_name(const char *name)
{
  return name != NULL ? name : "(buffer)";
}

int refmodel_model_load_buffer(const void *data, size_t size, const char *name,
                               refmodel_model **out)
{
  name = buffer_name(name);
  if (out == NULL)
    return rm_fail(REFMODEL_EINVAL, "refmodel_model_load_buffer: out is NULL");
  *out = NULL;
  if (data == NULL && size > 0)
    return rm_fail(REFMODEL_EINVAL, "refmodel_model_load_buffer: data is NULL");
  if (size < HEADER_BYTES)
    return rm_fail(REFMODEL_ETRUNCATED, "'%s': truncated: %zu bytes, the header alone is %d", name,
                   size, HEADER_BYTES);
  refmodel_model *m = calloc(1, sizeof *m);
  if (m == NULL)
    return rm_fail(REFMODEL_ENOMEM, "'%s': out of memory", name);
  uint64_t want;
  int rc = parse_header(data, name, m, &want);
  if (rc == 0)
    rc = size_check(name, want, size);
  if (rc == 0) {
    size_t n_bytes = size - HEADER_BYTES;
    m->data = malloc(n_bytes > 0 ? n_bytes : 1);
    if (m->data == NULL)
      rc = rm_fail(REFMODEL_ENOMEM, "'%s': out of memory for %zu bytes of weights", name, n_bytes);
    else {
      memcpy(m->data, (const unsigned char *)data + HEADER_BYTES, n_bytes);
      m->digest = digest_final(
          digest_update(digest_update(DIGEST_SEED, data, HEADER_BYTES),
                        (const unsigned char *)m->data, n_bytes),
          (uint64_t)size);
      floats_from_le(m->data, n_bytes / 4);
      rc = finish_load(m, name);
    }
  }
  if (rc != 0) {
    refmodel_model_free(m);
    return rc;
  }
  *out = m;
  return REFMODEL_OK;
}

int refmodel_model_load(const char *path, refmodel_model **out)
{
  if (out == NULL || path == NULL)
    return rm_fail(REFMODEL_EINVAL, "refmodel_model_load: %s is NULL",
                   out == NULL ? "out" : "path");
  *out = NULL;
  FILE *f = fopen(path, "rb");
  if (f == NULL)
    return rm_fail(REFMODEL_EIO, "'%s': cannot open: %s", path, strerror(errno));
  int rc = REFMODEL_OK;
  refmodel_model *m = NULL;
  /* Read the header first: a directory or unreadable file fails here, before any seek. */
  unsigned char hdr[HEADER_BYTES];
  size_t hdr_got = fread(hdr, 1, HEADER_BYTES, f);
  if (hdr_got != HEADER_BYTES) {
    if (ferror(f))
      rc = rm_fail(REFMODEL_EIO, "'%s': cannot read the header: %s", path, strerror(errno));
    else
      rc = rm_fail(REFMODEL_ETRUNCATED, "'%s': truncated: %zu bytes, the header alone is %d", path,
                   hdr_got, HEADER_BYTES);
    goto done;
  }
  long file_size = -1;
  if (fseek(f, 0, SEEK_END) != 0 || (file_size = ftell(f)) < 0 ||
      fseek(f, HEADER_BYTES, SEEK_SET) != 0) {
    rc = rm_fail(REFMODEL_EIO, "'%s': cannot get the file size: %s", path, strerror(errno));
    goto done;
  }
  m = calloc(1, sizeof *m);
  if (m == NULL) {
    rc = rm_fail(REFMODEL_ENOMEM, "'%s': out of memory", path);
    goto done;
  }
  uint64_t want;
  if ((rc = parse_header(hdr, path, m, &want)) != 0 ||
      (rc = size_check(path, want, (uint64_t)file_size)) != 0)
    goto done;
  size_t n_bytes = (size_t)(want - HEADER_BYTES);
  m->data = malloc(n_bytes > 0 ? n_bytes : 1);
  if (m->data == NULL) {
    rc = rm_fail(REFMODEL_ENOMEM, "'%s': out of memory for %zu bytes of weights", path, n_bytes);
    goto done;
  }
  size_t got = fread(m->data, 1, n_bytes, f);
  if (got != n_bytes) {
    rc = rm_fail(REFMODEL_EIO, "'%s': read %zu of %zu weight bytes: %s", path, got, n_bytes,
                 ferror(f) ? strerror(errno) : "file shrank while reading");
    goto done;
  }
  m->digest = digest_final(
      digest_update(digest_update(DIGEST_SEED, hdr, HEADER_BYTES),
                    (const unsigned char *)m->data, n_bytes),
      want);
  floats_from_le(m->data, n_bytes / 4);
  rc = finish_load(m, path);
done:
  fclose(f);
  if (rc != 0) {
    refmodel_model_free(m);
    return rc;
  }
  *out = m;
  return REFMODEL_OK;
}

void refmodel_model_free(refmodel_model *m)
{
  if (m == NULL)
    return;
  free(m->data);
  free(m);
}

const refmodel_config *refmodel_model_config(const refmodel_model *m)
{
  return &m->cfg;
}

uint64_t refmodel_model_digest(const refmodel_model *m)
{
  return m->digest;
}

/* ---- state ----------------------------------------------------------------------------- */

/* a * b * c floats, or 0 when the product overflows size_t bytes (callers then fail ENOMEM). */
static size_t floats3(size_t a, size_t b, size_t c)
{
  if (a == 0 || b == 0 || c == 0)
    return 0;
  if (a > SIZE_MAX / 4 / b || a * b > SIZE_MAX / 4 / c)
    return 0;
  return a * b * c;
}

int refmodel_state_new(const refmodel_model *m, int max_pos, refmodel_state **out)
{
  if (out == NULL)
    return rm_fail(REFMODEL_EINVAL, "refmodel_state_new: out is NULL");
  *out = NULL;
  if (m == NULL)
    return rm_fail(REFMODEL_EINVAL, "refmodel_state_new: model is NULL");
  if (max_pos < 0 || max_pos > REFMODEL_MAX_SEQ_LEN)
    return rm_fail(REFMODEL_EINVAL, "refmodel_state_new: max_pos = %d (must be 0..%d)", max_pos,
                   REFMODEL_MAX_SEQ_LEN);
  const refmodel_config *c = &m->cfg;
  if (max_pos == 0)
    max_pos = c->seq_len;
  refmodel_state *st = calloc(1, sizeof *st);
  if (st == NULL)
    return rm_fail(REFMODEL_ENOMEM, "refmodel_state_new: out of memory");
  st->m = m;
  st->max_pos = max_pos;
  size_t dim = (size_t)c->dim, hidden = (size_t)c->hidden_dim;
  size_t cache = floats3((size_t)c->n_layers, (size_t)max_pos, (size_t)c->kv_dim);
  size_t att = floats3((size_t)c->n_heads, (size_t)max_pos, 1);
  st->x = calloc(dim, sizeof(float));
  st->xb = calloc(dim, sizeof(float));
  st->xb2 = calloc(dim, sizeof(float));
  st->q = calloc(dim * (size_t)c->n_layers, sizeof(float));
  st->hb = calloc(hidden, sizeof(float));
  st->hb2 = calloc(hidden, sizeof(float));
  st->rope_cos = calloc((size_t)c->head_size / 2, sizeof(float));
  st->rope_sin = calloc((size_t)c->head_size / 2, sizeof(float));
  st->logits = calloc((size_t)c->vocab_size, sizeof(float));
  st->att = att > 0 ? calloc(att, sizeof(float)) : NULL;
  st->key_cache = cache > 0 ? calloc(cache, sizeof(float)) : NULL;
  st->value_cache = cache > 0 ? calloc(cache, sizeof(float)) : NULL;
  if (!st->x || !st->xb || !st->xb2 || !st->q || !st->hb || !st->hb2 || !st->rope_cos ||
      !st->rope_sin || !st->logits || !st->att || !st->key_cache || !st->value_cache) {
    refmodel_state_free(st);
    return rm_fail(REFMODEL_ENOMEM,
                   "refmodel_state_new: out of memory for %d positions (%zu KV floats per array)",
                   max_pos, cache);
  }
  *out = st;
  return REFMODEL_OK;
}

void refmodel_state_free(refmodel_state *st)
{
  if (st == NULL)
    return;
  free(st->x);
  free(st->xb);
  free(st->xb2);
  free(st->q);
  free(st->hb);
  free(st->hb2);
  free(st->rope_cos);
  free(st->rope_sin);
  free(st->logits);
  free(st->att);
  free(st->key_cache);
  free(st->value_cache);
  free(st->absent);
  free(st->sp_slot);
  free(st->sp_k);
  free(st->sp_v);
  free(st);
}

int refmodel_state_max_pos(const refmodel_state *st)
{
  return st->max_pos;
}

static float *cache_at(refmodel_state *st, float *base, int layer, int pos, const char *what)
{
  if (st == NULL) {
    rm_fail(REFMODEL_EINVAL, "refmodel_state_%s: state is NULL", what);
    return NULL;
  }
  const refmodel_config *c = &st->m->cfg;
  if (layer < 0 || layer >= c->n_layers || pos < 0 || pos >= st->max_pos) {
    rm_fail(REFMODEL_EINVAL,
            "refmodel_state_%s: layer %d, pos %d out of range (%d layers, %d positions)", what,
            layer, pos, c->n_layers, st->max_pos);
    return NULL;
  }
  return base + ((size_t)layer * (size_t)st->max_pos + (size_t)pos) * (size_t)c->kv_dim;
}

float *refmodel_state_key(refmodel_state *st, int layer, int pos)
{
  return cache_at(st, st != NULL ? st->key_cache : NULL, layer, pos, "key");
}

float *refmodel_state_value(refmodel_state *st, int layer, int pos)
{
  return cache_at(st, st != NULL ? st->value_cache : NULL, layer, pos, "value");
}

const float *refmodel_state_logits(const refmodel_state *st)
{
  return st->logits;
}

const float *refmodel_state_query(const refmodel_state *st, int layer)
{
  if (st == NULL || layer < 0 || layer >= st->m->cfg.n_layers) {
    rm_fail(REFMODEL_EINVAL, "refmodel_state_query: layer %d out of range (%d layers)", layer,
            st != NULL ? st->m->cfg.n_layers : 0);
    return NULL;
  }
  return st->q + (size_t)layer * (size_t)st->m->cfg.dim;
}

int refmodel_state_set_absent(refmodel_state *st, int layer, int kv_head, int pos, int absent)
{
  if (st == NULL)
    return rm_fail(REFMODEL_EINVAL, "refmodel_state_set_absent: state is NULL");
  const refmodel_config *c = &st->m->cfg;
  if (layer < 0 || layer >= c->n_layers || kv_head < 0 || kv_head >= c->n_kv_heads || pos < 0 ||
      pos >= st->max_pos)
    return rm_fail(REFMODEL_EINVAL,
                   "refmodel_state_set_absent: layer %d, KV head %d, pos %d out of range (%d "
                   "layers, %d KV heads, %d positions)",
                   layer, kv_head, pos, c->n_layers, c->n_kv_heads, st->max_pos);
  if (st->absent == NULL) {
    if (!absent)
      return REFMODEL_OK;
    st->absent = calloc((size_t)c->n_layers * (size_t)c->n_kv_heads, (size_t)st->max_pos);
    if (st->absent == NULL)
      return rm_fail(REFMODEL_ENOMEM, "refmodel_state_set_absent: out of memory");
  }
  st->absent[((size_t)layer * (size_t)c->n_kv_heads + (size_t)kv_head) * (size_t)st->max_pos +
             (size_t)pos] = absent != 0;
  return REFMODEL_OK;
}

void refmodel_state_clear_absent(refmodel_state *st)
{
  if (st == NULL)
    return;
  free(st->absent);
  st->absent = NULL;
}

/* ---- forward pass ---------------------------------------------------------------------- */

/* Dot product with eight independent partial sums (vectorizable without reassociation). */
static inline float dot(const float *restrict a, const float *restrict b, size_t n)
{
  float acc[8] = {0};
  size_t j = 0;
  for (; j + 8 <= n; j += 8)
    for (size_t k = 0; k < 8; k++)
      acc[k] += a[j + k] * b[j + k];
  float s = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
  for (; j < n; j++)
    s += a[j] * b[j];
  return s;
}

/* Sum with eight independent partial sums, like dot(). */
static inline float sum8(const float *a, size_t n)
{
  float acc[8] = {0};
  size_t j = 0;
  for (; j + 8 <= n; j += 8)
    for (size_t k = 0; k < 8; k++)
      acc[k] += a[j + k];
  float s = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
  for (; j < n; j++)
    s += a[j];
  return s;
}

/*
 * out[0..n) = sum over t < n_t of w[t] * v[t * stride + i]: the attention-weighted sum of values.
 * Blocks of eight outputs are accumulated in registers across t (vectorizable).
 */
static void weighted_sum(float *out, const float *w, const float *v, size_t n_t, size_t stride,
                         size_t n)
{
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    float acc[8] = {0};
    for (size_t t = 0; t < n_t; t++) {
      const float *vt = v + t * stride + i;
      float a = w[t];
      for (size_t k = 0; k < 8; k++)
        acc[k] += a * vt[k];
    }
    memcpy(out + i, acc, sizeof acc);
  }
  for (; i < n; i++) {
    float acc = 0;
    for (size_t t = 0; t < n_t; t++)
      acc += w[t] * v[t * stride + i];
    out[i] = acc;
  }
}

/* y[n_out] = W[n_out][n_in] x[n_in] */
static void matmul(float *y, const float *x, const float *w, size_t n_in, size_t n_out)
{
  for (size_t i = 0; i < n_out; i++)
    y[i] = dot(w + i * n_in, x, n_in);
}

static void rmsnorm(float *o, const float *x, const float *w, size_t n)
{
  double ss = 0;
  for (size_t i = 0; i < n; i++)
    ss += (double)x[i] * (double)x[i];
  float scale = (float)(1.0 / sqrt(ss / (double)n + 1e-5));
  for (size_t i = 0; i < n; i++)
    o[i] = w[i] * (scale * x[i]);
}

/* Rotate adjacent pairs of v[0..n) by the angles of the current position (n % head_size == 0). */
static void rope(float *v, size_t n, const float *cs, const float *sn, size_t head_size)
{
  for (size_t base = 0; base < n; base += head_size)
    for (size_t i = 0; i < head_size; i += 2) {
      float c = cs[i / 2], s = sn[i / 2];
      float v0 = v[base + i], v1 = v[base + i + 1];
      v[base + i] = v0 * c - v1 * s;
      v[base + i + 1] = v0 * s + v1 * c;
    }
}

/*
 * Sparse attention of layer l at position p (refmodel_forward_sparse): for each KV head, ask the
 * caller which positions to attend to, gather their K and V rows (the caller's, else the
 * cache's) in ascending position order with p last, and attend each query head of the group
 * over them exactly as the dense loop does over all positions.
 */
static int sparse_layer(refmodel_state *st, size_t l, size_t p, const float *q,
                        const float *key_layer, const float *value_layer,
                        refmodel_select_fn select, void *user, float att_scale)
{
  const refmodel_config *c = &st->m->cfg;
  size_t hs = (size_t)c->head_size, kv_dim = (size_t)c->kv_dim, max_pos = (size_t)st->max_pos;
  size_t kv_mul = (size_t)(c->n_heads / c->n_kv_heads);
  int *slot = st->sp_slot;
  float *kb = st->sp_k, *vb = st->sp_v;
  for (size_t g = 0; g < (size_t)c->n_kv_heads; g++) {
    refmodel_attend a;
    memset(&a, 0, sizeof a);
    int rc = select(user, (int)l, (int)g, (int)p, q + g * kv_mul * hs, (int)kv_mul, &a);
    if (rc != 0)
      return rm_fail(REFMODEL_EABORTED,
                     "refmodel_forward_sparse: the select callback returned %d (layer %zu, KV "
                     "head %zu, pos %zu)",
                     rc, l, g, p);
    if (a.n < 0 || (size_t)a.n > p || (a.n > 0 && a.pos == NULL) || a.n_rows < 0 ||
        a.n_rows > a.n || (a.n_rows > 0 && (a.k == NULL || a.v == NULL)))
      return rm_fail(REFMODEL_EINVAL,
                     "refmodel_forward_sparse: layer %zu, KV head %zu, pos %zu: bad list (n %d, "
                     "must be 0..%zu; n_rows %d; pos %s, k %s, v %s)",
                     l, g, p, a.n, p, a.n_rows, a.pos ? "set" : "NULL", a.k ? "set" : "NULL",
                     a.v ? "set" : "NULL");
    for (int i = 0; i < a.n; i++) {
      int t = a.pos[i];
      if (t < 0 || (size_t)t >= p || slot[t] >= 0) {
        for (int j = 0; j < i; j++)
          slot[a.pos[j]] = -1;
        return rm_fail(REFMODEL_EINVAL,
                       "refmodel_forward_sparse: layer %zu, KV head %zu, pos %zu: listed "
                       "position %d %s",
                       l, g, p, t, t < 0 || (size_t)t >= p ? "is outside [0, pos)" : "is repeated");
      }
      slot[t] = i;
    }
    size_t stride = a.row_stride != 0 ? a.row_stride : hs;
    const uint8_t *ab =
        st->absent != NULL ? st->absent + (l * (size_t)c->n_kv_heads + g) * max_pos : NULL;
    size_t m = 0, left = (size_t)a.n;
    for (size_t t = 0; left > 0 && t < p; t++) {
      int i = slot[t];
      if (i < 0)
        continue;
      slot[t] = -1;
      left--;
      if (ab != NULL && ab[t])
        continue;
      const float *kr = i < a.n_rows ? a.k + (size_t)i * stride : key_layer + t * kv_dim + g * hs;
      const float *vr = i < a.n_rows ? a.v + (size_t)i * stride : value_layer + t * kv_dim + g * hs;
      memcpy(kb + m * hs, kr, hs * sizeof(float));
      memcpy(vb + m * hs, vr, hs * sizeof(float));
      m++;
    }
    memcpy(kb + m * hs, key_layer + p * kv_dim + g * hs, hs * sizeof(float));
    memcpy(vb + m * hs, value_layer + p * kv_dim + g * hs, hs * sizeof(float));
    m++;
    for (size_t h = g * kv_mul; h < (g + 1) * kv_mul; h++) {
      const float *qh = q + h * hs;
      float *att = st->att + h * max_pos;
      float mx = -INFINITY;
      for (size_t t = 0; t < m; t++) {
        att[t] = dot(qh, kb + t * hs, hs) * att_scale;
        mx = att[t] > mx ? att[t] : mx;
      }
      for (size_t t = 0; t < m; t++)
        att[t] = expf(att[t] - mx);
      float sum = sum8(att, m);
      float *out = st->xb + h * hs;
      weighted_sum(out, att, vb, m, hs, hs);
      float inv = 1.0f / sum;
      for (size_t i = 0; i < hs; i++)
        out[i] *= inv;
    }
  }
  return REFMODEL_OK;
}

/*
 * One token at one position; arguments already validated. select NULL: dense attention over
 * [0, pos] (cannot fail); else sparse_layer's (its errors).
 */
static int forward_step(refmodel_state *st, int token, int pos, refmodel_select_fn select,
                        void *user)
{
  const refmodel_model *m = st->m;
  const refmodel_config *c = &m->cfg;
  size_t dim = (size_t)c->dim, hidden = (size_t)c->hidden_dim, kv_dim = (size_t)c->kv_dim;
  size_t hs = (size_t)c->head_size, max_pos = (size_t)st->max_pos, p = (size_t)pos;
  size_t kv_mul = (size_t)(c->n_heads / c->n_kv_heads);
  float *x = st->x, *xb = st->xb, *xb2 = st->xb2, *hb = st->hb, *hb2 = st->hb2;
  float att_scale = (float)(1.0 / sqrt((double)hs));

  memcpy(x, m->tok_emb + (size_t)token * dim, dim * sizeof(float));
  if (st->absent != NULL) /* the row written now is present everywhere */
    for (size_t lh = 0; lh < (size_t)c->n_layers * (size_t)c->n_kv_heads; lh++)
      st->absent[lh * max_pos + p] = 0;
  for (size_t i = 0; i < hs / 2; i++) {
    double freq = pow(10000.0, -(double)(2 * i) / (double)hs);
    double angle = (double)pos * freq;
    st->rope_cos[i] = (float)cos(angle);
    st->rope_sin[i] = (float)sin(angle);
  }

  for (size_t l = 0; l < (size_t)c->n_layers; l++) {
    float *key_layer = st->key_cache + l * max_pos * kv_dim;
    float *value_layer = st->value_cache + l * max_pos * kv_dim;
    float *k = key_layer + p * kv_dim, *v = value_layer + p * kv_dim;
    float *q = st->q + l * dim; /* kept per layer for refmodel_state_query() */

    rmsnorm(xb, x, m->rms_att + l * dim, dim);
    matmul(q, xb, m->wq + l * dim * dim, dim, dim);
    matmul(k, xb, m->wk + l * kv_dim * dim, dim, kv_dim);
    matmul(v, xb, m->wv + l * kv_dim * dim, dim, kv_dim);
    rope(q, dim, st->rope_cos, st->rope_sin, hs);
    rope(k, kv_dim, st->rope_cos, st->rope_sin, hs);

    if (select != NULL) {
      int rc = sparse_layer(st, l, p, q, key_layer, value_layer, select, user, att_scale);
      if (rc != REFMODEL_OK)
        return rc;
    }
    for (size_t h = 0; select == NULL && h < (size_t)c->n_heads; h++) {
      const float *qh = q + h * hs;
      float *att = st->att + h * max_pos;
      size_t kv_off = (h / kv_mul) * hs;
      float mx = -INFINITY;
      for (size_t t = 0; t <= p; t++) {
        att[t] = dot(qh, key_layer + t * kv_dim + kv_off, hs) * att_scale;
        mx = att[t] > mx ? att[t] : mx;
      }
      if (st->absent != NULL) { /* dropped rows: no attention; the max over the rest */
        const uint8_t *ab = st->absent + (l * (size_t)c->n_kv_heads + h / kv_mul) * max_pos;
        mx = -INFINITY;
        for (size_t t = 0; t <= p; t++) {
          if (ab[t])
            att[t] = -INFINITY;
          mx = att[t] > mx ? att[t] : mx; /* finite: position p is present */
        }
      }
      /* Causal softmax; the division by the sum is applied once, to the output. */
      for (size_t t = 0; t <= p; t++)
        att[t] = expf(att[t] - mx);
      float sum = sum8(att, p + 1);
      float *out = xb + h * hs;
      weighted_sum(out, att, value_layer + kv_off, p + 1, kv_dim, hs);
      float inv = 1.0f / sum;
      for (size_t i = 0; i < hs; i++)
        out[i] *= inv;
    }
    matmul(xb2, xb, m->wo + l * dim * dim, dim, dim);
    for (size_t i = 0; i < dim; i++)
      x[i] += xb2[i];

    rmsnorm(xb, x, m->rms_ffn + l * dim, dim);
    matmul(hb, xb, m->w1 + l * hidden * dim, dim, hidden);
    matmul(hb2, xb, m->w3 + l * hidden * dim, dim, hidden);
    for (size_t i = 0; i < hidden; i++) {
      float g = hb[i];
      hb[i] = g / (1.0f + expf(-g)) * hb2[i];
    }
    matmul(xb, hb, m->w2 + l * dim * hidden, hidden, dim);
    for (size_t i = 0; i < dim; i++)
      x[i] += xb[i];
  }
  rmsnorm(x, x, m->rms_final, dim);
  matmul(st->logits, x, m->wcls, dim, (size_t)c->vocab_size);
  return REFMODEL_OK;
}

static int check_token(const refmodel_state *st, int token, const char *fn)
{
  if (token < 0 || token >= st->m->cfg.vocab_size)
    return rm_fail(REFMODEL_EINVAL, "%s: token %d out of range [0, %d)", fn, token,
                   st->m->cfg.vocab_size);
  return REFMODEL_OK;
}

/* Positions [pos, pos + n) must lie in [0, max_pos). */
static int check_positions(const refmodel_state *st, int pos, int n, const char *fn)
{
  if (n < 1)
    return rm_fail(REFMODEL_EINVAL, "%s: count %d (must be >= 1)", fn, n);
  if (pos < 0 || (long long)pos + n > st->max_pos)
    return rm_fail(REFMODEL_EINVAL, "%s: positions [%d, %lld) outside the state's [0, %d)", fn, pos,
                   (long long)pos + n, st->max_pos);
  return REFMODEL_OK;
}

int refmodel_forward(refmodel_state *st, int token, int pos, const float **logits)
{
  if (st == NULL)
    return rm_fail(REFMODEL_EINVAL, "refmodel_forward: state is NULL");
  int rc;
  if ((rc = check_token(st, token, "refmodel_forward")) != 0 ||
      (rc = check_positions(st, pos, 1, "refmodel_forward")) != 0)
    return rc;
  forward_step(st, token, pos, NULL, NULL);
  if (logits != NULL)
    *logits = st->logits;
  return REFMODEL_OK;
}

int refmodel_forward_sparse(refmodel_state *st, int token, int pos, refmodel_select_fn select,
                            void *user, const float **logits)
{
  if (st == NULL || select == NULL)
    return rm_fail(REFMODEL_EINVAL, "refmodel_forward_sparse: %s is NULL",
                   st == NULL ? "state" : "select");
  int rc;
  if ((rc = check_token(st, token, "refmodel_forward_sparse")) != 0 ||
      (rc = check_positions(st, pos, 1, "refmodel_forward_sparse")) != 0)
    return rc;
  if (st->sp_slot == NULL) {
    size_t n = (size_t)st->max_pos, hs = (size_t)st->m->cfg.head_size;
    int *slot = malloc(n * sizeof(int));
    float *kb = malloc(n * hs * sizeof(float)), *vb = malloc(n * hs * sizeof(float));
    if (slot == NULL || kb == NULL || vb == NULL) {
      free(slot);
      free(kb);
      free(vb);
      return rm_fail(REFMODEL_ENOMEM, "refmodel_forward_sparse: out of memory for %zu positions",
                     n);
    }
    for (size_t i = 0; i < n; i++)
      slot[i] = -1;
    st->sp_slot = slot;
    st->sp_k = kb;
    st->sp_v = vb;
  }
  rc = forward_step(st, token, pos, select, user);
  if (rc != REFMODEL_OK)
    return rc;
  if (logits != NULL)
    *logits = st->logits;
  return REFMODEL_OK;
}

int refmodel_prefill(refmodel_state *st, const int *tokens, int n, int start_pos,
                     const float **logits)
{
  if (st == NULL || tokens == NULL)
    return rm_fail(REFMODEL_EINVAL, "refmodel_prefill: %s is NULL",
                   st == NULL ? "state" : "tokens");
  int rc = check_positions(st, start_pos, n, "refmodel_prefill");
  for (int i = 0; rc == 0 && i < n; i++)
    rc = check_token(st, tokens[i], "refmodel_prefill");
  if (rc != 0)
    return rc;
  for (int i = 0; i < n; i++)
    forward_step(st, tokens[i], start_pos + i, NULL, NULL);
  if (logits != NULL)
    *logits = st->logits;
  return REFMODEL_OK;
}

int refmodel_generate(refmodel_state *st, int token, int pos, int n, int stop_token, int *out,
                      int *n_out)
{
  if (st == NULL || out == NULL)
    return rm_fail(REFMODEL_EINVAL, "refmodel_generate: %s is NULL", st == NULL ? "state" : "out");
  int rc;
  if ((rc = check_token(st, token, "refmodel_generate")) != 0 ||
      (rc = check_positions(st, pos, n, "refmodel_generate")) != 0)
    return rc;
  int k = 0;
  for (int i = 0; i < n; i++) {
    forward_step(st, token, pos + i, NULL, NULL);
    int next = refmodel_argmax(st->logits, st->m->cfg.vocab_size);
    if (stop_token >= 0 && next == stop_token)
      break;
    out[k++] = next;
    token = next;
  }
  if (n_out != NULL)
    *n_out = k;
  return REFMODEL_OK;
}

int refmodel_argmax(const float *v, int n)
{
  if (v == NULL || n < 1)
    return rm_fail(REFMODEL_EINVAL, "refmodel_argmax: %s", v == NULL ? "v is NULL" : "n < 1");
  int best = 0;
  for (int i = 1; i < n; i++)
    if (v[i] > v[best] || (v[best] != v[best] && v[i] == v[i]))
      best = i;
  return best;
}

int refmodel_log_softmax(const float *logits, int n, float *out)
{
  if (logits == NULL || out == NULL || n < 1)
    return rm_fail(REFMODEL_EINVAL, "refmodel_log_softmax: %s", n < 1 ? "n < 1" : "NULL pointer");
  float mx = logits[0];
  for (int i = 1; i < n; i++)
    if (logits[i] > mx)
      mx = logits[i];
  double sum = 0;
  for (int i = 0; i < n; i++)
    sum += exp((double)logits[i] - (double)mx);
  double lse = (double)mx + log(sum);
  for (int i = 0; i < n; i++)
    out[i] = (float)((double)logits[i] - lse);
  return REFMODEL_OK;
}
