/* SPDX-License-Identifier: MIT */
/*
 * engine/ops/ops_int.h — what the files of the operations floor share among themselves (the
 * floors above use ops.h): the snapshot-and-retry loop of the reads and what reads of a context
 * share (base.c), a segment's presence (verify.c), and the near-data device of kvdb_score
 * (score_ctx.c) and the row fetch (fetch.c).
 */
#ifndef KV_OPS_INT_H
#define KV_OPS_INT_H

#include "device.h"
#include "ops.h"

/* ---- base.c ---- */

/* A model id as the API takes it: 1..63 bytes (KVDB_INVALID with a message, else KVDB_OK). */
kvdb_status kv_model_id_check(const char *id);

/* The record of block `hash`, which context `key` lists: a block the catalog lacks is
 * KVDB_CORRUPT, and any failure's message names the context and the block. */
kvdb_status kv_ctx_block(kvdb *db, kv_txn *txn, const uint8_t key[16], const uint8_t hash[16],
                         kv_block_rec *out);
/* 1 when a compaction committed since a read snapshot that saw catalog generation `gen` (its
 * blocks may have moved: the read is worth doing again from a fresh snapshot). */
int kv_gen_moved(kvdb *db, uint64_t gen);

/*
 * The snapshot-and-retry loop of the reads. A compaction in any handle may move the blocks a
 * read found and remove their old segment file between its snapshot and its reads; the read
 * then fails or comes back short and is worth doing again from a fresh snapshot. Compactions
 * bump meta "gen"; a block that fails verification does not. A read:
 *
 *   kv_read_snap s = {0};
 *   do {
 *     KV_RET(kv_read_begin(db, &s));   // s.txn: a read transaction, the segment-file cache
 *     ... read through s.txn ...        // pruned to it, s.gen its catalog generation
 *     kv_txn_abort(s.txn);             // (the read may end the transaction earlier)
 *   } while (kv_read_again(db, &s, failed_or_short));
 *
 * kv_read_again: 1 when the try failed (or came back short), fewer than KV_READ_RETRIES
 * retries were made, and a compaction committed since the snapshot.
 */
#define KV_READ_RETRIES 3
typedef struct kv_read_snap {
  kv_txn *txn;
  uint64_t gen;
  int tries; /* retries made */
} kv_read_snap;
kvdb_status kv_read_begin(kvdb *db, kv_read_snap *s);
int kv_read_again(kvdb *db, kv_read_snap *s, int failed);

/* ---- get.c: the prefix walk (kvdb_get_kept in context.c) ---- */

/* One block of a prefix hit: its record (tokens point into the read transaction), hash, the
 * leading n_copy of its tokens that are part of the hit, at query position t0. */
typedef struct kv_hit {
  kv_block_rec rec;
  uint8_t hash[16];
  uint32_t n_copy;
  uint64_t t0;
} kv_hit;
typedef struct kv_walk {
  kv_hit *h; /* malloc'd: free(h) */
  size_t n, cap;
  size_t hit_tokens;
} kv_walk;
/* The stored blocks of the longest prefix of tokens[0..n) (as kvdb_lookup, local catalog only);
 * with_drops: blocks stored with dropped tokens count too, whole blocks only (a full block, or
 * a partial block whose tokens all start the query's rest). KVDB_MISMATCH as kvdb_lookup. */
kvdb_status kv_walk_prefix(kvdb *db, kv_txn *txn, const kvdb_model *m, uint32_t bt,
                           const uint32_t *tokens, size_t n, int with_drops, kv_walk *w);
/* Rows per (layer, KV head) hit x delivers: its keep count when tokens were dropped (the same
 * for every head: kv_drop_keep_count of the block), else n_copy. */
uint32_t kv_hit_kept(const kv_hit *x);

/* ---- rtier.c ---- */

/* Queue blocks a put wrote for write-through (waits at most remote_put_wait_ms for room; what
 * does not fit is counted as dropped). No-op without a remote tier. */
void kv_rtier_note_put(kvdb *db, const uint8_t root[16], const uint8_t (*hashes)[16], uint32_t n);
/* The remote continuation of a chain whose first `have` tokens hit locally: blocks from
 * have / bt on are asked for in one round trip and verified (out NULL: envelopes and tokens,
 * a lookup; else whole values, delivered into out). Returns the hit, at least `have`. */
size_t kv_rtier_extend(kvdb *db, const kvdb_model *m, uint32_t bt, const uint32_t *tokens,
                       size_t n, size_t have, const kvdb_kv_view *out);
/* One value alone, as the remote tier's write-through makes it and its get checks it (tests and
 * the fuzz target fuzz_rtier_value): kv_rtier_value_make reads stored block `hash` into a value
 * of namespace tag ns_tag (*val malloc'd; KVDB_NOTFOUND when it cannot be read);
 * kv_rtier_value_take checks value v (len bytes, untrusted) as block `hash` with parent `parent`
 * and tokens tok[0, n_tok) of model fingerprint mh, verifies its object and, when it passes,
 * copies its rows into out at token t0: 0, else -1 (out's rows [t0, t0 + n_tok) may then
 * hold anything). */
kvdb_status kv_rtier_value_make(kvdb *db, uint64_t ns_tag, const uint8_t hash[16],
                                uint8_t **val, size_t *len);
int kv_rtier_value_take(kvdb *db, const kvdb_model *m, uint32_t bt, uint64_t ns_tag,
                        const uint8_t *v, size_t len, const uint8_t mh[16],
                        const uint8_t parent[16], const uint8_t hash[16], const uint32_t *tok,
                        uint32_t n_tok, const kvdb_kv_view *out, uint64_t t0);

/* ---- get.c: the prefetch's read (prefetch.c) ---- */

typedef struct kv_prefetch_result {
  uint64_t staged_tokens; /* leading tokens whose blocks are in the DRAM tier */
  uint32_t blocks_read, blocks_present;
  uint64_t bytes_read;
  int stopped;            /* the gate ended it */
} kv_prefetch_result;
/* The longest stored prefix of tokens[0..n) into the DRAM tier (no view), in reads of at most
 * wave_bytes (whole layers), each first admitted by gate(gate_ctx, bytes) (nonzero: stop).
 * Returns as kvdb_get (KVDB_UNSUPPORTED without a DRAM tier); res always filled. */
kvdb_status kv_prefetch_fetch(kvdb *db, const kvdb_model *m, const uint32_t *tokens, size_t n,
                              uint64_t wave_bytes, int (*gate)(void *, uint64_t), void *gate_ctx,
                              kv_prefetch_result *res);

/* ---- verify.c ---- */

/* 1 when segment `id` has no record in the catalog as it is now: a compaction in some handle
 * moved its blocks and removed its file while the caller read an older snapshot. */
int kv_seg_gone_now(kvdb *db, uint64_t id);

/* ---- put.c ---- */

/* An append's write step (decode.c): the chain of tokens[0..n), whose blocks before kv_t0 (a
 * multiple of bt) are stored already, the rest written from `kv` (token 0 of kv is token kv_t0)
 * RAW with score copies, and in the same catalog transaction the record `replace` (the context
 * the append grew from) deleted. ctx receives the grown context's key. KVDB_BUSY when a block
 * before kv_t0 or `replace` is gone (deleted or replaced meanwhile). */
kvdb_status kv_put_append(kvdb *db, const kvdb_model *m, uint32_t bt, const uint8_t mh[16],
                          const uint32_t *tokens, size_t n, const kvdb_kv_view *kv, uint64_t kv_t0,
                          const uint8_t replace[16], kvdb_put_info *info, uint8_t ctx[16]);

/* The write step of a remote hit copied to the local store (rtier.c): the chain of
 * tokens[0..n) whose block i is objs[i] (an object verified as the remote get verifies it,
 * recs[i].bytes long, stored as it is with recs[i]'s bflags, method, bits, drop and
 * keep_permille) or, where objs[i] is NULL, a block stored already (KVDB_BUSY when it is
 * gone). The context record's config has the fields a block record keeps, from the last
 * object's. Nothing is written through to the remote tier. */
kvdb_status kv_put_objects(kvdb *db, const kvdb_model *m, uint32_t bt, const uint8_t mh[16],
                           const uint32_t *tokens, size_t n, const uint8_t *const *objs,
                           const kv_block_rec *recs, kvdb_put_info *info, uint8_t ctx[16]);

/* ---- score_ctx.c ---- */

/* Bytes of score copies kvdb_score reads from segment files before scoring them (a wave);
 * default 16 MiB. Tests lower it to make many waves; nothing else changes it. */
extern uint64_t kv_score_wave_bytes;
/* APP (HillInfer §4.3, Eq. 2-4) for a decode step: the host's share (permille) of the
 * device-tier blocks, from the rates this handle measured for `device` (f_c, f_s), the SmartSSD
 * tier's read bandwidth (B_c = B_s) and the selected fractions of each side's pool (alpha_c,
 * alpha_s: different values are §4.3's skewness correction); -1 before both rates are measured
 * (kvdb_score_batch then splits evenly, which measures them); 1000 for KVDB_SCORE_CPU. */
int32_t kv_score_app_permille(kvdb *db, kvdb_score_device device, double alpha_c,
                              double alpha_s);

/* ---- the near-data device, shared by scoring (score_ctx.c) and the row fetch (fetch.c) ---- */

/* Options as the caller gave them (struct_size honoured), defaults for the rest, checked:
 * KVDB_INVALID names the field. */
kvdb_status kv_score_opts_get(const kvdb_score_opts *opts, kvdb_score_opts *o);
/* A kvdb_status and message for a failed fpga/ call (`what` first). */
kvdb_status kv_score_fpga_fail(kv_fpga_status st, const kv_fpga_err *err, const char *what);
/* Open segment file `seg` for the device's own reads (O_DIRECT where the file system allows). */
kvdb_status kv_score_open_direct(kvdb *db, uint64_t seg, int *fd);
/* A device of the kind o asks for (o->device NEAR_DATA or EMULATED, o->xclbin_path): the
 * handle's kept one if free, else a new one; give it back with kv_score_dev_release. */
kvdb_status kv_score_dev_acquire(kvdb *db, const kvdb_score_opts *o, kv_fpga_dev **dev,
                                 int *slot, int *kept);
void kv_score_dev_release(kvdb *db, const kvdb_score_opts *o, kv_fpga_dev *dev, int slot,
                          int kept);


/* ---- fetch.c: a decode session's checksum tables ---- */

/* The page-group checksum tables a reader has read, per (block hash, section): a block's bytes
 * never change under its hash, so a table read once stays true for the session (a decode step
 * then reads only page groups: kvdb_decode's fetches). NULL *cc is an empty cache. */
typedef struct kv_ckcache kv_ckcache;
void kv_ckcache_free(kv_ckcache *cc);
/* kvdb_get_head_tokens, the host's reads taking checksum tables from *cc (created when NULL)
 * and adding the ones it reads. */
kvdb_status kv_get_head_tokens_cc(kvdb *db, const kvdb_model *m, const kvdb_key *context,
                                  uint32_t layer, uint32_t kv_head, const uint32_t *positions,
                                  size_t n_pos, void *k_out, void *v_out,
                                  const kvdb_score_opts *opts, kvdb_fetch_stats *stats,
                                  kv_ckcache **cc);
/* The same for several KV heads of one layer, their host reads in one batch (fetch.c). stats:
 * one per head. */
kvdb_status kv_get_heads_tokens_cc(kvdb *db, const kvdb_model *m, const kvdb_key *context,
                                   uint32_t layer, uint32_t n_heads, const uint32_t *heads,
                                   const uint32_t *const *positions, const size_t *n_pos,
                                   void *const *k_out, void *const *v_out,
                                   const kvdb_score_opts *opts, kvdb_fetch_stats *stats,
                                   kv_ckcache **cc);
#endif
