/* SPDX-License-Identifier: MIT */
/*
 * tests/unit/test_space.c — space over time (issue 13, E and 7): test_space CASE
 *
 *   map-grow   the LMDB map grows: opened with a 1 MiB catalog_map_bytes, puts go on past it
 *              (every one OK, all read back, threads reading meanwhile), and a second process
 *              that opened the database before the growth reads them all (it adopts the map)
 *   catalog    the catalog stays within 1.3x of a fresh fill over delete-and-compact cycles
 *   full-disk  on a filesystem that fills up (a 24 MiB tmpfs in a private mount namespace,
 *              root or a user namespace; skips otherwise): puts fail KVDB_FULL, deleting half
 *              the contexts and compacting succeeds, frees space, and puts work again
 *   crash-vacuum a child opens a copy of a database whose catalog kvdb_compact rewrites
 *              (the vacuum) and compacts; it is SIGKILLed at a random moment over the
 *              compaction's and the rewrite's duration (30 rounds; KVDB_SLOW=1: 200;
 *              KVDB_CRASH_ITERS=N: N; KVDB_TEST_SEED: the kill delays' seed). The copy
 *              then opens, verifies clean, every live context reads back bit-exact, every
 *              deleted one misses, and a stray catalog.mdb.vacuum does no harm: puts and a
 *              compaction (which rewrites the catalog again) work on it
 */
#include "kvdb_test.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <signal.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* 2 blocks of 128 tokens: a block record is 584 bytes, an object two 4 KiB pages */
static const kvdb_model M = {"space-model", 1, 1, 8, KVDB_F16, 128};
#define NT 256

static void ctx_tokens(int i, uint32_t *tok)
{
  uint64_t s = 1000003ull * (uint64_t)(i + 1);
  for (int k = 0; k < NT; k++)
    tok[k] = (uint32_t)(t_rand(&s) % 30000);
}

static kvdb_status put_i(kvdb *db, int i)
{
  uint32_t tok[NT];
  uint16_t buf[NT * 16];
  ctx_tokens(i, tok);
  t_fill_kv(&M, tok, NT, buf);
  kvdb_kv_view v;
  kvdb_kv_view_packed(&v, buf, &M, NT, KVDB_LAYOUT_LKTHD);
  return kvdb_put(db, &M, tok, NT, &v, NULL);
}

static int intact(kvdb *db, int i)
{
  uint32_t tok[NT];
  uint16_t buf[NT * 16];
  ctx_tokens(i, tok);
  memset(buf, 0, sizeof buf);
  kvdb_kv_view v;
  kvdb_kv_view_packed(&v, buf, &M, NT, KVDB_LAYOUT_LKTHD);
  size_t hit = 0;
  kvdb_status rc = kvdb_get(db, &M, tok, NT, &v, &hit);
  return rc == KVDB_OK && hit == NT && t_check_kv(&M, tok, NT, NT, buf) == NT;
}

static kvdb_status del_i(kvdb *db, int i)
{
  uint32_t tok[NT];
  ctx_tokens(i, tok);
  kvdb_key h[2];
  kvdb_status rc = kvdb_chain_hashes(&M, tok, NT, h, 2);
  return rc == KVDB_OK ? kvdb_delete(db, &h[1]) : rc;
}

static uint64_t file_bytes(const char *dir, const char *name)
{
  char p[4200];
  struct stat st;
  snprintf(p, sizeof p, "%s/%s", dir, name);
  return stat(p, &st) == 0 ? (uint64_t)st.st_size : 0;
}

static kvdb_options opts(void)
{
  kvdb_options o;
  kvdb_options_init(&o);
  o.dram_bytes = 0;
  o.segment_bytes = 1 << 20;
  o.sync_mode = KVDB_SYNC_NONE;
  o.log_level = getenv("KVDB_TEST_DEBUG") ? 2 : -1;
  return o;
}

/* ---- map-grow ---- */

#define GROW_N 1500 /* 3,000 block records of 584 bytes: ~2 MiB of catalog, twice the map */

typedef struct reader_arg {
  kvdb *db;
  _Atomic int stop;
  _Atomic long reads, bad;
  _Atomic int first; /* reader_live: the context it reads (-1: none yet) */
} reader_arg;

static void *reader(void *p)
{
  reader_arg *a = p;
  while (!a->stop) {
    for (int i = 0; i < 10; i++) {
      a->reads++;
      if (!intact(a->db, i))
        a->bad++;
    }
  }
  return NULL;
}

/* reads context `first` (stored all along) until stopped */
static void *reader_live(void *p)
{
  reader_arg *a = p;
  while (!a->stop) {
    a->reads++;
    if (a->first >= 0 && !intact(a->db, a->first))
      a->bad++;
  }
  return NULL;
}

static void wait_byte(int fd)
{
  char c;
  ASSERT(read(fd, &c, 1) == 1);
}

static void test_map_grow(void)
{
  char *dir = t_tmpdir("mapgrow");
  int to_child[2], to_parent[2];
  ASSERT(pipe(to_child) == 0 && pipe(to_parent) == 0);
  pid_t pid = fork();
  ASSERT(pid >= 0);
  if (pid == 0) { /* the second process: opens before the growth, reads everything after */
    close(to_child[1]);
    close(to_parent[0]);
    wait_byte(to_child[0]);
    kvdb_options o = opts();
    o.catalog_map_bytes = 1 << 20;
    kvdb *db;
    ASSERT_OK(kvdb_open(dir, &o, &db));
    for (int i = 0; i < 10; i++)
      ASSERT(intact(db, i));
    ASSERT(write(to_parent[1], "r", 1) == 1);
    wait_byte(to_child[0]);
    for (int i = 0; i < GROW_N; i++)
      ASSERT(intact(db, i));
    ASSERT_OK(put_i(db, GROW_N)); /* and writes in the grown map */
    kvdb_close(db);
    _exit(0);
  }
  close(to_child[0]);
  close(to_parent[1]);
  kvdb_options o = opts();
  o.catalog_map_bytes = 1 << 20;
  kvdb *db;
  ASSERT_OK(kvdb_open(dir, &o, &db));
  for (int i = 0; i < 10; i++)
    ASSERT_OK(put_i(db, i));
  ASSERT(write(to_child[1], "1", 1) == 1);
  wait_byte(to_parent[0]);
  /* threads read all along: a resize waits for their transactions and holds new ones back */
  reader_arg ra = {.db = db};
  pthread_t th[2];
  for (int t = 0; t < 2; t++)
    ASSERT(pthread_create(&th[t], NULL, reader, &ra) == 0);
  for (int i = 10; i < GROW_N; i++) {
    kvdb_status rc = put_i(db, i);
    if (rc != KVDB_OK)
      fprintf(stderr, "put %d: %s: %s\n", i, kvdb_status_name(rc), kvdb_errmsg());
    ASSERT_OK(rc);
  }
  ra.stop = 1;
  for (int t = 0; t < 2; t++)
    pthread_join(th[t], NULL);
  ASSERT(ra.reads > 0);
  ASSERT_EQ(ra.bad, 0);
  uint64_t cat = file_bytes(dir, "catalog.mdb");
  printf("map-grow: %d puts into a 1 MiB map: catalog.mdb %llu bytes; %ld reads meanwhile\n",
         GROW_N, (unsigned long long)cat, ra.reads);
  ASSERT(cat > (1u << 20)); /* it did have to grow */
  for (int i = 0; i < GROW_N; i++)
    ASSERT(intact(db, i));
  ASSERT(write(to_child[1], "2", 1) == 1);
  int st = 0;
  ASSERT(waitpid(pid, &st, 0) == pid);
  ASSERT(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  ASSERT(intact(db, GROW_N)); /* the child's put */
  ASSERT_OK(kvdb_verify(db, NULL, NULL, NULL, NULL));
  kvdb_close(db);
  /* a reopen with the small map again works (LMDB takes at least the data's size) */
  ASSERT_OK(kvdb_open(dir, &o, &db));
  ASSERT_OK(put_i(db, GROW_N + 1));
  for (int i = 0; i <= GROW_N + 1; i += 97)
    ASSERT(intact(db, i));
  kvdb_close(db);
  t_rmdir(dir);
}

/* ---- catalog ---- */

#define CAT_N 6000 /* 12,000 blocks: a catalog of ~10 MB */

static double per_live_block(const char *dir, int n_live)
{
  return (double)file_bytes(dir, "catalog.mdb") / (2.0 * n_live);
}

static void test_catalog(void)
{
  char *dir = t_tmpdir("catcycle");
  kvdb_options o = opts();
  kvdb *db;
  ASSERT_OK(kvdb_open(dir, &o, &db));
  static uint8_t live[4 * CAT_N];
  int next = 0, n_live = 0;
  for (; next < CAT_N; next++, n_live++) {
    ASSERT_OK(put_i(db, next));
    live[next] = 1;
  }
  double fresh = per_live_block(dir, n_live);
  printf("catalog: fresh fill %.0f B per block\n", fresh);
  uint64_t rnd = 5;
  /* a second process has the database open: the catalog is not rewritten under it */
  int to_child[2], to_parent[2];
  ASSERT(pipe(to_child) == 0 && pipe(to_parent) == 0);
  pid_t pid = fork();
  ASSERT(pid >= 0);
  if (pid == 0) {
    kvdb *cdb;
    ASSERT_OK(kvdb_open(dir, &o, &cdb));
    ASSERT(write(to_parent[1], "o", 1) == 1);
    wait_byte(to_child[0]);
    for (int i = 0; i < CAT_N; i += 7) /* the parent never deletes these */
      ASSERT(intact(cdb, i));
    ASSERT_OK(kvdb_verify(cdb, NULL, NULL, NULL, NULL));
    kvdb_close(cdb);
    _exit(0);
  }
  wait_byte(to_parent[0]);
  for (int cycle = 0; cycle < 3; cycle++) {
    /* delete a random half, compact (reader threads on the handle meanwhile), check, refill */
    int target = n_live / 2;
    while (n_live > target) {
      int i = (int)(t_rand(&rnd) % (uint64_t)next);
      if (!live[i] || i % 7 == 0) /* every 7th stays: the other process reads them */
        continue;
      ASSERT_OK(del_i(db, i));
      live[i] = 0;
      n_live--;
    }
    reader_arg ra = {.db = db, .first = -1};
    int first_live = 0;
    while (!live[first_live])
      first_live++;
    pthread_t th[2];
    for (int t = 0; t < 2; t++)
      ASSERT(pthread_create(&th[t], NULL, reader_live, &ra) == 0);
    ra.first = first_live;
    kvdb_compact_report cr;
    ASSERT_OK(kvdb_compact(db, 0.75, NULL, NULL, &cr));
    ra.stop = 1;
    for (int t = 0; t < 2; t++)
      pthread_join(th[t], NULL);
    ASSERT_EQ(ra.bad, 0);
    double now = per_live_block(dir, n_live);
    printf("catalog: cycle %d: %d live contexts after delete half + compact: %.0f B per live "
           "block, %.2fx the fresh fill%s\n", cycle + 1, n_live, now, now / fresh,
           cycle == 0 ? " (another process has it open: not rewritten)" : "");
    if (cycle == 0) {
      ASSERT(now / fresh > 1.5); /* left as it was while the other process reads */
      ASSERT(write(to_child[1], "c", 1) == 1);
      int st = 0;
      ASSERT(waitpid(pid, &st, 0) == pid);
      ASSERT(WIFEXITED(st) && WEXITSTATUS(st) == 0);
      kvdb *db2; /* another handle in this process: not rewritten either */
      ASSERT_OK(kvdb_open(dir, &o, &db2));
      ASSERT_OK(kvdb_compact(db, 0.75, NULL, NULL, &cr));
      ASSERT(per_live_block(dir, n_live) / fresh > 1.5);
      ASSERT(intact(db2, first_live));
      kvdb_close(db2);
      ASSERT_OK(kvdb_compact(db, 0.75, NULL, NULL, &cr)); /* now the only user */
      now = per_live_block(dir, n_live);
      printf("catalog: cycle 1 again, the only user: %.0f B per live block, %.2fx\n", now,
             now / fresh);
    }
    ASSERT(now <= 1.3 * fresh);
    for (int i = 0; i < next; i += 3)
      ASSERT(intact(db, i) == live[i]);
    size_t hit;
    uint32_t tok[NT];
    ctx_tokens(first_live, tok);
    ASSERT_OK(kvdb_lookup(db, &M, tok, NT, &hit));
    ASSERT_EQ(hit, NT);
    ASSERT_OK(kvdb_verify(db, NULL, NULL, NULL, NULL));
    while (n_live < CAT_N) {
      ASSERT_OK(put_i(db, next));
      live[next++] = 1;
      n_live++;
    }
    now = per_live_block(dir, n_live);
    printf("catalog: cycle %d refilled to %d contexts: %.0f B per block, %.2fx\n", cycle + 1,
           n_live, now, now / fresh);
    ASSERT(now <= 1.3 * fresh);
  }
  kvdb_close(db);
  ASSERT_OK(kvdb_open(dir, &o, &db));
  for (int i = 0; i < next; i += 5)
    ASSERT(intact(db, i) == live[i]);
  ASSERT_OK(kvdb_verify(db, NULL, NULL, NULL, NULL));
  kvdb_close(db);
  t_rmdir(dir);
}

/* ---- full-disk ---- */

static uint64_t fs_free(const char *dir)
{
  struct statvfs sv;
  return statvfs(dir, &sv) == 0 ? (uint64_t)sv.f_bavail * sv.f_frsize : 0;
}

#define FULL_MAX 4000

/* In the child, inside its own mount namespace with a small tmpfs at `dir`. */
static int full_disk_run(const char *dir)
{
  kvdb_options o = opts();
  o.sync_mode = KVDB_SYNC_FULL;
  o.catalog_map_bytes = 8 << 20;
  kvdb *db;
  ASSERT_OK(kvdb_open(dir, &o, &db));
  static uint8_t live[FULL_MAX + 64];
  int n = 0;
  kvdb_status rc = KVDB_OK;
  for (; n < FULL_MAX && (rc = put_i(db, n)) == KVDB_OK; n++)
    live[n] = 1;
  printf("full-disk: %d contexts stored, then %s (%s); %llu bytes free\n", n,
         kvdb_status_name(rc), kvdb_errmsg(), (unsigned long long)fs_free(dir));
  ASSERT_STATUS(KVDB_FULL, rc);
  ASSERT(n > 100);
  ASSERT_STATUS(KVDB_FULL, put_i(db, n)); /* still full */
  /* delete half: every other context */
  int n_live = n;
  for (int i = 0; i < n; i += 2) {
    ASSERT_OK(del_i(db, i));
    live[i] = 0;
    n_live--;
  }
  uint64_t free0 = fs_free(dir);
  kvdb_compact_report cr;
  rc = kvdb_compact(db, 0.75, NULL, NULL, &cr); /* half live: under 0.75 */
  if (rc != KVDB_OK)
    fprintf(stderr, "compact: %s: %s\n", kvdb_status_name(rc), kvdb_errmsg());
  ASSERT_OK(rc);
  uint64_t free1 = fs_free(dir);
  printf("full-disk: deleted half (%d left); compact: %llu segments rewritten, %llu blocks "
         "moved; free %llu -> %llu bytes\n", n_live, (unsigned long long)cr.segments_rewritten,
         (unsigned long long)cr.blocks_moved, (unsigned long long)free0,
         (unsigned long long)free1);
  ASSERT(cr.segments_rewritten > 0);
  ASSERT(free1 > free0 + (4u << 20)); /* space came back */
  for (int i = 0; i < n; i++)
    ASSERT(intact(db, i) == live[i]);
  /* puts work again */
  int more = 0;
  for (; more < n / 4; more++)
    ASSERT_OK(put_i(db, n + 10 + more));
  ASSERT_OK(kvdb_verify(db, NULL, NULL, NULL, NULL));
  kvdb_close(db);
  ASSERT_OK(kvdb_open(dir, &o, &db));
  for (int i = 0; i < n; i++)
    ASSERT(intact(db, i) == live[i]);
  for (int i = 0; i < more; i++)
    ASSERT(intact(db, n + 10 + i));
  kvdb_close(db);
  printf("full-disk: %d more puts after the compaction, all read back\n", more);
  return 0;
}

/* A private mount namespace (root; else a user namespace) with a 24 MiB tmpfs at dir. */
static int private_tmpfs(const char *dir)
{
  if (unshare(CLONE_NEWNS) != 0) {
    uid_t uid = getuid();
    gid_t gid = getgid();
    if (unshare(CLONE_NEWUSER | CLONE_NEWNS) != 0)
      return -1;
    char buf[64];
    FILE *f = fopen("/proc/self/setgroups", "w");
    if (f != NULL) {
      fputs("deny", f);
      fclose(f);
    }
    snprintf(buf, sizeof buf, "0 %u 1", (unsigned)uid);
    f = fopen("/proc/self/uid_map", "w");
    if (f == NULL || fputs(buf, f) < 0 || fclose(f) != 0)
      return -1;
    snprintf(buf, sizeof buf, "0 %u 1", (unsigned)gid);
    f = fopen("/proc/self/gid_map", "w");
    if (f == NULL || fputs(buf, f) < 0 || fclose(f) != 0)
      return -1;
  }
  if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0)
    return -1;
  return mount("tmpfs", dir, "tmpfs", 0, "size=24m,mode=0755");
}

static int test_full_disk(void)
{
  char *dir = t_tmpdir("fulldisk");
  pid_t pid = fork();
  ASSERT(pid >= 0);
  if (pid == 0) {
    if (private_tmpfs(dir) != 0) {
      fprintf(stderr, "full-disk: cannot mount a tmpfs in a private namespace (%s): skipped\n",
              strerror(errno));
      _exit(T_EXIT_SKIP);
    }
    _exit(full_disk_run(dir));
  }
  int st = 0;
  ASSERT(waitpid(pid, &st, 0) == pid);
  t_rmdir(dir);
  ASSERT(WIFEXITED(st));
  if (WEXITSTATUS(st) == T_EXIT_SKIP)
    return T_EXIT_SKIP;
  ASSERT_EQ(WEXITSTATUS(st), 0);
  return 0;
}

/* ---- crash-vacuum ---- */

#define VAC_N 1500 /* 3,000 block records: a catalog of ~4 MB; half deleted, it is rewritten */

static double now_s(void)
{
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static int file_exists(const char *dir, const char *name)
{
  char p[4200];
  struct stat st;
  snprintf(p, sizeof p, "%s/%s", dir, name);
  return stat(p, &st) == 0;
}

static void copy_dir(const char *from, const char *to)
{
  char cmd[9000];
  snprintf(cmd, sizeof cmd, "cp -a '%s/.' '%s/'", from, to);
  ASSERT(system(cmd) == 0);
}

/* The child: open `dir`, say so on wfd ('o'), compact with `threshold` (0.75: segments are
 * rewritten, then the catalog; 1e-6: no segment is, the catalog is), say so ('d'), then wait
 * to be killed with the handle open. */
static void vac_child(const char *dir, int wfd, double threshold)
{
  kvdb_options o = opts();
  kvdb *db;
  if (kvdb_open(dir, &o, &db) != KVDB_OK)
    _exit(3);
  if (write(wfd, "o", 1) != 1)
    _exit(4);
  if (kvdb_compact(db, threshold, NULL, NULL, NULL) != KVDB_OK) {
    fprintf(stderr, "child: compact: %s\n", kvdb_errmsg());
    _exit(5);
  }
  if (write(wfd, "d", 1) != 1)
    _exit(4);
  for (;;)
    pause();
}

/* Start vac_child on `dir`; returns once it has opened the database (*rfd: its pipe). */
static pid_t vac_start(const char *dir, double threshold, int *rfd)
{
  int pfd[2];
  ASSERT(pipe(pfd) == 0);
  pid_t pid = fork();
  ASSERT(pid >= 0);
  if (pid == 0) {
    close(pfd[0]);
    vac_child(dir, pfd[1], threshold);
  }
  close(pfd[1]);
  char b;
  ASSERT(read(pfd[0], &b, 1) == 1 && b == 'o');
  ASSERT(fcntl(pfd[0], F_SETFL, O_NONBLOCK) == 0);
  *rfd = pfd[0];
  return pid;
}

/* Has the child said its compaction returned? */
static int vac_done(int rfd)
{
  char b;
  return read(rfd, &b, 1) == 1 && b == 'd';
}

/* Poll (every 0.1 ms) until the child's compaction returns, or until `stop_at_copy` and the
 * catalog copy has appeared; the times (from now) the copy appeared, went (renamed) and the
 * compaction returned, -1 where not seen. */
static void vac_watch(const char *dir, int rfd, int stop_at_copy, double *t_copy,
                      double *t_rename, double *t_done)
{
  double t0 = now_s();
  *t_copy = *t_rename = *t_done = -1;
  for (;;) {
    int done = vac_done(rfd);
    double t = now_s() - t0;
    int stray = file_exists(dir, "catalog.mdb.vacuum");
    if (stray && *t_copy < 0)
      *t_copy = t;
    if (!stray && *t_copy >= 0 && *t_rename < 0)
      *t_rename = t;
    if (done) {
      *t_done = t;
      return;
    }
    if (stray && stop_at_copy)
      return;
    struct timespec ts = {0, 100000};
    nanosleep(&ts, NULL);
  }
}

static void sleep_s(double s)
{
  struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
  nanosleep(&ts, NULL);
}

/* Kill the child; 1 if its compaction had returned. */
static int vac_kill(pid_t pid, int rfd)
{
  int done = vac_done(rfd);
  kill(pid, SIGKILL);
  int st = 0;
  ASSERT(waitpid(pid, &st, 0) == pid);
  ASSERT(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL); /* not an exit: the child failed */
  done = done || vac_done(rfd);
  close(rfd);
  return done;
}

/* Every live context reads back whole and bit-exact, every deleted one misses (no block of
 * its own), verify is clean. */
static void vac_check(kvdb *db, const uint8_t *live, int n)
{
  for (int i = 0; i < n; i++) {
    if (live[i]) {
      if (!intact(db, i)) {
        fprintf(stderr, "context %d: not read back whole and bit-exact\n", i);
        ASSERT(0);
      }
    } else {
      uint32_t tok[NT];
      uint16_t buf[NT * 16];
      ctx_tokens(i, tok);
      kvdb_kv_view v;
      kvdb_kv_view_packed(&v, buf, &M, NT, KVDB_LAYOUT_LKTHD);
      size_t hit = NT;
      ASSERT_OK(kvdb_get(db, &M, tok, NT, &v, &hit));
      /* its blocks are gone: at most a prefix of another context's first block matches (the
       * same leading tokens, hence the same KV) */
      if (hit >= M.block_tokens || t_check_kv(&M, tok, hit, NT, buf) != hit) {
        fprintf(stderr, "deleted context %d: a hit of %zu tokens\n", i, hit);
        ASSERT(0);
      }
    }
  }
  kvdb_verify_report vr;
  memset(&vr, 0, sizeof vr);
  ASSERT_OK(kvdb_verify(db, NULL, NULL, NULL, &vr));
}

static void test_crash_vacuum(void)
{
  const char *slow = getenv("KVDB_SLOW");
  int rounds = slow && *slow && strcmp(slow, "0") != 0 ? 200 : 30;
  if (getenv("KVDB_CRASH_ITERS") != NULL)
    rounds = atoi(getenv("KVDB_CRASH_ITERS"));
  char *base = t_tmpdir("vacbase");
  kvdb_options o = opts();
  kvdb *db;
  static uint8_t live[VAC_N + 64];
  ASSERT_OK(kvdb_open(base, &o, &db));
  for (int i = 0; i < VAC_N; i++) {
    ASSERT_OK(put_i(db, i));
    live[i] = 1;
  }
  uint64_t rnd = 77;
  for (int left = VAC_N; left > VAC_N / 2;) { /* a random half */
    int i = (int)(t_rand(&rnd) % VAC_N);
    if (!live[i])
      continue;
    ASSERT_OK(del_i(db, i));
    live[i] = 0;
    left--;
  }
  kvdb_close(db);
  uint64_t cat0 = file_bytes(base, "catalog.mdb");

  /* once per threshold without a kill: the compaction rewrites the catalog (it shrinks),
   * and how long its parts take */
  double dur75 = 0, copy_dur = 0;
  char *d = NULL;
  for (int k = 0; k < 2; k++) {
    d = t_tmpdir("vacrun");
    copy_dir(base, d);
    int rfd;
    pid_t pid = vac_start(d, k == 0 ? 0.75 : 1e-6, &rfd);
    double t_copy, t_rename, t_done;
    vac_watch(d, rfd, 0, &t_copy, &t_rename, &t_done);
    vac_kill(pid, rfd);
    ASSERT(t_done >= 0); /* vac_watch read its 'd' */
    uint64_t cat1 = file_bytes(d, "catalog.mdb");
    printf("crash-vacuum: compaction at %s: catalog %llu bytes, %llu after its rewrite; %.3f s, "
           "the catalog copy seen from %.3f s to %.3f s\n", k == 0 ? "0.75" : "1e-6",
           (unsigned long long)cat0, (unsigned long long)cat1, t_done, t_copy, t_rename);
    ASSERT(cat1 < cat0 / 2); /* the vacuum ran */
    ASSERT(!file_exists(d, "catalog.mdb.vacuum"));
    if (k == 0) {
      dur75 = t_done;
      t_rmdir(d);
    } else {
      /* from the copy's appearance to the compaction's return: the copy, its sync, the
       * rename, the directory's sync, the reopen */
      copy_dur = t_copy >= 0 ? t_done - t_copy : t_done;
    }
  }
  ASSERT_OK(kvdb_open(d, &o, &db));
  vac_check(db, live, VAC_N);
  kvdb_close(db);
  t_rmdir(d);

  /* kill rounds: every 4th compacts the segments too (threshold 0.75) and is killed at a
   * moment spread over [0, 1.1 x its duration] after the open; the others compact at 1e-6
   * (the catalog only) and are killed once the catalog copy appears, after a delay spread
   * over 1.2 x the time from then to the compaction's return (the copy, its sync, the rename,
   * the directory's sync, the reopen). */
  int before = 0, in_copy = 0, renamed = 0, finished = 0, strays = 0;
  uint64_t krnd = (uint64_t)time(NULL);
  const char *seed = getenv("KVDB_TEST_SEED");
  if (seed != NULL)
    krnd = strtoull(seed, NULL, 10);
  printf("crash-vacuum: %d rounds, KVDB_TEST_SEED=%llu\n", rounds, (unsigned long long)krnd);
  for (int r = 0; r < rounds; r++) {
    double tr = now_s();
    d = t_tmpdir("vacrun");
    copy_dir(base, d);
    if (getenv("KVDB_TEST_DEBUG"))
      printf("round %d: copied in %.2f s\n", r, now_s() - tr);
    int rfd;
    double u = (double)(t_rand(&krnd) % 10000) / 10000.0, delay;
    int done = 0;
    pid_t pid;
    if (r % 4 == 0) {
      pid = vac_start(d, 0.75, &rfd);
      delay = u * 1.1 * dur75;
      sleep_s(delay);
    } else {
      pid = vac_start(d, 1e-6, &rfd);
      double t_copy, t_rename, t_done;
      vac_watch(d, rfd, 1, &t_copy, &t_rename, &t_done);
      delay = u * 1.2 * copy_dur;
      sleep_s(delay);
      delay += t_copy >= 0 ? t_copy : t_done; /* from the open */
      done = t_done >= 0; /* vac_watch read its 'd' */
    }
    done = vac_kill(pid, rfd) || done;
    int stray = file_exists(d, "catalog.mdb.vacuum");
    uint64_t cat = file_bytes(d, "catalog.mdb");
    const char *where;
    if (done) {
      finished++;
      where = "after the compaction returned";
    } else if (stray) {
      in_copy++;
      where = "during the catalog copy";
    } else if (cat < cat0 / 2) {
      renamed++;
      where = "after the rename, before the compaction returned";
    } else {
      before++;
      where = "before the catalog copy";
    }
    strays += stray;
    if (getenv("KVDB_TEST_DEBUG"))
      printf("round %d: killed at %.3f s, %s (%.2f s)\n", r, delay, where, now_s() - tr);
    ASSERT_OK(kvdb_open(d, &o, &db));
    vac_check(db, live, VAC_N);
    if (stray || r % 5 == 0) {
      /* the database takes writes and compacts (rewriting its catalog over the stray copy) */
      for (int i = VAC_N; i < VAC_N + 64; i++)
        ASSERT_OK(put_i(db, i));
      memset(live + VAC_N, 1, 64);
      ASSERT_OK(kvdb_compact(db, r % 5 == 0 ? 0.75 : 1e-6, NULL, NULL, NULL));
      /* whatever the kill left, no stray copy is left, and a catalog not rewritten yet is now
       * (one rewritten before the kill grows a little with the puts and moved blocks) */
      ASSERT(!file_exists(d, "catalog.mdb.vacuum"));
      ASSERT(file_bytes(d, "catalog.mdb") < (cat >= cat0 / 2 ? cat0 / 2 : cat0));
      vac_check(db, live, VAC_N + 64);
      kvdb_close(db);
      ASSERT_OK(kvdb_open(d, &o, &db));
      vac_check(db, live, VAC_N + 64);
      memset(live + VAC_N, 0, 64);
    }
    kvdb_close(db);
    if (getenv("KVDB_TEST_DEBUG"))
      printf("round %d: checked by %.2f s\n", r, now_s() - tr);
    t_rmdir(d);
  }
  printf("crash-vacuum: %d kills: %d before the catalog copy (segments), %d during it (a stray "
         "catalog.mdb.vacuum), %d after the rename (before kvdb_compact returned), %d after it "
         "returned (the handle open)\n",
         rounds, before, in_copy, renamed, finished);
  ASSERT_EQ(strays, in_copy);
  t_rmdir(base);
}

int main(int argc, char **argv)
{
  setvbuf(stdout, NULL, _IONBF, 0);
  const char *c = argc > 1 ? argv[1] : "";
  if (strcmp(c, "map-grow") == 0) {
    test_map_grow();
  } else if (strcmp(c, "catalog") == 0) {
    test_catalog();
  } else if (strcmp(c, "crash-vacuum") == 0) {
    test_crash_vacuum();
  } else if (strcmp(c, "full-disk") == 0) {
    if (test_full_disk() == T_EXIT_SKIP)
      return T_EXIT_SKIP;
  } else {
    fprintf(stderr, "usage: test_space map-grow|catalog|full-disk|crash-vacuum\n");
    return 2;
  }
  printf("test_space %s: ok\n", c);
  return 0;
}
