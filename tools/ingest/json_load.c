/* SPDX-License-Identifier: MIT */
/*
 * tools/ingest/json_load.c — json_load.h: Jansson's parser with a per-thread allocation bound.
 *
 * Jansson takes one pair of allocation functions for the whole process (json_set_alloc_funcs),
 * so they are installed once, before main, by a constructor of this file: every Jansson block
 * of the process carries a 16-byte header with its size. While a thread is inside
 * ingest_json_load its live Jansson bytes are counted, and an allocation that would pass the
 * bound fails; Jansson then gives up the parse with json_error_out_of_memory.
 */
#define _POSIX_C_SOURCE 200809L
#include "json_load.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#define HDR 16 /* keeps Jansson's blocks aligned as malloc's are */

static _Thread_local size_t tl_limit; /* 0: not inside a bounded parse */
static _Thread_local size_t tl_used;
static _Thread_local int tl_over;

static void *counted_malloc(size_t n)
{
  if (n > SIZE_MAX - HDR)
    return NULL;
  if (tl_limit != 0) {
    if (tl_used > tl_limit || n + HDR > tl_limit - tl_used) {
      tl_over = 1;
      return NULL;
    }
    tl_used += n + HDR;
  }
  unsigned char *p = malloc(n + HDR);
  if (p == NULL)
    return NULL;
  *(size_t *)(void *)p = n;
  return p + HDR;
}

static void counted_free(void *q)
{
  if (q == NULL)
    return;
  unsigned char *p = (unsigned char *)q - HDR;
  size_t n = *(size_t *)(void *)p;
  if (tl_limit != 0)
    tl_used = tl_used > n + HDR ? tl_used - (n + HDR) : 0;
  free(p);
}

__attribute__((constructor)) static void install_alloc(void)
{
  json_set_alloc_funcs(counted_malloc, counted_free);
}

json_t *ingest_json_load(const char *text, size_t len, size_t flags, size_t max_mem, char *err,
                         size_t err_cap)
{
  json_error_t je;
  tl_limit = max_mem;
  tl_used = 0;
  tl_over = 0;
  json_t *v = json_loadb(text, len, flags, &je);
  int over = tl_over;
  tl_limit = 0;
  if (v != NULL)
    return v;
  if (err_cap == 0)
    return NULL;
  if (over)
    snprintf(err, err_cap, "needs more than %zu MiB of memory to parse", max_mem >> 20);
  else
    snprintf(err, err_cap, "line %d, column %d: %s", je.line, je.column, je.text);
  return NULL;
}

const char *ingest_json_type(const json_t *v)
{
  if (v == NULL)
    return "nothing";
  switch (json_typeof(v)) {
  case JSON_OBJECT: return "object";
  case JSON_ARRAY: return "array";
  case JSON_STRING: return "string";
  case JSON_INTEGER:
  case JSON_REAL: return "number";
  case JSON_TRUE: return "true";
  case JSON_FALSE: return "false";
  case JSON_NULL: return "null";
  }
  return "nothing";
}
