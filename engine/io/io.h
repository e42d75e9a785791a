/* SPDX-License-Identifier: MIT */
/*
 * engine/io/io.h — the only way the engine touches segment files (SQLite's VFS idea).
 *
 * Inside this layer functions return 0 or -errno (liburing's convention); the store converts
 * to kvdb_status once. Backends: the OS one (io_uring for batched reads and writes when the
 * kernel allows it, pread/pwrite otherwise; O_DIRECT when the filesystem allows it) and, for
 * tests, layers that fail the Nth operation or keep unsynced writes in memory to simulate a
 * power loss (io_test.c). The LMDB catalog does its own I/O and is not routed through here.
 *
 * Asynchronous batches (kv_aio): queue reads/writes, then wait for the first n of them (in
 * queueing order) or for all. A backend without native async I/O performs each request when it
 * is queued. A batch belongs to one thread.
 */
#ifndef KV_IO_H
#define KV_IO_H

#include <stddef.h>
#include <stdint.h>

typedef struct kv_file kv_file;
typedef struct kv_aio kv_aio;
typedef struct kv_io kv_io;

enum { KV_IO_CREATE = 1, KV_IO_RDONLY = 2, KV_IO_DIRECT = 4 };

typedef struct kv_io_ops {
  /* open a file; *is_direct reports whether O_DIRECT took (KV_IO_DIRECT asked for it) */
  int (*open)(kv_io *io, const char *path, int flags, int *is_direct, kv_file **out);
  int (*pread)(kv_io *io, kv_file *f, void *buf, size_t len, uint64_t off);   /* all or -errno */
  int (*pwrite)(kv_io *io, kv_file *f, const void *buf, size_t len, uint64_t off);
  int (*sync)(kv_io *io, kv_file *f);                                         /* fdatasync */
  int (*truncate)(kv_io *io, kv_file *f, uint64_t len);
  /* reserve [off, off + len) (fallocate mode 0: the size grows to at least off + len) so that
   * later writes there are overwrites, not appends; -EOPNOTSUPP when the filesystem cannot */
  int (*alloc)(kv_io *io, kv_file *f, uint64_t off, uint64_t len);
  int (*size)(kv_io *io, kv_file *f, uint64_t *out);
  int (*lock)(kv_io *io, kv_file *f, int exclusive_nonblock);                 /* flock; -EWOULDBLOCK */
  void (*close)(kv_io *io, kv_file *f);
  int (*unlink)(kv_io *io, const char *path);
  /* free [off, off + len) in place, the size unchanged (fallocate PUNCH_HOLE | KEEP_SIZE):
   * reads there see zeros; -EOPNOTSUPP when the filesystem cannot; NULL = never */
  int (*punch)(kv_io *io, kv_file *f, uint64_t off, uint64_t len);
  /* optional native async batches; NULL = synchronous emulation */
  kv_aio *(*aio_begin)(kv_io *io);
  int (*aio_queue)(kv_io *io, kv_aio *a, kv_file *f, void *buf, size_t len, uint64_t off, int write);
  /* wait until the first n requests queued since the last reset are complete (n = SIZE_MAX:
   * all of them, then reset the count); the first error of those n (all: of any), or 0 */
  int (*aio_wait)(kv_io *io, kv_aio *a, size_t n);
  void (*aio_end)(kv_io *io, kv_aio *a);
} kv_io_ops;

struct kv_io {
  const kv_io_ops *ops;
  int uring;  /* 1 when io_uring is in use */
  void *impl;
};

/* The OS backend. use_uring: try io_uring. Returns NULL on allocation failure. */
kv_io *kv_io_os_create(int use_uring);
void kv_io_destroy(kv_io *io);
/* The fd behind an OS-backend file (for tools that need it); -1 for other backends. */
int kv_io_os_fd(kv_file *f);

/*
 * Batches over any backend (native async when present, else each request runs when queued).
 * Queue reads/writes; each queued request gets the next index (0, 1, ...) since the last
 * kv_batch_wait(), which returns the first error (or 0) of everything queued since then and
 * starts the count again. kv_batch_wait_first(n) waits only for requests 0 .. n-1 (in queueing
 * order, so a reader can work on the front of a long read while the rest is in flight) and
 * returns the first error of those requests (a later request's failure is returned when it is
 * waited for, or by kv_batch_wait) without resetting anything.
 * kv_batch_begin returns NULL only when out of memory.
 */
typedef struct kv_batch kv_batch;
kv_batch *kv_batch_begin(kv_io *io);
size_t kv_batch_read(kv_io *io, kv_batch *b, kv_file *f, void *buf, size_t len, uint64_t off);
size_t kv_batch_write(kv_io *io, kv_batch *b, kv_file *f, const void *buf, size_t len,
                      uint64_t off);
int kv_batch_wait_first(kv_io *io, kv_batch *b, size_t n);
int kv_batch_wait(kv_io *io, kv_batch *b);
void kv_batch_end(kv_io *io, kv_batch *b);

/*
 * Test seam: when set (before kvdb_open), kvdb_open wraps its OS backend with this function's
 * result. Used by tests/ only; never set by the library.
 */
typedef kv_io *(*kv_io_wrap_fn)(kv_io *os);
extern kv_io_wrap_fn kv_io_test_wrap;

#endif
