/* SPDX-License-Identifier: MIT */
/*
 * engine/place/report.c — kvdb_report_quality: a caller's quality report averaged into the
 * context's profile (ops/profile.c keeps profiles), and with placement on the re-profiling
 * it may trigger (kv_place_drift) and the placement of the context again (kv_place_context).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "place.h"

kvdb_status kvdb_report_quality(kvdb *db, const kvdb_key *context, const kvdb_config *config,
                                double quality)
{
  KV_RET(kv_check_db(db));
  if (context == NULL || config == NULL)
    return kv_fail(KVDB_INVALID, "context or config is NULL");
  if (!(quality >= 0.0 && quality <= 1.0))
    return kv_fail(KVDB_INVALID, "quality %g is not in [0, 1]", quality);
  char nm[48];
  KV_RET(kv_config_valid(config, kvdb_config_name(config, nm, sizeof nm)));
  if (db->cat.rdonly)
    return kv_fail(KVDB_READONLY, "database '%s' is open read-only", db->dir);
  kv_profile_rec *p = malloc(sizeof *p);
  if (p == NULL)
    return kv_fail(KVDB_NOMEM, "profile");
  kv_txn *txn;
  kvdb_status rc = kv_txn_begin(&db->cat, 1, &txn);
  if (rc != KVDB_OK) {
    free(p);
    return rc;
  }
  kv_ctx_rec cr;
  char hx[33];
  int drifted = 0;
  rc = kv_cat_get_ctx(&db->cat, txn, context->b, &cr);
  if (rc == KVDB_NOTFOUND)
    rc = kv_fail(KVDB_NOTFOUND, "no context %s", kv_hex16(context->b, hx));
  if (rc == KVDB_OK) {
    kvdb_status g = kv_cat_get_profile(&db->cat, txn, context->b, p);
    if (g == KVDB_NOTFOUND) { /* reports alone make a profile */
      memset(p, 0, sizeof *p);
      p->measured_ms = 0;
      kv_profile_mark_stored(p, &cr.config, cr.bytes);
    } else if (g != KVDB_OK) {
      rc = g;
    }
  }
  if (rc == KVDB_OK) {
    uint32_t i;
    for (i = 0; i < p->n_entries && !kv_policy_config_equal(&p->e[i].config, config); i++)
      ;
    if (i == p->n_entries) {
      if (i == KV_PROFILE_MAX_ENTRIES) {
        rc = kv_fail(KVDB_FULL, "the profile of context %s already has %u configs",
                     kv_hex16(context->b, hx), i);
      } else {
        memset(&p->e[i], 0, sizeof p->e[i]);
        p->e[i].config = *config;
        p->e[i].quality = p->e[i].rel_l2 = NAN;
        p->n_entries++;
      }
    }
    if (rc == KVDB_OK) {
      kvdb_profile_entry *e = &p->e[i];
      double prev = e->n_reports ? e->reported_quality : 0.0;
      e->reported_quality = (prev * e->n_reports + quality) / (e->n_reports + 1);
      e->n_reports++;
      rc = kv_place_drift(db, txn, &cr, p, &drifted); /* placement on: re-profile (§4.3) */
      if (rc == KVDB_OK)
        rc = kv_cat_put_profile(&db->cat, txn, context->b, p);
    }
  }
  free(p);
  if (rc != KVDB_OK) {
    kv_txn_abort(txn);
    return rc;
  }
  rc = kv_txn_commit(txn);
  if (rc == KVDB_OK && drifted)
    kv_place_context(db, context->b); /* and place it again */
  return rc;
}
