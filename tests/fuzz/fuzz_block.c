/* SPDX-License-Identifier: MIT */
/*
 * tests/fuzz/fuzz_block.c — raw (format 1) and packed raw (format 4, FORMAT.md §3e: no section
 * table, 64-byte sizes) block objects read from a segment file
 * (format/block.c): the fixed header, the meta region (tokens, section table, checksum table)
 * and the group checksums. Compressed (format 2) objects, which share the header, are
 * fuzz_cblock.c's: here a header that parses as one only has its sizes checked.
 *
 * Input: one flags byte, then the bytes of a block object as found on disk (any length).
 * Random bytes almost never pass a 64-bit checksum, so the flags let the fuzzer repair them
 * before the decoders run and reach the checks behind them; the decoders themselves are never
 * told to skip anything:
 *   bit 0  recompute the group checksums of every section wholly present
 *   bit 1  recompute each section-table entry's digest of its checksums
 *   bit 2  recompute the meta checksum (tokens + section table) in the header
 *   bit 3  recompute the header checksum (always done after bits 0..2 changed the header)
 *   bit 4  recompute the score region's table (kv_sregion_seal) when the header announces one
 *          and the input holds all of it
 * Then, as the engine does: kv_block_parse_header(); when it passes and the meta region is
 * present, kv_block_verify_meta(); when that passes, kv_block_verify_sections() over the
 * sections present (as a cold get does, wave by wave). Must never crash or read outside the
 * input. Properties (abort when broken):
 *   - the parsed geometry is self-consistent (tables inside the meta region, groups inside the
 *     data region, page-aligned sizes);
 *   - a mismatch names a section that was asked for and an offset inside it;
 *   - a block that passes every check is canonical: sealing its tokens and data again with
 *     kv_block_seal() gives the same header, tokens, section table and checksum table, so
 *     nothing the validator accepts can differ from what a writer produces in a field that is
 *     read. (The alignment padding after the tokens is covered by the meta checksum but not
 *     required to be zero; it is never read.)
 * A header that announces a score region (flag bit 0, FORMAT.md §3c; raw or compressed object)
 * has it decoded as kvdb_score and kvdb_verify do: the table's head, every copy wholly present
 * against its checksum and parsed (score), and the whole region when present.
 * Properties: the region lies right after the object's data and is as big as its shape and bits
 * say; a copy that verifies scores the same bits on every kernel path; a region that verifies
 * is canonical (kv_sregion_seal over its copies writes the same table); a whole object that
 * verifies re-seals to the same header with kv_block_mark_score().
 * Seeds: tests/fuzz/corpora/block/ (made by `fuzz_make_seeds DIR`, tests/fuzz/make_seeds.c).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "block.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define FIX_GROUPS 1u
#define FIX_DIGESTS 2u
#define FIX_META 4u
#define FIX_HEADER 8u
#define FIX_SCORE 16u

static void check_geometry(const kv_block_geom *g)
{
  uint32_t unit = g->packed ? KV_BLOCK_PACK_ALIGN : KV_PAGE; /* format 4: 64-byte sizes */
  if (g->meta_bytes % unit != 0 || g->data_bytes % unit != 0 ||
      g->total_bytes != (uint64_t)g->meta_bytes + g->data_bytes)
    abort();
  if (g->tokens_off < KV_BLOCK_HDR_BYTES || g->sectab_off < g->tokens_off + 4ull * g->n_tokens ||
      g->cksum_off < g->sectab_off + (g->packed ? 0ull : (uint64_t)KV_BLOCK_SECT_ENTRY *
                                                             g->n_sections) ||
      (uint64_t)g->cksum_off + 8ull * g->n_sections * g->n_groups > g->meta_bytes)
    abort(); /* the tables lie inside the meta region, in order */
  if (g->n_groups == 0 || (uint64_t)g->n_groups * g->group_tokens < g->n_tokens ||
      (uint64_t)(g->n_groups - 1) * g->group_tokens >= g->n_tokens ||
      (uint64_t)g->group_tokens * g->row_bytes > g->group_stride ||
      kv_block_group_len(g, g->n_groups - 1) == 0)
    abort(); /* groups cover the tokens exactly, each fits its stride */
  if (kv_block_group_off(g, g->n_sections - 1, g->n_groups - 1) + g->group_stride >
      g->total_bytes)
    abort(); /* the last group ends inside the object */
}

/* Sections [0, n) whose groups all lie inside `len` bytes. */
static uint32_t sections_present(const kv_block_geom *g, size_t len)
{
  uint32_t n = 0;
  while (n < g->n_sections && kv_block_group_off(g, n, g->n_groups - 1) + g->group_stride <= len)
    n++;
  return n;
}

/* Where the meta checksum's bytes end: the section table (format 1), the group checksums
 * (format 4, which has no table). */
static uint32_t meta_ck_end(const kv_block_geom *g)
{
  return g->packed ? kv_block_cksum_off(g, g->n_sections, 0) : g->cksum_off;
}

static void fix_header_checksum(uint8_t *buf)
{
  kv_put_le64(buf + 120, XXH3_64bits(buf, 120));
}

/* The score region a parsed header announces, decoded as the engine does. */
static void check_score_region(const kv_block_hdr *h, uint8_t *buf, size_t len, unsigned flags)
{
  if (h->score_bits == 0) {
    if (h->score_off != 0 || h->score_bytes != 0)
      abort();
    return;
  }
  kv_sregion r;
  if (kv_sregion_init(&r, &h->g, h->score_bits, h->score_variant) != KVDB_OK || r.bytes != h->score_bytes ||
      h->score_off != (uint64_t)h->obj.meta_bytes + h->obj.data_bytes ||
      h->obj.total_bytes != h->score_off + h->score_bytes || h->score_off % KV_PAGE != 0)
    abort(); /* right after the data, as big as the shape says */
  uint64_t tb = (uint64_t)r.table_pages * KV_PAGE;
  if (len < h->score_off + tb)
    return;
  uint8_t *reg = buf + h->score_off;
  size_t have = len - h->score_off;
  if ((flags & FIX_SCORE) && have >= r.bytes)
    kv_sregion_seal(&r, h->block_hash, reg);
  kvdb_status rc = kv_sregion_check_head(&r, reg);
  if (rc != KVDB_OK) {
    if (rc != KVDB_CORRUPT && rc != KVDB_VERSION)
      abort();
    return;
  }
  static const float q[KV_SCORE_MAX_HEAD_DIM] = {1.0f, -2.0f, 0.5f, 3.0f, -1.0f, 0.25f, 7.0f};
  kv_score_query *kq = NULL;
  if (kv_score_query_create(KV_SCORE_F32, q, 1, h->g.head_dim, 0, KV_SCORE_SUM, &kq, NULL) !=
      KV_SCORE_OK)
    abort();
  float *s1 = malloc(4u * h->g.n_tokens), *s2 = malloc(4u * h->g.n_tokens);
  if (s1 == NULL || s2 == NULL)
    abort();
  for (uint32_t c = 0; c < r.n_copies && kv_sregion_copy_off(&r, c) + r.copy_bytes <= have; c++) {
    kv_score_view v;
    uint64_t bad = 0;
    rc = kv_sregion_verify_copy(&r, h->block_hash, reg, c, reg + kv_sregion_copy_off(&r, c), &v,
                                &bad);
    if (rc != KVDB_OK) {
      if (rc != KVDB_CORRUPT || bad != kv_sregion_copy_off(&r, c))
        abort();
      continue;
    }
    if (v.layout.n_tokens != h->g.n_tokens || v.layout.head_dim != h->g.head_dim ||
        v.layout.bits != h->score_bits || v.codes < reg || v.codes >= reg + r.bytes)
      abort();
    /* what a parsed copy holds scores the same on every kernel path */
    if (kv_score_tokens(kq, &v, 0, v.layout.n_tokens, KV_SCORE_IMPL_PORTABLE, s1, NULL) !=
            KV_SCORE_OK ||
        kv_score_tokens(kq, &v, 0, v.layout.n_tokens, KV_SCORE_IMPL_AUTO, s2, NULL) !=
            KV_SCORE_OK ||
        memcmp(s1, s2, 4u * v.layout.n_tokens) != 0)
      abort();
  }
  free(s1);
  free(s2);
  kv_score_query_free(kq);
  if (have < r.bytes)
    return;
  uint64_t bad = 0;
  rc = kv_sregion_verify(&r, h->block_hash, reg, &bad);
  if (rc != KVDB_OK) {
    if ((rc != KVDB_CORRUPT && rc != KVDB_VERSION) || bad >= r.bytes)
      abort();
    return;
  }
  uint8_t *copy = malloc(r.bytes); /* canonical: the table is what sealing the copies writes */
  if (copy == NULL)
    abort();
  memcpy(copy, reg, r.bytes);
  kv_sregion_seal(&r, h->block_hash, copy);
  if (memcmp(copy, reg, r.bytes) != 0)
    abort();
  free(copy);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
  if (size < 1)
    return 0;
  unsigned flags = data[0];
  size_t len = size - 1;
  uint8_t *buf = malloc(len ? len : 1);
  if (buf == NULL)
    return 0;
  memcpy(buf, data + 1, len);
  if ((flags & FIX_HEADER) && len >= KV_BLOCK_HDR_BYTES)
    fix_header_checksum(buf);

  kv_block_hdr h;
  kvdb_status rc = kv_block_parse_header(buf, len, &h);
  if (rc != KVDB_OK) {
    if (rc != KVDB_CORRUPT && rc != KVDB_VERSION)
      abort();
    goto done;
  }
  const kv_block_geom *g = &h.g;
  check_geometry(g);
  check_score_region(&h, buf, len, flags);
  if (h.codec != KV_CODEC_RAW) { /* formats 2, 3 (whole pages) and 5 (packed: 64-byte units,
                                    no score region; fuzz_cblock reads the rest) */
    uint32_t unit = h.version == KV_BLOCK_VERSION_PCPR ? KV_BLOCK_PACK_ALIGN : KV_PAGE;
    if ((h.version != 2 && h.version != 3 && h.version != KV_BLOCK_VERSION_PCPR) ||
        (h.version == KV_BLOCK_VERSION_PCPR && h.score_bits != 0) ||
        h.obj.total_bytes != (uint64_t)h.obj.meta_bytes + h.obj.data_bytes + h.score_bytes ||
        h.obj.meta_bytes % unit != 0 || h.obj.data_bytes % unit != 0)
      abort();
    goto done;
  }
  if ((h.version != 1 && h.version != KV_BLOCK_VERSION_PACKED) ||
      (h.version == KV_BLOCK_VERSION_PACKED) != (g->packed != 0) ||
      (g->packed && h.score_bits != 0) || h.obj.meta_bytes != g->meta_bytes ||
      h.obj.data_bytes != g->data_bytes ||
      h.obj.total_bytes != g->total_bytes + h.score_bytes)
    abort(); /* a raw object is stored exactly as its geometry says (and its score region) */
  if (len < g->meta_bytes)
    goto done; /* the engine never verifies a meta region it has not read whole */

  uint32_t present = sections_present(g, len);
  if (flags & (FIX_GROUPS | FIX_DIGESTS | FIX_META)) {
    if (flags & FIX_GROUPS)
      kv_block_checksum_sections(g, h.block_hash, 0, present, buf);
    if ((flags & FIX_DIGESTS) && !g->packed)
      for (uint32_t s = 0; s < g->n_sections; s++)
        kv_put_le64(buf + g->sectab_off + KV_BLOCK_SECT_ENTRY * s + 16,
                    XXH3_64bits(buf + kv_block_cksum_off(g, s, 0), 8u * g->n_groups));
    if (flags & FIX_META) {
      kv_put_le64(buf + 104, XXH3_64bits(buf + g->tokens_off, meta_ck_end(g) - g->tokens_off));
      fix_header_checksum(buf);
    }
    /* the repaired header must parse to the same geometry */
    kv_block_hdr h2;
    if ((flags & FIX_META) || (flags & FIX_HEADER)) {
      if (kv_block_parse_header(buf, len, &h2) != KVDB_OK ||
          memcmp(&h2.g, &h.g, sizeof h.g) != 0)
        abort();
      h = h2;
    }
  }

  rc = kv_block_verify_meta(&h, buf);
  if (rc != KVDB_OK) {
    if (rc != KVDB_CORRUPT)
      abort();
    goto done;
  }
  uint64_t sum = 0;
  for (uint32_t i = 0; i < g->n_tokens; i++)
    sum += kv_block_token(&h, buf, i); /* every token is inside the meta region */
  (void)sum;

  uint32_t bad_s = UINT32_MAX;
  uint64_t bad_off = UINT64_MAX;
  uint32_t s0 = present > 1 ? present / 2 : 0;
  rc = kv_block_verify_sections(&h, buf, s0, present, &bad_s, &bad_off);
  if (rc == KVDB_CORRUPT) {
    if (bad_s < s0 || bad_s >= present || bad_off < kv_block_group_off(g, bad_s, 0) ||
        bad_off >= kv_block_group_off(g, bad_s, 0) + g->section_bytes)
      abort(); /* the mismatch is reported where it is */
    goto done;
  }
  if (rc != KVDB_OK)
    abort();
  rc = kv_block_verify_sections(&h, buf, 0, s0, &bad_s, &bad_off);
  if (rc != KVDB_OK || present < g->n_sections || len < g->total_bytes)
    goto done;

  /* the whole object verified: it must be exactly what kv_block_seal() writes */
  uint32_t *tok = malloc(4 * (size_t)g->n_tokens);
  uint8_t *again = malloc(g->total_bytes);
  if (tok == NULL || again == NULL)
    abort();
  for (uint32_t i = 0; i < g->n_tokens; i++)
    tok[i] = kv_block_token(&h, buf, i);
  memcpy(again, buf, g->total_bytes);
  kv_block_seal(g, h.block_hash, h.parent_hash, h.model_hash, tok, again);
  /* the token padding is the one thing kept from the input (and so its checksums redone) */
  uint32_t tok_end = g->tokens_off + 4 * g->n_tokens;
  memcpy(again + tok_end, buf + tok_end, g->sectab_off - tok_end);
  if (h.score_bits != 0)
    kv_block_mark_score(again, h.score_bits, h.score_variant, h.score_off);
  kv_put_le64(again + 104, XXH3_64bits(again + g->tokens_off, meta_ck_end(g) - g->tokens_off));
  fix_header_checksum(again);
  if (memcmp(again, buf, kv_block_cksum_off(g, g->n_sections, 0)) != 0)
    abort();
  free(tok);
  free(again);
done:
  free(buf);
  return 0;
}
