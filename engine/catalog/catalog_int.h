/* SPDX-License-Identifier: MIT */
/*
 * engine/catalog/catalog_int.h — the catalog's own header: what only the files of
 * engine/catalog/ use (LMDB's types and calls). The floors above include catalog.h, which
 * names no LMDB type but kv_txn's (see TRANSITION there).
 */
#ifndef KV_CATALOG_INT_H
#define KV_CATALOG_INT_H

#include <lmdb.h>

#include "catalog.h"

/* kv_catalog's database handles are MDB_dbi (catalog.h declares them unsigned int) */
_Static_assert(sizeof(MDB_dbi) == sizeof(unsigned), "MDB_dbi is unsigned int");

/* Convert an LMDB error to a status with a message naming `what`. MDB_MAP_FULL is KVDB_FULL
 * and counts in kv_cat_map_full_events(). */
kvdb_status kv_mdb_fail(int mrc, const char *what);
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

#endif
