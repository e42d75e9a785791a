/* SPDX-License-Identifier: MIT */
/*
 * tests/fuzz/make_seeds.c — writes the seed corpora of the engine's fuzz targets:
 *
 *     fuzz_make_seeds tests/fuzz/corpora
 *
 * writes corpora/block/ (block objects sealed by kv_block_seal, whole, cut short, damaged,
 * with the repair flags of fuzz_block.c), corpora/catalog/ (records from the catalog's own
 * encoders, and a few refused ones) and corpora/api_ops/ (op scripts for fuzz_api_ops.c that
 * reach every op) and corpora/rtier_value/ (remote-tier values of rtier_fixture.h's blocks for
 * fuzz_rtier_value.c: whole, cut short, damaged, asked for under the wrong hash) and
 * corpora/resp/ (a Redis server's reply streams for fuzz_resp.c, whole and broken). Output is
 * deterministic; rerun after a format change. Files found by
 * fuzzing are added beside these under their libFuzzer names.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "block.h"
#include "catalog/catalog.h"
#include "kvdb.h"
#include "ops/ops_int.h"
#include "rtier_fixture.h"

#include <unistd.h>

static const char *root;

static void put_file(const char *dir, const char *name, const uint8_t *a, size_t alen,
                     const uint8_t *b, size_t blen)
{
  char path[4096];
  snprintf(path, sizeof path, "%s/%s", root, dir);
  if (mkdir(path, 0755) != 0 && errno != EEXIST) {
    perror(path);
    exit(1);
  }
  snprintf(path, sizeof path, "%s/%s/%s", root, dir, name);
  FILE *f = fopen(path, "wb");
  if (f == NULL || fwrite(a, 1, alen, f) != alen || (blen && fwrite(b, 1, blen, f) != blen) ||
      fclose(f) != 0) {
    perror(path);
    exit(1);
  }
}

static int g_pack; /* make_block: a packed object (block format 4, FORMAT.md §3e) */

/* A sealed block object (caller frees); data bytes are a pattern, padding zero. */
static uint8_t *make_block(uint32_t nl, uint32_t nh, uint32_t hd, uint32_t dt, uint32_t bt,
                           uint32_t n, kv_block_geom *g)
{
  if (kv_block_geom_init(g, nl, nh, hd, dt, bt, n) != KVDB_OK) {
    fprintf(stderr, "make_seeds: %s\n", kvdb_errmsg());
    exit(1);
  }
  if (g_pack)
    kv_block_geom_pack(g);
  uint8_t *buf = calloc(1, g->total_bytes);
  uint32_t tok[4096];
  for (uint32_t i = 0; i < n; i++)
    tok[i] = 100 + i * 7;
  for (uint32_t s = 0; s < g->n_sections; s++)
    for (uint32_t grp = 0; grp < g->n_groups; grp++) {
      uint8_t *p = buf + kv_block_group_off(g, s, grp);
      uint32_t len = kv_block_group_len(g, grp);
      for (uint32_t i = 0; i < len; i++)
        p[i] = (uint8_t)(s * 31 + grp * 7 + i);
    }
  uint8_t h[16], parent[16], model[16];
  for (int i = 0; i < 16; i++) {
    h[i] = (uint8_t)(0xa0 + i);
    parent[i] = (uint8_t)(0x50 + i);
    model[i] = (uint8_t)(0x10 + i);
  }
  kv_block_seal(g, h, parent, model, tok, buf);
  return buf;
}

/* The block of make_block() with a score region of `bits` appended (FORMAT.md §3c): copies of
 * small synthetic keys (not the block's bytes), sealed with the block's hash, header marked. */
static uint8_t *with_score_region(uint8_t *b, const kv_block_geom *g, unsigned bits,
                                  unsigned variant, size_t *len)
{
  kv_sregion r;
  if (kv_sregion_init(&r, g, bits, variant) != KVDB_OK) {
    fprintf(stderr, "make_seeds: %s\n", kvdb_errmsg());
    exit(1);
  }
  uint8_t *o = calloc(1, g->total_bytes + r.bytes);
  uint16_t *rows = malloc((size_t)g->n_tokens * g->head_dim * 2);
  memcpy(o, b, g->total_bytes);
  free(b);
  uint8_t h[16];
  for (int i = 0; i < 16; i++)
    h[i] = (uint8_t)(0xa0 + i); /* make_block's block hash */
  for (uint32_t c = 0; c < r.n_copies; c++) {
    for (uint32_t i = 0; i < g->n_tokens * g->head_dim; i++)
      rows[i] = kv_score_f32_to_f16((float)((int)((i * 37 + c * 11) % 29) - 14) * 0.125f);
    if (kv_score_copy_encode_v(KV_SCORE_F16, rows, (size_t)g->head_dim * 2, g->n_tokens,
                               g->head_dim, bits, variant,
                               o + g->total_bytes + kv_sregion_copy_off(&r, c),
                               (size_t)r.copy_bytes, NULL, NULL) != KV_SCORE_OK) {
      fprintf(stderr, "make_seeds: score copy\n");
      exit(1);
    }
  }
  free(rows);
  kv_sregion_seal(&r, h, o + g->total_bytes);
  kv_block_mark_score(o, bits, variant, g->total_bytes);
  *len = g->total_bytes + r.bytes;
  return o;
}

static void score_seeds(void)
{
  kv_block_geom g;
  uint8_t f0 = 0, fscore = 0x10;
  size_t len;
  uint8_t *b = with_score_region(make_block(1, 2, 128, KVDB_F16, 32, 20, &g), &g, 8, 0, &len);
  put_file("block", "score8_paged_f16.bin", &f0, 1, b, len);
  put_file("block", "score8_table_only.bin", &f0, 1, b, g.total_bytes + KV_PAGE);
  b[g.total_bytes + KV_PAGE + 4096 + 9] ^= 0x20; /* a code byte of copy 0 */
  put_file("block", "score8_bad_copy.bin", &f0, 1, b, len);
  put_file("block", "score8_bad_copy_fix.bin", &fscore, 1, b, len);
  free(b);
  b = with_score_region(make_block(2, 1, 16, KVDB_F16, 16, 5, &g), &g, 4, 0, &len);
  put_file("block", "score4_packed_f16.bin", &f0, 1, b, len);
  free(b);
  /* version-2 (centered, rotated) copies: header byte 79 = 2, table version 2 */
  b = with_score_region(make_block(1, 2, 128, KVDB_F16, 32, 20, &g), &g, 4, KV_SCORE_COPY_CENTERED,
                        &len);
  put_file("block", "score4v2_paged_f16.bin", &f0, 1, b, len);
  b[g.total_bytes + KV_PAGE + 64 + 4 * 20 + 60] ^= 0x11; /* a center code of copy 0 */
  put_file("block", "score4v2_bad_center.bin", &f0, 1, b, len);
  put_file("block", "score4v2_bad_center_fix.bin", &fscore, 1, b, len);
  free(b);
}

static void block_seeds(void)
{
  kv_block_geom g;
  uint8_t f0 = 0, fall = 0x0f, fhdr = 0x08;
  uint8_t *b = make_block(2, 1, 16, KVDB_F16, 16, 5, &g); /* packed sections */
  put_file("block", "packed_f16.bin", &f0, 1, b, g.total_bytes);
  b[g.meta_bytes + 3] ^= 0x40;
  put_file("block", "packed_f16_bad_data.bin", &f0, 1, b, g.total_bytes);
  put_file("block", "packed_f16_bad_data_repair.bin", &fall, 1, b, g.total_bytes);
  free(b);
  b = make_block(1, 1, 128, KVDB_F16, 32, 20, &g); /* paged: two groups per section */
  put_file("block", "paged_f16.bin", &f0, 1, b, g.total_bytes);
  put_file("block", "paged_f16_meta_only.bin", &f0, 1, b, g.meta_bytes);
  put_file("block", "paged_f16_one_section.bin", &f0, 1, b, g.meta_bytes + g.section_bytes);
  free(b);
  b = make_block(1, 2, 32, KVDB_F32, 16, 16, &g);
  put_file("block", "packed_f32_repair.bin", &fall, 1, b, g.total_bytes);
  free(b);
  b = make_block(1, 1, 8, KVDB_BF16, 16, 16, &g);
  put_file("block", "bf16_header_only.bin", &f0, 1, b, KV_BLOCK_HDR_BYTES);
  b[4] = 2; /* format version 2: KVDB_VERSION */
  put_file("block", "version2_fix_header.bin", &fhdr, 1, b, KV_BLOCK_HDR_BYTES);
  free(b);
  /* packed raw objects (block format 4) */
  g_pack = 1;
  b = make_block(5, 4, 8, KVDB_F32, 16, 16, &g); /* stories260K's block */
  put_file("block", "v4_stories_f32.bin", &f0, 1, b, g.total_bytes);
  put_file("block", "v4_stories_f32_meta_only.bin", &f0, 1, b, g.meta_bytes);
  b[g.meta_bytes + 700] ^= 0x10;
  put_file("block", "v4_stories_f32_bad_data.bin", &f0, 1, b, g.total_bytes);
  put_file("block", "v4_stories_f32_bad_data_repair.bin", &fall, 1, b, g.total_bytes);
  free(b);
  b = make_block(1, 1, 128, KVDB_F16, 32, 20, &g); /* paged sections in a packed object */
  put_file("block", "v4_paged_f16.bin", &f0, 1, b, g.total_bytes);
  free(b);
  b = make_block(2, 1, 16, KVDB_F16, 16, 5, &g);
  b[4] = 5; /* format version 5 (packed compressed) with codec 0: KVDB_CORRUPT */
  put_file("block", "v5_fix_header.bin", &fhdr, 1, b, KV_BLOCK_HDR_BYTES);
  b[4] = 6; /* format version 6: KVDB_VERSION */
  put_file("block", "v6_fix_header.bin", &fhdr, 1, b, KV_BLOCK_HDR_BYTES);
  free(b);
  g_pack = 0;
  score_seeds();
}

static void catalog_seeds(void)
{
  uint8_t buf[72 + 4 * 64];
  kv_model_rec mr = {{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}, 32, 8, 128,
                     KVDB_F16, 256};
  kv_model_rec_encode(&mr, buf);
  put_file("catalog", "model.bin", buf, kv_model_rec_size(&mr), NULL, 0);
  kv_block_rec br = {.refcount = 2, .tier = KVDB_TIER_SSD, .n_tokens = 16, .segment = 3,
                     .offset = 8192, .bytes = 20480};
  memset(br.parent, 0x11, 16);
  memset(br.model, 0x22, 16);
  uint32_t tok[64];
  for (int i = 0; i < 64; i++)
    tok[i] = 1000u + (uint32_t)i;
  kv_block_rec_encode(&br, tok, buf);
  put_file("catalog", "block16.bin", buf, kv_block_rec_size(16), NULL, 0);
  br.n_tokens = 1;
  kv_block_rec_encode(&br, tok, buf);
  put_file("catalog", "block1.bin", buf, kv_block_rec_size(1), NULL, 0);
  buf[0] = 2; /* a newer record version */
  put_file("catalog", "block1_version2.bin", buf, kv_block_rec_size(1), NULL, 0);
  br.n_tokens = 16; /* a packed raw object (format 7): 64-byte offset and size */
  br.bflags = KV_BLK_PACKED;
  br.offset = 8192 + 20736;
  br.bytes = 20736;
  kv_block_rec_encode(&br, tok, buf);
  put_file("catalog", "block16_packed.bin", buf, kv_block_rec_size(16), NULL, 0);
  br.bflags = KV_BLK_PACKED | KV_BLK_COMPRESSED; /* a packed compressed object (format 9) */
  br.method = KVDB_METHOD_LOSSLESS;
  br.bytes = 9984;
  kv_block_rec_encode(&br, tok, buf);
  put_file("catalog", "block16_packed_compressed.bin", buf, kv_block_rec_size(16), NULL, 0);
  br.bflags = KV_BLK_PACKED | KV_BLK_COMPRESSED | KV_BLK_DROPS | KV_BLK_KEPTN; /* dropping */
  br.method = KVDB_METHOD_DROP;
  br.drop = 1;
  br.keep_permille = 8;
  kv_block_rec_encode(&br, tok, buf);
  put_file("catalog", "block16_packed_drop.bin", buf, kv_block_rec_size(16), NULL, 0);
  br.bflags = KV_BLK_PACKED | KV_BLK_COMPRESSED | KV_BLK_SCORE8; /* never with score copies */
  br.method = KVDB_METHOD_QUANT;
  br.bits = 8;
  br.drop = 0;
  br.keep_permille = 0;
  kv_block_rec_encode(&br, tok, buf);
  put_file("catalog", "block16_packed_score8.bin", buf, kv_block_rec_size(16), NULL, 0);
  br.bits = 0;
  br.bflags = 0;
  br.method = KVDB_METHOD_RAW;
  br.offset = 8192;
  br.bytes = 20480;
  uint8_t blocks[3 * 16];
  for (int i = 0; i < 48; i++)
    blocks[i] = (uint8_t)(i * 5);
  kv_ctx_rec cr = {.flags = 0, .n_blocks = 3, .n_tokens = 40, .bytes = 61440, .created_ms = 1,
                   .last_access_ms = 2};
  memset(cr.model, 0x22, 16);
  kv_ctx_rec_encode(&cr, blocks, buf);
  put_file("catalog", "context3.bin", buf, kv_ctx_rec_size(&cr, 3), NULL, 0);
  cr.flags = KV_CTX_EXPLICIT;
  cr.n_blocks = 1;
  cr.n_tokens = 7;
  kv_ctx_rec_encode(&cr, blocks, buf);
  put_file("catalog", "context_explicit.bin", buf, kv_ctx_rec_size(&cr, 1), NULL, 0);
  cr.flags = 0;
  cr.n_blocks = 2;
  cr.n_tokens = 20;
  if (kvdb_config_parse("int4", &cr.config) != KVDB_OK) { /* a version-2 record */
    fprintf(stderr, "make_seeds: %s\n", kvdb_errmsg());
    exit(1);
  }
  kv_ctx_rec_encode(&cr, blocks, buf);
  put_file("catalog", "context_int4.bin", buf, kv_ctx_rec_size(&cr, 2), NULL, 0);
  br.n_tokens = 16;
  br.bflags = KV_BLK_COMPRESSED;
  br.method = cr.config.method;
  br.bits = cr.config.bits;
  kv_block_rec_encode(&br, tok, buf);
  put_file("catalog", "block16_int4.bin", buf, kv_block_rec_size(16), NULL, 0);
  br.bflags |= KV_BLK_SCORE8; /* and a score region of int8 copies (format 3) */
  kv_block_rec_encode(&br, tok, buf);
  put_file("catalog", "block16_int4_score8.bin", buf, kv_block_rec_size(16), NULL, 0);
  /* token dropping (knorm90): offset 14 the permille (formats 2-7), then with flag bit 6 the
   * block's kept tokens (format 8, issue 16: the context's exact ratio) */
  br.bflags = KV_BLK_COMPRESSED | KV_BLK_DROPS;
  br.method = KVDB_METHOD_DROP;
  br.bits = 0;
  br.drop = KVDB_DROP_KNORM;
  br.keep_permille = 900;
  kv_block_rec_encode(&br, tok, buf);
  put_file("catalog", "block16_drop_permille.bin", buf, kv_block_rec_size(16), NULL, 0);
  br.bflags |= KV_BLK_KEPTN;
  br.keep_permille = 14;
  kv_block_rec_encode(&br, tok, buf);
  put_file("catalog", "block16_drop_kept.bin", buf, kv_block_rec_size(16), NULL, 0);
  br.keep_permille = 0;
  mr.score_bits = 4;
  kv_model_rec_encode(&mr, buf);
  put_file("catalog", "model_score4.bin", buf, kv_model_rec_size(&mr), NULL, 0);
  mr.rope_base = 500000.0f; /* version 2: the model's RoPE */
  mr.rope_style = 2;
  kv_model_rec_encode(&mr, buf);
  put_file("catalog", "model_rope.bin", buf, kv_model_rec_size(&mr), NULL, 0);
  { /* version 3: a calibration (kvdb_model_calibrate) of 2 layers x 2 KV heads x 8 dims, with
     * both plans, and one with K's weights only and no RoPE */
    kv_model_rec cm = mr;
    cm.n_layers = 2;
    cm.n_kv_heads = 2;
    cm.head_dim = 8;
    float w[32];
    kv_calib_opt p4[4] = {{4, 4, 256, 256}, {5, 3, 128, 256}, {3, 4, 256, 256}, {6, 5, 128, 256}};
    kv_calib_opt p2[4] = {{2, 2, 256, 256}, {3, 1, 128, 256}, {1, 2, 256, 256}, {2, 3, 256, 256}};
    for (int i = 0; i < 32; i++)
      w[i] = 0.25f + (float)(i % 5) * 0.375f;
    kv_calib c = {2, 2, 8, w, {p4, p2}, {4.5f, 2.5f}, 3, 384};
    static uint8_t cbuf[1024];
    kv_model_rec_encode_calib(&cm, &c, cbuf);
    put_file("catalog", "model_calib.bin", cbuf, kv_model_rec_calib_size(&cm, &c), NULL, 0);
    c.plan[0] = c.plan[1] = NULL;
    cm.rope_base = 0.0f;
    cm.rope_style = 0;
    kv_model_rec_encode_calib(&cm, &c, cbuf);
    put_file("catalog", "model_calib_weights.bin", cbuf, kv_model_rec_calib_size(&cm, &c), NULL,
             0);
    /* version 4: output gains (kvdb_model_set_output_gains), one per query head (4 per layer)
     * without a calibration, one per channel after the calibration of both plans */
    float gw[2 * 4 * 8];
    for (int i = 0; i < 64; i++)
      gw[i] = 0.125f + (float)(i % 7) * 0.5f;
    kv_model_gains gh = {2, 4, 1, gw}, gc = {2, 4, 8, gw};
    kv_model_rec_encode_full(&cm, NULL, &gh, cbuf);
    put_file("catalog", "model_gains.bin", cbuf, kv_model_rec_full_size(&cm, NULL, &gh), NULL, 0);
    c.plan[0] = p4;
    c.plan[1] = p2;
    cm.rope_base = 500000.0f;
    cm.rope_style = 2;
    kv_model_rec_encode_full(&cm, &c, &gc, cbuf);
    put_file("catalog", "model_calib_gains.bin", cbuf, kv_model_rec_full_size(&cm, &c, &gc), NULL,
             0);
  }
  static kv_profile_rec pr;
  pr.n_probes = 8;
  pr.measured_ms = 1700000000000ull;
  pr.n_entries = 2;
  pr.e[0].bytes = 1 << 20;
  pr.e[0].quality = 1.0;
  pr.e[1].config = cr.config;
  pr.e[1].bytes = 300000;
  pr.e[1].quality = 0.9969;
  pr.e[1].rel_l2 = 0.05;
  pr.e[1].reported_quality = -1.0;
  uint8_t pbuf[256];
  kv_profile_rec_encode(&pr, pbuf);
  put_file("catalog", "profile2.bin", pbuf, kv_profile_rec_size(&pr), NULL, 0);
  /* version 2: measured with output gains (the weighted quality, the cosine, the worst head) */
  pr.e[1].flags = KVDB_PROFILE_WEIGHTED;
  pr.e[1].cosine = 0.9981;
  pr.e[1].worst_head = 0.9712;
  pr.e[0].cosine = pr.e[0].worst_head = 1.0;
  kv_profile_rec_encode(&pr, pbuf);
  put_file("catalog", "profile_weighted.bin", pbuf, kv_profile_rec_size(&pr), NULL, 0);
  kv_seg_rec sr = {.tier = KVDB_TIER_SSD, .state = KV_SEG_SEALED, .owner_pid = 1234,
                   .end = 1 << 20, .live_bytes = 4096 * 9, .live_blocks = 3};
  kv_seg_rec_encode(&sr, buf);
  put_file("catalog", "segment.bin", buf, kv_seg_rec_size(), NULL, 0);
  put_file("catalog", "segment_truncated.bin", buf, kv_seg_rec_size() - 1, NULL, 0);
}

/* Opcodes of fuzz_api_ops.c */
enum { PUT, PUT2, GET, LOOKUP, DEL, GET_TOKENS, COMPACT, REOPEN, VERIFY, PUT_BLOCK, GET_BLOCK,
       DEL_BLOCK, COUNT, CORRUPT_SEG, CORRUPT_CAT };

static void api_seed(const char *name, const uint8_t *s, size_t n)
{
  put_file("api_ops", name, s, n, NULL, 0);
}

static void api_seeds(void)
{
  /* recipe byte: family in bits 0..1, variant in bits 2..4; length byte: 1 + b % 96 tokens */
  static const uint8_t basic[] = {
    0x00,
    PUT, 0, 62,  PUT, 4, 69,  PUT2, 1, 30,  GET, 0, 95,  LOOKUP, 5, 49,  LOOKUP, 8, 44,
    GET_TOKENS, 0, 1, 3, 0, 17, 60,  COUNT,  DEL, 0,  GET, 0, 95,  LOOKUP, 4, 80,
    COMPACT, 200,  REOPEN,  VERIFY,  COUNT,  GET, 4, 95};
  api_seed("basic.bin", basic, sizeof basic);
  /* durable puts of many distinct contexts seal segments; deletes then make them sparse */
  uint8_t seal[256] = {0x01};
  size_t n = 1;
  for (int i = 0; i < 28; i++) {
    seal[n++] = PUT;
    seal[n++] = (uint8_t)(i & 31);
    seal[n++] = (uint8_t)(60 + i);
  }
  for (int i = 0; i < 12; i++) {
    seal[n++] = DEL;
    seal[n++] = (uint8_t)(i * 3);
  }
  seal[n++] = COMPACT;
  seal[n++] = 255;
  seal[n++] = VERIFY;
  seal[n++] = COUNT;
  seal[n++] = GET;
  seal[n++] = 7;
  seal[n++] = 90;
  api_seed("seal_and_compact.bin", seal, n);
  static const uint8_t explicit_keys[] = {
    0x02,
    PUT_BLOCK, 1, 3, 15, 10,  PUT_BLOCK, 2, 3, 4, 0,  PUT_BLOCK, 1, 3, 15, 10,
    PUT_BLOCK, 1, 5, 7, 2,  GET_BLOCK, 1, 0, 0,  GET_BLOCK, 1, 1, 0,  GET_BLOCK, 2, 2, 3, 5,
    COUNT,  DEL_BLOCK, 1,  DEL_BLOCK, 1,  GET_BLOCK, 1, 0, 0,  PUT, 3, 40,  COUNT,  REOPEN,
    GET_BLOCK, 2, 1, 0};
  api_seed("explicit_keys.bin", explicit_keys, sizeof explicit_keys);
  static const uint8_t damaged_segment[] = {
    0x02,
    PUT, 0, 62,  PUT, 4, 69,  PUT, 2, 95,  REOPEN,  CORRUPT_SEG, 0, 1, 9, 0x20,
    GET, 0, 62,  GET, 4, 95,  LOOKUP, 2, 95,  GET_TOKENS, 1, 0, 2, 5, 40,  VERIFY,
    CORRUPT_SEG, 0, 0, 3, 0x01,  GET, 2, 95,  COMPACT, 255,  VERIFY};
  api_seed("damaged_segment.bin", damaged_segment, sizeof damaged_segment);
  static const uint8_t damaged_catalog[] = {
    0x00,
    PUT, 0, 62,  PUT, 4, 69,  PUT_BLOCK, 3, 1, 9, 0,
    CORRUPT_CAT, 1, 0, 0, 8, 0x80,  GET, 0, 95,  LOOKUP, 4, 69,  COUNT,
    CORRUPT_CAT, 2, 1, 1, 20, 0,  GET_TOKENS, 1, 0, 1, 3,  DEL, 1,  VERIFY,
    CORRUPT_CAT, 3, 0, 2, 3, 0, 1, 2, 3,  COMPACT, 255,  REOPEN,  PUT, 1, 50,  GET, 1, 50};
  api_seed("damaged_catalog.bin", damaged_catalog, sizeof damaged_catalog);
  /* a block record whose size field says petabytes: verify reports it without reading it (it
   * used to stop with KVDB_NOMEM) and compaction leaves it alone */
  static const uint8_t huge_block_bytes[] = {
    0x00,
    PUT, 0, 62,  CORRUPT_CAT, 1, 0, 0, 38, 0x10,  VERIFY,  COMPACT, 255,  VERIFY};
  api_seed("huge_block_bytes.bin", huge_block_bytes, sizeof huge_block_bytes);
  static const uint8_t direct_uring[] = {
    0x0d,
    PUT, 0, 95,  PUT, 1, 95,  GET, 0, 95,  GET_TOKENS, 0, 1, 4, 0, 31, 32, 94,  REOPEN,
    GET, 1, 95,  DEL, 0,  DEL, 0,  COUNT,  VERIFY};
  api_seed("direct_uring.bin", direct_uring, sizeof direct_uring);
}

/* The values of the fixture's blocks, as fuzz_rtier_value reads them: hash, then value. */
static void rtier_seeds(void)
{
  char dir[4096];
  const char *base = getenv("TMPDIR");
  snprintf(dir, sizeof dir, "%s/kvdb-seeds-rtier-XXXXXX", base && *base ? base : "/tmp");
  if (mkdtemp(dir) == NULL) {
    perror(dir);
    exit(1);
  }
  rf_fixture f;
  rf_fixture_make(&f, dir);
  for (uint32_t c = 0; c < RF_CTX; c++)
    for (uint32_t b = 0; b < RF_BLOCKS; b++) {
      uint8_t *v;
      size_t len;
      if (kv_rtier_value_make(f.db, RF_NS_TAG, f.hash[c][b].b, &v, &len) != KVDB_OK) {
        fprintf(stderr, "rtier seeds: %s\n", kvdb_errmsg());
        exit(1);
      }
      const uint8_t *h = f.hash[c][b].b;
      char name[64];
      snprintf(name, sizeof name, "c%u_b%u_%s.bin", c, b, RF_CONFIG[c]);
      put_file("rtier_value", name, h, 16, v, len);
      snprintf(name, sizeof name, "c%u_b%u_short.bin", c, b);
      put_file("rtier_value", name, h, 16, v, len - 100);
      if (b == 0) { /* damaged copies of each context's first block */
        static const size_t at[] = {8, 30, 50, 70, 84, 300, 5000};
        for (size_t i = 0; i < sizeof at / sizeof at[0]; i++) {
          if (at[i] >= len)
            continue;
          v[at[i]] ^= 0x10;
          snprintf(name, sizeof name, "c%u_flip%zu.bin", c, at[i]);
          put_file("rtier_value", name, h, 16, v, len);
          v[at[i]] ^= 0x10;
        }
        snprintf(name, sizeof name, "c%u_wrong_hash.bin", c); /* block 1's hash */
        put_file("rtier_value", name, f.hash[c][1].b, 16, v, len);
      }
      free(v);
    }
  kvdb_close(f.db);
  for (uint32_t c = 0; c < RF_CTX; c++)
    free(f.ref[c]);
  char cmd[4200];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  if (system(cmd) != 0)
    fprintf(stderr, "could not remove %s\n", dir);
}

/* A Redis server's replies for fuzz_resp.c: a batch of GETs (68 KiB values as the remote tier
 * stores a 16-token block, nil, GETRANGE envelopes), SET's and DEL's, errors and redirects,
 * and broken streams (cut, without CRLF, bad lengths, types a batch never gets). */
static void resp_seed(const char *name, const char *s, size_t n)
{
  put_file("resp", name, (const uint8_t *)s, n, NULL, 0);
}

static void resp_seeds(void)
{
  size_t vlen = 69776, cap = 3 * (vlen + 32) + 4096, n = 0;
  char *b = malloc(cap);
  for (int v = 0; v < 2; v++) {
    n += (size_t)snprintf(b + n, cap - n, "$%zu\r\n", vlen);
    for (size_t i = 0; i < vlen; i++)
      b[n++] = (char)(i * 131 + (size_t)v * 7 + (i >> 9));
    b[n++] = '\r';
    b[n++] = '\n';
  }
  n += (size_t)snprintf(b + n, cap - n, "$-1\r\n$0\r\n\r\n$3\r\nabc\r\n");
  resp_seed("get_values.bin", b, n);
  resp_seed("get_cut.bin", b, vlen / 2);
  resp_seed("get_cut_payload.bin", b, vlen + 8);
  b[vlen + 8] = 'X'; /* the first value's CRLF damaged */
  resp_seed("get_no_crlf.bin", b, n);
  n = 0;
  for (int v = 0; v < 16; v++) {
    n += (size_t)snprintf(b + n, cap - n, "$144\r\n");
    for (int i = 0; i < 144; i++)
      b[n++] = (char)(v * 3 + i);
    n += (size_t)snprintf(b + n, cap - n, "\r\n");
  }
  resp_seed("getrange.bin", b, n);
  free(b);
  static const char ok[] = "+OK\r\n+OK\r\n+OK\r\n:1\r\n:0\r\n:-7\r\n+OK\r\n";
  resp_seed("set_del.bin", ok, sizeof ok - 1);
  static const char er[] = "-MOVED 3999 127.0.0.1:6381\r\n-ASK 3999 127.0.0.1:6381\r\n+OK\r\n"
                           "$2\r\nhi\r\n-OOM command not allowed when used memory > 'maxmemory'.\r\n"
                           "-ERR wrong number of arguments\r\n";
  resp_seed("errors.bin", er, sizeof er - 1);
  static const char *const bad[] = {"$abc\r\n", "$-2\r\n", "*2\r\n$1\r\na\r\n$1\r\nb\r\n",
                                    "$99999999999\r\nx\r\n", "%1\r\n+a\r\n+b\r\n", "\r\n",
                                    ":12x\r\n", "$5\r\nhelloXY", "+O\0K\r\n", "$-\r\n"};
  char name[32];
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    snprintf(name, sizeof name, "bad%zu.bin", i);
    resp_seed(name, bad[i], i == 8 ? 6 : strlen(bad[i]));
  }
  char *lng = malloc(5000);
  lng[0] = '-';
  memset(lng + 1, 'e', 4999);
  resp_seed("long_line.bin", lng, 5000);
  free(lng);
}

int main(int argc, char **argv)
{
  if (argc != 2) {
    fprintf(stderr, "usage: fuzz_make_seeds CORPORA_DIR\n");
    return 2;
  }
  root = argv[1];
  block_seeds();
  catalog_seeds();
  api_seeds();
  rtier_seeds();
  resp_seeds();
  printf("seeds written under %s/{block,catalog,api_ops,rtier_value,resp}\n", root);
  return 0;
}
