/* SPDX-License-Identifier: MIT */
/*
 * engine/seg/blockio.c — reading block objects back and proving they are what the catalog
 * says: the header's hash must be the block hash the caller looked up, its token count the
 * record's, and every checksum must hold. Any failure is KVDB_CORRUPT with a message naming
 * the segment, the offset and the block.
 */
#include <inttypes.h>
#include <stdlib.h>

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
      (hdr->version >= 2) != ((rec->bflags & KV_BLK_COMPRESSED) != 0) ||
      hdr->score_bits != kv_rec_score_bits(rec))
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
