/* SPDX-License-Identifier: MIT */
/*
 * tools/ingest/safetensors.c — reading a kvdb context from a safetensors file (safetensors.h).
 *
 * The header is parsed with Jansson (json_load.h), every tensor entry is checked (dtype a string, shape an array
 * of at most ST_MAX_DIMS non-negative integers, data_offsets [begin, end] inside the byte buffer
 * with end - begin equal to the shape's byte size for a known dtype), then the tensors kvdb needs
 * are located and their shapes cross-checked. The K/V bytes are never copied: the kvdb_kv_view
 * points into the mapping.
 */
#define _POSIX_C_SOURCE 200809L
#include "safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "json_load.h"

#define ST_MAX_DIMS 8
/* The header: any JSON value is parsed (a non-object gets its own message), a key given twice
 * (a tensor, or a __metadata__ member) is refused, integers must fit 63 bits, and the parse may
 * take up to 1 GiB of memory (a 100 MiB header of the densest JSON needs ~4 GiB). */
#define ST_JSON_FLAGS (JSON_DECODE_ANY | JSON_ALLOW_NUL | JSON_REJECT_DUPLICATES)
#define ST_MAX_PARSE_MEM ((size_t)1 << 30)
#define ST_PER_LAYER_PREFIX "past_key_values."

typedef struct tensor {
  char *name;
  char dtype[16];
  int known; /* dtype is one safetensors defines: elem_bytes is valid */
  unsigned elem_bytes;
  int ndim;
  uint64_t shape[ST_MAX_DIMS];
  uint64_t begin, end; /* relative to the byte buffer */
} tensor;

typedef struct ctx {
  const char *name;
  char *err;
  size_t err_cap;
} ctx;

#if defined(__GNUC__)
__attribute__((format(printf, 2, 3)))
#endif
static int
fail(const ctx *c, const char *fmt, ...)
{
  if (c->err_cap == 0)
    return -1;
  int k = snprintf(c->err, c->err_cap, "'%s': ", c->name);
  if (k >= 0 && (size_t)k < c->err_cap) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->err + k, c->err_cap - (size_t)k, fmt, ap);
    va_end(ap);
  }
  return -1;
}

static const struct {
  const char *name;
  unsigned bytes;
} dtypes[] = {
    {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E5M2", 1}, {"F8_E4M3", 1},
    {"I16", 2},  {"U16", 2}, {"F16", 2}, {"BF16", 2},    {"I32", 4},
    {"U32", 4},  {"F32", 4}, {"I64", 8}, {"U64", 8},     {"F64", 8},
};

static void shape_str(const tensor *t, char *buf, size_t cap)
{
  size_t o = (size_t)snprintf(buf, cap, "[");
  for (int i = 0; i < t->ndim && o < cap; i++)
    o += (size_t)snprintf(buf + o, cap - o, "%s%llu", i ? ", " : "",
                          (unsigned long long)t->shape[i]);
  if (o < cap)
    snprintf(buf + o, cap - o, "]");
}

/* A non-negative JSON integer into *out; -1 when v is anything else. */
static int json_u64(const json_t *v, uint64_t *out)
{
  if (!json_is_integer(v) || json_integer_value(v) < 0)
    return -1;
  *out = (uint64_t)json_integer_value(v);
  return 0;
}

/* Read one tensor entry (the value e of the header object) into *t. */
static int read_tensor(const ctx *c, const json_t *e, tensor *t, uint64_t data_len)
{
  if (!json_is_object(e))
    return fail(c, "tensor '%s': entry is a JSON %s, not an object", t->name, ingest_json_type(e));
  const json_t *jd = json_object_get(e, "dtype"), *js = json_object_get(e, "shape"),
               *jo = json_object_get(e, "data_offsets");
  if (jd == NULL || js == NULL || jo == NULL)
    return fail(c, "tensor '%s': missing \"%s\"", t->name,
                jd == NULL   ? "dtype"
                : js == NULL ? "shape"
                             : "data_offsets");
  if (!json_is_string(jd))
    return fail(c, "tensor '%s': \"dtype\" is not a string", t->name);
  const char *dt = json_string_value(jd);
  size_t dlen = json_string_length(jd);
  if (dlen == 0 || dlen >= sizeof t->dtype || strlen(dt) != dlen)
    return fail(c, "tensor '%s': dtype of %zu bytes is not a safetensors dtype", t->name, dlen);
  memcpy(t->dtype, dt, dlen + 1);
  for (size_t i = 0; i < sizeof dtypes / sizeof dtypes[0]; i++)
    if (strcmp(t->dtype, dtypes[i].name) == 0) {
      t->known = 1;
      t->elem_bytes = dtypes[i].bytes;
    }
  if (!json_is_array(js))
    return fail(c, "tensor '%s': \"shape\" is not an array", t->name);
  if (json_array_size(js) > ST_MAX_DIMS)
    return fail(c, "tensor '%s': %zu dimensions (at most %d)", t->name, json_array_size(js),
                ST_MAX_DIMS);
  t->ndim = (int)json_array_size(js);
  uint64_t elems = 1;
  int overflow = 0;
  for (int i = 0; i < t->ndim; i++) {
    if (json_u64(json_array_get(js, (size_t)i), &t->shape[i]) != 0)
      return fail(c, "tensor '%s': shape[%d] is not a non-negative integer", t->name, i);
    if (t->shape[i] != 0 && elems > UINT64_MAX / t->shape[i])
      overflow = 1;
    else
      elems *= t->shape[i];
  }
  if (!json_is_array(jo) || json_array_size(jo) != 2 ||
      json_u64(json_array_get(jo, 0), &t->begin) != 0 || json_u64(json_array_get(jo, 1), &t->end) != 0)
    return fail(c, "tensor '%s': \"data_offsets\" must be [begin, end], two non-negative integers",
                t->name);
  if (t->begin > t->end || t->end > data_len)
    return fail(c,
                "tensor '%s': data_offsets [%llu, %llu] are not inside the %llu-byte data buffer",
                t->name, (unsigned long long)t->begin, (unsigned long long)t->end,
                (unsigned long long)data_len);
  if (t->known) {
    char sh[160];
    shape_str(t, sh, sizeof sh);
    if (overflow || elems > UINT64_MAX / t->elem_bytes)
      return fail(c, "tensor '%s': shape %s is too large", t->name, sh);
    if (elems * t->elem_bytes != t->end - t->begin)
      return fail(c, "tensor '%s': %s %s needs %llu bytes, data_offsets give %llu", t->name,
                  t->dtype, sh, (unsigned long long)(elems * t->elem_bytes),
                  (unsigned long long)(t->end - t->begin));
  }
  return 0;
}

/* "past_key_values.<l>.key" -> layer l, kind 0; ".value" -> kind 1. -1 if not such a name. */
static int per_layer_name(const char *name, uint32_t *layer, int *kind)
{
  size_t plen = strlen(ST_PER_LAYER_PREFIX);
  if (strncmp(name, ST_PER_LAYER_PREFIX, plen) != 0)
    return -1;
  const char *p = name + plen;
  if (*p < '0' || *p > '9' || (p[0] == '0' && p[1] >= '0' && p[1] <= '9'))
    return -1;
  uint64_t l = 0;
  while (*p >= '0' && *p <= '9' && l < 100000)
    l = l * 10 + (uint64_t)(*p++ - '0');
  if (strcmp(p, ".key") == 0)
    *kind = 0;
  else if (strcmp(p, ".value") == 0)
    *kind = 1;
  else
    return -1;
  *layer = (uint32_t)l;
  return 0;
}

static int kv_dtype(const tensor *t, kvdb_dtype *out)
{
  if (strcmp(t->dtype, "F16") == 0)
    *out = KVDB_F16;
  else if (strcmp(t->dtype, "BF16") == 0)
    *out = KVDB_BF16;
  else if (strcmp(t->dtype, "F32") == 0)
    *out = KVDB_F32;
  else
    return -1;
  return 0;
}

/* Checks shared by every K/V tensor: dtype agreed with the first one, shape == want. */
static int check_kv(const ctx *c, const tensor *t, const tensor *first, const uint64_t *want,
                    int ndim, const char *form)
{
  kvdb_dtype dt;
  if (kv_dtype(t, &dt) != 0)
    return fail(c, "tensor '%s' has dtype %s; K and V must be F16, BF16 or F32", t->name, t->dtype);
  if (strcmp(t->dtype, first->dtype) != 0)
    return fail(c, "tensor '%s' has dtype %s but '%s' has %s; K and V must share one dtype",
                t->name, t->dtype, first->name, first->dtype);
  int same = t->ndim == ndim;
  for (int i = 0; same && i < ndim; i++)
    same = t->shape[i] == want[i];
  if (!same) {
    char sh[160], ws[160];
    tensor w = {.ndim = ndim};
    memcpy(w.shape, want, (size_t)ndim * sizeof *want);
    shape_str(t, sh, sizeof sh);
    shape_str(&w, ws, sizeof ws);
    return fail(c, "tensor '%s' has shape %s, expected %s (%s)", t->name, sh, ws, form);
  }
  return 0;
}

static int parse_header(const ctx *c, const uint8_t *buf, size_t len, st_context *out)
{
  int rc = -1;
  json_t *hj = NULL;
  tensor *ts = NULL;
  size_t n_ts = 0;
  char jerr[200];
  const char *layout = NULL; /* __metadata__.kv_layout */
  if (len < 8)
    return fail(c, "truncated: %zu bytes; a safetensors file starts with an 8-byte header length",
                len);
  uint64_t hlen = 0;
  for (int i = 7; i >= 0; i--)
    hlen = hlen << 8 | buf[i];
  if (hlen < 2 || hlen > ST_MAX_HEADER_BYTES)
    return fail(c, "header length %llu is outside 2..%u bytes", (unsigned long long)hlen,
                ST_MAX_HEADER_BYTES);
  if (hlen > len - 8)
    return fail(c, "truncated: the header says %llu bytes, the file has %zu after the length",
                (unsigned long long)hlen, len - 8);
  const char *hdr = (const char *)buf + 8;
  hj = ingest_json_load(hdr, (size_t)hlen, ST_JSON_FLAGS, ST_MAX_PARSE_MEM, jerr, sizeof jerr);
  if (hj == NULL)
    return fail(c, "header is not valid JSON: %s", jerr);
  if (!json_is_object(hj)) {
    fail(c, "header is a JSON %s, not an object", ingest_json_type(hj));
    goto done;
  }
  const uint8_t *data = buf + 8 + hlen;
  uint64_t data_len = len - 8 - hlen;
  ts = calloc(json_object_size(hj) + 1u, sizeof *ts);
  if (ts == NULL) {
    fail(c, "out of memory");
    goto done;
  }
  /* members in the header's order (Jansson keeps insertion order); keys are unique
   * (JSON_REJECT_DUPLICATES) and hold no NUL (Jansson refuses one in a key) */
  const char *key;
  json_t *vj;
  json_object_foreach(hj, key, vj) {
    if (strcmp(key, "__metadata__") == 0) {
      if (!json_is_object(vj)) {
        fail(c, "\"__metadata__\" is a JSON %s, not an object", ingest_json_type(vj));
        goto done;
      }
      const json_t *mi = json_object_get(vj, "model_id"), *li = json_object_get(vj, "kv_layout");
      if (mi != NULL) {
        if (!json_is_string(mi)) {
          fail(c, "__metadata__.model_id is not a string");
          goto done;
        }
        const char *id = json_string_value(mi);
        size_t id_len = json_string_length(mi);
        if (id_len < 1 || id_len > 63 || strlen(id) != id_len) {
          fail(c, "__metadata__.model_id is %zu bytes (must be 1..63, no NUL)", id_len);
          goto done;
        }
        memcpy(out->model_id, id, id_len + 1);
      }
      if (li != NULL) {
        if (!json_is_string(li)) {
          fail(c, "__metadata__.kv_layout is not a string");
          goto done;
        }
        layout = json_string_value(li);
      }
      continue;
    }
    tensor *t = &ts[n_ts];
    if ((t->name = strdup(key)) == NULL) {
      fail(c, "out of memory");
      goto done;
    }
    n_ts++;
    if (read_tensor(c, vj, t, data_len) != 0)
      goto done;
  }

  /* tokens */
  const tensor *tok = NULL, *tk = NULL, *tv = NULL;
  for (size_t i = 0; i < n_ts; i++) {
    if (strcmp(ts[i].name, "tokens") == 0)
      tok = &ts[i];
    else if (strcmp(ts[i].name, "k") == 0)
      tk = &ts[i];
    else if (strcmp(ts[i].name, "v") == 0)
      tv = &ts[i];
  }
  if (tok == NULL) {
    fail(c, "no 'tokens' tensor (I32 [T] with the context's token ids)");
    goto done;
  }
  if (strcmp(tok->dtype, "I32") != 0) {
    fail(c, "tensor 'tokens' has dtype %s, expected I32", tok->dtype);
    goto done;
  }
  if (!(tok->ndim == 1 || (tok->ndim == 2 && tok->shape[0] == 1))) {
    char sh[160];
    shape_str(tok, sh, sizeof sh);
    fail(c, "tensor 'tokens' has shape %s, expected [T] or [1, T]", sh);
    goto done;
  }
  uint64_t T = tok->shape[tok->ndim - 1];
  if (T < 1) {
    fail(c, "tensor 'tokens' is empty");
    goto done;
  }
  out->tokens = malloc((size_t)T * sizeof *out->tokens);
  if (out->tokens == NULL) {
    fail(c, "out of memory for %llu tokens", (unsigned long long)T);
    goto done;
  }
  for (uint64_t i = 0; i < T; i++) {
    const uint8_t *p = data + tok->begin + 4 * i;
    uint32_t u = (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
    if (u & 0x80000000u) {
      fail(c, "tensor 'tokens': token %llu is negative (%d)", (unsigned long long)i,
           (int)(int32_t)u);
      goto done;
    }
    out->tokens[i] = u;
  }
  out->n_tokens = (size_t)T;

  /* K and V */
  uint32_t max_layer = 0;
  int n_per_layer = 0;
  for (size_t i = 0; i < n_ts; i++) {
    uint32_t l;
    int kind;
    if (per_layer_name(ts[i].name, &l, &kind) == 0) {
      n_per_layer++;
      if (l + 1 > max_layer)
        max_layer = l + 1;
    }
  }
  if ((tk != NULL || tv != NULL) && n_per_layer > 0) {
    fail(c, "both stacked 'k'/'v' and per-layer '" ST_PER_LAYER_PREFIX "<l>.key' tensors: "
            "use one form");
    goto done;
  }
  if (tk == NULL && tv == NULL && n_per_layer == 0) {
    fail(c, "no K/V tensors: expected 'k' and 'v' [L, T, H, D] or '" ST_PER_LAYER_PREFIX
            "<l>.key' and '" ST_PER_LAYER_PREFIX "<l>.value' [1, H, T, D] for l = 0..L-1");
    goto done;
  }
  if (n_per_layer == 0) {
    if (tk == NULL || tv == NULL) {
      fail(c, "tensor '%s' without '%s'", tk != NULL ? "k" : "v", tk != NULL ? "v" : "k");
      goto done;
    }
    int lhtd = 0;
    if (layout != NULL) {
      if (strcmp(layout, "LHTD") == 0) {
        lhtd = 1;
      } else if (strcmp(layout, "LTHD") != 0) {
        fail(c, "__metadata__.kv_layout '%.40s' is not LTHD or LHTD", layout);
        goto done;
      }
    }
    if (tk->ndim != 4) {
      char sh[160];
      shape_str(tk, sh, sizeof sh);
      fail(c, "tensor 'k' has shape %s, expected 4 dimensions %s", sh,
           lhtd ? "[L, H, T, D]" : "[L, T, H, D]");
      goto done;
    }
    uint64_t L = tk->shape[0], H = tk->shape[lhtd ? 1 : 2], D = tk->shape[3];
    uint64_t want[4] = {L, lhtd ? H : T, lhtd ? T : H, D};
    const char *form =
        lhtd ? "[L, H, T, D] with T from 'tokens'" : "[L, T, H, D] with T from 'tokens'";
    if (check_kv(c, tk, tk, want, 4, form) != 0 || check_kv(c, tv, tk, want, 4, form) != 0)
      goto done;
    if (L < 1 || L > 1024 || H < 1 || H > 1024 || D < 1 || D > 4096) {
      fail(c,
           "K/V shape: %llu layers, %llu KV heads, head_dim %llu (kvdb takes 1..1024, 1..1024, "
           "1..4096)",
           (unsigned long long)L, (unsigned long long)H, (unsigned long long)D);
      goto done;
    }
    kv_dtype(tk, &out->dtype);
    int64_t es = (int64_t)tk->elem_bytes;
    out->n_layers = (uint32_t)L;
    out->n_kv_heads = (uint32_t)H;
    out->head_dim = (uint32_t)D;
    out->lhtd = lhtd;
    kvdb_tensor_view *vk = &out->view.k, *vv = &out->view.v;
    vk->base = (void *)(uintptr_t)(data + tk->begin);
    vk->layer_stride = (int64_t)(T * H * D) * es;
    vk->token_stride = lhtd ? (int64_t)D * es : (int64_t)(H * D) * es;
    vk->head_stride = lhtd ? (int64_t)(T * D) * es : (int64_t)D * es;
    *vv = *vk;
    vv->base = (void *)(uintptr_t)(data + tv->begin);
  } else {
    if (max_layer > 1024 || n_per_layer != 2 * (int)max_layer) {
      /* name the first missing tensor */
      for (uint32_t l = 0; l < max_layer && l < 1025; l++)
        for (int kind = 0; kind < 2; kind++) {
          int have = 0;
          for (size_t i = 0; i < n_ts && !have; i++) {
            uint32_t tl;
            int tkind;
            have = per_layer_name(ts[i].name, &tl, &tkind) == 0 && tl == l && tkind == kind;
          }
          if (!have) {
            fail(c,
                 "tensor '" ST_PER_LAYER_PREFIX "%u.%s' is missing (layers 0..%u are "
                 "expected, both key and value)",
                 l, kind ? "value" : "key", max_layer - 1);
            goto done;
          }
        }
      fail(c, "%u layers of per-layer K/V tensors (kvdb takes at most 1024)", max_layer);
      goto done;
    }
    const tensor **by_layer = calloc(2u * max_layer, sizeof *by_layer);
    out->layer_bases = calloc(2u * max_layer, sizeof *out->layer_bases);
    if (by_layer == NULL || out->layer_bases == NULL) {
      free(by_layer);
      fail(c, "out of memory");
      goto done;
    }
    for (size_t i = 0; i < n_ts; i++) {
      uint32_t l;
      int kind;
      if (per_layer_name(ts[i].name, &l, &kind) == 0)
        by_layer[kind * (int)max_layer + (int)l] = &ts[i];
    }
    const tensor *first = by_layer[0];
    int batch = first->ndim == 4;
    if (first->ndim != 3 && first->ndim != 4) {
      char sh[160];
      shape_str(first, sh, sizeof sh);
      fail(c, "tensor '%s' has shape %s, expected [1, H, T, D] or [H, T, D]", first->name, sh);
      free(by_layer);
      goto done;
    }
    uint64_t H = first->shape[batch], D = first->shape[batch + 2];
    uint64_t want[4];
    int nd = 0;
    if (batch)
      want[nd++] = 1;
    want[nd++] = H;
    want[nd++] = T;
    want[nd++] = D;
    for (uint32_t i = 0; i < 2 * max_layer; i++)
      if (check_kv(c, by_layer[i], first, want, nd,
                   batch ? "[1, H, T, D] with T from 'tokens'"
                         : "[H, T, D] with T from 'tokens'") != 0) {
        free(by_layer);
        goto done;
      }
    if (H < 1 || H > 1024 || D < 1 || D > 4096) {
      fail(c, "K/V shape: %llu KV heads, head_dim %llu (kvdb takes 1..1024, 1..4096)",
           (unsigned long long)H, (unsigned long long)D);
      free(by_layer);
      goto done;
    }
    kv_dtype(first, &out->dtype);
    int64_t es = (int64_t)first->elem_bytes;
    out->per_layer = 1;
    out->n_layers = max_layer;
    out->n_kv_heads = (uint32_t)H;
    out->head_dim = (uint32_t)D;
    for (uint32_t i = 0; i < 2 * max_layer; i++)
      out->layer_bases[i] = (void *)(uintptr_t)(data + by_layer[i]->begin);
    free(by_layer);
    kvdb_tensor_view *vk = &out->view.k, *vv = &out->view.v;
    vk->layer_bases = out->layer_bases;
    vk->token_stride = (int64_t)D * es;
    vk->head_stride = (int64_t)(T * D) * es;
    *vv = *vk;
    vv->layer_bases = out->layer_bases + max_layer;
  }
  rc = 0;
done:
  for (size_t i = 0; ts != NULL && i < n_ts; i++)
    free(ts[i].name);
  free(ts);
  json_decref(hj);
  return rc;
}

int st_parse(const uint8_t *buf, size_t len, const char *name, st_context *c, char *err,
             size_t err_cap)
{
  memset(c, 0, sizeof *c);
  ctx cx = {name != NULL ? name : "(buffer)", err, err_cap};
  if (err_cap > 0)
    err[0] = '\0';
  if (buf == NULL && len > 0)
    return fail(&cx, "no data");
  if (parse_header(&cx, buf, len, c) != 0) {
    st_close(c);
    return -1;
  }
  return 0;
}

int st_open(const char *path, st_context *c, char *err, size_t err_cap)
{
  memset(c, 0, sizeof *c);
  ctx cx = {path, err, err_cap};
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return fail(&cx, "cannot open: %s", strerror(errno));
  struct stat sb;
  if (fstat(fd, &sb) != 0) {
    int e = errno;
    close(fd);
    return fail(&cx, "cannot stat: %s", strerror(e));
  }
  if (!S_ISREG(sb.st_mode)) {
    close(fd);
    return fail(&cx, "not a regular file");
  }
  size_t len = (size_t)sb.st_size;
  void *map = NULL;
  if (len > 0) {
    map = mmap(NULL, len, PROT_READ, MAP_PRIVATE, fd, 0);
    if (map == MAP_FAILED) {
      int e = errno;
      close(fd);
      return fail(&cx, "cannot map %zu bytes: %s", len, strerror(e));
    }
  }
  close(fd);
  static const uint8_t empty[1];
  if (st_parse(map != NULL ? map : empty, len, path, c, err, err_cap) != 0) {
    if (map != NULL)
      munmap(map, len);
    return -1;
  }
  c->map = map;
  c->map_len = len;
  return 0;
}

void st_close(st_context *c)
{
  free(c->tokens);
  free(c->layer_bases);
  if (c->map != NULL)
    munmap(c->map, c->map_len);
  memset(c, 0, sizeof *c);
}
