/* SPDX-License-Identifier: MIT */
/*
 * engine/io/io_os.c — the OS backend: POSIX files, O_DIRECT where the filesystem allows it,
 * and io_uring (liburing) for batched asynchronous reads and writes where the kernel allows.
 *
 * Rings are not thread-safe, so each batch takes a ring from a small pool (created on demand,
 * reused). A request larger than KV_IO_CHUNK is split into pieces so that several are in
 * flight at once; each request counts its pieces still outstanding, so a caller can wait for
 * the front of a batch (kv_batch_wait_first) while the rest is in flight. Short transfers are
 * resubmitted for the rest; a zero-length result is -EIO.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "io.h"

#ifdef KVDB_HAVE_URING
#include <liburing.h>
#endif

#ifndef KV_IO_CHUNK
#define KV_IO_CHUNK (4u << 20) /* bytes per request (a 4 MiB bio with huge-page buffers) */
#endif
#ifndef KV_IO_QD
#define KV_IO_QD 64u /* requests in flight per batch (>= a whole block: see get.c) */
#endif

kv_io_wrap_fn kv_io_test_wrap;

struct kv_file {
  int fd;
  int direct; /* opened with O_DIRECT: reads must be page-aligned (os_pread bounces others) */
};

typedef struct os_io {
  kv_io base;
  pthread_mutex_t mu;
  kv_aio *free_list;
} os_io;

int kv_io_os_fd(kv_file *f)
{
  return f ? f->fd : -1;
}

static int os_open(kv_io *io, const char *path, int flags, int *is_direct, kv_file **out)
{
  (void)io;
  *out = NULL;
  int of = (flags & KV_IO_RDONLY) ? O_RDONLY : O_RDWR;
  if (flags & KV_IO_CREATE)
    of |= O_CREAT;
  of |= O_CLOEXEC;
  int fd = -1;
  int direct = 0;
  if (flags & KV_IO_DIRECT) {
    fd = open(path, of | O_DIRECT, 0644);
    if (fd >= 0)
      direct = 1;
    else if (errno != EINVAL)
      return -errno;
  }
  if (fd < 0)
    fd = open(path, of, 0644);
  if (fd < 0)
    return -errno;
  kv_file *f = malloc(sizeof *f);
  if (f == NULL) {
    close(fd);
    return -ENOMEM;
  }
  f->fd = fd;
  f->direct = direct;
  if (is_direct)
    *is_direct = direct;
  *out = f;
  return 0;
}

#define KV_IO_ALIGN 4096u

/* 1 when a read of [off, off + len) into buf cannot go to an O_DIRECT file as it is. */
static int misaligned(const kv_file *f, const void *buf, size_t len, uint64_t off)
{
  return f->direct && ((off | (uint64_t)len | (uint64_t)(uintptr_t)buf) & (KV_IO_ALIGN - 1)) != 0;
}

/*
 * A read an O_DIRECT file cannot take as it is (a packed block object at a 64-byte offset,
 * FORMAT.md §3e): the pages covering it into an aligned bounce buffer, then the asked bytes.
 * Reading past the file's end is -EIO unless the asked bytes all arrived.
 */
static int pread_bounce(kv_file *f, void *buf, size_t len, uint64_t off)
{
  uint64_t a = off & ~(uint64_t)(KV_IO_ALIGN - 1);
  uint64_t b = (off + len + KV_IO_ALIGN - 1) & ~(uint64_t)(KV_IO_ALIGN - 1);
  size_t n = (size_t)(b - a);
  void *tmp = NULL;
  if (posix_memalign(&tmp, KV_IO_ALIGN, n) != 0)
    return -ENOMEM;
  size_t got = 0;
  int rc = 0;
  while (got < n) {
    ssize_t r = pread(f->fd, (uint8_t *)tmp + got, n - got, (off_t)(a + got));
    if (r < 0) {
      if (errno == EINTR)
        continue;
      rc = -errno;
      break;
    }
    if (r == 0)
      break;
    got += (size_t)r;
    if (got % KV_IO_ALIGN != 0 && got < n) /* a short read mid-file at an unaligned size */
      break;
  }
  if (rc == 0 && got < off + len - a)
    rc = -EIO; /* past the end of the file: a truncated segment */
  if (rc == 0)
    memcpy(buf, (uint8_t *)tmp + (off - a), len);
  free(tmp);
  return rc;
}

static int os_pread(kv_io *io, kv_file *f, void *buf, size_t len, uint64_t off)
{
  (void)io;
  if (misaligned(f, buf, len, off))
    return pread_bounce(f, buf, len, off);
  uint8_t *p = buf;
  while (len > 0) {
    ssize_t n = pread(f->fd, p, len, (off_t)off);
    if (n < 0) {
      if (errno == EINTR)
        continue;
      return -errno;
    }
    if (n == 0)
      return -EIO; /* past the end of the file: a truncated segment */
    p += n;
    len -= (size_t)n;
    off += (uint64_t)n;
  }
  return 0;
}

static int os_pwrite(kv_io *io, kv_file *f, const void *buf, size_t len, uint64_t off)
{
  (void)io;
  const uint8_t *p = buf;
  while (len > 0) {
    ssize_t n = pwrite(f->fd, p, len, (off_t)off);
    if (n < 0) {
      if (errno == EINTR)
        continue;
      return -errno;
    }
    if (n == 0)
      return -EIO;
    p += n;
    len -= (size_t)n;
    off += (uint64_t)n;
  }
  return 0;
}

static int os_sync(kv_io *io, kv_file *f)
{
  (void)io;
  return fdatasync(f->fd) == 0 ? 0 : -errno;
}

static int os_truncate(kv_io *io, kv_file *f, uint64_t len)
{
  (void)io;
  return ftruncate(f->fd, (off_t)len) == 0 ? 0 : -errno;
}

static int os_alloc(kv_io *io, kv_file *f, uint64_t off, uint64_t len)
{
  (void)io;
  if (len == 0)
    return 0;
  for (;;) {
    if (fallocate(f->fd, 0, (off_t)off, (off_t)len) == 0)
      return 0;
    if (errno != EINTR)
      return errno == ENOSYS ? -EOPNOTSUPP : -errno;
  }
}

static int os_punch(kv_io *io, kv_file *f, uint64_t off, uint64_t len)
{
  (void)io;
  if (len == 0)
    return 0;
  for (;;) {
    if (fallocate(f->fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)off, (off_t)len) == 0)
      return 0;
    if (errno != EINTR)
      return errno == ENOSYS ? -EOPNOTSUPP : -errno;
  }
}

static int os_size(kv_io *io, kv_file *f, uint64_t *out)
{
  (void)io;
  struct stat st;
  if (fstat(f->fd, &st) != 0)
    return -errno;
  *out = (uint64_t)st.st_size;
  return 0;
}

static int os_lock(kv_io *io, kv_file *f, int exclusive_nonblock)
{
  (void)io;
  int op = exclusive_nonblock ? (LOCK_EX | LOCK_NB) : LOCK_UN;
  return flock(f->fd, op) == 0 ? 0 : -errno;
}

static void os_close(kv_io *io, kv_file *f)
{
  (void)io;
  if (f != NULL) {
    close(f->fd);
    free(f);
  }
}

static int os_unlink(kv_io *io, const char *path)
{
  (void)io;
  return unlink(path) == 0 ? 0 : -errno;
}

#ifdef KVDB_HAVE_URING
/* One in-flight piece of a request. */
typedef struct piece {
  int fd;
  uint8_t *buf;
  size_t len;
  uint64_t off;
  int write;
  uint32_t req; /* index of the request it belongs to */
} piece;

struct kv_aio {
  struct io_uring ring;
  kv_aio *next;
  piece *q;       /* queued, not yet submitted or completed */
  size_t nq, capq, head;
  uint32_t *rem;  /* per request: pieces not yet complete */
  int *rerr;      /* per request: its first error, or 0 */
  size_t nreq, capreq, done; /* requests queued; requests 0..done-1 are complete */
  unsigned inflight;
  int err;
};

static int aio_new_req(kv_aio *a, uint32_t pieces)
{
  if (a->nreq == a->capreq) {
    size_t cap = a->capreq ? a->capreq * 2 : 64;
    uint32_t *n = realloc(a->rem, cap * sizeof *n);
    if (n == NULL)
      return -ENOMEM;
    a->rem = n;
    int *e = realloc(a->rerr, cap * sizeof *e);
    if (e == NULL)
      return -ENOMEM;
    a->rerr = e;
    a->capreq = cap;
  }
  a->rerr[a->nreq] = 0;
  a->rem[a->nreq++] = pieces;
  return 0;
}

static void aio_advance(kv_aio *a)
{
  while (a->done < a->nreq && a->rem[a->done] == 0)
    a->done++;
}

static int aio_push(kv_aio *a, piece p)
{
  if (a->nq == a->capq) {
    size_t cap = a->capq ? a->capq * 2 : 64;
    piece *nq = realloc(a->q, cap * sizeof *nq);
    if (nq == NULL)
      return -ENOMEM;
    a->q = nq;
    a->capq = cap;
  }
  a->q[a->nq++] = p;
  return 0;
}

static void aio_fill(kv_aio *a)
{
  while (a->inflight < KV_IO_QD && a->head < a->nq) {
    struct io_uring_sqe *sqe = io_uring_get_sqe(&a->ring);
    if (sqe == NULL)
      break;
    piece *p = &a->q[a->head];
    if (p->write)
      io_uring_prep_write(sqe, p->fd, p->buf, (unsigned)p->len, p->off);
    else
      io_uring_prep_read(sqe, p->fd, p->buf, (unsigned)p->len, p->off);
    io_uring_sqe_set_data64(sqe, a->head);
    a->head++;
    a->inflight++;
  }
  io_uring_submit(&a->ring);
}

static kv_aio *os_aio_begin(kv_io *io)
{
  os_io *o = (os_io *)io;
  pthread_mutex_lock(&o->mu);
  kv_aio *a = o->free_list;
  if (a != NULL)
    o->free_list = a->next;
  pthread_mutex_unlock(&o->mu);
  if (a == NULL) {
    a = calloc(1, sizeof *a);
    if (a == NULL)
      return NULL;
    if (io_uring_queue_init(KV_IO_QD * 2, &a->ring, 0) != 0) {
      free(a);
      return NULL;
    }
  }
  a->nq = a->head = 0;
  a->nreq = a->done = 0;
  a->inflight = 0;
  a->err = 0;
  return a;
}

static int os_aio_queue(kv_io *io, kv_aio *a, kv_file *f, void *buf, size_t len, uint64_t off,
                        int write)
{
  (void)io;
  if (!write && misaligned(f, buf, len, off)) { /* read now through a bounce buffer */
    int rc = aio_new_req(a, 0);
    if (rc != 0)
      return rc;
    aio_advance(a);
    return pread_bounce(f, buf, len, off);
  }
  uint32_t pieces = (uint32_t)(len == 0 ? 0 : (len + KV_IO_CHUNK - 1) / KV_IO_CHUNK);
  int rc = aio_new_req(a, pieces);
  if (rc != 0)
    return rc;
  uint32_t req = (uint32_t)(a->nreq - 1);
  uint8_t *p = buf;
  while (len > 0) {
    size_t n = len > KV_IO_CHUNK ? KV_IO_CHUNK : len;
    rc = aio_push(a, (piece){f->fd, p, n, off, write, req});
    if (rc != 0) {
      a->rem[req] = 0; /* what was pushed still runs; the request is reported failed */
      return rc;
    }
    p += n;
    off += n;
    len -= n;
  }
  aio_advance(a);
  aio_fill(a);
  return 0;
}

/* Handle one completion. A piece is done when all its bytes moved or it failed for good. */
static void aio_complete(kv_aio *a, uint64_t idx, int res)
{
  piece *p = &a->q[idx];
  int finished = 1, e = 0;
  if (res < 0) {
    if (res == -EAGAIN || res == -EINTR) {
      finished = aio_push(a, a->q[idx]) != 0; /* p may move: re-read below via idx */
      if (finished)
        e = -ENOMEM;
    } else {
      e = res;
    }
  } else if (res == 0) {
    e = -EIO;
  } else if ((size_t)res < p->len) {
    /* short transfer: queue the rest */
    piece rest = {p->fd, p->buf + res, p->len - (size_t)res, p->off + (uint64_t)res, p->write,
                  p->req};
    finished = aio_push(a, rest) != 0;
    if (finished)
      e = -ENOMEM;
  }
  if (e != 0 && a->err == 0)
    a->err = e;
  if (e != 0 && a->rerr[a->q[idx].req] == 0)
    a->rerr[a->q[idx].req] = e;
  if (finished) {
    uint32_t req = a->q[idx].req;
    if (a->rem[req] > 0)
      a->rem[req]--;
    aio_advance(a);
  }
}

static int os_aio_wait(kv_io *io, kv_aio *a, size_t n)
{
  (void)io;
  int all = n == SIZE_MAX;
  if (n > a->nreq)
    n = a->nreq;
  while (all ? (a->inflight > 0 || a->head < a->nq) : a->done < n) {
    aio_fill(a);
    if (a->inflight == 0) { /* nothing in flight and the rest cannot be queued */
      if (a->err == 0)
        a->err = -EIO;
      break;
    }
    struct io_uring_cqe *cqe;
    int rc = io_uring_wait_cqe(&a->ring, &cqe);
    if (rc == -EINTR)
      continue;
    if (rc < 0)
      return rc;
    uint64_t idx = io_uring_cqe_get_data64(cqe);
    int res = cqe->res;
    io_uring_cqe_seen(&a->ring, cqe);
    a->inflight--;
    aio_complete(a, idx, res);
  }
  /* all: the first error of any request; else the first of requests 0 .. n-1 (a later
   * request's failure is reported when it is waited for) */
  int err = a->err;
  if (!all && a->done >= n) {
    err = 0;
    for (size_t r = 0; r < n && err == 0; r++)
      err = a->rerr[r];
  }
  if (all) {
    a->nq = a->head = 0;
    a->nreq = a->done = 0;
    a->err = 0;
  }
  return err;
}

static void os_aio_end(kv_io *io, kv_aio *a)
{
  if (a == NULL)
    return;
  os_aio_wait(io, a, SIZE_MAX);
  os_io *o = (os_io *)io;
  pthread_mutex_lock(&o->mu);
  a->next = o->free_list;
  o->free_list = a;
  pthread_mutex_unlock(&o->mu);
}
#endif

#define OS_SYNC_OPS                                                                                \
  .open = os_open, .pread = os_pread, .pwrite = os_pwrite, .sync = os_sync,                        \
  .truncate = os_truncate, .alloc = os_alloc, .size = os_size, .lock = os_lock,                    \
  .close = os_close, .unlink = os_unlink, .punch = os_punch

static const kv_io_ops os_ops = {OS_SYNC_OPS};

#ifdef KVDB_HAVE_URING
static const kv_io_ops os_uring_ops = {
  OS_SYNC_OPS, .aio_begin = os_aio_begin, .aio_queue = os_aio_queue, .aio_wait = os_aio_wait,
  .aio_end = os_aio_end,
};
#endif

kv_io *kv_io_os_create(int use_uring)
{
  os_io *o = calloc(1, sizeof *o);
  if (o == NULL)
    return NULL;
  pthread_mutex_init(&o->mu, NULL);
  o->base.ops = &os_ops;
  o->base.impl = o;
#ifdef KVDB_HAVE_URING
  if (use_uring) {
    kv_aio *probe = os_aio_begin(&o->base);
    if (probe != NULL) {
      o->base.ops = &os_uring_ops;
      o->base.uring = 1;
      os_aio_end(&o->base, probe);
    }
  }
#else
  (void)use_uring;
#endif
  return &o->base;
}

void kv_io_destroy(kv_io *io)
{
  if (io == NULL)
    return;
  if (io->ops->open != os_open) {
    /* a test layer: it owns its own teardown through its impl (see io_test.c) */
    return;
  }
  os_io *o = (os_io *)io;
#ifdef KVDB_HAVE_URING
  kv_aio *a = o->free_list;
  while (a != NULL) {
    kv_aio *next = a->next;
    io_uring_queue_exit(&a->ring);
    free(a->q);
    free(a->rem);
    free(a->rerr);
    free(a);
    a = next;
  }
#endif
  pthread_mutex_destroy(&o->mu);
  free(o);
}

/* ---- generic batch API: native when the backend has it, else synchronous ---- */

struct kv_batch {
  kv_aio *native;
  size_t n_req;   /* requests queued since the last full wait */
  int err;        /* the first error of the earliest failed request so far, */
  size_t err_req; /* that request (SIZE_MAX: none yet) */
};

kv_batch *kv_batch_begin(kv_io *io)
{
  kv_batch *b = malloc(sizeof *b);
  if (b == NULL)
    return NULL;
  b->err = 0;
  b->err_req = SIZE_MAX;
  b->n_req = 0;
  b->native = io->ops->aio_begin != NULL ? io->ops->aio_begin(io) : NULL;
  return b;
}

/* rc of request req (SIZE_MAX: of no request in particular, a full wait's: counts for all) */
static void note(kv_batch *b, int rc, size_t req)
{
  if (rc != 0 && (b->err == 0 || req < b->err_req)) {
    b->err = rc;
    b->err_req = req == SIZE_MAX ? 0 : req;
  }
}

size_t kv_batch_read(kv_io *io, kv_batch *b, kv_file *f, void *buf, size_t len, uint64_t off)
{
  if (b->native != NULL)
    note(b, io->ops->aio_queue(io, b->native, f, buf, len, off, 0), b->n_req);
  else
    note(b, io->ops->pread(io, f, buf, len, off), b->n_req);
  return b->n_req++;
}

size_t kv_batch_write(kv_io *io, kv_batch *b, kv_file *f, const void *buf, size_t len,
                      uint64_t off)
{
  if (b->native != NULL)
    note(b, io->ops->aio_queue(io, b->native, f, (void *)(uintptr_t)buf, len, off, 1),
         b->n_req);
  else
    note(b, io->ops->pwrite(io, f, buf, len, off), b->n_req);
  return b->n_req++;
}

int kv_batch_wait_first(kv_io *io, kv_batch *b, size_t n)
{
  if (b->native != NULL && n > 0)
    note(b, io->ops->aio_wait(io, b->native, n), n - 1); /* (of requests 0 .. n-1) */
  return b->err_req < n ? b->err : 0;
}

int kv_batch_wait(kv_io *io, kv_batch *b)
{
  if (b->native != NULL)
    note(b, io->ops->aio_wait(io, b->native, SIZE_MAX), SIZE_MAX);
  int err = b->err;
  b->err = 0;
  b->err_req = SIZE_MAX;
  b->n_req = 0;
  return err;
}

void kv_batch_end(kv_io *io, kv_batch *b)
{
  if (b == NULL)
    return;
  if (b->native != NULL)
    io->ops->aio_end(io, b->native);
  free(b);
}
