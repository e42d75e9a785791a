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
 * so the only cross-process lock is LMDB's short catalog write lock.
 *
 * Errors. Every function that can fail returns a kvdb_status. After a failure,
 * kvdb_errmsg() returns a message for the calling thread that names what was wrong
 * (the argument, the file, the offset, the block). Values of kvdb_status are pinned.
 *
 * Memory. kvdb never keeps a pointer to caller memory after a call returns. Output buffers are
 * the caller's, described by a kvdb_kv_view.
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
 * created at version 1; it becomes version 2 with its first compressed block or quality
 * profile (so builds that know only version 1 refuse it then, with KVDB_VERSION).
 */
#define KVDB_FORMAT_VERSION 2

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
 * (all fields together); a call with a model whose `id` is stored with another shape fails
 * with KVDB_MISMATCH. Passed by pointer to each call; not retained.
 */
typedef struct kvdb_model {
  const char *id;        /**< model id, 1..63 bytes, e.g. "meta-llama/Meta-Llama-3-8B" */
  uint32_t n_layers;     /**< 1..1024 */
  uint32_t n_kv_heads;   /**< 1..1024 */
  uint32_t head_dim;     /**< 1..4096 */
  kvdb_dtype dtype;      /**< KVDB_F16, KVDB_BF16 or KVDB_F32 */
  uint32_t block_tokens; /**< tokens per block: a power of two from 16 to 4096; 0 = 256 */
} kvdb_model;

/** @brief Bytes of K and V of one token for all layers and heads. Cannot fail (0 if m is bad). */
KVDB_API size_t kvdb_model_token_bytes(const kvdb_model *m);

/** A 128-bit key: a block hash, a context key, or a caller's own block key. */
typedef struct kvdb_key {
  uint8_t b[16];
} kvdb_key;

/**
 * @brief Compute the chained block hashes of `tokens` (no I/O). `hashes` receives
 * ceil(n / block_tokens) keys (the last one covers a trailing partial block); the last one is
 * also the context key kvdb_put reports. @return KVDB_OK, KVDB_INVALID.
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
 * @return KVDB_OK, KVDB_INVALID (bad model or layout, NULL pointer).
 */
KVDB_API kvdb_status kvdb_kv_view_packed(kvdb_kv_view *view, void *base, const kvdb_model *m,
                                         size_t n_tokens, kvdb_layout layout);

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
 *   QUANT     KIVI (Liu et al. 2024): K quantized per channel   an approximation, elementwise
 *             over groups of tokens, V per token over groups    error at most half a step of
 *             of channels, min/max with f16 scale and zero      its group's scale
 *   DROP      the tokens a method keeps (per block and KV head: kvdb_get stops before such
 *             knorm, keydiff or snapkv), exact or quantized    a block; kvdb_get_context
 *                                                              returns the kept rows and positions
 * Names (kvdb_config_parse / kvdb_config_name): "raw", "lossless", "lossless:z9", "int8",
 * "int4", "int2", "int4:g64" (group), "int4:r128" (residual), "knorm50" (keep 0.50),
 * "knorm12.5" (keep 0.125), "keydiff30", "snapkv70", "snapkv50+int4".
 */

typedef enum kvdb_method {
  KVDB_METHOD_RAW = 0,      /**< page-grouped elements as given (the default) */
  KVDB_METHOD_LOSSLESS = 1, /**< byte planes + zstd: bit-exact */
  KVDB_METHOD_QUANT = 2,    /**< KIVI quantization to `bits` bits */
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

/** A storage config. Zero-initialized = raw. 12 bytes, stored in the catalog field by field. */
typedef struct kvdb_config {
  uint8_t method;         /**< kvdb_method */
  uint8_t bits;           /**< QUANT: 8, 4 or 2; DROP: 0 (kept rows exact) or 8, 4, 2 */
  uint8_t drop;           /**< DROP: kvdb_drop_method */
  int8_t zstd_level;      /**< LOSSLESS: -7..22 (not 0 once resolved); 0 = 3 */
  uint16_t keep_permille; /**< DROP: tokens kept per 1000, of each block and KV head, 1..999 */
  uint16_t group;         /**< QUANT, DROP with bits: tokens (K) or channels (V) per scale and
                               zero; 0 = 32; at most block_tokens */
  uint32_t residual;      /**< QUANT, DROP with bits: the context's last `residual` tokens are
                               kept in full precision (KIVI's residual); 0 = none */
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
/** @defgroup open Opening and closing */

typedef struct kvdb kvdb;

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
  KVDB_TIER_SMARTSSD = 2, /**< persistent + near-data scoring (later) */
  KVDB_TIER_COUNT = 3,
} kvdb_tier;

/** Log callback: level 0 error, 1 warning, 2 info. `msg` is valid during the call only. */
typedef void (*kvdb_log_fn)(void *ctx, int level, const char *msg);

/**
 * Options for kvdb_open(). Always call kvdb_options_init() first, then change fields.
 * Fields are only ever added at the end; `struct_size` lets an old caller use a newer library.
 */
typedef struct kvdb_options {
  uint32_t struct_size;      /**< set by kvdb_options_init() */
  uint32_t flags;            /**< KVDB_O_*; default KVDB_O_CREATE */
  uint64_t dram_bytes;       /**< DRAM tier capacity; default 256 MiB; 0 disables the tier */
  uint64_t ssd_bytes;        /**< SSD tier capacity (live bytes); default 0 = unlimited */
  kvdb_sync_mode sync_mode;  /**< default KVDB_SYNC_FULL */
  uint64_t segment_bytes;    /**< a segment file is sealed past this size; default 1 GiB */
  uint64_t catalog_map_bytes;/**< LMDB map size (virtual); default 64 GiB */
  int use_direct_io;         /**< 1 (default): O_DIRECT where the filesystem allows, logged fallback */
  int use_io_uring;          /**< 1 (default): io_uring where the kernel allows, logged fallback */
  kvdb_log_fn log_fn;        /**< default NULL: warnings and errors to stderr */
  void *log_ctx;
  int log_level;             /**< highest level passed to log_fn; default 1 (warnings) */
} kvdb_options;

/** @brief Fill *opt with defaults. Cannot fail. */
KVDB_API void kvdb_options_init(kvdb_options *opt);

/**
 * @brief Open (and with KVDB_O_CREATE create) the database in directory `path`.
 *
 * Opening reclaims what a crashed writer left: the unreferenced tail of each segment whose
 * writer is gone is truncated away. `path` and `opt` are copied; not retained.
 * @param[out] out the handle on KVDB_OK; NULL on any error.
 * @return KVDB_OK; KVDB_INVALID (bad option or path); KVDB_NOTFOUND (no database and no
 *   KVDB_O_CREATE); KVDB_VERSION (written by a newer format: refused, nothing written);
 *   KVDB_READONLY (directory not writable without KVDB_O_RDONLY); KVDB_CORRUPT; KVDB_IOERR;
 *   KVDB_NOMEM.
 */
KVDB_API kvdb_status kvdb_open(const char *path, const kvdb_options *opt, kvdb **out);

/** @brief Close the handle and free everything it holds. NULL is a no-op. Not concurrent
 * with other calls on the same handle. */
KVDB_API void kvdb_close(kvdb *db);

/* ------------------------------------------------------------------------------------------ */
/** @defgroup kv Put, lookup, get */

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
 * @return KVDB_OK; KVDB_INVALID (NULL/zero arguments, bad model); KVDB_MISMATCH (the id is
 *   stored with another shape); KVDB_READONLY; KVDB_FULL; KVDB_IOERR; KVDB_NOMEM.
 */
KVDB_API kvdb_status kvdb_put(kvdb *db, const kvdb_model *m, const uint32_t *tokens, size_t n,
                              const kvdb_kv_view *kv, kvdb_put_info *info);

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
   * snapkv ratios when queries are given. */
  const char *profile_space;
  uint32_t profile_heads;    /**< (layer, KV head) pairs the profile samples; 0 = 16 */
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
 * @brief How many leading tokens of `tokens[0..n)` are stored, verified token by token.
 * Finds full blocks by hash, then the longest stored block continuing the prefix (partial
 * blocks and prefixes of blocks count). No block data is read. A block whose stored tokens
 * differ from the query (a collision) ends the hit; so does a block stored with dropped
 * tokens (KVDB_METHOD_DROP), which kvdb_get cannot deliver in full (kvdb_get_context can).
 * @param[out] hit_tokens 0..n.
 * @return KVDB_OK (also for 0 hits); KVDB_INVALID; KVDB_IOERR.
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
 * are returned decoded: an approximation, as the put asked for.
 * @return KVDB_OK (also for 0 hits); KVDB_INVALID; KVDB_MISMATCH; KVDB_IOERR; KVDB_NOMEM.
 */
KVDB_API kvdb_status kvdb_get(kvdb *db, const kvdb_model *m, const uint32_t *tokens, size_t n,
                              const kvdb_kv_view *out, size_t *hit_tokens);

/**
 * @brief All of a stored context as stored, also when tokens were dropped: for every layer l
 * and KV head h, its kept rows in token order go to `out` at token index 0, 1, ... (room for
 * the context's n_tokens rows), their token positions to positions[(l * n_kv_heads + h) *
 * n_tokens + r] and their count to n_rows[l * n_kv_heads + h] (both optional, NULL). For a
 * context stored without dropping, row r is token r. Every byte read is verified.
 * @return KVDB_OK; KVDB_NOTFOUND; KVDB_MISMATCH; KVDB_INVALID; KVDB_CORRUPT; KVDB_IOERR.
 */
KVDB_API kvdb_status kvdb_get_context(kvdb *db, const kvdb_model *m, const kvdb_key *context,
                                      const kvdb_kv_view *out, uint32_t *positions,
                                      uint32_t *n_rows);

/**
 * @brief K and V of chosen positions of one layer of a stored context, all KV heads.
 *
 * Reads only the 4 KiB page groups that hold the positions (dual-step loading, InstInfer
 * §IV-C: pages first, then tokens in memory), each verified by its checksum.
 * out's token i receives position positions[i]; positions may be in any order and repeat.
 * On a compressed context the groups holding the positions are read and decoded (see
 * "Compression configs"); a position some KV head dropped is KVDB_NOTFOUND, naming it.
 * @return KVDB_OK; KVDB_NOTFOUND (no such context, or a dropped position); KVDB_INVALID (layer
 *   or a position out of range, NULL arguments); KVDB_CORRUPT (names segment, offset, block);
 *   KVDB_IOERR.
 */
KVDB_API kvdb_status kvdb_get_tokens(kvdb *db, const kvdb_model *m, const kvdb_key *context,
                                     uint32_t layer, const uint32_t *positions, size_t n_pos,
                                     const kvdb_kv_view *out);

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
 * @return KVDB_OK; KVDB_NOTFOUND; KVDB_INVALID; KVDB_CORRUPT; KVDB_IOERR.
 */
KVDB_API kvdb_status kvdb_get_block(kvdb *db, const kvdb_model *m, const kvdb_key *key,
                                    const uint32_t *expect_tokens, size_t n_tokens,
                                    const kvdb_kv_view *out, size_t *out_tokens);

/**
 * @brief Remove a context (or an explicit-key block). Blocks no other context uses become
 * free space, reclaimed by kvdb_compact. @return KVDB_OK; KVDB_NOTFOUND; KVDB_READONLY; KVDB_IOERR.
 */
KVDB_API kvdb_status kvdb_delete(kvdb *db, const kvdb_key *context);

/** The key of an explicit-key block as stored (model namespace applied), for kvdb_delete. */
KVDB_API kvdb_status kvdb_block_context(const kvdb_model *m, const kvdb_key *key, kvdb_key *context);

/* ------------------------------------------------------------------------------------------ */
/** @defgroup inspect Contexts, statistics, verification, compaction */

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
  uint32_t tier;                /**< kvdb_tier of its persistent copy */
  kvdb_config config;           /**< how its put (or last re-encoding) stored it */
  uint32_t has_profile;         /**< 1 when a quality profile is recorded */
} kvdb_context_info;

/** @brief Information about one context. @return KVDB_OK; KVDB_NOTFOUND; KVDB_INVALID. */
KVDB_API kvdb_status kvdb_context_stat(kvdb *db, const kvdb_key *context, kvdb_context_info *out);

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

/** @brief Fill *out. @return KVDB_OK; KVDB_INVALID; KVDB_IOERR. */
KVDB_API kvdb_status kvdb_stat(kvdb *db, kvdb_stats *out);

/** One problem found by kvdb_verify. */
typedef struct kvdb_problem {
  kvdb_status status; /**< KVDB_CORRUPT or KVDB_IOERR */
  const char *message;/**< names the segment, offset, block; valid during the callback */
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
 * @brief Read every block and check every checksum, and the catalog against the segments
 * (refcounts, every context's blocks present, segment live bytes, no block past a file's end).
 * Problems go to `on_problem` (optional). @return KVDB_OK when no problem was found,
 * KVDB_CORRUPT when one was, or an error that stopped the check.
 */
KVDB_API kvdb_status kvdb_verify(kvdb *db, kvdb_problem_fn on_problem, kvdb_progress_fn progress,
                                 void *ctx, kvdb_verify_report *report);

typedef struct kvdb_compact_report {
  uint64_t segments_rewritten;
  uint64_t blocks_moved;
  uint64_t bytes_moved;
  uint64_t bytes_reclaimed;
} kvdb_compact_report;

/**
 * @brief Rewrite the live blocks of segments whose live fraction is below `threshold`
 * (0..1; 0 = the default 0.5) into new segments, then delete the old files. Online: readers
 * and writers in any process keep working. Each move commits in a catalog transaction.
 * @return KVDB_OK; KVDB_READONLY; KVDB_FULL; KVDB_IOERR; KVDB_INVALID.
 */
KVDB_API kvdb_status kvdb_compact(kvdb *db, double threshold, kvdb_progress_fn progress, void *ctx,
                                  kvdb_compact_report *report);

/* ------------------------------------------------------------------------------------------ */
/**
 * @defgroup profile Quality profiles and re-encoding (what the placement policy decides from)
 *
 * A context's profile lists, for each config of a configured space, the context's stored size
 * in that config and its quality: the attention-output fidelity of the decoded KV against the
 * original — for probe queries q (the caller's queries, else derived from the context's keys:
 * its last 8 keys and 8 evenly spaced ones, scaled to the norm of a unit-variance query),
 * softmax(q.K^T / sqrt(head_dim)).V per sampled (layer, KV head), compared by cosine (mean)
 * and relative L2 error. Sizes are extrapolated from the sampled heads, except for the config
 * the context is stored in (exact). A quality the caller measured itself (kvdb_report_quality,
 * e.g. task accuracy) wins over the proxy.
 */

enum {
  KVDB_PROFILE_STORED = 1u << 0, /**< the config the context is stored in */
  KVDB_PROFILE_EXACT = 1u << 1,  /**< `bytes` is measured, not extrapolated */
};

typedef struct kvdb_profile_entry {
  kvdb_config config;
  uint32_t flags;            /**< KVDB_PROFILE_* */
  uint64_t bytes;            /**< the context's stored bytes in this config */
  double quality;            /**< mean cosine of attention outputs (1 = exact); NaN if unmeasured */
  double rel_l2;             /**< relative L2 error of the attention outputs */
  double reported_quality;   /**< the caller's measure, NaN if none; it wins over `quality` */
  uint32_t n_reports;        /**< reports averaged into reported_quality */
  uint32_t n_probes;         /**< probe queries per sampled head */
} kvdb_profile_entry;

/**
 * @brief Measure a stored context's profile now (the space and probes of `opts`, or the
 * defaults) and record it, replacing an earlier one (caller reports are kept). The reference
 * is the context as stored: exact for RAW and LOSSLESS contexts; for lossy ones the figures
 * are relative to the stored approximation (and a config cannot be measured below what is
 * stored: dropped tokens cannot come back), which the entries say by quality NaN.
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
 * @return KVDB_OK; KVDB_NOTFOUND; KVDB_MISMATCH; KVDB_INVALID; KVDB_READONLY; KVDB_FULL;
 *   KVDB_CORRUPT; KVDB_IOERR.
 */
KVDB_API kvdb_status kvdb_recompress(kvdb *db, const kvdb_model *m, const kvdb_key *context,
                                     const kvdb_config *to, const kvdb_put_opts *opts);

/** @brief Hex of a key (32 chars + NUL) into buf (>= 33 bytes). Returns buf. Cannot fail. */
KVDB_API char *kvdb_key_hex(const kvdb_key *key, char *buf);
/** @brief Parse 32 hex chars. @return KVDB_OK; KVDB_INVALID. */
KVDB_API kvdb_status kvdb_key_parse(const char *hex, kvdb_key *out);

#ifdef __cplusplus
}
#endif
#endif /* KVDB_H */
