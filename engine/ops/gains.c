/* SPDX-License-Identifier: MIT */
/*
 * engine/ops/gains.c — a model's output-projection gains (kvdb.h "kvdb_model_set_output_gains";
 * issue 16): kvdb_model_set_output_gains checks them and stores them with the model (model
 * record version 4, FORMAT.md §2), keeping its calibration; kvdb_model_output_gains reports
 * them; kv_model_gains_load gives the profile (engine/ops/profile.c) the gains it weighs heads
 * by (compress/ codec.h THE OUTPUT-WEIGHTED QUALITY).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ops_int.h"

kvdb_status kv_model_gains_load(kvdb *db, const kvdb_model *m, kv_model_gains *out)
{
  memset(out, 0, sizeof *out);
  kv_txn *txn;
  KV_RET(kv_txn_begin(&db->cat, 0, &txn));
  kvdb_status rc = kv_cat_get_model_gains(&db->cat, txn, m->id, out);
  kv_txn_abort(txn);
  if (rc == KVDB_NOTFOUND)
    return KVDB_OK; /* a new model: no gains yet */
  if (rc == KVDB_CORRUPT) {
    char em[256];
    snprintf(em, sizeof em, "%s", kvdb_errmsg());
    return kv_fail(KVDB_CORRUPT, "model '%s': %s (set the output gains again: "
                                 "kvdb_model_set_output_gains)", m->id, em);
  }
  if (rc == KVDB_OK && out->g != NULL && out->n_layers != m->n_layers)
    kv_model_gains_free(out); /* another fingerprint: the caller's own check reports it */
  return rc;
}

static kvdb_status check_gains(const kvdb_model *m, const float *g, uint32_t q, uint32_t ch)
{
  if (g == NULL && q == 0 && ch == 0)
    return KVDB_OK; /* remove */
  if (g == NULL)
    return kv_fail(KVDB_INVALID, "gains is NULL (with n_q_heads %u, channels %u)", q, ch);
  if (q == 0 || q > 65536 || q % m->n_kv_heads != 0)
    return kv_fail(KVDB_INVALID, "n_q_heads %u is not a multiple of n_kv_heads %u in 1..65536",
                   q, m->n_kv_heads);
  if (ch != 1 && ch != m->head_dim)
    return kv_fail(KVDB_INVALID, "channels %u is neither 1 nor head_dim %u", ch, m->head_dim);
  size_t n = (size_t)m->n_layers * q * ch;
  for (size_t i = 0; i < n; i++)
    if (!(g[i] >= 0.0f && g[i] <= 3.0e38f)) /* NaN and infinities too */
      return kv_fail(KVDB_INVALID, "gains[%zu] (layer %zu, query head %zu) is %g: gains are "
                                   "finite and >= 0",
                     i, i / ((size_t)q * ch), (i / ch) % q, (double)g[i]);
  return KVDB_OK;
}

kvdb_status kvdb_model_set_output_gains(kvdb *db, const kvdb_model *m, const float *gains,
                                        uint32_t n_q_heads, uint32_t channels)
{
  KV_RET(kv_check_db(db));
  uint32_t bt;
  KV_RET(kv_check_model(m, &bt));
  if (db->cat.rdonly)
    return kv_fail(KVDB_READONLY, "database '%s' is open read-only", db->dir);
  KV_RET(check_gains(m, gains, n_q_heads, channels));
  uint8_t mh[16];
  kv_model_hash(m, bt, mh);
  kv_model_gains g = {.n_layers = m->n_layers, .n_q_heads = n_q_heads, .channels = channels,
                      .g = (float *)(uintptr_t)gains};
  kv_txn *txn;
  KV_RET(kv_txn_begin(&db->cat, 1, &txn));
  kv_model_rec mr;
  kv_calib cal; /* the stored calibration is kept */
  memset(&cal, 0, sizeof cal);
  int stored;
  kvdb_status rc = kv_model_rec_load(db, txn, m, bt, mh, &mr, &stored);
  if (rc == KVDB_OK && stored && mr.calib_bytes != 0 &&
      kv_cat_get_model_calib(&db->cat, txn, m->id, &cal) != KVDB_OK) {
    char em[256];
    snprintf(em, sizeof em, "%s", kvdb_errmsg());
    rc = kv_fail(KVDB_CORRUPT, "model '%s': its stored calibration is damaged (%s); calibrate "
                               "again (kvdb_model_calibrate) before setting output gains",
                 m->id, em);
  }
  if (rc == KVDB_OK)
    rc = kv_cat_put_model_full(&db->cat, txn, m->id, &mr, &cal, gains ? &g : NULL);
  kv_calib_free(&cal);
  if (rc == KVDB_OK)
    rc = kv_txn_commit(txn);
  else
    kv_txn_abort(txn);
  return rc;
}

kvdb_status kvdb_model_output_gains(kvdb *db, const char *id, float *out, size_t cap, size_t *n,
                                    uint32_t *n_q_heads, uint32_t *channels)
{
  KV_RET(kv_check_db(db));
  if (id == NULL || n == NULL || n_q_heads == NULL || channels == NULL ||
      (out == NULL && cap > 0))
    return kv_fail(KVDB_INVALID, "id, n, n_q_heads or channels is NULL, or out is NULL with "
                                 "cap > 0");
  KV_RET(kv_model_id_check(id));
  *n = 0;
  *n_q_heads = *channels = 0;
  kv_txn *txn;
  KV_RET(kv_txn_begin(&db->cat, 0, &txn));
  kv_model_gains g;
  kvdb_status rc = kv_cat_get_model_gains(&db->cat, txn, id, &g);
  kv_txn_abort(txn);
  if (rc == KVDB_NOTFOUND)
    return kv_fail(KVDB_NOTFOUND, "no model '%s' in the database", id);
  if (rc != KVDB_OK)
    return rc;
  if (g.g != NULL) {
    *n = (size_t)g.n_layers * g.n_q_heads * g.channels;
    *n_q_heads = g.n_q_heads;
    *channels = g.channels;
    if (out != NULL && cap > 0)
      memcpy(out, g.g, (cap < *n ? cap : *n) * sizeof(float));
  }
  kv_model_gains_free(&g);
  return KVDB_OK;
}
