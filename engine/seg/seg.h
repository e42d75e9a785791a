/* SPDX-License-Identifier: MIT */
/*
 * engine/seg/seg.h — the seg floor (LAYERS: above the catalog and block bodies, below the
 * placement state and the operations), for the layers above: the handle behind kvdb*
 * (struct kvdb, whose higher floors' state it holds as opaque pointers), segment files and
 * their writers (segment.c), the SmartSSD tier's directory (smartdir.c), and verified block
 * reads and the read-buffer pool (blockio.c).
 *
 * Layout on disk (FORMAT.md §1): <dir>/catalog.mdb (+ catalog.mdb-lock), <dir>/ssd/seg-N.kvs,
 * and the SmartSSD tier's segments in its own directory (<dir>/smartssd or smartssd_dir).
 *
 * LOCKING
 *   db->mu guards the writer pool, the read-buffer pool, the segment file cache and the
 *   pending access times (engine/track/atime.c).
 *   It is never held across I/O or an LMDB write transaction.
 *   The DRAM tier has its own lock (dram.c). LMDB serializes write transactions across
 *   threads and processes; block data is written before the write transaction begins.
 */
#ifndef KV_SEG_H
#define KV_SEG_H

#include <pthread.h>
#include <stdatomic.h>

#include "block/cblock.h"
#include "catalog/catalog.h"
#include "io/io.h"
#include "kv_common.h"
#include "tiers/tiers.h"

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

/* Latency histograms of the calls (kvdb_metrics): bucket upper bounds in ns, then +Inf. */
#define KV_LAT_BUCKETS 12
enum { KV_LAT_GET = 0, KV_LAT_PUT = 1, KV_LAT_LOOKUP = 2, KV_LAT_N = 3 };
static const uint64_t kv_lat_bounds_ns[KV_LAT_BUCKETS] = {
    10000, 50000, 100000, 500000, 1000000, 5000000, 10000000, 50000000, 100000000,
    500000000, 1000000000, 5000000000};
typedef struct kv_lat {
  _Atomic uint64_t b[KV_LAT_BUCKETS + 1]; /* per bucket (not cumulative); the last is +Inf */
  _Atomic uint64_t count, sum_ns;
} kv_lat;

typedef struct kv_atime {
  uint8_t key[16];
  uint64_t ms;
} kv_atime;

struct kvdb {
  uint32_t magic;
  char *dir;
  char *seg_dir;
  /* The SmartSSD tier's segment directory (seg/smartdir.c): the one the catalog records once
   * this handle has seen the record (at open, or later: kv_smart_dir), else the handle's own
   * (smart_own), else NULL. It changes at most once after open, atomically; every string it
   * has pointed to stays allocated until close. */
  char *_Atomic smart_dir;
  char *smart_own;        /* the handle's own: the smartssd_dir option, or DIR/smartssd when
                             smartssd_bytes > 0, or NULL */
  char *smart_rec;        /* the recorded one, once seen (what smart_dir then points to) */
  int smart_explicit;     /* smart_own is the smartssd_dir option */
  _Atomic int smart_seen; /* smart_dir is the recorded directory */
  struct kv_place *place; /* placement state (track/track.c); NULL when placement is off */
  struct kv_score_devs *score_devs; /* near-data devices kvdb_score keeps (ops/score_ctx.c) */
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
  _Atomic uint64_t relocations;    /* contexts kvdb_relocate moved or re-encoded */
  kv_lat lat[KV_LAT_N];            /* kvdb_get, kvdb_put_ex, kvdb_lookup */
  struct kv_rtier *rtier;          /* the remote tier (ops/rtier.c); NULL when off */
  /* set by engine/db at open: what follows a remote hit's copy to the local store (the
   * placement after a put; a floor above ops, hence a pointer); NULL: nothing */
  void (*after_copy)(kvdb *db, const uint8_t key[16]);
  struct kv_prefetch *prefetch;    /* kvdb_prefetch's queue and worker (ops/prefetch.c) */
  _Atomic uint32_t fg_reads;       /* kvdb_get fetches reading now (the prefetch yields) */
  _Atomic uint64_t fg_bytes;       /* bytes kvdb_get fetches read (its admission control) */
};

/* Count a call of `ns` nanoseconds in histogram `which`. */
static inline void kv_lat_note(kvdb *db, int which, uint64_t ns)
{
  kv_lat *l = &db->lat[which];
  unsigned i = 0;
  while (i < KV_LAT_BUCKETS && ns > kv_lat_bounds_ns[i])
    i++;
  l->b[i]++;
  l->count++;
  l->sum_ns += ns;
}

/* ---- the handle (segment.c) ---- */
/* KVDB_INVALID (NULL) or KVDB_MISUSE (closed) unless db is an open handle; clears the
 * thread's error first: every entry point starts with it. */
kvdb_status kv_check_db(kvdb *db);

/* ---- segments (segment.c) ---- */
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
/*
 * A run of block objects appended to w's segment from `base` (a page boundary) by a copy
 * (compaction, a move between tiers): packed objects (FORMAT.md §3e) go back to back at
 * 64-byte offsets through a buffer whose whole pages are written as it fills; any other
 * object (or a packed one too big for the buffer) is written in whole pages from a page
 * boundary, after the run so far. kv_run_close pads the run to a page; the bytes written past
 * the start are then base - start.
 */
typedef struct kv_run {
  uint8_t *p;
  size_t cap, fill;
  uint64_t base; /* segment offset of p[0] */
} kv_run;
kvdb_status kv_run_open(kv_run *r, uint64_t base);
/* Append obj (bytes; a buffer with room for it rounded up to a page, when not packed): *off its
 * segment offset. */
kvdb_status kv_run_put(kvdb *db, kv_writer *w, kv_run *r, uint8_t *obj, uint64_t bytes,
                       int packed, uint64_t *off);
/* Write what is left (zero-padded to a page) and free the buffer (also after a failure). */
kvdb_status kv_run_close(kvdb *db, kv_writer *w, kv_run *r, int write);
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
void kv_files_prune(kvdb *db, kv_txn *txn);
void kv_files_free(kvdb *db);
/* Open-time recovery of segments whose writer died (truncate the uncommitted tail). */
kvdb_status kv_recover(kvdb *db);

/* ---- block I/O (blockio.c) ---- */
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
/* Positions [i] of `positions` that fall in the compressed block `rec` (tokens pos0 ...,
 * geometry g) of one layer into row i of `out` (the get_tokens convention): only the pages of
 * the layer's section headers and of the token groups holding them are read, each verified.
 * A dropped position is KVDB_NOTFOUND; a failed check KVDB_CORRUPT (counted). */
kvdb_status kv_block_read_tokens(kvdb *db, const kv_block_rec *rec, const uint8_t *hash,
                                 const kv_block_geom *g, uint32_t layer,
                                 const uint32_t *positions, size_t n_pos, uint64_t pos0,
                                 const kvdb_kv_view *out);

/* ---- the SmartSSD tier's directory (smartdir.c) ---- */
/* The directory of the SmartSSD tier's segments: the catalog's record (which any handle of
 * any process may have written since this one opened: looked up in a read transaction of its
 * own until this handle has seen it), else the handle's own; NULL when neither is known. */
const char *kv_smart_dir(kvdb *db);
/* At open, after the catalog and before recovery: the SmartSSD tier's directory (recorded in
 * the catalog, or the option, or DIR/smartssd; a record another process writes later is
 * adopted by kv_smart_dir), created when the tier is configured and the handle writes.
 * KVDB_INVALID when the option names another directory than the recorded one. */
kvdb_status kv_smart_dir_open(kvdb *db);
/* In the write transaction that creates a SmartSSD segment: the recorded directory (which the
 * handle adopts), else the handle's own, recorded now (KVDB_INVALID when it has none, or when
 * its explicit smartssd_dir differs from the record); the directory exists; format 3. */
kvdb_status kv_smart_dir_ready(kvdb *db, kv_txn *txn);
/* At a read-write open with placement on (track.c records its settings): 1 when the catalog
 * has no record and the handle has a SmartSSD tier of its own, which kv_smart_dir_record then
 * records in the write transaction txn (unless another process recorded one meanwhile). */
int kv_smart_dir_unrecorded(kvdb *db, kv_txn *txn);
kvdb_status kv_smart_dir_record(kvdb *db, kv_txn *txn);
/* At close (kv_place_close): what kv_smart_dir_open made. */
void kv_smart_dir_close(kvdb *db);

/*
 * kv_score_variant_for() - the variant of the score copies that blocks of model m written into
 * db now carry: version 2 (KV_SCORE_COPY_CENTERED: centered and Hadamard-rotated, recall@10%
 * at int4 0.96 against 0.84) when m's head_dim is a power of two and db has no SmartSSD tier;
 * else version 1. The near-data scorers (fpga/: the HLS kernel and its emulation; the CUDA
 * scorer) rank version-1 copies only: they have no rotation or center-bias unit, so a database
 * with a SmartSSD tier keeps writing version-1 copies that its device can score (a version-2
 * block that reaches that tier by a move is scored by the host: score_ctx.c). smartdir.c.
 */
unsigned kv_score_variant_for(kvdb *db, const kvdb_model *m);

#endif
