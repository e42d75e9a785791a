/* SPDX-License-Identifier: MIT */
/*
 * tests/fuzz/fuzz_refmodel_tokenizer.c — tools/refmodel tokenizer loader, encoder and decoder on
 * untrusted bytes.
 *
 * Loads the input as a llama2.c tokenizer from memory (token count from the size). A rejected
 * input must come with a message. For an accepted one, a few fixed strings and the input's own
 * first bytes are encoded (every id must be in range, BOS first when asked) and decoded back
 * (the decoded length must match what refmodel_decode() reports piece by piece), and every id is
 * decoded after BOS.
 * Seeds: tests/fuzz/corpora/refmodel_tokenizer/ (made by tools/refmodel/make_fuzz_seeds.py).
 */
#include "refmodel.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void encode_decode(const refmodel_tokenizer *tok, const char *text, size_t len)
{
  int vocab = refmodel_tokenizer_vocab_size(tok);
  size_t cap = refmodel_encode_bound(len), n = 0;
  int *tokens = malloc(cap * sizeof *tokens);
  char *out = malloc(cap * 8);
  if (tokens == NULL || out == NULL)
    goto done;
  int rc = refmodel_encode(tok, text, len, REFMODEL_ENCODE_BOS, tokens, cap, &n);
  if (rc == REFMODEL_EINVAL) /* vocab too small for BOS, " " or a byte fallback */
    goto done;
  if (rc != REFMODEL_OK || n < 1 || n > cap || tokens[0] != REFMODEL_TOKEN_BOS)
    abort();
  size_t want = 0;
  for (size_t i = 0; i < n; i++) {
    const char *piece;
    size_t plen;
    if (tokens[i] < 0 || tokens[i] >= vocab)
      abort();
    if (i > 0) {
      if (refmodel_decode(tok, tokens[i - 1], tokens[i], &piece, &plen) != REFMODEL_OK)
        abort();
      want += plen;
    }
  }
  size_t got = 0;
  rc = refmodel_detokenize(tok, REFMODEL_TOKEN_BOS, tokens + 1, n - 1, out, cap * 8, &got);
  if (got != want || (rc != REFMODEL_OK && rc != REFMODEL_ENOSPC))
    abort();
done:
  free(tokens);
  free(out);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
  refmodel_tokenizer *tok = NULL;
  int rc = refmodel_tokenizer_load_buffer(data, size, "fuzz", 0, &tok);
  if (rc != REFMODEL_OK) {
    if (tok != NULL || refmodel_errmsg()[0] == '\0')
      abort();
    return 0;
  }
#define TEXT(s)                                                                                    \
  {                                                                                                \
    s, sizeof s - 1                                                                                \
  }
  static const struct {
    const char *s;
    size_t len;
  } texts[] = {
      TEXT("Once upon a time, there was a little girl named Lily."),
      TEXT("\xe2\x80\x9cHi!\xe2\x80\x9d she said.\n\n"),
      TEXT(" a  b\x00\xff\x80<0x41>"),
      TEXT(""),
  };
#undef TEXT
  for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++)
    encode_decode(tok, texts[i].s, texts[i].len);
  encode_decode(tok, (const char *)data, size < 64 ? size : 64);
  int vocab = refmodel_tokenizer_vocab_size(tok);
  for (int id = 0; id < vocab; id++) {
    const char *piece;
    size_t plen;
    if (refmodel_decode(tok, REFMODEL_TOKEN_BOS, id, &piece, &plen) != REFMODEL_OK)
      abort();
  }
  refmodel_tokenizer_free(tok);
  return 0;
}
