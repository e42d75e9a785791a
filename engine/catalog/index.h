/* SPDX-License-Identifier: MIT */
/*
 * engine/catalog/index.h — the catalog's two indexes of block records (format 4, FORMAT.md §2):
 *
 *   next       the tail search of lookup: which stored block continues a prefix furthest. A
 *              trie over the tokens of every chain block, keyed by (node, tokens of one chunk)
 *              -> the hashes of the blocks through that entry (dupsort).
 *   segblocks  segment id (8, BE) -> hashes of the blocks located in it (dupsort): compaction
 *              visits only its victim's blocks.
 *
 * THE TRIE. A block's tokens are cut in chunks at fixed positions (KV_IDX_CHUNK_END: 8, 24,
 * 56, 120, then every 96 tokens, so a key is at most 16 + 4 * 96 bytes). The entry of chunk d
 * of block B (tokens t, parent P) is the key node_d || t[s_d, min(n, e_d)) as u32 BE, with
 * node_0 = P and node_{d+1} = XXH3-128 of node_d and chunk d (seeded: never a block hash); its
 * duplicates are the hashes of the blocks whose tokens pass through it. B has entries at
 * depths 0..k, where it stops at the first depth at which it ends or was alone when it was
 * added. Invariant T: an entry listing two or more blocks lists each of them that has tokens
 * past the chunk at the next depth too (adding B to an entry that lists one other block A
 * first gives A its next entry; deleting leaves the others as they were).
 *
 * A lookup, at each depth, finds the key that shares most tokens with the query's chunk: in
 * key order (u32 BE, a prefix before its extensions) it is the query's successor or
 * predecessor. When that key is the query's whole chunk and lists two or more blocks, T says
 * every block continuing past it is at the next depth: descend. Otherwise one of its blocks'
 * records (tokens) gives the answer. Cost: one B-tree search per depth visited (depth > 0 only
 * when two stored blocks share the chunk), whatever the fan-out.
 */
#ifndef KV_INDEX_H
#define KV_INDEX_H

#include "catalog.h"

/* The catalog format that carries these indexes (meta "format"). */
#define KV_FORMAT_INDEXES 4u

/* Add / remove block `hash` (parent, its n tokens as stored: u32 LE) to / from the trie. */
kvdb_status kv_idx_child_add(kv_catalog *c, kv_txn *txn, const uint8_t parent[16],
                             const uint8_t hash[16], const uint8_t *tokens_le, uint32_t n);
kvdb_status kv_idx_child_del(kv_catalog *c, kv_txn *txn, const uint8_t parent[16],
                             const uint8_t hash[16], const uint8_t *tokens_le, uint32_t n);

/*
 * The stored child of `parent` (of model `model`, not token-dropped) that shares the longest
 * prefix with q[0, nq): *best its shared tokens (0: none), rec and hash its record. rec's tokens
 * point into txn. A catalog without the trie (format < 4 opened read-only) is scanned: every
 * child of `parent` in the legacy `children` database.
 */
kvdb_status kv_idx_child_best(kv_catalog *c, kv_txn *txn, const uint8_t parent[16],
                              const uint8_t model[16], const uint32_t *q, size_t nq,
                              uint32_t *best, kv_block_rec *rec, uint8_t hash[16]);

/* Segment index: block `hash` is located in segment `seg` / no longer is. */
kvdb_status kv_idx_seg_add(kv_catalog *c, kv_txn *txn, uint64_t seg, const uint8_t hash[16]);
kvdb_status kv_idx_seg_del(kv_catalog *c, kv_txn *txn, uint64_t seg, const uint8_t hash[16]);
/* A block record moved from segment `from` to `to` (nothing when they are equal). */
kvdb_status kv_idx_seg_move(kv_catalog *c, kv_txn *txn, uint64_t from, uint64_t to,
                            const uint8_t hash[16]);

/*
 * Build both indexes in write transaction txn (the upgrade of a format 1-3 catalog): every
 * block record goes into segblocks, every child listed by the legacy `children` database into
 * the trie; then `children` is dropped and the format raised to KV_FORMAT_INDEXES. The dbis
 * of `next` and `segblocks` are created (MDB_CREATE) and stored in c.
 */
kvdb_status kv_idx_build(kv_catalog *c, kv_txn *txn);

/* Empty both indexes and build them again from the block records (kvdb_repair, after it
 * changed block records): chain blocks into the trie, every block into segblocks. */
kvdb_status kv_idx_rebuild(kv_catalog *c, kv_txn *txn);

/*
 * Check both indexes against the block records (kvdb_verify): every record is listed under its
 * segment and (a chain block) in the trie at depth 0; every segment index entry and every trie
 * entry names an existing block (of that segment). fn gets one message per disagreement.
 * Returns a failure only when the catalog cannot be read.
 */
typedef void (*kv_idx_problem_fn)(void *ctx, const char *msg);
kvdb_status kv_idx_verify(kv_catalog *c, kv_txn *txn, kv_idx_problem_fn fn, void *ctx);

#endif
