/* SPDX-License-Identifier: MIT */
/*
 * tools/ingest/json.h — a small strict JSON (RFC 8259) parser for kvdb-ingest: JSONL rows and
 * safetensors headers. Not part of libkvdb.
 *
 * js_parse() checks the whole text and produces a flat array of values in document order
 * (jsmn's idea): a container is followed by its children, an object's children alternate key
 * (a string) and value, and every value knows the index just past its subtree (`next`), so
 * walking or skipping a subtree needs no recursion. Strings are not decoded until asked for
 * (js_string). Limits: text up to 4 GiB - 1 bytes, nesting up to JS_MAX_DEPTH, at most
 * `max_values` values (a caller-chosen bound on memory: 20 bytes per value).
 *
 * Errors name the line and column and what was expected, e.g.
 * "line 1, column 17: expected ',' or '}' after an object member".
 */
#ifndef KVDB_INGEST_JSON_H
#define KVDB_INGEST_JSON_H

#include <stddef.h>
#include <stdint.h>

#define JS_MAX_DEPTH 64

typedef enum js_type {
  JS_OBJECT = 1,
  JS_ARRAY = 2,
  JS_STRING = 3,
  JS_NUMBER = 4,
  JS_TRUE = 5,
  JS_FALSE = 6,
  JS_NULL = 7,
} js_type;

typedef struct js_val {
  uint8_t type;        /* js_type */
  uint32_t start, end; /* bytes of the value; for a string, between the quotes */
  uint32_t n_children; /* object: members (key/value pairs); array: elements; else 0 */
  uint32_t next;       /* index of the first value after this one's subtree */
} js_val;

typedef struct js_doc {
  const char *text; /* not owned; must outlive the document */
  size_t len;
  js_val *v; /* v[0] is the top-level value */
  size_t n;
} js_doc;

/*
 * Parse text[0..len) (whitespace around the one top-level value is allowed; nothing else). On
 * success returns 0 and fills *d (free with js_free). On failure returns -1, leaves *d empty and
 * writes the reason into err[0..err_cap).
 */
int js_parse(js_doc *d, const char *text, size_t len, size_t max_values, char *err, size_t err_cap);

/* Free what js_parse allocated. A zeroed or already freed js_doc is fine. */
void js_free(js_doc *d);

/* The value of member `key` of the object at index obj, or 0 when obj is not an object or has no
 * such member (0 is never a member's value). Keys are compared after decoding escapes; with
 * duplicate keys the first wins. */
size_t js_get(const js_doc *d, size_t obj, const char *key);

/* Index of the i-th element of the array at index arr, or 0 when out of range. */
size_t js_elem(const js_doc *d, size_t arr, size_t i);

/*
 * Decode the string at index i (escapes resolved, \u surrogate pairs joined into UTF-8, a lone
 * surrogate becoming U+FFFD) into a new NUL-terminated buffer (*out, free with free()); *len
 * receives its byte count (the string may itself contain NUL bytes). Returns 0, or -1 when i is
 * not a string or memory ran out.
 */
int js_string(const js_doc *d, size_t i, char **out, size_t *len);

/* Whether the string at index i decodes to exactly `s`. */
int js_string_eq(const js_doc *d, size_t i, const char *s);

/* The number at index i as an unsigned integer: digits only (no sign, fraction or exponent),
 * at most 2^64 - 1. Returns 0, or -1 when it is not such a number. */
int js_u64(const js_doc *d, size_t i, uint64_t *out);

/* "object", "array", "string", "number", "true", "false", "null". */
const char *js_type_name(int type);

#endif
