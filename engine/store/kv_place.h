/* SPDX-License-Identifier: MIT */
/*
 * engine/store/kv_place.h — the placement side of the engine: the SmartSSD tier's directory,
 * the tiers' read figures, access counts, the DRAM tier's admission set (place.c); moving a
 * context to another (config, tier) (relocate.c); placing contexts with the EvicPress policy
 * of engine/policy (placer.c).
 *
 * LOCKING: the placement state (db->place) has its own mutex for the figures and the DRAM
 * admission set, never held across I/O or a transaction; placements of one handle run one at
 * a time (run_mu), across handles and processes they meet in LMDB's write lock and
 * kv_relocate's checks (a context that changed meanwhile is skipped).
 */
#ifndef KV_PLACE_H
#define KV_PLACE_H

#include "kv_cblock.h"
#include "kv_db.h"
#include "policy.h"
#include "tiers/perf.h"

/* ---- place.c ---- */

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
kvdb_status kv_place_settings(kvdb *db, MDB_txn *txn, kv_place_set *out);
/* The read figures a placement with `set` uses: the handle's (probe + online fit) when it has
 * placement on, else measured now (DRAM) and cached or probed (persistent tiers). */
kvdb_status kv_place_figures(kvdb *db, const kv_place_set *set,
                             kv_tier_perf out[KVDB_TIER_COUNT]);
/* With placement on, in a write transaction: add the blocks this handle served from each tier
 * since the last call to the catalog's counters (meta "stat.blocks"). */
kvdb_status kv_place_flush_stats(kvdb *db, MDB_txn *txn);
/* The catalog's counters of blocks served per tier (zeros when none). */
void kv_place_served(kvdb *db, MDB_txn *txn, uint64_t out[KVDB_TIER_COUNT]);

/* kvdb_options_init's placement defaults, and kvdb_open's checks of the fields. */
void kv_place_options_init(kvdb_options *o);
kvdb_status kv_place_options_check(const kvdb_options *o);

/* At open, after the catalog and before recovery: the SmartSSD tier's directory (recorded in
 * the catalog, or the option, or DIR/smartssd; a record another process writes later is
 * adopted by kv_smart_dir), created when the tier is configured and the handle writes; with placement on, the placement state (tier figures probed or loaded, the
 * DRAM admission set). KVDB_INVALID when the option names another directory than the recorded
 * one. */
kvdb_status kv_place_open(kvdb *db);
/* At close: what kv_place_open made. Safe on a handle it never ran on. */
void kv_place_close(kvdb *db);

/* In the write transaction that creates a SmartSSD segment: the recorded directory (which the
 * handle adopts), else the handle's own, recorded now (KVDB_INVALID when it has none, or when
 * its explicit smartssd_dir differs from the record); the directory exists; format 3. */
kvdb_status kv_place_smart_dir_ready(kvdb *db, MDB_txn *txn);

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
void kv_place_refresh(kvdb *db, MDB_txn *txn);
/* Build the admission set as of the catalog now (a new transaction), dropping from DRAM what
 * leaves it. */
kvdb_status kv_place_reload(kvdb *db);

/* One access of context `key` at `ms`, in the write transaction that flushes access times
 * (placement off: nothing). */
kvdb_status kv_place_touch(kvdb *db, MDB_txn *txn, const uint8_t key[16], uint64_t ms);

/* A put's options with placement on: the profile is measured (KVDB_PUT_PROFILE) over the
 * placement's space unless the caller names one. */
void kv_place_put_opts(kvdb *db, kvdb_put_opts *o);

/* Frequency and cached flag of a context for kvdb_context_info (0 when none is kept). */
void kv_place_info(kvdb *db, MDB_txn *txn, const uint8_t key[16], uint64_t last_access_ms,
                   double *frequency, uint32_t *cached);

/* ---- relocate.c ---- */

/* Keep the config (kv_relocate's `to` NULL) / keep the tier (`tier`). */
#define KV_TIER_KEEP UINT32_MAX

/*
 * kv_relocate() - move context `ctx` to `tier` (or KV_TIER_KEEP: each block stays on its tier)
 * stored with config `to` (NULL: keep it), in one catalog transaction (kvdb_relocate's and
 * kvdb_recompress's contract). `q`: queries for SnapKV (NULL when there are none).
 * `smart_ok`: the SmartSSD tier may take it (kvdb_relocate: the handle's smartssd_bytes > 0;
 * a placement: its settings have the tier); its directory must be known either way.
 */
kvdb_status kv_relocate(kvdb *db, const kvdb_model *m, const uint8_t ctx[16],
                        const kvdb_config *to, uint32_t tier, const kv_queries *q, int smart_ok);

/* placer.c's share of the state: its lock (one placement at a time in a handle), the
 * generation bump that tells every handle to reload its DRAM admission set, and its view of
 * the tiers between puts (placer.c "BETWEEN PUTS"): kv_place_view_of, under the run lock;
 * kv_place_view_drop (any thread, no lock) makes the next placement rebuild it, for a change
 * of the tiers' contents that this handle made outside the placement (kvdb_relocate, ...). */
typedef struct kv_place_view {
  int valid;
  uint64_t used[KVDB_TIER_COUNT]; /* the policy's bytes on each kvdb tier */
  uint64_t txnid;                 /* catalog txn id the view is right as of */
} kv_place_view;
pthread_mutex_t *kv_place_run_lock(kvdb *db);
kvdb_status kv_place_bump_gen(kvdb *db, MDB_txn *txn);
kv_place_view *kv_place_view_of(kvdb *db);
void kv_place_view_drop(kvdb *db);

/* ---- placer.c ---- */

/* Right after a put of context `key` is durable, with placement on: count the access, then
 * place it (Algorithm 1 from the catalog's state) and carry out the moves. Failures are logged
 * (the put stands). */
void kv_place_after_put(kvdb *db, const uint8_t key[16]);

/* Before a put with placement on, from the context's measured profile alone: when its best
 * place is the SSD tier (cached in DRAM or not), *cfg becomes the config the placement will
 * choose there, so that the put writes it once (kv_place_after_put then finds it placed; when
 * other contexts make it place the context elsewhere, it moves it as before). *cfg is left as
 * it is otherwise (a SmartSSD place: the put writes to the SSD first). */
kvdb_status kv_place_put_config(kvdb *db, const kvdb_model *m, uint32_t block_tokens,
                                const uint8_t model_hash[16], uint64_t n_tokens,
                                const kv_profile_rec *prof, kvdb_config *cfg);

/* Re-profiling (EvicPress §4.3), in kvdb_report_quality's write transaction with the context's
 * record `cr` and its profile `p` (the report already averaged in): when placement is on and
 * the stored config's reported quality has drifted below its profiled quality by more than
 * reprofile_drift_pct, re-scale the other entries (kvdb.h, kvdb_report_quality) and require
 * format 3; *drifted = 1 when it did (the caller then calls kv_place_context after the
 * commit). */
kvdb_status kv_place_drift(kvdb *db, MDB_txn *txn, const kv_ctx_rec *cr, kv_profile_rec *p,
                           int *drifted);
/* Place one context again (it takes its best place; over-full tiers are resolved), with
 * placement on; failures are logged. */
void kv_place_context(kvdb *db, const uint8_t key[16]);

#endif
