/* SPDX-License-Identifier: MIT */
/*
 * bench/bench_store.c — `kvdb-bench store`: kvdb's put, cold get, DRAM get, lookup and
 * token-subset get, each against the baseline that bounds it, and two stores a user would pick
 * instead, all on the same data in the same run.
 *
 * Data: Llama-3-8B-shaped KV (32 layers, 8 KV heads, head_dim 128, fp16; 128 KiB per token),
 * 256-token blocks (32 MiB), N contexts of 1024 tokens (4 blocks, 128 MiB) with no shared
 * prefix, so every store writes every byte. The caller's buffer is [layer][K,V][token][head][dim]
 * (KVDB_LAYOUT_LKTHD); a block's bytes in it are n_layers * 2 runs of 512 KiB.
 *
 * Four stores, measured context by context in an interleaved order (ORDER: kvdb next to raw,
 * files next to lmdb, who goes first alternating, every store in every position once per four
 * contexts), so drift in the disk's speed (a shared virtual disk varies by 2x from one second
 * to the next) falls on a store and its baseline alike:
 *   kvdb   kvdb_put with default options (KVDB_SYNC_FULL); kvdb_get into the caller's buffer
 *   raw    the context's bytes appended to one file: the space reserved with fallocate, then
 *          O_DIRECT pwrite in 32 MiB requests and fdatasync; O_DIRECT pread of the same bytes
 *          back in 32 MiB requests (the disk's own speed). Buffers of every store are
 *          huge-page backed (bench_alloc), as kvdb's own I/O buffers are.
 *   files  one file per block (LMCache local disk, SGLang HiCacheFile): pwritev from the
 *          caller's buffer + fsync per file, fsync of the directory per context; preadv back
 *   lmdb   LMDB, each block one value (key = kvdb's block hash): MDB_RESERVE then a copy in,
 *          one write transaction per context with LMDB's default durability; mdb_get + memcpy
 *          out
 * Set-up is never timed: files and environments are opened first, and kvdb, which sets up its
 * segment and staging buffers inside its first put, gets one untimed 2-block put first; each
 * fresh handle of the cold-read passes first gets that 2-block context, untimed (read buffers).
 * Reads are cold: before each read pass every handle is closed, every file under the data
 * directory gets POSIX_FADV_DONTNEED and, as root, `echo 1 > /proc/sys/vm/drop_caches`; kvdb
 * is reopened with dram_bytes = 0. Every read is checked byte for byte (untimed) against the
 * source after the caller's buffer was poisoned.
 *
 * DRAM tier: a handle with a 2 GiB DRAM tier gets each context once (warm), then R rounds of
 * kvdb_get of all contexts alternate with R rounds of memcpy of the same bytes from the source
 * buffers into the same caller buffer.
 *
 * Lookup: a second database with a tiny model shape (1 layer, 1 KV head, head_dim 16, fp16,
 * 16-token blocks: 8 KiB block objects), filled with KVDB_SYNC_NONE and buffered I/O (the
 * lookup reads no block data; buffered I/O keeps ~800 MiB of block objects off the disk, the
 * directory being deleted soon after): 4096 families of 8 prompts of 64 tokens sharing their
 * first block = 102,400 blocks. A fresh handle then times kvdb_lookup of stored prompts (hits),
 * of stored prompts with a new last 24 tokens (partial hits through the children scan) and
 * of unseen prompts (misses), in random order, each call timed alone.
 *
 * Lookup under high fan-out: a third database (same tiny shape) holds one 16-token block and
 * ST_FANOUT_CONT continuations of it (one block's 10,000 children: a shared 5-token turn header,
 * then 3..40 random tokens each). Timed: kvdb_lookup of a continuation cut after a random point
 * past the header and followed by new tokens (hit: the block plus the kept tokens, found in the
 * catalog's trie of blocks), each call timed alone: lookup_fanout_p99_us.
 *
 * Token subsets: a fresh handle (dram_bytes = 0, cold) runs kvdb_get_tokens for 10% of a
 * layer's positions of a stored context: "clustered" = random 16-aligned runs of 16 tokens,
 * "uniform" = uniformly random positions. Amplification = kvdb_stats.bytes_read delta / bytes
 * needed, bytes needed = n_positions * n_kv_heads * 2 * head_dim * 2.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <lmdb.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include "bench.h"
#include "datagen.h"
#include "kvdb.h"

/*
 * ST_CTX_TOKENS      : tokens per context (4 blocks of 256).
 * ST_*_CTX           : contexts per store; each store writes ST_*_CTX * 128 MiB.
 * ST_*_READ_PASSES   : cold read passes (reads cost no disk wear, so the full run repeats them).
 * ST_*_DRAM_ROUNDS   : timed rounds of DRAM-tier gets (and of memcpy).
 * ST_RAW_CHUNK       : request size of the raw baselines (one block object's size).
 * ST_*_LOOKUPS       : timed lookups per kind (hit, partial, miss).
 */
#define ST_CTX_TOKENS 1024u
#define ST_FULL_CTX 8u
#define ST_QUICK_CTX 2u
#define ST_FULL_READ_PASSES 3u
#define ST_QUICK_READ_PASSES 1u
#define ST_FULL_DRAM_ROUNDS 8u
#define ST_QUICK_DRAM_ROUNDS 3u
#define ST_RAW_CHUNK (32u << 20)
#define ST_DRAM_TIER_BYTES (2ull << 30)
#define ST_VOCAB 128256u
#define ST_LOOKUP_FAMILIES 4096u
#define ST_LOOKUP_PER_FAMILY 8u
#define ST_LOOKUP_TOKENS 64u
#define ST_LOOKUP_SHARED 16u
#define ST_LOOKUP_PARTIAL_KEEP 40u
#define ST_FULL_LOOKUPS 50000u
#define ST_QUICK_LOOKUPS 20000u
#define ST_LOOKUP_WARMUP 2000u
#define ST_FANOUT_CONT 10000u  /* continuations of one block (lookup under high fan-out) */
#define ST_FANOUT_HEADER 5u    /* tokens all of them share after the block */
#define ST_FANOUT_MAX_EXTRA 40u
#define ST_SUBSET_FRACTION 0.10
#define ST_SUBSET_RUN 16u
#define ST_FULL_SUBSET_LAYERS 8u
#define ST_QUICK_SUBSET_LAYERS 4u

/* Targets of issue 2 on this kind of machine. */
#define T_GET_VS_RAW 0.90
#define T_PUT_VS_RAW 0.75
#define T_DRAM_VS_MEMCPY 0.70
#define T_LOOKUP_P99_US 50.0
#define T_SUBSET_AMP 1.5

enum { S_KVDB, S_RAW, S_FILES, S_LMDB, N_STORES };
static const char *const STORE_NAME[N_STORES] = {"kvdb", "raw", "files", "lmdb"};

static const kvdb_model LLAMA3 = {"meta-llama/Meta-Llama-3-8B", 32, 8, 128, KVDB_F16, 256};
static const kvdb_model TINY = {"kvdb-bench/tiny-1L-1H-16D", 1, 1, 16, KVDB_F16, 16};

/* memcpy through a volatile pointer: the baseline's copies cannot be merged or dropped. */
static void *(*volatile memcpy_fn)(void *, const void *, size_t) = memcpy;

typedef struct store_bench {
  const bench_env *env;
  kvdb_model m;
  size_t n_ctx, ctx_tokens, ctx_bytes, tok_row, blk_tokens, n_blk, n_pieces;
  uint32_t **tok;   /* [n_ctx][ctx_tokens] */
  uint8_t **kv;     /* [n_ctx] source KV, ctx_bytes each */
  kvdb_key **keys;  /* [n_ctx][n_blk] chain hashes (the peers' keys) */
  uint8_t *out;     /* the caller's buffer */
  struct iovec *iov;
  char db_dir[4200], raw_path[4200], files_dir[4200], lmdb_path[4200];
  /* open during a phase */
  kvdb *db;
  int raw_fd;
  int raw_direct;
  MDB_env *lenv;
  MDB_dbi ldbi;
  int files_dirfd;
  /* results */
  uint64_t put_ns[N_STORES], get_ns[N_STORES];
  bench_samples put_op[N_STORES], get_op[N_STORES];
  uint64_t get_bytes; /* per store, over all passes */
  unsigned read_passes;
  const char *drop_method;
  kvdb_stats put_stats;
  uint64_t first_put_ns; /* kvdb's untimed warm-up put (2 blocks) */
  uint64_t warm_written; /* bytes it wrote */
  uint64_t first_get_ns; /* the slowest untimed first get of a fresh handle (the warm-up context) */
} store_bench;

/* ---- helpers ------------------------------------------------------------------------------ */

static int kfail(const char *what, kvdb_status rc)
{
  bench_log("%s: %s: %s", what, kvdb_status_name(rc), kvdb_errmsg());
  return -1;
}

static int efail(const char *what, const char *path, int err)
{
  bench_log("%s '%s': %s", what, path, strerror(err));
  return -1;
}

static int mfail(const char *what, int mrc)
{
  bench_log("LMDB %s: %s", what, mdb_strerror(mrc));
  return -1;
}

static double mib(uint64_t b)
{
  return (double)b / (1024.0 * 1024.0);
}

/* The caller's bytes of block b of a context as n_layers * 2 runs (iovecs into `base`). */
static size_t block_iov(const store_bench *sb, uint8_t *base, size_t b, struct iovec *iov)
{
  size_t t0 = b * sb->blk_tokens;
  size_t nt = sb->ctx_tokens - t0 < sb->blk_tokens ? sb->ctx_tokens - t0 : sb->blk_tokens;
  for (size_t s = 0; s < sb->n_pieces; s++) {
    iov[s].iov_base = base + (s * sb->ctx_tokens + t0) * sb->tok_row;
    iov[s].iov_len = nt * sb->tok_row;
  }
  return sb->n_pieces;
}

static size_t iov_bytes(const struct iovec *iov, size_t n)
{
  size_t t = 0;
  for (size_t i = 0; i < n; i++)
    t += iov[i].iov_len;
  return t;
}

/* pwritev/preadv of everything (the iovecs are consumed). Returns 0 or -errno. */
static int rw_iov(int fd, struct iovec *iov, size_t n, int write)
{
  off_t off = 0;
  size_t i = 0;
  while (i < n) {
    int cnt = (int)(n - i > 1024 ? 1024 : n - i);
    ssize_t r = write ? pwritev(fd, iov + i, cnt, off) : preadv(fd, iov + i, cnt, off);
    if (r < 0) {
      if (errno == EINTR)
        continue;
      return -errno;
    }
    if (r == 0)
      return -EIO;
    off += r;
    size_t left = (size_t)r;
    while (i < n && left >= iov[i].iov_len) {
      left -= iov[i].iov_len;
      i++;
    }
    if (i < n) {
      iov[i].iov_base = (uint8_t *)iov[i].iov_base + left;
      iov[i].iov_len -= left;
    }
  }
  return 0;
}

static void view_of(const store_bench *sb, uint8_t *base, size_t n_tokens, kvdb_kv_view *v)
{
  kvdb_kv_view_packed(v, base, &sb->m, n_tokens, KVDB_LAYOUT_LKTHD);
}

/* ---- data ----------------------------------------------------------------------------- */

static int make_data(store_bench *sb)
{
  const bench_env *env = sb->env;
  dg_kv_model dm;
  if (dg_kv_model_init(&dm, sb->m.n_layers, sb->m.n_kv_heads, sb->m.head_dim, env->seed) != 0)
    return efail("cannot allocate", "channel statistics", ENOMEM);
  sb->tok = calloc(sb->n_ctx, sizeof *sb->tok);
  sb->kv = calloc(sb->n_ctx, sizeof *sb->kv);
  sb->keys = calloc(sb->n_ctx, sizeof *sb->keys);
  sb->out = bench_alloc(sb->ctx_bytes);
  sb->iov = calloc(sb->n_pieces, sizeof *sb->iov);
  int rc = 0;
  if (!sb->tok || !sb->kv || !sb->keys || !sb->out || !sb->iov)
    rc = efail("cannot allocate", "buffers", ENOMEM);
  uint64_t t0 = bench_now_ns();
  for (size_t c = 0; rc == 0 && c < sb->n_ctx; c++) {
    sb->tok[c] = malloc(sb->ctx_tokens * sizeof **sb->tok);
    sb->kv[c] = bench_alloc(sb->ctx_bytes);
    sb->keys[c] = malloc(sb->n_blk * sizeof **sb->keys);
    if (!sb->tok[c] || !sb->kv[c] || !sb->keys[c]) {
      rc = efail("cannot allocate", "context buffers", ENOMEM);
      break;
    }
    /* distinct contexts (no shared prefix): every store writes every block */
    dg_tokens(sb->tok[c], sb->ctx_tokens, env->seed * 1000003u + c, ST_VOCAB);
    if (dg_kv_fill_f16(&dm, sb->tok[c], sb->ctx_tokens, (uint16_t *)sb->kv[c]) != 0) {
      rc = efail("cannot allocate", "prefix hashes", ENOMEM);
      break;
    }
    kvdb_status ks = kvdb_chain_hashes(&sb->m, sb->tok[c], sb->ctx_tokens, sb->keys[c], sb->n_blk);
    if (ks != KVDB_OK)
      rc = kfail("kvdb_chain_hashes", ks);
  }
  dg_kv_model_free(&dm);
  if (rc == 0)
    bench_log("generated %zu contexts (%.0f MiB) in %.1f s", sb->n_ctx,
              mib((uint64_t)sb->n_ctx * sb->ctx_bytes), (double)(bench_now_ns() - t0) * 1e-9);
  return rc;
}

static void free_data(store_bench *sb)
{
  for (size_t c = 0; c < sb->n_ctx; c++) {
    if (sb->tok)
      free(sb->tok[c]);
    if (sb->kv)
      bench_free(sb->kv[c]);
    if (sb->keys)
      free(sb->keys[c]);
  }
  free(sb->tok);
  free(sb->kv);
  free(sb->keys);
  bench_free(sb->out);
  free(sb->iov);
  for (int s = 0; s < N_STORES; s++) {
    bench_samples_free(&sb->put_op[s]);
    bench_samples_free(&sb->get_op[s]);
  }
}

/* ---- the stores: open / close ----------------------------------------------------------- */

static int lmdb_open(store_bench *sb)
{
  /* map: the data plus room for LMDB's own pages; 32 MiB values are overflow runs of 8193
   * pages, so the map must hold them contiguously */
  size_t map = (size_t)((double)sb->n_ctx * (double)sb->ctx_bytes * 1.25) + (256u << 20);
  int mrc = mdb_env_create(&sb->lenv);
  if (mrc != 0)
    return mfail("mdb_env_create", mrc);
  mrc = mdb_env_set_mapsize(sb->lenv, map);
  if (mrc == 0)
    mrc = mdb_env_open(sb->lenv, sb->lmdb_path, MDB_NOSUBDIR, 0644);
  if (mrc != 0) {
    mdb_env_close(sb->lenv);
    sb->lenv = NULL;
    return mfail("mdb_env_open", mrc);
  }
  MDB_txn *txn;
  mrc = mdb_txn_begin(sb->lenv, NULL, 0, &txn);
  if (mrc == 0)
    mrc = mdb_dbi_open(txn, NULL, 0, &sb->ldbi);
  if (mrc == 0)
    mrc = mdb_txn_commit(txn);
  if (mrc != 0) {
    mdb_env_close(sb->lenv);
    sb->lenv = NULL;
    return mfail("open the main database", mrc);
  }
  return 0;
}

static int raw_open(store_bench *sb, int write)
{
  int fl = (write ? O_WRONLY | O_CREAT : O_RDONLY) | O_CLOEXEC;
  sb->raw_fd = open(sb->raw_path, fl | O_DIRECT, 0644);
  sb->raw_direct = sb->raw_fd >= 0;
  if (sb->raw_fd < 0 && errno == EINVAL) {
    bench_log("WARNING: O_DIRECT is refused on %s: the raw baseline uses buffered I/O",
              sb->env->fs_type);
    sb->raw_fd = open(sb->raw_path, fl, 0644);
  }
  return sb->raw_fd >= 0 ? 0 : efail("cannot open", sb->raw_path, errno);
}

/* ST_DRAM_DEFAULT: keep kvdb's default DRAM tier (the put handle: all options default). */
#define ST_DRAM_DEFAULT UINT64_MAX

static int open_kvdb(const char *dir, uint64_t dram_bytes, kvdb **out)
{
  kvdb_options o;
  kvdb_options_init(&o); /* durable (KVDB_SYNC_FULL), O_DIRECT and io_uring where allowed */
  if (dram_bytes != ST_DRAM_DEFAULT)
    o.dram_bytes = dram_bytes;
  kvdb_status rc = kvdb_open(dir, &o, out);
  return rc == KVDB_OK ? 0 : kfail("kvdb_open", rc);
}

static void close_all(store_bench *sb)
{
  kvdb_close(sb->db);
  sb->db = NULL;
  if (sb->raw_fd >= 0)
    close(sb->raw_fd);
  sb->raw_fd = -1;
  if (sb->lenv != NULL)
    mdb_env_close(sb->lenv);
  sb->lenv = NULL;
  if (sb->files_dirfd >= 0)
    close(sb->files_dirfd);
  sb->files_dirfd = -1;
}

/* ---- the stores: put one context -------------------------------------------------------- */

static int put_kvdb(store_bench *sb, size_t c)
{
  kvdb_kv_view v;
  view_of(sb, sb->kv[c], sb->ctx_tokens, &v);
  kvdb_put_info info;
  kvdb_status rc = kvdb_put(sb->db, &sb->m, sb->tok[c], sb->ctx_tokens, &v, &info);
  if (rc != KVDB_OK)
    return kfail("kvdb_put", rc);
  if (info.blocks_written != sb->n_blk) {
    bench_log("kvdb_put wrote %u of %zu blocks (data must not be shared)", info.blocks_written,
              sb->n_blk);
    return -1;
  }
  return 0;
}

/* The disk's best case for a durable write of these bytes: the space reserved first
 * (fallocate, as kvdb does; without it ext4 serialises extending O_DIRECT writes and the
 * baseline was 10-15% slower than kvdb), then O_DIRECT writes of ST_RAW_CHUNK, fdatasync. */
static int put_raw(store_bench *sb, size_t c)
{
  uint64_t off = (uint64_t)c * sb->ctx_bytes;
  if (fallocate(sb->raw_fd, 0, (off_t)off, (off_t)sb->ctx_bytes) != 0 && errno != EOPNOTSUPP)
    return efail("cannot fallocate", sb->raw_path, errno);
  for (size_t done = 0; done < sb->ctx_bytes; done += ST_RAW_CHUNK) {
    size_t n = sb->ctx_bytes - done < ST_RAW_CHUNK ? sb->ctx_bytes - done : ST_RAW_CHUNK;
    int e = bench_pwrite_all(sb->raw_fd, sb->kv[c] + done, n, off + done);
    if (e != 0)
      return efail("cannot write", sb->raw_path, -e);
  }
  if (fdatasync(sb->raw_fd) != 0)
    return efail("cannot fdatasync", sb->raw_path, errno);
  return 0;
}

static void block_file(const store_bench *sb, size_t c, size_t b, char *path, size_t cap)
{
  char hex[33];
  kvdb_key_hex(&sb->keys[c][b], hex);
  snprintf(path, cap, "%s/%s.bin", sb->files_dir, hex);
}

static int put_files(store_bench *sb, size_t c)
{
  char path[4300];
  for (size_t b = 0; b < sb->n_blk; b++) {
    block_file(sb, c, b, path, sizeof path);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0)
      return efail("cannot create", path, errno);
    size_t n = block_iov(sb, sb->kv[c], b, sb->iov);
    int e = rw_iov(fd, sb->iov, n, 1);
    if (e == 0 && fsync(fd) != 0)
      e = -errno;
    close(fd);
    if (e != 0)
      return efail("cannot write", path, -e);
  }
  /* the new names are durable only once the directory is */
  if (fsync(sb->files_dirfd) != 0)
    return efail("cannot fsync", sb->files_dir, errno);
  return 0;
}

static int put_lmdb(store_bench *sb, size_t c)
{
  MDB_txn *txn;
  int mrc = mdb_txn_begin(sb->lenv, NULL, 0, &txn);
  if (mrc != 0)
    return mfail("mdb_txn_begin", mrc);
  for (size_t b = 0; b < sb->n_blk; b++) {
    size_t n = block_iov(sb, sb->kv[c], b, sb->iov);
    MDB_val k = {16, sb->keys[c][b].b}, v = {iov_bytes(sb->iov, n), NULL};
    mrc = mdb_put(txn, sb->ldbi, &k, &v, MDB_RESERVE);
    if (mrc != 0) {
      mdb_txn_abort(txn);
      return mfail("mdb_put", mrc);
    }
    uint8_t *p = v.mv_data;
    for (size_t i = 0; i < n; i++) {
      memcpy(p, sb->iov[i].iov_base, sb->iov[i].iov_len);
      p += sb->iov[i].iov_len;
    }
  }
  mrc = mdb_txn_commit(txn);
  return mrc == 0 ? 0 : mfail("mdb_txn_commit", mrc);
}

/* ---- the stores: get one context into sb->out ------------------------------------------- */

static int get_kvdb(store_bench *sb, size_t c)
{
  kvdb_kv_view v;
  view_of(sb, sb->out, sb->ctx_tokens, &v);
  size_t hit;
  kvdb_status rc = kvdb_get(sb->db, &sb->m, sb->tok[c], sb->ctx_tokens, &v, &hit);
  if (rc != KVDB_OK)
    return kfail("kvdb_get", rc);
  if (hit != sb->ctx_tokens) {
    bench_log("kvdb_get of context %zu hit %zu of %zu tokens", c, hit, sb->ctx_tokens);
    return -1;
  }
  return 0;
}

static int get_raw(store_bench *sb, size_t c)
{
  uint64_t off = (uint64_t)c * sb->ctx_bytes;
  for (size_t done = 0; done < sb->ctx_bytes; done += ST_RAW_CHUNK) {
    size_t n = sb->ctx_bytes - done < ST_RAW_CHUNK ? sb->ctx_bytes - done : ST_RAW_CHUNK;
    int e = bench_pread_all(sb->raw_fd, sb->out + done, n, off + done);
    if (e != 0)
      return efail("cannot read", sb->raw_path, -e);
  }
  return 0;
}

static int get_files(store_bench *sb, size_t c)
{
  char path[4300];
  for (size_t b = 0; b < sb->n_blk; b++) {
    block_file(sb, c, b, path, sizeof path);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
      return efail("cannot open", path, errno);
    size_t n = block_iov(sb, sb->out, b, sb->iov);
    int e = rw_iov(fd, sb->iov, n, 0);
    close(fd);
    if (e != 0)
      return efail("cannot read", path, -e);
  }
  return 0;
}

static int get_lmdb(store_bench *sb, size_t c)
{
  MDB_txn *txn;
  int mrc = mdb_txn_begin(sb->lenv, NULL, MDB_RDONLY, &txn);
  if (mrc != 0)
    return mfail("mdb_txn_begin", mrc);
  for (size_t b = 0; b < sb->n_blk; b++) {
    size_t n = block_iov(sb, sb->out, b, sb->iov);
    MDB_val k = {16, sb->keys[c][b].b}, v;
    mrc = mdb_get(txn, sb->ldbi, &k, &v);
    if (mrc != 0 || v.mv_size != iov_bytes(sb->iov, n)) {
      mdb_txn_abort(txn);
      return mrc != 0 ? mfail("mdb_get", mrc) : mfail("mdb_get (value size)", MDB_CORRUPTED);
    }
    const uint8_t *p = v.mv_data;
    for (size_t i = 0; i < n; i++) {
      memcpy(sb->iov[i].iov_base, p, sb->iov[i].iov_len);
      p += sb->iov[i].iov_len;
    }
  }
  mdb_txn_abort(txn);
  return 0;
}

typedef int (*store_op)(store_bench *sb, size_t c);
static const store_op PUT[N_STORES] = {put_kvdb, put_raw, put_files, put_lmdb};
static const store_op GET[N_STORES] = {get_kvdb, get_raw, get_files, get_lmdb};

/* The order of the stores for the i-th context: kvdb always next to its baseline (raw), files
 * next to lmdb, the first of each pair alternating; over four contexts every store takes
 * every position once. */
static const int ORDER[4][N_STORES] = {
  {S_KVDB, S_RAW, S_FILES, S_LMDB},
  {S_RAW, S_KVDB, S_LMDB, S_FILES},
  {S_FILES, S_LMDB, S_KVDB, S_RAW},
  {S_LMDB, S_FILES, S_RAW, S_KVDB},
};

/* ---- phase 1: put --------------------------------------------------------------------- */

static int phase_put(store_bench *sb)
{
  if (open_kvdb(sb->db_dir, ST_DRAM_DEFAULT, &sb->db) != 0 || raw_open(sb, 1) != 0 ||
      lmdb_open(sb) != 0)
    return -1;
  if (mkdir(sb->files_dir, 0755) != 0 && errno != EEXIST)
    return efail("cannot create", sb->files_dir, errno);
  sb->files_dirfd = open(sb->files_dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (sb->files_dirfd < 0)
    return efail("cannot open", sb->files_dir, errno);
  /* the empty files and the LMDB environment exist before anything is timed */
  if (fsync(sb->files_dirfd) != 0)
    return efail("cannot fsync", sb->files_dir, errno);
  /* Only kvdb sets itself up inside its first put (a segment is created, the staging buffers
   * are allocated and first touched); the other stores' set-up (open, mkdir, mdb_env_open)
   * is outside the timed region. So kvdb gets one untimed put of a 2-block context first (it
   * touches both staging buffers); its time is reported as kvdb_first_put_ms. */
  uint32_t *wt = malloc(2 * sb->blk_tokens * sizeof *wt);
  if (wt == NULL)
    return efail("cannot allocate", "warm-up tokens", ENOMEM);
  dg_tokens(wt, 2 * sb->blk_tokens, sb->env->seed ^ 0x7761726d7570ull, ST_VOCAB);
  kvdb_kv_view wv;
  view_of(sb, sb->kv[0], sb->ctx_tokens, &wv); /* the first 2 blocks' tokens of context 0's buffer */
  uint64_t w0 = bench_now_ns();
  kvdb_status ks = kvdb_put(sb->db, &sb->m, wt, 2 * sb->blk_tokens, &wv, NULL);
  sb->first_put_ns = bench_now_ns() - w0;
  free(wt);
  kvdb_stats ws;
  if (ks == KVDB_OK)
    ks = kvdb_stat(sb->db, &ws);
  if (ks != KVDB_OK)
    return kfail("kvdb_put (warm-up)", ks);
  sb->warm_written = ws.bytes_written;
  sync();
  bench_log("put: %zu contexts x %.0f MiB into each of kvdb, raw, files, lmdb", sb->n_ctx,
            mib(sb->ctx_bytes));
  for (size_t c = 0; c < sb->n_ctx; c++)
    for (int k = 0; k < N_STORES; k++) {
      int s = ORDER[c % 4][k];
      uint64_t t0 = bench_now_ns();
      if (PUT[s](sb, c) != 0) {
        bench_log("put of context %zu into %s failed", c, STORE_NAME[s]);
        return -1;
      }
      uint64_t dt = bench_now_ns() - t0;
      sb->put_ns[s] += dt;
      bench_samples_push(&sb->put_op[s], dt);
    }
  kvdb_status rc = kvdb_stat(sb->db, &sb->put_stats);
  if (rc != KVDB_OK)
    return kfail("kvdb_stat", rc);
  close_all(sb);
  return 0;
}

/* ---- phase 2: cold get ---------------------------------------------------------------- */

static int check_out(const store_bench *sb, size_t c, const char *who)
{
  if (memcmp(sb->out, sb->kv[c], sb->ctx_bytes) == 0)
    return 0;
  size_t i = 0;
  while (sb->out[i] == sb->kv[c][i])
    i++;
  bench_log("%s returned wrong bytes for context %zu (first difference at byte %zu)", who, c, i);
  return -1;
}

/* kvdb allocates its read buffers inside the first get of a handle (2 x 34 MiB of huge pages
 * for this shape; a fresh huge page can wait for the kernel to compact memory: 20-250 ms seen).
 * Like its first put, that set-up is not timed: each fresh handle first gets the 2-block
 * warm-up context (also cold; not one of the measured contexts), and the slowest such get is
 * reported as kvdb_first_get_ms. */
static int kvdb_first_get(store_bench *sb)
{
  uint32_t *wt = malloc(2 * sb->blk_tokens * sizeof *wt);
  if (wt == NULL)
    return efail("cannot allocate", "warm-up tokens", ENOMEM);
  dg_tokens(wt, 2 * sb->blk_tokens, sb->env->seed ^ 0x7761726d7570ull, ST_VOCAB);
  kvdb_kv_view v;
  view_of(sb, sb->out, sb->ctx_tokens, &v);
  size_t hit = 0;
  uint64_t t0 = bench_now_ns();
  kvdb_status rc = kvdb_get(sb->db, &sb->m, wt, 2 * sb->blk_tokens, &v, &hit);
  uint64_t dt = bench_now_ns() - t0;
  free(wt);
  if (rc != KVDB_OK)
    return kfail("kvdb_get (first get of a handle)", rc);
  if (hit != 2 * sb->blk_tokens) {
    bench_log("the warm-up context is not stored whole (%zu tokens hit)", hit);
    return -1;
  }
  if (dt > sb->first_get_ns)
    sb->first_get_ns = dt;
  return 0;
}

static int phase_cold_get(store_bench *sb, unsigned pass)
{
  sb->drop_method = bench_drop_cache(sb->env->dir);
  if (open_kvdb(sb->db_dir, 0, &sb->db) != 0 || raw_open(sb, 0) != 0 || lmdb_open(sb) != 0 ||
      kvdb_first_get(sb) != 0)
    return -1;
  for (size_t c = 0; c < sb->n_ctx; c++)
    for (int k = 0; k < N_STORES; k++) {
      int s = ORDER[(c + pass) % 4][k];
      memset(sb->out, 0xA5, sb->ctx_bytes);
      uint64_t t0 = bench_now_ns();
      if (GET[s](sb, c) != 0) {
        bench_log("get of context %zu from %s failed", c, STORE_NAME[s]);
        return -1;
      }
      uint64_t dt = bench_now_ns() - t0;
      sb->get_ns[s] += dt;
      bench_samples_push(&sb->get_op[s], dt);
      if (check_out(sb, c, STORE_NAME[s]) != 0)
        return -1;
    }
  sb->get_bytes += (uint64_t)sb->n_ctx * sb->ctx_bytes;
  close_all(sb);
  return 0;
}

/* ---- phase 3: DRAM tier vs memcpy ------------------------------------------------------- */

typedef struct dram_result {
  double kvdb_gbps, memcpy_gbps;
  uint64_t tier_hits, disk_bytes_timed;
  unsigned rounds;
} dram_result;

static int phase_dram(store_bench *sb, dram_result *r)
{
  r->rounds = sb->env->quick ? ST_QUICK_DRAM_ROUNDS : ST_FULL_DRAM_ROUNDS;
  if (open_kvdb(sb->db_dir, ST_DRAM_TIER_BYTES, &sb->db) != 0)
    return -1;
  for (size_t c = 0; c < sb->n_ctx; c++) { /* warm: SSD -> DRAM tier */
    memset(sb->out, 0xA5, sb->ctx_bytes);
    if (get_kvdb(sb, c) != 0 || check_out(sb, c, "kvdb_get (warming the DRAM tier)") != 0)
      return -1;
  }
  kvdb_stats s0, s1;
  kvdb_status rc = kvdb_stat(sb->db, &s0);
  if (rc != KVDB_OK)
    return kfail("kvdb_stat", rc);
  if (s0.tier[KVDB_TIER_DRAM].blocks != (uint64_t)sb->n_ctx * sb->n_blk)
    bench_log("WARNING: the DRAM tier holds %" PRIu64 " of %zu blocks after warming",
              s0.tier[KVDB_TIER_DRAM].blocks, sb->n_ctx * sb->n_blk);
  uint64_t t_kvdb = 0, t_mem = 0;
  for (unsigned round = 0; round < r->rounds; round++)
    for (int k = 0; k < 2; k++) {
      int which = (int)((round + (unsigned)k) % 2); /* 0 = kvdb, 1 = memcpy */
      for (size_t c = 0; c < sb->n_ctx; c++) {
        uint64_t t0 = bench_now_ns();
        if (which == 0) {
          if (get_kvdb(sb, c) != 0)
            return -1;
        } else {
          memcpy_fn(sb->out, sb->kv[c], sb->ctx_bytes);
        }
        uint64_t dt = bench_now_ns() - t0;
        *(which == 0 ? &t_kvdb : &t_mem) += dt;
      }
    }
  rc = kvdb_stat(sb->db, &s1);
  if (rc != KVDB_OK)
    return kfail("kvdb_stat", rc);
  for (size_t c = 0; c < sb->n_ctx; c++) { /* the tier returns the right bytes */
    memset(sb->out, 0xA5, sb->ctx_bytes);
    if (get_kvdb(sb, c) != 0 || check_out(sb, c, "kvdb_get (DRAM tier)") != 0)
      return -1;
  }
  uint64_t bytes = (uint64_t)r->rounds * sb->n_ctx * sb->ctx_bytes;
  r->kvdb_gbps = bench_gbps(bytes, t_kvdb);
  r->memcpy_gbps = bench_gbps(bytes, t_mem);
  r->tier_hits = s1.tier[KVDB_TIER_DRAM].hits - s0.tier[KVDB_TIER_DRAM].hits;
  r->disk_bytes_timed = s1.bytes_read - s0.bytes_read;
  close_all(sb);
  return 0;
}

/* ---- phase 4: token subsets ----------------------------------------------------------- */

typedef struct subset_result {
  uint64_t bytes_read[2], bytes_needed[2];
  bench_samples lat[2];
  size_t n_pos[2], trials;
} subset_result;

static int cmp_u32(const void *a, const void *b)
{
  uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
  return x < y ? -1 : x > y;
}

/* Choose k distinct values of [0, n) (partial Fisher–Yates over `scratch`, n entries). */
static void choose(dg_rng *r, uint32_t *scratch, uint32_t n, uint32_t k, uint32_t *out)
{
  for (uint32_t i = 0; i < n; i++)
    scratch[i] = i;
  for (uint32_t i = 0; i < k; i++) {
    uint32_t j = i + dg_below(r, n - i);
    uint32_t t = scratch[i];
    scratch[i] = scratch[j];
    scratch[j] = t;
    out[i] = scratch[i];
  }
}

/* 0 clustered: runs of ST_SUBSET_RUN aligned tokens; 1 uniform. Returns n positions. */
static uint32_t subset_positions(dg_rng *r, int pattern, uint32_t n_tokens, uint32_t *scratch,
                                 uint32_t *pos)
{
  uint32_t want = (uint32_t)lround(ST_SUBSET_FRACTION * n_tokens);
  uint32_t n = 0;
  if (pattern == 0) {
    uint32_t n_runs = (uint32_t)lround((double)want / ST_SUBSET_RUN);
    if (n_runs == 0)
      n_runs = 1;
    uint32_t runs[ST_CTX_TOKENS / ST_SUBSET_RUN];
    choose(r, scratch, n_tokens / ST_SUBSET_RUN, n_runs, runs);
    for (uint32_t i = 0; i < n_runs; i++)
      for (uint32_t t = 0; t < ST_SUBSET_RUN; t++)
        pos[n++] = runs[i] * ST_SUBSET_RUN + t;
  } else {
    choose(r, scratch, n_tokens, want, pos);
    n = want;
  }
  qsort(pos, n, sizeof *pos, cmp_u32);
  return n;
}

static int phase_subset(store_bench *sb, subset_result *res)
{
  bench_drop_cache(sb->env->dir);
  if (open_kvdb(sb->db_dir, 0, &sb->db) != 0)
    return -1;
  const uint32_t nt = (uint32_t)sb->ctx_tokens;
  const size_t row = sb->tok_row; /* one token of one layer, K or V: heads * dim * 2 */
  uint32_t pos[ST_CTX_TOKENS], scratch[ST_CTX_TOKENS];
  uint8_t *buf = bench_alloc(2 * ST_CTX_TOKENS * row);
  if (buf == NULL)
    return efail("cannot allocate", "subset buffer", ENOMEM);
  unsigned n_layers = sb->env->quick ? ST_QUICK_SUBSET_LAYERS : ST_FULL_SUBSET_LAYERS;
  dg_rng rng = {sb->env->seed ^ 0x737562736574ull};
  int rc = 0;
  for (size_t c = 0; rc == 0 && c < sb->n_ctx; c++)
    for (unsigned li = 0; rc == 0 && li < n_layers; li++) {
      uint32_t layer = (uint32_t)((li * sb->m.n_layers + dg_below(&rng, sb->m.n_layers)) / n_layers);
      res->trials++;
      for (int pat = 0; rc == 0 && pat < 2; pat++) {
        uint32_t n = subset_positions(&rng, pat, nt, scratch, pos);
        kvdb_kv_view v;
        memset(&v, 0, sizeof v);
        v.k.base = buf;
        v.k.token_stride = (int64_t)row;
        v.k.head_stride = (int64_t)sb->m.head_dim * 2;
        v.k.dim_stride = 2;
        v.v = v.k;
        v.v.base = buf + (size_t)n * row;
        kvdb_stats s0, s1;
        kvdb_key ctx = sb->keys[c][sb->n_blk - 1];
        kvdb_status ks = kvdb_stat(sb->db, &s0);
        uint64_t t0 = bench_now_ns();
        if (ks == KVDB_OK)
          ks = kvdb_get_tokens(sb->db, &sb->m, &ctx, layer, pos, n, &v);
        uint64_t dt = bench_now_ns() - t0;
        if (ks == KVDB_OK)
          ks = kvdb_stat(sb->db, &s1);
        if (ks != KVDB_OK) {
          rc = kfail("kvdb_get_tokens", ks);
          break;
        }
        bench_samples_push(&res->lat[pat], dt);
        res->bytes_read[pat] += s1.bytes_read - s0.bytes_read;
        res->bytes_needed[pat] += (uint64_t)n * sb->m.n_kv_heads * 2 * sb->m.head_dim * 2;
        res->n_pos[pat] = n;
        for (uint32_t i = 0; i < n && rc == 0; i++)
          for (int kvi = 0; kvi < 2; kvi++) {
            const uint8_t *want = sb->kv[c] + (((size_t)layer * 2 + (size_t)kvi) * nt + pos[i]) * row;
            const uint8_t *got = buf + (size_t)kvi * n * row + (size_t)i * row;
            if (memcmp(want, got, row) != 0) {
              bench_log("kvdb_get_tokens returned wrong KV (context %zu, layer %u, position %u)",
                        c, layer, pos[i]);
              rc = -1;
              break;
            }
          }
      }
    }
  bench_free(buf);
  close_all(sb);
  return rc;
}

/* ---- phase 5: lookup ------------------------------------------------------------------ */

typedef struct lookup_q {
  uint32_t tok[ST_LOOKUP_TOKENS];
  uint32_t expect;    /* hit tokens expected (misses: below one block) */
} lookup_q;

typedef struct lookup_run {
  kvdb *db;
  const lookup_q *q;
  int miss;
  size_t bad;
} lookup_run;

static int lookup_one(void *payload, size_t i)
{
  lookup_run *r = payload;
  size_t hit;
  kvdb_status rc = kvdb_lookup(r->db, &TINY, r->q[i].tok, ST_LOOKUP_TOKENS, &hit);
  if (rc != KVDB_OK)
    return kfail("kvdb_lookup", rc);
  if (r->miss ? hit >= TINY.block_tokens : hit != r->q[i].expect)
    r->bad++;
  return 0;
}

typedef struct lookup_result {
  uint64_t n_blocks, n_contexts, fill_ns, catalog_bytes;
  size_t n_queries, bad;
  bench_samples lat[3]; /* hit, partial, miss */
} lookup_result;

static uint64_t fam_seed(uint64_t seed, uint32_t f)
{
  return dg_mix(seed ^ 0x6c6f6f6b7570ull ^ ((uint64_t)f << 20));
}

static uint64_t prompt_seed(uint32_t f, uint32_t p)
{
  return ((uint64_t)f << 16) | p;
}

/* A database for a phase to fill fast at env->dir/name (dir, 4200 bytes): no DRAM tier, no
 * sync, no O_DIRECT (*o, for the phase to reopen it with). 0, or kfail's -1 naming `what`. */
static int open_fill_db(const bench_env *env, const char *name, char *dir, kvdb_options *o,
                        kvdb **db, const char *what)
{
  bench_path(dir, 4200, env->dir, name);
  kvdb_options_init(o);
  o->dram_bytes = 0;
  o->sync_mode = KVDB_SYNC_NONE;
  o->use_direct_io = 0;
  kvdb_status ks = kvdb_open(dir, o, db);
  return ks == KVDB_OK ? 0 : kfail(what, ks);
}

static int phase_lookup(store_bench *sb, lookup_result *res)
{
  const bench_env *env = sb->env;
  char dir[4200];
  kvdb_options o;
  kvdb *db;
  kvdb_status ks;
  if (open_fill_db(env, "lookup", dir, &o, &db, "kvdb_open (lookup database)") != 0)
    return -1;
  dg_kv_model dm;
  if (dg_kv_model_init(&dm, TINY.n_layers, TINY.n_kv_heads, TINY.head_dim, env->seed) != 0) {
    kvdb_close(db);
    return efail("cannot allocate", "channel statistics", ENOMEM);
  }
  uint32_t tok[ST_LOOKUP_TOKENS];
  uint16_t kvbuf[ST_LOOKUP_TOKENS * 2 * 16];
  kvdb_kv_view v;
  kvdb_kv_view_packed(&v, kvbuf, &TINY, ST_LOOKUP_TOKENS, KVDB_LAYOUT_LKTHD);
  bench_log("lookup: filling %u prompts of %u tokens (tiny model, KVDB_SYNC_NONE)",
            ST_LOOKUP_FAMILIES * ST_LOOKUP_PER_FAMILY, ST_LOOKUP_TOKENS);
  uint64_t t0 = bench_now_ns();
  int rc = 0;
  for (uint32_t f = 0; rc == 0 && f < ST_LOOKUP_FAMILIES; f++)
    for (uint32_t p = 0; p < ST_LOOKUP_PER_FAMILY; p++) {
      dg_prompt(tok, ST_LOOKUP_TOKENS, fam_seed(env->seed, f), ST_LOOKUP_SHARED, prompt_seed(f, p),
                ST_VOCAB);
      if (dg_kv_fill_f16(&dm, tok, ST_LOOKUP_TOKENS, kvbuf) != 0) {
        rc = efail("cannot allocate", "prefix hashes", ENOMEM);
        break;
      }
      ks = kvdb_put(db, &TINY, tok, ST_LOOKUP_TOKENS, &v, NULL);
      if (ks != KVDB_OK) {
        rc = kfail("kvdb_put (lookup fill)", ks);
        break;
      }
    }
  res->fill_ns = bench_now_ns() - t0;
  dg_kv_model_free(&dm);
  kvdb_close(db);
  if (rc != 0)
    return rc;

  /* a fresh handle: nothing of the fill is cached by kvdb (the catalog pages are in the page
   * cache, as they are in a serving process that has been running for a while) */
  o.sync_mode = KVDB_SYNC_FULL;
  ks = kvdb_open(dir, &o, &db);
  if (ks != KVDB_OK)
    return kfail("kvdb_open (lookup database)", ks);
  kvdb_stats st;
  ks = kvdb_stat(db, &st);
  if (ks != KVDB_OK) {
    kvdb_close(db);
    return kfail("kvdb_stat", ks);
  }
  res->n_blocks = st.n_blocks;
  res->n_contexts = st.n_contexts;
  res->catalog_bytes = st.catalog_bytes;
  if (st.n_blocks < 100000)
    bench_log("WARNING: only %" PRIu64 " blocks stored for the lookup test", st.n_blocks);

  size_t nq = env->quick ? ST_QUICK_LOOKUPS : ST_FULL_LOOKUPS;
  res->n_queries = nq;
  lookup_q *q = malloc((nq + ST_LOOKUP_WARMUP) * sizeof *q);
  if (q == NULL) {
    kvdb_close(db);
    return efail("cannot allocate", "queries", ENOMEM);
  }
  dg_rng rng = {env->seed ^ 0x71756572ull};
  for (int kind = 0; rc == 0 && kind < 3; kind++) {
    size_t total = nq + ST_LOOKUP_WARMUP;
    for (size_t i = 0; i < total; i++) {
      uint32_t f = dg_below(&rng, ST_LOOKUP_FAMILIES), p = dg_below(&rng, ST_LOOKUP_PER_FAMILY);
      if (kind == 2) { /* an unseen family: the first block is not stored */
        f += ST_LOOKUP_FAMILIES + (uint32_t)i;
        p = 0;
      }
      dg_prompt(q[i].tok, ST_LOOKUP_TOKENS, fam_seed(env->seed, f), ST_LOOKUP_SHARED,
                prompt_seed(f, p), ST_VOCAB);
      q[i].expect = ST_LOOKUP_TOKENS;
      if (kind == 1) { /* a stored prompt with a new ending: hit through the children scan */
        dg_tokens(q[i].tok + ST_LOOKUP_PARTIAL_KEEP, ST_LOOKUP_TOKENS - ST_LOOKUP_PARTIAL_KEEP,
                  dg_next(&rng), ST_VOCAB);
        q[i].expect = ST_LOOKUP_PARTIAL_KEEP;
      }
    }
    lookup_run lr = {db, q, kind == 2, 0};
    bench_samples warm = {0};
    bench_fn_opts wo = {lookup_one, &lr, ST_LOOKUP_WARMUP, ST_LOOKUP_WARMUP, 0};
    bench_fn_opts to = {lookup_one, NULL, nq, nq, 0};
    lookup_run lt = {db, q + ST_LOOKUP_WARMUP, kind == 2, 0};
    to.payload = &lt;
    if (bench_fn_run(&wo, &warm) != 0 || bench_fn_run(&to, &res->lat[kind]) != 0)
      rc = -1;
    bench_samples_free(&warm);
    res->bad += lr.bad + lt.bad;
  }
  free(q);
  kvdb_close(db);
  if (rc == 0 && res->bad > 0) {
    bench_log("%zu lookups returned an unexpected hit length", res->bad);
    rc = -1;
  }
  return rc;
}

/* ---- phase 6: lookup under high fan-out ------------------------------------------------ */

typedef struct fanout_run {
  kvdb *db;
  uint32_t (*q)[16 + ST_FANOUT_HEADER + ST_FANOUT_MAX_EXTRA + 8];
  const uint32_t *nq, *expect;
  size_t bad;
} fanout_run;

static int fanout_one(void *payload, size_t i)
{
  fanout_run *r = payload;
  size_t hit;
  kvdb_status rc = kvdb_lookup(r->db, &TINY, r->q[i], r->nq[i], &hit);
  if (rc != KVDB_OK)
    return kfail("kvdb_lookup (fan-out)", rc);
  if (hit != r->expect[i])
    r->bad++;
  return 0;
}

typedef struct fanout_result {
  uint64_t n_blocks;
  size_t n_queries, bad;
  bench_samples lat;
} fanout_result;

static int phase_lookup_fanout(store_bench *sb, fanout_result *res)
{
  const bench_env *env = sb->env;
  enum { MAXN = 16 + ST_FANOUT_HEADER + ST_FANOUT_MAX_EXTRA + 8 };
  char dir[4200];
  kvdb_options o;
  kvdb *db;
  kvdb_status ks;
  if (open_fill_db(env, "fanout", dir, &o, &db, "kvdb_open (fan-out database)") != 0)
    return -1;
  /* continuation c: tokens [0, 16) the block, then the header, then its own tokens */
  uint32_t (*cont)[MAXN] = malloc(ST_FANOUT_CONT * sizeof *cont);
  uint32_t *clen = malloc(ST_FANOUT_CONT * sizeof *clen);
  uint16_t *kvbuf = calloc(MAXN, kvdb_model_token_bytes(&TINY));
  if (cont == NULL || clen == NULL || kvbuf == NULL) {
    free(cont);
    free(clen);
    free(kvbuf);
    kvdb_close(db);
    return efail("cannot allocate", "continuations", ENOMEM);
  }
  dg_rng rng = {env->seed ^ 0x66616e6f7574ull};
  int rc = 0;
  bench_log("lookup under fan-out: %u continuations of one block (tiny model)", ST_FANOUT_CONT);
  for (uint32_t c = 0; c < ST_FANOUT_CONT; c++) {
    for (uint32_t t = 0; t < 16 + ST_FANOUT_HEADER; t++)
      cont[c][t] = 1000 + t;
    clen[c] = 16 + ST_FANOUT_HEADER + 3 + dg_below(&rng, ST_FANOUT_MAX_EXTRA - 2);
    dg_tokens(cont[c] + 16 + ST_FANOUT_HEADER, clen[c] - 16 - ST_FANOUT_HEADER, dg_next(&rng),
              ST_VOCAB - 2000);
    for (uint32_t t = 16 + ST_FANOUT_HEADER; t < clen[c]; t++)
      cont[c][t] += 2000; /* never a header token */
    kvdb_kv_view v;
    kvdb_kv_view_packed(&v, kvbuf, &TINY, clen[c], KVDB_LAYOUT_LKTHD);
    ks = kvdb_put(db, &TINY, cont[c], clen[c], &v, NULL);
    if (ks != KVDB_OK) {
      rc = kfail("kvdb_put (fan-out fill)", ks);
      break;
    }
  }
  kvdb_close(db);
  free(kvbuf);
  size_t nq = env->quick ? ST_QUICK_LOOKUPS : ST_FULL_LOOKUPS, total = nq + ST_LOOKUP_WARMUP;
  uint32_t (*q)[MAXN] = rc == 0 ? malloc(total * sizeof *q) : NULL;
  uint32_t *qn = rc == 0 ? malloc(total * sizeof *qn) : NULL;
  uint32_t *qe = rc == 0 ? malloc(total * sizeof *qe) : NULL;
  if (rc == 0 && (q == NULL || qn == NULL || qe == NULL))
    rc = efail("cannot allocate", "queries", ENOMEM);
  if (rc == 0 && (ks = kvdb_open(dir, &o, &db)) != KVDB_OK)
    rc = kfail("kvdb_open (fan-out database)", ks);
  if (rc == 0) {
    kvdb_stats st;
    if (kvdb_stat(db, &st) == KVDB_OK)
      res->n_blocks = st.n_blocks;
    /* a continuation kept to a point past the header (unique there: random tokens from a
     * vocabulary of 126k), then new tokens no continuation has */
    for (size_t i = 0; i < total; i++) {
      uint32_t c = dg_below(&rng, ST_FANOUT_CONT);
      uint32_t own = clen[c] - 16 - ST_FANOUT_HEADER;
      uint32_t keep = 16 + ST_FANOUT_HEADER + 2 + dg_below(&rng, own - 1);
      if (keep > clen[c])
        keep = clen[c];
      memcpy(q[i], cont[c], keep * sizeof **q);
      qn[i] = keep + 8;
      for (uint32_t t = keep; t < qn[i]; t++)
        q[i][t] = 500 + t; /* below every stored token past the block */
      qe[i] = keep;
    }
    fanout_run warm = {db, q, qn, qe, 0}, run = {db, q + ST_LOOKUP_WARMUP, qn + ST_LOOKUP_WARMUP,
                                                 qe + ST_LOOKUP_WARMUP, 0};
    bench_samples ws = {0};
    bench_fn_opts wo = {fanout_one, &warm, ST_LOOKUP_WARMUP, ST_LOOKUP_WARMUP, 0};
    bench_fn_opts to = {fanout_one, &run, nq, nq, 0};
    if (bench_fn_run(&wo, &ws) != 0 || bench_fn_run(&to, &res->lat) != 0)
      rc = -1;
    bench_samples_free(&ws);
    res->n_queries = nq;
    res->bad = warm.bad + run.bad;
    kvdb_close(db);
  }
  free(q);
  free(qn);
  free(qe);
  free(cont);
  free(clen);
  if (!env->keep)
    bench_rmtree(dir);
  if (rc == 0 && res->bad > 0) {
    bench_log("%zu fan-out lookups did not return the longest stored prefix", res->bad);
    rc = -1;
  }
  return rc;
}

/* ---- the report ----------------------------------------------------------------------- */

static double us(uint64_t ns)
{
  return (double)ns / 1000.0;
}

/* p-th percentile in ms; p = 0 is the minimum. */
static double ms_pct(bench_samples *s, double p)
{
  return (double)bench_samples_pct(s, p > 0 ? p : 1e-9) / 1e6;
}

int bench_store(const bench_env *env, bench_json *j)
{
  store_bench sb = {.env = env, .m = LLAMA3, .raw_fd = -1, .files_dirfd = -1};
  sb.n_ctx = env->quick ? ST_QUICK_CTX : ST_FULL_CTX;
  sb.ctx_tokens = ST_CTX_TOKENS;
  sb.blk_tokens = sb.m.block_tokens;
  sb.n_blk = (sb.ctx_tokens + sb.blk_tokens - 1) / sb.blk_tokens;
  sb.tok_row = (size_t)sb.m.n_kv_heads * sb.m.head_dim * 2;
  sb.ctx_bytes = kvdb_model_token_bytes(&sb.m) * sb.ctx_tokens;
  sb.n_pieces = (size_t)sb.m.n_layers * 2;
  sb.read_passes = env->quick ? ST_QUICK_READ_PASSES : ST_FULL_READ_PASSES;
  bench_path(sb.db_dir, sizeof sb.db_dir, env->dir, "kvdb");
  bench_path(sb.raw_path, sizeof sb.raw_path, env->dir, "raw.bin");
  bench_path(sb.files_dir, sizeof sb.files_dir, env->dir, "files");
  bench_path(sb.lmdb_path, sizeof sb.lmdb_path, env->dir, "peer.lmdb");

  uint64_t per_store = (uint64_t)sb.n_ctx * sb.ctx_bytes;
  uint64_t need = 4 * per_store + (1ull << 30) /* lookup database */ + (512ull << 20);
  uint64_t avail = bench_free_bytes(env->dir);
  if (avail != 0 && avail < need) {
    bench_log("%s has %.1f GiB free; this run needs %.1f GiB", env->dir, mib(avail) / 1024,
              mib(need) / 1024);
    return 1;
  }

  subset_result sub = {0};
  lookup_result lk = {0};
  dram_result dr = {0};
  int rc = make_data(&sb);
  if (rc == 0)
    rc = phase_put(&sb);
  for (unsigned p = 0; rc == 0 && p < sb.read_passes; p++) {
    bench_log("cold get: pass %u of %u", p + 1, sb.read_passes);
    rc = phase_cold_get(&sb, p);
  }
  if (rc == 0) {
    bench_log("DRAM tier: %u rounds", env->quick ? ST_QUICK_DRAM_ROUNDS : ST_FULL_DRAM_ROUNDS);
    rc = phase_dram(&sb, &dr);
  }
  if (rc == 0) {
    bench_log("token subsets");
    rc = phase_subset(&sb, &sub);
  }
  close_all(&sb);
  /* the big data is no longer needed: give its disk space back before the lookup fill */
  if (rc == 0 && !env->keep) {
    bench_rmtree(sb.db_dir);
    bench_rmtree(sb.files_dir);
    unlink(sb.raw_path);
    char lock[4300];
    snprintf(lock, sizeof lock, "%s-lock", sb.lmdb_path);
    unlink(sb.lmdb_path);
    unlink(lock);
  }
  if (rc == 0)
    rc = phase_lookup(&sb, &lk);
  fanout_result fo = {0};
  if (rc == 0)
    rc = phase_lookup_fanout(&sb, &fo);
  if (rc != 0) {
    bench_samples_free(&fo.lat);
    free_data(&sb);
    for (int p = 0; p < 2; p++)
      bench_samples_free(&sub.lat[p]);
    for (int k = 0; k < 3; k++)
      bench_samples_free(&lk.lat[k]);
    return 1;
  }

  /* figures */
  double put_g[N_STORES], get_g[N_STORES];
  for (int s = 0; s < N_STORES; s++) {
    put_g[s] = bench_gbps(per_store, sb.put_ns[s]);
    get_g[s] = bench_gbps(sb.get_bytes, sb.get_ns[s]);
  }
  double put_vs_raw = bench_ratio(put_g[S_KVDB], put_g[S_RAW]);
  double get_vs_raw = bench_ratio(get_g[S_KVDB], get_g[S_RAW]);
  double dram_vs = bench_ratio(dr.kvdb_gbps, dr.memcpy_gbps);
  double amp[2];
  for (int p = 0; p < 2; p++)
    amp[p] = bench_ratio((double)sub.bytes_read[p], (double)sub.bytes_needed[p]);
  double lk_p50 = us(bench_samples_pct(&lk.lat[0], 50)), lk_p99 = us(bench_samples_pct(&lk.lat[0], 99));
  int ok_put = put_vs_raw >= T_PUT_VS_RAW, ok_get = get_vs_raw >= T_GET_VS_RAW;
  int ok_dram = dram_vs >= T_DRAM_VS_MEMCPY, ok_lk = lk_p99 <= T_LOOKUP_P99_US;
  int ok_sub = amp[0] <= T_SUBSET_AMP;
  int n_met = ok_put + ok_get + ok_dram + ok_lk + ok_sub;
  const kvdb_stats *ps = &sb.put_stats;

  FILE *o = env->out;
  fprintf(o, "shape: Llama-3-8B (32 layers, 8 KV heads, head_dim 128, f16) = %zu KiB/token; "
             "256-token blocks = %.0f MiB\n",
          kvdb_model_token_bytes(&sb.m) / 1024, mib(sb.ctx_bytes / sb.n_blk));
  fprintf(o, "data: %zu contexts x %zu tokens = %.0f MiB each, %.0f MiB per store, no shared "
             "prefixes; kvdb direct_io %d, io_uring %d; raw O_DIRECT %d\n",
          sb.n_ctx, sb.ctx_tokens, mib(sb.ctx_bytes), mib(per_store), ps->direct_io, ps->io_uring,
          sb.raw_direct);
  fprintf(o, "cold reads: %u pass%s, page cache dropped before each with %s; stores interleaved "
             "context by context\n",
          sb.read_passes, sb.read_passes > 1 ? "es" : "", sb.drop_method);
  uint64_t kv_written = ps->bytes_written - sb.warm_written;
  fprintf(o, "GB = 1e9 bytes of KV (kvdb also wrote %.2f%% of headers/checksums: %" PRIu64
             " bytes for %" PRIu64 "); kvdb's untimed first put (2 blocks, sets up the segment "
             "and staging buffers) took %.0f ms, its untimed first get of each fresh handle (2 "
             "blocks, sets up the read buffers) at most %.0f ms\n",
          100.0 * ((double)kv_written / (double)per_store - 1.0), kv_written, per_store,
          (double)sb.first_put_ns / 1e6, (double)sb.first_get_ns / 1e6);
  fprintf(o, "\n");
  fprintf(o, "put   kvdb_put, KVDB_SYNC_FULL          %6.3f GB/s   raw O_DIRECT write+fdatasync %6.3f GB/s"
             "   put_vs_raw %.3f   (target >= %.2f: %s)\n",
          put_g[S_KVDB], put_g[S_RAW], put_vs_raw, T_PUT_VS_RAW, bench_met(ok_put));
  fprintf(o, "get   kvdb_get cold, SSD tier, dram 0   %6.3f GB/s   raw O_DIRECT sequential read %6.3f GB/s"
             "   get_vs_raw %.3f   (target >= %.2f: %s)\n",
          get_g[S_KVDB], get_g[S_RAW], get_vs_raw, T_GET_VS_RAW, bench_met(ok_get));
  fprintf(o, "dram  kvdb_get from the DRAM tier       %6.3f GB/s   memcpy of the same bytes     %6.3f GB/s"
             "   dram_get_vs_memcpy %.3f   (target >= %.2f: %s)\n",
          dr.kvdb_gbps, dr.memcpy_gbps, dram_vs, T_DRAM_VS_MEMCPY, bench_met(ok_dram));
  fprintf(o, "      (%u rounds x %zu contexts; DRAM-tier block hits %" PRIu64
             ", bytes read from disk while timed %" PRIu64 ")\n",
          dr.rounds, sb.n_ctx, dr.tier_hits, dr.disk_bytes_timed);
  fprintf(o, "lookup  %" PRIu64 " blocks stored (%" PRIu64 " contexts, catalog %.0f MiB, fill %.1f s); "
             "%zu timed lookups of each kind:\n",
          lk.n_blocks, lk.n_contexts, mib(lk.catalog_bytes), (double)lk.fill_ns * 1e-9,
          lk.n_queries);
  static const char *const kind[3] = {"hit (64 of 64 tokens)", "partial (40 of 64 tokens)",
                                      "miss (first block unseen)"};
  for (int k = 0; k < 3; k++)
    fprintf(o, "      %-26s p50 %6.2f us   p99 %6.2f us\n", kind[k],
            us(bench_samples_pct(&lk.lat[k], 50)), us(bench_samples_pct(&lk.lat[k], 99)));
  fprintf(o, "      lookup_p99_us (hits) %.2f   (target <= %.0f: %s)\n", lk_p99, T_LOOKUP_P99_US,
          bench_met(ok_lk));
  fprintf(o, "      fan-out: one block with %u continuations (%" PRIu64 " blocks), %zu partial "
             "hits: p50 %6.2f us   p99 %6.2f us (lookup_fanout_p99_us)\n",
          ST_FANOUT_CONT, fo.n_blocks, fo.n_queries, us(bench_samples_pct(&fo.lat, 50)),
          us(bench_samples_pct(&fo.lat, 99)));
  fprintf(o, "subset  kvdb_get_tokens of 10%% of one layer's positions, cold, dram 0, %zu trials "
             "(context x layer):\n",
          sub.trials);
  fprintf(o, "      clustered (%zu positions in 16-token aligned runs): read %" PRIu64 " B for %" PRIu64
             " B needed, amplification %.3f   (target <= %.1f: %s; this is subset_read_amplification)\n",
          sub.n_pos[0], sub.bytes_read[0], sub.bytes_needed[0], amp[0], T_SUBSET_AMP, bench_met(ok_sub));
  fprintf(o, "      uniform   (%zu random positions):               read %" PRIu64 " B for %" PRIu64
             " B needed, amplification %.3f   (no target: 16-token pages)\n",
          sub.n_pos[1], sub.bytes_read[1], sub.bytes_needed[1], amp[1]);
  fprintf(o, "      latency per call p50: clustered %.0f us, uniform %.0f us\n",
          us(bench_samples_pct(&sub.lat[0], 50)), us(bench_samples_pct(&sub.lat[1], 50)));
  fprintf(o, "peers on the same data (put durable, get cold):\n");
  fprintf(o, "      kvdb                     put %6.3f GB/s (%.2f x raw)   get %6.3f GB/s (%.2f x raw)\n",
          put_g[S_KVDB], put_vs_raw, get_g[S_KVDB], get_vs_raw);
  fprintf(o, "      one file per block       put %6.3f GB/s (%.2f x raw)   get %6.3f GB/s (%.2f x raw)"
             "   [write+fsync per file, buffered read]\n",
          put_g[S_FILES], bench_ratio(put_g[S_FILES], put_g[S_RAW]), get_g[S_FILES],
          bench_ratio(get_g[S_FILES], get_g[S_RAW]));
  fprintf(o, "      LMDB, block = value      put %6.3f GB/s (%.2f x raw)   get %6.3f GB/s (%.2f x raw)"
             "   [txn per context, mdb_get + memcpy]\n",
          put_g[S_LMDB], bench_ratio(put_g[S_LMDB], put_g[S_RAW]), get_g[S_LMDB],
          bench_ratio(get_g[S_LMDB], get_g[S_RAW]));
  fprintf(o, "per-context times, ms (the spread shows the disk's noise):\n");
  for (int s = 0; s < N_STORES; s++)
    fprintf(o, "      %-6s put p50 %5.0f [%5.0f .. %5.0f]   get p50 %5.0f [%5.0f .. %5.0f]\n",
            STORE_NAME[s], ms_pct(&sb.put_op[s], 50), ms_pct(&sb.put_op[s], 0),
            ms_pct(&sb.put_op[s], 100), ms_pct(&sb.get_op[s], 50), ms_pct(&sb.get_op[s], 0),
            ms_pct(&sb.get_op[s], 100));
  fprintf(o, "targets met: %d of 5\n", n_met);

  bench_json_num(j, "put_gbps", put_g[S_KVDB]);
  bench_json_num(j, "raw_write_gbps", put_g[S_RAW]);
  bench_json_num(j, "put_vs_raw", put_vs_raw);
  bench_json_num(j, "get_cold_gbps", get_g[S_KVDB]);
  bench_json_num(j, "raw_read_gbps", get_g[S_RAW]);
  bench_json_num(j, "get_vs_raw", get_vs_raw);
  bench_json_num(j, "dram_get_gbps", dr.kvdb_gbps);
  bench_json_num(j, "memcpy_gbps", dr.memcpy_gbps);
  bench_json_num(j, "dram_get_vs_memcpy", dram_vs);
  bench_json_num(j, "lookup_p50_us", lk_p50);
  bench_json_num(j, "lookup_p99_us", lk_p99);
  bench_json_num(j, "lookup_partial_p50_us", us(bench_samples_pct(&lk.lat[1], 50)));
  bench_json_num(j, "lookup_partial_p99_us", us(bench_samples_pct(&lk.lat[1], 99)));
  bench_json_num(j, "lookup_miss_p50_us", us(bench_samples_pct(&lk.lat[2], 50)));
  bench_json_num(j, "lookup_miss_p99_us", us(bench_samples_pct(&lk.lat[2], 99)));
  bench_json_int(j, "lookup_n_blocks", (int64_t)lk.n_blocks);
  bench_json_num(j, "lookup_fanout_p50_us", us(bench_samples_pct(&fo.lat, 50)));
  bench_json_num(j, "lookup_fanout_p99_us", us(bench_samples_pct(&fo.lat, 99)));
  bench_json_int(j, "lookup_fanout_children", ST_FANOUT_CONT);
  bench_json_num(j, "subset_read_amplification", amp[0]);
  bench_json_num(j, "subset_uniform_amplification", amp[1]);
  bench_json_num(j, "subset_clustered_p50_us", us(bench_samples_pct(&sub.lat[0], 50)));
  bench_json_num(j, "subset_uniform_p50_us", us(bench_samples_pct(&sub.lat[1], 50)));
  bench_json_num(j, "files_put_gbps", put_g[S_FILES]);
  bench_json_num(j, "files_get_gbps", get_g[S_FILES]);
  bench_json_num(j, "lmdb_put_gbps", put_g[S_LMDB]);
  bench_json_num(j, "lmdb_get_gbps", get_g[S_LMDB]);
  bench_json_int(j, "n_contexts", (int64_t)sb.n_ctx);
  bench_json_int(j, "context_tokens", (int64_t)sb.ctx_tokens);
  bench_json_int(j, "n_blocks", (int64_t)(sb.n_ctx * sb.n_blk));
  bench_json_int(j, "block_bytes", (int64_t)(sb.ctx_bytes / sb.n_blk));
  bench_json_int(j, "bytes_per_store", (int64_t)per_store);
  bench_json_int(j, "kvdb_bytes_written", (int64_t)kv_written);
  bench_json_num(j, "kvdb_first_put_ms", (double)sb.first_put_ns / 1e6);
  bench_json_num(j, "kvdb_first_get_ms", (double)sb.first_get_ns / 1e6);
  bench_json_int(j, "read_passes", sb.read_passes);
  bench_json_int(j, "dram_rounds", dr.rounds);
  bench_json_bool(j, "direct_io", ps->direct_io);
  bench_json_bool(j, "io_uring", ps->io_uring);
  bench_json_bool(j, "raw_direct_io", sb.raw_direct);
  bench_json_str(j, "cache_drop", sb.drop_method);
  bench_json_int(j, "targets_met", n_met);
  bench_json_bool(j, "target_put_vs_raw_met", ok_put);
  bench_json_bool(j, "target_get_vs_raw_met", ok_get);
  bench_json_bool(j, "target_dram_get_vs_memcpy_met", ok_dram);
  bench_json_bool(j, "target_lookup_p99_us_met", ok_lk);
  bench_json_bool(j, "target_subset_read_amplification_met", ok_sub);

  free_data(&sb);
  for (int p = 0; p < 2; p++)
    bench_samples_free(&sub.lat[p]);
  for (int k = 0; k < 3; k++)
    bench_samples_free(&lk.lat[k]);
  bench_samples_free(&fo.lat);
  return 0;
}
