/* SPDX-License-Identifier: MIT */
/*
 * tools/refmodel/tokenizer.c — llama2.c tokenizer: loading, encoding, decoding.
 *
 * Pieces live in one blob; a copy of the (piece, id) index sorted by piece bytes, then id, serves
 * every lookup by binary search (as llama2.c's sorted_vocab + bsearch; on duplicate pieces the
 * lowest id wins, so results are deterministic).
 *
 * Encoding gives exactly llama2.c's result (repeatedly merge the best-scoring adjacent pair,
 * leftmost on ties) in O(n log n) instead of O(n^2): the symbols form a linked list and
 * candidate pairs sit in a max-heap ordered by (score, then leftmost position). An entry records
 * its left symbol and both symbols' ids; it is stale, and skipped when popped, unless the left
 * symbol still has that id and its current right neighbour has the recorded right id. After each
 * merge only the two pairs touching the merged symbol are pushed again. Since the candidate's
 * piece depends only on the two ids, every entry that passes the check describes a current pair
 * exactly, and every current pair has an entry, so the heap's best valid entry is llama2.c's pick.
 */
#include "refmodel.h"

#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(__GNUC__)
#define RM_PRINTF(f, a) __attribute__((format(printf, f, a)))
#else
#define RM_PRINTF(f, a)
#endif

/* Defined in refmodel.c: record the per-thread message, return rc. */
int rm_fail(int rc, const char *fmt, ...) RM_PRINTF(2, 3);

/* llama2.c's initial best score: pairs scoring at or below it never merge. */
#define NO_MERGE_SCORE (-1e10f)
#define NONE UINT32_MAX
/* Longest text refmodel_encode() takes: symbol indices must fit in uint32_t below NONE. */
#define MAX_TEXT_BYTES ((size_t)1 << 30)

struct piece_index {
  const char *str;
  int len;
  int id;
};

struct refmodel_tokenizer {
  int vocab_size;
  int max_token_length;
  char *blob;                 /* every piece, back to back */
  const char **piece;         /* [vocab_size] into blob */
  int *piece_len;             /* [vocab_size] */
  float *score;               /* [vocab_size] */
  struct piece_index *sorted; /* [vocab_size] sorted by bytes, then id */
  unsigned char bytes[256];   /* bytes[i] == i: targets of "<0xHH>" pieces */
};

/* ---- loading --------------------------------------------------------------------------- */

static int32_t rd_i32(const unsigned char *p)
{
  uint32_t u = (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
  int32_t v;
  memcpy(&v, &u, sizeof v);
  return v;
}

static float rd_f32(const unsigned char *p)
{
  uint32_t u = (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
  float v;
  memcpy(&v, &u, sizeof v);
  return v;
}

static int cmp_bytes(const char *a, int alen, const char *b, int blen)
{
  int n = alen < blen ? alen : blen;
  int c = n > 0 ? memcmp(a, b, (size_t)n) : 0;
  if (c != 0)
    return c;
  return (alen > blen) - (alen < blen);
}

static int cmp_index(const void *pa, const void *pb)
{
  const struct piece_index *a = pa, *b = pb;
  int c = cmp_bytes(a->str, a->len, b->str, b->len);
  return c != 0 ? c : (a->id > b->id) - (a->id < b->id);
}

/* Lowest id whose piece is s[0..len), or -1. */
static int lookup(const refmodel_tokenizer *tok, const char *s, int len)
{
  size_t lo = 0, hi = (size_t)tok->vocab_size;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (cmp_bytes(tok->sorted[mid].str, tok->sorted[mid].len, s, len) < 0)
      lo = mid + 1;
    else
      hi = mid;
  }
  if (lo < (size_t)tok->vocab_size &&
      cmp_bytes(tok->sorted[lo].str, tok->sorted[lo].len, s, len) == 0)
    return tok->sorted[lo].id;
  return -1;
}

/*
 * Walk the records. With fill == NULL: validate, count tokens (*n_tokens) and piece bytes
 * (*blob_bytes). With fill: copy into it (the walk has already been validated).
 */
static int walk(const unsigned char *d, size_t size, const char *name, int vocab_size,
                refmodel_tokenizer *fill, int *n_tokens, size_t *blob_bytes)
{
  if (size < 4)
    return rm_fail(REFMODEL_ETRUNCATED,
                   "'%s': truncated: %zu bytes, the header (max_token_length) needs 4", name, size);
  int32_t mtl = rd_i32(d);
  if (mtl < 1 || mtl > REFMODEL_MAX_TOKEN_LENGTH)
    return rm_fail(REFMODEL_EFORMAT, "'%s': bad max_token_length %d (must be 1..%d)", name,
                   (int)mtl, REFMODEL_MAX_TOKEN_LENGTH);
  size_t off = 4, blob = 0;
  int n = 0;
  while (vocab_size > 0 ? n < vocab_size : off < size) {
    if (n >= REFMODEL_MAX_VOCAB)
      return rm_fail(REFMODEL_EFORMAT, "'%s': more than %d tokens", name, REFMODEL_MAX_VOCAB);
    if (size - off < 8)
      return rm_fail(REFMODEL_ETRUNCATED,
                     "'%s': truncated: token %d needs 8 bytes (score, length) at offset %zu, "
                     "%zu left",
                     name, n, off, size - off);
    float score = rd_f32(d + off);
    int32_t len = rd_i32(d + off + 4);
    if (!isfinite(score))
      return rm_fail(REFMODEL_EFORMAT, "'%s': token %d: score is not finite (%g)", name, n,
                     (double)score);
    if (len < 0)
      return rm_fail(REFMODEL_EFORMAT, "'%s': token %d: negative piece length %d", name, n,
                     (int)len);
    if (len > mtl)
      return rm_fail(REFMODEL_EFORMAT,
                     "'%s': token %d: piece length %d exceeds max_token_length %d", name, n,
                     (int)len, (int)mtl);
    off += 8;
    if (size - off < (size_t)len)
      return rm_fail(REFMODEL_ETRUNCATED,
                     "'%s': truncated: token %d needs %d piece bytes at offset %zu, %zu left", name,
                     n, (int)len, off, size - off);
    if (fill != NULL) {
      memcpy(fill->blob + blob, d + off, (size_t)len);
      fill->piece[n] = fill->blob + blob;
      fill->piece_len[n] = len;
      fill->score[n] = score;
    }
    off += (size_t)len;
    blob += (size_t)len;
    n++;
  }
  if (off < size)
    return rm_fail(REFMODEL_EFORMAT, "'%s': %zu bytes left after the %d tokens expected", name,
                   size - off, vocab_size);
  if (n == 0)
    return rm_fail(REFMODEL_EFORMAT, "'%s': holds no token", name);
  if (fill != NULL)
    fill->max_token_length = mtl;
  *n_tokens = n;
  *blob_bytes = blob;
  return REFMODEL_OK;
}

int refmodel_tokenizer_load_buffer(const void *data, size_t size, const char *name, int vocab_size,
                                   refmodel_tokenizer **out)
{
  if (name == NULL)
    name = "(buffer)";
  if (out == NULL)
    return rm_fail(REFMODEL_EINVAL, "refmodel_tokenizer_load_buffer: out is NULL");
  *out = NULL;
  if (data == NULL && size > 0)
    return rm_fail(REFMODEL_EINVAL, "refmodel_tokenizer_load_buffer: data is NULL");
  if (vocab_size < 0 || vocab_size > REFMODEL_MAX_VOCAB)
    return rm_fail(REFMODEL_EINVAL, "'%s': vocab_size %d requested (must be 0..%d)", name,
                   vocab_size, REFMODEL_MAX_VOCAB);
  int n;
  size_t blob_bytes;
  int rc = walk(data, size, name, vocab_size, NULL, &n, &blob_bytes);
  if (rc != 0)
    return rc;
  refmodel_tokenizer *tok = calloc(1, sizeof *tok);
  if (tok == NULL)
    return rm_fail(REFMODEL_ENOMEM, "'%s': out of memory", name);
  tok->vocab_size = n;
  tok->blob = malloc(blob_bytes > 0 ? blob_bytes : 1);
  tok->piece = malloc((size_t)n * sizeof *tok->piece);
  tok->piece_len = malloc((size_t)n * sizeof *tok->piece_len);
  tok->score = malloc((size_t)n * sizeof *tok->score);
  tok->sorted = malloc((size_t)n * sizeof *tok->sorted);
  if (!tok->blob || !tok->piece || !tok->piece_len || !tok->score || !tok->sorted) {
    refmodel_tokenizer_free(tok);
    return rm_fail(REFMODEL_ENOMEM, "'%s': out of memory for %d tokens", name, n);
  }
  rc = walk(data, size, name, vocab_size, tok, &n, &blob_bytes);
  if (rc != 0) {
    refmodel_tokenizer_free(tok);
    return rc;
  }
  for (int i = 0; i < n; i++) {
    tok->sorted[i].str = tok->piece[i];
    tok->sorted[i].len = tok->piece_len[i];
    tok->sorted[i].id = i;
  }
  qsort(tok->sorted, (size_t)n, sizeof *tok->sorted, cmp_index);
  for (int i = 0; i < 256; i++)
    tok->bytes[i] = (unsigned char)i;
  *out = tok;
  return REFMODEL_OK;
}

int refmodel_tokenizer_load(const char *path, int vocab_size, refmodel_tokenizer **out)
{
  if (out == NULL || path == NULL)
    return rm_fail(REFMODEL_EINVAL, "refmodel_tokenizer_load: %s is NULL",
                   out == NULL ? "out" : "path");
  *out = NULL;
  FILE *f = fopen(path, "rb");
  if (f == NULL)
    return rm_fail(REFMODEL_EIO, "'%s': cannot open: %s", path, strerror(errno));
  /* Read to the end in growing chunks: no trust in a size reported for pipes or directories. */
  unsigned char *buf = NULL;
  size_t size = 0, cap = 0;
  int rc = REFMODEL_OK;
  for (;;) {
    if (size == cap) {
      size_t new_cap = cap == 0 ? 65536 : 2 * cap;
      unsigned char *grown = new_cap > cap ? realloc(buf, new_cap) : NULL;
      if (grown == NULL) {
        rc = rm_fail(REFMODEL_ENOMEM, "'%s': out of memory after %zu bytes", path, size);
        break;
      }
      buf = grown;
      cap = new_cap;
    }
    size_t got = fread(buf + size, 1, cap - size, f);
    size += got;
    if (got == 0) {
      if (ferror(f))
        rc = rm_fail(REFMODEL_EIO, "'%s': read error after %zu bytes: %s", path, size,
                     strerror(errno));
      break;
    }
  }
  fclose(f);
  if (rc == REFMODEL_OK)
    rc = refmodel_tokenizer_load_buffer(buf, size, path, vocab_size, out);
  free(buf);
  return rc;
}

void refmodel_tokenizer_free(refmodel_tokenizer *tok)
{
  if (tok == NULL)
    return;
  free(tok->blob);
  free(tok->piece);
  free(tok->piece_len);
  free(tok->score);
  free(tok->sorted);
  free(tok);
}

int refmodel_tokenizer_vocab_size(const refmodel_tokenizer *tok)
{
  return tok->vocab_size;
}

/* ---- encoding -------------------------------------------------------------------------- */

struct cand {
  float score;
  uint32_t left; /* symbol index; symbols keep text order, so a lower index is further left */
  int left_id, right_id, merged_id;
};

struct encoder {
  const refmodel_tokenizer *tok;
  int *id;               /* [n_sym] token id, -1 once merged into its left neighbour */
  uint32_t *prev, *next; /* [n_sym] linked list, NONE at the ends */
  struct cand *heap;     /* max-heap, capacity 3 * n_sym */
  size_t n_heap;
  char *buf; /* 2 * max_token_length bytes for a concatenation */
};

static int cand_better(const struct cand *a, const struct cand *b)
{
  return a->score > b->score || (a->score == b->score && a->left < b->left);
}

static void heap_push(struct encoder *e, struct cand c)
{
  size_t i = e->n_heap++;
  while (i > 0) {
    size_t parent = (i - 1) / 2;
    if (!cand_better(&c, &e->heap[parent]))
      break;
    e->heap[i] = e->heap[parent];
    i = parent;
  }
  e->heap[i] = c;
}

static struct cand heap_pop(struct encoder *e)
{
  struct cand top = e->heap[0], last = e->heap[--e->n_heap];
  size_t i = 0, n = e->n_heap;
  for (;;) {
    size_t child = 2 * i + 1;
    if (child >= n)
      break;
    if (child + 1 < n && cand_better(&e->heap[child + 1], &e->heap[child]))
      child++;
    if (!cand_better(&e->heap[child], &last))
      break;
    e->heap[i] = e->heap[child];
    i = child;
  }
  if (n > 0)
    e->heap[i] = last;
  return top;
}

/* Push the pair (left, next[left]) if its concatenation is a piece that may merge. */
static void push_pair(struct encoder *e, uint32_t left)
{
  if (left == NONE || e->next[left] == NONE)
    return;
  uint32_t right = e->next[left];
  const refmodel_tokenizer *tok = e->tok;
  int a = e->id[left], b = e->id[right];
  int la = tok->piece_len[a], lb = tok->piece_len[b];
  memcpy(e->buf, tok->piece[a], (size_t)la);
  memcpy(e->buf + la, tok->piece[b], (size_t)lb);
  int merged = lookup(tok, e->buf, la + lb);
  if (merged < 0 || !(tok->score[merged] > NO_MERGE_SCORE))
    return;
  struct cand c = {tok->score[merged], left, a, b, merged};
  heap_push(e, c);
}

size_t refmodel_encode_bound(size_t len)
{
  return len > SIZE_MAX - 3 ? SIZE_MAX : len + 3;
}

int refmodel_encode(const refmodel_tokenizer *tok, const char *text, size_t len, unsigned flags,
                    int *tokens, size_t cap, size_t *n_tokens)
{
  if (tok == NULL || n_tokens == NULL || (text == NULL && len > 0) || (tokens == NULL && cap > 0))
    return rm_fail(REFMODEL_EINVAL, "refmodel_encode: NULL argument");
  if ((flags & ~(REFMODEL_ENCODE_BOS | REFMODEL_ENCODE_EOS)) != 0)
    return rm_fail(REFMODEL_EINVAL, "refmodel_encode: unknown flags 0x%x", flags);
  if (len >= MAX_TEXT_BYTES || len >= SIZE_MAX / (3 * sizeof(struct cand)))
    return rm_fail(REFMODEL_EINVAL, "refmodel_encode: text of %zu bytes is too long", len);
  if ((flags & REFMODEL_ENCODE_BOS) && REFMODEL_TOKEN_BOS >= tok->vocab_size)
    return rm_fail(REFMODEL_EINVAL, "refmodel_encode: BOS (%d) outside the vocab (%d tokens)",
                   REFMODEL_TOKEN_BOS, tok->vocab_size);
  if ((flags & REFMODEL_ENCODE_EOS) && REFMODEL_TOKEN_EOS >= tok->vocab_size)
    return rm_fail(REFMODEL_EINVAL, "refmodel_encode: EOS (%d) outside the vocab (%d tokens)",
                   REFMODEL_TOKEN_EOS, tok->vocab_size);

  size_t cap_sym = len + 1; /* the dummy prefix, then at most one symbol per byte */
  struct encoder e = {tok, NULL, NULL, NULL, NULL, 0, NULL};
  e.id = malloc(cap_sym * sizeof *e.id);
  e.prev = malloc(cap_sym * sizeof *e.prev);
  e.next = malloc(cap_sym * sizeof *e.next);
  e.heap = malloc(3 * cap_sym * sizeof *e.heap);
  e.buf = malloc(2 * (size_t)tok->max_token_length);
  int rc = REFMODEL_OK;
  if (!e.id || !e.prev || !e.next || !e.heap || !e.buf) {
    rc = rm_fail(REFMODEL_ENOMEM, "refmodel_encode: out of memory for %zu bytes of text", len);
    goto done;
  }

  /* Initial symbols: the dummy prefix, then UTF-8 sequences or byte fallbacks (llama2.c). */
  uint32_t n_sym = 0;
  if (len > 0) {
    int space = lookup(tok, " ", 1);
    if (space < 0)
      space = ' ' + 3;
    if (space >= tok->vocab_size) {
      rc = rm_fail(REFMODEL_EINVAL,
                   "refmodel_encode: \" \" has no piece and its byte-fallback id %d is outside "
                   "the vocab (%d tokens)",
                   space, tok->vocab_size);
      goto done;
    }
    e.id[n_sym++] = space;
  }
  for (size_t i = 0; i < len;) {
    size_t n = 1;
    while (n < 4 && i + n < len && ((unsigned char)text[i + n] & 0xC0) == 0x80)
      n++;
    int id = lookup(tok, text + i, (int)n);
    if (id >= 0) {
      e.id[n_sym++] = id;
    } else {
      for (size_t j = 0; j < n; j++) {
        int byte = (unsigned char)text[i + j];
        if (byte + 3 >= tok->vocab_size) {
          rc = rm_fail(REFMODEL_EINVAL,
                       "refmodel_encode: byte 0x%02X at offset %zu has no piece and its "
                       "byte-fallback id %d is outside the vocab (%d tokens)",
                       (unsigned)byte, i + j, byte + 3, tok->vocab_size);
          goto done;
        }
        e.id[n_sym++] = byte + 3;
      }
    }
    i += n;
  }
  for (uint32_t i = 0; i < n_sym; i++) {
    e.prev[i] = i > 0 ? i - 1 : NONE;
    e.next[i] = i + 1 < n_sym ? i + 1 : NONE;
  }

  for (uint32_t i = 0; i + 1 < n_sym; i++)
    push_pair(&e, i);
  while (e.n_heap > 0) {
    struct cand c = heap_pop(&e);
    uint32_t right = e.next[c.left];
    if (e.id[c.left] != c.left_id || right == NONE || e.id[right] != c.right_id)
      continue; /* stale */
    e.id[c.left] = c.merged_id;
    e.id[right] = -1;
    e.next[c.left] = e.next[right];
    if (e.next[right] != NONE)
      e.prev[e.next[right]] = c.left;
    if (e.prev[c.left] != NONE)
      push_pair(&e, e.prev[c.left]);
    push_pair(&e, c.left);
  }

  size_t count = 0;
  for (uint32_t i = n_sym > 0 ? 0 : NONE; i != NONE; i = e.next[i])
    count++;
  count += ((flags & REFMODEL_ENCODE_BOS) != 0) + ((flags & REFMODEL_ENCODE_EOS) != 0);
  *n_tokens = count;
  if (count > cap) {
    rc = rm_fail(REFMODEL_ENOSPC, "refmodel_encode: %zu tokens do not fit in %zu", count, cap);
    goto done;
  }
  size_t k = 0;
  if (flags & REFMODEL_ENCODE_BOS)
    tokens[k++] = REFMODEL_TOKEN_BOS;
  for (uint32_t i = n_sym > 0 ? 0 : NONE; i != NONE; i = e.next[i])
    tokens[k++] = e.id[i];
  if (flags & REFMODEL_ENCODE_EOS)
    tokens[k++] = REFMODEL_TOKEN_EOS;
done:
  free(e.id);
  free(e.prev);
  free(e.next);
  free(e.heap);
  free(e.buf);
  return rc;
}

/* ---- decoding -------------------------------------------------------------------------- */

static int hex_value(char ch)
{
  if (ch >= '0' && ch <= '9')
    return ch - '0';
  if (ch >= 'A' && ch <= 'F')
    return ch - 'A' + 10;
  if (ch >= 'a' && ch <= 'f')
    return ch - 'a' + 10;
  return -1;
}

int refmodel_decode(const refmodel_tokenizer *tok, int prev_token, int token, const char **piece,
                    size_t *len)
{
  if (tok == NULL || piece == NULL || len == NULL)
    return rm_fail(REFMODEL_EINVAL, "refmodel_decode: NULL argument");
  if (token < 0 || token >= tok->vocab_size)
    return rm_fail(REFMODEL_EINVAL, "refmodel_decode: token %d out of range [0, %d)", token,
                   tok->vocab_size);
  const char *p = tok->piece[token];
  size_t n = (size_t)tok->piece_len[token];
  if (prev_token == REFMODEL_TOKEN_BOS && n > 0 && p[0] == ' ') {
    p++;
    n--;
  }
  if (n == 6 && p[0] == '<' && p[1] == '0' && p[2] == 'x' && p[5] == '>') {
    int hi = hex_value(p[3]), lo = hex_value(p[4]);
    if (hi >= 0 && lo >= 0) {
      p = (const char *)&tok->bytes[hi * 16 + lo];
      n = 1;
    }
  }
  *piece = p;
  *len = n;
  return REFMODEL_OK;
}

int refmodel_detokenize(const refmodel_tokenizer *tok, int prev_token, const int *tokens, size_t n,
                        char *out, size_t cap, size_t *out_len)
{
  if (tok == NULL || out_len == NULL || (tokens == NULL && n > 0) || (out == NULL && cap > 0))
    return rm_fail(REFMODEL_EINVAL, "refmodel_detokenize: NULL argument");
  size_t total = 0;
  for (size_t i = 0; i < n; i++) {
    const char *piece = NULL;
    size_t len = 0;
    int rc = refmodel_decode(tok, i > 0 ? tokens[i - 1] : prev_token, tokens[i], &piece, &len);
    if (rc != 0)
      return rm_fail(rc, "refmodel_detokenize: tokens[%zu] = %d out of range [0, %d)", i, tokens[i],
                     tok->vocab_size);
    if (total < cap)
      memcpy(out + total, piece, len < cap - total ? len : cap - total);
    total += len;
  }
  *out_len = total;
  if (total > cap)
    return rm_fail(REFMODEL_ENOSPC, "refmodel_detokenize: %zu bytes do not fit in %zu", total, cap);
  return REFMODEL_OK;
}
