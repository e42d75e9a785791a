/* SPDX-License-Identifier: MIT */
/*
 * engine/ops/verify.c — kvdb_verify: every checksum, and the catalog against the segments;
 * kvdb_repair: the records rebuilt from the segments, or the contexts that cannot be dropped.
 *
 * A catalog record has no checksum of its own (LMDB's pages have none), while every block
 * object in a segment carries its header (hash, parent, model, tokens, sizes) under checksums.
 * So the check reads each block record's object where the record says it is, proves the object
 * is that block (its hash, every checksum) and compares each field of the record with it:
 *
 *   pass 1  contexts: count the contexts listing each block, remember the first one (names it)
 *   pass 2  blocks: each record against its object (n_tokens, bytes, tokens, parent, model,
 *           flags, tier), refcount against the count; a record whose offset does not lead to
 *           its block: the segment is scanned (once) for the block's header, and the one
 *           copy found is the object (none or several: the location cannot be told)
 *   pass 3  contexts again: each against its blocks (every block present and of its model, the
 *           chain: block i's parent is block i-1 and its hash is that of its parent and tokens,
 *           the key is the last block's hash; n_tokens is the sum of its blocks' tokens)
 *   pass 4  segments: files present and long enough, live bytes and blocks add up
 *
 * Every pass reads one snapshot (a read transaction). A problem names the context, the block
 * and the field. kvdb_repair runs the same passes and plans: a block record that disagrees
 * with an object that verifies is rebuilt from the object; a context whose count disagrees
 * with its (verified) blocks is rewritten; a context with a block that cannot be rebuilt
 * (missing, its object damaged or not where the record says) is dropped. The plan is carried
 * out in one write transaction that first re-checks every record it changes against the bytes
 * the plan read (one that changed meanwhile is left alone: run again), then sets each block's
 * refcount to the contexts listing it, drops the contexts, removes blocks no context lists and
 * sets every segment's live bytes and blocks to what its block records add up to (C1, C3).
 */
#define _GNU_SOURCE
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include "ops_int.h"
#include "catalog/catalog.h"

/* ---- a small map of 16-byte keys to counters and notes ---- */

enum { F_BAD = 1, F_LOST = 2, F_SKIP = 4, F_SEEN = 8 };

typedef struct kmap {
  uint8_t (*key)[16];
  uint64_t *val;
  uint8_t (*aux)[16]; /* blocks: the first context listing it */
  uint32_t *idx;      /* blocks: 1 + its entry in the plan, 0 = none */
  uint8_t *flag;      /* F_* */
  uint8_t *used;
  size_t cap, n;
} kmap;

static int kmap_init(kmap *m, size_t want)
{
  memset(m, 0, sizeof *m);
  m->cap = 1024;
  while (m->cap < want * 2)
    m->cap *= 2;
  m->key = calloc(m->cap, 16);
  m->val = calloc(m->cap, sizeof *m->val);
  m->aux = calloc(m->cap, 16);
  m->idx = calloc(m->cap, sizeof *m->idx);
  m->flag = calloc(m->cap, 1);
  m->used = calloc(m->cap, 1);
  return m->key && m->val && m->aux && m->idx && m->flag && m->used ? 0 : -1;
}

static void kmap_free(kmap *m)
{
  free(m->key);
  free(m->val);
  free(m->aux);
  free(m->idx);
  free(m->flag);
  free(m->used);
}

/* The slot of key k (added when `add`), or SIZE_MAX when absent or the map is full. */
static size_t kmap_at(kmap *m, const uint8_t *k, int add)
{
  uint64_t h;
  memcpy(&h, k, 8);
  size_t i = h & (m->cap - 1);
  while (m->used[i] && memcmp(m->key[i], k, 16) != 0)
    i = (i + 1) & (m->cap - 1);
  if (!m->used[i]) {
    if (!add || m->n * 2 >= m->cap)
      return SIZE_MAX;
    m->used[i] = 1;
    memcpy(m->key[i], k, 16);
    m->val[i] = 0;
    m->n++;
  }
  return i;
}

/* Double the capacity (all entries kept); -1 when out of memory. */
static int kmap_grow(kmap *m)
{
  kmap n;
  if (kmap_init(&n, m->cap) != 0) {
    kmap_free(&n);
    return -1;
  }
  for (size_t i = 0; i < m->cap; i++) {
    if (!m->used[i])
      continue;
    size_t j = kmap_at(&n, m->key[i], 1);
    n.val[j] = m->val[i];
    memcpy(n.aux[j], m->aux[i], 16);
    n.idx[j] = m->idx[i];
    n.flag[j] = m->flag[i];
  }
  kmap_free(m);
  *m = n;
  return 0;
}

static uint64_t *kmap_slot(kmap *m, const uint8_t *k)
{
  size_t i = kmap_at(m, k, 1);
  return i == SIZE_MAX ? NULL : &m->val[i];
}

/* ---- the plan of a repair ---- */

typedef struct pblk { /* a block record rebuilt from its object */
  uint8_t hash[16];
  uint8_t *old, *nw; /* the record as read; as rebuilt */
  size_t old_len, nw_len;
} pblk;

typedef struct pctx { /* a context record rewritten (nw) or dropped (nw NULL) */
  uint8_t key[16];
  char why[96]; /* dropped: why */
  uint8_t *old, *nw;
  size_t old_len, nw_len;
} pctx;

typedef struct vctx {
  kvdb *db;
  kvdb_problem_fn fn;
  void *ctx;
  kvdb_verify_report *rep;
  int plan;          /* kvdb_repair: collect the plan */
  kv_txn *txn;
  kmap refs, live;
  pblk *pb;
  size_t n_pb, cap_pb;
  pctx *pc;
  size_t n_pc, cap_pc;
  uint8_t *buf;      /* block object reads (aligned) */
  size_t buf_cap;
  /* the block headers found in the segments scanned so far (find_copy): key the block hash
   * with its first 8 bytes XORed with the segment id, val its offset, flag 1 when several */
  int scan_ready;
  kmap scanned, objs;
  uint64_t index_problems; /* of them, disagreements of the block indexes */
} vctx;

static void problem(vctx *v, kvdb_status st, const char *fmt, ...) KV_PRINTF(3, 4);
static void problem(vctx *v, kvdb_status st, const char *fmt, ...)
{
  char msg[700];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  v->rep->problems++;
  if (v->fn != NULL && !v->plan) {
    kvdb_problem p = {st, msg};
    v->fn(v->ctx, &p);
  }
}

int kv_seg_gone_now(kvdb *db, uint64_t id)
{
  kv_txn *txn;
  if (kv_txn_begin(&db->cat, 0, &txn) != KVDB_OK)
    return 0;
  kv_seg_rec sr;
  int gone = kv_cat_get_seg(&db->cat, txn, id, &sr) == KVDB_NOTFOUND;
  kv_txn_abort(txn);
  return gone;
}

static uint8_t *dup_bytes(const void *p, size_t n)
{
  uint8_t *d = malloc(n ? n : 1);
  if (d != NULL)
    memcpy(d, p, n);
  return d;
}

static kvdb_status grow_buf(vctx *v, uint64_t bytes)
{
  if (bytes <= v->buf_cap)
    return KVDB_OK;
  kv_free_aligned(v->buf);
  v->buf = kv_alloc_aligned(bytes);
  v->buf_cap = v->buf ? bytes : 0;
  return v->buf ? KVDB_OK : kv_fail(KVDB_NOMEM, "verify buffer of %" PRIu64 " bytes", bytes);
}

/* "context KEY" or "no context lists it" for the block in slot i of refs */
static const char *ctx_name(vctx *v, size_t i, char *b)
{
  if (i == SIZE_MAX || v->refs.val[i] == 0)
    return "(no context lists it)";
  char hx[33];
  snprintf(b, 48, "context %s", kv_hex16(v->refs.aux[i], hx));
  return b;
}

/* ---- pass 1: contexts list blocks ---- */

/* The context record in val, decoded; one whose only fault is its token count is decoded with
 * a count its blocks can hold (*bad_count set), so that its blocks are still known. */
static kvdb_status ctx_decode(const kv_cat_bytes *val, kv_ctx_rec *cr, int *bad_count)
{
  *bad_count = 0;
  kvdb_status rc = kv_ctx_rec_decode(val->data, val->size, cr);
  if (rc == KVDB_OK || val->size < 56)
    return rc;
  char msg[512];
  snprintf(msg, sizeof msg, "%s", kvdb_errmsg());
  uint8_t *c = dup_bytes(val->data, val->size);
  if (c == NULL)
    return rc;
  kv_put_le64(c + 8, kv_get_le32(c + 4)); /* one token per block: the least a record says */
  kv_ctx_rec t;
  if (kv_ctx_rec_decode(c, val->size, &t) == KVDB_OK) {
    *cr = t;
    cr->blocks = (const uint8_t *)val->data + (t.blocks - c);
    cr->n_tokens = kv_get_le64((const uint8_t *)val->data + 8);
    *bad_count = 1;
    rc = KVDB_OK;
  } else {
    kv_fail(rc, "%s", msg);
  }
  free(c);
  return rc;
}

static kvdb_status pass_refs(vctx *v)
{
  kv_cat_iter it;
  KV_RET(kv_cat_iter_open(&v->db->cat, v->txn, KV_TBL_CONTEXTS, &it, "verify: contexts"));
  while (kv_cat_iter_next(&it)) {
    kv_ctx_rec cr;
    int bad_count;
    if (it.key.size != 16 || ctx_decode(&it.val, &cr, &bad_count) != KVDB_OK)
      continue; /* pass 3 says so */
    for (uint32_t b = 0; b < cr.n_blocks; b++) {
      size_t i = kmap_at(&v->refs, cr.blocks + 16 * b, 1);
      if (i == SIZE_MAX)
        continue;
      if (v->refs.val[i]++ == 0)
        memcpy(v->refs.aux[i], it.key.data, 16);
    }
  }
  kv_cat_iter_close(&it);
  return KVDB_OK;
}

/* ---- pass 2: each block record against its object ---- */

static const char *hexs(const uint8_t *b, char *hx)
{
  return kv_hex16(b, hx);
}

/*
 * Read the object at (seg, off) of a segment committed up to `end` and prove it is block
 * `hash`: *hdr its header; the object is in v->buf. `bytes` is the record's size (0 when not
 * known): read at once when it fits. KVDB_CORRUPT with a message that says what is there;
 * KVDB_NOTFOUND when the segment went away meanwhile (compaction); other errors as they come.
 * *misplaced is 1 when the failure is that no object of this block starts there (the record's
 * location is wrong), 0 when the object there is the block but damaged, or on success.
 */
static kvdb_status read_object(vctx *v, const uint8_t hash[16], uint64_t seg, uint64_t off,
                               uint64_t end, uint64_t bytes, kv_block_hdr *hdr, int *misplaced)
{
  kvdb *db = v->db;
  char hx[33], hy[33];
  *misplaced = 1; /* until the object there proves to be this block */
  /* objects start on pages, packed ones (FORMAT.md §3e) at 64 bytes */
  if (off % KV_BLOCK_PACK_ALIGN != 0 || off >= end || end - off < KV_BLOCK_HDR_BYTES)
    return kv_fail(KVDB_CORRUPT, "field segment/offset: offset %" PRIu64
                   " is not a block's place in segment %" PRIu64 " (committed end %" PRIu64 ")",
                   off, seg, end);
  uint64_t want = bytes >= KV_BLOCK_HDR_BYTES && bytes % KV_BLOCK_PACK_ALIGN == 0 &&
                         bytes <= end - off
                     ? bytes
                 : end - off < KV_PAGE ? end - off
                                       : KV_PAGE;
  KV_RET(grow_buf(v, want));
  kv_segfile *sf;
  kvdb_status rc = kv_segfile_get(db, seg, &sf);
  if (rc != KVDB_OK)
    return kv_seg_gone_now(db, seg) ? KVDB_NOTFOUND : kv_fail(KVDB_CORRUPT, "%s", kvdb_errmsg());
  int e = db->io->ops->pread(db->io, sf->f, v->buf, want, off);
  if (e != 0)
    *misplaced = 0; /* a short or unreadable file (kv_seg_read_fail says which), not a wrong place */
  if (e == 0) {
    rc = kv_block_parse_header(v->buf, want, hdr);
    *misplaced = rc != KVDB_OK || memcmp(hdr->block_hash, hash, 16) != 0 ||
                 hdr->obj.total_bytes > end - off;
    if (rc != KVDB_OK)
      rc = kv_fail(rc, "field segment/offset: segment %" PRIu64 " at offset %" PRIu64
                   " holds no block header: %s", seg,
                   off, kvdb_errmsg());
    else if (memcmp(hdr->block_hash, hash, 16) != 0)
      rc = kv_fail(KVDB_CORRUPT, "field segment/offset: segment %" PRIu64 " at offset %" PRIu64
                   " holds block %s, not %s",
                   seg, off, hexs(hdr->block_hash, hx), hexs(hash, hy));
    else if (hdr->obj.total_bytes > end - off)
      rc = kv_fail(KVDB_CORRUPT, "field segment/offset: the object of block %s at offset %" PRIu64
                   " of segment %" PRIu64 " (%" PRIu64 " bytes) runs past the committed end %"
                   PRIu64,
                   hexs(hash, hx), off, seg, hdr->obj.total_bytes, end);
    else if (hdr->obj.total_bytes != want) {
      rc = grow_buf(v, hdr->obj.total_bytes);
      if (rc == KVDB_OK && (e = db->io->ops->pread(db->io, sf->f, v->buf, hdr->obj.total_bytes,
                                                   off)) != 0)
        rc = KVDB_IOERR;
    }
  }
  kv_segfile_put(db, sf);
  if (e != 0) /* a missing or short file is KVDB_CORRUPT, naming it */
    return kv_seg_read_fail(db, -e, seg, off, want, hash);
  if (rc != KVDB_OK)
    return rc;
  /* the object proves itself: its header as the record it implies, every checksum */
  kv_block_rec or = {.n_tokens = hdr->g.n_tokens, .segment = seg, .offset = off,
                     .bytes = hdr->obj.total_bytes};
  or.bflags = (KV_HDR_CPR(hdr) ? KV_BLK_COMPRESSED : 0) |
              (KV_HDR_PACKED(hdr) ? KV_BLK_PACKED : 0) |
              kv_score_rec_flags(hdr->score_bits, hdr->score_variant);
  return kv_block_check(&or, hash, v->buf, hdr);
}

/* ---- finding a block whose record's offset is wrong ---- */

#define SCAN_CHUNK (1u << 20)

static void obj_key(uint8_t k[16], const uint8_t hash[16], uint64_t seg)
{
  memcpy(k, hash, 16);
  for (int i = 0; i < 8; i++)
    k[i] ^= (uint8_t)(seg >> (8 * i));
}

/* Every block header in segment `seg` (committed up to `end`) into v->objs. */
static kvdb_status scan_segment(vctx *v, uint64_t seg, uint64_t end)
{
  kvdb *db = v->db;
  kv_segfile *sf;
  KV_RET(kv_segfile_get(db, seg, &sf));
  uint8_t *chunk = kv_alloc_aligned(SCAN_CHUNK);
  kvdb_status rc = chunk ? KVDB_OK : kv_fail(KVDB_NOMEM, "segment scan buffer");
  /* headers at every 64 bytes (packed objects, FORMAT.md §3e; others start on pages); chunks
   * overlap by a page so that a header across a chunk's end is seen whole in the next */
  const uint64_t step = SCAN_CHUNK - KV_PAGE;
  for (uint64_t at = 0; rc == KVDB_OK && at < end; at += step) {
    uint64_t len = end - at < SCAN_CHUNK ? end - at : SCAN_CHUNK;
    int e = db->io->ops->pread(db->io, sf->f, chunk, len, at);
    if (e != 0) {
      rc = kv_fail_errno(-e, "cannot read segment %" PRIu64 " at offset %" PRIu64, seg, at);
      break;
    }
    for (uint64_t p = 0; p + KV_BLOCK_HDR_BYTES <= len && p < step; p += KV_BLOCK_PACK_ALIGN) {
      kv_block_hdr h;
      if (kv_get_le32(chunk + p) != KV_BLOCK_MAGIC ||
          kv_block_parse_header(chunk + p, KV_BLOCK_HDR_BYTES, &h) != KVDB_OK)
        continue;
      uint8_t k[16];
      obj_key(k, h.block_hash, seg);
      if (v->objs.n * 2 + 2 >= v->objs.cap && kmap_grow(&v->objs) != 0) {
        rc = kv_fail(KVDB_NOMEM, "segment scan index");
        break;
      }
      size_t i = kmap_at(&v->objs, k, 1);
      if (v->objs.idx[i]++ == 0)
        v->objs.val[i] = at + p;
    }
  }
  kv_free_aligned(chunk);
  kv_segfile_put(db, sf);
  return rc;
}

/*
 * The offset of the one object of block `hash` in segment `seg`: KVDB_OK with *off, or
 * KVDB_NOTFOUND with *copies 0 (none) or more (several: which one the record meant cannot be
 * told, e.g. a re-encoded block's older copy). Each segment is scanned once per call of
 * verify or repair, only when some record's location is wrong.
 */
static kvdb_status find_copy(vctx *v, const uint8_t hash[16], uint64_t seg, uint64_t end,
                             uint64_t *off, uint32_t *copies)
{
  *copies = 0;
  if (!v->scan_ready) {
    if (kmap_init(&v->scanned, 16) != 0 || kmap_init(&v->objs, 1024) != 0)
      return kv_fail(KVDB_NOMEM, "segment scan index");
    v->scan_ready = 1;
  }
  uint8_t sk[16] = {0};
  kv_put_le64(sk, seg);
  if (kmap_at(&v->scanned, sk, 0) == SIZE_MAX) {
    if (v->scanned.n * 2 + 2 >= v->scanned.cap && kmap_grow(&v->scanned) != 0)
      return kv_fail(KVDB_NOMEM, "segment scan index");
    KV_RET(scan_segment(v, seg, end));
    kmap_at(&v->scanned, sk, 1);
  }
  uint8_t k[16];
  obj_key(k, hash, seg);
  size_t i = kmap_at(&v->objs, k, 0);
  if (i == SIZE_MAX)
    return KVDB_NOTFOUND;
  *copies = v->objs.idx[i];
  *off = v->objs.val[i];
  return *copies == 1 ? KVDB_OK : KVDB_NOTFOUND;
}

/* The record of block `hash` as its verified object says it should be, into a new buffer;
 * `raw` is the record as stored (its config bytes are kept when they fit the object). NULL
 * when the object's config cannot be told (a compressed object whose record lost it). */
static uint8_t *rebuild_rec(vctx *v, const uint8_t *raw, size_t raw_len, uint64_t seg,
                            uint64_t off, uint32_t refcount, const kv_block_hdr *hdr, size_t *len)
{
  kv_block_rec nr;
  memset(&nr, 0, sizeof nr);
  if (raw_len >= 16) {
    nr.bflags = raw[2] & (KV_BLK_COMPRESSED | KV_BLK_DROPS | KV_BLK_KEPTN);
    nr.method = raw[3];
    nr.bits = raw[12];
    nr.drop = raw[13];
    nr.keep_permille = kv_get_le16(raw + 14);
  }
  if (!KV_HDR_CPR(hdr)) { /* a raw object: its config is raw whatever the record said */
    nr.bflags = 0;
    nr.method = KVDB_METHOD_RAW;
    nr.bits = nr.drop = 0;
    nr.keep_permille = 0;
  }
  nr.bflags |= kv_score_rec_flags(hdr->score_bits, hdr->score_variant);
  if (KV_HDR_PACKED(hdr)) /* block format 4 or 5 */
    nr.bflags |= KV_BLK_PACKED;
  nr.refcount = refcount ? refcount : 1;
  nr.tier = kv_seg_tier(seg);
  nr.n_tokens = hdr->g.n_tokens;
  nr.segment = seg;
  nr.offset = off;
  nr.bytes = hdr->obj.total_bytes;
  memcpy(nr.parent, hdr->parent_hash, 16);
  memcpy(nr.model, hdr->model_hash, 16);
  uint32_t *tok = malloc(4 * (size_t)nr.n_tokens);
  *len = kv_block_rec_size(nr.n_tokens);
  uint8_t *out = malloc(*len);
  if (tok == NULL || out == NULL) {
    free(tok);
    free(out);
    return NULL;
  }
  for (uint32_t i = 0; i < nr.n_tokens; i++)
    tok[i] = kv_block_token(hdr, v->buf, i);
  kv_block_rec_encode(&nr, tok, out);
  free(tok);
  kv_block_rec chk;
  if (kv_block_rec_decode(out, *len, &chk) != KVDB_OK ||
      ((chk.bflags & KV_BLK_COMPRESSED) != 0) != (KV_HDR_CPR(hdr))) {
    free(out);
    return NULL;
  }
  return out;
}

static kvdb_status plan_block(vctx *v, size_t slot, const uint8_t *hash, const kv_cat_bytes *val,
                              uint8_t *nw, size_t nw_len)
{
  uint8_t *old;
  if (kv_grow((void **)&v->pb, v->n_pb, &v->cap_pb, sizeof *v->pb, 16) != 0 ||
      (old = dup_bytes(val->data, val->size)) == NULL) {
    free(nw);
    return kv_fail(KVDB_NOMEM, "repair plan");
  }
  pblk *p = &v->pb[v->n_pb++];
  memcpy(p->hash, hash, 16);
  p->old = old;
  p->old_len = val->size;
  p->nw = nw;
  p->nw_len = nw_len;
  if (slot != SIZE_MAX)
    v->refs.idx[slot] = (uint32_t)v->n_pb;
  return KVDB_OK;
}

/* One block record: its location, its object, each field. */
static kvdb_status check_block(vctx *v, const uint8_t *hash, const kv_cat_bytes *val)
{
  kvdb *db = v->db;
  char hx[33], cn[48], ha[33], hb[33];
  size_t slot = kmap_at(&v->refs, hash, 1);
  uint64_t listed = slot != SIZE_MAX ? v->refs.val[slot] : 0;
  const char *who = ctx_name(v, slot, cn);
  const uint8_t *raw = val->data;
  kv_block_rec br;
  int have = kv_block_rec_decode(val->data, val->size, &br) == KVDB_OK;
  if (slot != SIZE_MAX)
    v->refs.flag[slot] |= F_SEEN;
  if (!have) {
    problem(v, KVDB_CORRUPT, "block %s of %s: its record does not decode: %s", hexs(hash, hx),
            who, kvdb_errmsg());
    if (slot != SIZE_MAX)
      v->refs.flag[slot] |= F_BAD;
    if (val->size < 72) { /* not even where it is */
      if (slot != SIZE_MAX)
        v->refs.flag[slot] |= F_LOST;
      return KVDB_OK;
    }
    /* its fields as they stand, to be compared one by one with the object */
    memset(&br, 0, sizeof br);
    br.tier = raw[1];
    br.bflags = raw[2];
    br.refcount = kv_get_le32(raw + 4);
    br.n_tokens = kv_get_le32(raw + 8);
    br.segment = kv_get_le64(raw + 16);
    br.offset = kv_get_le64(raw + 24);
    br.bytes = kv_get_le64(raw + 32);
    memcpy(br.parent, raw + 40, 16);
    memcpy(br.model, raw + 56, 16);
    br.tokens = val->size == kv_block_rec_size(br.n_tokens) ? raw + 72 : NULL;
  }
  if (listed != br.refcount)
    problem(v, KVDB_CORRUPT, "block %s of %s: field refcount: the record says %u, %" PRIu64
            " contexts list it", hexs(hash, hx), who, br.refcount, listed);
  kv_seg_rec sr;
  if (kv_cat_get_seg(&db->cat, v->txn, br.segment, &sr) != KVDB_OK) {
    problem(v, KVDB_CORRUPT, "block %s of %s: field segment: segment %" PRIu64 " has no record",
            hexs(hash, hx), who, br.segment);
    if (slot != SIZE_MAX)
      v->refs.flag[slot] |= F_LOST | F_BAD;
    return KVDB_OK;
  }
  /* a record lying past its segment's end is not counted live; the object says what is wrong */
  if (br.bytes <= sr.end && br.offset <= sr.end - br.bytes) {
    uint8_t segkey[16] = {0};
    kv_put_le64(segkey, br.segment);
    uint64_t *l = kmap_slot(&v->live, segkey);
    if (l != NULL)
      *l += br.bytes;
  }
  kv_block_hdr hdr;
  int misplaced = 0;
  uint64_t at = br.offset; /* where the object is */
  kvdb_status st = read_object(v, hash, br.segment, br.offset, sr.end, br.bytes, &hdr, &misplaced);
  if (st == KVDB_CORRUPT && misplaced) {
    /* no object of this block where the record says: is there exactly one in its segment? */
    char why[400];
    snprintf(why, sizeof why, "%s", kvdb_errmsg());
    uint32_t copies = 0;
    kvdb_status fs = find_copy(v, hash, br.segment, sr.end, &at, &copies);
    if (fs == KVDB_OK) {
      int mp2;
      st = read_object(v, hash, br.segment, at, sr.end, 0, &hdr, &mp2);
    } else if (fs == KVDB_NOTFOUND) {
      kv_fail(KVDB_CORRUPT, "%s; segment %" PRIu64 " holds %s", why, br.segment,
              copies == 0 ? "no copy of it" : "several copies of it");
    } else if (fs == KVDB_NOMEM) {
      return fs;
    } else { /* the scan failed: the location stays unknown */
      st = kv_fail(fs == KVDB_IOERR ? KVDB_IOERR : KVDB_CORRUPT, "%s; scanning segment %" PRIu64
                   " for it: %s", why, br.segment, kvdb_errmsg());
    }
  }
  if (st == KVDB_NOTFOUND) { /* compacted away since the snapshot: not a problem */
    if (slot != SIZE_MAX)
      v->refs.flag[slot] |= F_SKIP;
    return KVDB_OK;
  }
  if (st == KVDB_NOMEM)
    return st;
  if (st != KVDB_OK) {
    problem(v, st, "block %s of %s: %s", hexs(hash, hx), who, kvdb_errmsg());
    if (slot != SIZE_MAX)
      v->refs.flag[slot] |= st == KVDB_CORRUPT ? F_LOST | F_BAD : F_SKIP;
    return KVDB_OK;
  }
  v->rep->bytes_checked += hdr.obj.total_bytes;
  int bad = !have;
  {
    const char *pre = "block";
#define FIELD(cond, ...)                                                                     \
  do {                                                                                       \
    if (cond) {                                                                              \
      bad = 1;                                                                               \
      problem(v, KVDB_CORRUPT, __VA_ARGS__);                                                 \
    }                                                                                        \
  } while (0)
    FIELD(at != br.offset,
          "%s %s of %s: field offset: the record says %" PRIu64 ", segment %" PRIu64
          " holds the block at %" PRIu64, pre, hexs(hash, hx), who, br.offset, br.segment, at);
    FIELD(br.n_tokens != hdr.g.n_tokens,
          "%s %s of %s: field n_tokens: the record says %u, segment %" PRIu64 " offset %" PRIu64
          " holds %u", pre, hexs(hash, hx), who, br.n_tokens, br.segment, br.offset,
          hdr.g.n_tokens);
    FIELD(br.bytes != hdr.obj.total_bytes,
          "%s %s of %s: field bytes: the record says %" PRIu64 ", the object is %" PRIu64, pre,
          hexs(hash, hx), who, br.bytes, hdr.obj.total_bytes);
    if (br.n_tokens == hdr.g.n_tokens && br.tokens != NULL) {
      for (uint32_t i = 0; i < br.n_tokens; i++) {
        uint32_t a = kv_get_le32(br.tokens + 4 * i), b = kv_block_token(&hdr, v->buf, i);
        if (a != b) {
          FIELD(1, "%s %s of %s: field tokens: token %u is %u in the record, %u in the block",
                pre, hexs(hash, hx), who, i, a, b);
          break;
        }
      }
    }
    FIELD(memcmp(br.parent, hdr.parent_hash, 16) != 0,
          "%s %s of %s: field parent: the record says %s, the block %s", pre, hexs(hash, hx), who,
          hexs(br.parent, ha), hexs(hdr.parent_hash, hb));
    FIELD(memcmp(br.model, hdr.model_hash, 16) != 0,
          "%s %s of %s: field model: the record says %s, the block %s", pre, hexs(hash, hx), who,
          hexs(br.model, ha), hexs(hdr.model_hash, hb));
    FIELD(((br.bflags & KV_BLK_PACKED) != 0) != KV_HDR_PACKED(&hdr),
          "%s %s of %s: field flags: the record says %s, the object is %s", pre, hexs(hash, hx),
          who, (br.bflags & KV_BLK_PACKED) ? "packed" : "not packed",
          hdr.version == KV_BLOCK_VERSION_PACKED ? "packed (block format 4)"
          : hdr.version == KV_BLOCK_VERSION_PCPR ? "packed (block format 5)"
                                                 : "not packed");
    FIELD(((br.bflags & KV_BLK_COMPRESSED) != 0) != (KV_HDR_CPR(&hdr)) ||
              kv_rec_score_bits(&br) != hdr.score_bits ||
              kv_rec_score_variant(&br) != hdr.score_variant,
          "%s %s of %s: field flags: the record says %s with %u score bits (copies of version "
          "%u), the block is %s with %u (version %u)", pre, hexs(hash, hx), who,
          (br.bflags & KV_BLK_COMPRESSED) ? "compressed" : "raw", kv_rec_score_bits(&br),
          kv_rec_score_variant(&br) ? 2u : 1u, KV_HDR_CPR(&hdr) ? "compressed" : "raw",
          hdr.score_bits, hdr.score_variant ? 2u : 1u);
    FIELD(br.tier != kv_seg_tier(br.segment),
          "%s %s of %s: field tier: the record says %u, segment %" PRIu64 " is on tier %u", pre,
          hexs(hash, hx), who, br.tier, br.segment, kv_seg_tier(br.segment));
#undef FIELD
  }
  if (!bad)
    return KVDB_OK;
  if (slot != SIZE_MAX)
    v->refs.flag[slot] |= F_BAD;
  if (!v->plan)
    return KVDB_OK;
  size_t nl;
  uint8_t *nw = rebuild_rec(v, raw, val->size, br.segment, at,
                            listed ? (uint32_t)listed : br.refcount, &hdr, &nl);
  if (nw == NULL) {
    if (slot != SIZE_MAX)
      v->refs.flag[slot] |= F_LOST;
    return KVDB_OK;
  }
  return plan_block(v, slot, hash, val, nw, nl);
}

static kvdb_status pass_blocks(vctx *v, kvdb_progress_fn progress, void *pcx, uint64_t n_blocks)
{
  kv_cat_iter it;
  kvdb_status rc = KVDB_OK;
  KV_RET(kv_cat_iter_open(&v->db->cat, v->txn, KV_TBL_BLOCKS, &it, "verify: blocks"));
  while (rc == KVDB_OK && kv_cat_iter_next(&it)) {
    v->rep->blocks_checked++;
    if (progress != NULL)
      progress(pcx, v->rep->blocks_checked, n_blocks);
    if (it.key.size != 16) {
      problem(v, KVDB_CORRUPT, "a block record has a key of %zu bytes", it.key.size);
      continue;
    }
    rc = check_block(v, it.key.data, &it.val);
  }
  kv_cat_iter_close(&it);
  return rc;
}

/* ---- pass 3: each context against its blocks ---- */

static kvdb_status plan_ctx(vctx *v, const uint8_t key[16], const kv_cat_bytes *val, uint8_t *nw,
                            size_t nw_len, const char *why)
{
  uint8_t *old;
  if (kv_grow((void **)&v->pc, v->n_pc, &v->cap_pc, sizeof *v->pc, 16) != 0 ||
      (old = dup_bytes(val->data, val->size)) == NULL) {
    free(nw);
    return kv_fail(KVDB_NOMEM, "repair plan");
  }
  pctx *p = &v->pc[v->n_pc++];
  memcpy(p->key, key, 16);
  snprintf(p->why, sizeof p->why, "%s", why);
  p->old = old;
  p->old_len = val->size;
  p->nw = nw;
  p->nw_len = nw_len;
  return KVDB_OK;
}

/* The block record `hash` as the repair will leave it (rebuilt or as stored); *state F_*. */
static int block_now(vctx *v, const uint8_t *hash, kv_block_rec *br, uint8_t *state)
{
  size_t slot = kmap_at(&v->refs, hash, 0);
  *state = slot != SIZE_MAX ? v->refs.flag[slot] : 0;
  if (slot != SIZE_MAX && v->refs.idx[slot] != 0) {
    const pblk *p = &v->pb[v->refs.idx[slot] - 1];
    return kv_block_rec_decode(p->nw, p->nw_len, br) == KVDB_OK;
  }
  kvdb_status rc = kv_cat_get_block(&v->db->cat, v->txn, hash, br);
  if (slot == SIZE_MAX && rc != KVDB_NOTFOUND) /* not in the map (it was full): as read */
    *state = F_SEEN | (rc == KVDB_OK ? 0 : F_BAD | F_LOST);
  return rc == KVDB_OK;
}

static kvdb_status check_ctx(vctx *v, const uint8_t *key, const kv_cat_bytes *val)
{
  char hx[33], hb[33], ha[33];
  kv_ctx_rec cr;
  int bad_count;
  v->rep->contexts_checked++;
  if (ctx_decode(val, &cr, &bad_count) != KVDB_OK) {
    problem(v, KVDB_CORRUPT, "context %s: its record does not decode: %s", hexs(key, hx),
            kvdb_errmsg());
    return v->plan ? plan_ctx(v, key, val, NULL, 0, "its record does not decode") : KVDB_OK;
  }
  int explicit_key = (cr.flags & KV_CTX_EXPLICIT) != 0;
  int drop = 0, skip = 0, known = 1; /* known: every block's record is consistent */
  char why[96] = "";
#define DROP(...)                                                                            \
  do {                                                                                       \
    if (!drop)                                                                               \
      snprintf(why, sizeof why, __VA_ARGS__);                                                \
    drop = 1;                                                                                \
  } while (0)
  uint64_t sum = 0;
  uint8_t prev[16];
  memcpy(prev, cr.model, 16);
  for (uint32_t b = 0; b < cr.n_blocks; b++) {
    const uint8_t *h = cr.blocks + 16 * b;
    kv_block_rec br;
    uint8_t st;
    int ok = block_now(v, h, &br, &st);
    if (st & F_SKIP) {
      skip = 1;
      known = 0;
      continue;
    }
    if (!(st & F_SEEN)) {
      problem(v, KVDB_CORRUPT, "context %s: field blocks[%u]: it lists block %s, which has no "
              "record", hexs(key, hx), b, hexs(h, hb));
      DROP("block %u (%s) has no record", b, hexs(h, hb));
      known = 0;
      continue;
    }
    if (!ok || (st & F_LOST)) { /* said in pass 2 */
      DROP("block %u (%s) cannot be rebuilt from a verified object", b, hexs(h, hb));
      known = 0;
      continue;
    }
    if (st & F_BAD)
      known = v->plan; /* the record's fields are fixed by the plan, else unknown */
    if (!known)
      continue;
    sum += br.n_tokens;
    if (memcmp(br.model, cr.model, 16) != 0) {
      problem(v, KVDB_CORRUPT, "context %s: field model: %s, but its block %u (%s) is of model %s",
              hexs(key, hx), hexs(cr.model, ha), b, hexs(h, hb), kv_hex16(br.model, (char[33]){0}));
      DROP("block %u is of another model", b);
    }
    if (explicit_key) {
      if (cr.n_blocks != 1 || memcmp(h, key, 16) != 0 || memcmp(br.parent, cr.model, 16) != 0) {
        problem(v, KVDB_CORRUPT, "context %s: field blocks[%u]: an explicit-key context lists "
                "block %s", hexs(key, hx), b, hexs(h, hb));
        DROP("an explicit-key context lists another block");
      }
      continue;
    }
    if (memcmp(br.parent, prev, 16) != 0) {
      problem(v, KVDB_CORRUPT, "context %s: block %u (%s): field parent: %s, but block %u of the "
              "context is %s", hexs(key, hx), b, hexs(h, hb), hexs(br.parent, ha), b ? b - 1 : 0,
              b ? kv_hex16(prev, (char[33]){0}) : "its model");
      DROP("its chain breaks at block %u (parent)", b);
    }
    uint8_t want[16];
    uint32_t *tok = malloc(4 * (size_t)br.n_tokens);
    if (tok == NULL)
      return kv_fail(KVDB_NOMEM, "verify tokens");
    for (uint32_t i = 0; i < br.n_tokens; i++)
      tok[i] = kv_get_le32(br.tokens + 4 * i);
    kv_chain_hash(br.parent, tok, br.n_tokens, want);
    free(tok);
    if (memcmp(want, h, 16) != 0) {
      problem(v, KVDB_CORRUPT, "context %s: field blocks[%u]: %s is not the hash of its parent "
              "and tokens (%s)", hexs(key, hx), b, hexs(h, hb), hexs(want, ha));
      DROP("its chain breaks at block %u (hash)", b);
    }
    memcpy(prev, h, 16);
  }
  if (!explicit_key && memcmp(cr.blocks + 16 * (size_t)(cr.n_blocks - 1), key, 16) != 0) {
    problem(v, KVDB_CORRUPT, "context %s: field blocks[%u]: the key is not the hash of its last "
            "block %s", hexs(key, hx), cr.n_blocks - 1,
            hexs(cr.blocks + 16 * (size_t)(cr.n_blocks - 1), hb));
    DROP("its key is not the hash of its last block");
  }
  int recount = 0;
  if (known && sum != cr.n_tokens) {
    problem(v, KVDB_CORRUPT, "context %s: field n_tokens: the record says %" PRIu64 ", its blocks "
            "hold %" PRIu64, hexs(key, hx), cr.n_tokens, sum);
    recount = 1;
  } else if (bad_count) {
    problem(v, KVDB_CORRUPT, "context %s: field n_tokens: the record says %" PRIu64
            " for %u blocks", hexs(key, hx), cr.n_tokens, cr.n_blocks);
    recount = known;
    if (!known && !skip)
      DROP("its token count cannot be told");
  }
  if (!v->plan || skip)
    return KVDB_OK;
#undef DROP
  if (drop)
    return plan_ctx(v, key, val, NULL, 0, why);
  if (recount) {
    uint8_t *nw = dup_bytes(val->data, val->size);
    if (nw == NULL)
      return kv_fail(KVDB_NOMEM, "repair plan");
    kv_put_le64(nw + 8, sum);
    return plan_ctx(v, key, val, nw, val->size, "");
  }
  return KVDB_OK;
}

static kvdb_status pass_contexts(vctx *v)
{
  kv_cat_iter it;
  kvdb_status rc = KVDB_OK;
  KV_RET(kv_cat_iter_open(&v->db->cat, v->txn, KV_TBL_CONTEXTS, &it, "verify: contexts"));
  while (rc == KVDB_OK && kv_cat_iter_next(&it)) {
    if (it.key.size != 16) {
      v->rep->contexts_checked++;
      problem(v, KVDB_CORRUPT, "a context record has a key of %zu bytes", it.key.size);
      continue;
    }
    rc = check_ctx(v, it.key.data, &it.val);
  }
  kv_cat_iter_close(&it);
  return rc;
}

/* ---- pass 3b: model records (checksums and values of calibrations and output gains) ---- */

static kvdb_status pass_models(vctx *v)
{
  kv_cat_iter it;
  KV_RET(kv_cat_iter_open(&v->db->cat, v->txn, KV_TBL_MODELS, &it, "verify: models"));
  while (kv_cat_iter_next(&it)) {
    int n = it.key.size < 63 ? (int)it.key.size : 63;
    kv_model_rec mr;
    if (kv_model_rec_decode(it.val.data, it.val.size, &mr) != KVDB_OK) {
      problem(v, KVDB_CORRUPT, "model '%.*s': its record does not decode: %s", n,
              (const char *)it.key.data, kvdb_errmsg());
      continue;
    }
    kv_calib c;
    memset(&c, 0, sizeof c);
    if (mr.calib_bytes != 0 && kv_model_calib_decode(it.val.data, it.val.size, &c) != KVDB_OK) {
      problem(v, KVDB_CORRUPT, "model '%.*s': its calibration: %s (int4 / int2 puts of the "
                               "model fail until kvdb_model_calibrate stores a new one)",
              n, (const char *)it.key.data, kvdb_errmsg());
      continue;
    }
    kv_calib_free(&c);
    kv_model_gains g = {0, 0, 0, NULL};
    if (mr.gains_bytes != 0 && kv_model_gains_decode(it.val.data, it.val.size, &g) != KVDB_OK) {
      problem(v, KVDB_CORRUPT, "model '%.*s': its output gains: %s (profiles of the model fail "
                               "until kvdb_model_set_output_gains stores new ones)",
              n, (const char *)it.key.data, kvdb_errmsg());
      continue;
    }
    kv_model_gains_free(&g);
  }
  kv_cat_iter_close(&it);
  return KVDB_OK;
}

/* ---- pass 4: segments ---- */

static kvdb_status pass_segments(vctx *v)
{
  kvdb *db = v->db;
  kv_cat_iter it;
  KV_RET(kv_cat_iter_open(&db->cat, v->txn, KV_TBL_SEGMENTS, &it, "verify: segments"));
  while (kv_cat_iter_next(&it)) {
    v->rep->segments_checked++;
    kv_seg_rec sr;
    uint64_t id;
    if (kv_cat_iter_seg(&it, &id, &sr) != KVDB_OK) {
      problem(v, KVDB_CORRUPT, "segment record: %s", kvdb_errmsg());
      continue;
    }
    uint8_t segkey[16] = {0};
    kv_put_le64(segkey, id);
    uint64_t *l = kmap_slot(&v->live, segkey);
    if (l != NULL && *l != sr.live_bytes)
      problem(v, KVDB_CORRUPT, "segment %" PRIu64 " records %" PRIu64 " live bytes, blocks add up to %" PRIu64,
              id, sr.live_bytes, *l);
    if (sr.end == 0)
      continue;
    kv_segfile *sf;
    kvdb_status st = kv_segfile_get(db, id, &sf);
    if (st != KVDB_OK) {
      if (!kv_seg_gone_now(db, id)) /* else moved by a compaction meanwhile */
        problem(v, KVDB_CORRUPT, "segment %" PRIu64 ": %s", id, kvdb_errmsg());
      continue;
    }
    uint64_t size = 0;
    char path[4200];
    if (db->io->ops->size(db->io, sf->f, &size) == 0 && size < sr.end &&
        kv_seg_path(db, id, path, sizeof path) == KVDB_OK)
      problem(v, KVDB_CORRUPT, "segment %" PRIu64 " file '%s' has %" PRIu64 " bytes, %" PRIu64
              " committed: %" PRIu64 " bytes of blocks lie past the file's end", id, path, size,
              sr.end, sr.end - size);
    kv_segfile_put(db, sf);
  }
  kv_cat_iter_close(&it);
  return KVDB_OK;
}

/* ---- the passes, for verify and for repair's plan ---- */

static void vctx_free(vctx *v)
{
  kmap_free(&v->refs);
  kmap_free(&v->live);
  for (size_t i = 0; i < v->n_pb; i++) {
    free(v->pb[i].old);
    free(v->pb[i].nw);
  }
  for (size_t i = 0; i < v->n_pc; i++) {
    free(v->pc[i].old);
    free(v->pc[i].nw);
  }
  free(v->pb);
  free(v->pc);
  kv_free_aligned(v->buf);
  if (v->scan_ready) {
    kmap_free(&v->scanned);
    kmap_free(&v->objs);
  }
  kv_txn_abort(v->txn);
  v->txn = NULL;
}

/* The block indexes (segment index, lookup trie) against the block records: each disagreement
 * is a problem (catalog/index.h, kv_idx_verify); kvdb_repair rebuilds both. */
static void index_problem(void *ctx, const char *msg)
{
  vctx *v = ctx;
  v->index_problems++;
  problem(v, KVDB_CORRUPT, "%s", msg);
}

static kvdb_status pass_indexes(vctx *v)
{
  return kv_idx_verify(&v->db->cat, v->txn, index_problem, v);
}

static kvdb_status run_passes(vctx *v, kvdb_progress_fn progress, void *pcx)
{
  KV_RET(kv_txn_begin(&v->db->cat, 0, &v->txn));
  uint64_t n_blocks;
  if (kv_cat_count(&v->db->cat, v->txn, KV_TBL_BLOCKS, &n_blocks) != KVDB_OK)
    n_blocks = 0; /* only sizes the maps */
  if (kmap_init(&v->refs, n_blocks + 16) != 0 || kmap_init(&v->live, 4096) != 0)
    return kv_fail(KVDB_NOMEM, "verify maps");
  KV_RET(pass_refs(v));
  KV_RET(pass_blocks(v, progress, pcx, n_blocks));
  KV_RET(pass_contexts(v));
  KV_RET(pass_models(v));
  KV_RET(pass_segments(v));
  return pass_indexes(v);
}

kvdb_status kvdb_verify(kvdb *db, kvdb_problem_fn on_problem, kvdb_progress_fn progress, void *ctx,
                        kvdb_verify_report *report)
{
  KV_RET(kv_check_db(db));
  kvdb_verify_report tmp;
  if (report == NULL)
    report = &tmp;
  memset(report, 0, sizeof *report);
  vctx v;
  memset(&v, 0, sizeof v);
  v.db = db;
  v.fn = on_problem;
  v.ctx = ctx;
  v.rep = report;
  kvdb_status rc = run_passes(&v, progress, ctx);
  vctx_free(&v);
  if (rc != KVDB_OK)
    return rc;
  if (report->problems > 0)
    return kv_fail(KVDB_CORRUPT, "%" PRIu64 " problems found", report->problems);
  return KVDB_OK;
}

/* ---- repair ---- */

typedef struct rctx {
  kvdb *db;
  kvdb_problem_fn fn;
  void *ctx;
  kvdb_repair_report *rep;
  int dry;
} rctx;

static void action(rctx *r, const char *fmt, ...) KV_PRINTF(2, 3);
static void action(rctx *r, const char *fmt, ...)
{
  if (r->fn == NULL)
    return;
  char msg[700];
  int n = snprintf(msg, sizeof msg, "%s", r->dry ? "would " : "");
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg + n, sizeof msg - (size_t)n, fmt, ap);
  va_end(ap);
  kvdb_problem p = {KVDB_CORRUPT, msg};
  r->fn(r->ctx, &p);
}

/* 1 when record `key` of table `tbl` holds exactly (old, len) in txn t: nothing changed it
 * since the plan read it */
static int unchanged(kvdb *db, kv_txn *t, kv_cat_table tbl, const uint8_t key[16],
                     const uint8_t *old, size_t len)
{
  kv_cat_bytes v;
  return kv_cat_get_raw(&db->cat, t, tbl, key, 16, &v) == KVDB_OK && v.size == len &&
         memcmp(v.data, old, len) == 0;
}

/* Drop context `key` (its record is `old`): the record, its access-time entry, profile and
 * access count. Its blocks are released by fix_counts. */
static kvdb_status drop_ctx(kvdb *db, kv_txn *t, const uint8_t key[16], const uint8_t *old,
                            size_t len)
{
  uint64_t ms = len >= 40 ? kv_get_le64(old + 32) : 0;
  /* where the record does not say when (or its entry is not there): found by a scan */
  kvdb_status rc = kv_cat_del_atime(&db->cat, t, key, len >= 40 ? &ms : NULL);
  if (rc != KVDB_OK && rc != KVDB_NOTFOUND)
    return rc;
  rc = kv_cat_del_profile(&db->cat, t, key);
  if (rc != KVDB_OK && rc != KVDB_NOTFOUND)
    return rc;
  KV_RET(kv_cat_del_ctxstats(&db->cat, t, key));
  return kv_cat_del_ctx(&db->cat, t, key);
}

typedef struct bfix {
  uint8_t hash[16], parent[16];
  int del, has_parent;
  uint32_t refcount;
} bfix;

/*
 * C1 and C3 from the contexts and blocks of txn t: every block's refcount becomes the number of
 * contexts listing it, blocks no context lists are removed, every segment's live bytes and
 * blocks become what its block records add up to. Dry (t is the plan's snapshot): says what
 * it would do with the plan carried out (v's rebuilt records, its dropped contexts left out).
 */
static kvdb_status fix_counts(rctx *r, vctx *v, kv_txn *t)
{
  kvdb *db = r->db;
  char hx[33];
  kmap cnt, drops, live;
  bfix *fx = NULL;
  size_t n_fx = 0, cap_fx = 0;
  kv_cat_iter it = {0}; /* closed at out: (a zeroed iterator may be) */
  kvdb_status rc = KVDB_OK;
  uint64_t n_blocks;
  if (kv_cat_count(&db->cat, t, KV_TBL_BLOCKS, &n_blocks) != KVDB_OK)
    n_blocks = 0;
  int m1 = kmap_init(&cnt, n_blocks + 16), m2 = kmap_init(&drops, r->dry ? v->n_pc : 0),
      m3 = kmap_init(&live, 4096);
  if (m1 || m2 || m3) {
    rc = kv_fail(KVDB_NOMEM, "repair maps");
    goto out;
  }
  if (r->dry)
    for (size_t i = 0; i < v->n_pc; i++)
      if (v->pc[i].nw == NULL)
        kmap_slot(&drops, v->pc[i].key);
  /* the contexts listing each block */
  if ((rc = kv_cat_iter_open(&db->cat, t, KV_TBL_CONTEXTS, &it, "repair: contexts")) != KVDB_OK)
    goto out;
  while (kv_cat_iter_next(&it)) {
    kv_ctx_rec cr;
    int bad_count;
    if (it.key.size != 16 || (r->dry && kmap_at(&drops, it.key.data, 0) != SIZE_MAX) ||
        ctx_decode(&it.val, &cr, &bad_count) != KVDB_OK)
      continue;
    for (uint32_t b = 0; b < cr.n_blocks; b++) {
      uint64_t *c = kmap_slot(&cnt, cr.blocks + 16 * b);
      if (c == NULL) {
        rc = kv_fail(KVDB_NOMEM, "repair maps");
        goto out;
      }
      (*c)++;
    }
  }
  kv_cat_iter_close(&it);
  /* each block against its count */
  if ((rc = kv_cat_iter_open(&db->cat, t, KV_TBL_BLOCKS, &it, "repair: blocks")) != KVDB_OK)
    goto out;
  while (kv_cat_iter_next(&it)) {
    if (it.key.size != 16)
      continue;
    kv_cat_bytes rv = it.val;
    size_t slot = r->dry ? kmap_at(&v->refs, it.key.data, 0) : SIZE_MAX;
    if (slot != SIZE_MAX && v->refs.idx[slot] != 0 && v->pb[v->refs.idx[slot] - 1].nw != NULL) {
      rv.data = v->pb[v->refs.idx[slot] - 1].nw;
      rv.size = v->pb[v->refs.idx[slot] - 1].nw_len;
    }
    kv_block_rec br;
    int have = kv_block_rec_decode(rv.data, rv.size, &br) == KVDB_OK;
    size_t ci = kmap_at(&cnt, it.key.data, 0);
    uint64_t c = ci == SIZE_MAX ? 0 : cnt.val[ci];
    bfix f;
    memset(&f, 0, sizeof f);
    memcpy(f.hash, it.key.data, 16);
    if (c == 0) {
      f.del = 1;
      if (rv.size >= 72) {
        memcpy(f.parent, rv.data + 40, 16);
        f.has_parent = 1;
      }
    } else if (!have) {
      r->rep->skipped++; /* listed, yet neither rebuilt nor dropped: changed meanwhile */
      continue;
    } else {
      uint8_t segkey[16] = {0};
      kv_put_le64(segkey, br.segment);
      size_t li = kmap_at(&live, segkey, 1);
      if (li != SIZE_MAX) {
        live.val[li] += br.bytes;
        live.idx[li]++; /* live blocks */
      }
      if (br.refcount == c)
        continue;
      f.refcount = (uint32_t)c;
    }
    if (kv_grow((void **)&fx, n_fx, &cap_fx, sizeof *fx, 64) != 0) {
      rc = kv_fail(KVDB_NOMEM, "repair list");
      goto out;
    }
    fx[n_fx++] = f;
  }
  kv_cat_iter_close(&it);
  for (size_t i = 0; i < n_fx && rc == KVDB_OK; i++) {
    bfix *f = &fx[i];
    if (f->del) {
      action(r, "remove block %s: no context lists it", kv_hex16(f->hash, hx));
      r->rep->blocks_dropped++;
      if (r->dry)
        continue;
      if ((rc = kv_cat_del_block(&db->cat, t, f->hash)) != KVDB_OK)
        break;
      /* its index entries: the indexes are rebuilt after the repair's changes */
      if (db->dram != NULL)
        kv_dram_remove(db->dram, f->hash);
      continue;
    }
    action(r, "set the refcount of block %s to %u", kv_hex16(f->hash, hx), f->refcount);
    r->rep->refcounts_fixed++;
    if (r->dry)
      continue;
    kv_cat_bytes val;
    if ((rc = kv_cat_get_raw(&db->cat, t, KV_TBL_BLOCKS, f->hash, 16, &val)) != KVDB_OK)
      break;
    uint8_t *nb = dup_bytes(val.data, val.size);
    if (nb == NULL) {
      rc = kv_fail(KVDB_NOMEM, "repair: block record");
      break;
    }
    kv_put_le32(nb + 4, f->refcount);
    rc = kv_cat_put_raw(&db->cat, t, KV_TBL_BLOCKS, f->hash, 16, nb, val.size,
                        "repair: put block");
    free(nb);
  }
  if (rc != KVDB_OK)
    goto out;
  /* each segment against its blocks */
  n_fx = 0;
  if ((rc = kv_cat_iter_open(&db->cat, t, KV_TBL_SEGMENTS, &it, "repair: segments")) != KVDB_OK)
    goto out;
  typedef struct sfix {
    uint64_t id;
    kv_seg_rec sr;
  } sfix;
  sfix *sf = NULL;
  size_t n_sf = 0, cap_sf = 0;
  while (kv_cat_iter_next(&it)) {
    kv_seg_rec sr;
    uint64_t id;
    if (kv_cat_iter_seg(&it, &id, &sr) != KVDB_OK)
      continue;
    uint8_t segkey[16] = {0};
    kv_put_le64(segkey, id);
    size_t li = kmap_at(&live, segkey, 0);
    uint64_t lb = li == SIZE_MAX ? 0 : live.val[li], nb = li == SIZE_MAX ? 0 : live.idx[li];
    if ((sr.live_bytes == lb && sr.live_blocks == nb) || lb > sr.end)
      continue;
    if (kv_grow((void **)&sf, n_sf, &cap_sf, sizeof *sf, 16) != 0) {
      rc = kv_fail(KVDB_NOMEM, "repair list");
      break;
    }
    sf[n_sf].id = id;
    sf[n_sf].sr = sr;
    sf[n_sf].sr.live_bytes = lb;
    sf[n_sf].sr.live_blocks = nb;
    n_sf++;
  }
  kv_cat_iter_close(&it);
  for (size_t i = 0; i < n_sf && rc == KVDB_OK; i++) {
    action(r, "set the live bytes of segment %" PRIu64 " to %" PRIu64 " in %" PRIu64 " blocks",
           sf[i].id, sf[i].sr.live_bytes, sf[i].sr.live_blocks);
    r->rep->segments_fixed++;
    if (!r->dry)
      rc = kv_cat_put_seg(&db->cat, t, sf[i].id, &sf[i].sr);
  }
  free(sf);
out:
  kv_cat_iter_close(&it);
  free(fx);
  kmap_free(&cnt);
  kmap_free(&drops);
  kmap_free(&live);
  return rc;
}

/* Carry out (or, dry, say) the plan's record changes in txn t. */
static kvdb_status apply_plan(rctx *r, vctx *v, kv_txn *t)
{
  kvdb *db = r->db;
  char hx[33], ha[33];
  for (size_t i = 0; i < v->n_pb; i++) {
    pblk *p = &v->pb[i];
    size_t slot = kmap_at(&v->refs, p->hash, 0);
    char cn[48];
    const char *who = ctx_name(v, slot, cn);
    kv_block_rec nr;
    if (kv_block_rec_decode(p->nw, p->nw_len, &nr) != KVDB_OK)
      continue; /* not expected: rebuild_rec checked it */
    if (!r->dry && !unchanged(db, t, KV_TBL_BLOCKS, p->hash, p->old, p->old_len)) {
      r->rep->skipped++;
      continue;
    }
    action(r, "rebuild the record of block %s of %s from its object at offset %" PRIu64
           " of segment %" PRIu64, kv_hex16(p->hash, hx), who, nr.offset, nr.segment);
    r->rep->blocks_rebuilt++;
    if (r->dry)
      continue;
    KV_RET(kv_cat_put_raw(&db->cat, t, KV_TBL_BLOCKS, p->hash, 16, p->nw, p->nw_len,
                          "repair: put block"));
    if (db->dram != NULL)
      kv_dram_remove(db->dram, p->hash);
  }
  for (size_t i = 0; i < v->n_pc; i++) {
    pctx *p = &v->pc[i];
    if (!r->dry && !unchanged(db, t, KV_TBL_CONTEXTS, p->key, p->old, p->old_len)) {
      r->rep->skipped++;
      continue;
    }
    if (p->nw != NULL) {
      action(r, "set the token count of context %s to %" PRIu64 " (was %" PRIu64 ")",
             kv_hex16(p->key, hx), kv_get_le64(p->nw + 8), kv_get_le64(p->old + 8));
      r->rep->contexts_rebuilt++;
      if (r->dry)
        continue;
      KV_RET(kv_cat_put_raw(&db->cat, t, KV_TBL_CONTEXTS, p->key, 16, p->nw, p->nw_len,
                            "repair: put context"));
    } else {
      action(r, "drop context %s: %s", kv_hex16(p->key, ha), p->why);
      r->rep->contexts_dropped++;
      if (!r->dry)
        KV_RET(drop_ctx(db, t, p->key, p->old, p->old_len));
    }
  }
  return KVDB_OK;
}

kvdb_status kvdb_repair(kvdb *db, unsigned flags, kvdb_problem_fn on_action,
                        kvdb_progress_fn progress, void *ctx, kvdb_repair_report *report)
{
  KV_RET(kv_check_db(db));
  kvdb_repair_report tmp;
  if (report == NULL)
    report = &tmp;
  memset(report, 0, sizeof *report);
  if ((flags & ~(unsigned)KVDB_REPAIR_DRY_RUN) != 0)
    return kv_fail(KVDB_INVALID, "repair flags 0x%x: unknown bits 0x%x", flags,
                   flags & ~(unsigned)KVDB_REPAIR_DRY_RUN);
  int dry = (flags & KVDB_REPAIR_DRY_RUN) != 0;
  if (!dry && db->cat.rdonly)
    return kv_fail(KVDB_READONLY, "database '%s' is open read-only (repair needs a read-write "
                   "handle; KVDB_REPAIR_DRY_RUN works on either)", db->dir);
  kvdb_verify_report vr;
  memset(&vr, 0, sizeof vr);
  vctx v;
  memset(&v, 0, sizeof v);
  v.db = db;
  v.rep = &vr;
  v.plan = 1;
  rctx r = {db, on_action, ctx, report, dry};
  kvdb_status rc = run_passes(&v, progress, ctx);
  report->problems = vr.problems;
  if (rc == KVDB_OK && dry) {
    rc = apply_plan(&r, &v, v.txn);
    if (rc == KVDB_OK)
      rc = fix_counts(&r, &v, v.txn);
    if (rc == KVDB_OK && vr.problems > 0)
      action(&r, "rebuild the block indexes (segment index and lookup trie; %" PRIu64
             " disagreements found)", v.index_problems);
  } else if (rc == KVDB_OK) {
    kv_txn_abort(v.txn); /* the plan's snapshot; the write transaction re-checks */
    v.txn = NULL;
    kv_txn *t = NULL; /* (kv_txn_begin leaves it unset when it fails) */
    rc = kv_txn_begin(&db->cat, 1, &t);
    if (rc == KVDB_OK)
      rc = apply_plan(&r, &v, t);
    if (rc == KVDB_OK)
      rc = fix_counts(&r, &v, t);
    kv_counts k; /* stat's counters: counted anew as the repair leaves the catalog */
    if (rc == KVDB_OK && (rc = kv_counts_recount(&db->cat, t, &k)) == KVDB_OK)
      rc = kv_counts_put(&db->cat, t, &k);
    if (rc == KVDB_OK && vr.problems > 0) {
      /* block records changed or went, or the indexes disagreed: build both anew */
      action(&r, "rebuild the block indexes (segment index and lookup trie; %" PRIu64
             " disagreements found)", v.index_problems);
      rc = kv_idx_rebuild(&db->cat, t);
    }
    uint64_t gen = 0;
    if (rc == KVDB_OK && kv_cat_get_u64(&db->cat, t, "gen", &gen) == KVDB_OK)
      rc = kv_cat_put_u64(&db->cat, t, "gen", gen + 1); /* readers drop cached locations */
    if (rc == KVDB_OK)
      rc = kv_txn_commit(t);
    else
      kv_txn_abort(t); /* (NULL: no-op) */
    if (rc != KVDB_OK) { /* nothing of it was committed */
      memset(report, 0, sizeof *report);
      report->problems = vr.problems;
    }
  }
  vctx_free(&v);
  return rc;
}
