/* SPDX-License-Identifier: MIT */
/*
 * bench/bench_remote.c — kvdb-bench remote: the remote tier (kvdb_options.remote_addr) on a
 * redis-server this run starts on a free loopback port (Debian's redis-server; redis-benchmark
 * from redis-tools for the baseline) and kills at the end. Issue 20's targets:
 *
 *   remote_get_vs_redis_benchmark  blocks per second that kvdb_get delivers from the remote
 *       tier alone (host B: an empty local store; contexts of 16 blocks, so 16 values per
 *       pipelined round trip; every value verified, decoded into the caller's buffer) divided by
 *       redis-benchmark's GET requests per second at the same value size and pipeline depth
 *       (-P 16, one client, as kvdb_get is one thread), measured in the same run: five
 *       rounds of one each, alternating; the median of the rounds' ratios.            >= 0.8
 *   chain_lookup_round_trips  round trips of one kvdb_lookup of a 64-block chain (host B).  1
 *   wrong_kv_under_faults  gets whose delivered KV differs from what was put, over a run that
 *       injects faults_injected >= 10,000 faults into the values a get is about to read: a
 *       flipped byte of the object or of the envelope, a truncated value, garbage, another
 *       block's value (COPY: a collision or stale write), another namespace's value, a deleted
 *       key (an eviction), and CLIENT KILL of the tier's connections and SIGKILL + restart of
 *       the server (kills).                                                              0
 *   put_p99_redis_down_ratio  kvdb_put p99 on host A with write-through to Redis, the server
 *       killed, divided by the same with it up (same contexts' shape, new tokens).   <= 1.1
 *
 * Model: 2 layers x 4 KV heads x 128 dims, f16, 16-token blocks (64 KiB of K/V per block; a
 * value is the 68 KiB block object plus its 144-byte envelope). sync_mode NONE, buffered I/O.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <hiredis/hiredis.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench.h"
#include "kvdb.h"

#define R_BT 16u
#define R_CTX_BLOCKS 16u
#define R_NT (R_BT * R_CTX_BLOCKS)

static const kvdb_model RM = {"remote-bench", 2, 4, 128, KVDB_F16, R_BT};

typedef struct rsrv {
  pid_t pid;
  int port;
  char dir[4096];
} rsrv;

static int free_port(void)
{
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = 0};
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  int port = -1;
  if (fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0 &&
      getsockname(fd, (struct sockaddr *)&a, &len) == 0)
    port = ntohs(a.sin_port);
  if (fd >= 0)
    close(fd);
  return port;
}

static void sleep_ms(unsigned ms)
{
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

static redisContext *rconnect(int port)
{
  struct timeval tv = {5, 0};
  redisContext *c = redisConnectWithTimeout("127.0.0.1", port, tv);
  if (c != NULL && c->err) {
    redisFree(c);
    c = NULL;
  }
  return c;
}

static int srv_start(rsrv *s)
{
  char ports[16];
  snprintf(ports, sizeof ports, "%d", s->port);
  char logf[4200];
  snprintf(logf, sizeof logf, "%s/redis.log", s->dir);
  fflush(NULL);
  pid_t pid = fork();
  if (pid < 0)
    return -1;
  if (pid == 0) {
    execlp("redis-server", "redis-server", "--port", ports, "--bind", "127.0.0.1", "--dir",
           s->dir, "--save", "", "--appendonly", "no", "--logfile", logf, (char *)NULL);
    _exit(127);
  }
  s->pid = pid;
  for (int i = 0; i < 500; i++) {
    redisContext *c = rconnect(s->port);
    if (c != NULL) {
      redisReply *r = redisCommand(c, "PING");
      int ok = r != NULL && r->type == REDIS_REPLY_STATUS;
      if (r)
        freeReplyObject(r);
      redisFree(c);
      if (ok)
        return 0;
    }
    sleep_ms(10);
  }
  bench_log("remote: redis-server did not start (log %s)", logf);
  return -1;
}

static void srv_stop(rsrv *s)
{
  if (s->pid > 0) {
    kill(s->pid, SIGKILL);
    waitpid(s->pid, NULL, 0);
    s->pid = 0;
  }
}

static uint64_t mix(uint64_t x)
{
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

static void ctx_tokens(uint64_t id, uint32_t *tok, size_t n)
{
  for (size_t k = 0; k < n; k++)
    tok[k] = (uint32_t)(mix(id * 1000003ull + k) % 32000u);
}

/* KV of tokens (packed LKTHD f16): a function of the token and its predecessor. */
static void fill_kv(const uint32_t *tok, size_t n, uint16_t *buf)
{
  size_t row = (size_t)RM.n_kv_heads * RM.head_dim, i = 0;
  for (uint32_t l = 0; l < RM.n_layers; l++)
    for (uint32_t kv = 0; kv < 2; kv++)
      for (size_t t = 0; t < n; t++) {
        uint64_t s = mix(tok[t] * 31ull + (t ? tok[t - 1] : 7) * 131ull + l * 2 + kv + t * 977);
        for (size_t d = 0; d < row; d++)
          buf[i++] = (uint16_t)(mix(s + d) & 0x7bff);
      }
}

/* A host of the remote benches: no syncs, no DRAM tier, copies of remote hits off (every get of
 * host B reads Redis; a copy would make it local), keys under hash-tag scheme `tag`. */
static kvdb *open_host(const char *dir, int port, const char *ns, uint32_t timeout_ms,
                       uint32_t tag, kvdb_status *st)
{
  char addr[32];
  snprintf(addr, sizeof addr, "127.0.0.1:%d", port);
  kvdb_options o;
  kvdb_options_init(&o);
  o.sync_mode = KVDB_SYNC_NONE;
  o.use_direct_io = 0;
  o.dram_bytes = 0;
  o.log_level = -1;
  o.remote_addr = addr;
  o.remote_namespace = ns;
  o.remote_timeout_ms = timeout_ms;
  o.remote_copy_hits = 0;
  o.remote_hash_tag = tag;
  /* KVDB_BENCH_REMOTE_POLL_US: remote_poll_us other than the default, a diagnostic */
  const char *poll = getenv("KVDB_BENCH_REMOTE_POLL_US");
  if (poll != NULL)
    o.remote_poll_us = (uint32_t)atoi(poll);
  kvdb *db = NULL;
  *st = kvdb_open(dir, &o, &db);
  if (*st != KVDB_OK)
    bench_log("remote: open %s: %s", dir, kvdb_errmsg());
  return db;
}

static void drain(kvdb *db)
{
  for (int i = 0; i < 6000; i++) {
    kvdb_remote_stats rs;
    if (kvdb_remote_stat(db, &rs) != KVDB_OK || rs.queue_len == 0)
      return;
    sleep_ms(5);
  }
}

static int put_ctx(kvdb *db, uint64_t id, uint16_t *kv, uint64_t *ns)
{
  uint32_t tok[R_NT];
  ctx_tokens(id, tok, R_NT);
  fill_kv(tok, R_NT, kv);
  kvdb_kv_view v;
  kvdb_kv_view_packed(&v, kv, &RM, R_NT, KVDB_LAYOUT_LKTHD);
  uint64_t t0 = bench_now_ns();
  kvdb_status rc = kvdb_put(db, &RM, tok, R_NT, &v, NULL);
  if (ns != NULL)
    *ns = bench_now_ns() - t0;
  if (rc != KVDB_OK)
    bench_log("remote: put: %s: %s", kvdb_status_name(rc), kvdb_errmsg());
  return rc == KVDB_OK ? 0 : -1;
}

/* kvdb_get of context id into out; *hit tokens; *wrong 1 when a delivered byte is not the
 * context's KV (expect holds it). */
static int get_ctx(kvdb *db, uint64_t id, uint16_t *out, uint16_t *expect, size_t *hit,
                   int *wrong)
{
  uint32_t tok[R_NT];
  ctx_tokens(id, tok, R_NT);
  kvdb_kv_view v;
  kvdb_kv_view_packed(&v, out, &RM, R_NT, KVDB_LAYOUT_LKTHD);
  kvdb_status rc = kvdb_get(db, &RM, tok, R_NT, &v, hit);
  if (rc != KVDB_OK) {
    bench_log("remote: get: %s: %s", kvdb_status_name(rc), kvdb_errmsg());
    return -1;
  }
  if (expect != NULL) {
    fill_kv(tok, R_NT, expect);
    size_t row = (size_t)RM.n_kv_heads * RM.head_dim * 2;
    *wrong = 0;
    for (uint32_t lk = 0; lk < RM.n_layers * 2; lk++)
      if (memcmp((uint8_t *)out + lk * R_NT * row, (uint8_t *)expect + lk * R_NT * row,
                 *hit * row) != 0)
        *wrong = 1;
  }
  return 0;
}

/* redis-benchmark's GET requests per second at value size `bytes`, pipeline `depth`, one
 * client; 0 when it cannot run. */
static double redis_benchmark_get(int port, size_t bytes, unsigned depth, unsigned n)
{
  char cmd[512];
  snprintf(cmd, sizeof cmd,
           "redis-benchmark -h 127.0.0.1 -p %d -t set,get -n %u -d %zu -P %u -c 1 --csv "
           "2>/dev/null",
           port, n, bytes, depth);
  FILE *p = popen(cmd, "r");
  if (p == NULL)
    return 0;
  char line[512];
  double rps = 0;
  while (fgets(line, sizeof line, p) != NULL)
    if (strncmp(line, "\"GET\",\"", 7) == 0)
      rps = strtod(line + 7, NULL);
  pclose(p);
  return rps;
}

/* CPU time (user + system, µs) process pid has used so far (/proc/PID/stat: every thread;
 * clock ticks); -1 when it cannot be read. */
static double proc_cpu_us(pid_t pid)
{
  char path[64], buf[1024];
  snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
  FILE *f = fopen(path, "r");
  if (f == NULL)
    return -1;
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = 0;
  const char *p = strrchr(buf, ')'); /* the name may hold spaces */
  unsigned long long ut = 0, st = 0;
  if (p == NULL || sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &ut,
                          &st) != 2)
    return -1;
  return (double)(ut + st) * 1e6 / (double)sysconf(_SC_CLK_TCK);
}

/* The Redis key of block i of context id under ns (rtier.c's form). */
static void block_key(const char *ns, uint64_t id, unsigned i, const char *mh_hex, char *key,
                      size_t cap)
{
  uint32_t tok[R_NT];
  ctx_tokens(id, tok, R_NT);
  kvdb_key h[R_CTX_BLOCKS];
  kvdb_chain_hashes(&RM, tok, R_NT, h, R_CTX_BLOCKS);
  char hx[33];
  snprintf(key, cap, "kvdb:%s:%s:%s", ns, mh_hex, kvdb_key_hex(&h[i], hx));
}

/* The model fingerprint's hex, found from the server's keys (it is not public). */
static int find_mh(redisContext *c, const char *ns, char mh[33])
{
  redisReply *r = redisCommand(c, "KEYS kvdb:%s:*", ns);
  int ok = r != NULL && r->type == REDIS_REPLY_ARRAY && r->elements > 0;
  if (ok) {
    const char *k = r->element[0]->str + 5 + strlen(ns) + 1;
    memcpy(mh, k, 32);
    mh[32] = 0;
  }
  if (r)
    freeReplyObject(r);
  return ok ? 0 : -1;
}

/* The values of every block of contexts [0, n_ctx) under ns, kept in memory (snap_get), and
 * written back (snap_put: after a server restart). */
static void snap_get(redisContext *rc, const char *ns, const char *mh, unsigned n_ctx, char **val,
                     size_t *len)
{
  char key[256];
  for (unsigned i = 0; i < n_ctx; i++)
    for (unsigned k = 0; k < R_CTX_BLOCKS; k++) {
      block_key(ns, i, k, mh, key, sizeof key);
      redisReply *v = redisCommand(rc, "GET %s", key);
      if (v && v->type == REDIS_REPLY_STRING) {
        val[i * R_CTX_BLOCKS + k] = malloc(v->len);
        memcpy(val[i * R_CTX_BLOCKS + k], v->str, v->len);
        len[i * R_CTX_BLOCKS + k] = v->len;
      }
      if (v)
        freeReplyObject(v);
    }
}

static void snap_put(redisContext *rc, const char *ns, const char *mh, unsigned n_ctx,
                     char **val, const size_t *len)
{
  char key[256];
  for (unsigned q = 0; q < n_ctx * R_CTX_BLOCKS; q++)
    if (val[q] != NULL) {
      block_key(ns, q / R_CTX_BLOCKS, q % R_CTX_BLOCKS, mh, key, sizeof key);
      freeReplyObject(redisCommand(rc, "SET %s %b", key, val[q], len[q]));
    }
}

/* What kvdb-bench remote and remote-get both start from: a redis-server on a free loopback port,
 * host A that put n_ctx contexts (write-through, drained) and host B that reads them from the
 * remote tier, a plain connection `rc`, the model fingerprint `mh` the values are keyed under
 * and the size of one value. With `other`, the same contexts also put by tenant "other". */
typedef struct rbench {
  rsrv s;
  kvdb *a, *b;
  redisContext *rc;
  uint16_t *kv, *out, *expect;
  char mh[33];
  size_t vbytes;
} rbench;

static void rbench_close(rbench *r)
{
  if (r->rc != NULL)
    redisFree(r->rc);
  kvdb_close(r->a);
  kvdb_close(r->b);
  srv_stop(&r->s);
  free(r->kv);
  free(r->out);
  free(r->expect);
}

/* 0, or 1 with what failed logged (rbench_close still owed) */
static int rbench_open(const bench_env *env, const char *what, unsigned n_ctx, int other,
                       rbench *r)
{
  char path[4200];
  kvdb_status st;
  snprintf(r->s.dir, sizeof r->s.dir, "%s/redis", env->dir);
  if (mkdir(r->s.dir, 0755) != 0 || (r->s.port = free_port()) < 0 || srv_start(&r->s) != 0) {
    bench_log("%s: needs redis-server (Debian: redis-server) on PATH", what);
    return 1;
  }
  size_t ctx_bytes = (size_t)R_NT * kvdb_model_token_bytes(&RM);
  r->kv = malloc(ctx_bytes);
  r->out = malloc(ctx_bytes);
  r->expect = malloc(ctx_bytes);
  snprintf(path, sizeof path, "%s/host-a", env->dir);
  r->a = open_host(path, r->s.port, "bench", 500, KVDB_REMOTE_TAG_NONE, &st);
  snprintf(path, sizeof path, "%s/host-b", env->dir);
  r->b = open_host(path, r->s.port, "bench", 500, KVDB_REMOTE_TAG_NONE, &st);
  if (r->kv == NULL || r->out == NULL || r->expect == NULL || r->a == NULL || r->b == NULL)
    return 1;
  /* host A puts (write-through), host B reads from the remote tier only */
  for (unsigned i = 0; i < n_ctx; i++)
    if (put_ctx(r->a, i, r->kv, NULL) != 0)
      return 1;
  drain(r->a);
  if (other) { /* the same contexts put by another tenant (values for the fault of that kind) */
    snprintf(path, sizeof path, "%s/host-other", env->dir);
    kvdb *o = open_host(path, r->s.port, "other", 500, KVDB_REMOTE_TAG_NONE, &st);
    for (unsigned i = 0; o != NULL && i < n_ctx; i++)
      put_ctx(o, i, r->kv, NULL);
    kvdb_close(o); /* sends what is queued */
  }
  r->rc = rconnect(r->s.port);
  if (r->rc == NULL || find_mh(r->rc, "bench", r->mh) != 0) {
    bench_log("%s: no value reached the server", what);
    return 1;
  }
  char key[256];
  block_key("bench", 0, 0, r->mh, key, sizeof key);
  redisReply *v = redisCommand(r->rc, "STRLEN %s", key);
  r->vbytes = v && v->type == REDIS_REPLY_INTEGER ? (size_t)v->integer : 0;
  if (v)
    freeReplyObject(v);
  return 0;
}

int bench_remote(const bench_env *env, bench_json *j)
{
  const unsigned n_ctx = env->quick ? 16 : 32;
  const unsigned fault_target = 10000;
  int ret = 1;
  bench_samples up = {0}, down = {0};
  rbench r = {0};
  /* s and rc change below (the server restarted by the fault of kind 7): given back at out */
  rsrv s = r.s;
  redisContext *rc = NULL;
  int opened = 0;
  if (rbench_open(env, "remote", n_ctx, 1, &r) != 0)
    goto out;
  s = r.s;
  rc = r.rc;
  r.rc = NULL;
  opened = 1;
  kvdb *a = r.a, *b = r.b;
  uint16_t *kv = r.kv, *out = r.out, *expect = r.expect;
  char *mh = r.mh, key[256];
  size_t vbytes = r.vbytes;

  /* 1. remote get throughput vs redis-benchmark GET (same value size, pipeline 16, 1 client) */
  size_t hit;
  int wrong = 0;
  get_ctx(b, 0, out, NULL, &hit, &wrong); /* connects, asks what the server is */
  /* the two alternate, 5 rounds (--quick: 3) of one each; each round's ratio pairs two
   * measurements a few seconds apart, and the median round counts: on a shared machine one
   * measured at a busier moment than the other would decide a single ratio */
  unsigned reps = env->quick ? 1 : 3;
  double kv_bps = 0, rb_rps = 0, rr[5];
  int n_round = env->quick ? 3 : 5;
  uint64_t t0;
  for (int round = 0; round < n_round; round++) {
    uint64_t blocks = 0;
    t0 = bench_now_ns();
    for (unsigned rep = 0; rep < reps; rep++)
      for (unsigned i = 0; i < n_ctx; i++) {
        if (get_ctx(b, i, out, NULL, &hit, &wrong) != 0)
          goto out;
        blocks += hit / R_BT;
      }
    uint64_t get_ns = bench_now_ns() - t0;
    double bps = get_ns ? (double)blocks * 1e9 / (double)get_ns : 0;
    double rps = redis_benchmark_get(s.port, vbytes, R_CTX_BLOCKS, env->quick ? 8000 : 20000);
    bench_log("remote: round %d: kvdb_get %.0f blocks/s, redis-benchmark GET %.0f/s", round, bps,
              rps);
    kv_bps = bps > kv_bps ? bps : kv_bps;
    rb_rps = rps > rb_rps ? rps : rb_rps;
    rr[round] = bench_ratio(bps, rps);
  }
  for (int x = 1; x < n_round; x++) /* sort the round ratios */
    for (int y = x; y > 0 && rr[y] < rr[y - 1]; y--) {
      double tmp = rr[y];
      rr[y] = rr[y - 1];
      rr[y - 1] = tmp;
    }
  double ratio = rr[n_round / 2], best_ratio = bench_ratio(kv_bps, rb_rps);
  fprintf(env->out, "remote get: best %.0f blocks/s (%.2f GB/s of values, %u-block contexts); "
          "redis-benchmark GET -d %zu -P %u -c 1: best %.0f/s; ratio: median of %d paired "
          "rounds %.3f (target >= 0.8: %s), best vs best %.3f\n",
          kv_bps, kv_bps * (double)vbytes / 1e9, R_CTX_BLOCKS, vbytes, R_CTX_BLOCKS, rb_rps,
          n_round, ratio, bench_met(ratio >= 0.8), best_ratio);

  /* 2. round trips of a 64-block chain lookup */
  uint32_t tok64[64 * R_BT];
  uint16_t *kv64 = malloc(64 * R_BT * kvdb_model_token_bytes(&RM));
  ctx_tokens(999999, tok64, 64 * R_BT);
  fill_kv(tok64, 64 * R_BT, kv64);
  kvdb_kv_view v64;
  kvdb_kv_view_packed(&v64, kv64, &RM, 64 * R_BT, KVDB_LAYOUT_LKTHD);
  kvdb_put(a, &RM, tok64, 64 * R_BT, &v64, NULL);
  free(kv64);
  drain(a);
  kvdb_remote_stats r0, r1;
  kvdb_remote_stat(b, &r0);
  kvdb_lookup(b, &RM, tok64, 64 * R_BT, &hit);
  kvdb_remote_stat(b, &r1);
  uint64_t chain_rt = r1.round_trips - r0.round_trips;
  fprintf(env->out, "64-block chain lookup on Redis: %zu tokens hit, %" PRIu64
          " round trip(s) (target 1: %s)\n", hit, chain_rt, bench_met(chain_rt == 1 && hit == 64 * R_BT));

  /* 3. faults: each aimed at a value the next get reads; every get checked */
  char **orig = calloc((size_t)n_ctx * R_CTX_BLOCKS, sizeof *orig);
  size_t *olen = calloc((size_t)n_ctx * R_CTX_BLOCKS, sizeof *olen);
  char **oth = calloc((size_t)n_ctx * R_CTX_BLOCKS, sizeof *oth);
  size_t *othlen = calloc((size_t)n_ctx * R_CTX_BLOCKS, sizeof *othlen);
  snap_get(rc, "bench", mh, n_ctx, orig, olen);
  snap_get(rc, "other", mh, n_ctx, oth, othlen);
  uint64_t faults = 0, wrong_kv = 0, gets = 0, kills = 0, partial = 0, seed = env->seed + 17;
  uint64_t kind_n[8] = {0};
  static const char *const kinds[8] = {"object-byte", "envelope-byte", "truncated", "garbage",
                                       "other-block", "other-namespace", "deleted", "kill"};
  t0 = bench_now_ns();
  while (faults < fault_target) {
    unsigned c = (unsigned)(mix(seed++) % n_ctx);
    unsigned nf = 1 + (unsigned)(mix(seed++) % 4);
    unsigned touched[4];
    for (unsigned f = 0; f < nf; f++) {
      unsigned k = (unsigned)(mix(seed++) % R_CTX_BLOCKS), idx = c * R_CTX_BLOCKS + k;
      touched[f] = idx;
      unsigned kind = (unsigned)(mix(seed++) % 7);
      if (faults % 2000 == 1999)
        kind = 7;
      block_key("bench", c, k, mh, key, sizeof key);
      char *bad = NULL;
      size_t bl = olen[idx];
      if (orig[idx] == NULL)
        continue;
      switch (kind) {
      case 0:
      case 1:
        bad = malloc(bl);
        memcpy(bad, orig[idx], bl);
        bad[kind == 0 ? 144 + mix(seed) % (bl - 144) : mix(seed) % 144] ^=
            (char)(1u << (mix(seed + 1) % 8));
        seed += 2;
        freeReplyObject(redisCommand(rc, "SET %s %b", key, bad, bl));
        break;
      case 2:
        freeReplyObject(redisCommand(rc, "SET %s %b", key, orig[idx], mix(seed++) % bl));
        break;
      case 3:
        freeReplyObject(redisCommand(rc, "SET %s %s", key, "garbage"));
        break;
      case 4: {
        unsigned o = (unsigned)(mix(seed++) % ((size_t)n_ctx * R_CTX_BLOCKS));
        if (o == idx || orig[o] == NULL)
          o = (idx + 1) % ((unsigned)n_ctx * R_CTX_BLOCKS);
        if (orig[o] != NULL)
          freeReplyObject(redisCommand(rc, "SET %s %b", key, orig[o], olen[o]));
        break;
      }
      case 5: { /* the same block as another tenant stored it, under this tenant's key */
        char key2[256];
        block_key("other", c, k, mh, key2, sizeof key2);
        freeReplyObject(redisCommand(rc, "COPY %s %s REPLACE", key2, key));
        break;
      }
      case 6:
        freeReplyObject(redisCommand(rc, "DEL %s", key));
        break;
      case 7: /* kills: the tier's connections, or the server itself (every other time) */
        kills++;
        if (kills % 2 == 1) {
          freeReplyObject(redisCommand(rc, "CLIENT KILL TYPE normal SKIPME yes"));
        } else {
          redisFree(rc);
          rc = NULL;
          srv_stop(&s);
          if (srv_start(&s) != 0 || (rc = rconnect(s.port)) == NULL)
            goto out;
          snap_put(rc, "bench", mh, n_ctx, orig, olen); /* repopulate both tenants */
          snap_put(rc, "other", mh, n_ctx, oth, othlen);
        }
        break;
      }
      free(bad);
      kind_n[kind]++;
      faults++;
    }
    if (get_ctx(b, c, out, expect, &hit, &wrong) != 0)
      goto out;
    gets++;
    wrong_kv += (uint64_t)wrong;
    partial += hit < R_NT;
    for (unsigned f = 0; f < nf; f++) { /* restore */
      unsigned idx = touched[f];
      if (orig[idx] == NULL)
        continue;
      block_key("bench", idx / R_CTX_BLOCKS, idx % R_CTX_BLOCKS, mh, key, sizeof key);
      freeReplyObject(redisCommand(rc, "SET %s %b", key, orig[idx], olen[idx]));
    }
  }
  uint64_t fault_ns = bench_now_ns() - t0;
  kvdb_remote_stats rb;
  kvdb_remote_stat(b, &rb);
  fprintf(env->out, "faults: %" PRIu64 " injected (", faults);
  for (int k = 0; k < 8; k++)
    fprintf(env->out, "%s%s %" PRIu64, k ? ", " : "", kinds[k], kind_n[k]);
  fprintf(env->out, ") over %" PRIu64 " gets in %.1f s: %" PRIu64 " gets short, %" PRIu64
          " wrong KV (target 0: %s); %" PRIu64 " values rejected, %" PRIu64 " errors, %" PRIu64
          " reconnects\n", gets, (double)fault_ns / 1e9, partial, wrong_kv,
          bench_met(wrong_kv == 0), rb.rejected, rb.errors, rb.reconnects);
  for (unsigned q = 0; q < n_ctx * R_CTX_BLOCKS; q++) {
    free(orig[q]);
    free(oth[q]);
  }
  free(orig);
  free(olen);
  free(oth);
  free(othlen);

  /* 4. put p99 on host A: Redis up, then down */
  unsigned n_put = env->quick ? 100 : 400;
  uint64_t id = 1000000;
  for (unsigned i = 0; i < n_put; i++) {
    uint64_t ns;
    if (put_ctx(a, id++, kv, &ns) != 0)
      goto out;
    bench_samples_push(&up, ns);
  }
  drain(a);
  redisFree(rc);
  rc = NULL;
  srv_stop(&s);
  for (unsigned i = 0; i < n_put; i++) {
    uint64_t ns;
    if (put_ctx(a, id++, kv, &ns) != 0)
      goto out;
    bench_samples_push(&down, ns);
  }
  drain(a);
  double p99_up = (double)bench_samples_pct(&up, 99), p99_down = (double)bench_samples_pct(&down, 99);
  double put_ratio = bench_ratio(p99_down, p99_up);
  kvdb_remote_stats ra;
  kvdb_remote_stat(a, &ra);
  fprintf(env->out, "put p99 (%u puts of %u blocks each): Redis up %.0f us, down %.0f us: "
          "ratio %.3f (target <= 1.1: %s); p50 up %.0f us, down %.0f us; write-through: %"
          PRIu64 " written, %" PRIu64 " not sent\n", n_put, R_CTX_BLOCKS, p99_up / 1e3,
          p99_down / 1e3, put_ratio, bench_met(put_ratio <= 1.1),
          (double)bench_samples_pct(&up, 50) / 1e3, (double)bench_samples_pct(&down, 50) / 1e3,
          ra.written, ra.dropped);

  bench_json_num(j, "remote_get_vs_redis_benchmark", ratio);
  bench_json_int(j, "chain_lookup_round_trips", (int64_t)chain_rt);
  bench_json_int(j, "wrong_kv_under_faults", (int64_t)wrong_kv);
  bench_json_int(j, "faults_injected", (int64_t)faults);
  bench_json_num(j, "put_p99_redis_down_ratio", put_ratio);
  bench_json_num(j, "remote_get_vs_redis_benchmark_best", best_ratio);
  bench_json_num(j, "remote_get_blocks_per_s", kv_bps);
  bench_json_num(j, "redis_benchmark_get_per_s", rb_rps);
  bench_json_int(j, "value_bytes", (int64_t)vbytes);
  bench_json_num(j, "put_p99_up_us", p99_up / 1e3);
  bench_json_num(j, "put_p99_down_us", p99_down / 1e3);
  ret = 0;
out:
  bench_samples_free(&up);
  bench_samples_free(&down);
  if (opened) /* this function's s is the live server (stopped or restarted by then) */
    r.s = s;
  if (rc != NULL)
    redisFree(rc);
  rbench_close(&r);
  return ret;
}

/* ---- kvdb-bench remote-get: the get phase of kvdb-bench remote alone -------------------
 *
 * The same server, model, contexts and hosts as kvdb-bench remote's part 1, but only host B's
 * kvdb_get loop (every value verified, decoded into the caller's buffer) for a while (3 s,
 * --quick 1 s; KVDB_BENCH_REMOTE_GET_S sets it), then one redis-benchmark GET run at the same
 * value size and pipeline depth: so that `perf record` of this process sees the get path, not
 * the puts and faults of the full bench. Figures: blocks/s, µs per block, and the ratio of the
 * one pair (kvdb-bench remote's median of paired rounds is the target's figure); each client's
 * CPU time per value, and the server's (/proc/PID/stat) per value of the get loop and per GET
 * of a second redis-benchmark run of GETs alone. */
int bench_remote_get(const bench_env *env, bench_json *j)
{
  const unsigned n_ctx = env->quick ? 16 : 32;
  int ret = 1;
  rbench r = {0};
  if (rbench_open(env, "remote-get", n_ctx, 0, &r) != 0)
    goto out;
  rsrv s = r.s;
  kvdb *b = r.b;
  uint16_t *out = r.out, *expect = r.expect;
  size_t vbytes = r.vbytes;
  size_t hit;
  int wrong = 0;
  uint64_t wrong_n = 0;
  for (unsigned i = 0; i < n_ctx; i++) { /* every context whole and right, once */
    if (get_ctx(b, i, out, expect, &hit, &wrong) != 0)
      goto out;
    wrong_n += (uint64_t)wrong + (hit != R_NT);
  }
  const char *dur = getenv("KVDB_BENCH_REMOTE_GET_S");
  double secs = dur != NULL && atof(dur) > 0 ? atof(dur) : env->quick ? 1.0 : 3.0;
  struct rusage u0, u1, c0, c1;
  getrusage(RUSAGE_THREAD, &u0);
  double srv0 = proc_cpu_us(s.pid);
  uint64_t blocks = 0, t0 = bench_now_ns(), ns = 0;
  /* KVDB_BENCH_REMOTE_GET_CTX=N: the loop gets only the first N contexts (N = 1: 16 values,
   * hot in the server's cache, as redis-benchmark's one key is), a diagnostic */
  const char *lc = getenv("KVDB_BENCH_REMOTE_GET_CTX");
  unsigned loop_ctx = lc != NULL && atoi(lc) > 0 && (unsigned)atoi(lc) < n_ctx
                          ? (unsigned)atoi(lc) : n_ctx;
  while (ns < (uint64_t)(secs * 1e9)) {
    for (unsigned i = 0; i < loop_ctx; i++) {
      if (get_ctx(b, i, out, NULL, &hit, &wrong) != 0)
        goto out;
      blocks += hit / R_BT;
    }
    ns = bench_now_ns() - t0;
  }
  getrusage(RUSAGE_THREAD, &u1);
  double srv1 = proc_cpu_us(s.pid);
  double bps = bench_ratio((double)blocks * 1e9, (double)ns);
  unsigned n_rb = env->quick ? 8000 : 20000;
  getrusage(RUSAGE_CHILDREN, &c0);
  double rps = redis_benchmark_get(s.port, vbytes, R_CTX_BLOCKS, n_rb);
  getrusage(RUSAGE_CHILDREN, &c1);
  double ratio = bench_ratio(bps, rps);
  /* the server's CPU per value: for kvdb_get's loop, and for a redis-benchmark run of GETs
   * alone (the key its run above SET) */
  struct rusage g0, g1;
  getrusage(RUSAGE_CHILDREN, &g0);
  double srv2 = proc_cpu_us(s.pid);
  char cmd[512];
  snprintf(cmd, sizeof cmd, "redis-benchmark -h 127.0.0.1 -p %d -t get -n %u -d %zu -P %u -c 1 "
           "--csv >/dev/null 2>&1", s.port, n_rb, vbytes, R_CTX_BLOCKS);
  uint64_t tg = bench_now_ns();
  int sysrc = system(cmd);
  tg = bench_now_ns() - tg;
  double srv3 = proc_cpu_us(s.pid);
  getrusage(RUSAGE_CHILDREN, &g1);
  /* CPU time per value of each client (this thread; redis-benchmark, a waited-for child: its
   * SET phase too, same values): a figure the other sessions' load hardly moves */
#define RU_US(a, b) (((double)(b).ru_utime.tv_sec - (double)(a).ru_utime.tv_sec) * 1e6 + \
                     ((double)(b).ru_utime.tv_usec - (double)(a).ru_utime.tv_usec) +     \
                     ((double)(b).ru_stime.tv_sec - (double)(a).ru_stime.tv_sec) * 1e6 + \
                     ((double)(b).ru_stime.tv_usec - (double)(a).ru_stime.tv_usec))
  double kv_cpu = blocks ? RU_US(u0, u1) / (double)blocks : 0;
  double rb_cpu = RU_US(c0, c1) / (2.0 * n_rb);
  double rb_get_cpu = sysrc == 0 ? RU_US(g0, g1) / n_rb : 0;
#undef RU_US
  double srv_kv = blocks && srv0 >= 0 && srv1 >= 0 ? (srv1 - srv0) / (double)blocks : 0;
  double srv_rb = sysrc == 0 && srv2 >= 0 && srv3 >= 0 ? (srv3 - srv2) / n_rb : 0;
  long csw = (u1.ru_nvcsw - u0.ru_nvcsw) + (u1.ru_nivcsw - u0.ru_nivcsw);
  fprintf(env->out, "server CPU per value: kvdb_get's loop %.1f us, redis-benchmark GET alone "
          "%.1f us (that run: %.1f us wall, client CPU %.1f us per request); kvdb_get thread: "
          "%.2f context switches per value\n", srv_kv, srv_rb,
          sysrc == 0 ? (double)tg / 1e3 / n_rb : 0, rb_get_cpu,
          blocks ? (double)csw / (double)blocks : 0);
  fprintf(env->out, "remote get alone: %.0f blocks/s (%.1f us per %zu-byte value) over %.1f s; "
          "redis-benchmark GET -d %zu -P %u -c 1: %.0f/s (%.1f us); ratio %.3f; %" PRIu64
          " wrong or short contexts\nclient CPU per value: kvdb_get %.1f us, redis-benchmark %.1f us "
          "(SET and GET)\n", bps, bps > 0 ? 1e6 / bps : 0, vbytes, (double)ns / 1e9,
          vbytes, R_CTX_BLOCKS, rps, rps > 0 ? 1e6 / rps : 0, ratio, wrong_n, kv_cpu, rb_cpu);
  bench_json_num(j, "remote_get_alone_blocks_per_s", bps);
  bench_json_num(j, "redis_benchmark_get_per_s", rps);
  bench_json_num(j, "remote_get_alone_vs_redis_benchmark", ratio);
  bench_json_int(j, "value_bytes", (int64_t)vbytes);
  bench_json_int(j, "wrong_contexts", (int64_t)wrong_n);
  bench_json_num(j, "remote_get_cpu_us_per_value", kv_cpu);
  bench_json_num(j, "redis_benchmark_cpu_us_per_request", rb_cpu);
  bench_json_num(j, "server_cpu_us_per_value_kvdb", srv_kv);
  bench_json_num(j, "server_cpu_us_per_get_redis_benchmark", srv_rb);
  ret = wrong_n == 0 ? 0 : 1;
out:
  rbench_close(&r);
  return ret;
}

/* ---- kvdb-bench remote-tags: Redis Cluster hash tags, measured (issue 20 item 2) ----------
 *
 * A local three-master Redis Cluster (redis-server --cluster-enabled, redis-cli --cluster
 * create). Host A puts contexts of 64 blocks with remote_hash_tag NONE (keys spread over the
 * slots) and ROOT (a chain's keys share a tag: its first block's hash), each under its own
 * namespace; host B (an empty store, copies off) then, alternating the two in rounds:
 *   - looks each context up (64 GETRANGEs in one pipelined batch): latency p50/p99 per lookup
 *     and round trips per lookup (kvdb_remote_stats.round_trips);
 *   - gets each context whole from Redis, one client thread and three at once: blocks/s;
 *   - how the keys fall on the masters (keys of each namespace per master; the largest share).
 * A third set, "shared": ROOT again, every context starting with one common block (a system
 * prompt): every key then carries that block's tag, so all of them are on one master.
 */
#include <pthread.h>

#define T_BLOCKS 64u
#define T_NT (R_BT * T_BLOCKS)

#define T_MODES 3

/* Context i of mode m's tokens (mode 2: the first block common to all). */
static void tag_tokens(int m, uint64_t i, uint32_t *tok)
{
  ctx_tokens(5000 + i, tok, T_NT);
  if (m == 2)
    ctx_tokens(4999, tok, R_BT);
}

typedef struct tag_get {
  kvdb *db;
  int mode;
  unsigned first, n_ctx, step, rounds;
  uint64_t base;
  uint64_t blocks, wrong, short_;
  uint16_t *out;
} tag_get;

static int cmp_dbl(const void *x, const void *y)
{
  double a = *(const double *)x, b = *(const double *)y;
  return (a > b) - (a < b);
}

static double median_of(double *v, unsigned n)
{
  qsort(v, n, sizeof *v, cmp_dbl);
  return n ? v[n / 2] : 0;
}

static void *tag_get_run(void *arg)
{
  tag_get *g = arg;
  uint32_t *tok = malloc(T_NT * sizeof *tok);
  for (unsigned r = 0; tok != NULL && r < g->rounds; r++)
    for (unsigned i = g->first; i < g->n_ctx; i += g->step) {
      tag_tokens(g->mode, i, tok);
      kvdb_kv_view v;
      kvdb_kv_view_packed(&v, g->out, &RM, T_NT, KVDB_LAYOUT_LKTHD);
      size_t hit = 0;
      if (kvdb_get(g->db, &RM, tok, T_NT, &v, &hit) != KVDB_OK || hit != T_NT)
        g->short_++;
      g->blocks += (hit + R_BT - 1) / R_BT;
    }
  free(tok);
  return NULL;
}

/* Blocks per second of `threads` clients getting every context `rounds` times. */
static double tag_get_bps(kvdb *db, int mode, unsigned n_ctx, unsigned threads,
                          unsigned rounds, size_t ctx_bytes, uint64_t *shortc)
{
  tag_get g[3];
  pthread_t th[3];
  uint64_t t0 = bench_now_ns();
  for (unsigned k = 0; k < threads; k++) {
    g[k] = (tag_get){.db = db, .mode = mode, .first = k, .n_ctx = n_ctx, .step = threads,
                     .rounds = rounds, .out = malloc(ctx_bytes)};
    pthread_create(&th[k], NULL, tag_get_run, &g[k]);
  }
  uint64_t blocks = 0;
  for (unsigned k = 0; k < threads; k++) {
    pthread_join(th[k], NULL);
    blocks += g[k].blocks;
    *shortc += g[k].short_;
    free(g[k].out);
  }
  double s = (double)(bench_now_ns() - t0) / 1e9;
  return s > 0 ? (double)blocks / s : 0;
}

static int cluster_ok(int port)
{
  redisContext *c = rconnect(port);
  redisReply *r = c ? redisCommand(c, "CLUSTER INFO") : NULL;
  int ok = r != NULL && r->type == REDIS_REPLY_STRING && strstr(r->str, "cluster_state:ok");
  if (r)
    freeReplyObject(r);
  if (c)
    redisFree(c);
  return ok;
}

static int64_t node_keys(int port, const char *ns)
{
  redisContext *c = rconnect(port);
  redisReply *r = c ? redisCommand(c, "KEYS kvdb:%s:*", ns) : NULL;
  int64_t n = r != NULL && r->type == REDIS_REPLY_ARRAY ? (int64_t)r->elements : -1;
  if (r)
    freeReplyObject(r);
  if (c)
    redisFree(c);
  return n;
}

int bench_remote_tags(const bench_env *env, bench_json *j)
{
  const unsigned n_ctx = env->quick ? 6 : 15, rounds = env->quick ? 2 : 5;
  rsrv s[3];
  memset(s, 0, sizeof s);
  int ret = 1;
  kvdb *a[T_MODES] = {NULL}, *b[T_MODES] = {NULL};
  kvdb_status st;
  uint16_t *kv = NULL;
  bench_samples lat[T_MODES] = {{0}};
  for (int k = 0; k < 3; k++) {
    snprintf(s[k].dir, sizeof s[k].dir, "%s/node%d", env->dir, k);
    s[k].port = -1;
    for (int i = 0; i < 1000 && (s[k].port < 0 || s[k].port > 55535); i++)
      s[k].port = free_port(); /* a Cluster node also listens on port + 10000 */
    if (mkdir(s[k].dir, 0755) != 0 || s[k].port < 0 || s[k].port > 55535)
      goto out;
    char ports[16], logf[4200];
    snprintf(ports, sizeof ports, "%d", s[k].port);
    snprintf(logf, sizeof logf, "%s/redis.log", s[k].dir);
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0)
      goto out;
    if (pid == 0) {
      execlp("redis-server", "redis-server", "--port", ports, "--bind", "127.0.0.1", "--dir",
             s[k].dir, "--save", "", "--appendonly", "no", "--logfile", logf,
             "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf", (char *)NULL);
      _exit(127);
    }
    s[k].pid = pid;
  }
  for (int k = 0; k < 3; k++) {
    int up = 0;
    for (int i = 0; i < 500 && !up; i++) {
      redisContext *c = rconnect(s[k].port);
      up = c != NULL;
      if (c)
        redisFree(c);
      else
        sleep_ms(10);
    }
    if (!up) {
      bench_log("remote-tags: needs redis-server (Debian: redis-server)");
      goto out;
    }
  }
  char cmd[8400];
  snprintf(cmd, sizeof cmd,
           "redis-cli --cluster create 127.0.0.1:%d 127.0.0.1:%d 127.0.0.1:%d "
           "--cluster-replicas 0 --cluster-yes > '%s/create.log' 2>&1",
           s[0].port, s[1].port, s[2].port, env->dir);
  if (system(cmd) != 0) {
    bench_log("remote-tags: redis-cli --cluster create failed (Debian: redis-tools), see %s",
              env->dir);
    goto out;
  }
  for (int k = 0; k < 3; k++)
    for (int i = 0; i < 500 && !cluster_ok(s[k].port); i++)
      sleep_ms(20);
  static const char *const nsn[T_MODES] = {"spread", "tagged", "shared"};
  size_t ctx_bytes = (size_t)T_NT * kvdb_model_token_bytes(&RM);
  kv = malloc(ctx_bytes);
  uint32_t *tok = malloc(T_NT * sizeof *tok);
  if (kv == NULL || tok == NULL) {
    free(tok);
    goto out;
  }
  char path[4300];
  for (int m = 0; m < T_MODES; m++) {
    uint32_t tag = m == 0 ? KVDB_REMOTE_TAG_NONE : KVDB_REMOTE_TAG_ROOT;
    snprintf(path, sizeof path, "%s/host-a-%s", env->dir, nsn[m]);
    a[m] = open_host(path, s[0].port, nsn[m], 2000, tag, &st);
    snprintf(path, sizeof path, "%s/host-b-%s", env->dir, nsn[m]);
    b[m] = open_host(path, s[0].port, nsn[m], 2000, tag, &st);
    if (a[m] == NULL || b[m] == NULL) {
      free(tok);
      goto out;
    }
    for (unsigned i = 0; i < n_ctx; i++) {
      tag_tokens(m, i, tok);
      fill_kv(tok, T_NT, kv);
      kvdb_kv_view v;
      kvdb_kv_view_packed(&v, kv, &RM, T_NT, KVDB_LAYOUT_LKTHD);
      if (kvdb_put(a[m], &RM, tok, T_NT, &v, NULL) != KVDB_OK) {
        bench_log("remote-tags: put: %s", kvdb_errmsg());
        free(tok);
        goto out;
      }
    }
    drain(a[m]);
  }
  /* where the keys are */
  double share[T_MODES];
  int64_t per[T_MODES][3];
  for (int m = 0; m < T_MODES; m++) {
    int64_t tot = 0, mx = 0;
    for (int k = 0; k < 3; k++) {
      per[m][k] = node_keys(s[k].port, nsn[m]);
      tot += per[m][k];
      mx = per[m][k] > mx ? per[m][k] : mx;
    }
    share[m] = tot > 0 ? (double)mx / (double)tot : 0;
  }
  /* lookups, alternating */
  double rt_per[T_MODES] = {0};
  uint64_t hit_short = 0;
  for (int m = 0; m < T_MODES; m++) { /* warm: connections and the slot map */
    size_t hit;
    tag_tokens(m, 0, tok);
    kvdb_lookup(b[m], &RM, tok, T_NT, &hit);
  }
  for (unsigned r = 0; r < rounds; r++)
    for (int m = 0; m < T_MODES; m++) {
      kvdb_remote_stats r0, r1;
      kvdb_remote_stat(b[m], &r0);
      for (unsigned i = 0; i < n_ctx; i++) {
        tag_tokens(m, i, tok);
        size_t hit = 0;
        uint64_t t0 = bench_now_ns();
        kvdb_lookup(b[m], &RM, tok, T_NT, &hit);
        bench_samples_push(&lat[m], bench_now_ns() - t0);
        hit_short += hit != T_NT;
      }
      kvdb_remote_stat(b[m], &r1);
      rt_per[m] += (double)(r1.round_trips - r0.round_trips) / (double)(n_ctx * rounds);
    }
  free(tok);
  /* gets: one client, then three; alternating, the median round of each */
  double g1[T_MODES][5], g3[T_MODES][5];
  for (unsigned r = 0; r < rounds; r++)
    for (int m = 0; m < T_MODES; m++) {
      g1[m][r] = tag_get_bps(b[m], m, n_ctx, 1, 1, ctx_bytes, &hit_short);
      g3[m][r] = tag_get_bps(b[m], m, n_ctx, 3, 1, ctx_bytes, &hit_short);
    }
  double med1[T_MODES], med3[T_MODES];
  for (int m = 0; m < T_MODES; m++) {
    med1[m] = median_of(g1[m], rounds);
    med3[m] = median_of(g3[m], rounds);
  }
  double p50[T_MODES], p99[T_MODES];
  for (int m = 0; m < T_MODES; m++) {
    p50[m] = (double)bench_samples_pct(&lat[m], 50) / 1e3;
    p99[m] = (double)bench_samples_pct(&lat[m], 99) / 1e3;
    fprintf(env->out,
            "%-7s keys per master %" PRId64 "/%" PRId64 "/%" PRId64 " (largest share %.2f); "
            "64-block lookup p50 %.0f us p99 %.0f us, %.2f round trips; get 1 client %.0f "
            "blocks/s, 3 clients %.0f blocks/s\n",
            nsn[m], per[m][0], per[m][1], per[m][2], share[m], p50[m], p99[m], rt_per[m],
            med1[m], med3[m]);
  }
  fprintf(env->out, "tagged / spread: lookup p50 %.3f, get 1 client %.3f, 3 clients %.3f; "
          "shared / spread: get 3 clients %.3f; %" PRIu64 " short hits (expected 0)\n",
          bench_ratio(p50[1], p50[0]), bench_ratio(med1[1], med1[0]),
          bench_ratio(med3[1], med3[0]), bench_ratio(med3[2], med3[0]), hit_short);
  bench_json_int(j, "contexts", n_ctx);
  bench_json_int(j, "blocks_per_context", T_BLOCKS);
  bench_json_num(j, "lookup_p50_us_spread", p50[0]);
  bench_json_num(j, "lookup_p50_us_tagged", p50[1]);
  bench_json_num(j, "lookup_p99_us_spread", p99[0]);
  bench_json_num(j, "lookup_p99_us_tagged", p99[1]);
  bench_json_num(j, "lookup_round_trips_spread", rt_per[0]);
  bench_json_num(j, "lookup_round_trips_tagged", rt_per[1]);
  bench_json_num(j, "get_blocks_per_s_spread", med1[0]);
  bench_json_num(j, "get_blocks_per_s_tagged", med1[1]);
  bench_json_num(j, "get3_blocks_per_s_spread", med3[0]);
  bench_json_num(j, "get3_blocks_per_s_tagged", med3[1]);
  bench_json_num(j, "largest_master_share_spread", share[0]);
  bench_json_num(j, "largest_master_share_tagged", share[1]);
  bench_json_num(j, "largest_master_share_shared_first_block", share[2]);
  bench_json_num(j, "get3_blocks_per_s_shared_first_block", med3[2]);
  bench_json_num(j, "lookup_p50_us_shared_first_block", p50[2]);
  bench_json_int(j, "short_hits", (int64_t)hit_short);
  ret = hit_short == 0 ? 0 : 1;
out:
  for (int m = 0; m < T_MODES; m++) {
    kvdb_close(a[m]);
    kvdb_close(b[m]);
    bench_samples_free(&lat[m]);
  }
  for (int k = 0; k < 3; k++)
    srv_stop(&s[k]);
  free(kv);
  return ret;
}
