/* SPDX-License-Identifier: MIT */
/*
 * engine/ops/decode.c — decoding from the store (kvdb.h "Decoding from the store"): a session
 * over stored contexts that grow by appends, the per-step top-k (kvdb_score_batch over the
 * published tokens, the CPU over the unpublished ones, merged), the fetch of the chosen rows
 * (DRAM, else kvdb_get_head_tokens: page groups, then rows) and the hot pools of HillInfer's
 * BKP (seed 002 §4.2) with APP's split (§4.3) per step.
 *
 * STATE PER CONTEXT
 *   tokens     every token id (the chain hashes of an append need them all).
 *   window     K and V of tokens [win_t0, n_tok) for every layer and KV head, packed
 *              [layer][K,V][token][head][dim]: the recent W tokens (pinned), the unpublished
 *              ones, and the published tokens of the last block when it is partial (an append
 *              rewrites that block whole: kv_put_append writes from the window).
 *   hot[l][h]  the hot pool of layer l, KV head h: a hit-rate table of 2 bytes per token, a
 *              token -> slot map, `hot_tokens` slots of a K and a V row, and the candidates
 *              (rows the last fetch read from the store) that the deferred work promotes.
 * BKP's WORK after a fetch of (context, layer) (hot_update: ageing, demotion, promotion) runs on
 * the session's worker thread (bg_*) while the caller goes on with the next layers; a select or
 * fetch of that (context, layer) waits for it, an append, flush, stat or close for all of it.
 * The same work in the same order per (context, layer) as when it ran inline: the same pools.
 * APPEND: rows are copied into the window; when the last block fills, the published part grows
 * to the last full block through kv_put_append (one catalog transaction that also retires the
 * previous record), and the window drops what it no longer needs.
 */
#define _GNU_SOURCE
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "catalog/catalog.h"
#include "ops_int.h"
#include "score.h"

#define DEC_MAX_CONTEXTS 1024u
#define DEC_MAX_RECENT 65536u
#define DEC_MAX_HOT (1u << 24)
#define DEC_HIT 64 /* a selection's weight in the hit-rate table; a step ages it by 1/8 */

typedef struct dec_hot {
  uint16_t *hits;      /* hit-rate table: tab_cap entries */
  int32_t *slot;       /* token -> slot, -1: not hot; tab_cap entries */
  uint8_t *pick;       /* KVDB_DECODE_PAGE_GROUPS: 1 for the last select's true top k (the
                          rows a fetch counts and may promote; not their groups' other rows) */
  uint32_t *slot_pos;  /* slot -> token, UINT32_MAX: free; hot_cap entries */
  uint8_t *rows;       /* hot_cap slots of K row then V row */
  uint32_t n_used;
  uint32_t *cand_pos;  /* rows read by the last fetch (promotion candidates) */
  uint8_t *cand_rows;
  uint32_t n_cand, cand_cap;
} dec_hot;

typedef struct dec_ctx {
  uint8_t key[16];
  uint64_t n_tok, n_pub;
  uint32_t *tokens;
  size_t tok_cap;
  uint64_t win_t0;
  size_t win_cap;      /* tokens the window has room for */
  uint8_t *win;
  uint64_t tab_cap;    /* entries of each hit table and slot map */
  dec_hot *hot;        /* n_layers * n_kv_heads */
  uint8_t *pending;    /* per layer: hot-pool work after a fetch waits (1), or is queued for the
                          session's worker or running there (2) */
} dec_ctx;

struct kvdb_decode {
  kvdb *db;
  kvdb_model m;
  char id[64];
  uint32_t bt;
  uint8_t mh[16];
  size_t esz, row;     /* element bytes, bytes of one row (head_dim elements) */
  kvdb_decode_opts o;
  kvdb_score_opts so;  /* scoring */
  kvdb_score_opts fso; /* fetching cold rows */
  kv_ckcache *ck;      /* the checksum tables the fetches read (fetch.c): once per session */
  dec_ctx *c;
  size_t n_c;
  kvdb_decode_stats st;
  double alpha_c, alpha_s; /* selected fractions of the hot and cold pools, last fetch */
  /* BKP's promotion and demotion after a fetch run on a worker thread of the session (started
   * at the first fetch), in the background of the caller's next layers: a select or fetch of
   * that (context, layer) waits for it, an append, flush, stat or close for all of it */
  pthread_mutex_t bg_mu;
  pthread_cond_t bg_cv;
  pthread_t bg_th;
  int bg_state;        /* 0 not started, 1 running, -1 could not start (work done inline) */
  int bg_stop;
  uint32_t *bg_q;      /* ring of context * n_layers + layer */
  size_t bg_head, bg_n, bg_cap;
  kvdb_status bg_rc;   /* the first failure of the worker, reported by the next wait */
  char bg_msg[256];
};

static size_t dtype_bytes(kvdb_dtype d)
{
  return d == KVDB_F32 ? 4 : 2;
}

/* ---- the window ---- */

static size_t win_layer_bytes(const kvdb_decode *s, size_t cap)
{
  return 2 * cap * s->m.n_kv_heads * s->row;
}

/* Row of token t (in the window), layer l, head h; v selects V. */
static uint8_t *win_row(const kvdb_decode *s, const dec_ctx *c, uint32_t l, uint64_t t, uint32_t h,
                        int v)
{
  return c->win + l * win_layer_bytes(s, c->win_cap) +
         ((size_t)v * c->win_cap + (size_t)(t - c->win_t0)) * s->m.n_kv_heads * s->row +
         (size_t)h * s->row;
}

/* A view of the window from token t0 (kvdb_get_tokens's `out`, kv_put_append's `kv`). */
static kvdb_kv_view win_view(const kvdb_decode *s, const dec_ctx *c, uint32_t layer, uint64_t t0)
{
  kvdb_kv_view v;
  memset(&v, 0, sizeof v);
  uint8_t *b = c->win + layer * win_layer_bytes(s, c->win_cap) +
               (size_t)(t0 - c->win_t0) * s->m.n_kv_heads * s->row;
  v.k.base = b;
  v.v.base = b + c->win_cap * s->m.n_kv_heads * s->row;
  v.k.layer_stride = v.v.layer_stride = (int64_t)win_layer_bytes(s, c->win_cap);
  v.k.token_stride = v.v.token_stride = (int64_t)(s->m.n_kv_heads * s->row);
  v.k.head_stride = v.v.head_stride = (int64_t)s->row;
  return v;
}

/* Re-lay the window to hold tokens [t0, t0 + cap) (t0 >= win_t0), keeping what it has there. */
static kvdb_status win_relayout(kvdb_decode *s, dec_ctx *c, uint64_t t0, size_t cap)
{
  uint64_t keep = c->n_tok > t0 ? c->n_tok - t0 : 0;
  uint8_t *w = calloc(1, s->m.n_layers * win_layer_bytes(s, cap));
  if (w == NULL)
    return kv_fail(KVDB_NOMEM, "decode window of %zu tokens", cap);
  size_t tb = s->m.n_kv_heads * s->row;
  for (uint32_t l = 0; l < s->m.n_layers && keep > 0; l++)
    for (int v = 0; v < 2; v++)
      memcpy(w + l * win_layer_bytes(s, cap) + (size_t)v * cap * tb, win_row(s, c, l, t0, 0, v),
             keep * tb);
  free(c->win);
  c->win = w;
  c->win_cap = cap;
  c->win_t0 = t0;
  return KVDB_OK;
}

/* The first token the window must keep: the last block's start when it is not published
 * whole, and the recent window. */
static uint64_t win_need_t0(const kvdb_decode *s, const dec_ctx *c)
{
  uint64_t t = c->n_pub / s->bt * s->bt;
  uint64_t w = s->o.recent_tokens;
  uint64_t r = c->n_tok > w ? c->n_tok - w : 0;
  return t < r ? t : r;
}

/* ---- the hot pools' tables ---- */

static kvdb_status tab_reserve(kvdb_decode *s, dec_ctx *c, uint64_t n)
{
  if (n <= c->tab_cap)
    return KVDB_OK;
  uint64_t cap = c->tab_cap ? c->tab_cap : 1024;
  while (cap < n)
    cap *= 2;
  for (size_t i = 0; i < (size_t)s->m.n_layers * s->m.n_kv_heads; i++) {
    dec_hot *h = &c->hot[i];
    uint16_t *hits = realloc(h->hits, cap * sizeof *hits);
    if (hits == NULL)
      return kv_fail(KVDB_NOMEM, "hit-rate table of %" PRIu64 " tokens", cap);
    h->hits = hits;
    int32_t *slot = realloc(h->slot, cap * sizeof *slot);
    if (slot == NULL)
      return kv_fail(KVDB_NOMEM, "hot-pool map of %" PRIu64 " tokens", cap);
    h->slot = slot;
    if (s->o.flags & KVDB_DECODE_PAGE_GROUPS) {
      uint8_t *pick = realloc(h->pick, cap);
      if (pick == NULL)
        return kv_fail(KVDB_NOMEM, "top-k marks of %" PRIu64 " tokens", cap);
      h->pick = pick;
      memset(pick + c->tab_cap, 0, cap - c->tab_cap);
    }
    memset(hits + c->tab_cap, 0, (cap - c->tab_cap) * sizeof *hits);
    for (uint64_t t = c->tab_cap; t < cap; t++)
      slot[t] = -1;
  }
  c->tab_cap = cap;
  return KVDB_OK;
}

static void hot_free(dec_hot *h)
{
  free(h->hits);
  free(h->slot);
  free(h->pick);
  free(h->slot_pos);
  free(h->rows);
  free(h->cand_pos);
  free(h->cand_rows);
}

static void ctx_free(kvdb_decode *s, dec_ctx *c)
{
  if (c->hot != NULL)
    for (size_t i = 0; i < (size_t)s->m.n_layers * s->m.n_kv_heads; i++)
      hot_free(&c->hot[i]);
  free(c->hot);
  free(c->pending);
  free(c->tokens);
  free(c->win);
}

static kvdb_status bg_wait(kvdb_decode *s, dec_ctx *c, uint32_t layer);

/* ---- open ---- */

void kvdb_decode_opts_init(kvdb_decode_opts *o)
{
  if (o == NULL)
    return;
  memset(o, 0, sizeof *o);
  o->struct_size = sizeof *o;
  o->recent_tokens = 64;
  o->hot_tokens = 1024;
  o->combine = KVDB_SCORE_SUM;
  o->device = KVDB_SCORE_CPU;
  o->host_share_permille = -1;
  o->fetch_device = -1;
}

/* The context's record and its tokens (from its block records) into c. */
static kvdb_status ctx_load(kvdb_decode *s, dec_ctx *c, size_t i)
{
  kv_txn *txn;
  KV_RET(kv_txn_begin(&s->db->cat, 0, &txn));
  kv_ctx_rec cr;
  kvdb_status rc = kv_model_known(s->db, txn, &s->m, s->bt, s->mh);
  if (rc == KVDB_NOTFOUND) {
    char hx[33];
    rc = kv_fail(KVDB_NOTFOUND, "contexts[%zu] %s: no context of model '%s' is stored", i,
                 kv_hex16(c->key, hx), s->m.id);
  }
  if (rc != KVDB_OK)
    goto out;
  rc = kv_ctx_of_model(s->db, txn, c->key, s->mh, &s->m, &cr);
  if (rc != KVDB_OK) {
    if (rc == KVDB_NOTFOUND) {
      char hx[33];
      rc = kv_fail(KVDB_NOTFOUND, "contexts[%zu] %s is not stored", i, kv_hex16(c->key, hx));
    }
    goto out;
  }
  if (cr.n_tokens == 0 || cr.n_tokens > UINT32_MAX) {
    rc = kv_fail(KVDB_INVALID, "contexts[%zu] has %" PRIu64 " tokens: a session takes 1 .. 2^32 - 1",
                 i, cr.n_tokens);
    goto out;
  }
  c->tok_cap = (size_t)cr.n_tokens + 256;
  c->tokens = malloc(c->tok_cap * sizeof *c->tokens);
  if (c->tokens == NULL) {
    rc = kv_fail(KVDB_NOMEM, "tokens of contexts[%zu]", i);
    goto out;
  }
  uint64_t t = 0;
  for (uint32_t b = 0; b < cr.n_blocks; b++) {
    kv_block_rec br;
    KV_ERR(kv_ctx_block(s->db, txn, c->key, cr.blocks + 16 * (size_t)b, &br));
    if (t + br.n_tokens > cr.n_tokens) {
      rc = kv_fail(KVDB_CORRUPT, "contexts[%zu]: its blocks hold more than its %" PRIu64 " tokens",
                   i, cr.n_tokens);
      goto out;
    }
    memcpy(c->tokens + t, br.tokens, 4 * (size_t)br.n_tokens);
    t += br.n_tokens;
  }
  if (t != cr.n_tokens) {
    rc = kv_fail(KVDB_CORRUPT, "contexts[%zu]: its blocks hold %" PRIu64 " of its %" PRIu64
                               " tokens", i, t, cr.n_tokens);
    goto out;
  }
  c->n_tok = c->n_pub = cr.n_tokens;
out:
  kv_txn_abort(txn);
  return rc;
}

static kvdb_status ctx_open(kvdb_decode *s, dec_ctx *c, size_t i)
{
  KV_RET(ctx_load(s, c, i));
  size_t nh = (size_t)s->m.n_layers * s->m.n_kv_heads;
  c->hot = calloc(nh, sizeof *c->hot);
  c->pending = calloc(s->m.n_layers, 1);
  if (c->hot == NULL || c->pending == NULL)
    return kv_fail(KVDB_NOMEM, "hot pools of contexts[%zu]", i);
  if (s->o.hot_tokens > 0)
    for (size_t j = 0; j < nh; j++) {
      c->hot[j].slot_pos = malloc((size_t)s->o.hot_tokens * sizeof(uint32_t));
      c->hot[j].rows = malloc((size_t)s->o.hot_tokens * 2 * s->row);
      if (c->hot[j].slot_pos == NULL || c->hot[j].rows == NULL)
        return kv_fail(KVDB_NOMEM, "hot pool of %u tokens", s->o.hot_tokens);
      memset(c->hot[j].slot_pos, 0xff, (size_t)s->o.hot_tokens * sizeof(uint32_t));
    }
  KV_RET(tab_reserve(s, c, c->n_tok));
  /* the window: the recent tokens and a partial last block, read verified */
  uint64_t t0 = win_need_t0(s, c);
  size_t cap = (size_t)(c->n_tok - t0) + s->bt + 64;
  c->win_t0 = t0;
  c->win_cap = cap;
  c->win = calloc(1, s->m.n_layers * win_layer_bytes(s, cap));
  if (c->win == NULL)
    return kv_fail(KVDB_NOMEM, "decode window of %zu tokens", cap);
  size_t n = (size_t)(c->n_tok - t0);
  if (n > 0) {
    uint32_t *pos = malloc(n * sizeof *pos);
    if (pos == NULL)
      return kv_fail(KVDB_NOMEM, "window positions");
    for (size_t j = 0; j < n; j++)
      pos[j] = (uint32_t)(t0 + j);
    kvdb_key k;
    memcpy(k.b, c->key, 16);
    kvdb_status rc = KVDB_OK;
    for (uint32_t l = 0; l < s->m.n_layers && rc == KVDB_OK; l++) {
      kvdb_kv_view v = win_view(s, c, l, t0);
      rc = kvdb_get_tokens(s->db, &s->m, &k, l, pos, n, &v);
    }
    free(pos);
    KV_RET(rc);
  }
  return KVDB_OK;
}

kvdb_status kvdb_decode_open(kvdb *db, const kvdb_model *m, const kvdb_key *contexts,
                             size_t n_contexts, const kvdb_decode_opts *opts, kvdb_decode **out)
{
  if (out != NULL)
    *out = NULL;
  KV_RET(kv_check_db(db));
  uint32_t bt;
  KV_RET(kv_check_model(m, &bt));
  if (contexts == NULL || out == NULL)
    return kv_fail(KVDB_INVALID, "%s is NULL", contexts == NULL ? "contexts" : "out");
  if (n_contexts == 0 || n_contexts > DEC_MAX_CONTEXTS)
    return kv_fail(KVDB_INVALID, "n_contexts %zu out of range 1..%u", n_contexts,
                   DEC_MAX_CONTEXTS);
  if (m->score_bits == 0)
    return kv_fail(KVDB_UNSUPPORTED, "model '%s' keeps no score copies (score_bits 0): a decode "
                                     "session selects on them", m->id);
  kvdb_decode_opts o;
  kvdb_decode_opts_init(&o);
  if (opts != NULL) {
    if (opts->struct_size < offsetof(kvdb_decode_opts, host_share_permille) + sizeof(int32_t) ||
        opts->struct_size > 4096)
      return kv_fail(KVDB_INVALID, "opts->struct_size %u: call kvdb_decode_opts_init() first",
                     opts->struct_size);
    memcpy(&o, opts, opts->struct_size < sizeof o ? opts->struct_size : sizeof o);
    o.struct_size = sizeof o;
  }
  if (o.recent_tokens > DEC_MAX_RECENT)
    return kv_fail(KVDB_INVALID, "opts->recent_tokens %u out of range 0..%u", o.recent_tokens,
                   DEC_MAX_RECENT);
  if (o.hot_tokens > DEC_MAX_HOT)
    return kv_fail(KVDB_INVALID, "opts->hot_tokens %u out of range 0..%u", o.hot_tokens,
                   DEC_MAX_HOT);
  if (o.host_share_permille < -1 || o.host_share_permille > 1000)
    return kv_fail(KVDB_INVALID, "opts->host_share_permille %d is not -1 (APP) or 0..1000",
                   (int)o.host_share_permille);
  if (o.flags & ~(uint32_t)(KVDB_DECODE_PAGE_GROUPS | KVDB_DECODE_PROMOTE_PICKS))
    return kv_fail(KVDB_INVALID, "opts->flags 0x%x has unknown bits", o.flags);
  if (o.cold_share_permille > 1000 ||
      (o.cold_share_permille != 0 && !(o.flags & KVDB_DECODE_PAGE_GROUPS)))
    return kv_fail(KVDB_INVALID, "opts->cold_share_permille %u: 0..1000, and only with "
                                 "KVDB_DECODE_PAGE_GROUPS",
                   o.cold_share_permille);
  if (o.fetch_device < -1 || o.fetch_device > KVDB_SCORE_EMULATED)
    return kv_fail(KVDB_INVALID, "opts->fetch_device %d is not -1 or a kvdb_score_device",
                   (int)o.fetch_device);
  kvdb_score_opts so;
  kvdb_score_opts_init(&so);
  so.combine = o.combine;
  so.device = o.device;
  so.device_tiers = o.device_tiers;
  so.xclbin_path = o.xclbin_path;
  so.n_threads = o.n_threads;
  kvdb_score_opts chk;
  KV_RET(kv_score_opts_get(&so, &chk)); /* names a bad combine, device or tier as "opts->..." */
  kvdb_decode *s = calloc(1, sizeof *s);
  if (s == NULL)
    return kv_fail(KVDB_NOMEM, "decode session");
  s->db = db;
  s->m = *m;
  snprintf(s->id, sizeof s->id, "%s", m->id);
  s->m.id = s->id;
  s->bt = bt;
  kv_model_hash(m, bt, s->mh);
  s->esz = dtype_bytes(m->dtype);
  s->row = (size_t)m->head_dim * s->esz;
  s->o = o;
  s->so = so;
  s->fso = so;
  pthread_mutex_init(&s->bg_mu, NULL);
  pthread_cond_init(&s->bg_cv, NULL);
  if (o.fetch_device >= 0)
    s->fso.device = (kvdb_score_device)o.fetch_device;
  s->st.beta = o.device == KVDB_SCORE_CPU ? 1.0 : 0.5;
  s->c = calloc(n_contexts, sizeof *s->c);
  if (s->c == NULL) {
    free(s);
    return kv_fail(KVDB_NOMEM, "decode session of %zu contexts", n_contexts);
  }
  s->n_c = n_contexts;
  kvdb_status rc = KVDB_OK;
  for (size_t i = 0; i < n_contexts && rc == KVDB_OK; i++) {
    memcpy(s->c[i].key, contexts[i].b, 16);
    rc = ctx_open(s, &s->c[i], i);
  }
  if (rc != KVDB_OK) {
    kvdb_decode_close(s);
    return rc;
  }
  *out = s;
  return KVDB_OK;
}

void kvdb_decode_close(kvdb_decode *s)
{
  if (s == NULL)
    return;
  if (s->bg_state > 0) { /* the queued work is done, then the worker stops */
    pthread_mutex_lock(&s->bg_mu);
    s->bg_stop = 1;
    pthread_cond_broadcast(&s->bg_cv);
    pthread_mutex_unlock(&s->bg_mu);
    pthread_join(s->bg_th, NULL);
  }
  pthread_mutex_destroy(&s->bg_mu);
  pthread_cond_destroy(&s->bg_cv);
  free(s->bg_q);
  for (size_t i = 0; i < s->n_c; i++)
    ctx_free(s, &s->c[i]);
  free(s->c);
  kv_ckcache_free(s->ck);
  free(s);
}

/* ---- append and publish ---- */

/* Address of element (layer, token, head, dim 0) in a caller's view. */
static const uint8_t *view_at(const kvdb_tensor_view *v, uint32_t layer, uint64_t t, uint32_t h)
{
  const uint8_t *b = v->layer_bases != NULL ? (const uint8_t *)v->layer_bases[layer]
                                            : (const uint8_t *)v->base + (int64_t)layer * v->layer_stride;
  return b + (int64_t)t * v->token_stride + (int64_t)h * v->head_stride;
}

static void row_in(const kvdb_decode *s, const kvdb_tensor_view *v, uint32_t l, uint64_t t,
                   uint32_t h, uint8_t *dst)
{
  const uint8_t *p = view_at(v, l, t, h);
  if (v->dim_stride == 0 || v->dim_stride == (int64_t)s->esz) {
    memcpy(dst, p, s->row);
    return;
  }
  for (uint32_t d = 0; d < s->m.head_dim; d++)
    memcpy(dst + d * s->esz, p + (int64_t)d * v->dim_stride, s->esz);
}

static void row_out(const kvdb_decode *s, const kvdb_tensor_view *v, uint64_t t, uint32_t h,
                    const uint8_t *src)
{
  uint8_t *p = (uint8_t *)view_at(v, 0, t, h);
  if (v->dim_stride == 0 || v->dim_stride == (int64_t)s->esz) {
    memcpy(p, src, s->row);
    return;
  }
  for (uint32_t d = 0; d < s->m.head_dim; d++)
    memcpy(p + (int64_t)d * v->dim_stride, src + d * s->esz, s->esz);
}

/* Publish tokens [0, upto) of context c (upto > n_pub). */
static kvdb_status publish(kvdb_decode *s, dec_ctx *c, uint64_t upto)
{
  if (s->db->cat.rdonly)
    return kv_fail(KVDB_READONLY, "database '%s' is open read-only: appends cannot be published",
                   s->db->dir);
  uint64_t kv_t0 = c->n_pub / s->bt * s->bt;
  kvdb_kv_view v = win_view(s, c, 0, kv_t0);
  uint8_t nk[16];
  kvdb_put_info info;
  KV_RET(kv_put_append(s->db, &s->m, s->bt, s->mh, c->tokens, (size_t)upto, &v, kv_t0, c->key,
                       &info, nk));
  memcpy(c->key, nk, 16);
  s->st.published += upto - c->n_pub;
  c->n_pub = upto;
  uint64_t t0 = win_need_t0(s, c);
  if (t0 > c->win_t0 + s->bt) /* drop what the window no longer needs (in steps of a block) */
    KV_RET(win_relayout(s, c, t0, c->win_cap));
  return KVDB_OK;
}

kvdb_status kvdb_decode_append(kvdb_decode *s, uint32_t ctx, const uint32_t *tokens, size_t n,
                               const kvdb_kv_view *kv)
{
  if (s == NULL || tokens == NULL || kv == NULL)
    return kv_fail(KVDB_INVALID, "%s is NULL", s == NULL ? "s" : tokens == NULL ? "tokens" : "kv");
  if (ctx >= s->n_c)
    return kv_fail(KVDB_INVALID, "ctx %u out of range: the session has %zu contexts", ctx, s->n_c);
  if (n == 0)
    return kv_fail(KVDB_INVALID, "n is 0");
  dec_ctx *c = &s->c[ctx];
  KV_RET(bg_wait(s, NULL, 0)); /* the hot pools' work reads the tables and the window */
  if (n > UINT32_MAX - c->n_tok)
    return kv_fail(KVDB_INVALID, "context %u would exceed 2^32 - 1 tokens (%" PRIu64 " + %zu)", ctx,
                   c->n_tok, n);
  KV_RET(kv_check_view(kv, &s->m, "kv"));
  KV_RET(kv_check_view_extent(kv, &s->m, n, "kv"));
  /* room: tokens, hit tables, window */
  if (c->n_tok + n > c->tok_cap) {
    size_t cap = (size_t)(c->n_tok + n) * 2;
    uint32_t *t = realloc(c->tokens, cap * sizeof *t);
    if (t == NULL)
      return kv_fail(KVDB_NOMEM, "tokens of context %u", ctx);
    c->tokens = t;
    c->tok_cap = cap;
  }
  KV_RET(tab_reserve(s, c, c->n_tok + n));
  if (c->n_tok + n - c->win_t0 > c->win_cap) {
    uint64_t t0 = win_need_t0(s, c);
    size_t need = (size_t)(c->n_tok + n - t0);
    KV_RET(win_relayout(s, c, t0, need > c->win_cap ? need * 2 : c->win_cap));
  }
  for (uint32_t l = 0; l < s->m.n_layers; l++)
    for (size_t t = 0; t < n; t++)
      for (uint32_t h = 0; h < s->m.n_kv_heads; h++) {
        row_in(s, &kv->k, l, t, h, win_row(s, c, l, c->n_tok + t, h, 0));
        row_in(s, &kv->v, l, t, h, win_row(s, c, l, c->n_tok + t, h, 1));
      }
  memcpy(c->tokens + c->n_tok, tokens, n * sizeof *tokens);
  c->n_tok += n;
  s->st.appended += n;
  uint64_t full = c->n_tok / s->bt * s->bt;
  if (full > c->n_pub)
    return publish(s, c, full);
  return KVDB_OK;
}

kvdb_status kvdb_decode_flush(kvdb_decode *s)
{
  if (s == NULL)
    return kv_fail(KVDB_INVALID, "s is NULL");
  KV_RET(bg_wait(s, NULL, 0));
  for (size_t i = 0; i < s->n_c; i++)
    if (s->c[i].n_tok > s->c[i].n_pub)
      KV_RET(publish(s, &s->c[i], s->c[i].n_tok));
  return KVDB_OK;
}

kvdb_status kvdb_decode_context(kvdb_decode *s, uint32_t ctx, kvdb_key *key, uint64_t *n_tokens,
                                uint64_t *n_published)
{
  if (s == NULL)
    return kv_fail(KVDB_INVALID, "s is NULL");
  if (ctx >= s->n_c)
    return kv_fail(KVDB_INVALID, "ctx %u out of range: the session has %zu contexts", ctx, s->n_c);
  if (key != NULL)
    memcpy(key->b, s->c[ctx].key, 16);
  if (n_tokens != NULL)
    *n_tokens = s->c[ctx].n_tok;
  if (n_published != NULL)
    *n_published = s->c[ctx].n_pub;
  return KVDB_OK;
}

kvdb_status kvdb_decode_stat(kvdb_decode *s, kvdb_decode_stats *out)
{
  if (s == NULL || out == NULL)
    return kv_fail(KVDB_INVALID, "%s is NULL", s == NULL ? "s" : "out");
  KV_RET(bg_wait(s, NULL, 0)); /* its promotion counts */
  *out = s->st;
  uint64_t b = 0;
  for (size_t i = 0; i < s->n_c; i++) {
    const dec_ctx *c = &s->c[i];
    b += s->m.n_layers * win_layer_bytes(s, c->win_cap);
    if (s->o.hot_tokens > 0)
      b += (uint64_t)s->m.n_layers * s->m.n_kv_heads * s->o.hot_tokens * 2 * s->row;
  }
  out->hot_pool_bytes = b;
  return KVDB_OK;
}

kvdb_status kvdb_append(kvdb *db, const kvdb_model *m, const kvdb_key *context,
                        const uint32_t *tokens, size_t n, const kvdb_kv_view *kv,
                        kvdb_key *new_context)
{
  if (context == NULL)
    return kv_fail(KVDB_INVALID, "context is NULL");
  kvdb_decode_opts o;
  kvdb_decode_opts_init(&o);
  o.hot_tokens = 0;
  o.recent_tokens = 0;
  kvdb_decode *s;
  if (m != NULL && m->score_bits == 0)
    KV_RET(kv_fail(KVDB_UNSUPPORTED, "model '%s' keeps no score copies (score_bits 0): appends "
                                     "keep them up to date", m->id != NULL ? m->id : "(null)"));
  KV_RET(kvdb_decode_open(db, m, context, 1, &o, &s));
  kvdb_status rc = kvdb_decode_append(s, 0, tokens, n, kv);
  if (rc == KVDB_OK)
    rc = kvdb_decode_flush(s);
  if (rc == KVDB_OK && new_context != NULL)
    memcpy(new_context->b, s->c[0].key, 16);
  kvdb_decode_close(s);
  return rc;
}

/* ---- BKP: the deferred hot-pool work of one context and layer ---- */

typedef struct hot_ent {
  uint16_t hits;
  uint32_t pos;
  int32_t src; /* >= 0: a slot; < 0: candidate -src - 1 */
} hot_ent;

static int hot_ent_cmp(const void *a, const void *b)
{
  const hot_ent *x = a, *y = b;
  if (x->hits != y->hits)
    return x->hits > y->hits ? -1 : 1;
  return x->pos > y->pos ? -1 : x->pos < y->pos; /* ties: the more recent */
}

static kvdb_status hot_update(kvdb_decode *s, dec_ctx *c, uint32_t layer)
{
  uint32_t cap = s->o.hot_tokens;
  for (uint32_t hd = 0; hd < s->m.n_kv_heads; hd++) {
    dec_hot *h = &c->hot[(size_t)layer * s->m.n_kv_heads + hd];
    for (uint64_t t = 0; t < c->n_tok; t++) /* the step ages every count */
      h->hits[t] -= h->hits[t] >> 3;
    if (cap == 0 || (h->n_cand == 0 && h->n_used <= cap)) {
      h->n_cand = 0;
      continue;
    }
    size_t n = (size_t)h->n_used + h->n_cand;
    hot_ent *e = malloc(n * sizeof *e);
    if (e == NULL)
      return kv_fail(KVDB_NOMEM, "hot-pool update");
    size_t k = 0;
    for (uint32_t sl = 0; sl < cap; sl++)
      if (h->slot_pos[sl] != UINT32_MAX)
        e[k++] = (hot_ent){h->hits[h->slot_pos[sl]], h->slot_pos[sl], (int32_t)sl};
    for (uint32_t i = 0; i < h->n_cand; i++) {
      uint32_t p = h->cand_pos[i];
      /* hot already, pinned in the window, or a candidate already (fetched twice: marked -2) */
      if (h->slot[p] != -1 || p >= c->win_t0)
        continue;
      h->slot[p] = -2;
      e[k++] = (hot_ent){h->hits[p], p, -(int32_t)i - 1};
    }
    for (size_t i = 0; i < k; i++) /* the marks go; promotions below set the slots */
      if (e[i].src < 0)
        h->slot[e[i].pos] = -1;
    qsort(e, k, sizeof *e, hot_ent_cmp);
    /* demote the members past the capacity, then promote the candidates within it */
    for (size_t i = cap; i < k; i++)
      if (e[i].src >= 0) {
        h->slot[e[i].pos] = -1;
        h->slot_pos[e[i].src] = UINT32_MAX;
        h->n_used--;
        s->st.demoted++;
      }
    uint32_t free_sl = 0;
    for (size_t i = 0; i < k && i < cap; i++) {
      if (e[i].src >= 0)
        continue;
      while (h->slot_pos[free_sl] != UINT32_MAX)
        free_sl++;
      uint32_t ci = (uint32_t)(-e[i].src - 1);
      memcpy(h->rows + (size_t)free_sl * 2 * s->row, h->cand_rows + (size_t)ci * 2 * s->row,
             2 * s->row);
      h->slot_pos[free_sl] = e[i].pos;
      h->slot[e[i].pos] = (int32_t)free_sl;
      h->n_used++;
      s->st.promoted++;
    }
    free(e);
    h->n_cand = 0;
  }
  return KVDB_OK;
}

/* ---- BKP's background work ---- */

static void *bg_main(void *arg)
{
  kvdb_decode *s = arg;
  pthread_mutex_lock(&s->bg_mu);
  for (;;) {
    while (!s->bg_stop && s->bg_n == 0)
      pthread_cond_wait(&s->bg_cv, &s->bg_mu);
    if (s->bg_n == 0) /* stop, and nothing left */
      break;
    uint32_t it = s->bg_q[s->bg_head];
    pthread_mutex_unlock(&s->bg_mu);
    dec_ctx *c = &s->c[it / s->m.n_layers];
    kvdb_status rc = hot_update(s, c, it % s->m.n_layers);
    pthread_mutex_lock(&s->bg_mu);
    if (rc != KVDB_OK && s->bg_rc == KVDB_OK) {
      s->bg_rc = rc;
      snprintf(s->bg_msg, sizeof s->bg_msg, "%s", kvdb_errmsg());
    }
    c->pending[it % s->m.n_layers] = 0;
    s->bg_head = (s->bg_head + 1) % s->bg_cap;
    s->bg_n--;
    pthread_cond_broadcast(&s->bg_cv);
  }
  pthread_mutex_unlock(&s->bg_mu);
  return NULL;
}

/* After a fetch of (c, layer): its hot-pool work, on the worker (inline at the next select when
 * the worker cannot start). */
static void bg_post(kvdb_decode *s, dec_ctx *c, uint32_t layer)
{
  if (s->bg_state == 0) {
    s->bg_cap = s->n_c * s->m.n_layers;
    s->bg_q = malloc(s->bg_cap * sizeof *s->bg_q);
    s->bg_state = s->bg_q != NULL && pthread_create(&s->bg_th, NULL, bg_main, s) == 0 ? 1 : -1;
  }
  if (s->bg_state < 0) {
    c->pending[layer] = 1;
    return;
  }
  pthread_mutex_lock(&s->bg_mu);
  c->pending[layer] = 2;
  s->bg_q[(s->bg_head + s->bg_n++) % s->bg_cap] = (uint32_t)(c - s->c) * s->m.n_layers + layer;
  pthread_cond_broadcast(&s->bg_cv);
  pthread_mutex_unlock(&s->bg_mu);
}

/* The worker's first failure since the last report, as this thread's error. */
static kvdb_status bg_report(kvdb_decode *s)
{
  kvdb_status rc = s->bg_rc;
  s->bg_rc = KVDB_OK;
  return rc == KVDB_OK ? KVDB_OK : kv_fail(rc, "hot-pool update (background): %s", s->bg_msg);
}

/* Wait for (c, layer)'s hot-pool work (c NULL: for all of it). With the worker, pending is read
 * and cleared under bg_mu only (2: queued or running); without it (it could not start), the work
 * waits inline (1) and runs here. */
static kvdb_status bg_wait(kvdb_decode *s, dec_ctx *c, uint32_t layer)
{
  kvdb_status rc = KVDB_OK;
  if (s->bg_state > 0) {
    pthread_mutex_lock(&s->bg_mu);
    while (c != NULL ? c->pending[layer] == 2 : s->bg_n > 0)
      pthread_cond_wait(&s->bg_cv, &s->bg_mu);
    rc = bg_report(s);
    pthread_mutex_unlock(&s->bg_mu);
    return rc;
  }
  for (size_t i = 0; i < s->n_c && rc == KVDB_OK; i++)
    for (uint32_t l = 0; l < s->m.n_layers && rc == KVDB_OK; l++)
      if ((c == NULL || (&s->c[i] == c && l == layer)) && s->c[i].pending != NULL &&
          s->c[i].pending[l] == 1) {
        s->c[i].pending[l] = 0;
        rc = hot_update(s, &s->c[i], l);
      }
  return rc;
}

/* ---- select ---- */

/* Scores of the unpublished tokens [n_pub, n_tok) of KV head hd at `layer` for the query of
 * that head's group, on the CPU: the same quantization as a block's score copy of the version
 * the store writes (kv_score_variant_for; a version-2 copy here is centered over these tokens,
 * the block they will be published in over its own). */
static kvdb_status score_unpublished(kvdb_decode *s, dec_ctx *c, uint32_t layer, uint32_t hd,
                                     const kv_score_query *q, float *out)
{
  uint32_t n = (uint32_t)(c->n_tok - c->n_pub);
  kv_score_err e;
  kv_score_layout lay;
  unsigned variant = kv_score_variant_for(s->db, &s->m);
  if (kv_score_layout_init_v(&lay, n, s->m.head_dim, s->m.score_bits, variant, &e) !=
      KV_SCORE_OK)
    return kv_fail(KVDB_PANIC, "score layout of %u unpublished tokens", n);
  void *buf = aligned_alloc(64, (lay.total_bytes + 63) / 64 * 64);
  if (buf == NULL)
    return kv_fail(KVDB_NOMEM, "score copy of %u unpublished tokens", n);
  kvdb_status rc = KVDB_OK;
  kv_score_view v;
  size_t len;
  char msg[200];
  if (kv_score_copy_encode_v((kv_score_dtype)s->m.dtype,
                             win_row(s, c, layer, c->n_pub, hd, 0), s->m.n_kv_heads * s->row, n,
                             s->m.head_dim, s->m.score_bits, variant, buf, lay.total_bytes, &len,
                             &e) != KV_SCORE_OK ||
      kv_score_copy_parse(buf, len, &v, &e) != KV_SCORE_OK ||
      kv_score_tokens(q, &v, 0, n, KV_SCORE_IMPL_AUTO, out, &e) != KV_SCORE_OK) {
    kv_score_errmsg(&e, msg, sizeof msg);
    rc = kv_fail(KVDB_INVALID, "scoring the unpublished tokens of layer %u, KV head %u: %s",
                 layer, hd, msg);
  }
  free(buf);
  return rc;
}

typedef struct grp_ent {
  uint64_t g;      /* page group: tokens [g * gs, (g + 1) * gs) */
  uint32_t rank;   /* its best-ranked pick */
  uint32_t count;  /* picks in it */
} grp_ent;

static int grp_ent_cmp(const void *a, const void *b)
{
  const grp_ent *x = a, *y = b;
  if (x->count != y->count)
    return x->count > y->count ? -1 : 1;
  return x->rank < y->rank ? -1 : x->rank > y->rank;
}

/* KVDB_DECODE_PAGE_GROUPS: the cold positions of the top k rp[0..k) (best first) replaced by
 * whole page groups, in the order of the number of cold picks they hold (see the flag in kvdb.h);
 * with a cold budget (opts.cold_share_permille) whole groups up to the budget, then the
 * positions in DRAM of rp[k..kx) (the ranking past the top k). The result, k positions, goes to
 * p[] and sc[] (sc may be NULL: rsc is then ignored). */
static kvdb_status page_groups(kvdb_decode *s, dec_ctx *c, uint32_t layer, uint32_t hd,
                               uint32_t k, uint32_t kx, const uint32_t *rp, const float *rsc,
                               uint32_t *p, float *sc)
{
  dec_hot *hp = &c->hot[(size_t)layer * s->m.n_kv_heads + hd];
  uint32_t gs = s->row >= 4096 ? 1 : (uint32_t)(4096 / s->row);
  if (gs > s->bt)
    gs = s->bt;
  uint32_t *out = malloc((size_t)k * sizeof *out);
  float *osc = malloc((size_t)k * sizeof *osc);
  uint8_t *in = calloc((size_t)c->n_tok, 1);
  kvdb_status rc = KVDB_OK;
  uint16_t *cnt = NULL;
  grp_ent *ord = NULL;
  if (out == NULL || osc == NULL || in == NULL) {
    rc = kv_fail(KVDB_NOMEM, "page-group selection");
    goto done;
  }
  uint32_t n = 0, n_cold = 0;
  memset(hp->pick, 0, (size_t)c->n_tok);
  for (uint32_t i = 0; i < k; i++)
    hp->pick[rp[i]] = 1;
  for (uint32_t i = 0; i < k; i++) {
    uint32_t t = rp[i];
    if (t >= c->win_t0 || hp->slot[t] >= 0) { /* in DRAM: stays */
      osc[n] = rsc != NULL ? rsc[i] : 0;
      out[n++] = t;
      in[t] = 1;
    } else {
      n_cold++;
    }
  }
  /* the cold picks' groups, most picks first, then by their best-ranked pick */
  uint64_t n_g = (c->win_t0 + gs - 1) / gs;
  cnt = calloc(n_g ? n_g : 1, sizeof *cnt);
  ord = malloc(((size_t)n_cold + 1) * sizeof *ord);
  if (cnt == NULL || ord == NULL) {
    rc = kv_fail(KVDB_NOMEM, "page-group selection");
    goto done;
  }
  uint32_t n_ord = 0;
  for (uint32_t i = 0; i < k; i++) {
    uint32_t t = rp[i];
    if (in[t])
      continue;
    uint64_t g = t / gs;
    if (cnt[g]++ == 0)
      ord[n_ord++] = (grp_ent){g, i, 0};
  }
  for (uint32_t i = 0; i < n_ord; i++)
    ord[i].count = cnt[ord[i].g];
  qsort(ord, n_ord, sizeof *ord, grp_ent_cmp);
  uint32_t budget = s->o.cold_share_permille == 0
                        ? k /* the flag's rule: as many as the cold picks (target below) */
                        : (uint32_t)((uint64_t)k * s->o.cold_share_permille / 1000);
  uint32_t target = s->o.cold_share_permille == 0 ? n + n_cold : k, n_grp = 0;
  uint32_t gi = 0;
  for (; gi < n_ord && n < target; gi++) {
    uint64_t g0 = ord[gi].g * gs, g1 = g0 + gs < c->win_t0 ? g0 + gs : c->win_t0;
    uint32_t cold = 0;
    for (uint64_t x = g0; x < g1; x++)
      cold += !in[x] && hp->slot[x] < 0;
    if (s->o.cold_share_permille != 0 && (n_grp + cold > budget || n + cold > k))
      break; /* a cold budget takes whole groups only, up to the budget */
    for (uint64_t x = g0; x < g1 && n < target; x++)
      if (!in[x] && hp->slot[x] < 0) {
        in[x] = 1;
        osc[n] = NAN;
        /* a pick keeps its score (looked for only when scores are wanted and x is a pick: the
         * group's picks rank at or after its best) */
        for (uint32_t j = ord[gi].rank; j < k && sc != NULL && rsc != NULL && hp->pick[x]; j++)
          if (rp[j] == x) {
            osc[n] = rsc[j];
            break;
          }
        out[n++] = (uint32_t)x;
        n_grp++;
      }
  }
  /* a cold budget: the best-ranked positions in DRAM past the top k, then (too few of them)
   * the remaining groups as the flag's rule takes them */
  for (uint32_t i = k; i < kx && n < k; i++) {
    uint32_t t = rp[i];
    if (!in[t] && (t >= c->win_t0 || hp->slot[t] >= 0)) {
      in[t] = 1;
      osc[n] = rsc != NULL ? rsc[i] : 0;
      out[n++] = t;
    }
  }
  for (; gi < n_ord && n < k; gi++) {
    uint64_t g0 = ord[gi].g * gs, g1 = g0 + gs < c->win_t0 ? g0 + gs : c->win_t0;
    for (uint64_t x = g0; x < g1 && n < k; x++)
      if (!in[x] && hp->slot[x] < 0) {
        in[x] = 1;
        osc[n] = NAN;
        out[n++] = (uint32_t)x;
      }
  }
  for (uint32_t i = 0; i < k && n < k; i++) /* cannot happen: the top k itself fills k */
    if (!in[rp[i]]) {
      in[rp[i]] = 1;
      osc[n] = rsc != NULL ? rsc[i] : 0;
      out[n++] = rp[i];
    }
  for (uint32_t i = 0; i < k; i++)
    s->st.top_k_returned += in[rp[i]];
  s->st.top_k += k;
  memcpy(p, out, (size_t)n * sizeof *p);
  if (sc != NULL)
    for (uint32_t i = 0; i < n; i++)
      sc[i] = osc[i];
done:
  free(cnt);
  free(ord);
  free(out);
  free(osc);
  free(in);
  return rc;
}

/* The unpublished tokens' scores in score.h ORDER (a total order: best first). */
typedef struct unpub_order {
  const float *sc;
  uint32_t pos0;
} unpub_order;

static int unpub_cmp(const void *a, const void *b, void *ctx)
{
  const unpub_order *o = ctx;
  uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
  if (x == y)
    return 0;
  return kv_score_better(o->pos0 + x, o->sc[x], o->pos0 + y, o->sc[y]) ? -1 : 1;
}

kvdb_status kvdb_decode_select(kvdb_decode *s, uint32_t ctx, uint32_t layer, const void *q,
                               kvdb_dtype q_dtype, uint32_t n_q_heads, uint32_t k,
                               uint32_t *positions, float *scores)
{
  if (s == NULL || q == NULL || positions == NULL)
    return kv_fail(KVDB_INVALID, "%s is NULL", s == NULL ? "s" : q == NULL ? "q" : "positions");
  if (ctx >= s->n_c)
    return kv_fail(KVDB_INVALID, "ctx %u out of range: the session has %zu contexts", ctx, s->n_c);
  const kvdb_model *m = &s->m;
  dec_ctx *c = &s->c[ctx];
  if (layer >= m->n_layers)
    return kv_fail(KVDB_INVALID, "layer %u out of range (model '%s' has %u layers)", layer, m->id,
                   m->n_layers);
  if (n_q_heads == 0 || n_q_heads % m->n_kv_heads != 0 ||
      n_q_heads / m->n_kv_heads > KV_SCORE_MAX_Q_HEADS)
    return kv_fail(KVDB_INVALID, "n_q_heads %u is not a multiple of n_kv_heads %u (at most %u "
                                 "per KV head)", n_q_heads, m->n_kv_heads, KV_SCORE_MAX_Q_HEADS);
  if (k == 0 || k > c->n_tok)
    return kv_fail(KVDB_INVALID, "k %u out of range 1..%" PRIu64 " (the context's tokens)", k,
                   c->n_tok);
  if (q_dtype != KVDB_F16 && q_dtype != KVDB_BF16 && q_dtype != KVDB_F32)
    return kv_fail(KVDB_INVALID, "q_dtype %d is not KVDB_F16, KVDB_BF16 or KVDB_F32", (int)q_dtype);
  KV_RET(bg_wait(s, c, layer)); /* its last fetch's hot-pool work */
  uint32_t G = n_q_heads / m->n_kv_heads, H = m->n_kv_heads;
  size_t qrow = (size_t)m->head_dim * dtype_bytes(q_dtype);
  int grp = (s->o.flags & KVDB_DECODE_PAGE_GROUPS) != 0;
  /* the ranking: the top k, or with a cold budget the top 4k (DRAM positions past the top k) */
  uint64_t kx64 = s->o.cold_share_permille != 0 ? 4ull * k : k;
  uint32_t kx = kx64 < c->n_tok ? (uint32_t)kx64 : (uint32_t)c->n_tok;
  uint32_t k1 = kx < c->n_pub ? kx : (uint32_t)c->n_pub;
  uint32_t nu = (uint32_t)(c->n_tok - c->n_pub);
  kvdb_status rc = KVDB_OK;
  kvdb_score_req *req = calloc(H, sizeof *req);
  uint32_t *pos1 = malloc((size_t)H * k1 * sizeof *pos1);
  float *sc1 = malloc((size_t)H * k1 * sizeof *sc1);
  float *scu = malloc(((size_t)nu + 1) * sizeof *scu);
  uint32_t *rp = grp ? malloc((size_t)kx * sizeof *rp) : NULL;
  float *rsc = grp ? malloc((size_t)kx * sizeof *rsc) : NULL;
  if (req == NULL || pos1 == NULL || sc1 == NULL || scu == NULL ||
      (grp && (rp == NULL || rsc == NULL))) {
    rc = kv_fail(KVDB_NOMEM, "select of %u positions x %u KV heads", k, H);
    goto out;
  }
  for (uint32_t h = 0; h < H; h++)
    req[h] = (kvdb_score_req){.layer = layer, .kv_head = h,
                              .q = (const uint8_t *)q + (size_t)h * G * qrow, .n_q = G, .k = k1,
                              .positions = pos1 + (size_t)h * k1, .scores = sc1 + (size_t)h * k1};
  /* APP per step: the host's share from the measured rates and the last step's selected
   * fractions of each pool */
  kvdb_score_opts so = s->so;
  if (s->o.host_share_permille >= 0) {
    so.host_share_permille = s->o.host_share_permille;
  } else {
    double a = (double)k / (double)c->n_tok;
    double ac = s->st.selected ? s->alpha_c : a, as = s->st.selected ? s->alpha_s : a;
    so.host_share_permille = kv_score_app_permille(s->db, so.device, ac, as);
  }
  if (so.host_share_permille >= 0)
    s->st.beta = so.host_share_permille / 1000.0;
  kvdb_key key;
  memcpy(key.b, c->key, 16);
  kvdb_score_stats ss;
  if (k1 > 0) {
    KV_ERR(kvdb_score_batch(s->db, m, &key, q_dtype, req, H, &so, &ss));
    s->st.score_bytes += ss.host_bytes + ss.device_bytes;
    s->st.host_bytes += ss.host_bytes + ss.device_to_host_bytes;
  }
  for (uint32_t h = 0; h < H; h++) {
    uint32_t *p1 = pos1 + (size_t)h * k1;
    float *s1 = sc1 + (size_t)h * k1;
    if (nu > 0) {
      kv_score_query *kq;
      kv_score_err e;
      if (kv_score_query_create((kv_score_dtype)q_dtype, req[h].q, G, m->head_dim, qrow,
                                (kv_score_combine)s->o.combine, &kq, &e) != KV_SCORE_OK) {
        char msg[200];
        kv_score_errmsg(&e, msg, sizeof msg);
        rc = kv_fail(KVDB_INVALID, "q (KV head %u's query heads): %s", h, msg);
        goto out;
      }
      rc = score_unpublished(s, c, layer, h, kq, scu);
      kv_score_query_free(kq);
      if (rc != KVDB_OK)
        goto out;
    }
    /* merge the stored top k1 (best first) with the unpublished scores, sorted: both in ORDER */
    uint32_t i = 0, j = 0;
    uint32_t *ui = NULL;
    if (nu > 0 && (ui = malloc((size_t)nu * sizeof *ui)) == NULL) {
      rc = kv_fail(KVDB_NOMEM, "select merge");
      goto out;
    }
    for (uint32_t u = 0; u < nu; u++)
      ui[u] = u;
    unpub_order uo = {scu, (uint32_t)c->n_pub};
    if (nu > 1)
      qsort_r(ui, nu, sizeof *ui, unpub_cmp, &uo);
    uint32_t *op = grp ? rp : positions + (size_t)h * k;
    float *os = grp ? rsc : scores != NULL ? scores + (size_t)h * k : NULL;
    for (uint32_t r = 0; r < (grp ? kx : k); r++) {
      uint32_t bu = j < nu ? ui[j] : UINT32_MAX; /* the best unpublished not taken */
      int use_u = bu != UINT32_MAX &&
                  (i >= k1 || kv_score_better((uint32_t)c->n_pub + bu, scu[bu], p1[i], s1[i]));
      uint32_t p;
      float sc;
      if (use_u) {
        p = (uint32_t)c->n_pub + bu;
        sc = scu[bu];
        j++;
      } else {
        p = p1[i];
        sc = s1[i];
        i++;
      }
      op[r] = p;
      if (os != NULL)
        os[r] = sc;
    }
    free(ui);
    if (grp) {
      KV_ERR(page_groups(s, c, layer, h, k, kx, rp, rsc, positions + (size_t)h * k,
                         scores != NULL ? scores + (size_t)h * k : NULL));
    } else {
      s->st.top_k += k;
      s->st.top_k_returned += k;
    }
  }
  s->st.selects++;
  if (layer == 0)
    s->st.steps++;
out:
  free(req);
  free(pos1);
  free(sc1);
  free(scu);
  free(rp);
  free(rsc);
  return rc;
}

/* ---- fetch ---- */

static kvdb_status cand_reserve(kvdb_decode *s, dec_hot *h, uint32_t n)
{
  if (h->n_cand + n <= h->cand_cap)
    return KVDB_OK;
  uint32_t cap = (h->n_cand + n) * 2;
  uint32_t *p = realloc(h->cand_pos, cap * sizeof *p);
  if (p == NULL)
    return kv_fail(KVDB_NOMEM, "promotion candidates");
  h->cand_pos = p;
  uint8_t *r = realloc(h->cand_rows, (size_t)cap * 2 * s->row);
  if (r == NULL)
    return kv_fail(KVDB_NOMEM, "promotion candidates");
  h->cand_rows = r;
  h->cand_cap = cap;
  return KVDB_OK;
}

kvdb_status kvdb_decode_fetch(kvdb_decode *s, uint32_t ctx, uint32_t layer,
                              const uint32_t *positions, uint32_t k, const kvdb_kv_view *out)
{
  if (s == NULL || positions == NULL || out == NULL)
    return kv_fail(KVDB_INVALID, "%s is NULL", s == NULL ? "s" : positions == NULL ? "positions"
                                                                                    : "out");
  if (ctx >= s->n_c)
    return kv_fail(KVDB_INVALID, "ctx %u out of range: the session has %zu contexts", ctx, s->n_c);
  const kvdb_model *m = &s->m;
  dec_ctx *c = &s->c[ctx];
  if (layer >= m->n_layers)
    return kv_fail(KVDB_INVALID, "layer %u out of range (model '%s' has %u layers)", layer, m->id,
                   m->n_layers);
  if (k == 0)
    return kv_fail(KVDB_INVALID, "k is 0");
  KV_RET(kv_check_view(out, m, "out"));
  KV_RET(kv_check_view_extent(out, m, k, "out"));
  KV_RET(bg_wait(s, c, layer)); /* its last fetch's hot-pool work (the hit counts change) */
  uint32_t H = m->n_kv_heads;
  for (size_t i = 0; i < (size_t)H * k; i++)
    if (positions[i] >= c->n_tok)
      return kv_fail(KVDB_INVALID, "positions[%zu] = %u is past the context's %" PRIu64 " tokens",
                     i, positions[i], c->n_tok);
  /* every head's DRAM rows copied, its cold positions listed; then the cold rows of all heads
   * read at once (kv_get_heads_tokens_cc: one batch of page-group reads for the layer) */
  uint32_t *cold = malloc((size_t)H * k * sizeof *cold);
  uint32_t *at = malloc((size_t)H * k * sizeof *at);
  uint8_t *kb = NULL, *vb = NULL; /* the cold rows, head after head */
  uint32_t *heads = malloc((size_t)H * sizeof *heads), *nch = calloc(H, sizeof *nch);
  size_t *base = malloc((size_t)H * sizeof *base), n_cold = 0;
  const uint32_t **cp = malloc((size_t)H * sizeof *cp);
  size_t *np = malloc((size_t)H * sizeof *np);
  void **ko = malloc((size_t)H * sizeof *ko), **vo = malloc((size_t)H * sizeof *vo);
  kvdb_fetch_stats *fs = calloc(H, sizeof *fs);
  kvdb_status rc = KVDB_OK;
  if (cold == NULL || at == NULL || heads == NULL || nch == NULL || base == NULL || cp == NULL ||
      np == NULL || ko == NULL || vo == NULL || fs == NULL) {
    rc = kv_fail(KVDB_NOMEM, "fetch of %u rows", k);
    goto out;
  }
  kvdb_key key;
  memcpy(key.b, c->key, 16);
  uint64_t hot_hits = 0, colds = 0;
  uint32_t n_heads = 0;
  for (uint32_t h = 0; h < H; h++) {
    dec_hot *hp = &c->hot[(size_t)layer * H + h];
    const uint32_t *p = positions + (size_t)h * k;
    uint32_t *hc = cold + (size_t)h * k, *ha = at + (size_t)h * k;
    uint32_t nc = 0;
    for (uint32_t i = 0; i < k; i++) {
      uint32_t t = p[i];
      if (hp->pick == NULL || hp->pick[t]) /* a group's other rows are not selections */
        hp->hits[t] = hp->hits[t] > UINT16_MAX - DEC_HIT ? UINT16_MAX : hp->hits[t] + DEC_HIT;
      if (t >= c->win_t0) {
        row_out(s, &out->k, i, h, win_row(s, c, layer, t, h, 0));
        row_out(s, &out->v, i, h, win_row(s, c, layer, t, h, 1));
        hot_hits++;
      } else if (hp->slot[t] >= 0) {
        const uint8_t *r = hp->rows + (size_t)hp->slot[t] * 2 * s->row;
        row_out(s, &out->k, i, h, r);
        row_out(s, &out->v, i, h, r + s->row);
        hot_hits++;
      } else {
        hc[nc] = t;
        ha[nc++] = i;
      }
    }
    nch[h] = nc;
    base[h] = n_cold;
    n_cold += nc;
  }
  if (n_cold > 0 && ((kb = malloc(n_cold * s->row)) == NULL || (vb = malloc(n_cold * s->row)) == NULL)) {
    rc = kv_fail(KVDB_NOMEM, "fetch of %zu cold rows", n_cold);
    goto out;
  }
  for (uint32_t h = 0; h < H; h++)
    if (nch[h] > 0) {
      heads[n_heads] = h;
      cp[n_heads] = cold + (size_t)h * k;
      np[n_heads] = nch[h];
      ko[n_heads] = kb + base[h] * s->row;
      vo[n_heads] = vb + base[h] * s->row;
      n_heads++;
    }
  if (n_heads > 0)
    KV_ERR(kv_get_heads_tokens_cc(s->db, m, &key, layer, n_heads, heads, cp, np, ko, vo, &s->fso,
                                  fs, &s->ck));
  for (uint32_t j = 0; j < n_heads; j++) {
    s->st.ssd_bytes += fs[j].host_bytes + fs[j].device_bytes;
    s->st.host_bytes += fs[j].host_bytes + fs[j].device_to_host_bytes;
  }
  for (uint32_t h = 0; h < H; h++) {
    dec_hot *hp = &c->hot[(size_t)layer * H + h];
    uint32_t nc = nch[h];
    const uint32_t *hc = cold + (size_t)h * k, *ha = at + (size_t)h * k;
    if (nc == 0)
      continue;
    const uint8_t *hk = kb + base[h] * s->row, *hv = vb + base[h] * s->row;
    s->st.cold_row_bytes += (uint64_t)nc * 2 * s->row;
    colds += nc;
    if (s->o.hot_tokens > 0)
      KV_ERR(cand_reserve(s, hp, nc));
    for (uint32_t j = 0; j < nc; j++) {
      row_out(s, &out->k, ha[j], h, hk + (size_t)j * s->row);
      row_out(s, &out->v, ha[j], h, hv + (size_t)j * s->row);
      /* candidates: every row of the groups read (the bytes came anyway; without hits they
       * take free slots and lose to picks in hot_update); with KVDB_DECODE_PROMOTE_PICKS and
       * no cold budget only the picks */
      if (s->o.hot_tokens > 0 &&
          (hp->pick == NULL || hp->pick[hc[j]] || s->o.cold_share_permille != 0 ||
           !(s->o.flags & KVDB_DECODE_PROMOTE_PICKS))) {
        uint8_t *r = hp->cand_rows + (size_t)hp->n_cand * 2 * s->row;
        memcpy(r, hk + (size_t)j * s->row, s->row);
        memcpy(r + s->row, hv + (size_t)j * s->row, s->row);
        hp->cand_pos[hp->n_cand++] = hc[j];
      }
    }
  }
  bg_post(s, c, layer);
  s->st.selected += (uint64_t)H * k;
  s->st.hot_hits += hot_hits;
  s->st.cold_reads += colds;
  /* the pools' selected fractions for APP's skewness correction at the next select */
  uint64_t hot_pool = (uint64_t)H * (s->o.hot_tokens + s->o.recent_tokens);
  uint64_t cold_pool = (uint64_t)H * c->n_tok > hot_pool ? (uint64_t)H * c->n_tok - hot_pool : 1;
  s->alpha_c = hot_pool ? (double)hot_hits / (double)hot_pool : 0;
  s->alpha_s = (double)colds / (double)cold_pool;
out:
  free(cold);
  free(at);
  free(kb);
  free(vb);
  free(heads);
  free(nch);
  free(base);
  free(cp);
  free(np);
  free(ko);
  free(vo);
  free(fs);
  return rc;
}
