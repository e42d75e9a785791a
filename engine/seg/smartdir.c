/* SPDX-License-Identifier: MIT */
/*
 * engine/seg/smartdir.c — the directory of the SmartSSD tier's segments (seg.h), which
 * segment.c resolves for every segment of the tier.
 *
 * SMARTSSD DIRECTORY. Recorded in the catalog meta ("smartssd_dir") by the transaction that
 * creates the tier's first segment (or by a read-write open with placement and the tier): ""
 * for the default DIR/smartssd (so a database directory can be moved), else the absolute
 * path; never changed afterwards. An open reads the record first; without one the option (or
 * the default) is the handle's own directory, and the record is looked up again whenever a
 * segment of the tier is to be found until the handle has seen it (kv_smart_dir: another
 * process may create the tier after this handle opened). The record wins for reading; writing
 * into the tier with an explicit option that contradicts it is refused.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "catalog/catalog.h"
#include "score.h"
#include "seg.h"

#define META_SMART_DIR "smartssd_dir"

static char *default_smart_dir(const kvdb *db)
{
  size_t n = strlen(db->dir) + sizeof "/smartssd";
  char *s = malloc(n);
  if (s != NULL)
    snprintf(s, n, "%s/smartssd", db->dir);
  return s;
}

/* Same directory: same path, or both exist and are the same inode. */
static int same_dir(const char *a, const char *b)
{
  if (strcmp(a, b) == 0)
    return 1;
  struct stat sa, sb;
  return stat(a, &sa) == 0 && stat(b, &sb) == 0 && sa.st_dev == sb.st_dev &&
         sa.st_ino == sb.st_ino;
}

/* The directory a record names: "" is DIR/smartssd. NULL when out of memory. */
static char *recorded_dir(const kvdb *db, const char *rec)
{
  return rec[0] == 0 ? default_smart_dir(db) : strdup(rec);
}

/* This handle has seen the catalog's record `rec`: smart_dir becomes its directory (once; the
 * record never changes once written). */
static void adopt_recorded(kvdb *db, const char *rec)
{
  char *d = recorded_dir(db, rec);
  if (d == NULL)
    return; /* out of memory: looked up again next time */
  pthread_mutex_lock(&db->mu);
  if (!db->smart_seen) {
    db->smart_rec = d;
    db->smart_dir = d;
    db->smart_seen = 1;
    d = NULL;
  }
  pthread_mutex_unlock(&db->mu);
  free(d);
}

const char *kv_smart_dir(kvdb *db)
{
  if (!db->smart_seen && db->cat.env != NULL) {
    /* not recorded when this handle last looked: another handle or process may have created
     * the tier since (its first segment records the directory). A transaction of its own
     * reads only what is committed (a caller's write transaction may hold a record that is
     * not, yet; until it commits this handle's own directory is the same one).
     * kv_cat_peek_meta_str sets no error message (a caller may be cleaning up after one). */
    char rec[PATH_MAX];
    if (kv_cat_peek_meta_str(&db->cat, META_SMART_DIR, rec, sizeof rec))
      adopt_recorded(db, rec);
    /* none recorded (or unreadable now): the handle's own directory, or none */
  }
  return db->smart_dir;
}

kvdb_status kv_smart_dir_open(kvdb *db)
{
  char rec[PATH_MAX];
  int have_rec = 0;
  kv_txn *txn;
  KV_RET(kv_txn_begin(&db->cat, 0, &txn));
  kvdb_status rc = kv_cat_get_str(&db->cat, txn, META_SMART_DIR, rec, sizeof rec);
  kv_txn_abort(txn);
  if (rc == KVDB_OK)
    have_rec = 1;
  else if (rc != KVDB_NOTFOUND)
    return rc;
  const char *want = db->opt.smartssd_dir;
  db->opt.smartssd_dir = NULL; /* the caller's memory is not retained */
  if (want != NULL && want[0] == 0)
    return kv_fail(KVDB_INVALID, "smartssd_dir is empty (NULL means DIR/smartssd)");
  if (want != NULL || db->opt.smartssd_bytes > 0) {
    db->smart_own = want != NULL ? strdup(want) : default_smart_dir(db);
    db->smart_explicit = want != NULL;
    if (db->smart_own == NULL)
      return kv_fail(KVDB_NOMEM, "cannot allocate a path");
  }
  if (have_rec) {
    db->smart_rec = recorded_dir(db, rec);
    if (db->smart_rec == NULL)
      return kv_fail(KVDB_NOMEM, "cannot allocate a path");
    db->smart_dir = db->smart_rec;
    db->smart_seen = 1;
    if (want != NULL && !same_dir(want, db->smart_rec))
      return kv_fail(KVDB_INVALID, "smartssd_dir '%s': this database keeps its SmartSSD tier in "
                     "'%s'", want, db->smart_rec);
  } else {
    db->smart_dir = db->smart_own;
  }
  const char *d = db->smart_dir;
  if (d != NULL && db->opt.smartssd_bytes > 0 && !db->cat.rdonly && mkdir(d, 0755) != 0 &&
      errno != EEXIST)
    return kv_fail_errno(errno, "cannot create the SmartSSD tier's directory '%s'", d);
  return KVDB_OK;
}

kvdb_status kv_smart_dir_ready(kvdb *db, kv_txn *txn)
{
  char rec[PATH_MAX];
  kvdb_status rc = kv_cat_get_str(&db->cat, txn, META_SMART_DIR, rec, sizeof rec);
  if (rc == KVDB_OK) {
    /* recorded by an earlier transaction (this one has not written it yet): committed. It
     * wins, as a database file's own settings do in LMDB and SQLite; an explicit option that
     * names another directory is refused as at open, not followed */
    adopt_recorded(db, rec);
    if (!db->smart_seen)
      return kv_fail(KVDB_NOMEM, "cannot allocate a path");
    if (db->smart_explicit && !same_dir(db->smart_own, db->smart_rec))
      return kv_fail(KVDB_INVALID, "smartssd_dir '%s': this database keeps its SmartSSD tier in "
                     "'%s' (recorded by another handle after this one opened); reopen with "
                     "smartssd_dir NULL or that directory", db->smart_own, db->smart_rec);
  } else if (rc == KVDB_NOTFOUND) {
    if (db->smart_own == NULL)
      return kv_fail(KVDB_INVALID, "this handle has no SmartSSD tier "
                     "(kvdb_options.smartssd_bytes is 0)");
    char *def = default_smart_dir(db);
    if (def == NULL)
      return kv_fail(KVDB_NOMEM, "cannot allocate a path");
    int is_def = strcmp(def, db->smart_own) == 0;
    free(def);
    char abs[PATH_MAX];
    if (!is_def && realpath(db->smart_own, abs) == NULL)
      return kv_fail_errno(errno, "cannot resolve the SmartSSD tier's directory '%s'",
                           db->smart_own);
    rc = kv_cat_put_str(&db->cat, txn, META_SMART_DIR, is_def ? "" : abs);
  }
  if (rc != KVDB_OK)
    return rc;
  const char *d = db->smart_dir; /* the record's, or (recorded now) the handle's own */
  if (mkdir(d, 0755) != 0 && errno != EEXIST)
    return kv_fail_errno(errno, "cannot create the SmartSSD tier's directory '%s'", d);
  return kv_cat_require_format(&db->cat, txn, 3);
}

int kv_smart_dir_unrecorded(kvdb *db, kv_txn *txn)
{
  char rec[PATH_MAX];
  int have_dir = kv_cat_get_str(&db->cat, txn, META_SMART_DIR, rec, sizeof rec) == KVDB_OK;
  return !have_dir && db->smart_own != NULL && db->opt.smartssd_bytes > 0;
}

kvdb_status kv_smart_dir_record(kvdb *db, kv_txn *txn)
{
  kvdb_status rc;
  char *def = default_smart_dir(db), abs[PATH_MAX];
  if (def == NULL)
    rc = kv_fail(KVDB_NOMEM, "cannot allocate a path");
  else if (kv_cat_get_str(&db->cat, txn, META_SMART_DIR, abs, sizeof abs) == KVDB_OK)
    rc = KVDB_OK; /* recorded meanwhile by another process (the handle's own is checked when
                     it creates a segment there) */
  else if (strcmp(def, db->smart_own) == 0)
    rc = kv_cat_put_str(&db->cat, txn, META_SMART_DIR, "");
  else if (realpath(db->smart_own, abs) == NULL)
    rc = kv_fail_errno(errno, "cannot resolve the SmartSSD tier's directory '%s'",
                       db->smart_own);
  else
    rc = kv_cat_put_str(&db->cat, txn, META_SMART_DIR, abs);
  free(def);
  return rc;
}

void kv_smart_dir_close(kvdb *db)
{
  db->smart_dir = NULL;
  free(db->smart_own);
  free(db->smart_rec);
  db->smart_own = db->smart_rec = NULL;
  db->smart_seen = 0;
}

unsigned kv_score_variant_for(kvdb *db, const kvdb_model *m)
{
  uint32_t d = m->head_dim;
  if (m->score_bits == 0 || d == 0 || (d & (d - 1)) != 0)
    return 0;
  if (db->smart_own != NULL || atomic_load(&db->smart_dir) != NULL)
    return 0; /* the near-data device scores version 1 only */
  return KV_SCORE_COPY_CENTERED;
}
