/* SPDX-License-Identifier: MIT */
/*
 * engine/store/kv_score.h — score copies inside the engine: building a block's score region
 * at put (score_write.c) and kvdb_score (score_ctx.c). FORMAT.md §3c has the bytes;
 * format/score_region.h the geometry and checksums; engine/score/score.h the copies.
 *
 * A model whose fingerprint has score_bits 8 or 4 (kvdb_model.score_bits, part of h_{-1})
 * gets a score region appended to every block object it writes; the block record says so
 * (KV_BLK_SCORE8 / KV_BLK_SCORE4) and its `bytes` include the region. Readers of K and V
 * (get, get_tokens) stop at the end of the data region.
 */
#ifndef KV_SCORE_ENGINE_H
#define KV_SCORE_ENGINE_H

#include "device.h"
#include "kv_db.h"
#include "score_region.h"

/* Bytes of score copies kvdb_score reads from segment files before scoring them (a wave);
 * default 16 MiB. Tests lower it to make many waves; nothing else changes it. */
extern uint64_t kv_score_wave_bytes;

/* The block-record flags of a block written with score copies of `bits` (0: none). */
static inline uint32_t kv_score_rec_flags(unsigned bits)
{
  return bits == 8 ? KV_BLK_SCORE8 : bits == 4 ? KV_BLK_SCORE4 : 0;
}
/* The bits of a block record's score copies (0: none). */
static inline unsigned kv_rec_score_bits(const kv_block_rec *rec)
{
  return (rec->bflags & KV_BLK_SCORE8) ? 8 : (rec->bflags & KV_BLK_SCORE4) ? 4 : 0;
}

/* Bytes of the score region of a block of geometry g at `bits` (0 when bits is 0 or the shape
 * cannot be scored). */
uint64_t kv_score_region_bytes(const kv_block_geom *g, unsigned bits);
/* Bytes of a block record's object before its score region (what get reads at most). */
uint64_t kv_rec_body_bytes(const kv_block_geom *g, const kv_block_rec *rec);

/*
 * kv_score_copy_build() - write copy c (layer * n_kv_heads + head) of the region `region` from
 * the block's n_tokens K rows of that layer and head, row t at rows + t * stride (the model's
 * dtype). KVDB_INVALID names a non-finite key.
 */
kvdb_status kv_score_copy_build(const kv_block_geom *g, const kv_sregion *r, uint32_t c,
                                const uint8_t *rows, size_t stride, uint8_t *region);

/*
 * kv_score_region_build() - the whole region of the block whose tokens are [t0, t0 + n_tokens)
 * of the caller's view: every copy from the view's K rows, then the table (kv_sregion_seal).
 * `region` holds r->bytes. KVDB_INVALID (a non-finite key), KVDB_NOMEM.
 */
kvdb_status kv_score_region_build(const kv_block_geom *g, const kv_sregion *r,
                                  const kvdb_kv_view *kv, uint64_t t0, const uint8_t hash[16],
                                  uint8_t *region);

/*
 * kv_score_copy_from_section() - copy s / 2 (s even: a K section) from K section s of a raw
 * block object being built in `obj` (its rows read in place, still in cache; gathered from the
 * view at t0 when the section's groups are not back to back).
 */
kvdb_status kv_score_copy_from_section(const kv_block_geom *g, const kv_sregion *r, uint32_t s,
                                       const uint8_t *obj, const kvdb_kv_view *kv, uint64_t t0,
                                       uint8_t *region);

/*
 * kv_score_block_append() - for a model with score_bits: build the score region of a sealed
 * block object in `obj` (*obj_bytes long; room for kv_score_region_bytes() more) right after
 * it, from the view's K rows [t0, t0 + n_tokens), mark its header, and add the region to
 * *obj_bytes. A model without score_bits: nothing. KVDB_INVALID (a non-finite key), KVDB_NOMEM.
 */
kvdb_status kv_score_block_append(const kvdb_model *m, const kv_block_geom *g,
                                  const kvdb_kv_view *kv, uint64_t t0, const uint8_t hash[16],
                                  uint8_t *obj, uint64_t *obj_bytes);

/* Close the near-data devices kvdb_score keeps in the handle (kvdb_close). */
void kv_score_close(kvdb *db);

/* ---- the near-data device, shared by scoring (score_ctx.c) and the row fetch (fetch.c) ---- */

/* Options as the caller gave them (struct_size honoured), defaults for the rest, checked:
 * KVDB_INVALID names the field. */
kvdb_status kv_score_opts_get(const kvdb_score_opts *opts, kvdb_score_opts *o);
/* A kvdb_status and message for a failed fpga/ call (`what` first). */
kvdb_status kv_score_fpga_fail(kv_fpga_status st, const kv_fpga_err *err, const char *what);
/* Open segment file `seg` for the device's own reads (O_DIRECT where the file system allows). */
kvdb_status kv_score_open_direct(kvdb *db, uint64_t seg, int *fd);
/* A device of the kind o asks for (o->device NEAR_DATA or EMULATED, o->xclbin_path): the
 * handle's kept one if free, else a new one; give it back with kv_score_dev_release. */
kvdb_status kv_score_dev_acquire(kvdb *db, const kvdb_score_opts *o, kv_fpga_dev **dev,
                                 int *slot, int *kept);
void kv_score_dev_release(kvdb *db, const kvdb_score_opts *o, kv_fpga_dev *dev, int slot,
                          int kept);

/* Verify a whole block's score region (kvdb_verify, a whole-block read): buf holds the object
 * as read (rec->bytes), hdr its parsed header. KVDB_CORRUPT names segment, offset, block. */
kvdb_status kv_score_region_check(const kv_block_rec *rec, const uint8_t hash[16],
                                  const kv_block_hdr *hdr, const uint8_t *buf);

#endif
