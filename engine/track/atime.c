/* SPDX-License-Identifier: MIT */
/*
 * engine/track/atime.c — access times of contexts (the LRU order of put's eviction, and with
 * placement on each access counts): reads note them in the handle (kv_note_access, under
 * db->mu), and the next write transaction writes them (kv_flush_atime).
 */
#include <stdlib.h>
#include <string.h>

#include "track.h"

void kv_note_access(kvdb *db, const uint8_t key[16])
{
  pthread_mutex_lock(&db->mu);
  if (db->n_pending == db->cap_pending) {
    size_t cap = db->cap_pending ? db->cap_pending * 2 : 64;
    if (cap > 4096)
      cap = 4096;
    kv_atime *n = cap > db->cap_pending ? realloc(db->pending, cap * sizeof *n) : NULL;
    if (n != NULL) {
      db->pending = n;
      db->cap_pending = cap;
    } else {
      db->n_pending = 0; /* full: forget the oldest batch; access times are advisory */
    }
  }
  if (db->cap_pending == 0) { /* no memory for even the first batch: forget this one */
    pthread_mutex_unlock(&db->mu);
    return;
  }
  memcpy(db->pending[db->n_pending].key, key, 16);
  db->pending[db->n_pending].ms = kv_now_ms();
  db->n_pending++;
  pthread_mutex_unlock(&db->mu);
}

size_t kv_pending_accesses(kvdb *db, const uint8_t key[16])
{
  size_t k = 0;
  pthread_mutex_lock(&db->mu);
  for (size_t i = 0; i < db->n_pending; i++)
    k += memcmp(db->pending[i].key, key, 16) == 0;
  pthread_mutex_unlock(&db->mu);
  return k;
}

kvdb_status kv_flush_atime(kvdb *db, kv_txn *txn)
{
  pthread_mutex_lock(&db->mu);
  size_t n = db->n_pending;
  kv_atime *p = NULL;
  if (n > 0) {
    p = malloc(n * sizeof *p);
    if (p != NULL)
      memcpy(p, db->pending, n * sizeof *p);
    db->n_pending = 0;
  }
  pthread_mutex_unlock(&db->mu);
  kvdb_status rc = KVDB_OK;
  for (size_t i = 0; p != NULL && i < n && rc == KVDB_OK; i++) {
    rc = kv_cat_ctx_set_access(&db->cat, txn, p[i].key, p[i].ms);
    if (rc == KVDB_OK) /* placement on: every access counts (frequency) */
      rc = kv_place_touch(db, txn, p[i].key, p[i].ms);
  }
  free(p);
  if (rc == KVDB_OK) /* placement on: the tiers' hit counts */
    rc = kv_place_flush_stats(db, txn);
  return rc;
}

