/* SPDX-License-Identifier: MIT */
/*
 * tests/unit/tinymodel.h — a tiny llama2.c checkpoint (random weights from a seed), a matching
 * 320-token tokenizer with English pieces, and deterministic English-like text, written by the
 * tests themselves so that the refkv and ingest tests run everywhere (the real stories260K model
 * is used in addition where ../shared is present). Header-only; nothing here is product code.
 *
 * The model: dim 32, hidden_dim 64, 2 layers, 4 heads, 2 KV heads (head_size 8, kv_dim 16),
 * vocab 320, seq_len 128, shared classifier. The tokenizer: <unk>, BOS, EOS, the 256
 * byte-fallback tokens, then 61 pieces (single characters first, then merges) so that text
 * really merges into multi-byte pieces.
 */
#ifndef KVDB_TINYMODEL_H
#define KVDB_TINYMODEL_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TM_DIM 32
#define TM_HIDDEN 64
#define TM_LAYERS 2
#define TM_HEADS 4
#define TM_KV_HEADS 2
#define TM_VOCAB 320
#define TM_SEQ_LEN 128

static inline uint64_t tm_rand(uint64_t *s)
{
  uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/* uniform in [-a, a) */
static inline float tm_uniform(uint64_t *s, float a)
{
  return (float)((double)(tm_rand(s) >> 11) / 9007199254740992.0 * 2.0 - 1.0) * a;
}

static inline void tm_put_i32(FILE *f, int32_t v)
{
  unsigned char b[4];
  uint32_t u;
  memcpy(&u, &v, 4);
  for (int i = 0; i < 4; i++)
    b[i] = (unsigned char)(u >> (8 * i));
  fwrite(b, 1, 4, f);
}

static inline void tm_put_f32(FILE *f, float v)
{
  uint32_t u;
  memcpy(&u, &v, 4);
  unsigned char b[4];
  for (int i = 0; i < 4; i++)
    b[i] = (unsigned char)(u >> (8 * i));
  fwrite(b, 1, 4, f);
}

/* Write the tiny checkpoint. Returns 0 or -1. */
static inline int tm_write_model(const char *path, uint64_t seed)
{
  FILE *f = fopen(path, "wb");
  if (f == NULL)
    return -1;
  int32_t hdr[7] = {TM_DIM, TM_HIDDEN, TM_LAYERS, TM_HEADS, TM_KV_HEADS, TM_VOCAB, TM_SEQ_LEN};
  for (int i = 0; i < 7; i++)
    tm_put_i32(f, hdr[i]);
  const int hs = TM_DIM / TM_HEADS, kv = TM_KV_HEADS * hs;
  struct {
    long n;
    float scale; /* 0: all ones (RMSNorm weights) */
  } t[13] = {
      {(long)TM_VOCAB * TM_DIM, 1.0f},
      {(long)TM_LAYERS * TM_DIM, 0},
      {(long)TM_LAYERS * TM_DIM * TM_DIM, 0.3f},
      {(long)TM_LAYERS * kv * TM_DIM, 0.3f},
      {(long)TM_LAYERS * kv * TM_DIM, 0.3f},
      {(long)TM_LAYERS * TM_DIM * TM_DIM, 0.3f},
      {(long)TM_LAYERS * TM_DIM, 0},
      {(long)TM_LAYERS * TM_HIDDEN * TM_DIM, 0.3f},
      {(long)TM_LAYERS * TM_DIM * TM_HIDDEN, 0.2f},
      {(long)TM_LAYERS * TM_HIDDEN * TM_DIM, 0.3f},
      {TM_DIM, 0},
      {(long)TM_SEQ_LEN * hs / 2, 0.5f},
      {(long)TM_SEQ_LEN * hs / 2, 0.5f},
  };
  uint64_t s = seed;
  for (int i = 0; i < 13; i++)
    for (long j = 0; j < t[i].n; j++)
      tm_put_f32(f, t[i].scale == 0 ? 1.0f : tm_uniform(&s, t[i].scale));
  return fclose(f) == 0 ? 0 : -1;
}

static const char *const tm_pieces[] = {
    " ",  "e",  "t",    "a",    "o",  "i",   "n",    "s",    "h",    "r",  "d",  "l",  "u",
    "y",  "w",  "m",    "g",    "c",  "f",   "b",    "p",    "k",    ".",  ",",  "\n", "O",
    "T",  "S",  "L",    "I",    "\"", " t",  "th",   "he",   " a",   "in", "an", "er", "nd",
    " s", " w", "ou",   " the", "ed", "on",  "re",   " h",   "at",   "en", " b", "ll", "it",
    " p", "is", " and", "ay",   " d", "ing", " was", " Tim", " Sam",
};

/* Write the 320-token tokenizer. Returns 0 or -1. */
static inline int tm_write_tokenizer(const char *path)
{
  FILE *f = fopen(path, "wb");
  if (f == NULL)
    return -1;
  tm_put_i32(f, 7);
  for (int id = 0; id < TM_VOCAB; id++) {
    char piece[16];
    float score = 0;
    if (id == 0)
      snprintf(piece, sizeof piece, "<unk>");
    else if (id == 1)
      snprintf(piece, sizeof piece, "\n<s>\n");
    else if (id == 2)
      snprintf(piece, sizeof piece, "\n</s>\n");
    else if (id < 259)
      snprintf(piece, sizeof piece, "<0x%02X>", id - 3);
    else {
      snprintf(piece, sizeof piece, "%s", tm_pieces[id - 259]);
      score = (float)-(id - 259);
    }
    tm_put_f32(f, score);
    tm_put_i32(f, (int32_t)strlen(piece));
    fwrite(piece, 1, strlen(piece), f);
  }
  return fclose(f) == 0 ? 0 : -1;
}

static const char *const tm_words[] = {
    "the",  "a",     "was", "and",    "Tim",   "Sam",   "Lily", "dog",  "cat",    "sun",
    "park", "ball",  "red", "big",    "happy", "sad",   "ran",  "saw",  "said",   "played",
    "tree", "house", "mom", "friend", "went",  "to",    "with", "in",   "on",     "little",
    "girl", "boy",   "toy", "bird",   "fish",  "water", "hot",  "cold", "jumped", "smiled",
};

/*
 * Paragraph p (deterministic in p and seed): `sentences` sentences of 4..11 words, capitalized,
 * with a comma now and then; different p give different text. Returns a malloc'd string.
 */
static inline char *tm_paragraph(uint64_t seed, uint64_t p, int sentences)
{
  size_t cap = (size_t)sentences * 120 + 64, o = 0;
  char *out = malloc(cap);
  if (out == NULL)
    return NULL;
  uint64_t s = seed * 1000003u + p * 7919u + 17;
  o += (size_t)snprintf(out + o, cap - o, "Story %llu.", (unsigned long long)p);
  for (int k = 0; k < sentences; k++) {
    int n = 4 + (int)(tm_rand(&s) % 8);
    for (int w = 0; w < n; w++) {
      const char *word = tm_words[tm_rand(&s) % (sizeof tm_words / sizeof tm_words[0])];
      o += (size_t)snprintf(out + o, cap - o, " %c%s%s",
                            w == 0 && word[0] >= 'a' ? word[0] - 32 : word[0], word + 1,
                            w == 2 && n > 6 && tm_rand(&s) % 3 == 0 ? "," : "");
    }
    out[o++] = '.';
    out[o] = '\0';
  }
  return out;
}

#endif
