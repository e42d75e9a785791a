/* SPDX-License-Identifier: MIT */
/*
 * engine/seg/segment.c — the handle check (kv_check_db) and segment files: writers, the
 * read-handle cache, open-time recovery.
 *
 * A segment is an append-only file of 4 KiB-aligned block objects (FORMAT.md §1). Its catalog
 * record is created (state OPEN, end 0) in the write transaction that creates the file; the
 * writing handle holds an exclusive flock on the file, taken before that transaction commits,
 * for as long as it appends, so another process can tell a live writer from a dead one. Each
 * put advances the record's `end` in the transaction that publishes its
 * blocks; bytes past `end` were never acknowledged. Recovery truncates them away in segments
 * whose writer is gone (the flock can be taken) and seals those segments.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "seg.h"

/* I/O buffers of at least KV_HUGE_MIN bytes are 2 MiB-aligned and asked to be huge pages. */
#define KV_HUGE (2u << 20)
#define KV_HUGE_MIN (4u << 20)

kvdb_status kv_seg_path(kvdb *db, uint64_t id, char *buf, size_t cap)
{
  const char *dir = kv_seg_tier(id) == KVDB_TIER_SMARTSSD ? kv_smart_dir(db) : db->seg_dir;
  if (dir == NULL)
    return kv_fail(KVDB_INVALID, "segment %" PRIx64 " is on the SmartSSD tier, whose directory "
                   "is not known", id);
  int n = snprintf(buf, cap, "%s/seg-%016" PRIx64 ".kvs", dir, id);
  if (n < 0 || (size_t)n >= cap)
    return kv_fail(KVDB_INVALID, "segment path under '%s' is too long", dir);
  return KVDB_OK;
}

void *kv_alloc_aligned(size_t bytes)
{
  void *p = NULL;
  if (bytes >= KV_HUGE_MIN) {
    if (posix_memalign(&p, KV_HUGE, bytes) != 0)
      return NULL;
    madvise(p, bytes, MADV_HUGEPAGE); /* advisory: a refusal leaves ordinary pages */
    return p;
  }
  if (posix_memalign(&p, KV_PAGE, bytes ? bytes : KV_PAGE) != 0)
    return NULL;
  return p;
}

void kv_free_aligned(void *p)
{
  free(p);
}

static kvdb_status open_segment_file(kvdb *db, uint64_t id, int create, int rdonly, kv_file **out)
{
  char path[4200];
  KV_RET(kv_seg_path(db, id, path, sizeof path));
  int flags = (create ? KV_IO_CREATE : 0) | (rdonly ? KV_IO_RDONLY : 0) |
              (db->opt.use_direct_io ? KV_IO_DIRECT : 0);
  int direct = 0;
  int rc = db->io->ops->open(db->io, path, flags, &direct, out);
  if (rc == -ENOENT && !create)
    return kv_fail(KVDB_CORRUPT, "segment %" PRIx64 ": file '%s' is missing (the catalog lists "
                   "blocks in it)", id, path);
  if (rc != 0)
    return kv_fail_errno(-rc, "cannot open segment '%s'", path);
  if (db->opt.use_direct_io && !direct && db->direct) {
    db->direct = 0;
    kv_log(&db->log, 1, "O_DIRECT is not supported for '%s'; using buffered I/O", path);
  }
  return KVDB_OK;
}

kvdb_status kv_seg_read_fail(kvdb *db, int err, uint64_t seg, uint64_t off, uint64_t len,
                             const uint8_t *hash)
{
  char path[4200], hx[33];
  const char *blk = hash != NULL ? kv_hex16(hash, hx) : "?";
  struct stat st;
  if (kv_seg_path(db, seg, path, sizeof path) == KVDB_OK) {
    if (stat(path, &st) != 0 && errno == ENOENT)
      return kv_fail(KVDB_CORRUPT, "segment %" PRIx64 ": file '%s' is missing (the catalog lists "
                     "block %s in it)", seg, path, blk);
    if (stat(path, &st) == 0 && (uint64_t)st.st_size < off + len)
      return kv_fail(KVDB_CORRUPT, "block %s (%" PRIu64 " bytes at offset %" PRIu64 " of segment %"
                     PRIx64 ") lies past the file's end: '%s' has %" PRIu64 " bytes, %" PRIu64
                     " too few", blk, len, off, seg, path, (uint64_t)st.st_size,
                     off + len - (uint64_t)st.st_size);
  }
  return kv_fail_errno(err, "cannot read block %s (%" PRIu64 " bytes at offset %" PRIu64
                       " of segment %" PRIx64 ")", blk, len, off, seg);
}

kvdb_status kv_writer_acquire(kvdb *db, kv_writer **out)
{
  return kv_writer_acquire_tier(db, KVDB_TIER_SSD, out);
}

kvdb_status kv_writer_acquire_tier(kvdb *db, uint32_t tier, kv_writer **out)
{
  *out = NULL;
  if (tier != KVDB_TIER_SSD && tier != KVDB_TIER_SMARTSSD)
    return kv_fail(KVDB_INVALID, "tier %u has no segments", tier);
  pthread_mutex_lock(&db->mu);
  kv_writer *w, **pp = &db->idle_writers;
  while ((w = *pp) != NULL && w->tier != tier)
    pp = &w->next;
  if (w != NULL)
    *pp = w->next;
  pthread_mutex_unlock(&db->mu);
  if (w != NULL) {
    *out = w;
    return KVDB_OK;
  }
  /* A new segment: its record (state OPEN, end 0) and its file, created and locked inside the
   * same write transaction. Recovery in another process runs in a write transaction too, so it
   * never sees the record without a locked file (it would take the segment for a dead
   * writer's: delete the record, or truncate and seal the file under the new writer). */
  kv_txn *txn = NULL;
  kvdb_status rc;
  uint64_t id = 0;
  w = calloc(1, sizeof *w);
  if (w == NULL)
    return kv_fail(KVDB_NOMEM, "cannot allocate a segment writer");
  KV_ERR(kv_txn_begin(&db->cat, 1, &txn));
  KV_ERR(kv_cat_get_u64(&db->cat, txn, "next_segment", &id));
  KV_ERR(kv_cat_put_u64(&db->cat, txn, "next_segment", id + 1));
  if (tier == KVDB_TIER_SMARTSSD) { /* a format-3 unit: builds before it would not find it */
    id |= KV_SEG_SMARTSSD_BIT;
    KV_ERR(kv_smart_dir_ready(db, txn));
  }
  kv_seg_rec sr = {.tier = tier, .state = KV_SEG_OPEN, .owner_pid = (uint32_t)getpid()};
  KV_ERR(kv_cat_put_seg(&db->cat, txn, id, &sr));
  w->seg_id = id;
  w->tier = tier;
  KV_ERR(open_segment_file(db, id, 1, 0, &w->f));
  int lrc = db->io->ops->lock(db->io, w->f, 1);
  if (lrc != 0) {
    rc = kv_fail_errno(-lrc, "cannot lock new segment %" PRIu64, id);
    goto out;
  }
  rc = kv_txn_commit(txn);
  txn = NULL;
  if (rc == KVDB_OK) {
    *out = w;
    return KVDB_OK;
  }
out:
  if (txn != NULL)
    kv_txn_abort(txn);
  if (w->f != NULL) { /* the file has no record: remove it (recovery would) */
    char path[4200];
    db->io->ops->lock(db->io, w->f, 0);
    db->io->ops->close(db->io, w->f);
    if (kv_seg_path(db, id, path, sizeof path) == KVDB_OK)
      db->io->ops->unlink(db->io, path);
  }
  free(w);
  return rc;
}

kvdb_status kv_writer_stage(kv_writer *w, size_t bytes)
{
  if (w->stage_cap >= bytes)
    return KVDB_OK;
  size_t cap = KV_ALIGN_UP(bytes, (size_t)1 << 20);
  for (int i = 0; i < 2; i++) {
    kv_free_aligned(w->stage[i]);
    w->stage[i] = kv_alloc_aligned(cap);
  }
  if (w->stage[0] == NULL || w->stage[1] == NULL) {
    kv_free_aligned(w->stage[0]);
    kv_free_aligned(w->stage[1]);
    w->stage[0] = w->stage[1] = NULL;
    w->stage_cap = 0;
    return kv_fail(KVDB_NOMEM, "cannot allocate %zu bytes of staging buffers", 2 * cap);
  }
  w->stage_cap = cap;
  return KVDB_OK;
}

static void writer_free(kvdb *db, kv_writer *w)
{
  if (w->f != NULL) {
    db->io->ops->lock(db->io, w->f, 0);
    db->io->ops->close(db->io, w->f);
  }
  kv_free_aligned(w->stage[0]);
  kv_free_aligned(w->stage[1]);
  free(w);
}

void kv_writer_release(kvdb *db, kv_writer *w, int sealed)
{
  if (w == NULL)
    return;
  if (sealed) {
    writer_free(db, w);
    return;
  }
  pthread_mutex_lock(&db->mu);
  w->next = db->idle_writers;
  db->idle_writers = w;
  pthread_mutex_unlock(&db->mu);
}

void kv_writers_free(kvdb *db)
{
  kv_writer *w = db->idle_writers;
  while (w != NULL) {
    kv_writer *n = w->next;
    writer_free(db, w);
    w = n;
  }
  db->idle_writers = NULL;
}

/* ---- the cache's index by id: a get of a block finds its segment's handle in O(1), not by
 * walking every cached segment (thousands in a large store). db->mu held. ---- */

static size_t seg_bucket(const kvdb *db, uint64_t id)
{
  return (size_t)((id * 0x9e3779b97f4a7c15ull) >> 20) & (db->files_cap - 1);
}

static kv_segfile *files_find(kvdb *db, uint64_t id)
{
  if (db->files_tab == NULL) {
    for (kv_segfile *sf = db->files; sf != NULL; sf = sf->next)
      if (sf->id == id)
        return sf;
    return NULL;
  }
  for (kv_segfile *sf = db->files_tab[seg_bucket(db, id)]; sf != NULL; sf = sf->hnext)
    if (sf->id == id)
      return sf;
  return NULL;
}

/* Index every cached handle in a table of `cap` buckets; on no memory keep the old one (or
 * none: lookups walk the list). */
static void files_rehash(kvdb *db, size_t cap)
{
  kv_segfile **tab = calloc(cap, sizeof *tab);
  if (tab == NULL)
    return;
  free(db->files_tab);
  db->files_tab = tab;
  db->files_cap = cap;
  for (kv_segfile *sf = db->files; sf != NULL; sf = sf->next) {
    size_t b = seg_bucket(db, sf->id);
    sf->hnext = tab[b];
    tab[b] = sf;
  }
}

static void files_add(kvdb *db, kv_segfile *sf)
{
  sf->next = db->files;
  db->files = sf;
  db->files_n++;
  if (db->files_tab == NULL || db->files_n > db->files_cap) {
    size_t was = db->files_cap;
    files_rehash(db, was ? 2 * was : 64);
    if (db->files_cap != was || db->files_tab == NULL)
      return; /* indexed with the rest, or no table (lookups walk the list) */
  }
  size_t b = seg_bucket(db, sf->id);
  sf->hnext = db->files_tab[b];
  db->files_tab[b] = sf;
}

static void files_unindex(kvdb *db, kv_segfile *sf)
{
  db->files_n--;
  if (db->files_tab == NULL)
    return;
  for (kv_segfile **pp = &db->files_tab[seg_bucket(db, sf->id)]; *pp != NULL; pp = &(*pp)->hnext)
    if (*pp == sf) {
      *pp = sf->hnext;
      return;
    }
}

kvdb_status kv_segfile_get(kvdb *db, uint64_t id, kv_segfile **out)
{
  pthread_mutex_lock(&db->mu);
  kv_segfile *hit = files_find(db, id);
  if (hit != NULL) {
    hit->refs++;
    pthread_mutex_unlock(&db->mu);
    *out = hit;
    return KVDB_OK;
  }
  pthread_mutex_unlock(&db->mu);
  kv_file *f;
  KV_RET(open_segment_file(db, id, 0, 1, &f));
  kv_segfile *sf = calloc(1, sizeof *sf);
  if (sf == NULL) {
    db->io->ops->close(db->io, f);
    return kv_fail(KVDB_NOMEM, "cannot cache segment %" PRIu64, id);
  }
  sf->id = id;
  sf->f = f;
  sf->refs = 2;
  pthread_mutex_lock(&db->mu);
  kv_segfile *o = files_find(db, id);
  if (o != NULL) { /* another thread opened it meanwhile */
    o->refs++;
    pthread_mutex_unlock(&db->mu);
    db->io->ops->close(db->io, f);
    free(sf);
    *out = o;
    return KVDB_OK;
  }
  files_add(db, sf);
  pthread_mutex_unlock(&db->mu);
  *out = sf;
  return KVDB_OK;
}

void kv_segfile_put(kvdb *db, kv_segfile *sf)
{
  if (sf == NULL)
    return;
  pthread_mutex_lock(&db->mu);
  int last = --sf->refs == 0;
  pthread_mutex_unlock(&db->mu);
  if (last) {
    db->io->ops->close(db->io, sf->f);
    free(sf);
  }
}

void kv_files_prune(kvdb *db, kv_txn *txn)
{
  uint64_t gen = 0;
  if (kv_cat_get_u64(&db->cat, txn, "gen", &gen) != KVDB_OK)
    return;
  pthread_mutex_lock(&db->mu); /* files_gen too: another thread may be pruning */
  if (gen == db->files_gen) {
    pthread_mutex_unlock(&db->mu);
    return;
  }
  db->files_gen = gen;
  kv_segfile **pp = &db->files;
  while (*pp != NULL) {
    kv_segfile *sf = *pp;
    kv_seg_rec sr;
    if (kv_cat_get_seg(&db->cat, txn, sf->id, &sr) == KVDB_NOTFOUND) {
      *pp = sf->next;
      files_unindex(db, sf);
      if (--sf->refs == 0) {
        db->io->ops->close(db->io, sf->f);
        free(sf);
      }
      continue;
    }
    pp = &sf->next;
  }
  pthread_mutex_unlock(&db->mu);
}

void kv_files_free(kvdb *db)
{
  kv_segfile *sf = db->files;
  while (sf != NULL) {
    kv_segfile *n = sf->next;
    db->io->ops->close(db->io, sf->f);
    free(sf);
    sf = n;
  }
  db->files = NULL;
  free(db->files_tab);
  db->files_tab = NULL;
  db->files_cap = db->files_n = 0;
}

/* Seal an OPEN segment whose writer is gone; truncate what was never committed. */
static kvdb_status recover_segment(kvdb *db, kv_txn *txn, uint64_t id, kv_seg_rec *sr,
                                   int *deleted)
{
  *deleted = 0;
  kv_file *f;
  char path[4200];
  KV_RET(kv_seg_path(db, id, path, sizeof path));
  int rc = db->io->ops->open(db->io, path, 0, NULL, &f);
  if (rc == -ENOENT) {
    if (sr->end == 0) {
      KV_RET(kv_cat_del_seg(&db->cat, txn, id));
      *deleted = 1;
      return KVDB_OK;
    }
    kv_log(&db->log, 0, "segment file '%s' is missing (%" PRIu64 " committed bytes)", path,
           sr->end);
    return KVDB_OK;
  }
  if (rc != 0)
    return kv_fail_errno(-rc, "cannot open segment '%s' for recovery", path);
  if (db->io->ops->lock(db->io, f, 1) != 0) {
    db->io->ops->close(db->io, f); /* a live writer owns it */
    return KVDB_OK;
  }
  uint64_t size = 0;
  rc = db->io->ops->size(db->io, f, &size);
  if (rc == 0 && size > sr->end) {
    kv_log(&db->log, 2, "recovery: truncating segment %" PRIu64 " from %" PRIu64 " to %" PRIu64
           " bytes (uncommitted tail)", id, size, sr->end);
    rc = db->io->ops->truncate(db->io, f, sr->end);
    if (rc == 0)
      rc = db->io->ops->sync(db->io, f);
  }
  db->io->ops->lock(db->io, f, 0);
  db->io->ops->close(db->io, f);
  if (rc != 0)
    return kv_fail_errno(-rc, "cannot truncate segment '%s'", path);
  sr->state = KV_SEG_SEALED;
  return kv_cat_put_seg(&db->cat, txn, id, sr);
}

/* Remove the segment files of tier `tier` in `dir` (NULL: none) that have no record. */
static void remove_orphans(kvdb *db, kv_txn *txn, const char *dir, uint32_t tier)
{
  DIR *d = dir != NULL ? opendir(dir) : NULL;
  if (d == NULL)
    return;
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    uint64_t id;
    char tail[8];
    if (sscanf(e->d_name, "seg-%16" SCNx64 ".%4s", &id, tail) != 2 || strcmp(tail, "kvs") != 0 ||
        kv_seg_tier(id) != tier)
      continue;
    kv_seg_rec sr;
    if (kv_cat_get_seg(&db->cat, txn, id, &sr) == KVDB_NOTFOUND) {
      char path[4200];
      if (kv_seg_path(db, id, path, sizeof path) == KVDB_OK && db->io->ops->unlink(db->io, path) == 0)
        kv_log(&db->log, 2, "recovery: removed unreferenced segment file '%s'", path);
    }
  }
  closedir(d);
}

kvdb_status kv_recover(kvdb *db)
{
  kv_txn *txn;
  kv_cat_iter it;
  kvdb_status rc = KVDB_OK;
  KV_RET(kv_txn_begin(&db->cat, 1, &txn));
  rc = kv_cat_iter_open(&db->cat, txn, KV_TBL_SEGMENTS, &it, "open segment cursor");
  if (rc != KVDB_OK)
    goto out;
  uint64_t *ids = NULL;
  size_t n_ids = 0, cap = 0;
  while (kv_cat_iter_next(&it)) {
    if (it.key.size != 8) {
      rc = kv_fail(KVDB_CORRUPT, "segment key of %zu bytes", it.key.size);
      break;
    }
    uint64_t id = kv_get_be64(it.key.data);
    if (n_ids == cap) {
      cap = cap ? cap * 2 : 64;
      uint64_t *n = realloc(ids, cap * sizeof *ids);
      if (n == NULL) {
        rc = kv_fail(KVDB_NOMEM, "recovery");
        break;
      }
      ids = n;
    }
    ids[n_ids++] = id;
  }
  kv_cat_iter_close(&it);
  for (size_t i = 0; rc == KVDB_OK && i < n_ids; i++) {
    kv_seg_rec sr;
    rc = kv_cat_get_seg(&db->cat, txn, ids[i], &sr);
    if (rc != KVDB_OK)
      break;
    if (sr.state == KV_SEG_OPEN) {
      int deleted;
      rc = recover_segment(db, txn, ids[i], &sr, &deleted);
    }
  }
  /* files without a record: a compaction that crashed between its commit and the unlink */
  if (rc == KVDB_OK) {
    remove_orphans(db, txn, db->seg_dir, KVDB_TIER_SSD);
    remove_orphans(db, txn, db->smart_dir, KVDB_TIER_SMARTSSD);
  }
  free(ids);
  if (rc == KVDB_OK) {
    rc = kv_txn_commit(txn);
    txn = NULL;
  }
out:
  if (txn != NULL)
    kv_txn_abort(txn);
  return rc;
}
/* ---- the handle ---- */

kvdb_status kv_check_db(kvdb *db)
{
  kv_clear_error();
  if (db == NULL)
    return kv_fail(KVDB_INVALID, "db is NULL");
  if (db->magic != KVDB_MAGIC_OPEN)
    return kv_fail(KVDB_MISUSE, "db handle is closed or not a kvdb handle");
  return KVDB_OK;
}


/* ---- runs of copied objects (seg.h kv_run) ---- */

#define KV_RUN_BYTES (4u << 20)

kvdb_status kv_run_open(kv_run *r, uint64_t base)
{
  r->fill = 0;
  r->base = base;
  r->cap = KV_RUN_BYTES;
  r->p = kv_alloc_aligned(r->cap);
  return r->p != NULL ? KVDB_OK : kv_fail(KVDB_NOMEM, "a run buffer of %zu bytes", r->cap);
}

/* Write the run's whole pages (all of it, zero-padded to a page, with `all`). */
static kvdb_status run_flush(kvdb *db, kv_writer *w, kv_run *r, int all)
{
  if (all) {
    size_t end = KV_ALIGN_UP(r->fill, (size_t)KV_PAGE);
    memset(r->p + r->fill, 0, end - r->fill);
    r->fill = end;
  }
  size_t whole = r->fill / KV_PAGE * KV_PAGE, tail = r->fill - whole;
  if (whole == 0)
    return KVDB_OK;
  int e = db->io->ops->pwrite(db->io, kv_writer_file(w), r->p, whole, r->base);
  if (e != 0)
    return kv_fail_errno(-e, "cannot write segment %" PRIu64, w->seg_id);
  memmove(r->p, r->p + whole, tail);
  r->base += whole;
  r->fill = tail;
  return KVDB_OK;
}

kvdb_status kv_run_put(kvdb *db, kv_writer *w, kv_run *r, uint8_t *obj, uint64_t bytes,
                       int packed, uint64_t *off)
{
  if (packed && bytes <= r->cap - KV_PAGE) {
    size_t at = KV_ALIGN_UP(r->fill, (size_t)KV_BLOCK_PACK_ALIGN);
    if (at + bytes > r->cap) {
      KV_RET(run_flush(db, w, r, 0));
      at = KV_ALIGN_UP(r->fill, (size_t)KV_BLOCK_PACK_ALIGN);
    }
    memset(r->p + r->fill, 0, at - r->fill);
    memcpy(r->p + at, obj, bytes);
    r->fill = at + bytes;
    *off = r->base + at;
    return KVDB_OK;
  }
  if (r->fill > 0)
    KV_RET(run_flush(db, w, r, 1));
  uint64_t len = KV_ALIGN_UP(bytes, (uint64_t)KV_PAGE);
  memset(obj + bytes, 0, len - bytes);
  int e = db->io->ops->pwrite(db->io, kv_writer_file(w), obj, len, r->base);
  if (e != 0)
    return kv_fail_errno(-e, "cannot write segment %" PRIu64, w->seg_id);
  *off = r->base;
  r->base += len;
  return KVDB_OK;
}

kvdb_status kv_run_close(kvdb *db, kv_writer *w, kv_run *r, int write)
{
  kvdb_status rc = KVDB_OK;
  if (write && r->fill > 0)
    rc = run_flush(db, w, r, 1);
  kv_free_aligned(r->p);
  r->p = NULL;
  return rc;
}
