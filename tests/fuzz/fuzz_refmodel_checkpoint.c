/* SPDX-License-Identifier: MIT */
/*
 * tests/fuzz/fuzz_refmodel_checkpoint.c — tools/refmodel checkpoint loader on untrusted bytes.
 *
 * Loads the input as a llama2.c v0 checkpoint from memory. A rejected input must come with a
 * message; an accepted one must describe a model whose header is self-consistent, and when it is
 * small, three greedy steps must run and return in-range tokens. The loader ties the weight count
 * to the input size, so the forward pass costs at most a few times the input length.
 * Seeds: tests/fuzz/corpora/refmodel_checkpoint/ (made by tools/refmodel/make_fuzz_seeds.py).
 */
#include "refmodel.h"

#include <stdint.h>
#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
  refmodel_model *m = NULL;
  int rc = refmodel_model_load_buffer(data, size, "fuzz", &m);
  if (rc != REFMODEL_OK) {
    if (m != NULL || refmodel_errmsg()[0] == '\0')
      abort(); /* an error must leave no model and must say what was wrong */
    return 0;
  }
  const refmodel_config *c = refmodel_model_config(m);
  if (c->dim % c->n_heads != 0 || c->n_heads % c->n_kv_heads != 0 || c->head_size % 2 != 0 ||
      c->kv_dim != c->n_kv_heads * c->head_size || c->vocab_size < 1)
    abort();
  if (size <= (1u << 20)) {
    refmodel_state *st = NULL;
    if (refmodel_state_new(m, 4, &st) == REFMODEL_OK) {
      int out[3], n_out = 0;
      if (refmodel_generate(st, c->vocab_size - 1, 0, 3, -1, out, &n_out) != REFMODEL_OK ||
          n_out != 3)
        abort();
      for (int i = 0; i < n_out; i++)
        if (out[i] < 0 || out[i] >= c->vocab_size)
          abort();
      float *lp = malloc((size_t)c->vocab_size * sizeof *lp);
      if (lp != NULL &&
          refmodel_log_softmax(refmodel_state_logits(st), c->vocab_size, lp) != REFMODEL_OK)
        abort();
      free(lp);
      if (refmodel_state_key(st, c->n_layers - 1, 3) == NULL ||
          refmodel_state_value(st, c->n_layers, 0) != NULL)
        abort();
      refmodel_state_free(st);
    }
  }
  refmodel_model_free(m);
  return 0;
}
