/* SPDX-License-Identifier: MIT */
/*
 * engine/store/maint.c — kvdb_compact (online rewrite of sparse segments). kvdb_verify is in
 * verify.c.
 *
 * Compaction, per victim segment (sealed, live fraction under the threshold):
 *   1. read each live block (verified; the victim's blocks come from the segment index, so
 *      the catalog work is linear in the blocks moved) and append it to this handle's writer
 *      segment
 *   2. fdatasync the writer segment
 *   3. one write transaction moves every record still pointing at its old place, adjusts
 *      both segments' live bytes, deletes the victim's record when nothing is left in it and
 *      bumps the catalog "gen" so readers drop cached handles; commit
 *   4. unlink the victim file. A crash between 3 and 4 leaves a file without a record, which
 *      open removes. Readers holding an older snapshot still read the old file (open
 *      descriptors survive the unlink).
 */
#define _GNU_SOURCE
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

#include "catalog/index.h"
#include "kv_db.h"

/* mdb_cursor_open, its failure (ENOMEM) as a status */
static kvdb_status cursor_open(MDB_txn *txn, MDB_dbi dbi, MDB_cursor **cur, const char *what)
{
  int mrc = mdb_cursor_open(txn, dbi, cur);
  return mrc == 0 ? KVDB_OK : kv_mdb_fail(mrc, what);
}

/* ---- compaction ---- */

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

static kvdb_status compact_segment(kvdb *db, uint64_t id, kvdb_compact_report *rep, damage *dmg)
{
  MDB_txn *txn;
  MDB_cursor *cur;
  MDB_val k, val;
  int mrc;
  mv *list = NULL;
  size_t n = 0, cap = 0;
  kvdb_status rc = KVDB_OK;
  KV_RET(kv_txn_begin(&db->cat, 0, &txn));
  kv_seg_rec vic;
  if (kv_cat_get_seg(&db->cat, txn, id, &vic) != KVDB_OK)
    vic.end = 0; /* gone already: nothing to move */
  /* the victim's blocks, from the segment index: the work is linear in them */
  if ((rc = cursor_open(txn, db->cat.segblocks, &cur, "compaction: segment index")) != KVDB_OK) {
    mdb_txn_abort(txn);
    return rc;
  }
  uint8_t sk[8];
  kv_be64(sk, id);
  k = (MDB_val){8, sk};
  for (mrc = mdb_cursor_get(cur, &k, &val, MDB_SET_KEY); mrc == 0;
       mrc = mdb_cursor_get(cur, &k, &val, MDB_NEXT_DUP)) {
    kv_block_rec br;
    db->compact_visits++;
    /* a record lying past the segment's end is corrupt (verify says so): left alone */
    if (val.mv_size != 16 || kv_cat_get_block(&db->cat, txn, val.mv_data, &br) != KVDB_OK ||
        br.segment != id || br.bytes > vic.end || br.offset > vic.end - br.bytes)
      continue;
    if (n == cap) {
      cap = cap ? cap * 2 : 64;
      mv *nl = realloc(list, cap * sizeof *nl);
      if (nl == NULL) {
        rc = kv_fail(KVDB_NOMEM, "compaction list");
        break;
      }
      list = nl;
    }
    memcpy(list[n].hash, val.mv_data, 16);
    list[n].off = br.offset;
    list[n].bytes = br.bytes;
    list[n].moved = 0;
    n++;
  }
  mdb_cursor_close(cur);
  kv_writer *w = NULL;
  uint64_t written = 0;
  uint8_t *buf = NULL;
  size_t buf_cap = 0;
  if (rc == KVDB_OK && n > 0)
    rc = kv_writer_acquire_tier(db, kv_seg_tier(id), &w); /* a tier's blocks stay on it */
  for (size_t i = 0; rc == KVDB_OK && i < n; i++) {
    kv_block_rec br;
    if (kv_cat_get_block(&db->cat, txn, list[i].hash, &br) != KVDB_OK)
      continue;
    if (br.bytes > buf_cap) {
      kv_free_aligned(buf);
      buf = kv_alloc_aligned(br.bytes);
      buf_cap = buf ? br.bytes : 0;
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
    int e = db->io->ops->pwrite(db->io, kv_writer_file(w), buf, br.bytes, w->end + written);
    if (e != 0) {
      rc = kv_fail_errno(-e, "cannot write segment %" PRIu64, w->seg_id);
      break;
    }
    list[i].new_off = w->end + written;
    list[i].moved = 1;
    written += br.bytes;
  }
  kv_free_aligned(buf);
  mdb_txn_abort(txn);
  txn = NULL;
  if (rc == KVDB_OK && written > 0 && db->opt.sync_mode == KVDB_SYNC_FULL) {
    int e = db->io->ops->sync(db->io, kv_writer_file(w));
    if (e != 0)
      rc = kv_fail_errno(-e, "cannot fdatasync segment %" PRIu64, w->seg_id);
  }
  int sealed = 0, removed = 0, gone = 0;
  uint64_t moved_bytes = 0, moved_blocks = 0, old_end = 0;
  if (rc == KVDB_OK)
    rc = kv_txn_begin(&db->cat, 1, &txn);
  if (rc == KVDB_OK) {
    kv_seg_rec old, nw;
    rc = kv_cat_get_seg(&db->cat, txn, id, &old);
    if (rc == KVDB_NOTFOUND)
      gone = 1; /* another handle compacted it meanwhile: our copies are dead, undone below */
    old_end = old.end;
    uint8_t *rb = malloc(kv_block_rec_size(4096));
    if (rb == NULL && rc == KVDB_OK)
      rc = kv_fail(KVDB_NOMEM, "record buffer");
    for (size_t i = 0; rc == KVDB_OK && i < n; i++) {
      if (!list[i].moved)
        continue;
      kv_block_rec br;
      if (kv_cat_get_block(&db->cat, txn, list[i].hash, &br) != KVDB_OK || br.segment != id ||
          br.offset != list[i].off)
        continue; /* deleted or moved meanwhile: our copy is dead */
      br.segment = w->seg_id;
      br.offset = list[i].new_off;
      kv_block_rec_encode(&br, NULL, rb);
      MDB_val bk = {16, list[i].hash}, bv = {kv_block_rec_size(br.n_tokens), rb};
      mrc = mdb_put(txn, db->cat.blocks, &bk, &bv, 0);
      if (mrc != 0)
        rc = kv_mdb_fail(mrc, "move block");
      else
        rc = kv_idx_seg_move(&db->cat, txn, id, w->seg_id, list[i].hash);
      old.live_bytes -= br.bytes < old.live_bytes ? br.bytes : old.live_bytes;
      old.live_blocks -= old.live_blocks ? 1 : 0;
      moved_bytes += br.bytes;
      moved_blocks++;
    }
    free(rb);
    if (rc == KVDB_OK && w != NULL) {
      rc = kv_cat_get_seg(&db->cat, txn, w->seg_id, &nw);
      if (rc == KVDB_OK) {
        nw.end = w->end + written;
        nw.live_bytes += moved_bytes;
        nw.live_blocks += moved_blocks;
        if (nw.end >= db->opt.segment_bytes) {
          nw.state = KV_SEG_SEALED;
          sealed = 1;
        }
        rc = kv_cat_put_seg(&db->cat, txn, w->seg_id, &nw);
      }
    }
    if (rc == KVDB_OK) {
      if (old.live_blocks == 0) {
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
      mdb_txn_abort(txn);
    }
    txn = NULL;
  }
  if (w != NULL) {
    if (rc == KVDB_OK)
      w->end += written;
    else if (db->io->ops->truncate(db->io, kv_writer_file(w), w->end) != 0)
      w->end += written;
    kv_writer_release(db, w, rc == KVDB_OK && sealed);
  }
  if (rc == KVDB_OK && removed) {
    char path[4200];
    if (kv_seg_path(db, id, path, sizeof path) == KVDB_OK)
      db->io->ops->unlink(db->io, path);
    MDB_txn *rt;
    if (kv_txn_begin(&db->cat, 0, &rt) == KVDB_OK) {
      kv_files_prune(db, rt);
      mdb_txn_abort(rt);
    }
    rep->segments_rewritten++;
    rep->bytes_reclaimed += old_end;
  }
  if (rc == KVDB_OK) {
    rep->blocks_moved += moved_blocks;
    rep->bytes_moved += moved_bytes;
    db->bytes_written += written;
  }
  free(list);
  return gone ? KVDB_OK : rc;
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
  MDB_txn *txn;
  KV_RET(kv_txn_begin(&db->cat, 0, &txn));
  uint64_t *ids = NULL;
  size_t n = 0, cap = 0;
  MDB_cursor *cur;
  MDB_val k, v;
  int mrc;
  kvdb_status rc = cursor_open(txn, db->cat.segments, &cur, "compaction: segments");
  if (rc != KVDB_OK) {
    mdb_txn_abort(txn);
    return rc;
  }
  for (mrc = mdb_cursor_get(cur, &k, &v, MDB_FIRST); mrc == 0;
       mrc = mdb_cursor_get(cur, &k, &v, MDB_NEXT)) {
    kv_seg_rec sr;
    if (k.mv_size != 8 || kv_seg_rec_decode(v.mv_data, v.mv_size, &sr) != KVDB_OK)
      continue;
    if (sr.state != KV_SEG_SEALED || sr.end == 0 || (double)sr.live_bytes >= threshold * (double)sr.end)
      continue;
    if (n == cap) {
      cap = cap ? cap * 2 : 16;
      uint64_t *ni = realloc(ids, cap * sizeof *ni);
      if (ni == NULL) {
        rc = kv_fail(KVDB_NOMEM, "compaction");
        break;
      }
      ids = ni;
    }
    ids[n++] = kv_get_be64(k.mv_data);
  }
  mdb_cursor_close(cur);
  mdb_txn_abort(txn);
  damage dmg = {0};
  for (size_t i = 0; rc == KVDB_OK && i < n; i++) {
    rc = compact_segment(db, ids[i], report, &dmg);
    if (progress != NULL)
      progress(ctx, i + 1, n);
  }
  free(ids);
  if (rc == KVDB_OK && dmg.blocks > 0)
    return kv_fail(KVDB_CORRUPT, "compaction moved every other block; %" PRIu64 " blocks failed "
                   "verification and stay in place (kvdb_verify lists them), the first: %s",
                   dmg.blocks, dmg.first);
  return rc;
}
