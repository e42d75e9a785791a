/* SPDX-License-Identifier: MIT */
/*
 * tests/fuzz/fuzz_cblock.c — compressed block objects (block formats 2, 3 and 5: FORMAT.md §3b,
 * §3d, §3f — packed compressed objects, 12-byte section entries, 64-byte padding) read from
 * a segment file: the header, the meta region (tokens, section table, page checksums), the
 * page checksums of the data region, and the decoding of every section (engine/block/cblock.c,
 * the path of kvdb_get, kvdb_get_context and the profile).
 *
 * Input: one flags byte, then the bytes of a block object as found on disk (any length).
 * Random bytes almost never pass a 64-bit checksum, so the flags let the fuzzer repair them
 * and reach the section decoders behind them; the decoders are never told to skip anything:
 *   bit 0  recompute the checksum of every data page wholly present
 *   bit 1  recompute the meta checksum (tokens, section table, page checksums)
 *   bit 2  recompute the header checksum (also done after bits 0..1 changed the header)
 * Then, as the engine does: kv_block_parse_header(); for a format-2 object whose meta region
 * is present, kv_block_verify_meta(); then kv_cblock_verify_pages() over the pages present;
 * when the whole object verified, kv_cblock_decode_section() of every section (with
 * positions) and, when no section dropped tokens, kv_cblock_decode_data(). Must never crash
 * or read outside the input. Properties (abort when broken):
 *   - statuses are KVDB_OK, KVDB_CORRUPT or KVDB_VERSION (never INVALID, PANIC or NOMEM for
 *     bytes from disk);
 *   - a page mismatch is reported at the offset of a page that was asked for;
 *   - a decoded section has 1..n_tokens rows whose positions rise strictly below n_tokens,
 *     all of them when the section drops nothing;
 *   - an object that verified is canonical: sealing its tokens and sections again with
 *     kv_cblock_seal() gives the same header, tokens, section table and page checksums (the
 *     padding after the tokens and after the page checksums is never read).
 * Seeds: tests/fuzz/corpora/cblock/ (the compressed blocks of the golden format-2 database
 * with damaged variants, written by `test_golden_db --write-corpus DIR`).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "block.h"
#include "block/cblock.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define FIX_PAGES 1u
#define FIX_META 2u
#define FIX_HEADER 4u

static void fix_header_checksum(uint8_t *buf)
{
  kv_put_le64(buf + 120, XXH3_64bits(buf, 120));
}

static int disk_status(kvdb_status rc)
{
  return rc == KVDB_OK || rc == KVDB_CORRUPT || rc == KVDB_VERSION;
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
  if (!disk_status(rc))
    abort();
  if (rc != KVDB_OK || !KV_HDR_CPR(&h) || len < h.obj.meta_bytes)
    goto done; /* raw objects are fuzz_block's; the engine reads a meta region whole */
  const kv_block_geom *g = &h.g;
  const kv_cblock_layout *l = &h.cl;
  /* formats 2 and 3: whole pages; format 5 (packed, FORMAT.md §3f): 64-byte units, the last
   * data page partial */
  uint32_t unit = l->packed ? KV_BLOCK_PACK_ALIGN : KV_PAGE;
  if (l->meta_bytes % unit || l->data_bytes % unit || l->data_bytes == 0 ||
      l->data_pages != (l->data_bytes + KV_PAGE - 1) / KV_PAGE ||
      l->packed != (h.version == KV_BLOCK_VERSION_PCPR) ||
      l->entry != (l->packed ? KV_BLOCK_SECT_ENTRY_PCPR : KV_BLOCK_SECT_ENTRY) ||
      l->total_bytes != l->meta_bytes + l->data_bytes || l->pcks_end > l->meta_bytes ||
      l->pcks_off + 8ull * l->data_pages != l->pcks_end ||
      l->sectab_off < g->tokens_off + 4ull * g->n_tokens ||
      l->pcks_off < l->sectab_off + (uint64_t)l->entry * g->n_sections)
    abort(); /* the parsed layout is self-consistent */

  uint32_t pages = 0; /* data pages wholly present */
  while (pages < l->data_pages &&
         l->meta_bytes + (uint64_t)pages * KV_PAGE + kv_cblock_page_len(l, pages) <= len)
    pages++;
  if (flags & (FIX_PAGES | FIX_META)) {
    if (flags & FIX_PAGES)
      for (uint32_t p = 0; p < pages; p++)
        kv_put_le64(buf + l->pcks_off + 8u * p,
                    kv_cblock_page_checksum(&h, p, buf + l->meta_bytes + (uint64_t)p * KV_PAGE));
    kv_put_le64(buf + 104, XXH3_64bits(buf + g->tokens_off, l->pcks_end - g->tokens_off));
    fix_header_checksum(buf);
    kv_block_hdr h2;
    if (kv_block_parse_header(buf, len, &h2) != KVDB_OK || memcmp(&h2.g, &h.g, sizeof h.g) != 0 ||
        memcmp(&h2.cl, &h.cl, sizeof h.cl) != 0)
      abort(); /* the repair changed checksums only */
    h = h2;
  }

  rc = kv_block_verify_meta(&h, buf);
  if (!disk_status(rc))
    abort();
  if (rc != KVDB_OK)
    goto done;
  uint64_t bad = UINT64_MAX;
  uint32_t p0 = pages / 2;
  rc = kv_cblock_verify_pages(&h, buf, p0, pages, &bad);
  if (rc == KVDB_CORRUPT) {
    if (bad < l->meta_bytes + (uint64_t)p0 * KV_PAGE ||
        bad >= l->meta_bytes + (uint64_t)pages * KV_PAGE)
      abort(); /* the mismatch is reported where it is */
    goto done;
  }
  if (rc != KVDB_OK)
    abort();
  if (pages < l->data_pages || kv_cblock_verify_pages(&h, buf, 0, p0, &bad) != KVDB_OK)
    goto done;

  /* the whole object verified: it is what kv_cblock_seal() writes */
  uint32_t *tok = malloc(4u * g->n_tokens + 4), *sect_len = malloc(4u * g->n_sections);
  uint8_t *codec = malloc(g->n_sections), *again = malloc(l->total_bytes);
  uint32_t *pos = malloc(4u * g->n_tokens + 4);
  uint8_t *raw = malloc(g->data_bytes ? g->data_bytes : 1);
  if (tok == NULL || sect_len == NULL || codec == NULL || again == NULL || pos == NULL ||
      raw == NULL)
    abort();
  for (uint32_t i = 0; i < g->n_tokens; i++)
    tok[i] = kv_block_token(&h, buf, i);
  for (uint32_t s = 0; s < g->n_sections; s++) {
    uint64_t off;
    kv_cblock_section(&h, buf, s, &off, &sect_len[s]);
    if (off < l->meta_bytes || off + sect_len[s] > l->total_bytes)
      abort(); /* verify_meta keeps every section inside the data region */
    codec[s] = kv_cblock_codec(&h, buf, s);
  }
  memcpy(again, buf, l->total_bytes);
  if (KV_HDR_FRAMES(&h)) { /* lossless frames: a frame starts at each index-0 entry */
    uint32_t *ff = malloc(4u * g->n_sections + 4), *fl = malloc(4u * g->n_sections + 4), nf = 0;
    if (ff == NULL || fl == NULL)
      abort();
    for (uint32_t s = 0; s < g->n_sections; s++)
      if (kv_cblock_frame_index(&h, buf, s) == 0) {
        ff[nf] = s;
        fl[nf++] = sect_len[s];
      }
    ff[nf] = g->n_sections;
    kv_cblock_seal_frames(g, l, nf, ff, fl, h.block_hash, h.parent_hash, h.model_hash, tok,
                          again);
    free(ff);
    free(fl);
  } else {
    kv_cblock_seal(g, l, sect_len, codec, h.block_hash, h.parent_hash, h.model_hash, tok, again);
  }
  /* kept from the input: the alignment padding after the tokens (covered by the meta
   * checksum, never read) and so the meta checksum; the padding after the page checksums is
   * covered by nothing and never read */
  uint32_t tok_end = g->tokens_off + 4 * g->n_tokens;
  memcpy(again + tok_end, buf + tok_end, l->sectab_off - tok_end);
  if (h.score_bits != 0) /* a score region follows (fuzz_block checks it) */
    kv_block_mark_score(again, h.score_bits, h.score_variant, h.score_off);
  kv_put_le64(again + 104, XXH3_64bits(again + g->tokens_off, l->pcks_end - g->tokens_off));
  fix_header_checksum(again);
  if (memcmp(again, buf, l->pcks_end) != 0)
    abort();

  kv_cdec dec;
  if (kv_cdec_init(&dec) != KVDB_OK)
    abort();
  int all_rows = 1;
  for (uint32_t s = 0; s < g->n_sections; s++) {
    const uint8_t *rows;
    uint32_t n_rows = 0;
    rc = kv_cblock_decode_section(&h, buf, s, &dec, &rows, &n_rows, pos);
    if (!disk_status(rc))
      abort();
    if (rc != KVDB_OK) {
      all_rows = 0;
      continue;
    }
    if (n_rows == 0 || n_rows > g->n_tokens)
      abort();
    for (uint32_t r = 0; r < n_rows; r++)
      if (pos[r] >= g->n_tokens || (r > 0 && pos[r] <= pos[r - 1]))
        abort();
    if (n_rows == g->n_tokens && pos[n_rows - 1] != n_rows - 1)
      abort();
    volatile uint8_t sink = 0; /* every decoded row byte is inside the buffer */
    for (size_t i = 0; i < (size_t)n_rows * g->row_bytes; i += 61)
      sink ^= rows[i];
    (void)sink;
    all_rows &= n_rows == g->n_tokens;
  }
  rc = kv_cblock_decode_data(&h, buf, 0, g->n_sections, &dec, raw);
  if (!disk_status(rc) || (all_rows && rc != KVDB_OK))
    abort();
  kv_cdec_free(&dec);
  free(tok);
  free(sect_len);
  free(codec);
  free(again);
  free(pos);
  free(raw);
done:
  free(buf);
  return 0;
}
