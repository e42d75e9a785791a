/* SPDX-License-Identifier: MIT */
/*
 * tests/fuzz/fuzz_rtier_value.c — a remote tier's value (FORMAT.md §6: the envelope, then the
 * block object) from untrusted bytes, checked as a remote get checks it
 * (engine/ops/rtier.c: env_ok, then deliver through kv_rtier_value_take). The input is the
 * 16-byte block hash the value is asked for (the Redis key names it), then the value. The
 * query's tokens and parent are taken from the value's own envelope (where it is long enough),
 * so that mutations get past the envelope's comparisons to the checksum and the object.
 *
 * Must never crash or read outside the input. Properties (abort when broken):
 *   - the answer is 0 (taken) or -1 (refused);
 *   - a taken value is a block the fixture stored (its hash is one of the fixture's blocks, its
 *     tokens that block's, its parent the block before), and the rows it delivered are
 *     exactly the rows kvdb_get returns for those tokens: a damaged value is never wrong KV.
 * The database is tests/fuzz/rtier_fixture.h's, made once per process in $TMPDIR (else /tmp).
 * Seeds: tests/fuzz/corpora/rtier_value/ (fuzz_make_seeds: each block's value, cut short,
 * with a flipped byte in the envelope, the tokens and the object, with a wrong parent).
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "model/model.h"
#include "ops/ops_int.h"
#include "rtier_fixture.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static rf_fixture F;
static uint16_t *out_buf;
static char dir[4096];

static void cleanup(void)
{
  kvdb_close(F.db);
  char cmd[4200];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  if (system(cmd) != 0)
    fprintf(stderr, "fuzz_rtier_value: could not remove %s\n", dir);
  for (uint32_t c = 0; c < RF_CTX; c++)
    free(F.ref[c]);
  free(out_buf);
}

static void setup(void)
{
  const char *base = getenv("TMPDIR");
  snprintf(dir, sizeof dir, "%s/kvdb-fuzz-rtier-XXXXXX", base && *base ? base : "/tmp");
  if (mkdtemp(dir) == NULL) {
    perror(dir);
    abort();
  }
  rf_fixture_make(&F, dir);
  kv_model_hash(&RF_MODEL, RF_BT, F.mh);
  out_buf = malloc(F.ctx_bytes);
  if (out_buf == NULL)
    abort();
  atexit(cleanup);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
  if (F.db == NULL)
    setup();
  if (size < 16)
    return 0;
  uint8_t hash[16];
  memcpy(hash, data, 16);
  size_t len = size - 16;
  uint8_t *v = malloc(len ? len : 1); /* its own allocation: reads past it are caught */
  if (v == NULL)
    abort();
  memcpy(v, data + 16, len);
  uint32_t n_tok = len >= 12 ? (uint32_t)v[8] | (uint32_t)v[9] << 8 : 1;
  if (n_tok == 0 || n_tok > RF_BT)
    n_tok = RF_BT; /* a query asks for at most a block's tokens */
  uint32_t tok[RF_BT];
  uint8_t parent[16];
  memset(tok, 0, sizeof tok);
  memset(parent, 0, sizeof parent);
  for (uint32_t i = 0; i < n_tok && 80 + 4 * (size_t)i + 4 <= len; i++)
    memcpy(&tok[i], v + 80 + 4 * i, 4);
  if (len >= 64)
    memcpy(parent, v + 48, 16);
  /* where a known block's rows go: its own position, so the whole buffer compares */
  int kc = -1, kb = -1;
  for (uint32_t c = 0; c < RF_CTX; c++)
    for (uint32_t b = 0; b < RF_BLOCKS; b++)
      if (memcmp(F.hash[c][b].b, hash, 16) == 0)
        kc = (int)c, kb = (int)b;
  uint64_t t0 = kb >= 0 ? (uint64_t)kb * RF_BT : 0;
  if (t0 + n_tok > RF_TOKENS)
    t0 = 0;
  memset(out_buf, 0xA5, F.ctx_bytes);
  kvdb_kv_view view;
  if (kvdb_kv_view_packed(&view, out_buf, &RF_MODEL, RF_TOKENS, KVDB_LAYOUT_LKTHD) != KVDB_OK)
    abort();
  int rc = kv_rtier_value_take(F.db, &RF_MODEL, RF_BT, RF_NS_TAG, v, len, F.mh, parent, hash,
                               tok, n_tok, &view, t0);
  if (rc != 0 && rc != -1)
    abort();
  if (rc == 0) {
    if (kc < 0)
      abort(); /* taken, yet no block the fixture stored has this hash */
    uint32_t nt = (uint32_t)(RF_TOKENS - t0 < RF_BT ? RF_TOKENS - t0 : RF_BT);
    const uint8_t *want_parent = kb == 0 ? F.mh : F.hash[kc][kb - 1].b;
    if (n_tok != nt || memcmp(parent, want_parent, 16) != 0 ||
        memcmp(tok, F.tok[kc] + t0, 4 * (size_t)nt) != 0)
      abort();
    /* every row of the block equals the stored context's (LKTHD: per layer, K then V, then
     * token-major rows) */
    size_t row = (size_t)RF_MODEL.n_kv_heads * RF_MODEL.head_dim; /* elements per token */
    for (uint32_t l = 0; l < 2 * RF_MODEL.n_layers; l++) {
      size_t off = ((size_t)l * RF_TOKENS + t0) * row;
      if (memcmp(out_buf + off, F.ref[kc] + off, (size_t)nt * row * 2) != 0)
        abort();
    }
  }
  free(v);
  return 0;
}
