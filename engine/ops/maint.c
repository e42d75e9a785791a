/* SPDX-License-Identifier: MIT */
/*
 * engine/ops/maint.c — kvdb_compact (online rewrite of sparse segments). kvdb_verify is in
 * verify.c.
 *
 * Compaction, per victim segment (sealed, live fraction under the threshold):
 *   1. read each live block (verified; the victim's blocks come from the segment index, so
 *      the catalog work is linear in the blocks moved) and append it to this handle's writer
 *      segment
 *   2. fdatasync the writer segment
 *   3. write transactions of at most KV_COMPACT_BATCH records move every record still
 *      pointing at its old place (and its segment index entry), adjust both segments' live
 *      bytes, delete the victim's record when nothing is left in it and bump the catalog
 *      "gen" so readers drop cached handles
 *   4. unlink the victim file. A crash between 3 and 4 leaves a file without a record, which
 *      open removes. Readers holding an older snapshot still read the old file (open
 *      descriptors survive the unlink).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

#include "catalog/catalog.h"
#include "ops_int.h"

/* ---- compaction ---- */

kvdb_status kvdb_segments(kvdb *db, kvdb_segment_info *out, size_t cap, size_t *n)
{
  KV_RET(kv_check_db(db));
  if (n == NULL)
    return kv_fail(KVDB_INVALID, "n is NULL");
  *n = 0;
  if (out == NULL && cap > 0)
    return kv_fail(KVDB_INVALID, "out is NULL with cap %zu", cap);
  kv_txn *txn;
  kv_cat_iter it;
  KV_RET(kv_txn_begin(&db->cat, 0, &txn));
  kvdb_status rc = kv_cat_iter_open(&db->cat, txn, KV_TBL_SEGMENTS, &it, "segments");
  size_t cnt = 0;
  while (rc == KVDB_OK && kv_cat_iter_next(&it)) {
    kv_seg_rec sr;
    uint64_t id;
    if ((rc = kv_cat_iter_seg(&it, &id, &sr)) != KVDB_OK)
      break;
    if (cnt < cap) {
      kvdb_segment_info *o = &out[cnt];
      memset(o, 0, sizeof *o);
      o->id = id;
      o->tier = sr.tier;
      o->sealed = sr.state == KV_SEG_SEALED;
      o->bytes = sr.end;
      o->live_bytes = sr.live_bytes;
      o->live_blocks = sr.live_blocks;
    }
    cnt++;
  }
  kv_cat_iter_close(&it);
  kv_txn_abort(txn);
  *n = cnt;
  return rc;
}

/* most block records one compaction transaction moves (see compact_segment) */
#define KV_COMPACT_BATCH 512

typedef struct mv {
  uint8_t hash[16];
  uint64_t off, bytes, new_off;
  int moved;
} mv;

/* Blocks a compaction left in place because they failed verification (a damaged block, a
 * missing or short segment file): kvdb_compact goes on and then returns KVDB_CORRUPT. */
typedef struct damage {
  uint64_t blocks;
  char first[512]; /* the first one's message */
} damage;

/* The blocks located in segment `id` (whose committed end is `end`) in txn's snapshot: hash,
 * offset and bytes of each, in *out (malloc'ed; NULL when none). They come from the segment
 * index (catalog/index.h): the work is linear in the segment's blocks, not in the catalog's. */
static kvdb_status seg_live_blocks(kvdb *db, kv_txn *txn, uint64_t id, uint64_t end, mv **out,
                                   size_t *out_n)
{
  kv_cat_iter it;
  mv *list = NULL;
  size_t n = 0, cap = 0;
  *out = NULL;
  *out_n = 0;
  KV_RET(kv_cat_iter_seg_index(&db->cat, txn, id, &it, "compaction: segment index"));
  kvdb_status rc = KVDB_OK;
  while (kv_cat_iter_next(&it)) {
    kv_block_rec br;
    db->compact_visits++;
    /* a record lying past the segment's end is corrupt (verify says so): left alone */
    if (it.val.size != 16 || kv_cat_get_block(&db->cat, txn, it.val.data, &br) != KVDB_OK ||
        br.segment != id || br.bytes > end || br.offset > end - br.bytes)
      continue;
    if (kv_grow((void **)&list, n, &cap, sizeof *list, 64) != 0) {
      rc = kv_fail(KVDB_NOMEM, "compaction list");
      break;
    }
    memcpy(list[n].hash, it.val.data, 16);
    list[n].off = br.offset;
    list[n].bytes = br.bytes;
    list[n].moved = 0;
    n++;
  }
  kv_cat_iter_close(&it);
  if (rc != KVDB_OK) {
    free(list);
    return rc;
  }
  *out = list;
  *out_n = n;
  return KVDB_OK;
}

static kvdb_status compact_segment(kvdb *db, uint64_t id, kvdb_compact_report *rep, damage *dmg)
{
  kv_txn *txn;
  mv *list = NULL;
  size_t n = 0;
  kvdb_status rc = KVDB_OK;
  KV_RET(kv_txn_begin(&db->cat, 0, &txn));
  kv_seg_rec vic;
  if (kv_cat_get_seg(&db->cat, txn, id, &vic) != KVDB_OK)
    vic.end = 0; /* gone already: nothing to move */
  rc = seg_live_blocks(db, txn, id, vic.end, &list, &n);
  if (rc != KVDB_OK) {
    kv_txn_abort(txn);
    return rc;
  }
  kv_writer *w = NULL;
  uint64_t written = 0;
  uint8_t *buf = NULL;
  size_t buf_cap = 0;
  kv_run pk = {NULL, 0, 0, 0};
  if (rc == KVDB_OK && n > 0)
    rc = kv_writer_acquire_tier(db, kv_seg_tier(id), &w); /* a tier's blocks stay on it */
  if (rc == KVDB_OK && n > 0) /* packed objects (FORMAT.md §3e) stay packed, back to back */
    rc = kv_run_open(&pk, w->end);
  for (size_t i = 0; rc == KVDB_OK && i < n; i++) {
    kv_block_rec br;
    if (kv_cat_get_block(&db->cat, txn, list[i].hash, &br) != KVDB_OK)
      continue;
    if (KV_ALIGN_UP(br.bytes, (uint64_t)KV_PAGE) > buf_cap) {
      kv_free_aligned(buf);
      buf_cap = KV_ALIGN_UP(br.bytes, (uint64_t)KV_PAGE);
      buf = kv_alloc_aligned(buf_cap);
      buf_cap = buf ? buf_cap : 0;
      if (buf == NULL) {
        rc = kv_fail(KVDB_NOMEM, "compaction buffer");
        break;
      }
    }
    kv_block_hdr hdr;
    kvdb_status vr = kv_block_read_verify(db, &br, list[i].hash, buf, &hdr);
    if (vr != KVDB_OK) {
      /* the segment's record gone: another handle compacted it away meanwhile (see `gone`) */
      int raced = kv_seg_gone_now(db, id);
      kv_log(&db->log, vr == KVDB_CORRUPT && !raced ? 0 : 2,
             "compaction leaves a block in place: %s", kvdb_errmsg());
      if (vr == KVDB_CORRUPT && !raced && dmg->blocks++ == 0)
        snprintf(dmg->first, sizeof dmg->first, "%s", kvdb_errmsg());
      continue;
    }
    rc = kv_run_put(db, w, &pk, buf, br.bytes, (br.bflags & KV_BLK_PACKED) != 0,
                    &list[i].new_off);
    if (rc != KVDB_OK)
      break;
    list[i].moved = 1;
  }
  if (pk.p != NULL) {
    kvdb_status cr = kv_run_close(db, w, &pk, rc == KVDB_OK);
    if (rc == KVDB_OK)
      rc = cr;
  }
  if (w != NULL)
    written = pk.base - w->end;
  kv_free_aligned(buf);
  kv_txn_abort(txn);
  txn = NULL;
  if (rc == KVDB_OK && written > 0 && db->opt.sync_mode == KVDB_SYNC_FULL) {
    int e = db->io->ops->sync(db->io, kv_writer_file(w));
    if (e != 0)
      rc = kv_fail_errno(-e, "cannot fdatasync segment %" PRIu64, w->seg_id);
  }
  /* The moves commit in transactions of at most KV_COMPACT_BATCH records: each moved record
   * rewrites a leaf page of the blocks table (keys are hashes: a different leaf for nearly
   * every record), and LMDB can reuse a page freed by a transaction only after it commits, so
   * one transaction moving a whole large segment's records copies the whole table and the
   * catalog file doubles. The writer's end covers every copy from the first batch on (all were
   * synced above); a copy whose batch does not commit is dead space inside it. */
  int sealed = 0, removed = 0, gone = 0, committed = 0;
  uint64_t moved_bytes = 0, moved_blocks = 0, old_end = 0;
  for (size_t next = 0; rc == KVDB_OK && (!committed || next < n);) {
    rc = kv_txn_begin(&db->cat, 1, &txn);
    if (rc != KVDB_OK)
      break;
    kv_seg_rec old, nw;
    rc = kv_cat_get_seg(&db->cat, txn, id, &old);
    if (rc == KVDB_NOTFOUND)
      gone = 1; /* another handle compacted it meanwhile: our copies are dead, undone below */
    old_end = old.end;
    uint64_t b_bytes = 0, b_blocks = 0;
    for (size_t cnt = 0; rc == KVDB_OK && next < n && cnt < KV_COMPACT_BATCH; next++) {
      if (!list[next].moved)
        continue;
      cnt++;
      kv_block_rec br;
      if (kv_cat_get_block(&db->cat, txn, list[next].hash, &br) != KVDB_OK || br.segment != id ||
          br.offset != list[next].off)
        continue; /* deleted or moved meanwhile: our copy is dead */
      br.segment = w->seg_id;
      br.offset = list[next].new_off;
      rc = kv_cat_put_block(&db->cat, txn, list[next].hash, &br);
      if (rc == KVDB_OK)
        rc = kv_idx_seg_move(&db->cat, txn, id, w->seg_id, list[next].hash);
      old.live_bytes -= br.bytes < old.live_bytes ? br.bytes : old.live_bytes;
      old.live_blocks -= old.live_blocks ? 1 : 0;
      b_bytes += br.bytes;
      b_blocks++;
    }
    if (rc == KVDB_OK && w != NULL) {
      rc = kv_cat_get_seg(&db->cat, txn, w->seg_id, &nw);
      if (rc == KVDB_OK) {
        nw.end = w->end + written;
        nw.live_bytes += b_bytes;
        nw.live_blocks += b_blocks;
        if (nw.end >= db->opt.segment_bytes && nw.state != KV_SEG_SEALED) {
          nw.state = KV_SEG_SEALED;
          sealed = 1;
        }
        rc = kv_cat_put_seg(&db->cat, txn, w->seg_id, &nw);
      }
    }
    if (rc == KVDB_OK) {
      if (next >= n && old.live_blocks == 0) {
        rc = kv_cat_del_seg(&db->cat, txn, id);
        removed = 1;
      } else {
        old.live_bytes = old.live_blocks ? old.live_bytes : 0;
        rc = kv_cat_put_seg(&db->cat, txn, id, &old);
      }
    }
    uint64_t gen = 0;
    if (rc == KVDB_OK && kv_cat_get_u64(&db->cat, txn, "gen", &gen) == KVDB_OK)
      rc = kv_cat_put_u64(&db->cat, txn, "gen", gen + 1);
    if (rc == KVDB_OK) {
      rc = kv_txn_commit(txn);
    } else {
      kv_txn_abort(txn);
    }
    txn = NULL;
    if (rc != KVDB_OK) {
      removed = 0;
      break;
    }
    committed = 1;
    moved_bytes += b_bytes;
    moved_blocks += b_blocks;
  }
  if (w != NULL) {
    if (committed) /* its records' end covers every copy */
      w->end += written;
    else if (db->io->ops->truncate(db->io, kv_writer_file(w), w->end) != 0)
      w->end += written;
    kv_writer_release(db, w, committed && sealed);
  }
  if (rc == KVDB_OK && removed) {
    char path[4200];
    if (kv_seg_path(db, id, path, sizeof path) == KVDB_OK)
      db->io->ops->unlink(db->io, path);
    kv_txn *rt;
    if (kv_txn_begin(&db->cat, 0, &rt) == KVDB_OK) {
      kv_files_prune(db, rt);
      kv_txn_abort(rt);
    }
    rep->segments_rewritten++;
    rep->bytes_reclaimed += old_end;
  }
  rep->blocks_moved += moved_blocks;
  rep->bytes_moved += moved_bytes;
  if (committed)
    db->bytes_written += written;
  free(list);
  return gone ? KVDB_OK : rc;
}

/* ---- a full disk: free dead bytes in place ---- */

static int cmp_u64(const void *a, const void *b)
{
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

static int cmp_off(const void *a, const void *b)
{
  const mv *x = a, *y = b;
  return x->off < y->off ? -1 : x->off > y->off;
}

/*
 * Free the dead bytes of the sealed segments ids[0..n) in place, without copying anything: the
 * ranges between their live blocks are punched out of the files (fallocate PUNCH_HOLE, the
 * size kept). For a compaction that found no room to copy live blocks into (a full disk):
 * it then has the punched bytes. Safe for readers: a range dead in this snapshot is dead in
 * every later one (a sealed segment takes no new blocks), and it is done only when no reader
 * (any process: the LMDB reader table) holds an older snapshot, in which a block there could
 * still be listed. The segments' records are unchanged (their live bytes are what they were;
 * the compaction that follows removes them). *freed: bytes punched.
 */
static kvdb_status punch_dead(kvdb *db, const uint64_t *ids, size_t n, uint64_t *freed)
{
  *freed = 0;
  if (db->io->ops->punch == NULL)
    return KVDB_OK;
  kv_txn *txn;
  KV_RET(kv_txn_begin(&db->cat, 0, &txn));
  uint64_t snap = kv_txn_id(txn);
  typedef struct { uint64_t id, off, len; } range;
  range *r = NULL;
  size_t nr = 0, cap = 0;
  kvdb_status rc = KVDB_OK;
  for (size_t i = 0; rc == KVDB_OK && i < n; i++) {
    kv_seg_rec sr;
    if (kv_cat_get_seg(&db->cat, txn, ids[i], &sr) != KVDB_OK || sr.state != KV_SEG_SEALED)
      continue;
    mv *list;
    size_t nl;
    rc = seg_live_blocks(db, txn, ids[i], sr.end, &list, &nl);
    if (rc != KVDB_OK)
      break;
    if (nl > 0)
      qsort(list, nl, sizeof *list, cmp_off);
    uint64_t at = 0;
    for (size_t j = 0; j <= nl && rc == KVDB_OK; j++) {
      uint64_t upto = j < nl ? list[j].off : sr.end;
      /* whole pages only: a page that a packed object (FORMAT.md §3e) shares stays */
      uint64_t a0 = KV_ALIGN_UP(at, (uint64_t)KV_PAGE), u0 = upto / KV_PAGE * KV_PAGE;
      if (u0 > a0) {
        if (kv_grow((void **)&r, nr, &cap, sizeof *r, 64) != 0) {
          rc = kv_fail(KVDB_NOMEM, "compaction: dead ranges");
          break;
        }
        r[nr++] = (range){ids[i], a0, u0 - a0};
      }
      if (j < nl && list[j].off + list[j].bytes > at)
        at = list[j].off + list[j].bytes;
    }
    free(list);
  }
  uint64_t oldest = UINT64_MAX; /* (this snapshot is in the table too: not older than itself) */
  if (rc == KVDB_OK && nr > 0)
    oldest = kv_cat_oldest_reader(&db->cat);
  kv_txn_abort(txn);
  if (rc == KVDB_OK && nr > 0 && oldest < snap) {
    kv_log(&db->log, 1, "compaction: a reader holds a snapshot older than %" PRIu64 " (txn %"
           PRIu64 "): dead bytes not freed in place", snap, oldest);
    nr = 0;
  }
  kv_file *f = NULL;
  uint64_t fid = 0;
  for (size_t i = 0; rc == KVDB_OK && i < nr; i++) {
    if (f == NULL || fid != r[i].id) {
      if (f != NULL)
        db->io->ops->close(db->io, f);
      f = NULL;
      char path[4200];
      if (kv_seg_path(db, r[i].id, path, sizeof path) != KVDB_OK ||
          db->io->ops->open(db->io, path, 0, NULL, &f) != 0) {
        f = NULL;
        continue; /* gone meanwhile (another handle compacted it) */
      }
      fid = r[i].id;
    }
    int e = db->io->ops->punch(db->io, f, r[i].off, r[i].len);
    if (e == -EOPNOTSUPP)
      break;
    if (e != 0) {
      rc = kv_fail_errno(-e, "cannot free dead bytes of segment %" PRIu64, r[i].id);
      break;
    }
    *freed += r[i].len;
  }
  if (f != NULL)
    db->io->ops->close(db->io, f);
  free(r);
  return rc;
}

kvdb_status kvdb_compact(kvdb *db, double threshold, kvdb_progress_fn progress, void *ctx,
                         kvdb_compact_report *report)
{
  KV_RET(kv_check_db(db));
  kvdb_compact_report tmp;
  if (report == NULL)
    report = &tmp;
  memset(report, 0, sizeof *report);
  if (!(threshold >= 0 && threshold <= 1))
    return kv_fail(KVDB_INVALID, "threshold %g is not in 0..1", threshold);
  if (threshold == 0)
    threshold = 0.5;
  if (db->cat.rdonly)
    return kv_fail(KVDB_READONLY, "database '%s' is open read-only", db->dir);
  kv_txn *txn;
  KV_RET(kv_txn_begin(&db->cat, 0, &txn));
  uint64_t *ids = NULL;
  size_t n = 0, cap = 0;
  kv_cat_iter it;
  kvdb_status rc = kv_cat_iter_open(&db->cat, txn, KV_TBL_SEGMENTS, &it, "compaction: segments");
  if (rc != KVDB_OK) {
    kv_txn_abort(txn);
    return rc;
  }
  while (kv_cat_iter_next(&it)) {
    kv_seg_rec sr;
    uint64_t id;
    if (kv_cat_iter_seg(&it, &id, &sr) != KVDB_OK)
      continue;
    if (sr.state != KV_SEG_SEALED || sr.end == 0 || (double)sr.live_bytes >= threshold * (double)sr.end)
      continue;
    if (kv_grow((void **)&ids, n, &cap, sizeof *ids, 32) != 0) { /* (live bytes, id) pairs */
      rc = kv_fail(KVDB_NOMEM, "compaction");
      break;
    }
    ids[n++] = id;
    ids[n++] = sr.live_bytes;
  }
  kv_cat_iter_close(&it);
  kv_txn_abort(txn);
  n /= 2;
  /* the least live first: a segment with nothing live frees its file without copying, and
   * each copy needs room for its live bytes only, freed back with interest by its unlink */
  for (size_t i = 0; i < n; i++) {
    uint64_t id = ids[2 * i];
    ids[2 * i] = ids[2 * i + 1];
    ids[2 * i + 1] = id;
  }
  if (n > 1)
    qsort(ids, n, 2 * sizeof *ids, cmp_u64);
  int punched = 0;
  damage dmg = {0};
  for (size_t i = 0; rc == KVDB_OK && i < n; i++) {
    rc = compact_segment(db, ids[2 * i + 1], report, &dmg);
    if (rc == KVDB_FULL && !punched) {
      /* no room to copy into: free the dead bytes of this and the remaining victims in
       * place, then copy again */
      char why[256];
      snprintf(why, sizeof why, "%s", kvdb_errmsg());
      punched = 1;
      uint64_t freed = 0;
      uint64_t *left = malloc((n - i) * sizeof *left);
      kvdb_status pr = left != NULL ? KVDB_OK : kv_fail(KVDB_NOMEM, "compaction");
      for (size_t j = i; left != NULL && j < n; j++)
        left[j - i] = ids[2 * j + 1];
      if (pr == KVDB_OK)
        pr = punch_dead(db, left, n - i, &freed);
      free(left);
      if (pr == KVDB_OK && freed > 0) {
        kv_log(&db->log, 2, "compaction: the disk is full (%s); freed %" PRIu64 " dead bytes of "
               "%zu segments in place", why, freed, n - i);
        rc = compact_segment(db, ids[2 * i + 1], report, &dmg);
      } else {
        rc = kv_fail(KVDB_FULL, "compaction: %s; and the dead bytes could not be freed in place "
                     "(%s)", why, pr != KVDB_OK ? kvdb_errmsg()
                     : "no dead bytes, a filesystem without hole punching, or an older reader");
      }
    }
    if (progress != NULL)
      progress(ctx, i + 1, n);
  }
  free(ids);
  if (rc == KVDB_OK) {
    /* the catalog too, when deletes left it more than twice what a rewrite takes and this
     * handle is its only user (kv_catalog_vacuum) */
    int done = 0;
    uint64_t before = 0, after = 0;
    kvdb_status vr = kv_catalog_vacuum(&db->cat, 0, &done, &before, &after);
    if (vr != KVDB_OK && db->cat.env == NULL)
      return vr; /* the handle lost its catalog: nothing more works on it */
    if (vr != KVDB_OK)
      kv_log(&db->log, 1, "compaction: the catalog was not rewritten: %s", kvdb_errmsg());
    else if (done)
      kv_log(&db->log, 2, "compaction: catalog rewritten in key order, %" PRIu64 " -> %" PRIu64
             " bytes", before, after);
  }
  if (rc == KVDB_OK && dmg.blocks > 0)
    return kv_fail(KVDB_CORRUPT, "compaction moved every other block; %" PRIu64 " blocks failed "
                   "verification and stay in place (kvdb_verify lists them), the first: %s",
                   dmg.blocks, dmg.first);
  return rc;
}
