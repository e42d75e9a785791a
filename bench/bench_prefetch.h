/* SPDX-License-Identifier: MIT */
/*
 * bench/bench_prefetch.h — what the parts of `kvdb-bench prefetch` share (bench_prefetch.c: the
 * driver, the admission and TTFT figures, the GPU hop; bench_prefetch_sim.c: the serving
 * simulator).
 */
#ifndef BENCH_PREFETCH_H
#define BENCH_PREFETCH_H

#include "bench.h"
#include "kvdb.h"

/* The store every part reads: a pool of prefixes (system prompts, documents) put once. */
typedef struct pf_pool {
  kvdb_model m;
  char path[4096];  /* the database */
  size_t n;         /* prefixes */
  uint32_t **tok;   /* tok[i]: len[i] tokens */
  size_t *len;
  uint64_t bytes;   /* KV bytes of all prefixes */
  double ssd_bps;   /* a cold get's speed, measured */
} pf_pool;

/* Open the pool's database with a DRAM tier of `dram` bytes (0: none). */
kvdb *pf_open(const pf_pool *p, uint64_t dram, double prefetch_bps);
/* A kvdb_get of prefix i (plus `extra` unstored tokens after it) into buf: ns; *dram_only 1
 * when no block came from the SSD tier. */
uint64_t pf_get(kvdb *db, const pf_pool *p, size_t i, void *buf, int *dram_only);
/* Poll a prefetch until it has finished (or 30 s). */
kvdb_prefetch_state pf_wait(kvdb *db, kvdb_prefetch_id id);
void pf_sleep_ns(uint64_t ns);

/* The serving simulation: per policy (LRU, LFU, static, oracle, TierKV at K = 1..8) TTFT p50/p99,
 * stall time and hit rate into the report and j; *hit_k4 and *stall_ratio the targets' figures. */
int pf_simulate(const bench_env *env, const pf_pool *p, bench_json *j, double *hit_k4,
                double *stall_ratio);

#endif
