/* SPDX-License-Identifier: MIT */
/*
 * fpga/kernel/score_kernel.c — near-data token scoring on the SmartSSD's FPGA (HillInfer §4.4
 * CEC), in plain C11 with #pragma HLS: Vitis HLS synthesizes it (v++ -c -k kv_score_kernel), and
 * gcc compiles the very same file for the emulated device and the C simulation (pragmas are
 * ignored there: -Wno-unknown-pragmas).
 *
 * Dataflow of one run (one chunk of one section, see score_kernel.h):
 *   1. the query is loaded once into on-chip arrays (q pinned in BRAM/registers, partitioned so
 *      that a whole 64-lane word of products is formed per cycle);
 *   2. the keys stream in as 512-bit words (one AXI burst per page); per word, 64 lanes (int8)
 *      or 128 nibbles (int4) are multiplied by the query and summed by an unrolled adder tree;
 *      rows shorter than a word tap the tree at their level (several tokens per word), rows of
 *      64 bytes and more accumulate one tree sum per word;
 *   3. a finished token gets its float score (the CPU scorer's exact sequence of operations),
 *      is written to the score block and offered to a systolic insertion array holding the
 *      chunk's best k (compare-and-swap down a fully partitioned register array).
 * No softmax, no scaling by 1/sqrt(d): the raw inner product ranks the same (CEC).
 */
#include "score_kernel.h"

typedef union kvk_bits {
  uint32_t u;
  float f;
} kvk_bits;

void kv_score_kernel(const kvk_word *keys, const kvk_word *meta, const kvk_word *query,
                     kvk_pair *blocks, kvk_pair *topk, uint32_t scale_word, uint32_t code_word,
                     uint32_t t0, uint32_t n, uint32_t pos_base, uint32_t row_bytes,
                     uint32_t bits, uint32_t k)
{
#pragma HLS INTERFACE m_axi port = keys bundle = gmem0 offset = slave max_read_burst_length = 64
#pragma HLS INTERFACE m_axi port = meta bundle = gmem1 offset = slave
#pragma HLS INTERFACE m_axi port = query bundle = gmem1 offset = slave
#pragma HLS INTERFACE m_axi port = blocks bundle = gmem2 offset = slave max_write_burst_length = 64
#pragma HLS INTERFACE m_axi port = topk bundle = gmem2 offset = slave
#pragma HLS INTERFACE s_axilite port = return

  /* 1. the query, pinned on chip */
  int8_t q[KVK_MAX_VEC][KVK_MAX_D];
#pragma HLS ARRAY_PARTITION variable = q cyclic factor = 128 dim = 2
  float qs[KVK_MAX_VEC];
#pragma HLS ARRAY_PARTITION variable = qs complete
  kvk_word hdr = query[0];
  uint32_t n_vec = kvk_rd32(hdr.b);
  if (n_vec < 1)
    n_vec = 1;
  if (n_vec > KVK_MAX_VEC)
    n_vec = KVK_MAX_VEC;
  for (uint32_t v = 0; v < KVK_MAX_VEC; v++) {
#pragma HLS UNROLL
    kvk_bits s;
    s.u = kvk_rd32(hdr.b + 8 + 4 * v);
    qs[v] = s.f;
  }

  for (uint32_t w = 0; w < KVK_MAX_VEC * (KVK_MAX_D / 64u); w++) {
#pragma HLS PIPELINE II = 1
    kvk_word qw = query[1 + w];
    uint32_t v = w / (KVK_MAX_D / 64u), base = (w % (KVK_MAX_D / 64u)) * 64u;
    for (uint32_t j = 0; j < 64; j++) {
#pragma HLS UNROLL
      q[v][base + j] = (int8_t)qw.b[j];
    }
  }

  /* the chunk's best k: a descending array of (sort key << 32 | ~pos) entries */
  uint64_t tk[KVK_MAX_TOPK];
#pragma HLS ARRAY_PARTITION variable = tk complete
  uint32_t tk_n = 0;
  if (k > KVK_MAX_TOPK)
    k = KVK_MAX_TOPK;

  const uint32_t shift = row_bytes >= 64 ? 6 : row_bytes >= 32 ? 5 : row_bytes >= 16 ? 4
                         : row_bytes >= 8 ? 3 : row_bytes >= 4 ? 2 : row_bytes >= 2 ? 1 : 0;
  const uint32_t per_word = row_bytes >= 64 ? 1 : 64u >> shift;     /* tokens per word */
  const uint32_t row_words = row_bytes >= 64 ? row_bytes / 64 : 1;   /* words per token */
  const uint64_t first_word = code_word + (uint64_t)t0 * row_bytes / 64;
  const uint64_t n_words = ((uint64_t)n * row_bytes + 63) / 64;

  int32_t acc[KVK_MAX_VEC];
#pragma HLS ARRAY_PARTITION variable = acc complete
  for (uint32_t v = 0; v < KVK_MAX_VEC; v++)
    acc[v] = 0;
  uint32_t wr = 0;   /* word within the current row (rows >= 64 bytes) */
  uint32_t done = 0; /* tokens of the chunk finished */
  kvk_word sw;       /* cached scale word */
  uint64_t sw_idx = ~(uint64_t)0;

  for (uint64_t w = 0; w < n_words; w++) {
#pragma HLS PIPELINE II = 1
    kvk_word kw = keys[first_word + w];
    /* 2. products and the adder tree, per query vector; tree levels kept for tapping */
    int32_t seg[KVK_MAX_VEC][64];
#pragma HLS ARRAY_PARTITION variable = seg complete dim = 0
    for (uint32_t v = 0; v < KVK_MAX_VEC; v++) {
#pragma HLS UNROLL
      if (v >= n_vec) { /* unused vector lanes (the hardware has all KVK_MAX_VEC) */
        for (uint32_t i = 0; i < 64; i++)
          seg[v][i] = 0;
        continue;
      }
      int32_t l0[64], l1[32], l2[16], l3[8], l4[4], l5[2], l6;
#pragma HLS ARRAY_PARTITION variable = l0 complete
      for (uint32_t j = 0; j < 64; j++) {
#pragma HLS UNROLL
        uint32_t bir = row_bytes >= 64 ? wr * 64 + j : (j & (row_bytes - 1)); /* byte in row */
        int32_t c = kw.b[j];
        if (bits == 8)
          l0[j] = (int32_t)q[v][bir] * (int32_t)(int8_t)kw.b[j];
        else
          l0[j] = (int32_t)q[v][2 * bir] * ((c & 15) - 8) + (int32_t)q[v][2 * bir + 1] * ((c >> 4) - 8);
      }
      for (uint32_t j = 0; j < 32; j++)
        l1[j] = l0[2 * j] + l0[2 * j + 1];
      for (uint32_t j = 0; j < 16; j++)
        l2[j] = l1[2 * j] + l1[2 * j + 1];
      for (uint32_t j = 0; j < 8; j++)
        l3[j] = l2[2 * j] + l2[2 * j + 1];
      for (uint32_t j = 0; j < 4; j++)
        l4[j] = l3[2 * j] + l3[2 * j + 1];
      for (uint32_t j = 0; j < 2; j++)
        l5[j] = l4[2 * j] + l4[2 * j + 1];
      l6 = l5[0] + l5[1];
      /* tap the tree at the row's level: seg[v][i] = dot of the i-th token of this word */
      for (uint32_t i = 0; i < 64; i++) {
#pragma HLS UNROLL
        int32_t x = 0;
        switch (shift) {
        case 0: x = l0[i]; break;
        case 1: x = i < 32 ? l1[i] : 0; break;
        case 2: x = i < 16 ? l2[i] : 0; break;
        case 3: x = i < 8 ? l3[i] : 0; break;
        case 4: x = i < 4 ? l4[i] : 0; break;
        case 5: x = i < 2 ? l5[i] : 0; break;
        default: x = i == 0 ? l6 : 0; break;
        }
        seg[v][i] = x;
      }
    }
    if (row_bytes >= 64) {
      for (uint32_t v = 0; v < KVK_MAX_VEC; v++) {
#pragma HLS UNROLL
        acc[v] += seg[v][0];
        seg[v][0] = acc[v];
      }
      if (++wr < row_words)
        continue; /* the token is not finished yet */
      wr = 0;
      for (uint32_t v = 0; v < KVK_MAX_VEC; v++)
        acc[v] = 0;
    }
    /* 3. finished tokens: float score, score block, top-k */
    for (uint32_t i = 0; i < per_word; i++) {
      if (done >= n)
        break;
      uint32_t tg = t0 + done; /* token in the section */
      if ((uint64_t)(tg / 16) != sw_idx) {
        sw_idx = tg / 16;
        sw = meta[scale_word + tg / 16];
      }
      kvk_bits sc;
      sc.u = kvk_rd32(sw.b + 4 * (tg % 16));
      float m = (float)seg[0][i] * qs[0];
      for (uint32_t v = 1; v < KVK_MAX_VEC; v++) {
#pragma HLS UNROLL
        if (v < n_vec) {
          float part = (float)seg[v][i] * qs[v];
          m = part > m ? part : m;
        }
      }
      float score = m * sc.f;
      uint32_t pos = pos_base + tg;
      blocks[done].pos = pos;
      blocks[done].score = score;
      done++;
      if (k == 0)
        continue;
      /* systolic insertion: walk down, swap whenever the carried entry is better */
      uint64_t carry = ((uint64_t)kvk_sort_key(score) << 32) | (uint32_t)~pos;
      if (tk_n == k && carry <= tk[k - 1])
        continue;
      for (uint32_t j = 0; j < KVK_MAX_TOPK; j++) {
#pragma HLS UNROLL
        if (j < tk_n && carry > tk[j]) {
          uint64_t t = tk[j];
          tk[j] = carry;
          carry = t;
        } else if (j == tk_n && tk_n < k) {
          tk[j] = carry;
        }
      }
      if (tk_n < k)
        tk_n++;
    }
  }

  for (uint32_t j = 0; j < tk_n; j++) {
#pragma HLS PIPELINE II = 1
    topk[j].pos = ~(uint32_t)tk[j];
    topk[j].score = kvk_key_score((uint32_t)(tk[j] >> 32));
  }
}
