/* SPDX-License-Identifier: MIT */
/*
 * tests/admin/catalog_edit.c — damages one catalog record for tests/admin/test_admin_repair.sh,
 * through LMDB alone (as a stray write would, below kvdb):
 *
 *   catalog_edit DIR blocks|contexts KEYHEX OFFSET ADD
 *       add ADD (a signed integer) to the little-endian u32 at byte OFFSET of the record KEYHEX
 *       of database `blocks` or `contexts` (FORMAT.md §2: a block record's token i is at
 *       72 + 4 i, its n_tokens at 8; a context record's n_tokens at 8)
 *
 * Exit status 0 on success, 1 on any failure (the reason on stderr).
 */
#define _POSIX_C_SOURCE 200809L
#include <lmdb.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int die(const char *what, int rc)
{
  fprintf(stderr, "catalog_edit: %s: %s\n", what, rc ? mdb_strerror(rc) : "bad argument");
  return 1;
}

int main(int argc, char **argv)
{
  if (argc != 6)
    return die("usage: catalog_edit DIR blocks|contexts KEYHEX OFFSET ADD", 0);
  uint8_t key[16];
  if (strlen(argv[3]) != 32)
    return die("KEYHEX", 0);
  for (int i = 0; i < 16; i++) {
    unsigned b;
    if (sscanf(argv[3] + 2 * i, "%2x", &b) != 1)
      return die("KEYHEX", 0);
    key[i] = (uint8_t)b;
  }
  long off = strtol(argv[4], NULL, 10), add = strtol(argv[5], NULL, 10);
  char path[4200];
  snprintf(path, sizeof path, "%s/catalog.mdb", argv[1]);
  MDB_env *env;
  MDB_txn *txn;
  MDB_dbi dbi;
  int rc = mdb_env_create(&env);
  if (rc == 0)
    rc = mdb_env_set_maxdbs(env, 16);
  if (rc == 0)
    rc = mdb_env_set_mapsize(env, 1ull << 30);
  if (rc == 0)
    rc = mdb_env_open(env, path, MDB_NOSUBDIR, 0644);
  if (rc != 0)
    return die(path, rc);
  if ((rc = mdb_txn_begin(env, NULL, 0, &txn)) != 0 || (rc = mdb_dbi_open(txn, argv[2], 0, &dbi)) != 0)
    return die(argv[2], rc);
  MDB_val k = {16, key}, v;
  if ((rc = mdb_get(txn, dbi, &k, &v)) != 0)
    return die("record", rc);
  if (off < 0 || (size_t)off + 4 > v.mv_size)
    return die("OFFSET", 0);
  uint8_t *rec = malloc(v.mv_size);
  memcpy(rec, v.mv_data, v.mv_size);
  uint32_t x = (uint32_t)rec[off] | (uint32_t)rec[off + 1] << 8 | (uint32_t)rec[off + 2] << 16 |
               (uint32_t)rec[off + 3] << 24;
  x += (uint32_t)add;
  for (int i = 0; i < 4; i++)
    rec[off + i] = (uint8_t)(x >> (8 * i));
  MDB_val nv = {v.mv_size, rec};
  if ((rc = mdb_put(txn, dbi, &k, &nv, 0)) != 0 || (rc = mdb_txn_commit(txn)) != 0)
    return die("write", rc);
  free(rec);
  mdb_env_close(env);
  return 0;
}
