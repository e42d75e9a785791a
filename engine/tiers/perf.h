/* SPDX-License-Identifier: MIT */
/*
 * engine/tiers/perf.h — how fast each tier reads: a short probe when a database is opened, and
 * an online fit from the reads the engine really does.
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
#ifndef KV_PERF_H
#define KV_PERF_H

#include <stddef.h>
#include <stdint.h>

#include "io/io.h"

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

#endif
