/* SPDX-License-Identifier: MIT */
/*
 * tests/fuzz/rtier_fixture.h — the database that fuzz_rtier_value checks values against and
 * fuzz_make_seeds makes its seed values from: three contexts of 40 tokens (blocks of 16, 16, 8)
 * of one model with int8 score copies, stored raw, lossless and int4, in a fresh directory.
 * Everything in it is deterministic, so the block hashes and objects a seed was made from are
 * the ones the fuzz target finds.
 */
#ifndef RTIER_FIXTURE_H
#define RTIER_FIXTURE_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvdb.h"

#define RF_CTX 3u
#define RF_TOKENS 40u
#define RF_BT 16u
#define RF_BLOCKS 3u          /* per context */
#define RF_NS_TAG 0x6b76646266757a7aull /* the namespace tag the values carry */

static const kvdb_model RF_MODEL = {"fuzz-rtier", 2, 2, 16, KVDB_F16, RF_BT, 8};
static const char *const RF_CONFIG[RF_CTX] = {"raw", "lossless", "int4"};

typedef struct rf_fixture {
  kvdb *db;
  uint32_t tok[RF_CTX][RF_TOKENS];
  kvdb_key hash[RF_CTX][RF_BLOCKS]; /* each block's chained hash */
  uint8_t mh[16];                   /* the model fingerprint (the first block's parent) */
  uint16_t *ref[RF_CTX];            /* each context as kvdb_get returns it (LKTHD) */
  size_t ctx_bytes;
} rf_fixture;

/* Open a fresh database in dir and store the three contexts; exits on any failure. */
static inline void rf_fixture_make(rf_fixture *f, const char *dir)
{
  memset(f, 0, sizeof *f);
  kvdb_options o;
  kvdb_options_init(&o);
  if (kvdb_open(dir, &o, &f->db) != KVDB_OK) {
    fprintf(stderr, "rtier fixture: open %s: %s\n", dir, kvdb_errmsg());
    exit(1);
  }
  f->ctx_bytes = RF_TOKENS * kvdb_model_token_bytes(&RF_MODEL);
  uint16_t *kv = malloc(f->ctx_bytes);
  for (uint32_t c = 0; c < RF_CTX; c++) {
    for (uint32_t t = 0; t < RF_TOKENS; t++)
      f->tok[c][t] = 1000 * (c + 1) + 7 * t;
    uint32_t x = 12345u + c;
    for (size_t i = 0; i < f->ctx_bytes / 2; i++) { /* f16 values of magnitude below 2 */
      x = x * 1103515245u + 12345u;
      kv[i] = (uint16_t)(((x >> 16) & 0x83ffu) | 0x3800u);
    }
    kvdb_kv_view v;
    kvdb_put_opts po;
    kvdb_put_opts_init(&po);
    f->ref[c] = malloc(f->ctx_bytes);
    size_t got = 0;
    if (kv == NULL || f->ref[c] == NULL ||
        kvdb_kv_view_packed(&v, kv, &RF_MODEL, RF_TOKENS, KVDB_LAYOUT_LKTHD) != KVDB_OK ||
        kvdb_config_parse(RF_CONFIG[c], &po.config) != KVDB_OK ||
        kvdb_put_ex(f->db, &RF_MODEL, f->tok[c], RF_TOKENS, &v, &po, NULL) != KVDB_OK ||
        kvdb_kv_view_packed(&v, f->ref[c], &RF_MODEL, RF_TOKENS, KVDB_LAYOUT_LKTHD) !=
            KVDB_OK ||
        kvdb_get(f->db, &RF_MODEL, f->tok[c], RF_TOKENS, &v, &got) != KVDB_OK ||
        got != RF_TOKENS ||
        kvdb_chain_hashes(&RF_MODEL, f->tok[c], RF_TOKENS, f->hash[c], RF_BLOCKS) != KVDB_OK) {
      fprintf(stderr, "rtier fixture: context %u: %s\n", c, kvdb_errmsg());
      exit(1);
    }
  }
  free(kv);
}

#endif
