/* SPDX-License-Identifier: MIT */
/*
 * tests/fuzz/fuzz_ingest_json.c — tools/ingest/json_load.c (Jansson under kvdb-ingest's memory
 * bound, the parser of JSONL rows and safetensors headers) on untrusted bytes, with the flags of
 * both callers and a 1 MiB bound, so that fuzz-sized inputs reach the bound too.
 *
 * A rejected input must come with a message naming the line and column (or the bound). An
 * accepted one must be a well-formed tree: every member found again by its key (no duplicate
 * keys), every string as long as Jansson says and NUL-free where it is a key; and it must write
 * back (json_dumpb) to text that parses to an equal value.
 * Seeds: tests/fuzz/corpora/ingest_json/ (made by tools/ingest/make_fuzz_seeds.py).
 */
#include "json_load.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define FUZZ_MAX_MEM ((size_t)1 << 20)

/* Check the tree under v (depth bounded by Jansson's 2048 levels). */
static void walk(json_t *v, int depth)
{
  if (v == NULL || depth > 2048 + 1)
    abort();
  if (json_is_object(v)) {
    const char *key;
    json_t *m;
    size_t n = 0;
    json_object_foreach(v, key, m) {
      if (json_object_get(v, key) != m)
        abort();
      walk(m, depth + 1);
      n++;
    }
    if (n != json_object_size(v))
      abort();
  } else if (json_is_array(v)) {
    for (size_t i = 0; i < json_array_size(v); i++)
      walk(json_array_get(v, i), depth + 1);
  } else if (json_is_string(v)) {
    if (strlen(json_string_value(v)) > json_string_length(v))
      abort();
  } else if (!json_is_number(v) && !json_is_boolean(v) && !json_is_null(v)) {
    abort();
  }
}

static void one(const uint8_t *data, size_t size, size_t flags)
{
  char err[256] = "";
  json_t *v = ingest_json_load((const char *)data, size, flags, FUZZ_MAX_MEM, err, sizeof err);
  if (v == NULL) {
    if (strncmp(err, "line ", 5) != 0 && strncmp(err, "needs more than ", 16) != 0)
      abort();
    return;
  }
  walk(v, 0);
  size_t n = json_dumpb(v, NULL, 0, JSON_ENCODE_ANY | JSON_COMPACT);
  char *text = malloc(n + 1);
  if (n == 0 || text == NULL || json_dumpb(v, text, n, JSON_ENCODE_ANY | JSON_COMPACT) != n)
    abort();
  json_t *w = ingest_json_load(text, n, flags, 0, err, sizeof err);
  if (w == NULL || !json_equal(v, w))
    abort();
  json_decref(w);
  free(text);
  json_decref(v);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
  /* a JSONL row (docs.c) and a safetensors header (safetensors.c) */
  one(data, size, JSON_DECODE_ANY | JSON_ALLOW_NUL | JSON_REJECT_DUPLICATES | JSON_DECODE_INT_AS_REAL);
  one(data, size, JSON_DECODE_ANY | JSON_ALLOW_NUL | JSON_REJECT_DUPLICATES);
  return 0;
}
