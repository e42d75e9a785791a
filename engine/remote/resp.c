/* SPDX-License-Identifier: MIT */
/*
 * engine/remote/resp.c — RESP2 replies read straight from a socket (resp.h).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>

#include "resp.h"

/* The read-ahead buffer: a header line must fit, and a reply of small values (GETRANGE's
 * envelopes, SET's +OK) is read in a few calls. After a bulk string's direct read, at most
 * KV_RESP_TAIL more bytes come into it (the CRLF, the next reply's header and a little of it):
 * the next value's bytes then mostly go straight to their own allocation too. */
#define KV_RESP_BUF (16u << 10)
#define KV_RESP_TAIL 512u

/* ---- value buffers ----
 *
 * A value's allocation: a 64-byte header (its capacity and pool), then the data, 64-byte
 * aligned, capacity bytes (the value, its NUL, the rest unused). */
typedef struct vhdr {
  size_t cap;
  kv_resp_pool *pool;
} vhdr;
#define VHDR 64u

static vhdr *hdr_of(uint8_t *data)
{
  return (vhdr *)(void *)(data - VHDR);
}

void kv_resp_pool_init(kv_resp_pool *p)
{
  memset(p, 0, sizeof *p);
  pthread_mutex_init(&p->mu, NULL);
}

void kv_resp_pool_destroy(kv_resp_pool *p)
{
  for (int i = 0; i < p->n; i++)
    free(hdr_of(p->buf[i]));
  p->n = 0;
  pthread_mutex_destroy(&p->mu);
}

/* A buffer for a value of len bytes (and its NUL): one of the pool's that is large enough, or
 * a new one. NULL when memory is short. */
static uint8_t *val_alloc(kv_resp_pool *p, size_t len)
{
  if (p != NULL && len < KV_RESP_POOL_MAX) {
    uint8_t *d = NULL;
    pthread_mutex_lock(&p->mu);
    for (int i = p->n; i-- > 0;)
      if (hdr_of(p->buf[i])->cap > len) {
        d = p->buf[i];
        p->buf[i] = p->buf[--p->n];
        break;
      }
    pthread_mutex_unlock(&p->mu);
    if (d != NULL)
      return d;
  }
  /* a page multiple: values of one model differ by a few bytes (a partial last block) */
  size_t cap = (len + 1 + 4095) & ~(size_t)4095;
  if (cap < len)
    return NULL;
  uint8_t *b = aligned_alloc(64, VHDR + cap);
  if (b == NULL)
    return NULL;
  vhdr *h = (vhdr *)(void *)b;
  h->cap = cap;
  h->pool = p;
  return b + VHDR;
}

void kv_resp_data_free(uint8_t *data)
{
  if (data == NULL)
    return;
  vhdr *h = hdr_of(data);
  kv_resp_pool *p = h->pool;
  if (p != NULL && h->cap <= KV_RESP_POOL_MAX) {
    pthread_mutex_lock(&p->mu);
    if (p->n < KV_RESP_POOL_N) {
      p->buf[p->n++] = data;
      data = NULL;
    } else { /* full: the smallest of the pool's and this one goes */
      int s = 0;
      for (int i = 1; i < p->n; i++)
        if (hdr_of(p->buf[i])->cap < hdr_of(p->buf[s])->cap)
          s = i;
      if (hdr_of(p->buf[s])->cap < h->cap) {
        uint8_t *x = p->buf[s];
        p->buf[s] = data;
        data = x;
      }
    }
    pthread_mutex_unlock(&p->mu);
    if (data == NULL)
      return;
    h = hdr_of(data);
  }
  free(h);
}

/* ---- the reader ---- */

void kv_resp_init(kv_resp_rd *r, int fd)
{
  memset(r, 0, sizeof *r);
  r->fd = fd;
  r->max_bulk = KV_RESP_MAX_BULK;
}

void kv_resp_free(kv_resp_rd *r)
{
  free(r->buf);
  r->buf = NULL;
  r->pos = r->len = 0;
}

int kv_resp_pending(const kv_resp_rd *r)
{
  return r->len > r->pos;
}

static int rd_fail(char *err, size_t cap, const char *what)
{
  snprintf(err, cap, "%s", what);
  return -1;
}

static uint64_t mono_ns(void)
{
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* One read of the socket into iov[0..n): with poll_us, polled without sleeping (a
 * non-blocking read, the CPU given to any other runnable thread between tries) for up to
 * poll_us, then a blocking read (the socket's timeout). The bytes read, 0 (EOF) or -1. */
static ssize_t rd_iov(kv_resp_rd *r, struct iovec *iov, int n)
{
  struct msghdr m;
  memset(&m, 0, sizeof m);
  m.msg_iov = iov;
  m.msg_iovlen = (size_t)n;
  ssize_t k;
  if (r->poll_us > 0) {
    uint64_t t0 = 0;
    for (;;) {
      k = recvmsg(r->fd, &m, MSG_DONTWAIT);
      if (k >= 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR))
        return k;
      uint64_t now = mono_ns();
      if (t0 == 0)
        t0 = now;
      else if (now - t0 > (uint64_t)r->poll_us * 1000u)
        break;
      sched_yield();
    }
  }
  do
    k = recvmsg(r->fd, &m, 0);
  while (k < 0 && errno == EINTR);
  return k;
}

/* errno of a failed read as a failure. */
static int io_fail(char *err, size_t cap, ssize_t got)
{
  if (got == 0)
    return rd_fail(err, cap, "connection closed by the server");
  if (errno == EAGAIN || errno == EWOULDBLOCK)
    return rd_fail(err, cap, "timeout reading a reply");
  snprintf(err, cap, "read: %s", strerror(errno));
  return -1;
}

/* Read more into the buffer (after what it holds; parsed bytes dropped first), at most `most`
 * bytes. 0, or -1 (err). */
static int fill(kv_resp_rd *r, size_t most, char *err, size_t cap)
{
  if (r->buf == NULL && (r->buf = malloc(KV_RESP_BUF)) == NULL)
    return rd_fail(err, cap, "out of memory");
  if (r->pos > 0) {
    memmove(r->buf, r->buf + r->pos, r->len - r->pos);
    r->len -= r->pos;
    r->pos = 0;
  }
  size_t room = KV_RESP_BUF - r->len;
  if (room == 0)
    return rd_fail(err, cap, "protocol error: reply line too long");
  if (room > most)
    room = most;
  struct iovec one = {r->buf + r->len, room};
  ssize_t got = rd_iov(r, &one, 1);
  if (got <= 0)
    return io_fail(err, cap, got);
  r->len += (size_t)got;
  r->bytes_in += (uint64_t)got;
  return 0;
}

/* The next line (without CRLF) at *line, *n bytes; consumed. 0, or -1 (err). */
static int take_line(kv_resp_rd *r, const uint8_t **line, size_t *n, char *err, size_t cap)
{
  size_t scanned = 0;
  for (;;) {
    const uint8_t *p = r->buf != NULL ? r->buf + r->pos : NULL;
    size_t have = r->len - r->pos;
    for (size_t i = scanned; i + 1 < have; i++)
      if (p[i] == '\r' && p[i + 1] == '\n') {
        if (i + 2 > KV_RESP_LINE_MAX)
          return rd_fail(err, cap, "protocol error: reply line too long");
        *line = p;
        *n = i;
        r->pos += i + 2;
        return 0;
      }
    scanned = have > 0 ? have - 1 : 0;
    if (have >= KV_RESP_LINE_MAX)
      return rd_fail(err, cap, "protocol error: reply line too long");
    if (fill(r, KV_RESP_BUF, err, cap) != 0)
      return -1;
  }
}

/* A decimal integer (optional '-') filling all n bytes; 0 or -1. */
static int parse_int(const uint8_t *s, size_t n, int64_t *v)
{
  size_t i = 0;
  int neg = 0;
  if (n > 0 && s[0] == '-') {
    neg = 1;
    i = 1;
  }
  if (i == n || n - i > 18)
    return -1;
  int64_t x = 0;
  for (; i < n; i++) {
    if (s[i] < '0' || s[i] > '9')
      return -1;
    x = x * 10 + (s[i] - '0');
  }
  *v = neg ? -x : x;
  return 0;
}

int kv_resp_read(kv_resp_rd *r, kv_resp *out, char *err, size_t cap)
{
  out->type = 0;
  out->data = NULL;
  out->len = 0;
  out->integer = 0;
  out->line[0] = 0;
  const uint8_t *line;
  size_t n;
  if (take_line(r, &line, &n, err, cap) != 0)
    return -1;
  if (n == 0)
    return rd_fail(err, cap, "protocol error: empty reply line");
  uint8_t kind = line[0];
  if (kind == '+' || kind == '-') {
    if (memchr(line + 1, 0, n - 1) != NULL)
      return rd_fail(err, cap, "protocol error: a NUL in a status or error line");
    memcpy(out->line, line + 1, n - 1); /* n < KV_RESP_LINE_MAX */
    out->line[n - 1] = 0;
    out->type = kind == '+' ? KV_RESP_STATUS : KV_RESP_ERROR;
    return 0;
  }
  int64_t v;
  if ((kind != ':' && kind != '$') || parse_int(line + 1, n - 1, &v) != 0)
    return rd_fail(err, cap, "protocol error: unexpected reply");
  if (kind == ':') {
    out->type = KV_RESP_INT;
    out->integer = v;
    return 0;
  }
  if (v == -1) {
    out->type = KV_RESP_NIL;
    return 0;
  }
  if (v < 0 || (uint64_t)v > r->max_bulk)
    return rd_fail(err, cap, "protocol error: bad bulk length");
  size_t len = (size_t)v;
  uint8_t *d = val_alloc(r->pool, len);
  if (d == NULL)
    return rd_fail(err, cap, "out of memory for a reply");
  size_t got = r->len - r->pos < len ? r->len - r->pos : len;
  if (got > 0)
    memcpy(d, r->buf + r->pos, got);
  r->pos += got;
  if (got < len) { /* the rest straight into d; the CRLF and what follows into the buffer */
    r->pos = r->len = 0;
    while (got < len) {
      struct iovec iov[2] = {{d + got, len - got}, {r->buf, KV_RESP_TAIL}};
      ssize_t k = rd_iov(r, iov, 2);
      if (k <= 0) {
        kv_resp_data_free(d);
        return io_fail(err, cap, k);
      }
      r->bytes_in += (uint64_t)k;
      if ((size_t)k > len - got) {
        r->len = (size_t)k - (len - got);
        got = len;
      } else {
        got += (size_t)k;
      }
    }
  }
  while (r->len - r->pos < 2)
    if (fill(r, KV_RESP_BUF, err, cap) != 0) {
      kv_resp_data_free(d);
      return -1;
    }
  if (r->buf[r->pos] != '\r' || r->buf[r->pos + 1] != '\n') {
    kv_resp_data_free(d);
    return rd_fail(err, cap, "protocol error: bulk string without its CRLF");
  }
  r->pos += 2;
  d[len] = 0;
  out->type = KV_RESP_BULK;
  out->data = d;
  out->len = len;
  return 0;
}
