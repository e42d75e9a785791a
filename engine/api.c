/* SPDX-License-Identifier: MIT */
/*
 * engine/api.c — the public entry points: argument checks, then the put/lookup/get paths.
 *
 * PUT (durability order, invariant C2 of catalog.h)
 *   1. hashes; a read transaction decides which blocks are missing (dedup)
 *   2. missing blocks are gathered from the caller's view into staging buffers, sealed
 *      (checksums) and appended to this handle's segment with batched (io_uring) writes,
 *      double-buffered so gathering overlaps writing
 *   3. fdatasync of the segment (KVDB_SYNC_FULL)
 *   4. one LMDB write transaction: block records (or refcount +1 for blocks another writer
 *      stored meanwhile), the context record, the segment's new end and live bytes; commit
 *   A crash before 4 commits leaves only an unreferenced tail, truncated at the next open.
 *
 * GET
 *   the walk of kvdb_lookup in a read transaction (kept open so the locations stay valid),
 *   then each block from the DRAM tier or from disk (two reads in flight, each verified);
 *   a block that fails verification ends the hit.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>

#include "kv_db.h"
#include "store/kv_place.h"
#include "store/kv_score.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "kvdb hashes token arrays as stored in memory: a big-endian port must convert them"
#endif


/* ---- small helpers ------------------------------------------------------------------------ */

void kvdb_options_init(kvdb_options *opt)
{
  if (opt == NULL)
    return;
  memset(opt, 0, sizeof *opt);
  opt->struct_size = sizeof *opt;
  opt->flags = KVDB_O_CREATE;
  opt->dram_bytes = 256ull << 20;
  opt->ssd_bytes = 0;
  opt->sync_mode = KVDB_SYNC_FULL;
  opt->segment_bytes = 1ull << 30;
  opt->catalog_map_bytes = 64ull << 30;
  opt->use_direct_io = 1;
  opt->use_io_uring = 1;
  opt->log_level = 1;
  kv_place_options_init(opt);
}

kvdb_status kv_check_db(kvdb *db)
{
  kv_clear_error();
  if (db == NULL)
    return kv_fail(KVDB_INVALID, "db is NULL");
  if (db->magic != KVDB_MAGIC_OPEN)
    return kv_fail(KVDB_MISUSE, "db handle is closed or not a kvdb handle");
  return KVDB_OK;
}

kvdb_status kv_check_model(const kvdb_model *m, uint32_t *bt)
{
  *bt = 0;
  if (m == NULL)
    return kv_fail(KVDB_INVALID, "model is NULL");
  if (m->id == NULL || m->id[0] == 0 || strlen(m->id) > 63)
    return kv_fail(KVDB_INVALID, "model id must be 1..63 bytes");
  *bt = m->block_tokens ? m->block_tokens : 256;
  kv_block_geom g;
  kvdb_status rc = kv_block_geom_init(&g, m->n_layers, m->n_kv_heads, m->head_dim, m->dtype, *bt, 1);
  if (rc != KVDB_OK)
    return kv_fail(rc, "model '%s': %s", m->id, kvdb_errmsg());
  if (m->score_bits != 0 && m->score_bits != 8 && m->score_bits != 4)
    return kv_fail(KVDB_INVALID, "model '%s': score_bits %u is not 0, 8 or 4", m->id,
                   m->score_bits);
  if (m->score_bits == 4 && m->head_dim % 2 != 0)
    return kv_fail(KVDB_INVALID, "model '%s': int4 score copies need an even head_dim, not %u",
                   m->id, m->head_dim);
  return KVDB_OK;
}

kvdb_status kv_check_n_tokens(size_t n)
{
  if (n > KV_MAX_TOKENS)
    return kv_fail(KVDB_INVALID, "n %zu is too large: a context holds at most %zu tokens", n,
                   (size_t)KV_MAX_TOKENS);
  return KVDB_OK;
}

size_t kvdb_model_token_bytes(const kvdb_model *m)
{
  uint32_t bt;
  if (kv_check_model(m, &bt) != KVDB_OK)
    return 0;
  return (size_t)m->n_layers * m->n_kv_heads * m->head_dim * 2 * kv_dtype_bytes(m->dtype);
}

void kv_model_hash(const kvdb_model *m, uint32_t bt, uint8_t out[16])
{
  uint8_t buf[128];
  size_t idl = strlen(m->id);
  memcpy(buf, "kvdb-model-v1", 14);
  memcpy(buf + 14, m->id, idl + 1);
  uint8_t *p = buf + 15 + idl;
  kv_put_le32(p, m->n_layers);
  kv_put_le32(p + 4, m->n_kv_heads);
  kv_put_le32(p + 8, m->head_dim);
  kv_put_le32(p + 12, m->dtype);
  kv_put_le32(p + 16, bt);
  size_t len = (size_t)(p + 20 - buf);
  if (m->score_bits != 0) { /* appended only when set: fingerprints without it are unchanged */
    kv_put_le32(p + 20, m->score_bits);
    len += 4;
  }
  XXH128_canonical_t c;
  XXH128_canonicalFromHash(&c, XXH3_128bits(buf, len));
  memcpy(out, c.digest, 16);
}

void kv_chain_hash(const uint8_t parent[16], const uint32_t *tokens, size_t n, uint8_t out[16])
{
  XXH3_state_t st;
  XXH3_128bits_reset(&st);
  XXH3_128bits_update(&st, parent, 16);
  XXH3_128bits_update(&st, tokens, n * sizeof *tokens);
  XXH128_canonical_t c;
  XXH128_canonicalFromHash(&c, XXH3_128bits_digest(&st));
  memcpy(out, c.digest, 16);
}

kvdb_status kvdb_chain_hashes(const kvdb_model *m, const uint32_t *tokens, size_t n,
                              kvdb_key *hashes, size_t hashes_cap)
{
  kv_clear_error();
  uint32_t bt;
  KV_RET(kv_check_model(m, &bt));
  if (tokens == NULL || n == 0 || hashes == NULL)
    return kv_fail(KVDB_INVALID, "tokens, n and hashes must be non-NULL and non-zero");
  size_t nb = n / bt + (n % bt != 0); /* n + bt - 1 would wrap for n near SIZE_MAX */
  if (hashes_cap < nb)
    return kv_fail(KVDB_INVALID, "hashes_cap %zu < %zu blocks", hashes_cap, nb);
  uint8_t prev[16];
  kv_model_hash(m, bt, prev);
  for (size_t i = 0; i < nb; i++) {
    size_t len = (i + 1) * bt <= n ? bt : n - i * bt;
    kv_chain_hash(prev, tokens + i * bt, len, hashes[i].b);
    memcpy(prev, hashes[i].b, 16);
  }
  return KVDB_OK;
}

kvdb_status kvdb_block_context(const kvdb_model *m, const kvdb_key *key, kvdb_key *context)
{
  kv_clear_error();
  uint32_t bt;
  KV_RET(kv_check_model(m, &bt));
  if (key == NULL || context == NULL)
    return kv_fail(KVDB_INVALID, "key and context must be non-NULL");
  uint8_t buf[16 + 16 + 16];
  memcpy(buf, "kvdb-explicit-v1", 16);
  kv_model_hash(m, bt, buf + 16);
  memcpy(buf + 32, key->b, 16);
  XXH128_canonical_t c;
  XXH128_canonicalFromHash(&c, XXH3_128bits(buf, sizeof buf));
  memcpy(context->b, c.digest, 16);
  return KVDB_OK;
}

kvdb_status kvdb_kv_view_packed(kvdb_kv_view *view, void *base, const kvdb_model *m,
                                size_t n_tokens, kvdb_layout layout)
{
  kv_clear_error();
  uint32_t bt;
  if (view == NULL || base == NULL)
    return kv_fail(KVDB_INVALID, "view and base must be non-NULL");
  KV_RET(kv_check_model(m, &bt));
  int64_t eb = kv_dtype_bytes(m->dtype), d = m->head_dim, h = m->n_kv_heads;
  if (n_tokens > (uint64_t)INT64_MAX / ((uint64_t)2 * m->n_layers * h * d * eb))
    return kv_fail(KVDB_INVALID, "n_tokens %zu: a packed buffer of that many tokens would be "
                   "larger than 2^63 bytes", n_tokens);
  int64_t half = (int64_t)n_tokens * h * d * eb; /* bytes of K (or V) of one layer */
  memset(view, 0, sizeof *view);
  switch (layout) {
  case KVDB_LAYOUT_LKTHD:
    view->k.token_stride = h * d * eb;
    view->k.head_stride = d * eb;
    break;
  case KVDB_LAYOUT_LKHTD:
    view->k.token_stride = d * eb;
    view->k.head_stride = (int64_t)n_tokens * d * eb;
    break;
  default:
    return kv_fail(KVDB_INVALID, "layout %d is not KVDB_LAYOUT_LKTHD or KVDB_LAYOUT_LKHTD",
                   (int)layout);
  }
  view->k.base = base;
  view->k.layer_stride = 2 * half;
  view->k.dim_stride = eb;
  view->v = view->k;
  view->v.base = (uint8_t *)base + half;
  return KVDB_OK;
}

char *kvdb_key_hex(const kvdb_key *key, char *buf)
{
  return kv_hex16(key->b, buf);
}

kvdb_status kvdb_key_parse(const char *hex, kvdb_key *out)
{
  kv_clear_error();
  if (hex == NULL || out == NULL || strlen(hex) != 32)
    return kv_fail(KVDB_INVALID, "a key is 32 hex digits");
  for (int i = 0; i < 16; i++) {
    unsigned v = 0;
    for (int j = 0; j < 2; j++) {
      char c = hex[2 * i + j];
      unsigned x = c >= '0' && c <= '9'   ? (unsigned)(c - '0')
                   : c >= 'a' && c <= 'f' ? (unsigned)(c - 'a' + 10)
                   : c >= 'A' && c <= 'F' ? (unsigned)(c - 'A' + 10)
                                          : 99u;
      if (x > 15)
        return kv_fail(KVDB_INVALID, "'%s' is not a hex key", hex);
      v = v * 16 + x;
    }
    out->b[i] = (uint8_t)v;
  }
  return KVDB_OK;
}

kvdb_status kv_check_view(const kvdb_kv_view *v, const kvdb_model *m, const char *what)
{
  if (v == NULL)
    return kv_fail(KVDB_INVALID, "%s view is NULL", what);
  const kvdb_tensor_view *t[2] = {&v->k, &v->v};
  for (int i = 0; i < 2; i++) {
    if (t[i]->base == NULL && t[i]->layer_bases == NULL)
      return kv_fail(KVDB_INVALID, "%s view: %s has neither base nor layer_bases", what,
                     i ? "v" : "k");
    if (t[i]->layer_bases != NULL)
      for (uint32_t l = 0; l < m->n_layers; l++)
        if (t[i]->layer_bases[l] == NULL)
          return kv_fail(KVDB_INVALID, "%s view: %s.layer_bases[%u] is NULL", what,
                         i ? "v" : "k", l);
  }
  return KVDB_OK;
}

/* Whether the byte offsets a view gives for n_tokens tokens stay within int64 (each element's
 * offset is a sum of index x stride products computed in int64: caller strides that overflow
 * it would address anything). */
kvdb_status kv_check_view_extent(const kvdb_kv_view *v, const kvdb_model *m, uint64_t n_tokens,
                                 const char *what)
{
  const kvdb_tensor_view *t[2] = {&v->k, &v->v};
  uint64_t idx[4] = {m->n_layers - 1, n_tokens ? n_tokens - 1 : 0, m->n_kv_heads - 1,
                     m->head_dim - 1};
  for (int i = 0; i < 2; i++) {
    int64_t st[4] = {t[i]->layer_bases ? 0 : t[i]->layer_stride, t[i]->token_stride,
                     t[i]->head_stride, t[i]->dim_stride};
    uint64_t sum = 0, term;
    int over = 0;
    for (int d = 0; d < 4 && !over; d++) {
      uint64_t a = st[d] < 0 ? (uint64_t)0 - (uint64_t)st[d] : (uint64_t)st[d];
      over = __builtin_mul_overflow(a, idx[d], &term) || __builtin_add_overflow(sum, term, &sum);
    }
    if (over || sum > (uint64_t)INT64_MAX - 8)
      return kv_fail(KVDB_INVALID, "%s view: %s's strides for %" PRIu64 " tokens address more than "
                     "2^63 bytes", what, i ? "v" : "k", n_tokens);
  }
  return KVDB_OK;
}

/* ---- open / close ----------------------------------------------------------------------- */

static char *dup_printf(const char *a, const char *b)
{
  size_t n = strlen(a) + strlen(b) + 1;
  char *s = malloc(n);
  if (s != NULL)
    snprintf(s, n, "%s%s", a, b);
  return s;
}

kvdb_status kvdb_open(const char *path, const kvdb_options *user, kvdb **out)
{
  kv_clear_error();
  if (out == NULL)
    return kv_fail(KVDB_INVALID, "out is NULL");
  *out = NULL;
  if (path == NULL || path[0] == 0)
    return kv_fail(KVDB_INVALID, "path is NULL or empty");
  if (strlen(path) > 3900)
    return kv_fail(KVDB_INVALID, "path '%.40s...' is too long", path);
  kvdb_options opt;
  kvdb_options_init(&opt);
  if (user != NULL) {
    if (user->struct_size == 0 || user->struct_size > sizeof opt)
      return kv_fail(KVDB_INVALID, "options.struct_size %u: call kvdb_options_init() first",
                     user->struct_size);
    memcpy(&opt, user, user->struct_size);
    opt.struct_size = sizeof opt;
  }
  if ((opt.flags & ~(uint32_t)(KVDB_O_CREATE | KVDB_O_RDONLY)) != 0)
    return kv_fail(KVDB_INVALID, "options.flags 0x%x has unknown bits 0x%x (known: KVDB_O_CREATE, "
                   "KVDB_O_RDONLY)", opt.flags,
                   opt.flags & ~(uint32_t)(KVDB_O_CREATE | KVDB_O_RDONLY));
  if (opt.log_level < -1 || opt.log_level > 3)
    return kv_fail(KVDB_INVALID, "options.log_level %d is not -1 (nothing), 0 (errors), "
                   "1 (warnings), 2 (info) or 3 (debug)", opt.log_level);
  if (opt.use_direct_io != 0 && opt.use_direct_io != 1)
    return kv_fail(KVDB_INVALID, "options.use_direct_io %d is not 0 or 1", opt.use_direct_io);
  if (opt.use_io_uring != 0 && opt.use_io_uring != 1)
    return kv_fail(KVDB_INVALID, "options.use_io_uring %d is not 0 or 1", opt.use_io_uring);
  if (opt.segment_bytes < (1u << 20))
    return kv_fail(KVDB_INVALID, "segment_bytes %" PRIu64 " is below 1 MiB", opt.segment_bytes);
  if (opt.catalog_map_bytes < (1u << 20))
    return kv_fail(KVDB_INVALID, "catalog_map_bytes %" PRIu64 " is below 1 MiB",
                   opt.catalog_map_bytes);
  if (opt.sync_mode != KVDB_SYNC_FULL && opt.sync_mode != KVDB_SYNC_NONE)
    return kv_fail(KVDB_INVALID, "sync_mode %d is not KVDB_SYNC_FULL or KVDB_SYNC_NONE",
                   (int)opt.sync_mode);
  KV_RET(kv_place_options_check(&opt));
  int rdonly = (opt.flags & KVDB_O_RDONLY) != 0;
  int create = !rdonly && (opt.flags & KVDB_O_CREATE) != 0;

  struct stat st;
  if (stat(path, &st) != 0) {
    if (!create)
      return kv_fail(KVDB_NOTFOUND, "no database directory '%s'", path);
    if (mkdir(path, 0755) != 0 && errno != EEXIST)
      return kv_fail_errno(errno, "cannot create database directory '%s'", path);
  } else if (!S_ISDIR(st.st_mode)) {
    return kv_fail(KVDB_INVALID, "'%s' is not a directory", path);
  }
  if (!rdonly && access(path, W_OK) != 0)
    return kv_fail(KVDB_READONLY, "database directory '%s' is not writable (open with "
                   "KVDB_O_RDONLY to read it)", path);

  kvdb *db = calloc(1, sizeof *db);
  if (db == NULL)
    return kv_fail(KVDB_NOMEM, "cannot allocate the handle");
  kvdb_status rc = KVDB_OK;
  db->opt = opt;
  db->log = (kv_logger){opt.log_fn, opt.log_ctx, opt.log_level};
  pthread_mutex_init(&db->mu, NULL);
  db->dir = strdup(path);
  db->seg_dir = dup_printf(path, "/ssd");
  if (db->dir == NULL || db->seg_dir == NULL) {
    rc = kv_fail(KVDB_NOMEM, "cannot allocate paths");
    goto fail;
  }
  rc = kv_catalog_open(&db->cat, path, opt.catalog_map_bytes, rdonly, create,
                       opt.sync_mode == KVDB_SYNC_NONE);
  if (rc != KVDB_OK)
    goto fail;
  if (!rdonly && mkdir(db->seg_dir, 0755) != 0 && errno != EEXIST) {
    rc = kv_fail_errno(errno, "cannot create segment directory '%s'", db->seg_dir);
    goto fail;
  }
  db->os_io = kv_io_os_create(opt.use_io_uring);
  if (db->os_io == NULL) {
    rc = kv_fail(KVDB_NOMEM, "cannot create the I/O layer");
    goto fail;
  }
  if (opt.use_io_uring && !db->os_io->uring)
    kv_log(&db->log, 1, "io_uring is not available here; using pread/pwrite");
  db->io = kv_io_test_wrap ? kv_io_test_wrap(db->os_io) : db->os_io;
  db->direct = opt.use_direct_io;
  if (opt.dram_bytes >= KV_PAGE) {
    db->dram = kv_dram_create(opt.dram_bytes);
    if (db->dram == NULL) {
      rc = kv_fail(KVDB_NOMEM, "cannot reserve %" PRIu64 " bytes for the DRAM tier",
                   opt.dram_bytes);
      goto fail;
    }
  }
  rc = kv_place_open(db); /* SmartSSD directory (recovery needs it), placement state */
  if (rc != KVDB_OK)
    goto fail;
  db->magic = KVDB_MAGIC_OPEN;
  if (!rdonly) {
    rc = kv_recover(db);
    if (rc != KVDB_OK)
      goto fail;
    kv_counts_open(&db->cat); /* kvdb_stat's counters, for a database an older build wrote */
  }
  *out = db;
  return KVDB_OK;
fail:
  db->magic = KVDB_MAGIC_OPEN;
  {
    char msg[512];
    snprintf(msg, sizeof msg, "%s", kvdb_errmsg());
    kvdb_close(db);
    kv_fail(rc, "%s", msg);
  }
  return rc;
}

void kvdb_close(kvdb *db)
{
  if (db == NULL || db->magic != KVDB_MAGIC_OPEN)
    return;
  if (db->n_pending > 0 && !db->cat.rdonly && db->cat.env != NULL) {
    MDB_txn *txn;
    if (kv_txn_begin(&db->cat, 1, &txn) == KVDB_OK) {
      if (kv_flush_atime(db, txn) == KVDB_OK)
        kv_txn_commit(txn);
      else
        mdb_txn_abort(txn);
    }
  }
  if (db->io != NULL) {
    kv_writers_free(db);
    kv_rbufs_free(db);
    kv_files_free(db);
  }
  kv_place_close(db);
  kv_score_close(db);
  kv_catalog_close(&db->cat);
  kv_io_destroy(db->os_io);
  kv_dram_destroy(db->dram);
  free(db->pending);
  free(db->dir);
  free(db->seg_dir);
  pthread_mutex_destroy(&db->mu);
  db->magic = KVDB_MAGIC_CLOSED;
  free(db);
}
