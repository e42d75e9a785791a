/* SPDX-License-Identifier: MIT */
/*
 * fpga/kernel/select_kernel.c — the exact top k of score blocks in FPGA DDR (select_kernel.h),
 * in plain C11 with #pragma HLS (v++ -c -k kv_select_kernel; gcc for the emulated device).
 *
 * HillInfer §4.2 streams each chunk's scores to the host; when k exceeds the on-chip insertion
 * array (KVK_MAX_TOPK) a chunk's top min(k, n) is the whole chunk, so every token's pair would
 * cross. Instead the chunks' blocks stay in device memory and this kernel selects the best k of
 * all of them once: a radix select on a 64-bit key per pair — sort_key(score) (score.h ORDER
 * as an unsigned total order, NaN lowest) above ~pos (the lower position wins a tie) — one
 * 256-bin histogram pass per byte from the top (8 passes, II = 1 with the usual dependence on
 * the histogram bin: HLS needs the bin-forwarding idiom or II = 2), which pins the k-th largest
 * key T; then one compaction pass writes every pair whose key is >= T. Keys are distinct
 * (positions are), so exactly k pairs come out, and they are the global top k: the same set the
 * host's accumulator keeps, whatever order they arrive in.
 */
#include "select_kernel.h"

static uint64_t pair_key(kvk_pair p)
{
  return ((uint64_t)kvk_sort_key(p.score) << 32) | (uint32_t)~p.pos;
}

void kv_select_kernel(const kvk_pair *in, const kvk_word *segs, kvk_pair *out, uint32_t n_segs,
                      uint32_t k)
{
#pragma HLS INTERFACE m_axi port = in bundle = gmem0 offset = slave max_read_burst_length = 64
#pragma HLS INTERFACE m_axi port = segs bundle = gmem1 offset = slave
#pragma HLS INTERFACE m_axi port = out bundle = gmem2 offset = slave max_write_burst_length = 64
#pragma HLS INTERFACE s_axilite port = return

  uint64_t prefix = 0; /* the bytes of T found so far */
  uint32_t need = k;   /* how many of the keys under that prefix are still to take */
  uint32_t hist[256];
#pragma HLS ARRAY_PARTITION variable = hist cyclic factor = 16
  for (int shift = 56; shift >= 0; shift -= 8) {
    uint64_t hi = shift == 56 ? 0 : ~(uint64_t)0 << (shift + 8);
    for (uint32_t b = 0; b < 256; b++)
      hist[b] = 0;
    kvk_word sw = {{0}};
    for (uint32_t s = 0; s < n_segs; s++) {
      if (s % 8 == 0)
        sw = segs[s / 8];
      uint32_t first = kvk_rd32(sw.b + 8 * (s % 8)), count = kvk_rd32(sw.b + 8 * (s % 8) + 4);
      for (uint32_t i = 0; i < count; i++) {
#pragma HLS PIPELINE II = 1
        uint64_t key = pair_key(in[first + i]);
        if ((key & hi) == prefix)
          hist[(key >> shift) & 255]++;
      }
    }
    /* the byte of T: walk the bins from the top until `need` keys are covered */
    uint32_t above = 0, d = 255;
    while (d > 0 && above + hist[d] < need) {
      above += hist[d];
      d--;
    }
    need -= above;
    prefix |= (uint64_t)d << shift;
  }
  uint32_t j = 0;
  kvk_word sw = {{0}};
  for (uint32_t s = 0; s < n_segs; s++) {
    if (s % 8 == 0)
      sw = segs[s / 8];
    uint32_t first = kvk_rd32(sw.b + 8 * (s % 8)), count = kvk_rd32(sw.b + 8 * (s % 8) + 4);
    for (uint32_t i = 0; i < count; i++) {
#pragma HLS PIPELINE II = 1
      kvk_pair p = in[first + i];
      if (pair_key(p) >= prefix && j < k)
        out[j++] = p;
    }
  }
}
