/* SPDX-License-Identifier: MIT */
/*
 * engine/tiers/tiers.h — the header of engine/tiers (floor io in LAYERS) for the floors above:
 * the DRAM tier (dram.c) and the tiers' read figures (perf.c).
 */
#ifndef KV_TIERS_H
#define KV_TIERS_H

#include <stddef.h>
#include <stdint.h>

#include "io/io.h"

/* ---- tier read figures (perf.c) ----------------------------------------------------------
 *
 * How fast each tier reads: a short probe when a database is opened, and an online fit from the
 * reads the engine really does.
 *
 * EvicPress (seed 004 §4.2) prices a config by TTFT = latency + bytes / bandwidth + decode,
 * with the tier figures static (its §8 names that as a limitation). kvdb measures them: a probe
 * of each persistent tier's directory at the first read-write open (cached in the catalog,
 * measured again when the directory's device changes), and then every cold read updates an
 * exponentially weighted least-squares fit of read time against bytes read, whose slope is
 * 1 / bandwidth and whose intercept is the latency. Reads of one size alone (all 16 MiB waves)
 * cannot separate the two; the fit then keeps the probe's latency and fits the bandwidth.
 *
 * Pure arithmetic except kv_probe_dir (file I/O through the engine's I/O layer) and
 * kv_probe_memory (a timed memcpy). Not thread-safe: callers lock.
 */

/* A tier's read figures. */
typedef struct kv_tier_perf {
  double read_bps;  /* sequential read bandwidth, bytes per second (> 0) */
  double latency_s; /* one small read at queue depth 1, seconds (>= 0) */
} kv_tier_perf;

/* Exponentially weighted least squares of seconds = latency + bytes / bandwidth. */
typedef struct kv_perf_fit {
  double w, sb, st, sbb, sbt; /* decayed sums: weight, bytes, seconds, bytes^2, bytes*seconds */
  uint64_t n;                 /* observations so far */
} kv_perf_fit;

/* Weight kept per observation (about the last 64 reads dominate). */
#define KV_PERF_DECAY (63.0 / 64.0)

/* Probe sizes: the file written and read back, and the small reads timed for latency. */
#define KV_PROBE_BYTES (32u << 20)
#define KV_PROBE_SMALL_READS 64u

/*
 * kv_probe_dir() - measure the directory `dir`: write a probe file of `bytes` (a multiple of
 * 1 MiB, >= 4 MiB) there, sync it and drop it from the page cache, then time
 * KV_PROBE_SMALL_READS random 4 KiB reads one at a time (latency: their median) and the whole
 * file in 1 MiB reads eight at a time (bandwidth); the file is removed whatever happens.
 * `direct` asks for O_DIRECT (the engine's own mode). Returns 0 or -errno.
 */
int kv_probe_dir(kv_io *io, const char *dir, int direct, uint64_t bytes, kv_tier_perf *out);

/* Memory bandwidth (a timed copy of `bytes`), for the DRAM tier; latency is a page copy. */
void kv_probe_memory(size_t bytes, kv_tier_perf *out);

/* Start a fit from known figures (the probe): they count as `weight` observations' worth. */
void kv_perf_fit_init(kv_perf_fit *f, const kv_tier_perf *prior, double weight);
/* One read of `bytes` that took `seconds` (ignored unless both are > 0 and finite). */
void kv_perf_observe(kv_perf_fit *f, uint64_t bytes, double seconds);
/* The current figures: the fitted line when the observed sizes spread enough to determine
 * it and it is plausible (positive slope, non-negative intercept), else the bandwidth through
 * the prior's latency. */
void kv_perf_estimate(const kv_perf_fit *f, const kv_tier_perf *prior, kv_tier_perf *out);

/* ---- the DRAM tier (dram.c) --------------------------------------------------------------
 *
 * The DRAM tier: a capacity-bounded, per-process, volatile cache of
 * block data regions, inclusive over the persistent tiers (every block here also has its
 * persistent copy). LRU eviction for now; the EvicPress policy replaces it later.
 *
 * Memory is one mapping of `capacity` bytes made at create time and reused for the life of
 * the tier (first touches of fresh pages are slow on these machines, so pages are recycled,
 * never returned). A block occupies a contiguous run of 4 KiB pages (first-fit over a page
 * bitmap; when no run is free, least recently used unpinned blocks are evicted).
 *
 * Thread-safe. A pinned entry is never evicted or freed; readers copy out of it without the
 * lock. Insertion copies outside the lock too (the entry is invisible until published).
 */

typedef struct kv_dram kv_dram;
typedef struct kv_dram_entry kv_dram_entry;

/* NULL when capacity < 4 KiB (no tier) or on allocation failure. */
kv_dram *kv_dram_create(uint64_t capacity);
void kv_dram_destroy(kv_dram *d);

/* Find and pin; NULL on a miss (counted). data and len receive the block's data region. */
kv_dram_entry *kv_dram_pin(kv_dram *d, const uint8_t hash[16], const uint8_t **data,
                           uint64_t *len);
void kv_dram_unpin(kv_dram *d, kv_dram_entry *e);
/* 1 when the block is present (a hint: it may be evicted right after); not counted as a hit
 * or a miss. */
int kv_dram_contains(kv_dram *d, const uint8_t hash[16]);

/* Copy `len` bytes in under `hash` (no-op if present). 0, or -1 when it cannot fit. */
int kv_dram_insert(kv_dram *d, const uint8_t hash[16], const uint8_t *data, uint64_t len);
/* Drop a block (after a delete or a move). Waits for nothing: a pinned entry is dropped when
 * unpinned. */
void kv_dram_remove(kv_dram *d, const uint8_t hash[16]);

typedef struct kv_dram_stats {
  uint64_t capacity, bytes, blocks, hits, misses;
} kv_dram_stats;
void kv_dram_stat(kv_dram *d, kv_dram_stats *out);

#endif
