/* SPDX-License-Identifier: MIT */
/*
 * tests/remote/test_remote.c — the remote tier (kvdb_options.remote_addr) against real
 * redis-server processes this test starts and kills. Modes (meson tests remote-*):
 *   tier     write-through, a second handle's lookup (one round trip for a 64-block chain) and
 *            get (identical KV), a local prefix continued remotely, and every damaged value a
 *            miss and a counter: a corrupt object byte, corrupt tokens, another block's value
 *            under a key (collision/stale), a truncated value, garbage
 *   hosts    two processes with separate databases share one Redis: B hits what A put
 *   tenants  namespaces: the same tokens in another tenant never hit, not even a value
 *            copied under the other tenant's key
 *   down     no server: puts and gets go on, errors counted; the server comes up: reconnects
 *   pause    CLIENT PAUSE and DEBUG SLEEP (2 s each): calls come back (timeouts), then hits again
 *   evict    maxmemory with allkeys-lru eviction (misses, never wrong KV) and noeviction (OOM
 *            replies: errors and unsent blocks, puts go on)
 *   reset    CLIENT KILL of the tier's connections mid-run: a miss, then reconnects
 *   cluster  a local three-master Redis Cluster: blocks over the slots, a chain in one round
 *            trip, a resharding (redis-cli --cluster reshard) during gets and a master killed:
 *            every hit exact, MOVED/ASK followed
 *   writeback  remote_write = KVDB_REMOTE_WRITE_EVICT: puts write nothing; a rebalance that
 *            deletes contexts first writes their blocks; a second host gets them exactly; a
 *            kvdb_delete writes nothing; unknown remote_write bits are refused
 *   place    the remote tier in the placement's model: a rebalance with an SSD tier that holds
 *            two of five contexts plans the others to KVDB_TIER_REMOTE (figures measured against
 *            the live server), writes them and deletes them here; another host gets exactly
 *            those from Redis. With recomputing near free the same plan drops them (nothing
 *            written); without a remote tier it drops them too
 *   copy     remote_copy_hits (default on): host B's get from Redis is copied to B's store
 *            (the objects as verified); Redis stopped, B's next get is still whole and exact
 *            (a local hit), also after a reopen; with the option off the same get is a miss;
 *            a read-only handle copies nothing; the option's bad value is refused
 *   tags     remote_hash_tag ROOT: every key of two contexts sharing their first blocks carries
 *            one tag (their first block's hash), another host with the tag gets both exactly,
 *            one without it misses (the keys differ); a bad value is refused
 *   protocol the batch reply reader (engine/remote/resp.c) against a scripted fake server (no
 *            redis-server): values small, nil, empty and 200 KB (read straight into a 64-byte
 *            aligned buffer) exact; a reply of a type a batch never gets fails that command and
 *            the rest of its node's batch, closes the connection and counts an error; the next
 *            batch reconnects; bytes past the batch's replies, a value cut by a close and a
 *            value stalled past the timeout each fail the connection, counted; all of it
 *            with the socket polled before a blocking read (remote_poll_us) and without; the
 *            value buffers' pool (reuse, a value cut mid-reply gives its buffer back, bounds)
 *   metrics  kvdb_metrics of handles that used the tier, `kvdb-admin metrics DIR`, both
 *            checked by `promtool check metrics`; `kvdb-admin serve --metrics` scraped by a
 *            real prometheus server (its query API returns the scraped value)
 */
#include "redis_test.h"
#include "remote/resp.h"

static const char *const progs[] = {"redis-server"};

/* Context `seed` of n tokens. */
static uint32_t *ctx_tokens(uint64_t seed, size_t n)
{
  uint32_t *t = malloc(n * sizeof *t);
  ASSERT(t != NULL);
  t_family_tokens(seed, seed, 0, t, n);
  return t;
}

static kvdb *open_db(const char *tag, int port, const char *ns, char **dir)
{
  *dir = t_tmpdir(tag);
  kvdb_options o;
  r_opts(&o, port, ns);
  kvdb *db;
  ASSERT_OK(kvdb_open(*dir, &o, &db));
  return db;
}

static size_t lookup(kvdb *db, const uint32_t *tok, size_t n)
{
  size_t hit = 0;
  ASSERT_OK(kvdb_lookup(db, &r_model, tok, n, &hit));
  return hit;
}

/* ---- tier ---- */

/* kvdb_get_notify's callback: ctx is {end of the told ranges, calls} */
static void tell_block(void *ctx, size_t t0, size_t n_tokens)
{
  size_t *told = ctx;
  if (t0 + n_tokens > told[0])
    told[0] = t0 + n_tokens;
  told[1]++;
}

static void mode_tier(void)
{
  r_server s = {0};
  r_start(&s, 0, NULL);
  const size_t n = 64 * 16; /* 64 blocks */
  uint32_t *tok = ctx_tokens(1, n);
  char *da, *db_dir, *dc;
  kvdb *a = open_db("rt-a", s.port, "t1", &da);
  t_put_kv(a, &r_model, tok, n, NULL);
  r_drain(a);
  kvdb_remote_stats ra = r_stat(a);
  ASSERT_EQ(ra.written, 64);
  ASSERT_EQ(ra.dropped, 0);

  kvdb *b = open_db("rt-b", s.port, "t1", &db_dir);
  uint32_t *other = ctx_tokens(99, 64);
  ASSERT_EQ(lookup(b, other, 64), 0); /* the first call also asks what the server is */
  uint64_t rt0 = r_stat(b).round_trips;
  ASSERT_EQ(lookup(b, tok, n), n);
  ASSERT_EQ(r_stat(b).round_trips - rt0, 1); /* 64 blocks: one pipelined round trip */
  ASSERT_EQ(t_get_check(b, &r_model, tok, n), n);
  kvdb_stats st;
  ASSERT_OK(kvdb_stat(b, &st));
  ASSERT_EQ(st.n_contexts, 0); /* remote hits are not stored locally */
  /* a prefix stored locally, the rest remote */
  kvdb *c = open_db("rt-c", s.port, "t1", &dc);
  t_put_kv(c, &r_model, tok, 20 * 16 + 5, NULL);
  r_drain(c);
  rt0 = r_stat(c).round_trips;
  ASSERT_EQ(t_get_check(c, &r_model, tok, n), n);
  ASSERT_EQ(r_stat(c).round_trips - rt0, 1);
  ASSERT_EQ(r_stat(c).hits, 44); /* blocks 20..63 */
  { /* a get that tells each block as it lands (the GPU hop's) is the local hit only: remote
     * blocks would land untold (kvdb.h, kvdb_get_notify) */
    uint16_t *buf = malloc(n * kvdb_model_token_bytes(&r_model));
    ASSERT(buf != NULL);
    kvdb_kv_view v;
    ASSERT_OK(kvdb_kv_view_packed(&v, buf, &r_model, n, KVDB_LAYOUT_LKTHD));
    size_t told[2] = {0, 0}, hit = 0; /* [0]: the end of the told ranges, [1]: calls */
    rt0 = r_stat(c).round_trips;
    ASSERT_OK(kvdb_get_notify(c, &r_model, tok, n, &v, &hit, tell_block, told));
    ASSERT_EQ(r_stat(c).round_trips, rt0);
    ASSERT(hit >= 20 * 16 && hit < n);
    ASSERT_EQ(told[0], hit);
    ASSERT(told[1] > 0);
    ASSERT_EQ(t_check_kv(&r_model, tok, hit, n, buf), hit);
    free(buf);
  }

  /* damaged values: each a miss from there on, counted, the KV before it exact */
  redisContext *rc = r_connect(s.port);
  ASSERT(rc != NULL);
  char key[256], key2[256];
  uint64_t rej = r_stat(b).rejected;
  r_block_key("t1", &r_model, tok, n, 30, key, sizeof key);
  redisReply *v = r_cmd(rc, "GET %s", key);
  ASSERT(v->type == REDIS_REPLY_STRING);
  size_t vlen = v->len;
  char *orig = malloc(vlen);
  memcpy(orig, v->str, vlen);
  freeReplyObject(v);
  char *bad = malloc(vlen);
  memcpy(bad, orig, vlen);
  bad[vlen - 100] ^= 0x10; /* a byte of the object's data */
  freeReplyObject(r_cmd(rc, "SET %s %b", key, bad, vlen));
  ASSERT_EQ(lookup(b, tok, n), n); /* a lookup reads envelopes and tokens only */
  ASSERT_EQ(t_get_check(b, &r_model, tok, n), 30 * 16);
  ASSERT_EQ(r_stat(b).rejected, rej + 1);
  memcpy(bad, orig, vlen);
  bad[80 + 4 * 3] ^= 0x01; /* a token of the envelope */
  freeReplyObject(r_cmd(rc, "SET %s %b", key, bad, vlen));
  ASSERT_EQ(lookup(b, tok, n), 30 * 16);
  ASSERT_EQ(t_get_check(b, &r_model, tok, n), 30 * 16);
  ASSERT_EQ(r_stat(b).rejected, rej + 3);
  /* the value of another block (a collision, a stale write) under block 30's key */
  r_block_key("t1", &r_model, tok, n, 31, key2, sizeof key2);
  v = r_cmd(rc, "GET %s", key2);
  freeReplyObject(r_cmd(rc, "SET %s %b", key, v->str, v->len));
  freeReplyObject(v);
  ASSERT_EQ(lookup(b, tok, n), 30 * 16);
  ASSERT_EQ(t_get_check(b, &r_model, tok, n), 30 * 16);
  /* a truncated value, then garbage */
  freeReplyObject(r_cmd(rc, "SET %s %b", key, orig, vlen / 2));
  ASSERT_EQ(lookup(b, tok, n), n); /* envelope and tokens are whole: the get sees it */
  ASSERT_EQ(t_get_check(b, &r_model, tok, n), 30 * 16);
  freeReplyObject(r_cmd(rc, "SET %s %s", key, "not a block"));
  ASSERT_EQ(lookup(b, tok, n), 30 * 16);
  ASSERT_EQ(t_get_check(b, &r_model, tok, n), 30 * 16);
  ASSERT_EQ(r_stat(b).rejected, rej + 8);
  /* the original back: the whole chain again */
  freeReplyObject(r_cmd(rc, "SET %s %b", key, orig, vlen));
  ASSERT_EQ(t_get_check(b, &r_model, tok, n), n);
  /* another model with the same tokens: other keys, a miss */
  kvdb_model m2 = r_model;
  m2.id = "remote-test-2";
  size_t hit = 1;
  ASSERT_OK(kvdb_lookup(b, &m2, tok, n, &hit));
  ASSERT_EQ(hit, 0);
  free(orig);
  free(bad);
  redisFree(rc);
  kvdb_close(a);
  kvdb_close(b);
  kvdb_close(c);
  t_rmdir(da);
  t_rmdir(db_dir);
  t_rmdir(dc);
  free(tok);
  free(other);
  r_cleanup(&s);
}

/* ---- hosts: two processes ---- */

static void mode_hosts(void)
{
  r_server s = {0};
  r_start(&s, 0, NULL);
  const size_t n = 40 * 16 + 7; /* a trailing partial block too */
  uint32_t *tok = ctx_tokens(2, n);
  char *da;
  kvdb *a = open_db("rh-a", s.port, "shared", &da);
  t_put_kv(a, &r_model, tok, n, NULL);
  r_drain(a);
  ASSERT_EQ(r_stat(a).written, 41);
  kvdb_close(a); /* its write-through thread ends: the fork copies one thread (TSan needs it) */
  fflush(NULL);
  pid_t pid = fork();
  ASSERT(pid >= 0);
  if (pid == 0) { /* host B: its own process and database */
    char *dbd;
    kvdb *b = open_db("rh-b", s.port, "shared", &dbd);
    size_t h1 = lookup(b, tok, n);
    size_t h2 = t_get_check(b, &r_model, tok, n);
    kvdb_close(b);
    t_rmdir(dbd);
    _exit(h1 == n && h2 == n ? 0 : 3);
  }
  int st;
  ASSERT(waitpid(pid, &st, 0) == pid);
  ASSERT(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  t_rmdir(da);
  free(tok);
  r_cleanup(&s);
}

/* ---- tenants ---- */

static void mode_tenants(void)
{
  r_server s = {0};
  r_start(&s, 0, NULL);
  const size_t n = 8 * 16;
  uint32_t *tok = ctx_tokens(3, n);
  char *d1, *d2;
  kvdb *t1 = open_db("rn-1", s.port, "tenant-a", &d1);
  kvdb *t2 = open_db("rn-2", s.port, "tenant-b", &d2);
  t_put_kv(t1, &r_model, tok, n, NULL);
  r_drain(t1);
  ASSERT_EQ(lookup(t2, tok, n), 0);
  ASSERT_EQ(t_get_check(t2, &r_model, tok, n), 0);
  ASSERT(r_stat(t2).misses >= 2);
  ASSERT_EQ(r_stat(t2).hits, 0);
  /* tenant A's value copied under tenant B's key (a key-level leak): still a miss */
  redisContext *rc = r_connect(s.port);
  char ka[256], kb[256];
  r_block_key("tenant-a", &r_model, tok, n, 0, ka, sizeof ka);
  r_block_key("tenant-b", &r_model, tok, n, 0, kb, sizeof kb);
  redisReply *v = r_cmd(rc, "GET %s", ka);
  ASSERT(v->type == REDIS_REPLY_STRING);
  freeReplyObject(r_cmd(rc, "SET %s %b", kb, v->str, v->len));
  freeReplyObject(v);
  ASSERT_EQ(lookup(t2, tok, n), 0);
  ASSERT_EQ(t_get_check(t2, &r_model, tok, n), 0);
  ASSERT_EQ(r_stat(t2).rejected, 2);
  /* tenant B's own put: both hit their own */
  t_put_kv(t2, &r_model, tok, n, NULL);
  r_drain(t2);
  char *d3;
  kvdb *t3 = open_db("rn-3", s.port, "tenant-b", &d3);
  ASSERT_EQ(t_get_check(t3, &r_model, tok, n), n);
  /* a bad namespace is refused at open */
  kvdb_options o;
  r_opts(&o, s.port, "a b");
  kvdb *x;
  ASSERT_STATUS(KVDB_INVALID, kvdb_open(d3, &o, &x));
  ASSERT_MSG_HAS("remote_namespace");
  r_opts(&o, s.port, "t");
  o.remote_addr = "no-port";
  ASSERT_STATUS(KVDB_INVALID, kvdb_open(d3, &o, &x));
  ASSERT_MSG_HAS("remote_addr");
  redisFree(rc);
  kvdb_close(t1);
  kvdb_close(t2);
  kvdb_close(t3);
  t_rmdir(d1);
  t_rmdir(d2);
  t_rmdir(d3);
  free(tok);
  r_cleanup(&s);
}

/* ---- faults ---- */

/* Wait (up to 5 s) until a lookup of tok on db hits `want` tokens; returns the last hit. */
static size_t lookup_until(kvdb *db, const uint32_t *tok, size_t n, size_t want)
{
  size_t h = 0;
  for (int i = 0; i < 100; i++) {
    h = lookup(db, tok, n);
    if (h == want)
      break;
    r_sleep_ms(50);
  }
  return h;
}

static void mode_down(void)
{
  int port = r_free_port(); /* nothing listens there yet */
  const size_t n = 8 * 16;
  uint32_t *t1 = ctx_tokens(4, n), *t2 = ctx_tokens(5, n);
  char *da, *db_dir;
  kvdb *a = open_db("rd-a", port, "f", &da);
  kvdb *b = open_db("rd-b", port, "f", &db_dir);
  t_put_kv(a, &r_model, t1, n, NULL); /* local put: fine */
  r_drain(a);
  ASSERT_EQ(t_get_check(a, &r_model, t1, n), n); /* local get: fine */
  ASSERT_EQ(lookup(b, t1, n), 0);
  kvdb_remote_stats ra = r_stat(a), rb = r_stat(b);
  ASSERT(ra.errors + ra.down_skips > 0 && ra.dropped == 8 && ra.written == 0);
  ASSERT(rb.errors + rb.down_skips > 0 && rb.misses >= 1);
  /* the server comes up on that port: after the backoff, write-through and hits resume */
  r_server s = {0};
  r_start(&s, port, NULL);
  r_sleep_ms(200);
  t_put_kv(a, &r_model, t2, n, NULL);
  r_drain(a);
  ASSERT_EQ(lookup_until(b, t2, n, n), n);
  ASSERT_EQ(t_get_check(b, &r_model, t2, n), n);
  ASSERT(r_stat(a).reconnects >= 1 || r_stat(b).reconnects >= 1);
  ASSERT_EQ(r_stat(a).written, 8);
  kvdb_close(a);
  kvdb_close(b);
  t_rmdir(da);
  t_rmdir(db_dir);
  free(t1);
  free(t2);
  r_cleanup(&s);
}

/* Send a command without waiting for its reply (the server is busy with it). */
static void send_nowait(redisContext *c, const char *cmd)
{
  redisAppendCommand(c, cmd);
  int done = 0;
  while (!done)
    ASSERT(redisBufferWrite(c, &done) == REDIS_OK);
}

static void mode_pause(void)
{
  r_server s = {0};
  r_start(&s, 0, NULL);
  const size_t n = 8 * 16;
  uint32_t *t1 = ctx_tokens(6, n), *t2 = ctx_tokens(7, n);
  char *da, *db_dir;
  kvdb *a = open_db("rp-a", s.port, "p", &da);
  kvdb *b = open_db("rp-b", s.port, "p", &db_dir);
  t_put_kv(a, &r_model, t1, n, NULL);
  r_drain(a);
  ASSERT_EQ(lookup(b, t1, n), n);
  const char *faults[2] = {"CLIENT PAUSE 2000 ALL", "DEBUG SLEEP 2"};
  for (int f = 0; f < 2; f++) {
    redisContext *rc = r_connect(s.port);
    uint64_t e0 = r_stat(b).errors;
    if (f == 0)
      freeReplyObject(r_cmd(rc, faults[0], NULL));
    else
      send_nowait(rc, faults[1]);
    r_sleep_ms(100); /* the server has taken it (another connection's command could come first) */
    /* the remote calls time out (300 ms): a miss, counted; local puts go on */
    ASSERT_EQ(lookup(b, t1, n), 0);
    ASSERT(r_stat(b).errors > e0);
    t_put_kv(a, &r_model, t2, n, NULL);
    ASSERT_EQ(t_get_check(a, &r_model, t2, n), n);
    ASSERT_EQ(lookup(b, t1, n), 0); /* backing off: no wait at all */
    r_sleep_ms(2000);
    ASSERT_EQ(lookup_until(b, t1, n, n), n);
    ASSERT_EQ(t_get_check(b, &r_model, t1, n), n);
    redisFree(rc);
  }
  kvdb_close(a);
  kvdb_close(b);
  t_rmdir(da);
  t_rmdir(db_dir);
  free(t1);
  free(t2);
  r_cleanup(&s);
}

static void mode_evict(void)
{
  const char *lru[] = {"--maxmemory", "3mb", "--maxmemory-policy", "allkeys-lru", NULL};
  r_server s = {0};
  r_start(&s, 0, lru);
  enum { N_CTX = 24 };
  const size_t n = 16 * 16; /* 16 blocks of ~20 KiB per context: 24 x 320 KiB > 3 MiB */
  uint32_t *tok[N_CTX];
  char *da, *db_dir;
  kvdb *a = open_db("re-a", s.port, "e", &da);
  kvdb *b = open_db("re-b", s.port, "e", &db_dir);
  for (int i = 0; i < N_CTX; i++) {
    tok[i] = ctx_tokens(100 + (uint64_t)i, n);
    t_put_kv(a, &r_model, tok[i], n, NULL);
    r_drain(a);
  }
  redisContext *rc = r_connect(s.port);
  redisReply *info = r_cmd(rc, "INFO stats", NULL);
  ASSERT(strstr(info->str, "evicted_keys:0\r") == NULL); /* it did evict */
  freeReplyObject(info);
  size_t full = 0, part = 0;
  for (int i = 0; i < N_CTX; i++) {
    size_t h = t_get_check(b, &r_model, tok[i], n); /* whatever hits is exact */
    full += h == n;
    part += h < n;
    ASSERT_EQ(t_get_check(a, &r_model, tok[i], n), n); /* local copies untouched */
  }
  ASSERT(part > 0);
  ASSERT_EQ(r_stat(b).rejected, 0);
  printf("allkeys-lru: %zu contexts whole, %zu short\n", full, part);
  redisFree(rc);
  kvdb_close(b);
  t_rmdir(db_dir);
  r_cleanup(&s);
  /* noeviction: SETs fail with OOM; puts go on, the blocks are counted as not sent */
  const char *noev[] = {"--maxmemory", "2mb", "--maxmemory-policy", "noeviction", NULL};
  r_server s2 = {0};
  r_start(&s2, 0, noev);
  kvdb_close(a);
  t_rmdir(da);
  a = open_db("re-c", s2.port, "e", &da);
  for (int i = 0; i < N_CTX; i++) {
    t_put_kv(a, &r_model, tok[i], n, NULL);
    r_drain(a);
  }
  kvdb_remote_stats ra = r_stat(a);
  ASSERT(ra.dropped > 0 && ra.errors > 0 && ra.written > 0);
  ASSERT_EQ(ra.written + ra.dropped, (uint64_t)N_CTX * 16);
  for (int i = 0; i < N_CTX; i++) {
    ASSERT_EQ(t_get_check(a, &r_model, tok[i], n), n);
    free(tok[i]);
  }
  kvdb_close(a);
  t_rmdir(da);
  r_cleanup(&s2);
}

static void mode_reset(void)
{
  r_server s = {0};
  r_start(&s, 0, NULL);
  const size_t n = 8 * 16;
  uint32_t *t1 = ctx_tokens(8, n);
  char *da, *db_dir;
  kvdb *a = open_db("rr-a", s.port, "r", &da);
  kvdb *b = open_db("rr-b", s.port, "r", &db_dir);
  t_put_kv(a, &r_model, t1, n, NULL);
  r_drain(a);
  ASSERT_EQ(lookup(b, t1, n), n);
  redisContext *rc = r_connect(s.port);
  for (int round = 0; round < 3; round++) {
    uint64_t e0 = r_stat(b).errors, c0 = r_stat(b).reconnects;
    freeReplyObject(r_cmd(rc, "CLIENT KILL TYPE normal SKIPME yes", NULL));
    r_sleep_ms(50);
    /* write-through on the killed connection: the SETs fail (the blocks are not sent) and
     * the process goes on (a write on a reset socket raises SIGPIPE, which the library blocks
     * while it talks to Redis) */
    uint32_t *t2 = ctx_tokens(50 + (uint64_t)round, 16 * 16);
    t_put_kv(a, &r_model, t2, 16 * 16, NULL);
    r_drain(a);
    free(t2);
    ASSERT_EQ(lookup(b, t1, n), 0); /* the connection is gone: a miss, counted */
    ASSERT(r_stat(b).errors > e0);
    ASSERT_EQ(t_get_check(a, &r_model, t1, n), n);
    ASSERT_EQ(lookup_until(b, t1, n, n), n);
    ASSERT(r_stat(b).reconnects > c0);
    ASSERT_EQ(t_get_check(b, &r_model, t1, n), n);
  }
  redisFree(rc);
  kvdb_close(a);
  kvdb_close(b);
  t_rmdir(da);
  t_rmdir(db_dir);
  free(t1);
  r_cleanup(&s);
}

/* ---- metrics ---- */

/* GET http://127.0.0.1:port/path: the response (headers and body, malloc'd) or NULL. */
static char *http_get(int port, const char *path)
{
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
    if (fd >= 0)
      close(fd);
    return NULL;
  }
  char req[512];
  int n = snprintf(req, sizeof req, "GET %s HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n", path);
  if (write(fd, req, (size_t)n) != n) {
    close(fd);
    return NULL;
  }
  size_t cap = 1 << 16, len = 0;
  char *buf = malloc(cap);
  ssize_t k;
  while ((k = read(fd, buf + len, cap - 1 - len)) > 0) {
    len += (size_t)k;
    if (len + 1 == cap)
      buf = realloc(buf, cap *= 2);
  }
  buf[len] = 0;
  close(fd);
  return buf;
}

static pid_t spawn(const char *const *argv, const char *log)
{
  fflush(NULL);
  pid_t pid = fork();
  ASSERT(pid >= 0);
  if (pid == 0) {
    FILE *f = freopen(log, "w", stdout);
    (void)f;
    dup2(1, 2);
    execvp(argv[0], (char *const *)argv);
    _exit(127);
  }
  for (int i = 0; i < R_MAX_SERVERS; i++)
    if (r_pids[i] == 0) {
      r_pids[i] = pid;
      break;
    }
  return pid;
}

static void write_file(const char *path, const char *text, size_t len)
{
  FILE *f = fopen(path, "w");
  ASSERT(f != NULL && fwrite(text, 1, len, f) == len && fclose(f) == 0);
}

static void promtool_check(const char *file)
{
  char cmd[4300];
  snprintf(cmd, sizeof cmd, "promtool check metrics < '%s'", file);
  int rc = system(cmd);
  if (rc != 0) {
    fprintf(stderr, "promtool check metrics failed on %s\n", file);
    abort();
  }
}

static void mode_metrics(const char *admin)
{
  static const char *const more[] = {"promtool", "prometheus"};
  r_require(more, 2);
  r_server s = {0};
  r_start(&s, 0, NULL);
  const size_t n = 8 * 16;
  uint32_t *t1 = ctx_tokens(9, n), *t2 = ctx_tokens(10, n);
  char *da, *db_dir;
  kvdb *a = open_db("rm-a", s.port, "m", &da);
  kvdb *b = open_db("rm-b", s.port, "m", &db_dir);
  t_put_kv(a, &r_model, t1, n, NULL);
  t_put_kv(a, &r_model, t2, n, NULL);
  r_drain(a);
  ASSERT_EQ(lookup(b, t1, n), n);
  ASSERT_EQ(t_get_check(b, &r_model, t2, n), n);
  size_t len;
  char small[16];
  ASSERT_STATUS(KVDB_FULL, kvdb_metrics(b, small, sizeof small, &len));
  ASSERT(len > 1000);
  char *text = malloc(len + 1);
  ASSERT_OK(kvdb_metrics(b, text, len + 1, &len));
  ASSERT(strstr(text, "kvdb_tier_hits_total{tier=\"remote\"} 16\n") != NULL);
  ASSERT(strstr(text, "kvdb_get_seconds_count 1\n") != NULL);
  ASSERT(strstr(text, "kvdb_lookup_seconds_count 1\n") != NULL);
  ASSERT(strstr(text, "kvdb_remote_enabled 1\n") != NULL);
  char file[4200];
  snprintf(file, sizeof file, "%s/handle.prom", s.dir);
  write_file(file, text, len);
  promtool_check(file);
  free(text);
  ASSERT_OK(kvdb_metrics(a, small, 0, &len) == KVDB_FULL ? KVDB_OK : KVDB_PANIC);
  text = malloc(len + 1);
  ASSERT_OK(kvdb_metrics(a, text, len + 1, &len));
  ASSERT(strstr(text, "kvdb_remote_written_total 16\n") != NULL);
  ASSERT(strstr(text, "kvdb_put_seconds_count 2\n") != NULL);
  ASSERT(strstr(text, "kvdb_contexts 2\n") != NULL);
  free(text);
  kvdb_close(a);
  kvdb_close(b);
  /* kvdb-admin metrics DIR */
  char cmd[9000];
  snprintf(cmd, sizeof cmd, "'%s' metrics '%s' > '%s/admin.prom'", admin, da, s.dir);
  ASSERT(system(cmd) == 0);
  snprintf(file, sizeof file, "%s/admin.prom", s.dir);
  promtool_check(file);
  /* kvdb-admin serve --metrics, scraped by a real prometheus server */
  int mport = r_free_port(), pport = r_free_port();
  char maddr[64], paddr[64], log1[4200], log2[4200], cfg[4200], tsdb[4200];
  snprintf(maddr, sizeof maddr, "127.0.0.1:%d", mport);
  snprintf(paddr, sizeof paddr, "127.0.0.1:%d", pport);
  snprintf(log1, sizeof log1, "%s/serve.log", s.dir);
  snprintf(log2, sizeof log2, "%s/prometheus.log", s.dir);
  snprintf(cfg, sizeof cfg, "%s/prometheus.yml", s.dir);
  snprintf(tsdb, sizeof tsdb, "%s/tsdb", s.dir);
  const char *sargv[] = {admin, "serve", da, "--metrics", maddr, NULL};
  pid_t serve = spawn(sargv, log1);
  char *resp = NULL;
  for (int i = 0; i < 200 && resp == NULL; i++) {
    r_sleep_ms(20);
    resp = http_get(mport, "/metrics");
  }
  ASSERT(resp != NULL && strncmp(resp, "HTTP/1.", 7) == 0 && strncmp(resp + 8, " 200", 4) == 0 &&
         strstr(resp, "kvdb_contexts 2\n") != NULL);
  free(resp);
  resp = http_get(mport, "/nothing");
  ASSERT(resp != NULL && strstr(resp, " 404 ") != NULL);
  free(resp);
  char yml[512];
  int yl = snprintf(yml, sizeof yml,
                    "global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: kvdb\n"
                    "    static_configs:\n      - targets: ['%s']\n", maddr);
  write_file(cfg, yml, (size_t)yl);
  char cfgarg[4300], tsdbarg[4300], listen[128];
  snprintf(cfgarg, sizeof cfgarg, "--config.file=%s", cfg);
  snprintf(tsdbarg, sizeof tsdbarg, "--storage.tsdb.path=%s", tsdb);
  snprintf(listen, sizeof listen, "--web.listen-address=%s", paddr);
  const char *pargv[] = {"prometheus", cfgarg, tsdbarg, listen, NULL};
  pid_t prom = spawn(pargv, log2);
  int seen = 0;
  for (int i = 0; i < 300 && !seen; i++) { /* up to 30 s */
    r_sleep_ms(100);
    resp = http_get(pport, "/api/v1/query?query=kvdb_contexts");
    seen = resp != NULL && strstr(resp, "\"job\":\"kvdb\"") != NULL && strstr(resp, ",\"2\"]") != NULL;
    free(resp);
  }
  if (!seen)
    fprintf(stderr, "prometheus never scraped kvdb_contexts 2 (logs in %s)\n", s.dir);
  ASSERT(seen);
  kill(prom, SIGTERM);
  kill(serve, SIGTERM);
  int st;
  ASSERT(waitpid(serve, &st, 0) == serve && WIFEXITED(st) && WEXITSTATUS(st) == 0);
  waitpid(prom, NULL, 0);
  for (int i = 0; i < R_MAX_SERVERS; i++)
    if (r_pids[i] == serve || r_pids[i] == prom)
      r_pids[i] = 0;
  t_rmdir(da);
  t_rmdir(db_dir);
  free(t1);
  free(t2);
  r_cleanup(&s);
}

/* ---- Redis Cluster ---- */

static void cluster_wait_ok(const r_server *s, int n)
{
  for (int k = 0; k < n; k++) {
    int ok = 0;
    for (int i = 0; i < 500 && !ok; i++) {
      redisContext *c = r_connect(s[k].port);
      redisReply *r = c ? redisCommand(c, "CLUSTER INFO") : NULL;
      ok = r != NULL && r->type == REDIS_REPLY_STRING && strstr(r->str, "cluster_state:ok");
      if (r)
        freeReplyObject(r);
      if (c)
        redisFree(c);
      if (!ok)
        r_sleep_ms(20);
    }
    ASSERT(ok);
  }
}

static void node_id(int port, char id[64])
{
  redisContext *c = r_connect(port);
  ASSERT(c != NULL);
  redisReply *r = r_cmd(c, "CLUSTER MYID", NULL);
  snprintf(id, 64, "%s", r->str);
  freeReplyObject(r);
  redisFree(c);
}

/* Every get of every context delivers exact KV (t_get_check); returns the sum of hits. */
static size_t get_all(kvdb *db, uint32_t **tok, int n_ctx, size_t n)
{
  size_t sum = 0;
  for (int i = 0; i < n_ctx; i++)
    sum += t_get_check(db, &r_model, tok[i], n);
  return sum;
}

static void mode_cluster(void)
{
  static const char *const more[] = {"redis-cli"};
  r_require(more, 1);
  r_server s[3];
  memset(s, 0, sizeof s);
  for (int k = 0; k < 3; k++) {
    const char *extra[] = {"--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                           "--cluster-node-timeout", "1500", NULL};
    r_start(&s[k], 0, extra);
  }
  char cmd[8192];
  snprintf(cmd, sizeof cmd,
           "redis-cli --cluster create 127.0.0.1:%d 127.0.0.1:%d 127.0.0.1:%d "
           "--cluster-replicas 0 --cluster-yes > '%s/create.log' 2>&1",
           s[0].port, s[1].port, s[2].port, s[0].dir);
  ASSERT(system(cmd) == 0);
  cluster_wait_ok(s, 3);
  enum { N_CTX = 6 };
  const size_t n = 32 * 16;
  uint32_t *tok[N_CTX];
  char *da, *db_dir;
  kvdb *a = open_db("rc-a", s[0].port, "c", &da);
  kvdb *b = open_db("rc-b", s[1].port, "c", &db_dir);
  for (int i = 0; i < N_CTX; i++) {
    tok[i] = ctx_tokens(200 + (uint64_t)i, n);
    t_put_kv(a, &r_model, tok[i], n, NULL);
  }
  r_drain(a);
  ASSERT_EQ(r_stat(a).written, N_CTX * 32);
  ASSERT_EQ(r_stat(a).dropped, 0);
  ASSERT_EQ(lookup(b, tok[0], n), n);
  kvdb_remote_stats rb = r_stat(b);
  ASSERT(rb.cluster == 1 && rb.nodes == 3);
  uint64_t rt0 = rb.round_trips;
  ASSERT_EQ(lookup(b, tok[1], n), n); /* 32 blocks on three masters: one round trip */
  ASSERT_EQ(r_stat(b).round_trips - rt0, 1);
  ASSERT_EQ(get_all(b, tok, N_CTX, n), N_CTX * n);
  /* resharding mid-run: 3000 slots from the first master to the second while gets go on */
  char id0[64], id1[64];
  node_id(s[0].port, id0);
  node_id(s[1].port, id1);
  snprintf(cmd, sizeof cmd,
           "redis-cli --cluster reshard 127.0.0.1:%d --cluster-from %s --cluster-to %s "
           "--cluster-slots 3000 --cluster-yes > '%s/reshard.log' 2>&1",
           s[0].port, id0, id1, s[0].dir);
  fflush(NULL);
  pid_t pid = fork();
  ASSERT(pid >= 0);
  if (pid == 0)
    _exit(system(cmd) == 0 ? 0 : 1);
  int rounds = 0, st = 0;
  while (waitpid(pid, &st, WNOHANG) == 0) {
    get_all(b, tok, N_CTX, n); /* every hit exact, whatever its length */
    rounds++;
  }
  ASSERT(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  cluster_wait_ok(s, 3);
  size_t sum = 0;
  for (int i = 0; i < 100 && sum != N_CTX * n; i++) /* the slot map follows MOVED */
    sum = get_all(b, tok, N_CTX, n);
  ASSERT_EQ(sum, N_CTX * n);
  ASSERT(r_stat(b).redirects > 0);
  printf("reshard: %d rounds of gets during it, %llu redirects followed\n", rounds,
         (unsigned long long)r_stat(b).redirects);
  /* a master killed: hits stay exact (shorter), local work goes on */
  r_stop(&s[2]);
  for (int i = 0; i < 5; i++) {
    get_all(b, tok, N_CTX, n);
    uint32_t *extra = ctx_tokens(300 + (uint64_t)i, 64);
    t_put_kv(a, &r_model, extra, 64, NULL);
    ASSERT_EQ(t_get_check(a, &r_model, extra, 64), 64);
    free(extra);
  }
  for (int i = 0; i < N_CTX; i++)
    ASSERT_EQ(t_get_check(a, &r_model, tok[i], n), n);
  ASSERT(r_stat(b).errors + r_stat(b).down_skips > 0);
  kvdb_close(a);
  kvdb_close(b);
  t_rmdir(da);
  t_rmdir(db_dir);
  for (int i = 0; i < N_CTX; i++)
    free(tok[i]);
  for (int k = 0; k < 3; k++)
    r_cleanup(&s[k]);
}

/* ---- write-back on eviction ---- */

#define WB_CTX 6
#define WB_TOKENS 64 /* 4 blocks of 16 KiB */

static void mode_writeback(void)
{
  r_server s = {0};
  r_start(&s, 0, NULL);
  char *da = t_tmpdir("rwb-a");
  kvdb_options o;
  r_opts(&o, s.port, "wb");
  kvdb *a;
  o.remote_write = 4; /* no such bit */
  ASSERT_EQ(kvdb_open(da, &o, &a), KVDB_INVALID);
  ASSERT(strstr(kvdb_errmsg(), "remote_write") != NULL);
  o.remote_write = KVDB_REMOTE_WRITE_EVICT;
  o.placement = KVDB_PLACEMENT_EVICPRESS;
  o.placement_alpha = 1e6; /* quality above all: a context that does not fit is deleted, not
                              re-encoded to a lossy config */
  o.dram_bytes = 0;
  o.ssd_bytes = 0;
  ASSERT_OK(kvdb_open(da, &o, &a));
  uint32_t *tok[WB_CTX];
  kvdb_key key[WB_CTX];
  for (int i = 0; i < WB_CTX; i++) {
    kvdb_put_info info;
    tok[i] = ctx_tokens(700 + (uint64_t)i, WB_TOKENS);
    t_put_kv(a, &r_model, tok[i], WB_TOKENS, &info);
    key[i] = info.context;
  }
  kvdb_remote_stats rs = r_stat(a);
  ASSERT_EQ(rs.queued, 0); /* not on put */
  ASSERT_EQ(rs.written, 0);
  /* a caller's delete is not an eviction */
  ASSERT_OK(kvdb_delete(a, &key[WB_CTX - 1]));
  ASSERT_EQ(r_stat(a).written, 0);
  kvdb_context_info ci;
  ASSERT_OK(kvdb_context_stat(a, &key[0], &ci));
  uint64_t one = ci.bytes;
  kvdb_close(a);
  o.ssd_bytes = 2 * one + one / 2; /* room for two of the five */
  ASSERT_OK(kvdb_open(da, &o, &a));
  kvdb_place_plan plan;
  kvdb_rebalance_report rep;
  ASSERT_OK(kvdb_rebalance_plan(a, &plan));
  ASSERT_OK(kvdb_rebalance_execute(a, &plan, &rep));
  kvdb_place_plan_free(&plan);
  int gone[WB_CTX] = {0}, n_gone = 0;
  for (int i = 0; i < WB_CTX - 1; i++) {
    kvdb_status st = kvdb_context_stat(a, &key[i], &ci);
    ASSERT(st == KVDB_OK || st == KVDB_NOTFOUND);
    gone[i] = st == KVDB_NOTFOUND;
    n_gone += gone[i];
  }
  ASSERT(n_gone >= 3);
  rs = r_stat(a);
  ASSERT_EQ(rs.written, 4 * (uint64_t)n_gone); /* every block of every evicted context */
  ASSERT_EQ(rs.dropped, 0);
  kvdb_close(a);
  /* another host, its own empty store: the evicted contexts whole and exact from Redis; the
   * kept ones and the deleted one were never written */
  char *db_dir;
  kvdb *b = open_db("rwb-b", s.port, "wb", &db_dir);
  for (int i = 0; i < WB_CTX; i++) {
    size_t want = i < WB_CTX - 1 && gone[i] ? WB_TOKENS : 0;
    ASSERT_EQ(lookup(b, tok[i], WB_TOKENS), want);
    if (want)
      ASSERT_EQ(t_get_check(b, &r_model, tok[i], WB_TOKENS), want);
  }
  ASSERT_EQ(r_stat(b).rejected, 0);
  kvdb_close(b);
  t_rmdir(db_dir);
  t_rmdir(da);
  for (int i = 0; i < WB_CTX; i++)
    free(tok[i]);
  r_cleanup(&s);
  printf("write-back: %d of %d contexts evicted, their %d blocks written before the delete, "
         "read exactly by another host; puts and a delete wrote nothing\n", n_gone, WB_CTX - 1,
         4 * n_gone);
}

/* ---- place: the remote tier in the placement ---- */

#define PL_CTX 5

/* Host A in dir (created when new) with placement on, quality above all (no lossy
 * re-encodes), write-through on put off; port < 0: no remote tier. */
static kvdb *place_host(const char *dir, int port, const char *ns, uint64_t ssd_bytes,
                        double prefill_tps)
{
  kvdb_options o;
  r_opts(&o, port < 0 ? 1 : port, ns);
  if (port < 0)
    o.remote_addr = NULL;
  o.remote_write = KVDB_REMOTE_WRITE_EVICT;
  o.placement = KVDB_PLACEMENT_EVICPRESS;
  o.placement_alpha = 1e6;
  o.dram_bytes = 0;
  o.ssd_bytes = ssd_bytes;
  o.prefill_tokens_per_s = prefill_tps;
  kvdb *db;
  ASSERT_OK(kvdb_open(dir, &o, &db));
  return db;
}

/* One run: five contexts put, reopened with room for two and prefill_tps, rebalanced. Returns
 * the contexts gone from the local store (gone[i]); *to_remote, *to_none: the plan's moves of each kind;
 * *remote: the plan had the remote tier. */
static int place_run(int port, const char *ns, double prefill_tps, uint32_t **tok, int *gone,
                     int *to_remote, int *to_none, int *remote)
{
  char *da = t_tmpdir("rp-a");
  kvdb *a = place_host(da, port, ns, 0, 10000.0); /* stored whole at first */
  kvdb_key key[PL_CTX];
  for (int i = 0; i < PL_CTX; i++) {
    kvdb_put_info info;
    t_put_kv(a, &r_model, tok[i], WB_TOKENS, &info);
    key[i] = info.context;
  }
  if (port >= 0)
    ASSERT_EQ(r_stat(a).written, 0); /* not on put */
  kvdb_context_info ci;
  ASSERT_OK(kvdb_context_stat(a, &key[0], &ci));
  uint64_t one = ci.bytes;
  kvdb_close(a);
  a = place_host(da, port, ns, 2 * one + one / 2, prefill_tps); /* room for two of five */
  kvdb_place_plan plan;
  kvdb_rebalance_report rep;
  ASSERT_OK(kvdb_rebalance_plan(a, &plan));
  *remote = plan.remote;
  *to_remote = *to_none = 0;
  for (size_t i = 0; i < plan.n_moves; i++) {
    *to_remote += plan.moves[i].to_tier == KVDB_TIER_REMOTE;
    *to_none += plan.moves[i].to_tier == KVDB_TIER_NONE;
  }
  if (plan.remote) { /* measured against the live server, and modelled below the SSD */
    ASSERT(plan.remote_perf.read_bps > 0 && plan.remote_perf.latency_s > 0);
    ASSERT(plan.remote_perf.probed_unix_ms > 0);
    ASSERT(plan.remote_model.read_bps <= plan.remote_perf.read_bps &&
           plan.remote_model.latency_s >= plan.remote_perf.latency_s);
    ASSERT_EQ(plan.remote_capacity, 0);
    printf("place: remote tier measured %.3g GB/s, %.3g us (modelled %.3g GB/s, %.3g us)\n",
           plan.remote_perf.read_bps / 1e9, plan.remote_perf.latency_s * 1e6,
           plan.remote_model.read_bps / 1e9, plan.remote_model.latency_s * 1e6);
  }
  ASSERT_OK(kvdb_rebalance_execute(a, &plan, &rep));
  ASSERT_EQ(rep.to_remote, (uint64_t)*to_remote);
  ASSERT_EQ(rep.remote_unwritten, 0);
  if (plan.remote)
    ASSERT_EQ(plan.remote_bytes_after, (uint64_t)*to_remote * one);
  kvdb_place_plan_free(&plan);
  int n_gone = 0;
  for (int i = 0; i < PL_CTX; i++) {
    kvdb_status st = kvdb_context_stat(a, &key[i], &ci);
    ASSERT(st == KVDB_OK || st == KVDB_NOTFOUND);
    gone[i] = st == KVDB_NOTFOUND;
    n_gone += gone[i];
  }
  ASSERT_EQ(n_gone, *to_remote + *to_none);
  if (port >= 0)
    ASSERT_EQ(r_stat(a).written, 4 * (uint64_t)*to_remote); /* only what went to Redis */
  kvdb_close(a);
  t_rmdir(da);
  return n_gone;
}

/* Host B (an empty store): each context whole from Redis when want[i], else a miss. */
static void place_check(int port, const char *ns, uint32_t **tok, const int *want)
{
  char *db_dir;
  kvdb *b = open_db("rp-b", port, ns, &db_dir);
  for (int i = 0; i < PL_CTX; i++) {
    size_t w = want[i] ? WB_TOKENS : 0;
    ASSERT_EQ(lookup(b, tok[i], WB_TOKENS), w);
    if (w)
      ASSERT_EQ(t_get_check(b, &r_model, tok[i], WB_TOKENS), w);
  }
  ASSERT_EQ(r_stat(b).rejected, 0);
  kvdb_close(b);
  t_rmdir(db_dir);
}

/* Run cmd, its stdout into out (cap bytes); its exit status. */
static int run_out(const char *cmd, char *out, size_t cap)
{
  FILE *p = popen(cmd, "r");
  ASSERT(p != NULL);
  size_t n = fread(out, 1, cap - 1, p);
  out[n] = 0;
  int st = pclose(p);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* `kvdb-admin rebalance`: without --remote the plan drops what leaves the SSD; with it (dry
 * run, then carried out) those go to the remote tier, which another host then reads. */
static void place_admin(const char *admin, int port, uint32_t **tok)
{
  char *da = t_tmpdir("rp-adm");
  kvdb *a = place_host(da, port, "pl4", 0, 10000.0);
  kvdb_key key[PL_CTX];
  for (int i = 0; i < PL_CTX; i++) {
    kvdb_put_info info;
    t_put_kv(a, &r_model, tok[i], WB_TOKENS, &info);
    key[i] = info.context;
  }
  kvdb_context_info ci;
  ASSERT_OK(kvdb_context_stat(a, &key[0], &ci));
  uint64_t one = ci.bytes;
  kvdb_close(a);
  a = place_host(da, port, "pl4", 2 * one + one / 2, 10000.0); /* records the settings */
  kvdb_close(a);
  static char out[65536];
  char cmd[8400];
  snprintf(cmd, sizeof cmd, "'%s' rebalance '%s' --dry-run", admin, da);
  ASSERT_EQ(run_out(cmd, out, sizeof out), 0);
  ASSERT(strstr(out, "(deleted)") != NULL && strstr(out, "remote/") == NULL);
  snprintf(cmd, sizeof cmd, "'%s' rebalance '%s' --dry-run --remote 127.0.0.1:%d "
           "--remote-namespace pl4", admin, da, port);
  ASSERT_EQ(run_out(cmd, out, sizeof out), 0);
  ASSERT(strstr(out, "(deleted)") == NULL && strstr(out, "remote/") != NULL);
  ASSERT(strstr(out, "remote bytes") != NULL && strstr(out, "measured") != NULL);
  snprintf(cmd, sizeof cmd, "'%s' rebalance '%s' --remote 127.0.0.1:%d --remote-namespace pl4",
           admin, da, port);
  ASSERT_EQ(run_out(cmd, out, sizeof out), 0);
  ASSERT(strstr(out, "to the remote tier") != NULL);
  snprintf(cmd, sizeof cmd, "'%s' rebalance '%s' --remote-namespace pl4", admin, da);
  ASSERT(run_out(cmd, out, sizeof out) != 0); /* a namespace needs an address */
  ASSERT_OK(kvdb_open(da, NULL, &a));
  int gone[PL_CTX], n_gone = 0;
  for (int i = 0; i < PL_CTX; i++) {
    kvdb_status st = kvdb_context_stat(a, &key[i], &ci);
    gone[i] = st == KVDB_NOTFOUND;
    n_gone += gone[i];
  }
  kvdb_close(a);
  ASSERT(n_gone >= 3);
  place_check(port, "pl4", tok, gone);
  t_rmdir(da);
  printf("place: kvdb-admin rebalance --remote sent %d contexts to the remote tier\n", n_gone);
}

static void mode_place(const char *admin)
{
  r_server s = {0};
  r_start(&s, 0, NULL);
  uint32_t *tok[PL_CTX];
  for (int i = 0; i < PL_CTX; i++)
    tok[i] = ctx_tokens(1700 + (uint64_t)i, WB_TOKENS);
  int gone[PL_CTX], to_r, to_n, remote;
  /* 1. the remote tier in the model: what leaves the SSD is kept on Redis */
  int n = place_run(s.port, "pl1", 10000.0, tok, gone, &to_r, &to_n, &remote);
  ASSERT_EQ(remote, 1);
  fprintf(stderr, "run 1: %d gone, %d to remote, %d dropped\n", n, to_r, to_n);
  ASSERT(n >= 3 && to_r == n && to_n == 0);
  place_check(s.port, "pl1", tok, gone);
  printf("place: %d of %d contexts left the SSD tier for the remote tier, read exactly by "
         "another host\n", to_r, PL_CTX);
  /* 2. recomputing near free: the utility drops them instead (even the SSD's) */
  int none[PL_CTX] = {0};
  n = place_run(s.port, "pl2", 1e15, tok, gone, &to_r, &to_n, &remote);
  ASSERT_EQ(remote, 1);
  ASSERT(n >= 3 && to_r == 0 && to_n == n);
  place_check(s.port, "pl2", tok, none);
  /* 3. no remote tier: dropped */
  n = place_run(-1, "pl3", 10000.0, tok, gone, &to_r, &to_n, &remote);
  ASSERT_EQ(remote, 0);
  ASSERT(n >= 3 && to_r == 0 && to_n == n);
  place_check(s.port, "pl3", tok, none);
  if (admin != NULL)
    place_admin(admin, s.port, tok);
  for (int i = 0; i < PL_CTX; i++)
    free(tok[i]);
  r_cleanup(&s);
  printf("place: with recomputing near free, and without a remote tier, they are dropped\n");
}

/* ---- copy: remote hits copied to the local store ---- */

/* Wait (up to 20 s) until the handle has copied `want` blocks (or failed some). */
static kvdb_remote_stats copy_wait(kvdb *db, uint64_t want)
{
  for (int i = 0; i < 2000; i++) {
    kvdb_remote_stats rs = r_stat(db);
    if (rs.copied >= want || rs.copy_failed > 0)
      return rs;
    r_sleep_ms(10);
  }
  return r_stat(db);
}

static void mode_copy(void)
{
  r_server s = {0};
  r_start(&s, 0, NULL);
  const size_t n = 24 * 16 + 5; /* 25 blocks, the last one partial */
  const size_t nl = 6 * 16;      /* B holds the first 6 blocks itself */
  uint32_t *tok = ctx_tokens(801, n), *tok2 = ctx_tokens(802, n);
  char *da, *dbd, *dcd;
  kvdb *a = open_db("rc-a", s.port, "cp", &da);
  t_put_kv(a, &r_model, tok, n, NULL);
  t_put_kv(a, &r_model, tok2, n, NULL);
  r_drain(a);
  ASSERT_EQ(r_stat(a).written, 50);
  kvdb_close(a);
  kvdb_options o;
  /* bad value */
  dbd = t_tmpdir("rc-b");
  r_opts(&o, s.port, "cp");
  o.remote_copy_hits = 2;
  kvdb *b;
  ASSERT_EQ(kvdb_open(dbd, &o, &b), KVDB_INVALID);
  ASSERT(strstr(kvdb_errmsg(), "remote_copy_hits") != NULL);
  /* host B, the library's default (copy on); it holds the first 6 blocks of tok itself */
  kvdb_options_init(&o);
  uint32_t def = o.remote_copy_hits;
  ASSERT_EQ(def, 1);
  r_opts(&o, s.port, "cp");
  o.remote_copy_hits = def;
  ASSERT_OK(kvdb_open(dbd, &o, &b));
  t_put_kv(b, &r_model, tok, nl, NULL);
  r_drain(b);
  uint64_t rt0 = r_stat(b).round_trips;
  ASSERT_EQ(t_get_check(b, &r_model, tok, n), n); /* 6 local + 19 from Redis, exact */
  ASSERT_EQ(r_stat(b).hits, 19);
  ASSERT_EQ(r_stat(b).round_trips, rt0 + 1);
  ASSERT_EQ(t_get_check(b, &r_model, tok2, n), n); /* 25 from Redis */
  kvdb_remote_stats rs = copy_wait(b, 19 + 25);
  ASSERT_EQ(rs.copy_failed, 0);
  ASSERT_EQ(rs.copied, 19 + 25);
  ASSERT_EQ(rs.written, 6); /* B's own put was written through; the copies were not */
  /* Redis goes away: B's gets are whole, exact and local (no remote hit, no round trip) */
  r_stop(&s);
  uint64_t hits = rs.hits;
  ASSERT_EQ(lookup(b, tok, n), n);
  ASSERT_EQ(t_get_check(b, &r_model, tok, n), n);
  ASSERT_EQ(t_get_check(b, &r_model, tok2, n), n);
  ASSERT_EQ(r_stat(b).hits, hits);
  kvdb_verify_report vr;
  ASSERT_OK(kvdb_verify(b, NULL, NULL, NULL, &vr)); /* the copied objects check as stored */
  ASSERT_EQ(vr.problems, 0);
  ASSERT_EQ(vr.blocks_checked, 6 + 19 + 25);
  kvdb_close(b);
  /* and after a reopen (the copies are durable records; verify finds nothing wrong) */
  ASSERT_OK(kvdb_open(dbd, &o, &b));
  ASSERT_EQ(t_get_check(b, &r_model, tok2, n), n);
  kvdb_stats st;
  ASSERT_OK(kvdb_stat(b, &st));
  ASSERT_EQ(st.n_contexts, 3); /* B's 6-block put and the two copies */
  kvdb_close(b);
  t_rmdir(dbd);
  /* host C with the option off: the same gets come from Redis only; Redis stopped, a miss */
  r_start(&s, s.port, NULL); /* empty: A puts again */
  t_rmdir(da);
  a = open_db("rc-a2", s.port, "cp", &da);
  t_put_kv(a, &r_model, tok, n, NULL);
  r_drain(a);
  kvdb_close(a);
  /* host D, copies on, whose local write fails (its segment folder replaced by a file): the
   * get is whole and exact all the same, the failure counted */
  {
    char *ddd = t_tmpdir("rc-d");
    kvdb_options od;
    r_opts(&od, s.port, "cp");
    od.remote_copy_hits = 1;
    kvdb *d;
    ASSERT_OK(kvdb_open(ddd, &od, &d));
    char ssd[4200];
    snprintf(ssd, sizeof ssd, "%s/ssd", ddd);
    char rm[8500];
    snprintf(rm, sizeof rm, "rm -rf '%s' && echo x > '%s'", ssd, ssd);
    ASSERT(system(rm) == 0);
    ASSERT_EQ(t_get_check(d, &r_model, tok, n), n);
    kvdb_remote_stats rd = copy_wait(d, 25);
    ASSERT_EQ(rd.copied, 0);
    ASSERT_EQ(rd.copy_failed, 25);
    ASSERT_EQ(t_get_check(d, &r_model, tok, n), n); /* from Redis again */
    kvdb_close(d);
    snprintf(rm, sizeof rm, "rm -f '%s'", ssd);
    ASSERT(system(rm) == 0);
    t_rmdir(ddd);
  }
  kvdb *c = open_db("rc-c", s.port, "cp", &dcd); /* r_opts: off */
  ASSERT_EQ(t_get_check(c, &r_model, tok, n), n);
  r_sleep_ms(200);
  ASSERT_EQ(r_stat(c).copied, 0);
  r_stop(&s);
  ASSERT_EQ(lookup(c, tok, n), 0);
  ASSERT_OK(kvdb_stat(c, &st));
  ASSERT_EQ(st.n_contexts, 0);
  kvdb_close(c);
  t_rmdir(dcd);
  t_rmdir(da);
  free(tok);
  free(tok2);
  r_cleanup(&s);
  printf("copy: 44 remote-hit blocks copied to B's store and served locally with Redis down "
         "(also after a reopen); with the option off, none\n");
}

/* ---- tags: remote_hash_tag ---- */

static void mode_tags(void)
{
  r_server s = {0};
  r_start(&s, 0, NULL);
  const size_t n = 10 * 16;
  uint32_t *t1 = malloc(n * sizeof *t1), *t2 = malloc(n * sizeof *t2);
  ASSERT(t1 != NULL && t2 != NULL);
  t_family_tokens(901, 900, 3 * 16, t1, n); /* the first 3 blocks shared */
  t_family_tokens(902, 900, 3 * 16, t2, n);
  kvdb_options o;
  char *da = t_tmpdir("rg-a"), *dbd, *dcd;
  r_opts(&o, s.port, "tg");
  o.remote_hash_tag = 2;
  kvdb *a;
  ASSERT_EQ(kvdb_open(da, &o, &a), KVDB_INVALID);
  ASSERT(strstr(kvdb_errmsg(), "remote_hash_tag") != NULL);
  o.remote_hash_tag = KVDB_REMOTE_TAG_ROOT;
  ASSERT_OK(kvdb_open(da, &o, &a));
  t_put_kv(a, &r_model, t1, n, NULL);
  t_put_kv(a, &r_model, t2, n, NULL);
  r_drain(a);
  ASSERT_EQ(r_stat(a).written, 17); /* 10 + the 7 blocks of t2 after the shared 3 */
  kvdb_close(a);
  /* every key: kvdb:tg:<model>:{<first 16 hex digits of block 0's hash>}:<hash> */
  kvdb_key h[10];
  ASSERT_OK(kvdb_chain_hashes(&r_model, t1, n, h, 10));
  char hx[33], pat[128];
  kvdb_key_hex(&h[0], hx);
  hx[16] = 0;
  redisContext *c = r_connect(s.port);
  ASSERT(c != NULL);
  redisReply *all = r_cmd(c, "KEYS kvdb:tg:*", NULL);
  snprintf(pat, sizeof pat, "kvdb:tg:*:{%s}:*", hx);
  redisReply *tagged = r_cmd(c, "KEYS %s", pat);
  ASSERT_EQ(all->elements, 17);
  ASSERT_EQ(tagged->elements, 17);
  freeReplyObject(all);
  freeReplyObject(tagged);
  redisFree(c);
  kvdb *b = open_db("rg-b", s.port, "tg", &dbd); /* no tag: other keys */
  ASSERT_EQ(lookup(b, t1, n), 0);
  kvdb_close(b);
  t_rmdir(dbd);
  dcd = t_tmpdir("rg-c");
  kvdb *cc;
  ASSERT_OK(kvdb_open(dcd, &o, &cc));
  ASSERT_EQ(lookup(cc, t1, n), n);
  ASSERT_EQ(t_get_check(cc, &r_model, t1, n), n);
  ASSERT_EQ(t_get_check(cc, &r_model, t2, n), n);
  ASSERT_EQ(r_stat(cc).rejected, 0);
  kvdb_close(cc);
  t_rmdir(dcd);
  t_rmdir(da);
  free(t1);
  free(t2);
  r_cleanup(&s);
  printf("tags: 17 keys under one chain-root tag, read exactly with the tag, missed without\n");
}

/* ---- protocol: a scripted fake server ---- */

#include <ctype.h>
#include <pthread.h>
#include <stdatomic.h>

#include "remote/remote.h"

typedef struct fake_srv {
  int lfd, port;
  pthread_t th;
  pthread_mutex_t mu;
  const char *script; /* bytes to send once `batch` GETs arrived on the connection */
  size_t script_len;
  unsigned batch;
  int close_after; /* close the connection after the script */
  _Atomic int stop;
} fake_srv;

/* One RESP array command from fd into argv0 (its first argument, upper-cased); 0, or -1 at EOF
 * or a malformed command. buf/len/pos: the connection's bytes. */
static int fake_cmd(int fd, char *buf, size_t *len, size_t *pos, char *argv0, size_t cap)
{
  for (;;) {
    /* parse "*N\r\n" then N "$L\r\n<L>\r\n" from buf[*pos, *len) */
    size_t p = *pos;
    int ok = 0;
    if (p < *len && buf[p] == '*') {
      char *e = memchr(buf + p, '\n', *len - p);
      if (e != NULL) {
        long n = strtol(buf + p + 1, NULL, 10);
        p = (size_t)(e - buf) + 1;
        ok = 1;
        for (long i = 0; ok && i < n; i++) {
          char *f = p < *len ? memchr(buf + p, '\n', *len - p) : NULL;
          if (f == NULL || buf[p] != '$') {
            ok = 0;
            break;
          }
          long l = strtol(buf + p + 1, NULL, 10);
          p = (size_t)(f - buf) + 1;
          if (p + (size_t)l + 2 > *len) {
            ok = 0;
            break;
          }
          if (i == 0) {
            size_t k = (size_t)l < cap - 1 ? (size_t)l : cap - 1;
            for (size_t j = 0; j < k; j++)
              argv0[j] = (char)toupper((unsigned char)buf[p + j]);
            argv0[k] = 0;
          }
          p += (size_t)l + 2;
        }
      }
    } else if (p < *len) {
      return -1;
    }
    if (ok) {
      *pos = p;
      return 0;
    }
    if (*pos > 0) {
      memmove(buf, buf + *pos, *len - *pos);
      *len -= *pos;
      *pos = 0;
    }
    ssize_t k = read(fd, buf + *len, 65536 - *len);
    if (k <= 0)
      return -1;
    *len += (size_t)k;
  }
}

static void write_all(int fd, const char *p, size_t n)
{
  while (n > 0) {
    ssize_t k = write(fd, p, n);
    if (k <= 0)
      return;
    p += k;
    n -= (size_t)k;
  }
}

static void *fake_main(void *arg)
{
  fake_srv *f = arg;
  char *buf = malloc(65536), argv0[32];
  while (!f->stop) {
    int fd = accept(f->lfd, NULL, NULL);
    if (fd < 0)
      continue;
    size_t len = 0, pos = 0;
    unsigned gets = 0;
    while (fake_cmd(fd, buf, &len, &pos, argv0, sizeof argv0) == 0) {
      if (strcmp(argv0, "CLUSTER") == 0) {
        static const char e[] = "-ERR This instance has cluster support disabled\r\n";
        write_all(fd, e, sizeof e - 1);
        continue;
      }
      pthread_mutex_lock(&f->mu);
      int done = ++gets == f->batch;
      const char *sc = f->script;
      size_t sl = f->script_len;
      int cl = f->close_after;
      pthread_mutex_unlock(&f->mu);
      if (!done)
        continue;
      gets = 0;
      write_all(fd, sc, sl);
      if (cl)
        break;
    }
    close(fd);
  }
  free(buf);
  return NULL;
}

static void fake_script(fake_srv *f, unsigned batch, const char *s, size_t n, int close_after)
{
  pthread_mutex_lock(&f->mu);
  f->batch = batch;
  f->script = s;
  f->script_len = n;
  f->close_after = close_after;
  pthread_mutex_unlock(&f->mu);
}

/* A batch of n GETs of keys k0, k1, ... through r. */
static void get_batch(kv_remote *r, kv_rcmd *c, size_t n)
{
  static char keys[8][8];
  memset(c, 0, n * sizeof *c);
  for (size_t i = 0; i < n; i++) {
    snprintf(keys[i], sizeof keys[i], "k%zu", i);
    c[i].op = KV_RCMD_GET;
    c[i].key = keys[i];
    c[i].klen = strlen(keys[i]);
  }
  ASSERT_OK(kv_remote_exec(r, c, n));
}

/* Write all of s into fd (a socketpair end with room for it). */
static void sp_write(int fd, const void *s, size_t n)
{
  const char *p = s;
  while (n > 0) {
    ssize_t k = write(fd, p, n);
    ASSERT(k > 0);
    p += k;
    n -= (size_t)k;
  }
}

/* A socketpair whose first end takes 1 MiB unread. */
static void sp_open(int sv[2])
{
  ASSERT(socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0);
  int big = 1 << 20;
  setsockopt(sv[0], SOL_SOCKET, SO_SNDBUF, &big, sizeof big);
}

/* The value buffers' pool (resp.h) over socketpairs: a released value's buffer takes the next
 * value that fits (exact, NUL-terminated, aligned), a larger value gets a new one; a value cut
 * mid-reply (the peer's close) fails with no data and gives its buffer back; the pool keeps at
 * most KV_RESP_POOL_N, the largest; destroy frees them (ASan: no leak). And the option. */
static void resp_pool_checks(void)
{
  kv_resp_pool pool;
  kv_resp_pool_init(&pool);
  int sv[2];
  sp_open(sv);
  kv_resp_rd rd;
  kv_resp_init(&rd, sv[1]);
  rd.pool = &pool;
  rd.poll_us = 100;
  kv_resp rep;
  char err[160];
  sp_write(sv[0], "$5\r\nhello\r\n", 11);
  ASSERT(kv_resp_read(&rd, &rep, err, sizeof err) == 0 && rep.type == KV_RESP_BULK);
  uint8_t *d1 = rep.data;
  ASSERT(rep.len == 5 && memcmp(d1, "hello", 6) == 0 && ((uintptr_t)d1 & 63) == 0);
  kv_resp_data_free(d1);
  ASSERT_EQ(pool.n, 1);
  sp_write(sv[0], "$3\r\nabc\r\n", 9);
  ASSERT(kv_resp_read(&rd, &rep, err, sizeof err) == 0 && rep.type == KV_RESP_BULK);
  ASSERT(rep.data == d1 && rep.len == 3 && memcmp(rep.data, "abc", 4) == 0);
  ASSERT_EQ(pool.n, 0);
  /* a value larger than the pooled buffer: a new one; both kept */
  size_t big = 100000;
  char *sc = malloc(big + 64);
  ASSERT(sc != NULL);
  size_t n = (size_t)sprintf(sc, "$%zu\r\n", big);
  for (size_t i = 0; i < big; i++)
    sc[n + i] = (char)(i * 13 + 1);
  memcpy(sc + n + big, "\r\n", 2);
  sp_write(sv[0], sc, n + big + 2);
  kv_resp rb;
  ASSERT(kv_resp_read(&rd, &rb, err, sizeof err) == 0 && rb.type == KV_RESP_BULK);
  uint8_t *d2 = rb.data;
  ASSERT(d2 != d1 && rb.len == big && memcmp(d2, sc + n, big) == 0 && d2[big] == 0);
  kv_resp_data_free(rep.data);
  kv_resp_data_free(d2);
  ASSERT_EQ(pool.n, 2);
  /* cut mid-reply: half the value, then the peer closes */
  sp_write(sv[0], sc, n + big / 2);
  shutdown(sv[0], SHUT_WR);
  ASSERT(kv_resp_read(&rd, &rb, err, sizeof err) != 0 && rb.data == NULL && err[0] != 0);
  ASSERT_EQ(pool.n, 2); /* its buffer back, not lost */
  kv_resp_free(&rd);
  close(sv[0]);
  close(sv[1]);
  /* a fresh connection, the same pool: the big buffer again, the value exact (not the cut
   * one's bytes) */
  sp_open(sv);
  kv_resp_init(&rd, sv[1]);
  rd.pool = &pool;
  for (size_t i = 0; i < big; i++)
    sc[n + i] = (char)(i * 7 + 5);
  sp_write(sv[0], sc, n + big + 2);
  ASSERT(kv_resp_read(&rd, &rb, err, sizeof err) == 0 && rb.type == KV_RESP_BULK);
  ASSERT(rb.data == d2 && rb.len == big && memcmp(rb.data, sc + n, big) == 0);
  ASSERT_EQ(pool.n, 1);
  /* six values at once, of growing sizes; released, the pool keeps the four largest */
  uint8_t *held[6];
  held[0] = rb.data;
  for (int v = 1; v < 6; v++) {
    size_t len = 5000u * (size_t)v;
    size_t m = (size_t)sprintf(sc, "$%zu\r\n", len);
    memset(sc + m, 'a' + v, len);
    memcpy(sc + m + len, "\r\n", 2);
    sp_write(sv[0], sc, m + len + 2);
    ASSERT(kv_resp_read(&rd, &rb, err, sizeof err) == 0 && rb.len == len &&
           rb.data[0] == 'a' + v && rb.data[len - 1] == 'a' + v && rb.data[len] == 0);
    held[v] = rb.data;
  }
  for (int v = 0; v < 6; v++)
    kv_resp_data_free(held[v]);
  ASSERT_EQ(pool.n, KV_RESP_POOL_N);
  int has_big = 0;
  for (int i = 0; i < pool.n; i++)
    has_big |= pool.buf[i] == d2;
  ASSERT(has_big);
  kv_resp_data_free(NULL);
  kv_resp_free(&rd);
  close(sv[0]);
  close(sv[1]);
  kv_resp_pool_destroy(&pool);
  free(sc);

  /* the option: default 50 µs, at most 10000 */
  kvdb_options o;
  kvdb_options_init(&o);
  ASSERT_EQ(o.remote_poll_us, 50);
  o.remote_addr = "127.0.0.1:1";
  o.remote_poll_us = 10001;
  char *dir = t_tmpdir("rpoll");
  kvdb *db = NULL;
  ASSERT_EQ(kvdb_open(dir, &o, &db), KVDB_INVALID);
  ASSERT(strstr(kvdb_errmsg(), "remote_poll_us") != NULL);
  o.remote_poll_us = 10000;
  ASSERT_OK(kvdb_open(dir, &o, &db));
  kvdb_close(db);
  t_rmdir(dir);
  printf("protocol: value buffers pooled (reused exact, larger values new, a value cut "
         "mid-reply gives its buffer back, at most %d kept); remote_poll_us checked\n",
         KV_RESP_POOL_N);
}

static void mode_protocol_poll(uint32_t poll_us)
{
  fake_srv f;
  memset(&f, 0, sizeof f);
  pthread_mutex_init(&f.mu, NULL);
  f.lfd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = 0};
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t al = sizeof a;
  ASSERT(f.lfd >= 0 && bind(f.lfd, (struct sockaddr *)&a, sizeof a) == 0 &&
         listen(f.lfd, 8) == 0 && getsockname(f.lfd, (struct sockaddr *)&a, &al) == 0);
  f.port = ntohs(a.sin_port);
  ASSERT(pthread_create(&f.th, NULL, fake_main, &f) == 0);
  char addr[32];
  snprintf(addr, sizeof addr, "127.0.0.1:%d", f.port);
  kv_remote *r = NULL;
  ASSERT_OK(kv_remote_open(addr, 300, NULL, &r));
  kv_remote_set_poll(r, poll_us);
  kv_rcmd c[8];
  kv_remote_counters k0, k1;

  /* 1. small, nil, 200 KB, empty: exact */
  size_t big = 200000, n = 0;
  char *sc = malloc(big + 256);
  n += (size_t)sprintf(sc + n, "$5\r\nhello\r\n$-1\r\n$%zu\r\n", big);
  for (size_t i = 0; i < big; i++)
    sc[n++] = (char)(i * 7 + 3);
  n += (size_t)sprintf(sc + n, "\r\n$0\r\n\r\n");
  fake_script(&f, 4, sc, n, 0);
  get_batch(r, c, 4);
  ASSERT(c[0].status == KV_RCMD_OK && c[0].len == 5 && memcmp(c[0].data, "hello", 5) == 0);
  ASSERT(c[1].status == KV_RCMD_NIL);
  ASSERT(c[2].status == KV_RCMD_OK && c[2].len == big && ((uintptr_t)c[2].data & 63) == 0);
  for (size_t i = 0; i < big; i++)
    ASSERT(c[2].data[i] == (uint8_t)(i * 7 + 3));
  ASSERT(c[3].status == KV_RCMD_OK && c[3].len == 0);
  kv_remote_release(c, 4);
  kv_remote_counters_get(r, &k0);
  ASSERT_EQ(k0.errors, 0);

  /* 2. an array reply: that command and the rest fail, the connection is closed, counted */
  static const char arr[] = "$3\r\nabc\r\n*1\r\n$1\r\nx\r\n$1\r\ny\r\n";
  fake_script(&f, 3, arr, sizeof arr - 1, 0);
  get_batch(r, c, 3);
  ASSERT(c[0].status == KV_RCMD_OK && c[0].len == 3 && memcmp(c[0].data, "abc", 3) == 0);
  ASSERT(c[1].status == KV_RCMD_ERR && c[2].status == KV_RCMD_ERR);
  kv_remote_release(c, 3);
  kv_remote_counters_get(r, &k1);
  ASSERT(k1.errors == k0.errors + 1);

  /* 3. after the backoff the next batch reconnects and reads right */
  usleep(250000);
  fake_script(&f, 2, "$2\r\nok\r\n+OK\r\n", 13, 0);
  get_batch(r, c, 2);
  ASSERT(c[0].status == KV_RCMD_OK && c[0].len == 2 && c[1].status == KV_RCMD_OK);
  kv_remote_release(c, 2);
  kv_remote_counters_get(r, &k0);
  ASSERT(k0.reconnects >= 1 && k0.errors == k1.errors);

  /* 4. bytes past the batch's replies (in the same write): out of step, the connection fails */
  fake_script(&f, 1, "$1\r\na\r\n+OK\r\n", 12, 0);
  get_batch(r, c, 1);
  kv_remote_release(c, 1);
  kv_remote_counters_get(r, &k1);
  ASSERT(k1.errors == k0.errors + 1);

  /* 5. a value cut by the server's close */
  usleep(250000);
  n = (size_t)sprintf(sc, "$100000\r\n");
  memset(sc + n, 'v', 50000);
  fake_script(&f, 1, sc, n + 50000, 1);
  get_batch(r, c, 1);
  ASSERT(c[0].status == KV_RCMD_ERR && c[0].data == NULL);
  kv_remote_release(c, 1);
  kv_remote_counters_get(r, &k0);
  ASSERT(k0.errors == k1.errors + 1);

  /* 6. a value stalled past the timeout (300 ms) */
  usleep(400000);
  fake_script(&f, 1, sc, n + 50000, 0);
  get_batch(r, c, 1);
  ASSERT(c[0].status == KV_RCMD_ERR && c[0].data == NULL);
  kv_remote_release(c, 1);
  kv_remote_counters_get(r, &k1);
  ASSERT(k1.errors == k0.errors + 1);

  kv_remote_close(r);
  f.stop = 1;
  shutdown(f.lfd, SHUT_RDWR);
  close(f.lfd);
  pthread_join(f.th, NULL);
  pthread_mutex_destroy(&f.mu);
  free(sc);
  printf("protocol (poll %u us): values exact (200 KB aligned), array reply, extra bytes, cut "
         "and stalled values each fail the connection and count; the next batch reconnects\n",
         poll_us);
}

static void mode_protocol(void)
{
  resp_pool_checks();
  mode_protocol_poll(0);
  mode_protocol_poll(200);
}

int main(int argc, char **argv)
{
  const char *mode = argc > 1 ? argv[1] : "tier";
  if (strcmp(mode, "protocol") != 0)
    r_require(progs, 1);
  if (strcmp(mode, "protocol") == 0)
    mode_protocol();
  else if (strcmp(mode, "tier") == 0)
    mode_tier();
  else if (strcmp(mode, "hosts") == 0)
    mode_hosts();
  else if (strcmp(mode, "tenants") == 0)
    mode_tenants();
  else if (strcmp(mode, "down") == 0)
    mode_down();
  else if (strcmp(mode, "pause") == 0)
    mode_pause();
  else if (strcmp(mode, "evict") == 0)
    mode_evict();
  else if (strcmp(mode, "reset") == 0)
    mode_reset();
  else if (strcmp(mode, "place") == 0)
    mode_place(argc > 2 ? argv[2] : NULL);
  else if (strcmp(mode, "tags") == 0)
    mode_tags();
  else if (strcmp(mode, "copy") == 0)
    mode_copy();
  else if (strcmp(mode, "writeback") == 0)
    mode_writeback();
  else if (strcmp(mode, "cluster") == 0)
    mode_cluster();
  else if (strcmp(mode, "metrics") == 0 && argc > 2)
    mode_metrics(argv[2]);
  else {
    fprintf(stderr, "unknown mode '%s'\n", mode);
    return T_EXIT_FAIL;
  }
  printf("remote %s: ok\n", mode);
  return T_EXIT_PASS;
}

