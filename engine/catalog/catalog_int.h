/* SPDX-License-Identifier: MIT */
/*
 * engine/catalog/catalog_int.h — the catalog's own header: what only the files of
 * engine/catalog/ use (LMDB's types and calls). The floors above include catalog.h, which
 * names no LMDB type: kv_txn and kv_catalog's env are opaque there (see LMDB TYPES there).
 */
#ifndef KV_CATALOG_INT_H
#define KV_CATALOG_INT_H

#include <lmdb.h>

#include "catalog.h"

/* kv_catalog's database handles are MDB_dbi (catalog.h declares them unsigned int) */
_Static_assert(sizeof(MDB_dbi) == sizeof(unsigned), "MDB_dbi is unsigned int");

/* kv_txn and kv_catalog's env are opaque outside the catalog (catalog.h): they are LMDB's
 * MDB_txn and MDB_env, converted here at the LMDB boundary (the pointer is never dereferenced
 * as the opaque type: no struct kv_txn or struct kv_env is ever defined). */
static inline MDB_txn *kv_mtxn(kv_txn *t) { return (MDB_txn *)t; }
static inline kv_txn *kv_ktxn(MDB_txn *t) { return (kv_txn *)t; }
static inline MDB_env *kv_menv(struct kv_env *e) { return (MDB_env *)e; }
static inline struct kv_env *kv_kenv(MDB_env *e) { return (struct kv_env *)e; }

/* Convert an LMDB error to a status with a message naming `what`. MDB_MAP_FULL is KVDB_FULL
 * and counts in kv_cat_map_full_events(). */
kvdb_status kv_mdb_fail(int mrc, const char *what);

/* A record's first byte as its version: KVDB_CORRUPT when len < min or it is 0, KVDB_VERSION
 * (naming what) when it is newer than max. */
kvdb_status kv_rec_version_max(const uint8_t *src, size_t len, size_t min, const char *what,
                               unsigned max);
/* mdb_cursor_open, its failure (ENOMEM) as a status (kv_mdb_fail naming `what`). */
kvdb_status kv_cursor_open(MDB_txn *txn, MDB_dbi dbi, MDB_cursor **cur, const char *what);

/* Every transaction of a catalog's environment is begun and ended through these (the macros
 * below route the mdb_txn_* calls of the files that include this header here): they count
 * open transactions for the map growth (kv_txn_begin). Environments without a catalog pass
 * straight through. */
int kv_mdb_txn_begin(MDB_env *env, MDB_txn *parent, unsigned flags, MDB_txn **out);
int kv_mdb_txn_commit(MDB_txn *txn);
void kv_mdb_txn_abort(MDB_txn *txn);
#ifndef KV_CATALOG_IMPL
#define mdb_txn_begin kv_mdb_txn_begin
#define mdb_txn_commit kv_mdb_txn_commit
#define mdb_txn_abort kv_mdb_txn_abort
#endif

/* ---- the base below the schema (catalog.c), for schema.c and the schema's users ---- */

/* The catalog of txn's environment (NULL: an environment without one). */
kv_catalog *kv_txn_catalog(kv_txn *txn);
/* kv_txn_commit without the counters' stamp: the own-commit "wstamp" (kv_cat_track_commits)
 * and the commit. kv_txn_commit (schema.c) is kv_counts_stamp and this; counts.c, below
 * schema.c, calls the two itself. */
kvdb_status kv_txn_commit_base(kv_catalog *c, kv_txn *txn);
/* kv_catalog_open's first half: the environment (opened, registered, lock file, dead
 * readers cleared), no transaction yet. On failure the catalog is closed again. */
kvdb_status kv_cat_env_open(kv_catalog *c, const char *dir, uint64_t map_bytes, int rdonly,
                            int create, int nosync);
/* Open (create: MDB_CREATE) the schema's databases in txn and note which exist (has_*). */
kvdb_status kv_cat_open_dbs(kv_catalog *c, kv_txn *txn, unsigned create);
/* kv_catalog_vacuum without the recount: *recount = 1 when the file was replaced (the
 * counters' stamps no longer match its transaction ids). */
kvdb_status kv_cat_vacuum_file(kv_catalog *c, int force, int *done, uint64_t *before,
                               uint64_t *after, int *recount);

#endif
