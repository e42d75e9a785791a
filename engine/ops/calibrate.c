/* SPDX-License-Identifier: MIT */
/*
 * engine/ops/calibrate.c — a model's calibration of int4 and int2 (kvdb.h "calib"; issue 16):
 * kvdb_model_calibrate gathers each calibration context's heads from the caller's views and
 * runs compress/calib.c's kv_calib_run, then stores the result with the model (model record
 * version 3, FORMAT.md §2); kvdb_model_calibration reports it; kv_model_calib_load gives the
 * writers (put, re-encoding) the calibration of a model when their config uses it.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ops_int.h"

void kvdb_calib_opts_init(kvdb_calib_opts *o)
{
  if (o == NULL)
    return;
  memset(o, 0, sizeof *o);
  o->struct_size = sizeof *o;
  o->flags = KVDB_CALIB_INT4 | KVDB_CALIB_INT2;
}

int kv_calib_bits_of(const kvdb_config *c)
{
  return c != NULL && c->method == KVDB_METHOD_QUANT && c->drop == KVDB_QUANT_KVQUANT &&
                 (c->bits == 4 || c->bits == 2)
             ? (int)c->bits
             : 0;
}

kvdb_status kv_model_calib_load(kvdb *db, const kvdb_model *m, const kvdb_config *c,
                                kv_calib *out)
{
  memset(out, 0, sizeof *out);
  if (c != NULL && kv_calib_bits_of(c) == 0)
    return KVDB_OK;
  kv_txn *txn;
  KV_RET(kv_txn_begin(&db->cat, 0, &txn));
  kvdb_status rc = kv_cat_get_model_calib(&db->cat, txn, m->id, out);
  kv_txn_abort(txn);
  if (rc == KVDB_NOTFOUND)
    return KVDB_OK; /* a new model: no calibration yet */
  if (rc == KVDB_OK && out->weight != NULL &&
      (out->n_layers != m->n_layers || out->n_heads != m->n_kv_heads ||
       out->head_dim != m->head_dim)) {
    kv_calib_free(out); /* another fingerprint: the put's own check reports it */
    return KVDB_OK;
  }
  return rc;
}

typedef struct gather_ctx {
  const kvdb_model *m;
  const kvdb_calib_context *cx;
  uint32_t esz;
} gather_ctx;

static int gather_head(void *user, uint32_t c, uint32_t layer, uint32_t head, void *k, void *v)
{
  const gather_ctx *g = user;
  const kvdb_calib_context *x = &g->cx[c];
  kv_gather_head(x->kv, g->esz, g->m->head_dim, layer, head, 0, 0, x->n_tokens, k);
  kv_gather_head(x->kv, g->esz, g->m->head_dim, layer, head, 1, 0, x->n_tokens, v);
  return 0;
}

static kvdb_status check_inputs(const kvdb_model *m, const kvdb_calib_context *cx, size_t n,
                                const kvdb_calib_opts *o)
{
  if (cx == NULL || n == 0)
    return kv_fail(KVDB_INVALID, "no calibration contexts");
  if (n > 65536)
    return kv_fail(KVDB_INVALID, "%zu calibration contexts (at most 65536)", n);
  if (o == NULL || o->struct_size < sizeof *o || o->struct_size > 4096)
    return kv_fail(KVDB_INVALID, "opts: call kvdb_calib_opts_init() first and set n_q_heads");
  if ((o->flags & ~(uint32_t)(KVDB_CALIB_INT4 | KVDB_CALIB_INT2)) != 0)
    return kv_fail(KVDB_INVALID, "opts->flags %#x: unknown bits", o->flags);
  if (o->n_q_heads == 0 || o->n_q_heads % m->n_kv_heads != 0 || o->n_q_heads > 65536)
    return kv_fail(KVDB_INVALID, "opts->n_q_heads %u is not a multiple of n_kv_heads %u",
                   o->n_q_heads, m->n_kv_heads);
  if (!(o->int4_bits == 0 || (o->int4_bits >= 1 && o->int4_bits <= 8)) ||
      !(o->int2_bits == 0 || (o->int2_bits >= 1 && o->int2_bits <= 8)))
    return kv_fail(KVDB_INVALID, "opts: budgets %g / %g bits per element (1..8, or 0)",
                   (double)o->int4_bits, (double)o->int2_bits);
  if (m->dtype != KVDB_F16 && m->dtype != KVDB_BF16 && m->dtype != KVDB_F32)
    return kv_fail(KVDB_INVALID, "model dtype %u", (unsigned)m->dtype);
  for (size_t i = 0; i < n; i++) {
    const kvdb_calib_context *x = &cx[i];
    if (x->kv == NULL)
      return kv_fail(KVDB_INVALID, "contexts[%zu].kv is NULL", i);
    if (x->n_tokens == 0 || x->n_tokens > (1u << 20))
      return kv_fail(KVDB_INVALID, "contexts[%zu].n_tokens %u out of range 1..2^20", i,
                     x->n_tokens);
    KV_RET(kv_check_view(x->kv, m, "contexts[].kv"));
    KV_RET(kv_check_view_extent(x->kv, m, x->n_tokens, "contexts[].kv"));
    if (x->n_queries == 0 || x->queries == NULL || x->positions == NULL)
      return kv_fail(KVDB_INVALID, "contexts[%zu]: no queries (queries, positions and "
                                   "n_queries are required: the calibration weighs K's channels "
                                   "and chooses the plans with the model's queries)",
                     i);
    for (uint32_t q = 0; q < x->n_queries; q++)
      if (x->positions[q] >= x->n_tokens || (q > 0 && x->positions[q] <= x->positions[q - 1]))
        return kv_fail(KVDB_INVALID, "contexts[%zu].positions[%u] = %u: not increasing, or not "
                                     "below its %u tokens",
                       i, q, x->positions[q], x->n_tokens);
    size_t nf = (size_t)x->n_queries * m->n_layers * o->n_q_heads * m->head_dim;
    for (size_t j = 0; j < nf; j++)
      if (!isfinite(x->queries[j]))
        return kv_fail(KVDB_INVALID, "contexts[%zu].queries[%zu] is not finite", i, j);
  }
  return KVDB_OK;
}

double kv_calib_block_reserve(const kvdb *db, const kvdb_model *m, uint32_t bt, const uint32_t *nt,
                            size_t n, double bits)
{
  int cpack = m->score_bits == 0 && db->opt.packed_block_bytes != 1;
  uint64_t pack_max = db->opt.packed_block_bytes > 1 ? db->opt.packed_block_bytes
                                                     : KV_PACK_MAX_DEFAULT;
  double over = 0, elems = 0;
  for (size_t c = 0; c < n; c++)
    for (uint32_t b0 = 0; b0 < nt[c]; b0 += bt) {
      uint32_t rows = nt[c] - b0 < bt ? nt[c] - b0 : bt;
      kv_block_geom g;
      if (kv_block_geom_init(&g, m->n_layers, m->n_kv_heads, m->head_dim, m->dtype, bt, rows) !=
          KVDB_OK)
        return 0;
      double el = 2.0 * rows * m->head_dim * m->n_layers * m->n_kv_heads;
      uint64_t sec = (uint64_t)ceil(bits / 8 * el);
      kv_cblock_layout l;
      kv_cblock_layout_init_packed(&g, sec, &l);
      if (!cpack || l.total_bytes > pack_max)
        kv_cblock_layout_init(&g, sec, &l);
      over += (double)(l.total_bytes - sec);
      elems += el;
    }
  return elems > 0 ? 8 * over / elems : 0;
}

kvdb_status kvdb_model_calibrate(kvdb *db, const kvdb_model *m, const kvdb_calib_context *cx,
                                 size_t n, const kvdb_calib_opts *opts)
{
  KV_RET(kv_check_db(db));
  uint32_t bt;
  KV_RET(kv_check_model(m, &bt));
  if (db->cat.rdonly)
    return kv_fail(KVDB_READONLY, "database '%s' is open read-only", db->dir);
  KV_RET(check_inputs(m, cx, n, opts));
  uint8_t mh[16];
  kv_model_hash(m, bt, mh);
  { /* refuse another fingerprint before the work */
    kv_txn *txn;
    KV_RET(kv_txn_begin(&db->cat, 0, &txn));
    kvdb_status rc = kv_model_known(db, txn, m, bt, mh);
    kv_txn_abort(txn);
    if (rc != KVDB_OK && rc != KVDB_NOTFOUND)
      return rc;
  }
  uint32_t *nt = malloc(n * sizeof *nt), *nq = malloc(n * sizeof *nq);
  const float **q = malloc(n * sizeof *q);
  const uint32_t **qp = malloc(n * sizeof *qp);
  kv_calib cal;
  memset(&cal, 0, sizeof cal);
  kvdb_status rc = KVDB_OK;
  if (!nt || !nq || !q || !qp) {
    rc = kv_fail(KVDB_NOMEM, "calibration of %zu contexts", n);
    goto out;
  }
  for (size_t i = 0; i < n; i++) {
    nt[i] = cx[i].n_tokens;
    nq[i] = cx[i].n_queries;
    q[i] = cx[i].queries;
    qp[i] = cx[i].positions;
  }
  gather_ctx g = {m, cx, (uint32_t)kv_codec_dtype_bytes((kv_codec_dtype)m->dtype)};
  /* each plan's budget (0: its bits + 0.5), and what its sections may take of it */
  float bud[KV_CALIB_N_PLANS] = {opts->int4_bits > 0 ? opts->int4_bits : 4.5f,
                                 opts->int2_bits > 0 ? opts->int2_bits : 2.5f};
  float sec_bud[KV_CALIB_N_PLANS];
  for (int p = 0; p < KV_CALIB_N_PLANS; p++) {
    double r = kv_calib_block_reserve(db, m, bt, nt, n, bud[p]);
    sec_bud[p] = bud[p] - (float)r > 0.5f ? bud[p] - (float)r : 0.5f;
  }
  kv_calib_input in = {
      .n_layers = m->n_layers, .n_heads = m->n_kv_heads, .head_dim = m->head_dim,
      .n_q_heads = opts->n_q_heads, .dtype = (kv_codec_dtype)m->dtype,
      .rope_base = m->rope_style != KVDB_ROPE_NONE ? m->rope_base : 0.0f,
      .rope_style = m->rope_style == KVDB_ROPE_HALF       ? KV_ROPE_HALF
                    : m->rope_style == KVDB_ROPE_ADJACENT ? KV_ROPE_ADJACENT
                                                          : 0,
      .n_contexts = (uint32_t)n, .n_tokens = nt, .q = q, .q_pos = qp, .n_q = nq,
      .head = gather_head, .user = &g,
      .plans = ((opts->flags & KVDB_CALIB_INT4) ? 1u : 0) | ((opts->flags & KVDB_CALIB_INT2) ? 2u : 0),
      .budget = {sec_bud[0], sec_bud[1]},
      /* the plan within its budget at the sections a put of this model stores */
      .block = bt};
  kv_codec_err err;
  kv_codec_status st = kv_calib_run(&in, &cal, &err);
  if (st != KV_CODEC_OK) {
    rc = kv_codec_fail(st, &err, "calibration");
    goto out;
  }
  for (int p = 0; p < KV_CALIB_N_PLANS; p++) /* the record keeps the caller's budget */
    if (cal.plan[p] != NULL) {
      if (cal.planned[p] > sec_bud[p] + 1e-4f)
        kv_log(&db->log, 1,
               "calibration of model '%s': no int%d plan fits %.3f bits per element at "
               "%u-token blocks (its sections may take %.3f); the least takes %.3f",
               m->id, p ? 2 : 4, (double)bud[p], bt, (double)sec_bud[p],
               (double)cal.planned[p]);
      cal.budget[p] = bud[p];
    }
  kv_txn *txn;
  if ((rc = kv_txn_begin(&db->cat, 1, &txn)) != KVDB_OK)
    goto out;
  kv_model_rec mr;
  kv_model_gains gains; /* the stored output gains are kept */
  memset(&gains, 0, sizeof gains);
  int stored; /* keep the stored record's fields (its RoPE) */
  rc = kv_model_rec_load(db, txn, m, bt, mh, &mr, &stored);
  if (rc == KVDB_OK && stored && kv_cat_get_model_gains(&db->cat, txn, m->id, &gains) != KVDB_OK) {
    char em[256];
    snprintf(em, sizeof em, "%s", kvdb_errmsg());
    rc = kv_fail(KVDB_CORRUPT, "model '%s': its stored output gains are damaged (%s); set them "
                               "again (kvdb_model_set_output_gains) before calibrating",
                 m->id, em);
  }
  if (rc == KVDB_OK)
    rc = kv_cat_put_model_full(&db->cat, txn, m->id, &mr, &cal, &gains);
  kv_model_gains_free(&gains);
  if (rc == KVDB_OK)
    rc = kv_txn_commit(txn);
  else
    kv_txn_abort(txn);
out:
  kv_calib_free(&cal);
  free(nt);
  free(nq);
  free(q);
  free(qp);
  return rc;
}

static float plan_mean(const kv_calib *c, int p)
{
  uint32_t heads = c->n_layers * c->n_heads;
  if (c->plan[p] == NULL || heads == 0)
    return 0.0f;
  double s = 0;
  for (uint32_t h = 0; h < heads; h++)
    s += (c->plan[p][h].kb + c->plan[p][h].vb) / 2.0;
  return (float)(s / heads);
}

kvdb_status kvdb_model_calibration(kvdb *db, const char *id, kvdb_calib_info *out)
{
  KV_RET(kv_check_db(db));
  if (id == NULL || out == NULL)
    return kv_fail(KVDB_INVALID, "id or out is NULL");
  KV_RET(kv_model_id_check(id));
  memset(out, 0, sizeof *out);
  kv_txn *txn;
  KV_RET(kv_txn_begin(&db->cat, 0, &txn));
  kv_calib c;
  kvdb_status rc = kv_cat_get_model_calib(&db->cat, txn, id, &c);
  kv_txn_abort(txn);
  if (rc == KVDB_NOTFOUND)
    return kv_fail(KVDB_NOTFOUND, "no model '%s' in the database", id);
  if (rc != KVDB_OK)
    return rc;
  if (c.weight != NULL) {
    out->calibrated = 1;
    out->flags = (c.plan[0] ? (uint32_t)KVDB_CALIB_INT4 : 0) | (c.plan[1] ? (uint32_t)KVDB_CALIB_INT2 : 0);
    out->n_contexts = c.n_contexts;
    out->n_probes = c.n_probes;
    out->int4_bits = c.plan[0] ? c.budget[0] : 0.0f;
    out->int2_bits = c.plan[1] ? c.budget[1] : 0.0f;
    out->int4_planned_bits = plan_mean(&c, 0);
    out->int2_planned_bits = plan_mean(&c, 1);
  }
  kv_calib_free(&c);
  return KVDB_OK;
}
