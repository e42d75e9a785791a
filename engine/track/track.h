/* SPDX-License-Identifier: MIT */
/*
 * engine/track/track.h — the track floor (LAYERS: above segments, below the operations): the
 * placement state that the read and write paths feed and the placement reads (track.c): the
 * settings, the tiers' read figures, blocks served per tier, the DRAM tier's admission set, the
 * tier of a context, the state placer.c keeps between placements; and the access times of
 * contexts (atime.c). The placement's decisions are in engine/place (place.h).
 *
 * LOCKING: the placement state (db->place) has its own mutex for the figures and the DRAM
 * admission set, never held across I/O or a transaction; placements of one handle run one at
 * a time (run_mu).
 */
#ifndef KV_TRACK_H
#define KV_TRACK_H

#include <string.h>

#include "seg/seg.h"
#include "tiers/tiers.h"

/* ---- track.c ---- */

/* The settings a placement runs with: the handle's options when it has placement on, else
 * the ones recorded in the catalog (meta "placement") by the last read-write open with
 * placement on. */
typedef struct kv_place_set {
  kvdb_placement rule;
  double alpha, half_life_s, prefill_tps;
  uint64_t dram_bytes;     /* 0: no DRAM tier in the placement */
  uint64_t ssd_bytes;      /* 0: unlimited */
  uint64_t smartssd_bytes; /* 0: no SmartSSD tier */
} kv_place_set;

/* The catalog records of this module (FORMAT.md §2), for the fuzz target too: meta
 * "placement" (the settings serving handles record) and "perf.<tier>" (cached probe figures).
 * The decoders return KVDB_CORRUPT, with a message, for a record they refuse. */
#define KV_PLACE_SET_BYTES 56
#define KV_PLACE_PERF_BYTES 32
void kv_place_set_encode(const kv_place_set *s, uint8_t b[KV_PLACE_SET_BYTES]);
kvdb_status kv_place_set_decode(const uint8_t b[KV_PLACE_SET_BYTES], kv_place_set *s);
void kv_place_perf_encode(uint64_t dev, const kv_tier_perf *f, uint64_t ms,
                          uint8_t b[KV_PLACE_PERF_BYTES]);
kvdb_status kv_place_perf_decode(const uint8_t b[KV_PLACE_PERF_BYTES], uint64_t *dev,
                                 kv_tier_perf *f, uint64_t *ms);

/* KVDB_INVALID when the handle has placement off and the catalog has no recorded settings. */
kvdb_status kv_place_settings(kvdb *db, kv_txn *txn, kv_place_set *out);
/* The read figures a placement with `set` uses: the handle's (probe + online fit) when it has
 * placement on, else measured now (DRAM) and cached or probed (persistent tiers). */
kvdb_status kv_place_figures(kvdb *db, const kv_place_set *set,
                             kv_tier_perf out[KVDB_TIER_COUNT]);
/* With placement on, in a write transaction: add the blocks this handle served from each tier
 * since the last call to the catalog's counters (meta "stat.blocks"). */
kvdb_status kv_place_flush_stats(kvdb *db, kv_txn *txn);
/* The catalog's counters of blocks served per tier (zeros when none). */
void kv_place_served(kvdb *db, kv_txn *txn, uint64_t out[KVDB_TIER_COUNT]);

/* kvdb_options_init's placement defaults, and kvdb_open's checks of the fields. */
void kv_place_options_init(kvdb_options *o);
kvdb_status kv_place_options_check(const kvdb_options *o);

/* At open, after the catalog and before recovery: the SmartSSD tier's directory
 * (kv_smart_dir_open, seg/smartdir.c) and, with placement on, the placement state (tier
 * figures probed or loaded, the DRAM admission set). */
kvdb_status kv_place_open(kvdb *db);
/* At close: what kv_place_open made. Safe on a handle it never ran on. */
void kv_place_close(kvdb *db);

/* The read figures of each kvdb tier now (read_bps 0: no such tier). */
void kv_place_perf(kvdb *db, kv_tier_perf out[KVDB_TIER_COUNT]);
/* A monotonic clock for kv_place_observe. */
uint64_t kv_place_now_ns(void);
/* A cold read of `bytes` from `tier` took `ns` (placement off: nothing). */
void kv_place_observe(kvdb *db, uint32_t tier, uint64_t bytes, uint64_t ns);

/* Whether a get may copy this block into the DRAM tier: always with placement off; with it on,
 * when the placement keeps a context holding the block in DRAM. */
int kv_place_dram_admits(kvdb *db, const uint8_t hash[16]);
/* In a read transaction of a get: when a placement committed since (meta "place_gen"), reload
 * the DRAM admission set and drop from DRAM the blocks no longer admitted. */
void kv_place_refresh(kvdb *db, kv_txn *txn);
/* Build the admission set as of the catalog now (a new transaction), dropping from DRAM what
 * leaves it. */
kvdb_status kv_place_reload(kvdb *db);
/* A context admitted to the DRAM tier by a commit that took place_gen from gen_from to gen_to
 * and changed no other admission: its n blocks join the set when the set is the one of
 * gen_from (returns 1); else returns 0 (the caller reloads). */
int kv_place_want_extend(kvdb *db, const uint8_t *blocks, uint32_t n, uint64_t gen_from,
                         uint64_t gen_to);
/* The same for a commit that admitted the n_add blocks `add` (one context, or none) and took
 * the contexts holding the n_del blocks `del` out of DRAM (a block another admitted context
 * still holds stays; one that leaves is dropped from the DRAM tier). */
int kv_place_want_change(kvdb *db, const uint8_t *add, uint32_t n_add, const uint8_t *del,
                         size_t n_del, uint64_t gen_from, uint64_t gen_to);

/* One access of context `key` at `ms`, in the write transaction that flushes access times
 * (placement off: nothing). */
kvdb_status kv_place_touch(kvdb *db, kv_txn *txn, const uint8_t key[16], uint64_t ms);

/* A put's options with placement on: the profile is measured (KVDB_PUT_PROFILE) over the
 * placement's space unless the caller names one. */
void kv_place_put_opts(kvdb *db, kvdb_put_opts *o);

/* Frequency and cached flag of a context for kvdb_context_info (0 when none is kept). */
void kv_place_info(kvdb *db, kv_txn *txn, const uint8_t key[16], uint64_t last_access_ms,
                   double *frequency, uint32_t *cached);

/* The tier of a context's persistent copy: that of its last block (SSD when unreadable). */
uint32_t kv_ctx_tier(kvdb *db, kv_txn *txn, const kv_ctx_rec *cr);

/* placer.c's share of the state: its lock (one placement at a time in a handle), the
 * generation bump that tells every handle to reload its DRAM admission set, and its view of
 * the tiers between puts (placer.c "BETWEEN PUTS"): kv_place_view_of, under the run lock;
 * kv_place_view_drop (any thread, no lock) makes the next placement rebuild it, for a change
 * of the tiers' contents that this handle made outside the placement (kvdb_relocate, ...). */
typedef struct kv_place_view {
  int valid;
  uint64_t used[KVDB_TIER_COUNT]; /* the policy's bytes on each kvdb tier */
  uint64_t txnid;                 /* catalog txn id the view is right as of */
  double promote_per_byte;        /* promotion on a hit (placer.c PROMOTION): the least utility
                                     gain per DRAM byte among the contexts the last run over
                                     every context cached; 0 when none was */
  void *inc;                      /* placer.c's incremental admission state (INCREMENTAL
                                     ADMISSION), valid only while the view is; freed at close
                                     with inc_free */
  void (*inc_free)(void *);
} kv_place_view;
pthread_mutex_t *kv_place_run_lock(kvdb *db);
/* kv_place_bump_gen: *gen_from (NULL: not asked) receives the generation it bumped from. */
kvdb_status kv_place_bump_gen(kvdb *db, kv_txn *txn, uint64_t *gen_from);
kv_place_view *kv_place_view_of(kvdb *db);
void kv_place_view_drop(kvdb *db);
/* The profiles' model prior of place/prior.c (PROFILE SAMPLING): its state, under its own
 * lock (a put's profile is decided before the put, outside the placement's run lock); freed at
 * close with state_free. */
typedef struct kv_place_prior_slot {
  pthread_mutex_t mu;
  void *state;
  void (*state_free)(void *);
} kv_place_prior_slot;
kv_place_prior_slot *kv_place_prior_of(kvdb *db);

/* ---- access times of contexts (atime.c) ---- */

/* The key of a context's entry in the catalog's access-time table: ms big-endian, the key. */
static inline void kv_atime_key(uint8_t k[24], uint64_t ms, const uint8_t key[16])
{
  kv_be64(k, ms);
  memcpy(k + 8, key, 16);
}
/* Note one access of context `key` now (kept in the handle until kv_flush_atime). */
void kv_note_access(kvdb *db, const uint8_t key[16]);
/* How many accesses of context `key` are noted and not yet written (placement's promotion on a
 * hit counts them: a read-only workload writes none). */
size_t kv_pending_accesses(kvdb *db, const uint8_t key[16]);
/* In a write transaction: write the noted access times to the contexts' records (and, with
 * placement on, kv_place_touch). */
kvdb_status kv_flush_atime(kvdb *db, kv_txn *txn);

#endif
