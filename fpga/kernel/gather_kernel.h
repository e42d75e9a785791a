/* SPDX-License-Identifier: MIT */
/*
 * fpga/kernel/gather_kernel.h — the interface of the row-gather kernel (gather_kernel.c): the
 * token-level step of InstInfer's dual-step loading (§IV-C) done on the device, so that of the
 * page groups a P2P read brought into FPGA DDR only the chosen tokens' K and V rows cross to the
 * host. Plain C11, no Xilinx headers (the same file compiles with gcc for the emulated device).
 *
 * DEVICE MEMORY
 *   src   the page groups as they lie in the file (a P2P buffer of 64-byte words)
 *   desc  n_rows little-endian u64 byte offsets into src, 8 per word (row i's first byte)
 *   dst   row i at word i * row_words (row_words = ceil(row_bytes / 64)); the bytes of its last
 *         word past row_bytes are zero
 *
 * LIMITS: row_bytes 1..KVG_MAX_ROW; every row inside src (the host checked it).
 */
#ifndef KV_GATHER_KERNEL_H
#define KV_GATHER_KERNEL_H

#include <stdint.h>

#include "score_kernel.h"

#define KVG_MAX_ROW (1u << 16) /* bytes per row (head_dim 4096 x f32 = 16 KiB fits) */

/** Copy n_rows rows of row_bytes bytes from src at desc's offsets to consecutive dst rows. */
void kv_gather_kernel(const kvk_word *src, const kvk_word *desc, kvk_word *dst, uint32_t n_rows,
                      uint32_t row_bytes);

#endif
