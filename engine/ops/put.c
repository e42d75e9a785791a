/* SPDX-License-Identifier: MIT */
/*
 * engine/ops/put.c — the write step of a put (kv_put_context: kvdb_put_ex in engine/db/db.c
 * composes it with the placement) and kvdb_put_block.
 *
 * PUT (durability order, invariant C2 of catalog.h)
 *   1. hashes; a read transaction decides which blocks are missing (dedup)
 *   2. missing blocks are gathered from the caller's view into staging buffers, encoded and
 *      sealed (checksums) and appended to this handle's segment with batched (io_uring)
 *      writes, double-buffered so gathering overlaps writing
 *   3. fdatasync of the segment (KVDB_SYNC_FULL)
 *   4. one LMDB write transaction: block records (or refcount +1 for blocks another writer
 *      stored meanwhile), the context record, the segment's new end and live bytes; commit
 *   A crash before 4 commits leaves only an unreferenced tail, truncated at the next open.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>

#include "ops_int.h"
#include "catalog/catalog.h"

/* One block of a put. */
typedef struct put_blk {
  uint8_t hash[16];
  uint8_t parent[16];
  const uint32_t *tokens;
  uint32_t n_tok;
  uint64_t t0;       /* first token in the caller's view */
  int write;         /* data written by this put */
  int rewrite;       /* an existing block stored lossy, rewritten exactly by this put */
  kv_block_rec old;  /* where a rewritten block was (segment, bytes) */
  uint64_t off;      /* where (segment offset) */
  uint64_t bound;    /* most bytes its object can take (compressed) */
  uint64_t obj_bytes;/* bytes of its object as written */
  kv_block_geom g;
  const uint8_t *obj;   /* kv_put_objects: the block's object, verified, written as it is
                           (obj_bytes), or NULL for a block that must be stored already */
  kv_block_rec orec;    /* kv_put_objects: its bflags, method, bits, drop, keep_permille */
  int packed;           /* written as a packed object (raw: block format 4, FORMAT.md §3e;
                           compressed: block format 5, §3f) */
} put_blk;

typedef struct put_req {
  const kvdb_model *m;
  uint32_t bt;
  uint8_t mh[16];
  uint8_t ctx[16];
  uint32_t flags;
  uint64_t n_tokens;
  put_blk *b;
  uint32_t n;
  const kvdb_kv_view *kv;
  kvdb_config cfg;           /* how new blocks are stored */
  const kv_queries *q;       /* the caller's queries, or NULL */
  kv_profile_rec *profile;   /* recorded with the context when not NULL */
  uint64_t kv_t0;            /* the first token `kv` holds (an append: the blocks before it
                                must be stored already; 0 for a put) */
  const uint8_t *replace;    /* an append: the context record its commit replaces, or NULL */
  int objects;               /* kv_put_objects: blocks come as objects (b->obj), no kv */
  unsigned sv;               /* the variant of new blocks' score copies (kv_score_variant_for) */
  const kv_put_hook *hook;   /* joins the commit of a new context record (ops.h), or NULL */
  const kv_calib *calib;     /* the model's calibration when the config uses one, or NULL */
} put_req;

#define PUT_RETRY ((kvdb_status)1000)

/* ---- model records ---- */

static kvdb_status model_txn(kvdb *db, kv_txn *txn, const put_req *r, int insert)
{
  kvdb_status rc = kv_model_known(db, txn, r->m, r->bt, r->mh);
  if (rc != KVDB_NOTFOUND || !insert)
    return rc == KVDB_NOTFOUND ? KVDB_OK : rc;
  kv_model_rec mr;
  kv_model_rec_of(r->m, r->bt, r->mh, &mr);
  return kv_cat_put_model(&db->cat, txn, r->m->id, &mr);
}

/* ---- block configs shared by put and re-encoding ---- */

void kv_block_rec_set_config(kv_block_rec *br, const kvdb_config *c)
{
  br->method = c->method;
  br->bits = c->bits;
  br->drop = c->drop;
  br->keep_permille = c->keep_permille;
  br->bflags = (c->method != KVDB_METHOD_RAW ? KV_BLK_COMPRESSED : 0) |
               (c->method == KVDB_METHOD_DROP ? KV_BLK_DROPS : 0);
}

void kv_block_rec_set_kept(kv_block_rec *br, const kvdb_config *c, uint64_t t0)
{
  if (c->method != KVDB_METHOD_DROP)
    return;
  br->bflags |= KV_BLK_KEPTN;
  br->keep_permille = (uint16_t)kv_drop_keep_span(t0, br->n_tokens, c->keep_permille);
}

/* ---- SSD capacity: evict least recently used contexts (LRU until the policy issue) ---- */

static kvdb_status live_total(kvdb *db, kv_txn *txn, uint64_t *out)
{
  *out = 0;
  kv_cat_iter it;
  KV_RET(kv_cat_iter_open(&db->cat, txn, KV_TBL_SEGMENTS, &it, "open segment cursor"));
  kvdb_status rc = KVDB_OK;
  while (kv_cat_iter_next(&it)) {
    kv_seg_rec sr;
    rc = kv_seg_rec_decode(it.val.data, it.val.size, &sr);
    if (rc != KVDB_OK)
      break;
    *out += sr.live_bytes;
  }
  kv_cat_iter_close(&it);
  return rc != KVDB_OK ? rc : it.err;
}

static kvdb_status make_room(kvdb *db, kv_txn *txn, const uint8_t keep[16], uint64_t need)
{
  uint64_t live;
  KV_RET(live_total(db, txn, &live));
  while (live + need > db->opt.ssd_bytes) {
    kv_cat_iter it;
    KV_RET(kv_cat_iter_open(&db->cat, txn, KV_TBL_ATIME, &it, "open access-time cursor"));
    uint8_t victim[16];
    int found = 0;
    while (kv_cat_iter_next(&it)) { /* the least recently used context but `keep` */
      if (it.key.size == 24 && memcmp(it.key.data + 8, keep, 16) != 0) {
        memcpy(victim, it.key.data + 8, 16);
        found = 1;
        break;
      }
    }
    kv_cat_iter_close(&it);
    KV_RET(it.err);
    if (!found)
      return kv_fail(KVDB_FULL,
                     "the SSD tier holds %" PRIu64 " bytes of %" PRIu64 " and nothing more can be "
                     "evicted for %" PRIu64 " bytes",
                     live, db->opt.ssd_bytes, need);
    uint64_t freed;
    KV_RET(kv_delete_ctx_txn(db, txn, victim, &freed));
    live = live >= freed ? live - freed : 0;
  }
  return KVDB_OK;
}

/* ---- put ---- */

/* Phase 1: which blocks must be written? KVDB_OK with *done = 1 when the context exists. */
static kvdb_status plan(kvdb *db, put_req *r, int *done)
{
  kv_txn *txn;
  *done = 0;
  KV_RET(kv_txn_begin(&db->cat, 0, &txn));
  kvdb_status rc = model_txn(db, txn, r, 0);
  if (rc != KVDB_OK)
    goto out;
  kv_ctx_rec cr;
  rc = kv_cat_get_ctx(&db->cat, txn, r->ctx, &cr);
  if (rc == KVDB_OK && r->replace != NULL) {
    /* an append whose grown context is stored already: the commit still replaces the record
     * the append grew from (every block is there: none is written) */
    for (uint32_t i = 0; i < r->n; i++)
      r->b[i].write = r->b[i].rewrite = 0;
    goto out;
  }
  if (rc == KVDB_OK) {
    *done = 1;
    if (r->flags & KV_CTX_EXPLICIT) {
      kv_block_rec br;
      rc = kv_cat_get_block(&db->cat, txn, r->ctx, &br);
      if (rc == KVDB_OK && (br.n_tokens != r->b[0].n_tok ||
                            memcmp(br.tokens, r->b[0].tokens, 4 * (size_t)br.n_tokens) != 0)) {
        char hx[33];
        rc = kv_fail(KVDB_INVALID, "key %s is already stored with other tokens",
                     kv_hex16(r->ctx, hx));
      }
    }
    goto out;
  }
  if (rc != KVDB_NOTFOUND)
    goto out;
  rc = KVDB_OK;
  for (uint32_t i = 0; i < r->n; i++) {
    kv_block_rec br;
    kvdb_status s = kv_cat_get_block(&db->cat, txn, r->b[i].hash, &br);
    if (s == KVDB_OK) {
      if (br.n_tokens != r->b[i].n_tok ||
          memcmp(br.tokens, r->b[i].tokens, 4 * (size_t)br.n_tokens) != 0) {
        char hx[33];
        rc = kv_fail(KVDB_INVALID, "block %u hashes to %s, which is stored with other tokens",
                     i, kv_hex16(r->b[i].hash, hx));
        goto out;
      }
      /* a shared block keeps the most faithful config of its owners: a lossy one is
       * rewritten when this put stores exactly (never by kv_put_objects: a stored block
       * stays as it is) */
      r->b[i].write = r->b[i].rewrite =
          !r->objects && kv_policy_config_exact(&r->cfg) && br.method != KVDB_METHOD_RAW &&
          br.method != KVDB_METHOD_LOSSLESS;
      r->b[i].old = br;
    } else if (s == KVDB_NOTFOUND || s == KVDB_CORRUPT) {
      r->b[i].write = 1; /* a corrupt record is rewritten by the commit */
      r->b[i].rewrite = 0;
    } else {
      rc = s;
      goto out;
    }
    if (r->b[i].write && r->objects && r->b[i].obj == NULL) { /* a local block went */
      char hx[33];
      rc = kv_fail(KVDB_BUSY, "block %u (%s) of a remote hit's local part is no longer stored",
                   i, kv_hex16(r->b[i].hash, hx));
      goto out;
    }
    if (r->b[i].write && r->b[i].t0 < r->kv_t0) { /* an append cannot write what it lacks */
      char hx[33];
      rc = kv_fail(KVDB_BUSY, "block %u (%s) of the context an append grows is no longer stored "
                              "(deleted or replaced meanwhile)", i, kv_hex16(r->b[i].hash, hx));
      goto out;
    }
  }
out:
  kv_txn_abort(txn);
  return rc;
}

/* Bytes of a block gathered and checksummed before they are queued for writing. */
#define KV_PUT_CHUNK (2u << 20)

/*
 * Phase 2: gather, checksum and append the missing blocks; fdatasync.
 *
 * The space is reserved first (fallocate): a full disk fails here before anything is written,
 * and the writes become overwrites, which ext4 runs under a shared inode lock inside
 * io_uring_enter instead of serialising appends on io-wq workers (measured: 1 MiB O_DIRECT
 * appends at QD 32 1.1-1.3 GB/s, the same into reserved space 2.2-2.6 GB/s). Each block is
 * gathered section by section into a staging buffer; every section is checksummed while it is
 * still in cache, and every KV_PUT_CHUNK bytes are queued at once, so the disk starts after
 * 2 MiB of CPU work instead of a whole block. The meta region (header, tokens, checksum table)
 * is written last. Two staging buffers alternate between blocks.
 */
/*
 * Phase 2 for a compressed config: each block is encoded section by section (compress/) into
 * a staging buffer and written whole; the other staging buffer takes the next block meanwhile.
 * The space is not reserved first: the objects' sizes are known only once encoded (and the
 * encoding, 0.1-0.6 GB/s per core, dominates these puts).
 */
/* The end of a put's writes: wait for both batches in flight (the first failure wins), then
 * make the segment durable (KVDB_SYNC_FULL) before the catalog commit that publishes it. */
static kvdb_status drain_and_sync(kvdb *db, kv_writer *w, kv_batch *bt[2], int busy[2],
                                  kvdb_status rc)
{
  for (int k = 0; k < 2; k++) {
    if (busy[k]) {
      int e = kv_batch_wait(db->io, bt[k]);
      busy[k] = 0;
      if (e != 0 && rc == KVDB_OK)
        rc = kv_fail_errno(-e, "cannot write segment %" PRIu64, w->seg_id);
    }
  }
  if (rc == KVDB_OK && db->opt.sync_mode == KVDB_SYNC_FULL) {
    int e = db->io->ops->sync(db->io, kv_writer_file(w));
    if (e != 0)
      rc = kv_fail_errno(-e, "cannot fdatasync segment %" PRIu64, w->seg_id);
  }
  return rc;
}

/* The double-buffered staging of a put's block objects: objects are built in w->stage[cur] at
 * `fill` (segment offset base + fill) and written by batch bt[cur] while the other buffer's
 * batch may still be in flight. */
typedef struct stager {
  kvdb *db;
  kv_writer *w;
  kv_batch *bt[2];
  int busy[2];
  int cur;
  size_t fill;
  size_t flushed; /* bytes of stage[cur] queued for writing (whole pages) */
  uint64_t base;  /* segment offset of stage[cur][0] (a page boundary) */
} stager;

static void stage_write(stager *st, const uint8_t *p, uint64_t len, uint64_t off)
{
  kv_batch_write(st->db->io, st->bt[st->cur], kv_writer_file(st->w), p, len, off);
  st->busy[st->cur] = 1;
}

/* Queue stage[cur]'s bytes [flushed, upto) (upto a page boundary, or fill padded to one):
 * packed objects (FORMAT.md §3e) are written as the pages that hold them, never alone. */
static void stage_flush(stager *st, size_t upto)
{
  if (upto > st->flushed)
    stage_write(st, st->w->stage[st->cur] + st->flushed, upto - st->flushed,
                st->base + st->flushed);
  st->flushed = upto;
}

/* Move fill up to a multiple of `align`, zeroing the gap (room was made by stage_room). */
static void stage_align(stager *st, size_t align)
{
  size_t at = KV_ALIGN_UP(st->fill, align);
  memset(st->w->stage[st->cur] + st->fill, 0, at - st->fill);
  st->fill = at;
}

/* Room for an object of at most `bytes` at fill aligned to `align` (64 for a packed object,
 * else a page; a page more for the run's final padding): else the other buffer, once its
 * writes are done. The whole pages of this buffer are queued first; a partial last page
 * (packed objects) moves to the start of the other buffer, written with what follows it. */
static kvdb_status stage_room(stager *st, uint64_t bytes, size_t align)
{
  if (KV_ALIGN_UP(st->fill, align) + bytes + KV_PAGE <= st->w->stage_cap)
    return KVDB_OK;
  size_t whole = st->fill / KV_PAGE * KV_PAGE, tail = st->fill - whole;
  stage_flush(st, whole);
  const uint8_t *old = st->w->stage[st->cur];
  st->base += whole;
  st->cur ^= 1;
  st->fill = tail;
  st->flushed = 0;
  if (st->busy[st->cur]) {
    int e = kv_batch_wait(st->db->io, st->bt[st->cur]);
    st->busy[st->cur] = 0;
    if (e != 0)
      return kv_fail_errno(-e, "cannot write segment %" PRIu64, st->w->seg_id);
  }
  memcpy(st->w->stage[st->cur], old + whole, tail);
  return KVDB_OK;
}

/* Block i of a put stored with a compressed config: encoded into the stage at fill (room:
 * b->bound, a page more when pack_max) and its score region after it, written as one piece;
 * *at its segment offset. With pack_max (fill 64-byte aligned) an object of at most pack_max
 * bytes is packed (block format 5, FORMAT.md §3f: written with its run's pages); a bigger one
 * moves to the next page first. */
static kvdb_status stage_cblock(stager *st, put_req *r, uint32_t i, kv_cenc *enc,
                                uint64_t pack_max, uint64_t *at)
{
  put_blk *b = &r->b[i];
  uint8_t *obj = st->w->stage[st->cur] + st->fill;
  kv_cblock_src src = {.cfg = &r->cfg, .g = &b->g, .kv = r->kv, .t0 = b->t0 - r->kv_t0,
                       .keep_t0 = b->t0, .ctx_tokens = r->n_tokens, .q = r->q, .last_block = i + 1 == r->n,
                       .index = i, .hash = b->hash, .parent = b->parent,
                       .model_hash = r->mh, .tokens = b->tokens,
                       .frame_bytes = st->db->opt.lossless_frame_bytes,
                       .rope = {r->m->rope_base, r->m->rope_style}, .pack_max = pack_max,
                       .calib = r->calib};
  *at = st->base + st->fill;
  KV_RET(kv_cblock_build(&src, enc, obj, st->w->stage_cap - st->fill, &b->obj_bytes));
  b->packed = pack_max != 0 && enc->packed;
  if (b->packed)
    return KVDB_OK; /* no score copies (pack_max is 0 with them); queued with its run */
  if (pack_max != 0 && st->fill % KV_PAGE != 0) { /* too big to pack: at the next page */
    size_t pg = KV_ALIGN_UP(st->fill, (size_t)KV_PAGE);
    memmove(st->w->stage[st->cur] + pg, obj, b->obj_bytes);
    memset(obj, 0, pg - st->fill);
    st->fill = pg;
    obj = st->w->stage[st->cur] + pg;
    *at = st->base + pg;
  }
  stage_flush(st, st->fill); /* what packed objects left before it */
  KV_RET(kv_score_block_append(r->m, r->sv, &b->g, r->kv, b->t0 - r->kv_t0, b->hash, obj,
                               &b->obj_bytes));
  stage_write(st, obj, b->obj_bytes, *at);
  return KVDB_OK;
}

/* Block b of a raw put: its sections gathered from the caller's view into obj one by one and
 * queued in chunks as they are sealed (so gathering overlaps writing), then the score region
 * (score_bits: sb bytes) and the meta region last. */
static kvdb_status stage_raw(stager *st, put_req *r, put_blk *b, uint64_t sb, uint8_t *obj,
                             uint64_t at)
{
  int queue = !b->packed; /* a packed object is written with its run's pages (stage_flush) */
  const kv_block_geom *g = &b->g;
  kv_sregion sr; /* the score region after the object, for a model with score_bits */
  if (sb != 0)
    KV_RET(kv_sregion_init(&sr, g, r->m->score_bits, r->sv));
  uint64_t used = (uint64_t)g->n_sections * g->section_bytes;
  int padded = g->group_stride != g->group_tokens * g->row_bytes ||
               g->n_tokens % g->group_tokens != 0;
  if (padded)
    memset(obj + g->meta_bytes, 0, g->data_bytes);
  else
    memset(obj + g->meta_bytes + used, 0, g->data_bytes - used);
  uint64_t sent = g->meta_bytes; /* bytes of the object queued so far, after the meta region */
  for (uint32_t s = 0; s < g->n_sections; s++) {
    kv_gather_section(g, r->kv, b->t0 - r->kv_t0, s, obj + g->meta_bytes);
    if (sb != 0 && (s & 1) == 0) /* its K rows are in cache: their score copy */
      KV_RET(kv_score_copy_from_section(g, &sr, s, obj, r->kv, b->t0 - r->kv_t0,
                                        obj + g->total_bytes));
    kv_block_checksum_sections(g, b->hash, s, s + 1, obj);
    int last = s + 1 == g->n_sections;
    uint64_t ready = last ? g->total_bytes
                          : (g->meta_bytes + (uint64_t)(s + 1) * g->section_bytes) / KV_PAGE *
                                KV_PAGE;
    if (queue && ready > sent && (last || ready - sent >= KV_PUT_CHUNK)) {
      stage_write(st, obj + sent, ready - sent, at + sent);
      sent = ready;
    }
  }
  kv_block_seal_meta(g, b->hash, b->parent, r->mh, b->tokens, obj);
  if (sb != 0) {
    kv_sregion_seal(&sr, b->hash, obj + g->total_bytes);
    kv_block_mark_score(obj, r->m->score_bits, r->sv, g->total_bytes);
    stage_write(st, obj + g->total_bytes, sb, at + g->total_bytes);
  }
  if (queue)
    stage_write(st, obj, g->meta_bytes, at);
  b->obj_bytes = g->total_bytes + sb;
  return KVDB_OK;
}

/*
 * Phase 2: the blocks this put writes, appended to w's segment after w->end and synced
 * (KVDB_SYNC_FULL). Raw blocks have their exact size, reserved at once (fallocate); compressed
 * ones at most b->bound. *written: the bytes past w->end the caller commits, or truncates back
 * when this or the commit fails.
 */
static kvdb_status write_blocks(kvdb *db, put_req *r, kv_writer *w, uint64_t *written)
{
  int raw = r->cfg.method == KVDB_METHOD_RAW && !r->objects;
  unsigned bits = r->m->score_bits;
  uint64_t biggest = 0, total = 0;
  /* small raw blocks without score copies are packed (FORMAT.md §3e) on the SSD tier (the
   * SmartSSD's device reads raw page groups), and so are compressed ones (§3f) whose object
   * turns out small enough, on either tier (the device never reads them) */
  int pack = raw && bits == 0 && w->tier == KVDB_TIER_SSD && db->opt.packed_block_bytes != 1;
  int cpack = !raw && !r->objects && bits == 0 && db->opt.packed_block_bytes != 1;
  uint64_t pack_max = db->opt.packed_block_bytes > 1 ? db->opt.packed_block_bytes
                                                     : KV_PACK_MAX_DEFAULT;
  for (uint32_t i = 0; i < r->n; i++) {
    put_blk *b = &r->b[i];
    if (!b->write)
      continue;
    if (pack && !b->g.packed) {
      kv_block_geom pg = b->g;
      kv_block_geom_pack(&pg);
      if (pg.total_bytes <= pack_max)
        b->g = pg;
    }
    b->packed = b->g.packed; /* compressed: known once encoded (stage_cblock) */
    uint64_t obj = raw ? b->g.total_bytes + kv_score_region_bytes(&b->g, bits, r->sv) : b->bound;
    /* where it goes in the run: a packed object at 64 bytes, any other one at a page */
    total = KV_ALIGN_UP(total, b->packed ? KV_BLOCK_PACK_ALIGN : KV_PAGE) + obj;
    if (obj > biggest)
      biggest = obj;
  }
  total = KV_ALIGN_UP(total, KV_PAGE); /* the run ends on a page */
  *written = 0;
  if (biggest == 0)
    return KVDB_OK;
  biggest += 2 * KV_PAGE; /* a packed run's partial page carried over, the final padding */
  KV_RET(kv_writer_stage(w, biggest > (8u << 20) ? biggest : (8u << 20)));
  if (raw && db->io->ops->alloc != NULL && !w->no_alloc) {
    int e = db->io->ops->alloc(db->io, kv_writer_file(w), w->end, total);
    if (e == -EOPNOTSUPP) {
      w->no_alloc = 1;
      kv_log(&db->log, 2, "fallocate is not supported for segment %" PRIu64 "; appending",
             w->seg_id);
    } else if (e != 0) {
      *written = total; /* the caller truncates back; if that fails it skips past all of it */
      return kv_fail_errno(-e, "cannot reserve %" PRIu64 " bytes in segment %" PRIu64, total,
                           w->seg_id);
    }
  }
  if (raw)
    *written = total;
  stager st = {.db = db, .w = w, .bt = {kv_batch_begin(db->io), kv_batch_begin(db->io)},
               .base = w->end};

  kv_cenc enc;
  memset(&enc, 0, sizeof enc);
  kvdb_status rc = KVDB_OK;
  if (st.bt[0] == NULL || st.bt[1] == NULL) {
    rc = kv_fail(KVDB_NOMEM, "cannot allocate I/O batches");
    goto out;
  }
  for (uint32_t i = 0; i < r->n; i++) {
    put_blk *b = &r->b[i];
    if (!b->write)
      continue;
    uint64_t sb = raw && bits ? kv_score_region_bytes(&b->g, bits, r->sv) : 0;
    int try_pack = cpack && b->bound > 0; /* a compressed block that may be packed */
    size_t align = b->packed || try_pack ? KV_BLOCK_PACK_ALIGN : KV_PAGE;
    uint64_t room = raw ? b->g.total_bytes + sb
                        : KV_ALIGN_UP(r->objects ? b->obj_bytes : b->bound, KV_PAGE) +
                              (try_pack ? KV_PAGE : 0);
    KV_ERR(stage_room(&st, room, align));
    if (!b->packed && !try_pack) /* whole pages from a page boundary: what packed objects
                                    left first */
      stage_align(&st, KV_PAGE);
    else
      stage_align(&st, KV_BLOCK_PACK_ALIGN);
    if (!b->packed && !try_pack)
      stage_flush(&st, st.fill);
    uint8_t *obj = w->stage[st.cur] + st.fill;
    uint64_t at = st.base + st.fill; /* segment offset of this block object */
    if (r->objects) { /* the verified object as it is, then zeros to a page (an object a packed
                         store wrote is a multiple of 64 bytes: written at a page here) */
      memcpy(obj, b->obj, b->obj_bytes);
      uint64_t len = KV_ALIGN_UP(b->obj_bytes, KV_PAGE);
      memset(obj + b->obj_bytes, 0, len - b->obj_bytes);
      stage_write(&st, obj, len, at);
    } else {
      KV_ERR(raw ? stage_raw(&st, r, b, sb, obj, at)
                 : stage_cblock(&st, r, i, &enc, try_pack ? pack_max : 0, &at));
    }
    b->off = at;
    st.fill += b->packed ? b->obj_bytes : KV_ALIGN_UP(b->obj_bytes, KV_PAGE);
    if (!b->packed)
      st.flushed = st.fill; /* queued by its own writes */
    if (!raw)
      *written = st.base + st.fill - w->end;
  }
  if (rc == KVDB_OK) { /* the run's last packed objects: their pages, zero-padded */
    stage_align(&st, KV_PAGE);
    stage_flush(&st, st.fill);
    if (!raw) /* compressed: up to the run's padding (packed objects, FORMAT.md §3f) */
      *written = st.base + st.fill - w->end;
    if (raw && st.base + st.fill - w->end != total)
      rc = kv_fail(KVDB_PANIC, "put wrote %" PRIu64 " bytes of the %" PRIu64 " it reserved",
                   st.base + st.fill - w->end, total);
  }
  rc = drain_and_sync(db, w, st.bt, st.busy, rc);
out:
  for (int k = 0; k < 2; k++) {
    if (st.bt[k] != NULL && st.busy[k])
      kv_batch_wait(db->io, st.bt[k]);
    kv_batch_end(db->io, st.bt[k]);
  }
  kv_cenc_free(&enc);
  return rc;
}

/* An append's commit retires the record of the context it grew from (its blocks stay where
 * the grown context shares them); KVDB_BUSY when that record is gone (deleted or replaced by
 * another writer since the append read it). */
static kvdb_status replace_ctx(kvdb *db, kv_txn *txn, const uint8_t key[16])
{
  uint64_t freed;
  kvdb_status rc = kv_delete_ctx_txn(db, txn, key, &freed);
  if (rc == KVDB_NOTFOUND) {
    char hx[33];
    return kv_fail(KVDB_BUSY, "context %s that the append grows was deleted or replaced "
                              "meanwhile", kv_hex16(key, hx));
  }
  return rc;
}

/* The catalog format a block stored as another store wrote it needs (kv_put_objects). */
static kvdb_status block_format(kvdb *db, kv_txn *txn, const kv_block_rec *br)
{
  if (br->method != KVDB_METHOD_RAW)
    KV_RET(kv_cat_require_format(&db->cat, txn, 2));
  if (br->method == KVDB_METHOD_LOSSLESS)
    KV_RET(kv_cat_require_format(&db->cat, txn, KV_FORMAT_FRAMES));
  if (br->bflags & (uint32_t)(KV_BLK_SCORE8 | KV_BLK_SCORE4))
    KV_RET(kv_cat_require_format(&db->cat, txn, 3)); /* score regions */
  if (br->bflags & (uint32_t)KV_BLK_SCOREV2)
    KV_RET(kv_cat_require_format(&db->cat, txn, KV_FORMAT_SCOREV2));
  if (br->bflags & (uint32_t)KV_BLK_PACKED)
    KV_RET(kv_cat_require_format(&db->cat, txn, (br->bflags & (uint32_t)KV_BLK_COMPRESSED)
                                                    ? KV_FORMAT_PCPR
                                                    : KV_FORMAT_PACKED));
  if (br->bflags & (uint32_t)KV_BLK_KEPTN)
    KV_RET(kv_cat_require_format(&db->cat, txn, KV_FORMAT_KEPTN));
  return KVDB_OK;
}

/* Phase 3: publish in one transaction. */
static kvdb_status commit(kvdb *db, put_req *r, kv_writer *w, uint64_t new_end, int *sealed,
                          kvdb_put_info *info)
{
  kv_txn *txn;
  kvdb_status rc;
  uint8_t *buf = NULL;
  *sealed = 0;
  KV_RET(kv_txn_begin(&db->cat, 1, &txn));
  KV_ERR(model_txn(db, txn, r, 1));
  kv_ctx_rec cr;
  rc = kv_cat_get_ctx(&db->cat, txn, r->ctx, &cr);
  if (rc == KVDB_OK) { /* another writer stored the same context meanwhile */
    info->blocks_shared = r->n;
    if (r->replace == NULL || memcmp(r->replace, r->ctx, 16) == 0)
      goto out_abort_ok;
    /* an append: the grown context is there; retire the one it grew from */
    KV_ERR(replace_ctx(db, txn, r->replace));
    return kv_txn_commit(txn);
  }
  if (rc != KVDB_NOTFOUND)
    goto out;
  uint64_t new_bytes = 0, new_blocks = 0, ctx_bytes = 0;
  uint32_t last_tier = KVDB_TIER_SSD; /* the context's tier: its last block's */
  size_t buf_cap = kv_block_rec_size(r->bt);
  buf = malloc(buf_cap);
  if (buf == NULL) {
    rc = kv_fail(KVDB_NOMEM, "block record");
    goto out;
  }
  for (uint32_t i = 0; i < r->n; i++) {
    put_blk *b = &r->b[i];
    kv_block_rec br;
    uint64_t moved_from = UINT64_MAX; /* an existing record that moves here */
    int created = 0;
    rc = kv_cat_get_block(&db->cat, txn, b->hash, &br);
    if (rc == KVDB_OK) {
      if (br.n_tokens != b->n_tok || memcmp(br.tokens, b->tokens, 4 * (size_t)b->n_tok) != 0) {
        char hx[33];
        rc = kv_fail(KVDB_INVALID, "block %u hashes to %s, which is stored with other tokens", i,
                     kv_hex16(b->hash, hx));
        goto out;
      }
      br.refcount++;
      if (b->rewrite && b->write && br.method != KVDB_METHOD_RAW &&
          br.method != KVDB_METHOD_LOSSLESS) {
        /* stored lossy: our exact copy replaces it; the old bytes become dead space */
        KV_ERR(kv_seg_unref(db, txn, br.segment, br.bytes));
        if (br.tier != w->tier) /* other contexts ending in it change tier: recount them */
          KV_ERR(kv_counts_invalidate(&db->cat, txn));
        br.tier = w->tier; /* the block is where it is written now */
        moved_from = br.segment;
        br.segment = w->seg_id;
        br.offset = b->off;
        br.bytes = b->obj_bytes;
        kv_block_rec_set_config(&br, &r->cfg);
        kv_block_rec_set_kept(&br, &r->cfg, b->t0);
        br.bflags |= kv_score_rec_flags(r->m->score_bits, r->sv);
        if (b->packed)
          br.bflags |= KV_BLK_PACKED;
        new_bytes += br.bytes;
        new_blocks++;
        info->blocks_written++;
        if (db->dram != NULL)
          kv_dram_remove(db->dram, b->hash);
      } else {
        info->blocks_shared++;
      }
      kv_block_rec_encode(&br, NULL, buf);
      ctx_bytes += br.bytes;
    } else if ((rc == KVDB_NOTFOUND || rc == KVDB_CORRUPT) && b->write) {
      if (rc == KVDB_CORRUPT)
        kv_log(&db->log, 1, "replacing a corrupt catalog record of block %u", i);
      br = (kv_block_rec){.refcount = 1, .tier = KVDB_TIER_SSD, .n_tokens = b->n_tok,
                          .segment = w->seg_id, .offset = b->off, .bytes = b->obj_bytes};
      if (r->objects) { /* as the object's source stored it */
        br.bflags = b->orec.bflags;
        br.method = b->orec.method;
        br.bits = b->orec.bits;
        br.drop = b->orec.drop;
        br.keep_permille = b->orec.keep_permille;
        KV_ERR(block_format(db, txn, &br));
      } else {
        kv_block_rec_set_config(&br, &r->cfg);
        kv_block_rec_set_kept(&br, &r->cfg, b->t0);
        br.bflags |= kv_score_rec_flags(r->m->score_bits, r->sv);
        if (b->packed)
          br.bflags |= KV_BLK_PACKED;
      }
      memcpy(br.parent, b->parent, 16);
      memcpy(br.model, r->mh, 16);
      kv_block_rec_encode(&br, b->tokens, buf);
      created = 1;
      new_bytes += br.bytes;
      new_blocks++;
      ctx_bytes += br.bytes;
      info->blocks_written++;
    } else if (rc == KVDB_NOTFOUND) {
      rc = PUT_RETRY; /* it vanished (deleted) since the plan: write it after all */
      goto out;
    } else {
      goto out;
    }
    KV_ERR(kv_cat_put_raw(&db->cat, txn, KV_TBL_BLOCKS, b->hash, 16, buf,
                          kv_block_rec_size(b->n_tok), "put block"));
    last_tier = br.tier;
    /* the indexes (catalog/index.h) */
    if (moved_from != UINT64_MAX)
      KV_ERR(kv_idx_seg_move(&db->cat, txn, moved_from, w->seg_id, b->hash));
    if (created) {
      if (!(r->flags & KV_CTX_EXPLICIT)) /* an explicit-key block is nobody's continuation */
        KV_ERR(kv_idx_child_add(&db->cat, txn, b->parent, b->hash, (const uint8_t *)b->tokens,
                                b->n_tok));
      KV_ERR(kv_idx_seg_add(&db->cat, txn, w->seg_id, b->hash));
    }
  }
  /* the context */
  free(buf);
  buf = NULL;
  uint64_t now = kv_now_ms();
  cr = (kv_ctx_rec){.flags = r->flags, .config = r->cfg, .n_blocks = r->n,
                    .n_tokens = r->n_tokens, .bytes = ctx_bytes, .created_ms = now,
                    .last_access_ms = now};
  memcpy(cr.model, r->mh, 16);
  if (r->hook != NULL && db->cat.has_ctxstats) {
    /* placement on: its statistics in its own record (catalog.h FOLDED STATS), written by the
     * hook's touch and flag in this transaction without a page of the ctxstats tree */
    cr.has_stats = 1;
    cr.stats = (kv_ctxstats){.tier = last_tier >= KVDB_TIER_SSD && last_tier < KVDB_TIER_COUNT
                                         ? last_tier : KVDB_TIER_SSD,
                             .freq_ms = now};
    KV_ERR(kv_cat_require_format(&db->cat, txn, KV_FORMAT_PRIORS));
    KV_ERR(kv_cat_del_ctxstats(&db->cat, txn, r->ctx)); /* none expected: it would take precedence */
  }
  if (r->cfg.method != KVDB_METHOD_RAW)
    KV_ERR(kv_cat_require_format(&db->cat, txn, 2)); /* format-2 blocks and record */
  if (r->cfg.method == KVDB_METHOD_LOSSLESS)
    KV_ERR(kv_cat_require_format(&db->cat, txn, KV_FORMAT_FRAMES)); /* lossless frames */
  if (!r->objects && r->cfg.method == KVDB_METHOD_DROP)
    for (uint32_t i = 0; i < r->n; i++)
      if (r->b[i].write) { /* blocks with their kept count (KV_BLK_KEPTN) */
        KV_ERR(kv_cat_require_format(&db->cat, txn, KV_FORMAT_KEPTN));
        break;
      }
  for (uint32_t i = 0; i < r->n; i++)
    if (r->b[i].write && r->b[i].packed) { /* packed raw objects (FORMAT.md §3e), packed
                                              compressed ones (§3f) */
      KV_ERR(kv_cat_require_format(&db->cat, txn, r->cfg.method != KVDB_METHOD_RAW
                                                      ? KV_FORMAT_PCPR
                                                      : KV_FORMAT_PACKED));
      break;
    }
  if (r->m->score_bits != 0)
    KV_ERR(kv_cat_require_format(&db->cat, txn, 3)); /* blocks with score regions */
  if (!r->objects && (kv_score_rec_flags(r->m->score_bits, r->sv) & KV_BLK_SCOREV2))
    KV_ERR(kv_cat_require_format(&db->cat, txn, KV_FORMAT_SCOREV2)); /* version-2 copies */
  buf = malloc(16 * (size_t)r->n); /* the block hashes */
  if (buf == NULL) {
    rc = kv_fail(KVDB_NOMEM, "context record");
    goto out;
  }
  for (uint32_t i = 0; i < r->n; i++)
    memcpy(buf + 16 * i, r->b[i].hash, 16);
  rc = kv_cat_put_ctx_atime(&db->cat, txn, r->ctx, &cr, buf); /* its access-time entry: now */
  free(buf);
  buf = NULL;
  if (rc != KVDB_OK)
    goto out;
  KV_ERR(kv_counts_add(&db->cat, txn, last_tier, KV_CNT_CONTEXTS, 1));
  if (r->replace != NULL && memcmp(r->replace, r->ctx, 16) != 0)
    KV_ERR(replace_ctx(db, txn, r->replace)); /* an append: the record it grew from goes */
  if (w != NULL) {
    kv_seg_rec sr;
    KV_ERR(kv_cat_get_seg(&db->cat, txn, w->seg_id, &sr));
    sr.end = new_end;
    sr.live_bytes += new_bytes;
    sr.live_blocks += new_blocks;
    if (sr.end >= db->opt.segment_bytes) {
      sr.state = KV_SEG_SEALED;
      *sealed = 1;
    }
    KV_ERR(kv_cat_put_seg(&db->cat, txn, w->seg_id, &sr));
  }
  if (r->profile != NULL && r->profile->prior != 0 && r->hook != NULL && db->cat.has_priors &&
      db->cat.has_ctxstats) {
    /* predicted (place/prior.c) with placement on: by reference (catalog.h PRIORS), in the
     * ctxstats record the placement's hook writes in this transaction anyway */
    KV_ERR(kv_cat_put_profile_ref(&db->cat, txn, r->ctx, r->profile, now));
  } else if (r->profile != NULL) {
    kv_profile_mark_stored(r->profile, &r->cfg, ctx_bytes);
    KV_ERR(kv_cat_put_profile(&db->cat, txn, r->ctx, r->profile));
  }
  if (db->opt.ssd_bytes > 0 && new_bytes > 0 && db->place == NULL) /* else the placement's */
    KV_ERR(make_room(db, txn, r->ctx, 0));
  KV_ERR(kv_flush_atime(db, txn));
  if (r->hook != NULL) {
    rc = r->hook->in_txn(db, txn, r->ctx, r->hook->arg);
    if (rc == KVDB_OK)
      rc = kv_txn_commit(txn);
    else
      kv_txn_abort(txn);
    r->hook->done(db, rc, r->hook->arg);
    return rc;
  }
  return kv_txn_commit(txn);
out_abort_ok:
  rc = KVDB_OK;
out:
  free(buf);
  kv_txn_abort(txn);
  if (rc != KVDB_OK)
    *sealed = 0;
  return rc;
}

static kvdb_status put_run(kvdb *db, put_req *r, kvdb_put_info *info)
{
  kvdb_put_info tmp;
  if (info == NULL)
    info = &tmp;
  /* a full disk: the catalog's reserve is left to deletes and compaction */
  KV_RET(kv_cat_reserve_short(&db->cat));
  unsigned map_full = kv_cat_map_full_events(); /* the catalog's map was full: it grows, go again */
  for (int attempt = 0;; attempt++) {
    memset(info, 0, sizeof *info);
    memcpy(info->context.b, r->ctx, 16);
    info->n_blocks = r->n;
    int done;
    KV_RET(plan(db, r, &done));
    if (done) {
      info->blocks_shared = r->n;
      kv_note_access(db, r->ctx);
      return r->profile != NULL ? kv_profile_store(db, r->ctx, r->profile) : KVDB_OK;
    }
    kv_writer *w = NULL;
    uint64_t written = 0;
    int need_write = 0;
    for (uint32_t i = 0; i < r->n; i++)
      need_write |= r->b[i].write;
    kvdb_status rc = KVDB_OK;
    if (need_write) {
      KV_RET(kv_writer_acquire(db, &w));
      rc = write_blocks(db, r, w, &written);
    }
    int sealed = 0;
    if (rc == KVDB_OK)
      rc = commit(db, r, w, w ? w->end + written : 0, &sealed, info);
    if (w != NULL) {
      if (rc == KVDB_OK) {
        w->end += written;
        info->bytes_written = written;
        db->bytes_written += written;
      } else {
        /* give the space back; if that fails the tail stays (truncated at the next open
         * after this writer is gone) and appending continues past it */
        if (db->io->ops->truncate(db->io, kv_writer_file(w), w->end) != 0)
          w->end += written;
      }
      kv_writer_release(db, w, sealed);
    }
    if (rc == PUT_RETRY && attempt < 3)
      continue;
    if (rc == KVDB_FULL && attempt < 3 && kv_cat_map_full_events() != map_full) {
      map_full = kv_cat_map_full_events();
      continue;
    }
    if (rc == PUT_RETRY)
      rc = kv_fail(KVDB_BUSY, "blocks kept being deleted during the put; retry");
    return rc;
  }
}

kvdb_status kv_put_checks(kvdb *db, const kvdb_model *m, uint32_t *bt, const kvdb_kv_view *kv)
{
  KV_RET(kv_check_db(db));
  KV_RET(kv_check_model(m, bt));
  KV_RET(kv_check_view(kv, m, "kv"));
  if (db->cat.rdonly)
    return kv_fail(KVDB_READONLY, "database '%s' is open read-only", db->dir);
  return KVDB_OK;
}

void kvdb_put_opts_init(kvdb_put_opts *o)
{
  if (o == NULL)
    return;
  memset(o, 0, sizeof *o);
  o->struct_size = sizeof *o;
}

kvdb_status kv_put_opts_copy(const kvdb_put_opts *in, kvdb_put_opts *o)
{
  kvdb_put_opts_init(o);
  if (in == NULL)
    return KVDB_OK;
  if (in->struct_size < offsetof(kvdb_put_opts, queries) || in->struct_size > 4096)
    return kv_fail(KVDB_INVALID, "opts->struct_size %u: call kvdb_put_opts_init() first",
                   in->struct_size);
  memcpy(o, in, in->struct_size < sizeof *o ? in->struct_size : sizeof *o);
  o->struct_size = sizeof *o;
  return KVDB_OK;
}

/* Check the queries of opts against the model; q receives them (NULL when there are none). */
kvdb_status kv_opts_queries(const kvdb_put_opts *o, const kvdb_model *m, kv_queries *q,
                            const kv_queries **out)
{
  *out = NULL;
  if (o->queries == NULL) {
    if (o->n_queries != 0)
      return kv_fail(KVDB_INVALID, "opts->n_queries is %u but opts->queries is NULL",
                     o->n_queries);
    return KVDB_OK;
  }
  if (o->n_queries < 1 || o->n_queries > 64)
    return kv_fail(KVDB_INVALID, "opts->n_queries %u out of range 1..64", o->n_queries);
  if (o->n_q_heads == 0 || o->n_q_heads % m->n_kv_heads != 0 || o->n_q_heads > 65536)
    return kv_fail(KVDB_INVALID, "opts->n_q_heads %u is not a multiple of n_kv_heads %u",
                   o->n_q_heads, m->n_kv_heads);
  *q = (kv_queries){o->queries, o->n_queries, o->n_q_heads};
  *out = q;
  return KVDB_OK;
}

kvdb_status kv_opts_probes(const kvdb_put_opts *o, const kvdb_model *m, uint64_t n_tokens,
                           kv_queries *q, const kv_queries **out, const uint32_t **pos)
{
  *out = NULL;
  *pos = NULL;
  if (o->probe_queries == NULL || o->probe_positions == NULL || o->n_probe_queries == 0) {
    if (o->probe_queries != NULL || o->probe_positions != NULL || o->n_probe_queries != 0)
      return kv_fail(KVDB_INVALID, "opts->probe_queries, probe_positions and n_probe_queries "
                                   "(%u) must be set together", o->n_probe_queries);
    return KVDB_OK;
  }
  if (o->n_probe_queries > 1024)
    return kv_fail(KVDB_INVALID, "opts->n_probe_queries %u out of range 1..1024",
                   o->n_probe_queries);
  if (o->n_q_heads == 0 || o->n_q_heads % m->n_kv_heads != 0 || o->n_q_heads > 65536)
    return kv_fail(KVDB_INVALID, "opts->n_q_heads %u is not a multiple of n_kv_heads %u",
                   o->n_q_heads, m->n_kv_heads);
  for (uint32_t i = 0; i < o->n_probe_queries; i++)
    if (o->probe_positions[i] >= n_tokens ||
        (i > 0 && o->probe_positions[i] <= o->probe_positions[i - 1]))
      return kv_fail(KVDB_INVALID, "opts->probe_positions[%u] = %u: not increasing, or not below "
                                   "the context's %" PRIu64 " tokens",
                     i, o->probe_positions[i], n_tokens);
  *q = (kv_queries){o->probe_queries, o->n_probe_queries, o->n_q_heads};
  *out = q;
  *pos = o->probe_positions;
  return KVDB_OK;
}

/* Block i of a chain put of tokens[0..n) in blocks of bt: its tokens, parent (*prev, then
 * advanced to this block), hash and geometry. */
static kvdb_status chain_block(put_blk *b, const kvdb_model *m, uint32_t bt,
                               const uint32_t *tokens, size_t n, uint32_t i, const uint8_t **prev)
{
  b->t0 = (uint64_t)i * bt;
  b->n_tok = (uint32_t)((i + 1) * (uint64_t)bt <= n ? bt : n - b->t0);
  b->tokens = tokens + b->t0;
  memcpy(b->parent, *prev, 16);
  kv_chain_hash(*prev, b->tokens, b->n_tok, b->hash);
  *prev = b->hash;
  return kv_block_geom_init(&b->g, m->n_layers, m->n_kv_heads, m->head_dim, m->dtype, bt,
                            b->n_tok);
}

static kvdb_status put_chain(kvdb *db, const kvdb_model *m, uint32_t bt, const uint8_t mh[16],
                            const uint32_t *tokens, size_t n, const kvdb_kv_view *kv,
                            uint64_t kv_t0, const uint8_t *replace, const kvdb_config *cfg,
                            const kv_queries *q, kv_profile_rec *profile, const kv_put_hook *hook,
                            kvdb_put_info *info, uint8_t ctx[16])
{
  put_req r = {.m = m, .bt = bt, .n_tokens = n, .kv = kv, .cfg = *cfg, .q = q,
               .profile = profile, .kv_t0 = kv_t0, .replace = replace,
               .sv = kv_score_variant_for(db, m), .hook = hook};
  memcpy(r.mh, mh, 16);
  r.n = (uint32_t)((n + bt - 1) / bt);
  /* int4 / int2 of a calibrated model: its calibration (a damaged one fails the put) */
  kv_calib cal;
  KV_RET(kv_model_calib_load(db, m, &r.cfg, &cal));
  r.calib = cal.weight != NULL ? &cal : NULL;
  r.b = calloc(r.n, sizeof *r.b);
  if (r.b == NULL) {
    kv_calib_free(&cal);
    return kv_fail(KVDB_NOMEM, "put of %u blocks", r.n);
  }
  const uint8_t *prev = r.mh;
  kvdb_status rc = KVDB_OK;
  for (uint32_t i = 0; i < r.n; i++) {
    put_blk *b = &r.b[i];
    KV_ERR(chain_block(b, m, bt, tokens, n, i, &prev));
    if (r.cfg.method != KVDB_METHOD_RAW) {
      b->bound = kv_cblock_bound_cal(&r.cfg, &b->g, r.calib);
      if (b->bound != 0)
        b->bound += kv_score_region_bytes(&b->g, m->score_bits, r.sv);
      if (b->bound == 0) {
        char nm[48];
        rc = kv_fail(KVDB_INVALID, "config '%s' cannot store block %u (%u tokens x %u dims)",
                     kvdb_config_name(&r.cfg, nm, sizeof nm), i, b->n_tok, m->head_dim);
        goto out;
      }
    }
  }
  memcpy(r.ctx, r.b[r.n - 1].hash, 16);
  memcpy(ctx, r.ctx, 16);
  rc = put_run(db, &r, info);
  if (rc == KVDB_OK && db->rtier != NULL) { /* write-through of the blocks written now */
    uint8_t(*wh)[16] = malloc((size_t)r.n * 16);
    uint32_t nw = 0;
    for (uint32_t i = 0; wh != NULL && i < r.n; i++)
      if (r.b[i].write)
        memcpy(wh[nw++], r.b[i].hash, 16);
    kv_rtier_note_put(db, r.b[0].hash, (const uint8_t(*)[16])wh, nw);
    free(wh);
  }
out:
  free(r.b);
  kv_calib_free(&cal);
  return rc;
}

kvdb_status kv_put_context(kvdb *db, const kvdb_model *m, uint32_t bt, const uint8_t mh[16],
                           const uint32_t *tokens, size_t n, const kvdb_kv_view *kv,
                           const kvdb_config *cfg, const kv_queries *q, kv_profile_rec *profile,
                           const kv_put_hook *hook, kvdb_put_info *info, uint8_t ctx[16])
{
  return put_chain(db, m, bt, mh, tokens, n, kv, 0, NULL, cfg, q, profile, hook, info, ctx);
}

kvdb_status kv_put_objects(kvdb *db, const kvdb_model *m, uint32_t bt, const uint8_t mh[16],
                           const uint32_t *tokens, size_t n, const uint8_t *const *objs,
                           const kv_block_rec *recs, kvdb_put_info *info, uint8_t ctx[16])
{
  put_req r = {.m = m, .bt = bt, .n_tokens = n, .objects = 1};
  memcpy(r.mh, mh, 16);
  r.n = (uint32_t)((n + bt - 1) / bt);
  if (r.n == 0)
    return kv_fail(KVDB_INVALID, "no tokens");
  r.b = calloc(r.n, sizeof *r.b);
  if (r.b == NULL)
    return kv_fail(KVDB_NOMEM, "put of %u blocks", r.n);
  const uint8_t *prev = r.mh;
  kvdb_status rc = KVDB_OK;
  int have_cfg = 0;
  for (uint32_t i = 0; i < r.n; i++) {
    put_blk *b = &r.b[i];
    KV_ERR(chain_block(b, m, bt, tokens, n, i, &prev));
    if (objs[i] != NULL) {
      const kv_block_rec *o = &recs[i];
      uint64_t al = (o->bflags & KV_BLK_PACKED) ? KV_BLOCK_PACK_ALIGN : KV_PAGE;
      if (o->bytes == 0 || o->bytes % al != 0 || o->method > KVDB_METHOD_DROP ||
          (o->bflags & ~(uint32_t)(KV_BLK_COMPRESSED | KV_BLK_SCORE8 | KV_BLK_SCORE4 |
                                   KV_BLK_PACKED)) != 0 ||
          ((o->bflags & KV_BLK_PACKED) && (o->bflags & (KV_BLK_SCORE8 | KV_BLK_SCORE4)))) {
        rc = kv_fail(KVDB_INVALID, "block %u: object of %" PRIu64 " bytes, method %u, flags "
                     "%#x cannot be stored as it is", i, o->bytes, o->method, o->bflags);
        goto out;
      }
      b->obj = objs[i];
      b->orec = *o;
      b->obj_bytes = b->bound = o->bytes;
      /* the context's config: its last object's (the fields a block record keeps) */
      r.cfg = (kvdb_config){.method = o->method, .bits = o->bits, .drop = o->drop,
                            .keep_permille = o->keep_permille};
      have_cfg = 1;
    }
  }
  if (!have_cfg) {
    rc = kv_fail(KVDB_INVALID, "no block object to store");
    goto out;
  }
  memcpy(r.ctx, r.b[r.n - 1].hash, 16);
  memcpy(ctx, r.ctx, 16);
  rc = put_run(db, &r, info); /* nothing written through: these came from the remote tier */
out:
  free(r.b);
  return rc;
}

kvdb_status kv_put_append(kvdb *db, const kvdb_model *m, uint32_t bt, const uint8_t mh[16],
                          const uint32_t *tokens, size_t n, const kvdb_kv_view *kv, uint64_t kv_t0,
                          const uint8_t replace[16], kvdb_put_info *info, uint8_t ctx[16])
{
  kvdb_config raw;
  memset(&raw, 0, sizeof raw);
  raw.method = KVDB_METHOD_RAW;
  return put_chain(db, m, bt, mh, tokens, n, kv, kv_t0, replace, &raw, NULL, NULL, NULL, info,
                   ctx);
}

kvdb_status kvdb_put_block(kvdb *db, const kvdb_model *m, const kvdb_key *key,
                           const uint32_t *tokens, size_t n_tokens, const kvdb_kv_view *kv)
{
  uint32_t bt;
  KV_RET(kv_put_checks(db, m, &bt, kv));
  if (key == NULL || tokens == NULL || n_tokens == 0)
    return kv_fail(KVDB_INVALID, "key or tokens is NULL, or n_tokens is 0");
  if (n_tokens > bt)
    return kv_fail(KVDB_INVALID, "n_tokens %zu exceeds block_tokens %u", n_tokens, bt);
  KV_RET(kv_check_view_extent(kv, m, n_tokens, "kv"));
  put_blk b = {.tokens = tokens, .n_tok = (uint32_t)n_tokens};
  put_req r = {.m = m, .bt = bt, .n_tokens = n_tokens, .kv = kv, .flags = KV_CTX_EXPLICIT,
               .b = &b, .n = 1, .sv = kv_score_variant_for(db, m)};
  kv_model_hash(m, bt, r.mh);
  kvdb_key ck;
  KV_RET(kvdb_block_context(m, key, &ck));
  memcpy(r.ctx, ck.b, 16);
  memcpy(b.hash, ck.b, 16);
  memcpy(b.parent, r.mh, 16);
  KV_RET(kv_block_geom_init(&b.g, m->n_layers, m->n_kv_heads, m->head_dim, m->dtype, bt,
                            (uint32_t)n_tokens));
  /* an existing key with other tokens is refused (plan() checks the block's tokens) */
  return put_run(db, &r, NULL);
}

/* kvdb_recompress: engine/place/relocate.c (a re-encoding is a relocation that keeps the tier) */
