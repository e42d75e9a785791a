/* SPDX-License-Identifier: MIT */
/*
 * bench/datagen.c — deterministic KV-cache-like fp16 tensors and token sequences (datagen.h).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "datagen.h"

/* Outlier K channels per (layer, head), and how much louder they are. */
#define DG_K_OUTLIERS 4u
#define DG_OUTLIER_BIAS_MIN 8.0f
#define DG_OUTLIER_BIAS_SPAN 8.0f
#define DG_OUTLIER_SCALE 3.0f

uint16_t dg_f32_to_f16(float f)
{
  uint32_t x;
  memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t exp = (x >> 23) & 0xffu;
  uint32_t mant = x & 0x7fffffu;
  if (exp == 0xffu) /* inf or NaN (keep NaN quiet and non-zero) */
    return (uint16_t)(sign | 0x7c00u | (mant ? 0x200u : 0));
  int e = (int)exp - 127 + 15;
  if (e >= 31)
    return (uint16_t)(sign | 0x7c00u);
  if (e <= 0) { /* subnormal half, or zero */
    if (e < -10)
      return (uint16_t)sign;
    mant |= 0x800000u;
    uint32_t shift = (uint32_t)(14 - e);
    uint32_t h = mant >> shift, rem = mant & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (h & 1u)))
      h++;
    return (uint16_t)(sign | h);
  }
  uint32_t h = ((uint32_t)e << 10) | (mant >> 13), rem = mant & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u)))
    h++; /* a carry into the exponent is the correct rounding, up to infinity */
  return (uint16_t)(sign | h);
}

/* Roughly N(0, 1): Irwin–Hall of the four 16-bit lanes of one 64-bit draw, variance scaled. */
static inline float normalish(uint64_t r)
{
  uint32_t s = (uint32_t)(r & 0xffff) + (uint32_t)((r >> 16) & 0xffff) +
               (uint32_t)((r >> 32) & 0xffff) + (uint32_t)(r >> 48);
  return ((float)s * (1.0f / 65536.0f) - 2.0f) * 1.7320508f;
}

static float uniform01(dg_rng *r)
{
  return (float)(dg_next(r) >> 40) * (1.0f / 16777216.0f);
}

int dg_kv_model_init(dg_kv_model *m, uint32_t n_layers, uint32_t n_kv_heads, uint32_t head_dim,
                     uint64_t seed)
{
  memset(m, 0, sizeof *m);
  size_t n = (size_t)n_layers * 2 * n_kv_heads * head_dim;
  m->bias = malloc(n * sizeof *m->bias);
  m->scale = malloc(n * sizeof *m->scale);
  if (m->bias == NULL || m->scale == NULL) {
    dg_kv_model_free(m);
    return -1;
  }
  m->n_layers = n_layers;
  m->n_kv_heads = n_kv_heads;
  m->head_dim = head_dim;
  m->seed = seed;
  dg_rng r = {dg_mix(seed ^ 0x6b76646264617461ull)};
  for (uint32_t l = 0; l < n_layers; l++) {
    /* deeper layers have larger activations, as in most decoder LLMs */
    float depth = n_layers > 1 ? (float)l / (float)(n_layers - 1) : 0.0f;
    for (uint32_t kv = 0; kv < 2; kv++) {
      float base = kv == 0 ? 0.6f + 0.8f * depth : 0.15f + 0.5f * depth;
      for (uint32_t h = 0; h < n_kv_heads; h++) {
        size_t c0 = (((size_t)l * 2 + kv) * n_kv_heads + h) * head_dim;
        for (uint32_t d = 0; d < head_dim; d++) {
          float sc = base * expf(0.5f * normalish(dg_next(&r)));
          m->scale[c0 + d] = sc;
          m->bias[c0 + d] = (kv == 0 ? 0.3f : 0.05f) * base * normalish(dg_next(&r));
        }
        if (kv == 0)
          for (uint32_t k = 0; k < DG_K_OUTLIERS && k < head_dim; k++) {
            uint32_t d = dg_below(&r, head_dim);
            float sign = (dg_next(&r) & 1) ? 1.0f : -1.0f;
            m->bias[c0 + d] = sign * base * (DG_OUTLIER_BIAS_MIN + DG_OUTLIER_BIAS_SPAN * uniform01(&r));
            m->scale[c0 + d] = base * DG_OUTLIER_SCALE;
          }
      }
    }
  }
  return 0;
}

void dg_kv_model_free(dg_kv_model *m)
{
  free(m->bias);
  free(m->scale);
  m->bias = m->scale = NULL;
}

size_t dg_kv_token_bytes(const dg_kv_model *m)
{
  return (size_t)m->n_layers * 2 * m->n_kv_heads * m->head_dim * 2;
}

int dg_kv_fill_f16(const dg_kv_model *m, const uint32_t *tokens, size_t n, uint16_t *dst)
{
  uint64_t *ph = malloc((n ? n : 1) * sizeof *ph);
  if (ph == NULL)
    return -1;
  /* ph[t] names the prefix tokens[0..t]: equal prefixes, equal KV */
  uint64_t h = dg_mix(m->seed ^ 0x707265666978ull);
  for (size_t t = 0; t < n; t++) {
    h = dg_mix(h ^ (tokens[t] + 0x9e3779b97f4a7c15ull));
    ph[t] = h;
  }
  const uint32_t hd = m->head_dim, nh = m->n_kv_heads;
  uint16_t *p = dst;
  for (uint32_t l = 0; l < m->n_layers; l++)
    for (uint32_t kv = 0; kv < 2; kv++) {
      uint64_t lk = ((uint64_t)l << 40) ^ ((uint64_t)kv << 39);
      for (size_t t = 0; t < n; t++)
        for (uint32_t hh = 0; hh < nh; hh++) {
          size_t c0 = (((size_t)l * 2 + kv) * nh + hh) * hd;
          const float *b = m->bias + c0, *s = m->scale + c0;
          uint64_t row = dg_mix(ph[t] ^ lk ^ ((uint64_t)hh << 32));
          for (uint32_t d = 0; d < hd; d++)
            *p++ = dg_f32_to_f16(b[d] + s[d] * normalish(dg_mix(row + d)));
        }
    }
  free(ph);
  return 0;
}

void dg_tokens(uint32_t *dst, size_t n, uint64_t seed, uint32_t vocab)
{
  dg_rng r = {dg_mix(seed ^ 0x746f6b656e73ull)};
  for (size_t i = 0; i < n; i++)
    dst[i] = dg_below(&r, vocab);
}

void dg_prompt(uint32_t *dst, size_t n, uint64_t family_seed, size_t n_shared,
               uint64_t prompt_seed, uint32_t vocab)
{
  size_t k = n_shared < n ? n_shared : n;
  dg_tokens(dst, k, family_seed, vocab);
  /* the suffix seed includes the family, so equal prompt seeds in two families differ */
  dg_tokens(dst + k, n - k, dg_mix(prompt_seed) ^ family_seed, vocab);
}
