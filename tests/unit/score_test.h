/* SPDX-License-Identifier: MIT */
/*
 * tests/unit/score_test.h — helpers shared by the score and fpga tests: CHECK (counts and
 * reports, does not stop), REQUIRE (stops), a splitmix64 generator, and error text.
 */
#ifndef SCORE_TEST_H
#define SCORE_TEST_H

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "score.h"

#define T_EXIT_SKIP 77

static int n_checks, n_failures;

#if defined(__GNUC__)
__attribute__((format(printf, 4, 5)))
#endif
static inline void
check_failed(const char *expr, const char *file, int line, const char *fmt, ...)
{
  n_failures++;
  fprintf(stderr, "%s:%d: FAILED: %s: ", file, line, expr);
  va_list ap;
  va_start(ap, fmt);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fputc('\n', stderr);
  if (n_failures > 50) {
    fprintf(stderr, "too many failures, stopping\n");
    exit(1);
  }
}

/* The message arguments are evaluated only when cond fails. */
#define CHECK(cond, ...)                                                                           \
  do {                                                                                             \
    n_checks++;                                                                                    \
    if (!(cond))                                                                                   \
      check_failed(#cond, __FILE__, __LINE__, __VA_ARGS__);                                        \
  } while (0)

#define REQUIRE(cond, ...)                                                                         \
  do {                                                                                             \
    if (!(cond)) {                                                                                 \
      check_failed(#cond, __FILE__, __LINE__, __VA_ARGS__);                                        \
      exit(1);                                                                                     \
    }                                                                                              \
  } while (0)

static inline const char *t_errtext(const kv_score_err *e)
{
  static char buf[512];
  kv_score_errmsg(e, buf, sizeof buf);
  return buf;
}

static inline int t_finish(const char *name)
{
  printf("%s: %d checks, %d failures\n", name, n_checks, n_failures);
  return n_failures ? 1 : 0;
}

typedef struct t_rng {
  uint64_t s;
} t_rng;

static inline uint64_t t_next(t_rng *r)
{
  uint64_t z = (r->s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
static inline uint32_t t_below(t_rng *r, uint32_t n)
{
  return (uint32_t)(((t_next(r) >> 32) * (uint64_t)n) >> 32);
}
static inline double t_unif(t_rng *r) /* [0, 1) */
{
  return (double)(t_next(r) >> 11) * 0x1p-53;
}
static inline float t_gauss(t_rng *r)
{
  double s = 0;
  for (int i = 0; i < 4; i++)
    s += t_unif(r);
  return (float)((s - 2.0) * 1.7320508);
}

/* Top-k oracle: sort all (pos, score) by the documented order, keep k. */
static inline void t_sort_pairs(kv_score_pair *p, size_t n)
{
  /* insertion sort is too slow for big n: a simple bottom-up merge sort */
  kv_score_pair *tmp = malloc(n * sizeof *tmp);
  if (tmp == NULL) {
    fprintf(stderr, "out of memory\n");
    exit(1);
  }
  for (size_t w = 1; w < n; w *= 2) {
    for (size_t lo = 0; lo < n; lo += 2 * w) {
      size_t mid = lo + w < n ? lo + w : n, hi = lo + 2 * w < n ? lo + 2 * w : n;
      size_t i = lo, j = mid, o = lo;
      while (i < mid && j < hi)
        tmp[o++] = kv_score_better(p[j].pos, p[j].score, p[i].pos, p[i].score) ? p[j++] : p[i++];
      while (i < mid)
        tmp[o++] = p[i++];
      while (j < hi)
        tmp[o++] = p[j++];
    }
    memcpy(p, tmp, n * sizeof *tmp);
  }
  free(tmp);
}

#endif
