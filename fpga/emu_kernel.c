/* SPDX-License-Identifier: MIT */
/*
 * fpga/emu_kernel.c — the emulated device's scoring kernel: kv_score_kernel's function
 * (fpga/kernel/score_kernel.h) written for a CPU instead of for Vitis HLS, so that the emulated
 * SmartSSD's compute is not what a decode step waits on (issue 18: the HLS C file, compiled by
 * gcc, scores ~0.4 GB/s of int4 copies on one core; the FPGA scores a 64-byte word per cycle).
 *
 * Same outputs bit for bit (tests/unit: test_fpga_emu's "emulated kernel equals the HLS C
 * kernel" case): the dot of each query vector with a token's codes is an exact int32 sum (any
 * order), then the kernel's float sequence, (float)dot * qscale[v], the greater-than max over
 * vectors in vector order, * scale[t]; the on-chip top k is the same insertion array. Only the
 * loops differ: a token's codes are widened once into int16 lanes (int4: low and high nibbles
 * apart, the query's even and odd elements apart) and each vector's dot is one loop gcc turns
 * into multiply-add instructions.
 *
 * KVDB_FPGA_EMU_KERNEL=hls makes the emulated device call the HLS C kernel itself (device.c).
 */
#include "fpga_int.h"

#include <string.h>

static float f32_of(uint32_t u)
{
  float f;
  memcpy(&f, &u, 4);
  return f;
}

/* sum over i < n of a[i] * b[i], exact */
static int32_t dot16(const int16_t *restrict a, const int16_t *restrict b, uint32_t n)
{
  int32_t s = 0;
  for (uint32_t i = 0; i < n; i++)
    s += (int32_t)a[i] * (int32_t)b[i];
  return s;
}

void kv_score_kernel_emu(const kvk_word *keys, const kvk_word *meta, const kvk_word *query,
                         kvk_pair *blocks, kvk_pair *topk, uint32_t scale_word, uint32_t code_word,
                         uint32_t t0, uint32_t n, uint32_t pos_base, uint32_t row_bytes,
                         uint32_t bits, uint32_t k)
{
  /* byte views of the buffers (word arrays: a row, a vector or the scales span many words) */
  const uint8_t *kbytes = (const uint8_t *)(const void *)keys;
  const uint8_t *mbytes = (const uint8_t *)(const void *)meta;
  const uint8_t *qb = (const uint8_t *)(const void *)query;
  uint32_t n_vec = kvk_rd32(qb);
  if (n_vec < 1)
    n_vec = 1;
  if (n_vec > KVK_MAX_VEC)
    n_vec = KVK_MAX_VEC;
  float qs[KVK_MAX_VEC];
  for (uint32_t v = 0; v < KVK_MAX_VEC; v++)
    qs[v] = f32_of(kvk_rd32(qb + 8 + 4 * v));
  /* lanes per token: int8 one per byte; int4 two per byte, kept as the low and the high nibbles'
   * halves (m = row_bytes each) */
  const uint32_t m = row_bytes;
  _Alignas(64) int16_t q[KVK_MAX_VEC][2 * KVK_MAX_ROW];
  for (uint32_t v = 0; v < n_vec; v++) {
    const int8_t *c = (const int8_t *)(const void *)(qb + 64 * (1 + v * (KVK_MAX_D / 64u)));
    for (uint32_t i = 0; i < m; i++) {
      if (bits == 8) {
        q[v][i] = c[i];
      } else {
        q[v][i] = c[2 * i];         /* multiplies the low nibble */
        q[v][m + i] = c[2 * i + 1]; /* the high one */
      }
    }
  }
  const uint32_t lanes = bits == 8 ? m : 2 * m;
  uint64_t tk[KVK_MAX_TOPK];
  uint32_t tk_n = 0;
  if (k > KVK_MAX_TOPK)
    k = KVK_MAX_TOPK;
  const uint8_t *codes = kbytes + ((uint64_t)code_word * 64 + (uint64_t)t0 * row_bytes);
  const uint8_t *scales = mbytes + (uint64_t)scale_word * 64;
  _Alignas(64) int16_t e[2 * KVK_MAX_ROW];
  for (uint32_t i = 0; i < n; i++) {
    const uint8_t *row = codes + (uint64_t)i * row_bytes;
    if (bits == 8) {
      for (uint32_t j = 0; j < m; j++)
        e[j] = (int8_t)row[j];
    } else {
      for (uint32_t j = 0; j < m; j++) {
        e[j] = (int16_t)((row[j] & 15) - 8);
        e[m + j] = (int16_t)((row[j] >> 4) - 8);
      }
    }
    float best = (float)dot16(q[0], e, lanes) * qs[0];
    for (uint32_t v = 1; v < n_vec; v++) {
      float part = (float)dot16(q[v], e, lanes) * qs[v];
      best = part > best ? part : best;
    }
    uint32_t tg = t0 + i;
    float score = best * f32_of(kvk_rd32(scales + 4 * (uint64_t)tg));
    uint32_t pos = pos_base + tg;
    blocks[i].pos = pos;
    blocks[i].score = score;
    if (k == 0)
      continue;
    /* the kernel's insertion array: a descending list of (sort key << 32 | ~pos) */
    uint64_t carry = ((uint64_t)kvk_sort_key(score) << 32) | (uint32_t)~pos;
    if (tk_n == k && carry <= tk[k - 1])
      continue;
    for (uint32_t j = 0; j < tk_n; j++)
      if (carry > tk[j]) {
        uint64_t t = tk[j];
        tk[j] = carry;
        carry = t;
      }
    if (tk_n < k)
      tk[tk_n++] = carry;
  }
  for (uint32_t j = 0; j < tk_n; j++) {
    topk[j].pos = ~(uint32_t)tk[j];
    topk[j].score = kvk_key_score((uint32_t)(tk[j] >> 32));
  }
}
