/* SPDX-License-Identifier: MIT */
/*
 * tests/fault/test_fault_alloc.c — allocation failure as the normal case (SQLite's malloc
 * loops). This executable interposes malloc, calloc, realloc, posix_memalign, aligned_alloc
 * and memalign (glibc lets an executable's definitions win over libc's, for every shared
 * library too: libkvdb, LMDB, zstd, liburing), so the Nth allocation after arming fails with
 * NULL — kvdb's own and those of the libraries under it.
 *
 * For N = 1, 2, ...: arm, open a database and run a workload of put, lookup, get, get_tokens,
 * delete, compact, a re-encode and more puts, disarm. Every call returns a status (never
 * crashes, never aborts); then the database reopens without the fault, kvdb_verify passes and
 * every put acknowledged under the fault reads back bit-exact. The loop ends when the workload
 * runs without reaching the Nth allocation. Also: the same with "every allocation from the Nth
 * on fails" (a process out of memory, not one unlucky call). Every N is tested (the workload
 * makes a few hundred allocations: kvdb reuses its buffers). Under AddressSanitizer or
 * ThreadSanitizer (whose run-times own malloc) the test skips (77).
 *
 * `test_fault_alloc figures`: every allocation point of an open with placement on, while the
 * clock says every timed step is slow (the test also interposes clock_gettime: during that open
 * each reading advances the clock 4 ms, what a probe of a tier can measure on a loaded
 * machine). A failure must not make the open measure the tiers again: the database keeps the
 * figures its tiers were probed at (a probe at that moment recorded a 4 ms SSD, and the next
 * rebalance dropped context 0 as faster to recompute than to read), and every context reads
 * back after a rebalance.
 */
#include "kvdb_test.h"

#include <errno.h>
#include <limits.h>
#include <malloc.h>
#include <stdatomic.h>
#include <sys/syscall.h>
#include <time.h>

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define T_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define T_SANITIZED 1
#endif
#endif

#ifndef T_SANITIZED
/* ---- the failing allocator ----------------------------------------------------------------- */

extern void *__libc_malloc(size_t);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);
extern void *__libc_memalign(size_t, size_t);

static atomic_long g_count;     /* allocations since arming */
static atomic_long g_fail_at;   /* fail the allocation with this number (1-based); 0 = never */
static atomic_int g_sticky;     /* 1: every allocation from fail_at on fails */
static atomic_int g_fired;

static int fail_now(void)
{
  long at = atomic_load_explicit(&g_fail_at, memory_order_relaxed);
  if (at == 0)
    return 0;
  long n = atomic_fetch_add(&g_count, 1) + 1;
  if (n == at || (n > at && atomic_load_explicit(&g_sticky, memory_order_relaxed))) {
    atomic_store(&g_fired, 1);
    return 1;
  }
  return 0;
}

void *malloc(size_t n)
{
  return fail_now() ? NULL : __libc_malloc(n);
}

void *calloc(size_t n, size_t s)
{
  return fail_now() ? NULL : __libc_calloc(n, s);
}

void *realloc(void *p, size_t n)
{
  return fail_now() ? NULL : __libc_realloc(p, n);
}

void *memalign(size_t a, size_t n)
{
  return fail_now() ? NULL : __libc_memalign(a, n);
}

void *aligned_alloc(size_t a, size_t n)
{
  return fail_now() ? NULL : __libc_memalign(a, n);
}

int posix_memalign(void **out, size_t a, size_t n)
{
  if (fail_now())
    return ENOMEM;
  void *p = __libc_memalign(a, n);
  if (p == NULL)
    return ENOMEM;
  *out = p;
  return 0;
}

/* A loaded machine's clock: with g_clock_step_ns set, every reading is that much later than the
 * one before (the engine's probes and timings then measure slow tiers); kv_now_ms too. */
static atomic_long g_clock_step_ns, g_clock_skew_ns;

int clock_gettime(clockid_t id, struct timespec *ts)
{
  long rc = syscall(SYS_clock_gettime, id, ts);
  long step = atomic_load(&g_clock_step_ns);
  if (rc == 0 && step != 0) {
    long long ns = (long long)ts->tv_sec * 1000000000ll + ts->tv_nsec +
                   atomic_fetch_add(&g_clock_skew_ns, step) + step;
    ts->tv_sec = (time_t)(ns / 1000000000ll);
    ts->tv_nsec = (long)(ns % 1000000000ll);
  }
  return (int)rc;
}

static void arm(long at, int sticky)
{
  atomic_store(&g_count, 0);
  atomic_store(&g_fired, 0);
  atomic_store(&g_sticky, sticky);
  atomic_store(&g_fail_at, at);
}

static int disarm(void)
{
  atomic_store(&g_fail_at, 0);
  return atomic_load(&g_fired);
}

/* ---- the workload -------------------------------------------------------------------------- */

static const kvdb_model M = {"alloc-model", 2, 2, 128, KVDB_F16, 32};

static kvdb_options opts(void)
{
  kvdb_options o;
  kvdb_options_init(&o);
  o.dram_bytes = 1 << 20;
  o.segment_bytes = 1 << 20;
  o.sync_mode = KVDB_SYNC_NONE; /* process-level consistency is what is tested here */
  o.log_level = -1;
  return o;
}

static size_t ctx_tokens(int i, uint32_t *tok)
{
  uint64_t s = 91 + (uint64_t)i;
  size_t n = 40 + (size_t)(i * 37 % 90);
  for (size_t k = 0; k < n; k++)
    tok[k] = (uint32_t)(k < 32 ? k + 1 : t_rand(&s) % 30000); /* all share one block */
  return n;
}

/* The KV buffers are made before arming: the test's own allocations must not fail. */
static uint16_t *g_buf[9];

static kvdb_status put_i(kvdb *db, int i, const char *config)
{
  uint32_t tok[160];
  size_t n = ctx_tokens(i, tok);
  kvdb_kv_view v;
  kvdb_kv_view_packed(&v, g_buf[i], &M, n, KVDB_LAYOUT_LKTHD);
  kvdb_put_opts o;
  kvdb_put_opts_init(&o);
  if (config != NULL && kvdb_config_parse(config, &o.config) != KVDB_OK)
    return KVDB_INVALID;
  return kvdb_put_ex(db, &M, tok, n, &v, &o, NULL);
}

static uint16_t g_back[160 * 2 * 2 * 2 * 128];

/* 1 when context i reads back whole and exact (a lossy context: whole) */
static int intact(kvdb *db, int i, int exact)
{
  uint32_t tok[160];
  size_t n = ctx_tokens(i, tok);
  memset(g_back, 0, sizeof g_back);
  kvdb_kv_view v;
  kvdb_kv_view_packed(&v, g_back, &M, n, KVDB_LAYOUT_LKTHD);
  size_t hit = 0;
  kvdb_status rc = kvdb_get(db, &M, tok, n, &v, &hit);
  return rc == KVDB_OK && hit == n && (!exact || t_check_kv(&M, tok, n, n, g_back) == n);
}

static kvdb_key key_of(int i)
{
  uint32_t tok[160];
  size_t n = ctx_tokens(i, tok);
  kvdb_key h[8];
  kvdb_chain_hashes(&M, tok, n, h, 8);
  return h[(n + 31) / 32 - 1];
}

/* acked[i]: 1 put returned OK (exact), 2 OK and lossy, 0 not acknowledged, <0 unknown */
static void workload(const char *dir, int *acked)
{
  kvdb_options o = opts();
  kvdb *db = NULL;
  if (kvdb_open(dir, &o, &db) != KVDB_OK)
    return;
  for (int i = 0; i < 5; i++)
    if (put_i(db, i, i == 4 ? "lossless" : NULL) == KVDB_OK)
      acked[i] = 1;
  if (put_i(db, 5, "int8") == KVDB_OK)
    acked[5] = 2;
  for (int i = 0; i < 6; i++) {
    uint32_t tok[160];
    size_t n = ctx_tokens(i, tok), hit;
    (void)kvdb_lookup(db, &M, tok, n, &hit);
    (void)intact(db, i, 0);
  }
  kvdb_key k = key_of(1);
  uint32_t pos[3] = {0, 17, 39};
  static uint16_t out[2 * 3 * 2 * 128];
  kvdb_kv_view v;
  kvdb_kv_view_packed(&v, out, &M, 3, KVDB_LAYOUT_LKTHD);
  (void)kvdb_get_tokens(db, &M, &k, 1, pos, 3, &v);
  k = key_of(2);
  if (kvdb_delete(db, &k) == KVDB_OK)
    acked[2] = 0;
  else
    acked[2] = -acked[2]; /* a failed delete may or may not have committed */
  (void)kvdb_compact(db, 0.99, NULL, NULL, NULL);
  kvdb_config to;
  kvdb_config_parse("int8", &to);
  k = key_of(3);
  kvdb_status rc = kvdb_recompress(db, &M, &k, &to, NULL);
  if (rc == KVDB_OK)
    acked[3] = 2;
  for (int i = 6; i < 9; i++)
    if (put_i(db, i, NULL) == KVDB_OK)
      acked[i] = 1;
  kvdb_stats st;
  (void)kvdb_stat(db, &st);
  kvdb_close(db);
}

static int check(const char *dir, const int *acked, long at, const char *what)
{
  kvdb_options o = opts();
  kvdb *db;
  if (kvdb_open(dir, &o, &db) != KVDB_OK) {
    fprintf(stderr, "%s at %ld: reopen: %s\n", what, at, kvdb_errmsg());
    return 0;
  }
  int ok = 1;
  for (int i = 0; i < 9; i++)
    if (acked[i] > 0 && !intact(db, i, acked[i] == 1 && i != 3)) {
      /* context 3 is exact unless its re-encode committed (a failed one may have) */
      fprintf(stderr, "%s at %ld: acknowledged context %d lost\n", what, at, i);
      ok = 0;
    }
  kvdb_verify_report rep;
  if (kvdb_verify(db, NULL, NULL, NULL, &rep) != KVDB_OK) {
    fprintf(stderr, "%s at %ld: verify: %s\n", what, at, kvdb_errmsg());
    ok = 0;
  }
  kvdb_close(db);
  return ok;
}

/* ---- with placement on: puts placed by Algorithm 1, a rebalance -------------------------- */

static kvdb_options place_opts(void)
{
  kvdb_options o = opts();
  o.placement = KVDB_PLACEMENT_EVICPRESS;
  o.placement_alpha = 1e6; /* quality first: contexts stay exact */
  /* recomputing is dear (10 tokens/s): no tier figure a loaded machine can measure makes a
   * drop the cheaper choice, so a context that goes is lost, not evicted by the policy */
  o.prefill_tokens_per_s = 10;
  o.dram_bytes = 256 << 10;
  o.ssd_bytes = 192 << 10; /* about 3 contexts: the others go to the SmartSSD tier */
  o.smartssd_bytes = 64 << 20;
  return o;
}

static char g_place_base[4096];

static void place_workload(const char *dir, int *acked)
{
  kvdb_options o = place_opts();
  kvdb *db = NULL;
  if (kvdb_open(dir, &o, &db) != KVDB_OK)
    return;
  for (int i = 4; i < 7; i++)
    if (put_i(db, i, NULL) == KVDB_OK)
      acked[i] = 1;
  kvdb_place_plan plan;
  if (kvdb_rebalance_plan(db, &plan) == KVDB_OK) {
    kvdb_rebalance_report rep;
    (void)kvdb_rebalance_execute(db, &plan, &rep);
    kvdb_place_plan_free(&plan);
  }
  for (int i = 0; i < 7; i++)
    (void)intact(db, i, 0);
  kvdb_close(db);
}

/* Every allocation point of a workload: for N = 1, 2, ... the Nth allocation fails (`sticky`:
 * and every one after it), then the database is checked without faults. `place`: the placement
 * workload, each round on a copy of g_place_base (placement settings and tier figures recorded,
 * contexts 0..3 stored); else the plain workload on a new database. */
static long loop(int sticky, int place)
{
  long points = 0;
  for (long at = 1;; at++) {
    char *dir = t_tmpdir("alloc");
    int acked[9] = {0};
    if (place) {
      char cmd[8400];
      snprintf(cmd, sizeof cmd, "cp -a '%s'/. '%s'/", g_place_base, dir);
      ASSERT(system(cmd) == 0);
      for (int i = 0; i < 4; i++)
        acked[i] = 1;
    }
    arm(at, sticky);
    if (place)
      place_workload(dir, acked);
    else
      workload(dir, acked);
    int fired = disarm();
    if (!check(dir, acked, at,
               place ? "allocation failure with placement"
                     : sticky ? "sticky allocation failure" : "allocation failure"))
      abort();
    t_rmdir(dir);
    if (!fired)
      break;
    points++;
  }
  return points;
}

/* Every allocation point of an open with placement on (a copy of a base database whose tiers
 * were probed at a quiet moment), the clock slow during that open: the open fails or not; then,
 * without faults and at normal speed, a rebalance. The tiers' figures must stay those of the
 * base (an open that fails to read them must not probe again) and contexts 0..3 must read back
 * exact. */
static long figures_loop(void)
{
  char *base = t_tmpdir("allocfig");
  kvdb_tier_perf f0[KVDB_TIER_COUNT];
  {
    kvdb_options o = place_opts();
    kvdb *db;
    ASSERT_OK(kvdb_open(base, &o, &db));
    for (int i = 0; i < 4; i++)
      ASSERT_OK(put_i(db, i, NULL));
    ASSERT_OK(kvdb_tier_probe(db, 0, f0));
    kvdb_close(db);
  }
  ASSERT(f0[KVDB_TIER_SSD].probed_unix_ms > 0 && f0[KVDB_TIER_SMARTSSD].probed_unix_ms > 0);
  long points = 0;
  for (long at = 1;; at++) {
    char *dir = t_tmpdir("allocfig");
    char cmd[8400];
    snprintf(cmd, sizeof cmd, "cp -a '%s'/. '%s'/", base, dir);
    ASSERT(system(cmd) == 0);
    kvdb_options o = place_opts();
    kvdb *db = NULL;
    atomic_store(&g_clock_step_ns, 4000000); /* 4 ms a reading: a 4 KiB read "takes" 4 ms */
    arm(at, 0);
    kvdb_status rc = kvdb_open(dir, &o, &db);
    int fired = disarm();
    atomic_store(&g_clock_step_ns, 0);
    ASSERT(rc == KVDB_OK || (fired && db == NULL));
    if (rc == KVDB_OK)
      kvdb_close(db);
    /* without faults: the figures, a rebalance, the contexts */
    ASSERT_OK(kvdb_open(dir, &o, &db));
    kvdb_tier_perf f[KVDB_TIER_COUNT];
    ASSERT_OK(kvdb_tier_probe(db, 0, f));
    int ok = 1;
    for (int t = KVDB_TIER_SSD; t < KVDB_TIER_COUNT; t++)
      if (f[t].probed_unix_ms != f0[t].probed_unix_ms || f[t].latency_s != f0[t].latency_s) {
        fprintf(stderr, "allocation failure %ld in an open: tier %d probed again (%.1f us, was "
                "%.1f us)\n", at, t, f[t].latency_s * 1e6, f0[t].latency_s * 1e6);
        ok = 0;
      }
    kvdb_place_plan plan;
    ASSERT_OK(kvdb_rebalance_plan(db, &plan));
    kvdb_rebalance_report rep;
    ASSERT_OK(kvdb_rebalance_execute(db, &plan, &rep));
    kvdb_place_plan_free(&plan);
    for (int i = 0; i < 4; i++)
      if (!intact(db, i, 1)) {
        fprintf(stderr, "allocation failure %ld in an open: context %d lost\n", at, i);
        ok = 0;
      }
    kvdb_close(db);
    if (!ok)
      abort();
    t_rmdir(dir);
    if (!fired)
      break;
    points++;
  }
  atomic_store(&g_clock_step_ns, 0);
  t_rmdir(base);
  return points;
}

int main(int argc, char **argv)
{
  if (argc > 1 && strcmp(argv[1], "figures") == 0) {
    for (int i = 0; i < 4; i++) {
      uint32_t tok[160];
      size_t n = ctx_tokens(i, tok);
      g_buf[i] = malloc(n * kvdb_model_token_bytes(&M));
      t_fill_kv(&M, tok, n, g_buf[i]);
    }
    long points = figures_loop();
    ASSERT(points > 10);
    printf("test_fault_alloc figures: %ld allocation-failure points of an open with placement "
           "on, the clock slow: the tiers kept their figures, contexts 0..3 read back\n", points);
    for (int i = 0; i < 4; i++)
      free(g_buf[i]);
    return 0;
  }
  if (argc > 1) {
    fprintf(stderr, "usage: test_fault_alloc [figures]\n");
    return 2;
  }
  for (int i = 0; i < 9; i++) {
    uint32_t tok[160];
    size_t n = ctx_tokens(i, tok);
    g_buf[i] = malloc(n * kvdb_model_token_bytes(&M));
    t_fill_kv(&M, tok, n, g_buf[i]);
  }
  /* the workload without faults: how many allocations it makes, and that it all works */
  char *dir = t_tmpdir("alloc0");
  int acked[9] = {0};
  arm(LONG_MAX, 0);
  workload(dir, acked);
  long total = atomic_load(&g_count);
  disarm();
  for (int i = 0; i < 9; i++)
    ASSERT(i == 2 ? acked[i] == 0 : acked[i] > 0);
  ASSERT(check(dir, acked, 0, "no failure"));
  t_rmdir(dir);
  long one = loop(0, 0), sticky = loop(1, 0);
  /* placement: a base database (placement settings, probed tier figures, 4 contexts) */
  char *base = t_tmpdir("allocbase");
  snprintf(g_place_base, sizeof g_place_base, "%s", base);
  {
    kvdb_options o = place_opts();
    kvdb *db;
    ASSERT_OK(kvdb_open(base, &o, &db));
    for (int i = 0; i < 4; i++)
      ASSERT_OK(put_i(db, i, NULL));
    kvdb_close(db);
  }
  long placed = loop(0, 1);
  t_rmdir(base);
  /* the count varies a little between runs (when the access-time flush happens depends on the
   * clock): each loop ran until the workload made fewer allocations than its N */
  ASSERT(one > total / 2 && sticky > total / 2);
  printf("test_fault_alloc: the workload makes %ld allocations; %ld single and %ld sticky "
         "allocation-failure points survived; with placement on (puts placed, a rebalance): "
         "%ld more\n", total, one, sticky, placed);
  for (int i = 0; i < 9; i++)
    free(g_buf[i]);
  return 0;
}

#else
int main(int argc, char **argv)
{
  (void)argc;
  (void)argv;
  printf("skipped: this test interposes malloc, which the sanitizer's run-time owns\n");
  return T_EXIT_SKIP;
}
#endif
