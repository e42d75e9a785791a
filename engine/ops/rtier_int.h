/* SPDX-License-Identifier: MIT */
/*
 * engine/ops/rtier_int.h — the remote tier's handle state, shared by rtier.c (the thread, the
 * remote part of a chain, copies, figures) and rqueue.c (a put's write-through queue: put.c
 * calls it, and rtier.c calls put.c for copies, so the queue is a file of its own).
 */
#ifndef KV_RTIER_INT_H
#define KV_RTIER_INT_H

#include <pthread.h>
#include <stdint.h>

#include "ops_int.h"
#include "remote/remote.h"

struct copy_job;

struct kv_rtier {
  kv_remote *r;
  char ns[64];
  uint64_t ns_tag;
  pthread_mutex_t mu;
  pthread_cond_t more, room, idle;
  uint8_t (*q)[32]; /* ring of block hashes, each with its chain's first block's hash */
  uint32_t cap, head, len;
  int busy;         /* the worker holds a batch */
  int stop;
  int has_thread;
  int on_put, on_evict; /* kvdb_options.remote_write (0 = on put), with a queue only */
  int copy;             /* kvdb_options.remote_copy_hits, with the thread only */
  int tag;              /* kvdb_options.remote_hash_tag */
  struct copy_job *jh, *jt; /* copies waiting, oldest first */
  uint64_t job_bytes;
  pthread_t th;
  pthread_mutex_t fmu;  /* the figures below; one probe at a time */
  kv_tier_perf perf;    /* the remote tier's figures for the placement (kv_rtier_figures) */
  uint64_t probed_ms;   /* when they were measured (0: never) */
  int perf_ok;          /* the last probe succeeded */
  _Atomic uint64_t hits, misses, rejected, queued, written, dropped, copied, copy_failed;
};

#endif
