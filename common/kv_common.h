/* SPDX-License-Identifier: MIT */
/*
 * common/kv_common.h — the leaf layer every other part of kvdb includes.
 *
 * Status helpers, the per-thread error message, logging and little-endian codecs.
 * Includes nothing of kvdb except the public header (for kvdb_status).
 */
#ifndef KV_COMMON_H
#define KV_COMMON_H

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kvdb.h"

#define KV_PAGE 4096u
#define KV_ALIGN_UP(x, a) (((x) + ((a)-1)) / (a) * (a))

#if defined(__GNUC__)
#define KV_PRINTF(f, a) __attribute__((format(printf, f, a)))
#define KV_LIKELY(x) __builtin_expect(!!(x), 1)
#define KV_UNLIKELY(x) __builtin_expect(!!(x), 0)
#else
#define KV_PRINTF(f, a)
#define KV_LIKELY(x) (x)
#define KV_UNLIKELY(x) (x)
#endif

/* Return the status of expr if it is not KVDB_OK. */
#define KV_RET(expr)                                                                               \
  do {                                                                                             \
    kvdb_status rc_ = (expr);                                                                      \
    if (rc_ != KVDB_OK)                                                                            \
      return rc_;                                                                                  \
  } while (0)
/* Set `rc` and jump to the function's `out:` label. */
#define KV_ERR(expr)                                                                               \
  do {                                                                                             \
    if ((rc = (expr)) != KVDB_OK)                                                                  \
      goto out;                                                                                    \
  } while (0)

/* Room for entry n of the array *arr (*cap entries of `size` bytes; when full, doubled, or
 * `first` entries while empty): 0, or -1 when out of memory (the array left as it was). */
static inline int kv_grow(void **arr, size_t n, size_t *cap, size_t size, size_t first)
{
  if (n < *cap)
    return 0;
  size_t c = *cap ? 2 * *cap : first;
  void *a = realloc(*arr, c * size);
  if (a == NULL)
    return -1;
  *arr = a;
  *cap = c;
  return 0;
}

/*
 * kv_fail() - record a message for kvdb_errmsg() on this thread and return `rc`.
 * Messages follow git's rules: lowercase, the error first, the subject in quotes.
 */
kvdb_status kv_fail(kvdb_status rc, const char *fmt, ...) KV_PRINTF(2, 3);
/* kv_fail_errno() - map an errno (positive) to a status (ENOSPC -> FULL, EROFS/EACCES ->
 * READONLY, ENOMEM -> NOMEM, else IOERR) and record "<what>: <strerror>". */
kvdb_status kv_fail_errno(int err, const char *fmt, ...) KV_PRINTF(2, 3);
kvdb_status kv_status_from_errno(int err);
/* Clear this thread's message (each public call starts clean). */
void kv_clear_error(void);

/* Logging through the handle's callback (kv_log_fn may be NULL = stderr). */
typedef struct kv_logger {
  kvdb_log_fn fn;
  void *ctx;
  int level;
} kv_logger;
void kv_log(const kv_logger *lg, int level, const char *fmt, ...) KV_PRINTF(3, 4);

/* Little-endian codecs: every on-disk byte goes through these. */
static inline void kv_put_le16(uint8_t *p, uint16_t v)
{
  p[0] = (uint8_t)v;
  p[1] = (uint8_t)(v >> 8);
}
static inline void kv_put_le32(uint8_t *p, uint32_t v)
{
  for (int i = 0; i < 4; i++)
    p[i] = (uint8_t)(v >> (8 * i));
}
static inline void kv_put_le64(uint8_t *p, uint64_t v)
{
  for (int i = 0; i < 8; i++)
    p[i] = (uint8_t)(v >> (8 * i));
}
static inline uint16_t kv_get_le16(const uint8_t *p)
{
  return (uint16_t)(p[0] | (p[1] << 8));
}
static inline uint32_t kv_get_le32(const uint8_t *p)
{
  return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}
static inline uint64_t kv_get_le64(const uint8_t *p)
{
  return (uint64_t)kv_get_le32(p) | ((uint64_t)kv_get_le32(p + 4) << 32);
}
/* A double as its IEEE-754 bits, little-endian (catalog records keep doubles bit-exact). */
static inline void kv_put_lef64(uint8_t *p, double d)
{
  uint64_t u;
  memcpy(&u, &d, 8);
  kv_put_le64(p, u);
}
static inline double kv_get_lef64(const uint8_t *p)
{
  uint64_t u = kv_get_le64(p);
  double d;
  memcpy(&d, &u, 8);
  return d;
}

/* Hex of a 16-byte key, 32 chars + NUL. */
char *kv_hex16(const uint8_t *b, char *buf);

/* Wall clock in ms since the epoch, and a monotonic clock in ns. */
uint64_t kv_now_ms(void);
uint64_t kv_mono_ns(void);

#endif
