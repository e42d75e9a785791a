/* SPDX-License-Identifier: MIT */
/*
 * tools/refkv/refdecode.c — sparse decoding of the reference model over KV kept in kvdb
 * (refdecode.h): the select callback of refmodel_forward_sparse, which ranks positions with
 * kvdb_score_batch, fetches their rows with kvdb_get_head_tokens, and grows the stored context
 * block by block; and the dense-versus-sparse agreement measure.
 */
#define _POSIX_C_SOURCE 200809L
#include "refdecode.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

struct refdecode {
  kvdb *db;
  const refkv_model *m;
  refmodel_state *st;
  refdecode_opts o;
  int n_heads, n_kv_heads, kv_mul, head_size;
  size_t max_pos;
  uint32_t *tokens; /* the history: [0, n) */
  size_t n;
  size_t stored; /* positions [0, stored) are in the store, as context key ctx */
  kvdb_key ctx;
  /* scratch, max_pos (per head: * kv_mul) entries each */
  uint8_t *chosen;
  uint32_t *cand;   /* per head slot: candidate positions */
  float *cscore;    /* their scores */
  size_t *n_cand;   /* candidates per slot */
  size_t *order;    /* a sort permutation */
  uint32_t *fetch;  /* selected stored positions */
  int *list;        /* the attend list: stored positions, then the others */
  float *krows, *vrows;
  kvdb_decode *sess; /* opts.session: the session over the context, else NULL */
  uint32_t *spos;    /* session: kvdb_decode_select's [n_kv_heads][k] positions */
  uint32_t *spos_q;  /* session, PER_HEAD: [kv_mul][n_kv_heads][k], one select per query head
                        of each group */
  float *q_one;      /* session, PER_HEAD: one query head of each KV head, [n_kv_heads][hs] */
  size_t s_k;        /* session: the layer's rows per KV head (the same for every head) */
  kvdb_status err; /* the failure inside the callback */
  refdecode_stats stats;
};

void refdecode_opts_init(refdecode_opts *o)
{
  memset(o, 0, sizeof *o);
  o->budget = 0.2;
  o->window = 16;
  o->sinks = 0;
  o->scorer = REFDECODE_SCORE_STORE;
  o->combine = REFDECODE_SUM;
  o->session = 0;
  o->hot_tokens = 1024;
}

void refdecode_close(refdecode *d)
{
  if (d == NULL)
    return;
  kvdb_decode_close(d->sess);
  free(d->spos);
  free(d->spos_q);
  free(d->q_one);
  free(d->tokens);
  free(d->chosen);
  free(d->cand);
  free(d->cscore);
  free(d->n_cand);
  free(d->order);
  free(d->fetch);
  free(d->list);
  free(d->krows);
  free(d->vrows);
  free(d);
}

kvdb_status refdecode_open(kvdb *db, const refkv_model *m, refmodel_state *st,
                           const refdecode_opts *o, refdecode **out)
{
  if (out == NULL)
    return refkv_fail(KVDB_INVALID, "refdecode_open: out is NULL");
  *out = NULL;
  if (db == NULL || m == NULL || st == NULL || o == NULL)
    return refkv_fail(KVDB_INVALID, "refdecode_open: %s is NULL",
                      db == NULL ? "db" : m == NULL ? "model" : st == NULL ? "state" : "opts");
  if (m->storage != REFKV_STORE_F32)
    return refkv_fail(KVDB_INVALID, "refdecode_open: storage %s (sparse decoding reads f32 rows)",
                      refkv_storage_name(m->storage));
  if (o->scorer == REFDECODE_SCORE_STORE && m->km.score_bits == 0)
    return refkv_fail(KVDB_INVALID,
                      "refdecode_open: model %s keeps no score copies (set km.score_bits 8 or 4 "
                      "for the STORE scorer)",
                      m->id);
  if ((unsigned)o->scorer > REFDECODE_SCORE_EXACT || (unsigned)o->combine > REFDECODE_PER_HEAD)
    return refkv_fail(KVDB_INVALID, "refdecode_open: scorer %d or combine %d unknown",
                      (int)o->scorer, (int)o->combine);
  if (o->session && o->scorer != REFDECODE_SCORE_STORE)
    return refkv_fail(KVDB_INVALID,
                      "refdecode_open: a session selects with the store's copies (not the EXACT "
                      "scorer)");
  if (!(o->budget > 0) || o->window < 1)
    return refkv_fail(KVDB_INVALID, "refdecode_open: budget %g (must be > 0), window %u (>= 1)",
                      o->budget, o->window);
  const refmodel_config *c = refmodel_model_config(m->rm);
  if (o->combine == REFDECODE_PER_HEAD && c->n_heads / c->n_kv_heads > 8)
    return refkv_fail(KVDB_INVALID, "refdecode_open: PER_HEAD with %d query heads per KV head "
                      "(at most 8)", c->n_heads / c->n_kv_heads);
  refdecode *d = calloc(1, sizeof *d);
  if (d == NULL)
    return refkv_fail(KVDB_NOMEM, "refdecode_open: out of memory");
  d->db = db;
  d->m = m;
  d->st = st;
  d->o = *o;
  d->n_heads = c->n_heads;
  d->n_kv_heads = c->n_kv_heads;
  d->kv_mul = c->n_heads / c->n_kv_heads;
  d->head_size = c->head_size;
  d->max_pos = (size_t)refmodel_state_max_pos(st);
  size_t mp = d->max_pos, km = (size_t)d->kv_mul, hs = (size_t)c->head_size;
  d->tokens = malloc(mp * sizeof *d->tokens);
  d->chosen = calloc(mp, 1);
  d->cand = malloc(mp * km * sizeof *d->cand);
  d->cscore = malloc(mp * km * sizeof *d->cscore);
  d->n_cand = calloc(km, sizeof *d->n_cand);
  d->order = malloc(mp * sizeof *d->order);
  size_t nkv = (size_t)c->n_kv_heads;
  d->fetch = malloc(mp * sizeof *d->fetch);
  d->list = malloc(nkv * mp * sizeof *d->list);
  d->spos = malloc(nkv * mp * sizeof *d->spos);
  d->spos_q = malloc(km * nkv * mp * sizeof *d->spos_q);
  d->q_one = malloc(nkv * hs * sizeof *d->q_one);
  d->krows = malloc(nkv * mp * hs * sizeof(float));
  d->vrows = malloc(nkv * mp * hs * sizeof(float));
  if (!d->tokens || !d->chosen || !d->cand || !d->cscore || !d->n_cand || !d->order ||
      !d->fetch || !d->list || !d->spos || !d->spos_q || !d->q_one || !d->krows || !d->vrows) {
    refdecode_close(d);
    return refkv_fail(KVDB_NOMEM, "refdecode_open: out of memory for %zu positions", mp);
  }
  *out = d;
  return KVDB_OK;
}

size_t refdecode_length(const refdecode *d)
{
  return d->n;
}

const refdecode_stats *refdecode_get_stats(const refdecode *d)
{
  return &d->stats;
}

/* Store the history's first n positions (from the state's cache) as the context. */
static kvdb_status store(refdecode *d, size_t n)
{
  kvdb_put_info info;
  kvdb_status rc = refkv_put(d->db, d->m, d->st, d->tokens, n, &info);
  if (rc != KVDB_OK)
    return rc;
  d->stored = n;
  d->ctx = info.context;
  d->stats.puts++;
  return KVDB_OK;
}

kvdb_status refdecode_begin(refdecode *d, const int *tokens, size_t n)
{
  if (d == NULL || tokens == NULL || n < 1 || n > d->max_pos)
    return refkv_fail(KVDB_INVALID, "refdecode_begin: %zu tokens (the state holds 1..%zu)", n,
                      d != NULL ? d->max_pos : 0);
  for (size_t i = 0; i < n; i++)
    d->tokens[i] = (uint32_t)tokens[i];
  d->n = n;
  d->stored = 0;
  kvdb_decode_close(d->sess);
  d->sess = NULL;
  kvdb_status rc = store(d, n);
  if (rc != KVDB_OK || !d->o.session)
    return rc;
  kvdb_decode_opts so;
  kvdb_decode_opts_init(&so);
  so.recent_tokens = d->o.window;
  so.hot_tokens = d->o.hot_tokens;
  so.combine = d->o.combine == REFDECODE_MAX ? KVDB_SCORE_MAX : KVDB_SCORE_SUM;
  so.n_threads = 1;
  rc = kvdb_decode_open(d->db, &d->m->km, &d->ctx, 1, &so, &d->sess);
  if (rc != KVDB_OK)
    return refkv_fail(rc, "kvdb_decode_open: %s: %s", kvdb_status_name(rc), kvdb_errmsg());
  return KVDB_OK;
}

/* A kvdb view of n_tok rows per KV head at base: token i of head h at base + (h * n_tok + i) *
 * head_size floats (the layout the refmodel_attend rows of each head then read). */
static void rows_view(const refdecode *d, float *base, size_t n_tok, kvdb_tensor_view *v)
{
  memset(v, 0, sizeof *v);
  v->base = base;
  v->token_stride = (int64_t)((size_t)d->head_size * sizeof(float));
  v->head_stride = (int64_t)(n_tok * (size_t)d->head_size * sizeof(float));
}

/* Refresh the stats from the session's. */
static kvdb_status session_stats(refdecode *d)
{
  kvdb_decode_stats ss;
  kvdb_status rc = kvdb_decode_stat(d->sess, &ss);
  if (rc != KVDB_OK)
    return refkv_fail(rc, "kvdb_decode_stat: %s", kvdb_errmsg());
  d->stats.rows_store = ss.cold_reads;
  d->stats.rows_dram = ss.hot_hits;
  d->stats.score_bytes = ss.score_bytes;
  d->stats.fetch_bytes = ss.ssd_bytes;
  d->stats.appended = ss.appended;
  return KVDB_OK;
}

kvdb_status refdecode_append(refdecode *d, int token)
{
  if (d == NULL || d->n >= d->max_pos || d->n == 0)
    return refkv_fail(KVDB_INVALID, "refdecode_append: %s",
                      d == NULL ? "decoder is NULL" : d->n == 0 ? "no history" : "state full");
  if (d->sess != NULL) { /* its K and V from the state's cache, every layer and KV head */
    size_t mp = d->max_pos, kv_dim = d->m->kv_dim;
    kvdb_kv_view v;
    memset(&v, 0, sizeof v);
    v.k.base = refmodel_state_key(d->st, 0, (int)d->n);
    v.k.layer_stride = (int64_t)(mp * kv_dim * sizeof(float));
    v.k.token_stride = (int64_t)(kv_dim * sizeof(float));
    v.k.head_stride = (int64_t)((size_t)d->head_size * sizeof(float));
    v.v = v.k;
    v.v.base = refmodel_state_value(d->st, 0, (int)d->n);
    uint32_t t = (uint32_t)token;
    kvdb_status rc = kvdb_decode_append(d->sess, 0, &t, 1, &v);
    if (rc != KVDB_OK)
      return refkv_fail(rc, "kvdb_decode_append (position %zu): %s: %s", d->n,
                        kvdb_status_name(rc), kvdb_errmsg());
    d->tokens[d->n++] = t;
    return session_stats(d);
  }
  d->tokens[d->n++] = (uint32_t)token;
  size_t bt = d->m->km.block_tokens, full = d->n - d->n % bt;
  return full > d->stored ? store(d, full) : KVDB_OK;
}

/* Candidates (pos, score) of one slot sorted: higher score first, lower position on ties. */
static _Thread_local const float *g_sort_score;
static _Thread_local const uint32_t *g_sort_pos;
static int cmp_cand(const void *a, const void *b)
{
  size_t i = *(const size_t *)a, j = *(const size_t *)b;
  float si = g_sort_score[i], sj = g_sort_score[j];
  if (si != sj)
    return si > sj ? -1 : 1;
  return g_sort_pos[i] < g_sort_pos[j] ? -1 : g_sort_pos[i] > g_sort_pos[j];
}

static float dotf(const float *a, const float *b, size_t n)
{
  float s = 0;
  for (size_t i = 0; i < n; i++)
    s += a[i] * b[i];
  return s;
}

/*
 * Score the candidates of one KV head into slots: one slot for SUM and MAX, one per query head
 * for PER_HEAD. Candidates are positions in [0, lo) not chosen: stored ones ranked by the store
 * (its top k_store of them) or exactly, the others exactly from the cache.
 */
static kvdb_status score_candidates(refdecode *d, int layer, int g, const float *q, size_t lo,
                                    size_t r, size_t n_slots)
{
  size_t hs = (size_t)d->head_size, mp = d->max_pos;
  size_t stored_lo = d->stored < lo ? d->stored : lo;
  for (size_t s = 0; s < n_slots; s++)
    d->n_cand[s] = 0;
  size_t host_from = 0; /* positions [host_from, lo) are scored on the host */
  if (d->o.scorer == REFDECODE_SCORE_STORE && stored_lo > 0) {
    size_t ex = 0; /* chosen positions among the stored ones the store may rank first */
    for (size_t t = 0; t < stored_lo; t++)
      ex += d->chosen[t];
    size_t above = d->stored - stored_lo; /* stored positions in the window: chosen too */
    size_t k = r + ex + above;
    if (k > d->stored)
      k = d->stored;
    kvdb_score_req req[8];
    kvdb_score_opts so;
    kvdb_score_opts_init(&so);
    so.combine = d->o.combine == REFDECODE_MAX ? KVDB_SCORE_MAX : KVDB_SCORE_SUM;
    so.n_threads = 1;
    size_t n_req = n_slots;
    if (n_req > 8)
      return refkv_fail(KVDB_INVALID, "refdecode: %zu query heads per KV head (at most 8)",
                        n_req);
    for (size_t s = 0; s < n_req; s++) {
      memset(&req[s], 0, sizeof req[s]);
      req[s].layer = (uint32_t)layer;
      req[s].kv_head = (uint32_t)g;
      req[s].q = n_slots == 1 ? q : q + s * hs;
      req[s].n_q = n_slots == 1 ? (uint32_t)d->kv_mul : 1;
      req[s].k = (uint32_t)k;
      req[s].positions = d->cand + s * mp;
      req[s].scores = d->cscore + s * mp;
    }
    kvdb_score_stats ss;
    memset(&ss, 0, sizeof ss);
    kvdb_status rc =
        kvdb_score_batch(d->db, &d->m->km, &d->ctx, KVDB_F32, req, n_req, &so, &ss);
    if (rc != KVDB_OK)
      return refkv_fail(rc, "kvdb_score_batch (layer %d, KV head %d, k %zu of %zu): %s: %s",
                        layer, g, k, d->stored, kvdb_status_name(rc), kvdb_errmsg());
    d->stats.score_bytes += ss.host_bytes;
    for (size_t s = 0; s < n_req; s++) { /* drop the chosen and the window */
      uint32_t *cp = d->cand + s * mp;
      float *cs = d->cscore + s * mp;
      size_t w = 0;
      for (size_t i = 0; i < k; i++)
        if (cp[i] < lo && !d->chosen[cp[i]]) {
          cp[w] = cp[i];
          cs[w++] = cs[i];
        }
      d->n_cand[s] = w;
    }
    host_from = stored_lo;
  }
  for (size_t t = host_from; t < lo; t++) {
    if (d->chosen[t])
      continue;
    const float *kr = refmodel_state_key(d->st, layer, (int)t) + (size_t)g * hs;
    if (n_slots == 1) {
      float sc = 0;
      for (int j = 0; j < d->kv_mul; j++) {
        float x = dotf(q + (size_t)j * hs, kr, hs);
        sc = d->o.combine == REFDECODE_MAX ? (j == 0 || x > sc ? x : sc) : sc + x;
      }
      d->cand[d->n_cand[0]] = (uint32_t)t;
      d->cscore[d->n_cand[0]++] = sc;
    } else {
      for (size_t s = 0; s < n_slots; s++) {
        d->cand[s * mp + d->n_cand[s]] = (uint32_t)t;
        d->cscore[s * mp + d->n_cand[s]++] = dotf(q + s * hs, kr, hs);
      }
    }
  }
  return KVDB_OK;
}

/* Sort slot s's candidates in place (best first). */
static void sort_slot(refdecode *d, size_t s)
{
  size_t mp = d->max_pos, n = d->n_cand[s];
  uint32_t *cp = d->cand + s * mp;
  float *cs = d->cscore + s * mp;
  for (size_t i = 0; i < n; i++)
    d->order[i] = i;
  g_sort_score = cs;
  g_sort_pos = cp;
  qsort(d->order, n, sizeof *d->order, cmp_cand);
  /* apply the permutation through the attend list's scratch (free at this point) */
  uint32_t *tp = d->fetch;
  float *ts = d->krows;
  for (size_t i = 0; i < n; i++) {
    tp[i] = cp[d->order[i]];
    ts[i] = cs[d->order[i]];
  }
  memcpy(cp, tp, n * sizeof *cp);
  memcpy(cs, ts, n * sizeof *cs);
}

/* The budget at context size ctx: max(1, floor(budget * ctx)), at most ctx. */
static size_t budget_of(const refdecode *d, size_t ctx)
{
  size_t budget = d->o.budget >= 1 ? ctx : (size_t)floor(d->o.budget * (double)ctx);
  return budget < 1 ? 1 : budget > ctx ? ctx : budget;
}

/*
 * The session's selection for a whole layer (at KV head 0; the other heads take theirs from
 * it): every KV head gets the window and the sinks, then its own best positions by
 * kvdb_decode_select until the budget is full (the same count for every head, as
 * kvdb_decode_fetch wants), and their rows by kvdb_decode_fetch.
 */
static kvdb_status session_layer(refdecode *d, int layer, size_t p)
{
  size_t ctx = p + 1, budget = budget_of(d, ctx), nkv = (size_t)d->n_kv_heads;
  size_t w = d->o.window < budget ? d->o.window : budget, lo = ctx - w, mp = d->max_pos;
  memset(d->chosen, 0, ctx);
  size_t n_fixed = 0; /* positions every head attends to besides p: window and sinks */
  for (size_t t = lo; t < p; t++, n_fixed++)
    d->chosen[t] = 1;
  for (size_t t = 0; t < d->o.sinks && t < lo && n_fixed + 1 < budget; t++, n_fixed++)
    d->chosen[t] = 1;
  size_t r = budget - 1 - n_fixed, kb = budget - 1;
  for (size_t h = 0; h < nkv; h++) { /* the fixed ones first, ascending */
    size_t n = 0;
    for (size_t t = 0; t < p; t++)
      if (d->chosen[t])
        d->list[h * mp + n++] = (int)t;
  }
  if (r > 0 && d->o.combine == REFDECODE_PER_HEAD) {
    /* One select per query head j of every group (n_q_heads = n_kv_heads: head g's query is
     * head g * kv_mul + j's), then each KV head's budget filled round-robin over its heads. */
    size_t k = r + n_fixed, hs = (size_t)d->head_size, km = (size_t)d->kv_mul;
    const float *q = refmodel_state_query(d->st, layer);
    for (size_t j = 0; j < km; j++) {
      for (size_t g = 0; g < nkv; g++)
        memcpy(d->q_one + g * hs, q + (g * km + j) * hs, hs * sizeof(float));
      kvdb_status rc = kvdb_decode_select(d->sess, 0, (uint32_t)layer, d->q_one, KVDB_F32,
                                          (uint32_t)nkv, (uint32_t)k, d->spos_q + j * nkv * k,
                                          NULL);
      if (rc != KVDB_OK)
        return refkv_fail(rc, "kvdb_decode_select (layer %d, query head %zu of each group, k %zu "
                          "of %zu): %s: %s", layer, j, k, p, kvdb_status_name(rc), kvdb_errmsg());
    }
    for (size_t h = 0; h < nkv; h++) {
      size_t n = n_fixed, next[8] = {0};
      for (int progress = 1; n < kb && progress;) {
        progress = 0;
        for (size_t j = 0; j < km && j < 8 && n < kb; j++) {
          const uint32_t *lst = d->spos_q + (j * nkv + h) * k;
          while (next[j] < k && d->chosen[lst[next[j]]])
            next[j]++;
          if (next[j] < k) {
            uint32_t t = lst[next[j]++];
            d->chosen[t] = 2; /* taken for this head; cleared below */
            d->list[h * mp + n++] = (int)t;
            progress = 1;
          }
        }
      }
      for (size_t i = n_fixed; i < n; i++) /* the next head starts from the fixed ones */
        d->chosen[d->list[h * mp + i]] = 0;
      if (n != kb)
        return refkv_fail(KVDB_INVALID, "refdecode: layer %d, KV head %zu: %zu of %zu positions",
                          layer, h, n, kb);
    }
  } else if (r > 0) {
    size_t k = r + n_fixed; /* enough to leave r after dropping the fixed ones */
    kvdb_status rc = kvdb_decode_select(d->sess, 0, (uint32_t)layer,
                                        refmodel_state_query(d->st, layer), KVDB_F32,
                                        (uint32_t)d->n_heads, (uint32_t)k, d->spos, NULL);
    if (rc != KVDB_OK)
      return refkv_fail(rc, "kvdb_decode_select (layer %d, k %zu of %zu): %s: %s", layer, k, p,
                        kvdb_status_name(rc), kvdb_errmsg());
    for (size_t h = 0; h < nkv; h++) {
      size_t n = n_fixed;
      for (size_t i = 0; i < k && n < kb; i++) {
        uint32_t t = d->spos[h * k + i];
        if (!d->chosen[t])
          d->list[h * mp + n++] = (int)t;
      }
      if (n != kb)
        return refkv_fail(KVDB_INVALID, "refdecode: layer %d, KV head %zu: %zu of %zu positions",
                          layer, h, n, kb);
    }
  }
  d->s_k = kb;
  if (kb == 0)
    return KVDB_OK;
  for (size_t h = 0; h < nkv; h++)
    for (size_t i = 0; i < kb; i++)
      d->spos[h * kb + i] = (uint32_t)d->list[h * mp + i];
  kvdb_kv_view v;
  rows_view(d, d->krows, kb, &v.k);
  rows_view(d, d->vrows, kb, &v.v);
  kvdb_status rc = kvdb_decode_fetch(d->sess, 0, (uint32_t)layer, d->spos, (uint32_t)kb, &v);
  if (rc != KVDB_OK)
    return refkv_fail(rc, "kvdb_decode_fetch (layer %d, %zu rows per KV head): %s: %s", layer,
                      kb, kvdb_status_name(rc), kvdb_errmsg());
  d->stats.attended += nkv * (kb + 1);
  d->stats.context += nkv * ctx;
  d->stats.heads += nkv;
  return KVDB_OK;
}

static int select_cb(void *user, int layer, int g, int pos, const float *q, int n_q,
                     refmodel_attend *out)
{
  refdecode *d = user;
  if (d->sess != NULL) {
    if (g == 0) {
      kvdb_status rc = session_layer(d, layer, (size_t)pos);
      if (rc != KVDB_OK) {
        d->err = rc;
        return 1;
      }
    }
    size_t kb = d->s_k, hs = (size_t)d->head_size;
    out->pos = d->list + (size_t)g * d->max_pos;
    out->n = (int)kb;
    out->k = d->krows + (size_t)g * kb * hs;
    out->v = d->vrows + (size_t)g * kb * hs;
    out->n_rows = (int)kb;
    out->row_stride = hs;
    return 0;
  }
  size_t p = (size_t)pos, ctx = p + 1, hs = (size_t)d->head_size, mp = d->max_pos;
  (void)n_q;
  size_t budget = budget_of(d, ctx);
  size_t w = d->o.window < budget ? d->o.window : budget;
  size_t lo = ctx - w; /* the window: [lo, p] */
  memset(d->chosen, 0, ctx);
  size_t n_chosen = w; /* pos included */
  for (size_t t = lo; t <= p; t++)
    d->chosen[t] = 1;
  for (size_t t = 0; t < d->o.sinks && t < lo && n_chosen < budget; t++, n_chosen++)
    d->chosen[t] = 1;
  size_t r = budget - n_chosen;
  if (r > 0) {
    size_t n_slots = d->o.combine == REFDECODE_PER_HEAD ? (size_t)d->kv_mul : 1;
    kvdb_status rc = score_candidates(d, layer, g, q, lo, r, n_slots);
    if (rc != KVDB_OK) {
      d->err = rc;
      return 1;
    }
    for (size_t s = 0; s < n_slots; s++)
      sort_slot(d, s);
    size_t next[8] = {0};
    for (int progress = 1; r > 0 && progress;) {
      progress = 0;
      for (size_t s = 0; s < n_slots && r > 0; s++) {
        const uint32_t *cp = d->cand + s * mp;
        while (next[s] < d->n_cand[s] && d->chosen[cp[next[s]]])
          next[s]++;
        if (next[s] < d->n_cand[s]) {
          d->chosen[cp[next[s]++]] = 1;
          r--;
          progress = 1;
        }
      }
    }
  }
  /* The attend list: stored positions first (rows fetched), then those of the cache. */
  size_t nf = 0, nl = 0;
  for (size_t t = 0; t < p && t < d->stored; t++)
    if (d->chosen[t])
      d->fetch[nf++] = (uint32_t)t;
  for (size_t i = 0; i < nf; i++)
    d->list[nl++] = (int)d->fetch[i];
  for (size_t t = d->stored; t < p; t++)
    if (d->chosen[t])
      d->list[nl++] = (int)t;
  if (nf > 0) {
    kvdb_fetch_stats fs;
    memset(&fs, 0, sizeof fs);
    kvdb_status rc = kvdb_get_head_tokens(d->db, &d->m->km, &d->ctx, (uint32_t)layer,
                                          (uint32_t)g, d->fetch, nf, d->krows, d->vrows, NULL, &fs);
    if (rc != KVDB_OK) {
      d->err = refkv_fail(rc, "kvdb_get_head_tokens (layer %d, KV head %d, %zu rows): %s: %s",
                          layer, g, nf, kvdb_status_name(rc), kvdb_errmsg());
      return 1;
    }
    d->stats.fetch_bytes += fs.host_bytes;
  }
  d->stats.heads++;
  d->stats.attended += nl + 1;
  d->stats.context += ctx;
  d->stats.rows_store += nf;
  d->stats.rows_dram += nl - nf;
  out->pos = d->list;
  out->n = (int)nl;
  out->k = d->krows;
  out->v = d->vrows;
  out->n_rows = (int)nf;
  out->row_stride = hs;
  return 0;
}

kvdb_status refdecode_step(refdecode *d, int token, const float **logits)
{
  if (d == NULL || d->n == 0 || d->n >= d->max_pos)
    return refkv_fail(KVDB_INVALID, "refdecode_step: %s",
                      d == NULL ? "decoder is NULL" : d->n == 0 ? "no history" : "state full");
  d->err = KVDB_OK;
  int rc = refmodel_forward_sparse(d->st, token, (int)d->n, select_cb, d, logits);
  if (rc == REFMODEL_EABORTED && d->err != KVDB_OK)
    return d->err; /* the message is the callback's */
  if (rc != REFMODEL_OK)
    return refkv_fail(KVDB_INVALID, "refdecode_step: %s: %s", refmodel_strerror(rc),
                      refmodel_errmsg());
  d->stats.steps++;
  return KVDB_OK;
}

/* KL(p || q) of two logit vectors' softmaxes, nats. */
static double kl_logits(const float *lp, const float *lq, int n)
{
  double mp = lp[0], mq = lq[0];
  for (int i = 1; i < n; i++) {
    mp = lp[i] > mp ? lp[i] : mp;
    mq = lq[i] > mq ? lq[i] : mq;
  }
  double zp = 0, zq = 0;
  for (int i = 0; i < n; i++) {
    zp += exp(lp[i] - mp);
    zq += exp(lq[i] - mq);
  }
  double kl = 0;
  for (int i = 0; i < n; i++) {
    double a = lp[i] - mp - log(zp), b = lq[i] - mq - log(zq);
    kl += exp(a) * (a - b);
  }
  return kl > 0 ? kl : 0;
}

kvdb_status refdecode_agreement(kvdb *db, const refkv_model *m, const refkv_model *fr_model,
                                const refdecode_opts *o, refmodel_state *a, refmodel_state *b,
                                const int *prompt, size_t n, int steps, refdecode_agree *out)
{
  if (db == NULL || m == NULL || o == NULL || a == NULL || prompt == NULL || out == NULL ||
      n < 1 || steps < 1 || (fr_model != NULL && b == NULL))
    return refkv_fail(KVDB_INVALID, "refdecode_agreement: bad arguments");
  memset(out, 0, sizeof *out);
  if (n + (size_t)steps > (size_t)refmodel_state_max_pos(a) ||
      (b != NULL && n + (size_t)steps > (size_t)refmodel_state_max_pos(b)))
    return refkv_fail(KVDB_INVALID, "refdecode_agreement: %zu + %d positions exceed the state",
                      n, steps);
  int vocab = refmodel_model_config(m->rm)->vocab_size;
  int *dense = malloc((size_t)steps * sizeof(int));
  float *sl = malloc((size_t)vocab * sizeof(float));
  refdecode *d = NULL;
  kvdb_status rc = KVDB_OK;
  if (dense == NULL || sl == NULL) {
    rc = refkv_fail(KVDB_NOMEM, "refdecode_agreement: out of memory");
    goto done;
  }
  /* Teacher-forced, one state: the sparse step, then the dense step over the same token. */
  if (refmodel_prefill(a, prompt, (int)n, 0, NULL) != REFMODEL_OK) {
    rc = refkv_fail(KVDB_INVALID, "refdecode_agreement: prefill: %s", refmodel_errmsg());
    goto done;
  }
  if ((rc = refdecode_open(db, m, a, o, &d)) != KVDB_OK ||
      (rc = refdecode_begin(d, prompt, n - 1)) != KVDB_OK)
    goto done;
  int tok = prompt[n - 1];
  double kl = 0;
  for (int i = 0; i < steps; i++) {
    const float *lg;
    size_t pos = n - 1 + (size_t)i;
    if ((rc = refdecode_step(d, tok, &lg)) != KVDB_OK)
      goto done;
    memcpy(sl, lg, (size_t)vocab * sizeof(float));
    int sparse_tok = refmodel_argmax(sl, vocab);
    if (refmodel_forward(a, tok, (int)pos, &lg) != REFMODEL_OK) {
      rc = refkv_fail(KVDB_INVALID, "refdecode_agreement: %s", refmodel_errmsg());
      goto done;
    }
    dense[i] = refmodel_argmax(lg, vocab);
    out->tf_agree += sparse_tok == dense[i];
    kl += kl_logits(lg, sl, vocab);
    if ((rc = refdecode_append(d, tok)) != KVDB_OK)
      goto done;
    tok = dense[i];
  }
  out->steps = steps;
  out->tf_mean_kl = kl / steps;
  out->tf = d->stats;
  refdecode_close(d);
  d = NULL;
  out->fr_first_diff = steps;
  if (fr_model == NULL)
    goto done;
  /* Free-running: the second state decodes its own argmaxes sparsely. */
  if (refmodel_prefill(b, prompt, (int)n - 1, 0, NULL) != REFMODEL_OK) {
    rc = refkv_fail(KVDB_INVALID, "refdecode_agreement: prefill: %s", refmodel_errmsg());
    goto done;
  }
  if ((rc = refdecode_open(db, fr_model, b, o, &d)) != KVDB_OK ||
      (rc = refdecode_begin(d, prompt, n - 1)) != KVDB_OK)
    goto done;
  tok = prompt[n - 1];
  for (int i = 0; i < steps; i++) {
    const float *lg;
    if ((rc = refdecode_step(d, tok, &lg)) != KVDB_OK || (rc = refdecode_append(d, tok)) != KVDB_OK)
      goto done;
    tok = refmodel_argmax(lg, vocab);
    if (tok == dense[i])
      out->fr_agree++;
    else if (out->fr_first_diff == steps)
      out->fr_first_diff = i;
  }
done:
  refdecode_close(d);
  free(dense);
  free(sl);
  return rc;
}

kvdb_status refdecode_prompts(const refmodel_tokenizer *tok, const char *text, size_t len,
                              int n_prompts, int prompt_len, int *out, int *got)
{
  if (got != NULL)
    *got = 0;
  if (tok == NULL || text == NULL || out == NULL || got == NULL || prompt_len < 2 || n_prompts < 0)
    return refkv_fail(KVDB_INVALID, "refdecode_prompts: bad arguments (prompt_len %d)",
                      prompt_len);
  size_t cap = 0;
  int *buf = NULL;
  size_t at = 0;
  kvdb_status rc = KVDB_OK;
  while (*got < n_prompts && at < len) {
    while (at < len && text[at] == '\n') /* the start of a paragraph */
      at++;
    size_t end = at, n_tok = 0;
    for (;;) { /* add paragraphs until the encoding holds prompt_len tokens */
      size_t next = end;
      while (next + 1 < len && !(text[next] == '\n' && text[next + 1] == '\n'))
        next++;
      next = next + 1 < len ? next + 2 : len;
      if (next <= end)
        break;
      end = next;
      size_t need = refmodel_encode_bound(end - at);
      if (need > cap) {
        int *nb = realloc(buf, need * sizeof *nb);
        if (nb == NULL) {
          rc = refkv_fail(KVDB_NOMEM, "refdecode_prompts: out of memory");
          goto done;
        }
        buf = nb;
        cap = need;
      }
      if (refmodel_encode(tok, text + at, end - at, REFMODEL_ENCODE_BOS, buf, cap, &n_tok) !=
          REFMODEL_OK) {
        rc = refkv_fail(KVDB_INVALID, "refdecode_prompts: %s", refmodel_errmsg());
        goto done;
      }
      if (n_tok >= (size_t)prompt_len || end >= len)
        break;
    }
    if (n_tok < (size_t)prompt_len)
      break;
    memcpy(out + (size_t)*got * (size_t)prompt_len, buf, (size_t)prompt_len * sizeof *buf);
    (*got)++;
    at = end;
  }
done:
  free(buf);
  return rc;
}
