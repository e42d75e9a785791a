/* SPDX-License-Identifier: MIT */
/*
 * tests/admin/place_fixture.c — databases with placement for tests/admin/test_admin_place.sh.
 * Uses only kvdb.h.
 *
 *   place_fixture create DIR   placement on (EvicPress; DRAM 256 KiB, SSD 512 KiB, SmartSSD
 *                              512 KiB): eight contexts of 160 tokens, each placed by its put,
 *                              the first read three times
 *   place_fixture shrink DIR   reopen with SSD and SmartSSD at 320 KiB (the recorded settings
 *                              change; nothing moves until a rebalance)
 *   place_fixture plain DIR    a database never opened with placement: one context
 *
 * The model: 2 layers, 2 KV heads, head_dim 64, f16, 16-token blocks (1 KiB per token).
 * Exit status 0 on success, 1 on any failure (the kvdb status and message on stderr).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvdb.h"

static const kvdb_model model = {.id = "test/place", .n_layers = 2, .n_kv_heads = 2,
                                 .head_dim = 64, .dtype = KVDB_F16, .block_tokens = 16};

#define N_TOK 160

static int check(kvdb_status st, const char *what)
{
  if (st != KVDB_OK) {
    fprintf(stderr, "place_fixture: %s: %s: %s\n", what, kvdb_status_name(st), kvdb_errmsg());
    return 1;
  }
  return 0;
}

static kvdb_options opts(const char *mode)
{
  kvdb_options o;
  kvdb_options_init(&o);
  o.log_level = -1;
  if (strcmp(mode, "plain") != 0) {
    o.placement = KVDB_PLACEMENT_EVICPRESS;
    o.dram_bytes = 256 << 10;
    o.ssd_bytes = strcmp(mode, "shrink") == 0 ? 320 << 10 : 512 << 10;
    o.smartssd_bytes = o.ssd_bytes;
  }
  return o;
}

static int put(kvdb *db, int i, int reads)
{
  uint32_t tok[N_TOK];
  uint64_t s = (uint64_t)i * 2654435761u + 1;
  for (int t = 0; t < N_TOK; t++) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    tok[t] = (uint32_t)(s >> 40) % 30000;
  }
  size_t tb = kvdb_model_token_bytes(&model);
  uint16_t *buf = malloc(N_TOK * tb);
  if (buf == NULL)
    return 1;
  for (size_t e = 0; e < N_TOK * tb / 2; e++) { /* smooth values: quantization-friendly */
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    buf[e] = (uint16_t)(0x3800 + ((s >> 40) & 0x3ff)); /* f16 in [0.5, 1) */
  }
  kvdb_kv_view v;
  int rc = check(kvdb_kv_view_packed(&v, buf, &model, N_TOK, KVDB_LAYOUT_LKTHD), "view") ||
           check(kvdb_put(db, &model, tok, N_TOK, &v, NULL), "put");
  for (int g = 0; g < reads && rc == 0; g++) {
    size_t hit;
    rc = check(kvdb_get(db, &model, tok, N_TOK, &v, &hit), "get");
  }
  free(buf);
  return rc;
}

int main(int argc, char **argv)
{
  if (argc != 3 || (strcmp(argv[1], "create") != 0 && strcmp(argv[1], "shrink") != 0 &&
                    strcmp(argv[1], "plain") != 0)) {
    fprintf(stderr, "usage: place_fixture create|shrink|plain DIR\n");
    return 1;
  }
  kvdb_options o = opts(argv[1]);
  kvdb *db;
  if (check(kvdb_open(argv[2], &o, &db), "open"))
    return 1;
  int rc = 0;
  if (strcmp(argv[1], "create") == 0)
    for (int i = 0; i < 8 && rc == 0; i++)
      rc = put(db, i, i == 0 ? 3 : 0);
  else if (strcmp(argv[1], "plain") == 0)
    rc = put(db, 0, 0);
  kvdb_close(db);
  return rc;
}
