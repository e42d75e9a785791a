/* SPDX-License-Identifier: MIT */
/*
 * tools/demo/demo.c — kvdb-demo, the Quick start's main job.
 *
 *   kvdb-demo decode DIR  (demo_decode.c) dense and sparse decoding side by side, the sparse
 *                         side attending over the tokens kvdb selects and fetches per step
 *   kvdb-demo prefix DIR  (demo_prefix.c) with real KV: after kvdb-ingest stored TinyStories
 *                       documents with the stories260K model in DIR, a fresh process continues
 *                       prompts that extend them from the stored KV and from scratch, and prints
 *                       the hit, the time to first token both ways and the identical continuation
 *
 * and, where the model or the corpus is not available, the synthetic demo:
 *
 *   kvdb-demo put DIR   one process stores the KV of prompts that share a system prefix
 *   kvdb-demo get DIR   a fresh process looks each prompt up, gets the prefix KV, checks it
 *                       bit-exact and prints hit tokens, bytes, GB/s and per-call latency
 *
 * The synthetic shapes are Llama-3-8B's: 32 layers, 8 KV heads, head_dim 128, fp16, 256-token
 * blocks (128 KiB of KV per token). Uses only the public header (and tools/refkv, tools/ingest).
 */
#define _GNU_SOURCE
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kvdb.h"

static const kvdb_model LLAMA3 = {"meta-llama/Meta-Llama-3-8B", 32, 8, 128, KVDB_F16, 256};

enum { N_PROMPTS = 6, SYS_TOKENS = 1024, USER_TOKENS = 512 };

static double now_s(void)
{
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static uint64_t mix(uint64_t z)
{
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/* prompt p: a shared system prompt, then its own user turn */
static void prompt_tokens(int p, uint32_t *tok)
{
  for (int i = 0; i < SYS_TOKENS; i++)
    tok[i] = (uint32_t)(mix((uint64_t)i + 1) % 128000);
  for (int i = 0; i < USER_TOKENS; i++)
    tok[SYS_TOKENS + i] = (uint32_t)(mix(((uint64_t)p + 1) << 32 | (uint64_t)i) % 128000);
}

/* synthetic fp16 KV: a function of the token, its predecessor and the coordinates, so equal
 * prefixes have equal KV (as a model's would) */
static uint16_t kv_value(const uint32_t *tok, size_t t, uint32_t l, uint32_t kv, uint32_t h, uint32_t d)
{
  uint64_t s = mix(tok[t] * 0x100000001b3ull ^ (t > 0 ? tok[t - 1] : 7) ^ ((uint64_t)l << 40) ^
                   ((uint64_t)kv << 39) ^ ((uint64_t)h << 32) ^ d);
  return (uint16_t)(0x3000 | (s & 0x0fff)); /* values in [0.125, 0.5) with fp16 mantissa noise */
}

static void fill(const uint32_t *tok, size_t n, uint16_t *buf)
{
  size_t i = 0;
  for (uint32_t l = 0; l < 32; l++)
    for (uint32_t kv = 0; kv < 2; kv++)
      for (size_t t = 0; t < n; t++)
        for (uint32_t h = 0; h < 8; h++)
          for (uint32_t d = 0; d < 128; d++)
            buf[i++] = kv_value(tok, t, l, kv, h, d);
}

static int die(const char *what, kvdb_status rc)
{
  fprintf(stderr, "kvdb-demo: %s: %s: %s\n", what, kvdb_status_name(rc), kvdb_errmsg());
  return 1;
}

static int do_put(const char *dir)
{
  kvdb_options o;
  kvdb_options_init(&o);
  kvdb *db;
  kvdb_status rc = kvdb_open(dir, &o, &db);
  if (rc != KVDB_OK)
    return die("open", rc);
  size_t n = SYS_TOKENS + USER_TOKENS;
  size_t tb = kvdb_model_token_bytes(&LLAMA3);
  uint16_t *buf = malloc(n * tb);
  uint32_t tok[SYS_TOKENS + USER_TOKENS];
  if (buf == NULL)
    return die("allocate", KVDB_NOMEM);
  printf("put: %d prompts of %zu tokens (a %d-token shared system prompt), %s, %zu KiB of KV "
         "per token\n", N_PROMPTS, n, SYS_TOKENS, LLAMA3.id, tb >> 10);
  double total = 0;
  uint64_t written = 0;
  for (int p = 0; p < N_PROMPTS; p++) {
    prompt_tokens(p, tok);
    fill(tok, n, buf);
    kvdb_kv_view v;
    kvdb_kv_view_packed(&v, buf, &LLAMA3, n, KVDB_LAYOUT_LKTHD);
    kvdb_put_info info;
    double t0 = now_s();
    rc = kvdb_put(db, &LLAMA3, tok, n, &v, &info);
    double dt = now_s() - t0;
    if (rc != KVDB_OK)
      return die("put", rc);
    total += dt;
    written += info.bytes_written;
    char hx[33];
    printf("  prompt %d: context %.12s…  %u blocks (%u written, %u shared), %.1f MiB written, "
           "%.1f ms (durable)\n", p, kvdb_key_hex(&info.context, hx), info.n_blocks,
           info.blocks_written, info.blocks_shared, (double)info.bytes_written / (1 << 20),
           dt * 1e3);
  }
  printf("put: %.2f GB written in %.2f s = %.2f GB/s\n", (double)written / 1e9, total,
         (double)written / 1e9 / total);
  free(buf);
  kvdb_close(db);
  return 0;
}

static int do_get(const char *dir)
{
  kvdb_options o;
  kvdb_options_init(&o);
  kvdb *db;
  kvdb_status rc = kvdb_open(dir, &o, &db);
  if (rc != KVDB_OK)
    return die("open", rc);
  size_t n = SYS_TOKENS + USER_TOKENS + 64; /* each query continues its prompt by 64 tokens */
  size_t tb = kvdb_model_token_bytes(&LLAMA3);
  uint16_t *buf = malloc(n * tb);
  uint32_t tok[SYS_TOKENS + USER_TOKENS + 64];
  if (buf == NULL)
    return die("allocate", KVDB_NOMEM);
  printf("get (a fresh process): %d queries of %zu tokens, each extending a stored prompt\n",
         N_PROMPTS + 1, n);
  for (int pass = 0; pass < 2; pass++) {
    double total = 0, worst = 0;
    uint64_t bytes = 0;
    for (int p = 0; p <= N_PROMPTS; p++) { /* the last one was never stored: only the system prompt hits */
      prompt_tokens(p, tok);
      for (size_t i = SYS_TOKENS + USER_TOKENS; i < n; i++)
        tok[i] = (uint32_t)(900000 + i);
      size_t lhit = 0, hit = 0;
      double t0 = now_s();
      rc = kvdb_lookup(db, &LLAMA3, tok, n, &lhit);
      double tl = now_s() - t0;
      if (rc != KVDB_OK)
        return die("lookup", rc);
      kvdb_kv_view v;
      kvdb_kv_view_packed(&v, buf, &LLAMA3, n, KVDB_LAYOUT_LKTHD);
      t0 = now_s();
      rc = kvdb_get(db, &LLAMA3, tok, n, &v, &hit);
      double dt = now_s() - t0;
      if (rc != KVDB_OK)
        return die("get", rc);
      /* bit-exact check of every hit element */
      size_t bad = 0;
      for (uint32_t l = 0; l < 32 && !bad; l++)
        for (uint32_t kv = 0; kv < 2 && !bad; kv++)
          for (size_t t = 0; t < hit && !bad; t++)
            for (uint32_t h = 0; h < 8; h++)
              for (uint32_t d = 0; d < 128; d++)
                if (buf[((((size_t)l * 2 + kv) * n + t) * 8 + h) * 128 + d] != kv_value(tok, t, l, kv, h, d))
                  bad = t + 1;
      if (bad || hit != lhit) {
        fprintf(stderr, "kvdb-demo: query %d: KV differs at token %zu (hit %zu, lookup %zu)\n", p,
                bad - 1, hit, lhit);
        return 1;
      }
      total += dt;
      if (dt > worst)
        worst = dt;
      bytes += hit * tb;
      if (pass == 0)
        printf("  query %d: lookup %zu of %zu tokens in %.1f us; get %.1f MiB in %.1f ms "
               "(%.2f GB/s), bit-exact\n", p, lhit, n, tl * 1e6, (double)(hit * tb) / (1 << 20),
               dt * 1e3, (double)(hit * tb) / 1e9 / dt);
    }
    printf("get %s: %.2f GB in %.3f s = %.2f GB/s, mean %.1f ms per call, worst %.1f ms\n",
           pass == 0 ? "from SSD (cold)" : "again (DRAM tier)", (double)bytes / 1e9, total,
           (double)bytes / 1e9 / total, total * 1e3 / (N_PROMPTS + 1), worst * 1e3);
  }
  kvdb_stats st;
  if (kvdb_stat(db, &st) == KVDB_OK)
    printf("tiers: SSD %" PRIu64 " blocks served, DRAM %" PRIu64 " hits; O_DIRECT %s, io_uring %s\n",
           st.tier[KVDB_TIER_SSD].hits, st.tier[KVDB_TIER_DRAM].hits, st.direct_io ? "on" : "off",
           st.io_uring ? "on" : "off");
  free(buf);
  kvdb_close(db);
  return 0;
}

int demo_prefix(int argc, char **argv); /* demo_prefix.c */
int demo_decode(int argc, char **argv); /* demo_decode.c */

int main(int argc, char **argv)
{
  if (argc >= 2 && strcmp(argv[1], "prefix") == 0)
    return demo_prefix(argc, argv);
  if (argc >= 2 && strcmp(argv[1], "decode") == 0)
    return demo_decode(argc, argv);
  if (argc != 3 || (strcmp(argv[1], "put") != 0 && strcmp(argv[1], "get") != 0)) {
    fprintf(stderr, "usage: kvdb-demo put|get DIR\n"
                    "       kvdb-demo prefix DIR [options]   (kvdb-demo prefix --help)\n"
                    "       kvdb-demo decode DIR [options]   (kvdb-demo decode --help)\n");
    return 2;
  }
  return strcmp(argv[1], "put") == 0 ? do_put(argv[2]) : do_get(argv[2]);
}
