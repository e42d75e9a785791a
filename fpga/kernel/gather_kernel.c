/* SPDX-License-Identifier: MIT */
/*
 * fpga/kernel/gather_kernel.c — the row gather on the SmartSSD's FPGA (gather_kernel.h), in
 * plain C11 with #pragma HLS: v++ synthesizes it (v++ -c -k kv_gather_kernel), gcc compiles the
 * same file for the emulated device and the fake XRT.
 *
 * After a P2P read has put a block's page groups (4 KiB, InstInfer §IV-C) into FPGA DDR, the
 * host knows which tokens it wants (the top k of a score pass, HillInfer §4.2: "only the top-k
 * full K/V then leave the device"): it sends their byte offsets, and this kernel packs their
 * rows into an output buffer the host reads with one partial sync. Per output word: the one or
 * two source words that hold its 64 bytes (a row at an offset that is not a multiple of 64 spans
 * two), a 64-lane byte shift, one write. Rows of a multiple of 64 bytes at 64-aligned offsets
 * (f16 head_dim >= 32 in kvdb's page groups) read one word per output word.
 *
 * NO CHECKSUMS HERE: verifying a group before gathering from it needs an XXH3-64 unit (the long
 * input path: 64-byte stripes, 8 lanes of 32x32->64 multiplies, a scramble per 1 KiB, seeded
 * secret) over each 4 KiB group, and a compare with the group's checksum from the block's
 * checksum table (read by the same P2P pass). The emulated device does that check in its host
 * code before calling this kernel; a real device path is unverified until that unit exists
 * (fpga/device.h kv_fpga_gather: `verified`).
 */
#include "gather_kernel.h"

static uint64_t rd64(const uint8_t *p)
{
  uint64_t v = 0;
  for (int i = 7; i >= 0; i--)
    v = (v << 8) | p[i];
  return v;
}

void kv_gather_kernel(const kvk_word *src, const kvk_word *desc, kvk_word *dst, uint32_t n_rows,
                      uint32_t row_bytes)
{
#pragma HLS INTERFACE m_axi port = src bundle = gmem0 offset = slave max_read_burst_length = 64
#pragma HLS INTERFACE m_axi port = desc bundle = gmem1 offset = slave
#pragma HLS INTERFACE m_axi port = dst bundle = gmem2 offset = slave max_write_burst_length = 64
#pragma HLS INTERFACE s_axilite port = return

  const uint32_t row_words = (row_bytes + 63) / 64;
  kvk_word dw = {{0}};
  for (uint32_t i = 0; i < n_rows; i++) {
    if (i % 8 == 0)
      dw = desc[i / 8];
    uint64_t off = rd64(dw.b + 8 * (i % 8));
    uint64_t w0 = off / 64;
    uint32_t sh = (uint32_t)(off % 64);
    for (uint32_t w = 0; w < row_words; w++) {
#pragma HLS PIPELINE II = 2
      uint32_t left = row_bytes - w * 64 < 64 ? row_bytes - w * 64 : 64; /* bytes of this word */
      kvk_word a = src[w0 + w], b = a;
      if (sh + left > 64)
        b = src[w0 + w + 1];
      kvk_word o;
      for (uint32_t j = 0; j < 64; j++) {
#pragma HLS UNROLL
        uint32_t p = sh + j;
        o.b[j] = j >= left ? 0 : p < 64 ? a.b[p] : b.b[p - 64];
      }
      dst[(uint64_t)i * row_words + w] = o;
    }
  }
}
