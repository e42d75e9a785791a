/* SPDX-License-Identifier: MIT */
/*
 * engine/remote/remote.c — the Redis client of the remote tier (remote.h): connection pool,
 * Redis Cluster slot map (CLUSTER SLOTS, MOVED, ASK), pipelined batches, timeouts and backoff.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <hiredis/hiredis.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "remote.h"
#include "resp.h"

#define KV_RNODES_MAX 64
#define KV_RSLOTS 16384
#define KV_RSLOT_NONE 0xffffu
#define KV_RBACKOFF_MIN_MS 50u
#define KV_RBACKOFF_MAX_MS 2000u

typedef struct rnode {
  char host[64];
  int port;
  uint64_t down_until_ns; /* commands fail at once before this time */
  uint32_t backoff_ms;    /* the next failure's backoff (0: the node is healthy) */
  uint32_t epoch;         /* bumped at each failure: connections of an older epoch reconnect */
  int failed_once;
} rnode;

typedef struct connset {
  redisContext *c[KV_RNODES_MAX];
  kv_resp_rd rd[KV_RNODES_MAX]; /* the reader of c[i]'s batch replies (resp.h) */
  uint32_t epoch[KV_RNODES_MAX];
  struct connset *next;
} connset;

struct kv_remote {
  pthread_mutex_t mu;
  rnode nodes[KV_RNODES_MAX];
  int n_nodes;
  uint16_t *slots; /* KV_RSLOTS node indexes (cluster) */
  int cluster;     /* 1 once CLUSTER SLOTS answered */
  int probed;      /* whether the seed told what it is */
  int refresh;     /* a MOVED asked for a new slot map */
  struct timeval tv;
  connset *idle;
  kv_resp_pool pool; /* value buffers of every connection (resp.h) */
  _Atomic uint32_t poll_us; /* the readers' polling before a blocking read (resp.h) */
  kv_logger log;
  _Atomic uint64_t round_trips, commands, errors, reconnects, down_skips, redirects, bytes_out,
      bytes_in;
};

static uint64_t now_ns(void)
{
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* CRC16-CCITT (XMODEM), Redis Cluster's key hash, over the key's hash tag when it has one. */
static uint16_t crc16(const uint8_t *p, size_t n)
{
  uint16_t crc = 0;
  for (size_t i = 0; i < n; i++) {
    crc ^= (uint16_t)(p[i] << 8);
    for (int b = 0; b < 8; b++)
      crc = (crc & 0x8000) ? (uint16_t)((crc << 1) ^ 0x1021) : (uint16_t)(crc << 1);
  }
  return crc;
}

static unsigned key_slot(const char *key, size_t n)
{
  size_t s = 0;
  while (s < n && key[s] != '{')
    s++;
  if (s < n) {
    size_t e = s + 1;
    while (e < n && key[e] != '}')
      e++;
    if (e < n && e > s + 1)
      return crc16((const uint8_t *)key + s + 1, e - s - 1) & (KV_RSLOTS - 1);
  }
  return crc16((const uint8_t *)key, n) & (KV_RSLOTS - 1);
}

static int parse_hostport(const char *s, size_t n, char host[64], int *port)
{
  size_t colon = n;
  while (colon > 0 && s[colon - 1] != ':')
    colon--;
  if (colon == 0 || colon - 1 == 0 || colon - 1 >= 64 || colon == n)
    return -1;
  memcpy(host, s, colon - 1);
  host[colon - 1] = 0;
  long p = 0;
  for (size_t i = colon; i < n; i++) {
    if (s[i] < '0' || s[i] > '9')
      return -1;
    p = p * 10 + (s[i] - '0');
    if (p > 65535)
      return -1;
  }
  if (p == 0)
    return -1;
  *port = (int)p;
  return 0;
}

kvdb_status kv_remote_open(const char *addr, uint32_t timeout_ms, const kv_logger *log,
                           kv_remote **out)
{
  *out = NULL;
  char host[64];
  int port;
  if (addr == NULL || parse_hostport(addr, strlen(addr), host, &port) != 0)
    return kv_fail(KVDB_INVALID, "options.remote_addr '%.80s' is not host:port (a Redis server "
                   "or a Redis Cluster node)", addr ? addr : "(null)");
  if (timeout_ms == 0 || timeout_ms > 60000)
    return kv_fail(KVDB_INVALID, "options.remote_timeout_ms %u is not 1..60000", timeout_ms);
  kv_remote *r = calloc(1, sizeof *r);
  if (r == NULL || (r->slots = malloc(KV_RSLOTS * sizeof *r->slots)) == NULL) {
    free(r);
    return kv_fail(KVDB_NOMEM, "remote client");
  }
  for (unsigned i = 0; i < KV_RSLOTS; i++)
    r->slots[i] = KV_RSLOT_NONE;
  pthread_mutex_init(&r->mu, NULL);
  kv_resp_pool_init(&r->pool);
  snprintf(r->nodes[0].host, sizeof r->nodes[0].host, "%s", host);
  r->nodes[0].port = port;
  r->n_nodes = 1;
  r->tv.tv_sec = timeout_ms / 1000;
  r->tv.tv_usec = (suseconds_t)(timeout_ms % 1000) * 1000;
  if (log != NULL)
    r->log = *log;
  *out = r;
  return KVDB_OK;
}

/* Close connection i of cs (and drop its reader's buffer). */
static void conn_close(connset *cs, int i)
{
  if (cs->c[i] != NULL)
    redisFree(cs->c[i]);
  cs->c[i] = NULL;
  kv_resp_free(&cs->rd[i]);
}

static void connset_free(connset *cs)
{
  for (int i = 0; i < KV_RNODES_MAX; i++)
    conn_close(cs, i);
  free(cs);
}

void kv_remote_close(kv_remote *r)
{
  if (r == NULL)
    return;
  while (r->idle != NULL) {
    connset *cs = r->idle;
    r->idle = cs->next;
    connset_free(cs);
  }
  free(r->slots);
  kv_resp_pool_destroy(&r->pool);
  pthread_mutex_destroy(&r->mu);
  free(r);
}

void kv_remote_set_poll(kv_remote *r, uint32_t us)
{
  r->poll_us = us;
}

void kv_remote_release(kv_rcmd *cmds, size_t n)
{
  for (size_t i = 0; i < n; i++) {
    kv_resp_data_free(cmds[i].reply_);
    cmds[i].reply_ = NULL;
    cmds[i].data = NULL;
    cmds[i].len = 0;
  }
}

void kv_remote_counters_get(kv_remote *r, kv_remote_counters *o)
{
  memset(o, 0, sizeof *o);
  o->round_trips = r->round_trips;
  o->commands = r->commands;
  o->errors = r->errors;
  o->reconnects = r->reconnects;
  o->down_skips = r->down_skips;
  o->redirects = r->redirects;
  o->bytes_out = r->bytes_out;
  o->bytes_in = r->bytes_in;
  pthread_mutex_lock(&r->mu);
  o->nodes = (uint64_t)r->n_nodes;
  o->cluster = r->cluster;
  pthread_mutex_unlock(&r->mu);
}

/* ---- nodes, backoff ---- */

/* The index of node host:port, added when new (-1 when the table is full). Under r->mu. */
static int node_find_add(kv_remote *r, const char *host, int port)
{
  for (int i = 0; i < r->n_nodes; i++)
    if (r->nodes[i].port == port && strcmp(r->nodes[i].host, host) == 0)
      return i;
  if (r->n_nodes == KV_RNODES_MAX)
    return -1;
  rnode *nd = &r->nodes[r->n_nodes];
  memset(nd, 0, sizeof *nd);
  snprintf(nd->host, sizeof nd->host, "%s", host);
  nd->port = port;
  return r->n_nodes++;
}

/* `what` may be the failed connection's errstr: copied before the connection is freed. */
static void node_failed(kv_remote *r, connset *cs, int i, const char *what_in)
{
  char what[160];
  snprintf(what, sizeof what, "%s", what_in);
  conn_close(cs, i);
  r->errors++;
  pthread_mutex_lock(&r->mu);
  rnode *nd = &r->nodes[i];
  nd->backoff_ms = nd->backoff_ms == 0 ? KV_RBACKOFF_MIN_MS
                   : nd->backoff_ms * 2 > KV_RBACKOFF_MAX_MS ? KV_RBACKOFF_MAX_MS
                                                             : nd->backoff_ms * 2;
  nd->down_until_ns = now_ns() + (uint64_t)nd->backoff_ms * 1000000ull;
  nd->epoch++;
  nd->failed_once = 1;
  char msg[320];
  snprintf(msg, sizeof msg, "remote tier: redis %s:%d: %s; backing off %u ms", nd->host,
           nd->port, what, nd->backoff_ms);
  pthread_mutex_unlock(&r->mu);
  kv_log(&r->log, 1, "%s", msg);
}

static void node_ok(kv_remote *r, int i)
{
  pthread_mutex_lock(&r->mu);
  r->nodes[i].backoff_ms = 0;
  pthread_mutex_unlock(&r->mu);
}

/* A live connection to node i in cs, or NULL (node down, or the connect failed: counted). */
static redisContext *node_conn(kv_remote *r, connset *cs, int i)
{
  pthread_mutex_lock(&r->mu);
  rnode nd = r->nodes[i];
  pthread_mutex_unlock(&r->mu);
  if (cs->c[i] != NULL && cs->epoch[i] == nd.epoch && cs->c[i]->err == 0)
    return cs->c[i];
  conn_close(cs, i);
  if (nd.down_until_ns > now_ns())
    return NULL;
  redisContext *c = redisConnectWithTimeout(nd.host, nd.port, r->tv);
  if (c == NULL || c->err != 0 || redisSetTimeout(c, r->tv) != REDIS_OK) {
    char what[160];
    snprintf(what, sizeof what, "connect: %s", c ? c->errstr : "out of memory");
    if (c != NULL)
      redisFree(c);
    node_failed(r, cs, i, what);
    return NULL;
  }
  if (nd.failed_once)
    r->reconnects++;
  cs->c[i] = c;
  kv_resp_init(&cs->rd[i], c->fd);
  cs->rd[i].pool = &r->pool;
  cs->rd[i].poll_us = r->poll_us;
  cs->epoch[i] = nd.epoch;
  return c;
}

/* ---- the slot map ---- */

/* Ask the seed (or any known node) for CLUSTER SLOTS; a server without cluster support is
 * standalone. Sets probed once a node answered. */
static void refresh_map(kv_remote *r, connset *cs)
{
  pthread_mutex_lock(&r->mu);
  int n = r->n_nodes;
  pthread_mutex_unlock(&r->mu);
  for (int i = 0; i < n; i++) {
    redisContext *c = node_conn(r, cs, i);
    if (c == NULL)
      continue;
    r->round_trips++;
    redisReply *rep = redisCommand(c, "CLUSTER SLOTS");
    if (rep == NULL) {
      node_failed(r, cs, i, c->errstr);
      continue;
    }
    node_ok(r, i);
    pthread_mutex_lock(&r->mu);
    if (rep->type == REDIS_REPLY_ERROR) {
      /* "ERR This instance has cluster support disabled": standalone */
      r->cluster = 0;
      r->probed = 1;
      r->refresh = 0;
    } else if (rep->type == REDIS_REPLY_ARRAY) {
      for (size_t k = 0; k < rep->elements; k++) {
        redisReply *e = rep->element[k];
        if (e->type != REDIS_REPLY_ARRAY || e->elements < 3 ||
            e->element[0]->type != REDIS_REPLY_INTEGER ||
            e->element[1]->type != REDIS_REPLY_INTEGER ||
            e->element[2]->type != REDIS_REPLY_ARRAY || e->element[2]->elements < 2)
          continue;
        redisReply *m = e->element[2];
        if (m->element[0]->type != REDIS_REPLY_STRING ||
            m->element[1]->type != REDIS_REPLY_INTEGER)
          continue;
        char host[64];
        snprintf(host, sizeof host, "%s", m->element[0]->str[0] ? m->element[0]->str
                                                                 : r->nodes[i].host);
        int ni = node_find_add(r, host, (int)m->element[1]->integer);
        long long a = e->element[0]->integer, b = e->element[1]->integer;
        for (long long s = a; ni >= 0 && s <= b && s < KV_RSLOTS; s++)
          if (s >= 0)
            r->slots[s] = (uint16_t)ni;
      }
      r->cluster = 1;
      r->probed = 1;
      r->refresh = 0;
    }
    pthread_mutex_unlock(&r->mu);
    freeReplyObject(rep);
    return;
  }
}

/* ---- SIGPIPE ---- */

/* A write to a connection the server closed raises SIGPIPE, whose default action ends the
 * process; the library must not, and must not change the process's handlers either. So, as
 * libcurl and OpenSSL advise, SIGPIPE is blocked in the calling thread while it talks to Redis,
 * and one it raised meanwhile is consumed before the old mask comes back. */
typedef struct pipe_guard {
  sigset_t old;
  int pending_before;
} pipe_guard;

static void pipe_block(pipe_guard *g)
{
  sigset_t set, pend;
  sigemptyset(&set);
  sigaddset(&set, SIGPIPE);
  sigpending(&pend);
  g->pending_before = sigismember(&pend, SIGPIPE);
  pthread_sigmask(SIG_BLOCK, &set, &g->old);
}

static void pipe_unblock(pipe_guard *g)
{
  if (!g->pending_before) {
    sigset_t set, pend;
    sigemptyset(&set);
    sigaddset(&set, SIGPIPE);
    sigpending(&pend);
    if (sigismember(&pend, SIGPIPE)) {
      struct timespec zero = {0, 0};
      while (sigtimedwait(&set, NULL, &zero) == -1 && errno == EINTR)
        ;
    }
  }
  pthread_sigmask(SIG_SETMASK, &g->old, NULL);
}

/* ---- batches ---- */

static const char *op_name(int op)
{
  return op == KV_RCMD_GET ? "GET" : op == KV_RCMD_GETRANGE ? "GETRANGE"
         : op == KV_RCMD_DEL ? "DEL" : "SET";
}

static void append_cmd(redisContext *c, const kv_rcmd *x, int asking, kv_remote *r)
{
  if (asking)
    redisAppendCommand(c, "ASKING");
  const char *argv[4];
  size_t len[4];
  int argc = 2;
  char end[24];
  argv[0] = op_name(x->op);
  len[0] = strlen(argv[0]);
  argv[1] = x->key;
  len[1] = x->klen;
  if (x->op == KV_RCMD_SET) {
    argv[2] = x->val;
    len[2] = x->vlen;
    argc = 3;
  } else if (x->op == KV_RCMD_GETRANGE) {
    argv[2] = "0";
    len[2] = 1;
    len[3] = (size_t)snprintf(end, sizeof end, "%" PRId64, x->range_end);
    argv[3] = end;
    argc = 4;
  }
  redisAppendCommandArgv(c, argc, argv, len);
  r->bytes_out += len[1] + (x->op == KV_RCMD_SET ? x->vlen : 0) + 16;
  r->commands++;
}

/* A redirect in an error reply: 1 MOVED, 2 ASK (host and port filled), 0 neither. */
static int redirect_of(const char *str, unsigned *slot, char host[64], int *port)
{
  int kind = strncmp(str, "MOVED ", 6) == 0 ? 1 : strncmp(str, "ASK ", 4) == 0 ? 2 : 0;
  if (kind == 0)
    return 0;
  const char *p = str + (kind == 1 ? 6 : 4);
  char *sp;
  unsigned long s = strtoul(p, &sp, 10);
  if (*sp != ' ')
    return 0;
  *slot = (unsigned)s;
  if (parse_hostport(sp + 1, strlen(sp + 1), host, port) != 0)
    return 0;
  return kind;
}

/* Read the reply of x from connection k of cs (its reader, resp.h); 0, or -1 when the
 * connection failed (x is then KV_RCMD_ERR, *why says what). A redirect sets *redir (1 MOVED,
 * 2 ASK) and *to (its node). */
static int take_reply(kv_remote *r, connset *cs, int k, kv_rcmd *x, int asking, int *redir,
                      int *to, char *why, size_t why_cap)
{
  kv_resp_rd *rd = &cs->rd[k];
  kv_resp rep;
  *redir = 0;
  x->status = KV_RCMD_ERR;
  uint64_t in0 = rd->bytes_in;
  int rc = 0;
  if (asking) {
    rc = kv_resp_read(rd, &rep, why, why_cap);
    kv_resp_data_free(rep.data);
  }
  if (rc == 0)
    rc = kv_resp_read(rd, &rep, why, why_cap);
  r->bytes_in += rd->bytes_in - in0;
  if (rc != 0)
    return -1;
  if (rep.type == KV_RESP_BULK) {
    x->status = KV_RCMD_OK;
    x->data = rep.data;
    x->len = rep.len;
    x->reply_ = rep.data;
  } else if (rep.type == KV_RESP_NIL) {
    x->status = KV_RCMD_NIL;
  } else if (rep.type == KV_RESP_STATUS || rep.type == KV_RESP_INT) {
    x->status = KV_RCMD_OK;
  } else { /* KV_RESP_ERROR */
    unsigned slot;
    char host[64];
    int port;
    int kind = redirect_of(rep.line, &slot, host, &port);
    if (kind != 0) {
      pthread_mutex_lock(&r->mu);
      int ni = node_find_add(r, host, port);
      if (kind == 1 && ni >= 0 && slot < KV_RSLOTS) {
        r->slots[slot] = (uint16_t)ni;
        r->refresh = 1;
      }
      pthread_mutex_unlock(&r->mu);
      if (ni >= 0) {
        *redir = kind;
        *to = ni;
      }
    } else {
      kv_log(&r->log, 2, "remote tier: %s: %s", op_name(x->op), rep.line);
    }
    r->errors += kind == 0;
  }
  return 0;
}

static connset *take_connset(kv_remote *r)
{
  pthread_mutex_lock(&r->mu);
  connset *cs = r->idle;
  if (cs != NULL)
    r->idle = cs->next;
  pthread_mutex_unlock(&r->mu);
  if (cs == NULL)
    cs = calloc(1, sizeof *cs);
  return cs;
}

static void give_connset(kv_remote *r, connset *cs)
{
  pthread_mutex_lock(&r->mu);
  cs->next = r->idle;
  r->idle = cs;
  pthread_mutex_unlock(&r->mu);
}

kvdb_status kv_remote_exec(kv_remote *r, kv_rcmd *cmds, size_t n)
{
  return kv_remote_exec_cb(r, cmds, n, NULL, NULL);
}

kvdb_status kv_remote_exec_cb(kv_remote *r, kv_rcmd *cmds, size_t n, kv_rcmd_fn cb, void *ctx)
{
  if (n == 0)
    return KVDB_OK;
  connset *cs = take_connset(r);
  int16_t *node = malloc(n * sizeof *node);
  if (cs == NULL || node == NULL) {
    free(node);
    if (cs != NULL)
      give_connset(r, cs);
    return kv_fail(KVDB_NOMEM, "remote batch of %zu commands", n);
  }
  pipe_guard pg;
  pipe_block(&pg);
  pthread_mutex_lock(&r->mu);
  int need = !r->probed || r->refresh;
  pthread_mutex_unlock(&r->mu);
  if (need)
    refresh_map(r, cs);
  pthread_mutex_lock(&r->mu);
  for (size_t i = 0; i < n; i++) {
    cmds[i].status = KV_RCMD_ERR;
    cmds[i].data = NULL;
    cmds[i].len = 0;
    cmds[i].reply_ = NULL;
    uint16_t s = r->cluster ? r->slots[key_slot(cmds[i].key, cmds[i].klen)] : 0;
    node[i] = (int16_t)(s == KV_RSLOT_NONE ? 0 : s);
  }
  int n_nodes = r->n_nodes;
  pthread_mutex_unlock(&r->mu);
  /* write every node's commands, then read every reply: one round trip */
  int used[KV_RNODES_MAX] = {0};
  for (size_t i = 0; i < n; i++)
    used[node[i]] = 1;
  for (int k = 0; k < n_nodes; k++) {
    if (!used[k])
      continue;
    redisContext *c = node_conn(r, cs, k);
    if (c == NULL) {
      used[k] = 0;
      for (size_t i = 0; i < n; i++)
        if (node[i] == k)
          r->down_skips++;
      continue;
    }
    cs->rd[k].poll_us = r->poll_us;
    if (c->reader->len > c->reader->pos) { /* hiredis holds unread replies: out of step */
      node_failed(r, cs, k, "protocol error: replies nobody asked for");
      used[k] = 0;
      continue;
    }
    for (size_t i = 0; i < n; i++)
      if (node[i] == k)
        append_cmd(c, &cmds[i], 0, r);
    int done = 0;
    while (!done)
      if (redisBufferWrite(c, &done) != REDIS_OK) {
        node_failed(r, cs, k, c->errstr);
        used[k] = 0;
        break;
      }
  }
  r->round_trips++;
  int redirected = 0;
  int8_t *redir = calloc(n, 1);
  int16_t *to = calloc(n, sizeof *to);
  for (int k = 0; k < n_nodes; k++) {
    if (!used[k])
      continue;
    int ok = 1;
    char why[160];
    for (size_t i = 0; i < n && ok; i++) {
      if (node[i] != k)
        continue;
      int rd = 0, t = 0;
      if (take_reply(r, cs, k, &cmds[i], 0, &rd, &t, why, sizeof why) != 0) {
        node_failed(r, cs, k, why);
        ok = 0;
        break;
      }
      if (rd != 0 && redir != NULL && to != NULL) {
        redir[i] = (int8_t)rd;
        to[i] = (int16_t)t;
        redirected = 1;
      } else if (cb != NULL) {
        cb(ctx, i);
      }
    }
    if (ok && kv_resp_pending(&cs->rd[k])) { /* bytes past the batch's replies: out of step */
      node_failed(r, cs, k, "protocol error: more replies than commands");
      ok = 0;
    }
    if (ok)
      node_ok(r, k);
  }
  /* redirects: one more round trip each, to the node named */
  for (size_t i = 0; redirected && i < n; i++) {
    if (redir[i] == 0)
      continue;
    r->redirects++;
    r->round_trips++;
    redisContext *c = node_conn(r, cs, to[i]);
    if (c == NULL)
      continue;
    append_cmd(c, &cmds[i], redir[i] == 2, r);
    int rd = 0, t = 0, done = 0;
    char why[160];
    while (!done)
      if (redisBufferWrite(c, &done) != REDIS_OK)
        break;
    if (!done)
      node_failed(r, cs, to[i], c->errstr);
    else if (take_reply(r, cs, to[i], &cmds[i], redir[i] == 2, &rd, &t, why, sizeof why) != 0)
      node_failed(r, cs, to[i], why);
    else if (kv_resp_pending(&cs->rd[to[i]]))
      node_failed(r, cs, to[i], "protocol error: more replies than commands");
    else if (rd != 0)
      cmds[i].status = KV_RCMD_ERR; /* a second redirect: the map is moving; a miss now */
    if (cb != NULL)
      cb(ctx, i);
  }
  pipe_unblock(&pg);
  free(redir);
  free(to);
  free(node);
  give_connset(r, cs);
  return KVDB_OK;
}
