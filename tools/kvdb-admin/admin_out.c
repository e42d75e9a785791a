/* SPDX-License-Identifier: MIT */
/*
 * tools/kvdb-admin/admin_out.c — the output helpers of admin_out.h: JSON writer, sizes,
 * times, terminal-safe text, progress bar.
 *
 * The JSON writer streams: it keeps the open containers (brackets, commas, member names' place)
 * and writes every member name and value as it comes with Jansson's encoder (escaping, UTF-8,
 * number formatting), so a listing of any length needs no tree in memory.
 */
#define _POSIX_C_SOURCE 200809L
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <jansson.h>

#include "admin_out.h"

/* ---- JSON --------------------------------------------------------------------------------- */

/* Length of the valid UTF-8 sequence at p (1..4), or 0 when it is not valid UTF-8. */
static size_t utf8_len(const unsigned char *p)
{
  unsigned c = p[0];
  if (c < 0x80)
    return c != 0;
  size_t n;
  unsigned min;
  if (c >= 0xc2 && c <= 0xdf) {
    n = 2;
    min = 0x80;
  } else if (c >= 0xe0 && c <= 0xef) {
    n = 3;
    min = 0x800;
  } else if (c >= 0xf0 && c <= 0xf4) {
    n = 4;
    min = 0x10000;
  } else {
    return 0;
  }
  unsigned cp = c & (0x7fu >> n);
  for (size_t i = 1; i < n; i++) {
    if ((p[i] & 0xc0) != 0x80) /* also stops at the terminating NUL */
      return 0;
    cp = (cp << 6) | (p[i] & 0x3fu);
  }
  if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
    return 0;
  return n;
}

/* A Jansson string of s; bytes that are not valid UTF-8 (Jansson takes only UTF-8) become
 * U+FFFD. NULL only when memory ran out. */
static json_t *utf8_string(const char *s)
{
  json_t *v = json_string(s);
  if (v != NULL)
    return v;
  size_t n = strlen(s);
  char *t = malloc(3 * n + 1); /* each byte at worst becomes the 3 bytes of U+FFFD */
  if (t == NULL)
    return NULL;
  const unsigned char *p = (const unsigned char *)s;
  size_t o = 0;
  while (*p != 0) {
    size_t k = utf8_len(p);
    if (k == 0) {
      memcpy(t + o, "\xef\xbf\xbd", 3);
      o += 3;
      p++;
    } else {
      memcpy(t + o, p, k);
      o += k;
      p += k;
    }
  }
  t[o] = 0;
  v = json_string(t);
  free(t);
  return v;
}

/* Write the value v with Jansson's encoder (compact; reals with 6 significant digits) and drop
 * it; NULL (memory ran out) is written as null. */
static void put_value(FILE *f, json_t *v)
{
  if (v == NULL || json_dumpf(v, f, JSON_ENCODE_ANY | JSON_COMPACT | JSON_REAL_PRECISION(6)) != 0)
    fputs("null", f);
  json_decref(v);
}

/* The separator and member name before a value. */
static void value_prefix(jw *w, const char *key)
{
  if (w->depth > 0) {
    if (w->items[w->depth - 1]++ > 0)
      fputc(',', w->f);
    if (w->close[w->depth - 1] == '}') {
      put_value(w->f, utf8_string(key != NULL ? key : ""));
      fputc(':', w->f);
    }
  }
}

static void open_container(jw *w, const char *key, char open, char close)
{
  if (w->depth >= JW_MAX_DEPTH) {
    fprintf(stderr, "kvdb-admin: bug: JSON nested deeper than %d\n", JW_MAX_DEPTH);
    abort();
  }
  value_prefix(w, key);
  fputc(open, w->f);
  w->close[w->depth] = close;
  w->items[w->depth] = 0;
  w->depth++;
}

void jw_init(jw *w, FILE *f)
{
  memset(w, 0, sizeof *w);
  w->f = f;
}

void jw_obj(jw *w, const char *key)
{
  open_container(w, key, '{', '}');
}

void jw_arr(jw *w, const char *key)
{
  open_container(w, key, '[', ']');
}

void jw_end(jw *w)
{
  if (w->depth == 0)
    return;
  w->depth--;
  fputc(w->close[w->depth], w->f);
  if (w->depth == 0)
    fputc('\n', w->f);
}

void jw_unwind(jw *w, int depth)
{
  while (w->depth > depth)
    jw_end(w);
}

void jw_str(jw *w, const char *key, const char *s)
{
  value_prefix(w, key);
  put_value(w->f, utf8_string(s != NULL ? s : ""));
}

void jw_u64(jw *w, const char *key, uint64_t v)
{
  value_prefix(w, key);
  if (v <= INT64_MAX)
    put_value(w->f, json_integer((json_int_t)v));
  else /* past Jansson's int64 (a damaged record's field): the exact digits, still a JSON number */
    fprintf(w->f, "%" PRIu64, v);
}

void jw_num(jw *w, const char *key, double v)
{
  value_prefix(w, key);
  put_value(w->f, isfinite(v) ? json_real(v) : json_null());
}

void jw_bool(jw *w, const char *key, int v)
{
  value_prefix(w, key);
  put_value(w->f, json_boolean(v));
}

void jw_null(jw *w, const char *key)
{
  value_prefix(w, key);
  put_value(w->f, json_null());
}

/* ---- text --------------------------------------------------------------------------------- */

char *fmt_size(uint64_t bytes, char *buf, size_t cap)
{
  static const char *const unit[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  if (bytes < 1024) {
    snprintf(buf, cap, "%" PRIu64 " B", bytes);
    return buf;
  }
  double v = (double)bytes;
  int u = 0;
  while (v >= 1024.0 && u < 6) {
    v /= 1024.0;
    u++;
  }
  /* 1023.96 KiB would print as "1024.0 KiB": show the next unit instead */
  if (v >= 1023.95 && u < 6) {
    v /= 1024.0;
    u++;
  }
  snprintf(buf, cap, "%.1f %s", v, unit[u]);
  return buf;
}

char *fmt_time(uint64_t unix_ms, int with_ms, char *buf, size_t cap)
{
  if (unix_ms == 0) {
    snprintf(buf, cap, "-");
    return buf;
  }
  time_t secs = (time_t)(unix_ms / 1000);
  struct tm tm;
  if (gmtime_r(&secs, &tm) == NULL) {
    snprintf(buf, cap, "-");
    return buf;
  }
  char day[24];
  strftime(day, sizeof day, "%Y-%m-%dT%H:%M:%S", &tm);
  if (with_ms)
    snprintf(buf, cap, "%s.%03uZ", day, (unsigned)(unix_ms % 1000));
  else
    snprintf(buf, cap, "%sZ", day);
  return buf;
}

char *safe_text(const char *s, char *buf, size_t cap)
{
  size_t i = 0;
  if (cap == 0)
    return buf;
  for (; s[i] != 0 && i + 1 < cap; i++) {
    unsigned char c = (unsigned char)s[i];
    buf[i] = c < 0x20 || c == 0x7f ? '?' : (char)c;
  }
  buf[i] = 0;
  return buf;
}

/* ---- progress bar ------------------------------------------------------------------------- */

#define BAR_CELLS 24
#define BAR_REDRAW_S 0.1

static double now_s(void)
{
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

void progress_init(progress *p, const char *label, const char *unit, int on)
{
  memset(p, 0, sizeof *p);
  p->on = on;
  p->label = label;
  p->unit = unit;
  p->t0 = now_s();
}

void progress_update(progress *p, uint64_t done, uint64_t total)
{
  if (!p->on)
    return;
  double t = now_s();
  if (p->shown && done < total && t - p->t_last < BAR_REDRAW_S)
    return;
  p->t_last = t;
  if (done > total)
    total = done;
  double frac = total > 0 ? (double)done / (double)total : 1.0;
  int fill = (int)(frac * BAR_CELLS);
  char bar[BAR_CELLS + 1];
  for (int i = 0; i < BAR_CELLS; i++)
    bar[i] = i < fill ? '#' : '-';
  bar[BAR_CELLS] = 0;
  double dt = t - p->t0;
  char rate[48];
  if (dt > 1e-3)
    snprintf(rate, sizeof rate, "%.0f %s/s", (double)done / dt, p->unit);
  else
    snprintf(rate, sizeof rate, "- %s/s", p->unit);
  char line[256];
  int n = snprintf(line, sizeof line, "%s [%s] %" PRIu64 "/%" PRIu64 " %s %5.1f%%  %s", p->label,
                   bar, done, total, p->unit, frac * 100.0, rate);
  if (n < 0)
    return;
  if (n >= (int)sizeof line)
    n = (int)sizeof line - 1;
  /* pad with spaces over a longer previous line */
  fprintf(stderr, "\r%s%*s", line, p->width > n ? p->width - n : 0, "");
  fflush(stderr);
  if (n > p->width)
    p->width = n;
  p->shown = 1;
}

void progress_clear(progress *p)
{
  if (!p->on || !p->shown)
    return;
  fprintf(stderr, "\r%*s\r", p->width, "");
  fflush(stderr);
  p->shown = 0;
}
