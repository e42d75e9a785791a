/* SPDX-License-Identifier: MIT */
/*
 * fpga/kernel/score_kernel.h — the interface of the near-data scoring kernel (score_kernel.c),
 * shared by Vitis HLS (which compiles score_kernel.c alone), the emulated device and the tests.
 * Plain C11, no Xilinx headers: the same file compiles with gcc.
 *
 * DEVICE MEMORY
 *   keys/meta  the score copy bytes (score/score.h "THE SCORE COPY") as they lie in the
 *              file, read there by P2P: a buffer of 64-byte words holding one or more sections.
 *              For one section starting at word s: scales at word s + 1 (byte 64 of the
 *              section), code pages at word s + meta_bytes / 64. The two pointer arguments are
 *              the same buffer (two AXI ports: the scales do not stall the key stream).
 *   query      KVK_QUERY_WORDS words: word 0 = header (u32 n_vec, u32 head_dim, f32 scale[8],
 *              little-endian), then for each of KVK_MAX_VEC vectors KVK_MAX_D int8 codes
 *              (zero-padded). kv_fpga_query_pack() (fpga/device.h) writes it.
 *   blocks     n <pos, score> pairs (8 bytes each): the score block of the chunk, in token order.
 *   topk       min(k, n) pairs, best first (score.h ORDER: score desc, then position asc).
 *
 * SCORES are bit-identical to the CPU scorer's (score): exact integer dots, then
 * (float)dot * qscale[v], the greater-than max over vectors, then * scale[t].
 *
 * LIMITS: row_bytes a power of two from 1 to KVK_MAX_ROW (int8 head_dim <= 512, int4 <= 1024);
 * t0 * row_bytes a multiple of 64 (a chunk starts on a word); k <= KVK_MAX_TOPK (0: no top-k).
 * Rows of 64 bytes and more take one 512-bit word per cycle at II = 1 (the design point:
 * d = 128 int8 is 2 words per token); smaller rows pack several tokens per word and are
 * supported, scored by tapping the adder tree at the row's level.
 */
#ifndef KV_SCORE_KERNEL_H
#define KV_SCORE_KERNEL_H

#include <stdint.h>

#define KVK_WORD_BYTES 64u
#define KVK_MAX_ROW 512u                       /* bytes per token row */
#define KVK_MAX_ROW_WORDS (KVK_MAX_ROW / 64u)
#define KVK_MAX_D 1024u                        /* query elements pinned per vector */
#define KVK_MAX_VEC 8u                         /* query vectors (GQA MAX) */
#define KVK_MAX_TOPK 64u                       /* on-chip top-k capacity */
#define KVK_QUERY_WORDS (1u + KVK_MAX_VEC * (KVK_MAX_D / 64u))

/** One 512-bit memory word (Vitis HLS aggregates the struct into one AXI beat). */
typedef struct kvk_word {
  uint8_t b[64];
} kvk_word;

/** A <pos, score> pair, the score block entry (same layout as kv_score_pair). */
typedef struct kvk_pair {
  uint32_t pos;
  float score;
} kvk_pair;

/** score.h ORDER as an unsigned key: a greater key is a better score; every NaN is 0 (lowest).
 * Shared by the score kernel's on-chip top k and the select kernel. */
static inline uint32_t kvk_sort_key(float s)
{
  union {
    uint32_t u;
    float f;
  } b;
  b.f = s;
  if ((b.u & 0x7fffffffu) > 0x7f800000u)
    return 0;
  return (b.u & 0x80000000u) ? ~b.u : (b.u | 0x80000000u);
}

/** The score of a kvk_sort_key (its inverse; key 0 gives a NaN). */
static inline float kvk_key_score(uint32_t key)
{
  union {
    uint32_t u;
    float f;
  } b;
  b.u = key == 0 ? 0x7fc00000u : (key & 0x80000000u) ? (key & 0x7fffffffu) : ~key;
  return b.f;
}

/** A little-endian u32 from bytes (the kernels' and the emulation's reads of words). */
static inline uint32_t kvk_rd32(const uint8_t *p)
{
  return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}

/**
 * Score tokens [t0, t0 + n) of the section whose scales start at word scale_word and whose code
 * pages start at word code_word; token t gets position pos_base + t. Writes blocks[0..n) and
 * topk[0..min(k, n)). Returns nothing: the host validated every argument (kv_fpga_run_check).
 */
void kv_score_kernel(const kvk_word *keys, const kvk_word *meta, const kvk_word *query,
                     kvk_pair *blocks, kvk_pair *topk, uint32_t scale_word, uint32_t code_word,
                     uint32_t t0, uint32_t n, uint32_t pos_base, uint32_t row_bytes,
                     uint32_t bits, uint32_t k);

#endif
