/* SPDX-License-Identifier: MIT */
/*
 * tests/kvdb_test.h — small helpers for kvdb tests (libuv ASSERT_* style, liburing exit codes).
 */
#ifndef KVDB_TEST_H
#define KVDB_TEST_H

#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kvdb.h"

#define T_EXIT_PASS 0
#define T_EXIT_FAIL 1
#define T_EXIT_SKIP 77

#define ASSERT_OK(expr)                                                                            \
  do {                                                                                             \
    kvdb_status rc_ = (expr);                                                                      \
    if (rc_ != KVDB_OK) {                                                                          \
      fprintf(stderr, "%s:%d: %s -> %s (%s)\n", __FILE__, __LINE__, #expr,                         \
              kvdb_status_name(rc_), kvdb_errmsg());                                               \
      abort();                                                                                     \
    }                                                                                              \
  } while (0)
#define ASSERT_STATUS(want, expr)                                                                  \
  do {                                                                                             \
    kvdb_status rc_ = (expr);                                                                      \
    if (rc_ != (want)) {                                                                           \
      fprintf(stderr, "%s:%d: %s -> %s, expected %s (%s)\n", __FILE__, __LINE__, #expr,            \
              kvdb_status_name(rc_), kvdb_status_name(want), kvdb_errmsg());                       \
      abort();                                                                                     \
    }                                                                                              \
  } while (0)
#define ASSERT(cond)                                                                               \
  do {                                                                                             \
    if (!(cond)) {                                                                                 \
      fprintf(stderr, "%s:%d: assertion failed: %s\n", __FILE__, __LINE__, #cond);                 \
      abort();                                                                                     \
    }                                                                                              \
  } while (0)
#define ASSERT_EQ(a, b)                                                                            \
  do {                                                                                             \
    long long a_ = (long long)(a), b_ = (long long)(b);                                            \
    if (a_ != b_) {                                                                                \
      fprintf(stderr, "%s:%d: %s = %lld, expected %s = %lld\n", __FILE__, __LINE__, #a, a_, #b,    \
              b_);                                                                                 \
      abort();                                                                                     \
    }                                                                                              \
  } while (0)
#define ASSERT_MSG_HAS(sub)                                                                        \
  do {                                                                                             \
    if (strstr(kvdb_errmsg(), (sub)) == NULL) {                                                    \
      fprintf(stderr, "%s:%d: message '%s' does not contain '%s'\n", __FILE__, __LINE__,          \
              kvdb_errmsg(), (sub));                                                               \
      abort();                                                                                     \
    }                                                                                              \
  } while (0)

/* A fresh directory under $TMPDIR (or /tmp); removed by t_rmdir. */
static inline char *t_tmpdir(const char *tag)
{
  const char *base = getenv("TMPDIR");
  char *p = malloc(4096);
  snprintf(p, 4096, "%s/kvdb-%s-XXXXXX", base && *base ? base : "/tmp", tag);
  if (mkdtemp(p) == NULL) {
    perror("mkdtemp");
    abort();
  }
  return p;
}

static inline void t_rmdir(char *p)
{
  char cmd[4200];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", p);
  if (system(cmd) != 0)
    fprintf(stderr, "warning: could not remove %s\n", p);
  free(p);
}

/* Deterministic pseudo-random numbers (splitmix64). */
static inline uint64_t t_rand(uint64_t *s)
{
  uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/*
 * The value stored for element (layer, kv, token position, head, dim) of a context whose
 * tokens are `tokens`: a function of the token ids up to and including that position, so
 * equal prefixes have equal KV (as a real model's would) and a wrong block is visible.
 */
static inline uint16_t t_kv_value(const uint32_t *tokens, uint64_t pos, uint32_t layer,
                                  uint32_t kv, uint32_t head, uint32_t dim)
{
  uint64_t s = tokens[pos] * 0x100000001b3ull ^ (pos * 31 + layer * 7919 + kv * 104729 +
                                                 head * 1299709 + dim * 15485863);
  if (pos > 0)
    s ^= tokens[pos - 1] * 0x9e3779b97f4a7c15ull;
  return (uint16_t)(t_rand(&s) & 0x7bff); /* finite fp16 */
}

/* Fill a packed LKTHD f16 buffer with positions [t0, t0 + n) of the sequence `tokens`. */
static inline void t_fill_kv_range(const kvdb_model *m, const uint32_t *tokens, size_t t0,
                                   size_t n, uint16_t *buf)
{
  size_t i = 0;
  for (uint32_t l = 0; l < m->n_layers; l++)
    for (uint32_t kv = 0; kv < 2; kv++)
      for (size_t t = t0; t < t0 + n; t++)
        for (uint32_t h = 0; h < m->n_kv_heads; h++)
          for (uint32_t d = 0; d < m->head_dim; d++)
            buf[i++] = t_kv_value(tokens, t, l, kv, h, d);
}

/* Fill a packed LKTHD f16 buffer for tokens[0..n). */
static inline void t_fill_kv(const kvdb_model *m, const uint32_t *tokens, size_t n, uint16_t *buf)
{
  t_fill_kv_range(m, tokens, 0, n, buf);
}

/* Check a packed LKTHD f16 buffer holds the values of tokens[0..n); returns the first bad
 * token position or n. */
static inline size_t t_check_kv(const kvdb_model *m, const uint32_t *tokens, size_t n,
                                size_t stride_tokens, const uint16_t *buf)
{
  for (uint32_t l = 0; l < m->n_layers; l++)
    for (uint32_t kv = 0; kv < 2; kv++)
      for (size_t t = 0; t < n; t++)
        for (uint32_t h = 0; h < m->n_kv_heads; h++)
          for (uint32_t d = 0; d < m->head_dim; d++) {
            size_t i = ((((size_t)l * 2 + kv) * stride_tokens + t) * m->n_kv_heads + h) *
                           m->head_dim + d;
            if (buf[i] != t_kv_value(tokens, t, l, kv, h, d))
              return t;
          }
  return n;
}

/* kvdb_put of tokens[0..n) with the KV t_fill_kv gives them (*info filled when not NULL). */
static inline void t_put_kv(kvdb *db, const kvdb_model *m, const uint32_t *tok, size_t n,
                            kvdb_put_info *info)
{
  uint16_t *buf = malloc(n * kvdb_model_token_bytes(m));
  ASSERT(buf != NULL);
  t_fill_kv(m, tok, n, buf);
  kvdb_kv_view v;
  ASSERT_OK(kvdb_kv_view_packed(&v, buf, m, n, KVDB_LAYOUT_LKTHD));
  ASSERT_OK(kvdb_put(db, m, tok, n, &v, info));
  free(buf);
}

/* kvdb_get of tokens[0..n) into a fresh buffer: the hit, after checking that every delivered
 * byte is the KV t_fill_kv gives those tokens. */
static inline size_t t_get_check(kvdb *db, const kvdb_model *m, const uint32_t *tok, size_t n)
{
  uint16_t *buf = calloc(n, kvdb_model_token_bytes(m));
  ASSERT(buf != NULL);
  kvdb_kv_view v;
  ASSERT_OK(kvdb_kv_view_packed(&v, buf, m, n, KVDB_LAYOUT_LKTHD));
  size_t hit = 0;
  ASSERT_OK(kvdb_get(db, m, tok, n, &v, &hit));
  ASSERT_EQ(t_check_kv(m, tok, hit, n, buf), hit);
  free(buf);
  return hit;
}

/* Tokens [0, n) of context `seed` (below 30000): the first `shared` come from `family` alone, so
 * contexts of one family share that prefix. */
static inline void t_family_tokens(uint64_t seed, uint64_t family, size_t shared, uint32_t *tok,
                                   size_t n)
{
  uint64_t s = seed * 7919 + 1, fs = family + 1000;
  for (size_t i = 0; i < n; i++)
    tok[i] = (uint32_t)(i < shared ? t_rand(&fs) % 30000 : t_rand(&s) % 30000);
}

/* The bytes of the whole-page block object at offset 0 of the open segment file fd: its
 * header's meta_bytes (u32 at 8) + data_bytes (u64 at 96), format/FORMAT.md §3 — where the
 * segment's second object starts, for tests that damage a chosen block on disk. */
static inline uint64_t t_first_object_bytes(int fd)
{
  uint8_t hdr[128];
  ASSERT(pread(fd, hdr, sizeof hdr, 0) == (ssize_t)sizeof hdr);
  uint64_t meta = 0, data = 0;
  for (int i = 3; i >= 0; i--)
    meta = meta << 8 | hdr[8 + i];
  for (int i = 7; i >= 0; i--)
    data = data << 8 | hdr[96 + i];
  return meta + data;
}

/* kvdb_put_ex of tokens[0..n) with the KV t_fill_kv gives them, in config `cfg`
 * (kvdb_config_parse): its status; the context's key in *key when KVDB_OK and key is not NULL. */
static inline kvdb_status t_put_config(kvdb *db, const kvdb_model *m, const uint32_t *tok,
                                       size_t n, const char *cfg, kvdb_key *key)
{
  uint16_t *buf = malloc(n * kvdb_model_token_bytes(m));
  ASSERT(buf != NULL);
  t_fill_kv(m, tok, n, buf);
  kvdb_kv_view v;
  kvdb_put_opts po;
  kvdb_put_opts_init(&po);
  kvdb_status rc = kvdb_config_parse(cfg, &po.config);
  if (rc == KVDB_OK)
    rc = kvdb_kv_view_packed(&v, buf, m, n, KVDB_LAYOUT_LKTHD);
  kvdb_put_info info;
  if (rc == KVDB_OK)
    rc = kvdb_put_ex(db, m, tok, n, &v, &po, &info);
  if (rc == KVDB_OK && key != NULL)
    *key = info.context;
  free(buf);
  return rc;
}

#endif
