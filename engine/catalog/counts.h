/* SPDX-License-Identifier: MIT */
/*
 * engine/catalog/counts.h — counters kvdb_stat reads instead of scanning the catalog (meta
 * "counts", FORMAT.md §2): per tier, the contexts whose persistent copy is there (the tier of
 * their last block), and the segments' number, file bytes (committed ends) and live bytes and
 * blocks.
 *
 * MAINTAINED in the write transactions that change what they count: a context added (put) or
 * removed (kv_delete_ctx_txn) or whose last block changes tier (a relocation), and every
 * segment record written or deleted (kv_cat_put_seg, kv_cat_del_seg). So they are as durable
 * and crash-safe as the records they count.
 *
 * STAMP. The record holds the id of the last write transaction that kept them: every commit of
 * this build (kv_txn_commit) stamps them, after its changes. A write transaction sees them
 * current when the stamp is its own id or the one before (the last commit was one of this
 * build's); a read transaction, when the stamp is its snapshot's id. Anything else — a commit
 * by a build that does not know them (it ignores the record but changes what it counts), a
 * raw LMDB write — leaves them stale: changes are not applied to stale counters, readers
 * recount (kvdb_stat scans as before), and the next read-write open, or a kvdb_stat of a
 * read-write handle, rebuilds them.
 */
#ifndef KV_COUNTS_H
#define KV_COUNTS_H

#include "catalog.h"

enum {
  KV_CNT_CONTEXTS,    /* contexts whose last block is on the tier */
  KV_CNT_SEGMENTS,    /* segment records of the tier */
  KV_CNT_SEG_BYTES,   /* sum of their committed ends */
  KV_CNT_LIVE_BYTES,  /* sum of their live bytes */
  KV_CNT_LIVE_BLOCKS, /* sum of their live blocks */
  KV_CNT_N
};

typedef struct kv_counts {
  uint64_t v[KVDB_TIER_COUNT][KV_CNT_N];
} kv_counts;

/* meta "counts": version u8 (1), 7 reserved bytes (0), stamp u64, then v[tier][field] u64
 * for each tier and field in order. */
#define KV_COUNTS_BYTES (16 + 8 * KVDB_TIER_COUNT * KV_CNT_N)
void kv_counts_encode(uint64_t stamp, const kv_counts *k, uint8_t b[KV_COUNTS_BYTES]);
/* KVDB_CORRUPT (with a message) for a record of another size or version. */
kvdb_status kv_counts_decode(const uint8_t *b, size_t len, uint64_t *stamp, kv_counts *k);

/* The counters as of txn (a read transaction): KVDB_OK when current, KVDB_NOTFOUND when
 * absent or stale (no message either way); another status when LMDB fails. */
kvdb_status kv_counts_get(kv_catalog *c, kv_txn *txn, kv_counts *out);

/* Count everything anew, as of txn (read or write): O(contexts + segments). A segment record
 * that does not decode is KVDB_CORRUPT; a context record that does not decode is not counted
 * (verify reports it); a context whose last block cannot be read counts as SSD. */
kvdb_status kv_counts_recount(kv_catalog *c, kv_txn *txn, kv_counts *out);

/* The tier of a context's persistent copy: its last block's (SSD when unreadable). */
uint32_t kv_cat_ctx_tier(kv_catalog *c, kv_txn *txn, const kv_ctx_rec *cr);

/* In a write transaction: add `delta` to counter `field` of `tier` when the counters are
 * current (else nothing: they stay stale). A count that would go below zero makes them stale
 * instead (they were wrong; the next rebuild puts them right). */
kvdb_status kv_counts_add(kv_catalog *c, kv_txn *txn, uint32_t tier, unsigned field,
                          int64_t delta);
/* A segment record changes from `old` to `nw` (either NULL: created / deleted). */
kvdb_status kv_counts_seg(kv_catalog *c, kv_txn *txn, const kv_seg_rec *old,
                          const kv_seg_rec *nw);
/* In a write transaction: make them stale (a change whose effect is not known). */
kvdb_status kv_counts_invalidate(kv_catalog *c, kv_txn *txn);
/* In kv_txn_commit, before the commit: stamp current counters with this transaction's id.
 * Nothing on a read transaction or stale counters. */
void kv_counts_stamp(kv_catalog *c, kv_txn *txn);
/* In a write transaction: store `k` as current. */
kvdb_status kv_counts_put(kv_catalog *c, kv_txn *txn, const kv_counts *k);
/* At a read-write open: when the counters are absent or stale, recount them in a write
 * transaction of their own (once per database written by an older build, or after one).
 * Best effort: a failure leaves them stale (kvdb_stat then counts). */
void kv_counts_open(kv_catalog *c);

#endif
