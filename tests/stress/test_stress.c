/* SPDX-License-Identifier: MIT */
/*
 * tests/stress/test_stress.c — 4 processes x 4 threads on one database, then every promise.
 *
 *   test_stress [KVDB_ADMIN]
 *
 * Each process opens its own handle; its 4 threads share it and, until the deadline, mix
 * put (new contexts and puts again of their own, deleted or not), get and lookup (their own
 * contexts and anyone's), delete, get_tokens, compact, verify and stat. Contexts of all 16
 * threads share prefixes (six families share their first 40 tokens: two whole blocks and a
 * partial one), so blocks are shared, refcounted and freed across processes while others read
 * them; segments are small, so they seal and compaction moves live blocks under the readers.
 * While running, each thread checks what it alone decides: its live contexts hit whole and
 * bit-exact, its deleted ones do not, any hit of anyone's context is bit-exact.
 * At the end the parent reopens the database and checks kvdb_verify (and `kvdb-admin verify`
 * when its path is given), that every acknowledged put not deleted since reads back whole and
 * bit-exact, that every deleted one is gone, that kvdb_stat counts exactly the live ones;
 * then compacts everything and checks it all again.
 * Before that, four races are made deterministic with the test I/O layer's before_open hook:
 * another process compacts a segment away between a reader's catalog snapshot and its opening
 * of the segment file (kvdb_get, kvdb_get_tokens and kvdb_get_block must still return the
 * whole context or block: they used to miss, or to say KVDB_NOTFOUND); another process opens
 * the database, and so runs recovery, while a writer creates its segment (the put must
 * succeed: recovery used to delete the new segment's record or seal it under the writer).
 *
 * KVDB_STRESS_SECONDS sets the running time (default 5; KVDB_SLOW=1: 120); KVDB_SEED=N
 * replays the operation mix (the interleaving is the scheduler's).
 */
#include "kvdb_test.h"

#include <pthread.h>
#include <sys/wait.h>
#include <time.h>

#include "io_test.h"

enum { N_PROC = 4, N_THR = 4, N_ALL = N_PROC * N_THR, MAXC = 1 << 15, MAXN = 128, SHARED = 40 };

static const kvdb_model M = {"stress-model", 2, 2, 64, KVDB_F16, 16};

enum { OP_PUT, OP_REPUT, OP_GET, OP_GET_ANY, OP_LOOKUP, OP_DELETE, OP_GET_TOKENS, OP_COMPACT,
       OP_VERIFY, OP_STAT, OP_N };
static const char *const op_names[OP_N] = {"put", "put again", "get", "get any", "lookup",
                                           "delete", "get_tokens", "compact", "verify", "stat"};

enum { ST_NONE = 0, ST_LIVE = 1, ST_DELETED = 2 };

/* Tokens of context i of thread `tid`: a family prefix of SHARED tokens, then its own. */
static uint32_t ctx_tokens(int tid, uint32_t i, uint32_t *tok)
{
  uint64_t s = ((uint64_t)tid << 32 | i) * 0x9e3779b97f4a7c15ull + 17;
  uint32_t n = SHARED + 1 + (uint32_t)(t_rand(&s) % (MAXN - SHARED));
  uint64_t fs = 4242 + (uint64_t)(tid * 7 + i) % 6;
  for (uint32_t k = 0; k < n; k++)
    tok[k] = (uint32_t)(k < SHARED ? t_rand(&fs) % 30000 : t_rand(&s) % 30000);
  tok[SHARED] = 30000 + (uint32_t)tid * MAXC + i; /* no two contexts are equal */
  return n;
}

static kvdb_key ctx_key(const uint32_t *tok, uint32_t n)
{
  kvdb_key h[MAXN / 16];
  kvdb_chain_hashes(&M, tok, n, h, MAXN / 16);
  return h[(n + 15) / 16 - 1];
}

static kvdb_options opts(void)
{
  kvdb_options o;
  kvdb_options_init(&o);
  o.dram_bytes = 2 << 20;    /* ~100 of many thousand blocks: inserts and evictions race */
  o.segment_bytes = 1 << 20; /* seal often: compaction has victims */
  o.log_level = getenv("KVDB_TEST_DEBUG") ? 2 : 0;
  return o;
}

typedef struct thr {
  kvdb *db;
  int tid;
  uint64_t rng;
  double deadline;
  uint32_t next;
  uint8_t *st;
  uint64_t ops[OP_N];
} thr;

static double now_s(void)
{
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

#define TFAIL(t, ...)                                                                              \
  do {                                                                                             \
    fprintf(stderr, "thread %d: ", (t)->tid);                                                      \
    fprintf(stderr, __VA_ARGS__);                                                                  \
    fprintf(stderr, " (%s)\n", kvdb_errmsg());                                                     \
    abort();                                                                                       \
  } while (0)

/* Read context (tid, i) back: returns the hit; aborts on wrong KV within the hit. */
static size_t read_ctx(thr *t, int tid, uint32_t i, uint16_t *buf)
{
  uint32_t tok[MAXN];
  uint32_t n = ctx_tokens(tid, i, tok);
  kvdb_kv_view v;
  kvdb_kv_view_packed(&v, buf, &M, n, KVDB_LAYOUT_LKTHD);
  size_t hit = 0;
  kvdb_status rc = kvdb_get(t->db, &M, tok, n, &v, &hit);
  if (rc != KVDB_OK)
    TFAIL(t, "get of context %d/%u: %s", tid, i, kvdb_status_name(rc));
  if (t_check_kv(&M, tok, hit, n, buf) != hit)
    TFAIL(t, "get of context %d/%u: wrong KV at token %zu of a %zu-token hit", tid, i,
          t_check_kv(&M, tok, hit, n, buf), hit);
  return hit;
}

/* A random context of mine in state `want`, or -1. */
static long pick(thr *t, int want)
{
  for (int k = 0; k < 8 && t->next > 0; k++) {
    uint32_t i = (uint32_t)(t_rand(&t->rng) % t->next);
    if (t->st[i] == want)
      return i;
  }
  return -1;
}

static void put_ctx(thr *t, uint32_t i, uint16_t *buf)
{
  uint32_t tok[MAXN];
  uint32_t n = ctx_tokens(t->tid, i, tok);
  t_fill_kv(&M, tok, n, buf);
  kvdb_kv_view v;
  kvdb_kv_view_packed(&v, buf, &M, n, KVDB_LAYOUT_LKTHD);
  kvdb_status rc = kvdb_put(t->db, &M, tok, n, &v, NULL);
  if (rc != KVDB_OK)
    TFAIL(t, "put of context %u: %s", i, kvdb_status_name(rc));
  t->st[i] = ST_LIVE; /* acknowledged */
}

static void on_problem(void *ctx, const kvdb_problem *p);

/* ---- a race made deterministic: a compaction (another process) commits and removes a
 * segment file after a reader took its catalog snapshot and before it opens that file ---- */

typedef struct racer {
  int cmd, ack; /* pipes to and from the compacting process */
  int armed;
} racer;

#define RACE_VICTIM "seg-0000000000000001.kvs" /* the first segment written */

static void before_open(const char *path, void *ctx)
{
  racer *r = ctx;
  if (!r->armed || strstr(path, RACE_VICTIM) == NULL)
    return;
  r->armed = 0;
  char c = 'c';
  ASSERT(write(r->cmd, &c, 1) == 1);
  ASSERT(read(r->ack, &c, 1) == 1 && c == 'k'); /* the segment is gone now */
}

static void compactor(const char *dir, int cmd, int ack)
{
  char c;
  while (read(cmd, &c, 1) == 1) {
    kvdb_options o = opts();
    kvdb *db;
    kvdb_compact_report rep;
    if (kvdb_open(dir, &o, &db) != KVDB_OK || kvdb_compact(db, 1.0, NULL, NULL, &rep) != KVDB_OK ||
        rep.segments_rewritten == 0) {
      fprintf(stderr, "race: compaction: %s\n", kvdb_errmsg());
      _exit(1);
    }
    kvdb_close(db);
    c = 'k';
    if (write(ack, &c, 1) != 1)
      _exit(1);
  }
  _exit(0);
}

/* what: 0 kvdb_get, 1 kvdb_get_tokens, 2 kvdb_get_block */
static void race_compaction_under_reader(int what)
{
  char *dir = t_tmpdir("race");
  kvdb_options o = opts();
  o.dram_bytes = 0; /* the reader reads from disk */
  kvdb *db;
  ASSERT_OK(kvdb_open(dir, &o, &db));
  thr t = {.db = db, .tid = N_ALL, .st = calloc(MAXC, 1)};
  uint16_t *buf = malloc((size_t)MAXN * kvdb_model_token_bytes(&M));
  const kvdb_key bkey = {{7, 7, 7}};
  uint32_t btok[16];
  for (uint32_t i = 0; i < 16; i++)
    btok[i] = 5000 + i;
  if (what == 2) { /* an explicit-key block, first in segment 1 */
    kvdb_kv_view v;
    t_fill_kv(&M, btok, 16, buf);
    kvdb_kv_view_packed(&v, buf, &M, 16, KVDB_LAYOUT_LKTHD);
    ASSERT_OK(kvdb_put_block(db, &M, &bkey, btok, 16, &v));
  }
  for (uint32_t i = 0; i < 40; i++) /* about 4 MiB: segments 1..4 fill and seal */
    put_ctx(&t, i, buf);
  for (uint32_t i = what == 2 ? 0 : 1; i < 40; i++) { /* all but one: segment 1 is sparse */
    uint32_t tok[MAXN];
    uint32_t n = ctx_tokens(t.tid, i, tok);
    kvdb_key k = ctx_key(tok, n);
    ASSERT_OK(kvdb_delete(db, &k));
  }
  kvdb_close(db);
  int cmd[2], ack[2];
  ASSERT(pipe(cmd) == 0 && pipe(ack) == 0);
  pid_t pid = fork();
  ASSERT(pid >= 0);
  if (pid == 0) {
    close(cmd[1]);
    close(ack[0]);
    compactor(dir, cmd[0], ack[1]);
  }
  close(cmd[0]);
  close(ack[1]);
  racer r = {cmd[1], ack[0], 0};
  iot_config c = {.fail_kind = -1, .before_open = before_open, .before_open_ctx = &r};
  iot_install(&c);
  ASSERT_OK(kvdb_open(dir, &o, &db)); /* a fresh handle: no segment file open yet */
  t.db = db;
  r.armed = 1;
  uint32_t tok[MAXN];
  uint32_t n = ctx_tokens(t.tid, 0, tok);
  if (what == 0) {
    size_t hit = read_ctx(&t, t.tid, 0, buf);
    if (hit != n) {
      fprintf(stderr, "race: get of a live context hit %zu of %u tokens after a compaction "
              "moved its blocks\n", hit, n);
      abort();
    }
  } else if (what == 1) {
    kvdb_key k = ctx_key(tok, n);
    uint32_t pos[8] = {0, 1, 15, 16, 40, n - 1, 33, 20};
    kvdb_kv_view v;
    kvdb_kv_view_packed(&v, buf, &M, 8, KVDB_LAYOUT_LKTHD);
    ASSERT_OK(kvdb_get_tokens(db, &M, &k, 1, pos, 8, &v));
    for (uint32_t j = 0; j < 8; j++)
      ASSERT(buf[((0 * 8 + j) * M.n_kv_heads + 1) * M.head_dim + 5] ==
             t_kv_value(tok, pos[j], 1, 0, 1, 5));
  } else {
    kvdb_kv_view v;
    kvdb_kv_view_packed(&v, buf, &M, 16, KVDB_LAYOUT_LKTHD);
    size_t got = 0;
    ASSERT_OK(kvdb_get_block(db, &M, &bkey, btok, 16, &v, &got));
    ASSERT(got == 16 && t_check_kv(&M, btok, 16, 16, buf) == 16);
  }
  ASSERT(r.armed == 0); /* the race happened */
  kvdb_close(db);
  iot_uninstall();
  close(cmd[1]);
  int status;
  ASSERT(waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0);
  close(ack[0]);
  free(buf);
  free(t.st);
  t_rmdir(dir);
}

/* Another race made deterministic: a process opens the database (and so runs recovery) while
 * a writer in another process is creating a new segment. Recovery must take the segment for a
 * live writer's (it used to delete its record, or truncate and seal its file, under the writer:
 * the put then failed). */
typedef struct opener {
  const char *dir;
  int armed;
  pid_t pid;
} opener;

static void open_elsewhere(const char *path, void *ctx)
{
  opener *o = ctx;
  if (!o->armed || strstr(path, "/seg-") == NULL)
    return;
  o->armed = 0; /* the child inherits this layer: it must not fire there */
  o->pid = fork();
  ASSERT(o->pid >= 0);
  if (o->pid == 0) {
    kvdb_options opt = opts();
    kvdb *db;
    kvdb_status rc = kvdb_open(o->dir, &opt, &db);
    kvdb_close(db);
    _exit(rc == KVDB_OK ? 0 : 1);
  }
  /* let its recovery run now if it can; it may have to wait for the writer's transaction */
  for (int i = 0; i < 100; i++) {
    int status;
    if (waitpid(o->pid, &status, WNOHANG) == o->pid) {
      ASSERT(WIFEXITED(status) && WEXITSTATUS(status) == 0);
      o->pid = 0;
      return;
    }
    usleep(10000);
  }
}

static void race_recovery_under_new_segment(void)
{
  char *dir = t_tmpdir("race2");
  kvdb_options o = opts();
  kvdb *db;
  ASSERT_OK(kvdb_open(dir, &o, &db));
  kvdb_close(db);
  opener op = {dir, 0, 0};
  iot_config c = {.fail_kind = -1, .before_open = open_elsewhere, .before_open_ctx = &op};
  iot_install(&c);
  ASSERT_OK(kvdb_open(dir, &o, &db));
  thr t = {.db = db, .tid = N_ALL + 1, .st = calloc(MAXC, 1)};
  uint16_t *buf = malloc((size_t)MAXN * kvdb_model_token_bytes(&M));
  op.armed = 1;
  put_ctx(&t, 0, buf); /* its first segment is created here */
  ASSERT(op.armed == 0);
  int status;
  ASSERT(op.pid == 0 || (waitpid(op.pid, &status, 0) == op.pid && WIFEXITED(status) &&
                         WEXITSTATUS(status) == 0));
  put_ctx(&t, 1, buf);
  kvdb_close(db);
  iot_uninstall();
  ASSERT_OK(kvdb_open(dir, &o, &db));
  t.db = db;
  for (uint32_t i = 0; i < 2; i++) {
    uint32_t tok[MAXN];
    ASSERT(read_ctx(&t, t.tid, i, buf) == ctx_tokens(t.tid, i, tok));
  }
  ASSERT_OK(kvdb_verify(db, on_problem, NULL, NULL, NULL));
  kvdb_close(db);
  free(buf);
  free(t.st);
  t_rmdir(dir);
}

static void on_problem(void *ctx, const kvdb_problem *p)
{
  (void)ctx;
  fprintf(stderr, "verify: %s: %s\n", kvdb_status_name(p->status), p->message);
}

static void *thr_main(void *p)
{
  thr *t = p;
  uint16_t *buf = malloc((size_t)MAXN * kvdb_model_token_bytes(&M));
  if (buf == NULL)
    abort();
  while (now_s() < t->deadline) {
    unsigned r = (unsigned)(t_rand(&t->rng) % 200);
    long i;
    int op;
    if (r < 50 && t->next < MAXC) {
      op = OP_PUT;
      put_ctx(t, t->next++, buf);
    } else if (r < 60 && t->next > 0) {
      op = OP_REPUT; /* a no-op when live, a new put when deleted */
      put_ctx(t, (uint32_t)(t_rand(&t->rng) % t->next), buf);
    } else if (r < 95) {
      op = OP_GET;
      int want = r < 85 ? ST_LIVE : ST_DELETED;
      if ((i = pick(t, want)) < 0)
        continue;
      uint32_t tok[MAXN];
      uint32_t n = ctx_tokens(t->tid, (uint32_t)i, tok);
      size_t hit = read_ctx(t, t->tid, (uint32_t)i, buf);
      if (want == ST_LIVE && hit != n)
        TFAIL(t, "my live context %ld hit %zu of %u tokens", i, hit, n);
      if (want == ST_DELETED && hit > SHARED)
        TFAIL(t, "my deleted context %ld still hits %zu of %u tokens", i, hit, n);
    } else if (r < 115) {
      op = OP_GET_ANY; /* anyone's, existing or not: whatever hits is exact */
      read_ctx(t, (int)(t_rand(&t->rng) % N_ALL), (uint32_t)(t_rand(&t->rng) % 400), buf);
    } else if (r < 135) {
      op = OP_LOOKUP;
      int want = r < 130 ? ST_LIVE : ST_DELETED;
      if ((i = pick(t, want)) < 0)
        continue;
      uint32_t tok[MAXN];
      uint32_t n = ctx_tokens(t->tid, (uint32_t)i, tok);
      size_t hit = 0;
      kvdb_status rc = kvdb_lookup(t->db, &M, tok, n, &hit);
      if (rc != KVDB_OK || (want == ST_LIVE && hit != n) || (want == ST_DELETED && hit > SHARED))
        TFAIL(t, "lookup of my %s context %ld: %s, hit %zu of %u",
              want == ST_LIVE ? "live" : "deleted", i, kvdb_status_name(rc), hit, n);
    } else if (r < 170) {
      op = OP_DELETE;
      int want = r < 167 ? ST_LIVE : ST_DELETED;
      if ((i = pick(t, want)) < 0)
        continue;
      uint32_t tok[MAXN];
      uint32_t n = ctx_tokens(t->tid, (uint32_t)i, tok);
      kvdb_key k = ctx_key(tok, n);
      kvdb_status rc = kvdb_delete(t->db, &k);
      if (rc != (want == ST_LIVE ? KVDB_OK : KVDB_NOTFOUND))
        TFAIL(t, "delete of my %s context %ld: %s", want == ST_LIVE ? "live" : "deleted", i,
              kvdb_status_name(rc));
      t->st[i] = ST_DELETED;
    } else if (r < 190) {
      op = OP_GET_TOKENS;
      if ((i = pick(t, ST_LIVE)) < 0)
        continue;
      uint32_t tok[MAXN];
      uint32_t n = ctx_tokens(t->tid, (uint32_t)i, tok);
      kvdb_key k = ctx_key(tok, n);
      uint32_t layer = (uint32_t)(t_rand(&t->rng) % M.n_layers), pos[8];
      for (int j = 0; j < 8; j++)
        pos[j] = (uint32_t)(t_rand(&t->rng) % n);
      kvdb_kv_view v;
      kvdb_kv_view_packed(&v, buf, &M, 8, KVDB_LAYOUT_LKTHD);
      kvdb_status rc = kvdb_get_tokens(t->db, &M, &k, layer, pos, 8, &v);
      if (rc != KVDB_OK)
        TFAIL(t, "get_tokens of my live context %ld: %s", i, kvdb_status_name(rc));
      for (uint32_t kv = 0; kv < 2; kv++)
        for (uint32_t j = 0; j < 8; j++)
          for (uint32_t h = 0; h < M.n_kv_heads; h++)
            for (uint32_t d = 0; d < M.head_dim; d++)
              if (buf[((kv * 8 + j) * M.n_kv_heads + h) * M.head_dim + d] !=
                  t_kv_value(tok, pos[j], layer, kv, h, d))
                TFAIL(t, "get_tokens of my context %ld: wrong KV at position %u", i, pos[j]);
    } else if (r < 193) {
      op = OP_COMPACT;
      kvdb_status rc = kvdb_compact(t->db, 0.7, NULL, NULL, NULL);
      if (rc != KVDB_OK)
        TFAIL(t, "compact: %s", kvdb_status_name(rc));
    } else if (r < 194) {
      op = OP_VERIFY; /* online, while 15 other threads write, delete and compact */
      kvdb_verify_report rep;
      kvdb_status rc = kvdb_verify(t->db, on_problem, NULL, NULL, &rep);
      if (rc != KVDB_OK)
        TFAIL(t, "online verify: %s, %llu problems", kvdb_status_name(rc),
              (unsigned long long)rep.problems);
    } else {
      op = OP_STAT;
      kvdb_stats st;
      if (kvdb_stat(t->db, &st) != KVDB_OK || st.corrupt_blocks != 0)
        TFAIL(t, "stat (or %llu corrupt blocks)", (unsigned long long)st.corrupt_blocks);
    }
    t->ops[op]++;
  }
  free(buf);
  return NULL;
}

/* One process: N_THR threads on one handle; writes thread states and op counts to `out`. */
static int child(const char *dir, int proc, uint64_t seed, double seconds, const char *out)
{
  kvdb_options o = opts();
  kvdb *db;
  if (kvdb_open(dir, &o, &db) != KVDB_OK) {
    fprintf(stderr, "process %d: open: %s\n", proc, kvdb_errmsg());
    return 3;
  }
  thr t[N_THR];
  pthread_t th[N_THR];
  double deadline = now_s() + seconds;
  for (int k = 0; k < N_THR; k++) {
    t[k] = (thr){.db = db, .tid = proc * N_THR + k, .deadline = deadline,
                 .rng = seed ^ (uint64_t)(proc * N_THR + k + 1) * 0x2545f4914f6cdd1dull,
                 .st = calloc(MAXC, 1)};
    if (t[k].st == NULL || pthread_create(&th[k], NULL, thr_main, &t[k]) != 0)
      return 4;
  }
  for (int k = 0; k < N_THR; k++)
    pthread_join(th[k], NULL);
  kvdb_close(db);
  FILE *f = fopen(out, "wb");
  if (f == NULL)
    return 5;
  for (int k = 0; k < N_THR; k++) {
    if (fwrite(&t[k].next, 4, 1, f) != 1 || fwrite(t[k].st, 1, t[k].next, f) != t[k].next ||
        fwrite(t[k].ops, 8, OP_N, f) != OP_N)
      return 5;
    free(t[k].st);
  }
  return fclose(f) == 0 ? 0 : 5;
}

/* Everything the threads were told: live contexts whole and exact, deleted ones gone, nothing
 * else listed. Returns the number of live contexts. */
static uint64_t check_all(const char *dir, uint8_t *const st[N_ALL], const uint32_t next[N_ALL],
                          uint64_t *deleted)
{
  kvdb_options o = opts();
  kvdb *db;
  ASSERT_OK(kvdb_open(dir, &o, &db));
  kvdb_verify_report rep;
  ASSERT_OK(kvdb_verify(db, on_problem, NULL, NULL, &rep));
  uint16_t *buf = malloc((size_t)MAXN * kvdb_model_token_bytes(&M));
  thr t = {.db = db, .tid = -1};
  uint64_t live = 0;
  *deleted = 0;
  for (int tid = 0; tid < N_ALL; tid++)
    for (uint32_t i = 0; i < next[tid]; i++) {
      uint32_t tok[MAXN];
      uint32_t n = ctx_tokens(tid, i, tok);
      kvdb_key k = ctx_key(tok, n);
      kvdb_context_info ci;
      kvdb_status rc = kvdb_context_stat(db, &k, &ci);
      if (st[tid][i] == ST_LIVE) {
        size_t hit = read_ctx(&t, tid, i, buf);
        if (rc != KVDB_OK || hit != n || ci.n_tokens != n) {
          fprintf(stderr, "acknowledged context %d/%u: %s, hit %zu of %u\n", tid, i,
                  kvdb_status_name(rc), hit, n);
          abort();
        }
        live++;
      } else if (st[tid][i] == ST_DELETED) {
        if (rc != KVDB_NOTFOUND) {
          fprintf(stderr, "deleted context %d/%u is still listed\n", tid, i);
          abort();
        }
        (*deleted)++;
      }
    }
  kvdb_stats s;
  ASSERT_OK(kvdb_stat(db, &s));
  ASSERT_EQ(s.n_contexts, live); /* nothing listed that nobody put */
  ASSERT_EQ(s.corrupt_blocks, 0);
  free(buf);
  kvdb_close(db);
  return live;
}

int main(int argc, char **argv)
{
  const char *admin = argc > 1 ? argv[1] : NULL;
  double seconds = getenv("KVDB_SLOW") ? 120 : 5;
  if (getenv("KVDB_STRESS_SECONDS"))
    seconds = atof(getenv("KVDB_STRESS_SECONDS"));
  uint64_t seed = getenv("KVDB_SEED") ? strtoull(getenv("KVDB_SEED"), NULL, 10)
                                      : (uint64_t)time(NULL);
  printf("test_stress: %d processes x %d threads for %.0f s, KVDB_SEED=%llu\n", N_PROC, N_THR,
         seconds, (unsigned long long)seed);
  fflush(stdout);
  for (int what = 0; what < 3; what++)
    race_compaction_under_reader(what);
  printf("test_stress: a get, a get_tokens and a get_block whose segment is compacted away "
         "between their snapshot and their read: whole and exact\n");
  race_recovery_under_new_segment();
  printf("test_stress: an open (recovery) in another process while a writer creates its "
         "segment: the put succeeds, the database verifies\n");
  char *root = t_tmpdir("stress");
  char dir[4200];
  snprintf(dir, sizeof dir, "%s/db", root);
  kvdb_options o = opts();
  kvdb *db;
  ASSERT_OK(kvdb_open(dir, &o, &db)); /* created once, before the processes race to it */
  kvdb_close(db);

  double t0 = now_s();
  pid_t pid[N_PROC];
  for (int p = 0; p < N_PROC; p++) {
    pid[p] = fork();
    ASSERT(pid[p] >= 0);
    if (pid[p] == 0) {
      char out[4300];
      snprintf(out, sizeof out, "%s/proc-%d", root, p);
      _exit(child(dir, p, seed, seconds, out));
    }
  }
  int failed = 0;
  for (int p = 0; p < N_PROC; p++) {
    int status;
    ASSERT(waitpid(pid[p], &status, 0) == pid[p]);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      fprintf(stderr, "process %d failed (%s %d)\n", p,
              WIFSIGNALED(status) ? "signal" : "exit",
              WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status));
      failed = 1;
    }
  }
  if (failed) {
    fprintf(stderr, "test_stress failed (KVDB_SEED=%llu; database left in %s)\n",
            (unsigned long long)seed, dir);
    return T_EXIT_FAIL;
  }
  double elapsed = now_s() - t0;

  uint8_t *st[N_ALL];
  uint32_t next[N_ALL];
  uint64_t ops[OP_N] = {0}, total = 0;
  for (int p = 0; p < N_PROC; p++) {
    char out[4300];
    snprintf(out, sizeof out, "%s/proc-%d", root, p);
    FILE *f = fopen(out, "rb");
    ASSERT(f != NULL);
    for (int k = 0; k < N_THR; k++) {
      int tid = p * N_THR + k;
      uint64_t c[OP_N];
      ASSERT(fread(&next[tid], 4, 1, f) == 1 && next[tid] <= MAXC);
      st[tid] = calloc(MAXC, 1);
      ASSERT(fread(st[tid], 1, next[tid], f) == next[tid] && fread(c, 8, OP_N, f) == OP_N);
      for (int op = 0; op < OP_N; op++) {
        ops[op] += c[op];
        total += c[op];
      }
    }
    fclose(f);
  }
  printf("test_stress: %llu operations in %.1f s (%.0f/s):", (unsigned long long)total, elapsed,
         (double)total / elapsed);
  for (int op = 0; op < OP_N; op++)
    printf("%s %s %llu", op ? "," : "", op_names[op], (unsigned long long)ops[op]);
  printf("\n");
  ASSERT(ops[OP_PUT] > 0 && ops[OP_DELETE] > 0 && ops[OP_GET] > 0);

  uint64_t deleted;
  uint64_t live = check_all(dir, st, next, &deleted);
  if (admin != NULL) {
    char cmd[8600];
    snprintf(cmd, sizeof cmd, "'%s' verify '%s' >/dev/null", admin, dir);
    int rc = system(cmd);
    if (rc != 0) {
      fprintf(stderr, "kvdb-admin verify %s: exit status %d\n", dir, rc);
      return T_EXIT_FAIL;
    }
  }
  /* compact everything that can be, then every promise again */
  ASSERT_OK(kvdb_open(dir, &o, &db));
  kvdb_compact_report cr;
  ASSERT_OK(kvdb_compact(db, 1.0, NULL, NULL, &cr));
  kvdb_close(db);
  uint64_t deleted2;
  ASSERT_EQ(check_all(dir, st, next, &deleted2), live);
  printf("test_stress: %llu acknowledged contexts read back bit-exact, %llu deleted ones gone, "
         "verify%s clean; again after compacting %llu segments (%llu blocks moved)\n",
         (unsigned long long)live, (unsigned long long)deleted,
         admin ? " and kvdb-admin verify" : "", (unsigned long long)cr.segments_rewritten, (unsigned long long)cr.blocks_moved);
  for (int tid = 0; tid < N_ALL; tid++)
    free(st[tid]);
  t_rmdir(root);
  return 0;
}
