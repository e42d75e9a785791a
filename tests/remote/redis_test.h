/* SPDX-License-Identifier: MIT */
/*
 * tests/remote/redis_test.h — Redis servers for the remote tier's tests: each test starts its
 * own redis-server (Debian's redis-server package) on a free loopback port in a temporary
 * directory and kills it at the end (also when an assertion aborts); a test whose binaries
 * are missing skips (77) naming what it looked for. hiredis talks to the servers directly
 * (damage values, pause, kill clients).
 */
#ifndef REDIS_TEST_H
#define REDIS_TEST_H

#define _GNU_SOURCE

#include <arpa/inet.h>
#include <hiredis/hiredis.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>

#include "kvdb_test.h"
#include "model/model.h"

#define R_MAX_SERVERS 8

typedef struct r_server {
  pid_t pid;
  int port;
  char dir[4096];
} r_server;

static pid_t r_pids[R_MAX_SERVERS];

static void r_kill_all(void)
{
  for (int i = 0; i < R_MAX_SERVERS; i++)
    if (r_pids[i] > 0) {
      kill(r_pids[i], SIGKILL);
      waitpid(r_pids[i], NULL, 0);
      r_pids[i] = 0;
    }
}

static void r_on_abort(int sig)
{
  r_kill_all();
  signal(sig, SIG_DFL);
  raise(sig);
}

/* The path of program `name` on PATH, or NULL. */
static inline const char *r_which(const char *name, char *buf, size_t cap)
{
  const char *path = getenv("PATH");
  if (path == NULL)
    path = "/usr/local/bin:/usr/bin:/bin";
  while (*path) {
    const char *e = strchr(path, ':');
    size_t n = e ? (size_t)(e - path) : strlen(path);
    snprintf(buf, cap, "%.*s/%s", (int)n, path, name);
    if (access(buf, X_OK) == 0)
      return buf;
    path += n + (e != NULL);
  }
  return NULL;
}

/* Skip (exit 77) unless every program of names[] is on PATH. */
static inline void r_require(const char *const *names, size_t n)
{
  char buf[4096];
  for (size_t i = 0; i < n; i++)
    if (r_which(names[i], buf, sizeof buf) == NULL) {
      printf("SKIP: '%s' not found on PATH (Debian packages redis-server, redis-tools; "
             "./setup.sh installs them)\n", names[i]);
      exit(T_EXIT_SKIP);
    }
  signal(SIGABRT, r_on_abort);
  atexit(r_kill_all);
}

static inline int r_free_port_once(void)
{
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = 0};
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  ASSERT(fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0 &&
         getsockname(fd, (struct sockaddr *)&a, &len) == 0);
  int port = ntohs(a.sin_port);
  close(fd);
  return port;
}

/* A free port at most 55535: a Cluster node also listens on port + 10000. */
static inline int r_free_port(void)
{
  for (;;) {
    int p = r_free_port_once();
    if (p <= 55535)
      return p;
  }
}

static inline void r_sleep_ms(unsigned ms)
{
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

static inline redisContext *r_connect(int port)
{
  struct timeval tv = {5, 0};
  redisContext *c = redisConnectWithTimeout("127.0.0.1", port, tv);
  if (c == NULL || c->err) {
    if (c)
      redisFree(c);
    return NULL;
  }
  redisSetTimeout(c, tv);
  return c;
}

/* Run a command and check it did not fail (error reply or I/O); returns the reply. */
static inline redisReply *r_cmd(redisContext *c, const char *fmt, ...)
{
  va_list ap;
  va_start(ap, fmt);
  redisReply *r = redisvCommand(c, fmt, ap);
  va_end(ap);
  if (r == NULL || r->type == REDIS_REPLY_ERROR) {
    fprintf(stderr, "redis command '%s' failed: %s\n", fmt, r ? r->str : c->errstr);
    abort();
  }
  return r;
}

static inline void r_cmd_free(redisContext *c, const char *fmt, const char *arg)
{
  freeReplyObject(r_cmd(c, fmt, arg));
}

/* Start redis-server on `port` (0: a free one) with extra arguments (NULL-terminated). */
static inline void r_start(r_server *s, int port, const char *const *extra)
{
  if (s->dir[0] == 0) {
    char *d = t_tmpdir("redis");
    snprintf(s->dir, sizeof s->dir, "%s", d);
    free(d);
  }
  s->port = port ? port : r_free_port();
  char ports[16], logf[4200];
  snprintf(ports, sizeof ports, "%d", s->port);
  snprintf(logf, sizeof logf, "%s/redis-%d.log", s->dir, s->port);
  const char *argv[48] = {"redis-server", "--port", ports, "--bind", "127.0.0.1",
                          "--dir", s->dir, "--save", "", "--appendonly", "no",
                          "--daemonize", "no", "--logfile", logf, "--protected-mode", "no",
                          "--enable-debug-command", "yes"};
  int argc = 19;
  for (int i = 0; extra != NULL && extra[i] != NULL && argc < 46; i++)
    argv[argc++] = extra[i];
  argv[argc] = NULL;
  pid_t pid = fork();
  ASSERT(pid >= 0);
  if (pid == 0) {
    execvp("redis-server", (char *const *)argv);
    _exit(127);
  }
  s->pid = pid;
  for (int i = 0; i < R_MAX_SERVERS; i++)
    if (r_pids[i] == 0) {
      r_pids[i] = pid;
      break;
    }
  for (int i = 0; i < 500; i++) { /* up to 5 s */
    redisContext *c = r_connect(s->port);
    if (c != NULL) {
      redisReply *r = redisCommand(c, "PING");
      int ok = r != NULL && r->type == REDIS_REPLY_STATUS;
      if (r)
        freeReplyObject(r);
      redisFree(c);
      if (ok)
        return;
    }
    r_sleep_ms(10);
  }
  fprintf(stderr, "redis-server on port %d did not start (log %s)\n", s->port, logf);
  abort();
}

static inline void r_stop(r_server *s)
{
  if (s->pid > 0) {
    kill(s->pid, SIGKILL);
    waitpid(s->pid, NULL, 0);
    for (int i = 0; i < R_MAX_SERVERS; i++)
      if (r_pids[i] == s->pid)
        r_pids[i] = 0;
    s->pid = 0;
  }
}

static inline void r_cleanup(r_server *s)
{
  r_stop(s);
  if (s->dir[0]) {
    char *d = strdup(s->dir);
    t_rmdir(d);
    s->dir[0] = 0;
  }
}

static inline void r_opts(kvdb_options *o, int port, const char *ns)
{
  static char addr[8][32];
  static int k;
  char *a = addr[k++ % 8];
  kvdb_options_init(o);
  o->sync_mode = KVDB_SYNC_NONE;
  o->use_direct_io = 0;
  o->log_level = getenv("R_LOG") ? 2 : 0;
  snprintf(a, 32, "127.0.0.1:%d", port);
  o->remote_addr = a;
  o->remote_namespace = ns;
  o->remote_timeout_ms = 300;
  o->remote_copy_hits = 0; /* the tests of remote reads read Redis each time; mode copy on */
}

/* Wait (up to 20 s) until the handle's write-through queue is empty. */
static inline void r_drain(kvdb *db)
{
  for (int i = 0; i < 2000; i++) {
    kvdb_remote_stats rs;
    ASSERT_OK(kvdb_remote_stat(db, &rs));
    if (rs.queue_len == 0)
      return;
    r_sleep_ms(10);
  }
  fprintf(stderr, "the write-through queue did not drain\n");
  abort();
}

static inline kvdb_remote_stats r_stat(kvdb *db)
{
  kvdb_remote_stats rs;
  ASSERT_OK(kvdb_remote_stat(db, &rs));
  return rs;
}

/* The test model: small blocks (16 tokens of 2 layers x 2 heads x 64 dims f16: 16 KiB). */
static const kvdb_model r_model = {.id = "remote-test", .n_layers = 2, .n_kv_heads = 2,
                                   .head_dim = 64, .dtype = KVDB_F16, .block_tokens = 16};

/* The Redis key of block `i` (0-based) of tokens under namespace ns, as rtier.c writes it. */
static inline void r_block_key(const char *ns, const kvdb_model *m, const uint32_t *tok, size_t n,
                               size_t i, char *key, size_t cap)
{
  size_t nb = (n + m->block_tokens - 1) / m->block_tokens;
  kvdb_key *h = malloc(nb * sizeof *h);
  ASSERT(h != NULL);
  ASSERT_OK(kvdb_chain_hashes(m, tok, n, h, nb));
  kvdb_key mh;
  kv_model_hash(m, m->block_tokens, mh.b);
  char a[33], b[33];
  snprintf(key, cap, "kvdb:%s:%s:%s", ns, kvdb_key_hex(&mh, a), kvdb_key_hex(&h[i], b));
  free(h);
}

#endif
