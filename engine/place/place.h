/* SPDX-License-Identifier: MIT */
/*
 * engine/place/place.h — the place floor (LAYERS: above the operations, below the entry
 * points of engine/db): the placement's decisions. Moving a context to another (config, tier)
 * (relocate.c); placing contexts with the EvicPress policy of policy/ (placer.c);
 * quality reports and re-profiling (report.c). The state they read and the read/write paths
 * feed is one floor below the operations (engine/track/track.h).
 *
 * LOCKING: placements of one handle run one at a time (kv_place_run_lock); across handles and
 * processes they meet in LMDB's write lock and kv_relocate's checks (a context that changed
 * meanwhile is skipped).
 */
#ifndef KV_PLACE_H
#define KV_PLACE_H

#include "ops/ops.h"
#include "policy.h"

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

/* ---- placer.c ---- */

/* A put's part of the placement (placer.c "IN THE PUT'S TRANSACTION"): kv_place_put_hook
 * fills *h to join the put's transaction (returns 0, *h untouched, with placement off or a
 * read-only handle); the hook counts the put's access there and, when the context's place
 * needs no move but its DRAM flag, records that too (placed = 1). */
typedef struct kv_place_put {
  int touched;                      /* the put's access is counted in its commit */
  int placed;                       /* its placement committed with it */
  int locked, bump;                 /* (placer.c's: the run lock held, place_gen bumped) */
  uint64_t txnid, gen_from;
  uint64_t add[KVDB_TIER_COUNT];
  uint8_t *blocks;                  /* a context admitted to DRAM: its block hashes */
  uint32_t n_blocks;
  kvdb_place_move *moves;           /* re-encodings of contexts it took out of DRAM, made by
                                       kv_place_after_put (which frees them) */
  size_t n_moves;
} kv_place_put;
int kv_place_put_hook(kvdb *db, kv_place_put *st, kv_put_hook *h);

/* Right after a put of context `key` is durable, with placement on: unless the put's own
 * transaction placed it (st->placed: then only the re-encodings it asked for, st->moves), count
 * the access (unless st->touched) and place it (the default rule from the catalog's state) and
 * carry out the moves. st may be NULL (a put
 * without the hook). Failures are logged (the put stands). */
void kv_place_after_put(kvdb *db, const uint8_t key[16], kv_place_put *st);

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
kvdb_status kv_place_drift(kvdb *db, kv_txn *txn, const kv_ctx_rec *cr, kv_profile_rec *p,
                           int *drifted);
/* After a get served context `key`, with placement on (KVDB_PLACEMENT_EVICPRESS, the default
 * rule): promotion on a hit. When the context is not in the DRAM tier and its utility gain from
 * being cached there per DRAM byte beats the promotion threshold (placer.c PROMOTION), it is
 * placed again as an incoming context: cached when that fits beside the other contexts, else
 * by the greedy over every context. Failures are logged (the get stands). */
void kv_place_after_get(kvdb *db, const uint8_t key[16]);

/* ---- prior.c (PROFILE SAMPLING) ---- */

/* The group of a put (prior.c GROUPS): the model hash, the profile space (NULL: the default),
 * the sampled heads (0: the default), whether SnapKV queries / probe queries were given, and
 * the context's length. */
uint64_t kv_place_prior_key(const uint8_t model_hash[16], const char *space, uint32_t heads,
                            int have_q, int have_pq, uint64_t n_tokens);
/* Before a put with placement on whose profile the placement asked for (not the caller): 1
 * when *out holds the profile predicted for its group (placement_profile SAMPLED and the group
 * agrees: every entry's n_probes 0); 0 when the put is to measure it (then
 * kv_place_prior_note). */
int kv_place_prior_predict(kvdb *db, uint64_t key, uint64_t n_tokens, kv_profile_rec *out);
/* A profile measured at a put of `n_tokens` tokens, into its group's ring. */
void kv_place_prior_note(kvdb *db, uint64_t key, uint64_t n_tokens, const kv_profile_rec *p);

/* Place one context again (it takes its best place; over-full tiers are resolved), with
 * placement on; failures are logged. */
void kv_place_context(kvdb *db, const uint8_t key[16]);

#endif
