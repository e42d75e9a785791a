/* SPDX-License-Identifier: MIT */
/*
 * tools/ingest/json.c — the strict JSON parser of json.h: recursive descent over the grammar of
 * RFC 8259 §2–7 (depth bounded by JS_MAX_DEPTH), values appended to a growing array.
 */
#define _POSIX_C_SOURCE 200809L
#include "json.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct parser {
  const char *s;
  size_t len, pos;
  js_val *v;
  size_t n, cap, max;
  char *err;
  size_t err_cap;
  int failed;
} parser;

#if defined(__GNUC__)
__attribute__((format(printf, 2, 3)))
#endif
static int
fail(parser *p, const char *fmt, ...)
{
  if (p->failed)
    return -1;
  p->failed = 1;
  size_t line = 1, col = 1;
  for (size_t i = 0; i < p->pos && i < p->len; i++) {
    if (p->s[i] == '\n') {
      line++;
      col = 1;
    } else {
      col++;
    }
  }
  if (p->err_cap == 0)
    return -1;
  int k = snprintf(p->err, p->err_cap, "line %zu, column %zu: ", line, col);
  if (k >= 0 && (size_t)k < p->err_cap) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(p->err + k, p->err_cap - (size_t)k, fmt, ap);
    va_end(ap);
  }
  return -1;
}

/* A short description of the byte at the current position, for messages. */
static const char *found(parser *p, char *buf, size_t cap)
{
  if (p->pos >= p->len)
    return "the end of the text";
  unsigned char c = (unsigned char)p->s[p->pos];
  if (c >= 0x20 && c < 0x7f)
    snprintf(buf, cap, "'%c'", c);
  else
    snprintf(buf, cap, "byte 0x%02x", c);
  return buf;
}

static void skip_ws(parser *p)
{
  while (p->pos < p->len) {
    char c = p->s[p->pos];
    if (c != ' ' && c != '\t' && c != '\n' && c != '\r')
      break;
    p->pos++;
  }
}

static long new_val(parser *p, js_type type)
{
  if (p->n >= p->max)
    return fail(p, "more than %zu JSON values", p->max);
  if (p->n == p->cap) {
    size_t cap = p->cap ? p->cap * 2 : 64;
    if (cap > p->max)
      cap = p->max;
    js_val *nv = realloc(p->v, cap * sizeof *nv);
    if (nv == NULL)
      return fail(p, "out of memory for %zu JSON values", cap);
    p->v = nv;
    p->cap = cap;
  }
  js_val *v = &p->v[p->n];
  memset(v, 0, sizeof *v);
  v->type = (uint8_t)type;
  v->start = (uint32_t)p->pos;
  return (long)p->n++;
}

static int hexval(char c)
{
  if (c >= '0' && c <= '9')
    return c - '0';
  if (c >= 'a' && c <= 'f')
    return c - 'a' + 10;
  if (c >= 'A' && c <= 'F')
    return c - 'A' + 10;
  return -1;
}

static int parse_string(parser *p)
{
  long i = new_val(p, JS_STRING);
  if (i < 0)
    return -1;
  p->pos++; /* the opening quote */
  p->v[i].start = (uint32_t)p->pos;
  while (p->pos < p->len) {
    unsigned char c = (unsigned char)p->s[p->pos];
    if (c == '"') {
      p->v[i].end = (uint32_t)p->pos;
      p->pos++;
      p->v[i].next = (uint32_t)p->n;
      return 0;
    }
    if (c < 0x20)
      return fail(p, "control character 0x%02x inside a string (must be escaped)", c);
    if (c == '\\') {
      if (p->pos + 1 >= p->len)
        break;
      char e = p->s[p->pos + 1];
      if (e == 'u') {
        for (int k = 0; k < 4; k++)
          if (p->pos + 2 + (size_t)k >= p->len || hexval(p->s[p->pos + 2 + (size_t)k]) < 0) {
            p->pos += 2 + (size_t)k;
            return fail(p, "\\u must be followed by four hex digits");
          }
        p->pos += 6;
        continue;
      }
      if (strchr("\"\\/bfnrt", e) == NULL || e == '\0') {
        p->pos++;
        return fail(p, "invalid escape '\\%c' in a string", e >= 0x20 && e < 0x7f ? e : '?');
      }
      p->pos += 2;
      continue;
    }
    p->pos++;
  }
  return fail(p, "unterminated string");
}

static int digits(parser *p)
{
  size_t start = p->pos;
  while (p->pos < p->len && p->s[p->pos] >= '0' && p->s[p->pos] <= '9')
    p->pos++;
  return p->pos > start ? 0 : -1;
}

static int parse_number(parser *p)
{
  long i = new_val(p, JS_NUMBER);
  if (i < 0)
    return -1;
  char buf[16];
  if (p->s[p->pos] == '-')
    p->pos++;
  if (p->pos < p->len && p->s[p->pos] == '0') {
    p->pos++;
  } else if (digits(p) != 0) {
    return fail(p, "expected a digit in a number, found %s", found(p, buf, sizeof buf));
  }
  if (p->pos < p->len && p->s[p->pos] == '.') {
    p->pos++;
    if (digits(p) != 0)
      return fail(p, "expected a digit after '.', found %s", found(p, buf, sizeof buf));
  }
  if (p->pos < p->len && (p->s[p->pos] == 'e' || p->s[p->pos] == 'E')) {
    p->pos++;
    if (p->pos < p->len && (p->s[p->pos] == '+' || p->s[p->pos] == '-'))
      p->pos++;
    if (digits(p) != 0)
      return fail(p, "expected a digit in an exponent, found %s", found(p, buf, sizeof buf));
  }
  p->v[i].end = (uint32_t)p->pos;
  p->v[i].next = (uint32_t)p->n;
  return 0;
}

static int parse_value(parser *p, int depth);

static int parse_container(parser *p, int depth, int object)
{
  char buf[16];
  if (depth >= JS_MAX_DEPTH)
    return fail(p, "nesting deeper than %d", JS_MAX_DEPTH);
  long i = new_val(p, object ? JS_OBJECT : JS_ARRAY);
  if (i < 0)
    return -1;
  p->pos++; /* '{' or '[' */
  char close = object ? '}' : ']';
  uint32_t count = 0;
  skip_ws(p);
  if (p->pos < p->len && p->s[p->pos] == close) {
    p->pos++;
  } else {
    for (;;) {
      skip_ws(p);
      if (object) {
        if (p->pos >= p->len || p->s[p->pos] != '"')
          return fail(p, "expected a member name (a string), found %s", found(p, buf, sizeof buf));
        if (parse_string(p) != 0)
          return -1;
        skip_ws(p);
        if (p->pos >= p->len || p->s[p->pos] != ':')
          return fail(p, "expected ':' after a member name, found %s", found(p, buf, sizeof buf));
        p->pos++;
      }
      if (parse_value(p, depth + 1) != 0)
        return -1;
      count++;
      skip_ws(p);
      if (p->pos < p->len && p->s[p->pos] == ',') {
        p->pos++;
        continue;
      }
      if (p->pos < p->len && p->s[p->pos] == close) {
        p->pos++;
        break;
      }
      return fail(p, "expected ',' or '%c' after %s, found %s", close,
                  object ? "an object member" : "an array element", found(p, buf, sizeof buf));
    }
  }
  p->v[i].n_children = count;
  p->v[i].end = (uint32_t)p->pos;
  p->v[i].next = (uint32_t)p->n;
  return 0;
}

static int parse_literal(parser *p, const char *word, js_type type)
{
  size_t n = strlen(word);
  if (p->len - p->pos < n || memcmp(p->s + p->pos, word, n) != 0)
    return fail(p, "invalid literal (expected '%s')", word);
  long i = new_val(p, type);
  if (i < 0)
    return -1;
  p->pos += n;
  p->v[i].end = (uint32_t)p->pos;
  p->v[i].next = (uint32_t)p->n;
  return 0;
}

static int parse_value(parser *p, int depth)
{
  char buf[16];
  skip_ws(p);
  if (p->pos >= p->len)
    return fail(p, "expected a value, found the end of the text");
  char c = p->s[p->pos];
  switch (c) {
  case '{':
    return parse_container(p, depth, 1);
  case '[':
    return parse_container(p, depth, 0);
  case '"':
    return parse_string(p);
  case 't':
    return parse_literal(p, "true", JS_TRUE);
  case 'f':
    return parse_literal(p, "false", JS_FALSE);
  case 'n':
    return parse_literal(p, "null", JS_NULL);
  default:
    if (c == '-' || (c >= '0' && c <= '9'))
      return parse_number(p);
    return fail(p, "expected a value, found %s", found(p, buf, sizeof buf));
  }
}

int js_parse(js_doc *d, const char *text, size_t len, size_t max_values, char *err, size_t err_cap)
{
  memset(d, 0, sizeof *d);
  parser p = {.s = text, .len = len, .max = max_values, .err = err, .err_cap = err_cap};
  if (err_cap > 0)
    err[0] = '\0';
  if (text == NULL && len > 0)
    return fail(&p, "no text");
  if (len >= UINT32_MAX)
    return fail(&p, "text of %zu bytes is too long (at most %u)", len, UINT32_MAX - 1);
  if (max_values == 0)
    return fail(&p, "no JSON values allowed");
  int rc = parse_value(&p, 0);
  if (rc == 0) {
    skip_ws(&p);
    if (p.pos < p.len) {
      char buf[16];
      rc = fail(&p, "unexpected %s after the value", found(&p, buf, sizeof buf));
    }
  }
  if (rc != 0) {
    free(p.v);
    return -1;
  }
  d->text = text;
  d->len = len;
  d->v = p.v;
  d->n = p.n;
  return 0;
}

void js_free(js_doc *d)
{
  free(d->v);
  memset(d, 0, sizeof *d);
}

const char *js_type_name(int type)
{
  static const char *const names[] = {"?",      "object", "array", "string",
                                      "number", "true",   "false", "null"};
  return type >= 1 && type <= 7 ? names[type] : "?";
}

/* Decode the string at index i into out (when not NULL); returns the decoded length. */
static size_t decode(const js_doc *d, size_t i, char *out)
{
  const char *s = d->text + d->v[i].start;
  size_t n = d->v[i].end - d->v[i].start, o = 0;
  for (size_t k = 0; k < n;) {
    if (s[k] != '\\') {
      if (out != NULL)
        out[o] = s[k];
      o++;
      k++;
      continue;
    }
    char e = s[k + 1];
    if (e != 'u') {
      char c = e == 'b'   ? '\b'
               : e == 'f' ? '\f'
               : e == 'n' ? '\n'
               : e == 'r' ? '\r'
               : e == 't' ? '\t'
                          : e;
      if (out != NULL)
        out[o] = c;
      o++;
      k += 2;
      continue;
    }
    unsigned cp = 0;
    for (int j = 0; j < 4; j++)
      cp = cp << 4 | (unsigned)hexval(s[k + 2 + (size_t)j]);
    k += 6;
    if (cp >= 0xd800 && cp <= 0xdbff && k + 6 <= n && s[k] == '\\' && s[k + 1] == 'u') {
      unsigned lo = 0;
      for (int j = 0; j < 4; j++)
        lo = lo << 4 | (unsigned)hexval(s[k + 2 + (size_t)j]);
      if (lo >= 0xdc00 && lo <= 0xdfff) {
        cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
        k += 6;
      }
    }
    if (cp >= 0xd800 && cp <= 0xdfff)
      cp = 0xfffd; /* a lone surrogate */
    unsigned char u[4];
    size_t m;
    if (cp < 0x80) {
      u[0] = (unsigned char)cp;
      m = 1;
    } else if (cp < 0x800) {
      u[0] = (unsigned char)(0xc0 | cp >> 6);
      u[1] = (unsigned char)(0x80 | (cp & 0x3f));
      m = 2;
    } else if (cp < 0x10000) {
      u[0] = (unsigned char)(0xe0 | cp >> 12);
      u[1] = (unsigned char)(0x80 | ((cp >> 6) & 0x3f));
      u[2] = (unsigned char)(0x80 | (cp & 0x3f));
      m = 3;
    } else {
      u[0] = (unsigned char)(0xf0 | cp >> 18);
      u[1] = (unsigned char)(0x80 | ((cp >> 12) & 0x3f));
      u[2] = (unsigned char)(0x80 | ((cp >> 6) & 0x3f));
      u[3] = (unsigned char)(0x80 | (cp & 0x3f));
      m = 4;
    }
    if (out != NULL)
      memcpy(out + o, u, m);
    o += m;
  }
  return o;
}

int js_string(const js_doc *d, size_t i, char **out, size_t *len)
{
  *out = NULL;
  if (i >= d->n || d->v[i].type != JS_STRING)
    return -1;
  size_t n = decode(d, i, NULL);
  char *buf = malloc(n + 1);
  if (buf == NULL)
    return -1;
  decode(d, i, buf);
  buf[n] = '\0';
  *out = buf;
  if (len != NULL)
    *len = n;
  return 0;
}

int js_string_eq(const js_doc *d, size_t i, const char *s)
{
  if (i >= d->n || d->v[i].type != JS_STRING)
    return 0;
  size_t want = strlen(s);
  const char *raw = d->text + d->v[i].start;
  size_t raw_len = d->v[i].end - d->v[i].start;
  if (memchr(raw, '\\', raw_len) == NULL)
    return raw_len == want && memcmp(raw, s, want) == 0;
  if (decode(d, i, NULL) != want)
    return 0;
  char *tmp;
  if (js_string(d, i, &tmp, NULL) != 0)
    return 0;
  int eq = memcmp(tmp, s, want) == 0;
  free(tmp);
  return eq;
}

size_t js_get(const js_doc *d, size_t obj, const char *key)
{
  if (obj >= d->n || d->v[obj].type != JS_OBJECT)
    return 0;
  size_t k = obj + 1;
  for (uint32_t m = 0; m < d->v[obj].n_children; m++) {
    size_t val = k + 1;
    if (js_string_eq(d, k, key))
      return val;
    k = d->v[val].next;
  }
  return 0;
}

size_t js_elem(const js_doc *d, size_t arr, size_t i)
{
  if (arr >= d->n || d->v[arr].type != JS_ARRAY || i >= d->v[arr].n_children)
    return 0;
  size_t k = arr + 1;
  for (size_t m = 0; m < i; m++)
    k = d->v[k].next;
  return k;
}

int js_u64(const js_doc *d, size_t i, uint64_t *out)
{
  if (i >= d->n || d->v[i].type != JS_NUMBER)
    return -1;
  const char *s = d->text + d->v[i].start;
  size_t n = d->v[i].end - d->v[i].start;
  uint64_t v = 0;
  for (size_t k = 0; k < n; k++) {
    if (s[k] < '0' || s[k] > '9')
      return -1;
    unsigned dgt = (unsigned)(s[k] - '0');
    if (v > (UINT64_MAX - dgt) / 10)
      return -1;
    v = v * 10 + dgt;
  }
  *out = v;
  return 0;
}
