/* SPDX-License-Identifier: MIT */
/*
 * tests/crash/test_crash_rebalance.c — a power loss at every sync point of a rebalance loses
 * nothing: afterwards every context is readable (bit-exact when stored exactly, within its
 * config's error when quantized), except those the plan itself deletes (pushed off the last
 * tier), which may be gone; kvdb_verify finds no problem; and a new rebalance runs.
 *
 * A database is built once with placement on (12 contexts, some read more often) and roomy
 * tiers; each round copies it, and a child opens the copy with smaller tiers, plans a
 * rebalance, reports the contexts the plan deletes over a pipe, and executes it through
 * tests/io_test.c in power-loss mode: at its Nth segment sync the unsynced writes are dropped,
 * kept or garbled and the child dies there. Round 0 runs without a crash and counts the syncs
 * (one per relocation); then every sync point with each loss mode.
 */
#include "kvdb_test.h"

#include <errno.h>
#include <math.h>
#include <sys/wait.h>

#include "io_test.h"

static const kvdb_model M = {.id = "crash-rebalance", .n_layers = 2, .n_kv_heads = 2,
                             .head_dim = 64, .dtype = KVDB_F16, .block_tokens = 16};
#define N_CTX 12
#define N_TOK 150

static kvdb_options opts(uint64_t ssd, uint64_t smart)
{
  kvdb_options o;
  kvdb_options_init(&o);
  o.placement = KVDB_PLACEMENT_EVICPRESS;
  o.dram_bytes = 256 << 10;
  o.ssd_bytes = ssd;
  o.smartssd_bytes = smart;
  o.segment_bytes = 1 << 20;
  o.log_level = -1;
  return o;
}

static void tokens(int i, uint32_t *tok)
{
  uint64_t s = (uint64_t)i * 7919 + 17;
  for (size_t t = 0; t < N_TOK; t++)
    tok[t] = (uint32_t)(t_rand(&s) % 30000);
}

static kvdb_key key_of(int i)
{
  uint32_t tok[N_TOK];
  tokens(i, tok);
  kvdb_key h[(N_TOK + 15) / 16];
  kvdb_chain_hashes(&M, tok, N_TOK, h, (N_TOK + 15) / 16);
  return h[(N_TOK + 15) / 16 - 1];
}

static double h2f(uint16_t h)
{
  int e = (h >> 10) & 31, m = h & 1023;
  double v = e == 0 ? ldexp(m, -24) : ldexp(1024 + m, e - 25);
  return (h & 0x8000) ? -v : v;
}

static void build(const char *dir)
{
  kvdb_options o = opts(4 << 20, 4 << 20);
  kvdb *db;
  ASSERT_OK(kvdb_open(dir, &o, &db));
  uint16_t *buf = malloc(N_TOK * kvdb_model_token_bytes(&M));
  for (int i = 0; i < N_CTX; i++) {
    uint32_t tok[N_TOK];
    tokens(i, tok);
    t_fill_kv(&M, tok, N_TOK, buf);
    kvdb_kv_view v;
    ASSERT_OK(kvdb_kv_view_packed(&v, buf, &M, N_TOK, KVDB_LAYOUT_LKTHD));
    ASSERT_OK(kvdb_put(db, &M, tok, N_TOK, &v, NULL));
    for (int g = 0; g < i % 4; g++) { /* unequal frequencies */
      size_t hit;
      ASSERT_OK(kvdb_get(db, &M, tok, N_TOK, &v, &hit));
    }
  }
  free(buf);
  kvdb_close(db);
}

/* The child: plan with small tiers, report the deletions, execute. Returns the syncs made. */
static long child(const char *dir, int wfd)
{
  kvdb_options o = opts(600 << 10, 500 << 10);
  kvdb *db;
  if (kvdb_open(dir, &o, &db) != KVDB_OK)
    _exit(3);
  kvdb_place_plan plan;
  if (kvdb_rebalance_plan(db, &plan) != KVDB_OK || plan.n_moves == 0)
    _exit(5);
  for (size_t m = 0; m < plan.n_moves; m++)
    if (plan.moves[m].to_tier == KVDB_TIER_NONE)
      for (int i = 0; i < N_CTX; i++) {
        kvdb_key k = key_of(i);
        uint64_t msg = (uint64_t)i;
        if (memcmp(k.b, plan.moves[m].context.b, 16) == 0 && write(wfd, &msg, 8) != 8)
          _exit(4);
      }
  kvdb_rebalance_report rep;
  if (kvdb_rebalance_execute(db, &plan, &rep) != KVDB_OK || rep.relocated == 0)
    _exit(6);
  kvdb_place_plan_free(&plan);
  kvdb_close(db);
  return iot_count(IOT_SYNC);
}

/* After the crash: everything readable but what the plan deletes. */
static int check(const char *dir, const int *may_go, const char *what)
{
  kvdb_options o = opts(600 << 10, 500 << 10);
  kvdb *db;
  if (kvdb_open(dir, &o, &db) != KVDB_OK) {
    fprintf(stderr, "%s: reopen: %s\n", what, kvdb_errmsg());
    return 0;
  }
  int ok = 1;
  uint16_t *buf = malloc(N_TOK * kvdb_model_token_bytes(&M));
  uint16_t *orig = malloc(N_TOK * kvdb_model_token_bytes(&M));
  size_t ne = N_TOK * kvdb_model_token_bytes(&M) / 2;
  for (int i = 0; i < N_CTX && ok; i++) {
    kvdb_key k = key_of(i);
    kvdb_context_info ci;
    kvdb_status st = kvdb_context_stat(db, &k, &ci);
    if (st == KVDB_NOTFOUND && may_go[i])
      continue;
    if (st != KVDB_OK) {
      fprintf(stderr, "%s: context %d lost (%s)\n", what, i, kvdb_status_name(st));
      ok = 0;
      break;
    }
    uint32_t tok[N_TOK];
    tokens(i, tok);
    t_fill_kv(&M, tok, N_TOK, orig);
    kvdb_kv_view v;
    kvdb_kv_view_packed(&v, buf, &M, N_TOK, KVDB_LAYOUT_LKTHD);
    size_t hit = 0;
    if (kvdb_get(db, &M, tok, N_TOK, &v, &hit) != KVDB_OK || hit != N_TOK) {
      fprintf(stderr, "%s: context %d reads %zu of %d tokens\n", what, i, hit, N_TOK);
      ok = 0;
      break;
    }
    if (ci.config.method == KVDB_METHOD_RAW || ci.config.method == KVDB_METHOD_LOSSLESS) {
      ok = t_check_kv(&M, tok, N_TOK, N_TOK, buf) == N_TOK;
    } else { /* quantized: the relative L2 error of its bits (a generous bound) */
      double d = 0, r = 0;
      for (size_t e = 0; e < ne; e++) {
        double x = h2f(buf[e]), y = h2f(orig[e]);
        d += (x - y) * (x - y);
        r += y * y;
      }
      double bound = ci.config.bits >= 8 ? 0.05 : ci.config.bits >= 4 ? 0.5 : 1.5;
      ok = sqrt(d / r) <= bound;
    }
    if (!ok)
      fprintf(stderr, "%s: context %d (config method %u bits %u) reads wrong KV\n", what, i,
              ci.config.method, ci.config.bits);
  }
  if (ok && kvdb_verify(db, NULL, NULL, NULL, NULL) != KVDB_OK) {
    fprintf(stderr, "%s: verify: %s\n", what, kvdb_errmsg());
    ok = 0;
  }
  kvdb_place_plan plan;
  if (ok && kvdb_rebalance_plan(db, &plan) != KVDB_OK) {
    fprintf(stderr, "%s: a new plan: %s\n", what, kvdb_errmsg());
    ok = 0;
  } else if (ok) {
    kvdb_place_plan_free(&plan);
  }
  free(buf);
  free(orig);
  kvdb_close(db);
  return ok;
}

int main(void)
{
  static const char *loss_name[3] = {"drop", "keep", "garble"};
  char *base = t_tmpdir("crash-reb-base");
  build(base);
  long syncs = -1, points = 0, ran_out = 0;
  for (long at = 0; syncs < 0 || at <= syncs; at++) {
    for (int loss = 0; loss < 3; loss++) {
      if (at == 0 && loss > 0)
        continue; /* round 0 counts the syncs: no crash */
      char *dir = t_tmpdir("crash-reb");
      char cmd[9000];
      snprintf(cmd, sizeof cmd, "cp -a '%s'/. '%s'/", base, dir);
      ASSERT(system(cmd) == 0);
      int p[2];
      ASSERT(pipe(p) == 0);
      iot_config c = {.fail_kind = -1, .powerloss = 1, .crash_at_sync = at, .loss = loss,
                      .seed = (unsigned long long)(at * 3 + loss)};
      iot_install(&c);
      pid_t pid = fork();
      if (pid == 0) {
        close(p[0]);
        long n = child(dir, p[1]);
        uint64_t msg = (uint64_t)n | (1ull << 63);
        if (write(p[1], &msg, 8) != 8)
          _exit(4);
        _exit(0);
      }
      iot_uninstall();
      close(p[1]);
      int may_go[N_CTX] = {0};
      uint64_t msg;
      long n_syncs = -1;
      while (read(p[0], &msg, 8) == 8) {
        if (msg & (1ull << 63))
          n_syncs = (long)(msg & ~(1ull << 63));
        else if (msg < N_CTX)
          may_go[msg] = 1;
      }
      close(p[0]);
      int status;
      waitpid(pid, &status, 0);
      if (at == 0) {
        if (!(WIFEXITED(status) && WEXITSTATUS(status) == 0 && n_syncs > 0)) {
          fprintf(stderr, "the rebalance without a crash failed (status %d)\n", status);
          return T_EXIT_FAIL;
        }
        syncs = n_syncs;
      } else if (WIFEXITED(status) && WEXITSTATUS(status) == 0 && n_syncs >= 0 && n_syncs < at) {
        /* This round's plan made fewer syncs than round 0's and ran to its end before sync
         * point `at` (a plan depends on the tier figures, and the DRAM tier's is measured at
         * every open): no crash to test here, but the finished rebalance is checked below. */
        ran_out++;
      } else if (!(WIFEXITED(status) && WEXITSTATUS(status) == IOT_CRASH_EXIT)) {
        fprintf(stderr, "sync point %ld (%s): the child did not crash (status %d)\n", at,
                loss_name[loss], status);
        return T_EXIT_FAIL;
      }
      char what[96];
      snprintf(what, sizeof what, "power loss at sync point %ld (%s)", at, loss_name[loss]);
      if (!check(dir, may_go, what))
        return T_EXIT_FAIL;
      t_rmdir(dir);
      points += at > 0 && !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    }
  }
  t_rmdir(base);
  printf("test_crash_rebalance: the rebalance makes %ld segment syncs; a power loss at each, "
         "dropping, keeping or garbling the unsynced writes: %ld crash points, nothing lost "
         "(%ld rounds whose plan ended before their sync point)\n",
         syncs, points, ran_out);
  if (points == 0) {
    fprintf(stderr, "no round crashed: nothing was tested\n");
    return T_EXIT_FAIL;
  }
  return T_EXIT_PASS;
}
