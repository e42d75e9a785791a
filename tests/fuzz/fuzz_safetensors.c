/* SPDX-License-Identifier: MIT */
/*
 * tests/fuzz/fuzz_safetensors.c — tools/ingest/safetensors.c (kvdb-ingest's reader of KV
 * computed elsewhere) on untrusted bytes.
 *
 * A rejected file must come with a message naming it. For an accepted one the shape must be
 * within kvdb's limits and every byte the K/V view addresses (first and last element of every
 * layer, K and V) must lie inside the input; all of them are read, so a sanitizer build catches
 * any overread. Seeds: tests/fuzz/corpora/safetensors/ (made by tools/ingest/make_fuzz_seeds.py).
 */
#include "safetensors.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static volatile uint8_t sink;

static void check_range(const uint8_t *buf, size_t len, const uint8_t *lo, const uint8_t *hi)
{
  if (lo < buf || hi > buf + len || lo > hi)
    abort();
  uint8_t s = 0;
  for (const uint8_t *p = lo; p < hi; p++)
    s ^= *p;
  sink = s;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
  st_context c;
  char err[512];
  if (st_parse(data, size, "fuzz.safetensors", &c, err, sizeof err) != 0) {
    if (strstr(err, "'fuzz.safetensors': ") != err)
      abort();
    return 0;
  }
  if (c.n_tokens < 1 || c.n_layers < 1 || c.n_layers > 1024 || c.n_kv_heads < 1 ||
      c.n_kv_heads > 1024 || c.head_dim < 1 || c.head_dim > 4096)
    abort();
  if (c.dtype != KVDB_F16 && c.dtype != KVDB_BF16 && c.dtype != KVDB_F32)
    abort();
  for (size_t i = 0; i < c.n_tokens; i++)
    if (c.tokens[i] & 0x80000000u)
      abort();
  int64_t es = c.dtype == KVDB_F32 ? 4 : 2;
  for (int kv = 0; kv < 2; kv++) {
    const kvdb_tensor_view *t = kv ? &c.view.v : &c.view.k;
    for (uint32_t l = 0; l < c.n_layers; l++) {
      const uint8_t *base = t->layer_bases != NULL ? (const uint8_t *)t->layer_bases[l]
                                                   : (const uint8_t *)t->base + l * t->layer_stride;
      int64_t last = (int64_t)(c.n_tokens - 1) * t->token_stride +
                     (int64_t)(c.n_kv_heads - 1) * t->head_stride;
      check_range(data, size, base, base + (int64_t)c.head_dim * es);
      check_range(data, size, base + last, base + last + (int64_t)c.head_dim * es);
    }
  }
  st_close(&c);
  return 0;
}
