/* SPDX-License-Identifier: MIT */
/*
 * format/score_region.c — geometry, sealing and verification of a block's score region
 * (block.h "THE SCORE REGION", FORMAT.md §3c).
 */
#include <xxhash.h>
#ifdef KVDB_HAVE_XXH_DISPATCH
#include <xxh_x86dispatch.h>
#endif

#include "block.h"

/* XXH3-64 with the caller's seed, then vzeroupper where the CPU has AVX: libxxhash's dispatched
 * code leaves the vector registers' upper halves dirty (the reason is in block.c). */
static uint64_t xxh64_seed(const void *p, size_t len, uint64_t seed)
{
  uint64_t h = XXH3_64bits_withSeed(p, len, seed);
#if defined(KVDB_HAVE_XXH_DISPATCH) && defined(__x86_64__) && defined(__GNUC__)
  if (__builtin_cpu_supports("avx"))
    __asm__ volatile("vzeroupper" ::: "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6",
                     "xmm7", "xmm8", "xmm9", "xmm10", "xmm11", "xmm12", "xmm13", "xmm14",
                     "xmm15");
#endif
  return h;
}

#define OFF_MAGIC 0
#define OFF_VERSION 4
#define OFF_BITS 5
#define OFF_RSV16 6
#define OFF_NCOPIES 8
#define OFF_COPYPAGES 12
#define OFF_TABLEPAGES 16
#define OFF_RSV32 20
#define OFF_TABLECK 24
#define OFF_RSV 32

kvdb_status kv_sregion_init(kv_sregion *r, const kv_block_geom *g, unsigned bits,
                            unsigned variant)
{
  memset(r, 0, sizeof *r);
  if (bits != 8 && bits != 4)
    return kv_fail(KVDB_INVALID, "score bits %u is not 8 or 4", bits);
  if (variant != 0 && variant != KV_SCORE_COPY_CENTERED)
    return kv_fail(KVDB_INVALID, "score copy variant %u is not 0 or %u", variant,
                   KV_SCORE_COPY_CENTERED);
  kv_score_err e;
  if (kv_score_layout_init_v(&r->layout, g->n_tokens, g->head_dim, bits, variant, &e) !=
      KV_SCORE_OK) {
    char msg[160];
    kv_score_errmsg(&e, msg, sizeof msg);
    return kv_fail(KVDB_INVALID, "score copies (version %u) of %u tokens x %u dims at %u bits: %s",
                   variant ? 2u : 1u, g->n_tokens, g->head_dim, bits, msg);
  }
  r->bits = bits;
  r->variant = variant;
  r->n_copies = g->n_layers * g->n_kv_heads;
  r->copy_bytes = r->layout.total_bytes;
  r->copy_pages = (uint32_t)(r->copy_bytes / KV_PAGE);
  r->table_pages = (uint32_t)KV_ALIGN_UP(KV_SREGION_HEAD_BYTES + 8ull * r->n_copies, KV_PAGE) /
                   KV_PAGE;
  r->bytes = (uint64_t)r->table_pages * KV_PAGE + (uint64_t)r->n_copies * r->copy_bytes;
  return KVDB_OK;
}

uint64_t kv_sregion_copy_checksum(const uint8_t block_hash[16], uint32_t c, const uint8_t *copy,
                                  uint64_t len)
{
  return xxh64_seed(copy, (size_t)len, kv_get_le64(block_hash) ^ ((0xfffffffeull << 32) | c));
}

static uint64_t table_checksum(const kv_sregion *r, const uint8_t block_hash[16],
                               const uint8_t *table)
{
  return xxh64_seed(table + KV_SREGION_HEAD_BYTES, 8u * (size_t)r->n_copies,
                    kv_get_le64(block_hash) ^ (0xfffffffdull << 32));
}

void kv_sregion_seal(const kv_sregion *r, const uint8_t block_hash[16], uint8_t *region)
{
  size_t table_bytes = (size_t)r->table_pages * KV_PAGE;
  memset(region, 0, table_bytes);
  kv_put_le32(region + OFF_MAGIC, KV_SREGION_MAGIC);
  region[OFF_VERSION] = r->variant ? KV_SREGION_VERSION_CENTERED : KV_SREGION_VERSION;
  region[OFF_BITS] = (uint8_t)r->bits;
  kv_put_le32(region + OFF_NCOPIES, r->n_copies);
  kv_put_le32(region + OFF_COPYPAGES, r->copy_pages);
  kv_put_le32(region + OFF_TABLEPAGES, r->table_pages);
  for (uint32_t c = 0; c < r->n_copies; c++)
    kv_put_le64(region + kv_sregion_cksum_off(c),
                kv_sregion_copy_checksum(block_hash, c, region + kv_sregion_copy_off(r, c),
                                         r->copy_bytes));
  kv_put_le64(region + OFF_TABLECK, table_checksum(r, block_hash, region));
}

static int zero(const uint8_t *p, size_t n)
{
  for (size_t i = 0; i < n; i++)
    if (p[i] != 0)
      return 0;
  return 1;
}

kvdb_status kv_sregion_check_head(const kv_sregion *r, const uint8_t *table)
{
  uint32_t magic = kv_get_le32(table + OFF_MAGIC);
  if (magic != KV_SREGION_MAGIC)
    return kv_fail(KVDB_CORRUPT, "bad score region magic 0x%08x", magic);
  unsigned want = r->variant ? KV_SREGION_VERSION_CENTERED : KV_SREGION_VERSION;
  if (table[OFF_VERSION] != want)
    return kv_fail(table[OFF_VERSION] > KV_SREGION_VERSION_CENTERED ? KVDB_VERSION : KVDB_CORRUPT,
                   "score region version %u, the block header says %u (this build reads 1 and "
                   "2)",
                   table[OFF_VERSION], want);
  if (table[OFF_BITS] != r->bits || kv_get_le32(table + OFF_NCOPIES) != r->n_copies ||
      kv_get_le32(table + OFF_COPYPAGES) != r->copy_pages ||
      kv_get_le32(table + OFF_TABLEPAGES) != r->table_pages)
    return kv_fail(KVDB_CORRUPT,
                   "score region head (bits %u, %u copies of %u pages, %u table pages) does not "
                   "match the block (%u, %u, %u, %u)",
                   table[OFF_BITS], kv_get_le32(table + OFF_NCOPIES),
                   kv_get_le32(table + OFF_COPYPAGES), kv_get_le32(table + OFF_TABLEPAGES),
                   r->bits, r->n_copies, r->copy_pages, r->table_pages);
  if (kv_get_le16(table + OFF_RSV16) != 0 || kv_get_le32(table + OFF_RSV32) != 0 ||
      !zero(table + OFF_RSV, KV_SREGION_HEAD_BYTES - OFF_RSV))
    return kv_fail(KVDB_CORRUPT, "reserved score region field is not zero");
  return KVDB_OK;
}

kvdb_status kv_sregion_verify_copy(const kv_sregion *r, const uint8_t block_hash[16],
                                   const uint8_t *region, uint32_t c, const uint8_t *copy,
                                   kv_score_view *view, uint64_t *bad_off)
{
  if (bad_off != NULL)
    *bad_off = kv_sregion_copy_off(r, c);
  uint64_t want = kv_get_le64(region + kv_sregion_cksum_off(c));
  if (kv_sregion_copy_checksum(block_hash, c, copy, r->copy_bytes) != want)
    return kv_fail(KVDB_CORRUPT, "score copy %u checksum mismatch", c);
  kv_score_err e;
  if (kv_score_copy_parse(copy, (size_t)r->copy_bytes, view, &e) != KV_SCORE_OK) {
    char msg[160];
    kv_score_errmsg(&e, msg, sizeof msg);
    return kv_fail(KVDB_CORRUPT, "score copy %u: %s", c, msg);
  }
  if (view->layout.variant != r->variant)
    return kv_fail(KVDB_CORRUPT, "score copy %u is a version-%u copy in a region of version-%u "
                                 "copies",
                   c, view->layout.variant ? 2u : 1u, r->variant ? 2u : 1u);
  if (view->layout.n_tokens != r->layout.n_tokens || view->layout.head_dim != r->layout.head_dim ||
      view->layout.bits != r->bits)
    return kv_fail(KVDB_CORRUPT, "score copy %u holds %u tokens x %u dims at %u bits, not %u x %u "
                                 "at %u",
                   c, view->layout.n_tokens, view->layout.head_dim, view->layout.bits,
                   r->layout.n_tokens, r->layout.head_dim, r->bits);
  return KVDB_OK;
}

kvdb_status kv_sregion_verify(const kv_sregion *r, const uint8_t block_hash[16],
                              const uint8_t *region, uint64_t *bad_off)
{
  if (bad_off != NULL)
    *bad_off = 0;
  KV_RET(kv_sregion_check_head(r, region));
  size_t table_end = KV_SREGION_HEAD_BYTES + 8u * (size_t)r->n_copies;
  if (kv_get_le64(region + OFF_TABLECK) != table_checksum(r, block_hash, region))
    return kv_fail(KVDB_CORRUPT, "score region table checksum mismatch");
  if (!zero(region + table_end, (size_t)r->table_pages * KV_PAGE - table_end))
    return kv_fail(KVDB_CORRUPT, "score region table padding is not zero");
  for (uint32_t c = 0; c < r->n_copies; c++) {
    kv_score_view v;
    KV_RET(kv_sregion_verify_copy(r, block_hash, region, c, region + kv_sregion_copy_off(r, c),
                                  &v, bad_off));
  }
  return KVDB_OK;
}
