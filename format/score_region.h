/* SPDX-License-Identifier: MIT */
/*
 * format/score_region.h — the score region of a block object: the low-precision copies of its
 * keys that near-data scoring reads instead of the keys (FORMAT.md §3c; HillInfer §4.4 "CEC":
 * raw q·K on INT8/INT4 keys; InstInfer §IV-C: page-grouped so that a copy is read page by page).
 *
 * A block stored under a model fingerprint with score_bits 8 or 4 ends with this region, after
 * its data region (raw or compressed); the fixed header says so (flag bit 0, the bits at byte
 * 78, the region's offset at byte 112). Nothing else of the block refers to it: kvdb_get and
 * kvdb_get_tokens never read it.
 *
 *   region = [table: table_pages pages] [copy 0] [copy 1] ... [copy n_copies - 1]
 *   copy c = layer * n_kv_heads + head: the score copy (score/score.h "THE SCORE COPY":
 *            header, per-token scales, page-grouped int8 / int4 code pages) of that layer and
 *            KV head's K rows, n_tokens of them; every copy is copy_bytes long (a multiple of
 *            4096), so copy c starts at table_pages * 4096 + c * copy_bytes.
 *   table  = 64-byte head, then one XXH3-64 per copy (8 bytes each), zero padding to a page:
 *     OFF SIZE FIELD
 *       0   4  magic 0x9E3C51A7 (bytes A7 51 3C 9E)
 *       4   1  version 1
 *       5   1  bits (8 or 4; equals the block header's)
 *       6   2  reserved (0)
 *       8   4  n_copies (n_layers * n_kv_heads)
 *      12   4  copy_pages (copy_bytes / 4096)
 *      16   4  table_pages
 *      20   4  reserved (0)
 *      24   8  table checksum: XXH3-64, seeded, of the n_copies copy checksums
 *      32  32  reserved (0)
 *      64  8n  copy checksums: XXH3-64 of copy c's copy_bytes, seed le64(block_hash[0..8)) XOR
 *              (0xfffffffe << 32 | c) — bound to its block and its place, apart from the
 *              seeds of format 1 (section, group) and format 2 (0xffffffff, page)
 *   Every head field must equal what the block's shape gives, so the head needs no checksum
 *   of its own. A reader of one copy reads the table page holding its checksum and the copy's
 *   pages, and verifies the copy (a whole copy is always read: scoring needs all its tokens).
 *
 * Pure functions: no I/O, no allocation.
 */
#ifndef KV_SCORE_REGION_H
#define KV_SCORE_REGION_H

#include <stdint.h>

#include "block.h"
#include "score.h"

#define KV_SREGION_MAGIC 0x9E3C51A7u
#define KV_SREGION_VERSION 1u
#define KV_SREGION_HEAD_BYTES 64u

/* Geometry of the score region of one block (derived from the block's shape and the bits). */
typedef struct kv_sregion {
  uint32_t bits;          /* 8 or 4 */
  uint32_t n_copies;      /* n_layers * n_kv_heads */
  uint32_t copy_pages;    /* pages of one copy */
  uint32_t table_pages;   /* pages of the table (head + checksums) */
  uint64_t copy_bytes;    /* bytes of one copy */
  uint64_t bytes;         /* bytes of the region */
  kv_score_layout layout; /* of each copy: n_tokens x head_dim at `bits` */
} kv_sregion;

/* kv_sregion_init() - the region of a block of geometry g with copies at `bits`. KVDB_INVALID
 * when bits is not 8 or 4 or the shape cannot be scored (int4 needs an even head_dim). */
kvdb_status kv_sregion_init(kv_sregion *r, const kv_block_geom *g, unsigned bits);

/* Offset of copy c from the region's start. */
static inline uint64_t kv_sregion_copy_off(const kv_sregion *r, uint32_t c)
{
  return (uint64_t)r->table_pages * KV_PAGE + (uint64_t)c * r->copy_bytes;
}
/* Offset of copy c's checksum from the region's start (in table page off / 4096). */
static inline uint32_t kv_sregion_cksum_off(uint32_t c)
{
  return KV_SREGION_HEAD_BYTES + 8u * c;
}

/* XXH3-64 of one copy with its seed (block hash, copy index). */
uint64_t kv_sregion_copy_checksum(const uint8_t block_hash[16], uint32_t c, const uint8_t *copy,
                                  uint64_t len);

/*
 * kv_sregion_seal() - finish a region in `region` (r->bytes) whose copies are in place: writes
 * the table (head, every copy's checksum, the table checksum, zero padding).
 */
void kv_sregion_seal(const kv_sregion *r, const uint8_t block_hash[16], uint8_t *region);

/*
 * kv_sregion_check_head() - the head fields of the table at `table` (its first page) against r.
 * KVDB_CORRUPT naming the field.
 */
kvdb_status kv_sregion_check_head(const kv_sregion *r, const uint8_t *table);

/*
 * kv_sregion_verify_copy() - copy c, at `copy` (r->copy_bytes), against its checksum in the
 * table at `region` (only the page holding that checksum needs to be present), then parse it
 * (score.h) into *view (pointers into `copy`) and check its shape against r. KVDB_CORRUPT names
 * what failed; *bad_off (may be NULL) receives the failing bytes' offset from the region start.
 */
kvdb_status kv_sregion_verify_copy(const kv_sregion *r, const uint8_t block_hash[16],
                                   const uint8_t *region, uint32_t c, const uint8_t *copy,
                                   kv_score_view *view, uint64_t *bad_off);

/* kv_sregion_verify() - the whole region in `region` (r->bytes): head, table checksum, every
 * copy. KVDB_CORRUPT sets *bad_off (may be NULL). */
kvdb_status kv_sregion_verify(const kv_sregion *r, const uint8_t block_hash[16],
                              const uint8_t *region, uint64_t *bad_off);

#endif
