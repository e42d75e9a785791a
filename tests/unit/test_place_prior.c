/* SPDX-License-Identifier: MIT */
/*
 * tests/unit/test_place_prior.c — profile sampling on put (issue 17; place/prior.c, kvdb_options
 * .placement_profile) through the public API:
 *   sampled   the default: a group's first 16 puts are measured; once their profiles agree,
 *             15 puts in 16 carry a predicted profile (n_probes 0) whose every entry has the
 *             least quality and the mean bytes per token of the last 16 measured ones, and
 *             every context reads back (exact configs bit for bit);
 *   every     KVDB_PLACE_PROFILE_EVERY_PUT: every put measured (the paper's profiler);
 *   asked     a put whose caller sets KVDB_PUT_PROFILE is measured whatever the group says;
 *   drift     contexts whose KV quantizes worse: the sampled put measures it, the puts after
 *             it are measured until 16 agree again, then predictions resume at the new, lower
 *             quality;
 *   crash     a child putting contexts is SIGKILLed mid-stream: after a reopen every put it
 *             saw acknowledged is readable with a profile (measured or predicted: it was in
 *             the put's own commit), kvdb_verify finds nothing, and the reopened handle
 *             measures its first puts again (the prior lives in the handle only); run with a
 *             4 MiB and a 1 MiB DRAM tier: with the latter, puts before the kill took contexts
 *             out of DRAM in their own commits, and the reopened catalog's DRAM flags (folded
 *             into version-3 context records) still fit the tier;
 *   options   placement_profile 2 is KVDB_INVALID;
 *   reference (white-box, catalog.h PRIORS and FOLDED STATS, format 7) a predicted put writes
 *             no profile record: its context record (version 3) carries its statistics and
 *             its group, whose prediction is one record of `priors`; a measured put writes its
 *             profile record; both read back alike through kvdb_profile_get, after a reopen
 *             and read-only too; a quality report on a predicted context writes its profile
 *             record, which then takes precedence; the crash test checks the same state after
 *             the killed writer (every acknowledged context: statistics, group record).
 */
#include "kvdb_test.h"
#include "catalog/catalog.h" /* white-box: the records behind a profile */
#include "place/place.h"

#include <math.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

static const kvdb_model M = {.id = "prior-model", .n_layers = 2, .n_kv_heads = 2, .head_dim = 32,
                             .dtype = KVDB_F16, .block_tokens = 16};
#define TOKENS 96
/* kivi4: KIVI's per-token V groups feel kv_of's outliers (every 8th value: fixed channels);
 * KVQuant's per-channel scales (int4 since issue 16) absorb them, leaving no drift to detect */
#define SPACE "lossless,int8,kivi4"
#define N_CFG 3

static uint16_t f2h(float f)
{
  /* normal-range float -> fp16, round to nearest (the values here are |f| < 60000, or 0) */
  if (f == 0)
    return 0;
  uint16_t s = f < 0 ? 0x8000 : 0;
  float a = fabsf(f);
  int e;
  float m = frexpf(a, &e); /* a = m 2^e, m in [0.5, 1) */
  int he = e - 1 + 15;
  if (he <= 0)
    return s;
  uint32_t mant = (uint32_t)lrintf((m * 2 - 1) * 1024);
  if (mant == 1024) {
    mant = 0;
    he++;
  }
  return (uint16_t)(s | (uint16_t)(he << 10) | (uint16_t)mant);
}

static void tokens_of(int i, uint32_t *tok)
{
  for (uint32_t t = 0; t < TOKENS; t++)
    tok[t] = (uint32_t)i * TOKENS + t + 1;
}

/* Context i's KV: values in [-1, 1); with `outliers`, every 8th value x 5 (kivi4 quality about
 * 0.992 instead of 0.998, alike across contexts). */
static void kv_of(int i, int outliers, uint16_t *buf)
{
  size_t n = TOKENS * kvdb_model_token_bytes(&M) / 2;
  uint64_t s = 1000 + (uint64_t)i;
  for (size_t k = 0; k < n; k++) {
    float v = (float)((double)(t_rand(&s) >> 11) / 9007199254740992.0 * 2 - 1);
    if (outliers && k % 8 == 0)
      v *= 5;
    buf[k] = f2h(v);
  }
}

static uint64_t g_dram = 4 << 20; /* the DRAM tier of every handle (test_crash varies it) */

static kvdb_options opts(uint32_t profile)
{
  kvdb_options o;
  kvdb_options_init(&o);
  o.placement = KVDB_PLACEMENT_EVICPRESS;
  o.placement_profile = profile;
  o.segment_bytes = 1 << 20;
  o.dram_bytes = g_dram;
  o.log_level = -1;
  return o;
}

/* Put context i; its profile into pe (N_CFG entries); its key into *key. */
static void put_ctx(kvdb *db, int i, int outliers, uint32_t flags, kvdb_profile_entry *pe,
                    kvdb_key *key)
{
  uint32_t tok[TOKENS];
  tokens_of(i, tok);
  uint16_t *buf = malloc(TOKENS * kvdb_model_token_bytes(&M));
  ASSERT(buf != NULL);
  kv_of(i, outliers, buf);
  kvdb_kv_view v;
  ASSERT_OK(kvdb_kv_view_packed(&v, buf, &M, TOKENS, KVDB_LAYOUT_LKTHD));
  kvdb_put_opts po;
  kvdb_put_opts_init(&po);
  po.profile_space = SPACE;
  po.flags = flags;
  kvdb_put_info info;
  ASSERT_OK(kvdb_put_ex(db, &M, tok, TOKENS, &v, &po, &info));
  *key = info.context;
  size_t n = 0;
  ASSERT_OK(kvdb_profile_get(db, key, pe, N_CFG, &n));
  ASSERT(n >= N_CFG); /* the space's configs first (a stored config outside it is added) */
  free(buf);
}

static int predicted(const kvdb_profile_entry *pe)
{
  int p = pe[0].n_probes == 0;
  for (int c = 1; c < N_CFG; c++)
    ASSERT_EQ(pe[c].n_probes == 0, p); /* a profile is predicted or measured as a whole */
  return p;
}

/* Context i reads back: a full hit; bit for bit when stored exactly. */
static void check_ctx(kvdb *db, int i, int outliers, const kvdb_key *key)
{
  uint32_t tok[TOKENS];
  tokens_of(i, tok);
  size_t tb = kvdb_model_token_bytes(&M);
  uint16_t *want = malloc(TOKENS * tb), *got = calloc(TOKENS, tb);
  ASSERT(want != NULL && got != NULL);
  kv_of(i, outliers, want);
  kvdb_kv_view v;
  ASSERT_OK(kvdb_kv_view_packed(&v, got, &M, TOKENS, KVDB_LAYOUT_LKTHD));
  size_t hit = 0;
  ASSERT_OK(kvdb_get(db, &M, tok, TOKENS, &v, &hit));
  ASSERT_EQ(hit, TOKENS);
  kvdb_context_info ci;
  ASSERT_OK(kvdb_context_stat(db, key, &ci));
  if (ci.config.method == KVDB_METHOD_RAW || ci.config.method == KVDB_METHOD_LOSSLESS)
    ASSERT(memcmp(want, got, TOKENS * tb) == 0);
  free(want);
  free(got);
}

/* The ring of the last 16 measured profiles, as the test sees them. */
typedef struct ring {
  double q[16][N_CFG], bpt[16][N_CFG];
  int n, head;
} ring;

static void ring_add(ring *r, const kvdb_profile_entry *pe)
{
  for (int c = 0; c < N_CFG; c++) {
    r->q[r->head][c] = pe[c].quality;
    r->bpt[r->head][c] = (double)pe[c].bytes / TOKENS;
  }
  r->head = (r->head + 1) % 16;
  r->n += r->n < 16;
}

/* A predicted profile is the ring's least quality and mean bytes per token, per config (the
 * stored entry's bytes are the context's own, exact). */
static void check_prediction(const ring *r, const kvdb_profile_entry *pe)
{
  ASSERT_EQ(r->n, 16);
  for (int c = 0; c < N_CFG; c++) {
    double qmin = INFINITY, bsum = 0;
    for (int k = 0; k < 16; k++) {
      qmin = r->q[k][c] < qmin ? r->q[k][c] : qmin;
      bsum += r->bpt[k][c];
    }
    ASSERT(pe[c].quality == qmin);
    ASSERT(isnan(pe[c].reported_quality));
    if (!(pe[c].flags & KVDB_PROFILE_STORED))
      ASSERT_EQ(pe[c].bytes, (uint64_t)llround(bsum / 16 * TOKENS));
  }
}

static void test_sampled(void)
{
  char *dir = t_tmpdir("prior");
  kvdb_options o = opts(KVDB_PLACE_PROFILE_SAMPLED);
  kvdb *db;
  ASSERT_OK(kvdb_open(dir, &o, &db));
  ring r;
  memset(&r, 0, sizeof r);
  kvdb_key keys[64];
  int n_pred = 0, since = 0;
  for (int i = 0; i < 64; i++) {
    kvdb_profile_entry pe[N_CFG];
    put_ctx(db, i, 0, 0, pe, &keys[i]);
    int p = predicted(pe);
    if (i < 16)
      ASSERT(!p); /* the ring fills first */
    if (p) {
      check_prediction(&r, pe);
      n_pred++;
      since++;
    } else {
      if (i >= 16)
        ASSERT_EQ(since, 15); /* the group agrees: one put in 16 is measured */
      since = 0;
      ring_add(&r, pe);
    }
  }
  ASSERT_EQ(n_pred, 48 - 3); /* puts 16..63: 3 of them measured (31, 47, 63) */
  for (int i = 0; i < 64; i++)
    check_ctx(db, i, 0, &keys[i]);
  kvdb_close(db);
  t_rmdir(dir);
}

static void test_every_put_and_asked(void)
{
  for (int mode = 0; mode < 2; mode++) {
    char *dir = t_tmpdir("prior-every");
    kvdb_options o = opts(mode == 0 ? KVDB_PLACE_PROFILE_EVERY_PUT : KVDB_PLACE_PROFILE_SAMPLED);
    kvdb *db;
    ASSERT_OK(kvdb_open(dir, &o, &db));
    for (int i = 0; i < 40; i++) {
      kvdb_profile_entry pe[N_CFG];
      kvdb_key k;
      /* mode 1: the caller asks for the profile on every put */
      put_ctx(db, i, 0, mode == 1 ? KVDB_PUT_PROFILE : 0, pe, &k);
      ASSERT(!predicted(pe));
      ASSERT(pe[0].n_probes > 0);
    }
    kvdb_close(db);
    t_rmdir(dir);
  }
}

static void test_drift(void)
{
  char *dir = t_tmpdir("prior-drift");
  kvdb_options o = opts(KVDB_PLACE_PROFILE_SAMPLED);
  kvdb *db;
  ASSERT_OK(kvdb_open(dir, &o, &db));
  kvdb_profile_entry pe[N_CFG];
  kvdb_key k;
  double q_smooth = 0;
  for (int i = 0; i < 20; i++) {
    put_ctx(db, i, 0, 0, pe, &k);
    if (predicted(pe))
      q_smooth = pe[2].quality; /* kivi4 */
  }
  ASSERT(q_smooth > 0);
  /* drifted contexts: predicted until the group's sampled put measures one */
  int i = 20, first = -1;
  for (; i < 20 + 16 && first < 0; i++) {
    put_ctx(db, i, 1, 0, pe, &k);
    if (!predicted(pe))
      first = i;
  }
  ASSERT(first >= 0);
  ASSERT(pe[2].quality < q_smooth - 0.005); /* the outliers cost kivi4 quality */
  /* the ring disagrees now: every put is measured until 16 drifted ones fill it */
  int measured = 1;
  for (; measured < 16; i++, measured++) {
    put_ctx(db, i, 1, 0, pe, &k);
    ASSERT(!predicted(pe));
  }
  put_ctx(db, i, 1, 0, pe, &k); /* 16 drifted ones agree: predicted again, at their quality */
  ASSERT(predicted(pe));
  ASSERT(pe[2].quality < q_smooth - 0.005);
  check_ctx(db, i, 1, &k);
  kvdb_close(db);
  t_rmdir(dir);
}

/* White-box: how context `key` records its profile. 1: by reference (no profile record, its
 * statistics in its version-3 context record name a group whose prior record exists); 0: a
 * profile record. Its statistics are readable either way. */
static int by_reference(kvdb *db, const kvdb_key *key)
{
  kv_txn *txn;
  ASSERT_OK(kv_txn_begin(&db->cat, 0, &txn));
  static kv_profile_rec pr;
  kv_ctxstats cs;
  kv_ctx_rec cr;
  ASSERT_OK(kv_cat_get_ctx(&db->cat, txn, key->b, &cr));
  ASSERT(cr.has_stats); /* put with placement on: FOLDED STATS */
  ASSERT_OK(kv_cat_get_ctxstats(&db->cat, txn, key->b, &cs));
  ASSERT(cs.accesses >= 1 && cs.freq > 0);
  kvdb_status rc = kv_cat_get_profile_rec(&db->cat, txn, key->b, &pr);
  int ref = rc == KVDB_NOTFOUND;
  if (ref) {
    kv_clear_error();
    ASSERT(cs.prior != 0);
    ASSERT_OK(kv_cat_get_prior(&db->cat, txn, cs.prior, &pr));
    ASSERT(pr.n_entries >= N_CFG);
  } else {
    ASSERT_OK(rc);
  }
  kv_txn_abort(txn);
  return ref;
}

static void test_reference(void)
{
  char *dir = t_tmpdir("prior-ref");
  kvdb_options o = opts(KVDB_PLACE_PROFILE_SAMPLED);
  kvdb *db;
  ASSERT_OK(kvdb_open(dir, &o, &db));
  kvdb_key keys[48];
  kvdb_profile_entry got[48][N_CFG];
  int pred[48], n_ref = 0;
  for (int i = 0; i < 48; i++) {
    put_ctx(db, i, 0, 0, got[i], &keys[i]);
    pred[i] = predicted(got[i]);
    ASSERT_EQ(by_reference(db, &keys[i]), pred[i]); /* predicted: by reference, only they */
    n_ref += pred[i];
  }
  ASSERT_EQ(n_ref, 32 - 2); /* puts 16..47, 31 and 47 measured */
  kvdb_stats st;
  ASSERT_OK(kvdb_stat(db, &st));
  /* 7: the placed puts' records (FOLDED STATS, PRIORS); 9: the contexts the placement
   * compresses are packed compressed objects (FORMAT.md §3f) */
  ASSERT_EQ(st.format_version, 9);
  kvdb_close(db);
  /* reopened, read-write then read-only: the same profiles (the group's record holds the
   * prediction: the ring of this handle is gone) */
  for (int ro = 0; ro < 2; ro++) {
    kvdb_options o2 = opts(KVDB_PLACE_PROFILE_SAMPLED);
    if (ro) {
      o2.flags |= KVDB_O_RDONLY;
      o2.placement = KVDB_PLACEMENT_OFF;
    }
    ASSERT_OK(kvdb_open(dir, &o2, &db));
    for (int i = 16; i < 48; i++) {
      kvdb_profile_entry pe[N_CFG];
      size_t n = 0;
      ASSERT_OK(kvdb_profile_get(db, &keys[i], pe, N_CFG, &n));
      ASSERT(predicted(pe) == pred[i]);
      /* a predicted profile reads as its group's latest prediction: the one the puts 32..46
       * got (put 31's measurement joined the ring after puts 16..30 were predicted); its
       * stored entry's bytes are the context's own */
      const kvdb_profile_entry *want = pred[i] ? got[32] : got[i];
      ASSERT(pred[32]);
      for (int c = 0; c < N_CFG; c++) {
        ASSERT_EQ(pe[c].flags, got[i][c].flags);
        ASSERT(pe[c].quality == want[c].quality);
        ASSERT_EQ(pe[c].bytes, (pe[c].flags & KVDB_PROFILE_STORED) ? got[i][c].bytes
                                                                   : want[c].bytes);
      }
      check_ctx(db, i, 0, &keys[i]);
    }
    if (!ro) {
      /* a report on a predicted context: its profile record is written and takes precedence */
      int i = 20;
      ASSERT(pred[i]);
      kvdb_config stored = {0};
      for (int c = 0; c < N_CFG; c++)
        if (got[i][c].flags & KVDB_PROFILE_STORED)
          stored = got[i][c].config;
      ASSERT_OK(kvdb_report_quality(db, &keys[i], &stored, 0.999));
      ASSERT_EQ(by_reference(db, &keys[i]), 0);
    }
    kvdb_close(db);
  }
  t_rmdir(dir);
}

/* dram: the DRAM tier; at 1 MiB (21 contexts of 48 KiB decoded) the puts before the kill take
 * contexts out of DRAM in their own commits (their flags in their version-3 records) */
static void test_crash(uint64_t dram)
{
  g_dram = dram;
  char *dir = t_tmpdir("prior-crash");
  int fd[2];
  ASSERT(pipe(fd) == 0);
  pid_t pid = fork();
  ASSERT(pid >= 0);
  if (pid == 0) {
    close(fd[0]);
    kvdb_options o = opts(KVDB_PLACE_PROFILE_SAMPLED);
    kvdb *db;
    if (kvdb_open(dir, &o, &db) != KVDB_OK)
      _exit(2);
    for (int i = 0;; i++) { /* until killed */
      kvdb_profile_entry pe[N_CFG];
      kvdb_key k;
      put_ctx(db, i, 0, 0, pe, &k);
      uint8_t msg[2] = {(uint8_t)(i & 0xff), (uint8_t)predicted(pe)};
      if (write(fd[1], msg, 2) != 2)
        _exit(3);
      if (i >= 250)
        pause();
    }
  }
  close(fd[1]);
  int acked = 0, n_pred = 0;
  uint8_t msg[2];
  while (acked < 40 && read(fd[0], msg, 2) == 2) { /* kill it mid-stream, after predictions */
    acked++;
    n_pred += msg[1];
  }
  ASSERT_EQ(acked, 40);
  ASSERT(n_pred >= 20);
  kill(pid, SIGKILL);
  int status;
  ASSERT(waitpid(pid, &status, 0) == pid);
  ASSERT(WIFSIGNALED(status));
  close(fd[0]);

  kvdb_options o = opts(KVDB_PLACE_PROFILE_SAMPLED);
  kvdb *db;
  ASSERT_OK(kvdb_open(dir, &o, &db));
  for (int i = 0; i < acked; i++) { /* every acknowledged put: readable, with its profile */
    uint32_t tok[TOKENS];
    tokens_of(i, tok);
    kvdb_key h[TOKENS / 16];
    ASSERT_OK(kvdb_chain_hashes(&M, tok, TOKENS, h, TOKENS / 16));
    kvdb_profile_entry pe[N_CFG];
    size_t n = 0;
    ASSERT_OK(kvdb_profile_get(db, &h[TOKENS / 16 - 1], pe, N_CFG, &n));
    ASSERT(n >= N_CFG);
    ASSERT_EQ(by_reference(db, &h[TOKENS / 16 - 1]), predicted(pe));
    check_ctx(db, i, 0, &h[TOKENS / 16 - 1]);
  }
  kvdb_placement_stats ps; /* the DRAM flags the killed writer committed fit its DRAM tier */
  ASSERT_OK(kvdb_placement_stat(db, &ps, NULL, 0));
  ASSERT(ps.contexts >= (uint64_t)acked);
  ASSERT(ps.served_from[KVDB_TIER_DRAM] > 0);
  ASSERT(ps.served_from[KVDB_TIER_DRAM] * TOKENS * kvdb_model_token_bytes(&M) <= dram);
  if (dram < (2u << 20))
    ASSERT(ps.served_from[KVDB_TIER_DRAM] < (uint64_t)acked); /* some were taken out */
  kvdb_place_plan plan; /* the placement reads every context's state */
  ASSERT_OK(kvdb_rebalance_plan(db, &plan));
  ASSERT(isfinite(plan.utility_before) && isfinite(plan.utility_after));
  kvdb_place_plan_free(&plan);
  kvdb_verify_report rep;
  ASSERT_OK(kvdb_verify(db, NULL, NULL, NULL, &rep));
  ASSERT_EQ(rep.problems, 0);
  kvdb_profile_entry pe[N_CFG];
  kvdb_key k;
  put_ctx(db, 1000, 0, 0, pe, &k); /* the reopened handle has no prior: measured */
  ASSERT(!predicted(pe));
  kvdb_close(db);
  t_rmdir(dir);
}


static void test_options(void)
{
  char *dir = t_tmpdir("prior-opt");
  kvdb_options o = opts(2);
  kvdb *db = NULL;
  ASSERT_STATUS(KVDB_INVALID, kvdb_open(dir, &o, &db));
  ASSERT_MSG_HAS("placement_profile");
  t_rmdir(dir);
}

int main(void)
{
  test_options();
  test_sampled();
  test_every_put_and_asked();
  test_drift();
  test_reference();
  test_crash(4 << 20);
  test_crash(1 << 20);
  printf("ok\n");
  return 0;
}
