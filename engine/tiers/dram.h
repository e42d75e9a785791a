/* SPDX-License-Identifier: MIT */
/*
 * engine/tiers/dram.h — the DRAM tier: a capacity-bounded, per-process, volatile cache of
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
#ifndef KV_DRAM_H
#define KV_DRAM_H

#include <stdint.h>

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
