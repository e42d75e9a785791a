/* SPDX-License-Identifier: MIT */
/*
 * format/block.h — the on-disk block object: geometry, header, checksums. FORMAT.md §3.
 *
 * A block object holds the KV of up to block_tokens consecutive tokens for all layers, KV
 * heads, K and V. It is a meta region (fixed 128-byte header, the tokens, the section table,
 * the group checksum table; padded to 4 KiB) followed by the data region: sections ordered
 * layer -> KV head -> K,V (section s = (layer * n_kv_heads + head) * 2 + kv). Inside a section
 * tokens are row-major (token, dim) and grouped so that one group of G tokens fills one 4 KiB
 * page (G = 4096 / row_bytes, 16 tokens for head_dim 128 fp16 — InstInfer §IV-C); groups
 * start on page boundaries, so a subset of tokens is read page by page ("dual-step loading").
 * A section smaller than one page is "packed": one group, 64-byte aligned.
 *
 * Every group has an XXH3-64 checksum (seeded with the block hash and the group's index, so a
 * page written to the wrong place is caught); each section-table entry carries XXH3-64 of its
 * groups' checksums; the header has its own checksum and one over tokens + section table.
 *
 * Pure functions: no I/O, no allocation. Every decoder validates every field and bound.
 */
#ifndef KV_BLOCK_H
#define KV_BLOCK_H

#include <stdint.h>

#include "kv_common.h"
#include "score.h"

#define KV_BLOCK_MAGIC 0xB10CDB4Bu /* bytes 4B DB 0C B1: not ASCII, no trivial pattern */
#define KV_BLOCK_VERSION 1u      /* raw, page-grouped sections */
#define KV_BLOCK_VERSION_MAX 5u  /* 2: compressed sections (codec KV_CODEC_SECTIONS);
                                    3: lossless frames (codec KV_CODEC_FRAMES);
                                    4: packed raw (codec KV_CODEC_RAW), FORMAT.md §3e;
                                    5: packed compressed (codec KV_CODEC_SECTIONS or
                                       KV_CODEC_FRAMES), FORMAT.md §3f */
#define KV_BLOCK_VERSION_PACKED 4u
#define KV_BLOCK_VERSION_PCPR 5u /* a packed compressed object (sections or frames) */
#define KV_BLOCK_SECT_ENTRY_PCPR 12u /* its section table entry: offset u32, length u32, codec
                                        u8, reserved u8, frame index u16 */
#define KV_BLOCK_PACK_ALIGN 64u  /* a packed object's start, meta and data sizes */
#define KV_BLOCK_HDR_BYTES 128u
#define KV_BLOCK_SECT_ENTRY 24u
#define KV_CODEC_RAW 0u
#define KV_CODEC_SECTIONS 1u /* format 2: compress/ sections, page checksums */
#define KV_CODEC_FRAMES 2u   /* format 3: compress/ lossless frames (section format 2), the
                                layout of format 2 otherwise */
#define KV_SECT_FRAME 6u     /* a format-3 section table entry's codec byte (KV_CODEC_ID_FRAME) */

/* Shape of one block object, derived from the model and n_tokens (never stored alone). */
typedef struct kv_block_geom {
  uint32_t n_layers, n_kv_heads, head_dim, dtype, elem_bytes, block_tokens;
  uint32_t n_tokens;      /* tokens in this block, 1..block_tokens */
  uint32_t row_bytes;     /* head_dim * elem_bytes */
  uint32_t group_tokens;  /* G */
  uint32_t n_groups;      /* groups per section */
  uint32_t group_stride;  /* bytes from one group to the next in a section */
  uint32_t n_sections;    /* n_layers * n_kv_heads * 2 */
  uint64_t section_bytes; /* bytes from one section to the next */
  uint32_t tokens_off;    /* offsets inside the meta region */
  uint32_t sectab_off;
  uint32_t cksum_off;
  uint32_t meta_bytes;    /* meta region size, multiple of 4096 */
  uint64_t data_bytes;    /* data region size, multiple of 4096 */
  uint64_t total_bytes;   /* meta_bytes + data_bytes */
  uint32_t packed;        /* 1: the packed layout (block format 4, kv_block_geom_pack) */
} kv_block_geom;

/* Sizes of a block object as stored (raw: the geometry's; compressed: its layout's). */
typedef struct kv_block_geom_obj {
  uint32_t meta_bytes;
  uint64_t data_bytes, total_bytes;
} kv_block_geom_obj;

/*
 * Layout of a compressed (format 2) block object: meta region = fixed header, tokens, section
 * table (offset u64, length u32, codec u8, 3 reserved bytes, 8 reserved bytes), page checksums
 * (8 bytes per data page), zero padding to 4096; then the data region: the encoded sections
 * back to back in section order, zero padding to 4096. FORMAT.md §3b.
 */
typedef struct kv_cblock_layout {
  uint32_t sectab_off, pcks_off, pcks_end; /* inside the meta region */
  uint32_t meta_bytes;
  uint32_t data_pages;    /* checksummed data pages (format 5: the last may be partial) */
  uint64_t data_bytes, total_bytes;
  uint32_t packed;        /* 1: block format 5 (FORMAT.md §3f): 12-byte section table
                             entries, meta and data regions padded to 64 bytes, not 4096; the
                             last data page's checksum covers only its bytes */
  uint32_t entry;         /* bytes of a section table entry (24, or 12 when packed) */
} kv_cblock_layout;

/* The fixed header, decoded. */
typedef struct kv_block_hdr {
  uint32_t version;
  uint32_t codec;
  uint32_t flags;         /* KV_BLOCK_F_* */
  uint8_t block_hash[16];
  uint8_t parent_hash[16];
  uint8_t model_hash[16];
  uint64_t meta_checksum;
  kv_block_geom g;        /* the raw geometry of the block's shape (what decoding yields) */
  kv_block_geom_obj obj;  /* the object as stored: meta, data and total bytes */
  kv_cblock_layout cl;    /* codec KV_CODEC_SECTIONS only */
  /* KV_BLOCK_F_SCORE: the score region ("THE SCORE REGION" below) of score_bits copies, score_bytes long
   * at score_off (= meta + data bytes); obj.total_bytes includes it. Else all 0. */
  uint32_t score_bits;
  uint32_t score_variant; /* 0: version-1 copies (byte 79 = 0); KV_SCORE_COPY_CENTERED: version 2 */
  uint64_t score_off, score_bytes;
} kv_block_hdr;

/* What a parsed header's object holds: compressed sections or frames (formats 2, 3 and 5), or
 * lossless frames (format 3, or 5 with codec 2); raw objects are formats 1 and 4 (packed).
 * KV_HDR_PACKED: a packed object (format 4 or 5) that lies at a 64-byte offset. */
#define KV_HDR_CPR(h) ((h)->codec != KV_CODEC_RAW)
#define KV_HDR_FRAMES(h) ((h)->codec == KV_CODEC_FRAMES)
#define KV_HDR_PACKED(h)                                                                     \
  ((h)->version == KV_BLOCK_VERSION_PACKED || (h)->version == KV_BLOCK_VERSION_PCPR)

/* Header flags (byte 6). Bit 0: the object ends with a score region (FORMAT.md §3c). */
#define KV_BLOCK_F_SCORE 1u

/* Size of one element of a stored dtype (kvdb_dtype), 0 for an unknown one. */
uint32_t kv_dtype_bytes(uint32_t dtype);

/* kv_block_geom_init() - geometry of a block of n_tokens tokens. KVDB_INVALID on bad dims
 * (the message names the field). */
kvdb_status kv_block_geom_init(kv_block_geom *g, uint32_t n_layers, uint32_t n_kv_heads,
                               uint32_t head_dim, uint32_t dtype, uint32_t block_tokens,
                               uint32_t n_tokens);

/*
 * kv_block_geom_pack() - turn a raw geometry into that of a packed raw object (block format
 * version 4, FORMAT.md §3e): the same sections and groups, but no section table (every entry
 * is implied by the geometry), the meta region = header, tokens, group checksums, padded to
 * 64 bytes (not a page), and the data region the sections without page padding. Such objects
 * are written back to back at 64-byte offsets in a segment (a put's run padded to a page).
 */
void kv_block_geom_pack(kv_block_geom *g);

/* Byte offset, from the block's start, of group `grp` of section `s`. */
static inline uint64_t kv_block_group_off(const kv_block_geom *g, uint32_t s, uint32_t grp)
{
  return g->meta_bytes + (uint64_t)s * g->section_bytes + (uint64_t)grp * g->group_stride;
}
/* Bytes of data in group `grp` (the last group of a section may hold fewer tokens). */
static inline uint32_t kv_block_group_len(const kv_block_geom *g, uint32_t grp)
{
  uint32_t first = grp * g->group_tokens;
  uint32_t nt = g->n_tokens - first < g->group_tokens ? g->n_tokens - first : g->group_tokens;
  return nt * g->row_bytes;
}
/* Byte offset, inside the meta region, of the checksum of group `grp` of section `s`. */
static inline uint32_t kv_block_cksum_off(const kv_block_geom *g, uint32_t s, uint32_t grp)
{
  return g->cksum_off + (s * g->n_groups + grp) * 8u;
}

/*
 * kv_block_checksum_sections() - compute the group checksums of sections [s0, s1) of the block
 * object in `buf` (their data already in place, padding zero) into its checksum table. A writer
 * calls it for each section right after filling it, while the bytes are still in cache.
 */
void kv_block_checksum_sections(const kv_block_geom *g, const uint8_t block_hash[16], uint32_t s0,
                                uint32_t s1, uint8_t *buf);

/*
 * kv_block_seal_meta() - finish the meta region of `buf` once every section's checksums are in
 * the checksum table: header, tokens, section table (with each section's digest of its
 * checksums), meta and header checksums. The rest of the meta region is zeroed.
 */
void kv_block_seal_meta(const kv_block_geom *g, const uint8_t block_hash[16],
                        const uint8_t parent_hash[16], const uint8_t model_hash[16],
                        const uint32_t *tokens, uint8_t *buf);

/*
 * kv_block_seal() - finish a block object in `buf` (g->total_bytes, data region already
 * filled, padding zero): all checksums, then kv_block_seal_meta().
 */
void kv_block_seal(const kv_block_geom *g, const uint8_t block_hash[16],
                   const uint8_t parent_hash[16], const uint8_t model_hash[16],
                   const uint32_t *tokens, uint8_t *buf);

/*
 * kv_block_parse_header() - decode and validate the fixed header (first 128 bytes of `buf`,
 * len >= 128): magic, version (a newer one is KVDB_VERSION), reserved fields, header checksum,
 * dimensions, and that the stored geometry equals the one recomputed from the dimensions
 * (format 1) or a consistent compressed layout (format 2). h->obj gives the object's sizes.
 * Returns KVDB_OK, KVDB_CORRUPT, KVDB_VERSION. The message says which field failed.
 */
kvdb_status kv_block_parse_header(const uint8_t *buf, size_t len, kv_block_hdr *out);

/*
 * kv_block_verify_meta() - check the meta region (`meta`, h->obj.meta_bytes long): the
 * checksum over tokens + section table (+ page checksums in format 2), and every section-table
 * entry against the geometry (format 2: sections back to back inside the data region).
 */
kvdb_status kv_block_verify_meta(const kv_block_hdr *h, const uint8_t *meta);

/*
 * kv_block_mark_score() - record in a sealed block header (the first 128 bytes of `buf`) that
 * the object ends with a score region of `bits` copies of `variant` at `score_off` (the
 * object's meta + data bytes): flag bit 0, byte 78, byte 79 (0 for version-1 copies, 2 for
 * version 2), bytes 112..119; the header checksum is recomputed.
 */
void kv_block_mark_score(uint8_t *buf, unsigned bits, unsigned variant, uint64_t score_off);

/* XXH3-64 of one group's bytes with the block's seed (block hash, section and group index). */
uint64_t kv_block_group_checksum(const kv_block_hdr *h, uint32_t s, uint32_t grp,
                                 const uint8_t *group, uint32_t len);

/*
 * kv_block_verify_sections() - verify every group of sections [s0, s1) of the block object in
 * `buf` (meta already verified; only those sections' bytes need to be present). On a mismatch
 * returns KVDB_CORRUPT and sets *bad_section and *bad_offset (from the block start); the
 * caller adds the segment and block to the message. kv_block_verify_data() does all sections.
 */
kvdb_status kv_block_verify_sections(const kv_block_hdr *h, const uint8_t *buf, uint32_t s0,
                                     uint32_t s1, uint32_t *bad_section, uint64_t *bad_offset);
kvdb_status kv_block_verify_data(const kv_block_hdr *h, const uint8_t *buf, uint32_t *bad_section,
                                 uint64_t *bad_offset);

/* ---- compressed blocks (format 2) ---- */

/* The layout of a compressed block of geometry g whose encoded sections take sections_bytes. */
void kv_cblock_layout_init(const kv_block_geom *g, uint64_t sections_bytes, kv_cblock_layout *l);
/* The same as a packed compressed object (block format 5, FORMAT.md §3f): 12-byte section table
 * entries, the meta region padded to 64 bytes, the data region sections_bytes padded to 64. */
void kv_cblock_layout_init_packed(const kv_block_geom *g, uint64_t sections_bytes,
                                  kv_cblock_layout *l);

/*
 * kv_cblock_seal() - finish a compressed block object in `buf` (l->total_bytes): the encoded
 * sections are in place back to back from l->meta_bytes with sect_len[s] bytes each, the rest
 * of the data region is zero. Writes the header (version 2, codec KV_CODEC_SECTIONS; version 5
 * for a packed layout), tokens, section table (sect_codec[s] = the section's codec id) and
 * every page checksum.
 */
void kv_cblock_seal(const kv_block_geom *g, const kv_cblock_layout *l, const uint32_t *sect_len,
                    const uint8_t *sect_codec, const uint8_t block_hash[16],
                    const uint8_t parent_hash[16], const uint8_t model_hash[16],
                    const uint32_t *tokens, uint8_t *buf);

/*
 * kv_cblock_seal_frames() - the same for a block of lossless frames (format 3): frames
 * f = 0 .. n_frames - 1 are in place back to back from l->meta_bytes, frame_len[f] bytes each,
 * frame f holding sections frame_first[f] .. frame_first[f + 1] - 1 (frame_first[n_frames] =
 * n_sections). Section s's table entry gives its frame's offset and length, codec byte
 * KV_SECT_FRAME and (u16 at +13) its index in the frame.
 */
void kv_cblock_seal_frames(const kv_block_geom *g, const kv_cblock_layout *l, uint32_t n_frames,
                           const uint32_t *frame_first, const uint32_t *frame_len,
                           const uint8_t block_hash[16], const uint8_t parent_hash[16],
                           const uint8_t model_hash[16], const uint32_t *tokens, uint8_t *buf);
/* Index of section s in its frame (format 3, or 5 of frames; 0 for sections). */
uint32_t kv_cblock_frame_index(const kv_block_hdr *h, const uint8_t *meta, uint32_t s);
/* The codec id byte of section s's table entry. */
uint8_t kv_cblock_codec(const kv_block_hdr *h, const uint8_t *meta, uint32_t s);
/* Bytes of data page p that its checksum covers: 4096, or in format 5 what is left of the
 * data region for its last page (a multiple of 64). */
static inline uint32_t kv_cblock_page_len(const kv_cblock_layout *l, uint32_t p)
{
  uint64_t left = l->data_bytes - (uint64_t)p * KV_PAGE;
  return left < KV_PAGE ? (uint32_t)left : KV_PAGE;
}

/* Section s of a verified compressed block's meta region: its offset (from the block start)
 * and length. */
void kv_cblock_section(const kv_block_hdr *h, const uint8_t *meta, uint32_t s, uint64_t *off,
                       uint32_t *len);

/* XXH3-64 of data page p (kv_cblock_page_len(&h->cl, p) bytes at `page`) of a compressed
 * block, with its seed. */
uint64_t kv_cblock_page_checksum(const kv_block_hdr *h, uint32_t p, const uint8_t *page);

/* Verify data pages [p0, p1) of a compressed block in `buf` (the object's start; only those
 * pages and the meta region need to be present). KVDB_CORRUPT sets *bad_offset. */
kvdb_status kv_cblock_verify_pages(const kv_block_hdr *h, const uint8_t *buf, uint32_t p0,
                                   uint32_t p1, uint64_t *bad_offset);

/* Token i of the block (meta region). */
static inline uint32_t kv_block_token(const kv_block_hdr *h, const uint8_t *meta, uint32_t i)
{
  return kv_get_le32(meta + h->g.tokens_off + 4u * i);
}

/* ---- THE SCORE REGION (format/score_region.c) ----
 *
 * The score region of a block object: the low-precision copies of its
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
 *       4   1  version: 1 (version-1 copies), 2 (version-2 copies: score.h THE CENTERED,
 *                 ROTATED COPY; the block header's byte 79 is 2 then)
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

#define KV_SREGION_MAGIC 0x9E3C51A7u
#define KV_SREGION_VERSION 1u          /* a region of version-1 copies */
#define KV_SREGION_VERSION_CENTERED 2u /* a region of version-2 (centered, rotated) copies */
#define KV_SREGION_HEAD_BYTES 64u

/* Geometry of the score region of one block (derived from the block's shape and the bits). */
typedef struct kv_sregion {
  uint32_t bits;          /* 8 or 4 */
  uint32_t variant;       /* 0: version-1 copies; KV_SCORE_COPY_CENTERED: version 2 */
  uint32_t n_copies;      /* n_layers * n_kv_heads */
  uint32_t copy_pages;    /* pages of one copy */
  uint32_t table_pages;   /* pages of the table (head + checksums) */
  uint64_t copy_bytes;    /* bytes of one copy */
  uint64_t bytes;         /* bytes of the region */
  kv_score_layout layout; /* of each copy: n_tokens x head_dim at `bits` */
} kv_sregion;

/* kv_sregion_init() - the region of a block of geometry g with copies at `bits` of `variant`
 * (0: version 1; KV_SCORE_COPY_CENTERED: version 2). KVDB_INVALID when bits is not 8 or 4, the
 * variant is unknown or the shape cannot be scored (int4 needs an even head_dim, version 2 a
 * power-of-two one). */
kvdb_status kv_sregion_init(kv_sregion *r, const kv_block_geom *g, unsigned bits,
                            unsigned variant);

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
