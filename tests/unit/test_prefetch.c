/* SPDX-License-Identifier: MIT */
/*
 * tests/unit/test_prefetch.c — kvdb_prefetch (kvdb.h, group "prefetch") and its admission
 * control (engine/tiers/admit.c), modes:
 *   api      staging into the DRAM tier and a later get finding it there; idempotence; cancel
 *            of a queued and of a running request; order by deadline and priority; expiry;
 *            bad input; kvdb_get_notify's ranges
 *   lend     kvdb_get_lend: DRAM-tier blocks lent in place (the layout kvdb.h documents, element
 *            by element), kept while the tier fills past its size, evictable once given back;
 *            refused lends copied and told; a partial block; kvdb_dram_memory
 *   close    kvdb_close while a request reads: it stops, nothing leaks, the data reads back
 *   kill     SIGKILL of a process while its prefetch reads: the database opens and verifies
 *   bucket   the token bucket's arithmetic on a synthetic clock; the DRAM tier's staged blocks
 *            (a prefetch's) evicted only after the others
 */
#define _GNU_SOURCE
#include <signal.h>
#include <sys/wait.h>
#include <time.h>

#include "kvdb_test.h"
#include "seg/seg.h" /* db->fg_reads: a foreground read held open by the test */
#include "tiers/tiers.h"

static const kvdb_model M = {"prefetch-test", 4, 4, 64, KVDB_F16, 16, 0};
#define N_CTX 4
#define N_TOK 160 /* 10 blocks of 16 tokens */

static uint32_t toks[N_CTX][N_TOK];

static void msleep(unsigned ms)
{
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

static kvdb *open_db(const char *dir, uint64_t dram, double prefetch_bps)
{
  kvdb_options o;
  kvdb_options_init(&o);
  o.dram_bytes = dram;
  o.prefetch_bps = prefetch_bps;
  o.sync_mode = KVDB_SYNC_NONE;
  kvdb *db = NULL;
  ASSERT_OK(kvdb_open(dir, &o, &db));
  return db;
}

static void populate(const char *dir)
{
  kvdb *db = open_db(dir, 0, 0);
  for (int c = 0; c < N_CTX; c++) {
    t_family_tokens((uint64_t)c + 1, 100 + (uint64_t)c, 0, toks[c], N_TOK);
    t_put_kv(db, &M, toks[c], N_TOK, NULL);
  }
  kvdb_close(db);
}

/* Poll until `id` has finished (10 s at most); its info. */
static kvdb_prefetch_info wait_done(kvdb *db, kvdb_prefetch_id id)
{
  kvdb_prefetch_info in;
  for (int i = 0; i < 10000; i++) {
    ASSERT_OK(kvdb_prefetch_poll(db, id, &in));
    if (in.state >= KVDB_PREFETCH_DONE)
      return in;
    msleep(1);
  }
  fprintf(stderr, "prefetch %llu did not finish\n", (unsigned long long)id);
  abort();
}

static uint64_t tier_hits(kvdb *db, kvdb_tier t)
{
  kvdb_stats st;
  ASSERT_OK(kvdb_stat(db, &st));
  return st.tier[t].hits;
}

typedef struct ranges {
  size_t next; /* the end of the last range told */
  int calls;
} ranges;

static void on_block(void *ctx, size_t t0, size_t n)
{
  ranges *r = ctx;
  ASSERT_EQ(t0, r->next); /* in order, no gap, no overlap (no retry here) */
  ASSERT(n > 0);
  r->next = t0 + n;
  r->calls++;
}

static void test_api(const char *dir)
{
  populate(dir);
  kvdb *db = open_db(dir, 64u << 20, 0);
  const size_t blocks = N_TOK / 16;

  /* stage context 0; the get then reads nothing from the SSD tier */
  kvdb_prefetch_id id = 0;
  ASSERT_OK(kvdb_prefetch(db, &M, toks[0], N_TOK, NULL, &id));
  ASSERT(id != 0);
  kvdb_prefetch_info in = wait_done(db, id);
  ASSERT_EQ(in.state, KVDB_PREFETCH_DONE);
  ASSERT_EQ(in.status, KVDB_OK);
  ASSERT_EQ(in.staged_tokens, N_TOK);
  ASSERT_EQ(in.blocks_read, blocks);
  ASSERT_EQ(in.blocks_present, 0);
  ASSERT(in.bytes_read > 0);
  uint64_t ssd0 = tier_hits(db, KVDB_TIER_SSD), dram0 = tier_hits(db, KVDB_TIER_DRAM);
  ASSERT_EQ(ssd0, 0); /* a prefetch's reads serve nobody yet */
  ASSERT_EQ(t_get_check(db, &M, toks[0], N_TOK), N_TOK);
  ASSERT_EQ(tier_hits(db, KVDB_TIER_SSD), ssd0);
  ASSERT_EQ(tier_hits(db, KVDB_TIER_DRAM), dram0 + blocks);

  /* again, now that it is there: a new ticket that reads nothing */
  kvdb_prefetch_id id2 = 0;
  ASSERT_OK(kvdb_prefetch(db, &M, toks[0], N_TOK, NULL, &id2));
  ASSERT(id2 != id);
  in = wait_done(db, id2);
  ASSERT_EQ(in.state, KVDB_PREFETCH_DONE);
  ASSERT_EQ(in.blocks_read, 0);
  ASSERT_EQ(in.blocks_present, blocks);
  ASSERT_EQ(tier_hits(db, KVDB_TIER_SSD), ssd0);

  /* a prompt longer than what is stored: its stored prefix; a prompt of nothing stored: 0 */
  uint32_t longer[N_TOK + 40];
  memcpy(longer, toks[1], sizeof toks[1]);
  for (int i = 0; i < 40; i++)
    longer[N_TOK + i] = 30001 + (uint32_t)i;
  ASSERT_OK(kvdb_prefetch(db, &M, longer, N_TOK + 40, NULL, &id));
  in = wait_done(db, id);
  ASSERT_EQ(in.state, KVDB_PREFETCH_DONE);
  ASSERT_EQ(in.staged_tokens, N_TOK);
  uint32_t none[20];
  for (int i = 0; i < 20; i++)
    none[i] = 40000 + (uint32_t)i;
  ASSERT_OK(kvdb_prefetch(db, &M, none, 20, NULL, &id));
  in = wait_done(db, id);
  ASSERT_EQ(in.state, KVDB_PREFETCH_DONE);
  ASSERT_EQ(in.staged_tokens, 0);

  /* a model stored with another shape: the request fails with the get's status */
  kvdb_model other = M;
  other.n_layers = 5;
  ASSERT_OK(kvdb_prefetch(db, &other, toks[2], N_TOK, NULL, &id));
  in = wait_done(db, id);
  ASSERT_EQ(in.state, KVDB_PREFETCH_FAILED);
  ASSERT_EQ(in.status, KVDB_MISMATCH);

  /* kvdb_get_notify: every block told once, in order, covering the hit */
  ranges r = {0, 0};
  uint16_t *buf = calloc(N_TOK, kvdb_model_token_bytes(&M));
  kvdb_kv_view v;
  ASSERT_OK(kvdb_kv_view_packed(&v, buf, &M, N_TOK, KVDB_LAYOUT_LKTHD));
  size_t hit = 0;
  ASSERT_OK(kvdb_get_notify(db, &M, toks[3], N_TOK, &v, &hit, on_block, &r));
  ASSERT_EQ(hit, N_TOK);
  ASSERT_EQ(r.next, N_TOK);
  ASSERT_EQ(r.calls, (int)blocks);
  ASSERT_EQ(t_check_kv(&M, toks[3], N_TOK, N_TOK, buf), N_TOK);
  free(buf);

  /* bad input */
  ASSERT_STATUS(KVDB_INVALID, kvdb_prefetch(db, &M, toks[0], N_TOK, NULL, NULL));
  ASSERT_STATUS(KVDB_INVALID, kvdb_prefetch(db, &M, toks[0], 0, NULL, &id));
  ASSERT_STATUS(KVDB_INVALID, kvdb_prefetch(db, &M, NULL, 3, NULL, &id));
  kvdb_prefetch_opts po;
  memset(&po, 0, sizeof po);
  ASSERT_STATUS(KVDB_INVALID, kvdb_prefetch(db, &M, toks[0], N_TOK, &po, &id));
  ASSERT_MSG_HAS("kvdb_prefetch_opts_init");
  ASSERT_STATUS(KVDB_INVALID, kvdb_prefetch_poll(db, 1, NULL));
  ASSERT_STATUS(KVDB_NOTFOUND, kvdb_prefetch_poll(db, 999999, &in));
  ASSERT_STATUS(KVDB_NOTFOUND, kvdb_prefetch_cancel(db, 999999));
  ASSERT_STATUS(KVDB_INVALID, kvdb_prefetch(NULL, &M, toks[0], N_TOK, NULL, &id));
  kvdb_close(db);

  kvdb *nodram = open_db(dir, 0, 0);
  ASSERT_STATUS(KVDB_UNSUPPORTED, kvdb_prefetch(nodram, &M, toks[0], N_TOK, NULL, &id));
  ASSERT_MSG_HAS("dram_bytes");
  kvdb_close(nodram);
  kvdb_options o;
  kvdb_options_init(&o);
  o.prefetch_bps = -1;
  ASSERT_STATUS(KVDB_INVALID, kvdb_open(dir, &o, &nodram));
  ASSERT_MSG_HAS("prefetch_bps");

  /* A slow prefetch (256 KiB/s; a block of 16 tokens is 64 KiB, read in one wave, so a
   * request of 10 blocks takes about 2.5 s) keeps the worker busy. */
  db = open_db(dir, 64u << 20, 256 << 10);
  kvdb_prefetch_id busy, a, a2, p0, p5, dl;
  ASSERT_OK(kvdb_prefetch(db, &M, toks[0], N_TOK, NULL, &busy));
  for (int i = 0; i < 5000; i++) { /* until it runs */
    ASSERT_OK(kvdb_prefetch_poll(db, busy, &in));
    if (in.state != KVDB_PREFETCH_QUEUED)
      break;
    msleep(1);
  }
  ASSERT_EQ(in.state, KVDB_PREFETCH_RUNNING);
  /* idempotent: queued or running, the same tokens give the same ticket */
  ASSERT_OK(kvdb_prefetch(db, &M, toks[0], N_TOK, NULL, &a));
  ASSERT_EQ(a, busy);
  ASSERT_OK(kvdb_prefetch(db, &M, toks[1], N_TOK, NULL, &a));
  ASSERT_OK(kvdb_prefetch(db, &M, toks[1], N_TOK, NULL, &a2));
  ASSERT_EQ(a, a2);
  /* cancel a queued one: at once */
  ASSERT_OK(kvdb_prefetch_cancel(db, a));
  ASSERT_OK(kvdb_prefetch_poll(db, a, &in));
  ASSERT_EQ(in.state, KVDB_PREFETCH_CANCELLED);
  ASSERT_EQ(in.blocks_read, 0);
  /* a cancelled request does not hold its tokens' ticket: the next prefetch queues anew */
  ASSERT_OK(kvdb_prefetch(db, &M, toks[1], N_TOK, NULL, &a2));
  ASSERT(a2 != a);
  ASSERT_OK(kvdb_prefetch_cancel(db, a2));
  /* order: deadline first, then priority; an expired deadline ends EXPIRED */
  kvdb_prefetch_opts_init(&po);
  ASSERT_OK(kvdb_prefetch(db, &M, toks[1], N_TOK, &po, &p0));
  po.priority = 5;
  ASSERT_OK(kvdb_prefetch(db, &M, toks[2], N_TOK, &po, &p5));
  kvdb_prefetch_opts_init(&po);
  po.deadline_us = 1; /* passed before the busy one ends */
  ASSERT_OK(kvdb_prefetch(db, &M, toks[3], N_TOK, &po, &dl));
  /* cancel the running one: it stops before its next read */
  ASSERT_OK(kvdb_prefetch_cancel(db, busy));
  in = wait_done(db, busy);
  ASSERT_EQ(in.state, KVDB_PREFETCH_CANCELLED);
  ASSERT(in.staged_tokens < N_TOK);
  in = wait_done(db, dl);
  ASSERT_EQ(in.state, KVDB_PREFETCH_EXPIRED);
  /* p5 runs before p0: whenever p0 has left the queue, p5 has too */
  for (;;) {
    kvdb_prefetch_info i0, i5;
    ASSERT_OK(kvdb_prefetch_poll(db, p0, &i0));
    ASSERT_OK(kvdb_prefetch_poll(db, p5, &i5));
    if (i0.state != KVDB_PREFETCH_QUEUED)
      ASSERT(i5.state != KVDB_PREFETCH_QUEUED);
    if (i0.state == KVDB_PREFETCH_RUNNING)
      ASSERT(i5.state == KVDB_PREFETCH_DONE);
    if (i0.state >= KVDB_PREFETCH_DONE && i5.state >= KVDB_PREFETCH_DONE) {
      ASSERT_EQ(i0.state, KVDB_PREFETCH_DONE);
      ASSERT_EQ(i5.state, KVDB_PREFETCH_DONE);
      break;
    }
    msleep(2);
  }
  /* everything staged reads back right */
  for (int c = 0; c < N_CTX; c++)
    ASSERT_EQ(t_get_check(db, &M, toks[c], N_TOK), N_TOK);
  kvdb_close(db);

  /* foreground first: while a get reads (db->fg_reads held above 0 here), the prefetch queues
   * no read; once it is done, the prefetch goes on */
  db = open_db(dir, 64u << 20, 0);
  db->fg_reads++;
  ASSERT_OK(kvdb_prefetch(db, &M, toks[2], N_TOK, NULL, &id));
  msleep(300);
  ASSERT_OK(kvdb_prefetch_poll(db, id, &in));
  ASSERT_EQ(in.state, KVDB_PREFETCH_RUNNING);
  ASSERT_EQ(in.bytes_read, 0);
  db->fg_reads--;
  in = wait_done(db, id);
  ASSERT_EQ(in.state, KVDB_PREFETCH_DONE);
  ASSERT_EQ(in.blocks_read, blocks);
  kvdb_close(db);
}

/* Close while a request reads (throttled to take seconds): close returns, nothing leaks (ASan),
 * and a new handle reads every context right. */
static void test_close(const char *dir)
{
  populate(dir);
  kvdb *db = open_db(dir, 64u << 20, 64 << 10);
  kvdb_prefetch_id id[N_CTX];
  for (int c = 0; c < N_CTX; c++)
    ASSERT_OK(kvdb_prefetch(db, &M, toks[c], N_TOK, NULL, &id[c]));
  kvdb_prefetch_info in;
  for (int i = 0; i < 5000; i++) {
    ASSERT_OK(kvdb_prefetch_poll(db, id[0], &in));
    if (in.bytes_read > 0)
      break;
    msleep(1);
  }
  ASSERT(in.bytes_read > 0 && in.state == KVDB_PREFETCH_RUNNING);
  msleep(50); /* a read in flight or its wait */
  kvdb_close(db);
  db = open_db(dir, 64u << 20, 0);
  for (int c = 0; c < N_CTX; c++)
    ASSERT_EQ(t_get_check(db, &M, toks[c], N_TOK), N_TOK);
  /* a handle closed right after queuing (the worker may not have started yet) */
  kvdb_close(db);
  db = open_db(dir, 64u << 20, 0);
  ASSERT_OK(kvdb_prefetch(db, &M, toks[0], N_TOK, NULL, &id[0]));
  kvdb_close(db);
}

/* A process killed while its prefetch reads: the database opens, verifies and reads back. */
static void test_kill(const char *dir)
{
  populate(dir);
  pid_t pid = fork();
  ASSERT(pid >= 0);
  if (pid == 0) {
    kvdb *db = open_db(dir, 64u << 20, 64 << 10);
    kvdb_prefetch_id id[N_CTX];
    for (int c = 0; c < N_CTX; c++)
      ASSERT_OK(kvdb_prefetch(db, &M, toks[c], N_TOK, NULL, &id[c]));
    kvdb_prefetch_info in;
    for (int i = 0; i < 5000; i++) {
      ASSERT_OK(kvdb_prefetch_poll(db, id[0], &in));
      if (in.bytes_read > 0)
        break;
      msleep(1);
    }
    raise(SIGKILL);
    _exit(3);
  }
  int st;
  ASSERT(waitpid(pid, &st, 0) == pid);
  ASSERT(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL);
  kvdb *db = open_db(dir, 64u << 20, 0);
  kvdb_verify_report rep;
  ASSERT_OK(kvdb_verify(db, NULL, NULL, NULL, &rep));
  for (int c = 0; c < N_CTX; c++)
    ASSERT_EQ(t_get_check(db, &M, toks[c], N_TOK), N_TOK);
  /* and this handle prefetches as well */
  kvdb_prefetch_id id;
  ASSERT_OK(kvdb_prefetch(db, &M, toks[1], N_TOK, NULL, &id));
  kvdb_prefetch_info in = wait_done(db, id);
  ASSERT_EQ(in.state, KVDB_PREFETCH_DONE);
  kvdb_close(db);
}

/* The bucket on a synthetic clock. */
static void test_bucket(void)
{
  const uint64_t S = 1000000000ull;
  kv_bucket b;
  /* idle foreground: 80% of the capacity */
  kv_bucket_init(&b, 1e9, 0, 1 << 20, 0);
  ASSERT(b.rate_bps > 0.79e9 && b.rate_bps < 0.81e9);
  /* a take within the burst goes at once; the next waits for the refill */
  ASSERT_EQ(kv_bucket_take(&b, 1 << 20, 0), 0);
  uint64_t w = kv_bucket_take(&b, 1 << 20, 0);
  ASSERT(w > 1000000 && w < 1500000); /* 1 MiB at 0.8 GB/s: 1.31 ms */
  ASSERT_EQ(kv_bucket_take(&b, 1 << 20, w), 0);
  /* over a simulated second, the bytes taken stay within rate x time + burst */
  uint64_t t = w, taken = 0;
  while (t < w + S) {
    uint64_t d = kv_bucket_take(&b, 256 << 10, t);
    if (d == 0)
      taken += 256 << 10;
    else
      t += d;
  }
  ASSERT(taken <= 0.8e9 + (2 << 20));
  ASSERT(taken >= 0.75e9);

  /* a foreground reading at the tier's speed leaves the floor; a light one, the rest */
  kv_bucket_init(&b, 1e9, 0, 1 << 20, 0);
  kv_bucket_observe(&b, 0, 0, 0);
  uint64_t fg = 0;
  for (uint64_t ms = 10; ms <= 3000; ms += 10) {
    fg += 10000000; /* 1 GB/s */
    kv_bucket_observe(&b, fg, fg, ms * 1000000);
  }
  ASSERT(b.fg_bps > 0.95e9);
  ASSERT(b.rate_bps <= KV_ADMIT_FLOOR * 1e9 + 1);
  for (uint64_t ms = 3010; ms <= 6000; ms += 10) {
    fg += 2000000; /* 0.2 GB/s */
    kv_bucket_observe(&b, fg, fg, ms * 1000000);
  }
  ASSERT(b.rate_bps > 0.55e9 && b.rate_bps < 0.65e9); /* 0.8 - 0.2 */
  /* a burst of one get (30 ms at 2 GB/s) barely moves it: the load, not the burst */
  double before = b.rate_bps;
  for (uint64_t ms = 6010; ms <= 6030; ms += 10) {
    fg += 20000000;
    kv_bucket_observe(&b, fg, fg, ms * 1000000);
  }
  ASSERT(b.rate_bps > before - 0.2e9);
  /* reads measured faster than the guess raise the capacity */
  uint64_t all = fg;
  for (uint64_t ms = 6040; ms <= 6130; ms += 10) {
    all += 30000000; /* 3 GB/s all together */
    kv_bucket_observe(&b, fg, all, ms * 1000000);
  }
  ASSERT(b.capacity_bps > 2.9e9);
  /* a ceiling holds */
  kv_bucket_init(&b, 1e9, 1e6, 1 << 16, 0);
  ASSERT(b.rate_bps <= 1e6);
  /* a take above the burst leaves a debt the next take waits out */
  ASSERT_EQ(kv_bucket_take(&b, 1 << 20, 0), 0);
  w = kv_bucket_take(&b, 1 << 10, 0);
  ASSERT(w > S * 9 / 10); /* 1 MiB less the 64 KiB burst at 1 MB/s */
}

/* The DRAM tier keeps staged blocks while it can evict others. */
static void test_dram(void)
{
  kv_dram *d = kv_dram_create(4 * 4096);
  ASSERT(d != NULL);
  uint8_t h[8][16], page[4096];
  memset(h, 0, sizeof h);
  for (int i = 0; i < 8; i++)
    h[i][0] = (uint8_t)(i + 1);
  memset(page, 7, sizeof page);
  ASSERT_EQ(kv_dram_stage(d, h[0], page, sizeof page), 0); /* the oldest, staged */
  for (int i = 1; i < 4; i++)
    ASSERT_EQ(kv_dram_insert(d, h[i], page, sizeof page), 0);
  ASSERT_EQ(kv_dram_insert(d, h[4], page, sizeof page), 0); /* full: evicts 1, not 0 */
  ASSERT(kv_dram_contains(d, h[0]));
  ASSERT(!kv_dram_contains(d, h[1]));
  /* a block already present becomes staged */
  ASSERT_EQ(kv_dram_keep(d, h[2]), 1);
  ASSERT_EQ(kv_dram_keep(d, h[7]), 0);
  ASSERT_EQ(kv_dram_insert(d, h[5], page, sizeof page), 0); /* evicts 3: 0 and 2 are staged */
  ASSERT(kv_dram_contains(d, h[0]) && kv_dram_contains(d, h[2]) && !kv_dram_contains(d, h[3]));
  /* a read unstages: 0 is then the least recently used unstaged block after 4 and 5 */
  const uint8_t *data;
  uint64_t len;
  kv_dram_entry *e = kv_dram_pin(d, h[0], &data, &len);
  ASSERT(e != NULL && len == sizeof page && data[0] == 7);
  kv_dram_unpin(d, e);
  ASSERT_EQ(kv_dram_insert(d, h[6], page, sizeof page), 0); /* evicts 4 */
  ASSERT(!kv_dram_contains(d, h[4]) && kv_dram_contains(d, h[0]));
  /* all staged: the least recently used staged block goes */
  for (int i = 0; i < 8; i++)
    kv_dram_keep(d, h[i]);
  ASSERT_EQ(kv_dram_stage(d, h[7], page, sizeof page), 0);
  ASSERT(kv_dram_contains(d, h[7]));
  kv_dram_stats st;
  kv_dram_stat(d, &st);
  ASSERT_EQ(st.blocks, 4);
  kv_dram_destroy(d);
}

/* ---- kvdb_get_lend: DRAM-tier blocks lent in place ---- */

typedef struct lends {
  kvdb_lent_block b[64];
  uint8_t *copy[64]; /* each lent region's bytes when lent */
  int n, take, told;
  size_t next; /* the end of the last position lent or told */
} lends;

static int on_lend(void *ctx, const kvdb_lent_block *b)
{
  lends *l = ctx;
  ASSERT_EQ(b->t0, l->next);
  ASSERT(b->n_tokens > 0 && b->lease != NULL && b->data != NULL);
  if (!l->take)
    return 0;
  ASSERT(l->n < 64);
  l->b[l->n] = *b;
  l->copy[l->n] = malloc(b->data_bytes);
  ASSERT(l->copy[l->n] != NULL);
  memcpy(l->copy[l->n], b->data, b->data_bytes);
  l->n++;
  l->next = b->t0 + b->n_tokens;
  return 1;
}

static void on_told(void *ctx, size_t t0, size_t n)
{
  lends *l = ctx;
  ASSERT_EQ(t0, l->next);
  l->next = t0 + n;
  l->told++;
}

static void lends_return(kvdb *db, lends *l)
{
  for (int i = 0; i < l->n; i++) {
    kvdb_lent_return(db, &l->b[i]);
    free(l->copy[i]);
  }
  l->n = 0;
}

/* Every element of a lent block, read by the layout kvdb.h documents, is the KV of its token. */
static void check_lent(const kvdb_lent_block *b, const uint32_t *tok)
{
  ASSERT_EQ(b->n_sections, M.n_layers * M.n_kv_heads * 2);
  ASSERT_EQ(b->row_bytes, M.head_dim * 2);
  for (uint32_t l = 0; l < M.n_layers; l++)
    for (uint32_t h = 0; h < M.n_kv_heads; h++)
      for (uint32_t kv = 0; kv < 2; kv++) {
        uint32_t sec = (l * M.n_kv_heads + h) * 2 + kv;
        for (size_t t = 0; t < b->n_tokens; t++) {
          const uint8_t *row = (const uint8_t *)b->data + sec * b->section_bytes +
                               (t / b->group_tokens) * b->group_stride +
                               (t % b->group_tokens) * b->row_bytes;
          ASSERT(row + b->row_bytes <= (const uint8_t *)b->data + b->data_bytes);
          for (uint32_t d = 0; d < M.head_dim; d++) {
            uint16_t v;
            memcpy(&v, row + 2 * d, 2);
            ASSERT_EQ(v, t_kv_value(tok, b->t0 + t, l, kv, h, d));
          }
        }
      }
}

static void test_lend(const char *dir)
{
  populate(dir);
  /* a DRAM tier for about one and a half contexts */
  kvdb *db = open_db(dir, 2u << 20, 0);
  size_t hit = 0, bytes = N_TOK * kvdb_model_token_bytes(&M);
  uint8_t *buf = malloc(bytes);
  ASSERT(buf != NULL);
  kvdb_kv_view v;
  ASSERT_OK(kvdb_kv_view_packed(&v, buf, &M, N_TOK, KVDB_LAYOUT_LKTHD));
  lends l;
  memset(&l, 0, sizeof l);

  /* from the SSD tier: nothing lent, every block told and copied */
  l.take = 1;
  ASSERT_OK(kvdb_get_lend(db, &M, toks[0], N_TOK, &v, &hit, on_told, on_lend, &l));
  ASSERT_EQ(hit, N_TOK);
  ASSERT_EQ(l.n, 0);
  ASSERT_EQ(l.told, N_TOK / 16);
  ASSERT_EQ(t_check_kv(&M, toks[0], N_TOK, N_TOK, (uint16_t *)buf), N_TOK);

  /* from the DRAM tier, taken: all lent, nothing written to out, nothing told */
  void *base;
  size_t tier;
  ASSERT_OK(kvdb_dram_memory(db, &base, &tier));
  memset(buf, 0x5A, bytes);
  memset(&l, 0, sizeof l);
  l.take = 1;
  ASSERT_OK(kvdb_get_lend(db, &M, toks[0], N_TOK, &v, &hit, on_told, on_lend, &l));
  ASSERT_EQ(hit, N_TOK);
  ASSERT_EQ(l.n, N_TOK / 16);
  ASSERT_EQ(l.told, 0);
  ASSERT_EQ(l.next, N_TOK);
  for (size_t i = 0; i < bytes; i++)
    ASSERT_EQ(buf[i], 0x5A);
  for (int i = 0; i < l.n; i++) {
    ASSERT((const uint8_t *)l.b[i].data >= (const uint8_t *)base &&
           (const uint8_t *)l.b[i].data + l.b[i].data_bytes <= (const uint8_t *)base + tier);
    check_lent(&l.b[i], toks[0]);
  }
  /* lent blocks stay while other contexts fill the tier past its size; then given back */
  for (int c = 1; c < N_CTX; c++)
    ASSERT_EQ(t_get_check(db, &M, toks[c], N_TOK), N_TOK);
  for (int i = 0; i < l.n; i++)
    ASSERT(memcmp(l.b[i].data, l.copy[i], l.b[i].data_bytes) == 0);
  lends_return(db, &l);
  kvdb_lent_return(db, NULL); /* no-op */
  kvdb_lent_return(NULL, NULL);

  /* given back, they can be evicted: the tier holds the last contexts read, and the blocks
   * context 0 needs are read again from the SSD tier */
  for (int c = 1; c < N_CTX; c++)
    ASSERT_EQ(t_get_check(db, &M, toks[c], N_TOK), N_TOK);
  uint64_t ssd0 = tier_hits(db, KVDB_TIER_SSD);
  ASSERT_EQ(t_get_check(db, &M, toks[0], N_TOK), N_TOK);
  ASSERT(tier_hits(db, KVDB_TIER_SSD) > ssd0);

  /* refused: copied into out and told, as kvdb_get_notify */
  memset(buf, 0, bytes);
  memset(&l, 0, sizeof l);
  l.take = 0;
  ASSERT_OK(kvdb_get_lend(db, &M, toks[0], N_TOK, &v, &hit, on_told, on_lend, &l));
  ASSERT_EQ(hit, N_TOK);
  ASSERT_EQ(l.n, 0);
  ASSERT_EQ(l.next, N_TOK);
  ASSERT_EQ(t_check_kv(&M, toks[0], N_TOK, N_TOK, (uint16_t *)buf), N_TOK);

  /* a prefix of 100 tokens: the 7th block lent for 4 of its tokens */
  uint32_t q[N_TOK];
  memcpy(q, toks[0], sizeof q);
  for (size_t i = 100; i < N_TOK; i++)
    q[i] = 50000 + (uint32_t)i;
  memset(&l, 0, sizeof l);
  l.take = 1;
  ASSERT_OK(kvdb_get_lend(db, &M, q, N_TOK, &v, &hit, on_told, on_lend, &l));
  ASSERT_EQ(hit, 100);
  ASSERT_EQ(l.n, 7);
  ASSERT_EQ(l.b[6].n_tokens, 4);
  for (int i = 0; i < l.n; i++)
    check_lent(&l.b[i], toks[0]);
  lends_return(db, &l);

  ASSERT_STATUS(KVDB_INVALID, kvdb_dram_memory(db, NULL, &tier));
  kvdb_close(db);
  kvdb *nodram = open_db(dir, 0, 0);
  ASSERT_STATUS(KVDB_UNSUPPORTED, kvdb_dram_memory(nodram, &base, &tier));
  ASSERT_MSG_HAS("dram_bytes");
  memset(&l, 0, sizeof l);
  l.take = 1;
  ASSERT_OK(kvdb_get_lend(nodram, &M, toks[0], N_TOK, &v, &hit, on_told, on_lend, &l));
  ASSERT_EQ(hit, N_TOK);
  ASSERT_EQ(l.n, 0);
  kvdb_close(nodram);
  free(buf);
}

int main(int argc, char **argv)
{
  const char *mode = argc > 1 ? argv[1] : "api";
  if (strcmp(mode, "bucket") == 0) {
    test_bucket();
    test_dram();
    printf("ok bucket, dram\n");
    return T_EXIT_PASS;
  }
  char *dir = t_tmpdir("prefetch");
  if (strcmp(mode, "api") == 0)
    test_api(dir);
  else if (strcmp(mode, "close") == 0)
    test_close(dir);
  else if (strcmp(mode, "kill") == 0)
    test_kill(dir);
  else if (strcmp(mode, "lend") == 0)
    test_lend(dir);
  else {
    fprintf(stderr, "unknown mode %s\n", mode);
    return T_EXIT_FAIL;
  }
  t_rmdir(dir);
  printf("ok %s\n", mode);
  return T_EXIT_PASS;
}
