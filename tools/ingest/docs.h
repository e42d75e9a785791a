/* SPDX-License-Identifier: MIT */
/*
 * tools/ingest/docs.h — kvdb-ingest's inputs: the list of input files and the documents in them,
 * in a fixed order (so that --max-docs N always means the same N documents, and a rerun after a
 * crash walks the same sequence).
 *
 *   .txt          documents are separated by blank lines (lines of only spaces, tabs and CR): a
 *                 document is a maximal run of non-blank lines, joined with "\n" (CRLF becomes LF)
 *   .jsonl        one JSON object per non-blank line; the document is the string member named by
 *                 the text field (default "text"); a row that is not such an object is an error
 *                 naming the file and line
 *   .safetensors  one context of precomputed KV per file (safetensors.h)
 *
 * A folder is walked recursively in byte order of names; names starting with '.' are skipped and
 * files with other endings are counted as ignored. A file named explicitly must have one of the
 * three endings.
 */
#ifndef KVDB_INGEST_DOCS_H
#define KVDB_INGEST_DOCS_H

#include <stddef.h>
#include <stdint.h>

typedef enum src_kind { SRC_TXT = 1, SRC_JSONL = 2, SRC_SAFETENSORS = 3 } src_kind;

typedef struct src_file {
  char *path;
  src_kind kind;
  uint64_t bytes;
} src_file;

typedef struct src_list {
  src_file *f;
  size_t n;
  size_t ignored; /* files in folders with other endings */
  size_t n_text;  /* .txt and .jsonl files */
} src_list;

/* Build the list. Returns 0, or -1 with the reason in err (a missing path, an unknown ending,
 * no input files at all). */
int src_list_build(const char *const *inputs, size_t n_inputs, src_list *out, char *err,
                   size_t err_cap);
void src_list_free(src_list *l);

/* One document. text is NUL-terminated and owned by the caller after doc_reader_next (free());
 * NULL for a safetensors file (read it from src->path). */
typedef struct doc {
  const src_file *src;
  uint64_t index; /* 0-based position in the whole sequence */
  uint64_t line;  /* first line in its file (1-based); 0 for safetensors */
  char *text;
  size_t len;
  uint64_t src_bytes; /* bytes of its file consumed since the previous document (progress) */
} doc;

typedef struct doc_reader {
  const src_list *l;
  const char *field;
  uint64_t max_docs; /* 0 = no limit */
  uint64_t next_index;
  size_t file;     /* current file */
  const char *map; /* its contents (mapped), or NULL before it is opened */
  size_t map_len, pos, consumed;
  uint64_t line;
} doc_reader;

/* Start reading l's documents (at most max_docs when not 0); field = the JSONL text member. */
void doc_reader_open(doc_reader *r, const src_list *l, const char *field, uint64_t max_docs);

/* The next document: 1 and *d filled; 0 at the end; -1 with the reason in err. */
int doc_reader_next(doc_reader *r, doc *d, char *err, size_t err_cap);

void doc_reader_close(doc_reader *r);

/* Documents and bytes of the whole sequence (as doc_reader_next would deliver them, the limit
 * applied) without building them. Returns 0, or -1 with the reason in err. */
int docs_count(const src_list *l, uint64_t max_docs, uint64_t *n_docs, uint64_t *n_bytes, char *err,
               size_t err_cap);

/* Format a reason into err (cap bytes; nothing when cap is 0) and return -1: the error
 * convention of this folder's functions that report into a caller's buffer. */
#if defined(__GNUC__)
__attribute__((format(printf, 3, 4)))
#endif
int ingest_errf(char *err, size_t cap, const char *fmt, ...);

#endif
