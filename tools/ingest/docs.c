/* SPDX-License-Identifier: MIT */
/*
 * tools/ingest/docs.c — input files and the documents in them (docs.h).
 *
 * Files are mapped read-only one at a time while their documents are delivered. Finding a
 * document's span (next_span) is shared by the reader and by docs_count, so the count used for
 * progress is exactly the sequence the reader delivers.
 */
#define _DEFAULT_SOURCE
#include "docs.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "json_load.h"

/* A JSONL row: any JSON value is parsed (a non-object gets its own message); a string may hold
 * \u0000 (the text keeps it); a key given twice is refused (which one was meant?); integers
 * beyond 64 bits are read as reals, so an id member of any size does not stop a row; one row
 * may take up to 1 GiB of parse memory (a document of ~300 MiB). */
#define JSONL_FLAGS (JSON_DECODE_ANY | JSON_ALLOW_NUL | JSON_REJECT_DUPLICATES | JSON_DECODE_INT_AS_REAL)
#define JSONL_MAX_MEM ((size_t)1 << 30)

int ingest_errf(char *err, size_t cap, const char *fmt, ...)
{
  if (cap > 0) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, cap, fmt, ap);
    va_end(ap);
  }
  return -1;
}

/* ---- the file list ------------------------------------------------------------------------ */

static int ends_with(const char *s, const char *tail)
{
  size_t n = strlen(s), t = strlen(tail);
  return n >= t && strcmp(s + n - t, tail) == 0;
}

static src_kind kind_of(const char *path)
{
  if (ends_with(path, ".txt"))
    return SRC_TXT;
  if (ends_with(path, ".jsonl"))
    return SRC_JSONL;
  if (ends_with(path, ".safetensors"))
    return SRC_SAFETENSORS;
  return 0;
}

static int add_file(src_list *l, size_t *cap, const char *path, src_kind kind, uint64_t bytes,
                    char *err, size_t err_cap)
{
  if (l->n == *cap) {
    size_t nc = *cap ? *cap * 2 : 16;
    src_file *nf = realloc(l->f, nc * sizeof *nf);
    if (nf == NULL)
      return ingest_errf(err, err_cap, "out of memory listing input files");
    l->f = nf;
    *cap = nc;
  }
  char *p = strdup(path);
  if (p == NULL)
    return ingest_errf(err, err_cap, "out of memory listing input files");
  l->f[l->n++] = (src_file){p, kind, bytes};
  if (kind != SRC_SAFETENSORS)
    l->n_text++;
  return 0;
}

static int cmp_names(const void *a, const void *b)
{
  return strcmp(*(char *const *)a, *(char *const *)b);
}

static int walk(src_list *l, size_t *cap, const char *dir, int depth, char *err, size_t err_cap)
{
  if (depth > 64)
    return ingest_errf(err, err_cap, "'%s': folders nested more than 64 deep", dir);
  DIR *d = opendir(dir);
  if (d == NULL)
    return ingest_errf(err, err_cap, "'%s': cannot open folder: %s", dir, strerror(errno));
  char **names = NULL;
  size_t n = 0, ncap = 0;
  int rc = 0;
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    if (e->d_name[0] == '.')
      continue;
    if (n == ncap) {
      ncap = ncap ? ncap * 2 : 32;
      char **nn = realloc(names, ncap * sizeof *nn);
      if (nn == NULL) {
        rc = ingest_errf(err, err_cap, "out of memory listing '%s'", dir);
        break;
      }
      names = nn;
    }
    if ((names[n] = strdup(e->d_name)) == NULL) {
      rc = ingest_errf(err, err_cap, "out of memory listing '%s'", dir);
      break;
    }
    n++;
  }
  closedir(d);
  if (rc == 0 && n > 1) /* an empty folder has no array: qsort(NULL, 0) is undefined */
    qsort(names, n, sizeof *names, cmp_names);
  for (size_t i = 0; rc == 0 && i < n; i++) {
    size_t plen = strlen(dir) + strlen(names[i]) + 2;
    char *path = malloc(plen);
    if (path == NULL) {
      rc = ingest_errf(err, err_cap, "out of memory listing '%s'", dir);
      break;
    }
    snprintf(path, plen, "%s/%s", dir, names[i]);
    struct stat sb;
    if (stat(path, &sb) != 0) {
      rc = ingest_errf(err, err_cap, "'%s': %s", path, strerror(errno));
    } else if (S_ISDIR(sb.st_mode)) {
      rc = walk(l, cap, path, depth + 1, err, err_cap);
    } else if (S_ISREG(sb.st_mode) && kind_of(path) != 0) {
      rc = add_file(l, cap, path, kind_of(path), (uint64_t)sb.st_size, err, err_cap);
    } else {
      l->ignored++;
    }
    free(path);
  }
  for (size_t i = 0; i < n; i++)
    free(names[i]);
  free(names);
  return rc;
}

int src_list_build(const char *const *inputs, size_t n_inputs, src_list *out, char *err,
                   size_t err_cap)
{
  memset(out, 0, sizeof *out);
  size_t cap = 0;
  for (size_t i = 0; i < n_inputs; i++) {
    struct stat sb;
    if (stat(inputs[i], &sb) != 0) {
      ingest_errf(err, err_cap, "input '%s': %s", inputs[i], strerror(errno));
      goto fail;
    }
    if (S_ISDIR(sb.st_mode)) {
      if (walk(out, &cap, inputs[i], 0, err, err_cap) != 0)
        goto fail;
    } else if (kind_of(inputs[i]) == 0) {
      ingest_errf(err, err_cap,
           "input '%s': unknown kind of file (expected a name ending in .txt, .jsonl or "
           ".safetensors, or a folder)",
           inputs[i]);
      goto fail;
    } else if (add_file(out, &cap, inputs[i], kind_of(inputs[i]), (uint64_t)sb.st_size, err,
                        err_cap) != 0) {
      goto fail;
    }
  }
  if (out->n == 0) {
    ingest_errf(err, err_cap,
         "no .txt, .jsonl or .safetensors files in the input%s (%zu other files "
         "ignored)",
         n_inputs > 1 ? "s" : "", out->ignored);
    goto fail;
  }
  return 0;
fail:
  src_list_free(out);
  return -1;
}

void src_list_free(src_list *l)
{
  for (size_t i = 0; i < l->n; i++)
    free(l->f[i].path);
  free(l->f);
  memset(l, 0, sizeof *l);
}

/* ---- documents ---------------------------------------------------------------------------- */

void doc_reader_open(doc_reader *r, const src_list *l, const char *field, uint64_t max_docs)
{
  memset(r, 0, sizeof *r);
  r->l = l;
  r->field = field != NULL ? field : "text";
  r->max_docs = max_docs;
}

static void unmap(doc_reader *r)
{
  if (r->map != NULL && r->map_len > 0)
    munmap((void *)(uintptr_t)r->map, r->map_len);
  r->map = NULL;
  r->map_len = r->pos = r->consumed = 0;
  r->line = 0;
}

void doc_reader_close(doc_reader *r)
{
  unmap(r);
}

static int map_file(doc_reader *r, const src_file *f, char *err, size_t err_cap)
{
  int fd = open(f->path, O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return ingest_errf(err, err_cap, "'%s': cannot open: %s", f->path, strerror(errno));
  struct stat sb;
  if (fstat(fd, &sb) != 0) {
    int e = errno;
    close(fd);
    return ingest_errf(err, err_cap, "'%s': cannot stat: %s", f->path, strerror(e));
  }
  static const char empty[1];
  r->map = empty;
  r->map_len = 0;
  if (sb.st_size > 0) {
    void *m = mmap(NULL, (size_t)sb.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (m == MAP_FAILED) {
      int e = errno;
      close(fd);
      r->map = NULL;
      return ingest_errf(err, err_cap, "'%s': cannot map: %s", f->path, strerror(e));
    }
    r->map = m;
    r->map_len = (size_t)sb.st_size;
  }
  close(fd);
  r->pos = r->consumed = 0;
  r->line = 1;
  return 0;
}

/* End of the line starting at p (index of '\n' or len). */
static size_t line_end(const char *s, size_t len, size_t p)
{
  const char *nl = memchr(s + p, '\n', len - p);
  return nl != NULL ? (size_t)(nl - s) : len;
}

static int is_blank(const char *s, size_t a, size_t b)
{
  for (size_t i = a; i < b; i++)
    if (s[i] != ' ' && s[i] != '\t' && s[i] != '\r')
      return 0;
  return 1;
}

/*
 * The next document span of the current (mapped) file from r->pos: [*a, *b) and its first line.
 * txt: a run of non-blank lines (*b at the end of its last line); jsonl: one non-blank line.
 * Advances r->pos past the span and its line end. Returns 1, or 0 at the end of the file.
 */
static int next_span(doc_reader *r, src_kind kind, size_t *a, size_t *b, uint64_t *first_line)
{
  const char *s = r->map;
  size_t len = r->map_len;
  while (r->pos < len) { /* skip blank lines */
    size_t e = line_end(s, len, r->pos);
    if (!is_blank(s, r->pos, e))
      break;
    r->pos = e < len ? e + 1 : len;
    r->line++;
  }
  if (r->pos >= len)
    return 0;
  *a = r->pos;
  *first_line = r->line;
  for (;;) {
    size_t e = line_end(s, len, r->pos);
    *b = e;
    r->pos = e < len ? e + 1 : len;
    r->line++;
    if (kind == SRC_JSONL || r->pos >= len)
      break;
    size_t e2 = line_end(s, len, r->pos);
    if (is_blank(s, r->pos, e2))
      break;
  }
  return 1;
}

/* The txt document in [a, b): lines joined with '\n', a CR before each line end dropped. */
static char *txt_doc(const char *s, size_t a, size_t b, size_t *len)
{
  char *out = malloc(b - a + 1);
  if (out == NULL)
    return NULL;
  size_t o = 0;
  for (size_t i = a; i < b; i++) {
    if (s[i] == '\r' && (i + 1 == b || s[i + 1] == '\n'))
      continue;
    out[o++] = s[i];
  }
  out[o] = '\0';
  *len = o;
  return out;
}

static int jsonl_doc(const doc_reader *r, size_t a, size_t b, uint64_t line, char **text,
                     size_t *len, char *err, size_t err_cap)
{
  const char *path = r->l->f[r->file].path;
  const char *s = r->map + a;
  size_t n = b - a;
  if (line == 1 && n >= 3 && memcmp(s, "\xef\xbb\xbf", 3) == 0) { /* a UTF-8 byte order mark */
    s += 3;
    n -= 3;
  }
  char jerr[200];
  json_t *row = ingest_json_load(s, n, JSONL_FLAGS, JSONL_MAX_MEM, jerr, sizeof jerr);
  if (row == NULL)
    return ingest_errf(err, err_cap, "'%s' line %llu: not valid JSON: %s", path, (unsigned long long)line,
                jerr);
  int rc = 0;
  if (!json_is_object(row)) {
    rc = ingest_errf(err, err_cap, "'%s' line %llu: a JSON %s, expected an object with a \"%s\" string",
              path, (unsigned long long)line, ingest_json_type(row), r->field);
  } else {
    json_t *v = json_object_get(row, r->field);
    if (v == NULL)
      rc = ingest_errf(err, err_cap, "'%s' line %llu: no \"%s\" member (set the field with --text-field)",
                path, (unsigned long long)line, r->field);
    else if (!json_is_string(v))
      rc = ingest_errf(err, err_cap, "'%s' line %llu: \"%s\" is a JSON %s, expected a string", path,
                (unsigned long long)line, r->field, ingest_json_type(v));
    else if ((*len = json_string_length(v), *text = malloc(*len + 1)) == NULL)
      rc = ingest_errf(err, err_cap, "'%s' line %llu: out of memory", path, (unsigned long long)line);
    else
      memcpy(*text, json_string_value(v), *len + 1);
  }
  json_decref(row);
  return rc;
}

int doc_reader_next(doc_reader *r, doc *d, char *err, size_t err_cap)
{
  memset(d, 0, sizeof *d);
  if (r->max_docs != 0 && r->next_index >= r->max_docs)
    return 0;
  while (r->file < r->l->n) {
    const src_file *f = &r->l->f[r->file];
    if (f->kind == SRC_SAFETENSORS) {
      d->src = f;
      d->index = r->next_index++;
      d->src_bytes = f->bytes;
      r->file++;
      return 1;
    }
    if (r->map == NULL && map_file(r, f, err, err_cap) != 0)
      return -1;
    size_t a, b;
    uint64_t line;
    if (!next_span(r, f->kind, &a, &b, &line)) {
      unmap(r);
      r->file++;
      continue;
    }
    d->src = f;
    d->index = r->next_index;
    d->line = line;
    if (f->kind == SRC_TXT) {
      d->text = txt_doc(r->map, a, b, &d->len);
      if (d->text == NULL)
        return ingest_errf(err, err_cap, "'%s' line %llu: out of memory", f->path,
                    (unsigned long long)line);
    } else if (jsonl_doc(r, a, b, line, &d->text, &d->len, err, err_cap) != 0) {
      return -1;
    }
    d->src_bytes = r->pos - r->consumed;
    r->consumed = r->pos;
    r->next_index++;
    return 1;
  }
  return 0;
}

int docs_count(const src_list *l, uint64_t max_docs, uint64_t *n_docs, uint64_t *n_bytes, char *err,
               size_t err_cap)
{
  doc_reader r;
  doc_reader_open(&r, l, NULL, max_docs);
  uint64_t docs = 0, bytes = 0;
  for (; r.file < l->n && (max_docs == 0 || docs < max_docs); r.file++) {
    const src_file *f = &l->f[r.file];
    if (f->kind == SRC_SAFETENSORS) {
      docs++;
      bytes += f->bytes;
      continue;
    }
    if (map_file(&r, f, err, err_cap) != 0)
      return -1;
    size_t a, b;
    uint64_t line;
    while ((max_docs == 0 || docs < max_docs) && next_span(&r, f->kind, &a, &b, &line)) {
      docs++;
      bytes += r.pos - r.consumed;
      r.consumed = r.pos;
    }
    unmap(&r);
  }
  *n_docs = docs;
  *n_bytes = bytes;
  return 0;
}
