/* SPDX-License-Identifier: MIT */
/*
 * tests/admin/space_fixture.c — space_fixture sparse DIR: a database of 9 segments of 1 MiB
 * (128 one-block contexts of 8 KiB each), whose 8 sealed ones are left 0, 10, 30, 60, 80, 100,
 * 40 and 70 percent live by deletes (the 9th is open), for test_admin_space.sh.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvdb.h"

static const kvdb_model M = {"space-fixture", 1, 1, 8, KVDB_F16, 128};

static void tokens(int i, uint32_t *tok)
{
  for (int k = 0; k < 128; k++)
    tok[k] = (uint32_t)((i * 131 + k * 7 + 1) % 30011) + 1;
}

static int check(kvdb_status st, const char *what)
{
  if (st == KVDB_OK)
    return 0;
  fprintf(stderr, "space_fixture: %s: %s: %s\n", what, kvdb_status_name(st), kvdb_errmsg());
  exit(1);
}

int main(int argc, char **argv)
{
  if (argc != 3 || strcmp(argv[1], "sparse") != 0) {
    fprintf(stderr, "usage: space_fixture sparse DIR\n");
    return 2;
  }
  kvdb_options o;
  kvdb_options_init(&o);
  o.segment_bytes = 1 << 20;
  o.dram_bytes = 0;
  o.packed_block_bytes = 1; /* whole-page objects: the live fractions test_admin_space.sh checks */
  o.sync_mode = KVDB_SYNC_NONE;
  kvdb *db;
  check(kvdb_open(argv[2], &o, &db), "open");
  static uint16_t kv[128 * 16];
  for (int i = 0; i < 128 * 16; i++)
    kv[i] = (uint16_t)(0x3c00 + i % 97);
  kvdb_kv_view v;
  kvdb_kv_view_packed(&v, kv, &M, 128, KVDB_LAYOUT_LKTHD);
  uint32_t tok[128];
  for (int i = 0; i < 9 * 128 - 100; i++) {
    tokens(i, tok);
    kvdb_put_info info;
    check(kvdb_put(db, &M, tok, 128, &v, &info), "put");
    if (info.bytes_written != 8192) {
      fprintf(stderr, "space_fixture: a context took %llu bytes, not 8192\n",
              (unsigned long long)info.bytes_written);
      return 1;
    }
  }
  static const int live_pct[8] = {0, 10, 30, 60, 80, 100, 40, 70};
  for (int s = 0; s < 8; s++) {
    int drop = 128 - (128 * live_pct[s] + 50) / 100;
    for (int j = 0; j < drop; j++) {
      tokens(s * 128 + j, tok);
      kvdb_key h[1];
      check(kvdb_chain_hashes(&M, tok, 128, h, 1), "chain hashes");
      check(kvdb_delete(db, &h[0]), "delete");
    }
  }
  kvdb_close(db);
  return 0;
}
