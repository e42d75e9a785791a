/* SPDX-License-Identifier: MIT */
/*
 * tests/fuzz/fuzz_score_copy.c — untrusted bytes into the score-copy parser (score).
 *
 * Must never crash or read outside the input. The input is copied into an exactly sized,
 * 4096-aligned buffer (as the engine hands a section over), then:
 *   1. kv_score_copy_parse(); on success the view must describe exactly the input;
 *   2. every token is scored against a fixed query by every kernel path this CPU has, and the
 *      scores must be bit-identical across paths;
 *   3. the streaming top-k (2 threads) must equal an accumulator fed all those scores;
 *   4. the parse of the same bytes at a 1-byte offset must fail cleanly (alignment).
 * The seeds in tests/fuzz/corpora/score_copy are written by `test_score_quant --write-seeds DIR`.
 */
#define _POSIX_C_SOURCE 200809L
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "score.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define FUZZ_MAX_BYTES (8u << 20)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
  if (size > FUZZ_MAX_BYTES)
    return 0;
  uint8_t *buf = NULL;
  if (posix_memalign((void **)&buf, 4096, size + 1) != 0)
    abort();
  memcpy(buf, data, size);
  kv_score_view v;
  kv_score_err e;
  kv_score_status rc = kv_score_copy_parse(buf, size, &v, &e);
  if (rc != KV_SCORE_OK) {
    if (rc != KV_SCORE_ECORRUPT || v.codes != NULL)
      abort();
    free(buf);
    return 0;
  }
  const kv_score_layout *l = &v.layout;
  if (l->total_bytes != size || v.codes != buf + l->meta_bytes ||
      kv_score_layout_code_offset(l, l->n_tokens - 1) + l->row_bytes > size)
    abort();
  memmove(buf + 1, buf, size); /* misaligned copy */
  kv_score_view v2;
  if (kv_score_copy_parse(buf + 1, size, &v2, NULL) != KV_SCORE_EINVAL)
    abort();
  memmove(buf, buf + 1, size);

  uint32_t n = l->n_tokens, d = l->head_dim;
  float *q = malloc((size_t)d * 2 * sizeof(float));
  for (uint32_t j = 0; j < 2 * d; j++)
    q[j] = (float)((int)(j * 37 % 23) - 11) * 0.25f;
  kv_score_query *qq = NULL;
  if (kv_score_query_create(KV_SCORE_F32, q, 2, d, (size_t)d * 4, (kv_score_combine)(n & 1), &qq,
                            NULL) != KV_SCORE_OK)
    abort();
  float *ref = malloc((size_t)n * sizeof(float)), *got = malloc((size_t)n * sizeof(float));
  if (kv_score_tokens(qq, &v, 0, n, KV_SCORE_IMPL_PORTABLE, ref, NULL) != KV_SCORE_OK)
    abort();
  const kv_score_impl impls[2] = {KV_SCORE_IMPL_AVX2, KV_SCORE_IMPL_AVX512};
  for (int i = 0; i < 2; i++) {
    if (!kv_score_impl_available(impls[i]))
      continue;
    if (kv_score_tokens(qq, &v, 0, n, impls[i], got, NULL) != KV_SCORE_OK ||
        memcmp(ref, got, (size_t)n * sizeof(float)) != 0)
      abort();
  }
  uint32_t k = n < 8 ? n : 8, pos[8], pos2[8], cnt = 0;
  kv_score_span sp = {&v, 0, n, 7};
  kv_score_opts o;
  kv_score_opts_init(&o);
  o.n_threads = 2;
  if (kv_score_topk(qq, &sp, 1, k, &o, NULL, 0, pos, NULL, &cnt, NULL) != KV_SCORE_OK || cnt != k)
    abort();
  uint64_t mem[2 * 8 + 256];
  kv_score_acc acc;
  if (kv_score_acc_init(&acc, k, mem, sizeof mem, NULL) != KV_SCORE_OK)
    abort();
  kv_score_acc_push_scores(&acc, 7, ref, n);
  if (kv_score_acc_finish(&acc, pos2, NULL) != k || memcmp(pos, pos2, k * sizeof pos[0]) != 0)
    abort();
  kv_score_query_free(qq);
  free(q);
  free(ref);
  free(got);
  free(buf);
  return 0;
}
