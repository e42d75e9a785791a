/* SPDX-License-Identifier: MIT */
/*
 * format/block.c — encode and validate block objects (FORMAT.md §3).
 *
 * Fixed header, 128 bytes, little-endian:
 *   OFF SIZE FIELD
 *     0   4  magic 0xB10CDB4B
 *     4   2  format version (1)
 *     6   2  flags: bit 0 the object ends with a score region (block.h, "THE SCORE REGION"); others 0
 *     8   4  meta_bytes
 *    12   4  n_tokens
 *    16  16  block hash h_i
 *    32  16  parent hash h_{i-1}
 *    48  16  model fingerprint hash h_{-1}
 *    64   4  n_layers      68 4 n_kv_heads      72 4 head_dim
 *    76   1  dtype         77 1 codec (0 raw)   78 1 score bits (flag 0; else 0)  79 1 score copy version (flag 0: 0 = 1, or 2; else 0)
 *    80   4  block_tokens  84 4 n_sections      88 4 group_tokens   92 4 n_groups
 *    96   8  data_bytes
 *   104   8  meta checksum: XXH3-64 of [tokens_off, cksum_off) of the meta region
 *   112   8  offset of the score region (flag 0: meta + data bytes; else 0)
 *   120   8  header checksum: XXH3-64 of bytes [0, 120)
 */
#include <xxhash.h>
#ifdef KVDB_HAVE_XXH_DISPATCH
#include <xxh_x86dispatch.h> /* XXH3 with the best vector unit of this CPU, chosen at run time */
#endif

#include "block.h"

/*
 * Every checksum of this file goes through xxh64() / xxh64_seed(). libxxhash's run-time dispatch
 * (Debian 0.8.1) returns from its AVX2 / AVX-512 code without `vzeroupper`, so the upper halves
 * of the vector registers stay dirty after a kvdb call; legacy-SSE code the caller runs next
 * (any non-VEX code, e.g. an inference loop built for baseline x86-64) then pays a false
 * dependency on them in every instruction. Measured on the reference machine: a stories260K
 * forward step (tools/refmodel) took 0.29 ms alone and 4.0 ms right after one dispatched
 * XXH3_64bits_withSeed. So we clear the upper state after each hash, where the CPU has AVX
 * (vzeroupper keeps the low 128 bits; the clobbers tell the compiler the registers changed). A
 * few cycles per call, against hundreds for the hash itself.
 */
static inline void xxh_clear_avx_upper(void)
{
#if defined(KVDB_HAVE_XXH_DISPATCH) && defined(__x86_64__) && defined(__GNUC__)
  if (__builtin_cpu_supports("avx"))
    __asm__ volatile("vzeroupper" ::: "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6",
                     "xmm7", "xmm8", "xmm9", "xmm10", "xmm11", "xmm12", "xmm13", "xmm14",
                     "xmm15");
#endif
}

static uint64_t xxh64(const void *p, size_t len)
{
  uint64_t h = XXH3_64bits(p, len);
  xxh_clear_avx_upper();
  return h;
}

static uint64_t xxh64_seed(const void *p, size_t len, uint64_t seed)
{
  uint64_t h = XXH3_64bits_withSeed(p, len, seed);
  xxh_clear_avx_upper();
  return h;
}

#define OFF_MAGIC 0
#define OFF_VERSION 4
#define OFF_FLAGS 6
#define OFF_META 8
#define OFF_NTOK 12
#define OFF_HASH 16
#define OFF_PARENT 32
#define OFF_MODEL 48
#define OFF_NL 64
#define OFF_NH 68
#define OFF_HD 72
#define OFF_DTYPE 76
#define OFF_CODEC 77
#define OFF_RSV16 78
#define OFF_BT 80
#define OFF_NSECT 84
#define OFF_GT 88
#define OFF_NG 92
#define OFF_DATA 96
#define OFF_METACK 104
#define OFF_RSV64 112
#define OFF_HDRCK 120

uint32_t kv_dtype_bytes(uint32_t dtype)
{
  switch (dtype) {
  case KVDB_F16:
  case KVDB_BF16:
    return 2;
  case KVDB_F32:
    return 4;
  default:
    return 0;
  }
}

kvdb_status kv_block_geom_init(kv_block_geom *g, uint32_t n_layers, uint32_t n_kv_heads,
                               uint32_t head_dim, uint32_t dtype, uint32_t block_tokens,
                               uint32_t n_tokens)
{
  memset(g, 0, sizeof *g);
  if (n_layers < 1 || n_layers > 1024)
    return kv_fail(KVDB_INVALID, "n_layers %u out of range 1..1024", n_layers);
  if (n_kv_heads < 1 || n_kv_heads > 1024)
    return kv_fail(KVDB_INVALID, "n_kv_heads %u out of range 1..1024", n_kv_heads);
  if (head_dim < 1 || head_dim > 4096)
    return kv_fail(KVDB_INVALID, "head_dim %u out of range 1..4096", head_dim);
  uint32_t eb = kv_dtype_bytes(dtype);
  if (eb == 0)
    return kv_fail(KVDB_INVALID, "dtype %u is not KVDB_F16, KVDB_BF16 or KVDB_F32", dtype);
  if (block_tokens < 16 || block_tokens > 4096 || (block_tokens & (block_tokens - 1)) != 0)
    return kv_fail(KVDB_INVALID, "block_tokens %u is not a power of two from 16 to 4096",
                   block_tokens);
  if (n_tokens < 1 || n_tokens > block_tokens)
    return kv_fail(KVDB_INVALID, "block of %u tokens with block_tokens %u", n_tokens, block_tokens);
  if ((uint64_t)n_layers * n_kv_heads * 2 > 65536)
    return kv_fail(KVDB_INVALID, "n_layers * n_kv_heads * 2 = %llu sections exceeds 65536",
                   (unsigned long long)n_layers * n_kv_heads * 2);
  g->n_layers = n_layers;
  g->n_kv_heads = n_kv_heads;
  g->head_dim = head_dim;
  g->dtype = dtype;
  g->elem_bytes = eb;
  g->block_tokens = block_tokens;
  g->n_tokens = n_tokens;
  g->row_bytes = head_dim * eb;
  g->n_sections = n_layers * n_kv_heads * 2;
  if ((uint64_t)n_tokens * g->row_bytes >= KV_PAGE) {
    /* paged: groups of G tokens, each starting on a page boundary */
    g->group_tokens = g->row_bytes >= KV_PAGE ? 1 : KV_PAGE / g->row_bytes;
    if (g->group_tokens > n_tokens)
      g->group_tokens = n_tokens;
    g->n_groups = (n_tokens + g->group_tokens - 1) / g->group_tokens;
    g->group_stride = KV_ALIGN_UP(g->group_tokens * g->row_bytes, KV_PAGE);
  } else {
    /* packed: the whole section is one group, 64-byte aligned */
    g->group_tokens = n_tokens;
    g->n_groups = 1;
    g->group_stride = KV_ALIGN_UP(n_tokens * g->row_bytes, 64u);
  }
  g->section_bytes = (uint64_t)g->n_groups * g->group_stride;
  g->tokens_off = KV_BLOCK_HDR_BYTES;
  g->sectab_off = g->tokens_off + KV_ALIGN_UP(4u * n_tokens, 8u);
  g->cksum_off = g->sectab_off + KV_BLOCK_SECT_ENTRY * g->n_sections;
  uint64_t meta = (uint64_t)g->cksum_off + 8ull * g->n_sections * g->n_groups;
  g->meta_bytes = (uint32_t)KV_ALIGN_UP(meta, KV_PAGE);
  g->data_bytes = KV_ALIGN_UP((uint64_t)g->n_sections * g->section_bytes, KV_PAGE);
  g->total_bytes = g->meta_bytes + g->data_bytes;
  return KVDB_OK;
}

void kv_block_geom_pack(kv_block_geom *g)
{
  g->packed = 1;
  g->sectab_off = g->tokens_off + KV_ALIGN_UP(4u * g->n_tokens, 8u);
  g->cksum_off = g->sectab_off; /* no section table */
  uint64_t meta = (uint64_t)g->cksum_off + 8ull * g->n_sections * g->n_groups;
  g->meta_bytes = (uint32_t)KV_ALIGN_UP(meta, KV_BLOCK_PACK_ALIGN);
  g->data_bytes = (uint64_t)g->n_sections * g->section_bytes; /* strides are 64-aligned */
  g->total_bytes = g->meta_bytes + g->data_bytes;
}

static uint64_t group_seed(const uint8_t *block_hash, uint32_t s, uint32_t grp)
{
  return kv_get_le64(block_hash) ^ (((uint64_t)s << 32) | grp);
}

uint64_t kv_block_group_checksum(const kv_block_hdr *h, uint32_t s, uint32_t grp,
                                 const uint8_t *group, uint32_t len)
{
  return xxh64_seed(group, len, group_seed(h->block_hash, s, grp));
}

void kv_block_checksum_sections(const kv_block_geom *g, const uint8_t block_hash[16], uint32_t s0,
                                uint32_t s1, uint8_t *buf)
{
  kv_block_hdr h;
  memcpy(h.block_hash, block_hash, 16);
  for (uint32_t s = s0; s < s1; s++) {
    uint8_t *cks = buf + kv_block_cksum_off(g, s, 0);
    for (uint32_t grp = 0; grp < g->n_groups; grp++) {
      const uint8_t *data = buf + kv_block_group_off(g, s, grp);
      kv_put_le64(cks + 8 * grp, kv_block_group_checksum(&h, s, grp, data, g->group_stride));
    }
  }
}

/* The fixed header fields both formats share and the tokens after it (the header checksums
 * and the format's own tables are the callers'): format 1 (raw, group_tokens and n_groups of
 * the geometry) and format 2 (sections: 0 and its data pages). */
static void put_fixed(uint8_t *buf, const kv_block_geom *g, uint16_t version, uint8_t codec,
                      uint32_t meta_bytes, uint32_t group_tokens, uint32_t n_groups,
                      uint64_t data_bytes, const uint8_t block_hash[16],
                      const uint8_t parent_hash[16], const uint8_t model_hash[16],
                      const uint32_t *tokens)
{
  kv_put_le32(buf + OFF_MAGIC, KV_BLOCK_MAGIC);
  kv_put_le16(buf + OFF_VERSION, version);
  kv_put_le32(buf + OFF_META, meta_bytes);
  kv_put_le32(buf + OFF_NTOK, g->n_tokens);
  memcpy(buf + OFF_HASH, block_hash, 16);
  memcpy(buf + OFF_PARENT, parent_hash, 16);
  memcpy(buf + OFF_MODEL, model_hash, 16);
  kv_put_le32(buf + OFF_NL, g->n_layers);
  kv_put_le32(buf + OFF_NH, g->n_kv_heads);
  kv_put_le32(buf + OFF_HD, g->head_dim);
  buf[OFF_DTYPE] = (uint8_t)g->dtype;
  buf[OFF_CODEC] = codec;
  kv_put_le32(buf + OFF_BT, g->block_tokens);
  kv_put_le32(buf + OFF_NSECT, g->n_sections);
  kv_put_le32(buf + OFF_GT, group_tokens);
  kv_put_le32(buf + OFF_NG, n_groups);
  kv_put_le64(buf + OFF_DATA, data_bytes);
  for (uint32_t i = 0; i < g->n_tokens; i++)
    kv_put_le32(buf + g->tokens_off + 4 * i, tokens[i]);
}

void kv_block_seal_meta(const kv_block_geom *g, const uint8_t block_hash[16],
                        const uint8_t parent_hash[16], const uint8_t model_hash[16],
                        const uint32_t *tokens, uint8_t *buf)
{
  uint32_t cks_end = kv_block_cksum_off(g, g->n_sections, 0);
  memset(buf, 0, g->cksum_off);
  memset(buf + cks_end, 0, g->meta_bytes - cks_end);
  put_fixed(buf, g, g->packed ? KV_BLOCK_VERSION_PACKED : KV_BLOCK_VERSION, KV_CODEC_RAW,
            g->meta_bytes, g->group_tokens, g->n_groups, g->data_bytes, block_hash, parent_hash,
            model_hash, tokens);
  for (uint32_t s = 0; s < g->n_sections && !g->packed; s++) {
    uint8_t *ent = buf + g->sectab_off + KV_BLOCK_SECT_ENTRY * s;
    kv_put_le64(ent, g->meta_bytes + (uint64_t)s * g->section_bytes);
    kv_put_le32(ent + 8, (uint32_t)g->section_bytes);
    kv_put_le32(ent + 12, g->n_groups);
    kv_put_le64(ent + 16, xxh64(buf + kv_block_cksum_off(g, s, 0), 8u * g->n_groups));
  }
  /* format 4 (packed): the meta checksum also covers the group checksums (no section table
   * holds their digests) */
  uint32_t mck_end = g->packed ? cks_end : g->cksum_off;
  kv_put_le64(buf + OFF_METACK, xxh64(buf + g->tokens_off, mck_end - g->tokens_off));
  kv_put_le64(buf + OFF_HDRCK, xxh64(buf, OFF_HDRCK));
}

void kv_block_seal(const kv_block_geom *g, const uint8_t block_hash[16],
                   const uint8_t parent_hash[16], const uint8_t model_hash[16],
                   const uint32_t *tokens, uint8_t *buf)
{
  kv_block_checksum_sections(g, block_hash, 0, g->n_sections, buf);
  kv_block_seal_meta(g, block_hash, parent_hash, model_hash, tokens, buf);
}

/* The score region a header announces (flag bit 0): right after the object, its size from
 * the block's shape and the bits; obj.total_bytes then includes it (FORMAT.md §3c). */
static kvdb_status parse_score(const uint8_t *buf, kv_block_hdr *out)
{
  if (!(out->flags & KV_BLOCK_F_SCORE))
    return KVDB_OK;
  unsigned bits = buf[OFF_RSV16], ver = buf[OFF_RSV16 + 1];
  uint64_t off = kv_get_le64(buf + OFF_RSV64);
  if (ver != 0 && ver != KV_SCORE_COPY_VERSION_CENTERED)
    return kv_fail(ver > KV_SCORE_COPY_VERSION_CENTERED ? KVDB_VERSION : KVDB_CORRUPT,
                   "block header announces score copies of version %u (this build reads 1 and "
                   "2)", ver);
  unsigned variant = ver != 0 ? KV_SCORE_COPY_CENTERED : 0;
  kv_sregion r;
  if (kv_sregion_init(&r, &out->g, bits, variant) != KVDB_OK)
    return kv_fail(KVDB_CORRUPT, "block header announces score copies of %u bits: %s", bits,
                   kvdb_errmsg());
  if (off != out->obj.total_bytes)
    return kv_fail(KVDB_CORRUPT,
                   "block header puts its score region at %llu, not after its data (%llu)",
                   (unsigned long long)off, (unsigned long long)out->obj.total_bytes);
  out->score_bits = bits;
  out->score_variant = variant;
  out->score_off = off;
  out->score_bytes = r.bytes;
  out->obj.total_bytes += r.bytes;
  return KVDB_OK;
}

void kv_block_mark_score(uint8_t *buf, unsigned bits, unsigned variant, uint64_t score_off)
{
  kv_put_le16(buf + OFF_FLAGS, (uint16_t)(kv_get_le16(buf + OFF_FLAGS) | KV_BLOCK_F_SCORE));
  buf[OFF_RSV16] = (uint8_t)bits;
  buf[OFF_RSV16 + 1] = variant != 0 ? (uint8_t)KV_SCORE_COPY_VERSION_CENTERED : 0;
  kv_put_le64(buf + OFF_RSV64, score_off);
  kv_put_le64(buf + OFF_HDRCK, xxh64(buf, OFF_HDRCK));
}

kvdb_status kv_block_parse_header(const uint8_t *buf, size_t len, kv_block_hdr *out)
{
  memset(out, 0, sizeof *out);
  if (len < KV_BLOCK_HDR_BYTES)
    return kv_fail(KVDB_CORRUPT, "block header truncated: %zu of %u bytes", len,
                   KV_BLOCK_HDR_BYTES);
  uint32_t magic = kv_get_le32(buf + OFF_MAGIC);
  if (magic != KV_BLOCK_MAGIC)
    return kv_fail(KVDB_CORRUPT, "bad block magic 0x%08x", magic);
  if (kv_get_le64(buf + OFF_HDRCK) != xxh64(buf, OFF_HDRCK))
    return kv_fail(KVDB_CORRUPT, "block header checksum mismatch");
  uint32_t version = kv_get_le16(buf + OFF_VERSION);
  if (version > KV_BLOCK_VERSION_MAX)
    return kv_fail(KVDB_VERSION, "block format version %u is newer than %u", version,
                   KV_BLOCK_VERSION_MAX);
  if (version == 0)
    return kv_fail(KVDB_CORRUPT, "block format version 0");
  uint32_t flags = kv_get_le16(buf + OFF_FLAGS);
  if ((flags & ~KV_BLOCK_F_SCORE) != 0 ||
      (!(flags & KV_BLOCK_F_SCORE) && (buf[OFF_RSV16] != 0 || buf[OFF_RSV16 + 1] != 0 ||
                                       kv_get_le64(buf + OFF_RSV64) != 0)))
    return kv_fail(KVDB_CORRUPT, "reserved block header field is not zero");
  out->version = version;
  out->flags = flags;
  out->codec = buf[OFF_CODEC];
  uint32_t want_codec = version == 1 || version == KV_BLOCK_VERSION_PACKED ? KV_CODEC_RAW
                        : version == 2 ? KV_CODEC_SECTIONS
                                       : KV_CODEC_FRAMES;
  if (version == KV_BLOCK_VERSION_PCPR) /* packed compressed: sections or frames */
    want_codec = out->codec == KV_CODEC_FRAMES ? KV_CODEC_FRAMES : KV_CODEC_SECTIONS;
  if (out->codec != want_codec)
    return kv_fail(KVDB_CORRUPT, "block format %u with codec %u", version, out->codec);
  memcpy(out->block_hash, buf + OFF_HASH, 16);
  memcpy(out->parent_hash, buf + OFF_PARENT, 16);
  memcpy(out->model_hash, buf + OFF_MODEL, 16);
  out->meta_checksum = kv_get_le64(buf + OFF_METACK);
  kvdb_status rc = kv_block_geom_init(&out->g, kv_get_le32(buf + OFF_NL), kv_get_le32(buf + OFF_NH),
                                      kv_get_le32(buf + OFF_HD), buf[OFF_DTYPE],
                                      kv_get_le32(buf + OFF_BT), kv_get_le32(buf + OFF_NTOK));
  if (rc != KVDB_OK)
    return kv_fail(KVDB_CORRUPT, "block header: %s", kvdb_errmsg());
  const kv_block_geom *g = &out->g;
  if (kv_get_le32(buf + OFF_NSECT) != g->n_sections)
    return kv_fail(KVDB_CORRUPT, "block header geometry does not match its dimensions");
  if (version == KV_BLOCK_VERSION_PACKED) {
    kv_block_geom_pack(&out->g);
    if (flags & KV_BLOCK_F_SCORE)
      return kv_fail(KVDB_CORRUPT, "packed block object announces a score region");
  }
  if (version == 1 || version == KV_BLOCK_VERSION_PACKED) {
    if (kv_get_le32(buf + OFF_META) != g->meta_bytes ||
        kv_get_le32(buf + OFF_GT) != g->group_tokens || kv_get_le32(buf + OFF_NG) != g->n_groups ||
        kv_get_le64(buf + OFF_DATA) != g->data_bytes)
      return kv_fail(KVDB_CORRUPT, "block header geometry does not match its dimensions");
    out->obj = (kv_block_geom_obj){g->meta_bytes, g->data_bytes, g->total_bytes};
    return parse_score(buf, out);
  }
  /* formats 2 and 3: the data region holds data_pages pages of encoded sections or frames;
   * format 5 (packed): data_bytes (a multiple of 64) in data_pages checksummed pages */
  uint32_t pages = kv_get_le32(buf + OFF_NG);
  uint64_t max_pages = 2 * (g->data_bytes / KV_PAGE) + g->n_sections + 1;
  if (kv_get_le32(buf + OFF_GT) != 0 || pages == 0 || pages > max_pages)
    return kv_fail(KVDB_CORRUPT, "compressed block header claims %u data pages (at most %llu)",
                   pages, (unsigned long long)max_pages);
  if (version == KV_BLOCK_VERSION_PCPR) {
    uint64_t db = kv_get_le64(buf + OFF_DATA);
    if (flags & KV_BLOCK_F_SCORE)
      return kv_fail(KVDB_CORRUPT, "packed block object announces a score region");
    if (db == 0 || db % KV_BLOCK_PACK_ALIGN != 0 || (db + KV_PAGE - 1) / KV_PAGE != pages)
      return kv_fail(KVDB_CORRUPT, "packed compressed block header: %llu data bytes in %u pages",
                     (unsigned long long)db, pages);
    kv_cblock_layout_init_packed(g, db, &out->cl);
  } else {
    kv_cblock_layout_init(g, (uint64_t)pages * KV_PAGE, &out->cl);
  }
  if (kv_get_le32(buf + OFF_META) != out->cl.meta_bytes ||
      kv_get_le64(buf + OFF_DATA) != out->cl.data_bytes)
    return kv_fail(KVDB_CORRUPT, "compressed block header sizes do not match its page count");
  out->obj = (kv_block_geom_obj){out->cl.meta_bytes, out->cl.data_bytes, out->cl.total_bytes};
  return parse_score(buf, out);
}

kvdb_status kv_block_verify_meta(const kv_block_hdr *h, const uint8_t *meta)
{
  const kv_block_geom *g = &h->g;
  if (KV_HDR_CPR(h)) {
    const kv_cblock_layout *l = &h->cl;
    if (xxh64(meta + g->tokens_off, l->pcks_end - g->tokens_off) != h->meta_checksum)
      return kv_fail(KVDB_CORRUPT,
                     "block meta checksum mismatch (tokens, section table or page checksums)");
    uint64_t at = l->meta_bytes, end = l->meta_bytes + l->data_bytes, prev_off = 0;
    uint32_t prev_len = 0, prev_idx = 0;
    for (uint32_t s = 0; s < g->n_sections; s++) {
      const uint8_t *ent = meta + l->sectab_off + l->entry * s;
      uint64_t off;
      uint32_t len;
      kv_cblock_section(h, meta, s, &off, &len);
      /* format 5 entries: codec at 8, reserved 9, frame index 10; formats 2-3: 12, 15, 13 */
      uint8_t codec = kv_cblock_codec(h, meta, s);
      int rsv0 = l->packed ? ent[9] == 0 : ent[15] == 0 && kv_get_le64(ent + 16) == 0;
      if (KV_HDR_FRAMES(h)) {
        /* format 3: a frame's first section starts where the previous frame ends; the others
         * repeat its offset and length with the next index */
        uint32_t idx = kv_cblock_frame_index(h, meta, s);
        int ok = codec == KV_SECT_FRAME && rsv0;
        if (idx == 0)
          ok = ok && off == at && len >= 24 && off + len <= end;
        else
          ok = ok && s > 0 && off == prev_off && len == prev_len && idx == prev_idx + 1;
        if (!ok)
          return kv_fail(KVDB_CORRUPT, "section table entry %u (offset %llu, length %u, frame "
                                       "index %u) is not a frame of the data region",
                         s, (unsigned long long)off, len, idx);
        prev_off = off;
        prev_len = len;
        prev_idx = idx;
        at = off + len;
        continue;
      }
      int rsv = l->packed ? rsv0 && kv_get_le16(ent + 10) == 0
                          : rsv0 && ent[13] == 0 && ent[14] == 0;
      if (off != at || len < 32 || off + len > end || codec == 0 || !rsv)
        return kv_fail(KVDB_CORRUPT, "section table entry %u (offset %llu, length %u) is not the "
                                     "next section of the data region",
                       s, (unsigned long long)off, len);
      at = off + len;
    }
    /* data_bytes is the sections rounded up to a page (format 5: to 64 bytes) */
    if (end - at >= (l->packed ? KV_BLOCK_PACK_ALIGN : KV_PAGE))
      return kv_fail(KVDB_CORRUPT, "compressed block has %llu unused data bytes",
                     (unsigned long long)(end - at));
    return KVDB_OK;
  }
  if (g->packed) { /* format 4: tokens and group checksums, no section table */
    if (xxh64(meta + g->tokens_off, kv_block_cksum_off(g, g->n_sections, 0) - g->tokens_off) !=
        h->meta_checksum)
      return kv_fail(KVDB_CORRUPT, "block meta checksum mismatch (tokens or group checksums)");
    return KVDB_OK;
  }
  if (xxh64(meta + g->tokens_off, g->cksum_off - g->tokens_off) != h->meta_checksum)
    return kv_fail(KVDB_CORRUPT, "block meta checksum mismatch (tokens or section table)");
  for (uint32_t s = 0; s < g->n_sections; s++) {
    const uint8_t *ent = meta + g->sectab_off + KV_BLOCK_SECT_ENTRY * s;
    if (kv_get_le64(ent) != g->meta_bytes + (uint64_t)s * g->section_bytes ||
        kv_get_le32(ent + 8) != g->section_bytes || kv_get_le32(ent + 12) != g->n_groups)
      return kv_fail(KVDB_CORRUPT, "section table entry %u does not match the geometry", s);
    if (kv_get_le64(ent + 16) != xxh64(meta + kv_block_cksum_off(g, s, 0), 8u * g->n_groups))
      return kv_fail(KVDB_CORRUPT, "checksum table of section %u does not match its digest", s);
  }
  return KVDB_OK;
}

/* ---- compressed blocks (format 2) ---- */

void kv_cblock_layout_init(const kv_block_geom *g, uint64_t sections_bytes, kv_cblock_layout *l)
{
  l->sectab_off = g->sectab_off;
  l->pcks_off = l->sectab_off + KV_BLOCK_SECT_ENTRY * g->n_sections;
  l->data_pages = (uint32_t)((sections_bytes + KV_PAGE - 1) / KV_PAGE);
  l->pcks_end = l->pcks_off + 8u * l->data_pages;
  l->meta_bytes = KV_ALIGN_UP(l->pcks_end, KV_PAGE);
  l->data_bytes = (uint64_t)l->data_pages * KV_PAGE;
  l->total_bytes = l->meta_bytes + l->data_bytes;
  l->packed = 0;
  l->entry = KV_BLOCK_SECT_ENTRY;
}

void kv_cblock_layout_init_packed(const kv_block_geom *g, uint64_t sections_bytes,
                                  kv_cblock_layout *l)
{
  l->sectab_off = g->tokens_off + KV_ALIGN_UP(4u * g->n_tokens, 8u);
  l->pcks_off = l->sectab_off + KV_BLOCK_SECT_ENTRY_PCPR * g->n_sections;
  l->data_bytes = KV_ALIGN_UP(sections_bytes, (uint64_t)KV_BLOCK_PACK_ALIGN);
  l->data_pages = (uint32_t)((l->data_bytes + KV_PAGE - 1) / KV_PAGE);
  l->pcks_end = l->pcks_off + 8u * l->data_pages;
  l->meta_bytes = KV_ALIGN_UP(l->pcks_end, KV_BLOCK_PACK_ALIGN);
  l->total_bytes = l->meta_bytes + l->data_bytes;
  l->packed = 1;
  l->entry = KV_BLOCK_SECT_ENTRY_PCPR;
}

/* Section s's table entry: offset, length, codec id, frame index (format 5's 12-byte form or
 * formats 2-3's 24-byte one). */
static void put_entry(const kv_cblock_layout *l, uint8_t *buf, uint32_t s, uint64_t off,
                      uint32_t len, uint8_t codec, uint16_t idx)
{
  uint8_t *ent = buf + l->sectab_off + l->entry * s;
  if (l->packed) {
    kv_put_le32(ent, (uint32_t)off);
    kv_put_le32(ent + 4, len);
    ent[8] = codec;
    kv_put_le16(ent + 10, idx);
    return;
  }
  kv_put_le64(ent, off);
  kv_put_le32(ent + 8, len);
  ent[12] = codec;
  if (idx != 0)
    kv_put_le16(ent + 13, idx);
}

/* The page checksums of a sealed compressed object's data region, then the meta and header
 * checksums. */
static void seal_cblock_sums(const kv_block_geom *g, const kv_cblock_layout *l,
                             const uint8_t block_hash[16], uint8_t *buf)
{
  kv_block_hdr h;
  memcpy(h.block_hash, block_hash, 16);
  h.cl = *l;
  for (uint32_t p = 0; p < l->data_pages; p++)
    kv_put_le64(buf + l->pcks_off + 8u * p,
                kv_cblock_page_checksum(&h, p, buf + l->meta_bytes + (uint64_t)p * KV_PAGE));
  kv_put_le64(buf + OFF_METACK, xxh64(buf + g->tokens_off, l->pcks_end - g->tokens_off));
  kv_put_le64(buf + OFF_HDRCK, xxh64(buf, OFF_HDRCK));
}

uint64_t kv_cblock_page_checksum(const kv_block_hdr *h, uint32_t p, const uint8_t *page)
{
  /* the (0xffffffff << 32) half keeps these seeds apart from format 1's (section, group) */
  return xxh64_seed(page, kv_cblock_page_len(&h->cl, p),
                    kv_get_le64(h->block_hash) ^ ((0xffffffffull << 32) | p));
}

void kv_cblock_seal(const kv_block_geom *g, const kv_cblock_layout *l, const uint32_t *sect_len,
                    const uint8_t *sect_codec, const uint8_t block_hash[16],
                    const uint8_t parent_hash[16], const uint8_t model_hash[16],
                    const uint32_t *tokens, uint8_t *buf)
{
  memset(buf, 0, l->meta_bytes);
  put_fixed(buf, g, l->packed ? KV_BLOCK_VERSION_PCPR : 2, KV_CODEC_SECTIONS, l->meta_bytes, 0,
            l->data_pages, l->data_bytes, block_hash, parent_hash, model_hash, tokens);
  uint64_t at = l->meta_bytes;
  for (uint32_t s = 0; s < g->n_sections; s++) {
    put_entry(l, buf, s, at, sect_len[s], sect_codec[s], 0);
    at += sect_len[s];
  }
  seal_cblock_sums(g, l, block_hash, buf);
}

void kv_cblock_seal_frames(const kv_block_geom *g, const kv_cblock_layout *l, uint32_t n_frames,
                           const uint32_t *frame_first, const uint32_t *frame_len,
                           const uint8_t block_hash[16], const uint8_t parent_hash[16],
                           const uint8_t model_hash[16], const uint32_t *tokens, uint8_t *buf)
{
  memset(buf, 0, l->meta_bytes);
  put_fixed(buf, g, l->packed ? KV_BLOCK_VERSION_PCPR : 3, KV_CODEC_FRAMES, l->meta_bytes, 0,
            l->data_pages, l->data_bytes, block_hash, parent_hash, model_hash, tokens);
  uint64_t at = l->meta_bytes;
  for (uint32_t f = 0; f < n_frames; f++) {
    for (uint32_t s = frame_first[f]; s < frame_first[f + 1]; s++)
      put_entry(l, buf, s, at, frame_len[f], KV_SECT_FRAME, (uint16_t)(s - frame_first[f]));
    at += frame_len[f];
  }
  seal_cblock_sums(g, l, block_hash, buf);
}

uint32_t kv_cblock_frame_index(const kv_block_hdr *h, const uint8_t *meta, uint32_t s)
{
  if (!KV_HDR_FRAMES(h))
    return 0;
  const uint8_t *ent = meta + h->cl.sectab_off + h->cl.entry * s;
  return kv_get_le16(ent + (h->cl.packed ? 10 : 13));
}

uint8_t kv_cblock_codec(const kv_block_hdr *h, const uint8_t *meta, uint32_t s)
{
  const uint8_t *ent = meta + h->cl.sectab_off + h->cl.entry * s;
  return ent[h->cl.packed ? 8 : 12];
}

void kv_cblock_section(const kv_block_hdr *h, const uint8_t *meta, uint32_t s, uint64_t *off,
                       uint32_t *len)
{
  const uint8_t *ent = meta + h->cl.sectab_off + h->cl.entry * s;
  if (h->cl.packed) {
    *off = kv_get_le32(ent);
    *len = kv_get_le32(ent + 4);
    return;
  }
  *off = kv_get_le64(ent);
  *len = kv_get_le32(ent + 8);
}

kvdb_status kv_cblock_verify_pages(const kv_block_hdr *h, const uint8_t *buf, uint32_t p0,
                                   uint32_t p1, uint64_t *bad_offset)
{
  const kv_cblock_layout *l = &h->cl;
  if (p1 > l->data_pages)
    p1 = l->data_pages;
  for (uint32_t p = p0; p < p1; p++) {
    uint64_t off = l->meta_bytes + (uint64_t)p * KV_PAGE;
    if (kv_cblock_page_checksum(h, p, buf + off) != kv_get_le64(buf + l->pcks_off + 8u * p)) {
      *bad_offset = off;
      return KVDB_CORRUPT;
    }
  }
  return KVDB_OK;
}

kvdb_status kv_block_verify_sections(const kv_block_hdr *h, const uint8_t *buf, uint32_t s0,
                                     uint32_t s1, uint32_t *bad_section, uint64_t *bad_offset)
{
  const kv_block_geom *g = &h->g;
  if (s1 > g->n_sections)
    s1 = g->n_sections;
  if (s0 >= s1)
    return KVDB_OK;
  if (KV_HDR_CPR(h)) { /* the pages covering the sections' bytes */
    uint64_t a, b;
    uint32_t la, lb;
    kv_cblock_section(h, buf, s0, &a, &la);
    kv_cblock_section(h, buf, s1 - 1, &b, &lb);
    uint32_t p0 = (uint32_t)((a - h->cl.meta_bytes) / KV_PAGE);
    uint32_t p1 = (uint32_t)((b + lb - h->cl.meta_bytes + KV_PAGE - 1) / KV_PAGE);
    kvdb_status rc = kv_cblock_verify_pages(h, buf, p0, p1, bad_offset);
    if (rc != KVDB_OK) {
      /* name the section that holds the bad page */
      *bad_section = s0;
      for (uint32_t s = s0; s < s1; s++) {
        uint64_t o;
        uint32_t len;
        kv_cblock_section(h, buf, s, &o, &len);
        if (o + len > *bad_offset) {
          *bad_section = s;
          break;
        }
      }
    }
    return rc;
  }
  for (uint32_t s = s0; s < s1; s++) {
    for (uint32_t grp = 0; grp < g->n_groups; grp++) {
      uint64_t off = kv_block_group_off(g, s, grp);
      uint64_t want = kv_get_le64(buf + kv_block_cksum_off(g, s, grp));
      if (kv_block_group_checksum(h, s, grp, buf + off, g->group_stride) != want) {
        *bad_section = s;
        *bad_offset = off;
        return KVDB_CORRUPT;
      }
    }
  }
  return KVDB_OK;
}

kvdb_status kv_block_verify_data(const kv_block_hdr *h, const uint8_t *buf, uint32_t *bad_section,
                                 uint64_t *bad_offset)
{
  return kv_block_verify_sections(h, buf, 0, h->g.n_sections, bad_section, bad_offset);
}
