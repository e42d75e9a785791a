/* SPDX-License-Identifier: MIT */
/*
 * tests/io_test.h — an I/O layer for tests, wrapped around kvdb's OS backend through the
 * kv_io_test_wrap seam (SQLite's test VFS idea, test6.c for crashes).
 *
 * Fault mode: the Nth operation of a kind (read, write, sync, open, truncate, fallocate) fails with a
 * chosen errno; a write can instead be made short (half written, then the error).
 * Power-loss mode: writes are kept in memory until the file is synced; reads see them. At
 * the Nth sync the process "loses power": the unsynced writes of every file are dropped,
 * kept, or kept with garbled bytes (chosen by the test), and the process exits with
 * IOT_CRASH_EXIT at once — before the catalog transaction that would have followed.
 */
#ifndef IO_TEST_H
#define IO_TEST_H

#include "io/io.h"

enum iot_kind { IOT_READ, IOT_WRITE, IOT_SYNC, IOT_OPEN, IOT_TRUNC, IOT_ALLOC, IOT_KINDS };
enum iot_loss { IOT_DROP, IOT_KEEP, IOT_GARBLE };
#define IOT_CRASH_EXIT 99

typedef struct iot_config {
  /* fault mode */
  int fail_kind;      /* enum iot_kind, or -1 for none */
  long fail_at;       /* 1-based count of that kind of operation */
  int fail_errno;     /* EIO, ENOSPC, ... */
  int short_write;    /* with IOT_WRITE: write half, then fail */
  int fail_sticky;    /* keep failing every later operation of that kind */
  /* power-loss mode */
  int powerloss;
  long crash_at_sync; /* 1-based; 0 = never */
  int loss;           /* enum iot_loss */
  unsigned long long seed;
  /* called with the path before every open (tests that act between a reader's catalog snapshot
   * and its opening of a file); NULL for none */
  void (*before_open)(const char *path, void *ctx);
  void *before_open_ctx;
} iot_config;

/* Configure; must be called before kvdb_open (sets kv_io_test_wrap). */
void iot_install(const iot_config *cfg);
/* Lose power now (power-loss mode): apply the configured loss to unsynced writes, exit. */
void iot_crash_now(void);
/* Remove the layer for later opens. */
void iot_uninstall(void);
/* Operations of each kind seen so far; whether the configured fault has fired. */
long iot_count(int kind);
int iot_fired(void);
/* Change the fault between operations (e.g. to stop failing: fail_kind = -1). */
void iot_set_fault(int kind, long at, int err, int sticky);

#endif
