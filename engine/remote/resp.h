/* SPDX-License-Identifier: MIT */
/*
 * engine/remote/resp.h — the reader of a pipelined batch's replies (RESP2, the Redis protocol)
 * straight from the connection's socket, used by remote.c in place of hiredis' reader for the
 * replies of GET, GETRANGE, SET and DEL (hiredis still connects and writes the commands).
 *
 * Why (bench/RESULTS.md, "kvdb-bench remote"): hiredis 0.14 reads 16 KiB at a time onto its
 * stack, appends that to its buffer (an sds that grows by reallocation), then copies a bulk
 * string once more into its reply object: three copies of a 68 KiB value before kvdb looks at
 * it. This reader parses the reply's header from a small read-ahead buffer and reads the rest
 * of a bulk string from the socket directly into the value's own 64-byte-aligned buffer,
 * the trailer and the next reply's first bytes in the same read: one copy, by the kernel.
 * Buffers come from a pool (kv_resp_pool: the next value lands in memory the last one left in
 * the cache, with no malloc and free of 70 KB); a reader may poll its socket for a while
 * before it sleeps (poll_us: a reader that does not sleep needs no wake-up).
 *
 * Replies it takes: bulk string ($N, N <= max_bulk; $-1 is nil), status (+), integer (:),
 * error (-, the line kept). Anything else (arrays, RESP3 types, a bad length, a line past
 * KV_RESP_LINE_MAX, a bulk without its CRLF) is a protocol error: the connection can no longer
 * be trusted, its caller closes it. A read that times out (the socket's SO_RCVTIMEO, set by
 * redisSetTimeout) or ends (EOF, reset) is a failure too. Nothing here trusts a byte it read.
 */
#ifndef KV_RESP_H
#define KV_RESP_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#define KV_RESP_LINE_MAX 4096u            /* a reply's header or error line, CRLF included */
#define KV_RESP_MAX_BULK (512ull << 20)   /* Redis' proto-max-bulk-len default */

enum { KV_RESP_BULK = 1, KV_RESP_NIL = 2, KV_RESP_STATUS = 3, KV_RESP_INT = 4, KV_RESP_ERROR = 5 };

/* Value buffers kept for the next replies (a client's pool, shared by its connections and
 * threads): a batch's values are verified and released one after the other, so the next value
 * is read into memory the previous one just left in the cache, without a malloc and free of
 * 70 KB each. At most KV_RESP_POOL_N buffers of at most KV_RESP_POOL_MAX bytes are kept. */
#define KV_RESP_POOL_N 4
#define KV_RESP_POOL_MAX (1u << 20)
typedef struct kv_resp_pool {
  pthread_mutex_t mu;
  uint8_t *buf[KV_RESP_POOL_N]; /* free buffers (their data pointers) */
  int n;
} kv_resp_pool;

void kv_resp_pool_init(kv_resp_pool *p);
/* Frees the buffers kept; every value taken from it must have been released before. */
void kv_resp_pool_destroy(kv_resp_pool *p);

/* A connection's read-ahead: buf[pos, len) are bytes read and not yet parsed. */
typedef struct kv_resp_rd {
  int fd;
  uint8_t *buf; /* KV_RESP_BUF bytes, allocated at the first read */
  size_t pos, len;
  uint64_t max_bulk; /* bulk strings longer than this are a protocol error */
  uint64_t bytes_in; /* bytes read from the socket, counted */
  kv_resp_pool *pool; /* where values come from and go back to (NULL: malloc and free) */
  uint32_t poll_us;   /* wait for a reply's bytes polling (not sleeping) this long first */
} kv_resp_rd;

typedef struct kv_resp {
  int type;       /* KV_RESP_* */
  uint8_t *data;  /* BULK: len bytes (+ a NUL), 64-byte aligned, given back by kv_resp_data_free */
  size_t len;
  int64_t integer;       /* INT */
  char line[KV_RESP_LINE_MAX]; /* STATUS, ERROR: the line without its type byte and CRLF */
} kv_resp;

/* A reader of socket fd with nothing buffered (no pool, no spin: set them after). */
void kv_resp_init(kv_resp_rd *r, int fd);
/* Give back a value's data (kv_resp.data; NULL is nothing): to its pool or to free(). */
void kv_resp_data_free(uint8_t *data);
void kv_resp_free(kv_resp_rd *r);
/* 1 when bytes past the replies read so far are buffered (a protocol desync). */
int kv_resp_pending(const kv_resp_rd *r);
/* Read one reply into *out. 0, or -1 with why in err (out->data NULL). */
int kv_resp_read(kv_resp_rd *r, kv_resp *out, char *err, size_t errcap);

#endif
