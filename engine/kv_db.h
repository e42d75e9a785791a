/* SPDX-License-Identifier: MIT */
/*
 * engine/kv_db.h — the handle behind kvdb* and the engine's internal interfaces.
 *
 * Layout on disk (FORMAT.md §1): <dir>/catalog.mdb (+ catalog.mdb-lock), <dir>/ssd/seg-N.kvs,
 * and the SmartSSD tier's segments in its own directory (<dir>/smartssd or smartssd_dir).
 *
 * LOCKING
 *   db->mu guards the writer pool, the read-buffer pool, the segment file cache and the
 *   pending access times.
 *   It is never held across I/O or an LMDB write transaction.
 *   The DRAM tier has its own lock (dram.c). LMDB serializes write transactions across
 *   threads and processes; block data is written before the write transaction begins.
 */
#ifndef KV_DB_H
#define KV_DB_H

#include <pthread.h>
#include <stdatomic.h>

#include "block.h"
#include "catalog/catalog.h"
#include "catalog/counts.h"
#include "io/io.h"
#include "kv_common.h"
#include "tiers/dram.h"

#define KVDB_MAGIC_OPEN 0x6b766462u
#define KVDB_MAGIC_CLOSED 0xdeadbeefu

/* Segment ids carry their tier: a SmartSSD segment's id has this bit set (FORMAT.md §1), so a
 * segment's file is found from its id alone; SSD segments keep plain ids. */
#define KV_SEG_SMARTSSD_BIT (1ull << 62)
static inline uint32_t kv_seg_tier(uint64_t id)
{
  return (id & KV_SEG_SMARTSSD_BIT) ? KVDB_TIER_SMARTSSD : KVDB_TIER_SSD;
}

/* A segment this process appends to (one writer at a time). */
typedef struct kv_writer {
  uint64_t seg_id;
  uint32_t tier;     /* KVDB_TIER_SSD or KVDB_TIER_SMARTSSD (of seg_id) */
  kv_file *f;
  uint64_t end;      /* append position = committed end after each commit */
  uint8_t *stage[2]; /* aligned staging buffers, reused */
  size_t stage_cap;
  int no_alloc;      /* the filesystem cannot fallocate: plain appends */
  struct kv_writer *next;
} kv_writer;

/* A cached open segment file (for reads). */
typedef struct kv_segfile {
  uint64_t id;
  kv_file *f;
  int refs; /* users + 1 while cached */
  struct kv_segfile *next;
  struct kv_segfile *hnext; /* its bucket's chain in db->files_tab */
} kv_segfile;

/* A read buffer (aligned for direct I/O), kept by the handle between calls. */
typedef struct kv_rbuf {
  uint8_t *p;
  size_t cap;
  struct kv_rbuf *next;
} kv_rbuf;

typedef struct kv_atime {
  uint8_t key[16];
  uint64_t ms;
} kv_atime;

struct kvdb {
  uint32_t magic;
  char *dir;
  char *seg_dir;
  /* The SmartSSD tier's segment directory (store/place.c): the one the catalog records once
   * this handle has seen the record (at open, or later: kv_smart_dir), else the handle's own
   * (smart_own), else NULL. It changes at most once after open, atomically; every string it
   * has pointed to stays allocated until close. */
  char *_Atomic smart_dir;
  char *smart_own;        /* the handle's own: the smartssd_dir option, or DIR/smartssd when
                             smartssd_bytes > 0, or NULL */
  char *smart_rec;        /* the recorded one, once seen (what smart_dir then points to) */
  int smart_explicit;     /* smart_own is the smartssd_dir option */
  _Atomic int smart_seen; /* smart_dir is the recorded directory */
  struct kv_place *place; /* placement state (store/place.c); NULL when placement is off */
  struct kv_score_devs *score_devs; /* near-data devices kvdb_score keeps (store/score_ctx.c) */
  kvdb_options opt;
  kv_logger log;
  kv_catalog cat;
  kv_io *os_io; /* owned */
  kv_io *io;    /* os_io, or a test layer wrapping it */
  int direct;   /* O_DIRECT in use for segment files */
  pthread_mutex_t mu;
  kv_writer *idle_writers;
  kv_rbuf *idle_rbufs;
  size_t n_idle_rbufs;
  kv_segfile *files;
  kv_segfile **files_tab; /* `files` by id: buckets (a power of two; NULL: walk the list) */
  size_t files_cap, files_n;
  uint64_t files_gen;
  kv_atime *pending;
  size_t n_pending, cap_pending;
  kv_dram *dram;
  _Atomic uint64_t ssd_hits, ssd_misses, corrupt_blocks, bytes_read, bytes_written;
  _Atomic uint64_t smart_hits; /* blocks read from the SmartSSD tier */
  _Atomic uint64_t compact_visits; /* segment index entries compaction visited (tests) */
};

/* ---- segments (store/segment.c) ---- */
kvdb_status kv_seg_path(kvdb *db, uint64_t id, char *buf, size_t cap);
/* Take a writer (an open segment owned by this handle), creating a segment if needed: of the
 * SSD tier, or of `tier` (KVDB_TIER_SSD or KVDB_TIER_SMARTSSD). */
kvdb_status kv_writer_acquire(kvdb *db, kv_writer **out);
kvdb_status kv_writer_acquire_tier(kvdb *db, uint32_t tier, kv_writer **out);
/* Give it back; sealed (past segment_bytes) writers are closed. */
void kv_writer_release(kvdb *db, kv_writer *w, int sealed);
static inline kv_file *kv_writer_file(kv_writer *w)
{
  return w->f;
}
/* Make sure both staging buffers hold at least `bytes`. */
kvdb_status kv_writer_stage(kv_writer *w, size_t bytes);
void kv_writers_free(kvdb *db);
/* The cached read handle of segment `id`, referenced until kv_segfile_put. */
kvdb_status kv_segfile_get(kvdb *db, uint64_t id, kv_segfile **out);
void kv_segfile_put(kvdb *db, kv_segfile *sf);
/* The status of a failed read of [off, off + len) of segment `seg` (block `hash`, may be NULL),
 * err an errno: KVDB_CORRUPT when the file is missing or shorter than off + len (the message
 * names the file and how short it is: "past the file's end"), else the errno's status. A
 * segment file that cannot be found when opened for reading is KVDB_CORRUPT too. */
kvdb_status kv_seg_read_fail(kvdb *db, int err, uint64_t seg, uint64_t off, uint64_t len,
                             const uint8_t *hash);
/* Drop cached handles of segments whose id is not in the catalog any more. */
void kv_files_prune(kvdb *db, MDB_txn *txn);
void kv_files_free(kvdb *db);
/* Open-time recovery of segments whose writer died (truncate the uncommitted tail). */
kvdb_status kv_recover(kvdb *db);

/* ---- block I/O (store/blockio.c) ---- */
/* Aligned allocation for direct I/O. */
void *kv_alloc_aligned(size_t bytes);
void kv_free_aligned(void *p);
/*
 * Read and verify a whole block object at rec's location into buf (rec->bytes, aligned):
 * header (hash must equal `hash`), meta and every group checksum. KVDB_CORRUPT names the
 * segment, offset and block; the caller counts it.
 */
kvdb_status kv_block_read_verify(kvdb *db, const kv_block_rec *rec, const uint8_t hash[16],
                                 uint8_t *buf, kv_block_hdr *hdr);
/* Validate a block object already in memory (read by a batch): all of it, or its header and
 * meta region first and then its sections [s0, s1) as they arrive. */
kvdb_status kv_block_check(const kv_block_rec *rec, const uint8_t hash[16], const uint8_t *buf,
                           kv_block_hdr *hdr);
/* 1 when a compaction committed since a read snapshot that saw catalog generation `gen` (its
 * blocks may have moved: the read is worth doing again from a fresh snapshot). get.c. */
int kv_gen_moved(kvdb *db, uint64_t gen);
/* The context record `key` when it belongs to model m (model_hash = its h_{-1}): else
 * KVDB_NOTFOUND or KVDB_MISMATCH with a message naming the context. context.c. */
kvdb_status kv_ctx_of_model(kvdb *db, MDB_txn *txn, const uint8_t key[16],
                            const uint8_t model_hash[16], const kvdb_model *m, kv_ctx_rec *out);
/* The record of block `hash`, which context `key` lists: a block the catalog lacks is
 * KVDB_CORRUPT, and any failure's message names the context and the block. context.c. */
kvdb_status kv_ctx_block(kvdb *db, MDB_txn *txn, const uint8_t key[16], const uint8_t hash[16],
                         kv_block_rec *out);
kvdb_status kv_block_check_meta(const kv_block_rec *rec, const uint8_t hash[16],
                                const uint8_t *buf, kv_block_hdr *hdr);
kvdb_status kv_block_check_sections(const kv_block_rec *rec, const uint8_t hash[16],
                                    const kv_block_hdr *hdr, const uint8_t *buf, uint32_t s0,
                                    uint32_t s1);
/* A read buffer of at least `bytes` from the handle's pool (NULL when out of memory); give it
 * back with kv_rbuf_release (the pool keeps a few, the rest are freed). */
kv_rbuf *kv_rbuf_acquire(kvdb *db, size_t bytes);
void kv_rbuf_release(kvdb *db, kv_rbuf *b);
void kv_rbufs_free(kvdb *db);

/* ---- copies between block sections and caller views (store/copy.c) ---- */
/* Gather tokens [0, g->n_tokens) of the caller's view starting at token `t0` into the data
 * region `data` (g->data_bytes, zeroed padding): all sections, or section `s` alone. */
void kv_gather(const kv_block_geom *g, const kvdb_kv_view *v, uint64_t t0, uint8_t *data);
void kv_gather_section(const kv_block_geom *g, const kvdb_kv_view *v, uint64_t t0, uint32_t s,
                       uint8_t *data);
/* Section s of tokens [t0, t0 + g->n_tokens) of the view as n_tokens contiguous rows (codec
 * input). */
void kv_gather_rows(const kv_block_geom *g, const kvdb_kv_view *v, uint64_t t0, uint32_t s,
                    uint8_t *rows);
/* Tokens [t0, t0 + n) of one (layer, KV head) of K (is_v 0) or V as n contiguous rows. */
void kv_gather_head(const kvdb_kv_view *v, uint32_t elem_bytes, uint32_t head_dim,
                    uint32_t layer, uint32_t head, int is_v, uint64_t t0, uint64_t n,
                    uint8_t *rows);
/* n_tokens contiguous rows into section s of a page-grouped data region. */
void kv_rows_to_section(const kv_block_geom *g, const uint8_t *rows, uint32_t s, uint8_t *data);
/* n_rows contiguous rows of section s into the view at tokens t0, t0 + 1, ... */
void kv_scatter_rows(const kv_block_geom *g, const uint8_t *rows, uint32_t n_rows, uint32_t s,
                     const kvdb_kv_view *v, uint64_t t0);
/* Scatter tokens [from, from + n) of the data region into the view at token t0 + (t - from):
 * all sections, or sections [s0, s1) only, with non-temporal stores when `stream` (what
 * kv_scatter_streams() says for a scatter of n tokens of every section: a large one). */
void kv_scatter(const kv_block_geom *g, const uint8_t *data, uint32_t from, uint32_t n,
                const kvdb_kv_view *v, uint64_t t0);
int kv_scatter_streams(const kv_block_geom *g, uint32_t n);
void kv_scatter_sections(const kv_block_geom *g, const uint8_t *data, uint32_t s0, uint32_t s1,
                         uint32_t from, uint32_t n, const kvdb_kv_view *v, uint64_t t0,
                         int stream);
/* One row (head_dim elements) of section s into the view at token dst_tok of layer 0 (the
 * get_tokens convention). */
void kv_put_row(const kv_block_geom *g, uint32_t s, const uint8_t *row, const kvdb_kv_view *v,
                uint64_t dst_tok);
/* Scatter one token `t` of one layer (all heads, K and V) into view token `dst_tok`. `data`
 * is the data region (or NULL with `page_of` resolving group addresses). */
void kv_scatter_token_layer(const kv_block_geom *g, const uint8_t *data, uint32_t layer,
                            uint32_t t, const kvdb_kv_view *v, uint64_t dst_tok);

/* ---- shared checks and hashes (api.c) ---- */
kvdb_status kv_check_db(kvdb *db);
kvdb_status kv_check_model(const kvdb_model *m, uint32_t *block_tokens);
/* The most tokens a context can hold (its block count is a u32, blocks hold >= 16 tokens):
 * put, get and lookup refuse a larger n (KVDB_INVALID) before any arithmetic on it. */
#define KV_MAX_TOKENS ((uint64_t)UINT32_MAX * 16)
kvdb_status kv_check_n_tokens(size_t n);
kvdb_status kv_check_view(const kvdb_kv_view *v, const kvdb_model *m, const char *what);
/* KVDB_INVALID when the view's strides for n_tokens tokens (with the model's layers, heads and
 * dims) give byte offsets beyond int64 (a valid view first: kv_check_view). */
kvdb_status kv_check_view_extent(const kvdb_kv_view *v, const kvdb_model *m, uint64_t n_tokens,
                                 const char *what);
void kv_model_hash(const kvdb_model *m, uint32_t block_tokens, uint8_t out[16]);
void kv_chain_hash(const uint8_t parent[16], const uint32_t *tokens, size_t n, uint8_t out[16]);

/* ---- catalog operations shared by put, delete and compaction (store/put.c) ---- */
/* One block of `bytes` less in segment seg (live bytes and blocks). */
kvdb_status kv_seg_unref(kvdb *db, MDB_txn *txn, uint64_t seg, uint64_t bytes);
/* The config fields and flags of a block record stored with c. */
void kv_block_rec_set_config(kv_block_rec *br, const kvdb_config *c);
/* Remove a context in a write transaction; *freed receives the bytes of blocks freed. */
kvdb_status kv_delete_ctx_txn(kvdb *db, MDB_txn *txn, const uint8_t key[16], uint64_t *freed);
/* Whether model m (fingerprint mh) is the one stored under its id: KVDB_OK; KVDB_NOTFOUND (no
 * model of that id is stored); KVDB_MISMATCH naming both shapes (another shape is stored under
 * that id: every call with the model fails so, not only put). */
kvdb_status kv_model_known(kvdb *db, MDB_txn *txn, const kvdb_model *m, uint32_t bt,
                           const uint8_t mh[16]);
/* The model record whose hash is `mh` (for listing); KVDB_NOTFOUND when none. */
kvdb_status kv_model_by_hash(kvdb *db, MDB_txn *txn, const uint8_t mh[16], char id[64],
                             kv_model_rec *rec);

/* ---- tiers of contexts (store/place.c) ---- */
/* The tier of a context's persistent copy: that of its last block (SSD when unreadable). */
uint32_t kv_ctx_tier(kvdb *db, MDB_txn *txn, const kv_ctx_rec *cr);
/* The directory of the SmartSSD tier's segments: the catalog's record (which any handle of
 * any process may have written since this one opened: looked up in a read transaction of its
 * own until this handle has seen it), else the handle's own; NULL when neither is known. */
const char *kv_smart_dir(kvdb *db);

/* 1 when segment `id` has no record in the catalog as it is now: a compaction in some handle
 * moved its blocks and removed its file while the caller read an older snapshot (verify.c). */
int kv_seg_gone_now(kvdb *db, uint64_t id);

/* ---- maintenance (store/maint.c) ---- */
void kv_note_access(kvdb *db, const uint8_t key[16]);
kvdb_status kv_flush_atime(kvdb *db, MDB_txn *txn);

#endif
