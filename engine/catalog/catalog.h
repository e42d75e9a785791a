/* SPDX-License-Identifier: MIT */
/*
 * engine/catalog/catalog.h — the LMDB catalog: what is stored, where, and who uses it.
 *
 * Sub-databases (FORMAT.md §2 has every record's bytes):
 *   meta      "format" -> u32 format version; "next_segment" -> u64; "gen" -> u64 (compaction
 *             generation: readers drop cached file handles when it changes)
 *   models    model id -> shape + fingerprint hash
 *   blocks    block hash (16) -> refcount, location (segment, offset, bytes), tokens, parent
 *   next      (node (16), chunk of tokens) -> block hashes (dupsort): the trie that the tail
 *             search of lookup descends (format 4; INDEXES)
 *   segblocks segment id (8, BE) -> hashes of the blocks located in it (dupsort; format 4)
 *   children  (formats 1-3 only) parent hash (16) -> child block hashes (16) (dupsort); a
 *             read-write open replaces it by `next` (INDEXES, kv_idx_build)
 *   contexts  context key (16) -> model hash, block hashes, tokens, times
 *   atime     last access (8, big-endian) || context key -> "" : LRU order for tier capacity
 *   segments  segment id (8, big-endian) -> tier, state, committed end, live bytes, owner pid
 *   profiles  context key (16) -> the context's quality profile (format 2)
 *   ctxstats  context key (16) -> decayed access count and placement (CTXSTATS)
 *   (meta "counts": per-tier counters kept by every commit, read by kvdb_stat: COUNTS)
 *
 * INVARIANTS
 *   C1. A block record exists iff some context lists it; refcount = number of such contexts.
 *   C2. A block record's bytes lie inside [0, end) of its segment and were fdatasync'ed before
 *       the transaction that created the record committed.
 *   C3. segment.live_bytes = sum of bytes of the block records located in it.
 *   C4. Every atime entry matches its context's last_access.
 *   C5. (format 4) segblocks lists (s, h) iff block record h is located in segment s; every
 *       chain block is in the trie `next` (INDEXES).
 *
 * Record encoders/decoders are pure and validate every length (catalog bytes come from disk).
 */
#ifndef KV_CATALOG_H
#define KV_CATALOG_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "kv_common.h"
#include "codec.h" /* kv_calib (model records of version 3) */

/* the catalog's transaction: opaque (see LMDB TYPES below; this header does not include
 * lmdb.h: catalog_int.h, the catalog's own header, does) */
typedef struct kv_txn kv_txn;

/*
 * THE TYPED CATALOG API (issue 14: the catalog owns every LMDB call and the schema)
 *
 * The layers above the catalog reach LMDB only through kv_cat_* / kv_txn_* functions: no
 * engine file outside engine/catalog/ makes an mdb_* call or names an MDB_* type (see LMDB
 * TYPES below).
 *
 *   kv_txn       the catalog's transaction. Begun by kv_txn_begin, ended by kv_txn_commit
 *                (commits a write one, ends a read one) or kv_txn_abort (NULL: no-op). Every
 *                pointer a kv_cat_* function hands out (a record's tokens or blocks, an
 *                iterator's key and val) points into the map: valid until the transaction
 *                ends or the next write in it.
 *   kv_cat_table the schema's databases by name (KV_TBL_*); a database the catalog lacks (an
 *                older format opened read-only: profiles, ctxstats, next/segblocks, children)
 *                reads as empty: gets and deletes say KVDB_NOTFOUND, iterators yield nothing,
 *                puts fail KVDB_READONLY naming it.
 *   gets         kv_cat_get_<rec>(c, txn, key, &rec): the record decoded; KVDB_NOTFOUND (no
 *                message) when absent, KVDB_CORRUPT (with one) when it does not decode.
 *                kv_cat_get_raw: the bytes as stored, for callers that check them (verify).
 *   puts, dels   kv_cat_put_<rec> encodes the typed record itself; kv_cat_put_raw writes bytes
 *                built elsewhere (repair's rebuilt records). Dels say KVDB_NOTFOUND (no
 *                message) when there was nothing to delete. Segment records go through
 *                kv_cat_put_seg / kv_cat_del_seg only (they keep the counters (COUNTS)); the raw
 *                and block/context functions here keep none (their callers call
 *                kv_counts_add, or recount as repair does).
 *   iteration    a kv_cat_iter lives on the caller's stack; the caller owns it and must
 *                kv_cat_iter_close it (idempotent; safe after a failed open and on a zeroed
 *                iterator, kv_cat_iter it = {0}). The catalog owns the LMDB cursor inside.
 *                kv_cat_iter_open positions it before the first entry of a
 *                table, kv_cat_iter_open_dups before the first value of one key (a dupsort
 *                table: the segment index, the trie); kv_cat_iter_seg_index is that for the
 *                blocks of one segment. kv_cat_iter_next returns 1 with it.key / it.val set to
 *                the next entry, 0 at the end or on an LMDB failure: it.err is KVDB_OK at the
 *                end, else the failure's status (message set, naming `what`). A loop reads:
 *                    kv_cat_iter it;
 *                    KV_RET(kv_cat_iter_open(c, txn, KV_TBL_SEGMENTS, &it, "segments"));
 *                    while (kv_cat_iter_next(&it)) {
 *                      if (kv_cat_iter_seg(&it, &id, &sr) != KVDB_OK) ...  (key and record)
 *                    }
 *                    kv_cat_iter_close(&it);   (it.err: how it ended)
 *                kv_cat_iter_block / _ctx / _seg decode the current entry (key size checked:
 *                KVDB_CORRUPT naming it); kv_cat_iter_del deletes it (write transactions).
 *   errors       every function returns a kvdb_status with the message set (kv_mdb_fail
 *                maps LMDB's codes: MDB_MAP_FULL is KVDB_FULL, ...), except the NOTFOUNDs.
 *   hot paths    nothing here allocates except kv_cat_put_block for records of more than
 *                1024 tokens (encoded on the stack below that), and iterator opens (LMDB's
 *                cursor): no locks, no transactions of their own.
 *
 * LMDB TYPES. kv_txn is opaque (`typedef struct kv_txn kv_txn`; no struct kv_txn is ever
 * defined): it is LMDB's transaction, and only the files of engine/catalog/ (and the white-box
 * tests that include catalog_int.h) convert it, explicitly at their LMDB calls (kv_mtxn,
 * kv_ktxn in catalog_int.h). Likewise kv_catalog names the environment as an opaque
 * struct kv_env (kv_menv, kv_kenv) and its databases as unsigned int (MDB_dbi). This header
 * does not include <lmdb.h>; kv_mdb_fail, kv_cursor_open and the mdb_txn_* routing are in
 * catalog_int.h, the header of engine/catalog/'s own files.
 */

#define KV_REC_VERSION 1u
#define KV_CTX_REC_VERSION 3u /* version 2: the context's storage config after the header;
                                 3: and its placement statistics (format 7, FOLDED STATS) */
#define KV_PROFILE_REC_VERSION 2u /* 2: with output gains (catalog.c, FORMAT.md §2) */

/* kv_block_rec.bflags; SCORE8 / SCORE4: the object ends with a score region of int8 / int4
 * copies (FORMAT.md §3c; the model's score_bits); SCOREV2 (with one of them): those copies are
 * version 2 (score.h THE CENTERED, ROTATED COPY), else version 1 */
enum { KV_BLK_COMPRESSED = 1, KV_BLK_DROPS = 2, KV_BLK_SCORE8 = 4, KV_BLK_SCORE4 = 8,
       KV_BLK_SCOREV2 = 16, KV_BLK_PACKED = 32, KV_BLK_KEPTN = 64 };
/* KV_BLK_KEPTN (format 8, issue 16; only with KV_BLK_DROPS): the record's u16 at offset 14
 * (kv_block_rec.keep_permille) is the block's kept tokens per KV head, 1..n_tokens, chosen so
 * that its context keeps exactly its ratio (kv_drop_keep_span()); without it (formats 2-7) it
 * is the ratio in permille and the block keeps kv_drop_keep_count(n_tokens, permille).
 * kv_block_rec_kept() reads either. */
/* KV_BLK_PACKED (format 7): a packed raw object (block format 4, FORMAT.md §3e) at a 64-byte
 * offset, its bytes a multiple of 64 (not of 4096); never with score copies. With
 * KV_BLK_COMPRESSED (format 9): a packed compressed object (block format 5, §3f), which may
 * also drop tokens (KV_BLK_DROPS, KV_BLK_KEPTN) */

typedef struct kv_model_rec {
  uint8_t hash[16]; /* h_{-1} */
  uint32_t n_layers, n_kv_heads, head_dim, dtype, block_tokens;
  uint32_t score_bits; /* 0, 8 or 4 (kvdb_model.score_bits) */
  float rope_base;     /* kvdb_model.rope_base / rope_style; 0 / 0 when not given (record */
  uint32_t rope_style; /* version 1); version 2 records carry them */
  uint32_t calib_bytes; /* version 3: bytes of the calibration after byte 40 (kvdb_model_calibrate;
                           checked by kv_model_calib_decode), else 0. kv_model_rec_encode writes
                           versions 1 and 2 only; kv_model_rec_encode_calib version 3 */
  uint32_t gains_bytes; /* version 4: bytes of the output gains block (kvdb_model_set_output_gains;
                           checked by kv_model_gains_decode), else 0 */
} kv_model_rec;

/* A model's output-projection gains (model record version 4, kvdb_model_set_output_gains):
 * g[(layer * n_q_heads + q head) * channels + c], channels 1 or head_dim, finite, >= 0. */
typedef struct kv_model_gains {
  uint32_t n_layers, n_q_heads, channels;
  float *g; /* NULL: none */
} kv_model_gains;
void kv_model_gains_free(kv_model_gains *g);

typedef struct kv_block_rec {
  uint32_t refcount;
  uint32_t tier;
  uint32_t bflags;        /* KV_BLK_*: a compressed (format 2) object; tokens dropped; score
                             copies at the end (format 3) */
  uint8_t method, bits, drop; /* how it is stored (kvdb_config fields; 0 = raw) */
  uint16_t keep_permille; /* DROPS: the ratio in permille, or with KV_BLK_KEPTN the kept
                             tokens of the block (FORMAT.md §2, offset 14) */
  uint32_t n_tokens;
  uint64_t segment;
  uint64_t offset;
  uint64_t bytes;       /* total bytes of the block object */
  uint8_t parent[16];
  uint8_t model[16];
  const uint8_t *tokens; /* n_tokens LE u32, points into the record (valid as the txn) */
} kv_block_rec;

enum { KV_CTX_EXPLICIT = 1 };

/* kv_ctxstats.flags */
enum { KV_CTXS_CACHED = 1, KV_CTXS_PRIOR = 2 /* set by the encoder when prior != 0 */ };

typedef struct kv_ctxstats {
  uint32_t flags;    /* KV_CTXS_*: the plan keeps it in the DRAM tier */
  uint32_t tier;     /* kvdb_tier of its persistent copy as last placed */
  double freq;       /* decayed access count as of freq_ms (finite, >= 0) */
  uint64_t freq_ms;  /* Unix ms */
  uint64_t accesses; /* accesses counted (not decayed) */
  uint64_t prior;    /* its profile is its group's prior record (PRIORS); 0: none */
} kv_ctxstats;

/* A context record of version 3 (format 7, FOLDED STATS: a put with placement on) carries its
 * placement statistics (has_stats): the context's ctxstats when it has no ctxstats record. */
typedef struct kv_ctx_rec {
  uint32_t flags;
  kvdb_config config; /* how its put or last re-encoding stored it (all zero = raw) */
  uint32_t n_blocks;
  uint64_t n_tokens;
  uint64_t bytes;
  uint64_t created_ms;
  uint64_t last_access_ms;
  uint8_t model[16];
  const uint8_t *blocks; /* n_blocks * 16 bytes, points into the record */
  int has_stats;         /* version 3: stats follows the config */
  kv_ctxstats stats;
} kv_ctx_rec;

enum { KV_SEG_OPEN = 0, KV_SEG_SEALED = 1 };

typedef struct kv_seg_rec {
  uint32_t tier;
  uint32_t state;
  uint32_t owner_pid;
  uint64_t end;        /* bytes of the file covered by committed blocks (and their padding) */
  uint64_t live_bytes;
  uint64_t live_blocks;
} kv_seg_rec;

/* Sizes and encoders: dst must hold kv_*_rec_size() bytes. */
/* 36 bytes (version 1), or 40 with a RoPE (version 2, written only then). */
size_t kv_model_rec_size(const kv_model_rec *r);
void kv_model_rec_encode(const kv_model_rec *r, uint8_t *dst);
kvdb_status kv_model_rec_decode(const uint8_t *src, size_t len, kv_model_rec *r);
/* Model record version 3 (FORMAT.md §2): r's fields and calibration c (its geometry r's). */
size_t kv_model_rec_calib_size(const kv_model_rec *r, const kv_calib *c);
void kv_model_rec_encode_calib(const kv_model_rec *r, const kv_calib *c, uint8_t *dst);
/* The calibration of a model record (any version): out zeroed and KVDB_OK when it has none;
 * KVDB_CORRUPT (checksum, values) or KVDB_NOMEM; out is kv_calib_free()'s. */
kvdb_status kv_model_calib_decode(const uint8_t *src, size_t len, kv_calib *out);
/* Model record version 4 (FORMAT.md §2): r's fields, calibration c (NULL or one without
 * weights: none) and output gains g (NULL or g->g NULL: none). Writes version 4 only when g
 * holds gains, else what kv_model_rec_encode / kv_model_rec_encode_calib write. */
size_t kv_model_rec_full_size(const kv_model_rec *r, const kv_calib *c, const kv_model_gains *g);
void kv_model_rec_encode_full(const kv_model_rec *r, const kv_calib *c, const kv_model_gains *g,
                              uint8_t *dst);
/* The output gains of a model record (any version): out zeroed and KVDB_OK when it has none;
 * KVDB_CORRUPT (checksum, shape, values) or KVDB_NOMEM; out is kv_model_gains_free()'s. */
kvdb_status kv_model_gains_decode(const uint8_t *src, size_t len, kv_model_gains *out);

size_t kv_block_rec_size(uint32_t n_tokens);
void kv_block_rec_encode(const kv_block_rec *r, const uint32_t *tokens, uint8_t *dst);
kvdb_status kv_block_rec_decode(const uint8_t *src, size_t len, kv_block_rec *r);
/* Rows per (layer, KV head) block r stores: its kept tokens when it dropped tokens (either
 * form of offset 14, KV_BLK_KEPTN), else n_tokens. */
uint32_t kv_block_rec_kept(const kv_block_rec *r);

/* A raw context's record is version 1 (no config); others are version 2; one with has_stats
 * version 3 (whatever its config). */
size_t kv_ctx_rec_size(const kv_ctx_rec *r, uint32_t n_blocks);
void kv_ctx_rec_encode(const kv_ctx_rec *r, const uint8_t *blocks, uint8_t *dst);
kvdb_status kv_ctx_rec_decode(const uint8_t *src, size_t len, kv_ctx_rec *r);

size_t kv_seg_rec_size(void);
void kv_seg_rec_encode(const kv_seg_rec *r, uint8_t *dst);
kvdb_status kv_seg_rec_decode(const uint8_t *src, size_t len, kv_seg_rec *r);

/* A context's quality profile (FORMAT.md §2, profile record). */
#define KV_PROFILE_MAX_ENTRIES 256
typedef struct kv_profile_rec {
  uint32_t version; /* as decoded (0: new); encoded as version 2 when >= 2 or when an entry is
                       KVDB_PROFILE_WEIGHTED, else 1 */
  uint32_t n_probes;
  uint64_t measured_ms;
  uint32_t n_entries;
  kvdb_profile_entry e[KV_PROFILE_MAX_ENTRIES];
  /* not in the record: a predicted profile's group (PRIORS; 0 = none) and its bytes per token
   * per entry (n_entries <= KV_PRIOR_MAX_ENTRIES) */
  uint64_t prior;
  double prior_bpt[40];
} kv_profile_rec;
/* Marks the entry of config cfg as the stored one with `bytes` (added when absent). */
void kv_profile_rec_mark_stored(kv_profile_rec *p, const kvdb_config *cfg, uint64_t bytes);
size_t kv_profile_rec_size(const kv_profile_rec *r);
void kv_profile_rec_encode(const kv_profile_rec *r, uint8_t *dst);
kvdb_status kv_profile_rec_decode(const uint8_t *src, size_t len, kv_profile_rec *r);

static inline void kv_be64(uint8_t *p, uint64_t v)
{
  for (int i = 0; i < 8; i++)
    p[i] = (uint8_t)(v >> (56 - 8 * i));
}
static inline uint64_t kv_get_be64(const uint8_t *p)
{
  uint64_t v = 0;
  for (int i = 0; i < 8; i++)
    v = (v << 8) | p[i];
  return v;
}

/* The catalog environment and its databases. */
#define KV_CAT_OWN_IDS 64u

/* The LMDB handles (env: opaque, LMDB's MDB_env; the databases: MDB_dbi, which is unsigned
 * int) are the catalog's own: only the files of engine/catalog/ use them (catalog_int.h). */
typedef struct kv_catalog {
  struct kv_env *env;
  unsigned meta, models, blocks, children, contexts, atime, segments, profiles;
  unsigned next, segblocks; /* the block indexes (format 4, INDEXES) */
  int has_index;    /* they exist (absent in a catalog of format < 4 opened read-only) */
  int has_children; /* the legacy `children` database exists (format < 4) */
  int has_profiles; /* the profiles database exists (absent in a format-1 catalog opened read-only) */
  unsigned ctxstats; /* the placement policy's per-context records (CTXSTATS) */
  int has_ctxstats; /* it exists (absent in an older catalog opened read-only) */
  unsigned priors;  /* the groups' predicted profiles (PRIORS, format 7) */
  int has_priors;   /* it exists (absent in an older catalog opened read-only) */
  int rdonly;
  /* A read-only catalog opened without LMDB's lock file (kv_catalog_open: the lock file is not
   * writable by this user and no process had the database open): every read transaction
   * checks that the last committed transaction is still `nolock_txnid` (no writer came). */
  int nolock;
  uint64_t nolock_txnid;
  /* Stale reader slots (mdb_reader_check): write transactions clear them every
   * KV_READER_CHECK_EVERY begins or KV_READER_CHECK_MS milliseconds, whichever comes first. */
  _Atomic uint64_t wbegins;
  _Atomic uint64_t reader_check_ms;
  _Atomic uint64_t stale_readers; /* dead readers' slots cleared by this catalog */
  /* own-commit tracking (kv_cat_track_commits): the txn ids of this catalog's last commits */
  int track;
  pthread_mutex_t own_mu;
  uint64_t own_ids[KV_CAT_OWN_IDS];
  unsigned own_next;
  /* map growth (kv_txn_begin): LMDB remaps only while no transaction of this process is open,
   * so every transaction counts itself in map_active, and a resize waits for it to reach 0
   * while new outermost transactions wait for the resize (nested ones go on: no deadlock) */
  int map_sync;             /* map_mu / map_cv initialized */
  pthread_mutex_t map_mu;
  pthread_cond_t map_cv;
  unsigned map_active;      /* transactions open in this process on this environment */
  int map_resizing;
  _Atomic unsigned map_full_seen; /* kv_cat_map_full_events() when this catalog last looked */
  uint64_t map_grows;       /* how many times this handle grew the map */
  /* vacuum (kv_catalog_vacuum) */
  char *path;               /* the catalog file */
  unsigned env_flags;       /* the flags it was opened with */
  int lockfd;               /* its lock file, read-write handles (-1: none) */
  /* this process's open catalogs (kv_catalog_vacuum: another handle on the same file) */
  uint64_t file_dev, file_ino;
  struct kv_catalog *reg_next;
  int registered;
  /* the disk space reserved past the catalog's end (kv_cat_reserve) */
  pthread_mutex_t res_mu;
  uint64_t res_end;         /* the file's blocks are allocated up to here */
  int res_short;            /* the last extension failed (the disk is full) */
} kv_catalog;

#define KV_CAT_MAX_READERS 1024u
#define KV_READER_CHECK_EVERY 64u
#define KV_READER_CHECK_MS 1000u

/*
 * kv_catalog_open() - open or create the catalog in `dir`. A format version newer than this
 * build's is refused with KVDB_VERSION before anything is written. With rdonly the environment
 * is opened MDB_RDONLY; where this user cannot write the lock file (catalog.mdb-lock, or the
 * directory to create it), MDB_NOLOCK: only when no process has the database open (none holds
 * LMDB's lock on the lock file; else KVDB_BUSY naming the lock file), and every later read
 * transaction fails KVDB_BUSY once a writer has committed (see `nolock`). Stale reader slots
 * of dead processes are cleared at open (mdb_reader_check).
 */
kvdb_status kv_catalog_open(kv_catalog *c, const char *dir, uint64_t map_bytes, int rdonly,
                            int create, int nosync);
void kv_catalog_close(kv_catalog *c);
/* Clear the reader slots of dead processes now (mdb_reader_check); returns how many. */
int kv_cat_reader_check(kv_catalog *c);

/*
 * kv_catalog_vacuum() - rewrite the catalog in key order into a new file and put it in place of
 * the old one, as SQLite's VACUUM does, when the file is more than twice what such a rewrite
 * takes (estimated from each database's entries and the mean size of its first 256), or
 * always with `force`. LMDB never shrinks its file, and pages that deletes left partly empty
 * are merged only under a quarter full, so after deletes the file holds free and half-empty
 * pages; the rewrite packs the records into full pages (MDB_APPEND) and leaves no free ones.
 *
 * It runs only when this handle is the catalog's only user: no transaction of this process
 * open (it holds new ones back meanwhile, as a map resize does: other threads' calls wait for
 * it) and no other process with the environment open, known by taking the lock file's
 * exclusive fcntl lock — the lock LMDB's processes hold shared while they have it open (a
 * process that opens meanwhile waits for it, and then opens the new file). Otherwise it does
 * nothing: *done = 0, KVDB_OK. The new file is written beside the old one (catalog.mdb.vacuum),
 * synced, checked (every database has as many entries) and renamed over it; then this handle
 * reopens it. A crash before the rename leaves the old file (the .vacuum file is removed by the
 * next vacuum); after it, the new one. *before / *after: the file's bytes (optional).
 */
kvdb_status kv_catalog_vacuum(kv_catalog *c, int force, int *done, uint64_t *before,
                              uint64_t *after);

/*
 * The catalog's reserve: disk space allocated past the end of the catalog file (fallocate
 * KEEP_SIZE: the size does not change) so that LMDB, which grows the file as it writes new
 * pages, can still commit on a full disk. Before each outermost write transaction the
 * reserve is topped up to KV_CAT_RESERVE(used) bytes past the used pages whenever less than
 * half of it is left; when that fails (ENOSPC), the reserve is short, and writes that add data
 * (puts) are refused with KVDB_FULL while what is left goes to deletes and compaction, which
 * give space back. kv_cat_reserve_short() says so (with the message). No-op on read-only
 * handles and filesystems without fallocate.
 */
#define KV_CAT_RESERVE(used) ((uint64_t)(used) / 16 > (8u << 20) ? (uint64_t)(used) / 16 : (8u << 20))
kvdb_status kv_cat_reserve_short(kv_catalog *c);

/* How many MDB_MAP_FULL errors this process has seen (a put retries once after one). */
unsigned kv_cat_map_full_events(void);

/*
 * Begin a transaction (rdonly or write).
 *
 * MAP GROWTH. The LMDB map (catalog_map_bytes at open) grows: before an outermost write
 * transaction, when the catalog's used pages reach 3/4 of the map (or 1/2 after an
 * MDB_MAP_FULL in this process), the map is doubled (mdb_env_set_mapsize) until they are under
 * 3/4 of it. LMDB remaps only while no transaction of this process is open: the resize waits
 * for open ones to end and holds new outermost ones back meanwhile (a thread that already holds
 * a transaction is never held back, and never resizes). Another process that sees the bigger
 * map (MDB_MAP_RESIZED at begin) adopts it (mdb_env_set_mapsize(env, 0)) the same way and
 * begins again. The file grows only as pages are used: the map is address space.
 *
 * DEAD READERS. A read transaction that finds the reader table full clears dead readers' slots
 * and tries once more; every KV_READER_CHECK_EVERY write transactions (or KV_READER_CHECK_MS)
 * the slots of dead readers are cleared, so that a process killed inside a read transaction
 * does not pin its snapshot (and the pages it sees) forever.
 */
kvdb_status kv_txn_begin(kv_catalog *c, int write, kv_txn **out);

/* Commit (a write transaction, or a read one: ends it). With tracking on (below), a write
 * transaction first puts meta "wstamp" (so that no commit of this catalog is empty: each
 * successful one has a txn id of its own) and its id is recorded once committed. */
kvdb_status kv_txn_commit(kv_txn *txn);

/*
 * Own-commit tracking, for a view of the catalog kept between transactions that must know
 * whether anything else wrote meanwhile (placer.c): kv_cat_track_commits turns it on (a
 * read-write catalog; call before other threads use it). kv_cat_own_since(c, since, upto) is 1
 * when every transaction committed with an id in (since, upto] is one this catalog committed
 * through kv_txn_commit (recorded: at most KV_CAT_OWN_IDS of them), else 0: another handle or
 * process wrote, or too many commits to tell.
 */
kvdb_status kv_cat_track_commits(kv_catalog *c);
int kv_cat_own_since(kv_catalog *c, uint64_t since, uint64_t upto);

/* Typed gets: KVDB_NOTFOUND when absent, KVDB_CORRUPT when the record does not decode. */
kvdb_status kv_cat_get_block(kv_catalog *c, kv_txn *txn, const uint8_t hash[16], kv_block_rec *r);
kvdb_status kv_cat_get_ctx(kv_catalog *c, kv_txn *txn, const uint8_t key[16], kv_ctx_rec *r);
kvdb_status kv_cat_get_seg(kv_catalog *c, kv_txn *txn, uint64_t id, kv_seg_rec *r);
/* Segment records are written and deleted through these two only: they keep the counters of
 * COUNTS. A record that does not decode cannot be replaced or deleted (KVDB_CORRUPT). */
kvdb_status kv_cat_put_seg(kv_catalog *c, kv_txn *txn, uint64_t id, const kv_seg_rec *r);
kvdb_status kv_cat_del_seg(kv_catalog *c, kv_txn *txn, uint64_t id);
kvdb_status kv_cat_get_u64(kv_catalog *c, kv_txn *txn, const char *name, uint64_t *v);
/* Raise the catalog's format version to at least `version` in this write transaction (done
 * when the first format-2 record or block is committed). */
kvdb_status kv_cat_require_format(kv_catalog *c, kv_txn *txn, uint64_t version);
/* The profile of a context: its profile record, else the one synthesized from its group's
 * prior record (PRIORS: its ctxstats record names the group; r->prior set); KVDB_NOTFOUND when
 * it has neither. r is big (~16 KiB). (ctxstats.c) */
kvdb_status kv_cat_get_profile(kv_catalog *c, kv_txn *txn, const uint8_t key[16],
                               kv_profile_rec *r);
/* Its profile record alone (catalog.c). */
kvdb_status kv_cat_get_profile_rec(kv_catalog *c, kv_txn *txn, const uint8_t key[16],
                                   kv_profile_rec *r);
kvdb_status kv_cat_put_profile(kv_catalog *c, kv_txn *txn, const uint8_t key[16],
                               const kv_profile_rec *r);
kvdb_status kv_cat_put_u64(kv_catalog *c, kv_txn *txn, const char *name, uint64_t v);

/* ==== the schema's users (catalog-schema): counts.c, index.c, ctxstats.c ==== */

/*
 * COUNTS (counts.c): counters kvdb_stat reads instead of scanning the catalog (meta
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

/*
 * INDEXES (index.c): the catalog's two indexes of block records (format 4, FORMAT.md §2):
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

/* The catalog format that carries these indexes (meta "format"). */
#define KV_FORMAT_INDEXES 4u
#define KV_FORMAT_FRAMES 5u /* lossless frames: block format 3 (FORMAT.md §3d) */
#define KV_FORMAT_SCOREV2 6u /* version-2 score copies (FORMAT.md §3c): block flag bit 4 */
#define KV_FORMAT_PACKED 7u  /* packed raw objects (FORMAT.md §3e): block flag bit 5 */
#define KV_FORMAT_KEPTN 8u   /* context-exact keep counts (FORMAT.md §2): block flag bit 6 */
#define KV_FORMAT_PCPR 9u    /* packed compressed objects (FORMAT.md §3f): flag bit 5 with bit 0 */

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

/*
 * CTXSTATS (ctxstats.c): what the placement policy keeps per context in the catalog
 * (the `ctxstats` database), and the catalog's meta entries of the policy: the SmartSSD
 * tier's directory and the cached tier read figures (FORMAT.md §2).
 *
 * A ctxstats record holds a context's decayed access count (EvicPress §4.2's "frequency": a
 * count halved every half-life, kept as of `freq_ms`) and where the policy placed it (the tier
 * of its persistent copy, and whether the DRAM tier is to hold it). Records are advisory: a
 * context without one counts as accessed once at its last access time; a record whose context
 * is gone is ignored (and removed by the next rebalance).
 *
 * Pure codecs and typed gets/puts, like catalog.h; the databases are opened by catalog.c.
 */

#define KV_CTXSTATS_REC_VERSION 2u /* 2: with a prior reference (format 7, PRIORS) */
#define KV_CTXSTATS_REC_BYTES 32u  /* version 1 */
#define KV_CTXSTATS_REC_BYTES_V2 40u
#define KV_CTXSTATS_REC_MAX 40u

/* kv_ctxstats (CTXSTATS, below) */

/* Version 1 (32 bytes) when r->prior is 0, else version 2 (40 bytes); returns the size. */
size_t kv_ctxstats_encode(const kv_ctxstats *r, uint8_t dst[KV_CTXSTATS_REC_MAX]);
kvdb_status kv_ctxstats_decode(const uint8_t *src, size_t len, kv_ctxstats *r);

/*
 * PRIORS (ctxstats.c, format 7): a put whose profile was predicted from its group's measured
 * profiles (place/prior.c) records no profile record: its ctxstats record (written by the
 * put's own transaction anyway) names its group, and the group's prediction is one record of
 * the `priors` database (key: the group key, u64 BE), rewritten only when the prediction
 * changes. A context's profile is then its profile record when it has one, else the one
 * synthesized from its group's prior record (kv_cat_get_profile): per entry the prior's
 * quality and rel_l2, bytes = bytes per token x the context's tokens, the stored config
 * marked with the context record's bytes, n_probes 0 (predicted). A writer of the profile
 * (re-profiling, reports, relocation) writes a profile record, which takes precedence.
 */
#define KV_FORMAT_PRIORS 7u
#define KV_PRIOR_REC_VERSION 1u
#define KV_PRIOR_MAX_ENTRIES 40u /* a larger prediction is written as a profile record */
#define KV_PRIOR_HDR 16u
#define KV_PRIOR_ENT 40u
size_t kv_prior_rec_size(uint32_t n_entries);
/* The prior record of profile p (p->e[i].config, quality, rel_l2; p->prior_bpt[i]). */
void kv_prior_rec_encode(const struct kv_profile_rec *p, uint8_t *dst);
/* Into p: n_entries, measured_ms, e[i] (config, quality, rel_l2, reported NaN), prior_bpt[i]. */
kvdb_status kv_prior_rec_decode(const uint8_t *src, size_t len, struct kv_profile_rec *p);
/* The prior record of group `key` (KVDB_NOTFOUND: none, or no priors database). */
kvdb_status kv_cat_get_prior(kv_catalog *c, kv_txn *txn, uint64_t key, struct kv_profile_rec *p);
/* In the put's transaction: predicted profile p (p->prior != 0) recorded by reference: the
 * group's prior record written when it differs from p's, the context's ctxstats record created
 * or updated with the reference (its counts unchanged), any profile record of key deleted, the
 * catalog raised to format 7. */
kvdb_status kv_cat_put_profile_ref(kv_catalog *c, kv_txn *txn, const uint8_t key[16],
                                   const struct kv_profile_rec *p, uint64_t now_ms);

/* The decayed count of r as of now_ms, with half-life half_life_ms (<= 0: no decay). */
double kv_ctxstats_freq_at(const kv_ctxstats *r, uint64_t now_ms, double half_life_ms);

/* Typed access; KVDB_NOTFOUND when absent (also when the catalog has no ctxstats database:
 * a format-1/2 catalog opened read-only). Puts need the database (KVDB_READONLY without).
 * FOLDED STATS (format 7): a context put with placement on has a version-3 context record
 * that carries its statistics; they are its ctxstats until it has a ctxstats record: get
 * reads the record, else the context record's; put writes the record when there is one, else
 * into a version-3 context record (so a put's own statistics and later accesses add no page
 * of the ctxstats tree), else creates the record. */
kvdb_status kv_cat_get_ctxstats(kv_catalog *c, kv_txn *txn, const uint8_t key[16],
                                kv_ctxstats *r);
kvdb_status kv_cat_put_ctxstats(kv_catalog *c, kv_txn *txn, const uint8_t key[16],
                                const kv_ctxstats *r);
kvdb_status kv_cat_del_ctxstats(kv_catalog *c, kv_txn *txn, const uint8_t key[16]);
/* Whether key has a ctxstats record of its own (not folded into its context record). */
int kv_cat_has_ctxstats_rec(kv_catalog *c, kv_txn *txn, const uint8_t key[16]);

/* One access at now_ms: decay, + 1, count it (creating the record, tier SSD, when absent). */
kvdb_status kv_cat_touch_ctxstats(kv_catalog *c, kv_txn *txn, const uint8_t key[16],
                                  uint64_t now_ms, double half_life_ms);

/* Meta strings (a NUL-free byte string up to cap - 1 bytes, NUL added). KVDB_NOTFOUND when
 * absent, KVDB_CORRUPT when too long or holding a NUL. */
kvdb_status kv_cat_get_str(kv_catalog *c, kv_txn *txn, const char *name, char *buf, size_t cap);
kvdb_status kv_cat_put_str(kv_catalog *c, kv_txn *txn, const char *name, const char *v);

/* Meta blobs of fixed size (the tier figures): KVDB_CORRUPT when the size differs. */
kvdb_status kv_cat_get_blob(kv_catalog *c, kv_txn *txn, const char *name, void *buf, size_t len);
kvdb_status kv_cat_put_blob(kv_catalog *c, kv_txn *txn, const char *name, const void *buf,
                            size_t len);

/* ==== end of the schema's users ==== */

/* ---- records of seg/track/place (place_rec.c): the floors seg, track, place, db ---- */

/* 1 when context key has a record as of txn; 0 when not, or when LMDB fails (no message). */
int kv_cat_has_ctx(kv_catalog *c, kv_txn *txn, const uint8_t key[16]);
/* In a write transaction: set context key's last access to ms when that is later than its
 * record's (rewrites the record, moves its access-time entry); KVDB_OK and nothing done when
 * the context is gone or ms is not later. Through kv_cat_get_ctx, kv_cat_del_atime_at and
 * kv_cat_put_ctx_atime (ops_rec.c: the record encoded on the stack up to 240 blocks). */
kvdb_status kv_cat_ctx_set_access(kv_catalog *c, kv_txn *txn, const uint8_t key[16], uint64_t ms);
/* Read meta entry `name` (a string without NUL, shorter than cap) as last committed, in a read
 * transaction of its own: 1 with buf set (NUL-terminated), 0 when absent, too long or LMDB
 * fails. Sets no error message (callers may be cleaning up after one). */
int kv_cat_peek_meta_str(kv_catalog *c, const char *name, char *buf, size_t cap);

/* ---- end of records of seg/track/place ---- */

/* ---- the typed API (see THE TYPED CATALOG API at the top; iter.c) ---- */

/* End a transaction without committing (a read one, or a write one undone); NULL: no-op. */
void kv_txn_abort(kv_txn *txn);
/* The transaction's id (LMDB's txnid: the snapshot a read one sees). */
uint64_t kv_txn_id(kv_txn *txn);
/* The oldest snapshot any reader of the environment holds (any process: LMDB's reader
 * table; the caller's own open read transactions count), UINT64_MAX when no slot is used. */
uint64_t kv_cat_oldest_reader(kv_catalog *c);

typedef enum kv_cat_table {
  KV_TBL_META,
  KV_TBL_MODELS,
  KV_TBL_BLOCKS,
  KV_TBL_CONTEXTS,
  KV_TBL_ATIME,
  KV_TBL_SEGMENTS,
  KV_TBL_PROFILES,
  KV_TBL_CTXSTATS,
  KV_TBL_NEXT,
  KV_TBL_SEGBLOCKS,
  KV_TBL_CHILDREN
} kv_cat_table;

/* Bytes of a catalog entry, pointing into the map (valid as the transaction). */
typedef struct kv_cat_bytes {
  const uint8_t *data;
  size_t size;
} kv_cat_bytes;

typedef struct kv_cat_iter {
  kv_cat_bytes key, val; /* the current entry, after kv_cat_iter_next returned 1 */
  kvdb_status err;       /* KVDB_OK, or the LMDB failure that ended the iteration */
  /* the catalog's (iter.c) */
  void *cur_;
  const char *what_;
  int state_, dups_;
} kv_cat_iter;

kvdb_status kv_cat_iter_open(kv_catalog *c, kv_txn *txn, kv_cat_table t, kv_cat_iter *it,
                             const char *what);
kvdb_status kv_cat_iter_open_dups(kv_catalog *c, kv_txn *txn, kv_cat_table t, const void *key,
                                  size_t key_len, kv_cat_iter *it, const char *what);
/* The segment index's entries for segment `seg`: it.val is a block hash (16 bytes). */
kvdb_status kv_cat_iter_seg_index(kv_catalog *c, kv_txn *txn, uint64_t seg, kv_cat_iter *it,
                                  const char *what);
int kv_cat_iter_next(kv_cat_iter *it);
/* Delete the current entry (a write transaction). */
kvdb_status kv_cat_iter_del(kv_cat_iter *it);
void kv_cat_iter_close(kv_cat_iter *it);
/* The current entry decoded: blocks and contexts have 16-byte keys, segments 8-byte ones
 * (KVDB_CORRUPT naming the size otherwise); then the record's decoder. */
kvdb_status kv_cat_iter_block(const kv_cat_iter *it, kv_block_rec *r);
kvdb_status kv_cat_iter_ctx(const kv_cat_iter *it, kv_ctx_rec *r);
kvdb_status kv_cat_iter_seg(const kv_cat_iter *it, uint64_t *id, kv_seg_rec *r);

/* Entries in table t (*n = 0 for an absent one). */
kvdb_status kv_cat_count(kv_catalog *c, kv_txn *txn, kv_cat_table t, uint64_t *n);
/* Raw entries (see above). kv_cat_get_raw: KVDB_NOTFOUND without a message when absent. */
kvdb_status kv_cat_get_raw(kv_catalog *c, kv_txn *txn, kv_cat_table t, const void *key,
                           size_t key_len, kv_cat_bytes *val);
kvdb_status kv_cat_put_raw(kv_catalog *c, kv_txn *txn, kv_cat_table t, const void *key,
                           size_t key_len, const void *val, size_t val_len, const char *what);
kvdb_status kv_cat_del_raw(kv_catalog *c, kv_txn *txn, kv_cat_table t, const void *key,
                           size_t key_len, const char *what);

/* Typed puts and deletes (no counters kept: see above). kv_cat_put_block encodes r with the
 * tokens r->tokens points to. */
kvdb_status kv_cat_put_block(kv_catalog *c, kv_txn *txn, const uint8_t hash[16],
                             const kv_block_rec *r);
kvdb_status kv_cat_del_block(kv_catalog *c, kv_txn *txn, const uint8_t hash[16]);
kvdb_status kv_cat_del_ctx(kv_catalog *c, kv_txn *txn, const uint8_t key[16]);
kvdb_status kv_cat_del_profile(kv_catalog *c, kv_txn *txn, const uint8_t key[16]);
/* Delete context key's access-time entry: (ms, key) when ms is given and there, else the
 * entry found by a scan of the table (linear: for repairs). KVDB_NOTFOUND when none. */
kvdb_status kv_cat_del_atime(kv_catalog *c, kv_txn *txn, const uint8_t key[16],
                             const uint64_t *ms);

/* ==== THE OPERATIONS FLOOR'S RECORDS (engine/catalog/ops_rec.c) ====
 * Typed gets and puts of the records engine/ops reads and writes beyond those above: model
 * records, context records and their access-time entries, a profile's presence. Like the
 * typed API above: KVDB_NOTFOUND without a message when absent, every other failure with a
 * message (kv_mdb_fail); no counters kept (the callers call kv_counts_add); no transactions
 * of their own; no allocation except a context record of more than 240 blocks (encoded on the
 * stack below that). */

/* The model record stored under `id` (a NUL-terminated model id), decoded into *r. */
kvdb_status kv_cat_get_model(kv_catalog *c, kv_txn *txn, const char *id, kv_model_rec *r);
/* Store model record r under `id` (replacing one there). */
kvdb_status kv_cat_put_model(kv_catalog *c, kv_txn *txn, const char *id, const kv_model_rec *r);
/* The model record of id with calibration cal (version 3), replacing the one stored. */
kvdb_status kv_cat_put_model_calib(kv_catalog *c, kv_txn *txn, const char *id,
                                   const kv_model_rec *r, const kv_calib *cal);
/* The model record of id with calibration cal and output gains g (either NULL: none),
 * replacing the one stored (version 4 when g holds gains). */
kvdb_status kv_cat_put_model_full(kv_catalog *c, kv_txn *txn, const char *id,
                                  const kv_model_rec *r, const kv_calib *cal,
                                  const kv_model_gains *g);
/* The stored output gains of model id: KVDB_NOTFOUND (no model), KVDB_OK (out zeroed when it
 * has none), KVDB_CORRUPT. */
kvdb_status kv_cat_get_model_gains(kv_catalog *c, kv_txn *txn, const char *id,
                                   kv_model_gains *out);
/* The stored calibration of model id (ops_rec.c): KVDB_NOTFOUND (no model), KVDB_OK (out zeroed
 * when the model has none), KVDB_CORRUPT. */
kvdb_status kv_cat_get_model_calib(kv_catalog *c, kv_txn *txn, const char *id, kv_calib *out);
/* Store context record r under key, with its r->n_blocks block hashes `blocks` (16 bytes
 * each; they may point into the map, e.g. the blocks of the record being replaced: the record
 * is encoded before it is written). Its access-time entry is not touched. */
kvdb_status kv_cat_put_ctx(kv_catalog *c, kv_txn *txn, const uint8_t key[16], const kv_ctx_rec *r,
                           const uint8_t *blocks);
/* kv_cat_put_ctx and the context's access-time entry at r->last_access_ms (a new context:
 * invariant C4; an entry at an older time is the caller's to delete, kv_cat_del_atime_at). */
kvdb_status kv_cat_put_ctx_atime(kv_catalog *c, kv_txn *txn, const uint8_t key[16],
                                 const kv_ctx_rec *r, const uint8_t *blocks);
/* The access-time entry (ms, key) alone: put, or deleted (KVDB_NOTFOUND when not there; no
 * scan, unlike kv_cat_del_atime). */
kvdb_status kv_cat_put_atime(kv_catalog *c, kv_txn *txn, const uint8_t key[16], uint64_t ms);
kvdb_status kv_cat_del_atime_at(kv_catalog *c, kv_txn *txn, const uint8_t key[16], uint64_t ms);
/* 1 when a profile is recorded for context key, else 0 (also on a failure to read: the
 * caller only reports the presence). */
int kv_cat_has_profile(kv_catalog *c, kv_txn *txn, const uint8_t key[16]);
/* ==== end of THE OPERATIONS FLOOR'S RECORDS ==== */

#endif
