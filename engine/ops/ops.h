/* SPDX-License-Identifier: MIT */
/*
 * engine/ops/ops.h — the operations floor (LAYERS: above the placement state of engine/track,
 * below the placement's decisions of engine/place), for the floors above. The public entry
 * points of the operations (put.c, get.c, context.c, fetch.c, score_ctx.c, delete.c, maint.c,
 * verify.c, profile.c) are declared in kvdb.h; this header has what engine/place and
 * engine/db compose them with: the write step of a put, deletes inside a transaction, model
 * and context records, and the quality profile of a context (profile.c: for each config of a
 * space, the context's size in it and the attention-output fidelity of its decoded KV).
 * ops_int.h is for the operations' own files.
 */
#ifndef KV_OPS_H
#define KV_OPS_H

#include "track/track.h"

/* ---- get.c ---- */

/* kvdb_get_lend's read (on_lend NULL: kvdb_get_notify's; both NULL: kvdb_get's); *served = 1
 * and hit_ctx = the context whose last block was the last block delivered, when there is one
 * (the context the get counted an access of). kvdb_get_lend (db.c) calls it, then the
 * placement's promotion on a hit. */
kvdb_status kv_get(kvdb *db, const kvdb_model *m, const uint32_t *tokens, size_t n,
                   const kvdb_kv_view *out, size_t *hit_tokens, kvdb_block_fn on_block,
                   kvdb_lend_fn on_lend, void *ctx, uint8_t hit_ctx[16], int *served);

/* ---- calibrate.c ---- */

/* The bits of a config that a model's calibration applies to (int4: 4, int2: 2; kvquant), else
 * 0. */
int kv_calib_bits_of(const kvdb_config *c);
/* The stored calibration of model m into out when config c uses one (kv_calib_bits_of; c NULL:
 * whatever config, for quality profiles) and m has one of its geometry; else out zeroed
 * (out->weight NULL). KVDB_CORRUPT: a damaged calibration (the writer then writes nothing).
 * kv_calib_free() out. */
/* The output gains stored with model m (engine/ops/gains.c): out zeroed when it has none or is
 * new; KVDB_CORRUPT (damaged: profiles fail until they are set again). kv_model_gains_free. */
kvdb_status kv_model_gains_load(kvdb *db, const kvdb_model *m, kv_model_gains *out);
kvdb_status kv_model_calib_load(kvdb *db, const kvdb_model *m, const kvdb_config *c,
                                kv_calib *out);
/* The bits per element a put of m stores beyond its coded sections, over blocks of bt tokens
 * cut from contexts of nt[0..n) tokens whose sections take `bits` per element: each object's
 * header, token ids, section table, checksums and alignment (FORMAT.md §3; the layout put.c
 * chooses: packed when the model keeps no score copies and the object is at most
 * options.packed_block_bytes, else whole pages; score copies are not counted).
 * kvdb_model_calibrate gives a plan's sections its budget less this, so that what a put of a
 * context shaped like the calibration contexts stores stays within the budget. */
double kv_calib_block_reserve(const kvdb *db, const kvdb_model *m, uint32_t bt,
                              const uint32_t *nt, size_t n, double bits);

/* ---- put.c ---- */

/* kvdb_put's and kvdb_put_block's checks of the handle, the model and the view (and that the
 * handle writes); *block_tokens receives the model's. */
kvdb_status kv_put_checks(kvdb *db, const kvdb_model *m, uint32_t *block_tokens,
                          const kvdb_kv_view *kv);
/* The options of a put as this build's struct (fields past the caller's struct_size keep their
 * defaults); KVDB_INVALID when struct_size is not one kvdb_put_opts_init set. */
kvdb_status kv_put_opts_copy(const kvdb_put_opts *in, kvdb_put_opts *o);
/*
 * A floor above joining a put's catalog transaction (kvdb_put_ex: the placement's records of
 * the put commit with it, placer.c "IN THE PUT'S TRANSACTION"). When the put writes a context
 * record, in_txn runs in its write transaction after every record of the put, before the
 * commit; an error from it aborts the put (it writes records: their failures are the put's).
 * done runs after the commit with its result, whenever in_txn ran (also when in_txn failed).
 * A put that finds its context stored already (no transaction of its own) runs neither.
 */
typedef struct kv_put_hook {
  kvdb_status (*in_txn)(kvdb *db, kv_txn *txn, const uint8_t ctx[16], void *arg);
  void (*done)(kvdb *db, kvdb_status commit_rc, void *arg);
  void *arg;
} kv_put_hook;
/*
 * kv_put_context() - the write step of kvdb_put_ex, its arguments checked: the chain hashes of
 * the n tokens (model fingerprint mh, block_tokens bt), every new block encoded with `cfg`,
 * written, synced and published in one catalog transaction (its durability order: put.c),
 * `profile` (NULL: none) recorded with the context, `hook` (NULL: none) joining its
 * transaction. ctx receives the context's key (also when every block was there already).
 * KVDB_INVALID when cfg cannot store a block.
 */
kvdb_status kv_put_context(kvdb *db, const kvdb_model *m, uint32_t bt, const uint8_t mh[16],
                           const uint32_t *tokens, size_t n, const kvdb_kv_view *kv,
                           const kvdb_config *cfg, const kv_queries *q, kv_profile_rec *profile,
                           const kv_put_hook *hook, kvdb_put_info *info, uint8_t ctx[16]);
/* The config fields and flags of a block record stored with c. */
void kv_block_rec_set_config(kv_block_rec *br, const kvdb_config *c);
/* A DROP config: br (n_tokens set) records its kept tokens as a block starting at token t0 of
 * its context (KV_BLK_KEPTN, kv_drop_keep_span(): the context keeps its ratio exactly, as
 * kv_cblock_src.keep_t0 made the encoder choose); other configs: nothing. */
void kv_block_rec_set_kept(kv_block_rec *br, const kvdb_config *c, uint64_t t0);

/* ---- rtier.c: the remote tier (kvdb_options.remote_addr) ---- */

/* At open: the remote tier when the options name one (its write-through thread when the
 * handle writes and remote_queue_blocks > 0); KVDB_INVALID names a bad remote option. Nothing
 * is connected here. */
kvdb_status kv_rtier_open(kvdb *db);
/* Write-back on demotion (kvdb_options.remote_write & KVDB_REMOTE_WRITE_EVICT): the blocks of
 * stored context `key`, which the placement is about to delete, are read back and SET now (in
 * round trips of 16 blocks, each bounded by the timeout). No-op without that bit. Never fails:
 * what is not sent is counted as dropped. */
void kv_rtier_note_evict(kvdb *db, const uint8_t key[16]);
/* The placement's remote tier (engine/place): context `key`'s blocks written to it now, read
 * back from the local store and verified, in round trips of 16 (each bounded by
 * remote_timeout_ms); *n_blocks its blocks, *written those Redis took. -1 without a remote tier
 * this handle writes. */
int kv_rtier_write_ctx(kvdb *db, const uint8_t key[16], uint32_t *n_blocks, uint32_t *written);
/* The remote tier's read figures for the placement's model, measured against the live server
 * (a 4 MiB value SET, read back whole three times: bandwidth from the fastest; five 1-byte
 * GETRANGEs: latency, the median; then deleted), again once they are 30 s old (5 s after a
 * failed probe). 0, or -1 without a remote tier or when the server did not answer the last
 * probe (the placement then leaves the tier out). */
int kv_rtier_figures(kvdb *db, kv_tier_perf *out);
/* At close: the queued blocks are sent (each round trip bounded by the timeout), then freed. */
void kv_rtier_close(kvdb *db);

/* ---- delete.c ---- */

/* One block of `bytes` less in segment seg (live bytes and blocks). */
kvdb_status kv_seg_unref(kvdb *db, kv_txn *txn, uint64_t seg, uint64_t bytes);
/* Remove a context in a write transaction; *freed receives the bytes of blocks freed. */
kvdb_status kv_delete_ctx_txn(kvdb *db, kv_txn *txn, const uint8_t key[16], uint64_t *freed);

/* ---- base.c ---- */

/* Whether model m (fingerprint mh) is the one stored under its id: KVDB_OK; KVDB_NOTFOUND (no
 * model of that id is stored); KVDB_MISMATCH naming both shapes (another shape is stored under
 * that id: every call with the model fails so, not only put). */
kvdb_status kv_model_known(kvdb *db, kv_txn *txn, const kvdb_model *m, uint32_t bt,
                           const uint8_t mh[16]);
/* The record a model m (block size bt, fingerprint mh) is first stored with. */
void kv_model_rec_of(const kvdb_model *m, uint32_t bt, const uint8_t mh[16], kv_model_rec *mr);
/* Model m's stored record (*stored = 1), or the record it would be first stored with
 * (*stored = 0) when no model of its id is stored; KVDB_MISMATCH as kv_model_known. */
kvdb_status kv_model_rec_load(kvdb *db, kv_txn *txn, const kvdb_model *m, uint32_t bt,
                              const uint8_t mh[16], kv_model_rec *mr, int *stored);
/* The model record whose hash is `mh` (for listing); KVDB_NOTFOUND when none. */
kvdb_status kv_model_by_hash(kvdb *db, kv_txn *txn, const uint8_t mh[16], char id[64],
                             kv_model_rec *rec);
/* The context record `key` when it belongs to model m (model_hash = its h_{-1}): else
 * KVDB_NOTFOUND or KVDB_MISMATCH with a message naming the context. */
kvdb_status kv_ctx_of_model(kvdb *db, kv_txn *txn, const uint8_t key[16],
                            const uint8_t model_hash[16], const kvdb_model *m, kv_ctx_rec *out);

/* ---- prefetch.c ---- */

/* Stop the prefetch worker (cancel what is queued, end the running request at its next read,
 * join) and free its state (kvdb_close, first). */
void kv_prefetch_close(kvdb *db);

/* ---- score_ctx.c ---- */

/* Close the near-data devices kvdb_score keeps in the handle (kvdb_close). */
void kv_score_close(kvdb *db);

/* ---- profile.c ---- */

#define KV_PROFILE_HEADS_DEFAULT 16
#define KV_PROFILE_MAX_CONFIGS 64

/* The configs of a space string (names separated by commas; NULL or "" = the default space,
 * with the snapkv configs only when queries exist). KVDB_INVALID names a bad name. */
kvdb_status kv_profile_space(const char *space, int have_queries, const kvdb_model *m,
                             kvdb_config *out, uint32_t cap, uint32_t *n);

/* What a profile is measured from: the whole context in the caller's layout (or decoded). */
typedef struct kv_profile_src {
  const kvdb_model *m;
  uint32_t block_tokens;
  const kvdb_kv_view *kv; /* n_tokens tokens */
  uint64_t n_tokens;
  const kv_queries *q;    /* SnapKV's window (never probes) */
  const kv_queries *pq;   /* probe queries at the positions pq_pos (NULL: the keys at
                             KV_QUALITY_SPREAD_PROBES spread positions) */
  const uint32_t *pq_pos;
  const char *space;      /* NULL: the default space */
  uint32_t heads;         /* sampled (layer, KV head) pairs; 0 = KV_PROFILE_HEADS_DEFAULT */
  const kvdb_config *not_below; /* NULL, or the config the KV already went through: configs
                                   that would need what it lost are recorded unmeasured */
  uint32_t packed_block_bytes;  /* the handle's kvdb_options.packed_block_bytes: raw bytes as a
                                   put writes them (packed objects, FORMAT.md §3e) */
  const kv_calib *calib;        /* the model's calibration (int4 / int2 measured as a put of a
                                   calibrated model codes them), or NULL */
  const kv_model_gains *gains;  /* the model's output gains: `quality` is then the
                                   output-weighted quality (codec.h), or NULL */
} kv_profile_src;

kvdb_status kv_profile_measure(const kv_profile_src *src, kv_profile_rec *out);

/* Record profile p for an existing context in its own transaction: its stored config and
 * exact bytes come from the catalog; reports of an earlier profile are kept. */
kvdb_status kv_profile_store(kvdb *db, const uint8_t key[16], kv_profile_rec *p);

/* The queries of put options, checked against the model (*out NULL when there are none). */
kvdb_status kv_opts_queries(const kvdb_put_opts *o, const kvdb_model *m, kv_queries *q,
                            const kv_queries **out);

/* The probe queries of put options, checked against the model and the context's n_tokens
 * (*out NULL when there are none; *pos their positions). */
kvdb_status kv_opts_probes(const kvdb_put_opts *o, const kvdb_model *m, uint64_t n_tokens,
                           kv_queries *q, const kv_queries **out, const uint32_t **pos);

/* Mark the entry of cfg as the stored config with exact bytes (adding it when missing). */
void kv_profile_mark_stored(kv_profile_rec *p, const kvdb_config *cfg, uint64_t bytes);

#endif
