/* SPDX-License-Identifier: MIT */
/*
 * tests/io_test.c — see io_test.h.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "io_test.h"

typedef struct pend {
  uint64_t off;
  size_t len;
  uint8_t *data;
  struct pend *next;
} pend;

struct kv_file; /* the OS backend's */

/* One per path, shared by every open of it (the "inode"): what other opens must see. */
typedef struct tnode {
  char path[4200];
  pend *head, *tail; /* unsynced writes, in order */
  uint64_t size;     /* logical size including unsynced writes */
  int refs;
  struct tnode *next_all;
} tnode;

typedef struct tfile {
  kv_file *real;
  tnode *n;
} tfile;

static struct {
  iot_config cfg;
  kv_io base;
  kv_io *os;
  long count[IOT_KINDS];
  int fired;
  long syncs;
  pthread_mutex_t mu;
  tnode *all;
} T = {.mu = PTHREAD_MUTEX_INITIALIZER};

long iot_count(int kind)
{
  return T.count[kind];
}

int iot_fired(void)
{
  return T.fired;
}

void iot_set_fault(int kind, long at, int err, int sticky)
{
  pthread_mutex_lock(&T.mu);
  T.cfg.fail_sticky = sticky;
  T.cfg.fail_kind = kind;
  T.cfg.fail_at = at;
  T.cfg.fail_errno = err;
  memset(T.count, 0, sizeof T.count);
  T.fired = 0;
  pthread_mutex_unlock(&T.mu);
}

/* 0 = go on, else -errno to return; *short_w set for a short write. */
static int fault(int kind, int *short_w)
{
  pthread_mutex_lock(&T.mu);
  long n = ++T.count[kind];
  int rc = 0;
  if (T.cfg.fail_kind == kind && (n == T.cfg.fail_at || (T.cfg.fail_sticky && n > T.cfg.fail_at))) {
    T.fired = 1;
    rc = -T.cfg.fail_errno;
    if (short_w)
      *short_w = T.cfg.short_write;
  }
  pthread_mutex_unlock(&T.mu);
  return rc;
}

static unsigned long long rnd(void)
{
  unsigned long long z = (T.cfg.seed += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

static int apply(tfile *f)
{
  pend *p = f->n->head;
  int rc = 0;
  while (p != NULL) {
    pend *n = p->next;
    if (rc == 0)
      rc = T.os->ops->pwrite(T.os, f->real, p->data, p->len, p->off);
    free(p->data);
    free(p);
    p = n;
  }
  f->n->head = f->n->tail = NULL;
  return rc;
}

static void drop_pending(tnode *nd)
{
  pend *p = nd->head;
  while (p != NULL) {
    pend *n = p->next;
    free(p->data);
    free(p);
    p = n;
  }
  nd->head = nd->tail = NULL;
}

/* Power loss: every file's unsynced writes are dropped, kept or garbled; then exit. */
static void lose_power(void)
{
  for (tnode *nd = T.all; nd != NULL; nd = nd->next_all) {
    if (T.cfg.loss == IOT_DROP || nd->head == NULL) {
      drop_pending(nd);
      continue;
    }
    if (T.cfg.loss == IOT_GARBLE) {
      for (pend *p = nd->head; p != NULL; p = p->next) {
        /* a torn write: a random prefix survives, the rest is noise */
        size_t keep = p->len ? (size_t)(rnd() % p->len) : 0;
        for (size_t i = keep; i < p->len; i++)
          p->data[i] = (uint8_t)rnd();
      }
    }
    kv_file *real;
    if (T.os->ops->open(T.os, nd->path, 0, NULL, &real) == 0) {
      tfile tmp = {real, nd};
      apply(&tmp);
      T.os->ops->close(T.os, real);
    }
  }
  _exit(IOT_CRASH_EXIT);
}

static int t_open(kv_io *io, const char *path, int flags, int *is_direct, kv_file **out)
{
  (void)io;
  if (T.cfg.before_open != NULL)
    T.cfg.before_open(path, T.cfg.before_open_ctx);
  int rc = fault(IOT_OPEN, NULL);
  if (rc != 0)
    return rc;
  tfile *f = calloc(1, sizeof *f);
  if (f == NULL)
    return -ENOMEM;
  /* buffered I/O underneath: the layer's own copies need no alignment */
  rc = T.os->ops->open(T.os, path, flags & ~KV_IO_DIRECT, is_direct, &f->real);
  if (rc != 0) {
    free(f);
    return rc;
  }
  pthread_mutex_lock(&T.mu);
  tnode *nd = T.all;
  while (nd != NULL && strcmp(nd->path, path) != 0)
    nd = nd->next_all;
  if (nd == NULL) {
    nd = calloc(1, sizeof *nd);
    if (nd == NULL) {
      pthread_mutex_unlock(&T.mu);
      T.os->ops->close(T.os, f->real);
      free(f);
      return -ENOMEM;
    }
    snprintf(nd->path, sizeof nd->path, "%s", path);
    T.os->ops->size(T.os, f->real, &nd->size);
    nd->next_all = T.all;
    T.all = nd;
  }
  nd->refs++;
  f->n = nd;
  pthread_mutex_unlock(&T.mu);
  *out = (kv_file *)f;
  return 0;
}

static int t_pread(kv_io *io, kv_file *kf, void *buf, size_t len, uint64_t off)
{
  (void)io;
  tfile *f = (tfile *)kf;
  int rc = fault(IOT_READ, NULL);
  if (rc != 0)
    return rc;
  pthread_mutex_lock(&T.mu);
  if (off + len > f->n->size) {
    pthread_mutex_unlock(&T.mu);
    return -EIO;
  }
  uint64_t real_size = 0;
  T.os->ops->size(T.os, f->real, &real_size);
  if (off < real_size) {
    size_t n = off + len <= real_size ? len : (size_t)(real_size - off);
    rc = T.os->ops->pread(T.os, f->real, buf, n, off);
    if (n < len)
      memset((uint8_t *)buf + n, 0, len - n);
  } else {
    memset(buf, 0, len);
  }
  for (pend *p = f->n->head; rc == 0 && p != NULL; p = p->next) {
    uint64_t a = p->off > off ? p->off : off;
    uint64_t b = p->off + p->len < off + len ? p->off + p->len : off + len;
    if (a < b)
      memcpy((uint8_t *)buf + (a - off), p->data + (a - p->off), b - a);
  }
  pthread_mutex_unlock(&T.mu);
  return rc;
}

static int t_pwrite(kv_io *io, kv_file *kf, const void *buf, size_t len, uint64_t off)
{
  (void)io;
  tfile *f = (tfile *)kf;
  int short_w = 0;
  int rc = fault(IOT_WRITE, &short_w);
  if (rc != 0 && !short_w)
    return rc;
  size_t n = rc != 0 ? len / 2 : len;
  if (!T.cfg.powerloss) {
    int wrc = T.os->ops->pwrite(T.os, f->real, buf, n, off);
    pthread_mutex_lock(&T.mu);
    if (wrc == 0 && off + n > f->n->size)
      f->n->size = off + n;
    pthread_mutex_unlock(&T.mu);
    return rc != 0 ? rc : wrc;
  }
  pend *p = malloc(sizeof *p);
  if (p == NULL)
    return -ENOMEM;
  p->data = malloc(n ? n : 1);
  if (p->data == NULL) {
    free(p);
    return -ENOMEM;
  }
  memcpy(p->data, buf, n);
  p->off = off;
  p->len = n;
  p->next = NULL;
  pthread_mutex_lock(&T.mu);
  if (f->n->tail)
    f->n->tail->next = p;
  else
    f->n->head = p;
  f->n->tail = p;
  if (off + n > f->n->size)
    f->n->size = off + n;
  pthread_mutex_unlock(&T.mu);
  return rc;
}

static int t_sync(kv_io *io, kv_file *kf)
{
  (void)io;
  tfile *f = (tfile *)kf;
  int rc = fault(IOT_SYNC, NULL);
  if (rc != 0)
    return rc;
  pthread_mutex_lock(&T.mu);
  long n = ++T.syncs;
  if (T.cfg.powerloss && T.cfg.crash_at_sync > 0 && n == T.cfg.crash_at_sync)
    lose_power(); /* does not return */
  rc = apply(f);
  pthread_mutex_unlock(&T.mu);
  if (rc == 0)
    rc = T.os->ops->sync(T.os, f->real);
  return rc;
}

static int t_truncate(kv_io *io, kv_file *kf, uint64_t len)
{
  (void)io;
  tfile *f = (tfile *)kf;
  int rc = fault(IOT_TRUNC, NULL);
  if (rc != 0)
    return rc;
  pthread_mutex_lock(&T.mu);
  rc = apply(f); /* simple model: a truncate is ordered after the writes before it */
  if (rc == 0)
    rc = T.os->ops->truncate(T.os, f->real, len);
  if (rc == 0) {
    f->n->size = len;
    f->n->head = f->n->tail = NULL;
  }
  pthread_mutex_unlock(&T.mu);
  return rc;
}

/* fallocate: the real file gets the space and size at once (zeros, as after a crash that kept
 * the allocation but none of the writes); pending writes stay pending. */
static int t_alloc(kv_io *io, kv_file *kf, uint64_t off, uint64_t len)
{
  (void)io;
  tfile *f = (tfile *)kf;
  int rc = fault(IOT_ALLOC, NULL);
  if (rc != 0)
    return rc;
  rc = T.os->ops->alloc(T.os, f->real, off, len);
  if (rc == 0) {
    pthread_mutex_lock(&T.mu);
    if (off + len > f->n->size)
      f->n->size = off + len;
    pthread_mutex_unlock(&T.mu);
  }
  return rc;
}

static int t_size(kv_io *io, kv_file *kf, uint64_t *out)
{
  (void)io;
  tfile *f = (tfile *)kf;
  pthread_mutex_lock(&T.mu);
  *out = f->n->size;
  pthread_mutex_unlock(&T.mu);
  return 0;
}

static int t_lock(kv_io *io, kv_file *kf, int ex)
{
  (void)io;
  return T.os->ops->lock(T.os, ((tfile *)kf)->real, ex);
}

static void t_close(kv_io *io, kv_file *kf)
{
  (void)io;
  tfile *f = (tfile *)kf;
  if (f == NULL)
    return;
  pthread_mutex_lock(&T.mu);
  /* unsynced writes stay pending in the node: closing a file does not make it durable */
  f->n->refs--;
  pthread_mutex_unlock(&T.mu);
  T.os->ops->close(T.os, f->real);
  free(f);
}

static int t_unlink(kv_io *io, const char *path)
{
  (void)io;
  pthread_mutex_lock(&T.mu);
  for (tnode **pp = &T.all; *pp != NULL; pp = &(*pp)->next_all) {
    if (strcmp((*pp)->path, path) == 0 && (*pp)->refs == 0) {
      tnode *nd = *pp;
      *pp = nd->next_all;
      drop_pending(nd);
      free(nd);
      break;
    }
  }
  pthread_mutex_unlock(&T.mu);
  return T.os->ops->unlink(T.os, path);
}

static const kv_io_ops t_ops = {
  .open = t_open, .pread = t_pread, .pwrite = t_pwrite, .sync = t_sync, .truncate = t_truncate,
  .alloc = t_alloc, .size = t_size, .lock = t_lock, .close = t_close, .unlink = t_unlink,
};

static kv_io *wrap(kv_io *os)
{
  T.os = os;
  T.base.ops = &t_ops;
  T.base.uring = 0;
  T.base.impl = &T;
  return &T.base;
}

void iot_install(const iot_config *cfg)
{
  T.cfg = *cfg;
  memset(T.count, 0, sizeof T.count);
  T.fired = 0;
  T.syncs = 0;
  kv_io_test_wrap = wrap;
}

void iot_crash_now(void)
{
  pthread_mutex_lock(&T.mu);
  lose_power();
}

void iot_uninstall(void)
{
  kv_io_test_wrap = NULL;
  /* a clean shutdown: what was never synced reaches the files as the OS would write it back */
  pthread_mutex_lock(&T.mu);
  while (T.all != NULL) {
    tnode *nd = T.all;
    T.all = nd->next_all;
    kv_file *real;
    if (nd->head != NULL && T.os != NULL && T.os->ops->open(T.os, nd->path, 0, NULL, &real) == 0) {
      tfile tmp = {real, nd};
      apply(&tmp);
      T.os->ops->close(T.os, real);
    }
    drop_pending(nd);
    free(nd);
  }
  pthread_mutex_unlock(&T.mu);
}
