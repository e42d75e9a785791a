/* SPDX-License-Identifier: MIT */
/*
 * engine/block/score_write.c — a block's score region at put time (cblock.h, FORMAT.md §3c):
 * one score copy per (layer, KV head) of the block's K rows, quantized to int8 or int4 with one
 * scale per token (score/score.h; version 1, or version 2: centered and rotated first), then
 * the table of their checksums.
 *
 * The copies are made from the keys the caller put, whatever config the block's K and V are
 * stored with, so a lossy config does not also degrade the ranking.
 */
#include <inttypes.h>
#include <stdlib.h>

#include "cblock.h"

uint64_t kv_score_region_bytes(const kv_block_geom *g, unsigned bits, unsigned variant)
{
  kv_sregion r;
  if (bits == 0 || kv_sregion_init(&r, g, bits, variant) != KVDB_OK)
    return 0;
  return r.bytes;
}

uint64_t kv_rec_body_bytes(const kv_block_geom *g, const kv_block_rec *rec)
{
  uint64_t s = kv_score_region_bytes(g, kv_rec_score_bits(rec), kv_rec_score_variant(rec));
  return rec->bytes > s ? rec->bytes - s : rec->bytes;
}

kvdb_status kv_score_copy_build(const kv_block_geom *g, const kv_sregion *r, uint32_t c,
                                const uint8_t *rows, size_t stride, uint8_t *region)
{
  kv_score_err e;
  size_t len = 0;
  kv_score_status st =
      kv_score_copy_encode_v((kv_score_dtype)g->dtype, rows, stride, g->n_tokens, g->head_dim,
                             r->bits, r->variant, region + kv_sregion_copy_off(r, c),
                             (size_t)r->copy_bytes, &len, &e);
  if (st == KV_SCORE_OK && len == r->copy_bytes)
    return KVDB_OK;
  char msg[160];
  kv_score_errmsg(&e, msg, sizeof msg);
  if (st == KV_SCORE_EINVAL)
    return kv_fail(KVDB_INVALID, "kv: the keys of layer %u, KV head %u cannot be scored: %s",
                   c / g->n_kv_heads, c % g->n_kv_heads, msg);
  return kv_fail(KVDB_PANIC, "score copy %u: %s (%zu of %" PRIu64 " bytes)", c, msg, len,
                 r->copy_bytes);
}

kvdb_status kv_score_region_build(const kv_block_geom *g, const kv_sregion *r,
                                  const kvdb_kv_view *kv, uint64_t t0, const uint8_t hash[16],
                                  uint8_t *region)
{
  uint8_t *rows = malloc((size_t)g->n_tokens * g->row_bytes);
  if (rows == NULL)
    return kv_fail(KVDB_NOMEM, "score copy rows");
  kvdb_status rc = KVDB_OK;
  for (uint32_t c = 0; c < r->n_copies && rc == KVDB_OK; c++) {
    kv_gather_head(kv, g->elem_bytes, g->head_dim, c / g->n_kv_heads, c % g->n_kv_heads, 0, t0,
                   g->n_tokens, rows);
    rc = kv_score_copy_build(g, r, c, rows, g->row_bytes, region);
  }
  free(rows);
  if (rc == KVDB_OK)
    kv_sregion_seal(r, hash, region);
  return rc;
}

kvdb_status kv_score_copy_from_section(const kv_block_geom *g, const kv_sregion *r, uint32_t s,
                                       const uint8_t *obj, const kvdb_kv_view *kv, uint64_t t0,
                                       uint8_t *region)
{
  if (g->n_groups == 1 || g->group_stride == (uint64_t)g->group_tokens * g->row_bytes)
    return kv_score_copy_build(g, r, s / 2, obj + kv_block_group_off(g, s, 0), g->row_bytes,
                               region);
  uint8_t *rows = malloc((size_t)g->n_tokens * g->row_bytes);
  if (rows == NULL)
    return kv_fail(KVDB_NOMEM, "score copy rows");
  uint32_t c = s / 2;
  kv_gather_head(kv, g->elem_bytes, g->head_dim, c / g->n_kv_heads, c % g->n_kv_heads, 0, t0,
                 g->n_tokens, rows);
  kvdb_status rc = kv_score_copy_build(g, r, c, rows, g->row_bytes, region);
  free(rows);
  return rc;
}

kvdb_status kv_score_block_append(const kvdb_model *m, unsigned variant, const kv_block_geom *g,
                                  const kvdb_kv_view *kv, uint64_t t0, const uint8_t hash[16],
                                  uint8_t *obj, uint64_t *obj_bytes)
{
  if (m->score_bits == 0)
    return KVDB_OK;
  kv_sregion r;
  KV_RET(kv_sregion_init(&r, g, m->score_bits, variant));
  KV_RET(kv_score_region_build(g, &r, kv, t0, hash, obj + *obj_bytes));
  kv_block_mark_score(obj, m->score_bits, variant, *obj_bytes);
  *obj_bytes += r.bytes;
  return KVDB_OK;
}

kvdb_status kv_score_region_check(const kv_block_rec *rec, const uint8_t hash[16],
                                  const kv_block_hdr *hdr, const uint8_t *buf)
{
  if (hdr->score_bits == 0)
    return KVDB_OK;
  kv_sregion r;
  uint64_t bad = 0;
  kvdb_status rc = kv_sregion_init(&r, &hdr->g, hdr->score_bits, hdr->score_variant);
  if (rc == KVDB_OK)
    rc = kv_sregion_verify(&r, hash, buf + hdr->score_off, &bad);
  if (rc == KVDB_OK)
    return KVDB_OK;
  char hx[33];
  return kv_fail(KVDB_CORRUPT,
                 "score region of block %s in segment %" PRIu64 " at offset %" PRIu64 ": %s",
                 kv_hex16(hash, hx), rec->segment, rec->offset + hdr->score_off + bad,
                 kvdb_errmsg());
}
