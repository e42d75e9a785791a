/* SPDX-License-Identifier: MIT */
/*
 * fpga/kernel/score_kernel_tb.c — C simulation testbench of kv_score_kernel (the Vitis csim
 * step, run with gcc): the kernel's score blocks must equal the CPU scorer's scores
 * (score, portable path) bit for bit and its on-chip top k must equal the streaming
 * top-k of those scores, for every row size the kernel takes (int8 head_dim 2..512, int4
 * 2..1024), 1, 2 and 8 query vectors (SUM and MAX), chunks starting anywhere on a word,
 * several sections in one buffer, k = 0, 1, 7, 64 and random code bytes (int8 -128, int4
 * nibble 0 included).
 */
#define _POSIX_C_SOURCE 200809L
#include "score_test.h"

#include "kernel/score_kernel.h"
#include "device.h"

static void test_shape(t_rng *r, uint32_t d, unsigned bits, uint32_t heads, kv_score_combine comb)
{
  uint32_t n = 300 + t_below(r, 700);
  float *k = malloc((size_t)n * d * 4), *q = malloc((size_t)heads * d * 4);
  for (size_t i = 0; i < (size_t)n * d; i++)
    k[i] = t_gauss(r) * (i % 13 == 0 ? 8.0f : 1.0f);
  for (size_t i = 0; i < (size_t)heads * d; i++)
    q[i] = t_gauss(r);
  kv_score_layout l;
  REQUIRE(kv_score_layout_init(&l, n, d, bits, NULL) == KV_SCORE_OK, "layout");
  /* two sections in one device buffer: a small one first, ours at a 4 KiB offset after it */
  uint64_t off = 8192;
  size_t bytes = (size_t)(off + l.total_bytes);
  uint8_t *dev = NULL;
  REQUIRE(posix_memalign((void **)&dev, 4096, bytes) == 0, "oom");
  memset(dev, 0x5a, off);
  REQUIRE(kv_score_copy_encode(KV_SCORE_F32, k, (size_t)d * 4, n, d, bits, dev + off,
                               (size_t)l.total_bytes, NULL, NULL) == KV_SCORE_OK,
          "encode");
  /* overwrite a third of the rows with random bytes: every code value occurs */
  for (uint32_t t = 0; t < n; t += 3)
    for (uint32_t b = 0; b < l.row_bytes; b++)
      dev[off + kv_score_layout_code_offset(&l, t) + b] = (uint8_t)t_next(r);
  kv_score_view v;
  REQUIRE(kv_score_copy_parse(dev + off, (size_t)l.total_bytes, &v, NULL) == KV_SCORE_OK, "parse");
  kv_score_query *qq;
  REQUIRE(kv_score_query_create(KV_SCORE_F32, q, heads, d, (size_t)d * 4, comb, &qq, NULL) ==
              KV_SCORE_OK,
          "query");
  uint8_t *qpack = NULL;
  REQUIRE(posix_memalign((void **)&qpack, 64, KV_FPGA_QUERY_BYTES) == 0, "oom");
  kv_fpga_err fe;
  REQUIRE(kv_fpga_query_pack(qq, qpack, KV_FPGA_QUERY_BYTES, &fe) == KV_FPGA_OK, "pack");
  float *ref = malloc((size_t)n * 4);
  REQUIRE(kv_score_tokens(qq, &v, 0, n, KV_SCORE_IMPL_PORTABLE, ref, NULL) == KV_SCORE_OK, "ref");
  kvk_pair *blocks = malloc((size_t)n * sizeof *blocks), topk[KVK_MAX_TOPK];
  uint32_t align = l.row_bytes >= 64 ? 1 : 64 / l.row_bytes; /* t0 granularity */
  const uint32_t ks[] = {0, 1, 7, 64};
  for (int c = 0; c < 4; c++) {
    uint32_t t0 = c == 0 ? 0 : t_below(r, n / align) * align;
    uint32_t m = c == 0 ? n : 1 + t_below(r, n - t0);
    uint32_t kk = ks[c], pos_base = 100000u * (uint32_t)c;
    memset(blocks, 0xee, (size_t)n * sizeof *blocks);
    kv_score_kernel((const kvk_word *)(void *)dev, (const kvk_word *)(void *)dev,
                    (const kvk_word *)(void *)qpack, blocks, topk,
                    (uint32_t)((off + KV_SCORE_COPY_HDR_BYTES) / 64),
                    (uint32_t)((off + l.meta_bytes) / 64), t0, m, pos_base, l.row_bytes, bits, kk);
    int bad = -1;
    for (uint32_t i = 0; i < m && bad < 0; i++)
      if (blocks[i].pos != pos_base + t0 + i || memcmp(&blocks[i].score, &ref[t0 + i], 4) != 0)
        bad = (int)i;
    CHECK(bad < 0, "d=%u bits=%u heads=%u comb=%d t0=%u n=%u: block entry %d = (%u, %.9g), CPU "
          "(%u, %.9g)",
          d, bits, heads, comb, t0, m, bad, blocks[bad < 0 ? 0 : bad].pos,
          (double)blocks[bad < 0 ? 0 : bad].score, pos_base + t0 + (bad < 0 ? 0 : bad),
          (double)ref[t0 + (bad < 0 ? 0 : bad)]);
    CHECK(blocks[m < n ? m : 0].pos == 0xeeeeeeeeu || m == n, "kernel wrote past n");
    if (kk > 0) {
      uint64_t mem[2 * KVK_MAX_TOPK + 256];
      kv_score_acc acc;
      REQUIRE(kv_score_acc_init(&acc, kk, mem, sizeof mem, NULL) == KV_SCORE_OK, "acc");
      kv_score_acc_push_scores(&acc, pos_base + t0, ref + t0, m);
      uint32_t pos[KVK_MAX_TOPK];
      float sc[KVK_MAX_TOPK];
      uint32_t got = kv_score_acc_finish(&acc, pos, sc);
      int tb = -1;
      for (uint32_t i = 0; i < got && tb < 0; i++)
        if (topk[i].pos != pos[i] || memcmp(&topk[i].score, &sc[i], 4) != 0)
          tb = (int)i;
      CHECK(got == (kk < m ? kk : m) && tb < 0, "d=%u bits=%u k=%u: on-chip top-k rank %d", d, bits,
            kk, tb);
    }
  }
  free(blocks);
  free(ref);
  free(qpack);
  kv_score_query_free(qq);
  free(dev);
  free(k);
  free(q);
}

int main(void)
{
  t_rng r = {2024};
  const struct {
    uint32_t heads;
    kv_score_combine c;
  } qs[] = {{1, KV_SCORE_SUM}, {4, KV_SCORE_SUM}, {2, KV_SCORE_MAX}, {8, KV_SCORE_MAX}};
  for (unsigned bits = 4; bits <= 8; bits += 4)
    for (uint32_t d = 2; d <= (bits == 8 ? 512u : 1024u); d *= 2)
      for (size_t i = 0; i < sizeof qs / sizeof qs[0]; i++)
        test_shape(&r, d, bits, qs[i].heads, qs[i].c);
  return t_finish("score_kernel_tb (C simulation)");
}
