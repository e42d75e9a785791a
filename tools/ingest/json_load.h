/* SPDX-License-Identifier: MIT */
/*
 * tools/ingest/json_load.h — kvdb-ingest's one way to parse JSON from outside (JSONL rows and
 * safetensors headers): Jansson's json_loadb under a memory bound, with errors that name the
 * line and column. Not part of libkvdb.
 *
 * Jansson itself checks the grammar (RFC 8259: UTF-8 text, nesting up to 2048 levels); this
 * adds the bound on what one parse may allocate (Jansson has none, and a small text of many
 * tiny values costs ~40 bytes a value) and kvdb's message format, e.g.
 * "line 1, column 28: string or '}' expected near ','".
 */
#ifndef KVDB_INGEST_JSON_LOAD_H
#define KVDB_INGEST_JSON_LOAD_H

#include <stddef.h>

#include <jansson.h>

/*
 * Parse text[0..len) with Jansson `flags` (JSON_DECODE_ANY etc.; JSON_DISABLE_EOF_CHECK must not
 * be among them). Jansson's allocations during the parse are counted per thread and the parse
 * fails once they pass max_mem bytes (0: no bound). Returns the value (the caller owns it:
 * json_decref), or NULL with the reason in err[0..err_cap): "line L, column C: WHAT", or
 * "needs more than N MiB of memory to parse".
 */
json_t *ingest_json_load(const char *text, size_t len, size_t flags, size_t max_mem, char *err,
                         size_t err_cap);

/* "object", "array", "string", "number", "true", "false", "null" (NULL gives "nothing"). */
const char *ingest_json_type(const json_t *v);

#endif
