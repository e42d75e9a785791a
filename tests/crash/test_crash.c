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
 * The child also compacts and re-encodes (kvdb_compact, kvdb_recompress to lossless) every
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

static kvdb_options opts(void)
{
  kvdb_options o;
  kvdb_options_init(&o);
  o.dram_bytes = 1 << 20;
  o.segment_bytes = 2 << 20; /* seal often: recovery then meets sealed and open segments */
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

int main(int argc, char **argv)
{
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
