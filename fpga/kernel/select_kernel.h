/* SPDX-License-Identifier: MIT */
/*
 * fpga/kernel/select_kernel.h — the interface of the top-k selection kernel (select_kernel.c):
 * the best k of many score blocks left in FPGA DDR by kv_score_kernel runs, so that a chunked
 * score pass sends k <pos, score> pairs to the host instead of 8 bytes per token when k is
 * larger than the on-chip top k (KVK_MAX_TOPK). Plain C11, no Xilinx headers.
 *
 * DEVICE MEMORY
 *   in    score blocks (kvk_pair) written by kv_score_kernel runs
 *   segs  n_segs segments, 8 per 64-byte word: u32 first pair index, u32 count (little-endian)
 *   out   the k best pairs of all segments (score.h ORDER: higher score, then lower position;
 *         NaN lowest), in segment order — not sorted
 *
 * LIMITS: 1 <= k <= the pairs of all segments, and positions distinct (the host checked).
 */
#ifndef KV_SELECT_KERNEL_H
#define KV_SELECT_KERNEL_H

#include <stdint.h>

#include "score_kernel.h"

/** Write the k best pairs of in's segments to out (see above). */
void kv_select_kernel(const kvk_pair *in, const kvk_word *segs, kvk_pair *out, uint32_t n_segs,
                      uint32_t k);

#endif
