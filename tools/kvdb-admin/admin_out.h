/* SPDX-License-Identifier: MIT */
/*
 * tools/kvdb-admin/admin_out.h — output helpers for kvdb-admin: a streaming JSON writer,
 * humanized sizes, ISO-8601 UTC times, terminal-safe text and the progress bar.
 *
 * Nothing here calls kvdb; these are formatting helpers over stdio. kvdb_admin.c owns the
 * commands and decides what goes where (results on stdout, errors and the bar on stderr).
 */
#ifndef KVDB_ADMIN_OUT_H
#define KVDB_ADMIN_OUT_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* ---- JSON --------------------------------------------------------------------------------- */

#define JW_MAX_DEPTH 16

/*
 * jw - writes one compact JSON document to `f` as it is built, so a long listing needs no
 * memory. Inside an object every value takes a member name (`key`); inside an array and at the
 * top `key` is NULL. Names and values are encoded by Jansson (json_dumpf); bytes that are not
 * valid UTF-8 become U+FFFD first, so the output always parses. Nesting deeper than
 * JW_MAX_DEPTH is a bug in the caller (abort).
 */
typedef struct jw {
  FILE *f;
  int depth;                 /* containers open */
  char close[JW_MAX_DEPTH];  /* '}' or ']' for each open container */
  int items[JW_MAX_DEPTH];   /* values written so far in each open container */
} jw;

void jw_init(jw *w, FILE *f);
void jw_obj(jw *w, const char *key);
void jw_arr(jw *w, const char *key);
/* Close the innermost container; closing the outermost one also writes a newline. */
void jw_end(jw *w);
/* Close containers until only `depth` remain open (used to attach an error to a partial
 * document). */
void jw_unwind(jw *w, int depth);
void jw_str(jw *w, const char *key, const char *s);
void jw_u64(jw *w, const char *key, uint64_t v);
/* A finite double with up to 6 significant digits, always written as a real ("0.0", "1e-5");
 * NaN and infinities become null. */
void jw_num(jw *w, const char *key, double v);
void jw_bool(jw *w, const char *key, int v);
void jw_null(jw *w, const char *key);

/* ---- text --------------------------------------------------------------------------------- */

/* "0 B", "512 B", "36.0 KiB", "1.5 MiB" … "EiB" (powers of 1024). Returns buf (>= 16 bytes). */
char *fmt_size(uint64_t bytes, char *buf, size_t cap);

/* ISO-8601 UTC, "2025-01-31T12:34:56Z" or with `with_ms` "2025-01-31T12:34:56.789Z".
 * 0 (never recorded) gives "-". Returns buf (>= 32 bytes). */
char *fmt_time(uint64_t unix_ms, int with_ms, char *buf, size_t cap);

/* Copy `s` into buf for a terminal: control characters become '?'. Returns buf. */
char *safe_text(const char *s, char *buf, size_t cap);

/* ---- progress bar ------------------------------------------------------------------------- */

/*
 * progress - a one-line bar on stderr ("verify [#####-----] 120/400 blocks  30.0%  95 blocks/s"),
 * redrawn at most every 100 ms and always at the last step. When `on` is 0 every call is a
 * no-op, so callers need not test for a terminal themselves.
 */
typedef struct progress {
  int on;
  const char *label;
  const char *unit;
  double t0;
  double t_last;
  int shown;    /* a bar is on the line now */
  int width;    /* characters of the bar on the line, to erase it */
} progress;

void progress_init(progress *p, const char *label, const char *unit, int on);
void progress_update(progress *p, uint64_t done, uint64_t total);
/* Erase the bar (before other output on the same terminal, and at the end). */
void progress_clear(progress *p);

#endif
