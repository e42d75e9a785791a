/* SPDX-License-Identifier: MIT */
/*
 * tests/fault/test_fault.c — I/O faults as the normal case (SQLite's ioerr loops).
 *
 * 1. A full disk: the space reservation (fallocate) or the segment writes fail with ENOSPC; the
 *    put fails cleanly with KVDB_FULL, earlier data stays intact, and puts succeed again once
 *    space is freed.
 * 2. For each kind of operation (read, write, fsync, open, truncate, fallocate) and N = 1, 2, ...: the
 *    Nth such operation fails (EIO, or a short write) during a workload of put, get, lookup,
 *    get_tokens, delete and compact. Every call returns a status (never crashes), the
 *    database reopens, kvdb_verify passes, and every put acknowledged before or after the
 *    fault reads back bit-exact. The loop ends when the workload runs without the fault firing.
 * 3. The same with placement on (EvicPress): puts placed by Algorithm 1, a rebalance planned
 *    and executed, gets, a delete, a compaction — for write, fsync, read and fallocate faults.
 */
#include "kvdb_test.h"

#include <errno.h>

#include "io_test.h"

static const kvdb_model M = {"fault-model", 2, 2, 128, KVDB_F16, 32};

static kvdb_options opts(void)
{
  kvdb_options o;
  kvdb_options_init(&o);
  o.dram_bytes = 1 << 20;
  o.segment_bytes = 1 << 20;
  o.log_level = getenv("KVDB_TEST_DEBUG") ? 2 : -1;
  return o;
}

static size_t ctx_tokens(int i, uint32_t *tok)
{
  uint64_t s = 77 + (uint64_t)i;
  size_t n = 40 + (size_t)(i * 37 % 90);
  for (size_t k = 0; k < n; k++)
    tok[k] = (uint32_t)(k < 32 ? k + 1 : t_rand(&s) % 30000); /* all share one block */
  return n;
}

static kvdb_status put_i(kvdb *db, int i)
{
  uint32_t tok[160];
  size_t n = ctx_tokens(i, tok);
  uint16_t *buf = malloc(n * kvdb_model_token_bytes(&M));
  t_fill_kv(&M, tok, n, buf);
  kvdb_kv_view v;
  kvdb_kv_view_packed(&v, buf, &M, n, KVDB_LAYOUT_LKTHD);
  kvdb_status rc = kvdb_put(db, &M, tok, n, &v, NULL);
  free(buf);
  return rc;
}

/* 1 when context i reads back whole and exact */
static int intact(kvdb *db, int i)
{
  uint32_t tok[160];
  size_t n = ctx_tokens(i, tok);
  uint16_t *buf = calloc(n, kvdb_model_token_bytes(&M));
  kvdb_kv_view v;
  kvdb_kv_view_packed(&v, buf, &M, n, KVDB_LAYOUT_LKTHD);
  size_t hit = 0;
  kvdb_status rc = kvdb_get(db, &M, tok, n, &v, &hit);
  int ok = rc == KVDB_OK && hit == n && t_check_kv(&M, tok, n, n, buf) == n;
  if (!ok && getenv("KVDB_TEST_DEBUG"))
    fprintf(stderr, "context %d: %s, hit %zu of %zu, first bad %zu (%s)\n", i, kvdb_status_name(rc),
            hit, n, t_check_kv(&M, tok, hit, n, buf), kvdb_errmsg());
  free(buf);
  return ok;
}

static kvdb_key key_of(int i)
{
  uint32_t tok[160];
  size_t n = ctx_tokens(i, tok);
  kvdb_key h[8];
  kvdb_chain_hashes(&M, tok, n, h, 8);
  return h[(n + 31) / 32 - 1];
}

/* kind: IOT_ALLOC (a filesystem that reserves space refuses the reservation) or IOT_WRITE
 * (one that cannot reserve runs out while writing) */
static void test_full_disk(int kind)
{
  char *dir = t_tmpdir("full");
  iot_config c = {.fail_kind = -1};
  iot_install(&c);
  kvdb_options o = opts();
  kvdb *db;
  ASSERT_OK(kvdb_open(dir, &o, &db));
  for (int i = 0; i < 5; i++)
    ASSERT_OK(put_i(db, i));
  /* the disk fills up: every reservation or write from now on fails */
  iot_set_fault(kind, 1, ENOSPC, 1);
  ASSERT_STATUS(KVDB_FULL, put_i(db, 5));
  ASSERT_MSG_HAS("No space left");
  ASSERT_STATUS(KVDB_FULL, put_i(db, 6));
  for (int i = 0; i < 5; i++)
    ASSERT(intact(db, i));
  size_t hit;
  uint32_t tok[160];
  size_t n = ctx_tokens(5, tok);
  ASSERT_OK(kvdb_lookup(db, &M, tok, n, &hit));
  ASSERT(hit < n); /* the failed put is not visible */
  /* space is freed */
  iot_set_fault(-1, 0, 0, 0);
  ASSERT_OK(put_i(db, 5));
  ASSERT_OK(put_i(db, 6));
  ASSERT(intact(db, 5) && intact(db, 6));
  kvdb_close(db);
  iot_uninstall();
  ASSERT_OK(kvdb_open(dir, &o, &db));
  for (int i = 0; i < 7; i++)
    ASSERT(intact(db, i));
  ASSERT_OK(kvdb_verify(db, NULL, NULL, NULL, NULL));
  kvdb_close(db);
  t_rmdir(dir);
}

/* The workload; acked[i] = 1 for every context whose put returned OK and was not deleted. */
static void workload(kvdb *db, int *acked)
{
  for (int i = 0; i < 6; i++)
    if (put_i(db, i) == KVDB_OK)
      acked[i] = 1;
  for (int i = 0; i < 6; i++) {
    uint32_t tok[160];
    size_t n = ctx_tokens(i, tok), hit;
    (void)kvdb_lookup(db, &M, tok, n, &hit);
    (void)intact(db, i);
  }
  kvdb_key k = key_of(1);
  uint32_t pos[3] = {0, 17, 39};
  uint16_t out[2 * 3 * 2 * 128];
  kvdb_kv_view v;
  kvdb_kv_view_packed(&v, out, &M, 3, KVDB_LAYOUT_LKTHD);
  (void)kvdb_get_tokens(db, &M, &k, 1, pos, 3, &v);
  k = key_of(2);
  kvdb_status rc = kvdb_delete(db, &k);
  if (rc == KVDB_OK)
    acked[2] = 0;
  else
    acked[2] = -acked[2]; /* unknown: a failed delete may or may not have committed */
  (void)kvdb_compact(db, 0.99, NULL, NULL, NULL);
  for (int i = 6; i < 9; i++)
    if (put_i(db, i) == KVDB_OK)
      acked[i] = 1;
}

/* ---- placement and rebalance under faults ------------------------------------------------ */

static kvdb_options place_opts(void)
{
  kvdb_options o = opts();
  o.placement = KVDB_PLACEMENT_EVICPRESS;
  o.placement_alpha = 1e6; /* quality first: contexts stay exact (raw or lossless) */
  o.dram_bytes = 256 << 10;
  o.ssd_bytes = 192 << 10; /* about 3 of the contexts: the others go to the SmartSSD tier */
  o.smartssd_bytes = 64 << 20;
  return o;
}

/* Puts placed by Algorithm 1 (profile, relocations), a rebalance planned and executed, gets,
 * a delete, a compaction; acked as in workload(). */
static void workload_place(kvdb *db, int *acked)
{
  for (int i = 4; i < 7; i++)
    if (put_i(db, i) == KVDB_OK)
      acked[i] = 1;
  kvdb_place_plan plan;
  if (kvdb_rebalance_plan(db, &plan) == KVDB_OK) {
    kvdb_rebalance_report rep;
    (void)kvdb_rebalance_execute(db, &plan, &rep);
    if (getenv("KVDB_TEST_DEBUG"))
      fprintf(stderr, "plan: %zu moves\n", plan.n_moves);
    kvdb_place_plan_free(&plan);
  }
  for (int i = 0; i < 7; i++)
    (void)intact(db, i);
  kvdb_key k = key_of(1);
  if (kvdb_delete(db, &k) == KVDB_OK)
    acked[1] = 0;
  else
    acked[1] = -acked[1];
  (void)kvdb_compact(db, 0.99, NULL, NULL, NULL);
}

/* Every fault point of a workload: for N = 1, 2, ... the Nth operation of `kind` fails; then
 * the real I/O reopens the database, every acknowledged context reads back and verify is clean.
 * `base` NULL: the plain workload on a new database; else the placement workload, each round on
 * a copy of `base` (its placement settings and tier figures recorded: no probe under the
 * fault) whose contexts 0..3 are stored. */
static long fault_loop(int kind, int err, int short_write, const char *name, const char *base)
{
  long points = 0;
  for (long at = 1;; at++) {
    char *dir = t_tmpdir("faultloop");
    int acked[9] = {0};
    if (base != NULL) {
      char cmd[8400];
      snprintf(cmd, sizeof cmd, "cp -a '%s'/. '%s'/", base, dir);
      ASSERT(system(cmd) == 0);
      for (int i = 0; i < 4; i++)
        acked[i] = 1;
    }
    iot_config c = {.fail_kind = kind, .fail_at = at, .fail_errno = err, .short_write = short_write};
    iot_install(&c);
    kvdb_options o = base != NULL ? place_opts() : opts();
    kvdb *db = NULL;
    kvdb_status rc = kvdb_open(dir, &o, &db);
    if (rc == KVDB_OK) {
      if (base != NULL)
        workload_place(db, acked);
      else
        workload(db, acked);
      kvdb_close(db);
    }
    int fired = iot_fired();
    iot_uninstall();
    /* reopen with the real I/O: everything acknowledged is there, verify is clean */
    ASSERT_OK(kvdb_open(dir, &o, &db));
    for (int i = 0; i < 9; i++)
      if (acked[i] == 1 && !intact(db, i)) {
        fprintf(stderr, "%s fault at %ld: acknowledged context %d lost\n", name, at, i);
        abort();
      }
    kvdb_verify_report rep;
    rc = kvdb_verify(db, NULL, NULL, NULL, &rep);
    if (rc != KVDB_OK) {
      fprintf(stderr, "%s fault at %ld: verify: %s\n", name, at, kvdb_errmsg());
      abort();
    }
    kvdb_close(db);
    t_rmdir(dir);
    if (!fired)
      break;
    points++;
  }
  printf("fault loop %s%-14s: %ld fault points, all recovered\n", base != NULL ? "placement " : "",
         name, points);
  return points;
}

static long place_faults(void)
{
  char *base = t_tmpdir("placebase");
  kvdb_options o = place_opts();
  kvdb *db;
  ASSERT_OK(kvdb_open(base, &o, &db)); /* probes the tier once, records the settings */
  for (int i = 0; i < 4; i++)
    ASSERT_OK(put_i(db, i));
  kvdb_close(db);
  long n = fault_loop(IOT_WRITE, EIO, 0, "write EIO", base);
  n += fault_loop(IOT_SYNC, EIO, 0, "fsync EIO", base);
  n += fault_loop(IOT_READ, EIO, 0, "read EIO", base);
  n += fault_loop(IOT_ALLOC, ENOSPC, 0, "fallocate", base);
  t_rmdir(base);
  return n;
}

/* 4. A get of a compressed context of several blocks (the next block's read queued before a
 *    block is decoded, engine/ops/get.c) with its Nth read failing (EIO), N = 1, 2, ...: the
 *    get returns OK with the blocks before the failed read's block (a failed read is a miss;
 *    a later block's failure never costs an earlier one: kv_batch_wait_first), bit-exact, and
 *    nothing where the blocks after the failed one go. */
static void test_get_read_fault(void)
{
  static const kvdb_model MG = {"fault-get", 8, 8, 128, KVDB_F16, 256};
  enum { NG = 4 * 256 };
  char *dir = t_tmpdir("faultget");
  kvdb_options o = opts();
  o.dram_bytes = 0;
  o.segment_bytes = 1u << 30;
  kvdb *db;
  ASSERT_OK(kvdb_open(dir, &o, &db));
  size_t tb = kvdb_model_token_bytes(&MG), plane = (size_t)MG.n_kv_heads * MG.head_dim;
  uint16_t *src = malloc(NG * tb), *ref = malloc(NG * tb), *a = malloc(NG * tb);
  uint32_t *tok = malloc(NG * sizeof *tok);
  ASSERT(src != NULL && ref != NULL && a != NULL && tok != NULL);
  uint64_t sd = 991;
  for (size_t i = 0; i < NG; i++)
    tok[i] = (uint32_t)(t_rand(&sd) % 30000);
  t_fill_kv(&MG, tok, NG, src);
  kvdb_put_opts po;
  kvdb_put_opts_init(&po);
  ASSERT_OK(kvdb_config_parse("int4", &po.config));
  kvdb_kv_view v;
  ASSERT_OK(kvdb_kv_view_packed(&v, src, &MG, NG, KVDB_LAYOUT_LKTHD));
  ASSERT_OK(kvdb_put_ex(db, &MG, tok, NG, &v, &po, NULL));
  size_t hit = 0;
  ASSERT_OK(kvdb_kv_view_packed(&v, ref, &MG, NG, KVDB_LAYOUT_LKTHD));
  ASSERT_OK(kvdb_get(db, &MG, tok, NG, &v, &hit));
  ASSERT_EQ(hit, NG);
  kvdb_close(db);
  long points = 0;
  size_t shortest = NG, longest = 0, last = 0;
  for (long at = 1;; at++) {
    iot_config c = {.fail_kind = IOT_READ, .fail_at = at, .fail_errno = EIO};
    iot_install(&c);
    ASSERT_OK(kvdb_open(dir, &o, &db));
    memset(a, 0x5A, NG * tb);
    ASSERT_OK(kvdb_kv_view_packed(&v, a, &MG, NG, KVDB_LAYOUT_LKTHD));
    hit = 1;
    kvdb_status rc = kvdb_get(db, &MG, tok, NG, &v, &hit);
    int fired = iot_fired();
    kvdb_close(db);
    iot_uninstall();
    if (rc != KVDB_OK)
      hit = 0; /* (an error other than a read's, e.g. the catalog's: no KV either) */
    ASSERT(hit % 256 == 0);
    if (fired && hit < shortest)
      shortest = hit;
    if (fired && hit > longest)
      longest = hit;
    ASSERT(!fired || hit >= last); /* a later read's failure: never a shorter hit */
    if (fired)
      last = hit;
    for (size_t lk = 0; lk < 2u * MG.n_layers; lk++) {
      ASSERT(memcmp(a + lk * NG * plane, ref + lk * NG * plane, hit * plane * 2) == 0);
      size_t next = hit + 256 < NG ? hit + 256 : NG; /* the failed block's layers may be */
      for (size_t i = next * plane; i < NG * plane; i++)
        ASSERT_EQ(a[lk * NG * plane + i], 0x5A5A);
    }
    if (!fired)
      break;
    points++;
  }
  ASSERT(points >= 4 && shortest == 0 && longest == NG - 256); /* (a read per block at least) */
  printf("get read faults: %ld fault points, every hit a bit-exact prefix\n", points);
  free(tok);
  free(src);
  free(ref);
  free(a);
  t_rmdir(dir);
}

int main(void)
{
  test_get_read_fault();
  test_full_disk(IOT_ALLOC);
  test_full_disk(IOT_WRITE);
  long total = 0;
  total += fault_loop(IOT_WRITE, EIO, 0, "write EIO", NULL);
  total += fault_loop(IOT_WRITE, ENOSPC, 1, "short write", NULL);
  total += fault_loop(IOT_SYNC, EIO, 0, "fsync EIO", NULL);
  total += fault_loop(IOT_READ, EIO, 0, "read EIO", NULL);
  total += fault_loop(IOT_OPEN, EIO, 0, "open EIO", NULL);
  total += fault_loop(IOT_TRUNC, EIO, 0, "truncate EIO", NULL);
  total += fault_loop(IOT_ALLOC, ENOSPC, 0, "fallocate ENOSPC", NULL);
  total += place_faults();
  printf("test_fault: full disk ok; %ld fault points survived\n", total);
  return 0;
}
