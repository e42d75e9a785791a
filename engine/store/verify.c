/* SPDX-License-Identifier: MIT */
/*
 * engine/store/verify.c — kvdb_verify: every checksum, and the catalog against the segments.
 */
#define _GNU_SOURCE
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include "kv_db.h"

/* ---- a small map of 16-byte keys to counters (verify) ---- */
typedef struct kmap {
  uint8_t (*key)[16];
  uint64_t *val;
  uint8_t *used;
  size_t cap, n;
} kmap;

static int kmap_init(kmap *m, size_t want)
{
  m->cap = 1024;
  while (m->cap < want * 2)
    m->cap *= 2;
  m->key = calloc(m->cap, 16);
  m->val = calloc(m->cap, sizeof *m->val);
  m->used = calloc(m->cap, 1);
  m->n = 0;
  return m->key && m->val && m->used ? 0 : -1;
}

static void kmap_free(kmap *m)
{
  free(m->key);
  free(m->val);
  free(m->used);
}

static uint64_t *kmap_slot(kmap *m, const uint8_t *k)
{
  uint64_t h;
  memcpy(&h, k, 8);
  size_t i = h & (m->cap - 1);
  while (m->used[i] && memcmp(m->key[i], k, 16) != 0)
    i = (i + 1) & (m->cap - 1);
  if (!m->used[i]) {
    if (m->n * 2 >= m->cap)
      return NULL;
    m->used[i] = 1;
    memcpy(m->key[i], k, 16);
    m->val[i] = 0;
    m->n++;
  }
  return &m->val[i];
}

typedef struct vctx {
  kvdb_problem_fn fn;
  void *ctx;
  kvdb_verify_report *rep;
} vctx;

static void problem(vctx *v, kvdb_status st, const char *fmt, ...) KV_PRINTF(3, 4);
static void problem(vctx *v, kvdb_status st, const char *fmt, ...)
{
  char msg[600];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  v->rep->problems++;
  if (v->fn != NULL) {
    kvdb_problem p = {st, msg};
    v->fn(v->ctx, &p);
  }
}

/* 1 when segment `id` has no record in the catalog as it is now: a compaction in some handle
 * moved its blocks and removed its file while verify read an older snapshot. Not a problem. */
static int seg_gone_now(kvdb *db, uint64_t id)
{
  MDB_txn *txn;
  if (kv_txn_begin(&db->cat, 0, &txn) != KVDB_OK)
    return 0;
  kv_seg_rec sr;
  int gone = kv_cat_get_seg(&db->cat, txn, id, &sr) == KVDB_NOTFOUND;
  mdb_txn_abort(txn);
  return gone;
}

/* mdb_cursor_open, its failure (ENOMEM) as a status */
static kvdb_status cursor_open(MDB_txn *txn, MDB_dbi dbi, MDB_cursor **cur, const char *what)
{
  int mrc = mdb_cursor_open(txn, dbi, cur);
  return mrc == 0 ? KVDB_OK : kv_mdb_fail(mrc, what);
}

kvdb_status kvdb_verify(kvdb *db, kvdb_problem_fn on_problem, kvdb_progress_fn progress, void *ctx,
                        kvdb_verify_report *report)
{
  KV_RET(kv_check_db(db));
  kvdb_verify_report tmp;
  if (report == NULL)
    report = &tmp;
  memset(report, 0, sizeof *report);
  vctx v = {on_problem, ctx, report};
  MDB_txn *txn;
  KV_RET(kv_txn_begin(&db->cat, 0, &txn));
  MDB_stat ms;
  if (mdb_stat(txn, db->cat.blocks, &ms) != 0)
    ms.ms_entries = 0; /* only sizes the maps */
  uint64_t n_blocks = ms.ms_entries;
  kmap refs, live;
  kvdb_status rc = KVDB_OK;
  char hx[33], hx2[33];
  if (kmap_init(&refs, n_blocks + 16) != 0 || kmap_init(&live, 4096) != 0) {
    rc = kv_fail(KVDB_NOMEM, "verify maps");
    goto out;
  }
  MDB_cursor *cur;
  MDB_val k, val;
  int mrc;
  /* contexts: every listed block exists */
  if ((rc = cursor_open(txn, db->cat.contexts, &cur, "verify: contexts")) != KVDB_OK)
    goto out;
  for (mrc = mdb_cursor_get(cur, &k, &val, MDB_FIRST); mrc == 0;
       mrc = mdb_cursor_get(cur, &k, &val, MDB_NEXT)) {
    report->contexts_checked++;
    kv_ctx_rec cr;
    if (k.mv_size != 16 || kv_ctx_rec_decode(val.mv_data, val.mv_size, &cr) != KVDB_OK) {
      problem(&v, KVDB_CORRUPT, "context record %s: %s",
              k.mv_size == 16 ? kv_hex16(k.mv_data, hx) : "?", kvdb_errmsg());
      continue;
    }
    for (uint32_t i = 0; i < cr.n_blocks; i++) {
      const uint8_t *h = cr.blocks + 16 * i;
      kv_block_rec br;
      if (kv_cat_get_block(&db->cat, txn, h, &br) != KVDB_OK) {
        problem(&v, KVDB_CORRUPT, "context %s lists block %s, which is missing or corrupt",
                kv_hex16(k.mv_data, hx), kv_hex16(h, hx2));
        continue;
      }
      uint64_t *c = kmap_slot(&refs, h);
      if (c != NULL)
        (*c)++;
    }
  }
  mdb_cursor_close(cur);
  /* blocks: refcounts, locations, data */
  uint8_t *buf = NULL;
  size_t buf_cap = 0;
  if ((rc = cursor_open(txn, db->cat.blocks, &cur, "verify: blocks")) != KVDB_OK)
    goto out;
  for (mrc = mdb_cursor_get(cur, &k, &val, MDB_FIRST); mrc == 0;
       mrc = mdb_cursor_get(cur, &k, &val, MDB_NEXT)) {
    report->blocks_checked++;
    if (progress != NULL)
      progress(ctx, report->blocks_checked, n_blocks);
    kv_block_rec br;
    if (k.mv_size != 16 || kv_block_rec_decode(val.mv_data, val.mv_size, &br) != KVDB_OK) {
      problem(&v, KVDB_CORRUPT, "block record %s: %s",
              k.mv_size == 16 ? kv_hex16(k.mv_data, hx) : "?", kvdb_errmsg());
      continue;
    }
    uint64_t *c = kmap_slot(&refs, k.mv_data);
    if (c != NULL && *c != br.refcount)
      problem(&v, KVDB_CORRUPT, "block %s has refcount %u but %" PRIu64 " contexts list it",
              kv_hex16(k.mv_data, hx), br.refcount, *c);
    kv_seg_rec sr;
    if (kv_cat_get_seg(&db->cat, txn, br.segment, &sr) != KVDB_OK) {
      problem(&v, KVDB_CORRUPT, "block %s is in segment %" PRIu64 ", which has no record",
              kv_hex16(k.mv_data, hx), br.segment);
      continue;
    }
    if (br.bytes > sr.end || br.offset > sr.end - br.bytes) {
      /* not read: its `bytes` may be anything (an allocation of petabytes) */
      problem(&v, KVDB_CORRUPT, "block %s lies past the committed end of segment %" PRIu64,
              kv_hex16(k.mv_data, hx), br.segment);
      continue;
    }
    uint8_t segkey[16] = {0};
    kv_put_le64(segkey, br.segment);
    uint64_t *l = kmap_slot(&live, segkey);
    if (l != NULL)
      *l += br.bytes;
    if (br.bytes > buf_cap) {
      kv_free_aligned(buf);
      buf = kv_alloc_aligned(br.bytes);
      buf_cap = buf ? br.bytes : 0;
      if (buf == NULL) {
        rc = kv_fail(KVDB_NOMEM, "verify buffer");
        break;
      }
    }
    kv_block_hdr hdr;
    kvdb_status st = kv_block_read_verify(db, &br, k.mv_data, buf, &hdr);
    if (st == KVDB_OK)
      report->bytes_checked += br.bytes;
    else if (!(st == KVDB_NOTFOUND && seg_gone_now(db, br.segment)))
      problem(&v, st, "%s", kvdb_errmsg());
  }
  mdb_cursor_close(cur);
  kv_free_aligned(buf);
  /* segments: files present, long enough, live bytes add up */
  if ((rc = cursor_open(txn, db->cat.segments, &cur, "verify: segments")) != KVDB_OK)
    goto out;
  for (mrc = mdb_cursor_get(cur, &k, &val, MDB_FIRST); mrc == 0 && rc == KVDB_OK;
       mrc = mdb_cursor_get(cur, &k, &val, MDB_NEXT)) {
    report->segments_checked++;
    kv_seg_rec sr;
    if (k.mv_size != 8 || kv_seg_rec_decode(val.mv_data, val.mv_size, &sr) != KVDB_OK) {
      problem(&v, KVDB_CORRUPT, "segment record: %s", kvdb_errmsg());
      continue;
    }
    uint64_t id = kv_get_be64(k.mv_data);
    uint8_t segkey[16] = {0};
    kv_put_le64(segkey, id);
    uint64_t *l = kmap_slot(&live, segkey);
    if (l != NULL && *l != sr.live_bytes)
      problem(&v, KVDB_CORRUPT, "segment %" PRIu64 " records %" PRIu64 " live bytes, blocks add up to %" PRIu64,
              id, sr.live_bytes, *l);
    if (sr.end == 0)
      continue;
    kv_segfile *sf;
    kvdb_status st = kv_segfile_get(db, id, &sf);
    if (st != KVDB_OK) {
      if (!(st == KVDB_NOTFOUND && seg_gone_now(db, id)))
        problem(&v, KVDB_CORRUPT, "segment %" PRIu64 ": %s", id, kvdb_errmsg());
      continue;
    }
    uint64_t size = 0;
    if (db->io->ops->size(db->io, sf->f, &size) == 0 && size < sr.end)
      problem(&v, KVDB_CORRUPT, "segment %" PRIu64 " file has %" PRIu64 " bytes, %" PRIu64 " committed",
              id, size, sr.end);
    kv_segfile_put(db, sf);
  }
  mdb_cursor_close(cur);
out:
  kmap_free(&refs);
  kmap_free(&live);
  mdb_txn_abort(txn);
  if (rc != KVDB_OK)
    return rc;
  if (report->problems > 0)
    return kv_fail(KVDB_CORRUPT, "%" PRIu64 " problems found", report->problems);
  return KVDB_OK;
}

