/* SPDX-License-Identifier: MIT */
/*
 * tests/crash/test_crash.c — a crash at any point leaves the database openable with every
 * acknowledged put intact and nothing half-visible.
 *
 *   test_crash kill       a child puts in a loop and reports each acknowledged put over a
 *                         pipe; the parent SIGKILLs it at a random moment, reopens, checks
 *                         every acknowledged context bit-exact, that the put in flight is
 *                         either absent or whole, and kvdb_verify. KVDB_CRASH_ITERS rounds
 *                         (default 200; KVDB_SLOW=1: 2000).
 *   test_crash powerloss  the same with tests/io_test.c in power-loss mode: at a chosen
 *                         fdatasync the unsynced segment writes are dropped, kept or torn
 *                         and the child dies there (SQLite's test6.c idea).
 *   test_crash syncpoints a fixed maintenance workload (compact, re-encode, puts, delete,
 *                         compact) loses power at its 1st, 2nd, ... segment sync in turn, with
 *                         each loss mode, on a fresh copy of the same database each time.
 * The child of the first two also compacts and re-encodes (kvdb_compact, kvdb_recompress to lossless) every
 * other put, so crashes land inside those too; the summary counts them.
 */
#include "kvdb_test.h"

#include <errno.h>
#include <signal.h>
#include <sys/wait.h>
#include <time.h>

#include "io_test.h"

static const kvdb_model M = {"crash-model", 2, 2, 64, KVDB_F16, 16};

/* Context `seed`: its tokens are a function of the seed; some share a prefix with others. */
static size_t ctx_tokens(uint64_t seed, uint32_t *tok, size_t cap)
{
  uint64_t s = seed * 7919 + 1;
  size_t n = 41 + t_rand(&s) % (cap - 41);
  uint64_t family = seed % 5; /* five families share their first 40 tokens */
  uint64_t fs = family + 1000;
  for (size_t i = 0; i < n; i++)
    tok[i] = (uint32_t)(i < 40 ? t_rand(&fs) % 30000 : t_rand(&s) % 30000);
  tok[40] = (uint32_t)(30000 + seed); /* no two seeds have the same tokens */
  return n;
}

static uint64_t g_segment_bytes = 2 << 20;

static kvdb_options opts(void)
{
  kvdb_options o;
  kvdb_options_init(&o);
  o.dram_bytes = 1 << 20;
  o.segment_bytes = g_segment_bytes; /* seal often: recovery meets sealed and open segments */
  o.log_level = -1;
  return o;
}

static void child(const char *dir, int wfd, uint64_t first_seed, int powerloss)
{
  kvdb_options o = opts();
  kvdb *db;
  if (kvdb_open(dir, &o, &db) != KVDB_OK) {
    fprintf(stderr, "child: open: %s\n", kvdb_errmsg());
    _exit(3);
  }
  uint32_t tok[200];
  uint16_t *buf = malloc(200 * kvdb_model_token_bytes(&M));
  for (uint64_t seed = first_seed;; seed++) {
    if (powerloss && seed - first_seed == 40)
      iot_crash_now(); /* no sync point reached in 40 puts: lose power anyway */
    size_t n = ctx_tokens(seed, tok, 200);
    t_fill_kv(&M, tok, n, buf);
    kvdb_kv_view v;
    kvdb_kv_view_packed(&v, buf, &M, n, KVDB_LAYOUT_LKTHD);
    if (write(wfd, &seed, 8) != 8) /* "about to put seed" */
      _exit(4);
    kvdb_status rc = kvdb_put(db, &M, tok, n, &v, NULL);
    if (rc != KVDB_OK) {
      fprintf(stderr, "child: put: %s\n", kvdb_errmsg());
      _exit(5);
    }
    uint64_t ack = seed | (1ull << 63);
    if (write(wfd, &ack, 8) != 8)
      _exit(4);
    if (seed % 7 == 3) { /* deletes happen too; a deleted context is no longer promised */
      kvdb_key h[13];
      uint64_t victim = seed - 2;
      size_t vn = ctx_tokens(victim, tok, 200);
      kvdb_chain_hashes(&M, tok, vn, h, 13);
      uint64_t del = victim | (1ull << 62);
      if (write(wfd, &del, 8) != 8) /* "about to delete" */
        _exit(4);
      rc = kvdb_delete(db, &h[(vn + 15) / 16 - 1]);
      if (rc != KVDB_OK && rc != KVDB_NOTFOUND)
        _exit(6);
    }
    /* maintenance, early in every child so crashes land in it too: a compaction of the
     * segments deletes thinned, and a re-encode (to lossless: still bit-exact) of an older
     * context. Neither changes what is promised. */
    uint64_t k = seed - first_seed;
    if (k % 4 == 1 || k % 4 == 3) {
      uint64_t what = (k % 4 == 1 ? 1 : 2) | (1ull << 61);
      if (write(wfd, &what, 8) != 8) /* "maintenance begins" */
        _exit(4);
      if (k % 4 == 1) {
        rc = kvdb_compact(db, 0.99, NULL, NULL, NULL);
      } else {
        kvdb_key h[13];
        size_t vn = ctx_tokens(seed > 4 ? seed - 4 : 1, tok, 200);
        kvdb_chain_hashes(&M, tok, vn, h, 13);
        kvdb_config to;
        kvdb_config_parse("lossless", &to);
        rc = kvdb_recompress(db, &M, &h[(vn + 15) / 16 - 1], &to, NULL);
        if (rc == KVDB_NOTFOUND || rc == KVDB_INVALID) /* deleted, or lossless already */
          rc = KVDB_OK;
      }
      if (rc != KVDB_OK) {
        fprintf(stderr, "child: %s: %s\n", k % 4 == 1 ? "compact" : "recompress", kvdb_errmsg());
        _exit(7);
      }
      what = 1ull << 60;
      if (write(wfd, &what, 8) != 8) /* "maintenance ends" */
        _exit(4);
    }
  }
}

static int check_ctx(kvdb *db, uint64_t seed, int must_exist)
{
  uint32_t tok[200];
  size_t n = ctx_tokens(seed, tok, 200);
  uint16_t *buf = calloc(n, kvdb_model_token_bytes(&M));
  kvdb_kv_view v;
  kvdb_kv_view_packed(&v, buf, &M, n, KVDB_LAYOUT_LKTHD);
  size_t hit = 0;
  ASSERT_OK(kvdb_get(db, &M, tok, n, &v, &hit));
  int ok = 1;
  if (t_check_kv(&M, tok, hit, n, buf) != hit) {
    fprintf(stderr, "seed %llu: wrong KV within the hit (%zu tokens)\n", (unsigned long long)seed, hit);
    ok = 0;
  }
  kvdb_key h[13];
  kvdb_chain_hashes(&M, tok, n, h, 13);
  kvdb_context_info ci;
  kvdb_status st = kvdb_context_stat(db, &h[(n + 15) / 16 - 1], &ci);
  if (must_exist && (st != KVDB_OK || hit != n)) {
    fprintf(stderr, "seed %llu: acknowledged put lost (context %s, hit %zu of %zu)\n",
            (unsigned long long)seed, kvdb_status_name(st), hit, n);
    ok = 0;
  }
  if (st == KVDB_OK && hit != n) {
    fprintf(stderr, "seed %llu: context visible but only %zu of %zu tokens readable\n",
            (unsigned long long)seed, hit, n);
    ok = 0;
  }
  free(buf);
  return ok;
}

/* ---- every sync point of maintenance in turn ---------------------------------------------- */

static kvdb_status put_seed(kvdb *db, uint64_t seed, uint32_t *tok, uint16_t *buf)
{
  size_t n = ctx_tokens(seed, tok, 200);
  t_fill_kv(&M, tok, n, buf);
  kvdb_kv_view v;
  kvdb_kv_view_packed(&v, buf, &M, n, KVDB_LAYOUT_LKTHD);
  return kvdb_put(db, &M, tok, n, &v, NULL);
}

static kvdb_key key_of_seed(uint64_t seed, uint32_t *tok)
{
  kvdb_key h[13];
  size_t n = ctx_tokens(seed, tok, 200);
  kvdb_chain_hashes(&M, tok, n, h, 13);
  return h[(n + 15) / 16 - 1];
}

#define SP_BASE 30 /* seeds 1..30 stored first (1 MiB segments: four sealed), every 3rd deleted */

/* The maintenance workload on a database holding seeds 1..SP_BASE with 2, 5, 8, ... deleted:
 * compact, re-encode seed 3 to lossless, put seeds SP_BASE+1 and +2, delete seed 4, compact
 * again. Reports as the child of the random loops does. Returns the syncs it made (when it
 * does not crash). */
static long maint_child(const char *dir, int wfd)
{
  kvdb_options o = opts();
  kvdb *db;
  if (kvdb_open(dir, &o, &db) != KVDB_OK)
    _exit(3);
  uint32_t tok[200];
  uint16_t *buf = malloc(200 * kvdb_model_token_bytes(&M));
  if (kvdb_compact(db, 0.99, NULL, NULL, NULL) != KVDB_OK)
    _exit(7);
  kvdb_config to;
  kvdb_config_parse("lossless", &to);
  kvdb_key k = key_of_seed(3, tok);
  if (kvdb_recompress(db, &M, &k, &to, NULL) != KVDB_OK)
    _exit(7);
  for (uint64_t seed = SP_BASE + 1; seed <= SP_BASE + 2; seed++) {
    if (write(wfd, &seed, 8) != 8)
      _exit(4);
    if (put_seed(db, seed, tok, buf) != KVDB_OK)
      _exit(5);
    uint64_t ack = seed | (1ull << 63);
    if (write(wfd, &ack, 8) != 8)
      _exit(4);
  }
  uint64_t del = 4 | (1ull << 62);
  if (write(wfd, &del, 8) != 8)
    _exit(4);
  k = key_of_seed(4, tok);
  if (kvdb_delete(db, &k) != KVDB_OK)
    _exit(6);
  if (kvdb_compact(db, 0.99, NULL, NULL, NULL) != KVDB_OK)
    _exit(7);
  kvdb_close(db);
  free(buf);
  return iot_count(IOT_SYNC);
}

/* Power loss at sync point 1, 2, ... of maintenance, each loss mode; every round on a fresh
 * copy of the same database. Returns the crash points survived. */
static int maint_syncpoints(void)
{
  static const char *loss_name[3] = {"drop", "keep", "garble"};
  long syncs = -1, points = 0;
  for (long at = 0; syncs < 0 || at <= syncs; at++) {
    for (int loss = 0; loss < 3; loss++) {
      if (at == 0 && loss > 0)
        continue; /* round 0 counts the syncs: no crash */
      char *dir = t_tmpdir("syncpoint");
      kvdb_options o = opts();
      kvdb *db;
      ASSERT_OK(kvdb_open(dir, &o, &db));
      uint32_t tok[200];
      uint16_t *buf = malloc(200 * kvdb_model_token_bytes(&M));
      for (uint64_t seed = 1; seed <= SP_BASE; seed++)
        ASSERT_OK(put_seed(db, seed, tok, buf));
      for (uint64_t seed = 2; seed <= SP_BASE; seed += 3) {
        kvdb_key k = key_of_seed(seed, tok);
        ASSERT_OK(kvdb_delete(db, &k));
      }
      kvdb_close(db);
      free(buf);
      int p[2];
      ASSERT(pipe(p) == 0);
      iot_config c = {.fail_kind = -1, .powerloss = 1, .crash_at_sync = at, .loss = loss,
                      .seed = (unsigned long long)(at * 3 + loss)};
      iot_install(&c);
      pid_t pid = fork();
      if (pid == 0) {
        close(p[0]);
        long n = maint_child(dir, p[1]);
        if (write(p[1], &n, 8) != 8)
          _exit(4);
        _exit(0);
      }
      iot_uninstall();
      close(p[1]);
      int acked[SP_BASE + 3] = {0};
      for (uint64_t s = 1; s <= SP_BASE; s++)
        acked[s] = s % 3 != 2;
      uint64_t msg, inflight = 0;
      long n_syncs = -1;
      int status;
      while (read(p[0], &msg, 8) == 8) {
        if (msg & (1ull << 63)) {
          uint64_t sd = msg & ~(1ull << 63);
          ASSERT(sd < SP_BASE + 3);
          acked[sd] = 1;
          inflight = 0;
        } else if (msg & (1ull << 62)) {
          uint64_t sd = msg & ~(1ull << 62);
          ASSERT(sd < SP_BASE + 3);
          acked[sd] = 0;
        } else if (msg >= SP_BASE + 1 && msg <= SP_BASE + 2) {
          inflight = msg;
        } else {
          n_syncs = (long)msg; /* the last message of a clean run */
        }
      }
      close(p[0]);
      waitpid(pid, &status, 0);
      int crashed = WIFEXITED(status) && WEXITSTATUS(status) == IOT_CRASH_EXIT;
      if (at == 0) {
        ASSERT(WIFEXITED(status) && WEXITSTATUS(status) == 0 && n_syncs > 0);
        syncs = n_syncs;
      } else if (!crashed) {
        fprintf(stderr, "sync point %ld (%s): the child did not crash (status %d)\n", at,
                loss_name[loss], status);
        return -1;
      }
      ASSERT_OK(kvdb_open(dir, &o, &db));
      int ok = 1;
      for (uint64_t s = 1; s <= SP_BASE + 2; s++)
        if (acked[s])
          ok &= check_ctx(db, s, 1);
      if (inflight)
        ok &= check_ctx(db, inflight, 0);
      if (kvdb_verify(db, NULL, NULL, NULL, NULL) != KVDB_OK) {
        fprintf(stderr, "sync point %ld (%s): verify: %s\n", at, loss_name[loss], kvdb_errmsg());
        ok = 0;
      }
      kvdb_close(db);
      if (!ok) {
        fprintf(stderr, "power loss at sync point %ld (%s) lost data\n", at, loss_name[loss]);
        return -1;
      }
      t_rmdir(dir);
      points += at > 0;
    }
  }
  printf("test_crash syncpoints: the maintenance workload (compact, re-encode, 2 puts, delete, "
         "compact) makes %ld segment syncs; a power loss at each, dropping, keeping or garbling "
         "the unsynced writes: %ld crash points, all intact\n", syncs, points);
  return 0;
}

int main(int argc, char **argv)
{
  if (argc > 1 && strcmp(argv[1], "syncpoints") == 0 && (g_segment_bytes = 1 << 20) != 0)
    return maint_syncpoints() == 0 ? T_EXIT_PASS : T_EXIT_FAIL;
  int powerloss = argc > 1 && strcmp(argv[1], "powerloss") == 0;
  const char *it_env = getenv("KVDB_CRASH_ITERS");
  int iters = it_env ? atoi(it_env) : (getenv("KVDB_SLOW") ? 2000 : powerloss ? 120 : 200);
  char *dir = t_tmpdir(powerloss ? "powerloss" : "crash");
  uint64_t rs = (uint64_t)time(NULL);
  if (getenv("KVDB_SEED"))
    rs = strtoull(getenv("KVDB_SEED"), NULL, 10);
  const uint64_t seed0 = rs;
  printf("test_crash %s: %d rounds, KVDB_SEED=%llu\n", powerloss ? "powerloss" : "kill", iters,
         (unsigned long long)rs);
  /* state: acknowledged and not deleted */
  size_t cap = 1 << 16;
  uint8_t *acked = calloc(cap, 1);
  uint64_t next_seed = 1;
  long crashes = 0, clean_exits = 0, acks_total = 0, crashes_compact = 0, crashes_recompress = 0;
  for (int round = 0; round < iters; round++) {
    int p[2];
    ASSERT(pipe(p) == 0);
    if (powerloss) {
      iot_config c = {.fail_kind = -1, .powerloss = 1,
                      .crash_at_sync = 1 + (long)(t_rand(&rs) % 12),
                      .loss = (int)(t_rand(&rs) % 3), .seed = t_rand(&rs)};
      iot_install(&c);
    }
    pid_t pid = fork();
    if (pid == 0) {
      close(p[0]);
      child(dir, p[1], next_seed, powerloss);
    }
    iot_uninstall();
    close(p[1]);
    if (!powerloss) {
      struct timespec ts = {0, (long)(t_rand(&rs) % 80000000)};
      nanosleep(&ts, NULL);
      kill(pid, SIGKILL);
    }
    /* read reports until the child is gone */
    uint64_t msg, inflight = 0, in_delete = 0, in_maint = 0;
    while (read(p[0], &msg, 8) == 8) {
      if (msg & (1ull << 61)) {
        in_maint = msg & 3;
      } else if (msg & (1ull << 60)) {
        in_maint = 0;
      } else if (msg & (1ull << 63)) {
        uint64_t s = msg & ~(1ull << 63);
        if (s >= cap)
          continue;
        acked[s] = 1;
        acks_total++;
        inflight = 0;
      } else if (msg & (1ull << 62)) {
        uint64_t s = msg & ~(1ull << 62);
        if (s < cap)
          acked[s] = 0; /* no longer promised, whether or not the delete finished */
        in_delete = s;
      } else {
        inflight = msg;
        if (msg + 1 > next_seed)
          next_seed = msg + 1;
      }
    }
    (void)in_delete;
    close(p[0]);
    int status;
    waitpid(pid, &status, 0);
    if (WIFSIGNALED(status) || (WIFEXITED(status) && WEXITSTATUS(status) == IOT_CRASH_EXIT)) {
      crashes++;
      if (in_maint == 1)
        crashes_compact++;
      else if (in_maint == 2)
        crashes_recompress++;
    }
    else if (WIFEXITED(status) && WEXITSTATUS(status) != 0) {
      fprintf(stderr, "round %d: child failed with exit %d\n", round, WEXITSTATUS(status));
      return T_EXIT_FAIL;
    } else
      clean_exits++;
    /* reopen (recovery) and check */
    kvdb_options o = opts();
    kvdb *db;
    ASSERT_OK(kvdb_open(dir, &o, &db));
    int ok = 1;
    /* every acknowledged context of the last 40 seeds, and a sample of older ones */
    for (uint64_t s = next_seed > 40 ? next_seed - 40 : 1; s < next_seed && s < cap; s++)
      if (acked[s])
        ok &= check_ctx(db, s, 1);
    for (int k = 0; k < 10 && next_seed > 1; k++) {
      uint64_t s = 1 + t_rand(&rs) % (next_seed - 1);
      if (s < cap && acked[s])
        ok &= check_ctx(db, s, 1);
    }
    if (inflight)
      ok &= check_ctx(db, inflight, 0); /* absent or whole */
    if (round % 20 == 19 || round == iters - 1) {
      kvdb_verify_report rep;
      kvdb_status vs = kvdb_verify(db, NULL, NULL, NULL, &rep);
      if (vs != KVDB_OK) {
        fprintf(stderr, "round %d: verify: %s\n", round, kvdb_errmsg());
        ok = 0;
      }
    }
    kvdb_close(db);
    if (!ok) {
      fprintf(stderr, "round %d failed (KVDB_SEED=%llu)\n", round, (unsigned long long)seed0);
      return T_EXIT_FAIL;
    }
  }
  /* the end: every acknowledged context ever */
  kvdb_options o = opts();
  kvdb *db;
  ASSERT_OK(kvdb_open(dir, &o, &db));
  long checked = 0;
  for (uint64_t s = 1; s < next_seed && s < cap; s++)
    if (acked[s]) {
      if (!check_ctx(db, s, 1))
        return T_EXIT_FAIL;
      checked++;
    }
  ASSERT_OK(kvdb_verify(db, NULL, NULL, NULL, NULL));
  kvdb_close(db);
  printf("test_crash %s: %d rounds, %ld crashes (%ld during a compaction, %ld during a "
         "re-encode), %ld acknowledged puts, %ld live contexts checked at the end: all intact\n",
         powerloss ? "powerloss" : "kill", iters, crashes, crashes_compact, crashes_recompress,
         acks_total, checked);
  free(acked);
  t_rmdir(dir);
  return 0;
}
