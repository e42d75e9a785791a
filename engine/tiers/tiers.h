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
/* The tier's memory: one mapping that holds every block's data region (kvdb_dram_memory). */
void kv_dram_region(const kv_dram *d, void **base, size_t *bytes);

/* Find and pin; NULL on a miss (counted). data and len receive the block's data region. */
kv_dram_entry *kv_dram_pin(kv_dram *d, const uint8_t hash[16], const uint8_t **data,
                           uint64_t *len);
void kv_dram_unpin(kv_dram *d, kv_dram_entry *e);
/* 1 when the block is present (a hint: it may be evicted right after); not counted as a hit
 * or a miss. */
int kv_dram_contains(kv_dram *d, const uint8_t hash[16]);

/* Copy `len` bytes in under `hash` (no-op if present). 0, or -1 when it cannot fit. */
int kv_dram_insert(kv_dram *d, const uint8_t hash[16], const uint8_t *data, uint64_t len);
/* The same for a prefetch: the block is STAGED (a present one becomes staged) until its next
 * pin, and eviction takes staged blocks only when no other unpinned block is left (least
 * recently used first either way), so what a prefetch staged waits for its read. */
int kv_dram_stage(kv_dram *d, const uint8_t hash[16], const uint8_t *data, uint64_t len);
/* 1 when the block is present, which then becomes staged as kv_dram_stage makes it (not
 * counted as a hit or a miss). */
int kv_dram_keep(kv_dram *d, const uint8_t hash[16]);
/* Drop a block (after a delete or a move). Waits for nothing: a pinned entry is dropped when
 * unpinned. */
void kv_dram_remove(kv_dram *d, const uint8_t hash[16]);

typedef struct kv_dram_stats {
  uint64_t capacity, bytes, blocks, hits, misses;
} kv_dram_stats;
void kv_dram_stat(kv_dram *d, kv_dram_stats *out);

/* ---- prefetch admission (admit.c) --------------------------------------------------------
 *
 * The bandwidth a background prefetch may take from a tier (TierKV, seed 003 §3.4): a token
 * bucket whose refill rate follows the measured foreground load. The tier's capacity is the
 * larger of the caller's ceiling and what reads were measured to reach (both EWMAs of bytes
 * per second over windows of at least KV_ADMIT_WINDOW_NS); the prefetch's rate is the share
 * below the high-water mark the foreground leaves:
 *
 *     rate = clamp(high_water * capacity - foreground_bps, floor * capacity, ceiling)
 *
 * so a foreground that reads at the tier's full speed leaves the prefetch its floor, and an
 * idle one leaves it the high-water share. The bucket holds at most `burst` bytes; a take
 * larger than the burst waits for a full bucket and leaves a debt that the next take waits
 * out, so the long-run rate holds whatever the sizes. Pure arithmetic on the
 * caller's clock (nanoseconds), no lock: the caller serializes.
 */
#define KV_ADMIT_WINDOW_NS 10000000ull /* 10 ms */
#define KV_ADMIT_HIGH_WATER 0.8        /* TierKV's default high-water mark */
#define KV_ADMIT_FLOOR 0.05            /* the share a saturated foreground still leaves */

typedef struct kv_bucket {
  double ceiling_bps;  /* the most the prefetch may take; 0 = no ceiling but the capacity's */
  double capacity_bps; /* the tier's bandwidth as measured (EWMA of the fastest windows) */
  double fg_bps;       /* foreground read bytes per second (EWMA) */
  double rate_bps;     /* the refill rate now */
  double burst, tokens;
  uint64_t last_ns;                 /* last refill */
  uint64_t win_ns, win_fg, win_all; /* the open measurement window: start, bytes at start */
  int started;                      /* a first observation set the window's origin */
} kv_bucket;

/* A bucket for a tier believed to read `capacity_bps` (> 0; the first guess, refined by
 * kv_bucket_observe), at most `ceiling_bps` for the prefetch (0: none), burst bytes (> 0). */
void kv_bucket_init(kv_bucket *b, double capacity_bps, double ceiling_bps, double burst,
                    uint64_t now_ns);
/* The read counters now: fg_total the foreground's bytes so far, all_total every read's
 * (foreground and prefetch); closes a window once KV_ADMIT_WINDOW_NS has passed and moves the
 * rate. */
void kv_bucket_observe(kv_bucket *b, uint64_t fg_total, uint64_t all_total, uint64_t now_ns);
/* Nanoseconds to wait before `bytes` may be read; 0 = taken now (the tokens are spent). */
uint64_t kv_bucket_take(kv_bucket *b, uint64_t bytes, uint64_t now_ns);

#endif
