/* SPDX-License-Identifier: MIT */
/*
 * engine/seg/blockio.c — reading block objects back and proving they are what the catalog
 * says: the header's hash must be the block hash the caller looked up, its token count the
 * record's, and every checksum must hold. Any failure is KVDB_CORRUPT with a message naming
 * the segment, the offset and the block. Also the reads of get_tokens on a compressed block
 * (kv_block_read_tokens): only the pages it needs, each verified, then the groups decoded.
 */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "seg.h"

kvdb_status kv_block_check_meta(const kv_block_rec *rec, const uint8_t hash[16],
                                const uint8_t *buf, kv_block_hdr *hdr)
{
  char hx[33];
  kvdb_status rc = kv_block_parse_header(buf, rec->bytes, hdr);
  if (rc != KVDB_OK)
    return kv_fail(rc, "block %s in segment %" PRIu64 " at offset %" PRIu64 ": %s",
                   kv_hex16(hash, hx), rec->segment, rec->offset, kvdb_errmsg());
  if (memcmp(hdr->block_hash, hash, 16) != 0 || hdr->g.n_tokens != rec->n_tokens ||
      hdr->obj.total_bytes != rec->bytes ||
      (KV_HDR_CPR(hdr)) != ((rec->bflags & KV_BLK_COMPRESSED) != 0) ||
      KV_HDR_PACKED(hdr) != ((rec->bflags & KV_BLK_PACKED) != 0) ||
      hdr->score_bits != kv_rec_score_bits(rec) ||
      hdr->score_variant != kv_rec_score_variant(rec))
    return kv_fail(KVDB_CORRUPT,
                   "block %s in segment %" PRIu64 " at offset %" PRIu64
                   ": the object there is another block (stale location)",
                   kv_hex16(hash, hx), rec->segment, rec->offset);
  rc = kv_block_verify_meta(hdr, buf);
  if (rc != KVDB_OK)
    return kv_fail(rc, "block %s in segment %" PRIu64 " at offset %" PRIu64 ": %s",
                   kv_hex16(hash, hx), rec->segment, rec->offset, kvdb_errmsg());
  return KVDB_OK;
}

kvdb_status kv_block_check_sections(const kv_block_rec *rec, const uint8_t hash[16],
                                    const kv_block_hdr *hdr, const uint8_t *buf, uint32_t s0,
                                    uint32_t s1)
{
  uint32_t bad_s = 0;
  uint64_t bad_off = 0;
  if (kv_block_verify_sections(hdr, buf, s0, s1, &bad_s, &bad_off) == KVDB_OK)
    return KVDB_OK;
  char hx[33];
  return kv_fail(KVDB_CORRUPT,
                 "checksum mismatch in segment %" PRIu64 " at offset %" PRIu64
                 " (block %s, section %u)",
                 rec->segment, rec->offset + bad_off, kv_hex16(hash, hx), bad_s);
}

kvdb_status kv_block_check(const kv_block_rec *rec, const uint8_t hash[16], const uint8_t *buf,
                           kv_block_hdr *hdr)
{
  KV_RET(kv_block_check_meta(rec, hash, buf, hdr));
  KV_RET(kv_block_check_sections(rec, hash, hdr, buf, 0, hdr->g.n_sections));
  return kv_score_region_check(rec, hash, hdr, buf);
}

/* ---- read buffers, reused across calls ---- */

/* Idle read buffers a handle keeps (each as big as the biggest block read so far). */
#define KV_RBUF_IDLE_MAX 4

kv_rbuf *kv_rbuf_acquire(kvdb *db, size_t bytes)
{
  pthread_mutex_lock(&db->mu);
  kv_rbuf **pp = &db->idle_rbufs;
  while (*pp != NULL && (*pp)->cap < bytes)
    pp = &(*pp)->next;
  kv_rbuf *b = *pp;
  if (b == NULL && db->idle_rbufs != NULL) { /* none big enough: grow the first */
    pp = &db->idle_rbufs;
    b = *pp;
  }
  if (b != NULL) {
    *pp = b->next;
    db->n_idle_rbufs--;
  }
  pthread_mutex_unlock(&db->mu);
  if (b != NULL && b->cap >= bytes)
    return b;
  if (b == NULL) {
    b = calloc(1, sizeof *b);
    if (b == NULL)
      return NULL;
  }
  kv_free_aligned(b->p);
  b->cap = KV_ALIGN_UP(bytes, (size_t)1 << 20);
  b->p = kv_alloc_aligned(b->cap);
  if (b->p == NULL) {
    free(b);
    return NULL;
  }
  return b;
}

void kv_rbuf_release(kvdb *db, kv_rbuf *b)
{
  if (b == NULL)
    return;
  pthread_mutex_lock(&db->mu);
  if (db->n_idle_rbufs < KV_RBUF_IDLE_MAX) {
    b->next = db->idle_rbufs;
    db->idle_rbufs = b;
    db->n_idle_rbufs++;
    b = NULL;
  }
  pthread_mutex_unlock(&db->mu);
  if (b != NULL) {
    kv_free_aligned(b->p);
    free(b);
  }
}

void kv_rbufs_free(kvdb *db)
{
  while (db->idle_rbufs != NULL) {
    kv_rbuf *b = db->idle_rbufs;
    db->idle_rbufs = b->next;
    kv_free_aligned(b->p);
    free(b);
  }
  db->n_idle_rbufs = 0;
}

kvdb_status kv_block_read_verify(kvdb *db, const kv_block_rec *rec, const uint8_t hash[16],
                                 uint8_t *buf, kv_block_hdr *hdr)
{
  kv_segfile *sf;
  KV_RET(kv_segfile_get(db, rec->segment, &sf));
  int rc = db->io->ops->pread(db->io, sf->f, buf, rec->bytes, rec->offset);
  kv_segfile_put(db, sf);
  if (rc != 0) /* a missing or short file is KVDB_CORRUPT, naming it */
    return kv_seg_read_fail(db, -rc, rec->segment, rec->offset, rec->bytes, hash);
  return kv_block_check(rec, hash, buf, hdr);
}

/* ---- positions of one layer of a compressed block (kvdb_get_tokens) ---- */

/*
 * kv_block_read_tokens: get_tokens on a compressed block: the header and meta region (section table, page
 * checksums), then the pages of the layer's section headers, then only the pages of the token
 * groups that hold the positions; every page read is verified, then just those groups are
 * decoded. Three rounds of reads (usually: the first 64 KiB hold the meta region).
 */
typedef struct cpages {
  kvdb *db;
  const kv_block_rec *rec;
  const kv_block_hdr *hdr;
  kv_segfile *sf;
  uint8_t *buf;       /* the object's bytes at their offsets */
  uint8_t *have;      /* per data page: 0 absent, 1 wanted, 2 read and verified */
  uint64_t bytes;     /* read */
} cpages;

static void want(cpages *cp, uint64_t off, uint64_t len)
{
  uint64_t m = cp->hdr->cl.meta_bytes;
  uint64_t p0 = (off - m) / KV_PAGE, p1 = (off + len - m + KV_PAGE - 1) / KV_PAGE;
  for (uint64_t p = p0; p < p1 && p < cp->hdr->cl.data_pages; p++)
    if (cp->have[p] == 0)
      cp->have[p] = 1;
}

/* Read every wanted page (runs merged, one batch) and verify each. */
static kvdb_status fetch_pages(cpages *cp, const uint8_t *hash)
{
  const kv_cblock_layout *l = &cp->hdr->cl;
  kv_batch *bat = kv_batch_begin(cp->db->io);
  if (bat == NULL)
    return kv_fail(KVDB_NOMEM, "get_tokens batch");
  for (uint32_t p = 0; p < l->data_pages;) {
    if (cp->have[p] != 1) {
      p++;
      continue;
    }
    uint32_t q = p;
    while (q < l->data_pages && cp->have[q] == 1)
      q++;
    uint64_t off = l->meta_bytes + (uint64_t)p * KV_PAGE;
    uint64_t len = (uint64_t)(q - 1 - p) * KV_PAGE + kv_cblock_page_len(l, q - 1);
    kv_batch_read(cp->db->io, bat, cp->sf->f, cp->buf + off, len, cp->rec->offset + off);
    cp->bytes += len;
    p = q;
  }
  int e = kv_batch_wait(cp->db->io, bat);
  kv_batch_end(cp->db->io, bat);
  char hx[33];
  if (e != 0)
    return kv_seg_read_fail(cp->db, -e, cp->rec->segment, cp->rec->offset, cp->rec->bytes, hash);
  for (uint32_t p = 0; p < l->data_pages; p++) {
    if (cp->have[p] != 1)
      continue;
    uint64_t bad = 0;
    if (kv_cblock_verify_pages(cp->hdr, cp->buf, p, p + 1, &bad) != KVDB_OK)
      return kv_fail(KVDB_CORRUPT,
                     "checksum mismatch in segment %" PRIu64 " at offset %" PRIu64 " (block %s)",
                     cp->rec->segment, cp->rec->offset + bad, kv_hex16(hash, hx));
    cp->have[p] = 2;
  }
  return KVDB_OK;
}

kvdb_status kv_block_read_tokens(kvdb *db, const kv_block_rec *rec, const uint8_t *hash,
                                 const kv_block_geom *g, uint32_t layer,
                                 const uint32_t *positions, size_t n_pos, uint64_t pos0,
                                 const kvdb_kv_view *out)
{
  char hx[33];
  kv_rbuf *rb = kv_rbuf_acquire(db, rec->bytes + 2 * KV_PAGE);
  kv_segfile *sf = NULL;
  kv_block_hdr hdr;
  cpages cp = {.db = db, .rec = rec, .hdr = &hdr};
  kv_cdec dec;
  memset(&dec, 0, sizeof dec);
  uint32_t *rows_of = malloc(n_pos * sizeof *rows_of);
  kvdb_status rc = KVDB_OK;
  if (rb == NULL || rows_of == NULL) {
    rc = kv_fail(KVDB_NOMEM, "get_tokens buffers");
    goto out;
  }
  /* a packed object (FORMAT.md §3f) lies at a 64-byte offset: the buffer holds the pages from
   * the one it starts in and the object starts `lead` bytes in, so that the first read is of
   * whole pages (later ones of its pages bounce: io_os) */
  uint64_t lead = kv_rec_lead(rec);
  cp.buf = rb->p + lead;
  KV_ERR(kv_segfile_get(db, rec->segment, &sf));
  cp.sf = sf;
  /* 1. the header and the meta region (64 KiB at once: the meta of most blocks; a packed
   * object's covering pages up to there, so that a small one arrives whole) */
  uint64_t body = kv_rec_body_bytes(g, rec); /* not its score region */
  uint64_t first = body < (64u << 10) ? body : (64u << 10);
  uint64_t span = kv_rec_packed(rec) ? KV_ALIGN_UP(lead + first, KV_PAGE) : first;
  int e = db->io->ops->pread(db->io, sf->f, rb->p, span, rec->offset - lead);
  if (e != 0) {
    rc = kv_seg_read_fail(db, -e, rec->segment, rec->offset, rec->bytes, hash);
    goto out;
  }
  cp.bytes += span;
  first = span - lead; /* the object's bytes that arrived (a packed one: to its page's end) */
  rc = kv_block_parse_header(cp.buf, first, &hdr);
  if (rc == KVDB_OK && hdr.obj.meta_bytes > first) {
    e = db->io->ops->pread(db->io, sf->f, cp.buf + first, hdr.obj.meta_bytes - first,
                           rec->offset + first);
    cp.bytes += hdr.obj.meta_bytes - first;
    if (e != 0) {
      rc = kv_seg_read_fail(db, -e, rec->segment, rec->offset, rec->bytes, hash);
      goto out;
    }
  }
  if (rc == KVDB_OK)
    rc = kv_block_check_meta(rec, hash, cp.buf, &hdr);
  if (rc != KVDB_OK)
    goto out;
  cp.have = calloc(hdr.cl.data_pages, 1);
  if (cp.have == NULL) {
    rc = kv_fail(KVDB_NOMEM, "get_tokens page map");
    goto out;
  }
  /* data pages that came with the meta region: verified here, not read again */
  for (uint32_t p = 0; p < hdr.cl.data_pages; p++) {
    if (hdr.cl.meta_bytes + (uint64_t)p * KV_PAGE + kv_cblock_page_len(&hdr.cl, p) > first)
      break;
    uint64_t bad = 0;
    if (kv_cblock_verify_pages(&hdr, cp.buf, p, p + 1, &bad) != KVDB_OK) {
      rc = kv_fail(KVDB_CORRUPT,
                   "checksum mismatch in segment %" PRIu64 " at offset %" PRIu64 " (block %s)",
                   rec->segment, rec->offset + bad, kv_hex16(hash, hx));
      goto out;
    }
    cp.have[p] = 2;
  }
  uint32_t s0 = layer * g->n_kv_heads * 2, s1 = s0 + g->n_kv_heads * 2;
  if (KV_HDR_FRAMES(&hdr)) {
    /* lossless frames (format 3): the pages of the frames holding the layer's sections, each
     * frame decoded once (kv_cblock_frame_rows keeps the last one), the wanted rows copied */
    for (uint32_t s = s0; s < s1; s++) {
      uint64_t off;
      uint32_t len;
      kv_cblock_section(&hdr, cp.buf, s, &off, &len);
      want(&cp, off, len);
    }
    KV_ERR(fetch_pages(&cp, hash));
    KV_ERR(kv_cdec_init(&dec));
    for (uint32_t s = s0; s < s1; s++) {
      const uint8_t *rows;
      KV_ERR(kv_cblock_frame_rows(&hdr, cp.buf, s, &dec, &rows));
      for (size_t i = 0; i < n_pos; i++)
        if (positions[i] >= pos0 && positions[i] < pos0 + g->n_tokens)
          kv_put_row(g, s, rows + (size_t)(positions[i] - pos0) * g->row_bytes, out, i);
    }
    goto out;
  }
  /* 2. the section headers (their first page each; more if a header is longer) */
  for (uint32_t s = s0; s < s1; s++) {
    uint64_t off;
    uint32_t len;
    kv_cblock_section(&hdr, cp.buf, s, &off, &len);
    want(&cp, off, len < KV_SECTION_FIXED_BYTES + 4096 ? len : KV_SECTION_FIXED_BYTES + 4096);
  }
  KV_ERR(fetch_pages(&cp, hash));
  KV_ERR(kv_cdec_init(&dec));
  for (int round = 0; round < 2; round++) { /* round 0: plan and fetch; round 1: decode */
    for (uint32_t s = s0; s < s1; s++) {
      uint64_t off;
      uint32_t len;
      kv_cblock_section(&hdr, cp.buf, s, &off, &len);
      const uint8_t *sec = cp.buf + off;
      size_t hbytes;
      kv_codec_err err;
      size_t avail = len < KV_SECTION_FIXED_BYTES + 4096 ? len : KV_SECTION_FIXED_BYTES + 4096;
      kv_codec_status st = kv_section_header_bytes(sec, avail, &hbytes, &err);
      if (st != KV_CODEC_OK) {
        rc = kv_codec_fail(st, &err, "section header");
        goto out;
      }
      if (hbytes > avail) { /* a long header (a big keep bitmap or group table) */
        if (hbytes > len) {
          rc = kv_fail(KVDB_CORRUPT, "section %u header of %zu bytes is longer than it", s, hbytes);
          goto out;
        }
        want(&cp, off, hbytes);
        KV_ERR(fetch_pages(&cp, hash));
      }
      kv_section_info info;
      KV_ERR(kv_cblock_section_info(&hdr, sec, hbytes, s,
                                    kv_cblock_codec(&hdr, cp.buf, s), &info));
      uint32_t G = info.params.page_tokens;
      for (size_t i = 0; i < n_pos; i++) {
        rows_of[i] = KV_SECTION_DROPPED;
        if (positions[i] < pos0 || positions[i] >= pos0 + g->n_tokens)
          continue;
        st = kv_section_row_of_token(sec, hbytes, (uint32_t)(positions[i] - pos0), &rows_of[i],
                                     &err);
        if (st != KV_CODEC_OK) {
          rc = kv_codec_fail(st, &err, "section header");
          goto out;
        }
        if (rows_of[i] == KV_SECTION_DROPPED) {
          rc = kv_fail(KVDB_NOTFOUND, "position %u was dropped by KV head %u of layer %u "
                                      "(block %s keeps %u of %u tokens)",
                       positions[i], (s >> 1) % g->n_kv_heads, layer, kv_hex16(hash, hx),
                       info.n_rows, g->n_tokens);
          goto out;
        }
      }
      /* each group holding a wanted row, on its own (groups are independently decodable) */
      for (uint32_t grp = 0; grp < info.n_groups; grp++) {
        int needed = 0;
        for (size_t i = 0; i < n_pos && !needed; i++)
          needed = rows_of[i] != KV_SECTION_DROPPED && rows_of[i] / G == grp;
        if (!needed)
          continue;
        uint64_t goff, glen;
        st = kv_section_group_span(sec, hbytes, grp, grp + 1, &goff, &glen, &err);
        if (st != KV_CODEC_OK || goff + glen > len) {
          rc = st != KV_CODEC_OK ? kv_codec_fail(st, &err, "group span")
                                 : kv_fail(KVDB_CORRUPT, "section %u group %u lies past it", s, grp);
          goto out;
        }
        if (round == 0) {
          want(&cp, off + goff, glen);
          continue;
        }
        size_t rb_bytes = kv_section_rows_bytes(&info, grp, grp + 1);
        size_t sc = kv_section_scratch_bytes(&info);
        if (rb_bytes > dec.rows_cap || sc > dec.scratch_cap) {
          free(dec.rows);
          free(dec.scratch);
          dec.rows = malloc(rb_bytes);
          dec.scratch = malloc(sc ? sc : 1);
          dec.rows_cap = dec.rows ? rb_bytes : 0;
          dec.scratch_cap = dec.scratch ? (sc ? sc : 1) : 0;
          if (dec.rows == NULL || dec.scratch == NULL) {
            rc = kv_fail(KVDB_NOMEM, "get_tokens decoding buffers");
            goto out;
          }
        }
        st = kv_section_decode_groups_dctx(dec.ctx, sec, hbytes, sec + goff, glen, grp, grp + 1,
                                           dec.scratch, dec.scratch_cap, dec.rows, dec.rows_cap,
                                           &err);
        if (st != KV_CODEC_OK) {
          rc = kv_codec_fail(st, &err, "decoding a group");
          goto out;
        }
        for (size_t i = 0; i < n_pos; i++)
          if (rows_of[i] != KV_SECTION_DROPPED && rows_of[i] / G == grp)
            kv_put_row(g, s, dec.rows + (size_t)(rows_of[i] - grp * G) * g->row_bytes, out, i);
      }
    }
    if (round == 0)
      KV_ERR(fetch_pages(&cp, hash));
  }
out:
  if (rc == KVDB_CORRUPT)
    db->corrupt_blocks++;
  db->bytes_read += cp.bytes;
  kv_cdec_free(&dec);
  free(cp.have);
  free(rows_of);
  kv_segfile_put(db, sf);
  kv_rbuf_release(db, rb);
  return rc;
}

