/* SPDX-License-Identifier: MIT */
/*
 * tests/fuzz/fuzz_ingest_json.c — tools/ingest/json.c (the JSON parser kvdb-ingest runs on JSONL
 * rows and safetensors headers) on untrusted bytes.
 *
 * A rejected input must come with a message. For an accepted one the value array must be a
 * well-formed pre-order tree (every `next` inside (i, n], children counted exactly, object keys
 * strings, every range inside the text), every string must decode (js_string), every number
 * that js_u64 accepts must consist of digits, and member lookups must return a member's value.
 * Seeds: tests/fuzz/corpora/ingest_json/ (made by tools/ingest/make_fuzz_seeds.py).
 */
#include "json.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Check the subtree at i; returns the index after it. */
static size_t walk(const js_doc *d, size_t i, int depth)
{
  if (i >= d->n || depth > JS_MAX_DEPTH + 1)
    abort();
  const js_val *v = &d->v[i];
  if (v->next <= i || v->next > d->n || v->start > v->end || v->end > d->len)
    abort();
  size_t k = i + 1;
  if (v->type == JS_OBJECT || v->type == JS_ARRAY) {
    for (uint32_t c = 0; c < v->n_children; c++) {
      if (v->type == JS_OBJECT) {
        if (k >= d->n || d->v[k].type != JS_STRING)
          abort();
        size_t val = k + 1;
        char *key;
        size_t key_len;
        if (js_string(d, k, &key, &key_len) != 0)
          abort();
        if (strlen(key) == key_len) {
          size_t got = js_get(d, i, key);
          if (got == 0 || got >= d->n) /* the first member with that key */
            abort();
        }
        free(key);
        k = walk(d, val, depth + 1);
      } else {
        if (js_elem(d, i, c) != k)
          abort();
        k = walk(d, k, depth + 1);
      }
    }
    if (k != v->next)
      abort();
  } else {
    if (v->n_children != 0 || k != v->next)
      abort();
    if (v->type == JS_STRING) {
      char *s;
      size_t len;
      if (js_string(d, i, &s, &len) != 0)
        abort();
      if (!js_string_eq(d, i, s) && strlen(s) == len)
        abort();
      free(s);
    } else if (v->type == JS_NUMBER) {
      uint64_t x;
      if (js_u64(d, i, &x) == 0)
        for (uint32_t p = v->start; p < v->end; p++)
          if (d->text[p] < '0' || d->text[p] > '9')
            abort();
    }
  }
  return k;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
  js_doc d;
  char err[256];
  if (js_parse(&d, (const char *)data, size, 1u << 16, err, sizeof err) != 0) {
    if (err[0] == '\0' || d.v != NULL || d.n != 0)
      abort();
    return 0;
  }
  if (d.n < 1 || walk(&d, 0, 0) != d.n)
    abort();
  js_free(&d);
  return 0;
}
