/* SPDX-License-Identifier: MIT */
/**
 * @file kvdb.h
 * @brief kvdb — an embeddable, persistent, transactional store for LLM KV caches.
 *
 * This header is the whole public API. Anything not declared here is private and may change.
 *
 * Model of use. A serving engine puts the KV of a prompt (kvdb_put); later — another request,
 * another process, after a reboot — it asks how many leading tokens of a new prompt are stored
 * (kvdb_lookup) and copies that prefix's KV into its own buffers (kvdb_get), then prefills only
 * the rest. KV is stored in blocks of `block_tokens` tokens addressed by a chained hash
 *
 *     h_{-1} = XXH3_128(model fingerprint),   h_i = XXH3_128(h_{i-1} || tokens of block i)
 *
 * so equal prefixes share blocks (stored once, refcounted). Every block also stores its own
 * tokens and every hit is verified against them: a hash collision or a stale entry is a miss,
 * never wrong KV. Every byte read from disk is verified by an XXH3-64 checksum.
 *
 * Durability. With KVDB_SYNC_FULL (the default) a put that returned KVDB_OK survives a process
 * crash and a power loss: block data is written and fdatasync'ed before the LMDB catalog
 * transaction that publishes it commits (and LMDB syncs that commit).
 *
 * Threading. One kvdb handle may be used from any number of threads at once. Several processes
 * may open the same database directory at once; each writer appends to its own segment file,
 * so the only cross-process lock is LMDB's short catalog write lock. A process that dies inside
 * a read transaction (SIGKILL during a lookup) leaves an LMDB reader slot behind, which would pin
 * its snapshot and keep the catalog from reusing freed pages; as LMDB's own tools do
 * (mdb_reader_check), kvdb clears the slots of dead processes when it opens a database, every
 * 64 write transactions or second of them, and when a read finds all 1,024 slots taken (then it
 * retries once; slots held by live readers give KVDB_BUSY).
 *
 * Errors. Every function that can fail returns a kvdb_status. After a failure,
 * kvdb_errmsg() returns a message for the calling thread that names what was wrong
 * (the argument, the file, the offset, the block). Values of kvdb_status are pinned.
 *
 * Memory. kvdb never keeps a pointer to caller memory after a call returns. Output buffers are
 * the caller's, described by a kvdb_kv_view.
 */
/*
 * Contents. Part I is the core, enough for a cache: open a database, put a context's KV, look up
 * and get a prefix of it, delete it, list contexts, read statistics, verify and compact. Part II
 * is the rest, each part on its own.
 *
 *   Part I: the core
 *     1. Status codes and errors          kvdb_status, kvdb_errmsg
 *     2. Model fingerprint, keys          kvdb_model, kvdb_key, kvdb_chain_hashes
 *     3. Caller buffers                   kvdb_kv_view, kvdb_kv_view_packed
 *     4. Opening and closing              kvdb_options, kvdb_open, kvdb_close
 *     5. Put, lookup, get, delete         kvdb_put, kvdb_lookup, kvdb_get, kvdb_delete
 *     6. Compression configs              kvdb_config (a context's storage config), parse, name
 *     7. Contexts and statistics          kvdb_iter_*, kvdb_context_stat, kvdb_stat
 *     8. Verification, repair, compaction kvdb_verify, kvdb_repair, kvdb_segments, kvdb_compact
 *   Part II: the rest
 *     9. Put options, partial reads       kvdb_put_ex, kvdb_get_context, kvdb_get_tokens
 *    10. Explicit keys                    kvdb_put_block, kvdb_get_block, kvdb_block_context
 *    11. Tiers and placement              kvdb_tier_probe, kvdb_rebalance_*, kvdb_placement_stat,
 *                                         kvdb_remote_stat, kvdb_metrics
 *    12. Quality profiles, re-encoding    kvdb_profile*, kvdb_report_quality, kvdb_recompress,
 *                                         kvdb_relocate
 *   12b. Calibration of int4 and int2    kvdb_model_calibrate, kvdb_model_calibration (a
 *                                         model's KVQuant calibration, stored with it),
 *                                         kvdb_model_set_output_gains, kvdb_model_output_gains
 *                                         (what the profile weighs heads by)
 *    13. Top-k token scoring              kvdb_score, kvdb_score_batch, kvdb_get_head_tokens
 *    14. Keys as text                     kvdb_key_hex, kvdb_key_parse
 *    15. Prefetch, gets that stream       kvdb_prefetch*, kvdb_get_notify, kvdb_get_lend,
 *                                         kvdb_lent_return, kvdb_dram_memory (GPU destinations:
 *                                         gpu/kvdb_gpu.h, the optional libkvgpu)
 *    16. Decoding from the store          kvdb_decode_* (appends, per-step top-k, hot pools),
 *                                         kvdb_append
 */
#ifndef KVDB_H
#define KVDB_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__) && __GNUC__ >= 4
#define KVDB_API __attribute__((visibility("default")))
#else
#define KVDB_API
#endif

#define KVDB_VERSION_MAJOR 0
#define KVDB_VERSION_MINOR 1
#define KVDB_VERSION_PATCH 0
#define KVDB_VERSION_NUMBER (KVDB_VERSION_MAJOR * 10000 + KVDB_VERSION_MINOR * 100 + KVDB_VERSION_PATCH)

/** @brief Run-time library version; compare with KVDB_VERSION_NUMBER. Cannot fail. */
KVDB_API unsigned kvdb_version_number(void);

/**
 * @brief The newest on-disk format version this build reads and writes. A new database is
 * created at version 4 (its catalog keeps two indexes of its blocks that every writer must
 * maintain, so builds that know only versions 1-3 refuse it with KVDB_VERSION). A database of
 * version 1-3 written by an earlier build opens: read-write, the open upgrades it to version 4
 * in one transaction (builds its indexes); read-only, it is read as it is (a lookup then scans
 * all the children of its last matched block). A database becomes version 5 with its first
 * block of lossless frames, version 6 with its first block carrying version-2 score copies and
 * version 7 with its first packed raw block (objects at 64-byte offsets, format/FORMAT.md §3e)
 * or its first put with placement on (its statistics in its context record, a predicted
 * profile by reference to its group's record; FORMAT.md §2), version 8 with its first block
 * that records its exact kept tokens, version 9 with its first packed compressed block (block
 * format 5, FORMAT.md §3f): builds that know less refuse it with KVDB_VERSION.
 */
#define KVDB_FORMAT_VERSION 9

/* =================================== Part I: the core ===================================== */

/* ------------------------------------------------------------------------------------------ */
/** @defgroup status Status codes. Values are pinned: never renumbered or reused. */
typedef enum kvdb_status {
  KVDB_OK = 0,
  KVDB_NOTFOUND = 1,    /**< key or context absent (a miss, not a fault) */
  KVDB_INVALID = 3,     /**< bad argument; kvdb_errmsg() names it */
  KVDB_MISUSE = 4,      /**< wrong state, e.g. a write on a read-only handle */
  KVDB_NOMEM = 5,       /**< allocation failed */
  KVDB_FULL = 6,        /**< disk full (ENOSPC/EDQUOT) or a tier capacity that cannot be met */
  KVDB_BUSY = 7,        /**< a resource is held by someone else; retry */
  KVDB_IOERR = 8,       /**< an operating-system I/O error; kvdb_errmsg() has the errno text */
  KVDB_CORRUPT = 9,     /**< stored bytes failed validation (checksum, magic, bounds) */
  KVDB_VERSION = 10,    /**< the database was written by a newer on-disk format; nothing written */
  KVDB_UNSUPPORTED = 11,/**< feature not available in this build or on this machine */
  KVDB_MISMATCH = 12,   /**< the model shape differs from the one stored under that id */
  KVDB_READONLY = 13,   /**< the database or its directory cannot be written */
  KVDB_PANIC = 14,      /**< internal invariant broken; close the handle */
} kvdb_status;

/** @brief Short static name of a status, e.g. "KVDB_CORRUPT". Never NULL. Cannot fail. */
KVDB_API const char *kvdb_status_name(kvdb_status rc);
/** @brief Static English description of a status. Never NULL. Cannot fail. */
KVDB_API const char *kvdb_strerror(kvdb_status rc);
/**
 * @brief The message of the last failed kvdb call on this thread, naming what was wrong
 * (e.g. "checksum mismatch in segment 3 at offset 1048576 (block 5f3a…, section 17)").
 * Never NULL; "" when no call has failed on this thread. The string is owned by kvdb and is
 * valid until the next kvdb call on the same thread.
 */
KVDB_API const char *kvdb_errmsg(void);

/* ------------------------------------------------------------------------------------------ */
/** @defgroup model Model fingerprint */

/** Element type of the stored K and V. Values are pinned (they are stored on disk). */
typedef enum kvdb_dtype { KVDB_F16 = 1, KVDB_BF16 = 2, KVDB_F32 = 3 } kvdb_dtype;

/**
 * The shape of a model's KV cache. Everything stored belongs to exactly one fingerprint
 * (all fields together); every call on a database with a model whose `id` is stored with
 * another shape fails with KVDB_MISMATCH, its message naming both shapes (put, put_ex,
 * put_block, lookup, get, get_block, get_tokens, get_context, get_head_tokens, score,
 * score_batch, profile, recompress, relocate), so that a misconfigured model is not taken for a
 * cold cache. An id that is not stored at all is a miss (lookup and get: 0 hit tokens).
 * Passed by pointer to each call; not retained.
 */
typedef struct kvdb_model {
  const char *id;        /**< model id, 1..63 bytes, e.g. "meta-llama/Meta-Llama-3-8B" */
  uint32_t n_layers;     /**< 1..1024 */
  uint32_t n_kv_heads;   /**< 1..1024 */
  uint32_t head_dim;     /**< 1..4096 */
  kvdb_dtype dtype;      /**< KVDB_F16, KVDB_BF16 or KVDB_F32 */
  uint32_t block_tokens; /**< tokens per block: a power of two from 16 to 4096; 0 = 256 */
  /**
   * 0 (default): no scoring. 8 or 4: every block also stores an int8 or int4 copy of its keys
   * (one scale per token) that kvdb_score ranks tokens on (4 needs an even head_dim). Part of
   * the fingerprint: contexts put with and without score copies never share blocks, and one
   * id keeps one value (else KVDB_MISMATCH).
   */
  uint32_t score_bits;
  /**
   * Optional, 0 = not given: the model's RoPE, which lets int4 and int2 quantize K before
   * RoPE (KVQuant's pre-RoPE keys: the keys are un-rotated at put and re-rotated at get, so
   * each channel keeps its range instead of spinning through it; token i of a context is taken
   * to sit at position i). rope_base: the base (theta, e.g. 10000 or 500000), 1 < base <= 1e9;
   * rope_style: KVDB_ROPE_ADJACENT (channel pairs 2i, 2i+1: llama2.c, GPT-J) or KVDB_ROPE_HALF
   * (pairs i, i + head_dim/2: NeoX, Hugging Face Llama); both 0 or both set, head_dim even.
   * Without them K is quantized as stored (after RoPE). Not part of the fingerprint: the KV is
   * the same either way, and every stored section records how it was coded. The first put of a
   * model id records them with its model (kvdb_model_get; re-encoding uses them).
   */
  float rope_base;
  uint32_t rope_style;
} kvdb_model;

/** kvdb_model.rope_style. Values are pinned (stored in the model record). */
enum { KVDB_ROPE_NONE = 0, KVDB_ROPE_ADJACENT = 1, KVDB_ROPE_HALF = 2 };

/** @brief Bytes of K and V of one token for all layers and heads. Cannot fail (0 if m is bad). */
KVDB_API size_t kvdb_model_token_bytes(const kvdb_model *m);

/** A 128-bit key: a block hash, a context key, or a caller's own block key. */
typedef struct kvdb_key {
  uint8_t b[16];
} kvdb_key;

/**
 * @brief Compute the chained block hashes of `tokens` (no I/O). `hashes` receives
 * ceil(n / block_tokens) keys (the last one covers a trailing partial block); the last one is
 * also the context key kvdb_put reports. @return KVDB_OK, KVDB_INVALID (also hashes_cap below
 * that count, for any n up to SIZE_MAX: nothing is written to `hashes` then).
 */
KVDB_API kvdb_status kvdb_chain_hashes(const kvdb_model *m, const uint32_t *tokens, size_t n,
                                       kvdb_key *hashes, size_t hashes_cap);

/* ------------------------------------------------------------------------------------------ */
/** @defgroup view Caller buffers: a layout described by strides, so no copy is ever needed */

/**
 * Where element [layer][token][head][dim] of K (or V) lives:
 *   (layer_bases ? layer_bases[layer] : base + layer * layer_stride)
 *     + token * token_stride + head * head_stride + dim * dim_stride      (bytes)
 * dim_stride 0 means the dtype size (dims contiguous, the fast path). Strides may be negative.
 * `layer_bases` (n_layers pointers) serves callers whose layers are separate allocations
 * (Hugging Face past_key_values). For kvdb_get_tokens the layer coordinate is not used
 * (layer 0's address is used) and "token" is the index into the positions array.
 */
typedef struct kvdb_tensor_view {
  void *base;
  void *const *layer_bases;
  int64_t layer_stride;
  int64_t token_stride;
  int64_t head_stride;
  int64_t dim_stride;
} kvdb_tensor_view;

/** K and V separately, so layouts where they differ (llama.cpp's transposed V) also work. */
typedef struct kvdb_kv_view {
  kvdb_tensor_view k;
  kvdb_tensor_view v;
} kvdb_kv_view;

/** Packed layouts for kvdb_kv_view_packed(). */
typedef enum kvdb_layout {
  KVDB_LAYOUT_LKTHD = 1, /**< [layer][K,V][token][head][dim] (vLLM/LMCache-like) */
  KVDB_LAYOUT_LKHTD = 2, /**< [layer][K,V][head][token][dim] (Hugging Face-like) */
} kvdb_layout;

/**
 * @brief Fill *view for a packed buffer of `n_tokens` tokens in `layout`.
 * The buffer must hold n_tokens * kvdb_model_token_bytes(m) bytes. No memory is touched.
 * @return KVDB_OK, KVDB_INVALID (bad model or layout, NULL pointer, n_tokens whose buffer would
 *   exceed 2^63 bytes).
 */
KVDB_API kvdb_status kvdb_kv_view_packed(kvdb_kv_view *view, void *base, const kvdb_model *m,
                                         size_t n_tokens, kvdb_layout layout);

/* ------------------------------------------------------------------------------------------ */
/** @defgroup open Opening and closing */

typedef struct kvdb kvdb;

/**
 * kvdb_options.flags; any other bit is KVDB_INVALID.
 *
 * KVDB_O_RDONLY needs read access only. Where this user can write the catalog's lock file
 * (catalog.mdb-lock), the handle is an ordinary LMDB reader: it reads while other processes
 * write. Where it cannot (another user's database, a read-only medium), it reads without the
 * lock file (LMDB's MDB_NOLOCK), which is safe only while no process writes: LMDB's writers may
 * then reuse the pages such a reader is reading. So, much as SQLite's "immutable" databases
 * are only for files nobody changes, kvdb checks it: the open is refused with KVDB_BUSY,
 * naming the lock file and the fix (give this user write access to the lock file, or open
 * while no process has the database open), while any process has the database open (holds
 * LMDB's lock on the lock file); and every later call that reads the catalog fails KVDB_BUSY
 * ("reopen") once a writer has committed since the open. Not covered: a writer that opens the
 * database and commits twice during one single call of such a handle (one read transaction).
 */
enum {
  KVDB_O_CREATE = 1u << 0, /**< create the database directory and catalog if absent (default) */
  KVDB_O_RDONLY = 1u << 1, /**< open read-only: no write of any kind, not even recovery */
};

typedef enum kvdb_sync_mode {
  KVDB_SYNC_FULL = 0, /**< (default) data fdatasync'ed, then the catalog commit synced */
  KVDB_SYNC_NONE = 1, /**< no syncs: survives a process crash, not a power loss */
} kvdb_sync_mode;

typedef enum kvdb_tier {
  KVDB_TIER_DRAM = 0,     /**< volatile, per process, inclusive over the persistent tiers */
  KVDB_TIER_SSD = 1,      /**< persistent segment files */
  KVDB_TIER_SMARTSSD = 2, /**< persistent + near-data scoring (kvdb_score_opts.device) */
  KVDB_TIER_COUNT = 3,
} kvdb_tier;

/** How fast a tier reads (the placement's TTFT model). */
typedef struct kvdb_tier_perf {
  double read_bps;        /**< sequential read bandwidth, bytes per second; 0 = no such tier */
  double latency_s;       /**< one small read, seconds */
  uint64_t probed_unix_ms;/**< when the probe ran (0 for DRAM: measured at each open) */
  uint64_t reads;         /**< cold reads of this handle that refined the figures since */
} kvdb_tier_perf;

/** How contexts are placed on the tiers (kvdb_options.placement). */
typedef enum kvdb_placement {
  KVDB_PLACEMENT_OFF = 0,       /**< as asked: puts store with their config on the SSD tier, the
                                     DRAM tier caches what gets read (least recently used first)
                                     and ssd_bytes evicts least recently used contexts */
  KVDB_PLACEMENT_EVICPRESS = 1, /**< EvicPress's utility and tiers (seed 004 §4.2-§4.4),
                                     placed by the library's default rule: the greedy by least
                                     utility drop per byte freed, a new context starting on the
                                     tier where it is worth most, then a refill pass and the
                                     best-single-context guard (policy/policy.h THE DEFAULT
                                     RULE); promotes a context to the DRAM tier on a get when
                                     its utility there beats a context cached now (see
                                     placement below). Until version 0.1 (issue 17) this was Algorithm 1: that is
                                     KVDB_PLACEMENT_LEAST_DROP now */
  KVDB_PLACEMENT_PER_BYTE = 2,  /**< the per-byte greedy alone (no refill, no guard) */
  KVDB_PLACEMENT_LEAST_DROP = 3,/**< the paper's rule: EvicPress Algorithm 1 (seed 004 Appendix
                                     A, cascading as §4.4 says), the operation of least utility
                                     drop first; a new context starts on the top tier */
} kvdb_placement;

/** Log callback: level 0 error, 1 warning, 2 info. `msg` is valid during the call only. */
typedef void (*kvdb_log_fn)(void *ctx, int level, const char *msg);

/**
 * Options for kvdb_open(). Always call kvdb_options_init() first, then change fields.
 * Fields are only ever added at the end; `struct_size` lets an old caller use a newer library.
 */
/** kvdb_options.remote_hash_tag values. */
enum { KVDB_REMOTE_TAG_NONE = 0, KVDB_REMOTE_TAG_ROOT = 1 };

/** Bits of kvdb_options.remote_write: when blocks are written to the remote tier. */
enum {
  KVDB_REMOTE_WRITE_PUT = 1u,   /**< a put's new blocks, queued for the handle's thread */
  KVDB_REMOTE_WRITE_EVICT = 2u, /**< a context the placement evicts from the last local tier */
};

typedef struct kvdb_options {
  uint32_t struct_size;      /**< set by kvdb_options_init() */
  uint32_t flags;            /**< KVDB_O_*; default KVDB_O_CREATE; other bits: KVDB_INVALID */
  uint64_t dram_bytes;       /**< DRAM tier capacity; default 256 MiB; 0 disables the tier */
  uint64_t ssd_bytes;        /**< SSD tier capacity (live bytes); default 0 = unlimited */
  kvdb_sync_mode sync_mode;  /**< default KVDB_SYNC_FULL */
  uint64_t segment_bytes;    /**< a segment file is sealed past this size; default 1 GiB */
  uint64_t catalog_map_bytes;/**< initial LMDB map size (virtual address space, >= 1 MiB);
                                   default 64 GiB. The map grows: before a write, when the
                                   catalog's pages reach 3/4 of it, it is doubled (a handle of
                                   another process adopts the new size when it next begins a
                                   transaction); the file grows only as pages are used */
  int use_direct_io;         /**< 1 (default): O_DIRECT where the filesystem allows, logged
                                  fallback; 0: buffered I/O; anything else: KVDB_INVALID */
  int use_io_uring;          /**< 1 (default): io_uring where the kernel allows, logged fallback;
                                  0: pread/pwrite; anything else: KVDB_INVALID */
  kvdb_log_fn log_fn;        /**< default NULL: warnings and errors to stderr */
  void *log_ctx;
  int log_level;             /**< highest level passed to log_fn: -1 nothing, 0 errors, 1 warnings
                                  (default), 2 info, 3 debug; anything else: KVDB_INVALID */
  /**
   * The SmartSSD tier (a third, persistent tier: segment files in their own directory, e.g. on
   * the SmartSSD's filesystem). `smartssd_bytes` is its capacity in live bytes; 0 (the
   * default) = no SmartSSD tier: nothing new goes there (contexts already there stay
   * readable). `smartssd_dir` is its directory (copied at open, not retained); NULL (default)
   * = DIR/smartssd. The directory is recorded in the catalog with the tier's first segment;
   * later opens use the recorded one when smartssd_dir is NULL and refuse another one
   * (KVDB_INVALID). Its first segment makes the database format 3.
   * Every handle reads every context on the tier, also one opened before any process created
   * it (with or without a tier of its own): its segments are found in the recorded directory,
   * looked up when the handle first needs it. The record wins, as a database's own settings
   * do in LMDB and SQLite: a handle whose smartssd_dir names another directory than the one
   * another process recorded after it opened reads from the recorded one, and a move of its own
   * into the tier (kvdb_relocate, placement) is KVDB_INVALID naming both directories, as the
   * open would be.
   */
  const char *smartssd_dir;
  uint64_t smartssd_bytes;
  /**
   * Placement (EvicPress). Off by default. When on, every context has a place — the tier of
   * its persistent copy (SSD or SmartSSD), its storage config, and whether the DRAM tier holds
   * it too — chosen by the utility U = (alpha * quality - TTFT) * frequency (§4.2), where
   * quality comes from the context's quality profile (a reported quality wins), TTFT = tier
   * latency + stored bytes / tier bandwidth + decode time (the tier figures are probed once per
   * database and directory, cached in the catalog, and refined online from cold gets; see
   * kvdb_tier_probe), and frequency is the context's access count halved every
   * freq_half_life_s (kept in the catalog). Then:
   * - a put measures the context's profile (as with KVDB_PUT_PROFILE, over "lossless,int8,int4,
   *   int2" unless opts->profile_space says otherwise; or, by default, predicts it from the
   *   handle's recent measured profiles of the same model: placement_profile), is written in the config its best
   *   place on the SSD tier has (whatever opts->config asks: it is written once), and, once
   *   durable, is placed: the context takes its best (tier, config); then, while a tier holds more than its
   *   capacity (dram_bytes, ssd_bytes, smartssd_bytes), the cheapest operation — re-encode a
   *   context on that tier to a smaller config, or move it to the next tier — is applied,
   *   tier after tier (Algorithm 1), down to placement_slack_pct below the capacities. While
   *   the context's best place fits, only it is read and moved; the other contexts are read
   *   only when a tier overflows (or after another handle wrote). A context pushed off the
   *   last tier is deleted (recomputing it is worth more than keeping it). Each move is a
   *   kvdb_relocate (one transaction);
   * - the DRAM tier (an inclusive cache: the persistent copy stays) holds only the contexts
   *   the placement puts there, filled by gets;
   * - promotion on a hit (KVDB_PLACEMENT_EVICPRESS and _PER_BYTE; not _LEAST_DROP, Algorithm 1
   *   as the paper has it): after a kvdb_get that served a context the DRAM tier does not hold,
   *   the placement reads the context (its accesses noted and not yet written count) and, when
   *   its utility gain from being cached per DRAM byte is more than 1.25x the least such gain
   *   among the contexts its last run over every context cached, places it again as a new
   *   context (cached when that fits, else the greedy over every context decides, which may
   *   uncache others); the next get fills DRAM with it. kvdb_get returns what it returned
   *   before (the get's own status and KV); a promotion that fails is logged;
   * - kvdb_rebalance_plan / kvdb_rebalance_execute place every context anew.
   * Not chosen by the placement: token-dropping configs (kvdb_get cannot serve them), configs a
   * context's stored one cannot be re-encoded to (see kvdb_recompress). A context without a
   * profile keeps its config (it can still move between tiers). A put returns the put's status;
   * a placement that fails after it is logged and retried by the next placement.
   */
  kvdb_placement placement;
  double placement_alpha;     /**< alpha: seconds of TTFT worth one unit of quality, >= 0;
                                   default 1 */
  double freq_half_life_s;    /**< half-life of the access counts, seconds, > 0; default 3600 */
  double reprofile_drift_pct; /**< re-profile and re-place a context when a reported quality
                                   falls this many percent below its profiled quality (see
                                   kvdb_report_quality); 0..100, 0 = never; default 5 */
  double prefill_tokens_per_s;/**< how fast the caller recomputes a context (the TTFT of one
                                   that is not stored), > 0; default 10000 */
  /**
   * Room the placement leaves after a put (percent of each limited tier's capacity), 0..50;
   * default 5. A put places its context alone when its best place fits (the outcome of
   * Algorithm 1's first step, without reading the other contexts); when it does not, Algorithm
   * 1 runs over every context and re-encodes or demotes until each tier is this far below its
   * capacity, so that the whole-store run (its cost grows with the contexts stored) comes once
   * per that much new data rather than on every put of a full tier. 0 = resolve exactly to the
   * capacities (the paper's Algorithm 1 on every put that overflows a tier). Rebalances and
   * re-profiling always resolve to the capacities.
   */
  double placement_slack_pct;
  /**
   * Raw bytes per lossless frame (format 5): a block stored "lossless" packs the byte planes of
   * consecutive sections (layer -> KV head -> K, V) into frames of at least this many bytes of
   * KV, each decoded as a whole (a read of one layer's tokens decodes the frames holding that
   * layer). 0 = the default, 65536 (measured: `kvdb-bench compress`, bench/RESULTS.md);
   * else 4096 .. 16 MiB (KVDB_INVALID otherwise). Only new writes use it; every frame size reads.
   */
  uint32_t lossless_frame_bytes;
  /**
   * The remote tier (a Redis server, or any node of a Redis Cluster: its slot map is asked for
   * with CLUSTER SLOTS and followed through MOVED and ASK), shared by every host that names it.
   * NULL (the default) = no remote tier: nothing below changes anything. "host:port" = on:
   * - write-through (remote_write, default on put): a put that wrote blocks queues them (their
   *   hashes) for a background thread
   *   of the handle, which reads each block object back from the local store (verified) and
   *   SETs it, as stored (compressed, checksummed, with its tokens) in an envelope that names
   *   its tokens, model fingerprint, parent and namespace, under the key
   *   "kvdb:" namespace ":" hex(model fingerprint) ":" hex(chained block hash). The queue holds
   *   remote_queue_blocks hashes; a put waits at most remote_put_wait_ms for room, then the
   *   blocks that did not fit are not written through (counted: kvdb_remote_stats.dropped).
   *   A put's status never depends on the remote tier.
   * - kvdb_lookup and kvdb_get: after the local catalog's hit, the rest of the query's chain
   *   (its full blocks and the exact trailing partial block) is asked for in ONE pipelined round
   *   trip (lookup: each value's envelope and tokens only, GETRANGE; get: the values). Each
   *   value is verified before it counts: envelope checksum, namespace, model fingerprint,
   *   parent, tokens equal to the query's, and for a get every checksum of the block object;
   *   a value that fails (corrupt, stale, another key's block) is a miss, counted in
   *   kvdb_remote_stats.rejected, never KV. The remote hit continues the local one block by
   *   block and ends at the first miss. A get's remote hits are copied to the local store
   *   (remote_copy_hits, default on): see there.
   * - any Redis failure (down, paused, out of memory, connection reset, a timeout) is a miss or
   *   an unsent block, counted; reconnects back off (50 ms doubling to 2 s). No call fails
   *   because of it, and no call waits on Redis longer than remote_timeout_ms per round trip.
   * kvdb_open checks the address's form only (KVDB_INVALID), never connects: a server that is
   * down does not fail the open.
   */
  const char *remote_addr;
  /** the tenant's namespace (a caller's salt): 0..63 bytes of [A-Za-z0-9._-]; default "" (NULL
   * = ""). Handles with different namespaces never see each other's blocks, even for the same
   * tokens and model (the namespace is in the key and, hashed, in every value: checked). */
  const char *remote_namespace;
  uint32_t remote_timeout_ms;   /**< per round trip (connect, send, receive): 1..60000;
                                     default 250 */
  uint32_t remote_queue_blocks; /**< write-through queue bound in blocks; default 4096; 0 = no
                                     write-through (the tier is read only, as it always is for
                                     a KVDB_O_RDONLY handle) */
  uint32_t remote_put_wait_ms;  /**< most a put waits for room in a full queue, 0..10000;
                                     default 0 (never waits) */
  /**
   * The most bytes per second the background prefetch (kvdb_prefetch) may read; 0 (default) =
   * no ceiling of its own: it takes what the foreground leaves below 80% of the tier's measured
   * read speed (see kvdb_prefetch, "admission"); < 0 or not finite: KVDB_INVALID.
   */
  double prefetch_bps;
  /**
   * When the remote tier is written (with remote_addr, remote_queue_blocks > 0 and a handle
   * that writes): bits of KVDB_REMOTE_WRITE_*; 0 (default) = KVDB_REMOTE_WRITE_PUT; other bits:
   * KVDB_INVALID. PUT: write-through as described at remote_addr. EVICT (write-back on
   * demotion): before the placement deletes a context it pushed off the last local tier
   * (kvdb_rebalance*, the placement after a put), that context's blocks are read back
   * (verified) and SET in round trips of 16 blocks, each bounded by remote_timeout_ms; the
   * delete then goes ahead whatever Redis answered (counted: kvdb_remote_stats.written /
   * dropped). A kvdb_delete by the caller is not an eviction: nothing is written. EVICT
   * alone keeps Redis for what the local store no longer holds; PUT | EVICT also rewrites
   * what Redis evicted meanwhile. When the plan's model has the remote tier
   * (KVDB_TIER_REMOTE: the server answered its probe), the utility decides: a context it
   * moves there is written (whatever remote_write says), one it drops is not.
   */
  uint32_t remote_write;
  /**
   * 1 (default): the blocks a kvdb_get took from the remote tier are copied to the local
   * store, so the next get of that prefix is a local hit and survives Redis going away (as
   * LMCache writes remote hits back to its local cache). Each object is stored exactly as it
   * came and was verified (compressed, checksummed), under a context record for the prefix
   * the get hit (its config: the method, bits, drop and keep_permille the blocks carry), by
   * the handle's background thread: the get neither waits for the copy nor fails because of
   * it. Copies wait in a queue of at most 256 MiB of objects; what does not fit, and a copy
   * whose local write fails, is not copied (counted: kvdb_remote_stats.copy_failed). The
   * placement runs after each copy as after a put. Not with KVDB_O_RDONLY or
   * remote_queue_blocks = 0 (no thread), nor for kvdb_lookup (no values) or a
   * kvdb_get_notify (no remote part). 0 = never copied. Other values: KVDB_INVALID.
   */
  uint32_t remote_copy_hits;
  /**
   * Redis Cluster hash tags of the remote tier's keys: KVDB_REMOTE_TAG_NONE (0, the default)
   * spreads a chain's blocks over the slots (a lookup goes to every master at once, one round
   * trip each, in parallel); KVDB_REMOTE_TAG_ROOT keys each block as
   * "kvdb:" ns ":" model ":{" first 16 hex digits of its chain's first block's hash "}:" hash,
   * so a chain (and every context that shares its first block) is on one slot: one node per
   * lookup, but a common first block (a shared system prompt) puts all its contexts on one
   * master. Measured on a local 3-master cluster: bench/RESULTS.md, "hash tags". Handles that
   * share a remote tier must agree (the keys differ). Other values: KVDB_INVALID.
   */
  uint32_t remote_hash_tag;
  /** the remote tier's capacity in the placement's model (KVDB_TIER_REMOTE): the most bytes a
   * plan keeps there; 0 (default) = unlimited (Redis's maxmemory policy bounds what it keeps,
   * and a context it evicts is a miss, never wrong KV) */
  uint64_t remote_bytes;
  /**
   * How long (µs) a get or lookup waiting for the remote tier's replies polls its socket (a
   * non-blocking read, the CPU given to any other runnable thread between tries) before it
   * sleeps in a blocking read (bounded by remote_timeout_ms, which this adds to): default
   * 50; 0 = always sleep; at most 10000. Replies usually
   * come within that time of each other in a batch, and a reader that does not sleep is not
   * woken either (the server and the reader each save the wake-up: bench/RESULTS.md, "issue 20,
   * session 26"). A waiter past it sleeps, so a slow server costs at most this much CPU per
   * wait. Other values: KVDB_INVALID.
   */
  uint32_t remote_poll_us;
  /**
   * Which puts measure their profile when placement is on (a put whose caller sets
   * KVDB_PUT_PROFILE always measures): KVDB_PLACE_PROFILE_SAMPLED (0, the default) or
   * KVDB_PLACE_PROFILE_EVERY_PUT (1, the paper's profiler, EvicPress §4.3: every put). Other
   * values: KVDB_INVALID.
   */
  uint32_t placement_profile;
  /**
   * Packed raw blocks (format 7, format/FORMAT.md §3e): a block a put stores raw on the SSD
   * tier, without score copies, whose packed object takes at most this many bytes is written
   * as a compact object (header, tokens, checksums, data: no section table, no page padding)
   * at a 64-byte offset, back to back with the put's other such blocks, the run padded to a
   * page; stored bytes then follow the logical bytes at small blocks (stories260K's 16-token
   * blocks: 1.025x instead of 1.2x). Compressed blocks too (format 9, §3f: a block stored
   * lossless, quantized or with token dropping, or re-encoded to such a config, whose encoded
   * object fits is packed the same way, with a compact section table: stories260K f32 int4
   * 0.29x of the logical bytes instead of 0.60x). 0 = the default, 131072; 1 = never (every
   * object whole 4 KiB pages, the layout of formats 1-6); else 4096 .. 16 MiB (KVDB_INVALID
   * otherwise). Only new writes use it; both layouts read.
   */
  uint32_t packed_block_bytes;
  /**
   * Fixed tier figures (placement on): for each tier whose read_bps > 0 here, the placement's
   * TTFT model uses read_bps and latency_s as given (probed_unix_ms and reads are ignored)
   * instead of probing the tier at open and refining the figures from cold reads, so that
   * placements depend on the workload alone: known hardware, reproducible plans, tests.
   * kvdb_tier_probe reports them. Tiers left 0 are measured as usual. A negative or
   * non-finite figure, or latency_s without read_bps: KVDB_INVALID.
   */
  kvdb_tier_perf tier_perf[KVDB_TIER_COUNT];
} kvdb_options;

/** kvdb_options.placement_profile: which puts measure their quality profile (placement on). */
enum {
  /** A put's profile is predicted from the profiles this handle measured for earlier puts of
   * the same model, profile space, probe kind and context length (within a power of two) once
   * the last 16 of them agree (each config's quality loss 1 - q within 20% of the least or
   * 0.001, its bytes per token within 25%): every config at the least quality and the mean
   * bytes per token of those 16, the entries' n_probes 0 (predicted, not measured). One put
   * in 16 of such a group is still measured and joins the 16: when it disagrees, the puts
   * after it are measured until 16 agree again. The prediction is written in the put's own
   * transaction, as a measured profile is; a handle starts with no prior (its first puts of
   * each group are measured). kvdb_profile measures a stored context on demand. */
  KVDB_PLACE_PROFILE_SAMPLED = 0,
  /** Every put measures its profile (the paper's profiler, EvicPress §4.3). */
  KVDB_PLACE_PROFILE_EVERY_PUT = 1,
};

/** @brief Fill *opt with defaults. Cannot fail. */
KVDB_API void kvdb_options_init(kvdb_options *opt);

/**
 * @brief Open (and with KVDB_O_CREATE create) the database in directory `path`.
 *
 * Opening reclaims what a crashed writer left: the unreferenced tail of each segment whose
 * writer is gone is truncated away. `path` and `opt` are copied; not retained.
 * @param[out] out the handle on KVDB_OK; NULL on any error.
 * @return KVDB_OK; KVDB_INVALID (bad option or path; the message names the field);
 *   KVDB_NOTFOUND (no database and no KVDB_O_CREATE); KVDB_VERSION (written by a newer format:
 *   refused, nothing written); KVDB_READONLY (without KVDB_O_RDONLY: the directory, the catalog
 *   or its lock file not writable by this user; the message says to open with KVDB_O_RDONLY);
 *   KVDB_BUSY (KVDB_O_RDONLY without write access to the lock file while a process has the
 *   database open: see KVDB_O_RDONLY); KVDB_CORRUPT; KVDB_IOERR; KVDB_NOMEM.
 */
KVDB_API kvdb_status kvdb_open(const char *path, const kvdb_options *opt, kvdb **out);

/** @brief Close the handle and free everything it holds. NULL is a no-op. Not concurrent
 * with other calls on the same handle. With a remote tier, the blocks still queued for
 * write-through are sent first (each round trip bounded by remote_timeout_ms; with the server
 * down they fail at once). */
KVDB_API void kvdb_close(kvdb *db);

/* ------------------------------------------------------------------------------------------ */
/** @defgroup kv Put, lookup, get, delete */

/** What a put did. */
typedef struct kvdb_put_info {
  kvdb_key context;         /**< the context key (hash of the last block) */
  uint32_t n_blocks;        /**< blocks in the context */
  uint32_t blocks_written;  /**< blocks whose data was written now */
  uint32_t blocks_shared;   /**< blocks already stored (refcount incremented only) */
  uint64_t bytes_written;   /**< bytes appended to segment files */
} kvdb_put_info;

/**
 * @brief Store the KV of `tokens[0..n)` as one context.
 *
 * `kv` describes the caller's buffer (n tokens); it is read during the call only. Blocks
 * already stored are not written again. A trailing partial block is stored too. Putting the
 * same token sequence twice stores it once (the second put is a no-op with KVDB_OK).
 * On KVDB_OK the context is durable (see the sync mode) and visible to every handle.
 * On any error nothing of this put is visible.
 * @param info optional (NULL); filled on KVDB_OK.
 * @return KVDB_OK; KVDB_INVALID (NULL/zero arguments, bad model, n above 2^32 x 16 - the most
 *   a context can hold -, a view whose strides address more than 2^63 bytes); KVDB_MISMATCH (the id is
 *   stored with another shape); KVDB_READONLY; KVDB_FULL (the disk, or a tier capacity
 *   that cannot be met; also while the catalog's reserve for deletes and compaction cannot be
 *   kept: fewer free bytes than the larger of 8 MiB and 1/16 of the catalog, see
 *   kvdb_compact; a catalog map that fills during the put is grown and the put retried,
 *   up to 3 times, so KVDB_FULL "MDB_MAP_FULL" is returned only when the map cannot grow: no
 *   address space or memory for it); KVDB_IOERR; KVDB_NOMEM.
 */
KVDB_API kvdb_status kvdb_put(kvdb *db, const kvdb_model *m, const uint32_t *tokens, size_t n,
                              const kvdb_kv_view *kv, kvdb_put_info *info);

/**
 * @brief How many leading tokens of `tokens[0..n)` are stored, verified token by token.
 * Finds full blocks by hash, then the longest stored block continuing the prefix (partial
 * blocks and prefixes of blocks count), whatever the number of stored blocks continuing the
 * last matched one (the catalog's trie of blocks, format 4; a format 1-3 database opened
 * read-only examines all of them). No block data is read. A block whose stored tokens
 * differ from the query (a collision) ends the hit; so does a block stored with dropped
 * tokens (KVDB_METHOD_DROP), which kvdb_get cannot deliver in full (kvdb_get_context can;
 * kvdb_lookup_kept and kvdb_get_kept serve such a prefix with the positions it keeps).
 * With a remote tier (kvdb_options.remote_addr) the hit then continues there, block by block
 * from the first block the local hit does not cover, each value's envelope and tokens checked
 * (one round trip); a remote failure or a value that fails its checks ends the hit, never the
 * call (still KVDB_OK).
 * @param[out] hit_tokens 0..n.
 * @return KVDB_OK (also for 0 hits, and for a model id that is not stored); KVDB_INVALID (also
 *   n above 2^32 x 16, as kvdb_put); KVDB_MISMATCH (the id is stored with another shape);
 *   KVDB_BUSY (see KVDB_O_RDONLY); KVDB_IOERR.
 */
KVDB_API kvdb_status kvdb_lookup(kvdb *db, const kvdb_model *m, const uint32_t *tokens, size_t n,
                                 size_t *hit_tokens);

/**
 * @brief Copy the KV of the longest stored prefix of `tokens[0..n)` into `out`.
 *
 * `out` describes room for n tokens; positions [0, *hit_tokens) receive the hit's KV. Positions
 * past the hit are unspecified: a block that fails verification part-way may have had its
 * verified sections copied there before the failure showed (each 4 KiB page is checked before
 * it is copied, so nothing unverified is ever written). Data comes from the DRAM tier when
 * present there, else from disk with every checksum verified. A block that fails verification
 * ends the hit there (the rest is a miss) and the call still returns KVDB_OK with the shorter
 * hit; kvdb_stat counts it in `corrupt_blocks`. Blocks stored with a lossy config (QUANT)
 * are returned decoded: an approximation, as the put asked for. A block whose segment file is
 * missing or too short also ends the hit (kvdb_get_tokens and kvdb_verify say KVDB_CORRUPT).
 * With a remote tier (kvdb_options.remote_addr) the hit then continues there from the first
 * block the local hit did not deliver (one round trip), each value verified whole before its
 * KV is copied (see kvdb_options.remote_addr); a remote failure or a rejected value ends the
 * hit, never the call (still KVDB_OK). Remote hits are not stored locally.
 * With placement on, a hit of a context the DRAM tier does not hold may promote it there after
 * the KV is delivered (kvdb_options.placement, "promotion on a hit"): the return value and KV
 * are the get's own; a promotion that fails is logged. A promotion changes which contexts the
 * DRAM tier holds, nothing else: it never moves, re-encodes or deletes a stored context (also
 * when a tier is over-full; the next put or rebalance resolves that).
 * @return KVDB_OK (also for 0 hits); KVDB_INVALID (also n above 2^32 x 16, as kvdb_put, and a
 *   view whose strides address more than 2^63 bytes); KVDB_MISMATCH (the id is stored with
 *   another shape; *hit_tokens 0); KVDB_IOERR; KVDB_NOMEM.
 */
KVDB_API kvdb_status kvdb_get(kvdb *db, const kvdb_model *m, const uint32_t *tokens, size_t n,
                              const kvdb_kv_view *out, size_t *hit_tokens);

/**
 * @brief Remove a context (or an explicit-key block). Blocks no other context uses become
 * free space, reclaimed by kvdb_compact. On a full disk a delete still commits: the catalog
 * keeps disk space reserved past its end for deletes and compaction (see kvdb_compact).
 * @return KVDB_OK; KVDB_NOTFOUND; KVDB_READONLY; KVDB_FULL (the catalog's reserve is used up
 *   too); KVDB_IOERR.
 */
KVDB_API kvdb_status kvdb_delete(kvdb *db, const kvdb_key *context);

/* ------------------------------------------------------------------------------------------ */
/**
 * @defgroup config Compression configs
 *
 * How a context's blocks are stored. Every block is compressed on its own, section by section
 * (a section is one layer x one KV head x K or V), and each section in independently
 * decodable groups of tokens, so kvdb_get_tokens still reads only the pages it needs:
 * 16 tokens per group for quantized and dropped sections (32 for quantized K, a multiple of
 * the KIVI group), 128 for lossless ones (zstd needs bigger frames: at 16 tokens it loses
 * ~2% of ratio and half its speed), for head_dim 128 in f16; a token of a compressed context
 * costs reading those groups plus the section headers of its layer.
 *
 *   method    what is stored                                   get returns
 *   RAW       the elements (page-grouped; the default)          exactly what was put
 *   LOSSLESS  byte planes, each compressed with zstd            exactly what was put
 *   QUANT     int4, int2: KVQuant (Hooper et al. 2024): K and   an approximation (clipped
 *             V quantized per channel over groups of 128        ranges saturate values beyond
 *             tokens, ranges clipped to least squared error, K  them)
 *             before RoPE when the model gives its RoPE
 *             (kvdb_model.rope_base), else after it
 *             int8, kivi4, kivi2: KIVI (Liu et al. 2024): K     an approximation, elementwise
 *             per channel over groups of tokens, V per token    error at most half a step of
 *             over groups of channels, min/max with f16 scale   its group's scale
 *             and zero
 *   DROP      the tokens a method keeps (per block and KV head: kvdb_get stops before such
 *             knorm, keydiff or snapkv), exact or quantized    a block; kvdb_get_context
 *                                                              returns the kept rows and positions,
 *                                                              kvdb_get_kept a prefix's kept rows
 *                                                              at their positions with a mask
 * Names (kvdb_config_parse / kvdb_config_name): "raw", "lossless", "lossless:z9", "int8",
 * "int4", "int2", "int4:g64" (group), "int4:r128" (residual), "kivi4", "kivi2" (KIVI at 4 or
 * 2 bits: the int4 and int2 of databases before issue 16; "kivi8" is "int8"), "kvquant8"
 * (KVQuant at 8 bits), "knorm50" (keep 0.50),
 * "knorm12.5" (keep 0.125), "keydiff30", "snapkv70", "snapkv50+int4".
 */

typedef enum kvdb_method {
  KVDB_METHOD_RAW = 0,      /**< page-grouped elements as given (the default) */
  KVDB_METHOD_LOSSLESS = 1, /**< byte planes + zstd: bit-exact */
  KVDB_METHOD_QUANT = 2,    /**< quantization to `bits` bits by `drop`'s quantizer */
  KVDB_METHOD_DROP = 3,     /**< token dropping by `drop` at `keep_permille`; rows exact or quantized */
} kvdb_method;

/** Token-dropping methods (EvicPress §6.1 baselines). Values are pinned (stored on disk). */
typedef enum kvdb_drop_method {
  KVDB_DROP_NONE = 0,
  KVDB_DROP_KNORM = 1,   /**< keep the keys with the lowest L2 norm (Devoto et al. 2024) */
  KVDB_DROP_KEYDIFF = 2, /**< keep the keys least similar to the mean key (Park et al. 2025) */
  KVDB_DROP_SNAPKV = 3,  /**< keep what the prompt's last queries attend to (Li et al. 2024); needs
                              queries (kvdb_put_opts.queries) */
} kvdb_drop_method;

/** QUANT's quantizer, in kvdb_config.drop. Values are pinned (stored on disk); 0 is what every
 * quantized context of a database before issue 16 was stored with. */
typedef enum kvdb_quantizer {
  KVDB_QUANT_KIVI = 0,    /**< KIVI: "int8", "kivi4", "kivi2" */
  KVDB_QUANT_KVQUANT = 1, /**< KVQuant (pre-RoPE K when the model gives its RoPE): "int4",
                               "int2", "kvquant8" */
} kvdb_quantizer;

/** A storage config. Zero-initialized = raw. 12 bytes, stored in the catalog field by field. */
typedef struct kvdb_config {
  uint8_t method;         /**< kvdb_method */
  uint8_t bits;           /**< QUANT: 8, 4 or 2; DROP: 0 (kept rows exact) or 8, 4, 2 */
  uint8_t drop;           /**< DROP: kvdb_drop_method; QUANT: kvdb_quantizer */
  int8_t zstd_level;      /**< LOSSLESS: -7..22 (not 0 once resolved); 0 = 3 */
  uint16_t keep_permille; /**< DROP: tokens kept per 1000 of the context, per KV head, 1..999
                               (exactly: round(n_tokens x it / 1000), FORMAT.md format 8) */
  uint16_t group;         /**< QUANT, DROP with bits: tokens (K) or channels (V) per scale and
                               zero (kvquant: tokens for K and V); 0 = 32 (kvquant 128,
                               or the block's tokens when fewer); at most block_tokens */
  uint32_t residual;      /**< QUANT, DROP with bits: the context's last `residual` tokens are
                               kept in full precision (KIVI's residual; kvquant: at 8 bits);
                               0 = none */
} kvdb_config;

/** @brief Parse a config name (see above). @return KVDB_OK; KVDB_INVALID naming the part. */
KVDB_API kvdb_status kvdb_config_parse(const char *name, kvdb_config *out);
/** @brief The canonical name of a config into buf (>= 48 bytes); "?" for an invalid one.
 * Returns buf. Cannot fail. */
KVDB_API char *kvdb_config_name(const kvdb_config *c, char *buf, size_t cap);
/** @brief Whether model `m` can be stored with config `c` (bits, drop method, group against
 * block_tokens, ...). @return KVDB_OK; KVDB_INVALID naming the field. */
KVDB_API kvdb_status kvdb_config_check(const kvdb_model *m, const kvdb_config *c);

/* ------------------------------------------------------------------------------------------ */
/** @defgroup inspect Contexts and statistics */

/** One stored context. */
typedef struct kvdb_context_info {
  kvdb_key key;
  char model_id[64];
  uint64_t n_tokens;
  uint32_t n_blocks;
  uint32_t explicit_key;  /**< 1 for a block stored by kvdb_put_block */
  uint64_t bytes;         /**< stored bytes of its blocks (shared blocks count in each) */
  uint64_t created_unix_ms;
  uint64_t last_access_unix_ms; /**< put, or a get through any handle (flushed lazily) */
  uint32_t in_dram_blocks;      /**< of its blocks, how many this handle holds in DRAM */
  uint32_t tier;                /**< kvdb_tier of its persistent copy (of its last block) */
  kvdb_config config;           /**< how its put (or last re-encoding) stored it */
  uint32_t has_profile;         /**< 1 when a quality profile is recorded */
  uint32_t cached;              /**< 1 when the placement keeps it in the DRAM tier */
  double frequency;             /**< its decayed access count now (placement; 0 when none is
                                     kept: accesses are counted with placement on) */
  uint32_t score_bits;          /**< its model's score_bits: 8 or 4 when its blocks keep score
                                     copies for kvdb_score, else 0 */
  uint32_t score_versions;      /**< which versions of score copies its blocks carry: bit 0
                                     version 1 (the plain int8/int4 copy; every block written
                                     before version 2, and every block of a database with a
                                     SmartSSD tier), bit 1 version 2 (centered and
                                     Hadamard-rotated: better int4 ranking); 0 without copies */
} kvdb_context_info;

/** @brief Information about one context. @return KVDB_OK; KVDB_NOTFOUND; KVDB_INVALID. */
KVDB_API kvdb_status kvdb_context_stat(kvdb *db, const kvdb_key *context, kvdb_context_info *out);

/**
 * @brief The model stored under `id` (kvdb_context_info.model_id): its shape, dtype,
 * block_tokens and score_bits; out->id = id (not copied: it must outlive out's use). With it a
 * tool can re-encode contexts it did not write (kvdb-admin recompress).
 * @return KVDB_OK; KVDB_NOTFOUND (no such model); KVDB_INVALID (NULL, id not 1..63 bytes).
 */
KVDB_API kvdb_status kvdb_model_get(kvdb *db, const char *id, kvdb_model *out);

typedef struct kvdb_iter kvdb_iter;
/** @brief Iterate over all contexts in key order. The iterator sees the catalog as of
 * kvdb_iter_open (a snapshot). It belongs to one thread. @return KVDB_OK; KVDB_NOMEM. */
KVDB_API kvdb_status kvdb_iter_open(kvdb *db, kvdb_iter **out);
/** @brief Next context. @return KVDB_OK; KVDB_NOTFOUND at the end; KVDB_CORRUPT. */
KVDB_API kvdb_status kvdb_iter_next(kvdb_iter *it, kvdb_context_info *out);
/** @brief Free the iterator. NULL is a no-op. */
KVDB_API void kvdb_iter_close(kvdb_iter *it);

typedef struct kvdb_tier_stats {
  uint64_t capacity_bytes; /**< 0 = unlimited */
  uint64_t bytes;          /**< bytes of blocks held (live bytes for persistent tiers) */
  uint64_t blocks;
  uint64_t contexts;
  uint64_t hits;           /**< blocks served from this tier by this handle */
  uint64_t misses;         /**< blocks looked for here and not found, by this handle */
} kvdb_tier_stats;

typedef struct kvdb_stats {
  uint32_t format_version;
  uint32_t n_models;
  uint64_t n_contexts;
  uint64_t n_blocks;
  uint64_t n_segments;
  uint64_t segment_file_bytes; /**< bytes of all segment files (live + dead) */
  uint64_t live_bytes;         /**< bytes of referenced blocks */
  uint64_t catalog_bytes;      /**< size of the LMDB catalog file */
  uint64_t corrupt_blocks;     /**< blocks this handle found corrupt */
  uint64_t bytes_read;         /**< bytes this handle read from segment files */
  uint64_t bytes_written;      /**< bytes this handle appended to segment files */
  int direct_io;               /**< 1 when segment I/O is O_DIRECT */
  int io_uring;                /**< 1 when segment I/O uses io_uring */
  kvdb_tier_stats tier[KVDB_TIER_COUNT];
} kvdb_stats;

/**
 * @brief Fill *out. Constant time: the segment and per-tier figures come from counters the
 * catalog keeps in the transactions that change them (not from a scan). When a process of an
 * older build wrote since they were last kept, they are counted anew (time linear in the
 * contexts, as before) and, on a read-write handle, stored again; a read-write open does the
 * same.
 * @return KVDB_OK; KVDB_INVALID; KVDB_IOERR; KVDB_CORRUPT (counting anew met a segment record
 *   that does not decode: the other fields are filled).
 */
KVDB_API kvdb_status kvdb_stat(kvdb *db, kvdb_stats *out);

/* ------------------------------------------------------------------------------------------ */
/** @defgroup verify Verification, repair, compaction */

/** One problem found by kvdb_verify. */
typedef struct kvdb_problem {
  kvdb_status status; /**< KVDB_CORRUPT (also a missing or short segment file) or KVDB_IOERR */
  const char *message;/**< names the context, block and field, or the segment (its file) and
                           offset; valid during the callback */
} kvdb_problem;
typedef void (*kvdb_problem_fn)(void *ctx, const kvdb_problem *p);
typedef void (*kvdb_progress_fn)(void *ctx, uint64_t done, uint64_t total);

typedef struct kvdb_verify_report {
  uint64_t blocks_checked;
  uint64_t bytes_checked;
  uint64_t contexts_checked;
  uint64_t segments_checked;
  uint64_t problems;
} kvdb_verify_report;

/**
 * @brief Read every block and check every checksum, and the catalog against the segments.
 *
 * Each block record of the catalog is compared with the block object where it says the block
 * lies, once that object proves to be the block (its header's hash, every checksum): fields
 * n_tokens, bytes, tokens, parent, model, flags (compressed, score bits) and tier; its
 * refcount with the contexts that list it. Each context record with its blocks: every block
 * present and of the context's model, the chain (block i's parent is block i-1, or the model
 * for block 0; its hash is that of its parent and tokens; the key is the last block's hash;
 * an explicit-key context lists its own key), n_tokens the sum of its blocks' tokens. Each
 * model record, with its calibration (kvdb_model_calibrate: checksum and values). Then
 * the segments: files present and as long as committed (a missing or short file is a
 * KVDB_CORRUPT problem naming the file), live bytes adding up.
 *
 * A record whose offset does not lead to its block is looked for in its segment (each segment
 * read once, only then): the problem says where the block is, or that the segment holds none
 * or several copies of it. The context's storage config is not compared with its blocks': a
 * block shared with other contexts keeps how it was stored.
 *
 * Each disagreement is one problem; its message names the context, the block and the field
 * ("block B of context C: field tokens: token 5 is 17 in the record, 18 in the block"). All of
 * it reads one snapshot: other handles and processes may keep writing (a segment compacted
 * away meanwhile is not a problem). Problems go to `on_problem` (optional).
 * @return KVDB_OK when no problem was found, KVDB_CORRUPT when one was (report->problems of
 * them), or an error that stopped the check (KVDB_NOMEM, KVDB_IOERR, KVDB_BUSY).
 */
KVDB_API kvdb_status kvdb_verify(kvdb *db, kvdb_problem_fn on_problem, kvdb_progress_fn progress,
                                 void *ctx, kvdb_verify_report *report);

/** kvdb_repair flags */
enum {
  KVDB_REPAIR_DRY_RUN = 1u << 0, /**< say what would be done; write nothing */
};

typedef struct kvdb_repair_report {
  uint64_t problems;         /**< problems the check found (as kvdb_verify counts them) */
  uint64_t blocks_rebuilt;   /**< block records rewritten from their objects */
  uint64_t contexts_rebuilt; /**< context records whose token count was rewritten */
  uint64_t contexts_dropped; /**< contexts deleted: a block of theirs could not be rebuilt */
  uint64_t blocks_dropped;   /**< block records removed: no context lists them any more */
  uint64_t refcounts_fixed;  /**< block records whose refcount was set to their contexts */
  uint64_t segments_fixed;   /**< segment records whose live bytes and blocks were set */
  uint64_t skipped;          /**< changes left undone: the record changed after the check
                                  read it (another handle wrote meanwhile): run it again */
} kvdb_repair_report;

/**
 * @brief Repair what kvdb_verify finds in the catalog, from the segments.
 *
 * Runs kvdb_verify's check on a snapshot and plans: a block record that disagrees with an
 * object that verifies (its hash, every checksum) is rebuilt from the object (tokens, counts,
 * sizes, parent, model, flags, tier; a record whose offset is wrong, from the one object of
 * that block its segment holds: with none or several, it cannot be rebuilt); a context whose token count disagrees with its blocks
 * gets theirs; a context that cannot be rebuilt (a block missing, its object damaged or not
 * where its record says, a broken chain, a record that does not decode) is dropped. Then, in
 * one write transaction: each record to change is first compared with the bytes the check read
 * (one that changed meanwhile is skipped and counted); the changes are made; every block's
 * refcount becomes the number of contexts listing it, blocks no context lists are removed, and
 * every segment's live bytes and blocks become what its block records add up to; when the
 * check found anything, the catalog's block indexes (format 4: segment index, lookup trie) are
 * built anew from the block records. It commits all or nothing. No rebuilt record says anything its object does not prove, so a later get
 * delivers the context's full KV or misses; it never delivers other KV. Other handles and
 * processes may keep using the database meanwhile. Segment data is never changed: a damaged
 * object's space is reclaimed by kvdb_compact once no record points at it.
 *
 * Each change (or, with KVDB_REPAIR_DRY_RUN, each change it would make, the message starting
 * "would ") goes to `on_action` (optional) as a kvdb_problem of status KVDB_CORRUPT.
 * `flags`: 0 or KVDB_REPAIR_DRY_RUN (which works on a read-only handle and writes nothing).
 * @return KVDB_OK (the report says what was done, nothing when the check found nothing);
 * KVDB_READONLY (a read-only handle without KVDB_REPAIR_DRY_RUN); KVDB_INVALID (unknown flag
 * bits, named); KVDB_NOMEM; KVDB_FULL; KVDB_IOERR; KVDB_BUSY. On an error nothing was changed.
 */
KVDB_API kvdb_status kvdb_repair(kvdb *db, unsigned flags, kvdb_problem_fn on_action,
                                 kvdb_progress_fn progress, void *ctx,
                                 kvdb_repair_report *report);

typedef struct kvdb_compact_report {
  uint64_t segments_rewritten;
  uint64_t blocks_moved;
  uint64_t bytes_moved;
  uint64_t bytes_reclaimed;
} kvdb_compact_report;

/** One segment file (kvdb_segments). */
typedef struct kvdb_segment_info {
  uint64_t id;
  uint32_t tier;        /**< KVDB_TIER_SSD or KVDB_TIER_SMARTSSD */
  uint32_t sealed;      /**< 1: sealed, a compaction candidate; 0: open (appended to) */
  uint64_t bytes;       /**< committed bytes of the file: live + dead */
  uint64_t live_bytes;  /**< bytes of the blocks located in it */
  uint64_t live_blocks;
} kvdb_segment_info;

/**
 * @brief The segment files, in id order: the first `cap` into out[0..cap), how many there are
 * into *n (cap 0 and out NULL: count only). kvdb_compact(threshold) rewrites the sealed ones
 * with live_bytes < threshold * bytes, and reclaims bytes - live_bytes of each (what
 * `kvdb-admin info` and `compact` report as left and reclaimable at other thresholds).
 * @return KVDB_OK; KVDB_INVALID (n NULL, or out NULL with cap > 0); KVDB_CORRUPT (a segment
 *   record that does not decode); KVDB_IOERR; KVDB_NOMEM.
 */
KVDB_API kvdb_status kvdb_segments(kvdb *db, kvdb_segment_info *out, size_t cap, size_t *n);

/**
 * @brief Rewrite the live blocks of segments whose live fraction is below `threshold`
 * (0..1; 0 = the default 0.5) into new segments, then delete the old files. Online: readers
 * and writers in any process keep working. Segments are done one at a time, the least live
 * first (one with nothing live is removed without copying); each moves its blocks in catalog
 * transactions of at most 512 records.
 *
 * A full disk: the live blocks of one segment need room to be copied into. When a copy fails
 * for lack of space, the dead bytes of the remaining candidate segments are first freed in
 * place (fallocate PUNCH_HOLE: no copy, no extra space; done only when no reader in any
 * process holds a catalog snapshot older than the compaction's), and the copy is tried again.
 * So after the disk fills, deleting contexts and compacting frees their space without freeing
 * anything else first, on filesystems that punch holes (ext4, xfs, btrfs, tmpfs); the catalog
 * commits on a full disk from its reserve (disk space allocated past its end, the larger of
 * 8 MiB and 1/16 of the catalog, topped up while there is room; while it cannot be, puts fail
 * KVDB_FULL and the reserve goes to deletes and compaction). Where holes cannot be punched,
 * free the live bytes of the least live candidate segment (at most threshold x segment_bytes)
 * by other means first.
 *
 * The catalog: when this handle is its only user (no other process has it open) and the
 * catalog file is more than twice what a rewrite would take (deletes leave LMDB pages free
 * or part empty, and LMDB never shrinks its file), the compaction ends by rewriting it in key
 * order into a new file that replaces it (SQLite's VACUUM; this handle's other calls wait
 * meanwhile). A rewrite that fails (e.g. no room for the copy) is logged and leaves the
 * catalog as it was.
 * A block that fails verification (damaged, or in a segment file that is too short) stays
 * where it is, the rest is compacted, and the call then returns KVDB_CORRUPT naming the first
 * such block and how many there were (kvdb_verify lists them), as SQLite's VACUUM stops on a
 * corrupt database. A segment whose file is missing is left alone (nothing there to read).
 * @return KVDB_OK; KVDB_READONLY; KVDB_FULL (no room to copy a segment's live blocks, and
 *   its dead bytes could not be freed in place: the message says why); KVDB_IOERR (also: the
 *   catalog could not be reopened after its rewrite; the handle must be closed);
 *   KVDB_INVALID; KVDB_CORRUPT (above).
 */
KVDB_API kvdb_status kvdb_compact(kvdb *db, double threshold, kvdb_progress_fn progress, void *ctx,
                                  kvdb_compact_report *report);

/* =================================== Part II: the rest ==================================== */

/* ------------------------------------------------------------------------------------------ */
/** @defgroup putopts Put options, whole-context and per-position reads */

/** kvdb_put_opts.flags */
enum {
  KVDB_PUT_PROFILE = 1u << 0, /**< also measure the context's quality profile (see kvdb_profile) */
};

/**
 * Options of kvdb_put_ex(). Always call kvdb_put_opts_init() first, then change fields;
 * fields are only ever added at the end. Read during the call only.
 */
typedef struct kvdb_put_opts {
  uint32_t struct_size;      /**< set by kvdb_put_opts_init() */
  uint32_t flags;            /**< KVDB_PUT_* */
  kvdb_config config;        /**< how the put's new blocks are stored; default raw */
  /**
   * Queries of the prompt's last tokens, optional: SnapKV's observation window and the probes
   * of the quality profile. Layout [n_queries][n_layers][n_q_heads][head_dim] floats, in the
   * same rotary state as the keys; query heads i*g .. i*g+g-1 (g = n_q_heads / n_kv_heads)
   * share KV head i. Without them the profile derives probes from the context's own keys.
   */
  const float *queries;
  uint32_t n_queries;        /**< 0..64 */
  uint32_t n_q_heads;        /**< a multiple of the model's n_kv_heads */
  /** Configs the profile measures, names separated by commas; NULL = "lossless,int8,int4,int2,
   * knorm90,knorm70,knorm50,knorm30,keydiff90,keydiff70,keydiff50,keydiff30" plus the same
   * snapkv ratios when queries are given, leaving out those the model cannot take (e.g. token
   * dropping for a scoring model); a named config the model cannot take is KVDB_INVALID. */
  const char *profile_space;
  uint32_t profile_heads;    /**< (layer, KV head) pairs the profile samples; 0 = 16 */
  /**
   * The quality profile's probes (issue 16), optional: the model's own queries at positions
   * spread over the context (e.g. 64 of them, evenly spaced), layout
   * [n_probe_queries][n_layers][n_q_heads][head_dim] floats in the keys' rotary state, with
   * n_q_heads as above (set it even without `queries`), the query of position
   * probe_positions[i] at row i (strictly increasing, < the context's tokens). Each probe
   * attends causally to the keys at positions <= its own. Without them the profile probes with
   * the keys at 64 evenly spaced positions (scaled to a query's norm). `queries` (SnapKV's
   * window) are never probes. KVDB_INVALID: one of the two pointers NULL with n_probe_queries
   * > 0 (or set with 0), n_probe_queries > 1024, positions not increasing or past the context.
   */
  const float *probe_queries;
  const uint32_t *probe_positions;
  uint32_t n_probe_queries;
} kvdb_put_opts;

/** @brief Fill *o with defaults (raw config, no profile). Cannot fail. */
KVDB_API void kvdb_put_opts_init(kvdb_put_opts *o);

/**
 * @brief kvdb_put with options: the storage config of its new blocks, and a quality profile.
 *
 * Blocks this put writes are stored with `opts->config`. A block the context shares with
 * contexts already stored keeps how it is stored, except that a lossy block is rewritten
 * exactly when this put stores exactly (RAW or LOSSLESS): a shared block keeps the most
 * faithful config of its owners. A config the model cannot take is refused before anything
 * is written (KVDB_INVALID, naming the field); so is SnapKV without queries.
 * With KVDB_PUT_PROFILE the profile (see kvdb_profile) is measured from the caller's KV and
 * recorded in the same transaction as the context; "profile only" = store RAW or LOSSLESS and
 * profile. opts NULL = kvdb_put.
 * @return as kvdb_put.
 */
KVDB_API kvdb_status kvdb_put_ex(kvdb *db, const kvdb_model *m, const uint32_t *tokens, size_t n,
                                 const kvdb_kv_view *kv, const kvdb_put_opts *opts,
                                 kvdb_put_info *info);

/**
 * @brief All of a stored context as stored, also when tokens were dropped: for every layer l
 * and KV head h, its kept rows in token order go to `out` at token index 0, 1, ... (room for
 * the context's n_tokens rows), their token positions to positions[(l * n_kv_heads + h) *
 * n_tokens + r] and their count to n_rows[l * n_kv_heads + h] (both optional, NULL). For a
 * context stored without dropping, row r is token r. Every byte read is verified.
 * @return KVDB_OK; KVDB_NOTFOUND (no such context); KVDB_MISMATCH; KVDB_INVALID; KVDB_CORRUPT
 *   (also a segment file that is missing or shorter than a block in it: the message names the
 *   file, "is missing" or "past the file's end"); KVDB_IOERR.
 */
KVDB_API kvdb_status kvdb_get_context(kvdb *db, const kvdb_model *m, const kvdb_key *context,
                                      const kvdb_kv_view *out, uint32_t *positions,
                                      uint32_t *n_rows);

/**
 * @brief kvdb_lookup that also counts blocks stored with dropped tokens (KVDB_METHOD_DROP).
 *
 * The walk of kvdb_lookup, in the local catalog only (no remote tier), except that a block
 * stored with dropped tokens continues the hit instead of ending it, when it is matched whole:
 * a full block (found by hash, its stored tokens equal to the query's), or a partial block (a
 * context's last) all of whose tokens start the rest of the query, which may go on past it.
 * A query that ends inside such a block ends the hit before it (a block that is not dropped
 * still hits in part, as in kvdb_lookup). No block data is read; the end of a hit costs up to
 * block_tokens - 1 more catalog reads (the partial blocks, by hash). kvdb_lookup itself is
 * unchanged (a dropped block ends its hit), because callers copy [0, hit) with kvdb_get and
 * expect every row there.
 * @param[out] hit_tokens 0..n: the hit covers query positions [0, *hit_tokens).
 * @param[out] kept_tokens rows of those positions that are stored, per layer and KV head (the
 *   same for every one: each block records its kept count; a context stored at keep_permille
 *   k since format 8 keeps round(T * k / 1000) (half up) of its first T tokens at every block
 *   boundary T, a block whose share rounds to none keeping 1; a block written before format 8
 *   keeps ceil(t * k / 1000) of its t tokens, at least 1; a block not dropped keeps all of its
 *   hit tokens). Equal to
 *   *hit_tokens when the hit holds no dropped block. kvdb_get_kept delivers exactly these.
 * @return KVDB_OK (also for 0 hits, and for a model id that is not stored; both outputs 0);
 *   KVDB_INVALID (as kvdb_lookup; hit_tokens or kept_tokens NULL); KVDB_MISMATCH (the id is
 *   stored with another shape); KVDB_BUSY; KVDB_IOERR.
 */
KVDB_API kvdb_status kvdb_lookup_kept(kvdb *db, const kvdb_model *m, const uint32_t *tokens,
                                      size_t n, size_t *hit_tokens, size_t *kept_tokens);

/**
 * @brief The hit of kvdb_lookup_kept, each stored row at its own position in `out`, and a mask
 * of which rows are there.
 *
 * `out` describes room for n tokens. For every layer l, KV head h and position t of the hit,
 * when the row (K and V) of (l, h, t) is stored it is copied to `out` at token t and
 * present[(l * n_kv_heads + h) * n + t] is set to 1; otherwise (a token the put dropped for
 * that head) present[...] is 0 and `out` at (l, h, t) is left as the caller had it. Mask
 * entries of positions [*hit_tokens, n) are 0 and `out` there is unspecified (a block that
 * fails part-way may have had verified sections copied before the failure showed). Every byte
 * is verified as kvdb_get_context does (a block read from disk is checked whole before any row
 * of it is copied); a block that fails verification, or whose kept rows do not number what its
 * record says, ends the hit there (KVDB_OK, shorter hit; kvdb_stat counts corrupt blocks).
 * Blocks stored with a lossy config return their decoded rows (an approximation, as the put
 * asked for). Local blocks only (no remote tier); the hit does not update access times or
 * frequencies, and is not promoted by the placement.
 * @param present room for present_cap bytes: at least n_layers * n_kv_heads * n.
 * @param[out] hit_tokens as kvdb_lookup_kept (of the blocks delivered).
 * @param[out] kept_tokens optional (NULL): rows delivered per layer and KV head, as
 *   kvdb_lookup_kept counts them.
 * @return KVDB_OK (also for 0 hits: the mask all 0); KVDB_INVALID (as kvdb_get; present or
 *   hit_tokens NULL; present_cap below n_layers * n_kv_heads * n; the message names it);
 *   KVDB_MISMATCH (*hit_tokens 0); KVDB_IOERR; KVDB_NOMEM.
 */
KVDB_API kvdb_status kvdb_get_kept(kvdb *db, const kvdb_model *m, const uint32_t *tokens,
                                   size_t n, const kvdb_kv_view *out, uint8_t *present,
                                   size_t present_cap, size_t *hit_tokens, size_t *kept_tokens);

/**
 * @brief K and V of chosen positions of one layer of a stored context, all KV heads.
 *
 * Reads only the 4 KiB page groups that hold the positions (dual-step loading, InstInfer
 * §IV-C: pages first, then tokens in memory), each verified by its checksum.
 * out's token i receives position positions[i]; positions may be in any order and repeat.
 * On a compressed context the groups holding the positions are read and decoded (see
 * "Compression configs"); a position some KV head dropped is KVDB_NOTFOUND, naming it.
 * @return KVDB_OK; KVDB_NOTFOUND (no such context, or a dropped position: nothing else);
 *   KVDB_INVALID (layer or a position out of range, NULL arguments, n_pos above 2^32 - 1);
 *   KVDB_MISMATCH; KVDB_CORRUPT (names segment, offset, block; a segment file that is missing or
 *   shorter than the block: names the file, "is missing" or "past the file's end"); KVDB_IOERR.
 */
KVDB_API kvdb_status kvdb_get_tokens(kvdb *db, const kvdb_model *m, const kvdb_key *context,
                                     uint32_t layer, const uint32_t *positions, size_t n_pos,
                                     const kvdb_kv_view *out);

/* ------------------------------------------------------------------------------------------ */
/** @defgroup explicit Explicit keys: blocks under the caller's own 128-bit key */

/**
 * @brief Store one block under the caller's own 128-bit key (e.g. a vLLM block hash).
 * `n_tokens` (1..block_tokens) tokens are stored with it for verification; the key is
 * namespaced by the model, so the same key under two models names two blocks. Replaces
 * nothing: putting an existing key with the same tokens is a no-op, with other tokens
 * KVDB_INVALID. Also listed as a one-block context (delete it with kvdb_delete).
 * @return as kvdb_put.
 */
KVDB_API kvdb_status kvdb_put_block(kvdb *db, const kvdb_model *m, const kvdb_key *key,
                                    const uint32_t *tokens, size_t n_tokens, const kvdb_kv_view *kv);

/**
 * @brief Read a block stored by kvdb_put_block. When `expect_tokens` is not NULL the block's
 * stored tokens must equal expect_tokens[0..n_tokens) or the result is KVDB_NOTFOUND (a
 * collision is a miss). `out` must have room for the block's tokens (at most block_tokens).
 * @param[out] out_tokens the number of tokens written (optional).
 * @return KVDB_OK; KVDB_NOTFOUND; KVDB_INVALID; KVDB_MISMATCH; KVDB_CORRUPT (as
 *   kvdb_get_tokens); KVDB_IOERR.
 */
KVDB_API kvdb_status kvdb_get_block(kvdb *db, const kvdb_model *m, const kvdb_key *key,
                                    const uint32_t *expect_tokens, size_t n_tokens,
                                    const kvdb_kv_view *out, size_t *out_tokens);

/** The key of an explicit-key block as stored (model namespace applied), for kvdb_delete. */
KVDB_API kvdb_status kvdb_block_context(const kvdb_model *m, const kvdb_key *key, kvdb_key *context);

/* ------------------------------------------------------------------------------------------ */
/** @defgroup tiers Tiers and placement: how fast each tier reads */

/**
 * @brief The tiers' read figures, per kvdb_tier: DRAM by a memory copy at open; SSD and
 * SmartSSD by a probe of their directory (a 32 MiB file written, synced, dropped from the page
 * cache and read back, then removed) cached in the catalog per directory and device, refined
 * by every cold kvdb_get of this handle (an exponentially weighted fit of block read time
 * against bytes). With `reprobe` set the persistent tiers are probed now and the cache
 * replaced (kvdb-admin probe). Works with placement off too. Tiers that are not configured
 * read 0.
 * @return KVDB_OK; KVDB_INVALID; KVDB_READONLY (reprobe on a read-only handle); KVDB_FULL;
 *   KVDB_IOERR.
 */
KVDB_API kvdb_status kvdb_tier_probe(kvdb *db, int reprobe, kvdb_tier_perf out[KVDB_TIER_COUNT]);

/**
 * @defgroup placement Rebalancing and placement statistics (EvicPress §4.4 on every context)
 *
 * A rebalance places every stored context anew: each takes its best (tier, config) by the
 * utility, then Algorithm 1 resolves each over-full tier from the top (see
 * kvdb_options.placement). It uses the handle's placement settings (capacities, alpha,
 * half-life, prefill speed, rule) when the handle has placement on; otherwise the settings the
 * database recorded at its last read-write open with placement on (so `kvdb-admin rebalance`
 * plans as the serving processes would), else it fails with KVDB_INVALID.
 */

/** kvdb_place_move.from_tier / to_tier of a context that is not stored (recomputed). */
#define KVDB_TIER_NONE KVDB_TIER_COUNT
/**
 * kvdb_place_move.to_tier of a context the plan moves to the remote tier: its blocks are
 * written to Redis (read back from the local store, verified) and then it is deleted locally.
 * The remote tier is a tier of the placement's model when the handle has placement on and a
 * remote tier it writes (remote_addr, remote_queue_blocks > 0, not KVDB_O_RDONLY) and the
 * server answered the tier's probe: its read bandwidth and latency are measured against the
 * live server (kvdb_rebalance_plan, the placement run over every context; again once 30 s
 * old), and it sits below the local tiers: the utility reads it at no better than the last
 * local tier's figures (a context is kept locally while it fits there; Redis serves what
 * leaves). Its capacity is kvdb_options.remote_bytes. Contexts already on Redis only are not
 * in the local catalog: plans place local contexts.
 */
#define KVDB_TIER_REMOTE (KVDB_TIER_COUNT + 1)

/** One context whose place a plan changes. */
typedef struct kvdb_place_move {
  kvdb_key context;
  uint32_t from_tier, to_tier;     /**< kvdb_tier of the persistent copy; KVDB_TIER_NONE for
                                        to_tier: the context is deleted (recomputing it is
                                        worth more than keeping it) */
  uint32_t from_cached, to_cached; /**< 1: also held by the DRAM tier */
  kvdb_config from_config, to_config;
  uint64_t from_bytes, to_bytes;   /**< stored bytes of the persistent copy (0: not stored) */
  double utility_from, utility_to; /**< U = (alpha * quality - TTFT) * frequency */
} kvdb_place_move;

/** A rebalance plan. Free with kvdb_place_plan_free(). */
typedef struct kvdb_place_plan {
  kvdb_place_move *moves;  /**< n_moves moves in execution order (room is freed before it is
                                used); owned by the plan */
  size_t n_moves;
  uint64_t n_contexts;     /**< contexts placed */
  uint64_t capacity[KVDB_TIER_COUNT];     /**< per kvdb_tier; 0 = not placed on (no such tier)
                                               or, for the SSD tier, unlimited */
  uint64_t bytes_before[KVDB_TIER_COUNT]; /**< bytes placed on each tier now and after the plan
                                               (DRAM: decoded bytes of the cached contexts) */
  uint64_t bytes_after[KVDB_TIER_COUNT];
  double utility_before, utility_after;   /**< sum of U over all contexts */
  uint64_t n_recompress, n_evict;         /**< greedy operations behind the plan */
  /** the remote tier in the plan's model (KVDB_TIER_REMOTE): 1 when it is there */
  int remote;
  uint64_t remote_capacity;     /**< kvdb_options.remote_bytes (0: unlimited) */
  uint64_t remote_bytes_after;  /**< bytes the plan moves there */
  kvdb_tier_perf remote_perf;   /**< its figures as measured (probed_ms: when) */
  kvdb_tier_perf remote_model;  /**< the figures the utility used (no better than the last
                                     local tier's) */
} kvdb_place_plan;

/**
 * @brief Plan a rebalance from the catalog as it is now (no data is moved). A read-write
 * handle first writes its pending access counts. The plan holds no reference to the handle.
 * @param[out] plan filled on KVDB_OK (free with kvdb_place_plan_free); zeroed on failure.
 * @return KVDB_OK; KVDB_INVALID (no placement settings); KVDB_NOMEM; KVDB_IOERR; KVDB_CORRUPT.
 */
KVDB_API kvdb_status kvdb_rebalance_plan(kvdb *db, kvdb_place_plan *plan);
/** @brief Free a plan's moves and zero it. NULL is a no-op. Cannot fail. */
KVDB_API void kvdb_place_plan_free(kvdb_place_plan *plan);

/** What kvdb_rebalance_execute did. */
typedef struct kvdb_rebalance_report {
  uint64_t relocated;   /**< moves carried out by a relocation (one transaction each) */
  uint64_t deleted;     /**< contexts deleted (pushed off the last tier) */
  uint64_t skipped;     /**< moves whose context changed or vanished since the plan */
  uint64_t cache_changes; /**< contexts entering or leaving the DRAM tier */
  uint64_t to_remote;   /**< contexts moved to the remote tier (written, then deleted here;
                             also counted in `deleted`) */
  uint64_t remote_unwritten; /**< blocks of those Redis did not take (the contexts were deleted
                                  all the same, as room was planned for) */
} kvdb_rebalance_report;

/**
 * @brief Carry out a plan: each move whose context is still where the plan found it becomes a
 * kvdb_relocate (its own transaction) or a delete; the others are skipped (plan again for
 * them). Then the DRAM flags of the moved contexts are recorded and every handle's DRAM tier
 * follows them. A crash at any point leaves each context either where it was or where the plan
 * puts it, readable either way (nothing else is lost). Callers may keep working meanwhile.
 * It runs as kvdb_rebalance_step calls of 64 moves each, back to back (the handle's placement
 * lock is let go between them); to bound each pause, or spread a rebalance over time, call
 * kvdb_rebalance_step instead.
 * @param report optional (NULL).
 * @return KVDB_OK; KVDB_INVALID; KVDB_READONLY; KVDB_FULL; KVDB_IOERR; KVDB_CORRUPT; KVDB_NOMEM.
 *   On an error the moves before it are done.
 */
KVDB_API kvdb_status kvdb_rebalance_execute(kvdb *db, const kvdb_place_plan *plan,
                                            kvdb_rebalance_report *report);

/**
 * @brief Carry out part of a plan, one bounded step: the moves from plan->moves[*next] on, as
 * kvdb_rebalance_execute carries them out, at most `max_moves` of them (0: no limit; skipped
 * moves count) and no further one once the relocations of this step have written `max_bytes`
 * (0: no limit; the bytes are the moves' to_bytes; the first move of a step is always made),
 * then the DRAM flags of the contexts moved in this step (every handle's DRAM tier follows when
 * a flag changed, or when the step ends the plan). *next becomes the index of the first move
 * not made: the plan is done when *next == plan->n_moves (a call then does nothing and returns
 * KVDB_OK). Between steps the caller may do anything, including puts and other rebalances;
 * moves whose context changed meanwhile are skipped. A step holds the handle's placement lock
 * while it runs, so puts of the handle wait for one step at most.
 * @param next in: the first move to make; out: the first move not made (on an error: the move
 *   that failed; the ones before it are done).
 * @param report optional (NULL): what this step did.
 * @return KVDB_OK (*next tells whether moves are left); KVDB_INVALID (next NULL or past the
 *   plan's end, or as kvdb_rebalance_execute); the other statuses of kvdb_rebalance_execute.
 */
KVDB_API kvdb_status kvdb_rebalance_step(kvdb *db, const kvdb_place_plan *plan, size_t *next,
                                         uint64_t max_moves, uint64_t max_bytes,
                                         kvdb_rebalance_report *report);

/** Contexts stored with one config on one tier (the EvicPress Figure 11 view). */
typedef struct kvdb_config_use {
  kvdb_config config;
  uint32_t tier;     /**< kvdb_tier of the persistent copy */
  uint32_t cached;   /**< 1: these are also in the DRAM tier */
  uint64_t contexts;
  uint64_t bytes;    /**< their stored bytes */
} kvdb_config_use;

typedef struct kvdb_placement_stats {
  uint64_t contexts;                     /**< stored contexts */
  uint64_t served_from[KVDB_TIER_COUNT]; /**< contexts served from each tier now (DRAM: the
                                              cached ones) */
  double utility;                        /**< sum of U now (placement settings as for a plan) */
  double utility_from[KVDB_TIER_COUNT];  /**< ... of the contexts served from each tier */
  double frequency;                      /**< sum of the decayed access counts */
  uint64_t blocks_read[KVDB_TIER_COUNT]; /**< blocks gets served from each tier, by every handle
                                              with placement on, as far as flushed to the
                                              catalog: the tiers' hit counts */
  kvdb_tier_perf perf[KVDB_TIER_COUNT];  /**< the figures the utility used */
  size_t n_uses;                         /**< entries kvdb_placement_stat found */
} kvdb_placement_stats;

/**
 * @brief Placement statistics: configs in use per tier into `uses` (up to `cap`; out->n_uses
 * says how many exist), contexts and utility by serving tier, tier hit counts and figures.
 * @return KVDB_OK; KVDB_INVALID (no placement settings, NULL out); KVDB_NOMEM; KVDB_IOERR.
 */
KVDB_API kvdb_status kvdb_placement_stat(kvdb *db, kvdb_placement_stats *out,
                                         kvdb_config_use *uses, size_t cap);

/** What the remote tier did for this handle since it opened (see kvdb_options.remote_addr). */
typedef struct kvdb_remote_stats {
  int enabled;          /**< 1 when the handle has a remote tier */
  int cluster;          /**< 1 when its server is a Redis Cluster */
  uint64_t nodes;       /**< Redis nodes known */
  uint64_t hits;        /**< blocks served (get) or counted (lookup) from the remote tier */
  uint64_t misses;      /**< remote chains that ended on an absent value or a failed command */
  uint64_t rejected;    /**< values that failed verification (corrupt, stale, colliding,
                             another namespace's): misses, never KV */
  uint64_t queued;      /**< blocks queued for write-through */
  uint64_t written;     /**< blocks written through (SET acknowledged) */
  uint64_t dropped;     /**< blocks not written through: queue full past remote_put_wait_ms,
                             failed SETs, blocks gone from the local store before their turn */
  uint64_t queue_len;   /**< blocks in the queue now */
  uint64_t round_trips; /**< pipelined round trips to Redis (a MOVED or ASK adds one) */
  uint64_t errors;      /**< connection failures, timeouts and error replies */
  uint64_t reconnects;  /**< connections opened again after a failure */
  uint64_t down_skips;  /**< commands not sent: their node was backing off after a failure */
  uint64_t redirects;   /**< MOVED and ASK replies followed */
  uint64_t bytes_in, bytes_out; /**< value bytes received and sent */
  uint64_t copied;      /**< remote-hit blocks stored in the local store (remote_copy_hits) */
  uint64_t copy_failed; /**< remote-hit blocks not stored locally: copy queue full, or the
                             local write failed (the get was served all the same) */
} kvdb_remote_stats;

/** @brief Fill *out (all zero but enabled = 0 without a remote tier). @return KVDB_OK;
 * KVDB_INVALID (NULL out, bad handle). */
KVDB_API kvdb_status kvdb_remote_stat(kvdb *db, kvdb_remote_stats *out);

/**
 * @brief The handle's metrics in Prometheus' text exposition format (version 0.0.4) into
 * buf[0..cap), NUL-terminated; *len receives the text's length (without the NUL) also when
 * it does not fit, so a caller can size a buffer and call again. Families (all `kvdb_`):
 * tier_hits_total / tier_misses_total {tier="dram|ssd|smartssd|remote"} (blocks, this
 * handle), tier_bytes / tier_contexts / tier_blocks {tier} (the catalog's counters; remote:
 * none), get_seconds / put_seconds / lookup_seconds (histograms of this handle's calls),
 * remote_* counters (kvdb_remote_stats), corrupt_blocks_total, placement_moves_total and
 * prefetch_hits_total (blocks served from the DRAM tier), bytes_read_total,
 * bytes_written_total.
 * @return KVDB_OK; KVDB_FULL (it did not fit: *len says how much is needed); KVDB_INVALID;
 *   KVDB_IOERR (reading the catalog's counters).
 */
KVDB_API kvdb_status kvdb_metrics(kvdb *db, char *buf, size_t cap, size_t *len);

/* ------------------------------------------------------------------------------------------ */
/**
 * @defgroup profile Quality profiles and re-encoding (what the placement policy decides from)
 *
 * A context's profile lists, for each config of a configured space, the context's stored size
 * in that config and its quality: the attention-output fidelity of the decoded KV against the
 * original — for probe queries q at token positions spread over the context (the caller's
 * kvdb_put_opts.probe_queries, else the context's keys at 64 evenly spaced positions, scaled to
 * the norm of a unit-variance query; never kvdb_put_opts.queries, SnapKV's window), each
 * attending causally to the keys at positions <= its own (dropped tokens absent),
 * softmax(q.K^T / sqrt(head_dim)).V per sampled (layer, KV head), compared by cosine (mean)
 * and relative L2 error. Sizes are extrapolated from the sampled heads, except for the config
 * the context is stored in (exact). A quality the caller measured itself (kvdb_report_quality,
 * e.g. task accuracy) wins over the proxy.
 *
 * Which figure is which: `cosine` is the mean over sampled heads of each head's mean cosine
 * (issue 16's per-head metric: what int4_quality reports), `worst_head` the lowest of those
 * per-head means. `quality` — what placement and re-profiling use — is `cosine`, unless the
 * model carries output-projection gains (kvdb_model_set_output_gains; flag
 * KVDB_PROFILE_WEIGHTED): then it is the output-weighted quality, which weighs the heads as the
 * model's W_o passes them on: per layer, the probes' attention-output errors and outputs,
 * sum_p sqrt(sum_h sum_c g_h,c e_h,c^2) / sum_p sqrt(sum_h sum_c g_h,c o_h,c^2) = r_l (the
 * relative L2 error of what the layer adds to the residual stream, W_o's cross-head terms
 * left out), r = the mean of r_l over the layers sampled, quality = max(0, 1 - r^2 / 2) (on
 * the cosine's scale). On SmolLM2-135M it ranks configs by the model's own next-token
 * agreement at Spearman 0.97 where the cosine gives 0.93 (bench/RESULTS.md, issue 16).
 */

enum {
  KVDB_PROFILE_STORED = 1u << 0, /**< the config the context is stored in */
  KVDB_PROFILE_EXACT = 1u << 1,  /**< `bytes` is measured, not extrapolated */
  KVDB_PROFILE_RESCALED = 1u << 2, /**< `quality` re-profiled from the caller's reports (see
                                        kvdb_report_quality), not the proxy's measure */
  KVDB_PROFILE_WEIGHTED = 1u << 3, /**< `quality` is the output-weighted quality (the model's
                                        output gains), not the cosine */
};

typedef struct kvdb_profile_entry {
  kvdb_config config;
  uint32_t flags;            /**< KVDB_PROFILE_* */
  uint64_t bytes;            /**< the context's stored bytes in this config */
  double quality;            /**< mean cosine of attention outputs (1 = exact); NaN if unmeasured */
  double rel_l2;             /**< relative L2 error of the attention outputs */
  double reported_quality;   /**< the caller's measure, NaN if none; it wins over `quality` */
  uint32_t n_reports;        /**< reports averaged into reported_quality */
  uint32_t n_probes;         /**< probe queries per sampled head; 0: the entry was predicted
                                  from the model's measured profiles, not measured on this
                                  context (kvdb_options.placement_profile) */
  double cosine;             /**< mean over sampled heads of the per-head mean cosine (= quality
                                  without KVDB_PROFILE_WEIGHTED); NaN if unmeasured */
  double worst_head;         /**< the lowest per-head mean cosine; recorded with
                                  KVDB_PROFILE_WEIGHTED profiles, else NaN */
} kvdb_profile_entry;

/**
 * @brief Measure a stored context's profile now (the space and probes of `opts`, or the
 * defaults) and record it, replacing an earlier one (caller reports are kept). The reference
 * is the context as stored: exact for RAW and LOSSLESS contexts; for lossy ones the figures
 * are relative to the stored approximation (and a config cannot be measured below what is
 * stored: dropped tokens cannot come back), which the entries say by quality NaN. `opts` is
 * checked as kvdb_put_ex checks it (struct_size, unknown flag bits: KVDB_INVALID).
 * @return KVDB_OK; KVDB_NOTFOUND; KVDB_MISMATCH; KVDB_INVALID; KVDB_READONLY; KVDB_CORRUPT; KVDB_IOERR.
 */
KVDB_API kvdb_status kvdb_profile(kvdb *db, const kvdb_model *m, const kvdb_key *context,
                                  const kvdb_put_opts *opts);

/** @brief The recorded profile of a context: up to `cap` entries into out, *n = how many the
 * profile has. @return KVDB_OK; KVDB_NOTFOUND (no context, or no profile recorded). */
KVDB_API kvdb_status kvdb_profile_get(kvdb *db, const kvdb_key *context, kvdb_profile_entry *out,
                                      size_t cap, size_t *n);

/**
 * @brief Record a quality the caller measured for a context in a config (0..1, e.g. answer
 * accuracy). Repeated reports are averaged; the entry is created if the profile lacks it.
 * Re-profiling (EvicPress §4.3), with placement on and reprofile_drift_pct > 0: when the
 * average reported quality of the config the context is stored in falls more than that
 * percentage below its profiled quality Q, the profile is re-scaled to the caller's measure —
 * every other entry without reports of its own gets quality 1 - min(1, k (1 - quality)),
 * k = (1 - reported) / (1 - Q), flag KVDB_PROFILE_RESCALED; the stored entry's profiled quality
 * becomes the reported one — and the context is placed again (it may be re-encoded, moved or,
 * when recomputing it is worth more, deleted). A context stored exactly (Q = 1) is not
 * re-scaled: its reports say nothing about compression.
 * @return KVDB_OK; KVDB_NOTFOUND; KVDB_INVALID (quality not in [0, 1], bad config); KVDB_READONLY.
 */
KVDB_API kvdb_status kvdb_report_quality(kvdb *db, const kvdb_key *context,
                                         const kvdb_config *config, double quality);

/**
 * @brief Re-encode a stored context to another config, in one transaction: its blocks are
 * decoded, encoded with `to` and written anew; then one catalog commit moves them (readers
 * keep reading the old copies until then; a crash before it leaves the old ones). Blocks the
 * context shares with others are left as they are (they keep the most faithful config of
 * their owners). Precision cannot come back: re-encoding a lossy context to a more faithful
 * config is KVDB_INVALID. `opts` gives queries for SnapKV (optional, NULL).
 * With `to` equal to the context's config: nothing is re-encoded (KVDB_OK), except a context
 * stored "lossless" (any zstd level), whose blocks it owns alone are rewritten in this build's
 * lossless format (lossless frames, format 5; the same KV bit for bit): the migration of
 * contexts written by earlier builds (`kvdb-admin recompress`).
 * @return KVDB_OK; KVDB_NOTFOUND; KVDB_MISMATCH; KVDB_INVALID; KVDB_READONLY; KVDB_FULL;
 *   KVDB_CORRUPT; KVDB_IOERR.
 */
KVDB_API kvdb_status kvdb_recompress(kvdb *db, const kvdb_model *m, const kvdb_key *context,
                                     const kvdb_config *to, const kvdb_put_opts *opts);

/**
 * @brief Move a stored context to `tier` (KVDB_TIER_SSD or KVDB_TIER_SMARTSSD) and re-encode
 * it to config `to` (NULL = keep its config), in one transaction, as kvdb_recompress does:
 * its blocks are written anew on the target tier (copied as they are when only the tier
 * changes, re-encoded otherwise) and synced, then one catalog commit moves them; readers keep
 * reading the old copies until then, and a crash before the commit leaves the old ones. Blocks
 * the context shares with other contexts stay where and how they are. Moving a context to
 * the tier and config it has is a no-op. Decoded copies in the DRAM tier stay valid when only
 * the tier changes and are dropped when the config changes.
 * @return KVDB_OK; KVDB_NOTFOUND; KVDB_MISMATCH; KVDB_INVALID (also: no such tier, or a
 *   SmartSSD tier without smartssd_bytes; an unreachable config as for kvdb_recompress);
 *   KVDB_READONLY; KVDB_FULL; KVDB_BUSY (the context changed meanwhile: retry); KVDB_CORRUPT;
 *   KVDB_IOERR.
 */
KVDB_API kvdb_status kvdb_relocate(kvdb *db, const kvdb_model *m, const kvdb_key *context,
                                   const kvdb_config *to, kvdb_tier tier,
                                   const kvdb_put_opts *opts);

/* ------------------------------------------------------------------------------------------ */
/**
 * @defgroup calib Per-model calibration of int4 and int2 (KVQuant's offline calibration)
 *
 * Optional. Without it, int4 and int2 code each section alone (kvquant, every channel 4 or 2
 * bits, groups of 128 tokens). A model calibrated once from a few contexts — their KV and the
 * model's own queries over them — codes every later int4 / int2 section (puts, kvdb_recompress,
 * relocation) the way KVQuant does: each block of 8 channels splits its bits among its channels
 * by least squared error, K's errors weighted by how much the queries look at each channel
 * (KVQuant's sensitivity weighting), and each (layer, KV head) gets its own K and V mean widths
 * and groups (1..7 bits; 256 or 128 tokens), chosen so that the heads whose errors cost the
 * attention output most get the bits, within a budget of bits per element (int4: 4.5, int2:
 * 2.5, scales and widths included). On stories260K this lifts int4 from 0.981 to ~0.99 on the
 * causal metric at <= 4.5 bits per element (bench/RESULTS.md, issue 16). The calibration is
 * stored with the model (model record version 3: a database with a calibrated model needs this
 * build or later to open that model's record); every section still records how it was coded,
 * so reads never need it and contexts stored before the calibration read as they did.
 * Never calibrate on the contexts you measure quality on (their queries are the probes).
 */

/** One calibration context: its KV and the model's queries at some of its positions. */
typedef struct kvdb_calib_context {
  const kvdb_kv_view *kv;     /**< tokens [0, n_tokens) of the context, as kvdb_put takes it */
  uint32_t n_tokens;          /**< 1..2^20 */
  /** The model's queries (after RoPE, like the keys), layout [n_queries][n_layers][n_q_heads]
   * [head_dim] floats; the query of position positions[i] at row i. Every query weighs K's
   * channels; up to 64 of them, spread over the list, are the probes of the per-head plan. */
  const float *queries;
  const uint32_t *positions;  /**< strictly increasing, < n_tokens */
  uint32_t n_queries;         /**< >= 1 */
} kvdb_calib_context;

/** kvdb_calib_opts.flags: which plans to compute (neither: K's weights only). */
enum { KVDB_CALIB_INT4 = 1u << 0, KVDB_CALIB_INT2 = 1u << 1 };

/** Options of kvdb_model_calibrate(). Call kvdb_calib_opts_init() first. */
typedef struct kvdb_calib_opts {
  uint32_t struct_size; /**< set by kvdb_calib_opts_init() */
  uint32_t flags;       /**< KVDB_CALIB_*; default both */
  uint32_t n_q_heads;   /**< the model's query heads, a multiple of n_kv_heads (required) */
  float int4_bits;      /**< int4's budget, bits per element, 1..8; 0 = 4.5 */
  float int2_bits;      /**< int2's budget, 1..8; 0 = 2.5 */
} kvdb_calib_opts;

/** @brief Fill *o with defaults (both plans, budgets 4.5 and 2.5; n_q_heads 0). */
KVDB_API void kvdb_calib_opts_init(kvdb_calib_opts *o);

/**
 * @brief Calibrate model m from n contexts and store the calibration with it (replacing an
 * earlier one; the model is recorded now when it is new). Takes the time of 24 int4 and 23
 * int2 encodes and decodes of every head of every context plus their quality measurement (one
 * thread; stories260K, 24 contexts of 512 tokens, the int4 plan alone: 2.5 minutes in a
 * debugoptimized build on a loaded 2-core VM). Contexts stored earlier keep how they were
 * coded. A damaged calibration (kvdb_verify reports it) is replaced by calibrating again.
 * @return KVDB_OK; KVDB_INVALID (NULLs, bad model or view, no contexts, no queries, positions
 *   not increasing or past the context, n_q_heads not a multiple, budgets out of range: the
 *   message names which); KVDB_MISMATCH (m's id is stored with another fingerprint);
 *   KVDB_READONLY; KVDB_NOMEM; KVDB_CORRUPT.
 */
KVDB_API kvdb_status kvdb_model_calibrate(kvdb *db, const kvdb_model *m,
                                          const kvdb_calib_context *contexts, size_t n,
                                          const kvdb_calib_opts *opts);

/** What kvdb_model_calibration() reports. */
typedef struct kvdb_calib_info {
  uint32_t calibrated;    /**< 1 when the model has a calibration (the rest is 0 otherwise) */
  uint32_t flags;         /**< KVDB_CALIB_* plans it holds */
  uint32_t n_contexts;    /**< contexts it was computed from */
  uint32_t n_probes;      /**< probe queries the plans were chosen with (over all heads) */
  float int4_bits, int2_bits; /**< the plans' budgets (0 without that plan) */
  float int4_planned_bits;    /**< mean of the int4 plan's K and V widths over heads (0 none) */
  float int2_planned_bits;
} kvdb_calib_info;

/**
 * @brief The calibration stored with model `id`.
 * @return KVDB_OK (calibrated 0 when it has none); KVDB_NOTFOUND (no such model); KVDB_INVALID;
 *   KVDB_CORRUPT (the stored calibration fails its checksum or holds values out of range: then
 *   every int4 / int2 put or re-encode of the model fails the same way, reads do not).
 */
KVDB_API kvdb_status kvdb_model_calibration(kvdb *db, const char *id, kvdb_calib_info *out);

/**
 * @brief Give model m its output-projection gains, stored with the model (model record
 * version 4: a database with such a model needs this build or later to open that model's
 * record; profiles measured with them are profile records of version 2), replacing earlier
 * ones; the model is recorded now when it is new. The profile of every later put and
 * kvdb_profile of the model then reports the output-weighted quality as `quality` (see the
 * profile group; the per-head cosine stays in kvdb_profile_entry.cosine). gains: floats
 * [n_layers][n_q_heads][channels], query head q of layer l at (l * n_q_heads + q) * channels:
 * channels 1, one gain per query head, ||W_o,q||_F^2 / head_dim where W_o,q is the
 * n_embd x head_dim block of the layer's output projection that head q's output multiplies
 * (on SmolLM2 it ranks as well as per-channel gains and W_o itself; 4 KiB for a 32-layer,
 * 32-head model); or channels head_dim, one per channel c, sum_i W_o[i][q * head_dim + c]^2.
 * Finite and >= 0. n_q_heads: the model's query heads (a multiple of n_kv_heads, <= 65536);
 * kvdb_put_opts.probe_queries must then come with the same n_q_heads (profiles without probe
 * queries weigh each KV head by the mean gain of its query heads). gains NULL, n_q_heads 0
 * and channels 0: remove them. A calibration stored with the model is kept.
 * @return KVDB_OK; KVDB_INVALID (NULLs, bad model, shape or value: the message names which);
 *   KVDB_MISMATCH (m's id is stored with another fingerprint); KVDB_READONLY; KVDB_NOMEM;
 *   KVDB_CORRUPT (the model's stored calibration is damaged: calibrate again first).
 */
KVDB_API kvdb_status kvdb_model_set_output_gains(kvdb *db, const kvdb_model *m,
                                                 const float *gains, uint32_t n_q_heads,
                                                 uint32_t channels);

/**
 * @brief The output gains stored with model `id`: *n_q_heads and *channels (both 0 when it has
 * none), *n the floats they hold (n_layers * n_q_heads * channels), the first min(cap, *n)
 * into out (NULL with cap 0: the shape only).
 * @return KVDB_OK; KVDB_NOTFOUND (no such model); KVDB_INVALID; KVDB_CORRUPT (the stored gains
 *   fail their checksum or hold values out of range: profiled puts and kvdb_profile of the
 *   model fail the same way until kvdb_model_set_output_gains stores new ones; puts without
 *   a profile and reads do not).
 */
KVDB_API kvdb_status kvdb_model_output_gains(kvdb *db, const char *id, float *out, size_t cap,
                                             size_t *n, uint32_t *n_q_heads, uint32_t *channels);

/* ------------------------------------------------------------------------------------------ */
/**
 * @defgroup score Top-k token scoring (near-data on the SmartSSD tier)
 *
 * Sparse-attention decoders (H2O, Quest, HillInfer) score every stored token against the
 * current query and attend to the top k. A model whose kvdb_model.score_bits is 8 or 4 stores
 * with every block an int8 or int4 copy of each (layer, KV head)'s keys, one scale per token,
 * page-grouped (FORMAT.md §3c). kvdb_score ranks a stored context's tokens by the RAW inner
 * product q·k on that copy (HillInfer §4.4: no softmax, no 1/sqrt(d), which keep the order) and
 * returns the top k positions; kvdb_get_head_tokens (one KV head; on the near-data device for
 * blocks on its tiers, so that only the chosen rows reach the host) or kvdb_get_tokens (every
 * head of a layer) then fetches their full-precision K and V, reading only their pages. Where a
 * block's copy is scored:
 *   - a block this handle holds in the DRAM tier: its copies are kept in DRAM beside it (read
 *     once, whole) and scored on the CPU (AVX-512 VNNI, AVX2 or portable kernels, threads,
 *     a streaming top k that never holds all N scores);
 *   - any other block: the host reads only the copy it needs (plus the region's checksum
 *     table page) and scores it on the CPU; or, with kvdb_score_opts.device, a block on a tier
 *     of device_tiers is scored by the near-data device (a SmartSSD's FPGA through XRT, or its
 *     emulation: the same kernel on the CPU, fed O_DIRECT reads), which streams <pos, score>
 *     blocks back (for k > 64: keeps them and sends its top k once) while the host scores the
 *     DRAM-resident copies and merges (HIE, HillInfer §4.2). Only positions and scores cross to
 *     the host. The host may take a share of those blocks meanwhile, so that both sides finish
 *     together (APP, HillInfer §4.3: kvdb_score_opts.host_share_permille).
 * Every path gives the same positions and scores, bit for bit.
 *
 * SCORE. A query vector (f32, f16 or bf16) is quantized to int8 with one scale; the score of
 * token t is its exact integer dot with t's codes, times the query's scale, times t's scale
 * (score/score.h "SCORE OF TOKEN t"). Grouped-query attention: the G query heads that
 * share one KV head are combined by KVDB_SCORE_SUM (default), the sum of their raw scores,
 * sum_g q_g·k = (sum_g q_g)·k — one dot with the summed query (summed in double, then
 * quantized), ranking like the group's mean; or by KVDB_SCORE_MAX, the largest of the G raw
 * scores per token (G dots). kvdb_score takes one vector: pass a group's sum for SUM.
 * ORDER. Higher score first; equal scores: the lower position first, so the top k is unique.
 * Positions are 0-based token indices of the context.
 */

/** How the query heads of one KV head combine (see ORDER above). */
typedef enum kvdb_score_combine {
  KVDB_SCORE_SUM = 0, /**< the sum of the heads' raw scores = (sum of the heads)·k (default) */
  KVDB_SCORE_MAX = 1, /**< the largest of the heads' raw scores */
} kvdb_score_combine;

/** Who scores the copies of blocks that are not in the DRAM tier. */
typedef enum kvdb_score_device {
  KVDB_SCORE_CPU = 0,       /**< the host: it reads each copy's pages (default) */
  KVDB_SCORE_NEAR_DATA = 1, /**< the near-data device for blocks on device_tiers: XRT when its
                                 environment, a device and an xclbin are present, else the
                                 emulated device */
  KVDB_SCORE_EMULATED = 2,  /**< the emulated device for blocks on device_tiers, always */
} kvdb_score_device; /* an opened device is kept by the handle for later calls (kvdb_close) */

/** Options of kvdb_score_batch(). Call kvdb_score_opts_init() first; read during the call. */
typedef struct kvdb_score_opts {
  uint32_t struct_size;       /**< set by kvdb_score_opts_init() */
  kvdb_score_combine combine; /**< default KVDB_SCORE_SUM */
  uint32_t n_threads;         /**< host scoring threads; 0 (default): the online CPUs */
  kvdb_score_device device;   /**< default KVDB_SCORE_CPU */
  uint32_t device_tiers;      /**< tiers whose blocks the device scores, bits (1u << kvdb_tier);
                                   0 (default): the SmartSSD tier; a bit of no tier:
                                   KVDB_INVALID. A real SmartSSD reads only files on its own
                                   flash; the emulation reads any segment. */
  const char *xclbin_path;    /**< NEAR_DATA with XRT: the kernel (NULL: $KVDB_XCLBIN) */
  uint32_t chunk_tokens;      /**< tokens per device run and score block (HIE's n): a multiple
                                   of 64; 0 = 16384 */
  int32_t host_share_permille;/**< with a device: the share (0..1000) of the device-tier blocks
                                   the host reads and scores itself while the device scores the
                                   rest; -1 (default): HillInfer's APP split (§4.3, Eq. 4) from
                                   the rates this handle measured on earlier calls (the first
                                   call splits evenly; the chosen beta is logged at level 3);
                                   0: the device scores all, 1000: the host does. The results
                                   are the same whatever the share */
} kvdb_score_opts;

/** @brief Fill *o with defaults. Cannot fail. */
KVDB_API void kvdb_score_opts_init(kvdb_score_opts *o);

/** Where the work of one kvdb_score_batch() went (bytes are exact, counted as read). */
typedef struct kvdb_score_stats {
  uint64_t tokens;          /**< tokens scored, summed over the requests */
  uint64_t dram_copies;     /**< block copies scored from the DRAM tier */
  uint64_t host_copies;     /**< block copies the host read from a segment file and scored */
  uint64_t device_copies;   /**< block copies the near-data device scored */
  uint64_t host_bytes;      /**< bytes the host read from segment files (copies, checksum
                                 table pages, whole regions copied into the DRAM tier) */
  uint64_t device_bytes;    /**< bytes the device read from segment files (P2P) */
  uint64_t device_to_host_bytes; /**< <pos, score> pairs the device sent to the host */
} kvdb_score_stats;

/** Where the work of one kvdb_get_head_tokens() went (bytes are exact, counted as read). */
typedef struct kvdb_fetch_stats {
  uint64_t rows;                 /**< positions fetched (a K and a V row each) */
  uint64_t dram_blocks;          /**< blocks served from the DRAM tier */
  uint64_t host_blocks;          /**< blocks whose pages the host read and verified */
  uint64_t device_blocks;        /**< blocks the near-data device read and gathered from */
  uint64_t decoded_blocks;       /**< compressed blocks decoded on the host */
  uint64_t host_bytes;           /**< bytes the host read from segment files */
  uint64_t device_bytes;         /**< bytes the device read from segment files (P2P) */
  uint64_t device_to_host_bytes; /**< gathered rows the device sent to the host */
  uint64_t unverified_groups;    /**< page groups gathered by a device that cannot check them */
} kvdb_fetch_stats;

/** One scoring request of kvdb_score_batch(). */
typedef struct kvdb_score_req {
  uint32_t layer;       /**< 0 .. n_layers - 1 */
  uint32_t kv_head;     /**< 0 .. n_kv_heads - 1 */
  const void *q;        /**< n_q query vectors of head_dim elements (q_dtype), back to back */
  uint32_t n_q;         /**< query heads sharing this KV head: 1 .. 256 (0 means 1) */
  uint32_t k;           /**< 1 .. the context's tokens */
  uint32_t *positions;  /**< out: k positions, best first */
  float *scores;        /**< out, optional (NULL): their scores */
} kvdb_score_req;

/**
 * @brief The top k tokens of a stored context for one query vector against one layer and KV
 * head (see the group's comment). `q` holds head_dim elements of q_dtype (finite); positions
 * (and scores, optional) receive k entries, best first. Same as kvdb_score_batch with one
 * request and default options.
 * @return KVDB_OK; KVDB_UNSUPPORTED (the model keeps no score copies: score_bits 0);
 *   KVDB_INVALID (NULL, k 0 or larger than the context, layer or kv_head out of range, a bad
 *   q_dtype, a non-finite query element); KVDB_NOTFOUND (no such context); KVDB_MISMATCH (the
 *   context belongs to another model, or the id is stored with another shape); KVDB_CORRUPT (a
 *   copy failed its checksum: names the segment, offset and block; or its segment file is
 *   missing or too short: names the file); KVDB_IOERR; KVDB_NOMEM.
 */
KVDB_API kvdb_status kvdb_score(kvdb *db, const kvdb_model *m, const kvdb_key *context,
                                uint32_t layer, uint32_t kv_head, const void *q,
                                kvdb_dtype q_dtype, uint32_t k, uint32_t *positions,
                                float *scores);

/**
 * @brief The full-precision K and V rows of `n_pos` positions of one layer and KV head of a
 * stored context (the fetch after kvdb_score: each head its own top k), reading only that
 * head's page groups that hold them. k_out and v_out receive n_pos rows of head_dim elements of
 * the model's dtype, in the order of `positions`. With opts->device set, blocks on the device
 * tiers are read by the near-data device, which checks the groups and gathers the rows so that
 * only they cross to the host (HillInfer §4.2; InstInfer §IV-C's token step on the device).
 * The emulated device checks every group's checksum before gathering; a SmartSSD through XRT
 * cannot yet (its kernel has no XXH3 unit: stats->unverified_groups counts those groups).
 * Compressed (format 2) blocks are decoded on the host through kvdb_get_tokens (every KV head of
 * the layer is read for those positions; their bytes are counted from the handle's read
 * counter). The rows equal kvdb_get_tokens's for the same positions, bit for bit, on every
 * path. Of opts only device, device_tiers and xclbin_path are used. opts NULL = defaults; stats
 * optional.
 * @return KVDB_OK; KVDB_INVALID (NULL, n_pos 0, layer or kv_head out of range, a position past
 *   the context); KVDB_NOTFOUND; KVDB_MISMATCH; KVDB_CORRUPT (a group failed its checksum, or
 *   the segment file is missing or too short: names the file); KVDB_IOERR; KVDB_NOMEM.
 */
KVDB_API kvdb_status kvdb_get_head_tokens(kvdb *db, const kvdb_model *m, const kvdb_key *context,
                                          uint32_t layer, uint32_t kv_head,
                                          const uint32_t *positions, size_t n_pos, void *k_out,
                                          void *v_out, const kvdb_score_opts *opts,
                                          kvdb_fetch_stats *stats);

/**
 * @brief Several scoring requests over one context at once (heads, layers, or both): each
 * block's copies are read once for all of them. Each request's result is what kvdb_score
 * gives for it. opts NULL = defaults; stats (optional) receives where the work went.
 * @return as kvdb_score; KVDB_INVALID names the request; KVDB_UNSUPPORTED also when a device
 *   that was asked for (KVDB_SCORE_NEAR_DATA with an xclbin, XRT present) cannot be opened.
 */
KVDB_API kvdb_status kvdb_score_batch(kvdb *db, const kvdb_model *m, const kvdb_key *context,
                                      kvdb_dtype q_dtype, const kvdb_score_req *reqs,
                                      size_t n_reqs, const kvdb_score_opts *opts,
                                      kvdb_score_stats *stats);

/* ------------------------------------------------------------------------------------------ */
/** @defgroup keytext Keys as text */

/** @brief Hex of a key (32 chars + NUL) into buf (>= 33 bytes). Returns buf. Cannot fail. */
KVDB_API char *kvdb_key_hex(const kvdb_key *key, char *buf);
/** @brief Parse 32 hex chars. @return KVDB_OK; KVDB_INVALID. */
KVDB_API kvdb_status kvdb_key_parse(const char *hex, kvdb_key *out);

/* ------------------------------------------------------------------------------------------ */
/**
 * @defgroup prefetch Prefetch (TierKV, seed 003 §3.4-§3.5)
 *
 * A serving engine's scheduler knows the requests of its next K steps. kvdb_prefetch stages
 * the longest stored prefix of such a request's prompt into the DRAM tier in the background:
 * the call only queues it (no I/O, no catalog read) and returns a ticket; one worker thread
 * of the handle then finds the prefix's blocks (as kvdb_lookup) and reads each block not yet in
 * the DRAM tier from its segment file, verified as kvdb_get verifies, into the DRAM tier,
 * whatever the placement keeps there. A later kvdb_get of the prompt finds those blocks there
 * (unless the tier's LRU evicted them meanwhile: size dram_bytes for the window). What the
 * tier already holds is not read again.
 *
 * Order: the queued request with the earliest deadline first, then those without one by
 * higher priority, then in the order queued. A request whose deadline passes before it has
 * been read ends KVDB_PREFETCH_EXPIRED (what it staged stays staged).
 *
 * Admission: foreground reads first. The worker queues no read while a kvdb_get of the
 * handle is reading, and its bandwidth is bounded by a token bucket whose rate is what the
 * foreground leaves below 80% of the tier's read speed (as measured from the handle's reads),
 * at least 5% of it, at most kvdb_options.prefetch_bps when set. Prefetch reads go in waves of
 * whole layers, at most 1 MiB (or one layer where a layer of a block is larger), so a
 * foreground get waits for at most one of them; the worker also waits while a foreground get
 * reads before it verifies and copies what arrived.
 *
 * Idempotent: a prefetch of a token sequence that is queued or running (same model, same
 * tokens) returns that request's ticket and queues nothing; the request takes the higher of
 * the two priorities and the earlier of the two deadlines. Cancellable: kvdb_prefetch_cancel.
 * kvdb_close cancels what is queued, stops the running one at its next read, and waits for it.
 * The handle remembers the outcome of its last 1,024 finished requests.
 */

typedef uint64_t kvdb_prefetch_id; /**< a ticket; 0 is never one */

/** Where a prefetch request is. Values are pinned. */
typedef enum kvdb_prefetch_state {
  KVDB_PREFETCH_QUEUED = 0,
  KVDB_PREFETCH_RUNNING = 1,
  KVDB_PREFETCH_DONE = 2,      /**< the prefix is staged (status KVDB_OK) */
  KVDB_PREFETCH_CANCELLED = 3, /**< kvdb_prefetch_cancel or kvdb_close */
  KVDB_PREFETCH_FAILED = 4,    /**< status says why (e.g. KVDB_IOERR, KVDB_MISMATCH) */
  KVDB_PREFETCH_EXPIRED = 5,   /**< its deadline passed first */
} kvdb_prefetch_state;

/** Options of kvdb_prefetch(). Call kvdb_prefetch_opts_init() first; read during the call. */
typedef struct kvdb_prefetch_opts {
  uint32_t struct_size; /**< set by kvdb_prefetch_opts_init() */
  int32_t priority;     /**< higher first among requests without a deadline; default 0 */
  uint64_t deadline_us; /**< microseconds from the call by which it is needed; 0 (default):
                             none. Earliest deadline first; a request not done by then ends
                             EXPIRED */
} kvdb_prefetch_opts;

/** @brief Fill *o with defaults. Cannot fail. */
KVDB_API void kvdb_prefetch_opts_init(kvdb_prefetch_opts *o);

/** What kvdb_prefetch_poll() reports. */
typedef struct kvdb_prefetch_info {
  kvdb_prefetch_state state;
  kvdb_status status;      /**< KVDB_OK unless FAILED */
  uint64_t staged_tokens;  /**< leading tokens of the prompt whose blocks are in the DRAM tier
                                (when DONE: the stored prefix, as kvdb_lookup gives it) */
  uint32_t blocks_read;    /**< blocks this request read into the DRAM tier */
  uint32_t blocks_present; /**< blocks it found there already */
  uint64_t bytes_read;     /**< bytes it read from segment files (while RUNNING: the bytes
                                of the reads it has queued so far) */
} kvdb_prefetch_info;

/**
 * @brief Queue a prefetch of the longest stored prefix of `tokens[0..n)` into the DRAM tier
 * (see the group's comment). Never waits for I/O. tokens are copied.
 * @param opts NULL = defaults. @param[out] id the request's ticket (also an existing one's).
 * @return KVDB_OK; KVDB_INVALID (NULL, n 0 or above 2^32 x 16, bad model, opts not set by
 *   kvdb_prefetch_opts_init); KVDB_UNSUPPORTED (the handle has no DRAM tier: dram_bytes 0);
 *   KVDB_NOMEM. Errors of the reads (KVDB_MISMATCH, KVDB_IOERR, ...) are the request's, through
 *   kvdb_prefetch_poll.
 */
KVDB_API kvdb_status kvdb_prefetch(kvdb *db, const kvdb_model *m, const uint32_t *tokens,
                                   size_t n, const kvdb_prefetch_opts *opts,
                                   kvdb_prefetch_id *id);

/**
 * @brief Where request `id` is (the completion query). Never waits.
 * @return KVDB_OK; KVDB_INVALID (NULL out); KVDB_NOTFOUND (no such ticket, or one finished
 *   longer ago than the last 1,024).
 */
KVDB_API kvdb_status kvdb_prefetch_poll(kvdb *db, kvdb_prefetch_id id, kvdb_prefetch_info *out);

/**
 * @brief Cancel request `id`: a queued one ends CANCELLED at once; a running one stops before
 * its next read (blocks it staged stay in the DRAM tier: they are valid). Never waits.
 * @return KVDB_OK (also when it had finished already: nothing changes then); KVDB_NOTFOUND.
 */
KVDB_API kvdb_status kvdb_prefetch_cancel(kvdb *db, kvdb_prefetch_id id);

/** Called by kvdb_get_notify once positions [t0, t0 + n_tokens) of its `out` hold their
 * verified KV, in the calling thread, in order of t0. */
typedef void (*kvdb_block_fn)(void *ctx, size_t t0, size_t n_tokens);

/**
 * @brief kvdb_get, telling `on_block` (optional) as each block of the hit lands in `out`, so a
 * caller can move it on (to a GPU: gpu/kvdb_gpu.h) while the next one is read. A told range
 * holds the verified KV of its positions. A range may be told more than once, with the same
 * bytes, and (rarely) past the final *hit_tokens: when a read that came back short is retried
 * after a compaction moved blocks, the retry may end sooner. on_block NULL: kvdb_get. With
 * on_block set the hit is the local one: a remote tier (kvdb_options.remote_addr) is not asked
 * for the rest of the chain (its blocks would land untold). Returns as kvdb_get.
 */
KVDB_API kvdb_status kvdb_get_notify(kvdb *db, const kvdb_model *m, const uint32_t *tokens,
                                     size_t n, const kvdb_kv_view *out, size_t *hit_tokens,
                                     kvdb_block_fn on_block, void *ctx);

/**
 * A block of a get's hit LENT from the DRAM tier (kvdb_get_lend): its raw data region, read in
 * place by the caller (a DMA engine: a GPU's copy straight from the tier) instead of copied into
 * the caller's view. The bytes are the block's verified K and V and do not change until the
 * block is given back (kvdb_lent_return): until then the tier neither evicts nor reuses them.
 *
 * Layout (format/FORMAT.md §3, the data region: sections in page groups): section
 * s = (layer * n_kv_heads + head) * 2 + kv (kv 0: K, 1: V) begins at data + s * section_bytes;
 * token t of a section at + (t / group_tokens) * group_stride + (t % group_tokens) * row_bytes,
 * row_bytes = head_dim x the dtype's bytes, elements in the model's dtype. The query's positions
 * [t0, t0 + n_tokens) are the block's tokens [0, n_tokens).
 */
typedef struct kvdb_lent_block {
  const void *data;       /**< the data region, in the DRAM tier (kvdb_dram_memory's range) */
  uint64_t data_bytes;    /**< its bytes */
  size_t t0;              /**< the first position of the query it holds */
  size_t n_tokens;        /**< positions it holds: [t0, t0 + n_tokens) */
  uint32_t n_sections;    /**< n_layers * n_kv_heads * 2 */
  uint32_t group_tokens;  /**< tokens per group of a section */
  uint32_t row_bytes;     /**< one token of one head: head_dim x the dtype's bytes */
  uint32_t group_stride;  /**< bytes from one group of a section to the next */
  uint64_t section_bytes; /**< bytes from one section to the next */
  void *lease;            /**< kvdb's; kvdb_lent_return gives the block back */
} kvdb_lent_block;

/** Offered each block of the hit found in the DRAM tier, in the calling thread, in order of t0,
 * before it would be copied. Return 1 to take it: nothing is written to `out` for it, on_block is
 * not told, and the caller gives it back with kvdb_lent_return once done reading (before
 * kvdb_close); 0 to have it copied into `out` and told as kvdb_get_notify does. */
typedef int (*kvdb_lend_fn)(void *ctx, const kvdb_lent_block *b);

/**
 * @brief kvdb_get_notify that LENDS the hit's blocks held by the DRAM tier to `on_lend` instead of
 * copying them into `out` (zero-copy: libkvgpu copies them to device memory straight from the
 * tier, whose memory it has page-locked: kvdb_dram_memory). Blocks read from a disk tier are
 * copied into `out` and told to on_block as kvdb_get_notify does. Every position of the final
 * *hit_tokens was either told or lent (a block may be lent or told more than once when a short
 * read is retried: each lending is given back). on_lend NULL: kvdb_get_notify. As with on_block,
 * the remote tier is not asked. Returns as kvdb_get.
 */
KVDB_API kvdb_status kvdb_get_lend(kvdb *db, const kvdb_model *m, const uint32_t *tokens, size_t n,
                                   const kvdb_kv_view *out, size_t *hit_tokens,
                                   kvdb_block_fn on_block, kvdb_lend_fn on_lend, void *ctx);

/** Give back a block kvdb_get_lend lent (b->lease); b->data must not be read after. */
KVDB_API void kvdb_lent_return(kvdb *db, const kvdb_lent_block *b);

/**
 * @brief The DRAM tier's memory: one range, [*base, *base + *bytes), mapped for the handle's
 * life, that holds every block the tier keeps (and so every block kvdb_get_lend lends), for a
 * caller that page-locks it for DMA (cudaHostRegister: libkvgpu's kvdb_gpu_attach).
 * @return KVDB_OK; KVDB_UNSUPPORTED when the tier is off (options.dram_bytes 0); KVDB_INVALID for
 * a NULL argument.
 */
KVDB_API kvdb_status kvdb_dram_memory(kvdb *db, void **base, size_t *bytes);

/* ------------------------------------------------------------------------------------------ */
/**
 * @defgroup decode Decoding from the store: appends, per-step top-k, hot and cold pools
 *
 * A decoder keeps a long context's KV in the store and, at each decode step and layer, reads
 * only the tokens that matter (HillInfer seed 002 §4.2-§4.4, InstInfer seed 001 §IV-C). A
 * decode session (kvdb_decode_open) holds one or several stored contexts (a batch of
 * sequences) of a model whose score_bits is 8 or 4. Per step, for each layer: kvdb_decode_select
 * ranks every token of a context against the step's query (q·K on the int8/int4 score copies,
 * as kvdb_score_batch: the host for blocks in the DRAM tier, the near-data device - or its
 * emulation - for blocks on the device tiers, merged as score blocks stream in: HIE; the share
 * the host takes, beta, recomputed per step by HillInfer's APP, Eq. 2-4, from the rates the
 * session measured); kvdb_decode_fetch then delivers the full-precision K and V of the chosen
 * positions into the caller's layout, from DRAM where the session holds them (the hot pool)
 * and from the store otherwise (dual-step: the 4 KiB page groups holding them, then the rows).
 *
 * APPEND. kvdb_decode_append extends a context by generated tokens (their ids and K and V for
 * every layer and KV head). The tokens are kept in the session's DRAM and are selectable and
 * fetchable at once; each time the context's last block fills (block_tokens tokens: with
 * head_dim 128 in f16, block_tokens 16 is one 4 KiB page group per section) the filled blocks
 * are written (RAW, page-grouped, with their score copies), synced and published in ONE catalog
 * transaction that also replaces the context's previous record: the context's key changes to
 * the hash of its new last block (kvdb_decode_context says which), the blocks it had are shared,
 * not rewritten, except a trailing partial block, which is rewritten whole within the new full
 * one. kvdb_decode_flush also writes a trailing partial block. A crash loses at most the tokens
 * not yet published; every published token reads back exactly (kvdb_get, kvdb_get_tokens), and
 * the database stays as kvdb_verify wants it. The previous record is deleted only when this
 * session's appends created it or it was the context opened; kvdb_lookup of the grown token
 * sequence hits all published tokens. kvdb_append is the one-shot form (open, append, flush).
 * Appended blocks are stored RAW on this handle's segments whatever the context's config, and
 * the placement is not run after an append (the next put or rebalance sees the context).
 *
 * HOT POOL (BKP, §4.2). Per context, layer and KV head the session keeps in DRAM: the most
 * recent `recent_tokens` tokens (pinned, with the unpublished ones) and up to `hot_tokens`
 * others, the most often selected ones. Each selection of a position counts in a hit-rate
 * table of 2 bytes per token (+64 per selection; every step of a layer ages its entries by 1/8,
 * so the count weighs recent selections most: a token selected at every step settles at 512). Promotion and demotion are deferred
 * work: the rows a fetch read from the store are kept as candidates, and at the start of the
 * next kvdb_decode_select of the same context and layer (after the step) the hot pool becomes
 * the candidates and members with the highest counts (ties: the more recent), up to hot_tokens.
 * Rows never come from anything but the caller's appends or verified reads: a hot hit is the
 * stored KV bit for bit.
 *
 * Not concurrent: one thread at a time per session; several sessions may share one handle as
 * the handle's other calls do.
 */

typedef struct kvdb_decode kvdb_decode;

/** Options of kvdb_decode_open(). Call kvdb_decode_opts_init() first; read during the call. */
typedef struct kvdb_decode_opts {
  uint32_t struct_size;       /**< set by kvdb_decode_opts_init() */
  uint32_t recent_tokens;     /**< W, the pinned recent window per context: 0..65536; default 64 */
  uint32_t hot_tokens;        /**< hot pool capacity per context, layer and KV head, in tokens
                                   beside the recent window: 0..2^24; default 1024 */
  kvdb_score_combine combine; /**< how query heads of a KV head combine; default SUM */
  kvdb_score_device device;   /**< who scores cold blocks (as kvdb_score_opts); default CPU */
  uint32_t device_tiers;      /**< as kvdb_score_opts.device_tiers */
  const char *xclbin_path;    /**< as kvdb_score_opts.xclbin_path */
  uint32_t n_threads;         /**< host scoring threads (0: the online CPUs) */
  int32_t host_share_permille;/**< -1 (default): APP's beta per step (Eq. 4, from the
                                   measured rates); 0..1000: fixed, as kvdb_score_opts */
  uint32_t flags;             /**< KVDB_DECODE_* */
  int32_t fetch_device;       /**< who gathers cold rows: -1 (default) as `device`, else a
                                   kvdb_score_device (KVDB_SCORE_CPU: the host reads the page
                                   groups itself) */
  /**
   * With KVDB_DECODE_PAGE_GROUPS: 0 (default) the cold picks are replaced by as many page-group
   * positions (the flag's rule). 1..1000: a COLD BUDGET: at most k x cold_share_permille / 1000
   * positions per KV head come from page groups read from the store, whole groups only (most
   * cold top-k positions first); the rest of the k goes to the top k's positions in DRAM and
   * then to the best-ranked positions in DRAM past the top k (from a ranking of 4k). A select
   * falls back to more groups when DRAM holds too few. Every row of the groups read is a
   * promotion candidate (as with the flag alone, unless KVDB_DECODE_PROMOTE_PICKS). Trades the cold picks that no chosen
   * group holds (the flag's rule does not fetch them either) for high-scoring DRAM rows.
   */
  uint32_t cold_share_permille;
} kvdb_decode_opts;

/** kvdb_decode_opts.flags; any other bit is KVDB_INVALID. */
enum {
  /**
   * Page-group selection (InstInfer's page groups as the unit of the cold pool): of the top k,
   * the positions in DRAM stay; the cold ones are replaced by whole 4 KiB page groups (the
   * block's groups of min(4096 / (head_dim x element bytes), block_tokens) tokens), taken in the
   * order of the number of cold top-k positions they hold (then of their best-ranked one), all
   * their cold tokens, until as many cold positions are
   * chosen as the top k had (the last group may be cut). A step then reads no page for one
   * row of it: read amplification near 1. positions[] then holds the DRAM positions best
   * first, then the groups' positions; scores[] holds NaN for positions taken with a group.
   */
  KVDB_DECODE_PAGE_GROUPS = 1u << 0,
  /**
   * With KVDB_DECODE_PAGE_GROUPS and no cold budget: only the top-k picks among the rows a
   * fetch reads are hot-pool promotion candidates (the rule before 2026-11-27). Without it
   * every row of the page groups read is one: the bytes came anyway, a row without hits only
   * takes a free slot (it loses to any row with hits in the hit-rate table's order), and
   * selected positions cluster (a pick's neighbour is picked at 7 times the base rate in
   * stories260K's attention), so they are selected later.
   */
  KVDB_DECODE_PROMOTE_PICKS = 1u << 1,
};

/** @brief Fill *o with defaults. Cannot fail. */
KVDB_API void kvdb_decode_opts_init(kvdb_decode_opts *o);

/** What a session did, summed over its contexts since kvdb_decode_open (bytes exact). */
typedef struct kvdb_decode_stats {
  uint64_t steps;           /**< kvdb_decode_select calls on layer 0 (of any context) */
  uint64_t selects;         /**< kvdb_decode_select calls */
  uint64_t selected;        /**< rows kvdb_decode_fetch delivered (a K and a V row each) */
  uint64_t hot_hits;        /**< of those, served from DRAM (recent window, unpublished tokens,
                                 hot pool) */
  uint64_t cold_reads;      /**< of those, read from the store */
  uint64_t ssd_bytes;       /**< bytes fetches read from segment files (host and device) */
  uint64_t cold_row_bytes;  /**< bytes of the K and V rows of the cold_reads */
  uint64_t score_bytes;     /**< bytes scoring read from segment files (host and device) */
  uint64_t host_bytes;      /**< bytes that crossed to the host: what the host read from
                                 segment files plus what the device sent it */
  uint64_t promoted;        /**< rows promoted into hot pools */
  uint64_t demoted;         /**< rows demoted out of them */
  uint64_t appended;        /**< tokens appended */
  uint64_t published;       /**< appended tokens published (written and committed) */
  uint64_t hot_pool_bytes;  /**< DRAM the hot pools and recent windows hold now */
  double beta;              /**< the host's share of device-tier scoring at the last select,
                                 0..1 (APP) */
  uint64_t top_k;           /**< positions of the true top k the selects ranked (k per KV head
                                 and select) */
  uint64_t top_k_returned;  /**< of those, how many the selects returned (all of them without
                                 KVDB_DECODE_PAGE_GROUPS; with it, the ones in DRAM and in the
                                 chosen page groups) */
} kvdb_decode_stats;

/**
 * @brief Open a decode session over `n_contexts` stored contexts (1..1024) of model m (score_bits
 * 8 or 4). The session reads each context's recent window (and a trailing partial block) into
 * DRAM. Contexts are addressed by their index in `contexts`. opts NULL = defaults.
 * @return KVDB_OK; KVDB_INVALID (NULL, n_contexts 0 or above 1024, an option out of range: the
 *   message names it); KVDB_UNSUPPORTED (score_bits 0); KVDB_NOTFOUND (a context is not stored:
 *   names its index); KVDB_MISMATCH; KVDB_CORRUPT; KVDB_IOERR; KVDB_NOMEM. *out NULL on error.
 */
KVDB_API kvdb_status kvdb_decode_open(kvdb *db, const kvdb_model *m, const kvdb_key *contexts,
                                      size_t n_contexts, const kvdb_decode_opts *opts,
                                      kvdb_decode **out);

/**
 * @brief Append n tokens (ids tokens[0..n), K and V in `kv`, n tokens of every layer and KV
 * head) to context `ctx` of the session (see APPEND). Whole blocks filled by them are published
 * before the call returns (a write handle is needed then: KVDB_READONLY otherwise; on a
 * failure to publish, the tokens stay in the session, selectable, and the next append or
 * flush tries again).
 * @return KVDB_OK; KVDB_INVALID (NULL, n 0, ctx out of range, the context would exceed 2^32
 *   tokens, a bad view); KVDB_READONLY; KVDB_BUSY (the context's record was replaced or deleted
 *   by someone else since: the session no longer publishes it); KVDB_FULL; KVDB_IOERR;
 *   KVDB_NOMEM.
 */
KVDB_API kvdb_status kvdb_decode_append(kvdb_decode *s, uint32_t ctx, const uint32_t *tokens,
                                        size_t n, const kvdb_kv_view *kv);

/** @brief Publish every appended token of every context, trailing partial blocks included.
 * @return KVDB_OK (also with nothing to publish); as kvdb_decode_append otherwise. */
KVDB_API kvdb_status kvdb_decode_flush(kvdb_decode *s);

/**
 * @brief Where context `ctx` stands: its current key (the last published block's hash; what
 * kvdb_get_tokens and kvdb_context_stat take), its tokens (published + unpublished) and its
 * published tokens. Outputs optional. @return KVDB_OK; KVDB_INVALID (NULL s, ctx out of range).
 */
KVDB_API kvdb_status kvdb_decode_context(kvdb_decode *s, uint32_t ctx, kvdb_key *key,
                                         uint64_t *n_tokens, uint64_t *n_published);

/**
 * @brief The top k positions of context `ctx` at `layer` for this step's query, for every KV
 * head: q holds n_q_heads query vectors of head_dim elements of q_dtype (head j belongs to KV
 * head j / (n_q_heads / n_kv_heads)); positions[h * k + i] (and scores[h * k + i], optional)
 * receive KV head h's i-th best, as kvdb_score_batch orders them (published and unpublished
 * tokens alike, the same scores for both). Waits for the hot-pool work of the context and
 * layer's last fetch first (it runs in the background: see kvdb_decode_fetch).
 * @return KVDB_OK; KVDB_INVALID (NULL, ctx or layer out of range, n_q_heads 0 or not a multiple
 *   of n_kv_heads, k 0 or above the context's tokens, a bad q_dtype or non-finite element: the
 *   message names it); KVDB_CORRUPT; KVDB_IOERR; KVDB_NOMEM.
 */
KVDB_API kvdb_status kvdb_decode_select(kvdb_decode *s, uint32_t ctx, uint32_t layer,
                                        const void *q, kvdb_dtype q_dtype, uint32_t n_q_heads,
                                        uint32_t k, uint32_t *positions, float *scores);

/**
 * @brief The full-precision K and V of positions[h * k + i] (i < k, every KV head h) of
 * context `ctx` at `layer` into `out`: token index i, head h (the layer coordinate is not used,
 * as in kvdb_get_tokens). Rows held in DRAM are copied; the others are read from the store, only
 * their page groups, verified, on the near-data device when the session's options say so.
 * Counts each position in the hit-rate table and keeps the rows read as promotion candidates;
 * the promotion and demotion (BKP) then run on a worker thread of the session, in the
 * background of the caller's next layers (the next select or fetch of this context and layer
 * waits for them, an append, flush, stat or close for all of it; a failure there is returned
 * by the call that waits).
 * @return KVDB_OK; KVDB_INVALID (NULL, ctx or layer out of range, k 0, a position past the
 *   context: names it, a bad view); KVDB_CORRUPT; KVDB_IOERR; KVDB_NOMEM.
 */
KVDB_API kvdb_status kvdb_decode_fetch(kvdb_decode *s, uint32_t ctx, uint32_t layer,
                                       const uint32_t *positions, uint32_t k,
                                       const kvdb_kv_view *out);

/** @brief The session's figures so far. @return KVDB_OK; KVDB_INVALID (NULL). */
KVDB_API kvdb_status kvdb_decode_stat(kvdb_decode *s, kvdb_decode_stats *out);

/** @brief End the session and free its DRAM. Unpublished tokens are NOT published (call
 * kvdb_decode_flush first): they are lost. NULL is a no-op. */
KVDB_API void kvdb_decode_close(kvdb_decode *s);

/**
 * @brief Append n tokens to a stored context and publish them at once, trailing partial block
 * included (kvdb_decode_open of that context with hot_tokens 0, append, flush, close).
 * new_context (optional) receives the grown context's key.
 * @return as kvdb_decode_open and kvdb_decode_append.
 */
KVDB_API kvdb_status kvdb_append(kvdb *db, const kvdb_model *m, const kvdb_key *context,
                                 const uint32_t *tokens, size_t n, const kvdb_kv_view *kv,
                                 kvdb_key *new_context);

#ifdef __cplusplus
}
#endif
#endif /* KVDB_H */
