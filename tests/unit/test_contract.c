/* SPDX-License-Identifier: MIT */
/*
 * tests/unit/test_contract.c — the contract of kvdb.h where outside acceptance tests found it
 * broken (issue 13 A, 1, 3, 4, 5, 6). One mode per item:
 *   readers   A: a process SIGKILLed inside a read transaction leaves no reader slot that pins
 *             old pages: 2,000 put+delete pairs keep catalog.mdb near its size without the kill
 *   reader-slots  A: 1,100 killed readers do not exhaust the 1,024 reader slots
 *   rdonly    1: a database another user owns: a read-write open is KVDB_READONLY naming
 *             KVDB_O_RDONLY; a KVDB_O_RDONLY open reads every context bit-exact (no lock file
 *             write); refused (KVDB_BUSY naming the lock file) while a process has it open, and
 *             its reads are refused once a writer commits
 *   mismatch  3: a known model id with another shape is KVDB_MISMATCH on every call
 *   overflow  4: size arithmetic on caller input (chain_hashes, get, lookup, get_tokens, ...)
 *   options   5: unknown flag bits, bad log level, use_direct_io / use_io_uring outside 0/1
 *   segments  6: a missing or truncated segment is KVDB_CORRUPT naming the file, everywhere
 */
#include "kvdb_test.h"

#include <errno.h>
#include <fcntl.h>
#include <lmdb.h>
#include <signal.h>
#include <stdint.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include "place/place.h"

static const kvdb_model M = {.id = "contract-model", .n_layers = 2, .n_kv_heads = 2,
                             .head_dim = 64, .dtype = KVDB_F16, .block_tokens = 16};

static kvdb_options opts(void)
{
  kvdb_options o;
  kvdb_options_init(&o);
  o.dram_bytes = 0; /* every read goes to the segments */
  o.segment_bytes = 1 << 20;
  o.sync_mode = KVDB_SYNC_NONE; /* no test here is about power loss */
  o.log_level = -1;
  return o;
}

static kvdb *open_db(const char *dir, uint32_t flags)
{
  kvdb_options o = opts();
  o.flags = flags;
  kvdb *db = NULL;
  ASSERT_OK(kvdb_open(dir, &o, &db));
  return db;
}

static void tokens_of(uint64_t seed, uint32_t *tok, size_t n)
{
  uint64_t s = seed * 7919 + 11;
  for (size_t i = 0; i < n; i++)
    tok[i] = (uint32_t)(t_rand(&s) % 30000);
}

static kvdb_key put_ctx(kvdb *db, uint64_t seed, size_t n)
{
  uint32_t *tok = malloc(n * sizeof *tok);
  tokens_of(seed, tok, n);
  kvdb_put_info info;
  t_put_kv(db, &M, tok, n, &info);
  free(tok);
  return info.context;
}

/* kvdb_get of context `seed`: the hit, with its bytes checked. */
static size_t get_ctx(kvdb *db, uint64_t seed, size_t n)
{
  uint32_t *tok = malloc(n * sizeof *tok);
  tokens_of(seed, tok, n);
  size_t hit = t_get_check(db, &M, tok, n);
  free(tok);
  return hit;
}

static uint64_t file_bytes(const char *dir, const char *name)
{
  char p[4200];
  snprintf(p, sizeof p, "%s/%s", dir, name);
  struct stat st;
  return stat(p, &st) == 0 ? (uint64_t)st.st_size : 0;
}

/* ---- A: stale reader slots ---------------------------------------------------------------- */

/* A child that opens the database, begins a read transaction as kvdb_lookup does (a catalog
 * snapshot), reads a block record in it, tells the parent, and waits to be SIGKILLed. */
static pid_t reader_child(const char *dir, uint64_t seed)
{
  int pfd[2];
  ASSERT(pipe(pfd) == 0);
  pid_t pid = fork();
  ASSERT(pid >= 0);
  if (pid == 0) {
    close(pfd[0]);
    kvdb *db = open_db(dir, 0);
    kv_txn *txn;
    if (kv_txn_begin(&db->cat, 0, &txn) != KVDB_OK)
      _exit(2);
    uint32_t tok[16];
    tokens_of(seed, tok, 16);
    size_t hit = 0; /* and a real lookup meanwhile: its own transaction comes and goes */
    if (kvdb_lookup(db, &M, tok, 16, &hit) != KVDB_OK || hit != 16)
      _exit(3);
    char c = 'r';
    if (write(pfd[1], &c, 1) != 1)
      _exit(4);
    for (;;)
      pause();
  }
  close(pfd[1]);
  char c;
  ASSERT_EQ(read(pfd[0], &c, 1), 1);
  close(pfd[0]);
  return pid;
}

static void kill_wait(pid_t pid)
{
  ASSERT(kill(pid, SIGKILL) == 0);
  int st;
  ASSERT(waitpid(pid, &st, 0) == pid);
  ASSERT(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL);
}

/* 2,000 put+delete pairs of 2-block contexts, after a reader was killed or not: the size of
 * catalog.mdb after them. */
static uint64_t churn(int kill_reader)
{
  char *dir = t_tmpdir("contract-churn");
  kvdb *db = open_db(dir, KVDB_O_CREATE);
  put_ctx(db, 1, 16);
  for (uint64_t i = 0; i < 50; i++)
    put_ctx(db, 1000 + i, 64); /* some contexts that stay */
  if (kill_reader)
    kill_wait(reader_child(dir, 1));
  for (uint64_t i = 0; i < 2000; i++) {
    kvdb_key k = put_ctx(db, 100000 + i, 32);
    ASSERT_OK(kvdb_delete(db, &k));
  }
  for (uint64_t i = 0; i < 50; i++)
    ASSERT_EQ(get_ctx(db, 1000 + i, 64), 64);
  kvdb_close(db);
  uint64_t bytes = file_bytes(dir, "catalog.mdb");
  t_rmdir(dir);
  return bytes;
}

/* A process that begins a read transaction through LMDB itself (no kvdb open, so nothing of
 * its own clears dead slots) and is SIGKILLed inside it. 'r' when its begin worked, 'f' when
 * the reader table was full. */
static char raw_reader_killed(const char *path)
{
  int pfd[2];
  ASSERT(pipe(pfd) == 0);
  pid_t pid = fork();
  ASSERT(pid >= 0);
  if (pid == 0) {
    close(pfd[0]);
    MDB_env *env;
    MDB_txn *txn;
    char c = 'r';
    if (mdb_env_create(&env) != 0 || mdb_env_set_maxreaders(env, 1024) != 0 ||
        mdb_env_set_maxdbs(env, 16) != 0 ||
        mdb_env_open(env, path, MDB_NOSUBDIR | MDB_NOTLS | MDB_RDONLY, 0644) != 0)
      c = 'o';
    else if (mdb_txn_begin(env, NULL, MDB_RDONLY, &txn) != 0)
      c = 'f';
    if (write(pfd[1], &c, 1) != 1)
      _exit(4);
    for (;;)
      pause();
  }
  close(pfd[1]);
  char c = 0;
  ASSERT_EQ(read(pfd[0], &c, 1), 1);
  close(pfd[0]);
  kill_wait(pid);
  ASSERT(c != 'o');
  return c;
}

/* 1,100 processes SIGKILLed inside a read transaction: more than the 1,024 slots. Once their
 * dead slots fill the table, a handle opened before them still reads (a begin that finds the
 * table full clears dead slots and retries), which frees the slots for the next ones; a new
 * handle opens and reads, and writes go on. */
static void killed_readers(void)
{
  char *dir = t_tmpdir("contract-slots");
  kvdb *db = open_db(dir, KVDB_O_CREATE);
  put_ctx(db, 7, 48);
  char path[4200];
  snprintf(path, sizeof path, "%s/catalog.mdb", dir);
  int full = 0;
  for (int i = 0; i < 1100; i++) {
    if (raw_reader_killed(path) == 'r')
      continue;
    full++; /* the table is full of dead slots: what the issue saw */
    ASSERT(i >= 1000);
    ASSERT_EQ(get_ctx(db, 7, 48), 48);
    ASSERT_EQ(raw_reader_killed(path), 'r');
  }
  ASSERT_EQ(full, 1);
  ASSERT_EQ(get_ctx(db, 7, 48), 48);
  kvdb *db2 = open_db(dir, KVDB_O_RDONLY);
  ASSERT_EQ(get_ctx(db2, 7, 48), 48);
  kvdb_close(db2);
  put_ctx(db, 8, 48);
  ASSERT_EQ(get_ctx(db, 8, 48), 48);
#ifdef KV_READER_CHECK_EVERY /* (absent before issue 13: the test then fails above) */
  ASSERT(atomic_load(&db->cat.stale_readers) >= 1000);
#endif
  kvdb_close(db);
  t_rmdir(dir);
}

static void test_readers(void)
{
  uint64_t plain = churn(0), killed = churn(1);
  printf("readers: catalog.mdb after 2,000 put+delete pairs: %llu bytes without a killed reader, "
         "%llu with one\n", (unsigned long long)plain, (unsigned long long)killed);
  fflush(stdout);
  ASSERT(killed < 4 * plain);
}

static void test_reader_slots(void)
{
  killed_readers();
  printf("reader-slots: 1,100 readers killed inside a read transaction: slots reclaimed\n");
}

/* ---- 1: read-only open of a database this user cannot write --------------------------------- */

#define OTHER_UID 54321 /* owns the database */
#define READER_UID 54322 /* may read it, not write it */

/* Run fn in a child whose uid is READER_UID; its exit status (0 = passed). */
static int as_reader(void (*fn)(const char *, int, int), const char *dir, int rfd, int wfd)
{
  pid_t pid = fork();
  ASSERT(pid >= 0);
  if (pid == 0) {
    if (setgid(READER_UID) != 0 || setuid(READER_UID) != 0)
      _exit(5);
    fn(dir, rfd, wfd);
    _exit(0);
  }
  int st;
  ASSERT(waitpid(pid, &st, 0) == pid);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

static void reader_reads(const char *dir, int rfd, int wfd)
{
  (void)rfd;
  (void)wfd;
  kvdb_options o = opts();
  o.flags = 0; /* read-write */
  kvdb *db = NULL;
  ASSERT_STATUS(KVDB_READONLY, kvdb_open(dir, &o, &db));
  ASSERT_MSG_HAS("KVDB_O_RDONLY");
  o.flags = KVDB_O_RDONLY;
  ASSERT_OK(kvdb_open(dir, &o, &db));
  for (uint64_t i = 0; i < 20; i++)
    ASSERT_EQ(get_ctx(db, 300 + i, 40 + i), 40 + i);
  uint32_t tok[64];
  tokens_of(300, tok, 40);
  size_t hit = 0;
  ASSERT_OK(kvdb_lookup(db, &M, tok, 40, &hit));
  ASSERT_EQ(hit, 40);
  kvdb_verify_report vr;
  ASSERT_OK(kvdb_verify(db, NULL, NULL, NULL, &vr));
  ASSERT_EQ(vr.contexts_checked, 20);
  kvdb_stats st;
  ASSERT_OK(kvdb_stat(db, &st));
  ASSERT_EQ(st.n_contexts, 20);
  kvdb_key k = {{0}};
  ASSERT_STATUS(KVDB_READONLY, kvdb_delete(db, &k));
  kvdb_close(db);
}

static void reader_refused_while_open(const char *dir, int rfd, int wfd)
{
  (void)rfd;
  (void)wfd;
  kvdb_options o = opts();
  o.flags = KVDB_O_RDONLY;
  kvdb *db = NULL;
  ASSERT_STATUS(KVDB_BUSY, kvdb_open(dir, &o, &db));
  ASSERT_MSG_HAS("catalog.mdb-lock");
  ASSERT_MSG_HAS("write access");
}

/* Opens read-only, tells the parent, which then writes; the next read is KVDB_BUSY. */
static void reader_sees_writer(const char *dir, int rfd, int wfd)
{
  kvdb *db = open_db(dir, KVDB_O_RDONLY);
  ASSERT_EQ(get_ctx(db, 300, 40), 40);
  char c = 'o';
  ASSERT_EQ(write(wfd, &c, 1), 1);
  ASSERT_EQ(read(rfd, &c, 1), 1); /* the parent wrote */
  uint32_t tok[40];
  tokens_of(300, tok, 40);
  size_t hit = 0;
  ASSERT_STATUS(KVDB_BUSY, kvdb_lookup(db, &M, tok, 40, &hit));
  ASSERT_MSG_HAS("reopen");
  kvdb_close(db);
  db = NULL;
  ASSERT_EQ(get_ctx(db = open_db(dir, KVDB_O_RDONLY), 999, 40), 40); /* reopened: the new state */
  kvdb_close(db);
}

static void test_rdonly(void)
{
  if (geteuid() != 0) {
    printf("rdonly: not root, cannot switch users: skipped\n");
    exit(T_EXIT_SKIP);
  }
  char *dir = t_tmpdir("contract-rdonly");
  kvdb *db = open_db(dir, KVDB_O_CREATE);
  for (uint64_t i = 0; i < 20; i++)
    put_ctx(db, 300 + i, 40 + i);
  kvdb_close(db);
  char cmd[4400];
  /* another user's database, readable by all; the lock file stays (LMDB leaves it) */
  snprintf(cmd, sizeof cmd, "chown -R %d:%d '%s' && chmod -R go-w,a+rX '%s'", OTHER_UID,
           OTHER_UID, dir, dir);
  ASSERT(system(cmd) == 0);
  ASSERT(file_bytes(dir, "catalog.mdb-lock") > 0);
  ASSERT_EQ(as_reader(reader_reads, dir, -1, -1), 0);
  /* a process (root here) has it open: a lock-free read could see pages it reuses */
  db = open_db(dir, 0);
  ASSERT_EQ(as_reader(reader_refused_while_open, dir, -1, -1), 0);
  kvdb_close(db);
  /* a writer comes after the read-only open: that handle's next read is refused */
  int to_child[2], to_parent[2];
  ASSERT(pipe(to_child) == 0 && pipe(to_parent) == 0);
  pid_t pid = fork();
  ASSERT(pid >= 0);
  if (pid == 0) {
    if (setgid(READER_UID) != 0 || setuid(READER_UID) != 0)
      _exit(5);
    reader_sees_writer(dir, to_child[0], to_parent[1]);
    _exit(0);
  }
  char c;
  ASSERT_EQ(read(to_parent[0], &c, 1), 1);
  db = open_db(dir, 0);
  put_ctx(db, 999, 40);
  kvdb_close(db);
  snprintf(cmd, sizeof cmd, "chown -R %d:%d '%s' && chmod -R go-w,a+rX '%s'", OTHER_UID,
           OTHER_UID, dir, dir);
  ASSERT(system(cmd) == 0);
  ASSERT_EQ(write(to_child[1], &c, 1), 1);
  int st;
  ASSERT(waitpid(pid, &st, 0) == pid);
  ASSERT(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  printf("rdonly: another user's database: read-write open KVDB_READONLY, read-only open reads "
         "20 contexts bit-exact; refused while a process has it open; reads refused after a "
         "writer committed\n");
  t_rmdir(dir);
}

/* ---- 3: a known id with another shape ------------------------------------------------------ */

static void expect_mismatch(kvdb_status rc, const char *call)
{
  if (rc != KVDB_MISMATCH || strstr(kvdb_errmsg(), "is stored with n_layers 2, n_kv_heads 2, "
                                                   "head_dim 64") == NULL ||
      strstr(kvdb_errmsg(), "this call has 2, 2, 128") == NULL) {
    fprintf(stderr, "%s: %s (%s), expected KVDB_MISMATCH naming both shapes\n", call,
            kvdb_status_name(rc), kvdb_errmsg());
    abort();
  }
}

static void test_mismatch(void)
{
  char *dir = t_tmpdir("contract-mismatch");
  kvdb *db = open_db(dir, KVDB_O_CREATE);
  kvdb_key ctx = put_ctx(db, 5, 40);
  kvdb_model m2 = M;
  m2.head_dim = 128; /* same id, another shape */
  uint32_t tok[40];
  tokens_of(5, tok, 40);
  size_t tb = kvdb_model_token_bytes(&m2);
  uint16_t *buf = calloc(40, tb);
  kvdb_kv_view v;
  ASSERT_OK(kvdb_kv_view_packed(&v, buf, &m2, 40, KVDB_LAYOUT_LKTHD));
  size_t hit = 7;
  expect_mismatch(kvdb_put(db, &m2, tok, 40, &v, NULL), "put");
  expect_mismatch(kvdb_lookup(db, &m2, tok, 40, &hit), "lookup");
  ASSERT_EQ(hit, 0);
  hit = 7;
  expect_mismatch(kvdb_get(db, &m2, tok, 40, &v, &hit), "get");
  ASSERT_EQ(hit, 0);
  uint32_t pos[2] = {0, 39};
  expect_mismatch(kvdb_get_tokens(db, &m2, &ctx, 0, pos, 2, &v), "get_tokens");
  expect_mismatch(kvdb_get_context(db, &m2, &ctx, &v, NULL, NULL), "get_context");
  kvdb_key bk = {{1, 2, 3}};
  expect_mismatch(kvdb_put_block(db, &m2, &bk, tok, 16, &v), "put_block");
  expect_mismatch(kvdb_get_block(db, &m2, &bk, NULL, 0, &v, NULL), "get_block");
  uint16_t krow[2 * 128], vrow[2 * 128];
  expect_mismatch(kvdb_get_head_tokens(db, &m2, &ctx, 0, 0, pos, 2, krow, vrow, NULL, NULL),
                  "get_head_tokens");
  kvdb_config lossless;
  ASSERT_OK(kvdb_config_parse("lossless", &lossless));
  expect_mismatch(kvdb_recompress(db, &m2, &ctx, &lossless, NULL), "recompress");
  expect_mismatch(kvdb_relocate(db, &m2, &ctx, NULL, KVDB_TIER_SSD, NULL), "relocate");
  expect_mismatch(kvdb_profile(db, &m2, &ctx, NULL), "profile");
  /* a context key that is not stored: still the model's shape first */
  kvdb_key none = {{9}};
  expect_mismatch(kvdb_get_context(db, &m2, &none, &v, NULL, NULL), "get_context (absent)");
  /* the right shape still works; an unknown id is a miss, not an error */
  ASSERT_EQ(get_ctx(db, 5, 40), 40);
  kvdb_model m3 = m2;
  m3.id = "never-stored";
  ASSERT_OK(kvdb_lookup(db, &m3, tok, 40, &hit));
  ASSERT_EQ(hit, 0);
  free(buf);
  kvdb_close(db);
  t_rmdir(dir);
  printf("mismatch: 12 calls with a known id and another shape: KVDB_MISMATCH naming both\n");
}

/* ---- 4: size arithmetic on caller input ----------------------------------------------------- */

static void test_overflow(void)
{
  uint32_t tok[64] = {0};
  kvdb_key h[2];
  for (size_t n = SIZE_MAX - 14;; n++) { /* (n + 15) / 16 wrapped to 0 or 1 */
    memset(h, 0xa5, sizeof h);
    ASSERT_STATUS(KVDB_INVALID, kvdb_chain_hashes(&M, tok, n, h, 2));
    ASSERT_MSG_HAS("hashes_cap 2");
    for (size_t i = 0; i < sizeof h; i++)
      ASSERT(((uint8_t *)h)[i] == 0xa5);
    if (n == SIZE_MAX)
      break;
  }
  ASSERT_OK(kvdb_chain_hashes(&M, tok, 32, h, 2));
  ASSERT_STATUS(KVDB_INVALID, kvdb_chain_hashes(&M, tok, 33, h, 2));
  kvdb_kv_view v;
  uint16_t dummy[8];
  ASSERT_STATUS(KVDB_INVALID, kvdb_kv_view_packed(&v, dummy, &M, SIZE_MAX / 2, KVDB_LAYOUT_LKTHD));
  ASSERT_MSG_HAS("n_tokens");
  ASSERT_STATUS(KVDB_INVALID, kvdb_kv_view_packed(&v, dummy, &M, SIZE_MAX, KVDB_LAYOUT_LKHTD));

  char *dir = t_tmpdir("contract-overflow");
  kvdb *db = open_db(dir, KVDB_O_CREATE);
  kvdb_key ctx = put_ctx(db, 3, 40);
  uint16_t *buf = calloc(64, kvdb_model_token_bytes(&M));
  ASSERT_OK(kvdb_kv_view_packed(&v, buf, &M, 64, KVDB_LAYOUT_LKTHD));
  size_t big = (size_t)UINT32_MAX * 16 + 1, hit = 0;
  /* n past any storable context: refused before a token is read (tok has 64) */
  ASSERT_STATUS(KVDB_INVALID, kvdb_put(db, &M, tok, big, &v, NULL));
  ASSERT_MSG_HAS("too large");
  ASSERT_STATUS(KVDB_INVALID, kvdb_lookup(db, &M, tok, big, &hit));
  ASSERT_MSG_HAS("too large");
  ASSERT_STATUS(KVDB_INVALID, kvdb_get(db, &M, tok, big, &v, &hit));
  ASSERT_MSG_HAS("too large");
  ASSERT_STATUS(KVDB_INVALID, kvdb_lookup(db, &M, tok, SIZE_MAX, &hit));
  ASSERT_STATUS(KVDB_INVALID, kvdb_get(db, &M, tok, SIZE_MAX, &v, &hit));
  /* n_pos whose row table would wrap */
  uint32_t pos[1] = {0};
  ASSERT_STATUS(KVDB_INVALID, kvdb_get_tokens(db, &M, &ctx, 0, pos, SIZE_MAX / 2, &v));
  ASSERT_MSG_HAS("n_pos");
  /* a view whose strides overflow int64 offsets */
  kvdb_kv_view bad = v;
  bad.k.token_stride = INT64_MAX / 8;
  ASSERT_STATUS(KVDB_INVALID, kvdb_get(db, &M, tok, 40, &bad, &hit));
  ASSERT_MSG_HAS("2^63");
  ASSERT_STATUS(KVDB_INVALID, kvdb_put(db, &M, tok, 40, &bad, NULL));
  ASSERT_STATUS(KVDB_INVALID, kvdb_get_tokens(db, &M, &ctx, 0, pos, 16, &bad));
  ASSERT_STATUS(KVDB_INVALID, kvdb_get_context(db, &M, &ctx, &bad, NULL, NULL));
  bad = v;
  bad.v.layer_stride = INT64_MIN + 1;
  ASSERT_STATUS(KVDB_INVALID, kvdb_get(db, &M, tok, 40, &bad, &hit));
  ASSERT_EQ(get_ctx(db, 3, 40), 40);
  free(buf);
  kvdb_close(db);
  t_rmdir(dir);
  printf("overflow: chain_hashes n = SIZE_MAX-14..SIZE_MAX, view_packed, put/lookup/get n, "
         "get_tokens n_pos, view strides: KVDB_INVALID\n");
}

/* ---- 5: strict options --------------------------------------------------------------------- */

static void bad_option(const char *dir, kvdb_options o, const char *field)
{
  kvdb *db = (kvdb *)1;
  ASSERT_STATUS(KVDB_INVALID, kvdb_open(dir, &o, &db));
  ASSERT(db == NULL);
  ASSERT_MSG_HAS(field);
}

static void test_options(void)
{
  char *dir = t_tmpdir("contract-options");
  kvdb_options o = opts();
  o.flags = KVDB_O_CREATE | (1u << 7);
  bad_option(dir, o, "options.flags");
  o = opts();
  o.flags = 1u << 31;
  bad_option(dir, o, "options.flags");
  o = opts();
  o.log_level = -2;
  bad_option(dir, o, "options.log_level");
  o.log_level = INT32_MIN;
  bad_option(dir, o, "options.log_level");
  o.log_level = 4;
  bad_option(dir, o, "options.log_level");
  o = opts();
  o.use_direct_io = 2;
  bad_option(dir, o, "options.use_direct_io");
  o.use_direct_io = -1;
  bad_option(dir, o, "options.use_direct_io");
  o = opts();
  o.use_io_uring = 2;
  bad_option(dir, o, "options.use_io_uring");
  o.use_io_uring = -1;
  bad_option(dir, o, "options.use_io_uring");
  /* nothing was created by the refused opens */
  ASSERT_EQ(file_bytes(dir, "catalog.mdb"), 0);
  /* the options of calls: kvdb_profile's put options as kvdb_put_ex's, score options' tiers */
  kvdb *db = open_db(dir, KVDB_O_CREATE);
  kvdb_key ctx = put_ctx(db, 11, 32);
  kvdb_put_opts po;
  kvdb_put_opts_init(&po);
  po.flags = 1u << 9;
  ASSERT_STATUS(KVDB_INVALID, kvdb_profile(db, &M, &ctx, &po));
  ASSERT_MSG_HAS("opts->flags");
  kvdb_put_opts_init(&po);
  po.struct_size = 4;
  ASSERT_STATUS(KVDB_INVALID, kvdb_profile(db, &M, &ctx, &po));
  ASSERT_MSG_HAS("opts->struct_size");
  kvdb_score_opts so;
  kvdb_score_opts_init(&so);
  so.device_tiers = 1u << 5;
  uint32_t pos[1] = {3};
  uint16_t kr[64], vr[64];
  ASSERT_STATUS(KVDB_INVALID, kvdb_get_head_tokens(db, &M, &ctx, 0, 0, pos, 1, kr, vr, &so, NULL));
  ASSERT_MSG_HAS("opts->device_tiers");
  so.device_tiers = 1u << KVDB_TIER_SSD;
  ASSERT_OK(kvdb_get_head_tokens(db, &M, &ctx, 0, 0, pos, 1, kr, vr, &so, NULL));
  kvdb_close(db);
  /* the documented values open */
  for (int lvl = -1; lvl <= 3; lvl++)
    for (int b = 0; b < 4; b++) {
      o = opts();
      o.log_level = lvl;
      o.use_direct_io = b & 1;
      o.use_io_uring = b >> 1;
      ASSERT_OK(kvdb_open(dir, &o, &db));
      kvdb_close(db);
    }
  t_rmdir(dir);
  printf("options: unknown flag bits, log_level outside -1..3, use_direct_io and use_io_uring "
         "outside 0/1, profile's put options, score options' device_tiers: KVDB_INVALID naming "
         "the field\n");
}

/* ---- 6: missing or truncated segments -------------------------------------------------------- */

static const kvdb_model MS = {.id = "contract-score", .n_layers = 2, .n_kv_heads = 2,
                              .head_dim = 64, .dtype = KVDB_F16, .block_tokens = 16,
                              .score_bits = 8};

/* Every segment file of dir: removed (truncate_to < 0) or cut to truncate_to bytes. */
static void damage_segments(const char *dir, long truncate_to)
{
  char cmd[4400];
  if (truncate_to < 0)
    snprintf(cmd, sizeof cmd, "rm -f '%s'/ssd/seg-*.kvs", dir);
  else
    snprintf(cmd, sizeof cmd, "for f in '%s'/ssd/seg-*.kvs; do truncate -s %ld \"$f\"; done", dir,
             truncate_to);
  ASSERT(system(cmd) == 0);
}

static int problems_ok;
static void on_problem(void *ctx, const kvdb_problem *p)
{
  const char *want = ctx;
  if (p->status != KVDB_CORRUPT || strstr(p->message, want) == NULL) {
    fprintf(stderr, "verify problem %s '%s', expected KVDB_CORRUPT naming '%s'\n",
            kvdb_status_name(p->status), p->message, want);
    abort();
  }
  problems_ok++;
}

static void expect_corrupt(kvdb_status rc, const char *want, const char *call)
{
  if (rc != KVDB_CORRUPT || strstr(kvdb_errmsg(), want) == NULL) {
    fprintf(stderr, "%s: %s (%s), expected KVDB_CORRUPT naming '%s'\n", call,
            kvdb_status_name(rc), kvdb_errmsg(), want);
    abort();
  }
}

static void segments_case(long truncate_to)
{
  const char *want = truncate_to < 0 ? "is missing" : "past the file's end";
  char *dir = t_tmpdir("contract-segments");
  kvdb *db = open_db(dir, KVDB_O_CREATE);
  kvdb_key c[8];
  for (int i = 0; i < 8; i++)
    c[i] = put_ctx(db, 500 + i, 40);
  /* a scoring context */
  uint32_t stok[32];
  tokens_of(77, stok, 32);
  uint16_t *sbuf = malloc(32 * kvdb_model_token_bytes(&MS));
  t_fill_kv(&MS, stok, 32, sbuf);
  kvdb_kv_view sv;
  ASSERT_OK(kvdb_kv_view_packed(&sv, sbuf, &MS, 32, KVDB_LAYOUT_LKTHD));
  kvdb_put_info si;
  ASSERT_OK(kvdb_put(db, &MS, stok, 32, &sv, &si));
  kvdb_key bk = {{4, 5, 6}};
  ASSERT_OK(kvdb_put_block(db, &M, &bk, stok, 16, &sv));
  kvdb_close(db);
  damage_segments(dir, truncate_to);

  db = open_db(dir, 0);
  uint16_t *buf = calloc(64, kvdb_model_token_bytes(&M));
  kvdb_kv_view v;
  ASSERT_OK(kvdb_kv_view_packed(&v, buf, &M, 64, KVDB_LAYOUT_LKTHD));
  uint32_t pos[3] = {0, 17, 39};
  expect_corrupt(kvdb_get_tokens(db, &M, &c[0], 1, pos, 3, &v), want, "get_tokens");
  expect_corrupt(kvdb_get_context(db, &M, &c[1], &v, NULL, NULL), want, "get_context");
  expect_corrupt(kvdb_get_block(db, &M, &bk, NULL, 0, &v, NULL), want, "get_block");
  uint32_t top[4];
  float q[64];
  for (int i = 0; i < 64; i++)
    q[i] = (float)(i % 7) - 3.0f;
  expect_corrupt(kvdb_score(db, &MS, &si.context, 0, 0, q, KVDB_F32, 4, top, NULL), want,
                 "score");
  uint16_t kr[3 * 64], vr[3 * 64];
  uint32_t spos[3] = {0, 5, 31};
  expect_corrupt(kvdb_get_head_tokens(db, &MS, &si.context, 0, 0, spos, 3, kr, vr, NULL, NULL),
                 want, "get_head_tokens");
  kvdb_config lossless;
  ASSERT_OK(kvdb_config_parse("lossless", &lossless));
  expect_corrupt(kvdb_recompress(db, &M, &c[2], &lossless, NULL), want, "recompress");
  expect_corrupt(kvdb_relocate(db, &M, &c[3], &lossless, KVDB_TIER_SSD, NULL), want, "relocate");
  /* kvdb_get: a block that fails ends the hit (OK, shorter), counted as corrupt */
  uint32_t tok[40];
  tokens_of(504, tok, 40);
  size_t hit = 9;
  ASSERT_OK(kvdb_get(db, &M, tok, 40, &v, &hit));
  ASSERT_EQ(hit, 0);
  kvdb_stats st;
  ASSERT_OK(kvdb_stat(db, &st));
  ASSERT(st.corrupt_blocks > 0);
  /* verify: every problem CORRUPT and named */
  problems_ok = 0;
  kvdb_verify_report rep;
  expect_corrupt(kvdb_verify(db, on_problem, NULL, (void *)want, &rep), "problems found",
                 "verify");
  ASSERT(problems_ok > 0 && (uint64_t)problems_ok <= rep.problems);
  /* compaction: delete most contexts so that the segment qualifies; its damaged blocks stay */
  for (int i = 0; i < 7; i++)
    ASSERT_OK(kvdb_delete(db, &c[i]));
  ASSERT_OK(kvdb_delete(db, &si.context));
  kvdb_compact_report cr;
  if (truncate_to >= 0)
    expect_corrupt(kvdb_compact(db, 1.0, NULL, NULL, &cr), want, "compact");
  else /* a missing file's segment stays open (recovery logs it): nothing there to compact */
    ASSERT_OK(kvdb_compact(db, 1.0, NULL, NULL, &cr));
  kvdb_close(db);
  free(buf);
  free(sbuf);
  t_rmdir(dir);
}

static void test_segments(void)
{
  segments_case(-1);
  printf("segments: a missing segment file: KVDB_CORRUPT 'is missing' from get_tokens, "
         "get_context, get_block, score, get_head_tokens, recompress, relocate, verify\n");
  segments_case(8192);
  printf("segments: a truncated segment file: KVDB_CORRUPT 'past the file's end' from the same and "
         "compact\n");
}

int main(int argc, char **argv)
{
  const char *mode = argc > 1 ? argv[1] : "readers";
  if (strcmp(mode, "readers") == 0)
    test_readers();
  else if (strcmp(mode, "reader-slots") == 0)
    test_reader_slots();
  else if (strcmp(mode, "rdonly") == 0)
    test_rdonly();
  else if (strcmp(mode, "mismatch") == 0)
    test_mismatch();
  else if (strcmp(mode, "overflow") == 0)
    test_overflow();
  else if (strcmp(mode, "options") == 0)
    test_options();
  else if (strcmp(mode, "segments") == 0)
    test_segments();
  else {
    fprintf(stderr, "unknown mode '%s'\n", mode);
    return T_EXIT_FAIL;
  }
  return T_EXIT_PASS;
}
