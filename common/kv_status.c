/* SPDX-License-Identifier: MIT */
/*
 * common/kv_status.c — status names and texts (one X-macro table, libuv style), the
 * per-thread error message behind kvdb_errmsg(), and logging.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "kv_common.h"

#define KV_STATUS_MAP(X)                                                                           \
  X(OK, "success")                                                                                 \
  X(NOTFOUND, "not found")                                                                         \
  X(INVALID, "invalid argument")                                                                   \
  X(MISUSE, "call not allowed in this state")                                                      \
  X(NOMEM, "out of memory")                                                                        \
  X(FULL, "no space left (disk or tier capacity)")                                                 \
  X(BUSY, "resource busy")                                                                         \
  X(IOERR, "input/output error")                                                                   \
  X(CORRUPT, "stored data failed validation")                                                      \
  X(VERSION, "database written by a newer format version")                                         \
  X(UNSUPPORTED, "not supported by this build or machine")                                         \
  X(MISMATCH, "model shape differs from the stored one")                                           \
  X(READONLY, "database is read-only")                                                             \
  X(PANIC, "internal error; close the handle")

const char *kvdb_status_name(kvdb_status rc)
{
  switch (rc) {
#define X(n, s)                                                                                    \
  case KVDB_##n:                                                                                   \
    return "KVDB_" #n;
    KV_STATUS_MAP(X)
#undef X
  }
  return "KVDB_UNKNOWN";
}

const char *kvdb_strerror(kvdb_status rc)
{
  switch (rc) {
#define X(n, s)                                                                                    \
  case KVDB_##n:                                                                                   \
    return s;
    KV_STATUS_MAP(X)
#undef X
  }
  return "unknown status";
}

unsigned kvdb_version_number(void)
{
  return KVDB_VERSION_NUMBER;
}

static _Thread_local char tls_msg[512];

const char *kvdb_errmsg(void)
{
  return tls_msg;
}

void kv_clear_error(void)
{
  tls_msg[0] = 0;
}

kvdb_status kv_fail(kvdb_status rc, const char *fmt, ...)
{
  char tmp[sizeof tls_msg]; /* the arguments may include kvdb_errmsg() itself */
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(tmp, sizeof tmp, fmt, ap);
  va_end(ap);
  memcpy(tls_msg, tmp, sizeof tmp);
  return rc;
}

kvdb_status kv_status_from_errno(int err)
{
  switch (err) {
  case ENOSPC:
  case EDQUOT:
  case EFBIG:
    return KVDB_FULL;
  case EROFS:
  case EACCES:
  case EPERM:
    return KVDB_READONLY;
  case ENOMEM:
    return KVDB_NOMEM;
  case ENOENT:
    return KVDB_NOTFOUND;
  default:
    return KVDB_IOERR;
  }
}

kvdb_status kv_fail_errno(int err, const char *fmt, ...)
{
  char what[400];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(what, sizeof what, fmt, ap);
  va_end(ap);
  snprintf(tls_msg, sizeof tls_msg, "%s: %s", what, strerror(err));
  return kv_status_from_errno(err);
}

void kv_log(const kv_logger *lg, int level, const char *fmt, ...)
{
  if (lg != NULL && level > lg->level)
    return;
  char msg[600];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  if (lg != NULL && lg->fn != NULL)
    lg->fn(lg->ctx, level, msg);
  else
    fprintf(stderr, "kvdb: %s%s\n", level == 0 ? "error: " : level == 1 ? "warning: " : "", msg);
}

char *kv_hex16(const uint8_t *b, char *buf)
{
  static const char hx[] = "0123456789abcdef";
  for (int i = 0; i < 16; i++) {
    buf[2 * i] = hx[b[i] >> 4];
    buf[2 * i + 1] = hx[b[i] & 15];
  }
  buf[32] = 0;
  return buf;
}

uint64_t kv_now_ms(void)
{
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

uint64_t kv_mono_ns(void)
{
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}
